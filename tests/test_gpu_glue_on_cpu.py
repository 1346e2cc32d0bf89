"""The Python launch code of the GPU branches, run on a machine without a GPU: MLX's custom-kernel
factory replaced by a recorder that returns zero arrays of the requested shapes (tied to the call's
inputs by ``mx.depends``, so an output's graph reaches them as a kernel's does). It checks what no
CPU test of the kernels reaches — the calls the prepared append and the prepared attention launches
make on MLX's callables (their attribute names, inputs, output shapes, grids) — not the kernels' results
(those need the GPU: the gpu-marked tests). A rename of MLXKernel's callable that the append's GPU
branch missed (it failed every GPU append and decode-lane test on the H200, 2026-12-01) fails here."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from tqbridge.metal import attention, dispatch, kv_append   # noqa: E402
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import launch as attention_launch
from tqbridge.metal.decode_options import DecodeOptions   # noqa: E402
from tqbridge.metal.attention import check_problem, decode_attention, last_run   # noqa: E402
from tqbridge.metal.codecs import rotation_group   # noqa: E402

CALLS: list = []


def _fake_factory(name, input_names, output_names, source, header, **kw):
    def call(*, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value=None, **rest):
        assert len(inputs) == len(input_names), (name, len(inputs), input_names)
        assert len(output_shapes) == len(output_dtypes) == len(output_names)
        assert all(isinstance(a, mx.array) for a in inputs)
        assert grid[0] % threadgroup[0] == 0
        CALLS.append((name, [tuple(a.shape) for a in inputs], [tuple(s) for s in output_shapes], grid))
        outs = [mx.zeros(tuple(s), d) for s, d in zip(output_shapes, output_dtypes)]
        mx.eval(outs)   # no primitive of their own: what an output's graph holds is what made its inputs
        return mx.depends(outs, list(inputs))
    return call


def _clear():
    dispatch._cache.clear()
    attention_kernel.clear_launch_caches()
    attention.clear_call_caches()


@pytest.fixture
def fake_cuda(monkeypatch):
    _clear()
    CALLS.clear()
    monkeypatch.setattr(mx.fast, "cuda_kernel", _fake_factory, raising=False)
    monkeypatch.setattr(dispatch, "resolve", lambda b: b)
    monkeypatch.setattr(attention_kernel, "pick_backend", lambda b: "cuda")
    yield
    _clear()   # no recorder-built kernel may outlive the test


def _append_case(d: int, heads: int, options=None):
    """A prepared q8_0/turbo3 append on the fake CUDA, one step's rows and 8-row cache buffers."""
    app = kv_append.prepared("q8_0", "turbo3", d, d, d, d, rotation_group("q8_0", d, "k"),
                             rotation_group("turbo3", d, "v"), "float16", "cuda", options)
    rows = mx.zeros((1, heads, 1, d), mx.float16)
    kc = mx.zeros((1, heads, 8, app.k_row_bytes), mx.uint8)
    vc = mx.zeros((1, heads, 8, app.v_row_bytes), mx.uint8)
    return app, rows, kc, vc


def test_prepared_append_calls_mlx(fake_cuda):
    d = 128
    app, rows, kc, vc = _append_case(d, 2)
    flag = app(rows, rows, kc, vc, 3, mx.zeros((4,), mx.uint32))
    assert tuple(flag.shape) == (4,)
    (name, shapes, outs, grid), = CALLS
    assert shapes[:4] == [(1, 2, 1, d), (1, 2, 1, d), tuple(kc.shape), tuple(vc.shape)] and outs == [(4,)]


