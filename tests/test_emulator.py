"""Self-tests of the CPU SIMT emulator: correct kernels give the exact answer, and the bugs GPUs hide
(missing barrier, out-of-bounds write, SIMD op in divergent code, ...) are caught."""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge.metal import dispatch
from tqbridge.metal.emulator import EmulatedKernel, EmulatorError
from tqbridge.metal.kernel import Kernel, KernelError
from helpers_kernels import METAL_STUB, metal_as_cpp

X = (("x", "float32"),)
Y = (("y", "float32"),)


def _emu(body: str, header: str = "", name: str = "t") -> EmulatedKernel:
    return dispatch.build(Kernel(name, X, Y, body, header), {}, "cpu-emulator")


def _butterfly(v: np.ndarray, op) -> np.ndarray:
    v = v.copy()
    for o in (16, 8, 4, 2, 1):
        v = op(v, v[..., np.arange(32) ^ o])
    return v


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


REVERSE_SUM = """
    TQ_SHARED_ARRAY(float, sh, 256);
    uint i = tq_gx * tq_tg_size + tq_tid;
    sh[tq_tid] = x[i];
    tq_barrier();
    float v = sh[tq_tg_size - 1 - tq_tid];
    y[i] = tq_simd_sum(v);
"""


def test_barrier_and_simd_sum_are_exact():
    k = _emu(REVERSE_SUM, name="reverse_sum")
    x = _x(256 * 16)
    (y,) = k([x], [x.shape], (16, 1, 1), 256, runs=2)
    want = _butterfly(x.reshape(16, 256)[:, ::-1].reshape(16, 8, 32), np.add).reshape(-1)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


def test_ucontext_switch_gives_the_same_results(monkeypatch):
    # the portable thread switch (used off x86-64) against the assembly one
    x = _x(256 * 4, 5)
    kern = Kernel("reverse_sum_uc", X, Y, REVERSE_SUM)
    (fast,) = EmulatedKernel(kern, {})([x], [x.shape], (4, 1, 1), 256)
    monkeypatch.setenv("TQBRIDGE_EMU_UCONTEXT", "1")
    (slow,) = EmulatedKernel(kern, {})([x], [x.shape], (4, 1, 1), 256)
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))
    with pytest.raises(EmulatorError, match="depends on the thread order"):
        body = REVERSE_SUM.replace("tq_barrier();", "").replace("tq_simd_sum(v)", "v")
        EmulatedKernel(Kernel("no_barrier_uc", X, Y, body), {})([x], [x.shape], (4, 1, 1), 256, runs=2)


def test_simd_max_min_shuffle_broadcast():
    body = """
    uint i = tq_gx * tq_tg_size + tq_tid;
    float v = x[i];
    float r = 0.0f;
    if (TQ_OP == 0) r = tq_simd_max(v);
    if (TQ_OP == 1) r = tq_simd_min(v);
    if (TQ_OP == 2) r = tq_simd_shuffle(v, (tq_lane * 7u) & 31u);
    if (TQ_OP == 3) r = tq_simd_shuffle_xor(v, 5u);
    if (TQ_OP == 4) r = tq_simd_broadcast(v, 9u);
    if (TQ_OP == 5) r = (float)tq_simd_sum((int)tq_lane);
    y[i] = r;
    """
    kern = Kernel("simd_ops", X, Y, body, static_names=("TQ_OP",))
    x = _x(128, 3)
    x[5] = np.nan
    lanes = np.arange(32)
    g = x.reshape(4, 32)
    nanmax = _butterfly(np.where(np.isnan(g), -np.inf, g), np.maximum)
    nanmin = _butterfly(np.where(np.isnan(g), np.inf, g), np.minimum)
    wants = [nanmax, nanmin, g[:, (lanes * 7) & 31], g[:, lanes ^ 5], np.repeat(g[:, 9:10], 32, 1),
             np.full((4, 32), 496, np.float32)]
    for op, want in enumerate(wants):
        (y,) = dispatch.build(kern, {"TQ_OP": op}, "cpu-emulator")([x], [x.shape], (4, 1, 1), 32)
        assert np.array_equal(y.view(np.uint32), want.reshape(-1).astype(np.float32).view(np.uint32)), op


