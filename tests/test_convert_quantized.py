"""GGUF -> quantized MLX (``tqbridge convert MODEL.gguf --to mlx DIR``): every tensor that goes to MLX
affine blocks dequantizes (``mx.dequantize``) to gguf-py's float32 values, per ggml type; the converted
directories load in mlx-lm, stay near the GGUF's size and compute the float-converted model's logits.

gguf-py's ``gguf.quants`` is the oracle throughout (its dequantizers are the reference the float path
already uses). The tests on the real models are marked ``model``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tqbridge.bridge.mlx_blas import prefer_fast_blas

prefer_fast_blas()

mx = pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'tqbridge[mlx]')")
gguf = pytest.importorskip("gguf")

from tqbridge.bridge.blocks.format_types import FormatError  # noqa: E402
from tqbridge.bridge.gguf.mlx_quant import (  # noqa: E402
    PLACEMENTS, dequantize_mlx, placement, placement_table, same_bits, same_values, to_mlx_quantized,
)
from tqbridge.bridge.gguf.models import ModelUnavailable, gemma3_path, smollm2_path  # noqa: E402

QT = gguf.GGMLQuantizationType
AFFINE = [t for t, p in PLACEMENTS.items() if p.to == "affine"]
SYMMETRIC = ("Q8_0", "Q4_0", "Q5_0")     # d*(q - k): the one place a zero's sign can differ


def _oracle(type_name: str, blocks: np.ndarray, n: int) -> np.ndarray:
    return gguf.quants.dequantize(blocks, QT[type_name]).reshape(blocks.shape[0], n)


def _random_blocks(type_name: str, rows: int, n: int, seed: int) -> np.ndarray:
    """Random block bytes with every fp16 field (d, dmin / m) a finite value, negatives and subnormals
    included; everything else (codes, packed scales) uniformly random."""
    bs, ts = gguf.GGML_QUANT_SIZES[QT[type_name]]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(rows * n // bs, ts), dtype=np.uint8)
    fp16_fields = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2],
                   "Q4_K": [0, 2], "Q5_K": [0, 2]}[type_name]
    for off in fp16_fields:
        h = b[:, off:off + 2].copy().view("<u2")
        h &= np.uint16(0xBBFF)     # exponent at most 0b01110: finite, from subnormal up to 2**-1 * 1.999
        b[:, off:off + 2] = h.view(np.uint8)
    return b.reshape(rows, -1)


def _check(type_name: str, blocks: np.ndarray, n: int) -> None:
    w, s, b, g, bits = to_mlx_quantized(type_name, blocks, n)
    p = PLACEMENTS[type_name]
    assert (g, bits) == (p.group_size, p.bits)
    assert w.dtype == np.uint32 and s.dtype == np.float32 and b.dtype == np.float32
    got, ref = dequantize_mlx(w, s, b, g, bits), _oracle(type_name, blocks, n)
    assert np.array_equal(got, ref)                       # value for value
    if type_name in SYMMETRIC:
        # bit for bit except the sign of a zero: ggml's d*(q-k) is -0.0 for d < 0 at q = k,
        # MLX's d*q + (-k*d) is +0.0 there -- and nowhere else may the bits differ.
        differ = got.view(np.uint32) != ref.view(np.uint32)
        neg_zero = ref.view(np.uint32) == np.uint32(0x80000000)
        assert np.array_equal(differ, neg_zero & (got.view(np.uint32) == 0))
        assert same_values(got, ref)
    else:
        assert same_bits(got, ref)


@pytest.mark.parametrize("type_name", AFFINE)
def test_random_blocks_dequantize_to_gguf_py_values(type_name):
    """Random bytes cover what a quantizer never writes: negative d and dmin, subnormal scales, every
    6-bit sc/m pattern of the K-quants, every code."""
    n = 512
    _check(type_name, _random_blocks(type_name, 64, n, seed=len(type_name) * 7 + ord(type_name[1])), n)


@pytest.mark.parametrize("type_name", [t for t in AFFINE if not t.endswith("_K")])
def test_quantized_rows_dequantize_to_gguf_py_values(type_name):
    """Blocks as gguf-py's quantizer writes them (the K-quants have no quantizer in gguf-py)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 256)) * rng.uniform(1e-3, 10, (16, 1))).astype(np.float32)
    blocks = gguf.quants.quantize(x, QT[type_name])
    _check(type_name, blocks, 256)


