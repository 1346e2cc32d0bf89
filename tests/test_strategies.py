import numpy as np
import pytest
from hypothesis import given

from tqbridge.parity.plugin import strategies as S


def test_adversarial_rows_default_shape_and_determinism():
    a = S.adversarial_rows()
    assert a.shape == (720, 128) and a.dtype == np.float32
    assert np.isfinite(a).all()
    assert np.array_equal(a.view(np.uint32), S.adversarial_rows().view(np.uint32))
    assert not np.array_equal(a, S.adversarial_rows(seed=1))


def test_families_have_their_property():
    n = 64
    rows = {f: S.adversarial_rows(families=[f], per_family=20, n_blocks=2) for f in S.FAMILIES}
    assert (rows["zeros"] == 0).all() and np.signbit(rows["zeros"]).any() and (~np.signbit(rows["zeros"])).any()
    assert all(len(np.unique(r)) == 1 for r in rows["all_equal"])
    tiny = np.abs(rows["tiny"])
    assert tiny.max() < 2.0**-13 and ((tiny > 0) & (tiny < np.finfo(np.float32).tiny)).any()
    assert np.abs(rows["huge"]).max() > 1e30
    assert (np.abs(rows["max_f16"]) == 65504).any()
    ms = rows["mixed_signs"]
    assert (np.sign(ms[:, 1:]) == -np.sign(ms[:, :-1])).all()
    for seed, e, peak in [(0, -3, 127), (1, 0, 8), (2, 5, 15), (3, -20, 31)]:
        t = S.make_row("ties", 64, seed, scale_exp=e, peak=peak).astype(np.float64) / np.ldexp(1.0, e)
        assert (np.mod(2 * t, 1.0) == 0).all() and (np.mod(t, 1.0) == 0.5).sum() >= 16
        assert np.abs(t).max() == peak
    o = np.abs(rows["outlier"])
    assert (o.max(axis=1) >= 9 * np.median(o, axis=1)).all()


def test_nonfinite_families_need_permission():
    with pytest.raises(ValueError, match="allow_nan=True"):
        S.float_rows(families=["nan"])
    with pytest.raises(ValueError, match="unknown family"):
        S.float_rows(families=["gauss"])
    with pytest.raises(TypeError, match="not the string"):
        S.float_rows(families="zeros")


@pytest.mark.parametrize("kwargs, match", [
    (dict(min_blocks=3, max_blocks=2), "max_blocks=2 is smaller than min_blocks=3"),
    (dict(block_size=0), "block_size must be >= 1"),
    (dict(max_scale_exp=200), "overflows float32"),
    (dict(patches=-1), "patches must be >= 0"),
    (dict(block_size=2.5), "block_size must be an int"),
])
def test_float_rows_validates_up_front(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        S.float_rows(**kwargs)


@given(S.float_rows(block_size=16, min_blocks=2, max_blocks=3, allow_nan=True, allow_infinity=True))
def test_float_rows_shapes(x):
    assert x.dtype == np.float32 and x.ndim == 1 and x.size in (32, 48)


@given(S.float_matrices(block_size=32, min_rows=2, max_rows=3, max_blocks=2))
def test_float_matrices_shapes(x):
    assert x.dtype == np.float32 and x.shape[0] in (2, 3) and x.shape[1] in (32, 64)
