"""The llama-cpp-python compatibility check (bridge/llama/compat.py): it passes on the installed
version, and a version outside the range, a missing symbol or Python name, or a layout fact that
differs each give one clear refusal (LlamaCppIncompatible naming the version, the range and the
mismatch) before any ctypes call, never an AttributeError or a silent wrong layout."""

from __future__ import annotations

import ctypes
import sys
import types
from pathlib import Path

import pytest

from tqbridge.bridge.llama import ggml_c
from tqbridge.bridge.llama.side import GgmlUnavailable

try:
    ggml_c.load()
except GgmlUnavailable as _e:  # pragma: no cover - depends on the install
    pytest.skip(f"llama-cpp-python's ggml cannot be used here: {_e}", allow_module_level=True)

from tqbridge.bridge.llama import ggml_abi  # noqa: E402
from tqbridge.bridge.llama import ggml_graph  # noqa: E402
from tqbridge.bridge.llama import compat as llama_compat  # noqa: E402
from tqbridge.bridge.llama.compat import LlamaCppIncompatible  # noqa: E402


@pytest.fixture
def fresh(monkeypatch):
    """Forget every cached verdict and library handle before and after: the check runs again."""
    def clear():
        llama_compat.reset()
        ggml_c.load.cache_clear()
        ggml_c.type_traits.cache_clear()
        ggml_graph.libraries.cache_clear()

    clear()
    yield monkeypatch
    clear()


def _refused(match: str) -> str:
    """Load ggml the way every user of it does; the refusal's message."""
    with pytest.raises(LlamaCppIncompatible) as e:
        ggml_c.load()
    msg = str(e.value)
    assert match in msg, msg
    assert f"supported: {llama_compat.SUPPORTED}" in msg
    assert "\n" not in msg
    return msg


def test_installed_version_passes():
    version = llama_compat.installed_version()
    assert llama_compat.in_range(version), version
    assert llama_compat.check() == []
    llama_compat.ensure_compatible()


def test_pyproject_range_is_the_checked_one():
    import tomllib

    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["llama"]
    assert extra == [f"llama-cpp-python{llama_compat.SUPPORTED}"]
    assert llama_compat.in_range(llama_compat.TESTED)


@pytest.mark.parametrize("text,ok", [("0.3.36", True), ("0.3.36+cu121", True), ("0.3.40", True),
                                     ("0.3.35", False), ("0.3.30", False), ("0.4.0", False), ("1.0", False),
                                     ("0.4.0rc1", False), ("garbage", False)])
def test_version_range(text, ok):
    assert llama_compat.in_range(text) is ok


@pytest.mark.parametrize("version", ["0.3.30", "0.4.1"])
def test_version_outside_range_is_refused(fresh, version):
    fresh.setattr(llama_compat, "installed_version", lambda: version)
    msg = _refused(f"version {version} is outside the supported range")
    assert msg.startswith(f"llama-cpp-python {version} cannot be used by tqbridge")
    # every user refuses the same way, later calls too
    assert f"version {version}" in ggml_graph.available()
    with pytest.raises(LlamaCppIncompatible):
        llama_compat.ensure_compatible()


def test_unknown_version_is_refused(fresh):
    fresh.setattr(llama_compat, "installed_version", lambda: None)
    _refused("its version is unknown")


class _Hiding:
    """A library handle without some symbols (as an older or newer libggml would be)."""

    def __init__(self, lib, hidden):
        self._lib, self._hidden = lib, set(hidden)

    def __getattr__(self, name):
        if name in self._hidden:
            raise AttributeError(name)
        return getattr(self._lib, name)


@pytest.mark.parametrize("lib,symbol", [("libggml-base", "ggml_prec_set_acc"),
                                        ("libggml-base", "ggml_quantize_chunk"),
                                        ("libggml-cpu", "ggml_graph_plan")])
def test_missing_symbol_is_refused_not_attribute_error(fresh, lib, symbol):
    real = llama_compat.load_libraries

    def hiding():
        libs = real()
        # a symbol with an older spelling is missing only when both are
        libs[lib] = _Hiding(libs[lib], [symbol, llama_compat.ALTERNATIVES.get(symbol)])
        return libs

    fresh.setattr(llama_compat, "load_libraries", hiding)
    _refused(f"{lib} has no {symbol}")


def test_an_older_spelling_of_a_symbol_is_accepted(fresh):
    """ggml builds older than llama-cpp-python's (the TurboQuant fork at 69d8e4b) have
    ggml_flash_attn_ext_set_prec instead of ggml_prec_set_acc: accepted, and used."""
    real = llama_compat.load_libraries

    def hiding():
        libs = real()
        libs["libggml-base"] = _Hiding(libs["libggml-base"], ["ggml_prec_set_acc"])
        return libs

    fresh.setattr(llama_compat, "load_libraries", hiding)
    assert llama_compat.check() == []


