"""The problem a decode-attention call states, below every implementation of it.

:func:`check_problem` validates the arguments of :func:`tqbridge.metal.attention.decode_attention`
into a :class:`Problem` (shapes and options, no data), :func:`visible_range` is the causal / sliding
window convention, and :class:`RunRecord` with :func:`record_run` / :func:`last_run_record` /
:func:`last_run` says what the latest call in this thread ran. The dispatcher (:mod:`.attention`),
the fused kernel's planner and launcher (:mod:`.attention_kernel`) and the reference
(:mod:`.attention_ref`) all read these; this module imports none of them.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...bridge import FormatError, get_format
from ...bridge.blocks.format_types import Format
from ...bridge.blocks.padding import padded_dim

MAX_QUERY_ROWS = 4          # speculative decoding: at most 4 new query rows per call
MAX_ROTATION = 256          # largest Hadamard group (the kernel's sign tables hold 256 entries)
Q_PRECISIONS = ("exact", "int8")   # how q enters the scores (see decode_attention)

# The fused kernel's pass-1 kernels (attention_plan says how each works), named by what each does:
# - "lanes": lanes share a key (lanes_per_key of them per key): the one layout every shape fits;
# - "tiles": a tile of keys at a time, one key per thread for the scores and one softmax step per
#   tile and query row (exact q);
# - "int8-mma": int8 q in matrix multiply-accumulate fragments (tensor cores on CUDA).
KERNELS = ("lanes", "tiles", "int8-mma")


class AttentionError(ValueError):
    """Bad arguments to :func:`~tqbridge.metal.attention.decode_attention`; the message names the problem."""


@dataclass(frozen=True)
class RunRecord:
    """What one :func:`~tqbridge.metal.attention.decode_attention` call ran. The reference path sets
    ``backend`` and ``dispatches`` only; the kernel path sets every field (its launch plan and
    accumulation chain)."""

    backend: str
    dispatches: int
    kernel: "str | None" = None
    splits: "int | None" = None
    lanes_per_key: "int | None" = None
    warps: "int | None" = None
    tile: "int | None" = None
    chain: "int | None" = None
    q_precision: "str | None" = None
    v_decode: "str | None" = None   # int8-mma: how V rows became fragments (attention_plan.int8_mma_v_decode)
    chunks: "int | None" = None     # int8-mma: 16-key chunks per SIMD-group step (attention_plan.Plan.chunks)
    stages: "int | None" = None     # int8-mma: tiles in the copy ring (attention_plan.Plan.stages)
    dyn_smem: "int | None" = None   # int8-mma: bytes of dynamic threadgroup memory (0: static; Plan.dyn_smem)
    compiled: "bool | None" = None  # a prepared decode launch: whether it ran under mx.compile (COMPILE_BACKENDS)
    device_params: "bool | None" = None   # its per-step ints as views of a device table (DecodeOptions.device_params)
    device_consts: "bool | None" = None   # its constant inputs as device copies of >= 16 bytes (DecodeOptions.device_consts)
    fold_append: "bool | None" = None     # its latest step with an append ran it inside pass 1 (DecodeOptions.fold_append)
    fold_refused: "str | None" = None     # why not, where the options asked for it (launch.fold_refusal)

    def as_dict(self) -> dict:
        """The fields that are set (the form :func:`last_run` returns)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


_local = threading.local()   # .run: the RunRecord of the latest call in this thread


def record_run(run: RunRecord) -> None:
    """Record what the call just made in this thread ran (the attention backends call this)."""
    _local.run = run


def last_run_record() -> "RunRecord | None":
    """The :class:`RunRecord` of the latest ``decode_attention`` call in this thread (None before any)."""
    return getattr(_local, "run", None)


