"""``tqbridge fuzz TARGET``: a hypothesis campaign against tqbridge's kernels or a user's.

TARGET is ``quantize``, ``dequantize``, ``append``, ``decode-attention`` or ``module:function``.
Prints a progress line while it runs, then a summary; a counterexample is printed as a runnable
test (``@example`` + the failing call) and saved beside the example database. Exit code 0 when no
counterexample was found, 1 when one was.

TARGET ``gguf``, ``state-blob``, ``prompt-cache`` or ``kv-spelling`` runs a mutation campaign
against that file parser (:mod:`tqbridge.parity.plugin.parsers`): counts of mutants, clean errors,
crashes, hangs and over-allocations, peak memory; exit code 1 when anything but clean errors and
accepted inputs came out.
"""

from __future__ import annotations

import json
import sys

from .cli import CliError

BACKENDS = ("auto", "cpu-emulator", "cuda", "metal", "reference")


def _list(v):
    return None if v is None else [s.strip() for s in v.split(",") if s.strip()]


def add_arguments(p) -> None:
    p.add_argument("target", help="quantize | dequantize | append | decode-attention | module:function, or a "
                                  "parser: gguf | state-blob | prompt-cache | kv-spelling")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="kernel backend for append and decode-attention (default: auto); quantize and "
                        "dequantize check the MLX codecs on MLX's default device")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--examples", type=int, help="examples in all (default: from --profile)")
    g.add_argument("--minutes", type=float, help="run for this long instead of a number of examples")
    p.add_argument("--profile", default="ci", choices=("ci", "dev", "deep"),
                   help="ci: 60 examples, seed 0; dev: 300; deep: 3000 (random seed unless --seed)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--seed", type=int, help="base seed; give each machine of a spread campaign its own")
    p.add_argument("--db", help="example database root (default $TQBRIDGE_CACHE/fuzz, i.e. ~/.cache/tqbridge/fuzz), "
                                "or redis://HOST:PORT: a Redis server that campaigns on several machines share "
                                "(kernel targets; needs the cluster extra)")
    p.add_argument("--op", choices=("quantize", "dequantize", "append", "decode-attention"),
                   help="what a module:function target implements (else its @claims decorator)")
    p.add_argument("--format", dest="fmt", help="format(s) it claims, comma-separated (quantize/dequantize/append)")
    p.add_argument("--k-format", help="K format(s) of a decode-attention target, comma-separated")
    p.add_argument("--v-format", help="V format(s) of a decode-attention target, comma-separated")
    p.add_argument("--q-precision", choices=("exact", "int8"), default=None,
                   help="decode-attention: q's precision in every call (int8: kernel int8-mma wherever it serves the "
                        "pair; default: the backend's own choice per pair)")
    p.add_argument("--json", metavar="OUT", help="also write the summary as JSON to OUT")
    p.add_argument("--input-timeout", type=float, default=None, metavar="S",
                   help="parser targets: seconds one consumer may take on one input before it counts as a "
                        "hang (default 20)")


