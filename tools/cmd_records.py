"""``tqbridge records check | index [--check] | add REPORT.json --hardware H --what NAME [--command CMD]``.

The benchmark records under ``benchmarks/records/<hardware>/`` of the checkout at ``--root`` (default:
the current directory); the schema is in ``tqbridge.tools.records``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--root", default=".", help="the checkout holding benchmarks/records/ (default: .)")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("check", help="check every record against the schema")
    i = sub.add_parser("index", help="write benchmarks/INDEX.md from the records")
    i.add_argument("--check", action="store_true", help="write nothing; exit 1 if the committed index is not current")
    a = sub.add_parser("add", help="file a tool's JSON report as a record, with this machine's date, commit, "
                                   "machine and versions (run it where the report was made)")
    a.add_argument("report", help="the JSON a tool wrote (its --json OUT): becomes the record's results")
    a.add_argument("--hardware", required=True, help="the records folder: h200, cpu, nvcc, ...")
    a.add_argument("--what", required=True, help="the file name after the date: <date>-<what>.json")
    a.add_argument("--command", action="append", default=None,
                   help="the command that made the report (repeat for several)")


def run(args) -> int:
    from tqbridge.tools import records as R

    root = Path(args.root)
    if args.action == "check":
        bad = 0
        found = R.paths(root)
        for p in found:
            try:
                rec = json.loads(p.read_text())
            except ValueError as e:
                print(f"{p}: not JSON ({e})")
                bad += 1
                continue
            for problem in R.problems(rec, p):
                print(f"{p}: {problem}")
                bad += 1
        print(f"{len(found)} records, {bad} problems")
        return 1 if bad or not found else 0
    if args.action == "index":
        text = R.index_markdown(root)
        path = root / R.INDEX
        if args.check:
            current = path.exists() and path.read_text() == text
            print(f"{path}: {'current' if current else 'stale: run tqbridge records index'}")
            return 0 if current else 1
        from tqbridge.bridge.atomic import write_atomic

        write_atomic(path, text)
        print(f"wrote {path}")
        return 0
    report = json.loads(Path(args.report).read_text())
    cmd = args.command[0] if args.command and len(args.command) == 1 else args.command
    rec = R.envelope(report, hardware=args.hardware, command=cmd, cwd=root)
    try:
        path = R.write(rec, root, args.what)
    except FileExistsError as e:
        print(f"tqbridge records add: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path} (commit {rec['commit'] or 'not recorded: not one clean commit'})", file=sys.stderr)
    return 0
