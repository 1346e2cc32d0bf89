"""llama.cpp's attention arithmetic in numpy: what ggml's CPU ``flash_attn_ext`` computes for one query
row, step by step, so a port can be judged as "the same arithmetic as ggml", not only "within float32
round-off of exact attention".

The steps (ggml-cpu ``ops.cpp``, the one-chunk path that decode with a quantized K takes; read there,
written here independently):

1. q is converted to the K type's ``vec_dot_type`` (ggml-cpu's ``from_float``): q8_0 for q8_0, q4_0,
   q5_0 and iq4_nl K; q8_1 for q4_1 and q5_1 (:mod:`tqbridge.bridge.q8_act`, the x86 SIMD arithmetic
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
f16 dot product's elements) in SIMD lanes, this sums them in float64 and rounds once. That moves a score
by a few float32 ulps of the sum of its terms' magnitudes, which the measured agreement below absorbs
(``tests/test_llama_arith.py``; the constants in :data:`ULPS`, scaled with the head dim by
:func:`ulps_limit`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tqbridge.bridge import all_formats, dequantize, get_format
from tqbridge.bridge import q8_act
from tqbridge.bridge.legacy_fields import layout, split_blocks

# The K type's vec_dot_type in ggml-cpu (the registry's, checked against ggml_get_type_traits_cpu in the
# tests), for the K/V types whose llama.cpp cache runs flash_attn_ext: the ones this module reproduces.
VEC_DOT_TYPE = {f.name: f.vec_dot_type for f in all_formats() if f.flash_attn}

# Agreement with ggml's flash_attn_ext: the largest |ours - ggml| in units of the output's ulp at the
# output's magnitude (max |o|): float32 ulps for a quantized V, binary16 ulps for an f16 V (its
# accumulator). Measured on x86-64 (AVX2): synthetic problems (tests/test_llama_arith.py: 11 K/V pairs x
# 3 geometries x 2-3 seeds, both probes, softcap 2) at most 11 float32 ulps (q4_1) and 0.26 binary16
# ulps; llama.cpp's own flash-attention outputs in a real run (teacher forcing, SmolLM2, 64 tokens, 9
# pairs x 30 layers; and 256 tokens in the demo) at most 16 float32 ulps (q5_1) and 0.45 binary16 ulps.
# The limits are those maxima rounded up to the next power of two above them. For scale: ggml's own
# distance to exact attention on the same problems is ~1e4-1e5 float32 ulps (NMSE 4e-5 - 8e-5).
ULPS = {"f32": 32, "f16": 1}
# The float32 limit grows with the terms a score sums. ggml accumulates a score's D/32 block terms in
# float32 SIMD lanes, this model sums them exactly and rounds once, so the worst-case difference of a
# score, and through the softmax of the output, grows linearly with the number of blocks: ULPS["f32"]
# holds for D <= 64 (two blocks: SmolLM2, where it was measured) and :func:`ulps_limit` scales it by
# D/64 above that. Measured since (2026-12-01), Gemma 3 (D = 256, 8 blocks), every type, 48 tokens:
# at most 28 float32 ulps with llama.cpp built -march=native on an AVX-512 CPU and 48 (q5_1, layer 11)
# with the portable AVX2 build (GGML_NATIVE=OFF) -> limit 128. The binary16 limit is the f16
# accumulator's rounding and does not grow with D.
F32_ULPS_BASE_DIM = 64


def ulps_limit(unit: str, head_dim: int) -> float:
    """The agreement limit in ``unit`` ulps ("f32" or "f16") for scores over ``head_dim`` values."""
    if unit != "f32":
        return ULPS[unit]
    return ULPS["f32"] * max(1, -(-int(head_dim) // F32_ULPS_BASE_DIM))

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


def attention(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, *, k_format: str, v_format: str,
              scale: float, softcap: float = 0.0, mask: "np.ndarray | None" = None,
              variant: str = "x86") -> np.ndarray:
    """One query row per head through ggml's CPU flash-attention arithmetic.

    q: (Hq, D) float32; k / v blocks: (Hkv, n, row bytes) uint8 of ggml types; ``mask``: (n,) additive
    (0 or -inf), default none. Returns (Hq, Dv) float32."""
    kf, vf = get_format(k_format), get_format(v_format)
    q = np.ascontiguousarray(q, dtype=np.float32)
    hq, d = q.shape
    hkv, n = k_blocks.shape[:2]
    g = hq // hkv
    s_raw = scores(q, k_blocks, k_format=kf.key, variant=variant)
    sc = F32(scale)
    cap = F32(softcap)
    if cap != 0:
        sc = F32(sc / cap)
    s = (s_raw * sc).astype(F32)
    if cap != 0:
        s = (cap * np.tanh(s).astype(F32)).astype(F32)
    if mask is not None:
        s = (s + np.asarray(mask, F32)[None]).astype(F32)
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
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in range(n):                                        # key order, as ggml
            si = s[:, ic]
            if mask is not None and np.asarray(mask)[ic] == -np.inf:
                continue
            new = si > M
            ms = np.where(new, np.exp((M - si).astype(F32)), F32(1.0)).astype(F32)
            vs = np.where(new, F32(1.0), np.exp((si - M).astype(F32))).astype(F32)
            M = np.where(new, si, M).astype(F32)
            if new.any():                                          # rescale (a factor 1 elsewhere: exact)
                acc = (acc.astype(F32) * ms[:, None]).astype(F32).astype(acc.dtype)
            acc = _fma32(vh[:, ic].astype(F32), vs[:, None], acc.astype(F32)).astype(acc.dtype)
            S = (S.astype(np.float64) * ms + vs).astype(F32)       # S*ms + vs, one rounding
    inv = np.where(S == 0, F32(0.0), (F32(1.0) / np.where(S == 0, F32(1.0), S)).astype(F32)).astype(F32)
    return (acc.astype(F32) * inv[:, None]).astype(F32)


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


def compare_with_ggml(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, *, k_format: str,
                      v_format: str, scale: "float | None" = None, softcap: float = 0.0) -> dict[str, Any]:
    """This reference and ggml's ``flash_attn_ext`` (ctypes) on one problem: the error in ulps."""
    from tqbridge.bridge.ggml_graph import flash_attn_ext

    kf, vf = get_format(k_format), get_format(v_format)
    d = q.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    ours = attention(q, k_blocks, v_blocks, k_format=kf.key, v_format=vf.key, scale=scale, softcap=softcap)
    ggml = flash_attn_ext(np.ascontiguousarray(q, np.float32)[:, None, :], k_blocks, v_blocks,
                          k_type=kf.type_ids["ggml"], v_type=vf.type_ids["ggml"], scale=scale, softcap=softcap)[0]
    unit = "f16" if vf.key == "f16" else "f32"
    err = ulp_error(ours, ggml.astype(np.float64), unit)
    limit = ulps_limit(unit, d)
    return {"kv": f"{kf.key}/{vf.key}", "ulps": err, "unit": unit, "limit": limit,
            "max_abs": float(np.abs(ours.astype(np.float64) - ggml).max()),
            "passed": bool(np.isfinite(ours).all() and err <= limit)}
