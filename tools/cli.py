"""The ``tqbridge`` command: one module per subcommand (``tqbridge.tools.cmd_<name>``).

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``. Modules are
imported only when their subcommand runs, so ``tqbridge --help`` stays fast and a missing optional
dependency only affects the subcommand that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "formats": ("cmd_formats", "list the block format registry"),
    "selfcheck": ("cmd_selfcheck", "check our quantizers byte-for-byte against ggml's C code"),
    "inspect": ("cmd_inspect", "tensors and metadata of a GGUF file; decode one block"),
    "generate": ("cmd_generate", "generate text from a GGUF model through the tqbridge KV cache"),
    "quality": ("cmd_quality", "KL and top-1 of K/V cache formats vs the f16 cache, with bytes per token"),
    "convert": ("cmd_convert", "GGUF -> mlx-lm model directory, or GGUF with every tensor in F32"),
    "parity": ("cmd_parity", "llama.cpp vs MLX on the same GGUF: blocks, attention, logits, cache, KV transplant"),
    "bench": ("cmd_bench", "time decode end to end through mlx-lm (bench decode) or the attention kernel alone (bench attention)"),
    "demo": ("cmd_demo", "parity (blocks, attention, logits, teacher) on SmolLM2-135M with a default KV matrix"),
    "fuzz": ("cmd_fuzz", "hypothesis campaign against tqbridge's kernels or your own (module:function)"),
    "llama": ("cmd_llama", "build a llama.cpp checkout (upstream or the TurboQuant fork) for --llama; say what a build holds"),
    "archs": ("cmd_archs", "the GGUF architectures the model loader builds; llama.cpp vs MLX on a tiny model of each"),
    "campaign": ("cmd_campaign", "run a matrix of tqbridge commands as Ray tasks, locally or on a cluster; resumable"),
    "serve": ("cmd_serve", "mlx-lm's OpenAI-compatible server with TQCache layers (prompt-cache reuse across requests)"),
    "evidence": ("cmd_evidence", "the evidence llama.cpp asks of a new KV type: perplexity, KLD, CPU speed, flash_attn_ext cases, one report"),
    "records": ("cmd_records", "the benchmark records: check them against the schema, write their index, file a new one"),
}


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def select_llama_build(args) -> None:
    """Make ``--llama BUILD`` (or ``TQBRIDGE_LLAMA_BUILD``) this process's llama.cpp side, before the
    command loads any llama.cpp library; every command that runs llama.cpp honours it."""
    import os

    build = getattr(args, "llama", None) or os.environ.get("TQBRIDGE_LLAMA_BUILD")
    if not build or args.command == "llama":
        return
    from tqbridge.bridge.llama.build import select
    from tqbridge.bridge.llama.side import LlamaBuildError

    try:
        info = select(build)
    except LlamaBuildError as e:
        raise CliError(str(e)) from e
    print(f"llama.cpp side: {info.label()}", file=sys.stderr)


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tqbridge",
        description="Byte-exact KV-cache block formats, fused decode-attention kernels, and parity checks "
                    "between llama.cpp and MLX.")
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("tqbridge")
    except PackageNotFoundError:  # pragma: no cover
        ver = "unknown"
    parser.add_argument("--version", action="version", version=f"tqbridge {ver}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else list(argv)
    # Build only the parser of the subcommand being run (keeps imports lazy).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen in COMMANDS:
        from tqbridge.bridge.mlx_blas import prefer_fast_blas

        prefer_fast_blas()  # before the subcommand's module imports MLX (Linux CPU: OpenBLAS if installed)
    passes = False   # a subcommand that hands the options it does not know to another program
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            mod = importlib.import_module(f"tqbridge.tools.{module}")
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
            passes = getattr(mod, "PASS_UNKNOWN_OPTIONS", False)
    if passes:
        args, args.passthrough = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        select_llama_build(args)
        return int(args._run(args) or 0)
    except CliError as e:
        print(f"tqbridge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from tqbridge.bridge.llama.side import LlamaBuildError

        if not isinstance(e, LlamaBuildError):
            raise
        print(f"tqbridge {args.command}: error: {e}", file=sys.stderr)   # e.g. the build refuses a K/V pair
        return 2
    except ImportError as e:
        from tqbridge.bridge.llama.compat import LlamaCppIncompatible

        if not isinstance(e, LlamaCppIncompatible):
            raise
        print(f"tqbridge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # pragma: no cover
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    # Run through the package module so subcommands raise the same CliError class this module catches.
    from tqbridge.tools.cli import main as _main

    sys.exit(_main())
