"""The fused attention kernel vs the float64 oracle, on the CPU emulator (CI) and on a GPU (gpu marker).

Every comparison uses the oracle's error bound (metal/attention/ref.py) with the kernel's own
serial-accumulation depth.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import pad_rows
from tqbridge.parity.plugin.strategies_attention import value_rows
from tqbridge.metal.attention import build as attention_build
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.backend import pick_backend
from tqbridge.metal.decode_options import FILL_PER_UNIT_TILES, compute_units
from tqbridge.metal.attention import AttentionError, check_problem, decode_attention, last_run
from tqbridge.metal.attention.problem import KERNELS
from tqbridge.metal.attention.ref import oracle
from helpers_kernels import METAL_STUB, metal_as_cpp, quantized_cache


def seed_of(name: str) -> int:
    """A seed drawn from a name, the same in every process (``hash()`` of a str varies per process
    unless PYTHONHASHSEED is fixed)."""
    return zlib.crc32(name.encode())


def _gpu_backend():
    try:
        import mlx.core as mx
    except ImportError:
        return None
    b = pick_backend("auto")
    return b if b in ("cuda", "metal") else None


GPU = _gpu_backend()
BACKENDS = [
    pytest.param("cpu-emulator", id="emu"),
    pytest.param(GPU or "gpu", id="gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
        GPU is None, reason="no MLX GPU backend (Metal or CUDA) on this machine")]),
]
ALL = [f for f in bridge.formats()]
HEAD_DIMS = [64, 80, 96, 128, 192, 256]


def _check(backend, q, kb, vb, **kw):
    opts = {k: kw.pop(k) for k in ("splits", "lanes_per_key", "warps", "generic", "kernel", "tile") if k in kw}
    if opts.get("kernel") != "int8-mma":   # this file tests kernels lanes / tiles (exact q); int8-mma: test_attention_int8_mma.py
        opts["q_precision"] = "exact"
    got = decode_attention(q, kb, vb, backend=backend, **kw, **opts)
    run = last_run()
    assert run["backend"] == backend and run["dispatches"] <= 2
    prob = check_problem(q, kb, vb, **kw)
    want, bound = oracle(q, kb, vb, prob, kw.get("sinks"), chain=run["chain"],
                         q_precision=run.get("q_precision", "exact"))
    if prob.squeeze_rows:
        want, bound = want[:, :, 0], bound[:, :, 0]
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"
    return got


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf", ALL)
def test_every_format_pair(backend, kf):
    # deterministic sweep: every K format against every V format, small shapes, 2 splits
    rng = np.random.default_rng(seed_of(kf))
    b, hq, hkv, d, n = 1, 2, 1, 64, 40
    q = rng.standard_normal((b, hq, d)).astype(np.float32)
    kb = quantized_cache(rng, kf, (b, hkv, n, d))
    for vf in ALL:
        vb = quantized_cache(rng, vf, (b, hkv, n, d))
        # on a GPU the format-generic build (one NVRTC build for all 324 pairs); the specialised
        # per-pair builds are what the property test below draws at random
        _check(backend, q, kb, vb, k_format=kf, v_format=vf, length=n - 3, splits=2,
               **({"generic": True} if backend != "cpu-emulator" else {}))


@st.composite
def problems(draw):
    d = draw(st.sampled_from(HEAD_DIMS))
    hkv = draw(st.integers(1, 2))
    g = draw(st.integers(1, 8))
    t = draw(st.integers(1, 4))
    b = draw(st.integers(1, 2))
    l_max = draw(st.integers(1, 600))
    lengths = [draw(st.integers(0, l_max)) for _ in range(b)]
    kf = draw(st.sampled_from(ALL))
    vf = draw(st.sampled_from(ALL))
    kind = draw(st.sampled_from(["normal", "normal", "zeros", "tiny", "huge", "constant", "spike"]))
    window = draw(st.one_of(st.none(), st.integers(1, 64)))
    softcap = draw(st.one_of(st.none(), st.floats(1.0, 50.0)))
    sinks = draw(st.booleans())
    splits = draw(st.one_of(st.none(), st.integers(1, 7)))
    kernel = draw(st.sampled_from([None, None, None, "lanes"]))   # None: tiles where it fits
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(d=d, hkv=hkv, g=g, t=t, b=b, l_max=l_max, lengths=lengths, kf=kf, vf=vf, kind=kind,
                window=window, softcap=softcap, sinks=sinks, splits=splits, kernel=kernel, seed=seed)


def _run_problem(backend, p):
    rng = np.random.default_rng(p["seed"])
    b, hkv, hq, t, d = p["b"], p["hkv"], p["hkv"] * p["g"], p["t"], p["d"]
    q = rng.standard_normal((b, hq, t, d)).astype(np.float32) * (3.0 if p["kind"] == "huge" else 1.0)
    kb = quantized_cache(rng, p["kf"], (b, hkv, p["l_max"], d), p["kind"])
    vb = quantized_cache(rng, p["vf"], (b, hkv, p["l_max"], d), p["kind"])
    sinks = rng.standard_normal(hq).astype(np.float32) if p["sinks"] else None
    _check(backend, q if t > 1 else q[:, :, 0], kb, vb, k_format=p["kf"], v_format=p["vf"], length=p["lengths"],
           window=p["window"], softcap=p["softcap"], sinks=sinks, splits=p["splits"], kernel=p.get("kernel"))


@pytest.mark.parametrize("backend", BACKENDS)
@given(p=problems())
@example(p=dict(d=128, hkv=2, g=4, t=1, b=1, l_max=513, lengths=[513], kf="q8_0", vf="turbo3", kind="normal",
                window=None, softcap=None, sinks=False, splits=None, seed=1))
@example(p=dict(d=256, hkv=1, g=8, t=3, b=1, l_max=45, lengths=[45], kf="f32", vf="turbo2@g64", kind="normal",
                window=7, softcap=None, sinks=True, splits=2, seed=3))
@example(p=dict(d=80, hkv=1, g=6, t=4, b=2, l_max=37, lengths=[0, 37], kf="turbo4@g64", vf="q5_1",
                kind="spike", window=5, softcap=30.0, sinks=True, splits=3, seed=2))
def test_kernel_matches_oracle(backend, p):
    _run_problem(backend, p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_context_and_dtypes(backend):
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    rng = np.random.default_rng(7)
    b, hq, hkv, d, n = 1, 8, 2, 128, 3001
    kb = quantized_cache(rng, "q8_0", (b, hkv, n, d))
    vb = quantized_cache(rng, "turbo3", (b, hkv, n, d))
    q = rng.standard_normal((b, hq, d)).astype(np.float32)
    _check(backend, q, kb, vb, k_format="q8_0", v_format="turbo3", length=n)
    for dt in (mx.float16, mx.bfloat16):
        qm = mx.array(q).astype(dt)
        got = decode_attention(qm, mx.array(kb), mx.array(vb), k_format="q8_0", v_format="turbo3", length=n,
                               backend=backend, q_precision="exact")
        assert isinstance(got, mx.array) and got.dtype == dt and got.shape == (b, hq, d)
        prob = check_problem(qm, kb, vb, k_format="q8_0", v_format="turbo3", length=n)
        want, bound = oracle(qm, kb, vb, prob, chain=last_run()["chain"])
        err = np.abs(np.array(got.astype(mx.float32)) - want[:, :, 0])
        assert (err <= bound[:, :, 0]).all()


def test_two_dispatches_whatever_the_split(monkeypatch):
    # count real launches on the emulator, independently of the module's own count
    from tqbridge.metal import emulator

    calls = []
    orig = emulator.EmulatedKernel.__call__
    monkeypatch.setattr(emulator.EmulatedKernel, "__call__", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    rng = np.random.default_rng(8)
    kb = quantized_cache(rng, "q4_0", (1, 1, 700, 64))
    vb = quantized_cache(rng, "q4_0", (1, 1, 700, 64))
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    for kernel in ("lanes", "tiles"):
        for splits in (1, 5, 64):
            calls.clear()
            decode_attention(q, kb, vb, k_format="q4_0", v_format="q4_0", length=700, backend="cpu-emulator",
                             splits=splits, kernel=kernel)
            run = last_run()
            assert len(calls) == 2 and run["dispatches"] == 2 and run["splits"] == splits and run["kernel"] == kernel


def test_format_specialised_build_on_the_emulator():
    # GPUs build one specialisation per format pair (constants compiled in); run that build here too
    rng = np.random.default_rng(9)
    kb = quantized_cache(rng, "q8_0", (1, 2, 300, 128))
    vb = quantized_cache(rng, "turbo3", (1, 2, 300, 128))
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    for kernel in ("lanes", "tiles"):
        _check("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=290, splits=3, generic=False,
               kernel=kernel)
        assert last_run()["kernel"] == kernel
    # tiles with the tile a GPU gets for this shape (128 keys: several full tiles and a short one)
    _check("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="turbo3", length=299, splits=1, generic=False)
    assert last_run()["tile"] == 128


@pytest.mark.parametrize("kf,vf,d", [("q8_0", "turbo3", 128), ("f16", "q4_1", 64)])
def test_tiles_two_keys_per_thread(kf, vf, d):
    # tiles of 2 keys per thread (one warp, 64 keys; two warps, 128 keys) share each q load
    # between two keys in the score phase; the tail tile is short and a window cuts the start
    rng = np.random.default_rng(12)
    kb = bridge.quantize(kf, pad_rows(kf, rng.standard_normal((1, 2, 333, d)).astype(np.float32)))
    vb = bridge.quantize(vf, pad_rows(vf, rng.standard_normal((1, 2, 333, d)).astype(np.float32)))
    q = rng.standard_normal((1, 4, 2, d)).astype(np.float32)
    for warps, tile in ((1, 64), (2, 128)):
        _check("cpu-emulator", q, kb, vb, k_format=kf, v_format=vf, length=331, window=200, generic=False,
               kernel="tiles", warps=warps, tile=tile, splits=2)
        assert last_run()["tile"] == tile


def test_tiles_falls_back_to_lanes_when_threadgroup_memory_is_short():
    # 8 query heads x 4 rows of 256 values: q alone fills the 32 KiB of threadgroup memory
    rng = np.random.default_rng(10)
    kb = quantized_cache(rng, "q8_0", (1, 1, 20, 256))
    vb = quantized_cache(rng, "q4_0", (1, 1, 20, 256))
    q = rng.standard_normal((1, 8, 4, 256)).astype(np.float32)
    _check("cpu-emulator", q, kb, vb, k_format="q8_0", v_format="q4_0", length=20)
    assert last_run()["kernel"] == "lanes"
    with pytest.raises(AttentionError, match="kernel 'tiles' does not fit"):
        decode_attention(q, kb, vb, k_format="q8_0", v_format="q4_0", length=20, backend="cpu-emulator", kernel="tiles")
    with pytest.raises(AttentionError, match="unknown kernel"):
        decode_attention(q, kb, vb, k_format="q8_0", v_format="q4_0", length=20, backend="cpu-emulator", kernel="v9")
    with pytest.raises(AttentionError, match="at most 8 query rows"):   # int8-mma takes at most 8 rows per group
        decode_attention(q, kb, vb, k_format="q8_0", v_format="q4_0", length=20, backend="cpu-emulator", kernel="int8-mma")


def test_gpu_plan_of_the_benchmark_shape():
    # the plan a GPU gets for q8_0 K + turbo3 V, Hq 32 / Hkv 8, D 128: tiles, whole tiles per split, a grid
    # that fills the GPU where the context allows,
    # every key covered, one partial per threadgroup, within the combine pass's limit
    q = np.zeros((1, 32, 128), np.float32)
    kb = bridge.quantize("q8_0", np.zeros((1, 8, 4, 128)))
    vb = bridge.quantize("turbo3", np.zeros((1, 8, 4, 128)))
    for n in (1, 4096, 32768, 131072):
        prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", length=4)
        prob = dataclasses.replace(prob, l_max=n, lengths=(n,))
        plan = attention_plan.make_plan(prob, "cuda")
        assert plan.kernel == "tiles" and plan.tile == 32 * plan.warps and plan.split_len % plan.tile == 0
        # long contexts take the largest threadgroups; short ones smaller, until the grid fills the GPU
        tiles = 8 * -(-n // plan.tile)
        fill = FILL_PER_UNIT_TILES * compute_units("cuda")
        assert plan.warps == 4 or (tiles < fill * 2 and plan.warps >= 1)
        assert plan.warps == 1 or tiles >= fill
        assert plan.splits * plan.split_len >= n > (plan.splits - 1) * plan.split_len
        assert plan.partials == plan.splits <= attention_plan.MAX_PARTIALS
        assert attention_plan.tiles_shared_bytes(prob, plan.warps, plan.tile, False) <= attention_plan.SHARED_BYTES


def test_metal_source_is_well_formed(tmp_path):
    # syntax check of both passes as MLX would assemble them for Metal, against the stub of the
    # Metal names that the emulator tests keep (no Apple toolchain here)
    import subprocess

    from tqbridge.metal.emulator import find_compiler

    (tmp_path / "metal_stdlib").write_text(METAL_STUB)
    for kf, vf, qtype in [("q8_0", "turbo3", 0), ("turbo4@g64", "q5_1", 1), ("f16", "bf16", 2)]:
        q = np.zeros((1, 4, 128), np.float32)
        kb = bridge.quantize(kf, np.zeros((1, 1, 8, 128)))
        vb = bridge.quantize(vf, np.zeros((1, 1, 8, 128)))
        prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=8)
        for kernel in KERNELS:
            try:
                plan = attention_plan.make_plan(prob, "metal", kernel=kernel)
            except AttentionError:   # int8-mma refuses some pairs (f16 K): tiles serves them
                assert kernel == "int8-mma"
                continue
            for dyn in ((False,) if kernel == "int8-mma" else (False, True)):   # int8-mma has no format-generic build
                statics = attention_build.static_params(prob, plan, qtype, dyn)[:2]
                for kern, static in zip(attention_build.kernel_defs(qtype, plan.kernel), statics):
                    src = tmp_path / f"{kern.name}.cpp"
                    src.write_text(metal_as_cpp(kern, static))
                    proc = subprocess.run([find_compiler(), "-std=c++17", "-fsyntax-only", "-w", "-I", str(tmp_path),
                                           str(src)], capture_output=True, text=True)
                    assert proc.returncode == 0, f"{kern.name} ({kf}, {vf}, dyn={dyn}):\n{proc.stderr[:2000]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf,vf,d,rot", [("q8_0", "turbo3", 128, (128, 0)), ("q4_0", "q8_0", 64, (64, 64)),
                                         ("q5_1", "iq4_nl", 256, (256, 64)), ("q8_0", "q4_0", 128, (128, 64)),
                                         ("f16", "q4_1", 96, (32, 32))])
def test_llama_rotation_inside_the_kernel(kf, vf, d, rot, backend):
    # caches holding llama.cpp's rotated rows H.k / H.v: the kernel rotates q in and the output back
    rng = np.random.default_rng(11)
    B, Hkv, G, L = 1, 2, 4, 77
    k = value_rows(rng, "normal", (B, Hkv, L, d), 1.0)
    v = value_rows(rng, "normal", (B, Hkv, L, d), 1.0)
    from tqbridge.metal.kv_append import hadamard_butterfly

    kb = bridge.quantize(kf, pad_rows(kf, hadamard_butterfly(k, rot[0])))
    vb = bridge.quantize(vf, pad_rows(vf, hadamard_butterfly(v, rot[1])))
    q = rng.standard_normal((B, Hkv * G, d)).astype(np.float32)
    got = _check(backend, q, kb, vb, k_format=kf, v_format=vf, length=L, rotation=rot)
    # the same attention as over the unrotated rows (up to the quantization of rotated vs plain rows)
    plain = decode_attention(q, bridge.quantize("f32", k), bridge.quantize("f32", v), k_format="f32",
                             v_format="f32", length=L, backend="reference")
    assert np.abs(got - plain).max() < 0.2


def test_rotation_is_validated():
    q = np.zeros((1, 2, 128), np.float32)
    kb = np.zeros((1, 2, 4, 136), np.uint8)
    vb = np.zeros((1, 2, 4, 50), np.uint8)
    with pytest.raises(AttentionError, match="rotates inside its format"):
        decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3", length=4, rotation=(128, 64))
    with pytest.raises(AttentionError, match="power of two"):
        decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3", length=4, rotation=(96, 0))


@pytest.mark.parametrize("splits,length,v_format,sinks", [(1, 40, "q8_0", False), (64, 320, "turbo3", False),
                                                          (65, 325, "q4_0", True), (128, 256, "turbo3", False),
                                                          (129, 258, "q8_0", True), (300, 600, "turbo3", True)])
def test_combine_merges_any_number_of_partials(splits, length, v_format, sinks):
    """The combine pass holds up to 64 partial outputs per thread in registers and one (max, sum) pair
    per thread (256 threads); beyond either the rest is looped over. Around both limits (128 = 2 groups
    x 64 for 128-value rows; 300 > 256 pairs; every split holds keys) the merged rows stay within the
    oracle's bound."""
    rng = np.random.default_rng(splits)
    kb = quantized_cache(rng, "q8_0", (1, 1, length, 128))
    vb = quantized_cache(rng, v_format, (1, 1, length, 128))
    q = rng.standard_normal((1, 2, 128)).astype(np.float32)
    kw = dict(k_format="q8_0", v_format=v_format, length=length, kernel="tiles", splits=splits)
    if sinks:
        kw["sinks"] = rng.standard_normal(2).astype(np.float32)
    _check("cpu-emulator", q, kb, vb, **kw)
    assert last_run()["splits"] == splits and length % splits == 0


