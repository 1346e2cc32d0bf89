"""Fused decode attention over a quantized K/V cache: the public entry point.

``decode_attention(q, k_blocks, v_blocks, k_format=..., v_format=..., length=...)`` computes softmax
attention of a few query rows against K and V caches stored as blocks of any registered format
pair, on the backend the dispatcher picks (the fused kernel on Metal / CUDA / the CPU emulator, or
the MLX-ops reference). :mod:`.attention_ref` holds the float64 oracle it is judged against.

Cache layout: ``(B, Hkv, L_max, row_bytes)`` uint8, one row per position and KV head, each row the
blocks :func:`tqbridge.bridge.quantize` makes of one head vector zero-padded to ``padded_dim``
values (a multiple of the format's block size: :func:`tqbridge.bridge.padding.pad_rows`; turbo
rows are padded per rotation group exactly as the fork pads them).

Public API: :func:`decode_attention`; :func:`check_problem` (its argument validation, the
:class:`~tqbridge.metal.attention_problem.Problem` it makes) and :class:`AttentionError`;
:func:`last_run` / :func:`last_run_record` / :class:`RunRecord` (what the latest call in this thread
ran); :func:`clear_call_caches`. The problem description and the run records live in
:mod:`.attention_problem`, below the kernel (:mod:`.attention_kernel`) and the reference
(:mod:`.attention_ref`); this module dispatches to those two.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..bridge.format_types import Format
from .attention_problem import (AttentionError, RunRecord, check_problem, check_q_precision, last_run,
                                kernel_name, last_run_record, record_run)
from .decode_options import DecodeOptions, as_options

__all__ = ["decode_attention", "DecodeOptions", "check_problem", "AttentionError", "last_run", "last_run_record",
           "RunRecord", "clear_call_caches", "BACKENDS"]

BACKENDS = ("auto", "reference", "kernel", "cpu-emulator", "cuda", "metal")


class _BoundedCache(dict):
    """A per-signature memo that forgets everything when it passes ``limit`` entries."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def put(self, key, value) -> None:
        if len(self) > self.limit:
            self.clear()
        self[key] = value


# the repeated calls of a decoding loop: validated shapes per call signature, and (on a GPU, MLX
# arrays) the prepared launches per signature + length + backend + options with the RunRecord they make
_checked_problems = _BoundedCache(1024)
_prepared_calls = _BoundedCache(4096)
# MLX arrays on a GPU, a plain length and no launch options but q_precision: one DecodeLaunch per call
# signature + backend + q_precision (the plan made for the buffers' capacity, the length a parameter,
# as TQCache runs it), so a loop whose length grows every call plans and prepares once, not per
# length; False where none applies (numpy inputs, no GPU)
_length_free_calls = _BoundedCache(1024)


def clear_call_caches() -> None:
    """Forget the validated call signatures and prepared launches (e.g. after a kernel source edit)."""
    _checked_problems.clear()
    _prepared_calls.clear()
    _length_free_calls.clear()


def _length_free_launch(key, q, k_blocks, v_blocks, backend, opts, **kw):
    """(DecodeLaunch, array type, RunRecord) for this call signature on a GPU, or False."""
    lk = (key, backend, opts)
    hit = _length_free_calls.get(lk)
    if hit is None:
        from .attention_kernel import prepare_decode

        dl = prepare_decode(q, k_blocks, v_blocks, backend=backend, options=opts, **kw)
        hit = (dl, type(q), RunRecord(**dl.run_info)) if dl is not None else False
        _length_free_calls.put(lk, hit)
    return hit


def decode_attention(q: Any, k_blocks: Any, v_blocks: Any, *, k_format: Any, v_format: Any, length: Any,
                     scale: "float | None" = None, backend: str = "auto", window: "int | None" = None,
                     softcap: "float | None" = None, sinks: Any = None,
                     rotation: "tuple[int, int] | None" = None, **options: Any) -> Any:
    """Softmax attention of ``q`` over quantized K/V caches, fp32 accumulation, output in q's dtype.

    q: ``(B, Hq, D)`` or ``(B, Hq, T, D)`` with T ≤ 4 (the last T positions, causal mask).
    k_blocks / v_blocks: ``(B, Hkv, L_max, row_bytes)`` uint8; ``length``: valid positions (int or
    one per batch row). Options: ``window`` (sliding window, positions), ``softcap`` (logits become
    ``softcap * tanh(logit / softcap)``), ``sinks`` (one logit per query head, an extra key with a
    zero value), ``rotation`` (``(k_group, v_group)``: the caches hold llama.cpp's Hadamard-rotated
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
    key = None
    if isinstance(length, int) and isinstance(k_format, (str, Format)) and isinstance(v_format, (str, Format)):
        # decoding calls repeat the same shapes with a growing length: validate the shapes once per
        # call signature, the length every time
        key = (tuple(q.shape), str(q.dtype), tuple(k_blocks.shape), str(k_blocks.dtype), tuple(v_blocks.shape),
               str(v_blocks.dtype), k_format, v_format, scale, window, softcap,
               None if sinks is None else tuple(sinks.shape), rotation)
    if "kernel" in options:
        kernel_name(options["kernel"])
    qp = options.get("q_precision")
    check_q_precision(qp)
    opts = as_options(options.get("options"), qp)
    if (key is not None and backend in ("auto", "kernel", "cuda", "metal")
            and not {k for k, v in options.items() if v is not None} - {"q_precision", "options"}):
        hit = _length_free_launch(key, q, k_blocks, v_blocks, backend, opts, k_format=k_format, v_format=v_format,
                                  scale=scale, window=window, softcap=softcap, sinks=sinks, rotation=rotation)
        if (hit and type(q) is type(k_blocks) is type(v_blocks) is hit[1] and (sinks is None or type(sinks) is hit[1])
                and 0 <= length <= hit[0].l_max):
            out = hit[0](q, k_blocks, v_blocks, length, sinks=sinks)
            record_run(hit[2])
            return out
    fast_key = None
    if key is not None:
        # a decoding loop repeats the same call on a GPU: one lookup, then the two launches
        fast_key = (key, length, backend, tuple(sorted(options.items())) if options else ())
        fast = _prepared_calls.get(fast_key)
        if (fast is not None and type(q) is type(k_blocks) is type(v_blocks) is fast[1]
                and (sinks is None or type(sinks) is fast[1])):
            out = fast[0](q, k_blocks, v_blocks, sinks)
            record_run(fast[2])
            return out
    base = _checked_problems.get(key) if key is not None else None
    if base is not None and 0 <= length <= base.l_max:
        prob = dataclasses.replace(base, lengths=(length,) * base.batch)
    else:
        prob = check_problem(q, k_blocks, v_blocks, k_format=k_format, v_format=v_format, length=length,
                             scale=scale, window=window, softcap=softcap, sinks=sinks, rotation=rotation)
        if key is not None:
            _checked_problems.put(key, prob)
    if backend == "reference":
        extra = set(options) - {"q_precision", "options"}
        if extra:
            raise AttentionError(f"unknown options for the reference path: {', '.join(sorted(extra))}")
        from .attention_ref import reference_attention

        return reference_attention(q, k_blocks, v_blocks, prob, sinks, q_precision=opts.q_precision or "exact")
    from .attention_kernel import kernel_attention

    out = kernel_attention(q, k_blocks, v_blocks, prob, sinks, backend=backend, **options)
    if fast_key is not None:
        from .attention_kernel import fast_call

        run = last_run_record()
        fast = fast_call(q, prob, options, backend=run.backend)
        if fast is not None:
            _prepared_calls.put(fast_key, (fast, type(q), run))
    return out

