"""``tqbridge bench attention`` and ``tqbridge bench decode``.

``decode``: end-to-end greedy decode through mlx-lm with TQCache against mlx-lm's own fp16 cache (and
its QuantizedKVCache where MLX's backend runs it), per model geometry and context; see
:mod:`tqbridge.metal.lm.decode_bench` for what is measured and how.

``attention``: the fused decode-attention kernel against MLX's paths, side by side.

For each context length: the fused kernel on quantized K/V blocks, ``mx.fast.scaled_dot_product_attention``
on fp16 K/V, MLX affine dequantize + SDPA, and mlx-lm's quantized SDPA, each over ``--layers``
distinct caches chained in one evaluation (layer i's output is layer i+1's query), so launch and
sync costs are amortised as in a model. Reports time per attention call (median of ``--repeats``),
speed-ups, the kernel's bandwidth on the bytes it reads, and a device-copy bandwidth measured in
the same run. ``--kernel`` picks the pass-1 kernels timed (default: v2, then v1 for comparison);
before timing, each kernel's output on one layer is compared with the MLX-ops reference path.
Needs MLX on a GPU (CUDA or Metal).
"""

from __future__ import annotations

import json
import platform
import statistics
import time

from .cli import CliError

# fp16 q and output: the kernel and the reference path each round the output to fp16 (2^-11
# relative) and accumulate in different orders; 4e-3 of the largest |output| leaves room for both
CHECK_TOLERANCE = 4e-3
DEFAULT_TUNE = "v2:4x128,v2:2x64,v2:1x32"   # v2 alternatives: fixed threadgroup sizes (warps x keys per tile)


def add_arguments(p):
    p.add_argument("what", choices=["attention", "decode"], help="what to benchmark: the attention kernel alone, "
                   "or decode end to end through mlx-lm")
    p.add_argument("--context", default="4096,32768,131072", help="comma-separated context lengths")
    p.add_argument("--models", default="qwen2.5-1.5b,llama-3.1-8b,llama-3.2-1b",
                   help="decode: comma-separated model geometries (random fp16 weights: qwen2.5-1.5b, llama-3.1-8b, "
                        "llama-3.2-1b, tiny) or real models (smollm2, gemma3, a GGUF path)")
    p.add_argument("--caches", default="fp16,q8_0/turbo3,q8_0/q4_0,mlx-q8",
                   help="decode: comma-separated caches: fp16 (mlx-lm KVCache), mlx-q8 / mlx-q4 (mlx-lm "
                        "QuantizedKVCache), or TQCache K/V spellings; fp16 first (speed-ups are against it)")
    p.add_argument("--tokens", type=int, default=32, help="decode: tokens generated per cache and round")
    p.add_argument("--rounds", type=int, default=3, help="decode: interleaved rounds (every cache decodes in each)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="decode: the model's dtype (weights, activations, K/V rows); on a CPU float32 is faster")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--k-format", default="q8_0")
    p.add_argument("--v-format", default="turbo3")
    p.add_argument("--layers", type=int, default=16, help="distinct layers chained per evaluation")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--kernel", default="v2,v1", help="comma-separated pass-1 kernels to time with their default "
                   "plan (v2: one key per thread; v1: lanes share a key); the first is the headline")
    p.add_argument("--tune", default=DEFAULT_TUNE, help="extra kernel configs, e.g. 'v2:8x64,v2:2x64,v1:16x4x64' "
                   "(v2:warps x keys per tile; v1: lanes_per_key x warps [x tile]; no prefix: v1; '' for none)")
    p.add_argument("--splits", type=int, default=None, help="force the number of context splits")
    p.add_argument("--json", default=None, help="write the results to this file")


