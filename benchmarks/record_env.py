"""What every record written by a benchmarks/record_*.py script starts with: date, machine, versions."""

from __future__ import annotations

import datetime
import os
import platform
from importlib.metadata import PackageNotFoundError, version


def header(packages: "tuple[str, ...]") -> dict:
    """``{"date", "machine", "versions"}`` for a record (a missing package's version is None)."""
    versions = {}
    for pkg in packages:
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {"date": datetime.date.today().isoformat(),
            "machine": {"uname -m": platform.machine(), "nproc": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "versions": versions}
