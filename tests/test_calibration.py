"""Per-channel key calibration of TQCache: spelling, exactness, every attention path, save/load, bytes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from mlx_lm.models import cache as mlx_cache  # noqa: E402

from tqbridge.metal import attention as attention_api
from tqbridge.bridge import FormatError, quantize  # noqa: E402
from tqbridge.metal.lm import routing  # noqa: E402
from tqbridge.metal.lm.cache import TQCache, hadamard_rotate, make_cache  # noqa: E402
from tqbridge.bridge.blocks.kv_spec import parse_kv_spec  # noqa: E402
from tqbridge.metal.lm.report import cache_report  # noqa: E402
from tqbridge.metal.lm.calibration import CalibrationError, KeyCalibration, fit  # noqa: E402
from tqbridge.metal.lm.routing import route_attention  # noqa: E402
from tiny_models import cpu_device, tiny_gemma3, tiny_llama, tokens  # noqa: E402,F401

CLI = [sys.executable, "-c", "import sys; from tqbridge.tools.cli import main; sys.exit(main())"]
# Calibration is exact in real arithmetic; in float32 the mean subtracted and added back, the scale
# divided and multiplied, and the q.mu shift of every score round differently: logits of the tiny
# models (|logit| < 5) move by up to ~4e-6 (measured); 1e-4 leaves a wide margin yet catches any
# mistake in the algebra (a wrong scale or a missing mean moves them by > 1e-2).
LOGIT_ATOL = 1e-4

TOOLS = ["mean", "scale", "mean+scale", "mean+scale+rotated", "scale=0.25", "mean+qscale"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama()


def _run(model, cache, toks, prefill, mode="sdpa"):
    """Logits: ``prefill`` tokens in one chunk, then one token per step (decode steps)."""
    with route_attention(mode):
        outs = [model(toks[:, :prefill], cache=cache)]
        outs += [model(toks[:, s:s + 1], cache=cache) for s in range(prefill, toks.shape[1])]
    out = mx.concatenate(outs, axis=1)
    mx.eval(out)
    return np.array(out)


# ------------------------------------------------------------------ spelling

def test_spelling_and_one_line_errors():
    k, v, cal = parse_kv_spec("q5_1+mean+scale/q4_0")
    assert (k, v, cal) == ("q5_1", "q4_0", KeyCalibration(mean=True, scale=True))
    assert cal.spec == "mean+scale"
    assert parse_kv_spec("Q5_1 + Scale=0.75 + rotated / q4_0")[2].spec == "scale=0.75+rotated"
    assert parse_kv_spec("q5_1+mean,qscale/q4_0")[2] == KeyCalibration(True, True, 0.5, "original", True)
    assert not parse_kv_spec("q8_0/q4_0")[2]
    for bad, why in [("q5_1+foo/q4_0", "unknown key calibration"), ("q5_1+/q4_0", "nothing after"),
                     ("q5_1/q4_0+mean", "keys only"), ("q5_1+scale=2/q4_0", "exponent"),
                     ("q5_1+scale=x/q4_0", "exponent"), ("q5_1+scale+qscale/q4_0", "one of"),
                     ("q5_1+rotated/q4_0", "names no tool"), ("zz+mean/q4_0", "zz")]:
        with pytest.raises(FormatError, match=why) as e:
            parse_kv_spec(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(CalibrationError):
        TQCache("q8_0", "q8_0", calibration="median")
    with pytest.raises(ValueError, match="two different"):
        make_cache(tiny_llama(), "q8_0+mean", "q8_0", calibration="scale")


def test_cli_refuses_bad_calibration_in_one_line(tmp_path):
    for cmd in (["quality", str(tmp_path / "m.gguf"), "--kv", "q5_1+bogus/q4_0"],
                ["generate", str(tmp_path / "m.gguf"), "--kv", "q5_1+bogus/q4_0", "--prompt", "x"]):
        r = subprocess.run(CLI + cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "bogus" in r.stderr


# ------------------------------------------------------------------ the transform

def test_fit_statistics():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 3, 50, 8)).astype(np.float32) * np.arange(1, 9) + np.arange(8) * 10
    mu, s = fit(mx.array(k), KeyCalibration(mean=True, scale=True))
    np.testing.assert_allclose(np.array(mu), k.mean(axis=(0, 2)), rtol=1e-5, atol=1e-4)
    rms = np.sqrt(((k - k.mean(axis=(0, 2), keepdims=True)) ** 2).mean(axis=(0, 2)))
    np.testing.assert_allclose(np.array(s), np.sqrt(rms / rms.mean(-1, keepdims=True)), rtol=1e-4)
    q = rng.standard_normal((2, 6, 50, 8)).astype(np.float32) * np.arange(8, 0, -1)
    _, sq = fit(mx.array(k), KeyCalibration(scale=True, queries=True), mx.array(q))
    rk = np.sqrt((k ** 2).mean(axis=(0, 2)))
    rq = np.sqrt((q.reshape(2, 3, 2, 50, 8) ** 2).mean(axis=(0, 2, 3)))
    r = rk / rq
    np.testing.assert_allclose(np.array(sq), np.sqrt(r / r.mean(-1, keepdims=True)), rtol=1e-4)


@pytest.mark.parametrize("kf,cal", [("q8_0", "mean+scale"), ("q5_1", "mean+scale+rotated"),
                                    ("turbo3@g64", "mean")])
def test_blocks_hold_the_calibrated_rows_byte_for_byte(kf, cal):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 2, 40, 64)) * rng.uniform(0.1, 4, 64) + rng.uniform(-5, 5, 64)).astype(np.float32)
    c = TQCache(kf, "q4_0", calibration=cal)
    c.update_and_fetch(mx.array(x[:, :, :30]), mx.array(x[:, :, :30]))
    c.update_and_fetch(mx.array(x[:, :, 30:]), mx.array(x[:, :, 30:]))   # frozen after the first chunk
    first = x[:, :, :30]
    if c.calibration.basis == "rotated":
        first = np.array(hadamard_rotate(mx.array(first), c.k_rot))
    assert np.allclose(np.array(c.k_mu), first.mean(axis=(0, 2)), atol=1e-4)
    mu, s = np.array(c.k_mu), (np.array(c.k_scale) if c.k_scale is not None else np.ones((2, 64), np.float32))
    if c.calibration.basis == "rotated":
        rows = (np.array(hadamard_rotate(mx.array(x), c.k_rot)) - mu[None, :, None]) / s[None, :, None]
    else:
        rows = np.array(hadamard_rotate(mx.array((x - mu[None, :, None]) / s[None, :, None]), c.k_rot))
    assert np.array_equal(np.array(c.blocks()[0]), quantize(kf, rows))


def test_calibration_lowers_the_score_error_of_offset_channels():
    """Keys with large constant channel offsets (the case calibration is for): centred score error
    of q5_1 keys drops (measured on this data: 7.4x lower with mean+scale, 6.1x with mean alone)."""
    rng = np.random.default_rng(3)
    k = (rng.standard_normal((1, 1, 256, 64)) * rng.uniform(0.2, 3, 64)).astype(np.float32)
    k[..., :4] += np.array([40.0, -25.0, 30.0, 15.0], np.float32)
    q = rng.standard_normal((64, 64)).astype(np.float32)

    def score_error(cal):
        c = TQCache("q5_1", "f16", calibration=cal)
        kk, _ = c.update_and_fetch(mx.array(k), mx.array(k))
        e = q @ (np.array(kk)[0, 0] - k[0, 0]).T
        return float(np.mean((e - e.mean(axis=1, keepdims=True)) ** 2))

    plain, calibrated = score_error(None), score_error("mean+scale")
    assert calibrated < plain / 3, (plain, calibrated)


# ------------------------------------------------------------------ every path, exact in real arithmetic

@pytest.mark.parametrize("tools", TOOLS)
def test_float_keys_give_the_same_logits_on_every_path(tiny, tools):
    """f32 keys: calibration changes no logit (prefill via dequantize + SDPA, decode via
    decode_attention's ops reference, which gets the scaled and rotated query)."""
    toks = tokens(24, seed=4)
    want = _run(tiny, make_cache(tiny, "f32", "f32"), toks, 16)
    for mode in ("sdpa", "reference"):
        c = make_cache(tiny, "f32+" + tools, "f32")
        got = _run(tiny, c, toks, 16, mode)
        np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)
        rep = cache_report(c)
        assert rep["paths"]["prefill:dequant-sdpa"] == 2
        assert rep["paths"].get(f"decode:{'dequant-sdpa' if mode == 'sdpa' else 'reference'}") == 16
        assert all(layer["k_calibration"] == KeyCalibration.parse(tools).spec for layer in rep["layers"])
        assert all(layer["calibration_note"] is None for layer in rep["layers"])


