"""``tqbridge demo``: parity of llama.cpp and MLX on SmolLM2-135M (exact weights, default KV matrix)."""

from __future__ import annotations

import argparse


def add_arguments(p) -> None:
    p.add_argument("--tokens", type=int, default=256, help="number of text tokens (default 256)")
    p.add_argument("--json", metavar="OUT", help="write the full report as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the summary as Markdown")


def run(args) -> int:
    from tqbridge.tools import cmd_parity

    parity_args = argparse.Namespace(model="smollm2", kv=None, tokens=args.tokens, decode=16, exact_weights=True,
                                     no_rotation=False, json=args.json, markdown=args.markdown,
                                     plot=None, quiet=False, levels=",".join(cmd_parity.DEFAULT_LEVELS))
    cmd = f"tqbridge parity smollm2 --exact-weights --tokens {args.tokens}"
    return cmd_parity.run(parity_args, command=cmd)
