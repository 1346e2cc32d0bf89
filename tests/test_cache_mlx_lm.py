"""TQCache where mlx-lm's own code meets it: its batch caches refuse TQCache layers in one line (they would
copy the blocks as K/V rows; TQCache.merge batches them: tests/test_batch_cache.py), and install_cache makes every cache
mlx-lm builds for a model a TQCache."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from mlx_lm.models import cache as mlx_cache  # noqa: E402

from tqbridge.metal.lm.cache import TQCache, install_cache, to_tqcache  # noqa: E402
from tiny_models import cpu_device, tiny_gemma3, tiny_llama, tokens  # noqa: E402,F401

PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "turbo3"), ("q8_0", "q4_0")]


def _filled(c, n=5, seed=0):
    rng = np.random.default_rng(seed)
    x = mx.array(rng.standard_normal((1, 2, n, 64)).astype(np.float32))
    c.update_and_fetch(x, x)
    return c


@pytest.mark.parametrize("kf,vf", PAIRS)
@pytest.mark.parametrize("merge", ["BatchKVCache", "KVCache", "BatchRotatingKVCache"])
def test_mlx_lm_batch_merge_refuses_a_tqcache(kf, vf, merge):
    caches = [_filled(mlx_cache.KVCache()), _filled(TQCache(kf, vf), seed=1)]
    if merge == "BatchRotatingKVCache":
        caches = [_filled(mlx_cache.RotatingKVCache(16)), _filled(TQCache(kf, vf, window=16), seed=1)]
    with pytest.raises(ValueError, match=r"merge: TQCache\(.*holds quantized blocks, not K/V rows"):
        getattr(mlx_cache, merge).merge(caches)


def test_mlx_lm_batch_merge_still_merges_its_own_caches():
    merged = mlx_cache.BatchKVCache.merge([_filled(mlx_cache.KVCache(), 3), _filled(mlx_cache.KVCache(), 5, 1)])
    assert merged.keys.shape[2] == 5 and merged.left_padding.tolist() == [2, 0]


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_install_cache_makes_every_prompt_cache_a_tqcache(kf, vf):
    m = tiny_llama()
    want = mlx_cache.make_prompt_cache(m)
    install_cache(m, f"{kf}/{vf}")
    got = mlx_cache.make_prompt_cache(m)
    assert len(got) == len(want) and all(isinstance(c, TQCache) for c in got)
    assert {(c.k_format, c.v_format) for c in got} == {(kf, vf)}
    assert got[0] is not mlx_cache.make_prompt_cache(m)[0]   # a fresh list each call


def test_install_cache_keeps_the_models_own_layout():
    m = tiny_gemma3(window=8)
    own = [c.max_size if isinstance(c, mlx_cache.RotatingKVCache) else None for c in mlx_cache.make_prompt_cache(m)]
    assert own == [8, None, 8, None]
    install_cache(m, "q8_0/turbo3[0=f16/f16]")
    got = mlx_cache.make_prompt_cache(m)
    assert [c.window for c in got] == own
    assert (got[0].k_format, got[1].k_format) == ("f16", "q8_0")


# ---- saved prompt caches: non-finite float fields refused on load -----------------------------------

def _saved(tmp_path, kf, vf, calibration=None, edit=None):
    """A 2-layer TQCache prompt cache saved by mlx-lm; ``edit(state list)`` changes its arrays first."""
    from mlx_lm.models.cache import save_prompt_cache

    layers = []
    for i in range(2):
        c = TQCache(kf, vf, calibration=calibration)
        rng = np.random.default_rng(i)
        x = mx.array(rng.standard_normal((1, 2, 6, 64)).astype(np.float32))
        c.update_and_fetch(x, x * 0.5)
        layers.append(c)

    class Edited:   # what mlx-lm's save reads: state and the class name
        def __init__(self, c, st):
            self.state = st
    states = [list(c.state) for c in layers]
    if edit is not None:
        edit(states[1])
    path = tmp_path / "cache.safetensors"
    Edited.__name__ = type(layers[0]).__name__
    save_prompt_cache(str(path), [Edited(c, st) for c, st in zip(layers, states)])
    return path


def _nan_f16_scale(kf):
    """K blocks of ``kf`` with the first block's f16 scale set to NaN (q8_0 and q4_0: d leads the block)."""
    def edit(st):
        kb = np.array(st[0])
        kb[0, 0, 2, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        st[0] = mx.array(kb)
    return edit


def _set(i, value):
    def edit(st):
        a = np.array(st[i])
        a.flat[3] = value
        st[i] = mx.array(a)
    return edit


@pytest.mark.parametrize("case,kf,vf,cal,edit,says", [
    ("mean nan", "q8_0", "turbo3", "mean+scale", _set(2, np.nan), "key mean holds NaN"),
    ("mean inf", "q8_0", "q4_0", "mean+scale", _set(2, np.inf), "key mean holds NaN"),
    ("scale -inf", "q8_0", "q8_0", "mean+scale", _set(3, -np.inf), "key scale holds NaN"),
    ("scale 0", "q8_0", "turbo3", "mean+scale", _set(3, 0.0), "key scale holds zeros"),
    ("q8_0 d nan", "q8_0", "turbo3", None, _nan_f16_scale("q8_0"), "blocks decode to NaN"),
    ("q4_0 d nan", "q4_0", "q8_0", None, _nan_f16_scale("q4_0"), "blocks decode to NaN"),
    ("f16 inf", "f16", "f16", None, _set(0, 0x7C), "blocks decode to NaN"),
])
def test_a_saved_cache_with_non_finite_floats_is_refused_on_load(tmp_path, case, kf, vf, cal, edit, says):
    from mlx_lm.models.cache import load_prompt_cache as mlx_load

    from tqbridge.metal.lm.prompt_cache import load_prompt_cache

    good = _saved(tmp_path, kf, vf, cal)
    assert [c.offset for c in load_prompt_cache(good)] == [6, 6]   # the unedited file loads
    good.unlink()
    bad = _saved(tmp_path, kf, vf, cal, edit)
    for loader in (load_prompt_cache, mlx_load):
        with pytest.raises(ValueError, match=says) as e:
            loader(str(bad))
        assert "\n" not in str(e.value)


# ---- prompt-cache files: tqbridge generate writes and continues them; mlx-lm's tools name the way in ---

def _smollm2():
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    try:
        return str(model_path("smollm2"))
    except ModelUnavailable as e:   # the model package is optional: decided before anything runs
        pytest.skip(f"SmolLM2 is not installed: {e}")


@pytest.mark.model
def test_generate_saves_a_prompt_cache_and_continues_from_it(tmp_path, capsys):
    import subprocess
    import sys

    from mlx_lm.models.cache import load_prompt_cache as mlx_load

    from tqbridge.bridge.gguf.tokenizer import ChatTokenizer
    from tqbridge.tools.cli import main

    path = _smollm2()
    f = tmp_path / "p.safetensors"
    prompt = "The capital of France is"
    assert main(["generate", path, "--kv", "q8_0/turbo3", "--prompt", prompt, "--max-tokens", "2",
                 "--save-prompt-cache", str(f)]) == 0
    n = len(ChatTokenizer(path).encode(prompt, add_bos=True))
    caches, meta = mlx_load(str(f), return_metadata=True)   # mlx-lm's loader, tqbridge imported
    assert [c.offset for c in caches] == [n] * 30 and meta["tokens"] == str(n)
    assert {(c.k_format, c.v_format) for c in caches} == {("q8_0", "turbo3")}
    capsys.readouterr()
    capsys.readouterr()
    assert main(["generate", path, "--kv", "q8_0/q4_0", "--prompt", prompt * 3, "--max-tokens", "3",
                 "--max-kv-size", "8", "--stats"]) == 0
    assert "--- kv q8_0/q4_0:" in capsys.readouterr().err   # a bounded cache generates
    more = " Paris. The capital of Italy is"
    assert main(["generate", path, "--prompt-cache-file", str(f), "--prompt", more, "--max-tokens", "3",
                 "--stats"]) == 0
    out = capsys.readouterr()
    n2 = len(ChatTokenizer(path).encode(more, add_bos=False))   # after the file's positions: no BOS
    assert out.out.strip() and f"--- kv from p.safetensors: prompt {n2} tokens" in out.err, out.err
    # the same file, opened by mlx-lm's own code in a process that never imported tqbridge
    hint = "tqbridge generate MODEL --prompt-cache-file FILE"
    for code in ("from mlx_lm.models.cache import load_prompt_cache as L; L(%r)" % str(f),
                 "import sys; sys.argv = ['mlx_lm.generate', '--model', 'none', '--prompt', 'x', "
                 "'--prompt-cache-file', %r]; from mlx_lm.generate import main; main()" % str(f)):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and hint in r.stderr.strip().splitlines()[-1], r.stderr[-500:]


def test_generate_refuses_bad_prompt_cache_options_in_one_line(tmp_path, capsys):
    from tqbridge.tools.cli import main

    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\x01" * 40)
    two = _saved(tmp_path, "q8_0", "turbo3")
    cases = [
        (["--prompt-cache-file", str(two), "--kv", "q8_0/q8_0"], "drop --kv"),
        (["--save-prompt-cache", str(two)], "already exists"),
        (["--save-prompt-cache", str(tmp_path / "x.bin")], "ends in .safetensors"),
        (["--save-prompt-cache", str(tmp_path / "y.safetensors"), "--max-tokens", "0"], "--max-tokens >= 1"),
        (["--max-kv-size", "0"], "--max-kv-size must be >= 1"),
        (["--prompt-cache-file", str(two), "--max-kv-size", "8"], "drop --max-kv-size"),
    ]
    for extra, says in cases:
        assert main(["generate", str(tmp_path / "m.gguf"), "--prompt", "x", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err


@pytest.mark.model
def test_generate_refuses_a_prompt_cache_of_another_model_in_one_line(tmp_path, capsys):
    from tqbridge.tools.cli import main

    path = _smollm2()
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\x01" * 40)
    for f, says in ((_saved(tmp_path, "q8_0", "turbo3"), "2 cache layers; the model has 30"),
                    (garbage, "g.safetensors")):
        assert main(["generate", path, "--prompt-cache-file", str(f), "--prompt", "x"]) == 2
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("llama_context")]
        assert len(err) == 1 and says in err[0] and "error:" in err[0], err


# ---- from mlx-lm's caches; bounded caches -------------------------------------------------------------

LOGIT_ATOL = 1e-4   # same float32 math in two shapes (as tests/test_cache.py's LOGIT_ATOL)


def _rows(seed, n, d=64):
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((1, 2, n, d)).astype(np.float32))


def _blocks(c, start=0):
    return tuple(np.array(a) for a in c.blocks(start))


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_a_kvcache_converts_to_the_blocks_a_tqcache_appends(kf, vf):
    src = mlx_cache.KVCache()
    k, v = _rows(1, 9), _rows(2, 9)
    src.update_and_fetch(k[..., :7, :], v[..., :7, :])
    src.update_and_fetch(k[..., 7:, :], v[..., 7:, :])
    got = TQCache.from_cache(src, kf, vf)
    want = TQCache(kf, vf)
    want.update_and_fetch(k, v)
    assert got.offset == want.offset == 9 and (got.k_format, got.v_format) == (kf, vf)
    for a, b in zip(_blocks(got), _blocks(want)):
        assert np.array_equal(a, b)
    got.update_and_fetch(_rows(3, 1), _rows(4, 1))   # and goes on
    assert got.offset == 10


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_a_quantized_kvcache_converts_from_its_dequantized_rows(kf, vf):
    src = mlx_cache.QuantizedKVCache(group_size=32, bits=8)
    src.update_and_fetch(_rows(1, 5), _rows(2, 5))
    got = TQCache.from_cache(src, kf, vf)
    kq, vq = src.keys, src.values
    want = TQCache(kf, vf)
    want.update_and_fetch(*(mx.dequantize(*(a[..., :5, :] for a in t), group_size=32, bits=8) for t in (kq, vq)))
    for a, b in zip(_blocks(got), _blocks(want)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_a_rotating_cache_converts_to_a_windowed_tqcache_of_its_positions(kf, vf):
    src = mlx_cache.RotatingKVCache(max_size=6, keep=0)
    k, v = _rows(1, 11), _rows(2, 11)
    src.update_and_fetch(k[..., :4, :], v[..., :4, :])
    for i in range(4, 11):   # one step at a time: the buffer rotates
        src.update_and_fetch(k[..., i:i + 1, :], v[..., i:i + 1, :])
    got = TQCache.from_cache(src, kf, vf)
    assert got.window == 6 and got.offset == 11 and got.size() == src.size() == 6
    want = TQCache(kf, vf, window=6)
    want.update_and_fetch(k, v)
    for a, b in zip(_blocks(got, 5), _blocks(want, 5)):   # the positions both see: 5..10
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="keeping 4 leading tokens"):
        TQCache.from_cache(mlx_cache.RotatingKVCache(max_size=6, keep=4), kf, vf)


@pytest.mark.parametrize("routed", [False, True], ids=["plain", "routed"])
def test_generation_continues_quantized_after_start_tokens(routed):
    """to_tqcache: mlx-lm's float caches for the first tokens, TQCache after (kv_bits-style start).
    A lossless pair (f32) continues with the float cache's logits; a quantized pair converts every layer
    and keeps decoding."""
    from tqbridge.metal.lm.routing import route_attention

    m = tiny_llama()
    toks = tokens(14, seed=6)[0].tolist()

    def run(kv, start):
        cache = mlx_cache.make_prompt_cache(m)
        out = []
        with route_attention("auto") if routed else _nothing():
            m(mx.array([toks[:6]]), cache=cache)
            for t in toks[6:]:
                if kv:
                    to_tqcache(cache, kv, start=start)
                lg = m(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)
                mx.eval(lg)
                out.append(np.array(lg))
        return cache, np.stack(out)

    _, want = run(None, 0)
    cache, got = run("f32/f32", 8)
    assert all(isinstance(c, TQCache) for c in cache) and cache[0].offset == 14
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)
    assert np.array_equal(got[:3], want[:3])   # before the start: mlx-lm's own cache, untouched
    for kv in ("q8_0/turbo3", "q8_0/q4_0"):
        cache, got = run(kv, 8)
        assert {(c.k_format, c.v_format) for c in cache} == {tuple(kv.split("/"))} and np.isfinite(got).all()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def test_max_kv_size_bounds_the_cache_as_mlx_lms_rotating_cache():
    """make_cache(max_kv_size=N): every layer a window of N positions; f32 logits as mlx-lm's
    RotatingKVCache(N, keep=0) gives them, and the stored rows stay bounded."""
    from tqbridge.metal.lm.cache import make_cache

    m = tiny_llama()
    toks = tokens(40, seed=7)[0].tolist()
    ours = make_cache(m, "f32", "f32", max_kv_size=8)
    theirs = [mlx_cache.RotatingKVCache(max_size=8, keep=0) for _ in m.layers]
    assert [c.window for c in ours] == [8, 8]
    outs = []
    for cache in (ours, theirs):
        got = []
        m(mx.array([toks[:5]]), cache=cache)
        for t in toks[5:]:
            lg = m(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)
            mx.eval(lg)
            got.append(np.array(lg))
        outs.append(np.stack(got))
    np.testing.assert_allclose(outs[0], outs[1], atol=LOGIT_ATOL, rtol=0)
    assert all(c.offset == 40 and c.size() == 8 for c in ours)
    with pytest.raises(ValueError, match="max_kv_size"):
        make_cache(m, "f32", "f32", max_kv_size=0)


