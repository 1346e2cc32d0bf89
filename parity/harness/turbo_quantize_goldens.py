"""The turbo quantize goldens (``tests/data/turbo/<variant>.npz``), made from a fork build.

    python -m tqbridge.parity.harness.turbo_quantize_goldens --llama BUILD --out OUT.npz [--check FILE]

``BUILD`` is a TurboQuant fork build (``tqbridge llama build SRC`` of a checkout of the fork; the fork's
sources are never part of tqbridge). Its variant (``tqbridge llama info``) names the file. Per turbo
type and row length n in 128, 256, 512 it writes ``{type}_n{n}_x`` (float32, :data:`ROWS` drawn rows)
and ``{type}_n{n}_blocks`` (uint8: the build's ``ggml_quantize_chunk`` of those rows, no importance
matrix, as llama.cpp quantizes KV rows), and ``variant``.

The rows (:func:`draw`), in this order: Gaussian; Gaussian times per-row scales from 1e-3 to 1e3;
Student-t (nu = 2); Gaussian with four x50 outlier channels; all zeros; constant 0.5; Gaussian x 1e-20
(norms near the zero threshold); Gaussian x 6e4 (the stored fp16 norm overflows); uniform(-1, 1);
Gaussian with every 7th value zeroed.

``--check FILE`` quantizes FILE's own rows with the build and compares the blocks, bit for bit (the
committed inputs were drawn by an earlier generator whose seeds are not known; their blocks are what
the fork makes of them, and that is what the check holds).
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

from tqbridge.parity.harness.turbo_decode_goldens import differences  # bit-for-bit file comparison

TYPES = ("turbo2", "turbo3", "turbo4")
LENGTHS = (128, 256, 512)
# rows of each kind, in draw order
KINDS = (("gaussian", 64), ("scaled", 32), ("student_t", 32), ("outliers", 32), ("zeros", 4),
         ("half", 4), ("tiny", 8), ("huge", 8), ("uniform", 32), ("sparse", 16))
ROWS = sum(k for _, k in KINDS)        # 232


def draw(typ: str, n: int) -> np.ndarray:
    """:data:`ROWS` float32 rows of length ``n`` for ``typ``, seeded by the type and length."""
    rng = np.random.default_rng(zlib.crc32(f"{typ}_n{n}".encode()))
    parts = []
    for kind, k in KINDS:
        g = rng.standard_normal((k, n))
        if kind == "scaled":
            g *= np.logspace(-3, 3, k)[:, None]
        elif kind == "student_t":
            g = rng.standard_t(2.0, (k, n))
        elif kind == "outliers":
            g[:, rng.choice(n, 4, replace=False)] *= 50.0
        elif kind == "zeros":
            g = np.zeros((k, n))
        elif kind == "half":
            g = np.full((k, n), 0.5)
        elif kind == "tiny":
            g *= 1e-20
        elif kind == "huge":
            g *= 6e4
        elif kind == "uniform":
            g = rng.uniform(-1.0, 1.0, (k, n))
        elif kind == "sparse":
            g[:, ::7] = 0.0
        parts.append(g)
    return np.concatenate(parts).astype(np.float32)


def quantize(variant: str, typ: str, x: np.ndarray) -> np.ndarray:
    """The selected build's ``ggml_quantize_chunk`` of rows ``x`` as ``typ`` of ``variant``."""
    from tqbridge.bridge.llama.ggml_c import c_quantize

    return c_quantize(f"{typ}@{variant}", x)


def make(variant: str, rows: "dict[str, np.ndarray] | None" = None) -> "dict[str, np.ndarray]":
    """The golden arrays of ``variant``; ``rows`` (key ``{type}_n{n}_x`` -> rows) replaces the draw."""
    out: "dict[str, np.ndarray]" = {"variant": np.array(variant)}
    for t in TYPES:
        for n in LENGTHS:
            x = rows[f"{t}_n{n}_x"] if rows is not None else draw(t, n)
            out[f"{t}_n{n}_x"] = x
            out[f"{t}_n{n}_blocks"] = quantize(variant, t, x)
    return out


def main(argv: "list[str] | None" = None) -> int:
    from tqbridge.bridge.llama.build import select

    ap = argparse.ArgumentParser(prog="python -m tqbridge.parity.harness.turbo_quantize_goldens")
    ap.add_argument("--llama", required=True, metavar="BUILD", help="a TurboQuant fork build directory")
    ap.add_argument("--out", help="write freshly drawn rows and the build's blocks here (.npz)")
    ap.add_argument("--check", metavar="FILE", help="quantize FILE's rows and compare its blocks, bit for bit")
    args = ap.parse_args(argv)
    info = select(args.llama)
    if not info.variant:
        raise SystemExit(f"{args.llama}: not a TurboQuant fork build (no turbo variant)")
    if args.out:
        made = make(info.variant)
        np.savez_compressed(args.out, **made)
        print(f"wrote {args.out} ({info.variant}, {len(made)} arrays)")
    if args.check:
        ref = np.load(args.check)
        if str(ref["variant"]) != info.variant:
            raise SystemExit(f"{args.check} holds {ref['variant']}, the build is {info.variant}")
        bad = differences(make(info.variant, {k: ref[k] for k in ref.files if k.endswith("_x")}), Path(args.check))
        print(f"{args.check}: " + ("identical, every array bit for bit" if not bad else f"DIFFERS in {bad}"))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