def test_the_bit_order_is_mlx_s():
    """Codes packed by the K-quant path's packer (the one tqbridge.bridge.blocks.affine uses) come back out of
    mx.dequantize in order, for every bits value MLX accepts; under scale 1, bias 0 a group is its codes."""
    from tqbridge.bridge.blocks.affine import pack_codes

    rng = np.random.default_rng(0)
    for bits in (2, 3, 4, 5, 6, 8):
        codes = rng.integers(0, 2 ** bits, size=(8, 32), dtype=np.uint8)
        ones, zeros = mx.ones((8, 1)), mx.zeros((8, 1))
        got = mx.dequantize(mx.array(pack_codes(codes, bits)), ones, zeros, group_size=32, bits=bits)
        assert np.array_equal(np.array(got), codes.astype(np.float32)), bits


def test_other_types_stay_float32_with_a_reason():
    for t in ("Q6_K", "Q3_K", "Q2_K", "IQ4_NL", "F16", "BF16", "F32"):
        assert placement(t).to == "float32" and placement(t).how
        with pytest.raises(FormatError, match=f"{t} has no exact MLX affine form"):
            to_mlx_quantized(t, np.zeros((1, 210), np.uint8), 256)
    assert placement("NOT_A_TYPE").to == "float32"


def test_bad_blocks_are_refused_in_one_line():
    with pytest.raises(FormatError, match="row length 100"):
        to_mlx_quantized("Q4_K", np.zeros((1, 144), np.uint8), 100)
    with pytest.raises(FormatError, match="takes 144 bytes"):
        to_mlx_quantized("Q4_K", np.zeros((1, 140), np.uint8), 256)
    with pytest.raises(FormatError, match="uint8"):
        to_mlx_quantized("Q5_K", np.zeros((1, 176), np.float32), 256)


def test_docs_quote_the_table():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "conversions.md").read_text()
    assert placement_table() in doc


RECORD = "benchmarks/records/cpu/2026-12-03-convert-quantized.json"
_NAMES = {"smollm2": "SmolLM2-135M (Q4_1)", "gemma3": "Gemma 3 270M (Q4_K_M)"}


