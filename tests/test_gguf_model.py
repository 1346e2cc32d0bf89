"""GGUF -> mlx-lm model: hyper-parameters, Q/K layouts, F32 GGUF, and cross-runtime logits on
tiny synthetic models of every supported architecture (llama, qwen2, qwen3, gemma3).

The synthetic GGUFs carry a tiny byte-level vocabulary (llama.cpp insists on one) and random
float32 weights, so llama.cpp and MLX compute with identical values.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from tqbridge.bridge.mlx_blas import prefer_fast_blas

prefer_fast_blas()

from tqbridge.bridge.gguf.f32 import write_f32_gguf  # noqa: E402
from tqbridge.bridge.gguf.model import (  # noqa: E402
    GGUFModelError, load_gguf_model, model_config, qk_rows, read_gguf)
from tqbridge.bridge.gguf.mlx_export import write_mlx_dir  # noqa: E402

# llama.cpp (F32 KV, flash attention off) vs MLX (F32 cache) on identical F32 weights, logits with a
# standard deviation of ~12: measured max |delta logit| <= 5.4e-5 for llama/qwen2/qwen3 (float32
# reassociation) and 4.2e-4 for gemma3 (inputs that land on a neighbouring entry of ggml's fp16 GELU
# table). Without the GELU emulation gemma3 gives 3.9e-3, which this bound still rejects.
SYNTH_MAX_ABS = 2e-3
# The two Q/K layouts run different RoPE kernels and permuted matmul rows: float32 reassociation
# only (measured <= 6e-5 on SmolLM2's logits).
LAYOUT_MAX_ABS = 1e-3


N_VOCAB = 512


from tqbridge.bridge.gguf.fixtures import add_tiny_vocab  # noqa: E402


def write_synthetic(path, arch: str, *, n_layer=2, d=128, n_head=4, n_kv=2, head_dim=32, ff=192,
                    seed=0, qtype=None):
    """A tiny random model of ``arch`` in GGUF with float32 (or ``qtype``) weights."""
    rng = np.random.default_rng(seed)
    n_vocab = N_VOCAB
    w = gguf.GGUFWriter(str(path), arch)
    add_tiny_vocab(w, N_VOCAB)   # 512 tokens: enough for llama.cpp to load the model
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(16)

    def t(name, *shape, scale=None, offset=0.0):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        arr = (rng.standard_normal(shape) * s + offset).astype(np.float32)
        if qtype is not None and arr.ndim == 2 and arr.shape[-1] % 256 == 0:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)

    t("token_embd.weight", n_vocab, d, scale=1.0)
    t("output_norm.weight", d, scale=0.1, offset=1.0)
    for i in range(n_layer):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", d, scale=0.1, offset=1.0)
        t(b + "attn_q.weight", n_head * head_dim, d)
        t(b + "attn_k.weight", n_kv * head_dim, d)
        t(b + "attn_v.weight", n_kv * head_dim, d)
        t(b + "attn_output.weight", d, n_head * head_dim)
        t(b + "ffn_norm.weight", d, scale=0.1, offset=1.0)
        t(b + "ffn_gate.weight", ff, d)
        t(b + "ffn_up.weight", ff, d)
        t(b + "ffn_down.weight", d, ff)
        if arch == "qwen2":
            for n, rows in (("attn_q", n_head), ("attn_k", n_kv), ("attn_v", n_kv)):
                t(b + n + ".bias", rows * head_dim, scale=0.5)
        if arch in ("qwen3", "gemma3"):
            t(b + "attn_q_norm.weight", head_dim, scale=0.1, offset=1.0)
            t(b + "attn_k_norm.weight", head_dim, scale=0.1, offset=1.0)
        if arch == "gemma3":
            t(b + "post_attention_norm.weight", d, scale=0.1, offset=1.0)
            t(b + "post_ffw_norm.weight", d, scale=0.1, offset=1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SYNTH = {  # arch -> extra shape arguments (gemma3 needs >= 6 layers: its global layers are every 6th)
    "llama": {},
    "qwen2": {"head_dim": 32, "n_head": 4, "d": 128},
    "qwen3": {"head_dim": 64, "n_head": 4, "d": 128},
    "gemma3": {"n_layer": 6, "head_dim": 64},
}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    return {a: write_synthetic(d / f"{a}.gguf", a, **kw) for a, kw in SYNTH.items()}


@pytest.mark.parametrize("arch", list(SYNTH))
def test_synthetic_logits_match_llama_cpp(synth, arch):
    from tqbridge.parity.harness.metrics import compare_logits
    from tqbridge.parity.harness.runtimes import KV, LlamaCppRuntime, MLXRuntime

    tokens = list(np.random.default_rng(1).integers(0, N_VOCAB, size=40))
    ref = LlamaCppRuntime(synth[arch], flash_attn=False).logits(tokens, KV.parse("f32"))
    got = MLXRuntime(synth[arch]).logits(tokens, KV.parse("f32"))
    r = compare_logits(ref, got)
    print(arch, {k: v for k, v in r.items() if k != "kl_per_position"}, "logit std", float(ref.std()))
    assert ref.std() > 0.5  # the logits are not degenerate
    assert r["max_abs"] <= SYNTH_MAX_ABS
    assert r["top1"] == 1.0


def test_config_from_metadata(synth):
    c = read_gguf(synth["qwen3"])
    cfg = model_config(c)
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["head_dim"]) == ("qwen3", 128, 2, 64)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]) == (4, 2, 192)
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == N_VOCAB
    g = model_config(read_gguf(synth["gemma3"]))
    assert (g["model_type"], g["sliding_window"], g["query_pre_attn_scalar"]) == ("gemma3_text", 16, 64)


def test_qk_rows_undo_the_converter_permutation():
    # llama.cpp's converter (fact): per head, HF row s * d/2 + j goes to GGUF row 2 * j + s.
    n_head, d, cols = 3, 8, 5
    hf = np.arange(n_head * d * cols, dtype=np.float32).reshape(n_head * d, cols)
    gg = np.empty_like(hf)
    for h in range(n_head):
        for s in range(2):
            for j in range(d // 2):
                gg[h * d + 2 * j + s] = hf[h * d + s * d // 2 + j]
    assert np.array_equal(qk_rows(gg, n_head, "llama", "hf"), hf)
    assert np.array_equal(qk_rows(gg, n_head, "llama", "ggml"), gg)
    assert np.array_equal(qk_rows(gg, n_head, "qwen2", "hf"), gg)  # NEOX-RoPE families are not permuted
    bias = hf[:, 0].copy()
    assert np.array_equal(qk_rows(gg[:, 0].copy(), n_head, "llama", "hf"), bias)


def test_layouts_agree(synth):
    import mlx.core as mx

    ids = mx.array([[5, 90, 31, 400, 77, 12, 490, 3]])
    a = np.array(load_gguf_model(synth["llama"], layout="ggml")[0](ids))
    b = np.array(load_gguf_model(synth["llama"], layout="hf")[0](ids))
    assert np.abs(a - b).max() <= LAYOUT_MAX_ABS


def test_quantized_weights_dequantize_like_gguf_py(tmp_path):
    p = write_synthetic(tmp_path / "q.gguf", "llama", d=256, ff=256, n_head=4, head_dim=64,
                        qtype=gguf.GGMLQuantizationType.Q8_0)
    c = read_gguf(p)
    assert c.tensor_types["blk.0.attn_q.weight"] == "Q8_0"
    r = gguf.GGUFReader(p)
    raw = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
    want = gguf.quants.dequantize(raw.data, raw.tensor_type)
    assert np.array_equal(c.tensors["blk.0.ffn_up.weight"], want)
    # The F32 copy holds exactly these values, and every piece of metadata.
    f32 = write_f32_gguf(p, tmp_path / "q.f32.gguf")
    c2 = read_gguf(f32)
    assert all(t == "F32" for t in c2.tensor_types.values())
    for name, arr in c.tensors.items():
        assert np.array_equal(c2.tensors[name], arr), name
    keep = {k: v for k, v in c.metadata.items() if k != "general.file_type"}
    assert keep == {k: v for k, v in c2.metadata.items() if k != "general.file_type"}
    assert c2.metadata["general.file_type"] == 0


def test_refusals(tmp_path, synth):
    with pytest.raises(GGUFModelError, match="refusing to overwrite the input"):
        write_f32_gguf(synth["llama"], synth["llama"])
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(GGUFModelError, match="not a readable GGUF"):
        read_gguf(bad)
    # An architecture we do not build: the same file with another general.architecture.
    w = gguf.GGUFWriter(str(tmp_path / "bloom.gguf"), "bloom")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(GGUFModelError, match="architecture 'bloom' is not supported"):
        read_gguf(tmp_path / "bloom.gguf")
    out = tmp_path / "exists"
    out.mkdir()
    (out / "x").write_text("x")
    with pytest.raises(GGUFModelError, match="already exists"):
        write_mlx_dir(synth["llama"], out)


def test_mlx_dir_loads_in_mlx_lm(tmp_path, synth):
    import mlx.core as mx
    from mlx_lm.utils import load_model

    out = write_mlx_dir(synth["qwen2"], tmp_path / "qwen2-mlx")
    model, cfg = load_model(out)
    ids = mx.array([[1, 2, 3, 400, 500]])
    ref = np.array(load_gguf_model(synth["qwen2"])[0](ids))
    assert np.array_equal(np.array(model(ids)), ref)  # same layout, same weights: identical
