"""KV caches across the runtimes: llama.cpp session files <-> mlx-lm prompt-cache files of TQCache layers.

:func:`session_to_prompt_cache` reads a llama.cpp session file (or sequence-state file), checks it
against the model's GGUF (:func:`tqbridge.bridge.llama.kv_files.check_against_model`) and writes one
:class:`~tqbridge.metal.lm.cache.TQCache` per layer into an mlx-lm prompt-cache file
(``mlx_lm.models.cache.save_prompt_cache``'s layout). :func:`prompt_cache_to_session` goes back.

- **Same formats**: llama.cpp's row of one cell (all KV heads, head-major) is TQCache's
  (1, heads, cells, bytes) blocks transposed; the bytes are moved, not decoded.
- **Another pair** (``kv``) or another rotation: every layer is decoded to float32 (TQCache's
  ``fetch``: dequantized, the Hadamard rotation undone) and appended to a TQCache of the target
  pair, whose quantize-on-append is byte-identical to tqbridge's numpy quantizers, which are
  byte-identical to ggml's (``tqbridge selfcheck``). So the blocks are what each runtime's quantizer
  writes for those values.
- **Rotation**: llama.cpp rotates K/V rows of quantized ggml types by a Hadamard matrix before
  quantizing (its default; ``LLAMA_ATTN_ROT_DISABLE=1`` turns it off) and a session file does not say
  which; ``rotation`` names it ("llama" or "none"), and TQCache records it in its state.
- **Tokens**: a session file lists the tokens its cells hold; the prompt cache keeps them in its
  metadata (``tqbridge_tokens``, a JSON list) with the model's geometry, so the way back can write
  the list and refuse another model's cache.
"""

from __future__ import annotations

import json
import os
from typing import Any

import mlx.core as mx
import numpy as np

from tqbridge.bridge import get_format
from tqbridge.bridge.atomic import atomic_output, write_atomic
from tqbridge.bridge.llama.kv_files import (KVGeometry, check_against_model, kv_geometry, read_session_file,
                                      session_from_layers)
from tqbridge.bridge.llama.state import LayerKV

from .cache import TQCache
from ..codecs import rotation_group
from .prompt_cache import load_prompt_cache

__all__ = ["ConvertError", "layers_to_caches", "caches_to_rows", "requantize", "save_tq_prompt_cache",
           "read_tq_prompt_cache", "session_to_prompt_cache", "prompt_cache_to_session"]

ROTATIONS = ("llama", "none")
# (no dots: mlx-lm flattens the metadata into the file's key tree, where a dot nests)
META_TOKENS = "tqbridge_tokens"
META_MODEL = "tqbridge_model"


class ConvertError(ValueError):
    """A cache that cannot be converted as asked; one line says why."""


def _rows_per_head(rows: np.ndarray, heads: int) -> mx.array:
    """llama.cpp rows (cells, heads * bytes) -> TQCache blocks (1, heads, cells, bytes)."""
    cells = rows.shape[0]
    return mx.array(np.ascontiguousarray(rows.reshape(cells, heads, -1).transpose(1, 0, 2))[None])


def layers_to_caches(layers: "list[LayerKV]", n_kv_heads: int, head_dim: int, rotation: str = "llama") -> list:
    """One TQCache per layer holding llama.cpp's blocks unchanged; ``rotation``: whether llama.cpp
    rotated its quantized rows ("llama", its default) or not ("none")."""
    if rotation not in ROTATIONS:
        raise ConvertError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
    out = []
    for L in layers:
        kf, vf = L.k_format, L.v_format
        n = L.k.shape[0]
        c = TQCache(kf.key, vf.key, rotation=rotation)
        k_rot = rotation_group(kf, head_dim, "k") if rotation == "llama" else 0
        v_rot = rotation_group(vf, head_dim, "v") if rotation == "llama" else 0
        # TQCache's state: K blocks, V blocks, offset, formats, head dims, window, start, rotation, groups
        c.state = (_rows_per_head(L.k, n_kv_heads), _rows_per_head(L.v, n_kv_heads),
                   str(n), kf.key, vf.key, str(head_dim), str(head_dim), "0", "0", rotation, str(k_rot), str(v_rot))
        out.append(c)
    return out


