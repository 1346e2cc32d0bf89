"""Kernel int8-mma with two 16-key chunks per SIMD-group step (``DecodeOptions(chunks=2)``, ``Plan.chunks``): both
chunks' scores, one online-softmax update over their 32 keys, then both chunks' V products, so the
chunks' dependency chains can overlap. The softmax sees a different running maximum than with one
chunk per step, so the outputs are not bit-identical: each must hold the int8 oracle's bound, on
every backend here, through tails (a step whose second chunk lies past the last key), windows,
softcap, sinks, several rows per query and each V decode path. The plan refuses what would idle a
SIMD group or split a step across tiles, and the run record says which variant ran."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal.attention import build as attention_build
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.decode_options import DecodeOptions
from tqbridge.metal.attention import AttentionError, check_problem, last_run
from helpers_kernels import check_int8_mma, plant_in_sources, quantized_cache
from test_attention_kernel import BACKENDS, GPU

# (K format, V format, head dim, GQA group, rows per query, length, options): the V decode paths of int8-mma
# (turbo byte permutes, generic turbo across 64-value blocks, code permutes, generic f16) and the K
# offset path (q4_1); lengths with a last tile whose second chunk is empty (143: 15 keys past 128)
CASES = [
    ("q8_0", "turbo3", 128, 4, 1, 143, {}),
    ("q8_0", "turbo2", 128, 8, 1, 300, {"splits": 3}),
    ("q4_1", "q8_0", 128, 2, 2, 97, {"window": 40}),
    ("q5_0", "turbo4@g64", 192, 3, 1, 77, {"softcap": 4.0}),
    ("iq4_nl", "f16", 64, 4, 1, 33, {"sinks": True}),
    ("q8_0", "q4_0", 128, 1, 4, 200, {}),
    ("q5_1", "q5_0", 128, 4, 1, 1, {}),
]


def _chunks(n):
    return DecodeOptions(chunks=n)


@pytest.fixture
def clean_plans():
    yield
    attention_kernel.clear_launch_caches()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-d{c[2]}-g{c[3]}t{c[4]}-n{c[5]}" for c in CASES])
def test_two_chunks_hold_the_oracle_bound(backend, case, monkeypatch, clean_plans):
    kf, vf, d, g, t, n, opts = case
    opts = dict(opts)
    rng = np.random.default_rng(d * 7 + g * 3 + n)
    hkv = 2
    q = (rng.standard_normal((1, hkv * g, t, d)) * 2).astype(np.float32)
    kb, vb = quantized_cache(rng, kf, (1, hkv, n + 5, d)), quantized_cache(rng, vf, (1, hkv, n + 5, d))
    if opts.pop("sinks", False):
        opts["sinks"] = rng.standard_normal(hkv * g).astype(np.float32)
    got2, want, bound = check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=n, options=_chunks(2), **opts)
    run = last_run()
    assert run["chunks"] == 2 and run["tile"] % 32 == 0 and 32 * run["warps"] <= run["tile"]
    got1, _, _ = check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=n, options=_chunks(1), **opts)
    assert last_run()["chunks"] == 1
    # the two variants differ only by roundings: both within the bound of the same oracle
    assert (np.abs(got2 - got1) <= 2 * bound).all()


def test_two_chunks_across_many_tiles_and_splits(monkeypatch, clean_plans):
    """Every key of a long row through full steps, tile after tile (2 batch rows of different
    lengths, one of them a multiple of 32 plus one key): the bound must hold, and the bound is not
    so loose that a kernel dropping the second chunk's V products would pass (the planted bug of
    test_dropping_the_second_chunk_fails)."""
    rng = np.random.default_rng(41)
    q = rng.standard_normal((2, 8, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (2, 2, 700, 128)), quantized_cache(rng, "turbo3", (2, 2, 700, 128))
    check_int8_mma("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=[700, 289], splits=2,
              options=_chunks(2))
    assert last_run()["chunks"] == 2


def test_dropping_the_second_chunk_fails(monkeypatch, tmp_path, clean_plans):
    """Plant the bug this file guards against (the second chunk's V products skipped) in a copy of
    the kernel sources the emulator builds: the oracle check must fail."""

    marker = "        TQ_UNROLL\n        for (int hc = 0; hc < TQA_KC; ++hc) {\n            const int kc = k0 + 16 * hc;\n            // P^T"
    plant_in_sources(tmp_path, monkeypatch, "attention_kernel_split_int8_mma.cpp", marker, marker.replace("hc < TQA_KC", "hc < 1"))
    try:
        rng = np.random.default_rng(3)
        q = rng.standard_normal((1, 8, 128)).astype(np.float32)
        kb, vb = quantized_cache(rng, "q8_0", (1, 2, 150, 128)), quantized_cache(rng, "turbo3", (1, 2, 150, 128))
        with pytest.raises(AssertionError, match="bound"):
            check_int8_mma("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=143, options=_chunks(2))
        # the same call with one chunk per step does not run the planted loop's second pass: it holds
        check_int8_mma("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=143, options=_chunks(1))
    finally:
        monkeypatch.undo()
        attention_build.kernel_defs.cache_clear()


def test_chunk_plans_and_refusals(monkeypatch, clean_plans):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 8, 64, 128)), quantized_cache(rng, "turbo3", (1, 8, 64, 128))
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64)
    # the defaults: two chunks in 2 SIMD groups x 64-key tiles on CUDA (measured), one elsewhere
    auto = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
    assert auto.chunks == 2 and (auto.warps, auto.tile) == (2, 64)
    assert attention_plan.make_plan(prob, "cpu-emulator", kernel="int8-mma").chunks == 1
    assert attention_plan.make_plan(prob, "metal", kernel="int8-mma").chunks == 1
    one = attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=1)
    assert one.chunks == 1 and (one.warps, one.tile) == (4, 64)
    # the emulator's 32 KB take a 64-key tile: two steps of 32 keys, so two SIMD groups, none idle
    two = attention_plan.make_plan(prob, "cpu-emulator", kernel="int8-mma", chunks=2)
    assert two.chunks == 2 and (two.warps, two.tile) == (2, 64)
    assert attention_build.static_params(prob, two, 0, False)[0]["TQA_KC"] == 2
    assert attention_build.static_params(prob, one, 0, False)[0]["TQA_KC"] == 1
    with pytest.raises(AttentionError, match="multiple of 32"):
        attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=2, tile=48)
    with pytest.raises(AttentionError, match="idle"):
        attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=2, warps=4, tile=64)
    with pytest.raises(AttentionError, match="chunks of 1 or 2"):
        attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=3)
    with pytest.raises(AttentionError, match="'int8-mma' only"):
        attention_plan.make_plan(prob, "cuda", kernel="tiles", chunks=2)
    with pytest.raises(AttentionError, match="chunks must be one of 1, 2"):
        DecodeOptions(chunks=3)
    assert attention_plan.make_plan(prob, "cpu-emulator", kernel="int8-mma", options=_chunks(2)).chunks == 2
    # an explicit chunks argument wins over the options'
    assert attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=1, options=_chunks(2)).chunks == 1


# ----------------------------------------------------------------------------- dynamic threadgroup memory

def test_dynamic_shared_memory_plans(monkeypatch, clean_plans):
    """CUDA: a 128-key tile for 4 SIMD groups of two chunks needs a staging area beyond the 48 KB of
    static shared memory: the plan puts it in dynamic memory (TQ_DSMEM, at least MLX's 48000-byte
    threshold). Without an explicit tile the plan stays static (2 SIMD groups, 64-key tiles: measured
    faster); Metal and the emulator never ask for dynamic memory on their own."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 8, 64, 128)), quantized_cache(rng, "turbo3", (1, 8, 64, 128))
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64)
    big = attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=2, tile=128)
    assert (big.warps, big.tile, big.stages) == (4, 128, 3)
    assert big.dyn_smem >= attention_plan.DSMEM_MIN and big.dyn_smem % 16 == 0
    assert big.dyn_smem >= attention_build.static_params(prob, big, 0, False)[0]["TQA_STB"]
    assert attention_build.static_params(prob, big, 0, False)[0]["TQ_DSMEM"] == big.dyn_smem
    assert attention_plan.int8_mma_shared_bytes(prob, 4, 128, 3) <= attention_plan.INT8_MMA_DYNAMIC_CUDA
    auto = attention_plan.make_plan(prob, "cuda", kernel="int8-mma", chunks=2)
    # automatic CUDA plans take INT8_MMA_AUTO_STAGES_CUDA (2) tiles in the ring where a 64-key tile fits
    assert (auto.warps, auto.tile, auto.stages, auto.dyn_smem) == (2, 64, attention_plan.INT8_MMA_AUTO_STAGES_CUDA, 0)
    assert attention_plan.INT8_MMA_AUTO_STAGES_CUDA == 2 < attention_plan.INT8_MMA_STAGES_CUDA
    assert attention_plan.make_plan(prob, "cpu-emulator", kernel="int8-mma").stages == attention_plan.INT8_MMA_STAGES_CUDA
    one = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
    assert one.dyn_smem == 0 and attention_build.static_params(prob, one, 0, False)[0]["TQ_DSMEM"] == 0
    assert attention_plan.make_plan(prob, "cuda", kernel="int8-mma", tile=128).dyn_smem > 0
    for backend in ("metal", "cpu-emulator"):
        p = attention_plan.make_plan(prob, backend, kernel="int8-mma", chunks=2)
        assert p.dyn_smem == 0 and 32 * p.warps <= p.tile
    with pytest.raises(AttentionError, match="does not fit"):
        attention_plan.make_plan(prob, "cpu-emulator", kernel="int8-mma", chunks=2, warps=4, tile=128)
    forced = DecodeOptions(dynamic_shared=True)
    assert attention_plan.make_plan(prob, "cpu-emulator", kernel="int8-mma", options=forced).dyn_smem > 0
    assert attention_plan.make_plan(prob, "metal", kernel="int8-mma", options=forced).dyn_smem == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", [1, 2])
