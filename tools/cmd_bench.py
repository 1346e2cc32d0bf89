"""``tqbridge bench attention`` and ``tqbridge bench decode``.

``decode``: end-to-end greedy decode through mlx-lm with TQCache against mlx-lm's own fp16 cache (and
its QuantizedKVCache where MLX's backend runs it), per model geometry and context; see
:mod:`tqbridge.metal.lm.decode_bench` for what is measured and how.

``attention``: the fused decode-attention kernel against MLX's paths, side by side.

For each context length: the fused kernel on quantized K/V blocks, ``mx.fast.scaled_dot_product_attention``
on fp16 K/V, MLX affine dequantize + SDPA, and mlx-lm's quantized SDPA, each over ``--layers``
distinct caches chained in one evaluation (layer i's output is layer i+1's query), so launch and
sync costs are amortised as in a model. Two regimes (``--regime``): ``fixed`` calls every path at
the context length each evaluation; ``growing`` gives each evaluation a new length, as a decoding
loop does (MLX's paths read a slice of the buffers, as mlx-lm's KVCache hands them to SDPA), and
also times the prepared launch a TQCache runs (``cache_path``). Reports per attention call: wall
time (median of ``--repeats``), the host's graph-building share of it, and on CUDA the device time
summed over the kernels one evaluation ran (CUPTI); speed-ups against MLX's paths; the kernel's
share of the device's copy bandwidth on the bytes it reads. ``--kernel`` picks the pass-1 kernels
timed (default: the backend's choice for the pair, then v2); before timing, each one's output on
one layer is compared with the MLX-ops reference path. Needs MLX on a GPU (CUDA or Metal);
``--backend cpu-emulator`` runs the same steps on the CPU as a smoke test.
"""

from __future__ import annotations

import json
import platform
import statistics
import time

from tqbridge.bridge.kv_spec import DEFAULT_FORMAT, TURBO_FORMAT

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
                        "llama-3.2-1b, gemma-3-270m, tiny) or real models (smollm2, gemma3, a GGUF path)")
    p.add_argument("--caches", default="fp16,q8_0/turbo3,q8_0/q4_0,mlx-q8",
                   help="decode: comma-separated caches: fp16 (mlx-lm KVCache), mlx-q8 / mlx-q4 (mlx-lm "
                        "QuantizedKVCache), or TQCache K/V spellings; fp16 first (speed-ups are against it); a "
                        "TQCache may carry decode options in braces, e.g. 'q8_0/turbo3{compile=0}' (docs/settings.md), "
                        "to compare them in one process")
    p.add_argument("--tokens", type=int, default=32, help="decode: tokens generated per cache and round")
    p.add_argument("--rounds", type=int, default=3, help="decode: interleaved rounds (every cache decodes in each)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="decode: the model's dtype (weights, activations, K/V rows); on a CPU float32 is faster")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--k-format", default=DEFAULT_FORMAT)
    p.add_argument("--v-format", default=TURBO_FORMAT)
    p.add_argument("--layers", type=int, default=16, help="distinct layers chained per evaluation")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--kernel", default="auto,v2", help="comma-separated pass-1 kernels to time with their default "
                   "plan (auto: the backend's default for the pair, as a cache runs it; v3: matrix fragments, int8 q; "
                   "v2: one key per thread; v1: lanes share a key); the first is the headline")
    p.add_argument("--tune", default=DEFAULT_TUNE, help="extra kernel configs, e.g. 'v2:8x64,v2:2x64,v1:16x4x64' "
                   "(v2:warps x keys per tile; v1: lanes_per_key x warps [x tile]; no prefix: v1; '' for none)")
    p.add_argument("--splits", type=int, default=None, help="force the number of context splits")
    p.add_argument("--regime", default="fixed,growing", help="attention: fixed (the same length every call) and/or "
                   "growing (a new length every evaluation, as a decoding loop calls it; also times the prepared "
                   "launch a TQCache runs, as cache_path)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "metal", "cpu-emulator"],
                   help="attention: where the kernels run (cpu-emulator: the same steps on the CPU emulator, a smoke "
                        "test of the command, no timing worth reading)")
    p.add_argument("--no-device-time", action="store_true", help="attention: skip the device time per call (CUPTI "
                   "through PyTorch's profiler, summed over the kernels each evaluation ran)")
    p.add_argument("--variants", default=None, help="attention: settings of the cache path to compare within this "
                   "process, in interleaved rounds with fp16 SDPA timed in each round (ratios free of the run-to-run "
                   "spread between processes): ';'-separated variants, each ','-separated decode options name=value "
                   "(docs/settings.md), an empty one for the defaults; e.g. 'chunks=1;' (growing length)")
    p.add_argument("--variant-rounds", type=int, default=2, help="attention: rounds of --variants (default 2)")
    p.add_argument("--json", default=None, help="write the results to this file")