def _timed(mx, fn, repeats: int) -> float:
    mx.eval(fn())  # warm up (JIT builds)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _copy_bandwidth(mx, repeats: int) -> dict:
    n = 1 << 28  # 1 GiB of float32
    x = mx.random.uniform(shape=(n,), dtype=mx.float32)
    mx.eval(x)
    t = _timed(mx, lambda: x + 0, repeats)
    out = {"mlx_copy_GBps": 2 * 4 * n / t / 1e9}
    try:
        import cupy as cp

        a = cp.ones(n, cp.float32)
        b = cp.empty_like(a)
        ts = []
        for _ in range(repeats + 1):
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            b[...] = a
            cp.cuda.Device().synchronize()
            ts.append(time.perf_counter() - t0)
        out["cupy_copy_GBps"] = 2 * 4 * n / statistics.median(ts[1:]) / 1e9
        del a, b
    except Exception as e:  # cupy is optional
        out["cupy_copy_error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def run(args) -> int:
    if args.what == "decode":
        return _run_decode(args)
    try:
        import mlx.core as mx
        from mlx_lm.models.base import quantized_scaled_dot_product_attention
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..bridge import get_format, mlx_quantize
    from ..metal import attention_kernel
    from ..metal.attention import decode_attention, last_run

    backend = attention_kernel.pick_backend("auto")
    if backend not in ("cuda", "metal"):
        raise CliError("bench attention needs MLX on a GPU (CUDA or Metal); this machine has none")
    b, hq, hkv, d, nl = args.batch, args.q_heads, args.kv_heads, args.head_dim, args.layers
    kf, vf = get_format(args.k_format), get_format(args.v_format)
    scale = d ** -0.5
    configs = []   # (tag, kernel, lanes_per_key, warps, tile)
    for k in filter(None, args.kernel.split(",")):
        if k not in attention_kernel.KERNELS:
            raise CliError(f"--kernel: unknown kernel {k!r}; choose from {', '.join(attention_kernel.KERNELS)}")
        configs.append(("fused" if not configs else f"fused_{k}", k, None, None, None))
    if not configs:
        raise CliError("--kernel: name at least one kernel")
    for c in filter(None, args.tune.split(",")):
        kern, _, spec = c.rpartition(":")
        kern = kern or "v1"
        try:
            parts = [int(x) for x in spec.split("x")]
        except ValueError:
            raise CliError(f"--tune: {c!r} is not v2:WARPSxTILE or v1:LPKxWARPS[xTILE]") from None
        if kern in ("v2", "v3") and len(parts) == 2:
            configs.append((f"fused_{kern}_{spec}", kern, None, parts[0], parts[1]))
        elif kern == "v1" and len(parts) in (2, 3):
            parts += [None] * (3 - len(parts))
            configs.append((f"fused_v1_{spec}", "v1", *parts))
        else:
            raise CliError(f"--tune: {c!r} is not v2:WARPSxTILE or v1:LPKxWARPS[xTILE]")
    results = {"hardware": platform.node(), "device": str(mx.default_device()), "backend": backend,
               "mlx": mx.__version__, "shape": dict(batch=b, q_heads=hq, kv_heads=hkv, head_dim=d),
               "formats": [kf.key, vf.key], "layers_per_eval": nl, "repeats": args.repeats,
               "copy": _copy_bandwidth(mx, args.repeats), "contexts": []}
    print(json.dumps(results["copy"]))
    for ctx in [int(x) for x in args.context.split(",")]:
        mx.random.seed(ctx)
        kx = mx.random.normal((b, hkv, ctx, d)).astype(mx.float16)
        vx = mx.random.normal((b, hkv, ctx, d)).astype(mx.float16)
        kb0 = mlx_quantize(kf, kx.astype(mx.float32))
        vb0 = mlx_quantize(vf, vx.astype(mx.float32))
        kq0 = mx.quantize(kx, group_size=64, bits=8)
        vq0 = mx.quantize(vx, group_size=64, bits=4)
        kq40 = mx.quantize(kx, group_size=64, bits=4)
        mx.eval(kb0, vb0, kq0, vq0, kq40)
        # distinct buffers per layer (so no layer reads another's data from cache)
        kb = [kb0 + 0 for _ in range(nl)]
        vb = [vb0 + 0 for _ in range(nl)]
        kh = [kx + 0 for _ in range(nl)]
        vh = [vx + 0 for _ in range(nl)]
        kq = [tuple(a + 0 for a in kq0) for _ in range(nl)]
        vq = [tuple(a + 0 for a in vq0) for _ in range(nl)]
        kq4 = [tuple(a + 0 for a in kq40) for _ in range(nl)]
        mx.eval(kb, vb, kh, vh, kq, vq, kq4)
        del kx, vx
        q0 = mx.random.normal((b, hq, 1, d)).astype(mx.float16)

        def fused(kern="v2", lpk=None, nw=None, un=None, layers=nl):
            q = q0[:, :, 0]
            for i in range(layers):
                q = decode_attention(q, kb[i], vb[i], k_format=kf, v_format=vf, length=ctx, backend=backend,
                                     kernel=kern, lanes_per_key=lpk, warps=nw, tile=un, splits=args.splits)
            return q

        def sdpa():
            q = q0
            for i in range(nl):
                q = mx.fast.scaled_dot_product_attention(q, kh[i], vh[i], scale=scale)
            return q

        def deq_sdpa():
            q = q0
            for i in range(nl):
                k = mx.dequantize(*kq[i], group_size=64, bits=8)
                v = mx.dequantize(*vq[i], group_size=64, bits=4)
                q = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
            return q

        def mlxlm():
            q = q0
            for i in range(nl):
                # mlx-lm takes one width for K and V: 4-bit (its common setting, fewer bytes than ours)
                q = quantized_scaled_dot_product_attention(q, kq4[i], vq[i], scale=scale, mask=None, group_size=64,
                                                           bits=4)
            return q

        row = {"context": ctx}
        kernel_bytes = b * hkv * ctx * (kb0.shape[-1] + vb0.shape[-1])
        refs = {qp: decode_attention(q0[:, :, 0], kb[0], vb[0], k_format=kf, v_format=vf, length=ctx,
                                     backend="reference", q_precision=qp) for qp in ("exact", "int8")}
        ref_max = mx.max(mx.abs(refs["exact"].astype(mx.float32))).item()
        for tag, kern, lpk, nw, un in configs:
            try:
                # one layer against the MLX-ops reference first: a wrong kernel must not look fast
                got = fused(kern, lpk, nw, un, layers=1)
                ref = refs["int8" if last_run().get("q_precision") == "int8" else "exact"]
                diff = mx.max(mx.abs(got.astype(mx.float32) - ref.astype(mx.float32))).item()
                row[tag + "_max_abs_diff_vs_reference"] = diff
                if not diff <= CHECK_TOLERANCE * max(ref_max, 1.0):
                    print(f"WARNING: {tag} differs from the reference path by {diff:.3g} (|ref| max {ref_max:.3g})")
                    row[tag + "_wrong"] = True
                t = _timed(mx, lambda: fused(kern, lpk, nw, un), args.repeats) / nl
            except Exception as e:  # one failing configuration must not cost the other measurements
                row[tag + "_error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"WARNING: {tag}: {row[tag + '_error']}")
                continue
            row[tag + "_us"] = t * 1e6
            row[tag + "_GBps"] = kernel_bytes / t / 1e9
            rec = last_run()
            row[tag + "_plan"] = {k: rec.get(k) for k in ("kernel", "splits", "lanes_per_key", "warps", "tile",
                                                              "dispatches")}
        row["sdpa_fp16_us"] = _timed(mx, sdpa, args.repeats) / nl * 1e6
        row["dequant_sdpa_us"] = _timed(mx, deq_sdpa, args.repeats) / nl * 1e6
        row["mlx_lm_quantized_sdpa_us"] = _timed(mx, mlxlm, args.repeats) / nl * 1e6
        row["kernel_bytes"] = kernel_bytes
        row["fp16_bytes"] = b * hkv * ctx * d * 2 * 2
        timed = [(k[:-3], v) for k, v in row.items() if k.startswith("fused") and k.endswith("_us")
                 and not row.get(k[:-3] + "_wrong")]
        if timed:
            best_tag, best = min(timed, key=lambda kv: kv[1])
            row["best_fused_us"] = best
            row["best_fused"] = best_tag
            for base in ("sdpa_fp16", "dequant_sdpa", "mlx_lm_quantized_sdpa"):
                row[f"speedup_vs_{base}"] = row[f"{base}_us"] / best
                if "fused_us" in row:   # the headline kernel (first of --kernel)
                    row[f"headline_speedup_vs_{base}"] = row[f"{base}_us"] / row["fused_us"]
            cp = results["copy"].get("cupy_copy_GBps") or results["copy"]["mlx_copy_GBps"]
            row["fraction_of_copy_bw"] = kernel_bytes / (best * 1e-6) / 1e9 / cp
        results["contexts"].append(row)
        print(json.dumps(row))
        del kb, vb, kh, vh, kq, vq, kq4
    if args.json:
        from ..bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(results, indent=2))
    return 0


def _run_decode(args) -> int:
    try:
        import mlx.core as mx
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..bridge import FormatError
    from ..bridge.kv_spec import split_q_precision
    from ..metal.lm import decode_bench
    from ..metal.lm.cache import parse_kv_spec

    models = [m for m in args.models.split(",") if m]
    caches = [c for c in args.caches.split(",") if c]
    for c in caches:
        if c not in ("fp16", "mlx-q8", "mlx-q4"):
            spec, qp = split_q_precision(c)
            if qp and qp not in ("exact", "int8"):
                raise CliError(f"--caches: {c!r}: the suffix after @ is the q precision, exact or int8")
            try:
                parse_kv_spec(spec)
            except FormatError as e:
                raise CliError(f"--caches: {e}") from None
    try:
        contexts = [int(x) for x in args.context.split(",") if x]
    except ValueError:
        raise CliError(f"--context: {args.context!r} is not a comma-separated list of integers") from None
    if args.tokens < 4:
        raise CliError("--tokens: at least 4 (the first 2 are dropped as warm-up)")
    if args.rounds < 1:
        raise CliError("--rounds: at least 1")
    keys = ("model", "cache", "context", "ms_per_token", "speedup_vs_fp16", "kv_path_kernels_per_layer",
            "kv_path_host_syncs_per_step", "host_syncs_per_token", "kv_path_python_us_per_layer", "kv_bytes", "error")

    def log(row):
        print(json.dumps({k: row[k] for k in keys if k in row}), flush=True)

    command = "tqbridge bench decode " + " ".join(
        f"--{k} {v}" for k, v in (("models", args.models), ("context", args.context), ("caches", args.caches),
                                   ("tokens", args.tokens), ("rounds", args.rounds), ("dtype", args.dtype)))

    def save(results):
        if args.json:
            from ..bridge.atomic import write_atomic

            write_atomic(args.json, json.dumps({"command": command, **results}, indent=2))

    from ..bridge.mlx_blas import slow_blas_notice

    slow_blas_notice()  # the models run on MLX's CPU with the bundled reference BLAS: say so, once
    save(decode_bench.run(models, contexts, caches, args.tokens, args.rounds, log=log, save=save,
                          dtype=getattr(mx, args.dtype)))
    return 0
