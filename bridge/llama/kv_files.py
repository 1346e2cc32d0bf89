"""llama.cpp's KV cache files: session files and sequence-state files, read, checked against a model, written.

Two files carry a llama.cpp KV cache with its tokens (little endian; ``include/llama.h`` and
``llama_context::state_load_file`` / ``state_seq_load_file`` in ``src/llama-context.cpp`` of the
vendored llama.cpp, llama-cpp-python 0.3.36, measured on files it wrote):

- a **session file** (``llama_state_save_file``; llama-cli's ``--prompt-cache``): u32 magic
  ``LLAMA_SESSION_MAGIC`` 0x6767736E ('ggsn'), u32 ``LLAMA_SESSION_VERSION`` (10), u32 token count,
  the tokens (i32 each), then the full state blob (the architecture name, then the KV cache records);
- a **sequence-state file** (``llama_state_seq_save_file``; llama-server's slot save): u32 magic 'ggsq',
  u32 version 3, u32 token count, the tokens, then one sequence's blob (no magic, no seq_id).

The blobs are read by :mod:`tqbridge.bridge.llama.state`. :func:`kv_geometry` reads what a cache must
match from the model's GGUF, and :func:`check_against_model` refuses, with one line, a file whose
layers, heads, head size, cells or tokens do not fit that model.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .state import FILE_MAGIC, FILE_VERSIONS, LayerKV, LlamaState, StateError, parse_state, write_state

__all__ = ["SESSION_MAGIC", "SESSION_VERSIONS", "SessionFile", "KVGeometry", "parse_session_file",
           "read_session_file", "kv_geometry", "check_against_model", "session_from_layers"]

# include/llama.h: LLAMA_SESSION_MAGIC = LLAMA_FILE_MAGIC_GGSN, LLAMA_SESSION_VERSION.
SESSION_MAGIC = 0x6767736E
SESSION_VERSIONS = (10,)
KINDS = {"session": (SESSION_MAGIC, SESSION_VERSIONS[-1]), "sequence": (FILE_MAGIC, FILE_VERSIONS[-1])}
MAX_TOKENS = 1 << 24


@dataclass
class SessionFile:
    """A llama.cpp session file (``kind`` "session") or sequence-state file (``kind`` "sequence")."""

    kind: str
    tokens: list[int]
    state: LlamaState
    version: int = 0

    def to_bytes(self) -> bytes:
        """The file's bytes, as llama.cpp writes them."""
        if self.kind not in KINDS:
            raise StateError(f"file kind must be 'session' or 'sequence', got {self.kind!r}")
        magic, version = KINDS[self.kind]
        head = struct.pack("<III", magic, self.version or version, len(self.tokens))
        return head + np.asarray(self.tokens, dtype="<i4").tobytes() + write_state(self.state)


def parse_session_file(data: "bytes | bytearray | memoryview") -> SessionFile:
    """Parse a session file or a sequence-state file (told apart by the magic); :class:`StateError`
    with one line for anything else."""
    data = bytes(data)
    if len(data) < 12:
        raise StateError(f"{len(data)} bytes: too short for a llama.cpp session file (12-byte header)")
    magic, version, n_tok = struct.unpack_from("<III", data, 0)
    kind = next((k for k, (m, _) in KINDS.items() if m == magic), None)
    if kind is None:
        raise StateError(f"not a llama.cpp session file: magic 0x{magic:08X}, expected 0x{SESSION_MAGIC:08X} "
                         f"('ggsn', llama_state_save_file) or 0x{FILE_MAGIC:08X} ('ggsq', llama_state_seq_save_file)")
    known = SESSION_VERSIONS if kind == "session" else FILE_VERSIONS
    if version not in known:
        raise StateError(f"{kind} file version {version} is not supported (known: {', '.join(map(str, known))})")
    end = 12 + 4 * n_tok
    if n_tok > MAX_TOKENS or end > len(data):
        raise StateError(f"{kind} file truncated: {n_tok} tokens announced, {max(0, len(data) - 12) // 4} fit")
    tokens = np.frombuffer(data[12:end], dtype="<i4").tolist()
    state = parse_state(data[end:])
    if kind == "session" and state.kind != "full":
        raise StateError("session file: the state after the tokens is not a full context state")
    if kind == "sequence" and state.kind != "seq":
        raise StateError("sequence-state file: the state after the tokens is not a sequence state")
    return SessionFile(kind, tokens, state, version)


def read_session_file(path: "str | os.PathLike[str]") -> SessionFile:
    """:func:`parse_session_file` of a file on disk (an unreadable file is a :class:`StateError` too)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise StateError(f"{path}: cannot read: {e.strerror or e}") from None
    return parse_session_file(data)


@dataclass
class KVGeometry:
    """What a KV cache of a model must match: from the model's GGUF metadata."""

    arch: str
    n_layer: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    n_vocab: int
    name: str = ""
    file: str = ""
    sliding_window: int = 0
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        return (f"{self.arch}, {self.n_layer} layers, {self.n_kv_heads} KV heads of {self.head_dim} values, "
                f"{self.n_vocab} tokens")


