"""The bugs the parser campaigns found (docs/fuzzing.md), each held by its minimized input: a tiny
valid file with the one field the campaign changed. Before the fixes each of these ended in a
traceback, an aborted process or an allocation sized by the hostile field."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tqbridge.parity.plugin.parsers.gguf_target import (
    parse_gguf_parts, write_gguf_parts, add_tiny_spm_vocab, write_tiny_gguf_model,
)
from tqbridge.parity.plugin.parsers.outcome import check_input

gguf = pytest.importorskip("gguf")


def _clean(target: str, data: bytes, *consumers: str) -> None:
    """Every consumer ends accepted or in its module's own one-line error."""
    for r in check_input(target, data, list(consumers) or None):
        assert r["kind"] in ("ok", "clean"), r


# ---------------------------------------------------------------------------------- state blobs


def _blob() -> bytes:
    from tqbridge.bridge.llama.state import seq_state, write_state

    rng = np.random.default_rng(0)
    k = rng.integers(0, 256, (3, 34), dtype=np.uint8)
    return write_state(seq_state([(8, k, 8, k.copy())], np.arange(3)))


@pytest.mark.parametrize("offset, value, message", [
    (12, 0xFFFFFFFF, "4294967295 cells"),             # cell_count: was np.empty(2**32) int32 = 16 GiB
    (20, 4000, "4000 sequence ids"),                  # a cell's n_seq_id, within the 4096 bound
])
def test_state_blob_hostile_count_is_refused_before_allocating(offset, value, message):
    from tqbridge.bridge.llama.state import StateError, parse_state

    blob = bytearray(_blob())
    struct.pack_into("<I", blob, offset, value)
    tracemalloc.start()
    try:
        with pytest.raises(StateError, match=message):
            parse_state(bytes(blob))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    _clean("state-blob", bytes(blob))


# ---------------------------------------------------------------------------------- GGUF


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    return write_tiny_gguf_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf").read_bytes()


