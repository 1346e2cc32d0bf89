"""tqbridge.metal: kernels written once in the tqbridge dialect (Metal, CUDA, CPU emulator).

Public API::

    backends() -> list[str]             usable backends, best first ("metal"/"cuda", "cpu-emulator", "reference")
    Kernel, build(kernel, static, backend)  compile a dialect kernel once per static parameter set
    last_path() -> str | None           which backend the latest dispatch in this thread ran
"""

from .dispatch import backends, build, last_path, resolve
from .emulator import EmulatorError
from .kernel import Kernel, KernelError

__all__ = ["backends", "build", "last_path", "resolve", "Kernel", "KernelError", "EmulatorError"]
