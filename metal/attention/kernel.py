"""The fused decode-attention kernel's entry points: one call, and the prepared decode launch.

:func:`kernel_attention` plans (:mod:`.attention_plan`), builds (:mod:`.attention_build`) and runs the
two passes on a backend: on the CPU SIMT emulator here, on a GPU through MLX's prepared launches
(:mod:`.attention_launch`). :func:`prepare_decode` gives the decode-step launch a cache layer reuses
every step (a :class:`~tqbridge.metal.attention.launch.DecodeLaunch` on a GPU; on the emulator, inside
:func:`tqbridge.metal.backend.emulate_decode_lane`, a stand-in running the same kernels). Both take a
:class:`~tqbridge.metal.decode_options.DecodeOptions`.
"""

from __future__ import annotations

import numpy as np

from .build import LAUNCHES, QTYPES, built, dyn_build, launch, pass1_params, static_params, tables
from .launch import DecodeLaunch, clear_caches as _clear_launches, launches, int8_mma_report
from .plan import COMBINE_THREADS, Plan, plan_cached, resolve_kernel
from .problem import (AttentionError, Problem, RunRecord, to_numpy, check_problem, last_run, record_run)
from ..backend import pick_backend
from ..decode_options import DecodeOptions, as_options

PLAN_OVERRIDES = ("splits", "lanes_per_key", "warps", "tile", "kernel")


def _run_emulator(q, kb, vb, prob: Problem, sinks, plan: Plan, qtype: int, seed=None, dyn=True, q_scale=None,
                  fold=None):
    """The two passes on the emulator: the output (rows, head dim) in q's element type. ``fold``: the decode
    step's append inside pass 1 (kernel int8-mma's TQA_FOLD build), ``(append, k_rows, v_rows, ap, flag_in, kcal)``
    as numpy (the rows as the kernel reads them, ``ap`` the append's parameters, ``kcal`` a calibrated append's
    buffer or None); kb / vb are written in place and the result is ``(out, flag)``."""
    split_s, comb_s, _, extra2 = static_params(prob, plan, qtype, dyn_build(prob, plan, dyn), q_scale is not None)
    if fold is not None:
        split_s = {**split_s, **fold[0].static, "TQA_FOLD": 1}
    if qtype == 2:  # bfloat16 exists only as MLX arrays: take the bits
        import mlx.core as mx

        qn = np.array(mx.view(q, mx.uint16))
    else:
        qn = to_numpy(q)
        if qtype == 1:
            qn = np.ascontiguousarray(qn).view(np.uint16)
    qn = np.ascontiguousarray(qn)
    rows = prob.batch * prob.q_heads * prob.rows
    np_ = plan.partials
    ip1 = np.array(pass1_params(prob, plan), np.int32)
    fp1 = np.array([prob.scale, prob.softcap], np.float32)
    tabs = tables(prob)
    sk = np.zeros(prob.q_heads, np.float32) if sinks is None else to_numpy(sinks).astype(np.float32).reshape(-1)
    k1 = built("cpu-emulator", 0, qtype, split_s, plan.kernel)
    kb = kb if fold is not None else np.ascontiguousarray(to_numpy(kb))   # a fold writes the caller's buffers
    vb = vb if fold is not None else np.ascontiguousarray(to_numpy(vb))
    ins = [qn, kb, vb, ip1, fp1, tabs, np.zeros(1, np.uint32)]
    shapes = [(rows, np_, prob.v_dim), (rows, np_, 2)]
    if q_scale is not None:
        ins.append(q_scale)
    if fold is not None:
        app, k_rows, v_rows, ap, flag_in, kcal = fold
        ins += [k_rows, v_rows, *app.device_tables, ap, flag_in, *(() if kcal is None else (kcal,))]
        shapes.append((app.flag_slots(int(ap[0])),))
    grid1 = (prob.batch * prob.kv_heads * plan.splits, 1, 1)
    po, pml, *flag = launch(k1, ins, shapes, grid1, 32 * plan.warps, seed=seed)
    ip2 = np.array([np_, prob.q_heads, int(sinks is not None), *extra2], np.int32)
    k2 = built("cpu-emulator", 1, qtype, comb_s)
    (out,) = launch(k2, [po, pml, ip2, sk, tabs], [(rows, prob.head_dim)], (rows, 1, 1), COMBINE_THREADS, seed=seed)
    return out if fold is None else (out, flag[0])


