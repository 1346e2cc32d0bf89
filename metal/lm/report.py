"""What a prompt cache of :class:`~tqbridge.metal.lm.cache.TQCache` layers (or a batch's
:class:`~tqbridge.metal.lm.cache.BatchTQCache` layers) holds and which paths ran:
:func:`cache_report` (a dict, for JSON reports) and :func:`paths_line` (one line, for the CLI).
"""

from __future__ import annotations

from collections import Counter

from .cache import BatchTQCache, TQCache

__all__ = ["cache_report", "paths_line"]

_KERNEL_INFO = ("backend", "kernel", "q_precision", "v_decode", "chunks", "stages", "dyn_smem", "warps", "tile",
                "dispatches", "splits", "compiled", "fused_append", "fold_append", "fold_refused", "device_params",
                "device_consts")


def _kernel_info(launch) -> "dict | None":
    """What a layer's prepared decode attention runs (its plan: backend, kernel, q precision, V decode,
    int8-mma's chunks / stages / dynamic memory, SIMD groups and tile, dispatches, splits, whether under
    mx.compile, whether the step's append runs in its call and, there, inside pass 1 (or why not), whether its
    per-step ints are device views and its constants device copies), None
    before the layer's first decode step on a kernel lane."""
    info = getattr(launch, "run_info", None)
    if not info:
        return None
    info = {**info, "fused_append": getattr(launch, "fuses_append", None)}   # the cache's step, not the plan
    return {k: info[k] for k in _KERNEL_INFO if info.get(k) is not None}


def _kernel_words(info: dict) -> str:
    words = [info["backend"]] + ([info["kernel"]] if "kernel" in info else [])
    if "q_precision" in info:
        words.append(f"{info['q_precision']} q")
    if info.get("v_decode"):
        words.append(f"V {info['v_decode']}")
    if info.get("chunks"):   # kernel int8-mma's variant: 16-key chunks per online-softmax step, copy-ring depth
        words.append(f"{info['chunks']} chunk{'s' if info['chunks'] != 1 else ''}")
    if info.get("stages"):
        words.append(f"{info['stages']} stages")
    if "dispatches" in info:
        words.append(f"{info['dispatches']} dispatch{'es' if info['dispatches'] != 1 else ''}")
    if info.get("compiled"):
        words.append("compiled")
    if info.get("fused_append"):
        words.append("append fused into pass 1" if info.get("fold_append") else "append fused")
    if info.get("fold_refused"):
        words.append(f"(not into pass 1: {info['fold_refused']})")
    if info.get("device_params"):
        words.append("device params")
    if info.get("device_consts"):
        words.append("device consts")
    return " ".join(words)


def cache_report(cache: list) -> dict:
    """What each layer holds and which paths ran: for reports and the CLI."""
    layers = []
    paths: Counter = Counter()
    for i, c in enumerate(cache):
        if isinstance(c, TQCache):
            layers.append({"layer": i, "kind": "tqbridge", "kv": f"{c.k_format}/{c.v_format}",
                           "window": c.window, "codecs": dict(c.codec_paths),
                           "rotation": [c.k_rot, c.v_rot],
                           "k_calibration": c.calibration.spec or None,
                           "calibration_note": c.calibration_note,
                           "decode_fallback": c.decode_fallback,
                           "decode_kernel": _kernel_info(c.decoder.launch)})
            paths.update(c.paths)
        elif isinstance(c, BatchTQCache):   # a batch's layer: its template holds the configuration and paths
            t = c.template
            layers.append({"layer": i, "kind": "tqbridge-batch", "kv": f"{t.k_format}/{t.v_format}",
                           "window": t.window, "batch": int(c.offset.shape[0]), "codecs": dict(t.codec_paths),
                           "decode_fallback": t.decode_fallback,
                           "decode_kernel": _kernel_info(c.launch)})
            paths.update(t.paths)
        else:
            layers.append({"layer": i, "kind": type(c).__name__, "kv": "float",
                           "window": getattr(c, "max_size", None)})
    kinds = Counter(l["kind"] for l in layers)
    return {"layers": layers, "layer_kinds": dict(kinds), "paths": dict(paths),
            "nbytes": sum(c.nbytes for c in cache if not c.empty()),
            "used_nbytes": sum(getattr(c, "used_nbytes", c.nbytes if not c.empty() else 0)
                               for c in cache)}


def paths_line(cache: list) -> str:
    """One line: which attention paths and append codecs ran, and why any layer fell back."""
    rep = cache_report(cache)
    paths = ", ".join(f"{k} x{v}" for k, v in sorted(rep["paths"].items()) if k != "append") or "none yet"
    codecs = sorted({f"{l['codecs']['k_append']}/{l['codecs']['v_append']}" for l in rep["layers"]
                     if l.get("codecs")})
    falls = sorted({f"layer {l['layer']}: {l['decode_fallback']}" for l in rep["layers"] if l.get("decode_fallback")})
    notes = sorted({l["codecs"]["append_note"] for l in rep["layers"] if l.get("codecs", {}).get("append_note")})
    out = f"paths: {paths}; appends: {', '.join(codecs) or '-'}"
    kernels = sorted({_kernel_words(l["decode_kernel"]) for l in rep["layers"] if l.get("decode_kernel")})
    if kernels:
        out += "; decode kernels: " + ", ".join(kernels)
    if falls or notes:
        out += "; FALLBACK: " + "; ".join(falls[:3] + notes[:2]) + (" ..." if len(falls) > 3 else "")
    return out
