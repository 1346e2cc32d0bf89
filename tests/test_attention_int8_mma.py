"""Kernel int8-mma (matrix fragments, int8 q): its primitives against their written layouts, the kernel
against the int8 oracle (exact integer block dots, binary16 rounding bounded), its refusals, and
the oracle's own pieces against ggml's codecs. Emulator in CI; the same tests on a GPU (gpu marker).
"""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge.blocks import legacy_fields
from tqbridge.metal import decode_options
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.attention import AttentionError, check_problem, decode_attention, last_run
from tqbridge.metal.attention.ref import oracle, quantize_q8
from tqbridge.metal.emulator import EmulatedKernel
from tqbridge.metal.kernel import KERNEL_DIR, Kernel
from helpers_kernels import check_int8_mma, quantized_cache
from test_attention_kernel import BACKENDS, GPU, seed_of   # the same backends as kernels lanes / tiles


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


_PERM_BODY = """
const uint lane = tq_lane;
perm[lane] = tq_byte_perm(pa[lane], pb[lane], ps[lane]);
hsum[lane] = tq_hadd2(pa[lane], pb[lane]);
hprod[lane] = tq_hmul2(pa[lane], pb[lane]);
"""


def _perm_kernel():
    header = (KERNEL_DIR / "attention_mma.h").read_text()
    return Kernel("tq_perm_probe", (("pa", "uint32"), ("pb", "uint32"), ("ps", "uint32")),
                  (("perm", "uint32"), ("hsum", "uint32"), ("hprod", "uint32")), _PERM_BODY, header)


def _perm_inputs(rng):
    """32 lanes of (a, b, selector): a and b two binary16 values each of magnitude 1..200 (their sums
    and products are exact in float32, so one rounding to binary16 is the correct one), selectors
    of random nibbles (bit 3: sign replication) with random upper bits (ignored)."""
    mag = rng.uniform(1, 200, (2, 32, 2)) * rng.choice([-1, 1], (2, 32, 2))
    h = mag.astype(np.float16).view(np.uint16).astype(np.uint32)
    a, b = h[0, :, 0] | (h[0, :, 1] << 16), h[1, :, 0] | (h[1, :, 1] << 16)
    nib = rng.integers(0, 16, (32, 4)).astype(np.uint32)   # bit 3: prmt's sign replication
    s = (nib[:, 0] | nib[:, 1] << 4 | nib[:, 2] << 8 | nib[:, 3] << 12
         | (rng.integers(0, 1 << 16, 32).astype(np.uint32) << 16))
    return a.astype(np.uint32), b.astype(np.uint32), s.astype(np.uint32), nib


def _check_perm(perm, hsum, hprod, a, b, nib):
    src = a.astype(np.uint64) | (b.astype(np.uint64) << 32)
    for lane in range(32):
        picked = [(int(src[lane]) >> (8 * (int(nib[lane, n]) & 7))) & 0xff for n in range(4)]
        picked = [(0xff if p & 0x80 else 0) if nib[lane, n] & 8 else p for n, p in enumerate(picked)]
        want = sum(p << (8 * n) for n, p in enumerate(picked))
        assert int(perm[lane]) == want, f"byte permute, lane {lane}"
        ha = np.array([a[lane] & 0xffff, a[lane] >> 16], np.uint16).view(np.float16).astype(np.float32)
        hb = np.array([b[lane] & 0xffff, b[lane] >> 16], np.uint16).view(np.float16).astype(np.float32)
        for got, exact in ((hsum, ha + hb), (hprod, ha * hb)):
            w = exact.astype(np.float16).view(np.uint16).astype(np.uint32)
            assert int(got[lane]) == int(w[0] | (w[1] << 16)), f"binary16 pair op, lane {lane}"


def test_byte_permute_and_half_pairs_on_the_emulator():
    a, b, s, nib = _perm_inputs(np.random.default_rng(8))
    perm, hsum, hprod = EmulatedKernel(_perm_kernel(), {})([a, b, s], [(32,), (32,), (32,)], (1, 1, 1), 32)
    _check_perm(perm, hsum, hprod, a, b, nib)


@pytest.mark.gpu
@pytest.mark.skipif(GPU != "cuda", reason="needs MLX's CUDA backend (prmt, f16x2 arithmetic)")
def test_byte_permute_and_half_pairs_on_cuda():
    import mlx.core as mx

    from tqbridge.metal.kernel import mlx_sources

    a, b, s, nib = _perm_inputs(np.random.default_rng(9))
    kd = _perm_kernel()
    src, hdr = mlx_sources(kd, "cuda", {})
    k = mx.fast.cuda_kernel(name="tq_perm_probe", input_names=[n for n, _ in kd.inputs],
                            output_names=[n for n, _ in kd.outputs], source=src, header=hdr)
    outs = k(inputs=[mx.array(x) for x in (a, b, s)], output_shapes=[(32,)] * 3, output_dtypes=[mx.uint32] * 3,
             grid=(32, 1, 1), threadgroup=(32, 1, 1))
    _check_perm(*[np.array(o) for o in outs], a, b, nib)


_EXP2_BODY = """
const uint lane = tq_lane;
const float x = tq_as_float(xs[lane]);
ftz[lane] = tq_as_uint(tq_exp2_ftz(x));
full[lane] = tq_as_uint(tq_exp2(x));
"""
# arguments around binary32's normal limit (2^-126), the softmax's masked score (-3e38), and ordinary ones
_EXP2_X = np.array([0.0, -1.0, 3.5, -0.3, -20.25, -125.0, -125.9, -126.0, -126.01, -126.5, -127.0, -130.0,
                    -149.0, -150.0, -200.0, -3.0e38] + list(np.linspace(-140.0, 10.0, 16)), np.float32)


def _exp2_kernel():
    header = (KERNEL_DIR / "attention_mma.h").read_text()
    return Kernel("tq_exp2_probe", (("xs", "uint32"),), (("ftz", "uint32"), ("full", "uint32")), _EXP2_BODY, header)


def _check_exp2(ftz, full):
    """tq_exp2_ftz is the backend's exp2 bit for bit wherever that is a normal number (>= 2^-126),
    and exactly +0 below it (where the backend's exp2 gives a subnormal or 0)."""
    f = full.view(np.float32)
    normal = f >= np.float32(2.0 ** -126)
    assert normal.sum() >= 10 and (~normal).sum() >= 8   # both sides of the limit are probed
    assert np.array_equal(ftz[normal], full[normal]), _EXP2_X[normal][ftz[normal] != full[normal]]
    assert np.all(ftz[~normal] == 0), _EXP2_X[~normal][ftz[~normal] != 0]
    assert f[0] == 1.0 and f[1] == 0.5


def test_exp2_ftz_on_the_emulator():
    ftz, full = EmulatedKernel(_exp2_kernel(), {})([_EXP2_X.view(np.uint32)], [(32,), (32,)], (1, 1, 1), 32)
    _check_exp2(np.asarray(ftz), np.asarray(full))


@pytest.mark.gpu
@pytest.mark.skipif(GPU != "cuda", reason="needs MLX's CUDA backend (ex2.approx.ftz against exp2f)")
def test_exp2_ftz_on_cuda():
    import mlx.core as mx

    from tqbridge.metal.kernel import mlx_sources

    kd = _exp2_kernel()
    src, hdr = mlx_sources(kd, "cuda", {})
    k = mx.fast.cuda_kernel(name="tq_exp2_probe", input_names=["xs"], output_names=["ftz", "full"], source=src,
                            header=hdr)
    ftz, full = k(inputs=[mx.array(_EXP2_X.view(np.uint32))], output_shapes=[(32,)] * 2,
                  output_dtypes=[mx.uint32] * 2, grid=(32, 1, 1), threadgroup=(32, 1, 1))
    _check_exp2(np.array(ftz), np.array(full))


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


V_FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "turbo2", "turbo3", "turbo4", "turbo4@g64", "f16"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf", attention_plan.INT8_MMA_K_FORMATS)
def test_every_k_format(backend, kf):
    rng = np.random.default_rng(seed_of(kf))
    for vf in (V_FORMATS if backend != "cpu-emulator" else ["q8_0", "turbo3"]):
        d = 128
        q = rng.standard_normal((1, 8, d)).astype(np.float32)
        kb, vb = quantized_cache(rng, kf, (1, 2, 150, d)), quantized_cache(rng, vf, (1, 2, 150, d))
        check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=143)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vf", V_FORMATS)
def test_every_v_format(backend, vf):
    rng = np.random.default_rng(seed_of(vf))
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (2, 1, 90, 64)), quantized_cache(rng, vf, (2, 1, 90, 64))
    check_int8_mma(backend, q, kb, vb, k_format="q8_0", v_format=vf, length=[90, 37])


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
    kb, vb = quantized_cache(rng, "q4_0", (1, hkv, max(n, 1) + 7, d), kind), quantized_cache(rng, "turbo3", (1, hkv, max(n, 1) + 7, d))
    if c.pop("sinks", False):
        c["sinks"] = rng.standard_normal(hkv * g).astype(np.float32)
    opts = {k: c.pop(k) for k in ("splits",) if k in c}
    check_int8_mma(backend, q, kb, vb, k_format="q4_0", v_format="turbo3", length=n, **c, **opts)


def test_refusals_name_the_reason():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    f16 = quantized_cache(rng, "f16", (1, 1, 8, 64))
    q8 = quantized_cache(rng, "q8_0", (1, 1, 8, 64))
    with pytest.raises(AttentionError, match="int8 codes"):
        decode_attention(q, f16, q8, k_format="f16", v_format="q8_0", length=8, q_precision="int8")
    with pytest.raises(AttentionError, match="binary16"):
        decode_attention(q, q8, quantized_cache(rng, "f32", (1, 1, 8, 64)), k_format="q8_0", v_format="f32", length=8,
                         q_precision="int8")
    q16 = rng.standard_normal((1, 16, 64)).astype(np.float32)
    with pytest.raises(AttentionError, match="at most 8 query rows"):
        decode_attention(q16, q8, q8, k_format="q8_0", v_format="q8_0", length=8, q_precision="int8")
    with pytest.raises(AttentionError, match="q_precision='exact'"):
        decode_attention(q, q8, q8, k_format="q8_0", v_format="q8_0", length=8, q_precision="exact", kernel="int8-mma")
    with pytest.raises(AttentionError, match="q_precision must be"):
        decode_attention(q, q8, q8, k_format="q8_0", v_format="q8_0", length=8, q_precision="fp8")


def test_the_int8_verdict_can_fail():
    """A kernel that keeps q exact (tiles) is not the int8 arithmetic: the int8 oracle's bound rejects
    it on plain data, so the bound is tight enough to see the quantization of q."""
    rng = np.random.default_rng(11)
    q = (rng.standard_normal((1, 8, 128)) * 3).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 2, 64, 128)), quantized_cache(rng, "q8_0", (1, 2, 64, 128))
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
    kb, vb = quantized_cache(rng, "q4_0", (1, 1, 100, 128)), quantized_cache(rng, "q8_0", (1, 1, 100, 128))
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
    kb, vb = quantized_cache(rng, kf, (1, 2, 70, d)), quantized_cache(rng, vf, (1, 2, 70, d))
    if vb.shape[-1] // bridge.get_format(vf).type_size * bridge.get_format(vf).block_size % 64:
        with pytest.raises(AttentionError, match="V rows of 64k values"):   # tiles serves these rows
            check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=67)
        return
    check_int8_mma(backend, q, kb, vb, k_format=kf, v_format=vf, length=67)


def test_default_q_precision_per_backend():
    """CUDA decodes with int8 q (kernel int8-mma) where int8-mma serves the problem and V has fewer than 8 bits,
    tiles elsewhere; the emulator and Metal keep q exact; an explicit q precision wins everywhere."""
    from tqbridge.metal.attention.plan import resolve_kernel

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    q8, t3, f16 = (quantized_cache(rng, f, (1, 2, 8, 128)) for f in ("q8_0", "turbo3", "f16"))
    good = check_problem(q, q8, t3, k_format="q8_0", v_format="turbo3", length=8)
    f16k = check_problem(q, f16, t3, k_format="f16", v_format="turbo3", length=8)
    assert resolve_kernel(good, "cuda", None, None) == "int8-mma"
    assert resolve_kernel(f16k, "cuda", None, None) is None              # tiles (or lanes) with exact q
    assert resolve_kernel(good, "metal", None, None) is None
    assert resolve_kernel(good, "cpu-emulator", None, None) is None
    assert resolve_kernel(good, "cuda", "tiles", None) == "tiles"               # an explicit kernel wins
    q8q8 = check_problem(q, q8, q8, k_format="q8_0", v_format="q8_0", length=8)
    assert resolve_kernel(q8q8, "cuda", None, None) is None               # 8-bit V: kept for fidelity, exact q
    assert resolve_kernel(q8q8, "cuda", None, "int8") == "int8-mma"
    assert resolve_kernel(good, "cuda", None, "exact") is None
    assert resolve_kernel(good, "cpu-emulator", None, "int8") == "int8-mma"
    with pytest.raises(AttentionError, match="int8"):   # explicit int8 where int8-mma cannot serve: refused, not exact
        resolve_kernel(f16k, "cuda", None, "int8")


def test_fuzz_claim_judges_int8_runs_with_the_int8_oracle(monkeypatch):
    """`tqbridge fuzz decode-attention` checks whatever the backend ran: with int8 q (the CUDA
    default) the claim's oracle takes q_precision from the run, so int8-mma is not reported as a failure,
    and an exact run keeps the exact oracle."""
    pytest.importorskip("hypothesis")
    from tqbridge.parity.plugin.byok import fuzz_kernel
    from tqbridge.parity.plugin.fuzz import our_target

    fn, claim = our_target("decode-attention", "cpu-emulator")
    # the emulator as a backend whose default is int8 (CUDA's table entry): what ran decides the oracle
    monkeypatch.setitem(decode_options.DEFAULT_Q_PRECISION, "cpu-emulator", "int8")
    attention_kernel.clear_launch_caches()
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    kb, vb = quantized_cache(rng, "q8_0", (1, 1, 50, 64)), quantized_cache(rng, "turbo3", (1, 1, 50, 64))
    fn(q, kb, vb, k_format="q8_0", v_format="turbo3", length=50)
    assert claim.q_precision() == "int8" and last_run()["kernel"] == "int8-mma"
    r = fuzz_kernel(fn, "decode-attention", k_format="q8_0", v_format="turbo3", max_examples=12, derandomize=True,
                    chain=claim.chain, q_precision=claim.q_precision)
    assert r.failure is None and r.examples > 0, r
    # the same runs judged by the exact oracle fail: the claim's q precision is what keeps it honest
    wrong = fuzz_kernel(fn, "decode-attention", k_format="q8_0", v_format="turbo3", max_examples=12, derandomize=True,
                        chain=claim.chain, q_precision=lambda: "exact")
    assert wrong.failure is not None
    monkeypatch.setitem(decode_options.DEFAULT_Q_PRECISION, "cpu-emulator", "exact")
    attention_kernel.clear_launch_caches()
    fn(q, kb, vb, k_format="q8_0", v_format="turbo3", length=50)
    assert claim.q_precision() == "exact"
    attention_kernel.clear_launch_caches()