def test_missing_barrier_is_caught():
    x = _x(256 * 4)
    # a run reads poisoned threadgroup memory: NaN instead of a plausible sum
    k = _emu(REVERSE_SUM.replace("tq_barrier();", ""), name="no_barrier_sum")
    (y,) = k([x], [x.shape], (4, 1, 1), 256)
    assert np.isnan(y).any()
    # and two runs with different thread orders disagree
    body = REVERSE_SUM.replace("tq_barrier();", "").replace("tq_simd_sum(v)", "v")
    with pytest.raises(EmulatorError, match="no_barrier: output 'y' depends on the thread order"):
        _emu(body, name="no_barrier")([x], [x.shape], (4, 1, 1), 256, runs=2)


def test_missing_barrier_between_simdgroups_is_caught():
    # a SIMD op is not a barrier: simdgroup 0 may read before simdgroup 1 has written
    body = """
    TQ_SHARED_ARRAY(float, sh, 64);
    sh[tq_tid] = x[tq_tid];
    float s = tq_simd_sum(x[tq_tid]);
    y[tq_tid] = s + sh[(tq_tid + 32u) & 63u];
    """
    k = _emu(body, name="simd_not_barrier")
    x = _x(64)
    with pytest.raises(EmulatorError, match="depends on the thread order"):
        k([x], [x.shape], (1, 1, 1), 64, runs=4)


def test_out_of_bounds_write_names_kernel_and_buffer():
    body = "uint i = tq_gx * tq_tg_size + tq_tid; y[i + 1u] = x[i];"
    k = _emu(body, name="oob")
    x = _x(64)
    with pytest.raises(EmulatorError, match=r"kernel oob: out-of-bounds write past the end of output 'y'"):
        k([x], [x.shape], (2, 1, 1), 32)
    neg = _emu("uint i = tq_tid; y[(int)i - 3] = 0.0f;", name="oob_before")
    with pytest.raises(EmulatorError, match=r"before the start of output 'y'.*from 12 bytes before"):
        neg([x], [x.shape], (1, 1, 1), 32)


def test_threadgroup_array_overflow_is_caught():
    body = "TQ_SHARED_ARRAY(float, sh, 32); sh[tq_tid] = x[tq_tid]; y[tq_tid] = 1.0f;"
    k = _emu(body, name="tg_overflow")
    x = _x(64)
    with pytest.raises(EmulatorError, match="past the end of the threadgroup array declared at line"):
        k([x], [x.shape], (1, 1, 1), 64)


def test_divergent_simd_reduction_is_caught():
    body = """
    float v = x[tq_tid];
    if (tq_lane < 16u) v = tq_simd_sum(v);
    y[tq_tid] = v;
    """
    k = _emu(body, name="divergent")
    x = _x(32)
    with pytest.raises(EmulatorError, match=r"divergent: divergent SIMD op at line \d+: in simdgroup 0 only 16 of 32"):
        k([x], [x.shape], (1, 1, 1), 32)


def test_simd_ops_at_different_sites_are_divergent():
    body = """
    float v = x[tq_tid];
    if (tq_lane & 1u) { v = tq_simd_sum(v); } else { v = tq_simd_max(v); }
    y[tq_tid] = v;
    """
    x = _x(32)
    with pytest.raises(EmulatorError, match="divergent SIMD op"):
        _emu(body, name="two_sites")([x], [x.shape], (1, 1, 1), 32)


def test_barrier_not_reached_by_all_threads_is_caught():
    body = "if (tq_tid < 32u) return; tq_barrier(); y[tq_tid] = x[tq_tid];"
    x = _x(64)
    with pytest.raises(EmulatorError, match="barrier at line \\d+ not reached by every thread"):
        _emu(body, name="early_exit")([x], [x.shape], (1, 1, 1), 64)
    body2 = "if (tq_tid < 32u) {\n tq_barrier();\n} else {\n tq_barrier();\n}\ny[tq_tid] = x[tq_tid];"
    with pytest.raises(EmulatorError, match="different barriers"):
        _emu(body2, name="two_barriers")([x], [x.shape], (1, 1, 1), 64)


def test_threadgroup_memory_starts_poisoned():
    body = "TQ_SHARED_ARRAY(uint, sh, 64); y[tq_tid] = tq_as_float(sh[tq_tid]);"
    x = _x(64)
    (y,) = _emu(body, name="poison")([x], [x.shape], (1, 1, 1), 64)
    assert np.all(y.view(np.uint32) == 0xFFFFFFFF)


def test_write_into_input_is_caught():
    body = "((float*)x)[tq_tid] = 0.0f; y[tq_tid] = 1.0f;"
    x = _x(32)
    with pytest.raises(EmulatorError, match="wrote into its input 'x'"):
        _emu(body, name="writes_input")([x], [x.shape], (1, 1, 1), 32)


