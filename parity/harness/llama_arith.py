"""llama.cpp's attention arithmetic in numpy: what ggml's CPU ``flash_attn_ext`` computes for one query
row, step by step, so a port can be judged as "the same arithmetic as ggml", not only "within float32
round-off of exact attention".

The steps (ggml-cpu ``ops.cpp``, the one-chunk path that decode with a quantized K takes; read there,
written here independently):

1. q is converted to the K type's ``vec_dot_type`` (ggml-cpu's ``from_float``): q8_0 for q8_0, q4_0,
   q5_0 and iq4_nl K; q8_1 for q4_1 and q5_1 (:mod:`tqbridge.bridge.blocks.q8_act`, the x86 SIMD arithmetic
   by default); f16 for an f16 K.
2. Each score is the K type's ``vec_dot`` with that: per 32-value block an integer dot of the codes
   times ``d_k * d_q`` (f16 scales, their product exact in float32), plus ``m_k * s_q`` for q4_1 / q5_1
   (``s_q = d_q * sum(q codes)``); summed over the blocks. Then ``s * scale`` (``scale / softcap`` and
   ``softcap * tanh`` with a softcap), plus the mask.
3. Online softmax in key order, float32: a new maximum rescales the accumulator and the sum by
   ``exp(M_old - M)``; otherwise the key's weight is ``exp(s - M)``.
4. V accumulation: for an f16 V, in an **f16** accumulator (each step ``f16(fma(v, w, acc))`` and each
   rescale ``f16(acc * ms)``); for a quantized V, V dequantized to float32 and accumulated in float32
   with fused multiply-adds. Finally the accumulator times ``1 / S``.

Where this differs from ggml, it is summation order only: ggml sums a dot product's block terms (and an
f16 dot product's elements) in SIMD lanes, this sums them in float64 and rounds once; its ``expf`` and
``tanhf`` are libm's, these are numpy's. What that can move is bounded, per query row and output
component, by an error analysis of the operation order (:func:`attention` with ``bound=True``; the
derivation is written beside :data:`U32`): the scores' rounding scales with ``sum_i |q_i k_i|`` of each
key, the V sum's with its partial sums ``|acc_j|``, so large activations widen the bound honestly and
nothing in it was measured. A different accumulation order of the V sum, or scores rounded to f16, is
far outside it (``tests/test_llama_arith.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tqbridge.bridge import all_formats, dequantize, get_format
from tqbridge.bridge.blocks import q8_act
from tqbridge.bridge.blocks.legacy_fields import layout, split_blocks

# The K type's vec_dot_type in ggml-cpu (the registry's, checked against ggml_get_type_traits_cpu in the
# tests), for the K/V types whose llama.cpp cache runs flash_attn_ext: the ones this module reproduces.
VEC_DOT_TYPE = {f.name: f.vec_dot_type for f in all_formats() if f.flash_attn}

# The error analysis behind ``attention(..., bound=True)``: a bound on |ggml - this| per query row and
# output component, from what each side rounds, in the order each side rounds it. Notation: u the unit
# roundoff (U32 = 2^-24 for float32, U16 = 2^-11 for binary16); gamma_n = n u / (1 - n u) (Higham,
# Accuracy and Stability of Numerical Algorithms, 2nd ed., Lemma 3.1 and eq. 3.5: a dot product of n terms
# evaluated in float32 in any order, each term rounded at most once on top, is within gamma_n * sum |terms|
# of the exact one); |fl(x) - fl(y)| <= |x - y| + u|x| + u|y| for one rounding of each of two nearby values.
#  1. raw score of key j. ggml (x86 and ARM SIMD): the K type's block terms d_k d_q sum(codes) (integer
#     sums exact, the f16 x f16 scale product exact in float32), each rounded once, accumulated over the
#     D/32 blocks per lane and then reduced across at most 32 lanes (a tree of depth 5): at most
#     D/32 + 6 roundings on any term, so |ggml - exact| <= gamma_{D/32+6} T_j with
#     T_j = sum_i |q_i k_ji| over the dequantized activation and key (an f16 K: products exact, the same
#     lane structure). The TurboQuant fork's turbo vec_dot: float32 fused multiply-adds over the D
#     elements, gamma_D T_j in any order. This model: the exact sum rounded once, u|s_j| (turbo: its
#     sequential FMAs, gamma_D T_j). Then each side rounds s*scale (and softcap's tanh, TANH_ULPS of libm /
#     numpy each), giving delta s_j.
#  2. weights. w_j = exp(s_j - M) with M the running maximum; its argument differs by delta s_j plus the
#     delta s of the key that set M plus one rounding of s_j - M per side; exp itself is within
#     EXP_ULPS of exact on each side (libm's expf, and this model's float64 exp rounded once). A new
#     maximum rescales the accumulator and the sum by exp(M_old - M) with the same kinds of error; a key
#     within its delta of the maximum may be a new maximum on one side only, so both cases are counted.
#  3. the V sum, in the same key order on both sides (ggml's: key by key, one FMA per element): the
#     difference carried so far plus |v_jc| times the weight's difference, plus one rounding of each
#     side at |acc_j| (float32 FMA: u per side; the f16 accumulator of an f16 V: the float32 FMA and then
#     the binary16 rounding, u + U16 per side), the same for each rescale; a dequantized V value may
#     differ by one rounding per side (u |v|). The sum S likewise (S*ms + vs: up to two roundings per
#     side).
#  4. output acc * (1/S): |delta o| <= delta acc / S + |o| delta S / S + 4u |o| (1/S and the product,
#     one rounding each per side).
# A different order of the V sum (or of the online maximum) moves the output by roundings at *its*
# partial sums, which this bound does not contain: only this order's are in it.
U32 = 2.0 ** -24
U16 = 2.0 ** -11
EXP_ULPS = 1.0     # glibc's expf: < 0.502 ulp (its documentation); this model: float64 exp rounded once
TANH_ULPS = 2.0    # glibc's tanhf: 2 ulp (its documentation); numpy's float32 tanh: within 2 ulp
SIMD_REDUCTION_DEPTH = 5    # lanes summed at the end of a SIMD dot product: at most 32 = 2^5


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u)."""
    return n * u / (1.0 - n * u)


