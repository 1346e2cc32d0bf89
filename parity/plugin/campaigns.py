"""What the kernel and parser fuzz campaigns share: where example databases live and the budget checks."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tqbridge.bridge.environ import cache_dir

from .profiles import EXAMPLES as PROFILES


def default_db_root() -> Path:
    """Where campaigns keep their example databases when ``--db`` is not given: ``$TQBRIDGE_CACHE/fuzz``
    (default ``~/.cache/tqbridge/fuzz``), never the current directory."""
    return cache_dir() / "fuzz"


def hypothesis_home() -> Path:
    """hypothesis' own storage (its caches; ``.hypothesis/`` in the current directory by default) for the
    workers: ``$TQBRIDGE_CACHE/hypothesis``, unless ``HYPOTHESIS_STORAGE_DIRECTORY`` says otherwise."""
    return cache_dir() / "hypothesis"


def db_path(root: "str | os.PathLike[str]", target: str) -> Path:
    """The example database of one target under ``root`` (one directory per target)."""
    return Path(root) / re.sub(r"[^A-Za-z0-9_.-]+", "_", target)


def check_budget(profile: str, examples: "int | None", minutes: "float | None", jobs: int, error: type) -> None:
    """A campaign's budget arguments, one clear ``error`` per problem (kernel and parser campaigns)."""
    if profile not in PROFILES:
        raise error(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if examples is not None and minutes is not None:
        raise error("give --examples or --minutes, not both")
    if examples is not None and examples < 1:
        raise error(f"--examples must be at least 1, got {examples}")
    if minutes is not None and not minutes > 0:
        raise error(f"--minutes must be positive, got {minutes}")
    if jobs < 1:
        raise error(f"--jobs must be at least 1, got {jobs}")
