"""Fused decode attention over a quantized K/V cache: the public entry point.

``decode_attention(q, k_blocks, v_blocks, k_format=..., v_format=..., length=...)`` computes softmax
attention of a few query rows against K and V caches stored as blocks of any registered format
pair, on the backend the dispatcher picks (the fused kernel on Metal / CUDA / the CPU emulator, or
the MLX-ops reference). :mod:`.attention_ref` holds the float64 oracle it is judged against.

Cache layout: ``(B, Hkv, L_max, row_bytes)`` uint8, one row per position and KV head, each row the
blocks :func:`tqbridge.bridge.quantize` makes of one head vector zero-padded to ``padded_dim``
values (a multiple of the format's block size: :func:`tqbridge.bridge.padding.pad_rows`; turbo
rows are padded per rotation group exactly as the fork pads them).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..bridge import FormatError, get_format
from ..bridge.padding import padded_dim
from ..bridge.registry import Format

MAX_QUERY_ROWS = 4          # speculative decoding: at most 4 new query rows per call
MAX_ROTATION = 256          # largest Hadamard group (the kernel's sign tables hold 256 entries)
BACKENDS = ("auto", "reference", "kernel", "cpu-emulator", "cuda", "metal")
Q_PRECISIONS = ("exact", "int8")   # how q enters the scores (see decode_attention)


class AttentionError(ValueError):
    """Bad arguments to :func:`decode_attention`; the message names the problem."""


@dataclass(frozen=True)
class RunRecord:
    """What one :func:`decode_attention` call ran. The reference path sets ``backend`` and
    ``dispatches`` only; the kernel path sets every field (its launch plan and accumulation chain)."""

    backend: str
    dispatches: int
    kernel: "str | None" = None
    splits: "int | None" = None
    lanes_per_key: "int | None" = None
    warps: "int | None" = None
    tile: "int | None" = None
    chain: "int | None" = None
    q_precision: "str | None" = None
    v_decode: "str | None" = None   # kernel v3: how V rows became fragments (attention_kernel.v3_v_decode)
    chunks: "int | None" = None     # kernel v3: 16-key chunks per SIMD-group step (attention_kernel.Plan.chunks)
    stages: "int | None" = None     # kernel v3: tiles in the copy ring (attention_kernel.Plan.stages)
    dyn_smem: "int | None" = None   # kernel v3: bytes of dynamic threadgroup memory (0: static; Plan.dyn_smem)
    prologue: "int | None" = None   # kernel v3: the prologue variant (attention_kernel.v3_prologue)
    merge_pad: "bool | None" = None  # kernel v3: partial rows padded in the SIMD groups' merge (v3_merge_pad)
    compiled: "bool | None" = None  # a prepared decode launch: whether it ran under mx.compile (COMPILE_BACKENDS)
    device_params: "bool | None" = None   # its per-step ints as views of a device table (TQBRIDGE_DEVICE_PARAMS)
    device_consts: "bool | None" = None   # its constant inputs as device copies of >= 16 bytes (TQBRIDGE_DEVICE_CONSTS)

    def as_dict(self) -> dict:
        """The fields that are set (the form :func:`last_run` returns)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


_local = threading.local()   # .run: the RunRecord of the latest call in this thread


def record_run(run: RunRecord) -> None:
    """Record what the call just made in this thread ran (the attention backends call this)."""
    _local.run = run


def last_run_record() -> "RunRecord | None":
    """The :class:`RunRecord` of the latest :func:`decode_attention` call in this thread (None before any)."""
    return getattr(_local, "run", None)


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


def _length_free_launch(key, q, k_blocks, v_blocks, backend, qp, **kw):
    """(DecodeLaunch, array type, RunRecord) for this call signature on a GPU, or False."""
    lk = (key, backend, qp)
    hit = _length_free_calls.get(lk)
    if hit is None:
        from .attention_kernel import prepare_decode

        dl = prepare_decode(q, k_blocks, v_blocks, backend=backend, q_precision=qp, **kw)
        hit = (dl, type(q), RunRecord(**dl.run_info)) if dl is not None else False
        _length_free_calls.put(lk, hit)
    return hit


