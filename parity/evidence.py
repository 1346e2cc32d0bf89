"""Evidence for a new KV cache type in the form llama.cpp's CONTRIBUTING.md asks of a new quantization type.

That file (section "Pull requests", new ``ggml_type`` entries) asks at minimum for: perplexity compared to the
native precision (FP16/BF16) and to types of similar size, KL divergence from the native-precision version for
the new type and the similar ones, CPU performance against the similar types, and ``test-backend-ops`` cases
run on at least two ggml backends. This module measures each, for one model and one llama.cpp build:

1. :func:`run_quality` -- perplexity and KLD through the build's own runtime (:class:`LlamaCppRuntime`),
   chunked as llama-perplexity chunks a text: the token stream is cut into chunks of ``n_ctx`` tokens, the
   first token of each replaced by BOS where the vocabulary adds one, each chunk evaluated from an empty
   cache, and only the second half scored (positions ``n_ctx/2 .. n_ctx-2`` predict the next token), so every
   scored token sees at least ``n_ctx/2`` tokens of context. Uncertainties are the standard errors
   llama-perplexity prints: ``sqrt((E[x^2] - E[x]^2) / (n - 1))`` of the per-token values.
2. :func:`run_speed` -- prompt processing and decode tokens/s per type at two prompt lengths, repetitions
   interleaved across types (type A, B, ..., then again), median and spread.
3. :func:`run_kernels` -- the build's ``flash_attn_ext`` (ggml's CPU backend of that build) against
   tqbridge's float64 oracle and against tqbridge's own fused kernel on the CPU emulator as the second
   backend, NMSE per case beside test-backend-ops' bar for flash_attn_ext (:data:`NMSE_BAR`).
4. :func:`run_mlx_side` -- the parity levels (blocks, attention, teacher; logits in 1) for the same types.

:func:`run_evidence` runs them, caching each type's result under ``OUT/cache/<settings>/`` so an
interrupted run resumes; :mod:`tqbridge.parity.evidence_report` writes the Markdown, JSON and plot.
The build can be replaced by any object with the runtime's ``tokenize`` / ``logits`` (and a
``flash_attn``): tests use one over tqbridge's own codecs with planted decoding bugs.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from tqbridge.bridge.atomic import write_atomic
from tqbridge.bridge.blocks.kv_spec import qualify_variant

# test-backend-ops' tolerance for flash_attn_ext: ``test_flash_attn_ext::max_nmse_err()`` returns 5e-4
# (llama.cpp tests/test-backend-ops.cpp, the same in both fork checkouts, 69d8e4b and PR #197's port).
NMSE_BAR = 5e-4
# The types of similar size CONTRIBUTING.md asks a new type to be compared with (the cache types of
# llama.cpp's CPU backend below f16), and the baseline the KLD is also taken from.
SURROUNDING = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
BASELINE = "q8_0"
NATIVE = "f16"
# llama-perplexity's percentiles of the per-token KLD (its "KL divergence statistics" block).
KLD_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01)
# Kernel cases: head dims, (q heads, kv heads) for GQA ratios 1 and 4, cache lengths; plus one soft-capped
# case per type (cap 2.0, the parity attention level's value: logits of magnitude ~1-10 are compressed, so
# a kernel that skips the cap is far off) and two masked ones, the masks a decoding model gives
# flash_attn_ext: a sliding window (Gemma 3's local layers, Mistral) and a left padding (a sequence in a
# batch), each hiding most of 512 keys.
KERNEL_HEAD_DIMS = (64, 128, 256)
KERNEL_HEADS = ((8, 8), (8, 2))
KERNEL_LENGTHS = (64, 512)
KERNEL_SOFTCAP = 2.0
KERNEL_WINDOW = 128
KERNEL_START = 300
# The parity logits level's rule for a quantized cache (tqbridge.parity.harness.level_logits.BASELINE_RATIO):
# two implementations of one cache type may differ by at most twice what the type itself costs vs f16.
TWIN_RATIO = 2.0
SPEED_GEN = 16          # decode steps timed after each prompt
SPEED_REPS = 3


class EvidenceError(ValueError):
    """Bad settings or input: one line says which."""


def _refusals() -> tuple[type, ...]:
    """The errors by which a llama.cpp build refuses a cache type for a model (a context it cannot make)."""
    from tqbridge.bridge.llama.side import LlamaBuildError
    from tqbridge.parity.harness.runtimes import LlamaConfigError

    return (LlamaBuildError, LlamaConfigError)


# ---- statistics, as llama-perplexity computes them -------------------------------------------------------

def mean_and_uncertainty(x: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error ``sqrt((E[x^2] - E[x]^2) / (n - 1))`` (0 when that is not positive)."""
    x = np.asarray(x, np.float64)
    n = x.size
    if n == 0:
        return float("nan"), float("nan")
    m = float(x.mean())
    var = float((x * x).mean()) - m * m
    return m, (float(np.sqrt(var / (n - 1))) if var > 0 and n > 1 else 0.0)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """Linear interpolation between the two nearest ranks (rank ``fraction * (n - 1)``)."""
    v = np.asarray(sorted_values, np.float64)
    p = fraction * (v.size - 1)
    i = int(np.floor(p))
    j = min(i + 1, v.size - 1)
    return float((1 - (p - i)) * v[i] + (p - i) * v[j])


