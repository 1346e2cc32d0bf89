"""ggml's CPU backend type traits through ctypes: the quantizer llama.cpp's CPU cache writes with.

``ggml_get_type_traits_cpu(type)`` (libggml-cpu) returns ``struct ggml_type_traits_cpu
{ ggml_from_float_t from_float; ggml_vec_dot_t vec_dot; enum ggml_type vec_dot_type; int64_t nrows; }``
(ggml-cpu.h, llama-cpp-python 0.3.36). ``from_float`` is what the CPU backend's ``SET_ROWS`` calls
to quantize K/V rows into llama.cpp's cache, and what it calls to convert q to a quantized K's
``vec_dot_type`` in flash attention.

It is not always ggml's reference quantizer (``ggml_quantize_chunk``, the bridge's contract): for
q8_0 the CPU backend has its own SIMD ``quantize_row_q8_0`` — on x86 (AVX2/AVX-512) it multiplies by
``127 / amax`` instead of ``1 / (amax / 127)`` and rounds half to even instead of C's ``roundf`` (half
away from zero), so a value whose scaled magnitude sits on (or within an ulp of) a half-integer gets
the neighbouring code.
The other cache types (q4_0, q4_1, q5_0, q5_1, iq4_nl) use the reference quantizer on the CPU.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..blocks.registry import get_format


class _TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# void vec_dot(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


@functools.lru_cache(maxsize=1)
def _cpu():
    from .ggml_graph import libraries

    cpu = libraries()[1]
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    return cpu


def _type_id(fmt) -> int:
    from .ggml_c import type_id   # upstream's ids, or a selected fork build's turbo ids

    return type_id(get_format(fmt))


def traits(fmt) -> dict:
    """``{"vec_dot_type": ggml type id, "nrows": int, "has_from_float": bool}`` of a ggml type."""
    t = _cpu().ggml_get_type_traits_cpu(_type_id(fmt)).contents
    return {"vec_dot_type": int(t.vec_dot_type), "nrows": int(t.nrows), "has_from_float": bool(t.from_float)}


def cpu_from_float(fmt, x: np.ndarray) -> np.ndarray:
    """ggml-cpu's ``from_float`` of the type on float rows ``x`` (..., n) -> uint8 (..., row bytes)."""
    f = get_format(fmt)
    t = _cpu().ggml_get_type_traits_cpu(_type_id(f)).contents
    if not t.from_float:
        raise ValueError(f"{f.key}: ggml's CPU backend has no from_float for this type")
    fn = _FROM_FLOAT(t.from_float)
    x = np.asarray(x)
    n = int(x.shape[-1])
    f.check_length(n)
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, n)
    out = np.zeros((src.shape[0], f.row_bytes(n)), np.uint8)
    for i in range(src.shape[0]):           # one row per call, as SET_ROWS does
        fn(src[i].ctypes.data, out[i].ctypes.data, n)
    return out.reshape(*x.shape[:-1], f.row_bytes(n))


def reference_quantize(fmt, x: np.ndarray) -> np.ndarray:
    """ggml's reference quantizer of a cache type, as the bridge has it: ``ggml_quantize_chunk``'s
    arithmetic with the format's ``cache_options`` (iq4_nl: ``quantize_row_iq4_nl_ref``, no scale search)."""
    from ..blocks.api import quantize

    f = get_format(fmt)
    return quantize(f, x, **f.cache_options)


def c_reference_quantize(fmt, x: np.ndarray) -> np.ndarray:
    """ggml's own C reference quantizer of a cache type (its ``from_float_ref``: ``quantize_row_*_ref``,
    iq4_nl without the scale search, the fork's turbo quantizers) on rows (..., n); float types, which
    have nothing to quantize, through :func:`reference_quantize`."""
    f = get_format(fmt)
    if f.kind == "float":
        return reference_quantize(f, x)
    return from_float_by_id(_type_id(f), x, f.type_size, cpu=False, block_size=f.block_size)


GGML_TYPE_Q8_1 = 9      # ggml.h; not a cache type (no registry entry): q's dot type for q4_1 / q5_1 K
Q8_1_BLOCK_BYTES = 36   # block_q8_1: f16 d, f16 s (= d * sum of codes), int8 qs[32]


def from_float_by_id(type_id: int, x: np.ndarray, type_size: int, *, cpu: bool = True,
                     block_size: int = 32) -> np.ndarray:
    """ggml-cpu's ``from_float`` (``cpu``) or ggml's ``from_float_ref`` of a ggml type id on float rows
    (..., n), n a multiple of ``block_size`` -> uint8 (..., n // block_size * type_size). For types
    outside the registry (q8_1), and for ggml's own reference quantizer of a registry type."""
    from .ggml_c import load

    if cpu:
        fp = _cpu().ggml_get_type_traits_cpu(int(type_id)).contents.from_float
    else:
        fp = load().ggml_get_type_traits(int(type_id)).contents.from_float_ref
    if not fp:
        raise ValueError(f"ggml type {type_id}: no {'CPU from_float' if cpu else 'from_float_ref'}")
    fn = _FROM_FLOAT(fp)
    x = np.asarray(x)
    n = int(x.shape[-1])
    if n % block_size:
        raise ValueError(f"row length {n} is not a multiple of {block_size}")
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, n)
    out = np.zeros((src.shape[0], n // block_size * type_size), np.uint8)
    for i in range(src.shape[0]):
        fn(src[i].ctypes.data, out[i].ctypes.data, n)
    return out.reshape(*x.shape[:-1], out.shape[-1])
