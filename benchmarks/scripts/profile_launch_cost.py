"""Where the wall time of a fused decode-attention call goes in a chain of layers (CUDA).

    python benchmarks/scripts/profile_launch_cost.py --context 4096,131072 [--json out.json]

Per layer of a 16-layer chain (B 1, Hq 32, Hkv 8, D 128, q8_0 K + turbo3 V, int8 q = kernel int8-mma),
median of 25 evaluations, two numbers each: ``build`` (µs of Python + MLX graph building per
layer) and ``wall`` (µs per layer from the first call to the end of ``mx.eval``):

- ``int8-mma_2disp_len``: the prepared decode launch (``prepare_decode``: pass 1 + combine), with a length that
  grows every evaluation
  (``len``: near the context, ``len1k``: near 1024) or stays 0 (``len0``: the kernels' fixed cost);
- ``sdpa``: ``mx.fast.scaled_dot_product_attention`` over fp16 K/V of the same context;
- ``two_trivial_like_ours``: two custom kernels that do nothing, with the same inputs, outputs,
  grids and threadgroups as pass 1 + combine — MLX's own cost of two custom-kernel launches.
"""

from __future__ import annotations

import argparse
import json

from tqbridge.metal.profiling import build_and_wall, layer_buffers


def main() -> None:
    import mlx.core as mx

    from tqbridge.bridge import get_format
    from tqbridge.metal.attention import kernel as ak

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", default="4096,131072")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    b, hq, hkv, d, nl = 1, 32, 8, 128, 16
    kf, vf = get_format("q8_0"), get_format("turbo3")
    src = "if (threadIdx.x == 0 && blockIdx.x == 0) { y[0] = x[0]; z[0] = 0.f; }"
    triv = mx.fast.cuda_kernel(name="triv7", input_names=["x", "a", "b2", "c", "e", "f", "g"],
                               output_names=["y", "z"], source=src)

    def timeit(fn, reps=25):
        build, wall = build_and_wall(mx, lambda _: fn(), range(reps + 1), nl)
        return round(build, 1), round(wall, 1)

    report = []
    for ctx in [int(x) for x in args.context.split(",")]:
        kb, vb, kh, vh = layer_buffers(mx, kf, vf, (b, hkv, ctx, d), nl)
        kb0, vb0 = kb[0], vb[0]
        q0 = mx.random.normal((b, hq, d)).astype(mx.float16)
        res: dict = {"context": ctx}
        for disp in ("2",):
            dl = ak.prepare_decode(q0, kb0, vb0, k_format=kf, v_format=vf, q_precision="int8")
            for lab, ln in (("len", ctx), ("len0", 0), ("len1k", 1024)):
                step = [ln - 30 if ln > 30 else ln]

                def fused(step=step, ln=ln, dl=dl):
                    step[0] = step[0] + 1 if ln > 30 else ln
                    q = q0
                    for i in range(nl):
                        q = dl(q, kb[i], vb[i], step[0])
                    return q
                res[f"int8-mma_{disp}disp_{lab}"] = timeit(fused)

        def sdpa():
            q = q0[:, :, None]
            for i in range(nl):
                q = mx.fast.scaled_dot_product_attention(q, kh[i], vh[i], scale=d ** -0.5)
            return q
        res["sdpa"] = timeit(sdpa)
        x0 = mx.zeros((4,), mx.float32)
        mx.eval(x0)

        def triv_like_ours():
            x = x0
            for i in range(nl):
                y, z = triv(inputs=[x, kb[i], vb[i], x0, x0, x0, x0], output_shapes=[(4,), (32, 64, 128)],
                            output_dtypes=[mx.float32, mx.float32], grid=(512 * 128, 1, 1), threadgroup=(128, 1, 1))
                x = triv(inputs=[y, z, x0, x0, x0, x0, x0], output_shapes=[(4,), (32, 128)],
                         output_dtypes=[mx.float32, mx.float16], grid=(32 * 128, 1, 1), threadgroup=(128, 1, 1))[0]
            return x
        res["two_trivial_like_ours"] = timeit(triv_like_ours)
        report.append(res)
        print(json.dumps(res), flush=True)
    if args.json:
        from tqbridge.bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
