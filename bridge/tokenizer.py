"""The GGUF file's tokenizer, as llama.cpp runs it (llama-cpp-python, vocabulary only).

Both runtimes take token ids from here, so they always see the same ids. ``add_bos`` follows the
GGUF's ``tokenizer.ggml.add_bos_token`` (llama.cpp adds BOS only where the vocabulary asks for it).
"""

from __future__ import annotations

import os
from pathlib import Path


class GGUFTokenizer:
    def __init__(self, gguf_path: "str | os.PathLike[str]"):
        from llama_cpp import Llama

        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        self._llm = Llama(model_path=str(path), vocab_only=True, verbose=False)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False))

    def decode(self, ids: "list[int]") -> str:
        return self._llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    @property
    def n_vocab(self) -> int:
        return int(self._llm.n_vocab())

    @property
    def eos_id(self) -> int:
        return int(self._llm.token_eos())

    def close(self) -> None:
        self._llm.close()
