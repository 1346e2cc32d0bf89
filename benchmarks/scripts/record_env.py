"""What every record written by a benchmarks/record_*.py script starts with: date, machine, versions."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
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


def write_record(out: str, payload: dict, *, hardware: str, command) -> None:
    """Write ``payload`` to ``out`` as a record (``tqbridge.tools.records.envelope``): its date, machine
    and versions as the payload states them, the commit checked out here (null if the tree is not one clean
    commit). ``out`` belongs under benchmarks/records/<hardware>/<date>-<what>.json."""
    from tqbridge.bridge.atomic import write_atomic
    from tqbridge.tools.records import dumps, envelope

    rec = envelope(payload, hardware=hardware, command=command, date=payload.get("date"),
                   machine_=payload.get("machine"), versions_=payload.get("versions"))
    write_atomic(out, dumps(rec))


def record_fuzz_campaigns(out: str, packages: "tuple[str, ...]", campaigns, *, keep_stderr: int = 0,
                          fixup=None) -> int:
    """Run ``tqbridge fuzz TARGET ARGS... --db <fresh dir> --json ...`` for each ``(target, args)`` of
    ``campaigns`` in one fresh example database (the counts are the campaigns' own) and write one record
    to ``out`` (``write_record``, hardware ``cpu``): the header, and per target its command, exit code and
    summary (``fixup(summary)`` edits it first). ``keep_stderr``: how many characters of each campaign's
    stderr to echo."""

    record: dict = {**header(packages), "campaigns": {}}
    with tempfile.TemporaryDirectory(prefix="tqbridge-fuzz-record-") as tmp:
        for target, args in campaigns:
            summary_path = Path(tmp) / f"{target}.json"
            cmd = ["tqbridge", "fuzz", target, *args, "--db", str(Path(tmp) / "db"), "--json", str(summary_path)]
            print(" ".join(cmd), file=sys.stderr, flush=True)
            p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", *cmd[1:]], capture_output=True, text=True)
            print(p.stdout, p.stderr[-keep_stderr:] if keep_stderr else "", file=sys.stderr, flush=True)
            summary = json.loads(summary_path.read_text())
            summary["database"] = "(fresh, temporary)"
            if fixup is not None:
                fixup(summary)
            record["campaigns"][target] = {"command": " ".join(cmd[:-4] + ["--db", "DB", "--json", "OUT"]),
                                           "exit_code": p.returncode, "summary": summary}
    write_record(out, record, hardware="cpu",
                 command=[c["command"] for c in record["campaigns"].values()])
    return 0
