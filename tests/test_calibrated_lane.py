"""Key-calibrated caches on the GPU decode lane: the in-place append stores (x - mu) / s per head and
channel before its rotation, and the fused attention takes q * s (issue 36 item 3), made by its pass 1 as
it loads q (the kernels of an uncalibrated step, one input more). On the CPU the lane runs with its
kernels on the emulator; the same kernel source runs on CUDA and Metal."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from tqbridge.metal import kv_append  # noqa: E402
from tqbridge.metal.lm.cache import TQCache, make_cache  # noqa: E402
from tqbridge.metal.attention.decoder import LayerDecoder  # noqa: E402
from tqbridge.bridge.blocks.kv_spec import parse_kv_spec  # noqa: E402
from tqbridge.metal.lm.report import cache_report  # noqa: E402
from tiny_models import forced_decode, tiny_llama, tokens  # noqa: E402
from helpers_kernels import quantized_cache  # noqa: E402
from test_attention_kernel import BACKENDS  # noqa: E402

# Float keys: calibration is exact in real arithmetic; in float32 the mean subtracted, the scale divided
# and the q.mu shift of every score round differently. tests/test_calibration.py measured up to ~4e-6 on
# the tiny models' logits and holds every path to 1e-4; a missing scale moves them by > 1e-2.
LOGIT_ATOL = 1e-4
# Quantized keys: the lane against the float cache within 25% (+0.01) of the ops path's error over the
# same cache (the verdict of tests/test_decode_step.py, whose comment gives the measurements).
QUANTIZED_LANE_ERROR_RATIO, QUANTIZED_LANE_ERROR_SLACK = 1.25, 1e-2



def _kernel_case(kf, vf, d, dtype, rot, seed=3):
    rng = np.random.default_rng(seed)
    B, H, S = 1, 2, 3
    k = rng.standard_normal((B, H, S, d)).astype(np.float32) * 3 + 1.5
    v = rng.standard_normal((B, H, S, d)).astype(np.float32)
    kcal = kv_append.calibration_rows(rng.standard_normal((H, d)), np.exp(rng.standard_normal((H, d)) * 0.5), H, d)
    app = kv_append.KVAppend(kf, vf, d, d, d, d, rot, rot, dtype, "cpu-emulator", calibrated=True)
    plain = kv_append.KVAppend(kf, vf, d, d, d, d, rot, rot, dtype, "cpu-emulator")
    src = k.astype(np.float16) if dtype == "float16" else k
    vsrc = v.astype(np.float16) if dtype == "float16" else v
    bufs = []
    for a, extra in ((app, (kcal,)), (plain, ())):
        kc = np.zeros((B, H, 4, a.k_row_bytes), np.uint8)
        vc = np.zeros((B, H, 4, a.v_row_bytes), np.uint8)
        a(src, vsrc, kc, vc, 1, np.zeros((kv_append.flag_slots(B * H * S),), np.uint32), *extra)
        bufs.append((kc, vc))
    return src.astype(np.float32), vsrc.astype(np.float32), kcal, bufs


@pytest.mark.parametrize("kf,vf,d,rot", [("q8_0", "q4_0", 64, 64), ("q5_1", "turbo3", 128, 128),
                                         ("turbo4", "q8_0", 128, 0), ("f32", "f16", 64, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_calibrated_append_writes_the_reference_bytes(kf, vf, d, rot, dtype):
    """Byte for byte: K blocks = the reference append of (x - mu) / s (float32), V blocks as without
    calibration; the rows before ``pos`` untouched."""
    k, v, kcal, ((kc, vc), (kc0, vc0)) = _kernel_case(kf, vf, d, dtype, rot)
    want_k = kv_append.reference_append(kf, kv_append.calibrate_rows(k, kcal), d, rot)
    want_v = kv_append.reference_append(vf, v, d, rot)
    np.testing.assert_array_equal(kc[:, :, 1:4], want_k)
    np.testing.assert_array_equal(vc[:, :, 1:4], want_v)
    np.testing.assert_array_equal(vc, vc0)
    assert not kc[:, :, 0].any()
    assert not np.array_equal(kc, kc0)   # the calibration changed what was stored


def test_calibrated_append_refuses_a_missing_buffer():
    app = kv_append.KVAppend("q8_0", "q4_0", 64, 64, 64, 64, 64, 64, "float32", "cpu-emulator", calibrated=True)
    z = np.zeros((1, 1, 1, 64), np.float32)
    with pytest.raises(kv_append.KernelError, match="kcal"):
        app(z, z, np.zeros((1, 1, 2, app.k_row_bytes), np.uint8), np.zeros((1, 1, 2, app.v_row_bytes), np.uint8),
            0, np.zeros((4,), np.uint32))


def _float_cache_logits(m, toks, prefill=5):
    from mlx_lm.models import cache as mc

    cache, out = mc.make_prompt_cache(m), []
    mx.eval(m(toks[:, :prefill], cache=cache))
    for i in range(prefill, toks.shape[1]):
        out.append(np.array(m(toks[:, i:i + 1], cache=cache)[0, -1].astype(mx.float32)))
    return np.stack(out)


def _forced(m, toks, mode, kv):
    k, v, cal = parse_kv_spec(kv)
    cache = make_cache(m, k, v, calibration=cal)
    out = forced_decode(m, toks, cache, mode)
    return out, cache


@pytest.mark.parametrize("kv", ["f32+mean+scale/f32", "f32+scale=0.75/f32", "f32+mean/f32"])
def test_float_keys_on_the_calibrated_lane_give_the_float_cache_logits(emulated_decode_lane, kv, cpu_device,
                                                                       monkeypatch):
    monkeypatch.setattr(TQCache, "step", 8)   # decode grows the buffers on the device several times
    m, toks = tiny_llama(head_dim=64), tokens(30, seed=9)
    exact = _float_cache_logits(m, toks)
    got, cache = _forced(m, toks, "auto", kv)
    rep = cache_report(cache)
    assert rep["paths"].get("decode:cpu-emulator", 0) >= 20, rep["paths"]
    assert all(layer["codecs"]["k_append"] == "kv-append:cpu-emulator" for layer in rep["layers"]), rep["layers"]
    assert all(c.decoder.prepared for c in cache)   # the decode steps took the prepared lane
    np.testing.assert_allclose(got, exact, atol=LOGIT_ATOL, rtol=0)
    assert np.array_equal(got.argmax(-1), exact.argmax(-1))


@pytest.mark.parametrize("bug", ["q not scaled", "keys not scaled"])
def test_the_float_verdict_catches_a_lane_without_its_scale(emulated_decode_lane, bug, cpu_device, monkeypatch):
    """Planted: the lane's attention takes q unscaled (no channel scales for its pass 1), or the append
    stores keys without dividing by s; the float-keys verdict above fails by far more than its tolerance."""
    monkeypatch.setattr(TQCache, "step", 8)
    if bug == "q not scaled":
        monkeypatch.setattr(LayerDecoder, "query_scale", lambda self, q: None)
    else:
        real = kv_append.calibration_rows
        monkeypatch.setattr(kv_append, "calibration_rows",
                            lambda mu, s, heads, k_dim: real(mu, None, heads, k_dim))
    m, toks = tiny_llama(head_dim=64), tokens(30, seed=9)
    exact = _float_cache_logits(m, toks)
    got, cache = _forced(m, toks, "auto", "f32+mean+scale/f32")
    assert cache_report(cache)["paths"].get("decode:cpu-emulator", 0) >= 20
    assert np.abs(got - exact).max() > 100 * LOGIT_ATOL


@pytest.mark.parametrize("kv", ["q8_0+mean+scale/q4_0", "q5_1+mean+scale/turbo3", "q4_0+mean+qscale/q8_0"])
def test_quantized_calibrated_lane_is_as_accurate_as_the_ops_path(emulated_decode_lane, kv, cpu_device, monkeypatch):
    """The lane (calibrated in-place append, scaled q, fused attention) against the float cache, within
    the ops path's error (dequantize with the calibration undone + MLX's SDPA) over the same cache.
    qscale: the first chunk's keys wait for their queries (ops path), later rows take the lane."""
    monkeypatch.setattr(TQCache, "step", 8)
    _judge_quantized_lane(kv, "cpu-emulator")


