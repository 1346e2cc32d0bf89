"""Attention routing for :class:`~tqbridge.metal.lm.cache.TQCache` layers, without editing mlx-lm.

mlx-lm's model modules import ``scaled_dot_product_attention`` from ``mlx_lm.models.base`` by name.
:func:`route_attention` swaps that name, in every loaded ``mlx_lm.models`` module, for an adapter that
sends TQCache layers (and their batches, BatchTQCache) to their ``attend`` (the layer's decode step: the
fused kernel over its blocks) and everything else to mlx-lm's original; it restores the
names on exit. Under the routing a TQCache's ``update_and_fetch`` stores the rows and returns them as
given; the cache's ``attend`` reads the cache.

Paths (recorded per cache in ``cache.paths``):

- ``decode:<backend>`` — one query row: the fused kernel on the K/V blocks (``<backend>``: ``cuda``,
  ``metal``, ``cpu-emulator``, or ``reference`` for decode_attention's MLX-ops reference).
- ``prefill:dequant-sdpa`` (and ``decode:dequant-sdpa`` when the kernel refuses a shape, or in mode
  ``sdpa``) — dequantize the blocks, then ``mx.fast.scaled_dot_product_attention``.

Key calibration: the kernel reads the calibrated blocks, so the query is scaled by the key scales (by
the fused kernel's pass 1 as it loads q); the dequantize path gets keys with the calibration undone.
Decode with attention sinks and a key mean takes the dequantize path (the reason kept in
``cache.decode_fallback``).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar

from .cache import DECODE_MODES, BatchTQCache, TQCache
from ..attention.decoder import routed_block

__all__ = ["route_attention", "DECODE_MODES"]

_lock = threading.Lock()
_saved: dict = {}              # mlx-lm module name -> (module, the attention entry point it had)
_installs = 0                  # route_attention blocks open in the process
_MODE: "ContextVar[str]" = ContextVar("tqbridge_decode_mode", default="auto")   # the innermost block's mode


def _routed(original):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, (TQCache, BatchTQCache)):
            return cache.attend(queries, scale=scale, mask=mask, sinks=sinks, mode=_MODE.get())
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.__wrapped__ = original
    return scaled_dot_product_attention


@contextmanager
def route_attention(mode: str = "auto"):
    """Route attention of TQCache layers while the block runs (re-entrant; restores on exit).

    ``mode`` (decode steps): ``auto`` (the fused kernel on a GPU; on CPU decode_attention's ops
    reference), ``kernel`` (always the fused kernel; an error if it cannot run), ``reference``
    (decode_attention's ops reference) or ``sdpa`` (dequantize + ``mx.fast.scaled_dot_product_attention``,
    as prefill).
    """
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, got {mode!r}")
    from mlx_lm.models import base

    global _installs
    with _lock:    # mlx-lm's module names are process-wide: patched by the first block, restored by the last
        if _installs == 0:
            original = base.scaled_dot_product_attention
            routed = _routed(original)
            for name, mod in list(sys.modules.items()):
                if (name.startswith("mlx_lm.models.") or name == "mlx_lm.models") and mod is not None \
                        and getattr(mod, "scaled_dot_product_attention", None) is original:
                    _saved[name] = (mod, original)
                    mod.scaled_dot_product_attention = routed
        _installs += 1
    token = _MODE.set(mode)
    try:
        with routed_block():    # TQCache's decode step: the routed attention follows (this thread)
            yield
    finally:
        _MODE.reset(token)
        with _lock:
            _installs -= 1
            if _installs == 0:
                for mod, original in _saved.values():
                    mod.scaled_dot_product_attention = original
                _saved.clear()
