"""Two builds of the decode lane's append kernel in one process: this tree's ``kv_append.cpp`` /
``quantize_append.h`` against another tree's (``--old``, its ``metal/kernels`` folder), with fp16,
in interleaved rounds (as ``tqbridge bench decode``), so the comparison is free of the host-speed
spread between processes.

    python benchmarks/scripts/ab_append_kernel.py --old ../main/metal/kernels [--model llama-3.1-8b]
        [--context 4096,32768] [--caches q8_0/turbo3,q8_0/q4_0] [--tokens 16] [--rounds 8] [--json out.json]

Per context: fp16, then per TQCache kind a cache whose append kernel is built from this tree's sources
(``new``) and one built from ``--old`` (the kernel's name carries a digest of its source, so both live
side by side); every other kernel (pass 1, combine) is this tree's in both. Per cache: median ms/token
over rounds, the median per-round ratio to fp16 and, for ``new``, to ``old``; and the device time per
token of the top kernels (CUPTI, ``bench decode``'s short-minus-long decode).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main(argv=None) -> int:
    import mlx.core as mx

    from tqbridge.metal import kv_append
    from tqbridge.metal.lm import decode_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the baseline tree's metal/kernels folder")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--context", default="4096,32768")
    ap.add_argument("--caches", default="q8_0/turbo3,q8_0/q4_0")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    old_dir = Path(args.old)
    if not (old_dir / "kv_append.cpp").is_file():
        raise SystemExit(f"--old {old_dir}: no kv_append.cpp there")
    new_dir = kv_append.KERNEL_DIR

    def build(kind: str, ctx: int, kernels: Path):
        kv_append.KERNEL_DIR = kernels
        kv_append.append_kernel.cache_clear()
        kv_append.prepared.cache_clear()
        try:
            return decode_bench.prepare_cache(model, kind, ctx, mx.float16)
        finally:
            kv_append.KERNEL_DIR = new_dir
            kv_append.append_kernel.cache_clear()
            kv_append.prepared.cache_clear()

    model, _ = decode_bench.build_model(args.model)
    out = {"model": args.model, "old": str(old_dir), "runs": []}
    for ctx in (int(c) for c in args.context.split(",")):
        names, caches = [], []
        row, c = decode_bench.prepare_cache(model, "fp16", ctx, mx.float16)
        names.append("fp16"), caches.append(c)
        for kind in args.caches.split(","):
            for label, kdir in (("new", new_dir), ("old", old_dir)):
                row, c = build(kind, ctx, kdir)
                if c is None:
                    raise SystemExit(f"{kind} {label}: {row.get('error')}")
                names.append(f"{kind}:{label}"), caches.append(c)
        rounds: list = [[] for _ in caches]
        for _ in range(args.rounds):
            for i, c in enumerate(caches):
                mx.synchronize()
                deltas, _ = decode_bench.decode_tokens(model, c, args.tokens)
                rounds[i].append(statistics.median(deltas) * 1e3)
        for i, (name, c) in enumerate(zip(names, caches)):
            r = {"context": ctx, "cache": name, "ms_per_token": statistics.median(rounds[i]),
                 "ms_per_token_rounds": rounds[i]}
            ratios = [a / b for a, b in zip(rounds[0], rounds[i])]
            r["speedup_vs_fp16"] = statistics.median(ratios)
            r["speedup_vs_fp16_spread"] = decode_bench.ratio_spread(ratios)
            if name.endswith(":new"):
                old = rounds[i + 1]
                nr = [a / b for a, b in zip(old, rounds[i])]
                r["speedup_vs_old"] = statistics.median(nr)
                r["speedup_vs_old_spread"] = decode_bench.ratio_spread(nr)
            dev = decode_bench.device_profile(model, c, top=14)
            if not isinstance(dev, str):
                r["device_ms_per_token"] = dev["ms_per_token"]
                r["device_kernels_ms_per_token"] = dev["kernels"]
            out["runs"].append(r)
            print(json.dumps(r), flush=True)
        del caches
        mx.clear_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