@pytest.mark.parametrize("compiled", [True, False])
def test_prepared_attention_calls_mlx(fake_cuda, compiled):
    """Three lengths, one prepared launch. Under mx.compile (CUDA's default) the launch code runs once,
    at the trace, and the two later calls replay it: the recorder sees one call's kernels, not three."""
    rng = np.random.default_rng(0)
    from tqbridge import bridge

    q = mx.array(rng.standard_normal((1, 8, 128)).astype(np.float16))
    kb = mx.array(bridge.quantize("q8_0", rng.standard_normal((1, 2, 64, 128)).astype(np.float32)))
    vb = mx.array(bridge.quantize("turbo3", rng.standard_normal((1, 2, 64, 128)).astype(np.float32)))
    for n in (5, 17, 64):   # a growing length: one launch, the length a parameter
        out = decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3", length=n, backend="cuda",
                               q_precision="int8", options=DecodeOptions(compile=compiled))
        assert tuple(out.shape) == (1, 8, 128) and out.dtype == mx.float16
        run = last_run()
        assert run["backend"] == "cuda" and run["kernel"] == "int8-mma" and run["v_decode"] == "turbo-permute"
        assert run["dispatches"] == 2 and run["compiled"] is compiled
    names = [c[0] for c in CALLS]
    assert len(names) == (1 if compiled else 3) * 2
    assert all("split_int8_mma" in x for x in names[::2]) and all("combine" in x for x in names[1::2])
    prob = check_problem(np.zeros((1, 8, 128), np.float16), np.asarray(kb), np.asarray(vb), k_format="q8_0",
                         v_format="turbo3", length=64)
    assert CALLS[0][1][:3] == [(1, 8, 128), tuple(kb.shape), tuple(vb.shape)]
    assert prob.l_max == 64


@pytest.mark.parametrize("consts, slots", [(True, 4), (False, 2)])
def test_append_flag_padding_follows_device_consts(fake_cuda, consts, slots):
    """One KV head, one row: the flag is 4 slots (16 bytes) under the device-consts default and the
    bare 2 (8 bytes, MLX's unified-memory pool) with ``DecodeOptions(device_consts=False)``, the A/B the
    decode benchmark measures; the kernel is built for the flag length it is given."""
    kv_append.prepared.cache_clear()
    app, rows, kc, vc = _append_case(256, 1, DecodeOptions(device_consts=consts))
    flag = app(rows, rows, kc, vc, 3, mx.zeros((slots,), mx.uint32))
    assert tuple(flag.shape) == (slots,) and app.flag_slots(1) == slots
    assert app._kern.static["KV_FLAG_MIN"] == (4 if consts else 1)
    kv_append.prepared.cache_clear()


@pytest.mark.parametrize("compiled", [True, False])
def test_prepared_append_compiled_replays(fake_cuda, compiled):
    """The in-place append of a decode loop: under mx.compile its launch code runs at the first step
    only (one recorded call for three steps); without it, every step."""
    kv_append.prepared.cache_clear()
    app, rows, kc, vc = _append_case(128, 2, DecodeOptions(compile=compiled))
    assert app.compiled is compiled
    flag = mx.zeros((4,), mx.uint32)
    for pos in (3, 4, 5):
        flag = app(rows, rows, kc, vc, pos, flag)
        assert tuple(flag.shape) == (4,)
    assert len(CALLS) == (1 if compiled else 3)
    kv_append.prepared.cache_clear()


def test_decode_options_refuse_other_values_and_fill_the_backend_defaults():
    with pytest.raises(attention.AttentionError, match="compile must be True, False or None"):
        DecodeOptions(compile="yes")
    cuda, metal = DecodeOptions().resolve("cuda"), DecodeOptions().resolve("metal")
    assert (cuda.compile, cuda.device_params, cuda.device_consts, cuda.defer_append, cuda.fold_append) == (True,) * 5
    assert (metal.compile, metal.device_params, metal.device_consts, metal.defer_append, metal.fold_append) == (False,) * 5
    assert DecodeOptions(compile=False).resolve("cuda").compile is False   # a value given wins


