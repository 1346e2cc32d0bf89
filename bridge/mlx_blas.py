"""Fast float32 matmuls for MLX on Linux CPUs.

The ``mlx[cpu]`` wheel for Linux bundles a reference (netlib) BLAS: an f32 matmul runs at a few
GFLOP/s. Loading an OpenBLAS with ``RTLD_GLOBAL`` *before* ``mlx.core`` is imported makes MLX's
``cblas_sgemm`` resolve to OpenBLAS (measured ~35x faster on a 2-core x86 machine).
``prefer_fast_blas()`` does that once and says what happened. Which library, first found wins:

1. ``TQBRIDGE_OPENBLAS=<path>``: that library, and no other (a path that does not load leaves MLX's own);
2. the system's ``libopenblas.so.0`` (Debian: ``libopenblas0-pthread``, needs root to install);
3. the ``cmeel-openblas`` wheel's ``libopenblas.so.0`` (a dependency of the ``mlx`` extra on Linux: no
   root). Each release of that wheel is compiled for one CPU (no runtime dispatch), so it is first
   tried in a child process — loaded, and two 64x64 matrices multiplied — and used only if that works.
   It needs ``libgfortran.so.5``; where the system has none, the copy inside the mlx[cpu] wheel is
   used (see ``_fortran_runtime``);
4. MLX's bundled BLAS.

OpenBLAS's threads: ``OPENBLAS_NUM_THREADS`` where set, else :func:`blas_threads` (the cores this process
may use that other work is not already keeping busy). ``TQBRIDGE_BLAS=bundled`` keeps MLX's own. ``slow_blas_notice()``, called where model work starts
(building a model from a GGUF, ``tqbridge bench decode``), says once per process on stderr when that
work will run on MLX's CPU device with the bundled BLAS, and how to fix it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import sys

_CANDIDATES = (
    "/usr/lib/*/libopenblas.so.0",
    "/usr/lib/*/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
WHEEL = "cmeel-openblas"
_state: "str | None" = None
_noticed = False
FIX = "sudo apt-get install libopenblas0-pthread"

# Run in a child process with library paths: load each (all but the last globally, as this process
# will), then multiply two 64x64 matrices of ones with the last (each entry of the product is 64). A
# library compiled for instructions this CPU lacks dies here, not in the caller.
_PROBE = r"""
import ctypes, sys
for p in sys.argv[1:-1]:
    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(sys.argv[-1])
n = 64
a = (ctypes.c_float * (n * n))(*([1.0] * (n * n)))
c = (ctypes.c_float * (n * n))()
f = lib.cblas_sgemm
f.restype = None
f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
f(101, 111, 111, n, n, n, 1.0, a, n, a, n, 0.0, c, n)   # row-major, no transposes
sys.exit(0 if all(x == n for x in c) else 3)
"""


def _system_openblas() -> "str | None":
    for pattern in _CANDIDATES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def _dist_file(dist_name: str, pattern: str) -> "str | None":
    """The first installed file of a distribution whose name matches ``pattern`` (its file list, read
    through importlib.metadata: nothing of the package is imported)."""
    from fnmatch import fnmatch
    from importlib import metadata

    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    for f in sorted(dist.files or (), key=str):
        if fnmatch(f.name, pattern):
            path = str(dist.locate_file(f))
            if os.path.isfile(path):
                return path
    return None


def _wheel_openblas() -> "str | None":
    """The ``libopenblas.so.0`` the cmeel-openblas wheel installed."""
    return _dist_file(WHEEL, "libopenblas.so.0")


def _fortran_runtime() -> "list[str]":
    """The wheel's library needs ``libgfortran.so.5`` (Debian: libgfortran5, part of a system OpenBLAS
    install). Without it, use the copy the mlx[cpu] wheel ships for its own BLAS: auditwheel renamed
    it (file and SONAME ``libgfortran-<hash>.so.5.0.0``), so the dynamic linker would not take it for
    ``libgfortran.so.5``. A copy in tqbridge's cache with the SONAME written back to ``libgfortran.so.5``
    (the shorter name over the longer, NUL-ended, in the string table), loaded globally after the
    libquadmath it needs, is. Returns [libquadmath, that copy], or [] when mlx-cpu has no such pair."""
    gfortran = _dist_file("mlx-cpu", "libgfortran-*.so.5*")
    quadmath = _dist_file("mlx-cpu", "libquadmath-*.so.0*")
    if not gfortran or not quadmath:
        return []
    from .environ import cache_dir

    old = os.path.basename(gfortran).encode() + b"\0"
    new = b"libgfortran.so.5\0"
    out = cache_dir() / "blas" / os.path.basename(gfortran) / "libgfortran.so.5"
    if not out.is_file():
        with open(gfortran, "rb") as fh:
            data = fh.read()
        if data.count(old) != 1 or len(new) > len(old):
            return []
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        tmp.write_bytes(data.replace(old, new + old[len(new):]))
        os.replace(tmp, out)
    return [quadmath, str(out)]


def _why_it_fails(paths: "list[str]") -> "str | None":
    """None if the libraries load, and the last one multiplies correctly, in a child process; else why not."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    try:
        r = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, *paths], capture_output=True, text=True,
                           timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"its check did not finish: {e}"
    if r.returncode == 0:
        return None
    if r.returncode < 0:
        try:
            sig = signal.Signals(-r.returncode).name
        except ValueError:
            sig = f"signal {-r.returncode}"
        return (f"it stopped with {sig}: built for a CPU with instructions this one lacks"
                if sig == "SIGILL" else f"it stopped with {sig}")
    if r.returncode == 3:
        return "it multiplied wrongly"
    last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    return last.removeprefix("OSError: ")


