"""Teacher forcing: llama.cpp's own per-layer tensors fed to tqbridge, layer by layer, no cascade.

With a quantized cache the two runtimes part after layer 0 (quantization steps flip and feed the next
layer), so end-to-end comparisons sit on a noise floor. Here nothing cascades: llama.cpp runs once
with the cache type under test (:func:`tqbridge.bridge.llama.capture.capture_run`, its eval callback),
and every layer of tqbridge is given exactly what that layer of llama.cpp was given:

- **cache bytes (claim, exact)**: the float rows llama.cpp quantized into its cache (after RoPE and
  after its Hadamard KV rotation) are appended to a :class:`~tqbridge.metal.lm.cache.TQCache` (the
  user's cache: its quantizer, append path and layout; ``rotation="none"`` since the rows are
  rotated already), the prompt as one chunk and each decode step as one row. Its blocks must equal
  the bytes in llama.cpp's cache, **at every layer**, K and V.
- **rotation (claim, bounded)**: with llama.cpp's rotation on, the rows *before* its rotation go to a
  ``TQCache(rotation="llama")``. Its rotated rows (``_key_rows`` for K, the V rotation for V) must
  equal llama.cpp's to within :func:`rotation_bound` — the float32 error of two dot products of
  length n (the group) in any summation order, ``2 * gamma_n * sum_j |x_j| / sqrt(n)`` with
  ``gamma_n = n u / (1 - n u)``, ``u = 2**-24`` (Higham, Accuracy and Stability of Numerical
  Algorithms, 2nd ed., eq. 3.5). The Hadamard entries are powers of two, so the products are exact
  and only the summation order differs. The blocks of that cache are reported (information): they
  differ from llama.cpp's only where the rotated inputs differ by those ulps and a value sits at a
  rounding boundary; the exact check above shows the quantizer is not the cause.
- **attention (claim)**: per layer, the last ``rows`` query positions (the decode steps when there
  are any) — llama.cpp's own q (before its rotation; tqbridge's kernel rotates q and the output
  itself) over llama.cpp's own cache bytes, with llama.cpp's scale and softcap and the layer's window
  in tqbridge's model — through ``decode_attention`` on each backend, within the float64 oracle's bound.
  llama.cpp's flash-attention output for the same rows is reported beside it (its error vs the
  oracle and vs ours: information; ggml rounds q to the K type's dot type on purpose).
- **model path (claim)**: the model's own attention module (:func:`teacher_model`'s mlx-lm model, the
  layer's ``self_attn``) run, under :func:`tqbridge.metal.lm.routing.route_attention`, on llama.cpp's
  normalized input of the last decode step (``attn_norm``), with a cache built as the user's
  (TQCache, the layer's window, rotation as llama.cpp's) holding llama.cpp's rows of the earlier
  positions. Judged: what the model hands attention, q times the scale it passes, against llama.cpp's
  q times its scale (llama.cpp folds Gemma 3's scale into q), relative to the largest component,
  within :func:`q_bound`, derived per component from the weights and input (a claim where the GGUF's
  projections are F32); and what attention makes of
  it, the output against the float64 oracle over the blocks the cache holds with that q and scale,
  *llama.cpp's* softcap and the keys llama.cpp's mask shows the row. A scale, RoPE, softcap, window or
  routing error anywhere in the model's path (its config, mlx-lm's module, tqbridge's routing and
  cache) fails one of the two, while the attention claim above (fed llama.cpp's parameters) holds.
- **mask (claim)**: the key positions llama.cpp's mask lets each of those query rows see are the
  ones tqbridge's causal/window convention (:func:`tqbridge.metal.attention.problem.visible_range`) gives
  with the layer's window in tqbridge's model (:func:`model_windows`; Gemma 3's local layers: 512,
  so a prompt longer than that is needed to exercise it).
"""

from __future__ import annotations

import platform
import time
from typing import Any, Iterable

import numpy as np

U32 = 2.0 ** -24          # float32 unit roundoff

