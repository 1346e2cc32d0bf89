"""Run the recorded kernel campaigns on the CPU emulator and write one JSON record (docs/plugin.md).

    .venv/bin/python benchmarks/record_fuzz_kernels.py OUT.json [--examples 1000] [--seed 7] [--jobs 2]

Each target runs ``tqbridge fuzz TARGET --backend cpu-emulator --examples N --jobs J --seed S --db
<fresh dir> --json ...`` in a fresh example database; the record keeps each summary, the commands,
the date and the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from record_env import header

TARGETS = ("decode-attention", "append", "quantize", "dequantize")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    record: dict = {
        **header(("tqbridge", "mlx", "hypothesis", "numpy")),
        "campaigns": {},
    }
    with tempfile.TemporaryDirectory(prefix="tqbridge-fuzz-record-") as tmp:
        for target in TARGETS:
            out = Path(tmp) / f"{target}.json"
            cmd = ["tqbridge", "fuzz", target, "--backend", "cpu-emulator", "--examples", str(args.examples),
                   "--jobs", str(args.jobs), "--seed", str(args.seed), "--db", str(Path(tmp) / "db"), "--json", str(out)]
            print(" ".join(cmd), file=sys.stderr, flush=True)
            p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", *cmd[1:]], capture_output=True, text=True)
            print(p.stdout, p.stderr[-2000:], file=sys.stderr, flush=True)
            summary = json.loads(out.read_text())
            summary["database"] = "(fresh, temporary)"
            record["campaigns"][target] = {"command": " ".join(cmd[:-4] + ["--db", "DB", "--json", "OUT"]),
                                           "exit_code": p.returncode, "summary": summary}
    from tqbridge.bridge.atomic import write_atomic

    write_atomic(args.out, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
