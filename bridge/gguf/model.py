"""GGUF file -> mlx-lm model with identical weights.

Every tensor is dequantized to float32 with gguf-py (all ggml types, K-quants included), so the MLX
model computes with exactly the values llama.cpp dequantizes. Hyper-parameters come from the
``{arch}.*`` metadata. The architectures and what each is in mlx-lm: :mod:`tqbridge.bridge.gguf.archs`
(llama, qwen2, qwen3, gemma3, phi3, olmo2, granite, stablelm, starcoder2, qwen2moe, qwen3moe,
command-r, smollm3, olmoe, ernie4_5, phi2, exaone).

Two layouts of the attention Q/K rows (see ``qk_rows``, the one place that handles them):

- ``"ggml"``: GGUF's rows as stored (llama's rows are permuted for adjacent-pair RoPE) with MLX's
  traditional (adjacent-pair) RoPE where llama.cpp uses it; K then has exactly llama.cpp's cache
  layout. Default in memory.
- ``"hf"``: rows in Hugging Face order with the RoPE mlx-lm's class uses by default; what
  ``convert --to mlx`` writes (:func:`tqbridge.bridge.gguf.mlx_export.write_mlx_dir`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .archs import ARCHS, Arch
from ..mlx_blas import prefer_fast_blas, slow_blas_notice


class GGUFModelError(ValueError):
    """The GGUF file cannot be turned into an mlx-lm model (one line says why)."""


# GGUF architecture -> mlx-lm model_type
ARCHITECTURES = {name: a.model_type for name, a in ARCHS.items()}
# RoPE factor tensors llama.cpp may carry (Llama 3.1's rope_freqs, Phi-3's LongRoPE): not held
_ROPE_FACTORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


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
    """gguf-py's ``GGUFReader`` on ``path``, after :func:`tqbridge.bridge.gguf.io.validate` has checked
    every count, length and offset against the file (gguf-py trusts them: a hostile count makes it
    loop or allocate); :class:`GGUFModelError` with one line otherwise."""
    import gguf

    from .io import GGUFError, validate

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
    blocks the caller converts one at a time (:mod:`tqbridge.bridge.gguf.mlx_quant`)."""
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


class _Meta:
    """The :class:`tqbridge.bridge.gguf.archs.Meta` view of a file: metadata readers that refuse with
    GGUFModelError, tensor presence."""

    def __init__(self, c: GGUFContents):
        self.c, self.arch = c, c.arch

    def int(self, key: str, default: "int | None" = None, lo: int = 1) -> int:
        return _meta_int(self.c, key, default, lo)

    def float(self, key: str, default: "float | None" = None, positive: bool = False) -> float:
        return _meta_float(self.c, key, default, required=default is None, positive=positive)

    def value(self, key: str, default: Any = None) -> Any:
        return _meta(self.c, key, default, required=False)

    def has(self, tensor: str) -> bool:
        return tensor in self.c.tensors

    def refuse(self, why: str) -> None:
        raise GGUFModelError(f"{self.c.path.name}: {why}")

    def shown(self, v: Any) -> str:
        return _shown(v)


def arch_of(c: GGUFContents) -> Arch:
    """The :class:`~tqbridge.bridge.gguf.archs.Arch` entry of the file's architecture."""
    return ARCHS[c.arch]


