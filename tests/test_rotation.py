"""The TurboQuant rotation: the inverse against the fork's own C (its ggml_turbo_wht, through the decode
goldens) bit for bit; the forward against a transcription of the C operation order; inverse,
orthogonality, numpy == MLX bit for bit."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tqbridge.bridge.blocks import rotation

GROUPS = [128, 64]
# float32 round trip: 7 butterfly stages each way plus two scalings; each value picks up a few ulps
# of the group's norm. 1e-6 of the norm is ~8 float32 ulps (2**-23 = 1.19e-7).
ROUNDTRIP_REL = 1e-6


def _c_order_forward(x: np.ndarray, s1: np.ndarray, s2: np.ndarray, scale: np.float32) -> np.ndarray:
    """Scalar float32 loops in the order of the fork's turbo_cpu_fwht (written from its description)."""
    v = [np.float32(a) * np.float32(s) for a, s in zip(x, s1)]
    n = len(v)
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = np.float32(a + b), np.float32(a - b)
        h *= 2
    return np.array([a * np.float32(scale * s) for a, s in zip(v, s2)], dtype=np.float32)


def test_sign_tables_match_the_spec_and_are_read_only():
    s1, s2 = rotation.sign_tables(128)
    assert s1.dtype == s2.dtype == np.float32
    assert set(np.unique(s1)) == set(np.unique(s2)) == {-1.0, 1.0}
    # first entries of the fork's tables (specs/turbo-formats.md): s1 = - + + - -, s2 = + + + + -
    assert s1[:5].tolist() == [-1, 1, 1, -1, -1] and s2[:5].tolist() == [1, 1, 1, 1, -1]
    # counts of +1 in the fork's turbo_cpu_s1 / turbo_cpu_s2 arrays (ggml-turbo-quant.c @ 69d8e4b)
    assert (int((s1 > 0).sum()), int((s2 > 0).sum())) == (68, 58)
    g1, g2 = rotation.sign_tables(64)
    assert np.array_equal(g1, s1[:64]) and np.array_equal(g2, s2[:64])
    with pytest.raises(ValueError):
        s1[0] = 1.0
    assert rotation.SCALES[128] == np.float32(0.08838834764831845) and rotation.SCALES[64] == np.float32(0.125)


@pytest.mark.parametrize("variant", ["fork-69d8e4b", "fork-pr197"])
def test_inverse_is_the_forks_c_bit_for_bit(variant):
    """The decode goldens (tests/data/turbo/PROVENANCE.md) hold each row as the fork's C decoded it, in
    the rotated basis and after its CPU inverse rotation: our inverse of the first is the second, every
    float32 bit (3 types x (232 rows of 128, 256 and 512 values + 512 random blocks): 6,408 groups of 128)."""
    from pathlib import Path

    d = np.load(Path(__file__).parent / "data" / "turbo" / f"{variant}-decoded.npz")
    rows = 0
    for key in d.files:
        if key.endswith("_rotated"):
            rot, want = d[key], d[key.replace("_rotated", "_original")]
            got = rotation.inverse(rot.reshape(-1, 128), 128).reshape(rot.shape)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), key
            rows += rot.size // 128
    assert rows == 3 * (232 * (1 + 2 + 4) + 512), rows


@pytest.mark.parametrize("group", GROUPS)
def test_forward_follows_a_transcription_of_the_c_operation_order_bit_for_bit(group):
    """Against ``_c_order_forward``, written from the fork's description of turbo_cpu_fwht (the forward
    has no C output in the goldens of its own; the quantizer's golden bytes check it through the
    encode, tests/test_turbo_golden.py)."""
    rng = np.random.default_rng(group)
    x = (rng.standard_normal((4, group)) * np.array([[1e-3], [1.0], [7.0], [1e4]])).astype(np.float32)
    s1, s2 = rotation.sign_tables(group)
    got = rotation.forward(x, group)
    for row, g in zip(x, got):
        assert np.array_equal(g, _c_order_forward(row, s1, s2, rotation.SCALES[group]))
        assert np.array_equal(rotation.inverse(g[None], group)[0], _c_order_forward(g, s2, s1, rotation.SCALES[group]))


@pytest.mark.parametrize("group", GROUPS)
def test_matrix_is_orthogonal_and_matches_forward(group):
    r = rotation.matrix(group)
    assert np.allclose(r @ r.T, np.eye(group), rtol=0, atol=1e-12)
    # every entry is +-1/sqrt(group): a Hadamard matrix up to signs
    assert np.allclose(np.abs(r), 1 / np.sqrt(group), rtol=0, atol=1e-15)
    x = np.random.default_rng(0).standard_normal((3, group)).astype(np.float32)
    want = x.astype(np.float64) @ r.T
    assert np.allclose(rotation.forward(x, group), want, rtol=0, atol=ROUNDTRIP_REL * np.abs(want).max() * 10)


@pytest.mark.parametrize("group", GROUPS)
@given(seed=st.integers(0, 2**32 - 1), log_scale=st.integers(-30, 30))
def test_inverse_undoes_forward_and_norm_is_kept(group, seed, log_scale):
    x = (np.random.default_rng(seed).standard_normal((2, group)) * 2.0 ** log_scale).astype(np.float32)
    y = rotation.forward(x, group)
    back = rotation.inverse(y, group)
    nx = np.linalg.norm(x.astype(np.float64), axis=1)
    ny = np.linalg.norm(y.astype(np.float64), axis=1)
    assert np.all(np.abs(ny - nx) <= ROUNDTRIP_REL * nx)
    assert np.all(np.abs(back - x).max(axis=1) <= ROUNDTRIP_REL * nx)


@pytest.mark.parametrize("group", GROUPS)
def test_mlx_rotation_is_bit_identical_to_numpy(group):
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    x = (np.random.default_rng(1).standard_normal((5, 3, group)) * 3.0).astype(np.float32)
    for f_np, f_mx in ((rotation.forward, rotation.mlx_forward), (rotation.inverse, rotation.mlx_inverse)):
        assert np.array_equal(np.array(f_mx(mx.array(x), group)), f_np(x, group))


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="group must be one of"):
        rotation.forward(np.zeros((1, 32), np.float32), 32)
    with pytest.raises(ValueError, match="last axis has length 100"):
        rotation.forward(np.zeros((1, 100), np.float32))
    with pytest.raises(TypeError, match="float32"):
        rotation.forward(np.zeros((1, 128), np.float64))
