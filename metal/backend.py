"""Which backend runs a kernel here: GPU detection and backend resolution, in one place.

Backends: ``"metal"`` (Apple GPU), ``"cuda"`` (MLX's CUDA backend), ``"cpu-emulator"`` (the system
C++ compiler and the SIMT emulator) and ``"reference"`` (the numpy/MLX-ops reference, not a kernel).

Two rules read the same detection, because their callers need different answers when no GPU is
MLX's default device (tests/test_backend_resolution.py pins both on every kind of machine):

- :func:`resolve` (kernels built through ``dispatch.build``, ``quantize_append``): ``"auto"`` is the
  first of :func:`backends`, every usable backend best first. A GPU that is not MLX's default device
  comes after the emulator, so on a machine without a C++ compiler it still runs the kernel.
  Explicit names are checked and refused with the reason.
- :func:`pick_backend` (the fused decode attention): ``"auto"`` is the GPU only while MLX's default
  device is that GPU, else the CPU emulator; a user who set the CPU device gets the CPU. Explicit
  kernel backends pass through unchecked: the launch itself reports what is missing.

The decode lane's test setting lives here too: inside :func:`emulate_decode_lane`, on MLX's CPU
device, the GPU decode lane runs with its kernels on the CPU emulator (:func:`emulated_decode_lane`).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Iterator

from .kernel import KernelError

BACKEND_NAMES = ("metal", "cuda", "cpu-emulator", "reference")
KERNEL_BACKENDS = ("metal", "cuda", "cpu-emulator")
_EMULATED_LANE: "ContextVar[bool]" = ContextVar("tqbridge_emulated_decode_lane", default=False)


def _mlx():
    try:
        import mlx.core as mx
    except ImportError:
        return None
    return mx


@lru_cache(maxsize=1)
def gpu_kind() -> "str | None":
    """"metal" or "cuda" when MLX has that GPU backend here, else None (no MLX, or a probe failed).
    Asked once per process: the answer is on every kernel launch's path."""
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


def gpu_is_default() -> bool:
    """Whether MLX's default device is the GPU (a user who sets the CPU gets CPU paths on "auto")."""
    mx = _mlx()
    return mx is not None and mx.default_device() == mx.gpu


def backends() -> list[str]:
    """The backends usable here, best first: "metal" / "cuda", "cpu-emulator", "reference". The GPU
    comes first while MLX's default device is the GPU; after the emulator when it is the CPU."""
    from . import emulator

    out = []
    gpu = gpu_kind()
    try:
        emulator.find_compiler()
        out.append("cpu-emulator")
    except emulator.EmulatorError:
        pass
    if gpu:
        out.insert(0 if gpu_is_default() else len(out), gpu)
    out.append("reference")
    return out


def resolve(backend: str = "auto") -> str:
    """The concrete backend for ``backend`` ("auto" picks the first of :func:`backends`); an unknown
    or unavailable name raises :class:`KernelError` (no compiler: the emulator's EmulatorError)."""
    if backend == "auto":
        return backends()[0]
    if backend not in BACKEND_NAMES:
        raise KernelError(f"unknown backend {backend!r}; known: auto, {', '.join(BACKEND_NAMES)}")
    if backend in ("metal", "cuda") and gpu_kind() != backend:
        raise KernelError(f"backend {backend!r} is not available here; usable: {', '.join(backends())}")
    if backend == "cpu-emulator":
        from . import emulator

        emulator.find_compiler()
    return backend


def pick_backend(requested: str) -> str:
    """The fused attention's kernel backend: a kernel backend name as given; anything else
    ("auto") is Metal or CUDA when MLX's default device is that GPU, else the CPU emulator."""
    if requested in KERNEL_BACKENDS:
        return requested
    gpu = gpu_kind()
    if gpu is not None and gpu_is_default():
        return gpu
    return "cpu-emulator"


def emulated_decode_lane() -> bool:
    """Whether :func:`emulate_decode_lane` is in effect in this thread: on MLX's CPU device, the GPU
    decode step's kernels (in-place append, device growth, fused attention) run on the CPU emulator, so
    the GPU lane's logic is testable without a GPU (slow; tests and the parity lane level only)."""
    return _EMULATED_LANE.get()


@contextmanager
def emulate_decode_lane(on: bool = True) -> Iterator[None]:
    """``with emulate_decode_lane():`` the GPU decode lane on the CPU emulator while the block runs (in
    this thread; the previous setting is back on exit). TQCaches take the lane on MLX's CPU device."""
    token = _EMULATED_LANE.set(bool(on))
    try:
        yield
    finally:
        _EMULATED_LANE.reset(token)