def check_shapes(c: GGUFContents, cfg: dict[str, Any]) -> None:
    """The hyper-parameters must describe the tensors the file holds, before a model is built from
    them (mlx-lm allocates per layer and per width from the config: a hostile ``block_count`` or
    ``embedding_length`` must not size anything)."""
    name = c.path.name
    a = arch_of(c)
    emb = c.tensors.get("token_embd.weight")
    if emb is None or emb.ndim != 2 or emb.size == 0:
        raise GGUFModelError(f"{name}: token_embd.weight is missing, empty or not a matrix")
    d = cfg["hidden_size"]
    if d != emb.shape[1]:
        raise GGUFModelError(f"{name}: embedding_length {d} but token_embd.weight has rows of {emb.shape[1]}")
    layers = {p.split(".")[1] for p in c.tensors if p.startswith("blk.") and p.count(".") >= 2}
    if cfg["num_hidden_layers"] != len(layers) or layers != {str(i) for i in range(len(layers))}:
        raise GGUFModelError(f"{name}: block_count {cfg['num_hidden_layers']} but the file holds tensors of "
                             f"{len(layers)} layers")
    n_head, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    if n_head % n_kv:
        raise GGUFModelError(f"{name}: {n_head} attention heads do not group onto {n_kv} KV heads")
    if hd % 2:
        raise GGUFModelError(f"{name}: head dim {hd} is odd; RoPE rotates pairs")
    if a.width_heads and n_head * hd != d:
        raise GGUFModelError(f"{name}: {c.arch} with head dim {hd} x {n_head} heads != embedding_length {d} "
                             f"is not supported (mlx-lm's {a.model_type} derives the head dim from the width)")
    ff = cfg["intermediate_size"]
    want = {"attn_q": (n_head * hd, d), "attn_k": (n_kv * hd, d), "attn_v": (n_kv * hd, d),
            "attn_qkv": ((n_head + 2 * n_kv) * hd, d), "attn_output": (d, n_head * hd),
            "ffn_up": (ff * a.ffn_up_factor, d), "ffn_gate": (ff, d), "ffn_down": (d, ff)}
    if "num_experts" in cfg:   # the expert tensors must be there: the counts size mlx-lm's expert layers
        ne, fe = cfg["num_experts"], cfg["moe_intermediate_size"]
        experts = {"ffn_gate_inp": (ne, d), "ffn_gate_exps": (ne, fe, d), "ffn_up_exps": (ne, fe, d),
                   "ffn_down_exps": (ne, d, fe)}
        if "shared_expert_intermediate_size" in cfg:
            fs = cfg["shared_expert_intermediate_size"]
            experts.update({"ffn_gate_shexp": (fs, d), "ffn_up_shexp": (fs, d), "ffn_down_shexp": (d, fs)})
        missing = [t for t in experts if f"blk.0.{t}.weight" not in c.tensors]
        if missing:
            raise GGUFModelError(f"{name}: {c.arch} names experts but blk.0 has no {', '.join(missing)}")
        want.update(experts)
    for t, shape in want.items():
        got = c.tensors.get(f"blk.0.{t}.weight")
        if got is not None and tuple(got.shape) != shape:
            raise GGUFModelError(f"{name}: blk.0.{t}.weight has shape {tuple(got.shape)}; the hyper-parameters "
                                 f"say {shape}")


