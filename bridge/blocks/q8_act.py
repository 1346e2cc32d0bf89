"""ggml's 8-bit activation formats, q8_0 and q8_1, as numpy codecs: what ggml's CPU backend turns q
into before its dot products with a quantized K (the K type's ``vec_dot_type``: q8_0 for q8_0, q4_0,
q5_0 and iq4_nl; q8_1 for q4_1 and q5_1).

Layouts (ggml-common.h)::

    q8_0    d:f16  qs:int8[32]                 x_j ~ d * qs[j]
    q8_1    d:f16  s:f16  qs:int8[32]          x_j ~ d * qs[j],  s = d * sum_j qs[j]

Two arithmetics per format (``variant``):

- ``"ref"``: ``quantize_row_q8_{0,1}_ref``: ``d = amax / 127``, ``id = 1 / d``, ``q = roundf(x * id)``
  (half away from zero); q8_1's ``s`` is ``sum(q) * d`` in float32, stored as f16.
- ``"x86"``: ggml-cpu's SIMD ``quantize_row_q8_{0,1}`` on x86 (AVX2 / AVX-512; what llama.cpp runs on
  this machine): ``id = 127 / amax`` and round half to even; q8_1's ``s`` is ``d * sum(q)``.

Both are checked byte for byte against the C functions (``tests/test_llama_arith.py``).
"""

from __future__ import annotations

import numpy as np

from .registry import all_formats

BLOCK = 32
VARIANTS = ("ref", "x86")
# activation format (the registry's vec_dot_type of a legacy block) -> whether it carries s: the one
# of the K types with a minimum m (q8_1), whose dot products need sum(q) per block
WITH_SUM = {f.vec_dot_type: f.layout.has_m for f in all_formats() if f.layout is not None}
TYPE_SIZE = {t: 2 + 2 * s + BLOCK for t, s in WITH_SUM.items()}   # f16 d (+ f16 s) + 32 int8


def activation_format(with_sum: bool) -> str:
    """The activation format with (q8_1) or without (q8_0) the per-block sum ``s``."""
    return next(t for t, s in WITH_SUM.items() if s == bool(with_sum))


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % BLOCK:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of {BLOCK}")
    return x.reshape(-1, BLOCK)


def codes(x: np.ndarray, variant: str = "x86") -> tuple[np.ndarray, np.ndarray]:
    """Per block of 32: the f16 scale ``d`` (N,) and the int8 codes (N, 32) of q8_0 / q8_1 (same)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    b = _blocks(x)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        if variant == "ref":
            idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        else:
            idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    v = (b * idv[:, None]).astype(np.float32)
    if variant == "ref":
        v64 = v.astype(np.float64)                            # C roundf, half away from zero (exact in f64)
        q = np.sign(v64) * np.floor(np.abs(v64) + 0.5)
    else:
        q = np.rint(v)                                        # half to even
    return d.astype(np.float16), q.astype(np.int8)


def quantize(fmt: str, x: np.ndarray, variant: str = "x86") -> np.ndarray:
    """Float rows (..., n) -> q8_0 / q8_1 blocks (..., n // 32 * type size) uint8."""
    if fmt not in TYPE_SIZE:
        raise ValueError(f"unknown activation format {fmt!r}; choose q8_0 or q8_1")
    x = np.asarray(x, dtype=np.float32)
    d16, q = codes(x, variant)
    parts = [d16.reshape(-1, 1).view(np.uint8)]
    if WITH_SUM[fmt]:
        qsum = q.astype(np.int32).sum(axis=1).astype(np.float32)
        d32 = (np.abs(_blocks(x)).max(axis=1) / np.float32(127)).astype(np.float32)   # d before f16
        s = (qsum * d32).astype(np.float32)
        parts.append(s.astype(np.float16).reshape(-1, 1).view(np.uint8))
    parts.append(q.view(np.uint8))
    out = np.concatenate(parts, axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // BLOCK * TYPE_SIZE[fmt])


def split(fmt: str, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """(N, type size) uint8 -> ``d`` (N,) float16, ``s`` (N,) float16 for q8_1, ``q`` (N, 32) int8."""
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, TYPE_SIZE[fmt])
    out = {"d": b[:, 0:2].copy().view("<f2").reshape(-1)}
    pos = 2
    if WITH_SUM[fmt]:
        out["s"] = b[:, 2:4].copy().view("<f2").reshape(-1)
        pos = 4
    out["q"] = b[:, pos:].copy().view(np.int8)
    return out