def test_bad_launches_are_clear_errors():
    k = _emu("y[tq_tid] = x[tq_tid];", name="copy")
    x = _x(32)
    with pytest.raises(KernelError, match="multiple of 32"):
        k([x], [x.shape], (1, 1, 1), 48)
    with pytest.raises(KernelError, match="input 'x' must be float32"):
        k([x.astype(np.float64)], [x.shape], (1, 1, 1), 32)
    with pytest.raises(KernelError, match="not a C identifier"):
        Kernel("bad name", X, Y, "")
    with pytest.raises(KernelError, match="missing static parameter"):
        dispatch.build(Kernel("needs", X, Y, "", static_names=("N",)), {}, "cpu-emulator")
    with pytest.raises(KernelError, match="unknown backend"):
        dispatch.resolve("vulkan")


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    from tqbridge.metal import emulator

    with pytest.raises(EmulatorError, match="no C\\+\\+ compiler found"):
        emulator.find_compiler()
    from tqbridge.metal.backend import backends

    assert "cpu-emulator" not in backends()


def test_compile_error_is_reported():
    with pytest.raises(EmulatorError, match="C\\+\\+ compiler failed"):
        EmulatedKernel(Kernel("broken", X, Y, "y[0] = undefined_name;"), {})


def test_libraries_are_cached_by_source_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("TQBRIDGE_CACHE", str(tmp_path))
    kern = Kernel("cached", X, Y, "y[tq_tid] = x[tq_tid] * (float)SCALE;", static_names=("SCALE",))
    EmulatedKernel(kern, {"SCALE": 2})
    EmulatedKernel(kern, {"SCALE": 2})
    libs = sorted(p.name for p in (tmp_path / "emu").glob("*.so"))
    assert len(libs) == 1
    EmulatedKernel(kern, {"SCALE": 3})
    assert len(list((tmp_path / "emu").glob("*.so"))) == 2


