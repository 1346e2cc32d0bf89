"""In-place K/V append: one dispatch rotates, quantizes and writes a step's K and V rows into the
cache buffers (``kv_append.cpp`` with the block helpers of ``quantize_append.h``).

This is the decode step's append (:class:`tqbridge.metal.lm.cache.TQCache` on a GPU): no copy of the
cache, no host synchronisation. Non-finite input is not refused on the spot (that needs a sync):
the kernel returns a sticky flag array (one uint32 per row, OR-ed with the previous call's flag)
that the cache reads later, once (:meth:`TQCache.check_finite`).

The rotation is llama.cpp's Hadamard for legacy ggml types (``rotation_group``), computed as a
float32 butterfly in Sylvester order followed by a multiply by ``1/sqrt(n)`` (float32 ops);
:func:`reference_append` is the numpy statement of the same arithmetic, byte for byte.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..bridge import FormatError, get_format, quantize
from ..bridge.blocks.format_types import Format
from .attention.launch import const_buffer, param_table, table_row
from .decode_options import DEFAULT_OPTIONS, DecodeOptions
from .kernel import KERNEL_DIR, Kernel, KernelError
from .quantize_append import append_row_header, static_and_table, supported

THREADS = 32
MAX_DP = 256                 # widest stored row (values) the kernel holds in threadgroup memory
# the flag has at least this many uint32 slots (the slots past the 2R rows' are zero): 2 slots would be
# 8 bytes, which MLX's CUDA allocator serves from unified memory the GPU reads through a mapping
# (attention_launch.MIN_CONST_BYTES); one KV head, one row per step gives 2R = 2
FLAG_MIN = 4
# device parameter tables kept per append (one per buffer geometry): the layers of a model grow in
# different decode steps (LayerDecoder.grow_phase), so two capacities are in use at once, and a single
# table would be rebuilt whenever the layer order alternates between them (tens of µs of host time a layer)
PARAM_TABLES = 4
_SRC = {"float32": 0, "float16": 1, "bfloat16": 2}


def flag_slots(rows: int, flag_min: int = FLAG_MIN) -> int:
    """The flag's length for an append of ``rows`` rows per side (R = B * H * S)."""
    return max(2 * rows, flag_min)


@lru_cache(maxsize=None)
def append_kernel(src16: bool, calibrated: bool = False) -> Kernel:
    """The K/V append kernel: float32 or 16-bit (``src16``) rows, with key calibration or without."""
    x = "uint16" if src16 else "float32"
    return Kernel("kv_append" + ("_u16" if src16 else "_f32") + ("_cal" if calibrated else ""),
                  (("k", x), ("v", x), ("kc", "uint8"), ("vc", "uint8"), ("ktab", "float32"),
                   ("vtab", "float32"), ("params", "uint32"), ("flag_in", "uint32"))
                  + ((("kcal", "float32"),) if calibrated else ()),
                  (("flag", "uint32"),), (KERNEL_DIR / "kv_append.cpp").read_text(),
                  append_row_header("tq_barrier()"), inplace=("kc", "vc"))



def calibration_rows(mu, s, heads: int, k_dim: int) -> np.ndarray:
    """The ``kcal`` buffer of a calibrated append: float32 (2, heads, k_dim), the channel means ``mu``
    (zeros when None) then the channel scales ``s`` (ones when None); what the kernel stores per K value
    is ``(x - mu) / s``, before the rotation."""
    out = np.zeros((2, heads, k_dim), np.float32)
    out[1] = 1.0
    if mu is not None:
        out[0] = np.asarray(mu, np.float32).reshape(heads, k_dim)
    if s is not None:
        out[1] = np.asarray(s, np.float32).reshape(heads, k_dim)
    return out


def calibrate_rows(rows: np.ndarray, kcal: np.ndarray) -> np.ndarray:
    """float32 ``rows`` (B, H, S, D) as a calibrated append stores them before the rotation:
    ``(x - mu) / s`` per head and channel (two correctly rounded float32 operations, as the kernel)."""
    x = np.asarray(rows, np.float32)
    mu, s = np.asarray(kcal, np.float32)
    return ((x - mu[None, :, None, :]) / s[None, :, None, :]).astype(np.float32)