@pytest.mark.parametrize("kv", ["q8_0+mean+scale/q4_0", "turbo4+mean+qscale/q8_0", "q5_1+scale+rotated/f16"])
def test_decode_kernel_path_agrees_with_the_dequantize_path(tiny, kv, monkeypatch):
    """Quantized keys: decode through decode_attention (ops reference, and a stand-in kernel that
    only sees blocks) gives the logits of the dequantize + SDPA path."""
    toks = tokens(20, seed=5)
    k, v, cal = parse_kv_spec(kv)
    want = _run(tiny, make_cache(tiny, k, v, calibration=cal), toks, 12, "sdpa")
    got = _run(tiny, make_cache(tiny, k, v, calibration=cal), toks, 12, "reference")
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)
    from tqbridge.metal.attention.ref import attention_oracle   # float64 attention over the blocks

    seen = []

    def blocks_only_kernel(q, kb, vb, *, k_format, v_format, length, scale, backend=None, sinks=None,
                           rotation=None):
        seen.append(q.shape)
        return mx.array(attention_oracle(np.array(q), np.array(kb), np.array(vb), k_format=k_format,
                                         v_format=v_format, length=length, scale=scale,
                                         rotation=rotation).astype(np.float32))

    monkeypatch.setattr(attention_api, "decode_attention", blocks_only_kernel)
    monkeypatch.setattr(attention_api, "last_run", lambda: {"backend": "stand-in"})
    c = make_cache(tiny, k, v, calibration=cal)
    got = _run(tiny, c, toks, 12, "kernel")
    assert len(seen) == 2 * 8 and cache_report(c)["paths"]["decode:stand-in"] == 16
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)


