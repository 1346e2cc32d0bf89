"""The GGUF file's tokenizer, as llama.cpp runs it (llama-cpp-python, vocabulary only).

Both runtimes take token ids from here, so they always see the same ids. ``add_bos`` follows the
GGUF's ``tokenizer.ggml.add_bos_token`` (llama.cpp adds BOS only where the vocabulary asks for it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class VocabularyError(ValueError):
    """The GGUF's vocabulary is one llama.cpp's loader would abort the process on (one line says why)."""


def check_vocabulary(gguf_path: "str | os.PathLike[str]") -> None:
    """Refuse, with :class:`VocabularyError`, files that make llama.cpp's vocabulary loader abort the
    whole process (``GGML_ASSERT``) or read past an array instead of reporting an error: a malformed
    GGUF (:func:`tqbridge.bridge.gguf.io.validate`), duplicate tokens (src/llama-vocab.cpp asserts
    ``id_to_token.size() == token_to_id.size()``), token types or scores that are not one number per
    token, tokens or merges that are not strings; and SentencePiece vocabularies missing a byte token,
    whose tokenizer then aborts on a text that needs the byte (an uncaught ``std::out_of_range`` from
    ``llama_vocab::byte_to_token``). A walk of the header, no gguf-py (fast on large vocabularies)."""
    from .io import GGUFError, validate

    try:
        g = validate(gguf_path)
    except GGUFError as e:
        raise VocabularyError(str(e)) from None
    name = Path(gguf_path).name
    types = g.value_types
    STRING, ARRAY, INT32, UINT32, FLOAT32 = 8, 9, 5, 4, 6
    tok = types.get("tokenizer.ggml.tokens")
    if tok is None:
        raise VocabularyError(f"{name}: no vocabulary (tokenizer.ggml.tokens is missing)")
    if tok[:2] != (ARRAY, STRING):
        raise VocabularyError(f"{name}: tokenizer.ggml.tokens is not an array of strings")
    n = tok[2]
    if n == 0:
        raise VocabularyError(f"{name}: the vocabulary is empty")
    if g.duplicate_token is not None:
        raise VocabularyError(f"{name}: token {g.duplicate_token[:40]!r} appears twice in the vocabulary "
                              "(llama.cpp aborts on it)")
    if g.tokenizer_model == "llama" and g.missing_byte is not None:
        b = g.missing_byte
        raise VocabularyError(f"{name}: the SentencePiece vocabulary has no token <0x{b:02X}> for byte 0x{b:02X} "
                              "(llama.cpp aborts on text that needs it)")
    for key, kinds, what in (("tokenizer.ggml.token_type", (INT32, UINT32), "int32"),
                             ("tokenizer.ggml.scores", (FLOAT32,), "float32")):
        t = types.get(key)
        if t is None:
            continue
        if t[0] != ARRAY or t[1] not in kinds:
            raise VocabularyError(f"{name}: {key} is not an array of {what}")
        if t[2] != n:
            raise VocabularyError(f"{name}: {key} has {t[2]} entries for {n} tokens")
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        if key in types and types[key][0] != STRING:
            raise VocabularyError(f"{name}: {key} is not a string")
    if "tokenizer.ggml.merges" in types and types["tokenizer.ggml.merges"][:2] != (ARRAY, STRING):
        raise VocabularyError(f"{name}: tokenizer.ggml.merges is not an array of strings")


class GGUFTokenizer:
    def __init__(self, gguf_path: "str | os.PathLike[str]"):
        from ..llama.compat import ensure_compatible

        ensure_compatible()
        from llama_cpp import Llama

        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        check_vocabulary(path)
        self._llm = Llama(model_path=str(path), vocab_only=True, verbose=False)

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text``; ``special=True`` parses special-token text (chat templates) as
        those tokens, ``False`` (default) tokenizes it as plain text."""
        return [int(t) for t in self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)]

    def decode_bytes(self, ids: "list[int]") -> bytes:
        return self._llm.detokenize(list(ids))

    def decode(self, ids: "list[int]") -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_table(self) -> "tuple[list[bytes], np.ndarray, list[int]]":
        """llama.cpp's view of every token: its text (bytes), its score (float32) and its attributes
        (``LLAMA_TOKEN_ATTR_*`` bits: the GGUF's token types after llama.cpp's own overrides; it makes
        tokens whose text it knows as an end of generation, such as ``</s>``, control tokens)."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        n = self.n_vocab
        texts = [bytes(llama_cpp.llama_vocab_get_text(vocab, i) or b"") for i in range(n)]
        scores = np.array([llama_cpp.llama_vocab_get_score(vocab, i) for i in range(n)], dtype=np.float32)
        return texts, scores, [int(llama_cpp.llama_vocab_get_attr(vocab, i)) for i in range(n)]

    @property
    def eos_token_ids(self) -> set[int]:
        return {self.eos_id}

    @property
    def n_vocab(self) -> int:
        return int(self._llm.n_vocab())

    @property
    def eos_id(self) -> int:
        return int(self._llm.token_eos())

    def close(self) -> None:
        self._llm.close()



class ChatTokenizer(GGUFTokenizer):
    """llama.cpp's own tokenizer for a GGUF file (llama-cpp-python, vocabulary only); special-token
    text (chat templates) becomes those tokens. ``tqbridge generate`` and ``tqbridge quality`` encode
    with it (re-exported as ``tqbridge.parity.quality.GGUFTokenizer``)."""

    def __init__(self, path: "str | os.PathLike[str]"):
        try:
            super().__init__(path)
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError("the GGUF tokenizer needs llama-cpp-python: pip install 'tqbridge[llama]'") from e

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return super().encode(text, add_bos=add_bos, special=special)


# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) -> whether digits are split one by one before
# GPT-2's byte-level regex: the byte-level BPE vocabularies (tokenizer.ggml.model "gpt2") exported.
_BYTE_LEVEL_PRE = {"smollm": True, "gpt2": False, "default": False}
# tokenizer.ggml.model "llama" is SentencePiece's BPE (llama.cpp's llm_tokenizer_spm), which reads no
# pre-tokenizer name; the files that say "default" are exported.
_SPM_PRE = ("default",)

# llama.cpp's token attributes (enum llama_token_attr)
_UNKNOWN, _NORMAL, _CONTROL, _USER_DEFINED = 1 << 0, 1 << 2, 1 << 3, 1 << 4
_LSTRIP, _RSTRIP, _SINGLE_WORD = 1 << 7, 1 << 8, 1 << 9

# The metadata the export reads (gguf_io.read_values: no gguf-py walk of the vocabulary).
_TOKENIZER_KEYS = tuple(f"tokenizer.ggml.{k}" for k in (
    "model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
    "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token", "add_space_prefix",
)) + ("tokenizer.chat_template",)

# Text every export is checked on besides the caller's sample: leading, trailing and long runs of
# spaces, newlines and tabs (longer than Gemma's 31-character whitespace tokens), CRLF, accents and a
# combining mark, CJK, emoji with a modifier and a joiner, right-to-left scripts, digits, a character
# few vocabularies hold (U+20000: byte fallback in Gemma 3's), a private-use and a C0 control
# character, a literal U+2581, a byte token's text, and the special-token text of several model
# families (special in some vocabularies, plain text in others; checked both parsed and not).
EDGE_TEXT = (
    "   three leading spaces, then two  and one \n\n\n\ttab\t\t end  \r\n" + " " * 40 + "x" + "\n" * 40
    + "\t" * 33 + "y  \n"
    + "h\u00e9llo w\u00f6rld \u2014 na\u00efve caf\u00e9, e\u0301, \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, "
    "\U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467, "
    "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd, 1234567890 3.14159, "
    "\U00020000\U0002a6d6 \ue000 \x01\x7f \u2581x\u2581 <0x41> "
    "<s></s><unk><pad><mask><bos><eos> <|endoftext|><|im_start|>user\nhi<|im_end|>\n"
    "<start_of_turn>model\nok<end_of_turn>\n<unused5> [multimodal] <b>bold</b> </div> trailing  "
)


class TokenizerExportError(ValueError):
    """The GGUF's tokenizer cannot be written as Hugging Face tokenizer files (one line says why)."""