def _judge_quantized_lane(kv: str, backend: str) -> None:
    """The lane's logits against the float cache within the ops path's error; every layer appended
    through the kernel of ``backend`` and most decode steps took the lane."""
    m, toks = tiny_llama(head_dim=128), tokens(40, seed=9)
    exact = _float_cache_logits(m, toks)
    got, cache = _forced(m, toks, "auto", kv)
    ops, _ = _forced(m, toks, "sdpa", kv)
    rep = cache_report(cache)
    assert rep["paths"].get(f"decode:{backend}", 0) >= 30, rep["paths"]
    assert all(layer["codecs"]["k_append"] == f"kv-append:{backend}" for layer in rep["layers"])
    err_lane, err_ops = np.abs(got - exact).max(), np.abs(ops - exact).max()
    assert err_lane <= QUANTIZED_LANE_ERROR_RATIO * err_ops + QUANTIZED_LANE_ERROR_SLACK, (err_lane, err_ops)


def test_rotated_basis_calibration_says_why_it_is_off_the_lane(emulated_decode_lane, cpu_device):
    """Statistics taken after the rotation cannot be applied before it: the ops path appends, and the
    report says why."""
    m, toks = tiny_llama(head_dim=64), tokens(12, seed=9)
    _, cache = _forced(m, toks, "auto", "q8_0+mean+scale+rotated/q4_0")
    for layer in cache_report(cache)["layers"]:
        assert layer["codecs"]["k_append"] != "kv-append:cpu-emulator"
        assert "rotated basis" in layer["codecs"]["append_note"]
    assert all(not c.decoder.prepared for c in cache)


