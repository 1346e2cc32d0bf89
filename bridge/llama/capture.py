"""llama.cpp's own per-layer attention tensors, captured during a run through its eval callback.

llama.cpp calls ``cb_eval`` (``llama_context_params.cb_eval``, a
``ggml_backend_sched_eval_callback``) twice per graph node: once with ``ask=True`` ("do you want to
see this node?") and, for the nodes we said yes to, once with ``ask=False`` right after the node was
computed. At that moment the node and its direct sources hold their data (later nodes, which may
reuse a source's memory, have not run yet), so each capture reads a node's sources at that node.

Per layer ``il`` of a run with flash attention (the graph of the vendored llama.cpp, 0.3.36):

- ``SET_ROWS`` into ``cache_k_l{il}`` / ``cache_v_l{il}``: source 0 holds the float rows llama.cpp
  quantizes into its cache (after RoPE and after its Hadamard KV rotation), source 1 the cell index
  of each row. -> ``k_rows`` / ``v_rows`` (float32, one row per token) and ``cells``.
- ``MUL_MAT`` by ``attn_inp_k_rot`` / ``attn_inp_v_rot`` (present when llama.cpp rotates the cache):
  source 1 is the tensor before rotation (``Kcur-il``, ``Vcur-il``, ``Qcur-il``, ``kqv_out-il``).
  -> ``k_in`` / ``v_in`` / ``q_in`` (float32 rows before the rotation) and the groups (``k_rot``,
  ``v_rot``: the order of llama.cpp's rotation matrices).
- the node named ``attn_norm-{il}`` (the layer's normalized input, what its q/k/v projections read;
  llama.cpp's graph builders name it so for every architecture the level runs): -> ``attn_in``.
- ``FLASH_ATTN_EXT`` reading ``cache_k_l{il}``: q (source 0, rotated when the cache is), the K and V
  cache bytes it reads (sources 1, 2: every cell of the view), the mask (source 3), scale, max_bias
  and logit softcap (op params) and the output (rotated when V is). -> ``q``, ``k_cache``,
  ``v_cache``, ``mask``, ``out``, ``scale``, ``softcap``.

Rows are kept per evaluation (one entry per ``llama_decode`` ubatch, in order), so a prompt batch and
decode steps stay apart. Only the CPU backend is supported (tensor data is read from host memory);
the graph facts above are checked as they are read, and a mismatch raises :class:`CaptureError`.

``struct ggml_tensor`` is read through ctypes with the layout of ggml.h in llama-cpp-python 0.3.36
(:class:`GgmlTensor`); :func:`check_tensor_layout` checks its name and data fields against ggml's own
accessors (``ggml_get_name``, ``ggml_get_data``) on every captured node.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .side import rotation_environ
from .ggml_abi import GGML_TYPE_F16, GGML_TYPE_F32

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_TYPE_I64 = 27


class CaptureError(RuntimeError):
    """llama.cpp's graph is not what this capture reads (one line says what differs)."""


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of ggml.h (llama-cpp-python 0.3.36)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def _base():
    from .ggml_graph import libraries

    base = libraries()[0]
    P = ctypes.c_void_p
    for name, res, args in (("ggml_op_name", ctypes.c_char_p, [ctypes.c_int]),
                            ("ggml_get_name", ctypes.c_char_p, [P]),
                            ("ggml_n_dims", ctypes.c_int, [P]),
                            ("ggml_blck_size", ctypes.c_int64, [ctypes.c_int]),
                            ("ggml_type_size", ctypes.c_size_t, [ctypes.c_int]),
                            ("ggml_backend_buffer_is_host", ctypes.c_bool, [P])):
        fn = getattr(base, name)
        fn.restype, fn.argtypes = res, args
    return base


def _tensor(ptr: int) -> GgmlTensor:
    return GgmlTensor.from_address(ptr)


def _name(ptr: "int | None") -> str:
    return _tensor(ptr).name.decode("utf-8", "replace") if ptr else ""