def test_half_and_bfloat_conversions_match_numpy():
    body = """
    uint i = tq_gx * tq_tg_size + tq_tid;
    uint b = u[i];
    float f = tq_as_float(b);
    h[i] = tq_f32_to_f16_bits(f);
    bf[i] = tq_f32_to_bf16_bits(f);
    back[i] = tq_f16_bits_to_f32((ushort)(b & 0xffffu));
    """
    kern = Kernel("conv", (("u", "uint32"),), (("h", "uint16"), ("bf", "uint16"), ("back", "float32")), body)
    rng = np.random.default_rng(7)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345,
                        0x477FEFFF, 0x477FF000, 0x47800000, 0x33000000, 0x33000001, 0x32FFFFFF,
                        0x387FC000, 0x38800000, 0x00000001, 0x3F800000 | 0x1000, 0x3F800000 | 0x3000],
                       np.uint32)
    u = np.concatenate([special, rng.integers(0, 2**32, 4096 - special.size, dtype=np.uint32)])
    h, bf, back = dispatch.build(kern, {}, "cpu-emulator")([u], [u.shape] * 3, (u.size // 256, 1, 1), 256)
    f = u.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want_h = f.astype(np.float16).view(np.uint16)
    assert np.array_equal(h, want_h)
    from gguf import quants as gq

    assert np.array_equal(bf, gq.BF16.quantize_blocks(f.copy()).view(np.uint16))
    want_back = (u & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
    assert np.array_equal(back.view(np.uint32), want_back.view(np.uint32))


def test_thousands_of_threads_with_barriers_run():
    body = """
    TQ_SHARED_ARRAY(float, sh, 1024);
    uint i = tq_gx * tq_tg_size + tq_tid;
    sh[tq_tid] = x[i];
    for (uint h = tq_tg_size / 2u; h > 0u; h >>= 1) {
        tq_barrier();
        float a = tq_tid < h ? sh[tq_tid] + sh[tq_tid + h] : 0.0f;
        tq_barrier();
        if (tq_tid < h) sh[tq_tid] = a;
    }
    tq_barrier();
    y[i] = sh[0];
    """
    k = _emu(body, name="tree_sum")
    x = np.ones(1024 * 8, np.float32)
    (y,) = k([x], [x.shape], (8, 1, 1), 1024)
    assert np.all(y == 1024)


# ---- the Metal source, checked as C++ against a stub of the Metal names it uses -----------------
# Not a Metal compile (no Apple toolchain here): it catches typos and undefined dialect names in
# prelude_metal.h and in kernels as MLX would assemble them (header, then the generated signature).

def test_metal_source_is_well_formed(tmp_path):
    import importlib
    import subprocess

    from tqbridge.bridge import get_format
    from tqbridge.metal.emulator import find_compiler

    qa = importlib.import_module("tqbridge.metal.quantize_append")

    (tmp_path / "metal_stdlib").write_text(METAL_STUB)
    cases = [(Kernel("reverse_sum", X, Y, REVERSE_SUM), {})]
    for fmt in ("q8_0", "iq4_nl", "turbo3", "turbo4@g64"):
        static, _ = qa.static_and_table(get_format(fmt))
        for src16 in (False, True):
            cases.append((qa.quantize_kernel(src16), dict(static, QA_SRC=2 if src16 else 0)))
    def check(kern, static):
        src = tmp_path / f"{kern.name}.cpp"
        src.write_text(metal_as_cpp(kern, static))
        return subprocess.run([find_compiler(), "-std=c++17", "-fsyntax-only", "-w", "-I", str(tmp_path), str(src)],
                              capture_output=True, text=True)

    for kern, static in cases:
        proc = check(kern, static)
        assert proc.returncode == 0, f"{kern.name} {static}:\n{proc.stderr[:3000]}"
    # the check bites: a CUDA-only spelling is not Metal
    assert check(Kernel("cuda_only", X, Y, "__syncthreads(); y[tq_tid] = x[tq_tid];"), {}).returncode != 0


def test_a_build_never_compiles_a_source_another_build_is_writing(tmp_path, monkeypatch):
    """Processes building one kernel at once (pytest-xdist workers, campaign workers): while one compiles,
    another rewrites the kernel's source file in the cache, and writing a file truncates it first. Played
    here in order: each compile starts just after every kept source in the cache was truncated. The build
    must still load and give the exact answer (compiling the shared file built an empty library, which
    the cache then kept: AttributeError on every later use)."""
    from tqbridge.metal import emulator

    monkeypatch.setenv("TQBRIDGE_CACHE", str(tmp_path))
    real = emulator.subprocess.run

    def racing(cmd, *a, **kw):
        for f in (tmp_path / "emu").glob("*.cpp"):
            if not f.name.startswith("."):
                f.write_text("")
        return real(cmd, *a, **kw)

    monkeypatch.setattr(emulator.subprocess, "run", racing)
    x = _x(256 * 2, 3)
    (y,) = EmulatedKernel(Kernel("race_probe", X, Y, REVERSE_SUM), {})([x], [x.shape], (2, 1, 1), 256)
    want = _butterfly(x.reshape(2, 256)[:, ::-1].reshape(2, 8, 32), np.add).reshape(-1)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    kept = list((tmp_path / "emu").glob("race_probe-*.cpp"))
    assert len(kept) == 1 and "tq_emu_launch" in kept[0].read_text()
    assert not [f for f in (tmp_path / "emu").iterdir() if f.name.startswith(".")], "temporary files left"


def test_a_cached_library_without_its_entry_point_is_rebuilt(tmp_path, monkeypatch):
    """A library under the cache's name that loads but lacks tq_emu_launch (what the race above left in
    caches of earlier versions) is rebuilt, not used."""
    import subprocess

    from tqbridge.metal.emulator import find_compiler

    kern = Kernel("poison_probe", X, Y, REVERSE_SUM)
    monkeypatch.setenv("TQBRIDGE_CACHE", str(tmp_path / "a"))
    EmulatedKernel(kern, {})
    name = next((tmp_path / "a" / "emu").glob("poison_probe-*.so")).name
    monkeypatch.setenv("TQBRIDGE_CACHE", str(tmp_path / "b"))   # a name this process has not loaded
    (tmp_path / "b" / "emu").mkdir(parents=True)
    (tmp_path / "empty.cpp").write_text("")
    subprocess.run([find_compiler(), "-shared", "-fPIC", str(tmp_path / "empty.cpp"), "-o",
                    str(tmp_path / "b" / "emu" / name)], check=True)
    x = _x(256, 4)
    (y,) = EmulatedKernel(kern, {})([x], [x.shape], (1, 1, 1), 256)
    want = _butterfly(x.reshape(1, 256)[:, ::-1].reshape(1, 8, 32), np.add).reshape(-1)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
