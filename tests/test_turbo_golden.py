"""Exactness of the turbo formats against the fork's C (tests/data/turbo, see PROVENANCE.md): the bytes
of its quantizer, and the float32 bits of its decode (``dequantize_row_turbo*``, then its CPU
``ggml_turbo_wht`` inverse rotation for the original basis)."""

from pathlib import Path

import numpy as np
import pytest

from tqbridge import bridge

DATA = Path(__file__).parent / "data" / "turbo"
VARIANTS = ["fork-pr197", "fork-69d8e4b"]
TYPES = ["turbo2", "turbo3", "turbo4"]
LENGTHS = [128, 256, 512]
ROWS_PER_FILE = 2088  # 3 types x 3 lengths x 232 rows (PROVENANCE.md)


def _golden(variant):
    d = np.load(DATA / f"{variant}.npz")
    assert str(d["variant"]) == variant
    return d


def _cases():
    return [(v, t, n) for v in VARIANTS for t in TYPES for n in LENGTHS]


def _mismatches(got, want):
    return np.flatnonzero(~(got == want).all(axis=1)).tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_files_hold_all_rows(variant):
    d = _golden(variant)
    assert sum(d[f"{t}_n{n}_x"].shape[0] for t in TYPES for n in LENGTHS) == ROWS_PER_FILE


@pytest.mark.parametrize("variant, typ, n", _cases())
def test_numpy_quantizer_reproduces_c_bytes(variant, typ, n):
    d = _golden(variant)
    x, want = d[f"{typ}_n{n}_x"], d[f"{typ}_n{n}_blocks"]
    fmt = bridge.get_format(f"{typ}@{variant}")
    assert want.shape == (x.shape[0], fmt.row_bytes(n))
    got = bridge.quantize(fmt, x)
    assert got.dtype == np.uint8 and got.shape == want.shape
    assert _mismatches(got, want) == []


@pytest.mark.parametrize("variant, typ, n", _cases())
def test_mlx_quantizer_reproduces_c_bytes(variant, typ, n):
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    d = _golden(variant)
    x, want = d[f"{typ}_n{n}_x"], d[f"{typ}_n{n}_blocks"]
    got = np.array(bridge.mlx_quantize(f"{typ}@{variant}", mx.array(x)))
    assert got.dtype == np.uint8
    assert _mismatches(got, want) == []


@pytest.mark.parametrize("variant, typ", [(v, t) for v in VARIANTS for t in TYPES])
def test_mlx_dequantize_matches_numpy_bitwise(variant, typ):
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    d = _golden(variant)
    b = d[f"{typ}_n512_blocks"]
    for rotated in (True, False):
        want = bridge.dequantize(f"{typ}@{variant}", b, 512, rotated=rotated)
        got = np.array(bridge.mlx_dequantize(f"{typ}@{variant}", mx.array(b), 512, rotated=rotated))
        assert_same_bits(got, want)