def _refuse_kind(kind, pre) -> None:
    if kind == "llama" and pre in _SPM_PRE:
        return
    if kind != "gpt2" or pre not in _BYTE_LEVEL_PRE:
        raise TokenizerExportError(f"tokenizer {str(kind)[:40]!r} with pre-tokenizer {str(pre)[:40]!r} is not "
                                   f"exported (supported: byte-level BPE with {', '.join(_BYTE_LEVEL_PRE)}; "
                                   f"SentencePiece 'llama' with {', '.join(_SPM_PRE)})")


def _byte_level_bpe(toks: list[str], merges, pre: str):
    """llama.cpp's byte-level BPE (tokenizer.ggml.model "gpt2") as a tokenizers ``Tokenizer``, without
    its added tokens (:func:`_add_special_text`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(m.split(" ", 1)) for m in merges]
    if any(len(m) != 2 or not all(m) for m in merges):
        raise TokenizerExportError("a BPE merge is not two tokens separated by a space")
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                        if _BYTE_LEVEL_PRE[pre] else byte_level)
    tk.decoder = decoders.ByteLevel()
    return tk


def spm_merges(toks: list[str], scores) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, ranked for the tokenizers library's BPE: by the
    token's score, highest first (then by token id, then by where the split falls).

    llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm) starts from the text's UTF-8 characters
    and, while it can, merges the adjacent pair whose concatenation is a token with the highest score
    (ties: the leftmost pair). The tokenizers library's BPE merges the adjacent pair of lowest rank
    (ties: the leftmost); with one rank per (left, right) split, ordered by the score of left + right,
    it makes the same choices wherever the competing tokens' scores differ."""
    vocab = {t: i for i, t in enumerate(toks)}
    ranked = []
    for i, piece in enumerate(toks):
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, k, left, right))
    ranked.sort(key=lambda m: m[:3])
    return [(m[3], m[4]) for m in ranked]


