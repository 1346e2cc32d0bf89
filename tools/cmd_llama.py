"""``tqbridge llama build SRC [--out DIR]`` and ``tqbridge llama info BUILD [--json]``.

``build`` compiles the CPU shared libraries of a llama.cpp source checkout (upstream or the
TurboQuant fork) with the portable flags tqbridge uses everywhere, into the cache by default, and
prints the directory to pass as ``--llama``. ``info`` says what a build holds: ggml's version and
commit, its turbo types and which registry variant they are (ids, block sizes, centroid tables read
back), or why tqbridge refuses it.
"""

from __future__ import annotations

import json
import sys

from tqbridge.tools.cli import CliError


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="llama_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build a llama.cpp checkout's CPU shared libraries (for --llama)")
    b.add_argument("source", help="a llama.cpp source checkout (upstream or the TurboQuant fork)")
    b.add_argument("--out", help="build directory (default: the cache, keyed by checkout name and commit)")
    b.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    i = sub.add_parser("info", help="what a llama.cpp build holds, and whether tqbridge can use it")
    i.add_argument("build", help="a llama.cpp build directory (tqbridge llama build prints one)")
    i.add_argument("--json", action="store_true", help="the full probe report as JSON")


def run(args) -> int:
    from tqbridge.bridge.llama.build import build_from_source, describe
    from tqbridge.bridge.llama.side import LlamaBuildError

    try:
        if args.llama_command == "build":
            out = build_from_source(args.source, args.out, jobs=args.jobs,
                                    log=lambda m: print(m, file=sys.stderr))
            info = describe(out)
            print(info.label())
            if info.problems:
                print(f"refused: {info.one_line()}")
                return 1
            print(f"use it with: --llama {out}")
            return 0
        info = describe(args.build)
    except LlamaBuildError as e:
        raise CliError(str(e)) from e
    if args.json:
        print(json.dumps(info.report, indent=1))
        return 0 if not info.problems else 1
    print(info.label())
    turbo = (info.report.get("turbo") or {}).get("types") or {}
    for name, t in sorted(turbo.items()):
        cents = t.get("centroids")
        shown = "" if cents is None else " centroids +" + ", ".join(f"{c:.6f}" for c in cents[len(cents) // 2:])
        print(f"  {name}: ggml type {t['id']}, {t['type_size']} bytes per {t['block_size']} values;{shown}")
    if info.problems:
        print(f"refused: {info.one_line()}")
        return 1
    print("usable: " + ("turbo variant " + info.variant if info.variant else "upstream types only"))
    return 0
