"""TQCache: mlx-lm's cache protocol over block formats, prompt-cache save/load, attention routing."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from hypothesis import example, given, strategies as st  # noqa: E402
from mlx_lm.models import cache as mlx_cache  # noqa: E402
from mlx_lm.models import llama  # noqa: E402

from tqbridge.metal import attention as attention_api
from tqbridge.bridge import FormatError, dequantize, formats, get_format, quantize  # noqa: E402
from tqbridge.metal.lm import cache as tqc  # noqa: E402
from tqbridge.metal.lm import routing  # noqa: E402
from tqbridge.metal.lm.cache import TQCache, make_cache  # noqa: E402
from tqbridge.metal.codecs import padded_dim  # noqa: E402
from tqbridge.bridge.blocks.kv_spec import parse_kv  # noqa: E402
from tqbridge.metal.lm.report import cache_report  # noqa: E402
from tqbridge.metal.hadamard import hadamard_rotate  # noqa: E402
from tqbridge.metal.lm.routing import route_attention  # noqa: E402
from tiny_models import cpu_device, tiny_gemma3, tiny_llama, tokens  # noqa: E402,F401

_WANTED = ["f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
           "turbo2", "turbo3", "turbo4", "turbo3@fork-69d8e4b", "turbo3@g64", "turbo4@g64"]
FORMATS = [f for f in _WANTED if f in formats() or f.split("@")[0] in formats()]
# Turbo dequantization applies the inverse rotation; MLX and numpy sum the butterfly in different
# orders, so float32 results may differ by a few ulps (bytes are still compared exactly).
TURBO_FETCH_RTOL = 1e-5
TURBO_FETCH_ATOL = 1e-6
# Same float math in two shapes (one chunk vs many; mx.fast SDPA vs masked SDPA): float32 rounding.
LOGIT_ATOL = 1e-4


def _fmt_key(name):
    return get_format(name).key


def _reference_blocks(fmt, x):
    """The bytes TQCache must hold: the numpy reference (iq4_nl: its reference quantizer, what
    llama.cpp's cache holds)."""
    x = np.asarray(x, np.float32)
    d = x.shape[-1]
    dp = padded_dim(fmt, d)
    if dp != d:
        x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, dp - d)])
    return quantize(fmt, x, search=False) if get_format(fmt).name == "iq4_nl" else quantize(fmt, x)


def _reference_rows(fmt, blocks, d):
    return dequantize(fmt, blocks, padded_dim(fmt, d))[..., :d]


def _check_fetch(fmt, got, blocks, d):
    want = _reference_rows(fmt, blocks, d)
    got = np.array(got)
    if get_format(fmt).kind == "turbo":
        np.testing.assert_allclose(got, want, rtol=TURBO_FETCH_RTOL, atol=TURBO_FETCH_ATOL)
    else:
        assert np.array_equal(got, want, equal_nan=True)


@given(kf=st.sampled_from(FORMATS), vf=st.sampled_from(FORMATS),
       dims=st.sampled_from([(64, 64), (128, 128), (80, 80), (64, 128)]),
       chunks=st.lists(st.integers(1, 20), min_size=1, max_size=5),
       trim=st.integers(0, 30), more=st.integers(0, 5), seed=st.integers(0, 2**16))
