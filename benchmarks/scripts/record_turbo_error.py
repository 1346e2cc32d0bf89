"""Measured error of the turbo formats (docs/turbo.md, "Error" and "Head dim 64" tables).

    .venv/bin/python benchmarks/scripts/record_turbo_error.py docs/turbo-error.json

Mean ||x - x~||^2 over random unit vectors (seed 0; original-basis dequantize), per format and
head dim; for the fork formats also the Gaussian Lloyd-Max integral d * expected_mse(c, m, 1/sqrt(d)).
Deterministic: the same numbers on every run on the same numpy.
"""

from __future__ import annotations

import json
import platform
import sys

import numpy as np

from tqbridge import bridge
from tqbridge.bridge.atomic import write_atomic
from tqbridge.bridge.blocks.lloyd_max import expected_mse
from tqbridge.bridge.blocks.turbo import SPECS

VECTORS = 20_000
SEED = 0


def unit_vectors(d: int, n: int = VECTORS, seed: int = SEED) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mse(key: str, x: np.ndarray) -> float:
    d = x.shape[1]
    p = bridge.padded_dim(key, d)
    b = bridge.quantize(key, bridge.pad_rows(key, x))
    y = bridge.unpad_rows(key, bridge.dequantize(key, b, p), d)
    return float(((y.astype(np.float64) - x) ** 2).sum(axis=1).mean())


def bits_per_value(key: str, d: int) -> float:
    f = bridge.get_format(key)
    return f.row_bytes(bridge.padded_dim(key, d)) * 8 / d


def main(out: str) -> None:
    fork = {}
    x = unit_vectors(128)
    for key in ("turbo2", "turbo2@fork-69d8e4b", "turbo3", "turbo3@fork-69d8e4b", "turbo4", "turbo4@fork-69d8e4b"):
        sp = SPECS[bridge.get_format(key).key]
        fork[key] = {"head_dim": 128, "measured_mse": mse(key, x),
                     "lloyd_max_integral": sp.group * expected_mse(sp.centroids, sp.midpoints, 1 / np.sqrt(sp.group))}
    dims = {}
    for d in (64, 576, 80):
        xd = unit_vectors(d)
        for bits in (2, 3, 4) if d == 64 else (3,):
            for key in (f"turbo{bits}", f"turbo{bits}@g64"):
                dims[f"{key} d{d}"] = {"format": key, "head_dim": d, "padded_to": bridge.padded_dim(key, d),
                                       "bits_per_value": bits_per_value(key, d), "measured_mse": mse(key, xd)}
    rec = {"what": "mean ||x - dequantize(quantize(x))||^2 over random unit vectors (original basis)",
           "command": "python benchmarks/scripts/record_turbo_error.py OUT.json", "vectors": VECTORS, "seed": SEED,
           "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "fork_formats": fork, "head_dims": dims}
    write_atomic(out, json.dumps(rec, indent=1) + "\n")
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "turbo-error.json")