def run(args) -> int:
    from tqbridge.parity.plugin.fuzz import FuzzError, run_campaign
    from tqbridge.parity.plugin.parsers.named_targets import PARSER_TARGETS

    if args.target in PARSER_TARGETS:
        return run_parsers(args)
    if args.input_timeout is not None:
        raise CliError("--input-timeout applies to the parser targets (gguf, state-blob, prompt-cache, kv-spelling)")

    progress = _progress_printer()

    try:
        c = run_campaign(args.target, backend=args.backend, examples=args.examples, minutes=args.minutes,
                         profile=args.profile, jobs=args.jobs, seed=args.seed, db=args.db, op=args.op,
                         fmt=_list(args.fmt), k_format=_list(args.k_format), v_format=_list(args.v_format),
                         progress=progress, q_precision=args.q_precision)
    except FuzzError as e:
        raise CliError(str(e)) from None
    if sys.stderr.isatty():
        print(file=sys.stderr)
    s = c.summary()
    qp = f", q precision {c.q_precision}" if c.q_precision else ""
    print(f"tqbridge fuzz {c.target} (backend {c.backend}{qp}, {c.jobs} job{'s' if c.jobs > 1 else ''}, seed {c.seed})")
    print(f"  examples     {s['examples']}")
    print(f"  shapes       {s['shapes']} distinct")
    print(f"  formats      {len(s['formats'])}: {', '.join(s['formats'])}")
    print(f"  worst error  {s['worst_error_over_allowed']:.3g} of the allowed, over passing examples "
          "(hypothesis.target 'error / allowed')")
    print(f"  time         {s['seconds']:.1f} s")
    print(f"  database     {c.db}")
    if c.shared_db:
        print(f"  shared with  {c.shared_db}")
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
        from tqbridge.parity.harness.report import write_json

        write_json(args.json, s)
    if c.failure:
        return 1
    if c.errors:
        raise CliError(c.errors[0])
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def run_parsers(args) -> int:
    """``tqbridge fuzz gguf|state-blob|prompt-cache|kv-spelling``: a mutation campaign on a parser."""
    from tqbridge.parity.plugin.parsers.campaign import run_parser_campaign
    from tqbridge.parity.plugin.parsers.outcome import INPUT_TIMEOUT_S
    from tqbridge.parity.plugin.parsers.target import ParserFuzzError

    for flag in ("op", "fmt", "k_format", "v_format", "q_precision"):
        if getattr(args, flag):
            raise CliError(f"--{flag.replace('_', '-').replace('fmt', 'format')} does not apply to parser targets")
    if args.backend != "auto":
        raise CliError("--backend does not apply to parser targets")
    from tqbridge.parity.plugin.campaigns import is_shared_db

    if is_shared_db(args.db):
        raise CliError("--db redis:// applies to kernel targets; parser campaigns keep their findings in a folder")
    progress = _progress_printer()

    try:
        c = run_parser_campaign(args.target, examples=args.examples, minutes=args.minutes, profile=args.profile,
                                jobs=args.jobs, seed=args.seed, db=args.db,
                                input_timeout=INPUT_TIMEOUT_S if args.input_timeout is None else args.input_timeout,
                                progress=progress)
    except ParserFuzzError as e:
        raise CliError(str(e)) from None
    if sys.stderr.isatty():
        print(file=sys.stderr)
    s = c.summary()
    t = s["totals"]
    print(f"tqbridge fuzz {c.target} (parsers: {', '.join(c.consumers)}; {c.jobs} job{'s' if c.jobs > 1 else ''}, "
          f"seed {c.seed})")
    print(f"  mutants      {s['mutants']} ({s['replayed']} replayed from the database)")
    print(f"  seeds        {len(s['seeds'])}: " + ", ".join(f"{x['name']} ({x['bytes']} B)" for x in s["seeds"]))
    kinds = [k for k in ("ok", "clean", "long", "crash", "hang", "alloc", "inconsistent", "upstream")
             if k in ("ok", "clean", "crash", "hang", "alloc") or t[k]]
    width = max(len(x) for x in c.consumers)
    print("  " + " " * (width + 2) + "".join(f"{k:>13}" for k in kinds))
    for name in c.consumers:
        row = s["per_consumer"][name]
        print(f"  {name:<{width + 2}}" + "".join(f"{row[k]:>13}" for k in kinds))
    print(f"  {'all':<{width + 2}}" + "".join(f"{t[k]:>13}" for k in kinds))
    if s["peak_memory_growth_bytes"] is not None:
        worst = max(s["peak_memory_growth_bytes"].values(), default=0)
        print(f"  peak memory  largest growth in one call {_mib(worst)} (over-allocation: {s['alloc_limit']})")
    else:
        print("  peak memory  not measured here (no /proc/self/clear_refs); MemoryError still counts")
    print(f"  slowest call {max(s['slowest_call_s'].values(), default=0):.2f} s (hang: over {c.input_timeout:g} s)")
    print(f"  time         {s['seconds']:.1f} s")
    print(f"  database     {c.db}")
    for e in c.errors:
        print(f"  error        {e}")
    bad = [f for f in s["findings"] if f["kind"] in ("crash", "hang", "alloc", "inconsistent")]
    notes = [f for f in s["findings"] if f["kind"] not in ("crash", "hang", "alloc", "inconsistent")]
    for f in bad[:20] + notes[:10]:
        print(f"  {f['kind']:<12} {f['count']:>5} x {f['signature']}: {f['message'][:160]}")
        if f["saved"]:
            print(f"  {'':<12}         input {c.db}/findings/{f['saved'][0]}")
    if bad or c.errors:
        print(f"  result       {t['crash']} crashes, {t['hang']} hangs, {t['alloc']} over-allocations, "
              f"{t['inconsistent']} inconsistent")
    else:
        print(f"  result       0 tracebacks, 0 hangs, no over-allocation ({t['clean']} clean errors)")
    if args.json:
        from tqbridge.parity.harness.report import write_json

        write_json(args.json, s)
    if c.errors:
        raise CliError(c.errors[0])
    return 1 if bad else 0


def _progress_printer():
    """A campaign's progress line: rewritten in place on a terminal, every 10 s otherwise."""
    tty = sys.stderr.isatty()
    last = [0.0]

    def progress(c):
        if tty:
            print("\r" + c.progress_line(), end="", file=sys.stderr, flush=True)
        elif c.seconds - last[0] >= 10:
            last[0] = c.seconds
            print(c.progress_line(), file=sys.stderr, flush=True)
    return progress