def _edit(data: bytes, key=None, vtype=None, raw=None, tensor=None, dims=None, drop_tensor=None) -> bytes:
    p = parse_gguf_parts(data)
    for e in p.kvs:
        if e[0] == key:
            e[1], e[2] = vtype, raw
    for t in p.tensors:
        if t[0] == tensor:
            t[1] = dims
            n = 4 * int(np.prod(dims, dtype=np.int64))
            t[3] = (t[3] * (n // max(1, len(t[3])) + 1))[:n]
    p.tensors = [t for t in p.tensors if t[0] != drop_tensor]
    return write_gguf_parts(p)


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(data)
    return p


def _tokens(data: bytes, edit) -> bytes:
    """The tiny model's vocabulary with ``edit(list_of_token_bytes)`` applied."""
    p = parse_gguf_parts(data)
    for e in p.kvs:
        if e[0] == "tokenizer.ggml.tokens":
            n = struct.unpack_from("<Q", e[2], 4)[0]
            pos, toks = 12, []
            for _ in range(n):
                k = struct.unpack_from("<Q", e[2], pos)[0]
                toks.append(e[2][pos + 8:pos + 8 + k])
                pos += 8 + k
            edit(toks)
            e[2] = struct.pack("<IQ", 8, len(toks)) + b"".join(_string(t) for t in toks)
    return write_gguf_parts(p)


@pytest.mark.parametrize("dup", [b"a", b"a\x00x"], ids=["same bytes", "same C string"])
def test_duplicate_tokens_are_refused_before_llama_cpp_aborts(tiny, tmp_path, dup):
    """llama.cpp's vocabulary loader GGML_ASSERTs (SIGABRT) on duplicate tokens; it reads tokens as C
    strings, so "a\\0x" duplicates "a". convert --to mlx died with signal 6."""
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir
    from tqbridge.bridge.gguf.tokenizer import VocabularyError, check_vocabulary

    def edit(toks):
        toks[toks.index(b"<x0>")] = dup

    path = _write(tmp_path, _tokens(tiny, edit))
    with pytest.raises(VocabularyError, match="appears twice"):
        check_vocabulary(path)
    code = ("import sys\nfrom tqbridge.bridge.gguf.tokenizer import GGUFTokenizer, VocabularyError\n"
            "try:\n    GGUFTokenizer(sys.argv[1])\nexcept VocabularyError as e:\n    print('refused', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("refused"), (r.returncode, r.stderr[-500:])
    out = write_mlx_dir(path, tmp_path / "mlx")
    assert "appears twice" in (out / "config.json").read_text()
    _clean("gguf", path.read_bytes())


def test_sentencepiece_vocabulary_without_a_byte_token_is_refused(tmp_path):
    """llama.cpp's SentencePiece tokenizer throws an uncaught std::out_of_range (SIGABRT) on a character
    that is no token and has no byte token <0xXX> (llama_vocab::byte_to_token). Once SentencePiece
    vocabularies were exported, `convert --to mlx` of such a file (the fuzz target's tiny-llama-spm
    seed, one byte token's text changed) died with signal 6 checking the ids. Now check_vocabulary
    refuses it before llama.cpp tokenizes anything, and the directory says why."""
    from tqbridge.bridge.gguf.tokenizer import VocabularyError, check_vocabulary

    spm = write_tiny_gguf_model(tmp_path / "spm.gguf", vocab=add_tiny_spm_vocab).read_bytes()
    assert spm.count(b"<0x22>") == 1
    path = _write(tmp_path, spm.replace(b"<0x22>", b"<0y22>"))   # '"' is no token of this vocabulary
    with pytest.raises(VocabularyError, match="no token <0x22> for byte 0x22"):
        check_vocabulary(path)
    code = ("import sys\nfrom tqbridge.bridge.gguf.mlx_export import write_mlx_dir\n"
            "print((write_mlx_dir(sys.argv[1], sys.argv[2]) / 'config.json').read_text())\n")
    r = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "mlx")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "no token <0x22>" in r.stdout, (r.returncode, r.stderr[-500:])
    _clean("gguf", path.read_bytes())


def test_non_utf8_strings(tiny, tmp_path):
    """gguf-py decodes strings strictly: convert --to gguf-f32 raised UnicodeDecodeError (on any
    metadata string, general.architecture included), the tokenizer export too."""
    from tqbridge.bridge.gguf.f32 import write_f32_gguf
    from tqbridge.bridge.gguf.model import GGUFModelError, load_gguf_model
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir

    bad = _write(tmp_path, _edit(tiny, key="tokenizer.ggml.pre", vtype=8, raw=_string(b"\xffdefault")))
    with pytest.raises(GGUFModelError, match="not UTF-8"):
        write_f32_gguf(bad, tmp_path / "f32.gguf")
    assert "not UTF-8" in (write_mlx_dir(bad, tmp_path / "mlx") / "config.json").read_text()
    _clean("gguf", bad.read_bytes())
    arch = _write(tmp_path, _edit(tiny, key="general.architecture", vtype=8, raw=_string(b"ll\xffama")))
    with pytest.raises(GGUFModelError, match="general.architecture is missing or not a UTF-8 string"):
        write_f32_gguf(arch, tmp_path / "f32b.gguf")
    with pytest.raises(GGUFModelError, match="architecture None is not supported"):
        load_gguf_model(arch)
    _clean("gguf", arch.read_bytes())


@pytest.mark.parametrize("edit, message", [
    (dict(key="llama.block_count", vtype=4, raw=struct.pack("<I", 2**31)), "block_count 2147483648"),
    (dict(key="llama.embedding_length", vtype=8, raw=_string(b"32")), "must be an integer, got the string '32'"),
    (dict(key="llama.attention.head_count", vtype=4, raw=struct.pack("<I", 0)), "at least 1"),
    (dict(key="llama.attention.layer_norm_rms_epsilon", vtype=6, raw=struct.pack("<f", -np.inf)),
     "positive and finite"),
    (dict(key="general.architecture", vtype=9, raw=struct.pack("<IQ", 4, 0)), "architecture an array of 0"),
    (dict(tensor="token_embd.weight", dims=[32, 0]), "token_embd.weight is missing, empty"),
    (dict(drop_tensor="blk.0.ffn_norm.weight"), "Missing 1 parameters"),
])
def test_hostile_hyper_parameters_are_refused_before_a_model_is_built(tiny, tmp_path, edit, message):
    """Was: a model of 2**31 layers built before its weights were checked (hang), int() of a string
    (ValueError), n_embd // 0 (ZeroDivisionError), MLX's RMSNorm refusing eps (ValueError),
    'list' not hashable (TypeError), mlx-lm's ``assert vocab_size > 0`` (AssertionError), and
    mlx-lm's list of missing parameters spread over several lines."""
    from tqbridge.bridge.gguf.model import GGUFModelError, load_gguf_model

    path = _write(tmp_path, _edit(tiny, **edit))
    t0 = time.perf_counter()
    with pytest.raises(GGUFModelError, match=message) as e:
        load_gguf_model(path)
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 10
    _clean("gguf", path.read_bytes(), "load", "convert-mlx")


def test_empty_tensor_is_read_and_converted(tiny, tmp_path):
    """gguf-py cannot dequantize a tensor with a zero dimension (reshape error in read and convert)."""
    from tqbridge.bridge.gguf.f32 import write_f32_gguf
    from tqbridge.bridge.gguf.model import read_gguf

    p = parse_gguf_parts(tiny)
    p.tensors.append(["extra.weight", [0], 0, b""])
    path = _write(tmp_path, write_gguf_parts(p))
    assert read_gguf(path).tensors["extra.weight"].shape == (0,)
    assert read_gguf(write_f32_gguf(path, tmp_path / "f32.gguf")).tensors["extra.weight"].shape == (0,)


def test_empty_metadata_array_is_a_clear_refusal_of_convert_f32(tiny, tmp_path):
    """gguf-py's writer raises ValueError('Invalid GGUF metadata array') on an empty array."""
    from tqbridge.bridge.gguf.f32 import write_f32_gguf
    from tqbridge.bridge.gguf.model import GGUFModelError

    path = _write(tmp_path, _edit(tiny, key="tokenizer.ggml.merges", vtype=9, raw=struct.pack("<IQ", 8, 0)))
    with pytest.raises(GGUFModelError, match="empty or nested array"):
        write_f32_gguf(path, tmp_path / "f32.gguf")


@pytest.mark.parametrize("vtype, raw", [(9, struct.pack("<IQI", 4, 1, 257)), (8, _string(b"yarn"))],
                         ids=["array", "string"])
def test_token_id_of_another_type_is_a_tokenizer_export_error(tiny, tmp_path, vtype, raw):
    """tokenizer.ggml.bos_token_id as an array or a string: int() of it raised TypeError / ValueError
    in convert --to mlx; past that, llama.cpp refuses the file and llama-cpp-python's ValueError
    ('Failed to load model from file') escaped too. Now: no tokenizer files, the reason in config.json."""
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir
    from tqbridge.bridge.gguf.tokenizer import TokenizerExportError, hf_tokenizer_files

    path = _write(tmp_path, _edit(tiny, key="tokenizer.ggml.bos_token_id", vtype=vtype, raw=raw))
    with pytest.raises(TokenizerExportError, match="llama.cpp cannot load the vocabulary"):
        hf_tokenizer_files(path, "Hello")
    assert "llama.cpp cannot load" in (write_mlx_dir(path, tmp_path / "mlx") / "config.json").read_text()
    _clean("gguf", path.read_bytes())


# ---------------------------------------------------------------------------------- prompt caches


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> bytes:
    import mlx.core as mx
    from mlx_lm.models.cache import save_prompt_cache

    from tqbridge.metal.lm.cache import TQCache

    mx.random.seed(0)
    c = TQCache("q8_0", "turbo3")
    c.update_and_fetch(mx.random.normal((1, 2, 5, 64)), mx.random.normal((1, 2, 5, 64)))
    p = tmp_path_factory.mktemp("pc") / "c.safetensors"
    save_prompt_cache(str(p), [c], metadata={"kv": "q8_0/turbo3"})
    return p.read_bytes()


def _header_edit(data: bytes, edit) -> bytes:
    import json

    n = struct.unpack_from("<Q", data)[0]
    head = json.loads(data[8:8 + n])
    edit(head)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data[8 + n:]


def _rename(head, old, new):
    head[new] = head.pop(old)


@pytest.mark.parametrize("edit, message", [
    (lambda h: _rename(h, "0.0", "0.2147483648"), "list index 2147483648"),   # mlx-lm: 2**31 dicts
    (lambda h: h["__metadata__"].update({"1.0": "load_prompt_cache"}), "unknown cache class"),
    (lambda h: h["__metadata__"].update({"2.1.1": "bogus"}), "unknown type 'bogus'"),
    (lambda h: h["__metadata__"].update({"1.1": "TQCache"}), "2 cache classes for 1 layer states"),
    (lambda h: h.update({"0.0": {**h["0.0"], "shape": [1, 2, 5, 2**40]}}), "needs"),
])
def test_checked_prompt_cache_loader(saved, tmp_path, edit, message):
    from tqbridge.metal.lm.prompt_cache import PromptCacheError, load_prompt_cache

    p = tmp_path / "c.safetensors"
    p.write_bytes(_header_edit(saved, edit))
    tracemalloc.start()
    try:
        with pytest.raises(PromptCacheError, match=message):
            load_prompt_cache(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_checked_prompt_cache_loader_refuses_bad_bytes(saved, tmp_path):
    from tqbridge.metal.lm.prompt_cache import PromptCacheError, load_prompt_cache

    p = tmp_path / "c.safetensors"
    bad = bytearray(saved)
    bad[20] = 0xFF                                   # JSON header not UTF-8: mlx-lm's UnicodeDecodeError
    p.write_bytes(bytes(bad))
    with pytest.raises(PromptCacheError, match="not UTF-8 JSON"):
        load_prompt_cache(p)
    n = struct.unpack_from("<Q", saved)[0]
    import json

    head = json.loads(saved[8:8 + n])
    name = next(k for k, v in head["__metadata__"].items() if v == "string")[:-2] + ".0"
    a = head[head["__metadata__"][name]]["data_offsets"][0]
    bad = bytearray(saved)
    struct.pack_into("<i", bad, 8 + n + a, 0x110000)  # a character code past Unicode: chr() ValueError
    p.write_bytes(bytes(bad))
    with pytest.raises(PromptCacheError, match="outside Unicode"):
        load_prompt_cache(p)


def test_checked_prompt_cache_loader_round_trips(saved, tmp_path):
    from tqbridge.metal.lm.prompt_cache import load_prompt_cache
    from tqbridge.metal.lm.cache import TQCache

    p = tmp_path / "c.safetensors"
    p.write_bytes(saved)
    caches, meta = load_prompt_cache(p, return_metadata=True)
    assert meta == {"kv": "q8_0/turbo3"} and [type(c) for c in caches] == [TQCache]
    assert caches[0].offset == 5 and (caches[0].k_format, caches[0].v_format) == ("q8_0", "turbo3")


# ---------------------------------------------------------------------------------- --kv spellings


def test_long_spellings_give_short_one_line_errors():
    """A 1 MB spelling was echoed whole in the error message."""
    from tqbridge.bridge import FormatError, get_format
    from tqbridge.parity.harness.runtimes import KV

    for spec in ("q8_0" * 250_000, "turbo3@" + "g64" * 100_000):
        with pytest.raises(FormatError) as e:
            get_format(spec)
        assert len(str(e.value)) < 600 and "characters)" in str(e.value)
    with pytest.raises(ValueError) as e:
        KV.parse("a/b/" * 100_000)
    assert len(str(e.value)) < 200