@dataclass(frozen=True)
class Problem:
    """Validated, normalised arguments of one attention call (shapes and options, no data)."""

    batch: int
    q_heads: int
    kv_heads: int
    rows: int                 # query rows T (1 for plain decode)
    head_dim: int             # D, the real head dimension (of q and of the output)
    l_max: int
    lengths: tuple[int, ...]  # one per batch row
    k_format: Format
    v_format: Format
    k_dim: int                # values stored per K row (padded)
    v_dim: int                # values stored per V row (padded)
    scale: float
    window: int               # 0: no sliding window
    softcap: float            # 0: no soft-capping
    has_sinks: bool
    squeeze_rows: bool        # q came as (B, Hq, D)
    k_rot: int = 0            # llama.cpp's Hadamard group the K rows were rotated by (0: none)
    v_rot: int = 0            # the same for V (the output is rotated back)

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("mlx.core.", "")


def _row_values(fmt: Format, row_bytes: int, what: str) -> int:
    if row_bytes <= 0 or row_bytes % fmt.type_size:
        raise AttentionError(
            f"{what}: last axis of {row_bytes} bytes is not a whole number of {fmt.key} blocks ({fmt.type_size} bytes each)"
        )
    return row_bytes // fmt.type_size * fmt.block_size


def check_problem(q: Any, k_blocks: Any, v_blocks: Any, *, k_format: Any, v_format: Any, length: Any,
                  scale: "float | None" = None, window: "int | None" = None, softcap: "float | None" = None,
                  sinks: Any = None, rotation: "tuple[int, int] | None" = None) -> Problem:
    """Validate every argument of :func:`decode_attention`; one clear error per problem."""
    try:
        kf, vf = get_format(k_format), get_format(v_format)
    except FormatError as e:
        raise AttentionError(str(e)) from None
    qs = _shape(q)
    if len(qs) not in (3, 4):
        raise AttentionError(f"q must be (B, Hq, D) or (B, Hq, T, D); got shape {qs}")
    if not any(t in _dtype_name(q) for t in ("float", "bfloat")):
        raise AttentionError(f"q must be a float array; got dtype {_dtype_name(q)}")
    squeeze = len(qs) == 3
    b, hq = qs[0], qs[1]
    t = 1 if squeeze else qs[2]
    d = qs[-1]
    if not 1 <= t <= MAX_QUERY_ROWS:
        raise AttentionError(f"q has {t} query rows; 1 to {MAX_QUERY_ROWS} are supported")
    if b < 1 or hq < 1 or d < 1:
        raise AttentionError(f"q has an empty axis: shape {qs}")
    for name, blk in (("k_blocks", k_blocks), ("v_blocks", v_blocks)):
        if len(_shape(blk)) != 4:
            raise AttentionError(f"{name} must be (B, Hkv, L_max, row_bytes); got shape {_shape(blk)}")
        if _dtype_name(blk) != "uint8":
            raise AttentionError(f"{name} must be uint8 blocks; got dtype {_dtype_name(blk)}")
    ks, vs = _shape(k_blocks), _shape(v_blocks)
    if ks[:3] != vs[:3]:
        raise AttentionError(f"k_blocks {ks} and v_blocks {vs} disagree on (B, Hkv, L_max)")
    if ks[0] != b:
        raise AttentionError(f"q has batch {b} but the cache has batch {ks[0]}")
    hkv, l_max = ks[1], ks[2]
    if hkv < 1 or hq % hkv:
        raise AttentionError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    kd, vd = _row_values(kf, ks[3], "k_blocks"), _row_values(vf, vs[3], "v_blocks")
    for fmt, got, what in ((kf, kd, "k_blocks"), (vf, vd, "v_blocks")):
        want = padded_dim(fmt, d)
        if got != want:
            raise AttentionError(
                f"{what}: rows hold {got} {fmt.key} values, but head dim {d} is stored as {want} "
                f"(padded to the block size {fmt.block_size}; see tqbridge.bridge.padding.pad_rows)"
            )
    if isinstance(length, (int, np.integer)):
        lengths = (int(length),) * b
    else:
        try:
            lengths = tuple(int(x) for x in np.asarray(length).reshape(-1))
        except (TypeError, ValueError):
            raise AttentionError(f"length must be an int or one int per batch row; got {length!r}") from None
        if len(lengths) != b:
            raise AttentionError(f"length has {len(lengths)} entries for a batch of {b}")
    for x in lengths:
        if not 0 <= x <= l_max:
            raise AttentionError(f"length {x} is outside 0..{l_max} (the cache's L_max)")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale):
        raise AttentionError(f"scale must be finite; got {scale}")
    window = 0 if window is None else int(window)
    if window < 0:
        raise AttentionError(f"window must be positive (or None for no window); got {window}")
    softcap = 0.0 if softcap is None else float(softcap)
    if softcap < 0 or not math.isfinite(softcap):
        raise AttentionError(f"softcap must be a positive finite number (or None); got {softcap}")
    if sinks is not None:
        ss = _shape(sinks)
        if ss != (hq,):
            raise AttentionError(f"sinks must hold one logit per query head, shape ({hq},); got {ss}")
    k_rot, v_rot = _check_rotation(rotation, kf, vf, kd, vd, d)
    return Problem(b, hq, hkv, t, d, l_max, lengths, kf, vf, kd, vd, scale, window, softcap,
                   sinks is not None, squeeze, k_rot, v_rot)


