"""Measure what int8 q costs in KL on the real models and write one JSON record (docs/q-precision.md).

    .venv/bin/python benchmarks/scripts/record_q_precision.py OUT.json [--tokens 256] [--jobs 2]

For each model and each q precision (exact, int8) it runs

    tqbridge quality MODEL --kv ... --tokens N --chunk 1 --q-precision P --json ... --no-progress

(``--chunk 1``: every position is a decode step through the routed attention, the only place the
option acts). The record keeps each run's rows, the commands, the date, the machine, and a table of
KL mean per configuration with exact and int8 q side by side.

``--paired`` adds a direct comparison through the Python API: per configuration, an exact-q and an
int8-q cache read the same tokens in lockstep beside the f16 reference, and per position
``KL(P_exact || P_int8)`` says how far int8 q alone moves the distribution (the CLI's two runs give
KL vs f16 for each; their difference mixes the int8 effect with quantization steps that flip
because later layers see slightly different rows). Its KL vs f16 columns must reproduce the CLI's.

The control (int8 q's own effect, where no quantization step can flip):

    .venv/bin/python benchmarks/scripts/record_q_precision.py --paired-one MODEL 256 f16/f16,q8_0/q8_0

prints the same rows as JSON for an f16 and a q8_0 cache (the record keeps them under "control").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from record_env import header, write_record

MODELS = ("smollm2", "gemma3")
PRECISIONS = ("exact", "int8")
# K types: q8_0 (q8_0 q), q4_0 (q8_0 q, 4-bit keys), q5_1 (offset K: q8_1 q); V: turbo3, q4_0
KVS = ("q8_0/turbo3", "q8_0/q4_0", "q4_0/q4_0", "q5_1/q4_0")


def _run(model: str, precision: str, tokens: int, tmp: str) -> dict:
    out = Path(tmp) / f"{model}-{precision}.json"
    cmd = ["tqbridge", "quality", model]
    for kv in KVS:
        cmd += ["--kv", kv]
    cmd += ["--tokens", str(tokens), "--chunk", "1", "--q-precision", precision, "--no-progress"]
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", "import sys; from tqbridge.tools.cli import main; sys.exit(main())",
                        *cmd[1:], "--json", str(out)], capture_output=True, text=True)
    wall = time.time() - t0
    print(" ".join(cmd), f"({wall:.0f} s, exit {p.returncode})", file=sys.stderr, flush=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    print(p.stdout, file=sys.stderr, flush=True)
    return {"command": " ".join(cmd + ["--json", "OUT"]), "exit_code": p.returncode, "wall_s": round(wall, 1),
            "stderr_paths": [line for line in p.stderr.splitlines() if "paths:" in line or "decode q:" in line],
            "rows": json.loads(out.read_text())}


def _kl(p_log, q_log):
    import mlx.core as mx

    return mx.sum(mx.exp(p_log) * (p_log - q_log), axis=-1)


def _paired(model_name: str, tokens: int, kvs: "tuple[str, ...]" = KVS) -> list[dict]:
    """Per configuration: KL(f16 || exact), KL(f16 || int8), KL(exact || int8), top-1 agreement, all
    positions scored as decode steps (one token per call), every layer's decode path counted.
    ``kvs`` may hold f16/f16 (the control: no K/V quantization step can flip; int8 q there is the
    reference path's emulation only, no kernel takes it)."""
    from tqbridge.bridge.mlx_blas import prefer_fast_blas

    prefer_fast_blas()
    import mlx.core as mx

    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.bridge.blocks.kv_spec import parse_kv
    from tqbridge.metal.lm.routing import route_attention
    from tqbridge.parity import quality as q
    from tqbridge.bridge.gguf.models import model_path

    path = str(model_path(model_name))
    model, _ = load_gguf_model(path)
    ids = q.GGUFTokenizer(path).encode(q.default_text(), add_bos=True)[:tokens]
    caches = {("f16/f16", "exact"): make_cache(model, "f16", "f16")}
    for kv in kvs:
        for prec in PRECISIONS:
            caches[(kv, prec)] = c = make_cache(model, *parse_kv(kv))
            for layer in c:
                layer.q_precision = prec
    sums: dict = {kv: {"kl_exact": 0.0, "kl_int8": 0.0, "kl_exact_int8": 0.0, "kl_exact_int8_max": 0.0,
                       "top1_exact_int8": 0} for kv in kvs}
    t0 = time.time()
    with route_attention():
        for t in ids:
            x = mx.array([[t]])
            logp = {key: q._log_softmax(model(x, cache=c)[0, -1]) for key, c in caches.items()}
            ref = logp[("f16/f16", "exact")]
            for kv in kvs:
                e, i = logp[(kv, "exact")], logp[(kv, "int8")]
                k_e, k_i, k_ei = _kl(ref, e), _kl(ref, i), _kl(e, i)
                mx.eval(k_e, k_i, k_ei)
                s = sums[kv]
                s["kl_exact"] += k_e.item()
                s["kl_int8"] += k_i.item()
                s["kl_exact_int8"] += k_ei.item()
                s["kl_exact_int8_max"] = max(s["kl_exact_int8_max"], k_ei.item())
                s["top1_exact_int8"] += int(mx.argmax(e).item() == mx.argmax(i).item())
    n = len(ids)
    rows = []
    for kv in kvs:
        s = sums[kv]
        paths = {prec: dict(sum((layer.paths for layer in caches[(kv, prec)]), Counter())) for prec in PRECISIONS}
        rows.append({"kv": kv, "positions": n, "kl_exact": s["kl_exact"] / n, "kl_int8": s["kl_int8"] / n,
                     "kl_exact_int8": s["kl_exact_int8"] / n, "kl_exact_int8_max": s["kl_exact_int8_max"],
                     "top1_exact_int8": s["top1_exact_int8"] / n, "paths": paths,
                     "q_precision": {prec: sorted({layer.q_precision for layer in caches[(kv, prec)]})
                                     for prec in PRECISIONS}})
    print(f"paired {model_name}: {n} tokens, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--paired", action="store_true", help="also the direct exact-vs-int8 comparison")
    ap.add_argument("--paired-only", action="store_true",
                    help="only the paired comparison, merged into OUT (which holds the CLI runs)")
    args = ap.parse_args()
    if args.paired_only:
        from tqbridge.tools.records import load

        record = load(args.out)["results"]   # the record the CLI runs wrote (a schema-1 record)
        _add_paired(record, args)
        return 0
    record: dict = {
        **header(("tqbridge", "mlx", "mlx-lm", "llama_cpp_python", "numpy")),
        "script": "benchmarks/scripts/record_q_precision.py " + " ".join(sys.argv[2:]) + " OUT.json",
        "tokens": args.tokens,
        "chunk": 1,
        "runs": {},
        "table": [],
    }
    jobs = [(m, p) for m in MODELS for p in PRECISIONS]
    with tempfile.TemporaryDirectory(prefix="tqbridge-qprec-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = {job: pool.submit(_run, *job, args.tokens, tmp) for job in jobs}
        for (m, p), f in futures.items():
            record["runs"].setdefault(m, {})[p] = f.result()
    for m in MODELS:
        by = {p: {r["kv"]: r for r in record["runs"][m][p]["rows"]} for p in PRECISIONS}
        for kv in by["exact"]:
            if kv == "f16/f16":
                continue
            e, i = by["exact"][kv], by["int8"][kv]
            record["table"].append({
                "model": m, "kv": kv,
                "kl_exact": e["kl_mean"], "kl_int8": i["kl_mean"],
                "kl_int8_minus_exact": i["kl_mean"] - e["kl_mean"],
                "relative": (i["kl_mean"] - e["kl_mean"]) / e["kl_mean"] if e["kl_mean"] else None,
                "kl_max_exact": e["kl_max"], "kl_max_int8": i["kl_max"],
                "top1_exact": e["top1"], "top1_int8": i["top1"],
                "decode_exact": e["decode_q"], "decode_int8": i["decode_q"],
            })
    if args.paired:
        _add_paired(record, args)
        return 0
    _write(record, args.out)
    return 0


def _add_paired(record: dict, args) -> None:
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {m: pool.submit(_paired_subprocess, m, record["tokens"]) for m in MODELS}
        record["paired"] = {m: f.result() for m, f in futures.items()}
    record["paired_command"] = "benchmarks/scripts/record_q_precision.py --paired-only OUT.json"
    _write(record, args.out)


def _paired_subprocess(model: str, tokens: int) -> list[dict]:
    """One model's paired comparison in its own process (a model's MLX state stays there)."""
    p = subprocess.run([sys.executable, __file__, "--paired-one", model, str(tokens)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise SystemExit(f"paired {model} failed:\n{p.stderr[-3000:]}")
    print(p.stderr.splitlines()[-1] if p.stderr else "", file=sys.stderr, flush=True)
    return json.loads(p.stdout)


def _write(record: dict, out: str) -> None:
    commands = [record["script"]] + ([record["paired_command"]] if "paired_command" in record else [])
    write_record(out, record, hardware="cpu", command=commands[0] if len(commands) == 1 else commands)
    print("| model | K / V | KL exact q | KL int8 q | int8 - exact | relative | top-1 exact / int8 |")
    print("|---|---|---|---|---|---|---|")
    for t in record["table"]:
        print(f"| {t['model']} | {t['kv']} | {t['kl_exact']:.4g} | {t['kl_int8']:.4g} | "
              f"{t['kl_int8_minus_exact']:+.2e} | {100 * t['relative']:+.1f}% | "
              f"{100 * t['top1_exact']:.1f}% / {100 * t['top1_int8']:.1f}% |")
    for m, rows in record.get("paired", {}).items():
        print(f"\npaired, {m}: | K / V | KL(f16||exact) | KL(f16||int8) | KL(exact||int8) mean / max | "
              "top-1 exact = int8 |")
        for r in rows:
            print(f"| {r['kv']} | {r['kl_exact']:.4g} | {r['kl_int8']:.4g} | {r['kl_exact_int8']:.3g} / "
                  f"{r['kl_exact_int8_max']:.3g} | {100 * r['top1_exact_int8']:.1f}% |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--paired-one"]:
        kvs = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else KVS
        print(json.dumps(_paired(sys.argv[2], int(sys.argv[3]), kvs)))
        sys.exit(0)
    sys.exit(main())
