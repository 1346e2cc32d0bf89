"""Hypothesis strategy for decode-attention problems, each with its float64 oracle.

An :class:`AttentionProblem` holds q ``(B, Hq, D)`` (or ``(B, Hq, T, D)``), K/V caches as blocks of a
format pair ``(B, Hkv, L_max, row_bytes)``, the valid lengths and the options (window, soft-cap,
sinks, scale): exactly the arguments of :func:`tqbridge.metal.decode_attention`. ``problem.oracle()``
gives the float64 answer and the error bound a float32 implementation must meet
(:mod:`tqbridge.metal.attention.ref`).

Usage::

    from hypothesis import given
    from tqbridge.parity.testing import attention_problems, assert_attention_close

    @given(attention_problems(k_formats=K_FORMATS, v_formats=V_FORMATS, max_length=64))
    def test_my_attention(p):
        assert_attention_close(my_attention(**p.kwargs()), *p.oracle())

with the registered names your kernel takes on each side (docs/plugin.md spells out an example).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st

from ...bridge import quantize as _quantize
from ...bridge.blocks.padding import pad_rows
from ...bridge.blocks.registry import all_formats
from .strategies import check_int
from .strategies_blocks import check_range, as_format

HEAD_DIMS = (64, 80, 96, 128, 192, 256)   # the head dims of the models the fork and mlx-lm serve
VALUE_KINDS = ("normal", "zeros", "tiny", "huge", "constant", "spike")


@dataclass
class AttentionProblem:
    """One decode-attention call: arguments of ``decode_attention`` and their oracle."""

    q: np.ndarray
    k_blocks: np.ndarray
    v_blocks: np.ndarray
    k_format: str
    v_format: str
    length: "int | tuple[int, ...]"
    scale: "float | None" = None
    window: "int | None" = None
    softcap: "float | None" = None
    sinks: "np.ndarray | None" = None
    values: str = "normal"
    start: "int | tuple[int, ...]" = 0   # each row's first visible key (drawn with ``starts=True``)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``decode_attention(**p.kwargs())`` (and for a user's kernel); ``start``
        only where it is not 0."""
        return dict(q=self.q, k_blocks=self.k_blocks, v_blocks=self.v_blocks, k_format=self.k_format,
                    v_format=self.v_format, length=self.length, scale=self.scale, window=self.window,
                    softcap=self.softcap, sinks=self.sinks, **({"start": self.start} if self.start else {}))

    @property
    def shape(self) -> tuple[int, ...]:
        """(B, Hq, Hkv, T, D, L_max): what a campaign counts as a distinct shape."""
        b, hq = self.q.shape[:2]
        t = 1 if self.q.ndim == 3 else self.q.shape[2]
        return (b, hq, self.k_blocks.shape[1], t, self.q.shape[-1], self.k_blocks.shape[2])

    def oracle(self, chain: "int | None" = None, q_precision: str = "exact") -> tuple[np.ndarray, np.ndarray]:
        """``(expected, bound)``, both shaped like q: float64 attention and the per-component error
        bound for a float32 implementation whose longest serial sum has ``chain`` terms (default:
        the cache length, the most conservative). ``q_precision="int8"``: for an implementation that
        quantizes q as llama.cpp's vec_dot does (tqbridge's kernel int8-mma)."""
        from ...metal.attention import check_problem
        from ...metal.attention.ref import oracle

        kw = self.kwargs()
        q, kb, vb = kw.pop("q"), kw.pop("k_blocks"), kw.pop("v_blocks")
        prob = check_problem(q, kb, vb, **kw)
        out, bound = oracle(self.q, self.k_blocks, self.v_blocks, prob, self.sinks, chain=chain,
                            q_precision=q_precision)
        if prob.squeeze_rows:
            out, bound = out[:, :, 0], bound[:, :, 0]
        return out, bound

    def _repr_pretty_(self, p, cycle) -> None:   # hypothesis and IPython print this
        p.text(repr(self))

    def __repr__(self) -> str:
        b, hq, hkv, t, d, lmax = self.shape
        opts = "".join(f", {k}={v!r}" for k, v in (("window", self.window), ("softcap", self.softcap),
                                                     ("scale", self.scale)) if v is not None)
        if self.sinks is not None:
            opts += ", sinks=..."
        if self.start:
            opts += f", start={self.start!r}"
        return (f"AttentionProblem({self.k_format}/{self.v_format}, B={b}, Hq={hq}, Hkv={hkv}, T={t}, D={d}, "
                f"L_max={lmax}, length={self.length!r}, values={self.values!r}{opts})")