def test_dynamic_declaration_is_bit_identical(backend, chunks, monkeypatch, clean_plans):
    """``DecodeOptions(dynamic_shared=True)``: the staging area declared as dynamic threadgroup memory with the
    same plan otherwise; the same operations on the same bytes: identical outputs, bit for bit."""
    rng = np.random.default_rng(9 + chunks)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 2, 300, 128)), quantized_cache(rng, "turbo3", (1, 2, 300, 128))
    outs = []
    for dyn in (False, True):
        got, _, _ = check_int8_mma(backend, q, kb, vb, k_format="q8_0", v_format="turbo3", length=287,
                              options=DecodeOptions(chunks=chunks, dynamic_shared=dyn))
        run = last_run()
        assert (run["dyn_smem"] > 0) is dyn and run["chunks"] == chunks
        outs.append(got)
    assert np.array_equal(outs[0].view(np.uint64), outs[1].view(np.uint64))


def test_four_groups_of_two_chunks_on_the_emulator(monkeypatch, clean_plans):
    """The CUDA default geometry of two chunks per step (4 SIMD groups, 128-key tiles) where the
    emulator's 32 KB hold it (64-value rows): the bound holds through full tiles, a tail and 3 splits."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 8, 64)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q4_0", (1, 2, 600, 64)), quantized_cache(rng, "q4_0", (1, 2, 600, 64))
    check_int8_mma("cpu-emulator", q, kb, vb, k_format="q4_0", v_format="q4_0", length=557, splits=3, warps=4, tile=128,
              options=_chunks(2))
    run = last_run()
    assert (run["warps"], run["tile"], run["chunks"]) == (4, 128, 2)


@pytest.mark.gpu
@pytest.mark.skipif(GPU != "cuda", reason="needs MLX's CUDA backend (dynamic shared memory beyond 48 KB)")
@pytest.mark.parametrize("chunks", [1, 2])
def test_dynamic_shared_memory_on_cuda(monkeypatch, clean_plans, chunks):
    """128-key tiles on CUDA (4 SIMD groups of one or two chunks per step) in 71 KB of dynamic shared
    memory, against the oracle, at lengths that fill many tiles and splits."""
    rng = np.random.default_rng(77)
    q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 8, 5000, 128)), quantized_cache(rng, "turbo3", (1, 8, 5000, 128))
    for n in (4999, 1200, 129):
        check_int8_mma("cuda", q, kb, vb, k_format="q8_0", v_format="turbo3", length=n, tile=128, options=_chunks(chunks))
        run = last_run()
        assert run["dyn_smem"] > 48000 and (run["warps"], run["tile"], run["chunks"]) == (4, 128, chunks)


@pytest.mark.parametrize("length,splits", [(4096, 32), (32768, 64), (65536, 64), (131072, 98)])
def test_cuda_plans_take_six_threadgroups_per_sm_only_for_long_splits(length, splits, monkeypatch):
    """CUDA's int8-mma plans for 8 KV heads on 132 SMs: 4 threadgroups per SM (64 splits) until 6 per SM (98 splits)
    leave each split at least INT8_MMA_LONG_SPLIT_KEYS keys (measured at 128K; at 32K 86 splits were slower); Metal
    keeps 4 per unit; ``DecodeOptions.target_groups`` overrides both; a device of half the SMs half the target."""
    import dataclasses

    monkeypatch.setattr(attention_plan, "compute_units", lambda backend: 132)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 8, 64, 128)), quantized_cache(rng, "turbo3", (1, 8, 64, 128))
    prob = dataclasses.replace(check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64),
                               lengths=(length,))
    assert attention_plan.make_plan(prob, "cuda", kernel="int8-mma").splits == splits
    metal = attention_plan.make_plan(prob, "metal", kernel="int8-mma").splits
    assert metal <= 4 * 132 // 8
    same = DecodeOptions(target_groups=4 * 132)
    assert attention_plan.make_plan(prob, "metal", kernel="int8-mma", options=same).splits == metal
    more = DecodeOptions(target_groups=1056)
    assert attention_plan.make_plan(prob, "cuda", kernel="int8-mma", options=more).splits == min(128, length // 128)
    with pytest.raises(AttentionError, match="target_groups"):
        DecodeOptions(target_groups=0)
    monkeypatch.setattr(attention_plan, "compute_units", lambda backend: 66)
    half = attention_plan.make_plan(prob, "metal", kernel="int8-mma").splits
    assert half <= 4 * 66 // 8 and half <= metal and (length < 32768 or half < metal)


def test_cuda_grid_stays_within_one_wave_of_resident_threadgroups(monkeypatch):
    """A CUDA plan's pass-1 grid per compute unit never exceeds the threadgroups one unit holds at once
    (by threadgroup memory): head dim 256 takes 3 per SM at 128K with its 71 KB wide-row plan and 5 with
    the static plan of two chunks, not the long target's 6; head dim 128 (8 resident) keeps 6. Planted: a
    device with half the memory per unit."""
    from tqbridge.bridge import get_format
    from tqbridge.metal import decode_options
    from tqbridge.metal.attention import plan as attention_plan
    from tqbridge.metal.attention.problem import Problem

    monkeypatch.setattr(decode_options, "_cuda_attribute", lambda attribute: None)   # the H200's figures
    decode_options.compute_units.cache_clear()
    decode_options.shared_per_unit.cache_clear()

    def plan(hq, hkv, d, n, options=None):
        prob = Problem(1, hq, hkv, 1, d, n, (n,), get_format("q8_0"), get_format("turbo3"), d, d, d ** -0.5, 0,
                       0.0, False, True)
        p = attention_plan.make_plan(prob, "cuda", kernel="int8-mma", options=options)
        smem = attention_plan.int8_mma_shared_bytes(prob, p.warps, p.tile, p.stages, p.v_decode)
        return p, smem

    try:
        units = decode_options.compute_units("cuda")
        for options, want in ((None, 3), (_chunks(2), 5)):
            p256, smem = plan(16, 8, 256, 131072, options)
            resident = decode_options.resident_groups("cuda", smem)
            assert resident == want and p256.splits * 8 <= resident * units
            assert p256.splits * 8 > (resident - 1) * units   # and it fills that wave
        p128, smem128 = plan(32, 8, 128, 131072)
        assert decode_options.resident_groups("cuda", smem128) >= decode_options.GROUPS_PER_UNIT_INT8_MMA_LONG
        assert p128.splits * 8 > 5 * units   # the long target (6 per unit) where it fits
        # planted: half the threadgroup memory per unit -> fewer resident, a smaller grid
        monkeypatch.setattr(decode_options, "FALLBACK_SHARED_PER_UNIT", (233472 // 2, 1024))
        decode_options.shared_per_unit.cache_clear()
        small, _ = plan(16, 8, 256, 131072)
        assert small.splits * 8 <= decode_options.resident_groups("cuda", smem) * units < p256.splits * 8
    finally:
        decode_options.compute_units.cache_clear()
        decode_options.shared_per_unit.cache_clear()
        attention_plan.plan_cached.cache_clear()


def test_wide_rows_plan_on_cuda(clean_plans):
    """Rows of 256 values (Gemma 3's head dim) on CUDA, options leaving chunks to the planner: static memory
    holds only 32-key tiles there, so 64-key tiles in dynamic memory, 4 SIMD groups of one chunk, a 3-tile
    ring (attention_plan.INT8_MMA_WIDE_WARPS, measured); chunks asked for explicitly keep the static plan;
    rows too wide for even that ring (f16 values) keep the former plan; rows of 128 values keep two chunks
    in 2 SIMD groups; the other backends keep their 32 KB plans."""
    rng = np.random.default_rng(1)
    for d, hq, hkv in ((256, 16, 8), (256, 4, 1)):
        q = rng.standard_normal((1, hq, d)).astype(np.float32)
        kb, vb = quantized_cache(rng, "q8_0", (1, hkv, 64, d)), quantized_cache(rng, "turbo3", (1, hkv, 64, d))
        prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64)
        wide = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
        assert (wide.warps, wide.tile, wide.stages, wide.chunks) == (4, 64, 3, 1)
        assert wide.dyn_smem >= attention_plan.int8_mma_stage_bytes(prob, 4, 64, 3) > attention_plan.INT8_MMA_SHARED_CUDA
        assert wide.v_decode == "turbo-permute"
        static = attention_plan.make_plan(prob, "cuda", kernel="int8-mma", options=_chunks(2))
        assert (static.chunks, static.dyn_smem, static.tile) == (2, 0, 32)
        for be in ("cpu-emulator", "metal"):
            assert attention_plan.make_plan(prob, be, kernel="int8-mma").dyn_smem == 0
    # f16 values of 256: not even a 2-tile ring of 64-key tiles fits CUDA's dynamic memory: the former plan
    q = rng.standard_normal((1, 16, 256)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 8, 64, 256)), quantized_cache(rng, "f16", (1, 8, 64, 256))
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="f16", length=64)
    f16 = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
    assert f16 == attention_plan.make_plan(prob, "cuda", kernel="int8-mma", options=_chunks(2))
    assert f16.chunks == 2 and f16.tile < attention_plan.INT8_MMA_MAX_TILE
    q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 8, 64, 128)), quantized_cache(rng, "turbo3", (1, 8, 64, 128))
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64)
    narrow = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
    assert (narrow.warps, narrow.tile, narrow.chunks, narrow.dyn_smem) == (2, 64, 2, 0)
