"""Where a decode step's attention time goes in a chain of layers on MLX's CUDA backend.

    python benchmarks/scripts/profile_chain.py --context 4096,131072 [--json out.json] [--only sdpa,int8-mma]

Per layer of a 16-layer chain (B 1, Hq 32, Hkv 8, D 128, q8_0 K + turbo3 V, int8 q = kernel int8-mma,
a new length every evaluation as in decode), for each path: ``build`` (µs of Python + MLX graph
building), ``wall`` (µs from the first call to the end of ``mx.eval``) and ``device`` (µs of kernel
time per layer, CUPTI through PyTorch's profiler, by kernel). Paths:

- ``sdpa``: ``mx.fast.scaled_dot_product_attention`` over fp16 K/V;
- ``int8-mma``: the prepared decode launch (pass 1 + combine);
- ``*_compiled``: the same launch under ``mx.compile`` (one compiled function per layer call: the
  custom-kernel primitives are traced once and replayed, so the per-call Python binding and kernel
  source assembly drop out);
- ``*_hot``: device time only, every layer reading layer 0's buffers (L2-resident at 4K);
- ``*_heated``: device time only, with a ~1 ms matrix product queued just before the chain (the GPU
  busy and clocked up when the chain starts, as inside a model's decode step).

``MLX_USE_CUDA_GRAPHS=0`` in the environment times MLX's direct launches instead of its CUDA graphs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    import mlx.core as mx

    from tqbridge.bridge import get_format
    from tqbridge.metal.attention import kernel as ak
    from tqbridge.metal.profiling import build_and_wall, device_times, layer_buffers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", default="4096,131072")
    ap.add_argument("--only", default="", help="comma-separated paths (default: all)")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    only = {x for x in a.only.split(",") if x}
    b, hq, hkv, d, nl = 1, 32, 8, 128, 16
    kf, vf = get_format("q8_0"), get_format("turbo3")
    graphs = os.environ.get("MLX_USE_CUDA_GRAPHS", "1")
    report = {"graphs": graphs, "rows": []}
    heat_a = mx.random.normal((8192, 8192)).astype(mx.float16)
    mx.eval(heat_a)

    def want(tag):
        return not only or tag.split("_")[0] in only

    for ctx in [int(x) for x in a.context.split(",")]:
        mx.random.seed(ctx)
        kb, vb, kh, vh = layer_buffers(mx, kf, vf, (b, hkv, ctx, d), nl)
        kb0, vb0 = kb[0], vb[0]
        q0 = mx.random.normal((b, hq, d)).astype(mx.float16)
        lengths = list(range(ctx - a.repeats - 2, ctx - 1))
        row: dict = {"context": ctx}

        def measure(tag, make, hot_make=None):
            build, wall = build_and_wall(mx, make, lengths, nl)
            dev = device_times(mx, lambda: make(ctx - 1))
            res = {"build_us": round(build, 1), "wall_us": round(wall, 1), "device": dev}
            if isinstance(dev, dict):
                res["device_us"] = round(sum(v["us"] for v in dev.values()) / nl, 1)
            if hot_make is not None:
                hd = device_times(mx, lambda: hot_make(ctx - 1))
                res["hot_device"] = hd

                def heated(n):
                    h = heat_a @ heat_a
                    return make(n, (h[:1, :1] * 0).astype(mx.float16))
                hd2 = device_times(mx, lambda: heated(ctx - 1))
                res["heated_device"] = {k: v for k, v in hd2.items() if any(
                    w in k for w in ("custom_kernel", "cudnn", "sdpa", "reduction"))} if isinstance(hd2, dict) else hd2
            row[tag] = res
            print(ctx, tag, {k: v for k, v in res.items() if not isinstance(v, dict)}, flush=True)

        if want("sdpa"):
            def sdpa(n, bump=None, hot=False):
                q = q0[:, :, None] if bump is None else q0[:, :, None] + bump
                for i in range(nl):
                    j = 0 if hot else i
                    q = mx.fast.scaled_dot_product_attention(q, kh[j][:, :, :n], vh[j][:, :, :n], scale=d ** -0.5)
                return q
            measure("sdpa", sdpa, lambda n: sdpa(n, hot=True))

        for tag in ("int8-mma",):
            if not want(tag):
                continue
            dl = ak.prepare_decode(q0, kb0, vb0, k_format=kf, v_format=vf, q_precision="int8")
            run = dl._run
            ref = dl(q0, kb0, vb0, ctx - 1)

            def one(q, k_, v_, ip1, dep, run=run):
                return run.launch(q, k_, v_, None, ip1, dep)
            comp = mx.compile(one)
            got = comp(q0, kb0, vb0, dl.ip1(ctx - 1), run.no_dep)
            same = bool(mx.array_equal(ref, got).item())
            row[tag + "_compiled_bit_identical"] = same
            row[tag + "_compiled_max_abs_diff"] = mx.max(mx.abs(ref.astype(mx.float32) - got.astype(mx.float32))).item()
            print(ctx, tag, "compiled output bit-identical:", same, row[tag + "_compiled_max_abs_diff"], flush=True)

            for suffix, fn in (("", one), ("_compiled", comp)):
                def chain(n, bump=None, hot=False, fn=fn, dl=dl, run=run):
                    q = q0 if bump is None else q0 + bump
                    ip1 = dl.ip1(n)
                    for i in range(nl):
                        j = 0 if hot else i
                        q = fn(q, kb[j], vb[j], ip1, run.no_dep)
                    return q
                measure(tag + suffix, chain, lambda n, chain=chain: chain(n, hot=True))
        report["rows"].append(row)
        del kb, vb, kh, vh
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
