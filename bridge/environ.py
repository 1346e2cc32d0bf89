"""The environment: tqbridge's cache directory (``TQBRIDGE_CACHE``), and variables set for the length
of a block and restored after it.

The environment variables tqbridge reads are user settings, each read where it applies (see the table
in docs/settings.md); kernel and test choices travel as values, never through the environment.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Mapping


def cache_dir() -> Path:
    """Where tqbridge keeps what it makes (converted models, compiled kernels and shims, fuzz
    databases): ``$TQBRIDGE_CACHE``, else ``~/.cache/tqbridge``."""
    base = os.environ.get("TQBRIDGE_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "tqbridge"


@contextlib.contextmanager
def scoped_environ(values: "Mapping[str, str | None]") -> Iterator[None]:
    """``with scoped_environ({name: value}):`` each ``name`` set to ``value`` (None: removed) while the
    block runs; on exit each is back to what it was (removed where it was unset)."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
