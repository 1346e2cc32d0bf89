"""Atomic file output: write beside the target, rename over it only when writing succeeded."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_output(path: "str | os.PathLike[str]", *, suffix: str = ".tmp", mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; on success it replaces ``path`` (readable, ``mode``),
    on any error it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: "str | os.PathLike[str]", data: "str | bytes") -> Path:
    """Write text or bytes to ``path`` atomically."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)
