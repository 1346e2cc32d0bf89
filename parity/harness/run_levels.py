"""The parity levels as one run, and their verdicts: what ``tqbridge parity`` and ``tqbridge demo`` do
between parsing their arguments and printing.

Every level ends in one of three verdicts: its claims hold (``passed`` True), a claim failed (False),
or it could not judge (None, with ``why``: one line; an exception inside a level is caught and named,
never a traceback). The run's exit code follows from them (:func:`exit_code`):

- ``EXIT_HOLD`` (0): every level that ran holds;
- ``EXIT_FAILED`` (1): at least one claim failed (whatever else could not judge);
- ``EXIT_USAGE`` (2): bad input, refused before any level ran (the CLI's CliError);
- ``EXIT_UNJUDGED`` (3): no claim failed, but at least one level could not judge.

Against a llama.cpp build that stores other cache types than asked (the TurboQuant fork's rules,
:mod:`tqbridge.bridge.llama.stored_kv`), the types are first read from the build (:func:`probe_stored`):
by default tqbridge's caches store what the build stored, layer by layer, and the reports name the
stored types beside the request; ``fork_rules="off"`` switches the fork's rules off for the run
instead (its environment variables, set before the first context).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from tqbridge.bridge.blocks.kv_spec import DEFAULT_FORMAT, kv_name, qualify_variant

LEVELS = ("blocks", "attention", "logits", "cache", "teacher", "lane", "transplant")
# teacher belongs in every default: the default levels without it let through 5 of 7 planted MLX-side bugs
DEFAULT_LEVELS = ("blocks", "attention", "logits", "teacher")
# The default K/V matrix against a TurboQuant fork build: the configurations the port exists for.
FORK_KV = ("f16", "q8_0/turbo3", "q8_0/turbo4", "turbo3", "turbo4")

EXIT_HOLD, EXIT_FAILED, EXIT_USAGE, EXIT_UNJUDGED = 0, 1, 2, 3
EXIT_CODES_HELP = ("exit codes: 0 every level that ran holds; 1 a parity claim failed; 2 bad input (nothing ran); "
                   "3 no claim failed but a level could not judge (its line says why)")
FORK_RULES = ("honour", "off")


class CannotJudge(Exception):
    """A level cannot judge this input; the message is one line saying why."""


@dataclass
class RunOptions:
    """What the levels take from the command line."""

    tokens: int = 256
    decode: int = 16
    exact_weights: bool = False
    rotation: bool = True
    teacher_backends: tuple = ("reference", "cpu-emulator")
    fork_rules: str = "honour"


def qualify_turbo(spec: str, variant: str) -> str:
    """``q8_0/turbo3`` -> ``q8_0/turbo3@VARIANT``: a bare turbo name means the fork build's variant
    (ValueError for a spelling that is not a K/V pair)."""
    from tqbridge.parity.harness.runtimes import KV

    kv = KV.parse(spec)
    return kv_name(qualify_variant(kv.k, variant), qualify_variant(kv.v, variant), short=True)


def parse_levels(spec: str) -> "list[str]":
    """``blocks,teacher`` or ``all`` -> the levels in run order (ValueError naming the unknown ones)."""
    names = [x.strip().lower() for x in spec.split(",") if x.strip()]
    if names == ["all"]:
        return list(LEVELS)
    bad = [n for n in names if n not in LEVELS]
    if bad or not names:
        raise ValueError(f"unknown level(s) {', '.join(bad) or '(none)'}; choose from {', '.join(LEVELS)} or 'all'")
    return [n for n in LEVELS if n in names]


def one_line(e: BaseException) -> str:
    """An exception as one line: its message's first line, with its class when that says more."""
    text = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, CannotJudge):
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# ---------------------------------------------------------------------------------------------
# verdicts


