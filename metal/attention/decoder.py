"""A layer's decode step: :class:`LayerDecoder` (see docs/cache.md).

One object per cache layer owns the layer's K/V block buffers and their growth, the prepared in-place
append and the prepared fused attention, and runs the layer's two operations: :meth:`LayerDecoder.append`
(a prompt chunk's or a decode step's rows, already in blocks or as float rows for the append kernel) and
:meth:`LayerDecoder.attend` (q against the stored blocks). :class:`~tqbridge.metal.lm.cache.TQCache` holds
one and delegates to it; the attention routing (:mod:`tqbridge.metal.lm.routing`) calls the cache's
``attend``, which calls this.

On a GPU a decode step is one in-place append kernel writing the step's K/V blocks into the buffers,
then the fused attention reading them with a runtime length, with no host synchronisation. Where the
fused attention takes the append into its own call (``DecodeOptions.defer_append``), the step's rows
wait as :class:`StagedRows` until it runs; every other reader of the buffers writes them first.
The layer's configuration (formats, head dims, rotation groups, key calibration, decode options) and
its reports (``paths``, ``codec_paths``, ``decode_fallback``) are the cache's: the decoder reads them
from the cache it was made for.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
import weakref
from typing import Any, Callable, Iterator, NamedTuple

import mlx.core as mx

from tqbridge.bridge import FormatError

from ..codecs import gpu_backend, padded_dim, quantizer

__all__ = ["LayerDecoder", "StagedRows", "routed_block", "routing_active", "ROUTING_DEPTH"]

# how many route_attention blocks are open in this thread (routed_block); > 0: the routed attention follows
ROUTING_DEPTH: "ContextVar[int]" = ContextVar("tqbridge_routing_depth", default=0)


@contextmanager
def routed_block() -> Iterator[None]:
    """Marks the block as routed (:func:`tqbridge.metal.lm.routing.route_attention` enters it, nesting
    allowed): in this thread the routed attention follows every cache update and brings queries."""
    token = ROUTING_DEPTH.set(ROUTING_DEPTH.get() + 1)
    try:
        yield
    finally:
        ROUTING_DEPTH.reset(token)


def routing_active() -> bool:
    """Whether :func:`tqbridge.metal.lm.routing.route_attention` is in effect here (it brings queries)."""
    return ROUTING_DEPTH.get() > 0


@mx.compile
def scaled_query(q: mx.array, s: mx.array) -> mx.array:
    """``q * s`` in float32, back to q's dtype: one elementwise kernel."""
    return (q.astype(mx.float32) * s).astype(q.dtype)


class _StepAppend(NamedTuple):
    """The prepared in-place append of a decode step: the K/V row shapes and dtype it was made for, the
    append and the buffer capacity (rows) it writes into."""

    k_shape: tuple
    v_shape: tuple
    dtype: Any
    append: Callable
    capacity: int


class _StepAttend(NamedTuple):
    """The prepared fused attention of a decode step: the q shape and scale it was made for, the path
    name it reports and the launch (:class:`tqbridge.metal.attention.launch.DecodeLaunch`)."""

    q_shape: tuple
    scale: float
    path: str
    launch: Any


class StagedRows(NamedTuple):
    """A decode step's K/V rows that the fused attention writes in its own call (backends that fuse them)."""

    keys: Any
    values: Any
    row: int
    append: Callable


def _written_first(slot: str) -> property:
    """A buffer attribute stored in ``slot`` that writes the staged decode rows first, when read or replaced."""
    def get(self):
        if self.staged is not None:
            self.write_staged()
        return getattr(self, slot)

    def put(self, a) -> None:
        if self.staged is not None:
            self.write_staged()
        setattr(self, slot, a)
    return property(get, put)


