"""TQCache where mlx-lm's own code meets it: its batch caches refuse TQCache layers in one line (they would
copy the blocks as K/V rows), mlx-lm's batch generation refuses them, and install_cache makes every cache
mlx-lm builds for a model a TQCache."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from mlx_lm.models import cache as mlx_cache  # noqa: E402

from tqbridge.metal.lm.cache import TQCache, install_cache  # noqa: E402
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


def test_mlx_lm_batch_generate_refuses_tqcache_layers():
    from mlx_lm.generate import BatchGenerator

    m = tiny_llama()
    install_cache(m, "q8_0/turbo3")
    gen = BatchGenerator(m, max_tokens=2)
    gen.insert([tokens(4)[0].tolist(), tokens(6, seed=1)[0].tolist()])
    with pytest.raises(ValueError, match="does not yet support batching"):
        while gen.next():
            pass
    gen.close()


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
