"""The attention benchmark behind ``tqbridge bench attention``: the fused decode attention against
MLX's paths, side by side, per context length.

For each context length: the fused kernel on quantized K/V blocks, ``mx.fast.scaled_dot_product_attention``
on fp16 K/V, MLX affine dequantize + SDPA, and mlx-lm's quantized SDPA, each over ``layers`` distinct
caches chained in one evaluation (layer i's output is layer i+1's query), so launch and sync costs are
amortised as in a model. Two regimes: ``fixed`` calls every path at the context length each evaluation;
``growing`` gives each evaluation a new length, as a decoding loop does (MLX's paths read a slice of
the buffers, as mlx-lm's KVCache hands them to SDPA), and also times the prepared launch a TQCache runs
(``cache_path``). Per attention call: wall time (median of ``repeats``), the host's graph-building
share of it, and on CUDA the device time summed over the kernels one evaluation ran (CUPTI);
speed-ups against MLX's paths; the kernel's share of the device's copy bandwidth on the bytes it
reads. Before timing, each kernel's output on one layer is compared with the MLX-ops reference path.
``variant_list`` (decode options) times the cache path under each in interleaved rounds with fp16 SDPA.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass

from ...bridge.blocks.format_types import Format
from .problem import KERNELS, AttentionError
from ..decode_options import DecodeOptions

# fp16 q and output: the kernel and the reference path each round the output to fp16 (2^-11
# relative) and accumulate in different orders; 4e-3 of the largest |output| leaves room for both
CHECK_TOLERANCE = 4e-3


@dataclass(frozen=True)
class AttentionBench:
    """What one ``bench attention`` run measures (checked by its caller: ``tools/cmd_bench.py``).
    ``configs``: (tag, kernel, lanes_per_key, warps, tile, chunks) per timed kernel configuration, the first the
    headline; ``variant_list``: decode options compared on the cache path (empty: none)."""

    k_format: Format
    v_format: Format
    contexts: tuple
    regimes: tuple
    configs: tuple
    backend: str
    batch: int = 1
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    layers: int = 16
    repeats: int = 20
    splits: "int | None" = None
    device_time: bool = True
    variant_list: "tuple[DecodeOptions, ...]" = ()
    variant_rounds: int = 2


def kernel_configs(kernel: str, tune: str) -> list:
    """The ``configs`` of an :class:`AttentionBench` from ``bench attention``'s ``--kernel`` (comma-separated
    names: ``auto`` or one of :data:`~.attention_problem.KERNELS`) and ``--tune`` (comma-separated
    ``KERNEL:SHAPE``); the first is the headline. A name or shape it does not know is an
    :class:`~.attention_problem.AttentionError` naming the option and what it takes."""
    configs = []
    for k in filter(None, kernel.split(",")):
        if k != "auto" and k not in KERNELS:
            raise AttentionError(f"--kernel: unknown kernel {k!r}; choose from auto, {', '.join(KERNELS)}")
        configs.append(("fused" if not configs else f"fused_{k}", None if k == "auto" else k, None, None, None, None))
    if not configs:
        raise AttentionError("--kernel: name at least one kernel")
    shapes = "tiles:WARPSxTILE, int8-mma:WARPSxTILE[xCHUNKS] or lanes:LPKxWARPS[xTILE]"
    for c in filter(None, tune.split(",")):
        kern, _, spec = c.rpartition(":")
        kern = kern or "lanes"
        try:
            parts = [int(x) for x in spec.split("x")]
        except ValueError:
            raise AttentionError(f"--tune: {c!r} is not {shapes}") from None
        if kern in ("tiles", "int8-mma") and len(parts) == 2 or kern == "int8-mma" and len(parts) == 3:
            configs.append((f"fused_{kern}_{spec}", kern, None, parts[0], parts[1], parts[2] if len(parts) == 3 else None))
        elif kern == "lanes" and len(parts) in (2, 3):
            parts += [None] * (3 - len(parts))
            configs.append((f"fused_lanes_{spec}", "lanes", *parts, None))
        else:
            raise AttentionError(f"--tune: {c!r} is not {shapes}")
    return configs


def run_attention_bench(bench: AttentionBench, emit=print) -> dict:
    """Run ``bench``; ``emit`` gets each line of progress (the copy bandwidth, then one JSON row per
    context). Returns the report: run facts, the copy bandwidth and one row per context."""
    import mlx.core as mx
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    from ...bridge import mlx_quantize
    from .. import profiling
    from . import decode_attention, last_run

    backend, kf, vf = bench.backend, bench.k_format, bench.v_format
    gpu = backend in ("cuda", "metal")
    b, hq, hkv, d, nl = bench.batch, bench.q_heads, bench.kv_heads, bench.head_dim, bench.layers
    scale = d ** -0.5
    why_no_device = ("not asked for" if not bench.device_time else
                     f"backend {backend}: no GPU kernels to time" if not gpu else profiling.device_time_unavailable())
    results = {"hardware": platform.node(), "device": str(mx.default_device()), "backend": backend,
               "mlx": mx.__version__, "shape": dict(batch=b, q_heads=hq, kv_heads=hkv, head_dim=d),
               "formats": [kf.key, vf.key], "layers_per_eval": nl, "repeats": bench.repeats,
               "regimes": list(bench.regimes),
               "device_time": "CUPTI (PyTorch profiler), summed over the kernels of one evaluation"
               if why_no_device is None else f"not measured: {why_no_device}",
               "copy": _copy_bandwidth(mx, bench.repeats) if gpu else {"skipped": f"backend {backend}"},
               "contexts": []}
    measure_device = why_no_device is None
    emit(json.dumps(results["copy"]))
    for ctx in bench.contexts:
        row = _attention_context(mx, bench, ctx, kf, vf, backend, list(bench.configs), list(bench.regimes),
                                 measure_device, decode_attention, last_run, mlx_quantize,
                                 quantized_scaled_dot_product_attention, profiling, scale, results["copy"])
        results["contexts"].append(row)
        emit(json.dumps(row))
    return results


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



def _attention_context(mx, bench, ctx, kf, vf, backend, configs, regimes, measure_device, decode_attention, last_run,
                       mlx_quantize, quantized_sdpa, profiling, scale, copy) -> dict:
    """One context's row: every path timed in each regime (keys ``<path>_us``, ``<path>_build_us``,
    ``<path>_encode_us``, ``<path>_device_us``; the growing regime's prefixed ``growing_``)."""
    from .kernel import prepare_decode

    b, hq, hkv, d, nl = bench.batch, bench.q_heads, bench.kv_heads, bench.head_dim, bench.layers
    mx.random.seed(ctx)
    kx = mx.random.normal((b, hkv, ctx, d)).astype(mx.float16)
    vx = mx.random.normal((b, hkv, ctx, d)).astype(mx.float16)
    kb0 = mlx_quantize(kf, _padded(mx, kf, kx.astype(mx.float32)))
    vb0 = mlx_quantize(vf, _padded(mx, vf, vx.astype(mx.float32)))
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

    def fused(length, kern=None, lpk=None, nw=None, un=None, ch=None, layers=nl):
        q = q0[:, :, 0]
        opts = DecodeOptions(chunks=ch) if ch else None
        for i in range(layers):
            q = decode_attention(q, kb[i], vb[i], k_format=kf, v_format=vf, length=length, backend=backend,
                                 kernel=kern, lanes_per_key=lpk, warps=nw, tile=un, splits=bench.splits, options=opts)
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
            lengths = [ctx] * (bench.repeats + 1)
        else:
            lengths = list(range(ctx - bench.repeats - 2, ctx - 1))
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

    for tag, kern, lpk, nw, un, ch in configs:
        try:
            fused(ctx, kern, lpk, nw, un, ch, layers=1)
            rec = last_run()
            checked(tag, lambda: fused(ctx, kern, lpk, nw, un, ch, layers=1), rec.get("q_precision"))
            row[tag + "_plan"] = {k: rec.get(k) for k in ("kernel", "splits", "lanes_per_key", "warps", "tile",
                                                          "dispatches", "q_precision", "chunks", "stages", "dyn_smem")
                                  if k in rec}
            for regime in regimes:
                timed(tag, lambda n: fused(n, kern, lpk, nw, un, ch), regime)
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
    if bench.variant_list:
        _variant_rounds(mx, bench, ctx, row, q0, kb, vb, kf, vf, backend, sdpa, checked, measure_device, profiling)
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


