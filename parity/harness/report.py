"""Parity reports: a terminal table, Markdown and JSON (written atomically)."""

from __future__ import annotations

import json
import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tqbridge.bridge.atomic import atomic_output, write_atomic


def versions() -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("tqbridge", "mlx", "mlx-lm", "llama_cpp_python", "gguf", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _verdict(row: dict) -> str:
    return {True: "pass", False: "FAIL", None: "-"}[row["pass"]]


def table_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["K/V", "KL(llama.cpp||MLX)", "top-1", "max |dlogit|", "decode steps: KL / top-1", "MLX decode path",
            "llama.cpp KL vs f16", "verdict"]
    body = []
    for r in rows:
        base = r.get("baseline")
        dec = f"{r['decode_kl_mean']:.3g} / {r['decode_top1']:.0%}" if "decode_kl_mean" in r else "-"
        paths = (r.get("mlx_cache") or {}).get("paths") or {}
        dpath = ",".join(sorted(k[len("decode:"):] for k in paths if k.startswith("decode:"))) or "-"
        name = r["kv"] + (f" (asked {r['requested']})" if r.get("stored") else "")
        body.append([name, f"{r['kl_mean']:.3g}", f"{r['top1']:.2%}", f"{r['max_abs']:.3g}", dec, dpath,
                     f"{base['llama_kl_mean']:.3g}" if base else "(reference)", _verdict(r)])
    return head, body


def text_table(rows: list[dict]) -> str:
    head, body = table_rows(rows)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def markdown(report: dict) -> str:
    head, body = table_rows(report["logits"])
    info = report["info"]
    out = [f"# Parity: llama.cpp vs MLX on {info['model']}", "",
           f"- weights: {info['weights']}; text: {info['text']}, {info['tokens']} tokens",
           f"- llama.cpp: flash attention {info['llama_cpp']['flash_attn']}, "
           f"KV rotation {'on' if info['llama_cpp']['kv_rotation'] else 'off'}; "
           f"MLX {info['mlx']['mlx']} on {info['mlx']['device']} ({info['mlx']['blas']})",
           f"- command: `{report['command']}`", "",
           "| " + " | ".join(h.replace("|", "\\|") for h in head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(b) + " |" for b in body]
    out += ["", "Claims: " + "; ".join(sorted({f"{r['kv']}: {r['claim']}" for r in report["logits"]})), ""]
    if report.get("teacher"):
        from tqbridge.parity.harness.level_teacher import summary_lines as teacher_lines

        t = report["teacher"]
        out += ["## Teacher forcing", "",
                f"llama.cpp's own rows of every layer ({t['tokens']} tokens, the last {t['decode']} as decode steps) "
                f"through tqbridge. Claim: {t['claim']}.", ""]
        out += [f"- {line}" for line in teacher_lines(t)] + [""]
    if report.get("verdicts"):
        out += ["Levels: " + ", ".join(f"{v['level']} {'pass' if v['passed'] else 'FAIL'}" for v in report["verdicts"])
                + f"; overall: {'pass' if report.get('passed') else 'FAIL'}", ""]
    return "\n".join(out)


def write_json(path, report: dict) -> Path:
    return write_atomic(path, json.dumps(report, indent=1) + "\n")


def plot_kl(path, report: dict) -> "Path | None":
    """Per-position KL(llama.cpp || MLX) for every configuration (PNG); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in report["logits"]:
        ax.plot([max(x, 1e-12) for x in r["kl_per_position"]], label=r["kv"], lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.set_ylabel("KL(llama.cpp || MLX)")
    ax.set_title(f"{report['info']['model']}: {report['info']['weights']}")
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, plt, path)


def plot_cache_layers(path, report: dict) -> "Path | None":
    """Per-layer share of cache blocks that differ between llama.cpp and tqbridge (PNG), from the
    cache level's runtime comparison; None without matplotlib or without that comparison."""
    entries = [e for e in report.get("cache", {}).get("kv", []) if "layers" in e]
    if not entries:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for e in entries:
        for side, style in (("k", "-"), ("v", "--")):
            ax.plot([L[side]["share_blocks"] for L in e["layers"]], style, marker=".", lw=0.9,
                    label=f"{e['kv']} {side.upper()}")
    ax.set_xlabel("layer")
    ax.set_ylabel("share of blocks differing")
    ax.set_ylim(0, 1)
    ax.set_title("KV cache: llama.cpp vs tqbridge after the same prompt")
    ax.legend(fontsize=7)
    return _save(fig, plt, path)


def _save(fig, plt, path) -> Path:
    fig.tight_layout()
    with atomic_output(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return Path(path)
