"""Kernel int8-mma's profiling build (static parameter TQA_PHASES, benchmarks/scripts/pass1_phases.py): one
output more, the timestamps thread 0 of each threadgroup writes at five points (the global timer and the cycle counter), and every other output
bit-identical to the plain build's. On the emulator the "timer" counts its calls, so the test checks the
points' order and that each threadgroup wrote all five; nvcc compiles the CUDA build
(tests/test_cuda_compile.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.metal.attention import build as ab
from tqbridge.metal.attention import check_problem
from tqbridge.metal.attention.plan import make_plan

PHASES = 5   # entry, q ready, first tile landed, key loop done, partial written


def _run(static: dict, prob, plan, ins, n_out: int):
    k1 = ab.built("cpu-emulator", 0, 0, static, plan.kernel)
    rows = prob.batch * prob.q_heads * prob.rows
    shapes = [(rows, plan.partials, prob.v_dim), (rows, plan.partials, 2)]
    shapes += [(prob.batch * prob.kv_heads * plan.splits * PHASES * 4,)] * (n_out - 2)
    return k1(ins, shapes, (prob.batch * prob.kv_heads * plan.splits, 1, 1), 32 * plan.warps, seed=5)


@pytest.mark.parametrize("kf, vf, d, splits", [("q8_0", "turbo3", 128, 3), ("q8_0", "q4_0", 256, 2)])
def test_phase_build_stamps_every_threadgroup_and_changes_nothing_else(kf, vf, d, splits):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 8, d)).astype(np.float32)
    kb = bridge.quantize(kf, rng.standard_normal((1, 2, 320, d)).astype(np.float32))
    vb = bridge.quantize(vf, rng.standard_normal((1, 2, 320, d)).astype(np.float32))
    prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=300)
    plan = make_plan(prob, "cpu-emulator", kernel="int8-mma", splits=splits)
    split_s, _, _, _ = ab.static_params(prob, plan, 0, False)
    ip1 = np.array(ab.pass1_params(prob, plan), np.int32)
    ins = [q, kb, vb, ip1, np.array([prob.scale, 0.0], np.float32), ab.tables(prob), np.zeros(1, np.uint32)]
    po, pml = _run(split_s, prob, plan, ins, 2)
    po2, pml2, clk = _run({**split_s, "TQA_PHASES": 1}, prob, plan, ins, 3)
    assert po.tobytes() == po2.tobytes() and pml.tobytes() == pml2.tobytes()
    t = clk.reshape(-1, 2, PHASES, 2).astype(np.uint64)   # threadgroup, (timer, cycles), point, (low, high)
    stamps = t[..., 0] | (t[..., 1] << np.uint64(32))
    assert stamps.shape[:2] == (prob.kv_heads * plan.splits, 2)
    assert (stamps > 0).all(), stamps                               # every threadgroup wrote all five points
    assert (np.diff(stamps.astype(np.int64), axis=2) > 0).all(), stamps   # in the kernel's order
    # the emulator's two counters are one: each point's cycle stamp right after its timer stamp
    assert (stamps[:, 1] == stamps[:, 0] + 1).all()


def test_phases_are_a_build_of_int8_mma_only():
    with pytest.raises(ValueError, match="int8-mma"):
        ab.kernel_defs(0, "tiles", False, True)


def test_phase_summary_of_a_known_launch():
    """benchmarks/scripts/pass1_phases.py's summary of one launch: two threadgroups whose stamps are known
    (the SM at 2 cycles per ns), and one with no keys (zero stamps), left out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))
    import pass1_phases

    ns = np.array([[1000, 2000, 3000, 9000, 10000], [3000, 3500, 5000, 11000, 12000], [0, 0, 0, 0, 0]], np.uint64)
    cyc = ns * np.uint64(2) + np.uint64(77)   # another origin, the same intervals at 2 GHz
    cyc[2] = 0
    s = pass1_phases.summarize(ns, cyc, event_us=12.5)
    assert s["threadgroups"] == 2 and s["empty_threadgroups"] == 1
    assert s["span_us"] == pytest.approx(11.0) and s["sm_ghz"] == pytest.approx(2.0)
    assert s["entry_after_first_us"]["p100"] == pytest.approx(2.0)
    assert s["exit_after_first_entry_us"]["p10"] == pytest.approx(9.2)
    ph = s["phases_median"]
    assert ph["prologue"]["us"] == pytest.approx(0.75) and ph["first_tile_wait"]["us"] == pytest.approx(1.25)
    assert ph["key_loop"]["us"] == pytest.approx(6.0) and ph["epilogue"]["us"] == pytest.approx(1.0)


def test_phase_script_runs_on_the_emulator(tmp_path):
    """The whole script on the emulator (MLX's CUDA launch is the only part it does not reach): a row per
    split count, every threadgroup profiled in every launch, the phases' cycles in the kernel's order."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))
    import pass1_phases

    out = tmp_path / "phases.json"
    assert pass1_phases.main(["--backend", "cpu-emulator", "--context", "512", "--q-heads", "8", "--kv-heads", "2",
                              "--splits", "2,4", "--launches", "2", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert [r["splits"] for r in rec["rows"]] == [2, 4] and rec["read_GBps"] is None
    for r in rec["rows"]:
        assert r["threadgroups"] == 2 * r["splits"] and len(r["launches"]) == 2
        assert all(x["threadgroups"] == r["threadgroups"] and x["empty_threadgroups"] == 0 for x in r["launches"])
        assert r["span_us_min"] == min(x["span_us"] for x in r["launches"]) <= r["span_us"]
        # one call of each counter per point: each phase spans two calls of the shared counter
        assert set(r["phases_cycles"].values()) == {2.0}, r["phases_cycles"]