def level_verdicts(levels: "list[str]", extra: dict, logits_passed: "bool | None" = None) -> "list[dict]":
    """One ``{"level", "passed"}`` per level that ran, in ``levels`` order (``passed`` None, with
    ``why``, where the level could not judge or left no verdict)."""
    out = []
    for name in levels:
        rep = extra.get(name) or {}
        ok = logits_passed if name == "logits" and "passed" not in rep else rep.get("passed")
        v: dict[str, Any] = {"level": name, "passed": None if ok is None else bool(ok)}
        if ok is None:
            v["why"] = rep.get("why") or "the level left no verdict"
        out.append(v)
    return out


def exit_code(verdicts: "list[dict]") -> int:
    """EXIT_FAILED if a claim failed, else EXIT_UNJUDGED if a level could not judge, else EXIT_HOLD."""
    if any(v["passed"] is False for v in verdicts):
        return EXIT_FAILED
    if any(v["passed"] is None for v in verdicts):
        return EXIT_UNJUDGED
    return EXIT_HOLD


def verdict_line(verdicts: "list[dict]") -> str:
    """The last line of the human output: every level holds, which failed, which could not judge."""
    failed = [v["level"] for v in verdicts if v["passed"] is False]
    unjudged = [v["level"] for v in verdicts if v["passed"] is None]
    held = [v["level"] for v in verdicts if v["passed"]]
    if not failed and not unjudged:
        return f"all claims hold: {', '.join(held)}"
    parts = []
    if unjudged:
        parts.append(f"could not judge: {', '.join(unjudged)}")
    if held:
        parts.append(f"held: {', '.join(held)}")
    if failed:
        return f"a parity claim FAILED: {', '.join(failed)}" + (f" ({'; '.join(parts)})" if parts else "")
    return f"no claim failed, but {parts[0]}" + (f" ({parts[1]})" if len(parts) > 1 else "")


def transplant_verdict(rep: dict, n_new: int) -> None:
    """The transplant level's claims, written into its report: f16 greedy tokens agree llama.cpp ->
    MLX for all ``n_new`` steps; a turbo pair's blob passes through TQCache byte for byte and llama.cpp
    takes MLX's blob back (greedy agreement of a quantized cache is information)."""
    rep["passed"] = rep["forward_agree"] == n_new
    t = rep.get("turbo")
    if t is not None:
        t["passed"] = bool(t["blob_round_trip_bytes_equal"] and "llama_from_mlx_state" in t)
        rep["passed"] = rep["passed"] and t["passed"]


# ---------------------------------------------------------------------------------------------
# what the build stores, and its log


class LlamaLog:
    """llama.cpp's log lines of this run (a ``--llama`` build's, through tqbridge's shim): warnings and
    errors, and the fork's type-change lines, each kept once with a count and the levels that saw it."""

    def __init__(self):
        self.lines: "dict[tuple[str, str], dict]" = {}

    def take(self, where: str) -> "list[dict]":
        """Drain the shim's log; returns the entries first seen now (for printing)."""
        from tqbridge.bridge.llama.side import selected
        from tqbridge.bridge.llama.shim import Shim
        from tqbridge.bridge.llama.stored_kv import RULE_LOG_MARKERS

        info = selected()
        if info is None:
            return []
        try:
            raw = Shim.for_build(info).take_log()
        except Exception:   # a shim without the log functions (compiled before them): nothing to add
            return []
        new = []
        for level, text in raw:
            rule = any(m in text for m in RULE_LOG_MARKERS)
            if level not in ("warn", "error") and not rule:
                continue
            key = (level, text.strip())
            e = self.lines.get(key)
            if e is None:
                e = self.lines[key] = {"level": level, "text": text.strip(), "count": 0, "seen_in": [],
                                       "type_change": rule}
                new.append(e)
            e["count"] += 1
            if where not in e["seen_in"]:
                e["seen_in"].append(where)
        return new

    def to_json(self) -> "list[dict]":
        return list(self.lines.values())


