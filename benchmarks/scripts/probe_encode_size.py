"""Does MLX's host cost of evaluating a chain of custom kernels grow with the size of their inputs?

    python benchmarks/scripts/probe_encode_size.py [--mb 1,12,48] [--layers 16]

bench attention's growing regime (docs/benchmark-history.md, 2026-12-02, commit 835c3ce) saw the host's share of an evaluation
(``mx.async_eval``: MLX encodes every primitive on the calling thread) grow from 12 to 25 µs per layer
between 4K and 128K keys with CUDA graphs on, and stay at 15-19 µs with ``MLX_USE_CUDA_GRAPHS=0``.
Our kernels read the whole cache buffer of a layer, whose size grows with the context. This probe
chains ``--layers`` trivial kernels (each reads one word of its own buffer of S MB and of the previous
kernel's output) and times build / encode / wall per kernel for each S, in one process: a growth with
S says MLX's per-op host cost depends on the input's size; none clears it.
"""

from __future__ import annotations

import argparse
import json
import os


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="1,12,48,192")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args(argv)
    import mlx.core as mx

    from tqbridge.metal.profiling import build_encode_wall

    kern = mx.fast.cuda_kernel(name="probe_touch", input_names=["x", "prev"], output_names=["y"],
                               source="if (threadIdx.x == 0 && blockIdx.x == 0) y[0] = x[0] + prev[0];")
    rows = []
    for mb in [int(x) for x in args.mb.split(",")]:
        n = mb * (1 << 20) // 4
        bufs = [mx.full((n,), float(i), mx.float32) for i in range(args.layers)]
        mx.eval(bufs)
        seed = mx.zeros((4,), mx.float32) + 1
        mx.eval(seed)

        def make(i, bufs=bufs, seed=seed):
            y = seed
            for b in bufs:
                (y,) = kern(inputs=[b, y], output_shapes=[(4,)], output_dtypes=[mx.float32], grid=(32, 1, 1),
                            threadgroup=(32, 1, 1))
            return y

        build, encode, wall = build_encode_wall(mx, make, range(args.repeats + 1), args.layers)
        row = {"mb": mb, "build_us": round(build, 2), "encode_us": round(encode, 2), "wall_us": round(wall, 2)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del bufs
    print(json.dumps({"graphs": os.environ.get("MLX_USE_CUDA_GRAPHS", "default"), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
