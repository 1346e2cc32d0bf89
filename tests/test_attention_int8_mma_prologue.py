"""Kernel int8-mma's prologue and epilogue: how q becomes int8 codes, when the first tiles' copies are issued,
how q8_0 K rows are read, and how the SIMD groups' partial rows are merged.

- q to int8 per 32-value block by eight lanes, 4 values and one word of codes each; the block's max |x|
  and code sum by three butterfly steps (both order-free), as ggml's quantize_row_q8_0_ref / q8_1_ref;
- the copies of the ring's first NS - 1 tiles issued after q is loaded and before it is quantized, q's
  rows kept in the ring's last buffer (refilled only after the key loop's first barrier);
- q8_0 K rows by whole 32-bit words (``tqa_q8_pair``): a 34-byte block of an even-numbered slot has its
  fragment slots, and q's codes, rotated by 2 (the int32 sum does not depend on the order);
- the SIMD groups' partial rows in threadgroup memory at a stride of DV + 1.

Every case holds the int8 oracle's bound (several query rows, windows, sinks, one and two chunks, odd
lengths, tiles short of a split). Planted bugs (in a copy of the sources) show the oracle sees each
part. (The variants these replaced — one thread per block, copies after q's quantization or before its
load, half-word q8_0 reads, an unpadded merge — gave the same bits: docs/kernel-history.md.)"""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.attention import decode_attention, last_run
from tqbridge.metal.decode_options import DecodeOptions
from helpers_kernels import check_int8_mma, plant_in_sources, quantized_cache
from test_attention_kernel import BACKENDS
from test_attention_int8_mma_staging import fresh  # noqa: F401 - the fixture: plans and sources made anew

SRC = "attention_kernel_split_int8_mma.cpp"
HDR = "attention_kernel.h"


# (id, K format, V format, head dim, query rows T, call options)
CASES = [
    ("q8_0-turbo3", "q8_0", "turbo3", 128, 1, {}),
    ("q8_0-q4_0-d64", "q8_0", "q4_0", 64, 1, {}),
    ("q8_0-q8_0-d256", "q8_0", "q8_0", 256, 1, {}),
    ("q4_1-q8_0-d64-rows2", "q4_1", "q8_0", 64, 2, {}),
    ("q5_1-q4_0-d256-window", "q5_1", "q4_0", 256, 1, {"window": 70}),
    ("q8_0-q4_0-rotation-chunks1", "q8_0", "q4_0", 128, 1, {"rotation": (128, 64), "options": DecodeOptions(chunks=1)}),
    ("iq4_nl-turbo4-rows2-sinks", "iq4_nl", "turbo4", 128, 2, {"sinks": "yes"}),
]


def _case(kf, vf, d, rows, seed, l_max=203, hkv=2):
    rng = np.random.default_rng(seed)
    shape = (1, 4 * hkv, rows, d) if rows > 1 else (1, 4 * hkv, d)
    q = (rng.standard_normal(shape) * 3).astype(np.float32)
    return q, quantized_cache(rng, kf, (1, hkv, l_max, d)), quantized_cache(rng, vf, (1, hkv, l_max, d))


def _run(q, kb, vb, kf, vf, length=181, splits=2, **kw):
    got = decode_attention(q, kb, vb, k_format=kf, v_format=vf, length=length, backend="cpu-emulator",
                           q_precision="int8", splits=splits, **kw)
    assert last_run()["kernel"] == "int8-mma"
    return np.asarray(got)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_case_holds_the_int8_oracle_bound(backend, case, fresh):
    name, kf, vf, d, rows, opts = case
    q, kb, vb = _case(kf, vf, d, rows, seed=len(name))
    if opts.get("sinks"):   # one logit per query head
        opts = dict(opts, sinks=np.linspace(-1.0, 2.0, q.shape[1]).astype(np.float32))
    check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=181, splits=2, **opts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_tiles_and_splits_hold_the_oracle_bound(backend, fresh):
    """Over many tiles and splits, the tiles short of a split's end, a partial last tile."""
    q, kb, vb = _case("q8_0", "turbo3", 128, 1, seed=4, l_max=400)
    check_int8_mma(backend, q, kb, vb, k_format="q8_0", v_format="turbo3", length=389, splits=3)


