"""How a K/V format pair is spelled, split in one place for every reader.

    q8_0/turbo3            K format / V format
    q8_0                   the same format for K and V
    turbo3@g64/q4_0        a format variant after '@' (resolved by :func:`tqbridge.bridge.get_format`)
    q5_1+mean+scale/q4_0   key calibration after '+' on the K side (:mod:`tqbridge.metal.lm.calibration`)
    q8_0/turbo3@int8       ``tqbridge bench decode --caches`` only: decode attention's q precision after
                           the first '@' (so a variant cannot be spelled there)

:func:`split_kv` only splits: it checks the shape of the spelling, not the format names, so readers
without MLX (the llama.cpp side) can use it too. ``parse_kv`` / ``parse_kv_spec`` in
:mod:`tqbridge.metal.lm.cache` resolve the names on top of it.
"""

from __future__ import annotations

from .registry import FormatError, shown

__all__ = ["split_kv", "split_q_precision"]


def split_kv(spec: str, *, example: str = "q8_0/turbo3", noun: str = "K/V format pair",
             error: type[Exception] = FormatError) -> tuple[str, str]:
    """``"q8_0/turbo3"`` -> ``("q8_0", "turbo3")``, ``"q8_0"`` -> ``("q8_0", "q8_0")`` (sides stripped).

    Anything but one or two non-empty sides raises ``error`` with one line naming ``noun`` and the
    ``example`` to follow (each reader keeps its own wording)."""
    parts = [p.strip() for p in str(spec).split("/")]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(parts):
        raise error(f"bad {noun} {shown(spec)}: write K/V, e.g. {example}")
    return parts[0], parts[1]


def split_q_precision(spelling: str) -> tuple[str, str]:
    """``"q8_0/turbo3@int8"`` -> ``("q8_0/turbo3", "int8")``: the K/V spelling and what follows its
    first '@' ("" when there is none). The caller checks the q precision."""
    spec, _, qp = str(spelling).partition("@")
    return spec, qp