def check_tensor_layout(base, ptr: int) -> None:
    """The ctypes view of one tensor against ggml's accessors; raises CaptureError on a mismatch."""
    t = _tensor(ptr)
    got = (t.name, t.data or 0, int(np.prod([int(x) for x in t.ne])))
    want_name = base.ggml_get_name(ptr) or b""
    if got[0] != want_name or got[1] != (base.ggml_get_data(ptr) or 0):
        raise CaptureError("struct ggml_tensor does not have the layout of llama-cpp-python 0.3.36's ggml.h")


def read_tensor(base, ptr: int, raw: bool = False) -> np.ndarray:
    """A tensor's data from host memory, honouring its strides.

    Float types come back as float32 (f16 converted), i64 as int64, shaped (ne3, ne2, ne1, ne0);
    quantized types (and every type with ``raw``) as uint8 rows, shaped (ne3, ne2, ne1, row_bytes)."""
    t = _tensor(ptr)
    if t.buffer and not base.ggml_backend_buffer_is_host(t.buffer):
        raise CaptureError(f"tensor {_name(ptr)!r} is not in host memory (only llama.cpp's CPU backend is supported)")
    if not t.data:
        raise CaptureError(f"tensor {_name(ptr)!r} has no data")
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    typ = int(t.type)
    blck = int(base.ggml_blck_size(typ))
    tsize = int(base.ggml_type_size(typ))
    if ne[0] % blck:
        raise CaptureError(f"tensor {_name(ptr)!r}: {ne[0]} values is not a whole number of blocks")
    row_bytes = ne[0] // blck * tsize
    span = row_bytes + sum((n - 1) * s for n, s in zip(ne[1:], nb[1:]))
    buf = np.frombuffer(ctypes.string_at(t.data, span), np.uint8)
    rows = np.lib.stride_tricks.as_strided(buf, shape=(ne[3], ne[2], ne[1], row_bytes),
                                           strides=(nb[3], nb[2], nb[1], 1))
    rows = np.ascontiguousarray(rows)
    if raw:
        return rows
    if typ == GGML_TYPE_F32:
        return rows.view("<f4")
    if typ == GGML_TYPE_F16:
        return rows.view("<f2").astype(np.float32)
    if typ == GGML_TYPE_I64:
        return rows.view("<i8")
    return rows


_SET_ROWS = re.compile(r"^cache_([kv])_l(\d+) \(view\)$")
_FA_K = re.compile(r"^cache_k_l(\d+) \(view\)")
_ROT_IN = re.compile(r"^(Kcur|Vcur|Qcur|kqv_out)-(\d+)")
_ATTN_IN = re.compile(r"^attn_norm-(\d+)$")
_ROT_KEY = {"Kcur": "k_in", "Vcur": "v_in", "Qcur": "q_in", "kqv_out": "out_in"}


@dataclass
class LayerCapture:
    """What one layer's attention saw and wrote, one list entry per evaluation (ubatch)."""

    k_rows: list = field(default_factory=list)     # (tokens, n_kv_heads * head_dim) float32: quantizer input
    v_rows: list = field(default_factory=list)
    k_cells: list = field(default_factory=list)    # (tokens,) int64: the cache cell of each row
    v_cells: list = field(default_factory=list)
    k_in: list = field(default_factory=list)       # (tokens, heads, head_dim): rows before llama.cpp's rotation
    v_in: list = field(default_factory=list)
    q_in: list = field(default_factory=list)
    out_in: list = field(default_factory=list)     # flash attention's output before llama.cpp rotates it back
    attn_in: list = field(default_factory=list)    # (tokens, hidden) float32: the normalized layer input
    q: list = field(default_factory=list)          # (tokens, Hq, D): q as flash attention read it
    out: list = field(default_factory=list)        # (tokens, Hq, Dv): flash attention's output
    mask: list = field(default_factory=list)       # (tokens, cells): 0 where visible, -inf where not
    k_cache: "np.ndarray | None" = None            # (Hkv, cells, row_bytes): the K bytes of the last evaluation
    v_cache: "np.ndarray | None" = None
    k_type: int = -1
    v_type: int = -1
    k_rot: int = 0                                 # order of llama.cpp's K rotation matrix (0: none)
    v_rot: int = 0
    scale: float = 0.0
    max_bias: float = 0.0
    softcap: float = 0.0
    q_turbo: bool = False                          # q_in holds q before the TurboQuant fork's rotation
    out_turbo: list = field(default_factory=list)  # (tokens, Hq, Dv): the output after the fork rotated it back


