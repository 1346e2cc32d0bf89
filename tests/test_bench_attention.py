"""``tqbridge bench attention`` runs its steps end to end on the CPU emulator (the GPU timings are
measured on the H200 and recorded in BENCHMARKS.md; here: the command's logic, its keys, its
reference check, and its refusals)."""

import json

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from tqbridge.tools.cli import main  # noqa: E402

SMALL = ["bench", "attention", "--backend", "cpu-emulator", "--context", "96", "--layers", "2", "--repeats", "2",
         "--q-heads", "4", "--kv-heads", "2", "--head-dim", "128", "--tune", ""]


def test_both_regimes_and_the_cache_path(tmp_path):
    out = tmp_path / "bench.json"
    assert main(SMALL + ["--kernel", "auto,v2", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["backend"] == "cpu-emulator" and rep["regimes"] == ["fixed", "growing"]
    assert rep["device_time"].startswith("not measured")   # no GPU kernels on the emulator: said, not faked
    (row,) = rep["contexts"]
    for prefix in ("", "growing_"):
        for path in ("fused", "fused_v2", "sdpa_fp16", "dequant_sdpa", "mlx_lm_quantized_sdpa"):
            assert row[f"{prefix}{path}_us"] > 0 and 0 < row[f"{prefix}{path}_build_us"] <= row[f"{prefix}{path}_us"]
            # the host's share of the evaluation (mx.async_eval), inside each timed evaluation
            assert 0 <= row[f"{prefix}{path}_encode_us"] <= row[f"{prefix}{path}_us"]
        assert row[prefix + "best_fused"] in ("fused", "fused_v2", "cache_path")
        assert row[prefix + "speedup_vs_sdpa_fp16"] == pytest.approx(row[prefix + "sdpa_fp16_us"]
                                                                     / row[prefix + "best_fused_us"])
    assert row["growing_cache_path_us"] > 0 and row["cache_path_plan"]["backend"] == "cpu-emulator"
    # the growing regime also in a pipelined loop (the next evaluation submitted before waiting for the last)
    for path in ("fused", "cache_path", "sdpa_fp16"):
        assert row[f"growing_{path}_pipelined_us"] > 0 and f"{path}_pipelined_us" not in row
    assert row["growing_pipelined_speedup_vs_sdpa_fp16"] == pytest.approx(
        row["growing_sdpa_fp16_pipelined_us"] / row["growing_cache_path_pipelined_us"])
    assert "fused_v2_wrong" not in row and "cache_path_wrong" not in row
    assert row["fused_plan"]["kernel"] in ("v1", "v2", "v3") and row["fused_v2_plan"]["kernel"] == "v2"
    # the report says which v3 variant ran (chunks per step, copy ring, dynamic memory); v2 has none
    if row["fused_plan"]["kernel"] == "v3":
        assert {"chunks", "stages", "dyn_smem"} <= set(row["fused_plan"])
    assert not {"chunks", "stages"} & set(row["fused_v2_plan"])


def test_a_wrong_kernel_is_flagged_and_never_the_best(tmp_path, monkeypatch, capsys):
    """Plant a bug in the kernel path: the reference check must flag it and keep it out of the speed-ups."""
    from tqbridge.metal import attention

    real = attention.decode_attention

    def off_by_one_tenth(q, *a, backend="auto", **kw):
        out = real(q, *a, backend=backend, **kw)
        return out if backend == "reference" else out + 0.1

    monkeypatch.setattr(attention, "decode_attention", off_by_one_tenth)
    out = tmp_path / "bench.json"
    assert main(SMALL + ["--kernel", "v2", "--regime", "fixed", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    assert row["fused_wrong"] is True and row["fused_max_abs_diff_vs_reference"] >= 0.09
    assert "best_fused" not in row and "speedup_vs_sdpa_fp16" not in row
    assert "WARNING: fused differs from the reference path" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--regime", "warm"], "--regime"),
    (["--context", "3"], "--context"),
    (["--context", "4k"], "--context"),
    (["--kernel", "v9"], "--kernel"),
    (["--k-format", "q9_9"], "q9_9"),
    (["--head-dim", "64"], "block size 128"),    # turbo3 V: 128-value groups
])
def test_bad_arguments_are_refused_in_one_line(argv, says, capsys):
    assert main(SMALL + argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_failing_baseline_costs_only_its_own_numbers(tmp_path, monkeypatch):
    """MLX's CUDA quantized matmul refuses lengths off its tile sizes (measured on the H200): the bench
    records the error for that path and regime and keeps every other measurement."""
    import mlx_lm.models.base as base

    def refuses(*a, **kw):
        raise RuntimeError("[quantized_matmul] No implementation for problem shape")

    monkeypatch.setattr(base, "quantized_scaled_dot_product_attention", refuses)
    out = tmp_path / "bench.json"
    assert main(SMALL + ["--kernel", "v2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    for prefix in ("", "growing_"):
        assert "No implementation" in row[prefix + "mlx_lm_quantized_sdpa_error"]
        assert prefix + "speedup_vs_mlx_lm_quantized_sdpa" not in row
        assert row[prefix + "speedup_vs_sdpa_fp16"] > 0 and row[prefix + "dequant_sdpa_us"] > 0


def test_variants_are_timed_in_interleaved_rounds(tmp_path, monkeypatch):
    """--variants: each setting's cache path, then fp16 SDPA, in every round, within one process; the
    launch caches cleared before each variant (so its plan is made under its settings) and the
    settings restored after."""
    import os

    from tqbridge.metal import attention_kernel

    cleared = []
    real_clear = attention_kernel.clear_launch_caches
    monkeypatch.setattr(attention_kernel, "clear_launch_caches", lambda: (cleared.append(1), real_clear()))
    monkeypatch.delenv("TQBRIDGE_V3_DISPATCHES", raising=False)
    out = tmp_path / "bench.json"
    spec = "TQBRIDGE_Q_PRECISION=int8,TQBRIDGE_V3_DISPATCHES=1;TQBRIDGE_Q_PRECISION=int8"
    assert main(SMALL + ["--kernel", "auto", "--regime", "growing", "--variants", spec, "--variant-rounds", "2",
                         "--json", str(out)]) == 0
    assert "TQBRIDGE_V3_DISPATCHES" not in os.environ and os.environ.get("TQBRIDGE_Q_PRECISION") is None
    assert len(cleared) == 2 * 2 * 2   # both variants set something: cleared on entry and exit, each round
    (row,) = json.loads(out.read_text())["contexts"]
    order = [(r["variant"], r["round"]) for r in row["variants"]]
    assert order == [(0, 0), (1, 0), ("sdpa_fp16", 0), (0, 1), (1, 1), ("sdpa_fp16", 1)]
    for r in row["variants"]:
        assert r["wall_us"] > 0 and 0 < r["build_us"] <= r["wall_us"]
        if r["variant"] != "sdpa_fp16":
            assert r["plan"]["kernel"] == "v3" and r["plan"]["dispatches"] == (1 if r["variant"] == 0 else 2)
            assert r["wrong"] is False
    sd = {r["round"]: r["wall_us"] for r in row["variants"] if r["variant"] == "sdpa_fp16"}
    sdp = {r["round"]: r["pipelined_us"] for r in row["variants"] if r["variant"] == "sdpa_fp16"}
    for s in row["variant_summary"]:
        mine = [r for r in row["variants"] if r["variant"] == s["variant"]]
        assert s["vs_sdpa_fp16_median"] == pytest.approx(sum(sd[r["round"]] / r["wall_us"] for r in mine) / 2)
        assert s["pipelined_vs_sdpa_fp16_median"] == pytest.approx(
            sum(sdp[r["round"]] / r["pipelined_us"] for r in mine) / 2)
        assert s["device_us_median"] is None   # not measured on the emulator: said, not faked
        assert s["env"] == mine[0]["env"]


@pytest.mark.parametrize("argv, says", [
    (["--variants", "FOO=1;"], "TQBRIDGE_NAME=value"),
    (["--variants", "TQBRIDGE_V3_DISPATCHES"], "TQBRIDGE_NAME=value"),
    (["--variants", "TQBRIDGE_V3_DISPATCHES=1"], "at least two variants"),
    (["--variants", "TQBRIDGE_V3_DISPATCHES=1;", "--regime", "fixed"], "growing regime"),
    (["--variants", "TQBRIDGE_V3_DISPATCHES=1;", "--variant-rounds", "0"], "--variant-rounds"),
])
def test_bad_variants_are_refused_in_one_line(argv, says, capsys):
    assert main(SMALL + argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_settings_apply_restore_and_clear(monkeypatch):
    import os

    from tqbridge.metal import attention_kernel, kv_append, profiling

    cleared = []
    monkeypatch.setattr(attention_kernel, "clear_launch_caches", lambda: cleared.append("attention"))
    monkeypatch.setattr(kv_append.prepared, "cache_clear", lambda: cleared.append("append"))
    monkeypatch.setenv("TQBRIDGE_COMPILE", "1")
    monkeypatch.delenv("TQBRIDGE_V3_DISPATCHES", raising=False)
    with profiling.settings({"TQBRIDGE_COMPILE": "0", "TQBRIDGE_V3_DISPATCHES": "1"}):
        assert os.environ["TQBRIDGE_COMPILE"] == "0" and os.environ["TQBRIDGE_V3_DISPATCHES"] == "1"
        assert cleared == ["attention", "append"]
    assert os.environ["TQBRIDGE_COMPILE"] == "1" and "TQBRIDGE_V3_DISPATCHES" not in os.environ
    assert cleared == ["attention", "append"] * 2
    with profiling.settings({}):   # nothing set: nothing cleared
        pass
    assert len(cleared) == 4
    assert profiling.parse_settings(" TQBRIDGE_A=1 , TQBRIDGE_B_C=x") == {"TQBRIDGE_A": "1", "TQBRIDGE_B_C": "x"}
    assert profiling.parse_settings("") == {}
    for bad in ("A=1", "TQBRIDGE_A", "TQBRIDGE_=1", "TQBRIDGE_A-B=1"):
        with pytest.raises(profiling.SettingsError):
            profiling.parse_settings(bad)


def test_a_v3_plan_reports_its_variant(tmp_path):
    """bench attention's plan of a v3 run names the variant that ran: chunks per step, the copy ring's
    stages, the dynamic threadgroup memory (the emulator's plan: one chunk, 3 stages, static)."""
    out = tmp_path / "v3.json"
    assert main(SMALL + ["--kernel", "v3", "--regime", "fixed", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    plan = row["fused_plan"]
    assert plan["kernel"] == "v3" and (plan["chunks"], plan["stages"], plan["dyn_smem"]) == (1, 3, 0)
