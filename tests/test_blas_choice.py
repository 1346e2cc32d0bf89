"""Which OpenBLAS bridge/mlx_blas.py loads before MLX on Linux: TQBRIDGE_OPENBLAS > the system's
libopenblas.so.0 > the cmeel-openblas wheel's (if it runs here, with mlx-cpu's libgfortran where the
system has none) > MLX's bundled BLAS, with the slow-BLAS notice only in the last case. The finders
and the loader are replaced by fakes (nothing is loaded into this process); the real finders and the
child-process check are exercised where what they look for is installed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from importlib import metadata

import pytest

from tqbridge.bridge import mlx_blas

NOTICE = "tqbridge: note: MLX runs this model on the CPU with the mlx wheel's bundled reference BLAS"
SYSTEM = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
WHEEL = "/venv/site-packages/cmeel.prefix/lib/libopenblas.so.0"
RUNTIME = ["/venv/site-packages/mlx_cpu.libs/libquadmath-0.so.0.0.0", "/cache/blas/libgfortran.so.5"]
NO_GFORTRAN = "libgfortran.so.5: cannot open shared object file: No such file or directory"


def _installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


WHEEL_INSTALLED = _installed("cmeel-openblas")   # decided at collection, before any code under test runs
MLX_CPU_INSTALLED = _installed("mlx-cpu")


@pytest.fixture
def machine(monkeypatch):
    """A Linux process that has not chosen its BLAS, MLX not imported, on the CPU device, with fake
    candidates: set ``machine.system`` / ``machine.wheel`` / ``machine.named`` to a path, and
    ``machine.runs`` to what the child-process check answers for a list of paths (None: it runs)."""

    class M:
        system = wheel = named = None
        runs = staticmethod(lambda paths: None)
        probed: list = []
        loaded: list = []

    m = M()
    m.probed, m.loaded = [], []
    monkeypatch.setattr(mlx_blas, "_state", None)
    monkeypatch.setattr(mlx_blas, "_noticed", False)
    monkeypatch.setattr(mlx_blas, "_on_cpu", lambda: True)
    monkeypatch.setattr(mlx_blas.sys, "platform", "linux")
    for var in ("TQBRIDGE_BLAS", "TQBRIDGE_OPENBLAS", "LD_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "")         # restored after the test: the choice sets it
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.setattr(mlx_blas, "blas_threads", lambda: 1)
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    monkeypatch.setattr(mlx_blas, "_system_openblas", lambda: m.system)
    monkeypatch.setattr(mlx_blas, "_wheel_openblas", lambda: m.wheel)
    monkeypatch.setattr(mlx_blas, "_fortran_runtime", lambda: list(RUNTIME))

    def probe(paths):
        m.probed.append(list(paths))
        return m.runs(paths)

    def cdll(path, mode=0):
        assert mode == ctypes.RTLD_GLOBAL
        m.loaded.append(path)

    monkeypatch.setattr(mlx_blas, "_why_it_fails", probe)
    monkeypatch.setattr(mlx_blas.ctypes, "CDLL", cdll)
    m.env = monkeypatch
    return m


@pytest.mark.parametrize("named,system,wheel,expected", [
    (True, True, True, "named"),
    (True, False, False, "named"),
    (False, True, True, "system"),
    (False, True, False, "system"),
    (False, False, True, "wheel"),
    (False, False, False, None),
])
def test_the_first_candidate_present_is_loaded(machine, named, system, wheel, expected):
    paths = {"named": "/opt/my/libopenblas.so.0", "system": SYSTEM, "wheel": WHEEL}
    if named:
        machine.env.setenv("TQBRIDGE_OPENBLAS", paths["named"])
    machine.system = SYSTEM if system else None
    machine.wheel = WHEEL if wheel else None
    state = mlx_blas.prefer_fast_blas()
    if expected is None:
        assert machine.loaded == [] and state.startswith("mlx bundled BLAS"), state
    else:
        assert machine.loaded == [paths[expected]], (machine.loaded, state)
        assert state.startswith("openblas (libopenblas.so.0, "), state
    # the wheel is checked in a child process only when it is the one to be loaded
    assert machine.probed == ([[WHEEL]] if expected == "wheel" else [])


def test_blas_threads_leave_busy_cores_alone():
    assert mlx_blas.blas_threads(2, 1.7) == 1          # two cores, one kept busy elsewhere
    assert mlx_blas.blas_threads(2, 3.5) == 1          # never fewer than one
    assert mlx_blas.blas_threads(16, 0.2) == 16
    assert mlx_blas.blas_threads(16, 6.4) == 10
    assert mlx_blas.blas_threads(4, 0.0) == 4


def test_the_thread_count_is_set_before_openblas_loads_unless_given(machine):
    import os

    machine.system = SYSTEM
    state = mlx_blas.prefer_fast_blas()
    assert machine.loaded == [SYSTEM] and os.environ["OPENBLAS_NUM_THREADS"] == "1" and "1 thread)" in state
    machine.env.setattr(mlx_blas, "_state", None)
    machine.env.setenv("OPENBLAS_NUM_THREADS", "3")
    assert "3 threads)" in mlx_blas.prefer_fast_blas() and os.environ["OPENBLAS_NUM_THREADS"] == "3"


def test_the_wheel_that_does_not_run_leaves_the_bundled_blas_and_says_why(machine, capsys):
    machine.wheel = WHEEL
    machine.runs = lambda paths: "it stopped with SIGILL: built for a CPU with instructions this one lacks"
    state = mlx_blas.prefer_fast_blas()
    assert machine.loaded == [] and machine.probed == [[WHEEL]]
    assert mlx_blas.slow_blas_notice() is True
    err = capsys.readouterr().err
    assert err.count(NOTICE) == 1 and "SIGILL" in err and "cmeel-openblas" in err, (state, err)


def test_without_libgfortran_the_wheel_runs_with_mlx_cpu_s_copy(machine):
    machine.wheel = WHEEL
    machine.runs = lambda paths: NO_GFORTRAN if paths == [WHEEL] else None
    state = mlx_blas.prefer_fast_blas()
    assert machine.probed == [[WHEEL], [*RUNTIME, WHEEL]]
    assert machine.loaded == [*RUNTIME, WHEEL]      # the Fortran runtime first, then the BLAS
    assert "cmeel-openblas wheel, mlx-cpu's libgfortran" in state, state


def test_other_failures_do_not_try_the_fortran_runtime(machine):
    machine.wheel = WHEEL
    machine.runs = lambda paths: "it multiplied wrongly"
    assert mlx_blas.prefer_fast_blas().startswith("mlx bundled BLAS")
    assert machine.probed == [[WHEEL]] and machine.loaded == []


@pytest.mark.parametrize("system,wheel,noticed", [(True, False, False), (False, True, False), (False, False, True)])
def test_the_notice_only_when_neither_exists(machine, capsys, system, wheel, noticed):
    machine.system = SYSTEM if system else None
    machine.wheel = WHEEL if wheel else None
    assert mlx_blas.slow_blas_notice() is noticed
    err = capsys.readouterr().err
    assert (NOTICE in err) is noticed, err
    if noticed:
        assert "no libopenblas.so.0 found, nor the cmeel-openblas wheel" in err and mlx_blas.FIX in err


def test_bundled_setting_skips_every_candidate(machine):
    machine.env.setenv("TQBRIDGE_BLAS", "bundled")
    machine.system, machine.wheel = SYSTEM, WHEEL
    assert mlx_blas.prefer_fast_blas() == "mlx bundled BLAS (TQBRIDGE_BLAS=bundled)"
    assert machine.loaded == [] and machine.probed == []


# --- the child-process check, for real --------------------------------------------------------------

def test_the_check_reports_a_library_that_does_not_load():
    why = mlx_blas._why_it_fails(["/nonexistent/libopenblas.so.0"])
    assert why is not None and "/nonexistent/libopenblas.so.0" in why, why


def test_the_check_names_an_illegal_instruction(monkeypatch):
    monkeypatch.setattr(mlx_blas.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, -4, "", ""))
    assert "SIGILL: built for a CPU with instructions this one lacks" in mlx_blas._why_it_fails([WHEEL])


@pytest.mark.skipif(not mlx_blas._system_openblas(), reason="no system libopenblas.so.0 here to check")
def test_the_check_passes_a_working_openblas():
    assert mlx_blas._why_it_fails([mlx_blas._system_openblas()]) is None


@pytest.mark.skipif(not WHEEL_INSTALLED, reason="the cmeel-openblas wheel is not installed in this environment")
def test_the_wheel_s_library_is_found_when_installed():
    path = mlx_blas._wheel_openblas()
    assert path is not None and os.path.isfile(path), path
    assert path.endswith(os.path.join("cmeel.prefix", "lib", "libopenblas.so.0")), path
    with open(path, "rb") as fh:
        assert fh.read(4) == b"\x7fELF"
    print(f"the wheel's library: {path}; here: {mlx_blas._why_it_fails([path]) or 'runs'}")


@pytest.mark.skipif(not MLX_CPU_INSTALLED or not mlx_blas._dist_file("mlx-cpu", "libgfortran-*.so.5*"),
                    reason="no mlx-cpu wheel with a libgfortran here")
def test_mlx_cpu_s_libgfortran_answers_to_libgfortran_so_5(monkeypatch, tmp_path):
    """The copy, loaded after its libquadmath, is what the dynamic linker hands out for the name
    ``libgfortran.so.5`` (the name the wheel's library needs), not the system's."""
    monkeypatch.setenv("TQBRIDGE_CACHE", str(tmp_path))
    quadmath, copy = mlx_blas._fortran_runtime()
    assert copy.startswith(str(tmp_path)) and os.path.basename(copy) == "libgfortran.so.5"
    code = ("import ctypes, sys\n"
            "for p in sys.argv[1:]: ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)\n"
            "ctypes.CDLL('libgfortran.so.5')\n"
            "print([l.split()[-1] for l in open('/proc/self/maps') if 'libgfortran' in l])")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, quadmath, copy], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    mapped = set(eval(r.stdout))
    assert mapped == {copy}, mapped