def side_static(prefix: str, f: Format, din: int, dp: int, rot: int) -> dict:
    """The static parameters of one side (``prefix`` KA or VA) of the append kernel."""
    st, _ = static_and_table(f, search=False)   # the quantizer of llama.cpp's cache (iq4_nl: the reference one)
    return {f"{prefix}_FMT": st["QA_FMT"], f"{prefix}_BLOCK": f.block_size, f"{prefix}_TS": f.type_size,
            f"{prefix}_DIN": din, f"{prefix}_DP": dp, f"{prefix}_ROT": rot, f"{prefix}_BITS": st["QA_BITS"],
            f"{prefix}_QS": st["QA_QS_OFF"], f"{prefix}_SG": st["QA_SIGNS_OFF"], f"{prefix}_RN": st["QA_RNORM"],
            f"{prefix}_VPL": st["QA_VPL"]}


def _check_side(f: Format, dp: int, rot: int, what: str) -> None:
    if not supported(f):
        raise KernelError(f"no in-place append kernel for format {f.key}")
    if dp > MAX_DP or dp % f.block_size:
        raise KernelError(f"{what}: stored rows of {dp} values do not fit the append kernel (<= {MAX_DP}, "
                          f"whole {f.key} blocks)")
    if rot and (rot & (rot - 1) or dp % rot):
        raise KernelError(f"{what}: rotation group {rot} must be a power of two dividing {dp}")


