"""Assertion helpers whose failure messages say what differs and where.

- :func:`assert_blocks_equal`: byte equality of quantized blocks; on failure the first differing
  block, both byte dumps and both decoded into their fields (scale, min, codes, turbo norm ...).
- :func:`assert_values_close`: dequantized values, NaN where the reference has NaN, else within a
  named tolerance (exact by default).
- :func:`assert_attention_close`: attention outputs against the oracle's bound (or a named relative
  tolerance): worst position, its error, relative error and the bound.
- :func:`assert_logits_parity`: two runtimes' logits: mean / worst KL, top-1 agreement, worst position.

All raise ``AssertionError`` (so pytest shows the message) and return a small dict of the measured
numbers when they pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...bridge import dequantize, get_format
from ...bridge.blocks.format_types import Format
from ...metal.attention.problem import to_numpy


def _hex(b: np.ndarray) -> str:
    h = bytes(b).hex()
    return " ".join(h[i:i + 8] for i in range(0, len(h), 8))


def _indices(mask: np.ndarray, most: int = 12) -> str:
    idx = np.flatnonzero(mask).tolist()
    return str(idx) if len(idx) <= most else f"{idx[:most]}... ({len(idx)})"


def describe_block(fmt: "str | Format", block: np.ndarray) -> str:
    """One block's fields in words, e.g. ``d=0.01234 (0x2a51) q=[...]``."""
    f = get_format(fmt)
    b = np.ascontiguousarray(block, dtype=np.uint8).reshape(1, f.type_size)
    if f.kind == "float":
        return f"value={float(dequantize(f, b, 1)[0, 0])!r}"
    if f.kind == "turbo":
        norm, idx = f.codec.unpack(b)
        bits = int(b[0, 0]) | (int(b[0, 1]) << 8)
        return f"norm={float(norm[0]):.6g} (0x{bits:04x}) idx={idx[0].tolist()}"
    from ...bridge.blocks.legacy_fields import split_blocks

    fields = split_blocks(f, b)
    parts = []
    for name in ("d", "m"):
        if name in fields:
            v = fields[name][0]
            parts.append(f"{name}={float(v):.6g} (0x{int(np.array(v, '<f2').view('<u2')):04x})")
    if "qh" in fields:
        parts.append(f"qh=0x{int(fields['qh'][0]):08x}")
    parts.append(f"q={fields['q'][0].tolist()}")
    return " ".join(parts)


def assert_blocks_equal(actual: Any, expected: Any, fmt: "str | Format", *, context: str = "") -> dict:
    """``actual`` and ``expected`` hold the same bytes; else name the first differing block and decode both."""
    f = get_format(fmt)
    a, e = to_numpy(actual), to_numpy(expected)
    where = f" ({context})" if context else ""
    if a.dtype != np.uint8:
        raise AssertionError(f"{f.key} blocks{where}: expected uint8, got dtype {a.dtype}")
    if a.shape != e.shape:
        raise AssertionError(f"{f.key} blocks{where}: shape {a.shape} != expected {e.shape}")
    if np.array_equal(a, e):
        return {"blocks": a.size // f.type_size, "differing": 0}
    ab = np.ascontiguousarray(a).reshape(-1, f.type_size)
    eb = np.ascontiguousarray(e).reshape(-1, f.type_size)
    diff = np.flatnonzero((ab != eb).any(axis=1))
    i = int(diff[0])
    per_row = (e.shape[-1] // f.type_size) if e.ndim else 1
    pos = np.unravel_index(i // per_row, e.shape[:-1]) if e.ndim > 1 else ()
    byte = int(np.flatnonzero(ab[i] != eb[i])[0])
    ev = dequantize(f, eb[i:i + 1], f.block_size)[0]
    av = dequantize(f, ab[i:i + 1], f.block_size)[0]
    with np.errstate(invalid="ignore"):
        dv = np.abs(av.astype(np.float64) - ev.astype(np.float64))
    lines = [
        f"{f.key} blocks differ{where}: {diff.size} of {eb.shape[0]} blocks; first is block {i} "
        f"(row {tuple(int(x) for x in pos)}, block {i % per_row} of the row), first differing byte {byte}",
        f"  actual:   {_hex(ab[i])}",
        f"  expected: {_hex(eb[i])}",
        f"  actual fields:   {describe_block(f, ab[i])}",
        f"  expected fields: {describe_block(f, eb[i])}",
        f"  decoded values: max |actual - expected| = {np.nanmax(dv) if np.isfinite(dv).any() else float('nan'):.6g}; "
        f"values that differ: {_indices(~((av == ev) | (np.isnan(av) & np.isnan(ev))))} of {f.block_size}",
    ]
    raise AssertionError("\n".join(lines))


def assert_values_close(actual: Any, expected: Any, *, atol: float = 0.0, rtol: float = 0.0,
                        tolerance_name: str = "exact", context: str = "") -> dict:
    """Float arrays agree: NaN exactly where ``expected`` is NaN, equal infinities, and elsewhere
    ``|a - e| <= atol + rtol * |e|`` (the default, 0 and 0, is exact equality)."""
    a, e = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    where = f" ({context})" if context else ""
    if a.shape != e.shape:
        raise AssertionError(f"values{where}: shape {a.shape} != expected {e.shape}")
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if (nan_a != nan_e).any():
        i = np.unravel_index(int(np.flatnonzero(nan_a != nan_e)[0]), a.shape)
        raise AssertionError(f"values{where}: NaN mismatch at {tuple(int(x) for x in i)}: actual {a[i]!r}, expected {e[i]!r}")
    ok = ~nan_e
    with np.errstate(invalid="ignore"):
        err = np.where(ok & (a == e), 0.0, np.abs(a - e))
    err = np.where(ok, err, 0.0)
    lim = atol + rtol * np.abs(np.where(np.isfinite(e), e, 0.0))
    bad = err > lim
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err - lim, -np.inf))), a.shape)
        raise AssertionError(
            f"values{where}: {int(bad.sum())} of {a.size} outside tolerance {tolerance_name} "
            f"(atol={float(np.max(atol)):.3g}, rtol={rtol:.3g}); worst at {tuple(int(x) for x in i)}: "
            f"actual {float(a[i])!r}, expected {float(e[i])!r}, |error| {err[i]:.6g}, allowed {float(lim[i]):.3g}")
    return {"max_abs_error": float(err.max()) if err.size else 0.0}


