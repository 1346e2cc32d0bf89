"""Summary of an Nsight Compute profile of kernel int8-mma's pass 1: executed instructions per key, the
staging code's share, the stall reasons, the headline counters.

Reads the two CSV pages ``ncu -i REPORT`` prints (``--page details --csv`` and ``--page source --csv
--print-source sass``) of one kernel launch, as benchmarks/records/h200/2026-12-02-ncu-pass1.json records
them; profile the launch with, e.g.:

    ncu --clock-control none -k regex:tq_attention_split --launch-skip 3 --launch-count 1 --set full \\
        -o REP python benchmarks/scripts/kernel_device_time.py --context 131072 --kernels int8-mma --iters 5 --cold
    ncu -i REP.ncu-rep --page details --csv > details.csv
    ncu -i REP.ncu-rep --page source --csv --print-source sass > sass.csv
    python benchmarks/scripts/ncu_summary.py details.csv sass.csv --context 131072 --kv-heads 8 --chunks 1

"Per key" is per key and KV head (context x KV heads rows). The staging head is the tile loop's hot
code (instructions executed at least 0.5 times per step of 16 x chunks keys) from its top up to the
copies' commit (LDGDEPBAR). Stall shares are of every warp-state sample of the kernel.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter


def _num(s: str) -> float:
    s = s.replace(",", "").strip()
    return float(s) if s not in ("", "-") else 0.0


def details(path: str) -> dict:
    """Metric name -> value (the first launch) of ``--page details --csv``."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    h = rows[0]
    name, value = h.index("Metric Name"), h.index("Metric Value")
    out = {}
    for r in rows[1:]:
        if len(r) > value and r[name] not in out:
            out[r[name]] = r[value]
    return out


def source(path: str) -> list[tuple[str, str, float, float, dict]]:
    """(address, SASS, executed warp instructions, stall samples, samples by reason) per instruction of
    ``--page source --csv --print-source sass``."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    h = rows[start]
    ex, smp = h.index("Instructions Executed"), h.index("Warp Stall Sampling (All Samples)")
    reasons = [(i, n[len("stall_"):]) for i, n in enumerate(h) if n.startswith("stall_") and "Not Issued" not in n]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(h):
            continue
        out.append((r[0], r[1].strip(), _num(r[ex]), _num(r[smp]), {n: _num(r[i]) for i, n in reasons}))
    return out


def summary(details_csv: str, sass_csv: str, context: int, kv_heads: int = 8, chunks: int = 1) -> dict:
    d, ins = details(details_csv), source(sass_csv)
    keys = context * kv_heads
    executed = sum(x[2] for x in ins)
    stalls = Counter()
    for x in ins:
        stalls.update(x[4])
    total = sum(stalls.values())
    if not total or not executed:
        raise ValueError(f"{sass_csv}: no executed instructions or stall samples (was the source page profiled?)")
    step = 16 * chunks
    head = []
    for x in ins:
        if x[2] / keys * step >= 0.5:
            head.append(x)
            if x[1].startswith("LDGDEPBAR"):
                break
    return {
        "duration_us": _num(d["Duration"]),
        "dram_throughput_pct": _num(d["DRAM Throughput"]),
        "issue_slots_busy_pct": _num(d["Issue Slots Busy"]),
        "registers": int(_num(d["Registers Per Thread"])),
        "achieved_warps_per_sm": _num(d["Achieved Active Warps Per SM"]),
        "eligible_warps_per_scheduler": _num(d["Eligible Warps Per Scheduler"]),
        "warp_instructions_per_key_and_kv_head": round(executed / keys, 2),
        "staging_head_instructions_per_key": round(sum(x[2] for x in head) / keys, 2),
        "staging_head_share_of_stall_samples": round(sum(x[3] for x in head) / total, 3),
        "stall_samples": int(total),
        "stall_share": {k: round(v / total, 3) for k, v in stalls.most_common() if v / total >= 0.01},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("details_csv")
    ap.add_argument("sass_csv")
    ap.add_argument("--context", type=int, required=True, help="the profiled launch's keys per KV head")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=1, help="int8-mma's 16-key chunks per SIMD-group step (Plan.chunks)")
    a = ap.parse_args(argv)
    print(json.dumps(summary(a.details_csv, a.sass_csv, a.context, a.kv_heads, a.chunks), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