class KVAppend:
    """The prepared append of one cache geometry: call with the step's rows, the two cache buffers,
    the first row to write and the previous flag; returns the new flag (MLX arrays on a GPU, numpy
    on the emulator, where kc / vc are written in place as on the GPU)."""

    def __init__(self, k_format, v_format, k_dim: int, v_dim: int, k_dp: int, v_dp: int, k_rot: int,
                 v_rot: int, src_dtype: str, backend: str, options: "DecodeOptions | None" = None,
                 calibrated: bool = False):
        from .dispatch import build

        kf, vf = get_format(k_format), get_format(v_format)
        _check_side(kf, k_dp, k_rot, "K")
        _check_side(vf, v_dp, v_rot, "V")
        if src_dtype not in _SRC:
            raise KernelError(f"the append kernel reads float32, float16 or bfloat16 rows, not {src_dtype}")
        self.kf, self.vf, self.backend = kf, vf, backend
        self.k_dim, self.v_dim = k_dim, v_dim
        self.k_row_bytes = k_dp // kf.block_size * kf.type_size
        self.v_row_bytes = v_dp // vf.block_size * vf.type_size
        opts = (DEFAULT_OPTIONS if options is None else options).resolve(backend)
        # the flag's padding is one of the small-buffer measures of device_consts (off: a flag of 2R slots);
        # always on the emulator
        self.flag_min = FLAG_MIN if (backend == "cpu-emulator" or opts.device_consts) else 1
        # calibrated: the call takes the layer's kcal buffer (calibration_rows) last
        self.calibrated = bool(calibrated)
        static = {"QA_SRC": _SRC[src_dtype], "KV_MAX_DP": MAX_DP, "KV_FLAG_MIN": self.flag_min,
                  "KV_CAL": int(self.calibrated),
                  **side_static("KA", kf, k_dim, k_dp, k_rot), **side_static("VA", vf, v_dim, v_dp, v_rot)}
        kern = append_kernel(src_dtype != "float32", self.calibrated)
        self._kern = build(kern, static, backend)
        self.static = static   # what kernel int8-mma's folded append builds with (attention.launch.folded_pass1)

        ktab, vtab = static_and_table(kf, False)[1], static_and_table(vf, False)[1]
        if backend == "cpu-emulator":
            self._ktab, self._vtab = ktab, vtab
        else:
            self._ktab, self._vtab = const_buffer(ktab, opts.device_consts), const_buffer(vtab, opts.device_consts)

        self.compiled = backend != "cpu-emulator" and opts.compile
        self._compiled = None
        self.device_params = backend != "cpu-emulator" and opts.device_params
        self._ptable: dict = {}   # (R, S, cap, H, n_in) -> device table over the row position (device_params)
        self._prow: dict = {}     # its rows in use (views), shared by the layers of a step

    @property
    def device_tables(self) -> tuple:
        """The quantizers' K and V tables as this backend's kernels take them (kernel int8-mma's folded append)."""
        return self._ktab, self._vtab

    def flag_slots(self, rows: int) -> int:
        """This append's flag length for ``rows`` rows per side (:func:`flag_slots`)."""
        return flag_slots(rows, self.flag_min)

    def _cal(self, kcal) -> tuple:
        """The extra input of a calibrated append (checked present), () otherwise."""
        if self.calibrated != (kcal is not None):
            raise KernelError("a calibrated append takes the layer's kcal buffer, an uncalibrated one none")
        return () if kcal is None else (kcal,)

    def __call__(self, k_rows, v_rows, kc, vc, pos: int, flag_in, kcal=None):
        cal = self._cal(kcal)
        if self.backend == "cpu-emulator" and _is_mx(kc):
            self._geometry(k_rows, kc, pos, flag_in)
            return _on_mlx_buffers(self, k_rows, v_rows, kc, vc, pos, flag_in, kcal)
        if self.backend == "cpu-emulator":
            R, S, cap, H, n_in = self._geometry(k_rows, kc, pos, flag_in)
            src16 = self._kern.kernel.inputs[0][1] == "uint16"
            k = np.ascontiguousarray(k_rows).reshape(-1)
            v = np.ascontiguousarray(v_rows).reshape(-1)
            if src16:
                k, v = k.view(np.uint16), v.view(np.uint16)
            params = np.array([R, S, cap, pos, H, n_in], np.uint32)
            cal = tuple(np.ascontiguousarray(c, np.float32).reshape(-1) for c in cal)
            (flag,) = self._kern([k, v, kc, vc, self._ktab, self._vtab, params, flag_in, *cal],
                                 [(self.flag_slots(R),)], (2 * R, 1, 1), THREADS)
            return flag
        import mlx.core as mx

        # the decode step's call: rows in their own dtype (the kernel reads half/bfloat16 as bits),
        # one prepared launch; MLX's graph orders it after whatever made the rows and the buffers
        params = self.step_params(k_rows, kc, pos, flag_in)
        if self.compiled:   # traced once per row shape, then replayed (the options' compile)
            if self._compiled is None:
                self._compiled = mx.compile(self.launch)
            return self._compiled(k_rows, v_rows, kc, vc, params, flag_in, *cal)
        return self.launch(k_rows, v_rows, kc, vc, params, flag_in, *cal)

    @staticmethod
    def _geometry(k_rows, kc, pos: int, flag_in) -> tuple:
        """``(R, S, cap, H, n_in)`` of an append of ``k_rows`` at row ``pos`` of ``kc``; refuses one that
        does not fit."""
        B, H, S = k_rows.shape[:3]
        cap = int(kc.shape[2])
        if pos < 0 or pos + S > cap:
            raise KernelError(f"append of {S} rows at row {pos} overflows a cache of {cap} rows")
        return B * H * S, S, cap, H, int(flag_in.shape[0])

    def step_params(self, k_rows, kc, pos: int, flag_in):
        """The parameter buffer of a GPU append of ``k_rows`` at row ``pos`` of ``kc`` (for
        :meth:`launch`, e.g. inside a compiled decode step; checks the row fits)."""
        R, S, cap, H, n_in = self._geometry(k_rows, kc, pos, flag_in)
        return self._device_row(R, S, cap, pos, H, n_in) if self.device_params else _params(R, S, cap, pos, H, n_in)

    def _device_row(self, R: int, S: int, cap: int, pos: int, H: int, n_in: int):
        """``_params(R, S, cap, pos, H, n_in)`` as a view of a table made on the device (one table per
        buffer geometry; the options' device_params)."""
        key = (R, S, cap, pos, H, n_in)
        row = self._prow.get(key)
        if row is None:
            tkey = (R, S, cap, H, n_in)
            tbl = self._ptable.get(tkey)
            if tbl is None:
                if len(self._ptable) >= PARAM_TABLES:   # the oldest geometry's table: its buffers grew
                    del self._ptable[next(iter(self._ptable))]
                tbl = self._ptable[tkey] = param_table([R, S, cap], cap + 1, 1, np.uint32, after=[H, n_in])
            if len(self._prow) > 64:
                self._prow.clear()
            row = self._prow[key] = table_row(tbl, pos)
        return row

    def launch(self, k_rows, v_rows, kc, vc, params, flag_in, kcal=None):
        """The GPU append kernel's launch (``params``: :meth:`step_params`; ``kcal``: a calibrated
        append's buffer); returns the new flag."""
        import mlx.core as mx

        B, H, S = k_rows.shape[:3]
        R = B * H * S
        cal = list(self._cal(kcal))
        (flag,) = self._kern.raw(inputs=[k_rows, v_rows, kc, vc, self._ktab, self._vtab, params, flag_in, *cal],
                                 output_shapes=[(self.flag_slots(R),)], output_dtypes=[mx.uint32],
                                 grid=(2 * R * THREADS, 1, 1), threadgroup=(THREADS, 1, 1))
        return flag