def perplexity_stats(nll: np.ndarray) -> dict[str, float]:
    m, u = mean_and_uncertainty(nll)
    ppl = float(np.exp(m))
    return {"ppl": ppl, "ppl_err": ppl * u, "ln_ppl": m, "ln_ppl_err": u, "tokens": int(np.size(nll))}


def ratio_stats(nll: np.ndarray, nll_ref: np.ndarray) -> dict[str, float]:
    """ln(PPL/PPL_ref) with its uncertainty, the two streams' covariance taken into account."""
    a, b = np.asarray(nll, np.float64), np.asarray(nll_ref, np.float64)
    ma, ua = mean_and_uncertainty(a)
    mb, ub = mean_and_uncertainty(b)
    n = a.size
    cov = (float((a * b).mean()) - ma * mb) / (n - 1) if n > 1 else 0.0
    var = ua * ua + ub * ub - 2 * cov
    return {"ln_ratio": ma - mb, "ln_ratio_err": float(np.sqrt(var)) if var > 0 else 0.0}


def kld_stats(kld: np.ndarray, same_top: np.ndarray) -> dict[str, Any]:
    k = np.sort(np.asarray(kld, np.float64))
    m, u = mean_and_uncertainty(k)
    p = float(np.mean(same_top))
    n = k.size
    return {"mean": m, "err": u, "max": float(k[-1]), "min": float(k[0]),
            "percentiles": {f"{100 * f:g}": percentile(k, f) for f in KLD_PERCENTILES},
            "same_top": p, "same_top_err": float(np.sqrt(p * (1 - p) / (n - 1))) if n > 1 else 0.0}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


# ---- chunking and scoring ------------------------------------------------------------------------------

def chunk_tokens(ids: "list[int]", n_ctx: int, n_chunks: int, bos: "int | None") -> list[list[int]]:
    """llama-perplexity's chunks: consecutive ``n_ctx`` slices from the start (``n_chunks`` of them, or
    every whole one when ``n_chunks <= 0``), the first token of each replaced by ``bos`` when given."""
    if n_ctx < 4 or n_ctx % 2:
        raise EvidenceError(f"--ctx must be an even number of at least 4, got {n_ctx}")
    have = len(ids) // n_ctx
    if have < 2:   # llama-perplexity refuses a text shorter than 2 * n_ctx tokens
        raise EvidenceError(f"the text has {len(ids)} tokens; at least {2 * n_ctx} are needed for --ctx {n_ctx}")
    n = have if n_chunks <= 0 else min(n_chunks, have)
    out = []
    for i in range(n):
        c = [int(t) for t in ids[i * n_ctx:(i + 1) * n_ctx]]
        if bos is not None:
            c[0] = int(bos)
        out.append(c)
    return out


def scored(logits: np.ndarray, chunk: "list[int]") -> tuple[np.ndarray, np.ndarray]:
    """(log-probabilities (m, vocab) float32, next tokens (m,)) of the scored half of one chunk."""
    n_ctx = len(chunk)
    first = n_ctx // 2
    lp = log_softmax(np.asarray(logits)[first:n_ctx - 1]).astype(np.float32)
    return lp, np.asarray(chunk[first + 1:], np.int64)