@example(kf="q8_0", vf="turbo3", dims=(64, 64), chunks=[1], trim=1, more=1, seed=0)
@example(kf="iq4_nl", vf="iq4_nl", dims=(64, 64), chunks=[3, 1], trim=1, more=1, seed=1)   # the cache's quantizer
def test_cache_protocol_matches_the_reference(kf, vf, dims, chunks, trim, more, seed):
    """Appended rows are the numpy reference's bytes; fetch, offset, trim and growth behave."""
    rng = np.random.default_rng(seed)
    dk, dv = dims
    B, H = 1, 2
    c = TQCache(kf, vf, rotation="none")
    assert c.empty() and c.offset == 0 and c.nbytes == 0
    ks, vs = [], []
    for n in chunks:
        k = rng.standard_normal((B, H, n, dk)).astype(np.float32)
        v = rng.standard_normal((B, H, n, dv)).astype(np.float32)
        ks.append(k)
        vs.append(v)
        out_k, out_v = c.update_and_fetch(mx.array(k), mx.array(v))
        assert out_k.shape == (B, H, c.offset, dk) and out_v.shape == (B, H, c.offset, dv)
    total = sum(chunks)
    assert c.offset == total == c.size()
    assert c.keys.shape[2] % TQCache.step == 0 and c.keys.shape[2] >= total  # grown in steps
    kall, vall = np.concatenate(ks, axis=2), np.concatenate(vs, axis=2)
    kb, vb = c.blocks()
    assert np.array_equal(np.array(kb), _reference_blocks(kf, kall))
    assert np.array_equal(np.array(vb), _reference_blocks(vf, vall))
    fk, fv = c.fetch()
    _check_fetch(kf, fk, np.array(kb), dk)
    _check_fetch(vf, fv, np.array(vb), dv)
    # trim, then append again: the new rows replace the trimmed ones
    assert c.is_trimmable()
    t = c.trim(trim)
    assert t == min(trim, total) and c.offset == total - t
    kall, vall = kall[:, :, :total - t], vall[:, :, :total - t]
    if more:
        k = rng.standard_normal((B, H, more, dk)).astype(np.float32)
        v = rng.standard_normal((B, H, more, dv)).astype(np.float32)
        c.update_and_fetch(mx.array(k), mx.array(v))
        kall = np.concatenate([kall, k], axis=2)
        vall = np.concatenate([vall, v], axis=2)
    kb, vb = c.blocks()
    assert np.array_equal(np.array(kb), _reference_blocks(kf, kall))
    assert np.array_equal(np.array(vb), _reference_blocks(vf, vall))
    # measured bytes agree with the registry's row sizes
    rows = c.offset
    want = B * H * rows * (get_format(kf).row_bytes(padded_dim(kf, dk)) + get_format(vf).row_bytes(padded_dim(vf, dv)))
    assert c.used_nbytes == want


def test_rotation_follows_llama_cpp():
    """K/V rows of ggml quantized formats are rotated by a Hadamard matrix before quantizing, with
    llama.cpp's group sizes; float and turbo formats are not; fetch rotates back."""
    from tqbridge.metal.lm.cache import hadamard_rotate
    from tqbridge.metal.codecs import rotation_group

    assert [rotation_group("q8_0", d, "k") for d in (64, 128, 192, 256, 80)] == [64, 128, 64, 256, 0]
    assert [rotation_group("q4_0", d, "v") for d in (64, 128, 256)] == [64, 64, 64]
    assert rotation_group("f16", 128, "k") == rotation_group("turbo3", 128, "k") == 0
    rng = np.random.default_rng(1)
    x = mx.array(rng.standard_normal((1, 2, 5, 256)).astype(np.float32))
    # orthonormal and its own inverse
    np.testing.assert_allclose(np.array(hadamard_rotate(hadamard_rotate(x, 256), 256)), np.array(x), atol=1e-5)
    c = TQCache("q8_0", "q4_0")
    c.update_and_fetch(x, x)
    assert (c.k_rot, c.v_rot) == (256, 64)
    kb, vb = c.blocks()
    assert np.array_equal(np.array(kb), quantize("q8_0", np.array(hadamard_rotate(x, 256))))
    assert np.array_equal(np.array(vb), quantize("q4_0", np.array(hadamard_rotate(x, 64))))
    k, _ = c.fetch()
    want = hadamard_rotate(mx.array(dequantize("q8_0", np.array(kb), 256)), 256)
    np.testing.assert_allclose(np.array(k), np.array(want), atol=1e-6)


def test_decode_steps_do_not_reallocate():
    c = TQCache("q8_0", "q4_0")
    k = mx.zeros((1, 2, 1, 64))
    c.update_and_fetch(k, k)
    first = c.keys.shape
    for _ in range(TQCache.step - 1):
        c.update_and_fetch(k, k)
    assert c.keys.shape == first and c.offset == TQCache.step
    c.update_and_fetch(k, k)
    assert c.keys.shape[2] == 2 * TQCache.step