def test_device_params_are_the_host_params(fake_cuda, monkeypatch):
    """Device params (CUDA's default; ``DecodeOptions.device_params`` chooses): the per-step integers
    become views of a table made by MLX ops — the same values as the arrays made from host data, row
    by row, for pass 1's lengths and the append's row position."""
    from tqbridge import bridge

    rng = np.random.default_rng(1)
    q = mx.array(rng.standard_normal((1, 8, 128)).astype(np.float16))
    kb = mx.array(bridge.quantize("q8_0", rng.standard_normal((1, 2, 64, 128)).astype(np.float32)))
    vb = mx.array(bridge.quantize("turbo3", rng.standard_normal((1, 2, 64, 128)).astype(np.float32)))
    launches = {}
    for flag in ("0", "1"):
        launches[flag] = attention_kernel.prepare_decode(q, kb, vb, k_format="q8_0", v_format="turbo3",
                                                         q_precision="int8",
                                                         options=DecodeOptions(device_params=flag == "1"))
    assert launches["1"].device_params and not launches["0"].device_params
    assert launches["1"].run_info["device_params"] is True and launches["0"].run_info["device_params"] is False
    for n in (0, 1, 17, 63, 64):
        a, b = np.array(launches["0"].ip1(n)), np.array(launches["1"].ip1(n))
        assert a.dtype == b.dtype == np.int32 and np.array_equal(a, b), (n, a, b)
    with pytest.raises(attention.AttentionError, match="outside"):
        launches["1"].ip1(65)
    # a row is a view of the (evaluated) table: no kernel per step (an int index would be a Gather)
    from tqbridge.metal.lm import decode_bench

    mx.eval(*launches["1"]._tables.values())
    prims = decode_bench.graph_primitives(launches["1"].ip1(5))
    assert prims and all(decode_bench.is_view(p) for p in prims), prims
    out = launches["1"](q, kb, vb, 33)   # the launch takes the view like the host-made buffer
    assert tuple(out.shape) == (1, 8, 128)

    d = 128
    for flag in ("0", "1"):
        kv_append.prepared.cache_clear()
        app = kv_append.prepared("q8_0", "turbo3", d, d, d, d, rotation_group("q8_0", d, "k"),
                                 rotation_group("turbo3", d, "v"), "float16", "cuda",
                                 DecodeOptions(device_params=flag == "1"))
        assert app.device_params is (flag == "1")
        if flag == "1":
            for args in ((2, 1, 8, 3, 2, 4), (2, 1, 8, 7, 2, 4), (4, 2, 16, 0, 2, 8)):
                a, b = np.array(kv_append._params(*args)), np.array(app._device_row(*args))
                assert a.dtype == b.dtype == np.uint32 and np.array_equal(a, b), (args, a, b)
    kv_append.prepared.cache_clear()
    assert attention_kernel.prepare_decode(q, kb, vb, k_format="q8_0", v_format="turbo3",
                                           q_precision="int8").device_params   # the default on CUDA


def test_device_consts_leave_no_small_host_buffer(fake_cuda, monkeypatch):
    """Device consts (CUDA's default; ``DecodeOptions.device_consts`` chooses): every constant input of
    the prepared attention launches and of the append is at least MIN_CONST_BYTES long (MLX's CUDA
    allocator serves buffers of <= 8 bytes from unified memory the GPU reads through a mapping), holds
    the host values in front and keeps their dtype; the switch off gives the host-made arrays."""
    from tqbridge import bridge
    from tqbridge.metal.lm import report

    rng = np.random.default_rng(2)
    q = mx.array(rng.standard_normal((1, 8, 128)).astype(np.float16))
    kb = mx.array(bridge.quantize("q8_0", rng.standard_normal((1, 2, 64, 128)).astype(np.float32)))
    vb = mx.array(bridge.quantize("turbo3", rng.standard_normal((1, 2, 64, 128)).astype(np.float32)))
    d = 128
    got = {}
    for flag in ("0", "1"):
        opts = DecodeOptions(device_consts=flag == "1")
        launch = attention_kernel.prepare_decode(q, kb, vb, k_format="q8_0", v_format="turbo3", q_precision="int8",
                                                 options=opts)
        run = launch._run
        app = kv_append.prepared("q8_0", "turbo3", d, d, d, d, rotation_group("q8_0", d, "k"),
                                 rotation_group("turbo3", d, "v"), "float16", "cuda", opts)
        got[flag] = {"fp1": run.fp1, "tabs": run.tabs, "zero_sinks": run.zero_sinks, "no_dep": run.no_dep,
                     "ip2": run.ip2, "ktab": app._ktab, "vtab": app._vtab}
        CALLS.clear()
        launch(q, kb, vb, 40)
        (_, p1_shapes, _, _), (_, p2_shapes, _, _) = CALLS   # pass 1, combine
        got[flag]["p1_fp_dep"] = (p1_shapes[4], p1_shapes[6])
        assert launch.run_info["device_consts"] is (flag == "1")   # what reports and bench plans print
        words = report._kernel_words(report._kernel_info(launch))
        assert ("device consts" in words) is (flag == "1"), words
    from tqbridge.metal.lm import decode_bench

    for name, host in got["0"].items():
        if name == "p1_fp_dep":
            continue
        dev = got["1"][name]
        # scheduled with async_eval (no host sync in a decode step), so no graph left for mx.compile
        # to fold into every replay of the launches
        assert decode_bench.graph_primitives(dev) == [], name
        assert dev.dtype == host.dtype, name
        assert dev.nbytes >= attention_launch.MIN_CONST_BYTES, (name, dev.shape)
        h, g = np.array(host).reshape(-1).view(np.uint8), np.array(dev).reshape(-1).view(np.uint8)
        assert np.array_equal(g[:h.size], h) and not g[h.size:].any(), name   # the bytes (NaN placeholders too)
    assert got["0"]["fp1"].nbytes == 8 and got["0"]["no_dep"].nbytes == 4   # what the switch exists for
    assert got["1"]["p1_fp_dep"] == ((4,), (4,)) and got["0"]["p1_fp_dep"] == ((2,), (1,))
    kv_append.prepared.cache_clear()


