"""Explicit, reversible zero padding of rows to a whole number of blocks.

The TurboQuant fork zero-pads heads whose dimension is not a multiple of its 128-value rotation
group up to the next multiple (64 -> 128, 80/96 -> 128, 576 -> 640). tqbridge makes that step
visible: ``pad_rows`` before quantizing, ``unpad_rows`` after dequantizing.
"""

from __future__ import annotations

import numpy as np

from .format_types import Format, FormatError
from .registry import get_format


def padded_dim(fmt: "str | Format", d: int) -> int:
    """The row length ``d`` rounded up to a multiple of ``fmt``'s block size."""
    fmt = get_format(fmt)
    if int(d) != d or d <= 0:
        raise FormatError(f"{fmt.key}: row length must be a positive integer, got {d!r}")
    bs = fmt.block_size
    return -(-int(d) // bs) * bs


def pad_rows(fmt: "str | Format", x: np.ndarray) -> np.ndarray:
    """Zero-pad the last axis of ``x`` to :func:`padded_dim` (a copy; unchanged length if already whole)."""
    fmt = get_format(fmt)
    x = np.asarray(x)
    if x.ndim == 0:
        raise FormatError(f"{fmt.key}: cannot pad a 0-d array; give at least one row")
    d = x.shape[-1]
    p = padded_dim(fmt, d)
    out = np.zeros((*x.shape[:-1], p), dtype=x.dtype)
    out[..., :d] = x
    return out


def unpad_rows(fmt: "str | Format", y: np.ndarray, d: int) -> np.ndarray:
    """Undo :func:`pad_rows`: keep the first ``d`` values of rows padded to ``padded_dim(fmt, d)``."""
    fmt = get_format(fmt)
    p = padded_dim(fmt, d)
    shape = tuple(getattr(y, "shape", ()))
    if not shape or shape[-1] != p:
        raise FormatError(
            f"{fmt.key}: rows of {d} values are padded to {p}, but the last axis has length {shape[-1] if shape else 0}")
    return y[..., :d]
