"""benchmarks/scripts/ablate_pass1.py (and kernel_sass.py --common-path) edit kernel int8-mma's pass-1 source by
text substitution; a kernel change that breaks a substitution must fail here (CI), not on the GPU
machine. No GPU or CuPy needed: the edited sources are only built as text, and each must differ
from the plain one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ablate():
    sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))
    try:
        import ablate_pass1
        yield ablate_pass1
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "scripts"))


def _int8_mma_defs(v_format: str, chunks=None):
    from tqbridge import bridge
    from tqbridge.metal.attention import check_problem
    from tqbridge.metal.attention.build import kernel_defs, static_params
    from tqbridge.metal.attention.plan import make_plan

    rng = np.random.default_rng(0)
    kf, vf = bridge.get_format("q8_0"), bridge.get_format(v_format)
    q = rng.standard_normal((1, 32, 128)).astype(np.float32)
    kb = bridge.quantize(kf, rng.standard_normal((1, 8, 64, 128)).astype(np.float32))
    vb = bridge.quantize(vf, rng.standard_normal((1, 8, 64, 128)).astype(np.float32))
    prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=64)
    plan = make_plan(prob, "cuda", kernel="int8-mma", chunks=chunks)
    split_s, comb_s, _, _ = static_params(prob, plan, 0, False)
    k1, k2 = kernel_defs(0, plan.kernel)
    return (k1, split_s), (k2, comb_s)


@pytest.mark.parametrize("name", ["nov", "nok", "nokld", "nokv", "v23nonorm", "v23nosign", "v23noidx"])
def test_every_ablation_still_matches_the_kernel(ablate, name):
    (k1, s1), (k2, s2) = _int8_mma_defs("turbo3")
    plain = ablate.PLAIN_SOURCE(k1, s1)
    edited = ablate.ablated_source([name])(k1, s1)
    assert edited != plain
    assert ablate.ablated_source([name])(k2, s2) == ablate.PLAIN_SOURCE(k2, s2)   # the combine: untouched
    assert ablate.ablated_source(["none"])(k1, s1) == plain


def test_a_stale_substitution_stops_the_run(ablate, monkeypatch):
    (k1, s1), _ = _int8_mma_defs("turbo3")
    monkeypatch.setitem(ablate.SUBS, "stale", [("this text is not in the kernel", "")])
    with pytest.raises(SystemExit, match="no longer matches"):
        ablate.ablated_source(["stale"])(k1, s1)


def test_kernel_sass_common_path_still_matches_the_kernel(ablate):
    import kernel_sass   # benchmarks/scripts/ is on the path while the fixture holds

    (k1, s1), _ = _int8_mma_defs("turbo3")
    plain = ablate.PLAIN_SOURCE(k1, s1)
    reduced = kernel_sass._common_path(plain)
    assert reduced != plain and "if (true) {" in reduced and "if (false) {" in reduced
    with pytest.raises(SystemExit, match="no longer in the kernel source"):
        kernel_sass._common_path(reduced)   # applied twice: its anchors are gone


def test_kernel_sass_counts_per_key_of_the_step(ablate, monkeypatch):
    """kernel_sass.loop_profile divides the loop by the keys one iteration serves: 16 per chunk
    (int8-mma with two chunks per step serves 32); the edits still match the two-chunk source."""
    import kernel_sass

    sass = "\n".join(f"        /*{a:04x}*/                   {op} ;" for a, op in [
        (0x0000, "LDS R2, [R3]"), (0x0010, "IMMA.16832.S8.S8 R4, R8, R12, R4"), (0x0020, "HMMA.16816.F32 R0, R4, R8, R0"),
        (0x0030, "PRMT R5, R6, 0x5140, R7"), (0x0040, "BRA 0x0000")])
    one, two = kernel_sass.loop_profile(sass), kernel_sass.loop_profile(sass, 32)
    assert one["loop_instructions"] == two["loop_instructions"] == 5
    assert (one["per_key"], one["keys_per_iteration"]) == (round(5 / 16, 1), 16)
    assert (two["per_key"], two["keys_per_iteration"]) == (round(5 / 32, 1), 32)
    (k1, s1), _ = _int8_mma_defs("turbo3", chunks=2)
    assert s1["TQA_KC"] == 2 and s1["TQ_DSMEM"] == 0
    plain = ablate.PLAIN_SOURCE(k1, s1)
    assert kernel_sass._common_path(plain) != plain
    for name in ("nov", "nok", "v23noidx"):
        assert ablate.ablated_source([name])(k1, s1) != plain


def test_kernel_sass_counts_the_tile_loop_around_the_key_loop(ablate):
    """The outermost loop around the tensor-core products (int8-mma: the tile loop with its staging copies)
    is counted apart from the key loop: its extra instructions and its asynchronous copies."""
    import kernel_sass

    sass = "\n".join(f"        /*{a:04x}*/                   {op} ;" for a, op in [
        (0x0000, "LDGSTS.E.BYPASS.128 [R1], desc[UR6][R2.64]"), (0x0010, "BAR.SYNC.DEFER_BLOCKING 0x0"),
        (0x0020, "IMMA.16832.S8.S8 R4, R8, R12, R4"), (0x0030, "HMMA.16816.F32 R0, R4, R8, R0"), (0x0040, "BRA 0x0020"),
        (0x0050, "LDGSTS.E [R1+0x4], desc[UR6][R2.64+0x4]"), (0x0060, "BRA 0x0000")])
    p = kernel_sass.loop_profile(sass)
    assert p["loop_instructions"] == 3   # the key loop: 0x20..0x40
    assert p["outer_loop_extra_instructions"] == 4 and p["outer_loop_copies"] == 2
