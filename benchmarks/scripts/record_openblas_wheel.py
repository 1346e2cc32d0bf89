"""The logits level of `tqbridge demo` on MLX's CPU with each BLAS tqbridge can choose on Linux, and one
JSON record (README's BLAS paragraph quotes it).

    python benchmarks/scripts/record_openblas_wheel.py OUT.json [--tokens 256]

Cases, each a fresh process running ``tqbridge parity smollm2 --exact-weights --tokens N --levels logits``
(the demo's logits level, default KV matrix) and, separately, a 2048x2048 float32 matmul on MLX's CPU:

- ``bundled``: ``TQBRIDGE_BLAS=bundled``, what a machine with no OpenBLAS at all gets;
- ``wheel``: the cmeel-openblas wheel's library, with tqbridge's search for a system library emptied
  (what a machine without ``libopenblas0-pthread`` gets; its ``libgfortran.so.5`` is the system's);
- ``wheel_mlx_gfortran``: as ``wheel``, and the system's libgfortran and libquadmath made unreadable in
  a private mount namespace (``unshare -m``, root only; skipped elsewhere): the wheel's library runs
  with the mlx[cpu] wheel's copy of libgfortran, as on a machine without libgfortran5;
- ``system``: the system's ``libopenblas.so.0`` (skipped where there is none).

Needs the ``mlx``, ``lm``, ``llama`` and ``models`` extras. Each case records the BLAS the run reports
(``info.mlx.blas``), its own ``info.seconds``, the process's wall time and the matmul's GFLOP/s: of its
fastest run, with every run's seconds and GFLOP/s beside. The bundled case runs once; the OpenBLAS cases
``--rounds`` times, interleaved (each round in another order).
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

from record_env import header, write_record

# Runs the CLI (or the matmul) with tqbridge's system search emptied: no system libopenblas.so.0 is seen.
_NO_SYSTEM = r"""
import sys
import tqbridge.bridge.mlx_blas as m
if sys.argv[1] == "nosystem":
    m._CANDIDATES = ()
if sys.argv[2] == "matmul":
    print(m.prefer_fast_blas())
    import time, mlx.core as mx
    mx.set_default_device(mx.cpu)
    n = 2048
    a = mx.random.normal((n, n)); mx.eval(a @ a)
    reps = 3
    t = time.perf_counter()
    for _ in range(reps):
        mx.eval(a @ a)
    print(2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9)
else:
    from tqbridge.tools.cli import main
    sys.exit(main(sys.argv[2:]))
"""


def _ldconfig(name: str) -> "str | None":
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith(name + " ") and "=>" in line:
            return os.path.realpath(line.split("=>")[1].strip())
    return None


def _hide_prefix(paths: "list[str]") -> "list[str] | None":
    """A command prefix that runs its command with each of ``paths`` unreadable (a private mount namespace)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not paths:
        return None
    binds = " && ".join(f"mount --bind /dev/null {p}" for p in paths)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{binds} && exec "$@"', "sh"]


def run_case(prefix: list, env: dict, mode: str, tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tqbridge-blas-") as tmp:
        out = Path(tmp) / "parity.json"
        args = ["parity", "smollm2", "--exact-weights", "--tokens", str(tokens), "--levels", "logits",
                "--json", str(out), "--quiet"]
        mm = subprocess.run([*prefix, sys.executable, "-c", _NO_SYSTEM, mode, "matmul"], env=env,
                            capture_output=True, text=True, check=True).stdout.split("\n")
        load_before = os.getloadavg()[0]
        t = time.perf_counter()
        p = subprocess.run([*prefix, sys.executable, "-c", _NO_SYSTEM, mode, *args], env=env,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"parity failed ({p.returncode}): {p.stderr[-3000:]}")
        info = json.loads(out.read_text())["info"]
        return {"blas": info["mlx"]["blas"], "logits_level_s": info["seconds"], "process_wall_s": round(wall, 1),
                "matmul_2048_f32_gflops": round(float(mm[1]), 1), "matmul_blas": mm[0],
                # the machine's 1-minute load average as the run started and ended (other work shares the cores)
                "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "kv": sorted({r["kv"] for r in json.loads(out.read_text())["logits"]})}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each OpenBLAS case (bundled: one)")
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("TQBRIDGE_BLAS", "TQBRIDGE_OPENBLAS", "LD_PRELOAD")}
    cases = {"bundled": ([], dict(base, TQBRIDGE_BLAS="bundled"), "as-is"),
             "wheel": ([], base, "nosystem")}
    hide = _hide_prefix([p for p in (_ldconfig("libgfortran.so.5"), _ldconfig("libquadmath.so.0")) if p])
    skipped = {}
    if hide:
        cases["wheel_mlx_gfortran"] = (hide, base, "nosystem")
    else:
        skipped["wheel_mlx_gfortran"] = "needs root and unshare to hide the system's libgfortran"
    if _ldconfig("libopenblas.so.0"):
        cases["system"] = ([], base, "as-is")
    else:
        skipped["system"] = "no system libopenblas.so.0"
    # bundled once (minutes); the OpenBLAS cases in --rounds rounds, each round in another order, so that a
    # change in the machine's load (2 shared cores) reaches every case alike; each case quotes its fastest run
    order = [n for n in cases if n != "bundled"]
    plan = [("bundled", 0)] + [(order[(i + r) % len(order)], r) for r in range(a.rounds) for i in range(len(order))]
    runs: dict = {}
    for name, r in plan:
        prefix, env, mode = cases[name]
        print(name, r, file=sys.stderr, flush=True)
        runs.setdefault(name, []).append(run_case(prefix, env, mode, a.tokens))
        print(json.dumps(runs[name][-1]), file=sys.stderr, flush=True)
    results = {}
    for name, rs in runs.items():
        best = min(rs, key=lambda x: x["logits_level_s"])
        results[name] = {**best, "runs_logits_level_s": [x["logits_level_s"] for x in rs],
                         "runs_matmul_2048_f32_gflops": [x["matmul_2048_f32_gflops"] for x in rs],
                         "runs_loadavg_1min": [x["loadavg_1min"] for x in rs]}
    cmd = f"tqbridge parity smollm2 --exact-weights --tokens {a.tokens} --levels logits"
    payload = {**header(("tqbridge", "mlx", "mlx-cpu", "mlx-lm", "cmeel-openblas", "llama_cpp_python", "numpy")),
               "command": cmd, "nproc": os.cpu_count(), "cases": results, "skipped": skipped}
    if "wheel" in results:
        payload["wheel_vs_bundled_speedup"] = round(results["bundled"]["logits_level_s"] / results["wheel"]["logits_level_s"], 2)
        if "system" in results:
            payload["wheel_over_system"] = round(results["wheel"]["logits_level_s"] / results["system"]["logits_level_s"], 2)
    write_record(a.out, payload, hardware="cpu", command=[cmd, "python benchmarks/scripts/record_openblas_wheel.py"])
    print(json.dumps({k: v for k, v in payload.items() if k not in ("machine",)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
