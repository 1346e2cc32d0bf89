"""`tqbridge parity --levels`: the cheap levels end to end through the command line."""

import json

import pytest

from tqbridge.tools.cli import main

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")


def test_blocks_and_attention_levels_write_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main(["parity", "smollm2", "--levels", "blocks,attention", "--kv", "q8_0/q4_0", "--quiet",
               "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["passed"] is True
    assert report["levels"] == ["blocks", "attention"] and "logits" not in report
    formats = {e["format"] for e in report["blocks"]["formats"]}
    assert {"q8_0", "q4_0", "iq4_nl"} <= formats
    assert all(all(e["equal"].values()) and "kernel:cpu-emulator" in e["equal"] for e in report["blocks"]["formats"])
    assert report["attention"]["cases"] and report["attention"]["passed"] is True
    assert "blocks: identical" in capsys.readouterr().out


def test_unknown_level_is_a_one_line_error(capsys):
    assert main(["parity", "smollm2", "--levels", "blocks,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown level(s) nope" in err[0]


def test_cache_plot_from_a_cache_report(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from tqbridge.parity.harness.report import plot_cache_layers

    layers = [{"k": {"share_blocks": s}, "v": {"share_blocks": s / 2}} for s in (0.0, 0.3, 0.9)]
    png = plot_cache_layers(tmp_path / "c.png", {"cache": {"kv": [{"kv": "q8_0/q4_0", "layers": layers}]}})
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_cache_layers(tmp_path / "none.png", {"cache": {"kv": [{"kv": "q8_0"}]}}) is None


def test_teacher_level_through_the_command_line(tmp_path, capsys):
    # real model (SmolLM2, F32 copy): 24 tokens, 2 decode steps, one K/V pair; ~6 s on 2 cores
    pytest.importorskip("mlx.core", reason="MLX is not installed")
    out = tmp_path / "t.json"
    rc = main(["parity", "smollm2", "--levels", "teacher", "--kv", "q8_0/q4_0", "--tokens", "24",
               "--decode", "2", "--quiet", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["passed"] is True and report["verdicts"] == [{"level": "teacher", "passed": True}]
    t = report["teacher"]
    assert t["tokens"] == 24 and t["decode"] == 2 and len(t["kv"][0]["layers"]) == 30
    assert t["backends"] == ["reference", "cpu-emulator"]
    text = capsys.readouterr().out
    assert "teacher: every layer holds" in text and text.rstrip().splitlines()[-1] == "all claims hold: teacher"


def test_lane_level_through_the_command_line(tmp_path, capsys):
    # real model (SmolLM2, F32 copy): the GPU decode lane on the CPU emulator, 16-token prompt and
    # 12 decode steps with a forced window of 16 on the even layers; ~10 s on 2 cores
    pytest.importorskip("mlx.core", reason="MLX is not installed")
    out = tmp_path / "l.json"
    rc = main(["parity", "smollm2", "--levels", "lane", "--kv", "f16", "--kv", "q8_0/q4_0", "--quiet",
               "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["passed"] is True and report["verdicts"] == [{"level": "lane", "passed": True}]
    lane = report["lane"]
    assert lane["kv"] == "q8_0/q4_0"                      # the first quantized pair, as the cache level
    assert lane["path"].startswith("emulated GPU lane") and lane["paths"]["decode:cpu-emulator"] == 30 * 12
    assert lane["prompt"] == 16 and lane["decode"] == 12 and lane["slides"] == 45 and len(lane["layers"]) == 30
    text = capsys.readouterr().out
    assert "lane: every layer and decode step holds" in text and "emulated GPU lane" in text
    assert text.rstrip().splitlines()[-1] == "all claims hold: lane"
