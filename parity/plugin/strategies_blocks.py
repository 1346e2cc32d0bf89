"""Hypothesis strategies for quantized blocks of any registered format, and for KV caches.

- :func:`format_names`: names from the registry (optionally only some kinds, or extensions).
- :func:`blocks`: valid uint8 blocks ``(rows, row_bytes)`` of one format, made either by quantizing
  drawn float rows (what a quantizer writes) or from raw fields (every code value, any finite scale).
- :func:`malformed_blocks`: deliberately broken input, as a :class:`Malformed` that says what is
  wrong (wrong length, NaN or inf scale, wrong dtype) and what the reference does with it.
- :func:`kv_caches`: an :class:`AppendSequence`, a sequence of row appends to a K/V cache of one format pair.

Usage: ``@given(blocks(fmt=<a registered name>, max_rows=4))`` on a test of your dequantizer
(``from tqbridge.parity.testing import blocks``); docs/plugin.md has a complete test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from hypothesis import strategies as st

from ...bridge import FormatError, get_format
from ...bridge import quantize as _quantize
from ...bridge.blocks.format_types import Format
from ...bridge.blocks.padding import pad_rows
from ...bridge.blocks.registry import all_formats
from .strategies import check_int, float_rows

KINDS = ("float", "ggml", "turbo")
MALFORMED_KINDS = ("wrong_length", "nan_scale", "inf_scale", "wrong_dtype")


def as_format(fmt) -> Format:
    """The registry format a strategy's argument names; ValueError (not FormatError) for an unknown one."""
    try:
        return get_format(fmt)
    except FormatError as e:
        raise ValueError(str(e)) from None


def format_names(*, kinds: "Sequence[str] | None" = None, extensions: bool = True,
                 exclude: Sequence[str] = ()) -> st.SearchStrategy[str]:
    """Registered format keys (q8_0, turbo3@fork-pr197 ...), simplest first.

    ``kinds`` limits them to some of ``"float"``, ``"ggml"``, ``"turbo"``; ``extensions=False``
    leaves out tqbridge's own formats (turbo ``@g64``) that no other runtime reads.
    """
    if isinstance(kinds, str):
        raise TypeError(f"kinds must be a sequence of names, not the string {kinds!r}")
    kinds = tuple(KINDS if kinds is None else kinds)
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"unknown format kind {k!r}; known: {', '.join(KINDS)}")
    skip = {as_format(e).key for e in exclude}
    keys = [f.key for f in all_formats() if f.kind in kinds and (extensions or not f.extension) and f.key not in skip]
    if not keys:
        raise ValueError("no registered format matches these arguments")
    return st.sampled_from(keys)


def scale_offsets(fmt) -> tuple[int, ...]:
    """Byte offsets of the fp16 scale fields of one block (d, m, turbo norm); empty for float formats."""
    f = as_format(fmt)
    if f.kind == "float":
        return ()
    if f.kind == "turbo":
        return (0,)
    return (0, 2) if f.layout is not None and f.layout.has_m else (0,)


def _finite_f16_bits(draw, *, nonneg: bool = False) -> int:
    exp = 15 + draw(st.integers(-15, 15))    # 31 would be inf/NaN; shrinks towards 2**0
    mant = draw(st.integers(0, 1023))
    sign = 0 if nonneg else draw(st.integers(0, 1))
    return (sign << 15) | (exp << 10) | mant


