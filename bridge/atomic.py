"""Atomic file output: write beside the target, rename over it only when writing succeeded.

A process killed (or failing) mid-write leaves the previous file under the target name untouched and
never a partial one; a kill can leave the hidden temporary ``.NAME.XXXXXX.tmp`` beside it (nothing runs
after SIGKILL to remove it). Every output file of the CLIs (convert, quality, parity, bench, fuzz,
selfcheck) goes through here; tests/test_atomic_outputs.py kills them mid-write.
"""

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
        _sync(tmp)  # the bytes reach the disk before the name points at them (power loss, not just a kill)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _sync(path.parent)


def _sync(p: "str | os.PathLike[str]") -> None:
    """fsync a file or (POSIX) a folder; a filesystem that cannot is not an error."""
    try:
        flags = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if os.path.isdir(p) else os.O_RDWR
        fd = os.open(p, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: "str | os.PathLike[str]", data: "str | bytes") -> Path:
    """Write text or bytes to ``path`` atomically."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)
