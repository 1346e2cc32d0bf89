"""Copies of TQCache (copy.copy, copy.deepcopy, of one cache and of a list) are independent caches: each
trims, appends and decodes on its own; mlx-lm's LRUPromptCache stores and reuses TQCache prefixes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from mlx_lm.models import cache as mlx_cache  # noqa: E402

from tqbridge.metal.lm.cache import TQCache, make_cache  # noqa: E402
from tqbridge.metal.lm.routing import route_attention  # noqa: E402
from tiny_models import cpu_device, tiny_llama, tokens  # noqa: E402,F401

PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "turbo3"), ("q8_0", "q4_0")]
COPIES = {"deepcopy": copy.deepcopy, "copy": copy.copy}


def _rows(seed, n, d=64, h=2):
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((1, h, n, d)).astype(np.float32))


def _feed(c, chunks):
    for seed, n in chunks:
        k = _rows(seed, n)
        c.update_and_fetch(k, _rows(seed + 1000, n))
    return c


def _bytes(c):
    kb, vb = c.blocks()
    return np.array(kb), np.array(vb)


@pytest.mark.parametrize("how", sorted(COPIES))
@pytest.mark.parametrize("kf,vf", PAIRS)
def test_a_copy_trims_and_appends_without_touching_the_original(kf, vf, how):
    """Copy after a prefill and two decode steps; trim the copy and append other rows to it, append
    more to the original: each holds the bytes of a fresh cache fed its own sequence."""
    head = [(1, 6), (2, 1), (3, 1)]
    c = _feed(TQCache(kf, vf), head)
    twin = COPIES[how](c)
    assert twin is not c and twin.offset == c.offset == 8
    assert twin.trim(2) == 2
    _feed(twin, [(4, 1), (5, 3)])
    _feed(c, [(6, 1), (7, 1)])
    want_c = _feed(TQCache(kf, vf), head + [(6, 1), (7, 1)])
    want_twin = _feed(TQCache(kf, vf), head[:1] + [(4, 1), (5, 3)])
    for got, want in ((c, want_c), (twin, want_twin)):
        assert got.offset == want.offset
        for a, b in zip(_bytes(got), _bytes(want)):
            assert np.array_equal(a, b)


def test_a_list_of_caches_copies_as_a_list_and_an_empty_cache_copies():
    caches = [_feed(TQCache("q8_0", "turbo3"), [(1, 3)]), TQCache("q8_0", "q4_0"), mlx_cache.KVCache()]
    twins = copy.deepcopy(caches)
    assert [type(t) for t in twins] == [type(c) for c in caches]
    assert twins[1].empty() and twins[1].offset == 0 and twins[1].k_format == "q8_0"
    _feed(twins[1], [(2, 2)])
    assert caches[1].empty()
    assert np.array_equal(_bytes(twins[0])[0], _bytes(caches[0])[0])


def _decode(m, cache, toks, routed):
    """Logits of each token fed one at a time (the first chunk of 6 at once)."""
    out = []

    def run():
        for t in toks:
            x = mx.array([t]) if isinstance(t, list) else mx.array([[t]])
            lg = m(x, cache=cache)[0, -1].astype(mx.float32)
            mx.eval(lg)
            out.append(np.array(lg))
    if routed:
        with route_attention("auto"):
            run()
    else:
        run()
    return out


def _with_trimmed_twin(m, kf, vf, routed):
    """A cache after a 6-token prompt and 2 decode steps, and a deep copy of it trimmed by one; the
    tokens (prompt, a, b) the tests go on with."""
    t = tokens(12, seed=3)[0].tolist()
    prompt, a, b = t[:6], t[6:9], t[9:12]
    cache = make_cache(m, kf, vf)
    _decode(m, cache, [prompt, a[0], a[1]], routed)
    twin = copy.deepcopy(cache)
    for c in twin:
        c.trim(1)
    return cache, twin, (prompt, a, b)


@pytest.mark.parametrize("routed", [False, True], ids=["plain", "routed"])
@pytest.mark.parametrize("kf,vf", PAIRS)
def test_a_copy_decodes_independently(kf, vf, routed):
    """A model decodes the original and a trimmed copy with different tokens, step by step in turn: each
    one's logits equal a fresh cache's over its own sequence, exactly (same chunks, same float math on the
    CPU)."""
    m = tiny_llama()
    cache, twin, (prompt, a, b) = _with_trimmed_twin(m, kf, vf, routed)
    got_c, got_twin = [], []
    for x, y in ((a[2], b[1]), (b[0], b[2])):   # interleaved: each step of one between steps of the other
        got_c += _decode(m, cache, [x], routed)
        got_twin += _decode(m, twin, [y], routed)
    want_c = _decode(m, make_cache(m, kf, vf), [prompt, a[0], a[1], a[2], b[0]], routed)[-2:]
    want_twin = _decode(m, make_cache(m, kf, vf), [prompt, a[0], b[1], b[2]], routed)[-2:]
    for got, want in ((got_c, want_c), (got_twin, want_twin)):
        for g, w in zip(got, want):
            assert np.array_equal(g, w)


def test_the_decode_lane_copy_has_its_own_buffers(emulated_decode_lane):
    """On the GPU decode lane (its kernels on the CPU emulator, writing the buffers in place) a copy's
    buffers are its own: the original's in-place appends after a trim never show in the copy."""
    m = tiny_llama()
    t = tokens(10, seed=4)[0].tolist()
    cache = make_cache(m, "q8_0", "turbo3")
    with route_attention("auto"):
        _decode(m, cache, [t[:5], t[5], t[6]], routed=True)
        twin = copy.deepcopy(cache)
        before = [_bytes(c) for c in twin]
        for c in cache:
            c.trim(2)
        _decode(m, cache, [t[8], t[9]], routed=True)
    assert any(k for c in cache for k in c.paths if k.startswith("decode:"))
    for c, (kb, vb) in zip(twin, before):
        assert np.array_equal(_bytes(c)[0], kb) and np.array_equal(_bytes(c)[1], vb)
    for c, o in zip(twin, cache):
        assert not np.array_equal(_bytes(c)[0][..., 5:, :], _bytes(o)[0][..., 5:, :])