def last_run() -> dict:
    """What the latest ``decode_attention`` call in this thread ran, as a new dict: ``backend``,
    ``dispatches``, and on the kernel path ``kernel``, ``splits``, ``lanes_per_key``, ``warps``,
    ``tile``, ``chain``, ``q_precision`` ({} before any call; :func:`last_run_record` gives the record)."""
    run = last_run_record()
    return run.as_dict() if run is not None else {}


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
    starts: tuple[int, ...] = ()   # first visible key of each batch row (left padding; empty: all 0)

    @property
    def row_starts(self) -> tuple[int, ...]:
        """One start per batch row (zeros where ``starts`` is empty)."""
        return self.starts or (0,) * self.batch

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
                  sinks: Any = None, rotation: "tuple[int, int] | None" = None, start: Any = 0) -> Problem:
    """Validate every argument of ``decode_attention``; one clear error per problem."""
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
                f"(padded to the block size {fmt.block_size}; see tqbridge.bridge.blocks.padding.pad_rows)"
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
    starts = check_starts(start, lengths)
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
                   sinks is not None, squeeze, k_rot, v_rot, starts)


def check_starts(start: Any, lengths: "tuple[int, ...]") -> tuple[int, ...]:
    """``start`` (an int, or one per batch row) as one int per row of ``lengths``, each in
    ``0..length`` of its row (keys below a row's start are invisible to it: a batch's left padding)."""
    b = len(lengths)
    if isinstance(start, (int, np.integer)):
        starts = (int(start),) * b
    else:
        if type(start) is tuple and all(type(x) is int for x in start):   # a batch's left padding, as it comes
            starts = start
        else:
            try:
                starts = tuple(int(x) for x in np.asarray(start).reshape(-1))
            except (TypeError, ValueError):
                raise AttentionError(f"start must be an int or one int per batch row; got {start!r}") from None
        if len(starts) != b:
            raise AttentionError(f"start has {len(starts)} entries for a batch of {b}")
    for i, (s, n) in enumerate(zip(starts, lengths)):
        if not 0 <= s <= n:
            raise AttentionError(f"start {s} of batch row {i} is outside 0..{n} (its length)")
    return starts


def start_key(start: Any, q: Any) -> "tuple[int, ...] | None | bool":
    """``start`` as a launch's ``starts`` for ``q``'s batch (None for 0, else one int per batch row; not
    validated against the lengths), or False where it is no int nor a sequence of ints (:func:`check_starts`
    then says why)."""
    if isinstance(start, (int, np.integer)):
        shape = tuple(getattr(q, "shape", ()))
        return (int(start),) * int(shape[0]) if start and shape else (None if not start else False)
    try:
        return tuple(int(x) for x in np.asarray(start).reshape(-1))
    except (TypeError, ValueError):
        return False


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


def check_q_precision(q_precision: "str | None") -> None:
    """The ``q_precision`` option: one of :data:`Q_PRECISIONS`, or None (the backend's default)."""
    if q_precision is not None and q_precision not in Q_PRECISIONS:
        raise AttentionError(f"q_precision must be one of {', '.join(Q_PRECISIONS)} (or None: the backend's "
                             f"default); got {q_precision!r}")


def kernel_name(kernel: "str | None") -> "str | None":
    """The ``kernel`` option as one of :data:`KERNELS` (None, the planner's choice, stays None); anything
    else raises :class:`AttentionError` listing the valid names."""
    if kernel is not None and kernel not in KERNELS:
        raise AttentionError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    return kernel


def visible_range(length: int, rows: int, t: int, window: int, start: int = 0) -> tuple[int, int]:
    """Key positions ``[lo, hi)`` that query row ``t`` (of ``rows``) sees in a cache of ``length``.

    The ``rows`` query rows are the last positions of the sequence: row ``t`` sits at position
    ``length - rows + t`` and sees itself and everything before it (causal), or only the last
    ``window`` positions up to itself with a sliding window; never a key below ``start`` (the
    batch row's left padding). An empty range gives a zero output.
    """
    hi = length - rows + t + 1
    lo = max(start, hi - window) if window else start
    return lo, max(lo, hi)


def to_numpy(a: Any) -> np.ndarray:
    """A numpy view or copy of ``a`` (numpy or MLX; MLX bfloat16 becomes float32)."""
    if isinstance(a, np.ndarray):
        return a
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover
        return np.asarray(a)
    if isinstance(a, mx.array):
        if a.dtype == mx.bfloat16:
            a = a.astype(mx.float32)
        return np.array(a)
    return np.asarray(a)
