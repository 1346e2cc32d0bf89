"""Every kernel build CUDA's plans make, compiled by nvcc for the H200's architecture (sm_90a) as MLX's
CUDA backend compiles it: the preludes, the static parameters, the body, and the kernel signature MLX
generates (inputs ``const T*``, outputs ``T*``: ``Kernel.cuda_source``), without a GPU.

The emulator runs the same bodies through the CPU prelude, and tests/test_metal_compile.py type-checks
them as Metal; neither sees what only CUDA's compiler does: the CUDA prelude's intrinsics (``__shfl_xor_sync``,
``prmt``, ``mma.sync`` and ``cp.async`` in inline PTX) with the operands each build gives them, dynamic
shared memory (``extern __shared__``, the plans beyond 48 KB), and the builds only CUDA's planner makes
(int8-mma's two-chunk static plans, the wide-row plan of one chunk in 4 SIMD groups). What a compile
cannot check: the kernels' results (the GPU tests) and their speed (``tqbridge bench``).
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the CUDA toolkit compiles these builds)")

ARCH = "sm_90a"   # the H200's, as benchmarks/scripts/kernel_sass.py builds them


def nvcc_errors(src: str, tmp: Path, name: str) -> str:
    """nvcc's diagnostics for ``src`` ("" when it compiles to a cubin)."""
    cu = tmp / f"{name}.cu"
    cu.write_text(src)
    r = subprocess.run([NVCC, f"-arch={ARCH}", "-cubin", "-std=c++17", "-o", str(tmp / f"{name}.cubin"), str(cu)],
                       capture_output=True, text=True)
    return "" if r.returncode == 0 else (r.stderr or r.stdout or f"nvcc exit status {r.returncode}")


def _attention_cases():
    from tqbridge import bridge
    from tqbridge.metal.attention import check_problem
    from tqbridge.metal.attention.build import kernel_defs, static_params
    from tqbridge.metal.attention.plan import make_plan
    from tqbridge.metal.attention.problem import KERNELS, AttentionError
    from tqbridge.bridge.blocks.padding import padded_dim
    from tqbridge.metal.codecs import rotation_group
    from tqbridge.metal.decode_options import DecodeOptions
    from tqbridge.metal.kernel import KernelError
    from tqbridge.metal.kv_append import prepared

    cases = []
    # (K, V, head dim, q type, query heads per KV head, options): CUDA's default plans (two chunks in static
    # memory; at 256 values the wide-row plan in dynamic memory), one chunk, the generic V decoder, every V decode
    for kf, vf, d, qtype, g, opts in [
            ("q8_0", "turbo3", 128, 1, 4, ""), ("q8_0", "turbo3", 256, 1, 2, ""), ("q8_0", "q4_0", 256, 2, 2, ""),
            ("q8_0", "turbo2", 256, 0, 2, ""), ("q8_0", "turbo3", 256, 1, 2, "v_decode=generic"),
            ("q4_1", "q5_0", 128, 1, 8, "chunks=1"), ("q5_1", "turbo4@g64", 128, 2, 4, ""),
            ("iq4_nl", "q8_0", 64, 1, 4, ""), ("f16", "bf16", 128, 0, 4, ""), ("q8_0", "f16", 256, 1, 2, "")]:
        q = np.zeros((1, 2 * g, d), np.float32)
        kb = bridge.quantize(kf, np.zeros((1, 2, 8, d)))
        vb = bridge.quantize(vf, np.zeros((1, 2, 8, d)))
        prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=8)
        options = DecodeOptions.parse(opts)
        for kernel in KERNELS:
            try:
                plan = make_plan(prob, "cuda", kernel=kernel, options=options)
            except AttentionError:   # int8-mma refuses some pairs (f16 K, bf16 V): lanes / tiles serve them
                continue
            for kern, static in zip(kernel_defs(qtype, plan.kernel), static_params(prob, plan, qtype, False)[:2]):
                tag = f"{kern.name}-{kf}-{vf}-d{d}-q{qtype}" + (f"-{opts}" if opts else "")
                if plan.kernel == "int8-mma" and kern.name.startswith("tq_attention_split"):
                    tag += f"-w{plan.warps}t{plan.tile}s{plan.stages}c{plan.chunks}" + ("-dyn" if plan.dyn_smem else "")
                cases.append((tag, kern, static))
            # pass 1 multiplying q by a key-calibrated cache's channel scales (TQA_QSC, one input more)
            cases.append((f"{plan.kernel}-qscale-{kf}-{vf}-d{d}-q{qtype}" + (f"-{opts}" if opts else ""),
                          kernel_defs(qtype, plan.kernel, True)[0], static_params(prob, plan, qtype, False, True)[0]))
            if plan.kernel == "int8-mma":   # the profiling build (TQA_PHASES: the global timer, one output more)
                cases.append((f"int8-mma-phases-{kf}-{vf}-d{d}-q{qtype}" + (f"-{opts}" if opts else ""),
                              kernel_defs(qtype, plan.kernel, False, True)[0],
                              {**static_params(prob, plan, qtype, False)[0], "TQA_PHASES": 1}))
                # the decode step's append folded into pass 1 (TQA_FOLD, kv_append's static parameters)
                try:
                    app = prepared(kf, vf, d, d, padded_dim(kf, d), padded_dim(vf, d), rotation_group(kf, d, "k"),
                                   rotation_group(vf, d, "v"), "float16", "cpu-emulator")
                except KernelError:   # a format the append kernel does not write
                    app = None
                if app is not None:
                    cases.append((f"int8-mma-fold-{kf}-{vf}-d{d}-q{qtype}" + (f"-{opts}" if opts else ""),
                                  kernel_defs(qtype, plan.kernel, False, False, "uint16")[0],
                                  {**static_params(prob, plan, qtype, False)[0], **app.static, "TQA_FOLD": 1}))
                    # a key-calibrated cache's: the append's kcal, q's channel scales (TQA_QSC)
                    cal = prepared(kf, vf, d, d, padded_dim(kf, d), padded_dim(vf, d), rotation_group(kf, d, "k"),
                                   rotation_group(vf, d, "v"), "float16" if qtype else "float32", "cpu-emulator",
                                   calibrated=True)
                    cases.append((f"int8-mma-fold-cal-{kf}-{vf}-d{d}-q{qtype}" + (f"-{opts}" if opts else ""),
                                  kernel_defs(qtype, plan.kernel, True, False, "uint16" if qtype else "float32", True)[0],
                                  {**static_params(prob, plan, qtype, False, True)[0], **cal.static, "TQA_FOLD": 1}))
    # one build of each kernel and static parameters is enough (the combine pass repeats across kernels)
    seen, out = set(), []
    for tag, kern, static in cases:
        key = (kern.name, tuple(sorted(static.items())))
        if key not in seen:
            seen.add(key)
            out.append((tag, kern, static))
    return out


