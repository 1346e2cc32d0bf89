"""ggml's C declarations as tqbridge's ctypes code spells them: struct layouts, enum values and the
one call whose name differs between ggml versions.

They follow the headers installed with llama-cpp-python 0.3.36 (``include/ggml.h``,
``include/ggml-cpu.h``); :mod:`tqbridge.bridge.llama.compat` checks every one of them against the
loaded library before first use:

- ``struct ggml_type_traits { const char *type_name; int64_t blck_size; int64_t blck_size_interleave;
  size_t type_size; bool is_quantized; ggml_to_float_t to_float; ggml_from_float_t from_float_ref; }``
  and ``typedef void (*ggml_to_float_t)(const void * x, float * y, int64_t k)``
- ``struct ggml_init_params { size_t mem_size; void *mem_buffer; bool no_alloc; }`` (by value)
- ``struct ggml_cplan { size_t work_size; uint8_t *work_data; int n_threads;
  struct ggml_threadpool *threadpool; ggml_abort_callback abort_callback;
  void *abort_callback_data; bool use_ref; }`` (returned by value from ``ggml_graph_plan``)
"""

from __future__ import annotations

import ctypes

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_PREC_F32 = 10
GGML_STATUS_SUCCESS = 0

TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class CPlan(ctypes.Structure):
    _fields_ = [
        ("work_size", ctypes.c_size_t),
        ("work_data", ctypes.c_void_p),
        ("n_threads", ctypes.c_int),
        ("threadpool", ctypes.c_void_p),
        ("abort_callback", ctypes.c_void_p),
        ("abort_callback_data", ctypes.c_void_p),
        ("use_ref", ctypes.c_bool),
    ]


def set_f32_precision(base, node) -> bool:
    """Ask ggml for f32 accumulation on a flash-attention node: ``ggml_prec_set_acc`` (ggml of
    llama-cpp-python 0.3.36), or ``ggml_flash_attn_ext_set_prec`` where a build predates it (the
    TurboQuant fork at 69d8e4b). False when ggml refuses."""
    try:
        fn = base.ggml_prec_set_acc
    except AttributeError:
        fn = base.ggml_flash_attn_ext_set_prec
        fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_int]
        fn(node, GGML_PREC_F32)
        return True
    fn.restype, fn.argtypes = ctypes.c_bool, [ctypes.c_void_p, ctypes.c_int]
    return bool(fn(node, GGML_PREC_F32))
