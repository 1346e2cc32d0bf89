"""tqbridge.metal.lm: the mlx-lm integration of the block cache (needs the ``lm`` extra: mlx-lm).

Modules::

    cache         TQCache (mlx-lm's cache protocol over K/V blocks of any format pair), BatchTQCache, make_cache
    decoder       LayerDecoder: a layer's blocks and decode step (append, fused attention), held by TQCache
    codecs        rows <-> blocks: the codec path per format, padded_dim, rotation_group
    report        cache_report, paths_line: what each layer holds and which paths ran
    routing       route_attention(): decode steps of TQCache layers to the fused kernel, prefill to SDPA
    calibration   opt-in per-channel key calibration (KeyCalibration)
    prompt_cache  load_prompt_cache(): saved prompt caches (TQCache layers included), checked before loading
    serve         `tqbridge serve`: mlx-lm's OpenAI-compatible server with TQCache layers
    decode_bench  `tqbridge bench decode`: end-to-end decode against mlx-lm's own caches
    serve_bench   `tqbridge bench serve`: batched decode through mlx-lm's BatchGenerator

The names below are imported on first use, so importing the package (or ``calibration``) does not
import mlx-lm. The K/V spelling names (``parse_kv``, ``parse_kv_spec``, ``kv_name``, the per-layer
``LayeredKV``, ``parse_layered_kv_spec``, ``layered_kv_name``) are the grammar's,
:mod:`tqbridge.bridge.blocks.kv_spec`.
"""

from __future__ import annotations

import importlib

_GRAMMAR = "tqbridge.bridge.blocks.kv_spec"
_EXPORTS = {
    "TQCache": ".cache", "make_cache": ".cache", "cache_report": ".report", "route_attention": ".routing",
    "KeyCalibration": ".calibration", "CalibrationError": ".calibration",
    **{name: _GRAMMAR for name in ("parse_kv", "parse_kv_spec", "kv_name", "LayeredKV", "parse_layered_kv_spec",
                                   "layered_kv_name")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
