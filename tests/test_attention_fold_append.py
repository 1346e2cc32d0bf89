"""Kernel int8-mma with the decode step's append folded into pass 1 (``DecodeOptions.fold_append``, static
parameter ``TQA_FOLD``): one launch writes the step's K/V blocks into the buffers and attends over them. Against
the two launches it replaces (kv_append.cpp, then the plain pass 1): the buffers byte-identical, the partials
bit-identical, the append's flag the same, on the CPU emulator; the step row at every place a split can hold it
(first / last row of a split, the buffer's last row), one and two SIMD groups, float32 and float16 rows."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import padded_dim
from tqbridge.metal.attention import build as ab
from tqbridge.metal.attention import check_problem
from tqbridge.metal.attention.plan import make_plan
from tqbridge.metal.codecs import rotation_group
from tqbridge.metal.kv_append import calibration_rows, prepared


def _step(kf, vf, d, B, Hkv, G, cap, pos, src, warps, splits, seed=3, nan_row=False, cal=False):
    """(plain: kc, vc, po, pml, flag), (folded: the same), split_len: the step row at buffer row ``pos``,
    length pos + 1. ``cal``: keys calibrated (the append's kcal, pass 1's q scales)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hkv * G, d)).astype(np.float32)
    k_rot, v_rot = rotation_group(kf, d, "k"), rotation_group(vf, d, "v")
    app = prepared(kf, vf, d, d, padded_dim(kf, d), padded_dim(vf, d), k_rot, v_rot, src, "cpu-emulator", calibrated=cal)
    kcal = calibration_rows(rng.standard_normal((Hkv, d)) * 0.1, rng.uniform(0.5, 2, (Hkv, d)), Hkv, d) if cal else None
    qsc = (np.repeat(kcal[1], G, axis=0).reshape(-1) if cal else None)
    kc = bridge.quantize(kf, rng.standard_normal((B, Hkv, cap, d)).astype(np.float32))
    vc = bridge.quantize(vf, rng.standard_normal((B, Hkv, cap, d)).astype(np.float32))
    # rows past the step hold garbage, as in a buffer that grew
    kc[:, :, pos:] = rng.integers(0, 256, kc[:, :, pos:].shape, dtype=np.uint8)
    vc[:, :, pos:] = rng.integers(0, 256, vc[:, :, pos:].shape, dtype=np.uint8)
    k = (rng.standard_normal((B, Hkv, 1, d)) * 3).astype(src)
    v = (rng.standard_normal((B, Hkv, 1, d)) * 3).astype(src)
    if nan_row:
        v[-1, -1, 0, 5] = np.nan
    flag_in = np.zeros(app.flag_slots(B * Hkv), np.uint32)
    flag_in[0] = 1   # a previous step's flag: carried into the new one
    # planned for the whole buffer, as a decode step's launch is (the length a parameter)
    prob = check_problem(q, kc, vc, k_format=kf, v_format=vf, length=cap, rotation=(k_rot, v_rot))
    plan = make_plan(prob, "cpu-emulator", kernel="int8-mma", splits=splits, warps=warps)
    step = check_problem(q, kc, vc, k_format=kf, v_format=vf, length=pos + 1, rotation=(k_rot, v_rot))
    split_s, _, _, _ = ab.static_params(prob, plan, 0, False, cal)
    extra = [qsc] if cal else []
    rows = B * Hkv * G
    shapes = [(rows, plan.partials, d), (rows, plan.partials, 2)]
    grid = (B * Hkv * plan.splits, 1, 1)
    ip1 = np.array(ab.pass1_params(step, plan), np.int32)
    fp1 = np.array([prob.scale, 0.0], np.float32)
    rows16 = (lambda a: a.view(np.uint16)) if src == "float16" else (lambda a: a)

    kc1, vc1 = kc.copy(), vc.copy()
    flag1 = app(k, v, kc1, vc1, pos, flag_in.copy(), *([kcal.reshape(-1)] if cal else []))
    k1 = ab.built("cpu-emulator", 0, 0, split_s, "int8-mma")
    po1, pml1 = k1([q, kc1, vc1, ip1, fp1, ab.tables(prob), np.zeros(1, np.uint32), *extra], shapes, grid,
                   32 * plan.warps, seed=seed)

    kc2, vc2 = kc.copy(), vc.copy()
    ap = np.array([B * Hkv, 1, cap, pos, Hkv, flag_in.size], np.uint32)
    kt, vt = app.device_tables
    kf2 = ab.built("cpu-emulator", 0, 0, {**split_s, **app.static, "TQA_FOLD": 1}, "int8-mma")
    po2, pml2, flag2 = kf2([q, kc2, vc2, ip1, fp1, ab.tables(prob), np.zeros(1, np.uint32), *extra,
                            rows16(k.reshape(-1)), rows16(v.reshape(-1)), kt, vt, ap, flag_in.copy(),
                            *([kcal.reshape(-1)] if cal else [])],
                           shapes + [(app.flag_slots(B * Hkv),)], grid, 32 * plan.warps, seed=seed + 1)
    return (kc1, vc1, po1, pml1, flag1), (kc2, vc2, po2, pml2, flag2), plan


def _same(plain, folded):
    names = ("K blocks", "V blocks", "partial outputs", "partial max/sum", "flag")
    for name, a, b in zip(names, plain, folded):
        assert a.shape == b.shape and a.tobytes() == b.tobytes(), f"{name} differ between the folded and the plain step"


@pytest.mark.parametrize("kf, vf, d", [("q8_0", "turbo3", 128), ("q8_0", "q4_0", 128), ("q4_0", "turbo4", 128),
                                       ("q5_0", "turbo3", 256)])