def test_docs_measured_table_is_the_record():
    """docs/conversions.md's measured table and reading quote the record (row per model, every cell)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "conversions.md").read_text()
    from tqbridge.tools.records import results

    rec = results(root / RECORD)
    assert RECORD in doc
    for model, v in rec["models"].items():
        q, f, mem = v["quantized"], v["float"], v["load_memory"]
        lq = v["logits"]["llama_vs_quantized"]
        assert v["logits"]["quantized_vs_float"]["max_abs"] == 0.0          # the "identical" cell
        assert v["logits"]["llama_vs_float"] == lq
        row = (f"| {_NAMES[model]} | {v['gguf_bytes'] / 1e6:.1f} | {q['dir_bytes'] / 1e6:.1f} ({q['dir_vs_gguf']:.2f}×) | "
               f"{f['dir_bytes'] / 1e6:.1f} ({f['dir_vs_gguf']:.2f}×) | "
               f"{mem['quantized']['peak_rss_mb']:.1f} / {mem['float']['peak_rss_mb']:.1f} / "
               f"{mem['baseline (imports only)']['peak_rss_mb']:.1f} | "
               f"{mem['quantized']['mlx_active_mb']:.1f} / {mem['float']['mlx_active_mb']:.1f} | "
               f"{lq['kl_mean']:.2e}, {100 * lq['top1']:.1f}% | identical |")
        assert doc.count(row) == 1, row
    s, g = rec["models"]["smollm2"], rec["models"]["gemma3"]
    flat = " ".join(doc.split())
    assert f"holds at {g['quantized']['dir_vs_gguf']:.2f}×" in flat
    assert g["quantized"]["dir_vs_gguf"] <= 1.5
    assert (f"takes {s['quantized']['wall_s']:.1f} s (SmolLM2) and {g['quantized']['wall_s']:.1f} s (Gemma 3) "
            f"quantized, {s['float']['wall_s']:.1f} s and {g['float']['wall_s']:.1f} s with") in flat


def test_cli_refuses_dequantize_for_gguf_f32(capsys):
    from tqbridge.tools.cli import main

    assert main(["convert", "x.gguf", "--to", "gguf-f32", "out.gguf", "--dequantize"]) != 0
    assert "--dequantize applies to --to mlx only" in capsys.readouterr().err


# ---- the real models -------------------------------------------------------------------------

def _model(fn):
    try:
        return fn()
    except ModelUnavailable as e:
        pytest.skip(str(e))


def _gguf_tensors(path):
    """name -> (type name, raw blocks (rows, row bytes), row length), read through tqbridge's validator
    (fast: gguf-py's reader parses every vocabulary string first)."""
    from tqbridge.bridge.gguf.io import validate

    info = validate(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for t in info.tensors:
        rows = t.n_elements // t.shape[0]
        out[t.name] = (t.type_name, mm[t.offset:t.offset + t.n_bytes].reshape(rows, -1), int(t.shape[0]))
    return out


def _check_directory(gguf_path, out, arch: str) -> dict:
    """Every tensor the directory holds as MLX blocks dequantizes to gguf-py's values; returns the
    count per ggml type."""
    from tqbridge.bridge.gguf.model import GGUFContents, mlx_name, mlx_rows

    cfg = json.loads((out / "config.json").read_text())
    weights = mx.load(str(out / "model.safetensors"))
    c = GGUFContents(gguf_path, arch, {}, {}, {})
    counts: dict[str, int] = {}
    for name, (type_name, blocks, n) in _gguf_tensors(gguf_path).items():
        target, kind = mlx_name(c, name)
        module = target[: -len(".weight")]
        if f"{module}.scales" not in weights:
            assert cfg["tqbridge"]["placed"][name] == f"{type_name} -> float32", name
            assert (placement(type_name).to == "float32" or blocks.shape[0] == 1       # or a 1-D tensor
                    or name in cfg["tqbridge"]["why_float32"]), name                    # or a reason of its own
            continue
        q = cfg["quantization"][module]
        got = dequantize_mlx(weights[f"{module}.weight"], weights[f"{module}.scales"], weights[f"{module}.biases"],
                             q["group_size"], q["bits"])
        ref = mlx_rows(c, cfg, kind, _oracle(type_name, np.asarray(blocks), n), "hf")
        assert same_values(got, ref), name
        if type_name not in SYMMETRIC:
            assert same_bits(got, ref), name
        counts[type_name] = counts.get(type_name, 0) + 1
    return counts


@pytest.mark.model
def test_smollm2_quantized_directory(tmp_path):
    """SmolLM2 (Q4_1, token embedding Q8_0): `convert` quantizes by default; mlx_lm.load takes the
    directory (tokenizer included); its logits are the float model's: the same model with its layers
    dequantized by mlx-lm, whose weights the directory check has just shown to be gguf-py's, i.e. the
    `--dequantize` model's (the synthetic test compares with that one directly)."""
    import mlx_lm
    from mlx_lm.utils import dequantize_model, load_model

    from tqbridge.parity.harness.metrics import compare_logits
    from tqbridge.tools.cli import main

    src = _model(smollm2_path)
    out = tmp_path / "smollm2-q"
    assert main(["convert", str(src), "--to", "mlx", str(out)]) == 0
    counts = _check_directory(src, out, "llama")
    assert counts == {"Q4_1": 210, "Q8_0": 1}
    size = sum(f.stat().st_size for f in out.iterdir())
    assert size <= 1.5 * src.stat().st_size, (size, src.stat().st_size)
    model, tok = mlx_lm.load(str(out))
    assert type(model.model.layers[0].mlp.down_proj).__name__ == "QuantizedLinear"
    assert type(model.model.embed_tokens).__name__ == "QuantizedEmbedding"
    x = mx.array([tok.encode("The converted directory loads as any quantized mlx-lm model does.")[:32]])
    ref = np.array(dequantize_model(load_model(out)[0])(x)[0])
    m = compare_logits(ref, np.array(model(x)[0]))
    print(f"smollm2 quantized vs float: kl_mean {m['kl_mean']:.3g}, max |d logit| {m['max_abs']:.3g}, "
          f"{size / src.stat().st_size:.2f}x the GGUF")
    assert m["kl_mean"] <= 1e-6 and m["top1"] == 1.0


@pytest.mark.model
def test_gemma3_quantized_directory(tmp_path):
    """The issue's target: Gemma 3 270M Q4_K_M -> a quantized MLX directory at most 1.5x the GGUF,
    which mlx-lm's loader builds with quantized layers, whose MLX blocks all dequantize to gguf-py's
    values (Q8_0, Q5_0, Q4_K); Q6_K stays float32. mlx_lm.load takes it, tokenizer included: its ids
    are llama.cpp's (text the export did not check, a chat turn), and greedy generation through mlx-lm
    gives the tokens tqbridge's own path gives (the GGUF model, llama.cpp's tokenizer)."""
    import mlx_lm
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from tqbridge.bridge.evaluation_text import evaluation_text
    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir
    from tqbridge.bridge.gguf.tokenizer import ChatTokenizer
    from tqbridge.tools.cmd_generate import generate_tokens

    src = _model(gemma3_path)
    out = write_mlx_dir(src, tmp_path / "gemma3-q", quantize=True)
    size = sum(f.stat().st_size for f in out.iterdir())   # tokenizer.json included (12 MB)
    assert size <= 1.5 * src.stat().st_size, (size, src.stat().st_size)
    counts = _check_directory(src, out, "gemma3")
    assert counts == {"Q8_0": 10, "Q5_0": 81, "Q4_K": 27}
    cfg = json.loads((out / "config.json").read_text())
    assert set(cfg["tqbridge"]["why_float32"]) == {"F32", "Q6_K"}
    assert cfg["tqbridge"]["tokenizer_note"].startswith("tokenizer.json rebuilt from the GGUF (SentencePiece BPE)")
    model, tok = mlx_lm.load(str(out))
    assert type(model.model.layers[0].self_attn.o_proj).__name__ == "QuantizedLinear"
    assert type(model.model.layers[0].mlp.down_proj).__name__ == "Linear"      # Q6_K: float32
    assert type(model.model.embed_tokens).__name__ == "QuantizedEmbedding"      # tied: the output head too
    ref = ChatTokenizer(src)   # what `tqbridge generate` encodes with: llama.cpp, special text parsed
    held_out = evaluation_text()[0][20000:60000]
    prompt = "<start_of_turn>user\nWhat does the assert statement do?<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode(held_out) == ref.encode(held_out)
    ids = tok.encode(prompt)
    assert ids == ref.encode(prompt) and ids[:2] == [2, 105]   # <bos> <start_of_turn>
    n = 8
    theirs = [int(t) for t, _ in zip((y for y, _ in generate_step(mx.array(ids), model, max_tokens=n)), range(n))]
    own, _ = load_gguf_model(src)
    ours = list(generate_tokens(own, ids, make_prompt_cache(own), n))
    print(f"gemma3 greedy: mlx_lm.load {theirs}, tqbridge {ours}: {tok.decode(ours)!r}")
    assert theirs == ours


# ---- a synthetic model: every affine type, a float-only type, and a block no triplet reproduces -----

def _small_blocks(type_name: str, rows: int, n: int, seed: int) -> np.ndarray:
    """Random blocks whose fp16 scale fields are small positive or negative values (a usable model)."""
    b = _random_blocks(type_name, rows, n, seed)
    bs, ts = gguf.GGML_QUANT_SIZES[QT[type_name]]
    blocks = b.reshape(-1, ts)
    rng = np.random.default_rng(seed + 1)
    for off in ((0, 2) if type_name in ("Q4_K", "Q5_K", "Q4_1", "Q5_1") else (0,)):
        v = (rng.uniform(0.002, 0.01, blocks.shape[0]) * rng.choice([-1, 1], blocks.shape[0])).astype(np.float16)
        blocks[:, off:off + 2] = v.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _write_mixed_llama(path, poison: bool = False):
    from tqbridge.bridge.gguf.fixtures import add_tiny_vocab

    d, n_head, n_kv, hd, ff, n_vocab = 256, 4, 2, 64, 512, 512
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    add_tiny_vocab(w, n_vocab)
    for f, v in (("add_context_length", 256), ("add_embedding_length", d), ("add_block_count", 1),
                 ("add_feed_forward_length", ff), ("add_head_count", n_head), ("add_head_count_kv", n_kv),
                 ("add_key_length", hd), ("add_value_length", hd), ("add_layer_norm_rms_eps", 1e-6),
                 ("add_rope_freq_base", 10000.0), ("add_rope_dimension_count", hd)):
        getattr(w, f)(v)
    kinds = {"attn_q": ("Q4_K", n_head * hd, d), "attn_k": ("Q5_K", n_kv * hd, d), "attn_v": ("Q4_0", n_kv * hd, d),
             "attn_output": ("Q5_1", d, n_head * hd), "ffn_gate": ("Q4_1", ff, d), "ffn_up": ("F16", ff, d),
             "ffn_down": ("Q5_0", d, ff)}
    emb = _small_blocks("Q8_0", n_vocab, d, 1)
    w.add_tensor("token_embd.weight", emb, raw_dtype=QT.Q8_0)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    for i, (kind, (t, rows, n)) in enumerate(kinds.items()):
        if t == "F16":
            w.add_tensor(f"blk.0.{kind}.weight", (0.05 * rng.standard_normal((rows, n))).astype(np.float16))
            continue
        blocks = _small_blocks(t, rows, n, 10 + i)
        if poison and kind == "attn_v":   # one block's d is -inf: ggml gives +-inf where scale*q + bias is NaN
            blocks[3, 0:2] = np.array([np.float16(-np.inf)]).view(np.uint8)
        w.add_tensor(f"blk.0.{kind}.weight", blocks, raw_dtype=QT[t])
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def test_mixed_synthetic_model(tmp_path):
    """A llama (Q/K rows permuted to Hugging Face order, quantized codes and scales alike) with Q8_0,
    Q4_K, Q5_K, Q4_0, Q5_1, Q4_1, Q5_0 and an F16 weight: every affine tensor converts exactly, the F16
    one stays float32, and mlx-lm's model of the directory computes the float model's logits."""
    from mlx_lm.utils import load_model

    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir
    from tqbridge.parity.harness.metrics import compare_logits

    src = _write_mixed_llama(tmp_path / "mixed.gguf")
    out = write_mlx_dir(src, tmp_path / "mixed-mlx", quantize=True)
    counts = _check_directory(src, out, "llama")
    assert counts == {"Q8_0": 1, "Q4_K": 1, "Q5_K": 1, "Q4_0": 1, "Q5_1": 1, "Q4_1": 1, "Q5_0": 1}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["model.layers.0.mlp.up_proj"] is False
    assert set(cfg["tqbridge"]["why_float32"]) == {"F32", "F16"}
    model, _ = load_model(out)
    ids = mx.array([[1, 5, 77, 300, 2, 9, 411, 18]])
    want = np.array(load_gguf_model(src, layout="hf")[0](ids)[0])
    m = compare_logits(want, np.array(model(ids)[0]))
    assert np.isfinite(want).all() and want.std() > 0.1
    assert m["kl_mean"] <= 1e-6 and m["top1"] == 1.0, m


def test_a_tensor_no_triplet_reproduces_stays_float32(tmp_path):
    """An infinite d in a Q4_0 block: ggml decodes +-inf, MLX's scale*code + bias would give NaN. The
    tensor stays float32 and config.json says why, by name; the other tensors are unaffected."""
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir

    src = _write_mixed_llama(tmp_path / "poisoned.gguf", poison=True)
    with np.errstate(invalid="ignore"):
        out = write_mlx_dir(src, tmp_path / "poisoned-mlx", quantize=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tqbridge"]["placed"]["blk.0.attn_v.weight"] == "Q4_0 -> float32"
    assert "infinite d" in cfg["tqbridge"]["why_float32"]["blk.0.attn_v.weight"]
    assert cfg["quantization"]["model.layers.0.self_attn.v_proj"] is False
    assert cfg["tqbridge"]["placed"]["blk.0.attn_q.weight"] == "Q4_K -> affine 4-bit, group 32"
    v = mx.load(str(out / "model.safetensors"))["model.layers.0.self_attn.v_proj.weight"]
    assert v.dtype == mx.float32 and bool(mx.isinf(v).any())
