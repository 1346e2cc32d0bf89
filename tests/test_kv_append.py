"""The in-place K/V append kernel (the decode step's append) vs its numpy statement, byte for byte:
rows land at the right place, nothing else in the buffers changes, the rotation and quantization
are the reference's, and NaN/inf rows set the device-side flag. On the CPU emulator (CI) and on a GPU
backend (``gpu`` marker; skipped with the reason elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tqbridge import bridge, metal
from tqbridge.bridge.blocks.padding import padded_dim
from tqbridge.metal.codecs import rotation_group
from tqbridge.metal import kv_append
from tqbridge.metal.kv_append import hadamard_butterfly, prepared, reference_append

K_FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f16", "turbo3", "turbo4@fork-69d8e4b", "turbo2@g64"]
V_FORMATS = ["turbo3", "q4_0", "q8_0", "f16", "turbo4", "q5_1"]
_GPU = next((b for b in metal.backends() if b in ("metal", "cuda")), None)
BACKENDS = [
    "cpu-emulator",
    pytest.param(_GPU or "gpu", id="gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
        _GPU is None, reason="no GPU backend here (needs MLX on Metal or CUDA)")]),
]


def _run(backend, kf, vf, d, B, H, S, cap, pos, dtype, seed, *, poison=None):
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal((B, H, S, d)) * rng.uniform(0.1, 8)).astype(dtype)
    v = (rng.standard_normal((B, H, S, d)) * rng.uniform(0.1, 8)).astype(dtype)
    if poison is not None:
        k[poison] = np.nan
    k_rot, v_rot = rotation_group(kf, d, "k"), rotation_group(vf, d, "v")
    kdp, vdp = padded_dim(kf, d), padded_dim(vf, d)
    app = prepared(kf, vf, d, d, kdp, vdp, k_rot, v_rot, str(np.dtype(dtype)), backend)
    kc = rng.integers(0, 256, (B, H, cap, app.k_row_bytes), dtype=np.uint8)
    vc = rng.integers(0, 256, (B, H, cap, app.v_row_bytes), dtype=np.uint8)
    k0, v0 = kc.copy(), vc.copy()
    flag_in = np.zeros(2 * B * H * S, np.uint32)
    if backend == "cpu-emulator":
        flag = app(k, v, kc, vc, pos, flag_in)
    else:
        import mlx.core as mx

        kcm, vcm = mx.array(kc), mx.array(vc)
        mx.eval(kcm, vcm)
        flag = app(mx.array(k), mx.array(v), kcm, vcm, pos, mx.array(flag_in))
        mx.eval(flag)
        kc, vc, flag = np.array(kcm), np.array(vcm), np.array(flag)
    return (k, v, k_rot, v_rot, kdp, vdp), (k0, v0), (kc, vc, flag)


def _check(kf, vf, pos, S, inp, before, after, poisoned=False):
    k, v, k_rot, v_rot, kdp, vdp = inp
    k0, v0 = before
    kc, vc, flag = after
    for fmt, x, rot, dp, old, new in ((kf, k, k_rot, kdp, k0, kc), (vf, v, v_rot, vdp, v0, vc)):
        outside = np.ones(old.shape[2], bool)
        outside[pos:pos + S] = False
        assert np.array_equal(new[:, :, outside], old[:, :, outside]), f"{fmt}: rows outside the step changed"
        if not poisoned or fmt is vf:
            want = reference_append(fmt, x.astype(np.float32), dp, rot)
            got = new[:, :, pos:pos + S]
            if not np.array_equal(got, want):
                bad = tuple(np.argwhere(got != want)[0])
                pytest.fail(f"{fmt} (rotation {rot}): bytes differ from the reference first at {bad}")
    if not poisoned:
        assert not flag.any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kf", K_FORMATS)
def test_every_k_format_with_turbo3_values(kf, backend):
    d = 128
    inp, before, after = _run(backend, kf, "turbo3", d, 1, 2, 1, 8, 5, np.float16, seed=1)
    _check(kf, "turbo3", 5, 1, inp, before, after)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vf", V_FORMATS)
def test_every_v_format_with_q8_0_keys(vf, backend):
    inp, before, after = _run(backend, "q8_0", vf, 64, 2, 1, 3, 7, 4, np.float32, seed=2)
    _check("q8_0", vf, 4, 3, inp, before, after)


@settings(max_examples=25)
@given(kf=st.sampled_from(K_FORMATS), vf=st.sampled_from(V_FORMATS), d=st.sampled_from([64, 96, 128, 192, 256]),
       B=st.integers(1, 2), H=st.integers(1, 3), S=st.integers(1, 4), extra=st.integers(0, 5),
       dtype=st.sampled_from([np.float16, np.float32]), seed=st.integers(0, 2**16))
@example(kf="q8_0", vf="turbo3", d=256, B=1, H=1, S=1, extra=0, dtype=np.float16, seed=0)   # k_rot = 256
def test_drawn_geometries_on_the_emulator(kf, vf, d, B, H, S, extra, dtype, seed):
    cap = S + extra
    pos = extra // 2
    inp, before, after = _run("cpu-emulator", kf, vf, d, B, H, S, cap, pos, dtype, seed)
    _check(kf, vf, pos, S, inp, before, after)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_rows_set_the_flag_of_their_row_only(backend):
    # K row (b=0, h=1, s=0) holds a NaN: flag slot 1 (K rows come first), nothing else
    inp, before, after = _run(backend, "q8_0", "turbo3", 128, 1, 2, 1, 4, 2, np.float32, seed=3,
                              poison=(0, 1, 0, 5))
    _check("q8_0", "turbo3", 2, 1, inp, before, after, poisoned=True)
    assert after[2].tolist() == [0, 1, 0, 0]


def test_flag_is_sticky():
    app = prepared("q4_0", "q4_0", 32, 32, 32, 32, 0, 0, "float32", "cpu-emulator")
    kc = np.zeros((1, 1, 4, 18), np.uint8)
    vc = kc.copy()
    x = np.ones((1, 1, 1, 32), np.float32)
    flag = app(x, x, kc, vc, 0, np.array([0, 1], np.uint32))
    # the previous call's flag survives a clean append; the flag has FLAG_MIN slots, the ones past the
    # 2R rows' zero (a buffer of 2 uint32 would be 8 bytes: MLX's unified-memory small pool on CUDA)
    assert kv_append.FLAG_MIN == 4 and flag.tolist() == [0, 1, 0, 0]
    flag = app(x, x, kc, vc, 0, np.array([0, 1, 7, 7], np.uint32))   # padding slots in: not carried
    assert flag.tolist() == [0, 1, 0, 0]
    x[0, 0, 0, 3] = np.nan
    assert app(x, x, kc, vc, 1, np.zeros(4, np.uint32)).tolist() == [1, 1, 0, 0]
    assert [kv_append.flag_slots(r) for r in (1, 2, 3)] == [4, 4, 6]


def test_butterfly_is_the_orthonormal_hadamard():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    for n in (64, 128, 256):
        h = np.ones((1, 1))
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        want = (x.astype(np.float64).reshape(5, -1, n) @ (h / np.sqrt(n))).reshape(5, 256)
        assert np.abs(hadamard_butterfly(x, n) - want).max() < 1e-5 * np.abs(want).max()


def test_overflowing_append_is_refused():
    from tqbridge.metal.kernel import KernelError

    app = prepared("q8_0", "q8_0", 32, 32, 32, 32, 0, 0, "float32", "cpu-emulator")
    kc = np.zeros((1, 1, 2, 34), np.uint8)
    with pytest.raises(KernelError, match="overflows"):
        app(np.zeros((1, 1, 1, 32), np.float32), np.zeros((1, 1, 1, 32), np.float32), kc, kc.copy(), 2,
            np.zeros(2, np.uint32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row0,n,new_cap", [(0, 7, 16), (3, 4, 4), (0, 0, 8), (5, 2, 9)])
def test_relocate_moves_rows_without_touching_them(row0, n, new_cap, backend):
    from tqbridge.metal.kv_append import relocate

    rng = np.random.default_rng(row0 * 31 + n)
    kc = rng.integers(0, 256, (2, 3, 7, 34), dtype=np.uint8)
    vc = rng.integers(0, 256, (2, 3, 7, 50), dtype=np.uint8)
    flag = np.zeros(4, np.uint32)
    if backend == "cpu-emulator":
        kn, vn = relocate(kc, vc, row0, n, new_cap, flag, backend)
    else:
        import mlx.core as mx

        kn, vn = (np.array(a) for a in relocate(mx.array(kc), mx.array(vc), row0, n, new_cap, mx.array(flag), backend))
    assert kn.shape == (2, 3, new_cap, 34) and vn.shape == (2, 3, new_cap, 50)
    assert np.array_equal(kn[:, :, :n], kc[:, :, row0:row0 + n])
    assert np.array_equal(vn[:, :, :n], vc[:, :, row0:row0 + n])


def test_relocate_refuses_rows_outside_the_buffer():
    from tqbridge.metal.kernel import KernelError
    from tqbridge.metal.kv_append import relocate

    kc = np.zeros((1, 1, 4, 34), np.uint8)
    with pytest.raises(KernelError, match="cannot move"):
        relocate(kc, kc.copy(), 2, 3, 8, np.zeros(2, np.uint32), "cpu-emulator")


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_head_one_row_flag_is_padded(backend):
    """One KV head, one row per step (R = 1): the flag has FLAG_MIN slots, not 2 (8 bytes, MLX's
    unified-memory small pool on CUDA); the padding is zero, a NaN K row sets slot 0 only."""
    inp, before, after = _run(backend, "q8_0", "turbo3", 128, 1, 1, 1, 8, 3, np.float16, seed=4)
    _check("q8_0", "turbo3", 3, 1, inp, before, after)
    assert after[2].shape == (kv_append.FLAG_MIN,)
    inp, before, after = _run(backend, "q8_0", "turbo3", 128, 1, 1, 1, 8, 3, np.float16, seed=4,
                              poison=(0, 0, 0, 5))
    _check("q8_0", "turbo3", 3, 1, inp, before, after, poisoned=True)
    assert after[2].tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("turbo3", "q4_0"), ("f16", "f16")])
def test_a_batch_of_three_rows_lands_per_row(kf, vf):
    """A batched decode step (B = 3, mlx-lm's left-padded batch: every row appends at one buffer row):
    row (b, h) of the step lands at [b, h, pos] of the buffers and equals what tqbridge.bridge.quantize
    makes of that row alone (padded and rotated as the cache stores it); nothing else changes."""
    B, H, S, d, cap, pos = 3, 2, 1, 128, 9, 6
    inp, (k0, v0), (kc, vc, flag) = _run("cpu-emulator", kf, vf, d, B, H, S, cap, pos, np.float32, seed=48)
    k, v, k_rot, v_rot, kdp, vdp = inp
    for fmt, x, rot, dp, old, new in ((kf, k, k_rot, kdp, k0, kc), (vf, v, v_rot, vdp, v0, vc)):
        f = bridge.get_format(fmt)
        for b in range(B):
            for h in range(H):
                row = np.zeros((1, dp), np.float32)
                row[0, :d] = x[b, h, 0]
                want = bridge.quantize(f, hadamard_butterfly(row, rot), **f.cache_options)
                assert np.array_equal(new[b, h, pos:pos + 1], want), f"{fmt}: row ({b}, {h}) of the step"
        keep = np.ones(cap, bool)
        keep[pos] = False
        assert np.array_equal(new[:, :, keep], old[:, :, keep]), f"{fmt}: rows outside the step changed"
    assert not flag.any()