@st.composite
def _raw_blocks(draw, f: Format, rows: int, nblk: int) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n_total = rows * nblk
    if f.kind == "float":
        n = rows * nblk * f.block_size
        if f.key == "f32":
            v = (rng.standard_normal(n) * np.exp2(draw(st.integers(-20, 20)))).astype("<f4")
            return v.view(np.uint8).reshape(rows, -1)
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        exp_mask, exp_shift = (0x7C00, 10) if f.key == "f16" else (0x7F80, 7)
        full = exp_mask >> exp_shift
        exps = (bits & exp_mask) >> exp_shift
        bits = np.where(exps == full, bits & ~np.uint16(1 << exp_shift), bits).astype("<u2")  # no inf/NaN
        return bits.view(np.uint8).reshape(rows, -1)
    b = rng.integers(0, 256, (n_total, f.type_size), dtype=np.uint16).astype(np.uint8)
    for off in scale_offsets(f):
        bits = rng.integers(0, 1 << 16, n_total, dtype=np.uint32).astype(np.uint16)
        bits = np.where(((bits >> 10) & 0x1F) == 31, bits & 0xBFFF, bits).astype(np.uint16)  # finite only
        bits[0] = _finite_f16_bits(draw)   # one scale drawn directly, so hypothesis can shrink it
        b[:, off:off + 2] = bits.astype("<u2").view(np.uint8).reshape(n_total, 2)
    if f.kind == "turbo":
        spec = f.codec.spec
        if spec.rnorm_offset is not None:
            b[:, spec.rnorm_offset:spec.rnorm_offset + 2] = 0   # the fork writes 0 there
    return b.reshape(rows, nblk * f.type_size)


@st.composite
def _blocks(draw, *, fmt, min_rows, max_rows, min_blocks, max_blocks, source):
    f = as_format(draw(st.sampled_from(fmt)) if isinstance(fmt, list) else fmt)
    rows = draw(st.integers(min_rows, max_rows))
    nblk = draw(st.integers(min_blocks, max_blocks))
    how = draw(st.sampled_from(source))
    if how == "quantized":
        bs = f.block_size if f.kind != "float" else 32
        k = nblk if f.kind != "float" else 1
        x = np.stack([draw(float_rows(block_size=bs, min_blocks=k, max_blocks=k)) for _ in range(rows)])
        if f.kind == "float":
            x = x[:, :nblk]
        return _quantize(f, x)
    return draw(_raw_blocks(f, rows, nblk))


def check_range(lo_name, lo, hi_name, hi, *, min_value=1):
    """``(lo, hi)``, two integer arguments of a strategy, each checked by :func:`~.strategies.check_int`;
    ValueError when ``hi < lo``."""
    lo = check_int(lo_name, lo, min_value=min_value)
    hi = check_int(hi_name, hi, min_value=min_value)
    if hi < lo:
        raise ValueError(f"{hi_name}={hi} is smaller than {lo_name}={lo}")
    return lo, hi


def blocks(*, fmt: "str | Sequence[str]", min_rows: int = 1, max_rows: int = 4, min_blocks: int = 1,
           max_blocks: int = 4, source: "str | None" = None) -> st.SearchStrategy[np.ndarray]:
    """Valid uint8 blocks ``(rows, k * type_size)`` of ``fmt`` (one name, or several to draw from).

    ``source``: ``"quantized"`` (the reference quantizer applied to adversarial float rows),
    ``"raw"`` (random codes with any finite fp16 scale: every code value, including ones a
    quantizer never writes) or ``None`` for both. Draw the format with :func:`format_names` and
    ``st.data()`` when the test needs to know it, or use :func:`format_blocks`.
    """
    fmts = [fmt] if isinstance(fmt, (str, Format)) else list(fmt)
    if not fmts:
        raise ValueError("fmt must name at least one format")
    for f in fmts:
        as_format(f)
    min_rows, max_rows = check_range("min_rows", min_rows, "max_rows", max_rows)
    min_blocks, max_blocks = check_range("min_blocks", min_blocks, "max_blocks", max_blocks)
    if source not in (None, "quantized", "raw"):
        raise ValueError(f"source must be 'quantized', 'raw' or None, got {source!r}")
    src = ("quantized", "raw") if source is None else (source,)
    one = fmts[0] if len(fmts) == 1 else [as_format(f).key for f in fmts]
    return _blocks(fmt=one, min_rows=min_rows, max_rows=max_rows, min_blocks=min_blocks,
                   max_blocks=max_blocks, source=src)