def _overlapping_texts(texts: list[str]) -> "tuple[str, str] | None":
    """Two token texts where a proper suffix of the first is a proper prefix of the second, other than
    two runs of one character; None where there are none.

    llama.cpp splits special-token text out longest token first, each at its leftmost occurrences;
    the tokenizers library takes, left to right, the longest token starting at the leftmost match.
    The two agree unless two occurrences can overlap without one holding the other (runs of one
    character are split alike by both: the longest run that fits, from the left)."""
    prefixes: dict[str, list[str]] = {}
    for t in texts:
        for k in range(1, len(t)):
            prefixes.setdefault(t[:k], []).append(t)
    for a in texts:
        for k in range(1, len(a)):
            for b in prefixes.get(a[k:], ()):
                if not (len(set(a)) == 1 and set(a) == set(b)):
                    return a, b
    return None


def _add_special_text(tk, toks: list[str], attrs: list[int]) -> None:
    """The tokens llama.cpp splits out of the text before its tokenizer runs, as added tokens of ``tk``.

    llama.cpp splits out user-defined tokens always, control and unknown ones when special text is
    parsed (``special=True``), by their text as it is (src/llama-vocab.cpp, tokenizer_st_partition).
    Here: control and unknown tokens as special added tokens (Hugging Face's ``encode_special_tokens``
    leaves those as text, as ``special=False`` does), user-defined ones as added tokens that are not
    special; none normalized (matched on the text as it is). Refused: tokens with one of llama.cpp's
    whitespace rules (LSTRIP / RSTRIP / SINGLE_WORD: not rebuilt), and texts that overlap
    (:func:`_overlapping_texts`)."""
    from tokenizers import AddedToken

    split = [(t, a) for t, a in zip(toks, attrs) if t and a & (_UNKNOWN | _CONTROL | _USER_DEFINED)]
    odd = next((t for t, a in split if a & (_LSTRIP | _RSTRIP | _SINGLE_WORD)), None)
    if odd is not None:
        raise TokenizerExportError(f"llama.cpp gives token {odd[:40]!r} a whitespace rule (lstrip, rstrip or "
                                   "single word), which is not exported")
    clash = _overlapping_texts([t for t, _ in split])
    if clash is not None:
        raise TokenizerExportError(f"special tokens {clash[0][:40]!r} and {clash[1][:40]!r} overlap: llama.cpp "
                                   "and the tokenizers library would split such text differently")
    special = [a & (_UNKNOWN | _CONTROL) != 0 for _, a in split]
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for (t, _), sp in zip(split, special) if not sp])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for (t, _), sp in zip(split, special) if sp])


