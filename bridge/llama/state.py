"""llama.cpp's KV state blob: parse it into per-layer K/V blocks and write it back.

Layout (little endian) of the vendored llama.cpp (llama-cpp-python 0.3.36), measured on real
blobs and read from ``llama_kv_cache::state_write`` in ``src/llama-kv-cache.cpp``:

- sequence blob (``llama_state_seq_get_data``): u32 magic 0xAF143CD8, i32 seq_id;
  full blob (``llama_state_get_data``): u32 n + n bytes of architecture name;
- then one record per KV cache (iSWA models: the non-SWA cache first, then the SWA one):
  u32 n_stream; per stream u32 cell_count, and when it is > 0:
  cell_count x (i32 pos, u32 n_seq_id, [cell extension], n_seq_id x i32 seq_id);
  u32 v_trans, u32 n_layer;
  per layer K: i32 ggml type, u64 row bytes, cell_count rows (one cell: all KV heads, head-major);
  per layer V, not transposed: as K; transposed (flash attention off, F16/F32 only):
  i32 type, u32 element bytes, u32 n_embd_v, then n_embd_v x cell_count elements.

Layer indices are not stored; record order is the model's KV-layer order within each cache.
The blob carries no version number: :func:`parse_state` checks the magic, every type and size,
and that the bytes are consumed exactly, and refuses anything else with a one-line error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

SEQ_MAGIC = 0xAF143CD8
# llama_state_seq_save_file: LLAMA_FILE_MAGIC_GGSQ, LLAMA_STATE_SEQ_VERSION (include/llama.h).
FILE_MAGIC = 0x67677371
FILE_VERSIONS = (3,)
# Characters of llama.cpp architecture names (llama, gemma3, gpt-oss, t5encoder, ...).
_ARCH_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


class StateError(ValueError):
    """A state blob this parser does not understand; the message says where and why."""


def _ggml_types() -> dict[int, object]:
    """Type ids of the active llama.cpp side (upstream's, plus a selected fork build's turbo ids)."""
    from .side import type_table

    return type_table()


def format_for_type(type_id: int):
    """The registry :class:`Format` of ggml type id ``type_id`` (an error for types we lack)."""
    fmt = _ggml_types().get(int(type_id))
    if fmt is None:
        raise StateError(f"ggml type {type_id} is not a format tqbridge knows")
    return fmt


@dataclass
class LayerKV:
    """One layer's K and V of one stream: raw rows exactly as llama.cpp stores them."""

    k_type: int
    k: np.ndarray                  # (cells, k_row_bytes) uint8
    v_type: int
    v: np.ndarray                  # (cells, v_row_bytes) uint8, or (n_embd_v, cells*elem) if v_trans
    v_trans: bool = False
    v_elem_bytes: int = 0          # transposed V only
    n_embd_v: int = 0              # transposed V only

    @property
    def k_format(self):
        return format_for_type(self.k_type)

    @property
    def v_format(self):
        return format_for_type(self.v_type)

    def k_blocks(self, n_kv_heads: int) -> np.ndarray:
        """K rows as (cells, n_kv_heads, bytes per head)."""
        return _per_head(self.k, n_kv_heads, "K")

    def v_blocks(self, n_kv_heads: int) -> np.ndarray:
        """V rows as (cells, n_kv_heads, bytes per head); transposed V is turned back into rows."""
        return _per_head(self.v_rows(), n_kv_heads, "V")

    def v_rows(self) -> np.ndarray:
        if not self.v_trans:
            return self.v
        e = self.v_elem_bytes
        t = self.v.reshape(self.n_embd_v, -1, e)            # (n_embd_v, cells, elem)
        return np.ascontiguousarray(t.transpose(1, 0, 2)).reshape(t.shape[1], -1)

    def k_float(self, n_kv_heads: int) -> np.ndarray:
        """K dequantized to float32 (cells, n_kv_heads, head_dim)."""
        return _dequant(self.k_format, self.k_blocks(n_kv_heads))

    def v_float(self, n_kv_heads: int) -> np.ndarray:
        """V dequantized to float32 (cells, n_kv_heads, head_dim)."""
        return _dequant(self.v_format, self.v_blocks(n_kv_heads))


