"""ggml's own C quantizers, reached through ctypes: the oracle our formats are checked against.

The library is the ``libggml-base`` of this process's llama.cpp side (:mod:`.llama_side`): the one
shipped inside the installed ``llama_cpp`` package (llama-cpp-python, extra ``tqbridge[llama]``), or
that of a build chosen with :func:`tqbridge.bridge.llama.build.select`. Quantizing goes through
``ggml_quantize_chunk`` (no importance matrix, as llama.cpp does for KV rows); dequantizing through
the ``to_float`` function of the type's ``ggml_type_traits``. Same layout contract as
:func:`tqbridge.bridge.quantize` / :func:`tqbridge.bridge.dequantize`.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..blocks.format_types import Format, FormatError
from .ggml_abi import TO_FLOAT, TypeTraits
from .compat import ensure_compatible
from .side import GgmlUnavailable, library_path, selected, type_table
from ..blocks.registry import get_format


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL:
    """The loaded library (cached); GgmlUnavailable with the reason when it cannot be loaded."""
    path = library_path()
    ensure_compatible()  # version, symbols and layouts, before any call; LlamaCppIncompatible if not
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise GgmlUnavailable(f"cannot load {path.name}: {e}") from e
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return lib


def available() -> bool:
    """True when ggml's C library can be loaded."""
    try:
        load()
    except GgmlUnavailable:
        return False
    return True


def type_id(fmt: Format) -> int:
    """``fmt``'s ggml type id in this process's ggml (a selected fork build's own ids for its turbo
    types); FormatError for a format this ggml does not have."""
    tid = fmt.type_ids.get("ggml")
    if tid is None:
        if selected() is not None:   # a fork build chosen with --llama: its turbo types
            tid = next((i for i, f in type_table().items() if f.key == fmt.key), None)
    if tid is None:
        raise FormatError(f"{fmt.key}: not a type of this ggml; its C code cannot quantize it")
    return int(tid)


@functools.lru_cache(maxsize=None)
def type_traits(fmt: "str | Format") -> dict:
    """ggml's own view of a type: name, block size, type size, is_quantized."""
    fmt = get_format(fmt)
    t = load().ggml_get_type_traits(type_id(fmt)).contents
    info = {"name": t.type_name.decode(), "block_size": int(t.blck_size), "type_size": int(t.type_size),
            "is_quantized": bool(t.is_quantized), "to_float": t.to_float}
    if (info["block_size"], info["type_size"]) != (fmt.block_size, fmt.type_size):
        raise FormatError(
            f"{fmt.key}: ggml's C library says block {info['block_size']} values / {info['type_size']} bytes, "
            f"the registry {fmt.block_size} / {fmt.type_size}; the library does not match this ggml layout")
    return info


def c_row_size(fmt: "str | Format", n: int) -> int:
    """``ggml_row_size``: bytes of a row of ``n`` values."""
    fmt = get_format(fmt)
    fmt.check_length(n)
    return int(load().ggml_row_size(type_id(fmt), n))


def c_quantize(fmt: "str | Format", x: np.ndarray) -> np.ndarray:
    """ggml's ``ggml_quantize_chunk`` on float rows ``x`` (..., n) -> uint8 (..., row bytes)."""
    fmt = get_format(fmt)
    tid = type_id(fmt)
    x = np.asarray(x)
    if x.ndim == 0:
        raise FormatError(f"{fmt.key}: cannot quantize a 0-d array; give at least one row")
    n = int(x.shape[-1])
    fmt.check_length(n)
    type_traits(fmt)
    lib = load()
    if lib.ggml_quantize_requires_imatrix(tid):
        raise FormatError(f"{fmt.key}: ggml requires an importance matrix for this type")
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, n)
    rows = src.shape[0]
    out = np.zeros((rows, fmt.row_bytes(n)), dtype=np.uint8)
    if rows:
        written = lib.ggml_quantize_chunk(tid, src.ctypes.data, out.ctypes.data, 0, rows, n, None)
        if written != out.size:
            raise RuntimeError(f"{fmt.key}: ggml_quantize_chunk wrote {written} bytes, expected {out.size}")
    return out.reshape(*x.shape[:-1], fmt.row_bytes(n))


def c_dequantize(fmt: "str | Format", blocks: np.ndarray, n: int) -> np.ndarray:
    """ggml's ``to_float`` of the type on uint8 blocks (..., row bytes) -> float32 (..., n)."""
    fmt = get_format(fmt)
    info = type_traits(fmt)
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8:
        raise FormatError(f"{fmt.key}: blocks must be uint8, got dtype {blocks.dtype}")
    if blocks.ndim == 0 or int(blocks.shape[-1]) != fmt.row_bytes(n):
        raise FormatError(f"{fmt.key}: a row of {n} values takes {fmt.row_bytes(n)} bytes, "
                          f"but the blocks' last axis has {blocks.shape[-1] if blocks.ndim else 'none'}")
    src = np.ascontiguousarray(blocks).reshape(-1)
    if not info["to_float"]:
        if info["name"] == "f32":  # ggml registers no to_float for f32: the bytes are the values
            return src.view("<f4").astype(np.float32).reshape(*blocks.shape[:-1], n)
        raise FormatError(f"{fmt.key}: ggml has no to_float for this type")
    out = np.empty(src.size // fmt.type_size * fmt.block_size, dtype=np.float32)
    if out.size:
        TO_FLOAT(info["to_float"])(src.ctypes.data, out.ctypes.data, out.size)
    return out.reshape(*blocks.shape[:-1], n)
