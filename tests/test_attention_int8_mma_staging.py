"""Kernel int8-mma's staging of K / V tiles into threadgroup memory: a whole tile whose rows start 16-aligned
goes through straight 16-byte copies at constant offsets (``tqa_stage_full16``), any other tile (a
split's last, partial one; rows of odd offset) through the generic loop (``tqa_stage_async``). Staging
is a pure copy, so the two paths must give bit-identical outputs; the emulator takes the 16-byte path
where CUDA does (its ``tq_aligned16`` checks the address), so CI runs both. One barrier per tile: the
copy into the buffer of tile i - 1 is issued after the barrier that ends every SIMD group's reading of
it. Planted bugs (in a copy of the sources) show that the tests see each part."""

from __future__ import annotations


import numpy as np
import pytest

from tqbridge.metal.attention import build as attention_build
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.decode_options import DecodeOptions
from tqbridge.metal.attention import decode_attention, last_run
from helpers_kernels import check_int8_mma, plant_in_sources, quantized_cache
from test_attention_kernel import BACKENDS

SRC = "attention_kernel_split_int8_mma.cpp"
MMA = "attention_mma.h"


def _rows(kf, vf, l_max, hkv=2, d=128, seed=5):
    """Caches of l_max rows cut from the same random 256: any two share their first rows, head by head."""
    rng = np.random.default_rng(seed)
    kb, vb = quantized_cache(rng, kf, (1, hkv, 256, d)), quantized_cache(rng, vf, (1, hkv, 256, d))
    return np.ascontiguousarray(kb[:, :, :l_max]), np.ascontiguousarray(vb[:, :, :l_max])


@pytest.fixture
def fresh():
    """Plans, launches and kernel definitions made anew before and after (a planted source is forgotten)."""
    attention_build.kernel_defs.cache_clear()
    attention_kernel.clear_launch_caches()
    yield
    attention_build.kernel_defs.cache_clear()
    attention_kernel.clear_launch_caches()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("q4_0", "q8_0")])
def test_whole_tile_copies_match_the_generic_loop(backend, chunks, kf, vf, monkeypatch, fresh):
    """l_max = 200: every head's rows start 16-aligned (q8_0 rows of 136 bytes, turbo3 of 50: a multiple
    of 8 rows), so whole tiles take the 16-byte path; l_max = 201 moves heads >= 1 off alignment (the
    generic loop). On the emulator two splits of 75 keys start tiles off alignment too (GPU plans round
    splits to whole tiles). The outputs must be bit-identical."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    n = 150
    outs = {}
    for l_max in (200, 201):
        kb, vb = _rows(kf, vf, l_max)
        for splits in (1, 2):
            got = decode_attention(q, kb, vb, k_format=kf, v_format=vf, length=n, backend=backend,
                                   q_precision="int8", splits=splits, options=DecodeOptions(chunks=chunks))
            assert last_run()["kernel"] == "int8-mma" and last_run()["chunks"] == chunks
            outs[l_max, splits] = np.asarray(got)
    for splits in (1, 2):   # (other splits merge other partial sums: compared within one split count)
        assert np.array_equal(outs[201, splits], outs[200, splits]), f"splits={splits}: l_max 201 differs from 200"


def _fails_the_oracle(n, l_max, seed):
    """A q8_0 / turbo3 call of n keys in caches of l_max rows, one split, on the emulator: the int8
    oracle's check must fail (a planted bug is in the sources)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    kb, vb = _rows("q8_0", "turbo3", l_max)
    with pytest.raises(AssertionError, match="bound"):
        check_int8_mma("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=n, splits=1)


@pytest.fixture
def restore_kernels():
    yield
    attention_build.kernel_defs.cache_clear()
    attention_kernel.clear_launch_caches()


def test_dropping_the_last_round_of_whole_tile_copies_fails(tmp_path, monkeypatch, restore_kernels):
    """The 16-byte path without its last, partial round of copies leaves the end of every staged K tile
    stale: the oracle check fails, so the aligned layout above did run that path."""
    plant_in_sources(tmp_path, monkeypatch, MMA, "if ((j + 1) * NT <= N16 || (int)tid + j * NT < N16)",
             "if ((j + 1) * NT <= N16)")
    _fails_the_oracle(150, 200, seed=12)


def test_dropping_the_generic_loop_fails(tmp_path, monkeypatch, restore_kernels):
    """The generic loop staging nothing: with l_max = 201 the heads >= 1 (and every split's partial last
    tile) go through it, and the oracle check fails, so the odd layout above did run it."""
    plant_in_sources(tmp_path, monkeypatch, MMA, "for (int i = done + (int)tid; i < nw; i += (int)nt) tq_cp_async4",
             "for (int i = done + (int)tid; i < 0; i += (int)nt) tq_cp_async4")
    _fails_the_oracle(150, 201, seed=13)


def test_refilling_a_buffer_before_the_barrier_fails(tmp_path, monkeypatch, restore_kernels):
    """The tile loop without its one barrier: the copy into tile i - 1's buffer is then issued while other
    SIMD groups may still be computing tile i - 1 (they read tile i + NS - 1's rows), and the oracle
    check fails (the emulator switches threads at every barrier and SIMD operation)."""
    plant_in_sources(tmp_path, monkeypatch, SRC, "    tq_cp_wait_n(TQA_NS - 2);\n    tq_barrier();\n",
             "    tq_cp_wait_n(TQA_NS - 2);\n")
    _fails_the_oracle(250, 256, seed=14)


def test_a_two_stage_ring_holds_the_bound_across_tiles_and_splits(monkeypatch, fresh):
    """CUDA's automatic plans take a ring of INT8_MMA_AUTO_STAGES_CUDA = 2 tiles: the wait for every pending
    copy, one barrier, then the refill of the other buffer. The emulator runs that ring when its limits
    allow only 2 stages: long rows over many tiles and splits, whole tiles and partial ones."""
    monkeypatch.setattr(attention_plan, "_int8_mma_limits", lambda backend: (attention_plan.SHARED_BYTES, 2))
    rng = np.random.default_rng(15)
    q = rng.standard_normal((2, 8, 128)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (2, 2, 600, 128)), quantized_cache(rng, "turbo3", (2, 2, 600, 128))
    for chunks in (1, 2):
        attention_kernel.clear_launch_caches()
        check_int8_mma("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=[600, 333], splits=2,
                  options=DecodeOptions(chunks=chunks))
        assert (last_run()["chunks"], last_run()["stages"]) == (chunks, 2)


def test_cuda_plans_take_a_two_stage_ring_for_64_key_tiles(fresh):
    """CUDA's automatic plans for 64-key tiles: INT8_MMA_AUTO_STAGES_CUDA (2) tiles in the ring, static memory,
    though 3 would fit its 48 KB (the measured choice); Metal's 32 KB keep what fits."""
    from tqbridge.metal.attention import check_problem

    kb, vb = _rows("q8_0", "turbo3", 64, hkv=8)
    q = np.zeros((1, 32, 128), np.float32)
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64)
    plan = attention_plan.make_plan(prob, "cuda", kernel="int8-mma")
    assert (plan.stages, plan.tile, plan.dyn_smem) == (attention_plan.INT8_MMA_AUTO_STAGES_CUDA, 64, 0)
    three = attention_plan.int8_mma_shared_bytes(prob, plan.warps, 64, 3, plan.v_decode)
    assert three <= attention_plan.INT8_MMA_SHARED_CUDA, "the test's premise: a 3-stage ring would fit"
