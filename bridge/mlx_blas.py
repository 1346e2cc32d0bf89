"""Fast float32 matmuls for MLX on Linux CPUs.

The ``mlx[cpu]`` wheel for Linux bundles a reference (netlib) BLAS: an f32 matmul runs at a few
GFLOP/s. When Debian's OpenBLAS (``libopenblas0-pthread``) is installed, loading it with
``RTLD_GLOBAL`` *before* ``mlx.core`` is imported makes MLX's ``cblas_sgemm`` resolve to OpenBLAS
(measured ~35x faster on a 2-core x86 machine). ``prefer_fast_blas()`` does that once and says what
happened; set ``TQBRIDGE_BLAS=bundled`` to keep MLX's own BLAS, or ``TQBRIDGE_OPENBLAS=<path>`` to
name the library. ``slow_blas_notice()``, called where model work starts (building a model from a
GGUF, ``tqbridge bench decode``), says once per process on stderr when that work will run on MLX's
CPU device with the bundled BLAS, and how to fix it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

_CANDIDATES = (
    "/usr/lib/*/libopenblas.so.0",
    "/usr/lib/*/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
_state: "str | None" = None
_noticed = False
FIX = "sudo apt-get install libopenblas0-pthread"


def _find_openblas() -> "str | None":
    named = os.environ.get("TQBRIDGE_OPENBLAS")
    if named:
        return named
    for pattern in _CANDIDATES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


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
        path = _find_openblas()
        if path is None:
            _state = "mlx bundled BLAS (no libopenblas.so.0 found; install libopenblas0-pthread)"
        elif "mlx.core" in sys.modules:
            _state = "mlx bundled BLAS (mlx was imported before tqbridge could load OpenBLAS)"
        else:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                _state = f"openblas ({os.path.basename(path)})"
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
    why = state[len("mlx bundled BLAS"):].strip(" ()").split(";")[0]
    print(f"tqbridge: note: MLX runs this model on the CPU with the mlx wheel's bundled reference BLAS "
          f"({why}); float32 matmuls run many times slower than with OpenBLAS. Fix: {fix}",
          file=sys.stderr, flush=True)
    return True