def _per_head(rows: np.ndarray, n_kv_heads: int, what: str) -> np.ndarray:
    cells, nb = rows.shape
    if n_kv_heads <= 0 or nb % n_kv_heads:
        raise StateError(f"{what} rows of {nb} bytes do not split into {n_kv_heads} KV heads")
    return rows.reshape(cells, n_kv_heads, nb // n_kv_heads)


def _dequant(fmt, blocks: np.ndarray) -> np.ndarray:
    from ..blocks.api import dequantize

    nbytes = blocks.shape[-1]
    if nbytes % fmt.type_size:
        raise StateError(f"{fmt.key}: {nbytes} bytes per head is not a whole number of blocks")
    n = nbytes // fmt.type_size * fmt.block_size
    return dequantize(fmt, np.ascontiguousarray(blocks), n)


@dataclass
class StreamKV:
    """One stream of one KV cache: cell metadata and the layers."""

    pos: np.ndarray                                   # (cells,) int32
    seq_ids: list[tuple[int, ...]]                    # per cell
    cell_ext: list[bytes] = field(default_factory=list)  # per cell, M-RoPE models only
    v_trans: bool = False
    layers: list[LayerKV] = field(default_factory=list)

    @property
    def cell_count(self) -> int:
        return int(self.pos.shape[0])


@dataclass
class CacheKV:
    """One KV cache record: ``n_stream`` streams (``None`` where a stream holds no cells)."""

    streams: list["StreamKV | None"]

    def stream(self) -> StreamKV:
        """The only non-empty stream (an error when there are several or none)."""
        full = [s for s in self.streams if s is not None]
        if len(full) != 1:
            raise StateError(f"expected one stream with cells, found {len(full)}")
        return full[0]


@dataclass
class LlamaState:
    """A parsed state blob: ``kind`` is "seq" (one sequence) or "full" (the whole context)."""

    kind: str
    caches: list[CacheKV]
    seq_id: int = -1
    arch: str = ""
    cell_ext_bytes: int = 0
    header: bool = True   # False: an older llama.cpp's sequence blob (no magic, no seq_id), written back alike

    def layers(self, cache: int = 0) -> list[LayerKV]:
        """The layers of the one non-empty stream of cache record ``cache``."""
        if not 0 <= cache < len(self.caches):
            raise StateError(f"no cache record {cache}; the blob has {len(self.caches)}")
        return self.caches[cache].stream().layers

    def model_layers(self, swa: "list[bool] | None" = None) -> "dict[int, LayerKV]":
        """Model layer index -> its K/V. ``swa``: per model layer, True where it is a sliding-window
        layer (iSWA models store the non-SWA cache first, then the SWA one); None for one cache."""
        if swa is None:
            if len(self.caches) != 1:
                raise StateError(f"the blob has {len(self.caches)} cache records; give the sliding-window pattern")
            return dict(enumerate(self.layers()))
        groups = [[i for i, w in enumerate(swa) if not w], [i for i, w in enumerate(swa) if w]]
        groups = [g for g in groups if g]
        if len(groups) != len(self.caches):
            raise StateError(f"the pattern gives {len(groups)} kinds of layer, the blob {len(self.caches)} cache records")
        out: dict[int, LayerKV] = {}
        for c, idx in enumerate(groups):
            layers = self.layers(c)
            if len(layers) != len(idx):
                raise StateError(f"cache record {c} holds {len(layers)} layers, the pattern says {len(idx)}")
            out.update(zip(idx, layers))
        return dict(sorted(out.items()))

    def to_bytes(self) -> bytes:
        """Serialise back into llama.cpp's layout (the inverse of :func:`parse_state`)."""
        return write_state(self)


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.off = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.off + n > len(self.buf):
            raise StateError(
                f"state blob truncated: {what} needs {n} bytes at offset {self.off}, "
                f"{len(self.buf) - self.off} left"
            )
        out = self.buf[self.off:self.off + n]
        self.off += n
        return out

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))[0]

    def left(self) -> int:
        return len(self.buf) - self.off

    def count(self, n: int, min_bytes: int, what: str) -> int:
        """``n`` items of at least ``min_bytes`` each must fit in the bytes left: checked before
        anything is allocated for them (a hostile count must not size an allocation)."""
        if n * min_bytes > self.left():
            raise StateError(f"state blob: {n} {what} need at least {n * min_bytes} bytes at offset {self.off}, "
                             f"{self.left()} left")
        return n

    def rows(self, n_rows: int, row_bytes: int, what: str) -> np.ndarray:
        raw = self.take(n_rows * row_bytes, what)
        return np.frombuffer(raw, dtype=np.uint8).reshape(n_rows, row_bytes).copy()


