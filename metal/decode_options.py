"""How the fused decode attention is planned and launched: one frozen value, passed explicitly.

:class:`DecodeOptions` travels from the caller (``decode_attention(..., options=)``, ``TQCache``'s
``decode_options``, ``prepare_decode``, ``tqbridge bench``) to the planner and the prepared launches;
nothing in the kernel path reads the environment. Every field left ``None`` takes the backend's
measured choice, written next to the table that holds it below (the measurements themselves are in
docs/kernel-history.md with the records that showed them). :meth:`DecodeOptions.resolve` fills those
in for one backend; plans and prepared launches are cached per resolved value, so two options never
share a stale launch.

The grid targets of the GPU plans are counts of threadgroups per compute unit (an SM on CUDA) times
the device's compute units (:func:`compute_units`), measured on the H200 (132 SMs).
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from .attention.problem import AttentionError, Q_PRECISIONS

# q's precision where the caller does not choose. CUDA: int8 (kernel int8-mma, 1.4-1.85x less device time than
# the exact kernel on the H200) for caches whose V has fewer than 8 bits per value, where int8 q's own KL
# cost is lost in the cache's (docs/q-precision.md); a cache of 8-bit V keeps exact q. Metal: exact until
# int8-mma is measured on Apple hardware. The emulator: exact (it serves tests; int8-mma's fragments are slow
# on a CPU).
DEFAULT_Q_PRECISION = {"cuda": "int8", "metal": "exact", "cpu-emulator": "exact"}
INT8_DEFAULT_MAX_V_BITS = 8.0    # the int8 default applies to V formats of fewer bits per value

# Per-backend choices of the prepared launches (all measured on the H200; not yet on Apple hardware):
# - compile: prepared launches replayed under mx.compile (graph building 16 -> 10 us per layer and call);
# - device_params: the per-step integers as views of a table made on the device (a host-made array is
#   unified memory the first kernel pays to read: the cache path 1136-1164 -> 836-906 us per step at 4K);
# - device_consts: constant buffers copied to the device and padded past MLX's 8-byte small-buffer pool;
# - defer_append: the decode step's in-place append and attention as one compiled call per layer;
# - fold_append: that append inside kernel int8-mma's pass 1 (two kernels per layer instead of three; where
#   the step's attention runs int8-mma and the plan's splits cover the buffer: attention.launch.fold_refusal;
#   record h100/2026-12-06-fold-append-ab: 0.16 ms less per token at the median).
COMPILE_BACKENDS = ("cuda",)
DEVICE_PARAMS_BACKENDS = ("cuda",)
DEVICE_CONSTS_BACKENDS = ("cuda",)
DEFER_APPEND_BACKENDS = ("cuda",)
FOLD_APPEND_BACKENDS = ("cuda",)

# kernel int8-mma's 16-key chunks per SIMD-group step where the options leave it to the planner: 2 on CUDA (two
# chunks in 2 SIMD groups of 64-key tiles beat one in 4: pass 1 at 32K / 128K 25.8 / 67.2 us vs 26.7 / 70.9),
# except CUDA's plan where static memory holds only tiles below 64 keys (attention_plan.INT8_MMA_WIDE_WARPS: one
# chunk in 4 SIMD groups), 1 elsewhere
INT8_MMA_CHUNKS = (1, 2)
INT8_MMA_DEFAULT_CHUNKS = {"cuda": 2}

V_DECODES = ("fast", "generic")   # kernel int8-mma's V decode: the fastest path that applies, or the generic decoder

# Threadgroups per compute unit the GPU plans aim for (H200: 132 SMs). lanes: 8 per SM; tiles: 10 (5 resident,
# two waves), and below 5 per SM of tiles in flight, smaller threadgroups; int8-mma: 4, and 6 on CUDA where every
# split still holds INT8_MMA_LONG_SPLIT_KEYS keys (128K: 98 splits 61-62 us per call vs 64 for 64 splits; at 32K
# that target was slower, hence the floor).
GROUPS_PER_UNIT_LANES = 8
GROUPS_PER_UNIT_TILES = 10
FILL_PER_UNIT_TILES = 5
GROUPS_PER_UNIT_INT8_MMA = 4
GROUPS_PER_UNIT_INT8_MMA_LONG = 6
INT8_MMA_LONG_SPLIT_KEYS = 1024
# compute units assumed where the device does not say (Metal: MLX reports no core count): the H200's,
# where the per-unit targets above were measured
FALLBACK_UNITS = 132
# a CUDA device's threadgroup memory per compute unit and reserve per resident threadgroup where the
# driver does not say: the H200's (228 KB per SM, 1 KB per block; CUDA C++ Programming Guide, compute
# capability 9.0)
FALLBACK_SHARED_PER_UNIT = (233472, 1024)

BOOL_FIELDS = ("compile", "device_params", "device_consts", "defer_append", "fold_append", "dynamic_shared")


@dataclass(frozen=True)
class DecodeOptions:
    """Choices of the fused decode attention; ``None``: the backend's measured default.

    - ``q_precision``: ``"exact"`` (float32 q: kernels lanes / tiles) or ``"int8"`` (q8_0 / q8_1 q: kernel int8-mma);
      None: :data:`DEFAULT_Q_PRECISION`, int8 only where int8-mma serves the problem and V has < 8 bits.
    - ``compile``, ``device_params``, ``device_consts``, ``defer_append``, ``fold_append``: how prepared launches
      run (see the backend tables above).
    - ``chunks``: kernel int8-mma's 16-key chunks per SIMD-group step (1 or 2).
    - ``target_groups``: pass-1 threadgroups a GPU plan aims for (instead of per-unit targets).
    - ``v_decode``: ``"fast"`` (the byte-permute decoders where they apply) or ``"generic"`` (the
      per-value decoder for every format: bit-identical, the fast paths' reference).
    - ``dynamic_shared``: kernel int8-mma declares its staging area as dynamic threadgroup memory even where
      static memory fits (what CUDA does for tiles beyond 48 KB; lets the emulator run that declaration).
    """

    q_precision: "str | None" = None
    compile: "bool | None" = None
    device_params: "bool | None" = None
    device_consts: "bool | None" = None
    defer_append: "bool | None" = None
    fold_append: "bool | None" = None
    chunks: "int | None" = None
    target_groups: "int | None" = None
    v_decode: str = "fast"
    dynamic_shared: bool = False

    def __post_init__(self):
        if self.q_precision is not None and self.q_precision not in Q_PRECISIONS:
            raise AttentionError(f"q_precision must be one of {', '.join(Q_PRECISIONS)} (or None: the backend's "
                                 f"default); got {self.q_precision!r}")
        for name in BOOL_FIELDS:
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise AttentionError(f"DecodeOptions.{name} must be True, False or None; got {v!r}")
        if self.chunks is not None and self.chunks not in INT8_MMA_CHUNKS:
            raise AttentionError(f"DecodeOptions.chunks must be one of {', '.join(map(str, INT8_MMA_CHUNKS))}; "
                                 f"got {self.chunks!r}")
        if self.target_groups is not None and (isinstance(self.target_groups, bool)
                                               or not isinstance(self.target_groups, int) or self.target_groups < 1):
            raise AttentionError(f"DecodeOptions.target_groups must be a positive int; got {self.target_groups!r}")
        if self.v_decode not in V_DECODES:
            raise AttentionError(f"DecodeOptions.v_decode must be one of {', '.join(V_DECODES)}; got {self.v_decode!r}")

    def resolve(self, backend: str) -> "DecodeOptions":
        """These options with every backend choice filled in for ``backend`` (q_precision and chunks stay:
        their defaults depend on the problem, :func:`tqbridge.metal.attention.plan.resolve_kernel` and
        :func:`tqbridge.metal.attention.plan.make_plan`)."""
        fill = dict(compile=backend in COMPILE_BACKENDS, device_params=backend in DEVICE_PARAMS_BACKENDS,
                    device_consts=backend in DEVICE_CONSTS_BACKENDS, defer_append=backend in DEFER_APPEND_BACKENDS,
                    fold_append=backend in FOLD_APPEND_BACKENDS)
        changes = {k: v for k, v in fill.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **changes) if changes else self

    def changed(self) -> dict:
        """The fields that differ from the defaults (what a record or a label says of these options)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    @classmethod
    def parse(cls, text: str) -> "DecodeOptions":
        """``"chunks=1,compile=0"`` -> DecodeOptions(chunks=1, compile=False); "" -> the defaults. Booleans
        as 0 / 1, integers as digits, strings as written; an unknown field or value is an error."""
        kinds = {f.name: f for f in dataclasses.fields(cls)}
        values: dict = {}
        for item in (x.strip() for x in text.split(",")):
            if not item:
                continue
            name, eq, raw = (s.strip() for s in item.partition("="))
            if not eq or name not in kinds:
                raise AttentionError(f"{item!r} is not a decode option; write name=value with a name of "
                                     f"{', '.join(kinds)}")
            if name in values:
                raise AttentionError(f"decode option {name!r} given twice in {text!r}")
            if name in BOOL_FIELDS:
                if raw not in ("0", "1"):
                    raise AttentionError(f"decode option {name}={raw!r}: 0 or 1")
                values[name] = raw == "1"
            elif name in ("chunks", "target_groups"):
                if not raw.isdigit():
                    raise AttentionError(f"decode option {name}={raw!r}: a positive integer")
                values[name] = int(raw)
            else:
                values[name] = raw
        return cls(**values)

    def label(self) -> str:
        """The inverse of :meth:`parse` for the changed fields (``"chunks=1,compile=0"``)."""
        out = []
        for k, v in self.changed().items():
            out.append(f"{k}={int(v) if isinstance(v, bool) else v}")
        return ",".join(out)


DEFAULT_OPTIONS = DecodeOptions()


def as_options(options: "DecodeOptions | None" = None, q_precision: "str | None" = None) -> DecodeOptions:
    """``options`` (the defaults when None) with ``q_precision`` where that is given; both given and
    different is an error."""
    opts = DEFAULT_OPTIONS if options is None else options
    if not isinstance(opts, DecodeOptions):
        raise AttentionError(f"options must be a DecodeOptions, got {type(opts).__name__}")
    if q_precision is not None and q_precision != opts.q_precision:
        if opts.q_precision is not None:
            raise AttentionError(f"q_precision={q_precision!r} and options.q_precision={opts.q_precision!r} disagree")
        opts = dataclasses.replace(opts, q_precision=q_precision)
    return opts


@lru_cache(maxsize=4)
def compute_units(backend: str) -> int:
    """The device's compute units the grid targets scale with: CUDA's SM count (the driver's
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT of device 0); :data:`FALLBACK_UNITS` where the device does
    not say (Metal, no driver)."""
    if backend == "cuda":
        n = _cuda_sm_count()
        if n:
            return n
    return FALLBACK_UNITS


@lru_cache(maxsize=4)
def shared_per_unit(backend: str) -> "tuple[int, int] | None":
    """(threadgroup memory of one compute unit, bytes each resident threadgroup costs beyond its own) in
    bytes: CUDA's CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR and
    CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK of device 0, else :data:`FALLBACK_SHARED_PER_UNIT`
    on CUDA; None elsewhere (Metal does not say; the emulator has no units)."""
    if backend != "cuda":
        return None
    per_unit, reserved = _cuda_attribute(81), _cuda_attribute(111)
    if per_unit:
        return per_unit, reserved or 0
    return FALLBACK_SHARED_PER_UNIT


def resident_groups(backend: str, shared_bytes: int) -> "int | None":
    """Threadgroups of ``shared_bytes`` of threadgroup memory that one compute unit holds at once (the
    memory bound only), or None where the device does not say."""
    got = shared_per_unit(backend)
    if got is None:
        return None
    per_unit, reserved = got
    return max(1, per_unit // (shared_bytes + reserved))


def _cuda_sm_count() -> "int | None":
    return _cuda_attribute(16)   # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT (cuda.h)


def _cuda_attribute(attribute: int) -> "int | None":
    """An integer attribute of CUDA device 0 from the driver (cuda.h's CUdevice_attribute), or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, n = ctypes.c_int(), ctypes.c_int()
    if (lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), 0) != 0
            or lib.cuDeviceGetAttribute(ctypes.byref(n), attribute, dev) != 0):
        return None
    return n.value if n.value > 0 else None