def _is_mx(a) -> bool:
    return type(a).__module__.startswith("mlx")


def _on_mlx_buffers(app: "KVAppend", k_rows, v_rows, kc, vc, pos: int, flag_in, kcal=None):
    """The emulator writing into MLX arrays in place (numpy views of their memory): the decode lane
    on the CPU for tests (:func:`tqbridge.metal.backend.emulate_decode_lane`). Synchronises; not a product path."""
    import mlx.core as mx

    mx.eval(k_rows, v_rows, kc, vc, flag_in)
    flag = app(np.array(k_rows), np.array(v_rows), np.asarray(kc), np.asarray(vc), pos, np.array(flag_in),
               None if kcal is None else np.array(kcal))
    return mx.array(flag)


class CalibratedAppend:
    """A calibrated layer's append: the shared prepared :class:`KVAppend` (``calibrated=True``) with the
    layer's ``kcal`` buffer (:func:`calibration_rows`, as a device array) bound; called and launched as an
    uncalibrated one."""

    def __init__(self, app: KVAppend, kcal):
        if not app.calibrated:
            raise KernelError("CalibratedAppend needs an append prepared with calibrated=True")
        self.app, self.kcal = app, kcal

    def __call__(self, k_rows, v_rows, kc, vc, pos: int, flag_in):
        return self.app(k_rows, v_rows, kc, vc, pos, flag_in, self.kcal)

    def launch(self, k_rows, v_rows, kc, vc, params, flag_in):
        return self.app.launch(k_rows, v_rows, kc, vc, params, flag_in, self.kcal)

    def __getattr__(self, name):
        return getattr(self.app, name)


@lru_cache(maxsize=None)
def grow_kernel() -> Kernel:
    """The kernel that copies K/V blocks into larger device buffers."""
    return Kernel("kv_grow", (("ko", "uint8"), ("vo", "uint8"), ("flag", "uint32"), ("params", "uint32")),
                  (("kn", "uint8"), ("vn", "uint8")), (KERNEL_DIR / "kv_grow.cpp").read_text())


