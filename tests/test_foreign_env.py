"""Safe to install anywhere: tqbridge without extras, next to pytest, in a fresh virtual environment
(no hypothesis, MLX, mlx-lm or llama-cpp-python; no system site-packages). Its pytest11 plugin loads
for every project there: a foreign project's test run must pass and the header must say, once, how
to enable what is off. One venv per session; skipped, with the reason, when it cannot be built (no
network and nothing in pip's cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the sdist needs: pyproject.toml, the readme it names and the four package folders.
SOURCES = ("pyproject.toml", "README.md", "bridge", "metal", "parity", "tools")
DEPS = ("numpy", "gguf", "pytest", "setuptools>=77", "wheel")
HINT = "pip install 'tqbridge[test]'"


def _clean_env() -> dict:
    """The environment without anything that points back at this checkout or its venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_PLUGINS",
                        "HYPOTHESIS_STORAGE_DIRECTORY")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd, cwd=None, timeout=600):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def _tail(p) -> str:
    return "\n".join((p.stdout + p.stderr).strip().splitlines()[-6:])


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory) -> Path:
    """A fresh venv with tqbridge (no extras) and numpy, gguf, pytest: its python."""
    d = tmp_path_factory.mktemp("foreign-env")
    env_dir = d / "venv"
    p = _run([sys.executable, "-m", "venv", env_dir])
    if p.returncode:
        pytest.skip(f"cannot create a venv here: {_tail(p)}")
    py = env_dir / "bin" / "python"
    p = _run([py, "-m", "pip", "install", "-q", *DEPS])
    if p.returncode:
        pytest.skip(f"cannot install {', '.join(DEPS)} into a fresh venv (no network?): {_tail(p)}")
    # A copy of the sources, so that building leaves nothing (build/, egg-info) in the checkout.
    src = d / "src"
    src.mkdir()
    for name in SOURCES:
        s = ROOT / name
        if s.is_dir():
            shutil.copytree(s, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(s, src / name)
    p = _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", src])
    assert p.returncode == 0, f"pip install tqbridge (no extras) failed:\n{p.stdout}\n{p.stderr}"
    return py


def test_the_bare_venv_has_no_optional_dependencies(bare_python):
    code = ("import importlib.util as u, sys\n"
            "missing = [m for m in ('hypothesis', 'mlx', 'mlx_lm', 'llama_cpp') if u.find_spec(m) is None]\n"
            "import tqbridge.parity.plugin.pytest_plugin as p\n"
            "print(missing, p.HAVE_HYPOTHESIS)\n")
    p = _run([bare_python, "-c", code])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "['hypothesis', 'mlx', 'mlx_lm', 'llama_cpp'] False"


def test_a_foreign_project_runs_with_the_plugin_loaded(bare_python, tmp_path):
    (tmp_path / "test_foreign.py").write_text("def test_arithmetic():\n    assert 1 + 1 == 2\n")
    p = _run([bare_python, "-m", "pytest", "-p", "no:cacheprovider"], cwd=tmp_path, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "1 passed" in out
    header = [line for line in out.splitlines() if line.startswith("tqbridge plugin:")]
    assert len(header) == 1 and HINT in header[0], out          # loaded, and says once how to enable
    assert "mlx_runtime/llama_cpp_runtime skip without mlx, mlx_lm, llama_cpp" in header[0], header[0]


def test_only_fixtures_that_need_nothing_optional_are_registered(bare_python, tmp_path):
    (tmp_path / "test_foreign.py").write_text("def test_arithmetic():\n    pass\n")
    p = _run([bare_python, "-m", "pytest", "-p", "no:cacheprovider", "--fixtures"], cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    listed = {line.split()[0] for line in p.stdout.splitlines()
              if line[:1].isalpha() and not line.startswith("tqbridge plugin:")}
    assert {"tqbridge_gguf", "kernel_backend", "mlx_runtime", "llama_cpp_runtime"} <= listed, p.stdout
    assert not {"tqbridge_fuzz", "tqbridge_settings"} & listed, p.stdout
    p = _run([bare_python, "-m", "pytest", "-p", "no:cacheprovider", "--tqbridge-profile", "ci"], cwd=tmp_path,
             timeout=120)
    assert p.returncode == 4 and HINT in p.stderr, p.stdout + p.stderr   # a usage error that says what to do