class GraphCapture:
    """The eval callback and what it collected: ``layers[il]`` is a :class:`LayerCapture`."""

    def __init__(self):
        from .side import selected

        if selected() is not None:
            from .shim import EVAL_CALLBACK as callback_type
        else:
            from llama_cpp import llama_cpp as C

            callback_type = C.ggml_backend_sched_eval_callback
        self.base = _base()
        self.layers: dict[int, LayerCapture] = defaultdict(LayerCapture)
        self.nodes_seen = 0
        self.error: "BaseException | None" = None
        self._ops = {}
        self._pending: dict = {}
        self._fa_layer: dict[int, int] = {}
        self.callback = callback_type(self._cb)

    def _op(self, ptr: int) -> str:
        op = int(_tensor(ptr).op)
        if op not in self._ops:
            self._ops[op] = (self.base.ggml_op_name(op) or b"").decode()
        return self._ops[op]

    def _wanted(self, ptr: int) -> bool:
        op = self._op(ptr)
        t = _tensor(ptr)
        if _ATTN_IN.match(t.name.decode("utf-8", "replace")):
            return True
        if op == "SET_ROWS":
            return bool(_SET_ROWS.match(t.name.decode("utf-8", "replace")))
        if op == "MUL_MAT":
            return _name(t.src[0]) in ("attn_inp_k_rot", "attn_inp_v_rot")
        if op == "FLASH_ATTN_EXT":
            return bool(_FA_K.match(_name(t.src[1])))
        return op == "TURBO_WHT"   # the TurboQuant fork: q rotated before, the output rotated back after

    def _cb(self, ptr, ask, _user):
        try:
            if ask:
                self.nodes_seen += 1
                return self._wanted(ptr)
            if self.error is None:
                self._take(ptr)
        except BaseException as e:   # never let an exception unwind through C
            self.error = e
        return True

    def _producer(self, p: int) -> int:
        """The first node behind ``p`` that is not a view, reshape, permute or copy."""
        while p and self._op(p) in ("PERMUTE", "VIEW", "RESHAPE", "CONT"):
            p = _tensor(p).src[0]
        return p

    def _take(self, ptr: int) -> None:
        b = self.base
        check_tensor_layout(b, ptr)
        t = _tensor(ptr)
        op = self._op(ptr)
        m = _ATTN_IN.match(t.name.decode("utf-8", "replace"))
        if m:
            x = read_tensor(b, ptr)
            if x.dtype != np.float32:
                raise CaptureError(f"layer {m.group(1)}: the attention input is not f32")
            self.layers[int(m.group(1))].attn_in.append(x.reshape(-1, x.shape[-1]).copy())
        elif op == "SET_ROWS":
            side, il = _SET_ROWS.match(t.name.decode()).groups()
            L = self.layers[int(il)]
            rows = read_tensor(b, t.src[0])
            if rows.dtype != np.float32:
                raise CaptureError(f"layer {il}: {side.upper()} rows written to the cache are not f32")
            cells = read_tensor(b, t.src[1]).reshape(-1)
            rows = rows.reshape(-1, rows.shape[-1])
            if len(cells) != len(rows):
                raise CaptureError(f"layer {il}: {len(rows)} {side.upper()} rows for {len(cells)} cell indices")
            getattr(L, f"{side}_rows").append(rows)
            getattr(L, f"{side}_cells").append(cells)
        elif op == "MUL_MAT":
            x = read_tensor(b, t.src[1])           # rows of `group` values, before the rotation
            group = int(_tensor(t.src[0]).ne[0])
            m = _ROT_IN.match(_name(t.src[1]))
            if m is None or m.group(1) == "Qcur":
                # q is not always named (Gemma 3 scales it first): matched to its layer at the
                # flash-attention node, by walking back from the node's q to this product
                self._pending[ptr] = x.reshape(-1, group)
                return
            kind, il = m.group(1), int(m.group(2))
            L = self.layers[il]
            if kind == "Kcur":
                L.k_rot = group
            else:
                L.v_rot = group
            getattr(L, _ROT_KEY[kind]).append(x.reshape(-1, group))
        elif op == "TURBO_WHT":
            direction = int(t.op_params[0])
            if direction == 0:                     # q before the fork's rotation, matched at flash attention
                x = read_tensor(b, t.src[0])
                self._pending[ptr] = x.reshape(-1, x.shape[-1])
                return
            p = self._producer(t.src[0])           # the output rotated back: which layer's attention?
            il = self._fa_layer.get(p)
            if il is None:
                raise CaptureError("the fork's inverse rotation does not follow a captured flash attention")
            x = read_tensor(b, ptr)
            last = self.layers[il].out[-1]          # (tokens, Hq, Dv) of that flash attention
            self.layers[il].out_turbo.append(x.reshape(last.shape[0], -1, last.shape[-1]))
        elif op == "FLASH_ATTN_EXT":
            il = int(_FA_K.match(_name(t.src[1])).group(1))
            self._fa_layer[ptr] = il
            L = self.layers[il]
            p = self._producer(t.src[0])
            if p in self._pending:                 # q before llama.cpp's rotation (or the fork's)
                L.q_in.append(self._pending.pop(p))
                if self._op(p) == "TURBO_WHT":
                    L.q_turbo = True
            q = read_tensor(b, t.src[0])           # (1, Hq, tokens, D) for q [D, tokens, Hq]
            L.q.append(np.ascontiguousarray(q[0].transpose(1, 0, 2)))
            L.out.append(read_tensor(b, ptr)[0].copy())            # [Dv, Hq, tokens] -> (tokens, Hq, Dv)
            kc, vc = _tensor(t.src[1]), _tensor(t.src[2])
            L.k_type, L.v_type = int(kc.type), int(vc.type)
            L.k_cache = read_tensor(b, t.src[1], raw=True)[0]      # (Hkv, cells, row_bytes)
            L.v_cache = read_tensor(b, t.src[2], raw=True)[0]
            if t.src[3]:
                mk = read_tensor(b, t.src[3])[0, 0]                # (tokens padded, cells)
                L.mask.append(mk[: q.shape[2]].copy())
            params = np.array(t.op_params[:3], np.int32).view(np.float32)
            L.scale, L.max_bias, L.softcap = (float(x) for x in params)