@pytest.mark.parametrize("warps", [1, 2])
def test_folded_step_equals_append_then_pass1(kf, vf, d, warps):
    # cap 256 in 4 splits: split_len 64; the step row at the first row of split 2
    plain, folded, plan = _step(kf, vf, d, B=1, Hkv=2, G=4, cap=256, pos=128, src="float16", warps=warps, splits=4)
    assert plan.split_len == 64 and plan.splits == 4 and plan.warps == warps
    _same(plain, folded)


@pytest.mark.parametrize("pos", [0, 63, 64, 255])
def test_the_step_row_anywhere_in_a_split(pos):
    plain, folded, plan = _step("q8_0", "turbo3", 128, B=2, Hkv=2, G=2, cap=256, pos=pos, src="float32", warps=2,
                                splits=4)
    assert plan.split_len == 64
    _same(plain, folded)


@pytest.mark.parametrize("pos", [31, 64])
def test_a_calibrated_step_folds_too(pos):
    """Key calibration: the append stores (x - mu) / s (kv_append's kcal), pass 1 attends with q * s (TQA_QSC)."""
    plain, folded, _ = _step("q8_0", "turbo3", 128, B=1, Hkv=2, G=4, cap=128, pos=pos, src="float16", warps=2,
                             splits=2, cal=True)
    _same(plain, folded)


def test_a_nan_row_sets_the_same_flag():
    plain, folded, _ = _step("q8_0", "turbo3", 128, B=2, Hkv=2, G=2, cap=128, pos=70, src="float16", warps=2,
                             splits=2, nan_row=True)
    assert plain[4].tolist() == folded[4].tolist()
    assert folded[4][0] == 1 and folded[4][7] == 1 and not folded[4][1:7].any()   # carried in; the last V row's NaN
    # the blocks of the NaN row are unspecified; every other byte and the other rows' partials agree
    np.testing.assert_array_equal(plain[0], folded[0])


def test_fold_is_a_build_of_int8_mma_only():
    with pytest.raises(ValueError, match="int8-mma"):
        ab.kernel_defs(0, "tiles", False, False, "float32")


@pytest.mark.gpu
@pytest.mark.parametrize("kv", [("q8_0", "turbo3"), ("q8_0", "q4_0")])
def test_the_folded_decode_lane_on_a_gpu_is_bit_identical(kv, gpu_device, monkeypatch):
    """TQCache decoding through mlx-lm's attention on CUDA with the append folded into pass 1 and without it:
    the same logits and the same blocks, bit for bit, through buffer growth; the fold ran in every layer."""
    import mlx.core as mx

    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.codecs import gpu_backend
    from tqbridge.metal.decode_options import DecodeOptions
    from tqbridge.metal.lm.cache import TQCache, make_cache
    from tiny_models import forced_decode, tiny_llama, tokens

    if gpu_backend() != "cuda":
        pytest.skip(f"the GPU here runs {gpu_backend()}: kernel int8-mma (which the fold is a build of) is CUDA's default")
    monkeypatch.setattr(TQCache, "step", 64)   # the buffers grow during the decode
    m = tiny_llama(head_dim=128)
    toks = tokens(150, seed=5)

    def run(fold: bool):
        attention_kernel.clear_launch_caches()
        cache = make_cache(m, *kv)
        for c in cache:
            c.decode_options = DecodeOptions(fold_append=fold)
        out = forced_decode(m, toks, cache)
        blocks = [np.array(b) for c in cache for b in c.blocks()]
        folded = [c.decoder.launch.run_info.get("fold_append") for c in cache]
        return out, blocks, folded

    want, want_blocks, plain = run(False)
    got, got_blocks, folded = run(True)
    assert plain == [False] * len(plain) and folded == [True] * len(folded), (plain, folded)
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(got_blocks, want_blocks))
    mx.clear_cache()


def test_fold_refusal_says_why():
    """Where the options ask for the fold and a decode launch cannot take it, one reason (``run_info["fold_refused"]``)."""
    import dataclasses

    from tqbridge.metal.attention.launch import fold_refusal

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    kb = bridge.quantize("q8_0", np.zeros((1, 2, 256, 128), np.float32))
    vb = bridge.quantize("turbo3", np.zeros((1, 2, 256, 128), np.float32))
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=256)
    plan = make_plan(prob, "cpu-emulator", kernel="int8-mma", splits=4)
    app = prepared("q8_0", "turbo3", 128, 128, 128, 128, rotation_group("q8_0", 128, "k"),
                   rotation_group("turbo3", 128, "v"), "float16", "cpu-emulator")
    widths = (kb.shape[-1], vb.shape[-1])
    assert fold_refusal(plan, 256, app, *widths, "cpu-emulator") is None
    tiles = make_plan(prob, "cpu-emulator", kernel="tiles")
    assert "not int8-mma" in fold_refusal(tiles, 256, app, *widths, "cpu-emulator")
    assert "even lengths" in fold_refusal(dataclasses.replace(plan, split_len=63), 256, app, *widths, "cpu-emulator")
    assert "do not cover" in fold_refusal(plan, 320, app, *widths, "cpu-emulator")
    assert "runs on cpu-emulator" in fold_refusal(plan, 256, app, *widths, "cuda")
    assert "another width" in fold_refusal(plan, 256, app, widths[0] + 2, widths[1], "cpu-emulator")
    assert "not a prepared KVAppend" in fold_refusal(plan, 256, object(), *widths, "cpu-emulator")
