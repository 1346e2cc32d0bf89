"""Per-layer K/V pairs: the spelling (``q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]``), the cache it builds, and
``tqbridge generate`` / ``quality`` / ``bench decode`` / ``parity`` taking or refusing it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from mlx_lm.models import cache as mlx_cache  # noqa: E402
from tiny_models import cpu_device, forced_decode, tiny_gemma3, tiny_llama, tokens  # noqa: E402,F401

from tqbridge.bridge import FormatError  # noqa: E402
from tqbridge.metal.lm.cache import TQCache, make_cache, make_layered_cache  # noqa: E402
from tqbridge.metal.lm.calibration import KeyCalibration  # noqa: E402
from tqbridge.bridge.blocks.kv_spec import LayeredKV, layered_kv_name, parse_kv_spec, parse_layered_kv_spec  # noqa: E402
from tqbridge.metal.lm.report import cache_report  # noqa: E402
from tqbridge.tools.cli import main  # noqa: E402

SPEC = "q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]"


def _names(kv: LayeredKV, n: int) -> list:
    return [f"{k}/{v}" for k, v, _ in kv.pairs(n)]


# ---- the spelling

@pytest.mark.parametrize("spelling, name", [
    (SPEC, SPEC),
    ("q8_0/turbo3", "q8_0/turbo3"),                      # no group: one pair for every layer
    ("Q8_0 / TURBO3 [ 007 , -2--1 = q5_1+mean,scale/q4_0 ][3-3=f16]",
     "q8_0/turbo3[7,-2--1=q5_1+mean+scale/q4_0][3=f16/f16]"),
])
def test_canonical_names(spelling, name):
    kv = parse_layered_kv_spec(spelling)
    assert layered_kv_name(kv) == kv.name == name
    assert parse_layered_kv_spec(name) == kv


def test_plain_pair_is_parse_kv_spec():
    kv = parse_layered_kv_spec("q5_1+mean/q4_0")
    assert kv == LayeredKV(parse_kv_spec("q5_1+mean/q4_0"))
    assert kv.pairs(3) == [("q5_1", "q4_0", KeyCalibration(mean=True))] * 3


def test_layers_resolve_from_both_ends():
    kv = parse_layered_kv_spec(SPEC)
    assert _names(kv, 6) == ["q8_0/q8_0"] * 2 + ["q8_0/turbo3"] * 2 + ["q8_0/q8_0"] * 2
    assert _names(kv, 4) == ["q8_0/q8_0"] * 4
    ranges = parse_layered_kv_spec("q8_0/turbo3[1-2=q4_0/q4_0][-3--2=f16]")
    assert _names(ranges, 7) == ["q8_0/turbo3", "q4_0/q4_0", "q4_0/q4_0", "q8_0/turbo3", "f16/f16", "f16/f16",
                                 "q8_0/turbo3"]


_PAIRS = ("q8_0/turbo3", "q8_0/q8_0", "q4_0/turbo4", "f16/f16", "q5_1+mean+scale/q4_0", "turbo3@g64/q8_0")
_items = st.tuples(st.integers(-40, 40), st.integers(-40, 40)).map(
    lambda t: str(t[0]) if t[0] == t[1] else f"{t[0]}-{t[1]}")
_groups = st.lists(st.tuples(st.lists(_items, min_size=1, max_size=4, unique=True), st.sampled_from(_PAIRS)),
                   max_size=3)


@given(default=st.sampled_from(_PAIRS), groups=_groups, n=st.integers(1, 40))
@example(default="q8_0/turbo3", groups=[(["0", "1", "-2", "-1"], "q8_0/q8_0")], n=30)
def test_round_trip_and_resolution(default, groups, n):
    spelling = default + "".join(f"[{','.join(items)}={pair}]" for items, pair in groups)
    kv = parse_layered_kv_spec(spelling)
    assert parse_layered_kv_spec(kv.name) == kv
    try:
        pairs = kv.pairs(n)
    except FormatError as e:
        assert "\n" not in str(e) and ("out of range" in str(e) or "named twice" in str(e)
                                       or "backwards" in str(e)), str(e)
        return
    want = [parse_kv_spec(default)] * n
    for items, pair in groups:   # the reference: each item resolved by hand, from the end when negative
        for item in items:
            a, _, b = item[1:].partition("-")
            first = int(item[0] + a)
            last = int(b) if b else first
            for i in range(first % n, last % n + 1):
                want[i] = parse_kv_spec(pair)
    assert pairs == want


@pytest.mark.parametrize("spelling, n, words", [
    ("q8_0/turbo3[0,-7=q8_0]", 6, "layer -7 is out of range for a model of 6 layers"),
    ("q8_0/turbo3[6=q8_0]", 6, "layer 6 is out of range"),
    ("q8_0/turbo3[0,-6=q8_0]", 6, "layer 0 is named twice (0 and -6)"),
    ("q8_0/turbo3[0-2=q8_0][2=f16]", 6, "layer 2 is named twice (0-2 and 2)"),
    ("q8_0/turbo3[3-1=q8_0]", 6, "runs backwards"),
    ("q8_0/turbo3[0,0=q8_0]", None, "layer 0 is written twice"),
    ("q8_0/turbo3[0=q9_9]", None, "unknown format 'q9_9'"),
    ("q8_0/turbo3[0=q8_0/q4_0+mean]", None, "keys only"),
    ("q8_0/turbo3[0=q8_0", None, "write groups [LAYERS=K/V]"),
    ("q8_0/turbo3[0=q8_0]x", None, "write groups [LAYERS=K/V]"),
    ("q8_0/turbo3[[0=q8_0]]", None, "write groups [LAYERS=K/V]"),
    ("q8_0/turbo3]", None, "']' without its '['"),
    ("[0=q8_0]", None, "the default pair comes first"),
    ("q8_0/turbo3[0]", None, "bad group '[0]'"),
    ("q8_0/turbo3[=q8_0]", None, "bad group"),
    ("q8_0/turbo3[a=q8_0]", None, "bad layer 'a'"),
    ("q8_0/turbo3[1-=q8_0]", None, "bad layer '1-'"),
    ("q8_0/turbo3[\u0661=q8_0]", None, "bad layer"),            # an Arabic-Indic digit is no index
    ("q8_0/turbo3[0," + "1," * 50000 + "=q8_0]", None, "characters)"),  # long input, short message
])
def test_refusals_are_one_line(spelling, n, words):
    with pytest.raises(FormatError) as e:
        kv = parse_layered_kv_spec(spelling)
        kv.pairs(n)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and len(msg) < 400, msg


# ---- the cache

def test_each_layer_gets_its_pair():
    m = tiny_gemma3()   # 4 layers, 0 and 2 sliding-window
    cache = make_layered_cache(m, "q8_0/turbo3[0,-1=q4_0/q8_0][1=f16]")
    assert all(isinstance(c, TQCache) for c in cache)
    assert [(c.k_format, c.v_format) for c in cache] == [("q4_0", "q8_0"), ("f16", "f16"), ("q8_0", "turbo3"),
                                                         ("q4_0", "q8_0")]
    base = mlx_cache.make_prompt_cache(m)
    assert [c.window for c in cache] == [getattr(b, "max_size", None) if type(b) is mlx_cache.RotatingKVCache
                                         else None for b in base]
    assert any(c.window for c in cache)
    assert [layer["kv"] for layer in cache_report(cache)["layers"]] == ["q4_0/q8_0", "f16/f16", "q8_0/turbo3",
                                                                      "q4_0/q8_0"]
    kept = make_layered_cache(m, "q8_0/turbo3[0=q4_0]", sliding="float")   # layer 0 slides: it stays float
    assert type(kept[0]) is mlx_cache.RotatingKVCache and kept[1].k_format == "q8_0"
    with pytest.raises(FormatError, match="layer 4 is out of range for a model of 4 layers"):
        make_layered_cache(m, "q8_0/turbo3[4=q4_0]")


def test_logits_equal_a_cache_built_layer_by_layer(cpu_device):
    m = tiny_gemma3()
    spec = "q8_0/turbo3[0,-1=q4_0/q8_0][1=q5_1+mean/q4_0]"
    pairs = [("q4_0", "q8_0", None), ("q5_1", "q4_0", "mean"), ("q8_0", "turbo3", None), ("q4_0", "q8_0", None)]
    by_hand = [TQCache(k, v, window=getattr(b, "max_size", None) if type(b) is mlx_cache.RotatingKVCache else None,
                       calibration=cal)
               for (k, v, cal), b in zip(pairs, mlx_cache.make_prompt_cache(m))]
    toks = tokens(14, seed=3)
    layered = forced_decode(m, toks, make_layered_cache(m, spec))
    np.testing.assert_array_equal(layered, forced_decode(m, toks, by_hand))
    uniform = forced_decode(m, toks, make_cache(m, "q8_0", "turbo3"))
    assert np.abs(layered - uniform).max() > 1e-3   # the groups changed what the model saw


# ---- the tools

def test_quality_rows_name_each_layers_pair():
    from tqbridge.parity import quality as q

    m = tiny_llama()   # 2 layers
    toks = np.random.default_rng(4).integers(0, 97, 12).tolist()
    rows = {r["kv"]: r for r in q.evaluate(m, toks, ["q8_0/turbo3", "q8_0/turbo3[-1=q8_0/q8_0]", "q8_0/q8_0"],
                                           chunk=4)}
    mixed = rows["q8_0/turbo3[-1=q8_0/q8_0]"]
    assert mixed["layer_kv"] == {"q8_0/turbo3": [0], "q8_0/q8_0": [1]}
    assert rows["q8_0/turbo3"]["layer_kv"] is None
    # one layer of each: the bytes are the two uniform caches' mean
    assert mixed["bytes_per_token"] == (rows["q8_0/turbo3"]["bytes_per_token"]
                                        + rows["q8_0/q8_0"]["bytes_per_token"]) / 2
    assert mixed["kl_mean"] != rows["q8_0/turbo3"]["kl_mean"]


def test_bench_decode_takes_per_layer_pairs(capsys):
    from tqbridge.bridge.blocks.kv_spec import split_top
    from tqbridge.metal.decode_options import DecodeOptions
    from tqbridge.metal.lm import decode_bench

    assert split_top("fp16,q8_0/turbo3[0,-1=q8_0/q8_0]{compile=0},q8_0/q4_0") == [
        "fp16", "q8_0/turbo3[0,-1=q8_0/q8_0]{compile=0}", "q8_0/q4_0"]
    m = tiny_llama()
    caches = decode_bench.make_caches(m, "q8_0/turbo3[-1=q8_0/q4_0]", DecodeOptions(q_precision="int8"))
    assert [(c.k_format, c.v_format, c.q_precision) for c in caches] == [("q8_0", "turbo3", "int8"),
                                                                        ("q8_0", "q4_0", "int8")]
    capsys.readouterr()
    # the geometry's layer count is known once the model is built: an index out of range is that row's error
    assert main(["bench", "decode", "--models", "tiny", "--context", "16", "--tokens", "4", "--rounds", "1",
                 "--caches", "fp16,q8_0/turbo3[0,-1=q8_0/q8_0]{compile=0},q8_0/turbo3[0,9=q8_0/q8_0]"]) == 0
    rows = {r["cache"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["q8_0/turbo3[0,-1=q8_0/q8_0]{compile=0}"]["ms_per_token"] > 0
    assert rows["q8_0/turbo3[0,9=q8_0/q8_0]"]["error"] == ("FormatError: layer 9 is out of range for a model of "
                                                           "4 layers (0..3, or -4..-1 from the last)")
    assert main(["bench", "decode", "--models", "tiny", "--caches", "fp16,q8_0/turbo3[0=q9_9]"]) == 2
    assert "--caches" in capsys.readouterr().err


def test_parity_refuses_per_layer_pairs():
    from tqbridge.parity.harness.runtimes import KV

    with pytest.raises(ValueError) as e:
        KV.parse(SPEC)
    msg = str(e.value)
    assert "per-layer K/V formats cannot be compared with llama.cpp" in msg and "\n" not in msg
    assert KV.parse("q8_0/q4_0").name == "q8_0/q4_0"


def test_cli_refuses_bad_spellings_in_one_line(capsys, tmp_path):
    for cmd in ("generate", "quality"):
        extra = ["--prompt", "x"] if cmd == "generate" else []
        assert main([cmd, str(tmp_path / "none.gguf"), "--kv", "q8_0/turbo3[0,0=q8_0]", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "layer 0 is written twice" in err and len(err.splitlines()) == 1, err


@pytest.mark.model
def test_generate_and_quality_on_smollm2(capsys, tmp_path):
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    try:
        path = str(model_path("smollm2"))
    except ModelUnavailable as e:   # the model package is optional: decided before anything runs
        pytest.skip(f"SmolLM2 is not installed: {e}")
    assert main(["generate", path, "--kv", SPEC, "--prompt", "The capital of France is", "--max-tokens", "3",
                 "--stats"]) == 0
    err = capsys.readouterr().err
    assert f"--- kv {SPEC}:" in err and "tqbridge': 30" in err
    assert main(["generate", path, "--kv", "q8_0/turbo3[30=q8_0]", "--prompt", "x"]) == 2
    assert "layer 30 is out of range for a model of 30 layers" in capsys.readouterr().err
    out = tmp_path / "q.json"
    assert main(["quality", path, "--kv", SPEC, "--tokens", "32", "--chunk", "16", "--json", str(out),
                 "--no-progress"]) == 0
    rows = {r["kv"]: r for r in json.loads(out.read_text())}
    assert rows[SPEC]["layer_kv"] == {"q8_0/q8_0": [0, 1, 28, 29], "q8_0/turbo3": list(range(2, 28))}
    assert main(["quality", path, "--kv", "q8_0/turbo3[-31=q8_0]", "--tokens", "32"]) == 2
    assert "layer -31 is out of range" in capsys.readouterr().err