def caches_to_rows(caches: list) -> "list[tuple[int, np.ndarray, int, np.ndarray]]":
    """(k ggml type, K rows, v ggml type, V rows) per layer, rows (cells, heads * bytes) uint8 as
    llama.cpp stores them."""
    out = []
    for i, c in enumerate(caches):
        kb, vb = c.blocks()
        k, v = np.array(kb), np.array(vb)
        if k.shape[0] != 1:
            raise ConvertError(f"layer {i}: a batch of {k.shape[0]} sequences; a session file holds one")
        ids = []
        for f in (get_format(c.k_format), get_format(c.v_format)):
            if "ggml" not in f.type_ids:
                raise ConvertError(f"layer {i}: {f.key} is not a ggml type; llama.cpp cannot hold it "
                                   "(give --kv with ggml types)")
            ids.append(f.type_ids["ggml"])
        n = k.shape[2]
        out.append((ids[0], np.ascontiguousarray(k[0].transpose(1, 0, 2)).reshape(n, -1),
                    ids[1], np.ascontiguousarray(v[0].transpose(1, 0, 2)).reshape(n, -1)))
    return out


def requantize(caches: list, k_format: str, v_format: str, rotation: str = "llama") -> list:
    """New TQCache layers of ``k_format``/``v_format`` and ``rotation`` holding the decoded values of
    ``caches`` (dequantized, the source's rotation undone), quantized by TQCache's own append."""
    if rotation not in ROTATIONS:
        raise ConvertError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
    out = []
    for c in caches:
        k, v = c.fetch(mx.float32)
        d = TQCache(k_format, v_format, window=c.window, rotation=rotation)
        d.update_and_fetch(k, v)
        mx.eval(d.keys, d.values)
        out.append(d)
    return out


def _needs_requantize(caches: list, k_format: str, v_format: str, rotation: str) -> bool:
    for c in caches:
        if (get_format(c.k_format).key, get_format(c.v_format).key) != (k_format, v_format):
            return True
        if (c.k_rot, c.v_rot) != ((rotation_group(c.k_format, c.k_dim, "k"), rotation_group(c.v_format, c.v_dim, "v"))
                                  if rotation == "llama" else (0, 0)):
            return True
    return False


def _model_meta(geo: KVGeometry) -> str:
    return json.dumps({"file": geo.file, "name": geo.name, "arch": geo.arch, "n_layer": geo.n_layer,
                       "n_kv_heads": geo.n_kv_heads, "head_dim": geo.head_dim, "n_vocab": geo.n_vocab})


def save_tq_prompt_cache(path: "str | os.PathLike[str]", caches: list, tokens: "list[int]", geo: KVGeometry,
                         metadata: "dict[str, str] | None" = None) -> None:
    """mlx-lm's ``save_prompt_cache`` of ``caches`` with the tokens and the model's geometry in its
    metadata (what :func:`prompt_cache_to_session` needs), written atomically."""
    from mlx_lm.models.cache import save_prompt_cache

    meta = dict(metadata or {})
    meta[META_TOKENS] = json.dumps([int(t) for t in tokens])
    meta[META_MODEL] = _model_meta(geo)
    with atomic_output(path, suffix=".safetensors") as tmp:
        save_prompt_cache(str(tmp), caches, metadata=meta)


def _parse_kv(kv: "str | None", default: "tuple[str, str]") -> "tuple[str, str]":
    if kv is None:
        return default
    from tqbridge.bridge.blocks.kv_spec import parse_kv

    k, v = parse_kv(kv)
    return get_format(k).key, get_format(v).key


def _summary(caches: list, direction: str, src_pair, dst_pair, moved: bool, tokens: list, rotation: str) -> dict:
    nb = sum(int(b.nbytes) for c in caches for b in c.blocks())
    return {"direction": direction, "from": "/".join(src_pair), "to": "/".join(dst_pair),
            "blocks": "moved unchanged" if moved else "re-quantized from decoded values",
            "rotation": rotation, "tokens": len(tokens), "layers": len(caches), "kv_bytes": nb}


def session_to_prompt_cache(session: "str | os.PathLike[str]", out: "str | os.PathLike[str]",
                            gguf: "str | os.PathLike[str]", kv: "str | None" = None,
                            rotation: str = "llama") -> dict[str, Any]:
    """llama.cpp session file -> mlx-lm prompt cache of TQCache layers; returns a summary dict.
    Errors (:class:`StateError`, :class:`ConvertError`, the GGUF's) are one line each."""
    sf = read_session_file(session)
    geo = kv_geometry(gguf)
    layers = check_against_model(sf, geo)
    caches = layers_to_caches(layers, geo.n_kv_heads, geo.head_dim, rotation)
    src = (layers[0].k_format.key, layers[0].v_format.key)
    dst = _parse_kv(kv, src)
    moved = not _needs_requantize(caches, *dst, rotation)
    if not moved:
        caches = requantize(caches, *dst, rotation)
    save_tq_prompt_cache(out, caches, sf.tokens, geo,
                         {"tqbridge_source": f"llama.cpp {sf.kind} file v{sf.version}, {'/'.join(src)}"})
    return _summary(caches, "llama.cpp -> mlx-lm", src, dst, moved, sf.tokens, rotation)