def test_bad_input_is_refused():
    with pytest.raises(FormatError):
        parse_kv("q8_0/nope")
    with pytest.raises(FormatError):
        parse_kv("q8_0/q4_0/q4_1")
    assert parse_kv("q8_0") == ("q8_0", "q8_0")
    assert parse_kv(" Q8_0 / q4_0 ") == ("q8_0", "q4_0")
    c = TQCache("q8_0", "q8_0")
    c.update_and_fetch(mx.zeros((1, 1, 2, 64)), mx.zeros((1, 1, 2, 64)))
    with pytest.raises(ValueError, match="head dims"):
        c.update_and_fetch(mx.zeros((1, 1, 1, 128)), mx.zeros((1, 1, 1, 128)))
    with pytest.raises(ValueError, match="window"):
        TQCache("q8_0", "q8_0", window=0)
    with pytest.raises(ValueError, match="rotation"):
        TQCache("q8_0", "q8_0", rotation="random")
    with pytest.raises(ValueError, match="do not fit"):
        TQCache.from_state([mx.zeros((1, 1, 2, 34), mx.uint8), mx.zeros((1, 1, 2, 34), mx.uint8),
                            "5", "q8_0", "q8_0", "64", "64", "0", "0", "llama", "64", "64"])


# ------------------------------------------------------------------ tiny random models

@pytest.fixture(scope="module")
def tiny():
    return tiny_llama()


def _run(model, cache, toks, chunk, mode="sdpa"):
    """Logits of every position, the prompt fed in chunks of ``chunk`` (1 = token by token)."""
    outs = []
    with route_attention(mode):
        for s in range(0, toks.shape[1], chunk):
            outs.append(model(toks[:, s:s + chunk], cache=cache))
    out = mx.concatenate(outs, axis=1)
    mx.eval(out)
    return out


def test_f32_cache_matches_mlx_lm_kv_cache(tiny):
    toks = tokens(30)
    want = _run(tiny, mlx_cache.make_prompt_cache(tiny), toks, 10)
    c = make_cache(tiny, "f32", "f32")
    got = _run(tiny, c, toks, 10)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=LOGIT_ATOL, rtol=0)
    assert cache_report(c)["layer_kinds"] == {"tqbridge": 2}