def kv_geometry(gguf_path: "str | os.PathLike[str]") -> KVGeometry:
    """The cache geometry of the model in ``gguf_path`` (GGUF metadata only; nothing is dequantized).
    Remembered per file (path, size, modification time): gguf-py reads a 50,000-token vocabulary in seconds."""
    p = Path(gguf_path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = (str(p), -1, -1)
    return _kv_geometry(key, p)


@lru_cache(maxsize=8)
def _kv_geometry(key: tuple, gguf_path: Path) -> KVGeometry:
    from ..gguf.model import GGUFModelError, open_reader

    r = open_reader(gguf_path)

    def get(key, default=None):
        f = r.get_field(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception:  # noqa: BLE001 - a field gguf-py cannot decode counts as absent
            return default

    arch = get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFModelError(f"{gguf_path}: no general.architecture")

    def num(key, default=None):
        v = get(f"{arch}.{key}", default)
        if isinstance(v, list):   # per-layer arrays (head_count_kv of some models)
            vals = set(int(x) for x in v)
            if len(vals) != 1:
                raise GGUFModelError(f"{gguf_path}: {arch}.{key} varies per layer; not supported")
            v = vals.pop()
        if not isinstance(v, (int, np.integer)) or int(v) <= 0:
            raise GGUFModelError(f"{gguf_path}: {arch}.{key} is missing or not a positive integer")
        return int(v)

    n_head = num("attention.head_count")
    head_dim = num("attention.key_length", max(1, num("embedding_length") // n_head))
    toks = r.get_field("tokenizer.ggml.tokens")
    return KVGeometry(arch=arch, n_layer=num("block_count"), n_kv_heads=num("attention.head_count_kv", n_head),
                      head_dim=head_dim, v_head_dim=num("attention.value_length", head_dim),
                      n_vocab=len(toks.data) if toks is not None else 0, name=str(get("general.name", "") or ""),
                      file=Path(gguf_path).name, sliding_window=int(get(f"{arch}.attention.sliding_window", 0) or 0))


def _row_bytes(fmt, dim: int) -> int:
    from ..blocks.padding import padded_dim

    return fmt.row_bytes(padded_dim(fmt, dim))


def check_against_model(sf: SessionFile, geo: KVGeometry) -> list[LayerKV]:
    """The file's per-layer K/V (model layer order) after checking it fits ``geo``: one cache record of
    one sequence at positions 0..n-1, as many cells as tokens, every layer's rows of ``n_kv_heads``
    heads of ``head_dim`` values, V as rows (flash attention on), tokens inside the vocabulary."""
    st = sf.state
    if st.kind == "full" and st.arch != geo.arch:
        raise StateError(f"the file was written by a {st.arch} model; {geo.file} is {geo.arch}")
    # every stream of a record holds all its layers; iSWA models split the layers over two records
    n_layers = sum(len(next((s.layers for s in c.streams if s is not None), [])) for c in st.caches)
    if n_layers != geo.n_layer:
        raise StateError(f"the file's cache has {n_layers} layers; {geo.file} has {geo.n_layer} "
                         f"({geo.describe()}): not this model's file")
    if geo.sliding_window:
        raise StateError(f"{geo.file}: {geo.arch} has sliding-window layers; their caches are not converted yet")
    if len(st.caches) != 1:
        raise StateError(f"the file holds {len(st.caches)} KV cache records; {geo.file} ({geo.arch}) has one")
    stream = st.caches[0].stream()
    n = stream.cell_count
    if stream.pos.tolist() != list(range(n)):
        raise StateError("the cache's cells are not positions 0..n-1 of one sequence in order")
    if any(len(s) != 1 for s in stream.seq_ids) or len({s[0] for s in stream.seq_ids}) != 1:
        raise StateError("the cache's cells belong to more than one sequence")
    if len(sf.tokens) != n:
        raise StateError(f"the file lists {len(sf.tokens)} tokens but its cache holds {n} positions")
    bad = [t for t in sf.tokens if not 0 <= t < geo.n_vocab] if geo.n_vocab else []
    if bad:
        raise StateError(f"token {bad[0]} is outside {geo.file}'s vocabulary of {geo.n_vocab}: not this model's file")
    layers = stream.layers
    if len(layers) != geo.n_layer:
        raise StateError(f"the file's cache has {len(layers)} layers; {geo.file} has {geo.n_layer} "
                         f"({geo.describe()}): not this model's file")
    for i, L in enumerate(layers):
        if L.v_trans:
            raise StateError("the cache holds V transposed (llama.cpp ran without flash attention); "
                             "convert a file written with flash attention on")
        for side, fmt, rows, dim in (("K", L.k_format, L.k, geo.head_dim), ("V", L.v_format, L.v, geo.v_head_dim)):
            want = _row_bytes(fmt, dim) * geo.n_kv_heads
            if rows.shape[1] != want:
                raise StateError(f"layer {i} {side}: rows of {rows.shape[1]} bytes; {geo.file} needs {want} "
                                 f"({geo.n_kv_heads} heads of {dim} {fmt.key} values): not this model's file")
        if (L.k_type, L.v_type) != (layers[0].k_type, layers[0].v_type):
            raise StateError(f"layer {i} holds {L.k_format.key}/{L.v_format.key}, layer 0 "
                             f"{layers[0].k_format.key}/{layers[0].v_format.key}; one pair per file is converted")
    return layers


def session_from_layers(kind: str, tokens: "list[int]", layers: "list[tuple[int, np.ndarray, int, np.ndarray]]",
                        arch: str) -> SessionFile:
    """A one-sequence file of ``kind`` ("session" or "sequence") from (k_type, k_rows, v_type, v_rows)
    per layer (rows (cells, bytes) uint8 in llama.cpp's layout), positions 0..len(tokens)-1, sequence 0."""
    from .state import seq_state

    if kind not in KINDS:
        raise StateError(f"file kind must be 'session' or 'sequence', got {kind!r}")
    st = seq_state(layers, np.arange(len(tokens)), seq_id=0)
    if kind == "session":
        st.kind, st.arch = "full", arch
    else:
        st.header = False     # llama_state_seq_save_file writes the blob without magic and seq_id
    return SessionFile(kind, [int(t) for t in tokens], st)
