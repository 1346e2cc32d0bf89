"""The K/V spelling: one grammar, parsed and written here for every reader.

    SPELLING := PAIR GROUP*               q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]
    PAIR     := KSIDE ['/' SIDE]          K format / V format; one side alone: the same format for K and V
    KSIDE    := SIDE ['+' CALIBRATION]    key calibration after '+' on K: q5_1+mean+scale=0.75+rotated
    SIDE     := FORMAT ['@' VARIANT]      '@' means a format variant, nothing else: turbo3@g64
    GROUP    := '[' LAYERS '=' PAIR ']'   layers with their own pair: 0, -1 (the last), ranges 0-3
    LABEL    := SPELLING ['{' OPTIONS '}']  a bench label: decode options name=value[,...]
    LABELS   := LABEL (',' LABEL)*        ',' inside '[...]' or '{...}' does not split

The decode attention's q precision is the decode option ``q_precision`` of a label
(``q8_0/turbo3{q_precision=int8}``); the former ``q8_0/turbo3@int8`` is refused with a line naming it.
The option names and values are :meth:`tqbridge.metal.decode_options.DecodeOptions.parse`'s; this
module only says where their text sits. Formats resolve through the registry
(:func:`tqbridge.bridge.get_format`), key calibration through :class:`KeyCalibration` (its
statistics: :mod:`tqbridge.metal.lm.calibration`). Each parser has its writer (:func:`kv_name`,
:func:`layered_kv_name`, :func:`label_name`) and ``parse(write(x)) == x``.

The named defaults below are the one place where the package picks format names by itself (the
default cache format, the pairs that messages and help texts suggest, the default matrices of
``tqbridge parity`` and ``tqbridge quality``); every other module imports them. Per-format
decisions are not made here: they come from the registry entries (docs/adding-a-format.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .format_types import FormatError
from .registry import display_name, get_format, shown

__all__ = ["split_kv", "split_key_spec", "parse_kv", "parse_kv_spec", "kv_name", "LayeredKV", "parse_layered_kv_spec",
           "layered_kv_name", "is_layered", "qualify_variant", "TURBO_PREFIX", "split_top", "split_label", "label_name", "KeyCalibration",
           "CalibrationError", "BASES", "DEFAULT_ALPHA", "DEFAULT_FORMAT", "TURBO_FORMAT", "EXAMPLE_KV",
           "LLAMA_EXAMPLE_KV", "CALIBRATED_KV", "CALIBRATED_EXAMPLE_KV", "GENERATE_KV", "LOGITS_KV", "QUALITY_KV",
           "LAYERED_EXAMPLE_KV", "Q_PRECISION_EXAMPLE"]

# ---- the named defaults

# The cache format used where none is named: TQCache and make_cache, ``tqbridge generate``'s K and V,
# the transplant level, the teacher level's caches, the cache level when every pair asked for is float.
DEFAULT_FORMAT = "q8_0"
# The TurboQuant format picked where one is wanted (the V side of EXAMPLE_KV, ``tqbridge bench``).
TURBO_FORMAT = "turbo3"
# The K/V pair messages and help texts suggest; ``tqbridge bench attention``'s default K and V.
EXAMPLE_KV = f"{DEFAULT_FORMAT}/{TURBO_FORMAT}"
# A pair of two ggml formats llama.cpp takes (the llama.cpp side's message, the attention level's cases).
LLAMA_EXAMPLE_KV = "q8_0/q4_0"
# Keys calibrated per channel (help texts), and the shorter spelling parse_kv_spec's message suggests.
CALIBRATED_KV = "q5_1+mean+scale/q4_0"
CALIBRATED_EXAMPLE_KV = "q5_1+mean/q4_0"
# ``tqbridge generate --kv``'s default.
GENERATE_KV = f"{DEFAULT_FORMAT}/{DEFAULT_FORMAT}"
# The logits level's default pairs (``tqbridge parity`` without --kv): every ggml cache type llama.cpp's
# flash attention runs on, and two mixed pairs.
LOGITS_KV = ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/q4_0", "q8_0/iq4_nl")
# ``tqbridge quality``'s standard table (f16/f16 is always added).
QUALITY_KV = ("q8_0/q8_0", "q8_0/q4_0", "q4_0/q4_0", "q8_0/turbo4", "q8_0/turbo3", "q8_0/turbo2",
              "turbo4/turbo3", "turbo3/turbo3")
# The names of the TurboQuant formats begin so (a bare one takes a fork build's variant: qualify_variant).
TURBO_PREFIX = "turbo"
# A bench label with its q precision (help texts and the message refusing the former '@int8' suffix).
Q_PRECISION_EXAMPLE = f"{EXAMPLE_KV}{{q_precision=int8}}"
# The values of the decode option q_precision (tqbridge.metal.attention.problem.Q_PRECISIONS): after '@'
# they are the former bench spelling, refused with a line naming Q_PRECISION_EXAMPLE.
_FORMER_Q_SUFFIX = re.compile(r"@\s*(exact|int8)\s*$", re.IGNORECASE)


# ---- K/V pairs

def split_kv(spec: str, *, example: str = EXAMPLE_KV, noun: str = "K/V format pair",
             error: type[Exception] = FormatError) -> tuple[str, str]:
    """``q8_0/turbo3`` -> K ``q8_0``, V ``turbo3``; ``q8_0`` -> ``q8_0`` for both (sides stripped).

    Anything but one or two non-empty sides raises ``error`` with one line naming ``noun`` and the
    ``example`` to follow (each reader keeps its own wording). Only splits: format names are checked by
    :func:`parse_kv`, so readers without MLX (the llama.cpp side) can use it too."""
    parts = [p.strip() for p in str(spec).split("/")]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(parts):
        raise error(f"bad {noun} {shown(spec)}: write K/V, e.g. {example}")
    return parts[0], parts[1]


def _format(side: str) -> str:
    """The registered name of one side (``FORMAT[@VARIANT]``); the former q precision suffix gets its
    own line."""
    if str(side).rstrip().endswith("@"):
        raise FormatError(f"{shown(side)}: nothing after '@' (write a format variant, e.g. {TURBO_FORMAT}@g64)")
    try:
        return display_name(get_format(side))
    except FormatError:
        m = _FORMER_Q_SUFFIX.search(str(side))
        if m:
            raise FormatError(f"{shown(side)}: '@' names a format variant; the q precision is the decode option "
                              f"q_precision, e.g. tqbridge bench decode --caches '{Q_PRECISION_EXAMPLE}'") from None
        raise


def qualify_variant(name: str, variant: "str | None") -> str:
    """``turbo3`` -> ``turbo3@VARIANT``: a bare TurboQuant name means a llama.cpp build's own variant; a
    name with its variant written, another format, or no ``variant``: as written."""
    n = str(name).strip()
    if not variant or "@" in n or not n.lower().startswith(TURBO_PREFIX):
        return n
    return f"{n}@{variant}"


def parse_kv(spec: str) -> tuple[str, str]:
    """``q8_0/turbo3`` -> ``(q8_0, turbo3)``; ``q8_0`` means the same format for K and V."""
    k, v = split_kv(spec)
    return _format(k), _format(v)


def parse_kv_spec(spec: str) -> "tuple[str, str, KeyCalibration]":
    """``q5_1+mean+scale/q4_0`` -> ``(q5_1, q4_0, KeyCalibration(mean=True, scale=True))``.

    The K side may carry key calibration after ``+``; a bad spelling raises :class:`FormatError` with
    a one-line message."""
    k_side, v_side = split_kv(spec, example=f"{EXAMPLE_KV} or {CALIBRATED_EXAMPLE_KV}")
    try:
        kf, cal = split_key_spec(k_side)
    except CalibrationError as e:
        raise FormatError(str(e)) from None
    if "+" in v_side:
        raise FormatError(f"{shown(spec)}: calibration applies to keys only (write it after the K format)")
    return _format(kf), _format(v_side), cal


def kv_name(k: str, v: str, cal: "KeyCalibration | None" = None, *, short: bool = False) -> str:
    """The canonical spelling of a K/V pair with its key calibration (``short``: ``K`` alone where K
    and V are the same format and no calibration is given)."""
    if cal:
        return f"{k}+{cal.spec}/{v}"
    return k if short and k == v else f"{k}/{v}"


# ---- key calibration after '+' on the K side

BASES = ("original", "rotated")
DEFAULT_ALPHA = 0.5


class CalibrationError(ValueError):
    """A calibration spelling that means nothing (the message names the problem)."""


@dataclass(frozen=True)
class KeyCalibration:
    """Which per-channel key calibration a cache applies (what each tool does:
    :mod:`tqbridge.metal.lm.calibration`)."""

    mean: bool = False
    scale: bool = False
    alpha: float = DEFAULT_ALPHA
    basis: str = "original"
    queries: bool = False      # scale from key RMS over query RMS ("qscale")

    def __post_init__(self):
        if self.basis not in BASES:
            raise CalibrationError(f"calibration basis must be one of {BASES}, got {self.basis!r}")
        if not (0.0 < float(self.alpha) <= 1.0):
            raise CalibrationError(f"scale exponent must be in (0, 1], got {self.alpha}")
        if self.queries and not self.scale:
            raise CalibrationError("query statistics only apply to the scale")

    def __bool__(self) -> bool:
        return self.mean or self.scale

    @property
    def spec(self) -> str:
        """Canonical spelling without the leading ``+`` ("" when off)."""
        if not self:
            return ""
        parts = ["mean"] if self.mean else []
        if self.scale:
            name = "qscale" if self.queries else "scale"
            parts.append(name if self.alpha == DEFAULT_ALPHA else f"{name}={self.alpha:g}")
        if self.basis != "original":
            parts.append(self.basis)
        return "+".join(parts)

    @classmethod
    def parse(cls, text: "str | None") -> "KeyCalibration":
        """``"mean+scale=0.75"`` (also ``,``-separated), ``""``/``"none"``/None -> off."""
        if text is None or str(text).strip().lower() in ("", "none"):
            return cls()
        mean = scale = queries = False
        alpha, basis = DEFAULT_ALPHA, "original"
        for tok in str(text).replace(",", "+").split("+"):
            tok = tok.strip().lower()
            name, _, arg = tok.partition("=")
            if name == "mean" and not arg:
                mean = True
            elif name in ("scale", "qscale"):
                if scale:
                    raise CalibrationError(f"{shown(text)}: write one of scale, qscale")
                scale, queries = True, name == "qscale"
                if arg:
                    try:
                        alpha = float(arg)
                    except ValueError:
                        raise CalibrationError(f"bad scale exponent {shown(arg)} in {shown(text)}: "
                                               "write scale=A with 0 < A <= 1") from None
            elif name in BASES and not arg:
                basis = name
            else:
                raise CalibrationError(f"unknown key calibration {shown(tok)} in {shown(text)}: use mean, scale, "
                                       f"qscale (=A for an exponent), {' or '.join(BASES)}")
        if not (mean or scale):
            raise CalibrationError(f"key calibration {shown(text)} names no tool: add mean and/or scale")
        return cls(mean, scale, alpha, basis, queries)


def split_key_spec(k: str) -> "tuple[str, KeyCalibration]":
    """``q5_1+mean+scale`` -> ``(q5_1, KeyCalibration(mean=True, scale=True))`` (the format unresolved)."""
    fmt, sep, rest = str(k).strip().partition("+")
    if sep and not rest.strip():
        raise CalibrationError(f"{shown(k)}: nothing after '+' (write e.g. q5_1+mean+scale)")
    return fmt.strip(), KeyCalibration.parse(rest if sep else None)


# ---- per-layer K/V formats: a default pair, then groups of layers with their own pair
#
#     q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]          layers 0, 1 and the last two: q8_0/q8_0; the rest q8_0/turbo3
#     q8_0/turbo3[0-3=q8_0/q8_0][-1=f16]        a range (ends included), and a second group
#
# Square brackets: no single-pair spelling uses them, and a list of bench labels keeps a bracket group
# together when it splits at commas (:func:`split_top`). A negative index counts from the last layer
# (-1: the last). Indices are checked against a model by :meth:`LayeredKV.pairs` (out of range, or one
# layer named twice: one-line FormatError).

_INDEX = re.compile(r"-?[0-9]{1,6}")
LAYERED_EXAMPLE_KV = f"{EXAMPLE_KV}[0,1,-2,-1={GENERATE_KV}]"


def is_layered(spec: str) -> bool:
    """Whether ``spec`` is written with per-layer groups (brackets, well-formed or not)."""
    return "[" in str(spec) or "]" in str(spec)


@dataclass(frozen=True)
class LayeredKV:
    """A default K/V pair and groups of layers with their own pair (:func:`parse_layered_kv_spec`).

    ``groups``: ``((items, pair), ...)``, each item ``(first, last)`` as written (negative: from the
    last layer; ``first == last`` for one layer)."""

    default: tuple   # (K format, V format, KeyCalibration), as parse_kv_spec returns it
    groups: tuple = ()

    @property
    def name(self) -> str:
        """The canonical spelling (a pair's own spelling when no group is given)."""
        return layered_kv_name(self)

    def pairs(self, n_layers: int) -> "list[tuple]":
        """The pair of each of ``n_layers`` layers; FormatError (one line) for an index out of range
        or a layer named twice."""
        out: "list[tuple | None]" = [None] * n_layers
        named: dict = {}
        for items, pair in self.groups:
            for first, last in items:
                lo, hi = _layer(first, n_layers), _layer(last, n_layers)
                what = _item_name((first, last))
                if lo > hi:
                    raise FormatError(f"layers {what}: the range runs backwards in a model of {n_layers} layers")
                for i in range(lo, hi + 1):
                    if i in named:
                        raise FormatError(f"layer {i} is named twice ({named[i]} and {what}) in {shown(self.name)}")
                    named[i] = what
                    out[i] = pair
        return [self.default if p is None else p for p in out]


def _layer(i: int, n_layers: int) -> int:
    j = i + n_layers if i < 0 else i
    if not 0 <= j < n_layers:
        raise FormatError(f"layer {i} is out of range for a model of {n_layers} layers "
                          f"(0..{n_layers - 1}, or -{n_layers}..-1 from the last)")
    return j


def _item_name(item: tuple) -> str:
    first, last = item
    return str(first) if first == last else f"{first}-{last}"


def _parse_item(text: str, spec: str) -> tuple:
    t = text.strip()
    m = re.fullmatch(rf"({_INDEX.pattern})(?:-({_INDEX.pattern}))?", t)
    if not m:
        raise FormatError(f"bad layer {shown(t)} in {shown(spec)}: write an index (-1: the last layer) or a "
                          f"range such as 0-3, e.g. {LAYERED_EXAMPLE_KV}")
    first = int(m.group(1))
    return first, int(m.group(2)) if m.group(2) is not None else first


def parse_layered_kv_spec(spec: str) -> LayeredKV:
    """``q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]`` -> a :class:`LayeredKV` (default pair ``q8_0/turbo3``,
    layers 0, 1, -2, -1 ``q8_0/q8_0``); a spelling without brackets is one pair for every layer.

    Each pair is a :func:`parse_kv_spec` spelling (key calibration included). A bad spelling raises
    :class:`FormatError` with a one-line message; indices are checked against a model by
    :meth:`LayeredKV.pairs`."""
    s = str(spec).strip()
    head, _, _ = s.partition("[")
    if "]" in head:
        raise FormatError(f"{shown(spec)}: ']' without its '[' (write e.g. {LAYERED_EXAMPLE_KV})")
    if not head.strip() and s:
        raise FormatError(f"{shown(spec)}: the default pair comes first, e.g. {LAYERED_EXAMPLE_KV}")
    default = parse_kv_spec(head)
    groups = []
    pos = len(head)
    while pos < len(s):
        end = s.find("]", pos)
        body = s[pos + 1:end] if s[pos] == "[" and end > 0 else None
        if body is None or "[" in body:
            if _FORMER_Q_SUFFIX.search(s):
                _format(s)   # the former q precision suffix after the groups: its own line
            raise FormatError(f"{shown(spec)}: after the default pair, write groups [LAYERS=K/V], "
                              f"e.g. {LAYERED_EXAMPLE_KV}")
        layers, eq, pair = body.partition("=")
        if not eq or not layers.strip():
            raise FormatError(f"bad group {shown('[' + body + ']')} in {shown(spec)}: write [LAYERS=K/V], "
                              f"e.g. {LAYERED_EXAMPLE_KV}")
        items = tuple(_parse_item(t, spec) for t in layers.split(","))
        seen: set = set()
        for i in items:
            if i in seen:
                raise FormatError(f"layer {_item_name(i)} is written twice in {shown(spec)}")
            seen.add(i)
        groups.append((items, parse_kv_spec(pair)))
        pos = end + 1
    return LayeredKV(default, tuple(groups))


def layered_kv_name(spec: LayeredKV, *, short: bool = False) -> str:
    """The canonical spelling of a :class:`LayeredKV`: ``parse_layered_kv_spec(name) == spec``
    (``short``: a pair for every layer whose K and V agree is written ``K`` alone, :func:`kv_name`)."""
    out = kv_name(*spec.default, short=short and not spec.groups)
    for items, pair in spec.groups:
        out += f"[{','.join(_item_name(i) for i in items)}={kv_name(*pair)}]"
    return out


# ---- bench labels: a spelling with decode options in braces, and lists of them

def split_top(text: str, sep: str = ",") -> "list[str]":
    """``text`` split at ``sep`` outside braces and square brackets: ``"a,b{X=1,Y=2}"`` -> ``["a", "b{X=1,Y=2}"]``,
    ``"a[0,-1=b],c"`` -> ``["a[0,-1=b]", "c"]`` (per-layer groups); empty items dropped. An unbalanced
    bracket or brace: FormatError (one line)."""
    parts, depth, cur = [], {"{": 0, "[": 0}, []
    for ch in str(text):
        if ch in "{[":
            depth[ch] += 1
        elif ch in "}]":
            opening = "{" if ch == "}" else "["
            depth[opening] -= 1
            if depth[opening] < 0:
                raise FormatError(f"{shown(text)}: {ch!r} without its {opening!r}")
        if ch == sep and not any(depth.values()):
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    for opening, closing in (("{", "}"), ("[", "]")):
        if depth[opening]:
            raise FormatError(f"{shown(text)}: {opening!r} without its {closing!r}")
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p]


def split_label(label: str) -> "tuple[str, str]":
    """``"q8_0/turbo3{q_precision=int8}"`` -> ``("q8_0/turbo3", "q_precision=int8")``: a bench label's
    spelling and its decode options text ("" without braces; the fields are
    :meth:`~tqbridge.metal.decode_options.DecodeOptions.parse`'s). The spelling itself is not checked
    here, except for the former ``@int8`` / ``@exact`` suffix (FormatError naming the decode option)."""
    label = str(label)
    if "{" not in label and "}" not in label:
        base, opts = label, ""
    else:
        base, brace, rest = label.partition("{")
        if not brace or not rest.endswith("}") or "{" in rest or not base:
            raise FormatError(f"{shown(label)}: decode options go in one pair of braces after the name, e.g. "
                              f"{EXAMPLE_KV}{{device_params=0}}")
        opts = rest[:-1]
    if _FORMER_Q_SUFFIX.search(base):
        _format(base)
    return base, opts


def label_name(spelling: str, options: str = "") -> str:
    """The bench label of a spelling and its decode options text (:func:`split_label`'s inverse)."""
    return f"{spelling}{{{options}}}" if options else spelling