def capture_run(gguf_path: "str | os.PathLike[str]", tokens: "list[int]", k_type: str, v_type: str, *,
                decode: int = 0, rotation: bool = True, n_threads: "int | None" = None, keep_state: bool = False) -> "tuple[GraphCapture, dict]":
    """Run llama.cpp (CPU, flash attention, cache types ``k_type``/``v_type``) over ``tokens`` — all
    but the last ``decode`` as one prompt batch, then one token per evaluation — capturing every
    layer's attention tensors. Returns the capture and ``{"logits": (n, vocab), "state": blob or None}``.
    """
    from .side import selected

    cap = GraphCapture()
    toks = [int(x) for x in tokens]
    n = len(toks)
    split = n - max(0, min(int(decode), n - 1))
    n_ctx = max(256, -(-n // 256) * 256)
    threads = n_threads or os.cpu_count() or 1
    if selected() is not None:
        logits, state = _shim_run(cap, gguf_path, toks, split, n_ctx, threads, k_type, v_type, rotation, keep_state)
    else:
        logits, state = _python_run(cap, gguf_path, toks, split, n_ctx, threads, k_type, v_type, rotation, keep_state)
    if not cap.layers:
        raise CaptureError("the eval callback saw no cache writes (is this llama.cpp's graph?)")
    return cap, {"last_logits": np.stack(logits), "state": state, "nodes_seen": cap.nodes_seen}


def _shim_run(cap, gguf_path, toks, split, n_ctx, threads, k_type, v_type, rotation, keep_state):
    """capture_run on a build chosen with --llama, through tqbridge's shim."""
    from .side import kv_type_id, selected
    from .shim import Shim

    shim = Shim.for_build(selected())
    model = shim.load_model(gguf_path)
    ctx = None
    try:
        type_k, type_v = kv_type_id(k_type), kv_type_id(v_type)
        # the rotation's environment for the context's whole life: a build may read it when it builds a
        # graph (the fork at 69d8e4b: LLAMA_ATTN_ROT_K_NROT), not only when it makes the context
        with rotation_environ(rotation):
            ctx = shim.context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads, flash_attn=True,
                               type_k=type_k, type_v=type_v, callback=cap.callback)
            n_vocab = shim.n_vocab(model)
            logits, pos = [], 0
            for chunk in [toks[:split]] + [[x] for x in toks[split:]]:
                try:
                    row = shim.decode(ctx, chunk, pos, n_vocab, all_logits=False)
                except Exception as e:
                    if cap.error is not None:
                        raise CaptureError(f"capture failed: {cap.error}") from cap.error
                    raise CaptureError(str(e)) from e
                if cap.error is not None:
                    raise CaptureError(f"capture failed: {cap.error}") from cap.error
                pos += len(chunk)
                logits.append(row[0])
            state = shim.state(ctx) if keep_state else None
    finally:
        if ctx:
            shim.free(ctx)
        shim.free_model(model)
    return logits, state


def _python_run(cap, gguf_path, toks, split, n_ctx, threads, k_type, v_type, rotation, keep_state):
    """capture_run on llama-cpp-python's own build."""
    import gguf
    from llama_cpp import llama_cpp as C
    # private, and kept: llama-cpp-python quiets llama.cpp's log only through Llama(verbose=...), which this
    # loader does not make; llama_compat checks the function is there
    from llama_cpp._logger import set_verbose

    from .compat import ensure_compatible

    ensure_compatible()
    set_verbose(False)      # llama.cpp's load and context messages, as Llama(verbose=False) does
    mp = C.llama_model_default_params()
    model = C.llama_model_load_from_file(str(Path(gguf_path)).encode(), mp)
    if not model:
        raise CaptureError(f"llama.cpp could not load {gguf_path}")
    ctx = None
    try:
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.type_k = int(gguf.GGMLQuantizationType[k_type.upper()])
        cp.type_v = int(gguf.GGMLQuantizationType[v_type.upper()])
        cp.cb_eval = cap.callback
        cp.cb_eval_user_data = None
        with rotation_environ(rotation):    # the context's whole life (see _shim_run)
            ctx = C.llama_init_from_model(model, cp)
            if not ctx:
                raise CaptureError("llama.cpp could not create a context")
            n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
            logits = []
            for chunk in [toks[:split]] + [[x] for x in toks[split:]]:
                arr = (C.llama_token * len(chunk))(*chunk)
                batch = C.llama_batch_get_one(arr, len(chunk))
                rc = C.llama_decode(ctx, batch)
                if cap.error is not None:
                    raise CaptureError(f"capture failed: {cap.error}") from cap.error
                if rc != 0:
                    raise CaptureError(f"llama_decode returned {rc}")
                ptr = C.llama_get_logits_ith(ctx, -1)
                logits.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
        state = None
        if keep_state:
            size = C.llama_state_seq_get_size(ctx, 0)
            buf = (ctypes.c_uint8 * size)()
            got = C.llama_state_seq_get_data(ctx, buf, size, 0)
            state = bytes(buf[:got])
    finally:
        if ctx:
            C.llama_free(ctx)
        C.llama_model_free(model)
    return logits, state
