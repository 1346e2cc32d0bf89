"""Public strategies (tqbridge.parity.testing): what they draw is what they promise, bad arguments fail early."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import pad_rows
from tqbridge.parity import testing as tqt


@given(st.data())
def test_blocks_have_the_promised_shape(data):
    key = data.draw(tqt.format_names())
    f = bridge.get_format(key)
    b = data.draw(tqt.blocks(fmt=key, max_rows=3, max_blocks=3))
    assert b.dtype == np.uint8 and b.ndim == 2 and 1 <= b.shape[0] <= 3
    assert b.shape[1] % f.type_size == 0 and 1 <= b.shape[1] // f.type_size <= 3
    with np.errstate(all="ignore"):
        bridge.dequantize(f, b, b.shape[1] // f.type_size * f.block_size)


@given(tqt.format_blocks(source="raw", max_blocks=2))
def test_raw_blocks_decode_to_finite_values(pair):
    # raw blocks: random codes under finite scales; quantized blocks may hold an inf scale (huge rows)
    key, b = pair
    f = bridge.get_format(key)
    for off in tqt.scale_offsets(f):
        d = b.reshape(-1, f.type_size)[:, off:off + 2].copy().view("<f2")
        assert np.isfinite(d).all()
    spec = getattr(f.codec, "spec", None)
    if spec is not None and spec.rnorm_offset is not None:
        assert not b.reshape(-1, f.type_size)[:, spec.rnorm_offset:spec.rnorm_offset + 2].any()
    with np.errstate(all="ignore"):
        y = bridge.dequantize(f, b, b.shape[1] // f.type_size * f.block_size)
    assert np.isfinite(y).all()


@given(tqt.malformed_blocks())
def test_malformed_blocks_are_what_they_say(m):
    f = bridge.get_format(m.fmt)
    if m.raises:
        with pytest.raises(bridge.FormatError):
            bridge.dequantize(f, m.data, m.n)
        return
    with np.errstate(all="ignore"):
        y = bridge.dequantize(f, m.data, m.n).reshape(-1, f.block_size)
    bad = ~np.isfinite(y).all(axis=1)
    assert sorted(np.flatnonzero(bad).tolist()) == list(m.nonfinite_blocks), m


@given(tqt.kv_caches(max_steps=3, max_step_rows=3))
def test_kv_cache_blocks_are_the_appended_rows(kv):
    k = np.concatenate([s[0] for s in kv.steps], axis=2)
    assert kv.length == k.shape[2]
    # quantizing step by step gives the same bytes as quantizing the whole cache
    for i, (ks, vs) in enumerate(kv.steps):
        lo = sum(s[0].shape[2] for s in kv.steps[:i])
        hi = lo + ks.shape[2]
        assert np.array_equal(bridge.quantize(kv.k_format, pad_rows(kv.k_format, ks)), kv.k_blocks[:, :, lo:hi])
        assert np.array_equal(bridge.quantize(kv.v_format, pad_rows(kv.v_format, vs)), kv.v_blocks[:, :, lo:hi])


@settings(max_examples=25)
@given(tqt.attention_problems(min_length=1, max_length=40, max_query_rows=4))
def test_attention_problems_and_their_oracle(p):
    from tqbridge.metal import decode_attention

    # min_length=1: the MLX reference path cannot reduce over an empty cache (length 0 everywhere)

    b, hq, hkv, t, d, lmax = p.shape
    assert hq % hkv == 0 and 1 <= hq // hkv <= 8 and d in tqt.HEAD_DIMS and 1 <= t <= 4
    want, bound = p.oracle()
    assert want.shape == p.q.shape == bound.shape and (bound >= 0).all()
    got = decode_attention(backend="reference", **p.kwargs())
    tqt.assert_attention_close(got, want, bound)


@pytest.mark.parametrize("call, match", [
    (lambda: tqt.blocks(fmt="q9_9"), "unknown format"),
    (lambda: tqt.blocks(fmt="q8_0", min_rows=3, max_rows=2), "max_rows=2 is smaller than min_rows=3"),
    (lambda: tqt.blocks(fmt="q8_0", source="zeros"), "source must be"),
    (lambda: tqt.format_names(kinds="ggml"), "not the string"),
    (lambda: tqt.format_names(kinds=["legacy"]), "unknown format kind"),
    (lambda: tqt.malformed_blocks(kinds=["bad_magic"]), "unknown malformation"),
    (lambda: tqt.attention_problems(max_query_rows=5), "at most 4 query rows"),
    (lambda: tqt.attention_problems(min_group=3, max_group=2), "max_group=2 is smaller"),
    (lambda: tqt.attention_problems(head_dims=128), "sequence of ints"),
    (lambda: tqt.attention_problems(values=["noise"]), "unknown value family"),
    (lambda: tqt.attention_problems(q_dtypes=["bfloat16"]), "numpy has no bfloat16"),
    (lambda: tqt.kv_caches(k_formats=[]), "must not be empty"),
])
def test_bad_arguments_fail_when_the_strategy_is_made(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
