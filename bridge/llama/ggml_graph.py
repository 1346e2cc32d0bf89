"""ggml's ``flash_attn_ext`` on its CPU backend, reached through ctypes: the attention oracle.

Builds a one-op ggml graph over K/V tensors that hold the caller's raw blocks, computes it with
``ggml_graph_plan`` / ``ggml_graph_compute`` from ``libggml-cpu`` (both libraries ship in
llama-cpp-python's ``lib/``) and returns the output as numpy. This is the same kernel llama.cpp's
CPU backend runs for decode with ``flash_attn=True``.

Signatures follow the headers installed with llama-cpp-python 0.3.36 (``include/ggml.h``,
``include/ggml-cpu.h``), the struct layouts are :mod:`.ggml_abi`'s; :mod:`tqbridge.bridge.llama.compat`
checks both against the loaded library before first use.
``ggml_flash_attn_ext(ctx, q, k, v, mask, float scale, float max_bias, float logit_softcap)``:
q ``[D, n_rows, Hq, 1]`` f32, k / v ``[D, n_kv, Hkv, 1]`` (not transposed), result
``[Dv, Hq, n_rows, 1]`` f32 (ggml's axis order: ne0 fastest).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from .ggml_abi import GGML_STATUS_SUCCESS, GGML_TYPE_F16, GGML_TYPE_F32, CPlan, InitParams, set_f32_precision
from .ggml_c import load
from .side import GgmlUnavailable, cpu_library_name, library_path


class GgmlGraphError(RuntimeError):
    """ggml refused a graph or a tensor type; the message says which."""


@functools.lru_cache(maxsize=1)
def libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """ggml's base and CPU-backend libraries of this process's llama.cpp side, loaded once with the
    signatures this module calls; GgmlUnavailable when there is no CPU library."""
    base = load()
    path = library_path().parent / cpu_library_name()
    if not path.exists():
        raise GgmlUnavailable(f"llama-cpp-python has no {path.name} in its lib/ folder")
    cpu = ctypes.CDLL(str(path))
    P, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    sig = {
        (base, "ggml_init"): (P, [InitParams]),
        (base, "ggml_free"): (None, [P]),
        (base, "ggml_new_tensor_4d"): (P, [P, ctypes.c_int, i64, i64, i64, i64]),
        (base, "ggml_get_data"): (P, [P]),
        (base, "ggml_nbytes"): (ctypes.c_size_t, [P]),
        (base, "ggml_flash_attn_ext"): (P, [P, P, P, P, P, f32, f32, f32]),
        (base, "ggml_new_graph"): (P, [P]),
        (base, "ggml_build_forward_expand"): (None, [P, P]),
        (base, "ggml_tensor_overhead"): (ctypes.c_size_t, []),
        (base, "ggml_graph_overhead"): (ctypes.c_size_t, []),
        (base, "ggml_row_size"): (ctypes.c_size_t, [ctypes.c_int, i64]),
        (cpu, "ggml_cpu_init"): (None, []),
        (cpu, "ggml_graph_plan"): (CPlan, [P, ctypes.c_int, P]),
        (cpu, "ggml_graph_compute"): (ctypes.c_int, [P, ctypes.POINTER(CPlan)]),
    }
    for (lib, name), (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()
    return base, cpu


def available() -> "str | None":
    """None when ggml's CPU backend can be used here, else the reason it cannot."""
    try:
        libraries()
    except (ImportError, OSError) as e:
        return str(e)
    return None


def _row_bytes(type_id: int, n: int) -> int:
    return int(libraries()[0].ggml_row_size(type_id, n))


def _compute(base, cpu, ctx, out, n_threads: int, use_ref: bool = False) -> None:
    """Build the graph ending at ``out`` in ``ctx`` and compute it on the CPU backend."""
    gf = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(gf, out)
    plan = cpu.ggml_graph_plan(gf, int(n_threads), None)
    work = (ctypes.c_uint8 * max(1, plan.work_size))()
    plan.work_data = ctypes.addressof(work)
    plan.use_ref = bool(use_ref)
    status = cpu.ggml_graph_compute(gf, ctypes.byref(plan))
    if status != GGML_STATUS_SUCCESS:
        raise GgmlGraphError(f"ggml_graph_compute returned status {status}")


def _context(base, data_bytes: int):
    """A ggml context with room for ``data_bytes`` of tensor data, a few tensors and one graph."""
    mem = data_bytes + 8 * int(base.ggml_tensor_overhead()) + int(base.ggml_graph_overhead()) + 4096
    ctx = base.ggml_init(InitParams(mem, None, False))
    if not ctx:
        raise GgmlGraphError(f"ggml_init failed for {mem} bytes")
    return ctx