def value_rows(rng, kind: str, shape, scale: float = 1.0) -> np.ndarray:
    """float32 K/V rows (B, H, L, D) of one value family (``VALUE_KINDS``; anything else: normal × scale)."""
    if kind == "zeros":
        x = np.zeros(shape)
    elif kind == "tiny":
        x = rng.standard_normal(shape) * 1e-6
    elif kind == "huge":
        x = rng.standard_normal(shape) * 3e3
    elif kind == "constant":
        x = np.ones(shape) * scale
    elif kind == "spike":          # one position dominates every score
        x = rng.standard_normal(shape) * 0.1
        x[:, :, shape[2] // 2] *= 400
    else:
        x = rng.standard_normal(shape) * scale
    return x.astype(np.float32)


@st.composite
def _problems(draw, *, kfs, vfs, min_batch, max_batch, min_kv_heads, max_kv_heads, min_group, max_group,
              head_dims, min_length, max_length, max_query_rows, windows, softcaps, sinks, per_row_lengths,
              values, q_dtypes, starts=False):
    kf, vf = as_format(draw(st.sampled_from(kfs))), as_format(draw(st.sampled_from(vfs)))
    b = draw(st.integers(min_batch, max_batch))
    hkv = draw(st.integers(min_kv_heads, max_kv_heads))
    g = draw(st.integers(min_group, max_group))
    d = draw(st.sampled_from(head_dims))
    t = draw(st.integers(1, max_query_rows))
    lmax = draw(st.integers(max(min_length, 1), max(max_length, 1)))
    if per_row_lengths and b > 1 and draw(st.booleans()):
        length: "int | tuple[int, ...]" = tuple(draw(st.integers(min_length, lmax)) for _ in range(b))
    else:
        length = draw(st.integers(min_length, lmax))
    kind = draw(st.sampled_from(values))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kscale, vscale = (float(np.exp2(draw(st.integers(-4, 4)))) for _ in range(2))
    k = value_rows(rng, kind, (b, hkv, lmax, d), kscale)
    v = value_rows(rng, kind, (b, hkv, lmax, d), vscale)
    qshape = (b, hkv * g, d) if t == 1 and draw(st.booleans()) else (b, hkv * g, t, d)
    q = rng.standard_normal(qshape).astype(draw(st.sampled_from(q_dtypes)))
    window = draw(st.integers(1, lmax + 2)) if windows and draw(st.booleans()) else None
    softcap = float(draw(st.sampled_from([5.0, 30.0, 50.0]))) if softcaps and draw(st.booleans()) else None
    sk = (rng.standard_normal(hkv * g) * 2).astype(np.float32) if sinks and draw(st.booleans()) else None
    start: "int | tuple[int, ...]" = 0
    if starts and draw(st.booleans()):   # a left-padded batch: each row's keys from its start
        rows = length if isinstance(length, tuple) else (length,) * b
        start = tuple(draw(st.integers(0, n)) for n in rows)
    return AttentionProblem(q, _quantize(kf, pad_rows(kf, k)), _quantize(vf, pad_rows(vf, v)), kf.key, vf.key,
                            length, None, window, softcap, sk, kind, start)


def attention_problems(
    *,
    k_formats: "Sequence[str] | None" = None,
    v_formats: "Sequence[str] | None" = None,
    min_batch: int = 1,
    max_batch: int = 2,
    min_kv_heads: int = 1,
    max_kv_heads: int = 4,
    min_group: int = 1,
    max_group: int = 8,
    head_dims: Sequence[int] = HEAD_DIMS,
    min_length: int = 0,
    max_length: int = 300,
    max_query_rows: int = 1,
    windows: bool = True,
    softcaps: bool = True,
    sinks: bool = True,
    per_row_lengths: bool = True,
    values: "Sequence[str] | None" = None,
    q_dtypes: Sequence[str] = ("float32",),
    starts: bool = False,
) -> st.SearchStrategy[AttentionProblem]:
    """Decode-attention problems (:class:`AttentionProblem`).

    The GQA ratio ``Hq / Hkv`` is drawn from ``min_group..max_group``; head dims from ``head_dims``
    (non-multiples of a format's block are zero-padded as the fork pads them); cache lengths
    ``min_length..max_length`` (0 allowed: a row that sees no key returns zeros); up to
    ``max_query_rows`` query rows (at most 4). ``windows`` / ``softcaps`` / ``sinks`` allow drawing
    those options; ``values`` limits the value families of K and V (:data:`VALUE_KINDS`); ``starts``
    draws per-row starts (``start=``, a left-padded batch) for a kernel that takes them.
    """
    every = [f.key for f in all_formats()]
    kfs = every if k_formats is None else [as_format(x).key for x in k_formats]
    vfs = every if v_formats is None else [as_format(x).key for x in v_formats]
    if not kfs or not vfs:
        raise ValueError("k_formats and v_formats must not be empty")
    min_batch, max_batch = check_range("min_batch", min_batch, "max_batch", max_batch)
    min_kv_heads, max_kv_heads = check_range("min_kv_heads", min_kv_heads, "max_kv_heads", max_kv_heads)
    min_group, max_group = check_range("min_group", min_group, "max_group", max_group)
    min_length, max_length = check_range("min_length", min_length, "max_length", max_length, min_value=0)
    if isinstance(head_dims, int):
        raise TypeError("head_dims must be a sequence of ints, e.g. (64, 128)")
    head_dims = tuple(check_int("head_dims entry", d, min_value=1) for d in head_dims)
    if not head_dims:
        raise ValueError("head_dims must not be empty")
    max_query_rows = check_int("max_query_rows", max_query_rows, min_value=1)
    if max_query_rows > 4:
        raise ValueError(f"max_query_rows={max_query_rows}: decode attention takes at most 4 query rows")
    vals = tuple(VALUE_KINDS if values is None else values)
    for v in vals:
        if v not in VALUE_KINDS:
            raise ValueError(f"unknown value family {v!r}; known: {', '.join(VALUE_KINDS)}")
    if not vals:
        raise ValueError("values must not be empty")
    for dt in q_dtypes:
        if dt not in ("float32", "float16"):
            raise ValueError(f"q_dtypes: {dt!r} is not float32 or float16 (numpy has no bfloat16)")
    return _problems(kfs=kfs, vfs=vfs, min_batch=min_batch, max_batch=max_batch, min_kv_heads=min_kv_heads,
                     max_kv_heads=max_kv_heads, min_group=min_group, max_group=max_group, head_dims=head_dims,
                     min_length=min_length, max_length=max_length, max_query_rows=max_query_rows,
                     windows=bool(windows), softcaps=bool(softcaps), sinks=bool(sinks),
                     per_row_lengths=bool(per_row_lengths), values=vals, q_dtypes=tuple(q_dtypes),
                     starts=bool(starts))
