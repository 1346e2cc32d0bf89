"""Does a parameter array made from host data every call cost the GPU? (yes: docs/benchmark-history.md, 2026-12-01, commit 97f5219)

    python benchmarks/scripts/probe_host_params.py

MLX allocates arrays made from host data (``mx.array(numpy)``) in unified (managed) memory when
CUDA reports concurrent managed access, and writes them on the CPU; a kernel that reads one then
faults its page over to the GPU. The decode step makes two such arrays every step (pass 1's
lengths, the append's row position), shared by the layers of a geometry. This probe times (1) 16
chained trivial custom kernels reading a parameter array made fresh from host data, made earlier
and already read by the GPU, or made on the device (``mx.full``), and (2) the cache path of the
fused attention over 16 layers with lengths it has not seen against lengths whose parameter
buffers it made (and the GPU read) before. A gap in (1) between fresh and pre-touched is the
fault; whether (2) shows it says whether the decode step pays it, and (2) with
``DecodeOptions(device_params=True)`` (the lengths as views of a table made on the device, now CUDA's default)
whether avoiding host-made arrays wins it back.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

REPS = 60            # timed evaluations per case (DecodeLaunch keeps at most 64 length buffers)


def timeit(mx, make, reps=30):
    """Median µs of one evaluation of ``make(i)`` (after a warm-up on i = 0)."""
    ws = []
    mx.eval(make(0))
    for i in range(1, reps + 1):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(make(i))
        mx.synchronize()
        ws.append(time.perf_counter() - t0)
    return round(statistics.median(ws) * 1e6, 1)


def main() -> None:
    import mlx.core as mx

    from tqbridge.bridge import get_format, mlx_quantize
    from tqbridge.metal.attention import kernel as ak
    from tqbridge.metal.decode_options import DecodeOptions

    src = "if (threadIdx.x == 0 && blockIdx.x == 0) { y[0] = x[0] + (float)p[0]; }"
    triv = mx.fast.cuda_kernel(name="trivp", input_names=["x", "p"], output_names=["y"], source=src)
    x0 = mx.zeros((4,), mx.float32)
    mx.eval(x0)

    def chain_triv(p, nl=16):
        x = x0
        for _ in range(nl):
            x = triv(inputs=[x, p], output_shapes=[(4,)], output_dtypes=[mx.float32], grid=(32, 1, 1),
                     threadgroup=(32, 1, 1))[0]
        return x

    pre = [mx.array(np.array([i] * 8, np.int32)) for i in range(40)]
    mx.eval([p + 0 for p in pre])   # read by the GPU once
    cases = (("fresh", lambda i: chain_triv(mx.array(np.array([i] * 8, np.int32)))),
             ("pretouched", lambda i: chain_triv(pre[i])),
             ("device_full", lambda i: chain_triv(mx.full((8,), i, mx.int32))))
    for name, fn in cases + cases[:2]:
        print("trivial x16", name, timeit(mx, fn), "us per evaluation", flush=True)

    kf, vf = get_format("q8_0"), get_format("turbo3")
    for ctx in (4096, 32768):
        nl = 16
        kx, vx = mx.random.normal((1, 8, ctx, 128)), mx.random.normal((1, 8, ctx, 128))
        kb0, vb0 = mlx_quantize(kf, kx), mlx_quantize(vf, vx)
        kb, vb = [kb0 + 0 for _ in range(nl)], [vb0 + 0 for _ in range(nl)]
        q0 = mx.random.normal((1, 32, 128)).astype(mx.float16)
        mx.eval(kb, vb, q0)
        for flag in ("0", "1", "0", "1"):   # lengths from host data / as views of a device table, twice
            dl = ak.prepare_decode(q0, kb0, vb0, k_format=kf, v_format=vf, q_precision="int8",
                                   options=DecodeOptions(device_params=flag == "1"))
            lens = list(range(ctx - REPS - 2, ctx - 1))

            def chain(i, dl=dl, kb=kb, vb=vb, q0=q0, lens=lens):
                q = q0
                for j in range(nl):
                    q = dl(q, kb[j], vb[j], lens[i])
                return q
            fresh = timeit(mx, chain, reps=REPS)
            seen = timeit(mx, chain, reps=REPS)
            print(ctx, f"cache path x16, device_params={flag}: new lengths", fresh,
                  "us; lengths seen before", seen, "us", flush=True)


if __name__ == "__main__":
    main()