def flash_attn_ext(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, k_type: int, v_type: int,
                   scale: float, head_dim_v: "int | None" = None, softcap: float = 0.0,
                   visible: "np.ndarray | None" = None, n_threads: int = 1, use_ref: bool = False) -> np.ndarray:
    """ggml's ``flash_attn_ext`` on the CPU backend.

    q: (Hq, T, D) float32.  k / v: (Hkv, n_kv, row_bytes) uint8 blocks of ggml types
    ``k_type`` / ``v_type`` (``head_dim_v`` values per V row, default D). ``visible``: None (every query
    row sees every key) or booleans (T, n_kv), given to ggml as its mask (an F16 tensor of n_kv x T,
    0 where visible, -inf where not, as llama.cpp's graph builds the KQ mask).
    Returns (T, Hq, Dv) float32.
    """
    base, cpu = libraries()
    q = np.ascontiguousarray(q, dtype=np.float32)
    if q.ndim != 3:
        raise GgmlGraphError(f"q must be (Hq, T, D); got shape {q.shape}")
    hq, t, d = q.shape
    dv = d if head_dim_v is None else int(head_dim_v)
    k = np.ascontiguousarray(k, dtype=np.uint8)
    v = np.ascontiguousarray(v, dtype=np.uint8)
    if k.ndim != 3 or v.ndim != 3 or k.shape[:2] != v.shape[:2]:
        raise GgmlGraphError(f"k and v must be (Hkv, n_kv, row_bytes) with the same (Hkv, n_kv); got {k.shape}, {v.shape}")
    hkv, n_kv = k.shape[:2]
    if n_kv < 1 or hq % hkv:
        raise GgmlGraphError(f"{hq} query heads over {hkv} KV heads with {n_kv} keys is not a valid problem")
    for name, arr, typ, n in (("k", k, k_type, d), ("v", v, v_type, dv)):
        want = _row_bytes(typ, n)
        if arr.shape[2] != want:
            raise GgmlGraphError(f"{name}: a row of {n} values of ggml type {typ} takes {want} bytes, got {arr.shape[2]}")
    mask = None
    if visible is not None:
        visible = np.asarray(visible, bool)
        if visible.shape != (t, n_kv):
            raise GgmlGraphError(f"visible must be (T, n_kv) = {(t, n_kv)}; got {visible.shape}")
        mask = np.where(visible, np.float16(0.0), np.float16(-np.inf)).astype(np.float16)
    ctx = _context(base, q.nbytes + k.nbytes + v.nbytes + t * hq * dv * 4 + (0 if mask is None else mask.nbytes))
    try:
        tq = base.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, t, hq, 1)
        tk = base.ggml_new_tensor_4d(ctx, k_type, d, n_kv, hkv, 1)
        tv = base.ggml_new_tensor_4d(ctx, v_type, dv, n_kv, hkv, 1)
        fill = [(tq, q), (tk, k), (tv, v)]
        tm = None
        if mask is not None:
            tm = base.ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, t, 1, 1)
            fill.append((tm, mask))
        for tensor, arr in fill:
            if base.ggml_nbytes(tensor) != arr.nbytes:
                raise GgmlGraphError(f"ggml tensor holds {base.ggml_nbytes(tensor)} bytes, numpy {arr.nbytes}")
            ctypes.memmove(base.ggml_get_data(tensor), arr.ctypes.data, arr.nbytes)
        out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, float(scale), 0.0, float(softcap))
        if not out or not set_f32_precision(base, out):
            raise GgmlGraphError("ggml refused flash_attn_ext with f32 accumulation for these K/V types")
        _compute(base, cpu, ctx, out, n_threads, use_ref)
        n_out = t * hq * dv
        if base.ggml_nbytes(out) != n_out * 4:
            raise GgmlGraphError(f"flash_attn_ext output has {base.ggml_nbytes(out)} bytes, expected {n_out * 4}")
        res = np.empty(n_out, dtype=np.float32)
        ctypes.memmove(res.ctypes.data, base.ggml_get_data(out), n_out * 4)
    finally:
        base.ggml_free(ctx)
    return res.reshape(t, hq, dv)


def turbo_wht(x: np.ndarray, direction: int, group: int = 128) -> np.ndarray:
    """The TurboQuant fork's ``ggml_turbo_wht(ctx, a, direction, group, NULL)`` (0: forward rotation,
    1: inverse; no InnerQ scale) on float32 rows ``x`` (rows, n), one thread; only in a fork build's
    ggml (:func:`tqbridge.bridge.llama.build.select`)."""
    base, cpu = libraries()
    fn = getattr(base, "ggml_turbo_wht", None)
    if fn is None:
        raise GgmlGraphError("this ggml has no ggml_turbo_wht (not a TurboQuant fork build)")
    P = ctypes.c_void_p
    fn.restype, fn.argtypes = P, [P, P, ctypes.c_int, ctypes.c_int, P]
    x = np.ascontiguousarray(x, np.float32)
    rows, n = x.shape
    ctx = _context(base, 2 * x.nbytes)
    try:
        a = base.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n, rows, 1, 1)
        ctypes.memmove(base.ggml_get_data(a), x.ctypes.data, x.nbytes)
        out = fn(ctx, a, int(direction), int(group), None)
        if not out:
            raise GgmlGraphError(f"ggml refused turbo_wht over rows of {n} in groups of {group}")
        _compute(base, cpu, ctx, out, n_threads=1)
        if base.ggml_nbytes(out) != x.nbytes:
            raise GgmlGraphError(f"turbo_wht's output has {base.ggml_nbytes(out)} bytes, expected {x.nbytes}")
        res = np.empty_like(x)
        ctypes.memmove(res.ctypes.data, base.ggml_get_data(out), x.nbytes)
    finally:
        base.ggml_free(ctx)
    return res