def test_windowed_layers_calibrate_too():
    m = tiny_gemma3(window=8, seed=2)
    toks = tokens(20, seed=6)
    want = _run(m, make_cache(m, "f32", "f32"), toks, 10)
    c = make_cache(m, "f32+mean+qscale", "f32")
    got = _run(m, c, toks, 10, "reference")
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)
    assert any(x.window for x in c) and all(x.k_scale is not None for x in c)


def test_sinks_with_a_key_mean_take_the_dequantize_path():
    rng = np.random.default_rng(7)
    k = mx.array(rng.standard_normal((1, 2, 10, 64)).astype(np.float32) + 3)
    q = mx.array(rng.standard_normal((1, 4, 1, 64)).astype(np.float32))
    sinks = mx.array([0.5, -0.5, 1.0, 0.0])
    plain = TQCache("f32", "f32")
    kk, vv = plain.update_and_fetch(k, k)
    want = mx.fast.scaled_dot_product_attention(q, kk, vv, scale=0.125, sinks=sinks)
    c = TQCache("f32", "f32", calibration="mean+scale")
    kk, vv = c.update_and_fetch(k, k)
    got = c.attend(q, scale=0.125, sinks=sinks, mode="reference")
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
    assert c.paths == {"append": 1, "decode:dequant-sdpa": 1} and "sinks" in c.decode_fallback
    with pytest.raises(RuntimeError, match="sinks"):
        c.attend(q, scale=0.125, sinks=sinks, mode="kernel")


