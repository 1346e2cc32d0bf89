"""The float and legacy ggml block formats as MLX ops, byte-identical to the numpy reference.

Every function works on whole blocks, ``(n_blocks, block_size)`` float32 in and
``(n_blocks, type_size)`` uint8 out (or the reverse), and mirrors ggml-quants.c's reference
quantizers operation by operation:

- float32 arithmetic in C's order, division where C divides (``max / -8``) and a reciprocal
  where C takes one (``id = 1.0f/d``), never fused multiply-adds (MLX runs each op as its own
  kernel, and ggml-base on x86-64 is built without FMA contraction);
- ``roundf`` rounds half away from zero (MLX's ``round`` is half-to-even, so it is not used);
- "first element wins" scans (C updates only on a strict ``<`` / ``>``) pick the first index,
  which fixes the sign of zero scales exactly as C does;
- C's float-to-int conversion is emulated as x86-64 does it (truncate toward zero; NaN,
  infinity and out-of-range values become INT32_MIN), then narrowed modulo 2^8. C leaves such
  conversions undefined; they only happen for blocks whose scale is degenerate (a reciprocal
  that overflows), and we pin them to what ggml produces on x86-64.
"""

from __future__ import annotations

import mlx.core as mx

from .iq4_nl import GROUP_MAX_EPS, KVALUES, NTRY

_INT32_MIN = -(2**31)
_KV = mx.array(KVALUES.astype("float32"))


# ---- helpers ---------------------------------------------------------------------------------

def _c_int(v: mx.array) -> mx.array:
    """float32 -> int32 as x86-64 C converts (cvttss2si): truncation, invalid -> INT32_MIN."""
    ok = mx.isfinite(v) & (mx.abs(v) < 2.0**31)
    return mx.where(ok, mx.where(ok, v, 0.0).astype(mx.int32), _INT32_MIN)


def _c_int8(v: mx.array) -> mx.array:
    """``(int8_t)v`` for a float32 ``v``, as int32 values in [-128, 127]."""
    b = _c_int(v) & 0xFF
    return mx.where(b >= 128, b - 256, b)


def _roundf(v: mx.array) -> mx.array:
    """C ``roundf``: half away from zero (exact in float32)."""
    a = mx.abs(v)
    fl = mx.floor(a)
    return mx.sign(v) * (fl + mx.floor(2.0 * (a - fl)))


def _first_index(mask: mx.array) -> mx.array:
    """Index of the first True along axis 1 (keepdims)."""
    n = mask.shape[1]
    idx = mx.arange(n, dtype=mx.int32)[None, :]
    return mx.min(mx.where(mask, idx, n), axis=1, keepdims=True)


def _first_of(x: mx.array, value: mx.array) -> mx.array:
    """The first element of each row equal to ``value`` (so signed zeros come out as C scans them)."""
    return mx.take_along_axis(x, _first_index(x == value), axis=1)


def _f16_bytes(v: mx.array, *, computed: bool = True) -> mx.array:
    """float32 (n, 1) -> fp16 little-endian bytes (n, 2), round to nearest even (ggml's
    ``ggml_compute_fp32_to_fp16``: a NaN becomes sign | 0x7e00).

    ``computed``: ``v`` is a scale computed from finite input, so a NaN in it was produced by the
    arithmetic (inf - inf, 0 * inf ...). x86-64 produces the negative default NaN (0xffc00000,
    stored as 0xfe00); GPUs produce a positive one. We store 0xfe00 everywhere, as ggml does on x86-64.
    """
    h = mx.view(v.astype(mx.float16), mx.uint16).astype(mx.uint32)
    if computed:
        nan_bits = mx.array(0xFE00, dtype=mx.uint32)
    else:
        nan_bits = ((mx.view(v, mx.uint32) >> 31) << 15) | 0x7E00
    h = mx.where(mx.isnan(v), nan_bits, h)
    return mx.concatenate([h & 0xFF, h >> 8], axis=1).astype(mx.uint8)


def _f16_from(b: mx.array) -> mx.array:
    """fp16 little-endian bytes (n, 2) -> float32 (n, 1)."""
    h = b[:, 0:1].astype(mx.uint16) | (b[:, 1:2].astype(mx.uint16) << 8)
    return mx.view(h, mx.float16).astype(mx.float32)


def _qh_bytes(bits: mx.array) -> mx.array:
    """(n, 32) 0/1 bits -> the little-endian uint32 ``qh`` as (n, 4) bytes, bit j = value j."""
    n = bits.shape[0]
    w = (mx.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=mx.int32))[None, None, :]
    return mx.sum(bits.reshape(n, 4, 8) * w, axis=2).astype(mx.uint8)


def _qh_bits(qh: mx.array) -> mx.array:
    """(n, 4) bytes -> (n, 32) int32 bits."""
    n = qh.shape[0]
    sh = mx.arange(8, dtype=mx.int32)[None, None, :]
    return ((qh.astype(mx.int32)[:, :, None] >> sh) & 1).reshape(n, 32)


