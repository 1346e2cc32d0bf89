"""The GPU decode lane on a real model, run on the CPU emulator (``tqbridge parity --levels lane``).

On a GPU, :class:`~tqbridge.metal.lm.cache.TQCache` serves a decode step through its own lane: an
in-place append kernel writes the step's rows into the cache buffers, a device copy grows the buffers
and slides a window (``kv_append.relocate``), and the prepared fused attention reads the buffers with
a runtime length (``offset - start``). Every other level runs TQCache's ops path on a CPU, so none of
that bookkeeping runs there. This level runs it: :func:`tqbridge.metal.backend.emulate_decode_lane` on MLX's CPU
device sends the same code through the same kernels, executed by the CPU SIMT emulator over the MLX
buffers (``_EmulatedDecodeLaunch`` for the attention). The report names that path. It does so on a
GPU machine too (MLX's CPU device for the run): the lane's logic is what is judged here; the GPU's
own kernels are held to the same lane by the ``gpu`` tests of ``tests/test_decode_step.py``.

Setup (stated in every report, because it is not the model as trained):

- **A small window, forced.** SmolLM2 has no sliding window, and Gemma 3's (512) would need more than
  512 + 256 tokens before its first slide. So the layers the model windows (Gemma 3: 15 of 18) get a
  window of ``LANE_WINDOW`` = 16 positions instead, and a model without any window gets it on its
  even layers (SmolLM2: 15 of 30); the other layers keep full attention, so both kinds of lane run.
  ``TQCache.step`` is set to ``LANE_STEP`` = 4 on these caches, so windows slide and buffers grow every
  few steps.
- **Tokens.** A prompt of ``LANE_WINDOW`` tokens (so the forced window does not change the prefill,
  whose mask mlx-lm's model code builds from one layer's cache), then ``LANE_DECODE`` = 12 decode
  steps fed the text's next tokens (teacher forcing: the same tokens whatever the lane computes): each
  windowed layer slides 3 times, every layer's buffers are relocated at least 3 times. Cost: SmolLM2
  ~7 s on 2 cores (model load included), Gemma 3 ~17 s.

Claims, per layer and per decode step. Each layer is judged on the rows and the q it was given, so
nothing cascades between layers, and the only allowance is the oracle's derived float32 bound:

1. **path**: the step's attention ran the emulated lane (``decode:cpu-emulator``) and the cache's
   appends the in-place append kernel (``kv-append:cpu-emulator``);
2. **bytes**: the lane's buffers hold, for the positions it says it stores (``[start, offset)``),
   exactly the blocks :func:`tqbridge.metal.kv_append.reference_append` (the append kernel's numpy
   statement, byte for byte) gives for the K/V rows the layer appended, and they include every key the
   step's query sees (``start`` at most the first visible position);
3. **attention**: the lane's output is within the float64 oracle's error bound
   (:func:`tqbridge.metal.attention.ref.oracle`, the attention level's claim) computed over those
   reference blocks with the layer's window and the accumulation chain the kernel reports.

And the setup must have exercised the bookkeeping: at least one slide on every windowed layer and one
relocation on every layer, or the level fails as "not exercised". A layer is judged until its first
failure, which the report keeps (claim, decode step, offset, start); a layer given NaN/inf rows or q
by a failure upstream fails as "finite inputs", and an exception from the code under test is a
failure with its message, not a crash of the level.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np


LANE_WINDOW = 16     # forced sliding window (positions) of the windowed layers
LANE_STEP = 4        # TQCache.step of the level's caches: a slide / growth every 4 positions
LANE_DECODE = 12     # decode steps after a LANE_WINDOW-token prompt: 3 slides of each window
LANE_TOKENS = LANE_WINDOW + LANE_DECODE

PATH = "emulated GPU lane (emulate_decode_lane): in-place append, device relocation and " \
       "prepared fused attention on the CPU SIMT emulator"


@contextmanager
def emulated_lane():
    """MLX's CPU device and :func:`tqbridge.metal.backend.emulate_decode_lane` while the block runs (both
    restored): TQCaches made inside it take the GPU decode lane with its kernels on the CPU emulator."""
    import mlx.core as mx

    from tqbridge.metal.backend import emulate_decode_lane

    prev_dev = mx.default_device()
    with emulate_decode_lane():
        mx.set_default_device(mx.cpu)
        try:
            yield
        finally:
            mx.set_default_device(prev_dev)


@contextmanager
def _observed(observe: Callable):
    """Inside :func:`tqbridge.metal.lm.routing.route_attention`: call ``observe(cache, queries, out, scale,
    paths_before)`` after every routed attention call of a TQCache layer (the routed entry point is
    wrapped where route_attention installed it, and put back on exit)."""
    from mlx_lm.models import base

    from tqbridge.metal.lm.cache import TQCache

    routed = base.scaled_dot_product_attention
    if getattr(routed, "__wrapped__", None) is None:
        raise RuntimeError("the lane level observes the routed attention: enter route_attention first")

    def observed(queries, keys, values, cache, scale, mask, sinks=None):
        before = Counter(cache.paths) if isinstance(cache, TQCache) else None
        out = routed(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        if before is not None:
            observe(cache, queries, out, scale, before)
        return out

    mods = [m for name, m in list(sys.modules.items())
            if (name == "mlx_lm.models" or name.startswith("mlx_lm.models.")) and m is not None
            and getattr(m, "scaled_dot_product_attention", None) is routed]
    for m in mods:
        m.scaled_dot_product_attention = observed
    try:
        yield
    finally:
        for m in mods:
            if m.scaled_dot_product_attention is observed:
                m.scaled_dot_product_attention = routed


def lane_windows(model_windows: "list[int | None]", window: int = LANE_WINDOW) -> "list[int | None]":
    """The level's window per layer: ``window`` where the model has one, else None; a model with no
    windowed layer gets ``window`` on its even layers."""
    if any(model_windows):
        return [window if w else None for w in model_windows]
    return [window if i % 2 == 0 else None for i in range(len(model_windows))]


def _finite(x: float) -> "float | None":
    """JSON has no infinity: a non-finite ratio (NaN/inf output) is written as null."""
    return float(x) if np.isfinite(x) else None


class _Layer:
    """What one layer was given and what its lane did, judged step by step."""

    def __init__(self, index: int, cache, window: "int | None"):
        self.index, self.cache, self.window = index, cache, window
        self.k: list = []                   # float32 rows appended, (B, Hkv, S, D) per call
        self.v: list = []
        self.kb = self.vb = None            # reference blocks of every position so far
        self.steps = 0
        self.paths: Counter = Counter()
        self.worst = 0.0
        self.failure: "dict | None" = None
        self.slides = self.relocations = 0
        self._geometry = None               # (start, capacity) after the last step

    def record_rows(self) -> None:
        import mlx.core as mx

        real = self.cache.update_and_fetch

        def update_and_fetch(keys, values):
            self.k.append(np.array(keys.astype(mx.float32)))
            self.v.append(np.array(values.astype(mx.float32)))
            return real(keys, values)

        self.cache.update_and_fetch = update_and_fetch   # this instance only

    def _reference_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        from tqbridge.metal.codecs import padded_dim
        from tqbridge.metal.kv_append import reference_append

        c = self.cache
        have = 0 if self.kb is None else self.kb.shape[2]
        k_new = np.concatenate(self.k, axis=2)[:, :, have:]
        v_new = np.concatenate(self.v, axis=2)[:, :, have:]
        kb = reference_append(c.k_format, k_new, padded_dim(c.k_format, c.k_dim), c.k_rot)
        vb = reference_append(c.v_format, v_new, padded_dim(c.v_format, c.v_dim), c.v_rot)
        self.kb = kb if self.kb is None else np.concatenate([self.kb, kb], axis=2)
        self.vb = vb if self.vb is None else np.concatenate([self.vb, vb], axis=2)
        return self.kb, self.vb

    def _fail(self, what: str, **info) -> None:
        if self.failure is None:
            self.failure = {"step": self.steps, "offset": self.cache.offset, "start": self.cache.start,
                            "claim": what, **info}

    def note_geometry(self) -> None:
        """Where the buffers stand after a prompt chunk (the first decode step compares with it)."""
        self._geometry = (self.cache.start, int(self.cache.keys.shape[2]))

    def judge_step(self, queries, out, scale: float, before: Counter) -> None:
        """The three claims on one decode step of this layer (called right after its attention)."""
        import mlx.core as mx

        from tqbridge.metal import attention

        c = self.cache
        run = attention.last_run() or {}
        self.steps += 1
        taken = [k for k in c.paths if k != "append" and c.paths[k] > before.get(k, 0)]
        self.paths.update(taken)
        if taken != ["decode:cpu-emulator"]:
            self._fail("path", paths=taken)
        geometry = (c.start, int(c.keys.shape[2]))
        if self._geometry is not None and geometry != self._geometry:
            self.relocations += 1
            self.slides += geometry[0] > self._geometry[0]
        self._geometry = geometry
        if self.failure is not None:
            return                          # judged once; what follows a failure has no reference
        if not all(np.isfinite(x).all() for x in (self.k[-1], self.v[-1], np.array(queries.astype(mx.float32)))):
            # a failure upstream (an earlier layer or step) sent NaN/inf here: nothing to judge against
            self._fail("finite inputs")
            return
        try:
            self._judge(queries, out, scale, run)
        except Exception as e:   # the code under test raised while being judged: a failed claim
            self._fail("error", error=f"{type(e).__name__}: {str(e)[:300]}")

    def _judge(self, queries, out, scale: float, run: dict) -> None:
        import mlx.core as mx

        from tqbridge.metal.attention.problem import check_problem, visible_range
        from tqbridge.metal.attention.ref import UNIT_ROUNDOFF, oracle
        from tqbridge.parity.harness.level_attention import bound_ratio

        c = self.cache
        # 2. bytes of the stored positions, and the visible keys among them
        n = c.offset
        kb_ref, vb_ref = self._reference_blocks()
        kb, vb = (np.array(b) for b in c.blocks())
        lo, _ = visible_range(n, 1, 0, self.window or 0)
        if not (np.array_equal(kb, kb_ref[:, :, c.start:n]) and np.array_equal(vb, vb_ref[:, :, c.start:n])):
            self._fail("bytes")
        if c.start > lo:
            self._fail("coverage", first_visible=lo)
        # 3. the lane's output against the oracle over the reference blocks
        dtype = str(queries.dtype).replace("mlx.core.", "")
        q = np.array(queries.astype(mx.float32))[:, :, 0, :]
        o = np.array(out.astype(mx.float32))[:, :, 0, :]
        kw = dict(k_format=c.k_format, v_format=c.v_format, length=n, scale=float(scale), window=self.window,
                  rotation=(c.k_rot, c.v_rot))
        prob = check_problem(q, kb_ref, vb_ref, **kw)
        chain = run.get("chain") if run.get("backend") == "cpu-emulator" else None
        want, bound = oracle(q, kb_ref, vb_ref, prob, chain=None if chain is None else int(chain),
                             q_precision=run.get("q_precision") or "exact")
        want, bound = want[:, :, 0, :], bound[:, :, 0, :] + UNIT_ROUNDOFF.get(dtype, 0.0) * np.abs(want[:, :, 0, :])
        o = o[..., :want.shape[-1]]
        ratio = bound_ratio(o, want, bound) if np.isfinite(o).all() else float("inf")
        self.worst = max(self.worst, ratio)
        if not ratio <= 1.0:
            self._fail("attention", bound_ratio=_finite(ratio))

    def record(self) -> dict[str, Any]:
        exercised = self.relocations >= 1 and (not self.window or self.slides >= 1)
        return {"layer": self.index, "window": self.window, "decode_steps": self.steps, "paths": dict(self.paths),
                "slides": self.slides, "relocations": self.relocations, "start": self.cache.start,
                "offset": self.cache.offset, "bound_ratio": _finite(self.worst), "exercised": exercised,
                "failure": self.failure, "passed": bool(self.failure is None and exercised)}


def run_lane(gguf_path: str, tokens: "list[int]", kv: str, *, rotation: bool = True, window: int = LANE_WINDOW,
             step: int = LANE_STEP, decode: int = LANE_DECODE, progress=None, model=None) -> dict[str, Any]:
    """The lane level on ``tokens`` (the last ``decode`` are decode steps) for one K/V pair; a JSON-ready
    dict. ``gguf_path``: the model (any GGUF :func:`tqbridge.bridge.gguf.model.load_gguf_model` builds);
    ``model``: that mlx-lm model already built (runs share it; it holds no state between runs)."""
    import mlx.core as mx

    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.metal.lm.cache import TQCache, make_cache
    from tqbridge.metal.lm.routing import route_attention
    from tqbridge.parity.harness.runtimes import KV

    say = progress or (lambda msg: None)
    spec = KV.parse(kv)
    if not 0 < decode < len(tokens):
        raise ValueError(f"lane level: {decode} decode steps need more than {decode} tokens, got {len(tokens)}")
    t0 = time.perf_counter()
    with emulated_lane():
        if model is None:
            say("lane: loading the MLX model")
            model, _ = load_gguf_model(gguf_path)
        rot = "llama" if rotation else "none"
        base = make_cache(model, spec.k, spec.v, rotation=rot)
        windows = lane_windows([getattr(c, "window", None) if isinstance(c, TQCache) else None for c in base],
                               window)
        cache, layers = [], {}
        for i, (c, w) in enumerate(zip(base, windows)):
            if isinstance(c, TQCache):
                c = TQCache(spec.k, spec.v, window=w, rotation=rot)
                c.step = step
                layers[id(c)] = L = _Layer(i, c, w)
                L.record_rows()
            cache.append(c)

        def observe(c, queries, out, scale, before):
            L = layers.get(id(c))
            if L is not None:
                if queries.shape[2] == 1:
                    L.judge_step(queries, out, scale, before)
                else:
                    L.note_geometry()

        ids = mx.array([list(tokens)])
        prompt = len(tokens) - decode
        error = None
        try:
            with route_attention("auto"), _observed(observe):
                say(f"lane: prefill of {prompt} tokens")
                mx.eval(model(ids[:, :prompt], cache=cache))
                for s in range(prompt, len(tokens)):
                    say(f"lane: decode step {s - prompt + 1}/{decode} through the emulated GPU lane")
                    mx.eval(model(ids[:, s:s + 1], cache=cache))
            for c in cache:
                if isinstance(c, TQCache):
                    c.check_finite()
        except Exception as e:   # the code under test raised: a failed claim with its reason, not a crash
            why = str(e).splitlines()[0] if str(e) else ""
            error = f"{type(e).__name__}: {why[:300]}"
    tq = [c for c in cache if isinstance(c, TQCache)]
    paths = sum((c.paths for c in tq), start=Counter())
    recs = [layers[k].record() for k in layers]
    by_window: dict[str, list[int]] = {}
    for r in recs:
        by_window.setdefault(str(r["window"] or "none"), []).append(r["layer"])
    codecs = sorted({f"{c.codec_paths['k_append']}/{c.codec_paths['v_append']}" for c in tq})
    fallbacks = sorted({c.decode_fallback for c in tq if c.decode_fallback})
    appends_ok = codecs == ["kv-append:cpu-emulator/kv-append:cpu-emulator"]
    return {"kv": spec.name, "path": PATH, "paths": dict(paths), "appends": codecs, "fallbacks": fallbacks,
            "model_windows": sorted({int(getattr(c, "window", None) or 0) for c in base}),
            "window": window, "step": step, "windows": by_window, "prompt": prompt, "decode": decode,
            "rotation": rotation, "layers": recs, "slides": sum(r["slides"] for r in recs),
            "relocations": sum(r["relocations"] for r in recs),
            "worst_bound_ratio": _finite(max((layers[k].worst for k in layers), default=0.0)),
            "seconds": round(time.perf_counter() - t0, 1),
            "setup": _setup_line(base, by_window, window, step, prompt, decode),
            "claim": ("per layer and decode step: the attention ran the emulated GPU lane and the appends its "
                      "append kernel; the lane's stored blocks == the append kernel's numpy reference for the "
                      "rows the layer was given, covering every visible key; its output within the float64 "
                      "oracle's bound over those blocks; every windowed layer slid and every layer relocated"),
            "appends_ok": appends_ok, "error": error,
            "passed": bool(recs and appends_ok and error is None and all(r["passed"] for r in recs))}


def _setup_line(base: list, by_window: dict, window: int, step: int, prompt: int, decode: int) -> str:
    own = sorted({int(getattr(c, "window", None) or 0) for c in base} - {0})
    forced = by_window.get(str(window), [])
    where = (f"the model's sliding-window layers (window {', '.join(map(str, own))}) {forced}" if own else
             f"the even layers {forced} (the model has no sliding window)")
    return (f"window forced to {window} on {where}, full attention elsewhere; TQCache.step {step}; "
            f"{prompt}-token prompt, {decode} teacher-forced decode steps")


def summary_lines(rep: dict[str, Any]) -> list[str]:
    bad = [r for r in rep["layers"] if not r["passed"]]
    worst = rep["worst_bound_ratio"]
    paths = ", ".join(f"{k} x{v}" for k, v in sorted(rep["paths"].items()) if k != "append")
    lines = [f"{rep['kv']}: {rep['path']}",
             f"  setup: {rep['setup']}",
             f"  {len(rep['layers'])} layers, {rep['slides']} slides, {rep['relocations']} relocations; "
             f"paths: {paths}; "
             f"appends: {', '.join(rep['appends'])}; attention "
             + (f"{worst:.2g}x the oracle bound" if worst is not None else "NaN/inf (outside the oracle bound)")]
    if rep.get("error"):
        lines.append(f"  the run raised: {rep['error']}")
    for why in rep.get("fallbacks", [])[:2]:
        lines.append(f"  FALLBACK: {why}")
    for r in bad[:5]:
        f = r["failure"] or {}
        why = (f"{f['claim']} claim failed at decode step {f['step']} (offset {f['offset']}, start {f['start']}"
               + (f", {f['bound_ratio']:.3g}x the bound" if f.get("bound_ratio") is not None else "") + ")") if f \
            else "not exercised (no slide or relocation)"
        lines.append(f"  layer {r['layer']} (window {r['window'] or 'none'}): {why}")
    if len(bad) > 5:
        lines.append(f"  ... {len(bad) - 5} more layers failed")
    return lines
