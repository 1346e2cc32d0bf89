"""Reading GGUF files safely: validate the structure first, then read with gguf-py.

gguf-py's ``GGUFReader`` trusts the file: a bad count can make it loop for a very long time, a
truncated file gives short arrays or odd exceptions. :func:`validate` walks the header with bounds
checks on every length and count (GGUF v2/v3, either byte order; layout from the GGUF spec in
ggml's docs/gguf.md) and raises :class:`GGUFError` with one line naming the problem; only then
:func:`open_gguf` hands the file to ``GGUFReader``. :func:`read_values` reads chosen metadata values
without gguf-py, every length and count bounds-checked the same way (large vocabularies in a fraction
of gguf-py's time).
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4              # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32    # GGUF_DEFAULT_ALIGNMENT
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_NESTING = 8


class GGUFError(ValueError):
    """The file is not a GGUF file tqbridge can read; the message says why, in one line."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    type_name: str          # gguf-py's name, e.g. "Q4_1"
    shape: tuple[int, ...]  # ggml order: shape[0] = ne0, the row length
    n_bytes: int
    offset: int             # absolute offset of the data in the file
    block_size: int
    type_size: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def n_blocks(self) -> int:
        return self.n_bytes // self.type_size


@dataclass
class GGUFFile:
    path: str
    version: int
    byte_order: str         # "<" or ">"
    alignment: int
    data_offset: int
    file_size: int
    tensors: list[TensorInfo]
    metadata: dict[str, Any] = field(default_factory=dict)   # filled by open_gguf
    reader: Any = field(default=None, repr=False)
    # key -> (value type, item type, item count) of every metadata value (item type/count: arrays only)
    value_types: dict[str, tuple] = field(default_factory=dict, repr=False)
    duplicate_token: "bytes | None" = None   # the first token that tokenizer.ggml.tokens holds twice
    # the first byte value (0-255) with no token "<0xXX>" and no one-byte token of itself: llama.cpp's
    # SentencePiece tokenizer throws an uncaught C++ exception (the process aborts) on a character
    # that needs it (llama_vocab::byte_to_token); None where every byte has one or there are no tokens
    missing_byte: "int | None" = None
    tokenizer_model: "str | None" = None     # tokenizer.ggml.model where it is a UTF-8 string

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise GGUFError(f"{self.path}: no tensor named {_shown(name)} ({len(self.tensors)} tensors)")

    def block_bytes(self, name: str, index: int) -> bytes:
        """The raw bytes of block ``index`` (negative counts from the end) of tensor ``name``."""
        t = self.tensor(name)
        if t.n_blocks == 0:
            raise GGUFError(f"tensor {_shown(name)} is empty")
        if not -t.n_blocks <= index < t.n_blocks:
            raise GGUFError(f"tensor {_shown(name)} has {t.n_blocks} blocks; index {index} is out of range")
        index %= t.n_blocks
        with open(self.path, "rb") as fh:
            fh.seek(t.offset + index * t.type_size)
            raw = fh.read(t.type_size)
        if len(raw) != t.type_size:
            raise GGUFError(f"{self.path}: file shrank while reading tensor {_shown(name)}")
        return raw


