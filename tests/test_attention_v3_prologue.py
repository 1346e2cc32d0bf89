"""Kernel v3's prologue (``TQBRIDGE_V3_PROLOGUE``, ``TQA_PRO`` in the source): how q becomes int8 codes
and when the first tiles' copies are issued; and its epilogue's merge rows (``TQBRIDGE_V3_MERGE_PAD``).

0: one thread per 32-value block of q (every thread of a warp reads the same bank: 32-way conflicts),
   the first tiles' copies after q's quantization;
1: eight lanes per block, 4 values and one word of codes each, the block's max |x| and code sum by
   three butterfly steps (both order-free, so the bits are those of 0);
2: as 1, with the copies of the ring's first NS - 1 tiles issued before q is loaded, q's rows kept in
   the ring's last buffer (refilled only after the key loop's first barrier).

All three must give bit-identical outputs for every case here (Q8W's rotated slots, q8_1's code sums
for K with an offset, llama.cpp's rotation of q, several query rows, windows, one and two chunks, odd
lengths, tiles short of a split). Planted bugs (in a copy of the sources) show the comparisons and the
oracle see each part: q's rows in the buffer the first tile is copied into, a butterfly over 4 lanes,
a code sum over half the block (the dropped slot rotation: test_attention_v3_q8_words.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal import attention_kernel
from tqbridge.metal.attention import AttentionError, decode_attention, last_run
from test_attention_kernel import BACKENDS, _cache
from test_attention_v3 import _check_v3
from test_attention_v3_q8_words import fresh  # noqa: F401 - the fixture: launch, plan and source caches cleared
from test_attention_v3_staging import _planted

SRC = "attention_kernel_split_v3.cpp"


# (id, K format, V format, head dim, query rows T, call options, environment)
CASES = [
    ("q8_0-turbo3-words", "q8_0", "turbo3", 128, 1, {}, {"TQBRIDGE_V3_Q8_WORDS": "1"}),
    ("q8_0-turbo3-halves", "q8_0", "turbo3", 128, 1, {}, {"TQBRIDGE_V3_Q8_WORDS": "0"}),
    ("q4_1-q8_0-d64-rows2", "q4_1", "q8_0", 64, 2, {}, {}),
    ("q5_1-q4_0-d256-window", "q5_1", "q4_0", 256, 1, {"window": 70}, {}),
    ("q8_0-q4_0-rotation-chunks1", "q8_0", "q4_0", 128, 1, {"rotation": (128, 64)}, {"TQBRIDGE_V3_CHUNKS": "1"}),
    ("iq4_nl-turbo4-rows2-sinks", "iq4_nl", "turbo4", 128, 2, {"sinks": "yes"}, {}),
]


def _case(kf, vf, d, rows, seed, l_max=203, hkv=2):
    rng = np.random.default_rng(seed)
    shape = (1, 4 * hkv, rows, d) if rows > 1 else (1, 4 * hkv, d)
    q = (rng.standard_normal(shape) * 3).astype(np.float32)
    return q, _cache(rng, kf, (1, hkv, l_max, d)), _cache(rng, vf, (1, hkv, l_max, d))


def _run(backend, prologue, monkeypatch, q, kb, vb, kf, vf, env=(), length=181, splits=2, **kw):
    for k, v in dict(env).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TQBRIDGE_V3_PROLOGUE", str(prologue))
    attention_kernel.clear_launch_caches()
    got = decode_attention(q, kb, vb, k_format=kf, v_format=vf, length=length, backend=backend,
                           q_precision="int8", splits=splits, **kw)
    run = last_run()
    assert run["kernel"] == "v3" and run["prologue"] == prologue
    return np.asarray(got)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_prologues_are_bit_identical(backend, case, monkeypatch, fresh):
    name, kf, vf, d, rows, opts, env = case
    q, kb, vb = _case(kf, vf, d, rows, seed=len(name))
    if opts.get("sinks"):   # one logit per query head
        opts = dict(opts, sinks=np.linspace(-1.0, 2.0, q.shape[1]).astype(np.float32))
    outs = {p: _run(backend, p, monkeypatch, q, kb, vb, kf, vf, env, **opts) for p in attention_kernel.V3_PROLOGUES}
    for p in (1, 2):
        assert np.array_equal(outs[p], outs[0]), f"{name}: prologue {p} differs from prologue 0"


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_prologue_holds_the_oracle_bound(backend, monkeypatch, fresh):
    """The default (2) over many tiles and splits, the tiles short of a split's end, a partial last tile."""
    monkeypatch.delenv("TQBRIDGE_V3_PROLOGUE", raising=False)
    q, kb, vb = _case("q8_0", "turbo3", 128, 1, seed=4, l_max=400)
    _check_v3(backend, q, kb, vb, k_format="q8_0", v_format="turbo3", length=389, splits=3)
    assert last_run()["prologue"] == 2


def test_a_bad_prologue_is_refused(monkeypatch, fresh):
    monkeypatch.setenv("TQBRIDGE_V3_PROLOGUE", "3")
    q, kb, vb = _case("q8_0", "turbo3", 128, 1, seed=1)
    with pytest.raises(AttentionError, match="TQBRIDGE_V3_PROLOGUE must be one of 0, 1, 2, got '3'"):
        decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3", length=10, backend="cpu-emulator",
                         q_precision="int8")


