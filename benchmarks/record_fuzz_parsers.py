"""Run the recorded parser campaigns and write one JSON record (docs/fuzzing.md).

    .venv/bin/python benchmarks/record_fuzz_parsers.py OUT.json [--scale 1.0] [--seed 7] [--jobs 2]

Each target runs ``tqbridge fuzz TARGET --minutes M --jobs J --seed S --db <fresh dir> --json ...``
(minutes below, times ``--scale``), in a fresh example database so the counts are the campaign's
own; the record keeps each summary, the commands, the date and the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from record_env import header

MINUTES = {"gguf": 2.0, "state-blob": 1.0, "prompt-cache": 1.5, "kv-spelling": 0.5}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    record: dict = {
        **header(("tqbridge", "mlx", "mlx-lm", "llama_cpp_python", "gguf", "numpy")),
        "campaigns": {},
    }
    with tempfile.TemporaryDirectory(prefix="tqbridge-fuzz-record-") as tmp:
        for target, minutes in MINUTES.items():
            m = round(minutes * args.scale, 3)
            out = Path(tmp) / f"{target}.json"
            cmd = ["tqbridge", "fuzz", target, "--minutes", str(m), "--jobs", str(args.jobs), "--seed", str(args.seed),
                   "--db", str(Path(tmp) / "db"), "--json", str(out)]
            print(" ".join(cmd), file=sys.stderr, flush=True)
            p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", *cmd[1:]], capture_output=True, text=True)
            print(p.stdout, file=sys.stderr, flush=True)
            summary = json.loads(out.read_text())
            summary["database"] = "(fresh, temporary)"
            for f in summary["findings"]:
                f["saved"] = len(f["saved"])
            record["campaigns"][target] = {"command": " ".join(cmd[:-4] + ["--db", "DB", "--json", "OUT"]),
                                           "exit_code": p.returncode, "summary": summary}
    from tqbridge.bridge.atomic import write_atomic

    write_atomic(args.out, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
