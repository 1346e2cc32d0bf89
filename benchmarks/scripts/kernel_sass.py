"""Static profile of a fused attention kernel's pass 1 for sm_90a, without a GPU.

Compiles the same dialect source MLX compiles on CUDA (as ``kernel_device_time.py`` builds it) with
the local ``nvcc``, then reads the machine code (``cuobjdump -sass``, which needs ``nvdisasm`` on
the PATH) and reports: registers per thread, spill bytes, static shared memory, and the key loop —
the innermost loop holding the tensor-core products — counted by instruction class. The loop body
serves 16 keys per SIMD group and chunk (``--chunks``, int8-mma's ``Plan.chunks``), so ``per_key`` = body / (16 x chunks). The counts are static: both sides of
every branch inside the loop (the masked-edge path, the rescale taken only when a maximum moved)
are included, so the common path issues fewer. An issue-bound kernel's time follows its
instructions per key; this is the profile to read before and after a change to the inner loop.

    python benchmarks/scripts/kernel_sass.py --pairs q8_0/turbo3,q8_0/q4_0 [--kernel int8-mma] [--common-path] [--json out.json]
    python benchmarks/scripts/kernel_sass.py --cubin MODULE.ptx    (a cubin built elsewhere, e.g. MLX's cached one)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from tqbridge.bridge.blocks.kv_spec import split_kv

sys.path.insert(0, str(Path(__file__).resolve().parent))

CLASSES = (   # opcode (the mnemonic before its first '.') -> class; uniform-datapath ops start with 'U'
    ("tensor", ("IMMA", "HMMA")),
    ("shared_load", ("LDS",)),
    ("global_or_async", ("LDG", "LDGSTS", "STG", "LDGDEPBAR", "DEPBAR")),
    ("shuffle_or_movmatrix", ("SHFL", "MOVM")),
    ("float", ("FMUL", "FADD", "FFMA", "FMNMX", "FSETP", "FSEL", "MUFU", "F2FP", "HMUL2", "HFMA2", "HADD2", "F2F",
               "I2F", "F2I", "I2FP", "F2IP", "FCHK")),
    ("integer_logic", ("IMAD", "IADD3", "LOP3", "SHF", "LEA", "PRMT", "ISETP", "SEL", "VIADD", "IABS", "BMSK",
                       "SGXT", "CS2R", "MOV", "I2I", "POPC", "FLO", "BREV", "PLOP3", "P2R", "R2P")),
    ("control", ("BRA", "BSSY", "BSYNC", "BAR", "WARPSYNC", "EXIT", "NOP", "YIELD", "VOTE", "S2R", "S2UR", "CS2UR",
                 "CALL", "RET")),
)


def _class(op: str) -> str:
    for name, ops in CLASSES:
        if op in ops:
            return name
    return "uniform" if op.startswith("U") or op == "R2UR" else "other"


def _source(prob, plan):
    from kernel_device_time import cuda_unit as src
    from tqbridge.metal.attention.build import kernel_defs, static_params

    split_s, _, _, _ = static_params(prob, plan, 0, False)
    k1def, _ = kernel_defs(0, plan.kernel)
    return k1def.name, src(k1def, split_s)


# --common-path: the loop as a long context runs it almost always (every key of a tile visible, no
# softcap, no running maximum moved): the other branches are removed from the source, so that the
# static count of what remains is the common path's count (int8-mma)
COMMON_PATH = (("            if (inner && softcap <= 0.0f) {", "            if (true) {"),
               ("        if (moved) {", "        if (false) {"))


def _common_path(text: str) -> str:
    for old, new in COMMON_PATH:
        if old not in text:
            raise SystemExit(f"kernel_sass: --common-path: {old.strip()!r} is no longer in the kernel source")
        text = text.replace(old, new, 1)
    return text


def loop_profile(sass: str, keys: int = 16) -> dict:
    """The key loop of ``cuobjdump -sass`` text (the innermost loop holding every tensor-core product),
    counted by instruction class; ``per_key``: the body serves ``keys`` keys per SIMD group (int8-mma: 16 per
    chunk, ``Plan.chunks`` chunks per step)."""
    ins = []   # (address, opcode, full text)
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(3) + m.group(4)))
    mma = [a for a, op, _ in ins if op.startswith(("HMMA", "IMMA"))]
    loops = []
    for a, op, t in ins:
        if op.startswith("BRA"):
            tgt = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", t)
            if tgt and int(tgt.group(1), 16) < a and mma and int(tgt.group(1), 16) <= min(mma) and a >= max(mma):
                loops.append((int(tgt.group(1), 16), a))
    if not loops:
        raise RuntimeError("no loop encloses the tensor-core products")
    lo, hi = max(loops)   # the innermost: the latest start among the enclosing back-edges
    body = [op for a, op, _ in ins if lo <= a <= hi]
    by = Counter(_class(op.split(".")[0]) for op in body)
    ops = Counter(op.split(".")[0] for op in body)
    # the outermost enclosing loop (int8-mma: the tile loop, staging copies and barriers around the key loop)
    tlo, thi = min(loops)
    outer = [op for a, op, _ in ins if tlo <= a <= thi and not lo <= a <= hi]
    return {"loop_instructions": len(body), "per_key": round(len(body) / keys, 1), "keys_per_iteration": keys,
            "by_class": dict(by.most_common()),
            "top_opcodes": dict(ops.most_common(12)),
            "outer_loop_extra_instructions": len(outer),
            "outer_loop_copies": sum(op.startswith("LDGSTS") for op in outer)}


def cubin_profile(path: str) -> dict:
    """Registers, shared memory and the key loop of a kernel built elsewhere: e.g. the cubin MLX caches
    for a custom kernel (``$MLX_PTX_CACHE_DIR``, default ``<tmp>/mlx/<version>/ptx``, one module per
    kernel; its ``.ptx`` holds a cubin when NVRTC compiles to machine code), to compare with this
    script's own build of the same source."""
    res = subprocess.run(["cuobjdump", "-res-usage", path], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", res)
    if not m:
        raise RuntimeError(f"cuobjdump -res-usage {path}: no resource line")
    regs, stack, smem, local = (int(x) for x in m.groups())
    return {"cubin": Path(path).name, "registers": regs, "stack_bytes": stack, "static_smem_bytes": smem,
            "local_bytes": local, **loop_profile(sass)}


def profile(k_format: str, v_format: str, kernel: str = "int8-mma", q_heads: int = 32, kv_heads: int = 8,
            head_dim: int = 128, context: int = 131072, arch: str = "sm_90a", common_path: bool = False,
            chunks: "int | None" = None, v_decode: str = "fast") -> dict:
    from tqbridge import bridge
    from tqbridge.metal.attention import check_problem
    from tqbridge.metal.attention.plan import make_plan
    from tqbridge.metal.attention.problem import kernel_name
    from tqbridge.metal.decode_options import DecodeOptions

    kf, vf = bridge.get_format(k_format), bridge.get_format(v_format)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, q_heads, head_dim)).astype(np.float32)
    kb = bridge.quantize(kf, rng.standard_normal((1, kv_heads, 256, head_dim)).astype(np.float32))
    vb = bridge.quantize(vf, rng.standard_normal((1, kv_heads, 256, head_dim)).astype(np.float32))
    prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, length=256)
    prob = dataclasses.replace(prob, l_max=context, lengths=(context,))
    kernel = kernel_name(kernel)   # an unknown name: an AttentionError listing the kernels
    plan = make_plan(prob, "cuda", kernel=kernel, chunks=chunks if kernel == "int8-mma" else None,
                     options=DecodeOptions(v_decode=v_decode))
    name, text = _source(prob, plan)
    if common_path:
        text = _common_path(text)
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        cu.write_text(text)
        r = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-std=c++17", "--resource-usage", "-o", str(cubin),
                            str(cu)], capture_output=True, text=True, check=True)
        usage = r.stdout + r.stderr
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"Used (\d+) registers", usage).group(1))
    spills = [int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", usage).groups()]
    smem_m = re.search(r"(\d+) bytes smem", usage)
    smem = int(smem_m.group(1)) if smem_m else 0
    loop = loop_profile(sass, 16 * plan.chunks)
    return {"k_format": kf.key, "v_format": vf.key, "kernel": plan.kernel, "arch": arch,
            "shape": dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, context=context),
            "plan": dict(warps=plan.warps, splits=plan.splits, tile=plan.tile, chunks=plan.chunks,
                         dyn_smem=plan.dyn_smem, stages=plan.stages, v_decode=plan.v_decode),
            "registers": regs, "spill_store_bytes": spills[0], "spill_load_bytes": spills[1], "static_smem_bytes": smem,
            "common_path": common_path, **loop}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="q8_0/turbo3,q8_0/q4_0,q8_0/turbo4,q4_0/q4_0,q8_0/f16")
    ap.add_argument("--kernel", default="int8-mma")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=None,
                    help="int8-mma: 16-key chunks per SIMD-group step (default: the plan's)")
    ap.add_argument("--common-path", action="store_true",
                    help="int8-mma: count the loop's common path only (every key visible, no softcap, no rescale)")
    ap.add_argument("--cubin", default=None, help="profile this prebuilt cubin (e.g. MLX's cached build of the "
                    "kernel) instead of building --pairs")
    ap.add_argument("--v-decode", default="fast", choices=("fast", "generic"),
                    help="int8-mma's V decode (DecodeOptions.v_decode): the byte-permute paths or the generic decoder")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    for tool in ("nvcc", "cuobjdump", "nvdisasm"):
        if shutil.which(tool) is None:
            print(f"kernel_sass: {tool} not found on PATH (CUDA toolkit; cuobjdump needs nvdisasm: both are also in "
                  "PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, under nvidia/cu13/bin)", file=sys.stderr)
            return 2
    if a.cubin:
        row = cubin_profile(a.cubin)
        print(json.dumps({x: row[x] for x in ("cubin", "registers", "static_smem_bytes", "local_bytes",
                                              "loop_instructions", "per_key", "by_class")}))
        if a.json:
            Path(a.json).write_text(json.dumps({"what": "static profile of a prebuilt cubin", "rows": [row]},
                                               indent=1) + "\n")
        return 0
    rows = []
    for pair in a.pairs.split(","):
        k, v = split_kv(pair)
        row = profile(k, v, a.kernel, head_dim=a.head_dim, common_path=a.common_path, chunks=a.chunks,
                      v_decode=a.v_decode)
        rows.append(row)
        print(json.dumps({x: row[x] for x in ("k_format", "v_format", "registers", "spill_store_bytes",
                                              "loop_instructions", "per_key", "by_class")}))
    if a.json:
        nv = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        Path(a.json).write_text(json.dumps({"what": "static profile of pass 1 (sm_90a machine code, no GPU)",
                                            "command": "python benchmarks/scripts/kernel_sass.py " + " ".join(argv or sys.argv[1:]),
                                            "nvcc": nv, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