class LayerDecoder:
    """The K/V blocks of one layer and its decode step. ``layer``: the cache it serves (formats, dims,
    rotation groups, key calibration, decode options, reports). Positions ``[start, offset)`` are stored
    at buffer rows ``[0, offset - start)``; ``keys`` / ``values`` are ``(B, H, capacity, row_bytes)``
    uint8."""

    # The staged decode rows (StagedRows) the fused attention writes in the same call as it attends, or
    # None. Every other reader of the buffers or the flag writes them first: ``keys``, ``values`` and
    # ``flag`` are properties over _kbuf, _vbuf, _flagbuf that do so, and their setters too.
    staged = None
    keys = _written_first("_kbuf")
    values = _written_first("_vbuf")
    flag = _written_first("_flagbuf")

    def __init__(self, layer: Any, grow_phase: float = 0.0):
        # held weakly: the cache holds its decoder, so a dropped cache (a server's evicted prompt cache)
        # frees its blocks by reference counting, not when Python's cyclic collector next runs
        self._layer = weakref.ref(layer)
        # Where in its growth step this layer grows, as a fraction of ``step`` (make_cache spreads a
        # model's layers over it): a layer grows ``grow_lead`` rows before its buffers are full, so the
        # layers of one model grow in different decode steps and a step holds one layer's old buffers.
        self.grow_phase = grow_phase
        self._kbuf = self._vbuf = None
        self.offset = 0
        self.start = 0
        self._clear()

    @property
    def layer(self) -> Any:
        """The cache this decoder serves (its configuration and reports)."""
        layer = self._layer()
        if layer is None:
            raise RuntimeError("this layer decoder's cache no longer exists")
        return layer

    def _clear(self) -> None:
        self._flagbuf = None        # device-side NaN/inf flag of the rows appended since the last check
        self.unsettled = False      # in-place appends the MLX graph does not order (see settle)
        self.owned = True           # the buffers are this decoder's own allocations (in-place writes go there)
        self._inplace: dict = {}    # (dtype, dk, dv) -> prepared in-place append, or None
        self._kcal = None           # calibrated keys: the append kernel's means and scales (a device array)
        self._qscale = None         # calibrated keys: the scales shaped against the decode step's q
        self.launch = None          # the prepared fused attention of this layer
        self._launch_sig = None
        self.forget_steps()

    def forget_steps(self) -> None:
        """Forget the prepared decode step (the buffers or the geometry changed)."""
        self._step_append: "_StepAppend | None" = None
        self._step_attend: "_StepAttend | None" = None

    def forget_calibration(self) -> None:
        """The key calibration changed: forget the append kernel's and the query's copies of it."""
        self._kcal = self._qscale = None
        self._inplace = {}

    @property
    def prepared(self) -> bool:
        """Whether the decode step's append and attention are prepared (later steps take them)."""
        return self._step_append is not None and self._step_attend is not None

    @property
    def step(self) -> int:
        """Rows the buffers grow by (and a window drops at least): the layer's ``step``."""
        return self.layer.step

    @property
    def grow_lead(self) -> int:
        """Rows before its buffers are full at which this layer grows (0 <= lead < step)."""
        return min(int(self.grow_phase * self.step), self.step - 1)

    @property
    def rows(self) -> int:
        """Stored rows (positions ``[start, offset)``)."""
        return self.offset - self.start

    # ------------------------------------------------------------ storage
    def load(self, keys, values, offset: int, start: int) -> None:
        """Take blocks from a saved state (not ours: copied before a kernel writes into them)."""
        self._clear()
        self.keys, self.values = keys, values
        self.offset, self.start = offset, start
        self.owned = keys is None

    def blocks(self, start: int = 0) -> "tuple[mx.array, mx.array]":
        """The K and V blocks of positions ``max(start, self.start):offset``."""
        self.settle()
        a, b = max(0, start - self.start), self.offset - self.start
        return self.keys[..., a:b, :], self.values[..., a:b, :]

    def keep_from(self, pos: int) -> int:
        """First position to keep when rows for position ``pos`` onwards are appended."""
        window = self.layer.window
        if not window:
            return self.start
        need = max(0, pos - window + 1)
        return need if need - self.start >= self.step else self.start

    def compact(self, pos: int) -> None:
        keep = self.keep_from(pos)
        if keep == self.start or self.keys is None:
            return
        self.forget_steps()
        a, b = keep - self.start, pos - self.start
        self.keys = mx.contiguous(self.keys[..., a:b, :])
        self.values = mx.contiguous(self.values[..., a:b, :])
        self.start = keep

    def grow(self, B: int, H: int, need: int, krb: int, vrb: int, force: bool = False) -> None:
        cap = 0 if self.keys is None else self.keys.shape[2]
        if need <= cap and not force:
            return
        self.check_finite()   # once per `step` positions: the deferred NaN/inf report of decode steps
        self.forget_steps()
        new_cap = max(-(-need // self.step) * self.step, cap)
        k_new = mx.zeros((B, H, new_cap - cap, krb), mx.uint8)
        v_new = mx.zeros((B, H, new_cap - cap, vrb), mx.uint8)
        if self.keys is None:
            self.keys, self.values = k_new, v_new
        else:
            self.keys = mx.concatenate([self.keys[..., :cap, :], k_new], axis=2)
            self.values = mx.concatenate([self.values[..., :cap, :], v_new], axis=2)

    def write(self, kb: mx.array, vb: mx.array) -> None:
        """Append blocks made by MLX ops (a prompt chunk, or a step off the GPU lane) at ``offset``."""
        self.settle()
        B, H, S, _ = kb.shape
        prev = self.offset
        self.compact(prev)
        r = prev - self.start
        self.grow(B, H, r + S, kb.shape[-1], vb.shape[-1])
        self.keys[..., r:r + S, :] = kb
        self.values[..., r:r + S, :] = vb
        self.offset = prev + S

    def trim(self, n: int) -> int:
        # rows past the new offset get overwritten by later in-place appends: let every kernel that
        # may still read them finish first
        self.settle()
        self.check_finite()
        mx.synchronize()
        self.forget_steps()
        n = min(self.offset - self.start, int(n))
        self.offset -= n
        return n

    def twin(self, layer: Any) -> "LayerDecoder":
        """An independent decoder for ``layer`` holding the same positions: its own buffers (the valid
        rows copied into fresh arrays, evaluated now), nothing prepared."""
        out = LayerDecoder(layer, self.grow_phase)
        out.offset, out.start = self.offset, self.start
        if self.keys is not None:
            kb, vb = self.keys, self.values   # writes staged decode rows first
            self.settle()
            n = self.rows
            cap = max(n, -(-n // self.step) * self.step)
            B, H, _, krb = kb.shape
            vrb = vb.shape[-1]
            # concatenate allocates its output: the copy never aliases these buffers
            kb = mx.concatenate([kb[..., :n, :], mx.zeros((B, H, cap - n, krb), mx.uint8)], axis=2)
            vb = mx.concatenate([vb[..., :n, :], mx.zeros((B, H, cap - n, vrb), mx.uint8)], axis=2)
            mx.eval(kb, vb)   # read now, before this decoder writes its buffers again
            out._kbuf, out._vbuf = kb, vb
        out._kcal, out._qscale = self._kcal, self._qscale
        return out

    @property
    def nbytes(self) -> int:
        return 0 if self._kbuf is None else self._kbuf.nbytes + self._vbuf.nbytes

    # ------------------------------------------------------------ NaN/inf and ordering
    def note_nonfinite(self, bad: mx.array) -> None:
        """Record a step's lazy NaN/inf flag (reported at the next :meth:`check_finite`)."""
        self.flag = bad if self.flag is None or self.flag.shape != bad.shape else self.flag | bad

    def settle(self) -> None:
        """Before MLX ops read or replace the buffers: wait for the in-place appends (MLX does not know
        that kernel wrote them, so nothing else orders it) and report NaN/inf they saw."""
        if self.staged is not None:
            self.write_staged()
        if self.unsettled:
            self.check_finite()

    def check_finite(self) -> None:
        """Raise :class:`FormatError` if a decode step appended NaN/inf K/V rows (their blocks are
        unspecified). Decode steps record this on the device without a synchronisation; it is read
        here — at every buffer growth (every ``step`` positions), on ``state``, ``trim`` and prompt
        chunks, and by tqbridge's own generate/quality/bench after a run. One sync."""
        if self.flag is None:
            return
        if self.unsettled:
            mx.eval(self.flag)
            self.unsettled = False
        if bool(mx.any(self.flag).item()):
            layer = self.layer
            raise FormatError(f"TQCache({layer.k_format}/{layer.v_format}): a decode step appended NaN or "
                              f"infinite K/V rows (positions before {self.offset}); their blocks are unspecified")

    def write_staged(self) -> None:
        """The staged append on its own (something other than the fused attention reads the buffers)."""
        d, self.staged = self.staged, None
        self._flagbuf = d.append(d.keys, d.values, self._kbuf, self._vbuf, d.row, self._flagbuf)
        self.unsettled = True

    # ------------------------------------------------------------ appends
    def append_step(self, keys: mx.array, values: mx.array) -> bool:
        """The prepared decode step's append of one position's rows, when it applies (same shapes as
        the step it was prepared for, room in the buffers, no window slide due): the rows are written by
        the in-place kernel now, or staged for the fused attention that follows under the routing.
        False when it does not apply (the caller takes :meth:`append_in_place` or :meth:`write`)."""
        hot = self._step_append
        if hot is None or keys.shape != hot.k_shape or values.shape != hot.v_shape or keys.dtype != hot.dtype:
            return False
        r = self.offset - self.start
        w = self.layer.window
        if r >= hot.capacity or (w and self.offset - w + 1 - self.start >= self.step):
            return False
        attn = self._step_attend
        if attn is not None and attn.launch.fuses_append and ROUTING_DEPTH.get() > 0:
            if self.staged is not None:   # the last step's rows were never attended
                self.write_staged()
            self.staged = StagedRows(keys, values, r, hot.append)
        else:
            self.flag = hot.append(keys, values, self.keys, self.values, r, self.flag)
            self.unsettled = True
        self.offset += 1
        return True

    def in_place_append(self, keys: mx.array, values: mx.array):
        """The prepared in-place append kernel for rows like these, or None (then MLX ops append)."""
        key = (keys.dtype, keys.shape[-1], values.shape[-1])
        if key in self._inplace:
            return self._inplace[key]
        layer = self.layer
        if layer.calibration_pending:   # qscale: the first chunk waits for its queries (decided after it)
            return None
        app = None
        gpu = gpu_backend()
        calibration = layer.calibration
        calibrated = bool(calibration)
        if gpu is not None and calibrated and calibration.basis != "original":
            layer.codec_paths["append_note"] = ("in-place append unavailable: key calibration in the rotated basis "
                                                "(the append kernel calibrates keys before its rotation)")
        elif (gpu is not None and keys.dtype == values.dtype
                and keys.dtype in (mx.float16, mx.bfloat16, mx.float32)):
            from .. import kv_append
            from ..selfcheck import check_decode_lane

            geo = (layer.k_format, layer.v_format, layer.k_dim, layer.v_dim, padded_dim(layer.k_format, layer.k_dim),
                   padded_dim(layer.v_format, layer.v_dim), layer.k_rot, layer.v_rot,
                   str(keys.dtype).replace("mlx.core.", ""), gpu)
            try:
                app = kv_append.prepared(*geo, options=layer.decode_options, calibrated=calibrated)
                if calibrated:   # this layer's channel means and scales, bound to the shared kernel
                    app = kv_append.CalibratedAppend(app, self._calibration_buffer(keys.shape[1]))
            except Exception as e:   # a geometry the kernel does not take: the ops path, said once
                layer.codec_paths["append_note"] = f"in-place append unavailable: {type(e).__name__}: {e}"
            reason = (check_decode_lane(*geo, options=layer.decode_options, calibrated=calibrated)
                      if app is not None else None)
            if reason:   # kernels that fail here on this hardware: the reference paths, loudly
                app = None
                layer.kernels_failed(f"self-check failed: {reason}")
        if app is not None:
            layer.codec_paths["k_append"] = layer.codec_paths["v_append"] = f"kv-append:{gpu}"
        self._inplace[key] = app
        return app

    def append_in_place(self, append, keys: mx.array, values: mx.array) -> None:
        """Append float rows with the in-place kernel ``append`` (from :meth:`in_place_append`): slides
        the window and grows the buffers on the device where due, and prepares the decode step (S = 1)."""
        B, H, S, _ = keys.shape
        prev = self.offset
        keep = self.keep_from(prev)
        cap = 0 if self.keys is None else self.keys.shape[2]
        lead = self.grow_lead
        if (keep != self.start or prev - self.start + S > cap - lead) and self.owned and self.keys is not None \
                and self.flag is not None:
            # slide the window and/or grow on the device, ordered after the in-place appends by their
            # flag: no sync
            from ..kv_append import relocate

            a, n = keep - self.start, prev - keep
            self.forget_steps()
            self.keys, self.values = relocate(self.keys, self.values, a, n,
                                              -(-(n + S + lead) // self.step) * self.step, self.flag, append.backend)
            self.start = keep
        elif keep != self.start:
            self.settle()
            self.compact(prev)
        r = prev - self.start
        cap = 0 if self.keys is None else self.keys.shape[2]
        if r + S > cap - lead or not self.owned:
            # buffers loaded from a state (possibly views of another cache's) are copied once into
            # our own before a kernel writes into them
            self.settle()
            self.grow(B, H, r + S + lead, append.k_row_bytes, append.v_row_bytes, force=not self.owned)
            self.owned = True   # fresh buffers; the kernel's graph edge orders it after their allocation
        flag = self.flag
        slots = append.flag_slots(B * H * S)
        if flag is None or flag.shape[0] != slots:
            if flag is not None:
                self.settle()
            flag = mx.zeros((slots,), mx.uint32)
        self.flag = append(keys, values, self.keys, self.values, r, flag)
        self.unsettled = True
        self.offset = prev + S
        if S == 1:   # later steps of this geometry take append_step
            self._step_append = _StepAppend(keys.shape, values.shape, keys.dtype, append,
                                            self.keys.shape[2] - lead)

    # ------------------------------------------------------------ key calibration on the lane
    def _calibration_buffer(self, heads: int):
        """The append kernel's ``kcal`` for the layer's key calibration (a device array, made once)."""
        import numpy as np

        from ..kv_append import calibration_rows

        buf = self._kcal
        if buf is None:
            layer = self.layer
            mu = None if layer.k_mu is None else np.array(layer.k_mu)
            s = None if layer.k_scale is None else np.array(layer.k_scale)
            buf = self._kcal = mx.array(calibration_rows(mu, s, heads, layer.k_dim).reshape(-1))
        return buf

    def query_scale(self, queries: mx.array) -> "mx.array | None":
        """The layer's key scales ``s`` shaped against ``queries`` (query heads share their KV head's),
        float32, ``(1, Hq, [1,] D)``; None without a key scale. Made once per query shape. The fused
        attention takes it as is (``q_scale``: pass 1 multiplies q by it as it loads q)."""
        s = self.layer.k_scale
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

    def scaled_query(self, queries: mx.array) -> mx.array:
        """``q * s`` made by MLX ops (``q`` itself without a key scale): the query of the paths off the
        lane; the lane's pass 1 makes the same bits from q and :meth:`query_scale`."""
        s = self.query_scale(queries)
        return queries if s is None else scaled_query(queries, s)

    # ------------------------------------------------------------ attention
    def attend_step(self, q: mx.array, scale: float) -> "mx.array | None":
        """The prepared decode step's fused attention when it applies (a step of the shape it was
        prepared for, no sinks; with the staged rows appended in the same call), else None."""
        hot = self._step_attend
        if hot is None or q.shape != hot.q_shape or scale != hot.scale:
            return None
        layer = self.layer
        layer.paths[hot.path] += 1
        d = self.staged
        if d is None or layer.k_scale is not None:
            return self._run(hot.launch, q)
        # the common step, inline: the staged rows appended and attended in one call
        self.staged = None
        self._flagbuf, out = hot.launch.with_append(d.append, d.keys, d.values, q, self._kbuf, self._vbuf, d.row,
                                                    self._flagbuf, self.offset - self.start)
        self.unsettled = True
        return out

    def _run(self, launch, q):
        d = self.staged
        if d is None:
            return launch(q, self.keys, self.values, self.offset - self.start, self.flag, q_scale=self.query_scale(q))
        self.staged = None
        self._flagbuf, out = launch.with_append(d.append, d.keys, d.values, q, self._kbuf, self._vbuf, d.row,
                                                self._flagbuf, self.offset - self.start, self.query_scale(q))
        self.unsettled = True
        return out

    def attend_fused(self, q: mx.array, scale: float, sinks) -> "mx.array | None":
        """The fused attention over the buffers through the layer's prepared launch (runtime length,
        rotations inside the kernel, ordered after the in-place appends by their flag; key scales
        multiplied into q by its pass 1); prepares the decode step for later steps. None where it does
        not apply (CPU, keys calibrated in the rotated basis or waiting for their calibration, a shape
        it refuses)."""
        layer = self.layer
        if self.keys is None or not self.owned:
            return None
        if layer.calibration and (layer.calibration.basis != "original" or layer.calibration_pending):
            return None
        sig = (tuple(q.shape), q.dtype, self.keys.shape[2], scale, sinks is not None)
        launch = self.launch
        if launch is None or self._launch_sig != sig:
            from .kernel import prepare_decode

            launch = prepare_decode(q, self.keys, self.values, k_format=layer.k_format, v_format=layer.v_format,
                                    scale=scale, window=layer.window, sinks=sinks, rotation=(layer.k_rot, layer.v_rot),
                                    backend="cpu-emulator" if gpu_backend() == "cpu-emulator" else "auto",
                                    options=layer.decode_options)
            self.launch, self._launch_sig = launch, sig
            if launch is None:
                return None
        if sinks is None:
            out = self._run(launch, q)
        else:
            out = launch(q, self.keys, self.values, self.offset - self.start, after=self.flag, sinks=sinks,
                         q_scale=self.query_scale(q))
        path = f"decode:{launch.backend}"
        layer.paths[path] += 1
        if sinks is None:   # later steps of this geometry take attend_step
            self._step_attend = _StepAttend(q.shape, scale, path, launch)
        return out
