"""ctypes over tqbridge's llama.cpp shim (``csrc/llama_shim.c``), for a build chosen with
:func:`tqbridge.bridge.llama.build.select`. Every signature is scalars and pointers, so this file
is the same for every llama.cpp version and fork; the structs live on the C side."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from .side import BuildInfo, LlamaBuildError

# ggml_backend_sched_eval_callback: bool (*)(struct ggml_tensor * t, bool ask, void * user_data)
EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)

_P, _U32, _I32, _SZ = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t
_SIGS = {
    "tqs_init": (None, [ctypes.c_int]),
    "tqs_model_load": (_P, [ctypes.c_char_p]),
    "tqs_model_free": (None, [_P]),
    "tqs_n_vocab": (ctypes.c_int, [_P]),
    "tqs_context": (_P, [_P, _U32, _U32, _U32, _I32, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P, _P]),
    "tqs_free": (None, [_P]),
    "tqs_decode": (ctypes.c_int, [_P, _P, _I32, _I32, _P, _I32]),
    "tqs_last_logits": (ctypes.POINTER(ctypes.c_float), [_P]),
    "tqs_state_size": (_SZ, [_P]),
    "tqs_state_get": (_SZ, [_P, _P, _SZ]),
    "tqs_state_set": (_SZ, [_P, _P, _SZ]),
    "tqs_last_error": (ctypes.c_char_p, []),
    "tqs_tokenize": (_I32, [_P, ctypes.c_char_p, _I32, _P, _I32, ctypes.c_int]),
    "tqs_log_pending": (_SZ, []),
    "tqs_log_take": (_SZ, [_P, _SZ]),
    "tqs_log_lost": (_SZ, []),
}

# ggml_log_level (ggml.h): the level byte the shim writes before each message is '0' + this number
LOG_LEVELS = {1: "debug", 2: "info", 3: "warn", 4: "error"}
_LOG_CONT = 5


def split_log(raw: bytes) -> "list[tuple[str, str]]":
    """The shim's kept log (each message: 0x1e, a level byte, its text) as ``(level, line)`` pairs, one
    per line of text; a continuation message (``GGML_LOG_LEVEL_CONT``) keeps the level before it."""
    out: "list[tuple[str, str]]" = []
    level, text = "info", ""
    for msg in raw.split(b"\x1e"):
        if not msg:
            continue
        code, body = msg[0] - 48, msg[1:].decode("utf-8", "replace")
        if code != _LOG_CONT:
            out.extend((level, line) for line in text.splitlines() if line.strip())
            text, level = "", LOG_LEVELS.get(code, "info")
        text += body
    out.extend((level, line) for line in text.splitlines() if line.strip())
    return out


_loaded: dict[Path, "Shim"] = {}


class Shim:
    """One build's llama.cpp API. ``Shim.for_build(info)`` loads it once per process."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        for name, (res, args) in _SIGS.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib.tqs_init(1)

    @classmethod
    def for_build(cls, info: BuildInfo) -> "Shim":
        if info.shim not in _loaded:
            _loaded[info.shim] = cls(info.shim)
        return _loaded[info.shim]

    # --- models and contexts ---

    def load_model(self, path: "str | os.PathLike[str]") -> int:
        m = self.lib.tqs_model_load(str(Path(path)).encode())
        if not m:
            said = (self.lib.tqs_last_error() or b"").decode(errors="replace").strip()
            raise LlamaBuildError(f"llama.cpp could not load {path}" + (f": {said}" if said else ""))
        return m

    def free_model(self, model: int) -> None:
        self.lib.tqs_model_free(model)

    def n_vocab(self, model: int) -> int:
        return int(self.lib.tqs_n_vocab(model))

    def context(self, model: int, *, n_ctx: int, n_batch: int, n_ubatch: int, n_threads: int, flash_attn: bool,
                type_k: int, type_v: int, callback=None) -> int:
        ctx = self.lib.tqs_context(model, n_ctx, n_batch, n_ubatch, n_threads, int(flash_attn), type_k, type_v,
                                   ctypes.cast(callback, ctypes.c_void_p) if callback is not None else None, None)
        if not ctx:
            said = (self.lib.tqs_last_error() or b"").decode(errors="replace").strip()
            raise LlamaBuildError(f"llama.cpp could not create a context (type_k {type_k}, type_v {type_v}, "
                                  f"flash attention {'on' if flash_attn else 'off'})" + (f": {said}" if said else ""))
        return ctx

    def free(self, ctx: int) -> None:
        self.lib.tqs_free(ctx)

    def decode(self, ctx: int, tokens: "list[int]", pos0: int, n_vocab: int, all_logits: bool) -> "np.ndarray":
        """Evaluate ``tokens`` at ``pos0..`` as one batch; the logits of every position (``all_logits``)
        or of the last one, as float32 rows."""
        toks = np.asarray(tokens, np.int32)
        out = np.zeros((len(toks) if all_logits else 1, n_vocab), np.float32)
        rc = self.lib.tqs_decode(ctx, toks.ctypes.data, len(toks), pos0,
                                 out.ctypes.data if all_logits else None, n_vocab)
        if rc != 0:
            raise LlamaBuildError(f"llama_decode returned {rc}")
        if not all_logits:
            ptr = self.lib.tqs_last_logits(ctx)
            out[0] = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        return out

    def state(self, ctx: int) -> bytes:
        size = int(self.lib.tqs_state_size(ctx))
        buf = (ctypes.c_uint8 * size)()
        got = int(self.lib.tqs_state_get(ctx, buf, size))
        return bytes(buf[:got])

    def set_state(self, ctx: int, blob: bytes) -> None:
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if int(self.lib.tqs_state_set(ctx, buf, len(blob))) != len(blob):
            raise LlamaBuildError("llama.cpp refused the state blob")

    def take_log(self) -> "list[tuple[str, str]]":
        """llama.cpp's log lines (info and above) since the last call, as ``(level, text)``; forgotten here."""
        n = int(self.lib.tqs_log_pending())
        if n == 0:
            return []
        buf = (ctypes.c_char * n)()
        got = int(self.lib.tqs_log_take(buf, n))
        return split_log(bytes(buf[:got]))

    def tokenize(self, model: int, text: str, add_special: bool = True) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        for _ in range(2):
            out = np.zeros(cap, np.int32)
            n = int(self.lib.tqs_tokenize(model, raw, len(raw), out.ctypes.data, cap, int(add_special)))
            if n >= 0:
                return [int(t) for t in out[:n]]
            cap = -n
        raise LlamaBuildError("llama_tokenize did not fit its own count")
