"""Named fields of ggml's legacy 32-value blocks: split raw blocks into (d, m, q) and join them back.

Layouts (ggml-common.h, ``block_q8_0`` … ``block_iq4_nl``; all little endian)::

    q8_0    d:f16  qs:int8[32]                     x_j = d * qs[j]
    q4_0    d:f16  qs:u8[16]                       x_j = d * (q_j - 8)
    q4_1    d:f16  m:f16  qs:u8[16]                x_j = d * q_j + m
    q5_0    d:f16  qh:u32  qs:u8[16]               x_j = d * (q_j - 16)
    q5_1    d:f16  m:f16  qh:u32  qs:u8[16]        x_j = d * q_j + m
    iq4_nl  d:f16  qs:u8[16]                       x_j = d * kvalues[q_j]

4-bit codes: value j (0 <= j < 16) is the low nibble of qs[j], value j + 16 its high nibble.
5-bit codes add bit j of qh as bit 4 of value j.

Each format's :class:`Layout` is part of its registry entry (``Format.layout``, set where the format
is registered); this module only reads it.
"""

from __future__ import annotations

import numpy as np

from .format_types import FormatError, Layout
from .registry import get_format, names

BLOCK = 32


def layout(fmt) -> Layout:
    """The legacy block fields of ``fmt`` (its registry entry's ``layout``), or a FormatError."""
    f = get_format(fmt)
    if f.layout is None:
        known = ", ".join(names(lambda g: g.layout is not None))
        raise FormatError(f"{f.key}: not a legacy ggml block format (known: {known})")
    return f.layout


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(N, 16) packed bytes -> (N, 32) 4-bit codes in value order."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def split_blocks(fmt, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """(N, type_size) uint8 -> ``d`` (N,) float16, ``m`` (N,) float16 or absent, ``q`` (N, 32) codes.

    Codes are as ggml stores them: int8 for q8_0, unsigned 0..2**bits-1 for the others.
    """
    f = get_format(fmt)
    lay = layout(f)
    b = np.ascontiguousarray(blocks, dtype=np.uint8)
    if b.ndim != 2 or b.shape[1] != f.type_size:
        raise FormatError(f"{f.key}: expected blocks of shape (N, {f.type_size}), got {b.shape}")
    out: dict[str, np.ndarray] = {"d": b[:, 0:2].copy().view("<f2").reshape(-1)}
    pos = 2
    if lay.has_m:
        out["m"] = b[:, pos:pos + 2].copy().view("<f2").reshape(-1)
        pos += 2
    if lay.bits == 8:
        out["q"] = b[:, pos:pos + BLOCK].copy().view(np.int8)
        return out
    qh = None
    if lay.bits == 5:
        qh = b[:, pos:pos + 4].copy().view("<u4").reshape(-1)
        out["qh"] = qh
        pos += 4
    q = _nibbles(b[:, pos:pos + BLOCK // 2])
    if qh is not None:
        high = (qh[:, None] >> np.arange(BLOCK, dtype=np.uint32)) & 1
        q = q | (high.astype(np.uint8) << 4)
    out["q"] = q.astype(np.uint8)
    return out


def join_blocks(fmt, d: np.ndarray, q: np.ndarray, m: "np.ndarray | None" = None) -> np.ndarray:
    """Inverse of :func:`split_blocks`: float16 ``d`` (N,), codes ``q`` (N, 32), ``m`` for q4_1/q5_1."""
    f = get_format(fmt)
    lay = layout(f)
    d = np.asarray(d)
    n = d.shape[0]
    parts = [np.ascontiguousarray(d, dtype="<f2").view(np.uint8).reshape(n, 2)]
    if lay.has_m:
        if m is None:
            raise FormatError(f"{f.key}: needs m")
        parts.append(np.ascontiguousarray(m, dtype="<f2").view(np.uint8).reshape(n, 2))
    q = np.asarray(q)
    if lay.bits == 8:
        parts.append(np.ascontiguousarray(q, dtype=np.int8).view(np.uint8).reshape(n, BLOCK))
    else:
        u = q.astype(np.uint32)
        if lay.bits == 5:
            qh = ((u >> 4) << np.arange(BLOCK, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32)
            parts.append(np.ascontiguousarray(qh, dtype="<u4").view(np.uint8).reshape(n, 4))
        lo = (u & 0x0F).astype(np.uint8)
        parts.append(lo[:, :BLOCK // 2] | (lo[:, BLOCK // 2:] << 4))
    return np.concatenate(parts, axis=-1)
