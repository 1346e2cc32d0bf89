"""The fused decode attention's MLX launches (CUDA / Metal): prepared once per call signature, replayed.

:class:`Launches` holds every buffer of one call (kernels, constants, launch geometry) and issues pass
1 and the combine pass; :class:`DecodeLaunch` serves decode steps over cache buffers of one geometry,
the length a runtime parameter. How they run (``mx.compile``, per-step integers as views of a device
table, constants copied to the device, the append fused into the call) follows the resolved
:class:`~tqbridge.metal.decode_options.DecodeOptions` they were made with.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import numpy as np

from .build import built, launch, param_head, static_params, tables
from .plan import COMBINE_THREADS, Plan, plan_cached, resolve_kernel
from .problem import AttentionError, Problem, check_starts
from ..decode_options import DecodeOptions

MIN_CONST_BYTES = 16   # > MLX's CUDA allocator's 8-byte small-buffer limit (allocator.cpp, small_block_size)


def const_buffer(values, device: bool) -> Any:
    """The MLX array of a launch's constant input ``values`` (numpy). ``device`` (the options'
    ``device_consts``): a 1-D buffer zero-padded to :data:`MIN_CONST_BYTES` (kernels read the leading
    values only) and copied once by a device kernel, so it lives in device memory, not in MLX's small
    pool of unified memory that the CPU writes and the GPU reads through a mapping (scheduled here with
    ``mx.async_eval``, once per prepared launch: no host synchronisation, and replayed launches do not
    re-run the copy); else the array made from host data."""
    import mlx.core as mx

    a = np.ascontiguousarray(values)
    if not device:
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


@lru_cache(maxsize=256)
def _mlx_setup(shape_prob: Problem, shape_plan: Plan, qtype: int, backend: str, dyn: bool, consts: bool,
               qscale: bool = False):
    """Kernels and constant buffers of one call signature (lengths and splits left out); ``qscale``:
    pass 1 built to multiply q by the input ``qsc``."""
    split_s, comb_s, extra1, extra2 = static_params(shape_prob, shape_plan, qtype, dyn, qscale)
    fp1 = const_buffer(np.array([shape_prob.scale, shape_prob.softcap], np.float32), consts)
    tabs = const_buffer(tables(shape_prob), consts)
    # constants already evaluated (host data, or const_buffer's scheduled device copy: no pending
    # primitive, no host sync): a lazy mx.zeros here would be part of every mx.compile replay of the
    # launches (an extra fill kernel per call), and evaluating it with mx.eval would be a host sync in
    # a decode step
    zero_sinks = const_buffer(np.zeros((shape_prob.q_heads,), np.float32), consts)
    k1 = built(backend, 0, qtype, split_s, shape_plan.kernel)
    k2 = built(backend, 1, qtype, comb_s)
    return k1, k2, fp1, tabs, zero_sinks, tuple(extra1), tuple(extra2)


@lru_cache(maxsize=4)
def _no_dep(consts: bool):
    # evaluated (host data, or const_buffer's device copy): no primitive for mx.compile to replay
    return const_buffer(np.zeros((1,), np.uint32), consts)


@lru_cache(maxsize=1024)
def _int_buffer(values: tuple, consts: bool):
    """An int32 parameter buffer, made once per distinct content."""
    return const_buffer(np.array(values, np.int32), consts)


class Launches:
    """The launches of one call (signature, plan and lengths fixed), every buffer prepared: what a
    decoding loop repeats. Called with MLX arrays; q and the output keep q's dtype (the kernels view
    fp16 / bf16 as bits). :meth:`launch` is the one place that issues them (DecodeLaunch too). With
    ``qscale`` pass 1 takes one more input, ``qsc``: the keys' channel scales (float32, Hq x D values)
    it multiplies q by as it loads it."""

    __slots__ = ("k1", "k2", "fp1", "tabs", "zero_sinks", "ip1", "ip2", "out1", "grid1", "tg1", "shape", "grid2",
                 "no_dep", "qscale", "_compiled")

    def __call__(self, q, kb, vb, sinks, qsc=None):
        return self.launch(q, kb, vb, sinks, self.ip1, self.no_dep, qsc)

    def compiled(self, has_sinks: bool):
        """:meth:`launch` under ``mx.compile`` (``(q, kb, vb, ip1, dep[, sinks][, qsc])``, ``qsc`` with
        ``qscale``): traced once, then each call replays the traced custom-kernel primitives, so MLX's
        per-call Python binding and kernel source assembly drop out."""
        import mlx.core as mx

        fns = self._compiled
        if fns is None:
            def plain(q, kb, vb, ip1, dep, *qsc):
                return self.launch(q, kb, vb, None, ip1, dep, *qsc)

            def with_sinks(q, kb, vb, ip1, dep, sinks, *qsc):
                return self.launch(q, kb, vb, sinks, ip1, dep, *qsc)
            fns = self._compiled = (mx.compile(plain), mx.compile(with_sinks))
        return fns[1] if has_sinks else fns[0]

    def launch(self, q, kb, vb, sinks, ip1, dep, qsc=None):
        """Pass 1 (with ``ip1``: its int parameters, ``dep``: the array it must run after, ``qsc``: the
        channel scales of a ``qscale`` build, else None) and the combine pass."""
        import mlx.core as mx

        if (qsc is None) == self.qscale:
            raise AttentionError("the channel scales q is multiplied by go with a pass 1 built for them "
                                 f"(this one: qscale={self.qscale})")
        sk = self.zero_sinks if sinks is None else sinks.astype(mx.float32).reshape(-1)
        po, pml = launch(self.k1, inputs=[q, kb, vb, ip1, self.fp1, self.tabs, dep, *(() if qsc is None else (qsc,))],
                         output_shapes=self.out1, output_dtypes=[mx.float32, mx.float32], grid=self.grid1,
                         threadgroup=self.tg1)
        return self.combine(po, pml, sk, q.dtype)

    def combine(self, po, pml, sk, dtype):
        """The combine pass over pass 1's partials (``sk``: the sinks, float32)."""
        (out,) = launch(self.k2, inputs=[po, pml, self.ip2, sk, self.tabs], output_shapes=self.shape,
                        output_dtypes=[dtype], grid=self.grid2, threadgroup=(COMBINE_THREADS, 1, 1))
        return out

    def launch_folded(self, k1f, append, q, kb, vb, ip1, k_rows, v_rows, params, flag_in, qsc=None):
        """Pass 1 with the decode step's append folded in (``k1f``: :func:`folded_pass1`'s build for
        ``append``, a :class:`~tqbridge.metal.kv_append.KVAppend` or a calibrated one; ``params`` its step
        parameters; ``qsc`` as in :meth:`launch`), then the combine pass: ``(flag, out)``, as the append and
        :meth:`launch` give them."""
        import mlx.core as mx

        if (qsc is None) == self.qscale:
            raise AttentionError("the channel scales q is multiplied by go with a pass 1 built for them "
                                 f"(this one: qscale={self.qscale})")
        B, H, S = k_rows.shape[:3]
        kt, vt = append.device_tables
        kcal = getattr(append, "kcal", None)
        po, pml, flag = launch(k1f, inputs=[q, kb, vb, ip1, self.fp1, self.tabs, flag_in, *(() if qsc is None else (qsc,)),
                                            k_rows, v_rows, kt, vt, params, flag_in, *(() if kcal is None else (kcal,))],
                               output_shapes=self.out1 + [(append.flag_slots(B * H * S),)],
                               output_dtypes=[mx.float32, mx.float32, mx.uint32], grid=self.grid1, threadgroup=self.tg1)
        return flag, self.combine(po, pml, self.zero_sinks, q.dtype)


