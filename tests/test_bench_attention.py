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
    assert main(SMALL + ["--kernel", "auto,tiles", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["backend"] == "cpu-emulator" and rep["regimes"] == ["fixed", "growing"]
    assert rep["device_time"].startswith("not measured")   # no GPU kernels on the emulator: said, not faked
    (row,) = rep["contexts"]
    for prefix in ("", "growing_"):
        for path in ("fused", "fused_tiles", "sdpa_fp16", "dequant_sdpa", "mlx_lm_quantized_sdpa"):
            assert row[f"{prefix}{path}_us"] > 0 and 0 < row[f"{prefix}{path}_build_us"] <= row[f"{prefix}{path}_us"]
            # the host's share of the evaluation (mx.async_eval), inside each timed evaluation
            assert 0 <= row[f"{prefix}{path}_encode_us"] <= row[f"{prefix}{path}_us"]
        assert row[prefix + "best_fused"] in ("fused", "fused_tiles", "cache_path")
        assert row[prefix + "speedup_vs_sdpa_fp16"] == pytest.approx(row[prefix + "sdpa_fp16_us"]
                                                                     / row[prefix + "best_fused_us"])
    assert row["growing_cache_path_us"] > 0 and row["cache_path_plan"]["backend"] == "cpu-emulator"
    # the growing regime also in a pipelined loop (the next evaluation submitted before waiting for the last)
    for path in ("fused", "cache_path", "sdpa_fp16"):
        assert row[f"growing_{path}_pipelined_us"] > 0 and f"{path}_pipelined_us" not in row
    assert row["growing_pipelined_speedup_vs_sdpa_fp16"] == pytest.approx(
        row["growing_sdpa_fp16_pipelined_us"] / row["growing_cache_path_pipelined_us"])
    assert "fused_tiles_wrong" not in row and "cache_path_wrong" not in row
    assert row["fused_plan"]["kernel"] in ("lanes", "tiles", "int8-mma") and row["fused_tiles_plan"]["kernel"] == "tiles"
    # the report says which int8-mma variant ran (chunks per step, copy ring, dynamic memory); tiles has none
    if row["fused_plan"]["kernel"] == "int8-mma":
        assert {"chunks", "stages", "dyn_smem"} <= set(row["fused_plan"])
    assert not {"chunks", "stages"} & set(row["fused_tiles_plan"])


def test_a_wrong_kernel_is_flagged_and_never_the_best(tmp_path, monkeypatch, capsys):
    """Plant a bug in the kernel path: the reference check must flag it and keep it out of the speed-ups."""
    from tqbridge.metal import attention

    real = attention.decode_attention

    def off_by_one_tenth(q, *a, backend="auto", **kw):
        out = real(q, *a, backend=backend, **kw)
        return out if backend == "reference" else out + 0.1

    monkeypatch.setattr(attention, "decode_attention", off_by_one_tenth)
    out = tmp_path / "bench.json"
    assert main(SMALL + ["--kernel", "tiles", "--regime", "fixed", "--json", str(out)]) == 0
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
    (["--head-dim", "0"], "positive integer"),
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
    assert main(SMALL + ["--kernel", "tiles", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    for prefix in ("", "growing_"):
        assert "No implementation" in row[prefix + "mlx_lm_quantized_sdpa_error"]
        assert prefix + "speedup_vs_mlx_lm_quantized_sdpa" not in row
        assert row[prefix + "speedup_vs_sdpa_fp16"] > 0 and row[prefix + "dequant_sdpa_us"] > 0


def test_variants_are_timed_in_interleaved_rounds(tmp_path):
    """--variants: each variant's cache path (its plan and launch made with its decode options), then fp16
    SDPA, in every round, within one process."""
    out = tmp_path / "bench.json"
    spec = "q_precision=int8,chunks=2;q_precision=int8"
    assert main(SMALL + ["--kernel", "auto", "--regime", "growing", "--variants", spec, "--variant-rounds", "2",
                         "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    order = [(r["variant"], r["round"]) for r in row["variants"]]
    assert order == [(0, 0), (1, 0), ("sdpa_fp16", 0), (0, 1), (1, 1), ("sdpa_fp16", 1)]
    for r in row["variants"]:
        assert r["wall_us"] > 0 and 0 < r["build_us"] <= r["wall_us"]
        if r["variant"] != "sdpa_fp16":
            assert r["plan"]["kernel"] == "int8-mma" and r["plan"]["chunks"] == (2 if r["variant"] == 0 else 1)
            assert r["options"] == ("q_precision=int8,chunks=2" if r["variant"] == 0 else "q_precision=int8")
            assert r["wrong"] is False
    sd = {r["round"]: r["wall_us"] for r in row["variants"] if r["variant"] == "sdpa_fp16"}
    sdp = {r["round"]: r["pipelined_us"] for r in row["variants"] if r["variant"] == "sdpa_fp16"}
    for s in row["variant_summary"]:
        mine = [r for r in row["variants"] if r["variant"] == s["variant"]]
        assert s["vs_sdpa_fp16_median"] == pytest.approx(sum(sd[r["round"]] / r["wall_us"] for r in mine) / 2)
        assert s["pipelined_vs_sdpa_fp16_median"] == pytest.approx(
            sum(sdp[r["round"]] / r["pipelined_us"] for r in mine) / 2)
        assert s["device_us_median"] is None   # not measured on the emulator: said, not faked
        assert s["options"] == mine[0]["options"]


@pytest.mark.parametrize("argv, says", [
    (["--variants", "FOO=1;"], "not a decode option"),
    (["--variants", "chunks"], "not a decode option"),
    (["--variants", "chunks=3;"], "chunks must be one of 1, 2"),
    (["--variants", "compile=yes;"], "compile=\'yes\': 0 or 1"),
    (["--variants", "chunks=1"], "at least two variants"),
    (["--variants", "chunks=1;", "--regime", "fixed"], "growing regime"),
    (["--variants", "chunks=1;", "--variant-rounds", "0"], "--variant-rounds"),
])
def test_bad_variants_are_refused_in_one_line(argv, says, capsys):
    assert main(SMALL + argv) == 2
    err = capsys.readouterr().err
    assert says.replace("\\", "") in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_decode_options_parse_and_label_round_trip():
    from tqbridge.metal import profiling
    from tqbridge.metal.decode_options import DecodeOptions

    opts = profiling.parse_options(" chunks=1 , compile=0,v_decode=generic")
    assert opts == DecodeOptions(chunks=1, compile=False, v_decode="generic")
    assert DecodeOptions.parse(opts.label()) == opts and profiling.parse_options("") == DecodeOptions()
    assert profiling.split_options("q8_0/turbo3{device_params=0}") == ("q8_0/turbo3", DecodeOptions(device_params=False))
    assert profiling.split_options("q8_0/turbo3") == ("q8_0/turbo3", DecodeOptions())
    for bad in ("A=1", "chunks", "chunks=1,chunks=2", "target_groups=-3", "v_decode=fastest"):
        with pytest.raises(profiling.SettingsError):
            profiling.parse_options(bad)


def test_an_int8_mma_plan_reports_its_variant(tmp_path):
    """bench attention's plan of an int8-mma run names the variant that ran: chunks per step, the copy ring's
    stages, the dynamic threadgroup memory (the emulator's plan: one chunk, 3 stages, static)."""
    out = tmp_path / "int8-mma.json"
    assert main(SMALL + ["--kernel", "int8-mma", "--regime", "fixed", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    plan = row["fused_plan"]
    assert plan["kernel"] == "int8-mma" and (plan["chunks"], plan["stages"], plan["dyn_smem"]) == (1, 3, 0)


def test_head_dim_64_turbo_rows_are_padded_as_the_cache_stores_them(tmp_path):
    """turbo3 V at head dim 64: rows zero-padded to one 128-value block, as TQCache stores them; the
    kernel checks against the reference on those rows and the bytes read count the padded rows."""
    from tqbridge.bridge import get_format

    out = tmp_path / "bench.json"
    argv = [a if a != "128" else "64" for a in SMALL]
    assert main(argv + ["--kernel", "auto", "--regime", "growing", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    assert not row.get("cache_path_wrong") and not row.get("fused_wrong")
    k_row, v_row = get_format("q8_0").row_bytes(64), get_format("turbo3").row_bytes(128)
    assert row["kernel_bytes"] == 2 * 96 * (k_row + v_row)   # kv heads x context x padded row bytes


def test_tune_takes_int8_mma_chunks(tmp_path):
    """``--tune int8-mma:WARPSxTILExCHUNKS`` times int8-mma with that many 16-key chunks per step (the wide-row
    plan's one chunk in 4 SIMD groups, against two in 2), each configuration's plan saying what ran."""
    out = tmp_path / "bench.json"
    args = [a if a != "" else "int8-mma:2x64x1,int8-mma:1x64x2" for a in SMALL]
    assert main(args + ["--kernel", "int8-mma", "--regime", "fixed", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["contexts"]
    assert (row["fused_int8-mma_2x64x1_plan"]["warps"], row["fused_int8-mma_2x64x1_plan"]["chunks"]) == (2, 1)
    assert (row["fused_int8-mma_1x64x2_plan"]["warps"], row["fused_int8-mma_1x64x2_plan"]["chunks"]) == (1, 2)
    assert row["fused_int8-mma_2x64x1_us"] > 0 and "fused_int8-mma_2x64x1_wrong" not in row
