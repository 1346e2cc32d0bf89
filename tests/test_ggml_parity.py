"""Byte parity of our float and legacy ggml formats with ggml's own C code (numpy and MLX paths).

The oracle is ``tqbridge.bridge.llama.ggml_c``: ``ggml_quantize_chunk`` and the type traits' ``to_float``
in the libggml-base that llama-cpp-python ships. Every comparison is exact: bytes with
``np.array_equal``, decoded floats as their uint32 bit patterns (so NaN payloads and signed zeros
count too).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tqbridge import bridge
from tqbridge.bridge import FormatError
from tqbridge.bridge.llama import ggml_c
from tqbridge.parity.plugin.strategies import adversarial_rows, float_matrices

if not ggml_c.available():  # pragma: no cover - depends on the install
    pytest.skip("ggml's C library (llama-cpp-python) is not installed: no oracle to compare with",
                allow_module_level=True)

mx = pytest.importorskip("mlx.core", reason="MLX is not installed: the MLX path cannot be checked")

# every registered format with an upstream ggml type id (a new one is checked without editing this file)
LEGACY = list(bridge.blocks.registry.names(lambda f: f.ggml_id is not None))
QUANTIZED = [f for f in LEGACY if bridge.get_format(f).kind != "float"]
assert len(LEGACY) >= 9 and len(QUANTIZED) >= 6
BACKENDS = ["numpy", "mlx"]


def ours_quantize(backend: str, fmt: str, x: np.ndarray) -> np.ndarray:
    if backend == "numpy":
        return bridge.quantize(fmt, x)
    return np.array(bridge.mlx_quantize(fmt, mx.array(x)))


def ours_dequantize(backend: str, fmt: str, b: np.ndarray, n: int) -> np.ndarray:
    if backend == "numpy":
        return bridge.dequantize(fmt, b, n)
    return np.array(bridge.mlx_dequantize(fmt, mx.array(b), n))


def bits(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(y, dtype=np.float32).view(np.uint32)


def assert_same_bytes(fmt, x, ours, ref):
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    if not np.array_equal(ours, ref):
        flat_o = ours.reshape(-1, bridge.get_format(fmt).type_size)
        flat_r = ref.reshape(flat_o.shape)
        blk = int(np.argwhere((flat_o != flat_r).any(axis=1))[0, 0])
        bs = bridge.get_format(fmt).block_size
        vals = x.reshape(-1, bs)[blk]
        raise AssertionError(f"{fmt}: block {blk} differs\n ours {flat_o[blk].tolist()}\n C    "
                             f"{flat_r[blk].tolist()}\n input {vals.tolist()}")


def _row(values, n=32) -> np.ndarray:
    x = np.zeros((1, n), np.float32)
    v = np.asarray(values, np.float32)
    x[0, : v.size] = v
    return x


# Regressions and corner cases kept forever.
ZERO_SIGNS = np.where(np.arange(32) % 3 == 0, np.float32(-0.0), np.float32(0.0)).astype(np.float32)[None]
FIRST_NEG_ZERO = np.concatenate([[-0.0], np.abs(np.linspace(0, 3, 31))]).astype(np.float32)[None]
TINY_SCALE = (np.arange(32, dtype=np.float32) - 16) * np.float32(1e-44)            # 1/d overflows in C
HUGE_RANGE = np.where(np.arange(32) % 2 == 0, 3e38, -3e38).astype(np.float32)[None]   # max - min overflows


def _tie_rows() -> np.ndarray:
    # One block per scale-search extreme P (q8_0: 127; q4_0: -8; q5_0: -16; q4_1 with min 0: 15;
    # q5_1: 31; iq4_nl: -127): x[0] = P * s fixes the scale to exactly s = 2^-3, the rest are
    # half-integer multiples of s, so x * id lands exactly on .5 (C's roundf rounds away from zero).
    s = 2.0**-3
    rows = []
    for peak in (127, -127, -8, 8, -16, 16, 15, 31):
        k = np.resize(np.arange(-abs(peak), abs(peak)) + 0.5, 31)
        if peak in (15, 31):
            k = np.abs(k)
        rows.append(np.concatenate([[peak], k]) * s)
    return np.array(rows, np.float32)


TIES = _tie_rows()


# At least 180 examples (3x the ci profile): these are the properties the whole project rests on.
PARITY_EXAMPLES = max(settings().max_examples, 180)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", LEGACY)
@settings(max_examples=PARITY_EXAMPLES)
@given(x=float_matrices(max_rows=3, max_blocks=6))
@example(x=ZERO_SIGNS)          # gguf-py's min/argmax give other zero signs than C's scans
@example(x=FIRST_NEG_ZERO)      # q4_1/q5_1 take m = the first element equal to the minimum
@example(x=TINY_SCALE[None])    # C converts inf/NaN to int: x86-64 result pinned
@example(x=HUGE_RANGE)
@example(x=TIES)
@example(x=_row([65504.0, -65504.0, 65520.0, 8.0 * 65504.0]))
def test_quantize_matches_c(fmt, backend, x):
    assert_same_bytes(fmt, x, ours_quantize(backend, fmt, x), ggml_c.c_quantize(fmt, x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", LEGACY)
@given(data=st.data())
def test_dequantize_matches_c_on_any_bytes(fmt, backend, data):
    f = bridge.get_format(fmt)
    n_blocks = data.draw(st.integers(1, 8), label="n_blocks")
    raw = data.draw(st.binary(min_size=n_blocks * f.type_size, max_size=n_blocks * f.type_size), label="raw")
    b = np.frombuffer(raw, np.uint8).reshape(1, -1)
    n = n_blocks * f.block_size
    ref = ggml_c.c_dequantize(fmt, b, n)
    got = ours_dequantize(backend, fmt, b, n)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(bits(got), bits(ref)), f"{fmt}: decoded values differ from ggml's to_float"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["q4_1", "q5_1"])
@pytest.mark.parametrize("d, m", [(0x7C00, 0x7D00), (0x7C00, 0x7E00), (0x7E01, 0xFD00), (0xFC00, 0x7C01)])
def test_decode_nan_scale_and_nan_min_as_c(fmt, backend, d, m):
    # Regression (deep profile): x*d + m with both NaN; x86-64 C returns x*d's NaN, numpy returned m's.
    f = bridge.get_format(fmt)
    b = np.zeros((1, f.type_size), np.uint8)
    b[0, 0:2] = (d & 0xFF, d >> 8)
    b[0, 2:4] = (m & 0xFF, m >> 8)
    b[0, -16:] = (np.arange(16) * 17 % 256).astype(np.uint8)  # q = 0 (x*d NaN for d = inf) and others
    ref = ggml_c.c_dequantize(fmt, b, 32)
    assert np.array_equal(bits(ours_dequantize(backend, fmt, b, 32)), bits(ref))


@pytest.mark.parametrize("fmt", LEGACY)
def test_720_adversarial_rows(fmt):
    x = adversarial_rows()  # 9 families x 80 rows x 128 values
    assert x.shape == (720, 128)
    ref = ggml_c.c_quantize(fmt, x)
    for backend in BACKENDS:
        assert_same_bytes(fmt, x, ours_quantize(backend, fmt, x), ref)
        assert np.array_equal(bits(ours_dequantize(backend, fmt, ref, 128)), bits(ggml_c.c_dequantize(fmt, ref, 128)))


@pytest.mark.gpu
def test_mlx_gpu_matches_c():
    """The MLX ops on MLX's GPU (Metal or CUDA): same bytes as C; decoded values bit-identical
    except NaN, whose bits are the GPU's canonical NaN (0x7fffffff) where x86-64 gives 0xffc00000."""
    if not mx.is_available(mx.gpu):
        pytest.skip("no MLX GPU backend on this machine (Metal or CUDA)")
    x = adversarial_rows()
    for fmt in LEGACY:
        ref = ggml_c.c_quantize(fmt, x)
        ref_dec = ggml_c.c_dequantize(fmt, ref, 128)
        with mx.stream(mx.gpu):
            q = np.array(bridge.mlx_quantize(fmt, mx.array(x)))
            d = np.array(bridge.mlx_dequantize(fmt, mx.array(ref), 128))
        assert_same_bytes(fmt, x, q, ref)
        both_nan = np.isnan(d) & np.isnan(ref_dec)
        assert np.array_equal(np.isnan(d), np.isnan(ref_dec)), fmt
        assert np.array_equal(bits(d)[~both_nan], bits(ref_dec)[~both_nan]), fmt


