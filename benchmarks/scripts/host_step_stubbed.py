"""Host time of one layer's decode step with the GPU kernels stubbed, on a CPU: what the cache code adds
per layer per step where no GPU is at hand (and, with ``--old``, against another tree, alternating).

    python benchmarks/scripts/host_step_stubbed.py [--old OTHER_TREE] [--kv q8_0/turbo3] [--batch 8]
        [--steps 300] [--processes 2] [--json out.json]

MLX's ``cuda_kernel`` is replaced by a launch that returns lazy zeros of the outputs' shapes, tqbridge is
told the default device is a CUDA GPU, and the decode-lane self-check is skipped: every Python line and
MLX graph node of the GPU lane runs (prepared launches, in-place append, parameter views), no kernel
does. Per cache (a single-sequence TQCache; a BatchTQCache of ``--batch`` merged sequences; 8 KV heads
of 128 values, 32 query heads, fp16 rows): median µs of ``update_and_fetch`` + the routed attention,
each step evaluated (untimed) before the next, the best of three medians. Numbers move with the CPU and
its load; compare trees only within one run. Not a speed of the device path.
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
H, HQ, D = 8, 32, 128


def _child(kv: str, batch: int, steps: int) -> dict:
    import time

    import mlx.core as mx

    def stub(**_kw):
        def launch(inputs, output_shapes, output_dtypes, grid, threadgroup, **_k):
            return [mx.zeros(tuple(s), d) for s, d in zip(output_shapes, output_dtypes)]
        return launch
    mx.fast.cuda_kernel = stub
    import importlib

    from tqbridge.metal import backend, selfcheck
    backend.gpu_kind = lambda: "cuda"
    backend.gpu_is_default = lambda: True
    selfcheck.check_decode_lane = lambda *a, **k: None
    for name in ("tqbridge.metal.lm.cache", "tqbridge.metal.lm.routing"):
        mod = importlib.import_module(name)
        if hasattr(mod, "_decode_backend"):
            mod._decode_backend = lambda mode: "auto" if mode == "auto" else mode
    from mlx_lm.models import base

    from tqbridge.metal.lm.cache import TQCache
    from tqbridge.metal.lm.routing import route_attention

    from tqbridge.bridge.blocks.kv_spec import split_kv

    kf, vf = split_kv(kv)

    def filled(i):
        c = TQCache(kf, vf)
        rows = mx.random.normal((1, H, 300 + 10 * i, D)).astype(mx.float16)
        c.update_and_fetch(rows, rows)
        return c

    def median_us(c, B):
        q = mx.random.normal((B, HQ, 1, D)).astype(mx.float16)
        k = mx.random.normal((B, H, 1, D)).astype(mx.float16)
        times = []
        with route_attention():
            attn = base.scaled_dot_product_attention
            for _ in range(steps + 20):
                t0 = time.perf_counter()
                kk, vv = c.update_and_fetch(k, k)
                out = attn(q, kk, vv, cache=c, scale=D ** -0.5, mask=None)
                times.append(time.perf_counter() - t0)
                mx.eval(out)
        return statistics.median(times[20:]) * 1e6

    single = min(median_us(filled(0), 1) for _ in range(3))
    merged = min(median_us(TQCache.merge([filled(i) for i in range(batch)]), batch) for _ in range(3))
    return {"single_us_per_layer": single, f"batch{batch}_us_per_layer": merged}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default=None, help="another checkout's root, measured in alternating processes")
    ap.add_argument("--kv", default="q8_0/turbo3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--processes", type=int, default=2, help="processes per tree")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.kv, args.batch, args.steps)))
        return 0
    trees = {"new": HERE} if args.old is None else {"old": Path(args.old).resolve(), "new": HERE}
    runs: dict = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        from ab_trees import shim   # the sibling script's tree links (this script's folder is on sys.path)

        paths = {t: shim(p, Path(tmp) / t) for t, p in trees.items()}
        for i in range(args.processes):
            for t in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(paths[t]), os.environ.get("PYTHONPATH", "")]))
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--kv", args.kv,
                                      "--batch", str(args.batch), "--steps", str(args.steps)], env=env,
                                     cwd=tempfile.gettempdir(), check=True, capture_output=True, text=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                runs[t].append(row)
                print(t, i, row, flush=True)
    summary = {t: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for t, rows in runs.items()}
    result = {"kv": args.kv, "batch": args.batch, "steps": args.steps, "runs": runs, "median": summary}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