# Found by the CUDA fuzz campaign of kernel int8-mma (int8 q forced; benchmarks/records/h200/2026-12-01-fuzz-v3-cuda-first.json),
# reproduced bit for bit on the emulator: q5_1 K / turbo2 V rows of tiny norm decode to binary16
# subnormals, whose rounding error is absolute (up to 2^-25), not relative; the oracle's int8 bound
# lacked that term (attention_ref.E16) and flagged 3% of a 2e-6 output.
TINY_V_NORM_CASE = (
    'eNqce3k0VeH39+Wa5yHzPERERELc81xThoRKKJmTMWNSKa4iMpc5madCCJnveUikZMpQpMhUKUOEzK/z/f1+f7xrvX+873vX'
    'sjj7PGs/+9n7s/dn73OPIHFvH/ETouKXnZ28LzvLO1y75ux1zc3bS1xOVPyKt99Vh2v++7etxX1V7I5ismsBfo7eSsT9Wx7y'
    'Pn5H1VXFbfalPg5+DlexhUHins5eLtdc9/88qrp/w9/JwdN5/8IrwNNz/zLQzeuydyB2E7vnfeWak4PPf9+9c4fB7BSeSh73'
    'Xx8xXBVD78zef3+ocQdwvke8fG5S4NhwJMn/WvI/vxNNzp82u0CBu44Lkr7s7O/kJ31CVFrzyjFpOVHpfTuv+Tl42Xn7XXbG'
    '5CcdPP2d9+X+rg4+zvvXh/YNOS4nekxOVP24jJzoHdH/9w+D+dt0+G4pExna1kavdzeB+0J/kCk3bxDO8ZEQDcXQip5qQue8'
    'PPKGvxQyU/4Gs1Vf0UeSEWA7cAaRe+gOmrVl0cKTPPDsjBD5spsnRK4otdSf2wUdDZZgOd0R5iZdAU8sxSHgHUW7vcXR8ued'
    'aMGgLgweb0aiv8QCMUMxqDuiBohytrDGJgJJq46Gb28FoE2cvmBQMRPqipugSpkH4WR2DGqoloAaGH4ANtrLwNxJB5IflIHY'
    '4DLEbfcfjC2vAQdtl5EzMe2wPYIKvtdygKGDlVCJ+z3y+vIL5EC0BjAvPwI5jzKAHi59IBKUjtCk1oMM+lBkuq8WPdY2BXVM'
    'ziMVFc7ApbYc5ryThJumHLDnjSr0WpJqkaMpgkkihkBPMQYeKlKBBgKjmv1CHMS5fHGQPNoKn1YYIvzylkCk1AP+83MBXz8M'
    'IpOPm4HuaQCCX27AI85WwM5kDqJtUui12g+QvoofFs20QhpbAO9wjKMusm6I8vnviOmKDYiYKwCnzsrCTOWfzacNhSFrYwFq'
    'iT5FFkgvkNyKZ4gSYyfsqhuESam+oMrNBrQ72SBmmZ3okDZEV4xPgKyHYTDogRzhoXlSU8DXGZQv/Dr5PgM96OYVB1xL1rCM'
    '+IgQjzKjsekHNPI/+aLC/tlAx84YVaowQlfSHFHVXSJ5cIqImhD8oJAbD0xvWyJERWWgqpVHyK4fm5AzpW+BU4YEMQuaoYzM'
    'yqC/hYE4yUADh4Y/I89PAPii3hROO35D77MWQoOPUahkJQe48KobsIueAcpy9DDojDn4rCkOb+0YIZ4HKaBMqQXCYRKFUFxo'
    'IvyOXkQnaWmBqdEDwia3JzJ8tQw4vZtF2m4Xw8j5UuTh1Qpg8DUHTNy4CTxu3AeCSXiw2PcNTs+NokjpCUQ/rQyWHqhBRWn1'
    'Qf/XEEiO3YR2HDRI861bSGuKOnK59yg0ON0JZh7moBRxdWBBN4bMXjNJjjATgCldHqDvpDawUxaGSas0LRMIC2B5K4Tcl/iJ'
    'TgxZguqNDrIHPw3MePIAxNoWE1gq/GH7hAaQ1VYF39xmETprA/QIqz4021SHvkMcxHexpUB9whlGfrsEf+Oiwdv35+DmtAXq'
    'L9oN7NezIdW1wyDluRD8a07Rco1mhLx3NIVwssMEBEZ8BpMvBpGgfRya+DYjTz27UMrDROAu1g96t66DWZdRZFlBDfz6rErM'
    'nO2AN0l1hDHhSSSrehsc4uKFirwl6N7dXMjQXwTwIydRn5sWkJ/bBgTa/kOrdP0g10kbRHLGAOQdbwWZ13AtfEefaJSlroEj'
    '/c4gUtwIbESQEOcz3gS5Iw2Q+wceJkMZyPOEEzC4UMK49VzkpJUgeIzjBru/H8E0eogWv/ACFy+pIwu4jwRUKQ/en6pDm5WG'
    'yIy7T8CH6kqI7zsLmGgDgOtpipat8Wp0OjYdRu51I6mFh9CwOFpijdcv8Oe2AZQX94cR7g5A5OpH5IaQL3h64BaM1W6FrieG'
    'EarP3DDd3w8FOipAidEKVDxRILC4X4FZT2TIhqg3qmLtgeB3tMAWkwMcpP8NdGoLoXFWDUSs9YDsRSGY3W0KHGwukf/iOyCF'
    'iAkwkkmHhvlL6JWxMGjZpww2+L4hXSoj5BeLwUB3EkEFGaPBAxkSYmNpg9qvzSKNnIvAwl6UOHE5Er39vQaxbGUEAuhpiGtL'
    'Rd6WDENe8wvg/k4GyFuoAAlBdmSFJDPUurMDWUg7C0u0DoJ1lmsoi60OFLy8jV4MqoJSKbGAuVsNMJksgdBzkuTRvSLEqccB'
    'CoT0Iz0kWnjBpxt2sci2LD2jAJ9yW4HV7iRk6VlB8LrZqEXPe3glnow+DwqB9m3ecOKCPHA5IQxGQzJASCEv0HSfQ4JX78G6'
    '+UKYNXUTujXeRaPzy5GXtQHg8rpSi9PUY/g92I2wcvkkyFfiI8bv6oC7jROIZ+oV2HLkJSCSi6DZYzawcyETPqyZRp63HQNl'
    'bSQ4qTADXDd7YAWtGkhc0gSJq1rgao4qqFvpRHy1BxCSrDpokxZDhOm84dbVVaS9sxQxOGpCfkZthzZWRYJG3tvI17EU0IhT'
    'BxplPfDo8mN4rDQMWXkdCcvaKFGFXUvkn8cu+YAEDVGW6xayoUIm/OQ+jbxGshG3iz5QQ6EauRaPR0LfhyJDuBLQPPoAtHz4'
    'Qhb3LwLZfiPIwxOUwDoQ1zLuYw4HF32hqN4SctptBrwg/tLIG+UEGTuRCPUbAehk6YR03dZD+OAU4JT+DI89SAWb57ZQJqf7'
    '8EN2ImiaaQKJB11AqBoN4Bo4iCb+jUdwWX5o2E4F5DU2AJd6q8hUBT9Ah8QYvH5PlFj4jRe5mB+DTMlwInOtJqAVRIF4ARJ5'
    'I7cOVci5j3J7KYP416NI8Lpns0wZAxRiZoUZkhdBNlU96nR1EsSblhNOSm2hP9I7NVmYY2A7Iz+oFW9FRw9lwIune2FY2TC5'
    'XnUcJPBnoJMJeuDEvcdIIWcRQAFni0GiPQy4+hn9SymFHuzUhUHhWpAbzwQOR1WAmWkcRLoH0JqxKaSgmZ9YsgSRvuvPEJU6'
    'KYJpSiN8wUwBX9q/BNcP64DNJ5PQ6rUYyO0zB91e/cjZfJYWKy8P8LNIHqiWCULPkHCoL28G5GJaoe45b/D40hIcr/RGffmO'
    'INPflwl3cXdR2jeHIPe6NTQS0ILJvrGw0/kU5OlBwPRkOFxzewNdNf3BpY8vIa8RJ6JSnI3evdVHSJr0AXieTTCsHAHXWu7C'
    '1MqzQIxUB9eusbdk3zpO1qBVAuYq43BN/iGaXzxG6MnUgz2vttG+o2yAx60YfKQVAMyCcjBF4QJY+eQMXD8VQ4uAS7CAOxv4'
    'vA2FJqKd4KxAGvj7RRySFxPAg8uvIXqlD4QTvCB8LAe4PLqRxG5JABI2EOEUZvIzgQnQwoQn/lzrATa6LrDxVBXs+fEG3nYt'
    'AL/15lGL34tIExcRruTLEiMVZxHTSlrgdzsQ2n1vIRMM7yHlComEIDUF5NVjIyA28Rj+CjSH5w4/gp0uMSCsPR3wSRWgJuah'
    'IKpYGViOfkNCFQXAHztHoL8xA3vM8SCMwRO4N9+HFwyPIZwVo8jwz2+wcN9+6qe5CF3NMkLbEQ3a97Es+7ATaljchQKalaB1'
    '/TeyJacHKpYogIxGHgzMEUTUHnxs5vSVg5xrLgSq8F/wxH5/9915jbBteAc8iINAcyAV6rqzAtW4YLidVgSnTd4h5WwCQG19'
    'Dh1rHIH1xGqYxf8IveFYBEtlBMnha5PI+h0+9L2bFxxg8gHfFCdRS5OTRI8FHWT4awKhdjkFHAqNQf8pJsE2GiYgJvkYcV8o'
    'hcvsGmDnrigCdhPBNeMuuO3QCRTiDsOGsT7YCP6SBXFdaMuBKNC9VgHHTC4A4kEcsRgZJHhK28Bkjlak8qc5IfFvDtoReRe9'
    '3HUL7MZtk3nGKaEEoat5fqkXEj8JIScYjkDlKhIaTlMJssM6CWTKQqBSGI5A4ip6ROIvwk2Whx6NWnCwJQbSS3Nr7HRxwKxm'
    'VdARcwGO3wCo1mNGAmHxC/TYMgMJoXpAHl0C/pXmYO2PPyptEIawDacD8GIaERaghXtPW9DKtWjQ4sQDg51QxPlAL5hYy0Ue'
    'Si7COanrAF90FZ770YlOst9Dy1WVULKUOORdaoFSDnIgWlGU3EDMBDnaymAs3AVunwgDRhveyC6jI/QihIIHT5bRIxk2wNJ4'
    'GuUj3YVZ8Bc6o3IUvLslh6YGVCH5Mz2g9fA7pGZWGTJ6rqLP+rtB9kIFxMXt823KC7R1L5jcWiqHvCl1JtB2ZCFT3OvgO/tR'
    '9OEsgCYkPdBsEQCo5LLRFG5baOV5jPCFVQf83iyEz6Q+A8b6FnBd+x54UcOCVN4wAFENtiCRtAlendFHho6VIe/COIiF+Ebk'
    'L3UD+P5AGOUU6EQj82YICN8s4GTbIve3MZArr2QA4++bwO5UQLPOsiJZwsQefu58jygIckOBLWbYjyMTCPnMLafLPKEX1wPw'
    'caUMkpV9wHr6VTDgKwjdqxQAXl0bPrgdBRSVeIBl8n3Cxutc+HrxGrr5sx98N7wHFMOeAs5tZURa9xw4qU1D5Km2Bp+o1OC1'
    'xjHw7HwDknuVBVobB8Gm3lm0wp4a3tnn3/WYUuAmVYEcG0DBPKhFtGaqkctIDdowooAYO+Yj1ReuA9qbzcCUMhYodwXAPmkv'
    'IHL8AAwK0QRtZHN0YIsALP68B1befWi7UwP0THsDvnyMhiupKsiUmQT4AAJBxGYdaPJngLPU1yCSrgxTe5ihU8kq2ha1DC5Y'
    'q8LWW60I4Yk6kIj7hDD0K4Pl6wLEdPEBlL3NGJwdbEHZV8UAH30SaLTNQtREUkCdIwWwHAhCb6u6gqs8TwBfUzlKbT5IMBu8'
    'DRhfpaE8iRZwimUGsnS2o6ZRHvDOEUPU1McBaD/vQFLi/eEff4aWk2szsO7BGWjgMkW4ls4LEiodwJb9XhP/bwS5wB0Buyhi'
    '0ZcvDrR8+hMLRnE5wBVeRYTkt1DXNAromhqF5gX9Rn60OSL1ffxwOesA8q2cB2FdDwRp+urwW1ohzDv0HAxd5yfPULnDT+fl'
    'wIMlS3hu5xaiG4Miss8yELqgj4BUmI98a2dutpx8AUmsZLLP9mkwcssYbHw1QBOWLeDZbDO4tc8XMjz0IHiZF9asXm4JKr8N'
    'fhfbgvuCK4A5PAXg70mBJ8vxgDVaiiDi+Bq0xC6iGoLGSHe2K9qoHQ1lgv1R2asJkI7hFpw2rtO8HiUEKHjDoTVKC8MkauHm'
    'VBxaf9Ia0Pk8RM/nFMPJ0BFCdhQ3PPNLojkyyx3sHjoLGTL+gLeDL5GSOE1IS0wBwfTysFvZDroENqLz9WvkQFN6dKJBFT4s'
    'qQfjLHdARVIXes5zEjn6rgQ9k/oV/Rf/EIIXslChIh8eExEC93m/olKdbESGWUbib/FPUGiWBpmOsYBPBBthvI4yYtR/HBlN'
    '/QYlw/vQvKGK/T4FT8yR9YbCda9hJGEZDbWaRi9RVACx4mBoHQjJjtdpic+UnFHDSnOYszyJZAjXQ3TJFRoHyMPPSqEwkIYO'
    '8l9PQt8wS4JsVRySfhMHPlvcBd8Vipr/eK4iUy+ZiP94TACXuCC6/dqu6ZtMBmwjmhIoj3UgTFcpAR/aCKcGAoGiJy9A/rUi'
    'jnk9CPMDLpSi4i60M6eGNVFcoE9VDoQ+KkHqph4SjL5EQm9pN3DdRgidunMQfT7PBweG32gmBvwkhyt8IHOAIyBVyBbGN/2D'
    'kS9DgIS1NQo9FIC43Cfk2eVq2BbMCFTxKTBmPRR99LIRjnb9JHSv0KJXL2mDh4UCKIskNzzgmA688hIh21UGsPjzHFjdDAPS'
    'EkNIVYsZlI8agjXCuugPKRq4++AY5NycgsdvlgCVlleAnikAzHxwg4kzmUjBlXT0lIQzcO6tBdF8sSBBMAK6Hi0Ev3bvIYSX'
    'jrC9vwneSNdBeKSdIPucK/iSYAW+uZwGF/dr7hLvGOLNpA1GtSGQkjoFnUPSCQXjvdAtrhopzXzTZB+7Ta7taiP81aVGh4KM'
    'QFuBcvPcrjUcnzuEbl9PAcmKQaB2cgdG1AuTXcisLbcP0ADRW7Nw3qwfck1HwOYnH9DV/Zn9uCMbFHWKBelmrC2R2clw7xot'
    '0bVyHi1vYoBuv06BN+FCxB8h16GZSS+SxYgQ9zrL4XfpA8Q8tTio716O9h4TAMvP3kDiny+gg9MZULanIW9u/kaTHx8HPra0'
    'hEXycVgYvUAOPpKPXuKXAhSyJMT9UCTwvG0NFKrkgK7LcciwWwcfbNMTPXRYkbbRG+ifiQjIyDEBuoOVoFvWLHLsbxOIzPAF'
    'CR1S8HkxA7GWGQD/oSvIxRiGFtWKz6jGKWaQ+jkTrlGxt3jI6JBPf2gGvu0MUDYuBX1wp1Sz7Jw+3H4kBQd6QkG1YwN6R3Gf'
    '6wf9wUzFM/DvH69GszITSEkdQJ09LQlnE7lAHiUtmfV0MpBT3++POKahRw+e+OkGLaypvgi/JX1HA7k+oOXXP0Hx6CxkxYwL'
    'Od9uBKPspkBjuCi4fOgZgKzJkKF1E3ztqkD8jM8BTfkd5Pm4GjgkuACrN2WQYbf30JVtGPp8YwFk/hzgMi8HZOLi4UM6RhBW'
    '+Ig8+WwJ3jj6EJIrq6EaYol2ff1OIE/GAT6rQHDnw190Q0sKDj+6ocn34QksFhYDji+0UNkDbqCG7YUmUVMGvChR0/QpyAcS'
    'qhlwPTuQLOMq2mwzcAuyc5ajr2yToN0JISRHrwSeO1sGgl5/RqunDRDr9OvIy2JpxOZcIbh2YxgWK3OC3fjr0C57AFrzQ3Cs'
    'WBpSHBBEq52piVmh8dAkOhfajqgBqiFb6HVtg/CgQg+8v1IDjhdGAclThUD9J2OLTq0ApHSkg0zzBJgtGgGTPZYBQ8k/1EJn'
    'ANKcDQbWYxMoO1oPoqM7IVEhVNMo/A76LlysRT8rlnDQcA1W7OTDS2eOwUcUA4hSVj6IERtHS9vGUVuLJjSGOQy2xrbDUraX'
    'iHZfDuGzxFkoxC4B3OM/o2qaYeDoqyjUu8Jdc1eEE8zVNcC8ch3A7fESUOaGNafnvCFEiEdDtolO1LlBDfwyetEUflEP3rGg'
    'hgNBQwhefASiZ6ehHvkxUBuRheNHq1HKzWFw30sMtuX+QLR4uqF8cwF0LhEAnzfm4OnZVHT7bDYAq1ItL/0W4M9mFbhS10d+'
    'kXIbAvwGxKf0I41Jb5Hh4CqocLwZfHzgStDP4UTC/A6iS7I5wJv9PmyOXUV9X3OAoghnwETdALNXmmB4eS/BePQ2QH05IRXP'
    'ft2pwYPPT7yh6wwveJpUAXPqqtBveZREcTMqeMG9ENX0bEXGh+0QWhU/4KwVARmKNBFWxkdwi/O7Zmr7EJju+I3YXDkC7jqw'
    'k206BmCygRWUnL2LbNXIQlPvJWRrPQVU/w1FYx3sUfteGfhD+j3wni8ln7VMJo/YMsA8yVwkoiId6IgUEISnNeGbZF/C0ziI'
    'cP+0JhBd0oBL3CYoHl1CLJdX0F1CDBSyW0b8TZRhNXcgrNqtBio3OKBmWjs4XewCpMpSgLFquibPHCtw8iQSP3dD4DDiC8V0'
    'pzQsLN4jFRfmEN2CMcT98zaSUrCNvGLHtUizS4HAN4eh0MgLstKgFjhS7QRa2QjAe+YcODieT5gNaEcneMbQI/h41O5FLpgP'
    '44O9rk/AyfWfBMPty2iE0BJi4JmIxk/Eg5nzIkR13jjC4d+fQUr5FKH8DBch+xcBnnOhBFGPdRHN92pQeTEAMb8biW7fqIUt'
    'oynw0B8nYJAtCS8Lnwcbcc2ojo4FfG1jBHgNNEEB0xRIaD+OWl+SRhunGFFZjVGkW5YfMe1+iCbN6CAIrwAwoshEqWr0QLrY'
    'Xciv3YyGX1rRpNRqJB/+AxGJtAKwvFmGfLv3Cszg6cDPn66wUrUWkkveI1/tM0HNCXn07s9wdHCDCxB82aGS3EcgnRYOrytr'
    'Abn6CJC+8QV22z0Dp9SN4N1BCchRKkCOdOkHE8q8RPZ4FJo23YSd2WLwSsowckxTDnA3+AKknRrma70mc3OtgvJaBmJnvi/k'
    '0+YHKhfekV/tMiA/TxxCcstbYDPFH/jm5H1CGV4VsikQwdKQEXzeIA+lezrAqTJbwFCxC9+Ls0Pza/eRwXJruBJAAGKzFID6'
    'wjji83KqmUNRHvLUp4G64CU4104J7kt9R9xSmYGXgAe4YaUDnpMoiCms84jZrgaYVawF4QKHyBxjCfC+Vh0YPHsMxMUawaT2'
    'NugjQoYP7NVQ9Hon6rmgAfaEhIFuhh4Q6eCEv02dYMXYBirmxYHkb1eDoVNvYVxXJDTOboJ3mDMQY+a/6NYYA1EX4lBK1ReQ'
    'yk+0WUPrMKy+WAJNA55o7jcBEFZQtFBIvkBuTDpCNsUdkCTDSiy8pwyvtwq1CA5Qwa6HcgjT27uw4TQzOjtbhG4zNqHPT52C'
    'VlkAKpEiobZHG1wATC0Mz1IQ5SpB9MP9TbL2oS5ASsaDpiuQgHCGgGPiF8Hzh6JgcetIC67aASgdFoUDHFfBzbZXsO0t1/5M'
    'jAMlpkKAOSsBXZ4/CIOvnYWC0swtIUxFoOGzPaj8qo9ea1qGImO76J9ERzA4Ngak1G+B0NBF+M/UVfNgSB4s1AgCsrvHoVw2'
    'O0z260XcqGPgBfoXgGN9hFyTzw+RvoOgmisNZd/nDg3zOPBq5zHyUMsKsPzrBjr0X8C+QS3PGv8hptM0gDPsLigvKkDoGd/A'
    'bzeKEVu9NaTXJhJ8bBxtfiCpC4lTVuA0QxbyJOoUIczzO+AqzEDyL5TBAYNI8G3uJlwerkOrzqRD2rP68KP4PLjtEQX8WQzR'
    '1/ypQK3CqEnwqgDg1a0l94Z3wj1jCWRY1a/5Rmc+Yn4rG8S4LRH+fs6HgdW+MMU1AlDyFoL6+Deo+7AB0KhJgFnZjC039J6i'
    'zeEV4LZTDLmZiRLWal0AsyEp0NL3bZPAm0bw9cprwm72afjQupggVhwFtpZcgZgAN3queLF586gxtHpRjNhnSKI56Vmw/F0o'
    'PO7mA9SMjxH93tigX6SCgKkIS0vsTxsoRW+EyN3CtyxnCcOS1XPwOukM2qgXAd51EdBD59kQgeZv5E1ha4gkixBf/jABTBn3'
    'EC4LFPF+mgP6H3YgAVVhgKZHmzhK/AucHe6hB5Zqkc0HUmTlv3og+1Ed1L0RhsyNzaKFoXOo1E1NQOH/A8gJ64FoRwHIqVQP'
    '6k+pwZRjp0BP331wATdEjkzMhyPh0c32N+o1d7QtyVZveaBSAwOUOslC9tW1B4axSahLRQo8t0LVwrTxF3QP6xDndQ+BNlVF'
    '8gHLLHCvPB3ZOSfVsjmmSrx2O4psUVMIaS8egOXnheAF5ecEvW+scHuLiSjRGEH47r8MbEsPgdthr6BXogdKxR0DZMLE4Hnf'
    'cETjAy8o9d5EkuwvovyxQui5y3XksdIoeGIiBp64WoC08uSgMrJuUOnUI+Q83y9UjG8ITIjugK2wZGTLpQ2p/tWJptgVoIHq'
    'f5BzIQYwvTsdYd2Sh13KmZBN1BLIfTVCi6dHED9mQfi1QBAJRh6B18oPwJmjVuDS9mNEnJ8LHI0Rhw0dfwBH+GNQ6ewKtAcc'
    'yeGpHqj/FQ0o3scDK5QjIMez+4AcGk/4c1wIkI1S4bZV8D4PVZGLXGOR1JooOKCUDZdCamAvoz44fvAKsld8FNBu88PAl/7o'
    'j+JlGFb9CJ1ddSCcPHAOvHtdDn4uhSL3ohaAX3QiZLFYhJKihs0R4Beq8ugD2IqlBwkGzOAVdRB8QM0GkhtvonQu3vCoaXFj'
    '3mQ4pPnHATYNGgDdQxLy/H0h2FnXho/qZAFv6xqwc7AEfu4AfWv+DAT6LqJ+NmXw1JVYmK2vBLO8q+Dp0Q9o7ssWkFFoBD1+'
    'ZILQ3ieQL+gu+Z3aHzLN0DySeMgaCMs+BLNrq2h77giZ7+h+XwljwX12UWB82AJECRDgyIwgHEn6hv6s94dZ101BPm8kcEDx'
    'mp5jjfB1bDWgugHAslsokBAUAaPZ9SBylJ8YNVgP9EfuAp5Dx0DCUQJUPJ4Ahwx0kddFdKCCJ3b/OhnOzYZBk5lh1FH0MLwt'
    'fhMoOprAzHI7uKazRlAN1gSKnNpQt3gW/cJgBf0GL0OFvBCQHf0cydq8DUAVCwB699Cxr53kw7uP0VOGVMQTqYyQ9Xs0empq'
    'GP2gPQNyjsjAhw72hGOytTDbiBI+lNQHa/h+9KhNGBA5xA8uDpAQE8eHIKX/EBQoSEazwzzhOa9SKDN/Dd3L5YQJ7HpIZuwM'
    'OWJMhSCcMI0IzhjDGJbf8CCFDmw4EY4QNBQBoZEEb1+8CSXUPiDO/U7kR7/rgKeLLsjdSSerCY8gm28fAJ/jT4H54SDA8ckN'
    'WmY+JJi8uQy3Li6Tf8nlAkF2Svi1+ge4sqYKmwpCIQ0rgLlcNPA17XsoE66lGeRaiz65KA7keNvRookG8PN4CmIoGAXU7j+E'
    '//IGyYX4E0i4HRlSs6UiltuRwM9WFRJ1GGD7z9PA8TY1GLxE21KElCDjrueB8AFT4HZwCZCFwlC9J1Fos4sm4MlKRRoy3iOd'
    'ZfEgyTgNsFlmwQvDx8GXJ4aAWjUTconxoarMP6BhwSnUYuY4XJ9nhcLxhtCOQQL6i+iDlaurCBXOmBBSOkP2iM6Crl6UkCTI'
    'RAxBSOhxQ19446UZnEsRAi7hI+gy9QJcIzwB5cvi8ETZQchRzQLqTtCAmdenoXGnHKF2ehodmb4HTL7awoJHe3Az2Ai4Z0RC'
    'YWey5qKoFWTHV6FHdzPQV78ywJb8MVST0IJYGF2G7GZTaL1VL/D6XIzUBSzCMuFJ5N8ZFpif0oD+6I8Clywj4ai/D+T2S0SC'
    'J9OR7n/RKHfoCvLl+AO47toKdRXkWwbolaECXhGoChFQ+dR+eJnFCXQsyBC7RSLhHmUCIHPiQYlnEXJ4PQ5qdlwGv478RYmf'
    'IuGFPKoWwdu3wUymMPDfs0bpzPbgvS+J5Nob1EQzWhYYxS3aQnvRHdLKfALeTnVAvZoJjoRBxIQnHw1u20PTAxlRbhUHoL1y'
    'AXTZrqHDtmqwyL8bZT4zT6ip7dFQv+QKiwquAEmfe4hpvw9wYHhCUF9cBS2UI6DKe4v84mQwanuQHWxOzAIVa0+ywfVScLG+'
    'DB02LQTVTIzIx6Q8qPmGC4SHnwG5EXeR3DEvWPD+Obhl8JZAo5QHdw1yYDldKDgzngzmYm2huBY9+iXZDcXJ5wPpB5KQragE'
    'ibFWg03OnnCcPN18MzQSHiR9gMta3wla/ZIgXn0Q7fwgCZinhWDy+5dIcz4rsaVeAogTqIgZmvszAnsbYqU3hHzRvQ2F+zTh'
    'zhMPGO1cDQploxCVEl90/oxoyzZLNbTkVkNFyDzAZa8XOk2xA6UhASSAwwxpUSMBl+FEgK8IhcPfwhDz985Q5nQvFLoei9Rc'
    'OwhOiH9CMpVOo6teAcDlqCA8v2lFeJgyhx5QvgSrL5cAeTVlOFoTA2hzCS3dYQEg558r4GU5DQ4+bQZz/Wbk1ss8gDEwGpWy'
    'fwzanyME94vhyEBANDi8SgWjdqzAx82DyLFMfEtrahq8onAVpTx5EIR6Z0PDngzY1hOG6tBMwGOzJSCmnbYlnDoHCQuyBT5v'
    's8lHZptgaXo2IlzOBU6xmSNHttoBZSclclLWDB2w24HcUrVAJji+Qf/hU+TlAZUWx/svkYvHcVAr7C78etYYpudZQLdQVrJw'
    'Ujwwv3QFBMm/BGjcO/gzlbPF/3oK9BWMBsoNrPDmKV2EzzoRLe8eRVTiCfBkkjU5wPsCZNctRm0YyxDCUjrsq4tAbh1iByrX'
    'XiLL0l5Q4DEP+GKhCJcIWih9Rh+8XdxM4Nax0XB/WqLZmWNICL5Egt91yskcx5MQqpIHMO/vKtmGlZp44BU/8cHNPpTWpwy+'
    'djmExv/8gqZzF6C2FxygkdQDgsP9UqikRkZ5nDbAlwAT+NLKDjyLzEeLCR/Aq9EMJC16HBp41aIRj+6Rm6n266LFKvou+DUQ'
    'oT8DeFYEQNlME5odqgtlCdPwD7EXuN2dBz8vPUVaynIAw+RD5H9/bSli5Cf9/7y2xIQ7gPOwc/T0dvLw/5+3lyJP/tfK//n9'
    'f3x76XbA0f/bt5eU5UTV9n9Ulf7/Xl9ioMTxk64KDn9ZY5Y4rvwq9alukRNXf/PSa0qcIEm0g7DQN86vF8jXXByFO2jgNbhi'
    'SYkTIrmLiX4/1XercUW8okbWnzUhPEZInRInTpobPd66gOdrUycaFh0mfqE1/ZhMQ4k7RHLMLFwHiXsTC1WvD/Coviup6Tly'
    'AI87TlrZy95KVeNWNJ1efr9B0Snx4aT5A2z9UnmXMWCeY8HfkPBLWvVtIYynf8fkEWhKRiqHX0aI8dS/8ILNBrUdpoeUOClS'
    'OqytxfPH5LA9GT3KJ4x7t9YSchGzp94uA7JGtQv6c1buqqtI158hX6fG40RJxL5tBpf6FWYmTi171yY98H48+Qd2rlupV6a3'
    'whkGnUX/Rou0u21RZAsG4HEKJPSWRX0TNV+Zb5ppX8rij/wrnJSnKXG8pLHLIWeJBm6c33fX+zZ55tdOjAhZUOIESOR7UvUM'
    'jQrvchWekqbaSxWE1t8NUeIkSHRehkVZGZsTZkVfs+bXpMXIOmkxeJwsqTI0kK4k/sg7ET9O53+Lw0eYye/qKHHCpM883Qd2'
    'vgqGD1Z2+X+bOOd96Pe7N3jcMdLhCrj9iINwfDdxh9Tf+ki5qeSEEyWOhxRyvoXh0LvQ4QEaZ85ElYo3wZ9b+jA9ovMG1Nud'
    '1wJGcKVk0ydno25PP8unxHGRKontoRq5KmNOrsZ/cQ2BVU2eQ4yUOBFS5tiO9LaXIf2hMQ7tJppa9o2ndAWYfwKEpCITts8s'
    'vD2o/K7/wkNcWNq4KCWOm4Qjcrdub3I1STMv+NvkX6wei0zSw+Lioshya8iX+/DwUcqN4J1L7mcCRjrwOGkSf0xlSdYyZauZ'
    'x5aVbVyI+NczNsfwuMOkkze2lRepJdRvFXCfVLi6qHUePDKkxPGRhseYyj5kxb07Jvj7hZ+7zcqPlrZlDJ/aYfbplJNHpOOo'
    'JLkJT+2p9bIXRShwnKSEb3r1vreQmU5eO9M3Kwvl4DWrLh4nTzqRVbCwXcaMz1lEpd9RSmmKevecxuM0SHuLLncKT0s0dLcT'
    '7FJmOc7lEKmmMfz0y1jekkxRuEetKfX0h35ifsASLRMed4S0tzE2PzjgI/FoWOSkPMvbgi+cZ69gfs5hwBOvhjQcfl/MON5d'
    'T753y1toDdNTLaRL2brlUxOfFng29OCrY6sRLocw+1WPih/LVln4/PN8dnO/gmW8ZDtDNOW+H6LFsveeaxy+ecFsz1v/Ap3I'
    'oUchbvh9/H9eyGiuvbwlxvErgY7l+9pkD+3SXUrcAVIJ1avkUbxQFwq9cq1/fpXh+ElDjflNnBkfgbPa6Y0r/td7VijEty0F'
    '+U++N7P124dc4wjRX2J8NTLMHKyofvYkJU6MZC7LVhbs2qdtcIjS91N1wKreuwV/TN51oVd7KiTDIYZ0rGDGpldUcObZAmbP'
    'i4yumLLuzznnAhi5H0/G7Ly50CWF4T9t1dro0WMfo4DuQ3y4v37ZHQkUIZT7eVfKUBD28JgA1fb6bHjXI9mO6cZxdTzuICnx'
    'FnuV45/1HHqDcX0b33djdtKGNzG/XTuSRitfxPTeYkJLRPiJ1UEFERIjfh/nivH8bJZ0wapsJMXVJV9RESapU6/wOBWSB/Jl'
    'sYI+bqq5zk2DX46iYgNHvob5wVA+ji7lsc3d4EsZ/j8CF8VLcTZGFPu4/dTKeLtCL1K8AGWddNm7GHLD87gFlqcf0uAN0VCl'
    'Jw5b0/i0H1P6BjvMk5j9S+q+V1SCwisnCzsXJ+Kov52kovqJxx0lWYpcq15fNG+4EuO0VOCYlkqTeb4ei6/YhOC91HEixXpk'
    'D7WGkcnblwlrHNi5aGs8CUGL6odggPOb09vsE7lfYtqwvJu5HSHgL049x/j7u5pX/qPeo58mv2LxYtQWH7Q/20XcpSzJkzbH'
    '/7W84K1IieMgSQ4xCdy2Vjm1N0Q/7ouS1h08Osfw+/bbUsmIrixVUSTK/U1f0E2ufGs1ehTDZ9CPt5rPAosuF7U6ORfvXp0S'
    'LmDdj4s0Kdjta9ME1x1Pj1FwzuPi+IjmsVp9bN+c8eTDv2a1vlYcp6sRsrMPOP6uwYdyP17l6SMH4SdgMfqadFd8Ie9rPX3z'
    'EnbegfGO7YHwqOzinwepvzOXEXN3a55jeX1mR4535PfSqZ3sot0XGROifpU/IrE6xrIaYqsoZnicJWhz94UIycvMrLAK0/OW'
    'dW1lutw2TGex/y/1D6oorm/HAYZD099o+gzeopBRhKb+rEcS+JSWooTF6/LebMcv2ocjkdk0thQi0nnfw9SJmJ/90gw3ee5+'
    '0V1Ui2DLOETGm10+QsLORfE2ErfossqVdpUgw6DOv+wZXBeD+T8oUn335dexU4mBjtlU/BzHSHuzjZj+9h/4y2JCI9E0W1q/'
    'eqyeExaqNsox/Y95fC9ovr4Rk8nDsurKOhhrNGoyhMcpkXDvt3aYrxTwBWQaLIV8unf6cObJQKz+nP6+WJT+4KxErO03Xdw/'
    '87iui2MCWL7gFOoqnLL2XjKyjKNmEoK+PtfWnTB7osSuiMWb3bD6a/7P696/uN3Avr5ujHd0D7XyCWunHzm0bEW9VtGRh7ty'
    'QZASx07iZGOjH1AoTKP0eOZOvfGBVowqRhrb9+T4m8HatD+pO/YW/Fvp1uHHN74fxfAsN3sp75+0GuW7Jtkgtra392Mk7c5h'
    '+zo06qsun7pRTxcus8avzyfpEPbvJX7/vE2hHLltZ3/2+WQ/L1DzaX75lDetAtNDqhQPZPr3vs3AAP67dMOQmZqKJRE718Ev'
    'B8LWyfSkv99inc0anYbrL0nsYXm6Ew+2ZHp516XD6b4PeLzyE7I57YjFndVmQFRW0R6KjB7OnJx3wN2gP/kMw+0jf2rc4euV'
    'ttRlkXZHX7utrqU+LcH2FWU10yvcaveg/kbjefSRyhXvsl1a/L6exxQWucNaRyhOluxOc0Z7eXkyyVrhcZKkhz6FL1TrEppv'
    'sW5QXTxNDndc+ncVw3N+Vn6sKIilr+W4dNR6SNmzwW73FVaHQ17pfYmiMPgbOfyxyyTM877z5m4aHidD8sFRE5EU2Z2J+MQ7'
    '7RMjz73CQ6Io9/0MrX8nNdOtmK+3z/95sfyg0rL0xzzGy1zc19Xp3PCk8DpJ5G/kdWNRnPR1rJ+x1Vzu3VWPL6rlGz5nRr6u'
    'cuavtTOWF0jpzoXgSO3XAdqEveeVzLU3ZzVXsTrZYiFCxaMv7HapPDSeo4WNuSU5sJNin8c3Ot/XXCwhViTInJQgbCc4aFxs'
    'qsT888+9KK1ZSGn5L55iZUPcxkH4RZ8cJje9Q7txn52D0vuL8fxGxRlqt6MfCBiueENxN4OV0uYcrFRPaG20rgTY4F5jPD7u'
    'mFc7qE2dnP6s/O93GukYOOisgeHfy6F6TM8/5xVj+LjASAUP6WK2fiHWL/WToQl7JIOZSHA++0ypJe75RFk71u8dzlgZaNUr'
    'ntvU8TpCLVkeRrHgw4nHqZGgd8gef4px7VW74rkEvQgKn49SJVifQHc1WvCQhrfeqbdmDL9/iipvDinGYPVkg01nA7d1J/IR'
    '14+OE2k/PNNEqYUx3C7FCVV5Njub8QS8+VjWcWb0H4W3OKYnjvap/JMrYdd3YxYy1odOe5bbtJGwPjCMgeIZKGvdseul8b01'
    'OyNSR79ugOEwmppCdCuxsBj1yLhYfVKvQY7ZkRHDj7mSoqhdiL/aymua3YVXZzb6rwe9pdw/b/YW81VDtyrXjcmV60qvgh7T'
    '0lAsYvY8v3pWnlLOrNM4x2bgxULiUvCfHyWYvJWv/GJ1U29c04/x/t9WCsnhS8ZFlPv6D+u470442usyU1xqHpCiA8b/RKkx'
    'P8+/LDo4xLpG8c+rn5vK61FHq4rNAFbnmehxYfrvzzp2/UuhJ84R4I81yI/1aeV25zO6pAIrZJOV+x9LUAh/2HYVwuLbeTuf'
    '+k+8m4Mf7qUJr1617yxe1AizxznF/MCQKZtuZjzXtkaiwcTQRsElLO/4eyyUh4ueZf55Wjb93oxWTF4w6Qt+X/9PLk5u0bWv'
    'hayKhrQJaWzKku5ZtP+ph8udSfRRs+xHmx5tf2sQ6DsXuq6GxSv21joL8TRtiLGmoA6jGL/YSOGnLiwvcrwcULooehnaf8+N'
    'S+/5l5hLnZHH8FO9sfJkGp8TZeLNEjiNsqZd2yzMw3D49TK9qXxErtls3o8pYdM1/d1NKxaMF1ojBDvyNL04jrH1tYZSApPx'
    'J8YcWH5pKlieTdD8wElZ5104JPl9g8583QPL99S9y93PdrS+1elEUoeMuf88kWn0Hcsvz/15rbrubosS6P/RshP/pXvObwvL'
    'F1aapNWZjvB7oubqZTZL4eR3FhunMDzv/bo5GD7URkyy8KV+835ri/WdzwX8vp1cvUdzlulzNtmFg9FH/XNbZQbVOIwXqmuz'
    'LexH/sgKR9ueZr2SNKfyo+cXVieNauriVVVKC9RfM9LvWQakHG1nWcH6cy5cW0LefTHNBI+XV6+aCTOvR+qqYvZb7IRUZZ48'
    'qUnpE1L259ilvysZT50weTxsD4B/js0G5bgU3PCnIbsd6K7G8OwzxlknlqRx4ybrweYye++HaUbZnpg95F+WeTXq5n+WDKP/'
    'pIrvUDWL/wjE+luw/nOIVL9i6aS7c/jMrCi1qYPDAYwHecObXsZo3HNxuPAlRLXp3r9dH9d3mP/3NMqUbxa+FU1bvsdeRDuc'
    'WBbOsIb1XadfzfbYy772Lvc8YtXvJupt9bm1FYt7Co6Ny5twnin7y3udJ+mEnmCD++cp9+vqTOSVyFVyBVqqcuDDjt0Xv/ct'
    'nb5YXtx7/tZM9EMO1bxg5Mq5377TFs5XkzH51q8mqP5g5AdqmBKjMzK4TB/GaITtC9IfLtA/sm/UWa1myeW/sip118cf69Pc'
    'i1lDDFR8+P5NlGVG0rgLyi4/+I3Zbyk72m9Gn+LkwLQT4B771uzEt2xXyv25zLaXcVdYW4WVGFskpy9CP/lVkViA5cvJ36cc'
    'Vz3rYra+EpsZuJqyqwTF9vmCkySGY8eBh+Gl8tpbba0Ha/XSwiitMP09eFnRbnl7NWO1Zf+K582nPhow7WF45n7edl1uddv9'
    '1I5MQm/NwRkTfnsSJj+qOK9x5k64YKh03BubIy9jdwV3iZg8aTJ94FEE3dXL6xFqnkbfGag//DmH5emIJO5NTrqJWb1nbki0'
    'kMT5mD77Rqyve2TlxCntvGO+fPmO74lbvYMipL5mDM/fO9/ZnLsYs9HTp3vXR1PcHYRK0lPux33Xbi9E0TEs5bl9gBtNtnsy'
    'XYPkAywuPS+ui2i/cg3f8wzKIBNsfT4HnJbA+qjBa7km6j21gzc5mc+M6654U37UtqXYl/tWUTd/7N453gJ1um2GYufm4uj+'
    'M1/w78z4n6vVx+XRmsYFLhbHaHbBDKxeqe3qKs64fZ6s5fr0c8S2dGVChF4e838XG34xjBrVyjwFGYUEbj921NCQwdbT3Xz7'
    '9cJ2hVgUa47BQ5ODN0SrzFawuLtT29CtqlQkGJlXX1l6NylRnL30BOs3Rj0YjjEfX7Tqfh0QPfHZHfKxrW1h+NFmFHxU++uZ'
    'hr+ssPHBil5xVoq4txi/Wz8k0lWnfxn/++bM56S5kMTlhNAhzM9pU3Qjlq9+2df+DP4n4T8RdS0nYBXLC7+7wufSRE03tQI6'
    'F269RpvlP5spYfbMGOYcpEtb6Ile96Vgf4xm7aiNamH5foLBf5D/b53vK2JS4Kdpyw/pRvQJGK6mh1Xfq+a4FGfhchxSXq1F'
    'vNQR3J+LhUkM/NP2Ni3Ml6a9g2Tu3LUyphHcvIPhYUN/4lprFsubCalrq+653+ODtugZsbjoxydmilItWud++Zfg6siWwrfs'
    'aY7Fd2wx+2v8m9C7hawfjb7pMxsH9gd4Y3XGn5bCEUhdjJ3W8yv9NnSeZMcvk4Xxne1CnFMJENX9xHTrjsdDnb/TFGHDlDg2'
    'Ev35uMSp30QNFZXGF4bOddXLop//E0cq3jr1HbsLJfbF6s8lTr1pFdckb+BxciSze7kWVLG0DS9Y6+lL1kQKHjz1qMLsqZ5q'
    '2PFrMyaYJpmcUW43Ih6ZYnLE8FmRJ+K80W9sy/uK6a/ISsylZrz0fn8uR8pu3rV8m63XEPhloormeP6wxuuYxxjv7PWhk7lF'
    'r03PrITz/KIOjqREnAQx+y30lt8FiKlWsp2meex3S3tFvoHjGlbf9I9OTjQoT3+F1hSHdJ+Uj49rs2lidrY1nU2doinsPsJ6'
    'oMWfuLZE+TJrP45KpL2er8FV4frx5g3P9IMdRRTt39f0Y/F6cuJ+6U6DnLn5zXZ/u9Gx/BmR6zgM5zCozi50Y3+4v0E/lrHQ'
    'JaE7YI9i/lldDLGTbHbL3VEqmSCK0zWz4b5UYDgsn43Jmq+Yl3nQRZ36/sRKXcTdhCvYuZ5qzeE6GLbExsQOs+aw2G10jCX6'
    'Yv4Z9WSxou0q0Un75BOSeSczxmtJsQKr86GsNIIdgiHPTD6WDz7ystwwKabPw/i39GCnkG7rO/B1VZ9T7JM+TmSgxxaz//vh'
    'K7H6592Zt1YY3VTSWEMtc0vTMD/bBczu/TkjfmnqsPthB0W8TMglewasH55ZDHzO62WUc3jj/I/EifunjR88osTywnn6YK10'
    'D/1W23KHUvMdX/QYHVUC5gdqQ/zUHMilfhzU+AvcWr+3d0RACPND3ZGa3y89GK3vJS0fX7ohalrBedAVs9+9YjVNeCMmKGvc'
    'aZQp8cgNmfTuZAz/jLRvtYmvaLmsCvkFejlzOnTH2DYwPZJnKN/peV04Hd1KCul9MsZXZitthK2nPKuLu87aaFpWk7l9KeVZ'
    'M3fWyzqsHo4PrG44fDtVHRoy77L2h2X+IiNlMsbjAzu1b1/evVPZkfVez1eg6cbKuPFjjE/ZFbwack1t6NeNDizoOdDfi73x'
    'bh2rSzvF4VCs++6lzte0IWGJkacM2eZvYnEJZKX5M9c5Q2pW+6Gz8lu9l++ObDeW76rLjibEFdoXHxXY07uPLwtSpj3+i/Vj'
    'F7pl74+xfFZ3OlESWW3icIBgVsGJnatfCs/ZaLugqvV2T4uN9kW5cHpPKhavDkRfi3AEt/n+kHcAVRDl6tzvDhYs3+P5fEc7'
    'zhSQdiOCqpIv2WpZnVe0xOpP5KMGHR7IRiPCPa8bq/8pNXs0tR6zUydbxL9Y54a32q+Vi1Pi7UJHXH0WMfm9uz3fx3l6vnoi'
    '8spR/myj/eo3AjB8Vlq2GtXRf2jKmBTR6j9J3M7dtI/A7BGUC++5O6zQUfm78NwfngPkjRAiNXZeGapbch2aI04nn9x8G78u'
    'wOKxbV2J9eGHtv/JPXtppswcALJ2YySvddEOLWI4v02cqK0Xrdp9FbYhuJ5c6iXwZJAFy981DWtVmfU5PMUPcb+TYsqzr5yG'
    'FDGeZalmar/Ms+RY+NbnJ77g9ZO/EfxKmD8PsZFwnX0Sm4zjF3m0DoxddizT8MfwqWttHSTsd+rvmEdYVI7TeNPfGBk6bM5a'
    'zLvoErX+zBIZWrO28/L8u3e07xtWD59LinW6NlcMlB2gWbnJ98mlfJXZDsPn0rFJ7N9EecSE29dk62VvDyXydmO4mrnqJC6e'
    'Tf11blWb5S7ddOqvs3+CMP/gWKgqMrqMGho7x+i2uin1A3/vGGD2OG7S4xwqPvNNOPrHPUvr6n8UvnwP8/9inS0bw4q9okzf'
    'x76J6onSiQnrPMyfWh0MZg9PXnyQvPO6I6D5kU+8jsIs9tz4McPBdzctCBu9xK9h3UaLOerPVY9j/px69SUqa0klybfiFM/n'
    'J3y8LV2um9h8SmYwWjw5P0EzdXPjhar1ca9Y0SY3jN/vFaPCheKKIxqXuvV7LzXh7d5PVfwH52Se27opr500lUbo37nIrb6q'
    'ZfyD+bmGpobi++lb6WuHs7RaNsOyinsaP2H2R0TFVWnhGKhSph+bfmQwGFOMiaHCeEolUG3m7wZD3G3h0rmvfR8i2zdeRmJ1'
    'GMdLV/ZroVv1ndvsDYZk1bw+2a51LO7iioq4ncWRYgYftfzMQqJZQM4TPcyf179z2/Y4JjfptJW0x9vTX5IxuEuP6afrWN1x'
    'ZRHIGwvysGFJHNBhZCpaw9artW8F31ScVVPZLJHNP6QWqXGBLhSbl62POPar7V76PSTxgMIy8sfoB//9Tm3fPzuf97aemP6x'
    'sueWKJA4XxnJ5XGRGqtjmdkVcX/sr7nfSd8+NLtEpZM4PxKHzSnz2YUrxru8pBBvSjq3gMqlXFlLSayv/kz71euNuzq68UtE'
    'LkVbMm7P3vY3lqf9DewSS/d4E1QEC9tlMr1qKinu1GN48H9HZ733677pvfaYGcXzUcE3fhixYHPEkdto728HPBNJSesIixS3'
    'VsXqP1OMj0I2NAJ+ca6BQFvazbBs1r8XBe8lYPEqurWlSqeTxBRt/njX1+jSTffQBlqsHzvz5Eh62DFvWyfnn9kPnq/AC13U'
    '7VheU6lVCpq+/9ahh7+ZQR8rE+HpXaWJ5amOzgnStwNjux56E78piLPvvtys5seeI41uRCY0ssbcbz/R7/Nxc2iFbbCaBuOF'
    'oF+fagdSmh0ombgZK2/CQebs53NYXPR7ftsUrrmw1Ta9aDD59Wj+8AlDiNm5eafSxW4qOLEG5D+dY7MdWZUq7v1Pf+XATaw5'
    'ZfRX7bnBlGlasainmUExJU6Z5F29O5/wq0VN7s8rKFRN3P3BuCuJfe/A/PYRA96+KvvsgQWmVOdEhprc9CQsvsNUL8S3A31/'
    'stO+4N+QHrrvJc5cjuHzlvx0wihkvtzBzm6bGEV73rT/qiy2bz1Xms7p5d8KbXmbYYmg8rpEr/1VDD+doW8c7RbgiMkmnrzM'
    'xDx7q2IQYnHkZjl2QaAaD+5VTxYk9ecEGFnvMWO8Q80mLnN03c9mRK7ktVz0Mfk0izIGTL/esQbi2SvjMu5OuREMX7ePBxSo'
    'iWL9RiG/UG+yqdhP0D3+W9bb/MXvFpEUbF+e76zuCoeDRWbDzpXTGH71IOOLZ7F4LSTX/2aqeqNMGa6tfWObbz3PL1wCk2sI'
    '0bUvfNpCOhhdd42UORYLoxXksfOWHIkJYI04h9/7FsKxvB5/mVk5qQjrB/Kc1LXdKUKu7EUEtidLm+4uhpqZ4vf3FZfTwl26'
    'bh7Us0dTcjhjFrfVHp+O9bcun3VyzQXwZQOe5Z9W8zNHG/g+UmN1co6KSPeJstt36Awn3uRyvOKn7qsXsLzYkf07Q/+Ya8uO'
    'kn3Zaz0iKfNEXAnmN42V/KoJypP93LGPcA94P586vVO1gOHk15msreqWgxtWpLmQG4a0qLgdqzk2j8dUWD2HPVTSAt3CCSR7'
    'ydbdEDlFTI9UMpOha5LKxZ9VP/0qmdsaLtMY9GJ2bkQA9A5NjeV1sfYNffBUwe4JixjGpwtqnOVBKh2TDL7+zWwKbXzP/1Zp'
    'Yv3nFhz7mOgjFSjWG5pm5ehvWkRR9BDjfd+hOjGV+1bdFMo18mc9XzcHso0nYs8TNs/3hLqJypsPfLvVtOk+2M34PWYM4wXZ'
    'iZyEnvH7d6/SoE/essZ6MtQOH8XW84sWVLcPJMU/fdPzYGFi/sdVtlFprJ4Ip9jwyH8P10reGURZQlcndj+oVmJzx8pVl6l3'
    'VcVRoX7al/mKnBJvanvnYHFU+vw+s7yVrdSgRcpQ9AxCs5vhyIvJm9bm0LAXdtn14XlFO6vqsG2W7h72vcwhUQ9xTfXv55ks'
    'Dzx+vG0dk+lnnIHxVFASTQDRvTzyClOrqsI8TUatwsYE5jcQxLD1Kvkz8VtDB6vTh+DckHOijJg8TJbuNx0qzdN48Gtb8hnt'
    'f43sBjLY9037oFaseB8yF39mUTpbtV5qm+1kHiYXINawcipmTeG91g68XaU7hx/XKcCeG597rDhWu5bIDQzmG1id5LlEP8tY'
    'YnVGhaLw0PFfV7xF2Jb+FyvfHdTUF4X5qFKlCEiRqoA0CyoKFoqAJNIhgYSOJJDQlY70IkWqJJDQSwIJTXqTotiw0DsiRYqA'
    'VKUKsr/Hzs7s7p87+1dm3ry599zvnPOd79x78xRSmqbONRoUl4H4X+TXj7E8d0+1nKYcMdFco0UX8vcjiI8W3aLqNcwHtr3M'
    'IzOaJ8L/LibcVgbr40SE73n3Fy55wEMU6pnRlZ7k1a5Z0P7jcuvl9entekreuW8fM8dpp5UK60H+mSieVH3855J84HSdTeTC'
    'WMLtGt0F8H2xnwfy2MS8IBFRRtefRN1bpSodO2C90zE6fT+JAz3bvkY3aY/+GxTSnFcH5imDXq/mXNSQe8TQH1bGChPWFl01'
    'K7COND0b+5efkBvujpGRhdyMD2a38ugA+er9G3FgeyXs9xfJ6WLlq7fmOeo7iOA4zRaDbhlbnB1APdP0eO5T7karGxZgHSeU'
    'zT4oXJv2qz43vGHJMVz6+Sx2EMw7Uxe1WcPYl0qDX24YRAuGbGjpqImBdfP3VfWHjNOQQrrIzWql7GzpiI3bP0G/LCIfCbyU'
    'mlkkvuWua6GffOBDqpwEeWkrTohT+uPHkpBJl88vxqfnHMo/bYL50ilxpy1OJXujznQm9AsA4dj84A8B4+0BqWSFuc7hTt2t'
    '9UBhpTTfzVJODRC37w9Es+88UJaUrXT6Y/yOaR++ucQJ1q83Msu3K3iot1jiGWR3srwlhKapK6AuBdhWEJAxW75oZ45/dMPM'
    'L84/E7oA8oDzv9kvgQ6LTnuiX8kAwzPJtNniR6D9amosau18HFstxI55lTgdb8orLwMQn86CjXtF7qyJcioUuxwMkpihcZn/'
    'pA9KmDzFNWh6jk5LVFNJ+HfFqWFRKRBnJWlLWXb77wybe956/TIDy90rmAnw+eSKNNv6LaONff9lkuOe/aNnfc20oJ1SXkCy'
    'f9R6iu6r7Z7pwoZVBh/Ty6Duom3qu2X5uGLp3LcQZPIoh52PzvdjOuBKqPYF7dpke5qxtklvlX+ZF9fbditO7iHYn9pU+jPD'
    '8b7RRaIiqxPavJbY2gbiWfuCtOy6S/iU8Nuja8sp79tWTiEc9EvDi1G3tLGRIz+GJ5fGb4ZoRkJ/ioD2hAFhxSFenbXRewqB'
    '7UfsYo8ZA5hA3Lor9Zb4u8U4R6avqcCmshUnrWdowefr5R/qT5mwNygVEHU2bd2HXWl1VUFe2vu16/PQ9ijruligvdUHekyQ'
    '/6tUkJcG2oI2lFpiel/6oDL/dlYnb3Je8ALxTKo0btxr751QmE/Kp/a9c9SzvnKyL5rSsCUQfluyVBopiGTwGLAtahc2AnWd'
    'pBnVmSGoJvsrz7OAffEvUh3Mdkdg3DIhNHQmt3PIN/2V+q6zjTdvPXGwAPOL5kMZdkBI7eXR8XiIk+LZFm5h9XcgDuwJhE9b'
    'G+sb9Z8+yEXZeCOGY90cwfejGUzt7kSaHm1NiKUC7zvLQxxUK8G68Hzu+/krjBd25T/Z5yt/zOssY145yd+e0xqh2zIG20xl'
    'tMYy/SMD0sfrEDDOrRQTLjA0cyr3DayLTXVKV9RyQe+BeuZg+F65ivKdMEXmuVBX03H4sTs9EsQBLUMr56q13tStHY3vff7p'
    'MUf1RDDoF44ng7yK3nQNPg7GuTwtHr9+1/BUg/lOH/6RzYwacPQ9SpmvbytKOmFEnwFcl46hs6Go458LkdyVwJMnf1b5PqtN'
    '0P2ncwoEKGT+t/vsvfcD1eYELTv/HS2KgOuKdWKT0wj+4+T8q5NO7pUqdm6luhvE/1tO4BSzrvTtoqtsU4L2+d50T6+QQH5r'
    'tPGz7E5iOcsMcW3x2lNUFZt67ALGQ+C274a4NPt4KadSW890WTM9LioRjP8rNCnV/+aHH9D0ftMpuT3a+0DU5BKIG329GCd8'
    'iqc7IHB793CPI09sYKgB7BfkX6zIu7qs+63o2rC+2nnqNJsHbwbjp17dnVFp2vnxSIzZVvslRPtv94FQMC84XtuU001PPZc6'
    'UuWg/yRSXnf8Fg7ieVbjesSp4o0RI8FjjEiA06vRspdCoA55+UidS4Kw/94uea9DLY1aKqYeGgTqnAs6X1sgHHz3VtSsbP8m'
    'ujM1a78/Oc+yvV506l/z7Y7vvHMsCwdzX/2GehpB+1183Qo0HTl/vzPWrOC+nhb5lp5eE8QzMyba8MbV4eXX3j9NFr1ezdh+'
    'FTUA7ZxqZDhM7RHMqLNuHFqBGNrJiIVcAuvmqq9+215IErfUcDjbviemU+pgcQ2sRz/0V2u3xOhFEgQkvOI2aJ84v7MUA8+z'
    'Qo67Wn3ZFiW2Qn+pXhvQEfP8a24P4kyvBLT2/tWOLLxbGbArliT94GxCE5gXkSnmTA9TjOj1y/SMLB0+AOvQq0MgPn+S+aOS'
    '0tM6z3Qcv0fG0516gsk7Od9Zv06MtFcUukE0v2b/+bTk69CU01sg/q94QhMOj3MllyJwYjwIL3g0Y7A1yM80+rXH28e+Xeci'
    'g9Vgw+ZWucyH/qBO0NRvv4dQEb1ooFBfx3LRM0KQzXQV1PkzaeLXIG+Zny4bxr6gDL1pD7lhc7LP+ZWW9jqNXW5f6SRCZm3+'
    'Fkb+8gAaxD86DiL+8s3glr8uawDNmEvyM+fNH+C67Onozrg7JpdFlFd9ue4ug3yo9A4Ljn/tqQPrzqzV1z/XnV7KWa08CW9Y'
    'dwLtvybXnJuB1D727sQ13bqpygbYRuWA8WALFJ13bGyJHbs2t1tpwmod5z32A+yDdr//booh967iqj+cb5733Uc+o7kK8m3D'
    'qyMTJbqEvzujBnI3oCXU/t+sA6DePpC4NVzW/g3CTb/RcYS4f/TCyNYHxPNhgxg29DaqCtlWlVfANV744HIp/8n9MXuLaLXL'
    'co9/k0o+HtConvoZXoUE8zexANdx+cxrxpdf3MNj3C3vIJ6cI4PjQOnluZ08JEV19E0DmSnc7dCjDmkQn5iIx0h5NVZjydsI'
    'GfeLPsIMxjkIMJ7bLHumYpeuPEB9swI4VRG/IUnGkmB++Y8FBNhztFpce3Tn4Lh42iOWNe8AxCfJ7sqn1CLFA+u7r3Y66dYL'
    'mRTN90C/oNO7V+0hD5g4pq6vqt86k/PSoLkaXO+PwN/Ip/ZNwBllO9EwrpwGIAz+EXwOVLfKclCUDYRrs4SnIz+5fNX80wPW'
    'WR4THrZSrgR5jXdxxLnjZI0jqRo6kE+UW/5O7bqxwZXOBLjI8ChXK22xCoDnp945p7h4rgsk38gbXAzK6Km+4oaIAPNlo+Cl'
    'W8u5hkSOiQ10I+BhYWEeeB+sCyvy34765rE8nB87zyAPJURlTEVYwPMgWiADOP+xOfQg/r0LNXO2u5Q2PQ/E2c19aFjERtIP'
    'JlOnBktD2cqnJDbTAeqhx2uq7anXttAakoUFYnSmF+6eWjIC/aVUwEx/boRRon/w19376pZdrTWYHvCc1IqbJ0PrJVAjGu4P'
    'RwwpKOjsriWd1NO46j5Dyz86t4+YUJxxhFBd5wdXQf5vHQlsNw7IdXTeNhgMvGnkGiTGlw3qukXV7C/o71f5j+k7z5WsRAk7'
    'rj9MB/2bMES92VSad/5QbYEh6fPVR0yExtsn/cKhUsCu2jl6PPLbamnlgcSw1KYj+Dwgi6B+r/CHe/DXTpfJ5y3AamBsGBgP'
    'u0O0ATMB03kPC99Ou9+Ti4vtZpkB8dyRrHBagVyTJ4gvnB2If/vy6PbfryCf/5h7gG9hYFn/MmKHz8neO837xmscjJPLlXwZ'
    'ryNp5nOnjpdpzO8VXPCW4QXzETjtOBYu8/f3oc7jKzYkkw9cv5AcoH5mMf1UHRj/xrPJwFWXzzPvqOOIURI8N9k9DgkJtEzs'
    'RbvoRKdzKbaXKKuMgO/X6FMbqiSY/i3Rfq9yVr9zzkGk9gLIbxG1avt2qaeGE81efTL5wC32FxGYD9p5drd2Kmb08hExIuDy'
    'yAc5nwcMd5lA/K/F5RRxSl7FVvaeuvgzTb+6iWnPA9x/HvTtx7YoH2Vn/srQ2Ophu/uzYnkCHOf4d/aPoGlDdqVD7S+KXipf'
    'Tm0PGID50q4qhSVoKwcevWGdT99amf+IltUFz/smlKYCctwsYBdOKz6ubB83575y9yvIq3ASNMTatvKUIysDGk55qXAoptYH'
    'xk9lhPy65l+TC+uC/zL/1KEjOMtbyeC8dxlVe8UMU7fii+Mf/VOzK39ojuEA8857NAvSxyKW+3u7S+F7mfXj2BaUD9hXBq83'
    'HBWv3Uirfer+Mmy7+akgzodysu/aGujppYFn79WgyYl4eADf1dGLBOOhrtw68LF+mL+Ef8jfM2pdBs0zr/6BeKZcgHe3qAn7'
    '23iixh4S9lyPVVEBIG5R9w0mvir0enRcvmdb0JOmT6XrUwT7rAzTXb4/d4TmaFhYz7SqMVg9TCKTwfHdjmsO44wJpRt5X0Th'
    '+XKFEr3FtODzIf7J+1zf4pSvjnkaOMs9b2UotaoE64KSLGNh7m2eJXz9rp8sbdrmnirDfXDecEZ6zfZ+4wfmK2wxMQCDhrHI'
    'wRoYt3Mjmc1yyLdWNmP7Nzx1aGQ2btfpnuhDWzZPmb8xQ4PoB52GhTj85LktCtinMKvlMHZa+XI+vKsj9PdImJ3UO0MF6+bh'
    '0d+eCfTAWXWNhMF/AOsgpfM4A6zX2SsyX3c/0p4N5yjpYhj2uLi2mycLxvn6OzbW6hhxXsPwkNdhfp6yq9anrE76spunE5kD'
    '5fn/+mbtzXBVGnyoMYODvLdjWaqv9ebYjUXsPeuXRPrCrWO6X3SAcujfOtWpXBPlTnnzn807nFZ3G96gXUD98PvLd1K9Gqud'
    '+FwI5vL1kR72gOhroE6LIH7YpzNtc36Vp6LI8bHLgOayxRUQz/WxvaPDXA6GihzxgOshk2F+7Derwfj89C8Y2iMo74R89npp'
    'J6XBazCvkg7c3xgbZDFlhK2c7tCp5hqp5eq5WpKUB65LoqMbdrH3tNWSxOWnVhzHBRfS71ad8E97feOGo+IpI+O3Z8txW1vn'
    'uGKfg/56rbwvXDveuururfFga48exkcE97skQ9NbK4OKriwHb9xjE9dt2J5/VnKsB+5PXnK32dp4kv/i3gDquETaZMeSQedE'
    'h8dwxgHLst/EaFDOp1oKvKhThO+vwLwoPFD4ff6FGkyF9sPIU1OF3ovnOeZBnElv43gZvORlvdBNG62+6uXQlT8k8D7McFlP'
    'iF5a3d0NtLW/qJWKxlFYcgHdf+ti1Uk1ekl70VDvaeZz6eaddli++PTJvZRP4a+pCixJr59e8FAtuReunPvkDBg/Wl/CfTyV'
    '3+yOMtyqu3M5423O7YeVYF24rf5o1PXZ/EhT36vAmWsNQoKnkQdgfflXNkAQPpOxrTkvwOKfPXiKPmnjGhg/MYC+/MYtuavr'
    'U/xz0LBjXhKUMAb2cQYjq181Gs/8HmfXgsBD6ZhpssPDwXXBxnk6Ujt8hTwmO7vf9R7beFh43gB5+GOI2QTD05tvPJI8Ro6q'
    'XeBRpiO4E/3GFComrNRR0smRLqHF8dqk6fDsBGg/bxiEwepaJMtmB/LLxiSbazOmAQ/Gf+SVu7QFlorcDz4ef7SQ+SMyM9Wb'
    'DfpxQFDnIuJxD0tVZuhO1vbUXjUfRzQ4r1POA0mrTbmXjCMrNtCyeS4c19QIiNvWJ3ldKUSQVzelJlq+ylAiOmTj5JyrqSKk'
    'TrL1XKj/OJXJvEdbmr1m5wLID5yyWWzyXfwHPKHu+m9ewxgsVgLlQT4PVjJ0/fpjYJCpg7dHrfK2jv0Ds2wwzife7wsa5E/Q'
    '8aGNHwV5jcifDmFcAPER0Tg73sb9sm857EnlS4V5F/+isENwXt3x1RDbHivKcrbgF9HLZlc5oLhIEH/nzcP6fFsd3lHN+EO2'
    'sI4YWmvvN6BeIr2KFTcYOSv4r0/2jJ3w9+RHHqxKID5YqT9Xm59Vrp4ST7v3pYuD+fGzwWEQT6EyvoXr+Cs1xk4UjOPOjSIR'
    'cT5PkIezCHrr9adt7FLXovN/6iqUOD72kwJ5exXNYWQSFHRl3aG6Vo/RMyfxOG8KjM9/7lv7TfSnBwe7bngU9Px5Uq4EeQ7W'
    'BchzscHdBfYOYW81xZV6rySXSD5FEIeQnaljA+N6gG7ZXyH05im9F8U1MDAv0Fycwc93dhMP6aJ+hvImGgyermwD+fDVaN/s'
    'pYra5bix/JSDvSmRWeBRCjj+dY22rGyWN7duqq0yu1W6XFsOXPAAcUjT1OCaklmP3/Yoy+MOnsWyTd54Cq7rSve3q1BDZuuo'
    'JsEc0/JKIwi79i9QLyHXmIxKLvQmh2l3NGbEzizx23Gc6JB8mS+fXz4IfnXx9TfvFsPNM7vrCevgehu+H9+45kGX528harpT'
    'J0G8r9+RAsbbdlzYXZrkocTXpl0XVGsZvU//Xa0+6Wfbq69mKE6VhSCijp0HIpiACp0QcN84Kyn5qY3l7OC27dptrj3NlDgO'
    'tn5wHFe1OoSEjWS/jcB0yXb8t4T0bHF2ME+/b5Kg7LahfzhOn/mBYjqwUv4OxIB2utM/hdRs4u78s2O3PRXz/tbxZ5skELfi'
    'Jsr6xk8S0xfItgNti5jhi+RbdKAeGG1fDKbfUFrKMPpQ4DHI0GPjrrwH8vn29q2XxOzHHH6C76umnpJdn7DTwkDdQuCG4hb4'
    '17nmVnt6Lw1Yxl/bOPgH9h3ov23hY6ZKCbus5q7Tso3z9AeRCaBfTo2xkOcIfS5JlTfUOpf0ZmzvdIrS/tcPHi8FTry30TXX'
    '8ZQbhMZ/vT7dSe0E+3o2QJM+qS817OPGvlnP7ocXxp67l8BxeMNjcNYtPveORRQsOyITCUY/jqrAPjF+Ty2loKrNvrFI+B07'
    'fgAfNse6BfqdPfrKXl9XVe3zZ/C40Po+nW26EW0QN94fTOxpCzUJG370Jdd4L5SOaGxXgvultx5dE7klv0PLmZLy4vq+zmma'
    'jSFrELc9IU8C0/cvz4xtrkaKhcUpaqilGYN5OsUgMgi/QW/m9ZRpvqHrX3GouaorOC/nSxruhgerS4G6wwFsx7FtbIzW4qBf'
    '3OKvT+wvPvdj446sbMk52jw3nfkUHCcz72aJIdyK5kmu+Fj8SPDhZHLi/7x3xBOw3to9YaW2yGUAyEvLt9FiisH45IzGhN5L'
    'Lj3yvKMMq63bCIwMfnPCYytfWyfzLWzD9GW32KyO7UVFWtMGTuqLznVced75SozU5+P2ClHf5R4nAKwXyakMbMAh61Eo1U4N'
    'a6DKUb2QtQ3q+Wnm19TLzMcpUu9dLlRWDnhl3ijlBO3354dF+1gVkRoGzC0HDgwCTZ4zVYL87J9BR5t8Rv+CLufxHIfg0JnR'
    '7vIOEM+fe6PPnwUEbIoW8NKfPhZRZq4utADX+yP/vPh9Q7PqdtPIMZpJ+sFhjoMwMP53pLzcJt5zP2WK/DG1T/vJsImOvwnE'
    '39Xsd5Ke8exEruP5SHLStfOpTItXQHw6TJW1rv7ZCb6oXYnkm7O79FGNswfkW6M8MZp8M+2e/IOwdzf3Jrz+C+RdcN4X6qTn'
    'nCnxz9JkI/x7XqgIf2Ct5wCfP5/8WyT0bUBLIZTwV3EPMvs592oYiPMdz8I8F98RE8PtHMP6oFSFtQLObpA/xZTCvjDzLvd+'
    '2yDKdD2SSPvxxmwfxOfeWVg04xfvmIKLVslqf9ISPy6lDIL2X5kq+UyFLstFwSc3OiIKhYcq9f/zy/VQ3WP9kA8cFltEJv6p'
    'O5od74SMNU/ur44hHUaapuRZdrAMUWbtAYrmkXF+oN6grFruExOOfABphqFHB7/rt870C4D54j4SQ4iLo4Pb7qPluwfGDmQD'
    'cxPAerTcETu50/VL/PCxp/iV4FsaSvp2teD4qkerqTKmG0DMmOw9mNrNEWX7QTWQZ0gq8/lnA43Zc403rpgNDP3eEvuOAHG+'
    'au4zmaR17x+ULFJSR2tBe1s2RQbUS3fhS/tUbJHoJw95rVyGPutGHOB+Uk8fSuNUfzs3/BuYKWB8pvy7Yh1wA+2c/tb/+4pl'
    'Vtz+prSZ7EKIp5hGAiPor5LXv2tMPXa6/M4Yj7JnVbqy1rZUgvzwZP/fo5coNYMXrr6XDjn0NtakaLLAulwEY+vfCbjRLJ1n'
    '7iMuxPEGMX/xEajr5jnNGXDC5uYVxcaqVpXBMa8g26xgXNFAqC9p3HeEs0UrAvMnKkZu/924C67LCOLxcPMf0yTnH9pID+yr'
    'U0yLjMlgPZ3vLqwTM3y8NKXkGLed4pL3aAVz7cSPcXZVyjkXJ2xkgc3oTYpDouiW7EnePdSt3e1V1WYhXpH+XhiwgWB7cwjW'
    'x4ssG9zPM58z7XJ2VwTW7PQG5h7ngPifZg5TkuY9tc/CNnlUBBH5ecnA+zuYp9braxYKVJh3I2dShRS+8oeE3jcS6Hfc/YPt'
    'uIeRbndZoQ6qOQev3B5yXgHriL9pSe/Xb2Up08Hmoumnny0vvXV3BP2Y9a/i9dAVV85FqzE7k9/vaF8bqJuDPL+9K7lekxeR'
    'iMl8X+oQMvTNkeu6MXiuCrwRB+gUp1MzDvSdHg5cDBJ5YFcC4iD0s8kuJW4PeTPKNdGj/WPE1xsHt0Ae5ncm9UQLcT/fEUPA'
    'PtXcYIuc3fsIvn8lUiwmwz1uxWyfZSr7YQrH1/Ll/+q7Wuj6euM+0/KgLZ9J1U/nzca/grdYl0H741k0on/wH9AN3Gv3qg5h'
    'axJpQceAOr/s68GsQeb45sNaVcXfPLT9qbdeXgf1ZNfUD2Ebc9F6W3ncVTW8fWbYWm83uF7zgqNajnH/DS93YxvnTuaj1pvT'
    'Wif20KpzuYloMOWFHbifqjv0vKWw+Bz0++TTur78ktNeENotaTYPhyfiF0S7wHkzhT4PRX4Y95/j6OEwWbnksKDglgTq+Y+Q'
    'Eu0ptnn1idu2V57cPZpp6eaknNwD1+T3tKyusgE+tCVavJjPrDARWwPndVoc1Xah/SPCV0jD9cbm5rfMA6b7oN6wu9zWOMUG'
    'leQZduxJ9mMyv7cwZQr6nbL67h1dlrUEfdEE2b7UZIdSk0QD8kkwW/Iq26z3m0rvLVnVwQz0BPW+G2jnGNp78knE8fItw2hz'
    'yyV4unL1Nw4wzv3znrzmYG3zMWG4/1ULt8CwchV+BuTzx1af+xkvzAqNzHArvFN7XM/d0x4M2n+MjWtOY3xXFRaS8lku7SMv'
    'p0OJKthP2ZwzuKfDn2RVPv92ve1SvULk869sYBymHKjkMl1XumvG3r2elyuqGb32ThnkScy+vFHrOxW1uYNv1YrerIhQHEQc'
    'xCFZX0c9v+sp8qmnRXxaUmg1wzWpOnDefJaqeuXKhHKV7BEpZ/lSdx+13yf/c7H+L/C/rBlIW7LE98CeMdnPbR1GgrgJnLtG'
    'Pn1ni2VTYelPhdXt/LeGcudA3KYkfrjt6ZIKXwiyRrXfmM74bH6pDYxPxk+vJdRze5HAPfwnvwjZw/rc1EHQ7zfmO79/t5g5'
    '3bRxTrbjkOWS84g0LZgXqAqf4B+ys2bnarS+s7Ib/hUxuvcDzN9Xm+FP9Y7L2Wpazz/w+bZcUWFnhgaf67H/bjNPD3NTNFTS'
    'HzgwvNcjJyQD6sCpw+zAD5s7tLTZQ7ztHZNqV+3ldk7O/QFWpkMmGdqO/vW47LhOqA+u9BE4L8Km/g1WTKS89OOOkOdK7swK'
    'U9EzkA/bjKO1s6953bgSA03+ZbvlUZfv9PFEx36LaMfYqIZdyVni0bwe45vE+VMCrEf8H+Novpi10MWotfHfObc6uD6vWgDm'
    'C1ymmFceAL6+Pdfpf0Pu9q5CbuIG6Ee/YundEfU7opI3G3sZuB+NHUVanNynEn9OFftz2wR3aiOnUtnmgk/r6ZI/YB9N8o9j'
    'HXJfTD1sZTXQFvzCWfPtJga0x7aTSf70TrbtbsG6WdgPlTj5c7NPQPzlKHYjrH/sffvsIlqDbQ/q5Wt0OUE/Li9UO+KvTzMz'
    'eLUrmtGP1Yhyw2fpgJuhqj0+XtW3rxXwiur2duLsNoLZh0/mNfvGBdB0RGWIZ80cH5rvFY/uTdGAfj/LetnAk/P1JRqW6oRp'
    'HZXLjfvnBsDxtUIaLC8zKpvfTEJNemg72nfk8HuAzyuWcpI+K9J5RPm2KZ+v1Pv9bZZ5AbQTc8b9vprw07/CfkYfvc8Qa+gc'
    '+crA+C/4up7J/uDo4jxp+Egi9G3Sw+Bz6eB6xxurWGynyp/cp7RAP7CvAuFzL96CcX5V0YNlpPLL3Md7wtZ3LKd/e1t264Fx'
    '0vNB1f7Nk/s3/tlWd70rbJDFfFBqBOuyrXgs8KXC4wk8dF3RqAb2tSXi4Cp4PvLVfCJXvP1fOiz4J3vrBpVZpsf2MuivaKlK'
    'Azc+LoNjH+prA5s/pVGdHkt0//FnylVazkp6jhKf7/dm8m0IbZEpSC9Qh+c4/jIam3PwJ4vq06htHrPJpWie9PV7DVJ/jgRb'
    'TVLoGGtnvbkJojEmjCAPG5jNCKNmG+kazQQBMYrOnq1C0cm5+UVOuvMmrFuD03b1urIyP5ND7mU/Avln1/GA/Dqi8xAX0Mm4'
    'zB2yzh5xCgv6RXVy/Re7TaGFYYh5S0zo0FlbCKMfWJeNFvlebrveydHMNKVpUpqsuGUYenL/TahytcE75mKo9x38xqh4POM9'
    'ibE7IM7PX/K86yRyeJ76jGVUzakUrQ5g8ADzIjztBWJ/4OtDZddnjCE7iJef/RNXQH+tLOz4loxdcr6Dyv38JeZKR9L5+fNg'
    'XeNhou9At6VEiI19aHi28g8g0PFunew/v4duh6v8CGGbLS9gNqz5tqDAcB2s7/82G0b1jfQ77MXXZIKaQy0P1tRPzuspUTuV'
    'HhpQ/l+0UBnFU7s8ToHJj0G/60hfycv79qNdKYTzadFI/raEw9LJOabw7F5ezyuaJU05PTvra5/6/NKbjcF8fxJ8deFR1+dx'
    '9Rc6a6cVUcfvH6svgc/r7wYdEXTjJdtfHK74tDKkCAyHOoL6+UH0fZH03Jn6su+cS4viV4Qin2/0gvaEi3sEd1+J3vdH9jmc'
    'Hz14cC2SgxXEYXVpXeqDDs/mx4oo+5+1x2HLUHoC2B/Rb+H+GhCjg4QTWtyy6+hvakBY/5zc9/trEeHj8DtAZd1w6bW+SzPN'
    'LS/6Ex2u6vSRzeM1dO5K1dx9+x7xlK4pCOjHKP6z/UIcqpMDJV/7YLErwGP2JjQYn4aX3sIWio4qC9tkultf1rzzN7nJDvYF'
    'YbKn/JCBwtJnyB7/PknP/cuqpoGA45+2efdFaIs4+PSriwBnp6IJW4WNNc1/uq7pbmMAbfy/BUzRtvcfpx8SDP8qlsG6oByc'
    '9xDb3DxK4zVk8NDg8NrnZL5BMN5MFWv/RJnd/GkrPBXyy1bDsN9T3xLETfxXq2tygIv8Pc/Wo9BcD40EB7pI0L/Bx8FTLAEM'
    '9ukukjZ/L5UtCy8MG4LjG/Mnpjrx6NL8fXno6rqUnvss4DkJ1HWiqtDjhVu7yKrDvywmP1GGVrStgeD7t3q5HahyUdwCm1Xt'
    '2ZOU2z90ROnB9SYDYuZBukO651nh9xPTa3cIbDJOYL4fI/W+wknq18uimekuTbNe3mh6cfI9B/jB19a7T0bb+liXRek3Az1T'
    '/3SLg/tsle921+uTke8FDwECTcX6t10ZHhnQX28emrZ/C5BrmtHnPtyrJpuyi32ggvgv2rpTacQv02oz2HWbXyqtCzly8gD/'
    'v8yUp93IUqv3LtbPSx3tvxF4yvPwMjgvYlzd//ffKz9G/16tYXbvns8SApbBOPEJU7kzJlbrBKhw5kyX3GM+fZqxHbwPnCxh'
    'yyc+IcAXfpndk06Dy0nF5l3IiU5YP/5+M/Ldbunpfl22Puru0TuOKNDOtG7MY2HD+0o4gcPhb56P877eu95w8r+ha6z60jyi'
    'DMO115LzvdwNPtzuP7nf/rjakO5mrVneXt9u2R2N6G4Sz7gT6K8Gj+th475+l+53HP5ZeeD9r4th8i+4L/H7yQcDs6d+a1/C'
    'xCVpGI5UN2q9e8F5z3PdIJ2ylf/92ZNauenqxZK6cxcJ/p+CSY2Gk6nhznxB7n0rVJBZOQs5RAzMI+cepL8/j357tAaVNT2u'
    '8Np7a/eTPi6G7FCc4XJM1yr8rDOkNy8IKqYqDOrMOMOs6iPa+C3WV53AmkVcMM3lghM97zdYP/ihx/ZKieKu5NJq6a9KqHwv'
    'eP9Zdypw/Z/BVUHIOd2v3LclNOnOScmA8aDTmHVNwpFdVcy94LSW0MyPR3lBtiD/Zzoq33AZsOm86Xr6y59eFXeFwj+vwLzb'
    'OUvglXwZ/sH+t2YS/PUZiQ/xbIfgvtnUYfDNFHTiRfFzsp4CHAYbgHgdHcjPIodQi2QBb5jJ0tNgaE+H4WWd7J8gnvXybR0J'
    'fiR5fZYKmfi9z31vBw5twfuc019UuH9uE5GcWykmLaWfmn6iQ/1B3Xtc61wpXlPFPZSKKhHVyzdcuDlWCcbb4UTmHlvoqKTq'
    'QRDwtuopH69CFTfIzxLJNNy3w3yOQ0LqXn290h1l5Ivvo/vvuWYyAHzuB77ejR70+2X0caG9NGcLPN80V6Mv6f6D4XAm5m2G'
    '1PxDWKkfiYD4f3/47MwER38vMFvEEQ0d3Kz48JsV9Huha98s58vu1Yf5nDe/6KYuf/t9RRhc13btR+hm0wabkwaMZxSaq7qr'
    'nfwJ1KU0HuIy2yH4Xf9kpKVrcZkkLQJfAsbhKH3i7yz6m0ui3hIZvlIbDFed4lpAvzCFKlwM/Ork2a1wuJpQEXOBraQ1BFzv'
    'cX/1n1FTDjFZPpebgZ2EAhpB4wbwOZN//+54PMYvYogjNIPj+vnmHYjbyf/1RK0Ci4bDzK4cPb4w+7c2zWDVOe///IrNk/qn'
    'j/73r9j4/F9fsUkV/59v/q/f/09fsbl2/f/xKzZUoMnJPZJg0qxV4VeWIt4wPzZqIFyIX1wbY7AS8BccJ2DKgAK597TV0xAj'
    'Ssx7TKWxBd66AdVbnzG6qn0WXj8GkZ2lAr0pgvhok4xbusHDvmgoxQHqmqpOokMUPX4piK6VacknARofUQi+l71/EWS/zGgB'
    'UUpFHXG8oKraqHWUtKu0H6xZCtinW3BHtZqdjyKN3/2ZkKEyjoQPC8BUurjgpwaxqMa0ckDaGDlbad6xOo5+TSlYlokUiJ4m'
    'NwVFBAxGI7KpgdSsAsA4dproI7kSAN+9GacTaOq2zKMgm+a5hQ8QaJYUTBeDtAEldetO5JJkhIDWKGk00oHIBaWmlzwsNB/B'
    'ZxouwZVEWoBxJDo4jyptyMforXZ3ITXWHoZ1+kvNgNV88kFgzZi5GwDGirKYlmijmJ11Y1gBslCPOmef48nVyIWtp7aRlQIs'
    'KgAMfCXN9zZJkAQv/xD9YS5dpbRitwlJ6soxn1ghoEe0CwCtZ164QR/XswfbjgsysnyYbC7Gfm8lLJzlDG3By2WYDAVQ94c4'
    'RLusWO/1Qc9JZfMbUvtImPRUFPo6lZSOjUhJewPwMLSgCApJ0CJcdobdBwI1fbtxqa88J2o2nJqW1pCNyQcWjFOd3JhK37PG'
    '5YlFj6ObIu9qD1PMUeE4PtiwdwBpOBegZF+ft0FskRf4ZUfdUJJmYgI3iG6MOc3JPWIUY5rskTQgL+Esnpey8q1q1Ykq53xB'
    'TaaE6BWeT8XGxTs/4HyESi8ChonPbsu0D8MR5VZO68UoOjOb55BFKsxNCvOeZzaCnFoI7GRMO1mkll+2k6+PtBiptFNitSBk'
    'x70ZRgzWNwm4w0xLAPXvz9LKufn26gklY+pzZqifviw+8ILrCBmErCCxpL77K0CUpy4/Qm9Div0HMKnEkj6HaNtLRnO22cHm'
    'ggTir8UbFUD5mOYacZyAF6TKqn+7TJQi8JyWuVHnJDDOR92vaV9GlQMzjgSqgMjOL6Q43PznEnYIKSjutZ1keN0k1xZfE9eP'
    'KwYc5IZ2qfjgnXRs12er8nIZPCmXVScFhTTzRfppnYO+rwRyCLE5ZD6UnUqqQP7iN5OSIqxgbENEAP6nJaX1INUwvx5wYi7m'
    'Rmw7lGTkOUikMmR7IvuTtF5cWkRBhz8FkUWEa94C4XoL8IcEiT7kra3gUte0oRVHfIZ69FVrxYrxTHtiqWATAIFc8hklSHZd'
    'xwibkYibjZ8xsUY3TJ7TELFxL+rOW6CygIUfDGPlfQ9NvUPTx7De6n6BZmFka08HKDKCOx8iKGFdAGA0/A2TiXW5Vm25RyVk'
    'DMmCL/hbAQR5dln8bPwPzRxJIhCO/IVZboX5NwvhTWMz0NyU+itGAkucvuJzTobzaakReYAro2SBmwbBJTewzmcQiiyE7Vtw'
    'Z8GdzJ/VCWovtDnzlQLU6aX27xbwd20Isng6du2NihEVEo6CeaX3V4zNelV4tgHWxTbu9wsF8LlUGAzzox4ZW1rXOtzFBoU3'
    '7Me26ATGlQLmtDtw3tQ6HGwG9v2eF6qLOqGUtWBv69/Mhw+UMEyXqQOIOKhZ3wHE1CAtUfaK9QhGBp0j049OOLUNF8l4yGsq'
    '1APoxhFP1WsLalo1DYcMKU9grNAp2bKZ9FYtKDTSevydTBnQVmTEOAJBp7GgFnIDj/QRJXVEJfvhJ2SXbSmpcKTLYiFQKdhW'
    '0JtMEYTKZITxRy0gqW015M8pJE//NnzZhNSsdylQx1NvFhKLXEB7yJN2vHCVdXEXwyjG8ryMVskOH+ypRCpAyibcto/FTUzy'
    '8UVDLXS+Xvbnngl7Lv1DujzaSMudutAAfDJ1eOh79uyEshUlVasSZixbQvSvMyLCZOCmCkJjAn3FQIBO/pg8DTkLmZG+oJWM'
    'Sl6qT8MfI6N+IKLCcI/34IV5QArVfwVfQdIxFnrhXBF4i2FP4GWO7DkTybvvrMbQzGh0GVB4rcjhPJkaPvwgwnS8KchBlhBs'
    'adwA55Uli7jjbai25cAFasAKSvtV+ZBD9VD/Pd6CCwW9JXC+ZtOFXVdkjrUJqhKYePRCC0bAVAghWu9MaHnjLMehwihtfMGv'
    'AXuHEqnzRiQANeBvRu5rKcw0c1FwvjoOwcgEcsqkBbgV9NtfhaS9NW8BICjXKuOYAGQbVGB8OSNAC3pHup8zPMPngaxzuvkj'
    'GWoSkIlCx/mZna2IRXoZ2ZwxD44mDwWVWsEHrueTyg2XrNapAAUxP4wKlDgYrP5NjdJ6UmuRDGMt2nFCilAsGmunvTLKgBaL'
    '8VKFKEr4uHRdAa4aPg43DDVfHZUaZhiZtiCQUuZHAOyFCkXGBcQ2Pz8ihop23f/g4m+fh04hMspR+F/CnIkFgPV0NY7IvYOe'
    'G4obM4WWwe83U7cdjPPlLLwihn2ap/iyAGJOavm7h4mp3NHwX8HjZci3uBwCDPlOwVw/zm7a3xFTCczHQi/CH8SOKUrqk4rJ'
    '2Xq+/A7tiPgPZrlxduwZRERPFYC5VVJn3GcVPz0EKyfM+2fCX/KxLpAhpvy3dXiosmaYQsCqPBSbQoUVb+/A0m2gddnoLnas'
    'q5ame5yCJvIptNgqBwiwGh1sk8GY4XwaqA1+nuLl4ULGgQGxp13SAh8Rxs5HZgEKWXKiiGRXCKqcT25fMjBx9lGV1UVJq2kk'
    '54CUKYaylAmYT4njvUkMU34apAq9Ibt6gsR3wcwlpvuJSCupdBmz93VA1gGeXBBoV3IhlZTTzQFdiOUqWsiMRmckuE3jRsYS'
    'mYuBMkc4ViHugVysOEOcOdaaKiIqTNSFDmVUukE8GZC3LF8DNReTBONYyLfIpgSpOtcD74DmoWQVs+GUC21rj7AHjRo1AIqC'
    '7sXvHWyZU+GtsETZelxQNbcm4gBpGlRsBuGQxxcD1Gft4pLk6BxI9Xcrc+dHM9rk5d6qLZ1UPDIerThhZFcLwKdS3YqySaT6'
    'zGF7CozmRkPIJGWMiGI2y7LGf6y+r1UEkC9mQMbFnZq7RAr3tOybSIw8YhWsWioVKNgtTOCng+w2wK44PJ+bsVo2dVlrBY+r'
    'IsskwvEk2dCdEcIQ0tU/IqAcUNO5jRs+9UB7fu8qH9EiNkMAJ2EqxYheqIdLr9TDKY1lwAO98PsYLQtsf3k/2pzyBW2WmVZk'
    'hVsuD9aBVYo0JpZXAP7DjnDTEuyiXsFC2qagXf0y7mf/1TS3U/ZEp0ZLfL42GShHrAtqhhHC49WXWRqt7PVmF9TniWFogZtd'
    'JguEnHxzMhDQVQ7nxgRjYPt6CGqGN7P0DA4De8beNl7w0VU4OmryBRBL9XZ1dHONkq+rKCJGocQnjFd5E9wVKnl9uriS6kp3'
    'a4AxCW3YL0ctvDIGNgOtg7z+DYlaYLwt9evaAxy/EYRs2gno+2v62+Vg1t1WU/kRjwhy87FxVIyCd2qVr9s7VynfsXeAfTEs'
    'lWRa7CKzyDcvwLKxu4wcTRkHSrVIiDEMkbwtXQ54WBq5OabJIbHmvldX/BsRd5GjvHJjtQUriVU4/HeV6VcAX/GBLJaaZc9Y'
    '+0rwIgoqslhIGVtyuwz/XT+6UIosgdcCOW7wAsyuobcpMR3RKYJ0ffHzYjLfNVoUpkJmzMUiUaAAeIZKy0TbGKrZt9oMwYqi'
    'i+ytzR0Ql9Phnt4pN9wuQK6OAP/00whIueF6RKAjOQVuRq0Op6lIvdwBvZFhaI13VI96BRTbORGW7WRnlJ75d9033SfYf8tE'
    'oO3RytE5/j77lDrJbOBHpbB+o2FxOSNGuzrSnh1DlCbBV2He0aZ15jJr9pTv+YCGlbnZQsn6T0Pr5QeNZN650vpoP54SP2Sr'
    'LW8wrZk9hgKIatl9y17XRq7grpLwaERYfjMPlnXCzmHJqpaIjbLjaQHSo/lQYpbLBBRlJiGbRDUprugnZ602yyPw6Mfms3uU'
    'VsDm2ek4RAHzF+ow+wQVV2+ojcKWGhNtmKNZ4ErGAv7YdwCXShAyoa7ACNb1yxVZXqe8RirlOeWDSSNLC9jbBy79KQPSa95j'
    'ZH2eBqaOR4/uQiYrmb9LplIhLXUEH4ytzvPhhFpAEukPQw73zvfGI7D954MmF/74Ots2haNdkXBEbf1KdBmwQWREuMOS8CzH'
    '14sG7DXRrqcJtQgsir2Ycw8WW1xgXg7AyONaIjAooThvrWnJzjTCO5vEMLmU2tRQWX8TP+9ZUAfcZMRTBezn6z9fJdiN4WSC'
    'NO7zXpAjk5FvzHmht4myWZUA/BIp5Z3QjZvUFQWiJH6mmELNaTYaSRTC3BmaVJ6Fns0AfqfhiP0/xV3Tx5BhDylpWlLZp+uc'
    'v2WSTSBQUkgCR1wbYMm3sEJqnUjZgftjMZ9Gy1BDzAoBiPUcazwqw+1UeRkOQMSUyPqNiDRVkLAv3lGEZ9w4oTCLYdPyTFqI'
    'qHXGWRgZKJOfeCgB28bnWc1n1lO5TNBnjVoLikpVrOnnqSwYzWvlgCMGK6K1kUYp6M2SswN8C8R/yFGHtid1xtC8qeVLd3F1'
    'AAODPjk2KqO/vgBZjHZ1FsLMaLhjS6BMRESEVVArtasSwONtvInBY/jMV4j3dpCmTVErzR+SFpl6zo5xEEzqvmQZAAt7jZ3l'
    'Y57HoxZZwqs1SfPKcSUMWFFhJXJDc1kqDFsGoN/HP1fnaQpeeYuxd/0U4Ivx13+EDCvyCDeoKJB8VExqBNAvipMJxUYqZvZD'
    'FuTiZsZI5VVHs23DlugAaOVwPfkhBRgu28Yushc7kIr+2Lnfi81BFKfMyjpg5vlfGWbAx75GvwacL2rfNdu4mRrHA0OhBMfj'
    'GOxlP2KI8OVpWVmic5IO/iXAtwwjkeU8TKlFRlv5zalpQ6mFxbSP6t3gizX60AdmsjUAEbZ3z6xE/R3Vm2xEnUuwQ+GVx7CU'
    'RSi1ySrWgot9JhfIyJn525WSw3uxbGYAjhU9iM58yMavhe3CEYjuLvr8MtVA23mtTDd7yzR/Je7SZ6lSP73hUq5UOySV8EQV'
    'TuJCe5OAEHvKcvx+jnPFMCUlqCAn3TnLVDzuKZWKO1uC65QsyWwGTIVmltqX6xzRxH34iGSlWVq9sxHazWvCXgrdP5tFGakB'
    'EGnFhhPeFUHk5e0yOXiaf70rZhDZWF8QcFGugUpKpdYD1+h9yKXh1JZPeag6eOrZJ4iVB1reYxi0EeKBFqbV1L4dGJp2micJ'
    'uRndmAkeS8mlZjVrPYAZB1C2BAgwdHQLiZQNOOd7aGlNzpCd8xWC38kAnq5IdyoEv5276pqCDYKbkauA2pTG9DmYDMH0xbLF'
    'x7WlIFeUtVmiHZKZqqnnPSlDTCgGMIgVhoXqvjVo07gpUzFSInZEEJ+3E42k2rL6KeL1xrsB4RI0Y54ZRDhbu87ZqgnbRdjL'
    'adZVZv5BWkNiLZ2orA2AFcrKAXkKSQrG6evBqqBn8DZEXDRG0xAvT3yE9dJ+Uwi4wN0E3ccIkiW+0Pg+vgdwlO7VZv73GAoh'
    'iZuPmB6l3QEEyiHRywx4+3lZrVgEyYZyjYBaYsEbjvQ3IwgfFghvygBCQVjLtjhZQzbq9ZBgPwE9tu7It7hwkEEcl+Uf+YHJ'
    'LwaMA1tzZeLqhy2gVLufM/8lSDjsFIpAIhm/IF63F6MuNAKlgqTF+EvMhrmy6CmtaP0xEtUVy8aLLrEjVKQEV2GkigA7QQpz'
    'vuaysocMwda6jiqxH0bKt0Lb7DtElHhjHn0jNwEW+jmGJL+dApoDdy8M9WJ91DIF32RrMv8N05BDiYjafAtgJAm4HXOthOwK'
    'lJVQdznjWIzRonUk3pRZo2hGLzC4KwdogpVf/Du8gEX4ZvPGGinVo2Kuf1jOsXSKjr1Qt+JAvdMI4P0do+y4huEpOeVBVf5u'
    'C8+y2hJqfFIIiAAsUb/Nla8IKAoTauWrgjXCXDmL6iaMqfnNLFmEISlSwQx7l4U+KpcMvKPOqSpmr1pI4tDoz1ae6mhUatQP'
    'QndOgXOf3TLGuKsKcIyCRrNCFmBqCSjxA6qT5YvqIUWZl7A3pPD9DL7NTEIFsB376d177dD1HL3YTEkU3xKmDSktiRCEc+dQ'
    'vANKmrNKgKHxZdg1it3ajaX9pZocuzElkYh5z1R/Et7CBM4MR2eRAK35BikB7OOKIgZ7LUd4c3y8JOXmCsbeEDuew19LKoPU'
    'AGczeZT08JS7f+tFBGelR6S8aHOQWAypJJ9PC4Ix67PqBJS5S2Cy1C1K7GNX/2Uc9qCP5JziDfGOTGlGpfAwrSKKgfDZh1pT'
    'OnIN5AN6aqByJkYmYaJfGX2rxR+/jrIvRvyHenZcACzSOMDPpDm78REiPy1U8gP0jGIFwRr7zMkhAKaZCTzjYp51IlB04+Qu'
    'rSKHYFowhCbJ7KvphoetYRQv7tlSOYCmF18oV6D3nfNqwEKoz1CKhK+EpiZfuTxn6HIV+SKsHdBGUanFQ+LbUqZS8Ba7yL9d'
    'pQwo1JpUWldJnLY6OR1fBRR3xbIsZ+dUC1C0x1ytVCgFu677AjDKi+nBcpS21NXwWkB6RWtWCTHUvcI3oaflm89bzkyxm784'
    'Hg2P8+1zgyKXiEB5VezjEZH6LSLlnfRj4sKBZNd9Ex/Zugr8FmNsrs88lQy0ZPT7wmJRP98sreRW4arzosecnPLjGBgFzCUe'
    'IGCpYSSg4RxxhchvOixgmYwpyoGO/37kgzDHFxYZ0bSOElfOEF4DsHgiQi8TU2d+s2DNwrh6m4AdhJy2oJQ3rbUqStrVYyoA'
    'qNSQwxiCKpilURTpA8PSIgLOoicA07RG4SKZT4bkyP/0epFznXbKdnl2L4kltTyahCHhJLXtUI/zyRbEYKt3beXA+E5qvS51'
    'LNeJRErD7ctBBQQ+oYTrEd6Dt1N1rjDWZxQAzNEW6BTehTnScloRj67qKGoZTf9Oy2GlWUtZMuFnMJEMmHXXO/DTso7ZUWBW'
    '/hUJhAV7AWTbWYqKQj8Ezx/i1NwMGD6rIrnzoJLT/D3aeNO6kITiTLZV6LI5dXFcqKVCf/YlYKwlm6A/+dDVSCCHiDNIcMhE'
    'zFMiPuJ8m6PJ1YUERHA3oOmDsIfbXThfT7IyEjGjtvgPk/OWJb3xLT752Y+tncVLARsBvDaf/R/TNn6NYGqBqGtKkCSSVGab'
    'EupGrEJlfMK3AzAYMX9JwxyF8MnWgxdLSxK/LQnicBKDpH/4C4Ntm701gJxzhRRqSdtqzV+QbA4xIufiUf1vUCJ90JbvRhGS'
    'dQt1wELJ07+5wrpYo2yyoHFTdgDVnHwaIvtQ3cpMzyU7vBzVDLTGaltjXymPpwdrp1vUT3amqTRRiUcDTfp+RDQ8Uw9GAubG'
    'l+SvvUWmGaZZGArKSs1DsDfspzUZYhJyqVyCATBcM2AXF+CZgUX6i2E92C1JdYlNFWE4gSFI/s9vscs3+gogVMAyM9JpLc4S'
    '0kYs2BtuobXnRhNWGUoCGJ/xvXr4BiUOrwfqSqlRL3ws6/BDrq25sX3i6EVkOc5BUNgMB9eeK3sTWQSIRpMxQwjepj8EGbyK'
    'AO9Cqeu9nibsvYqKh20uq8v3MskArgDFZXqviVxiJlT0WK4hOhDVRErOXipGo5aF+T+h+l8ChAwSFi2dmm1eDfsz4sBglPW2'
    'eSm9VMvIPHFfj7gMzX4DIJ1LWvZsM98bI8dwV5cwOfSYhgTvfhTvaKa3uc7DWkwpMIiCK8fypKRYoGqi9kjRTjrQSIwwat7C'
    'AhbMR8ViSUX/RbV0fuyM0154PrCEcY46Ni2qgwrmSzU1W5TI+8S/CakDIs85CCjwJ4ddwNBokeZlyvAot5f2OWh1kqSlPbdz'
    'iG01wGe2MBaLcRsNgVBjsFnOJfvLa7fglHsU45EVtH1ZUVMtQHjPbEJYc3a4Mo7lKNZbkDkoJgZTCT+Zy0P9MaMIWUQ9INXh'
    'X9iFzwwgluX5+EghquusHxtZPNYlbOMYokjViUblQL8ZDDHeYf0RpRCr3ujhWwQXXKlD+LOxaGnjxgckKQbVQBFqVosx3Z7A'
    'mZYWZG5aze1kTByODkKa/jLDk6XvFPVRAbcCyuJkdJRTQ3hO3o1lkoNt2mlb9CgMrxfOGGNvuYjPAZh5F0zD619LLdxA4gQE'
    'klVs+WRSY2/EI2ovhDsGOH3nzQGshownpXa8eHmfnCqCao4z9uEuci2vOFpTBnG2Ptsfoa8Ab3wUp81MZVfkNlWMeGYN8RCr'
    'Z7T6aY2GKOvqdpCeldYCjFsHIa8s+g7eq8RILtkQIG4ujrDHYUWwHlksBWaKeJ8LLLsXt/levokprNDTNiunqRIbxlo1Sioj'
    'MNj+Cj9TXvF8wHhejsSNiJpvqVNZuDzZc0TSzhig4OecjckU2MVL2cEkoNkwRjoKAqd2/olOdNlfjuUpwH8tWkItTj6m1HlR'
    'msaqgTEf4chhVkQd1VGvHOW+BpeEfs7F0L4uspdJaqqAw9+9B16O9+upYMhV/4VPmsOOMr48XdvBwQnWLDub8phXHfPiA8BL'
    'gXSRUBj4olu2Bcvgad4S+YiKtQXvKUyA/d+2ecbxVAB+n2/KmUjYqFeZHod75igYxg1TCLlhnKHhF/OIUe+1WgHCo0FxOBWS'
    'cNYiTdcKz2+36YwcMqcYY1psM7xRmJutdUAUC5R2xh5jx1f9XdXZxR+ZWEyAZ5ZihCvlfaQn1wJZaoBBi3+kYbNsf6puhraf'
    'bEaVbIhAY5HGOOnsZZ2p8VhHu0RAu7ytEp+D29+0TBvIcky24uPywty6W8pFMdMV9vHBx2UB4mno5w2eF78X6V+vQnL9/RTi'
    'hG25gBT0XMY3RfN+qvOmAs6ri3HFRVbR2tT9imIULMGixLB5FnVWmNpuhxuAvz73CljAm2trTSfF4WGJfv6fSDNoXkwHbgj3'
    'WgkObHq7bRrmA0oI77FryEgYReU71kWbTK3IGRY5ZM1Si9oLRzmT22lfAal/UThZlVW05GdDY+J4jLZF9soY8UlFAN6t+xhd'
    'HA+vAaof4Wa0rZuQ1kKp48hEBU8qczqFSc/R2t4E+V9BQDQXAOZDfmbviaNk3YazUmMBZsRSeT8SFxwv2bCa07WpgeMtBsy7'
    'siuQsO1MVAkEXjPHdmE+Xcrcp7rQt3QI4yjoCa0tAVDlZHekwJE53NqwCE3g6qVISDJFG/7NLfU253wwJC7YCwg4YpbZjYaH'
    'cfZwB1m4uUmpIUV3BJLu126S/UvCGrtNBo5epIXBEOWlCU8KrZPF/2P/9JTH+VkycbADUj5lPpVQB6BOwyOlz8VVIAvYsdRs'
    'rB+l2vVJyhDpbLECCaf9w8flE6BFnclpJFoF4kgzfaNDpegslIn1JSIE8ZQ67PodA+MvB25I1v0snyvz7PBC0Stowhg/QIsu'
    '+NUjMQi5tAUxb3h0MeD2XVKxu04bdclVSEhcJP7QXBJVKoXDoT9WaOve/p5xvQmglsOz7kbbOVp/EfXWEuC7XWen++ANQrDc'
    'WyguRb3R+qABwC11m2IinxQTcNkKsxfyLwSICWALIEsy9S9kyEORAkWlQDma0VEN4H5AwWa8oMJSGWCXYpccNVGiMcoOiU3f'
    'MbEpQF3uLIwAW3bXi6uXxnqbpMi0SqYalyx9Hq5Ap9uOcuqQgQwvRLqvAvqTPsDs7Ti/hCsypWIEx1GMnsSx5ywDk7AGAGu1'
    '+Cl+tqT4UxB5wYd70Tkcq7VGQVUWS9VFrxFLfhbnACSZuGbT59ZYQ/izmh9tVnY3ogh06Vm05F8EKn82RSM/H/jh3CSOCHic'
    'L+xMCYJPezRVlLe8ITYHBxm11b9GmIb4FwDOCBl7Ob9P4RbJGU74VcelOcXmtPqqogpTqYuIFq0670wAZxVdMFsyoI+nOiTc'
    'o81mMEIJUWHmnJ5mCtSMqILxl+WA9pIRQdte38Uu5eLk0riTU7aGbJv2MrIgK0oMk1pxoyUTSBmnMHrXxwV5yC8yuqY/+x9d'
    'nftPWmcYx19raKNptmiqE027mKi1du6HZj+sNunmhSmgVrCHm4pi4eA5Sp1dcRFXqmYoh6UGcOcAWlCRu5cpVSpsOpfMXVy2'
    'ppvg1HRVI95nm+xiJMsy+amz75Pv8+TJm+/zF3ySb17FReEDvlH/N7YhuU3li5/0ASo+Z5oQmAM2PIJDmYB8bfYkyfkbcFqu'
    '+pkapRs8XuDhsZg72sBS3mrlrFUhRliw6TkX24LyrujgAOI9dICGTS5raq/eg+yMCiNIi2kHvIG+hbylslLkDqbtVxBDINBe'
    'RDd4K/dkxZTdeJmkXeBLdRSPMyeZ/nLxOUXfTzNA9YF/pJ2r+FKm3Ua4/E5brPMUB9KsCR8339CmbSA1HvBaNcreuNrh/vmk'
    'dPk0b2wSR7zLBtGiq5w4PLQHpJYZYMYaNNJFrJp4Wr1kkEcTzn9Ca+pDGzfZGDQxeoXZboDyExYKXIWiLp3uQ2vyZ6h+VJdH'
    '4+Ybi5tf3YXU1ptdIBRTccH39CsXSUiHBbwTvT2uFfEKR+pBbatxs2d8PWOg88AudV4vnJezyZBZM/LrK8waVgr2zYRqxRBV'
    's5wxPgU2MuCqMpvxcuLlMuHgL2/YrApHm3yJfJuhw/ebdPbUPpBIX1VGMl0OF+cPp6kxyvL+lThPK0OKPk+CtUycmfE1wJ13'
    'rTLjb6xacx2uWDBieiVM0X/f7WEVQ7KC0gDkBfX7Ol29Krr1R6qyxzydAJclCVRQgPYJYtQeqpyJmzPgXfOICaq+GRwf0OlX'
    'b1H3aVmjH7GQLDb+ltPAV23VuoH/Xognms7hcNY9gu4Wsz5qV7jO4+sdOJ+Yg5Ob6u6D9oqKA/SSWdL4TuYhurnmzjnrKu+2'
    'BJ1tmX8VZVNFjXYQCOXIiKG5a5pCqBPpZn9bm1QkIzTUHjlBkFyl66/bgO/NMeG1aRq+TcSmSgvkELLRxF3sVYriJIsutuOq'
    'ZhhYY+xbHRQtnv/xLFd+nRVNDjVd2Mlv4O6fghc2tTbVD6ALxqkd3KmLDxKVlWj/SHZ88b/NEE9zF+Nt3RIzW9PHge53OpWo'
    'Q+PSbX7vp142o8yAqVr2yMb5KbJoTqGMGwBmpLR6J7hNtHWmZz08O7jvdGDiS7mI6u3Yx8oS2ta5z4GoytLOiHWx+tVWxlA3'
    'CaUE/VpBVdP590Tzf7q/EGRZQFUl7ulaYk6OPvsO67HEpHB3fAlnWlkmikuU5QXkR8OA5o33+iU5iSGSqM5kyT2Fip7wowdt'
    'Vnh3GFOr04kSesSJzMgXRIc7+lGwJQWAsEjgxWuJCPeGMNjxsiUcZRSOKQrr9DHLw6Mj/w82etkZxkfCaEhYx513asExmKSE'
    'TjoZ/ok8KvvRLLoX3v4DXK2RpQ=='
)


