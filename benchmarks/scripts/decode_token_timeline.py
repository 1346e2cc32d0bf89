"""Where one decode token's milliseconds go, per cache, on CUDA: device time per kernel class, the
device's idle gaps, and the host's time per token and per layer.

    python benchmarks/scripts/decode_token_timeline.py [--model llama-3.1-8b] [--context 4096,32768]
        [--caches fp16,q8_0/turbo3] [--tokens 24] [--json out.json]

Per context, every cache is pre-filled (``tqbridge bench decode``'s random rows), then decodes through
mlx-lm's ``generate_step`` (pipelined: the host builds token t+1 while the device runs token t) under
PyTorch's profiler (CUPTI). From the kernels' start and end stamps, per token:

- ``kernels_ms``: device time summed per kernel class (``classify``: weights' matrix-vector products,
  fp16 attention (cuDNN / MLX SDPA), the KV update copies of mlx-lm's cache, tqbridge's append, pass 1
  and combine, norms, rope, elementwise, other), and ``launches`` per class;
- ``busy_ms``: the union of the kernels' intervals (overlapping kernels counted once), ``span_ms``: the
  first kernel's start to the last one's end over the tokens, ``gap_ms = span - busy``: the device idle
  between kernels (launch latency, or waiting for the host);
- ``wall_ms`` / ``wall_mean_ms``: median / mean host time between tokens (``bench decode`` reports the
  median), and ``unprofiled_wall_ms`` / ``unprofiled_wall_mean_ms``: the same of a decode of as many tokens
  just before, without the profiler;
- host: ``build_us`` (the model call: Python and MLX graph building) and ``encode_us``
  (``mx.async_eval``: MLX encodes and launches every primitive), each per token (median, unpipelined
  steps, the caches interleaved over ``--host-rounds`` rounds) and per layer.

The ceiling of issue 49: (the token's other device time + fp16's attention) / (the other device time +
the cache's KV bytes at the copy bandwidth), with the copy bandwidth measured here (a device-to-device
copy through PyTorch of 1 GiB, bytes read + written); "other device time" is the cache's kernels outside
attention summed, so kernels that overlap (the projections) count in full. ``ceiling_busy`` is the
stricter one in busy time: fp16's busy time over fp16's busy time outside attention plus the KV bytes at
the copy bandwidth (:func:`ceilings`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

CLASSES = (
    ("tq_append", ("kv_append",)),
    ("tq_pass1", ("tq_attention_split",)),
    ("tq_combine", ("attention_combine",)),
    ("fp16_attention", ("sdpa", "flash", "lean_reduction", "attention")),
    ("weights_gemv", ("gemv", "gemm", "matmul", "cublas", "cutlass", "xmma", "sm90")),
    ("kv_copy", ("copy",)),
    ("norm", ("rms_norm", "layer_norm")),
    ("rope", ("rope",)),
    ("elementwise", ("binary", "unary", "ternary", "Broadcast", "compiled", "Cf2I", "Sigmoid")),
    ("reduce", ("reduce", "arg_", "softmax", "scan")),
)


def classify(name: str) -> str:
    """The class of a kernel by its name (first match of CLASSES, else ``other``)."""
    low = name.lower()
    for cls, keys in CLASSES:
        if any(k.lower() in low for k in keys):
            return cls
    return "other"


def kernel_events(prof) -> list:
    """``(name, start_us, end_us)`` of every CUDA kernel the profiler saw, by start."""
    out = []
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is None or "CUDA" not in str(dt):
            continue
        tr = e.time_range
        out.append((e.name, float(tr.start), float(tr.end)))
    out.sort(key=lambda x: x[1])
    return out


def union_us(events: list) -> float:
    """Length of the union of the events' intervals."""
    busy, cur_s, cur_e = 0.0, None, None
    for _, s, e in events:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def profile_decode(mx, model, cache, tokens: int) -> dict:
    """Decode ``tokens`` tokens through generate_step under the profiler: per-token breakdown."""
    import torch
    from mlx_lm.generate import generate_step
    from torch.profiler import ProfilerActivity, profile

    from tqbridge.metal.lm.routing import route_attention

    def decode(n):
        stamps = []
        with route_attention():
            for _ in generate_step(mx.array([1], mx.uint32), model, prompt_cache=cache, max_tokens=n):
                stamps.append(time.perf_counter())
        mx.synchronize()
        return stamps

    decode(4)   # warm-up: builds, first-step allocations
    plain = decode(tokens)   # the same decode without the profiler: its wall time per token
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        stamps = decode(tokens)
        torch.cuda.synchronize()
    return token_breakdown(kernel_events(prof), tokens, stamps, plain)


