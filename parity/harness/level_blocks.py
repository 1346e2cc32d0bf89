"""Level 1, blocks: the same float rows through ggml's C quantizer and through ours.

Ours means every path tqbridge has: the numpy reference, the MLX codecs, and the quantize-on-append
kernel on each kernel backend usable here (the CPU emulator everywhere; CUDA or Metal where MLX runs
on a GPU). Every path must produce ggml's bytes exactly (``np.array_equal``).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tqbridge import bridge
from tqbridge.bridge.blocks.registry import names

# The formats ggml's C library quantizes: those with an upstream ggml type id. The turbo types exist
# only in the TurboQuant forks: with a fork build chosen (--llama) they join (:func:`level_formats`);
# without one their C reference is checked through golden vectors (tests/test_turbo_golden.py).
GGML_FORMATS = names(lambda f: f.ggml_id is not None)


def level_formats() -> "list[str]":
    """The formats this process's llama.cpp side quantizes in C: upstream's, plus a fork build's turbo
    types (its variant)."""
    from tqbridge.bridge.llama.side import selected, turbo_variants

    out = list(GGML_FORMATS)
    info = selected()
    if info is not None and info.variant:
        out += [f.key for f in turbo_variants()[info.variant].values()]
    return out


def turbo_rows() -> np.ndarray:
    """Rows for the turbo types (128-value groups): the adversarial families over two groups, and
    64-value heads zero-padded to one group as the fork pads them (values, then 64 zeros)."""
    from tqbridge.bridge.blocks.padding import pad_rows
    from tqbridge.parity.plugin.strategies import adversarial_rows

    wide = adversarial_rows(block_size=128, n_blocks=2, per_family=24)
    narrow = adversarial_rows(block_size=64, n_blocks=1, per_family=24, seed=1)
    padded = pad_rows("turbo3", narrow)
    return np.concatenate([wide, np.concatenate([padded, padded], axis=1)])


def run_blocks_level(formats: "Iterable[str] | None" = None, *, rows: "np.ndarray | None" = None,
                     kernel_backends: "Iterable[str] | None" = None) -> dict[str, Any]:
    """Per format and path: bytes compared and whether they equal ggml's; a JSON-ready dict. Turbo
    formats (a fork build) are also decoded by the build's ``to_float`` (the rotated basis, as the
    fork's cache stores it) and compared with ours bit for bit."""
    from tqbridge.metal import backends
    from tqbridge.parity.plugin.strategies import adversarial_rows

    x = adversarial_rows() if rows is None else np.asarray(rows, dtype=np.float32)
    x = np.ascontiguousarray(x[np.isfinite(x).all(axis=1)], dtype=np.float32)
    kb = [b for b in (kernel_backends if kernel_backends is not None else backends()) if b != "reference"]
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - MLX is optional
        mx = None
    out = []
    for name in (level_formats() if formats is None else formats):
        fmt = bridge.get_format(name)
        out.append(_entry(fmt, turbo_rows() if fmt.kind == "turbo" and rows is None else x, kb, mx))
    return {"formats": out, "passed": all(e["passed"] for e in out)}


def _entry(fmt, x: np.ndarray, kb: "list[str]", mx) -> dict[str, Any]:
    """One format: ggml's C bytes vs every path of ours; a turbo format (a fork build) is also decoded by
    the build's ``to_float`` and compared with our rotated-basis decoder bit for bit."""
    from tqbridge.bridge.llama import ggml_c
    from tqbridge.metal import quantize_append

    x = np.ascontiguousarray(x, dtype=np.float32)
    ref = ggml_c.c_quantize(fmt, x)
    paths = {"numpy": bridge.quantize(fmt, x)}
    if mx is not None:
        paths["mlx"] = np.array(bridge.mlx_quantize(fmt, mx.array(x)))
    for b in kb:
        paths[f"kernel:{b}"] = np.asarray(quantize_append(fmt, x, backend=b))
    equal = {p: bool(np.array_equal(q, ref)) for p, q in paths.items()}
    if fmt.kind == "turbo":
        theirs = ggml_c.c_dequantize(fmt, ref, x.shape[-1])
        ours = bridge.dequantize(fmt, ref, x.shape[-1], rotated=True)
        equal["decode (rotated basis)"] = bool(np.array_equal(theirs.view(np.uint32), ours.view(np.uint32)))
    return {"format": fmt.key, "rows": int(x.shape[0]), "bytes": int(ref.size), "equal": equal,
            "passed": all(equal.values())}


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for e in report["formats"]:
        paths = ", ".join(f"{p} {'==' if ok else '!='}" for p, ok in e["equal"].items())
        lines.append(f"{e['format']:<8} {e['rows']} rows, {e['bytes']} bytes: {paths} ggml C")
    return lines
