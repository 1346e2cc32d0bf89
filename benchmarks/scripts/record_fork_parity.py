"""Record: `tqbridge parity --llama BUILD --levels all` against the TurboQuant fork, as one summary file.

    python benchmarks/scripts/record_fork_parity.py OUT.json NAME=REPORT.json[:BUILD] ...

Each REPORT.json is a `tqbridge parity ... --json` report; BUILD is the build directory it ran on (its
`tqbridge llama info` facts are recorded beside it). A NAME=TEXT.txt argument instead records a run that
ended in one line of error (the line is kept). The record keeps the verdicts and the per-pair numbers
(no per-position arrays); the full reports are reproducible with the commands recorded.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path


def _teacher(rep: dict) -> list:
    out = []
    for r in rep["kv"]:
        Ls = r["layers"]
        out.append({
            "kv": r["kv"], "layers": len(Ls), "passed": r["passed"],
            "k_blocks_differing": sum(L["bytes"]["k"]["blocks_differing"] for L in Ls),
            "v_blocks_differing": sum(L["bytes"]["v"]["blocks_differing"] for L in Ls),
            "blocks": sum(L["bytes"]["k"]["blocks"] + L["bytes"]["v"]["blocks"] for L in Ls),
            "unexplained": sum(L["bytes"]["k"]["unexplained"] + L["bytes"]["v"]["unexplained"] for L in Ls),
            "attention_worst_bound_ratio": max(e["bound_ratio"] for L in Ls if "attention" in L
                                               for e in L["attention"]["ours"].values()),
            "fork_attention_worst_bound_ratio": max(L["attention"]["llama_vs_oracle"]["bound_ratio"]
                                                    for L in Ls if "attention" in L),
        })
        paths = [L["model_path"] for L in Ls if L.get("model_path", {}).get("ran")]
        if paths:   # the model's own attention path on the fork's input (teacher's model-path claim)
            out[-1].update(model_path_layers=len(paths),
                           model_path_worst_bound_ratio=max(m["output"]["bound_ratio"] for m in paths),
                           model_path_worst_q_rel=max(m["q_rel"] for m in paths),
                           model_path_decode=sorted({p for m in paths for p in m["paths"]}))
    return out


def summarize(report: dict, build: str = "") -> dict:
    llama = dict(report.get("info", {}).get("llama_cpp", {}).get("llama_build") or {})
    llama.pop("source", None)                       # a path of the machine that ran it
    command = report["command"].replace(build, "BUILD") if build else report["command"]
    words = command.split()
    if "--json" in words:                            # where the full report went on that machine
        i = words.index("--json")
        words[i + 1] = "OUT.json"
    command = " ".join(words)
    out = {"command": command, "verdicts": report["verdicts"], "passed": report["passed"], "llama": llama}
    if "logits" in report:
        out["logits"] = [{k: r.get(k) for k in ("kv", "kl_mean", "top1", "max_abs", "decode_kl_mean", "decode_top1",
                                                 "pass")} | {"llama_kl_vs_f16": (r.get("baseline") or {}).get("llama_kl_mean")}
                         for r in report["logits"]]
        out["logits_seconds"] = report["info"].get("seconds")
    if "blocks" in report:
        out["blocks"] = [{"format": e["format"], "equal": e["equal"]} for e in report["blocks"]["formats"]]
    if "attention" in report:
        cases = report["attention"]["cases"]
        out["attention"] = {"cases": len(cases), "passed": report["attention"]["passed"],
                            "worst_bound_ratio": max(e["bound_ratio"] for c in cases for e in c["ours"].values()),
                            "fork_nmse_max": max((c["ggml_vs_oracle"]["nmse"] for c in cases if c["ggml_vs_oracle"]),
                                                 default=None)}
    if "cache" in report:
        out["cache"] = [{"kv": e["kv"], "k_identical": e["same_inputs"]["k"]["identical"],
                         "v_identical": e["same_inputs"]["v"]["identical"]} for e in report["cache"]["kv"]]
    if "teacher" in report:
        out["teacher"] = _teacher(report["teacher"])
    if "lane" in report:
        out["lane"] = {k: report["lane"].get(k) for k in ("kv", "decode", "slides", "passed")}
    if "transplant" in report:
        t = report["transplant"]
        out["transplant"] = [{k: x.get(k) for k in ("kv", "blob_round_trip_bytes_equal", "forward_agree",
                                                     "reverse_agree", "new_tokens")}
                             for x in (t, t.get("turbo")) if x]
    return out


def main(argv: "list[str]") -> int:
    from tqbridge.bridge.llama.build import describe
    from tqbridge.parity.harness.report import versions

    out_path, runs = Path(argv[0]), {}
    builds = {}
    for arg in argv[1:]:
        name, _, rest = arg.partition("=")
        path, _, build = rest.partition(":")
        if path.endswith(".txt"):
            lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
            said = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else "")
            runs[name] = {"error": said.replace(build, "BUILD") if build else said}
        else:
            runs[name] = summarize(json.loads(Path(path).read_text()), build)
        if build:
            info = describe(build)
            r = info.report
            builds[name] = {"variant": info.variant, "source_commit": r.get("commit"),
                            "ggml_version": r.get("ggml_version"), "cmake_args": (r.get("recipe") or {}).get("cmake_args"),
                            "turbo_types": (r.get("turbo") or {}).get("types")}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"record": "parity against the TurboQuant fork (--llama BUILD, --levels all)",
              "date": datetime.date.today().isoformat(), "commit": commit,
              "machine": {"platform": platform.platform(), "cpu_count": __import__("os").cpu_count()},
              "versions": versions(), "builds": builds, "runs": runs,
              "how": "python benchmarks/scripts/record_fork_parity.py OUT NAME=REPORT.json:BUILD ... over the reports of "
                     "the commands in runs[*].command (build directories from `tqbridge llama build SRC`)"}
    from tqbridge.tools.records import dumps, envelope

    # a schema-1 record (tools/records.py); the commit is the one checked out here, as the payload says
    out_path.write_text(dumps(envelope(record, hardware="cpu", command=record["how"], date=record["date"],
                                       commit=commit or None, machine_=record["machine"],
                                       versions_=record["versions"])))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