# ---- windowed semantics: as mlx-lm's RotatingKVCache where a user sees them ----------------------------

def _window_mask(c, N):
    """Which stored keys each of the next N queries of windowed ``c`` may see (numpy, bool)."""
    keys = np.arange(c.decoder.keep_from(c.offset), c.offset + N)
    q = np.arange(c.offset, c.offset + N)[:, None]
    return (keys <= q) & (keys > q - c.window)


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_windowed_size_trimmability_and_masks_follow_rotating_kv_cache(kf, vf, monkeypatch):
    """Step by step against RotatingKVCache(4): size(), is_trimmable() and the kind of mask agree while
    the stored rows fit the window; past it (a windowed TQCache drops rows ``step`` at a time: 2 here)
    a decode step's mask is the explicit window mask where RotatingKVCache needs none."""
    monkeypatch.setattr(TQCache, "step", 2)
    ours, theirs = TQCache(kf, vf, window=4), mlx_cache.RotatingKVCache(max_size=4, keep=0)
    explicit = 0
    for n, seed in ((3, 1), (1, 2), (1, 3), (2, 4), (1, 5), (1, 6), (3, 7), (1, 8)):
        assert ours.size() == theirs.size() == min(ours.offset, 4)
        assert ours.is_trimmable() == theirs.is_trimmable() == (ours.offset < 4)
        for N in (1, 2, 3):
            want, got = theirs.make_mask(N), ours.make_mask(N)
            stored = ours.offset - ours.decoder.keep_from(ours.offset) + N
            if stored <= 4:
                assert (got is None and want is None) or (isinstance(got, str) and got == want), (ours.offset, N)
            else:
                assert not isinstance(want, str) and isinstance(got, mx.array)
                assert np.array_equal(np.array(got), _window_mask(ours, N)), (ours.offset, N)
                explicit += want is None
        for c in (ours, theirs):
            c.update_and_fetch(_rows(seed, n), _rows(seed + 10, n))
    assert ours.offset == theirs.offset == 13 and ours.size() == theirs.size() == 4
    assert explicit > 0   # the documented difference did occur


