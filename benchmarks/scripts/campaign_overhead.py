"""What running a campaign's cells as Ray tasks costs, against running them in one process.

    python benchmarks/scripts/campaign_overhead.py --out campaign-overhead.json [--archs llama,qwen2,...]

One cell per tiny architecture (``tqbridge archs --parity ARCH``), timed four ways on this machine:

- ``one-process``: ``tqbridge archs --parity A B C ...``, every architecture in one process (one import);
- ``serial``: ``tqbridge campaign --serial``, each cell its own process, one after another, no Ray;
- ``ray-1-node``: ``tqbridge campaign --num-cpus 1``: a local Ray of one CPU (the same one-at-a-time order);
- ``ray-2-nodes``: two Ray nodes of one CPU each on this machine (``ray.cluster_utils.Cluster``: what
  ``ray start --head`` and ``ray start --address`` make), ``tqbridge campaign --address``: two cells at a time.

Per cell: (serial - one-process) / cells is what a process per cell costs (interpreter start, imports);
(ray-1-node - serial) / cells is what Ray adds per cell; Ray's start is counted apart (the CLI's wall
minus the campaign's own); Ray's floor per task is a no-op task's round trip on the two-node cluster. Writes the wall times, the campaign records' per-cell seconds and the load
average before and after each run (the machine is shared) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tq(*args, cwd):
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", *args], cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - t
    if p.returncode not in (0, 1):
        raise SystemExit(f"tqbridge {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall, p


def record_of(folder: Path) -> dict:
    rec = json.loads((folder / "campaign.json").read_text())
    return {"wall_seconds": rec["wall_seconds"], "ray": rec["ray"], "summary": rec["summary"],
            "cells": [{"arch": c["argv"][2], "seconds": c["seconds"], "wall_seconds": c["wall_seconds"],
                       "node": (c["node"] or "")[:8], "status": c["status"]} for c in rec["cells"]]}


def ray_task_round_trip(address: str, n: int = 50) -> dict:
    """Ray's own cost of one task: submit a no-op task and wait for its result, ``n`` times one after another."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        @ray.remote(num_cpus=1)
        def noop():
            return None

        ray.get(noop.remote())                     # a worker started and warm
        times = []
        for _ in range(n):
            t = time.perf_counter()
            ray.get(noop.remote())
            times.append(time.perf_counter() - t)
    finally:
        ray.shutdown()
    times.sort()
    return {"tasks": n, "median_ms": round(1e3 * times[n // 2], 3), "max_ms": round(1e3 * times[-1], 3)}


def derive(runs: dict, n: int) -> dict:
    """The per-cell costs. Between runs, this machine's load moves wall times by more than the costs
    looked for (it is shared), so the costs of a campaign mode are read within one run: a campaign's own
    wall time (after Ray started) minus the sum of its cells' seconds (each cell's process, timed where
    it ran) is what the mode adds around the cells; per cell, for the one-at-a-time modes."""
    out = {"cells": n}
    for mode in ("serial", "ray-1-node"):
        rec = runs[mode]["record"]
        cell_sum = sum(c["seconds"] for c in rec["cells"])
        out[f"{mode}_cells_seconds"] = round(cell_sum, 3)
        out[f"{mode}_campaign_wall_seconds"] = rec["wall_seconds"]
        out[f"{mode}_added_per_cell_seconds"] = round((rec["wall_seconds"] - cell_sum) / n, 3)
        out[f"{mode}_mean_cell_seconds"] = round(cell_sum / n, 3)
    out["ray_start_seconds"] = round(runs["ray-1-node"]["cli_wall_seconds"] - runs["ray-1-node"]["record"]["wall_seconds"], 3)
    out["process_per_cell_seconds_across_runs"] = round(
        (runs["serial"]["cli_wall_seconds"] - runs["one-process"]["cli_wall_seconds"]) / n, 3)
    out["speedup_2_nodes_over_serial_across_runs"] = round(
        runs["serial"]["cli_wall_seconds"] / runs["ray-2-nodes"]["cli_wall_seconds"], 3)
    r2 = runs["ray-2-nodes"]["record"]
    out["ray-2-nodes_cells_seconds"] = round(sum(c["seconds"] for c in r2["cells"]), 3)
    out["ray-2-nodes_campaign_wall_seconds"] = r2["wall_seconds"]
    out["ray-2-nodes_nodes_used"] = len({c["node"] for c in r2["cells"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default=None, help="comma-separated (default: every tiny fixture)")
    args = ap.parse_args(argv)
    from tqbridge.parity.harness import archs as A

    archs = args.archs.split(",") if args.archs else [r["arch"] for r in A.supported() if r["fixture"]]
    work = Path(tempfile.mkdtemp(prefix="campaign-overhead-"))
    spec = work / "tiny-archs.toml"
    spec.write_text('name = "tiny-archs"\n\n[[cells]]\ncommand = "archs"\nargs = ["--parity", "{arch}", "--quiet"]\n'
                    f"matrix = {{ arch = {json.dumps(archs)} }}\n")
    runs: dict = {}

    def timed(name, fn):
        before = os.getloadavg()
        out = fn()
        runs[name] = {**out, "loadavg_before": [round(x, 2) for x in before],
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
        print(f"{name}: {runs[name]['cli_wall_seconds']:.1f} s", file=sys.stderr)

    def one_process():
        wall, p = tq("archs", "--parity", *archs, "--quiet", "--json", "one.json", cwd=work)
        return {"cli_wall_seconds": round(wall, 3), "exit_code": p.returncode}

    def campaign(folder, *extra):
        def run():
            wall, p = tq("campaign", str(spec), "--out", folder, *extra, cwd=work)
            return {"cli_wall_seconds": round(wall, 3), "exit_code": p.returncode, "record": record_of(work / folder)}
        return run

    timed("one-process", one_process)
    timed("serial", campaign("serial", "--serial"))
    timed("ray-1-node", campaign("ray1", "--num-cpus", "1"))
    from ray.cluster_utils import Cluster       # two raylets on this machine, stopped by their own handles

    node = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        timed("ray-2-nodes", campaign("ray2", "--address", cluster.address))
        noop = ray_task_round_trip(cluster.address)
    finally:
        cluster.shutdown()
    derived = derive(runs, len(archs))
    derived["ray_noop_task_round_trip"] = noop
    result = {"tool": "benchmarks/scripts/campaign_overhead.py", "archs": archs, "cpus": os.cpu_count(),
              "runs": runs, "derived": derived}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(derived, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
