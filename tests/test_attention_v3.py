"""Kernel v3 (matrix fragments, int8 q): its primitives against their written layouts, the kernel
against the int8 oracle (exact integer block dots, binary16 rounding bounded), its refusals, and
the oracle's own pieces against ggml's codecs. Emulator in CI; the same tests on a GPU (gpu marker).
"""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge import legacy_fields
from tqbridge.metal import attention_kernel
from tqbridge.metal.attention import AttentionError, check_problem, decode_attention, last_run
from tqbridge.metal.attention_ref import oracle, quantize_q8
from tqbridge.metal.emulator import EmulatedKernel
from tqbridge.metal.kernel import KERNEL_DIR, Kernel
from test_attention_kernel import BACKENDS, GPU, _cache   # the same backends and caches as kernels v1 / v2


# ----------------------------------------------------------------------------- the primitives

_PRIM_BODY = """
const uint lane = tq_lane;
const uint* a = ain + lane * 4u;
const uint* bb = bin + lane * 2u;
int c[4] = {0, 0, 0, 0};
tq_mma_s8(c, a[0], a[1], a[2], a[3], bb[0], bb[1], lane);
float f[4] = {0.5f, -1.0f, 0.0f, 2.0f};
tq_mma_f16(f, hin[lane * 4u], hin[lane * 4u + 1u], hin[lane * 4u + 2u], hin[lane * 4u + 3u],
           hbin[lane * 2u], hbin[lane * 2u + 1u], lane);
const uint t = tq_movmatrix_t(hin[lane * 4u], lane);
for (int i = 0; i < 4; ++i) { ci[lane * 4u + i] = c[i]; cf[lane * 4u + i] = f[i]; }
mt[lane] = t;
"""


def _prim_kernel():
    header = (KERNEL_DIR / "attention_mma.h").read_text()
    return Kernel("tq_mma_probe", (("ain", "uint32"), ("bin", "uint32"), ("hin", "uint32"), ("hbin", "uint32")),
                  (("ci", "int32"), ("cf", "float32"), ("mt", "uint32")), _PRIM_BODY, header)


def _fragments(rng):
    """Random A (16x32 int8), B (32x8 int8), Ah (16x16 f16), Bh (16x8 f16) and their per-lane
    fragments, written from the layouts stated in attention_mma.h."""
    A = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    B = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    Ah = rng.standard_normal((16, 16)).astype(np.float16)
    Bh = rng.standard_normal((16, 8)).astype(np.float16)
    ain = np.zeros((32, 4), np.uint32)
    bin_ = np.zeros((32, 2), np.uint32)
    hin = np.zeros((32, 4), np.uint32)
    hbin = np.zeros((32, 2), np.uint32)
    w4 = lambda v: np.frombuffer(np.ascontiguousarray(v, np.int8).tobytes(), np.uint32)[0]  # noqa: E731
    w2 = lambda v: np.frombuffer(np.ascontiguousarray(v, np.float16).tobytes(), np.uint32)[0]  # noqa: E731
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        ain[lane] = [w4(A[g, 4 * t:4 * t + 4]), w4(A[g + 8, 4 * t:4 * t + 4]), w4(A[g, 4 * t + 16:4 * t + 20]),
                     w4(A[g + 8, 4 * t + 16:4 * t + 20])]
        bin_[lane] = [w4(B[4 * t:4 * t + 4, g]), w4(B[4 * t + 16:4 * t + 20, g])]
        hin[lane] = [w2(Ah[g, 2 * t:2 * t + 2]), w2(Ah[g + 8, 2 * t:2 * t + 2]), w2(Ah[g, 2 * t + 8:2 * t + 10]),
                     w2(Ah[g + 8, 2 * t + 8:2 * t + 10])]
        hbin[lane] = [w2(Bh[2 * t:2 * t + 2, g]), w2(Bh[2 * t + 8:2 * t + 10, g])]
    return A, B, Ah, Bh, ain, bin_, hin, hbin