@pytest.mark.parametrize("kv", ["q8_0/q4_0", "turbo3/q8_0"])
def test_prefill_does_not_depend_on_chunking(tiny, kv):
    """Prefill attends to the quantized rows of its own chunk, so chunking changes nothing."""
    toks = tokens(24, seed=3)
    one = _run(tiny, make_cache(tiny, *parse_kv(kv)), toks, 24)
    few = _run(tiny, make_cache(tiny, *parse_kv(kv)), toks, 5)
    steps = _run(tiny, make_cache(tiny, *parse_kv(kv)), toks, 1)
    np.testing.assert_allclose(np.array(few), np.array(one), atol=LOGIT_ATOL, rtol=0)
    np.testing.assert_allclose(np.array(steps), np.array(one), atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("kv", ["q8_0/turbo3", "q4_1/f16"])
def test_prompt_cache_save_load_continue(tiny, tmp_path, kv):
    toks = tokens(40, seed=4)
    prompt, rest = toks[:, :33], toks[:, 33:]
    c = make_cache(tiny, *parse_kv(kv))
    _run(tiny, c, prompt, 16)
    path = str(tmp_path / "prompt.safetensors")
    mlx_cache.save_prompt_cache(path, c, metadata={"kv": kv})
    loaded, meta = mlx_cache.load_prompt_cache(path, return_metadata=True)
    assert meta == {"kv": kv}
    assert [type(x) for x in loaded] == [TQCache] * len(c)
    for a, b in zip(c, loaded):
        assert (b.k_format, b.v_format, b.offset, b.k_dim, b.v_dim, b.window) == \
            (a.k_format, a.v_format, a.offset, a.k_dim, a.v_dim, a.window)
        assert np.array_equal(np.array(a.blocks()[0]), np.array(b.blocks()[0]))
        assert np.array_equal(np.array(a.blocks()[1]), np.array(b.blocks()[1]))
    want = _run(tiny, c, rest, 1)
    got = _run(tiny, loaded, rest, 1)
    assert np.array_equal(np.array(got), np.array(want))
    # mlx-lm's trim helpers work on the loaded cache too
    assert mlx_cache.can_trim_prompt_cache(loaded)
    assert mlx_cache.trim_prompt_cache(loaded, 3) == 3 and loaded[0].offset == 37


def test_empty_cache_round_trips(tmp_path):
    path = str(tmp_path / "empty.safetensors")
    mlx_cache.save_prompt_cache(path, [TQCache("q4_0", "turbo2", window=16)])
    (c,) = mlx_cache.load_prompt_cache(path)
    assert c.empty() and c.offset == 0 and (c.k_format, c.v_format, c.window) == ("q4_0", "turbo2", 16)


def test_routing_sends_decode_to_the_kernel_and_restores(tiny, monkeypatch):
    """Decode steps call decode_attention on the blocks; prefill takes the dequantize + SDPA path."""
    from mlx_lm.models import base

    calls = []

    def fake_kernel(q, k_blocks, v_blocks, *, k_format, v_format, length, scale, backend=None, sinks=None,
                    rotation=None):
        calls.append((q.shape, k_blocks.shape, v_blocks.shape, k_format, v_format, length))
        # plain attention over the bridge's dequantization of the same blocks (rows stored rotated)
        k_rot, v_rot = rotation or (0, 0)
        d = q.shape[-1]
        k = mx.array(_reference_rows(k_format, np.array(k_blocks), d))[:, :, :length]
        v = mx.array(_reference_rows(v_format, np.array(v_blocks), d))[:, :, :length]
        o = mx.fast.scaled_dot_product_attention(hadamard_rotate(q, k_rot)[:, :, None], k, v, scale=scale)
        return hadamard_rotate(o[:, :, 0], v_rot)

    monkeypatch.setattr(attention_api, "decode_attention", fake_kernel)
    monkeypatch.setattr(attention_api, "last_run", lambda: {"backend": "fake"})
    toks = tokens(20, seed=5)
    original = llama.scaled_dot_product_attention
    c = make_cache(tiny, "q8_0", "q4_0")   # rotated K and V: the routing rotates q and the output
    got = _run(tiny, c, toks[:, :16], 16, mode="kernel")
    got = mx.concatenate([got, _run(tiny, c, toks[:, 16:], 1, mode="kernel")], axis=1)
    assert llama.scaled_dot_product_attention is original and base.scaled_dot_product_attention is original
    paths = cache_report(c)["paths"]
    assert paths == {"append": 2 * 5, "prefill:dequant-sdpa": 2, "decode:fake": 2 * 4}
    assert len(calls) == 8
    assert calls[-1] == ((1, 4, 64), (1, 2, 20, 68), (1, 2, 20, 36), "q8_0", "q4_0", 20)
    want = _run(tiny, make_cache(tiny, "q8_0", "q4_0"), toks, 1, mode="sdpa")
    np.testing.assert_allclose(np.array(got), np.array(want), atol=LOGIT_ATOL, rtol=0)


def test_kernel_mode_without_a_kernel_is_an_error(tiny, monkeypatch):
    def refuses(*a, **kw):
        raise attention_api.AttentionError("planted: this kernel cannot run here")

    monkeypatch.setattr(attention_api, "decode_attention", refuses)
    c = make_cache(tiny, "q8_0", "q8_0")
    _run(tiny, c, tokens(4), 4, mode="kernel")  # prefill is fine
    with pytest.raises(RuntimeError, match="kernel cannot run"):
        _run(tiny, c, tokens(1), 1, mode="kernel")
    with pytest.raises(ValueError, match="decode mode"):
        with route_attention("fast"):
            pass


def test_real_decode_kernel_matches_the_reference(tiny):
    """The fused kernel (on this machine's backend) through the cache: same logits as the reference."""
    from tqbridge.metal.backend import backends, pick_backend

    if pick_backend("auto") not in backends():    # decided before the kernel runs: no compiler, no GPU
        pytest.skip(f"no kernel backend here: {pick_backend('auto')} is not usable (usable: {backends()})")
    toks = tokens(12, seed=6)
    for kv in ["q8_0/turbo3", "turbo4/q4_0"]:
        c = make_cache(tiny, *parse_kv(kv))
        _run(tiny, c, toks[:, :9], 9)
        got = _run(tiny, c, toks[:, 9:], 1, mode="kernel")     # any error of the kernel fails the test
        assert any(p.startswith("decode:") and p != "decode:reference" for p in cache_report(c)["paths"])
        ref = make_cache(tiny, *parse_kv(kv))
        _run(tiny, ref, toks[:, :9], 9)
        want = _run(tiny, ref, toks[:, 9:], 1)
        np.testing.assert_allclose(np.array(got), np.array(want), atol=LOGIT_ATOL, rtol=0)


# ------------------------------------------------------------------ sliding windows (Gemma 3)

def test_sliding_window_layers_quantized_or_float():
    m = tiny_gemma3(window=8)
    toks = tokens(30, seed=7)
    want = _run(m, mlx_cache.make_prompt_cache(m), toks, 1)   # mlx-lm's own rotating caches
    q = make_cache(m, "f32", "f32")
    assert [c.window for c in q] == [8, None, 8, None]
    got = _run(m, q, toks, 1)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=LOGIT_ATOL, rtol=0)
    # a longer prompt chunk over the window: masks built from the windowed TQCache
    got2 = _run(m, make_cache(m, "f32", "f32"), toks, 13)
    np.testing.assert_allclose(np.array(got2), np.array(want), atol=LOGIT_ATOL, rtol=0)
    f = make_cache(m, "q8_0", "q8_0", sliding="float")
    rep = cache_report(f)
    assert rep["layer_kinds"] == {"RotatingKVCache": 2, "tqbridge": 2}
    _run(m, f, toks, 10)
    assert cache_report(f)["paths"]["prefill:dequant-sdpa"] == 2 * 3
    with pytest.raises(ValueError, match="sliding"):
        make_cache(m, "q8_0", "q8_0", sliding="drop")


