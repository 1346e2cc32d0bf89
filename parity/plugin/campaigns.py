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


SHARED_SCHEMES = ("redis://", "rediss://")


def is_shared_db(db) -> bool:
    """Whether ``--db`` names a Redis server (``redis://HOST:PORT[/N]``) rather than a folder."""
    return isinstance(db, str) and db.startswith(SHARED_SCHEMES)


def check_shared_db(url: str, error: type) -> None:
    """That the Redis server at ``url`` answers, from this process; one clear ``error`` when it does not."""
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase  # noqa: F401 - the same import the workers make
    except ImportError:
        raise error(f"--db {url} needs the redis package: pip install 'tqbridge[cluster]'") from None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5)
        client.ping()
    except ValueError as e:
        raise error(f"--db {url}: not a Redis URL ({e})") from None
    except redis.RedisError as e:
        raise error(f"--db {url}: cannot reach the Redis server ({e})") from None
    finally:
        try:
            client.close()
        except Exception:   # noqa: BLE001 - never opened
            pass


def example_database(local: "str | os.PathLike[str]", shared: "str | None", key: str):
    """A target's hypothesis example database: the folder ``local``, and with ``shared`` (a Redis URL)
    the Redis server too, under keys prefixed by the target's name. Both receive every example saved
    and both are read (hypothesis' MultiplexedDatabase): machines sharing the server replay each other's
    failures, and each keeps its own copy (Redis entries expire after hypothesis' default 8 days)."""
    from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase

    directory = DirectoryBasedExampleDatabase(str(local))
    if not shared:
        return directory
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase

    remote = RedisExampleDatabase(redis.Redis.from_url(shared), key_prefix=f"tqbridge-fuzz:{key}:".encode())
    return MultiplexedDatabase(directory, remote)