class Cursor:
    """A read position in GGUF bytes: each read checks the bytes are there, GGUFError naming what is
    read, where and in which file when they are not."""

    def __init__(self, buf, size: int, order: str, path: str):
        self.buf, self.size, self.order, self.path, self.pos = buf, size, order, path, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path}: truncated: {what} needs {n} bytes at offset {self.pos}, file has {self.size}"
            )

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what: str, decode: bool = True) -> "str | None":
        n = self.unpack("Q", f"length of {what}")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n] if decode else None
        self.pos += n
        if raw is None:
            return None
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} at offset {self.pos - n} is not valid UTF-8") from None

    def strings(self, count: int, what: str):
        """The next ``count`` strings of an array, as bytes (lengths checked)."""
        self.need(count * 8, f"{count} items of {what}")
        for _ in range(count):
            n = self.unpack("Q", f"length of an item of {what}")
            self.need(n, what)
            yield bytes(self.buf[self.pos:self.pos + n])
            self.pos += n

    def skip_value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _SCALAR_SIZES:
            self.need(_SCALAR_SIZES[vtype], what)
            self.pos += _SCALAR_SIZES[vtype]
        elif vtype == _STRING:
            self.string(what, decode=False)
        elif vtype == _ARRAY:
            if depth >= _MAX_NESTING:
                raise GGUFError(f"{self.path}: {what} nests arrays more than {_MAX_NESTING} deep")
            itype = self.unpack("I", f"item type of {what}")
            count = self.unpack("Q", f"length of {what}")
            if itype in _SCALAR_SIZES:
                self.need(count * _SCALAR_SIZES[itype], f"{count} items of {what}")
                self.pos += count * _SCALAR_SIZES[itype]
            elif itype in (_STRING, _ARRAY):
                self.need(count * (8 if itype == _STRING else 12), f"{count} items of {what}")
                for _ in range(count):
                    self.skip_value(itype, what, depth + 1)
            else:
                raise GGUFError(f"{self.path}: {what} is an array of unknown value type {itype}")
        else:
            raise GGUFError(f"{self.path}: {what} has unknown value type {vtype}")


def _check_path(path: str) -> int:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    if not stat.S_ISREG(st.st_mode):
        raise GGUFError(f"{path}: not a regular file")
    if st.st_size == 0:
        raise GGUFError(f"{path}: empty file (0 bytes), not a GGUF file")
    return st.st_size


def validate(path: "str | os.PathLike[str]") -> GGUFFile:
    """Check the structure of a GGUF file without gguf-py; :class:`GGUFError` on the first problem."""
    path = os.fspath(path)
    size = _check_path(path)
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _walk(buf, size, path)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read: {e.strerror or e}") from None


