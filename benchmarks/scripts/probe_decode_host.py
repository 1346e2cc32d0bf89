"""Where a decode step's host time goes, whole model and KV path (GPU).

    python benchmarks/scripts/probe_decode_host.py [--model llama-3.1-8b] [--context 32768] [--json out.json]

Two parts, each per cache (``fp16``: mlx-lm's KVCache; a TQCache spelling such as ``q8_0/turbo3``):

- ``step``: the whole model's decode step (one token, every layer, the attention routed as
  ``tqbridge generate`` routes it), median µs per token of ``build`` (the model call: Python + MLX
  graph building), ``encode`` (``mx.async_eval``: MLX encodes every primitive on this thread) and
  ``wall`` (to the end of the device work). A step whose build + encode exceed its device time is
  host-bound: then only host time per layer moves tokens/s.
- ``kv``: one layer's KV path in a chain of ``--layers`` calls on one cache (its length grows every
  call): ``update_and_fetch`` + the routed attention as a model calls them. Per layer: build /
  encode / wall µs.

A cache spelled ``kind{name=value,...}`` decodes with those decode options (as in ``tqbridge bench decode``),
e.g. ``q8_0/turbo3{defer_append=0}``: the append as its own compiled call, not inside the attention's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def step_times(mx, model, cache, tokens: int) -> dict:
    """Median µs per decode token: build, encode, wall (after 3 warm-up tokens)."""
    y = mx.array([[1]])
    build, encode, wall = [], [], []
    for i in range(tokens + 3):
        mx.synchronize()
        t0 = time.perf_counter()
        logits = model(y, cache=cache)
        t1 = time.perf_counter()
        mx.async_eval(logits)
        t2 = time.perf_counter()
        mx.synchronize()
        t3 = time.perf_counter()
        if i >= 3:
            build.append(t1 - t0)
            encode.append(t2 - t1)
            wall.append(t3 - t0)
    med = lambda xs: round(statistics.median(xs) * 1e6, 1)   # noqa: E731
    return {"build_us": med(build), "encode_us": med(encode), "wall_us": med(wall)}


def main() -> None:
    import mlx.core as mx
    from mlx_lm.models import base

    from tqbridge.metal.lm import decode_bench
    from tqbridge.metal.lm.routing import route_attention
    from tqbridge.bridge.blocks.kv_spec import split_top
    from tqbridge.metal.profiling import build_encode_wall, split_options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--context", default="32768")
    ap.add_argument("--caches", default="fp16,q8_0/turbo3,q8_0/turbo3{defer_append=0}")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, _ = decode_bench.build_model(args.model)
    hq, hkv, hd = decode_bench.kv_shape(model)
    nl = len(model.layers)
    report = {"command": "python benchmarks/scripts/probe_decode_host.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "json"),
        "model": args.model, "layers": nl, "runs": []}
    for ctx in [int(x) for x in args.context.split(",")]:
        for rnd in range(args.rounds):
            for label in split_top(args.caches):
                kind, opts = split_options(label)
                cache = decode_bench.make_caches(model, kind, opts)
                decode_bench.prefill(cache, model, ctx, mx.float16)
                mx.eval([c.state for c in cache])
                res = {"context": ctx, "round": rnd, "cache": label}
                with route_attention():
                    res["step"] = step_times(mx, model, cache, args.tokens)
                    res["step"]["build_us_per_layer"] = round(res["step"]["build_us"] / nl, 2)
                    res["step"]["encode_us_per_layer"] = round(res["step"]["encode_us"] / nl, 2)
                    c = cache[-1]
                    attn = base.scaled_dot_product_attention
                    q = mx.random.normal((1, hq, 1, hd)).astype(mx.float16)
                    k = mx.random.normal((1, hkv, 1, hd)).astype(mx.float16)
                    mx.eval(q, k)

                    def kv_path(_):
                        out = q
                        for _i in range(args.layers):
                            kk, vv = c.update_and_fetch(k, k)
                            out = attn(out, kk, vv, cache=c, scale=hd ** -0.5, mask=None)
                        return out
                    b, e, w = build_encode_wall(mx, kv_path, range(26), args.layers)
                    res["kv"] = {"routed": {"build_us": round(b, 2), "encode_us": round(e, 2), "wall_us": round(w, 2)}}
                    if kind != "fp16":
                        res["kv"]["paths"] = dict(c.paths)
                        from tqbridge.metal.lm.report import cache_report

                        res["decode_kernel"] = cache_report(cache)["layers"][-1]["decode_kernel"]
                report["runs"].append(res)
                print(json.dumps(res), flush=True)
                del cache
    report["hardware"] = _hardware(mx)
    if args.json:
        from tqbridge.bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(report, indent=2))


def _hardware(mx) -> str:
    try:
        info = mx.device_info()
        return f"{info.get('device_name', '?')}, MLX {mx.__version__}"
    except Exception:   # noqa: BLE001 - a description only
        return f"MLX {mx.__version__}"


if __name__ == "__main__":
    main()