def score_roundings(k_format: str, head_dim: int) -> int:
    """The most roundings ggml's dot product of the K type applies to one term (item 1 above)."""
    fmt = get_format(k_format)
    if fmt.kind == "turbo":
        return int(head_dim)
    return -(-int(head_dim) // 32) + 1 + SIMD_REDUCTION_DEPTH


F32 = np.float32


def _k_terms(k_format: str, k_blocks: np.ndarray, q_act: dict, n_blocks: int) -> np.ndarray:
    """Scores before scaling, (n_keys,) float64, for one KV head's K blocks (n, row bytes) and one q."""
    fmt = get_format(k_format)
    n = k_blocks.shape[0]
    sp = split_blocks(fmt, k_blocks.reshape(-1, fmt.type_size))
    dk = sp["d"].astype(np.float32).reshape(n, n_blocks)
    codes = sp["q"].reshape(n, n_blocks, 32).astype(np.int64)
    lay = layout(fmt)
    if lay.values is not None:                              # codes index a value table (iq4_nl)
        codes = np.array(lay.values, np.int64)[codes]
    elif lay.offset:                                        # x = d*(q - offset): q4_0, q5_0
        codes = codes - lay.offset
    qq = q_act["q"].astype(np.int64)                       # (n_blocks, 32)
    isum = (codes * qq[None]).sum(axis=2)                  # exact integer block dots
    dq = q_act["d"].astype(np.float32)
    dd = (dk * dq[None]).astype(np.float32)                 # exact: two f16 significands fit float32
    terms = dd.astype(np.float64) * isum
    if "m" in sp:
        mk = sp["m"].astype(np.float32).reshape(n, n_blocks)
        terms = terms + (mk * q_act["s"].astype(np.float32)[None]).astype(np.float32).astype(np.float64)
    return terms.sum(axis=1)


def scores(q: np.ndarray, k_blocks: np.ndarray, *, k_format: str, variant: str = "x86") -> np.ndarray:
    """q (Hq, D) float32, K blocks (Hkv, n, row bytes) -> raw scores (Hq, n) float32, as ggml's
    ``vec_dot`` of the K type with q in the K type's ``vec_dot_type``."""
    fmt = get_format(k_format)
    hq, d = q.shape
    hkv, n = k_blocks.shape[:2]
    g = hq // hkv
    out = np.zeros((hq, n), np.float64)
    if fmt.key == "f16":
        q16 = q.astype(np.float16).astype(np.float64)
        k16 = np.ascontiguousarray(k_blocks).view("<f2").astype(np.float64)      # (Hkv, n, D)
        for h in range(hq):
            out[h] = k16[h // g] @ q16[h]
        return out.astype(np.float32)
    if fmt.kind == "turbo":
        # the TurboQuant fork (ggml_vec_dot_turbo*_f32): K decoded to float32 in its rotated basis, q in
        # float32 (already rotated by the graph), summed in order: sum = fma(k[i], q[i], sum) per element
        rb = k_blocks.shape[-1]
        kd = dequantize(fmt, k_blocks.reshape(-1, rb), d, rotated=True).reshape(hkv, n, d).astype(F32)
        for h in range(hq):
            acc = np.zeros(n, F32)
            for i in range(d):
                acc = _fma32(kd[h // g][:, i], q[h, i], acc)
            out[h] = acc
        return out.astype(np.float32)
    vt = VEC_DOT_TYPE[fmt.key]
    for h in range(hq):
        blocks = q8_act.quantize(vt, q[h], variant)
        act = q8_act.split(vt, blocks)
        out[h] = _k_terms(fmt.key, k_blocks[h // g], act, d // 32)
    return out.astype(np.float32)


def _fma32(a: np.ndarray, b: Any, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add: a*b + c with one rounding (float64 holds the product exactly)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(F32)


def score_magnitudes(q: np.ndarray, k_blocks: np.ndarray, *, k_format: str, variant: str = "x86") -> np.ndarray:
    """T (Hq, n) float64: per query head and key, the sum of |terms| ggml's dot product adds, with q in
    the K type's ``vec_dot_type`` as ggml converts it (q4_1 / q5_1: ``|d_k c_i| + |m_k|`` per element)."""
    fmt = get_format(k_format)
    hq, d = q.shape
    hkv, n = k_blocks.shape[:2]
    g = hq // hkv
    out = np.zeros((hq, n), np.float64)
    if fmt.key == "f16" or fmt.kind == "turbo":
        if fmt.key == "f16":
            qa = np.abs(q.astype(np.float16).astype(np.float64))
            ka = np.abs(np.ascontiguousarray(k_blocks).view("<f2").astype(np.float64))
        else:
            qa = np.abs(q.astype(np.float64))
            rb = k_blocks.shape[-1]
            ka = np.abs(dequantize(fmt, k_blocks.reshape(-1, rb), d, rotated=True).reshape(hkv, n, d).astype(np.float64))
        for h in range(hq):
            out[h] = ka[h // g] @ qa[h]
        return out
    nb = d // 32
    sp = split_blocks(fmt, k_blocks.reshape(-1, fmt.type_size))
    dk = np.abs(sp["d"].astype(np.float64)).reshape(hkv, n, nb, 1)
    codes = sp["q"].reshape(hkv, n, nb, 32).astype(np.int64)
    lay = layout(fmt)
    if lay.values is not None:
        codes = np.array(lay.values, np.int64)[codes]
    elif lay.offset:
        codes = codes - lay.offset
    ka = dk * np.abs(codes)
    if "m" in sp:
        ka = ka + np.abs(sp["m"].astype(np.float64)).reshape(hkv, n, nb, 1)
    ka = ka.reshape(hkv, n, d)
    vt = VEC_DOT_TYPE[fmt.key]
    for h in range(hq):
        act = q8_act.split(vt, q8_act.quantize(vt, q[h], variant))
        qa = (np.abs(act["d"].astype(np.float64))[:, None] * np.abs(act["q"].astype(np.float64))).reshape(d)
        out[h] = ka[h // g] @ qa
    return out


def attention(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, *, k_format: str, v_format: str,
              scale: float, softcap: float = 0.0, mask: "np.ndarray | None" = None,
              variant: str = "x86", bound: bool = False):
    """One query row per head through ggml's CPU flash-attention arithmetic.

    q: (Hq, D) float32; k / v blocks: (Hkv, n, row bytes) uint8 of ggml types; ``mask``: (n,) additive
    (0 or -inf), default none. Returns (Hq, Dv) float32; with ``bound``, also (Hq, Dv) float64: how far
    ggml's own evaluation of the same row may lie from it, per component (the analysis beside :data:`U32`)."""
    kf, vf = get_format(k_format), get_format(v_format)
    q = np.ascontiguousarray(q, dtype=np.float32)
    hq, d = q.shape
    hkv, n = k_blocks.shape[:2]
    g = hq // hkv
    u = U32
    s_raw = scores(q, k_blocks, k_format=kf.key, variant=variant)
    sc = F32(scale)
    cap = F32(softcap)
    if cap != 0:
        sc = F32(sc / cap)
    x = (s_raw * sc).astype(F32)
    s = (cap * np.tanh(x).astype(F32)).astype(F32) if cap != 0 else x
    if mask is not None:
        s = (s + np.asarray(mask, F32)[None]).astype(F32)
    if bound:        # 1. each score's possible difference, delta s (Hq, n)
        T = score_magnitudes(q, k_blocks, k_format=kf.key, variant=variant)
        ours = gamma(d) * T if kf.kind == "turbo" else u * np.abs(s_raw.astype(np.float64)) + 2.0 ** -50 * T
        ds = gamma(score_roundings(kf.key, d)) * T + ours
        ds = abs(float(sc)) * ds + 2 * u * np.abs(x.astype(np.float64))
        if cap != 0:
            ds = float(cap) * (ds + 2 * TANH_ULPS * 2 * u * np.abs(np.tanh(x.astype(np.float64))))
        ds = ds + 2 * u * np.abs(s.astype(np.float64)) * (2 if mask is not None else 1)
    if vf.key == "f16":
        vals = np.ascontiguousarray(v_blocks).view("<f2")                           # (Hkv, n, Dv) f16
    else:
        dv_ = v_blocks.shape[-1] // vf.type_size * vf.block_size
        # a turbo V stays in its rotated basis here (the fork rotates the output back after the op)
        opts = {"rotated": True} if vf.kind == "turbo" else {}
        vals = dequantize(vf, v_blocks.reshape(-1, v_blocks.shape[-1]), dv_, **opts).reshape(hkv, n, dv_).astype(F32)
    dv = vals.shape[-1]
    vh = vals[np.arange(hq) // g]                                  # (Hq, n, Dv): each head's KV head
    f16v = vf.key == "f16"
    M = np.full(hq, -np.inf, F32)
    S = np.zeros(hq, F32)
    acc = np.zeros((hq, dv), np.float16 if f16v else F32)
    if bound:
        u_acc = u + U16 if f16v else u           # one step's rounding per side (3.)
        u_exp = 2 * EXP_ULPS * u                 # relative, per side (2.)
        # a dequantized V value's rounding per side (3.): none where it is d * code (an f16 scale times a
        # small integer is exact in float32), one for an offset (q4_1 / q5_1: d * code + m) or a turbo V
        v_deq = u if (vf.kind == "turbo" or (vf.layout is not None and vf.layout.has_m)) else 0.0
        dM = np.zeros(hq)                        # delta s of the key that set the running maximum
        D = np.zeros((hq, dv))                   # bound on |acc_ggml - acc_ours|, in the current units
        DS = np.zeros(hq)
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in range(n):                                        # key order, as ggml
            si = s[:, ic]
            if mask is not None and np.asarray(mask)[ic] == -np.inf:
                continue
            new = si > M
            ms = np.where(new, _exp32(M - si), F32(1.0)).astype(F32)
            vs = np.where(new, F32(1.0), _exp32(si - M)).astype(F32)
            if bound:
                first = ~np.isfinite(M)
                gap = np.where(first, 0.0, np.abs(si.astype(np.float64) - M))
                arg = ds[:, ic] + dM + 2 * u * gap                  # the exponent's difference
                ambiguous = ~first & (gap <= ds[:, ic] + dM) & (ds[:, ic] + dM > 0)  # a new maximum on one side only
                # exp of an argument that is exactly 0 on both sides is exactly 1 (C's Annex F)
                e_exp = np.where((arg == 0) & (gap == 0), 0.0, 2 * u_exp)
                rel_ms = np.where((new & ~first) | ambiguous, arg + e_exp, 0.0)
                rel_vs = np.where(new & ~ambiguous, 0.0, arg + e_exp)
                rescale = (new & ~first) | ambiguous
                x_acc = acc.astype(np.float64) * ms[:, None]            # exact: the rescale before rounding
                x_s = S.astype(np.float64) * ms
                d_acc = D * ms[:, None] + np.abs(x_acc) * rel_ms[:, None]
                d_s = DS * ms + np.abs(x_s) * rel_ms
                dM = np.where(new, ds[:, ic], dM)
            M = np.where(new, si, M).astype(F32)
            if new.any():                                          # rescale (a factor 1 elsewhere: exact)
                acc = (acc.astype(F32) * ms[:, None]).astype(F32).astype(acc.dtype)
            acc = _fma32(vh[:, ic].astype(F32), vs[:, None], acc.astype(F32)).astype(acc.dtype)
            S = (S.astype(np.float64) * ms + vs).astype(F32)       # S*ms + vs, one rounding
            if bound:
                # the rescale's rounding (only where a side rescaled), then this key's step; a step whose
                # inputs' difference stays inside the rounding cell of our result gives both sides the
                # same float (round to nearest is monotone), so the difference carried is 0 there
                acc_r = (x_acc.astype(F32).astype(acc.dtype)).astype(np.float64)
                d_acc = np.where(rescale[:, None], d_acc + 2 * u_acc * np.abs(acc_r), d_acc)
                d_s = np.where(rescale, d_s + 4 * u * np.abs(x_s), d_s)
                vv = vh[:, ic].astype(np.float64)
                x_step = vv * vs[:, None].astype(np.float64) + acc_r
                d_acc = d_acc + np.abs(vv) * vs[:, None] * (rel_vs[:, None] + 2 * v_deq)
                y = acc.astype(np.float64)
                D = np.where(_same_float(x_step, y, d_acc, f16v) & ~rescale[:, None], 0.0, d_acc + 2 * u_acc * np.abs(y))
                x_sum = x_s.astype(F32).astype(np.float64) + vs
                d_s = d_s + vs * rel_vs
                DS = np.where(_same_float(x_sum, S.astype(np.float64), d_s, False) & ~rescale, 0.0, d_s + 4 * u * S)
    inv = np.where(S == 0, F32(0.0), (F32(1.0) / np.where(S == 0, F32(1.0), S)).astype(F32)).astype(F32)
    out = (acc.astype(F32) * inv[:, None]).astype(F32)
    if not bound:
        return out
    S64 = np.where(S == 0, 1.0, S.astype(np.float64))[:, None]
    o = np.abs(out.astype(np.float64))
    # first-order analysis: a relative 1e-3 on top covers the products of small terms it leaves out
    rounded = (D > 0) | (DS[:, None] > 0)        # identical inputs give identical final roundings
    return out, (D / S64 + o * DS[:, None] / S64 + np.where(rounded, 4 * u * o, 0.0)) * (1 + 1e-3)


def _same_float(x: np.ndarray, y: np.ndarray, delta: np.ndarray, f16: bool) -> np.ndarray:
    """Whether every value within ``delta`` of the exact ``x`` rounds to the same float ``y`` as ``x``
    does (float32; binary16 after float32 for ``f16``): x and its neighbourhood stay inside a quarter
    ulp of y (a quarter: the spacing below a power of two is half the one above)."""
    ay = np.abs(y)
    sp = np.spacing(ay.astype(np.float16)).astype(np.float64) if f16 else np.spacing(ay.astype(F32)).astype(np.float64)
    if f16:
        sp = sp - 2 * np.spacing(ay.astype(F32)).astype(np.float64)     # the float32 rounding before it
    return np.abs(x - y) + delta < 0.25 * sp


def _exp32(x: np.ndarray) -> np.ndarray:
    """float32 exp: the float64 exp of the float32 argument, rounded once (within EXP_ULPS)."""
    return np.exp(np.asarray(x, F32).astype(np.float64)).astype(F32)


def reproduces(fmt) -> bool:
    """Whether :func:`attention` reproduces a K or V type's arithmetic: upstream ggml's flash-attention
    cache types, and the TurboQuant fork's turbo types."""
    fmt = get_format(fmt)
    return fmt.key in VEC_DOT_TYPE or fmt.kind == "turbo"


def ulp_error(x: np.ndarray, ref: np.ndarray, dtype: str = "f32") -> float:
    """max |x - ref| in ulps of ``dtype`` at the magnitude of max |ref| (one number per problem)."""
    mag = float(np.abs(ref).max()) or 1.0
    ulp = float(np.spacing(np.float32(mag) if dtype == "f32" else np.float16(mag)))
    return float(np.abs(np.asarray(x, np.float64) - ref).max() / ulp)


def bound_ratio(ours: np.ndarray, other: np.ndarray, bound: np.ndarray) -> float:
    """max over components of |ours - other| / bound (0 where both agree exactly, inf where a zero
    bound is exceeded or a value is not finite)."""
    diff = np.abs(np.asarray(ours, np.float64) - np.asarray(other, np.float64))
    if not (np.isfinite(diff).all() and np.isfinite(bound).all()):
        return float("inf")
    r = np.where(bound > 0, diff / np.where(bound > 0, bound, 1.0), np.where(diff > 0, np.inf, 0.0))
    return float(r.max()) if r.size else 0.0


def compare_with_ggml(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, *, k_format: str,
                      v_format: str, scale: "float | None" = None, softcap: float = 0.0,
                      ours: "np.ndarray | None" = None) -> dict[str, Any]:
    """This reference and ggml's ``flash_attn_ext`` (ctypes) on one problem: |ours - ggml| against the
    derived bound (``bound_ratio`` <= 1 passes), the ulps as information. ``ours``: judge this output in
    place of the reference's (the bound stays the reference's: a planted difference)."""
    from tqbridge.bridge.llama.ggml_graph import flash_attn_ext

    kf, vf = get_format(k_format), get_format(v_format)
    d = q.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    ref, bnd = attention(q, k_blocks, v_blocks, k_format=kf.key, v_format=vf.key, scale=scale, softcap=softcap,
                         bound=True)
    ours = ref if ours is None else ours
    ggml = flash_attn_ext(np.ascontiguousarray(q, np.float32)[:, None, :], k_blocks, v_blocks,
                          k_type=kf.type_ids["ggml"], v_type=vf.type_ids["ggml"], scale=scale, softcap=softcap)[0]
    unit = "f16" if vf.key == "f16" else "f32"
    ratio = bound_ratio(ours, ggml, bnd)
    return {"kv": f"{kf.key}/{vf.key}", "bound_ratio": ratio, "ulps": ulp_error(ours, ggml.astype(np.float64), unit),
            "unit": unit, "max_abs": float(np.abs(ours.astype(np.float64) - ggml).max()),
            "max_bound": float(bnd.max()), "passed": bool(np.isfinite(ours).all() and ratio <= 1.0)}