def _check_row(type_id: int, row_bytes: int, where: str) -> None:
    fmt = _ggml_types().get(type_id)
    if fmt is None:
        raise StateError(f"{where}: unknown ggml type {type_id}")
    if row_bytes <= 0 or row_bytes % fmt.type_size:
        raise StateError(f"{where}: row of {row_bytes} bytes is not whole {fmt.key} blocks ({fmt.type_size} B)")


def _read_stream(r: _Reader, cells: int, ext: int, where: str) -> StreamKV:
    # each cell holds at least its position, its sequence-id count and its extension
    r.count(cells, 8 + ext, f"cells of {where}")
    pos = np.empty(cells, dtype=np.int32)
    seq_ids: list[tuple[int, ...]] = []
    cell_ext: list[bytes] = []
    for i in range(cells):
        pos[i] = r.unpack("i", "cell pos")
        n_seq = r.unpack("I", "cell n_seq_id")
        if n_seq > 4096:
            raise StateError(f"{where}: cell {i} claims {n_seq} sequence ids; not a KV state blob of this layout")
        r.count(n_seq, 4, f"sequence ids of cell {i} in {where}")
        if ext:
            cell_ext.append(bytes(r.take(ext, "cell extension")))
        seq_ids.append(tuple(r.unpack("i", "cell seq_id") for _ in range(n_seq)))
    v_trans = r.unpack("I", "v_trans")
    if v_trans not in (0, 1):
        raise StateError(f"{where}: v_trans is {v_trans}, expected 0 or 1")
    n_layer = r.unpack("I", "n_layer")
    if not 0 < n_layer <= 4096:
        raise StateError(f"{where}: implausible layer count {n_layer}")
    r.count(n_layer, 2 * 12, f"layers of {where}")   # a K and a V header each
    ks = []
    for il in range(n_layer):
        t = r.unpack("i", "K type")
        rb = r.unpack("Q", "K row bytes")
        _check_row(t, rb, f"{where} layer {il} K")
        ks.append((t, r.rows(cells, rb, f"layer {il} K")))
    layers = []
    for il in range(n_layer):
        t = r.unpack("i", "V type")
        if not v_trans:
            rb = r.unpack("Q", "V row bytes")
            _check_row(t, rb, f"{where} layer {il} V")
            layers.append(LayerKV(ks[il][0], ks[il][1], t, r.rows(cells, rb, f"layer {il} V")))
        else:
            eb = r.unpack("I", "V element bytes")
            ne = r.unpack("I", "V n_embd")
            if (t, eb) not in ((0, 4), (1, 2), (30, 2)):
                raise StateError(f"{where} layer {il}: transposed V of type {t} with {eb}-byte elements")
            v = r.rows(ne, cells * eb, f"layer {il} V (transposed)")
            layers.append(LayerKV(ks[il][0], ks[il][1], t, v, True, eb, ne))
    return StreamKV(pos, seq_ids, cell_ext, bool(v_trans), layers)


def _read_cache(r: _Reader, ext: int, where: str) -> CacheKV:
    n_stream = r.unpack("I", "n_stream")
    if not 0 < n_stream <= 4096:
        raise StateError(f"{where}: implausible stream count {n_stream}")
    r.count(n_stream, 4, f"streams of {where}")
    streams: list[StreamKV | None] = []
    for s in range(n_stream):
        cells = r.unpack("I", "cell_count")
        streams.append(_read_stream(r, cells, ext, f"{where} stream {s}") if cells else None)
    return CacheKV(streams)


