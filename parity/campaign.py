"""Verification campaigns: a matrix of tqbridge commands run as Ray tasks, with one resumable record.

A campaign spec (TOML, or YAML where PyYAML is installed) lists cell groups::

    retries = 2                      # a lost or crashed cell runs again at most this many times
    timeout_s = 3600                 # per cell, unless the group says otherwise

    [[cells]]
    command = "parity"               # parity | quality | archs | bench | fuzz | selfcheck | formats
    models = ["smollm2"]             # axes tqbridge knows: models (the model argument), kv (--kv),
    kv = ["q8_0/q8_0", "q4_0/q4_0"]  #   builds (--llama), levels (--levels)
    args = ["--tokens", "64"]        # the rest of the command line; {name} takes a value of matrix.name
    matrix = { }                     # further axes, by name
    num_cpus = 1                     # Ray resources of each cell: CPUs, GPUs, custom resources
    num_gpus = 0
    resources = { "fork-69d8e4b" = 1 }

Every group expands to the product of its axes; each cell is one command line, run as a subprocess
(``python -m tqbridge.tools.cli ...``) inside a Ray task, which returns the command's JSON report, exit code,
time and node. A cell whose process dies by a signal, or whose Ray worker is lost, is retried by Ray
itself (``max_retries`` / ``retry_exceptions``), at most ``retries`` times; a cell that exits with an
error is not retried (it would fail the same way) and is reported with its command line.

Results arrive as cells finish: each one is written into the campaign's JSON record and Markdown table
(atomically, :mod:`tqbridge.bridge.atomic`) before the next is awaited, so a campaign stopped at any
point keeps every finished cell, and a re-run with the same output folder skips them (a cell is
finished when its command reached a verdict: exit code 0 or 1).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqbridge.bridge.atomic import write_atomic

# The commands a cell may run, and how each hands back its JSON: a file named by --json, or stdout.
JSON_FILE = ("parity", "quality", "archs", "bench", "fuzz", "selfcheck")
JSON_STDOUT = ("formats",)
COMMANDS = JSON_FILE + JSON_STDOUT
# Axes tqbridge knows: where each goes on the command line (None: the positional model argument).
KNOWN_AXES = {"models": None, "kv": "--kv", "builds": "--llama", "levels": "--levels"}
AXES_OF = {"parity": ("models", "kv", "builds", "levels"), "quality": ("models", "kv")}
GROUP_KEYS = {"command", "args", "matrix", "num_cpus", "num_gpus", "memory_gb", "resources", "timeout_s",
              "retries", *KNOWN_AXES}
TOP_KEYS = {"name", "retries", "timeout_s", "cells"}
DEFAULT_RETRIES = 2
DEFAULT_TIMEOUT_S = 3600.0
FINISHED = ("pass", "fail")        # a cell with one of these statuses is not run again
TAIL = 2000                        # characters of a cell's stderr kept in the record
EXTRA_HINT = "pip install 'tqbridge[cluster]'"


class CampaignError(ValueError):
    """A campaign cannot start (bad spec, no Ray, unreachable cluster); one line says why."""


class CellLost(RuntimeError):
    """A cell's process died by a signal (killed, out of memory): Ray runs the task again."""


# ----------------------------------------------------------------------------------- the spec


@dataclass
class Cell:
    """One command line of the matrix and the resources it asks Ray for."""

    command: str
    argv: list                  # after ``tqbridge``, without the output file
    num_cpus: float = 1
    num_gpus: float = 0
    memory_gb: "float | None" = None
    resources: dict = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    build: "str | None" = None  # a llama.cpp build folder that must be present on the node

    @property
    def id(self) -> str:
        """Stable across runs: the command line alone (resources do not change what a cell computes)."""
        return hashlib.sha256(json.dumps(self.argv).encode()).hexdigest()[:12]

    @property
    def command_line(self) -> str:
        return "tqbridge " + " ".join(map(shlex.quote, self.argv))


