"""TQCache: an mlx-lm KV cache that stores K and V as blocks of any registered format pair.

K and V may use different formats (asymmetric, e.g. ``q8_0`` keys with ``turbo3`` values). Rows are
quantized when they are appended and kept as raw block bytes, laid out as ``tqbridge.bridge.quantize``
lays them out: ``(B, n_kv_heads, capacity, row_bytes)`` uint8. A head dim that is not a multiple of
the format's block size is zero-padded to the next multiple (the TurboQuant forks' rule: 64 -> 128).

``update_and_fetch`` returns float K/V (the dequantized blocks, lazily built), so mlx-lm's own
attention works unchanged; :mod:`tqbridge.metal.lm.routing` sends decode steps to the fused kernel
instead. The class follows mlx-lm 0.32's cache protocol (``offset``, ``state``, ``meta_state``,
``from_state``, ``trim``, ``nbytes``, ``make_mask``, ``empty``), so ``save_prompt_cache`` /
``load_prompt_cache`` work; importing this module registers the class where mlx-lm's loader looks
classes up by name.

This module holds the formats, the key calibration, the mlx-lm protocol and :class:`BatchTQCache`
(one layer of several sequences: mlx-lm's batch protocol, which ``TQCache.merge`` enters). The layer's
blocks and its decode step belong to its :class:`~tqbridge.metal.attention.decoder.LayerDecoder`
(``cache.decoder``); :meth:`TQCache.attend` is the attention of a layer under the routing. The rows <->
blocks codecs are in :mod:`tqbridge.metal.codecs`, the K/V spellings in
:mod:`tqbridge.bridge.blocks.kv_spec` and the per-layer reports in :mod:`tqbridge.metal.lm.report`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import mlx.core as mx
from mlx_lm.models import cache as _mlx_cache

from tqbridge.bridge import FormatError, display_name, get_format
from tqbridge.bridge.blocks.kv_spec import (DEFAULT_FORMAT, CalibrationError, KeyCalibration, LayeredKV, kv_name,
                                     parse_layered_kv_spec, split_key_spec)
from tqbridge.bridge.blocks.registry import shown

from ..backend import emulated_decode_lane
from ..decode_options import DEFAULT_OPTIONS
from ..hadamard import hadamard_rotate
from .calibration import fit as _fit_calibration
from ..codecs import any_nonfinite, dequantizer, gpu_backend, padded_dim, quantizer, rotation_group
from ..attention.decoder import ROUTING_DEPTH, LayerDecoder, routing_active

__all__ = ["TQCache", "BatchTQCache", "SAVED_NAME", "make_cache", "make_layered_cache", "install_cache", "to_tqcache",
           "layer_count", "ROTATIONS", "DECODE_MODES"]

ROTATIONS = ("llama", "none")
# how TQCache.attend runs a decode step (route_attention's mode; see there)
DECODE_MODES = ("auto", "kernel", "reference", "sdpa")
_MAX_POSITIONS = (1 << 31) - 1   # MLX masks and RoPE offsets are int32
_MAX_DIM = 1 << 16


_FLOAT_DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}


def block_floats(blocks: mx.array, fmt: str) -> "mx.array | None":
    """The float fields of ``fmt`` blocks (uint8, last axis a row's bytes) as floats: every value of a
    float format; the fp16 ``d`` (and ``m``) leading each of ggml's legacy blocks (bridge/blocks/format_types.py's
    Layout); None for formats without such a view."""
    f = get_format(fmt)
    if f.kind == "float" and f.name in _FLOAT_DTYPES:
        return blocks.view(_FLOAT_DTYPES[f.name])
    if f.layout is not None and blocks.shape[-1] % f.type_size == 0:
        b = blocks.reshape(*blocks.shape[:-1], blocks.shape[-1] // f.type_size, f.type_size)
        return mx.contiguous(b[..., :4 if f.layout.has_m else 2]).view(mx.float16)
    return None


def _decode_backend(mode: str) -> "str | None":
    """The ``backend`` to pass to decode_attention for decode ``mode``, or None for dequantize + SDPA."""
    if mode == "sdpa":
        return None
    if mode in ("kernel", "reference"):
        return mode
    # auto: the fused kernel on a GPU; on CPU the dispatcher's MLX-ops reference, which measured
    # 2-25x faster than the kernel's CPU emulator (mode "kernel" takes the emulator).
    if mx.default_device() == mx.gpu or emulated_decode_lane():
        return "auto"
    return "reference"


class CacheStateError(ValueError):
    """A saved TQCache state this class cannot take (one line says why)."""


def _count(name: str, text, hi: int) -> int:
    if not (isinstance(text, str) and 0 < len(text) <= 20 and text.isascii() and text.isdigit()):
        raise CacheStateError(f"TQCache state: {name} must be a non-negative integer, got {shown(text)}")
    n = int(text)
    if n > hi:
        raise CacheStateError(f"TQCache state: {name} {n} is larger than {hi}")
    return n


class TQCache(_mlx_cache._BaseCache):
    """K/V cache of quantized blocks (one layer). ``window``: sliding-window size, or None.

    A windowed cache stores the positions ``[start, offset)``: rows no future query can see
    (older than ``offset - window + 1``) are dropped in batches of at least ``step`` rows, so
    its memory stays below ``window + step`` rows plus one prompt chunk, however long the context.
    """

    step = 256

    # how decode attention is planned and launched (tqbridge.metal.decode_options); a cache-wide value,
    # replaced (not mutated) to change it
    decode_options = DEFAULT_OPTIONS

    @property
    def q_precision(self) -> "str | None":
        """Decode attention's q precision (``decode_options.q_precision``; None: the backend's default)."""
        return self.decode_options.q_precision

    @q_precision.setter
    def q_precision(self, value: "str | None") -> None:
        self.decode_options = dataclasses.replace(self.decode_options, q_precision=value)

    def __init__(self, k_format: str = DEFAULT_FORMAT, v_format: str = DEFAULT_FORMAT, window: "int | None" = None,
                 rotation: str = "llama", calibration: "KeyCalibration | str | None" = None):
        self._setup(k_format, v_format, window, rotation, calibration)
        self.k_dim = None
        self.v_dim = None
        self.k_rot = 0        # Hadamard group applied to K rows before quantizing (0: none)
        self.v_rot = 0
        self.k_mu = None      # key calibration, (n_kv_heads, k_dim) float32 each, or None
        self.k_scale = None

    def _setup(self, k_format, v_format, window, rotation="llama", calibration=None) -> None:
        if not isinstance(calibration, KeyCalibration):
            calibration = KeyCalibration.parse(calibration)
        self.calibration = calibration
        if rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
        self.rotation = rotation
        self.k_format = display_name(get_format(k_format))
        self.v_format = display_name(get_format(v_format))
        if window is not None and int(window) <= 0:
            raise ValueError(f"window must be a positive number of positions, got {window}")
        self.window = None if window is None else int(window)
        self._kq, kq_path = quantizer(self.k_format)
        self._vq, vq_path = quantizer(self.v_format)
        self._kd, kd_path = dequantizer(self.k_format)
        self._vd, vd_path = dequantizer(self.v_format)
        self.codec_paths = {"k_append": kq_path, "v_append": vq_path,
                            "k_fetch": kd_path, "v_fetch": vd_path}
        self.paths: Counter = Counter()      # attention paths taken, filled by the routing
        self.decode_fallback: "str | None" = None
        old = self.__dict__.get("decoder")
        # the blocks of positions [start, offset) and the decode step
        self.decoder = LayerDecoder(self, old.grow_phase if old is not None else 0.0)
        self.calibration_note: "str | None" = None
        self._pending = None  # first chunk's float keys waiting for their queries (qscale)

    # the decoder's storage, as mlx-lm's caches name it
    keys = property(lambda self: self.decoder.keys, doc="K blocks (B, H, capacity, row bytes), uint8, or None")
    values = property(lambda self: self.decoder.values, doc="V blocks, as ``keys``")

    @property
    def offset(self) -> int:
        return self.decoder.offset

    @offset.setter
    def offset(self, n: int) -> None:
        self.decoder.offset = n

    @property
    def start(self) -> int:
        """Absolute position of stored row 0 (> 0 once a window dropped rows)."""
        return self.decoder.start

    @start.setter
    def start(self, n: int) -> None:
        self.decoder.start = n

    @property
    def grow_phase(self) -> float:
        """Where in its growth step this layer grows (:class:`LayerDecoder`)."""
        return self.decoder.grow_phase

    @grow_phase.setter
    def grow_phase(self, x: float) -> None:
        self.decoder.grow_phase = x

    @property
    def calibration_pending(self) -> bool:
        """A ``qscale`` calibration waits for the first queries (the first chunk's keys unquantized)."""
        return self._pending is not None

    def kernels_failed(self, reason: str) -> None:
        """The GPU decode lane's self-check failed here: the reference paths from now on, said in the reports."""
        self.decode_fallback = reason
        self.codec_paths["append_note"] = f"in-place append off: {reason}"
        self._kq, kq_path = quantizer(self.k_format, use_kernel=False)
        self._vq, vq_path = quantizer(self.v_format, use_kernel=False)
        self.codec_paths["k_append"], self.codec_paths["v_append"] = kq_path, vq_path

    # ------------------------------------------------------------ storage
    def _encode(self, x: mx.array, fmt: str, quant) -> mx.array:
        d = x.shape[-1]
        dp = padded_dim(fmt, d)
        if dp != d:
            x = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, dp - d)])
        return quant(x)

    def _decode(self, blocks: mx.array, fmt: str, deq, dim: int, dtype) -> mx.array:
        out = deq(blocks, padded_dim(fmt, dim))
        if out.shape[-1] != dim:
            out = out[..., :dim]
        return out.astype(dtype)

    # ------------------------------------------------------------ key calibration
    def _bcast(self, a: mx.array) -> mx.array:
        return a[None, :, None, :]

    def _key_rows(self, keys: mx.array) -> mx.array:
        """Float keys -> the rows to quantize: calibrated and rotated as configured."""
        if not self.calibration:
            return hadamard_rotate(keys, self.k_rot)
        rotated = self.calibration.basis == "rotated"
        x = keys.astype(mx.float32)
        if rotated:
            x = hadamard_rotate(x, self.k_rot)
        if self.k_mu is not None:
            x = x - self._bcast(self.k_mu)
        if self.k_scale is not None:
            x = x / self._bcast(self.k_scale)
        return x if rotated else hadamard_rotate(x, self.k_rot)

    def _key_values(self, rows: mx.array) -> mx.array:
        """Inverse of :meth:`_key_rows` on dequantized rows (float32)."""
        rotated = self.calibration.basis == "rotated"
        x = rows if rotated else hadamard_rotate(rows, self.k_rot)
        if self.k_scale is not None:
            x = x * self._bcast(self.k_scale)
        if self.k_mu is not None:
            x = x + self._bcast(self.k_mu)
        return hadamard_rotate(x, self.k_rot) if rotated else x

    def query_for_blocks(self, q: mx.array) -> mx.array:
        """``q`` (B, Hq, ..., D) such that ``q'.row = q.k - q.mu`` for the stored key rows."""
        rotated = self.calibration.basis == "rotated"
        s = self.decoder.query_scale(q)
        if s is None:
            return hadamard_rotate(q, self.k_rot)
        if rotated:
            return (hadamard_rotate(q, self.k_rot).astype(mx.float32) * s).astype(q.dtype)
        return hadamard_rotate(self.decoder.scaled_query(q), self.k_rot)

    # ------------------------------------------------------------ appends, the pending calibration, reads
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Store the rows of the next positions. Returns the dequantized K/V of the stored positions
        (lazy), or, under :func:`~tqbridge.metal.lm.routing.route_attention`, the rows as given: the
        routed attention (:meth:`attend`) reads the cache, not what this returns."""
        d = self.decoder
        if d.append_step(keys, values):   # the prepared decode step: one in-place append (or staged)
            self.paths["append"] += 1
            return (keys, values) if ROUTING_DEPTH.get() else self.fetch(keys.dtype)
        B, H, S, dk = keys.shape
        dv = values.shape[-1]
        if self.k_dim is None:
            self.k_dim, self.v_dim = int(dk), int(dv)
            if self.rotation == "llama":
                self.k_rot = rotation_group(self.k_format, self.k_dim, "k")
                self.v_rot = rotation_group(self.v_format, self.v_dim, "v")
            if self.calibration and self.k_mu is None and self.k_scale is None:
                if self.calibration.queries and routing_active():
                    self._pending = keys          # fitted when the routing brings the queries
                else:
                    if self.calibration.queries:
                        self.calibration_note = "qscale without the attention routing: key statistics only"
                    self._fit(keys, None)
        elif (dk, dv) != (self.k_dim, self.v_dim):
            raise ValueError(f"head dims changed from {(self.k_dim, self.v_dim)} to {(dk, dv)}")
        else:
            self.finish_calibration(None)
        if self.calibration and self.k_mu is None and self.k_scale is None and self._pending is None:
            raise ValueError("TQCache: key calibration is configured but missing (state without it?)")
        if S > 1:   # prompt chunks: NaN/inf refused before anything is stored (a sync; not the hot loop)
            self._refuse_nonfinite(keys, values)
        self.paths["append"] += 1
        append = d.in_place_append(keys, values)
        if append is not None:
            d.append_in_place(append, keys, values)
        else:
            if S == 1:  # decode steps: checked without a sync, reported at the next check (see check_finite)
                d.note_nonfinite(any_nonfinite(keys) | any_nonfinite(values))
            if self._pending is None:
                kb = self._encode(self._key_rows(keys), self.k_format, self._kq)
            else:  # placeholder rows of the right width, overwritten by finish_calibration
                kb = self._encode(mx.zeros(keys.shape, mx.float32), self.k_format, self._kq)
            d.write(kb, self._encode(hadamard_rotate(values, self.v_rot), self.v_format, self._vq))
        if routing_active():
            return keys, values
        return self.fetch(keys.dtype)

    def attend(self, queries: mx.array, *, scale: float, mask=None, sinks=None, mode: str = "auto") -> mx.array:
        """The attention of ``queries`` over this layer's stored positions (what the routing calls after
        :meth:`update_and_fetch`); records the path in ``paths``. One query row (a decode step): the
        fused kernel over the blocks where ``mode`` allows (``auto``: on a GPU, or the CPU emulator's
        decode lane; else :func:`tqbridge.metal.decode_attention`'s MLX-ops reference); otherwise, and for
        prompt chunks, the dequantized rows through ``mx.fast.scaled_dot_product_attention``. Prefill
        attends to the quantized rows of the chunk itself too (as llama.cpp, which writes the cache and
        then reads it), so results do not depend on how a prompt is chunked."""
        d = self.decoder
        if mode == "auto" and sinks is None:
            out = d.attend_step(queries, scale)   # the prepared decode step
            if out is not None:
                return out
        if mode not in DECODE_MODES:
            raise ValueError(f"decode mode must be one of {DECODE_MODES}, got {mode!r}")
        if self._pending is not None:     # qscale: the first chunk's keys wait for these queries
            self.finish_calibration(queries)
        decode = queries.shape[2] == 1
        backend = _decode_backend(mode) if decode else None
        if backend is not None:
            out = self._decode_kernel(queries, scale, sinks, backend)
            if out is not None:
                return out
            if mode == "kernel":
                why = self.decode_fallback or "tqbridge.metal.decode_attention is not installed"
                raise RuntimeError(f"decode mode 'kernel' asked for, but the kernel cannot run: {why}")
        keys, values = self.fetch(queries.dtype)
        self.paths["decode:dequant-sdpa" if decode else "prefill:dequant-sdpa"] += 1
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)

    def _decode_kernel(self, q: mx.array, scale: float, sinks, backend: str) -> "mx.array | None":
        """A decode step through the fused kernel: the decoder's prepared launch on a GPU (or the
        emulator's lane), else :func:`tqbridge.metal.decode_attention` on the blocks; None where it
        cannot run (the reason kept in ``decode_fallback``, said once)."""
        if self.decode_fallback:
            return None
        if sinks is not None and self.k_mu is not None:
            # Stored keys are k - mu: scores shift by q.mu per row, which softmax ignores, but the sink
            # logit would need the same shift. The dequantize path adds mu back and stays exact.
            self.decode_fallback = ("attention sinks with key mean calibration: the kernel's scores are "
                                    "shifted by q.mu, the sink logit is not")
            return None
        from tqbridge.metal.attention import decode_attention, last_run

        try:
            out = self.decoder.attend_fused(q, scale, sinks) if backend == "auto" else None
            if out is not None:
                return out
            start = max(0, self.offset - self.window) if self.window else 0
            kb, vb = self.blocks(start)
            B, Hq, _, D = q.shape
            kwargs = {"sinks": sinks} if sinks is not None else {}
            if self.decode_options != DEFAULT_OPTIONS:
                kwargs["options"] = self.decode_options
            if self.calibration:
                q = self.query_for_blocks(q)       # (H(q*s)).(H(k-mu)/s) = q.k - q.mu: same softmax
                rotation = None
            else:
                rotation = (self.k_rot, self.v_rot)   # inside decode_attention
            out = decode_attention(q.reshape(B, Hq, D), kb, vb, k_format=self.k_format, v_format=self.v_format,
                                   length=kb.shape[2], scale=scale, backend=backend, rotation=rotation, **kwargs)
        except Exception as e:  # a format or shape the kernel does not take: say so once, then fall back
            self.decode_fallback = f"{type(e).__name__}: {e}"
            return None
        if out.shape[-1] != self.v_dim:
            out = out[..., :self.v_dim]
        if self.calibration:
            out = hadamard_rotate(out, self.v_rot)  # the cache holds H.v: rotate the output back
        self.paths[f"decode:{last_run().get('backend') or 'kernel'}"] += 1
        return out.reshape(B, Hq, 1, self.v_dim).astype(q.dtype)

    def _refuse_nonfinite(self, keys: mx.array, values: mx.array) -> None:
        if bool((any_nonfinite(keys) | any_nonfinite(values)).item()):
            raise FormatError(f"TQCache({self.k_format}/{self.v_format}): NaN or infinity in the K/V rows "
                              "to append; nothing was stored")

    def _fit(self, keys: mx.array, queries: "mx.array | None") -> None:
        rotated = self.calibration.basis == "rotated"
        k = hadamard_rotate(keys, self.k_rot) if rotated else keys
        q = None
        if queries is not None:
            q = hadamard_rotate(queries, self.k_rot) if rotated else queries
        self.k_mu, self.k_scale = _fit_calibration(k, self.calibration, q)
        self.decoder.forget_calibration()

    def finish_calibration(self, queries: "mx.array | None") -> None:
        """Fit a pending ``qscale`` calibration from ``queries`` (None: keys only) and quantize
        the first chunk's keys with it. Nothing to do when no chunk is pending."""
        if self._pending is None:
            return
        keys, self._pending = self._pending, None
        if queries is None:
            self.calibration_note = "qscale: queries never reached the routing; key statistics only"
        self._fit(keys, queries)
        kb = self._encode(self._key_rows(keys), self.k_format, self._kq)
        self.keys[..., :kb.shape[2], :] = kb

    def blocks(self, start: int = 0) -> tuple[mx.array, mx.array]:
        """The K and V blocks of positions ``max(start, self.start):offset``."""
        self.finish_calibration(None)
        return self.decoder.blocks(start)

    def fetch(self, dtype=mx.float32, start: int = 0) -> tuple[mx.array, mx.array]:
        """Dequantized K and V of the stored positions from ``start`` (lazy: free if unused)."""
        kb, vb = self.blocks(start)
        k = self._decode(kb, self.k_format, self._kd, self.k_dim, mx.float32)
        k = self._key_values(k) if self.calibration else hadamard_rotate(k, self.k_rot)
        v = hadamard_rotate(self._decode(vb, self.v_format, self._vd, self.v_dim, mx.float32), self.v_rot)
        return k.astype(dtype), v.astype(dtype)

    # ------------------------------------------------------------ mlx-lm protocol
    def size(self) -> int:
        """Positions attention can see: ``offset``, at most the window (as mlx-lm's RotatingKVCache)."""
        return min(self.offset, self.window) if self.window else self.offset

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        """As mlx-lm's RotatingKVCache: a windowed cache is not once its window slid (``offset`` reached
        it), even while it still stores the older rows (they are dropped ``step`` at a time), so
        mlx-lm's prompt-cache store treats both alike. ``trim`` itself removes up to the stored rows."""
        if self.window:
            return self.offset < self.window and self.start == 0
        return self.start == 0

    def trim(self, n: int) -> int:
        return self.decoder.trim(n)

    def check_finite(self) -> None:
        """Raise :class:`FormatError` if a decode step appended NaN/inf K/V rows (see
        :meth:`LayerDecoder.check_finite`: one sync)."""
        self.decoder.check_finite()

    def make_mask(self, N: int, return_array: bool = False, window_size: "int | None" = None):
        """The attention mask of the next ``N`` queries. Keys are the stored positions
        ``[start, offset + N)``: offsets count from the start the next update keeps (the rule is
        deterministic, so every windowed layer agrees). As mlx-lm's RotatingKVCache, ``"causal"`` (a
        chunk) or None (a decode step) where no stored key is older than the window, else the explicit
        mask; a windowed TQCache needs that mask more often than RotatingKVCache, because it drops old
        rows ``step`` at a time instead of overwriting them, so up to ``step`` rows past the window
        stay stored."""
        window_size = window_size if window_size is not None else self.window
        o = self.offset - self.decoder.keep_from(self.offset)
        if window_size and not return_array and o + N <= window_size:
            return "causal" if N > 1 else None
        return _mlx_cache.create_attention_mask(N, offset=o, return_array=return_array, window_size=window_size)

    @property
    def meta_state(self) -> tuple:
        return (str(self.offset), self.k_format, self.v_format, str(self.k_dim or 0),
                str(self.v_dim or 0), str(self.window or 0), str(self.start), self.rotation,
                str(self.k_rot), str(self.v_rot)) + ((self.calibration.spec,) if self.calibration else ())

    @meta_state.setter
    def meta_state(self, v) -> None:
        # 10 fields, or 11 with the key calibration's spelling last (only when calibrated, so
        # uncalibrated states keep the layout they always had). Every field is checked before use:
        # a saved prompt cache is a file a user points at (docs/fuzzing.md).
        v = tuple(v)
        if len(v) == 10:
            v = v + ("none",)
        if len(v) != 11:
            raise CacheStateError(f"TQCache meta_state has 10 or 11 entries, got {len(v)}")
        offset, kf, vf, kd, vd, window, start, rotation, k_rot, v_rot, cal = v
        offset = _count("offset", offset, _MAX_POSITIONS)
        start = _count("start", start, offset)
        k_dim, v_dim = _count("K head dim", kd, _MAX_DIM), _count("V head dim", vd, _MAX_DIM)
        window = _count("window", window, _MAX_POSITIONS)
        k_rot, v_rot = _count("K rotation group", k_rot, _MAX_DIM), _count("V rotation group", v_rot, _MAX_DIM)
        if rotation not in ROTATIONS:
            raise CacheStateError(f"TQCache state: rotation must be one of {ROTATIONS}, got {shown(rotation)}")
        try:
            self._setup(kf, vf, window or None, rotation, cal)
        except (FormatError, CalibrationError, ValueError) as e:
            why = str(e)
            raise CacheStateError(f"TQCache state: {why if len(why) <= 300 else why[:300] + '...'}") from None
        if (k_dim == 0) != (v_dim == 0):
            raise CacheStateError("TQCache state: one head dim is known and the other is not")
        want = (0, 0)
        if k_dim and rotation == "llama":
            want = (rotation_group(self.k_format, k_dim, "k"), rotation_group(self.v_format, v_dim, "v"))
        if (k_rot, v_rot) != want:
            raise CacheStateError(f"TQCache state: rotation groups {k_rot}/{v_rot}, but {rotation} rotation of "
                                  f"{self.k_format}/{self.v_format} rows of {k_dim}/{v_dim} values uses "
                                  f"{want[0]}/{want[1]}")
        self.offset, self.start = offset, start
        self.k_rot, self.v_rot = k_rot, v_rot
        self.k_dim, self.v_dim = k_dim or None, v_dim or None

    @property
    def state(self):
        """(K blocks, V blocks, *meta_state): the valid rows only, so a saved cache is compact.
        A calibrated cache adds its key mean and scale (None where unused) after the V blocks."""
        self.check_finite()
        kb, vb = self.blocks() if self.keys is not None else (None, None)
        if not self.calibration:
            return (kb, vb, *self.meta_state)
        return (kb, vb, self.k_mu, self.k_scale, *self.meta_state)

    @state.setter
    def state(self, v) -> None:
        v = list(v)
        if len(v) == 12:          # uncalibrated: no calibration arrays, no spelling
            v = v[:2] + [None, None] + v[2:] + ["none"]
        if len(v) != 15:
            raise CacheStateError(f"TQCache state has 12 entries (15 when calibrated), got {len(v)}")
        keys, values, mu, scale, *meta = v
        self.meta_state = tuple(str(m) for m in meta)
        for name, a in (("K blocks", keys), ("V blocks", values), ("key mean", mu), ("key scale", scale)):
            if a is not None and not isinstance(a, mx.array):
                raise CacheStateError(f"TQCache state: {name} must be an array, got {type(a).__name__}")
        if (keys is None) != (values is None):
            raise CacheStateError("TQCache state: K blocks and V blocks must be both present or both absent")
        H = None
        if keys is not None:
            if self.k_dim is None:
                raise CacheStateError("TQCache state: blocks without head dims")
            if keys.ndim != 4 or values.ndim != 4 or keys.dtype != mx.uint8 or values.dtype != mx.uint8:
                raise CacheStateError("TQCache state: K and V blocks must be uint8 arrays (batch, heads, rows, bytes)")
            if keys.shape[:3] != values.shape[:3]:
                raise CacheStateError(f"TQCache state: K blocks {keys.shape} and V blocks {values.shape} differ in "
                                      "batch, heads or rows")
            H = keys.shape[1]
            if not 0 <= self.offset - self.start <= keys.shape[2]:
                raise CacheStateError(f"TQCache state: positions {self.start}..{self.offset} do not fit the "
                                      f"{keys.shape[2]} stored rows")
            krb = get_format(self.k_format).row_bytes(padded_dim(self.k_format, self.k_dim))
            vrb = get_format(self.v_format).row_bytes(padded_dim(self.v_format, self.v_dim))
            if (keys.shape[3], values.shape[3]) != (krb, vrb):
                raise CacheStateError(f"TQCache state: rows of {keys.shape[3]}/{values.shape[3]} bytes; "
                                      f"{self.k_format}/{self.v_format} rows of {self.k_dim}/{self.v_dim} values "
                                      f"take {krb}/{vrb}")
        elif self.offset != self.start:
            raise CacheStateError(f"TQCache state: positions {self.start}..{self.offset} but no blocks")
        for name, a in (("key mean", mu), ("key scale", scale)):
            if a is not None and (a.ndim != 2 or a.dtype != mx.float32 or a.shape[1] != self.k_dim
                                  or (H is not None and a.shape[0] != H)):
                raise CacheStateError(f"TQCache state: {name} has shape {a.shape} ({a.dtype}), expected float32 "
                                      f"({H or 'heads'}, {self.k_dim})")
        if (mu is not None) != self.calibration.mean or (scale is not None) != self.calibration.scale:
            if keys is not None or mu is not None or scale is not None:
                raise CacheStateError(f"TQCache state: calibration arrays do not match "
                                      f"{self.calibration.spec or 'no calibration'}")
        for name, a in (("key mean", mu), ("key scale", scale)):
            if a is not None and bool(any_nonfinite(a).item()):
                raise CacheStateError(f"TQCache state: the {name} holds NaN or infinite values")
        if scale is not None and bool(mx.any(scale == 0).item()):
            raise CacheStateError("TQCache state: the key scale holds zeros (keys are divided by it)")
        if keys is not None:
            self._refuse_nonfinite_blocks(keys, values)
        self.k_mu, self.k_scale = mu, scale
        self.decoder.load(keys, values, self.offset, self.start)

    _CHECK_ROWS = 4096   # rows dequantized at a time when a loaded state's blocks are checked

    def _refuse_nonfinite_blocks(self, keys: mx.array, values: mx.array) -> None:
        """A state's blocks must decode to finite rows (appends refuse NaN/inf rows, so only an edited
        file holds them: a block scale set to NaN or infinity). Float formats: their values are read as
        floats; ggml's legacy blocks: their fp16 ``d`` (and ``m``) fields, which a row decodes finite
        exactly when they are; other formats (turbo): one dequantizing pass. ``_CHECK_ROWS`` rows at a
        time, one sync."""
        n = self.offset - self.start
        bad = mx.array(False)
        for a in range(0, n, self._CHECK_ROWS):
            b = min(n, a + self._CHECK_ROWS)
            for blocks, fmt, deq, dim in ((keys, self.k_format, self._kd, self.k_dim),
                                          (values, self.v_format, self._vd, self.v_dim)):
                rows = blocks[..., a:b, :]
                floats = block_floats(rows, fmt)
                if floats is None:
                    floats = self._decode(rows, fmt, deq, dim, mx.float32)
                bad = bad | any_nonfinite(floats)
            if (b // self._CHECK_ROWS) % 8 == 0:
                mx.eval(bad)   # bounds the graph of a long cache
        if bool(bad.item()):
            raise CacheStateError(f"TQCache state: {self.k_format}/{self.v_format} blocks decode to NaN or "
                                  "infinite values (a block scale that no append writes)")

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the live block arrays (including preallocated rows)."""
        if self.keys is None:
            return 0
        return self.decoder.nbytes + self.calibration_nbytes

    @property
    def used_nbytes(self) -> int:
        """Bytes of the valid rows of the live block arrays (plus the key calibration arrays)."""
        if self.keys is None:
            return 0
        kb, vb = self.blocks()
        return kb.nbytes + vb.nbytes + self.calibration_nbytes

    @property
    def calibration_nbytes(self) -> int:
        return sum(a.nbytes for a in (self.k_mu, self.k_scale) if a is not None)

    def to_quantized(self, group_size: int = 64, bits: int = 4):
        """Refused: mlx-lm's ``kv_bits`` turns its float caches into QuantizedKVCaches (it calls this on
        every cache that has it); a TQCache is quantized in its own pair already."""
        raise ValueError(f"kv_bits={bits}: {self!r} is quantized already ({self.k_format}/{self.v_format}); "
                         "kv_bits applies to mlx-lm's own caches: drop it, or choose the pair")

    # ------------------------------------------------------------ from mlx-lm's caches
    @classmethod
    def from_cache(cls, cache: Any, k_format: str = DEFAULT_FORMAT, v_format: "str | None" = None, *,
                   rotation: str = "llama", calibration: "KeyCalibration | str | None" = None) -> "TQCache":
        """A TQCache of the pair holding the positions of one of mlx-lm's caches (as mlx-lm's
        ``to_quantized`` makes a QuantizedKVCache): a ``KVCache``, a ``QuantizedKVCache`` (its rows
        dequantized first) or a ``RotatingKVCache`` without kept leading tokens (a windowed TQCache of
        its size, holding the positions it holds). The rows are quantized as appends quantize them; a
        calibration is fitted on them."""
        if isinstance(cache, TQCache):
            raise ValueError("from_cache takes one of mlx-lm's caches; a TQCache is one already")
        k_format, k_cal = split_key_spec(k_format)
        v_format = k_format if v_format is None else v_format
        calibration = k_cal or calibration
        window = None
        if type(cache) is _mlx_cache.RotatingKVCache:
            if cache.keep:
                raise ValueError(f"a RotatingKVCache keeping {cache.keep} leading tokens cannot become a TQCache "
                                 "(windowed TQCaches keep none)")
            window = cache.max_size
        elif type(cache) not in (_mlx_cache.KVCache, _mlx_cache.QuantizedKVCache):
            raise ValueError(f"{type(cache).__name__} cannot become a TQCache (KVCache, QuantizedKVCache and "
                             "RotatingKVCache can)")
        out = cls(k_format, v_format, window=window, rotation=rotation, calibration=calibration)
        if cache.empty() or cache.offset == 0:
            return out
        if type(cache) is _mlx_cache.QuantizedKVCache:
            deq = [mx.dequantize(*(a[..., :cache.offset, :] for a in t), group_size=cache.group_size,
                                 bits=cache.bits) for t in (cache.keys, cache.values)]
            keys, values = deq
        elif window:
            keys, values = (cache._temporal_order(a) for a in (cache.keys, cache.values))
            n = min(cache.offset, keys.shape[2])
            keys, values = keys[..., -n:, :], values[..., -n:, :]
            out.offset = out.start = cache.offset - n
        else:
            keys, values = cache.keys[..., :cache.offset, :], cache.values[..., :cache.offset, :]
        out.update_and_fetch(keys, values)
        return out

    # ------------------------------------------------------------ copies
    @classmethod
    def merge(cls, caches: list) -> "BatchTQCache":
        """One batch cache of these single-sequence TQCaches (mlx-lm's batch generation calls this):
        :class:`BatchTQCache`, which refuses in one line what cannot batch."""
        return BatchTQCache.merge(caches)

    def __copy__(self) -> "TQCache":
        return self._twin()

    def __deepcopy__(self, memo: dict) -> "TQCache":
        twin = self._twin()
        memo[id(self)] = twin
        return twin

    def _twin(self) -> "TQCache":
        """An independent cache holding the same positions: its own decoder with its own block buffers
        (the valid rows copied into fresh arrays, evaluated now), its own counters, nothing prepared.
        ``copy.copy`` and ``copy.deepcopy`` both give this: the decoder writes its buffers in place (the
        append kernel, and ``keys[...] = rows`` on the ops path), so a copy sharing them would see the
        other's appends after a trim. What is never written in place is shared: the key calibration
        arrays, a pending first chunk's float keys, the codecs."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.paths = Counter(self.paths)
        twin.codec_paths = dict(self.codec_paths)
        twin.decoder = self.decoder.twin(twin)
        return twin

    def __repr__(self) -> str:
        w = f", window={self.window}" if self.window else ""
        return f"TQCache({kv_name(self.k_format, self.v_format, self.calibration)}{w}, offset={self.offset}, start={self.start})"


# mlx-lm's save_prompt_cache writes each layer's class name (``type(c).__name__``) into the file and its
# load_prompt_cache looks the names up in its cache module's globals, with no hook for other packages: a
# file of TQCache layers opened by mlx-lm without tqbridge imported ends in a KeyError naming the class.
# So the name TQCache saves under says what opens it; importing this module registers both that name
# and "TQCache" (files written before 2026-12-06) where mlx-lm looks.
SAVED_NAME = ("TQCache (a tqbridge cache: open it with `tqbridge generate MODEL --prompt-cache-file FILE`, "
              "or import tqbridge.metal.lm.cache before mlx-lm loads it)")
TQCache.__name__ = SAVED_NAME      # __qualname__ stays "TQCache" (reprs, pickling)
for _alias in ("TQCache", SAVED_NAME):
    if getattr(_mlx_cache, _alias, TQCache) is not TQCache:  # pragma: no cover
        raise ImportError(f"mlx_lm.models.cache already defines a different {_alias}")
    setattr(_mlx_cache, _alias, TQCache)


def _refusing_tqcache(cls_name: str, merge):
    """mlx-lm's batch cache ``merge`` that refuses TQCache layers: it copies each cache's ``keys`` /
    ``values`` as K/V rows, and a TQCache's are quantized blocks (uint8), which it would take silently."""
    func = merge.__func__

    def guarded(cls, caches):
        for c in caches:
            if isinstance(c, TQCache):
                raise ValueError(f"{cls_name}.merge: {c!r} holds quantized blocks, not K/V rows; batch TQCache "
                                 "layers with TQCache.merge (mlx-lm's batch generation calls it)")
        return func(cls, caches)

    guarded.__wrapped__ = func
    guarded._tqbridge_refuses_tqcache = True
    return classmethod(guarded)


for _name in ("BatchKVCache", "BatchRotatingKVCache"):
    _cls = getattr(_mlx_cache, _name, None)
    _merge = vars(_cls).get("merge") if _cls is not None else None
    if isinstance(_merge, classmethod) and not getattr(_merge.__func__, "_tqbridge_refuses_tqcache", False):
        _cls.merge = _refusing_tqcache(_name, _merge)


def make_cache(model: Any, k_format: str = DEFAULT_FORMAT, v_format: "str | None" = None,
               *, sliding: str = "quantize", rotation: str = "llama",
               calibration: "KeyCalibration | str | None" = None, max_kv_size: "int | None" = None) -> list:
    """A prompt cache for ``model`` with K in ``k_format`` and V in ``v_format``.

    Layers mlx-lm gives a plain ``KVCache`` get a :class:`TQCache`. Sliding-window layers
    (``RotatingKVCache``, e.g. Gemma 3's local layers) get a windowed TQCache when
    ``sliding="quantize"`` or keep mlx-lm's float rotating cache when ``sliding="float"``;
    :func:`cache_report` says which. Other cache kinds (SSM state) are kept as they are.
    ``rotation="llama"`` rotates K/V rows of ggml quantized formats by a Hadamard matrix before
    quantizing, as llama.cpp does by default (see :func:`rotation_group`); ``"none"`` does not.
    ``calibration`` (e.g. ``"mean+scale"``, or written on the K format: ``"q5_1+mean+scale"``)
    turns on per-channel key calibration, fitted per layer from its first keys
    (:mod:`tqbridge.metal.lm.calibration`). Per-layer pairs: :func:`make_layered_cache`.
    ``max_kv_size``: a bounded cache, every quantized layer windowed to at most that many positions (as
    mlx-lm's ``max_kv_size`` makes RotatingKVCaches, but keeping no leading tokens: mlx-lm keeps 4).
    """
    k_format, k_cal = split_key_spec(k_format)
    v_format = k_format if v_format is None else v_format
    cal = KeyCalibration.parse(calibration) if not isinstance(calibration, KeyCalibration) else calibration
    if k_cal and cal and k_cal != cal:
        raise ValueError(f"two different key calibrations: {k_cal.spec!r} and {cal.spec!r}")
    cal = k_cal or cal
    return _build(model, lambda i: (k_format, v_format, cal), sliding, rotation, max_kv_size)


def make_layered_cache(model: Any, spec: "LayeredKV | str", *, sliding: str = "quantize",
                       rotation: str = "llama", max_kv_size: "int | None" = None) -> list:
    """A prompt cache whose layer ``i`` stores K/V in the pair ``spec`` gives it: a
    :class:`~tqbridge.bridge.blocks.kv_spec.LayeredKV` or its spelling (``q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]``;
    a plain pair spelling gives every layer that pair). Layer indices count the model's cache entries
    (one per layer); an index out of range or a layer named twice raises a one-line FormatError.
    Otherwise as :func:`make_cache` (a layer kept in float by ``sliding="float"`` stays float whatever
    its pair)."""
    if not isinstance(spec, LayeredKV):
        spec = parse_layered_kv_spec(spec)
    pairs = spec.pairs(layer_count(model))
    return _build(model, pairs.__getitem__, sliding, rotation, max_kv_size)


def layer_count(model: Any) -> int:
    """The number of cache entries (layers) mlx-lm makes for ``model``: what per-layer indices count."""
    return len(_mlx_cache.make_prompt_cache(model))


def _build(model: Any, pair_of, sliding: str, rotation: str, max_kv_size: "int | None" = None) -> list:
    """mlx-lm's prompt cache for ``model`` with each plain / sliding-window layer ``i`` replaced by a
    TQCache of ``pair_of(i)`` = (K format, V format, KeyCalibration)."""
    return _replace(_mlx_cache.make_prompt_cache(model), pair_of, sliding, rotation, max_kv_size)


def _replace(base: list, pair_of, sliding: str, rotation: str, max_kv_size: "int | None" = None) -> list:
    """``base`` (mlx-lm's caches of a model) with each plain / sliding-window layer ``i`` replaced by a
    TQCache of ``pair_of(i)`` (windowed to at most ``max_kv_size`` positions when given)."""
    if sliding not in ("quantize", "float"):
        raise ValueError(f"sliding must be 'quantize' or 'float', got {sliding!r}")
    if max_kv_size is not None and (isinstance(max_kv_size, bool) or int(max_kv_size) < 1):
        raise ValueError(f"max_kv_size must be a positive number of positions, got {max_kv_size!r}")
    out = []
    for i, c in enumerate(base):
        if type(c) is _mlx_cache.KVCache:
            k, v, cal = pair_of(i)
            out.append(TQCache(k, v, window=max_kv_size, rotation=rotation, calibration=cal))
        elif type(c) is _mlx_cache.RotatingKVCache and sliding == "quantize":
            if c.keep:
                raise ValueError("rotating caches that keep leading tokens are not supported")
            k, v, cal = pair_of(i)
            window = c.max_size if max_kv_size is None else min(c.max_size, int(max_kv_size))
            out.append(TQCache(k, v, window=window, rotation=rotation, calibration=cal))
        else:
            out.append(c)
    ours = [c for c in out if isinstance(c, TQCache)]
    for i, c in enumerate(ours):   # the layers grow in different decode steps (LayerDecoder.grow_phase)
        c.grow_phase = i / len(ours)
    return out


def install_cache(model: Any, spec: "LayeredKV | str", *, sliding: str = "quantize", rotation: str = "llama") -> None:
    """Make ``model.make_cache()`` (what mlx-lm's ``make_prompt_cache`` calls, in its generate, server and
    batch paths) return :func:`make_layered_cache`'s TQCache layers. Each call builds the model's own
    layout first (its ``make_cache``, or one ``KVCache`` per layer as mlx-lm makes for a model without
    one) and replaces its plain / sliding-window layers. Bad spellings and layer indices are refused
    here, once."""
    if not isinstance(spec, LayeredKV):
        spec = parse_layered_kv_spec(spec)
    pairs = spec.pairs(layer_count(model))
    _replace(_mlx_cache.make_prompt_cache(model), pairs.__getitem__, sliding, rotation)   # refuses now, not later
    own = getattr(model, "make_cache", None)

    def make_cache() -> list:
        base = own() if own is not None else [_mlx_cache.KVCache() for _ in model.layers]
        return _replace(base, pairs.__getitem__, sliding, rotation)

    model.make_cache = make_cache


def to_tqcache(prompt_cache: list, spec: "LayeredKV | str", *, start: int = 0, rotation: str = "llama") -> list:
    """Convert, in place, the layers of ``prompt_cache`` (mlx-lm's caches) that hold more than ``start``
    positions into TQCaches of the pairs ``spec`` gives them (:meth:`TQCache.from_cache`): what mlx-lm's
    ``kv_bits`` + ``quantized_kv_start`` do with QuantizedKVCache, so a generation can begin in float
    and continue quantized. Layers already TQCache, or of kinds that cannot convert (SSM state), stay.
    Returns the list."""
    if not isinstance(spec, LayeredKV):
        spec = parse_layered_kv_spec(spec)
    pairs = spec.pairs(len(prompt_cache))
    for i, c in enumerate(prompt_cache):
        if isinstance(c, TQCache) or c.offset <= start:
            continue
        if type(c) in (_mlx_cache.KVCache, _mlx_cache.QuantizedKVCache) or \
                (type(c) is _mlx_cache.RotatingKVCache and not c.keep):
            k, v, cal = pairs[i]
            prompt_cache[i] = TQCache.from_cache(c, k, v, rotation=rotation, calibration=cal)
    return prompt_cache


# ------------------------------------------------------------ batches
class BatchError(ValueError):
    """TQCaches that cannot share one batch cache (one line says why)."""


def _batch_config(c: TQCache) -> tuple:
    return (c.k_format, c.v_format, c.window, c.rotation, c.calibration.spec if c.calibration else None)


class BatchTQCache(_mlx_cache._BaseCache):
    """Several sequences' K/V blocks of one TQCache layer, as one cache (mlx-lm's batch protocol, as its
    ``BatchKVCache`` / ``BatchRotatingKVCache`` define it): ``(B, n_kv_heads, capacity, row_bytes)`` uint8,
    left-padded: row ``b`` holds its positions in stored rows ``[left_padding[b], _idx)``.

    Blocks are per position and independent of it, so merging, padding, rolling, filtering and
    extracting copy block rows exactly. ``update_and_fetch`` quantizes the new rows with the layer's
    codecs (a TQCache of the same configuration, ``template``) and returns the dequantized K/V of the
    stored rows; mlx-lm's attention with :meth:`make_mask` (causal, left padding, window) computes the
    result (the routing sends only TQCache layers to its path). ``left_padding`` stays an ``mx.array``
    and the stored length ``_idx`` an int: a fused decode step takes per-row starts from them.

    A windowed layer stores its rows in temporal order and drops rows no query can see any more at
    least ``step`` at a time (as TQCache does), before an update; :meth:`make_mask` applies the same rule.
    """

    step = 256

    def __init__(self, template: TQCache, left_padding: "list[int]"):
        self.template = template        # configuration, dims, rotation groups, calibration, codecs
        self.keys = None
        self.values = None
        self.left_padding = mx.array(left_padding, dtype=mx.int32)
        self.offset = mx.array([-p for p in left_padding], dtype=mx.int32)
        self._idx = 0
        self._right_padding: "list[int] | None" = None
        self._ends: "list[int] | None" = None    # stored rows each sequence's prompt ends at (right padding)
        self.dropped = 0                          # rows a window dropped (then no longer trimmable)
        self._starts_memo = None                  # (id of left_padding, its values as ints): see _starts
        self._launch_memo = None                  # (signature, the prepared fused attention): see attend
        self._flag = None          # the in-place appends' flag (device-side NaN/inf of their rows): see _settle
        self._unsettled = False    # in-place appends nothing but the flag orders (see _settle)
        self._owned = False        # the buffers are this batch's own allocations (in-place appends write there)

    @property
    def window(self) -> "int | None":
        return self.template.window

    @property
    def launch(self):
        """The prepared fused attention of the latest decode step (None before one, or off the kernel)."""
        return self._launch_memo[1] if self._launch_memo else None

    @property
    def k_format(self) -> str:
        return self.template.k_format

    @property
    def v_format(self) -> str:
        return self.template.v_format

    def __repr__(self) -> str:
        w = f", window={self.window}" if self.window else ""
        return (f"BatchTQCache({kv_name(self.k_format, self.v_format, self.template.calibration)}{w}, "
                f"batch={self.offset.shape[0]}, rows={self._idx})")

    # ------------------------------------------------------------ merge / extract
    @classmethod
    def merge(cls, caches: list) -> "BatchTQCache":
        """The batch of these single-sequence TQCaches (left-padded to the longest); refused in one line
        where they differ in pair, window, rotation, head dims or heads, or hold calibrated keys that are
        not identical (each sequence fits its own calibration from its own keys)."""
        caches = list(caches)
        if not caches:
            raise BatchError("BatchTQCache.merge: no caches")
        for c in caches:
            if not isinstance(c, TQCache):
                raise BatchError(f"BatchTQCache.merge: {type(c).__name__} is not a TQCache; a batch holds one kind")
            if c.keys is not None and c.keys.shape[0] != 1:
                raise BatchError(f"BatchTQCache.merge: {c!r} holds {c.keys.shape[0]} sequences; merge takes one each")
        first = caches[0]
        for c in caches[1:]:
            if _batch_config(c) != _batch_config(first):
                raise BatchError(f"BatchTQCache.merge: {c!r} and {first!r} differ in pair, window, rotation or "
                                 "calibration; one batch holds one configuration")
        full = [c for c in caches if c.keys is not None]
        dims = {(c.k_dim, c.v_dim, c.k_rot, c.v_rot, c.keys.shape[1]) for c in full}
        if len(dims) > 1:
            raise BatchError(f"BatchTQCache.merge: head dims / heads differ between the caches: {sorted(dims)}")
        template = TQCache(first.k_format, first.v_format, window=first.window, rotation=first.rotation,
                           calibration=first.calibration)
        template.grow_phase = first.grow_phase
        template.decode_options = first.decode_options
        if first.calibration:
            ref = None
            for c in caches:
                if c._pending is not None or (c.k_mu is None and c.k_scale is None):
                    raise BatchError(f"BatchTQCache.merge: {c!r} calibrates its keys from its own first keys; "
                                     "calibrated sequences batch only with an identical fitted calibration")
                cal = (c.k_mu, c.k_scale)
                if ref is None:
                    ref = cal
                elif not all((a is None and b is None) or (a is not None and b is not None and
                                                           bool(mx.array_equal(a, b).item())) for a, b in zip(ref, cal)):
                    raise BatchError(f"BatchTQCache.merge: {c!r} has another key calibration than {first!r} "
                                     "(each sequence fits its own); calibrated sequences batch only when identical")
            template.k_mu, template.k_scale = ref
        if full:
            c = full[0]
            template.k_dim, template.v_dim, template.k_rot, template.v_rot = c.k_dim, c.v_dim, c.k_rot, c.v_rot
        lengths = [c.offset - c.start if c.keys is not None else 0 for c in caches]
        n = max(lengths)
        out = cls(template, [n - m for m in lengths])
        out.offset = mx.array([c.offset if c.keys is not None else 0 for c in caches], dtype=mx.int32)
        if n == 0:
            return out
        H = full[0].keys.shape[1]
        cap = -(-n // cls.step) * cls.step
        ks, vs = [], []
        for c, m in zip(caches, lengths):
            kb, vb = c.blocks() if c.keys is not None else (None, None)
            for parts, b in ((ks, kb), (vs, vb)):
                rb = (full[0].keys if parts is ks else full[0].values).shape[-1]
                seg = [mx.zeros((1, H, n - m, rb), mx.uint8)]
                if m:
                    seg.append(b)
                seg.append(mx.zeros((1, H, cap - n, rb), mx.uint8))
                parts.append(mx.concatenate(seg, axis=2))
        out.keys, out.values = mx.concatenate(ks, axis=0), mx.concatenate(vs, axis=0)
        out._owned = True   # concatenate allocated them
        out._idx = n
        return out

    def extract(self, idx: int) -> TQCache:
        """Sequence ``idx`` as a single-sequence TQCache holding its positions in its own buffers."""
        t = self.template
        c = TQCache(t.k_format, t.v_format, window=t.window, rotation=t.rotation, calibration=t.calibration)
        c.grow_phase, c.decode_options = t.grow_phase, t.decode_options
        c.k_dim, c.v_dim, c.k_rot, c.v_rot, c.k_mu, c.k_scale = t.k_dim, t.v_dim, t.k_rot, t.v_rot, t.k_mu, t.k_scale
        self._settle()
        mx.eval(self.left_padding, self.offset)
        offset = int(self.offset[idx].item())
        pad = max(0, int(self.left_padding[idx].item())) if self.keys is not None else 0
        n = self._idx - pad
        if self.keys is None or n <= 0:
            c.offset = c.start = max(offset, 0)
            return c
        cap = max(n, -(-n // c.step) * c.step)
        B, H, _, krb = self.keys.shape
        vrb = self.values.shape[-1]
        # concatenate allocates its output: the TQCache never shares a buffer with the batch
        kb = mx.concatenate([self.keys[idx:idx + 1, :, pad:self._idx], mx.zeros((1, H, cap - n, krb), mx.uint8)], axis=2)
        vb = mx.concatenate([self.values[idx:idx + 1, :, pad:self._idx], mx.zeros((1, H, cap - n, vrb), mx.uint8)],
                            axis=2)
        mx.eval(kb, vb)
        c.decoder.load(kb, vb, offset, offset - n)
        c.decoder.owned = True   # fresh arrays of its own: in-place appends may write them
        return c

    def __deepcopy__(self, memo: dict) -> "BatchTQCache":
        self._settle()
        twin = object.__new__(type(self))
        memo[id(self)] = twin
        twin.__dict__.update(self.__dict__)
        # neither batch writes in place again before it has copied its buffers into allocations of its
        # own (what mx.array makes of a lazy array is not promised to be a new buffer)
        self._owned = twin._owned = False
        twin.template = self.template._twin()
        for name in ("keys", "values", "left_padding", "offset"):
            a = getattr(self, name)
            # fresh arrays (slice assignment rebinds an array object in place: never share one)
            setattr(twin, name, None if a is None else mx.array(a))
        for name in ("_right_padding", "_ends"):
            a = getattr(self, name)
            setattr(twin, name, None if a is None else list(a))
        return twin

    def __copy__(self) -> "BatchTQCache":
        return self.__deepcopy__({})   # a shallow copy would share the block arrays (written by slice)

    # ------------------------------------------------------------ rows
    def _drop_for(self) -> int:
        """Rows of a windowed layer the next update drops first: those older than any query to come can
        see (the earliest next query: the stored end, or a right-padded prompt's shortest end), when
        they are at least ``step``."""
        if not self.window or self.keys is None:
            return 0
        first = min([self._idx] + (self._ends or []))
        need = first - self.window + 1
        return need if need >= self.step else 0

    def _setup_dims(self, dk: int, dv: int) -> None:
        t = self.template
        if t.k_dim is None:
            t.k_dim, t.v_dim = dk, dv
            if t.rotation == "llama":
                t.k_rot = rotation_group(t.k_format, dk, "k")
                t.v_rot = rotation_group(t.v_format, dv, "v")
        elif (dk, dv) != (t.k_dim, t.v_dim):
            raise ValueError(f"head dims changed from {(t.k_dim, t.v_dim)} to {(dk, dv)}")
        if t.calibration and t.k_mu is None and t.k_scale is None:
            raise BatchError("BatchTQCache: a batch cannot fit a key calibration (each sequence fits its own)")

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        t = self.template
        B, H, S, dk = keys.shape
        self._setup_dims(int(dk), int(values.shape[-1]))
        if S == 1 and self._append_in_place(keys, values):
            return keys, values
        self._settle()
        if S > 1:
            t._refuse_nonfinite(keys, values)
        kb = t._encode(t._key_rows(keys), t.k_format, t._kq)
        vb = t._encode(hadamard_rotate(values, t.v_rot), t.v_format, t._vq)
        drop = self._drop_for()
        if drop:
            self.keys = mx.contiguous(self.keys[..., drop:self._idx, :])
            self.values = mx.contiguous(self.values[..., drop:self._idx, :])
            self._idx -= drop
            self.dropped += drop
            self.left_padding = mx.maximum(self.left_padding - drop, 0)
            if self._ends is not None:
                self._ends = [e - drop for e in self._ends]
        prev = self._idx
        cap = 0 if self.keys is None else self.keys.shape[2]
        if prev + S > cap:
            new = -(-(prev + S) // self.step) * self.step
            grow = [mx.zeros((B, H, new - prev, b.shape[-1]), mx.uint8) for b in (kb, vb)]
            if self.keys is None:
                self.keys, self.values = grow
            else:
                self.keys = mx.concatenate([self.keys[..., :prev, :], grow[0]], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], grow[1]], axis=2)
        self.keys[..., prev:prev + S, :] = kb
        self.values[..., prev:prev + S, :] = vb
        self._idx = prev + S
        self.offset = self.offset + S
        if routing_active():   # the routed attention (:meth:`attend`) reads the stored rows itself
            return keys, values
        return self.fetch(keys.dtype)

    def _append_in_place(self, keys: mx.array, values: mx.array) -> bool:
        """A decode step's rows (one per sequence) written into the buffers by the template's in-place
        append kernel (the GPU lane, or the emulator's), ordered before the fused attention by its flag:
        one kernel instead of two quantize kernels and two slice updates. False where it does not apply
        (not routed, calibrated keys, a window drop or a right-padded prompt due, no kernel for these
        rows, the attention off the kernel); then MLX ops append."""
        t = self.template
        if (self.keys is None or t.calibration or t.decode_fallback or self._right_padding is not None
                or not routing_active() or _decode_backend("auto") != "auto" or self._drop_for()):
            return False
        app = t.decoder.in_place_append(keys, values)
        if app is None:
            return False
        B, H = keys.shape[:2]
        prev, cap = self._idx, self.keys.shape[2]
        if not self._owned or prev + 1 > cap:
            self._settle()
            new = max(cap, -(-(prev + 1) // self.step) * self.step)
            # concatenate allocates its output: buffers no other array shares, which the kernel may write
            self.keys = mx.concatenate([self.keys[..., :prev, :],
                                        mx.zeros((B, H, new - prev, self.keys.shape[-1]), mx.uint8)], axis=2)
            self.values = mx.concatenate([self.values[..., :prev, :],
                                          mx.zeros((B, H, new - prev, self.values.shape[-1]), mx.uint8)], axis=2)
            self._owned = True
        slots = app.flag_slots(B * H)
        if self._flag is None or self._flag.shape[0] != slots:
            self._settle()
            self._flag = mx.zeros((slots,), mx.uint32)
        self._flag = app(keys, values, self.keys, self.values, prev, self._flag)
        self._unsettled = True
        self._idx = prev + 1
        self.offset = self.offset + 1
        t.paths["append:in-place"] += 1
        return True

    def _settle(self) -> None:
        """Before MLX ops read or replace the buffers: wait for the in-place appends (MLX orders nothing
        after them but what takes their flag) and raise :class:`FormatError` if they appended NaN/inf rows
        (their blocks are unspecified). One synchronisation; decode steps on the lane never call it."""
        if not self._unsettled:
            return
        self._unsettled = False
        flag, self._flag = self._flag, None
        if bool(mx.any(flag).item()):
            t = self.template
            raise FormatError(f"BatchTQCache({t.k_format}/{t.v_format}): a decode step appended NaN or infinite "
                              f"K/V rows (stored rows before {self._idx}); their blocks are unspecified")

    def fetch(self, dtype=mx.float32) -> tuple[mx.array, mx.array]:
        """Dequantized K and V of the stored rows of every sequence (lazy)."""
        self._settle()
        t = self.template
        kb, vb = self.keys[..., :self._idx, :], self.values[..., :self._idx, :]
        k = t._decode(kb, t.k_format, t._kd, t.k_dim, mx.float32)
        k = t._key_values(k) if t.calibration else hadamard_rotate(k, t.k_rot)
        v = hadamard_rotate(t._decode(vb, t.v_format, t._vd, t.v_dim, mx.float32), t.v_rot)
        return k.astype(dtype), v.astype(dtype)

    def blocks(self) -> tuple[mx.array, mx.array]:
        """The K and V blocks of the stored rows (every sequence, padding rows included)."""
        self._settle()
        return self.keys[..., :self._idx, :], self.values[..., :self._idx, :]

    # ------------------------------------------------------------ attention (the routing's)
    def _starts(self) -> tuple:
        """Each sequence's first stored row (its left padding) as ints: the fused attention's per-row starts.
        Read from the device once per batch composition (left_padding changes only when sequences join,
        leave, or a prompt is finalized or a window drops rows)."""
        key = id(self.left_padding)
        got = self._starts_memo
        if got is None or got[0] != key:
            got = self._starts_memo = (key, tuple(max(0, int(x)) for x in self.left_padding.tolist()))
        return got[1]

    def attend(self, queries: mx.array, *, scale: float, mask=None, sinks=None, mode: str = "auto") -> mx.array:
        """The attention of ``queries`` over the stored rows of every sequence (what the routing calls after
        :meth:`update_and_fetch`). A decode step (one query row per sequence) on a GPU, or on the CPU
        emulator's decode lane: the fused kernel over the blocks, each sequence from its left padding on
        (per-row starts). Otherwise, and for prompt chunks: the dequantized rows through
        ``mx.fast.scaled_dot_product_attention`` with the mask mlx-lm made."""
        t = self.template
        if (queries.shape[2] == 1 and mode in ("auto", "kernel") and not t.calibration and self.keys is not None
                and _decode_backend(mode) in ("auto", "kernel") and not t.decode_fallback):
            sig = (queries.shape, queries.dtype, self.keys.shape, self.values.shape, scale,
                   None if sinks is None else sinks.shape, t.decode_options)
            memo = self._launch_memo
            if memo is not None and memo[0] == sig:
                launch = memo[1]
            else:
                from ..attention.kernel import prepare_decode

                try:
                    launch = prepare_decode(queries, self.keys, self.values, k_format=t.k_format,
                                            v_format=t.v_format, scale=scale, window=t.window, sinks=sinks,
                                            rotation=(t.k_rot, t.v_rot),
                                            backend="cpu-emulator" if gpu_backend() == "cpu-emulator" else "auto",
                                            options=t.decode_options)
                except Exception as e:   # a shape the kernel does not take: said once, then the ops path
                    t.decode_fallback, launch = f"{type(e).__name__}: {e}", None
                self._launch_memo = (sig, launch)
            if launch is not None:
                t.paths[f"decode:{launch.backend}"] += 1
                return launch(queries, self.keys, self.values, self._idx, sinks=sinks, starts=self._starts(),
                              after=self._flag)
        keys, values = self.fetch(queries.dtype)
        t.paths["decode:dequant-sdpa" if queries.shape[2] == 1 else "prefill:dequant-sdpa"] += 1
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)

    # ------------------------------------------------------------ padding, masks
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty BatchTQCache")
            lp = mx.array(left_padding, dtype=mx.int32)
            self.left_padding = self.left_padding + lp
            self.offset = self.offset - lp
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = [int(p) for p in right_padding]
            self._ends = [self._idx + int(n) for n in lengths]

    def finalize(self) -> None:
        """After a right-padded prompt: roll each sequence's rows right by its padding, so it ends at the
        stored end and the padding rows become left padding."""
        if self._right_padding is None:
            return
        self._settle()
        pad = mx.array(self._right_padding, dtype=mx.int32)
        if self.keys is not None:
            n = self._idx
            self.keys[..., :n, :] = _mlx_cache.dynamic_roll(self.keys[..., :n, :], pad[:, None], axis=2)
            self.values[..., :n, :] = _mlx_cache.dynamic_roll(self.values[..., :n, :], pad[:, None], axis=2)
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad
        self._right_padding = self._ends = None

    def make_mask(self, N: int, return_array: bool = False, window_size: "int | None" = None, **kwargs):
        """The mask of the next ``N`` queries over the rows stored after that update (causal, per-row left
        padding, the window): always an array, as mlx-lm's batch caches give."""
        drop = self._drop_for()
        window_size = window_size if window_size is not None else self.window
        lp = mx.maximum(self.left_padding - drop, 0) if drop else self.left_padding
        return _mlx_cache.create_causal_mask(N, offset=self._idx - drop, window_size=window_size, left_padding=lp)

    # ------------------------------------------------------------ the batch
    def filter(self, batch_indices) -> None:
        """Keep the sequences ``batch_indices`` (in that order); drop the padding columns all of them share."""
        self._settle()
        idx = mx.array([int(i) for i in batch_indices], dtype=mx.int32)
        if self.keys is not None:
            self.keys, self.values = self.keys[idx], self.values[idx]
            self._owned = True   # the gather allocated them
        self.offset, self.left_padding = self.offset[idx], self.left_padding[idx]
        if self._right_padding is not None:
            self._right_padding = [self._right_padding[int(i)] for i in batch_indices]
            self._ends = [self._ends[int(i)] for i in batch_indices]
        shift = min(max(0, p) for p in self.left_padding.tolist()) if len(batch_indices) else 0
        if shift > 0 and self.keys is not None:
            self.keys = mx.contiguous(self.keys[..., shift:, :])
            self.values = mx.contiguous(self.values[..., shift:, :])
            self._idx -= shift
            self.left_padding = self.left_padding - shift
            if self._ends is not None:
                self._ends = [e - shift for e in self._ends]

    def extend(self, other: "BatchTQCache") -> None:
        """Append ``other``'s sequences (same configuration), right-aligning the stored rows."""
        if not isinstance(other, BatchTQCache) or _batch_config(other.template) != _batch_config(self.template):
            raise BatchError(f"BatchTQCache.extend: {other!r} is not a batch of the configuration of {self!r}")
        a, b = self.template, other.template
        if a.k_dim is not None and b.k_dim is not None and (a.k_dim, a.v_dim) != (b.k_dim, b.v_dim):
            raise BatchError(f"BatchTQCache.extend: head dims {(b.k_dim, b.v_dim)} and {(a.k_dim, a.v_dim)} differ")
        if a.calibration and not all((x is None and y is None) or (x is not None and y is not None and bool(
                mx.array_equal(x, y).item())) for x, y in ((a.k_mu, b.k_mu), (a.k_scale, b.k_scale))):
            raise BatchError("BatchTQCache.extend: the two batches hold different key calibrations")
        if self._right_padding is not None or other._right_padding is not None:
            raise BatchError("BatchTQCache.extend: a right-padded prompt is not finalized")
        self._settle()
        other._settle()
        if a.k_dim is None:
            self.template = b
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        n = max(self._idx, other._idx)
        cap = -(-n // self.step) * self.step
        ref = self if self.keys is not None else other
        H = ref.keys.shape[1]

        def padded(c, arr, rb):
            Bc = c.offset.shape[0]
            body = [] if arr is None else [arr[..., :c._idx, :]]
            return mx.concatenate([mx.zeros((Bc, H, n - c._idx, rb), mx.uint8), *body,
                                   mx.zeros((Bc, H, cap - n, rb), mx.uint8)], axis=2)

        krb, vrb = ref.keys.shape[-1], ref.values.shape[-1]
        self.keys = mx.concatenate([padded(self, self.keys, krb), padded(other, other.keys, krb)])
        self.values = mx.concatenate([padded(self, self.values, vrb), padded(other, other.values, vrb)])
        self._owned = True   # concatenate allocated them
        self.left_padding = mx.concatenate([self.left_padding + (n - self._idx), other.left_padding + (n - other._idx)])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = n
        self.dropped = max(self.dropped, other.dropped)

    # ------------------------------------------------------------ mlx-lm protocol
    def size(self) -> int:
        return min(self._idx, self.window) if self.window else self._idx

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return not self.window or (self.dropped == 0 and self._idx < self.window)

    def trim(self, n: int) -> int:
        # rows past the new end get overwritten by later in-place appends: every kernel that may still
        # read them finishes first
        self._settle()
        if self._owned:
            mx.synchronize()
        n = min(self._idx, int(n))
        self._idx -= n
        self.offset = self.offset - n
        return n

    @property
    def state(self):
        """The stored blocks, offsets and left padding (what ``mx.eval`` of a batch's state evaluates)."""
        if self.keys is None:
            return self.offset, self.left_padding
        kb, vb = self.blocks()
        return kb, vb, self.offset, self.left_padding

    @state.setter
    def state(self, v) -> None:
        raise BatchError("a BatchTQCache is not restored from a state: extract its sequences (TQCaches) to save them")

    @property
    def meta_state(self) -> tuple:
        return (str(self._idx),) + self.template.meta_state[1:]

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes + self.template.calibration_nbytes
