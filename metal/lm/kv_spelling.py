"""K/V format pairs as spelled on command lines and in reports, resolved to registered format names
(:func:`parse_kv`, :func:`parse_kv_spec`) and written back (:func:`kv_name`). The shape of a spelling
is :func:`tqbridge.bridge.kv_spec.split_kv`'s; this module adds the format names and the key
calibration after ``+``.
"""

from __future__ import annotations

from tqbridge.bridge import FormatError, display_name, get_format
from tqbridge.bridge.kv_spec import CALIBRATED_EXAMPLE_KV, EXAMPLE_KV, split_kv
from tqbridge.bridge.registry import shown

from .calibration import CalibrationError, KeyCalibration, split_key_spec

__all__ = ["parse_kv", "parse_kv_spec", "kv_name"]


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
