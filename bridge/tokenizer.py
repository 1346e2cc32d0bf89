"""The GGUF file's tokenizer, as llama.cpp runs it (llama-cpp-python, vocabulary only).

Both runtimes take token ids from here, so they always see the same ids. ``add_bos`` follows the
GGUF's ``tokenizer.ggml.add_bos_token`` (llama.cpp adds BOS only where the vocabulary asks for it).
"""

from __future__ import annotations

import os
from pathlib import Path


class VocabularyError(ValueError):
    """The GGUF's vocabulary is one llama.cpp's loader would abort the process on (one line says why)."""


def check_vocabulary(gguf_path: "str | os.PathLike[str]") -> None:
    """Refuse, with :class:`VocabularyError`, files that make llama.cpp's vocabulary loader abort the
    whole process (``GGML_ASSERT``) or read past an array instead of reporting an error: a malformed
    GGUF (:func:`tqbridge.bridge.gguf_io.validate`), duplicate tokens (src/llama-vocab.cpp asserts
    ``id_to_token.size() == token_to_id.size()``), token types or scores that are not one number per
    token, tokens or merges that are not strings. A walk of the header, no gguf-py (fast on large
    vocabularies)."""
    from .gguf_io import GGUFError, validate

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
        from .llama_compat import ensure_compatible

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
# GPT-2's byte-level regex. Only byte-level BPE vocabularies are exported; every export is checked
# against llama.cpp on a sample text before it is written.
_BYTE_LEVEL_PRE = {"smollm": True, "gpt2": False, "default": False}


class TokenizerExportError(ValueError):
    """The GGUF's tokenizer cannot be written as Hugging Face tokenizer files (one line says why)."""


def _refuse_kind(kind, pre) -> None:
    if kind != "gpt2" or pre not in _BYTE_LEVEL_PRE:
        raise TokenizerExportError(f"tokenizer {str(kind)[:40]!r} with pre-tokenizer {str(pre)[:40]!r} is not "
                                   f"exported (supported: byte-level BPE with {', '.join(_BYTE_LEVEL_PRE)})")


def hf_tokenizer_files(gguf_path: "str | os.PathLike[str]", sample: str,
                       metadata: "dict | None" = None) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json`` contents reproducing the GGUF's tokenizer.

    Raises :class:`TokenizerExportError` for vocabularies we do not rebuild, or when the rebuilt
    tokenizer's ids differ from llama.cpp's on ``sample``. ``metadata``: the file's metadata where the
    caller has read it already (``read_gguf``'s): a tokenizer kind we do not rebuild is then refused
    before gguf-py reads the whole vocabulary (seconds on a 262k-token one).
    """
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    from .gguf_model import GGUFModelError, open_reader

    kind = (metadata or {}).get("tokenizer.ggml.model")
    if isinstance(kind, str) and kind != "gpt2":   # anything else (a missing or unreadable kind) below
        _refuse_kind(kind, (metadata or {}).get("tokenizer.ggml.pre", "default"))
    try:
        check_vocabulary(gguf_path)
        r = open_reader(gguf_path)
    except (GGUFModelError, VocabularyError) as e:
        raise TokenizerExportError(str(e)) from None
    f = r.fields

    def get(key, default=None):
        try:
            return f[key].contents() if key in f else default
        except UnicodeDecodeError:
            raise TokenizerExportError(f"{key} holds a string that is not UTF-8") from None

    kind, pre = get("tokenizer.ggml.model"), get("tokenizer.ggml.pre", "default")
    _refuse_kind(kind, pre)
    toks = get("tokenizer.ggml.tokens")
    types = get("tokenizer.ggml.token_type", [1] * len(toks))
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", [])]
    if any(len(m) != 2 or not all(m) for m in merges):
        raise TokenizerExportError("a BPE merge is not two tokens separated by a space")
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                        if _BYTE_LEVEL_PRE[pre] else byte_level)
    tk.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(toks, types) if ty == control])

    def tok(key):
        i = get(key)
        if isinstance(i, bool) or not isinstance(i, int):   # absent, or not an integer: no such token
            return None
        return toks[i] if 0 <= i < len(toks) else None

    bos = tok("tokenizer.ggml.bos_token_id")
    add_bos = bool(get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, int(get("tokenizer.ggml.bos_token_id")))])
    ours = tk.encode(sample).ids
    try:
        ref = GGUFTokenizer(gguf_path).encode(sample, add_bos=True)
    except (VocabularyError, ValueError) as e:   # llama-cpp-python: "Failed to load model from file"
        raise TokenizerExportError(f"llama.cpp cannot load the vocabulary: {e}") from None
    if ours != ref:
        first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        raise TokenizerExportError(f"rebuilt tokenizer differs from llama.cpp's at token {first} of the sample")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos, "add_eos_token": False,
              "bos_token": bos, "eos_token": tok("tokenizer.ggml.eos_token_id"),
              "unk_token": tok("tokenizer.ggml.unknown_token_id"),
              "pad_token": tok("tokenizer.ggml.padding_token_id"), "clean_up_tokenization_spaces": False}
    template = get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return {"tokenizer.json": tk.to_str(), "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
