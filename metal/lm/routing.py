"""Attention routing for :class:`~tqbridge.metal.lm.cache.TQCache` layers, without editing mlx-lm.

mlx-lm's model modules import ``scaled_dot_product_attention`` from ``mlx_lm.models.base`` by name.
:func:`route_attention` swaps that name, in every loaded ``mlx_lm.models`` module, for a function that
sends TQCache layers to :func:`attend` and everything else to mlx-lm's original; it restores the names
on exit.

Paths (recorded per cache in ``cache.paths``):

- ``decode:<backend>`` — one query row: ``tqbridge.metal.decode_attention`` on the K/V blocks
  (``<backend>`` as its dispatcher reports it: ``cuda``, ``metal``, ``cpu-emulator``, ``reference``).
- ``prefill:dequant-sdpa`` (and ``decode:dequant-sdpa`` when decode_attention is absent or refuses
  a shape, or in mode ``sdpa``) — dequantize the blocks, then
  ``mx.fast.scaled_dot_product_attention``. Prefill attends to the *quantized* rows of the chunk
  itself too (as llama.cpp does: it writes the cache, then reads it), so results do not depend on
  how a prompt is chunked and every position sees the cache decode would see.

Key calibration (``cache.calibration``): the kernel reads the calibrated blocks, so the query is
scaled by the key scales: on the decode lane by the prepared launch's pass 1 as it loads q (from
``cache.query_scale``; the kernel rotates it), else scaled and rotated by ``cache.query_for_blocks``
before ``decode_attention``; the dequantize path gets keys with the calibration undone. Decode with
attention sinks and a key mean takes the dequantize path (the reason is kept in ``cache.decode_fallback``).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar

import mlx.core as mx

from ..backend import emulated_decode_lane
from ..decode_options import DEFAULT_OPTIONS
from .cache import TQCache, hadamard_rotate
from .lane import AttendLane, routed_block

__all__ = ["route_attention", "attend", "decode_kernel", "DECODE_MODES"]

DECODE_MODES = ("auto", "kernel", "reference", "sdpa")
_lock = threading.Lock()
_saved: dict = {}              # mlx-lm module name -> (module, the attention entry point it had)
_installs = 0                  # route_attention blocks open in the process
_MODE: "ContextVar[str]" = ContextVar("tqbridge_decode_mode", default="auto")   # the innermost block's mode


def decode_kernel():
    """``tqbridge.metal.decode_attention`` when it is installed, else None."""
    try:
        from tqbridge.metal.attention import decode_attention
    except ImportError:
        return None
    return decode_attention


def _kernel_backend() -> str:
    from tqbridge.metal import attention

    if hasattr(attention, "last_run"):
        return attention.last_run().get("backend") or "kernel"
    return "kernel"  # pragma: no cover


def _decode_backend(mode: str) -> "str | None":
    """The ``backend`` to pass to decode_attention for ``mode``, or None for dequantize + SDPA."""
    if mode == "sdpa":
        return None
    if mode in ("kernel", "reference"):
        return mode
    # auto: the fused kernel on a GPU; on CPU the dispatcher's MLX-ops reference, which measured
    # 2-25x faster than the kernel's CPU emulator (mode "kernel" takes the emulator).
    if mx.default_device() == mx.gpu or emulated_decode_lane():
        return "auto"
    return "reference"


def _fast_decode(cache: TQCache, q, scale: float, sinks, backend: str):
    """The decode step's attention on a GPU: the layer's prepared fused-kernel launch over the
    cache buffers (runtime length, rotations inside the kernel, ordered after the in-place append
    by its flag); None when it does not apply (CPU, keys calibrated in the rotated basis or still waiting
    for their calibration, a shape it refuses). Calibrated keys (model basis): the kernel takes q and
    ``cache.query_scale(q)``, and its pass 1 multiplies them."""
    if cache.keys is None or backend != "auto" or not cache._owned:
        return None
    if cache.calibration and (cache.calibration.basis != "original" or cache._pending is not None):
        return None
    sig = (tuple(q.shape), q.dtype, cache.keys.shape[2], scale, sinks is not None)
    launch = cache.decode_launch
    if launch is None or cache._decode_sig != sig:
        from ..attention_kernel import prepare_decode

        from .codecs import _gpu_backend

        launch = prepare_decode(q, cache.keys, cache.values, k_format=cache.k_format, v_format=cache.v_format,
                                scale=scale, window=cache.window, sinks=sinks,
                                rotation=(cache.k_rot, cache.v_rot),
                                backend="cpu-emulator" if _gpu_backend() == "cpu-emulator" else "auto",
                                options=cache.decode_options)
        cache.decode_launch, cache._decode_sig = launch, sig
        if launch is None:
            return None
    out = launch(q, cache.keys, cache.values, cache.offset - cache.start, after=cache._flag, sinks=sinks,
                 q_scale=cache.query_scale(q))
    path = f"decode:{launch.backend}"
    cache.paths[path] += 1
    if sinks is None:   # later steps of this geometry take the lane in the routed entry point
        cache._hot_attn = AttendLane(q.shape, scale, path, launch)
    return out


def _kernel_decode(cache: TQCache, q: mx.array, scale: float, sinks, backend: str):
    kernel = decode_kernel()
    if kernel is None or cache.decode_fallback:
        return None
    if sinks is not None and cache.k_mu is not None:
        # Stored keys are k - mu: scores shift by q.mu per row, which softmax ignores, but the sink
        # logit would need the same shift. The dequantize path adds mu back and stays exact.
        cache.decode_fallback = ("attention sinks with key mean calibration: the kernel's scores are "
                                 "shifted by q.mu, the sink logit is not")
        return None
    try:
        out = _fast_decode(cache, q, scale, sinks, backend)
    except Exception as e:  # a format or shape the kernel does not take: say so once, then fall back
        cache.decode_fallback = f"{type(e).__name__}: {e}"
        return None
    if out is not None:
        return out
    start = max(0, cache.offset - cache.window) if cache.window else 0
    kb, vb = cache.blocks(start)
    B, Hq, _, D = q.shape
    kwargs = {"sinks": sinks} if sinks is not None else {}
    if cache.decode_options != DEFAULT_OPTIONS:
        kwargs["options"] = cache.decode_options
    if cache.calibration:
        q = cache.query_for_blocks(q)       # (H(q*s)).(H(k-mu)/s) = q.k - q.mu: same softmax
        rotation = None
    else:
        rotation = (cache.k_rot, cache.v_rot)   # inside decode_attention
    try:
        out = kernel(q.reshape(B, Hq, D), kb, vb, k_format=cache.k_format, v_format=cache.v_format,
                     length=kb.shape[2], scale=scale, backend=backend, rotation=rotation, **kwargs)
    except Exception as e:  # a format or shape it does not take: say so once, then fall back
        cache.decode_fallback = f"{type(e).__name__}: {e}"
        return None
    out = mx.array(out) if not isinstance(out, mx.array) else out
    if out.shape[-1] != cache.v_dim:
        out = out[..., :cache.v_dim]
    if cache.calibration:
        out = hadamard_rotate(out, cache.v_rot)  # the cache holds H.v: rotate the output back
    cache.paths[f"decode:{_kernel_backend()}"] += 1
    return out.reshape(B, Hq, 1, cache.v_dim).astype(q.dtype)


def attend(cache: TQCache, queries, keys, values, *, scale: float, mask=None, sinks=None,
           mode: str = "auto"):
    """Attention for one TQCache layer; records the path in ``cache.paths``.

    ``keys`` / ``values`` are what ``cache.update_and_fetch`` returned (lazy dequantized rows);
    the decode path reads the blocks instead, so they are never computed there.
    """
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, got {mode!r}")
    if cache._pending is not None:     # qscale: the first chunk's keys wait for these queries
        cache.finish_calibration(queries)
        keys, values = cache.fetch(keys.dtype)
    decode = queries.shape[2] == 1
    backend = _decode_backend(mode) if decode else None
    if backend is not None:
        out = _kernel_decode(cache, queries, scale, sinks, backend)
        if out is not None:
            return out
        if mode == "kernel":
            why = cache.decode_fallback or "tqbridge.metal.decode_attention is not installed"
            raise RuntimeError(f"decode mode 'kernel' asked for, but the kernel cannot run: {why}")
    if cache.placeholder:   # update_and_fetch left the float rows unbuilt (decode was expected)
        keys, values = cache.fetch(queries.dtype)
        cache.placeholder = False
    cache.paths["decode:dequant-sdpa" if decode else "prefill:dequant-sdpa"] += 1
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask,
                                                sinks=sinks)


def _routed(original):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, TQCache):
            hot = cache._hot_attn
            mode = _MODE.get()
            if (hot is not None and cache.placeholder and sinks is None and mode == "auto"
                    and queries.shape == hot.q_shape and scale == hot.scale):
                # the decode step's lane: the prepared fused attention over the cache buffers
                cache.placeholder = False
                cache.paths[hot.path] += 1
                return cache._attend_step(hot.launch, queries)
            return attend(cache, queries, keys, values, scale=scale, mask=mask, sinks=sinks, mode=mode)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.__wrapped__ = original
    return scaled_dot_product_attention


@contextmanager
def route_attention(mode: str = "auto"):
    """Route attention of TQCache layers while the block runs (re-entrant; restores on exit).

    ``mode`` (decode steps): ``auto`` (the fused kernel on a GPU; on CPU decode_attention's ops
    reference), ``kernel`` (always the fused kernel; an error if it cannot run), ``reference`` (decode_attention's ops reference) or ``sdpa`` (dequantize +
    ``mx.fast.scaled_dot_product_attention``, as prefill).
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