def format_blocks(*, formats: "st.SearchStrategy[str] | None" = None, **kwargs) -> st.SearchStrategy[tuple[str, np.ndarray]]:
    """``(format key, blocks)`` pairs: a format from ``formats`` (default: every registered one), then
    :func:`blocks` of it with ``kwargs``."""
    fs = format_names() if formats is None else formats
    return fs.flatmap(lambda k: st.tuples(st.just(k), blocks(fmt=k, **kwargs)))


@dataclass(frozen=True)
class Malformed:
    """Broken input for a dequantizer: ``data`` is wrong in the way ``kind`` says.

    ``n`` is the row length the data claims; ``raises``: whether :func:`tqbridge.bridge.dequantize`
    refuses it (with ``FormatError``); else it decodes, and ``nonfinite_blocks`` lists the blocks
    (flat indices) whose values the reference makes NaN or ±inf.
    """

    fmt: str
    kind: str
    data: np.ndarray
    n: int
    raises: bool
    nonfinite_blocks: tuple[int, ...] = field(default=())

    def _repr_pretty_(self, p, cycle) -> None:   # hypothesis and IPython print this
        p.text(repr(self))

    def __repr__(self) -> str:
        return (f"Malformed(fmt={self.fmt!r}, kind={self.kind!r}, shape={self.data.shape}, "
                f"dtype={self.data.dtype}, n={self.n}, raises={self.raises})")


@st.composite
def _malformed(draw, *, fmts, kinds, max_rows, max_blocks):
    f = as_format(draw(st.sampled_from(fmts)))
    allowed = [k for k in kinds if not (k in ("nan_scale", "inf_scale") and f.kind == "float")]
    if not allowed:
        allowed = ["wrong_length"]
    kind = draw(st.sampled_from(allowed))
    good = draw(blocks(fmt=f.key, max_rows=max_rows, max_blocks=max_blocks, source="raw"))
    rows, nbytes = good.shape
    n = nbytes // f.type_size * f.block_size
    if kind == "wrong_length":
        cut = draw(st.integers(1, f.type_size - 1)) if f.type_size > 1 else 1
        extra = draw(st.booleans())
        if extra:
            data = np.concatenate([good, np.zeros((rows, cut), np.uint8)], axis=1)
        else:
            data = np.ascontiguousarray(good[:, :nbytes - cut]) if nbytes > cut else np.zeros((rows, 0), np.uint8)
        return Malformed(f.key, kind, data, n, True)
    if kind == "wrong_dtype":
        data = good.astype(draw(st.sampled_from([np.int8, np.uint16, np.float32])))
        return Malformed(f.key, kind, data, n, True)
    # a non-finite fp16 scale in some blocks
    blk = good.reshape(-1, f.type_size).copy()
    which = sorted(set(draw(st.lists(st.integers(0, blk.shape[0] - 1), min_size=1, max_size=3))))
    off = draw(st.sampled_from(scale_offsets(f)))
    if kind == "nan_scale":
        bits = 0x7C00 | draw(st.integers(1, 1023)) | (draw(st.integers(0, 1)) << 15)
    else:
        bits = 0x7C00 | (draw(st.integers(0, 1)) << 15)
    for i in which:
        blk[i, off:off + 2] = np.array([bits], "<u2").view(np.uint8)
    return Malformed(f.key, kind, blk.reshape(rows, nbytes), n, False, tuple(which))


def malformed_blocks(*, fmt: "str | Sequence[str] | None" = None, kinds: "Sequence[str] | None" = None,
                     max_rows: int = 3, max_blocks: int = 3) -> st.SearchStrategy[Malformed]:
    """Deliberately malformed blocks (:class:`Malformed`) of ``fmt`` (default: every format).

    ``kinds``: some of ``"wrong_length"`` (bytes not a whole number of blocks), ``"nan_scale"`` /
    ``"inf_scale"`` (a non-finite fp16 scale or turbo norm in some blocks; not for float formats),
    ``"wrong_dtype"`` (not uint8).
    """
    if isinstance(kinds, str):
        raise TypeError(f"kinds must be a sequence of names, not the string {kinds!r}")
    kinds = tuple(MALFORMED_KINDS if kinds is None else kinds)
    for k in kinds:
        if k not in MALFORMED_KINDS:
            raise ValueError(f"unknown malformation {k!r}; known: {', '.join(MALFORMED_KINDS)}")
    if fmt is None:
        fmts = [f.key for f in all_formats()]
    else:
        fmts = [as_format(x).key for x in ([fmt] if isinstance(fmt, (str, Format)) else fmt)]
    check_int("max_rows", max_rows, min_value=1)
    check_int("max_blocks", max_blocks, min_value=1)
    return _malformed(fmts=fmts, kinds=kinds, max_rows=max_rows, max_blocks=max_blocks)