def token_breakdown(ev: list, tokens: int, stamps: list, plain: list) -> dict:
    """The per-token breakdown of ``ev`` (``(name, start_us, end_us)`` by start, the kernels of a decode
    of ``tokens`` tokens), with ``stamps`` / ``plain`` the host times (s) of that decode's tokens and of
    an unprofiled one. The first 2 tokens' kernels and the last token's are dropped: the kernels are
    cut by count (the decode runs the same kernels every token; host and device clocks differ)."""
    n = len(ev)
    per_tok = n / tokens
    lo, hi = int(round(2 * per_tok)), int(round((tokens - 1) * per_tok))
    win = ev[lo:hi]
    ntok = (hi - lo) / per_tok
    kernels: dict = {}
    launches: dict = {}
    top: dict = {}
    for name, s, e in win:
        c = classify(name)
        kernels[c] = kernels.get(c, 0.0) + (e - s)
        launches[c] = launches.get(c, 0) + 1
        top[name[:70]] = top.get(name[:70], 0.0) + (e - s)
    busy = union_us(win)
    span = max(e for _, _, e in win) - win[0][1]
    deltas = [b - a for a, b in zip(stamps, stamps[1:])][2:]
    plain_d = [b - a for a, b in zip(plain, plain[1:])][2:]
    return {
        "kernels_ms": {k: round(v / ntok / 1e3, 4) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])},
        "launches": {k: round(v / ntok, 1) for k, v in sorted(launches.items(), key=lambda kv: -kv[1])},
        "device_sum_ms": round(sum(kernels.values()) / ntok / 1e3, 4),
        "busy_ms": round(busy / ntok / 1e3, 4),
        "span_ms": round(span / ntok / 1e3, 4),
        "gap_ms": round((span - busy) / ntok / 1e3, 4),
        "wall_ms": round(statistics.median(deltas) * 1e3, 4),
        "wall_mean_ms": round(statistics.fmean(deltas) * 1e3, 4),
        "unprofiled_wall_ms": round(statistics.median(plain_d) * 1e3, 4),
        "unprofiled_wall_mean_ms": round(statistics.fmean(plain_d) * 1e3, 4),
        "kernels_per_token": round(per_tok, 1),
        "top_kernels_ms": {k: round(v / ntok / 1e3, 4) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:12]},
    }


def host_times(mx, model, cache, tokens: int) -> dict:
    """Median µs per unpipelined decode token of build (the model call) and encode (mx.async_eval),
    under tqbridge's routing; per layer too."""
    from probe_decode_host import step_times   # the sibling script's timing loop (scripts run from this folder)

    from tqbridge.metal.lm.routing import route_attention

    with route_attention():
        t = step_times(mx, model, cache, tokens)
    layers = len(model.layers)
    return {"build_us": t["build_us"], "encode_us": t["encode_us"], "unpipelined_wall_us": t["wall_us"],
            "build_us_per_layer": round(t["build_us"] / layers, 2),
            "encode_us_per_layer": round(t["encode_us"] / layers, 2)}


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy through PyTorch (read + written)."""
    import torch

    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(10):
        b.copy_(a)
    t1.record()
    torch.cuda.synchronize()
    bw = 2 * 10 * (1 << 30) / (t0.elapsed_time(t1) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return bw


ATTN = ("tq_append", "tq_pass1", "tq_combine", "fp16_attention", "kv_copy")


def ceilings(row: dict, fp: dict, copy_bps: float) -> dict:
    """A cache's ceilings against fp16 (rows of :func:`token_breakdown` with ``attention_ms`` and
    ``other_ms`` filled in, and ``kv_bytes``): ``ceiling`` (issue 49's, device time summed) and
    ``ceiling_busy`` (busy time: overlapping kernels once; fp16's time outside attention)."""
    kv_ms = row["kv_bytes"] / copy_bps * 1e3
    fp_outside = fp["busy_ms"] - fp["attention_ms"]
    return {"ceiling": round((row["other_ms"] + fp["attention_ms"]) / (row["other_ms"] + kv_ms), 4),
            "ceiling_busy": round(fp["busy_ms"] / (fp_outside + kv_ms), 4)}


def main(argv=None) -> int:
    import mlx.core as mx

    from tqbridge.metal.lm import decode_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--context", default="4096,32768")
    ap.add_argument("--caches", default="fp16,q8_0/turbo3")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--host-rounds", type=int, default=6, help="interleaved rounds of the host timing")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    torch.cuda.init()
    out = {"model": args.model, "tokens": args.tokens, "gpu": torch.cuda.get_device_name(0),
           "copy_bandwidth_Bps": copy_bandwidth(), "runs": []}
    print(f"{out['gpu']}: copy bandwidth {out['copy_bandwidth_Bps'] / 1e12:.2f} TB/s", flush=True)
    model, _ = decode_bench.build_model(args.model)
    for ctx in (int(c) for c in args.context.split(",")):
        rows, caches = [], []
        for kind in args.caches.split(","):
            row, cache = decode_bench.prepare_cache(model, kind, ctx, mx.float16)
            if cache is None:
                print(row, flush=True)
                continue
            row.update(profile_decode(mx, model, cache, args.tokens))
            row["attention_ms"] = round(sum(v for k, v in row["kernels_ms"].items() if k in ATTN), 4)
            row["other_ms"] = round(row["device_sum_ms"] - row["attention_ms"], 4)
            rows.append(row)
            caches.append(cache)
        # host time per token, the caches interleaved round by round (host speed drifts within a process)
        per: list = [[] for _ in caches]
        for _ in range(args.host_rounds):
            for i, cache in enumerate(caches):
                per[i].append(host_times(mx, model, cache, 4))
        for row, got in zip(rows, per):
            for key in got[0]:
                row[key] = round(statistics.median(g[key] for g in got), 2)
            print(json.dumps(row), flush=True)
        del caches
        mx.clear_cache()
        fp = next((r for r in rows if r["cache"] == "fp16"), None)
        for r in rows:
            if fp is None or r is fp:
                continue
            r.update(ceilings(r, fp, out["copy_bandwidth_Bps"]))
            r["device_ratio"] = round(fp["busy_ms"] / r["busy_ms"], 4)
            r["span_ratio"] = round(fp["span_ms"] / r["span_ms"], 4)
            print(f"{ctx} {r['cache']}: ceiling {r['ceiling']} (busy {r['ceiling_busy']}), busy ratio "
                  f"{r['device_ratio']}, span ratio {r['span_ratio']}", flush=True)
        out["runs"] += rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
