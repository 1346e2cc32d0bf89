"""What decode_attention records about each call (``last_run()``), and its one cache of prepared launches."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import pad_rows
from tqbridge.metal import attention
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import decode_attention, last_run

pytest.importorskip("mlx.core", reason="MLX is not installed")

KERNEL_KEYS = {"backend", "dispatches", "kernel", "splits", "lanes_per_key", "warps", "tile", "chain", "q_precision"}


def _args(seed=0, n=20, d=64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 4, d)).astype(np.float32)
    kb = bridge.quantize("q8_0", pad_rows("q8_0", rng.standard_normal((1, 2, n, d)).astype(np.float32)))
    vb = bridge.quantize("q8_0", pad_rows("q8_0", rng.standard_normal((1, 2, n, d)).astype(np.float32)))
    return q, kb, vb, dict(k_format="q8_0", v_format="q8_0", length=n)


def test_kernel_run_is_recorded():
    q, kb, vb, kw = _args()
    decode_attention(q, kb, vb, backend="cpu-emulator", q_precision="exact", **kw)
    run = last_run()
    assert set(run) == KERNEL_KEYS
    assert run["backend"] == "cpu-emulator" and run["q_precision"] == "exact"
    assert isinstance(run["chain"], int) and 1 <= run["dispatches"] <= 2


def test_reference_run_is_recorded():
    q, kb, vb, kw = _args()
    decode_attention(q, kb, vb, backend="cpu-emulator", **kw)
    decode_attention(q, kb, vb, backend="reference", **kw)
    # only what the reference path ran: nothing left over from the kernel call before it
    assert last_run() == {"backend": "reference", "dispatches": 0}
    assert attention.last_run_record() == attention.RunRecord(backend="reference", dispatches=0)


def test_last_run_is_a_copy():
    q, kb, vb, kw = _args()
    decode_attention(q, kb, vb, backend="cpu-emulator", **kw)
    run = last_run()
    run["backend"] = "changed"
    run.clear()
    assert last_run()["backend"] == "cpu-emulator"


def test_prepared_launches_are_shared_per_signature_and_the_length_still_checked(monkeypatch):
    """decode_attention's one cache of prepared launches: a call signature on a GPU backend prepares one
    launch (numpy inputs, and the emulator, prepare none: they plan per call), and a length past the
    buffers is refused however the call is served."""
    q, kb, vb, kw = _args(seed=1)
    attention.clear_call_caches()
    decode_attention(q, kb, vb, backend="cpu-emulator", **kw)
    decode_attention(q, kb, vb, backend="auto", **kw)
    assert attention_kernel.prepared_launches() == []     # numpy in: nothing prepared
    with pytest.raises(attention.AttentionError):
        decode_attention(q, kb, vb, backend="reference", **dict(kw, length=kb.shape[2] + 1))


def test_record_is_per_thread():
    q, kb, vb, kw = _args()
    decode_attention(q, kb, vb, backend="reference", **kw)
    seen = {}

    def other():
        seen["before"] = last_run()
        decode_attention(q, kb, vb, backend="cpu-emulator", **kw)
        seen["after"] = last_run()["backend"]

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == {"before": {}, "after": "cpu-emulator"}
    assert last_run()["backend"] == "reference"


def test_attention_kernels_come_from_the_one_builder(monkeypatch):
    # one kernel builder and cache (dispatch.build) for every kernel: the attention passes too
    from tqbridge.metal import dispatch

    built = []
    real = dispatch.build

    def spy(kernel, static=None, backend="auto"):
        built.append((kernel.name, backend))
        return real(kernel, static, backend)

    monkeypatch.setattr(dispatch, "build", spy)
    q, kb, vb, kw = _args(seed=3)
    decode_attention(q, kb, vb, backend="cpu-emulator", q_precision="exact", **kw)
    names = {n for n, b in built if b == "cpu-emulator"}
    assert any(n.startswith("tq_attention_split") for n in names) and "tq_attention_combine" in names, built
