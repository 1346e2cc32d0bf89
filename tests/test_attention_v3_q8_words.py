"""Kernel v3's whole-word reads of q8_0 K rows (``tqa_q8_pair``, ``TQBRIDGE_V3_Q8_WORDS``).

A q8_0 block is 34 bytes, so in a row of an even number of blocks (DK 64 / 128 / 256) every second block's
codes start 2 bytes off a 4-byte boundary; read as 16-bit halves they cost two loads per word. Two blocks
are 17 aligned words: v3 reads the even block's codes rotated by 2 (fragment slot j holds code (j + 2) % 32,
lane 3 taking codes 0, 1 from the word of the block's d) and rotates q's codes of that block alike. The
int32 sum of the products does not depend on the order of its terms, so the outputs must be bit-identical
to the half-word reads (v3 takes DV % 64 == 0, so its q8_0 rows always hold an even number of blocks where
DK = DV). Planted bugs (in a copy of the sources) show that the comparison sees the rotation and the lane-3
splice."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal import attention_kernel
from tqbridge.metal.attention import decode_attention, last_run
from test_attention_kernel import BACKENDS, _cache
from test_attention_v3 import _check_v3
from test_attention_v3_staging import _planted

SRC = "attention_kernel_split_v3.cpp"
HDR = "attention_kernel.h"


@pytest.fixture
def fresh():
    attention_kernel.clear_launch_caches()
    attention_kernel._plan_cached.cache_clear()
    yield
    attention_kernel._kernel_defs.cache_clear()
    attention_kernel.clear_launch_caches()
    attention_kernel._plan_cached.cache_clear()


def _case(d, seed, l_max=160, hkv=2):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 4 * hkv, d)).astype(np.float32)
    return q, _cache(rng, "q8_0", (1, hkv, l_max, d)), _cache(rng, "turbo3" if d % 128 == 0 else "q4_0",
                                                               (1, hkv, l_max, d))


def _run(backend, q, kb, vb, d, words, monkeypatch, length=150, splits=2):
    monkeypatch.setenv("TQBRIDGE_V3_Q8_WORDS", "1" if words else "0")
    attention_kernel.clear_launch_caches()
    got = decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3" if d % 128 == 0 else "q4_0",
                           length=length, backend=backend, q_precision="int8", splits=splits)
    assert last_run()["kernel"] == "v3"
    return np.asarray(got)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_whole_word_reads_are_bit_identical_to_half_word_reads(backend, d, monkeypatch, fresh):
    q, kb, vb = _case(d, seed=d)
    words = _run(backend, q, kb, vb, d, True, monkeypatch)
    halves = _run(backend, q, kb, vb, d, False, monkeypatch)
    assert np.array_equal(words, halves), f"DK {d}: whole-word q8_0 reads changed the output"


@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_word_reads_hold_the_oracle_bound(backend, monkeypatch, fresh):
    """Over several tiles and both splits, masks at the ends: the int8 oracle's bound."""
    monkeypatch.setenv("TQBRIDGE_V3_Q8_WORDS", "1")
    q, kb, vb = _case(128, seed=3, l_max=300)
    _check_v3(backend, q, kb, vb, k_format="q8_0", v_format="turbo3", length=291, splits=2)


def _differs_when_planted(tmp_path, monkeypatch, name, old, new):
    q, kb, vb = _case(128, seed=21)
    want = _run("cpu-emulator", q, kb, vb, 128, False, monkeypatch)
    _planted(tmp_path, monkeypatch, name, old, new)
    got = _run("cpu-emulator", q, kb, vb, 128, True, monkeypatch)
    assert not np.array_equal(got, want), "the planted bug did not change the output"
    with pytest.raises(AssertionError, match="bound"):
        monkeypatch.setenv("TQBRIDGE_V3_Q8_WORDS", "1")
        attention_kernel.clear_launch_caches()
        _check_v3("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=150, splits=2)


def test_q_codes_left_unrotated_are_caught(tmp_path, monkeypatch, fresh):
    # (in the quantization the default prologue runs: 8 lanes per block, test_attention_v3_prologue.py)
    _differs_when_planted(tmp_path, monkeypatch, SRC, "const int rot = (Q8W && (bi % NB) % 2 == 0) ? 2 : 0;\n        float v[4];",
                          "const int rot = 0;\n        float v[4];")


def test_lane_3_without_its_splice_is_caught(tmp_path, monkeypatch, fresh):
    _differs_when_planted(tmp_path, monkeypatch, HDR, "*hi = t == 3 ? ((h & 0xffffu) | (w0 & 0xffff0000u)) : h;",
                          "*hi = h;")
