"""``tqbridge parity MODEL.gguf [--kv K/V ...] [--tokens N] [--exact-weights] [--json OUT] [--markdown OUT]``."""

from __future__ import annotations

import shlex
import sys

from tqbridge.tools.cli import CliError


def add_arguments(p) -> None:
    p.add_argument("model", help="a .gguf file, or a model name: smollm2, gemma3")
    p.add_argument("--kv", action="append", metavar="K/V",
                   help="K/V cache formats (repeatable), e.g. q8_0/q4_0; default: a matrix of llama.cpp's types")
    p.add_argument("--tokens", type=int, default=256, help="number of text tokens (default 256)")
    p.add_argument("--exact-weights", action="store_true",
                   help="both runtimes run an F32 copy of every tensor (converted once, cached)")
    p.add_argument("--no-rotation", action="store_true",
                   help="turn off the Hadamard rotation of quantized K/V rows in both runtimes "
                        "(llama.cpp rotates by default; tqbridge's cache follows)")
    p.add_argument("--json", metavar="OUT", help="write the full report as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the summary as Markdown")
    p.add_argument("--plot", metavar="OUT.png", help="plot per-position KL (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def progress_printer(quiet: bool):
    def say(msg: str) -> None:
        if not quiet:
            sys.stderr.write(f"\r\033[K{msg}" if sys.stderr.isatty() else f"{msg}\n")
            sys.stderr.flush()
    return say


def run(args, command: "str | None" = None) -> int:
    from tqbridge.bridge.gguf_model import GGUFModelError
    from tqbridge.parity.level_logits import DEFAULT_KV, run_logits
    from tqbridge.parity.models import ModelUnavailable, model_path
    from tqbridge.parity.report import markdown, plot_kl, text_table, versions, write_atomic, write_json
    from tqbridge.parity.runtimes import KV, LLAMA_KV_TYPES

    try:
        path = model_path(args.model)
    except (FileNotFoundError, ModelUnavailable) as e:
        raise CliError(str(e)) from e
    if args.tokens < 2:
        raise CliError(f"--tokens must be at least 2, got {args.tokens}")
    kv_list = args.kv or list(DEFAULT_KV)
    for spec in kv_list:
        try:
            kv = KV.parse(spec)
        except ValueError as e:
            raise CliError(str(e)) from e
        for f in (kv.k, kv.v):
            if f not in LLAMA_KV_TYPES:
                raise CliError(f"K/V {spec}: llama.cpp has no cache type {f!r} (has: {', '.join(LLAMA_KV_TYPES)})")
    say = progress_printer(args.quiet)
    try:
        res = run_logits(path, kv_list, n_tokens=args.tokens, exact_weights=args.exact_weights,
                         rotation=not args.no_rotation, progress=say)
    except (GGUFModelError, ValueError) as e:
        raise CliError(str(e)) from e
    if not args.quiet and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    report = {"tool": "tqbridge parity", "command": command or "tqbridge " + " ".join(map(shlex.quote, sys.argv[1:])),
              "versions": versions(), "info": res.info, "logits": res.rows, "passed": res.passed}
    print(f"{res.info['model']} ({res.info['weights']}), {res.tokens} tokens of {res.info['text']}:")
    print(text_table(res.rows))
    print(f"{'all claims hold' if res.passed else 'a parity claim FAILED'} ({res.info['seconds']} s)")
    if args.json:
        write_json(args.json, report)
    if args.markdown:
        write_atomic(args.markdown, markdown(report))
    if args.plot and plot_kl(args.plot, report) is None:
        print("note: --plot needs matplotlib (pip install 'tqbridge[plot]')", file=sys.stderr)
    return 0 if res.passed else 1
