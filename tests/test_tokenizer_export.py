"""The tokenizer export (``tqbridge.bridge.gguf.tokenizer.hf_tokenizer_files``, what ``convert --to mlx``
writes): SentencePiece vocabularies (Gemma 3's kind) rebuilt for the tokenizers library give
llama.cpp's ids, and a wrong vocabulary or a wrong rebuild is refused before anything is written.

A tiny SentencePiece model written here (llama.cpp loads it) runs everywhere; the tests on Gemma 3
270M itself are marked ``model``. Planted bugs: a wrong score or piece between the file and the
builder (refused by the comparison with llama.cpp's own vocabulary), a wrong merge order in the
builder (refused by the ids).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the tokenizers library is not installed (pip install 'tqbridge[lm]')")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'tqbridge[llama]')")

import tqbridge.bridge.gguf.io as gguf_io  # noqa: E402
import tqbridge.bridge.gguf.tokenizer as tokenizer  # noqa: E402
from tqbridge.bridge.gguf.io import GGUFError, read_values  # noqa: E402
from tqbridge.bridge.gguf.models import ModelUnavailable, gemma3_path  # noqa: E402
from tqbridge.bridge.gguf.tokenizer import (  # noqa: E402
    EDGE_TEXT, ChatTokenizer, GGUFTokenizer, TokenizerExportError, hf_tokenizer_files,
)
from tqbridge.parity.plugin.parsers.gguf_target import add_tiny_spm_vocab, write_tiny_gguf_model  # noqa: E402

# ---- a tiny SentencePiece model (gguf_fixtures.add_tiny_spm_vocab: Gemma 3's layout) ------------------

TINY_TEXT = "hello world, the cat sat.\nabc  hello<b>the</b> <start_of_turn>cat\n\u2581hello"


def _spm_vocab(add_space_prefix: bool, add_eos: bool = False, extra=()):
    return lambda w, n: add_tiny_spm_vocab(w, n, add_space_prefix, add_eos, extra)


def _tiny_spm(tmp_path, add_space_prefix: bool = False, add_eos: bool = False):
    return write_tiny_gguf_model(tmp_path / "spm.gguf", vocab=_spm_vocab(add_space_prefix, add_eos))


def _plant(monkeypatch, change) -> None:
    """``change(values)`` edits what the export reads from the file (llama.cpp still reads the file)."""
    real = gguf_io.read_values

    def planted(path, keys):
        values = real(path, keys)
        change(values)
        return values

    monkeypatch.setattr(gguf_io, "read_values", planted)


def _set_score(piece: str, score: float):
    def change(v):
        v["tokenizer.ggml.scores"][v["tokenizer.ggml.tokens"].index(piece)] = score
    return change


def _rename(piece: str, new: str):
    def change(v):
        toks = v["tokenizer.ggml.tokens"]
        toks[toks.index(piece)] = new
    return change


def _swap_merges(a: tuple[str, str], b: tuple[str, str]):
    """spm_merges with the ranks of merges ``a`` and ``b`` exchanged (a wrong merge order)."""
    real = tokenizer.spm_merges

    def swapped(toks, scores):
        merges = real(toks, scores)
        i, j = merges.index(a), merges.index(b)
        merges[i], merges[j] = merges[j], merges[i]
        return merges
    return swapped


@pytest.mark.parametrize("add_space_prefix,add_eos", [(False, False), (True, False), (False, True)])
def test_tiny_sentencepiece_gives_llama_cpp_ids(tmp_path, add_space_prefix, add_eos):
    """The written tokenizer.json (read back from its text) encodes as llama.cpp does, special-token text
    parsed and not, with and without llama.cpp's space prefix and EOS; merges by score, user-defined
    tokens split out always, control ones only when parsed; decoding gives the text back."""
    from tokenizers import Tokenizer

    path = _tiny_spm(tmp_path, add_space_prefix, add_eos)
    files = hf_tokenizer_files(path, TINY_TEXT)
    tk = Tokenizer.from_str(files["tokenizer.json"])
    ref = GGUFTokenizer(path)
    for text in (TINY_TEXT, EDGE_TEXT, "abc", " hello", ""):
        for special in (True, False):
            tk.encode_special_tokens = not special
            assert tk.encode(text).ids == ref.encode(text, special=special), (text, special)
    tk.encode_special_tokens = False
    pieces = tk.encode("abc hello world").tokens
    space = ["\u2581"] if add_space_prefix else []
    assert pieces == ["<s>"] + space + ["ab", "c", "\u2581hello", "\u2581world"] + (["</s>"] if add_eos else [])
    plain = "hello world, the cat sat.\nabc  hello<b>the</b> \u00e9\n"
    if not add_space_prefix:   # with it, text after a special token decodes with the prefix's space
        assert tk.decode(tk.encode(plain).ids, skip_special_tokens=True) == plain
    cfg = json.loads(files["tokenizer_config.json"])
    assert (cfg["add_bos_token"], cfg["add_eos_token"], cfg["bos_token"], cfg["eos_token"], cfg["unk_token"]) == \
        (True, add_eos, "<s>", "</s>", "<unk>")


def test_tiny_sentencepiece_directory_loads_in_mlx_lm(tmp_path, capsys):
    """`convert --to mlx` of a SentencePiece model: mlx_lm.load takes the directory, its tokenizer gives
    llama.cpp's ids (special-token text parsed, as mlx-lm's prompts are) and streams text with
    mlx-lm's SentencePiece detokenizer."""
    mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install 'tqbridge[lm]')")
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer

    from tqbridge.tools.cli import main

    path = _tiny_spm(tmp_path)
    out = tmp_path / "spm-mlx"
    assert main(["convert", str(path), "--to", "mlx", str(out), "--dequantize"]) == 0
    assert "tokenizer: tokenizer.json rebuilt from the GGUF (SentencePiece BPE)" in capsys.readouterr().out
    _, tok = mlx_lm.load(str(out))
    ref = ChatTokenizer(path)
    for text in (TINY_TEXT, EDGE_TEXT):
        assert tok.encode(text) == ref.encode(text)
    assert isinstance(tok.detokenizer, SPMStreamingDetokenizer)


