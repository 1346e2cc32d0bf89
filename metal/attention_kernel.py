"""The fused decode-attention kernel: static parameters, launch plan and the two dispatches.

Pass 1 (``attention_kernel_split.cpp``) runs one threadgroup per (batch row, KV head, split);
pass 2 (``attention_kernel_combine.cpp``) one per output row. Both are tqbridge-dialect kernels
(:mod:`.kernel`) with the helpers of ``attention_kernel.h``; the same source runs on Metal, on
CUDA (MLX's CUDA backend) and on the CPU SIMT emulator. Per-call values (lengths, split size,
scale, softcap) travel in small parameter buffers, so a new token never builds a new kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import attention
from .attention import AttentionError, Problem

HERE = Path(__file__).resolve().parent
MAX_PARTIALS = 1024          # pass 2 keeps one weight per partial in threadgroup memory
COMBINE_THREADS = 128
TARGET_GROUPS_GPU = 1056     # pass-1 threadgroups to aim for on a GPU (H200: 132 SMs x 8)
EMU_SPLIT_KEYS = 256         # on the emulator: about this many keys per split

# format name -> kernel format id (attention_kernel.h, TQA_*)
FORMAT_IDS = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_0": 4, "q4_1": 5, "q5_0": 6, "q5_1": 7,
              "iq4_nl": 8, "turbo2": 9, "turbo3": 10, "turbo4": 11}
QTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


@dataclass(frozen=True)
class Plan:
    lanes_per_key: int
    warps: int
    splits: int
    split_len: int

    @property
    def partials(self) -> int:
        return self.splits * self.warps

    def chain(self, length: int) -> int:
        """Longest serial accumulation (for the error bound): keys per lane slot + merges."""
        keys_per_slot = -(-min(self.split_len, max(length, 1)) // (self.warps * (32 // self.lanes_per_key)))
        return keys_per_slot + int(math.log2(32 // self.lanes_per_key)) + self.partials


def _fmt_params(fmt) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, float]:
    """Static parameters, 16-entry value table, sign tables (s1, s2) and rotation scale of a format."""
    fid = FORMAT_IDS.get(fmt.name)
    if fid is None:
        raise AttentionError(f"the attention kernel has no decoder for format {fmt.key}")
    tab = np.zeros(16, np.float32)
    s1 = s2 = np.ones(128, np.float32)
    rot_scale = 1.0
    static = dict(ID=fid, BB=fmt.type_size, GRP=fmt.block_size, QS=0, SG=0, ROT=0)
    if fmt.kind == "turbo":
        sp = fmt.codec.spec
        tab[: sp.levels] = sp.centroids
        s1 = np.ones(128, np.float32); s1[: sp.group] = sp.s1
        s2 = np.ones(128, np.float32); s2[: sp.group] = sp.s2
        rot_scale = float(sp.scale)
        static.update(QS=sp.qs_offset, SG=sp.signs_offset or 0, ROT=1)
    elif fmt.name == "iq4_nl":
        from ..bridge.iq4_nl import KVALUES

        tab[:] = KVALUES.astype(np.float32)
    return static, tab, s1, s2, rot_scale


def tables(prob: Problem) -> np.ndarray:
    """The ``tabs`` buffer: K/V value tables, K/V sign tables, K/V rotation scales (546 floats)."""
    _, kt, ks1, ks2, kscale = _fmt_params(prob.k_format)
    _, vt, vs1, vs2, vscale = _fmt_params(prob.v_format)
    return np.concatenate([kt, vt, ks1, ks2, vs1, vs2, [kscale, vscale]]).astype(np.float32)


def _lanes_per_key(dk: int, dv: int) -> int:
    ok = [n for n in (4, 8, 16, 32) if dk % (4 * n) == 0 and dv % (4 * n) == 0]
    if not ok:
        raise AttentionError(f"head rows of {dk} / {dv} values are not multiples of 16")
    small = [n for n in ok if max(dk, dv) // n <= 16]
    return small[0] if small else ok[-1]


def make_plan(prob: Problem, backend: str, *, splits: "int | None" = None, lanes_per_key: "int | None" = None,
              warps: "int | None" = None) -> Plan:
    lpk = _lanes_per_key(prob.k_dim, prob.v_dim) if lanes_per_key is None else int(lanes_per_key)
    if lpk not in (4, 8, 16, 32) or prob.k_dim % (4 * lpk) or prob.v_dim % (4 * lpk):
        raise AttentionError(f"lanes_per_key={lpk} does not divide rows of {prob.k_dim} / {prob.v_dim} values in chunks of 4")
    nw = 4 if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    l_used = max(max(prob.lengths), 1)
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            per_group = nw * (32 // lpk) * 4     # at least 4 key steps per SIMD group
            splits = max(1, min(-(-l_used // per_group), TARGET_GROUPS_GPU // (prob.batch * prob.kv_heads)))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS // nw, l_used)
    return Plan(lpk, nw, splits, -(-l_used // splits))


def _static(prob: Problem, plan: Plan, qtype: int) -> tuple[dict, dict]:
    ks, *_ = _fmt_params(prob.k_format)
    vs, *_ = _fmt_params(prob.v_format)
    split = dict(TQA_KF=ks["ID"], TQA_VF=vs["ID"], TQA_KBB=ks["BB"], TQA_VBB=vs["BB"], TQA_KGRP=ks["GRP"],
                 TQA_VGRP=vs["GRP"], TQA_KQS=ks["QS"], TQA_VQS=vs["QS"], TQA_KSG=ks["SG"], TQA_VSG=vs["SG"],
                 TQA_DK=prob.k_dim, TQA_DV=prob.v_dim, TQA_D=prob.head_dim, TQA_G=prob.group, TQA_T=prob.rows,
                 TQA_LPK=plan.lanes_per_key, TQA_NW=plan.warps, TQA_KROT=ks["ROT"], TQA_VROT=vs["ROT"],
                 TQA_QTYPE=qtype)
    combine = dict(TQA_DV=prob.v_dim, TQA_D=prob.head_dim, TQA_T=prob.rows, TQA_VGRP=vs["GRP"],
                   TQA_VROT=vs["ROT"], TQA_NT=COMBINE_THREADS, TQA_QTYPE=qtype)
    return split, combine


@lru_cache(maxsize=None)
def _kernel_defs(qtype: int):
    from .kernel import Kernel

    header = (HERE / "attention_kernel.h").read_text()
    qdt = "float32" if qtype == 0 else "uint16"
    split = Kernel(
        "tq_attention_split",
        (("q", qdt), ("kb", "uint8"), ("vb", "uint8"), ("lens", "int32"), ("ip", "int32"), ("fp", "float32"),
         ("tabs", "float32")),
        (("po", "float32"), ("pml", "float32")),
        (HERE / "attention_kernel_split.cpp").read_text(), header)
    combine = Kernel(
        "tq_attention_combine",
        (("po", "float32"), ("pml", "float32"), ("ip", "int32"), ("sinks", "float32"), ("tabs", "float32")),
        (("out", qdt),),
        (HERE / "attention_kernel_combine.cpp").read_text(), header)
    return split, combine


def pick_backend(requested: str) -> str:
    if requested in ("cpu-emulator", "cuda", "metal"):
        return requested
    try:
        import mlx.core as mx
    except ImportError:
        return "cpu-emulator"
    if mx.default_device() == mx.gpu:
        if mx.metal.is_available():
            return "metal"
        if getattr(mx, "cuda", None) is not None and mx.cuda.is_available():
            return "cuda"
    return "cpu-emulator"


# ----------------------------------------------------------------------------- emulator


@lru_cache(maxsize=64)
def _emulated(which: int, qtype: int, static_items: tuple):
    from .emulator import EmulatedKernel

    return EmulatedKernel(_kernel_defs(qtype)[which], dict(static_items))


def _np(a: Any) -> np.ndarray:
    from .attention_ref import _np as conv

    return conv(a)


def _run_emulator(q, kb, vb, prob: Problem, sinks, plan: Plan, qtype: int, seed=None):
    split_s, comb_s = _static(prob, plan, qtype)
    if qtype == 2:  # bfloat16 exists only as MLX arrays: take the bits
        import mlx.core as mx

        qn = np.array(mx.view(q, mx.uint16))
    else:
        qn = _np(q)
        if qtype == 1:
            qn = np.ascontiguousarray(qn).view(np.uint16)
    qn = np.ascontiguousarray(qn)
    rows = prob.batch * prob.q_heads * prob.rows
    np_ = plan.partials
    ip1 = np.array([prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads], np.int32)
    fp1 = np.array([prob.scale, prob.softcap], np.float32)
    tabs = tables(prob)
    lens = np.array(prob.lengths, np.int32)
    k1 = _emulated(0, qtype, tuple(sorted(split_s.items())))
    po, pml = k1([qn, np.ascontiguousarray(_np(kb)), np.ascontiguousarray(_np(vb)), lens, ip1, fp1, tabs],
                 [(rows, np_, prob.v_dim), (rows, np_, 2)],
                 (prob.batch * prob.kv_heads * plan.splits, 1, 1), 32 * plan.warps, seed=seed)
    ip2 = np.array([np_, prob.q_heads, int(sinks is not None)], np.int32)
    sk = np.zeros(prob.q_heads, np.float32) if sinks is None else _np(sinks).astype(np.float32).reshape(-1)
    k2 = _emulated(1, qtype, tuple(sorted(comb_s.items())))
    (out,) = k2([po, pml, ip2, sk, tabs], [(rows, prob.head_dim)], (rows, 1, 1), COMBINE_THREADS, seed=seed)
    return out


# ----------------------------------------------------------------------------- MLX (CUDA / Metal)


_MLX_KERNELS: dict = {}


def _mlx_kernel(backend: str, which: int, qtype: int, static: dict):
    import mlx.core as mx

    key = (backend, which, qtype, tuple(sorted(static.items())))
    k = _MLX_KERNELS.get(key)
    if k is None:
        kdef = _kernel_defs(qtype)[which]
        make = mx.fast.cuda_kernel if backend == "cuda" else mx.fast.metal_kernel
        name = f"{kdef.name}_{kdef.digest(backend, static)}"
        k = make(name=name, input_names=[n for n, _ in kdef.inputs], output_names=[n for n, _ in kdef.outputs],
                 source=kdef.body_source(backend), header=kdef.header_source(backend, static))
        _MLX_KERNELS[key] = k
    return k


def _run_mlx(q, kb, vb, prob: Problem, sinks, plan: Plan, qtype: int, backend: str):
    import mlx.core as mx

    split_s, comb_s = _static(prob, plan, qtype)
    qm = q if isinstance(q, mx.array) else mx.array(_np(q))
    if qtype:
        qm = mx.view(qm, mx.uint16)
    kbm = kb if isinstance(kb, mx.array) else mx.array(np.ascontiguousarray(_np(kb)))
    vbm = vb if isinstance(vb, mx.array) else mx.array(np.ascontiguousarray(_np(vb)))
    rows = prob.batch * prob.q_heads * prob.rows
    np_ = plan.partials
    ip1 = mx.array(np.array([prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads], np.int32))
    fp1 = mx.array(np.array([prob.scale, prob.softcap], np.float32))
    tabs = mx.array(tables(prob))
    lens = mx.array(np.array(prob.lengths, np.int32))
    n1 = prob.batch * prob.kv_heads * plan.splits
    k1 = _mlx_kernel(backend, 0, qtype, split_s)
    po, pml = k1(inputs=[qm, kbm, vbm, lens, ip1, fp1, tabs], output_shapes=[(rows, np_, prob.v_dim), (rows, np_, 2)],
                 output_dtypes=[mx.float32, mx.float32], grid=(n1 * 32 * plan.warps, 1, 1),
                 threadgroup=(32 * plan.warps, 1, 1))
    ip2 = mx.array(np.array([np_, prob.q_heads, int(sinks is not None)], np.int32))
    if sinks is None:
        sk = mx.zeros((prob.q_heads,), mx.float32)
    else:
        sk = (sinks if isinstance(sinks, mx.array) else mx.array(_np(sinks))).astype(mx.float32).reshape(-1)
    k2 = _mlx_kernel(backend, 1, qtype, comb_s)
    (out,) = k2(inputs=[po, pml, ip2, sk, tabs], output_shapes=[(rows, prob.head_dim)],
                output_dtypes=[mx.uint16 if qtype else mx.float32], grid=(rows * COMBINE_THREADS, 1, 1),
                threadgroup=(COMBINE_THREADS, 1, 1))
    if qtype:
        out = mx.view(out, mx.float16 if qtype == 1 else mx.bfloat16)
    return out


def kernel_attention(q, k_blocks, v_blocks, prob: Problem, sinks=None, *, backend: str = "auto",
                     splits: "int | None" = None, lanes_per_key: "int | None" = None, warps: "int | None" = None,
                     seed: "int | None" = None):
    """Run the two kernel passes on ``backend`` and return the output shaped like q."""
    bk = pick_backend("auto" if backend == "kernel" else backend)
    qdt = str(q.dtype).replace("mlx.core.", "")
    if qdt not in QTYPES:
        raise AttentionError(f"the attention kernel takes float32, float16 or bfloat16 q; got {qdt}")
    qtype = QTYPES[qdt]
    plan = make_plan(prob, bk, splits=splits, lanes_per_key=lanes_per_key, warps=warps)
    shape = (prob.batch, prob.q_heads, prob.head_dim) if prob.squeeze_rows else (
        prob.batch, prob.q_heads, prob.rows, prob.head_dim)
    if bk == "cpu-emulator":
        out = _run_emulator(q, k_blocks, v_blocks, prob, sinks, plan, qtype, seed)
        if qtype == 1:
            out = out.view(np.float16)
        out = out.reshape(shape)
        if _is_mlx(q):
            import mlx.core as mx

            out = mx.array(out) if qtype != 2 else mx.view(mx.array(out), mx.bfloat16)
    else:
        out = _run_mlx(q, k_blocks, v_blocks, prob, sinks, plan, qtype, bk).reshape(shape)
        if not _is_mlx(q):
            import mlx.core as mx

            mx.eval(out)
            out = _np(out)
    attention.LAST_RUN.clear()
    attention.LAST_RUN.update(backend=bk, dispatches=2, splits=plan.splits, lanes_per_key=plan.lanes_per_key,
                              warps=plan.warps, chain=plan.chain(max(prob.lengths)))
    return out


def _is_mlx(a) -> bool:
    return type(a).__module__.startswith("mlx")