def _walk(buf, size: int, path: str) -> GGUFFile:
    if size < 4 and MAGIC.startswith(bytes(buf[:size])):
        raise GGUFError(f"{path}: truncated: {size} bytes, shorter than a GGUF header (24)")
    if bytes(buf[:4]) != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected {MAGIC!r})")
    if size < 24:
        raise GGUFError(f"{path}: truncated: {size} bytes, shorter than a GGUF header (24)")
    order = "<"
    version = struct.unpack_from("<I", buf, 4)[0]
    if version & 0xFFFF == 0:   # written on a big-endian machine
        order = ">"
        version = struct.unpack_from(">I", buf, 4)[0]
    if version not in VERSIONS:
        raise GGUFError(f"{path}: unsupported GGUF version {version} (readable: {', '.join(map(str, VERSIONS))})")
    c = Cursor(buf, size, order, path)
    c.pos = 8
    n_tensors, n_kv = c.unpack("QQ", "tensor and metadata counts")
    rest = size - c.pos
    if n_kv * 12 > rest or n_tensors * 24 > rest:
        raise GGUFError(f"{path}: counts ({n_tensors} tensors, {n_kv} metadata keys) cannot fit in {size} bytes")
    value_types: dict[str, tuple] = {}
    duplicate = missing_byte = tokenizer_model = None
    alignment = DEFAULT_ALIGNMENT
    for i in range(n_kv):
        key = c.string(f"metadata key #{i}")
        if key in value_types:
            raise GGUFError(f"{path}: metadata key {_shown(key)} appears twice")
        vtype = c.unpack("I", f"type of metadata {_shown(key)}")
        value_types[key] = (vtype, None, None)
        if vtype == _ARRAY and c.pos + 12 <= size:
            itype, count = struct.unpack_from(order + "IQ", buf, c.pos)
            value_types[key] = (vtype, itype, count)
            if key == "tokenizer.ggml.tokens" and itype == _STRING:
                c.pos += 12
                seen: set = set()
                for tok in c.strings(count, f"metadata {_shown(key)}"):
                    tok = tok.split(b"\0", 1)[0]   # llama.cpp reads tokens as C strings
                    if duplicate is None and tok in seen:
                        duplicate = tok
                    seen.add(tok)
                missing_byte = next((b for b in range(256) if f"<0x{b:02X}>".encode() not in seen
                                     and bytes([b]).split(b"\0", 1)[0] not in seen), None)
                continue
        if key == "tokenizer.ggml.model" and vtype == _STRING:
            n = c.unpack("Q", f"length of metadata {_shown(key)}")
            c.need(n, f"metadata {_shown(key)}")
            try:
                tokenizer_model = bytes(buf[c.pos:c.pos + n]).split(b"\0", 1)[0].decode("utf-8")   # a C string
            except UnicodeDecodeError:
                tokenizer_model = None
            c.pos += n
            continue
        if key == "general.alignment":
            if vtype != 4:
                raise GGUFError(f"{path}: general.alignment must be uint32, has value type {vtype}")
            alignment = c.unpack("I", "general.alignment")
            if alignment == 0 or alignment & (alignment - 1):
                raise GGUFError(f"{path}: general.alignment {alignment} is not a power of two")
            continue
        c.skip_value(vtype, f"metadata {_shown(key)}")
    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.string(f"name of tensor #{i}")
        if name in names:
            raise GGUFError(f"{path}: tensor {_shown(name)} appears twice")
        names.add(name)
        n_dims = c.unpack("I", f"dimension count of tensor {_shown(name)}")
        if n_dims > MAX_DIMS:
            raise GGUFError(f"{path}: tensor {_shown(name)} has {n_dims} dimensions; ggml allows at most {MAX_DIMS}")
        dims = tuple(int(c.unpack("Q", f"shape of tensor {_shown(name)}")) for _ in range(n_dims))
        type_id = c.unpack("I", f"type of tensor {_shown(name)}")
        rel = c.unpack("Q", f"data offset of tensor {_shown(name)}")
        infos.append((name, dims, type_id, rel))
    data_offset = -(-c.pos // alignment) * alignment
    tensors = []
    for name, dims, type_id, rel in infos:
        try:
            qtype = GGMLQuantizationType(type_id)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError(f"{path}: tensor {_shown(name)} has unknown ggml type id {type_id}") from None
        n_el = 1
        for d in dims:
            n_el *= d
        if n_el >= 1 << 62:
            raise GGUFError(f"{path}: tensor {_shown(name)} shape {dims} is too large")
        if dims and dims[0] % block_size:
            raise GGUFError(
                f"{path}: tensor {_shown(name)} ({qtype.name}) row length {dims[0]} is not a multiple of its block size {block_size}"
            )
        if rel % alignment:
            raise GGUFError(f"{path}: tensor {_shown(name)} data offset {rel} is not aligned to {alignment}")
        n_bytes = n_el // block_size * type_size
        start = data_offset + rel
        if start + n_bytes > size:
            raise GGUFError(
                f"{path}: tensor {_shown(name)} data [{start}, {start + n_bytes}) lies outside the file ({size} bytes)"
            )
        tensors.append(TensorInfo(name, type_id, qtype.name, dims, n_bytes, start, block_size, type_size))
    spans = sorted((t for t in tensors if t.n_bytes), key=lambda t: t.offset)
    for a, b in zip(spans, spans[1:]):
        if b.offset < a.offset + a.n_bytes:
            raise GGUFError(f"{path}: data of tensors {a.name!r} and {b.name!r} overlap")
    return GGUFFile(path, version, order, alignment, data_offset, size, tensors,
                    value_types=value_types, duplicate_token=duplicate, missing_byte=missing_byte,
                    tokenizer_model=tokenizer_model)


def _shown(text: str) -> str:
    """``repr`` of a name from the file, shortened: a hostile file must not make a message huge."""
    return repr(text[:60]) + (f"... ({len(text)} characters)" if len(text) > 60 else "")


def _field_value(f, limit: int) -> Any:
    """A JSON-friendly value of a gguf-py ReaderField; arrays longer than ``limit`` are summarised."""
    def item(idx: int, t: GGUFValueType):
        part = f.parts[idx]
        if t == GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        if part.dtype == np.float32:  # shortest text that reads back as the same float32
            v = [float(str(x)) for x in part]
        else:
            v = part.tolist()
        return v[0] if len(v) == 1 else v

    main = f.types[0] if f.types else None
    if main is None:
        return None
    if main != GGUFValueType.ARRAY:
        return item(f.data[0], main)
    sub = f.types[-1]
    count = len(f.data)
    if len(f.types) > 2:
        return {"array_of": "array", "length": count}
    values = [item(i, sub) for i in f.data[:limit]]
    if count <= limit:
        return values
    return {"array_of": sub.name.lower(), "length": count, "head": values}


def open_gguf(path: "str | os.PathLike[str]", *, array_limit: int = 16) -> GGUFFile:
    """Validate, then read with gguf-py: tensors and metadata (long arrays summarised)."""
    info = validate(path)
    try:
        reader = GGUFReader(info.path, "r")
        meta = {k: _field_value(f, array_limit) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    except Exception as e:  # noqa: BLE001 - gguf-py raises many kinds; report any as a bad file
        raise GGUFError(f"{info.path}: gguf-py cannot read it: {type(e).__name__}: {e}") from None
    if [t.data_offset for t in reader.tensors] != [t.offset for t in info.tensors]:
        raise GGUFError(f"{info.path}: gguf-py and the validator disagree on tensor offsets")
    info.metadata = meta
    info.reader = reader
    return info


# GGUF value type -> struct / numpy item code (GGUF spec: uint8, int8, uint16, int16, uint32, int32,
# float32, bool, -, -, uint64, int64, float64)
_SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}


def read_values(path: "str | os.PathLike[str]", keys) -> dict[str, Any]:
    """The values of the metadata ``keys`` the file has, read by tqbridge's own bounded walk (no
    gguf-py: Gemma 3's 262,144-token vocabulary takes about half a second here, gguf-py's
    ``GGUFReader`` about 18 s): numbers as ``int`` / ``float``, booleans as ``bool``, strings as
    ``str``, arrays of numbers as numpy arrays (booleans as ``bool``), arrays of strings as lists of
    ``str``. :class:`GGUFError` with one line for a truncated file, a string that is not UTF-8 (naming
    its key) or a wanted key holding an array of arrays; the other keys' values are only skipped."""
    path = os.fspath(path)
    size = _check_path(path)
    wanted = set(keys)
    out: dict[str, Any] = {}
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if size < 24 or bytes(buf[:4]) != MAGIC:
                raise GGUFError(f"{path}: not a GGUF file")
            order = ">" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF == 0 else "<"
            c = Cursor(buf, size, order, path)
            c.pos = 8
            _, n_kv = c.unpack("QQ", "tensor and metadata counts")
            for i in range(n_kv):
                key = c.string(f"metadata key #{i}")
                vtype = c.unpack("I", f"type of metadata {_shown(key)}")
                if key in wanted:
                    out[key] = _read_value(c, vtype, key)
                else:
                    c.skip_value(vtype, f"metadata {_shown(key)}")
    except OSError as e:
        raise GGUFError(f"{path}: cannot read: {e.strerror or e}") from None
    return out


def _text(raw: bytes, c: Cursor, key: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise GGUFError(f"{c.path}: metadata {_shown(key)} holds a string that is not UTF-8") from None


def _read_value(c: Cursor, vtype: int, key: str) -> Any:
    what = f"metadata {_shown(key)}"
    if vtype in _SCALAR_CODES:
        v = c.unpack(_SCALAR_CODES[vtype], what)
        return bool(v) if vtype == 7 else v
    if vtype == _STRING:
        n = c.unpack("Q", f"length of {what}")
        c.need(n, what)
        c.pos += n
        return _text(bytes(c.buf[c.pos - n:c.pos]), c, key)
    if vtype != _ARRAY:
        raise GGUFError(f"{c.path}: {what} has unknown value type {vtype}")
    itype = c.unpack("I", f"item type of {what}")
    count = c.unpack("Q", f"length of {what}")
    if itype in _SCALAR_CODES:
        n = count * _SCALAR_SIZES[itype]
        c.need(n, f"{count} items of {what}")
        arr = np.frombuffer(c.buf, dtype=np.dtype(_SCALAR_CODES[itype]).newbyteorder(c.order),
                            count=count, offset=c.pos).copy()
        c.pos += n
        return arr.astype(bool) if itype == 7 else arr.astype(arr.dtype.newbyteorder("="))
    if itype == _STRING:
        return [_text(s, c, key) for s in c.strings(count, what)]
    raise GGUFError(f"{c.path}: {what} is an array of value type {itype}, not of numbers or strings")
