"""The decode step's deferred append (``DecodeOptions.defer_append``, on by default on CUDA): TQCache keeps
the step's K/V rows and the routed attention writes them in its own call (append + attention, one compiled
function on CUDA). Here on the CPU emulator's decode lane (emulate_decode_lane, caches with
``decode_options = DecodeOptions(defer_append=True)``), which runs the same cache logic: every result bit-identical to the
append-then-attend lane, and every other reader of the cache sees the deferred rows.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base

from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import launch as attention_launch
from tqbridge.metal.decode_options import DecodeOptions
from tqbridge.metal.lm.cache import TQCache, make_cache
from tqbridge.metal.attention.decoder import LayerDecoder
from tqbridge.metal.lm.routing import route_attention
from tiny_models import forced_decode, tiny_gemma3, tiny_llama, tokens


@pytest.fixture
def emulated_lane(monkeypatch, emulated_decode_lane):
    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    attention_kernel.clear_launch_caches()
    yield monkeypatch
    attention_kernel.clear_launch_caches()
    mx.set_default_device(prev)


def _spy_fused(monkeypatch) -> list:
    """Count the fused append + attention calls of the emulated lane."""
    calls = []
    real = attention_kernel._EmulatedDecodeLaunch.with_append

    def spy(self, *a, **kw):
        calls.append(a[6])   # the row (pos)
        return real(self, *a, **kw)

    monkeypatch.setattr(attention_kernel._EmulatedDecodeLaunch, "with_append", spy)
    return calls


def _decode(model_name: str, defer: str, monkeypatch, kv=("q8_0", "q4_0"), n=30):
    """Teacher-forced decode of ``n`` tokens: per-step logits and every layer's stored blocks."""
    m = tiny_llama(head_dim=128) if model_name == "llama" else tiny_gemma3(window=8)
    toks = tokens(n + 5, seed=11)
    cache = make_cache(m, *kv)
    for c in cache:
        if isinstance(c, TQCache):
            c.decode_options = DecodeOptions(defer_append=defer == "1")
    out = forced_decode(m, toks, cache)
    blocks = [np.array(b) for c in cache if isinstance(c, TQCache) for b in c.blocks()]
    return out, blocks, cache


@pytest.mark.parametrize("model_name", ["llama", "gemma3"])
def test_deferred_lane_is_bit_identical(model_name, emulated_lane):
    # a small step makes decode grow the buffers (and slide Gemma's windows) many times: growth and
    # slides read the buffers, so they write a deferred row first
    emulated_lane.setattr(TQCache, "step", 8)
    calls = _spy_fused(emulated_lane)
    want, want_blocks, _ = _decode(model_name, "0", emulated_lane)
    assert not calls
    got, got_blocks, cache = _decode(model_name, "1", emulated_lane)
    assert len(calls) > 20, len(calls)   # the fused call ran (not a fall back to append-then-attend)
    assert np.array_equal(got, want)
    assert len(got_blocks) == len(want_blocks) and all(np.array_equal(a, b) for a, b in zip(got_blocks, want_blocks))
    assert all(c.decoder.staged is None for c in cache if isinstance(c, TQCache))


def _routed_step(c, k, v, q, attend=True):
    kk, vv = c.update_and_fetch(k, v)
    return base.scaled_dot_product_attention(q, kk, vv, cache=c, scale=64 ** -0.5, mask=None) if attend else None


def _primed(defer: str, monkeypatch):
    c = TQCache("q8_0", "turbo3")
    c.decode_options = DecodeOptions(defer_append=defer == "1")
    x = mx.random.normal((1, 2, 40, 64), key=mx.random.key(3))
    c.update_and_fetch(x, 0.5 * x)
    rows = [(mx.random.normal((1, 2, 1, 64), key=mx.random.key(10 + i)),
             mx.random.normal((1, 2, 1, 64), key=mx.random.key(50 + i))) for i in range(4)]
    q = mx.random.normal((1, 4, 1, 64), key=mx.random.key(99))
    with route_attention():
        for k, v in rows[:2]:       # the lanes get prepared (append, then the routed attention)
            mx.eval(_routed_step(c, k, v, q))
        _routed_step(c, *rows[2], q, attend=False)   # a step whose attention never comes
        _routed_step(c, *rows[3], q, attend=False)
    return c


@pytest.mark.parametrize("reader", ["state", "blocks", "fetch", "trim", "check_finite", "nbytes"])
def test_every_reader_sees_the_deferred_rows(reader, emulated_lane):
    ref = _primed("0", emulated_lane)
    c = _primed("1", emulated_lane)
    assert c.decoder.staged is not None and c.decoder.staged.row == 43   # the second unattended step's row waits
    assert ref.decoder.staged is None
    for cache in (ref, c):
        if reader == "state":
            cache.state
        elif reader == "blocks":
            cache.blocks()
        elif reader == "fetch":
            cache.fetch()
        elif reader == "trim":
            cache.trim(1)
        elif reader == "check_finite":
            cache.check_finite()
        else:
            assert cache.nbytes > 0
    assert c.decoder.staged is None
    assert c.offset == ref.offset
    for a, b in zip(c.blocks(), ref.blocks()):
        assert np.array_equal(np.array(a), np.array(b))


