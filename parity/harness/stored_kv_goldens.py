"""Goldens of what a TurboQuant fork build stores per layer, so CI checks the per-layer type reading
(:mod:`tqbridge.bridge.llama.stored_kv`) against the fork's own state blobs without a build.

``python -m tqbridge.parity.harness.stored_kv_goldens --llama BUILD --out DIR`` writes two random-weight
llama fixtures (:mod:`tqbridge.bridge.gguf.fixtures`; :data:`GEOMETRIES`: 12 and 16 query heads over 2 KV
heads, head dim 128, 8 layers) to a temporary directory and, for every scenario of :data:`SCENARIOS`
(a geometry, a K/V request, the fork's switches), runs the build in a fresh child process (the fork
decides its layer-adaptive mode once per process) on one token, and keeps its sequence state blob (one
cell: every layer's K and V type and row) and the log lines that announce a type change. It writes
``DIR/stored-kv-<variant>.npz``: per scenario ``{name}/blob`` (uint8) and ``{name}/meta`` (JSON: the
request, the switches, the geometry, the log lines), plus ``PROVENANCE`` (build, commit, command). No
code of the fork is in the file: the blobs are its output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# name -> (n_head, n_kv) of a llama fixture with head dim 128, 8 layers (the layer-adaptive rules act on
# 8 or more), d 256 and a small FFN (the file holds F32 weights of ~40 MB; it is not committed)
GEOMETRIES = {"12-2": (12, 2), "16-2": (16, 2)}
N_LAYER, HEAD_DIM, D, FF = 8, 128, 256, 64
FIXTURE_SEED = 46
# (name, geometry, K/V request, the fork's switches set in the child's environment)
SCENARIOS = (
    ("auto-asymmetric", "12-2", "turbo3/turbo3", {}),
    ("auto-asymmetric-off", "12-2", "turbo3/turbo3", {"TURBO_AUTO_ASYMMETRIC": "0"}),
    ("auto-asymmetric-16-2", "16-2", "turbo4/turbo4", {}),
    ("layer-adaptive", "16-2", "q8_0/turbo2", {}),
    ("layer-adaptive-off", "16-2", "q8_0/turbo2", {"TURBO_LAYER_ADAPTIVE": "0"}),
    ("both-rules", "12-2", "turbo2/turbo2", {}),
    ("asked-as-stored", "12-2", "q8_0/turbo3", {}),
)
SWITCHES = ("TURBO_AUTO_ASYMMETRIC", "TURBO_LAYER_ADAPTIVE")


def write_geometry(path: Path, geometry: str) -> Path:
    from tqbridge.bridge.gguf.fixtures import variant, write_fixture

    n_head, n_kv = GEOMETRIES[geometry]
    fx = variant("llama", n_layer=N_LAYER, d=D, n_head=n_head, n_kv=n_kv, head_dim=HEAD_DIM, ff=FF)
    return write_fixture(path, "llama", seed=FIXTURE_SEED, fixture=fx)


def child(build: str, gguf: str, request: str) -> dict:
    """In this (fresh) process: the build's state blob after one token of ``request``, and its log."""
    from tqbridge.bridge.llama.build import select
    from tqbridge.bridge.llama.shim import Shim
    from tqbridge.bridge.llama.stored_kv import RULE_LOG_MARKERS
    from tqbridge.parity.harness.run_levels import qualify_turbo
    from tqbridge.parity.harness.runtimes import KV, LlamaCppRuntime

    info = select(build)
    kv = KV.parse(qualify_turbo(request, info.variant))
    rt = LlamaCppRuntime(gguf, rotation=False, n_threads=1)
    rt.logits([1], kv, keep_state=True)
    log = [text for level, text in Shim.for_build(info).take_log() if any(m in text for m in RULE_LOG_MARKERS)]
    return {"blob": rt.last_state.hex(), "log": log, "variant": info.variant}


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tqbridge.parity.harness.stored_kv_goldens")
    ap.add_argument("--llama", required=True, metavar="BUILD", help="a TurboQuant fork build directory")
    ap.add_argument("--out", required=True, help="directory for stored-kv-<variant>.npz")
    ap.add_argument("--child", nargs=2, metavar=("GGUF", "KV"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.llama, *args.child)))
        return 0
    from tqbridge.bridge.llama.build import describe

    info = describe(args.llama)
    arrays: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {g: write_geometry(Path(tmp) / f"llama-{g}.gguf", g) for g in GEOMETRIES}
        for name, geometry, request, switches in SCENARIOS:
            env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
            env.update(switches)
            r = subprocess.run([sys.executable, "-m", "tqbridge.parity.harness.stored_kv_goldens", "--llama",
                                str(args.llama), "--out", args.out, "--child", str(files[geometry]), request],
                               capture_output=True, text=True, env=env, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"{name}: the child failed: {r.stderr.strip().splitlines()[-1:]}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            arrays[f"{name}/blob"] = np.frombuffer(bytes.fromhex(got["blob"]), np.uint8)
            n_head, n_kv = GEOMETRIES[geometry]
            arrays[f"{name}/meta"] = np.array(json.dumps({
                "request": request, "switches": switches, "geometry": geometry, "n_head": n_head, "n_head_kv": n_kv,
                "n_layer": N_LAYER, "head_dim": HEAD_DIM, "log": got["log"]}))
    r = info.report
    arrays["PROVENANCE"] = np.array(json.dumps({
        "variant": info.variant, "source_commit": r.get("commit"), "ggml_version": r.get("ggml_version"),
        "cmake_args": (r.get("recipe") or {}).get("cmake_args"),
        "command": "python -m tqbridge.parity.harness.stored_kv_goldens --llama BUILD --out DIR",
        "fixture": {"arch": "llama", "n_layer": N_LAYER, "d": D, "head_dim": HEAD_DIM, "ff": FF,
                    "seed": FIXTURE_SEED, "geometries": GEOMETRIES},
        "tokens": [1], "flash_attn": True, "kv_rotation": False, "threads": 1,
        "scenarios": [s[0] for s in SCENARIOS]}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"stored-kv-{info.variant}.npz"
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
