"""The ``gguf`` parser target: seeds written with gguf-py's ``GGUFWriter`` (a tiny llama model, a
tiny qwen3 Q8_0 model, a file of one tensor per block type, a tiny qwen2moe model with experts), a
walk of their integer fields, a structure-preserving edit (metadata values, tensor types and shapes,
tensors removed or added), and the consumers ``inspect``, ``load``, ``convert-f32`` and ``convert-mlx``."""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass
from pathlib import Path

from tqbridge.bridge.gguf.fixtures import add_tiny_spm_vocab, add_tiny_vocab, variant, write_fixture

from .mutation import BOUNDARY
from .target import ParserTarget, Seed, remove_output, write_input


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


def write_tiny_gguf_model(path: Path, arch: str = "llama", qtype=None, seed: int = 0, vocab=None) -> Path:
    """A tiny random model GGUF (1 layer, width 32) that tqbridge and llama.cpp both load. ``vocab(w, n)``
    writes its ``n``-token vocabulary on the GGUFWriter (default :func:`add_tiny_vocab`)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    d, n_head, n_kv, hd, ff, n_vocab = 32, 2, 1, 16, 64, 300
    w = gguf.GGUFWriter(str(path), arch)
    (vocab or add_tiny_vocab)(w, n_vocab)
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
class GGUFParts:
    """A valid little-endian GGUF split into raw metadata entries, tensor infos and data."""

    version: int
    kvs: list            # [key, value type, raw value bytes]
    tensors: list        # [name, dims, type id, raw data bytes]
    alignment: int


def parse_gguf_parts(data: bytes) -> "GGUFParts | None":
    """A little-endian GGUF split into its parts (raw bytes each), or None where it does not parse."""
    try:
        from tqbridge.bridge.gguf.io import Cursor

        c = Cursor(data, len(data), "<", "seed")
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
        return GGUFParts(version, kvs, tensors, alignment)
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


def write_gguf_parts(p: GGUFParts) -> bytes:
    """The GGUF bytes of ``p`` (the inverse of :func:`parse_gguf_parts`)."""
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
        t = rng.choice(("", "llama", "qwen2", "qwen3", "gemma3", "phi3", "granite", "qwen2moe", "command-r", "gpt2",
                        "linear", "yarn", "none", "x" * 5000, "\u00e9", "42"))
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
    p = parse_gguf_parts(data)
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
    return write_gguf_parts(p), op


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
                ("block-zoo", write_block_zoo_gguf(scratch / "c.gguf")),
                ("tiny-qwen2moe-f32", write_fixture(scratch / "d.gguf", "qwen2moe", fixture=variant(
                    "qwen2moe", n_layer=1, d=32, n_head=2, n_kv=1, head_dim=16, ff=64, ff_expert=32, ff_shared=32))),
                # the SentencePiece tokenizer export (convert-mlx) and llama.cpp's SentencePiece loader
                ("tiny-llama-spm", write_tiny_gguf_model(scratch / "e.gguf", "llama", vocab=add_tiny_spm_vocab))]
        out = []
        for name, p in made:
            data = p.read_bytes()
            fields, hot = _gguf_fields(data)
            out.append(Seed(name, data, fields, hot))
            p.unlink()
        return out

    def clean_classes(self, consumer):
        from tqbridge.bridge.gguf.io import GGUFError
        from tqbridge.bridge.gguf.model import GGUFModelError
        from tqbridge.bridge.blocks.format_types import FormatError

        if consumer == "inspect":
            return (GGUFError, FormatError)
        return (GGUFModelError,)

    def call(self, consumer, data, scratch):
        path = write_input(scratch, data, self.suffix)
        if consumer == "inspect":
            _inspect(path)
        elif consumer == "load":
            from tqbridge.bridge.gguf.model import load_gguf_model

            load_gguf_model(path)
        elif consumer == "convert-f32":
            from tqbridge.bridge.gguf.f32 import write_f32_gguf

            out = scratch / "out.f32.gguf"
            remove_output(out)
            write_f32_gguf(path, out)
        elif consumer == "convert-mlx":
            from tqbridge.bridge.gguf.mlx_export import write_mlx_dir

            out = scratch / "out-mlx"
            remove_output(out)
            write_mlx_dir(path, out)
        return None


def _inspect(path: Path) -> None:
    """What ``tqbridge inspect FILE [--block T:I] [--json]`` does, without its catch-all."""
    from tqbridge.bridge.blocks.blockdump import describe_block
    from tqbridge.bridge.gguf.io import open_gguf
    from tqbridge.bridge.gguf.report import tensor_row, text_report

    g = open_gguf(path)
    rows = [tensor_row(t) for t in g.tensors]
    block = None
    for t in g.tensors[:12]:
        if t.n_blocks:
            block = describe_block(g, t.name, 0)
            describe_block(g, t.name, -1)
    text_report(g, rows, block)
    json.dumps({"metadata": g.metadata, "tensors": rows, "block": block}, ensure_ascii=False, allow_nan=True)