def _sentencepiece_bpe(toks: list[str], scores, attrs: list[int], add_space_prefix: bool, unk: "str | None"):
    """llama.cpp's SentencePiece tokenizer (tokenizer.ggml.model "llama") as a tokenizers ``Tokenizer``,
    without its added tokens (:func:`_add_special_text`).

    llama.cpp, on each piece of text between special tokens: a space before it where
    ``add_space_prefix``, spaces become U+2581, and SentencePiece's BPE runs on the whole piece (no
    splitting into words; :func:`spm_merges`); a character that is no token becomes the tokens of its
    UTF-8 bytes, <0xXX>. Here: a Prepend/Replace normalizer, no pre-tokenizer, a BPE model with
    :func:`spm_merges` and byte fallback; the decoder mlx-lm recognises as SentencePiece's (it then
    streams text with its SPM detokenizer)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(toks)}
    # llama.cpp's text starts as characters, a token or not; the tokenizers library's BPE turns a
    # character that is no token into byte tokens before merging. A token one of whose splits joins such
    # a character would be reached by llama.cpp only.
    strays = set().union(*toks) - vocab.keys() - {" "}   # a space never reaches BPE (it is U+2581 there)
    for t, a in zip(toks, attrs):
        if len(t) < 2 or a & _USER_DEFINED or not strays.intersection(t):   # user-defined: split out first
            continue
        for k in range(1, len(t)):
            sides = (t[:k], t[k:])
            if all(x in vocab or len(x) == 1 for x in sides) and not all(x in vocab for x in sides):
                raise TokenizerExportError(
                    f"token {t[:40]!r} joins {sides[0][:40]!r} and {sides[1][:40]!r}, one a character that is "
                    "no token: llama.cpp can merge them, the tokenizers library cannot")
    tk = Tokenizer(models.BPE(vocab, spm_merges(toks, scores), unk_token=unk, byte_fallback=True))
    replace = normalizers.Replace(" ", "\u2581")
    tk.normalizer = normalizers.Sequence([normalizers.Prepend(" "), replace]) if add_space_prefix else replace
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] if add_space_prefix else steps)
    return tk


def _check_ids(tk, ref: GGUFTokenizer, texts: dict[str, str]) -> None:
    """The rebuilt tokenizer's ids equal llama.cpp's (``ref``) on every text, BOS/EOS as the vocabulary
    adds them, special-token text parsed as those tokens (Hugging Face's default, llama.cpp's
    ``special=True``) and as plain text (``encode_special_tokens``, ``special=False``);
    :class:`TokenizerExportError` at the first difference."""
    try:
        for name, text in texts.items():
            for special in (True, False):
                tk.encode_special_tokens = not special
                ours, want = tk.encode(text).ids, ref.encode(text, add_bos=True, special=special)
                if ours != want:
                    first = next((i for i, (a, b) in enumerate(zip(ours, want)) if a != b),
                                 min(len(ours), len(want)))
                    raise TokenizerExportError(
                        f"rebuilt tokenizer differs from llama.cpp's at token {first} of the {name} "
                        f"(special-token text {'parsed' if special else 'as plain text'})")
    finally:
        tk.encode_special_tokens = False


def hf_tokenizer_files(gguf_path: "str | os.PathLike[str]", sample: str,
                       metadata: "dict | None" = None) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json`` contents reproducing the GGUF's tokenizer:
    byte-level BPE (``tokenizer.ggml.model`` "gpt2", SmolLM2's) or SentencePiece (``"llama"``, Gemma 3's).

    Before anything is returned the vocabulary read from the file must be llama.cpp's (every token's
    text and, for SentencePiece, score), and the rebuilt tokenizer's ids must be llama.cpp's
    (:func:`_check_ids`) on ``sample``, on :data:`EDGE_TEXT` and on the empty text. Raises
    :class:`TokenizerExportError` for vocabularies we do not rebuild, or at the first difference.
    ``metadata``: the file's metadata where the caller has read it already (``read_gguf``'s): a
    tokenizer kind we do not rebuild is then refused before the vocabulary is read.
    """
    from .io import GGUFError, read_values

    meta = metadata or {}
    kind = meta.get("tokenizer.ggml.model")
    if isinstance(kind, str):   # anything else (a missing or unreadable kind) below
        _refuse_kind(kind, meta.get("tokenizer.ggml.pre", "default"))
    try:
        check_vocabulary(gguf_path)
        v = read_values(gguf_path, _TOKENIZER_KEYS)
    except (GGUFError, VocabularyError) as e:
        raise TokenizerExportError(str(e)) from None
    kind, pre = v.get("tokenizer.ggml.model"), v.get("tokenizer.ggml.pre", "default")
    _refuse_kind(kind, pre)
    spm = kind == "llama"
    toks = [t.split("\0", 1)[0] for t in v["tokenizer.ggml.tokens"]]   # llama.cpp reads C strings
    try:
        ref = GGUFTokenizer(gguf_path)
    except (VocabularyError, ValueError) as e:   # llama-cpp-python: "Failed to load model from file"
        raise TokenizerExportError(f"llama.cpp cannot load the vocabulary: {e}") from None
    try:
        return _files(v, toks, spm, pre, ref, sample)
    finally:
        ref.close()