def kld_rows(ref_lp: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """KL(ref || this) per row, float64, from log-probabilities."""
    r = ref_lp.astype(np.float64)
    return np.maximum((np.exp(r) * (r - lp.astype(np.float64))).sum(axis=-1), 0.0)


# ---- what is compared -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class KVType:
    """A K/V cache configuration as the runtime takes it (``k``, ``v`` format names) with its label."""

    k: str
    v: str

    @property
    def name(self) -> str:
        return self.k if self.k == self.v else f"{self.k}/{self.v}"

    @property
    def file_key(self) -> str:
        return self.name.replace("/", "--").replace("@", "_at_")


def parse_kv(spec: str) -> KVType:
    from tqbridge.parity.harness.runtimes import KV

    try:
        kv = KV.parse(spec)
    except ValueError as e:
        raise EvidenceError(str(e)) from e
    return KVType(kv.k, kv.v)


def bits_per_value(kv: KVType, runtime=None) -> float:
    """Mean stored bits per K and V value (the registry's block size and bytes; a turbo type's own), or
    the runtime's own ``bits_per_value(name)`` where it has one."""
    from tqbridge.bridge.blocks.registry import get_format

    own = getattr(runtime, "bits_per_value", None)
    one = own if own is not None else (lambda name: get_format(name).bits_per_value)
    return 0.5 * (one(kv.k) + one(kv.v))


def format_of(runtime, name: str):
    """The registry format a type name of the runtime stands for (the runtime's ``format_of`` where it
    has one: a stand-in build's planted types claim to be a registry format)."""
    from tqbridge.bridge.blocks.registry import get_format

    own = getattr(runtime, "format_of", None)
    return get_format(own(name) if own is not None else name)


def plan_types(requested: "Iterable[str]", baseline: str = BASELINE,
               available: "Iterable[str] | None" = None) -> list[KVType]:
    """f16, the surrounding types (those the runtime has, when ``available`` is given), the baseline,
    then each requested type, each once."""
    have = None if available is None else set(available)
    out: list[KVType] = []
    for spec in (NATIVE, *SURROUNDING, baseline, *requested):
        kv = parse_kv(spec)
        if have is not None and spec in SURROUNDING and not {kv.k, kv.v} <= have:
            continue
        if kv not in out:
            out.append(kv)
    return out


def kv_rotation(kv: KVType, runtime=None, *, fork: bool) -> bool:
    """Whether ``kv`` runs with llama.cpp's Hadamard rotation of quantized KV caches (PR #21038): a type
    with a ggml quantized half (float caches are never rotated). Against upstream, each such type (its
    default). Against a TurboQuant fork, those without a turbo half (the rotated neighbours upstream now
    compares with, rotated as upstream rotates them); a type with a turbo half runs unrotated in both
    runtimes: turbo rotates inside its format, and tqbridge's cache stacks no second rotation on it (the
    PR #197 port would)."""
    kinds = {format_of(runtime, f).kind for f in (kv.k, kv.v)}
    return "ggml" in kinds and not (fork and "turbo" in kinds)


def _rotate(on: bool, *runtimes) -> None:
    for r in runtimes:
        if r is not None and hasattr(r, "rotation"):
            r.rotation = on


# ---- the cache of per-type results (resume) -------------------------------------------------------------

def settings_key(settings: dict) -> str:
    """What a cached result depends on: every setting but which parts run."""
    kept = {k: v for k, v in settings.items() if k != "parts"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


class ResultCache:
    """One JSON file per (part, type) under ``OUT/cache/<settings key>/``; arrays as ``.npy`` beside."""

    def __init__(self, out: "Path | None", settings: dict):
        self.dir = None if out is None else Path(out) / "cache" / settings_key(settings)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.dir / "settings.json", json.dumps(settings, indent=1, sort_keys=True))

    def _path(self, part: str, key: str, ext: str) -> "Path | None":
        return None if self.dir is None else self.dir / f"{part}-{key}.{ext}"

    def get(self, part: str, key: str) -> "dict | None":
        p = self._path(part, key, "json")
        if p is None or not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None    # a damaged entry is recomputed

    def put(self, part: str, key: str, value: dict) -> None:
        p = self._path(part, key, "json")
        if p is not None:
            write_atomic(p, json.dumps(value))

    def get_array(self, part: str, key: str) -> "np.ndarray | None":
        p = self._path(part, key, "npy")
        if p is None or not p.exists():
            return None
        try:
            return np.load(p)
        except (OSError, ValueError):
            return None

    def put_array(self, part: str, key: str, a: np.ndarray) -> None:
        p = self._path(part, key, "npy")
        if p is not None:
            from tqbridge.bridge.atomic import atomic_output

            with atomic_output(p, suffix=".npy") as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, a)


# ---- 1. perplexity and KLD ------------------------------------------------------------------------------

