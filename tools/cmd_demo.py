"""``tqbridge demo``: parity of llama.cpp and MLX on SmolLM2-135M (exact weights, default KV matrix)."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    from tqbridge.parity.harness.run_levels import EXIT_CODES_HELP

    p.epilog = EXIT_CODES_HELP
    p.add_argument("--tokens", type=int, default=256, help="number of text tokens (default 256)")
    p.add_argument("--json", metavar="OUT", help="write the full report as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the summary as Markdown")


# The demo's levels: parity's defaults plus teacher forcing (every layer fed llama.cpp's own rows;
# ~25 s of the demo on 2 cores). Its attention check runs the MLX-ops reference only: the fused kernel on
# the CPU emulator is compiled per geometry and format pair (seconds each on a fresh machine), and the
# attention level already runs it on every pair; `tqbridge parity --levels teacher` runs both.
DEMO_LEVELS = ("blocks", "attention", "logits", "teacher")
DEMO_TEACHER_BACKENDS = ("reference",)


def run(args) -> int:
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path
    from tqbridge.parity.harness.level_logits import DEFAULT_KV
    from tqbridge.parity.harness.report import versions
    from tqbridge.parity.harness.run_levels import RunOptions, run_levels
    from tqbridge.tools.cli import CliError
    from tqbridge.tools.cmd_parity import print_and_write, progress_printer

    if args.tokens < 2:
        raise CliError(f"--tokens must be at least 2, got {args.tokens}")
    try:
        path = model_path("smollm2")
    except (FileNotFoundError, ModelUnavailable) as e:
        raise CliError(str(e)) from e
    levels = list(DEMO_LEVELS)
    opts = RunOptions(tokens=args.tokens, decode=min(16, args.tokens // 2), exact_weights=True, rotation=True,
                      teacher_backends=DEMO_TEACHER_BACKENDS)
    done = run_levels(path, list(DEFAULT_KV), levels, opts, say=progress_printer(False), emit=print,
                      warn=lambda line: print(line, file=sys.stderr))
    report = {"tool": "tqbridge parity", "versions": versions(),
              "command": f"tqbridge parity smollm2 --exact-weights --tokens {args.tokens} --levels {','.join(levels)}"}
    report.update(done.report)
    print_and_write(done, report, json_out=args.json, markdown_out=args.markdown)
    return done.code
