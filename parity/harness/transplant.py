"""KV transplant: move a prompt's KV cache between llama.cpp and tqbridge's MLX cache, keep decoding.

Forward: llama.cpp prefills the prompt; its sequence state blob is parsed
(:mod:`tqbridge.bridge.llama.state`) and its raw blocks become the rows of one
:class:`tqbridge.metal.lm.cache.TQCache` per layer — no re-quantization, the bytes are llama.cpp's.
MLX then decodes greedily from that cache. Reverse: MLX prefills into TQCache; its blocks are written
as a sequence blob and restored into a llama.cpp context, which decodes on.

Both directions need a cache llama.cpp holds as rows: a K/V pair of ggml types and flash attention on
(V not transposed). llama.cpp's Hadamard rotation of quantized caches and TQCache's must agree: on
in both (llama.cpp's default, TQCache ``rotation="llama"``) or off in both
(``LLAMA_ATTN_ROT_DISABLE=1``, ``rotation="none"``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tqbridge.bridge import get_format
from tqbridge.bridge.llama.side import rotation_environ
from tqbridge.bridge.blocks.kv_spec import DEFAULT_FORMAT
from tqbridge.bridge.llama.state import LlamaState, load_seq_state, parse_state, read_seq_state, seq_state


class TransplantError(ValueError):
    """The state cannot be moved (format, layout or shape mismatch); the message says which."""


class LlamaSession:
    """One llama.cpp context for a transplant: ``eval(tokens) -> last logits``, ``state()``,
    ``restore(blob, n_past)``; llama-cpp-python's build, or a build chosen with ``--llama``."""

    def __init__(self, gguf_path: str, k_format: str, v_format: str, n_ctx: int = 512,
                 n_threads: "int | None" = None, rotation: bool = True):
        from tqbridge.bridge.llama.compat import ensure_compatible
        from tqbridge.bridge.llama.side import selected

        ensure_compatible()
        self.build = selected()
        self.n_past = 0
        self.rotation = rotation
        threads = n_threads or os.cpu_count() or 1
        type_k, type_v = _type_id(k_format), _type_id(v_format)
        with rotation_environ(rotation):
            if self.build is None:
                from llama_cpp import Llama

                self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                                 verbose=False, flash_attn=True, n_threads=threads, type_k=type_k, type_v=type_v)
            else:
                from tqbridge.bridge.llama.shim import Shim

                self.shim = Shim.for_build(self.build)
                self.model = self.shim.load_model(gguf_path)
                self.n_vocab = self.shim.n_vocab(self.model)
                self.ctx = self.shim.context(self.model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                                             n_threads=threads, flash_attn=True, type_k=type_k, type_v=type_v)

    def eval(self, tokens: "list[int]") -> np.ndarray:
        toks = [int(t) for t in tokens]
        # the rotation's environment again: a build may read it when it builds a graph (the fork at 69d8e4b)
        with rotation_environ(self.rotation):
            if self.build is None:
                self.llm.eval(toks)
                self.n_past = self.llm.n_tokens
                return np.asarray(self.llm.scores[self.llm.n_tokens - 1], np.float32)
            row = self.shim.decode(self.ctx, toks, self.n_past, self.n_vocab, all_logits=False)[0]
        self.n_past += len(toks)
        return row

    def state(self) -> bytes:
        return read_seq_state(self.llm._ctx.ctx) if self.build is None else self.shim.state(self.ctx)

    def restore(self, blob: bytes, tokens: "list[int]") -> None:
        if self.build is None:
            load_seq_state(self.llm._ctx.ctx, blob)
            self.llm.n_tokens = len(tokens)
            self.llm.input_ids[: len(tokens)] = tokens
        else:
            self.shim.set_state(self.ctx, blob)
        self.n_past = len(tokens)

    def close(self) -> None:
        if self.build is None:
            self.llm.close()
        else:
            self.shim.free(self.ctx)
            self.shim.free_model(self.model)


def _type_id(fmt: str) -> int:
    from tqbridge.bridge.llama.side import LlamaBuildError, kv_type_id, selected

    f = get_format(fmt)
    if selected() is not None:
        try:
            return kv_type_id(f.key)
        except LlamaBuildError as e:
            raise TransplantError(str(e)) from e
    if "ggml" not in f.type_ids:
        raise TransplantError(f"{f.key} is not a ggml type; llama.cpp cannot hold it in its KV cache")
    return f.type_ids["ggml"]


