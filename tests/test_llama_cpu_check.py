"""The llama.cpp build's instruction sets against the CPU's (bridge/llama/compat.py check_cpu): a build
for another machine is refused in one line naming what is missing, instead of an illegal instruction in
the middle of a model run (what a cached -march=native wheel did to a CI run)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tqbridge.bridge.llama import compat as llama_compat

BASELINE = {"pni", "ssse3", "avx", "avx2", "fma", "f16c", "bmi2"}   # x86-64-v3, what GGML_NATIVE=OFF builds


class _Build:
    """A stand-in for libggml-cpu: ggml_cpu_has_<feature>() answers 1 for the features it was built with."""

    def __init__(self, *features):
        for feature, _ in llama_compat.X86_FEATURES:
            setattr(self, f"ggml_cpu_has_{feature}", (lambda v: (lambda: v))(int(feature in features)))


def test_a_build_within_the_cpu_passes():
    assert llama_compat.check_cpu(_Build("avx", "avx2", "fma", "f16c"), flags=BASELINE) == []


def test_a_native_avx512_build_on_an_avx2_cpu_is_refused_naming_the_flags():
    (msg,) = llama_compat.check_cpu(_Build("avx2", "avx512", "avx512_vnni"), flags=BASELINE)
    assert "instructions this CPU lacks (avx512f, avx512_vnni)" in msg and "GGML_NATIVE=OFF" in msg


def test_unknown_cpu_flags_refuse_nothing():
    assert llama_compat.check_cpu(_Build("avx512"), flags=set()) == []


def test_assumed_flags_stand_in_for_the_cpu(monkeypatch):
    monkeypatch.setenv("TQBRIDGE_ASSUME_CPU_FLAGS", "avx avx2")
    assert llama_compat.cpu_flags() == {"avx", "avx2"}


@pytest.mark.skipif(llama_compat.installed_version() is None, reason="llama-cpp-python is not installed")
def test_the_setup_probe_says_whether_the_build_runs_here():
    # the Makefile's question: exit 0 (runs here), 1 (rebuild it: a CPU this build was not made for)
    def probe(env):
        return subprocess.run([sys.executable, "-m", "tqbridge.bridge.llama.compat"], capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=600)

    libs = llama_compat.load_libraries()
    built = {flag for feature, flag in llama_compat.X86_FEATURES
             if getattr(libs["libggml-cpu"], f"ggml_cpu_has_{feature}", lambda: 0)()}
    if llama_compat.cpu_flags() is None:
        pytest.skip("not an x86-64 Linux CPU: no flags to compare")
    ok = probe({"TQBRIDGE_ASSUME_CPU_FLAGS": " ".join(built)})
    assert ok.returncode == 0 and "runs on this CPU" in ok.stdout, ok.stdout + ok.stderr
    if built:
        lacking = sorted(built)[0]
        bad = probe({"TQBRIDGE_ASSUME_CPU_FLAGS": " ".join(built - {lacking})})
        assert bad.returncode == 1 and f"lacks ({lacking}" in bad.stdout, bad.stdout