def _gpu_backend():
    from tqbridge.metal.codecs import gpu_backend as gpu

    return gpu() if mx.default_device() == mx.gpu else None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gpu_calibrated_append_writes_the_reference_bytes(dtype):
    backend = _gpu_backend()
    if backend is None:
        pytest.skip("no MLX GPU backend (Metal or CUDA) here")
    rng = np.random.default_rng(5)
    B, H, S, d = 1, 2, 3, 128
    k = mx.array(rng.standard_normal((B, H, S, d)).astype(np.float32) * 3 + 1.5).astype(getattr(mx, dtype))
    v = mx.array(rng.standard_normal((B, H, S, d)).astype(np.float32)).astype(getattr(mx, dtype))
    kcal = kv_append.calibration_rows(rng.standard_normal((H, d)), np.exp(rng.standard_normal((H, d)) * 0.5), H, d)
    app = kv_append.CalibratedAppend(kv_append.prepared("q5_1", "turbo3", d, d, d, d, 128, 128, dtype, backend,
                                                        calibrated=True), mx.array(kcal.reshape(-1)))
    kc = mx.zeros((B, H, 4, app.k_row_bytes), mx.uint8)
    vc = mx.zeros((B, H, 4, app.v_row_bytes), mx.uint8)
    mx.eval(kc, vc)
    flag = app(k, v, kc, vc, 1, mx.zeros((kv_append.flag_slots(B * H * S),), mx.uint32))
    mx.eval(flag)
    k32, v32 = np.array(k.astype(mx.float32)), np.array(v.astype(mx.float32))
    want_k = kv_append.reference_append("q5_1", kv_append.calibrate_rows(k32, kcal), d, 128)
    np.testing.assert_array_equal(np.array(kc)[:, :, 1:4], want_k)
    np.testing.assert_array_equal(np.array(vc)[:, :, 1:4], kv_append.reference_append("turbo3", v32, d, 128))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["q8_0+mean+scale/q4_0", "q5_1+mean+scale/turbo3"])
def test_gpu_calibrated_lane_is_as_accurate_as_the_ops_path(kv, monkeypatch):
    backend = _gpu_backend()
    if backend is None:
        pytest.skip("no MLX GPU backend (Metal or CUDA) here")
    monkeypatch.setattr(TQCache, "step", 8)
    _judge_quantized_lane(kv, backend)