def run_quality(runtime, chunks: "list[list[int]]", types: "list[KVType]", *, baseline: KVType,
                cache: ResultCache, say: Callable[[str], None], twin=None,
                rotation: "Callable[[KVType], bool] | None" = None) -> dict[str, dict]:
    """Per type: per-token NLL, KLD from f16 and from the baseline, same-top flags (cached per type),
    and their statistics. ``rotation``: whether a type runs with llama.cpp's KV rotation (both runtimes;
    :func:`kv_rotation`), else the runtimes' own setting."""
    from tqbridge.parity.harness.runtimes import KV

    REFUSALS = _refusals()
    native = parse_kv(NATIVE)
    refs: dict[KVType, tuple[np.ndarray, np.ndarray]] = {}

    def logprobs(kv: KVType, step: str) -> tuple[np.ndarray, np.ndarray]:
        if rotation is not None:
            _rotate(rotation(kv), runtime, twin)
        lps, tops = [], []
        for i, c in enumerate(chunks):
            say(f"{step} {kv.name}: chunk {i + 1}/{len(chunks)}")
            lp, _ = scored(runtime.logits(c, KV(kv.k, kv.v)), c)
            lps.append(lp)
        lp = np.concatenate(lps)
        return lp, lp.argmax(axis=-1)

    def ref(kv: KVType, step: str) -> tuple[np.ndarray, np.ndarray]:
        if kv not in refs:
            lp = cache.get_array("logprobs", kv.file_key)
            if lp is None:
                lp, _ = logprobs(kv, step)
                cache.put_array("logprobs", kv.file_key, lp)
            refs[kv] = (lp, lp.argmax(axis=-1))
        return refs[kv]

    targets = np.concatenate([scored(np.zeros((len(c), 1)), c)[1] for c in chunks])
    raw: dict[str, dict] = {}
    for n, kv in enumerate(types):
        step = f"[quality {n + 1}/{len(types)}]"
        got = cache.get("quality", kv.file_key)
        if got is None:
            if kv in (native, baseline):
                lp, top = ref(kv, step)
            else:
                try:
                    lp, top = logprobs(kv, step)
                except REFUSALS as e:     # the build cannot run this type on this model: said, not fatal
                    say(f"{step} {kv.name}: refused by the build: {e}")
                    raw[kv.name] = {"kv": kv.name, "refused": str(e)}
                    continue
            f_lp, f_top = ref(native, step)
            b_lp, b_top = ref(baseline, step)
            nll = -lp[np.arange(lp.shape[0]), targets].astype(np.float64)
            if twin is not None and kv != native:
                if rotation is not None:
                    _rotate(rotation(kv), twin)
                # the same cache type in tqbridge's own implementation (the MLX side), same chunks
                t_lp = np.concatenate([scored(twin.logits(c, KV(*_twin_names(twin, kv))), c)[0]
                                       for i, c in enumerate(chunks) if say(f"{step} {kv.name}: twin chunk "
                                                                             f"{i + 1}/{len(chunks)}") or True])
                twin_kld = kld_rows(lp, t_lp).tolist()
                twin_own = float(kld_rows(f_lp, t_lp).mean())    # tqbridge's type from the build's f16
                twin_top = (t_lp.argmax(axis=-1) == top).astype(int).tolist()
            else:
                twin_kld = twin_top = twin_own = None
            got = {"kv": kv.name, "nll": nll.tolist(), "kld_f16": kld_rows(f_lp, lp).tolist(),
                   "kld_twin": twin_kld, "top_twin": twin_top, "twin_own": twin_own,
                   "top_f16": (top == f_top).astype(int).tolist(),
                   "kld_base": kld_rows(b_lp, lp).tolist(), "top_base": (top == b_top).astype(int).tolist()}
            cache.put("quality", kv.file_key, got)
        raw[kv.name] = got
    out = {}
    f_nll = np.asarray(raw[native.name]["nll"])
    b_nll = np.asarray(raw[baseline.name]["nll"])
    for kv in types:
        r = raw[kv.name]
        if "refused" in r:
            out[kv.name] = {"kv": kv.name, "bits_per_value": bits_per_value(kv, runtime), "refused": r["refused"]}
            continue
        nll = np.asarray(r["nll"])
        out[kv.name] = {"kv": kv.name, "bits_per_value": bits_per_value(kv, runtime), **perplexity_stats(nll),
                        **({"kv_rotation": rotation(kv)} if rotation is not None else {}),
                        "vs_f16": {**ratio_stats(nll, f_nll), "kld": kld_stats(r["kld_f16"], r["top_f16"])},
                        f"vs_{baseline.name}": {**ratio_stats(nll, b_nll),
                                                "kld": kld_stats(r["kld_base"], r["top_base"])}}
        if r.get("kld_twin") is not None:
            own = r["twin_own"]
            tw = kld_stats(r["kld_twin"], r["top_twin"])
            out[kv.name]["vs_tqbridge"] = {"kld": tw, "claim": f"mean KLD <= {TWIN_RATIO:g} x tqbridge's type's "
                                                               f"KLD from the build's f16 ({own:.3g})",
                                           "passed": bool(tw["mean"] <= TWIN_RATIO * own)}
    return out


def _twin_names(twin, kv: KVType) -> tuple[str, str]:
    own = getattr(twin, "twin_format", None)
    return (own(kv.k), own(kv.v)) if own is not None else (kv.k, kv.v)


# ---- 1b. the build's own llama-perplexity ---------------------------------------------------------------

# llama-perplexity's last line: "Final estimate: PPL = %.4f +/- %.5f"
_FINAL = r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)"
# "agrees": within one unit of the last digit it prints of the PPL and of its error (the two runtimes' float
# sums are not bit-identical, so a value near a rounding boundary may print one digit apart: measured on
# SmolLM2, fork 69d8e4b, iq4_nl's error 10.24516 against ours 10.245148)
PPL_DIGIT = 1e-4
ERR_DIGIT = 1e-5