def _emulator_output(out: np.ndarray, prob: Problem, qtype: int, as_mlx: bool):
    """The emulator's output rows as the caller's result: q's shape and dtype, an MLX array for MLX callers
    (bfloat16 travels as its bits)."""
    shape = (prob.batch, prob.q_heads, prob.head_dim) if prob.squeeze_rows else (
        prob.batch, prob.q_heads, prob.rows, prob.head_dim)
    out = (out.view(np.float16) if qtype == 1 else out).reshape(shape)
    if not as_mlx:
        return out
    import mlx.core as mx

    return mx.array(out) if qtype != 2 else mx.view(mx.array(out), mx.bfloat16)


def _run_mlx(q, kb, vb, prob: Problem, sinks, plan: Plan, qtype: int, backend: str, dyn: bool, consts: bool,
             q_scale=None):
    import mlx.core as mx

    def as_mx(a):
        return a if isinstance(a, mx.array) else mx.array(np.ascontiguousarray(to_numpy(a)))

    run = launches(prob, plan, qtype, backend, sinks is not None, dyn, consts, q_scale is not None)
    return run(as_mx(q), as_mx(kb), as_mx(vb), None if sinks is None else as_mx(sinks),
               None if q_scale is None else mx.array(q_scale))


def _query_scale(q_scale, prob: Problem) -> np.ndarray:
    """``q_scale`` as pass 1's input ``qsc``: float32, the query heads x head dim values in order."""
    a = np.ascontiguousarray(to_numpy(q_scale), np.float32).reshape(-1)
    if a.size != prob.q_heads * prob.head_dim:
        raise AttentionError(f"q_scale has {a.size} values; q's heads x head dim are {prob.q_heads * prob.head_dim} "
                             f"(shape (Hq, D) or (1, Hq, 1, D))")
    return a


def kernel_attention(q, k_blocks, v_blocks, prob: Problem, sinks=None, *, backend: str = "auto",
                     splits: "int | None" = None, lanes_per_key: "int | None" = None, warps: "int | None" = None,
                     tile: "int | None" = None, kernel: "str | None" = None, seed: "int | None" = None,
                     generic: "bool | None" = None, q_precision: "str | None" = None,
                     options: "DecodeOptions | None" = None, q_scale=None):
    """Run the two kernel passes on ``backend`` and return the output shaped like q.

    ``generic``: build the format-generic variant (format constants in the parameter buffer: one
    build for every format pair). Default: yes on the emulator, no on a GPU (one specialised build
    per format pair, the fast one); ``generic=True`` on a GPU serves sweeps over many pairs.
    ``kernel``: the pass-1 kernel, "lanes", "tiles" or "int8-mma" (default: from q's precision; tiles when
    its threadgroup memory fits). ``options``: the
    decode options (``q_precision`` merges into them). ``q_scale``: a key-calibrated cache's channel
    scales s (Hq x D values: (Hq, D) or (1, Hq, 1, D)); pass 1 attends with q * s, made in float32 and
    rounded to q's dtype as it loads q (the same bits as q * s cast to q's dtype before the call).
    """
    bk = pick_backend("auto" if backend == "kernel" else backend)
    qdt = str(q.dtype).replace("mlx.core.", "")
    if qdt not in QTYPES:
        raise AttentionError(f"the attention kernel takes float32, float16 or bfloat16 q; got {qdt}")
    qtype = QTYPES[qdt]
    opts = as_options(options, q_precision).resolve(bk)
    if generic is None:
        generic = bk == "cpu-emulator"
    kernel = resolve_kernel(prob, bk, kernel, opts.q_precision)
    plan = plan_cached(prob, bk, splits, lanes_per_key, warps, tile, kernel, bool(generic), opts)
    qsc = None if q_scale is None else _query_scale(q_scale, prob)
    launches0 = LAUNCHES[0]
    if bk == "cpu-emulator":
        out = _emulator_output(_run_emulator(q, k_blocks, v_blocks, prob, sinks, plan, qtype, seed, generic, qsc),
                               prob, qtype, _is_mlx(q))
    else:
        out = _run_mlx(q, k_blocks, v_blocks, prob, sinks, plan, qtype, bk, dyn_build(prob, plan, generic),
                       opts.device_consts, qsc)
        if not _is_mlx(q):
            import mlx.core as mx

            mx.eval(out)
            out = to_numpy(out)
    record_run(RunRecord(
        backend=bk, dispatches=LAUNCHES[0] - launches0, kernel=plan.kernel, splits=plan.splits,
        lanes_per_key=plan.lanes_per_key, warps=plan.warps, tile=plan.tile,
        chain=plan.chain(max(prob.lengths)), q_precision=plan.q_precision, **int8_mma_report(plan)))
    return out