def test_mlx_lm_kv_bits_on_a_tqcache_is_refused_not_skipped():
    """mlx-lm's generate_step with kv_bits calls to_quantized on each cache that has one: a TQCache
    refuses in one line (before, kv_bits was skipped without a word)."""
    from mlx_lm.generate import generate_step

    from tqbridge.metal.lm.cache import make_cache

    m = tiny_llama()
    with pytest.raises(ValueError, match=r"kv_bits=4: TQCache\(q8_0/turbo3.*quantized already") as e:
        for _ in generate_step(tokens(6)[0], m, max_tokens=2, prompt_cache=make_cache(m, "q8_0", "turbo3"),
                               kv_bits=4, quantized_kv_start=0):
            pass
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fmt", ["f16", "bf16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_the_float_fields_view_finds_what_dequantization_finds(fmt):
    """The load check reads float formats' values and legacy blocks' d/m fields instead of dequantizing:
    for every byte of a row set to a NaN/inf pattern, it finds a non-finite value exactly when the
    dequantized row holds one."""
    from tqbridge.metal.lm.cache import block_floats
    from tqbridge.metal.codecs import any_nonfinite

    c = TQCache(fmt, fmt, rotation="none")
    c.update_and_fetch(_rows(1, 1), _rows(2, 1))
    kb = np.array(c.blocks()[0])
    assert block_floats(c.blocks()[0], fmt) is not None
    found = 0
    for at in range(kb.shape[-1]):
        for pattern in (b"\x00\x7c", b"\x00\x7e", b"\x80\xff", b"\x80\x7f\x00\x00\xc0\x7f"[-2:]):
            edited = kb.copy()
            end = min(at + 2, kb.shape[-1])
            edited[0, 0, 0, at:end] = np.frombuffer(pattern[:end - at], np.uint8)
            blocks = mx.array(edited)
            fast = bool(any_nonfinite(block_floats(blocks, fmt)).item())
            slow = bool(any_nonfinite(c._decode(blocks, fmt, c._kd, c.k_dim, mx.float32)).item())
            assert fast == slow, (fmt, at, pattern)
            found += fast
    assert found > 0
