"""Run the recorded kernel campaigns on the CPU emulator and write one JSON record (docs/plugin.md).

    .venv/bin/python benchmarks/scripts/record_fuzz_kernels.py OUT.json [--examples 1000] [--seed 7] [--jobs 2]

Each target runs ``tqbridge fuzz TARGET --backend cpu-emulator --examples N --jobs J --seed S --db
<fresh dir> --json ...`` in a fresh example database; the record keeps each summary, the commands,
the date and the machine.
"""

from __future__ import annotations

import argparse
import sys

from record_env import record_fuzz_campaigns

TARGETS = ("decode-attention", "append", "quantize", "dequantize")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    runs = [(t, ["--backend", "cpu-emulator", "--examples", str(args.examples), "--jobs", str(args.jobs),
                 "--seed", str(args.seed)]) for t in TARGETS]
    return record_fuzz_campaigns(args.out, ("tqbridge", "mlx", "hypothesis", "numpy"), runs, keep_stderr=2000)


if __name__ == "__main__":
    sys.exit(main())