def assert_attention_close(actual: Any, expected: Any, bound: Any = None, *, rtol: "float | None" = None,
                           tolerance_name: "str | None" = None, context: str = "") -> dict:
    """Attention output ``actual`` vs the float64 ``expected``.

    With ``bound`` (the oracle's per-component bound, e.g. ``*problem.oracle()``) every component
    must satisfy ``|a - e| <= bound``; with ``rtol`` instead, ``|a - e| <= rtol * max|e|`` over each
    output row. The message gives the worst position (b, head, [t,] d), its error, the error relative
    to the row's largest value, and the tolerance by name. Returns the worst ratio error / allowed.
    """
    a, e = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    where = f" ({context})" if context else ""
    if a.shape != e.shape:
        raise AssertionError(f"attention{where}: output shape {a.shape} != expected {e.shape}")
    if (bound is None) == (rtol is None):
        raise ValueError("give exactly one of bound= (per component) or rtol= (relative to each row's max)")
    rowmax = np.abs(e).max(axis=-1, keepdims=True) if e.size else e
    if bound is not None:
        allowed = to_numpy(bound).astype(np.float64)
        name = tolerance_name or "oracle bound (tqbridge.metal.attention.ref)"
    else:
        allowed = float(rtol) * np.broadcast_to(rowmax, e.shape)
        name = tolerance_name or f"rtol={rtol:.3g} of the row max"
    if not np.isfinite(a).all():
        i = np.unravel_index(int(np.flatnonzero(~np.isfinite(a))[0]), a.shape)
        raise AssertionError(f"attention{where}: non-finite output {float(a[i])!r} at {tuple(int(x) for x in i)} "
                             f"(expected {e[i]:.6g})")
    err = np.abs(a - e)
    ratio = np.where(allowed > 0, err / np.where(allowed > 0, allowed, 1.0), np.where(err > 0, np.inf, 0.0))
    worst = float(ratio.max()) if ratio.size else 0.0
    if worst > 1.0:
        i = np.unravel_index(int(np.argmax(err - allowed)), a.shape)
        rel = err[i] / rowmax[i[:-1] + (0,)] if rowmax[i[:-1] + (0,)] > 0 else float("inf")
        raise AssertionError(
            f"attention{where}: {int((ratio > 1).sum())} of {a.size} components exceed the {name}; worst at "
            f"{tuple(int(x) for x in i)} (b, head, {'t, ' if a.ndim == 4 else ''}d): actual {a[i]:.6g}, expected "
            f"{e[i]:.6g}, |error| {err[i]:.3g} = {rel:.3g} of the row's max |value|, allowed {allowed[i]:.3g} "
            f"({'no error allowed' if allowed[i] == 0 else f'{err[i] / allowed[i]:.3g}x over'})")
    return {"worst_ratio": worst, "max_abs_error": float(err.max()) if err.size else 0.0}


def assert_logits_parity(reference: Any, candidate: Any, *, max_kl_mean: float, max_kl: "float | None" = None,
                         min_top1: float = 0.0, context: str = "") -> dict:
    """Logits ``(positions, vocab)`` of two runtimes on the same tokens agree within named limits:
    mean KL(reference || candidate) <= ``max_kl_mean``, worst position KL <= ``max_kl`` (if given),
    top-1 agreement >= ``min_top1``. The message reports all three, the worst position and the first
    position where the top-1 token differs."""
    from ..harness.metrics import compare_logits

    p, q = to_numpy(reference), to_numpy(candidate)
    where = f" ({context})" if context else ""
    if p.shape != q.shape or p.ndim != 2:
        raise AssertionError(f"logits{where}: shapes {p.shape} and {q.shape} are not one (positions, vocab) shape")
    r = compare_logits(p, q)
    kl = r.pop("kl_per_position")
    worst = int(np.argmax(kl))
    top_p, top_q = np.argmax(p, axis=-1), np.argmax(q, axis=-1)
    miss = np.flatnonzero(top_p != top_q)
    problems = []
    if r["kl_mean"] > max_kl_mean:
        problems.append(f"mean KL {r['kl_mean']:.3g} > {max_kl_mean:.3g}")
    if max_kl is not None and r["kl_max"] > max_kl:
        problems.append(f"worst KL {r['kl_max']:.3g} > {max_kl:.3g}")
    if r["top1"] < min_top1:
        problems.append(f"top-1 agreement {r['top1']:.4f} < {min_top1:.4f}")
    if problems:
        first = (f"; first top-1 mismatch at position {int(miss[0])}: token {int(top_p[miss[0]])} vs "
                 f"{int(top_q[miss[0]])}") if miss.size else ""
        raise AssertionError(
            f"logits{where}: {', '.join(problems)} over {r['positions']} positions; worst KL {kl[worst]:.3g} at "
            f"position {worst}; top-1 agreement {r['top1']:.4f}; max |delta logit| {r['max_abs']:.3g}{first}")
    r["worst_position"] = worst
    return r
