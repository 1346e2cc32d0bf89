"""Builder and dispatcher: one compiled kernel per (kernel, static parameters, backend), and the
choice of backend.

``build(kernel, static, backend)`` compiles once and caches; the result is called with the
per-call buffers (lengths and offsets go in a parameter buffer, never in ``static``). ``resolve``
picks a backend for ``"auto"``: Metal on Apple GPUs, CUDA when MLX runs on CUDA, else the CPU
emulator. ``last_path()`` tells which path the latest dispatch in this thread ran.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from .kernel import Kernel, KernelError

BACKEND_NAMES = ("metal", "cuda", "cpu-emulator", "reference")
_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_local = threading.local()


def _mlx():
    try:
        import mlx.core as mx
    except ImportError:
        return None
    return mx


def _gpu_kind() -> "str | None":
    mx = _mlx()
    if mx is None:
        return None
    try:
        if mx.metal.is_available():
            return "metal"
    except Exception:  # pragma: no cover - depends on the MLX build
        pass
    try:
        if mx.cuda.is_available():
            return "cuda"
    except Exception:  # pragma: no cover
        pass
    return None


def _gpu_is_default() -> bool:
    """Whether MLX's default device is the GPU (a user who sets the CPU gets CPU paths on "auto")."""
    mx = _mlx()
    return mx is not None and mx.default_device() == mx.gpu


def backends() -> list[str]:
    """The backends usable here, best first: "metal" / "cuda", "cpu-emulator", "reference". The GPU
    comes first while MLX's default device is the GPU; after the emulator when it is the CPU."""
    out = []
    gpu = _gpu_kind()
    from .emulator import EmulatorError, find_compiler

    try:
        find_compiler()
        out.append("cpu-emulator")
    except EmulatorError:
        pass
    if gpu:
        out.insert(0 if _gpu_is_default() else len(out), gpu)
    out.append("reference")
    return out


def resolve(backend: str = "auto") -> str:
    """The concrete backend for ``backend`` ("auto" picks the first of :func:`backends`)."""
    if backend == "auto":
        return backends()[0]
    if backend not in BACKEND_NAMES:
        raise KernelError(f"unknown backend {backend!r}; known: auto, {', '.join(BACKEND_NAMES)}")
    if backend in ("metal", "cuda") and _gpu_kind() != backend:
        raise KernelError(f"backend {backend!r} is not available here; usable: {', '.join(backends())}")
    if backend == "cpu-emulator":
        from .emulator import find_compiler

        find_compiler()
    return backend


def record_path(path: str) -> None:
    _local.path = path


def last_path() -> "str | None":
    """The backend that ran the latest dispatch in this thread ("metal", "cuda", "cpu-emulator",
    "reference"), or None before any."""
    return getattr(_local, "path", None)


class MLXKernel:
    """A kernel built with ``mx.fast.metal_kernel`` or ``mx.fast.cuda_kernel``."""

    def __init__(self, kernel: Kernel, static: Mapping[str, int], backend: str):
        mx = _mlx()
        self.kernel, self.static, self.path = kernel, dict(static), backend
        name = f"tq_{kernel.name}_{kernel.digest(backend, static)}"
        make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
        from .kernel import mlx_sources

        source, header = mlx_sources(kernel, backend, static)
        self._fn = make(
            name=name,
            input_names=[n for n, _ in kernel.inputs],
            output_names=[n for n, _ in kernel.outputs],
            source=source,
            header=header,
            ensure_row_contiguous=True,
        )
        self._dtypes = {"float32": mx.float32, "int32": mx.int32, "uint32": mx.uint32,
                        "uint16": mx.uint16, "uint8": mx.uint8}

    def __call__(self, inputs: Sequence[Any], output_shapes: Sequence[tuple[int, ...]], grid, threads: int,
                 *, init: "float | None" = None, **_ignored) -> list[Any]:
        mx = _mlx()
        k = self.kernel
        gx, gy, gz = (tuple(grid) + (1, 1, 1))[:3]
        if threads < 1 or threads % 32:
            raise KernelError(f"kernel {k.name}: threads ({threads}) must be a positive multiple of 32")
        arrs = []
        for (name, dtype), a in zip(k.inputs, inputs):
            a = a if isinstance(a, mx.array) else mx.array(np.asarray(a))
            if a.dtype != self._dtypes[dtype]:
                raise KernelError(f"kernel {k.name}: input '{name}' must be {dtype}, got {a.dtype}")
            arrs.append(a)
        return self._fn(
            inputs=arrs,
            output_shapes=[tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in output_shapes],
            output_dtypes=[self._dtypes[d] for _, d in k.outputs],
            grid=(gx * threads, gy, gz),
            threadgroup=(threads, 1, 1),
            init_value=init,
        )


def build(kernel: Kernel, static: "Mapping[str, int] | None" = None, backend: str = "auto"):
    """The compiled ``kernel`` for ``static`` on ``backend`` (built once, then cached)."""
    static = kernel.check_static(static or {})
    backend = resolve(backend)
    if backend == "reference":
        raise KernelError(f"kernel {kernel.name}: the reference is not a kernel backend")
    key = (kernel, tuple(sorted(static.items())), backend)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is None:
            if backend == "cpu-emulator":
                from .emulator import EmulatedKernel

                hit = EmulatedKernel(kernel, static)
            else:
                hit = MLXKernel(kernel, static, backend)
            _cache[key] = hit
    return hit
