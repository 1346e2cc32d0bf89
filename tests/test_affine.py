"""ggml legacy blocks <-> MLX affine triplets: exact both ways, refusals named, MLX's GGUF loader agrees."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

mx = pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'tqbridge[mlx]')")

from tqbridge.bridge import FormatError, dequantize, from_mlx_affine, get_format, quantize, to_mlx_affine  # noqa: E402
from tqbridge.bridge.blocks.affine import affine_formats  # noqa: E402
from tqbridge.bridge.blocks.legacy_fields import split_blocks  # noqa: E402
from tqbridge.parity.plugin.strategies import adversarial_rows, float_matrices  # noqa: E402

AFFINE_FORMATS = affine_formats()
assert AFFINE_FORMATS == ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
SYMMETRIC = ("q8_0", "q4_0", "q5_0")
BITS = {"q8_0": 8, "q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5}


def _mlx_dequant(w, s, b, g, bits) -> np.ndarray:
    return np.array(mx.dequantize(w, s, b, group_size=g, bits=bits))


def _inf_d(fmt: str, blocks: np.ndarray) -> bool:
    f = get_format(fmt)
    return bool(np.isinf(split_blocks(f, blocks.reshape(-1, f.type_size))["d"]).any())


def _check_exact(fmt: str, blocks: np.ndarray, n: int) -> None:
    """The contract on one set of blocks: refused (inf d, symmetric type) or exact both ways."""
    if fmt in SYMMETRIC and _inf_d(fmt, blocks):
        with pytest.raises(FormatError, match="infinite d"):
            to_mlx_affine(fmt, blocks, n)
        return
    w, s, b, g, bits = to_mlx_affine(fmt, blocks, n)
    assert (g, bits) == (32, BITS[fmt])
    assert w.dtype == mx.uint32 and s.dtype == mx.float32 and b.dtype == mx.float32
    ours = dequantize(fmt, blocks, n)
    theirs = _mlx_dequant(w, s, b, g, bits)
    # Values are equal (NaN where NaN); a zero's sign may differ (d*(q-k) vs d*q - k*d).
    assert np.array_equal(ours, theirs, equal_nan=True)
    back = from_mlx_affine(fmt, w, s, b, g, bits)
    assert back.dtype == np.uint8 and np.array_equal(back, blocks)


@pytest.mark.parametrize("fmt", AFFINE_FORMATS)
def test_adversarial_rows_exact(fmt):
    x = adversarial_rows(block_size=32, n_blocks=4)
    blocks = quantize(fmt, x)
    _check_exact(fmt, blocks, x.shape[-1])
    # Rows whose blocks all have finite d must have converted: check that most did.
    ok = [not _inf_d(fmt, blocks[i:i + 1]) for i in range(len(blocks))]
    assert sum(ok) > len(ok) // 2
    for i in np.flatnonzero(ok)[::37]:
        _check_exact(fmt, blocks[i:i + 1], x.shape[-1])


@pytest.mark.parametrize("fmt", AFFINE_FORMATS)
@given(x=float_matrices(block_size=32, max_rows=3, max_blocks=6))
def test_quantized_rows_exact(fmt, x):
    _check_exact(fmt, quantize(fmt, x), x.shape[-1])


@pytest.mark.parametrize("fmt", AFFINE_FORMATS)
@given(data=st.data())
@example(data=None)  # replaced below by the all-0xFF block (d = NaN)
def test_any_block_bytes_round_trip(fmt, data):
    """Arbitrary bytes (NaN, subnormal, negative d; any codes) convert exactly or are refused."""
    f = get_format(fmt)
    if data is None:
        raw = bytes([0xFF]) * (2 * f.type_size)
    else:
        nb = data.draw(st.integers(1, 4))
        raw = data.draw(st.binary(min_size=nb * f.type_size, max_size=nb * f.type_size))
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(1, -1)
    with np.errstate(all="ignore"):
        _check_exact(fmt, blocks, blocks.shape[1] // f.type_size * 32)


@pytest.mark.parametrize("fmt", AFFINE_FORMATS)
def test_shapes_and_leading_axes(fmt):
    x = np.random.default_rng(1).standard_normal((2, 3, 96)).astype(np.float32)
    blocks = quantize(fmt, x)
    w, s, b, g, bits = to_mlx_affine(fmt, blocks, 96)
    assert tuple(w.shape) == (2, 3, 96 * bits // 32) and tuple(s.shape) == tuple(b.shape) == (2, 3, 3)
    assert np.array_equal(from_mlx_affine(fmt, w, s, b, g, bits), blocks)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_packing_is_mlx_packing(bits):
    """mx.dequantize with scale 1 and bias 0 reads our packed words back as the codes we packed."""
    from tqbridge.bridge.blocks.affine import pack_codes, unpack_codes

    codes = np.random.default_rng(2).integers(0, 2**bits, size=(6, 32)).astype(np.uint8)
    codes[0], codes[1] = 0, 2**bits - 1
    w = pack_codes(codes, bits)
    assert w.shape == (6, bits) and w.dtype == np.uint32
    got = _mlx_dequant(mx.array(w), mx.ones((6, 1)), mx.zeros((6, 1)), 32, bits)
    assert np.array_equal(got, codes.astype(np.float32))
    assert np.array_equal(unpack_codes(w, bits, 32), codes)


def test_group_size_64_and_128():
    """Groups larger than 32 map to several ggml blocks sharing a scale and bias."""
    rng = np.random.default_rng(3)
    for g in (64, 128):
        codes = rng.integers(0, 16, size=(3, 256))
        s = rng.standard_normal((3, 256 // g)).astype(np.float16).astype(np.float32)
        b = rng.standard_normal((3, 256 // g)).astype(np.float16).astype(np.float32)
        from tqbridge.bridge.blocks.affine import pack_codes

        w = pack_codes(codes.reshape(-1, 32), 4).reshape(3, -1)
        blocks = from_mlx_affine("q4_1", mx.array(w), mx.array(s), mx.array(b), g, 4)
        ref = _mlx_dequant(mx.array(w), mx.array(s), mx.array(b), g, 4)
        assert np.array_equal(dequantize("q4_1", blocks, 256), ref)


@pytest.mark.parametrize("fmt", AFFINE_FORMATS)
def test_float16_scales_keep_the_numbers(fmt):
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32) * 100
    blocks = quantize(fmt, x)
    w, s, b, g, bits = to_mlx_affine(fmt, blocks, 64, dtype=mx.float16)
    assert s.dtype == mx.float16 and b.dtype == mx.float16
    w32, s32, b32, _, _ = to_mlx_affine(fmt, blocks, 64)
    assert np.array_equal(np.array(s.astype(mx.float32)), np.array(s32))
    assert np.array_equal(np.array(b.astype(mx.float32)), np.array(b32))
    assert np.array_equal(from_mlx_affine(fmt, w, s, b, g, bits), blocks)


def test_float16_bias_overflow_refused():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 120000.0  # q8_0: d = 945, -128*d overflows float16
    blocks = quantize("q8_0", x)
    with pytest.raises(FormatError, match="overflows float16"):
        to_mlx_affine("q8_0", blocks, 32, dtype=mx.float16)
    _check_exact("q8_0", blocks, 32)  # float32 scales hold it


@pytest.mark.parametrize("fmt", ["iq4_nl", "f16", "f32", "bf16", "turbo3", "turbo4"])
def test_non_affine_formats_refused(fmt):
    f = get_format(fmt)
    blocks = np.zeros((1, f.type_size), np.uint8)
    with pytest.raises(FormatError, match=rf"{f.key} cannot be converted.*: .+"):
        to_mlx_affine(fmt, blocks, f.block_size)
    w, s, b = mx.zeros((1, 4), mx.uint32), mx.zeros((1, 1)), mx.zeros((1, 1))
    with pytest.raises(FormatError, match=rf"{f.key} cannot be converted"):
        from_mlx_affine(fmt, w, s, b, 32, 4)


def _triplet(fmt, rows=2, n=64):
    x = np.random.default_rng(5).standard_normal((rows, n)).astype(np.float32)
    return to_mlx_affine(fmt, quantize(fmt, x), n)


def test_unrepresentable_triplets_refused():
    x = mx.array(np.random.default_rng(6).standard_normal((2, 64)).astype(np.float32))
    # mx.quantize: float32 scales that are not float16 values
    for fmt, bits in (("q4_1", 4), ("q5_1", 5), ("q4_0", 4), ("q8_0", 8), ("q5_0", 5)):
        w, s, b = mx.quantize(x, group_size=32, bits=bits)
        with pytest.raises(FormatError, match="not exactly representable in float16"):
            from_mlx_affine(fmt, w, s, b, 32, bits)
    # float16-exact scales but a free bias: fine for q4_1, refused for q4_0
    w, s, b, g, bits = _triplet("q4_1")
    from_mlx_affine("q4_1", w, s, b, g, bits)
    with pytest.raises(FormatError, match=r"is not -8\*scale"):
        from_mlx_affine("q4_0", w, s, b, g, bits)
    # a q4_1 bias that is not a float16 value
    with pytest.raises(FormatError, match="bias .* not exactly representable"):
        from_mlx_affine("q4_1", w, s, b + 1e-4, g, bits)
    # q8_0 needs bias = -128*scale exactly
    w, s, b, g, bits = _triplet("q8_0")
    with pytest.raises(FormatError, match=r"is not -128\*scale"):
        from_mlx_affine("q8_0", w, s, b * 0.5, g, bits)
    # an infinite scale in a symmetric type
    s_inf = mx.array(np.where(np.arange(s.size).reshape(s.shape) == 1, np.inf, np.array(s)).astype(np.float32))
    with pytest.raises(FormatError, match="infinite"):
        from_mlx_affine("q8_0", w, s_inf, -128 * s_inf, g, bits)


def test_bad_arguments_refused():
    w, s, b, g, bits = _triplet("q4_0")
    with pytest.raises(FormatError, match="holds 4-bit codes, got bits=5"):
        from_mlx_affine("q4_0", w, s, b, g, 5)
    with pytest.raises(FormatError, match="group_size must be"):
        from_mlx_affine("q4_0", w, s, b, 16, bits)
    with pytest.raises(FormatError, match="w must be uint32"):
        from_mlx_affine("q4_0", w.astype(mx.int32), s, b, g, bits)
    with pytest.raises(FormatError, match="shapes do not match"):
        from_mlx_affine("q4_0", w, s[:1], b, g, bits)
    with pytest.raises(FormatError, match="does not match"):
        from_mlx_affine("q4_0", w[:, :-1], s, b, g, bits)
    with pytest.raises(FormatError, match="takes 36 bytes"):
        to_mlx_affine("q4_0", np.zeros((1, 35), np.uint8), 64)
    with pytest.raises(FormatError, match="must be uint8"):
        to_mlx_affine("q4_0", np.zeros((1, 36), np.int16), 64)
    with pytest.raises(FormatError, match="not a positive multiple"):
        to_mlx_affine("q4_0", np.zeros((1, 36), np.uint8), 48)
    with pytest.raises(FormatError, match="unknown format"):
        to_mlx_affine("q4_9", np.zeros((1, 36), np.uint8), 64)
    with pytest.raises(FormatError, match="float32 or float16"):
        to_mlx_affine("q4_0", np.zeros((1, 36), np.uint8), 64, dtype=mx.bfloat16)


# --- MLX's own GGUF loader (q4_0, q4_1, q8_0) as a cross-check --------------------------------

LOADER_FORMATS = ("q8_0", "q4_0", "q4_1")


def _mlx_names(name: str) -> tuple[str, str, str]:
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    return name, base + ".scales", base + ".biases"


def test_mlx_gguf_loader_agrees(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(7)
    adv = adversarial_rows(block_size=32, n_blocks=2, per_family=8)
    # rows whose q4_0 d stays finite (q4_0 overflows first: d = max/-8); inf d is refused by design
    adv = adv[np.abs(adv).max(axis=-1) < 8 * 65504 * 0.99]
    path = tmp_path / "affine.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tensors = {}
    for fmt in LOADER_FORMATS:
        qtype = gguf.GGMLQuantizationType[fmt.upper()]
        for kind, x in (("normal", rng.standard_normal((16, 128)).astype(np.float32) * 0.05),
                        ("adversarial", adv)):
            name = f"{fmt}.{kind}.weight"
            blocks = quantize(fmt, x)
            tensors[name] = (fmt, blocks, x.shape[-1])
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    loaded = mx.load(str(path))
    checked_biases = 0
    for name, (fmt, blocks, n) in tensors.items():
        kw, ks, kb = _mlx_names(name)
        w_l, s_l, b_l = loaded[kw], loaded[ks], loaded[kb]
        w, s, b, g, bits = to_mlx_affine(fmt, blocks, n)
        assert np.array_equal(np.array(w_l), np.array(w)), name
        s_l32 = np.array(s_l.astype(mx.float32))
        assert np.array_equal(s_l32, np.array(s), equal_nan=True), name
        # MLX computes -k*d in float16: equal to ours wherever that does not overflow float16.
        b_l32, b32 = np.array(b_l.astype(mx.float32)), np.array(b)
        fin = np.isfinite(b_l32)
        assert np.array_equal(b_l32[fin], b32[fin]), name
        checked_biases += int(fin.sum())
        # Their triplet, widened to float32, dequantizes to exactly our reference values.
        if np.isinf(s_l32).any():
            continue
        mask = np.isfinite(b_l32).all(axis=-1)
        ref = dequantize(fmt, blocks, n)[mask]
        got = np.array(mx.dequantize(w_l, mx.array(s_l32), mx.array(b_l32), group_size=32, bits=bits))[mask]
        assert np.array_equal(got, ref, equal_nan=True), name
        # and converting their triplet back gives the file's bytes
        if fin.all():
            assert np.array_equal(from_mlx_affine(fmt, w_l, s_l, b_l, 32, bits), blocks), name
    assert checked_biases > 0


# --- on a GPU backend (Metal or CUDA): MLX's dequantize kernel, not the CPU fallback -------------

_HAS_GPU = mx.is_available(mx.gpu)


@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_GPU, reason="no MLX GPU backend (Metal or CUDA) on this machine")
@pytest.mark.parametrize("fmt", AFFINE_FORMATS)
def test_gpu_dequantize_exact(fmt):
    """The exactness argument does not depend on FMA or evaluation order: check the GPU kernel."""
    f = get_format(fmt)
    x = adversarial_rows(block_size=32, n_blocks=4)
    x = x[np.abs(x).max(axis=-1) < 8 * 65504 * 0.99]
    rng = np.random.default_rng(8)
    raw = rng.integers(0, 256, size=(256, 4 * f.type_size), dtype=np.uint8)
    for blocks in (quantize(fmt, x), raw):
        keep = ~np.array([_inf_d(fmt, r[None]) for r in blocks]) if fmt in SYMMETRIC else slice(None)
        blocks = blocks[keep]
        w, s, b, g, bits = to_mlx_affine(fmt, blocks, 128)
        with np.errstate(all="ignore"):
            ref = dequantize(fmt, blocks, 128)
        got = np.array(mx.dequantize(w, s, b, group_size=g, bits=bits, stream=mx.gpu))
        assert np.array_equal(got, ref, equal_nan=True)


def _span(doc: str, pattern: str) -> tuple:
    found = list(re.finditer(pattern, doc))
    assert len(found) == 1, f"{len(found)} matches of {pattern!r}"
    return found[0].groups()


def _about(shown: str, value: float) -> bool:
    """A round number such as ``65 000``: ``value`` rounded to its last non-zero digit."""
    s = shown.replace(" ", "")
    zeros = len(s) - len(s.rstrip("0"))
    return abs(int(s) - value) <= 0.5 * 10 ** zeros


def test_mlx_gguf_loader_float16_limits(tmp_path):
    """The q8_0 limits the page states for MLX's own GGUF loader, read off the page: d above the first
    threshold (65504 / 128) loads with bias -inf; d above the second (65504 / 255) loads finite but
    dequantizes to inf in float16 (the page's block of +-x), while tqbridge's float32 triplet decodes it
    exactly; blocks just below each threshold stay finite. The refusal sentence quotes the first too."""
    gguf = pytest.importorskip("gguf")
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    from tqbridge.bridge import dequantize, quantize, to_mlx_affine

    doc = " ".join((Path(__file__).resolve().parents[1] / "docs/affine-and-inspect.md").read_text().split())
    (refused,) = _span(doc, r"a q8_0 bias −128·d that would overflow float16 \(d > ([\d.]+)\) is refused")
    bias_d, bias_x = _span(doc, r"- q8_0 blocks with d > ([\d.]+) \(\|x\| above ~([\d ]+)\) load with bias = −inf;")
    inf_d, inf_x, block = _span(doc, r"- q8_0 blocks with d > ([\d.]+) \(\|x\| above ~([\d ]+)\) load with finite numbers, "
                                    r"but `mx.dequantize` in float16 overflows d·code to inf \(a block of ±([\d ]+) decodes")
    f16_max = float(np.finfo(np.float16).max)
    assert float(refused) == float(bias_d) == f16_max / 128 and abs(float(inf_d) - f16_max / 255) <= 0.05
    assert _about(bias_x, float(bias_d) * 127) and _about(inf_x, f16_max / 255 * 127)
    x_inf = float(block.replace(" ", ""))
    assert f16_max / 255 < x_inf / 127 < f16_max / 128   # the page's block is between the two limits
    x = np.zeros((5, 32), np.float32)
    x[0, ::2], x[0, 1::2] = x_inf, -x_inf                 # the page's block: d above the second limit only
    x[1, 0] = 1.01 * 127 * float(bias_d)                  # just above the first limit
    x[2, :] = np.linspace(-1, 1, 32)
    x[3, 0] = 0.99 * 127 * float(bias_d)                  # just below the first limit
    x[4, 0] = 0.99 * 127 * float(inf_d)                   # just below the second limit
    blocks = quantize("q8_0", x)
    path = tmp_path / "limits.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t.weight", blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded = mx.load(str(path))
    wl, sl, bl = loaded["t.weight"], loaded["t.scales"], loaded["t.biases"]
    b = np.array(bl.astype(mx.float32)).ravel()
    assert np.isneginf(b[1]) and np.isfinite(b[[0, 2, 3, 4]]).all()
    y16 = np.array(mx.dequantize(wl, sl, bl, group_size=32, bits=8).astype(mx.float32))
    assert np.isinf(y16[0]).any() and np.isfinite(y16[[2, 4]]).all()
    wq, s, bb, g, bits = to_mlx_affine("q8_0", blocks, 32)
    y32 = np.array(mx.dequantize(wq, s, bb, group_size=g, bits=bits))
    assert np.array_equal(y32[0], dequantize("q8_0", blocks, 32)[0])
