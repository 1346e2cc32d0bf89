"""``tqbridge convert MODEL.gguf --to mlx DIR [--dequantize] | --to gguf-f32 OUT.gguf``."""

from __future__ import annotations

import time
from pathlib import Path

from tqbridge.tools.cli import CliError


def add_arguments(p) -> None:
    p.add_argument("model", help="input .gguf file (or a model name: smollm2, gemma3)")
    p.add_argument("--to", required=True, choices=["mlx", "gguf-f32"],
                   help="mlx: an mlx-lm model directory; gguf-f32: every tensor dequantized to F32")
    p.add_argument("out", help="output directory (--to mlx) or .gguf file (--to gguf-f32)")
    p.add_argument("--dequantize", action="store_true",
                   help="--to mlx: every tensor float32 (default: quantized weights stay quantized as MLX "
                        "affine layers wherever that is exact, the rest float32)")


def run(args) -> int:
    from tqbridge.bridge.gguf_f32 import write_f32_gguf
    from tqbridge.bridge.gguf_model import GGUFModelError
    from tqbridge.bridge.mlx_export import write_mlx_dir
    from tqbridge.bridge.models import ModelUnavailable, model_path

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