def test_a_lost_deferred_row_is_caught(emulated_lane):
    """The comparison above with a planted bug: the deferred row dropped instead of written."""
    ref = _primed("0", emulated_lane)
    emulated_lane.setattr(LayerDecoder, "write_staged", lambda self: setattr(self, "staged", None))
    c = _primed("1", emulated_lane)
    kb, kr = np.array(c.blocks()[0]), np.array(ref.blocks()[0])
    assert not np.array_equal(kb, kr)
    assert np.array_equal(kb[..., :42, :], kr[..., :42, :])   # only the dropped rows differ (42 and 43)
    assert not np.array_equal(kb[..., 42:, :], kr[..., 42:, :])


def test_reports_say_whether_the_append_is_fused(emulated_lane):
    from tqbridge.metal.lm.report import cache_report, paths_line

    for defer in ("0", "1"):
        _, _, cache = _decode("llama", defer, emulated_lane, n=3)
        info = cache_report(cache)["layers"][0]["decode_kernel"]
        assert info.get("fused_append", False) is (defer == "1"), info
        assert ("append fused" in paths_line(cache)) is (defer == "1")


_GPU = mx.metal.is_available() or (getattr(mx, "cuda", None) is not None and mx.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="no MLX GPU backend (Metal or CUDA) here")
@pytest.mark.parametrize("kv", [("q8_0", "turbo3"), ("q4_0", "q4_0")])
def test_gpu_fused_step_is_bit_identical(kv, monkeypatch):
    """On the GPU (compiled launches: append + attention traced as one function where deferral is on):
    the same logits and cache bytes as append-then-attend, with growth every 8 positions."""
    monkeypatch.setattr(TQCache, "step", 8)
    spy = []
    real = attention_launch.DecodeLaunch.with_append
    monkeypatch.setattr(attention_launch.DecodeLaunch, "with_append",
                        lambda self, *a, **kw: spy.append(1) or real(self, *a, **kw))
    want, want_blocks, _ = _decode("llama", "0", monkeypatch, kv=kv)
    assert not spy
    got, got_blocks, cache = _decode("llama", "1", monkeypatch, kv=kv)
    assert len(spy) > 20 and all(c.decoder.launch.compiled for c in cache)
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(got_blocks, want_blocks))


@pytest.mark.parametrize("model_name", ["llama", "gemma3"])
def test_folded_lane_is_bit_identical(model_name, emulated_lane, folded_steps):
    """The append folded into kernel int8-mma's pass 1 (``fold_append``) on the emulated lane: the same logits
    and blocks as the append kernel then the same pass 1, through growth and window slides."""
    emulated_lane.setattr(TQCache, "step", 8)
    folds = folded_steps

    def decode(fold: bool):
        m = tiny_llama(head_dim=128) if model_name == "llama" else tiny_gemma3(window=8)
        cache = make_cache(m, "q8_0", "turbo3")
        for c in cache:
            if isinstance(c, TQCache):
                c.decode_options = DecodeOptions(defer_append=True, fold_append=fold, q_precision="int8")
        out = forced_decode(m, tokens(25, seed=11), cache)
        return out, [np.array(b) for c in cache if isinstance(c, TQCache) for b in c.blocks()]

    want, want_blocks = decode(False)
    assert not folds
    got, got_blocks = decode(True)
    assert sum(folds) > 20, folds   # the folded pass 1 ran (not the append kernel then pass 1)
    assert np.array_equal(got, want)
    assert len(got_blocks) == len(want_blocks) and all(np.array_equal(a, b) for a, b in zip(got_blocks, want_blocks))


def test_reports_say_whether_the_append_ran_inside_pass_1(emulated_lane, folded_steps):
    """The cache report and the CLI's paths line name the folded step ("append fused into pass 1"), and where the
    options asked for the fold and the plan refused it, why (here: q in float32 plans kernel tiles)."""
    from tqbridge.metal.lm import decode_bench
    from tqbridge.metal.lm.report import cache_report, paths_line

    def decode(**opts):
        m = tiny_llama(head_dim=128)
        cache = make_cache(m, "q8_0", "turbo3")
        for c in cache:
            c.decode_options = DecodeOptions(defer_append=True, **opts)
        forced_decode(m, tokens(10, seed=3), cache)
        return cache_report(cache)["layers"][0]["decode_kernel"], paths_line(cache)

    info, line = decode(fold_append=True, q_precision="int8")
    assert info["fold_append"] is True and "fold_refused" not in info and any(folded_steps)
    assert "append fused into pass 1" in line and "not into pass 1" not in line
    assert "append in pass 1" in decode_bench.plan_label({"decode_kernel": info})
    info, line = decode(fold_append=True, q_precision="exact")
    assert not info.get("fold_append") and info["fold_refused"] == "pass 1 runs kernel tiles, not int8-mma"
    assert "append fused (not into pass 1: pass 1 runs kernel tiles, not int8-mma)" in line
    assert "pass 1" not in decode_bench.plan_label({"decode_kernel": info})
    info, line = decode(fold_append=False, q_precision="int8")   # not asked: nothing to explain
    assert not info.get("fold_append") and "fold_refused" not in info and "pass 1" not in line
