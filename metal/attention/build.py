"""The fused decode attention's kernel builds: static parameters, value tables and kernel definitions.

Pass 1 (one of the three split kernels, ``lanes`` / ``tiles`` / ``int8-mma``: :mod:`.attention_plan`) and pass 2
(``attention_kernel_combine.cpp``, one threadgroup per output row) are tqbridge-dialect kernels
(:mod:`.kernel`) with the helpers of ``attention_kernel.h``; the same source runs on Metal, on CUDA
(MLX's CUDA backend) and on the CPU SIMT emulator. A plan and a problem give the static parameters
(:func:`static_params`); per-call values (lengths, split size, scale, softcap) travel in small
parameter buffers, so a new token never builds a new kernel.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .formats import format_params, side_rotation
from .plan import (COMBINE_THREADS, MAX_PARTIALS, TILE_BYTES, Plan, row_bytes, rows_room, turbo_index_bits,
                             tiles_key_slots, int8_mma_stage_bytes)
from .problem import Problem
from ..kernel import KERNEL_DIR

QTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
DYN_MAX_ROWS = 32            # TQA_QA: query rows per group a format-generic (TQA_DYN) build holds
LAUNCHES = [0]               # kernel launches made through :func:`launch` (what the dispatch count reports)


def launch(kernel, *args, **kw):
    """Issue one kernel launch, counted in :data:`LAUNCHES`."""
    LAUNCHES[0] += 1
    return kernel(*args, **kw)


def tables(prob: Problem) -> np.ndarray:
    """The ``tabs`` buffer: K/V value tables, K/V sign tables (RMAX each), K/V rotation scales."""
    _, kt, *_ = format_params(prob.k_format)
    _, vt, *_ = format_params(prob.v_format)
    _, ks1, ks2, kscale = side_rotation(prob.k_format, prob.k_rot)
    _, vs1, vs2, vscale = side_rotation(prob.v_format, prob.v_rot)
    return np.concatenate([kt, vt, ks1, ks2, vs1, vs2, [kscale, vscale]]).astype(np.float32)


def _fmt_consts(prob: Problem) -> dict:
    ks, *_ = format_params(prob.k_format)
    vs, *_ = format_params(prob.v_format)
    return dict(TQA_KF=ks["ID"], TQA_VF=vs["ID"], TQA_KBB=ks["BB"], TQA_VBB=vs["BB"], TQA_KGRP=ks["GRP"],
                TQA_VGRP=vs["GRP"], TQA_KQS=ks["QS"], TQA_VQS=vs["QS"], TQA_KSG=ks["SG"], TQA_VSG=vs["SG"],
                TQA_KROT=ks["ROT"] or prob.k_rot, TQA_VROT=vs["ROT"] or prob.v_rot, TQA_G=prob.group,
                TQA_T=prob.rows)


def static_params(prob: Problem, plan: Plan, qtype: int, dyn: bool,
                  qscale: bool = False) -> tuple[dict, dict, list, list]:
    """Static parameters of both passes and the extra int parameters they read (TQA_DYN builds).
    ``qscale``: pass 1 multiplies q by the keys' channel scales (``TQA_QSC``, input ``qsc``: a
    key-calibrated cache's lane); builds without it have no such parameter."""
    fc = _fmt_consts(prob)
    krb, vrb = row_bytes(prob, dyn)
    tile = plan.tile or max(2, min(64, 1 << int(math.log2(TILE_BYTES // (krb + vrb)))))
    split = dict(TQA_DK=prob.k_dim, TQA_DV=prob.v_dim, TQA_D=prob.head_dim, TQA_NW=plan.warps, TQA_QTYPE=qtype,
                 TQA_DYN=int(dyn), TQA_TILE=tile, TQA_KTB=-(-tile * krb // 4) * 4, TQA_VTB=-(-tile * vrb // 4) * 4)
    if qscale:
        split.update(TQA_QSC=1)
    if plan.kernel == "int8-mma":
        split.update(TQA_KM=int(prob.k_format.layout.has_m),   # q4_1 / q5_1: a minimum m per block
                     TQA_VB=turbo_index_bits(prob.v_format),
                     TQA_STB=int8_mma_stage_bytes(prob, plan.warps, tile, plan.stages), TQA_NS=plan.stages,
                     TQA_KC=plan.chunks, TQ_DSMEM=plan.dyn_smem,
                     TQA_V23=int(plan.v_decode == "turbo-permute"), TQA_VCODE=int(plan.v_decode == "codes-permute"))
    elif plan.kernel == "tiles":
        split.update(TQA_QA=plan.rows_room or rows_room(prob, dyn), TQA_KS=tiles_key_slots(prob))
    else:
        split.update(TQA_LPK=plan.lanes_per_key)
    combine = dict(TQA_DV=prob.v_dim, TQA_D=prob.head_dim, TQA_NT=COMBINE_THREADS, TQA_QTYPE=qtype,
                   TQA_DYN=int(dyn), TQA_MAXP=MAX_PARTIALS)
    order = ["TQA_KF", "TQA_VF", "TQA_KBB", "TQA_VBB", "TQA_KGRP", "TQA_VGRP", "TQA_KQS", "TQA_VQS",
             "TQA_KSG", "TQA_VSG", "TQA_KROT", "TQA_VROT", "TQA_G", "TQA_T"]
    extra1 = [fc[k] for k in order]
    extra2 = [fc["TQA_T"], fc["TQA_VGRP"], fc["TQA_VROT"]]
    if not dyn:
        split.update(fc)
        combine.update(TQA_T=fc["TQA_T"], TQA_VGRP=fc["TQA_VGRP"], TQA_VROT=fc["TQA_VROT"])
    return split, combine, extra1, extra2


# the pass-1 kernels' sources: attention_kernel_split_<name>.cpp, kernel tq_attention_split_<name> (the name
# of attention_problem.KERNELS with "-" as "_")
SPLIT_SOURCES = {"lanes": "attention_kernel_split_lanes.cpp", "tiles": "attention_kernel_split_tiles.cpp",
                 "int8-mma": "attention_kernel_split_int8_mma.cpp"}


# the buffers kernel int8-mma's folded append adds to pass 1 (kv_append.cpp's, renamed apart from pass 1's own):
# the step's K and V rows (None: the rows' element type), the quantizers' tables, the append parameters, the
# previous flag; and one output, the flag
FOLD_INPUTS = (("ak", None), ("av", None), ("aktab", "float32"), ("avtab", "float32"), ("ap", "uint32"),
               ("aflag_in", "uint32"))


@lru_cache(maxsize=None)
def kernel_defs(qtype: int, kernel: str = "lanes", qscale: bool = False, phases: bool = False,
                fold: "str | None" = None, fold_cal: bool = False):
    """(pass 1, pass 2) kernel definitions for q's element type and the pass-1 kernel (one of
    :data:`~.attention_problem.KERNELS`); ``qscale``: pass 1 takes the input ``qsc`` too (its builds
    have the static parameter ``TQA_QSC``, :func:`static_params`); ``phases`` (int8-mma, builds with the
    static parameter ``TQA_PHASES``): pass 1 has one more output, ``clk``, its threadgroups' timestamps
    (benchmarks/scripts/pass1_phases.py).

    Buffer names, as the kernel sources spell them (and the launch code with a pass number: ``ip1`` /
    ``fp1`` are pass 1's): ``ip`` / ``fp`` the int / float launch parameters (``TQA_SPLIT_PARAMS`` in
    attention_kernel.h lists pass 1's), ``tabs`` the value and rotation tables, ``dep`` the array the
    pass must run after, ``qsc`` the keys' channel scales q is multiplied by (float32, (Hq, D)), ``po``
    the partial outputs of every split, ``pml`` their (running max, sum of weights) pairs.

    ``fold`` (int8-mma, builds with the static parameter ``TQA_FOLD`` and those of kv_append.cpp): pass 1 also
    appends the decode step's rows, of element type ``fold`` ("float32" or "uint16"), into ``kb`` / ``vb`` in
    place (:data:`FOLD_INPUTS`, one more output ``aflag``: the append's flag); ``fold_cal``: a key-calibrated
    append (static ``KV_CAL``), one more input ``akcal`` (kv_append.cpp's ``kcal``)."""
    from ..kernel import Kernel
    from ..quantize_append import append_row_header

    header = (KERNEL_DIR / "attention_kernel.h").read_text()
    qdt = "float32" if qtype == 0 else "uint16"
    if phases and kernel != "int8-mma":
        raise ValueError(f"phase timestamps are a build of kernel int8-mma, not {kernel!r}")
    if fold is not None and (kernel != "int8-mma" or fold not in ("float32", "uint16")):
        raise ValueError(f"the folded append is a build of kernel int8-mma over float32 or uint16 rows, not "
                         f"{kernel!r} over {fold!r}")
    fold_ins = () if fold is None else tuple((n, t or fold) for n, t in FOLD_INPUTS) + ((("akcal", "float32"),) if fold_cal
                                                                                       else ())
    split = Kernel(
        "tq_attention_split_" + kernel.replace("-", "_") + ("_fold" if fold else ""),
        (("q", qdt), ("kb", "uint8"), ("vb", "uint8"), ("ip", "int32"), ("fp", "float32"), ("tabs", "float32"),
         ("dep", "uint32")) + ((("qsc", "float32"),) if qscale else ()) + fold_ins,
        (("po", "float32"), ("pml", "float32")) + ((("clk", "uint32"),) if phases else ())
        + ((("aflag", "uint32"),) if fold else ()),
        (KERNEL_DIR / SPLIT_SOURCES[kernel]).read_text(),
        header + ("\n" + (KERNEL_DIR / "attention_mma.h").read_text() if kernel == "int8-mma" else "")
        + ("\n" + append_row_header("tq_simd_barrier()") if fold else ""),
        inplace=("kb", "vb") if fold else ())
    combine = Kernel(
        "tq_attention_combine",
        (("po", "float32"), ("pml", "float32"), ("ip", "int32"), ("sinks", "float32"), ("tabs", "float32")),
        (("out", qdt),),
        (KERNEL_DIR / "attention_kernel_combine.cpp").read_text(), header)
    return split, combine


def built(backend: str, which: int, qtype: int, static: dict, kernel: str = "lanes"):
    """Pass 1 (``which`` 0) or the combine pass (1), compiled for ``backend`` by the one kernel builder
    and cache (:func:`.dispatch.build`): the emulator's kernel, or MLX's raw callable on a GPU. A static
    ``TQA_QSC`` picks pass 1's definition with the input ``qsc``, a static ``TQA_PHASES`` the one with the
    output ``clk``, a static ``TQA_FOLD`` the one with the folded append (its rows' type from ``QA_SRC``)."""
    from ..dispatch import build

    fold = ("uint16" if static.get("QA_SRC") else "float32") if static.get("TQA_FOLD") and which == 0 else None
    kern = build(kernel_defs(qtype, kernel, bool(static.get("TQA_QSC")), bool(static.get("TQA_PHASES")), fold,
                             bool(fold and static.get("KV_CAL")))[which],
                 static, backend)
    return kern if backend == "cpu-emulator" else kern.raw


def dyn_build(prob: Problem, plan: Plan, generic: bool) -> bool:
    """Whether to build the format-generic variant (lanes holds at most DYN_MAX_ROWS rows; int8-mma has
    none)."""
    if plan.kernel == "int8-mma":
        return False
    return generic and (plan.kernel == "tiles" or prob.group * prob.rows <= DYN_MAX_ROWS)


def param_head(prob: Problem, plan: Plan) -> list:
    """The pass-1 int parameters before the per-row lengths."""
    extra1 = static_params(prob, plan, 0, False)[2]
    return [prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads, *extra1]


def pass1_params(prob: Problem, plan: Plan) -> tuple:
    """Pass 1's int parameters ``ip``: :func:`param_head`, the length of each batch row, then its start
    (the first key it sees; attention_kernel.h's ``TQA_SPLIT_PARAMS`` reads them)."""
    return (*param_head(prob, plan), *prob.lengths, *prob.row_starts)
