"""benchmarks/scripts/ncu_summary.py on a small pair of Nsight Compute CSV pages written here (the layout of
``ncu -i REP --page details|source --csv``): per-key counts, the staging head up to the copies'
commit, stall shares; a page without samples is refused."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))

import ncu_summary  # noqa: E402

METRICS = {"Duration": "70.08", "DRAM Throughput": "58.64", "Issue Slots Busy": "57.29", "Registers Per Thread": "124",
           "Achieved Active Warps Per SM": "13.33", "Eligible Warps Per Scheduler": "1.22"}


def _write(tmp_path, rows):
    d = tmp_path / "details.csv"
    with open(d, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"])
        for k, v in METRICS.items():
            w.writerow(["0", "tq_attention_split_int8_mma", "S", k, "", v])
        w.writerow(["1", "tq_attention_split_int8_mma", "S", "Duration", "", "999"])   # a second launch: ignored
    s = tmp_path / "sass.csv"
    with open(s, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "tq_attention_split_int8_mma"])
        w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
                    "stall_wait", "stall_barrier", "stall_wait (Not Issued)"])
        for r in rows:
            w.writerow(r)
    return str(d), str(s)


def test_summary_counts_per_key_and_the_staging_head(tmp_path):
    keys = 64 * 2   # context 64, 2 KV heads: one 16-key step per SIMD group = 8 executions of the hot code
    rows = [("0x0", "      LDC R1, c[0x0][0x28]", "1", "2", "1", "0", "1"),          # prologue: cold
            ("0x10", "      BAR.SYNC.DEFER_BLOCKING 0x0", "3", "8", "0", "3", "0"),  # loop top (hot)
            ("0x20", "      LDGSTS.E.BYPASS.128 [R1], desc[UR6][R2.64]", "2", "8", "2", "0", "2"),
            ("0x30", "      LDGDEPBAR", "0", "8", "0", "0", "0"),
            ("0x40", "      IMMA.16832.S8.S8 R4, R8, R12, R4", "4", "8", "4", "0", "4"),   # after the head
            ("0x50", "      LDGDEPBAR", "0", "8", "0", "0", "0")]
    d, s = _write(tmp_path, rows)
    got = ncu_summary.summary(d, s, context=64, kv_heads=2)
    assert got["duration_us"] == 70.08 and got["registers"] == 124
    assert got["warp_instructions_per_key_and_kv_head"] == round(42 / keys, 2)
    assert got["staging_head_instructions_per_key"] == round(24 / keys, 2)   # 0x10..0x30, not the second commit
    assert got["stall_samples"] == 10 and got["stall_share"] == {"wait": 0.7, "barrier": 0.3}
    assert got["staging_head_share_of_stall_samples"] == 0.5
    # two chunks per step: the hot threshold halves with the executions per key
    assert ncu_summary.summary(d, s, context=128, kv_heads=2, chunks=2)["staging_head_instructions_per_key"] == \
        round(24 / 256, 2)


def test_a_page_without_samples_is_refused(tmp_path):
    d, s = _write(tmp_path, [("0x0", "      EXIT", "0", "0", "0", "0", "0")])
    with pytest.raises(ValueError, match="no executed instructions"):
        ncu_summary.summary(d, s, context=64)
