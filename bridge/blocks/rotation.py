"""The TurboQuant rotation: random-sign Walsh–Hadamard transform on 128- (or 64-) value groups.

Forward ``R = scale * D(s2) H D(s1)`` with ``H`` the unnormalised Sylvester Hadamard butterfly
(stages h = 1, 2, 4, ... , group/2), ``s1``/``s2`` fixed ±1 tables and ``scale = 1/sqrt(group)``
as a float32 constant. The inverse is the same transform with ``s1`` and ``s2`` swapped.

Float32 operation order follows the fork's C reference (``turbo_cpu_fwht`` in
``ggml/src/ggml-turbo-quant.c``): multiply by s1; butterflies ``(a + b, a - b)`` stage by stage;
multiply by ``(scale * s2)``. numpy and MLX versions do the same operations in the same order, so
they agree bit for bit with each other and with the C code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Sign tables of the fork (seed 42), index 0 first; '-' = -1, '+' = +1. Source: TheTom/llama-cpp-turboquant
# ggml/src/ggml-turbo-quant.c (turbo_cpu_s1 / turbo_cpu_s2), identical in both fork variants.
_S1 = "-++--+-+--+++++++-+-+--+++-++----++-++-+-++--+-++++-----+-++++-+--+---+---+---+++--+++--++-++-+--++-+-+-++++-+-++-++-----++-++-+"
_S2 = "++++-++-+---+---++--+-+-+--+-+++++---+------+++-+-+++--+------+++-+----+-+-+--++-+-++-+----+--+-+-+++--+-+-++--+-+-++-+-+-----+-"


def _signs(s: str) -> np.ndarray:
    a = np.array([1.0 if c == "+" else -1.0 for c in s], dtype=np.float32)
    a.setflags(write=False)
    return a


S1 = _signs(_S1)
S2 = _signs(_S2)
assert S1.shape == S2.shape == (128,)

# 1/sqrt(group) as the C float32 literals (0.08838834764831845f for 128; 0.125f for 64).
SCALES = {128: np.float32(0.08838834764831845), 64: np.float32(0.125)}
GROUPS = tuple(sorted(SCALES))


def _check_group(group: int) -> int:
    if group not in SCALES:
        raise ValueError(f"rotation group must be one of {GROUPS}, got {group}")
    return group


def sign_tables(group: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """``(s1, s2)`` for ``group`` values: the first ``group`` entries of the 128-entry tables."""
    _check_group(group)
    return S1[:group], S2[:group]


def butterfly_np(u: np.ndarray, group: int) -> np.ndarray:
    lead = u.shape[:-1]
    h = 1
    while h < group:
        v = u.reshape(*lead, group // (2 * h), 2, h)
        a = v[..., 0, :]
        b = v[..., 1, :]
        u = np.stack([a + b, a - b], axis=-2).reshape(*lead, group)
        h *= 2
    return u


def _apply_np(x: np.ndarray, first: np.ndarray, last: np.ndarray, group: int) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"rotation works on float32 arrays, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != group:
        raise ValueError(f"rotation over groups of {group}: last axis has length {x.shape[-1] if x.ndim else 0}")
    post = (SCALES[group] * last).astype(np.float32)  # C: x[i] *= inv_sqrt * s[i]
    with np.errstate(over="ignore", invalid="ignore"):
        u = x * first
        u = butterfly_np(u, group)
        return u * post


def forward(x: np.ndarray, group: int = 128) -> np.ndarray:
    """Rotate float32 groups (..., group) into the basis the blocks are stored in."""
    s1, s2 = sign_tables(group)
    return _apply_np(x, s1, s2, group)


def inverse(y: np.ndarray, group: int = 128) -> np.ndarray:
    """Undo :func:`forward` (exact up to float32 rounding)."""
    s1, s2 = sign_tables(group)
    return _apply_np(y, s2, s1, group)


def matrix(group: int = 128) -> np.ndarray:
    """The forward rotation as a float64 matrix ``R`` (``forward(x) ~= R @ x``), scale exactly 1/sqrt(group)."""
    s1, s2 = sign_tables(group)
    h = np.ones((1, 1))
    while h.shape[0] < group:
        h = np.block([[h, h], [h, -h]])
    return (s2.astype(np.float64)[:, None] * h * s1.astype(np.float64)[None, :]) / np.sqrt(group)


# ----- MLX -----

def _butterfly_mx(mx: Any, u: Any, group: int) -> Any:
    lead = tuple(u.shape[:-1])
    h = 1
    while h < group:
        v = u.reshape(*lead, group // (2 * h), 2, h)
        a = v[..., 0, :]
        b = v[..., 1, :]
        u = mx.stack([a + b, a - b], axis=-2).reshape(*lead, group)
        h *= 2
    return u


def _apply_mx(x: Any, first: np.ndarray, last: np.ndarray, group: int) -> Any:
    import mlx.core as mx

    if x.dtype != mx.float32:
        raise TypeError(f"rotation works on float32 arrays, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != group:
        raise ValueError(f"rotation over groups of {group}: last axis has length {x.shape[-1] if x.ndim else 0}")
    post = mx.array((SCALES[group] * last).astype(np.float32))
    u = x * mx.array(first)
    u = _butterfly_mx(mx, u, group)
    return u * post


def mlx_forward(x: Any, group: int = 128) -> Any:
    """MLX twin of :func:`forward` (bit-identical)."""
    s1, s2 = sign_tables(group)
    return _apply_mx(x, s1, s2, group)


def mlx_inverse(y: Any, group: int = 128) -> Any:
    """MLX twin of :func:`inverse` (bit-identical)."""
    s1, s2 = sign_tables(group)
    return _apply_mx(y, s2, s1, group)