@dataclass
class AppendSequence:
    """K/V rows appended in steps to a cache of one format pair, and the blocks the reference makes.

    ``steps[i]`` is ``(k_rows, v_rows)``, each float32 ``(B, Hkv, n_i, head_dim)``; ``k_blocks`` /
    ``v_blocks`` hold every appended row quantized by :func:`tqbridge.bridge.quantize` after
    zero-padding to whole blocks, ``(B, Hkv, length, row_bytes)``.
    """

    k_format: str
    v_format: str
    head_dim: int
    steps: list
    k_blocks: np.ndarray
    v_blocks: np.ndarray

    @property
    def length(self) -> int:
        return int(self.k_blocks.shape[2])

    def _repr_pretty_(self, p, cycle) -> None:   # hypothesis and IPython print this
        p.text(repr(self))

    def __repr__(self) -> str:
        return (f"AppendSequence(k_format={self.k_format!r}, v_format={self.v_format!r}, head_dim={self.head_dim}, "
                f"steps={[s[0].shape[2] for s in self.steps]}, shape={self.k_blocks.shape[:3]})")


@st.composite
def _kv_caches(draw, *, kfs, vfs, head_dims, max_batch, max_kv_heads, max_steps, max_step_rows):
    kf = as_format(draw(st.sampled_from(kfs)))
    vf = as_format(draw(st.sampled_from(vfs)))
    d = draw(st.sampled_from(head_dims))
    b = draw(st.integers(1, max_batch))
    h = draw(st.integers(1, max_kv_heads))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        n = draw(st.integers(1, max_step_rows))
        sk, sv = (float(np.exp2(draw(st.integers(-8, 8)))) for _ in range(2))
        steps.append(((rng.standard_normal((b, h, n, d)) * sk).astype(np.float32),
                      (rng.standard_normal((b, h, n, d)) * sv).astype(np.float32)))
    k = np.concatenate([s[0] for s in steps], axis=2)
    v = np.concatenate([s[1] for s in steps], axis=2)
    return AppendSequence(kf.key, vf.key, d, steps, _quantize(kf, pad_rows(kf, k)), _quantize(vf, pad_rows(vf, v)))


def kv_caches(*, k_formats: "Sequence[str] | None" = None, v_formats: "Sequence[str] | None" = None,
              head_dims: Sequence[int] = (64, 80, 128), max_batch: int = 2, max_kv_heads: int = 4,
              max_steps: int = 4, max_step_rows: int = 8) -> st.SearchStrategy[AppendSequence]:
    """An :class:`AppendSequence`: 1..``max_steps`` appends of 1..``max_step_rows`` rows each."""
    every = [f.key for f in all_formats()]
    kfs = every if k_formats is None else [as_format(x).key for x in k_formats]
    vfs = every if v_formats is None else [as_format(x).key for x in v_formats]
    if not kfs or not vfs:
        raise ValueError("k_formats and v_formats must not be empty")
    head_dims = tuple(check_int("head_dims entry", d, min_value=1) for d in head_dims)
    if not head_dims:
        raise ValueError("head_dims must not be empty")
    for name, v in (("max_batch", max_batch), ("max_kv_heads", max_kv_heads), ("max_steps", max_steps),
                    ("max_step_rows", max_step_rows)):
        check_int(name, v, min_value=1)
    return _kv_caches(kfs=kfs, vfs=vfs, head_dims=head_dims, max_batch=max_batch, max_kv_heads=max_kv_heads,
                      max_steps=max_steps, max_step_rows=max_step_rows)