def model_config(c: GGUFContents, layout: str = "ggml") -> dict[str, Any]:
    """The mlx-lm ``config.json`` dictionary for these hyper-parameters (mlx-lm's own names for the
    architectures that rename one, beside ours: see ``Arch.keys``)."""
    if layout not in ("ggml", "hf"):
        raise GGUFModelError(f"unknown Q/K layout {layout!r} (use 'ggml' or 'hf')")
    a = arch_of(c)
    n_embd = _meta_int(c, "embedding_length")
    n_head = _meta_int(c, "attention.head_count")
    n_head_kv = _meta_int(c, "attention.head_count_kv", n_head)
    head_dim = _meta_int(c, "attention.key_length", max(1, n_embd // n_head))
    if _meta_int(c, "attention.value_length", head_dim) != head_dim:
        raise GGUFModelError(f"{c.path.name}: key_length != value_length is not supported")
    n_rot = _meta_int(c, "rope.dimension_count", head_dim)
    scaling = _meta(c, "rope.scaling.type", "none", required=False)
    rope_scaling = None
    if scaling == "linear":
        rope_scaling = {"type": "linear", "factor": _meta_float(c, "rope.scaling.factor", positive=True)}
    elif scaling not in ("none", None):
        raise GGUFModelError(f"{c.path.name}: RoPE scaling {_shown(scaling)} is not supported")
    for t in _ROPE_FACTORS:
        if t in c.tensors:
            raise GGUFModelError(f"{c.path.name}: per-frequency RoPE factors ({t}) are not supported")
    eps_key = "attention.layer_norm_rms_epsilon" if a.eps == "rms" else "attention.layer_norm_epsilon"
    cfg: dict[str, Any] = {
        "model_type": a.model_type,
        "hidden_size": n_embd,
        "num_hidden_layers": _meta_int(c, "block_count"),
        "intermediate_size": _meta_int(c, "feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "rms_norm_eps": _meta_float(c, eps_key, positive=True),
        "vocab_size": _rows(c, "token_embd.weight") or 0,
        "rope_theta": _meta_float(c, "rope.freq_base", 10000.0, required=False, positive=True),
        "max_position_embeddings": _meta_int(c, "context_length", 4096),
        "tie_word_embeddings": "output.weight" not in c.tensors,
    }
    if n_rot != head_dim:
        if not a.partial_rope or n_rot > head_dim or n_rot % 2:
            raise GGUFModelError(f"{c.path.name}: partial RoPE (rope.dimension_count {n_rot} of head dim "
                                 f"{head_dim}) is not supported for {c.arch}")
        cfg["partial_rotary_factor"] = n_rot / head_dim
        if int(cfg["partial_rotary_factor"] * head_dim) != n_rot:   # how mlx-lm turns it back into dims
            raise GGUFModelError(f"{c.path.name}: rotated dims {n_rot} of {head_dim} do not survive a float factor")
    if a.lm_head == "tied" and not cfg["tie_word_embeddings"]:
        raise GGUFModelError(f"{c.path.name}: an output tensor apart from token_embd is not held by mlx-lm's "
                             f"{a.model_type} (it ties them)")
    if a.lm_head == "untied" and cfg["tie_word_embeddings"]:
        raise GGUFModelError(f"{c.path.name}: no output.weight: mlx-lm's {a.model_type} holds an output head of its "
                             f"own (and llama.cpp's {c.arch} requires one)")
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    if a.rope_arg:
        cfg["rope_traditional"] = _traditional(a, layout)
    if a.config is not None:
        a.config(_Meta(c), cfg)
    check_shapes(c, cfg)
    for ours, theirs in a.keys.items():
        cfg[theirs] = cfg[ours]
    return cfg


def _traditional(a: Arch, layout: str) -> bool:
    """Whether MLX rotates adjacent pairs (llama.cpp's "norm" RoPE) for ``a`` in ``layout``: in
    ``"ggml"`` as llama.cpp on the stored rows; in ``"hf"`` rows the converter permuted are back in
    half-split order."""
    return a.rope == "norm" and (layout == "ggml" or not a.permuted)


def qk_rows(w: np.ndarray, n_head: int, arch: str, layout: str) -> np.ndarray:
    """Q or K projection rows (weight or bias) in the requested layout; the one place that permutes.

    llama.cpp's converter reorders each head's rows from HF's half-split pairs (i, i + d/2) to
    adjacent pairs (2i, 2i + 1) for the families ``Arch.permuted`` names. ``layout="hf"`` undoes that.
    """
    if layout == "ggml" or not ARCHS[arch].permuted:
        return w
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def mlx_name(c: GGUFContents, name: str) -> tuple[str, str]:
    """A GGUF tensor name -> (its mlx-lm parameter name, its GGUF kind such as ``attn_q``)."""
    a = arch_of(c)
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in a.layer:
        layer, kind, suffix = parts[1], parts[2], parts[3]
        return f"{a.layers}.{layer}.{a.layer[kind]}.{suffix}", kind
    if len(parts) == 2 and parts[0] in a.glob:
        kind, suffix = parts[0], parts[1]
        return f"{a.glob[kind]}.{suffix}", kind
    raise GGUFModelError(f"{c.path.name}: tensor {name} has no place in an mlx-lm {a.model_type} model")


def mlx_rows(c: GGUFContents, cfg: dict[str, Any], kind: str, rows: np.ndarray, layout: str) -> np.ndarray:
    """The rows (axis 0) of a tensor of ``kind`` in the requested Q/K layout: float weights, or the packed
    codes, scales and biases of a quantized one (a row's blocks move with it)."""
    if kind == "attn_q":
        return qk_rows(rows, cfg["num_attention_heads"], c.arch, layout)
    if kind == "attn_k":
        return qk_rows(rows, cfg["num_key_value_heads"], c.arch, layout)
    return rows


def mlx_float(c: GGUFContents, name: str, kind: str, arr: np.ndarray) -> np.ndarray:
    """A float tensor as mlx-lm holds it: Gemma's norms lose the 1 the GGUF adds (checked exact); a
    tensor mlx-lm holds in another shape (qwen2moe's shared-expert gate, a vector in GGUF, is a
    one-row Linear there) is reshaped."""
    a = arch_of(c)
    if a.norm_plus_one and kind.endswith("norm"):
        # The GGUF stores (1 + w); mlx-lm's Gemma RMSNorm adds the 1 itself.
        shifted = arr - np.float32(1.0)
        if not np.array_equal(shifted + np.float32(1.0), arr):
            raise GGUFModelError(f"{c.path.name}: {name}: (w + 1) - 1 is not exact in float32")
        return shifted
    if kind in a.reshape and name.endswith(".weight"):
        return arr.reshape(a.reshape[kind])
    return arr


def mlx_weights(c: GGUFContents, cfg: dict[str, Any], layout: str = "ggml") -> dict[str, np.ndarray]:
    """GGUF tensor names -> mlx-lm parameter names, float32 numpy arrays."""
    out: dict[str, np.ndarray] = {}
    for name, arr in c.tensors.items():
        target, kind = mlx_name(c, name)
        out[target] = mlx_float(c, name, kind, mlx_rows(c, cfg, kind, arr, layout))
    return out


def _release_pages(arr: np.ndarray) -> None:
    """Drop the file pages a tensor read through the GGUF's memory map left in this process's resident
    set, once its copy is made: they stay in the page cache (a later read faults them back in), but the
    process no longer holds the whole file beside the model it built. A no-op for an array not backed by
    a read-only map."""
    import mmap

    root = arr
    while isinstance(getattr(root, "base", None), np.ndarray):
        root = root.base
    mm = getattr(root, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or getattr(root, "mode", "r") != "r" or arr.size == 0:
        return
    page = mmap.PAGESIZE
    start = arr.ctypes.data - root.ctypes.data + (getattr(root, "offset", 0) % mmap.ALLOCATIONGRANULARITY)
    lo = start // page * page
    hi = start + arr.nbytes
    try:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (OSError, ValueError):     # a platform without it, or a range it refuses: the pages stay
        pass


def build_model(c: GGUFContents, layout: str = "ggml", match_llama_cpp: bool = True):
    """An mlx-lm model (float32) with the GGUF's weights. Returns ``(model, config)``.

    ``match_llama_cpp`` makes the model compute what llama.cpp's CPU backend computes where mlx-lm
    differs on purpose (``Arch.adjust``): Gemma's embedding scale (mlx-lm rounds sqrt(d) to bfloat16,
    llama.cpp uses float32), and GELU where ggml looks it up in an fp16 table (Gemma 3) or where
    mlx-lm uses the erf form against llama.cpp's tanh form (StarCoder2).
    """
    prefer_fast_blas()
    import mlx.core as mx
    # private, and kept: mlx-lm has no public way from a config to its model classes with its model-type
    # remapping (load_model wants a directory of weights; this builds from a GGUF in memory)
    from mlx_lm.utils import _get_classes

    slow_blas_notice()  # model work on MLX's CPU with the bundled reference BLAS: say so, once

    a = arch_of(c)
    cfg = model_config(c, layout)
    model_cls, args_cls = _get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))
    # tensor by tensor (what mlx_weights returns at once): one float32 numpy copy alive at a time beside
    # the MLX arrays, not every tensor twice (measured: a 363 MB F32 GGUF loaded at a 771 MB peak so)
    arrays = {}
    for name, arr in c.tensors.items():
        target, kind = mlx_name(c, name)
        arrays[target] = mx.array(mlx_float(c, name, kind, mlx_rows(c, cfg, kind, arr, layout)))
        _release_pages(arr)
    arrays = model.sanitize(arrays) if hasattr(model, "sanitize") else arrays
    try:
        model.load_weights(list(arrays.items()), strict=True)
    except ValueError as e:   # mlx-lm lists the parameters on several lines: one line here
        why = " ".join(str(e).split())
        why = why if len(why) <= 300 else why[:300] + "..."
        raise GGUFModelError(f"{c.path.name}: weights do not fit the mlx-lm {cfg['model_type']} model: {why}") from None
    if not a.rope_arg and _traditional(a, layout):
        _use_traditional_rope(model)
    if match_llama_cpp:
        for name in a.adjust:
            _ADJUST[name](model, cfg)
    mx.eval(model.parameters())
    return model, cfg


def _use_traditional_rope(model) -> None:
    """Rotate adjacent pairs in every RoPE module of ``model`` (mlx-lm classes that fix half-split RoPE:
    llama.cpp's permuted Q/K rows in the ``"ggml"`` layout need adjacent pairs)."""
    import mlx.nn as nn

    for _, m in model.named_modules():
        if isinstance(m, nn.RoPE):
            m.traditional = True


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


def _use_ggml_gelu(model, cfg=None) -> None:
    """Give every gated GELU MLP (Gemma's: down(gelu(gate(x)) * up(x))) llama.cpp's CPU GELU (see
    :func:`ggml_cpu_gelu`)."""
    import mlx.nn as nn

    class _GgmlGeluMLP(nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

        def __call__(self, x):
            return self.down_proj(ggml_cpu_gelu(self.gate_proj(x)) * self.up_proj(x))

    for layer in model.layers:
        layer.mlp = _GgmlGeluMLP(layer.mlp)


def _use_ggml_gelu_mlp(model, cfg=None) -> None:
    """Give every two-matrix GELU MLP llama.cpp's CPU GELU: StarCoder2's c_proj(gelu(c_fc(x))), where
    mlx-lm uses the erf form and llama.cpp (and the Hugging Face model) the tanh form; Phi-2's
    fc2(gelu(fc1(x))), where mlx-lm computes the tanh form without ggml's fp16 table."""
    import mlx.nn as nn

    class _GgmlGeluMLP(nn.Module):
        def __init__(self, up, down):
            super().__init__()
            self.up, self.down = up, down

        def __call__(self, x):
            return self.down(ggml_cpu_gelu(self.up(x)))

    for layer in model.layers:
        mlp = layer.mlp
        up, down = (mlp.c_fc, mlp.c_proj) if hasattr(mlp, "c_fc") else (mlp.fc1, mlp.fc2)
        layer.mlp = _GgmlGeluMLP(up, down)


# Arch.adjust names -> what they do to a built model (build_model(match_llama_cpp=True))
_ADJUST = {
    "gemma_embedding_scale": lambda model, cfg: _use_float32_embedding_scale(model, cfg["hidden_size"]),
    "ggml_gelu_gated": _use_ggml_gelu,
    "ggml_gelu_mlp": _use_ggml_gelu_mlp,
}