def _is_mlx(a) -> bool:
    mod = type(a).__module__
    return mod[:3] == "mlx"


# The process's prepared decode launches, keyed by what a launch depends on: the shapes and dtypes of q
# and the buffers (the capacity, not the length: the length is a launch parameter), the formats, scale,
# window, softcap, sinks, rotation, backend and options. Cache layers of one geometry share a launch,
# and decode_attention's repeated calls with a growing length reuse one. None where no launch applies.
_PREPARED: dict = {}
_PREPARED_LIMIT = 1024


def prepare_decode(q, k_blocks, v_blocks, *, k_format, v_format, scale=None, window=None, softcap=None,
                   sinks=None, rotation=None, backend: str = "auto", q_precision: "str | None" = None,
                   options: "DecodeOptions | None" = None):
    """The :class:`~tqbridge.metal.attention.launch.DecodeLaunch` for MLX arrays shaped like these on a
    GPU backend (one per signature, shared in the process); the emulator's stand-in where ``backend``
    is "cpu-emulator" and q an MLX array; else None (the caller then takes
    :func:`tqbridge.metal.decode_attention`)."""
    opts = as_options(options, q_precision)
    key = (tuple(q.shape), str(q.dtype), type(q), tuple(k_blocks.shape), tuple(v_blocks.shape), str(k_blocks.dtype),
           k_format, v_format, scale, window, softcap, None if sinks is None else tuple(sinks.shape), rotation,
           backend, opts)
    try:
        return _PREPARED[key]
    except KeyError:
        pass
    launch = _prepare(q, k_blocks, v_blocks, k_format, v_format, scale, window, softcap, sinks, rotation, backend, opts)
    if len(_PREPARED) >= _PREPARED_LIMIT:
        _PREPARED.clear()
    _PREPARED[key] = launch
    return launch


def _prepare(q, k_blocks, v_blocks, k_format, v_format, scale, window, softcap, sinks, rotation, backend, opts):
    bk = pick_backend("auto" if backend == "kernel" else backend)
    if bk == "cpu-emulator" and backend == "cpu-emulator" and _is_mlx(q):
        return _EmulatedDecodeLaunch(k_blocks, k_format, v_format, scale, window, softcap, rotation, opts)
    if bk not in ("cuda", "metal") or not _is_mlx(q):
        return None
    qdt = str(q.dtype).replace("mlx.core.", "")
    if qdt not in QTYPES:
        return None
    prob = check_problem(q, k_blocks, v_blocks, k_format=k_format, v_format=v_format,
                         length=int(k_blocks.shape[2]), scale=scale, window=window, softcap=softcap,
                         sinks=sinks, rotation=rotation)
    return DecodeLaunch(prob, bk, QTYPES[qdt], opts.resolve(bk))


def prepared_launches() -> list:
    """The prepared launches in the process (None entries excluded): what :func:`prepare_decode` built."""
    return [v for v in _PREPARED.values() if v is not None]


def clear_launch_caches() -> None:
    """Forget every plan, prepared launch and kernel setup (e.g. after editing a kernel source)."""
    _PREPARED.clear()
    plan_cached.cache_clear()
    _clear_launches()


