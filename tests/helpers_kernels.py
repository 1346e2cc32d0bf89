"""Helpers the kernel tests share (imported by name from the test files; pytest puts tests/ on the path):
quantized K/V caches and the int8-mma check against the oracle, a planted edit in the kernel sources, and
the kernel sources as the compile checks see them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

from tqbridge import bridge
from tqbridge.bridge.blocks.padding import pad_rows
from tqbridge.metal.attention import build as attention_build
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.attention import check_problem, decode_attention, last_run
from tqbridge.metal.attention.ref import oracle
from tqbridge.metal.kernel import Kernel
from tqbridge.parity.plugin.strategies_attention import value_rows

METAL = Path(__file__).resolve().parents[1] / "metal" / "kernels"


def quantized_cache(rng, fmt, shape, kind="normal", scale=1.0):
    """Blocks of ``fmt`` holding random rows of ``shape`` (a value kind of the plugin's ``value_rows``),
    zero-padded to whole blocks as TQCache stores them."""
    x = value_rows(rng, kind, shape, scale)
    return bridge.quantize(fmt, pad_rows(fmt, x))


def check_int8_mma(backend, q, kb, vb, **kw):
    """Run kernel int8-mma (int8 q) on ``backend`` and hold every output to the int8 oracle's bound;
    returns (output, oracle, bound)."""
    opts = {k: kw.pop(k) for k in ("splits", "warps", "tile", "seed", "options") if k in kw}
    got = decode_attention(q, kb, vb, backend=backend, q_precision="int8", **kw, **opts)
    run = last_run()
    assert run["backend"] == backend and run["kernel"] == "int8-mma" and run["q_precision"] == "int8"
    assert run["dispatches"] == 2
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


def plant_in_sources(tmp_path, monkeypatch, name, old, new):
    """The kernel sources from a copy in ``tmp_path`` whose ``name`` has ``old`` replaced by ``new``."""
    src = (attention_build.KERNEL_DIR / name).read_text()
    assert src.count(old) == 1, f"{name} changed: the text this test plants its bug in is gone"
    for f in attention_build.KERNEL_DIR.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / name).write_text(src.replace(old, new))
    monkeypatch.setattr(attention_build, "KERNEL_DIR", tmp_path)
    attention_build.kernel_defs.cache_clear()
    attention_kernel.clear_launch_caches()


def c_ids(header: str, prefix: str) -> dict[str, int]:
    """``#define <prefix><NAME> <number>`` lines of a kernel header: NAME -> number."""
    text = (METAL / header).read_text()
    return {m[1]: int(m[2]) for m in re.finditer(rf"^#define {prefix}(\w+)[ \t]+(\d+)\b", text, re.M)}


# the Metal names the kernels use, as a C++ stub: clang type-checks Metal sources against it (no Apple toolchain)
METAL_STUB = r"""
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#define device
#define threadgroup
#define constant
#define thread
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
struct uint3 { uint x, y, z; };
struct half { ushort bits; half() = default; half(float) : bits(0) {} operator float() const { return 0.0f; } };  // Metal's half, for syntax only
struct half2 { half x, y; half2 operator*(half2 o) const { return o; } half2 operator+(half2 o) const { return o; } };
namespace metal {
struct atomic_uint { uint v; };
enum memory_order { memory_order_relaxed };
inline uint atomic_fetch_add_explicit(atomic_uint*, uint, memory_order) { return 0u; }
template <typename T, typename U> T as_type(U u) { static_assert(sizeof(T) == sizeof(U), "size"); T t; std::memcpy(&t, &u, sizeof t); return t; }
namespace precise {
inline float divide(float a, float b) { return a / b; }
inline float sqrt(float a) { return std::sqrt(a); }
inline float exp(float a) { return std::exp(a); }
inline float exp2(float a) { return std::exp2(a); }
}
template <typename T> T simd_shuffle(T v, ushort) { return v; }
template <typename T> T simd_shuffle_xor(T v, ushort) { return v; }
template <typename T> T simd_broadcast(T v, ushort) { return v; }
enum class mem_flags { mem_device = 1, mem_threadgroup = 2 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((int)a | (int)b); }
inline void threadgroup_barrier(mem_flags) {}
inline void simdgroup_barrier(mem_flags) {}
using std::fma; using std::trunc; using std::floor;
}
"""


METAL_ATTRS = ["thread_index_in_threadgroup", "threads_per_threadgroup", "thread_index_in_simdgroup",
               "simdgroup_index_in_threadgroup", "threadgroup_position_in_grid", "threadgroups_per_grid"]


def metal_as_cpp(kern: Kernel, static: dict) -> str:
    """``kern`` as one Metal translation unit: its header, then a ``[[kernel]]`` function over its buffers
    and the thread-position attributes its body reads."""
    from tqbridge.metal.kernel import CTYPES

    params = [f"const device {CTYPES[d]}* {n} [[buffer({i})]]" for i, (n, d) in enumerate(kern.inputs)]
    params += [f"device {CTYPES[d]}* {n} [[buffer({len(kern.inputs) + i})]]" for i, (n, d) in enumerate(kern.outputs)]
    body = kern.body_source("metal")
    for a in METAL_ATTRS:
        if a in body:
            t = "uint3" if a.endswith(("per_threadgroup", "in_grid", "per_grid")) else "uint"
            params.append(f"{t} {a} [[{a}]]")
    return (kern.header_source("metal", static) + f"\n[[kernel]] void {kern.name}(\n  "
            + ",\n  ".join(params) + ") {\n" + body + "\n}\n")


def append_cases():
    """(name, kernel, static parameters) of the append kernels' builds the compile checks take."""
    import importlib

    from tqbridge.metal import kv_append

    quantize_append = importlib.import_module("tqbridge.metal.quantize_append")   # (the package exports a function of that name)
    cases = []
    for fmt in ("q8_0", "q4_0", "iq4_nl", "turbo3", "turbo4@g64"):
        static, _ = quantize_append.static_and_table(bridge.get_format(fmt))
        for src16 in (False, True):
            cases.append((f"quantize_append-{fmt}-{src16}", quantize_append.quantize_kernel(src16), dict(static, QA_SRC=2 if src16 else 0)))
    for kf, vf, d in (("q8_0", "turbo3", 128), ("q4_0", "q4_0", 64), ("turbo4", "q8_0", 256)):
        k, v = bridge.get_format(kf), bridge.get_format(vf)
        krot = 0 if k.kind == "turbo" else 128 if d % 128 == 0 else 64
        static = {"KV_MAX_DP": kv_append.MAX_DP, "KV_FLAG_MIN": kv_append.FLAG_MIN,
                  **kv_append.side_static("KA", k, d, d, krot), **kv_append.side_static("VA", v, d, d, 0)}
        for src16 in (False, True):
            cases.append((f"kv_append-{kf}-{vf}-d{d}-{src16}", kv_append.append_kernel(src16),
                          dict(static, QA_SRC=1 if src16 else 0, KV_CAL=0)))
        # the calibrated append (key means and scales in one more buffer)
        cases.append((f"kv_append-cal-{kf}-{vf}-d{d}", kv_append.append_kernel(True, True),
                      dict(static, QA_SRC=1, KV_CAL=1)))
    cases.append(("kv_grow", kv_append.grow_kernel(), {}))
    return cases
