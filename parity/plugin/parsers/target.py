"""What a parser target is: the :class:`ParserTarget` interface (seeds, consumers, their clean
errors), a :class:`Seed`, the campaign's one-line :class:`ParserFuzzError`, and the scratch-file
helpers the targets' consumers share."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class ParserFuzzError(ValueError):
    """A parser campaign cannot start (one line says why)."""


@dataclass
class Seed:
    name: str
    data: bytes
    fields: list = field(default_factory=list)   # (offset, width) of integer fields of the structure
    hot: int = 0                                  # bytes [0, hot) are structure (mutated more often)


class ParserTarget:
    """A parser under test: seeds, the consumers each mutant runs through, their clean errors."""

    name = ""
    consumers: tuple = ()
    suffix = ".bin"
    structured_share = 0.0
    structured_mutation: "Callable | None" = None
    depends: dict = {}        # consumer -> the consumer that must accept the input first
    upstream = False          # failures that never pass through tqbridge's code are a dependency's ("upstream")

    def seeds(self, scratch: Path) -> list[Seed]:
        raise NotImplementedError

    def clean_classes(self, consumer: str) -> tuple:
        raise NotImplementedError

    def call(self, consumer: str, data: bytes, scratch: Path) -> "str | None":
        """Run one consumer; return None when accepted, or a string describing an inconsistency."""
        raise NotImplementedError

    def raised_by_us_required(self, consumer: str) -> bool:
        """Whether a clean error must come from a ``raise`` in tqbridge's code (plain ValueError
        classes that MLX and numpy raise too)."""
        return False


def write_input(scratch: Path, data: bytes, suffix: str) -> Path:
    """The input of one consumer call as a file in ``scratch``."""
    p = scratch / f"input{suffix}"
    p.write_bytes(data)
    return p


def remove_output(path: Path) -> None:
    """A consumer's earlier output (a file or a directory), so that the next call writes afresh."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
