"""Lossless conversion between ggml legacy blocks and MLX's affine quantization (``mx.quantize``).

MLX affine: ``x = scale * w + bias`` per group, ``w`` unsigned ``bits``-bit codes packed into
uint32 words as one little-endian bit stream (value 0 in the lowest bits; checked against
``mx.quantize`` for bits 4, 5 and 8). The ggml types map as

    q8_0   scale = d   bias = -128*d   w = qs + 128      (bits 8)
    q4_0   scale = d   bias = -8*d     w = q             (bits 4)
    q5_0   scale = d   bias = -16*d    w = q             (bits 5)
    q4_1   scale = d   bias = m        w = q             (bits 4)
    q5_1   scale = d   bias = m        w = q             (bits 5)

Why ``mx.dequantize`` then equals ggml's dequantization bit for bit (scales in float32): d is an
fp16 value, so d*w has at most 11 + 8 significant bits and is exact in float32; -k*d is exact;
for the symmetric types d*w - k*d = d*(q - k) is a float32 value, so the one rounding of the sum
returns it exactly (with or without FMA). For q4_1/q5_1 both sides compute d*q + m with one
rounding. The exception is an infinite d in a symmetric type (inf*q - inf*k gives NaN where ggml
gives ±inf); such blocks are refused. With float16 scales (what ``mx.load`` of a GGUF returns) the
triplet holds the same numbers, but ``mx.dequantize`` then rounds its result to float16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .format_types import Format, FormatError, Layout
from .legacy_fields import BLOCK, join_blocks, split_blocks
from .registry import get_format, names

_NOT_AFFINE = {   # why a format of this kind has no affine form
    "turbo": "its values are rotated (Walsh-Hadamard) and quantized to non-uniform centroids",
    "float": "it is a plain float format, not block-quantized",
}


def _is_affine(f: Format) -> bool:
    return f.layout is not None and f.layout.affine


def affine_formats() -> tuple[str, ...]:
    """The formats that convert to and from MLX affine quantization losslessly: the legacy ggml
    block formats whose codes are an evenly spaced grid (registry order)."""
    return names(_is_affine)


def _formula(lay: Layout) -> str:
    """How a symmetric type decodes, e.g. ``d*(q-8)``."""
    return "d*q" if lay.signed or not lay.offset else f"d*(q-{lay.offset})"


def _mx():
    try:
        import mlx.core as mx
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("MLX is not installed: pip install 'tqbridge[mlx]'") from e
    return mx


def _affine_format(fmt):
    f = get_format(fmt)
    if _is_affine(f):
        return f, f.layout
    if f.layout is not None and f.layout.values is not None:
        why = (f"its {len(f.layout.values)} codes index a fixed non-linear table ({f.layout.values_name}), "
               "not an evenly spaced grid")
    else:
        why = _NOT_AFFINE.get(f.kind) or "it has no affine form"
    raise FormatError(
        f"{f.key} cannot be converted to or from MLX affine quantization: {why}; "
        f"affine formats: {', '.join(affine_formats())}"
    )


def _code_offset(lay: Layout) -> int:
    """k in bias = -k*d for the symmetric types (signed int8 codes shift by 128)."""
    return 128 if lay.signed else lay.offset


def pack_codes(u: np.ndarray, bits: int) -> np.ndarray:
    """(N, 32) codes -> (N, bits) uint32 words, MLX's little-endian bit stream."""
    u = u.astype(np.uint8)
    if bits == 8:
        packed = u
    elif bits == 4:
        packed = u[:, 0::2] | (u[:, 1::2] << 4)
    else:
        bitplanes = (u[:, :, None] >> np.arange(bits, dtype=np.uint8)) & 1
        packed = np.packbits(bitplanes.reshape(u.shape[0], -1), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4")


def unpack_codes(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """(N, words) uint32 -> (N, count) codes (inverse of :func:`pack_codes`)."""
    b = np.ascontiguousarray(words, dtype="<u4").view(np.uint8)
    if bits == 8:
        return b.copy()
    if bits == 4:
        out = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
        out[:, 0::2] = b & 0x0F
        out[:, 1::2] = b >> 4
        return out
    bitplanes = np.unpackbits(b, axis=-1, bitorder="little").reshape(b.shape[0], count, bits)
    return (bitplanes << np.arange(bits, dtype=np.uint8)).sum(axis=-1, dtype=np.uint8)


def to_mlx_affine(fmt, blocks, n: int, *, dtype: Any = None):
    """ggml blocks (..., row_bytes) of rows of ``n`` values -> ``(w, scales, biases, group_size, bits)``.

    ``w`` is uint32 (..., n*bits/32), ``scales``/``biases`` (..., n/32) of ``dtype`` (float32 by
    default: ``mx.dequantize`` then equals :func:`tqbridge.bridge.dequantize` exactly; float16 keeps
    the numbers but MLX computes in float16). group_size is always 32.
    """
    mx = _mx()
    f, lay = _affine_format(fmt)
    dtype = mx.float32 if dtype is None else dtype
    if dtype not in (mx.float32, mx.float16):
        raise FormatError(f"{f.key}: scales/biases dtype must be float32 or float16, got {dtype}")
    b = np.asarray(blocks)
    if b.dtype != np.uint8:
        raise FormatError(f"{f.key}: blocks must be uint8, got dtype {b.dtype}")
    if b.ndim == 0:
        raise FormatError(f"{f.key}: blocks must have at least one axis")
    want = f.row_bytes(n)
    if b.shape[-1] != want:
        raise FormatError(f"{f.key}: a row of {n} values takes {want} bytes, but the blocks' last axis has {b.shape[-1]}")
    lead = b.shape[:-1]
    fields = split_blocks(f, b.reshape(-1, f.type_size))
    d = fields["d"].astype(np.float32)
    if lay.has_m:
        bias = fields["m"].astype(np.float32)
    else:
        k = _code_offset(lay)
        bad = np.flatnonzero(np.isinf(d))
        if bad.size:
            raise FormatError(
                f"{f.key}: block {int(bad[0])} (of {bad.size} such) has d = {d[bad[0]]}; with an infinite d, "
                f"{_formula(lay)} has no exact affine form (scale*w + bias gives NaN where ggml gives ±inf)"
            )
        with np.errstate(invalid="ignore"):
            bias = np.float32(-k) * d
        if dtype == mx.float16:
            with np.errstate(over="ignore"):
                over = np.flatnonzero(np.isfinite(d) & ~np.isfinite(bias.astype(np.float16)))
            if over.size:
                raise FormatError(
                    f"{f.key}: block {int(over[0])} has d = {d[over[0]]}; bias -{k}*d overflows float16 "
                    f"(use float32 scales)"
                )
    q = fields["q"]
    u = (q.view(np.uint8) ^ 0x80) if lay.signed else q
    w = pack_codes(u, lay.bits)
    nb = n // BLOCK
    w = w.reshape(*lead, nb * lay.bits)
    shape = (*lead, nb)
    np_dtype = np.float32 if dtype == mx.float32 else np.float16
    scales = mx.array(d.astype(np_dtype).reshape(shape))
    biases = mx.array(bias.astype(np_dtype).reshape(shape))
    return mx.array(w), scales, biases, BLOCK, lay.bits


def _as_numpy(a, what: str, key: str) -> np.ndarray:
    mx = _mx()
    if isinstance(a, mx.array):
        if a.dtype == mx.bfloat16:
            a = a.astype(mx.float32)  # exact widening
        return np.array(a)
    try:
        return np.asarray(a)
    except Exception as e:  # noqa: BLE001 - report any conversion failure as bad input
        raise FormatError(f"{key}: {what} is not an array ({e})") from e


def _as_f16_exactly(a: np.ndarray, key: str, what: str, field: str) -> "tuple[np.ndarray, np.ndarray]":
    """``a`` as float32 and as float16, refused unless every value is exactly a float16 (NaNs pass)."""
    a32 = a.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        a16 = a32.astype(np.float16)
    same = (a16.astype(np.float32) == a32) | (np.isnan(a32) & np.isnan(a16))
    if not same.all():
        i = _first(~same)
        raise FormatError(
            f"{key}: {what} {a32[i]!r} at {i} (and {int((~same).sum()) - 1} more) is not exactly representable "
            f"in float16, which is how ggml stores {field}"
        )
    return a32, a16


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def from_mlx_affine(fmt, w, scales, biases, group_size: int, bits: int) -> np.ndarray:
    """MLX affine triplet -> ggml blocks (..., row_bytes) uint8, exactly, or a :class:`FormatError`.

    Accepts group sizes 32, 64 and 128 (each 32-value block takes its group's scale and bias).
    Refuses what ggml cannot hold exactly: scales (and q4_1/q5_1 biases) that are not float16
    values, symmetric-type biases other than -k*scale, infinite symmetric-type scales.
    """
    f, lay = _affine_format(fmt)
    key = f.key
    if bits != lay.bits:
        raise FormatError(f"{key}: holds {lay.bits}-bit codes, got bits={bits}")
    if group_size not in (32, 64, 128):
        raise FormatError(f"{key}: group_size must be 32, 64 or 128 (a multiple of ggml's block of 32), got {group_size}")
    w = _as_numpy(w, "w", key)
    s = _as_numpy(scales, "scales", key)
    b = _as_numpy(biases, "biases", key)
    if w.dtype != np.uint32:
        raise FormatError(f"{key}: w must be uint32 (MLX's packed codes), got dtype {w.dtype}")
    for name, a in (("scales", s), ("biases", b)):
        if not np.issubdtype(a.dtype, np.floating):
            raise FormatError(f"{key}: {name} must be floating point, got dtype {a.dtype}")
    if w.ndim == 0 or s.shape != b.shape or s.shape[:-1] != w.shape[:-1]:
        raise FormatError(f"{key}: shapes do not match: w {w.shape}, scales {s.shape}, biases {b.shape}")
    n = w.shape[-1] * 32 // bits
    if w.shape[-1] * 32 % bits or n != s.shape[-1] * group_size:
        raise FormatError(
            f"{key}: w's last axis {w.shape[-1]} ({w.shape[-1] * 32 / bits:g} codes) does not match "
            f"{s.shape[-1]} groups of {group_size}"
        )
    lead = w.shape[:-1]
    s32, s16 = _as_f16_exactly(s, key, "scale", "d")
    b32 = b.astype(np.float32)
    if lay.has_m:
        b32, b16 = _as_f16_exactly(b, key, "bias", "m")
    else:
        k = _code_offset(lay)
        inf = np.isinf(s32)
        if inf.any():
            i = _first(inf)
            raise FormatError(f"{key}: scale at {i} is infinite; scale*w + bias then has no exact {key} form")
        with np.errstate(invalid="ignore"):
            ok = (b32 == np.float32(-k) * s32) | np.isnan(s32)
        if not ok.all():
            i = _first(~ok)
            raise FormatError(
                f"{key}: bias {b32[i]!r} at {i} (and {int((~ok).sum()) - 1} more) is not -{k}*scale "
                f"(= {np.float32(-k) * s32[i]!r}); {key} has no free offset "
                f"({'/'.join(names(lambda g: _is_affine(g) and g.layout.has_m))} have one)"
            )
    rep = group_size // BLOCK
    d = np.repeat(s16.reshape(-1), rep)
    m = np.repeat(b16.reshape(-1), rep) if lay.has_m else None
    u = unpack_codes(w.reshape(-1, bits), bits, BLOCK)
    q = (u ^ 0x80).view(np.int8) if lay.signed else u
    out = join_blocks(f, d, q, m)
    return out.reshape(*lead, n // BLOCK * f.type_size)
