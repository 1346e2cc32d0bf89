"""The GPU decode step of :class:`~tqbridge.metal.lm.cache.TQCache` (see docs/cache.md).

On a GPU a decode step is one in-place append kernel writing the step's K/V blocks into the cache
buffers, then the fused attention reading those buffers with a runtime length, with no host
synchronisation. Where the routed attention fuses the append into its own call, the step's rows wait
as :class:`DeferredRows` until it runs. :class:`DecodeLane` holds that lane: the prepared append and
attention of a layer, the deferred rows, the device-side NaN/inf flag and the ordering of in-place
writes before other readers; TQCache inherits it. The routing flag (:func:`routed_block`) tells the
cache that the routed attention follows its update in this thread.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, NamedTuple

import mlx.core as mx

from tqbridge.bridge import FormatError

from .codecs import _gpu_backend, _quantizer, padded_dim

__all__ = ["DecodeLane", "StepLane", "AttendLane", "DeferredRows", "routed_block"]

_ROUTED: "ContextVar[int]" = ContextVar("tqbridge_routing_depth", default=0)


@contextmanager
def routed_block() -> Iterator[None]:
    """Marks the block as routed (:func:`tqbridge.metal.lm.routing.route_attention` enters it, nesting
    allowed): in this thread the routed attention follows every TQCache update and brings queries."""
    token = _ROUTED.set(_ROUTED.get() + 1)
    try:
        yield
    finally:
        _ROUTED.reset(token)


def _routing_active() -> bool:
    """Whether :func:`tqbridge.metal.lm.routing.route_attention` is in effect here (it brings queries)."""
    return _ROUTED.get() > 0


@mx.compile
def _scaled_query(q: mx.array, s: mx.array) -> mx.array:
    """``q * s`` in float32, back to q's dtype: one elementwise kernel."""
    return (q.astype(mx.float32) * s).astype(q.dtype)


class StepLane(NamedTuple):
    """A decode step's prepared in-place append: the K/V row shapes and dtype it was made for, the append
    and the buffer capacity (rows) it writes into."""

    k_shape: tuple
    v_shape: tuple
    dtype: Any
    append: Callable
    capacity: int


class AttendLane(NamedTuple):
    """The routed attention of a decode step: the q shape and scale it was prepared for, the path name
    it reports and the prepared fused attention (:class:`tqbridge.metal.attention_launch.DecodeLaunch`)."""

    q_shape: tuple
    scale: float
    path: str
    launch: Any


class DeferredRows(NamedTuple):
    """The step's K/V rows the routed attention writes in its own call (on backends that fuse them)."""

    keys: Any
    values: Any
    row: int
    append: Callable


def _written_first(slot: str) -> property:
    """A TQCache buffer attribute stored in ``slot`` that writes a deferred decode row (see
    DecodeLane._deferred) before it is read or replaced."""
    def get(self):
        if self._deferred is not None:
            self._write_deferred()
        return getattr(self, slot)

    def put(self, a) -> None:
        if self._deferred is not None:
            self._write_deferred()
        setattr(self, slot, a)
    return property(get, put)