def parse_variants(spec: "str | None") -> list:
    """``--variants``: a list of DecodeOptions (the defaults for an empty variant)."""
    if spec is None:
        return []
    from ..metal.profiling import SettingsError, parse_options

    try:
        out = [parse_options(part) for part in spec.split(";")]
    except SettingsError as e:
        raise CliError(f"--variants: {e}") from None
    if len(out) < 2:
        raise CliError("--variants: at least two variants, ';'-separated (an empty one for the defaults)")
    return out


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
    return _run_attention(args)


def _kernel_configs(args, kernels) -> list:
    """(tag, kernel, lanes_per_key, warps, tile) per timed configuration; the first is the headline."""
    configs = []
    for k in filter(None, args.kernel.split(",")):
        if k != "auto" and k not in kernels:
            raise CliError(f"--kernel: unknown kernel {k!r}; choose from auto, {', '.join(kernels)}")
        configs.append(("fused" if not configs else f"fused_{k}", None if k == "auto" else k, None, None, None))
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
    return configs


def _run_attention(args) -> int:
    try:
        import mlx.core as mx
        from mlx_lm.models.base import quantized_scaled_dot_product_attention
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..bridge import FormatError, get_format, mlx_quantize
    from ..metal import profiling
    from ..metal.attention_plan import KERNELS
    from ..metal.backend import pick_backend
    from ..metal.attention import decode_attention, last_run

    regimes = [r for r in args.regime.split(",") if r]
    if not regimes or set(regimes) - {"fixed", "growing"}:
        raise CliError(f"--regime: {args.regime!r}; a comma-separated list of fixed and growing")
    try:
        contexts = [int(x) for x in args.context.split(",") if x]
    except ValueError:
        raise CliError(f"--context: {args.context!r} is not a comma-separated list of integers") from None
    if args.repeats < 1 or args.layers < 1:
        raise CliError("--repeats and --layers: at least 1")
    args.variant_list = parse_variants(args.variants)
    if args.variant_list and (args.variant_rounds < 1 or "growing" not in regimes):
        raise CliError("--variants: needs --variant-rounds >= 1 and the growing regime")
    if any(c <= args.repeats + 2 for c in contexts):
        raise CliError(f"--context: each context must exceed --repeats + 2 ({args.repeats + 2}): the growing "
                       "regime times a new length every evaluation below it")
    try:
        kf, vf = get_format(args.k_format), get_format(args.v_format)
        kf.check_length(args.head_dim)
        vf.check_length(args.head_dim)
    except FormatError as e:
        raise CliError(f"--k-format / --v-format / --head-dim: {e}") from None
    backend = pick_backend(args.backend)
    gpu = backend in ("cuda", "metal")
    if not gpu and args.backend == "auto":
        raise CliError("bench attention needs MLX on a GPU (CUDA or Metal); this machine has none "
                       "(--backend cpu-emulator runs the same steps on the emulator: a smoke test, not a timing)")
    configs = _kernel_configs(args, KERNELS)
    b, hq, hkv, d, nl = args.batch, args.q_heads, args.kv_heads, args.head_dim, args.layers
    scale = d ** -0.5
    device_time = not args.no_device_time and gpu
    why_no_device = ("--no-device-time" if args.no_device_time else
                     f"backend {backend}: no GPU kernels to time" if not gpu else profiling.device_time_unavailable())
    results = {"hardware": platform.node(), "device": str(mx.default_device()), "backend": backend,
               "mlx": mx.__version__, "shape": dict(batch=b, q_heads=hq, kv_heads=hkv, head_dim=d),
               "formats": [kf.key, vf.key], "layers_per_eval": nl, "repeats": args.repeats, "regimes": regimes,
               "device_time": "CUPTI (PyTorch profiler), summed over the kernels of one evaluation"
               if device_time and why_no_device is None else f"not measured: {why_no_device}",
               "copy": _copy_bandwidth(mx, args.repeats) if gpu else {"skipped": f"backend {backend}"},
               "contexts": []}
    measure_device = device_time and why_no_device is None
    print(json.dumps(results["copy"]))
    for ctx in contexts:
        row = _attention_context(mx, args, ctx, kf, vf, backend, configs, regimes, measure_device,
                                 decode_attention, last_run, mlx_quantize, quantized_scaled_dot_product_attention,
                                 profiling, scale, results["copy"])
        results["contexts"].append(row)
        print(json.dumps(row))
    if args.json:
        from ..bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(results, indent=2))
    return 0


