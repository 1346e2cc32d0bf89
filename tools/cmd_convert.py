"""``tqbridge convert MODEL.gguf --to mlx DIR [--dequantize] | --to gguf-f32 OUT.gguf``;
KV caches: ``tqbridge convert SESSION.bin --to prompt-cache OUT.safetensors --model MODEL.gguf [--kv K/V]``
and ``tqbridge convert CACHE.safetensors --to session|sequence-state OUT.bin --model MODEL.gguf [--kv K/V]``."""

from __future__ import annotations

import time
from pathlib import Path

from tqbridge.tools.cli import CliError


CACHE_TARGETS = ("prompt-cache", "session", "sequence-state")


def add_arguments(p) -> None:
    p.add_argument("model", metavar="INPUT",
                   help="a .gguf file or model name (smollm2, gemma3) for --to mlx / gguf-f32; a llama.cpp session "
                        "or sequence-state file for --to prompt-cache; an mlx-lm prompt cache for --to session / "
                        "sequence-state")
    p.add_argument("--to", required=True, choices=["mlx", "gguf-f32", *CACHE_TARGETS],
                   help="mlx: an mlx-lm model directory; gguf-f32: every tensor dequantized to F32; prompt-cache: "
                        "an mlx-lm prompt cache of TQCache layers; session: a llama.cpp session file "
                        "(llama_state_load_file, llama-cli --prompt-cache); sequence-state: a llama.cpp "
                        "sequence-state file (llama_state_seq_load_file, llama-server slots)")
    p.add_argument("out", help="output directory (--to mlx) or file")
    p.add_argument("--dequantize", action="store_true",
                   help="--to mlx: every tensor float32 (default: quantized weights stay quantized as MLX "
                        "affine layers wherever that is exact, the rest float32)")
    p.add_argument("--model", dest="cache_model", metavar="MODEL",
                   help="KV caches: the model's .gguf (or smollm2, gemma3): its geometry and vocabulary are "
                        "checked against the cache")
    p.add_argument("--kv", metavar="K/V",
                   help="KV caches: re-quantize to this pair from the decoded values (default: the blocks "
                        "move unchanged)")
    p.add_argument("--rotation", choices=["llama", "none"], default="llama",
                   help="KV caches: llama.cpp's Hadamard rotation of quantized K/V rows: llama (its default) or "
                        "none (llama.cpp run with LLAMA_ATTN_ROT_DISABLE=1)")


def run(args) -> int:
    if args.to in CACHE_TARGETS:
        return _run_cache(args)
    if args.cache_model or args.kv:
        raise CliError("--model and --kv apply to KV caches (--to prompt-cache, session, sequence-state)")
    from tqbridge.bridge.gguf.f32 import write_f32_gguf
    from tqbridge.bridge.gguf.model import GGUFModelError
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    if args.dequantize and args.to != "mlx":
        raise CliError("--dequantize applies to --to mlx only (gguf-f32 is always dequantized)")
    try:
        src = model_path(args.model)
    except (FileNotFoundError, ModelUnavailable) as e:
        raise CliError(str(e)) from e
    out = Path(args.out)
    t0 = time.perf_counter()
    try:
        if args.to == "mlx":
            write_mlx_dir(src, out, quantize=not args.dequantize)
        else:
            if out.exists():
                raise CliError(f"{out}: already exists; choose a new file name")
            write_f32_gguf(src, out)
    except GGUFModelError as e:
        raise CliError(str(e)) from e
    kind = args.to if args.to != "mlx" else ("mlx, float32" if args.dequantize else "mlx, quantized where exact")
    print(f"wrote {out} ({kind}) from {src.name} in {time.perf_counter() - t0:.1f} s")
    if args.to == "mlx":
        import json

        note = json.loads((out / "config.json").read_text()).get("tqbridge", {}).get("tokenizer_note")
        print(f"  tokenizer: {note}")   # the tokenizer files written, or why there are none
    if args.to == "mlx" and not args.dequantize:
        _print_placed(out)
    return 0


def _print_placed(out: Path) -> None:
    """Where the GGUF's tensors went (config.json's tqbridge.placed, counted), and why the float32 ones."""
    import json

    info = json.loads((out / "config.json").read_text()).get("tqbridge", {})
    counts: dict[str, int] = {}
    for where in info.get("placed", {}).values():
        counts[where] = counts.get(where, 0) + 1
    for where, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:5d} x {where}")
    for key, why in info.get("why_float32", {}).items():
        print(f"  float32 {key}: {why}")


def _run_cache(args) -> int:
    from tqbridge.bridge.blocks.format_types import FormatError
    from tqbridge.bridge.gguf.model import GGUFModelError
    from tqbridge.bridge.llama.state import StateError
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    if args.dequantize:
        raise CliError("--dequantize applies to --to mlx only")
    if not args.cache_model:
        raise CliError(f"--to {args.to} needs --model MODEL.gguf (the model the cache belongs to)")
    try:
        gguf = model_path(args.cache_model)
    except (FileNotFoundError, ModelUnavailable) as e:
        raise CliError(str(e)) from e
    if not Path(args.model).is_file():
        raise CliError(f"{args.model}: no such file")
    from tqbridge.metal.lm.prompt_cache_convert import (ConvertError, prompt_cache_to_session,
                                                        session_to_prompt_cache)

    t0 = time.perf_counter()
    try:
        if args.to == "prompt-cache":
            s = session_to_prompt_cache(args.model, args.out, gguf, kv=args.kv, rotation=args.rotation)
        else:
            kind = "session" if args.to == "session" else "sequence"
            s = prompt_cache_to_session(args.model, args.out, gguf, kv=args.kv, rotation=args.rotation, kind=kind)
    except (StateError, ConvertError, GGUFModelError, FormatError) as e:
        raise CliError(str(e)) from e
    print(f"wrote {args.out} ({args.to}) from {Path(args.model).name} in {time.perf_counter() - t0:.1f} s: "
          f"{s['layers']} layers x {s['tokens']} tokens, {s['from']} -> {s['to']} ({s['blocks']}; "
          f"rotation {s['rotation']}), {s['kv_bytes']} bytes of K/V blocks")
    return 0
