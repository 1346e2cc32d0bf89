"""Hypothesis strategies for float rows that stress block quantizers.

Each row is float32, its length a multiple of ``block_size``, and its values come from one
adversarial *family* (see :data:`FAMILIES`). Rows are built from a few drawn parameters (family,
length, scale, seed) plus a handful of drawn point values, so hypothesis shrinks towards short
rows, simple families and small seeds. :func:`adversarial_rows` gives a fixed, deterministic set
of the same families for non-property checks (``tqbridge selfcheck``).

Usage::

    from hypothesis import given
    from tqbridge.parity.plugin.strategies import float_rows

    @given(float_rows(block_size=32, max_blocks=4))
    def test_roundtrip(x): ...
"""

from __future__ import annotations

import zlib
from typing import Iterable, Sequence

import numpy as np
from hypothesis import strategies as st

#: The value families, in the order :func:`adversarial_rows` cycles through them.
FAMILIES: tuple[str, ...] = (
    "zeros",        # all 0.0 or -0.0
    "all_equal",    # one value repeated (any sign, any magnitude)
    "tiny",         # float32 subnormals and values in float16's subnormal range
    "huge",         # magnitudes up to float32's max (scales overflow float16)
    "max_f16",      # +-65504 and neighbours, the largest finite float16
    "mixed_signs",  # alternating signs, uniform magnitudes
    "ties",         # values that land exactly on .5 (or an integer) after scaling by a power of two
    "outlier",      # a small Gaussian row with one large value
    "gaussian",     # N(0, s) with s drawn over many decades
)

#: Families producing non-finite values; only drawn when asked for.
NONFINITE_FAMILIES: tuple[str, ...] = ("nan", "inf")

F16_MAX = np.float32(65504.0)
F32_MAX = np.float32(np.finfo(np.float32).max)
F32_TINY = np.float32(np.finfo(np.float32).tiny)       # smallest normal float32
F32_SUB = np.float32(np.finfo(np.float32).smallest_subnormal)

# Integer extremes of the legacy ggml formats' scale search (q8_0: 127, q4_0: -8, q4_1: 15,
# q5_0: -16, q5_1: 31, iq4_nl: -127 / 113) and a few others, used by the ``ties`` family.
_TIE_PEAKS = (1, 7, 8, 15, 16, 31, 113, 127)