@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("f16", "f16")])
def test_mlx_lm_lru_prompt_cache_reuses_a_tqcache_prefix(kf, vf):
    """mlx-lm's LRUPromptCache stores a TQCache list and hands out trimmed deep copies; the stored
    entry keeps its bytes while a fetched copy decodes on."""
    m = tiny_llama()
    t = tokens(12, seed=5)[0].tolist()
    cache = make_cache(m, kf, vf)
    _decode(m, cache, [t[:8]], routed=False)
    store = mlx_cache.LRUPromptCache(max_size=4)
    store.insert_cache("m", t[:8], cache)
    kept = [_bytes(c) for c in cache]
    got, rest = store.fetch_nearest_cache("m", t[:6] + [t[11], t[10]])
    assert rest == [t[11], t[10]] and all(c.offset == 6 for c in got)
    logits = _decode(m, got, [rest[0], rest[1]], routed=False)
    ref = make_cache(m, kf, vf)   # the same rows, never copied: 8 tokens in one chunk, trimmed to 6
    _decode(m, ref, [t[:8]], routed=False)
    mlx_cache.trim_prompt_cache(ref, 2)
    want = _decode(m, ref, [rest[0], rest[1]], routed=False)
    for g, w in zip(logits, want):
        assert np.array_equal(g, w)
    for c, (kb, vb) in zip(cache, kept):
        assert c.offset == 8 and np.array_equal(_bytes(c)[0], kb) and np.array_equal(_bytes(c)[1], vb)


@pytest.mark.gpu
@pytest.mark.parametrize("kf,vf", PAIRS)
def test_copies_on_the_gpu_decode_lane(kf, vf, gpu_device):
    """On a GPU (in-place append kernels, the fused attention over the buffers): the original and a
    trimmed deep copy decode in turn; each one's layer-0 blocks (rows no attention output feeds) are a
    fresh cache's over its own tokens, byte for byte."""
    from tqbridge.metal.codecs import gpu_backend

    assert gpu_backend() is not None
    m = tiny_llama()
    cache, twin, (prompt, a, b) = _with_trimmed_twin(m, kf, vf, True)
    for x, y in ((a[2], b[1]), (b[0], b[2])):
        _decode(m, cache, [x], True)
        _decode(m, twin, [y], True)
    want_c, want_twin = make_cache(m, kf, vf), make_cache(m, kf, vf)
    _decode(m, want_c, [prompt, a[0], a[1], a[2], b[0]], True)
    _decode(m, want_twin, [prompt, a[0], b[1], b[2]], True)
    assert any(k.startswith("decode:") and "reference" not in k for k in cache[0].paths), cache[0].paths
    for got, want in ((cache[0], want_c[0]), (twin[0], want_twin[0])):
        assert got.offset == want.offset
        for g, w in zip(_bytes(got), _bytes(want)):
            assert np.array_equal(g, w)


def _freed_by_refcount(make) -> bool:
    """Whether the caches ``make()`` returns (a list) are freed as soon as the last reference goes, with
    Python's cyclic collector off: a reference cycle would hold their block buffers until it ran."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        caches = make()
        refs = [weakref.ref(c) for c in caches] + [weakref.ref(c.decoder) for c in caches if hasattr(c, "decoder")]
        del caches
        return all(r() is None for r in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("lane", [False, True], ids=["ops", "emulated-lane"])
def test_a_dropped_cache_frees_its_blocks_without_the_cycle_collector(lane, request):
    """A server evicting prompt caches gets their memory back at once: a TQCache that decoded (routed,
    on the ops path or the decode lane), its deep copy and a merged batch of them hold no reference cycle."""
    if lane:
        request.getfixturevalue("emulated_decode_lane")
    m = tiny_llama()

    def decoded():
        cache, twin, _ = _with_trimmed_twin(m, "q8_0", "turbo3", True)
        return list(cache) + list(twin)

    def batch():
        a = make_cache(m, "q8_0", "turbo3")
        b = make_cache(m, "q8_0", "turbo3")
        _decode(m, a, [tokens(5, seed=1)[0].tolist()], True)
        _decode(m, b, [tokens(7, seed=2)[0].tolist()], True)
        return [TQCache.merge([x, y]) for x, y in zip(a, b)]

    assert _freed_by_refcount(decoded)
    assert _freed_by_refcount(batch)
