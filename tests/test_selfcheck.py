import json

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge.llama import ggml_c
from tqbridge.tools.cli import main

if not ggml_c.available():  # pragma: no cover - depends on the install
    pytest.skip("ggml's C library (llama-cpp-python) is not installed", allow_module_level=True)


def test_selfcheck_passes_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sc.json"
    rc = main(["selfcheck", "--rows-per-family", "3", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert text.strip().splitlines()[-1].startswith("selfcheck passed: 9 formats byte-identical")
    doc = json.loads(out.read_text())
    assert doc["ok"] is True
    assert [r["format"] for r in doc["results"]] == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]
    assert all(r["rows"] == 27 and r["numpy_equal_c"] for r in doc["results"])


def test_selfcheck_reports_a_mismatch(monkeypatch, capsys):
    real = bridge.quantize

    def off_by_one_bit(fmt, x):
        b = real(fmt, x).copy()
        b[..., -1] ^= 1
        return b

    monkeypatch.setattr(bridge, "quantize", off_by_one_bit)
    rc = main(["selfcheck", "--formats", "q4_0,q8_0", "--rows-per-family", "2"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "selfcheck FAILED: differs from ggml's C code in q4_0 (numpy), q8_0 (numpy)" in text


def test_selfcheck_bad_format_is_one_line(capsys):
    assert main(["selfcheck", "--formats", "q9_9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown format 'q9_9'" in err[0]


def test_mlx_column_matches(capsys):
    pytest.importorskip("mlx.core", reason="MLX is not installed")
    assert main(["selfcheck", "--formats", "iq4_nl", "--rows-per-family", "2"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("iq4_nl")][0].split()
    assert row[:5] == ["iq4_nl", "18", str(18 * 4 * 18), "yes", "yes"]
    assert np.isfinite(float(row[5]))
