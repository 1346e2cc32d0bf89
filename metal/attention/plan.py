"""The fused decode attention's launch plans: which pass-1 kernel, how many splits, threadgroup shape.

Three pass-1 kernels (the combine pass is shared) write the same partial outputs. Each is named by how
it works (:data:`~tqbridge.metal.attention.problem.KERNELS`, where the names are defined;
docs/kernel-history.md maps the names they had before):

- ``lanes`` (``attention_kernel_split_lanes.cpp``): several lanes of a SIMD group share each key
  (``Plan.lanes_per_key``), each lane slot with its own online softmax; serves every shape, including
  the many-row, wide-head problems whose threadgroup memory ``tiles`` cannot fit;
- ``tiles`` (``attention_kernel_split_tiles.cpp``): a tile of keys at a time: one key per thread scores
  the whole tile into threadgroup memory, one softmax step per tile and query row for all SIMD groups,
  then column chunks per lane for V; the exact-q kernel wherever it fits;
- ``int8-mma`` (``attention_kernel_split_int8_mma.cpp``): matrix fragments (multiply-accumulate), q
  quantized to int8 as llama.cpp's vec_dot does; K in ggml's 32-value legacy blocks, at most 8 query
  rows per KV head.

:func:`make_plan` decides for one :class:`~tqbridge.metal.attention.problem.Problem`, backend and
resolved :class:`~tqbridge.metal.decode_options.DecodeOptions`. GPU grid targets are threadgroups per
compute unit (:mod:`.decode_options`) times the device's units; the emulator splits by keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ...bridge.blocks.registry import names as _format_names
from .formats import format_params
from .problem import AttentionError, Problem, kernel_name
from ..decode_options import (DEFAULT_OPTIONS, DEFAULT_Q_PRECISION, FILL_PER_UNIT_TILES, GROUPS_PER_UNIT_INT8_MMA,
                             GROUPS_PER_UNIT_INT8_MMA_LONG, GROUPS_PER_UNIT_LANES, GROUPS_PER_UNIT_TILES,
                             INT8_DEFAULT_MAX_V_BITS, INT8_MMA_CHUNKS, INT8_MMA_DEFAULT_CHUNKS, INT8_MMA_LONG_SPLIT_KEYS,
                             DecodeOptions, compute_units, resident_groups)

MAX_PARTIALS = 1024          # pass 2 keeps one weight per partial in threadgroup memory
COMBINE_THREADS = 256        # >= the largest row (256 values), a power of 2
EMU_SPLIT_KEYS = 256         # on the emulator: about this many keys per split
TILE_BYTES = 16384           # K + V bytes staged per tile in threadgroup memory (lanes)
SHARED_BYTES = 32768         # threadgroup memory of one threadgroup (Metal's limit, the emulator's too)
TILES_MIN_PER_SPLIT = 1      # tiles on a GPU: at least this many tiles per split
TILES_MIN_KEYS = 2           # tiles needs room for at least this many keys per tile, else lanes runs
# kernel int8-mma (matrix fragments, int8 q): K formats with int8 codes in 32-value blocks (ggml's legacy
# blocks: the registry entries with a layout), V formats whose decoded values are binary16 numbers
# (f32 / bf16 rows may not fit), at most 8 query rows per group
INT8_MMA_K_FORMATS = _format_names(lambda f: f.layout is not None)
INT8_MMA_V_REFUSED = ("f32", "bf16")
INT8_MMA_MAX_ROWS = 8                # the N side of the fragments: query rows of one GQA group
INT8_MMA_WARPS = 4
INT8_MMA_MAX_TILE = 64               # keys staged per tile (a multiple of 16; a ring of tiles is resident)
INT8_MMA_SHARED_CUDA = 48 * 1024     # CUDA's limit of static shared memory per threadgroup
INT8_MMA_STAGES_CUDA = 3             # the deepest copy ring a plan takes (two tiles copied while one is computed)
INT8_MMA_DYNAMIC_CUDA = 100 * 1024   # CUDA, tiles beyond static shared memory: at most this per threadgroup (2 per SM)
DSMEM_MIN = 48016            # dynamic requests start here: MLX raises CUDA's limit only for more than 48000 bytes
# the copy ring of CUDA's automatic plans for tiles of 64 keys or more: 2 stages (26 KB, 8 threadgroups
# of 2 SIMD groups per SM) measured faster than 3 (38 KB, 5) at every length on the H200
INT8_MMA_AUTO_STAGES_CUDA = 2
INT8_MMA_MIN_SPLIT_KEYS = 128        # int8-mma on a GPU: at least this many keys per split
# CUDA's automatic plan where static memory holds only tiles below INT8_MMA_MAX_TILE keys (rows of 256 values:
# 32-key tiles, so one SIMD group of two chunks per threadgroup): INT8_MMA_MAX_TILE-key tiles in dynamic memory,
# INT8_MMA_WIDE_WARPS SIMD groups of one chunk, the deepest ring that fits (3 tiles, 71 KB at 256 values). H200,
# q8_0/turbo3, 16/8 heads of 256, pass 1 at 4K / 32K / 128K: 16.5 / 41.5 / 109.8 us against 24.9 / 55.1 / 157.4
# (0.88 of the copy bandwidth at 128K); 4/1 heads at 32K 21.6 against 31.2 (record h200/2026-12-04-wide-rows)
INT8_MMA_WIDE_WARPS = 4


@dataclass(frozen=True)
class Plan:
    lanes_per_key: int
    warps: int
    splits: int
    split_len: int
    tile: int = 0             # keys staged per tile (0: chosen from the row sizes)
    kernel: str = "lanes"     # pass-1 kernel, one of attention_problem.KERNELS
    rows_room: int = 0        # tiles: query rows the build holds (TQA_QA)
    stages: int = 2           # int8-mma: tiles in the asynchronous copy ring (TQA_NS)
    chunks: int = 1           # int8-mma: 16-key chunks a SIMD group takes per online-softmax step (TQA_KC)
    dyn_smem: int = 0         # int8-mma: bytes of dynamic threadgroup memory for the staging area (TQ_DSMEM; 0: static)
    v_decode: str = ""        # int8-mma: how V rows become fragments (:func:`int8_mma_v_decode`)

    dispatches = 2            # pass 1 and the combine pass

    @property
    def partials(self) -> int:
        return self.splits if self.kernel in ("tiles", "int8-mma") else self.splits * self.warps

    @property
    def q_precision(self) -> str:
        """How q enters the scores: "int8" (int8-mma: ggml's q8_0 / q8_1 of q) or "exact" (float32)."""
        return "int8" if self.kernel == "int8-mma" else "exact"

    def chain(self, length: int) -> int:
        """Longest serial accumulation (for the error bound): keys per lane slot + merges."""
        if self.kernel == "int8-mma":
            keys = min(self.split_len, max(length, 1)) + 1
            subtiles = -(-keys // (16 * self.warps)) + 1
            # per SIMD group: one product of 16 keys and one rescale per sub-tile; 3 shuffle steps
            # for the sums; then the SIMD groups and the partials
            return -(-keys // self.warps) + 2 * subtiles + 16 + 3 + self.warps + self.partials
        if self.kernel == "tiles":
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
    ks, *_ = format_params(prob.k_format)
    vs, *_ = format_params(prob.v_format)
    return prob.k_dim // ks["GRP"] * ks["BB"], prob.v_dim // vs["GRP"] * vs["BB"]


def rows_room(prob: Problem, dyn: bool) -> int:
    """TQA_QA of a tiles build: the group's query rows (a power of two in format-generic builds)."""
    q = prob.group * prob.rows
    return 1 << (q - 1).bit_length() if dyn else q


def tiles_shared_bytes(prob: Problem, warps: int, tile: int, dyn: bool) -> int:
    """Threadgroup memory of a tiles pass-1 build: each array rounded up to 16 bytes, plus the
    emulator's 64 guard bytes after each (so a plan that fits runs on every backend)."""
    krb, vrb = row_bytes(prob, dyn)
    qa = rows_room(prob, dyn)
    sizes = [64, 64, 4 * qa * prob.k_dim, 4 * qa * tile, 4 * qa, 4 * qa, 4 * qa, 4 * warps * prob.v_dim,
             -(-tile * krb // 4) * 4, -(-tile * vrb // 4) * 4]
    return sum(-(-x // 16) * 16 + 64 for x in sizes)


def tiles_key_slots(prob: Problem) -> int:
    """Keys a SIMD group takes at once in the V phase of kernel tiles: 2 (16 lanes of 8+ values each) for rows of
    up to 128 values, else 1; fewer, longer chunks per lane spread the per-key work."""
    return 2 if prob.v_dim <= 128 else 1


def _tiles_tile_keys(prob: Problem, warps: int, dyn: bool, tile: "int | None") -> int:
    """Keys per tile for kernel tiles: the requested one if it fits, else the largest power of two <= 32 *
    warps that fits the threadgroup memory; 0 when not even TILES_MIN_KEYS keys fit."""
    if tile:
        return tile if tiles_shared_bytes(prob, warps, tile, dyn) <= SHARED_BYTES else 0
    t = 32 * warps
    while t >= TILES_MIN_KEYS and tiles_shared_bytes(prob, warps, t, dyn) > SHARED_BYTES:
        t //= 2
    return t if t >= TILES_MIN_KEYS else 0


def make_plan(prob: Problem, backend: str, *, splits: "int | None" = None, lanes_per_key: "int | None" = None,
              warps: "int | None" = None, tile: "int | None" = None, kernel: "str | None" = None,
              dyn: bool = False, chunks: "int | None" = None, options: "DecodeOptions | None" = None) -> Plan:
    """Launch plan. ``kernel``: None (tiles when it fits, else lanes) or one of
    :data:`~.attention_problem.KERNELS` (:func:`~.attention_problem.kernel_name`); ``dyn``: the build is format-generic (the emulator's default), which sizes threadgroup memory for f32 rows; ``chunks``:
    int8-mma's chunks per step (else ``options.chunks``); ``options``: resolved for ``backend`` here."""
    opts = (DEFAULT_OPTIONS if options is None else options).resolve(backend)
    if max(prob.k_dim, prob.v_dim) > COMBINE_THREADS:
        raise AttentionError(f"the attention kernel takes rows of at most {COMBINE_THREADS} values; "
                             f"got {prob.k_dim} (K) / {prob.v_dim} (V)")
    kernel = kernel_name(kernel)
    if kernel == "int8-mma":
        if lanes_per_key is not None:
            raise AttentionError("lanes_per_key is an option of kernel 'lanes' only")
        return _make_plan_int8_mma(prob, backend, splits, warps, tile, chunks, opts)
    if chunks is not None:
        raise AttentionError("chunks is an option of kernel 'int8-mma' only")
    if kernel != "lanes" and lanes_per_key is None:
        plan = _make_plan_tiles(prob, backend, splits, warps, tile, dyn, kernel == "tiles", opts)
        if plan is not None:
            return plan
    elif kernel == "tiles":
        raise AttentionError("lanes_per_key is an option of kernel 'lanes' only")
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
                                target_groups(opts, backend, GROUPS_PER_UNIT_LANES) // (prob.batch * prob.kv_heads)))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS // nw, l_used)
    return Plan(lpk, nw, splits, -(-l_used // splits), tl)


def _make_plan_tiles(prob: Problem, backend: str, splits, warps, tile, dyn: bool, required: bool,
                  opts: DecodeOptions) -> "Plan | None":
    nw = 4 if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    if tile is not None and (int(tile) < 2 or int(tile) > 256 or int(tile) & (int(tile) - 1)):
        raise AttentionError(f"tile must be a power of two in 2..256, got {tile}")
    tl = _tiles_tile_keys(prob, nw, dyn, None if tile is None else int(tile))
    if not tl:
        if required:
            raise AttentionError(f"kernel 'tiles' does not fit {SHARED_BYTES} bytes of threadgroup memory for "
                                 f"{prob.group * prob.rows} query rows of {prob.k_dim} values"
                                 + (f" with tile={tile}" if tile else ""))
        return None
    l_used = max(max(prob.lengths), 1)
    heads = prob.batch * prob.kv_heads
    if backend != "cpu-emulator" and warps is None and tile is None:
        # short contexts: smaller threadgroups (fewer keys per tile) so that the grid still fills the GPU
        while nw > 1 and heads * -(-l_used // tl) < FILL_PER_UNIT_TILES * compute_units(backend):
            nw //= 2
            tl = _tiles_tile_keys(prob, nw, dyn, None)
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            splits = max(1, min(-(-l_used // (TILES_MIN_PER_SPLIT * tl)),
                                target_groups(opts, backend, GROUPS_PER_UNIT_TILES) // heads))
    splits = int(splits)
    if splits < 1:
        raise AttentionError(f"splits must be positive, got {splits}")
    splits = min(splits, MAX_PARTIALS, l_used)
    split_len = -(-l_used // splits)
    if backend != "cpu-emulator":   # whole tiles per split (aligned staging, no short tiles)
        split_len = -(-split_len // tl) * tl
        splits = -(-l_used // split_len)
    return Plan(1, nw, splits, split_len, tl, "tiles", rows_room(prob, dyn))


def int8_mma_refusal(prob: Problem) -> "str | None":
    """Why kernel int8-mma cannot serve ``prob`` (None: it can)."""
    if prob.k_format.name not in INT8_MMA_K_FORMATS:
        return (f"kernel 'int8-mma' reads K as int8 codes; {prob.k_format.key} K is not one of "
                f"{', '.join(INT8_MMA_K_FORMATS)}")
    if prob.v_format.name in INT8_MMA_V_REFUSED:
        return f"kernel 'int8-mma' rounds V values to binary16; {prob.v_format.key} values may not fit"
    if prob.group * prob.rows > INT8_MMA_MAX_ROWS:
        return (f"kernel 'int8-mma' serves at most {INT8_MMA_MAX_ROWS} query rows per KV head; got {prob.group} "
                f"heads x {prob.rows} rows")
    if prob.k_dim % 32 or prob.v_dim % 64:
        return f"kernel 'int8-mma' needs K rows of 32k values and V rows of 64k values; got {prob.k_dim} / {prob.v_dim}"
    return None


def turbo_index_bits(fmt) -> int:
    """Bits of one turbo centroid index (2 / 3 / 4; the codebook's size), 0 for other formats."""
    return int(fmt.codec.spec.levels).bit_length() - 1 if fmt.kind == "turbo" else 0


def int8_mma_shared_bytes(prob: Problem, warps: int, tile: int, stages: int = 2, v_decode: str = "") -> int:
    """Threadgroup memory of an int8-mma pass-1 build (each array rounded up to 16 bytes, plus the
    emulator's 64 guard bytes after each)."""
    nb = prob.k_dim // 32
    vb = turbo_index_bits(prob.v_format)
    v_decode = v_decode or int8_mma_v_decode(prob, DEFAULT_OPTIONS)
    sizes = [64, 64, 8 * prob.k_dim + 128, 4 * 8 * nb, 4 * 8 * nb, int8_mma_stage_bytes(prob, warps, tile, stages),
             (1024 if vb == 4 or v_decode == "turbo-permute" else 256) if vb else 4]
    return sum(-(-x // 16) * 16 + 64 for x in sizes)


def int8_mma_v_decode(prob: Problem, opts: DecodeOptions) -> str:
    """How kernel int8-mma decodes ``prob``'s V rows into binary16 fragments (the RunRecord's ``v_decode``):
    "turbo-permute" (turbo2 / turbo3 rows of 128 or 256 values, each lane's runs of 8 / 16 values inside
    one block: four centroids per byte permute of registers), "codes-permute" (legacy blocks
    x = d * (code - offset), 4-, 5- or 8-bit codes: codes moved into binary16 integers by byte permutes,
    one subtraction, times the pair of block scales),
    or "generic" (every other format, and every format under ``options.v_decode="generic"``: the
    per-value decoder; each fast path is bit-identical to it, tests/test_attention_int8_mma_v_paths.py)."""
    if opts.v_decode == "generic":
        return "generic"
    run = prob.v_dim // 16   # the values of a V row one lane decodes per m-tile row
    if turbo_index_bits(prob.v_format) in (2, 3) and run in (8, 16) and prob.v_format.block_size % run == 0:
        return "turbo-permute"
    lay = prob.v_format.layout
    if (lay is not None and not lay.has_m and lay.values is None and lay.bits in (4, 5, 8)
            and prob.v_dim % 64 == 0 and 32 % (prob.v_dim // 16) == 0):
        return "codes-permute"
    return "generic"


def int8_mma_stage_bytes(prob: Problem, warps: int, tile: int, stages: int = 2) -> int:
    """The staging area of an int8-mma build: ``stages`` tiles in a ring (one computed while the others are
    copied); q's rows in its last buffer while the first tiles are copied (they may reach past the ring's
    end); at the end the SIMD groups' partial results."""
    krb, vrb = row_bytes(prob, False)
    tile_bytes = -(-tile * krb // 4) * 4 + -(-tile * vrb // 4) * 4
    return max(stages * tile_bytes, (stages - 1) * tile_bytes + 4 * 8 * prob.k_dim, 4 * warps * 8 * (prob.v_dim + 3),
               4 * (MAX_PARTIALS + prob.v_dim + 32 * warps + 1))


def _int8_mma_limits(backend: str) -> tuple[int, int]:
    """(threadgroup memory bytes, deepest copy ring) for int8-mma on ``backend``: CUDA's static shared
    memory allows 48 KB (the copies in flight per SM bound the speed); Metal and the emulator keep
    32 KB (fewer or smaller tiles)."""
    return (INT8_MMA_SHARED_CUDA, INT8_MMA_STAGES_CUDA) if backend == "cuda" else (SHARED_BYTES, INT8_MMA_STAGES_CUDA)


def int8_mma_target_groups(opts: DecodeOptions, backend: str, length: int, heads: int, shared_bytes: int = 0) -> int:
    """Pass-1 threadgroups int8-mma's GPU plans aim for: ``opts.target_groups``; else on CUDA 6 per compute
    unit where each split still keeps INT8_MMA_LONG_SPLIT_KEYS keys of ``length``; else 4 per unit. Per
    unit, never more than the unit holds at once (threadgroups of ``shared_bytes``, :func:`resident_groups`):
    a second, partial wave costs more than it spreads (head dim 256, 5 resident per H200 SM: 128K in
    98 splits 521 us, in 82 splits 388 us)."""
    if opts.target_groups:
        return opts.target_groups
    units = compute_units(backend)
    resident = resident_groups(backend, shared_bytes) if shared_bytes else None
    per_long, per_unit = GROUPS_PER_UNIT_INT8_MMA_LONG, GROUPS_PER_UNIT_INT8_MMA
    if resident:
        per_long, per_unit = min(per_long, resident), min(per_unit, resident)
    long_target = per_long * units
    if backend == "cuda" and length // max(1, long_target // max(heads, 1)) >= INT8_MMA_LONG_SPLIT_KEYS:
        return long_target
    return per_unit * units


def _make_plan_int8_mma(prob: Problem, backend: str, splits, warps, tile, chunks, opts: DecodeOptions) -> Plan:
    why = int8_mma_refusal(prob)
    if why:
        raise AttentionError(why)
    if chunks is not None and int(chunks) not in INT8_MMA_CHUNKS:
        raise AttentionError(f"kernel 'int8-mma' takes chunks of {' or '.join(map(str, INT8_MMA_CHUNKS))} (16-key "
                             f"chunks per SIMD-group step), got {chunks}")
    kc_set = opts.chunks if chunks is None else int(chunks)   # None: the planner's choice
    kc = kc_set or INT8_MMA_DEFAULT_CHUNKS.get(backend, 1)
    v_decode = int8_mma_v_decode(prob, opts)
    nw = INT8_MMA_WARPS if warps is None else int(warps)
    if not 1 <= nw <= 8:
        raise AttentionError(f"warps must be 1..8, got {nw}")
    limit, ns0 = _int8_mma_limits(backend)

    def need(n_warps, t, n):
        return int8_mma_shared_bytes(prob, n_warps, t, n, v_decode)

    if warps is None:   # wide rows: fewer SIMD groups (a smaller merge area) where 4 do not fit
        while nw > 1 and need(nw, 16, 2) > limit:
            nw //= 2
    # CUDA: a staging area beyond the static limit goes to dynamic threadgroup memory (an explicit tile, e.g.
    # 128 keys for 4 SIMD groups of two chunks; or nothing static fits)
    dyn_limit = INT8_MMA_DYNAMIC_CUDA if backend == "cuda" else limit

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
            raise AttentionError(f"kernel 'int8-mma' with chunks={kc} takes a tile of a multiple of {16 * kc} keys up "
                                 f"to 256, got {tile}")
        got = stages_for(tl)
        if got is None:
            raise AttentionError(f"kernel 'int8-mma' with tile={tl} does not fit {dyn_limit} bytes of threadgroup "
                                 "memory")
        ns, dyn = got
    else:
        # the most keys in flight ((stages - 1) * tile) that fit in static memory; then the larger tile.
        # Dynamic memory only where nothing static fits: 4 SIMD groups of two chunks in 128-key tiles
        # (71 KB dynamic) measured slower than 2 groups in 64-key tiles (static) on the H200
        sizes = {(n, t): need(nw, t, n) for n in range(2, ns0 + 1)
                 for t in range(16 * kc, INT8_MMA_MAX_TILE + 1, 16 * kc)}
        fits = [(n, t, False) for (n, t), b in sizes.items() if b <= limit] \
            or [(n, t, True) for (n, t), b in sizes.items() if b <= dyn_limit]
        if not fits:
            raise AttentionError(f"kernel 'int8-mma' does not fit {limit} bytes of threadgroup memory for rows of "
                                 f"{prob.k_dim} / {prob.v_dim} values with {nw} SIMD groups")
        ns, tl, dyn = max(fits, key=lambda f: ((f[0] - 1) * f[1], f[1], not f[2]))
        # CUDA: a tile of 64 keys or more in a ring of INT8_MMA_AUTO_STAGES_CUDA where that fits static memory (a
        # whole tile still in flight while one is computed): the smaller staging area lets more threadgroups
        # share an SM, which measured faster than a deeper ring (64-key tiles; smaller ones keep their ring)
        if (backend == "cuda" and ns > INT8_MMA_AUTO_STAGES_CUDA and tl >= 64
                and sizes[INT8_MMA_AUTO_STAGES_CUDA, tl] <= limit):
            ns, dyn = INT8_MMA_AUTO_STAGES_CUDA, False
        # CUDA, where static memory holds only tiles below INT8_MMA_MAX_TILE keys (wide rows): that tile in
        # dynamic memory for INT8_MMA_WIDE_WARPS SIMD groups of one chunk
        if backend == "cuda" and kc_set is None and warps is None and tl < INT8_MMA_MAX_TILE and not dyn:
            nw_static, nw = nw, INT8_MMA_WIDE_WARPS
            got = stages_for(INT8_MMA_MAX_TILE)
            if got is not None:
                (ns, dyn), tl, kc = got, INT8_MMA_MAX_TILE, 1
            else:
                nw = nw_static
    if opts.dynamic_shared and backend != "metal":
        dyn = True   # the dynamic declaration also where static memory would do (the emulator runs it)
    # each SIMD group takes 16 * chunks keys of a tile per step: with chunks > 1, no more groups than a tile
    # has steps (one chunk per step keeps its plans: the emulator's 48-key tiles idle a group)
    if kc > 1 and 16 * kc * nw > tl:
        if warps is not None:
            raise AttentionError(f"kernel 'int8-mma' with {nw} SIMD groups of {16 * kc} keys per step leaves some idle "
                                 f"in a tile of {tl} keys; take at most {max(1, tl // (16 * kc))} or a larger tile")
        nw = max(1, tl // (16 * kc))
    l_used = max(max(prob.lengths), 1)
    heads = prob.batch * prob.kv_heads
    if splits is None:
        if backend == "cpu-emulator":
            splits = -(-l_used // EMU_SPLIT_KEYS)
        else:
            smem = need(nw, tl, ns)
            splits = max(1, min(-(-l_used // INT8_MMA_MIN_SPLIT_KEYS),
                                int8_mma_target_groups(opts, backend, l_used, heads, smem) // heads))
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
        stb = -(-int8_mma_stage_bytes(prob, nw, tl, ns) // 16) * 16
        dsmem = stb if backend != "cuda" else max(stb, DSMEM_MIN)
    return Plan(1, nw, splits, split_len, tl, "int8-mma", INT8_MMA_MAX_ROWS, ns, kc, dsmem, v_decode)


def resolve_kernel(prob: Problem, backend: str, kernel: "str | None", q_precision: "str | None") -> "str | None":
    """The pass-1 kernel for a call (None: the planner's choice of tiles or lanes): ``q_precision``
    "int8" is kernel int8-mma, "exact" kernels lanes / tiles; None takes the backend's default precision
    (:data:`~.decode_options.DEFAULT_Q_PRECISION`), int8 only where int8-mma serves the problem and V has
    fewer than 8 bits per value. ``kernel``: one of :data:`~.attention_problem.KERNELS` or None."""
    kernel = kernel_name(kernel)
    if q_precision is None:
        if kernel is not None:
            return kernel
        want = DEFAULT_Q_PRECISION.get(backend, "exact")
        if want == "int8" and prob.v_format.bits_per_value >= INT8_DEFAULT_MAX_V_BITS:
            want = "exact"
        return "int8-mma" if want == "int8" and int8_mma_refusal(prob) is None else None
    if q_precision == "int8":
        if kernel not in (None, "int8-mma"):
            raise AttentionError(f"q_precision='int8' is kernel 'int8-mma'; kernel={kernel!r} keeps q exact")
        why = int8_mma_refusal(prob)
        if why:
            raise AttentionError(f"q_precision='int8': {why}")
        return "int8-mma"
    if kernel == "int8-mma":
        raise AttentionError("kernel 'int8-mma' quantizes q to int8; q_precision='exact' takes kernel 'lanes' or "
                             "'tiles'")
    return kernel


@lru_cache(maxsize=256)
def plan_cached(prob: Problem, backend: str, splits, lanes_per_key, warps, tile, kernel, dyn,
                opts: DecodeOptions) -> Plan:
    """:func:`make_plan`, memoized per problem, backend, overrides and resolved options."""
    return make_plan(prob, backend, splits=splits, lanes_per_key=lanes_per_key, warps=warps, tile=tile,
                     kernel=kernel, dyn=dyn, options=opts)