def _check_prims(ci, cf, mt, A, B, Ah, Bh, hin):
    C = A.astype(np.int64) @ B.astype(np.int64)
    Ch = Ah.astype(np.float64) @ Bh.astype(np.float64)
    init = [0.5, -1.0, 0.0, 2.0]   # the accumulators' starting values in the probe kernel
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        want = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
        assert list(ci[lane]) == want, f"int8 product, lane {lane}"
        wf = np.array([Ch[g, 2 * t], Ch[g, 2 * t + 1], Ch[g + 8, 2 * t], Ch[g + 8, 2 * t + 1]]) + init
        # 16 exact products summed in float32: at most 17 roundings of the running sum
        tol = 17 * 2.0 ** -24 * (np.abs(Ah.astype(np.float64)) @ np.abs(Bh.astype(np.float64))).max() + 1e-30
        assert np.allclose(cf[lane], wf, rtol=0, atol=tol + 2.0 ** -22), f"f16 product, lane {lane}"
        # movmatrix: lane (g, t) holds M[2t][g], M[2t+1][g] of M[r][c] = half (c & 1) of hin[4r + c/2][0]
        M = hin[:, 0].copy().view(np.uint16).reshape(32, 2)   # lane -> 2 halves
        lo = M[4 * (2 * t) + g // 2, g & 1]
        hi = M[4 * (2 * t + 1) + g // 2, g & 1]
        assert int(mt[lane]) == int(lo) | (int(hi) << 16), f"movmatrix, lane {lane}"


def test_fragment_primitives_on_the_emulator():
    A, B, Ah, Bh, ain, bin_, hin, hbin = _fragments(np.random.default_rng(3))
    k = EmulatedKernel(_prim_kernel(), {})
    ci, cf, mt = k([ain.reshape(-1), bin_.reshape(-1), hin.reshape(-1), hbin.reshape(-1)],
                   [(32, 4), (32, 4), (32,)], (1, 1, 1), 32)
    _check_prims(ci.view(np.int32), cf, mt, A, B, Ah, Bh, hin)


@pytest.mark.gpu
@pytest.mark.skipif(GPU != "cuda", reason="needs MLX's CUDA backend (the tensor-core versions are CUDA's)")
@pytest.mark.parametrize("generic", [False, True], ids=["ptx", "generic"])
def test_fragment_primitives_on_cuda(generic):
    import mlx.core as mx

    from tqbridge.metal.kernel import mlx_sources

    A, B, Ah, Bh, ain, bin_, hin, hbin = _fragments(np.random.default_rng(4))
    kd = _prim_kernel()
    static = {"TQ_MMA_GENERIC": 1} if generic else {}
    src, hdr = mlx_sources(kd, "cuda", static)
    k = mx.fast.cuda_kernel(name=f"tq_mma_probe_{int(generic)}", input_names=[n for n, _ in kd.inputs],
                            output_names=[n for n, _ in kd.outputs], source=src, header=hdr)
    ci, cf, mt = k(inputs=[mx.array(a.reshape(-1)) for a in (ain, bin_, hin, hbin)],
                   output_shapes=[(32, 4), (32, 4), (32,)], output_dtypes=[mx.int32, mx.float32, mx.uint32],
                   grid=(32, 1, 1), threadgroup=(32, 1, 1))
    _check_prims(np.array(ci), np.array(cf), np.array(mt), A, B, Ah, Bh, hin)


# ----------------------------------------------------------------------------- the oracle's pieces


@pytest.mark.parametrize("seed", range(3))
def test_int8_q_is_ggml_q8_0(seed):
    """The oracle's q8_0 of q gives the same d and codes as the bridge's q8_0 codec (byte-exact
    with ggml's quantize_row_q8_0_ref), ties included."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((64, 128)) * rng.choice([1e-3, 1.0, 300.0], (64, 1))).astype(np.float32)
    x[0, :32] = np.arange(32) - 15.5          # exact .5 ties after scaling by 127 / 16.5 are rare: add a few
    x[1, :32] = 0.0                           # an all-zero block: d = 0
    codes, d, _ = quantize_q8(x, False)
    parts = legacy_fields.split_blocks("q8_0", bridge.quantize("q8_0", x).reshape(-1, 34))
    assert np.array_equal(codes.reshape(-1, 32), parts["q"].astype(np.int64))
    assert np.array_equal(d.reshape(-1), parts["d"].astype(np.float64))


# ----------------------------------------------------------------------------- the kernel


def _check_v3(backend, q, kb, vb, **kw):
    opts = {k: kw.pop(k) for k in ("splits", "warps", "tile", "seed") if k in kw}
    got = decode_attention(q, kb, vb, backend=backend, q_precision="int8", **kw, **opts)
    run = last_run()
    assert run["backend"] == backend and run["kernel"] == "v3" and run["q_precision"] == "int8"
    import os

    fused = os.environ.get("TQBRIDGE_V3_DISPATCHES") == "1" and backend in attention_kernel.V3_FUSED_BACKENDS
    assert run["dispatches"] == (1 if fused else 2)
    prob = check_problem(q, kb, vb, **kw)
    want, bound = oracle(q, kb, vb, prob, kw.get("sinks"), chain=run["chain"], q_precision="int8")
    if prob.squeeze_rows:
        want, bound = want[:, :, 0], bound[:, :, 0]
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all()
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"
    return got, want, bound


V_FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "turbo2", "turbo3", "turbo4", "turbo4@g64", "f16"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf", attention_kernel.V3_K_FORMATS)
def test_every_k_format(backend, kf):
    rng = np.random.default_rng(hash(kf) % 2**32)
    for vf in (V_FORMATS if backend != "cpu-emulator" else ["q8_0", "turbo3"]):
        d = 128
        q = rng.standard_normal((1, 8, d)).astype(np.float32)
        kb, vb = _cache(rng, kf, (1, 2, 150, d)), _cache(rng, vf, (1, 2, 150, d))
        _check_v3(backend, q, kb, vb, k_format=kf, v_format=vf, length=143)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vf", V_FORMATS)
def test_every_v_format(backend, vf):
    rng = np.random.default_rng(hash(vf) % 2**32)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    kb, vb = _cache(rng, "q8_0", (2, 1, 90, 64)), _cache(rng, vf, (2, 1, 90, 64))
    _check_v3(backend, q, kb, vb, k_format="q8_0", v_format=vf, length=[90, 37])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [
    dict(g=8, t=1, length=0), dict(g=1, t=1, length=1), dict(g=2, t=4, length=33, window=9),
    dict(g=4, t=2, length=300, softcap=5.0), dict(g=6, t=1, length=257, sinks=True),
    dict(g=3, t=1, length=129, rotation=(64, 0)), dict(g=4, t=1, length=200, kind="outliers", splits=3),
], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_shapes_and_options(backend, case):
    c = dict(case)
    rng = np.random.default_rng(len(str(c)))
    g, t, n = c.pop("g"), c.pop("t"), c.pop("length")
    kind = c.pop("kind", "normal")
    hkv, d = 2, 128 if "rotation" not in c else 64
    q = (rng.standard_normal((1, hkv * g, t, d)) * 2).astype(np.float32)
    kb, vb = _cache(rng, "q4_0", (1, hkv, max(n, 1) + 7, d), kind), _cache(rng, "turbo3", (1, hkv, max(n, 1) + 7, d))
    if c.pop("sinks", False):
        c["sinks"] = rng.standard_normal(hkv * g).astype(np.float32)
    opts = {k: c.pop(k) for k in ("splits",) if k in c}
    _check_v3(backend, q, kb, vb, k_format="q4_0", v_format="turbo3", length=n, **c, **opts)


def test_refusals_name_the_reason():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    f16 = _cache(rng, "f16", (1, 1, 8, 64))
    q8 = _cache(rng, "q8_0", (1, 1, 8, 64))
    with pytest.raises(AttentionError, match="int8 codes"):
        decode_attention(q, f16, q8, k_format="f16", v_format="q8_0", length=8, q_precision="int8")
    with pytest.raises(AttentionError, match="binary16"):
        decode_attention(q, q8, _cache(rng, "f32", (1, 1, 8, 64)), k_format="q8_0", v_format="f32", length=8,
                         q_precision="int8")
    q16 = rng.standard_normal((1, 16, 64)).astype(np.float32)
    with pytest.raises(AttentionError, match="at most 8 query rows"):
        decode_attention(q16, q8, q8, k_format="q8_0", v_format="q8_0", length=8, q_precision="int8")
    with pytest.raises(AttentionError, match="q_precision='exact'"):
        decode_attention(q, q8, q8, k_format="q8_0", v_format="q8_0", length=8, q_precision="exact", kernel="v3")
    with pytest.raises(AttentionError, match="q_precision must be"):
        decode_attention(q, q8, q8, k_format="q8_0", v_format="q8_0", length=8, q_precision="fp8")


def test_the_int8_verdict_can_fail():
    """A kernel that keeps q exact (v2) is not the int8 arithmetic: the int8 oracle's bound rejects
    it on plain data, so the bound is tight enough to see the quantization of q."""
    rng = np.random.default_rng(11)
    q = (rng.standard_normal((1, 8, 128)) * 3).astype(np.float32)
    kb, vb = _cache(rng, "q8_0", (1, 2, 64, 128)), _cache(rng, "q8_0", (1, 2, 64, 128))
    got = decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=64, backend="cpu-emulator",
                           q_precision="exact")
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="q8_0", length=64)
    want, bound = oracle(q, kb, vb, prob, chain=last_run()["chain"], q_precision="int8")
    assert (np.abs(got - want[:, :, 0]) > bound[:, :, 0]).any()


def test_reference_path_takes_int8_q():
    """The MLX-ops reference with q_precision='int8' is the same arithmetic up to float32 order."""
    pytest.importorskip("mlx.core")
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 128)).astype(np.float32)
    kb, vb = _cache(rng, "q4_0", (1, 1, 100, 128)), _cache(rng, "q8_0", (1, 1, 100, 128))
    ref = decode_attention(q, kb, vb, k_format="q4_0", v_format="q8_0", length=100, backend="reference",
                           q_precision="int8")
    prob = check_problem(q, kb, vb, k_format="q4_0", v_format="q8_0", length=100)
    want, bound = oracle(q, kb, vb, prob, q_precision="int8")
    assert (np.abs(np.asarray(ref, np.float64) - want[:, :, 0]) <= bound[:, :, 0]).all()
    exact = decode_attention(q, kb, vb, k_format="q4_0", v_format="q8_0", length=100, backend="reference")
    assert not np.array_equal(np.asarray(ref), np.asarray(exact))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("q4_1", "q8_0")])
def test_head_dims(backend, d, kf, vf):
    """Rows whose byte length is not a multiple of 4 (q8_0 at 96 values), wide rows (fewer SIMD
    groups where the merge area would not fit), V rows padded to the turbo group."""
    rng = np.random.default_rng(d)
    q = rng.standard_normal((1, 6, d)).astype(np.float32)
    kb, vb = _cache(rng, kf, (1, 2, 70, d)), _cache(rng, vf, (1, 2, 70, d))
    if vb.shape[-1] // bridge.get_format(vf).type_size * bridge.get_format(vf).block_size % 64:
        with pytest.raises(AttentionError, match="V rows of 64k values"):   # v2 serves these rows
            _check_v3(backend, q, kb, vb, k_format=kf, v_format=vf, length=67)
        return
    _check_v3(backend, q, kb, vb, k_format=kf, v_format=vf, length=67)


def test_single_dispatch_merges_many_splits(monkeypatch):
    """TQBRIDGE_V3_DISPATCHES=1: the last threadgroup of each head merges every split (here 9 per
    head, 2 heads, 2 batch rows of different lengths, sinks): the output must equal the oracle's
    whatever order the emulator runs the threadgroups in, and the ticket counters come back to 0."""
    monkeypatch.setenv("TQBRIDGE_V3_DISPATCHES", "1")
    attention_kernel._plan_cached.cache_clear()
    try:
        rng = np.random.default_rng(22)
        q = rng.standard_normal((2, 8, 128)).astype(np.float32)
        kb, vb = _cache(rng, "q5_0", (2, 2, 300, 128)), _cache(rng, "turbo4", (2, 2, 300, 128))
        sinks = rng.standard_normal(8).astype(np.float32)
        for seed in (1, 2):
            _check_v3("cpu-emulator", q, kb, vb, k_format="q5_0", v_format="turbo4", length=[300, 211], sinks=sinks,
                      splits=9, seed=seed)
            assert last_run()["dispatches"] == 1
        q1 = rng.standard_normal((1, 4, 64)).astype(np.float32)
        kb1, vb1 = _cache(rng, "q8_0", (1, 1, 80, 64)), _cache(rng, "q8_0", (1, 1, 80, 64))
        _check_v3("cpu-emulator", q1, kb1, vb1, k_format="q8_0", v_format="q8_0", length=80, splits=1)
    finally:
        attention_kernel._plan_cached.cache_clear()


def test_default_q_precision_per_backend(monkeypatch):
    """CUDA decodes with int8 q (kernel v3) where v3 serves the problem, v2 elsewhere; the emulator
    and Metal keep q exact; TQBRIDGE_Q_PRECISION overrides."""
    from tqbridge.metal.attention_kernel import resolve_kernel

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    q8, t3, f16 = (_cache(rng, f, (1, 2, 8, 128)) for f in ("q8_0", "turbo3", "f16"))
    good = check_problem(q, q8, t3, k_format="q8_0", v_format="turbo3", length=8)
    f16k = check_problem(q, f16, t3, k_format="f16", v_format="turbo3", length=8)
    monkeypatch.delenv("TQBRIDGE_Q_PRECISION", raising=False)
    assert resolve_kernel(good, "cuda", None, None) == "v3"
    assert resolve_kernel(f16k, "cuda", None, None) is None              # v2 (or v1) with exact q
    assert resolve_kernel(good, "metal", None, None) is None
    assert resolve_kernel(good, "cpu-emulator", None, None) is None
    assert resolve_kernel(good, "cuda", "v2", None) == "v2"               # an explicit kernel wins
    q8q8 = check_problem(q, q8, q8, k_format="q8_0", v_format="q8_0", length=8)
    assert resolve_kernel(q8q8, "cuda", None, None) is None               # 8-bit V: kept for fidelity, exact q
    assert resolve_kernel(q8q8, "cuda", None, "int8") == "v3"
    monkeypatch.setenv("TQBRIDGE_Q_PRECISION", "exact")
    assert resolve_kernel(good, "cuda", None, None) is None
    monkeypatch.setenv("TQBRIDGE_Q_PRECISION", "int8")
    assert resolve_kernel(good, "cpu-emulator", None, None) == "v3"


def test_fuzz_claim_judges_int8_runs_with_the_int8_oracle(monkeypatch):
    """`tqbridge fuzz decode-attention` checks whatever the backend ran: with int8 q (the CUDA
    default) the claim's oracle takes q_precision from the run, so v3 is not reported as a failure,
    and an exact run keeps the exact oracle."""
    pytest.importorskip("hypothesis")
    from tqbridge.parity.plugin.byok import fuzz_kernel
    from tqbridge.parity.plugin.fuzz import our_target

    fn, claim = our_target("decode-attention", "cpu-emulator")
    monkeypatch.setenv("TQBRIDGE_Q_PRECISION", "int8")
    attention_kernel._plan_cached.cache_clear()
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    kb, vb = _cache(rng, "q8_0", (1, 1, 50, 64)), _cache(rng, "q8_0", (1, 1, 50, 64))
    fn(q, kb, vb, k_format="q8_0", v_format="q8_0", length=50)
    assert claim.q_precision() == "int8" and last_run()["kernel"] == "v3"
    r = fuzz_kernel(fn, "decode-attention", k_format="q8_0", v_format="turbo3", max_examples=12, derandomize=True,
                    chain=claim.chain, q_precision=claim.q_precision)
    assert r.failure is None and r.examples > 0, r
    # the same runs judged by the exact oracle fail: the claim's q precision is what keeps it honest
    wrong = fuzz_kernel(fn, "decode-attention", k_format="q8_0", v_format="q8_0", max_examples=12, derandomize=True,
                        chain=claim.chain, q_precision=lambda: "exact")
    assert wrong.failure is not None
    monkeypatch.setenv("TQBRIDGE_Q_PRECISION", "exact")
    fn(q, kb, vb, k_format="q8_0", v_format="q8_0", length=50)
    assert claim.q_precision() == "exact"
    attention_kernel._plan_cached.cache_clear()
