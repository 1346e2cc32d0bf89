"""The evidence report: Markdown laid out as llama.cpp's CONTRIBUTING.md lists what a new quantization type
needs (perplexity, KL divergence, CPU performance, test-backend-ops cases), a JSON record, and a plot of
perplexity and KLD against bits per value. Every file is written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from tqbridge.bridge.atomic import atomic_output, write_atomic

from .evidence import BASELINE, NMSE_BAR, TWIN_RATIO


def markdown(report: dict) -> str:
    s = report["settings"]
    q = report.get("quality") or {}
    base = s.get("baseline", BASELINE)
    L = [f"# KV cache type evidence: {', '.join(report.get('requested') or [])}", ""]
    L += [f"Model `{s.get('model')}`, llama.cpp build {s.get('build')}, text {s.get('text')} "
          f"({s.get('text_tokens')} tokens), {s.get('chunks')} chunks of {s.get('ctx')} tokens (the second half "
          f"of each scored, as llama-perplexity does), KV rotation {s.get('kv_rotation')}.", ""]
    L += ["Command:", "", "```", report.get("command", ""), "```", ""]
    refused = {n: r["refused"] for n, r in q.items() if "refused" in r}
    q = {n: r for n, r in q.items() if "refused" not in r}
    if q:
        L += ["## Perplexity", ""]
        for name, why in refused.items():
            L += [f"Refused by the build: **{name}**: {why}", ""]
        rot = any("kv_rotation" in r for r in q.values())
        L += ["| cache | bits/value | PPL | ln(PPL/PPL(f16)) | ln(PPL/PPL(" + base + ")) |" + (" KV rotation |" if rot else ""),
              "|---|---:|---:|---:|---:|" + ("---|" if rot else "")]
        for name, r in q.items():
            vb = r.get(f"vs_{base}", {})
            L.append(f"| {name} | {r['bits_per_value']:.3f} | {r['ppl']:.4f} ± {r['ppl_err']:.4f} | "
                     f"{r['vs_f16']['ln_ratio']:+.5f} ± {r['vs_f16']['ln_ratio_err']:.5f} | "
                     f"{vb.get('ln_ratio', 0):+.5f} ± {vb.get('ln_ratio_err', 0):.5f} |"
                     + ((" on |" if r.get("kv_rotation") else " off |") if rot else ""))
        L += ["", "## KL divergence", "",
              f"From the f16 cache's logits and from the {base} cache's (per scored token, nats).", "",
              "| cache | KLD vs f16 | median | 99% | 99.9% | max | same top vs f16 | KLD vs " + base
              + " | same top vs " + base + " |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in q.items():
            k, kb = r["vs_f16"]["kld"], r[f"vs_{base}"]["kld"]
            p = k["percentiles"]
            L.append(f"| {name} | {k['mean']:.6f} ± {k['err']:.6f} | {p['50']:.6f} | {p['99']:.5f} | "
                     f"{p['99.9']:.5f} | {k['max']:.5f} | {100 * k['same_top']:.2f} ± {100 * k['same_top_err']:.2f} % | "
                     f"{kb['mean']:.6f} ± {kb['err']:.6f} | {100 * kb['same_top']:.2f} % |")
        twin = [(n, r["vs_tqbridge"]) for n, r in q.items() if "vs_tqbridge" in r]
        if twin:
            L += ["", "### The build against tqbridge's implementation of the same type", "",
                  f"KLD of the build's logits from tqbridge's MLX cache of the same type on the same chunks; claim: "
                  f"at most {TWIN_RATIO:g}x what tqbridge's type costs from the build's f16 cache.", "",
                  "| cache | KLD build vs tqbridge | same top | claim | verdict |", "|---|---:|---:|---|---|"]
            for n, t in twin:
                L.append(f"| {n} | {t['kld']['mean']:.3g} ± {t['kld']['err']:.2g} | {100 * t['kld']['same_top']:.2f} % "
                         f"| {t['claim']} | {'pass' if t['passed'] else 'FAIL'} |")
    lp = report.get("llama_perplexity") or {}
    if lp:
        L += ["", "### Against the build's own llama-perplexity", "",
              "Same text, chunks and KV rotation. Agrees: within a unit of its last printed digits; the claim: within its "
              "printed uncertainty.", "",
              "| cache | llama-perplexity | tqbridge evidence | difference | agrees | claim |", "|---|---:|---:|---:|---|---|"]
        for n, r in lp.items():
            if "failed" in r:
                L.append(f"| {n} | failed: {r['failed']} | | | | FAIL |")
                continue
            L.append(f"| {n} | {r['ppl']:.4f} ± {r['ppl_err']:.5f} | {r['ours']:.4f} ± {r['ours_err']:.5f} | "
                     f"{r['delta']:.2g} | {'yes' if r['agrees'] else 'no'} | "
                     f"{'pass' if r['within_uncertainty'] else 'FAIL'} |")
    sp = report.get("speed") or []
    if sp:
        L += ["", "## CPU performance", "",
              f"Tokens/s through the build's runtime ({s.get('threads')} threads), prompt of N tokens into an empty "
              f"cache, then {sp[0]['decode_tokens']} decode steps; {sp[0]['reps']} interleaved repetitions, median "
              "(min..max).", "", "| cache | N | prompt t/s | decode t/s |", "|---|---:|---:|---:|"]
        for r in sorted(sp, key=lambda r: (r["prompt_tokens"], list(q).index(r["kv"]) if r["kv"] in q else 0)):
            L.append(f"| {r['kv']} | {r['prompt_tokens']} | {r['pp_tps_median']:.1f} ({r['pp_tps_min']:.1f}..{r['pp_tps_max']:.1f}) | "
                     f"{r['tg_tps_median']:.1f} ({r['tg_tps_min']:.1f}..{r['tg_tps_max']:.1f}) |")
    ks = report.get("kernels") or []
    if ks:
        run = [k for k in ks if "skipped" not in k]
        bad = [k for k in run if not k["passed"]]
        L += ["", "## flash_attn_ext cases (test-backend-ops terms)", "",
              f"Backend A: the build's ggml CPU flash_attn_ext; backend B: tqbridge's fused kernel on its CPU emulator; "
              f"both also against tqbridge's float64 oracle. Bar: NMSE {NMSE_BAR:g} (test-backend-ops, "
              f"test_flash_attn_ext::max_nmse_err). Re-run one case: `--case ID`. {len(run)} cases run, "
              f"{len(bad)} over the bar or outside the oracle's bound, {len(ks) - len(run)} skipped.", "",
              "| type | cases | worst NMSE build vs ours | worst NMSE build vs oracle | worst case | verdict |",
              "|---|---:|---:|---:|---|---|"]
        by: dict[str, list] = {}
        for k in run:
            by.setdefault(k["kv"], []).append(k)
        for name, rows in by.items():
            w = max(rows, key=lambda r: r["nmse_build_vs_ours"])
            L.append(f"| {name} | {len(rows)} | {w['nmse_build_vs_ours']:.2e} | "
                     f"{max(r['nmse_build_vs_oracle'] for r in rows):.2e} | `{w['id']}` | "
                     f"{'pass' if all(r['passed'] for r in rows) else 'FAIL'} |")
        for k in ks:
            if "skipped" in k:
                L.append(f"\nSkipped `{k['id']}`: {k['skipped']}")
    m = report.get("mlx")
    if m:
        L += ["", "## tqbridge's MLX side: blocks", "",
              "| format | byte-exact vs the build |", "|---|---|"]
        for e in m["blocks"]["formats"]:
            L.append(f"| {e['format']} | {'pass' if e['passed'] else 'FAIL'} |")
        for g in m.get("levels", []):
            held = ", ".join(f"{v['level']}: {'holds' if v['passed'] else 'FAILED' if v['passed'] is False else 'not judged'}"
                             for v in g["verdicts"])
            L += ["", f"### Parity levels, KV rotation {'on' if g['kv_rotation'] else 'off'}: {held}", "", "```",
                  *g["lines"], "```"]
    L += ["", "## Versions and machine", "", "```", json.dumps(report.get("environment", {}), indent=1), "```", ""]
    return "\n".join(L)


def plot(path, report: dict) -> "Path | None":
    """Perplexity and mean KLD vs f16 against bits per value, one point per cache type."""
    q = {n: r for n, r in (report.get("quality") or {}).items() if "refused" not in r}
    if not q:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, r in q.items():
        x = r["bits_per_value"]
        a.errorbar([x], [r["ppl"]], yerr=[r["ppl_err"]], fmt="o", capsize=3)
        a.annotate(name, (x, r["ppl"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        k = r["vs_f16"]["kld"]
        if name != "f16":
            b.errorbar([x], [max(k["mean"], 1e-9)], yerr=[k["err"]], fmt="o", capsize=3)
            b.annotate(name, (x, max(k["mean"], 1e-9)), fontsize=7, xytext=(3, 3), textcoords="offset points")
    a.set_xlabel("bits per value")
    a.set_ylabel("perplexity")
    b.set_xlabel("bits per value")
    b.set_ylabel("mean KLD vs f16 (nats)")
    b.set_yscale("log")
    fig.suptitle(f"{report['settings'].get('model')}: {report['settings'].get('chunks')} x {report['settings'].get('ctx')} tokens")
    fig.tight_layout()
    with atomic_output(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return Path(path)


def write_all(out: Path, report: dict) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "evidence.json", "markdown": out / "evidence.md", "plot": out / "evidence.png"}
    write_atomic(paths["json"], json.dumps(report, indent=1) + "\n")
    write_atomic(paths["markdown"], markdown(report))
    if plot(paths["plot"], report) is None:
        paths.pop("plot")
    return paths
