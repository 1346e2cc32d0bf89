"""K/V format pairs as spelled on command lines and in reports, resolved to registered format names
(:func:`parse_kv`, :func:`parse_kv_spec`) and written back (:func:`kv_name`). The shape of a spelling
is :func:`tqbridge.bridge.kv_spec.split_kv`'s; this module adds the format names and the key
calibration after ``+``, and per-layer pairs (:func:`parse_layered_kv_spec`, :func:`layered_kv_name`):
a default pair followed by ``[LAYERS=K/V]`` groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tqbridge.bridge import FormatError, display_name, get_format
from tqbridge.bridge.kv_spec import CALIBRATED_EXAMPLE_KV, EXAMPLE_KV, GENERATE_KV, split_kv
from tqbridge.bridge.registry import shown

from .calibration import CalibrationError, KeyCalibration, split_key_spec

__all__ = ["parse_kv", "parse_kv_spec", "kv_name", "LayeredKV", "parse_layered_kv_spec", "layered_kv_name",
           "LAYERED_EXAMPLE_KV"]


def parse_kv(spec: str) -> tuple[str, str]:
    """``q8_0/turbo3`` -> ``(q8_0, turbo3)``; ``q8_0`` means the same format for K and V."""
    k, v = split_kv(spec)
    return display_name(get_format(k)), display_name(get_format(v))


def parse_kv_spec(spec: str) -> tuple[str, str, KeyCalibration]:
    """``q5_1+mean+scale/q4_0`` -> ``(q5_1, q4_0, KeyCalibration(mean=True, scale=True))``.

    The K side may carry key calibration after ``+`` (see :mod:`tqbridge.metal.lm.calibration`);
    a bad spelling raises :class:`FormatError` with a one-line message.
    """
    k_side, v_side = split_kv(spec, example=f"{EXAMPLE_KV} or {CALIBRATED_EXAMPLE_KV}")
    try:
        kf, cal = split_key_spec(k_side)
    except CalibrationError as e:
        raise FormatError(str(e)) from None
    if "+" in v_side:
        raise FormatError(f"{shown(spec)}: calibration applies to keys only (write it after the K format)")
    k, v = parse_kv(f"{kf}/{v_side}")
    return k, v, cal


def kv_name(k: str, v: str, cal: "KeyCalibration | None" = None) -> str:
    """The canonical spelling of a K/V pair with its key calibration."""
    return f"{k}+{cal.spec}/{v}" if cal else f"{k}/{v}"


# ---- per-layer K/V formats: a default pair, then groups of layers with their own pair
#
#     q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]          layers 0, 1 and the last two: q8_0/q8_0; the rest q8_0/turbo3
#     q8_0/turbo3[0-3=q8_0/q8_0][-1=f16]        a range (ends included), and a second group
#
# Square brackets: no single-pair spelling uses them, and ``tqbridge bench decode --caches`` keeps
# a bracket group together when it splits its list at commas (:func:`tqbridge.metal.profiling.split_top`).
# A negative index counts from the last layer (-1: the last). Indices are checked against a model
# by :meth:`LayeredKV.pairs` (out of range, or one layer named twice: one-line FormatError).

_INDEX = re.compile(r"-?[0-9]{1,6}")
LAYERED_EXAMPLE_KV = f"{EXAMPLE_KV}[0,1,-2,-1={GENERATE_KV}]"

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


def layered_kv_name(spec: LayeredKV) -> str:
    """The canonical spelling of a :class:`LayeredKV`: ``parse_layered_kv_spec(name) == spec``."""
    out = kv_name(*spec.default)
    for items, pair in spec.groups:
        out += f"[{','.join(_item_name(i) for i in items)}={kv_name(*pair)}]"
    return out