def perplexity_tool(build: "Path | None") -> "Path | None":
    """The build's ``llama-perplexity`` (configured with -DLLAMA_BUILD_TOOLS=ON), or None."""
    if build is None:
        return None
    for sub in ("bin", ""):
        p = Path(build) / sub / "llama-perplexity"
        if p.is_file():
            return p
    return None


def run_llama_perplexity(tool: Path, model: Path, text: str, types: "list[KVType]", *, n_ctx: int, n_chunks: int,
                         threads: int, rotation: "Callable[[KVType], bool] | None", cache: ResultCache,
                         say: Callable[[str], None], quality: dict) -> dict[str, dict]:
    """Each type through the build's own ``llama-perplexity`` on the same text and settings (one chunk per
    batch, flash attention, the type's KV rotation through the environment llama.cpp reads), its final
    estimate beside ours: within a unit of its last printed digits is ``agrees``; within its printed
    uncertainty is the weaker claim a different arithmetic would still meet."""
    import os
    import re
    import subprocess
    import tempfile

    from tqbridge.bridge.llama.side import ROTATION_OFF, ROTATION_ON

    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        text_file = Path(tmp) / "text.txt"
        text_file.write_text(text, encoding="utf-8")
        for n, kv in enumerate(types):
            ours = quality.get(kv.name)
            if ours is None or "refused" in ours:
                continue
            got = cache.get("llama-perplexity", kv.file_key)
            if got is None:
                say(f"[llama-perplexity {n + 1}/{len(types)}] {kv.name}")
                rotated = rotation(kv) if rotation is not None else True
                env = {k: v for k, v in os.environ.items() if k not in ROTATION_ON}
                env.update({k: v for k, v in (ROTATION_ON if rotated else ROTATION_OFF).items() if v is not None})
                k, v = (format_of(None, f).name for f in (kv.k, kv.v))    # the build's own type names
                args = ["-c", str(n_ctx), "--chunks", str(n_chunks), "-b", str(n_ctx), "-fa", "on", "-ctk", k,
                        "-ctv", v, "-t", str(threads)]
                try:
                    r = subprocess.run([str(tool), "-m", str(model), "-f", str(text_file), *args],
                                       capture_output=True, text=True, env=env, timeout=6 * 3600)
                except (OSError, subprocess.SubprocessError) as e:
                    r, m = None, None
                    got = {"failed": f"{tool.name} did not run: {e}"}
                else:
                    m = re.search(_FINAL, r.stdout + r.stderr)
                if r is not None and (r.returncode != 0 or not m):
                    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
                    got = {"failed": f"exit {r.returncode}: {tail[0][:300]}"}
                elif m:
                    got = {"ppl": float(m.group(1)), "ppl_err": float(m.group(2)), "kv_rotation": rotated,
                           "command": " ".join(["llama-perplexity", "-m", model.name, "-f", "TEXT", *args])}
                    cache.put("llama-perplexity", kv.file_key, got)    # a failed run is tried again on resume
            if "ppl" in got:
                d, de = abs(ours["ppl"] - got["ppl"]), abs(ours["ppl_err"] - got["ppl_err"])
                got = {**got, "ours": ours["ppl"], "ours_err": ours["ppl_err"], "delta": d,
                       "agrees": bool(d <= PPL_DIGIT and de <= ERR_DIGIT), "within_uncertainty": bool(d <= got["ppl_err"])}
            out[kv.name] = got
    return out


# ---- 2. CPU speed ---------------------------------------------------------------------------------------

def run_speed(runtime, ids: "list[int]", types: "list[KVType]", *, lengths: "tuple[int, ...]",
              gen: int = SPEED_GEN, reps: int = SPEED_REPS, cache: ResultCache,
              say: Callable[[str], None], rotation: "Callable[[KVType], bool] | None" = None) -> list[dict]:
    """Prompt tokens/s (one batch of ``length`` tokens into an empty cache) and decode tokens/s (``gen``
    single-token steps after it), per type and length; the repetitions run type after type, then again,
    so a machine's slow minute falls on every type alike. Median and min..max per cell."""
    from tqbridge.parity.harness.runtimes import KV

    key = f"speed-{reps}x{gen}-" + "-".join(map(str, lengths))
    got = cache.get(key, "all")
    if got is not None:
        return got["rows"]
    need = max(lengths) + gen
    if len(ids) < need:
        raise EvidenceError(f"the text has {len(ids)} tokens, fewer than the {need} the speed runs need")
    samples: dict[tuple[str, int], dict[str, list[float]]] = {}
    for rep in range(reps):
        for length in lengths:
            for kv in types:
                say(f"[speed rep {rep + 1}/{reps}] {kv.name} at {length} tokens")
                if rotation is not None:
                    _rotate(rotation(kv), runtime)
                pp_s, tg_s = runtime.time_prompt_decode(ids[:length + gen], KV(kv.k, kv.v), length)
                s = samples.setdefault((kv.name, length), {"pp": [], "tg": []})
                s["pp"].append(length / pp_s)
                s["tg"].append(gen / tg_s)
    rows = []
    for (name, length), s in samples.items():
        rows.append({"kv": name, "prompt_tokens": length, "decode_tokens": gen, "reps": reps,
                     "pp_tps_median": statistics.median(s["pp"]), "pp_tps_min": min(s["pp"]),
                     "pp_tps_max": max(s["pp"]), "tg_tps_median": statistics.median(s["tg"]),
                     "tg_tps_min": min(s["tg"]), "tg_tps_max": max(s["tg"])})
    cache.put(key, "all", {"rows": rows})
    return rows