def parse_state(blob: "bytes | bytearray | memoryview", *, cell_ext_bytes: int = 0) -> LlamaState:
    """Parse a sequence blob (``llama_state_seq_get_data``) or a full blob (``llama_state_get_data``).

    ``cell_ext_bytes``: size of the per-cell extension struct M-RoPE models write (0 otherwise).
    """
    blob = bytes(blob)
    r = _Reader(blob)
    if len(blob) < 8:
        raise StateError(f"state blob of {len(blob)} bytes is too short")
    head = struct.unpack_from("<I", blob, 0)[0]
    if head == SEQ_MAGIC:
        r.off = 4
        state = LlamaState("seq", [], seq_id=r.unpack("i", "seq_id"), cell_ext_bytes=cell_ext_bytes)
    elif head == FILE_MAGIC:
        raise StateError("this is a sequence-state file (magic 'ggsq'); use parse_state_file")
    elif 0 < head <= 64 and len(blob) >= 4 + head and _ARCH_CHARS.issuperset(blob[4:4 + head]):
        r.off = 4
        arch = bytes(r.take(head, "architecture")).decode("ascii")
        state = LlamaState("full", [], arch=arch, cell_ext_bytes=cell_ext_bytes)
    else:
        # older llama.cpp (the TurboQuant fork at 69d8e4b) writes a sequence blob without the magic and
        # seq_id: the cache records start at byte 0. Taken only when the whole blob parses as that.
        try:
            return _records(LlamaState("seq", [], seq_id=0, cell_ext_bytes=cell_ext_bytes, header=False), _Reader(blob),
                            cell_ext_bytes)
        except StateError:
            pass
        raise StateError(
            f"unknown state blob magic 0x{head:08X}: expected a sequence blob (0x{SEQ_MAGIC:08X}), "
            "a full blob (architecture name first) or an older header-less sequence blob"
        )
    return _records(state, r, cell_ext_bytes)


def _records(state: LlamaState, r: "_Reader", cell_ext_bytes: int) -> LlamaState:
    blob = r.buf
    while r.off < len(blob):
        state.caches.append(_read_cache(r, cell_ext_bytes, f"cache {len(state.caches)}"))
    if not state.caches:
        raise StateError("state blob holds no KV cache record")
    return state


def parse_state_file(data: bytes, **kw) -> tuple[list[int], LlamaState]:
    """Parse ``llama_state_seq_save_file`` output: (prompt tokens, sequence state)."""
    data = bytes(data)
    if len(data) < 12:
        raise StateError("sequence-state file too short")
    magic, version, n_tok = struct.unpack_from("<III", data, 0)
    if magic != FILE_MAGIC:
        raise StateError(f"not a sequence-state file: magic 0x{magic:08X}, expected 0x{FILE_MAGIC:08X} ('ggsq')")
    if version not in FILE_VERSIONS:
        raise StateError(f"sequence-state file version {version} is not supported (known: {FILE_VERSIONS})")
    end = 12 + 4 * n_tok
    if end > len(data):
        raise StateError(f"sequence-state file truncated: {n_tok} tokens announced")
    tokens = np.frombuffer(data[12:end], dtype="<i4").tolist()
    return tokens, parse_state(data[end:], **kw)


