"""``tqbridge parity MODEL.gguf [--kv K/V ...] [--levels L,...] [--tokens N] [--exact-weights] [--json OUT]``.

Levels: ``blocks`` (same rows through ggml's C and every tqbridge path), ``attention`` (our decode
kernel vs ggml's ``flash_attn_ext`` vs a float64 oracle), ``logits`` (per-position KL between the
runtimes), ``cache`` (llama.cpp's cache bytes vs tqbridge's; F32 weights), ``teacher`` (every layer
fed llama.cpp's own K/V/q rows: cache bytes, rotation, attention and mask, per layer), ``lane`` (the GPU
decode lane's code — in-place append, window slides and growth, fused attention — on a real model with its
kernels on the CPU emulator, per layer and step against the append's reference bytes and the float64
oracle) and ``transplant`` (a prompt prefilled in llama.cpp, decoded in MLX, and back). ``all`` runs
every level.
"""

from __future__ import annotations

import shlex
import sys

from tqbridge.parity.harness.run_levels import (DEFAULT_LEVELS, EXIT_CODES_HELP, FORK_KV, FORK_RULES, LEVELS,
                                                RunOptions)
from tqbridge.tools.cli import CliError

__all__ = ["DEFAULT_LEVELS", "FORK_KV", "LEVELS", "add_arguments", "run"]


def qualify_turbo(spec: str, variant: str) -> str:
    from tqbridge.parity.harness import run_levels

    try:
        return run_levels.qualify_turbo(spec, variant)
    except ValueError as e:
        raise CliError(str(e)) from e


def parse_levels(spec: str) -> list[str]:
    from tqbridge.parity.harness import run_levels

    try:
        return run_levels.parse_levels(spec)
    except ValueError as e:
        raise CliError(str(e)) from e


