"""Run the recorded parser campaigns and write one JSON record (docs/fuzzing.md).

    .venv/bin/python benchmarks/scripts/record_fuzz_parsers.py OUT.json [--scale 1.0] [--seed 7] [--jobs 2]

Each target runs ``tqbridge fuzz TARGET --minutes M --jobs J --seed S --db <fresh dir> --json ...``
(minutes below, times ``--scale``), in a fresh example database so the counts are the campaign's
own; the record keeps each summary, the commands, the date and the machine.
"""

from __future__ import annotations

import argparse
import sys

from record_env import record_fuzz_campaigns

MINUTES = {"gguf": 2.0, "state-blob": 1.0, "prompt-cache": 1.5, "kv-spelling": 0.5}


def _count_saved(summary: dict) -> None:
    for f in summary["findings"]:
        f["saved"] = len(f["saved"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    runs = [(t, ["--minutes", str(round(m * args.scale, 3)), "--jobs", str(args.jobs), "--seed", str(args.seed)])
            for t, m in MINUTES.items()]
    return record_fuzz_campaigns(args.out, ("tqbridge", "mlx", "mlx-lm", "llama_cpp_python", "gguf", "numpy"), runs,
                                 fixup=_count_saved)


if __name__ == "__main__":
    sys.exit(main())
