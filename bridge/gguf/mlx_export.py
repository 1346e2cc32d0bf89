"""A GGUF model as an mlx-lm model directory (``tqbridge convert MODEL.gguf --to mlx DIR``).

The weights in Hugging Face row order (:func:`tqbridge.bridge.gguf.model.mlx_weights`, layout
``"hf"``), the config mlx-lm reads, and, where the GGUF's tokenizer can be rebuilt exactly, Hugging Face
tokenizer files (:func:`tqbridge.bridge.gguf.tokenizer.hf_tokenizer_files`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..evaluation_text import evaluation_text
from .mlx_quant import quantized_weights
from .model import GGUFModelError, mlx_weights, model_config, read_gguf
from ..mlx_blas import prefer_fast_blas
from .tokenizer import EDGE_TEXT, TokenizerExportError, hf_tokenizer_files


def write_mlx_dir(src: "str | os.PathLike[str]", out_dir: "str | os.PathLike[str]", *,
                  quantize: bool = False) -> Path:
    """Write an mlx-lm model directory (``config.json`` + ``model.safetensors``, HF row order).

    ``quantize=False``: every tensor float32 (gguf-py's exact dequantization). ``quantize=True``: the
    weights whose ggml type MLX's affine layout holds exactly go to MLX quantized layers, the rest
    float32 (:mod:`tqbridge.bridge.gguf.mlx_quant`; config.json gets mlx-lm's per-layer
    ``quantization`` and, under ``tqbridge.placed``, where each tensor went and why).

    Byte-level BPE (SmolLM2's) and SentencePiece (Gemma 3's) tokenizers are also written as Hugging
    Face tokenizer files, after checking their ids against llama.cpp's on the first 20,000 characters
    of the evaluation text and on edge cases; then ``mlx_lm.load(out_dir)`` works. Otherwise
    (``tokenizer_note`` in config.json says why) load the weights with ``mlx_lm.utils.load_model`` and
    take ids from :class:`tqbridge.bridge.gguf.tokenizer.GGUFTokenizer`.
    The directory appears atomically (built beside it, then renamed); an existing one is refused.
    """
    import json
    import shutil
    import tempfile

    prefer_fast_blas()
    import mlx.core as mx

    src, out = Path(src), Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GGUFModelError(f"{out}: already exists; choose a new directory")
    c = read_gguf(src, dequantize=not quantize)
    cfg = model_config(c, layout="hf")
    placed = why = None
    if quantize:
        q = quantized_weights(c, cfg, layout="hf")
        weights, placed, why = q.arrays, q.placed, q.why_float32
        if q.quantization is not None:
            cfg["quantization"] = q.quantization
            cfg["quantization_config"] = q.quantization
    else:
        weights = mlx_weights(c, cfg, layout="hf")
    try:
        sample = evaluation_text()[0][:20000]
        tok_files = hf_tokenizer_files(src, sample, metadata=c.metadata)
        kind = {"llama": "SentencePiece BPE"}.get(c.metadata.get("tokenizer.ggml.model"), "byte-level BPE")
        note = (f"tokenizer.json rebuilt from the GGUF ({kind}); ids checked against llama.cpp on "
                f"{len(sample):,} characters of the evaluation text and {len(EDGE_TEXT):,} of edge cases, "
                "special-token text parsed and as plain text")
    except TokenizerExportError as e:
        tok_files, note = {}, f"no tokenizer files: {e}"
    for key in ("bos_token_id", "eos_token_id"):
        v = c.metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= int(v) < cfg["vocab_size"]:
            cfg[key] = int(v)
    cfg["tqbridge"] = {"source": src.name, "tokenizer_note": note,
                       "dtype": "float32" if placed is None else "mlx affine where exact, float32 elsewhere"}
    if placed is not None:
        cfg["tqbridge"]["placed"] = placed
        cfg["tqbridge"]["why_float32"] = why
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()},
                            metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for name, text in tok_files.items():
            (tmp / name).write_text(text)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
