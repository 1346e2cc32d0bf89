"""Quantize-on-append kernel vs the numpy reference, byte for byte, for every registered format:
on the CPU emulator (CI) and on a GPU backend (``gpu`` marker; skipped with the reason elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tqbridge import bridge, metal
from tqbridge.bridge import FormatError
from tqbridge.metal.kernel import KernelError
from tqbridge.metal.quantize_append import quantize_append, supported
from tqbridge.parity.plugin.strategies import adversarial_rows, float_matrices

FORMATS = [f for f in bridge.formats() if supported(f)]
# 16-bit sources cost one more compiled kernel per format: a representative subset
SRC16_FORMATS = [f for f in ("f16", "bf16", "q8_0", "q4_1", "iq4_nl", "turbo3", "turbo4@fork-69d8e4b") if f in FORMATS]

_GPU = next((b for b in metal.backends() if b in ("metal", "cuda")), None)
BACKENDS = [
    "cpu-emulator",
    pytest.param(_GPU or "gpu", id="gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
        _GPU is None, reason="no GPU backend here (needs MLX on Metal or CUDA)")]),
]


def _np(a) -> np.ndarray:
    return np.asarray(a) if isinstance(a, np.ndarray) else np.array(a)


def _same(fmt: str, got, want: np.ndarray) -> None:
    got = _np(got)
    assert got.dtype == np.uint8 and got.shape == want.shape, (got.shape, want.shape)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)[0]
        pytest.fail(f"{fmt}: kernel bytes differ from the reference first at {tuple(bad)}: "
                    f"{got[tuple(bad)]} vs {want[tuple(bad)]}")


def _block(fmt: str) -> int:
    return max(32, bridge.get_format(fmt).block_size)


def test_every_registered_format_is_supported():
    assert set(FORMATS) == set(bridge.formats())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_adversarial_rows(fmt, backend):
    bs = _block(fmt)
    x = adversarial_rows(block_size=bs, n_blocks=max(1, 256 // bs), per_family=12)
    opts = {"runs": 2} if backend == "cpu-emulator" else {}  # a second thread order: no race
    _same(fmt, quantize_append(fmt, x, backend=backend, **opts), bridge.quantize(fmt, x))
    assert metal.last_path() == backend


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_edge_rows(fmt, backend):
    bs = _block(fmt)
    n = 2 * bs
    i = np.arange(n, dtype=np.float32)
    rows = [
        np.zeros(n, np.float32),
        np.where(i % 3 == 0, np.float32(-0.0), np.float32(0.0)),               # zero signs
        np.concatenate([[-0.0], np.abs(np.linspace(0, 3, n - 1))]),            # first min is -0
        (i - n / 2) * np.float32(1e-44),                                      # 1/d overflows
        np.where(i % 2 == 0, 3e38, -3e38),                                    # max - min overflows
        np.tile([65504.0, -65504.0, 65520.0, 8.0 * 65504.0], n // 4),          # f16 overflow of d
        np.full(n, 1e-30), np.full(n, -7.0),
        (i % 17 - 8) / 8.0,                                                   # exact ties
    ]
    x = np.stack(rows).astype(np.float32)
    _same(fmt, quantize_append(fmt, x, backend=backend), bridge.quantize(fmt, x))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=max(10, settings().max_examples // 2))
@given(data=st.data())
def test_property_bytes_equal_reference(backend, data):
    fmt = data.draw(st.sampled_from(FORMATS), label="fmt")
    x = data.draw(float_matrices(block_size=_block(fmt), max_rows=3, max_blocks=4), label="x")
    extra = data.draw(st.integers(0, 2), label="extra leading axes")
    x = x.reshape((1,) * extra + x.shape)
    _same(fmt, quantize_append(fmt, x, backend=backend), bridge.quantize(fmt, x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src", ["float16", "bfloat16"])
@given(data=st.data())
@settings(max_examples=max(8, settings().max_examples // 4))
def test_16bit_sources(src, backend, data):
    import mlx.core as mx

    fmt = data.draw(st.sampled_from(SRC16_FORMATS), label="fmt")
    x = data.draw(float_matrices(block_size=_block(fmt), max_rows=2, max_blocks=3), label="x")
    with np.errstate(over="ignore"):
        xm = mx.array(x).astype(getattr(mx, src))
    x32 = np.array(xm.astype(mx.float32))
    sources = [xm] + ([x32.astype(np.float16)] if src == "float16" else [])  # numpy float16 too
    try:
        want = bridge.quantize(fmt, x32)
    except FormatError as e:  # values beyond the 16-bit range became inf: refused like the reference
        for rows in sources:
            with pytest.raises(FormatError, match="non-finite"):
                quantize_append(fmt, rows, backend=backend)
        assert "non-finite" in str(e)
        return
    for rows in sources:
        _same(fmt, quantize_append(fmt, rows, backend=backend), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite(backend):
    x = np.zeros((2, 128), np.float32)
    x[0, 3], x[1, 7], x[1, 9] = np.nan, np.inf, -np.inf
    x[0, 5] = np.uint32(0x7F800001).view(np.float32)
    for fmt in FORMATS:
        if bridge.get_format(fmt).kind == "float":  # float formats encode NaN/inf as the reference does
            _same(fmt, quantize_append(fmt, x, backend=backend), bridge.quantize(fmt, x))
        else:  # quantized formats refuse them with the reference's error
            with pytest.raises(FormatError) as ours:
                quantize_append(fmt, x, backend=backend)
            with pytest.raises(FormatError) as ref:
                bridge.quantize(fmt, x)
            assert str(ours.value) == str(ref.value)


def test_reference_path_and_errors():
    x = np.ones((2, 64), np.float32)
    _same("q8_0", quantize_append("q8_0", x, backend="reference"), bridge.quantize("q8_0", x))
    assert metal.last_path() == "reference"
    assert quantize_append("q4_0", np.zeros((0, 64), np.float32), backend="cpu-emulator").shape == (0, 36)
    with pytest.raises(FormatError, match="multiple of its block size 32"):
        quantize_append("q8_0", np.ones(33, np.float32), backend="cpu-emulator")
    with pytest.raises(FormatError, match="expected a float array"):
        quantize_append("q8_0", np.array([True] * 32), backend="cpu-emulator")
    with pytest.raises(KernelError, match="unknown backend"):
        quantize_append("q8_0", x, backend="opencl")
    assert "cpu-emulator" in metal.backends() and metal.backends()[-1] == "reference"


def test_auto_picks_the_first_backend():
    x = np.linspace(-1, 1, 128, dtype=np.float32)[None]
    out = quantize_append("turbo3", x)
    assert metal.last_path() == metal.backends()[0]
    _same("turbo3", out, bridge.quantize("turbo3", x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_iq4_nl_reference_quantizer(backend):
    # search=False: ggml's quantize_row_iq4_nl_ref, what llama.cpp writes into its KV cache
    x = adversarial_rows(block_size=32, n_blocks=8, per_family=12)
    want = bridge.quantize("iq4_nl", x, search=False)
    assert not np.array_equal(want, bridge.quantize("iq4_nl", x))   # the two quantizers differ here
    _same("iq4_nl", quantize_append("iq4_nl", x, backend=backend, search=False), want)