def test_calibrated_lane_with_the_append_in_the_attention_call_is_bit_identical(emulated_decode_lane, cpu_device,
                                                                                monkeypatch):
    """The deferred append (the step's append and attention in one call, q scaled inside it: CUDA's
    default) against append-then-attend: the same logits and blocks, bit for bit."""
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.decode_options import DecodeOptions

    monkeypatch.setattr(TQCache, "step", 8)
    calls = []
    real = attention_kernel._EmulatedDecodeLaunch.with_append

    def spy(self, *a, **kw):
        calls.append(a[-1] if len(a) > 9 else kw.get("q_scale"))
        return real(self, *a, **kw)

    monkeypatch.setattr(attention_kernel._EmulatedDecodeLaunch, "with_append", spy)
    m, toks = tiny_llama(head_dim=128), tokens(30, seed=9)
    runs = {}
    for defer in (False, True):
        k, v, cal = parse_kv_spec("q5_1+mean+scale/q5_0")
        cache = make_cache(m, k, v, calibration=cal)
        for c in cache:
            c.decode_options = DecodeOptions(defer_append=defer)
        runs[defer] = (forced_decode(m, toks, cache), [np.array(b) for c in cache for b in c.blocks()])
        assert (len(calls) > 20) == defer
    assert all(s is not None for s in calls)   # every fused call scaled q
    assert np.array_equal(runs[True][0], runs[False][0])
    assert all(np.array_equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))


def test_calibrated_lane_with_the_append_folded_into_pass_1_is_bit_identical(emulated_decode_lane, cpu_device,
                                                                            monkeypatch, folded_steps):
    """The append folded into kernel int8-mma's pass 1 (``fold_append``) on a key-calibrated cache: the append's
    (x - mu) / s and q * s in the same call; the same logits and blocks as the append kernel then pass 1."""
    from tqbridge.metal.decode_options import DecodeOptions

    monkeypatch.setattr(TQCache, "step", 8)
    folds = folded_steps
    m, toks = tiny_llama(head_dim=128), tokens(24, seed=9)
    runs = {}
    for fold in (False, True):
        k, v, cal = parse_kv_spec("q5_1+mean+scale/q5_0")
        cache = make_cache(m, k, v, calibration=cal)
        for c in cache:
            c.decode_options = DecodeOptions(defer_append=True, fold_append=fold, q_precision="int8")
        runs[fold] = (forced_decode(m, toks, cache), [np.array(b) for c in cache for b in c.blocks()])
        assert (sum(folds) > 15) == fold, folds
    assert np.array_equal(runs[True][0], runs[False][0])
    assert all(np.array_equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))


def _registry_pairs():
    from tqbridge.bridge.blocks.registry import names

    fmts = names(lambda f: True)
    return sorted({(k, "q4_0") for k in fmts} | {("q8_0", v) for v in fmts})


@pytest.mark.parametrize("kf,vf", _registry_pairs())
def test_every_registry_format_takes_the_lane_or_says_why(emulated_decode_lane, kf, vf, cpu_device):
    """Every format the registry lists, as K (with q4_0 V) and as V (with q8_0 K): a few decode steps
    on the lane (its kernels on the emulator) append in place and decode through the prepared fused
    attention; where either does not, cache_report says why (issue 36: no pair off the lane silently)."""
    m, toks = tiny_llama(head_dim=64), tokens(9, seed=2)
    cache = make_cache(m, kf, vf)
    forced_decode(m, toks, cache)
    rep = cache_report(cache)
    for layer in rep["layers"]:
        on_lane = layer["codecs"].get("k_append") == "kv-append:cpu-emulator"
        assert on_lane or layer["codecs"].get("append_note"), layer
        assert layer["decode_kernel"] is not None or layer["decode_fallback"], layer
    assert rep["paths"].get("decode:cpu-emulator", 0) > 0 or any(l["decode_fallback"] for l in rep["layers"])


# ---------------------------------------------------------------- q * s folded into pass 1

