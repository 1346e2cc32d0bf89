"""benchmarks/scripts/ablate_combine.py patches names of the decode path by position: they must still be there,
with the cache where the script looks for it (a rename would otherwise surface only on a GPU, as the script's
"the patch no longer applies")."""

from __future__ import annotations

import inspect


def test_the_names_the_ablation_patches_exist_with_the_cache_where_it_looks():
    from tqbridge.metal.attention.launch import Launches
    from tqbridge.metal.lm import decode_bench

    assert list(inspect.signature(Launches.combine).parameters) == ["self", "po", "pml", "sk", "dtype"]
    for name, at in (("decode_tokens", 1), ("device_profile", 1), ("layer_step_profile", 0)):
        params = list(inspect.signature(getattr(decode_bench, name)).parameters)
        assert params[at] == "cache", (name, params)
    assert inspect.signature(decode_bench.prepare_cache).return_annotation.startswith("tuple[dict")   # (row, cache)
