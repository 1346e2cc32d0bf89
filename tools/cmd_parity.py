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

from tqbridge.bridge.kv_spec import DEFAULT_FORMAT
from tqbridge.tools.cli import CliError

LEVELS = ("blocks", "attention", "logits", "cache", "teacher", "lane", "transplant")
# teacher belongs in every default: the default levels without it let through 5 of 7 planted MLX-side bugs
DEFAULT_LEVELS = ("blocks", "attention", "logits", "teacher")


# The default K/V matrix against a TurboQuant fork build: the configurations the port exists for.
FORK_KV = ("f16", "q8_0/turbo3", "q8_0/turbo4", "turbo3", "turbo4")


def qualify_turbo(spec: str, variant: str) -> str:
    """``q8_0/turbo3`` -> ``q8_0/turbo3@VARIANT``: a bare turbo name means the fork build's variant."""
    from tqbridge.parity.harness.runtimes import KV

    try:
        kv = KV.parse(spec)
    except ValueError as e:
        raise CliError(str(e)) from e
    k, v = (f"{x}@{variant}" if x.startswith("turbo") and "@" not in x else x for x in (kv.k, kv.v))
    return k if k == v else f"{k}/{v}"


def parse_levels(spec: str) -> list[str]:
    names = [x.strip().lower() for x in spec.split(",") if x.strip()]
    if names == ["all"]:
        return list(LEVELS)
    bad = [n for n in names if n not in LEVELS]
    if bad or not names:
        raise CliError(f"unknown level(s) {', '.join(bad) or '(none)'}; choose from {', '.join(LEVELS)} or 'all'")
    return [n for n in LEVELS if n in names]


def add_arguments(p) -> None:
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
    from tqbridge.parity.harness.level_logits import DEFAULT_KV, run_logits
    from tqbridge.bridge.models import ModelUnavailable, model_path
    from tqbridge.parity.harness.report import markdown, text_table, versions, write_atomic, write_json
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
    from tqbridge.bridge.llama_side import selected

    fork = selected().variant if selected() is not None else None
    kv_list = args.kv or list(FORK_KV if fork else DEFAULT_KV)
    if fork:   # a bare turbo name means the fork build's variant, on both sides
        kv_list = [qualify_turbo(spec, fork) for spec in kv_list]
        if not args.no_rotation:
            # The fork at 69d8e4b keeps upstream's KV rotation off by default; the PR #197 port applies it
            # to every quantized type, turbo included (a Hadamard on top of turbo's own rotation), which
            # tqbridge's caches do not stack. Both runtimes run without it against a fork.
            args.no_rotation = True
            print("note: against a TurboQuant fork build the KV rotation of quantized caches is off in both "
                  "runtimes (as --no-rotation)", file=sys.stderr)
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
    extra = run_other_levels(path, kv_list, levels, args, say)
    res = None
    if "logits" in levels:
        try:
            res = run_logits(path, kv_list, n_tokens=args.tokens, exact_weights=args.exact_weights,
                             rotation=not args.no_rotation, progress=say, decode=args.decode)
        except (GGUFModelError, ValueError) as e:
            raise CliError(str(e)) from e
        if not args.quiet and sys.stderr.isatty():
            sys.stderr.write("\r\033[K")
    verdicts = level_verdicts(levels, extra, None if res is None else res.passed)
    passed = all(v["passed"] for v in verdicts)
    report = {"tool": "tqbridge parity", "command": command, "versions": versions(), "levels": levels}
    if res is not None:
        report.update(info=res.info, logits=res.rows)
    report.update(extra)
    report.update(verdicts=verdicts, passed=passed)
    if res is not None:
        print(f"logits: {res.info['model']} ({res.info['weights']}), {res.tokens} tokens of {res.info['text']}, "
              f"{res.info['seconds']} s:")
        print(text_table(res.rows))
    print(verdict_line(verdicts))
    if args.json:
        write_json(args.json, report)
    if args.markdown and res is not None:
        write_atomic(args.markdown, markdown(report))
    if args.plot:
        write_plots(args.plot, report)
    return 0 if passed else 1


