"""``tqbridge serve MODEL [--kv K/V] [mlx-lm server options]``: mlx-lm's OpenAI-compatible server with
TQCache layers (the logic is :mod:`tqbridge.metal.lm.serve`)."""

from __future__ import annotations

from tqbridge.bridge.blocks.kv_spec import EXAMPLE_KV, GENERATE_KV

from .cli import CliError

# options this command does not know go to mlx-lm's server (tools/cli.py reads this flag)
PASS_UNKNOWN_OPTIONS = True


def add_arguments(p) -> None:
    p.description = ("mlx-lm's OpenAI-compatible server (mlx_lm.server) with TQCache layers. Options after MODEL "
                     "that tqbridge does not know go to mlx-lm's server (--host, --port, --max-tokens, "
                     "--prompt-cache-size, ...; see mlx_lm.server --help). Requests are served one at a time, "
                     "with prompt-cache reuse across requests.")
    p.add_argument("model", help="GGUF model file, a model name (smollm2, gemma3; converted once to an mlx-lm "
                                 "directory), or an mlx-lm model directory (tqbridge convert MODEL --to mlx DIR)")
    p.add_argument("--kv", default=GENERATE_KV,
                   help=f"K/V cache formats, e.g. {EXAMPLE_KV} (default {GENERATE_KV}); per layer as in "
                        "tqbridge generate")
    p.add_argument("--rotation", choices=["llama", "none"], default="llama",
                   help="Hadamard-rotate K/V rows of ggml quantized formats as llama.cpp does (default), or not")
    p.add_argument("--sliding", choices=["quantize", "float"], default="quantize",
                   help="sliding-window layers: quantized like the rest, or mlx-lm's float rotating cache")
    p.add_argument("--decode", choices=["auto", "kernel", "reference"], default="auto",
                   help="decode attention: auto (fused kernel on a GPU), kernel, or the ops reference")


def run(args) -> int:
    from tqbridge.bridge import FormatError
    from tqbridge.bridge.blocks.kv_spec import parse_layered_kv_spec
    from tqbridge.metal.lm.serve import ServeError, check_address, check_layers, check_server_args, model_dir, run_server

    extra = list(getattr(args, "passthrough", []))
    try:
        kv = parse_layered_kv_spec(args.kv)
        check_server_args(extra)
        check_address(extra)
        directory = model_dir(args.model)
        check_layers(directory, kv)
    except (FormatError, ServeError) as e:
        raise CliError(str(e)) from None
    print(f"tqbridge serve: {directory} with TQCache {kv.name} (rotation {args.rotation}, sliding {args.sliding}, "
          f"decode {args.decode})", flush=True)
    try:
        run_server(directory, kv, extra, sliding=args.sliding, rotation=args.rotation, decode=args.decode)
    except (FormatError, ServeError) as e:
        raise CliError(str(e)) from None
    return 0
