"""Every kernel body as Metal would compile it, type-checked by clang (libclang) against a
declarations-only stand-in for the Metal standard library.

No Mac runs CI, so the Metal path is never compiled by Apple's compiler here. What this checks, beyond
the C++ syntax check of tests/test_emulator.py: Metal's address spaces as distinct pointer types
(``device``, ``threadgroup``, ``constant`` are clang address spaces: a threadgroup pointer passed where
a device pointer is expected fails), ``half`` as a real binary16 type and ``half2`` as a two-lane
vector (arithmetic on them type-checks), every Metal name the preludes use declared with the
signature they are called with, no C++ standard library (Metal has none), and the kernel signature as
MLX generates it (inputs ``const device T*``, outputs ``device T*``, thread-position attributes). What
only a Mac can check: the Metal compiler's own rules (e.g. which attributes it accepts where, its
limits on threadgroup memory), its numerics, and that the kernels run. Threadgroup arrays are declared
``extern`` here (clang's C++ has no threadgroup storage in function scope; the prelude's spelling is
asserted before it is replaced).
"""

from __future__ import annotations

import pytest

# decided before any kernel source is made: the libclang wheel is in the `test` extra; without it, say why
try:
    from clang import cindex
except ImportError as e:
    _CLANG = f"libclang is not installed ({e}); pip install libclang"
else:
    try:
        cindex.Index.create()
        _CLANG = None
    except cindex.LibclangError as e:
        _CLANG = f"libclang does not load here: {e}"

pytestmark = pytest.mark.skipif(_CLANG is not None, reason=_CLANG or "")

import numpy as np  # noqa: E402

from tqbridge import bridge  # noqa: E402
from tqbridge.metal.kernel import Kernel  # noqa: E402
from helpers_kernels import append_cases  # noqa: E402

METAL_STDLIB = r"""
#pragma once
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
typedef unsigned long size_t;
typedef long ptrdiff_t;
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
struct uint3 { uint x, y, z; };
typedef _Float16 half;
typedef half half2 __attribute__((ext_vector_type(2)));
namespace metal {
template <typename T, typename U> T as_type(U u) {
    static_assert(sizeof(T) == sizeof(U), "as_type: sizes differ");
    T t;
    __builtin_memcpy(&t, &u, sizeof t);
    return t;
}
namespace precise {
float divide(float a, float b);
float sqrt(float a);
float exp(float a);
float exp2(float a);
}
template <typename T> T simd_shuffle(T v, ushort lane);
template <typename T> T simd_shuffle_xor(T v, ushort mask);
template <typename T> T simd_broadcast(T v, ushort lane);
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
mem_flags operator|(mem_flags a, mem_flags b);
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);
float fma(float a, float b, float c);
float trunc(float a);
float floor(float a);
}
"""

SHARED_SPELLING = "#define TQ_SHARED_ARRAY(T, name, n) threadgroup T name[n]"


def _source(kern: Kernel, static: dict) -> str:
    from helpers_kernels import metal_as_cpp

    src = metal_as_cpp(kern, static)
    assert src.count(SHARED_SPELLING) == 1, "the Metal prelude's threadgroup-array spelling changed"
    return src.replace(SHARED_SPELLING, "#define TQ_SHARED_ARRAY(T, name, n) extern threadgroup T name[n]")


def clang_errors(src: str) -> "list[str]":
    """clang's errors for ``src`` (a Metal translation unit) with :data:`METAL_STDLIB` as <metal_stdlib>."""
    index = cindex.Index.create()
    tu = index.parse("kernel.metal.cpp", args=["-std=c++17", "-x", "c++", "-nostdinc", "-nostdinc++", "-I", "/metal"],
                     unsaved_files=[("kernel.metal.cpp", src), ("/metal/metal_stdlib", METAL_STDLIB)])
    lines = src.splitlines()
    out = []
    for d in tu.diagnostics:   # read while the translation unit is alive
        if d.severity >= cindex.Diagnostic.Error:
            at = lines[d.location.line - 1].strip() if 0 < d.location.line <= len(lines) else ""
            out.append(f"{d.spelling} | {at[:160]}")
    return out


