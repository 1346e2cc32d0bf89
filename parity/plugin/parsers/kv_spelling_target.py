"""The ``kv-spelling`` parser target: valid ``--kv`` spellings (the named pairs of bridge/blocks/kv_spec.py
and every spelling the format registry answers to), edits with tokens of the spelling grammar, and
the consumers ``parse_kv_spec``, ``parse_layered_kv_spec`` (per-layer pairs in ``[LAYERS=K/V]`` groups,
resolved against models of 1 and 30 layers) and ``parity-kv`` (``KV.parse``, which refuses per-layer
spellings), whose canonical names must parse back to the same."""

from __future__ import annotations

import functools
import random

from .target import ParserTarget, Seed


@functools.cache
def _format_spellings() -> "tuple[str, ...]":
    """Every spelling the registry answers to: each addressable name, then each ``name@variant`` key."""
    from tqbridge.bridge.blocks.registry import all_formats, formats

    return tuple(dict.fromkeys([*formats(), *(f.key for f in all_formats() if f.variant)]))


@functools.cache
def _kv_seeds() -> "tuple[str, ...]":
    """The named pairs of bridge/blocks/kv_spec.py (with key calibration forms, upper case and spaces), every
    spelling the registry answers to alone, and each paired with the next one (K and V sides)."""
    from tqbridge.bridge.blocks.kv_spec import CALIBRATED_KV, DEFAULT_FORMAT, EXAMPLE_KV, LLAMA_EXAMPLE_KV, split_kv

    k, v = split_kv(EXAMPLE_KV)
    lk, lv = split_kv(LLAMA_EXAMPLE_KV)
    sp = _format_spellings()
    return tuple(dict.fromkeys([
        DEFAULT_FORMAT, EXAMPLE_KV, LLAMA_EXAMPLE_KV, CALIBRATED_KV, f"{k}+qscale/{v}",
        f"{lk}+scale=0.75+rotated/{lv}", f"{k.upper()} / {v.upper()}",
        *sp, *(f"{a}/{b}" for a, b in zip(sp, sp[1:] + sp[:1])),
        f"{EXAMPLE_KV}[0,1,-2,-1={DEFAULT_FORMAT}/{DEFAULT_FORMAT}]", f"{EXAMPLE_KV}[0-3={LLAMA_EXAMPLE_KV}][-1=f16]",
        f"{LLAMA_EXAMPLE_KV}[ -2--1 = {CALIBRATED_KV} ]"]))


@functools.cache
def _kv_tokens() -> "tuple[str, ...]":
    from tqbridge.bridge.blocks.registry import all_formats

    fs = all_formats()
    formats = tuple(dict.fromkeys([*(f.name for f in fs), *(f.variant for f in fs if f.variant)]))
    return ("/", "+", "@", "=", ",", ":", "[", "]", "-", "[0=", "[-1-", "]]", "[[", " ", "\t", "\n", *formats, "mean",
            "scale", "qscale", "rotated", "original", "none", "0", "-1", "0.5", "1", "2", "nan", "inf", "1e309",
            "1e-400", "0x1p-3", "\u00b9", "\u0130", "\x00", "\udcff", "\u212a", "\ufeff", "\u200b")


def _kv_mutation(rng: random.Random, data: bytes, seed: Seed) -> tuple[bytes, str]:
    s = data.decode("utf-8", "surrogateescape")
    r = rng.random()
    at = rng.randrange(len(s) + 1)
    if r < 0.45:
        tok = rng.choice(_kv_tokens())
        s = s[:at] + tok + s[at:]
        op = f"insert {tok!r} at {at}"
    elif r < 0.65 and s:
        b = min(len(s), at + rng.randrange(1, 6))
        s = s[:at] + s[b:]
        op = f"delete [{at}, {b})"
    elif r < 0.80 and s:
        b = min(len(s), at + rng.randrange(1, 6))
        tok = rng.choice(_kv_tokens())
        s = s[:at] + tok + s[b:]
        op = f"replace [{at}, {b}) with {tok!r}"
    elif r < 0.90:
        times = rng.choice((2, 3, 50, 5000, 100000))
        s = (s or _kv_seeds()[0]) * times if len(s) * times < 2_000_000 else s
        op = f"repeat x{times}"
    else:
        s = s + rng.choice(_kv_tokens()) * rng.choice((1, 10, 1000, 200000))
        op = "long tail"
    return s.encode("utf-8", "surrogateescape"), op


class KVSpellingTarget(ParserTarget):
    name = "kv-spelling"
    consumers = ("parse_kv_spec", "parse_layered_kv_spec", "parity-kv")
    structured_share = 0.7

    def __init__(self):
        self.structured_mutation = _kv_mutation

    def seeds(self, scratch):
        return [Seed(s, s.encode(), [], 0) for s in _kv_seeds()]

    def clean_classes(self, consumer):
        from tqbridge.bridge.blocks.format_types import FormatError

        return (FormatError,) if consumer.startswith("parse_") else (ValueError,)

    def raised_by_us_required(self, consumer):
        return consumer == "parity-kv"

    def call(self, consumer, data, scratch):
        from tqbridge.bridge.blocks.format_types import FormatError

        spec = data.decode("utf-8", "surrogateescape")
        if consumer == "parse_kv_spec":
            from tqbridge.bridge.blocks.kv_spec import kv_name, parse_kv_spec

            k, v, cal = parse_kv_spec(spec)
            if parse_kv_spec(kv_name(k, v, cal)) != (k, v, cal):
                return f"canonical name {kv_name(k, v, cal)!r} parses to something else"
            return None
        if consumer == "parse_layered_kv_spec":
            from tqbridge.bridge.blocks.kv_spec import layered_kv_name, parse_layered_kv_spec

            kv = parse_layered_kv_spec(spec)
            if parse_layered_kv_spec(layered_kv_name(kv)) != kv:
                return f"canonical name {layered_kv_name(kv)!r} parses to something else"
            for n_layers in (1, 30):
                try:
                    pairs = kv.pairs(n_layers)
                except FormatError:   # an index out of range for this model, a layer named twice
                    continue
                if len(pairs) != n_layers or (not kv.groups and set(pairs) != {kv.default}):
                    return f"{len(pairs)} pairs for {n_layers} layers"
            return None
        from tqbridge.parity.harness.runtimes import KV

        kv = KV.parse(spec)
        if KV.parse(kv.name) != kv:
            return f"canonical name {kv.name!r} parses to something else"
        return None
