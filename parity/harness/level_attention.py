"""Level 3, attention: tqbridge's fused decode kernel vs ggml's ``flash_attn_ext`` on the same blocks.

For one decode step (one query row per head, every key visible), the same q and the same raw K/V
blocks go to

- ggml's CPU ``flash_attn_ext`` (:mod:`tqbridge.bridge.llama.ggml_graph`): the kernel llama.cpp runs;
- tqbridge's ``decode_attention`` on each requested backend (``reference``: MLX ops,
  ``cpu-emulator``: the fused kernel's own source on the CPU SIMT emulator, ``cuda``/``metal``
  where present);
- the float64 oracle over the bridge's dequantization and its error bound for a float32
  implementation (:func:`tqbridge.metal.attention.ref.oracle`).

The claim (it sets ``passed``): **every component of ours is within the oracle's bound**,
``|ours - oracle| <= bound``, with the bound computed for the serial accumulation chain the path
reports (the kernel's ``last_run()["chain"]``; the cache length for the MLX-ops reference). The bound
is float32 round-off of exact attention over the dequantized blocks, so a port that computes in
lower precision somewhere (q rounded to f16, V accumulated in f16, a dropped scale bit) fails it.

ggml's own error vs the oracle is reported beside it as information: ggml's CPU flash attention
rounds q to the K type's dot-product type (f16 for f16 K, q8_0 for quantized K) and accumulates f16
V in f16, so it is far outside the float32 bound by design (NMSE ~1e-6 to 8e-5). The old, weaker
comparison ("no worse than ggml": NMSE and max error at most ggml's) is kept in each record as
``no_worse_than_ggml``; it does not set the verdict, because a kernel that rounds q to f16 passes it.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tqbridge.bridge import get_format, quantize
from tqbridge.bridge.blocks.kv_spec import LLAMA_EXAMPLE_KV, TURBO_FORMAT, split_kv
from tqbridge.bridge.blocks.registry import names

# KV types ggml's CPU flash attention accepts in llama.cpp's KV cache (the registry's flash_attn).
GGML_FA_FORMATS = names(lambda f: f.flash_attn)

# Floors for the informational "no worse than ggml" comparison, for cases where ggml is itself nearly
# exact: NMSE below 1e-12 and max error below 1e-6 of the output scale are float32 round-off.
NMSE_FLOOR = 1e-12
MAX_REL_FLOOR = 1e-6


def _errors(x: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    err = x - ref
    denom = float((ref ** 2).sum())
    return {"nmse": float((err ** 2).sum() / denom) if denom else float((err ** 2).sum()),
            "max_abs": float(np.abs(err).max())}


def bound_ratio(x: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> float:
    """Worst ``|x - ref| / bound`` over the components (<= 1: within the oracle's bound).

    A component whose bound is 0 (an all-zero V column) allows no error: ratio inf if it has one."""
    err = np.abs(np.asarray(x, dtype=np.float64) - ref)
    ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(ratio.max()) if ratio.size else 0.0


def judge_ours(qb: np.ndarray, kb: np.ndarray, vb: np.ndarray, *, k_format, v_format, length: int,
               scale: float, window: "int | None" = None, softcap: "float | None" = None, start: int = 0,
               rotation: "tuple[int, int] | None" = None, backends: Iterable[str] = ("reference", "cpu-emulator"),
               compare: "dict[str, np.ndarray] | None" = None,
               given: "dict[str, tuple[np.ndarray, dict]] | None" = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each of our paths on one problem against the float64 oracle and its bound.

    qb: (1, Hq, D) or (1, Hq, T, D) float32; kb / vb: (1, Hkv, L, row_bytes) blocks. ``compare``:
    other outputs (name -> array shaped like q's output) whose errors vs the oracle are reported
    beside ours (information, e.g. ggml's). ``given``: outputs of our own paths computed elsewhere
    (name -> (output, the ``last_run()`` of the call that made it)), judged as the backends are.
    Returns ({backend or given name: record}, {name: errors})."""
    from tqbridge.metal import attention
    from tqbridge.metal.attention.ref import oracle

    kf, vf = get_format(k_format), get_format(v_format)
    kw = dict(k_format=kf, v_format=vf, length=int(length), scale=float(scale), window=window,
              softcap=softcap, rotation=rotation, start=int(start))
    prob = attention.check_problem(qb, kb, vb, **kw)

    def oracle_for(chain: "int | None", q_precision: str = "exact") -> tuple[np.ndarray, np.ndarray]:
        want, bound = oracle(qb, kb, vb, prob, chain=chain, q_precision=q_precision)
        return want[0], bound[0]                                  # (Hq, T, D)

    ref, ref_bound = oracle_for(None)
    shape = ref.shape if qb.ndim == 4 else (ref.shape[0], ref.shape[2])
    ref, ref_bound = ref.reshape(shape), ref_bound.reshape(shape)
    others = {}
    for name, x in (compare or {}).items():
        e = _errors(np.asarray(x, np.float64).reshape(shape), ref)
        e["bound_ratio"] = bound_ratio(np.asarray(x, np.float64).reshape(shape), ref, ref_bound)
        others[name] = e
    out_scale = float(np.abs(ref).max()) or 1.0

    def judge(o: np.ndarray, run: dict) -> dict[str, Any]:
        kernel = run.get("backend", "reference") != "reference"
        chain = run.get("chain") if kernel else None
        # a kernel that quantized q to int8 (int8-mma, CUDA's default) is judged as that arithmetic
        qp = run.get("q_precision", "exact") if kernel else "exact"
        if chain is None:
            want, bound = ref, ref_bound
        else:
            want, bound = (a.reshape(shape) for a in oracle_for(int(chain), qp))
        o = np.asarray(o, np.float64).reshape(shape)
        e = _errors(o, want)
        e["path"] = run.get("backend", "reference")
        e["chain"] = int(chain) if chain is not None else int(length)
        e["q_precision"] = qp
        e["bound_ratio"] = bound_ratio(o, want, bound)
        e["within_bound"] = bool(np.isfinite(o).all() and e["bound_ratio"] <= 1.0)
        e["out_scale"] = out_scale
        for name, x in (compare or {}).items():
            e[f"vs_{name}"] = _errors(o, np.asarray(x, np.float64).reshape(shape))
        return e

    ours: dict[str, Any] = {}
    for b in backends:
        # through the module attribute, so a caller (or a planted-bug test) can wrap it
        o = np.asarray(attention.decode_attention(qb, kb, vb, backend=b, **kw), dtype=np.float64)[0]
        ours[b] = judge(o, (attention.last_run() or {}) if b != "reference" else {})
    for name, (o, run) in (given or {}).items():
        ours[name] = judge(np.asarray(o, np.float64).reshape(shape), run)
    return ours, others


def fork_has(fmt) -> bool:
    """Whether this process's llama.cpp side is a TurboQuant fork build that has ``fmt`` (its own turbo
    variant, or an upstream ggml type)."""
    from tqbridge.bridge.llama.side import selected, type_table

    info = selected()
    return info is not None and bool(info.variant) and any(f.key == fmt.key for f in type_table().values())


def fork_flash_attn(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, kf, vf, *, scale: float,
                    softcap: float = 0.0, visible: "np.ndarray | None" = None) -> np.ndarray:
    """The fork's ``flash_attn_ext`` over its own turbo blocks, as its graph calls it: q zero-padded to
    the K rows' width and rotated (TURBO_WHT forward) when K is turbo, the output rotated back (inverse)
    when V is turbo, then cut to the head dim. q: (Hq, D); ``visible``: None or the keys q sees (n,)
    booleans, ggml's mask; returns (Hq, D)."""
    from tqbridge.bridge.blocks import rotation as turbo_rotation
    from tqbridge.bridge.llama.ggml_c import type_id
    from tqbridge.bridge.llama.ggml_graph import flash_attn_ext
    from tqbridge.bridge.blocks.padding import padded_dim

    hq, d = q.shape
    dk, dv = padded_dim(kf, d), padded_dim(vf, d)
    qp = np.zeros((hq, dk), np.float32)
    qp[:, :d] = q
    if kf.kind == "turbo":   # every group of block_size values of a row (head dims above one group: 256)
        qp = turbo_rotation.forward(qp.reshape(hq, -1, kf.block_size), kf.block_size).reshape(hq, dk)
        qp = qp.astype(np.float32)
    out = flash_attn_ext(qp[:, None, :], k_blocks, v_blocks, k_type=type_id(kf), v_type=type_id(vf),
                         scale=scale, head_dim_v=dv, softcap=softcap,
                         visible=None if visible is None else np.asarray(visible, bool)[None, :])[0]
    if vf.kind == "turbo":
        out = np.ascontiguousarray(out, np.float32)
        out = turbo_rotation.inverse(out.reshape(hq, -1, vf.block_size), vf.block_size).reshape(hq, dv)
    return np.asarray(out, np.float32)[:, :d]


def attention_case(q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray, *, k_format: str,
                   v_format: str, scale: "float | None" = None,
                   backends: Iterable[str] = ("reference", "cpu-emulator"), window: "int | None" = None,
                   softcap: "float | None" = None, rotation: "tuple[int, int] | None" = None) -> dict[str, Any]:
    """Compare on one problem. q: (Hq, D) float32; k/v blocks: (Hkv, n, row_bytes) uint8.

    ggml's ``flash_attn_ext`` runs beside ours when it can (ggml formats, no window, no rotation);
    the other options (``window``, ``softcap``, ``rotation``: llama.cpp's Hadamard groups of the
    stored rows) are judged against the oracle alone."""
    from tqbridge.bridge.llama.ggml_graph import flash_attn_ext
    from tqbridge.parity.harness.llama_arith import VEC_DOT_TYPE, bound_ratio, ulp_error
    from tqbridge.parity.harness.llama_arith import attention as llama_attention

    kf, vf = get_format(k_format), get_format(v_format)
    q = np.ascontiguousarray(q, dtype=np.float32)
    hq, d = q.shape
    hkv, n = k_blocks.shape[:2]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    qb, kb, vb = q[None], np.ascontiguousarray(k_blocks)[None], np.ascontiguousarray(v_blocks)[None]
    ggml_ok = ("ggml" in kf.type_ids and "ggml" in vf.type_ids and not window and not rotation)
    compare = {}
    if ggml_ok:
        compare["ggml"] = flash_attn_ext(q[:, None, :], k_blocks, v_blocks, k_type=kf.type_ids["ggml"],
                                         v_type=vf.type_ids["ggml"], scale=scale, softcap=float(softcap or 0.0))[0]
    elif not window and not rotation and fork_has(kf) and fork_has(vf):
        compare["ggml"] = fork_flash_attn(q, k_blocks, v_blocks, kf, vf, scale=scale, softcap=float(softcap or 0.0))
        ggml_ok = True
    ours, others = judge_ours(qb, kb, vb, k_format=kf, v_format=vf, length=n, scale=scale, window=window,
                              softcap=softcap, rotation=rotation, backends=backends, compare=compare)
    arith = None
    if ggml_ok and kf.key in VEC_DOT_TYPE and vf.key in VEC_DOT_TYPE:
        # information: ggml's output recomputed with its own arithmetic (parity/harness/llama_arith.py)
        a, bnd = llama_attention(q, k_blocks, v_blocks, k_format=kf.key, v_format=vf.key, scale=scale,
                                 softcap=float(softcap or 0.0), bound=True)
        unit = "f16" if vf.key == "f16" else "f32"
        g = np.asarray(compare["ggml"], np.float64)
        r = bound_ratio(a, g, bnd)
        arith = {"bound_ratio": r, "ulps": ulp_error(a, g, unit), "unit": unit, "passed": bool(r <= 1.0)}
    res: dict[str, Any] = {"kv": f"{kf.key}/{vf.key}", "q_heads": hq, "kv_heads": hkv, "keys": n,
                           "head_dim": d, "claim": "|ours - float64 oracle| <= oracle bound, every component",
                           "options": {"window": window or 0, "softcap": float(softcap or 0.0),
                                       "rotation": list(rotation) if rotation else None},
                           "ggml_vs_oracle": others.get("ggml"), "llama_arith_vs_ggml": arith, "ours": {}}
    ok = True
    for b, e in ours.items():
        if ggml_ok:
            g_err = others["ggml"]
            e["no_worse_than_ggml"] = bool(
                e["nmse"] <= max(g_err["nmse"], NMSE_FLOOR)
                and e["max_abs"] <= max(g_err["max_abs"], MAX_REL_FLOOR * e["out_scale"]))
        ok = ok and e["within_bound"]
        res["ours"][b] = e
    res["passed"] = ok
    return res


def random_problem(k_format: str, v_format: str, *, q_heads: int = 8, kv_heads: int = 2, keys: int = 64,
                   head_dim: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (Hq, D) and K/V blocks (Hkv, n, row_bytes) from Gaussian rows (K with a few outliers)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((q_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((kv_heads, keys, head_dim)).astype(np.float32)
    k[..., rng.integers(0, head_dim, 2)] *= 8.0          # outlier channels, as real K caches have
    v = rng.standard_normal((kv_heads, keys, head_dim)).astype(np.float32)
    return q, quantize_padded(k_format, k), quantize_padded(v_format, v)


def quantize_padded(fmt, x: np.ndarray) -> np.ndarray:
    """Rows zero-padded to the format's block (turbo: 64 -> 128, as the fork pads heads), quantized."""
    from tqbridge.bridge.blocks.padding import pad_rows

    return quantize(fmt, pad_rows(fmt, x))


def state_problem(layer, n_kv_heads: int, q_heads: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A problem on a real llama.cpp cache layer (:class:`LayerKV`): its own K/V blocks, q drawn
    with the typical norm of that layer's keys."""
    k = np.ascontiguousarray(layer.k_blocks(n_kv_heads).transpose(1, 0, 2))
    v = np.ascontiguousarray(layer.v_blocks(n_kv_heads).transpose(1, 0, 2))
    kf = layer.k_float(n_kv_heads)
    d = kf.shape[-1]
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((q_heads, d)).astype(np.float32)
    q *= np.float32(np.median(np.linalg.norm(kf, axis=-1)) / np.sqrt(d))
    return q, k, v


# Probe problems: inputs on which float32 attention is far inside the oracle's bound but attention with
# one reduced-precision step is far outside it. On Gaussian inputs the bound (a worst case: every
# logit error coherent, Cauchy-Schwarz on every dot product) is ~1000x the error of a float32 kernel,
# and a kernel that rounds q to f16 stays at ~0.3x of it; the probes make the error of such a step
# coherent, so it shows.
PROBES = ("q-rounding", "v-accumulation")
F16_HALF_ULP_AT_1 = 2.0 ** -11


def probe_problem(kind: str, k_format: str, v_format: str, *, q_heads: int = 8, kv_heads: int = 2, keys: int = 64,
                  head_dim: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A probe problem: q (Hq, D) and K/V blocks (Hkv, n, row_bytes).

    ``q-rounding``: every q component sits just inside half an f16 ulp off the f16 grid, rounding
    down on a set A of channels and up on the rest (B). Half the keys are +1 on A and -1 on B, the
    others 0, so their logits are all ~0 (balanced softmax) while rounding q to f16 moves the first
    half's logits by ~2^-11 * scale * |q| * |k| in one direction: ~100x the oracle's logit bound.
    Their V rows differ (+1 vs -1) on half the channels, which turns that into an output error of
    ~10x the bound. (ggml rounds q to f16 for an f16 K: information.)

    ``v-accumulation``: q = 0, so every key has weight exactly 1/n, and V rows are positive values
    with full f16 mantissas: summing them in f16 loses ~2^-11 of the growing sum at every step
    (ggml's CPU flash attention does this for an f16 V: information).
    """
    rng = np.random.default_rng(seed)
    d, n = head_dim, keys
    if kind == "q-rounding":
        a = np.zeros(d, bool)
        a[rng.permutation(d)[: d // 2]] = True
        mid, eta = 1.0 + F16_HALF_ULP_AT_1, 2.0 ** -16      # f16 midpoint between 1 and 1 + 2^-10
        base = np.where(a, mid - eta, mid + eta)              # rounds to 1 on A, to 1 + 2^-10 on B
        heads = np.arange(q_heads)
        mult = ((-1.0) ** heads) * 2.0 ** (heads % 4 - 2)     # signs and powers of 2 keep the pattern
        q = (mult[:, None] * base[None, :]).astype(np.float32)
        k = np.zeros((kv_heads, n, d), np.float32)
        v = np.ones((kv_heads, n, d), np.float32)
        split = rng.permutation(d)[: d // 2]                  # V channels where the two key kinds differ
        for j in range(kv_heads):
            first = (np.arange(n) + j) % 2 == 0
            k[j, first] = np.where(a, 1.0, -1.0)
            v[j][np.ix_(~first, split)] = -1.0
    elif kind == "v-accumulation":
        q = np.zeros((q_heads, d), np.float32)
        k = rng.standard_normal((kv_heads, n, d)).astype(np.float32)
        v = rng.uniform(1.0, 2.0, (kv_heads, n, d)).astype(np.float16).astype(np.float32)
    else:
        raise ValueError(f"unknown probe {kind!r}; choose from {', '.join(PROBES)}")
    return q, quantize_padded(k_format, k), quantize_padded(v_format, v)


# Option cases: the kernel paths a model may use that the format pairs alone do not reach — a soft-capped
# logit, a sliding window shorter than the cache, llama.cpp's Hadamard rotation of the stored rows (q
# rotated in, the output rotated back inside the kernel) and a turbo pair (rotation inside the format).
# Each is one Gaussian problem (name, K/V pair, options, (Hq, Hkv, keys, head_dim)). The values are chosen
# so that skipping the option moves the output far beyond the bound: softcap 2 compresses logits of
# magnitude ~1-10; a window of 17 of 64 keys, where one key more or less moves every weight by ~1/17.
OPTION_CASES = (
    ("softcap", LLAMA_EXAMPLE_KV, {"softcap": 2.0}, (8, 2, 64, 64)),
    ("window", LLAMA_EXAMPLE_KV, {"window": 17}, (8, 2, 64, 64)),
    ("llama-rotation", LLAMA_EXAMPLE_KV, {"rotation": (64, 64)}, (8, 2, 64, 64)),
    ("turbo", f"{TURBO_FORMAT}/{TURBO_FORMAT}", {}, (8, 2, 64, 128)),
)


def run_attention_level(pairs: "Iterable[str]", *, shapes: "Iterable[tuple[int, int, int, int]]" = ((8, 2, 64, 64),),
                        backends: Iterable[str] = ("reference", "cpu-emulator"), seed: int = 0,
                        probes: Iterable[str] = PROBES, options: "Iterable[tuple] | None" = OPTION_CASES) -> dict[str, Any]:
    """Every K/V pair on every (Hq, Hkv, keys, head_dim) shape (Gaussian rows), and on each probe
    (:func:`probe_problem`, 8/2 heads, 64 keys, D = 64); then the :data:`OPTION_CASES`; a JSON-ready dict."""
    cases = []
    for spec in pairs:
        kf, vf = split_kv(spec)
        for hq, hkv, n, d in shapes:
            q, k, v = random_problem(kf, vf, q_heads=hq, kv_heads=hkv, keys=n, head_dim=d, seed=seed)
            cases.append({"problem": "gaussian",
                          **attention_case(q, k, v, k_format=kf, v_format=vf, backends=backends)})
        for kind in probes:
            q, k, v = probe_problem(kind, kf, vf, seed=seed)
            cases.append({"problem": f"probe:{kind}",
                          **attention_case(q, k, v, k_format=kf, v_format=vf, backends=backends)})
    for name, spec, opts, (hq, hkv, n, d) in options or ():
        kf, vf = split_kv(spec)
        q, k, v = random_problem(kf, vf, q_heads=hq, kv_heads=hkv, keys=n, head_dim=d, seed=seed)
        cases.append({"problem": f"option:{name}",
                      **attention_case(q, k, v, k_format=kf, v_format=vf, backends=backends, **opts)})
    return {"cases": cases, "claim": "ours within the float64 oracle's bound (ggml's own error: information)",
            "passed": all(c["passed"] for c in cases)}


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line per case: the worst error / bound of each of our paths, and ggml's beside it."""
    lines = []
    for c in report["cases"]:
        ours = ", ".join(f"{b} {e['bound_ratio']:.2g}x bound (NMSE {e['nmse']:.1e})"
                         + ("" if e["within_bound"] else " OUTSIDE")
                         for b, e in c["ours"].items())
        g = c["ggml_vs_oracle"]
        gtext = (f"ggml {g['bound_ratio']:.2g}x bound (NMSE {g['nmse']:.1e}, information)" if g
                 else "ggml: n/a (not a ggml problem)")
        lines.append(f"{c['kv']:<12} {c.get('problem', 'gaussian')} {c['q_heads']}/{c['kv_heads']} heads, "
                     f"{c['keys']} keys, D={c['head_dim']}: {ours}; {gtext}")
    return lines