def _pack_nibbles(q: mx.array) -> mx.array:
    """C: ``qs[j] = xi0 | (xi1 << 4)`` with values j and 16 + j, stored as uint8."""
    return ((q[:, :16] | (q[:, 16:] << 4)) & 0xFF).astype(mx.uint8)


def _unpack_nibbles(qs: mx.array) -> mx.array:
    q = qs.astype(mx.int32)
    return mx.concatenate([q & 0x0F, q >> 4], axis=1)


def _plus_m(xd: mx.array, m: mx.array) -> mx.array:
    """C's ``x*d + m``; when both are NaN x86-64 returns the first operand's NaN, so we do too."""
    return mx.where(mx.isnan(xd), xd, xd + m)


def _recip(d: mx.array) -> mx.array:
    """C: ``id = d ? 1.0f/d : 0.0f``."""
    return mx.where(d != 0, 1.0 / mx.where(d != 0, d, 1.0), 0.0)


# ---- float formats ---------------------------------------------------------------------------

def f32_quantize(x):
    return mx.view(x.astype(mx.float32), mx.uint8)


def f32_dequantize(b):
    return mx.view(b, mx.float32)


def f16_quantize(x):
    return _f16_bytes(x.reshape(-1, 1), computed=False).reshape(x.shape[0], 2 * x.shape[1])