# ---- non-finite input: float formats follow C, quantized formats refuse -----------------------

NONFINITE = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.0, -0.0], np.float32)
NAN_PAYLOADS = np.array([0x7FC00000, 0x7F800001, 0x7FA00000, 0xFFC00001, 0x7FFFFFFF, 0xFF812345],
                        np.uint32).view(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16"])
def test_float_formats_carry_nan_and_inf_as_c(fmt, backend):
    x = np.concatenate([NONFINITE, NAN_PAYLOADS, np.float32([65520.0, -1e9, 3e38])])[None]
    ref = ggml_c.c_quantize(fmt, x)
    assert_same_bytes(fmt, x, ours_quantize(backend, fmt, x), ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_f16_decode_quiets_signalling_nan_as_c(backend):
    h = np.array([0x7C01, 0xFC01, 0x7E00, 0x7DFF, 0x7C00, 0x0001, 0x8000], np.uint16).view(np.uint8)[None]
    assert np.array_equal(bits(ours_dequantize(backend, "f16", h, 7)), bits(ggml_c.c_dequantize("f16", h, 7)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantized_formats_refuse_nonfinite(fmt, backend, bad):
    x = np.ones((2, 64), np.float32)
    x[1, 37] = bad
    with pytest.raises(FormatError, match=rf"{fmt}: value 5 of block 3 is .*non-finite"):
        ours_quantize(backend, fmt, x)


# ---- the oracle itself -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", LEGACY)
def test_c_sizes_agree_with_registry(fmt):
    f = bridge.get_format(fmt)
    info = ggml_c.type_traits(fmt)
    assert info["name"] == fmt
    assert ggml_c.c_row_size(fmt, 256) == f.row_bytes(256)


def test_c_oracle_errors_are_clear():
    with pytest.raises(FormatError, match="multiple of its block size 32"):
        ggml_c.c_quantize("q8_0", np.zeros(40, np.float32))
    with pytest.raises(FormatError, match="takes 34 bytes"):
        ggml_c.c_dequantize("q8_0", np.zeros((2, 33), np.uint8), 32)
    with pytest.raises(FormatError, match="uint8"):
        ggml_c.c_dequantize("q8_0", np.zeros((2, 34), np.int16), 32)


def test_c_oracle_keeps_leading_axes():
    x = np.random.default_rng(0).normal(size=(2, 3, 64)).astype(np.float32)
    b = ggml_c.c_quantize("q4_1", x)
    assert b.shape == (2, 3, 40)
    assert np.array_equal(b, bridge.quantize("q4_1", x))
    assert ggml_c.c_dequantize("q4_1", b, 64).shape == (2, 3, 64)
