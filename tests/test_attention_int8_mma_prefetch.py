"""Kernel int8-mma's L2 prefetch (``DecodeOptions(prefetch=N)``, ``Plan.prefetch``, static ``TQA_PF``): each
threadgroup asks the L2 cache for the N tiles of keys past its copy ring (CUDA sm_90's bulk prefetch, a no-op
elsewhere). A hint changes no result: every build must give the same bits as prefetch=0, through splits
whose last tile is partial, rows whose byte ranges start off 16 bytes (the prefetch rounds inward) and the
buffers' last rows (a range rounded outward would reach past the allocation). The option is parsed and
refused like the others, reaches the plan, the build and the run record."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal.attention import AttentionError, check_problem, last_run
from tqbridge.metal.attention import build as attention_build
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.decode_options import INT8_MMA_DEFAULT_PREFETCH, INT8_MMA_MAX_PREFETCH, DecodeOptions
from helpers_kernels import check_int8_mma, quantized_cache
from test_attention_kernel import BACKENDS

# (K format, V format, head dim, lengths of the batch rows, splits): q8_0 K rows of 136 bytes and turbo3 V
# rows of 50 (every other tile's V range starts off 16 bytes), q4_0 K rows of 72; the buffers end at the
# longest row, so the last tile's ranges end at the allocation's end
CASES = [
    ("q8_0", "turbo3", 128, [700, 289], 2),
    ("q4_0", "q8_0", 128, [513], 1),
    ("q8_0", "turbo2", 256, [300, 97], 3),
]


@pytest.fixture
def clean_plans():
    yield
    attention_kernel.clear_launch_caches()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-d{c[2]}-n{'_'.join(map(str, c[3]))}" for c in CASES])
def test_prefetch_changes_no_bit(backend, case, clean_plans):
    kf, vf, d, lengths, splits = case
    rng = np.random.default_rng(d + sum(lengths))
    b, hkv, g = len(lengths), 2, 4
    q = rng.standard_normal((b, hkv * g, d)).astype(np.float32)
    n = max(lengths)
    kb, vb = quantized_cache(rng, kf, (b, hkv, n, d)), quantized_cache(rng, vf, (b, hkv, n, d))
    outs = {}
    for pf in (0, 1, INT8_MMA_MAX_PREFETCH):
        got, _, _ = check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=lengths, splits=splits,
                                   options=DecodeOptions(prefetch=pf))
        assert last_run()["prefetch"] == pf
        outs[pf] = got
    for pf in (1, INT8_MMA_MAX_PREFETCH):
        assert np.array_equal(outs[pf], outs[0]), f"prefetch={pf} changed the output"


def test_option_reaches_plan_and_build():
    prob = check_problem(np.zeros((1, 8, 128), np.float32), np.zeros((1, 2, 256, 136), np.uint8),
                         np.zeros((1, 2, 256, 50), np.uint8), k_format="q8_0", v_format="turbo3", length=256)
    for backend in ("cuda", "cpu-emulator"):
        default = attention_plan.make_plan(prob, backend, kernel="int8-mma", options=DecodeOptions())
        assert default.prefetch == INT8_MMA_DEFAULT_PREFETCH.get(backend, 0)
        plan = attention_plan.make_plan(prob, backend, kernel="int8-mma", options=DecodeOptions(prefetch=3))
        assert plan.prefetch == 3
        assert attention_build.static_params(prob, plan, 0, False)[0]["TQA_PF"] == 3


def test_option_parsing_and_refusals():
    assert DecodeOptions.parse("prefetch=2").prefetch == 2
    assert DecodeOptions.parse("prefetch=0").prefetch == 0
    assert DecodeOptions(prefetch=4).label() == "prefetch=4"
    for bad in ("prefetch=-1", "prefetch=x", f"prefetch={INT8_MMA_MAX_PREFETCH + 1}"):
        with pytest.raises(AttentionError, match="prefetch"):
            DecodeOptions.parse(bad)
    for bad in (True, 1.5, -1, INT8_MMA_MAX_PREFETCH + 1):
        with pytest.raises(AttentionError, match="prefetch"):
            DecodeOptions(prefetch=bad)
