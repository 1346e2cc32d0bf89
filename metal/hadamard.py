"""llama.cpp's KV rotation: the orthonormal Sylvester Hadamard matrix, applied block-diagonally.

llama.cpp (src/llama-kv-cache.cpp, PR #21038) multiplies K and V rows of ggml quantized types by
H_n / sqrt(n) before they enter the cache (see :func:`tqbridge.metal.codecs.rotation_group` for n).
H is symmetric and orthonormal, so it is its own inverse: (H q).(H k) = q.k, and H (sum p H v) =
sum p v. Here as MLX ops (a float32 matmul); the decode kernels rotate inside (a butterfly).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

_MATRICES: dict = {}


def hadamard_matrix(n: int) -> mx.array:
    """Orthonormal Sylvester Hadamard matrix of order ``n`` (float32)."""
    if n not in _MATRICES:
        h = np.ones((1, 1), np.float64)
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        _MATRICES[n] = mx.array((h / np.sqrt(n)).astype(np.float32))
    return _MATRICES[n]


def hadamard_rotate(x: mx.array, n: int) -> mx.array:
    """``x`` (..., D) times the block-diagonal Hadamard of order ``n`` (``n`` = 0: unchanged)."""
    if not n:
        return x
    shape = x.shape
    y = x.astype(mx.float32).reshape(*shape[:-1], shape[-1] // n, n) @ hadamard_matrix(n)
    return y.reshape(shape).astype(x.dtype)