def _attention_cases():
    from tqbridge.metal.attention import check_problem
    from tqbridge.metal.attention.build import kernel_defs, static_params
    from tqbridge.metal.attention.plan import make_plan
    from tqbridge.metal.attention.problem import KERNELS, AttentionError
    from tqbridge.bridge.blocks.padding import padded_dim
    from tqbridge.metal.codecs import rotation_group
    from tqbridge.metal.kv_append import prepared

    cases = []
    for kf, vf, d, qtype in [("q8_0", "turbo3", 128, 0), ("q4_1", "q5_0", 128, 1), ("turbo4@g64", "q5_1", 128, 2),
                             ("iq4_nl", "turbo2", 128, 1), ("q5_1", "q4_0", 64, 2), ("f16", "bf16", 128, 0), ("q8_0", "q8_0", 256, 1)]:
        q = np.zeros((1, 4, d), np.float32)
        kb = bridge.quantize(kf, np.zeros((1, 1, 8, d)))
        vb = bridge.quantize(vf, np.zeros((1, 1, 8, d)))
        prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=8)
        for kernel in KERNELS:
            try:
                plan = make_plan(prob, "metal", kernel=kernel)
            except AttentionError:   # int8-mma refuses some pairs (f16 K, bf16 V): lanes / tiles serve them
                continue
            for dyn in ((False,) if kernel == "int8-mma" else (False, True)):
                for kern, static in zip(kernel_defs(qtype, plan.kernel), static_params(prob, plan, qtype, dyn)[:2]):
                    cases.append((f"{kern.name}-{kf}-{vf}-d{d}-q{qtype}-{'generic' if dyn else 'pair'}", kern, static))
            # pass 1 multiplying q by a key-calibrated cache's channel scales (TQA_QSC, one input more)
            cases.append((f"{plan.kernel}-qscale-{kf}-{vf}-d{d}-q{qtype}", kernel_defs(qtype, plan.kernel, True)[0],
                          static_params(prob, plan, qtype, False, True)[0]))
            if plan.kernel == "int8-mma" and kf == "q8_0":   # the decode step's append folded into pass 1
                app = prepared(kf, vf, d, d, padded_dim(kf, d), padded_dim(vf, d), rotation_group(kf, d, "k"),
                               rotation_group(vf, d, "v"), "float16", "cpu-emulator")
                cases.append((f"int8-mma-fold-{kf}-{vf}-d{d}-q{qtype}", kernel_defs(qtype, plan.kernel, False, False,
                                                                                   "uint16")[0],
                              {**static_params(prob, plan, qtype, False)[0], **app.static, "TQA_FOLD": 1}))
    return cases


CASES = _attention_cases() + append_cases() if _CLANG is None else []


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_kernel_body_type_checks_as_metal(case):
    name, kern, static = case
    errors = clang_errors(_source(kern, static))
    assert not errors, f"{name}:\n" + "\n".join(errors[:12])


X = (("x", "float32"),)
Y = (("y", "float32"),)


def test_the_check_bites():
    """Three mistakes only a Metal compiler would see (the CPU emulator and CUDA build them): a
    threadgroup pointer where a device pointer is expected, a CUDA-only spelling, arithmetic on a
    half2 assigned to a float; and the same kernel without the mistake type-checks."""
    good = "TQ_SHARED_ARRAY(float, sh, 32);\nsh[tq_tid] = x[tq_tid];\ntq_barrier();\ny[tq_tid] = sh[31 - tq_tid];"
    assert clang_errors(_source(Kernel("good", X, Y, good), {})) == []
    mixed = good + "\nTQ_DEVICE float* p = sh;\np[0] = 1.0f;"
    errors = clang_errors(_source(Kernel("mixed", X, Y, mixed), {}))
    assert errors and "cannot initialize" in errors[0] and "address_space(3)" in errors[0], errors
    assert clang_errors(_source(Kernel("cuda_only", X, Y, "__syncthreads(); y[tq_tid] = x[tq_tid];"), {}))
    halves = "half2 h = half2(1.0h, 2.0h) * half2(3.0h, 4.0h);\nfloat f = h;\ny[tq_tid] = f;"
    assert clang_errors(_source(Kernel("halves", X, Y, halves), {}))
