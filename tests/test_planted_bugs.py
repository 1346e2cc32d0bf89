"""The planted-bug suite: mutants of the MLX side that a real port could have, and which parity
level catches each (docs/levels.md, "Planted bugs"). Each test plants one bug with monkeypatch, runs
the level that should catch it, and asserts the level fails; the clean build passes the same level.

Mutants planted elsewhere (same idea, same table): q kept in f16 and a flipped q4_0 nibble
(tests/test_parity_verdicts.py), a decode step that skips the newest key (ibid., logits level's
decode steps), the iq4_nl search quantizer in the cache (tests/test_llama_state.py, cache level).
A wrong window start or length in the GPU decode lane is planted here (the lane level, which runs
the lane's code on a real model with its kernels on the CPU emulator) and in tests/test_decode_step.py
(the lane against the ops path on tiny models).
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")

from tqbridge.parity.harness.level_blocks import run_blocks_level  # noqa: E402


def _blocks(formats):
    return run_blocks_level(formats, kernel_backends=[])      # numpy and MLX paths against ggml's C


def _attention(pairs=("q8_0/q4_0", "q4_0/q8_0")):
    from tqbridge.parity.harness.level_attention import run_attention_level

    return run_attention_level(list(pairs))


@pytest.fixture(scope="module")
def ggml():
    from tqbridge.bridge.llama import ggml_c

    if not ggml_c.available():   # decided before anything runs: no llama-cpp-python here
        pytest.skip("ggml's C library is not loadable (llama-cpp-python is not installed)")


def test_clean_build_passes_the_fast_levels(ggml):
    assert _blocks(["q8_0", "q4_0", "q5_1", "iq4_nl"])["passed"]
    assert _attention()["passed"]


def test_round_half_to_even_in_one_format_is_caught_by_blocks(ggml, monkeypatch):
    # C's roundf rounds half away from zero; MLX's round is half-to-even
    from tqbridge.bridge.blocks import mlx_ggml

    monkeypatch.setattr(mlx_ggml, "_roundf", mx.round)
    rep = _blocks(["q8_0"])
    assert not rep["passed"] and rep["formats"][0]["equal"] == {"numpy": True, "mlx": False}


def test_bf16_stored_scales_are_caught_by_blocks(ggml, monkeypatch):
    from tqbridge.bridge.blocks import mlx_ggml

    real = mlx_ggml._f16_bytes

    def through_bf16(v, **kw):
        return real(v.astype(mx.bfloat16).astype(mx.float32), **kw)

    monkeypatch.setattr(mlx_ggml, "_f16_bytes", through_bf16)
    rep = _blocks(["q8_0", "q4_1"])
    assert not any(f["equal"]["mlx"] for f in rep["formats"])


def test_missing_gqa_index_is_caught_by_attention(ggml, monkeypatch):
    # the kernel serves query head h from the wrong KV head: here every head h is scored as head
    # h + 1 would be (a rolled head index), so heads at a group boundary read the next group's K/V
    from tqbridge.metal import attention

    real = attention.decode_attention

    def wrong_group(q, *a, **kw):
        out = real(np.roll(q, -1, axis=1), *a, **kw)
        return np.roll(np.asarray(out), 1, axis=1)

    monkeypatch.setattr(attention, "decode_attention", wrong_group)
    assert not _attention()["passed"]


# ------------------------------------------------------------------ kernel paths the format pairs do not reach

def _options():
    """The attention level's option cases only (softcap, window, llama rotation, turbo): ~0.1 s."""
    from tqbridge.parity.harness.level_attention import run_attention_level

    rep = run_attention_level([])
    return rep, {c["problem"]: c for c in rep["cases"]}


def test_clean_build_passes_the_option_cases(ggml):
    rep, by = _options()
    assert rep["passed"] and set(by) == {"option:softcap", "option:window", "option:llama-rotation", "option:turbo"}


def test_softcap_skipped_is_caught_by_attention(ggml, monkeypatch):
    # the dispatcher drops the softcap on its way to the kernel
    from tqbridge.metal import attention

    real = attention.decode_attention

    def no_softcap(*a, softcap=None, **kw):
        return real(*a, **kw)

    monkeypatch.setattr(attention, "decode_attention", no_softcap)
    rep, by = _options()
    assert not rep["passed"] and not by["option:softcap"]["passed"]
    assert by["option:window"]["passed"] and by["option:turbo"]["passed"]