def test_append_tables_survive_layers_of_two_capacities(fake_cuda, monkeypatch):
    """The layers of a model grow in different decode steps (LayerDecoder.grow_phase), so a step's layers
    write buffers of two capacities in turn. The append's device parameter tables are kept per geometry:
    alternating between the two builds each table once (a single-table cache rebuilt one per layer and
    step: 50+ us of host time per layer on the H200), and every row still equals the host-made one."""
    from tqbridge.metal.decode_options import DecodeOptions

    d = 128
    kv_append.prepared.cache_clear()
    app = kv_append.prepared("q8_0", "turbo3", d, d, d, d, rotation_group("q8_0", d, "k"),
                             rotation_group("turbo3", d, "v"), "float16", "cuda", DecodeOptions(device_params=True))
    built = []
    real = kv_append.param_table

    def spy(*a, **k):
        built.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(kv_append, "param_table", spy)
    for pos in range(200, 260):
        for cap in (256, 512):
            args = (2, 1, cap, pos, 2, 4)
            row = app._device_row(*args)
            if pos % 16 == 0:
                assert np.array_equal(np.array(row), np.array(kv_append._params(*args))), args
    assert sorted(built) == [257, 513], built
    for cap in (768, 1024, 1280, 1536):   # the buffers keep growing: old geometries leave, a few are kept
        app._device_row(2, 1, cap, 300, 2, 4)
    assert len(app._ptable) <= kv_append.PARAM_TABLES
    kv_append.prepared.cache_clear()


def test_spread_layers_build_each_capacity_once(fake_cuda, monkeypatch):
    """CUDA's decode lane (compiled launches, device params and consts, the append deferred into the
    attention's call) with the layers' growth spread (LayerDecoder.grow_phase, as make_cache sets it): two
    capacities are in use at once and the layers of a step alternate between them. Each capacity's
    DecodeLaunch, parameter tables (the attention's lengths, the append's row positions) and traced
    launches are made once, whichever layer reaches it first; a step adds one row view per capacity in use
    to each table."""
    from mlx_lm.models import base

    from tqbridge.metal import selfcheck
    from tqbridge.metal.lm import cache as cache_mod
    from tqbridge.metal import codecs
    from tqbridge.metal.attention import decoder
    from tqbridge.metal.lm.cache import TQCache
    from tqbridge.metal.lm.routing import route_attention

    for mod in (codecs, decoder):
        monkeypatch.setattr(mod, "gpu_backend", lambda: "cuda")
    monkeypatch.setattr(cache_mod, "_decode_backend", lambda mode: "auto")
    monkeypatch.setattr(selfcheck, "check_decode_lane", lambda *a, **k: None)   # the fake kernels write nothing
    monkeypatch.setattr(TQCache, "step", 16)
    kv_append.prepared.cache_clear()
    counts = {"append table": 0, "attention table": 0, "append row": 0, "attention row": 0}

    def counted(mod, name, what):
        real = getattr(mod, name)

        def spy(*a, **k):
            counts[what] += 1
            return real(*a, **k)
        monkeypatch.setattr(mod, name, spy)

    counted(kv_append, "param_table", "append table")
    counted(attention_launch, "param_table", "attention table")
    counted(kv_append, "table_row", "append row")
    counted(attention_launch, "table_row", "attention row")

    n, hkv, d = 4, 2, 64
    caches = [TQCache("q8_0", "turbo3") for _ in range(n)]
    for i, c in enumerate(caches):
        c.grow_phase = i / n
    rng = np.random.default_rng(3)

    def rows(s):
        return mx.array(rng.standard_normal((1, hkv, s, d)).astype(np.float16))

    for c in caches:
        c.update_and_fetch(rows(16), rows(16))
    q, k, v = mx.array(rng.standard_normal((1, 4, 1, d)).astype(np.float16)), rows(1), rows(1)
    counts.update(dict.fromkeys(counts, 0))
    CALLS.clear()
    seen, per_step = set(), []
    with route_attention():
        for _ in range(48):
            before = dict(counts)
            outs = []
            for c in caches:
                kk, vv = c.update_and_fetch(k, v)
                outs.append(base.scaled_dot_product_attention(q, kk, vv, cache=c, scale=d ** -0.5, mask=None))
            mx.eval(outs + [c.decoder.flag for c in caches])
            caps = {c.keys.shape[2] for c in caches}
            seen |= caps
            per_step.append((len(caps), {w: counts[w] - before[w] for w in ("append row", "attention row")}))
    assert all(c.paths["decode:cuda"] == 48 for c in caches)
    assert len(seen) >= 3 and max(m for m, _ in per_step) == 2, (seen, per_step)   # two capacities at once
    assert len(attention_kernel.prepared_launches()) == len(seen)
    assert counts["append table"] == counts["attention table"] == len(seen), (counts, seen)
    # traced once per capacity (compiled launches run their Python, and so the recorder, at the trace only):
    # the append alone and the attention alone (the growth step), then the two in one call (later steps: with
    # fold_append, CUDA's default, pass 1's folded build appends)
    names = [name for name, *_ in CALLS]
    appends, attention = (sum(x.startswith(p) for x in names) for p in ("tq_kv_append", "tq_attention"))
    folds = sum(x.startswith("tq_attention_split_int8_mma_fold") for x in names)
    assert appends == len(seen) and folds == len(seen), names
    assert attention == 2 * 2 * len(seen), names   # attention: pass 1 (plain or folded) and combine
    assert all(got == {"append row": m, "attention row": m} for m, got in per_step), per_step
    kv_append.prepared.cache_clear()