def test_qscale_needs_the_routing_and_says_so(tiny):
    toks = tokens(8, seed=8)
    c = make_cache(tiny, "q8_0+qscale", "q8_0")
    tiny(toks, cache=c)                                 # not routed: key statistics only
    assert all("key statistics only" in x.calibration_note for x in c)
    d = make_cache(tiny, "q8_0+qscale", "q8_0")
    _run(tiny, d, toks, 8)
    assert all(x.calibration_note is None for x in d)
    assert not np.allclose(np.array(c[0].k_scale), np.array(d[0].k_scale))


# ------------------------------------------------------------------ state, bytes

@pytest.mark.parametrize("kv", ["q5_1+mean+scale/q4_0", "turbo4@g64+mean+qscale/q8_0"])
def test_prompt_cache_save_load_continue(tiny, tmp_path, kv):
    toks = tokens(30, seed=9)
    k, v, cal = parse_kv_spec(kv)
    c = make_cache(tiny, k, v, calibration=cal)
    _run(tiny, c, toks[:, :22], 18)
    path = str(tmp_path / "p.safetensors")
    mlx_cache.save_prompt_cache(path, c)
    loaded = mlx_cache.load_prompt_cache(path)
    for a, b in zip(c, loaded):
        assert b.calibration == a.calibration and b.offset == a.offset
        assert np.array_equal(np.array(a.k_mu), np.array(b.k_mu))
        assert np.array_equal(np.array(a.k_scale), np.array(b.k_scale))
        assert np.array_equal(np.array(a.blocks()[0]), np.array(b.blocks()[0]))
    rest = toks[:, 22:]
    want = _run(tiny, c, rest, 1, "reference")
    got = _run(tiny, loaded, rest, 1, "reference")
    assert np.array_equal(got, want)


def test_state_checks_and_uncalibrated_layout():
    c = TQCache("q8_0", "q8_0", calibration="mean")
    x = mx.ones((1, 2, 3, 64))
    c.update_and_fetch(x, x)
    kb, vb, mu, s, *meta = c.state
    assert s is None and mu.shape == (2, 64) and len(meta) == 11 and meta[-1] == "mean"
    with pytest.raises(ValueError, match="do not match"):
        TQCache.from_state([kb, vb, None, None, *meta])
    with pytest.raises(ValueError, match="shape"):
        TQCache.from_state([kb, vb, mu[:, :10], None, *meta])
    with pytest.raises(ValueError, match="12 entries"):
        TQCache.from_state([kb, vb, mu, *meta])
    plain = TQCache("q8_0", "q8_0")
    plain.update_and_fetch(x, x)
    assert len(plain.state) == 12 and len(plain.meta_state) == 10    # the layout it always had
    old = TQCache.from_state([kb, vb, *meta[:-1]])
    assert not old.calibration and old.k_mu is None and old.offset == 3


def test_bytes_count_the_calibration(tiny):
    from tqbridge.parity import quality as q

    toks = [int(t) for t in np.array(tokens(40, seed=10))[0]]
    rows = {r["kv"]: r for r in q.evaluate(tiny, toks, ["q8_0/q8_0", "q8_0+mean+scale/q8_0"], chunk=16)}
    extra = 2 * 2 * 2 * 64 * 4          # layers x (mean, scale) x KV heads x head dim x float32
    plain, cal = rows["q8_0/q8_0"], rows["q8_0+mean+scale/q8_0"]
    assert cal["k_calibration"] == "mean+scale" and plain["k_calibration"] is None
    assert cal["bytes_per_token"] * 40 == plain["bytes_per_token"] * 40 + extra
    c = make_cache(tiny, "q8_0+mean+scale", "q8_0")
    tiny(mx.array([toks]), cache=c)
    assert c[0].nbytes == c[0].keys.nbytes + c[0].values.nbytes + 2 * 2 * 64 * 4
