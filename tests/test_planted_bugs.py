"""The planted-bug suite: mutants of the MLX side that a real port could have, and which parity
level catches each (docs/levels.md, "Planted bugs"). Each test plants one bug with monkeypatch, runs
the level that should catch it, and asserts the level fails; the clean build passes the same level.

Mutants planted elsewhere (same idea, same table): q kept in f16 and a flipped q4_0 nibble
(tests/test_parity_verdicts.py), a decode step that skips the newest key (ibid., logits level's
decode steps), the iq4_nl search quantizer in the cache (tests/test_llama_state.py, cache level),
a wrong window start or length in the decode lane (tests/test_decode_step.py).
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")

from tqbridge.parity.level_blocks import run_blocks_level  # noqa: E402


def _blocks(formats):
    return run_blocks_level(formats, kernel_backends=[])      # numpy and MLX paths against ggml's C


def _attention(pairs=("q8_0/q4_0", "q4_0/q8_0")):
    from tqbridge.parity.level_attention import run_attention_level

    return run_attention_level(list(pairs))


@pytest.fixture(scope="module")
def ggml():
    try:
        from tqbridge.bridge import ggml_c

        ggml_c.c_quantize("q8_0", np.zeros((1, 32), np.float32))
    except Exception as e:   # no llama-cpp-python here
        pytest.skip(f"ggml's C library is not loadable: {type(e).__name__}: {e}")


def test_clean_build_passes_the_fast_levels(ggml):
    assert _blocks(["q8_0", "q4_0", "q5_1", "iq4_nl"])["passed"]
    assert _attention()["passed"]


def test_round_half_to_even_in_one_format_is_caught_by_blocks(ggml, monkeypatch):
    # C's roundf rounds half away from zero; MLX's round is half-to-even
    from tqbridge.bridge import mlx_ggml

    monkeypatch.setattr(mlx_ggml, "_roundf", mx.round)
    rep = _blocks(["q8_0"])
    assert not rep["passed"] and rep["formats"][0]["equal"] == {"numpy": True, "mlx": False}


def test_bf16_stored_scales_are_caught_by_blocks(ggml, monkeypatch):
    from tqbridge.bridge import mlx_ggml

    real = mlx_ggml._f16_bytes

    def through_bf16(v, **kw):
        return real(v.astype(mx.bfloat16).astype(mx.float32), **kw)

    monkeypatch.setattr(mlx_ggml, "_f16_bytes", through_bf16)
    rep = _blocks(["q8_0", "q4_1"])
    assert not any(f["equal"]["mlx"] for f in rep["formats"])


def test_missing_gqa_index_is_caught_by_attention(ggml, monkeypatch):
    # the kernel serves query head h from the wrong KV head: here every head h is scored as head
    # h + 1 would be (a rolled head index), so heads at a group boundary read the next group's K/V
    from tqbridge.metal import attention

    real = attention.decode_attention

    def wrong_group(q, *a, **kw):
        out = real(np.roll(q, -1, axis=1), *a, **kw)
        return np.roll(np.asarray(out), 1, axis=1)

    monkeypatch.setattr(attention, "decode_attention", wrong_group)
    assert not _attention()["passed"]
