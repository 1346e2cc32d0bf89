"""Two trees of tqbridge, one machine: ``tqbridge bench decode`` from this tree and from ``--old`` (another
checkout's root: its bridge/, metal/, parity/, tools/), in alternating processes (old, new, new, old, ...),
so that a change to the decode path is judged against its baseline on the same card at the same time.

    python benchmarks/scripts/ab_trees.py --old OLD_TREE [--model llama-3.1-8b] [--context 4096,32768]
        [--caches fp16,q8_0/turbo3] [--tokens 16] [--rounds 2] [--alternations 2] [--json out.json]

Each process imports its tree through a namespace directory of links (``tqbridge/{bridge,metal,parity,tools}``)
on PYTHONPATH, so neither tree needs installing. Per tree, cache and context: the median over processes of
``ms_per_token``, ``speedup_vs_fp16`` (each process's own interleaved fp16), ``kv_path_python_us_per_layer``,
``kv_path_kernels_per_layer`` and ``kv_path_host_syncs_per_step``; and the ratio new / old of ms per token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
FIELDS = ("ms_per_token", "speedup_vs_fp16", "kv_path_python_us_per_layer", "kv_path_kernels_per_layer",
          "kv_path_host_syncs_per_step")


def shim(tree: Path, where: Path) -> Path:
    """A namespace directory under ``where`` whose ``tqbridge`` links to ``tree``'s packages (put it on PYTHONPATH)."""
    pkg = where / "tqbridge"
    pkg.mkdir(parents=True)
    for part in ("bridge", "metal", "parity", "tools"):
        if not (tree / part).is_dir():
            raise SystemExit(f"{tree}: no {part}/ folder (give a checkout's root)")
        (pkg / part).symlink_to(tree / part, target_is_directory=True)
    return where


def _bench(path: Path, args, out: Path) -> list:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-c", "import sys; from tqbridge.tools.cli import main; sys.exit(main(sys.argv[1:]))",
           "bench", "decode", "--models", args.model, "--context", args.context, "--caches", args.caches,
           "--tokens", str(args.tokens), "--rounds", str(args.rounds), "--json", str(out)]
    subprocess.run(cmd, env=env, check=True, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["runs"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the baseline checkout's root")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--context", default="4096,32768")
    ap.add_argument("--caches", default="fp16,q8_0/turbo3")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--alternations", type=int, default=2, help="processes per tree (old, new, new, old, ...)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    runs: dict = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = {"old": shim(Path(args.old).resolve(), tmp / "old"), "new": shim(HERE, tmp / "new")}
        for i in range(args.alternations):
            for tree in (("old", "new") if i % 2 == 0 else ("new", "old")):
                rows = _bench(paths[tree], args, tmp / f"{tree}-{i}.json")
                runs[tree].append(rows)
                print(tree, i, json.dumps([{k: r.get(k) for k in ("cache", "context", "ms_per_token")} for r in rows]),
                      flush=True)
    table = []
    for row in runs["new"][0]:
        key = (row["cache"], row["context"])
        entry = {"cache": key[0], "context": key[1]}
        for tree in ("old", "new"):
            got = [r for rows in runs[tree] for r in rows if (r["cache"], r["context"]) == key]
            for f in FIELDS:
                vals = [r[f] for r in got if isinstance(r.get(f), (int, float))]
                if vals:
                    entry[f"{tree}_{f}"] = statistics.median(vals)
        if entry.get("old_ms_per_token"):
            entry["new_over_old_ms"] = entry["new_ms_per_token"] / entry["old_ms_per_token"]
        table.append(entry)
        print(json.dumps(entry), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": "python benchmarks/scripts/ab_trees.py " + " ".join(
            sys.argv[1:] if argv is None else argv), "table": table, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
