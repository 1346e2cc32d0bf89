"""The turbo decode goldens (``tests/data/turbo/<variant>-decoded.npz``), made from a fork build.

    python -m tqbridge.parity.harness.turbo_decode_goldens --llama BUILD --out OUT.npz

``BUILD`` is a TurboQuant fork build (``tqbridge llama build SRC``); its variant (``tqbridge llama info``)
picks the quantize goldens it decodes, ``tests/data/turbo/<variant>.npz`` (the fork's own blocks of
drawn rows, see PROVENANCE.md there). Per turbo type it writes:

- ``{type}_n{n}_rotated``: the fork's ``to_float`` (``ggml_get_type_traits(type)->to_float``, the
  ``dequantize_row_turbo*`` of the build) on each row of blocks — the values in the rotated basis;
- ``{type}_n{n}_original``: those floats through the fork's graph op ``ggml_turbo_wht`` (direction 1,
  the inverse rotation, groups of 128, no InnerQ scale) — the values in the original basis;
- ``{type}_random_blocks`` and their two decodes: :data:`RANDOM_ROWS` blocks of uniform random bytes
  (``numpy.random.default_rng(RANDOM_SEED)``, drawn for turbo2, turbo3, turbo4 in that order), the
  first 16 with their fp16 norm (bytes 0-1) set to :data:`SPECIAL_NORMS`.

``--check FILE`` compares the result with a committed file, array by array, bit for bit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

TYPES = ("turbo2", "turbo3", "turbo4")
LENGTHS = (128, 256, 512)
RANDOM_ROWS = 512
RANDOM_SEED = 20261201
# fp16 bit patterns: +-0, +-smallest subnormal, largest subnormal, smallest normal, +-65504, +-inf,
# +-quiet NaN, signalling NaNs 0x7c01 and 0x7dff, +-1
SPECIAL_NORMS = (0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                 0x7E00, 0xFE00, 0x7C01, 0x7DFF, 0x3C00, 0xBC00)
DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "turbo"


def random_blocks(type_sizes: "dict[str, int]") -> "dict[str, np.ndarray]":
    """The random block bytes of every type, drawn in :data:`TYPES` order from one generator."""
    rng = np.random.default_rng(RANDOM_SEED)
    out = {}
    for t in TYPES:
        b = rng.integers(0, 256, size=(RANDOM_ROWS, type_sizes[t]), dtype=np.uint8)
        b[:len(SPECIAL_NORMS), :2] = np.array(SPECIAL_NORMS, "<u2").view(np.uint8).reshape(-1, 2)
        out[t] = b
    return out


def decode(variant: str, typ: str, blocks: np.ndarray, n: int) -> "tuple[np.ndarray, np.ndarray]":
    """(rotated, original) float32 decodes of ``blocks`` (rows of n / 128 blocks) by the selected build."""
    from tqbridge.bridge.llama import ggml_c
    from tqbridge.bridge.llama.ggml_abi import TO_FLOAT
    from tqbridge.bridge.llama.ggml_graph import turbo_wht
    from tqbridge.bridge.llama.side import kv_type_id

    base = ggml_c.load()
    traits = base.ggml_get_type_traits(kv_type_id(f"{typ}@{variant}")).contents
    to_float = TO_FLOAT(traits.to_float)
    blocks = np.ascontiguousarray(blocks)
    rot = np.zeros((blocks.shape[0], n), np.float32)
    for i in range(blocks.shape[0]):     # one row of blocks at a time
        to_float(blocks[i].ctypes.data, rot[i].ctypes.data, n)
    return rot, turbo_wht(rot, direction=1, group=128)


def make(variant: str) -> "dict[str, np.ndarray]":
    from tqbridge.bridge import get_format

    golden = np.load(DATA / f"{variant}.npz")
    if str(golden["variant"]) != variant:
        raise SystemExit(f"{DATA / f'{variant}.npz'} holds {golden['variant']}, not {variant}")
    out: "dict[str, np.ndarray]" = {"variant": np.array(variant)}
    sizes = {t: get_format(f"{t}@{variant}").type_size for t in TYPES}
    rand = random_blocks(sizes)
    for t in TYPES:
        for n in LENGTHS:
            out[f"{t}_n{n}_rotated"], out[f"{t}_n{n}_original"] = decode(variant, t, golden[f"{t}_n{n}_blocks"], n)
        out[f"{t}_random_blocks"] = rand[t]
        out[f"{t}_random_rotated"], out[f"{t}_random_original"] = decode(variant, t, rand[t], 128)
    return out


def differences(made: "dict[str, np.ndarray]", path: Path) -> "list[str]":
    """The arrays of ``made`` that are not bit for bit those of the file at ``path``."""
    ref = np.load(path)
    bad = sorted(set(ref.files) ^ set(made))
    for k in sorted(set(ref.files) & set(made)):
        a, b = np.asarray(made[k]), ref[k]
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            bad.append(k)
    return bad


def main(argv: "list[str] | None" = None) -> int:
    from tqbridge.bridge.llama.build import select

    ap = argparse.ArgumentParser(prog="python -m tqbridge.parity.harness.turbo_decode_goldens")
    ap.add_argument("--llama", required=True, metavar="BUILD", help="a TurboQuant fork build directory")
    ap.add_argument("--out", help="write the arrays here (.npz)")
    ap.add_argument("--check", metavar="FILE", help="compare with a committed file, bit for bit")
    args = ap.parse_args(argv)
    info = select(args.llama)
    if not info.variant:
        raise SystemExit(f"{args.llama}: not a TurboQuant fork build (no turbo variant)")
    made = make(info.variant)
    if args.out:
        np.savez_compressed(args.out, **made)
        print(f"wrote {args.out} ({info.variant}, {len(made)} arrays)")
    if args.check:
        bad = differences(made, Path(args.check))
        print(f"{args.check}: " + ("identical, every array bit for bit" if not bad else f"DIFFERS in {bad}"))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
