"""What each GGUF architecture is in mlx-lm: the table :mod:`tqbridge.bridge.gguf.model` builds from.

One :class:`Arch` per GGUF ``general.architecture``: the mlx-lm ``model_type`` it becomes, where each
GGUF tensor goes in that mlx-lm model, how llama.cpp rotates its Q/K rows, and the architecture's own
config entries (read from the ``{arch}.*`` metadata through a :class:`Meta`, or set as llama.cpp sets
them where the GGUF does not carry them). What an architecture's mlx-lm class cannot hold is refused
through ``Meta.refuse`` with one line.

Facts per architecture come from llama.cpp's loader and graph (``src/models/<arch>.cpp``; llama.cpp's
``llama_model_rope_type`` for the RoPE kind) and from mlx-lm's model classes (``mlx_lm/models/``);
each entry's comment says which are its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class Meta(Protocol):
    """The GGUF file as an architecture's config function sees it (:mod:`gguf_model` implements it)."""

    arch: str

    def int(self, key: str, default: "int | None" = None, lo: int = 1) -> int: ...
    def float(self, key: str, default: "float | None" = None, positive: bool = False) -> float: ...
    def value(self, key: str, default: Any = None) -> Any: ...
    def has(self, tensor: str) -> bool: ...
    def refuse(self, why: str) -> None: ...
    def shown(self, v: Any) -> str: ...       # a metadata value, shortened for a message


# mlx-lm names shared by the llama-like classes (GGUF per-layer tensor kind -> path inside a layer)
LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
EXPERTS = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}
GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class Arch:
    """One GGUF architecture as an mlx-lm model.

    ``rope``: llama.cpp's RoPE for it, ``"norm"`` (adjacent pairs) or ``"neox"`` (pairs half a head
    apart). ``permuted``: llama.cpp's converter reordered the Q/K rows of this family from Hugging
    Face's half-split pairs to adjacent pairs (``qk_rows`` undoes it for ``layout="hf"``). ``rope_arg``:
    mlx-lm's ModelArgs takes ``rope_traditional``; where it does not, the model's RoPE modules are set
    after it is built. ``eps``: which epsilon key the GGUF has, ``"rms"`` or ``"layer"`` (LayerNorm).
    ``keys``: our config name -> the name mlx-lm's ModelArgs uses for it. ``width_heads``: mlx-lm
    derives head_dim as hidden_size // heads. ``lm_head``: ``"either"``, or ``"tied"`` / ``"untied"``
    where the mlx-lm class holds only that (a file of the other kind is refused). ``norm_plus_one``: the GGUF's norms hold 1 + w (Gemma). ``partial_rope``:
    mlx-lm's class rotates part of a head. ``adjust``: changes to the built model that make it compute
    what llama.cpp's CPU backend computes (``build_model(match_llama_cpp=True)``). ``config``: the
    architecture's own config entries. ``note``: one line for the docs; ``refuses``: the variants the
    loader refuses beyond what it refuses for every architecture (tests/test_archs.py plants each).
    """

    model_type: str
    layer: dict
    glob: dict = field(default_factory=lambda: dict(GLOBAL))
    layers: str = "model.layers"
    rope: str = "neox"
    permuted: bool = False
    rope_arg: bool = True
    eps: str = "rms"
    keys: dict = field(default_factory=dict)
    width_heads: bool = False
    lm_head: str = "either"
    norm_plus_one: bool = False
    partial_rope: bool = False
    adjust: tuple = ()
    config: "Callable[[Meta, dict], None] | None" = None
    reshape: dict = field(default_factory=dict)   # GGUF kind -> the shape mlx-lm holds it in
    ffn_up_factor: int = 1                        # ffn_up rows per feed_forward_length (2: gate and up fused)
    note: str = ""
    refuses: tuple = ()                           # the variants of it the loader refuses, for the docs


# Gemma 3 values llama.cpp hard-codes (src/llama-model.cpp) and the GGUF does not carry.
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
# SmolLM3: llama.cpp hard-codes that every 4th layer has no RoPE (src/models/smollm3.cpp,
# ``n_no_rope_layer_step = 4``); there is no GGUF key for it.
SMOLLM3_NO_ROPE_STEP = 4


def _llama(m: Meta, cfg: dict) -> None:
    cfg["attention_bias"] = m.has("blk.0.attn_q.bias")
    cfg["mlp_bias"] = m.has("blk.0.ffn_up.bias")


