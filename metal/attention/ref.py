"""What the fused attention kernel is judged against: a float64 oracle, its error bound, and the
MLX-ops reference path (``decode_attention(..., backend="reference")``).

Both dequantize the caches with :mod:`tqbridge.bridge` (values in the original basis, padding
dropped) and compute plain softmax attention; the oracle in float64 numpy, the reference in
float32 MLX ops.

Error bound (per output row, per component ``d``), for a float32 implementation vs the oracle::

    |o - o64|_d <= SAFETY * [ (exp(2*Δ) - 1 + 2*u*(chain + R_v + 2)) * vs_d ]  +  u_out * |o64|_d
    Δ = scale * u * (n_dot + 2 + R_k) * |q|_2 * max_i |k_i|_2      (logit error of one key)
      + u * (6 * s_max + 16)                                      (exp arguments, rescaling)
      + 4 * u * softcap                                           (tanh evaluation)

where u = 2**-24 (float32 unit roundoff). Derivation: a dot product of n_dot terms accumulated in
float32 is off by at most n_dot*u*Σ|q_d k_d| <= n_dot*u*|q|_2*|k|_2 (Cauchy-Schwarz; +2 for the
dequantization products); a turbo rotation (log2(n) butterfly stages and 2 scalings, n the
rotation group) moves a vector by at most R = log2(n) + 2 relative roundings, once in the kernel
(q) and once in the bridge's dequantization (k): R_k = 2*(log2(n) + 2). softcap is 1-Lipschitz, so
it does not amplify Δ. Subtracting the running max and the online-softmax rescaling perturb exp's
argument by u times at most 3 differences of logits (each <= 2*s_max), plus a few ulp of exp. If
every logit moves by at most Δ, every softmax weight moves by a factor within exp(±2Δ), so the
weighted mean moves by at most (exp(2Δ) - 1) * max_i |v_i,d|. The float32 sums of the weights and
of the weighted values over a serial chain of ``chain`` additions add 2*u*chain relative error each
(numerator and denominator). For turbo V the output is rotated back once (R_v = log2(n) + 2), and
component errors in the rotated basis mix: vs_d is then the 2-norm over d of max_i |y_i,d| (y the
stored rotated values); otherwise vs_d = max_i |v_i,d| over visible keys. u_out is the unit
roundoff of the output dtype (0 for float32 beyond the terms above). The bound is first order;
SAFETY = 2 covers the second-order terms.

``chain`` is the longest serial accumulation: the MLX reference reduces over up to L terms (we do
not know its order, so L); the kernel reports its own (keys per lane + tree depth + splits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ... import bridge
from .problem import Problem, RunRecord, to_numpy, check_problem, record_run, visible_range

U32 = 2.0 ** -24                     # float32 unit roundoff
U16 = 2.0 ** -11                     # binary16 unit roundoff (kernel int8-mma rounds V values and weights to it)
# half of binary16's smallest subnormal (2^-24): below binary16's normal range (2^-14) a rounding's error
# is absolute, not relative — a V row of tiny norm (turbo's norm, a block's d) decodes to subnormals
E16 = 2.0 ** -25
UNIT_ROUNDOFF = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # output rounding
SAFETY = 2.0                         # covers the second-order terms of the first-order bound


def _is_turbo(fmt) -> bool:
    return getattr(fmt, "kind", "") == "turbo"


def _rot_terms(fmt, group: int = 0) -> float:
    """Relative roundings of one rotation of a vector: turbo's own, or llama.cpp's Hadamard of ``group``."""
    if _is_turbo(fmt):
        return math.log2(fmt.block_size) + 2
    return math.log2(group) + 2 if group else 0.0


def _hadamard64(n: int) -> np.ndarray:
    """Orthonormal Sylvester Hadamard matrix of order ``n`` in float64 (symmetric, its own inverse)."""
    h = np.ones((1, 1), np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def _unrotate64(x: np.ndarray, n: int) -> np.ndarray:
    """Stored rows H.x (..., D) back to x, exactly in float64 (``n`` = 0: unchanged)."""
    if not n:
        return x
    shape = x.shape
    return (x.reshape(*shape[:-1], shape[-1] // n, n) @ _hadamard64(n)).reshape(shape)


def dequantized_cache(fmt, blocks: np.ndarray, n: int, l_used: int, head_dim: int, *, rotated: bool = False) -> np.ndarray:
    """Float32 (B, H, l_used, head_dim) values of a cache, in the original basis (or stored, rotated)."""
    blocks = np.ascontiguousarray(to_numpy(blocks)[:, :, :l_used])
    if l_used == 0:
        return np.zeros(blocks.shape[:3] + (head_dim,), np.float32)
    kw = {"rotated": True} if rotated and _is_turbo(fmt) else {}
    x = bridge.dequantize(fmt, blocks, n, **kw)
    return x if rotated else x[..., :head_dim]


def _kernel_rotate32(x: np.ndarray, group: int, s1: np.ndarray, s2: np.ndarray, scale: float) -> np.ndarray:
    """The kernels' float32 rotation of q (``tqa_rotate``), operation for operation: x * s1, the
    butterfly stages h = 1, 2, 4 ... (the bridge's), then x * (scale * s2); ``x`` (..., n), n a
    multiple of group."""
    from ...bridge.blocks.rotation import butterfly_np

    f32 = np.float32
    y = x.astype(f32).reshape(-1, x.shape[-1] // group, group) * s1[:group].astype(f32)
    return (butterfly_np(y, group) * (f32(scale) * s2[:group].astype(f32))).reshape(x.shape)


def quantize_q8(x: np.ndarray, with_sum: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_0_ref / q8_1_ref of float32 rows (..., n), n a multiple of 32 (the
    bridge's activation codec, :mod:`tqbridge.bridge.blocks.q8_act`, variant "ref"): (codes (..., n) int,
    d (..., n/32) binary16 values, s (..., n/32): q8_1's d * sum(codes) as binary16, zeros for q8_0)."""
    from ...bridge.blocks import q8_act

    fmt = q8_act.activation_format(with_sum)
    parts = q8_act.split(fmt, q8_act.quantize(fmt, x, variant="ref"))
    lead, nb = x.shape[:-1], x.shape[-1] // 32
    s = parts["s"].astype(np.float64).reshape(*lead, nb) if with_sum else np.zeros((*lead, nb))
    return (parts["q"].astype(np.int64).reshape(x.shape), parts["d"].astype(np.float64).reshape(*lead, nb), s)


def _k_codes(fmt, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K blocks (B, H, L, row_bytes) -> (int codes (B, H, L, n), d (B, H, L, n/32), m (B, H, L, n/32))
    as kernel int8-mma reads them: x = d * code (+ m)."""
    from ...bridge.blocks import legacy_fields

    lead = blocks.shape[:3]
    flat = np.ascontiguousarray(blocks).reshape(-1, fmt.type_size)
    parts = legacy_fields.split_blocks(fmt, flat)
    lay = legacy_fields.layout(fmt)
    q = parts["q"].astype(np.int64)
    if lay.values is not None:          # codes index a value table (iq4_nl)
        q = np.array(lay.values, np.int64)[q]
    elif not lay.has_m:
        q = q - lay.offset
    nb = blocks.shape[3] // fmt.type_size
    d = parts["d"].astype(np.float64).reshape(*lead, nb)
    m = parts["m"].astype(np.float64).reshape(*lead, nb) if lay.has_m else np.zeros((*lead, nb))
    return q.reshape(*lead, nb * 32), d, m


def int8_scores(q: Any, k_blocks: Any, prob: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Scores (before ``scale``) as kernel int8-mma computes them, in float64 from the exact integer block
    dots: q rotated in float32 as the kernel rotates it, quantized to q8_0 (q8_1 for K formats with
    an offset m); score = sum over blocks of d_k * d_q * sum(k_code * q_code) (+ m_k * s_q).
    Returns (scores, magnitudes), both (B, Hq, T, L): magnitudes = sum over blocks of
    |d_k d_q isum| + |m_k s_q| (what float32 rounding of the block sums is proportional to)."""
    from .formats import side_rotation

    qn = _q4(to_numpy(q).astype(np.float32), prob)
    l_used = max(prob.lengths) if prob.lengths else 0
    n = prob.k_dim
    x = np.zeros(qn.shape[:-1] + (n,), np.float32)
    x[..., :prob.head_dim] = qn
    group, s1, s2, rscale = side_rotation(prob.k_format, prob.k_rot)
    if group:
        x = _kernel_rotate32(x, group, s1, s2, rscale)
    has_m = prob.k_format.layout is not None and prob.k_format.layout.has_m
    codes, dq, sq = quantize_q8(x, has_m)                       # (B, Hq, T, n), (B, Hq, T, nb)
    kc, dk, mk = _k_codes(prob.k_format, to_numpy(k_blocks)[:, :, :l_used])   # (B, Hkv, L, n), (B, Hkv, L, nb)
    g = prob.group
    b_, hq, t_ = qn.shape[:3]
    nb = n // 32
    kc = np.repeat(kc, g, axis=1).reshape(b_, hq, 1, l_used, nb, 32)
    isum = (kc * codes.reshape(b_, hq, t_, 1, nb, 32)).sum(axis=-1).astype(np.float64)   # exact
    dd = np.repeat(dk, g, axis=1)[:, :, None] * dq[:, :, :, None, :]
    terms = dd * isum
    mag = np.abs(terms)
    if has_m:
        mt = np.repeat(mk, g, axis=1)[:, :, None] * sq[:, :, :, None, :]
        terms = terms + mt
        mag = mag + np.abs(mt)
    return terms.sum(axis=-1), mag.sum(axis=-1)


def _q4(q: np.ndarray, prob: Problem) -> np.ndarray:
    return q.reshape(prob.batch, prob.q_heads, prob.rows, prob.head_dim)


def oracle(q: Any, k_blocks: Any, v_blocks: Any, prob: Problem, sinks: Any = None, *,
           chain: "int | None" = None, q_precision: str = "exact") -> tuple[np.ndarray, np.ndarray]:
    """float64 attention and its error bound (both (B, Hq, T, D)) for a float32 kernel.

    ``chain`` is the implementation's longest serial accumulation (default: the cache length).
    ``q_precision``: "exact" (q enters the scores as given) or "int8" (kernel int8-mma: q rotated and
    quantized to q8_0 / q8_1 as ggml does, exact integer block dots; V values and the softmax weights
    rounded to binary16 in the V product). The int8 oracle is exact attention *of the quantized q*:
    the quantization of q is part of the arithmetic being judged, not an error it is allowed.
    """
    if q_precision not in ("exact", "int8"):
        raise ValueError(f"q_precision must be 'exact' or 'int8', got {q_precision!r}")
    qn = _q4(to_numpy(q).astype(np.float64), prob)
    s8 = s8_mag = None
    if q_precision == "int8":
        s8, s8_mag = int8_scores(q, k_blocks, prob)
    l_used = max(prob.lengths) if prob.lengths else 0
    k_rot, v_rot_group = getattr(prob, "k_rot", 0), getattr(prob, "v_rot", 0)
    k = dequantized_cache(prob.k_format, k_blocks, prob.k_dim, l_used, prob.k_dim if k_rot else prob.head_dim)
    k = _unrotate64(k.astype(np.float64), k_rot)[..., :prob.head_dim]
    v_stored = dequantized_cache(prob.v_format, v_blocks, prob.v_dim, l_used, prob.v_dim if v_rot_group else prob.head_dim)
    v = _unrotate64(v_stored.astype(np.float64), v_rot_group)[..., :prob.head_dim]
    if _is_turbo(prob.v_format):
        v_rot = dequantized_cache(prob.v_format, v_blocks, prob.v_dim, l_used, prob.head_dim, rotated=True).astype(np.float64)
    else:
        v_rot = v_stored.astype(np.float64) if v_rot_group else None
    sk = None if sinks is None else to_numpy(sinks).astype(np.float64).reshape(-1)
    out = np.zeros(qn.shape, np.float64)
    bound = np.zeros(qn.shape, np.float64)
    g = prob.group
    u_out = UNIT_ROUNDOFF.get(str(getattr(q, "dtype", "float32")).replace("mlx.core.", ""), 0.0)
    n_dot = prob.k_dim
    # turbo K: q rotated in the kernel and k in the bridge's float32 decode; llama's K rotation: q only
    r_k = 2 * _rot_terms(prob.k_format) if _is_turbo(prob.k_format) else _rot_terms(prob.k_format, k_rot)
    r_v = _rot_terms(prob.v_format, v_rot_group)
    for b in range(prob.batch):
        for t in range(prob.rows):
            lo, hi = visible_range(prob.lengths[b], prob.rows, t, prob.window, prob.row_starts[b])
            if hi <= lo:
                continue  # no visible key: the output is zero by contract
            kh = np.repeat(k[b, :, lo:hi], g, axis=0)          # (Hq, n, D)
            vh = np.repeat(v[b, :, lo:hi], g, axis=0)
            qv = qn[b, :, t]                                    # (Hq, D)
            if s8 is not None:
                s = prob.scale * s8[b, :, t, lo:hi]
            else:
                s = prob.scale * np.einsum("hnd,hd->hn", kh, qv)
            if prob.softcap:
                s = prob.softcap * np.tanh(s / prob.softcap)
            m = s.max(axis=1)
            if sk is not None:
                m = np.maximum(m, sk)
            w = np.exp(s - m[:, None])
            den = w.sum(axis=1) + (np.exp(sk - m) if sk is not None else 0.0)
            o = np.einsum("hn,hnd->hd", w, vh) / den[:, None]
            out[b, :, t] = o
            # the bound
            smax = np.abs(s).max(axis=1)
            if sk is not None:
                smax = np.maximum(smax, np.abs(sk))
            knorm = np.sqrt((kh ** 2).sum(axis=2)).max(axis=1)
            qnorm = np.sqrt((qv ** 2).sum(axis=1))
            if s8 is not None:   # integer dots exact; per block two roundings, the block sum, the scale
                dot_err = prob.scale * U32 * (prob.k_dim // 32 + 4) * s8_mag[b, :, t, lo:hi].max(axis=1)
            else:
                dot_err = prob.scale * U32 * (n_dot + 2 + r_k) * qnorm * knorm
            delta = dot_err + U32 * (6 * smax + 16) + 4 * U32 * prob.softcap
            if v_rot is not None:
                yh = np.abs(v_rot[b, :, lo:hi]).max(axis=1)      # (Hkv, Dpad)
                vs = np.repeat(np.sqrt((yh ** 2).sum(axis=1)), g)[:, None] * np.ones((1, prob.head_dim))
            else:
                vs = np.repeat(np.abs(v[b, :, lo:hi]).max(axis=1), g, axis=0)  # (Hq, D)
            c = chain if chain is not None else hi - lo
            rel = np.expm1(2 * delta) + 2 * U32 * (c + r_v + 2)
            bound[b, :, t] = SAFETY * rel[:, None] * vs + u_out * np.abs(o)
            if s8 is not None:
                # kernel int8-mma rounds each V value and each (2^15-scaled) weight to binary16, relative
                # error <= U16 each (turbo V: its centroid rounded, then times the binary16 norm: two
                # roundings): the weighted mean moves by at most n_r * U16 * sum(w |v|) / den
                # (in the stored basis; a rotation back mixes components: the 2-norm bounds each)
                if v_rot is not None:
                    yw = np.einsum("hn,hnd->hd", w, np.abs(np.repeat(v_rot[b, :, lo:hi], g, axis=0))) / den[:, None]
                    wv = np.sqrt((yw ** 2).sum(axis=1))[:, None] * np.ones((1, prob.head_dim))
                else:
                    wv = np.einsum("hn,hnd->hd", w, np.abs(vh)) / den[:, None]
                # each of those roundings may land below binary16's normal range: + E16 absolute per
                # value, at most E16 in a weighted mean, sqrt(n) E16 in a component after the rotation
                # back (a weight, scaled by 2^15, goes subnormal only below 2^-29 of the largest: negligible)
                n_r = 3 if _is_turbo(prob.v_format) else 2
                under = n_r * E16 * (math.sqrt(v_rot.shape[-1]) if v_rot is not None else 1.0)
                bound[b, :, t] += SAFETY * (n_r * U16 * wv + under)
    return out, bound


def attention_oracle(q: Any, k_blocks: Any, v_blocks: Any, *, k_format: Any, v_format: Any, length: Any,
                     scale: "float | None" = None, window: "int | None" = None, softcap: "float | None" = None,
                     sinks: Any = None, rotation: "tuple[int, int] | None" = None, start: Any = 0) -> np.ndarray:
    """Plain softmax attention in float64 over the bridge's dequantization (rows rotated back where
    ``rotation`` says the cache holds llama.cpp's rotated rows); shaped like q."""
    prob = check_problem(q, k_blocks, v_blocks, k_format=k_format, v_format=v_format, length=length,
                         scale=scale, window=window, softcap=softcap, sinks=sinks, rotation=rotation, start=start)
    out, _ = oracle(q, k_blocks, v_blocks, prob, sinks)
    return out[:, :, 0] if prob.squeeze_rows else out


# --------------------------------------------------------------------------- MLX reference path


def _mlx_cache(fmt, blocks, n: int, l_used: int, head_dim: int, rotated: bool = False):
    """MLX float32 values of a cache; ``rotated`` (turbo): in the stored, rotated basis, all ``n``."""
    import mlx.core as mx

    blk = blocks if isinstance(blocks, mx.array) else mx.array(np.ascontiguousarray(blocks))
    blk = blk[:, :, :l_used]
    if l_used == 0:
        return mx.zeros(tuple(blk.shape[:3]) + (n if rotated else head_dim,), mx.float32)
    kw = {"rotated": True} if rotated else {}
    try:
        x = bridge.mlx_dequantize(fmt, blk, n, **kw)
    except bridge.FormatError:
        # This format has no MLX decoder yet: decode with the numpy reference (same values).
        x = mx.array(bridge.dequantize(fmt, np.array(blk), n, **kw))
    return x if rotated else x[..., :head_dim]


def _turbo_rotate(x, fmt, n: int, inverse: bool = False):
    """``x`` (..., D <= n) zero-padded to ``n`` and rotated into a turbo format's basis (or back,
    ``inverse``), group by group: the fork's rotation is orthogonal, so (R q).(R k) = q.k and
    R^T (sum p R v) = sum p v. Rotating q and the output once replaces the inverse rotation of
    every cached row."""
    import mlx.core as mx

    from ...bridge.blocks import rotation

    grp = fmt.block_size
    if x.shape[-1] != n:
        x = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - x.shape[-1])])
    lead = tuple(x.shape[:-1])
    y = x.reshape(*lead, n // grp, grp)
    y = rotation.mlx_inverse(y, grp) if inverse else rotation.mlx_forward(y, grp)
    return y.reshape(*lead, n)


def _mlx_q8(x, n: int):
    """q (..., D) zero-padded to ``n`` and replaced by its q8_0 values (ggml's quantize_row_q8_0_ref:
    d = amax / 127 kept as binary16, codes roundf(x / d)), MLX ops; float32 (..., D)."""
    import mlx.core as mx

    d_in = x.shape[-1]
    if d_in != n:
        x = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - d_in)])
    xb = x.reshape(*x.shape[:-1], n // 32, 32)
    d = mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127.0
    idv = mx.where(d != 0, 1.0 / mx.where(d != 0, d, mx.ones_like(d)), mx.zeros_like(d))
    v = xb * idv
    a = mx.abs(v)
    t = mx.floor(a)
    r = mx.where(a - t >= 0.5, t + 1.0, t)          # roundf: half away from zero, exact
    codes = mx.where(v < 0, -r, r)
    y = codes * d.astype(mx.float16).astype(mx.float32)
    return y.reshape(*x.shape[:-1], n)[..., :d_in]


def reference_attention(q: Any, k_blocks: Any, v_blocks: Any, prob: Problem, sinks: Any = None,
                        q_precision: str = "exact") -> Any:
    """float32 MLX ops: dequantize both caches, scores, masked softmax (with sinks), weighted sum.
    ``q_precision="int8"``: q (in the cache's basis) replaced by its q8_0 values first, as kernel int8-mma
    and llama.cpp's vec_dot do (for q4_1 / q5_1 K the m term uses those values, not q8_1's rounded
    sum: an approximation of int8-mma within its binary16 error)."""
    import mlx.core as mx

    was_numpy = not isinstance(q, mx.array)
    qm = mx.array(q) if was_numpy else q
    out_dtype = qm.dtype
    b, hq, hkv, t, d, g = prob.batch, prob.q_heads, prob.kv_heads, prob.rows, prob.head_dim, prob.group
    l_used = max(prob.lengths)
    if l_used == 0:  # no visible key anywhere: zeros, as the kernel returns (the sinks alone get all weight)
        o = mx.zeros(tuple(qm.shape), out_dtype)
        record_run(RunRecord(backend="reference", dispatches=0))
        return to_numpy(o).astype(np.asarray(q).dtype, copy=False) if was_numpy else o
    # turbo caches stay in their rotated basis: q goes in once, the output comes back once
    k_turbo, v_turbo = _is_turbo(prob.k_format), _is_turbo(prob.v_format)
    k = _mlx_cache(prob.k_format, k_blocks, prob.k_dim, l_used, d, rotated=k_turbo)   # (B, Hkv, L, D or Dk)
    v = _mlx_cache(prob.v_format, v_blocks, prob.v_dim, l_used, d, rotated=v_turbo)
    qq = qm.astype(mx.float32)
    if prob.k_rot:   # the cache holds H.k: (H.q).(H.k) = q.k
        from ..hadamard import hadamard_rotate

        qq = hadamard_rotate(qq, prob.k_rot)
    if k_turbo:
        qq = _turbo_rotate(qq, prob.k_format, prob.k_dim)
    if q_precision == "int8":
        qq = _mlx_q8(qq, prob.k_dim)
    qq = qq.reshape(b, hkv, g * t, qq.shape[-1])                          # rows ordered (head, t)
    s = (qq @ k.transpose(0, 1, 3, 2)) * prob.scale                      # (B, Hkv, G*T, L)
    if prob.softcap:
        s = prob.softcap * mx.tanh(s / prob.softcap)
    # visibility mask from the per-row ranges
    lo = np.zeros((b, t), np.int64)
    hi = np.zeros((b, t), np.int64)
    for bi in range(b):
        for ti in range(t):
            lo[bi, ti], hi[bi, ti] = visible_range(prob.lengths[bi], t, ti, prob.window, prob.row_starts[bi])
    pos = mx.arange(l_used).reshape(1, 1, 1, 1, l_used)
    lo_m = mx.array(lo).reshape(b, 1, 1, t, 1)
    hi_m = mx.array(hi).reshape(b, 1, 1, t, 1)
    vis = ((pos >= lo_m) & (pos < hi_m))                                  # (B, 1, 1, T, L)
    vis = mx.broadcast_to(vis, (b, hkv, g, t, l_used)).reshape(b, hkv, g * t, l_used)
    neg = mx.array(-np.inf, mx.float32)
    sm = mx.where(vis, s, neg)
    m = sm.max(axis=-1, keepdims=True)
    if sinks is not None:
        sk = (sinks if isinstance(sinks, mx.array) else mx.array(np.asarray(sinks))).astype(mx.float32)
        sk = mx.broadcast_to(sk.reshape(hkv, g, 1, 1), (hkv, g, t, 1)).reshape(1, hkv, g * t, 1)
        m = mx.maximum(m, sk)
    m = mx.where(mx.isinf(m), mx.zeros_like(m), m)
    w = mx.where(vis, mx.exp(sm - m), mx.zeros_like(sm))
    den = w.sum(axis=-1, keepdims=True)
    if sinks is not None:
        den = den + mx.exp(sk - m)
    o = (w @ v) / mx.where(den > 0, den, mx.ones_like(den))
    if v_turbo:
        o = _turbo_rotate(o, prob.v_format, prob.v_dim, inverse=True)[..., :d]
    if prob.v_rot:   # the cache holds H.v: rotate the weighted sum back
        from ..hadamard import hadamard_rotate

        o = hadamard_rotate(o, prob.v_rot)
    o = o.reshape(b, hq, t, d)
    if prob.squeeze_rows:
        o = o.reshape(b, hq, d)
    o = o.astype(out_dtype)
    record_run(RunRecord(backend="reference", dispatches=0))
    if was_numpy:
        mx.eval(o)
        return to_numpy(o).astype(np.asarray(q).dtype, copy=False)
    return o
