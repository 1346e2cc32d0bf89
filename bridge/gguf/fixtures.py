"""Tiny random-weight GGUF models, one per architecture the model loader builds: test fixtures that
llama.cpp and tqbridge both load.

Each file is written with gguf-py's ``GGUFWriter`` from llama.cpp's side of the format: the metadata keys
and tensor names llama.cpp's loader reads for that architecture (gguf-py's ``constants.py`` names them),
float32 weights drawn from a seeded normal distribution, and a small byte-level BPE vocabulary
(:func:`add_tiny_vocab`). Nothing here knows mlx-lm's names; :mod:`tqbridge.bridge.gguf.model` maps
these files onto mlx-lm, so a test that builds both sides from one of them checks that mapping.

The weights are scaled so that the next-token distributions are spread (logits with a standard deviation
near 2): a distribution that puts all its mass on one token has a KL near 0 whatever the two runtimes
compute, which would make a parity test blind.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

N_VOCAB = 512


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map (a fact of the byte-level BPE format)."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def add_tiny_vocab(w, n: int = 300) -> None:
    """An ``n``-token byte-level BPE vocabulary on GGUFWriter ``w``: enough for llama.cpp's loader."""
    toks = byte_alphabet() + ["\u0120t", "<|endoftext|>"]
    toks += [f"<x{i}>" for i in range(n - len(toks))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([1] * len(toks))
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(257)


# A tiny SentencePiece vocabulary in the layout of Gemma 3's: special tokens (unknown, control,
# user-defined: types 2, 3, 4), the 256 byte tokens (type 6, score 0), merged pieces best first (each
# two earlier ones joined, as SentencePiece's BPE training makes them; "ab" outranks "bc", so "abc" is
# [ab, c]), single characters, then unused tokens (type 5).
SPM_SPECIAL = [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<start_of_turn>", 3), ("<b>", 4), ("\n", 4), ("  ", 4)]
SPM_PIECES = ["ab", "bc", "ll", "he", "llo", "hello", "\u2581hello", "or", "ld", "\u2581w", "\u2581wor",
              "\u2581world", "\u2581t", "\u2581the", "at", "\u2581c", "\u2581cat", "\u2581s", "\u2581sat"]
SPM_CHARS = list("abcdehlnorstw,.") + ["\u2581"]


def add_tiny_spm_vocab(w, n: int = 300, add_space_prefix: bool = False, add_eos: bool = False,
                       extra=()) -> None:
    """An ``n``-token SentencePiece vocabulary (tokenizer.ggml.model "llama") on GGUFWriter ``w``:
    :data:`SPM_SPECIAL`, the byte tokens, :data:`SPM_PIECES` (scores -1, -2, ...), :data:`SPM_CHARS`
    (-100, -101, ...), ``extra`` (text, token type) pairs, then ``<unusedN>`` tokens; BOS added."""
    toks = [t for t, _ in SPM_SPECIAL] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + SPM_CHARS
    types = [ty for _, ty in SPM_SPECIAL] + [6] * 256 + [1] * (len(SPM_PIECES) + len(SPM_CHARS))
    scores = [-1000.0] * len(SPM_SPECIAL) + [0.0] * 256 + [-1.0 - i for i in range(len(SPM_PIECES))] \
        + [-100.0 - i for i in range(len(SPM_CHARS))]
    toks += [t for t, _ in extra]
    types += [ty for _, ty in extra]
    scores += [-1000.0] * len(extra)
    pad = n - len(toks)
    toks += [f"<unused{i}>" for i in range(pad)]
    types += [5] * pad
    scores += [-1000.0] * pad
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(add_eos)
    w.add_add_space_prefix(add_space_prefix)


@dataclass(frozen=True)
class Fixture:
    """How one architecture's tiny model looks in GGUF (llama.cpp's names and keys).

    ``norm``: ``rms`` (weight), ``layer`` (weight and bias) or ``layer_nobias`` (weight only, LayerNorm).
    ``qkv``: ``split`` (attn_q, attn_k, attn_v) or ``fused`` (attn_qkv). ``qk_norm``: None, ``head``
    (one vector of head_dim shared by the heads) or ``full`` (a vector over all heads' rows).
    ``ffn``: ``swiglu`` (ffn_gate, ffn_up, ffn_down), ``swiglu_fused`` (ffn_up holds gate then up),
    ``gelu`` (ffn_up, ffn_down), ``moe`` (router and stacked experts), ``moe_shared`` (and a gated
    shared expert). ``layer_norms``: the per-layer norm tensors. ``extra``: metadata key (after
    ``{arch}.``) -> value, written with the type of the value (float32, uint32, bool or string).
    """

    n_layer: int = 2
    d: int = 128
    n_head: int = 4
    n_kv: int = 2
    head_dim: int = 32
    ff: int = 192
    rope_dims: "int | None" = None        # partial RoPE: rotated dims per head (None: all)
    norm: str = "rms"
    qkv: str = "split"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: "str | None" = None
    ffn: str = "swiglu"
    ffn_bias: bool = False
    layer_norms: tuple = ("attn_norm", "ffn_norm")
    tied: bool = True
    output_bias: bool = False
    n_expert: int = 4
    n_expert_used: int = 2
    ff_expert: int = 64
    ff_shared: int = 96
    write_head_dims: bool = True          # key_length / value_length in the metadata
    expert_ff_key: bool = True            # expert_feed_forward_length (else the experts are ff wide)
    extra: dict = field(default_factory=dict)
    layer0_scale: float = 1.0             # layer 0's attn_q/k/v weights times this: a first layer's large activations


# GGUF architecture -> its tiny model. Facts from llama.cpp's loader and graph for each (src/models/):
FIXTURES: dict[str, Fixture] = {
    # llama.cpp's converter permutes llama's Q/K rows; RoPE on adjacent pairs
    "llama": Fixture(),
    # q/k/v biases
    "qwen2": Fixture(qkv_bias=True),
    # q/k RMS norms per head
    "qwen3": Fixture(qk_norm="head"),
    # norms before and after attention and FFN, stored as 1 + w; every 6th layer global, the others a
    # sliding window (16 positions here); GELU through ggml's fp16 table. Untied: the embedding is
    # scaled by sqrt(d), and a tied head would make every token predict itself (a one-hot distribution)
    "gemma3": Fixture(n_layer=6, qk_norm="head", tied=False,
                      layer_norms=("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"),
                      extra={"attention.sliding_window": 16}),
    # fused attn_qkv; ffn_up holds [gate; up] (SwiGLU on the halves); untied output
    "phi3": Fixture(qkv="fused", ffn="swiglu_fused", tied=False, layer_norms=("attn_norm", "ffn_norm")),
    # no pre-norms: RMS norms after attention and after the FFN; q/k norms over all heads' rows
    "olmo2": Fixture(qk_norm="full", layer_norms=("post_attention_norm", "post_ffw_norm"), tied=False),
    # llama's tensors with four multipliers in the metadata (untied: with the embedding scaled by 6 a
    # tied head would make every token predict itself, a one-hot distribution)
    "granite": Fixture(tied=False, extra={"logit_scale": 1.25, "embedding_scale": 6.0, "residual_scale": 0.5,
                              "attention.scale": 0.125}),
    # LayerNorms with bias, a quarter of each head rotated, q/k/v biases
    "stablelm": Fixture(norm="layer", rope_dims=8, qkv_bias=True, tied=False),
    # LayerNorms with bias, biases on every projection, GELU MLP
    "starcoder2": Fixture(norm="layer", qkv_bias=True, o_bias=True, ffn="gelu", ffn_bias=True),
    # q/k/v biases, 4 experts (2 used), a shared expert behind a sigmoid gate
    "qwen2moe": Fixture(qkv_bias=True, ffn="moe_shared", tied=False),
    # q/k norms per head, 4 experts (2 used), top-k weights renormalized
    "qwen3moe": Fixture(qk_norm="head", ffn="moe"),
    # one LayerNorm (no bias) feeding attention and FFN in parallel, logits scaled
    "command-r": Fixture(norm="layer_nobias", layer_norms=("attn_norm",), extra={"logit_scale": 0.9}),
    # llama's tensors; every 4th layer has no RoPE (llama.cpp hard-codes the step 4)
    "smollm3": Fixture(n_layer=4),
    # q/k norms over all heads, 4 experts (2 used) of feed_forward_length, weights not renormalized
    "olmoe": Fixture(qk_norm="full", ffn="moe", ff=64, ff_expert=64, expert_ff_key=False, tied=False,
                     n_kv=4),    # llama.cpp sizes olmoe's k norm by the width: no grouped heads
    # llama's tensors; RoPE on adjacent pairs of rows the converter leaves in place
    "ernie4_5": Fixture(),
    # one LayerNorm feeding attention and a GELU MLP in parallel; biases everywhere (output head too);
    # 24 of each head's 32 dims rotated
    "phi2": Fixture(norm="layer", layer_norms=("attn_norm",), qkv_bias=True, o_bias=True, ffn="gelu",
                    ffn_bias=True, rope_dims=24, tied=False, output_bias=True),
    # llama's tensors and NEOX RoPE
    "exaone": Fixture(tied=False),
}


# Hyper-parameters the loader reads with a default, written with values no loader or mlx-lm model
# defaults to (rope.freq_base 10000 or 1e6; eps 1e-5 or 1e-6), so a loader that ignores a key builds
# a different model from llama.cpp's (tests/test_archs.py plants each). The eps is large against the
# mean square of the tiny models' activations (~0.03), so it moves every norm's output.
ROPE_FREQ_BASE = 2500.0
NORM_EPS = 1e-2
CONTEXT_LENGTH = 2048


def _eps_keys(f: Fixture) -> str:
    return "attention.layer_norm_rms_epsilon" if f.norm == "rms" else "attention.layer_norm_epsilon"


def write_fixture(path: "str | os.PathLike[str]", arch: str, *, seed: "int | None" = None,
                  fixture: "Fixture | None" = None, qtype=None) -> Path:
    """Write the tiny ``arch`` model (``FIXTURES[arch]`` or ``fixture``) as float32 GGUF at ``path``.
    ``seed`` draws the weights; by default one of the architecture's own (two architectures with the
    same tensor shapes would otherwise get the same numbers). ``qtype`` (a gguf-py
    ``GGMLQuantizationType``): matrices whose rows are whole blocks of it are stored quantized."""
    import gguf

    if seed is None:
        seed = zlib.crc32(arch.encode())

    if fixture is None:
        if arch not in FIXTURES:
            raise KeyError(f"no tiny fixture for architecture {arch!r} (have: {', '.join(FIXTURES)})")
        fixture = FIXTURES[arch]
    f = fixture
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    add_tiny_vocab(w, N_VOCAB)
    kv = {
        "context_length": CONTEXT_LENGTH, "embedding_length": f.d, "block_count": f.n_layer,
        "feed_forward_length": f.ff, "attention.head_count": f.n_head, "attention.head_count_kv": f.n_kv,
        "rope.freq_base": ROPE_FREQ_BASE, "rope.dimension_count": f.rope_dims or f.head_dim,
        _eps_keys(f): NORM_EPS,
    }
    if f.write_head_dims:
        kv["attention.key_length"] = f.head_dim
        kv["attention.value_length"] = f.head_dim
    if f.ffn.startswith("moe"):
        kv.update({"expert_count": f.n_expert, "expert_used_count": f.n_expert_used})
        if f.expert_ff_key:
            kv["expert_feed_forward_length"] = f.ff_expert
        if f.ffn == "moe_shared":
            kv["expert_shared_feed_forward_length"] = f.ff_shared
    kv.update(f.extra)
    for key, value in kv.items():
        _add_value(w, f"{arch}.{key}", value)

    def t(name: str, *shape: int, scale: "float | None" = None, offset: float = 0.0) -> None:
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        arr = (rng.standard_normal(shape) * s + offset).astype(np.float32)
        if qtype is not None and arr.ndim == 2 and arr.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)

    def norm(name: str, n: int) -> None:
        t(name + ".weight", n, scale=0.1, offset=1.0)
        if f.norm == "layer":
            t(name + ".bias", n, scale=0.1)

    def linear(name: str, rows: int, cols: int, bias: bool) -> None:
        big = f.layer0_scale if name.startswith("blk.0.attn_") and name[6:] in ("attn_q", "attn_k", "attn_v", "attn_qkv") else 1.0
        t(name + ".weight", rows, cols, scale=big / np.sqrt(cols))
        if bias:
            t(name + ".bias", rows, scale=0.1)

    d, hd = f.d, f.head_dim
    q_rows, kv_rows = f.n_head * hd, f.n_kv * hd
    # logits near 2 standard deviations: rows of the output matrix with norm ~2 against a normed state
    t("token_embd.weight", N_VOCAB, d, scale=2.0 / np.sqrt(d))
    norm("output_norm", d)
    if not f.tied:
        t("output.weight", N_VOCAB, d, scale=2.0 / np.sqrt(d))
        if f.output_bias:
            t("output.bias", N_VOCAB, scale=0.1)
    for i in range(f.n_layer):
        b = f"blk.{i}."
        for n in f.layer_norms:
            norm(b + n, d)
        if f.qkv == "fused":
            linear(b + "attn_qkv", q_rows + 2 * kv_rows, d, f.qkv_bias)
        else:
            linear(b + "attn_q", q_rows, d, f.qkv_bias)
            linear(b + "attn_k", kv_rows, d, f.qkv_bias)
            linear(b + "attn_v", kv_rows, d, f.qkv_bias)
        linear(b + "attn_output", d, q_rows, f.o_bias)
        if f.qk_norm == "head":
            t(b + "attn_q_norm.weight", hd, scale=0.1, offset=1.0)
            t(b + "attn_k_norm.weight", hd, scale=0.1, offset=1.0)
        elif f.qk_norm == "full":
            t(b + "attn_q_norm.weight", q_rows, scale=0.1, offset=1.0)
            t(b + "attn_k_norm.weight", kv_rows, scale=0.1, offset=1.0)
        if f.ffn == "swiglu":
            linear(b + "ffn_gate", f.ff, d, f.ffn_bias)
            linear(b + "ffn_up", f.ff, d, f.ffn_bias)
            linear(b + "ffn_down", d, f.ff, f.ffn_bias)
        elif f.ffn == "swiglu_fused":
            linear(b + "ffn_up", 2 * f.ff, d, f.ffn_bias)
            linear(b + "ffn_down", d, f.ff, f.ffn_bias)
        elif f.ffn == "gelu":
            linear(b + "ffn_up", f.ff, d, f.ffn_bias)
            linear(b + "ffn_down", d, f.ff, f.ffn_bias)
        elif f.ffn in ("moe", "moe_shared"):
            t(b + "ffn_gate_inp.weight", f.n_expert, d)
            t(b + "ffn_gate_exps.weight", f.n_expert, f.ff_expert, d)
            t(b + "ffn_up_exps.weight", f.n_expert, f.ff_expert, d)
            t(b + "ffn_down_exps.weight", f.n_expert, d, f.ff_expert)
            if f.ffn == "moe_shared":
                t(b + "ffn_gate_inp_shexp.weight", d)
                t(b + "ffn_gate_shexp.weight", f.ff_shared, d)
                t(b + "ffn_up_shexp.weight", f.ff_shared, d)
                t(b + "ffn_down_shexp.weight", d, f.ff_shared)
        else:
            raise ValueError(f"unknown ffn kind {f.ffn!r}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_value(w, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        raise TypeError(f"{key}: no GGUF type for {type(value).__name__}")


def variant(arch: str, **changes: Any) -> Fixture:
    """``FIXTURES[arch]`` with some fields changed (a test's variant of a fixture)."""
    return replace(FIXTURES[arch], **changes)
