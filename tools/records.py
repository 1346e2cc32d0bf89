"""Benchmark records: one envelope for every file under ``benchmarks/records/<hardware>/``.

A record is ``benchmarks/records/<hardware>/<YYYY-MM-DD>-<what>.json`` holding::

    {"schema": 1,
     "hardware": "<hardware>",           # the folder it sits in (h200, cpu, nvcc, ...)
     "date": "YYYY-MM-DD",               # the day it was measured: the file name's date
     "commit": "<hex>" | null,           # the tree that ran, where known
     "commit_source": "recorded" | "added-in" | null,
     "command": "..." | ["...", ...] | null,
     "machine": "..." | {...} | null,
     "versions": {"package": "version" | null, ...} | null,
     "results": <what the run wrote, unchanged>}

``commit_source`` says where the commit comes from: ``recorded`` -- the run (or whoever filed the run)
noted it; ``added-in`` -- the commit that added the record to the repository, which is after the run
(the measured code is that commit's tree or an ancestor of it); null exactly when ``commit`` is null.
``command``, ``machine`` and ``versions`` are null where the run did not record them; they are never
guessed. ``results`` is the payload the tool or script wrote; the docs and tests read numbers from it.

``tqbridge records index`` writes ``benchmarks/INDEX.md`` from the records; ``--check`` says whether the
committed index is current. ``tqbridge records add REPORT.json --hardware H --what NAME`` files a tool's
JSON report (``--json OUT`` of ``tqbridge bench``, ``fuzz``, ``parity``, ...) as a record, taking the
date, commit, machine and versions of the machine that runs it: run it where the report was made.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

SCHEMA = 1
RECORDS = Path("benchmarks") / "records"
INDEX = Path("benchmarks") / "INDEX.md"
KEYS = ("schema", "hardware", "date", "commit", "commit_source", "command", "machine", "versions", "results")
COMMIT_SOURCES = ("recorded", "added-in")
NAME = re.compile(r"(\d{4}-\d{2}-\d{2})-([a-z0-9][a-z0-9._-]*)\.json")
HARDWARE = re.compile(r"[a-z0-9][a-z0-9_-]*")
HEX = re.compile(r"[0-9a-f]{7,40}")
# the packages a record's versions name by default
PACKAGES = ("tqbridge", "numpy", "mlx", "mlx-lm", "llama-cpp-python", "hypothesis", "gguf")


class RecordError(ValueError):
    """A record that does not follow the schema."""


def problems(rec, path: "Path | None" = None) -> list[str]:
    """What is wrong with ``rec`` (a parsed record) as a schema-1 record; empty when nothing is. With
    ``path``, the folder must be its hardware and the file name must carry its date."""
    if not isinstance(rec, dict):
        return [f"a record is a JSON object, not {type(rec).__name__}"]
    bad = []
    if tuple(rec) != KEYS:
        bad.append(f"keys {list(rec)} != {list(KEYS)} (that set, in that order)")
    get = rec.get
    if get("schema") != SCHEMA:
        bad.append(f"schema {get('schema')!r} != {SCHEMA}")
    if not (isinstance(get("hardware"), str) and HARDWARE.fullmatch(get("hardware"))):
        bad.append(f"hardware {get('hardware')!r} is not a folder name")
    try:
        datetime.date.fromisoformat(get("date"))
    except (TypeError, ValueError):
        bad.append(f"date {get('date')!r} is not YYYY-MM-DD")
    commit, source = get("commit"), get("commit_source")
    if commit is None:
        if source is not None:
            bad.append(f"commit_source {source!r} without a commit")
    elif not (isinstance(commit, str) and HEX.fullmatch(commit)):
        bad.append(f"commit {commit!r} is not 7-40 hex digits")
    elif source not in COMMIT_SOURCES:
        bad.append(f"commit_source {source!r} not in {COMMIT_SOURCES}")
    cmd = get("command")
    if not (cmd is None or (isinstance(cmd, str) and cmd)
            or (isinstance(cmd, list) and cmd and all(isinstance(c, str) and c for c in cmd))):
        bad.append(f"command {cmd!r} is not a string, a list of strings or null")
    if not (get("machine") is None or (isinstance(get("machine"), (str, dict)) and get("machine"))):
        bad.append(f"machine {get('machine')!r} is not a string, an object or null")
    vers = get("versions")
    if not (vers is None or (isinstance(vers, dict) and vers
                             and all(isinstance(v, str) or v is None for v in vers.values()))):
        bad.append(f"versions {vers!r} is not an object of version strings (or null)")
    if get("results") in (None, {}, []):
        bad.append("results are empty")
    if path is not None:
        path = Path(path)
        m = NAME.fullmatch(path.name)
        if not m:
            bad.append(f"file name {path.name!r} is not YYYY-MM-DD-what.json")
        elif m.group(1) != get("date"):
            bad.append(f"file name's date {m.group(1)} != date {get('date')!r}")
        if path.parent.name != get("hardware"):
            bad.append(f"folder {path.parent.name!r} != hardware {get('hardware')!r}")
    return bad


def load(path: "str | Path") -> dict:
    """A record, checked against the schema (``RecordError`` when it does not follow it)."""
    rec = json.loads(Path(path).read_text())
    bad = problems(rec, Path(path))
    if bad:
        raise RecordError(f"{path}: " + "; ".join(bad))
    return rec


def results(path: "str | Path"):
    """The ``results`` of a checked record: the payload the run wrote."""
    return load(path)["results"]


def paths(root: "str | Path" = ".") -> list[Path]:
    """Every record file under ``root``'s benchmarks/records/, sorted by hardware, then name."""
    return sorted((Path(root) / RECORDS).glob("*/*.json"))


