"""Where one layer's decode step spends host time: cProfile over many steps of the KV path
(TQCache update_and_fetch + routed attention) of a model geometry, caches pre-filled.

    python benchmarks/scripts/profile_decode_step.py [--model qwen2.5-1.5b] [--context 4096] [--kv q8_0/turbo3]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import mlx.core as mx
from mlx_lm.models import base

from tqbridge.metal.lm import decode_bench
from tqbridge.metal.lm.routing import route_attention


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--kv", default="q8_0/turbo3")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    model, _ = decode_bench.build_model(args.model)
    cache = decode_bench.make_caches(model, args.kv)
    decode_bench.prefill(cache, model, args.context, mx.float16)
    hq, hkv, hd = decode_bench.kv_shape(model)
    c = cache[-1]
    q = mx.random.normal((1, hq, 1, hd)).astype(mx.float16)
    k = mx.random.normal((1, hkv, 1, hd)).astype(mx.float16)
    mx.eval(q, k)
    with route_attention():
        attn = base.scaled_dot_product_attention

        def step():
            kk, vv = c.update_and_fetch(k, k)
            return attn(q, kk, vv, cache=c, scale=hd ** -0.5, mask=None)

        for _ in range(3):
            mx.eval(step())
        t0 = time.perf_counter()
        outs = [step() for _ in range(args.steps)]
        t1 = time.perf_counter()
        mx.eval(outs)
        print(f"{args.kv}: {(t1 - t0) / args.steps * 1e6:.1f} us of host time per layer step")
        prof = cProfile.Profile()
        prof.enable()
        outs = [step() for _ in range(args.steps)]
        prof.disable()
        mx.eval(outs)
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