def read_tq_prompt_cache(path: "str | os.PathLike[str]", geo: KVGeometry) -> "tuple[list, list[int]]":
    """(TQCache layers, tokens) of a prompt cache, checked against the model's geometry."""
    try:
        caches, meta = load_prompt_cache(path, return_metadata=True)
    except ValueError as e:        # PromptCacheError, TQCache's CacheStateError: one line each
        raise ConvertError(str(e)) from None
    if META_TOKENS not in meta:
        raise ConvertError(f"{path}: the prompt cache lists no tokens (metadata {META_TOKENS!r}); a llama.cpp "
                           "session file needs them (save with tqbridge.metal.lm.prompt_cache_convert."
                           "save_tq_prompt_cache)")
    try:
        tokens = json.loads(meta[META_TOKENS])
    except ValueError:
        tokens = None
    if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
        raise ConvertError(f"{path}: metadata {META_TOKENS!r} is not a JSON list of integers")
    if geo.n_vocab and any(not 0 <= t < geo.n_vocab for t in tokens):
        raise ConvertError(f"{path}: a token is outside {geo.file}'s vocabulary of {geo.n_vocab}: not this model's cache")
    if len(caches) != geo.n_layer:
        raise ConvertError(f"{path}: {len(caches)} cache layers; {geo.file} has {geo.n_layer} ({geo.describe()}): "
                           "not this model's cache")
    for i, c in enumerate(caches):
        if not isinstance(c, TQCache):
            raise ConvertError(f"{path}: layer {i} is mlx-lm's {type(c).__name__}, not a TQCache (convert a cache "
                               "made with tqbridge.metal.lm.cache.make_cache)")
        if c.keys is None:
            raise ConvertError(f"{path}: layer {i} is empty")
        if c.calibration:
            raise ConvertError(f"{path}: layer {i}: keys are calibrated ({c.calibration.spec}); the blocks hold "
                               "(k - mu) / s, not keys llama.cpp would store")
        if c.window or c.start:
            raise ConvertError(f"{path}: layer {i} is a sliding-window cache; not converted yet")
        heads = c.keys.shape[1]
        if (heads, c.k_dim, c.v_dim) != (geo.n_kv_heads, geo.head_dim, geo.v_head_dim):
            raise ConvertError(f"{path}: layer {i} holds {heads} heads of {c.k_dim}/{c.v_dim} values; {geo.file} "
                               f"has {geo.n_kv_heads} of {geo.head_dim}/{geo.v_head_dim}: not this model's cache")
        if c.offset != len(tokens):
            raise ConvertError(f"{path}: layer {i} holds {c.offset} positions but the metadata lists "
                               f"{len(tokens)} tokens")
    return caches, tokens


def prompt_cache_to_session(prompt_cache: "str | os.PathLike[str]", out: "str | os.PathLike[str]",
                            gguf: "str | os.PathLike[str]", kv: "str | None" = None, rotation: str = "llama",
                            kind: str = "session") -> dict[str, Any]:
    """mlx-lm prompt cache of TQCache layers -> llama.cpp session file (``kind`` "session", read by
    ``llama_state_load_file``) or sequence-state file ("sequence", ``llama_state_seq_load_file``).
    ``rotation``: the llama.cpp side's (a cache stored with the other one is re-quantized)."""
    if rotation not in ROTATIONS:
        raise ConvertError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
    geo = kv_geometry(gguf)
    caches, tokens = read_tq_prompt_cache(prompt_cache, geo)
    pairs = {(get_format(c.k_format).key, get_format(c.v_format).key) for c in caches}
    if len(pairs) != 1:
        raise ConvertError(f"{prompt_cache}: layers hold {len(pairs)} different K/V pairs; one pair per file is converted")
    src = pairs.pop()
    dst = _parse_kv(kv, src)
    moved = not _needs_requantize(caches, *dst, rotation)
    if not moved:
        caches = requantize(caches, *dst, rotation)
    sf = session_from_layers(kind, tokens, caches_to_rows(caches), geo.arch)
    write_atomic(out, sf.to_bytes())
    return _summary(caches, "mlx-lm -> llama.cpp", src, dst, moved, tokens, rotation)