# The model path's q vs llama.cpp's, per component, within :func:`q_bound`: both runtimes compute, in
# float32 from the same normalized input x of the layer (llama.cpp's attn_norm output, given to both),
#  1. q = W x (+ b): a dot product of length H (the width) in any order: gamma_H (|W| |x|)_j per side
#     (Higham, eq. 3.5), and the bias add one rounding of |q_j| per side;
#  2. a q norm where the model has one (RMS over a head or over all heads): y_j = g_j x_j / r, whose
#     first-order change is (g_j / r) (|dx_j| + |x_j| sum_i |x_i| |dx_i| / (n r^2)); the gain g_j / r is
#     read off the model's own norm (y_j / x_j), and each side rounds its n-term sum of squares, the
#     rsqrt and two products: gamma_{n+4} |y_j| per side;
#  3. RoPE: a rotation of pairs, so a component's difference is at most its pair's two differences plus
#     the rotated pair's size times the angle's difference; each runtime computes the angle
#     pos * theta_i in float32 (theta_i <= 1 through powf/exp, a few ulps, then one product):
#     Q_ROPE_PER_POS per position for the two, plus two roundings of each product per side;
#  4. the scale: one rounding per side (and one more where llama.cpp folds it into q, Gemma 3).
# Nothing here was measured. Earlier measured values (SmolLM2, position 47: 1.2e-6 to 2.3e-6 of max |q|;
# Gemma 3, position 599: 2.8e-5) are far below a RoPE position off by one (O(1)) or a scale 1% off (1e-2).
Q_ROPE_PER_POS = 2.0 ** -21


def q_bound(module, x: np.ndarray, q: np.ndarray, position: int) -> "np.ndarray | None":
    """Per component (Hq, D) of the q the model hands attention (``q``, before the scale), how far
    llama.cpp's may lie from it for the input ``x`` (1, H) (the analysis above); None where the module
    has no separate ``q_proj`` of float32 weights to take magnitudes from."""
    import mlx.core as mx

    proj = getattr(module, "q_proj", None)
    w = getattr(proj, "weight", None)
    if w is None or w.dtype != mx.float32 or getattr(proj, "scales", None) is not None:
        return None
    W = np.abs(np.array(w, np.float64))                              # (Hq * D_proj, H)
    xa = np.asarray(x, np.float64).reshape(-1)
    hq, d = q.shape
    pre = np.array(w, np.float64) @ xa
    bias = getattr(proj, "bias", None)
    if bias is not None:
        pre = pre + np.array(bias, np.float64)
    dq = 2 * gamma(W.shape[1]) * (W @ np.abs(xa)) + 2 * U32 * np.abs(pre)
    norm = getattr(module, "q_norm", None)
    if norm is not None:
        n = int(np.array(norm.weight).size)
        xs = pre.reshape(-1, n)
        y = np.array(norm(mx.array(xs.astype(np.float32))), np.float64)
        gain = np.where(xs != 0, np.abs(y) / np.where(xs != 0, np.abs(xs), 1.0), 0.0)
        r2 = (xs ** 2).mean(axis=1, keepdims=True)
        r2 = np.where(r2 > 0, r2, 1.0)
        dxs = dq.reshape(-1, n)
        dq = (gain * (dxs + np.abs(xs) * (np.abs(xs) * dxs).sum(axis=1, keepdims=True) / (n * r2))
              + 2 * gamma(n + 4) * np.abs(y)).reshape(-1)
    dq = dq.reshape(hq, -1)[:, :d]
    qa = np.abs(np.asarray(q, np.float64))
    head_d = dq.max(axis=1, keepdims=True)                          # a pair's two differences
    head_q = qa.max(axis=1, keepdims=True)
    return 2 * head_d + 2 * head_q * (Q_ROPE_PER_POS * position + 4 * U32) + 4 * U32 * qa