def _qwen2(m: Meta, cfg: dict) -> None:
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        m.refuse("qwen2 with head_dim * heads != embedding_length is not supported")


def _gemma3(m: Meta, cfg: dict) -> None:
    cfg.update(query_pre_attn_scalar=cfg["head_dim"], sliding_window=m.int("attention.sliding_window"),
               sliding_window_pattern=GEMMA3_SWA_PATTERN, rope_local_base_freq=GEMMA3_LOCAL_ROPE_BASE)


def _phi3(m: Meta, cfg: dict) -> None:
    # llama.cpp turns Phi-3's sliding window off (src/models/phi3.cpp), as mlx-lm's phi3 has none
    if m.has("blk.0.attn_q.weight"):
        m.refuse("phi3 with separate attn_q/attn_k/attn_v is not supported (mlx-lm's phi3 holds one qkv_proj)")
    cfg["original_max_position_embeddings"] = cfg["max_position_embeddings"]


def _olmo2(m: Meta, cfg: dict) -> None:
    cfg["attention_bias"] = m.has("blk.0.attn_q.bias")
    cfg["mlp_bias"] = m.has("blk.0.ffn_up.bias")


def _granite(m: Meta, cfg: dict) -> None:
    # llama.cpp (src/models/granite.cpp): logits / logit_scale; the other three multiply where set and
    # are left out where 0 or absent; attention.scale replaces 1/sqrt(head_dim)
    if m.value("expert_count", 0):
        m.refuse("granite with experts (Granite MoE) is not supported")
    if m.value("rope.scaling.finetuned", True) is False:
        m.refuse("granite without RoPE (rope.scaling.finetuned = false) is not supported")
    cfg["logits_scaling"] = m.float("logit_scale", positive=True)
    cfg["embedding_multiplier"] = m.float("embedding_scale", 0.0) or 1.0
    cfg["residual_multiplier"] = m.float("residual_scale", 0.0) or 1.0
    cfg["attention_multiplier"] = m.float("attention.scale", 0.0) or cfg["head_dim"] ** -0.5
    _llama(m, cfg)


def _stablelm(m: Meta, cfg: dict) -> None:
    if m.has("blk.0.attn_q_norm.weight"):
        m.refuse("stablelm with per-head q/k LayerNorms is not supported")
    if not m.has("blk.0.ffn_norm.weight"):
        m.refuse("stablelm with a parallel residual (no ffn_norm) is not supported")
    cfg["use_qkv_bias"] = m.has("blk.0.attn_q.bias")
    cfg["use_parallel_residual"] = False
    cfg["qk_layernorm"] = False


def _command_r(m: Meta, cfg: dict) -> None:
    # llama.cpp (src/models/command-r.cpp): logits * logit_scale; LayerNorm without bias
    if m.has("blk.0.attn_q_norm.weight"):
        m.refuse("command-r with q/k norms (Command R+) is not supported")
    cfg["logit_scale"] = m.float("logit_scale", positive=True)
    cfg["attention_bias"] = False
    cfg["layer_norm_bias"] = False
    cfg["use_qk_norm"] = False


def _experts(m: Meta, cfg: dict) -> None:
    cfg["num_experts"] = m.int("expert_count")
    cfg["num_experts_per_tok"] = m.int("expert_used_count")
    if cfg["num_experts_per_tok"] > cfg["num_experts"]:
        m.refuse(f"expert_used_count {cfg['num_experts_per_tok']} is more than expert_count {cfg['num_experts']}")
    gating = m.value("expert_gating_func", 1)
    if gating != 1:   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
        m.refuse(f"expert gating function {m.shown(gating)} is not supported (softmax only)")
    if m.value("expert_weights_scale", 0.0) not in (0.0, 1.0):   # llama.cpp scales the weights where set
        m.refuse("expert_weights_scale other than 1 is not supported")


def _moe(m: Meta, cfg: dict) -> None:
    _experts(m, cfg)
    cfg["moe_intermediate_size"] = m.int("expert_feed_forward_length")


def _qwen2moe(m: Meta, cfg: dict) -> None:
    # llama.cpp (src/models/qwen2moe.cpp): top-k of the softmax, not renormalized; the shared expert is
    # scaled by sigmoid(ffn_gate_inp_shexp . x) -- as mlx-lm's qwen2_moe computes
    _moe(m, cfg)
    cfg["shared_expert_intermediate_size"] = m.int("expert_shared_feed_forward_length")
    _qwen2(m, cfg)


