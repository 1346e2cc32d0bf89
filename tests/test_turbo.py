"""Turbo formats: registry entries, kernel spec, dequantize bases, padding, errors, CLI listing."""

import json

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge import FormatError
from tqbridge.bridge.blocks import rotation
from tqbridge.bridge.blocks.turbo import SPECS, TurboSpec

# (name, variant) -> (block bytes, ggml type ids by where they apply); specs/turbo-formats.md and
# the reference-vector README (type ids the vectors were produced with).
EXPECTED = {
    ("turbo2", "fork-pr197"): (34, {"thecodacus/llama.cpp@40f2036": 43}),
    ("turbo3", "fork-pr197"): (50, {"thecodacus/llama.cpp@40f2036": 44}),
    ("turbo4", "fork-pr197"): (66, {"thecodacus/llama.cpp@40f2036": 45}),
    ("turbo2", "fork-69d8e4b"): (34, {"TheTom/llama-cpp-turboquant@69d8e4b": 42}),
    ("turbo3", "fork-69d8e4b"): (50, {"TheTom/llama-cpp-turboquant@69d8e4b": 43}),
    ("turbo4", "fork-69d8e4b"): (68, {"TheTom/llama-cpp-turboquant@69d8e4b": 44}),
    ("turbo2", "g64"): (18, {}),
    ("turbo3", "g64"): (26, {}),
    ("turbo4", "g64"): (34, {}),
}
ALL = [f"{n}@{v}" for n, v in EXPECTED]


def test_registry_names_variants_sizes_and_type_ids():
    names = bridge.formats()
    for t in ("turbo2", "turbo3", "turbo4"):
        assert t in names and f"{t}@fork-69d8e4b" in names and f"{t}@g64" in names
        assert bridge.get_format(t).variant == "fork-pr197"  # the default variant
        assert bridge.display_name(f"{t}@fork-pr197") == t
    for (name, variant), (nbytes, ids) in EXPECTED.items():
        f = bridge.get_format(f"{name}@{variant}")
        assert (f.name, f.variant, f.kind) == (name, variant, "turbo")
        assert f.type_size == nbytes == f.codec.spec.block_bytes
        assert f.block_size == f.codec.spec.group == (64 if variant == "g64" else 128)
        assert dict(f.type_ids) == ids
        assert f.extension == (variant == "g64")
    assert bridge.get_format("turbo3").bits_per_value == 3.125
    assert bridge.get_format("turbo4@fork-69d8e4b").bits_per_value == 4.25
    with pytest.raises(FormatError, match="unknown variant 'fork-xyz' of turbo3; known variants: fork-69d8e4b, fork-pr197, g64"):
        bridge.get_format("turbo3@fork-xyz")


