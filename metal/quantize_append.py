"""Quantize-on-append: new K/V rows (any float dtype) -> blocks of any registered format, in one
kernel dispatch, byte-identical to :func:`tqbridge.bridge.quantize` (turbo formats: one simdgroup
per block; the others: one thread per block).

Inputs and outputs: numpy in, numpy out on ``cpu-emulator`` and ``reference``; on ``metal`` and
``cuda`` an ``mx.array`` (or numpy, converted) in and an ``mx.array`` out. float32, float16 and
bfloat16 rows are read as they are (16-bit rows as raw bits, widened in the kernel); other real
dtypes are converted to float32 first, as the reference does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..bridge import FormatError, get_format, quantize
from ..bridge.blocks.format_types import Format
from .dispatch import build, record_path, resolve
from .kernel import BODY_MARKER, KERNEL_DIR, Kernel, KernelError

THREADS = 64
# The kernel's encoder ids (quantize_append.h, QA_*): a format encoded one block per thread has its
# registry entry's kernel_id (and cache_kernel_id for llama.cpp's cache quantizer, where that differs);
# every turbo format goes through one encoder, parameterised by its spec.
_TURBO = 9
_SRC = {"float32": 0, "float16": 1, "bfloat16": 2}
_BUFS_IN = (("tab", "float32"), ("params", "uint32"))


@lru_cache(maxsize=None)
def quantize_kernel(src16: bool) -> Kernel:
    """The quantize-append kernel over float32 or 16-bit (``src16``) rows."""
    x = ("x", "uint16" if src16 else "float32")
    return Kernel.from_file(KERNEL_DIR / "quantize_append.h", "quantize_append" + ("_u16" if src16 else "_f32"),
                            (x,) + _BUFS_IN, (("out", "uint8"),),
                            static_names=("QA_FMT", "QA_SRC", "QA_BLOCK", "QA_TYPE_SIZE"))


def supported(fmt: "str | Format") -> bool:
    """Whether the kernel handles ``fmt`` (every legacy ggml, float and turbo format)."""
    f = get_format(fmt)
    if f.kind == "turbo":
        return hasattr(f.codec, "spec")
    return f.kernel_id is not None


@lru_cache(maxsize=None)
def static_and_table(f: Format, search: bool = True) -> tuple[dict[str, int], np.ndarray]:
    """Static parameters and table of ``f``; ``search=False`` picks the quantizer of llama.cpp's KV cache
    where the format has its own (``cache_kernel_id``; iq4_nl: ``quantize_row_iq4_nl_ref``)."""
    static = {"QA_BLOCK": f.block_size, "QA_TYPE_SIZE": f.type_size, "QA_BITS": 0, "QA_QS_OFF": 0,
              "QA_SIGNS_OFF": 0, "QA_RNORM": 0, "QA_VPL": 1}
    if f.kind != "turbo" and f.kernel_id is not None:
        cache = not search and f.cache_kernel_id is not None
        static["QA_FMT"] = f.cache_kernel_id if cache else f.kernel_id
        # table: the NaN this CPU makes for inf - inf (x86-64: 0xFFC00000), which the iq4_nl encoders
        # store for a NaN scale as the reference does; the other encoders do not read the table
        with np.errstate(invalid="ignore"):
            host_nan = np.array([np.inf], np.float32) - np.array([np.inf], np.float32)
        return static, host_nan
    if not supported(f):
        raise KernelError(f"no quantize-on-append kernel for format {f.key}; use backend='reference'")
    sp = f.codec.spec
    tab = np.zeros(32 + 2 * sp.group, np.float32)
    tab[: sp.levels] = sp.centroids
    tab[16:16 + sp.levels - 1] = sp.midpoints
    tab[32:32 + sp.group] = sp.s1
    tab[32 + sp.group:] = (sp.scale * sp.s2).astype(np.float32)  # C: x[i] *= inv_sqrt * s2[i]
    if sp.group % 32 or sp.group // 32 not in (2, 4):
        raise KernelError(f"{f.key}: the turbo kernel takes groups of 64 or 128 values, not {sp.group}")
    static.update(QA_FMT=_TURBO, QA_BITS=sp.bits, QA_QS_OFF=sp.qs_offset, QA_VPL=sp.group // 32,
                  QA_SIGNS_OFF=sp.signs_offset or 0, QA_RNORM=int(sp.rnorm_offset is not None))
    return static, tab


@lru_cache(maxsize=None)
def _mx_table(f: Format) -> Any:
    import mlx.core as mx

    return mx.array(static_and_table(f)[1])


@lru_cache(maxsize=256)
def _mx_params(n_blocks: int) -> Any:
    import mlx.core as mx

    return mx.array(np.array([n_blocks], np.uint32))


def _is_mx(a: Any) -> bool:
    return type(a).__module__.startswith("mlx")


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("mlx.core.", "")


def _widen(bits: np.ndarray, dt: str) -> np.ndarray:
    """float32 values of float16 / bfloat16 bits (exact)."""
    if dt == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _refuse_nonfinite(f: Format, x_np: np.ndarray) -> None:
    # the reference's own check raises its FormatError (quantized formats refuse NaN/inf)
    f.codec.quantize_blocks(np.ascontiguousarray(x_np, dtype=np.float32).reshape(-1, f.block_size))
    raise FormatError(f"{f.key}: non-finite input")  # pragma: no cover - the codec raised above


def quantize_append(fmt: "str | Format", rows: Any, *, backend: str = "auto", check_finite: bool = True,
                    search: bool = True, **run_options: Any) -> Any:
    """Quantize float ``rows`` (..., D) to uint8 blocks (..., D // block_size * type_size).

    ``backend``: "auto" | "metal" | "cuda" | "cpu-emulator" | "reference"; :func:`last_path` tells
    which ran. Quantized formats refuse NaN/inf with the reference's FormatError; on a GPU this
    check costs a synchronisation, ``check_finite=False`` skips it (non-finite rows then give
    unspecified blocks). ``search=False``: iq4_nl through ggml's reference quantizer (what llama.cpp
    writes into its KV cache; other formats ignore it). ``run_options`` go to the emulator (``seed``, ``runs``).
    """
    f = get_format(fmt)
    path = resolve(backend)
    dt = _dtype_name(rows) if hasattr(rows, "dtype") else np.asarray(rows).dtype.name
    if not (dt in _SRC or dt.startswith(("float", "int", "uint"))):
        raise FormatError(f"{f.key}: expected a float array, got dtype {dt}")
    shape = tuple(int(s) for s in getattr(rows, "shape", np.shape(rows)))
    if not shape:
        raise FormatError(f"{f.key}: cannot quantize a 0-d array; give at least one row")
    f.check_length(shape[-1])
    out_shape = (*shape[:-1], f.row_bytes(shape[-1]))

    if path == "reference":
        if _is_mx(rows):
            import mlx.core as mx

            rows = np.array(rows.astype(mx.float32))
        x = rows
        record_path("reference")
        return quantize(f, x, **({} if search else f.cache_options))

    n_blocks = int(np.prod(shape, dtype=np.int64)) // f.block_size
    if path != "cpu-emulator":   # metal / cuda: MLX rows, the prepared launch
        import mlx.core as mx

        x = rows if _is_mx(rows) else mx.array(np.asarray(rows))
        if check_finite and f.kind != "float":
            xf = x.astype(mx.float32)
            if not bool(mx.all(mx.isfinite(xf)).item()):
                _refuse_nonfinite(f, np.array(xf))
        record_path(path)
        if n_blocks == 0:
            return mx.zeros(out_shape, dtype=mx.uint8)
        return prepared(f.key, shape, dt, path, search)(x)

    static, tab = static_and_table(f, search)
    static = dict(static)
    src16 = dt in ("float16", "bfloat16")
    static["QA_SRC"] = _SRC.get(dt, 0)
    kern = build(quantize_kernel(src16), static, path)
    params = np.array([n_blocks], np.uint32)
    per_group = THREADS // 32 if static["QA_FMT"] == _TURBO else THREADS  # turbo: a simdgroup per block
    grid = (max(1, -(-n_blocks // per_group)), 1, 1)
    if _is_mx(rows):
        import mlx.core as mx

        x = np.array(rows.view(mx.uint16)) if src16 else np.array(rows.astype(mx.float32))
    else:
        x = np.asarray(rows)
        x = x.view(np.uint16) if src16 else np.asarray(x, dtype=np.float32)
    if check_finite and f.kind != "float":
        xf = _widen(x, dt) if src16 else x
        if not np.isfinite(xf).all():
            _refuse_nonfinite(f, xf)
    record_path(path)
    if n_blocks == 0:
        return np.zeros(out_shape, np.uint8)
    (out,) = kern([x.reshape(-1), tab, params], [(n_blocks * f.type_size,)], grid, THREADS, **run_options)
    return out.reshape(out_shape)


def quantize_rows(fmt: str, rows: Any, backend: str) -> Any:
    """``quantize_append(fmt, rows, backend=backend, check_finite=False, search=False)``; MLX rows on
    "metal" / "cuda" go through :func:`prepared` (what a cache's quantizer calls on a GPU)."""
    if backend not in ("metal", "cuda") or rows.ndim == 0 or rows.size == 0:
        return quantize_append(fmt, rows, backend=backend, check_finite=False, search=False)
    return prepared(fmt, rows.shape, _dtype_name(rows), backend)(rows)


@lru_cache(maxsize=512)
def prepared(fmt: str, shape: tuple, dtype: str, backend: str, search: bool = False) -> Callable[[Any], Any]:
    """The GPU quantize of MLX rows of one shape and dtype, every buffer and the launch geometry made once:
    what :func:`quantize_append` runs on "metal" / "cuda" (no finiteness check), and what a cache's
    decode step calls directly (a few microseconds of Python instead of the checks and lookups above)."""
    import mlx.core as mx

    f = get_format(fmt)
    if backend not in ("metal", "cuda"):
        raise FormatError(f"{f.key}: a prepared quantize runs on a GPU backend, not {backend!r}")
    f.check_length(shape[-1])
    static, _ = static_and_table(f, search)
    static = dict(static)
    src16 = dtype in ("float16", "bfloat16")
    static["QA_SRC"] = _SRC.get(dtype, 0)
    n_blocks = int(np.prod(shape, dtype=np.int64)) // f.block_size
    per_group = THREADS // 32 if static["QA_FMT"] == _TURBO else THREADS
    grid = (max(1, -(-n_blocks // per_group)) * THREADS, 1, 1)
    raw = build(quantize_kernel(src16), static, backend).raw
    inputs = [_mx_table(f), _mx_params(n_blocks)]
    out_shapes, out_dtypes = [(n_blocks * f.type_size,)], [mx.uint8]
    out_shape = (*shape[:-1], f.row_bytes(shape[-1]))
    tg = (THREADS, 1, 1)

    def run(x):
        x = x.view(mx.uint16) if src16 else x.astype(mx.float32)
        (out,) = raw(inputs=[x.reshape(-1), *inputs], output_shapes=out_shapes, output_dtypes=out_dtypes, grid=grid,
                     threadgroup=tg)
        return out.reshape(out_shape)
    return run


def append_row_header(sync: str) -> str:
    """quantize_append.h's helpers and kv_append_row.h's ``kva_row`` (one row of the in-place K/V append), its
    lanes synchronised by ``sync`` (``tq_barrier()`` where the threadgroup is the row's SIMD group,
    ``tq_simd_barrier()`` beside others: kernel int8-mma's folded append)."""
    qa = (KERNEL_DIR / "quantize_append.h").read_text().split(BODY_MARKER, 1)[0]
    return qa + f"\n#define KVA_SYNC() {sync}\n" + (KERNEL_DIR / "kv_append_row.h").read_text()