def assert_same_bits(got, want):
    """Bit-identical floats; NaNs (from inf - inf where a norm overflowed fp16, the x 6e4 rows) must sit
    in the same places but may carry different payloads (x86 makes 0xffc00000, CUDA 0x7fffffff)."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


# ---- decode: the fork's C floats ------------------------------------------------------------------

BLOCK_BYTES = {"fork-69d8e4b": {"turbo2": 34, "turbo3": 50, "turbo4": 68},
               "fork-pr197": {"turbo2": 34, "turbo3": 50, "turbo4": 66}}
RANDOM_ROWS = 512       # random block bytes per type, the first 16 with special fp16 norms (PROVENANCE.md)


def _decoded(variant):
    d = np.load(DATA / f"{variant}-decoded.npz")
    assert str(d["variant"]) == variant
    return d


def _decode_cases():
    """(variant, type, blocks, n, the C's rotated-basis floats, the C's original-basis floats)."""
    for v in VARIANTS:
        g, d = _golden(v), _decoded(v)
        for t in TYPES:
            for n in LENGTHS:
                yield v, t, f"n{n}", g[f"{t}_n{n}_blocks"], n, d[f"{t}_n{n}_rotated"], d[f"{t}_n{n}_original"]
            yield v, t, "random", d[f"{t}_random_blocks"], 128, d[f"{t}_random_rotated"], d[f"{t}_random_original"]


DECODE_CASES = list(_decode_cases())
DECODE_IDS = [f"{v}-{t}-{k}" for v, t, k, *_ in DECODE_CASES]


def test_decoded_files_cover_every_golden_block_and_the_random_blocks():
    for v, t, key, blocks, n, rot, orig in DECODE_CASES:
        rows = RANDOM_ROWS if key == "random" else 232
        assert blocks.shape == (rows, n // 128 * BLOCK_BYTES[v][t])
        assert rot.dtype == orig.dtype == np.float32 and rot.shape == orig.shape == (rows, n)
        assert np.isfinite(rot).mean() > 0.9 and len(np.unique(rot[np.isfinite(rot)])) > 100


@pytest.mark.parametrize("variant, typ, key, blocks, n, rot, orig", DECODE_CASES, ids=DECODE_IDS)
def test_numpy_dequantize_reproduces_c_floats_bit_for_bit(variant, typ, key, blocks, n, rot, orig):
    """Every float32 bit pattern, NaN payloads included (the C and numpy run on the same x86 FPU;
    NaNs come from fp16 norms that are NaN or overflowed to inf, and inf - inf in the rotation)."""
    fmt = f"{typ}@{variant}"
    for rotated, want in ((True, rot), (False, orig)):
        got = bridge.dequantize(fmt, blocks, n, rotated=rotated)
        assert got.dtype == np.float32 and got.shape == want.shape
        bad = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)).any(axis=1))
        assert bad.size == 0, f"rotated={rotated}: rows {bad[:10].tolist()} differ from the fork's C decode"


@pytest.mark.parametrize("variant, typ, key, blocks, n, rot, orig", DECODE_CASES, ids=DECODE_IDS)
def test_mlx_dequantize_reproduces_c_floats_bit_for_bit(variant, typ, key, blocks, n, rot, orig):
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    fmt = f"{typ}@{variant}"
    for rotated, want in ((True, rot), (False, orig)):
        got = np.array(bridge.mlx_dequantize(fmt, mx.array(blocks), n, rotated=rotated))
        assert_same_bits(got, want)


def test_the_decode_goldens_tell_the_variants_apart():
    """The check can fail: the other variant's centroid tables decode the same bytes to other floats
    (turbo3 and turbo4; turbo2's table is shared, so the variants agree there)."""
    g, d = _golden("fork-69d8e4b"), _decoded("fork-69d8e4b")
    for typ, differs in (("turbo2", False), ("turbo3", True)):
        got = bridge.dequantize(f"{typ}@fork-pr197", g[f"{typ}_n512_blocks"], 512, rotated=True)
        same = np.array_equal(got.view(np.uint32), d[f"{typ}_n512_rotated"].view(np.uint32))
        assert same != differs
    # turbo4: the same norms and indices without 69d8e4b's unused rnorm field, read with PR #197's table
    b = g["turbo4_n512_blocks"].reshape(-1, 4, 68)
    got = bridge.dequantize("turbo4@fork-pr197", np.concatenate([b[..., :2], b[..., 4:]], axis=-1).reshape(-1, 4 * 66),
                            512, rotated=True)
    want = d["turbo4_n512_rotated"]
    assert not np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(np.sign(got), np.sign(want))   # same indices: only the centroid magnitudes differ


def test_the_random_blocks_are_the_recipes_draw():
    """The decode goldens' random blocks are what the committed recipe draws
    (parity/harness/turbo_decode_goldens.py: one generator, the types in order, special fp16 norms)."""
    from tqbridge.parity.harness.turbo_decode_goldens import random_blocks

    for v in VARIANTS:
        d = _decoded(v)
        drawn = random_blocks({t: BLOCK_BYTES[v][t] for t in TYPES})
        for t in TYPES:
            assert np.array_equal(drawn[t], d[f"{t}_random_blocks"]), (v, t)
