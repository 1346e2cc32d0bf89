"""benchmarks/scripts/decode_token_timeline.py's arithmetic on made-up kernel stamps: the kernel classes,
the union of overlapping kernels, and the per-token window (busy, span, gap, launches, wall)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))

import decode_token_timeline as tl  # noqa: E402


@pytest.mark.parametrize("name, cls", [
    ("mlx::core::cu::custom_kernel_tq_kv_append_u16_741d7fab40f1fcaa(__half", "tq_append"),
    ("mlx::core::cu::custom_kernel_tq_attention_split_int8_mma_2cd02c4d", "tq_pass1"),
    ("mlx::core::cu::custom_kernel_tq_attention_combine_384248a8182806ae", "tq_combine"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35", "fp16_attention"),
    ("void cudnn::fusion::lean_reduction_kernel<false, false, false>", "fp16_attention"),
    ("void mlx::core::cu::gemv_single<__half, 8, 4>(__half const*,", "weights_gemv"),
    ("void mlx::core::cu::copy_gg_nd<__half, __half, int, 2, 4>", "kv_copy"),
    ("void mlx::core::cu::rms_norm_small<__half, 128, 4, true, 8>(", "norm"),
    ("void mlx::core::cu::rope_single<__half, false, true>", "rope"),
    ("void mlx::core::cu::binary_vv<mlx::core::cu::Add, __half", "elementwise"),
    ("void mlx::core::cu::arg_reduce_general<__half, mlx::core::cu::ArgMax", "reduce"),
    ("something_else", "other"),
])
def test_classify(name, cls):
    assert tl.classify(name) == cls


def test_union_counts_overlap_once():
    ev = [("a", 0.0, 10.0), ("b", 5.0, 12.0), ("c", 20.0, 25.0), ("d", 21.0, 22.0)]
    assert tl.union_us(ev) == 17.0
    assert tl.union_us([]) == 0.0


def test_token_breakdown_per_token():
    # 10 tokens, each: a 60 us gemv, an append of 5 us overlapping it, then 40 us idle; token period 100 us
    ev = []
    for t in range(10):
        s = 100.0 * t
        ev.append(("gemv_single", s, s + 60.0))
        ev.append(("tq_kv_append", s + 50.0, s + 55.0))
    stamps = [1e-4 * t for t in range(10)]
    plain = [2e-4 * t for t in range(10)]
    got = tl.token_breakdown(ev, 10, stamps, plain)
    # window: tokens 2..8 (7 tokens), from the 3rd token's first kernel to the 9th token's last one
    assert got["kernels_per_token"] == 2.0
    assert got["launches"] == {"weights_gemv": 1.0, "tq_append": 1.0}
    assert got["kernels_ms"] == {"weights_gemv": 0.06, "tq_append": 0.005}
    assert got["device_sum_ms"] == 0.065
    assert got["busy_ms"] == 0.06
    assert got["span_ms"] == round((860.0 - 200.0) / 7 / 1e3, 4)
    assert got["gap_ms"] == round((660.0 - 420.0) / 7 / 1e3, 4)
    assert got["wall_ms"] == pytest.approx(0.1) and got["unprofiled_wall_ms"] == pytest.approx(0.2)


def test_ceilings_issue_formula_and_busy():
    """fp16: 12 ms busy, 6 of them attention; the cache: 8 ms of other kernels summed (overlaps in full),
    2 GB of KV at 1 TB/s (2 ms): issue 49's ceiling (8 + 6) / (8 + 2) = 1.4, the busy one 12 / (6 + 2) = 1.5."""
    fp = {"busy_ms": 12.0, "attention_ms": 6.0}
    row = {"kv_bytes": 2e9, "other_ms": 8.0}
    assert tl.ceilings(row, fp, 1e12) == {"ceiling": 1.4, "ceiling_busy": 1.5}