def relocate(kc, vc, row0: int, n: int, new_cap: int, after, backend: str):
    """New K / V buffers of ``new_cap`` rows whose rows 0 .. n-1 are rows row0 .. row0+n-1 of ``kc`` /
    ``vc`` (B, H, cap, row_bytes): the cache's growth (row0 = 0) and its window compaction, copied on
    the device after ``after`` (the last in-place append's flag), without a host synchronisation.
    MLX arrays on a GPU, numpy on the emulator."""
    from .dispatch import build

    B, H, cap, krb = (int(x) for x in kc.shape)
    vrb = int(vc.shape[3])
    if not (0 <= row0 and row0 + n <= cap and n <= new_cap) or krb % 2 or vrb % 2:
        raise KernelError(f"cannot move rows {row0}..{row0 + n} of a {cap}-row cache ({krb} / {vrb} bytes) "
                          f"into {new_cap} rows")
    kern = build(grow_kernel(), {}, backend)
    units = B * H * n * (krb + vrb) // 2
    params = [B * H, n, cap, new_cap, krb // 2, vrb // 2, row0]
    shapes = [(B, H, new_cap, krb), (B, H, new_cap, vrb)]
    grid = (max(1, -(-units // 256)), 1, 1)
    if backend == "cpu-emulator":
        if _is_mx(kc):   # the test lane on MLX's CPU device (see _on_mlx_buffers)
            import mlx.core as mx

            mx.eval(kc, vc, after)
            kn, vn = relocate(np.array(kc), np.array(vc), row0, n, new_cap, np.array(after), backend)
            return mx.array(kn), mx.array(vn)
        return tuple(kern([np.ascontiguousarray(kc), np.ascontiguousarray(vc), np.asarray(after, np.uint32),
                           np.array(params, np.uint32)], shapes, grid, 256))
    import mlx.core as mx

    return tuple(kern([kc, vc, after, mx.array(np.array(params, np.uint32))], shapes, grid, 256))


@lru_cache(maxsize=256)
def _params(*values: int):
    """The uint32 parameter buffer of one step, made once and shared by every layer of the step
    (the values differ only in the row position, which is the same for the layers of one geometry;
    MLX arrays are immutable, so sharing is safe)."""
    import mlx.core as mx

    return mx.array(np.array(values, np.uint32))


def prepared(k_format: str, v_format: str, k_dim: int, v_dim: int, k_dp: int, v_dp: int, k_rot: int,
             v_rot: int, src_dtype: str, backend: str, options: "DecodeOptions | None" = None,
             calibrated: bool = False) -> KVAppend:
    """One :class:`KVAppend` per geometry (kernel built once), resolved decode options and whether it
    takes a key calibration."""
    opts = (DEFAULT_OPTIONS if options is None else options).resolve(backend)
    return _prepared(k_format, v_format, k_dim, v_dim, k_dp, v_dp, k_rot, v_rot, src_dtype, backend, opts,
                     bool(calibrated))


@lru_cache(maxsize=64)
def _prepared(k_format, v_format, k_dim, v_dim, k_dp, v_dp, k_rot, v_rot, src_dtype, backend, opts,
              calibrated=False) -> KVAppend:
    return KVAppend(k_format, v_format, k_dim, v_dim, k_dp, v_dp, k_rot, v_rot, src_dtype, backend, opts,
                    calibrated)


prepared.cache_clear = _prepared.cache_clear   # as on an lru_cache: drop every prepared append


def hadamard_butterfly(x: np.ndarray, n: int) -> np.ndarray:
    """float32 ``x`` (..., D) times the orthonormal block-diagonal Hadamard of order ``n``, with the
    kernel's arithmetic: butterfly stages h = 1, 2, 4, ... (a + b, a - b in float32), then one multiply
    by 1 / sqrt(n) computed in float32 (two correctly rounded operations)."""
    y = np.array(x, np.float32, copy=True)
    if not n:
        return y
    shape = y.shape
    y = y.reshape(-1, shape[-1] // n, n)
    h = 1
    while h < n:
        z = y.reshape(y.shape[0], y.shape[1], n // (2 * h), 2, h)
        a, b = z[:, :, :, 0, :].copy(), z[:, :, :, 1, :].copy()
        z[:, :, :, 0, :] = a + b
        z[:, :, :, 1, :] = a - b
        h *= 2
    rs = np.float32(1.0) / np.sqrt(np.float32(n))
    return (y * rs).astype(np.float32).reshape(shape)


def reference_append(fmt, rows: np.ndarray, dp: int, rot: int) -> np.ndarray:
    """The blocks :class:`KVAppend` writes for float ``rows`` (..., D): zero-pad to ``dp`` values,
    rotate (:func:`hadamard_butterfly`), quantize with the numpy reference (iq4_nl: its reference
    quantizer, what llama.cpp writes into its KV cache)."""
    f = get_format(fmt)
    x = np.asarray(rows, np.float32)
    if x.shape[-1] != dp:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], dp - x.shape[-1]), np.float32)], axis=-1)
    x = hadamard_butterfly(x, rot)
    if not np.isfinite(x).all():
        raise FormatError(f"{f.key}: non-finite input")
    return quantize(f, x, **f.cache_options)
