"""KV-cache quality: KL divergence of next-token distributions vs the f16 cache, and bytes per token.

Every configuration (a K/V format pair) reads the same tokens in the same fixed chunks; the
reference is the same model with an ``f16/f16`` :class:`~tqbridge.metal.lm.cache.TQCache`. Per
position: ``KL(P_f16 || P_kv)`` of the softmax of the logits (natural log, nats) and whether the top-1
tokens agree. Bytes per token are measured from the live cache arrays after the last chunk (the
valid rows of every layer's K and V arrays, divided by the number of tokens; sliding-window layers
hold only their window), bits per value from the same bytes over the values they hold.

All configurations advance chunk by chunk in lockstep, so only one chunk of logits per
configuration is alive at a time (vocabularies of 262k entries make whole-text logits too large).

``q_precision`` ("exact" or "int8"; None keeps the backend's default) is set on the caches of the
configurations under test, for decode steps (query rows of one position: ``chunk=1`` scores every
position through them); the f16 reference keeps q exact. Each row names the decode path with the q
precision that ran there (``decode_q``, e.g. ``{"decode:reference q=int8": 1920}``), counted at the
calls themselves, not taken from the setting.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Sequence

import mlx.core as mx
import numpy as np

from tqbridge.bridge.evaluation_text import evaluation_text
from tqbridge.bridge.blocks.registry import get_format
# the tokenizer generate and quality share; its home is bridge/gguf/tokenizer.py, next to the GGUF code
from tqbridge.bridge.gguf.tokenizer import ChatTokenizer as GGUFTokenizer

__all__ = ["REFERENCE_KV", "default_text", "evaluate", "to_markdown", "plot", "GGUFTokenizer"]

REFERENCE_KV = "f16/f16"
Q_PRECISIONS = ("exact", "int8")


def default_text() -> str:
    """The fixed evaluation text (:mod:`tqbridge.bridge.evaluation_text`: the stdlib's
    ``pydoc_data.topics`` help texts, joined in sorted topic order)."""
    return evaluation_text()[0]


def _log_softmax(x: mx.array) -> mx.array:
    x = x.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def _cache_bytes(cache: list) -> tuple[int, int]:
    """(bytes, values) held by the valid rows of every layer's live K and V arrays.

    Sliding-window layers hold only their window, so bytes per token at a given context is
    ``bytes / tokens`` while bits per value is ``8 * bytes / values``.
    """
    total = 0
    values = 0
    for c in cache:
        if isinstance(getattr(c, "used_nbytes", None), int):
            total += c.used_nbytes
            if c.k_dim:
                b, h = c.keys.shape[:2]
                values += b * h * (c.offset - c.start) * (c.k_dim + c.v_dim)
        elif not c.empty():   # a float cache kept by mlx-lm (e.g. a rotating window)
            k, v = c.state[0], c.state[1]
            rows = min(c.offset, k.shape[2])
            total += (k.nbytes + v.nbytes) * rows // k.shape[2]
            values += k.shape[0] * k.shape[1] * rows * (k.shape[3] + v.shape[3])
    return total, values


def _int8_k_formats() -> tuple:
    """K formats whose decode attention can take q as int8 (kernel int8-mma's, as llama.cpp's vec_dot)."""
    try:
        from tqbridge.metal.attention.plan import INT8_MMA_K_FORMATS
    except ImportError:  # pragma: no cover - an install without the kernel
        return ()
    return tuple(INT8_MMA_K_FORMATS)


@contextmanager
def _count_decode_q(tally: dict, current: list):
    """Count the decode attention calls made while the block runs, by ``decode:<backend> q=<precision>``,
    into ``tally[current[0]]``: the precision the call ran with (the kernel's own record; the
    reference path's argument, whose default is exact)."""
    from tqbridge.metal import attention
    from tqbridge.metal.decode_options import as_options

    original = attention.decode_attention

    def counted(*args, **kwargs):
        out = original(*args, **kwargs)
        run = attention.last_run()
        backend = run.get("backend") or "kernel"
        if backend == "reference":   # the precision asked for, as an argument or in the decode options
            qp = as_options(kwargs.get("options"), kwargs.get("q_precision")).q_precision or "exact"
        else:
            qp = run.get("q_precision") or "exact"
        if current[0] is not None:
            tally[current[0]][f"decode:{backend} q={qp}"] += 1
        return out

    attention.decode_attention = counted
    try:
        yield
    finally:
        attention.decode_attention = original


def _decode_q_paths(cache: list, counted: Counter) -> dict:
    """Decode steps per ``decode:<backend> q=<precision>``: the counted calls, plus the steps a GPU
    ran through a layer's prepared launch (which bypasses ``decode_attention``), labelled with that
    launch's precision."""
    out = Counter(counted)
    steps: Counter = Counter()
    launch_q = set()
    for c in cache:
        for path, n in getattr(c, "paths", {}).items():
            if path.startswith("decode:") and path != "decode:dequant-sdpa":
                steps[path] += n
        launch = getattr(getattr(c, "decoder", None), "launch", None)
        if launch is not None and getattr(launch, "plan", None) is not None:
            launch_q.add(launch.plan.q_precision)
    label = next(iter(launch_q)) if len(launch_q) == 1 else ("mixed" if launch_q else "unknown")
    for path, n in steps.items():
        rest = n - sum(v for k, v in counted.items() if k.split(" q=")[0] == path)
        if rest > 0:
            out[f"{path} q={label}"] += rest
    return dict(sorted(out.items()))


def evaluate(model: Any, tokens: Sequence[int], kvs: Iterable[str], *, chunk: int = 256,
             sliding: str = "quantize", rotation: str = "llama",
             progress: "Callable[[int], None] | None" = None,
             decode_mode: str = "auto", q_precision: "str | None" = None) -> list[dict]:
    """Quality of each K/V configuration in ``kvs`` against the f16 cache on ``tokens``.

    A configuration may carry key calibration on its K side (``q5_1+mean+scale/q4_0``, see
    :mod:`tqbridge.metal.lm.calibration`); its arrays count in the bytes. It may give layers their own
    pairs (``q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]``, :func:`~tqbridge.bridge.blocks.kv_spec.parse_layered_kv_spec`):
    its row's k_format / v_format / k_calibration are the default pair's and ``layer_kv`` maps each
    configuration to the layers holding it (None for one pair everywhere).
    Returns one dict per configuration, the reference (``f16/f16``) first: kv, kl_mean, kl_max,
    top1, bytes_per_token, bits_per_value, compression_vs_f16, positions, paths, layers.
    ``progress(n)`` is called after each chunk with the number of positions done.
    ``q_precision``: decode attention's q precision for the configurations under test (see the
    module's docstring); a K format with no int8 path keeps the backend's default, and its row says so.
    """
    from tqbridge.bridge.blocks.kv_spec import parse_layered_kv_spec
    from tqbridge.metal.lm.cache import make_layered_cache
    from tqbridge.metal.lm.report import cache_report, paths_line
    from tqbridge.metal.lm.routing import route_attention

    if chunk <= 0:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    tokens = [int(t) for t in tokens]
    if len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to score next-token distributions, got {len(tokens)}")
    if q_precision is not None and q_precision not in Q_PRECISIONS:
        raise ValueError(f"q_precision must be one of {', '.join(Q_PRECISIONS)} or None, got {q_precision!r}")
    specs = {REFERENCE_KV: parse_layered_kv_spec(REFERENCE_KV)}
    for s in kvs:
        kv = parse_layered_kv_spec(s)
        specs.setdefault(kv.name, kv)
    names = list(specs)
    caches = {n: make_layered_cache(model, specs[n], sliding=sliding, rotation=rotation) for n in names}
    q_set = {n: None for n in names}
    q_note = {n: None for n in names}
    if q_precision is not None:
        int8_k = _int8_k_formats()
        for n in names[1:]:   # the f16 reference keeps q exact
            no_int8 = sorted({k for k, _, _ in _pairs_of(specs[n]) if get_format(k).name not in int8_k})
            if q_precision == "int8" and no_int8:
                q_note[n] = (f"{', '.join(no_int8)} K has no int8 q path (K types with one: {', '.join(int8_k)}): "
                             "q kept at the backend's default")
                continue
            q_set[n] = q_precision
            for c in caches[n]:
                if hasattr(c, "q_precision"):   # every TQCache layer (not mlx-lm's float window caches)
                    c.q_precision = q_precision
    stats = {n: {"kl_sum": 0.0, "kl_max": 0.0, "agree": 0, "n": 0, "seconds": 0.0} for n in names}
    tally = {n: Counter() for n in names}
    current: list = [None]
    ids = mx.array(tokens)[None]
    with route_attention(decode_mode), _count_decode_q(tally, current):
        for start in range(0, len(tokens), chunk):
            x = ids[:, start:start + chunk]
            ref = None
            for n in names:
                current[0] = n
                t0 = time.perf_counter()
                logp = _log_softmax(model(x, cache=caches[n])[0])
                mx.eval(logp)
                stats[n]["seconds"] += time.perf_counter() - t0
                if ref is None:
                    ref = logp
                    ref_p = mx.exp(ref)
                    ref_top = mx.argmax(ref, axis=-1)
                kl = mx.sum(ref_p * (ref - logp), axis=-1)
                agree = mx.sum(mx.argmax(logp, axis=-1) == ref_top)
                mx.eval(kl, agree)
                s = stats[n]
                s["kl_sum"] += float(mx.sum(kl).item())
                s["kl_max"] = max(s["kl_max"], float(mx.max(kl).item()))
                s["agree"] += int(agree.item())
                s["n"] += kl.shape[0]
            if progress is not None:
                progress(min(len(tokens), start + chunk))
    for cache in caches.values():   # decode steps record NaN/inf on the device: read once, here
        for c in cache:
            if hasattr(c, "check_finite"):
                c.check_finite()
    rows = []
    f16_bpt = None
    for n in names:
        s = stats[n]
        rep = cache_report(caches[n])
        nbytes, values = _cache_bytes(caches[n])
        bpt = nbytes / len(tokens)
        if f16_bpt is None:
            f16_bpt = bpt
        rows.append({
            "kv": n,
            "k_format": specs[n].default[0],
            "v_format": specs[n].default[1],
            "k_calibration": specs[n].default[2].spec or None,
            "layer_kv": _layer_kv(rep) if specs[n].groups else None,
            "q_precision": q_set[n] or "default",
            "q_precision_note": q_note[n],
            "decode_q": _decode_q_paths(caches[n], tally[n]),
            "kl_mean": s["kl_sum"] / s["n"],
            "kl_max": s["kl_max"],
            "top1": s["agree"] / s["n"],
            "bytes_per_token": bpt,
            "bits_per_value": nbytes * 8 / values if values else None,
            "compression_vs_f16": f16_bpt / bpt if bpt else None,
            "positions": s["n"],
            "seconds": round(s["seconds"], 3),
            "paths": rep["paths"],
            "layers": rep["layer_kinds"],
            "decode_fallback": sorted({l["decode_fallback"] for l in rep["layers"]
                                       if l.get("decode_fallback")}),
            "paths_line": paths_line(caches[n]) if rep["layers"] and "codecs" in rep["layers"][0] else "",
        })
    return rows


def _pairs_of(kv) -> list:
    """The default pair of a LayeredKV and the pair of each of its groups."""
    return [kv.default, *(pair for _, pair in kv.groups)]


def _layer_kv(rep: dict) -> dict:
    """Per-layer configurations: ``{"q8_0/q8_0": [0, 1, 28, 29], ...}`` from a cache report (the pair
    and key calibration each layer holds)."""
    out: dict = {}
    for layer in rep["layers"]:
        name = layer["kv"] + (f" +{layer['k_calibration']}" if layer.get("k_calibration") else "")
        out.setdefault(name, []).append(layer["layer"])
    return out


def environment() -> dict:
    """Versions and machine, recorded with every report."""
    import mlx_lm

    from importlib.metadata import PackageNotFoundError, version

    try:
        tq = version("tqbridge")
    except PackageNotFoundError:  # pragma: no cover
        tq = "unknown"
    from tqbridge.bridge.mlx_blas import blas_in_use

    return {"tqbridge": tq, "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "blas": blas_in_use(),
            "python": sys.version.split()[0], "machine": platform.machine(),
            "device": str(mx.default_device())}


def _decode_cell(r: dict) -> str:
    """The decode paths of a row with the q precision each ran with: ``reference q=int8 x1920``."""
    dq = r.get("decode_q") or {}
    return ", ".join(f"{k.removeprefix('decode:')} x{v}" for k, v in dq.items()) or "-"


def to_markdown(rows: list[dict], title: str = "") -> str:
    """A table of the rows; a "decode path (q)" column when any row ran decode steps."""
    decode = any(r.get("decode_q") for r in rows)
    head = "| K / V | KL mean | KL max | top-1 | bytes/token | bits/value | vs f16 |"
    sep = "|---|---|---|---|---|---|---|"
    if decode:
        head, sep = head + " decode path (q) |", sep + "---|"
    out = [f"### {title}", ""] if title else []
    out += [head, sep]
    for r in rows:
        bits = "-" if r["bits_per_value"] is None else f"{r['bits_per_value']:.3f}"
        comp = "-" if r["compression_vs_f16"] is None else f"{r['compression_vs_f16']:.2f}x"
        line = (f"| {r['kv']} | {r['kl_mean']:.3g} | {r['kl_max']:.3g} | {100 * r['top1']:.1f}% "
                f"| {r['bytes_per_token']:.0f} | {bits} | {comp} |")
        if decode:
            line += f" {_decode_cell(r)} |"
        out.append(line)
    notes = sorted({f"{r['kv']}: {r['q_precision_note']}" for r in rows if r.get("q_precision_note")})
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str, title: str = "") -> None:
    """KL mean vs bits per value (log y), one labelled point per configuration (f16 omitted: KL 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if r["kv"] == REFERENCE_KV or r["bits_per_value"] is None:
            continue
        kl = max(r["kl_mean"], 1e-12)
        ax.scatter([r["bits_per_value"]], [kl], s=24)
        ax.annotate(r["kv"], (r["bits_per_value"], kl), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("cache bits per value (measured from live arrays)")
    ax.set_ylabel("mean KL vs f16 cache (nats)")
    ax.set_title(title or "KV cache quality", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    from tqbridge.bridge.atomic import atomic_output

    try:
        with atomic_output(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    finally:
        plt.close(fig)


def is_finite_row(r: dict) -> bool:
    return all(math.isfinite(r[k]) for k in ("kl_mean", "kl_max", "top1", "bytes_per_token"))


def measure_memory(model: Any, prompt: Sequence[int], kvs: Iterable[str], *, new_tokens: int = 16,
                   chunk: int = 512, baselines: bool = True) -> list[dict]:
    """Cache bytes and peak memory of prefill + greedy decode at a long context, per cache kind.

    For each configuration (mlx-lm's float ``KVCache`` and 8-bit ``QuantizedKVCache`` first when
    ``baselines``, then each K/V pair as a TQCache) it feeds ``prompt`` in chunks, then decodes
    ``new_tokens`` tokens. Memory is MLX's own accounting (``mx.get_active_memory`` /
    ``mx.get_peak_memory``), measured relative to the memory in use before the cache existed.
    """
    import gc

    from mlx_lm.models import cache as mlx_cache

    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.bridge.blocks.kv_spec import parse_kv
    from tqbridge.metal.lm.report import cache_report
    from tqbridge.metal.lm.routing import route_attention

    names = (["mlx-lm KVCache", "mlx-lm QuantizedKVCache 8-bit"] if baselines else [])
    names += [f"{k}/{v}" for k, v in (parse_kv(s) for s in kvs)]
    ids = mx.array([int(t) for t in prompt])[None]
    rows = []
    for name in names:
        gc.collect()
        mx.clear_cache()
        base = mx.get_active_memory()
        if name == "mlx-lm KVCache":
            cache = mlx_cache.make_prompt_cache(model)
        elif name.startswith("mlx-lm QuantizedKVCache"):
            cache = [mlx_cache.QuantizedKVCache(group_size=64, bits=8) for _ in mlx_cache.make_prompt_cache(model)]
        else:
            cache = make_cache(model, *parse_kv(name))
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        with route_attention():
            for s in range(0, ids.shape[1] - 1, chunk):
                model(ids[:, s:min(s + chunk, ids.shape[1] - 1)], cache=cache)
                mx.eval([a for c in cache for a in _arrays(c)])
            prefill_peak = mx.get_peak_memory() - base
            after_prefill = mx.get_active_memory() - base
            t1 = time.perf_counter()
            mx.reset_peak_memory()
            y = ids[:, -1:]
            for _ in range(new_tokens):
                y = mx.argmax(model(y, cache=cache)[:, -1, :], axis=-1).reshape(1, 1)
                mx.eval(y)
            decode_peak = mx.get_peak_memory() - base
            t2 = time.perf_counter()
        cache_nbytes = sum(a.nbytes for c in cache for a in _arrays(c))
        rep = cache_report(cache) if any(hasattr(c, "k_format") for c in cache) else {"paths": {}}
        rows.append({"cache": name, "context": int(ids.shape[1]) + new_tokens - 1,
                     "cache_nbytes": cache_nbytes, "active_after_prefill": after_prefill,
                     "prefill_peak": prefill_peak, "decode_peak": decode_peak,
                     "prefill_s": round(t1 - t0, 2), "decode_tok_s": round(new_tokens / (t2 - t1), 2),
                     "paths": rep["paths"]})
        del cache
    return rows


def _arrays(c) -> list:
    """The live arrays of one layer's cache (any mlx-lm cache kind or a TQCache)."""
    out = []
    for name in ("keys", "values"):
        a = getattr(c, name, None)
        if isinstance(a, mx.array):
            out.append(a)
        elif isinstance(a, (tuple, list)):
            out.extend(x for x in a if isinstance(x, mx.array))
    return out
