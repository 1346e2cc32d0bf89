"""``tqbridge fuzz TARGET``: a hypothesis campaign against tqbridge's kernels or a user's.

TARGET is ``quantize``, ``dequantize``, ``append``, ``decode-attention`` or ``module:function``.
Prints a progress line while it runs, then a summary; a counterexample is printed as a runnable
test (``@example`` + the failing call) and saved beside the example database. Exit code 0 when no
counterexample was found, 1 when one was.
"""

from __future__ import annotations

import json
import sys

from .cli import CliError

BACKENDS = ("auto", "cpu-emulator", "cuda", "metal", "reference")


def _list(v):
    return None if v is None else [s.strip() for s in v.split(",") if s.strip()]


def add_arguments(p) -> None:
    p.add_argument("target", help="quantize | dequantize | append | decode-attention | module:function")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="kernel backend for append and decode-attention (default: auto); quantize and "
                        "dequantize check the MLX codecs on MLX's default device")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--examples", type=int, help="examples in all (default: from --profile)")
    g.add_argument("--minutes", type=float, help="run for this long instead of a number of examples")
    p.add_argument("--profile", default="ci", choices=("ci", "dev", "deep"),
                   help="ci: 100 examples, seed 0; dev: 300; deep: 3000 (random seed unless --seed)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--seed", type=int, help="base seed; give each machine of a spread campaign its own")
    p.add_argument("--db", help="example database root (default $TQBRIDGE_CACHE/fuzz, i.e. ~/.cache/tqbridge/fuzz)")
    p.add_argument("--op", choices=("quantize", "dequantize", "append", "decode-attention"),
                   help="what a module:function target implements (else its @claims decorator)")
    p.add_argument("--format", dest="fmt", help="format(s) it claims, comma-separated (quantize/dequantize/append)")
    p.add_argument("--k-format", help="K format(s) of a decode-attention target, comma-separated")
    p.add_argument("--v-format", help="V format(s) of a decode-attention target, comma-separated")
    p.add_argument("--json", metavar="OUT", help="also write the summary as JSON to OUT")


def run(args) -> int:
    from tqbridge.parity.fuzz import FuzzError, run_campaign

    tty = sys.stderr.isatty()
    last = [0.0]

    def progress(c):
        if tty:
            print("\r" + c.progress_line(), end="", file=sys.stderr, flush=True)
        elif c.seconds - last[0] >= 10:
            last[0] = c.seconds
            print(c.progress_line(), file=sys.stderr, flush=True)

    try:
        c = run_campaign(args.target, backend=args.backend, examples=args.examples, minutes=args.minutes,
                         profile=args.profile, jobs=args.jobs, seed=args.seed, db=args.db, op=args.op,
                         fmt=_list(args.fmt), k_format=_list(args.k_format), v_format=_list(args.v_format),
                         progress=progress)
    except FuzzError as e:
        raise CliError(str(e)) from None
    if tty:
        print(file=sys.stderr)
    s = c.summary()
    print(f"tqbridge fuzz {c.target} (backend {c.backend}, {c.jobs} job{'s' if c.jobs > 1 else ''}, seed {c.seed})")
    print(f"  examples     {s['examples']}")
    print(f"  shapes       {s['shapes']} distinct")
    print(f"  formats      {len(s['formats'])}: {', '.join(s['formats'])}")
    print(f"  worst error  {s['worst_error_over_allowed']:.3g} of the allowed, over passing examples "
          "(hypothesis.target 'error / allowed')")
    print(f"  time         {s['seconds']:.1f} s")
    print(f"  database     {c.db}")
    for e in c.errors:
        print(f"  error        {e}")
    if c.failure:
        print(f"  result       COUNTEREXAMPLE {c.failure['case']}")
        print()
        print(c.failure["message"])
        print()
        print(f"# a runnable test, also saved as {c.db}/counterexample.py:")
        print(c.failure["snippet"])
    elif not c.errors:
        print("  result       no counterexample")
    if args.json:
        from tqbridge.parity.report import write_json

        write_json(args.json, s)
    if c.failure:
        return 1
    if c.errors:
        raise CliError(c.errors[0])
    return 0
