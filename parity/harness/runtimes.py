"""The two runtimes behind one small interface: ``logits(tokens, kv) -> (n, vocab) float32``.

- :class:`LlamaCppRuntime`: llama.cpp through llama-cpp-python (``type_k``/``type_v``, flash
  attention, logits for every position, the KV state blob, its automatic KV rotation on or off).
- :class:`MLXRuntime`: the mlx-lm model built from the same GGUF (:mod:`tqbridge.bridge.gguf.model`)
  with a pluggable cache factory ``(model, k_format, v_format) -> list of per-layer caches``;
  the default is tqbridge's block cache (:func:`tqbridge.metal.lm.cache.make_cache`).

A KV configuration is a pair of format names, written ``K/V`` (``"f16"`` means ``f16/f16``); per-layer
pairs (``q8_0/turbo3[0,-1=q8_0/q8_0]``) are refused: llama.cpp cannot give layers different cache types.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tqbridge.bridge.llama.side import rotation_environ
from tqbridge.bridge.blocks.kv_spec import LLAMA_EXAMPLE_KV, is_layered, kv_name, split_kv
from tqbridge.bridge.mlx_blas import prefer_fast_blas
from tqbridge.bridge.blocks.registry import get_format, names, shown

# KV types llama.cpp's CPU backend accepts for its cache (ggml names; the registry's llama_kv).
LLAMA_KV_TYPES = names(lambda f: f.llama_kv)
FLOAT_TYPES = names(lambda f: f.kind == "float")


class LlamaConfigError(RuntimeError):
    """A runtime cannot run the requested configuration (one line says why)."""


@dataclass(frozen=True)
class KV:
    """A K/V format pair."""

    k: str
    v: str

    @classmethod
    def parse(cls, spec: str) -> "KV":
        if is_layered(spec):
            raise ValueError(f"{shown(spec)}: per-layer K/V formats cannot be compared with llama.cpp, which gives "
                             "every layer the same cache types; use tqbridge quality or generate for them")
        k, v = split_kv(str(spec), error=ValueError, noun="K/V pair", example=LLAMA_EXAMPLE_KV)
        return cls(k.lower(), v.lower())

    @property
    def name(self) -> str:
        return kv_name(self.k, self.v, short=True)

    @property
    def is_float(self) -> bool:
        return self.k in FLOAT_TYPES and self.v in FLOAT_TYPES


def llama_kv_types() -> dict[str, int]:
    """KV cache types of this process's llama.cpp side, name -> ggml type id: llama-cpp-python's
    build takes :data:`LLAMA_KV_TYPES`; a build chosen with ``--llama`` also its turbo types."""
    from tqbridge.bridge.llama.side import kv_types, selected

    if selected() is not None:
        return kv_types()
    return {name: int(get_format(name).ggml_id) for name in LLAMA_KV_TYPES}


def release_memory() -> None:
    """Give freed model memory back to the system before the other runtime loads: MLX keeps freed
    buffers for reuse (its cache), and glibc keeps freed heap memory unless trimmed."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    import mlx.core as mx

    mx.clear_cache()
    name = ctypes.util.find_library("c")
    if name and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):     # a C library without it (musl): the memory stays mapped
            pass