def test_missing_python_names_are_refused(fresh):
    import llama_cpp

    class Llama:  # no type_k keyword, no eval
        def __init__(self, model_path, n_ctx=512, **kwargs):
            pass

        close = tokenize = detokenize = n_vocab = token_eos = lambda self: None

    fake = types.SimpleNamespace(**{n: getattr(llama_cpp, n) for n in ("llama_state_seq_get_size",
                                                                      "llama_state_seq_set_data",
                                                                      "llama_chat_format", "_internals")})
    fake.Llama = Llama
    problems = llama_compat.check(llama_cpp=fake)
    assert "llama_cpp has no llama_state_seq_get_data" in problems
    assert "Llama has no method eval" in problems
    assert "Llama() takes no keyword type_k" in problems
    fresh.setattr(llama_compat, "import_llama_cpp", lambda: fake)
    _refused("llama_cpp has no llama_state_seq_get_data")


# Layout facts: tqbridge's ctypes declarations as they would be if ggml had changed under them.

def _traits_without_interleave():
    class T(ctypes.Structure):
        _fields_ = [f for f in ggml_abi.TypeTraits._fields_ if f[0] != "blck_size_interleave"]
    return T


def _traits_swapped_pointers():
    f = list(ggml_abi.TypeTraits._fields_)

    class T(ctypes.Structure):
        _fields_ = f[:5] + [f[6], f[5]]   # to_float and from_float_ref swapped: same size
    return T


def _cplan_without_use_ref():
    class P(ctypes.Structure):
        _fields_ = [f for f in ggml_abi.CPlan._fields_ if f[0] != "use_ref"]
    return P


def _cplan_extra_field():
    f = list(ggml_abi.CPlan._fields_)

    class P(ctypes.Structure):
        _fields_ = f[:3] + [("new_field", ctypes.c_void_p)] + f[3:]
    return P


def _init_params_narrow():
    class I(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_uint16), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]
    return I


@pytest.mark.parametrize("module,name,planted,match", [
    (ggml_abi, "TypeTraits", _traits_without_interleave, "struct ggml_type_traits is 56 bytes in this ggml, "
                                                         "tqbridge's layout has 48"),
    (ggml_abi, "TypeTraits", _traits_swapped_pointers, "q8_0's to_float from struct ggml_type_traits decodes"),
    (ggml_abi, "CPlan", _cplan_without_use_ref, "struct ggml_cplan"),
    (ggml_abi, "CPlan", _cplan_extra_field, "struct ggml_cplan"),
    (ggml_abi, "InitParams", _init_params_narrow, "struct ggml_init_params"),
])
def test_layout_mismatch_is_refused(fresh, module, name, planted, match):
    fresh.setattr(module, name, planted())
    _refused(match)


@pytest.mark.skipif(not __import__("platform").machine().lower() in ("x86_64", "amd64"),
                    reason="struct return size is measured on x86-64 only")
def test_cplan_size_is_measured(fresh):
    fresh.setattr(ggml_abi, "CPlan", _cplan_without_use_ref())
    _refused("struct ggml_cplan: ggml_graph_plan writes at least 56 bytes, tqbridge's layout has 48")


@pytest.mark.parametrize("wrong,match", [
    (("q8_0", 8, 32, 36), "q8_0: ggml says 34 bytes per 32 values, tqbridge expects 36 per 32"),
    (("q8_0", 9, 32, 34), "ggml type 9 is 'q8_1', tqbridge expects 'q8_0'"),
])
def test_type_table_mismatch_is_refused(fresh, wrong, match):
    real = llama_compat._expected_types()
    fresh.setattr(llama_compat, "_expected_types", lambda: [wrong if r[0] == wrong[0] else r for r in real])
    _refused(match)


def test_cli_refusal_is_one_line(fresh, capsys):
    from tqbridge.tools.cli import main

    fresh.setattr(llama_compat, "installed_version", lambda: "0.3.30")
    assert main(["selfcheck", "--formats", "q8_0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "llama-cpp-python 0.3.30 cannot be used by tqbridge" in err, err


def test_cli_catches_a_refusal_raised_mid_run(fresh, capsys, monkeypatch):
    """A subcommand that does not catch it itself still ends in one line and exit code 2."""
    from tqbridge.tools import cmd_formats
    from tqbridge.tools.cli import main

    def run(args):
        raise LlamaCppIncompatible(llama_compat.describe("0.3.30", ["version 0.3.30 is outside the supported range"]))

    monkeypatch.setattr(cmd_formats, "run", run)
    assert main(["formats"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tqbridge formats: error: llama-cpp-python 0.3.30") and "\n" not in err


def test_tokenizer_refuses_before_llama_cpp_is_used(fresh, tmp_path):
    from tqbridge.bridge.gguf.tokenizer import GGUFTokenizer

    fresh.setattr(llama_compat, "installed_version", lambda: "0.3.30")
    with pytest.raises(LlamaCppIncompatible, match="0.3.30"):
        GGUFTokenizer(tmp_path / "any.gguf")


def test_check_is_cheap_and_runs_once(fresh):
    import time

    t0 = time.perf_counter()
    llama_compat.ensure_compatible()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(100):
        llama_compat.ensure_compatible()
    assert time.perf_counter() - t0 < 0.1
    assert first < 5.0
    assert "llama_cpp" in sys.modules