def _find_openblas() -> "tuple[list[str], str]":
    """(the libraries to load, in order, the BLAS last; where it comes from), or ([], why none), in the
    order the module's docstring gives."""
    named = os.environ.get("TQBRIDGE_OPENBLAS")
    if named:
        return [named], "TQBRIDGE_OPENBLAS"
    path = _system_openblas()
    if path:
        return [path], "system"
    path = _wheel_openblas()
    if path is None:
        return [], f"no libopenblas.so.0 found, nor the {WHEEL} wheel"
    why = _why_it_fails([path])
    if why and "libgfortran.so.5" in why:
        runtime = _fortran_runtime()
        if runtime:
            why = _why_it_fails([*runtime, path])
            if not why:
                return [*runtime, path], f"{WHEEL} wheel, mlx-cpu's libgfortran"
    if why:
        return [], f"no system libopenblas.so.0; the {WHEEL} wheel's does not run here: {why}"
    return [path], f"{WHEEL} wheel"


def blas_threads(cores: "int | None" = None, busy: "float | None" = None) -> int:
    """OpenBLAS threads for this process: the ``cores`` it may run on (its CPU affinity) less those other
    work keeps busy (``busy``: the 1-minute load average, rounded), at least 1. OpenBLAS's threads spin
    while they wait for each other, so a thread on a core another process is using slows the matmul
    instead of sharing it: measured on 2 contended cores, a matmul test ran 12x slower with 2 threads
    than with 1 (the logits level: 29 s with 1, 175 s with 2)."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (AttributeError, OSError):
            busy = 0.0
    return max(1, min(int(cores), int(cores - busy + 0.5)))


def prefer_fast_blas() -> str:
    """Load OpenBLAS globally before MLX if possible; return a short description of the BLAS in use."""
    global _state
    if _state is not None:
        return _state
    if not sys.platform.startswith("linux"):
        _state = "platform default"
    elif os.environ.get("TQBRIDGE_BLAS", "").lower() == "bundled":
        _state = "mlx bundled BLAS (TQBRIDGE_BLAS=bundled)"
    elif "openblas" in os.environ.get("LD_PRELOAD", ""):
        _state = "openblas (LD_PRELOAD)"
    else:
        paths, source = _find_openblas()
        if not paths:
            _state = f"mlx bundled BLAS ({source})"
        elif "mlx.core" in sys.modules:
            _state = "mlx bundled BLAS (mlx was imported before tqbridge could load OpenBLAS)"
        else:
            threads = os.environ.get("OPENBLAS_NUM_THREADS")
            if not threads:      # OpenBLAS reads it once, when it loads
                threads = os.environ["OPENBLAS_NUM_THREADS"] = str(blas_threads())
            try:
                for path in paths:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                _state = f"openblas ({os.path.basename(paths[-1])}, {source}; {threads} thread{'s' * (threads != '1')})"
            except OSError as e:
                _state = f"mlx bundled BLAS (could not load {path}: {e})"
    return _state


def blas_in_use() -> str:
    """The description recorded by ``prefer_fast_blas`` (calling it if nobody has yet)."""
    return prefer_fast_blas()


def _on_cpu() -> bool:
    """Whether MLX's default device (where model work runs) is the CPU."""
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu


def slow_blas_notice() -> bool:
    """Once per process: tell stderr that MLX CPU model work runs on the mlx wheel's bundled reference
    BLAS, and the one-line fix. Silent elsewhere (OpenBLAS loaded, not Linux, a GPU device,
    ``TQBRIDGE_BLAS=bundled``). Returns whether it printed."""
    global _noticed
    state = prefer_fast_blas()
    if _noticed or not state.startswith("mlx bundled BLAS") or "TQBRIDGE_BLAS=bundled" in state:
        return False
    if not _on_cpu():
        return False
    _noticed = True
    if "imported before" in state:
        fix = ("call tqbridge.bridge.mlx_blas.prefer_fast_blas() before importing mlx "
               "(or set TQBRIDGE_BLAS=bundled to silence this)")
    else:
        fix = f"{FIX} (or set TQBRIDGE_BLAS=bundled to silence this)"
    why = state[len("mlx bundled BLAS"):].strip(" ()")
    print(f"tqbridge: note: MLX runs this model on the CPU with the mlx wheel's bundled reference BLAS "
          f"({why}); float32 matmuls run many times slower than with OpenBLAS. Fix: {fix}",
          file=sys.stderr, flush=True)
    return True
