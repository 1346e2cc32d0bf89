"""Record of the teacher-forcing level and the llama.cpp-arithmetic reference (docs/levels.md).

    .venv/bin/python benchmarks/scripts/record_teacher.py docs/teacher-forcing.json

Runs (CPU, F32 weights, llama.cpp's KV rotation on, 4 decode steps, the MLX-ops attention reference):
SmolLM2 on 256 tokens with the demo's K/V pairs; Gemma 3 on 64 tokens with every cache type and on
600 tokens (past its 512-position sliding window) with q8_0; and ggml's flash_attn_ext against
tqbridge.parity.harness.llama_arith on the synthetic problems of tests/test_llama_arith.py. Per run and pair it
keeps the summary the docs cite (blocks, the q8_0 residual, rotation and attention ratios, ulps), not
the per-layer records. Deterministic up to llama.cpp's thread scheduling (none in these numbers).
"""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import version

import numpy as np

from tqbridge.bridge.mlx_blas import prefer_fast_blas

prefer_fast_blas()

from tqbridge.bridge.atomic import write_atomic  # noqa: E402

DEMO_KV = ["f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/q4_0", "q8_0/iq4_nl"]
ALL_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f16"]
ARITH_PAIRS = ["f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/q4_0", "q8_0/iq4_nl", "f16/q5_1",
               "q4_1/f16"]


def summarize(rep: dict) -> list[dict]:
    out = []
    for r in rep["kv"]:
        Ls = r["layers"]
        row = {"kv": r["kv"], "layers": len(Ls), "passed": r["passed"]}
        for side in ("k", "v"):
            b = [L["bytes"][side] for L in Ls]
            row[f"{side}_blocks"] = sum(x["blocks"] for x in b)
            row[f"{side}_blocks_differing"] = sum(x["blocks_differing"] for x in b)
            row[f"{side}_unexplained"] = sum(x["unexplained"] for x in b)
            res = [x["residual"] for x in b if "residual" in x]
            if res:
                row[f"{side}_residual_max_code_step"] = max(x["max_code_step"] for x in res)
                row[f"{side}_residual_same_scale"] = all(x["same_scale"] for x in res)
        rots = [L["rotation"] for L in Ls if "rotation" in L]
        if rots:
            row["rotation_worst_ratio"] = max(max(x["k"]["bound_ratio"], x["v"]["bound_ratio"]) for x in rots)
            row["rotation_k_blocks_share"] = float(np.mean([x["k"]["blocks"]["share_blocks"] for x in rots]))
        atts = [L["attention"] for L in Ls if "attention" in L]
        if atts:
            row["attention_worst_ratio"] = max(e["bound_ratio"] for a in atts for e in a["ours"].values())
            row["llama_vs_oracle_worst_ratio"] = max(a["llama_vs_oracle"]["bound_ratio"] for a in atts)
            ar = [a["llama_arith"] for a in atts if "llama_arith" in a]
            if ar:
                row["llama_arith_max_ulps"] = max(x["ulps"] for x in ar)
                row["llama_arith_worst_bound_ratio"] = max(x["bound_ratio"] for x in ar)
                row["llama_arith_unit"] = ar[0]["unit"]
        masks = [L["mask"] for L in Ls if "mask" in L]
        row["mask_matches"] = all(m["matches"] for m in masks)
        row["windows"] = sorted({m["window_ours"] for m in masks})
        out.append(row)
    return out


def teacher_runs() -> list[dict]:
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.parity.harness.level_logits import parity_text
    from tqbridge.parity.harness.level_teacher import model_windows, run_teacher
    from tqbridge.bridge.gguf.models import model_path
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime

    runs = []
    for model, n, kvs in (("smollm2", 256, DEMO_KV), ("gemma3", 64, ALL_TYPES), ("gemma3", 600, ["q8_0"])):
        path = str(cached_f32_gguf(model_path(model)))
        toks = LlamaCppRuntime(path).tokenize(parity_text()[0])[:n]
        rep = run_teacher(path, toks, kvs, decode=4, windows=model_windows(path), backends=("reference",),
                          progress=lambda m: print(m, file=sys.stderr))
        runs.append({"model": model, "tokens": len(toks), "decode": 4, "rotation": True, "passed": rep["passed"],
                     "kv": summarize(rep)})
    return runs


def arith_runs() -> list[dict]:
    from tqbridge.bridge.blocks.kv_spec import split_kv
    from tqbridge.parity.harness.level_attention import probe_problem, random_problem
    from tqbridge.parity.harness.llama_arith import compare_with_ggml

    rows = []
    for spec in ARITH_PAIRS:
        kf, vf = split_kv(spec)
        plain, capped, ratios = [], [], []
        for seed in range(3):
            problems = [random_problem(kf, vf, q_heads=hq, kv_heads=hkv, keys=n, head_dim=d, seed=seed)
                        for hq, hkv, n, d in ((8, 2, 64, 64), (9, 3, 33, 128), (4, 1, 300, 256))]
            problems += [probe_problem(kind, kf, vf, seed=seed) for kind in ("q-rounding", "v-accumulation")]
            for q, k, v in problems:
                r = compare_with_ggml(q, k, v, k_format=kf, v_format=vf)
                plain.append(r["ulps"])
                ratios.append(r["bound_ratio"])
        q, k, v = random_problem(kf, vf, seed=5)
        r = compare_with_ggml(q, k, v, k_format=kf, v_format=vf, softcap=2.0)
        capped.append(r["ulps"])
        ratios.append(r["bound_ratio"])
        unit = "f16" if vf == "f16" else "f32"
        rows.append({"kv": spec, "unit": unit, "worst_bound_ratio": max(ratios), "max_ulps": max(plain),
                     "softcap_ulps": capped[0], "problems": len(plain) + 1})
    return rows


def main(out: str) -> None:
    record = {"tool": "benchmarks/scripts/record_teacher.py", "machine": platform.machine(),
              "versions": {"llama_cpp_python": version("llama_cpp_python"), "mlx": version("mlx"),
                           "numpy": np.__version__},
              "teacher": teacher_runs(), "llama_arith": arith_runs()}
    write_atomic(out, json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/teacher-forcing.json")
