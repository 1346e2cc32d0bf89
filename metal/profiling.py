"""Timing MLX work on a GPU: host graph building, wall time, and device time per kernel.

``build_and_wall`` splits a call's wall time into the host's graph building and the rest;
``device_times`` sums the device time of every kernel an evaluation ran, by kernel name, through
CUPTI (PyTorch's profiler). CUPTI sees every kernel of the process, MLX's included; where PyTorch
or its CUDA build is missing the answer is a sentence saying why, never a number.
``parse_options`` / ``split_options`` read decode options from a bench label (``q8_0/turbo3{chunks=1}``,
where they sit: :func:`tqbridge.bridge.blocks.kv_spec.split_label`),
for comparisons within one process, free of the spread between processes.
Used by ``tqbridge bench attention`` / ``bench decode`` and the scripts under ``benchmarks/``.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

from tqbridge.bridge.blocks.format_types import FormatError
from tqbridge.bridge.blocks.kv_spec import split_label

from .attention.problem import AttentionError
from .decode_options import DecodeOptions


def build_and_wall(mx: Any, make: Callable[[Any], Any], args: Iterable[Any], calls: int) -> "tuple[float, float]":
    """Median µs per call of building ``make(arg)``'s MLX graph and of the whole evaluation (build +
    evaluation to the end of the device work), one timed evaluation per item of ``args`` after a
    warm-up on the first (so a sequence of growing lengths times a new length every evaluation).
    ``make(arg)`` makes ``calls`` chained calls."""
    build, _, wall = build_encode_wall(mx, make, args, calls)
    return build, wall


def build_encode_wall(mx: Any, make: Callable[[Any], Any], args: Iterable[Any],
                      calls: int) -> "tuple[float, float, float]":
    """As :func:`build_and_wall`, with the median µs per call that ``mx.async_eval`` takes in between:
    the host's share of the evaluation (MLX encodes every primitive on the calling thread and returns
    once the work is submitted; a graph MLX commits before the end already runs meanwhile), so per
    evaluation ``wall - build - encode`` is the wait for the device after the last submission (the
    three medians need not add up)."""
    args = list(args)
    if len(args) < 2:
        raise ValueError("build_and_wall needs a warm-up argument and at least one timed one")
    mx.eval(make(args[0]))
    build, encode, wall = [], [], []
    for a in args[1:]:
        mx.synchronize()
        t0 = time.perf_counter()
        out = make(a)
        t1 = time.perf_counter()
        mx.async_eval(out)
        t2 = time.perf_counter()
        mx.synchronize()
        t3 = time.perf_counter()
        build.append(t1 - t0)
        encode.append(t2 - t1)
        wall.append(t3 - t0)
    return tuple(statistics.median(x) / calls * 1e6 for x in (build, encode, wall))


def pipelined_wall(mx: Any, make: Callable[[Any], Any], args: Iterable[Any], calls: int) -> float:
    """µs per call of evaluating ``make(arg)`` for each item of ``args`` after a warm-up on the first, in a
    pipelined loop as mlx-lm's generate runs its decode steps: evaluation i + 1's graph is built and
    submitted (``mx.async_eval``) before the loop waits for evaluation i, so the host's building and
    encoding of one evaluation overlap the device's work on the one before. The total from the first
    build to the end of the last evaluation, divided by the evaluations and ``calls``: about
    max(host time, device time) per call once the pipeline is full."""
    args = list(args)
    if len(args) < 2:
        raise ValueError("pipelined_wall needs a warm-up argument and at least one timed one")
    mx.eval(make(args[0]))
    mx.synchronize()
    t0 = time.perf_counter()
    prev = None
    for a in args[1:]:
        out = make(a)
        mx.async_eval(out)
        if prev is not None:
            mx.eval(prev)
        prev = out
    mx.eval(prev)
    mx.synchronize()
    return (time.perf_counter() - t0) / (len(args) - 1) / calls * 1e6


def layer_buffers(mx: Any, k_format, v_format, shape: tuple, layers: int) -> tuple:
    """Per-layer cache buffers for a chain of ``layers`` (distinct copies, so no layer reads another's
    data from the L2): K and V blocks of N(0, 1) rows of ``shape`` (B, Hkv, L, D) in the two formats, and
    the same rows in fp16 for MLX's SDPA; evaluated. Returns ``(kb, vb, kh, vh)``, lists of ``layers``."""
    from ..bridge import mlx_quantize

    kx, vx = mx.random.normal(shape), mx.random.normal(shape)
    kb0, vb0 = mlx_quantize(k_format, kx), mlx_quantize(v_format, vx)
    kh0, vh0 = kx.astype(mx.float16), vx.astype(mx.float16)
    out = tuple([a + 0 for _ in range(layers)] for a in (kb0, vb0, kh0, vh0))
    mx.eval(*out)
    return out


def device_time_unavailable() -> "str | None":
    """Why :func:`device_times` cannot measure here, or None when it can."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile  # noqa: F401
    except ImportError as e:
        return f"no PyTorch profiler: {e}"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device (device time is measured through CUPTI)"
    return None


def device_times(mx: Any, fn: Callable[[], Any]) -> "dict | str":
    """Device time (µs, summed over one evaluation of ``fn`` after a warm-up one) per kernel name, as
    ``{name: {"count": n, "us": t}}``; a sentence instead where CUPTI cannot be reached."""
    why = device_time_unavailable()
    if why:
        return why
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    mx.eval(fn())
    mx.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mx.eval(fn())
        mx.synchronize()
        torch.cuda.synchronize()
    out: dict = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is None or "CUDA" not in str(dt):
            continue
        name = e.name[:60]
        out[name][0] += 1
        out[name][1] += getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
    if not out:
        return "the profiler saw no CUDA kernel (MLX may not be running on CUDA)"
    return {k: {"count": c, "us": round(t, 2)} for k, (c, t) in out.items()}


def device_us_per_call(times: "dict | str", calls: int) -> "float | None":
    """The summed device time of :func:`device_times` per call, None where it is a sentence."""
    if isinstance(times, str):
        return None
    return sum(v["us"] for v in times.values()) / calls


class SettingsError(ValueError):
    """A label whose decode options are not ``name=value[,...]`` in one pair of braces."""


def parse_options(text: str) -> DecodeOptions:
    """``"chunks=1,compile=0"`` -> the :class:`~tqbridge.metal.decode_options.DecodeOptions` it names
    (:meth:`DecodeOptions.parse`); errors as :class:`SettingsError`."""
    try:
        return DecodeOptions.parse(text)
    except AttentionError as e:
        raise SettingsError(str(e)) from None


def split_options(label: str):
    """``"q8_0/turbo3{device_params=0}"`` -> ``("q8_0/turbo3", DecodeOptions(device_params=False))``; a label
    without braces -> ``(label, DecodeOptions())``. Where the options sit is the K/V grammar's
    (:func:`tqbridge.bridge.blocks.kv_spec.split_label`); errors as :class:`SettingsError`."""
    try:
        base, opts = split_label(label)
    except FormatError as e:
        raise SettingsError(str(e)) from None
    return base, parse_options(opts)