def _check_rotation(rotation, kf: Format, vf: Format, kd: int, vd: int, d: int) -> tuple[int, int]:
    """``(k_rot, v_rot)``: the Hadamard groups llama.cpp rotated the stored K / V rows by."""
    if rotation is None:
        return 0, 0
    try:
        k_rot, v_rot = (int(x) for x in rotation)
    except (TypeError, ValueError):
        raise AttentionError(f"rotation must be a pair (k_group, v_group); got {rotation!r}") from None
    for n, fmt, dim, side in ((k_rot, kf, kd, "K"), (v_rot, vf, vd, "V")):
        if not n:
            continue
        if fmt.kind == "turbo":
            raise AttentionError(f"{side}: {fmt.key} rotates inside its format; a Hadamard rotation on top "
                                 "is not supported")
        if n < 2 or n > MAX_ROTATION or n & (n - 1) or dim % n or dim != d:
            raise AttentionError(f"{side} rotation group {n} must be a power of two in 2..{MAX_ROTATION} "
                                 f"dividing the head dim {d} (rows stored unpadded)")
    return k_rot, v_rot


def visible_range(length: int, rows: int, t: int, window: int) -> tuple[int, int]:
    """Key positions ``[lo, hi)`` that query row ``t`` (of ``rows``) sees in a cache of ``length``.

    The ``rows`` query rows are the last positions of the sequence: row ``t`` sits at position
    ``length - rows + t`` and sees itself and everything before it (causal), or only the last
    ``window`` positions up to itself with a sliding window. An empty range gives a zero output.
    """
    hi = length - rows + t + 1
    lo = max(0, hi - window) if window else 0
    return lo, max(lo, hi)


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
    v1 / v2), ``"int8"`` (q rotated, then quantized per 32 values to q8_0 — q8_1 for q4_1 / q5_1 K — as
    llama.cpp's vec_dot does; integer block dots and binary16 V products: kernel v3, K in q8_0 / q4_0 /
    q4_1 / q5_0 / q5_1 / iq4_nl) or None (the backend's default, ``attention_kernel.DEFAULT_Q_PRECISION``).
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
    qp = options.get("q_precision")
    if qp is not None and qp not in Q_PRECISIONS:
        raise AttentionError(f"q_precision must be one of {', '.join(Q_PRECISIONS)} (or None: the backend's "
                             f"default); got {qp!r}")
    if (key is not None and backend in ("auto", "kernel", "cuda", "metal")
            and not {k for k, v in options.items() if v is not None} - {"q_precision"}):
        hit = _length_free_launch(key, q, k_blocks, v_blocks, backend, qp, k_format=k_format, v_format=v_format,
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
        extra = set(options) - {"q_precision"}
        if extra:
            raise AttentionError(f"unknown options for the reference path: {', '.join(sorted(extra))}")
        from .attention_ref import reference_attention

        return reference_attention(q, k_blocks, v_blocks, prob, sinks, q_precision=qp or "exact")
    from .attention_kernel import kernel_attention

    out = kernel_attention(q, k_blocks, v_blocks, prob, sinks, backend=backend, **options)
    if fast_key is not None:
        from .attention_kernel import fast_call

        run = last_run_record()
        fast = fast_call(q, prob, options, backend=run.backend)
        if fast is not None:
            _prepared_calls.put(fast_key, (fast, type(q), run))
    return out


def last_run() -> dict:
    """What the latest :func:`decode_attention` call in this thread ran, as a new dict: ``backend``,
    ``dispatches``, and on the kernel path ``kernel``, ``splits``, ``lanes_per_key``, ``warps``,
    ``tile``, ``chain``, ``q_precision`` ({} before any call; :func:`last_run_record` gives the record)."""
    run = last_run_record()
    return run.as_dict() if run is not None else {}