def check_int(name: str, value: int, *, min_value: int) -> int:
    """``value``, a strategy's integer argument ``name``: TypeError unless an int, ValueError below ``min_value``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    return int(value)


def _check_families(families: "Iterable[str] | None", *, allow_nan: bool, allow_infinity: bool) -> tuple[str, ...]:
    known = FAMILIES + NONFINITE_FAMILIES
    if families is None:
        fams = list(FAMILIES)
        if allow_nan:
            fams.append("nan")
        if allow_infinity:
            fams.append("inf")
        return tuple(fams)
    if isinstance(families, str):
        raise TypeError(f"families must be a sequence of names, not the string {families!r}")
    fams = tuple(families)
    if not fams:
        raise ValueError("families must not be empty")
    for f in fams:
        if f not in known:
            raise ValueError(f"unknown family {f!r}; known: {', '.join(known)}")
    if "nan" in fams and not allow_nan:
        raise ValueError("family 'nan' needs allow_nan=True")
    if "inf" in fams and not allow_infinity:
        raise ValueError("family 'inf' needs allow_infinity=True")
    return fams


def make_row(family: str, n: int, seed: int, *, scale_exp: int = 0, peak: int = 127) -> np.ndarray:
    """One float32 row of length ``n`` from ``family`` (deterministic in its arguments).

    ``scale_exp`` moves the magnitude by powers of two where the family has a free scale;
    ``peak`` is the integer extreme used by the ``ties`` family.
    """
    rng = np.random.default_rng(seed)
    f32 = np.float32
    if family == "zeros":
        return np.where(rng.random(n) < 0.5, f32(0.0), f32(-0.0)).astype(np.float32)
    if family == "all_equal":
        v = f32(rng.choice([-1.0, 1.0]) * np.ldexp(1.0 + rng.random(), scale_exp))
        if rng.random() < 0.3:
            v = f32(rng.choice([-1.0, 1.0]) * rng.choice([1.0, 0.5, 127.0, 8.0, 65504.0, 1e-30]))
        return np.full(n, v, np.float32)
    if family == "tiny":
        kind = rng.integers(3)
        if kind == 0:   # float32 subnormals (a few bits of mantissa)
            mag = rng.integers(1, 1 << 12, n).astype(np.float64) * float(F32_SUB)
        elif kind == 1:  # around float32's smallest normal
            mag = rng.random(n) * float(F32_TINY) * 4.0
        else:           # float16's subnormal range
            mag = rng.random(n) * 2.0 ** -14
        sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        x = (sign * mag).astype(np.float32)
        x[rng.random(n) < 0.1] = 0.0
        return x
    if family == "huge":
        top = float(F32_MAX) if rng.random() < 0.3 else float(np.ldexp(1.0, 100 + (scale_exp % 28)))
        x = (rng.uniform(-1.0, 1.0, n) * top).astype(np.float32)
        x[rng.integers(n)] = f32(rng.choice([-1.0, 1.0]) * top)
        return x
    if family == "max_f16":
        near = np.array([65504.0, 65519.0, 65520.0, 65488.0, 32768.0, 65504.0 * 127, 65504.0 * 8,
                         65504.0 * 16, 65504.0 * 31, 65504.0 * 15, 65504.0 * 127.5], np.float64)
        x = rng.choice(near, n) * np.where(rng.random(n) < 0.5, -1.0, 1.0)
        x = x.astype(np.float32)
        mask = rng.random(n) < 0.3
        x[mask] = rng.normal(0.0, 1000.0, int(mask.sum())).astype(np.float32)
        return x
    if family == "mixed_signs":
        mag = np.ldexp(rng.uniform(0.5, 1.0, n), scale_exp)
        sign = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
        if rng.random() < 0.5:
            sign = -sign
        return (sign * mag).astype(np.float32)
    if family == "ties":
        # Scale s = 2^scale_exp is exact, so x / s hits integers and half-integers exactly; one
        # element is +-peak*s, the extreme that fixes the block scale to s (or a simple multiple).
        s = np.ldexp(1.0, scale_exp)
        k = rng.integers(-peak, peak, n).astype(np.float64)
        half = rng.random(n) < 0.7
        x = (k + np.where(half, 0.5, 0.0)) * s
        x = np.clip(x, -peak * s, peak * s)
        sign = 1.0 if rng.random() < 0.5 else -1.0
        bs = 32 if n % 32 == 0 else n
        for b in range(0, n, bs):
            x[b + rng.integers(bs)] = sign * peak * s
        return x.astype(np.float32)
    if family == "outlier":
        x = rng.normal(0.0, 1.0, n) * np.ldexp(1.0, scale_exp)
        i = rng.integers(n)
        x[i] = rng.choice([-1.0, 1.0]) * np.ldexp(1.0, scale_exp) * rng.choice([10.0, 100.0, 1e4, 1e6])
        return x.astype(np.float32)
    if family == "gaussian":
        return (rng.normal(0.0, 1.0, n) * np.ldexp(1.0, scale_exp)).astype(np.float32)
    if family in ("nan", "inf"):
        x = (rng.normal(0.0, 1.0, n) * np.ldexp(1.0, scale_exp)).astype(np.float32)
        k = 1 + rng.integers(max(1, n // 8))
        idx = rng.choice(n, k, replace=False)
        if family == "nan":
            x[idx] = np.float32(np.nan)
        else:
            x[idx] = np.where(rng.random(k) < 0.5, -np.inf, np.inf).astype(np.float32)
        return x
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES + NONFINITE_FAMILIES)}")


@st.composite
def _rows(draw, *, block_size, min_blocks, max_blocks, families, min_scale_exp, max_scale_exp, patches):
    family = draw(st.sampled_from(families))
    n = block_size * draw(st.integers(min_blocks, max_blocks))
    seed = draw(st.integers(0, 2**32 - 1))
    scale_exp = draw(st.integers(min_scale_exp, max_scale_exp))
    peak = draw(st.sampled_from(_TIE_PEAKS))
    x = make_row(family, n, seed, scale_exp=scale_exp, peak=peak)
    if patches and family not in ("zeros", "all_equal", "ties"):
        # A few point values drawn by hypothesis itself, so it can also shrink and search directly.
        for _ in range(draw(st.integers(0, patches))):
            i = draw(st.integers(0, n - 1))
            x[i] = draw(st.floats(width=32, allow_nan=False, allow_infinity=False,
                                  min_value=-float(F16_MAX) * 4, max_value=float(F16_MAX) * 4))
    return x


def float_rows(
    *,
    block_size: int = 32,
    min_blocks: int = 1,
    max_blocks: int = 8,
    families: "Sequence[str] | None" = None,
    allow_nan: bool = False,
    allow_infinity: bool = False,
    min_scale_exp: int = -30,
    max_scale_exp: int = 30,
    patches: int = 2,
) -> st.SearchStrategy[np.ndarray]:
    """Float32 rows of ``block_size * k`` values, ``min_blocks <= k <= max_blocks``.

    ``families`` limits the value families (default: every finite one in :data:`FAMILIES`, plus
    ``"nan"`` / ``"inf"`` when ``allow_nan`` / ``allow_infinity``). ``min_scale_exp`` /
    ``max_scale_exp`` bound the power-of-two scale of families with a free scale. ``patches`` is
    the most point values overwritten by values drawn directly (0 disables).
    """
    block_size = check_int("block_size", block_size, min_value=1)
    min_blocks = check_int("min_blocks", min_blocks, min_value=1)
    max_blocks = check_int("max_blocks", max_blocks, min_value=1)
    if max_blocks < min_blocks:
        raise ValueError(f"max_blocks={max_blocks} is smaller than min_blocks={min_blocks}")
    min_scale_exp = check_int("min_scale_exp", min_scale_exp, min_value=-149)
    max_scale_exp = check_int("max_scale_exp", max_scale_exp, min_value=-149)
    if max_scale_exp < min_scale_exp:
        raise ValueError(f"max_scale_exp={max_scale_exp} is smaller than min_scale_exp={min_scale_exp}")
    if max_scale_exp > 127:
        raise ValueError(f"max_scale_exp={max_scale_exp} overflows float32 (at most 127)")
    patches = check_int("patches", patches, min_value=0)
    fams = _check_families(families, allow_nan=bool(allow_nan), allow_infinity=bool(allow_infinity))
    return _rows(block_size=block_size, min_blocks=min_blocks, max_blocks=max_blocks, families=fams,
                 min_scale_exp=min_scale_exp, max_scale_exp=max_scale_exp, patches=patches)


def float_matrices(
    *,
    block_size: int = 32,
    min_rows: int = 1,
    max_rows: int = 4,
    min_blocks: int = 1,
    max_blocks: int = 8,
    families: "Sequence[str] | None" = None,
    allow_nan: bool = False,
    allow_infinity: bool = False,
) -> st.SearchStrategy[np.ndarray]:
    """2-D float32 arrays (rows, block_size * k): each row drawn by :func:`float_rows`, same length."""
    min_rows = check_int("min_rows", min_rows, min_value=1)
    max_rows = check_int("max_rows", max_rows, min_value=1)
    if max_rows < min_rows:
        raise ValueError(f"max_rows={max_rows} is smaller than min_rows={min_rows}")
    check_int("min_blocks", min_blocks, min_value=1)
    if max_blocks < min_blocks:
        raise ValueError(f"max_blocks={max_blocks} is smaller than min_blocks={min_blocks}")

    @st.composite
    def build(draw):
        k = draw(st.integers(min_blocks, max_blocks))
        r = draw(st.integers(min_rows, max_rows))
        one = float_rows(block_size=block_size, min_blocks=k, max_blocks=k, families=families,
                         allow_nan=allow_nan, allow_infinity=allow_infinity)
        return np.stack([draw(one) for _ in range(r)])

    return build()


def adversarial_rows(*, block_size: int = 32, n_blocks: int = 4, per_family: int = 80,
                     seed: int = 0, families: "Sequence[str] | None" = None) -> np.ndarray:
    """A fixed (len(families) * per_family, block_size * n_blocks) float32 array covering every
    family with varied scales and tie peaks; the same arguments always give the same rows.
    The defaults give 9 * 80 = 720 rows."""
    block_size = check_int("block_size", block_size, min_value=1)
    n_blocks = check_int("n_blocks", n_blocks, min_value=1)
    per_family = check_int("per_family", per_family, min_value=1)
    fams = _check_families(families, allow_nan="nan" in (families or ()),
                           allow_infinity="inf" in (families or ()))
    n = block_size * n_blocks
    rows = []
    for fi, fam in enumerate(fams):
        for i in range(per_family):
            s = seed * 1_000_003 + zlib.crc32(fam.encode()) % 100_003 * 10_007 + i
            scale_exp = int((i * 7) % 61) - 30
            peak = _TIE_PEAKS[i % len(_TIE_PEAKS)]
            rows.append(make_row(fam, n, s, scale_exp=scale_exp, peak=peak))
    return np.stack(rows)