def test_the_staging_area_holds_q_after_the_ring_head():
    """Prologue 2 keeps q's rows (8 x DK floats) after the first NS - 1 tiles: the plan's staging area must
    reach that far for every shape v3 builds (the kernel's static_assert says the same at build time)."""
    from tqbridge.metal.attention import check_problem

    rng = np.random.default_rng(0)
    for d in (64, 128, 256):
        for kf, vf in (("q8_0", "turbo3" if d % 128 == 0 else "q4_0"), ("q4_0", "f16")):
            q, kb, vb = _case(kf, vf, d, 1, seed=int(rng.integers(1 << 16)), l_max=64)
            prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=64)
            krb, vrb = attention_kernel._row_bytes(prob, False)
            for tile in (16, 32, 64, 128):
                for stages in (2, 3):
                    tb = -(-tile * krb // 4) * 4 + -(-tile * vrb // 4) * 4
                    assert attention_kernel._v3_stage_bytes(prob, 2, tile, stages) >= (stages - 1) * tb + 32 * d


PLANTED = [
    # q's rows where the first tile is being copied: the early copies and q's load overwrite each other
    ("q-in-tile-0", "q8_0", "turbo3",
     "TQ_SHARED float* qf = (TQ_SHARED float*)(stage + (EARLY ? (TQA_NS - 1) * HALF : 0));",
     "TQ_SHARED float* qf = (TQ_SHARED float*)(stage);"),
    # the block's max |x| over 4 lanes (16 values) instead of 8
    ("amax-4-lanes", "q8_0", "turbo3",
     "        for (uint off = 1u; off < 8u; off <<= 1) {\n            const float o = tq_simd_shuffle_xor(amax, off);",
     "        for (uint off = 1u; off < 4u; off <<= 1) {\n            const float o = tq_simd_shuffle_xor(amax, off);"),
    # q8_1's code sum over 4 lanes: q4_1 K's offset term takes half the block's sum
    ("sum-4-lanes", "q4_1", "q8_0",
     "for (uint off = 1u; off < 8u; off <<= 1) sum += tq_simd_shuffle_xor(sum, off);",
     "for (uint off = 1u; off < 4u; off <<= 1) sum += tq_simd_shuffle_xor(sum, off);"),
]


@pytest.mark.parametrize("plant", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_prologue_bugs_are_caught(plant, tmp_path, monkeypatch, fresh):
    name, kf, vf, old, new = plant
    q, kb, vb = _case(kf, vf, 128, 1, seed=9)
    monkeypatch.setenv("TQBRIDGE_V3_Q8_WORDS", "1")
    want = _run("cpu-emulator", 0, monkeypatch, q, kb, vb, kf, vf)
    _planted(tmp_path, monkeypatch, SRC, old, new)
    got = _run("cpu-emulator", 2, monkeypatch, q, kb, vb, kf, vf)
    assert not np.array_equal(got, want), f"{name}: the planted bug did not change the output"
    with pytest.raises(AssertionError, match="bound"):
        _check_v3("cpu-emulator", q, kb, vb, k_format=kf, v_format=vf, length=181, splits=2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_merge_rows_padded_or_not_are_bit_identical(backend, case, monkeypatch, fresh):
    """The SIMD groups' partial rows at a stride of DV + 1 (TQBRIDGE_V3_MERGE_PAD=1, the default) or DV: a
    layout of threadgroup memory only, so the same bits (4 SIMD groups: every group's row is merged)."""
    name, kf, vf, d, rows, opts, env = case
    q, kb, vb = _case(kf, vf, d, rows, seed=len(name) + 1)
    outs = {}
    for pad in ("0", "1"):
        monkeypatch.setenv("TQBRIDGE_V3_MERGE_PAD", pad)
        outs[pad] = _run(backend, 2, monkeypatch, q, kb, vb, kf, vf, dict(env, TQBRIDGE_V3_CHUNKS="1"), **opts)
        assert last_run()["merge_pad"] == (pad == "1")
    assert np.array_equal(outs["1"], outs["0"]), f"{name}: padded merge rows changed the output"


def test_merge_rows_read_at_the_wrong_stride_are_caught(tmp_path, monkeypatch, fresh):
    q, kb, vb = _case("q8_0", "turbo3", 128, 1, seed=12)
    want = _run("cpu-emulator", 2, monkeypatch, q, kb, vb, "q8_0", "turbo3")
    _planted(tmp_path, monkeypatch, SRC, "a += wo[(w * 8 + r) * WOS + e] * f;", "a += wo[(w * 8 + r) * TQA_DV + e] * f;")
    got = _run("cpu-emulator", 2, monkeypatch, q, kb, vb, "q8_0", "turbo3")
    assert not np.array_equal(got, want), "the planted stride did not change the output"
    with pytest.raises(AssertionError, match="bound|isfinite"):   # (the emulator poisons threadgroup memory)
        _check_v3("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=181, splits=2)
