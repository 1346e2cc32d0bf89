"""Kernel int8-mma's folded pass 1 with the combine pass inside it too (``DecodeOptions.fold_combine``, static
``TQA_FOLDC``): each threadgroup counts itself in when its partial is written, and the last of its (batch row,
KV head) merges that head's rows as attention_kernel_combine.cpp does. Against the two launches it replaces (the
folded pass 1, then the combine), on the CPU emulator, whose threadgroups run in a seeded random order (so a
different threadgroup is last under each seed): the output rows bit-identical, the buffers and the append's flag
the same, the counters back at zero; with few and with more partials than the combine has threads, head dims 128
and 256, one and two SIMD groups, float32 and float16 q."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import padded_dim
from tqbridge.metal.attention import build as ab
from tqbridge.metal.attention import check_problem
from tqbridge.metal.attention.plan import COMBINE_THREADS, make_plan
from tqbridge.metal.codecs import rotation_group
from tqbridge.metal.kv_append import prepared


def _step(kf, vf, d, B, Hkv, G, cap, pos, warps, splits, qtype=0, seed=3):
    """(two launches: out, kc, vc, flag), (one launch: out, kc, vc, flag, counters after): a decode step whose
    row lands at buffer row ``pos`` (length pos + 1), q in float32 (qtype 0) or float16 (1)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hkv * G, d)).astype(np.float32)
    qn = q if qtype == 0 else q.astype(np.float16).view(np.uint16)
    k_rot, v_rot = rotation_group(kf, d, "k"), rotation_group(vf, d, "v")
    app = prepared(kf, vf, d, d, padded_dim(kf, d), padded_dim(vf, d), k_rot, v_rot, "float16", "cpu-emulator")
    kc = bridge.quantize(kf, rng.standard_normal((B, Hkv, cap, d)).astype(np.float32))
    vc = bridge.quantize(vf, rng.standard_normal((B, Hkv, cap, d)).astype(np.float32))
    k = (rng.standard_normal((B, Hkv, 1, d)) * 3).astype(np.float16)
    v = (rng.standard_normal((B, Hkv, 1, d)) * 3).astype(np.float16)
    flag_in = np.zeros(app.flag_slots(B * Hkv), np.uint32)
    prob = check_problem(q, kc, vc, k_format=kf, v_format=vf, length=cap, rotation=(k_rot, v_rot))
    plan = make_plan(prob, "cpu-emulator", kernel="int8-mma", splits=splits, warps=warps)
    step = check_problem(q, kc, vc, k_format=kf, v_format=vf, length=pos + 1, rotation=(k_rot, v_rot))
    split_s, comb_s, _, extra2 = ab.static_params(prob, plan, qtype, False)
    rows = B * Hkv * G
    shapes = [(rows, plan.partials, d), (rows, plan.partials, 2), (app.flag_slots(B * Hkv),)]
    grid = (B * Hkv * plan.splits, 1, 1)
    ip1 = np.array(ab.pass1_params(step, plan), np.int32)
    fp1 = np.array([prob.scale, 0.0], np.float32)
    ap = np.array([B * Hkv, 1, cap, pos, Hkv, flag_in.size], np.uint32)
    kt, vt = app.device_tables
    tabs = ab.tables(prob)

    def ins(kb, vb):
        return [qn, kb, vb, ip1, fp1, tabs, np.zeros(1, np.uint32), k.view(np.uint16).reshape(-1),
                v.view(np.uint16).reshape(-1), kt, vt, ap, flag_in.copy()]

    kc1, vc1 = kc.copy(), vc.copy()
    k1 = ab.built("cpu-emulator", 0, qtype, {**split_s, **app.static, "TQA_FOLD": 1}, "int8-mma")
    po, pml, flag1 = k1(ins(kc1, vc1), shapes, grid, 32 * plan.warps, seed=seed)
    k2 = ab.built("cpu-emulator", 1, qtype, comb_s)
    ip2 = np.array([plan.partials, Hkv * G, 0, *extra2], np.int32)
    (out1,) = k2([po, pml, ip2, np.zeros(Hkv * G, np.float32), tabs], [(rows, d)], (rows, 1, 1), COMBINE_THREADS,
                 seed=seed)

    kc2, vc2 = kc.copy(), vc.copy()
    cnt = np.zeros(B * Hkv, np.uint32)
    k1c = ab.built("cpu-emulator", 0, qtype, {**split_s, **app.static, "TQA_FOLD": 1, **ab.fold_combine_static()},
                   "int8-mma")
    _, _, flag2, out2 = k1c(ins(kc2, vc2) + [cnt], shapes + [(rows, d)], grid, 32 * plan.warps, seed=seed + 1)
    return (out1, kc1, vc1, flag1), (out2, kc2, vc2, flag2, cnt), plan


def _same(two, one):
    for name, a, b in zip(("output rows", "K blocks", "V blocks", "flag"), two, one):
        assert a.shape == b.shape and a.tobytes() == b.tobytes(), f"{name} differ between one launch and two"
    assert not one[4].any(), f"the counters end at {one[4].tolist()}, not 0"