class LlamaCppRuntime:
    """llama.cpp (CPU), one context per call: llama-cpp-python's build, or the build chosen with
    :func:`tqbridge.bridge.llama.build.select` (any llama.cpp, the TurboQuant fork included, through
    tqbridge's shim compiled against that build's headers).

    ``rotation``: llama.cpp's automatic Hadamard rotation of quantized KV caches (read from
    ``LLAMA_ATTN_ROT_DISABLE`` when a context is created; on by default, as in llama.cpp; the fork at
    69d8e4b has it off unless asked). ``False`` turns it off so the cache holds plain quantized rows.
    """

    name = "llama.cpp"

    def __init__(self, gguf_path: "str | os.PathLike[str]", *, flash_attn: bool = True,
                 rotation: bool = True, n_threads: "int | None" = None):
        from tqbridge.bridge.llama.compat import ensure_compatible
        from tqbridge.bridge.llama.side import selected

        ensure_compatible()  # version, names and layouts of llama-cpp-python before any use
        self.build = selected()
        self.path = Path(gguf_path)
        self.flash_attn = flash_attn
        self.rotation = rotation
        self.n_threads = n_threads or os.cpu_count() or 1
        self._vocab = None    # llama-cpp-python's tokenizer
        self._model = None    # a --llama build's model handle (its tokenizer and its contexts)
        self.last_state: "bytes | None" = None

    def _type_id(self, fmt: str) -> int:
        from tqbridge.bridge.llama.side import LlamaBuildError, kv_type_id

        if self.build is not None:
            try:
                return kv_type_id(fmt)
            except LlamaBuildError as e:
                raise LlamaConfigError(str(e)) from e
        if fmt not in LLAMA_KV_TYPES:
            raise LlamaConfigError(f"llama.cpp has no KV cache type {fmt!r} (has: {', '.join(LLAMA_KV_TYPES)})")
        return int(get_format(fmt).ggml_id)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        if self.build is not None:
            shim, model = self._shim_model()
            return shim.tokenize(model, text, add_special=add_bos)
        from tqbridge.bridge.gguf.tokenizer import GGUFTokenizer

        if self._vocab is None:
            self._vocab = GGUFTokenizer(self.path)
        return self._vocab.encode(text, add_bos=add_bos)

    def _shim_model(self):
        from tqbridge.bridge.llama.shim import Shim

        shim = Shim.for_build(self.build)
        if self._model is None:
            self._model = shim.load_model(self.path)
        return shim, self._model

    def release(self) -> None:
        """Free the model a --llama build keeps loaded between runs (llama-cpp-python's runs load and
        free their own); the next run loads it again."""
        if self._model is not None:
            from tqbridge.bridge.llama.shim import Shim

            Shim.for_build(self.build).free_model(self._model)
            self._model = None

    def _n_ctx(self, n_tokens: int) -> int:
        return max(256, -(-n_tokens // 256) * 256)

    def _context(self, n_tokens: int, kv: KV):
        from llama_cpp import Llama

        if not kv.is_float and not self.flash_attn and kv.v not in FLOAT_TYPES:
            raise LlamaConfigError("llama.cpp needs flash attention for a quantized V cache")
        n_ctx = self._n_ctx(n_tokens)
        with rotation_environ(self.rotation):
            return Llama(model_path=str(self.path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                         n_threads=self.n_threads, n_threads_batch=self.n_threads, logits_all=True,
                         flash_attn=self.flash_attn, type_k=self._type_id(kv.k), type_v=self._type_id(kv.v),
                         verbose=False)

    def logits(self, tokens: "list[int]", kv: KV, keep_state: bool = False, decode: int = 0) -> np.ndarray:
        """Logits at every position. ``decode``: the last ``decode`` tokens are evaluated one per
        call (decode steps, one query row each) after the rest as one prompt batch."""
        toks = [int(t) for t in tokens]
        split = len(toks) - max(0, min(int(decode), len(toks) - 1))
        if self.build is not None:
            return self._shim_logits(toks, split, kv, keep_state)
        # the rotation's environment for the context's whole life: a build may read it when it builds a
        # graph, not only when it makes the context (the fork at 69d8e4b: LLAMA_ATTN_ROT_K_NROT)
        with rotation_environ(self.rotation):
            llm = self._context(len(tokens), kv)
            try:
                llm.eval(toks[:split])
                for t in toks[split:]:
                    llm.eval([t])
                out = np.array(llm.scores[: len(tokens)], dtype=np.float32, copy=True)
                if keep_state:
                    self.last_state = self.state_blob(llm)
            finally:
                llm.close()
        return out

    def _shim_logits(self, toks: "list[int]", split: int, kv: KV, keep_state: bool) -> np.ndarray:
        if not kv.is_float and not self.flash_attn and kv.v not in FLOAT_TYPES:
            raise LlamaConfigError("llama.cpp needs flash attention for a quantized V cache")
        shim, model = self._shim_model()
        n_ctx = self._n_ctx(len(toks))
        n_vocab = shim.n_vocab(model)
        with rotation_environ(self.rotation):    # the context's whole life (see logits)
            ctx = shim.context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512), n_threads=self.n_threads,
                               flash_attn=self.flash_attn, type_k=self._type_id(kv.k), type_v=self._type_id(kv.v))
            try:
                outs = [shim.decode(ctx, toks[:split], 0, n_vocab, all_logits=True)]
                for i in range(split, len(toks)):
                    outs.append(shim.decode(ctx, [toks[i]], i, n_vocab, all_logits=True))
                if keep_state:
                    self.last_state = shim.state(ctx)
            finally:
                shim.free(ctx)
        return np.concatenate(outs, axis=0)

    def time_prompt_decode(self, tokens: "list[int]", kv: KV, n_prompt: int) -> tuple[float, float]:
        """Seconds to evaluate ``tokens[:n_prompt]`` as one batch into an empty cache, and seconds for the
        remaining tokens as single-token decode steps after it (logits of the last position only)."""
        import time

        toks = [int(t) for t in tokens]
        if not 0 < n_prompt < len(toks):
            raise ValueError(f"n_prompt must be in 1..{len(toks) - 1}, got {n_prompt}")
        if not kv.is_float and not self.flash_attn and kv.v not in FLOAT_TYPES:
            raise LlamaConfigError("llama.cpp needs flash attention for a quantized V cache")
        n_ctx = self._n_ctx(len(toks))
        if self.build is not None:
            shim, model = self._shim_model()
            n_vocab = shim.n_vocab(model)
            with rotation_environ(self.rotation):    # the context's whole life (see logits)
                ctx = shim.context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                                   n_threads=self.n_threads, flash_attn=self.flash_attn,
                                   type_k=self._type_id(kv.k), type_v=self._type_id(kv.v))
                try:
                    t0 = time.perf_counter()
                    shim.decode(ctx, toks[:n_prompt], 0, n_vocab, all_logits=False)
                    t1 = time.perf_counter()
                    for i in range(n_prompt, len(toks)):
                        shim.decode(ctx, [toks[i]], i, n_vocab, all_logits=False)
                    t2 = time.perf_counter()
                finally:
                    shim.free(ctx)
            return t1 - t0, t2 - t1
        from llama_cpp import Llama

        with rotation_environ(self.rotation):    # the context's whole life (see logits)
            llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512),
                        n_threads=self.n_threads, n_threads_batch=self.n_threads, logits_all=False,
                        flash_attn=self.flash_attn, type_k=self._type_id(kv.k), type_v=self._type_id(kv.v),
                        verbose=False)
            try:
                t0 = time.perf_counter()
                llm.eval(toks[:n_prompt])
                t1 = time.perf_counter()
                for t in toks[n_prompt:]:
                    llm.eval([t])
                t2 = time.perf_counter()
            finally:
                llm.close()
        return t1 - t0, t2 - t1

    @staticmethod
    def state_blob(llm) -> bytes:
        """The sequence-0 KV state blob of a live context (see tqbridge.bridge.llama.state)."""
        import ctypes

        import llama_cpp

        ctx = llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        return bytes(buf[:got])

    def info(self) -> dict[str, Any]:
        from importlib.metadata import version

        out = {"runtime": self.name, "flash_attn": self.flash_attn, "kv_rotation": self.rotation,
               "n_threads": self.n_threads, "model": str(self.path.name)}
        if self.build is None:
            out["llama_cpp_python"] = version("llama_cpp_python")
        else:
            r = self.build.report
            out["llama_build"] = {"source": r.get("source"), "commit": r.get("commit"), "ggml": r.get("ggml_version"),
                                  "turbo_variant": self.build.variant}
        return out


