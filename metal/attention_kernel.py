"""The fused decode-attention kernel: static parameters, launch plan and the two dispatches.

Pass 1 runs one threadgroup per (batch row, KV head, split): ``attention_kernel_split_v2.cpp``
(kernel "v2", the default: one key per thread for the scores, column chunks per lane for V) or
``attention_kernel_split.cpp`` (kernel "v1": several lanes per key), used when v2's threadgroup
memory does not fit (many query rows with wide heads) or on request. Pass 2
(``attention_kernel_combine.cpp``) runs one threadgroup per output row. Both are tqbridge-dialect kernels
(:mod:`.kernel`) with the helpers of ``attention_kernel.h``; the same source runs on Metal, on
CUDA (MLX's CUDA backend) and on the CPU SIMT emulator. Per-call values (lengths, split size,
scale, softcap) travel in small parameter buffers, so a new token never builds a new kernel.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .attention_formats import _fmt_params, _side_rotation
from .attention_problem import (AttentionError, Problem, RunRecord, _np, check_problem, check_q_precision, last_run,
                                record_run)
from .backend import pick_backend
from .kernel import KERNEL_DIR
from ..bridge.registry import names as _format_names

MAX_PARTIALS = 1024          # pass 2 keeps one weight per partial in threadgroup memory
COMBINE_THREADS = 256        # >= the largest row (256 values), a power of 2
TARGET_GROUPS_GPU = 1056     # pass-1 threadgroups to aim for on a GPU (H200: 132 SMs x 8)
EMU_SPLIT_KEYS = 256         # on the emulator: about this many keys per split
TILE_BYTES = 16384           # K + V bytes staged per tile in threadgroup memory
SHARED_BYTES = 32768         # threadgroup memory of one threadgroup (Metal's limit, the emulator's too)
TARGET_GROUPS_V2 = 1320      # v2 pass-1 threadgroups to aim for on a GPU (H200: 132 SMs x 5 resident, 2 waves)
FILL_GROUPS_V2 = 660         # below this many tiles in flight, v2 takes smaller threadgroups (132 SMs x 5)
V2_MIN_TILES = 1             # v2 on a GPU: at least this many tiles per split
V2_MIN_TILE = 2              # v2 needs room for at least this many keys per tile, else v1 runs
KERNELS = ("v1", "v2", "v3")
# kernel v3 (matrix fragments, int8 q): K formats with int8 codes in 32-value blocks (ggml's legacy
# blocks: the registry entries with a layout), V formats whose decoded values are binary16 numbers
# (f32 / bf16 rows may not fit), at most 8 query rows per group
V3_K_FORMATS = _format_names(lambda f: f.layout is not None)
V3_V_REFUSED = ("f32", "bf16")
V3_MAX_ROWS = 8              # the N side of the fragments: query rows of one GQA group
V3_WARPS = 4
V3_MAX_TILE = 64             # keys staged per tile (a multiple of 16; a ring of tiles is resident)
V3_SHARED_CUDA = 48 * 1024   # CUDA's limit of static shared memory per threadgroup
V3_STAGES_CUDA = 3           # tiles in the copy ring on CUDA (two being copied while one is computed)
V3_DYNAMIC_CUDA = 100 * 1024  # CUDA, tiles beyond static shared memory: at most this per threadgroup (2 per SM)
DSMEM_MIN = 48016            # dynamic requests start here: MLX raises CUDA's limit only for more than 48000 bytes
V3_CHUNKS = (1, 2)           # 16-key chunks per SIMD-group step v3 builds (TQBRIDGE_V3_CHUNKS; the tile a multiple)
# v3 in one dispatch (TQBRIDGE_V3_DISPATCHES=1) where device-scope fences and atomics exist (CUDA; the
# emulator runs threadgroups one after another); Metal's device atomics are relaxed only. Not the
# default: measured on the H200, one dispatch costs -1 / +4 / +6 us more device time than pass 1 +
# combine at 4K / 32K / 128K (q8_0/turbo3: 91.5 vs 85.4 us at 128K) and its saved launch did not
# show in wall time beyond the host's run-to-run spread (BENCHMARKS.md, fifth session)
V3_FUSED_BACKENDS = ("cuda", "cpu-emulator")
TARGET_GROUPS_V3 = 528       # v3 pass-1 threadgroups to aim for on a GPU (H200: 132 SMs x 4)
# CUDA, long contexts: 6 threadgroups per SM where every split still holds V3_LONG_SPLIT_KEYS keys. Measured on
# the H200 at 128K (q8_0/turbo3, two processes): 98 splits (784 threadgroups) 61.3 / 62.0 us per call through
# MLX against 64.2 / 64.2 for 64 splits; at 32K the 86 splits of that target were slower (28.2 / 28.6 against
# 26.7 / 26.3), hence the floor on keys per split (benchmarks/records/h200/2026-12-02-q8-words-splits.json)
TARGET_GROUPS_V3_LONG = 792
V3_LONG_SPLIT_KEYS = 1024
V3_MIN_SPLIT_KEYS = 128      # v3 on a GPU: at least this many keys per split
# q's precision when the caller does not choose, decided by measurement (TQBRIDGE_Q_PRECISION=exact|int8
# overrides it for every backend). CUDA: int8 (kernel v3) — 1.40 / 1.81 / 1.85x less device time than
# v2 at 4K / 32K / 128K on the H200 (BENCHMARKS.md, "Kernel v3") — for caches whose V is compressed below
# 8 bits per value: there int8 q's own KL cost (2.5-3.6e-4 nats on SmolLM2 / Gemma 3) is lost in the
# cache's (docs/q-precision.md); a cache of 8-bit V (q8_0 / q8_0), chosen for fidelity, keeps exact q,
# whose KL int8 q would raise by 35-57%. Metal: exact until v3 runs on Apple hardware (its fragments are
# shuffles there). The emulator: exact (it serves tests; v3's shuffled fragments are slow on a CPU).
DEFAULT_Q_PRECISION = {"cuda": "int8", "metal": "exact", "cpu-emulator": "exact"}
INT8_DEFAULT_MAX_V_BITS = 8.0    # the int8 default applies to V formats of fewer bits per value
# backends whose prepared decode launches (DecodeLaunch: the cache's decode steps, decode_attention in a
# loop; the in-place append) run under mx.compile: traced once, then replayed. CUDA: measured on the H200
# (tqbridge bench attention, cache path: graph building 16 -> 10 us and wall 8-9 us less per layer and call;
# outputs bit-identical; BENCHMARKS.md, sixth session). Metal: not measured on Apple hardware yet.
# TQBRIDGE_COMPILE=0 / 1 overrides it for every backend.
COMPILE_BACKENDS = ("cuda",)


# Backends whose prepared launches take their per-step integers (pass 1's lengths, the append's row)
# as views of a table made on the device, not as arrays made from host data every step. On CUDA MLX
# keeps arrays made from host data in unified memory written by the CPU; the first kernel to read a
# fresh one paid for it (benchmarks/scripts/probe_host_params.py, H200: 16 chained trivial kernels reading a
# fresh host-made array 364 us per evaluation, one read before 190, one made on the device 209; the
# cache path over 16 layers at new lengths 1136-1164 -> 836-906 us at 4K; BENCHMARKS.md, seventh
# session). TQBRIDGE_DEVICE_PARAMS=0 / 1 overrides it for every backend.
DEVICE_PARAMS_BACKENDS = ("cuda",)


# Backends whose decode step defers its in-place append into the routed attention call: TQCache keeps
# the step's K/V rows and the prepared attention runs append + pass 1 + combine as ONE mx.compile
# function (DecodeLaunch.with_append) instead of two, so the step pays one compiled call's Python and
# MLX replay per layer instead of two (the kernels, their order and their outputs are the same).
# Any other reader of the cache's buffers writes the deferred rows first (TQCache.keys / values).
# TQBRIDGE_DEFER_APPEND=0 / 1 overrides it for every backend (the emulator's decode lane included).
# Measured on the H200 (Llama 3.1 8B geometry, q8_0/turbo3; BENCHMARKS.md, twelfth session): the KV
# path's Python per layer lower in every one of 6 bench decode rows (-1.4 to -5.8 us), graph building
# per layer -3.7 / -9.8 us at 32K / 128K (benchmarks/scripts/probe_decode_host.py); outputs bit-identical.
DEFER_APPEND_BACKENDS = ("cuda",)


def defer_append(backend: str) -> bool:
    """Whether decode steps on ``backend`` fuse the append into the attention call (see above)."""
    return _backend_switch("TQBRIDGE_DEFER_APPEND", backend, DEFER_APPEND_BACKENDS)

# Backends whose prepared launches read their constant buffers (pass 1's float parameters, the value
# tables, the zero sinks, the dependency placeholder, the int parameters) from arrays made on the device
# and at least MIN_CONST_BYTES long, not from arrays made from host data. MLX's CUDA allocator (read in
# ml-explore/mlx, mlx/backend/cuda/allocator.cpp) serves buffers of at most 8 bytes from a small pool of
# unified memory that the CPU writes and the GPU reads through a mapping (cudaMemAdviseSetAccessedBy),
# and arrays made from host data from unified memory too; pass 1's two floats (8 bytes) lived there.
# TQBRIDGE_DEVICE_CONSTS=0 / 1 overrides it for every backend.
DEVICE_CONSTS_BACKENDS = ("cuda",)
MIN_CONST_BYTES = 16   # > the allocator's 8-byte small-buffer limit (allocator.cpp, small_block_size)


def _env_switch(name: str, default: bool) -> bool:
    """An on/off switch: environment variable ``name`` (0 / 1) if set, else ``default``."""
    env = os.environ.get(name)
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise AttentionError(f"{name}={env!r}: 0 or 1")
    return default


def _env_choice(name: str, default: int, choices: tuple) -> int:
    """An integer setting: environment variable ``name`` if set (one of ``choices``), else ``default``."""
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value not in choices:
        raise AttentionError(f"{name} must be one of {', '.join(map(str, choices))}, got {raw!r}")
    return value


def _backend_switch(name: str, backend: str, backends: tuple) -> bool:
    """An on/off switch of prepared launches: environment variable ``name`` (0 / 1) if set, else
    whether ``backend`` is one of ``backends``."""
    return _env_switch(name, backend in backends)


def device_params(backend: str) -> bool:
    """Whether prepared launches on ``backend`` take their per-step integers as views of a device
    table (:data:`DEVICE_PARAMS_BACKENDS`; ``TQBRIDGE_DEVICE_PARAMS`` overrides): a view of a device
    array is neither a host allocation nor a kernel."""
    return _backend_switch("TQBRIDGE_DEVICE_PARAMS", backend, DEVICE_PARAMS_BACKENDS)


def device_consts(backend: str) -> bool:
    """Whether prepared launches on ``backend`` read constant buffers made on the device
    (:data:`DEVICE_CONSTS_BACKENDS`; ``TQBRIDGE_DEVICE_CONSTS`` overrides)."""
    return _backend_switch("TQBRIDGE_DEVICE_CONSTS", backend, DEVICE_CONSTS_BACKENDS)


def const_buffer(values, backend: str) -> Any:
    """The MLX array of a launch's constant input ``values`` (numpy). Where :func:`device_consts`
    holds: a 1-D buffer zero-padded to :data:`MIN_CONST_BYTES` (kernels read the leading values only)
    and copied once by a device kernel, so it lives in device memory (scheduled here with
    ``mx.async_eval``, once per prepared launch: no host synchronisation, and replayed launches do not
    re-run the copy); else the array made from host data."""
    import mlx.core as mx

    a = np.ascontiguousarray(values)
    if not device_consts(backend):
        return mx.array(a)
    if a.ndim == 1 and a.nbytes < MIN_CONST_BYTES:
        a = np.concatenate([a, np.zeros(-(-MIN_CONST_BYTES // a.itemsize) - a.size, a.dtype)])
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
    host = mx.array(a.view(bits))
    # an elementwise kernel's output is allocated on the device; on the bits, so every value (NaN
    # payloads too) is copied exactly, then viewed back as the buffer's dtype
    dev = mx.view(host * 1, mx.array(a[:0]).dtype)
    mx.async_eval(dev)   # scheduled: detached from its graph (a constant to mx.compile), no wait
    return dev


def param_table(head: "list[int]", n: int, tail: int, np_dtype, after: "list[int]" = ()) -> Any:
    """A lazy device array of ``n`` rows ``head + [i] * tail + after`` (row i), made by MLX ops from two
    small constants, not per row from host data: row i is a view, :func:`table_row`."""
    import mlx.core as mx

    parts = [mx.broadcast_to(mx.arange(n, dtype=mx.uint32 if np_dtype == np.uint32 else mx.int32)[:, None],
                             (n, tail))]
    if head:
        parts.insert(0, mx.broadcast_to(mx.array(np.array(head, np_dtype))[None], (n, len(head))))
    if after:
        parts.append(mx.broadcast_to(mx.array(np.array(after, np_dtype))[None], (n, len(after))))
    return mx.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def table_row(table, i: int):
    """Row ``i`` of a :func:`param_table` as a view: a slice and a reshape, no kernel (indexing with
    an int, ``table[i]``, is a gather: a kernel per step; tests/test_decode_step.py counts them)."""
    return table[i:i + 1].reshape(-1)


def compile_launches(backend: str) -> bool:
    """Whether prepared decode launches on ``backend`` run under ``mx.compile``."""
    return _backend_switch("TQBRIDGE_COMPILE", backend, COMPILE_BACKENDS)

QTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


@dataclass(frozen=True)
class Plan:
    lanes_per_key: int
    warps: int
    splits: int
    split_len: int
    tile: int = 0             # keys staged per tile (0: chosen from the row sizes)
    kernel: str = "v1"        # pass-1 kernel: "v1" (lanes share a key) or "v2" (one key per thread)
    rows_room: int = 0        # v2: query rows the build holds (TQA_QA)
    stages: int = 2           # v3: tiles in the asynchronous copy ring (TQA_NS)
    fused: bool = False       # v3: one dispatch (the last threadgroup of a head merges the splits)
    q_regs: bool = True       # v3: q's fragments in registers (False: read from threadgroup memory, TQA_QSMEM)
    chunks: int = 1           # v3: 16-key chunks a SIMD group takes per online-softmax step (TQA_KC)
    dyn_smem: int = 0         # v3: bytes of dynamic threadgroup memory holding the staging area (TQ_DSMEM; 0: static)

    @property
    def dispatches(self) -> int:
        return 1 if self.fused else 2

    @property
    def partials(self) -> int:
        return self.splits if self.kernel in ("v2", "v3") else self.splits * self.warps

    @property
    def q_precision(self) -> str:
        """How q enters the scores: "int8" (v3: ggml's q8_0 / q8_1 of q) or "exact" (float32)."""
        return "int8" if self.kernel == "v3" else "exact"

    def chain(self, length: int) -> int:
        """Longest serial accumulation (for the error bound): keys per lane slot + merges."""
        if self.kernel == "v3":
            keys = min(self.split_len, max(length, 1)) + 1
            subtiles = -(-keys // (16 * self.warps)) + 1
            # per SIMD group: one product of 16 keys and one rescale per sub-tile; 3 shuffle steps
            # for the sums; then the SIMD groups and the partials
            return -(-keys // self.warps) + 2 * subtiles + 16 + 3 + self.warps + self.partials
        if self.kernel == "v2":
            keys = min(self.split_len, max(length, 1)) + 1
            tiles = -(-keys // self.tile)
            # per SIMD group: its keys' products, one rescale per tile; the sum: keys per lane of a
            # tile + 5 butterfly steps, one step per tile; then the SIMD groups and the partials
            return -(-keys // self.warps) + 2 * tiles + -(-self.tile // 32) + 6 + self.warps + self.partials
        keys_per_slot = -(-min(self.split_len, max(length, 1)) // (self.warps * (32 // self.lanes_per_key)))
        return keys_per_slot + int(math.log2(32 // self.lanes_per_key)) + self.partials


def tables(prob: Problem) -> np.ndarray:
    """The ``tabs`` buffer: K/V value tables, K/V sign tables (RMAX each), K/V rotation scales."""
    _, kt, *_ = _fmt_params(prob.k_format)
    _, vt, *_ = _fmt_params(prob.v_format)
    _, ks1, ks2, kscale = _side_rotation(prob.k_format, prob.k_rot)
    _, vs1, vs2, vscale = _side_rotation(prob.v_format, prob.v_rot)
    return np.concatenate([kt, vt, ks1, ks2, vs1, vs2, [kscale, vscale]]).astype(np.float32)


def _lanes_per_key(dk: int, dv: int) -> int:
    ok = [n for n in (4, 8, 16, 32) if dk % (4 * n) == 0 and dv % (4 * n) == 0]
    if not ok:
        raise AttentionError(f"head rows of {dk} / {dv} values are not multiples of 16")
    small = [n for n in ok if max(dk, dv) // n <= 8]
    return small[0] if small else ok[-1]


def _row_bytes(prob: Problem, dyn: bool) -> tuple[int, int]:
    if dyn:   # room for the widest format (f32), so one build serves every pair
        return 4 * prob.k_dim, 4 * prob.v_dim
    ks, *_ = _fmt_params(prob.k_format)
    vs, *_ = _fmt_params(prob.v_format)
    return prob.k_dim // ks["GRP"] * ks["BB"], prob.v_dim // vs["GRP"] * vs["BB"]


def _rows_room(prob: Problem, dyn: bool) -> int:
    """TQA_QA of a v2 build: the group's query rows (a power of two in format-generic builds)."""
    q = prob.group * prob.rows
    return 1 << (q - 1).bit_length() if dyn else q


def v2_shared_bytes(prob: Problem, warps: int, tile: int, dyn: bool) -> int:
    """Threadgroup memory of a v2 pass-1 build: each array rounded up to 16 bytes, plus the
    emulator's 64 guard bytes after each (so a plan that fits runs on every backend)."""
    krb, vrb = _row_bytes(prob, dyn)
    qa = _rows_room(prob, dyn)
    sizes = [64, 64, 4 * qa * prob.k_dim, 4 * qa * tile, 4 * qa, 4 * qa, 4 * qa, 4 * warps * prob.v_dim,
             -(-tile * krb // 4) * 4, -(-tile * vrb // 4) * 4]
    return sum(-(-x // 16) * 16 + 64 for x in sizes)


def v2_key_slots(prob: Problem) -> int:
    """Keys a SIMD group takes at once in v2's V phase: 2 (16 lanes of 8+ values each) for rows of
    up to 128 values, else 1; fewer, longer chunks per lane spread the per-key work."""
    return 2 if prob.v_dim <= 128 else 1


def _v2_tile(prob: Problem, warps: int, dyn: bool, tile: "int | None") -> int:
    """Keys per tile for v2: the requested one if it fits, else the largest power of two <= 32 * warps
    that fits the threadgroup memory; 0 when not even V2_MIN_TILE keys fit."""
    if tile:
        return tile if v2_shared_bytes(prob, warps, tile, dyn) <= SHARED_BYTES else 0
    t = 32 * warps
    while t >= V2_MIN_TILE and v2_shared_bytes(prob, warps, t, dyn) > SHARED_BYTES:
        t //= 2
    return t if t >= V2_MIN_TILE else 0


def make_plan(prob: Problem, backend: str, *, splits: "int | None" = None, lanes_per_key: "int | None" = None,
              warps: "int | None" = None, tile: "int | None" = None, kernel: "str | None" = None,
              dyn: bool = False, chunks: "int | None" = None) -> Plan:
    """Launch plan. ``kernel``: None (v2 when it fits, else v1), "v1" or "v2"; ``dyn``: the build is
    format-generic (the emulator's default), which sizes threadgroup memory for f32 rows."""
    if max(prob.k_dim, prob.v_dim) > COMBINE_THREADS:
        raise AttentionError(f"the attention kernel takes rows of at most {COMBINE_THREADS} values; "
                             f"got {prob.k_dim} (K) / {prob.v_dim} (V)")
    if kernel is not None and kernel not in KERNELS:
        raise AttentionError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if kernel == "v3":
        if lanes_per_key is not None:
            raise AttentionError("lanes_per_key is an option of kernel v1 only")
        return _make_plan_v3(prob, backend, splits, warps, tile, chunks)
    if chunks is not None:
        raise AttentionError("chunks is an option of kernel v3 only")
    if kernel != "v1" and lanes_per_key is None:
        plan = _make_plan_v2(prob, backend, splits, warps, tile, dyn, required=kernel == "v2")
        if plan is not None:
            return plan
    elif kernel == "v2":
        raise AttentionError("lanes_per_key is an option of kernel v1 only")
    lpk = _lanes_per_key(prob.k_dim, prob.v_dim) if lanes_per_key is None else int(lanes_per_key)
    if lpk not in (4, 8, 16, 32) or prob.k_dim % (4 * lpk) or prob.v_dim % (4 * lpk):
        raise AttentionError(f"lanes_per_key={lpk} does not divide rows of {prob.k_dim} / {prob.v_dim} values in chunks of 4")
    nw = 4 if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    tl = 0 if tile is None else int(tile)
    if tl and (tl < 2 or tl > 256 or tl & (tl - 1)):
        raise AttentionError(f"tile must be a power of two in 2..256, got {tl}")
    l_used = max(max(prob.lengths), 1)
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            per_group = nw * (32 // lpk) * 4     # at least 4 steps per lane slot
            splits = max(1, min(-(-l_used // per_group), TARGET_GROUPS_GPU // (prob.batch * prob.kv_heads)))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS // nw, l_used)
    return Plan(lpk, nw, splits, -(-l_used // splits), tl)


def _make_plan_v2(prob: Problem, backend: str, splits, warps, tile, dyn: bool, required: bool) -> "Plan | None":
    nw = 4 if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    if tile is not None and (int(tile) < 2 or int(tile) > 256 or int(tile) & (int(tile) - 1)):
        raise AttentionError(f"tile must be a power of two in 2..256, got {tile}")
    tl = _v2_tile(prob, nw, dyn, None if tile is None else int(tile))
    if not tl:
        if required:
            raise AttentionError(f"kernel v2 does not fit {SHARED_BYTES} bytes of threadgroup memory for "
                                 f"{prob.group * prob.rows} query rows of {prob.k_dim} values"
                                 + (f" with tile={tile}" if tile else ""))
        return None
    l_used = max(max(prob.lengths), 1)
    heads = prob.batch * prob.kv_heads
    if backend != "cpu-emulator" and warps is None and tile is None:
        # short contexts: smaller threadgroups (fewer keys per tile) so that the grid still fills the GPU
        while nw > 1 and heads * -(-l_used // tl) < FILL_GROUPS_V2:
            nw //= 2
            tl = _v2_tile(prob, nw, dyn, None)
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            splits = max(1, min(-(-l_used // (V2_MIN_TILES * tl)), TARGET_GROUPS_V2 // heads))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS, l_used)
    split_len = -(-l_used // splits)
    if backend != "cpu-emulator":   # whole tiles per split (aligned staging, no short tiles)
        split_len = -(-split_len // tl) * tl
        splits = -(-l_used // split_len)
    return Plan(1, nw, splits, split_len, tl, "v2", _rows_room(prob, dyn))


def v3_refusal(prob: Problem) -> "str | None":
    """Why kernel v3 cannot serve ``prob`` (None: it can)."""
    if prob.k_format.name not in V3_K_FORMATS:
        return f"kernel v3 reads K as int8 codes; {prob.k_format.key} K is not one of {', '.join(V3_K_FORMATS)}"
    if prob.v_format.name in V3_V_REFUSED:
        return f"kernel v3 rounds V values to binary16; {prob.v_format.key} values may not fit"
    if prob.group * prob.rows > V3_MAX_ROWS:
        return (f"kernel v3 serves at most {V3_MAX_ROWS} query rows per KV head; got {prob.group} heads x "
                f"{prob.rows} rows")
    if prob.k_dim % 32 or prob.v_dim % 64:
        return f"kernel v3 needs K rows of 32k values and V rows of 64k values; got {prob.k_dim} / {prob.v_dim}"
    return None


def _turbo_index_bits(fmt) -> int:
    """Bits of one turbo centroid index (2 / 3 / 4; the codebook's size), 0 for other formats."""
    return int(fmt.codec.spec.levels).bit_length() - 1 if fmt.kind == "turbo" else 0


def v3_shared_bytes(prob: Problem, warps: int, tile: int, stages: int = 2) -> int:
    """Threadgroup memory of a v3 pass-1 build (each array rounded up to 16 bytes, plus the
    emulator's 64 guard bytes after each)."""
    nb = prob.k_dim // 32
    vb = _turbo_index_bits(prob.v_format)
    sizes = [64, 64, 8 * prob.k_dim + 128, 4 * 8 * nb, 4 * 8 * nb, _v3_stage_bytes(prob, warps, tile, stages),
             (1024 if vb == 4 or v3_v_decode(prob) == "turbo-permute" else 256) if vb else 4]
    return sum(-(-x // 16) * 16 + 64 for x in sizes)


def v3_v_decode(prob: Problem) -> str:
    """How kernel v3 decodes ``prob``'s V rows into binary16 fragments (the RunRecord's ``v_decode``):
    "turbo-permute" (turbo2 / turbo3 of one 128-value block per row: four centroids per byte permute of
    registers), "codes-permute" (legacy blocks x = d * (code - offset), 4-, 5- or 8-bit codes: codes
    moved into binary16 integers by byte permutes, one subtraction, times the pair of block scales),
    or "generic" (every other format: the per-value decoder). TQBRIDGE_V3_V_GENERIC=1 takes the generic
    path for every format; each fast path is bit-identical to it (tests/test_attention_v3_v_paths.py)."""
    if os.environ.get("TQBRIDGE_V3_V_GENERIC") == "1":
        return "generic"
    if _turbo_index_bits(prob.v_format) in (2, 3) and prob.v_dim == 128 and prob.v_format.block_size == 128:
        return "turbo-permute"
    lay = prob.v_format.layout
    if (lay is not None and not lay.has_m and lay.values is None and lay.bits in (4, 5, 8)
            and prob.v_dim % 64 == 0 and 32 % (prob.v_dim // 16) == 0):
        return "codes-permute"
    return "generic"


def _v3_stage_bytes(prob: Problem, warps: int, tile: int, stages: int = 2) -> int:
    krb, vrb = _row_bytes(prob, False)
    tile_bytes = -(-tile * krb // 4) * 4 + -(-tile * vrb // 4) * 4
    # `stages` tiles in a ring (one computed while the others are copied); q's rows in its last buffer while
    # the first tiles are copied (prologue 2: they may reach past the ring's end), at the end the SIMD groups'
    # partial results
    return max(stages * tile_bytes, (stages - 1) * tile_bytes + 4 * 8 * prob.k_dim, 4 * warps * 8 * (prob.v_dim + 3),
               4 * (MAX_PARTIALS + prob.v_dim + 32 * warps + 1))


def _v3_limits(backend: str) -> tuple[int, int]:
    """(threadgroup memory bytes, tiles in the copy ring) for v3 on ``backend``: CUDA's static shared
    memory allows 48 KB (measured: the copies in flight per SM bound the speed); Metal and the
    emulator keep 32 KB (fewer or smaller tiles)."""
    return (V3_SHARED_CUDA, V3_STAGES_CUDA) if backend == "cuda" else (SHARED_BYTES, V3_STAGES_CUDA)


# tiles in the copy ring of CUDA's automatic v3 plans (an explicit tile takes as many as fit): with whole
# tiles staged by straight copies, 2 stages (26 KB, 8 threadgroups of 2 SIMD groups per SM) measured faster
# than 3 (38 KB, 5): pass 1 11.7 / 24.7 / 64.6 us against 12.4 / 26.0 / 67.2 at 4K / 32K / 128K for two chunks,
# 10.9 / 26.3 / 70.1 against 11.7 / 26.8 / 71.0 for one (benchmarks/records/h200/2026-12-02-v3-stages.json)
V3_AUTO_STAGES_CUDA = 2


def v3_auto_stages() -> int:
    """The copy ring CUDA's automatic v3 plans take for tiles of 64 keys or more: ``TQBRIDGE_V3_STAGES`` (2 or 3)
    if set, else V3_AUTO_STAGES_CUDA."""
    raw = os.environ.get("TQBRIDGE_V3_STAGES", str(V3_AUTO_STAGES_CUDA))
    if raw not in ("2", "3"):
        raise AttentionError(f"TQBRIDGE_V3_STAGES must be 2 or 3, got {raw!r}")
    return int(raw)

# v3's chunks per step where neither the call nor TQBRIDGE_V3_CHUNKS says: 2 on CUDA, where two chunks in
# 2 SIMD groups x 64-key tiles measured faster than one in 4 x 64 once whole tiles are staged by straight
# copies (pass 1 at 32K / 128K: 25.8 / 67.2 us vs 26.7 / 70.9, benchmarks/records/h200/2026-12-02-ncu-pass1.json);
# 1 elsewhere (not measured on Metal; the emulator's plans stay as its tests know them)
V3_DEFAULT_CHUNKS = {"cuda": 2}


def v3_chunks(backend: str = "") -> int:
    """The 16-key chunks per SIMD-group step of v3 plans made without an explicit ``chunks``:
    TQBRIDGE_V3_CHUNKS, else V3_DEFAULT_CHUNKS for the backend (2 on CUDA), else 1."""
    return _env_choice("TQBRIDGE_V3_CHUNKS", V3_DEFAULT_CHUNKS.get(backend, 1), V3_CHUNKS)


def v3_target_groups(backend: str = "", length: int = 0, heads: int = 1) -> int:
    """Pass-1 threadgroups v3's GPU plans aim for: ``TQBRIDGE_V3_GROUPS`` if set; else on CUDA
    TARGET_GROUPS_V3_LONG where each of its splits keeps V3_LONG_SPLIT_KEYS keys of ``length``; else
    TARGET_GROUPS_V3."""
    raw = os.environ.get("TQBRIDGE_V3_GROUPS")
    if raw is None:
        long_splits = max(1, TARGET_GROUPS_V3_LONG // max(heads, 1))
        if backend == "cuda" and length // long_splits >= V3_LONG_SPLIT_KEYS:
            return TARGET_GROUPS_V3_LONG
        return TARGET_GROUPS_V3
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise AttentionError(f"TQBRIDGE_V3_GROUPS must be a positive number of threadgroups, got {raw!r}")
    return n


def v3_q8_words() -> bool:
    """Whether v3 reads q8_0 K rows of 4-byte aligned length by whole 32-bit words (``tqa_q8_pair``: the
    even block of each pair of 34-byte blocks has its fragment slots, and q's, rotated by 2; results
    bit-identical) instead of 16-bit halves for the two blocks in four that sit 2 bytes off a word.
    ``TQBRIDGE_V3_Q8_WORDS`` = 0 / 1; on by default."""
    return _env_switch("TQBRIDGE_V3_Q8_WORDS", True)


def _make_plan_v3(prob: Problem, backend: str, splits, warps, tile, chunks=None) -> Plan:
    why = v3_refusal(prob)
    if why:
        raise AttentionError(why)
    if chunks is not None and int(chunks) not in V3_CHUNKS:
        raise AttentionError(f"kernel v3 takes chunks of {' or '.join(map(str, V3_CHUNKS))} (16-key chunks per "
                             f"SIMD-group step), got {chunks}")
    kc = v3_chunks(backend) if chunks is None else int(chunks)
    nw = V3_WARPS if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    limit, ns0 = _v3_limits(backend)
    if warps is None:   # wide rows: fewer SIMD groups (a smaller merge area) where 4 do not fit
        while nw > 1 and v3_shared_bytes(prob, nw, 16, 2) > limit:
            nw //= 2
    # CUDA: a staging area beyond the static limit goes to dynamic threadgroup memory (an explicit tile, e.g.
    # 128 keys for 4 SIMD groups of two chunks; or nothing static fits)
    dyn_limit = V3_DYNAMIC_CUDA if backend == "cuda" else limit

    def stages_for(t):   # (stages, dynamic) for tile t: the most stages that fit, static before dynamic
        for n in range(ns0, 1, -1):
            need = v3_shared_bytes(prob, nw, t, n)
            if need <= limit:
                return n, False
            if need <= dyn_limit:
                return n, True
        return None

    if tile is not None:
        tl = int(tile)
        if tl % (16 * kc) or not 16 <= tl <= 256:
            raise AttentionError(f"kernel v3 with chunks={kc} takes a tile of a multiple of {16 * kc} keys up to 256, "
                                 f"got {tile}")
        got = stages_for(tl)
        if got is None:
            raise AttentionError(f"kernel v3 with tile={tl} does not fit {dyn_limit} bytes of threadgroup memory")
        ns, dyn = got
    else:
        # the most keys in flight ((stages - 1) * tile) that fit in static memory; then the larger tile.
        # Dynamic memory only where nothing static fits: 4 SIMD groups of two chunks in 128-key tiles
        # (71 KB dynamic) measured slower than 2 groups in 64-key tiles (static) on the H200
        # (benchmarks/records/h200/2026-12-02-v3-chunks-dynamic.json)
        need = {(n, t): v3_shared_bytes(prob, nw, t, n)
                for n in range(2, ns0 + 1) for t in range(16 * kc, V3_MAX_TILE + 1, 16 * kc)}
        fits = [(n, t, False) for (n, t), b in need.items() if b <= limit] \
            or [(n, t, True) for (n, t), b in need.items() if b <= dyn_limit]
        if not fits:
            raise AttentionError(f"kernel v3 does not fit {limit} bytes of threadgroup memory for rows of "
                                 f"{prob.k_dim} / {prob.v_dim} values with {nw} SIMD groups")
        ns, tl, dyn = max(fits, key=lambda f: ((f[0] - 1) * f[1], f[1], not f[2]))
        # CUDA: a tile of 64 keys or more in a ring of V3_AUTO_STAGES_CUDA where that fits static memory (a
        # whole tile still in flight while one is computed): the smaller staging area lets more threadgroups
        # share an SM, which measured faster than a deeper ring (64-key tiles; smaller ones keep their ring)
        auto_ns = v3_auto_stages()
        if backend == "cuda" and ns > auto_ns and tl >= 64 and need[auto_ns, tl] <= limit:
            ns, dyn = auto_ns, False
    if os.environ.get("TQBRIDGE_V3_DYNAMIC_SHARED") == "1" and backend != "metal":
        dyn = True   # the dynamic declaration also where static memory would do (tests: the emulator runs it)
    # each SIMD group takes 16 * chunks keys of a tile per step: with chunks > 1, no more groups than a tile
    # has steps (one chunk per step keeps its plans as they were: the emulator's 48-key tiles idle a group)
    if kc > 1 and 16 * kc * nw > tl:
        if warps is not None:
            raise AttentionError(f"kernel v3 with {nw} SIMD groups of {16 * kc} keys per step leaves some idle in a "
                                 f"tile of {tl} keys; take at most {max(1, tl // (16 * kc))} or a larger tile")
        nw = max(1, tl // (16 * kc))
    l_used = max(max(prob.lengths), 1)
    heads = prob.batch * prob.kv_heads
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            splits = max(1, min(-(-l_used // V3_MIN_SPLIT_KEYS), v3_target_groups(backend, l_used, heads) // heads))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS, l_used)
    split_len = -(-l_used // splits)
    if backend != "cpu-emulator":   # whole tiles per split
        split_len = -(-split_len // tl) * tl
        splits = -(-l_used // split_len)
    fused = backend in V3_FUSED_BACKENDS and os.environ.get("TQBRIDGE_V3_DISPATCHES") == "1"
    # q in threadgroup memory (TQBRIDGE_V3_Q_IN_SMEM=1): fewer registers, more threadgroups per SM, a few
    # more instructions per key (benchmarks/scripts/kernel_sass.py); off until the device time says which wins
    q_regs = os.environ.get("TQBRIDGE_V3_Q_IN_SMEM") != "1"
    dsmem = 0
    if dyn:
        stb = -(-_v3_stage_bytes(prob, nw, tl, ns) // 16) * 16
        dsmem = stb if backend != "cuda" else max(stb, DSMEM_MIN)
    return Plan(1, nw, splits, split_len, tl, "v3", V3_MAX_ROWS, ns, fused, q_regs, kc, dsmem)


def resolve_kernel(prob: Problem, backend: str, kernel: "str | None", q_precision: "str | None") -> "str | None":
    """The pass-1 kernel for a call: ``q_precision`` "int8" is kernel v3, "exact" kernels v1 / v2;
    None takes the backend's default precision, int8 only where v3 serves the problem."""
    if q_precision is None:
        if kernel is not None:
            return kernel
        forced = os.environ.get("TQBRIDGE_Q_PRECISION")
        want = forced or DEFAULT_Q_PRECISION.get(backend, "exact")
        if want == "int8" and not forced and prob.v_format.bits_per_value >= INT8_DEFAULT_MAX_V_BITS:
            want = "exact"
        return "v3" if want == "int8" and v3_refusal(prob) is None else None
    if q_precision == "int8":
        if kernel not in (None, "v3"):
            raise AttentionError(f"q_precision='int8' is kernel v3; kernel={kernel!r} keeps q exact")
        why = v3_refusal(prob)
        if why:
            raise AttentionError(f"q_precision='int8': {why}")
        return "v3"
    if kernel == "v3":
        raise AttentionError("kernel v3 quantizes q to int8; q_precision='exact' takes kernel v1 or v2")
    return kernel


DYN_MAX_ROWS = 32            # TQA_QA: query rows per group a format-generic (TQA_DYN) build holds


def _fmt_consts(prob: Problem) -> dict:
    ks, *_ = _fmt_params(prob.k_format)
    vs, *_ = _fmt_params(prob.v_format)
    return dict(TQA_KF=ks["ID"], TQA_VF=vs["ID"], TQA_KBB=ks["BB"], TQA_VBB=vs["BB"], TQA_KGRP=ks["GRP"],
                TQA_VGRP=vs["GRP"], TQA_KQS=ks["QS"], TQA_VQS=vs["QS"], TQA_KSG=ks["SG"], TQA_VSG=vs["SG"],
                TQA_KROT=ks["ROT"] or prob.k_rot, TQA_VROT=vs["ROT"] or prob.v_rot, TQA_G=prob.group,
                TQA_T=prob.rows)


@lru_cache(maxsize=256)
def _plan_cached(prob: Problem, backend: str, splits, lanes_per_key, warps, tile, kernel, dyn) -> Plan:
    return make_plan(prob, backend, splits=splits, lanes_per_key=lanes_per_key, warps=warps, tile=tile,
                     kernel=kernel, dyn=dyn)


def _static(prob: Problem, plan: Plan, qtype: int, dyn: bool) -> tuple[dict, dict, list, list]:
    """Static parameters of both passes and the extra int parameters they read (TQA_DYN builds)."""
    fc = _fmt_consts(prob)
    krb, vrb = _row_bytes(prob, dyn)
    tile = plan.tile or max(2, min(64, 1 << int(math.log2(TILE_BYTES // (krb + vrb)))))
    split = dict(TQA_DK=prob.k_dim, TQA_DV=prob.v_dim, TQA_D=prob.head_dim, TQA_NW=plan.warps, TQA_QTYPE=qtype,
                 TQA_DYN=int(dyn), TQA_TILE=tile, TQA_KTB=-(-tile * krb // 4) * 4, TQA_VTB=-(-tile * vrb // 4) * 4)
    if plan.kernel == "v3":
        v_decode = v3_v_decode(prob)
        split.update(TQA_KM=int(prob.k_format.layout.has_m),   # q4_1 / q5_1: a minimum m per block
                     TQA_VB=_turbo_index_bits(prob.v_format),
                     TQA_STB=_v3_stage_bytes(prob, plan.warps, tile, plan.stages), TQA_NS=plan.stages,
                     TQA_FUSED=int(plan.fused), TQA_MAXP=MAX_PARTIALS, TQA_SINKS=int(prob.has_sinks),
                     TQA_QSMEM=int(not plan.q_regs), TQA_KC=plan.chunks, TQ_DSMEM=plan.dyn_smem, TQA_V23=int(v_decode == "turbo-permute"),
                     TQA_VCODE=int(v_decode == "codes-permute"), TQA_Q8W=int(v3_q8_words()),
                     TQA_PRO=v3_prologue(), TQA_WOPAD=int(v3_merge_pad()))
    elif plan.kernel == "v2":
        split.update(TQA_QA=plan.rows_room or _rows_room(prob, dyn), TQA_KS=v2_key_slots(prob))
    else:
        split.update(TQA_LPK=plan.lanes_per_key)
    combine = dict(TQA_DV=prob.v_dim, TQA_D=prob.head_dim, TQA_NT=COMBINE_THREADS, TQA_QTYPE=qtype,
                   TQA_DYN=int(dyn), TQA_MAXP=MAX_PARTIALS)
    order = ["TQA_KF", "TQA_VF", "TQA_KBB", "TQA_VBB", "TQA_KGRP", "TQA_VGRP", "TQA_KQS", "TQA_VQS",
             "TQA_KSG", "TQA_VSG", "TQA_KROT", "TQA_VROT", "TQA_G", "TQA_T"]
    extra1 = [fc[k] for k in order]
    extra2 = [fc["TQA_T"], fc["TQA_VGRP"], fc["TQA_VROT"]]
    if not dyn:
        split.update(fc)
        combine.update(TQA_T=fc["TQA_T"], TQA_VGRP=fc["TQA_VGRP"], TQA_VROT=fc["TQA_VROT"])
    return split, combine, extra1, extra2


@lru_cache(maxsize=None)
def _kernel_defs(qtype: int, version: str = "v1"):
    """(pass 1, pass 2) kernel definitions for q's element type and the pass-1 kernel version.

    Buffer names, as the kernel sources spell them (and the launch code below with a pass number:
    ``ip1`` / ``fp1`` are pass 1's): ``ip`` / ``fp`` the int / float launch parameters (``TQA_SPLIT_PARAMS``
    in attention_kernel.h lists pass 1's), ``tabs`` the value and rotation tables, ``dep`` the array the
    pass must run after, ``po`` the partial outputs of every split, ``pml`` their (running max, sum of
    weights) pairs, ``cnt`` one dispatch's ticket counters."""
    from .kernel import Kernel

    header = (KERNEL_DIR / "attention_kernel.h").read_text()
    qdt = "float32" if qtype == 0 else "uint16"
    body = {"v1": "attention_kernel_split.cpp", "v2": "attention_kernel_split_v2.cpp",
            "v3": "attention_kernel_split_v3.cpp", "v3f": "attention_kernel_split_v3.cpp"}[version]
    fused = version == "v3f"   # one dispatch: the ticket counters (written in place), the sinks, the output
    split = Kernel(
        "tq_attention_split" + ("" if version == "v1" else "_" + version),
        (("q", qdt), ("kb", "uint8"), ("vb", "uint8"), ("ip", "int32"), ("fp", "float32"), ("tabs", "float32"),
         ("dep", "uint32")) + ((("cnt", "uint32"), ("sinks", "float32")) if fused else ()),
        (("po", "float32"), ("pml", "float32")) + ((("out", qdt),) if fused else ()),
        (KERNEL_DIR / body).read_text(),
        header + ("\n" + (KERNEL_DIR / "attention_mma.h").read_text() if version.startswith("v3") else ""),
        inplace=("cnt",) if fused else ())
    combine = Kernel(
        "tq_attention_combine",
        (("po", "float32"), ("pml", "float32"), ("ip", "int32"), ("sinks", "float32"), ("tabs", "float32")),
        (("out", qdt),),
        (KERNEL_DIR / "attention_kernel_combine.cpp").read_text(), header)
    return split, combine


# ----------------------------------------------------------------------------- emulator


def _version(plan: Plan) -> str:
    """The kernel definition a plan runs (v3 in one dispatch is "v3f")."""
    return "v3f" if plan.kernel == "v3" and plan.fused else plan.kernel


def _built(backend: str, which: int, qtype: int, static: dict, version: str = "v1"):
    """Pass 1 (``which`` 0) or the combine pass (1), compiled for ``backend`` by the one kernel builder
    and cache (:func:`.dispatch.build`): the emulator's kernel, or MLX's raw callable on a GPU."""
    from .dispatch import build

    kern = build(_kernel_defs(qtype, version)[which], static, backend)
    return kern if backend == "cpu-emulator" else kern.raw


def _run_emulator(q, kb, vb, prob: Problem, sinks, plan: Plan, qtype: int, seed=None, dyn=True):
    split_s, comb_s, extra1, extra2 = _static(prob, plan, qtype, _dyn_build(prob, plan, dyn))
    if qtype == 2:  # bfloat16 exists only as MLX arrays: take the bits
        import mlx.core as mx

        qn = np.array(mx.view(q, mx.uint16))
    else:
        qn = _np(q)
        if qtype == 1:
            qn = np.ascontiguousarray(qn).view(np.uint16)
    qn = np.ascontiguousarray(qn)
    rows = prob.batch * prob.q_heads * prob.rows
    np_ = plan.partials
    ip1 = np.array([prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads, *extra1, *prob.lengths],
                   np.int32)
    fp1 = np.array([prob.scale, prob.softcap], np.float32)
    tabs = tables(prob)
    sk = np.zeros(prob.q_heads, np.float32) if sinks is None else _np(sinks).astype(np.float32).reshape(-1)
    k1 = _built("cpu-emulator", 0, qtype, split_s, _version(plan))
    ins = [qn, np.ascontiguousarray(_np(kb)), np.ascontiguousarray(_np(vb)), ip1, fp1, tabs, np.zeros(1, np.uint32)]
    grid1 = (prob.batch * prob.kv_heads * plan.splits, 1, 1)
    if plan.fused:
        cnt = np.zeros(prob.batch * prob.kv_heads, np.uint32)
        _, _, out = _launch(k1, ins + [cnt, sk], [(rows, np_, prob.v_dim), (rows, np_, 2), (rows, prob.head_dim)],
                            grid1, 32 * plan.warps, seed=seed)
        if cnt.any():
            raise RuntimeError(f"kernel v3 left its ticket counters at {cnt.tolist()} (the merging threadgroup resets them)")
        return out
    po, pml = _launch(k1, ins, [(rows, np_, prob.v_dim), (rows, np_, 2)], grid1, 32 * plan.warps, seed=seed)
    ip2 = np.array([np_, prob.q_heads, int(sinks is not None), *extra2], np.int32)
    k2 = _built("cpu-emulator", 1, qtype, comb_s)
    (out,) = _launch(k2, [po, pml, ip2, sk, tabs], [(rows, prob.head_dim)], (rows, 1, 1), COMBINE_THREADS, seed=seed)
    return out


# ----------------------------------------------------------------------------- MLX (CUDA / Metal)


LAUNCHES = [0]               # kernel launches made by this module (what the dispatch count reports)


def _launch(kernel, *args, **kw):
    LAUNCHES[0] += 1
    return kernel(*args, **kw)


@lru_cache(maxsize=256)
def _mlx_setup(shape_prob: Problem, shape_plan: Plan, qtype: int, backend: str, has_sinks: bool, dyn: bool = False):
    """Kernels and constant buffers of one call signature (lengths and splits left out)."""
    split_s, comb_s, extra1, extra2 = _static(shape_prob, shape_plan, qtype, dyn)
    fp1 = const_buffer(np.array([shape_prob.scale, shape_prob.softcap], np.float32), backend)
    tabs = const_buffer(tables(shape_prob), backend)
    # constants already evaluated (host data, or const_buffer's scheduled device copy: no pending
    # primitive, no host sync): a lazy mx.zeros here would be part of every mx.compile replay of the
    # launches (an extra fill kernel per call; the decode-step test's kernel count caught it on the
    # H200), and evaluating it with mx.eval would be a host sync in a decode step
    zero_sinks = const_buffer(np.zeros((shape_prob.q_heads,), np.float32), backend)
    k1 = _built(backend, 0, qtype, split_s, _version(shape_plan))
    k2 = _built(backend, 1, qtype, comb_s)
    return k1, k2, fp1, tabs, zero_sinks, tuple(extra1), tuple(extra2)


@lru_cache(maxsize=4)
def _no_dep(backend: str):
    # evaluated (host data, or const_buffer's device copy): no primitive for mx.compile to replay
    return const_buffer(np.zeros((1,), np.uint32), backend)


@lru_cache(maxsize=1024)
def _int_buffer(values: tuple, backend: str):
    """An int32 parameter buffer, made once per distinct content."""
    return const_buffer(np.array(values, np.int32), backend)


class _Launches:
    """The launches of one call (signature, plan and lengths fixed), every buffer prepared: what a
    decoding loop repeats. Called with MLX arrays; q and the output keep q's dtype (the kernels view
    fp16 / bf16 as bits). :meth:`launch` is the one place that issues them (DecodeLaunch too)."""

    __slots__ = ("k1", "k2", "fp1", "tabs", "zero_sinks", "ip1", "ip2", "out1", "grid1", "tg1", "shape", "grid2",
                 "no_dep", "cnt", "_compiled")

    def __call__(self, q, kb, vb, sinks):
        return self.launch(q, kb, vb, sinks, self.ip1, self.no_dep)

    def compiled(self, has_sinks: bool):
        """:meth:`launch` under ``mx.compile`` (``(q, kb, vb, ip1, dep[, sinks])``): traced once, then each
        call replays the traced custom-kernel primitives, so MLX's per-call Python binding and kernel
        source assembly drop out (H200: 15-21 -> 6-9 us of graph building per layer; see COMPILE_BACKENDS)."""
        import mlx.core as mx

        fns = self._compiled
        if fns is None:
            def plain(q, kb, vb, ip1, dep):
                return self.launch(q, kb, vb, None, ip1, dep)

            def with_sinks(q, kb, vb, ip1, dep, sinks):
                return self.launch(q, kb, vb, sinks, ip1, dep)
            fns = self._compiled = (mx.compile(plain), mx.compile(with_sinks))
        return fns[1] if has_sinks else fns[0]

    def launch(self, q, kb, vb, sinks, ip1, dep):
        """Pass 1 (with ``ip1``: its int parameters, ``dep``: the array it must run after) and the
        combine pass, or kernel v3's single dispatch when the plan has one."""
        import mlx.core as mx

        sk = self.zero_sinks if sinks is None else sinks.astype(mx.float32).reshape(-1)
        if self.cnt is not None:   # kernel v3 in one dispatch
            _, _, out = _launch(self.k1, inputs=[q, kb, vb, ip1, self.fp1, self.tabs, dep, self.cnt, sk],
                                output_shapes=self.out1 + self.shape, output_dtypes=[mx.float32, mx.float32, q.dtype],
                                grid=self.grid1, threadgroup=self.tg1)
            return out
        po, pml = _launch(self.k1, inputs=[q, kb, vb, ip1, self.fp1, self.tabs, dep],
                          output_shapes=self.out1, output_dtypes=[mx.float32, mx.float32], grid=self.grid1,
                          threadgroup=self.tg1)
        (out,) = _launch(self.k2, inputs=[po, pml, self.ip2, sk, self.tabs], output_shapes=self.shape,
                         output_dtypes=[q.dtype], grid=self.grid2, threadgroup=(COMBINE_THREADS, 1, 1))
        return out


@lru_cache(maxsize=1024)
def _launches(prob: Problem, plan: Plan, qtype: int, backend: str, has_sinks: bool, dyn: bool = False) -> _Launches:
    """Kernels, constant buffers and launch geometry of one call (lengths included): one lookup."""
    shape_prob = dataclasses.replace(prob, lengths=())
    shape_plan = dataclasses.replace(plan, splits=0, split_len=0)
    f = _Launches()
    f._compiled = None
    f.k1, f.k2, f.fp1, f.tabs, f.zero_sinks, extra1, extra2 = _mlx_setup(shape_prob, shape_plan, qtype, backend,
                                                                         has_sinks, dyn)
    f.no_dep = _no_dep(backend)
    f.ip1 = _int_buffer((prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads, *extra1,
                         *prob.lengths), backend)
    f.ip2 = _int_buffer((plan.partials, prob.q_heads, int(has_sinks), *extra2), backend)
    rows = prob.batch * prob.q_heads * prob.rows
    f.out1 = [(rows, plan.partials, prob.v_dim), (rows, plan.partials, 2)]
    f.grid1 = (prob.batch * prob.kv_heads * plan.splits * 32 * plan.warps, 1, 1)
    f.tg1 = (32 * plan.warps, 1, 1)
    f.shape = [(prob.batch, prob.q_heads, prob.head_dim) if prob.squeeze_rows else
               (prob.batch, prob.q_heads, prob.rows, prob.head_dim)]
    f.grid2 = (rows * COMBINE_THREADS, 1, 1)
    f.cnt = _ticket_counters(prob.batch * prob.kv_heads) if plan.fused else None
    return f


_COUNTERS: dict = {}


def _ticket_counters(n: int):
    """Ticket counters of kernel v3's single dispatch: zeros, written in place by the kernel (the
    merging threadgroup resets its head's counter), one buffer per size shared by every launch (MLX
    runs a device's kernels in order on one stream)."""
    buf = _COUNTERS.get(n)
    if buf is None:
        import mlx.core as mx

        # at least MIN_CONST_BYTES: one KV head's single counter (4 bytes) would sit in MLX's small
        # pool of unified memory (see DEVICE_CONSTS_BACKENDS), its atomics crossing the interconnect
        buf = _COUNTERS[n] = mx.zeros((max(n, MIN_CONST_BYTES // 4),), mx.uint32)
        mx.eval(buf)
    return buf


def _run_mlx(q, kb, vb, prob: Problem, sinks, plan: Plan, qtype: int, backend: str, dyn=False):
    import mlx.core as mx

    def as_mx(a):
        return a if isinstance(a, mx.array) else mx.array(np.ascontiguousarray(_np(a)))

    run = _launches(prob, plan, qtype, backend, sinks is not None, dyn)
    return run(as_mx(q), as_mx(kb), as_mx(vb), None if sinks is None else as_mx(sinks))


def kernel_attention(q, k_blocks, v_blocks, prob: Problem, sinks=None, *, backend: str = "auto",
                     splits: "int | None" = None, lanes_per_key: "int | None" = None, warps: "int | None" = None,
                     tile: "int | None" = None, kernel: "str | None" = None, seed: "int | None" = None,
                     generic: "bool | None" = None, q_precision: "str | None" = None):
    """Run the two kernel passes on ``backend`` and return the output shaped like q.

    ``generic``: build the format-generic variant (format constants in the parameter buffer: one
    build for every format pair). Default: yes on the emulator, no on a GPU (one specialised build
    per format pair, the fast one); ``generic=True`` on a GPU serves sweeps over many pairs.
    ``kernel``: the pass-1 kernel, "v2" or "v1" (default: v2 when its threadgroup memory fits).
    """
    bk = pick_backend("auto" if backend == "kernel" else backend)
    qdt = str(q.dtype).replace("mlx.core.", "")
    if qdt not in QTYPES:
        raise AttentionError(f"the attention kernel takes float32, float16 or bfloat16 q; got {qdt}")
    qtype = QTYPES[qdt]
    if generic is None:
        generic = bk == "cpu-emulator"
    kernel = resolve_kernel(prob, bk, kernel, q_precision)
    plan = _plan_cached(prob, bk, splits, lanes_per_key, warps, tile, kernel, bool(generic))
    launches0 = LAUNCHES[0]
    shape = (prob.batch, prob.q_heads, prob.head_dim) if prob.squeeze_rows else (
        prob.batch, prob.q_heads, prob.rows, prob.head_dim)
    if bk == "cpu-emulator":
        out = _run_emulator(q, k_blocks, v_blocks, prob, sinks, plan, qtype, seed, generic)
        if qtype == 1:
            out = out.view(np.float16)
        out = out.reshape(shape)
        if _is_mlx(q):
            import mlx.core as mx

            out = mx.array(out) if qtype != 2 else mx.view(mx.array(out), mx.bfloat16)
    else:
        out = _run_mlx(q, k_blocks, v_blocks, prob, sinks, plan, qtype, bk, _dyn_build(prob, plan, generic))
        if not _is_mlx(q):
            import mlx.core as mx

            mx.eval(out)
            out = _np(out)
    record_run(RunRecord(
        backend=bk, dispatches=LAUNCHES[0] - launches0, kernel=plan.kernel, splits=plan.splits,
        lanes_per_key=plan.lanes_per_key, warps=plan.warps, tile=plan.tile,
        chain=plan.chain(max(prob.lengths)), q_precision=plan.q_precision,
        **_v3_report(prob, plan)))
    return out


V3_PROLOGUES = (0, 1, 2)     # kernel v3's prologue variants (TQBRIDGE_V3_PROLOGUE; TQA_PRO in the kernel source)


def v3_prologue() -> int:
    """Kernel v3's prologue (``TQBRIDGE_V3_PROLOGUE``; 2 by default; every variant gives the same bits):
    0 quantizes q one 32-value block per thread (32-way threadgroup-memory bank conflicts) and issues the
    first tiles' copies after it; 1 quantizes by 8 lanes per block (4 values and one word of codes each:
    at most 4-way conflicts), copies after; 2 as 1, with the first NS - 1 tiles' copies issued before q is
    loaded, so their latency hides q's load, rotation and quantization."""
    return _env_choice("TQBRIDGE_V3_PROLOGUE", 2, V3_PROLOGUES)


def v3_merge_pad() -> bool:
    """Whether v3's SIMD groups leave their partial rows in threadgroup memory at a stride of DV + 1 (at most
    2-way bank conflicts for the fragment stores) instead of DV (8-way); the same bits either way.
    ``TQBRIDGE_V3_MERGE_PAD`` = 0 / 1; on by default."""
    return _env_switch("TQBRIDGE_V3_MERGE_PAD", True)


def _v3_report(prob: Problem, plan: Plan) -> dict:
    """What a run record and ``run_info`` say of a v3 build (None for the other kernels)."""
    v3 = plan.kernel == "v3"
    return dict(v_decode=v3_v_decode(prob) if v3 else None, chunks=plan.chunks if v3 else None,
                stages=plan.stages if v3 else None, dyn_smem=plan.dyn_smem if v3 else None,
                prologue=v3_prologue() if v3 else None, merge_pad=v3_merge_pad() if v3 else None)


def fast_call(q, prob: Problem, options: dict, *, backend: str) -> "_Launches | None":
    """The prepared launches of the call just made on ``backend`` (where its RunRecord says it ran),
    when it ran on a GPU with MLX arrays and the default build; else None."""
    bk = backend
    if not _is_mlx(q) or bk not in ("cuda", "metal") or set(options) - {"splits", "lanes_per_key", "warps",
                                                                        "tile", "kernel", "q_precision"}:
        return None
    qtype = QTYPES[str(q.dtype).replace("mlx.core.", "")]
    kernel = resolve_kernel(prob, bk, options.get("kernel"), options.get("q_precision"))
    plan = _plan_cached(prob, bk, options.get("splits"), options.get("lanes_per_key"), options.get("warps"),
                        options.get("tile"), kernel, False)
    return _launches(prob, plan, qtype, bk, prob.has_sinks)


def _dyn_build(prob: Problem, plan: Plan, generic: bool) -> bool:
    """Whether to build the format-generic variant (v1 holds at most DYN_MAX_ROWS rows; v3 has none)."""
    if plan.kernel == "v3":
        return False
    return generic and (plan.kernel == "v2" or prob.group * prob.rows <= DYN_MAX_ROWS)


def _is_mlx(a) -> bool:
    mod = type(a).__module__
    return mod[:3] == "mlx"


class DecodeLaunch:
    """The fused attention of decode steps over cache buffers of one geometry (capacity included),
    shared by every layer of that geometry: the launch plan is made for a full buffer, and the
    length — which grows every step — travels in the parameter buffer, made once per length for all
    layers. A decoding loop reuses the same two launches for every step until the buffers grow.
    ``after``: an array the kernel must run after (the in-place append's flag), so it reads the rows
    that append wrote."""

    def __init__(self, prob: Problem, backend: str, qtype: int, q_precision: "str | None" = None):
        self.backend = backend
        plan = _plan_cached(prob, backend, None, None, None, None, resolve_kernel(prob, backend, None, q_precision),
                            False)
        self.plan = plan
        run = _launches(prob, plan, qtype, backend, prob.has_sinks)
        self._head = [int(x) for x in _param_head(prob, plan)]
        self.l_max = prob.l_max
        self.batch = prob.batch
        self._ip1: dict = {}
        self.compiled = compile_launches(backend)
        self._table = None
        self.device_params = device_params(backend)
        self.run_info = dict(backend=backend, dispatches=plan.dispatches, kernel=plan.kernel, splits=plan.splits,
                             warps=plan.warps, tile=plan.tile, lanes_per_key=plan.lanes_per_key,
                             chain=plan.chain(prob.l_max), q_precision=plan.q_precision, **_v3_report(prob, plan),
                             compiled=self.compiled,
                             device_params=self.device_params, device_consts=device_consts(backend))
        self._run = run    # the prepared launches; this class adds the per-length parameter buffer
        self.fuses_append = defer_append(backend)
        self._with_append: dict = {}   # prepared append -> the compiled append + attention

    def ip1(self, length: int):
        """The pass-1 int parameters for ``length`` (one array per length, shared by the layers)."""
        buf = self._ip1.get(length)
        if buf is None:
            if not 0 <= length <= self.l_max:
                raise AttentionError(f"length {length} is outside 0..{self.l_max} (the cache's L_max)")
            import mlx.core as mx

            if len(self._ip1) > 64:
                self._ip1.clear()
            if self.device_params:   # a view of the device table (see device_params)
                if self._table is None:
                    self._table = param_table(self._head, self.l_max + 1, self.batch, np.int32)
                buf = self._ip1[length] = table_row(self._table, length)
            else:
                buf = self._ip1[length] = mx.array(np.array(self._head + [length] * self.batch, np.int32))
        return buf

    def __call__(self, q, kb, vb, length: int, after=None, sinks=None):
        run = self._run
        dep = run.no_dep if after is None else after
        ip1 = self.ip1(length)
        if self.compiled:
            fn = run.compiled(sinks is not None)
            return fn(q, kb, vb, ip1, dep) if sinks is None else fn(q, kb, vb, ip1, dep, sinks)
        return run.launch(q, kb, vb, sinks, ip1, dep)

    def with_append(self, append, k_rows, v_rows, q, kb, vb, pos: int, flag_in, length: int):
        """The decode step's in-place append of ``k_rows`` / ``v_rows`` at row ``pos`` (``append``: the
        cache's prepared :class:`~tqbridge.metal.kv_append.KVAppend`, ``flag_in`` its flag) and then this
        attention at ``length``, ordered after it by the append's flag: ``(flag, out)``. Compiled
        launches trace both as one function (one replay per layer instead of two)."""
        fn = self._with_append.get(append)
        if fn is None:
            import mlx.core as mx

            run = self._run

            def both(k_rows, v_rows, q, kb, vb, params, flag_in, ip1):
                flag = append.launch(k_rows, v_rows, kb, vb, params, flag_in)
                return flag, run.launch(q, kb, vb, None, ip1, flag)
            fn = self._with_append[append] = mx.compile(both) if self.compiled else both
        return fn(k_rows, v_rows, q, kb, vb, append.step_params(k_rows, kb, pos, flag_in), flag_in, self.ip1(length))


def _param_head(prob: Problem, plan: Plan) -> list:
    """The pass-1 int parameters before the per-row lengths."""
    extra1 = _static(prob, plan, 0, False)[2]
    return [prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads, *extra1]


def prepare_decode(q, k_blocks, v_blocks, *, k_format, v_format, scale=None, window=None, softcap=None,
                   sinks=None, rotation=None, backend: str = "auto",
                   q_precision: "str | None" = None) -> "DecodeLaunch | None":
    """The :class:`DecodeLaunch` for MLX arrays shaped like these on a GPU backend (one per geometry,
    shared), else None (the caller then takes :func:`tqbridge.metal.decode_attention`)."""
    bk = pick_backend("auto" if backend == "kernel" else backend)
    if bk == "cpu-emulator" and backend == "cpu-emulator" and _is_mlx(q):
        return _EmulatedDecodeLaunch(q, k_blocks, k_format, v_format, scale, window, softcap, rotation, q_precision)
    if bk not in ("cuda", "metal") or not _is_mlx(q):
        return None
    qdt = str(q.dtype).replace("mlx.core.", "")
    if qdt not in QTYPES:
        return None
    prob = check_problem(q, k_blocks, v_blocks, k_format=k_format, v_format=v_format,
                         length=int(k_blocks.shape[2]), scale=scale, window=window, softcap=softcap,
                         sinks=sinks, rotation=rotation)
    return _decode_launch(prob, bk, QTYPES[qdt], q_precision)


def clear_launch_caches() -> None:
    """Forget every plan, prepared launch and kernel setup (after changing an environment switch such as
    TQBRIDGE_V3_DISPATCHES, which plans and launches read when they are made)."""
    for f in (_plan_cached, _decode_launch, _launches, _mlx_setup, _no_dep, _int_buffer):
        f.cache_clear()


@lru_cache(maxsize=64)
def _decode_launch(prob: Problem, backend: str, qtype: int, q_precision: "str | None" = None) -> DecodeLaunch:
    return DecodeLaunch(prob, backend, qtype, q_precision)


class _EmulatedDecodeLaunch:
    """A :class:`DecodeLaunch` stand-in running the same kernels on the CPU emulator over MLX
    arrays (synchronises): the GPU decode lane's logic under test on machines without a GPU."""

    backend = "cpu-emulator"

    def __init__(self, q, k_blocks, k_format, v_format, scale, window, softcap, rotation, q_precision=None):
        self.l_max = int(k_blocks.shape[2])
        self._kw = dict(k_format=k_format, v_format=v_format, scale=scale, window=window, softcap=softcap,
                        rotation=rotation, q_precision=q_precision)
        self.fuses_append = defer_append(self.backend)
        self.run_info = {"backend": self.backend}   # what its latest call ran (a DecodeLaunch's is its plan)

    def with_append(self, append, k_rows, v_rows, q, kb, vb, pos: int, flag_in, length: int):
        """:meth:`DecodeLaunch.with_append`'s contract: the append, then this attention (two calls here)."""
        flag = append(k_rows, v_rows, kb, vb, pos, flag_in)
        return flag, self(q, kb, vb, length, after=flag)

    def __call__(self, q, kb, vb, length: int, after=None, sinks=None):
        import mlx.core as mx

        mx.eval(q, kb, vb, *([] if after is None else [after]))
        out = self._attend(np.array(q.astype(mx.float32)), np.array(kb), np.array(vb), length,
                           None if sinks is None else np.array(sinks))
        self.run_info = last_run()
        return mx.array(out).astype(q.dtype)

    def _attend(self, q, kb, vb, length: int, sinks):
        """``decode_attention(..., backend="cpu-emulator")`` on numpy arrays: the option checked, the
        problem validated, the two kernel passes on the emulator (recorded as the thread's last run)."""
        kw = dict(self._kw)
        qp = kw.pop("q_precision")
        check_q_precision(qp)
        prob = check_problem(q, kb, vb, length=length, sinks=sinks, **kw)
        return kernel_attention(q, kb, vb, prob, sinks, backend="cpu-emulator", q_precision=qp)
