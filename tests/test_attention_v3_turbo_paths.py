"""Kernel v3's two decodes of turbo2 / turbo3 V (one 128-value block per row): the byte-permute path
(TQA_V23, the default: four centroids per permute of registers, the sign bits from a table) and the
generic turbo path (TQBRIDGE_V3_TURBO_GENERIC=1: a table of centroid pairs in threadgroup memory).
Both hand the same binary16 values, times the same norms, to the same products for every output
column (the byte-permute path holds a run's columns in another order of m-tiles and undoes it when
it writes), so the outputs must be identical bit for bit on every backend here; and the path must be
the one that ran (its static parameter).
"""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal import attention_kernel
from tqbridge.metal.attention import check_problem, decode_attention
from test_attention_kernel import BACKENDS, _cache

# (K, V, query heads per KV head, rows per head, length, options); lengths that leave partial
# sub-tiles and splits, a sliding window and attention sinks (masked keys read stale tile bytes)
CASES = [("q8_0", "turbo3", 4, 1, 300, {}), ("q4_0", "turbo2", 2, 1, 173, {}),
         ("q8_0", "turbo3@fork-69d8e4b", 8, 1, 97, {"window": 40}),
         ("q5_1", "turbo2@fork-69d8e4b", 1, 2, 150, {"sinks": True})]


def _run(backend, monkeypatch, generic: bool, kf, vf, g, t, n, opts, kind="normal"):
    if generic:
        monkeypatch.setenv("TQBRIDGE_V3_TURBO_GENERIC", "1")
    else:
        monkeypatch.delenv("TQBRIDGE_V3_TURBO_GENERIC", raising=False)
    attention_kernel._plan_cached.cache_clear()
    rng = np.random.default_rng(g + 7 * t + n)
    hkv, d = 2, 128
    q = rng.standard_normal((1, hkv * g, t, d) if t > 1 else (1, hkv * g, d)).astype(np.float32)
    kb, vb = _cache(rng, kf, (1, hkv, n, d)), _cache(rng, vf, (1, hkv, n, d), kind=kind)
    kw = dict(k_format=kf, v_format=vf, length=n)
    if opts.get("window"):
        kw["window"] = opts["window"]
    if opts.get("sinks"):
        kw["sinks"] = rng.standard_normal(hkv * g).astype(np.float32)
    prob = check_problem(q, kb, vb, **kw)
    plan = attention_kernel.make_plan(prob, "cpu-emulator" if backend == "cpu-emulator" else "cuda", kernel="v3")
    assert attention_kernel._static(prob, plan, 0, False)[0]["TQA_V23"] == int(not generic)
    out = decode_attention(q, kb, vb, backend=backend, q_precision="int8", **kw)
    return np.asarray(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf,vf,g,t,n,opts", CASES, ids=[f"{c[0]}-{c[1]}-g{c[2]}-t{c[3]}-n{c[4]}" for c in CASES])
def test_byte_permute_decode_is_bit_identical(backend, monkeypatch, kf, vf, g, t, n, opts):
    try:
        fast = _run(backend, monkeypatch, False, kf, vf, g, t, n, opts)
        generic = _run(backend, monkeypatch, True, kf, vf, g, t, n, opts)
    finally:
        monkeypatch.delenv("TQBRIDGE_V3_TURBO_GENERIC", raising=False)
        attention_kernel._plan_cached.cache_clear()
    assert np.isfinite(fast).all()
    assert np.array_equal(fast.view(np.uint32), generic.view(np.uint32))


@pytest.mark.parametrize("kind", ["zeros", "tiny", "huge"])
def test_byte_permute_decode_extreme_norms(monkeypatch, kind):
    """Zero, tiny (binary16-subnormal products) and huge V rows: the same bits through both paths."""
    try:
        fast = _run("cpu-emulator", monkeypatch, False, "q8_0", "turbo3", 4, 1, 70, {}, kind)
        generic = _run("cpu-emulator", monkeypatch, True, "q8_0", "turbo3", 4, 1, 70, {}, kind)
    finally:
        monkeypatch.delenv("TQBRIDGE_V3_TURBO_GENERIC", raising=False)
        attention_kernel._plan_cached.cache_clear()
    assert np.array_equal(fast.view(np.uint32), generic.view(np.uint32))


def test_other_turbo_rows_take_the_generic_path():
    """64-value turbo blocks (two per row) and turbo4 are not the byte-permute path's."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 128)).astype(np.float32)
    kb = _cache(rng, "q8_0", (1, 1, 40, 128))
    for vf in ("turbo3@g64", "turbo4"):
        vb = _cache(rng, vf, (1, 1, 40, 128))
        prob = check_problem(q, kb, vb, k_format="q8_0", v_format=vf, length=40)
        plan = attention_kernel.make_plan(prob, "cuda", kernel="v3")
        assert attention_kernel._static(prob, plan, 0, False)[0]["TQA_V23"] == 0, vf