def read_spec(path: "str | os.PathLike[str]") -> dict:
    """The parsed spec file (TOML; YAML where PyYAML is installed)."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise CampaignError(f"cannot read {path}: {e.strerror or e}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise CampaignError(f"{path}: a YAML spec needs PyYAML (pip install pyyaml), or write it as TOML") from None
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise CampaignError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    else:
        try:
            import tomllib
        except ImportError:                      # Python 3.10
            try:
                import tomli as tomllib          # type: ignore[no-redef]
            except ImportError:
                raise CampaignError("reading a TOML spec on Python 3.10 needs tomli (pip install tomli)") from None
        try:
            spec = tomllib.loads(text.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise CampaignError(f"{path}: not valid TOML: {e}") from None
    if not isinstance(spec, dict):
        raise CampaignError(f"{path}: a spec is a table of settings and [[cells]] groups")
    return spec


def _list(group: dict, key: str, where: str) -> list:
    v = group.get(key)
    if v is None:
        return []
    if isinstance(v, (str, int, float)):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, (str, int, float)) for x in v):
        raise CampaignError(f"{where}: {key} must be a value or a non-empty list of values")
    return [str(x) for x in v]


def _number(group: dict, key: str, where: str, default, minimum=0):
    v = group.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
        raise CampaignError(f"{where}: {key} must be a number >= {minimum}, got {v!r}")
    return v


PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(spec: dict, *, source: str = "spec") -> list[Cell]:
    """Every cell of the spec, in spec order (a group's axes vary fastest from the last one)."""
    unknown = set(spec) - TOP_KEYS
    if unknown:
        raise CampaignError(f"{source}: unknown setting(s) {', '.join(sorted(unknown))} "
                            f"(known: {', '.join(sorted(TOP_KEYS))})")
    retries = _number(spec, "retries", source, DEFAULT_RETRIES)
    timeout = _number(spec, "timeout_s", source, DEFAULT_TIMEOUT_S, minimum=1)
    groups = spec.get("cells")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        raise CampaignError(f"{source}: no cells: add one or more [[cells]] groups with a command")
    cells: list[Cell] = []
    for i, g in enumerate(groups, 1):
        where = f"{source}: cells group {i}"
        unknown = set(g) - GROUP_KEYS
        if unknown:
            raise CampaignError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(sorted(GROUP_KEYS))})")
        cmd = g.get("command")
        if cmd not in COMMANDS:
            extra = " (evidence is not a tqbridge command yet)" if cmd == "evidence" else ""
            raise CampaignError(f"{where}: command {cmd!r} is not one a cell can run{extra}; "
                                f"use one of {', '.join(COMMANDS)}")
        args = g.get("args", [])
        if isinstance(args, str):
            args = shlex.split(args)
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise CampaignError(f"{where}: args must be a list of strings (or one string)")
        args = [str(a) for a in args]
        if any(a == "--json" or a.startswith("--json=") for a in args):
            raise CampaignError(f"{where}: leave --json out of args: the campaign collects each cell's JSON itself")
        axes: list[tuple[str, list]] = []
        for k in KNOWN_AXES:
            vals = _list(g, k, where)
            if vals:
                if k not in AXES_OF.get(cmd, ()):
                    raise CampaignError(f"{where}: {cmd} takes no {k} axis (axes of {cmd}: "
                                        f"{', '.join(AXES_OF.get(cmd, ())) or 'none; use matrix and {name} in args'})")
                axes.append((k, vals))
        matrix = g.get("matrix", {})
        if not isinstance(matrix, dict):
            raise CampaignError(f"{where}: matrix must be a table of axis = [values]")
        used = {m.group(1) for a in args for m in PLACEHOLDER.finditer(a)}
        for name in matrix:
            if name not in used:
                raise CampaignError(f"{where}: matrix axis {name!r} is not used in args (write {{{name}}} there)")
            axes.append((name, _list(matrix, name, where)))
        missing = used - set(matrix)
        if missing:
            raise CampaignError(f"{where}: args use {', '.join('{' + m + '}' for m in sorted(missing))} "
                                "but matrix has no such axis")
        res = g.get("resources", {})
        if not isinstance(res, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in res.values()):
            raise CampaignError(f"{where}: resources must be a table of name = amount")
        common = dict(num_cpus=_number(g, "num_cpus", where, 1), num_gpus=_number(g, "num_gpus", where, 0),
                      memory_gb=_number(g, "memory_gb", where, None), resources=dict(res),
                      timeout_s=_number(g, "timeout_s", where, timeout, minimum=1),
                      retries=int(_number(g, "retries", where, retries)))
        for combo in itertools.product(*(vals for _, vals in axes)):
            values = {name: v for (name, _), v in zip(axes, combo)}
            argv = [cmd]
            if "models" in values:
                argv.append(values["models"])
            for k in ("kv", "builds", "levels"):
                if k in values:
                    argv += [KNOWN_AXES[k], values[k]]
            argv += [PLACEHOLDER.sub(lambda m: values[m.group(1)], a) for a in args]
            cells.append(Cell(cmd, argv, build=values.get("builds"), **common))
    ids: dict = {}
    for c in cells:
        if c.id in ids:
            raise CampaignError(f"{source}: the cell {c.command_line} appears twice")
        ids[c.id] = c
    return cells