class _EmulatedDecodeLaunch:
    """A :class:`~tqbridge.metal.attention.launch.DecodeLaunch` stand-in running the same kernels on the
    CPU emulator over MLX arrays (synchronises): the GPU decode lane's logic under test on machines
    without a GPU."""

    backend = "cpu-emulator"

    def __init__(self, k_blocks, k_format, v_format, scale, window, softcap, rotation, opts: DecodeOptions):
        self.l_max = int(k_blocks.shape[2])
        self._kw = dict(k_format=k_format, v_format=v_format, scale=scale, window=window, softcap=softcap,
                        rotation=rotation)
        self.options = opts.resolve(self.backend)
        self.fuses_append = self.options.defer_append
        self.run_info = {"backend": self.backend}   # what its latest call ran (a DecodeLaunch's is its plan)

    def with_append(self, append, k_rows, v_rows, q, kb, vb, pos: int, flag_in, length: int, q_scale=None,
                    starts=None):
        """:meth:`DecodeLaunch.with_append`'s contract: the append, then this attention (two calls here), or
        both in one pass 1 where the options fold them and a decode launch would (:func:`.launch.fold_refusal`)."""
        why = None
        if self.options.fold_append:
            got = self._folded(append, k_rows, v_rows, q, kb, vb, pos, flag_in, length, q_scale) if starts is None \
                else "the emulated lane folds steps without left padding only"
            if not isinstance(got, str):
                return got
            why = got
        flag = append(k_rows, v_rows, kb, vb, pos, flag_in)
        out = self(q, kb, vb, length, after=flag, q_scale=q_scale, starts=starts)
        if why is not None:
            self.run_info["fold_refused"] = why
        return flag, out

    def _folded(self, append, k_rows, v_rows, q, kb, vb, pos: int, flag_in, length: int, q_scale=None):
        """The folded step on the emulator, planned as a decode launch plans it (for the whole buffer); where
        that plan refuses the fold, why (:func:`.launch.fold_refusal`)."""
        import mlx.core as mx

        from .launch import fold_refusal

        mx.eval(q, kb, vb, k_rows, v_rows, flag_in, *([] if q_scale is None else [q_scale]))
        whole = check_problem(q, kb, vb, length=self.l_max, **self._kw)
        plan = plan_cached(whole, self.backend, None, None, None, None,
                           resolve_kernel(whole, self.backend, None, self.options.q_precision), False, self.options)
        why = fold_refusal(plan, self.l_max, append, int(kb.shape[-1]), int(vb.shape[-1]), self.backend)
        if why is not None:
            return why
        step = check_problem(q, kb, vb, length=length, **self._kw)
        qdt = str(q.dtype).replace("mlx.core.", "")
        rows = [np.array(mx.view(r, mx.uint16)) if append.static["QA_SRC"] else np.array(r) for r in (k_rows, v_rows)]
        B, H, S = (int(x) for x in k_rows.shape[:3])
        ap = np.array([B * H * S, S, self.l_max, pos, H, int(flag_in.shape[0])], np.uint32)
        # numpy views of the MLX buffers' memory: the kernel writes the step's rows there, as on a GPU
        kcal = getattr(append, "kcal", None)
        out, flag = _run_emulator(q, np.asarray(kb), np.asarray(vb), step, None, plan, QTYPES[qdt], None, False,
                                  None if q_scale is None else _query_scale(q_scale, step),
                                  (append, rows[0].reshape(-1), rows[1].reshape(-1), ap, np.array(flag_in),
                                   None if kcal is None else np.array(kcal, np.float32).reshape(-1)))
        self.run_info = {"backend": self.backend, "kernel": plan.kernel, "splits": plan.splits, "fold_append": True}
        return mx.array(flag), _emulator_output(out, step, QTYPES[qdt], True)

    def __call__(self, q, kb, vb, length: int, after=None, sinks=None, q_scale=None, starts=None):
        """:meth:`DecodeLaunch.__call__`'s contract: q in its own dtype (the kernels of that dtype), the
        channel scales ``q_scale`` multiplied in by pass 1, ``starts`` each batch row's first visible key."""
        import mlx.core as mx

        mx.eval(q, kb, vb, *([] if after is None else [after]), *([] if q_scale is None else [q_scale]))
        out = self._attend(q, np.array(kb), np.array(vb), length, None if sinks is None else np.array(sinks),
                           q_scale, starts)
        self.run_info = last_run()
        return out

    def _attend(self, q, kb, vb, length: int, sinks, q_scale, starts=None):
        """``decode_attention(..., backend="cpu-emulator")`` on the MLX q and numpy blocks (the output an
        MLX array of q's dtype): the problem validated, the two kernel passes on the emulator (recorded
        as the thread's last run)."""
        prob = check_problem(q, kb, vb, length=length, sinks=sinks, start=0 if starts is None else starts,
                             **self._kw)
        return kernel_attention(q, kb, vb, prob, sinks, backend="cpu-emulator", options=self.options,
                                q_scale=q_scale)
