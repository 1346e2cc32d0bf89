"""How a K/V format pair is spelled, split in one place for every reader.

    q8_0/turbo3            K format / V format
    q8_0                   the same format for K and V
    turbo3@g64/q4_0        a format variant after '@' (resolved by :func:`tqbridge.bridge.get_format`)
    q5_1+mean+scale/q4_0   key calibration after '+' on the K side (:mod:`tqbridge.metal.lm.calibration`)
    q8_0/turbo3@int8       ``tqbridge bench decode --caches`` only: decode attention's q precision after
                           the first '@' (so a variant cannot be spelled there)

:func:`split_kv` only splits: it checks the shape of the spelling, not the format names, so readers
without MLX (the llama.cpp side) can use it too. ``parse_kv`` / ``parse_kv_spec`` in
:mod:`tqbridge.metal.lm.kv_spelling` resolve the names on top of it.

The named defaults below are the one place where the package picks format names by itself (the
default cache format, the pairs that messages and help texts suggest, the default matrices of
``tqbridge parity`` and ``tqbridge quality``); every other module imports them. Per-format
decisions are not made here: they come from the registry entries (docs/adding-a-format.md).
"""

from __future__ import annotations

from .format_types import FormatError
from .registry import shown

__all__ = ["split_kv", "split_q_precision", "DEFAULT_FORMAT", "TURBO_FORMAT", "EXAMPLE_KV", "LLAMA_EXAMPLE_KV",
           "CALIBRATED_KV", "CALIBRATED_EXAMPLE_KV", "GENERATE_KV", "LOGITS_KV", "QUALITY_KV"]

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


def split_kv(spec: str, *, example: str = EXAMPLE_KV, noun: str = "K/V format pair",
             error: type[Exception] = FormatError) -> tuple[str, str]:
    """``q8_0/turbo3`` -> K ``q8_0``, V ``turbo3``; ``q8_0`` -> ``q8_0`` for both (sides stripped).

    Anything but one or two non-empty sides raises ``error`` with one line naming ``noun`` and the
    ``example`` to follow (each reader keeps its own wording)."""
    parts = [p.strip() for p in str(spec).split("/")]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(parts):
        raise error(f"bad {noun} {shown(spec)}: write K/V, e.g. {example}")
    return parts[0], parts[1]


def split_q_precision(spelling: str) -> tuple[str, str]:
    """``q8_0/turbo3@int8`` -> ``(q8_0/turbo3, int8)``: the K/V spelling and what follows its
    first '@' ("" when there is none). The caller checks the q precision."""
    spec, _, qp = str(spelling).partition("@")
    return spec, qp