@pytest.mark.parametrize("plant,match", [
    (_set_score("llo", -0.5), r"token \d+ 'llo' has score -0.5 here, -5.0 in llama.cpp"),
    (_rename("\u2581cat", "\u2581cot"), r"token \d+ reads as '\u2581cot' here, as '\u2581cat' in llama.cpp"),
], ids=["score", "piece"])
def test_tiny_wrong_vocabulary_is_refused(tmp_path, monkeypatch, plant, match):
    """A score or piece that differs from llama.cpp's reading of the file is refused, whether or not the
    sample would show it ('llo' at -0.5 changes no id of the sample)."""
    path = _tiny_spm(tmp_path)
    _plant(monkeypatch, plant)
    with pytest.raises(TokenizerExportError, match=match):
        hf_tokenizer_files(path, TINY_TEXT)


def test_tiny_wrong_merge_order_is_refused_and_nothing_written(tmp_path, monkeypatch, capsys):
    """A builder bug (two merges' ranks exchanged: 'abc' becomes [a, bc]) is caught by the ids; `convert`
    then writes the model without tokenizer files and says why in one line."""
    from tqbridge.tools.cli import main

    path = _tiny_spm(tmp_path)
    monkeypatch.setattr(tokenizer, "spm_merges", _swap_merges(("a", "b"), ("b", "c")))
    with pytest.raises(TokenizerExportError, match=r"differs from llama.cpp's at token \d+ of the sample"):
        hf_tokenizer_files(path, TINY_TEXT)
    out = tmp_path / "spm-mlx"
    assert main(["convert", str(path), "--to", "mlx", str(out), "--dequantize"]) == 0
    line = [s for s in capsys.readouterr().out.splitlines() if "tokenizer:" in s]
    assert len(line) == 1 and "no tokenizer files: rebuilt tokenizer differs from llama.cpp's" in line[0]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm-mlx", "spm.gguf"]   # no temporary left


def test_overlapping_special_texts_are_found():
    """llama.cpp (longest token first) and the tokenizers library (leftmost match) split overlapping
    special-token texts differently; runs of one character they split alike."""
    assert tokenizer._overlapping_texts(["<a>", "<b>", "\n", "\n\n", "\n\n\n", "  ", "   "]) is None
    assert tokenizer._overlapping_texts(["<ab", "b>"]) == ("<ab", "b>")
    assert tokenizer._overlapping_texts(["[x]", "]]"]) == ("[x]", "]]")


def test_overlapping_special_tokens_are_refused(tmp_path):
    path = write_tiny_gguf_model(tmp_path / "overlap.gguf", vocab=_spm_vocab(False, extra=[("<ab", 4), ("b>", 4)]))
    with pytest.raises(TokenizerExportError, match="special tokens '<ab' and 'b>' overlap"):
        hf_tokenizer_files(path, TINY_TEXT)


