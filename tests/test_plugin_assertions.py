"""Assertion helpers: they pass on agreement and their failure messages say what differs and where."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.parity import testing as tqt


def _rows(n, d, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_blocks_equal_passes_and_names_the_first_differing_block():
    x = _rows(3, 64)
    want = bridge.quantize("q4_1", x)
    assert tqt.assert_blocks_equal(want.copy(), want, "q4_1") == {"blocks": 6, "differing": 0}
    got = want.copy()
    got[1, 20 + 5] ^= 0x10       # row 1, second block (20 bytes each), a code byte
    got[2, 0] ^= 0x01
    with pytest.raises(AssertionError) as e:
        tqt.assert_blocks_equal(got, want, "q4_1", context="my kernel")
    msg = str(e.value)
    assert "q4_1 blocks differ (my kernel): 2 of 6 blocks; first is block 3 (row (1,), block 1 of the row)" in msg
    assert "first differing byte 5" in msg
    fields = bridge.blocks.legacy_fields.split_blocks("q4_1", want.reshape(-1, 20)[3:4])
    assert f"d={float(fields['d'][0]):.6g}" in msg and "m=" in msg and "q=[" in msg
    assert msg.count("fields:") == 2


def test_blocks_equal_decodes_turbo_fields_and_checks_shape_and_dtype():
    want = bridge.quantize("turbo3", _rows(1, 128))
    got = want.copy()
    got[0, 0] ^= 0x04           # the norm
    with pytest.raises(AssertionError, match=r"norm=.*idx=\[") as e:
        tqt.assert_blocks_equal(got, want, "turbo3")
    assert "first differing byte 0" in str(e.value)
    with pytest.raises(AssertionError, match=r"shape \(1, 49\) != expected \(1, 50\)"):
        tqt.assert_blocks_equal(want[:, :49], want, "turbo3")
    with pytest.raises(AssertionError, match="expected uint8, got dtype int8"):
        tqt.assert_blocks_equal(want.view(np.int8), want, "turbo3")


def test_values_close_nan_positions_and_named_tolerance():
    e = np.array([[1.0, np.nan, 3.0]], np.float32)
    tqt.assert_values_close(e.copy(), e)
    with pytest.raises(AssertionError, match=r"NaN mismatch at \(0, 1\)"):
        tqt.assert_values_close(np.array([[1.0, 2.0, 3.0]]), e)
    a = np.array([[1.0, np.nan, 3.01]])
    tqt.assert_values_close(a, e, atol=0.02, tolerance_name="MY_TOL")
    with pytest.raises(AssertionError, match=r"1 of 3 outside tolerance MY_TOL .* worst at \(0, 2\)"):
        tqt.assert_values_close(a, e, atol=0.001, tolerance_name="MY_TOL")


def test_attention_close_reports_worst_position_relative_error_and_tolerance():
    rng = np.random.default_rng(1)
    want = rng.standard_normal((2, 4, 64))
    bound = np.full_like(want, 1e-6)
    tqt.assert_attention_close(want + 5e-7, want, bound)
    got = want.copy()
    got[1, 3, 17] += 0.5
    got[0, 0, 0] += 2e-6
    with pytest.raises(AssertionError) as e:
        tqt.assert_attention_close(got, want, bound)
    msg = str(e.value)
    assert "2 of 512 components exceed the oracle bound" in msg
    assert "worst at (1, 3, 17) (b, head, d)" in msg
    rel = 0.5 / np.abs(want[1, 3]).max()
    assert f"= {rel:.3g} of the row's max |value|" in msg
    with pytest.raises(AssertionError, match=r"exceed the rtol=0.01 of the row max; worst at \(1, 3, 17\)"):
        tqt.assert_attention_close(got, want, rtol=0.01)
    with pytest.raises(AssertionError, match="non-finite output nan at"):
        tqt.assert_attention_close(np.where(got > 1, np.nan, got), want, rtol=0.01)
    with pytest.raises(ValueError, match="exactly one of"):
        tqt.assert_attention_close(got, want)


def test_logits_parity_reports_kl_top1_and_worst_position():
    rng = np.random.default_rng(2)
    p = rng.standard_normal((6, 50)).astype(np.float32)
    r = tqt.assert_logits_parity(p, p + 1e-4, max_kl_mean=1e-6, min_top1=1.0)
    assert r["top1"] == 1.0 and r["kl_mean"] < 1e-6
    q = p.copy()
    q[4] = rng.standard_normal(50) * 3
    with pytest.raises(AssertionError) as e:
        tqt.assert_logits_parity(p, q, max_kl_mean=1e-3, max_kl=1e-2, min_top1=0.99)
    msg = str(e.value)
    assert "mean KL" in msg and "worst KL" in msg and "at position 4" in msg
    if np.argmax(p[4]) != np.argmax(q[4]):
        assert "first top-1 mismatch at position 4" in msg