# ---- 3. kernel cases ------------------------------------------------------------------------------------

def build_flash_attn(q: np.ndarray, kb: np.ndarray, vb: np.ndarray, kf, vf, *, scale: float,
                     softcap: float, kv: "KVType | None" = None, visible: "np.ndarray | None" = None) -> np.ndarray:
    """The build's ``flash_attn_ext`` (this process's llama.cpp side, its ggml CPU backend) on one problem:
    q (Hq, D); blocks (Hkv, n, row_bytes); ``visible``: None or the keys q sees, (n,) booleans (ggml's
    mask); returns (Hq, D)."""
    from tqbridge.bridge.llama.ggml_graph import flash_attn_ext
    from tqbridge.parity.harness.level_attention import fork_flash_attn, fork_has

    if "ggml" in kf.type_ids and "ggml" in vf.type_ids:
        return flash_attn_ext(q[:, None, :], kb, vb, k_type=kf.type_ids["ggml"], v_type=vf.type_ids["ggml"],
                              scale=scale, softcap=softcap, visible=None if visible is None else visible[None, :])[0]
    if fork_has(kf) and fork_has(vf):
        return fork_flash_attn(q, kb, vb, kf, vf, scale=scale, softcap=softcap, visible=visible)
    raise EvidenceError(f"{kf.key}/{vf.key}: this llama.cpp build has no flash_attn_ext for these types")


@dataclass(frozen=True)
class KernelCase:
    kv: KVType
    head_dim: int
    q_heads: int
    kv_heads: int
    keys: int
    softcap: float = 0.0
    window: int = 0       # the last ``window`` keys visible (0: all)
    start: int = 0        # keys before ``start`` hidden (a left padding)

    @property
    def id(self) -> str:
        cap = f"-softcap{self.softcap:g}" if self.softcap else ""
        win = f"-win{self.window}" if self.window else ""
        start = f"-start{self.start}" if self.start else ""
        return f"{self.kv.name}:d{self.head_dim}-h{self.q_heads}x{self.kv_heads}-n{self.keys}{cap}{win}{start}"

    def visible(self) -> "np.ndarray | None":
        """The keys the query sees, (keys,) booleans, or None where it sees all (no mask)."""
        if not (self.window or self.start):
            return None
        pos = np.arange(self.keys)
        lo = max(self.start, self.keys - self.window) if self.window else self.start
        return pos >= lo


def kernel_cases(types: "Iterable[KVType]") -> list[KernelCase]:
    out = []
    for kv in types:
        for d in KERNEL_HEAD_DIMS:
            for hq, hkv in KERNEL_HEADS:
                for n in KERNEL_LENGTHS:
                    out.append(KernelCase(kv, d, hq, hkv, n))
        out.append(KernelCase(kv, 128, 8, 2, 256, KERNEL_SOFTCAP))
        out.append(KernelCase(kv, 128, 8, 2, 512, window=KERNEL_WINDOW))
        out.append(KernelCase(kv, 128, 8, 2, 512, start=KERNEL_START))
    return out


def parse_case_id(case_id: str) -> KernelCase:
    """The case a :attr:`KernelCase.id` names (``--case ID``)."""
    import re

    m = re.fullmatch(r"(.+):d(\d+)-h(\d+)x(\d+)-n(\d+)(?:-softcap([0-9.]+))?(?:-win(\d+))?(?:-start(\d+))?",
                     case_id.strip())
    if not m:
        raise EvidenceError(f"{case_id!r} is not a kernel case id (like q8_0:d128-h8x2-n512)")
    kv = parse_kv(m.group(1))
    d, hq, hkv, n = (int(m.group(i)) for i in range(2, 6))
    window, start = int(m.group(7) or 0), int(m.group(8) or 0)
    if hq % hkv or d <= 0 or n <= 0:
        raise EvidenceError(f"{case_id!r}: q heads must be a multiple of kv heads, sizes positive")
    if start >= n:
        raise EvidenceError(f"{case_id!r}: the start hides every key (start {start} of {n})")
    return KernelCase(kv, d, hq, hkv, n, float(m.group(6) or 0.0), window, start)