def _write_stream(out: list, s: StreamKV, ext: int) -> None:
    cells = s.cell_count
    if len(s.seq_ids) != cells:
        raise StateError(f"{len(s.seq_ids)} seq-id tuples for {cells} cells")
    if ext and len(s.cell_ext) != cells:
        raise StateError(f"{len(s.cell_ext)} cell extensions for {cells} cells")
    for i in range(cells):
        out.append(struct.pack("<iI", int(s.pos[i]), len(s.seq_ids[i])))
        if ext:
            if len(s.cell_ext[i]) != ext:
                raise StateError(f"cell {i}: extension of {len(s.cell_ext[i])} bytes, expected {ext}")
            out.append(s.cell_ext[i])
        out.append(struct.pack(f"<{len(s.seq_ids[i])}i", *s.seq_ids[i]))
    out.append(struct.pack("<II", int(s.v_trans), len(s.layers)))
    for il, L in enumerate(s.layers):
        k = np.ascontiguousarray(L.k, dtype=np.uint8)
        if k.ndim != 2 or k.shape[0] != cells:
            raise StateError(f"layer {il}: K must be (cells={cells}, row bytes), got {k.shape}")
        _check_row(L.k_type, k.shape[1], f"layer {il} K")
        out.append(struct.pack("<iQ", L.k_type, k.shape[1]))
        out.append(k.tobytes())
    for il, L in enumerate(s.layers):
        v = np.ascontiguousarray(L.v, dtype=np.uint8)
        if L.v_trans != s.v_trans:
            raise StateError(f"layer {il}: v_trans {L.v_trans} differs from the stream's {s.v_trans}")
        if not L.v_trans:
            if v.ndim != 2 or v.shape[0] != cells:
                raise StateError(f"layer {il}: V must be (cells={cells}, row bytes), got {v.shape}")
            _check_row(L.v_type, v.shape[1], f"layer {il} V")
            out.append(struct.pack("<iQ", L.v_type, v.shape[1]))
        else:
            if v.shape != (L.n_embd_v, cells * L.v_elem_bytes):
                raise StateError(f"layer {il}: transposed V has shape {v.shape}")
            out.append(struct.pack("<iII", L.v_type, L.v_elem_bytes, L.n_embd_v))
        out.append(v.tobytes())


def write_state(state: LlamaState) -> bytes:
    """Serialise ``state`` into the blob ``llama_state_seq_set_data`` / ``llama_state_set_data`` read."""
    out: list[bytes] = []
    if state.kind == "seq":
        if state.header:
            out.append(struct.pack("<Ii", SEQ_MAGIC, state.seq_id))
    elif state.kind == "full":
        a = state.arch.encode("ascii")
        out.append(struct.pack("<I", len(a)) + a)
    else:
        raise StateError(f"state kind must be 'seq' or 'full', got {state.kind!r}")
    for c in state.caches:
        out.append(struct.pack("<I", len(c.streams)))
        for s in c.streams:
            if s is None or s.cell_count == 0:
                out.append(struct.pack("<I", 0))
                continue
            out.append(struct.pack("<I", s.cell_count))
            _write_stream(out, s, state.cell_ext_bytes)
    return b"".join(out)


def seq_state(layers: "list[tuple[int, np.ndarray, int, np.ndarray]]", pos, *, seq_id: int = 0) -> LlamaState:
    """Build a one-cache, one-stream sequence state from (k_type, k_rows, v_type, v_rows) per layer.

    Rows are (cells, row bytes) uint8 in llama.cpp's layout (all KV heads of a cell, head-major).
    """
    pos = np.asarray(pos, dtype=np.int32)
    ls = [LayerKV(int(kt), np.asarray(k, np.uint8), int(vt), np.asarray(v, np.uint8)) for kt, k, vt, v in layers]
    stream = StreamKV(pos, [(seq_id,)] * int(pos.shape[0]), [], False, ls)
    return LlamaState("seq", [CacheKV([stream])], seq_id=seq_id)


def read_seq_state(ctx, seq_id: int = 0) -> bytes:
    """The raw sequence blob of ``seq_id`` from a llama.cpp context (``Llama._ctx.ctx``)."""
    import ctypes

    import llama_cpp

    n = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
    buf = (ctypes.c_uint8 * n)()
    got = llama_cpp.llama_state_seq_get_data(ctx, buf, n, seq_id)
    if got != n:
        raise StateError(f"llama_state_seq_get_data wrote {got} of {n} bytes")
    return bytes(buf)


def load_seq_state(ctx, blob: bytes, seq_id: int = 0) -> None:
    """Restore a sequence blob into ``seq_id`` of a llama.cpp context (an error if llama.cpp refuses)."""
    import ctypes

    import llama_cpp

    buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    got = llama_cpp.llama_state_seq_set_data(ctx, buf, len(blob), seq_id)
    if got != len(blob):
        raise StateError(f"llama.cpp refused the sequence state (read {got} of {len(blob)} bytes)")