def test_windowed_decode_passes_only_the_window_to_the_kernel(monkeypatch):
    m = tiny_gemma3(window=8)
    seen = []

    def fake_kernel(q, k_blocks, v_blocks, *, k_format, v_format, length, scale, backend=None, sinks=None,
                    rotation=None):
        seen.append(length)
        k_rot, v_rot = rotation or (0, 0)
        d = q.shape[-1]
        k = mx.array(_reference_rows(k_format, np.array(k_blocks), d))
        v = mx.array(_reference_rows(v_format, np.array(v_blocks), d))
        o = mx.fast.scaled_dot_product_attention(hadamard_rotate(q, k_rot)[:, :, None], k, v, scale=scale)
        return hadamard_rotate(o[:, :, 0], v_rot)

    monkeypatch.setattr(attention_api, "decode_attention", fake_kernel)
    toks = tokens(14, seed=8)
    got = _run(m, make_cache(m, "q8_0", "q8_0"), toks, 1, mode="kernel")
    want = _run(m, make_cache(m, "q8_0", "q8_0"), toks, 1, mode="sdpa")
    np.testing.assert_allclose(np.array(got), np.array(want), atol=LOGIT_ATOL, rtol=0)
    # per step: two windowed layers (at most 8 rows) and two global layers (all rows)
    assert seen[-4:] == [8, 14, 8, 14]
    assert seen[:4] == [1, 1, 1, 1]


def test_mlx_lm_finds_the_class_by_name():
    assert mlx_cache.TQCache is TQCache and tqc.TQCache is TQCache


