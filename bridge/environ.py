"""Environment variables set for the length of a block and restored after it."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping


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