def _qwen3moe(m: Meta, cfg: dict) -> None:
    # llama.cpp (src/models/qwen3moe.cpp): every layer is MoE; top-k of the softmax, renormalized
    _moe(m, cfg)
    cfg.update(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)


def _olmoe(m: Meta, cfg: dict) -> None:
    # llama.cpp (src/models/olmoe.cpp): the experts are feed_forward_length wide; top-k of the softmax,
    # not renormalized
    _experts(m, cfg)
    cfg["moe_intermediate_size"] = cfg["intermediate_size"]
    cfg["norm_topk_prob"] = False
    _olmo2(m, cfg)


def _ernie4_5(m: Meta, cfg: dict) -> None:
    # llama.cpp reads optional q/k/v biases; mlx-lm's ernie4_5 has one use_bias for every projection
    if m.has("blk.0.attn_q.bias"):
        m.refuse("ernie4_5 with q/k/v biases is not supported (mlx-lm's ernie4_5 puts a bias on every "
                 "projection or none)")
    cfg["use_bias"] = False


def _phi2(m: Meta, cfg: dict) -> None:
    if m.has("blk.0.attn_qkv.weight"):
        m.refuse("phi2 with a fused attn_qkv is not supported (mlx-lm's phi holds q/k/v apart)")
    if "partial_rotary_factor" not in cfg:
        cfg["partial_rotary_factor"] = 1.0


def _smollm3(m: Meta, cfg: dict) -> None:
    cfg["no_rope_layer_interval"] = SMOLLM3_NO_ROPE_STEP
    _llama(m, cfg)


def _exaone(m: Meta, cfg: dict) -> None:
    cfg["attention_bias"] = m.has("blk.0.attn_q.bias")
    cfg["mlp_bias"] = m.has("blk.0.ffn_up.bias")
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        m.refuse("exaone with head_dim * heads != embedding_length is not supported")


