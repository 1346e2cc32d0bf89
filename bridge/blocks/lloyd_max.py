"""Lloyd–Max scalar quantizers for a centred normal distribution (float64, closed-form integrals).

Used to derive (and to check) the centroid tables of the turbo formats: a TurboQuant group of
``d`` values, normalised to unit length and randomly rotated, has coordinates close to N(0, 1/d),
so its ideal ``2**bits``-level table is the standard-normal Lloyd–Max table scaled by 1/sqrt(d).

One Lloyd step maps centroids ``c`` to the conditional means of N(0, sigma^2) over the cells cut
at the midpoints ``(c[i] + c[i+1]) / 2``; a Lloyd–Max table is a fixed point of that step.
"""

from __future__ import annotations

import math

import numpy as np

_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


def _cdf(t: float) -> float:
    return 0.5 * math.erfc(-t / _SQRT2)


def _pdf(t: float) -> float:
    return math.exp(-0.5 * t * t) / _SQRT2PI if math.isfinite(t) else 0.0


def _cells(c: np.ndarray) -> list[tuple[float, float]]:
    mids = (c[:-1] + c[1:]) / 2.0
    edges = [-math.inf, *mids.tolist(), math.inf]
    return list(zip(edges[:-1], edges[1:]))


def lloyd_step(centroids, sigma: float = 1.0) -> np.ndarray:
    """One Lloyd iteration for N(0, sigma^2): the conditional mean of each midpoint cell."""
    c = np.asarray(centroids, dtype=np.float64) / sigma
    if c.ndim != 1 or c.size < 2 or not np.all(np.diff(c) > 0):
        raise ValueError("centroids must be a strictly ascending 1-d array of at least 2 values")
    out = [(_pdf(a) - _pdf(b)) / (_cdf(b) - _cdf(a)) for a, b in _cells(c)]
    return np.array(out) * sigma


def lloyd_max_normal(levels: int, sigma: float = 1.0, tol: float = 1e-15, max_iter: int = 100_000) -> np.ndarray:
    """The ``levels``-level Lloyd–Max centroids of N(0, sigma^2), ascending (iterated to ``tol``)."""
    if levels < 2:
        raise ValueError(f"levels must be at least 2, got {levels}")
    c = np.linspace(-2.0, 2.0, levels)
    for _ in range(max_iter):
        new = lloyd_step(c)
        if np.max(np.abs(new - c)) < tol:
            return new * sigma
        c = new
    raise RuntimeError(f"Lloyd iteration for {levels} levels did not converge to {tol} in {max_iter} steps")


def expected_mse(centroids, midpoints, sigma: float = 1.0) -> float:
    """E[(X - Q(X))^2] for X ~ N(0, sigma^2) and the quantizer (centroids, cell edges = midpoints)."""
    c = np.asarray(centroids, dtype=np.float64) / sigma
    m = np.asarray(midpoints, dtype=np.float64) / sigma
    if m.size != c.size - 1:
        raise ValueError(f"{c.size} centroids need {c.size - 1} midpoints, got {m.size}")
    edges = [-math.inf, *m.tolist(), math.inf]
    total = 0.0
    for ci, a, b in zip(c.tolist(), edges[:-1], edges[1:]):
        # integral over [a, b] of (t - ci)^2 phi(t) dt, with E[t^2 ; cell] = P + a phi(a) - b phi(b)
        p = _cdf(b) - _cdf(a)
        m1 = _pdf(a) - _pdf(b)
        m2 = p + (a * _pdf(a) if math.isfinite(a) else 0.0) - (b * _pdf(b) if math.isfinite(b) else 0.0)
        total += m2 - 2.0 * ci * m1 + ci * ci * p
    return total * sigma * sigma