def _lane_step_kernels(kv: str, monkeypatch, steps: int = 4) -> list:
    """One TQCache layer's routed decode steps on the fake CUDA's lane (float16 rows, 8/4 heads of 128
    values, launches not compiled so that each step's launch code runs): per step, the kernels of its KV
    path, the custom kernels it launched (recorded) plus the MLX ops around them (the non-view primitives
    of its graph), as tqbridge bench decode counts them on a GPU."""
    from mlx_lm.models import base

    from tqbridge.metal import selfcheck
    from tqbridge.metal.lm import cache as cache_mod, decode_bench, routing
    from tqbridge.metal.attention import decoder
    from tqbridge.metal.lm.cache import TQCache
    from tqbridge.bridge.blocks.kv_spec import parse_kv_spec

    monkeypatch.setattr(decoder, "gpu_backend", lambda: "cuda")           # the cache's in-place append: CUDA's
    monkeypatch.setattr(cache_mod, "emulated_decode_lane", lambda: True)   # decode steps routed to the lane
    monkeypatch.setattr(selfcheck, "check_decode_lane", lambda *a, **kw: None)   # (the recorder computes nothing)
    kf, vf, cal = parse_kv_spec(kv)
    c = TQCache(kf, vf, calibration=cal)
    c.decode_options = DecodeOptions(compile=False)
    rng = np.random.default_rng(3)

    def rows(heads, n=1):
        return mx.array(rng.standard_normal((1, heads, n, 128)).astype(np.float16))

    c.update_and_fetch(rows(4, 40), rows(4, 40))   # the prompt
    counts = []
    with routing.route_attention():
        for _ in range(steps):
            q, k, v = rows(8), rows(4), rows(4)
            mx.eval(q, k, v)
            before = len(CALLS)
            kk, vv = c.update_and_fetch(k, v)
            out = base.scaled_dot_product_attention(q, kk, vv, cache=c, scale=128 ** -0.5, mask=None)
            ops = [p for p in decode_bench.graph_primitives(out, c.decoder.flag) if not decode_bench.is_view(p)]
            counts.append(len(CALLS) - before + len(ops))
            mx.eval(out, c.decoder.flag)
    assert c.paths["decode:cuda"] == steps and c.codec_paths["k_append"] == "kv-append:cuda", (c.paths, c.codec_paths)
    return counts


