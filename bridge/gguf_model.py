"""GGUF file -> mlx-lm model with identical weights.

Every tensor is dequantized to float32 with gguf-py (all ggml types, K-quants included), so the MLX
model computes with exactly the values llama.cpp dequantizes. Hyper-parameters come from the
``{arch}.*`` metadata. Supported architectures: llama, qwen2, qwen3, gemma3.

Two layouts of the attention Q/K rows (see ``qk_rows``, the one place that handles them):

- ``"ggml"``: GGUF's rows as stored (llama's rows are permuted for adjacent-pair RoPE) with MLX's
  ``rope_traditional=True``; K then has exactly llama.cpp's cache layout. Default in memory.
- ``"hf"``: rows in Hugging Face order with half-split RoPE; what ``convert --to mlx`` writes
  (:func:`tqbridge.bridge.mlx_export.write_mlx_dir`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .mlx_blas import prefer_fast_blas, slow_blas_notice


class GGUFModelError(ValueError):
    """The GGUF file cannot be turned into an mlx-lm model (one line says why)."""


# GGUF architecture -> mlx-lm model_type
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
# llama.cpp's convert_hf_to_gguf permutes attn_q/attn_k rows only for these (NEOX-RoPE families are not).
_PERMUTED_QK = {"llama"}
# Gemma 3 values llama.cpp hard-codes (src/llama-model.cpp) and the GGUF does not carry.
_GEMMA3_SWA_PATTERN = 6
_GEMMA3_LOCAL_ROPE_BASE = 10000.0

_LAYER_NAMES_COMMON = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NAMES = {
    "llama": {**_LAYER_NAMES_COMMON, "ffn_norm": "post_attention_layernorm"},
    "qwen2": {**_LAYER_NAMES_COMMON, "ffn_norm": "post_attention_layernorm"},
    "qwen3": {**_LAYER_NAMES_COMMON, "ffn_norm": "post_attention_layernorm"},
    "gemma3": {**_LAYER_NAMES_COMMON, "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass
class GGUFContents:
    """What a GGUF file holds: architecture, metadata values and float32 tensors (numpy order)."""

    path: Path
    arch: str
    metadata: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(repr=False)
    tensor_types: dict[str, str] = field(repr=False)
    # gguf-py's ReaderTensor per name (raw blocks, memory-mapped); filled by read_gguf(dequantize=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def open_reader(path: "str | os.PathLike[str]"):
    """gguf-py's ``GGUFReader`` on ``path``, after :func:`tqbridge.bridge.gguf_io.validate` has checked
    every count, length and offset against the file (gguf-py trusts them: a hostile count makes it
    loop or allocate); :class:`GGUFModelError` with one line otherwise."""
    import gguf

    from .gguf_io import GGUFError, validate

    path = Path(path)
    if not path.is_file():
        raise GGUFModelError(f"{path}: no such file")
    try:
        validate(path)
    except GGUFError as e:
        raise GGUFModelError(f"not a readable GGUF file: {e}") from None
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - gguf-py raises many kinds; the file passed validation
        raise GGUFModelError(f"{path}: not a readable GGUF file (gguf-py: {type(e).__name__}: {e})") from None


def dequantize_tensor(t, file_name: str) -> np.ndarray:
    """A gguf-py ``ReaderTensor`` as float32 in numpy order (gguf-py's dequantizers: exact)."""
    import gguf

    shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists ne0 first
    if 0 in shape:                                    # gguf-py cannot reshape an empty tensor
        return np.zeros(shape, np.float32)
    try:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as e:
        raise GGUFModelError(f"{file_name}: tensor {t.name} has type {t.tensor_type.name}, "
                             "which gguf-py cannot dequantize") from e
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)


def read_gguf(path: "str | os.PathLike[str]", dequantize: bool = True) -> GGUFContents:
    """Read metadata and dequantize every tensor to float32 (exact: gguf-py's dequantizers).

    ``dequantize=False``: ``tensors`` holds shape-only placeholders (read-only zero-stride float32
    arrays: the checks on shapes work, nothing is allocated) and ``raw`` gguf-py's tensors, whose
    blocks the caller converts one at a time (:mod:`tqbridge.bridge.gguf_mlx_quant`)."""
    import gguf

    path = Path(path)
    reader = open_reader(path)
    meta: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or (key.startswith("tokenizer.ggml.")
                                       and fld.types[0] == gguf.GGUFValueType.ARRAY):
            continue  # vocabulary arrays are large; the tokenizer reads them itself
        try:
            meta[key] = fld.contents()
        except Exception:  # pragma: no cover - exotic field types are not needed here
            continue
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise GGUFModelError(
            f"{path.name}: architecture {_shown(arch)} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})")
    tensors, types, raw = {}, {}, {}
    for t in reader.tensors:
        if dequantize:
            tensors[t.name] = dequantize_tensor(t, path.name)
        else:
            shape = tuple(int(s) for s in reversed(t.shape))
            tensors[t.name] = np.broadcast_to(np.float32(0), shape)
            raw[t.name] = t
        types[t.name] = t.tensor_type.name
    return GGUFContents(path, arch, meta, tensors, types, raw)


