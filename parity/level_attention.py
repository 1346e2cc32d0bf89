"""Level 3, attention: tqbridge's fused decode kernel vs ggml's ``flash_attn_ext`` on the same blocks.

For one decode step (one query row per head, every key visible), the same q and the same raw K/V
blocks go to

- ggml's CPU ``flash_attn_ext`` (:mod:`tqbridge.bridge.ggml_graph`): the kernel llama.cpp runs;
- tqbridge's ``decode_attention`` on each requested backend (``reference``: MLX ops,
  ``cpu-emulator``: the fused kernel's own source on the CPU SIMT emulator, ``cuda``/``metal``
  where present);
- the float64 oracle over the bridge's dequantization (``tqbridge.metal.attention_ref``).

Both implementations are judged against the oracle. ggml's error is its own arithmetic (its CPU
flash attention rounds q to the K type's dot-product type — f16 for f16 K, q8_0 for quantized K —
and accumulates in f16 for f16 V); the claim is that ours is **no worse than ggml's** on the same
input: NMSE(ours, oracle) <= max(NMSE(ggml, oracle), NMSE_FLOOR), same for the max error.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tqbridge.bridge import get_format, quantize

# KV types ggml's CPU flash attention accepts in llama.cpp's KV cache (checked in the tests).
GGML_FA_FORMATS = ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

# Floors for the "no worse than ggml" claim, for cases where ggml is itself nearly exact:
# float32 accumulation over up to a few thousand keys gives relative errors below ~1e-6,
# so NMSE below 1e-12 and max error below 1e-6 of the output scale are round-off, not a defect.
NMSE_FLOOR = 1e-12
MAX_REL_FLOOR = 1e-6


def _errors(x: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    err = x - ref
    denom = float((ref ** 2).sum())
    return {"nmse": float((err ** 2).sum() / denom) if denom else float((err ** 2).sum()),
            "max_abs": float(np.abs(err).max())}


def attention_case(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, *, k_format: str,
                   v_format: str, scale: "float | None" = None,
                   backends: Iterable[str] = ("reference", "cpu-emulator")) -> dict[str, Any]:
    """Compare on one problem. q: (Hq, D) float32; k/v blocks: (Hkv, n, row_bytes) uint8."""
    from tqbridge.bridge.ggml_graph import flash_attn_ext
    from tqbridge.metal.attention import decode_attention, last_run
    from tqbridge.metal.attention_ref import attention_oracle

    kf, vf = get_format(k_format), get_format(v_format)
    q = np.ascontiguousarray(q, dtype=np.float32)
    hq, d = q.shape
    hkv, n = k_blocks.shape[:2]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    oracle = attention_oracle(q[None], k_blocks[None], v_blocks[None], k_format=kf, v_format=vf,
                              length=n, scale=scale)[0]
    ggml = flash_attn_ext(q[:, None, :], k_blocks, v_blocks, k_type=kf.type_ids["ggml"],
                          v_type=vf.type_ids["ggml"], scale=scale)[0]
    g_err = _errors(ggml, oracle)
    out_scale = float(np.abs(oracle).max()) or 1.0
    res: dict[str, Any] = {"kv": f"{kf.key}/{vf.key}", "q_heads": hq, "kv_heads": hkv, "keys": n,
                           "head_dim": d, "ggml_vs_oracle": g_err, "ours": {}}
    ok = True
    for b in backends:
        o = np.asarray(decode_attention(q[None], k_blocks[None], v_blocks[None], k_format=kf,
                                        v_format=vf, length=n, scale=scale, backend=b))[0]
        e = _errors(o, oracle)
        e["vs_ggml"] = _errors(o, ggml)
        e["path"] = (last_run() or {}).get("backend", b) if b != "reference" else "reference"
        e["no_worse_than_ggml"] = bool(
            e["nmse"] <= max(g_err["nmse"], NMSE_FLOOR)
            and e["max_abs"] <= max(g_err["max_abs"], MAX_REL_FLOOR * out_scale))
        ok = ok and e["no_worse_than_ggml"]
        res["ours"][b] = e
    res["passed"] = ok
    return res


def random_problem(k_format: str, v_format: str, *, q_heads: int = 8, kv_heads: int = 2, keys: int = 64,
                   head_dim: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (Hq, D) and K/V blocks (Hkv, n, row_bytes) from Gaussian rows (K with a few outliers)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((q_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((kv_heads, keys, head_dim)).astype(np.float32)
    k[..., rng.integers(0, head_dim, 2)] *= 8.0          # outlier channels, as real K caches have
    v = rng.standard_normal((kv_heads, keys, head_dim)).astype(np.float32)
    return q, quantize(k_format, k), quantize(v_format, v)


def state_problem(layer, n_kv_heads: int, q_heads: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A problem on a real llama.cpp cache layer (:class:`LayerKV`): its own K/V blocks, q drawn
    with the typical norm of that layer's keys."""
    k = np.ascontiguousarray(layer.k_blocks(n_kv_heads).transpose(1, 0, 2))
    v = np.ascontiguousarray(layer.v_blocks(n_kv_heads).transpose(1, 0, 2))
    kf = layer.k_float(n_kv_heads)
    d = kf.shape[-1]
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((q_heads, d)).astype(np.float32)
    q *= np.float32(np.median(np.linalg.norm(kf, axis=-1)) / np.sqrt(d))
    return q, k, v


def run_attention_level(pairs: "Iterable[str]", *, shapes: "Iterable[tuple[int, int, int, int]]" = ((8, 2, 64, 64),),
                        backends: Iterable[str] = ("reference", "cpu-emulator"), seed: int = 0) -> dict[str, Any]:
    """Every K/V pair on every (Hq, Hkv, keys, head_dim) shape; a JSON-ready dict."""
    cases = []
    for spec in pairs:
        kf, _, vf = spec.partition("/")
        vf = vf or kf
        for hq, hkv, n, d in shapes:
            q, k, v = random_problem(kf, vf, q_heads=hq, kv_heads=hkv, keys=n, head_dim=d, seed=seed)
            cases.append(attention_case(q, k, v, k_format=kf, v_format=vf, backends=backends))
    return {"cases": cases, "passed": all(c["passed"] for c in cases)}