# (K, V, head dim, G query heads per KV head, T query rows, window, sinks, rotation groups); the last two
# are K formats kernel int8-mma takes
FOLD_CASES = [("turbo4", "q4_0", 128, 2, 2, 20, False, None),
              ("q5_1", "q5_0", 128, 4, 2, None, False, None),
              ("q8_0", "turbo3", 64, 3, 2, 37, True, (64, 0))]


def _bits(a):
    return np.array(mx.view(a, mx.uint32 if a.dtype == mx.float32 else mx.uint16))


def _fold_mismatches(backend: str, kernel: str, dtype, cases=FOLD_CASES) -> list:
    """The cases (of ``cases``) whose output bits differ between pass 1 taking q and the channel scales
    (``q_scale``) and pass 1 taking q * s made beforehand by MLX ops (float32, cast to q's dtype: the lane's
    query before the fold)."""
    from tqbridge.metal.attention import check_problem
    from tqbridge.metal.attention.kernel import kernel_attention

    bad = []
    for i, (kf, vf, d, g, t, window, sinks, rot) in enumerate(cases):
        if kernel == "int8-mma" and kf.startswith("turbo"):   # K formats it refuses
            continue
        rng = np.random.default_rng(40 + i)
        hkv, n = 2, 70
        kb, vb = quantized_cache(rng, kf, (1, hkv, n + 6, d)), quantized_cache(rng, vf, (1, hkv, n + 6, d))
        s = np.exp(rng.standard_normal((hkv, d)) * 0.7).astype(np.float32)
        qs = mx.array(np.repeat(s, g, axis=0).reshape(1, hkv * g, 1, d))   # as TQCache.query_scale shapes it
        q = mx.array(rng.standard_normal((1, hkv * g, t, d)).astype(np.float32) * 2).astype(dtype)
        sk = rng.standard_normal(hkv * g).astype(np.float32) if sinks else None
        prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=n, window=window, sinks=sk, rotation=rot)
        kw = dict(backend=backend, kernel=kernel, q_precision="int8" if kernel == "int8-mma" else "exact")
        want = kernel_attention((q.astype(mx.float32) * qs).astype(dtype), kb, vb, prob, sk, **kw)
        got = kernel_attention(q, kb, vb, prob, sk, q_scale=qs, **kw)
        assert got.dtype == dtype
        if not np.array_equal(_bits(got), _bits(want)):
            bad.append((kf, vf, d, g, t))
    return bad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", ["lanes", "tiles", "int8-mma"])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32], ids=["f16", "bf16", "f32"])
def test_q_scale_folded_into_pass_1_gives_the_bits_of_the_scaled_q(backend, kernel, dtype):
    """Pass 1 multiplying q by the key scales as it loads q (in float32, rounded to q's dtype) gives the
    output bits of the same kernel over q * s made by MLX ops: every pass-1 kernel, f16 / bf16 / f32 q, GQA
    groups of 2 to 4 heads, 2 query rows, a window, sinks, turbo K and llama.cpp's rotation."""
    assert _fold_mismatches(backend, kernel, dtype) == []


@pytest.fixture
def planted_kernels(tmp_path, monkeypatch):
    """Swap one line of attention_kernel.h in a copy of the kernel sources; plans, launches and kernel
    definitions are made anew before and after."""
    import shutil

    from tqbridge.metal.attention import build as attention_build
    from tqbridge.metal.attention import kernel as attention_kernel

    def plant(old: str, new: str) -> None:
        src = (attention_build.KERNEL_DIR / "attention_kernel.h").read_text()
        assert src.count(old) == 1, "attention_kernel.h changed: the text this test plants its bug in is gone"
        for f in attention_build.KERNEL_DIR.iterdir():
            shutil.copy(f, tmp_path / f.name)
        (tmp_path / "attention_kernel.h").write_text(src.replace(old, new))
        monkeypatch.setattr(attention_build, "KERNEL_DIR", tmp_path)
        attention_build.kernel_defs.cache_clear()
        attention_kernel.clear_launch_caches()
    yield plant
    attention_build.kernel_defs.cache_clear()
    attention_kernel.clear_launch_caches()


