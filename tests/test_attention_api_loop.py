"""decode_attention called as a decoding loop calls it: MLX arrays on a GPU, the same buffers, a new
length every call. Such calls run one prepared launch per call signature (planned for the buffers'
capacity, the length a parameter, as TQCache runs it) instead of planning and preparing again for
every length: the outputs stay within the oracle's bound at every length, the launch is built once,
and what ran is reported. Without a GPU (or with numpy inputs) the path does not apply."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal import attention
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import check_problem, decode_attention, last_run
from tqbridge.metal.attention.ref import oracle
from tqbridge.metal.decode_options import DecodeOptions
from helpers_kernels import quantized_cache
from test_attention_kernel import GPU

LENGTHS = (1, 17, 300, 513, 599, 600)


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no MLX GPU backend (Metal or CUDA) on this machine")
@pytest.mark.parametrize("kf,vf,qp", [("q8_0", "turbo3", None), ("q8_0", "q4_0", "int8"), ("q4_0", "q8_0", "exact")])
def test_growing_length_reuses_one_launch(kf, vf, qp):
    import mlx.core as mx

    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, kf, (1, 2, 600, 128)), quantized_cache(rng, vf, (1, 2, 600, 128))
    qm, kbm, vbm = mx.array(q), mx.array(kb), mx.array(vb)
    attention.clear_call_caches()
    opts = {} if qp is None else {"q_precision": qp}
    runs = []
    for n in LENGTHS:
        got = decode_attention(qm, kbm, vbm, k_format=kf, v_format=vf, length=n, **opts)
        assert isinstance(got, mx.array) and tuple(got.shape) == q.shape
        run = last_run()
        runs.append(run)
        prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=n)
        want, bound = oracle(q, kb, vb, prob, None, chain=run["chain"], q_precision=run["q_precision"])
        err = np.abs(np.asarray(got, dtype=np.float64) - want[:, :, 0])
        assert (err <= bound[:, :, 0]).all(), f"length {n}: error {err.max():.3g}"
    assert len(attention_kernel.prepared_launches()) == 1, "one prepared launch for every length"
    assert len({(r["splits"], r["kernel"], r["backend"]) for r in runs}) == 1   # one plan, made for the buffer
    assert runs[0]["backend"] == GPU and (qp is None or runs[0]["q_precision"] == qp)


def test_numpy_inputs_or_no_gpu_keep_the_per_call_path():
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 1, 40, 64)), quantized_cache(rng, "q8_0", (1, 1, 40, 64))
    attention.clear_call_caches()
    decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=33)
    assert not attention_kernel.prepared_launches()   # numpy in: per-call planning, numpy out
    assert last_run()["backend"] in ("cpu-emulator", "cuda", "metal")


def test_which_calls_may_take_one_launch_per_signature(monkeypatch):
    """Options left at None (as a caller forwarding its defaults passes them) keep a call eligible;
    a launch option with a value (a kernel, splits, warps ...) or the reference backend does not."""
    asked = []

    def record(q, kb, vb, *, backend, options, **kw):
        asked.append((backend, options.q_precision))
        return None

    monkeypatch.setattr(attention, "prepare_decode", record)
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 1, 40, 64)), quantized_cache(rng, "q8_0", (1, 1, 40, 64))
    kw = dict(k_format="q8_0", v_format="q8_0", length=33)
    decode_attention(q, kb, vb, **kw, kernel=None, warps=None, splits=None, q_precision="exact")
    decode_attention(q, kb, vb, **kw, backend="kernel")
    assert asked == [("auto", "exact"), ("kernel", None)]
    decode_attention(q, kb, vb, **kw, options=DecodeOptions(chunks=2))   # options are not a plan override
    assert asked[-1] == ("auto", None) and len(asked) == 3
    decode_attention(q, kb, vb, **kw, kernel="lanes")
    decode_attention(q, kb, vb, **kw, splits=2)
    decode_attention(q, kb, vb, **kw, backend="reference")
    decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=[33])
    assert len(asked) == 3


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no MLX GPU backend (Metal or CUDA) on this machine")
def test_device_params_give_the_same_outputs(monkeypatch):
    """Device params (pass 1's lengths as views of a device table; CUDA's default) change where the
    ints live, not what the kernels compute: the outputs are bit-identical to host-made ones at every
    length."""
    import mlx.core as mx

    from tqbridge.metal.attention import kernel as attention_kernel

    rng = np.random.default_rng(8)
    q = mx.array(rng.standard_normal((1, 8, 128)).astype(np.float16))
    kb = mx.array(quantized_cache(rng, "q8_0", (1, 2, 600, 128)))
    vb = mx.array(quantized_cache(rng, "turbo3", (1, 2, 600, 128)))
    outs = {}
    for flag in ("0", "1"):
        dl = attention_kernel.prepare_decode(q, kb, vb, k_format="q8_0", v_format="turbo3",
                                             options=DecodeOptions(device_params=flag == "1"))
        assert dl.device_params is (flag == "1")
        outs[flag] = [np.array(dl(q, kb, vb, n)) for n in LENGTHS]
    for n, a, b in zip(LENGTHS, outs["0"], outs["1"]):
        assert np.array_equal(a, b), f"length {n}"