def _files(v: dict, toks: list[str], spm: bool, pre: str, ref: GGUFTokenizer, sample: str) -> dict[str, str]:
    """The files of :func:`hf_tokenizer_files`: ``v`` the file's tokenizer metadata, ``toks`` its tokens
    as llama.cpp reads them, ``ref`` llama.cpp's tokenizer of the same file.

    First the vocabulary read here must be llama.cpp's, token for token: texts and, for SentencePiece,
    scores (every token: what the sample below does not reach included); then the tokenizer built from
    it must give llama.cpp's ids (:func:`_check_ids`)."""
    import json

    from tokenizers import processors

    texts, ref_scores, attrs = ref.token_table()
    if len(texts) != len(toks):
        raise TokenizerExportError(f"llama.cpp reads {len(texts)} tokens where the file lists {len(toks)}")
    odd = next((i for i, (a, b) in enumerate(zip(toks, texts)) if a.encode("utf-8") != b), None)
    if odd is not None:
        raise TokenizerExportError(f"token {odd} reads as {toks[odd][:40]!r} here, "
                                   f"as {texts[odd].decode('utf-8', 'replace')[:40]!r} in llama.cpp")
    scores = v.get("tokenizer.ggml.scores")
    if spm:
        if scores is None:
            raise TokenizerExportError("a SentencePiece vocabulary without tokenizer.ggml.scores is not exported")
        if not np.isfinite(scores).all():
            raise TokenizerExportError("tokenizer.ggml.scores holds a value that is not a finite number")
        odd = next(iter(np.flatnonzero(np.asarray(scores, np.float32) != ref_scores)), None)
        if odd is not None:
            raise TokenizerExportError(f"token {int(odd)} {toks[odd][:40]!r} has score {float(scores[odd])} here, "
                                       f"{float(ref_scores[odd])} in llama.cpp")

    def tok(key):
        i = v.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(i, bool) or not isinstance(i, int):   # absent, or not an integer: no such token
            return None
        return toks[i] if 0 <= i < len(toks) else None

    def flag(key, default: bool) -> bool:
        x = v.get(f"tokenizer.ggml.{key}")
        return bool(x) if isinstance(x, (bool, int)) else default   # absent or not a number: the default

    if spm:   # llama.cpp's defaults for a SentencePiece vocabulary: BOS and a space prefix
        tk = _sentencepiece_bpe(toks, scores, attrs, flag("add_space_prefix", True), tok("unknown"))
    else:
        tk = _byte_level_bpe(toks, v.get("tokenizer.ggml.merges", []), pre)
    _add_special_text(tk, toks, attrs)
    bos, eos = tok("bos"), tok("eos")
    add_bos, add_eos = flag("add_bos_token", spm), flag("add_eos_token", False)
    template = ([bos] if add_bos and bos is not None else []) + ["$A"] + ([eos] if add_eos and eos is not None else [])
    if len(template) > 1:
        specials = {t: toks.index(t) for t in template if t != "$A"}
        try:
            tk.post_processor = processors.TemplateProcessing(single=template, special_tokens=list(specials.items()))
        except Exception as e:  # noqa: BLE001 - the tokenizers library rejects some token texts here
            raise TokenizerExportError(f"BOS/EOS tokens {template} do not make a tokenizers template: {e}") from None
    _check_ids(tk, ref, {"sample": sample, "edge cases": EDGE_TEXT, "empty text": ""})
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos, "add_eos_token": add_eos,
              "bos_token": bos, "eos_token": eos, "unk_token": tok("unknown"), "pad_token": tok("padding"),
              "clean_up_tokenization_spaces": False}
    template = v.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        config["chat_template"] = template
    return {"tokenizer.json": tk.to_str(), "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