@lru_cache(maxsize=64)
def folded_pass1(shape_prob: Problem, shape_plan: Plan, qtype: int, backend: str, append_static: tuple,
                 qscale: bool = False):
    """Kernel int8-mma's pass 1 with the append folded in (static ``TQA_FOLD``), built for one call signature
    (:func:`_mlx_setup`'s) and one append's static parameters (``append_static``: its items, sorted);
    ``qscale``: the build that multiplies q by the keys' channel scales."""
    split_s = static_params(shape_prob, shape_plan, qtype, False, qscale)[0]
    return built(backend, 0, qtype, {**split_s, **dict(append_static), "TQA_FOLD": 1}, shape_plan.kernel)


def fold_refusal(plan: Plan, l_max: int, append, k_row_bytes: int, v_row_bytes: int, backend: str) -> "str | None":
    """Why the decode step's ``append`` cannot run inside this plan's pass 1 (None: it can): the kernel must be
    int8-mma, the append a (calibrated or plain) KVAppend of this backend writing rows of the buffers' width, and the
    splits must cover the buffer in even lengths (a split's tiles start at even rows: it reads no row of the
    split before it, so no threadgroup reads a row another one writes)."""
    if plan.kernel != "int8-mma":
        return f"pass 1 runs kernel {plan.kernel}, not int8-mma"
    if not hasattr(append, "static"):
        return f"the append is a {type(append).__name__}, not a prepared KVAppend"
    if append.backend != backend:
        return f"the append runs on {append.backend}, the attention on {backend}"
    if (append.k_row_bytes, append.v_row_bytes) != (k_row_bytes, v_row_bytes):
        return "the append writes rows of another width than the buffers'"
    if plan.split_len % 2 or plan.splits * plan.split_len < l_max:
        return f"the plan's {plan.splits} splits of {plan.split_len} rows do not cover {l_max} rows in even lengths"
    return None


