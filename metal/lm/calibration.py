"""Per-channel key calibration for :class:`~tqbridge.metal.lm.cache.TQCache` (opt-in).

Keys of real models have a few channels with large, nearly constant offsets and channels of very
different magnitudes; a block format spends its scale on them. Two exact transforms help:

- ``mean``: store ``k - mu`` (``mu`` per KV head and channel). Attention scores change by ``q.mu``,
  the same for every key of a query row, so softmax is unchanged (not so with attention sinks: their
  logit would need the same shift, so decode with sinks takes the dequantize path, which adds ``mu``
  back). Fetched keys always have ``mu`` added back.
- ``scale``: store ``k / s`` and attend with ``q * s``: ``(q*s).(k/s) = q.k``. ``s`` per KV head and
  channel is ``(rms_c / mean_c rms_c) ** alpha`` of the calibration keys (``alpha`` = 0.5 unless
  written ``scale=A``), the shape of the fork's CUDA "InnerQ" equalization (per-channel RMS ratio to
  a power; TheTom/llama-cpp-turboquant, ggml-cuda/turbo-quant.cuh), kept per layer and head here.
- ``qscale``: the same with ``rms_c`` replaced by ``rms(k_c) / rms(q_c)``, the queries of the first
  chunk pooled over the query heads of each KV head. The score error ``sum_c q_c s_c e_c`` of a
  block format with roughly equal error per stored channel is smallest at ``s_c^2 ~ |k_c| / |q_c|``
  (Cauchy-Schwarz), so ``alpha`` = 0.5 is that choice. The queries are seen by the attention
  routing (:mod:`tqbridge.metal.lm.routing`), so the first chunk's keys wait there, unquantized, until
  its queries arrive; without the routing the key statistics alone are used (and the cache says so).

Statistics come from the first keys a cache sees (the first prefill chunk), then are frozen: rows
already written cannot be re-quantized. ``basis``: the statistics are taken on the keys as the model
produced them (``original``, before the llama.cpp-style Hadamard rotation) or after it (``rotated``).

Spelling: tools are appended to the K format with ``+``: ``q5_1+mean+scale``,
``q5_1+mean+scale=0.75+rotated`` (:class:`KeyCalibration` and its parsing live with the rest of the
K/V grammar in :mod:`tqbridge.bridge.blocks.kv_spec`).
"""

from __future__ import annotations

import mlx.core as mx
from tqbridge.bridge.blocks.kv_spec import BASES, DEFAULT_ALPHA, CalibrationError, KeyCalibration

__all__ = ["KeyCalibration", "CalibrationError", "fit", "BASES", "DEFAULT_ALPHA"]

# A channel whose RMS is this far below the largest is treated as this small: keeps s finite.
_RMS_FLOOR = 1e-6


def _rms(x: mx.array) -> mx.array:
    """Per-channel RMS over batch and positions, floored relative to the largest channel."""
    r = mx.sqrt(mx.mean(x * x, axis=(0, 2)))
    return mx.maximum(r, _RMS_FLOOR * mx.max(r, axis=-1, keepdims=True) + 1e-30)


def fit(keys: mx.array, cal: KeyCalibration, queries: "mx.array | None" = None
        ) -> tuple["mx.array | None", "mx.array | None"]:
    """``(mu, s)``, each float32 ``(n_kv_heads, head_dim)`` or None, from keys ``(B, H, S, D)``
    (and, for ``qscale``, queries ``(B, Hq, S', D)`` in the same basis; None: keys only)."""
    x = keys.astype(mx.float32)
    mu = mx.mean(x, axis=(0, 2)) if cal.mean else None
    s = None
    if cal.scale:
        r = _rms(x - mu[None, :, None, :] if mu is not None else x)     # (H, D)
        if cal.queries and queries is not None:
            B, Hq, S, D = queries.shape
            H = x.shape[1]
            if Hq % H:
                raise CalibrationError(f"{Hq} query heads do not group onto {H} KV heads")
            qg = queries.astype(mx.float32).reshape(B, H, Hq // H, S, D).transpose(0, 1, 3, 2, 4)
            r = r / _rms(qg.reshape(B, H, S * (Hq // H), D))
        s = (r / mx.mean(r, axis=-1, keepdims=True)) ** float(cal.alpha)
    if mu is not None:
        mx.eval(mu)
    if s is not None:
        mx.eval(s)
    return mu, s