@pytest.mark.parametrize("off", [1, -1])
def test_sliding_window_off_by_one_is_caught_by_attention(ggml, monkeypatch, off):
    from tqbridge.metal import attention

    real = attention.decode_attention

    def shifted(*a, window=None, **kw):
        return real(*a, window=window + off if window else window, **kw)

    monkeypatch.setattr(attention, "decode_attention", shifted)
    rep, by = _options()
    assert not rep["passed"] and not by["option:window"]["passed"]
    assert by["option:softcap"]["passed"]


def _clear_kernel_caches():
    """Forget every built kernel and prepared call, so a source edit (or its undo) takes effect."""
    import functools

    from tqbridge.metal import attention, kernel
    from tqbridge.metal.attention import build as attention_build
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.attention import launch as attention_launch
    from tqbridge.metal.attention import plan as attention_plan

    for mod in (attention_kernel, attention_build, attention_launch, attention_plan, kernel, attention):
        for obj in vars(mod).values():
            if isinstance(obj, functools._lru_cache_wrapper):
                obj.cache_clear()
    attention.clear_call_caches()


def test_v_not_rotated_back_in_the_kernel_is_caught_by_attention(ggml, monkeypatch):
    # kernel bug: the combine pass skips rotating the output back (turbo V, and llama.cpp's rotated V)
    import pathlib

    # both ways the combine rotates back: SIMD group 0 in registers, or the whole threadgroup
    file, edits = "attention_kernel_combine.cpp", (("if (vrot && SIMD_ROT)", "if (0 && SIMD_ROT)"),
                                                   ("} else if (vrot) {", "} else if (0) {"))
    real_read = pathlib.Path.read_text

    def edited(self, *a, **kw):
        text = real_read(self, *a, **kw)
        if self.name == file:
            for old, new in edits:
                assert old in text, f"the planted bug's anchor {old!r} is gone from {file}: update this test"
                text = text.replace(old, new)
        return text

    with monkeypatch.context() as m:
        m.setattr(pathlib.Path, "read_text", edited)
        _clear_kernel_caches()
        try:
            rep, by = _options()
        finally:
            m.undo()
            _clear_kernel_caches()
    for name in ("option:turbo", "option:llama-rotation"):
        assert not by[name]["passed"]
        assert by[name]["ours"]["reference"]["within_bound"]              # the MLX-ops path is unaffected
        assert not by[name]["ours"]["cpu-emulator"]["within_bound"]
    assert by["option:softcap"]["passed"] and by["option:window"]["passed"]
    assert _options()[0]["passed"]                                          # the real kernel is back


def test_iq4_nl_search_quantizer_in_the_cache_is_caught_by_teacher(monkeypatch):
    # planted (as in tests/test_llama_state.py for the cache level): TQCache quantizes iq4_nl with the
    # scale search instead of quantize_row_iq4_nl_ref, which llama.cpp's cache uses
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from tqbridge.bridge import mlx_quantize
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.metal.lm import cache as tqc
    from tqbridge.parity.harness.level_logits import parity_text
    from tqbridge.parity.harness.level_teacher import run_teacher
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime

    try:
        path = str(cached_f32_gguf(model_path("smollm2")))
    except ModelUnavailable as e:
        pytest.skip(str(e))
    toks = LlamaCppRuntime(path).tokenize(parity_text()[0])[:32]
    real = tqc.quantizer

    def search_quantizer(fmt):
        if tqc.get_format(fmt).name == "iq4_nl":
            return (lambda x: mlx_quantize(fmt, x)), "mlx-ops (search: planted)"
        return real(fmt)

    windows = [0] * 30    # SmolLM2 has no sliding window
    assert run_teacher(path, toks, ["f16/iq4_nl"], decode=1, windows=windows, attention=False)["passed"]
    monkeypatch.setattr(tqc, "quantizer", search_quantizer)
    rep = run_teacher(path, toks, ["f16/iq4_nl"], decode=1, windows=windows, attention=False)
    assert not rep["passed"]
    assert all(not L["bytes"]["v"]["ours_is_reference"] for L in rep["kv"][0]["layers"])


