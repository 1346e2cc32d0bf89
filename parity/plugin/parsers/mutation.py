"""Byte-level mutations of a target's seeds (a mutant is 1-6 of them stacked, with the target's
structure-aware edits first): boundary values in the seed's integer fields or anywhere, bit flips,
bytes, truncations, deletions, duplications, splices with another seed, random insertions."""

from __future__ import annotations

import random

from .target import ParserTarget, Seed

BOUNDARY = (0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


def _put_int(buf: bytearray, off: int, width: int, value: int) -> None:
    buf[off:off + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")


class Mutator:
    """Mutants of a target's seeds, deterministic in ``(seed, worker, index)``."""

    def __init__(self, target: "ParserTarget", seeds: list[Seed]):
        self.target, self.seeds = target, seeds

    def mutant(self, rng: random.Random) -> tuple[bytes, str, list[str]]:
        seed = rng.choice(self.seeds)
        data = bytearray(seed.data)
        ops: list[str] = []
        n = rng.choice((1, 1, 1, 2, 2, 3, 4, 6))
        structured = self.target.structured_mutation
        kinds = sorted(structured is not None and rng.random() < self.target.structured_share for _ in range(n))
        for is_structured in reversed(kinds):      # structure-aware edits first, then bytes
            if is_structured:
                data, op = structured(rng, bytes(data), seed)
                data = bytearray(data)
            else:
                op = self._byte_op(rng, data, seed)
            ops.append(op)
        return bytes(data), seed.name, ops

    def _pos(self, rng: random.Random, data: bytearray, seed: Seed) -> int:
        if not data:
            return 0
        if seed.hot and rng.random() < 0.75:
            return rng.randrange(min(seed.hot, len(data)))
        return rng.randrange(len(data))

    def _byte_op(self, rng: random.Random, data: bytearray, seed: Seed) -> str:
        r = rng.random()
        if r < 0.30 and seed.fields:                         # an integer field: boundary value
            off, width = rng.choice(seed.fields)
            if off + width > len(data):
                return "field past the end (skipped)"
            old = int.from_bytes(data[off:off + width], "little")
            value = rng.choice(BOUNDARY + (old + 1, old - 1, old * 2, old * 256, len(data), len(data) - off,
                                           len(data) + 1, -1, -2))
            _put_int(data, off, width, value)
            return f"u{8 * width} @{off} = {value & ((1 << (8 * width)) - 1):#x} (was {old:#x})"
        if r < 0.42:                                         # an integer anywhere
            width = rng.choice((1, 2, 4, 8))
            if len(data) < width:
                return "int (too short, skipped)"
            off = min(self._pos(rng, data, seed), len(data) - width)
            value = rng.choice(BOUNDARY + (len(data), -1))
            _put_int(data, off, width, value)
            return f"u{8 * width} @{off} = {value & ((1 << (8 * width)) - 1):#x}"
        if r < 0.60 and data:                                # bit flips
            offs = []
            for _ in range(rng.choice((1, 1, 2, 4, 8))):
                off, bit = self._pos(rng, data, seed), rng.randrange(8)
                data[off] ^= 1 << bit
                offs.append(f"{off}.{bit}")
            return "flip " + ",".join(offs)
        if r < 0.68 and data:                                # a byte
            off = self._pos(rng, data, seed)
            data[off] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
            return f"byte @{off} = {data[off]:#x}"
        if r < 0.78:                                         # truncation
            cut = self._pos(rng, data, seed) if rng.random() < 0.8 else max(0, len(data) - rng.randrange(1, 64))
            del data[cut:]
            return f"truncate to {cut}"
        if r < 0.84 and data:                                # deletion
            a = self._pos(rng, data, seed)
            b = min(len(data), a + rng.choice((1, 2, 4, 8, 16, 64, 1024)))
            del data[a:b]
            return f"delete [{a}, {b})"
        if r < 0.92 and data:                                # duplication
            a = self._pos(rng, data, seed)
            b = min(len(data), a + rng.choice((1, 4, 8, 24, 64, 512, 4096)))
            at = self._pos(rng, data, seed)
            data[at:at] = data[a:b]
            return f"duplicate [{a}, {b}) at {at}"
        if r < 0.97 and len(self.seeds) > 1:                 # splice with another seed
            other = rng.choice([s for s in self.seeds if s is not seed] or self.seeds)
            x, y = rng.randrange(len(data) + 1), rng.randrange(len(other.data) + 1)
            data[x:] = other.data[y:]
            return f"splice {other.name}[{y}:] at {x}"
        at = rng.randrange(len(data) + 1)                    # random bytes inserted
        junk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 16, 100))))
        data[at:at] = junk
        return f"insert {len(junk)} random bytes at {at}"