# ---- a key into a record's results -----------------------------------------------------------------

STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\[([^\]]*=[^\]]*)\]")


def _json_or_text(s: str):
    try:
        return json.loads(s)
    except ValueError:
        return s


def lookup(results, key: str):
    """The value at ``key`` in ``results``: dot-separated object keys, ``[i]`` for a list index and
    ``[field=value]`` for the one list entry whose ``field`` equals ``value`` (read as JSON where it
    parses -- ``[context=4096]``, ``[env={}]`` -- else as a string: ``[cache=q8_0/turbo3]``); several
    fields: ``[cache=fp16&context=4096]``. ``KeyError`` when a step finds nothing, or more than one entry."""
    at, pos = results, 0
    while pos < len(key):
        if key[pos] == "." and pos:
            pos += 1
        m = STEP.match(key, pos)
        if not m:
            raise KeyError(f"{key!r}: cannot read from {key[pos:]!r}")
        name, index, where = m.groups()
        pos = m.end()
        if name is not None:
            if not isinstance(at, dict) or name not in at:
                raise KeyError(f"{key!r}: no {name!r}")
            at = at[name]
        elif index is not None:
            if not isinstance(at, list) or int(index) >= len(at):
                raise KeyError(f"{key!r}: no [{index}]")
            at = at[int(index)]
        else:
            want = [(f, _json_or_text(v)) for f, _, v in (w.partition("=") for w in where.split("&"))]
            found = [x for x in (at if isinstance(at, list) else [])
                     if isinstance(x, dict) and all(f in x and x[f] == v for f, v in want)]
            if len(found) != 1:
                raise KeyError(f"{key!r}: {len(found)} entries with {where}")
            at = found[0]
    return at


# ---- writing -------------------------------------------------------------------------------------

