"""Byte-exactness of the turbo formats against the fork's C quantizer (tests/data/turbo, see PROVENANCE.md)."""

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