@lru_cache(maxsize=1024)
def launches(prob: Problem, plan: Plan, qtype: int, backend: str, has_sinks: bool, dyn: bool = False,
             consts: bool = False, qscale: bool = False) -> Launches:
    """Kernels, constant buffers and launch geometry of one call (lengths included): one lookup.
    ``consts``: constants copied to the device (the options' ``device_consts``); ``qscale``: pass 1
    takes q's channel scales (:class:`Launches`)."""
    shape_prob = dataclasses.replace(prob, lengths=(), starts=())
    shape_plan = dataclasses.replace(plan, splits=0, split_len=0)
    f = Launches()
    f._compiled = None
    f.qscale = qscale
    f.k1, f.k2, f.fp1, f.tabs, f.zero_sinks, extra1, extra2 = _mlx_setup(shape_prob, shape_plan, qtype, backend,
                                                                         dyn, consts, qscale)
    f.no_dep = _no_dep(consts)
    f.ip1 = _int_buffer((prob.l_max, plan.split_len, plan.splits, prob.window, prob.kv_heads, *extra1,
                         *prob.lengths, *prob.row_starts), consts)
    f.ip2 = _int_buffer((plan.partials, prob.q_heads, int(has_sinks), *extra2), consts)
    rows = prob.batch * prob.q_heads * prob.rows
    f.out1 = [(rows, plan.partials, prob.v_dim), (rows, plan.partials, 2)]
    f.grid1 = (prob.batch * prob.kv_heads * plan.splits * 32 * plan.warps, 1, 1)
    f.tg1 = (32 * plan.warps, 1, 1)
    f.shape = [(prob.batch, prob.q_heads, prob.head_dim) if prob.squeeze_rows else
               (prob.batch, prob.q_heads, prob.rows, prob.head_dim)]
    f.grid2 = (rows * COMBINE_THREADS, 1, 1)
    return f


def int8_mma_report(plan: Plan) -> dict:
    """What a run record and ``run_info`` say of an int8-mma build (None for the other kernels)."""
    mma = plan.kernel == "int8-mma"
    return dict(v_decode=plan.v_decode if mma else None, chunks=plan.chunks if mma else None,
                stages=plan.stages if mma else None, dyn_smem=plan.dyn_smem if mma else None)