@pytest.mark.parametrize("key", ALL)
def test_spec_is_consistent_with_the_block_layout(key):
    sp = bridge.get_format(key).codec.spec
    assert isinstance(sp, TurboSpec) and SPECS[key] is sp
    assert sp.centroids.dtype == sp.midpoints.dtype == sp.s1.dtype == sp.s2.dtype == np.float32
    assert sp.centroids.shape == (sp.levels,) and sp.midpoints.shape == (sp.levels - 1,)
    assert np.all(np.diff(sp.centroids) > 0) and np.array_equal(sp.centroids, -sp.centroids[::-1])
    assert sp.midpoints[sp.levels // 2 - 1] == 0.0
    # every midpoint lies strictly between its two centroids
    assert np.all(sp.centroids[:-1] < sp.midpoints) and np.all(sp.midpoints < sp.centroids[1:])
    s1, s2 = rotation.sign_tables(sp.group)
    assert np.array_equal(sp.s1, s1) and np.array_equal(sp.s2, s2) and sp.scale == rotation.SCALES[sp.group]
    assert sp.scale.dtype == np.float32 and sp.zero_threshold == np.float32(1e-10)
    for a in (sp.centroids, sp.midpoints, sp.s1, sp.s2):
        assert not a.flags.writeable
    # fields tile the block without gaps
    fields = [(sp.norm_offset, 2), (sp.qs_offset, sp.qs_bytes)]
    if sp.rnorm_offset is not None:
        fields.append((sp.rnorm_offset, 2))
    if sp.signs_offset is not None:
        fields.append((sp.signs_offset, sp.signs_bytes))
    end = 0
    for off, size in sorted(fields):
        assert off == end
        end += size
    assert end == sp.block_bytes
    assert sp.qs_bytes * 8 + sp.signs_bytes * 8 == sp.group * sp.bits


def test_turbo3_layout_facts():
    sp = SPECS["turbo3@fork-pr197"]
    assert (sp.qs_offset, sp.qs_bytes, sp.signs_offset, sp.signs_bytes) == (2, 32, 34, 16)
    sp4 = SPECS["turbo4@fork-69d8e4b"]
    assert (sp4.rnorm_offset, sp4.qs_offset, sp4.qs_bytes) == (2, 4, 64)
    # corrected vs old 3-bit outer centroid (specs/turbo-formats.md)
    assert SPECS["turbo3@fork-pr197"].centroids[-1] == np.float32(0.190207)
    assert SPECS["turbo3@fork-69d8e4b"].centroids[-1] == np.float32(0.190685)


@pytest.mark.parametrize("key", ALL)
def test_pack_and_unpack_are_inverse_on_every_index(key):
    codec = bridge.get_format(key).codec
    sp = codec.spec
    rng = np.random.default_rng(7)
    idx = rng.integers(0, sp.levels, (9, sp.group)).astype(np.uint8)
    idx[0] = np.arange(sp.group) % sp.levels
    norm = rng.standard_normal(9).astype(np.float16).astype(np.float32)
    blocks = codec.pack(norm, idx)
    n2, i2 = codec.unpack(blocks)
    assert np.array_equal(i2, idx) and np.array_equal(n2, norm)
    if sp.rnorm_offset is not None:
        assert not blocks[:, 2:4].any()
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    n3, i3 = codec.mlx_unpack(mx.array(blocks))
    assert np.array_equal(np.array(i3), idx) and np.array_equal(np.array(n3), norm)
    assert np.array_equal(np.array(codec._mlx_pack(mx, mx.array(norm), mx.array(idx))), blocks)


def test_bit_order_of_one_element():
    # element j=5 of turbo3 with index 6 (binary 110): qs[1] bits 2..3 = 0b10, signs[0] bit 5 = 1
    codec = bridge.get_format("turbo3").codec
    idx = np.full((1, 128), 0, np.uint8)
    idx[0, 5] = 6
    b = codec.pack(np.zeros(1, np.float32), idx)
    assert b[0, 2 + 1] == 0b10 << 2 and b[0, 34] == 1 << 5
    # turbo4: even j in the low nibble
    c4 = bridge.get_format("turbo4").codec
    idx4 = np.zeros((1, 128), np.uint8)
    idx4[0, 2], idx4[0, 3] = 9, 4
    assert c4.pack(np.zeros(1, np.float32), idx4)[0, 2 + 1] == 0x49


@pytest.mark.parametrize("key", ALL)
def test_dequantize_bases(key):
    fmt = bridge.get_format(key)
    g = fmt.block_size
    x = np.random.default_rng(3).standard_normal((4, 2 * g)).astype(np.float32)
    b = bridge.quantize(fmt, x)
    rot = bridge.dequantize(fmt, b, 2 * g, rotated=True)
    orig = bridge.dequantize(fmt, b, 2 * g)
    # rotated: exactly centroid * fp16 norm, what the fork's dequantize_row_turbo* returns
    norm, idx = fmt.codec.unpack(b.reshape(-1, fmt.type_size))
    assert np.array_equal(rot.reshape(-1, g), fmt.codec.spec.centroids[idx] * norm[:, None])
    # original basis: the inverse rotation of the rotated values, exactly
    assert np.array_equal(orig.reshape(-1, g), rotation.inverse(rot.reshape(-1, g), g))
    # and close to the input (the rotated values are far from it)
    err_orig = np.linalg.norm(orig - x) / np.linalg.norm(x)
    err_rot = np.linalg.norm(rot - x) / np.linalg.norm(x)
    assert err_orig < 0.4 < err_rot  # 2-bit relative error is ~0.34 (sqrt of 0.117)


@pytest.mark.parametrize("d, want128, want64", [(64, 128, 64), (80, 128, 128), (96, 128, 128), (128, 128, 128),
                                                (256, 256, 256), (576, 640, 576)])
def test_padded_dim(d, want128, want64):
    assert bridge.padded_dim("turbo3", d) == want128
    assert bridge.padded_dim("turbo3@g64", d) == want64


@pytest.mark.parametrize("d", [64, 80, 96, 576])
def test_padding_is_explicit_and_reversible(d):
    x = np.random.default_rng(d).standard_normal((2, 3, d)).astype(np.float32)
    xp = bridge.pad_rows("turbo4", x)
    assert xp.shape == (2, 3, bridge.padded_dim("turbo4", d))
    assert np.array_equal(xp[..., :d], x) and not xp[..., d:].any()
    assert np.array_equal(bridge.unpad_rows("turbo4", xp, d), x)
    p = xp.shape[-1]
    y = bridge.unpad_rows("turbo4", bridge.dequantize("turbo4", bridge.quantize("turbo4", xp), p), d)
    assert y.shape == x.shape and np.linalg.norm(y - x) / np.linalg.norm(x) < 0.15  # 4-bit: ~0.096
    with pytest.raises(FormatError, match=f"padded to {p}, but the last axis has length {d}"):
        bridge.unpad_rows("turbo4", x, d)  # every d here needs padding
    with pytest.raises(FormatError, match="multiple of its block size 128"):
        bridge.quantize("turbo4", x)


def test_padding_matches_the_fork_zero_fill():
    # a padded 64-value head quantizes the same as the zero-filled 128 row the fork builds
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    manual = np.concatenate([x, np.zeros((5, 64), np.float32)], axis=1)
    assert np.array_equal(bridge.quantize("turbo3", bridge.pad_rows("turbo3", x)), bridge.quantize("turbo3", manual))


def test_bad_input_is_a_clear_error():
    x = np.zeros((1, 128), np.float32)
    x[0, 7] = np.nan
    with pytest.raises(FormatError, match="turbo3@fork-pr197: non-finite input value nan in block 0"):
        bridge.quantize("turbo3", x)
    with pytest.raises(FormatError, match="takes 50 bytes"):
        bridge.dequantize("turbo3", np.zeros((1, 66), np.uint8), 128)
    with pytest.raises(FormatError, match="positive integer"):
        bridge.padded_dim("turbo3", 0)
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    with pytest.raises(FormatError, match="non-finite"):
        bridge.mlx_quantize("turbo3", mx.array(x))


def test_cli_lists_turbo_rows(capsys):
    from tqbridge.tools.cli import main

    assert main(["formats", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["turbo4"]["variant"] == "fork-pr197" and rows["turbo4"]["block_bytes"] == 66
    assert rows["turbo4@fork-69d8e4b"]["type_ids"] == {"TheTom/llama-cpp-turboquant@69d8e4b": 44}
    assert rows["turbo3@g64"]["extension"] is True and rows["turbo3@g64"]["bits_per_value"] == 3.25
    assert main(["formats"]) == 0
    table = capsys.readouterr().out
    assert "turbo3@fork-69d8e4b" in table and "thecodacus/llama.cpp@40f2036=44" in table
