"""``tqbridge archs [--parity [ARCH ...]] [--tokens N] [--decode N] [--json OUT]``.

Without ``--parity``: the GGUF architectures the model loader builds, the mlx-lm model_type each
becomes and what is particular to it. With ``--parity``: each architecture's tiny random-weight GGUF
(``tqbridge.bridge.gguf.fixtures``) through llama.cpp and MLX, KL per position in three
configurations (``tqbridge.parity.harness.archs``); exit code 1 when a claim fails.
"""

from __future__ import annotations

import shlex
import sys

from tqbridge.tools.cli import CliError


def add_arguments(p) -> None:
    p.add_argument("--parity", nargs="*", metavar="ARCH", default=None,
                   help="compare llama.cpp and MLX on each architecture's tiny random-weight model "
                        "(all of them, or the ARCHs named)")
    p.add_argument("--tokens", type=int, default=None, help="token ids per model (default 64)")
    p.add_argument("--decode", type=int, default=None,
                   help="the last N of them are decode steps, one token per evaluation (default 8)")
    p.add_argument("--json", metavar="OUT", help="write the table or the parity report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def run(args) -> int:
    from tqbridge.parity.harness import archs as A
    from tqbridge.parity.harness.report import versions, write_json

    command = "tqbridge " + " ".join(map(shlex.quote, sys.argv[1:]))
    if args.parity is None:
        if args.tokens is not None or args.decode is not None:
            raise CliError("--tokens and --decode apply to --parity")
        rows = A.supported()
        print(_table(["GGUF arch", "mlx-lm model_type", "tiny fixture", "what is particular"],
                     [[r["arch"], r["model_type"], "yes" if r["fixture"] else "-", r["note"]] for r in rows]))
        if args.json:
            write_json(args.json, {"tool": "tqbridge archs", "command": command, "versions": versions(),
                                   "archs": rows})
        return 0
    n_tokens = A.DEFAULT_TOKENS if args.tokens is None else args.tokens
    decode = A.DEFAULT_DECODE if args.decode is None else args.decode
    if n_tokens < 2:
        raise CliError(f"--tokens must be at least 2, got {n_tokens}")
    if not 0 <= decode < n_tokens:
        raise CliError(f"--decode must be in 0..{n_tokens - 1} (fewer than --tokens), got {decode}")
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tqbridge-archs-") as tmp:
        try:
            rows = A.run_archs(tmp, args.parity or None, n_tokens=n_tokens, decode=decode, progress=say)
        except ValueError as e:
            raise CliError(str(e)) from e
    head = ["GGUF arch", "mlx-lm model_type"]
    for c in A.CONFIGS:
        head += [f"{c.name}: KL mean / max", f"{c.name}: verdict"]
    body = []
    for r in rows:
        line = [r["arch"], r["model_type"]]
        for c in A.CONFIGS:
            x = r[c.name]
            line += [f"{x['kl_mean']:.2g} / {x['kl_max']:.2g}", {True: "pass", False: "FAIL", None: "-"}[x["pass"]]]
        body.append(line)
    print(_table(head, body))
    print(f"exact = f32 cache, llama.cpp flash attention off: KL at every position <= {A.EXACT_KL_GOAL:g} "
          f"({A.GELU_TABLE_KL_GOAL:g} where GELU is ggml's fp16 table); f16 = f16 cache, flash attention off: "
          f"mean KL <= {A.ARCH_KL_GOAL:g}; f16-fa = f16 cache, flash attention on: reported; every judged row "
          f"needs a mean entropy >= {A.MIN_ENTROPY:g} nats")
    passed = all(r["pass"] for r in rows)
    if args.json:
        write_json(args.json, {
            "tool": "tqbridge archs --parity", "command": command, "versions": versions(), "tokens": n_tokens,
            "decode_steps": decode, "token_seed": 1,
            "configs": [{"name": c.name, "kv": c.kv, "flash_attn": c.flash_attn, "stat": c.stat} for c in A.CONFIGS],
            "goals": {"EXACT_KL_GOAL": A.EXACT_KL_GOAL, "GELU_TABLE_KL_GOAL": A.GELU_TABLE_KL_GOAL,
                      "ARCH_KL_GOAL": A.ARCH_KL_GOAL, "MIN_ENTROPY": A.MIN_ENTROPY},
            "archs": rows, "passed": passed})
    print(f"{sum(r['pass'] for r in rows)} of {len(rows)} architectures pass")
    return 0 if passed else 1
