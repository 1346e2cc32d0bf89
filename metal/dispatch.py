"""Builder and dispatcher: one compiled kernel per (kernel, static parameters, backend).

``build(kernel, static, backend)`` compiles once and caches; the result is called with the
per-call buffers (lengths and offsets go in a parameter buffer, never in ``static``). Which backend
``"auto"`` means is :mod:`.backend`'s answer.
``last_path()`` tells which path the latest dispatch in this thread ran.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from .backend import resolve
from .kernel import Kernel, KernelError

_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_local = threading.local()


def record_path(path: str) -> None:
    _local.path = path


def last_path() -> "str | None":
    """The backend that ran the latest dispatch in this thread ("metal", "cuda", "cpu-emulator",
    "reference"), or None before any."""
    return getattr(_local, "path", None)


class MLXKernel:
    """A kernel built with ``mx.fast.metal_kernel`` or ``mx.fast.cuda_kernel``. Calling it checks the
    inputs' dtypes and takes the grid in threadgroups; ``raw`` is MLX's own callable, for launch code
    that prepares its buffers once and repeats the call (the decode step)."""

    def __init__(self, kernel: Kernel, static: Mapping[str, int], backend: str):
        import mlx.core as mx

        self.kernel, self.static, self.path = kernel, dict(static), backend
        prefix = "" if kernel.name.startswith("tq_") else "tq_"
        name = f"{prefix}{kernel.name}_{kernel.digest(backend, static)}"
        make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
        from .kernel import mlx_sources

        source, header = mlx_sources(kernel, backend, static)
        self.raw = make(
            name=name,
            input_names=[n for n, _ in kernel.inputs],
            output_names=[n for n, _ in kernel.outputs],
            source=source,
            header=header,
            ensure_row_contiguous=True,
            # dynamic threadgroup memory (TQ_DYN_SHARED_ARRAY): CUDA only, MLX raises the launch's limit
            **({"shared_memory": int(static["TQ_DSMEM"])} if backend == "cuda" and static.get("TQ_DSMEM") else {}),
        )
        self._dtypes = {"float32": mx.float32, "int32": mx.int32, "uint32": mx.uint32,
                        "uint16": mx.uint16, "uint8": mx.uint8}

    def __call__(self, inputs: Sequence[Any], output_shapes: Sequence[tuple[int, ...]], grid, threads: int,
                 *, init: "float | None" = None, **_ignored) -> list[Any]:
        import mlx.core as mx

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
        return self.raw(
            inputs=arrs,
            output_shapes=[tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in output_shapes],
            output_dtypes=[self._dtypes[d] for _, d in k.outputs],
            grid=(gx * threads, gy, gz),
            threadgroup=(threads, 1, 1),
            init_value=init,
        )


def build(kernel: Kernel, static: "Mapping[str, int] | None" = None, backend: str = "auto"):
    """The compiled ``kernel`` for ``static`` on ``backend`` (built once, then cached). A kernel already
    built for a named backend is returned without resolving or checking again (launch code asks per call)."""
    items = tuple(sorted((static or {}).items()))
    if backend != "auto" and not any(isinstance(v, bool) for _, v in items):   # a bool is refused below
        hit = _cache.get((kernel, items, backend))
        if hit is not None:
            return hit
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