_ROT_BODY = """
const uint tid = tq_tid;
const int n = 32 * P_VPL;
const int group = (int)params[0];
const float scale = tq_as_float(params[1]);
TQ_SHARED_ARRAY(float, xa, 256);
TQ_SHARED_ARRAY(float, xb, 256);
for (int i = (int)tid; i < n; i += 64) { xa[i] = xs[i]; xb[i] = xs[i]; }
tq_barrier();
tqa_rotate(xa, n, group, tabs, tabs + 256, scale, tid, 64u);
if (tid < 32u) tqa_rotate_simd<P_VPL>(xb, group, tabs, tabs + 256, scale, tid);
tq_barrier();
for (int i = (int)tid; i < n; i += 64) { a[i] = xa[i]; b[i] = xb[i]; }
"""


def _rotate_probe():
    from tqbridge.metal.kernel import KERNEL_DIR, Kernel

    return Kernel("tq_rotate_probe", (("xs", "float32"), ("tabs", "float32"), ("params", "uint32")),
                  (("a", "float32"), ("b", "float32")), _ROT_BODY, (KERNEL_DIR / "attention_kernel.h").read_text())


def _rotate_inputs(rng, vpl: int, group: int):
    n = 32 * vpl
    x = (rng.standard_normal(n) * rng.choice([1e-30, 1.0, 1e20], n)).astype(np.float32)
    x[:3] = [np.inf if group < n else 7.0, -0.0, 1e-40]   # an infinity (its group only), a signed zero, a subnormal
    tabs = np.zeros(512, np.float32)
    tabs[:group] = rng.choice([-1.0, 1.0], group) * rng.uniform(0.5, 2.0, group)
    tabs[256:256 + group] = rng.choice([-1.0, 1.0], group)
    params = np.array([group, np.float32(1.0 / np.sqrt(group)).view(np.uint32)], np.uint32)
    return n, x, tabs, params