def probe_stored(path, kv_list: "list[str]", rotation: bool) -> "dict[str, dict]":
    """What the selected build stores for each K/V pair, per layer: one context per pair on two tokens,
    its state blob read back (:func:`tqbridge.bridge.llama.stored_kv.read_stored`). Empty without a build."""
    from tqbridge.bridge.llama.side import selected
    from tqbridge.bridge.llama.stored_kv import read_stored
    from tqbridge.parity.harness.runtimes import KV, LlamaCppRuntime

    if selected() is None:
        return {}
    rt = LlamaCppRuntime(path, rotation=rotation)
    toks = (rt.tokenize("The cache") + [0, 1])[:2]
    out = {}
    for spec in kv_list:
        kv = KV.parse(spec)
        rt.logits(toks, kv, keep_state=True)
        try:
            out[kv.name] = read_stored(rt.last_state, kv.name, path).to_json()
        except Exception as e:   # e.g. an iSWA model (several cache records): the levels read it themselves
            out[kv.name] = {"requested": kv.name, "why": one_line(e)}
    return out


def stored_lines(stored: "dict[str, dict]") -> "list[str]":
    lines = []
    for name, s in stored.items():
        if s.get("changed"):
            lines.append(f"{name}: the build stores {s['stored']}; " + "; ".join(s["rules"]))
    return lines


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class LevelRun:
    """What :func:`run_levels` returns: the report's parts, the verdicts and the exit code."""

    report: dict = field(default_factory=dict)
    verdicts: list = field(default_factory=list)
    logits: Any = None          # level_logits.LogitsResult, when the level ran and judged

    @property
    def passed(self) -> bool:
        return exit_code(self.verdicts) == EXIT_HOLD

    @property
    def code(self) -> int:
        return exit_code(self.verdicts)


def run_levels(path, kv_list: "list[str]", levels: "list[str]", opts: RunOptions, *,
               say: Callable[[str], None] = lambda m: None, emit: Callable[[str], None] = print,
               warn: Callable[[str], None] = lambda m: None) -> LevelRun:
    """Run ``levels`` on the model at ``path`` for the K/V pairs ``kv_list``. ``emit`` gets the human
    lines of each level as it finishes, ``warn`` llama.cpp's warnings and the fork's type changes (once
    each; every warning goes to the report), ``say`` progress. A level that raises is recorded as could-not-judge with one line."""
    log = LlamaLog()
    out: dict = {}

    def drain(where):
        for e in log.take(where):
            if e["type_change"]:   # the fork's own notice that it changed the cache types
                warn(f"llama.cpp ({e['level']}): {e['text']}")

    stored: dict = {}
    if any(x in levels for x in ("logits", "cache", "teacher", "transplant")):
        try:
            say("reading the cache types the llama.cpp build stores")
            stored = probe_stored(path, kv_list, opts.rotation)
        except Exception as e:
            stored = {"why": one_line(e)}
        drain("stored types")
        read = {k: v for k, v in stored.items() if isinstance(v, dict) and "stored" in v}
        lines = stored_lines(read)
        for line in lines:
            emit(f"stored types: {line}" + (" (compared as stored)" if opts.fork_rules == "honour" else ""))
        unread = [f"{k}: {v['why']}" if isinstance(v, dict) else v for k, v in stored.items() if k not in read]
        for why in unread:   # the levels read the types themselves
            emit(f"stored types: not read before the levels ({why})")
        if read and not lines and not unread:
            emit(f"stored types: every layer as asked, for all {len(read)} K/V pairs"
                 + (" (the fork's rules off)" if opts.fork_rules == "off" else ""))
    logits_res = None
    shared: dict = {}
    for name in levels:
        try:
            if name == "logits":
                logits_res, rep = _logits(path, kv_list, opts, say)
            else:
                rep = _LEVELS[name](path, kv_list, opts, say, shared)
            out[name] = rep
            for line in rep.pop("_lines", []):
                emit(line)
        except Exception as e:   # the level cannot judge: one line, and the run goes on
            why = one_line(e)
            out[name] = {"passed": None, "why": why, "traceback": traceback.format_exc(limit=8)}
            emit(f"{name}: could not judge: {why}")
        drain(name)
    verdicts = level_verdicts(levels, out, None if logits_res is None else logits_res.passed)
    report = {"levels": levels, "fork_rules": opts.fork_rules, "stored_types": stored}
    if logits_res is not None:
        report.update(info=logits_res.info, logits=logits_res.rows)
    report.update({k: v for k, v in out.items() if k != "logits" or logits_res is None})
    report["llama_log"] = log.to_json()
    report.update(verdicts=verdicts, passed=exit_code(verdicts) == EXIT_HOLD, exit_code=exit_code(verdicts))
    return LevelRun(report=report, verdicts=verdicts, logits=logits_res)


