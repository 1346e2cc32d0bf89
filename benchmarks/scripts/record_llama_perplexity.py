"""Record: a llama.cpp build's own `llama-perplexity` on the text and settings `tqbridge evidence` uses, to
compare with an evidence record's perplexities (tests/test_evidence.py holds them to its printed digits).

    python benchmarks/scripts/record_llama_perplexity.py BUILD MODEL --ctx N --chunks N --kv K[/V] ... \
        --what NAME [--threads 1]

BUILD: a build directory with `bin/llama-perplexity` (configured with -DLLAMA_BUILD_TOOLS=ON). MODEL: a
GGUF path or a bundled name. Each type runs as `tqbridge evidence` runs it: one chunk per batch (`-b CTX`),
flash attention, the KV rotation of `tqbridge.parity.evidence.kv_rotation` (set through the environment
`tqbridge.bridge.llama.side.rotation_environ` sets), the fork's automatic cache-type rules as the build
has them. The final estimate ("PPL = X +/- Y") is parsed from each run's output and filed as a record
under benchmarks/records/cpu/.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def main(argv=None) -> int:
    from tqbridge.bridge.evaluation_text import evaluation_text
    from tqbridge.bridge.gguf.models import model_path
    from tqbridge.bridge.llama import build as llama_build
    from tqbridge.bridge.llama.side import ROTATION_OFF, ROTATION_ON
    from tqbridge.parity import evidence as ev
    from tqbridge.tools import records

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build")
    p.add_argument("model")
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--chunks", type=int, required=True)
    p.add_argument("--kv", action="append", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--what", required=True)
    args = p.parse_args(argv)

    build = Path(args.build)
    tool = build / "bin" / "llama-perplexity"
    if not tool.is_file():
        print(f"{tool}: no llama-perplexity in this build (configure it with -DLLAMA_BUILD_TOOLS=ON)", file=sys.stderr)
        return 2
    info = llama_build.describe(build)
    variant = info.variant
    model = Path(model_path(args.model))
    text, source = evaluation_text()
    estimates, runs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        text_file = Path(tmp) / "text.txt"
        text_file.write_text(text, encoding="utf-8")
        for spec in args.kv:
            kv = ev.parse_kv(spec)
            k, v = (f.split("@")[0] for f in (kv.k, kv.v))
            label = ev.parse_kv("/".join(f if not f.startswith("turbo") or not variant else f"{f}@{variant}"
                                         for f in (kv.k, kv.v))).name
            rotated = ev.kv_rotation(ev.parse_kv(label), fork=variant is not None)
            env = dict(os.environ)
            for name, value in (ROTATION_ON if rotated else ROTATION_OFF).items():
                if value is None:
                    env.pop(name, None)
                else:
                    env[name] = value
            cmd = [str(tool), "-m", str(model), "-f", str(text_file), "-c", str(args.ctx), "--chunks",
                   str(args.chunks), "-b", str(args.ctx), "-fa", "on", "-ctk", k, "-ctv", v, "-t", str(args.threads)]
            print("$ " + " ".join(cmd), file=sys.stderr)
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            out = r.stdout + r.stderr
            m = FINAL.search(out)
            if r.returncode != 0 or not m:
                print(out[-3000:], file=sys.stderr)
                print(f"{label}: llama-perplexity gave no final estimate (exit {r.returncode})", file=sys.stderr)
                return 1
            estimates[label] = {"ppl": float(m.group(1)), "ppl_err": float(m.group(2))}
            shown = [tool.name, "-m", model.name, "-f", "TEXT", *cmd[5:]]     # no paths of this machine
            runs[label] = {"kv_rotation": rotated, "command": " ".join(shown),
                           "environment": {n: v for n, v in (ROTATION_ON if rotated else ROTATION_OFF).items() if v}}
            print(f"{label}: PPL {estimates[label]['ppl']} +/- {estimates[label]['ppl_err']}", file=sys.stderr)
    results = {
        "what": ("the build's own llama-perplexity on the text and settings of tqbridge evidence (one chunk per "
                 "batch, flash attention, each type's KV rotation as evidence runs it); its printed final estimates"),
        "model": model.name, "text": source, "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "ctx": args.ctx, "chunks": args.chunks, "threads": args.threads,
        "build": {"commit": info.report.get("commit"), "variant": variant},
        "final_estimate": estimates, "runs": runs,
    }
    command = ("python benchmarks/scripts/record_llama_perplexity.py BUILD " + args.model + f" --ctx {args.ctx} "
               f"--chunks {args.chunks} " + " ".join(f"--kv {s}" for s in args.kv) + f" --threads {args.threads} "
               f"--what {args.what}")
    rec = records.envelope(results, hardware="cpu", command=command)
    print(records.write(rec, what=args.what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