ARCHS: dict[str, Arch] = {
    "llama": Arch("llama", LLAMA_LAYER, rope="norm", permuted=True, config=_llama,
                  refuses=("experts (Mixtral-style)",),
                  note="Q/K rows permuted by the converter; RoPE on adjacent pairs"),
    "qwen2": Arch("qwen2", LLAMA_LAYER, config=_qwen2, note="q/k/v biases",
                  refuses=("head dim x heads other than the width",)),
    "qwen3": Arch("qwen3", {**LLAMA_LAYER, **QK_NORM}, note="per-head q/k RMS norms"),
    "gemma3": Arch("gemma3_text", {**LLAMA_LAYER, **QK_NORM, "post_attention_norm": "post_attention_layernorm",
                                   "ffn_norm": "pre_feedforward_layernorm",
                                   "post_ffw_norm": "post_feedforward_layernorm"},
                   norm_plus_one=True, config=_gemma3, adjust=("gemma_embedding_scale", "ggml_gelu_gated"),
                   note="sliding-window layers (pattern 6); norms stored as 1 + w; sqrt(d) embedding scale"),
    "phi3": Arch("phi3", {"attn_norm": "input_layernorm", "attn_qkv": "self_attn.qkv_proj",
                          "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                          "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
                 width_heads=True, ffn_up_factor=2, config=_phi3, refuses=("separate attn_q/attn_k/attn_v",),
                 note="fused attn_qkv; ffn_up holds gate and up (SwiGLU on its halves)"),
    "olmo2": Arch("olmo2", {**LLAMA_LAYER, **QK_NORM, "post_attention_norm": "post_attention_layernorm",
                            "post_ffw_norm": "post_feedforward_layernorm"}, config=_olmo2,
                  note="norms after attention and FFN, none before; q/k RMS norms over all heads"),
    "granite": Arch("granite", LLAMA_LAYER, rope="norm", permuted=True, rope_arg=False, width_heads=True,
                    config=_granite, refuses=("experts (Granite MoE)", "no RoPE (rope.scaling.finetuned false)"),
                    note="embedding, residual, attention and logit multipliers; llama's Q/K permutation"),
    "stablelm": Arch("stablelm", LLAMA_LAYER, eps="layer", keys={"rms_norm_eps": "layer_norm_eps"},
                     width_heads=True, lm_head="untied", partial_rope=True, config=_stablelm,
                     refuses=("per-head q/k LayerNorms", "parallel residual (no ffn_norm)", "no output.weight"),
                     note="LayerNorm with bias; partial RoPE (rope.dimension_count of a head)"),
    "starcoder2": Arch("starcoder2", {**LLAMA_LAYER, "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"},
                       eps="layer", keys={"rms_norm_eps": "norm_epsilon"}, width_heads=True,
                       adjust=("ggml_gelu_mlp",),
                       note="LayerNorm with bias, biases on every projection, GELU MLP"),
    "qwen2moe": Arch("qwen2_moe", {**LLAMA_LAYER, **EXPERTS, "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
                                   "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                                   "ffn_up_shexp": "mlp.shared_expert.up_proj",
                                   "ffn_down_shexp": "mlp.shared_expert.down_proj"},
                     width_heads=True, lm_head="untied", config=_qwen2moe,
                     refuses=("expert gating other than softmax", "no output.weight"),
                     reshape={"ffn_gate_inp_shexp": (1, -1)},
                     note="experts (softmax top-k) and a shared expert behind a sigmoid gate"),
    "qwen3moe": Arch("qwen3_moe", {**LLAMA_LAYER, **QK_NORM, **EXPERTS}, config=_qwen3moe,
                     refuses=("expert gating other than softmax",),
                     note="experts (softmax top-k, renormalized); per-head q/k RMS norms"),
    "command-r": Arch("cohere", {k: v for k, v in LLAMA_LAYER.items() if k != "ffn_norm"}, rope="norm",
                      eps="layer", keys={"rms_norm_eps": "layer_norm_eps"}, width_heads=True, lm_head="tied",
                      config=_command_r, refuses=("q/k norms (Command R+)", "an output.weight of its own"),
                      note="attention and FFN in parallel from one LayerNorm (no bias); logit scale; "
                           "RoPE on adjacent pairs (no permutation)"),
    "smollm3": Arch("smollm3", LLAMA_LAYER, rope="norm", permuted=True, config=_smollm3,
                    note="no RoPE in every 4th layer; llama's Q/K permutation"),
    "olmoe": Arch("olmoe", {**LLAMA_LAYER, **QK_NORM, **EXPERTS}, config=_olmoe,
                  refuses=("expert gating other than softmax",),
                  note="experts of feed_forward_length (softmax top-k, not renormalized); q/k RMS norms over "
                       "all heads"),
    "ernie4_5": Arch("ernie4_5", LLAMA_LAYER, rope="norm", rope_arg=False, config=_ernie4_5,
                     refuses=("q/k/v biases",),
                     note="llama's tensors with RoPE on adjacent pairs and no permutation"),
    "phi2": Arch("phi", {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.dense", "ffn_up": "mlp.fc1",
                         "ffn_down": "mlp.fc2"},
                 glob={"token_embd": "model.embed_tokens", "output_norm": "model.final_layernorm",
                       "output": "lm_head"},
                 eps="layer", keys={"rms_norm_eps": "layer_norm_eps"}, width_heads=True, lm_head="untied",
                 partial_rope=True, adjust=("ggml_gelu_mlp",), config=_phi2,
                 refuses=("a fused attn_qkv", "no output.weight"),
                 note="attention and GELU MLP in parallel from one LayerNorm; biases everywhere, the output "
                      "head's too; partial RoPE"),
    "exaone": Arch("exaone", {"attn_norm": "ln_1", "attn_q": "attn.attention.q_proj",
                              "attn_k": "attn.attention.k_proj", "attn_v": "attn.attention.v_proj",
                              "attn_output": "attn.attention.out_proj", "ffn_norm": "ln_2",
                              "ffn_gate": "mlp.c_fc_0", "ffn_up": "mlp.c_fc_1", "ffn_down": "mlp.c_proj"},
                   glob={"token_embd": "transformer.wte", "output_norm": "transformer.ln_f", "output": "lm_head"},
                   layers="transformer.h", keys={"num_hidden_layers": "num_layers",
                                                 "rms_norm_eps": "layer_norm_epsilon"},
                   config=_exaone, refuses=("head dim x heads other than the width",), note="llama's tensors under other mlx-lm names; RoPE on pairs half a head apart"),
}