class DecodeLaunch:
    """The fused attention of decode steps over cache buffers of one geometry (capacity included),
    shared by every layer of that geometry: the launch plan is made for a full buffer, and the
    length — which grows every step — travels in the parameter buffer, made once per length for all
    layers. A decoding loop reuses the same two launches for every step until the buffers grow.
    ``after``: an array the kernel must run after (the in-place append's flag), so it reads the rows
    that append wrote. ``q_scale`` (a key-calibrated cache's channel scales, :meth:`__call__`): pass 1
    multiplies q by them as it loads it, so a calibrated step runs the same kernels as another.
    ``opts``: resolved for ``backend``."""

    def __init__(self, prob: Problem, backend: str, qtype: int, opts: DecodeOptions):
        self.backend = backend
        self._prob, self._qtype = prob, qtype
        self.options = opts
        plan = plan_cached(prob, backend, None, None, None, None,
                           resolve_kernel(prob, backend, None, opts.q_precision), False, opts)
        self.plan = plan
        self._head = [int(x) for x in param_head(prob, plan)]
        self.l_max = prob.l_max
        self.batch = prob.batch
        self._ip1: dict = {}
        self.compiled = opts.compile
        self._tables: dict = {}   # starts -> the device table of pass-1 parameters (device_params)
        self.device_params = opts.device_params
        self.run_info = dict(backend=backend, dispatches=plan.dispatches, kernel=plan.kernel, splits=plan.splits,
                             warps=plan.warps, tile=plan.tile, lanes_per_key=plan.lanes_per_key,
                             chain=plan.chain(prob.l_max), q_precision=plan.q_precision, **int8_mma_report(plan),
                             compiled=opts.compile, device_params=opts.device_params,
                             device_consts=opts.device_consts)
        # the prepared launches (pass 1 with q's channel scales: made at the first call that brings them);
        # this class adds the per-length parameter buffer
        self._run = launches(prob, plan, qtype, backend, prob.has_sinks, False, opts.device_consts)
        self._run_scaled = None
        self._qsc_size = prob.q_heads * prob.head_dim
        self.fuses_append = opts.defer_append
        self._with_append: dict = {}   # (prepared append, q_scale given) -> the compiled append + attention
        self.run_info["fold_append"] = False   # whether the latest step with an append ran it inside pass 1

    def ip1(self, length: int, starts: "tuple[int, ...] | None" = None):
        """The pass-1 int parameters for ``length`` and ``starts`` (each batch row's first visible key: its
        left padding; None: all 0), one array per (length, starts), shared by the layers. The device
        table (``device_params``) is made once per ``starts``: a new batch composition, not a step."""
        key = length if starts is None else (length, starts)
        buf = self._ip1.get(key)
        if buf is None:
            if not 0 <= length <= self.l_max:
                raise AttentionError(f"length {length} is outside 0..{self.l_max} (the cache's L_max)")
            st = (0,) * self.batch if starts is None else check_starts(starts, (length,) * self.batch)
            import mlx.core as mx

            if len(self._ip1) > 64:
                self._ip1.clear()
            if self.device_params:   # a view of the device table: neither a host allocation nor a kernel
                table = self._tables.get(st)
                if table is None:
                    if len(self._tables) >= 4:
                        self._tables.clear()
                    table = self._tables[st] = param_table(self._head, self.l_max + 1, self.batch, np.int32,
                                                           after=list(st))
                buf = self._ip1[key] = table_row(table, length)
            else:
                buf = self._ip1[key] = mx.array(np.array(self._head + [length] * self.batch + list(st), np.int32))
        return buf

    def _launches(self, q_scale) -> Launches:
        """The prepared launches for ``q_scale`` (None: the plain pass 1; else the one taking it, whose
        Hq x D values it checks)."""
        if q_scale is None:
            return self._run
        if q_scale.size != self._qsc_size:
            raise AttentionError(f"q_scale has {q_scale.size} values; the query heads x head dim are "
                                 f"{self._qsc_size}")
        run = self._run_scaled
        if run is None:
            run = self._run_scaled = launches(self._prob, self.plan, self._qtype, self.backend, self._prob.has_sinks,
                                              False, self.options.device_consts, True)
        return run

    def __call__(self, q, kb, vb, length: int, after=None, sinks=None, q_scale=None, starts=None):
        """The attention of q over the buffers at ``length``, after ``after``. ``q_scale``: a key-calibrated
        cache's channel scales (float32, Hq x D values in q's head order, e.g. shaped (1, Hq, 1, D)):
        the kernel attends with q * s, made in float32 and rounded to q's dtype as it loads q. ``starts``:
        a tuple, each batch row's first visible key (its left padding; None: 0), a parameter like ``length``."""
        run = self._launches(q_scale)
        dep = run.no_dep if after is None else after
        ip1 = self.ip1(length, starts)
        qsc = () if q_scale is None else (q_scale,)
        if self.compiled:
            fn = run.compiled(sinks is not None)
            return fn(q, kb, vb, ip1, dep, *qsc) if sinks is None else fn(q, kb, vb, ip1, dep, sinks, *qsc)
        return run.launch(q, kb, vb, sinks, ip1, dep, *qsc)

    def with_append(self, append, k_rows, v_rows, q, kb, vb, pos: int, flag_in, length: int, q_scale=None,
                    starts=None):
        """The decode step's in-place append of ``k_rows`` / ``v_rows`` at row ``pos`` (``append``: the
        cache's prepared :class:`~tqbridge.metal.kv_append.KVAppend`, ``flag_in`` its flag) and then this
        attention at ``length``, ordered after it by the append's flag: ``(flag, out)``. ``q_scale`` and
        ``starts`` as in :meth:`__call__`. Compiled launches trace it all as one function: one
        replay of three kernels per layer, with or without ``q_scale``; two where the options fold the append
        into pass 1 and :func:`fold_refusal` finds nothing against it (``run_info["fold_append"]``)."""
        key = (append, q_scale is not None)
        got = self._with_append.get(key)
        run = self._launches(q_scale)
        if got is None:
            import mlx.core as mx

            why = "off in the decode options" if not self.options.fold_append \
                else fold_refusal(self.plan, self.l_max, append, kb.shape[-1], vb.shape[-1], self.backend)
            if why is None:   # one pass 1 that appends too, then the combine: two kernels
                k1f = folded_pass1(dataclasses.replace(self._prob, lengths=(), starts=()),
                                   dataclasses.replace(self.plan, splits=0, split_len=0), self._qtype, self.backend,
                                   tuple(sorted(append.static.items())), q_scale is not None)

                def both(k_rows, v_rows, q, kb, vb, params, flag_in, ip1, *qsc):
                    return run.launch_folded(k1f, append, q, kb, vb, ip1, k_rows, v_rows, params, flag_in, *qsc)
            else:
                def both(k_rows, v_rows, q, kb, vb, params, flag_in, ip1, *qsc):
                    flag = append.launch(k_rows, v_rows, kb, vb, params, flag_in)
                    return flag, run.launch(q, kb, vb, None, ip1, flag, *qsc)
            got = self._with_append[key] = (mx.compile(both) if self.compiled else both, why)
        fn, why = got
        self.run_info["fold_append"] = why is None
        if self.options.fold_append and why is not None:
            self.run_info["fold_refused"] = why
        else:
            self.run_info.pop("fold_refused", None)
        return fn(k_rows, v_rows, q, kb, vb, append.step_params(k_rows, kb, pos, flag_in), flag_in, self.ip1(length, starts),
                  *(() if q_scale is None else (q_scale,)))


def clear_caches() -> None:
    """Forget every prepared launch and kernel setup of this module."""
    for f in (launches, _mlx_setup, _no_dep, _int_buffer, folded_pass1):
        f.cache_clear()
