"""``tqbridge bench serve`` on the CPU: a tiny geometry, B = 1 and 2, a short context. The real numbers
come from a GPU record; here: it runs through mlx-lm's BatchGenerator with each cache's batch class,
and its JSON holds every field, measured."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from tqbridge.tools.cli import main  # noqa: E402


def test_bench_serve_smoke(tmp_path, capsys):
    out = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--models", "tiny", "--contexts", "64", "--batches", "1,2", "--tokens", "3",
               "--rounds", "2", "--dtype", "float32", "--budget-gb", "0.01", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["command"].startswith("tqbridge bench serve --models tiny --contexts 64 --batches 1,2")
    runs = {(r["cache"], r["batch"]): r for r in rec["runs"]}
    assert set(runs) == {(c, b) for c in ("fp16", "q8_0/turbo3", "q8_0/q4_0") for b in (1, 2)}
    for (cache, b), r in runs.items():
        assert "error" not in r, r
        assert r["batch_cache"] == ("BatchKVCache" if cache == "fp16" else "BatchTQCache")
        # the batch's paths (on the CPU: the dequantized rows through MLX's attention), counted per layer (4)
        # over the 3 timed steps, the 2 warm-up steps and the first (which merges the caches)
        assert cache == "fp16" or f"decode:dequant-sdpa x{4 * (3 + 2 + 1)}" in r["paths"], r.get("paths")
        assert len(r["step_ms_rounds"]) == 2 and r["tokens_per_s"] == pytest.approx(b * 1e3 / r["step_ms"])
        assert 0 < r["decode_peak_bytes"] <= r["run_peak_bytes"]
        assert r["batch_kv_bytes"] >= b * r["kv_bytes_per_sequence"] * 0.5 and r["tokens_per_s_vs_fp16"] > 0
    budgets = {b["cache"]: b for b in rec["budgets"]}
    for cache, b in budgets.items():
        assert b["budget_bytes"] == 10**7 and b["sequences_in_budget"] == 10**7 // b["kv_bytes_per_sequence"]
    # measured from the caches' bytes: the quantized pairs hold fewer bytes per sequence, so more sequences
    assert budgets["q8_0/turbo3"]["kv_bytes_per_sequence"] < budgets["fp16"]["kv_bytes_per_sequence"] / 2
    assert budgets["q8_0/q4_0"]["sequences_vs_fp16"] > 2
    assert all(json.loads(line) for line in capsys.readouterr().out.splitlines())


def test_a_run_that_does_not_fit_the_device_says_so(tmp_path):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--models", "tiny", "--contexts", "64", "--batches", "2", "--tokens", "2",
                 "--rounds", "1", "--dtype", "float32", "--caches", "fp16,q8_0/turbo3", "--memory-gb", "0.001",
                 "--json", str(out)]) == 0
    for r in json.loads(out.read_text())["runs"]:
        assert r["error"].startswith("not run: 2 sequences need about"), r


def test_bench_serve_takes_decode_options_and_per_layer_pairs(tmp_path):
    """A TQCache spelling with decode options in braces (the A/B of a decode option under batches) and one with
    per-layer pairs (its commas inside brackets) run as their own caches."""
    out = tmp_path / "serve.json"
    kinds = ["fp16", "q8_0/turbo3{fold_append=0}", "q8_0/turbo3[0,-1=q8_0/q8_0]"]
    assert main(["bench", "serve", "--models", "tiny", "--contexts", "64", "--batches", "2", "--tokens", "2",
                 "--rounds", "1", "--dtype", "float32", "--caches", ",".join(kinds), "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["cache"] for r in runs] == kinds and not any("error" in r for r in runs), runs


@pytest.mark.parametrize("args,says", [
    (["--caches", "fp16,fp16{fold_append=0}"], "decode options apply to TQCache"),
    (["--caches", "fp16,q8_0/turbo3{nope=1}"], "nope"),
    (["--caches", "q8_0/turbo3"], "fp16 first"),
    (["--caches", "fp16,q8_0/nope"], "nope"),
    (["--batches", "0"], "positive"),
    (["--contexts", "x"], "lists of integers"),
])
def test_bench_serve_refuses_bad_options_in_one_line(args, says, capsys):
    assert main(["bench", "serve", "--models", "tiny", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
