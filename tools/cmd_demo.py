"""``tqbridge demo``: parity of llama.cpp and MLX on SmolLM2-135M (exact weights, default KV matrix)."""

from __future__ import annotations

import argparse


def add_arguments(p) -> None:
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
    from tqbridge.tools import cmd_parity

    levels = ",".join(DEMO_LEVELS)
    parity_args = argparse.Namespace(model="smollm2", kv=None, tokens=args.tokens, decode=16, exact_weights=True,
                                     no_rotation=False, json=args.json, markdown=args.markdown,
                                     plot=None, quiet=False, levels=levels, teacher_backends=DEMO_TEACHER_BACKENDS)
    cmd = f"tqbridge parity smollm2 --exact-weights --tokens {args.tokens} --levels {levels}"
    return cmd_parity.run(parity_args, command=cmd)
