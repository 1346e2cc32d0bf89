"""Where a fused decode-attention call spends its time on a GPU: host graph building, evaluation,
and the device time of each kernel (CUPTI through PyTorch's profiler, when PyTorch is installed).

    python benchmarks/scripts/profile_attention.py [--context 4096,32768,131072] [--layers 16] [--kernel tiles]

Prints one line per context: wall time per call, the host-side time to build the call's MLX graph,
and device time per call of every kernel that ran, summed by name. The bench
(``tqbridge bench attention``) reports wall time; this script explains it.
"""

from __future__ import annotations

import argparse
import json

from tqbridge.metal.profiling import build_and_wall, device_times


def main() -> None:
    import mlx.core as mx

    from tqbridge.bridge import get_format, mlx_quantize
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.attention import decode_attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", default="4096,32768,131072")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernel", default="tiles")
    ap.add_argument("--k-format", default="q8_0")
    ap.add_argument("--v-format", default="turbo3")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-cupti", action="store_true", help="skip the per-kernel device times (e.g. under ncu)")
    args = ap.parse_args()
    backend = attention_kernel.pick_backend("auto")
    b, hq, hkv, d, nl = 1, 32, 8, 128, args.layers
    kf, vf = get_format(args.k_format), get_format(args.v_format)
    report = []
    for ctx in [int(x) for x in args.context.split(",")]:
        mx.random.seed(ctx)
        kx = mx.random.normal((b, hkv, ctx, d))
        vx = mx.random.normal((b, hkv, ctx, d))
        kb0, vb0 = mlx_quantize(kf, kx), mlx_quantize(vf, vx)
        kh0, vh0 = kx.astype(mx.float16), vx.astype(mx.float16)
        mx.eval(kb0, vb0, kh0, vh0)
        kb = [kb0 + 0 for _ in range(nl)]
        vb = [vb0 + 0 for _ in range(nl)]
        kh = [kh0 + 0 for _ in range(nl)]
        vh = [vh0 + 0 for _ in range(nl)]
        mx.eval(kb, vb, kh, vh)
        q0 = mx.random.normal((b, hq, d)).astype(mx.float16)

        def fused():
            q = q0
            for i in range(nl):
                q = decode_attention(q, kb[i], vb[i], k_format=kf, v_format=vf, length=ctx, backend=backend,
                                     kernel=args.kernel)
            return q

        def sdpa():
            q = q0[:, :, None]
            for i in range(nl):
                q = mx.fast.scaled_dot_product_attention(q, kh[i], vh[i], scale=d ** -0.5)
            return q

        row = {"context": ctx}
        for tag, fn in (("fused", fused), ("sdpa_fp16", sdpa)):
            build, wall = build_and_wall(mx, lambda _: fn(), range(args.repeats + 1), nl)
            row[tag] = {"wall_us_per_call": wall, "build_us_per_call": build,
                        "device": "skipped" if args.no_cupti else device_times(mx, fn)}
            dev = row[tag]["device"]
            if isinstance(dev, dict):
                row[tag]["device_us_per_call"] = sum(v["us"] for v in dev.values()) / nl
        report.append(row)
        print(json.dumps(row))
        del kb, vb, kh, vh
    if args.json:
        from tqbridge.bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