# ----------------------------------------------------------------------------------- one cell


def _die_with_parent() -> None:
    """In the cell's child process: die when the Ray worker running it dies (Linux), so a lost worker
    leaves no orphan computing on."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_cell(argv: list, *, json_from: str, timeout_s: float, build: "str | None" = None, cwd: "str | None" = None,
             node: "str | None" = None, started: "Callable[[dict], Any] | None" = None) -> dict:
    """Run one cell's command line here, as a subprocess, in ``cwd`` where that folder exists on this
    machine (relative paths and a user's fuzz module then mean what they meant to the driver), else in a
    temporary folder; its outcome as a dict. Raises :class:`CellLost` when the process died by a signal
    (the caller's retry policy decides)."""
    host = socket.gethostname()
    where = {"host": host, "pid": os.getpid(), "node": node}
    if started is not None:
        started(where)
    t0 = time.monotonic()
    out = {**where, "attempt": 1, "started_at": round(time.time(), 3)}
    if build is not None and not Path(build).is_dir():
        return {**out, "status": "error", "exit_code": None, "seconds": 0.0, "report": None,
                "error": f"llama.cpp build {build} is not present on {host}", "stderr_tail": ""}
    with tempfile.TemporaryDirectory(prefix="tqbridge-cell-") as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "tqbridge.tools.cli", *argv]
        cmd += ["--json", str(report_path)] if json_from == "file" else ["--json"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                               cwd=cwd if cwd and Path(cwd).is_dir() else tmp,
                               preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            return {**out, "status": "error", "exit_code": None, "seconds": round(time.monotonic() - t0, 3),
                    "report": None, "error": f"timed out after {timeout_s:g} s", "stderr_tail": err[-TAIL:]}
        seconds = round(time.monotonic() - t0, 3)
        if p.returncode < 0:
            raise CellLost(f"the cell's process died by signal {-p.returncode} on {host}")
        report, error = None, None
        try:
            if json_from == "file" and report_path.is_file():
                report = json.loads(report_path.read_text())
            elif json_from == "stdout" and p.returncode == 0:
                report = json.loads(p.stdout)
        except ValueError as e:
            error = f"its JSON report does not parse: {e}"
    status = {0: "pass", 1: "fail"}.get(p.returncode, "error")
    if status == "error" and error is None:
        lines = [s for s in p.stderr.strip().splitlines() if s.strip()]
        error = lines[-1] if lines else f"exit code {p.returncode}"
    elif error is not None:
        status = "error"
    return {**out, "status": status, "exit_code": p.returncode, "seconds": seconds, "report": report,
            "error": error, "stderr_tail": p.stderr[-TAIL:]}


# ----------------------------------------------------------------------------------- the record


def _markdown(record: dict) -> str:
    s = record["summary"]
    lines = [f"# Campaign {record['name']}", "",
             f"{s['cells']} cells: {s['pass']} pass, {s['fail']} fail, {s['error']} error, "
             f"{s['pending']} not run. Ray: {record['ray']['address'] or 'none'}, "
             f"{record['ray'].get('nodes', '?')} node(s).", "",
             "| cell | command | status | seconds | attempts | node |", "|---|---|---|---|---|---|"]
    for c in record["cells"]:
        cmd = c["command_line"].replace("|", "\\|")
        sec = "" if c.get("seconds") is None else f"{c['seconds']:.1f}"
        status = c["status"] + ("" if c.get("in_spec", True) else " (not in spec)")
        node = " ".join(x for x in (c.get("host"), (c.get("node") or "")[:8]) if x)
        lines.append(f"| {c['id']} | `{cmd}` | {status} | {sec} | {c.get('attempts') or ''} | {node} |")
    errs = [c for c in record["cells"] if c["status"] == "error"]
    if errs:
        lines += ["", "## Errors", ""]
        lines += [f"- `{c['command_line']}`: {c.get('error') or 'failed'}" for c in errs]
    return "\n".join(lines) + "\n"


def _summary(cells: list) -> dict:
    n = {k: sum(c["status"] == k for c in cells) for k in ("pass", "fail", "error", "pending")}
    return {"cells": len(cells), **n}


def load_record(path: Path) -> dict:
    """The cells of an earlier run of this campaign, by id (empty when there is none)."""
    if not path.is_file():
        return {}
    try:
        rec = json.loads(path.read_text())
        return {c["id"]: c for c in rec["cells"]}
    except (ValueError, KeyError, TypeError) as e:
        raise CampaignError(f"{path} is not a campaign record ({e}); give another --out or remove it") from None


# ----------------------------------------------------------------------------------- the campaign


def _ray():
    try:
        import ray
    except ImportError:
        raise CampaignError(f"tqbridge campaign needs Ray: {EXTRA_HINT}") from None
    return ray


def _tracker_class(ray):
    @ray.remote(num_cpus=0)
    class Tracker:
        """Counts each cell's starts (its attempt number) and queues start events for the driver."""

        def __init__(self):
            self.starts: dict = {}
            self.events: list = []

        def started(self, cell_id: str, where: dict) -> None:
            self.starts[cell_id] = self.starts.get(cell_id, 0) + 1
            self.events.append({"id": cell_id, "attempt": self.starts[cell_id], **where})

        def attempts(self, cell_id: str) -> int:
            return self.starts.get(cell_id, 0)

        def drain(self) -> list:
            out, self.events = self.events, []
            return out
    return Tracker


def _cell_task(ray):
    def task(cell_id, argv, json_from, timeout_s, build, cwd, tracker):
        return run_cell(argv, json_from=json_from, timeout_s=timeout_s, build=build, cwd=cwd,
                        node=ray.get_runtime_context().get_node_id(),
                        started=lambda where: tracker.started.remote(cell_id, where))
    # ``started`` is sent, not awaited: Ray gives a task's CPUs back while it blocks in ray.get and may
    # start another task on them, so a cell awaiting it could share its CPU with another cell (a campaign
    # on a one-CPU node of a loaded machine once took less time than the sum of its cells).
    return ray.remote(task)


def _entry(cell: Cell, result: "dict | None", status: str, error: "str | None" = None) -> dict:
    e = {"id": cell.id, "command": cell.command, "command_line": cell.command_line, "argv": cell.argv,
         "resources": {"num_cpus": cell.num_cpus, "num_gpus": cell.num_gpus, "memory_gb": cell.memory_gb,
                       **cell.resources},
         "status": status, "exit_code": None, "seconds": None, "wall_seconds": None, "attempts": None,
         "host": None, "node": None, "started_at": None, "report": None, "error": error, "stderr_tail": None}
    if result is not None:
        e.update({k: result.get(k) for k in ("exit_code", "seconds", "report", "error", "stderr_tail", "host", "node", "started_at")})
        e["attempts"] = result.get("attempt")
        e["status"] = result["status"]
    return e


@dataclass
class Campaign:
    """A campaign's state while it runs: the record it writes and the progress it reports."""

    name: str
    out: Path
    cells: list
    entries: dict
    ray_info: dict
    command: "str | None" = None
    t0: float = field(default_factory=time.monotonic)
    skipped: int = 0
    running: dict = field(default_factory=dict)

    @property
    def json_path(self) -> Path:
        return self.out / "campaign.json"

    @property
    def markdown_path(self) -> Path:
        return self.out / "campaign.md"

    def record(self) -> dict:
        ids = {c.id for c in self.cells}
        cells = [self.entries[c.id] for c in self.cells]
        cells += [{**e, "in_spec": False} for i, e in self.entries.items() if i not in ids]
        from tqbridge.parity.harness.report import versions

        return {"tool": "tqbridge campaign", "name": self.name, "command": self.command, "versions": versions(),
                "ray": self.ray_info, "wall_seconds": round(time.monotonic() - self.t0, 3),
                "skipped_finished": self.skipped, "summary": _summary(cells), "cells": cells}

    def write(self) -> dict:
        rec = self.record()
        write_atomic(self.json_path, json.dumps(rec, indent=1) + "\n")
        write_atomic(self.markdown_path, _markdown(rec))
        return rec

    def counts(self) -> dict:
        return _summary([self.entries[c.id] for c in self.cells])


def infeasible(cell: Cell, nodes: list) -> "str | None":
    """Why no node of ``nodes`` (``ray.nodes()``) could ever run ``cell``; None when one can. Ray would
    otherwise keep such a task waiting for a node that never comes."""
    need = {"CPU": cell.num_cpus, "GPU": cell.num_gpus, **cell.resources}
    if cell.memory_gb:
        need["memory"] = cell.memory_gb * (1 << 30)
    need = {k: v for k, v in need.items() if v}
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    if any(all(r.get(k, 0) >= v for k, v in need.items()) for r in alive):
        return None
    asked = ", ".join(f"{k} {v:g}" for k, v in need.items())
    return f"no node of the Ray cluster has {asked} (the cell's resources)"


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``host:port`` cluster address answers on TCP; Ray itself would retry for minutes before saying so.
    Other forms (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise CampaignError(f"cannot reach a Ray cluster at {address}: {e.strerror or e} "
                            "(`ray start --head` prints the address to give)") from None


def _ray_info(ray, address: "str | None") -> dict:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    res = ray.cluster_resources()
    return {"address": address or "local", "nodes": len(nodes), "cpus": res.get("CPU", 0), "gpus": res.get("GPU", 0),
            "ray": ray.__version__}


def run_campaign(spec_path: "str | os.PathLike[str]", out: "str | os.PathLike[str]", *, address: "str | None" = None,
                 num_cpus: "int | None" = None, serial: bool = False, command: "str | None" = None,
                 progress: "Callable[[str, dict, Campaign], None] | None" = None) -> Campaign:
    """Run (or resume) the campaign of ``spec_path`` into the folder ``out`` and return it.

    ``address``: a Ray cluster's address (``ray start --head`` prints it; ``auto`` finds one started on
    this machine); without it a local Ray starts with ``num_cpus`` CPUs (default: all). ``serial``: no
    Ray at all, the cells one after another in this process's children (the baseline of the overhead
    measurement; no retries). ``progress(event, cell_entry, campaign)`` is called with ``start``,
    ``done`` and ``skip`` events."""
    spec = read_spec(spec_path)
    cells = expand(spec, source=str(spec_path))
    out = Path(out)
    name = str(spec.get("name") or Path(spec_path).stem)
    before = load_record(out / "campaign.json")
    entries, todo = {}, []
    for c in cells:
        prev = before.get(c.id)
        if prev is not None and prev.get("status") in FINISHED:
            entries[c.id] = prev
        else:
            entries[c.id] = _entry(c, None, "pending")
            todo.append(c)
    for i, e in before.items():          # cells of an earlier spec stay in the record
        if i not in entries:
            entries[i] = e
    say = progress or (lambda *a: None)
    if serial:
        camp = Campaign(name, out, cells, entries, {"address": None, "nodes": 1, "mode": "serial"}, command)
        camp.skipped = len(cells) - len(todo)
        for c in cells:
            if c not in todo:
                say("skip", entries[c.id], camp)
        camp.write()
        for c in todo:
            say("start", {**entries[c.id], "attempt": 1, "host": socket.gethostname()}, camp)
            t = time.monotonic()
            try:
                r = run_cell(c.argv, json_from="stdout" if c.command in JSON_STDOUT else "file",
                             timeout_s=c.timeout_s, build=c.build, cwd=os.getcwd())
                entries[c.id] = _entry(c, r, r["status"])
            except CellLost as e:
                entries[c.id] = _entry(c, None, "error", str(e))
            entries[c.id]["wall_seconds"] = round(time.monotonic() - t, 3)
            camp.write()
            say("done", entries[c.id], camp)
        return camp

    ray = _ray()
    import logging

    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address:
                check_reachable(address)
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise CampaignError(f"cannot start or reach Ray{' at ' + address if address else ''}: "
                                f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    try:
        camp = Campaign(name, out, cells, entries, _ray_info(ray, address), command)
        camp.skipped = len(cells) - len(todo)
        for c in cells:
            if c not in todo:
                say("skip", entries[c.id], camp)
        camp.write()
        tracker = _tracker_class(ray).remote()
        task = _cell_task(ray)
        pending: dict = {}
        submitted: dict = {}
        nodes = ray.nodes()
        for c in todo:
            why = infeasible(c, nodes)
            if why is not None:
                entries[c.id] = _entry(c, None, "error", why)
                camp.write()
                say("done", entries[c.id], camp)
                continue
            opts: dict = {"num_cpus": c.num_cpus, "num_gpus": c.num_gpus, "max_retries": c.retries,
                          "retry_exceptions": [CellLost]}
            if c.memory_gb:
                opts["memory"] = int(c.memory_gb * (1 << 30))
            if c.resources:
                opts["resources"] = dict(c.resources)
            ref = task.options(**opts).remote(c.id, c.argv, "stdout" if c.command in JSON_STDOUT else "file",
                                              c.timeout_s, c.build, os.getcwd(), tracker)
            pending[ref] = c
            submitted[c.id] = time.monotonic()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ev in ray.get(tracker.drain.remote()):
                camp.running[ev["id"]] = ev
                say("start", {**entries[ev["id"]], **ev}, camp)
            for ref in done:
                c = pending.pop(ref)
                try:
                    r = ray.get(ref)
                    entries[c.id] = _entry(c, r, r["status"])
                except Exception as e:        # noqa: BLE001 - retries exhausted, or the task could not run
                    msg = _ray_error(e)
                    entries[c.id] = _entry(c, None, "error", msg)
                entries[c.id]["attempts"] = ray.get(tracker.attempts.remote(c.id)) or None
                entries[c.id]["wall_seconds"] = round(time.monotonic() - submitted[c.id], 3)
                camp.running.pop(c.id, None)
                camp.write()
                say("done", entries[c.id], camp)
        return camp
    finally:
        if started_here:
            ray.shutdown()


def _ray_error(e: BaseException) -> str:
    """One line for a task that failed for good."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, CellLost):
        return f"{cause} (retries exhausted)"
    text = str(e).strip().splitlines()
    name = type(e).__name__
    if "WorkerCrashedError" in name or "The worker died" in str(e):
        return "its Ray worker died on every attempt (retries exhausted)"
    if "NodeDied" in name or "node" in name.lower() and "died" in str(e).lower():
        return "its node died (retries exhausted)"
    return f"{name}: {text[-1] if text else ''}"