def test_int8_mma_tiny_v_norms_regression(monkeypatch):
    from tqbridge.metal.attention import ref as attention_ref
    from tqbridge.metal.attention import last_run
    from tqbridge.parity import testing as tqt
    from tqbridge.parity.plugin.fuzz import our_target

    case = tqt.Case.from_text(TINY_V_NORM_CASE)
    fn, _ = our_target("decode-attention", "cpu-emulator", q_precision="int8")
    tqt.check_case(fn, case)
    assert last_run()["kernel"] == "int8-mma" and last_run()["q_precision"] == "int8"
    monkeypatch.setattr(attention_ref, "E16", 0.0)   # without the subnormal term the same output fails
    with pytest.raises(AssertionError, match="exceed the oracle bound"):
        tqt.check_case(fn, case)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vf,d,window", [("turbo4@g64", 192, 1), ("turbo3@g64", 192, None), ("turbo2@g64", 192, 3)])
def test_int8_mma_runs_across_v_blocks_regression(backend, vf, d, window):
    """Found by the emulator campaign of 2026-12-01 (iq4_nl / turbo4@g64, D 192, window 1: 1.56x over the
    bound): with 64-value turbo blocks and DV 192 a lane's run of 12 values crosses a block boundary,
    and the generic turbo decode took the whole run's norms from its first block. Now per 4 values
    where runs cross blocks."""
    rng = np.random.default_rng(d + (window or 0))
    q = rng.standard_normal((2, 3, d)).astype(np.float32)
    kb, vb = quantized_cache(rng, "iq4_nl", (2, 3, 89, d)), quantized_cache(rng, vf, (2, 3, 89, d))
    check_int8_mma(backend, q, kb, vb, k_format="iq4_nl", v_format=vf, length=36, window=window,
              sinks=rng.standard_normal(3).astype(np.float32))