def level_verdicts(levels: "list[str]", extra: dict, logits_passed: "bool | None") -> "list[dict]":
    """One ``{"level", "passed"}`` per level that ran, in ``levels`` order; the exit code is their AND."""
    out = []
    for name in levels:
        if name == "logits":
            ok = logits_passed
        else:
            ok = extra.get(name, {}).get("passed")
        out.append({"level": name, "passed": bool(ok)})
    return out


def verdict_line(verdicts: "list[dict]") -> str:
    """The last line of the human output: every level that ran holds, or which ones failed."""
    failed = [v["level"] for v in verdicts if not v["passed"]]
    held = [v["level"] for v in verdicts if v["passed"]]
    if not failed:
        return f"all claims hold: {', '.join(held)}"
    return f"a parity claim FAILED: {', '.join(failed)}" + (f" (held: {', '.join(held)})" if held else "")


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
    if "logits" in report and plot_kl(p, report):
        print(f"wrote {p}")
    cache_png = p.with_name(p.stem + "-cache" + p.suffix)
    if "cache" in report and plot_cache_layers(cache_png, report):
        print(f"wrote {cache_png}")


def run_other_levels(path, kv_list: "list[str]", levels: "list[str]", args, say) -> dict:
    """Levels other than logits, each printed as it finishes; returns {level: JSON-ready dict}."""
    from tqbridge.parity.harness.runtimes import KV

    out: dict = {}
    if "blocks" in levels:
        from tqbridge.parity.harness.level_blocks import run_blocks_level, summary_lines

        say("blocks: ggml's C vs numpy, MLX and the append kernel")
        out["blocks"] = run_blocks_level()
        print(f"blocks: {'identical' if out['blocks']['passed'] else 'DIFFER'}")
        print("\n".join("  " + line for line in summary_lines(out["blocks"])))
    if "attention" in levels:
        from tqbridge.parity.harness.level_attention import run_attention_level, summary_lines as attention_lines

        say("attention: our decode kernel vs ggml's flash_attn_ext vs float64")
        pairs = [KV.parse(s).k + "/" + KV.parse(s).v for s in kv_list]
        out["attention"] = rep = run_attention_level(pairs)
        worst = max(e["bound_ratio"] for c in rep["cases"] for e in c["ours"].values())
        ggml = max((c["ggml_vs_oracle"]["nmse"] for c in rep["cases"] if c["ggml_vs_oracle"]), default=0.0)
        arith = [c["llama_arith_vs_ggml"] for c in rep["cases"] if c.get("llama_arith_vs_ggml")]
        arith_text = ""
        if arith:
            arith_text = (f"; ggml recomputed with its own arithmetic, {max(a['bound_ratio'] for a in arith):.2g}x "
                          "the derived bound" + ("" if all(a["passed"] for a in arith) else " (OVER it)"))
        print(f"attention: {'within' if rep['passed'] else 'OUTSIDE'} the float64 oracle's bound on "
              f"{len(rep['cases'])} cases (worst {worst:.2g}x the bound; ggml's own NMSE up to {ggml:.1e}"
              f"{arith_text}; information)")
        if not rep["passed"]:
            print("\n".join("  " + line for line in attention_lines(rep)
                             if "OUTSIDE" in line))
    if "cache" in levels or "transplant" in levels or "teacher" in levels or "lane" in levels:
        from tqbridge.bridge.gguf_f32 import cached_f32_gguf
        from tqbridge.parity.harness.level_logits import parity_text
        from tqbridge.parity.harness.runtimes import LlamaCppRuntime

        say("exact weights for the cache levels: F32 copy (cached)")
        f32 = cached_f32_gguf(path)
        text_ids = LlamaCppRuntime(f32).tokenize(parity_text()[0])
        tokens = text_ids[: args.tokens]
        rotation = not args.no_rotation
        if "cache" in levels:
            from tqbridge.parity.harness.level_cache import run_cache_level, summary_lines as cache_lines

            say("cache: llama.cpp's cache bytes vs tqbridge's")
            quantized = [s for s in kv_list if not KV.parse(s).is_float] or [DEFAULT_FORMAT]
            out["cache"] = rep = run_cache_level(str(f32), tokens, quantized, rotation=False,
                                                 runtimes=quantized[:1])
            print(f"cache: layer-0 bytes {'identical' if rep['passed'] else 'DIFFER'}")
            print("\n".join("  " + line for line in cache_lines(rep)))
        if "teacher" in levels:
            from tqbridge.parity.harness.level_teacher import run_teacher, summary_lines as teacher_lines

            say("teacher forcing: llama.cpp's own rows through tqbridge, layer by layer")
            specs = [KV.parse(s).name for s in kv_list]
            backends = getattr(args, "teacher_backends", None) or ("reference", "cpu-emulator")
            out["teacher"] = rep = run_teacher(str(f32), tokens, specs, decode=min(4, args.decode),
                                               rotation=rotation, backends=backends, progress=say)
            print(f"teacher: {'every layer holds' if rep['passed'] else 'a layer FAILED'} "
                  f"({len(specs)} K/V pairs, {rep['tokens']} tokens, {rep['decode']} decode steps)")
            print("\n".join("  " + line for line in teacher_lines(rep)))
        if "lane" in levels:
            from tqbridge.parity.harness.level_lane import LANE_TOKENS, run_lane, summary_lines as lane_lines

            say("lane: the GPU decode lane on the CPU emulator, layer by layer")
            # one K/V pair, as the cache level: the lane's bookkeeping does not depend on the format
            pair = next((s for s in kv_list if not KV.parse(s).is_float), kv_list[0])
            out["lane"] = rep = run_lane(str(f32), text_ids[:LANE_TOKENS], pair, rotation=rotation, progress=say)
            print(f"lane: {'every layer and decode step holds' if rep['passed'] else 'a claim FAILED'} "
                  f"({rep['kv']}, {rep['decode']} decode steps, {rep['slides']} window slides, {rep['seconds']} s)")
            print("\n".join("  " + line for line in lane_lines(rep)))
        if "transplant" in levels:
            from tqbridge.parity.harness.transplant import run_transplant

            say("transplant: llama.cpp prefill -> MLX decode, and back")
            n_new = 16
            rep = run_transplant(str(f32), tokens[:64], "f16", n_new=n_new, rotation=rotation)
            rep["passed"] = rep["forward_agree"] == n_new
            out["transplant"] = rep
            print(f"transplant (f16): {rep['forward_agree']}/{n_new} greedy tokens agree llama.cpp -> MLX, "
                  f"{rep.get('reverse_agree', '-')}/{n_new} MLX -> llama.cpp")
            turbo = next((s for s in kv_list if "turbo" in s), None)
            if turbo is not None:   # a fork build: its turbo blob into TQCache unchanged, and back
                say(f"transplant: {turbo}")
                t = run_transplant(str(f32), tokens[:64], turbo, n_new=n_new, rotation=rotation)
                # claim: the fork's blocks pass through TQCache byte for byte and the fork takes MLX's blob
                # back; greedy agreement of a quantized cache is information (quantization steps flip)
                t["passed"] = bool(t["blob_round_trip_bytes_equal"] and "llama_from_mlx_state" in t)
                rep["turbo"] = t
                rep["passed"] = rep["passed"] and t["passed"]
                print(f"transplant ({t['kv']}): the fork's blob through TQCache and back "
                      f"{'byte-identical' if t['blob_round_trip_bytes_equal'] else 'DIFFERS'}; "
                      f"{t['forward_agree']}/{n_new} greedy tokens agree fork -> MLX, "
                      f"{t.get('reverse_agree', '-')}/{n_new} MLX -> fork (information)")
    return out
