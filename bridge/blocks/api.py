"""Row-level quantize / dequantize on numpy (the reference) and on MLX arrays.

Layout contract: the last axis of ``x`` (length ``n``, a multiple of the format's block size) becomes
``n // block_size * type_size`` bytes; leading axes are kept. Blocks are raw little-endian bytes,
exactly as ggml (or the TurboQuant fork) stores them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .format_types import Format, FormatError
from .registry import get_format


def _split_rows(fmt: Format, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    if len(shape) == 0:
        raise FormatError(f"{fmt.key}: cannot quantize a 0-d array; give at least one row")
    n = int(shape[-1])
    fmt.check_length(n)
    return tuple(int(s) for s in shape[:-1]), n


def _check_blocks(fmt: Format, shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    if len(shape) == 0:
        raise FormatError(f"{fmt.key}: blocks must have at least one axis")
    fmt.check_length(n)
    want = fmt.row_bytes(n)
    if int(shape[-1]) != want:
        raise FormatError(
            f"{fmt.key}: a row of {n} values takes {want} bytes, but the blocks' last axis has {shape[-1]}"
        )
    return tuple(int(s) for s in shape[:-1])


def quantize(fmt: "str | Format", x: np.ndarray, **options: Any) -> np.ndarray:
    """Quantize float rows ``x`` (..., n) to uint8 blocks (..., n // block_size * type_size)."""
    fmt = get_format(fmt)
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise FormatError(f"{fmt.key}: expected a float array, got dtype {x.dtype}")
    lead, n = _split_rows(fmt, x.shape)
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, fmt.block_size)
    out = fmt.codec.quantize_blocks(blocks, **options)
    return np.ascontiguousarray(out, dtype=np.uint8).reshape(*lead, fmt.row_bytes(n))


def dequantize(fmt: "str | Format", blocks: np.ndarray, n: int, **options: Any) -> np.ndarray:
    """Decode uint8 blocks (..., row_bytes) back to float32 rows (..., n)."""
    fmt = get_format(fmt)
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8:
        raise FormatError(f"{fmt.key}: blocks must be uint8, got dtype {blocks.dtype}")
    lead = _check_blocks(fmt, blocks.shape, n)
    b = np.ascontiguousarray(blocks).reshape(-1, fmt.type_size)
    out = fmt.codec.dequantize_blocks(b, **options)
    return np.asarray(out, dtype=np.float32).reshape(*lead, n)


def _mlx():
    try:
        import mlx.core as mx
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("MLX is not installed: pip install 'tqbridge[mlx]'") from e
    return mx


def _mlx_codec(fmt: Format, op: str):
    fn = getattr(fmt.codec, op, None)
    if fn is None:
        raise FormatError(f"{fmt.key}: no MLX implementation of {op}")
    return fn


def mlx_quantize(fmt: "str | Format", x: Any, **options: Any) -> Any:
    """MLX twin of :func:`quantize`: an ``mx.array`` of floats in, an ``mx.array`` of uint8 out.

    Byte-identical to the numpy reference (tested). Runs as MLX ops on MLX's default device.
    """
    mx = _mlx()
    fmt = get_format(fmt)
    x = mx.array(x) if not isinstance(x, mx.array) else x
    lead, n = _split_rows(fmt, tuple(x.shape))
    blocks = x.astype(mx.float32).reshape(-1, fmt.block_size)
    out = _mlx_codec(fmt, "mlx_quantize_blocks")(blocks, **options)
    return out.reshape(*lead, fmt.row_bytes(n))


def mlx_dequantize(fmt: "str | Format", blocks: Any, n: int, **options: Any) -> Any:
    """MLX twin of :func:`dequantize` (float32 ``mx.array`` out)."""
    mx = _mlx()
    fmt = get_format(fmt)
    blocks = mx.array(blocks) if not isinstance(blocks, mx.array) else blocks
    if blocks.dtype != mx.uint8:
        raise FormatError(f"{fmt.key}: blocks must be uint8, got dtype {blocks.dtype}")
    lead = _check_blocks(fmt, tuple(blocks.shape), n)
    out = _mlx_codec(fmt, "mlx_dequantize_blocks")(blocks.reshape(-1, fmt.type_size), **options)
    return out.reshape(*lead, n)