def git_commit(cwd: "str | Path" = ".") -> "str | None":
    """The checked-out commit of the git work tree at ``cwd``, or None (not a checkout, no git, or a
    tree with uncommitted changes to tracked files: then no one commit is what ran)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() if not dirty.stdout.strip() else None


def machine() -> dict:
    """This machine, as a record names it."""
    return {"uname -m": platform.machine(), "nproc": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def versions(packages: "tuple[str, ...]" = PACKAGES) -> dict:
    """Installed versions of ``packages`` (None for one that is not installed)."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def envelope(results, *, hardware: str, command=None, date: "str | None" = None, commit: "str | None" = None,
             machine_=None, versions_=None, packages: "tuple[str, ...]" = PACKAGES, cwd: "str | Path" = ".") -> dict:
    """A schema-1 record around ``results``, measured here and now: date today, the commit checked out at
    ``cwd`` (``recorded``; null if the tree is not one clean commit), this machine, these versions."""
    commit = commit if commit is not None else git_commit(cwd)
    rec = {"schema": SCHEMA, "hardware": hardware, "date": date or datetime.date.today().isoformat(),
           "commit": commit, "commit_source": "recorded" if commit else None, "command": command,
           "machine": machine_ if machine_ is not None else machine(),
           "versions": versions_ if versions_ is not None else versions(packages), "results": results}
    bad = problems(rec)
    if bad:
        raise RecordError("; ".join(bad))
    return rec


def dumps(rec: dict) -> str:
    return json.dumps(rec, indent=1, ensure_ascii=False) + "\n"


def write(rec: dict, root: "str | Path" = ".", what: str = "") -> Path:
    """Write ``rec`` to ``root``/benchmarks/records/<hardware>/<date>-<what>.json (a new file)."""
    from tqbridge.bridge.atomic import write_atomic

    path = Path(root) / RECORDS / rec["hardware"] / f"{rec['date']}-{what}.json"
    bad = problems(rec, path)
    if bad:
        raise RecordError(f"{path}: " + "; ".join(bad))
    if path.exists():
        raise FileExistsError(f"{path} exists: a record is not overwritten; choose another --what")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dumps(rec))
    return path


# ---- the index -----------------------------------------------------------------------------------

def _cell(s: str, limit: int = 90) -> str:
    s = " ".join(s.split())
    s = s if len(s) <= limit else s[:limit - 1] + "…"
    return s.replace("|", "\\|").replace("`", "'")


def index_markdown(root: "str | Path" = ".") -> str:
    """``benchmarks/INDEX.md``: every record, per hardware, newest first, with its commit and command."""
    root = Path(root)
    by_hw: dict[str, list] = {}
    for p in paths(root):
        by_hw.setdefault(p.parent.name, []).append((p, load(p)))
    lines = ["# Benchmark records", "",
             "Generated by `tqbridge records index` from the records under `benchmarks/records/`; do not edit.",
             "The schema is described in `tools/records.py`. A commit marked *added-in* is the commit that added",
             "the record (the run was on that tree or an earlier one); a dash: not recorded. Commands written",
             "before the scripts moved name them as `benchmarks/<script>.py`, now `benchmarks/scripts/`.", ""]
    for hw in sorted(by_hw):
        recs = sorted(by_hw[hw], key=lambda x: (x[1]["date"], x[0].name), reverse=True)
        lines += [f"## {hw} ({len(recs)} records)", "", "| date | record | commit | command |", "|---|---|---|---|"]
        for p, rec in recs:
            rel = p.relative_to(root / "benchmarks").as_posix()
            what = NAME.fullmatch(p.name).group(2)
            commit = rec["commit"]
            ctext = "–" if commit is None else f"`{commit[:10]}`" + (" added-in" if rec["commit_source"] == "added-in" else "")
            cmd = rec["command"]
            if isinstance(cmd, list):
                cmd = cmd[0] + (f" (+{len(cmd) - 1} more)" if len(cmd) > 1 else "")
            lines.append(f"| {rec['date']} | [{what}]({rel}) | {ctext} | {'–' if cmd is None else '`' + _cell(cmd) + '`'} |")
        lines.append("")
    return "\n".join(lines)