class DecodeLane:
    """TQCache's decode-step lane (a mixin). The cache class provides the storage it writes into and
    what it reports to: ``offset``, ``start``, ``step``, ``k_format`` / ``v_format`` with their head
    dims and rotation groups, ``calibration`` and ``_pending``, ``_kq`` / ``_vq``, ``codec_paths``,
    ``paths``, ``decode_fallback``, ``_keep_from``, ``_compact``, ``_grow`` and ``fetch``; its
    ``update_and_fetch`` takes a prepared step (``_hot``) itself."""

    # The decode step's deferred append (DeferredRows) the routed attention writes in the same call as it
    # attends (_attend_step), or None. Every other reader of the buffers or
    # of the flag writes them first: ``keys``, ``values`` and ``_flag`` are properties over _kbuf, _vbuf,
    # _flagbuf that do so, and their setters too, so no path can see (or replace) buffers without the row.
    _deferred = None

    keys = _written_first("_kbuf")
    values = _written_first("_vbuf")
    _flag = _written_first("_flagbuf")

    def _setup_lane(self) -> None:
        # the decode step (see docs/cache.md): on a GPU one in-place append kernel per step and the
        # fused attention reading the buffers with a runtime length, no host synchronisation
        self._flag = None            # device-side NaN/inf flag of the rows appended since the last check
        self._unsettled = False      # in-place appends the MLX graph does not order (see _settle)
        self._inplace: dict = {}     # (dtype, dk, dv) -> prepared in-place append, or None
        self._kcal = None            # calibrated keys: the append kernel's means and scales (a device array)
        self._qscale = None          # calibrated keys: the scales shaped against the decode step's q
        self.placeholder = False     # update_and_fetch returned the step's rows, not the cache
        self._owned = True           # the buffers are this cache's own allocations (in-place writes go there)
        self._reset_hot()
        self.decode_launch = None    # the prepared fused attention of this layer (the routing's)
        self._decode_sig = None

    def _reset_hot(self) -> None:
        """Forget the prepared decode-step lane (the buffers or the geometry changed)."""
        self._hot: "StepLane | None" = None          # the in-place decode step
        self._hot_attn: "AttendLane | None" = None   # the routed attention of the decode step

    # Where in its growth step this layer grows, as a fraction of ``step`` (``make_cache`` spreads the
    # layers of a model over it): a layer grows ``grow_lead`` rows before its buffers are full, so the
    # layers of one model grow in different decode steps. A growth copies the buffers on the device and
    # the old ones live until the step's graph completes: spread, a step holds one layer's old buffers
    # instead of every layer's.
    grow_phase = 0.0

    @property
    def grow_lead(self) -> int:
        """Rows before its buffers are full at which this layer grows (0 <= lead < step)."""
        return min(int(self.grow_phase * self.step), self.step - 1)

    def _write_deferred(self) -> None:
        """The deferred append on its own (something other than the routed attention reads the cache)."""
        d, self._deferred = self._deferred, None
        self._flagbuf = d.append(d.keys, d.values, self._kbuf, self._vbuf, d.row, self._flagbuf)
        self._unsettled = True

    def _calibration_buffer(self, heads: int):
        """The append kernel's ``kcal`` for this layer's key calibration (a device array, made once)."""
        import numpy as np

        from ..kv_append import calibration_rows

        buf = self._kcal
        if buf is None:
            mu = None if self.k_mu is None else np.array(self.k_mu)
            s = None if self.k_scale is None else np.array(self.k_scale)
            buf = self._kcal = mx.array(calibration_rows(mu, s, heads, self.k_dim).reshape(-1))
        return buf

    def query_scale(self, queries: mx.array) -> "mx.array | None":
        """This layer's key scales ``s`` shaped against ``queries`` (query heads share their KV head's),
        float32, ``(1, Hq, [1,] D)``; None without a key scale. Made once per query shape. The decode
        lane's fused attention takes it as is (``q_scale``: pass 1 multiplies q by it as it loads q)."""
        s = self.k_scale
        if s is None:
            return None
        key = (queries.shape[1], queries.ndim)
        got = self._qscale.get(key) if self._qscale else None
        if got is None:
            if queries.shape[1] != s.shape[0]:
                s = mx.repeat(s, queries.shape[1] // s.shape[0], axis=0)
            got = s.reshape(1, queries.shape[1], *([1] * (queries.ndim - 3)), s.shape[-1])
            self._qscale = {key: got}
        return got

    def lane_query(self, queries: mx.array) -> mx.array:
        """The query for this layer's stored keys: ``q * s`` (``H(q*s).H((k-mu)/s) = q.k - q.mu``, a
        shift per query row that softmax ignores); ``q`` itself without a key scale. Made by MLX ops,
        for the paths outside the decode lane (:meth:`query_for_blocks`); the lane's pass 1 makes the
        same bits from q and :meth:`query_scale`."""
        s = self.query_scale(queries)
        return queries if s is None else _scaled_query(queries, s)

    def _attend_step(self, launch, queries):
        """The routed attention of a decode step over the buffers (``launch``: the layer's prepared
        fused attention; key scales, where there are, multiplied into q by its pass 1), with the step's
        deferred append in the same call where there is one."""
        d = self._deferred
        if d is None:
            return launch(queries, self.keys, self.values, self.offset - self.start, self._flag,
                          q_scale=self.query_scale(queries))
        self._deferred = None
        self._flagbuf, out = launch.with_append(d.append, d.keys, d.values, queries, self._kbuf, self._vbuf, d.row,
                                                self._flagbuf, self.offset - self.start, self.query_scale(queries))
        self._unsettled = True
        return out

    def _inplace_append(self, keys: mx.array, values: mx.array):
        """The prepared in-place append kernel for rows like these, or None (then the ops path)."""
        key = (keys.dtype, keys.shape[-1], values.shape[-1])
        if key in self._inplace:
            return self._inplace[key]
        if self._pending is not None:   # qscale: the first chunk waits for its queries (decided after it)
            return None
        app = None
        gpu = _gpu_backend()
        calibrated = bool(self.calibration)
        if gpu is not None and calibrated and self.calibration.basis != "original":
            self.codec_paths["append_note"] = ("in-place append unavailable: key calibration in the rotated basis "
                                               "(the append kernel calibrates keys before its rotation)")
        elif (gpu is not None and keys.dtype == values.dtype
                and keys.dtype in (mx.float16, mx.bfloat16, mx.float32)):
            from .. import kv_append
            from ..selfcheck import check_decode_lane

            geo = (self.k_format, self.v_format, self.k_dim, self.v_dim, padded_dim(self.k_format, self.k_dim),
                   padded_dim(self.v_format, self.v_dim), self.k_rot, self.v_rot,
                   str(keys.dtype).replace("mlx.core.", ""), gpu)
            try:
                app = kv_append.prepared(*geo, options=self.decode_options, calibrated=calibrated)
                if calibrated:   # this layer's channel means and scales, bound to the shared kernel
                    app = kv_append.CalibratedAppend(app, self._calibration_buffer(keys.shape[1]))
            except Exception as e:   # a geometry the kernel does not take: the ops path, said once
                self.codec_paths["append_note"] = f"in-place append unavailable: {type(e).__name__}: {e}"
            reason = (check_decode_lane(*geo, options=self.decode_options, calibrated=calibrated)
                      if app is not None else None)
            if reason:   # kernels that fail here on this hardware: the reference paths, loudly
                app = None
                self.decode_fallback = f"self-check failed: {reason}"
                self.codec_paths["append_note"] = f"in-place append off: self-check failed: {reason}"
                self._kq, kq_path = _quantizer(self.k_format, use_kernel=False)
                self._vq, vq_path = _quantizer(self.v_format, use_kernel=False)
                self.codec_paths["k_append"], self.codec_paths["v_append"] = kq_path, vq_path
        if app is not None:
            self.codec_paths["k_append"] = self.codec_paths["v_append"] = f"kv-append:{gpu}"
        self._inplace[key] = app
        return app

    def _append_in_place(self, append, keys: mx.array, values: mx.array):
        B, H, S, _ = keys.shape
        prev = self.offset
        keep = self._keep_from(prev)
        cap = 0 if self.keys is None else self.keys.shape[2]
        lead = self.grow_lead
        if (keep != self.start or prev - self.start + S > cap - lead) and self._owned and self.keys is not None \
                and self._flag is not None:
            # slide the window and/or grow on the device, ordered after the in-place appends by their
            # flag: no sync
            from ..kv_append import relocate

            a, n = keep - self.start, prev - keep
            self._reset_hot()
            self.keys, self.values = relocate(self.keys, self.values, a, n,
                                              -(-(n + S + lead) // self.step) * self.step, self._flag, append.backend)
            self.start = keep
        elif keep != self.start:
            self._settle()
            self._compact(prev)
        r = prev - self.start
        cap = 0 if self.keys is None else self.keys.shape[2]
        if r + S > cap - lead or not self._owned:
            # buffers loaded from a state (possibly views of another cache's) are copied once into
            # our own before a kernel writes into them
            self._settle()
            self._grow(B, H, r + S + lead, append.k_row_bytes, append.v_row_bytes, force=not self._owned)
            self._owned = True   # fresh buffers; the kernel's graph edge orders it after their allocation
        flag = self._flag
        slots = append.flag_slots(B * H * S)
        if flag is None or flag.shape[0] != slots:
            if flag is not None:
                self._settle()
            flag = mx.zeros((slots,), mx.uint32)
        self._flag = append(keys, values, self.keys, self.values, r, flag)
        self._unsettled = True
        self.offset = prev + S
        self.paths["append"] += 1
        if S == 1:   # later steps of this geometry take the lane at the top of update_and_fetch
            self._hot = StepLane(keys.shape, values.shape, keys.dtype, append, self.keys.shape[2] - lead)
        if S == 1 and _routing_active():
            # the routing sends this step to the fused kernel, which reads the buffers: no K/V rows
            # to build (attend fetches them itself if it has to fall back)
            self.placeholder = True
            return keys, values
        self.placeholder = False
        return self.fetch(keys.dtype)

    def _note_nonfinite(self, bad: mx.array) -> None:
        self._flag = bad if self._flag is None or self._flag.shape != bad.shape else self._flag | bad

    def _settle(self) -> None:
        """Before MLX ops read or replace the buffers: wait for the in-place appends (MLX does not
        know that kernel wrote them, so nothing else orders it) and report NaN/inf they saw."""
        if self._unsettled:
            self.check_finite()

    def check_finite(self) -> None:
        """Raise :class:`FormatError` if a decode step appended NaN/inf K/V rows (their blocks are
        unspecified). Decode steps record this on the device without a synchronisation; it is read
        here — called at every buffer growth (every ``step`` positions), on ``state``, ``trim`` and
        prompt chunks, and by tqbridge's own generate/quality/bench after a run. One sync."""
        if self._flag is None:
            return
        if self._unsettled:
            mx.eval(self._flag)
            self._unsettled = False
        if bool(mx.any(self._flag).item()):
            raise FormatError(f"TQCache({self.k_format}/{self.v_format}): a decode step appended NaN or "
                              f"infinite K/V rows (positions before {self.offset}); their blocks are unspecified")