def _logits(path, kv_list, opts: RunOptions, say):
    from tqbridge.parity.harness import level_logits

    res = level_logits.run_logits(path, kv_list, n_tokens=opts.tokens, exact_weights=opts.exact_weights,
                                  rotation=opts.rotation, progress=say, decode=opts.decode)
    return res, {"passed": res.passed}


def _blocks(path, kv_list, opts, say, shared) -> dict:
    from tqbridge.parity.harness.level_blocks import run_blocks_level, summary_lines

    say("blocks: ggml's C vs numpy, MLX and the append kernel")
    rep = run_blocks_level()
    rep["_lines"] = [f"blocks: {'identical' if rep['passed'] else 'DIFFER'}"] + ["  " + x for x in summary_lines(rep)]
    return rep


def _attention(path, kv_list, opts, say, shared) -> dict:
    from tqbridge.parity.harness.level_attention import run_attention_level, summary_lines as attention_lines
    from tqbridge.parity.harness.runtimes import KV

    say("attention: our decode kernel vs ggml's flash_attn_ext vs float64")
    pairs = [KV.parse(s).k + "/" + KV.parse(s).v for s in kv_list]
    rep = run_attention_level(pairs)
    worst = max(e["bound_ratio"] for c in rep["cases"] for e in c["ours"].values())
    ggml = max((c["ggml_vs_oracle"]["nmse"] for c in rep["cases"] if c["ggml_vs_oracle"]), default=0.0)
    arith = [c["llama_arith_vs_ggml"] for c in rep["cases"] if c.get("llama_arith_vs_ggml")]
    arith_text = ""
    if arith:
        arith_text = (f"; ggml recomputed with its own arithmetic, {max(a['bound_ratio'] for a in arith):.2g}x "
                      "the derived bound" + ("" if all(a["passed"] for a in arith) else " (OVER it)"))
    lines = [f"attention: {'within' if rep['passed'] else 'OUTSIDE'} the float64 oracle's bound on "
             f"{len(rep['cases'])} cases (worst {worst:.2g}x the bound; ggml's own NMSE up to {ggml:.1e}"
             f"{arith_text}; information)"]
    if not rep["passed"]:
        lines += ["  " + x for x in attention_lines(rep) if "OUTSIDE" in x]
    rep["_lines"] = lines
    return rep


def _inputs(path, opts, say, shared) -> dict:
    """The exact-weights copy and the tokens the cache-reading levels share (made once)."""
    if "f32" not in shared:
        from tqbridge.bridge.gguf.f32 import cached_f32_gguf
        from tqbridge.parity.harness.level_logits import parity_text
        from tqbridge.parity.harness.runtimes import LlamaCppRuntime

        say("exact weights for the cache levels: F32 copy (cached)")
        f32 = cached_f32_gguf(path)
        text_ids = LlamaCppRuntime(f32).tokenize(parity_text()[0])
        shared.update(f32=f32, text_ids=text_ids, tokens=text_ids[: opts.tokens])
    return shared


def _cache(path, kv_list, opts, say, shared) -> dict:
    from tqbridge.parity.harness.level_cache import run_cache_level, summary_lines as cache_lines
    from tqbridge.parity.harness.runtimes import KV

    s = _inputs(path, opts, say, shared)
    say("cache: llama.cpp's cache bytes vs tqbridge's")
    quantized = [x for x in kv_list if not KV.parse(x).is_float] or [DEFAULT_FORMAT]
    rep = run_cache_level(str(s["f32"]), s["tokens"], quantized, rotation=False, runtimes=quantized[:1])
    rep["_lines"] = [f"cache: layer-0 bytes {'identical' if rep['passed'] else 'DIFFER'}"] + \
        ["  " + x for x in cache_lines(rep)]
    return rep