CacheFactory = Callable[[Any, str, str], list]


def tqbridge_cache_factory(model, k_format: str, v_format: str, rotation: bool = True) -> list:
    """tqbridge's block cache for every layer (sliding-window layers included).

    ``rotation``: rotate K/V rows of ggml quantized formats by a Hadamard matrix before quantizing,
    as llama.cpp does by default (see ``tqbridge.metal.lm.cache``); match it to the llama.cpp side.
    """
    from tqbridge.metal.lm.cache import make_cache

    return make_cache(model, k_format, v_format, rotation="llama" if rotation else "none")


def stored_cache(model, spelling: str, rotation: bool = True) -> list:
    """tqbridge's cache whose layers hold the per-layer pairs of ``spelling`` (a single pair: every layer)."""
    from tqbridge.metal.lm.cache import make_layered_cache

    return make_layered_cache(model, spelling, rotation="llama" if rotation else "none")


def swa_pattern(model) -> "list[bool]":
    """Per layer of an mlx-lm model: True for a sliding-window layer (iSWA state blobs need it)."""
    from tqbridge.metal.lm.cache import make_cache

    return [bool(getattr(c, "window", None)) for c in make_cache(model)]


class MLXRuntime:
    """The mlx-lm model built from a GGUF file, float32, one full-prompt forward pass per call."""

    name = "mlx"

    def __init__(self, gguf_path: "str | os.PathLike[str]", *, cache_factory: "CacheFactory | None" = None,
                 layout: str = "ggml", match_llama_cpp: bool = True, rotation: bool = True):
        self.blas = prefer_fast_blas()
        from tqbridge.bridge.gguf.model import load_gguf_model

        self.path = Path(gguf_path)
        self.model, self.config = load_gguf_model(self.path, layout=layout, match_llama_cpp=match_llama_cpp)
        self.rotation = rotation
        self.custom_factory = cache_factory is not None
        self.cache_factory = cache_factory or (
            lambda model, k, v: tqbridge_cache_factory(model, k, v, rotation=self.rotation))
        self.last_cache: "list | None" = None

    def logits(self, tokens: "list[int]", kv: KV, keep_cache: bool = False, decode: int = 0,
               layers: "str | None" = None) -> np.ndarray:
        """Logits at every position. ``decode``: the last ``decode`` tokens are decode steps (one
        token per forward pass) through tqbridge's attention routing — the fused decode kernel on a
        GPU, the dispatcher's path on CPU (``cache.paths`` names it). ``layers``: per-layer K/V pairs
        in the per-layer spelling (what a llama.cpp build stored for ``kv``,
        :func:`tqbridge.bridge.llama.stored_kv.read_stored`), instead of ``kv`` in every layer."""
        import mlx.core as mx

        from tqbridge.metal.lm.routing import route_attention

        toks = mx.array([int(t) for t in tokens], dtype=mx.int32)[None]
        split = toks.shape[1] - max(0, min(int(decode), toks.shape[1] - 1))
        cache = self.cache_factory(self.model, kv.k, kv.v) if layers is None else self.layered_cache(layers)
        with route_attention():
            outs = [self.model(toks[:, :split], cache=cache)[0].astype(mx.float32)]
            mx.eval(outs[0])
            for i in range(split, toks.shape[1]):
                outs.append(self.model(toks[:, i:i + 1], cache=cache)[0].astype(mx.float32))
                mx.eval(outs[-1])
        for c in cache:
            if hasattr(c, "check_finite"):
                c.check_finite()
        out = np.array(mx.concatenate(outs, axis=0))
        self.last_cache = cache if keep_cache else None
        return out

    def layered_cache(self, spelling: str) -> list:
        """tqbridge's cache with the per-layer pairs of ``spelling`` (a custom cache factory cannot take them)."""
        if self.custom_factory:
            raise LlamaConfigError(f"the cache factory given takes one K/V pair; llama.cpp stored {spelling}")
        return stored_cache(self.model, spelling, rotation=self.rotation)

    def info(self) -> dict[str, Any]:
        from importlib.metadata import version

        import mlx.core as mx

        return {"runtime": self.name, "mlx": version("mlx"), "mlx_lm": version("mlx_lm"),
                "device": str(mx.default_device()), "blas": self.blas, "kv_rotation": self.rotation,
                "model_type": self.config["model_type"], "model": str(self.path.name)}
