"""The attention oracle, its bound, the MLX-ops reference path and the API's argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import pad_rows
from tqbridge.metal.attention import AttentionError, check_problem, decode_attention, last_run
from tqbridge.metal.attention.problem import visible_range
from tqbridge.metal.attention.ref import attention_oracle, oracle

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")

# float32 SDPA vs a float64 oracle on an f32 cache: scores and sums of at most a few hundred terms
# in float32 (u = 6e-8) on unit-scale data stay far below 1e-5 (measured: ~5e-7).
DENSE_TOL = 1e-5


def _cache(rng, fmt, b, h, n, d, scale=1.0):
    x = (rng.standard_normal((b, h, n, d)) * scale).astype(np.float32)
    return x, bridge.quantize(fmt, pad_rows(fmt, x))


def test_oracle_matches_mlx_sdpa_on_a_float_cache():
    # an independent implementation: MLX's fused SDPA with an additive mask and sinks
    rng = np.random.default_rng(1)
    b, hq, hkv, t, d, n = 1, 6, 2, 3, 64, 50
    q = rng.standard_normal((b, hq, t, d)).astype(np.float32)
    k, kb = _cache(rng, "f32", b, hkv, n, d)
    v, vb = _cache(rng, "f32", b, hkv, n, d)
    sinks = rng.standard_normal(hq).astype(np.float32)
    got = attention_oracle(q, kb, vb, k_format="f32", v_format="f32", length=n, window=7, sinks=sinks)
    mask = np.full((t, n), -np.inf, np.float32)
    for ti in range(t):
        lo, hi = visible_range(n, t, ti, 7)
        mask[ti, lo:hi] = 0
    want = mx.fast.scaled_dot_product_attention(
        mx.array(q), mx.array(k), mx.array(v), scale=d ** -0.5, mask=mx.array(mask), sinks=mx.array(sinks))
    np.testing.assert_allclose(got, np.array(want), atol=DENSE_TOL, rtol=0)


def test_oracle_softcap_and_causal_rows_by_hand():
    # one head, three keys, two query rows: the numbers written out
    k = np.array([[[[1, 0], [0, 1], [1, 1]]]], np.float32)
    v = np.array([[[[1, 2], [3, 4], [5, 6]]]], np.float32)
    q = np.array([[[[2, 0], [0, 3]]]], np.float32)
    kb, vb = bridge.quantize("f32", k), bridge.quantize("f32", v)
    got = attention_oracle(q, kb, vb, k_format="f32", v_format="f32", length=3, scale=1.0, softcap=2.0)
    # row 0 sits at position 1: keys 0, 1; row 1 at position 2: keys 0..2
    s0 = 2 * np.tanh(np.array([2.0, 0.0]) / 2)
    w0 = np.exp(s0 - s0.max()); w0 /= w0.sum()
    s1 = 2 * np.tanh(np.array([0.0, 3.0, 3.0]) / 2)
    w1 = np.exp(s1 - s1.max()); w1 /= w1.sum()
    np.testing.assert_allclose(got[0, 0, 0], w0 @ v[0, 0, :2], rtol=1e-12)
    np.testing.assert_allclose(got[0, 0, 1], w1 @ v[0, 0], rtol=1e-12)


def test_empty_rows_give_zero_and_sinks_absorb_mass():
    rng = np.random.default_rng(2)
    _, kb = _cache(rng, "q8_0", 2, 1, 4, 32)
    _, vb = _cache(rng, "q8_0", 2, 1, 4, 32)
    q = rng.standard_normal((2, 2, 32)).astype(np.float32)
    out = attention_oracle(q, kb, vb, k_format="q8_0", v_format="q8_0", length=[0, 4])
    assert np.array_equal(out[0], np.zeros_like(out[0])) and np.abs(out[1]).sum() > 0
    big = attention_oracle(q, kb, vb, k_format="q8_0", v_format="q8_0", length=[0, 4],
                           sinks=np.array([60.0, 60.0], np.float32))
    assert np.abs(big[1]).max() < 1e-20  # a dominant sink takes (almost) all the weight


PAIRS = [("q8_0", "turbo3"), ("turbo3", "q8_0"), ("turbo4@g64", "q4_1"), ("f16", "iq4_nl"),
         ("bf16", "turbo2@fork-69d8e4b"), ("q5_0", "q5_1"), ("turbo4@fork-69d8e4b", "f32"), ("q4_0", "turbo2@g64")]


@pytest.mark.parametrize("kf, vf", PAIRS)
def test_reference_path_within_bound(kf, vf):
    rng = np.random.default_rng(3)
    b, hq, hkv, d, n = 2, 8, 2, 80, 37
    q = rng.standard_normal((b, hq, 2, d)).astype(np.float32)
    _, kb = _cache(rng, kf, b, hkv, n, d, 2.0)
    _, vb = _cache(rng, vf, b, hkv, n, d)
    sinks = rng.standard_normal(hq).astype(np.float32)
    kw = dict(k_format=kf, v_format=vf, length=[37, 20], window=9, softcap=5.0, sinks=sinks)
    prob = check_problem(q, kb, vb, **kw)
    want, bound = oracle(q, kb, vb, prob, sinks)
    got = decode_attention(q, kb, vb, backend="reference", **kw)
    assert isinstance(got, np.ndarray) and got.shape == q.shape and got.dtype == np.float32
    assert last_run()["backend"] == "reference"
    assert (np.abs(got - want) <= bound).all()


def test_reference_keeps_mlx_and_dtype():
    rng = np.random.default_rng(4)
    _, kb = _cache(rng, "q4_0", 1, 1, 9, 64)
    _, vb = _cache(rng, "turbo3", 1, 1, 9, 64)
    q = mx.array(rng.standard_normal((1, 3, 64)).astype(np.float32)).astype(mx.float16)
    got = decode_attention(q, mx.array(kb), mx.array(vb), k_format="q4_0", v_format="turbo3", length=9,
                           backend="reference")
    assert isinstance(got, mx.array) and got.dtype == mx.float16 and got.shape == (1, 3, 64)
    prob = check_problem(q, kb, vb, k_format="q4_0", v_format="turbo3", length=9)
    want, bound = oracle(q, kb, vb, prob)
    assert (np.abs(np.array(got.astype(mx.float32)) - want[:, :, 0]) <= bound[:, :, 0]).all()


def _args(**over):
    rng = np.random.default_rng(5)
    a = dict(q=np.zeros((1, 4, 64), np.float32), k_blocks=bridge.quantize("q8_0", rng.standard_normal((1, 2, 8, 64))),
             v_blocks=bridge.quantize("q8_0", rng.standard_normal((1, 2, 8, 64))),
             k_format="q8_0", v_format="q8_0", length=8)
    a.update(over)
    return a


@pytest.mark.parametrize("over, match", [
    (dict(q=np.zeros((4, 64), np.float32)), "must be \\(B, Hq, D\\)"),
    (dict(q=np.zeros((1, 4, 5, 64), np.float32)), "5 query rows"),
    (dict(q=np.zeros((1, 4, 64), np.int32)), "float array"),
    (dict(q=np.zeros((1, 3, 64), np.float32)), "not a multiple of 2 KV heads"),
    (dict(q=np.zeros((2, 4, 64), np.float32)), "batch 2"),
    (dict(q=np.zeros((1, 4, 96), np.float32)), "head dim 96 is stored as 96"),
    (dict(length=9), "outside 0..8"),
    (dict(length=[1, 2]), "2 entries for a batch of 1"),
    (dict(k_format="q9"), "unknown format"),
    (dict(v_format="turbo3"), "whole number of turbo3"),
    (dict(k_blocks=np.zeros((1, 2, 8, 68), np.int8)), "uint8"),
    (dict(sinks=np.zeros(2, np.float32)), "one logit per query head"),
    (dict(window=-1), "window must be positive"),
    (dict(softcap=float("nan")), "softcap"),
    (dict(backend="gpu"), "unknown backend"),
])
def test_bad_arguments_are_clear_errors(over, match):
    a = _args(**over)
    with pytest.raises(AttentionError, match=match):
        decode_attention(a.pop("q"), a.pop("k_blocks"), a.pop("v_blocks"), backend=a.pop("backend", "reference"), **a)


def test_repeated_signature_still_checks_the_length():
    # the second call hits the per-signature cache of validated shapes; its length is still checked
    a = _args()
    q, kb, vb = a.pop("q"), a.pop("k_blocks"), a.pop("v_blocks")
    a.pop("length")
    first = decode_attention(q, kb, vb, backend="reference", length=8, **a)
    again = decode_attention(q, kb, vb, backend="reference", length=5, **a)
    assert first.shape == again.shape
    with pytest.raises(AttentionError, match="outside 0..8"):
        decode_attention(q, kb, vb, backend="reference", length=9, **a)
    with pytest.raises(AttentionError, match="outside 0..8"):
        decode_attention(q, kb, vb, backend="reference", length=-1, **a)


def test_zero_length_gives_zeros_on_every_path():
    """Regression: the reference path raised on an empty cache while the kernel returned zeros."""
    from tqbridge import bridge
    from tqbridge.metal import decode_attention

    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    kb = bridge.quantize("q8_0", rng.standard_normal((2, 2, 8, 64)).astype(np.float32))
    vb = bridge.quantize("q4_0", rng.standard_normal((2, 2, 8, 64)).astype(np.float32))
    for backend in ("reference", "cpu-emulator"):
        o = decode_attention(q, kb, vb, k_format="q8_0", v_format="q4_0", length=0, backend=backend)
        assert o.shape == q.shape and not np.any(o), backend