# ------------------------------------------------------------------ the GPU decode lane, on the CPU emulator

@pytest.fixture(scope="module")
def lane_model():
    """SmolLM2 (F32 copy), the lane level's tokens and its mlx-lm model, shared by the lane tests."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.metal import backends
    from tqbridge.parity.harness.level_lane import LANE_TOKENS
    from tqbridge.parity.harness.level_logits import parity_text
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime

    if "cpu-emulator" not in backends():
        pytest.skip("no C++ compiler for the CPU emulator")
    try:
        path = str(cached_f32_gguf(model_path("smollm2")))
    except ModelUnavailable as e:
        pytest.skip(str(e))
    toks = LlamaCppRuntime(path).tokenize(parity_text()[0])[:LANE_TOKENS]
    return path, toks, load_gguf_model(path)[0]


def _lane(lane_model):
    from tqbridge.parity.harness.level_lane import run_lane

    path, toks, model = lane_model
    rep = run_lane(path, toks, "q8_0/q4_0", model=model)
    return rep, {r["layer"]: r for r in rep["layers"]}


def test_lane_windows_follow_the_model():
    from tqbridge.parity.harness.level_lane import lane_windows

    gemma = [512] * 5 + [None]                                   # Gemma 3's pattern: 5 local, 1 global
    assert lane_windows(gemma * 3, 16) == ([16] * 5 + [None]) * 3
    assert lane_windows([None] * 5, 16) == [16, None, 16, None, 16]   # no window in the model: even layers


def test_clean_build_passes_the_lane_level(lane_model):
    from tqbridge.parity.harness.level_lane import LANE_DECODE, summary_lines

    rep, by = _lane(lane_model)
    assert rep["passed"], summary_lines(rep)
    assert "emulated GPU lane" in rep["path"] and rep["appends"] == ["kv-append:cpu-emulator/kv-append:cpu-emulator"]
    assert rep["paths"]["decode:cpu-emulator"] == 30 * LANE_DECODE        # every decode step of every layer
    assert rep["windows"] == {"16": list(range(0, 30, 2)), "none": list(range(1, 30, 2))}
    assert all(by[i]["slides"] == 3 for i in range(0, 30, 2)) and all(r["relocations"] >= 3 for r in by.values())


@pytest.mark.parametrize("bug", ["window start", "kept length", "attention window"])
def test_wrong_window_start_or_length_in_the_lane_is_caught_by_lane(lane_model, monkeypatch, bug):
    # the lane's own bookkeeping, which no other level runs on a CPU: its device relocation at a window
    # slide keeps the window from one row early ("window start": every stored position shifted by one)
    # or one row short ("kept length": the newest kept row not copied), or its prepared attention gets
    # the window one position long
    from tqbridge.metal import kv_append
    from tqbridge.metal.attention import kernel as attention_kernel

    planted = []
    if bug == "attention window":
        real_prepare = attention_kernel.prepare_decode

        def prepare(*a, window=None, **kw):
            planted.append(window)
            return real_prepare(*a, window=window + 1 if window else window, **kw)

        monkeypatch.setattr(attention_kernel, "prepare_decode", prepare)
    else:
        real_relocate = kv_append.relocate

        def relocate(kc, vc, row0, n, new_cap, after, backend):
            if row0 > 0 and not isinstance(kc, np.ndarray):   # a slide, on the MLX buffers (the emulator
                planted.append(row0)                          # then calls itself on numpy copies)
                row0, n = (row0 - 1, n) if bug == "window start" else (row0, n - 1)
            return real_relocate(kc, vc, row0, n, new_cap, after, backend)

        monkeypatch.setattr(kv_append, "relocate", relocate)
    rep, by = _lane(lane_model)
    assert planted and not rep["passed"]
    first = by[0]["failure"]                                  # layer 0 has a window; layer 1 has none
    if bug == "attention window":
        assert first["claim"] == "attention" and first["step"] == 1
    else:   # at the first slide (decode step 4: position 19, 4 rows past the window)
        assert first["claim"] == "bytes" and first["step"] == 4 and first["start"] == 4
