"""Kernel int8-mma's fast V decodes against its generic one (``DecodeOptions(v_decode="generic")``;
attention_plan.int8_mma_v_decode): "turbo-permute" for turbo2 / turbo3 rows of 128 or 256 values whose runs of 8 / 16
values lie in one block (128- or 64-value blocks; four centroids per byte permute of registers, the sign bits from a table; a run's columns held in another order of
m-tiles, undone at the write) and "codes-permute" for q4_0 / q5_0 / q8_0 (codes put into binary16 integers
by byte permutes, one exact subtraction, times the block scales). Each hands the same binary16
values to the same products for every output column as the generic decoder (the value rounded once
to binary16), so the outputs must be identical bit for bit on every backend here; and the decode
must be the one that ran (the RunRecord's v_decode, the static parameters).
"""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal.attention import build as attention_build
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.decode_options import DEFAULT_OPTIONS, DecodeOptions
from tqbridge.metal.attention import check_problem, decode_attention, last_run
from helpers_kernels import quantized_cache
from test_attention_kernel import BACKENDS

# (K, V, query heads per KV head, rows per head, length, options); lengths that leave partial
# sub-tiles and splits, a sliding window and attention sinks (masked keys read stale tile bytes)
CASES = [("q8_0", "turbo3", 4, 1, 300, {}), ("q4_0", "turbo2", 2, 1, 173, {}),
         ("q8_0", "turbo3@fork-69d8e4b", 8, 1, 97, {"window": 40}),
         ("q5_1", "turbo2@fork-69d8e4b", 1, 2, 150, {"sinks": True}),
         ("q8_0", "q4_0", 4, 1, 300, {}), ("q4_1", "q8_0", 2, 1, 173, {"window": 40}),
         ("q8_0", "q4_0", 8, 1, 97, {"d": 64}), ("iq4_nl", "q8_0", 1, 2, 150, {"d": 256, "sinks": True}),
         ("q5_1", "q5_0", 4, 1, 300, {}), ("q8_0", "q5_0", 2, 1, 90, {"d": 256, "window": 33}),
         ("q8_0", "turbo3", 4, 1, 300, {"d": 256}), ("q4_0", "turbo2", 2, 2, 173, {"d": 256, "window": 40}),
         ("q8_0", "turbo3@g64", 4, 1, 97, {}), ("q8_0", "turbo3", 2, 1, 150, {"d": 192, "sinks": True})]
WANT = {"turbo3": "turbo-permute", "turbo2": "turbo-permute", "q4_0": "codes-permute", "q5_0": "codes-permute",
        "q8_0": "codes-permute"}


def _run(backend, generic: bool, kf, vf, g, t, n, opts, kind="normal"):
    options = DecodeOptions(v_decode="generic" if generic else "fast")
    rng = np.random.default_rng(g + 7 * t + n)
    hkv, d = 2, opts.get("d", 128)
    q = rng.standard_normal((1, hkv * g, t, d) if t > 1 else (1, hkv * g, d)).astype(np.float32)
    kb, vb = quantized_cache(rng, kf, (1, hkv, n, d)), quantized_cache(rng, vf, (1, hkv, n, d), kind=kind)
    kw = dict(k_format=kf, v_format=vf, length=n)
    if opts.get("window"):
        kw["window"] = opts["window"]
    if opts.get("sinks"):
        kw["sinks"] = rng.standard_normal(hkv * g).astype(np.float32)
    prob = check_problem(q, kb, vb, **kw)
    plan = attention_plan.make_plan(prob, "cpu-emulator" if backend == "cpu-emulator" else "cuda", kernel="int8-mma",
                                    options=options)
    decode = "generic" if generic else WANT[vf.split("@")[0]]
    static = attention_build.static_params(prob, plan, 0, False)[0]
    assert (static["TQA_V23"], static["TQA_VCODE"]) == (int(decode == "turbo-permute"), int(decode == "codes-permute"))
    out = decode_attention(q, kb, vb, backend=backend, q_precision="int8", options=options, **kw)
    assert last_run()["v_decode"] == decode
    return np.asarray(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf,vf,g,t,n,opts", CASES, ids=[f"{c[0]}-{c[1]}-g{c[2]}-t{c[3]}-n{c[4]}-d{c[5].get('d', 128)}" for c in CASES])
def test_byte_permute_decode_is_bit_identical(backend, kf, vf, g, t, n, opts):
    fast = _run(backend, False, kf, vf, g, t, n, opts)
    generic = _run(backend, True, kf, vf, g, t, n, opts)
    assert np.isfinite(fast).all()
    assert np.array_equal(fast.view(np.uint32), generic.view(np.uint32))


@pytest.mark.parametrize("vf", ["turbo3", "q4_0", "q5_0", "q8_0"])
@pytest.mark.parametrize("kind", ["zeros", "tiny", "huge"])
def test_byte_permute_decode_extreme_norms(kind, vf):
    """Zero, tiny (binary16-subnormal products) and huge V rows: the same bits through both paths."""
    fast = _run("cpu-emulator", False, "q8_0", vf, 4, 1, 70, {}, kind)
    generic = _run("cpu-emulator", True, "q8_0", vf, 4, 1, 70, {}, kind)
    assert np.array_equal(fast.view(np.uint32), generic.view(np.uint32))


def test_other_v_rows_take_the_generic_path():
    """turbo4, formats with a minimum m or a value table, f16, and rows whose runs of values would
    straddle blocks (q4_0 at head dim 192: runs of 12 values in 32-value blocks) take the generic decoder."""
    rng = np.random.default_rng(0)
    for vf, d in (("turbo4", 128), ("turbo4", 256), ("q4_1", 128), ("q5_1", 128), ("iq4_nl", 128),
                  ("f16", 128), ("q4_0", 192)):
        q = rng.standard_normal((1, 4, d)).astype(np.float32)
        kb = quantized_cache(rng, "q8_0", (1, 1, 40, d))
        vb = quantized_cache(rng, vf, (1, 1, 40, d))
        prob = check_problem(q, kb, vb, k_format="q8_0", v_format=vf, length=40)
        assert attention_plan.int8_mma_v_decode(prob, DEFAULT_OPTIONS) == "generic", (vf, d)
        plan = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
        static = attention_build.static_params(prob, plan, 0, False)[0]
        assert (static["TQA_V23"], static["TQA_VCODE"]) == (0, 0), (vf, d)
