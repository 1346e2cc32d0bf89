"""Level 2, cache: llama.cpp's KV cache bytes against tqbridge's after the same prompt.

Two comparisons per K/V pair, both on llama.cpp's state blob (:mod:`tqbridge.bridge.llama.state`):

- **same inputs** — llama.cpp's own float K/V of a layer (from an F32 cache of the same prompt)
  quantized by tqbridge, against the blocks llama.cpp wrote for that layer. At layer 0 the K/V
  rows do not depend on the cache type, so the quantizer's input is bit-identical and the bytes
  must be too.
- **runtimes** — the blocks of tqbridge's MLX cache (:class:`tqbridge.metal.lm.cache.TQCache`) after
  an independent MLX forward pass, layer by layer: the share of differing blocks and values. Even
  layer 0 is not bit-identical at the float level (RoPE and matmul summation order differ by ulps),
  and from layer 1 on the two attentions differ (ggml's CPU flash attention rounds Q to the K
  type's dot-product type — q8_0 for quantized K, f16 for f16 K — and accumulates V in f16), so
  deeper layers get nearby but different quantized values.

llama.cpp's automatic Hadamard rotation of quantized caches is off by default here
(``LLAMA_ATTN_ROT_DISABLE=1``, TQCache with ``rotation="none"``); with ``rotation=True`` both
runtimes rotate (TQCache ``rotation="llama"``), and the same-inputs check rotates llama.cpp's float
rows with tqbridge's Hadamard before quantizing. The rotation is a float32 matmul whose summation
order differs from ggml's, so there a few blocks (~0.1-0.3%) may differ even at layer 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tqbridge.bridge import dequantize, get_format
from tqbridge.bridge.llama.state import LlamaState, parse_state
from tqbridge.bridge.llama.stored_kv import read_stored

# Formats whose same-inputs check is known to fail, with the measured reason (none at present).
KNOWN_DIFFERENCES: dict[str, str] = {}

# What llama.cpp's CPU backend writes into its cache needs no options here: TQCache quantizes iq4_nl
# rows with quantize_row_iq4_nl_ref (no scale search), as llama.cpp does (tests/test_cache.py).


def block_diff(a: np.ndarray, b: np.ndarray, fmt: Any, values_per_row: int) -> dict[str, Any]:
    """Share of differing blocks and values between two (rows, row_bytes) arrays of ``fmt``."""
    from tqbridge.bridge.blocks.padding import padded_dim

    fmt = get_format(fmt)
    values_per_row = padded_dim(fmt, values_per_row)   # turbo heads of 64 are stored padded to 128
    if a.shape != b.shape:
        raise ValueError(f"cache shapes differ: {a.shape} vs {b.shape}")
    ab = a.reshape(-1, fmt.type_size)
    bb = b.reshape(-1, fmt.type_size)
    diff_blocks = (ab != bb).any(axis=1)
    fa = dequantize(fmt, a.reshape(-1, fmt.row_bytes(values_per_row)), values_per_row).astype(np.float64)
    fb = dequantize(fmt, b.reshape(-1, fmt.row_bytes(values_per_row)), values_per_row).astype(np.float64)
    err = fa - fb
    denom = float((fa ** 2).sum())
    return {
        "format": fmt.key,
        "blocks": int(diff_blocks.size),
        "blocks_differing": int(diff_blocks.sum()),
        "share_blocks": float(diff_blocks.mean()),
        "share_values": float((fa != fb).mean()),
        "nmse": float((err ** 2).sum() / denom) if denom else 0.0,
        "identical": bool(not diff_blocks.any()),
    }


def same_input_check(f32_state: LlamaState, q_state: LlamaState, head_dim: int, *, layer: int = 0,
                     rotation: bool = False, swa: "list[bool] | None" = None) -> dict[str, Any]:
    """What TQCache writes for llama.cpp's own float K/V of ``layer`` vs llama.cpp's blocks of it.

    The float rows go through :class:`~tqbridge.metal.lm.cache.TQCache` itself (its quantizer, its
    rotation, its layout), so this checks the cache a user runs, not a separate call of the bridge."""
    import mlx.core as mx

    from tqbridge.metal.lm.cache import TQCache

    if len(q_state.caches) > 1:   # iSWA: model layer `layer`, wherever its record keeps it
        if swa is None:
            raise ValueError("a state with several cache records needs the model's sliding-window pattern")
        fl, ql = f32_state.model_layers(swa)[layer], q_state.model_layers(swa)[layer]
    else:
        fl, ql = f32_state.layers()[layer], q_state.layers()[layer]
    if fl.k_format.name != "f32" or fl.v_format.name != "f32":
        raise ValueError(f"the reference state must hold an F32 cache, got {fl.k_format.key}/{fl.v_format.key}")
    rows = []
    for src in (fl.k, fl.v_rows()):
        x = src.view("<f4").reshape(src.shape[0], -1, head_dim)          # (cells, heads, head_dim)
        rows.append(mx.array(np.ascontiguousarray(x.transpose(1, 0, 2))[None]))
    cache = TQCache(ql.k_format.key, ql.v_format.key, rotation="llama" if rotation else "none")
    cache.update_and_fetch(*rows)
    k, v = tq_rows(cache)
    return {"layer": layer, "writer": "TQCache",
            "k": block_diff(k, ql.k, ql.k_format, head_dim),
            "v": block_diff(v, ql.v_rows(), ql.v_format, head_dim)}


def tq_rows(cache) -> tuple[np.ndarray, np.ndarray]:
    """A TQCache's valid blocks in llama.cpp's row layout: (cells, n_kv_heads * row_bytes) each."""
    kb, vb = cache.blocks()
    k = np.array(kb)
    v = np.array(vb)
    if k.shape[0] != 1:
        raise ValueError(f"expected a batch of one sequence, got {k.shape[0]}")
    n = k.shape[2]
    return (np.ascontiguousarray(k[0].transpose(1, 0, 2)).reshape(n, -1),
            np.ascontiguousarray(v[0].transpose(1, 0, 2)).reshape(n, -1))


def compare_runtime_caches(q_state: LlamaState, mlx_cache: list, head_dim: int) -> list[dict[str, Any]]:
    """Per layer: llama.cpp's blocks vs the MLX TQCache's blocks (share of differing blocks/values)."""
    if len(q_state.caches) > 1:   # iSWA models (Gemma 3): the non-SWA record first, then the SWA one
        swa = [bool(getattr(c, "window", None)) for c in mlx_cache]
        layers = [L for _, L in sorted(q_state.model_layers(swa).items())]
    else:
        layers = q_state.layers()
    if len(layers) != len(mlx_cache):
        raise ValueError(f"llama.cpp's state has {len(layers)} layers, the MLX cache {len(mlx_cache)}")
    out = []
    for i, (L, c) in enumerate(zip(layers, mlx_cache)):
        k, v = tq_rows(c)
        if k.shape[0] != L.k.shape[0]:
            raise ValueError(f"layer {i}: llama.cpp holds {L.k.shape[0]} cells, MLX {k.shape[0]}")
        out.append({"layer": i, "k": block_diff(k, L.k, L.k_format, head_dim),
                    "v": block_diff(v, L.v_rows(), L.v_format, head_dim)})
    return out


def run_cache_level(gguf_path: str, tokens: "list[int]", kvs: "list[str]", *, rotation: bool = False,
                    mlx_runtime=None, runtimes: "bool | list[str]" = True) -> dict[str, Any]:
    """Level 2 for each K/V pair in ``kvs`` on ``tokens``; returns a JSON-ready dict.

    ``gguf_path`` should hold F32 weights (exact-weights mode) so both runtimes multiply by the
    same values. ``runtimes``: compare with an MLX forward pass for every pair (True), none
    (False: same-inputs check only) or the pairs listed.
    """
    from tqbridge.parity.harness.runtimes import KV, LlamaCppRuntime, MLXRuntime, release_memory

    release_memory()      # what an earlier level's MLX model left allocated
    lr = LlamaCppRuntime(gguf_path, rotation=rotation)
    lr.logits(tokens, KV("f32", "f32"), keep_state=True)
    f32_state = parse_state(lr.last_state)
    if isinstance(runtimes, bool):
        with_mlx = {KV.parse(k).name for k in kvs} if runtimes else set()
    else:
        with_mlx = {KV.parse(k).name for k in runtimes}
    # every llama.cpp run before MLX's model loads: one runtime's weights resident at a time
    states = []
    for spec in kvs:
        kv = KV.parse(spec)
        lr.logits(tokens, kv, keep_state=True)
        states.append((kv, parse_state(lr.last_state)))
    lr.release()
    mr = mlx_runtime or MLXRuntime(gguf_path) if (with_mlx or len(f32_state.caches) > 1) else None
    swa = None
    if len(f32_state.caches) > 1:
        from tqbridge.metal.lm.cache import make_cache

        swa = [bool(getattr(c, "window", None)) for c in make_cache(mr.model)]
    results = []
    head_dim = gguf_head_dim(gguf_path)
    for kv, q_state in states:
        stored = read_stored(q_state, kv.name, gguf_path, swa=swa)   # the formats the blocks are in
        entry: dict[str, Any] = {"kv": stored.spelling, "requested": kv.name, "same_inputs": same_input_check(
            f32_state, q_state, head_dim, rotation=rotation, swa=swa)}
        if stored.changed:
            entry["stored"] = stored.to_json()
        if kv.name in with_mlx:
            entry["layers"] = compare_runtime_caches(
                q_state, _mlx_prefill(mr.model, tokens, stored.spelling, rotation), head_dim)
        results.append(entry)
    for e in results:
        s = e["same_inputs"]
        e["passed"] = bool(s["k"]["identical"] and s["v"]["identical"])
        reasons = [KNOWN_DIFFERENCES[f] for f in {s["k"]["format"], s["v"]["format"]} if f in KNOWN_DIFFERENCES]
        if not e["passed"] and reasons:
            e["reason"] = " ".join(reasons)
    return {"tokens": len(tokens), "rotation": rotation, "head_dim": head_dim, "kv": results,
            "passed": all(e["passed"] for e in results)}


def _mlx_prefill(model, tokens: "list[int]", spelling: str, rotation: bool) -> list:
    """tqbridge's cache after one MLX forward pass over ``tokens`` (rotated as llama.cpp's, or not),
    with the per-layer pairs of ``spelling`` (what llama.cpp stored)."""
    import mlx.core as mx

    from tqbridge.parity.harness.runtimes import stored_cache

    cache = stored_cache(model, spelling, rotation=rotation)
    mx.eval(model(mx.array(list(tokens), dtype=mx.int32)[None], cache=cache))
    return cache


def gguf_head_dim(path: str) -> int:
    """K head dimension from GGUF metadata (``attention.key_length``, else embedding / heads)."""
    import gguf

    r = gguf.GGUFReader(str(path))

    def field(key):
        f = r.get_field(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    kl = field(f"{arch}.attention.key_length")
    if kl:
        return int(kl)
    return int(field(f"{arch}.embedding_length")) // int(field(f"{arch}.attention.head_count"))


def summary_lines(report: dict[str, Any]) -> list[str]:
    """A short human summary: layer-0 identity and the share of differing blocks per layer range."""
    lines = []
    for e in report["kv"]:
        s = e["same_inputs"]
        asked = f" (asked {e['requested']})" if e.get("stored") else ""
        lines.append(f"{e['kv']}{asked}: same inputs (layer 0: K {s['k']['format']}, V {s['v']['format']}) "
                     f"K identical={s['k']['identical']} "
                     f"({s['k']['share_blocks']:.2%} differ), V identical={s['v']['identical']} "
                     f"({s['v']['share_blocks']:.2%} differ)")
        if e.get("reason"):
            lines.append(f"  reason: {e['reason']}")
        if "layers" in e:
            ks = [L["k"]["share_blocks"] for L in e["layers"]]
            vs = [L["v"]["share_blocks"] for L in e["layers"]]
            lines.append(f"  runtimes: layer 0 K {ks[0]:.2%} V {vs[0]:.2%}; layers 1+ K mean "
                         f"{np.mean(ks[1:]):.1%} V mean {np.mean(vs[1:]):.1%} of blocks differ")
    return lines