# llama.cpp's attention output recomputed with its own arithmetic is a claim where that arithmetic was
# validated against ggml (x86-64: the SIMD q8_0/q8_1 rounding of tqbridge.bridge.blocks.q8_act); elsewhere
# the record is kept as information.
ARITH_CLAIMED = platform.machine().lower() in ("x86_64", "amd64")


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u) for float32."""
    return n * U32 / (1.0 - n * U32)


def rotation_bound(x: np.ndarray, group: int) -> np.ndarray:
    """Per component, the most two float32 evaluations of ``H_n x`` (orthonormal Hadamard, entries
    +-1/sqrt(n), n = ``group``) can differ by, in any summation order: ``2 gamma_n sum|x| / sqrt(n)``
    over the component's group. x: (..., D) float32 rows before the rotation."""
    xs = np.abs(np.asarray(x, np.float64)).reshape(*x.shape[:-1], x.shape[-1] // group, group)
    per = 2.0 * gamma(group) * xs.sum(axis=-1, keepdims=True) / np.sqrt(group)
    return np.broadcast_to(per, xs.shape).reshape(x.shape)


def _block_diff(a: np.ndarray, b: np.ndarray, type_size: int) -> dict[str, Any]:
    ab = a.reshape(-1, type_size)
    bb = b.reshape(-1, type_size)
    d = (ab != bb).any(axis=1)
    return {"blocks": int(d.size), "blocks_differing": int(d.sum()), "share_blocks": float(d.mean()) if d.size else 0.0,
            "identical": bool(a.shape == b.shape and not d.any())}


def bytes_check(ours: np.ndarray, llama: np.ndarray, rows: np.ndarray, fmt) -> dict[str, Any]:
    """TQCache's blocks vs llama.cpp's for the same quantizer input, with the residual explained.

    ours / llama: (Hkv, n, row_bytes); rows: (n, Hkv * D) float32, what llama.cpp quantized. Claims:
    llama.cpp's bytes are ggml-cpu's ``from_float`` of the rows (what SET_ROWS calls), and every block
    where ours differs from llama.cpp's is one where ``from_float`` and the reference quantizer
    disagree (q8_0 on x86: ``127/amax`` and round-half-even vs ``1/d`` and ``roundf``,
    :mod:`tqbridge.bridge.llama.ggml_cpu`); there ours must equal the reference. The reference is ggml's own C
    (``from_float_ref``), never our quantizer: a bug shared by our numpy and MLX codecs is not explained."""
    from tqbridge.bridge.llama.ggml_cpu import c_reference_quantize, cpu_from_float

    hkv, n = ours.shape[:2]
    x = np.ascontiguousarray(rows.reshape(n, hkv, -1).transpose(1, 0, 2))
    cpu = cpu_from_float(fmt, x)
    ref = c_reference_quantize(fmt, x)
    ts = fmt.type_size

    def blocks(a, b):
        return (a.reshape(-1, ts) != b.reshape(-1, ts)).any(axis=1)

    d_ours, d_cpu, resid, d_ref = blocks(ours, llama), blocks(cpu, llama), blocks(cpu, ref), blocks(ours, ref)
    unexplained = d_ours & ~resid
    out = {"blocks": int(d_ours.size), "blocks_differing": int(d_ours.sum()),
           "share_blocks": float(d_ours.mean()) if d_ours.size else 0.0,
           "identical": bool(not d_ours.any()),
           "residual_cpu_vs_reference": int(resid.sum()), "unexplained": int(unexplained.sum()),
           "llama_is_cpu_from_float": bool(not d_cpu.any()), "ours_is_reference": bool(not d_ref.any())}
    ok = out["llama_is_cpu_from_float"] and out["ours_is_reference"] and not unexplained.any()
    if fmt.layout is not None and fmt.layout.bits == 8 and d_ours.any():   # q8_0: d, then int8 codes
        # the residual's size: same f16 scale, int8 codes one step apart (the tie went the other way)
        a = ours.reshape(-1, ts)[d_ours]
        b = llama.reshape(-1, ts)[d_ours]
        same_scale = bool(np.array_equal(a[:, :2], b[:, :2]))
        step = int(np.abs(a[:, 2:].view(np.int8).astype(int) - b[:, 2:].view(np.int8).astype(int)).max())
        out["residual"] = {"same_scale": same_scale, "max_code_step": step,
                           "values_differing": int((a[:, 2:] != b[:, 2:]).sum())}
        ok = ok and same_scale and step <= 1
    out["passed"] = bool(ok)
    return out


def _heads(rows: np.ndarray, heads: int) -> np.ndarray:
    """(tokens, heads * D) -> (1, heads, tokens, D)."""
    t = rows.shape[0]
    return np.ascontiguousarray(rows.reshape(t, heads, -1).transpose(1, 0, 2))[None]


def tq_feed(k_fmt: str, v_fmt: str, rotation: str, k_chunks, v_chunks, hkv: int):
    """A TQCache fed chunk by chunk; returns (cache, K blocks, V blocks) as (Hkv, n, row_bytes)."""
    import mlx.core as mx

    from tqbridge.metal.lm.cache import TQCache

    cache = TQCache(k_fmt, v_fmt, rotation=rotation)
    for kc, vc in zip(k_chunks, v_chunks):
        cache.update_and_fetch(mx.array(_heads(kc, hkv)), mx.array(_heads(vc, hkv)))
    kb, vb = cache.blocks()
    return cache, np.array(kb)[0], np.array(vb)[0]


def _rows_before_rotation(L) -> "tuple[list, list]":
    """Per evaluation, the K and V rows as they were before llama.cpp's rotation (its quantizer input
    where it did not rotate that side), each (tokens, heads * head_dim)."""
    k = [x.reshape(len(r), -1) for x, r in zip(L.k_in, L.k_rows)] if L.k_rot else L.k_rows
    v = [x.reshape(len(r), -1) for x, r in zip(L.v_in, L.v_rows)] if L.v_rot else L.v_rows
    return k, v


def _unrotate(x: np.ndarray, group: int) -> np.ndarray:
    if not group:
        return x
    h = np.ones((1, 1))
    while h.shape[0] < group:
        h = np.block([[h, h], [h, -h]])
    h = h / np.sqrt(group)
    return (x.astype(np.float64).reshape(*x.shape[:-1], -1, group) @ h).reshape(x.shape)


def teacher_model(gguf_path: str) -> "tuple[Any, list[int], int]":
    """tqbridge's model of the GGUF as the teacher level judges it: ``(model, windows, head_dim)`` —
    the mlx-lm model (:func:`tqbridge.bridge.gguf.model.load_gguf_model`), the sliding window of each
    layer as its TQCaches get it (:func:`tqbridge.metal.lm.cache.make_cache`; 0 for none) and its head dim."""
    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.metal.lm.cache import make_cache

    model, cfg = load_gguf_model(gguf_path)
    windows = [int(getattr(c, "window", None) or 0) for c in make_cache(model)]
    return model, windows, int(cfg["head_dim"])


def model_windows(gguf_path: str, with_head_dim: bool = False):
    """The sliding window of each layer as tqbridge runs the model (see :func:`teacher_model`);
    ``with_head_dim``: also the model's head dim, as ``(windows, head_dim)``."""
    _, windows, head_dim = teacher_model(gguf_path)
    return (windows, head_dim) if with_head_dim else windows


def _f32_projections(gguf_path: str) -> bool:
    """Whether every attention projection (``attn_q/k/v``) of the GGUF is stored as F32 (llama.cpp then
    multiplies in float32; quantized weights make it round activations to q8_1 first)."""
    from tqbridge.bridge.gguf.io import validate

    types = [t.type_id for t in validate(gguf_path).tensors
             if t.name.startswith("blk.") and t.name.rsplit(".", 2)[-2] in ("attn_q", "attn_k", "attn_v")]
    return bool(types) and all(t == 0 for t in types)      # GGML_TYPE_F32


def layer_formats(L, kv) -> tuple:
    """The K and V formats one captured layer's cache holds: the types of the tensors llama.cpp's flash
    attention read (a build may store other types than asked: :mod:`tqbridge.bridge.llama.stored_kv`); the
    requested pair ``kv`` only when the capture has no types."""
    from tqbridge.bridge import get_format
    from tqbridge.bridge.llama.state import format_for_type

    if L.k_type >= 0 and L.v_type >= 0:
        return format_for_type(L.k_type), format_for_type(L.v_type)
    return get_format(kv.k), get_format(kv.v)


def model_path_layer(layer_module, L, kv, *, window: int, head_dim: int, q_claimed: bool) -> dict[str, Any]:
    """The model's own attention path on llama.cpp's input of the last decode step (one layer).

    ``layer_module``: the layer's attention module of tqbridge's mlx-lm model; ``window``: its window in
    that model (the cache is built with it, as :func:`tqbridge.metal.lm.cache.make_cache` does)."""
    import sys

    import mlx.core as mx

    from tqbridge.metal import attention as attention_mod
    from tqbridge.metal.lm.cache import TQCache
    from tqbridge.metal.lm.routing import route_attention
    from tqbridge.parity.harness.level_attention import judge_ours

    if not L.attn_in or len(L.attn_in[-1]) != 1 or len(L.k_rows) < 2:
        return {"ran": False, "why": "no decode step was captured (the model path judges the last one)",
                "passed": True}
    kf, vf = (f.key for f in layer_formats(L, kv))
    hkv = L.k_cache.shape[0]
    cache = TQCache(kf, vf, window=window or None, rotation="llama" if (L.k_rot or L.v_rot) else "none")
    k_src, v_src = _rows_before_rotation(L)
    for kc, vc in list(zip(k_src, v_src))[:-1]:      # llama.cpp's rows of every earlier position
        # (the fork zero-pads turbo heads to 128: the model's cache takes rows of the model's head dim)
        cache.update_and_fetch(mx.array(_heads(kc, hkv)[..., :head_dim]), mx.array(_heads(vc, hkv)[..., :head_dim]))
    module = sys.modules[type(layer_module).__module__]
    seen: dict[str, Any] = {}
    with route_attention():
        routed = module.scaled_dot_product_attention

        def recorder(queries, keys, values, cache, scale, mask, sinks=None):
            o = routed(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
            seen.update(q=queries, out=o, scale=scale, run=attention_mod.last_run())
            return o

        module.scaled_dot_product_attention = recorder
        try:
            mx.eval(layer_module(mx.array(L.attn_in[-1])[None], mask=None, cache=cache))
        finally:
            module.scaled_dot_product_attention = routed
    if "q" not in seen:
        raise RuntimeError(f"{type(layer_module).__module__}'s attention did not call scaled_dot_product_attention")
    paths = sorted(p for p in cache.paths if p.startswith("decode:"))
    n = cache.offset
    q = np.array(seen["q"].astype(mx.float32))[0, :, 0]          # (Hq, D)
    out = np.array(seen["out"].astype(mx.float32))[0, :, 0]      # (Hq, Dv)
    # llama.cpp's q of that row, before its rotation (or the fork's), cut to the model's head dim
    q_ll = (L.q_in[-1].reshape(1, q.shape[0], -1) if (L.k_rot or L.q_turbo) else L.q[-1])[-1][:, :head_dim]
    # llama.cpp may fold the scale into q (Gemma 3 scales q by 1/sqrt(query_pre_attn_scalar) and passes
    # scale 1): what attention computes with is q times the scale, so that product is compared
    qs, qs_ll = q.astype(np.float64) * seen["scale"], q_ll.astype(np.float64) * L.scale
    q_rel = float(np.abs(qs - qs_ll).max() / (np.abs(qs_ll).max() or 1.0))
    qb = q_bound(layer_module, L.attn_in[-1], q, n - 1)
    if qb is None:
        q_ratio, q_claimed = None, False
    else:
        from tqbridge.parity.harness.llama_arith import bound_ratio

        # the scale: one rounding per side, one more where llama.cpp folds it into q
        q_ratio = bound_ratio(qs, qs_ll, abs(float(seen["scale"])) * qb + 4 * U32 * np.abs(qs))
    rec: dict[str, Any] = {"ran": True, "paths": paths, "scale_model": float(seen["scale"]), "scale_llama": L.scale,
                           "q_rel": q_rel, "q_bound_ratio": q_ratio, "q_claimed": q_claimed,
                           "q_within": bool(q_ratio is not None and q_ratio <= 1.0)}
    # the keys llama.cpp's mask shows the row: [lo, n)
    vis = np.isfinite(L.mask[-1][-1]) if L.mask else None
    cells = np.concatenate(L.k_cells)
    lo = int(np.arange(n)[vis[cells]].min()) if vis is not None else 0
    rec["first_visible_llama"], rec["cache_start"] = lo, int(cache.start)
    kb, vb = (np.array(b) for b in cache.blocks(lo))
    ok = cache.start <= lo and kb.shape[2] == n - lo
    kernel_ran = any(p not in ("decode:reference", "decode:dequant-sdpa") for p in paths)
    # what the kernel ran: the layer's prepared launch (the GPU lane) or the dispatcher's last call
    run = (getattr(cache.decoder.launch, "run_info", None) or seen["run"]) if kernel_ran else {}
    rotation = (cache.k_rot, cache.v_rot) if cache.k_rot or cache.v_rot else None
    # blocks padded past the head dim (turbo's 128) are read with q and the output of the head dim
    ours, _ = judge_ours(q[None], kb, vb, k_format=kf, v_format=vf, length=kb.shape[2], scale=float(seen["scale"]),
                         softcap=L.softcap or None, rotation=rotation, backends=(),
                         given={"model": (out, run)})
    e = ours["model"]
    rec["output"] = e
    ok = ok and e["within_bound"] and (rec["q_within"] or not q_claimed)
    rec["passed"] = bool(ok)
    return rec


def teacher_layer(L, kv, *, rotation: bool, rows: int, backends: Iterable[str], window: int = 0,
                  attention: bool = True, head_dim: "int | None" = None, layer_module=None,
                  q_claimed: bool = False) -> dict[str, Any]:
    """Every check on one captured layer (:class:`tqbridge.bridge.llama.capture.LayerCapture`).
    ``window``: the layer's sliding window in tqbridge's model (0: none). ``head_dim``: the model's
    (the TurboQuant fork zero-pads turbo heads to 128: its q and output are cut back to it).
    ``layer_module``: the layer's attention module in tqbridge's model, for the model-path claim
    (:func:`model_path_layer`; not run without it); ``q_claimed``: its q comparison is a claim."""
    import mlx.core as mx

    from tqbridge.bridge.blocks.registry import display_name
    from tqbridge.metal.attention.problem import visible_range
    from tqbridge.metal.hadamard import hadamard_rotate
    from tqbridge.parity.harness.level_attention import judge_ours
    from tqbridge.parity.harness.llama_arith import bound_ratio, reproduces, ulp_error
    from tqbridge.parity.harness.llama_arith import attention as llama_attention

    kf, vf = layer_formats(L, kv)
    for side, fmt, group in (("K", kf, L.k_rot), ("V", vf, L.v_rot)):
        if group and fmt.kind == "turbo":
            from tqbridge.bridge.llama.side import LlamaBuildError

            raise LlamaBuildError(f"llama.cpp rotated its {fmt.key} {side} cache with upstream's Hadamard "
                                  "rotation on top of turbo's own (this build applies LLAMA_ATTN_ROT to every "
                                  "quantized type); tqbridge's caches do not stack the two: run with --no-rotation")
    hkv = L.k_cache.shape[0]
    k_rows, v_rows = np.concatenate(L.k_rows), np.concatenate(L.v_rows)
    cells = np.concatenate(L.k_cells)
    if not np.array_equal(cells, np.concatenate(L.v_cells)):
        raise ValueError("llama.cpp wrote K and V rows to different cells")
    n = len(cells)
    dk = k_rows.shape[1] // hkv
    ll_k = L.k_cache[:, cells]                       # llama.cpp's bytes, in the order rows were written
    ll_v = L.v_cache[:, cells]
    out: dict[str, Any] = {"k": display_name(kf), "v": display_name(vf), "cells": n, "kv_heads": hkv,
                           "head_dim": dk, "k_rot": L.k_rot, "v_rot": L.v_rot}
    # 1. cache bytes: llama.cpp's quantizer input through TQCache
    _, kb, vb = tq_feed(kf.key, vf.key, "none", L.k_rows, L.v_rows, hkv)
    out["bytes"] = {"k": bytes_check(kb, ll_k, k_rows, kf), "v": bytes_check(vb, ll_v, v_rows, vf)}
    ok = out["bytes"]["k"]["passed"] and out["bytes"]["v"]["passed"]
    # 2. rotation: llama.cpp's rows before its rotation through TQCache(rotation="llama")
    if rotation and (L.k_rot or L.v_rot):
        k_in, v_in = _rows_before_rotation(L)
        cache, kb2, vb2 = tq_feed(kf.key, vf.key, "llama", k_in, v_in, hkv)
        rot = {"k_group_llama": L.k_rot, "v_group_llama": L.v_rot,
               "k_group_ours": int(cache.k_rot), "v_group_ours": int(cache.v_rot)}
        for side, xin, want, group, ours_fn, blocks, ll, fmt in (
                ("k", k_in, k_rows, L.k_rot, lambda a: cache._key_rows(a), kb2, ll_k, kf),
                ("v", v_in, v_rows, L.v_rot, lambda a: hadamard_rotate(a, cache.v_rot), vb2, ll_v, vf)):
            x = np.concatenate(xin)
            ours = np.array(ours_fn(mx.array(_heads(x, hkv))))[0].transpose(1, 0, 2).reshape(n, -1)
            err = np.abs(ours.astype(np.float64) - want)
            bound = rotation_bound(x.reshape(n * hkv, -1), group).reshape(n, -1) if group else np.zeros_like(err)
            ratio = float(np.max(np.where(bound > 0, err / np.where(bound > 0, bound, 1), np.where(err > 0, np.inf, 0))))
            rot[side] = {"max_abs": float(err.max()), "values_differing": float((err > 0).mean()),
                         "bound_ratio": ratio, "within_bound": bool(ratio <= 1.0),
                         "blocks": _block_diff(blocks, ll, fmt.type_size)}
            ok = ok and rot[side]["within_bound"]
        out["rotation"] = rot
    # 3. attention on llama.cpp's own q and cache bytes, 4. its mask vs our window convention
    if attention and L.q and L.out:
        pos_of_cell = np.full(L.k_cache.shape[1], -1)
        pos_of_cell[cells] = np.arange(n)
        # the last `rows` positions, taken from the last evaluations (decode steps) or the prompt's end
        q_src = [x.reshape(len(o), o.shape[1], -1) for x, o in zip(L.q_in, L.out)] \
            if (L.k_rot or L.q_turbo) else L.q
        outs = L.out_turbo if L.out_turbo else L.out   # the fork's output after its inverse rotation
        if head_dim:   # the fork's zero padding of turbo heads: q's pad is zeros, the output's pad is cut
            q_src = [x[..., :head_dim] for x in q_src]
            outs = [x[..., :head_dim] for x in outs]
        q_all = np.concatenate(q_src)
        o_all = np.concatenate(outs)
        m_all = np.concatenate(L.mask) if L.mask else None
        t = min(rows, n)
        q_rows = q_all[n - t:]                          # (T, Hq, D)
        ll_out = _unrotate(o_all[n - t:], 0 if L.out_turbo else L.v_rot)   # llama.cpp's output, rotated back
        visible_ok = True
        llama_lo = []
        if m_all is not None:
            for i, r in enumerate(range(n - t, n)):
                vis = np.sort(pos_of_cell[np.isfinite(m_all[r]) & (pos_of_cell >= 0)])
                lo, hi = visible_range(n, t, i, window)
                llama_lo.append(int(vis[0]) if len(vis) else -1)
                visible_ok = visible_ok and np.array_equal(vis, np.arange(lo, hi))
        out["mask"] = {"window_ours": window, "first_visible_llama": llama_lo, "matches": bool(visible_ok)}
        ok = ok and visible_ok
        qb = np.ascontiguousarray(q_rows.transpose(1, 0, 2))[None].astype(np.float32)     # (1, Hq, T, D)
        kbl, vbl = ll_k[None], ll_v[None]
        rotation_arg = (L.k_rot, L.v_rot) if (L.k_rot or L.v_rot) else None
        ours, others = judge_ours(qb, kbl, vbl, k_format=kf, v_format=vf, length=n, scale=L.scale,
                                  window=window or None, softcap=L.softcap or None, rotation=rotation_arg,
                                  backends=backends, compare={"llama": ll_out.transpose(1, 0, 2)})
        out["attention"] = {"rows": t, "scale": L.scale, "softcap": L.softcap, "ours": ours,
                            "llama_vs_oracle": others["llama"]}
        ok = ok and all(e["within_bound"] for e in ours.values())
        # llama.cpp's own output of the last row, recomputed with its arithmetic (parity/harness/llama_arith.py)
        # from what its flash attention read: q (rotated as it was), every cache cell, the mask row
        if L.mask and reproduces(kf) and reproduces(vf):
            arith, bnd = llama_attention(L.q[-1][-1], L.k_cache, L.v_cache, k_format=kf.key, v_format=vf.key,
                                         scale=L.scale, softcap=L.softcap, mask=L.mask[-1][-1], bound=True)
            unit = "f16" if vf.key == "f16" else "f32"
            got = L.out[-1][-1].astype(np.float64)
            ratio = bound_ratio(arith, got, bnd)
            rec = {"bound_ratio": ratio, "ulps": ulp_error(arith, got, unit), "unit": unit,
                   "max_abs": float(np.abs(arith - got).max()), "max_bound": float(bnd.max()),
                   "passed": bool(ratio <= 1.0), "claim": ARITH_CLAIMED}
            out["attention"]["llama_arith"] = rec
            if ARITH_CLAIMED:
                ok = ok and rec["passed"]
    # 5. the model's own attention path on llama.cpp's input
    if layer_module is not None:
        out["model_path"] = model_path_layer(layer_module, L, kv, window=window, q_claimed=q_claimed,
                                             head_dim=head_dim or L.k_rows[0].shape[1] // hkv)
        ok = ok and out["model_path"]["passed"]
    out["passed"] = bool(ok)
    return out


def run_teacher(gguf_path: str, tokens: "list[int]", kvs: "list[str]", *, decode: int = 4, rotation: bool = True,
                rows: int = 4, backends: Iterable[str] = ("reference", "cpu-emulator"),
                attention: bool = True, windows: "list[int] | None" = None, model=None,
                model_path: bool = True, progress=None) -> dict[str, Any]:
    """The teacher-forced level for each K/V pair on ``tokens``; a JSON-ready dict.

    ``model``: :func:`teacher_model`'s triple, when the caller has it (else it is built from the GGUF);
    ``windows``: each layer's sliding window in tqbridge's model, overriding the model's;
    ``model_path``: run the model-path claim (it needs the model: with only ``windows`` given it does not run)."""
    from tqbridge.bridge.llama.capture import capture_run
    from tqbridge.bridge.llama.stored_kv import StoredKV, explain, layered_spelling, model_heads
    from tqbridge.parity.harness.runtimes import KV

    # llama.cpp's runs first (each loads and frees its model), then tqbridge's model: the two runtimes'
    # weights are never resident together (the level's peak memory: one model, not two)
    from tqbridge.parity.harness.runtimes import release_memory

    release_memory()      # what an earlier level's MLX model left allocated
    caps = []
    for spec in kvs:
        kv = KV.parse(spec)
        if progress:
            progress(f"teacher forcing: llama.cpp {kv.name}")
        t0 = time.perf_counter()
        cap, _ = capture_run(gguf_path, tokens, kv.k, kv.v, decode=decode, rotation=rotation)
        caps.append((kv, cap, time.perf_counter() - t0))
    if model is None and windows is None:
        if progress:
            progress("teacher forcing: tqbridge's model (its attention path and sliding windows)")
        model = teacher_model(gguf_path)
    mlx_model, model_windows_, head_dim = model if model is not None else (None, None, None)
    windows = model_windows_ if windows is None else windows
    layers_mod = mlx_model.layers if (model_path and mlx_model is not None) else None
    q_claimed = bool(layers_mod is not None and _f32_projections(gguf_path))
    results = []
    while caps:
        kv, cap, seconds = caps.pop(0)
        if progress:
            progress(f"teacher forcing: {kv.name}")
        t0 = time.perf_counter()
        layers = []
        for il in sorted(cap.layers):
            if il >= len(windows):
                raise ValueError(f"llama.cpp has a layer {il}, tqbridge's model {len(windows)} layers")
            rec = teacher_layer(cap.layers[il], kv, rotation=rotation, rows=rows, backends=backends,
                                window=windows[il], attention=attention, head_dim=head_dim,
                                layer_module=layers_mod[il].self_attn if layers_mod is not None else None,
                                q_claimed=q_claimed)
            rec["layer"] = il
            layers.append(rec)
        del cap
        pairs = [(L["k"], L["v"]) for L in layers]
        n_head, n_head_kv, _ = model_heads(gguf_path)
        rules = explain(kv.k, kv.v, pairs, n_head=n_head, n_head_kv=n_head_kv, variant=_variant())
        entry = {"kv": layered_spelling(pairs), "requested": kv.name, "layers": layers,
                 "seconds": round(seconds + time.perf_counter() - t0, 2), "passed": all(L["passed"] for L in layers)}
        if rules:
            entry["stored"] = StoredKV(kv.name, tuple(pairs), tuple(rules)).to_json()
        results.append(entry)
    claim = ("at every layer: TQCache's bytes == llama.cpp's for llama.cpp's quantizer input; its rotation "
             "within the float32 dot-product bound; our attention on llama.cpp's q and cache within the "
             "float64 oracle's bound; llama.cpp's mask == our window convention")
    if layers_mod is not None:
        claim += ("; the model's own attention path on llama.cpp's input within the oracle's bound with "
                  "llama.cpp's scale, softcap and visible keys" + (", its q times scale within q_bound of llama.cpp's"
                                                                   if q_claimed else ""))
    return {"tokens": len(tokens), "decode": decode, "rotation": rotation, "rows": rows, "backends": list(backends),
            "windows": sorted(set(windows)), "kv": results, "model_path": layers_mod is not None,
            "q_claimed": q_claimed, "claim": claim, "passed": all(r["passed"] for r in results)}


def _variant() -> "str | None":
    from tqbridge.bridge.llama.side import selected

    info = selected()
    return info.variant if info is not None else None


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for r in report["kv"]:
        Ls = r["layers"]
        kb = sum(L["bytes"]["k"]["blocks_differing"] for L in Ls)
        vb = sum(L["bytes"]["v"]["blocks_differing"] for L in Ls)
        nb = sum(L["bytes"]["k"]["blocks"] + L["bytes"]["v"]["blocks"] for L in Ls)
        un = sum(L["bytes"]["k"]["unexplained"] + L["bytes"]["v"]["unexplained"] for L in Ls)
        bad = [L["layer"] for L in Ls if not L["passed"]]
        state = ("identical" if not (kb or vb) else
                 f"identical except K {kb} / V {vb} of {nb} blocks, each a q8_0 tie ggml-cpu's own quantizer "
                 f"rounds the other way (one code step, explained)" if not un else f"DIFFER ({un} blocks unexplained)")
        asked = f" (asked {r['requested']})" if r.get("stored") else ""
        text = f"{r['kv']}{asked}: {len(Ls)} layers, cache bytes {state}"
        rots = [L["rotation"] for L in Ls if "rotation" in L]
        if rots:
            worst = max(max(x["k"]["bound_ratio"], x["v"]["bound_ratio"]) for x in rots)
            share = np.mean([x["k"]["blocks"]["share_blocks"] for x in rots])
            text += f"; rotation {worst:.2g}x its bound ({share:.2%} of K blocks differ after our rotation)"
        atts = [L["attention"] for L in Ls if "attention" in L]
        if atts:
            worst = max(e["bound_ratio"] for a in atts for e in a["ours"].values())
            ll = max(a["llama_vs_oracle"]["bound_ratio"] for a in atts)
            text += f"; attention {worst:.2g}x the oracle bound (llama.cpp {ll:.2g}x, information)"
            ar = [a["llama_arith"] for a in atts if "llama_arith" in a]
            if ar:
                text += (f"; llama.cpp's output = its arithmetic recomputed, {max(x['bound_ratio'] for x in ar):.2g}x "
                         f"the derived bound ({max(x['ulps'] for x in ar):.2g} {ar[0]['unit']} ulps)")
        mps = [L["model_path"] for L in Ls if L.get("model_path", {}).get("ran")]
        if mps:
            worst = max(m["output"]["bound_ratio"] for m in mps)
            q = max(m["q_rel"] for m in mps)
            scales = sorted({m["scale_model"] for m in mps})
            text += (f"; model path ({', '.join(sorted({p for m in mps for p in m['paths']}))}) {worst:.2g}x the "
                     f"oracle bound, q x scale within {q:.2g} of llama.cpp's"
                     + (f" ({max(m['q_bound_ratio'] for m in mps):.2g}x its derived bound, claimed)"
                        if all(m["q_claimed"] for m in mps) else " (information)")
                     + f" (scale: model {'/'.join(f'{x:.6g}' for x in scales)}, llama.cpp {mps[0]['scale_llama']:.6g})")
        if bad:
            text += f"; FAILED at layers {bad}"
        lines.append(text)
    return lines