def _teacher(path, kv_list, opts, say, shared) -> dict:
    from tqbridge.parity.harness.level_teacher import run_teacher, summary_lines as teacher_lines
    from tqbridge.parity.harness.runtimes import KV

    s = _inputs(path, opts, say, shared)
    say("teacher forcing: llama.cpp's own rows through tqbridge, layer by layer")
    specs = [KV.parse(x).name for x in kv_list]
    rep = run_teacher(str(s["f32"]), s["tokens"], specs, decode=min(4, opts.decode), rotation=opts.rotation,
                      backends=opts.teacher_backends, progress=say)
    rep["_lines"] = [f"teacher: {'every layer holds' if rep['passed'] else 'a layer FAILED'} "
                     f"({len(specs)} K/V pairs, {rep['tokens']} tokens, {rep['decode']} decode steps)"] + \
        ["  " + x for x in teacher_lines(rep)]
    return rep


def _lane(path, kv_list, opts, say, shared) -> dict:
    from tqbridge.parity.harness.level_lane import LANE_TOKENS, run_lane, summary_lines as lane_lines
    from tqbridge.parity.harness.runtimes import KV

    s = _inputs(path, opts, say, shared)
    say("lane: the GPU decode lane on the CPU emulator, layer by layer")
    # one K/V pair, as the cache level: the lane's bookkeeping does not depend on the format
    pair = next((x for x in kv_list if not KV.parse(x).is_float), kv_list[0])
    rep = run_lane(str(s["f32"]), s["text_ids"][:LANE_TOKENS], pair, rotation=opts.rotation, progress=say)
    rep["_lines"] = [f"lane: {'every layer and decode step holds' if rep['passed'] else 'a claim FAILED'} "
                     f"({rep['kv']}, {rep['decode']} decode steps, {rep['slides']} window slides, {rep['seconds']} s)"] + \
        ["  " + x for x in lane_lines(rep)]
    return rep


TRANSPLANT_NEW = 16   # greedy tokens decoded after the transplant, each way


def _transplant(path, kv_list, opts, say, shared) -> dict:
    from tqbridge.parity.harness.transplant import run_transplant

    s = _inputs(path, opts, say, shared)
    say("transplant: llama.cpp prefill -> MLX decode, and back")
    n_new = TRANSPLANT_NEW
    rep = run_transplant(str(s["f32"]), s["tokens"][:64], "f16", n_new=n_new, rotation=opts.rotation)
    lines = [f"transplant (f16): {rep['forward_agree']}/{n_new} greedy tokens agree llama.cpp -> MLX, "
             f"{rep.get('reverse_agree', '-')}/{n_new} MLX -> llama.cpp"]
    turbo = next((x for x in kv_list if "turbo" in x), None)
    if turbo is not None:   # a fork build: its turbo blob into TQCache unchanged, and back
        say(f"transplant: {turbo}")
        rep["turbo"] = t = run_transplant(str(s["f32"]), s["tokens"][:64], turbo, n_new=n_new, rotation=opts.rotation)
    transplant_verdict(rep, n_new)
    if turbo is not None:
        asked = f" (asked {t['requested']})" if t.get("stored") else ""
        lines.append(f"transplant ({t['kv']}{asked}): the fork's blob through TQCache and back "
                     f"{'byte-identical' if t['blob_round_trip_bytes_equal'] else 'DIFFERS'}; "
                     f"{t['forward_agree']}/{n_new} greedy tokens agree fork -> MLX, "
                     f"{t.get('reverse_agree', '-')}/{n_new} MLX -> fork (information)")
    rep["_lines"] = lines
    return rep


_LEVELS = {"blocks": _blocks, "attention": _attention, "cache": _cache, "teacher": _teacher, "lane": _lane,
           "transplant": _transplant}
