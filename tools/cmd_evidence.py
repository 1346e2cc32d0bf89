"""``tqbridge evidence MODEL --llama BUILD --kv TYPE ...``: the evidence llama.cpp's CONTRIBUTING.md asks of a
new quantization type (perplexity, KLD, CPU speed, flash_attn_ext cases, the MLX side), in one report."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from tqbridge.bridge.blocks.kv_spec import kv_name, qualify_variant

from .cli import CliError

PARTS = ("quality", "speed", "kernels", "mlx")


def add_arguments(p) -> None:
    p.add_argument("model", help="GGUF model file, or a model name: smollm2, gemma3")
    p.add_argument("--llama", default=None, help="a llama.cpp build folder (the fork for turbo types); "
                                                 "default: llama-cpp-python's own llama.cpp")
    p.add_argument("--kv", action="append", default=[], metavar="TYPE_OR_PAIR",
                   help="the new cache type or K/V pair (repeatable), e.g. turbo3 or q8_0/turbo3")
    p.add_argument("--baseline", default="q8_0", help="the type KLD is also taken from (default q8_0)")
    p.add_argument("--text", default=None, help="a text file instead of the stdlib's pydoc_data.topics")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk, as llama-perplexity's -c (default 512)")
    p.add_argument("--chunks", type=int, default=8, help="chunks to score; 0: every whole chunk (default 8)")
    p.add_argument("--out", default="evidence", help="folder for evidence.md/.json/.png and the resume cache")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)} (default all)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--speed-reps", type=int, default=3, help="interleaved repetitions of the speed runs (default 3)")
    p.add_argument("--case", default=None, help="re-run one flash_attn_ext case by its id and print it")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args) -> int:
    from tqbridge.bridge.llama.side import selected
    from tqbridge.parity import evidence as ev
    from tqbridge.parity.evidence_report import write_all
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime, llama_kv_types

    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.case:
        try:
            row = ev.run_case(ev.parse_case_id(args.case))
        except ev.EvidenceError as e:
            raise CliError(str(e)) from e
        print(f"{row['id']}: NMSE build vs ours {row['nmse_build_vs_ours']:.3e}, build vs oracle "
              f"{row['nmse_build_vs_oracle']:.3e}, ours vs oracle {row['nmse_ours_vs_oracle']:.3e} "
              f"(bar {ev.NMSE_BAR:g}); ours within the oracle's bound: {row['ours_within_oracle_bound']}: "
              f"{'pass' if row['passed'] else 'FAIL'}")
        return 0 if row["passed"] else 1
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS):
        raise CliError(f"--parts takes a comma list of {', '.join(PARTS)}, got {args.parts!r}")
    if args.speed_reps < 1:
        raise CliError(f"--speed-reps must be at least 1, got {args.speed_reps}")
    if not args.kv:
        raise CliError("give the new type with --kv TYPE_OR_PAIR (e.g. --kv turbo3)")
    from .cmd_generate import resolve_model

    path = Path(resolve_model(args.model))
    if args.text:
        try:
            text, source = Path(args.text).read_text(encoding="utf-8"), Path(args.text).name
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"--text {args.text}: {e}") from e
    else:
        from tqbridge.bridge.evaluation_text import evaluation_text

        text, source = evaluation_text()
    build = selected()
    variant = build.variant if build is not None else None
    # a bare turbo name means the build's own variant (as tqbridge parity reads it)
    kvs = []
    for spec in [*args.kv, args.baseline]:
        try:
            kv = ev.parse_kv(spec)
        except ev.EvidenceError as e:
            raise CliError(str(e)) from e
        q = [qualify_variant(f, variant) for f in (kv.k, kv.v)]
        have = llama_kv_types()
        for f in q:
            if f not in have:
                raise CliError(f"{spec}: this llama.cpp has no cache type {f!r} (has: {', '.join(have)})")
        kvs.append(kv_name(*q, short=True))
    requested, baseline = kvs[:-1], kvs[-1]
    fork = variant is not None
    if fork:
        say("note: against a TurboQuant fork build, ggml types run rotated as upstream llama.cpp rotates them, "
            "types with a turbo half unrotated (in both runtimes)")
    runtime = LlamaCppRuntime(path, n_threads=args.threads)
    tool = ev.perplexity_tool(build.path) if build is not None else None
    if tool is not None:
        say(f"the build has {tool.name}: each type's perplexity is compared with it")
    twin = None
    if "mlx" in parts:
        from tqbridge.parity.harness.runtimes import MLXRuntime

        say("loading the MLX model (tqbridge's side)")
        twin = MLXRuntime(path)
    info = runtime.info()
    settings = {"model": path.name, "model_bytes": path.stat().st_size,
                "build": (f"{Path(str(build.report.get('source'))).name} @ {build.report.get('commit')}" if build is not None
                          else f"llama-cpp-python {info.get('llama_cpp_python')}"),
                "kv_rotation": ("on for ggml types (as upstream), off for types with a turbo half" if fork
                                else "on (llama.cpp's default)"),
                "threads": runtime.n_threads, "parts": parts}
    try:
        res = ev.run_evidence(runtime, requested=requested, text=text, text_source=source, n_ctx=args.ctx,
                              n_chunks=args.chunks, baseline=baseline, out=Path(args.out), settings_extra=settings,
                              parts=parts, twin=twin, speed_reps=args.speed_reps, available=set(llama_kv_types()),
                              rotation=lambda kv: ev.kv_rotation(kv, fork=fork),
                              perplexity=(tool, path) if tool is not None else None,
                              mlx_side=lambda types, cache, say: ev.run_mlx_side(
                                  types, cache=cache, say=say, variant=variant, model=path,
                                  rotation=lambda kv: ev.kv_rotation(kv, fork=fork)),
                              progress=say)
    except ev.EvidenceError as e:
        raise CliError(str(e)) from e
    report = {"tool": "tqbridge evidence", "command": command_line(args),
              "requested": requested, **res.as_dict(), "environment": environment(info)}
    paths = write_all(Path(args.out), report)
    for name, r in res.quality.items():
        if "refused" in r:
            print(f"{name:<24} refused by the build: {r['refused']}")
            continue
        k = r["vs_f16"]["kld"]
        print(f"{name:<24} {r['bits_per_value']:6.3f} bits  PPL {r['ppl']:.4f} ± {r['ppl_err']:.4f}  "
              f"KLD vs f16 {k['mean']:.6f} ± {k['err']:.6f}  same top {100 * k['same_top']:.2f} %")
    bad = [k["id"] for k in res.kernels if "skipped" not in k and not k["passed"]]
    if res.kernels:
        print(f"flash_attn_ext: {len(res.kernels)} cases, {len(bad)} over NMSE {ev.NMSE_BAR:g} or outside the "
              f"oracle's bound" + (f" (first: {bad[0]})" if bad else ""))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    twin_bad = [n for n, r in res.quality.items() if r.get("vs_tqbridge", {}).get("passed") is False]
    lp = res.llama_perplexity
    if lp:
        agree = sum(1 for r in lp.values() if r.get("agrees"))
        lp_bad = [n for n, r in lp.items() if not r.get("within_uncertainty")]
        print(f"llama-perplexity: {len(lp)} types, {agree} within a unit of its last printed digit, "
              f"{len(lp) - len(lp_bad)} within its printed uncertainty" + (f" (not: {', '.join(lp_bad)})" if lp_bad else ""))
    else:
        lp_bad = []
    unheld = [f"{v['level']} ({', '.join(g['kv'])})" for g in (res.mlx or {}).get("levels", [])
              for v in g["verdicts"] if v["passed"] is not True]
    if res.mlx and "levels" in res.mlx:
        print("MLX side: " + ("every level holds" if not unheld else "not held: " + "; ".join(unheld)))
    return 1 if bad or twin_bad or lp_bad or unheld else 0


def command_line(args) -> str:
    """The command with every setting spelled out (what re-runs it); an absolute ``--out`` by its folder's
    name (the path is this machine's)."""
    words = ["tqbridge", "evidence", args.model]
    if args.llama or os.environ.get("TQBRIDGE_LLAMA_BUILD"):
        words += ["--llama", "BUILD"]     # the folder is this machine's; the report names the build's source and commit
    for kv in args.kv:
        words += ["--kv", kv]
    words += ["--baseline", args.baseline, "--ctx", str(args.ctx), "--chunks", str(args.chunks)]
    if args.text:
        words += ["--text", args.text]
    if args.threads:
        words += ["--threads", str(args.threads)]
    if args.speed_reps != 3:
        words += ["--speed-reps", str(args.speed_reps)]
    words += ["--parts", args.parts, "--out", Path(args.out).name if Path(args.out).is_absolute() else args.out]
    return " ".join(map(shlex.quote, words))


def environment(info: dict) -> dict:
    from tqbridge.parity.harness.report import versions

    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(info)
    if isinstance(info.get("llama_build"), dict) and info["llama_build"].get("source"):
        info["llama_build"] = {**info["llama_build"], "source": Path(str(info["llama_build"]["source"])).name}
    return {"versions": versions(), "runtime": info, "cpu": cpu, "cpus": os.cpu_count(),
            "tqbridge_commit": _commit()}


def _commit() -> "str | None":
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
