"""The slow-BLAS notice (bridge/mlx_blas.py): MLX CPU model work on the mlx wheel's bundled reference
BLAS says so once per process on stderr, with the one-line fix; silent with OpenBLAS, on a GPU device,
or with TQBRIDGE_BLAS=bundled. Checked in-process through the model builder and end to end through a
CLI in a subprocess (OpenBLAS made unloadable with TQBRIDGE_OPENBLAS)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from tqbridge.bridge import mlx_blas  # noqa: E402

NOTICE = "tqbridge: note: MLX runs this model on the CPU with the mlx wheel's bundled reference BLAS"
FIX = "sudo apt-get install libopenblas0-pthread"
NONE = "no libopenblas.so.0 found, nor the cmeel-openblas wheel"  # what _find_openblas says then


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not chosen its BLAS yet, nor printed the notice, on the CPU device."""
    monkeypatch.setattr(mlx_blas, "_state", None)
    monkeypatch.setattr(mlx_blas, "_noticed", False)
    monkeypatch.setattr(mlx_blas, "_on_cpu", lambda: True)
    monkeypatch.delenv("TQBRIDGE_BLAS", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from test_gguf_model import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("blas") / "llama.gguf", "llama")


def test_notice_once_when_openblas_is_missing(fresh, synth, capsys):
    from tqbridge.bridge.gguf.model import load_gguf_model

    fresh.setattr(mlx_blas, "_find_openblas", lambda: ([], NONE))
    load_gguf_model(synth)
    load_gguf_model(synth)
    assert mlx_blas.slow_blas_notice() is False
    err = capsys.readouterr().err
    assert err.count(NOTICE) == 1, err
    line = next(x for x in err.splitlines() if NOTICE in x)
    assert FIX in line and "TQBRIDGE_BLAS=bundled" in line and "no libopenblas.so.0 found" in line


def test_no_notice_with_openblas(fresh, synth, capsys):
    from tqbridge.bridge.gguf.model import load_gguf_model

    fresh.setattr(mlx_blas, "_state", "openblas (libopenblas.so.0, system)")  # what prefer_fast_blas says once loaded
    load_gguf_model(synth)
    assert mlx_blas.slow_blas_notice() is False
    assert NOTICE not in capsys.readouterr().err


def test_no_notice_when_silenced(fresh, capsys):
    fresh.setattr(mlx_blas, "_find_openblas", lambda: ([], NONE))
    fresh.setenv("TQBRIDGE_BLAS", "bundled")
    assert mlx_blas.slow_blas_notice() is False
    assert NOTICE not in capsys.readouterr().err


def test_no_notice_on_a_gpu_device(fresh, capsys):
    fresh.setattr(mlx_blas, "_find_openblas", lambda: ([], NONE))
    fresh.setattr(mlx_blas, "_on_cpu", lambda: False)
    assert mlx_blas.slow_blas_notice() is False
    assert NOTICE not in capsys.readouterr().err


def test_import_order_gets_its_own_fix(fresh, capsys):
    """OpenBLAS is there but MLX was imported first: installing it again would not help."""
    fresh.setattr(mlx_blas, "_find_openblas", lambda: (["/usr/lib/libopenblas.so.0"], "system"))
    assert "mlx.core" in sys.modules
    assert mlx_blas.slow_blas_notice() is True
    err = capsys.readouterr().err
    assert "prefer_fast_blas() before importing mlx" in err and FIX not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bundled-BLAS case exists on Linux only")
@pytest.mark.parametrize("env,expected", [({}, 1), ({"TQBRIDGE_BLAS": "bundled"}, 0)])
def test_cli_prints_the_notice_once(synth, env, expected):
    """`tqbridge quality` on the CPU with OpenBLAS unloadable: one notice; silenced: none."""
    import mlx.core as mx

    if mx.default_device().type != mx.DeviceType.cpu:
        pytest.skip("MLX's default device is a GPU here: no CPU model work")
    run_env = {k: v for k, v in os.environ.items() if k not in ("TQBRIDGE_BLAS", "LD_PRELOAD")}
    run_env.update(TQBRIDGE_OPENBLAS="/nonexistent/libopenblas.so.0", **env)
    code = "import sys; from tqbridge.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "quality", str(synth), "--kv", "q8_0/q8_0", "--tokens", "24",
                        "--chunk", "12", "--no-progress"], capture_output=True, text=True, timeout=300, env=run_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count(NOTICE) == expected, r.stderr[-2000:]
