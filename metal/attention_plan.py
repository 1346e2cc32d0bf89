"""The fused decode attention's launch plans: which pass-1 kernel, how many splits, threadgroup shape.

Three pass-1 kernels (the combine pass is shared) write the same partial outputs:

- ``v1`` (``attention_kernel_split.cpp``): several lanes share a key; serves every shape, including
  the many-row, wide-head problems whose threadgroup memory v2 cannot fit;
- ``v2`` (``attention_kernel_split_v2.cpp``): one key per thread for the scores, column chunks per lane
  for V; the exact-q kernel wherever it fits;
- ``v3`` (``attention_kernel_split_v3.cpp``): matrix fragments, q quantized to int8 as llama.cpp's
  vec_dot does; K in ggml's 32-value legacy blocks, at most 8 query rows per KV head.

:func:`make_plan` decides for one :class:`~tqbridge.metal.attention_problem.Problem`, backend and
resolved :class:`~tqbridge.metal.decode_options.DecodeOptions`. GPU grid targets are threadgroups per
compute unit (:mod:`.decode_options`) times the device's units; the emulator splits by keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..bridge.registry import names as _format_names
from .attention_formats import _fmt_params
from .attention_problem import AttentionError, Problem
from .decode_options import (DEFAULT_OPTIONS, DEFAULT_Q_PRECISION, FILL_PER_UNIT_V2, GROUPS_PER_UNIT_V1,
                             GROUPS_PER_UNIT_V2, GROUPS_PER_UNIT_V3, GROUPS_PER_UNIT_V3_LONG, INT8_DEFAULT_MAX_V_BITS,
                             V3_CHUNKS, V3_LONG_SPLIT_KEYS, DecodeOptions, compute_units, resident_groups)

MAX_PARTIALS = 1024          # pass 2 keeps one weight per partial in threadgroup memory
COMBINE_THREADS = 256        # >= the largest row (256 values), a power of 2
EMU_SPLIT_KEYS = 256         # on the emulator: about this many keys per split
TILE_BYTES = 16384           # K + V bytes staged per tile in threadgroup memory (v1)
SHARED_BYTES = 32768         # threadgroup memory of one threadgroup (Metal's limit, the emulator's too)
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
V3_STAGES_CUDA = 3           # the deepest copy ring a v3 plan takes (two tiles copied while one is computed)
V3_DYNAMIC_CUDA = 100 * 1024  # CUDA, tiles beyond static shared memory: at most this per threadgroup (2 per SM)
DSMEM_MIN = 48016            # dynamic requests start here: MLX raises CUDA's limit only for more than 48000 bytes
# the copy ring of CUDA's automatic plans for tiles of 64 keys or more: 2 stages (26 KB, 8 threadgroups
# of 2 SIMD groups per SM) measured faster than 3 (38 KB, 5) at every length on the H200
V3_AUTO_STAGES_CUDA = 2
V3_MIN_SPLIT_KEYS = 128      # v3 on a GPU: at least this many keys per split


@dataclass(frozen=True)
class Plan:
    lanes_per_key: int
    warps: int
    splits: int
    split_len: int
    tile: int = 0             # keys staged per tile (0: chosen from the row sizes)
    kernel: str = "v1"        # pass-1 kernel: "v1", "v2" or "v3"
    rows_room: int = 0        # v2: query rows the build holds (TQA_QA)
    stages: int = 2           # v3: tiles in the asynchronous copy ring (TQA_NS)
    chunks: int = 1           # v3: 16-key chunks a SIMD group takes per online-softmax step (TQA_KC)
    dyn_smem: int = 0         # v3: bytes of dynamic threadgroup memory holding the staging area (TQ_DSMEM; 0: static)
    v_decode: str = ""        # v3: how V rows become fragments (:func:`v3_v_decode`)

    dispatches = 2            # pass 1 and the combine pass

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


def target_groups(options: DecodeOptions, backend: str, per_unit: int) -> int:
    """Pass-1 threadgroups a GPU plan aims for: ``options.target_groups``, else ``per_unit`` times the
    device's compute units."""
    return options.target_groups or per_unit * compute_units(backend)