def f16_dequantize(b):
    n = b.shape[0]
    return _f16_from(b.reshape(-1, 2)).reshape(n, b.shape[1] // 2)


def bf16_quantize(x):
    """ggml's ``ggml_compute_fp32_to_bf16``: NaN -> (u >> 16) | 64, else round to nearest even."""
    u = mx.view(x, mx.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = mx.where(nan, (u >> 16) | 64, (u + (0x7FFF + ((u >> 16) & 1))) >> 16)
    r = r.reshape(x.shape[0], x.shape[1], 1)
    return mx.concatenate([r & 0xFF, r >> 8], axis=2).astype(mx.uint8).reshape(x.shape[0], -1)


def bf16_dequantize(b):
    n = b.shape[0]
    p = b.reshape(n, -1, 2).astype(mx.uint32)
    return mx.view((p[:, :, 0] | (p[:, :, 1] << 8)) << 16, mx.float32)


# ---- q8_0 ------------------------------------------------------------------------------------

def q8_0_quantize(x):
    amax = mx.max(mx.abs(x), axis=1, keepdims=True)
    d = amax / 127.0
    q = _c_int(_roundf(x * _recip(d))) & 0xFF
    return mx.concatenate([_f16_bytes(d), q.astype(mx.uint8)], axis=1)


def q8_0_dequantize(b):
    d = _f16_from(b[:, :2])
    q = b[:, 2:].astype(mx.int32)
    q = mx.where(q >= 128, q - 256, q)
    return q.astype(mx.float32) * d


# ---- q4_0 / q5_0: symmetric, scale from the value of largest magnitude ----------------------

def _signed_max(x):
    a = mx.abs(x)
    amax = mx.max(a, axis=1, keepdims=True)
    m = mx.take_along_axis(x, _first_index(a == amax), axis=1)
    return mx.where(amax == 0, 0.0, m)  # C keeps its initial +0.0 when no |v| > 0


def q4_0_quantize(x):
    d = _signed_max(x) / -8.0
    xi = mx.minimum(15, _c_int8(x * _recip(d) + 8.5))
    return mx.concatenate([_f16_bytes(d), _pack_nibbles(xi)], axis=1)


def q4_0_dequantize(b):
    d = _f16_from(b[:, :2])
    return (_unpack_nibbles(b[:, 2:]) - 8).astype(mx.float32) * d


def q5_0_quantize(x):
    d = _signed_max(x) / -16.0
    xi = mx.minimum(31, _c_int8(x * _recip(d) + 16.5)) & 0xFF
    return mx.concatenate([_f16_bytes(d), _qh_bytes((xi >> 4) & 1), _pack_nibbles(xi & 0x0F)], axis=1)


def q5_0_dequantize(b):
    d = _f16_from(b[:, :2])
    q = _unpack_nibbles(b[:, 6:]) | (_qh_bits(b[:, 2:6]) << 4)
    return (q - 16).astype(mx.float32) * d


# ---- q4_1 / q5_1: asymmetric, d = (max - min) / levels, m = min -----------------------------

def _min_max(x):
    mn = _first_of(x, mx.min(x, axis=1, keepdims=True))
    mxv = _first_of(x, mx.max(x, axis=1, keepdims=True))
    return mn, mxv


def q4_1_quantize(x):
    mn, mxv = _min_max(x)
    d = (mxv - mn) / 15.0
    xi = mx.minimum(15, _c_int8((x - mn) * _recip(d) + 0.5))
    return mx.concatenate([_f16_bytes(d), _f16_bytes(mn), _pack_nibbles(xi)], axis=1)


def q4_1_dequantize(b):
    d = _f16_from(b[:, :2])
    m = _f16_from(b[:, 2:4])
    return _plus_m(_unpack_nibbles(b[:, 4:]).astype(mx.float32) * d, m)


def q5_1_quantize(x):
    mn, mxv = _min_max(x)
    d = (mxv - mn) / 31.0
    xi = mx.minimum(31, _c_int8((x - mn) * _recip(d) + 0.5)) & 0xFF
    return mx.concatenate([_f16_bytes(d), _f16_bytes(mn), _qh_bytes((xi >> 4) & 1),
                           _pack_nibbles(xi & 0x0F)], axis=1)


def q5_1_dequantize(b):
    d = _f16_from(b[:, :2])
    m = _f16_from(b[:, 2:4])
    q = _unpack_nibbles(b[:, 8:]) | (_qh_bits(b[:, 4:8]) << 4)
    return _plus_m(q.astype(mx.float32) * d, m)


# ---- iq4_nl ----------------------------------------------------------------------------------

def _best_index(v):
    """ggml's ``best_index_int8(16, kvalues_iq4nl, v)`` elementwise (int32)."""
    mu = mx.sum((v[..., None] >= _KV).astype(mx.int32), axis=-1)
    mu = mx.clip(mu, 1, 15)
    lo = mx.take(_KV, mu - 1)
    hi = mx.take(_KV, mu)
    idx = mx.where((v - lo) < (hi - v), mu - 1, mu)
    idx = mx.where(v <= _KV[0], 0, idx)
    idx = mx.where(v >= _KV[15], 15, idx)
    return mx.where(mx.isnan(v), 15, idx)


def seq_sum(t):
    """Row sums of ``t`` (n, m) accumulated in C's order (t[:, 0] + t[:, 1] + ...) in float32, as (n,).

    On MLX's CPU device one ``cumsum`` (its CPU scan adds sequentially, in order: byte-identical to
    the loop, which the codecs' exactness tests against ggml's C check); elsewhere (a GPU scans in
    parallel) the explicit loop of m - 1 additions."""
    if mx.default_device() == mx.cpu:
        return mx.cumsum(t, axis=1)[:, -1]
    acc = t[:, 0]
    for j in range(1, t.shape[1]):
        acc = acc + t[:, j]
    return acc


def _iq4_sums(id_, x, w):
    q = mx.take(_KV, _best_index(id_ * x))
    wq = w * q
    t1 = wq * x
    t2 = wq * q
    return seq_sum(t1)[:, None], seq_sum(t2)[:, None]


def iq4_nl_quantize(x, search: bool = True):
    """``search=True``: ggml_quantize_chunk's quantizer; ``search=False``: quantize_row_iq4_nl_ref,
    what llama.cpp writes into its KV cache (see tqbridge.bridge.blocks.iq4_nl)."""
    w = x * x
    ax = mx.abs(x)
    amax = mx.max(ax, axis=1, keepdims=True)
    mxv = mx.take_along_axis(x, _first_index(ax == amax), axis=1)
    live = amax >= float(GROUP_MAX_EPS)
    safe = mx.where(live, mxv, 1.0)
    if not search:   # ntry = -1: d = max / values[0] (no minus), one pass, its indices kept
        d0 = safe / float(KVALUES[0])
        L = _best_index((1.0 / d0) * x)
        q = mx.take(_KV, L)
        wq = w * q
        t1, t2 = wq * x, wq * q
        sqx, sq2 = seq_sum(t1), seq_sum(t2)          # C order: sequential float32 accumulation
        d = mx.where(live, (sqx / sq2)[:, None], 0.0)
        L = mx.where(live, L, 8)
        return mx.concatenate([_f16_bytes(d), _pack_nibbles(L)], axis=1)
    d = -safe / float(KVALUES[0])
    sumqx, sumq2 = _iq4_sums(1.0 / d, x, w)
    d = sumqx / sumq2
    best = d * sumqx
    for itry in range(-NTRY, NTRY + 1):
        id_ = float(itry + int(KVALUES[0])) / safe
        sqx, sq2 = _iq4_sums(id_, x, w)
        better = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = mx.where(better, sqx / mx.where(better, sq2, 1.0), d)
        best = mx.where(better, d * sqx, best)
    d = mx.where(live, d, 0.0)
    L = _best_index(_recip(d) * x)
    return mx.concatenate([_f16_bytes(d), _pack_nibbles(L)], axis=1)


def iq4_nl_dequantize(b):
    d = _f16_from(b[:, :2])
    return d * mx.take(_KV, _unpack_nibbles(b[:, 2:]))