def _attention_context(mx, args, ctx, kf, vf, backend, configs, regimes, measure_device, decode_attention, last_run,
                       mlx_quantize, quantized_sdpa, profiling, scale, copy) -> dict:
    """One context's row: every path timed in each regime (keys ``<path>_us``, ``<path>_build_us``,
    ``<path>_encode_us``, ``<path>_device_us``; the growing regime's prefixed ``growing_``)."""
    from ..metal.attention_kernel import prepare_decode

    b, hq, hkv, d, nl = args.batch, args.q_heads, args.kv_heads, args.head_dim, args.layers
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

    def fused(length, kern=None, lpk=None, nw=None, un=None, layers=nl):
        q = q0[:, :, 0]
        for i in range(layers):
            q = decode_attention(q, kb[i], vb[i], k_format=kf, v_format=vf, length=length, backend=backend,
                                 kernel=kern, lanes_per_key=lpk, warps=nw, tile=un, splits=args.splits)
        return q

    launch = prepare_decode(q0[:, :, 0], kb[0], vb[0], k_format=kf, v_format=vf, backend=backend)
    cache_path = _chained(launch, q0, kb, vb, nl)

    def cut(a, length):
        return a if length == a.shape[2] else a[:, :, :length]

    def sdpa(length):
        q = q0
        for i in range(nl):
            q = mx.fast.scaled_dot_product_attention(q, cut(kh[i], length), cut(vh[i], length), scale=scale)
        return q

    def deq_sdpa(length):
        q = q0
        for i in range(nl):
            k = mx.dequantize(*(cut(a, length) for a in kq[i]), group_size=64, bits=8)
            v = mx.dequantize(*(cut(a, length) for a in vq[i]), group_size=64, bits=4)
            q = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
        return q

    def mlxlm(length):
        q = q0
        for i in range(nl):
            # mlx-lm takes one width for K and V: 4-bit (its common setting, fewer bytes than ours)
            q = quantized_sdpa(q, tuple(cut(a, length) for a in kq4[i]), tuple(cut(a, length) for a in vq[i]),
                               scale=scale, mask=None, group_size=64, bits=4)
        return q

    row = {"context": ctx}
    kernel_bytes = b * hkv * ctx * (kb0.shape[-1] + vb0.shape[-1])
    refs = {qp: decode_attention(q0[:, :, 0], kb[0], vb[0], k_format=kf, v_format=vf, length=ctx,
                                 backend="reference", q_precision=qp) for qp in ("exact", "int8")}
    ref_max = mx.max(mx.abs(refs["exact"].astype(mx.float32))).item()

    def checked(tag, fn, precision):
        """One layer against the MLX-ops reference first: a wrong kernel must not look fast."""
        got = fn()
        ref = refs["int8" if precision == "int8" else "exact"]
        diff = mx.max(mx.abs(got.astype(mx.float32) - ref.astype(mx.float32))).item()
        row[tag + "_max_abs_diff_vs_reference"] = diff
        if not diff <= CHECK_TOLERANCE * max(ref_max, 1.0):
            print(f"WARNING: {tag} differs from the reference path by {diff:.3g} (|ref| max {ref_max:.3g})")
            row[tag + "_wrong"] = True

    def timed(tag, make, regime):
        """``make(length)`` timed: the fixed regime at the context every evaluation, the growing one at
        a new length every evaluation (the lengths below the context, as a decoding loop sees them)."""
        key = tag if regime == "fixed" else f"growing_{tag}"
        if regime == "fixed":
            lengths = [ctx] * (args.repeats + 1)
        else:
            lengths = list(range(ctx - args.repeats - 2, ctx - 1))
        build, encode, wall = profiling.build_encode_wall(mx, make, lengths, nl)
        row[key + "_us"], row[key + "_build_us"], row[key + "_encode_us"] = wall, build, encode
        if regime == "growing":   # as a decoding loop runs: the next evaluation built while the device works
            row[key + "_pipelined_us"] = profiling.pipelined_wall(mx, make, lengths, nl)
        if measure_device:
            last = ctx if regime == "fixed" else ctx - 1
            dev = profiling.device_times(mx, lambda: make(last))
            row[key + "_device_us"] = profiling.device_us_per_call(dev, nl)
            row[key + "_kernels"] = dev
        return key

    for tag, kern, lpk, nw, un in configs:
        try:
            fused(ctx, kern, lpk, nw, un, layers=1)
            rec = last_run()
            checked(tag, lambda: fused(ctx, kern, lpk, nw, un, layers=1), rec.get("q_precision"))
            row[tag + "_plan"] = {k: rec.get(k) for k in ("kernel", "splits", "lanes_per_key", "warps", "tile",
                                                          "dispatches", "q_precision", "chunks", "stages", "dyn_smem")
                                  if k in rec}
            for regime in regimes:
                timed(tag, lambda n: fused(n, kern, lpk, nw, un), regime)
        except Exception as e:  # one failing configuration must not cost the other measurements
            row[tag + "_error"] = f"{type(e).__name__}: {e}"[:300]
            print(f"WARNING: {tag}: {row[tag + '_error']}")
    if launch is not None and "growing" in regimes:
        info = getattr(launch, "run_info", None) or {"backend": launch.backend}
        row["cache_path_plan"] = {k: info[k] for k in ("backend", "kernel", "splits", "warps", "tile", "dispatches",
                                                       "q_precision", "v_decode", "chunks", "stages", "dyn_smem",
                                                       "compiled", "device_params", "device_consts")
                                 if k in info}
        checked("cache_path", lambda: launch(q0[:, :, 0], kb[0], vb[0], ctx), info.get("q_precision"))
        timed("cache_path", cache_path, "growing")
    if args.variant_list:
        _variant_rounds(mx, args, ctx, row, q0, kb, vb, kf, vf, backend, sdpa, checked, measure_device, profiling)
    for tag, make in (("sdpa_fp16", sdpa), ("dequant_sdpa", deq_sdpa), ("mlx_lm_quantized_sdpa", mlxlm)):
        for regime in regimes:
            try:
                timed(tag, make, regime)
            except Exception as e:  # e.g. MLX's CUDA quantized matmul refuses lengths off its tile sizes
                key = tag if regime == "fixed" else f"growing_{tag}"
                row[key + "_error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"WARNING: {key}: {row[key + '_error']}")
    row["kernel_bytes"] = kernel_bytes
    row["fp16_bytes"] = b * hkv * ctx * d * 2 * 2
    for prefix in ([""] if "fixed" in regimes else []) + (["growing_"] if "growing" in regimes else []):
        _speedups(row, prefix, copy, kernel_bytes)
    return row


def _chained(launch, q0, kb, vb, layers: int):
    """``f(length)``: what TQCache runs each decode step over ``layers`` layers — one prepared launch
    per layer, the length a parameter, each layer's output the next one's q."""
    def run(length):
        q = q0[:, :, 0]
        for i in range(layers):
            q = launch(q, kb[i], vb[i], length)
        return q
    return run


def _variant_rounds(mx, args, ctx, row, q0, kb, vb, kf, vf, backend, sdpa, checked, measure_device, profiling):
    """``--variants``: the cache path under each setting, then fp16 SDPA, in each of the rounds, a new
    length every evaluation; each variant's plan and launch are made with its decode options.
    ``row["variants"]``: every measurement; ``row["variant_summary"]``: per variant the median wall
    time and the median of its same-round ratio to fp16 SDPA."""
    from ..metal.attention_kernel import prepare_decode

    nl = args.layers
    lengths = list(range(ctx - args.repeats - 2, ctx - 1))
    runs = row["variants"] = []
    for rnd in range(args.variant_rounds):
        for i, opts in enumerate(args.variant_list):
            vl = prepare_decode(q0[:, :, 0], kb[0], vb[0], k_format=kf, v_format=vf, backend=backend,
                                options=opts)
            mx.eval(vl(q0[:, :, 0], kb[0], vb[0], ctx))   # (the emulated launch says its plan after a call)
            info = getattr(vl, "run_info", None) or {"backend": vl.backend}
            tag = f"variant{i}_round{rnd}"
            checked(tag, lambda: vl(q0[:, :, 0], kb[0], vb[0], ctx), info.get("q_precision"))

            chain = _chained(vl, q0, kb, vb, nl)
            build, wall = profiling.build_and_wall(mx, chain, lengths, nl)
            entry = {"variant": i, "options": opts.label(), "round": rnd, "wall_us": wall, "build_us": build,
                     "pipelined_us": profiling.pipelined_wall(mx, chain, lengths, nl),
                     "plan": {k: info[k] for k in ("kernel", "splits", "dispatches", "q_precision", "v_decode", "chunks",
                                                   "stages", "compiled", "device_params", "device_consts") if k in info},
                     "wrong": bool(row.get(tag + "_wrong"))}
            if measure_device:
                entry["device_us"] = profiling.device_us_per_call(
                    profiling.device_times(mx, lambda: chain(ctx - 1)), nl)
            runs.append(entry)
        build, wall = profiling.build_and_wall(mx, sdpa, lengths, nl)
        runs.append({"variant": "sdpa_fp16", "round": rnd, "wall_us": wall, "build_us": build,
                     "pipelined_us": profiling.pipelined_wall(mx, sdpa, lengths, nl)})
    sd = {r["round"]: r["wall_us"] for r in runs if r["variant"] == "sdpa_fp16"}
    sdp = {r["round"]: r["pipelined_us"] for r in runs if r["variant"] == "sdpa_fp16"}
    row["variant_summary"] = []
    for i, opts in enumerate(args.variant_list):
        mine = [r for r in runs if r["variant"] == i]
        row["variant_summary"].append({
            "variant": i, "options": opts.label(), "wall_us_median": statistics.median(r["wall_us"] for r in mine),
            "vs_sdpa_fp16_median": statistics.median(sd[r["round"]] / r["wall_us"] for r in mine),
            "pipelined_vs_sdpa_fp16_median": statistics.median(sdp[r["round"]] / r["pipelined_us"] for r in mine),
            "device_us_median": (statistics.median(r["device_us"] for r in mine)
                                 if all(r.get("device_us") for r in mine) else None),
            "plan": mine[-1]["plan"], "wrong": any(r["wrong"] for r in mine)})
    print("variants at", ctx, json.dumps(row["variant_summary"]))


def _speedups(row: dict, prefix: str, copy: dict, kernel_bytes: int) -> None:
    """Speed-ups of the headline and the best fused configuration against MLX's paths, and the best's
    share of the device's copy bandwidth on the bytes it reads (wall time)."""
    timed = [(k[len(prefix):-3], v) for k, v in row.items()
             if k.startswith(prefix + "fused") and k.endswith("_us")
             and not k.endswith(("_build_us", "_encode_us", "_device_us", "_pipelined_us"))
             and not row.get(k[len(prefix):-3] + "_wrong")]
    if prefix and "growing_cache_path_us" in row and not row.get("cache_path_wrong"):
        timed.append(("cache_path", row["growing_cache_path_us"]))
    if not timed:
        return
    best_tag, best = min(timed, key=lambda kv: kv[1])
    row[prefix + "best_fused_us"] = best
    row[prefix + "best_fused"] = best_tag
    for base in ("sdpa_fp16", "dequant_sdpa", "mlx_lm_quantized_sdpa"):
        if f"{prefix}{base}_us" not in row:   # that path failed (its error is in the row)
            continue
        row[f"{prefix}speedup_vs_{base}"] = row[f"{prefix}{base}_us"] / best
        if prefix + "fused_us" in row:   # the headline kernel (first of --kernel)
            row[f"{prefix}headline_speedup_vs_{base}"] = row[f"{prefix}{base}_us"] / row[prefix + "fused_us"]
        dev, base_dev = row.get(prefix + "fused_device_us"), row.get(f"{prefix}{base}_device_us")
        if dev and base_dev:
            row[f"{prefix}headline_device_speedup_vs_{base}"] = base_dev / dev
    if prefix and row.get("growing_cache_path_pipelined_us") and row.get("growing_sdpa_fp16_pipelined_us") \
            and not row.get("cache_path_wrong"):
        row["growing_pipelined_speedup_vs_sdpa_fp16"] = (row["growing_sdpa_fp16_pipelined_us"]
                                                        / row["growing_cache_path_pipelined_us"])
    cp = copy.get("cupy_copy_GBps") or copy.get("mlx_copy_GBps")
    if cp:
        row[prefix + "fraction_of_copy_bw"] = kernel_bytes / (best * 1e-6) / 1e9 / cp
        dev = row.get(prefix + "fused_device_us")
        if dev:
            row[prefix + "headline_device_fraction_of_copy_bw"] = kernel_bytes / (dev * 1e-6) / 1e9 / cp


def _run_decode(args) -> int:
    try:
        import mlx.core as mx
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..bridge import FormatError
    from ..bridge.kv_spec import split_q_precision
    from ..metal.lm import decode_bench
    from ..metal.lm.kv_spelling import parse_kv_spec

    from ..metal.profiling import SettingsError, split_options, split_top

    models = [m for m in args.models.split(",") if m]
    try:
        caches = split_top(args.caches)
        split = [split_options(c) for c in caches]
    except SettingsError as e:
        raise CliError(f"--caches: {e}") from None
    bases = [b for b, _ in split]
    for c, (b, opts) in zip(caches, split):
        if opts.changed() and b in ("fp16", "mlx-q8", "mlx-q4"):
            raise CliError(f"--caches: {c!r}: decode options apply to TQCache spellings, not {b}")
    for c in bases:
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