FOLD = "TQA_QLOAD(TQA_QSTORE(tq_mul(TQA_QLOAD(x), qsc[(hq) * TQA_D + (d)])))"


@pytest.mark.parametrize("bug,new,dtype", [
    ("q * s not rounded to q's dtype", "tq_mul(TQA_QLOAD(x), qsc[(hq) * TQA_D + (d)])", mx.bfloat16),
    ("q * s not rounded to q's dtype", "tq_mul(TQA_QLOAD(x), qsc[(hq) * TQA_D + (d)])", mx.float16),
    ("the KV head's scales", "TQA_QLOAD(TQA_QSTORE(tq_mul(TQA_QLOAD(x), qsc[(h) * TQA_D + (d)])))", mx.float32)])
def test_the_fold_check_catches_a_planted_fold(planted_kernels, bug, new, dtype):
    """Planted in pass 1's q load: the product kept in float32 (not rounded to q's dtype), or the scales of
    row h (the KV head) for query head hq; the bit check above fails."""
    planted_kernels(FOLD, new)
    assert _fold_mismatches("cpu-emulator", "lanes", dtype, FOLD_CASES[1:2]), bug


def test_the_lane_with_q_scale_folded_gives_the_logits_of_the_scaled_query(emulated_decode_lane, cpu_device,
                                                                          monkeypatch):
    """A float16 model's calibrated lane (append fused into the attention call, CUDA's default) with q * s
    made by its pass 1 against the same lane given q * s made by MLX ops (the lane before the fold): the
    same logits, bit for bit; no MLX op scaled q on the lane. (bfloat16 rows: the emulated append takes
    none, numpy has no bfloat16; the kernel check above covers bfloat16 q.)"""
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.attention import decoder

    monkeypatch.setattr(TQCache, "step", 8)
    m, toks = tiny_llama(head_dim=128), tokens(16, seed=9)
    m.set_dtype(mx.float16)
    scaled_by_ops = []
    real_scaled = decoder.scaled_query

    def counted(q, s):
        scaled_by_ops.append(1)
        return real_scaled(q, s)

    monkeypatch.setattr(decoder, "scaled_query", counted)
    folded, cache = _forced(m, toks, "auto", "q5_1+mean+scale/q5_0")
    assert cache_report(cache)["paths"].get("decode:cpu-emulator", 0) >= 10
    assert not scaled_by_ops

    real = attention_kernel._EmulatedDecodeLaunch.__call__

    def unfolded(self, q, kb, vb, length, after=None, sinks=None, q_scale=None):
        if q_scale is not None:
            q = (q.astype(mx.float32) * q_scale).astype(q.dtype)
        return real(self, q, kb, vb, length, after=after, sinks=sinks)

    monkeypatch.setattr(attention_kernel._EmulatedDecodeLaunch, "__call__", unfolded)
    want, _ = _forced(m, toks, "auto", "q5_1+mean+scale/q5_0")
    assert np.array_equal(folded, want)


def test_the_self_check_attends_with_the_scaled_pass_1(monkeypatch):
    """A calibrated lane's self-check runs the attention with the key scales (pass 1 multiplying q by them)
    against the reference over q * s; planted: a launch that drops the scales fails it."""
    from tqbridge.metal import selfcheck
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.decode_options import DEFAULT_OPTIONS

    args = ("q5_1", "q5_0", 128, 128, 128, 128, 128, 128, "float16", "cpu-emulator",
            DEFAULT_OPTIONS.resolve("cpu-emulator"))
    assert selfcheck._run(*args, calibrated=True) is None
    real = attention_kernel._EmulatedDecodeLaunch.__call__

    def unscaled(self, q, kb, vb, length, after=None, sinks=None, q_scale=None):
        return real(self, q, kb, vb, length, after=after, sinks=sinks)

    monkeypatch.setattr(attention_kernel._EmulatedDecodeLaunch, "__call__", unscaled)
    assert "differs from the reference" in (selfcheck._run(*args, calibrated=True) or "")
