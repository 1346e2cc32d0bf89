"""Fused decode attention over a quantized K/V cache: the public entry point.

``decode_attention(q, k_blocks, v_blocks, k_format=..., v_format=..., length=...)`` computes softmax
attention of a few query rows against K and V caches stored as blocks of any registered format
pair, on the backend the dispatcher picks (the fused kernel on Metal / CUDA / the CPU emulator, or
the MLX-ops reference). :mod:`.attention_ref` holds the float64 oracle it is judged against.

Cache layout: ``(B, Hkv, L_max, row_bytes)`` uint8, one row per position and KV head, each row the
blocks :func:`tqbridge.bridge.quantize` makes of one head vector zero-padded to ``padded_dim``
values (a multiple of the format's block size: :func:`tqbridge.bridge.blocks.padding.pad_rows`; turbo
rows are padded per rotation group exactly as the fork pads them).

Public API: :func:`decode_attention`; :func:`check_problem` (its argument validation, the
:class:`~tqbridge.metal.attention.problem.Problem` it makes) and :class:`AttentionError`;
:func:`last_run` / :func:`last_run_record` / :class:`RunRecord` (what the latest call in this thread
ran); :func:`clear_call_caches`. The problem description and the run records live in
:mod:`.attention_problem`, below the kernel (:mod:`.attention_kernel`) and the reference
(:mod:`.attention_ref`); this module dispatches to those two.
"""

from __future__ import annotations

from typing import Any

from ...bridge.blocks.format_types import Format
from .problem import (AttentionError, RunRecord, check_problem, check_q_precision, last_run,
                                kernel_name, last_run_record, record_run, start_key)
from .kernel import clear_launch_caches, kernel_attention, prepare_decode
from ..decode_options import DecodeOptions, as_options

__all__ = ["decode_attention", "DecodeOptions", "check_problem", "AttentionError", "last_run", "last_run_record",
           "RunRecord", "clear_call_caches", "BACKENDS"]

BACKENDS = ("auto", "reference", "kernel", "cpu-emulator", "cuda", "metal")


def clear_call_caches() -> None:
    """Forget every plan and prepared launch (e.g. after a kernel source edit)."""
    clear_launch_caches()


def decode_attention(q: Any, k_blocks: Any, v_blocks: Any, *, k_format: Any, v_format: Any, length: Any,
                     scale: "float | None" = None, backend: str = "auto", window: "int | None" = None,
                     softcap: "float | None" = None, sinks: Any = None,
                     rotation: "tuple[int, int] | None" = None, start: Any = 0, **options: Any) -> Any:
    """Softmax attention of ``q`` over quantized K/V caches, fp32 accumulation, output in q's dtype.

    q: ``(B, Hq, D)`` or ``(B, Hq, T, D)`` with T ≤ 4 (the last T positions, causal mask).
    k_blocks / v_blocks: ``(B, Hkv, L_max, row_bytes)`` uint8; ``length``: valid positions (int or
    one per batch row). Options: ``window`` (sliding window, positions), ``softcap`` (logits become
    ``softcap * tanh(logit / softcap)``), ``sinks`` (one logit per query head, an extra key with a
    zero value), ``start`` (int or one per batch row: the first key each row sees, its left padding in
    a batch), ``rotation`` (``(k_group, v_group)``: the caches hold llama.cpp's Hadamard-rotated
    rows H.k and H.v; q is rotated and the output rotated back inside the kernel). Option ``q_precision``: ``"exact"`` (q enters the scores in float32: kernels
    ``lanes`` / ``tiles``), ``"int8"`` (q rotated, then quantized per 32 values to q8_0 — q8_1 for q4_1 / q5_1 K — as
    llama.cpp's vec_dot does; integer block dots and binary16 V products: kernel ``int8-mma``, K in q8_0 / q4_0 /
    q4_1 / q5_0 / q5_1 / iq4_nl) or None (the backend's default, ``decode_options.DEFAULT_Q_PRECISION``).
    Option ``options``: a :class:`~tqbridge.metal.decode_options.DecodeOptions` (how the kernel is planned
    and launched; ``q_precision`` merges into it). Plan overrides (``splits``, ``warps``, ``tile``,
    ``kernel``, ``lanes_per_key``, ``generic``, ``seed``) serve tests and sweeps; ``kernel`` is one of
    ``"lanes"``, ``"tiles"``, ``"int8-mma"`` (``attention_problem.KERNELS``; any other name is an
    :class:`AttentionError` listing them).
    ``backend``: ``"auto"`` (the fused kernel on the best backend here), ``"kernel"``,
    ``"metal"``, ``"cuda"``, ``"cpu-emulator"`` or ``"reference"`` (MLX ops). numpy in, numpy out;
    MLX arrays in, MLX arrays out. Returns an array shaped like q.
    """
    if backend not in BACKENDS:
        raise AttentionError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    starts = start_key(start, q)
    if "kernel" in options:
        kernel_name(options["kernel"])
    qp = options.get("q_precision")
    check_q_precision(qp)
    opts = as_options(options.get("options"), qp)
    if (starts is not False and isinstance(length, int) and backend in ("auto", "kernel", "cuda", "metal")
            and isinstance(k_format, (str, Format)) and isinstance(v_format, (str, Format))
            and not {k for k, v in options.items() if v is not None} - {"q_precision", "options"}):
        # MLX arrays on a GPU: the prepared launch of this call signature (planned for the buffers'
        # capacity, the length a parameter, as a cache layer runs it), shared in the process
        launch = prepare_decode(q, k_blocks, v_blocks, k_format=k_format, v_format=v_format, scale=scale,
                                window=window, softcap=softcap, sinks=sinks, rotation=rotation, backend=backend,
                                options=opts)
        if launch is not None and 0 <= length <= launch.l_max and type(k_blocks) is type(v_blocks) is type(q) \
                and (sinks is None or type(sinks) is type(q)) and (starts is None or all(0 <= x <= length for x in starts)):
            out = launch(q, k_blocks, v_blocks, length, sinks=sinks, starts=starts)
            record_run(RunRecord(**launch.run_info))
            return out
    prob = check_problem(q, k_blocks, v_blocks, k_format=k_format, v_format=v_format, length=length,
                         scale=scale, window=window, softcap=softcap, sinks=sinks, rotation=rotation, start=start)
    if backend == "reference":
        extra = set(options) - {"q_precision", "options"}
        if extra:
            raise AttentionError(f"unknown options for the reference path: {', '.join(sorted(extra))}")
        from .ref import reference_attention

        return reference_attention(q, k_blocks, v_blocks, prob, sinks, q_precision=opts.q_precision or "exact")
    return kernel_attention(q, k_blocks, v_blocks, prob, sinks, backend=backend, **options)

