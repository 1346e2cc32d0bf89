"""iq4_nl: 32 values -> fp16 scale ``d`` + 16 bytes of 4-bit indices into a fixed non-linear table.

Block layout (ggml-common.h ``block_iq4_nl``): ``d`` fp16 at offset 0, ``qs[16]`` at offset 2; value j
(j < 16) is the low nibble of ``qs[j]``, value 16 + j the high nibble. x = d * kvalues[idx].

gguf-py dequantizes it but has no quantizer; this one reproduces ggml's ``quantize_iq4_nl`` without an
importance matrix (what ``ggml_quantize_chunk`` runs for KV rows): the scale search with ``ntry = 7``
and weights ``w = x*x``. Every sum is accumulated sequentially in float32 in C's order, and every
product is evaluated left to right as C does (``(w*q)*x``); ggml-base is compiled without FMA
contraction of these expressions on x86-64 (it carries no ISA flags), which the byte-parity tests
against the C library confirm.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gq

from .format_types import refuse_nonfinite

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_KV_F32 = KVALUES.astype(np.float32)
GROUP_MAX_EPS = np.float32(1e-15)  # ggml-quants.c
NTRY = 7
BLOCK = 32


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8(16, kvalues_iq4nl, x)`` elementwise (NaN -> 15, as its search ends)."""
    x = np.asarray(x, dtype=np.float32)
    mu = np.searchsorted(_KV_F32, x, side="right")  # values <= x
    mu = np.clip(mu, 1, 15)
    lo = _KV_F32[mu - 1]
    hi = _KV_F32[mu]
    with np.errstate(invalid="ignore"):
        idx = np.where((x - lo) < (hi - x), mu - 1, mu)
        idx = np.where(x <= _KV_F32[0], 0, idx)
        idx = np.where(x >= _KV_F32[15], 15, idx)
    idx = np.where(np.isnan(x), 15, idx)
    return idx.astype(np.uint8)


def _sums(id_: np.ndarray, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sequential float32 sums of w*q*x and w*q*q for q = kvalues[best_index(id*x)]."""
    q = _KV_F32[best_index(id_[:, None] * x)]
    wq = w * q
    t1 = wq * x
    t2 = wq * q
    sumqx = np.zeros(x.shape[0], dtype=np.float32)
    sumq2 = np.zeros(x.shape[0], dtype=np.float32)
    for j in range(x.shape[1]):  # C order: sequential accumulation
        sumqx += t1[:, j]
        sumq2 += t2[:, j]
    return sumqx, sumq2


def _pack(d: np.ndarray, L: np.ndarray) -> np.ndarray:
    out = np.empty((d.shape[0], 18), dtype=np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        h = d.astype("<f2").view("<u2")
    # A NaN scale (only from overflowing arithmetic on huge finite input) is stored as x86-64's
    # negative default NaN, 0xfe00, whatever NaN sign this CPU produced.
    h = np.where(np.isnan(d), np.uint16(0xFE00), h).astype("<u2")
    out[:, :2] = h.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = L[:, :16] | (L[:, 16:] << 4)
    return out


def _quantize_no_search(x: np.ndarray, w: np.ndarray, mx: np.ndarray, live: np.ndarray) -> np.ndarray:
    """C's ``ntry = -1`` path: ``d = max/values[0]`` (note: no minus), one pass, indices kept."""
    with np.errstate(all="ignore"):
        d0 = mx / _KV_F32[0]
        id_ = np.float32(1) / d0
        L = best_index(id_[:, None] * x)
        q = _KV_F32[L]
        wq = w * q
        t1, t2 = wq * x, wq * q
        sumqx = np.zeros(x.shape[0], dtype=np.float32)
        sumq2 = np.zeros(x.shape[0], dtype=np.float32)
        for j in range(x.shape[1]):  # sequential, as C accumulates
            sumqx += t1[:, j]
            sumq2 += t2[:, j]
        d = np.where(live, sumqx / sumq2, np.float32(0)).astype(np.float32)
    L = np.where(live[:, None], L, np.uint8(8)).astype(np.uint8)
    return _pack(d, L)


class IQ4NL:
    """Codec for ``iq4_nl`` (ggml type 20)."""

    qtype = GGMLQuantizationType.IQ4_NL

    @staticmethod
    def quantize_blocks(x: np.ndarray, *, search: bool = True) -> np.ndarray:
        """``search=True``: ``ggml_quantize_chunk``'s quantizer (scale search, ``ntry = 7``).
        ``search=False``: ``quantize_row_iq4_nl_ref`` (``ntry = -1``), what llama.cpp's CPU backend
        runs when it writes iq4_nl KV-cache rows: one least-squares scale from the first pass, and the
        indices of that pass kept. For an all-(near-)zero block C leaves the indices unwritten (stale
        stack memory); we write index 8 there (the block decodes to zeros either way).
        """
        x = np.ascontiguousarray(x, dtype=np.float32)
        refuse_nonfinite(IQ4NL.qtype.name.lower(), x)
        n = x.shape[0]
        with np.errstate(all="ignore"):
            w = x * x
            ax = np.abs(x)
            # first index of the largest |x| (C: strict '>' while scanning); NaN never wins
            ax_nonan = np.where(np.isnan(ax), np.float32(-1), ax)
            imax = np.argmax(ax_nonan, axis=1)
            amax = ax_nonan[np.arange(n), imax]
            mx = x[np.arange(n), imax]
            live = amax >= GROUP_MAX_EPS

            if not search:
                return _quantize_no_search(x, w, mx, live)
            d = -mx / _KV_F32[0]
            id_ = np.float32(1) / d
            sumqx, sumq2 = _sums(id_, x, w)
            d = sumqx / sumq2
            best = d * sumqx
            for itry in range(-NTRY, NTRY + 1):
                id_ = np.float32(itry + int(KVALUES[0])) / mx
                sqx, sq2 = _sums(id_, x, w)
                better = (sq2 > 0) & (sqx * sqx > best * sq2)
                d = np.where(better, sqx / sq2, d)
                best = np.where(better, d * sqx, best)
            d = np.where(live, d, np.float32(0)).astype(np.float32)
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            L = best_index(inv[:, None] * x)
        return _pack(d, L)

    @staticmethod
    def dequantize_blocks(b: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            y = gq.IQ4_NL.dequantize_blocks(np.ascontiguousarray(b, dtype=np.uint8))
        return y.astype(np.float32, copy=False)
