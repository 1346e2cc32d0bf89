"""What the fused attention kernels know of a format: its kernel id (``TQA_*`` in
``attention_kernel.h``), its static parameters, its 16-entry value table and its rotation (turbo's
own, or llama.cpp's Hadamard group). The kernel's launcher (:mod:`.attention_kernel`) builds its
parameters and ``tabs`` buffer from these; the reference's int8 oracle (:mod:`.attention_ref`)
rotates q exactly as the kernel does with them.
"""

from __future__ import annotations

import numpy as np

from ...bridge.blocks.registry import kernel_ids
from .problem import AttentionError

RMAX = 256                   # entries of each rotation sign table in ``tabs`` (TQA_RMAX)
# format name -> kernel format id (attention_kernel.h, TQA_*): the format registry's Format.kernel_id
FORMAT_IDS = kernel_ids()


def format_params(fmt) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, float]:
    """Static parameters, 16-entry value table, sign tables (s1, s2) and rotation scale of a format
    (turbo formats rotate by their own group; ROT is that group, 0 for the others)."""
    fid = FORMAT_IDS.get(fmt.name)
    if fid is None:
        raise AttentionError(f"the attention kernel has no decoder for format {fmt.key}")
    tab = np.zeros(16, np.float32)
    s1 = s2 = np.ones(RMAX, np.float32)
    rot_scale = 1.0
    static = dict(ID=fid, BB=fmt.type_size, GRP=fmt.block_size, QS=0, SG=0, ROT=0)
    if fmt.kind == "turbo":
        sp = fmt.codec.spec
        tab[: sp.levels] = sp.centroids
        s1 = np.ones(RMAX, np.float32); s1[: sp.group] = sp.s1
        s2 = np.ones(RMAX, np.float32); s2[: sp.group] = sp.s2
        rot_scale = float(sp.scale)
        static.update(QS=sp.qs_offset, SG=sp.signs_offset or 0, ROT=sp.group)
    elif fmt.layout is not None and fmt.layout.values is not None:   # codes index a value table (iq4_nl)
        tab[: len(fmt.layout.values)] = fmt.layout.values
    return static, tab, s1, s2, rot_scale


def side_rotation(fmt, group: int) -> tuple[int, np.ndarray, np.ndarray, float]:
    """(rotation group, s1, s2, scale) of one side: the format's own (turbo) or llama.cpp's plain
    Hadamard of ``group`` values (signs 1, scale 1/sqrt(group) in float32)."""
    st, _, s1, s2, scale = format_params(fmt)
    if st["ROT"] or not group:
        return st["ROT"], s1, s2, scale
    ones = np.ones(RMAX, np.float32)
    return group, ones, ones, float(np.float32(1.0) / np.sqrt(np.float32(group)))
