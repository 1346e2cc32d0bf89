"""The rows <-> blocks codecs of :class:`~tqbridge.metal.lm.cache.TQCache`: which path quantizes and
dequantizes a format's rows here (the GPU append kernel, MLX ops, MLX float views or the numpy
reference), the zero padding of a head to whole blocks, and llama.cpp's Hadamard rotation group.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from tqbridge.bridge import get_format
from tqbridge.bridge.blocks.padding import padded_dim

__all__ = ["padded_dim", "rotation_group", "quantizer", "dequantizer", "gpu_backend", "any_nonfinite"]

# Formats stored directly as MLX float bytes (byte-identical to the numpy reference: IEEE
# round-to-nearest-even casts, as ggml's F16/F32 rows).
_FLOAT_VIEW = {"f16": mx.float16, "f32": mx.float32}


def gpu_backend() -> "str | None":
    """"cuda" / "metal" when MLX's default device is a GPU with a kernel backend, else None.

    Inside :func:`tqbridge.metal.backend.emulate_decode_lane` (tests): on MLX's CPU device, run the GPU decode step's
    kernels (in-place append, device growth, fused attention) on the CPU SIMT emulator, writing into
    the MLX buffers through numpy views — the GPU lane's logic, testable without a GPU (slow)."""
    from .backend import emulated_decode_lane, gpu_is_default as _gpu_is_default, gpu_kind as _gpu_kind

    if _gpu_is_default():
        return _gpu_kind()
    return "cpu-emulator" if emulated_decode_lane() else None


# quantizer / dequantizer return (function, name of the path); the first usable path wins and is remembered.

def quantizer(fmt, use_kernel: bool = True) -> tuple[Callable[[mx.array], mx.array], str]:
    """Rows -> blocks (no NaN/inf check: the cache checks rows itself; iq4_nl through ggml's reference
    quantizer, what llama.cpp writes into its KV cache). On a GPU the quantize
    kernel; on the CPU the byte-identical MLX-ops codec (the kernel's CPU emulator exists to test
    kernel code, not to serve tokens), or the numpy reference where there is no MLX codec."""
    fmt = get_format(fmt)
    if fmt.key in _FLOAT_VIEW:
        dt = _FLOAT_VIEW[fmt.key]
        return (lambda x: x.astype(dt).view(mx.uint8)), "mlx-view"
    gpu = gpu_backend() if use_kernel else None
    if gpu is not None:
        from .quantize_append import quantize_rows, supported

        if supported(fmt):
            key = fmt.key
            return (lambda x: quantize_rows(key, x, gpu)), f"append-kernel:{gpu}"
    opts = dict(fmt.cache_options)   # the bytes llama.cpp writes into its cache (iq4_nl: no scale search)
    if getattr(fmt.codec, "mlx_quantize_blocks", None) is not None:
        from tqbridge.bridge import mlx_quantize
        return (lambda x: mlx_quantize(fmt, x, check_finite=False, **opts)), "mlx-ops"
    import numpy as np
    from tqbridge.bridge import quantize

    return (lambda x: mx.array(quantize(fmt, np.array(x.astype(mx.float32)), **opts))), "numpy"


def any_nonfinite(x: mx.array) -> mx.array:
    """A lazy uint32 scalar: 1 when ``x`` holds a NaN or an infinity."""
    return mx.any(mx.logical_not(mx.isfinite(x))).astype(mx.uint32).reshape(1)


def dequantizer(fmt) -> tuple[Callable[[mx.array, int], mx.array], str]:
    fmt = get_format(fmt)
    if fmt.key in _FLOAT_VIEW:
        dt = _FLOAT_VIEW[fmt.key]
        return (lambda b, n: b.view(dt)), "mlx-view"
    if getattr(fmt.codec, "mlx_dequantize_blocks", None) is not None:
        from tqbridge.bridge import mlx_dequantize
        return (lambda b, n: mlx_dequantize(fmt, b, n)), "mlx-ops"
    import numpy as np
    from tqbridge.bridge import dequantize

    return (lambda b, n: mx.array(dequantize(fmt, np.array(b), n))), "numpy"


def rotation_group(fmt, dim: int, side: str) -> int:
    """The Hadamard group llama.cpp rotates a ``side`` ("k"/"v") of ``dim`` values with, or 0.

    llama.cpp (src/llama-kv-cache.cpp, PR #21038) rotates K and V rows of ggml quantized types when
    the head dim is a multiple of 64: K by the largest power of two dividing it, V by 64 (block
    diagonal). Float formats are not rotated; turbo formats rotate inside the format instead.
    """
    if get_format(fmt).kind != "ggml" or dim % 64:
        return 0
    if side == "v":
        return 64
    n = 64
    while dim % (2 * n) == 0:
        n *= 2
    return n
