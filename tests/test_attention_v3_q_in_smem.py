"""Kernel v3's two ways of holding q (TQBRIDGE_V3_Q_IN_SMEM): q's int8 fragments and scales in
registers for the whole key loop (the default) or read from threadgroup memory in it (fewer
registers, more threadgroups per SM; benchmarks/scripts/kernel_sass.py). The same values enter the same
operations in the same order, so the outputs must be identical bit for bit, on every backend here;
and the variant must be what actually ran (its plan and its static parameter)."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal import attention_kernel
from tqbridge.metal.attention import check_problem, decode_attention
from test_attention_kernel import BACKENDS, _cache

CASES = [("q8_0", "turbo3", 128, 4, 300), ("q4_1", "q4_0", 128, 2, 173), ("q5_1", "turbo4", 64, 8, 97),
         ("iq4_nl", "f16", 256, 1, 150)]


def _run(backend, monkeypatch, smem: bool, kf, vf, d, g, n):
    if smem:
        monkeypatch.setenv("TQBRIDGE_V3_Q_IN_SMEM", "1")
    else:
        monkeypatch.delenv("TQBRIDGE_V3_Q_IN_SMEM", raising=False)
    attention_kernel._plan_cached.cache_clear()
    rng = np.random.default_rng(d + g + n)
    q = rng.standard_normal((1, 2 * g, d)).astype(np.float32)
    kb, vb = _cache(rng, kf, (1, 2, n, d)), _cache(rng, vf, (1, 2, n, d))
    prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=n)
    plan = attention_kernel.make_plan(prob, "cpu-emulator" if backend == "cpu-emulator" else "cuda", kernel="v3")
    assert plan.q_regs is (not smem)
    assert attention_kernel._static(prob, plan, 0, False)[0]["TQA_QSMEM"] == int(smem)
    out = decode_attention(q, kb, vb, k_format=kf, v_format=vf, length=n, backend=backend, q_precision="int8")
    return np.asarray(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf,vf,d,g,n", CASES, ids=[f"{c[0]}-{c[1]}-d{c[2]}" for c in CASES])
def test_q_in_threadgroup_memory_is_bit_identical(backend, monkeypatch, kf, vf, d, g, n):
    try:
        regs = _run(backend, monkeypatch, False, kf, vf, d, g, n)
        smem = _run(backend, monkeypatch, True, kf, vf, d, g, n)
    finally:
        monkeypatch.delenv("TQBRIDGE_V3_Q_IN_SMEM", raising=False)
        attention_kernel._plan_cached.cache_clear()
    assert np.isfinite(regs).all()
    assert np.array_equal(regs.view(np.uint32), smem.view(np.uint32))