def test_calibrated_decode_step_runs_the_kernels_of_an_uncalibrated_one(fake_cuda, monkeypatch):
    """A key-calibrated cache's decode step on CUDA's lane (append fused into the attention call): the
    append folded into pass 1 (which also multiplies q by the key scales as it loads q) and the combine pass,
    2 kernels as without calibration (CUDA's fold_append); no elementwise kernel scales q. The first step
    also makes the flag and the prepared launches' tables."""
    kv_append.prepared.cache_clear()
    plain = _lane_step_kernels("q5_1/q5_0", monkeypatch)
    calibrated = _lane_step_kernels("q5_1+mean+scale/q5_0", monkeypatch)
    assert plain[1:] == calibrated[1:] == [2, 2, 2], (plain, calibrated)
    # pass 1 with the scales: 8 inputs, its folded build 15 (the append's 6 and kcal after them)
    scaled = [shapes for name, shapes, _, _ in CALLS if "split" in name and len(shapes) in (8, 15)]
    assert scaled and all(s[7] == (1, 8, 1, 128) for s in scaled)   # pass 1's 8th input: the heads' scales
    assert any(len(s) == 15 for s in scaled)
    kv_append.prepared.cache_clear()


def test_decode_launch_starts_are_parameters_like_the_length(fake_cuda):
    """A batched decode launch (B = 3, mlx-lm's left padding): ``starts`` travel after the lengths in
    pass 1's parameters, host-made and device-table rows alike; a (length, starts) pair is made once and
    shared (a decode step reuses it: no new host copy), a new starts tuple makes one new table, and a
    start past the length is refused in one line."""
    from tqbridge import bridge

    rng = np.random.default_rng(48)
    q = mx.array(rng.standard_normal((3, 4, 128)).astype(np.float16))
    kb = mx.array(bridge.quantize("q8_0", rng.standard_normal((3, 2, 32, 128)).astype(np.float32)))
    vb = mx.array(bridge.quantize("turbo3", rng.standard_normal((3, 2, 32, 128)).astype(np.float32)))
    dls = {flag: attention_kernel.prepare_decode(q, kb, vb, k_format="q8_0", v_format="turbo3",
                                                 options=DecodeOptions(device_params=flag))
           for flag in (False, True)}
    head = dls[False]._head
    for n, starts in ((20, None), (20, (0, 7, 20)), (31, (0, 7, 20)), (32, (5, 5, 5))):
        want = head + [n] * 3 + list(starts or (0, 0, 0))
        for dl in dls.values():
            got = np.array(dl.ip1(n, starts))
            assert got.dtype == np.int32 and got.tolist() == want, (dl.device_params, n, starts, got)
            assert dl.ip1(n, starts) is dl.ip1(n, starts)
    assert len(dls[True]._tables) == 3   # zeros, (0, 7, 20), (5, 5, 5)
    for dl in dls.values():
        with pytest.raises(attention.AttentionError, match=r"start 21 of batch row 2 is outside 0\.\.20"):
            dl.ip1(20, (0, 0, 21))
        with pytest.raises(attention.AttentionError, match="start has 2 entries for a batch of 3"):
            dl.ip1(20, (0, 0))
        out = dl(q, kb, vb, 20, starts=(0, 7, 20))
        assert tuple(out.shape) == (3, 4, 128)


def test_decode_attention_passes_starts_to_the_prepared_launch(fake_cuda, monkeypatch):
    """decode_attention on MLX arrays and a GPU takes the prepared launch with ``start`` as its starts."""
    from tqbridge import bridge

    rng = np.random.default_rng(49)
    q = mx.array(rng.standard_normal((2, 4, 128)).astype(np.float16))
    kb = mx.array(bridge.quantize("q8_0", rng.standard_normal((2, 2, 16, 128)).astype(np.float32)))
    vb = mx.array(bridge.quantize("q8_0", rng.standard_normal((2, 2, 16, 128)).astype(np.float32)))
    seen = []
    real = attention_launch.DecodeLaunch.ip1

    def spy(self, length, starts=None):
        seen.append((length, starts))
        return real(self, length, starts)

    monkeypatch.setattr(attention_launch.DecodeLaunch, "ip1", spy)
    for start in (0, 3, [1, 9]):
        decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=12, start=start)
    assert seen == [(12, None), (12, (3, 3)), (12, (1, 9))]