def _meta(c: GGUFContents, key: str, default: Any = None, required: bool = True) -> Any:
    full = f"{c.arch}.{key}"
    if full in c.metadata:
        return c.metadata[full]
    if required and default is None:
        raise GGUFModelError(f"{c.path.name}: metadata {full} is missing")
    return default


def _meta_int(c: GGUFContents, key: str, default: "int | None" = None, lo: int = 1) -> int:
    """An integer hyper-parameter (a GGUF integer, >= ``lo``); GGUFModelError for another type."""
    v = _meta(c, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise GGUFModelError(f"{c.path.name}: metadata {c.arch}.{key} must be an integer, got {_kind(v)}")
    if int(v) < lo:
        raise GGUFModelError(f"{c.path.name}: metadata {c.arch}.{key} is {int(v)}; it must be at least {lo}")
    return int(v)


def _meta_float(c: GGUFContents, key: str, default: "float | None" = None, required: bool = True,
                positive: bool = False) -> float:
    v = _meta(c, key, default, required)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise GGUFModelError(f"{c.path.name}: metadata {c.arch}.{key} must be a number, got {_kind(v)}")
    if positive and not (np.isfinite(v) and v > 0):
        raise GGUFModelError(f"{c.path.name}: metadata {c.arch}.{key} is {float(v)}; it must be positive and finite")
    return float(v)


def _shown(v: Any) -> str:
    """``repr`` of a metadata value, shortened: a hostile file must not make a message huge."""
    if isinstance(v, str):
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    return _kind(v) if isinstance(v, (list, tuple)) else repr(v)


def _kind(v: Any) -> str:
    if isinstance(v, str):
        return f"the string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    if isinstance(v, (list, tuple)):
        return f"an array of {len(v)}"
    return type(v).__name__


def _rows(c: GGUFContents, name: str) -> "int | None":
    t = c.tensors.get(name)
    return None if t is None or t.ndim == 0 else int(t.shape[0])


def check_shapes(c: GGUFContents, cfg: dict[str, Any]) -> None:
    """The hyper-parameters must describe the tensors the file holds, before a model is built from
    them (mlx-lm allocates per layer and per width from the config: a hostile ``block_count`` or
    ``embedding_length`` must not size anything)."""
    name = c.path.name
    emb = c.tensors.get("token_embd.weight")
    if emb is None or emb.ndim != 2 or emb.size == 0:
        raise GGUFModelError(f"{name}: token_embd.weight is missing, empty or not a matrix")
    if cfg["hidden_size"] != emb.shape[1]:
        raise GGUFModelError(f"{name}: embedding_length {cfg['hidden_size']} but token_embd.weight has "
                             f"rows of {emb.shape[1]}")
    layers = {p.split(".")[1] for p in c.tensors if p.startswith("blk.") and p.count(".") >= 2}
    if cfg["num_hidden_layers"] != len(layers) or layers != {str(i) for i in range(len(layers))}:
        raise GGUFModelError(f"{name}: block_count {cfg['num_hidden_layers']} but the file holds tensors of "
                             f"{len(layers)} layers")
    n_head, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    if n_head % n_kv:
        raise GGUFModelError(f"{name}: {n_head} attention heads do not group onto {n_kv} KV heads")
    if hd % 2:
        raise GGUFModelError(f"{name}: head dim {hd} is odd; RoPE rotates pairs")
    for t, rows in (("attn_q", n_head * hd), ("attn_k", n_kv * hd), ("attn_v", n_kv * hd),
                    ("ffn_up", cfg["intermediate_size"]), ("ffn_gate", cfg["intermediate_size"])):
        got = _rows(c, f"blk.0.{t}.weight")
        if got is not None and got != rows:
            raise GGUFModelError(f"{name}: blk.0.{t}.weight has {got} rows; the hyper-parameters say {rows}")


def model_config(c: GGUFContents, layout: str = "ggml") -> dict[str, Any]:
    """The mlx-lm ``config.json`` dictionary for these hyper-parameters."""
    if layout not in ("ggml", "hf"):
        raise GGUFModelError(f"unknown Q/K layout {layout!r} (use 'ggml' or 'hf')")
    n_embd = _meta_int(c, "embedding_length")
    n_head = _meta_int(c, "attention.head_count")
    n_head_kv = _meta_int(c, "attention.head_count_kv", n_head)
    head_dim = _meta_int(c, "attention.key_length", max(1, n_embd // n_head))
    if _meta_int(c, "attention.value_length", head_dim) != head_dim:
        raise GGUFModelError(f"{c.path.name}: key_length != value_length is not supported")
    if head_dim != _meta_int(c, "rope.dimension_count", head_dim):
        raise GGUFModelError(f"{c.path.name}: partial RoPE (rope.dimension_count != head dim) is not supported")
    scaling = _meta(c, "rope.scaling.type", "none", required=False)
    rope_scaling = None
    if scaling == "linear":
        rope_scaling = {"type": "linear", "factor": _meta_float(c, "rope.scaling.factor", positive=True)}
    elif scaling not in ("none", None):
        raise GGUFModelError(f"{c.path.name}: RoPE scaling {_shown(scaling)} is not supported")
    if "rope_freqs.weight" in c.tensors:
        raise GGUFModelError(f"{c.path.name}: per-frequency RoPE factors (rope_freqs.weight) are not supported")
    cfg: dict[str, Any] = {
        "model_type": ARCHITECTURES[c.arch],
        "hidden_size": n_embd,
        "num_hidden_layers": _meta_int(c, "block_count"),
        "intermediate_size": _meta_int(c, "feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "rms_norm_eps": _meta_float(c, "attention.layer_norm_rms_epsilon", positive=True),
        "vocab_size": _rows(c, "token_embd.weight") or 0,
        "rope_theta": _meta_float(c, "rope.freq_base", 10000.0, required=False, positive=True),
        "max_position_embeddings": _meta_int(c, "context_length", 4096),
        "tie_word_embeddings": "output.weight" not in c.tensors,
    }
    check_shapes(c, cfg)
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    if c.arch == "llama":
        cfg["rope_traditional"] = layout == "ggml"
        cfg["attention_bias"] = "blk.0.attn_q.bias" in c.tensors
        cfg["mlp_bias"] = "blk.0.ffn_up.bias" in c.tensors
    elif c.arch == "qwen2":
        if head_dim * n_head != n_embd:
            raise GGUFModelError(f"{c.path.name}: qwen2 with head_dim * heads != embedding_length is not supported")
    elif c.arch == "gemma3":
        cfg.update({
            "query_pre_attn_scalar": head_dim,
            "sliding_window": _meta_int(c, "attention.sliding_window"),
            "sliding_window_pattern": _GEMMA3_SWA_PATTERN,
            "rope_local_base_freq": _GEMMA3_LOCAL_ROPE_BASE,
        })
    return cfg


def qk_rows(w: np.ndarray, n_head: int, arch: str, layout: str) -> np.ndarray:
    """Q or K projection rows (weight or bias) in the requested layout; the one place that permutes.

    llama.cpp's converter reorders each head's rows from HF's half-split pairs (i, i + d/2) to
    adjacent pairs (2i, 2i + 1). ``layout="hf"`` undoes that for the architectures that have it.
    """
    if layout == "ggml" or arch not in _PERMUTED_QK:
        return w
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def mlx_name(c: GGUFContents, name: str) -> tuple[str, str]:
    """A GGUF tensor name -> (its mlx-lm parameter name, its GGUF kind such as ``attn_q``)."""
    names = _LAYER_NAMES[c.arch]
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in names:
        layer, kind, suffix = parts[1], parts[2], parts[3]
        return f"model.layers.{layer}.{names[kind]}.{suffix}", kind
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        kind, suffix = parts[0], parts[1]
        return f"{_GLOBAL_NAMES[kind]}.{suffix}", kind
    raise GGUFModelError(f"{c.path.name}: tensor {name} has no place in an mlx-lm {c.arch} model")


def mlx_rows(c: GGUFContents, cfg: dict[str, Any], kind: str, rows: np.ndarray, layout: str) -> np.ndarray:
    """The rows (axis 0) of a tensor of ``kind`` in the requested Q/K layout: float weights, or the packed
    codes, scales and biases of a quantized one (a row's blocks move with it)."""
    if kind == "attn_q":
        return qk_rows(rows, cfg["num_attention_heads"], c.arch, layout)
    if kind == "attn_k":
        return qk_rows(rows, cfg["num_key_value_heads"], c.arch, layout)
    return rows


def mlx_float(c: GGUFContents, name: str, kind: str, arr: np.ndarray) -> np.ndarray:
    """A float tensor as mlx-lm holds it: Gemma's norms lose the 1 the GGUF adds (checked exact)."""
    if c.arch == "gemma3" and kind.endswith("norm"):
        # The GGUF stores (1 + w); mlx-lm's Gemma RMSNorm adds the 1 itself.
        shifted = arr - np.float32(1.0)
        if not np.array_equal(shifted + np.float32(1.0), arr):
            raise GGUFModelError(f"{c.path.name}: {name}: (w + 1) - 1 is not exact in float32")
        return shifted
    return arr


def mlx_weights(c: GGUFContents, cfg: dict[str, Any], layout: str = "ggml") -> dict[str, np.ndarray]:
    """GGUF tensor names -> mlx-lm parameter names, float32 numpy arrays."""
    out: dict[str, np.ndarray] = {}
    for name, arr in c.tensors.items():
        target, kind = mlx_name(c, name)
        out[target] = mlx_float(c, name, kind, mlx_rows(c, cfg, kind, arr, layout))
    return out


def build_model(c: GGUFContents, layout: str = "ggml", match_llama_cpp: bool = True):
    """An mlx-lm model (float32) with the GGUF's weights. Returns ``(model, config)``.

    ``match_llama_cpp`` makes the model compute what llama.cpp's CPU backend computes where mlx-lm
    differs on purpose: Gemma's embedding scale (mlx-lm rounds sqrt(d) to bfloat16, llama.cpp uses
    float32) and Gemma's GELU (ggml looks it up in an fp16 table).
    """
    prefer_fast_blas()
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    slow_blas_notice()  # model work on MLX's CPU with the bundled reference BLAS: say so, once

    cfg = model_config(c, layout)
    weights = mlx_weights(c, cfg, layout)
    model_cls, args_cls = _get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))
    arrays = {k: mx.array(v) for k, v in weights.items()}
    arrays = model.sanitize(arrays) if hasattr(model, "sanitize") else arrays
    try:
        model.load_weights(list(arrays.items()), strict=True)
    except ValueError as e:   # mlx-lm lists the parameters on several lines: one line here
        why = " ".join(str(e).split())
        why = why if len(why) <= 300 else why[:300] + "..."
        raise GGUFModelError(f"{c.path.name}: weights do not fit the mlx-lm {cfg['model_type']} model: {why}") from None
    if c.arch == "gemma3" and match_llama_cpp:
        _use_float32_embedding_scale(model, cfg["hidden_size"])
        _use_ggml_gelu(model)
    mx.eval(model.parameters())
    return model, cfg


def load_gguf_model(path: "str | os.PathLike[str]", layout: str = "ggml", match_llama_cpp: bool = True):
    """Read ``path`` and build its mlx-lm model: ``(model, config)``."""
    return build_model(read_gguf(path), layout, match_llama_cpp)


def _use_float32_embedding_scale(model, hidden_size: int) -> None:
    """Make mlx-lm's Gemma embedding scale sqrt(d) in float32, as llama.cpp does.

    mlx-lm multiplies the looked-up rows by bfloat16(sqrt(d)); we pre-multiply them by
    float32(sqrt(d)) / bfloat16(sqrt(d)) (one extra rounding, <= 1 ulp). The tied output head keeps
    the unscaled table.
    """
    import mlx.core as mx
    import mlx.nn as nn

    inner = model.model.embed_tokens
    ratio = float(np.float32(np.sqrt(np.float32(hidden_size)))) / float(
        mx.array(hidden_size ** 0.5, mx.bfloat16).astype(mx.float32).item())

    class _ScaledEmbedding(nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.emb = emb

        def __call__(self, ids):
            return self.emb(ids) * mx.array(ratio, mx.float32)

        def as_linear(self, x):
            return self.emb.as_linear(x)

    model.model.embed_tokens = _ScaledEmbedding(inner)


def ggml_cpu_gelu(x):
    """GELU (tanh form) as ggml's CPU backend computes it for float32 (GGML_GELU_FP16 builds).

    Fact from ggml-cpu's vec.h: x <= -10 -> 0, x >= 10 -> x, otherwise the input is rounded to
    fp16 and looked up in a table of fp16(gelu(fp16 value)). The table is reproduced with MLX ops.
    """
    import mlx.core as mx

    h = x.astype(mx.float16).astype(mx.float32)
    c = mx.array(0.7978845608028654, mx.float32)   # sqrt(2 / pi)
    a = mx.array(0.044715, mx.float32)
    g = 0.5 * h * (1.0 + mx.tanh(c * h * (1.0 + a * h * h)))
    g = g.astype(mx.float16).astype(x.dtype)
    return mx.where(x <= -10.0, mx.zeros_like(x), mx.where(x >= 10.0, x, g))


def _use_ggml_gelu(model) -> None:
    """Give every Gemma MLP llama.cpp's CPU GELU (see :func:`ggml_cpu_gelu`)."""
    import mlx.nn as nn

    class _GgmlGeluMLP(nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

        def __call__(self, x):
            return self.down_proj(ggml_cpu_gelu(self.gate_proj(x)) * self.up_proj(x))

    for layer in model.model.layers:
        layer.mlp = _GgmlGeluMLP(layer.mlp)