def test_the_staging_area_holds_q_after_the_ring_head():
    """q's rows (8 x DK floats) live after the first NS - 1 tiles: the plan's staging area must reach that
    far for every shape int8-mma builds (the kernel's static_assert says the same at build time)."""
    from tqbridge.metal.attention import check_problem

    rng = np.random.default_rng(0)
    for d in (64, 128, 256):
        for kf, vf in (("q8_0", "turbo3" if d % 128 == 0 else "q4_0"), ("q4_0", "f16")):
            q, kb, vb = _case(kf, vf, d, 1, seed=int(rng.integers(1 << 16)), l_max=64)
            prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=64)
            krb, vrb = attention_plan.row_bytes(prob, False)
            for tile in (16, 32, 64, 128):
                for stages in (2, 3):
                    tb = -(-tile * krb // 4) * 4 + -(-tile * vrb // 4) * 4
                    assert attention_plan.int8_mma_stage_bytes(prob, 2, tile, stages) >= (stages - 1) * tb + 32 * d


PLANTED = [
    # q's rows where the first tile is being copied: the early copies and q's load overwrite each other
    ("q-in-tile-0", SRC, "q8_0", "turbo3",
     "TQ_SHARED float* qf = (TQ_SHARED float*)(stage + (TQA_NS - 1) * HALF);",
     "TQ_SHARED float* qf = (TQ_SHARED float*)(stage);"),
    # the block's max |x| over 4 lanes (16 values) instead of 8
    ("amax-4-lanes", SRC, "q8_0", "turbo3",
     "    for (uint off = 1u; off < 8u; off <<= 1) {\n        const float o = tq_simd_shuffle_xor(amax, off);",
     "    for (uint off = 1u; off < 4u; off <<= 1) {\n        const float o = tq_simd_shuffle_xor(amax, off);"),
    # q8_1's code sum over 4 lanes: q4_1 K's offset term takes half the block's sum
    ("sum-4-lanes", SRC, "q4_1", "q8_0",
     "for (uint off = 1u; off < 8u; off <<= 1) sum += tq_simd_shuffle_xor(sum, off);",
     "for (uint off = 1u; off < 4u; off <<= 1) sum += tq_simd_shuffle_xor(sum, off);"),
    # q's codes of the even q8_0 blocks left unrotated while K's slots are rotated
    ("q-codes-unrotated", SRC, "q8_0", "turbo3",
     "const int rot = (Q8W && (bi % NB) % 2 == 0) ? 2 : 0;", "const int rot = 0;"),
    # lane 3 of a whole-word read without its splice of the block's first two codes
    ("lane-3-unspliced", HDR, "q8_0", "turbo3",
     "*hi = t == 3 ? ((h & 0xffffu) | (w0 & 0xffff0000u)) : h;", "*hi = h;"),
    # the merge reading the SIMD groups' rows at a stride of DV while they were written at DV + 1
    ("merge-stride", SRC, "q8_0", "turbo3",
     "a += wo[(w * 8 + r) * WOS + e] * f;", "a += wo[(w * 8 + r) * TQA_DV + e] * f;"),
]


@pytest.mark.parametrize("plant", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_prologue_and_merge_bugs_are_caught(plant, tmp_path, monkeypatch, fresh):
    name, source, kf, vf, old, new = plant
    q, kb, vb = _case(kf, vf, 128, 1, seed=9)
    want = _run(q, kb, vb, kf, vf)
    plant_in_sources(tmp_path, monkeypatch, source, old, new)
    got = _run(q, kb, vb, kf, vf)
    assert not np.array_equal(got, want), f"{name}: the planted bug did not change the output"
    with pytest.raises(AssertionError, match="bound|isfinite"):   # (the emulator poisons threadgroup memory)
        check_int8_mma("cpu-emulator", q, kb, vb, k_format=kf, v_format=vf, length=181, splits=2)