@pytest.mark.parametrize("vpl,group", [(1, 32), (1, 8), (2, 64), (2, 16), (4, 128), (4, 64), (4, 32), (8, 256),
                                       (8, 128), (8, 2)])
def test_rotate_simd_is_tqa_rotate_bit_for_bit(vpl, group):
    """tqa_rotate_simd (one SIMD group, values in registers, shuffles across lanes) gives the bits of
    tqa_rotate (the threadgroup in threadgroup memory) for every row width and rotation group the
    combine pass uses it for, on the emulator (the CUDA twin: test_rotate_simd_on_cuda)."""
    from tqbridge.metal.emulator import EmulatedKernel

    n, x, tabs, params = _rotate_inputs(np.random.default_rng(vpl * 1000 + group), vpl, group)
    a, b = EmulatedKernel(_rotate_probe(), {"P_VPL": vpl})([x, tabs, params], [(n,), (n,)], (1, 1, 1), 64)
    a, b = np.asarray(a), np.asarray(b)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.isfinite(a[3:]).any() and not np.array_equal(a, x)   # it rotated something


@pytest.mark.gpu
@pytest.mark.skipif(GPU != "cuda", reason="needs MLX's CUDA backend (the shuffle rotation against tqa_rotate there)")
@pytest.mark.parametrize("vpl,group", [(1, 32), (2, 64), (4, 128), (4, 32), (8, 256)])
def test_rotate_simd_on_cuda(vpl, group):
    import mlx.core as mx

    from tqbridge.metal.kernel import mlx_sources

    n, x, tabs, params = _rotate_inputs(np.random.default_rng(vpl * 1000 + group), vpl, group)
    src, hdr = mlx_sources(_rotate_probe(), "cuda", {"P_VPL": vpl})
    k = mx.fast.cuda_kernel(name=f"tq_rotate_probe_{vpl}", input_names=["xs", "tabs", "params"],
                            output_names=["a", "b"], source=src, header=hdr)
    a, b = k(inputs=[mx.array(x), mx.array(tabs), mx.array(params)], output_shapes=[(n,), (n,)],
             output_dtypes=[mx.float32] * 2, grid=(64, 1, 1), threadgroup=(64, 1, 1))
    assert np.array_equal(np.array(a).view(np.uint32), np.array(b).view(np.uint32))
