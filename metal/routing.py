"""Attention routing for :class:`~tqbridge.metal.cache.TQCache` layers, without editing mlx-lm.

mlx-lm's model modules import ``scaled_dot_product_attention`` from ``mlx_lm.models.base`` by name.
:func:`route_attention` swaps that name, in every loaded ``mlx_lm.models`` module, for a function that
sends TQCache layers to :func:`attend` and everything else to mlx-lm's original; it restores the names
on exit.

Paths (recorded per cache in ``cache.paths``):

- ``decode:<backend>`` — one query row: ``tqbridge.metal.decode_attention`` on the K/V blocks
  (``<backend>`` as its dispatcher reports it: ``cuda``, ``metal``, ``cpu-emulator`` ...).
- ``decode:reference`` / ``prefill:reference`` — dequantize the blocks, then
  ``mx.fast.scaled_dot_product_attention``. Prefill attends to the *quantized* rows of the chunk
  itself too (as llama.cpp does: it writes the cache, then reads it), so results do not depend on
  how a prompt is chunked and every position sees the cache decode would see.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

import mlx.core as mx

from .cache import TQCache

__all__ = ["route_attention", "attend", "decode_kernel", "DECODE_MODES"]

DECODE_MODES = ("auto", "kernel", "reference")
_lock = threading.Lock()
_depth = 0
_saved: dict = {}
_mode = "auto"


def decode_kernel():
    """``tqbridge.metal.decode_attention`` when it is installed, else None."""
    try:
        from tqbridge.metal.attention import decode_attention
    except ImportError:
        return None
    return decode_attention


def _kernel_backend() -> str:
    try:
        from tqbridge.metal.attention import last_backend

        return last_backend() or "kernel"
    except ImportError:  # pragma: no cover
        return "kernel"


def _auto_uses_kernel() -> bool:
    # On a GPU the fused kernel; on CPU the ops reference unless asked otherwise
    # (TQBRIDGE_CPU_DECODE=kernel runs the kernel's CPU emulator instead).
    if mx.default_device() == mx.gpu:
        return True
    return os.environ.get("TQBRIDGE_CPU_DECODE", "reference") == "kernel"


def _kernel_decode(cache: TQCache, q: mx.array, scale: float, sinks=None):
    kernel = decode_kernel()
    if kernel is None or cache.decode_fallback:
        return None
    start = max(0, cache.offset - cache.window) if cache.window else 0
    kb, vb = cache.blocks(start)
    B, Hq, _, D = q.shape
    qd = q.reshape(B, Hq, D)
    try:
        out = kernel(qd, kb, vb, k_format=cache.k_format, v_format=cache.v_format,
                     length=cache.offset - start, scale=scale, sinks=sinks)
    except Exception as e:  # a format or shape the kernel does not take: say so once, then fall back
        cache.decode_fallback = f"{type(e).__name__}: {e}"
        return None
    out = mx.array(out) if not isinstance(out, mx.array) else out
    if out.shape[-1] != cache.v_dim:
        out = out[..., :cache.v_dim]
    return out.reshape(B, Hq, 1, cache.v_dim).astype(q.dtype)


def attend(cache: TQCache, queries, keys, values, *, scale: float, mask=None, sinks=None,
           mode: str = "auto"):
    """Attention for one TQCache layer; records the path in ``cache.paths``."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, got {mode!r}")
    decode = queries.shape[2] == 1
    if decode and (mode == "kernel" or (mode == "auto" and _auto_uses_kernel())):
        out = _kernel_decode(cache, queries, scale, sinks)
        if out is not None:
            cache.paths[f"decode:{_kernel_backend()}"] += 1
            return out
        if mode == "kernel":
            why = cache.decode_fallback or "tqbridge.metal.decode_attention is not installed"
            raise RuntimeError(f"decode mode 'kernel' asked for, but the kernel cannot run: {why}")
    cache.paths["decode:reference" if decode else "prefill:reference"] += 1
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask,
                                                sinks=sinks)


def _routed(original):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, TQCache):
            return attend(cache, queries, keys, values, scale=scale, mask=mask, sinks=sinks,
                          mode=_mode)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.__wrapped__ = original
    return scaled_dot_product_attention


@contextmanager
def route_attention(mode: str = "auto"):
    """Route attention of TQCache layers while the block runs (re-entrant; restores on exit).

    ``mode``: ``auto`` (kernel on a GPU, ops reference on CPU unless ``TQBRIDGE_CPU_DECODE=kernel``),
    ``kernel`` (always the fused kernel; an error if it is not installed) or ``reference``.
    """
    global _depth, _mode
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, got {mode!r}")
    from mlx_lm.models import base

    original = base.scaled_dot_product_attention
    with _lock:
        prev_mode = _mode
        _mode = mode
        if _depth == 0:
            routed = _routed(original)
            for name, mod in list(sys.modules.items()):
                if (name.startswith("mlx_lm.models.") or name == "mlx_lm.models") and mod is not None \
                        and getattr(mod, "scaled_dot_product_attention", None) is original:
                    _saved[name] = mod
                    mod.scaled_dot_product_attention = routed
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            _mode = prev_mode
            if _depth == 0:
                for mod in _saved.values():
                    mod.scaled_dot_product_attention = original
                _saved.clear()