def run_case(case: KernelCase, *, flash_attn=build_flash_attn, runtime=None, seed: int = 0) -> dict[str, Any]:
    """One case: NMSE of the build's output and of our kernel (CPU emulator) against the float64 oracle,
    and of the build's against ours (test-backend-ops' comparison of two backends)."""
    from tqbridge.parity.harness.level_attention import judge_ours, random_problem

    kf, vf = format_of(runtime, case.kv.k), format_of(runtime, case.kv.v)
    q, kb, vb = random_problem(kf.key, vf.key, q_heads=case.q_heads, kv_heads=case.kv_heads,
                               keys=case.keys, head_dim=case.head_dim, seed=seed)
    scale = 1.0 / np.sqrt(case.head_dim)
    build = np.asarray(flash_attn(q, kb, vb, kf, vf, scale=scale, softcap=case.softcap, kv=case.kv,
                                  visible=case.visible()), np.float64)
    ours, others = judge_ours(q[None], kb[None], vb[None], k_format=kf, v_format=vf, length=case.keys,
                              scale=scale, softcap=case.softcap or None, window=case.window or None,
                              start=case.start, backends=("cpu-emulator",), compare={"build": build})
    o = ours["cpu-emulator"]
    b = others["build"]
    row = {"id": case.id, "kv": case.kv.name, "head_dim": case.head_dim, "q_heads": case.q_heads,
           "kv_heads": case.kv_heads, "keys": case.keys, "softcap": case.softcap, "window": case.window,
           "start": case.start,
           "nmse_build_vs_ours": o["vs_build"]["nmse"], "nmse_build_vs_oracle": b["nmse"],
           "nmse_ours_vs_oracle": o["nmse"], "ours_within_oracle_bound": o["within_bound"],
           "build_oracle_bound_ratio": b["bound_ratio"], "bar": NMSE_BAR}
    row["passed"] = bool(row["nmse_build_vs_ours"] <= NMSE_BAR and row["nmse_build_vs_oracle"] <= NMSE_BAR
                         and o["within_bound"])
    return row


def _kernel_refusals() -> tuple[type, ...]:
    """ggml refusing a graph (a type or shape its flash_attn_ext does not take)."""
    from tqbridge.bridge.llama.ggml_graph import GgmlGraphError

    return (GgmlGraphError,)


def run_kernels(types: "list[KVType]", *, flash_attn=build_flash_attn, runtime=None, cache: ResultCache,
                say: Callable[[str], None], only: "str | None" = None) -> list[dict]:
    cases = [parse_case_id(only)] if only else kernel_cases(types)
    rows = []
    for i, case in enumerate(cases):
        got = cache.get("kernel", hashlib.sha256(case.id.encode()).hexdigest()[:16]) if not only else None
        if got is None:
            say(f"[kernel {i + 1}/{len(cases)}] {case.id}")
            try:
                got = run_case(case, flash_attn=flash_attn, runtime=runtime)
            except (EvidenceError, *_kernel_refusals()) as e:
                got = {"id": case.id, "kv": case.kv.name, "skipped": str(e)}
            if not only:
                cache.put("kernel", hashlib.sha256(case.id.encode()).hexdigest()[:16], got)
        rows.append(got)
    return rows


# ---- 4. the MLX side ------------------------------------------------------------------------------------

MLX_LEVELS = ("attention", "teacher")
MLX_LEVEL_TOKENS = 32     # teacher's prompt: as `tqbridge parity --tokens 32`


def run_mlx_side(types: "list[KVType]", *, cache: ResultCache, say: Callable[[str], None],
                 variant: "str | None" = None, model: "Path | None" = None,
                 rotation: "Callable[[KVType], bool] | None" = None) -> dict:
    """The parity levels for the same types against the same build. Blocks: tqbridge's quantizers and
    kernels' decoders byte for byte against the build's ggml (turbo types against the fork build's own
    decode), every format of the types. With ``model``: attention (our kernels and the build's arithmetic on
    random problems of each pair, against the float64 oracle) and teacher (the build's own per-layer K/V/q
    rows of ``model`` through tqbridge's kernels), each type with its KV rotation. The logits level is
    the ``vs_tqbridge`` KLD of :func:`run_quality`."""
    out = cache.get("mlx", "blocks")
    if out is None:
        from tqbridge.parity.harness.level_blocks import run_blocks_level

        fmts = sorted({qualify_variant(f, variant) for kv in types for f in (kv.k, kv.v)} - {"f16", "f32", "bf16"})
        say(f"[mlx] blocks level: {', '.join(fmts)}")
        blocks = run_blocks_level(fmts, kernel_backends=("cpu-emulator",))
        out = {"blocks": {"passed": blocks["passed"],
                          "formats": [{"format": e.get("format"), "passed": e.get("passed"), "summary": _brief(e)}
                                      for e in blocks["formats"]]}}
        cache.put("mlx", "blocks", out)
    if model is None:
        return out
    from tqbridge.parity.harness.run_levels import RunOptions, run_levels

    quantized = [kv for kv in types if kv.name != NATIVE]
    groups: dict[bool, list[KVType]] = {}
    for kv in quantized:
        groups.setdefault(rotation(kv) if rotation is not None else True, []).append(kv)
    levels = []
    for rotated, kvs in groups.items():
        key = hashlib.sha256(json.dumps([rotated, [k.name for k in kvs]]).encode()).hexdigest()[:16]
        got = cache.get("mlx-levels", key)
        if got is None:
            lines: list[str] = []
            say(f"[mlx] {', '.join(MLX_LEVELS)} levels, KV rotation {'on' if rotated else 'off'}: "
                f"{', '.join(k.name for k in kvs)}")
            run = run_levels(model, [k.name for k in kvs], list(MLX_LEVELS),
                             RunOptions(tokens=MLX_LEVEL_TOKENS, decode=4, rotation=rotated), say=say,
                             emit=lines.append, warn=lines.append)
            got = {"kv": [k.name for k in kvs], "kv_rotation": rotated, "verdicts": run.verdicts, "lines": lines}
            cache.put("mlx-levels", key, got)
        levels.append(got)
    return {**out, "levels": levels}