def _padded(mx, fmt, x):
    """Rows ``x`` (..., D) zero-padded to whole blocks of ``fmt``, as TQCache stores them (turbo rows of
    64 values: 128); the attention reads q and writes outputs of D values either way."""
    from ...bridge.blocks.padding import padded_dim

    extra = padded_dim(fmt, x.shape[-1]) - x.shape[-1]
    return mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)]) if extra else x


def _chained(launch, q0, kb, vb, layers: int):
    """``f(length)``: what TQCache runs each decode step over ``layers`` layers — one prepared launch
    per layer, the length a parameter, each layer's output the next one's q."""
    def run(length):
        q = q0[:, :, 0]
        for i in range(layers):
            q = launch(q, kb[i], vb[i], length)
        return q
    return run


def _variant_rounds(mx, bench, ctx, row, q0, kb, vb, kf, vf, backend, sdpa, checked, measure_device, profiling):
    """``--variants``: the cache path under each setting, then fp16 SDPA, in each of the rounds, a new
    length every evaluation; each variant's plan and launch are made with its decode options.
    ``row["variants"]``: every measurement; ``row["variant_summary"]``: per variant the median wall
    time and the median of its same-round ratio to fp16 SDPA."""
    from .kernel import prepare_decode

    nl = bench.layers
    lengths = list(range(ctx - bench.repeats - 2, ctx - 1))
    runs = row["variants"] = []
    for rnd in range(bench.variant_rounds):
        for i, opts in enumerate(bench.variant_list):
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
    for i, opts in enumerate(bench.variant_list):
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