@pytest.mark.parametrize("kf, vf, d", [("q8_0", "turbo3", 128), ("q8_0", "q4_0", 128), ("q5_0", "turbo3", 256)])
@pytest.mark.parametrize("warps", [1, 2])
def test_one_launch_equals_pass1_then_the_combine(kf, vf, d, warps):
    two, one, plan = _step(kf, vf, d, B=2, Hkv=2, G=4, cap=256, pos=150, warps=warps, splits=4)
    assert plan.splits == 4 and plan.warps == warps
    _same(two, one)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_whichever_threadgroup_is_last_the_rows_are_the_same(seed):
    """Each seed runs the threadgroups in another order: another split merges the head's rows."""
    two, one, _ = _step("q8_0", "turbo3", 128, B=1, Hkv=2, G=2, cap=128, pos=100, warps=2, splits=8, seed=seed)
    _same(two, one)


def test_float16_q_and_output():
    two, one, _ = _step("q8_0", "turbo3", 128, B=1, Hkv=2, G=4, cap=128, pos=127, warps=2, splits=4, qtype=1)
    _same(two, one)


def test_more_partials_than_the_combine_has_threads():
    """300 splits of 2 keys: the combine's threads each weigh two partials, and its registers' 64 per thread
    run out (PR * PG = 128 < 300): the folded combine plays every one of those loops."""
    two, one, plan = _step("q8_0", "q4_0", 128, B=1, Hkv=1, G=2, cap=600, pos=599, warps=1, splits=300)
    assert plan.splits == 300 > COMBINE_THREADS
    _same(two, one)


def test_the_folded_combine_is_a_build_of_the_folded_pass1():
    with pytest.raises(ValueError, match="folded pass 1"):
        ab.kernel_defs(0, "int8-mma", False, False, None, False, True)


def _decode_lane(kv, fold_combine: bool, n_tokens: int):
    """A tiny Llama decoding through mlx-lm's attention with TQCache layers whose step folds the append (and,
    with ``fold_combine``, the combine) into pass 1: the logits, the blocks, each layer's run_info."""
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.decode_options import DecodeOptions
    from tqbridge.metal.lm.cache import make_cache
    from tiny_models import forced_decode, tiny_llama, tokens

    attention_kernel.clear_launch_caches()
    m = tiny_llama(head_dim=128)
    cache = make_cache(m, *kv)
    for c in cache:
        c.decode_options = DecodeOptions(defer_append=True, fold_append=True, fold_combine=fold_combine,
                                         q_precision="int8")
    out = forced_decode(m, tokens(n_tokens, seed=11), cache)
    blocks = [np.array(b) for c in cache for b in c.blocks()]
    return out, blocks, [dict(c.decoder.launch.run_info) for c in cache]


def test_the_emulated_lane_folds_the_combine_bit_identically(monkeypatch, emulated_decode_lane):
    """TQCache on the emulated decode lane, growing its buffers: the same logits and blocks with the combine in
    pass 1 as after it; every layer's report says which ran."""
    import mlx.core as mx

    from tqbridge.metal.lm.cache import TQCache

    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    monkeypatch.setattr(TQCache, "step", 8)
    try:
        want, want_blocks, plain = _decode_lane(("q8_0", "turbo3"), False, 20)
        got, got_blocks, folded = _decode_lane(("q8_0", "turbo3"), True, 20)
    finally:
        mx.set_default_device(prev)
    assert [i.get("fold_combine") for i in plain] == [False] * len(plain)
    assert [i.get("fold_combine") for i in folded] == [True] * len(folded)
    assert np.array_equal(got, want)
    assert len(got_blocks) == len(want_blocks) and all(np.array_equal(a, b) for a, b in zip(got_blocks, want_blocks))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", [("q8_0", "turbo3"), ("q8_0", "q4_0")])
def test_the_gpu_lane_folds_the_combine_bit_identically(kv, gpu_device, monkeypatch):
    """On CUDA, through buffer growth: the same logits and blocks, bit for bit, with the combine inside the folded
    pass 1 (one kernel a layer) as with the combine pass after it (two); the counters stay zero."""
    import mlx.core as mx

    from tqbridge.metal.codecs import gpu_backend
    from tqbridge.metal.lm.cache import TQCache

    if gpu_backend() != "cuda":
        pytest.skip(f"the GPU here runs {gpu_backend()}: the folded combine is a CUDA build (kernel int8-mma)")
    monkeypatch.setattr(TQCache, "step", 64)
    want, want_blocks, plain = _decode_lane(kv, False, 150)
    got, got_blocks, folded = _decode_lane(kv, True, 150)
    assert [i.get("fold_combine") for i in plain] == [False] * len(plain)
    assert [i.get("fold_combine") for i in folded] == [True] * len(folded), folded[0]
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(got_blocks, want_blocks))
    mx.clear_cache()


def test_fold_combine_refusal_says_why():
    from tqbridge.metal.attention.launch import fold_combine_refusal

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    kb = bridge.quantize("q8_0", np.zeros((1, 2, 64, 128), np.float32))
    vb = bridge.quantize("turbo3", np.zeros((1, 2, 64, 128), np.float32))
    plain = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64)
    sinks = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=64, sinks=np.zeros(8, np.float32))
    assert fold_combine_refusal(plain, "cuda") is None and fold_combine_refusal(plain, "cpu-emulator") is None
    assert "sinks" in fold_combine_refusal(sinks, "cuda")
    assert "Metal" in fold_combine_refusal(plain, "metal")