def _append_cases():
    from helpers_kernels import append_cases as cases   # the same builds Metal's check takes

    return cases()


CASES = _attention_cases() + _append_cases() if NVCC else []


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """nvcc's diagnostics per case, compiled two at a time (one nvcc run each: about a second)."""
    tmp = tmp_path_factory.mktemp("cuda")
    with ThreadPoolExecutor(max_workers=2) as pool:
        errs = list(pool.map(lambda c: nvcc_errors(c[1].cuda_source(c[2]), tmp, f"k{c[3]}"),
                             [(*c, i) for i, c in enumerate(CASES)]))
    return dict(zip((c[0] for c in CASES), errs))


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_kernel_build_compiles_for_cuda(name, compiled):
    assert not compiled[name], f"{name}:\n{compiled[name][-2000:]}"


def test_cases_cover_the_cuda_plans():
    """The cases hold the builds only CUDA's planner makes: two-chunk static plans, the wide-row plan
    (one chunk, 4 SIMD groups, dynamic shared memory), the byte-permute V decodes at 256 values."""
    names = [c[0] for c in CASES]
    assert any("int8_mma" in n and "c2" in n and "-dyn" not in n for n in names), names
    assert any("int8_mma-q8_0-turbo3-d256" in n and "w4t64s3c1-dyn" in n for n in names), names
    statics = [c[2] for c in CASES if c[1].name == "tq_attention_split_int8_mma"]
    assert any(s["TQA_V23"] and s["TQA_DV"] == 256 for s in statics)
    assert any(s["TQA_VCODE"] and s["TQA_DV"] == 256 for s in statics)
    assert any(s["TQ_DSMEM"] > 48 * 1024 for s in statics)
    assert any("-phases-" in c[0] and c[2]["TQA_PHASES"] and c[1].outputs[-1][0] == "clk" for c in CASES)
    assert {c[1].name for c in CASES if "-qscale-" in c[0]} >= {"tq_attention_split_lanes", "tq_attention_split_tiles",
                                                               "tq_attention_split_int8_mma"}


def test_the_check_bites(tmp_path):
    """Mistakes nvcc sees and the other backends' checks may not: a Metal-only spelling, a shared-memory
    array too large for a threadgroup, a SIMD intrinsic with a missing operand; the same kernel without
    the mistake compiles."""
    from tqbridge.metal.kernel import Kernel

    x, y = (("x", "float32"),), (("y", "float32"),)
    good = "TQ_SHARED_ARRAY(float, sh, 32);\nsh[tq_tid] = x[tq_tid];\ntq_barrier();\ny[tq_tid] = sh[31 - tq_tid];"
    assert nvcc_errors(Kernel("good", x, y, good).cuda_source({}), tmp_path, "good") == ""
    metal_only = good + "\nthreadgroup_barrier(mem_flags::mem_threadgroup);"
    assert nvcc_errors(Kernel("metal_only", x, y, metal_only).cuda_source({}), tmp_path, "metal_only")
    too_big = good.replace("sh, 32", "sh, 65536")
    assert nvcc_errors(Kernel("too_big", x, y, too_big).cuda_source({}), tmp_path, "too_big")
    shuffle = good + "\ny[tq_tid] += __shfl_xor_sync(0xffffffffu, y[tq_tid]);"
    assert nvcc_errors(Kernel("shuffle", x, y, shuffle).cuda_source({}), tmp_path, "shuffle")