def test_auto_mode_on_cpu_uses_the_dispatchers_reference(tiny):
    """On a CPU-only machine decode goes to decode_attention's ops reference (measured faster than
    the kernel's emulator); the path is recorded."""
    c = make_cache(tiny, "q8_0", "turbo3")
    _run(tiny, c, tokens(6), 5, mode="auto")
    assert cache_report(c)["paths"] == {"append": 2 * 2, "prefill:dequant-sdpa": 2, "decode:reference": 2}


def test_mlx_lm_generate_step_runs_on_the_cache(tiny):
    """mlx-lm's own generation loop takes a TQCache prompt cache, routed or not, same tokens."""
    from mlx_lm.generate import generate_step

    prompt = tokens(12, seed=9)[0]
    c = make_cache(tiny, "q8_0", "turbo3")
    with route_attention():
        routed = [int(t) for t, _ in generate_step(prompt, tiny, max_tokens=6, prompt_cache=c)]
    plain = [int(t) for t, _ in generate_step(prompt, tiny, max_tokens=6,
                                              prompt_cache=make_cache(tiny, "q8_0", "turbo3"))]
    assert routed == plain and len(routed) == 6
    assert any(p.startswith("decode:") for p in cache_report(c)["paths"])


def test_windowed_cache_drops_rows_nobody_can_see(tmp_path, monkeypatch):
    """With a small step the window drops old rows; results still equal mlx-lm's rotating cache,
    memory stays bounded, and a saved cache continues identically."""
    monkeypatch.setattr(TQCache, "step", 4)
    m = tiny_gemma3(window=8)
    toks = tokens(60, seed=10)
    want = _run(m, mlx_cache.make_prompt_cache(m), toks, 1)
    for chunk in (1, 7, 13):
        c = make_cache(m, "f32", "f32")
        got = _run(m, c, toks, chunk)
        np.testing.assert_allclose(np.array(got), np.array(want), atol=LOGIT_ATOL, rtol=0)
        sliding = [x for x in c if x.window]
        assert all(x.start > 0 for x in sliding) and not sliding[0].is_trimmable()
        assert all(x.offset - x.start <= 8 + 4 + chunk for x in sliding)
        assert all(x.start == 0 and x.offset == 60 for x in c if not x.window)
    # save after rows were dropped, load, continue: identical logits
    c = make_cache(m, "q8_0", "q4_0")
    _run(m, c, toks[:, :50], 1)
    path = str(tmp_path / "w.safetensors")
    mlx_cache.save_prompt_cache(path, c)
    loaded = mlx_cache.load_prompt_cache(path)
    assert [(x.start, x.offset) for x in loaded] == [(x.start, x.offset) for x in c]
    assert np.array_equal(np.array(_run(m, loaded, toks[:, 50:], 1)), np.array(_run(m, c, toks[:, 50:], 1)))


@pytest.mark.parametrize("rotation", ["llama", "none"])
def test_iq4_nl_cache_writes_the_reference_quantizers_blocks(rotation):
    # llama.cpp writes iq4_nl KV rows with quantize_row_iq4_nl_ref (no scale search); so does TQCache
    from tqbridge.metal.codecs import rotation_group

    rng = np.random.default_rng(3)
    k = mx.array((rng.standard_normal((1, 2, 9, 64)) * 2).astype(np.float32))
    c = TQCache("iq4_nl", "iq4_nl", rotation=rotation)
    c.update_and_fetch(k, k)
    c.update_and_fetch(k[:, :, :1], k[:, :, :1])      # a decode step too
    kb, vb = c.blocks()
    for blocks, side in ((kb, "k"), (vb, "v")):
        n = rotation_group("iq4_nl", 64, side) if rotation == "llama" else 0
        rows = np.array(hadamard_rotate(mx.concatenate([k, k[:, :, :1]], axis=2), n))
        assert np.array_equal(np.array(blocks), quantize("iq4_nl", rows, search=False)), side
        assert not np.array_equal(np.array(blocks), quantize("iq4_nl", rows))
