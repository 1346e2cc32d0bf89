"""Level 1, blocks: the same float rows through ggml's C quantizer and through ours.

Ours means every path tqbridge has: the numpy reference, the MLX codecs, and the quantize-on-append
kernel on each kernel backend usable here (the CPU emulator everywhere; CUDA or Metal where MLX runs
on a GPU). Every path must produce ggml's bytes exactly (``np.array_equal``).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tqbridge import bridge
from tqbridge.bridge.registry import names

# The formats ggml's C library quantizes: those with an upstream ggml type id (the turbo types exist
# only in the TurboQuant forks; their C reference is checked through golden vectors instead,
# tests/test_turbo_golden.py).
GGML_FORMATS = names(lambda f: f.ggml_id is not None)


def run_blocks_level(formats: Iterable[str] = GGML_FORMATS, *, rows: "np.ndarray | None" = None,
                     kernel_backends: "Iterable[str] | None" = None) -> dict[str, Any]:
    """Per format and path: bytes compared and whether they equal ggml's; a JSON-ready dict."""
    from tqbridge.bridge import ggml_c
    from tqbridge.metal import backends, quantize_append
    from tqbridge.parity.plugin.strategies import adversarial_rows

    x = adversarial_rows() if rows is None else np.asarray(rows, dtype=np.float32)
    x = np.ascontiguousarray(x[np.isfinite(x).all(axis=1)], dtype=np.float32)
    kb = [b for b in (kernel_backends if kernel_backends is not None else backends()) if b != "reference"]
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - MLX is optional
        mx = None
    out = []
    for name in formats:
        fmt = bridge.get_format(name)
        ref = ggml_c.c_quantize(fmt, x)
        paths = {"numpy": bridge.quantize(fmt, x)}
        if mx is not None:
            paths["mlx"] = np.array(bridge.mlx_quantize(fmt, mx.array(x)))
        for b in kb:
            paths[f"kernel:{b}"] = np.asarray(quantize_append(fmt, x, backend=b))
        equal = {p: bool(np.array_equal(q, ref)) for p, q in paths.items()}
        out.append({"format": fmt.key, "rows": int(x.shape[0]), "bytes": int(ref.size), "equal": equal,
                    "passed": all(equal.values())})
    return {"formats": out, "passed": all(e["passed"] for e in out)}


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for e in report["formats"]:
        paths = ", ".join(f"{p} {'==' if ok else '!='}" for p, ok in e["equal"].items())
        lines.append(f"{e['format']:<8} {e['rows']} rows, {e['bytes']} bytes: {paths} ggml C")
    return lines