def _brief(entry: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in entry.items() if isinstance(v, (bool, int, str)) and k != "format")[:200]


# ---- everything -----------------------------------------------------------------------------------------

@dataclass
class Evidence:
    settings: dict
    types: list[str]
    quality: dict = field(default_factory=dict)
    speed: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    mlx: "dict | None" = None
    llama_perplexity: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"settings": self.settings, "types": self.types, "quality": self.quality, "speed": self.speed,
                "kernels": self.kernels, "mlx": self.mlx, "llama_perplexity": self.llama_perplexity, "info": self.info}


def text_tokens(runtime, text: str) -> tuple[list[int], "int | None"]:
    """The text's tokens as llama-perplexity gets them (special tokens added as the vocabulary says) and
    the BOS id when the vocabulary adds one (read off an empty text's tokens)."""
    ids = runtime.tokenize(text, True)
    empty = runtime.tokenize("", True)
    return ids, (int(empty[0]) if empty else None)


def run_evidence(runtime, *, requested: "list[str]", text: str, text_source: str, n_ctx: int, n_chunks: int,
                 baseline: str = BASELINE, out: "Path | None" = None, settings_extra: "dict | None" = None,
                 parts: "Iterable[str]" = ("quality", "speed", "kernels", "mlx"),
                 speed_lengths: "tuple[int, ...] | None" = None, flash_attn=build_flash_attn,
                 mlx_side: "Callable[..., dict] | None" = None, available: "Iterable[str] | None" = None,
                 only_case: "str | None" = None, twin=None, speed_reps: int = SPEED_REPS,
                 rotation: "Callable[[KVType], bool] | None" = None, perplexity: "tuple[Path, Path] | None" = None,
                 progress: "Callable[[str], None] | None" = None) -> Evidence:
    say = progress or (lambda msg: None)
    parts = tuple(parts)
    types = plan_types(requested, baseline, available)
    base = parse_kv(baseline)
    ids, bos = text_tokens(runtime, text)
    chunks = chunk_tokens(ids, n_ctx, n_chunks, bos)
    settings = {"text": text_source, "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "text_tokens": len(ids), "ctx": n_ctx, "chunks": len(chunks), "bos": bos,
                "baseline": base.name, **(settings_extra or {})}
    cache = ResultCache(out, settings)
    ev = Evidence(settings=settings, types=[t.name for t in types])
    t0 = time.perf_counter()
    if "quality" in parts:
        ev.quality = run_quality(runtime, chunks, types, baseline=base, cache=cache, say=say,
                                 twin=twin if "mlx" in parts else None, rotation=rotation)
        if perplexity is not None:     # (the build's llama-perplexity, the model file)
            ev.llama_perplexity = run_llama_perplexity(
                perplexity[0], perplexity[1], text, types, n_ctx=n_ctx, n_chunks=len(chunks),
                threads=getattr(runtime, "n_threads", 1), rotation=rotation, cache=cache, say=say, quality=ev.quality)
    if "speed" in parts:
        lengths = speed_lengths or (max(16, n_ctx // 4), n_ctx)
        runs = [t for t in types if "refused" not in ev.quality.get(t.name, {})]
        ev.speed = run_speed(runtime, ids, runs, lengths=lengths, reps=speed_reps, cache=cache, say=say,
                             rotation=rotation)
    if "kernels" in parts:
        ev.kernels = run_kernels(types, flash_attn=flash_attn, runtime=runtime, cache=cache, say=say, only=only_case)
    if "mlx" in parts and mlx_side is not None:   # the types the build runs (those it refused: in quality)
        ev.mlx = mlx_side([t for t in types if "refused" not in ev.quality.get(t.name, {})], cache=cache, say=say)
    ev.info["seconds"] = round(time.perf_counter() - t0, 1)
    return ev