def state_to_tqcache(state: LlamaState, model, n_kv_heads: int, head_dim: int, rotation: bool = True) -> list:
    """One TQCache per layer holding llama.cpp's blocks (layout (1, Hkv, cells, row bytes)).

    ``rotation`` must say whether the llama.cpp context rotated its cache (its default: yes).
    """
    import mlx.core as mx

    from tqbridge.bridge.blocks.padding import padded_dim
    from tqbridge.metal.lm.cache import TQCache, make_cache
    from tqbridge.metal.codecs import rotation_group

    probe = make_cache(model, "f16", "f16")
    if len(state.caches) > 1:   # iSWA models (Gemma 3): the non-SWA record first, then the SWA one
        swa = [bool(getattr(c, "window", None)) for c in probe]
        layers = [L for _, L in sorted(state.model_layers(swa).items())]
    else:
        layers = state.layers()
    stream = state.caches[0].stream()
    for c in state.caches[1:]:
        if c.stream().pos.tolist() != stream.pos.tolist():
            raise TransplantError("the state's cache records hold different cells (a window slid?)")
    n = stream.cell_count
    if stream.pos.tolist() != list(range(n)):
        raise TransplantError("the state's cells are not positions 0..n-1 of one sequence in order")
    rot = "llama" if rotation else "none"
    cache = make_cache(model, layers[0].k_format.key, layers[0].v_format.key, rotation=rot)
    if len(cache) != len(layers):
        raise TransplantError(f"the model has {len(cache)} cache layers, the state {len(layers)}")
    for i, (c, L) in enumerate(zip(cache, layers)):
        if not isinstance(c, TQCache):
            raise TransplantError(f"layer {i}: the model's cache is {type(c).__name__}, not a TQCache")
        if L.v_trans:
            raise TransplantError("the state holds transposed V (flash attention was off); rows are needed")
        kf, vf = L.k_format, L.v_format
        if (kf.row_bytes(padded_dim(kf, head_dim)) * n_kv_heads != L.k.shape[1]
                or vf.row_bytes(padded_dim(vf, head_dim)) * n_kv_heads != L.v.shape[1]):
            raise TransplantError(f"layer {i}: rows of {L.k.shape[1]}/{L.v.shape[1]} bytes do not hold "
                                  f"{n_kv_heads} heads of {head_dim} values")
        kb = mx.array(np.ascontiguousarray(L.k_blocks(n_kv_heads).transpose(1, 0, 2))[None])
        vb = mx.array(np.ascontiguousarray(L.v_blocks(n_kv_heads).transpose(1, 0, 2))[None])
        k_rot = rotation_group(kf, head_dim, "k") if rotation else 0
        v_rot = rotation_group(vf, head_dim, "v") if rotation else 0
        # TQCache's saved-state layout: offset, formats, head dims, window, start, rotation, groups.
        meta = (n, kf.key, vf.key, head_dim, head_dim, c.window or 0, 0, rot, k_rot, v_rot)
        if len(meta) != len(c.meta_state):
            raise TransplantError(f"TQCache's state has {len(c.meta_state)} metadata fields; this transplant writes {len(meta)}")
        c.state = (kb, vb, *(str(m) for m in meta))
    return cache


def tqcache_to_state(cache: list, seq_id: int = 0, header: bool = True) -> LlamaState:
    """A llama.cpp sequence state from TQCache layers (positions 0..offset-1, one sequence).
    ``header``: False for an older llama.cpp's header-less sequence blob (the fork at 69d8e4b)."""
    from tqbridge.parity.harness.level_cache import tq_rows

    layers = []
    n = None
    for i, c in enumerate(cache):
        if getattr(c, "calibration", None):
            raise TransplantError(f"layer {i}: keys are calibrated ({c.calibration.spec}): the blocks hold "
                                  "(k - mu) / s, not the keys llama.cpp would store; export an uncalibrated cache")
        kf, vf = get_format(c.k_format), get_format(c.v_format)
        for f, d in ((kf, c.k_dim), (vf, c.v_dim)):
            if d is None or (d % f.block_size and f.kind != "turbo"):   # turbo heads are stored padded
                raise TransplantError(f"layer {i}: head dim {d} is not whole {f.key} blocks; llama.cpp cannot hold it")
        k, v = tq_rows(c)
        n = k.shape[0] if n is None else n
        if k.shape[0] != n:
            raise TransplantError(f"layer {i} holds {k.shape[0]} positions, layer 0 {n}")
        layers.append((_type_id(kf.key), k, _type_id(vf.key), v))
    swa = [bool(getattr(c, "window", None)) for c in cache]
    if any(swa) and not all(swa):   # iSWA: llama.cpp keeps two records, the non-SWA layers first
        full = seq_state([x for x, w in zip(layers, swa) if not w], np.arange(n), seq_id=seq_id)
        full.caches += seq_state([x for x, w in zip(layers, swa) if w], np.arange(n), seq_id=seq_id).caches
        state = full
    else:
        state = seq_state(layers, np.arange(n), seq_id=seq_id)
    state.header = header
    return state


def greedy_mlx(model, cache: list, first: int, n: int, decode: "str | None" = None) -> list[int]:
    """Feed ``first`` then greedy tokens through the MLX model; the ``n`` tokens after ``first``.

    ``decode``: None for mlx-lm's own attention over the dequantized cache, or a mode of
    :func:`tqbridge.metal.lm.routing.route_attention` (``"kernel"``: the fused decode kernel).
    """
    import contextlib

    import mlx.core as mx

    ctx = contextlib.nullcontext()
    if decode is not None:
        from tqbridge.metal.lm.routing import route_attention

        ctx = route_attention(decode)
    out = []
    tok = int(first)
    with ctx:
        for _ in range(n):
            logits = model(mx.array([[tok]], dtype=mx.int32), cache=cache)
            tok = int(mx.argmax(logits[0, -1]).item())
            out.append(tok)
    return out