def _lanes_per_key(dk: int, dv: int) -> int:
    ok = [n for n in (4, 8, 16, 32) if dk % (4 * n) == 0 and dv % (4 * n) == 0]
    if not ok:
        raise AttentionError(f"head rows of {dk} / {dv} values are not multiples of 16")
    small = [n for n in ok if max(dk, dv) // n <= 8]
    return small[0] if small else ok[-1]


def row_bytes(prob: Problem, dyn: bool) -> tuple[int, int]:
    """Bytes of one K row and one V row as a build stages them (``dyn``: room for f32 rows)."""
    if dyn:   # room for the widest format (f32), so one build serves every pair
        return 4 * prob.k_dim, 4 * prob.v_dim
    ks, *_ = _fmt_params(prob.k_format)
    vs, *_ = _fmt_params(prob.v_format)
    return prob.k_dim // ks["GRP"] * ks["BB"], prob.v_dim // vs["GRP"] * vs["BB"]


def rows_room(prob: Problem, dyn: bool) -> int:
    """TQA_QA of a v2 build: the group's query rows (a power of two in format-generic builds)."""
    q = prob.group * prob.rows
    return 1 << (q - 1).bit_length() if dyn else q


def v2_shared_bytes(prob: Problem, warps: int, tile: int, dyn: bool) -> int:
    """Threadgroup memory of a v2 pass-1 build: each array rounded up to 16 bytes, plus the
    emulator's 64 guard bytes after each (so a plan that fits runs on every backend)."""
    krb, vrb = row_bytes(prob, dyn)
    qa = rows_room(prob, dyn)
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
              dyn: bool = False, chunks: "int | None" = None, options: "DecodeOptions | None" = None) -> Plan:
    """Launch plan. ``kernel``: None (v2 when it fits, else v1), "v1", "v2" or "v3"; ``dyn``: the build is
    format-generic (the emulator's default), which sizes threadgroup memory for f32 rows; ``chunks``:
    v3's chunks per step (else ``options.chunks``); ``options``: resolved for ``backend`` here."""
    opts = (DEFAULT_OPTIONS if options is None else options).resolve(backend)
    if max(prob.k_dim, prob.v_dim) > COMBINE_THREADS:
        raise AttentionError(f"the attention kernel takes rows of at most {COMBINE_THREADS} values; "
                             f"got {prob.k_dim} (K) / {prob.v_dim} (V)")
    if kernel is not None and kernel not in KERNELS:
        raise AttentionError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if kernel == "v3":
        if lanes_per_key is not None:
            raise AttentionError("lanes_per_key is an option of kernel v1 only")
        return _make_plan_v3(prob, backend, splits, warps, tile, chunks, opts)
    if chunks is not None:
        raise AttentionError("chunks is an option of kernel v3 only")
    if kernel != "v1" and lanes_per_key is None:
        plan = _make_plan_v2(prob, backend, splits, warps, tile, dyn, kernel == "v2", opts)
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
            splits = max(1, min(-(-l_used // per_group),
                                target_groups(opts, backend, GROUPS_PER_UNIT_V1) // (prob.batch * prob.kv_heads)))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS // nw, l_used)
    return Plan(lpk, nw, splits, -(-l_used // splits), tl)


def _make_plan_v2(prob: Problem, backend: str, splits, warps, tile, dyn: bool, required: bool,
                  opts: DecodeOptions) -> "Plan | None":
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
        while nw > 1 and heads * -(-l_used // tl) < FILL_PER_UNIT_V2 * compute_units(backend):
            nw //= 2
            tl = _v2_tile(prob, nw, dyn, None)
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            splits = max(1, min(-(-l_used // (V2_MIN_TILES * tl)),
                                target_groups(opts, backend, GROUPS_PER_UNIT_V2) // heads))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS, l_used)
    split_len = -(-l_used // splits)
    if backend != "cpu-emulator":   # whole tiles per split (aligned staging, no short tiles)
        split_len = -(-split_len // tl) * tl
        splits = -(-l_used // split_len)
    return Plan(1, nw, splits, split_len, tl, "v2", rows_room(prob, dyn))


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


def turbo_index_bits(fmt) -> int:
    """Bits of one turbo centroid index (2 / 3 / 4; the codebook's size), 0 for other formats."""
    return int(fmt.codec.spec.levels).bit_length() - 1 if fmt.kind == "turbo" else 0


def v3_shared_bytes(prob: Problem, warps: int, tile: int, stages: int = 2, v_decode: str = "") -> int:
    """Threadgroup memory of a v3 pass-1 build (each array rounded up to 16 bytes, plus the
    emulator's 64 guard bytes after each)."""
    nb = prob.k_dim // 32
    vb = turbo_index_bits(prob.v_format)
    v_decode = v_decode or v3_v_decode(prob, DEFAULT_OPTIONS)
    sizes = [64, 64, 8 * prob.k_dim + 128, 4 * 8 * nb, 4 * 8 * nb, v3_stage_bytes(prob, warps, tile, stages),
             (1024 if vb == 4 or v_decode == "turbo-permute" else 256) if vb else 4]
    return sum(-(-x // 16) * 16 + 64 for x in sizes)


def v3_v_decode(prob: Problem, opts: DecodeOptions) -> str:
    """How kernel v3 decodes ``prob``'s V rows into binary16 fragments (the RunRecord's ``v_decode``):
    "turbo-permute" (turbo2 / turbo3 of one 128-value block per row: four centroids per byte permute of
    registers), "codes-permute" (legacy blocks x = d * (code - offset), 4-, 5- or 8-bit codes: codes
    moved into binary16 integers by byte permutes, one subtraction, times the pair of block scales),
    or "generic" (every other format, and every format under ``options.v_decode="generic"``: the
    per-value decoder; each fast path is bit-identical to it, tests/test_attention_v3_v_paths.py)."""
    if opts.v_decode == "generic":
        return "generic"
    if turbo_index_bits(prob.v_format) in (2, 3) and prob.v_dim == 128 and prob.v_format.block_size == 128:
        return "turbo-permute"
    lay = prob.v_format.layout
    if (lay is not None and not lay.has_m and lay.values is None and lay.bits in (4, 5, 8)
            and prob.v_dim % 64 == 0 and 32 % (prob.v_dim // 16) == 0):
        return "codes-permute"
    return "generic"


def v3_stage_bytes(prob: Problem, warps: int, tile: int, stages: int = 2) -> int:
    """The staging area of a v3 build: ``stages`` tiles in a ring (one computed while the others are
    copied); q's rows in its last buffer while the first tiles are copied (they may reach past the ring's
    end); at the end the SIMD groups' partial results."""
    krb, vrb = row_bytes(prob, False)
    tile_bytes = -(-tile * krb // 4) * 4 + -(-tile * vrb // 4) * 4
    return max(stages * tile_bytes, (stages - 1) * tile_bytes + 4 * 8 * prob.k_dim, 4 * warps * 8 * (prob.v_dim + 3),
               4 * (MAX_PARTIALS + prob.v_dim + 32 * warps + 1))


def _v3_limits(backend: str) -> tuple[int, int]:
    """(threadgroup memory bytes, deepest copy ring) for v3 on ``backend``: CUDA's static shared
    memory allows 48 KB (the copies in flight per SM bound the speed); Metal and the emulator keep
    32 KB (fewer or smaller tiles)."""
    return (V3_SHARED_CUDA, V3_STAGES_CUDA) if backend == "cuda" else (SHARED_BYTES, V3_STAGES_CUDA)


def v3_target_groups(opts: DecodeOptions, backend: str, length: int, heads: int, shared_bytes: int = 0) -> int:
    """Pass-1 threadgroups v3's GPU plans aim for: ``opts.target_groups``; else on CUDA 6 per compute
    unit where each split still keeps V3_LONG_SPLIT_KEYS keys of ``length``; else 4 per unit. Per unit,
    never more than the unit holds at once (threadgroups of ``shared_bytes``, :func:`resident_groups`):
    a second, partial wave costs more than it spreads (head dim 256, 5 resident per H200 SM: 128K in
    98 splits 521 us, in 66 splits 393 us)."""
    if opts.target_groups:
        return opts.target_groups
    units = compute_units(backend)
    resident = resident_groups(backend, shared_bytes) if shared_bytes else None
    per_long, per_unit = GROUPS_PER_UNIT_V3_LONG, GROUPS_PER_UNIT_V3
    if resident:
        per_long, per_unit = min(per_long, resident), min(per_unit, resident)
    long_target = per_long * units
    if backend == "cuda" and length // max(1, long_target // max(heads, 1)) >= V3_LONG_SPLIT_KEYS:
        return long_target
    return per_unit * units


def _make_plan_v3(prob: Problem, backend: str, splits, warps, tile, chunks, opts: DecodeOptions) -> Plan:
    why = v3_refusal(prob)
    if why:
        raise AttentionError(why)
    if chunks is not None and int(chunks) not in V3_CHUNKS:
        raise AttentionError(f"kernel v3 takes chunks of {' or '.join(map(str, V3_CHUNKS))} (16-key chunks per "
                             f"SIMD-group step), got {chunks}")
    kc = opts.chunks if chunks is None else int(chunks)
    v_decode = v3_v_decode(prob, opts)
    nw = V3_WARPS if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    limit, ns0 = _v3_limits(backend)

    def need(n_warps, t, n):
        return v3_shared_bytes(prob, n_warps, t, n, v_decode)

    if warps is None:   # wide rows: fewer SIMD groups (a smaller merge area) where 4 do not fit
        while nw > 1 and need(nw, 16, 2) > limit:
            nw //= 2
    # CUDA: a staging area beyond the static limit goes to dynamic threadgroup memory (an explicit tile, e.g.
    # 128 keys for 4 SIMD groups of two chunks; or nothing static fits)
    dyn_limit = V3_DYNAMIC_CUDA if backend == "cuda" else limit

    def stages_for(t):   # (stages, dynamic) for tile t: the most stages that fit, static before dynamic
        for n in range(ns0, 1, -1):
            b = need(nw, t, n)
            if b <= limit:
                return n, False
            if b <= dyn_limit:
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
        sizes = {(n, t): need(nw, t, n) for n in range(2, ns0 + 1) for t in range(16 * kc, V3_MAX_TILE + 1, 16 * kc)}
        fits = [(n, t, False) for (n, t), b in sizes.items() if b <= limit] \
            or [(n, t, True) for (n, t), b in sizes.items() if b <= dyn_limit]
        if not fits:
            raise AttentionError(f"kernel v3 does not fit {limit} bytes of threadgroup memory for rows of "
                                 f"{prob.k_dim} / {prob.v_dim} values with {nw} SIMD groups")
        ns, tl, dyn = max(fits, key=lambda f: ((f[0] - 1) * f[1], f[1], not f[2]))
        # CUDA: a tile of 64 keys or more in a ring of V3_AUTO_STAGES_CUDA where that fits static memory (a
        # whole tile still in flight while one is computed): the smaller staging area lets more threadgroups
        # share an SM, which measured faster than a deeper ring (64-key tiles; smaller ones keep their ring)
        if backend == "cuda" and ns > V3_AUTO_STAGES_CUDA and tl >= 64 and sizes[V3_AUTO_STAGES_CUDA, tl] <= limit:
            ns, dyn = V3_AUTO_STAGES_CUDA, False
    if opts.dynamic_shared and backend != "metal":
        dyn = True   # the dynamic declaration also where static memory would do (the emulator runs it)
    # each SIMD group takes 16 * chunks keys of a tile per step: with chunks > 1, no more groups than a tile
    # has steps (one chunk per step keeps its plans: the emulator's 48-key tiles idle a group)
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
            smem = need(nw, tl, ns)
            splits = max(1, min(-(-l_used // V3_MIN_SPLIT_KEYS),
                                v3_target_groups(opts, backend, l_used, heads, smem) // heads))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS, l_used)
    split_len = -(-l_used // splits)
    if backend != "cpu-emulator":   # whole tiles per split
        split_len = -(-split_len // tl) * tl
        splits = -(-l_used // split_len)
    dsmem = 0
    if dyn:
        stb = -(-v3_stage_bytes(prob, nw, tl, ns) // 16) * 16
        dsmem = stb if backend != "cuda" else max(stb, DSMEM_MIN)
    return Plan(1, nw, splits, split_len, tl, "v3", V3_MAX_ROWS, ns, kc, dsmem, v_decode)


def resolve_kernel(prob: Problem, backend: str, kernel: "str | None", q_precision: "str | None") -> "str | None":
    """The pass-1 kernel for a call: ``q_precision`` "int8" is kernel v3, "exact" kernels v1 / v2;
    None takes the backend's default precision (:data:`~.decode_options.DEFAULT_Q_PRECISION`), int8 only
    where v3 serves the problem and V has fewer than 8 bits per value."""
    if q_precision is None:
        if kernel is not None:
            return kernel
        want = DEFAULT_Q_PRECISION.get(backend, "exact")
        if want == "int8" and prob.v_format.bits_per_value >= INT8_DEFAULT_MAX_V_BITS:
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


@lru_cache(maxsize=256)
def plan_cached(prob: Problem, backend: str, splits, lanes_per_key, warps, tile, kernel, dyn,
                opts: DecodeOptions) -> Plan:
    """:func:`make_plan`, memoized per problem, backend, overrides and resolved options."""
    return make_plan(prob, backend, splits=splits, lanes_per_key=lanes_per_key, warps=warps, tile=tile,
                     kernel=kernel, dyn=dyn, options=opts)