def add_arguments(p) -> None:
    p.epilog = EXIT_CODES_HELP
    p.add_argument("model", help="a .gguf file, or a model name: smollm2, gemma3")
    p.add_argument("--kv", action="append", metavar="K/V",
                   help="K/V cache formats (repeatable), e.g. q8_0/q4_0; default: a matrix of llama.cpp's types")
    p.add_argument("--tokens", type=int, default=256, help="number of text tokens (default 256)")
    p.add_argument("--decode", type=int, default=None,
                   help="logits level: the last N of the tokens are decode steps (one token per evaluation) in "
                        "both runtimes — through tqbridge's decode kernel routing on the MLX side "
                        "(default: 16, at most half the tokens)")
    p.add_argument("--exact-weights", action="store_true",
                   help="both runtimes run an F32 copy of every tensor (converted once, cached)")
    p.add_argument("--no-rotation", action="store_true",
                   help="turn off the Hadamard rotation of quantized K/V rows in both runtimes "
                        "(llama.cpp rotates by default; tqbridge's cache follows)")
    p.add_argument("--levels", default=",".join(DEFAULT_LEVELS),
                   help=f"comma-separated levels from {', '.join(LEVELS)}, or 'all' (default: %(default)s)")
    p.add_argument("--llama", metavar="BUILD",
                   help="the llama.cpp side: a build directory (upstream or the TurboQuant fork; `tqbridge llama "
                        "build SRC` makes one) instead of llama-cpp-python's own; its turbo types become K/V choices "
                        "(default: $TQBRIDGE_LLAMA_BUILD, else llama-cpp-python)")
    p.add_argument("--fork-rules", choices=FORK_RULES, default="honour",
                   help="a TurboQuant fork build may store other cache types than asked (69d8e4b: K as q8_0 "
                        "for turbo K = V with 6+ query heads per KV head, TURBO_AUTO_ASYMMETRIC; per-layer V "
                        "types for a turbo2 V, TURBO_LAYER_ADAPTIVE). honour (default): read the types the "
                        "build stores, per layer, and give tqbridge's caches the same; off: switch the "
                        "fork's rules off for the run (both variables set to 0)")
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
    import os

    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path
    from tqbridge.parity.harness.level_logits import DEFAULT_KV
    from tqbridge.parity.harness.report import versions
    from tqbridge.parity.harness.run_levels import run_levels
    from tqbridge.parity.harness.runtimes import KV, llama_kv_types

    try:
        path = model_path(args.model)
    except (FileNotFoundError, ModelUnavailable) as e:
        raise CliError(str(e)) from e
    if args.tokens < 2:
        raise CliError(f"--tokens must be at least 2, got {args.tokens}")
    if getattr(args, "decode", None) is None:
        args.decode = min(16, args.tokens // 2)
    if not 0 <= args.decode < args.tokens:
        raise CliError(f"--decode must be in 0..{args.tokens - 1} (fewer than --tokens), got {args.decode}")
    fork_rules = getattr(args, "fork_rules", "honour")
    if fork_rules == "off":
        from tqbridge.bridge.llama.stored_kv import switch_off_fork_rules

        switch_off_fork_rules(os.environ)   # before any context: the fork reads them when it makes a cache
        print("note: the fork's automatic cache-type rules are off for this run (TURBO_AUTO_ASYMMETRIC=0, "
              "TURBO_LAYER_ADAPTIVE=0)", file=sys.stderr)
    from tqbridge.bridge.llama.side import selected

    fork = selected().variant if selected() is not None else None
    kv_list = args.kv or list(FORK_KV if fork else DEFAULT_KV)
    if fork:   # a bare turbo name means the fork build's variant, on both sides
        kv_list = [qualify_turbo(spec, fork) for spec in kv_list]
        if not args.no_rotation and _has_turbo(kv_list):
            # The PR #197 port applies upstream's KV rotation to every quantized type, turbo included (a
            # Hadamard on top of turbo's own rotation), which tqbridge's caches do not stack: with a turbo
            # type both runtimes run without it. ggml types alone keep it, in both forks as upstream rotates.
            args.no_rotation = True
            print("note: with a turbo cache type the KV rotation of quantized caches is off in both runtimes "
                  "(as --no-rotation)", file=sys.stderr)
    for spec in kv_list:
        try:
            kv = KV.parse(spec)
        except ValueError as e:
            raise CliError(str(e)) from e
        have = llama_kv_types()
        for f in (kv.k, kv.v):
            if f not in have:
                raise CliError(f"K/V {spec}: this llama.cpp has no cache type {f!r} (has: {', '.join(have)})"
                               + ("" if any(n.startswith("turbo") for n in have) else
                                  "; turbo types need the TurboQuant fork: --llama BUILD"))
    levels = parse_levels(args.levels)
    say = progress_printer(args.quiet)
    command = command or "tqbridge " + " ".join(map(shlex.quote, sys.argv[1:]))
    opts = RunOptions(tokens=args.tokens, decode=args.decode, exact_weights=args.exact_weights,
                      rotation=not args.no_rotation, fork_rules=fork_rules,
                      teacher_backends=tuple(getattr(args, "teacher_backends", None) or RunOptions.teacher_backends))

    def warn(line: str) -> None:
        print(line, file=sys.stderr)

    done = run_levels(path, kv_list, levels, opts, say=say, emit=print, warn=warn)
    if not args.quiet and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    report = {"tool": "tqbridge parity", "command": command, "versions": versions()}
    report.update(done.report)
    print_and_write(done, report, json_out=args.json, markdown_out=args.markdown)
    if args.plot:
        write_plots(args.plot, report)
    return done.code


def print_and_write(done, report: dict, *, json_out: "str | None", markdown_out: "str | None") -> None:
    """The logits table and the verdict line on stdout; the JSON and Markdown reports where asked."""
    from tqbridge.parity.harness.report import markdown, text_table, write_atomic, write_json
    from tqbridge.parity.harness.run_levels import verdict_line

    res = done.logits
    if res is not None:
        print(f"logits: {res.info['model']} ({res.info['weights']}), {res.tokens} tokens of {res.info['text']}, "
              f"{res.info['seconds']} s:")
        print(text_table(res.rows))
    print(verdict_line(done.verdicts))
    if json_out:
        write_json(json_out, report)
    if markdown_out and res is not None:
        write_atomic(markdown_out, markdown(report))


def write_plots(path: str, report: dict) -> None:
    """OUT.png: per-position KL (logits level); OUT-cache.png: per-layer cache agreement (cache level)."""
    from pathlib import Path

    from tqbridge.parity.harness.report import plot_cache_layers, plot_kl

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("note: --plot needs matplotlib (pip install 'tqbridge[plot]')", file=sys.stderr)
        return
    p = Path(path)
    if "logits" in report and report.get("info") and plot_kl(p, report):
        print(f"wrote {p}")
    cache_png = p.with_name(p.stem + "-cache" + p.suffix)
    if "cache" in report and report["cache"].get("kv") and plot_cache_layers(cache_png, report):
        print(f"wrote {cache_png}")


def _has_turbo(specs) -> bool:
    """Whether a K/V spelling of ``specs`` has a turbo half (a bad spelling is refused later, with its reason)."""
    from tqbridge.bridge.blocks.format_types import FormatError
    from tqbridge.bridge.blocks.registry import get_format
    from tqbridge.parity.harness.runtimes import KV

    for spec in specs:
        try:
            kv = KV.parse(spec)
            if any(get_format(f).kind == "turbo" for f in (kv.k, kv.v)):
                return True
        except (ValueError, FormatError):
            continue
    return False
