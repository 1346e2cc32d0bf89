"""tqbridge.metal: kernels written once in the tqbridge dialect (Metal, CUDA, CPU emulator).

Public API::

    backends() -> list[str]             usable backends, best first ("metal"/"cuda" while MLX's default device is the GPU, "cpu-emulator", "reference")
    Kernel, build(kernel, static, backend)  compile a dialect kernel once per static parameter set
    last_path() -> str | None           which backend the latest dispatch in this thread ran
    quantize_append(fmt, rows, backend="auto")  float rows -> blocks, byte-identical to bridge.quantize
    decode_attention(q, k_blocks, v_blocks, k_format=, v_format=, length=)  fused attention over any K/V pair
    DecodeOptions(...)                  how the fused decode attention is planned and launched (decode_options)
"""

from .backend import backends, resolve
from .dispatch import build, last_path
from .emulator import EmulatorError
from .kernel import Kernel, KernelError
from .quantize_append import quantize_append
from .attention import AttentionError, decode_attention
from .decode_options import DecodeOptions

__all__ = ["backends", "build", "last_path", "resolve", "Kernel", "KernelError", "EmulatorError", "quantize_append",
           "AttentionError", "decode_attention", "DecodeOptions"]