# ---- gguf_io.read_values: the vocabulary without gguf-py ---------------------------------------------

def test_read_values_reads_what_gguf_py_wrote(tmp_path):
    import gguf

    path = tmp_path / "values.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int32("t.i32", -7)
    w.add_uint64("t.u64", 2 ** 40)
    w.add_float32("t.f32", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u2581")
    w.add_array("t.ints", [3, -1, 2])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strs", ["a", "", "\u65e5\u672c"])
    w.add_key_value("t.bad", b"\xffnot utf-8", gguf.GGUFValueType.STRING)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
    keys = ["t.u8", "t.i32", "t.u64", "t.f32", "t.bool", "t.str", "t.ints", "t.floats", "t.strs", "t.absent"]
    v = read_values(path, keys)
    assert set(v) == set(keys) - {"t.absent"}
    assert (v["t.u8"], v["t.i32"], v["t.u64"], v["t.bool"], v["t.str"]) == (200, -7, 2 ** 40, True, "h\u00e9llo \u2581")
    assert v["t.f32"] == float(np.float32(0.1))
    assert v["t.ints"].tolist() == [3, -1, 2] and v["t.floats"].dtype == np.float32
    assert v["t.floats"].tolist() == [0.5, -1.25] and v["t.strs"] == ["a", "", "\u65e5\u672c"]
    with pytest.raises(GGUFError, match="'t.bad' holds a string that is not UTF-8"):
        read_values(path, ["t.bad"])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(GGUFError, match="truncated"):
        read_values(cut, ["t.bad"])


# ---- Gemma 3 270M -------------------------------------------------------------------------------

def _gemma():
    try:
        return gemma3_path()
    except ModelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def gemma_files():
    from tqbridge.bridge.evaluation_text import evaluation_text

    path = _gemma()
    return path, hf_tokenizer_files(path, evaluation_text()[0][:20000])


@pytest.mark.model
def test_gemma3_export_gives_llama_cpp_ids_on_the_whole_text(gemma_files):
    """Past the 20,000 characters the export checks: the whole evaluation text (~465,000 characters),
    special-token text parsed and not."""
    from tokenizers import Tokenizer

    from tqbridge.bridge.evaluation_text import evaluation_text

    path, files = gemma_files
    tk = Tokenizer.from_str(files["tokenizer.json"])
    ref = GGUFTokenizer(path)
    text = evaluation_text()[0]
    for special in (True, False):
        tk.encode_special_tokens = not special
        ours, want = tk.encode(text).ids, ref.encode(text, special=special)
        print(f"gemma3, special text {'parsed' if special else 'plain'}: {len(text):,} characters, "
              f"{len(want):,} tokens, equal: {ours == want}")
        assert ours == want
    cfg = json.loads(files["tokenizer_config.json"])
    assert (cfg["bos_token"], cfg["eos_token"], cfg["add_bos_token"]) == ("<bos>", "<eos>", True)


@pytest.mark.model
@pytest.mark.parametrize("plant,match", [
    # invisible to the sample (no id of it changes), caught by the vocabulary comparison
    (_set_score("\u2581the", -1e6), r"token 506 '\u2581the' has score -1000000.0 here, -12.0 in llama.cpp"),
    (_rename("\u2581statement", "\u2581statemant"), r"token 5456 reads as '\u2581statemant' here"),
], ids=["score", "piece"])
def test_gemma3_wrong_vocabulary_is_refused(monkeypatch, plant, match):
    path = _gemma()
    _plant(monkeypatch, plant)
    with pytest.raises(TokenizerExportError, match=match):
        hf_tokenizer_files(path, "The statement")


@pytest.mark.model
def test_gemma3_lost_merges_are_refused(monkeypatch):
    """A builder that loses the merges making one token ('\u2581the', the sample's second token): the ids
    differ there. (Exchanging two merges of one word, as the tiny test does, leaves most of Gemma's
    words as they were: the word still ends as one token.)"""
    path = _gemma()
    real = tokenizer.spm_merges
    monkeypatch.setattr(tokenizer, "spm_merges",
                        lambda toks, scores: [m for m in real(toks, scores) if "".join(m) != "\u2581the"])
    with pytest.raises(TokenizerExportError, match="differs from llama.cpp's at token 2 of the sample"):
        hf_tokenizer_files(path, "Then the statement")