def decode_paths(cache: list) -> dict[str, int]:
    """Attention paths the TQCache layers took (as the routing records them)."""
    from collections import Counter

    total: Counter = Counter()
    for c in cache:
        total.update(getattr(c, "paths", {}))
    return dict(total)


def greedy_llama(llm: LlamaSession, first: int, n: int) -> list[int]:
    """Feed ``first`` then greedy tokens through a llama.cpp session; the ``n`` tokens after it."""
    out = []
    tok = int(first)
    for _ in range(n):
        tok = int(np.argmax(llm.eval([tok])))
        out.append(tok)
    return out


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k


def run_transplant(gguf_path: str, tokens: "list[int]", kv: str = DEFAULT_FORMAT, n_new: int = 16,
                   mlx_runtime=None, reverse: bool = True, rotation: bool = True,
                   decode: "str | None" = None) -> dict[str, Any]:
    """Both directions for one K/V pair; returns the token streams and how long they agree.

    ``decode``: how MLX attends during decode (see :func:`greedy_mlx`); the paths taken are reported.
    """
    import mlx.core as mx

    from tqbridge.bridge.llama.stored_kv import read_stored
    from tqbridge.parity.harness.level_cache import gguf_head_dim
    from tqbridge.parity.harness.runtimes import KV, MLXRuntime, release_memory, stored_cache, swa_pattern

    pair = KV.parse(kv)
    head_dim = gguf_head_dim(gguf_path)
    n_ctx = max(256, -(-(len(tokens) + n_new + 1) // 256) * 256)

    # Forward: llama.cpp prefill -> MLX decode. llama.cpp's session ends before MLX's model loads, and
    # MLX's goes before the reverse session: one runtime's weights resident at a time
    release_memory()      # what an earlier level's MLX model left allocated
    llm = LlamaSession(gguf_path, pair.k, pair.v, n_ctx=n_ctx, rotation=rotation)
    try:
        first = int(np.argmax(llm.eval(list(tokens))))
        blob = llm.state()
        llama_cont = greedy_llama(llm, first, n_new)
    finally:
        llm.close()
    mr = mlx_runtime or MLXRuntime(gguf_path)
    model, cfg = mr.model, mr.config
    n_kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    state = parse_state(blob)
    swa = swa_pattern(model) if len(state.caches) > 1 else None
    stored = read_stored(state, pair.name, gguf_path, swa=swa)   # what the build stored, per layer
    moved = state_to_tqcache(state, model, n_kv_heads, head_dim, rotation=rotation)
    round_trip = tqcache_to_state(moved, header=state.header).to_bytes() == blob
    mlx_from_llama = greedy_mlx(model, moved, first, n_new, decode)
    # MLX on its own (its own prefill), for comparison.
    own = stored_cache(model, stored.spelling, rotation=rotation)   # the same per-layer types as llama.cpp's
    mlx_logits = model(mx.array(list(tokens), dtype=mx.int32)[None], cache=own)
    mlx_first = int(mx.argmax(mlx_logits[0, -1]).item())
    own_blob = tqcache_to_state(own, header=state.header).to_bytes() if reverse else None
    mlx_cont = greedy_mlx(model, own, mlx_first, n_new, decode)
    res: dict[str, Any] = {
        "kv": stored.spelling, "requested": pair.name, **({"stored": stored.to_json()} if stored.changed else {}),
        "rotation": rotation, "prompt_tokens": len(tokens), "new_tokens": n_new,
        "first_token": {"llama.cpp": first, "mlx": mlx_first},
        "llama.cpp": llama_cont, "mlx_from_llama_state": mlx_from_llama, "mlx_own_prefill": mlx_cont,
        "mlx_decode_paths": decode_paths(moved),
        "blob_round_trip_bytes_equal": round_trip,
        "forward_agree": agreeing_prefix(llama_cont, mlx_from_llama),
        "independent_agree": agreeing_prefix(llama_cont, mlx_cont) if first == mlx_first else 0,
    }
    del model, cfg, mr, moved, own, mlx_logits
    release_memory()
    if reverse:
        # Reverse: MLX prefill -> llama.cpp decode from MLX's blocks.
        llm = LlamaSession(gguf_path, pair.k, pair.v, n_ctx=n_ctx, rotation=rotation)
        try:
            llm.restore(own_blob, list(tokens))
            llama_from_mlx = greedy_llama(llm, mlx_first, n_new)
        finally:
            llm.close()
        res["llama_from_mlx_state"] = llama_from_mlx
        res["reverse_agree"] = agreeing_prefix(mlx_cont, llama_from_mlx)
    return res
