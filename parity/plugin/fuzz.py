"""Fuzz campaigns: tqbridge's own kernels or a user's, over several processes, with a persistent
example database, a progress line and a summary.

Kernel targets (this module): ``quantize`` (MLX codecs vs the numpy reference, bytes), ``dequantize`` (same, values),
``append`` (the quantize-on-append kernel on a backend, bytes), ``decode-attention`` (the fused kernel
on a backend vs the float64 oracle and its bound), or ``module:function`` (a user's callable; its op
and formats come from :func:`tqbridge.parity.plugin.byok.claims` or from the caller).

Each worker process runs rounds of :func:`tqbridge.parity.plugin.byok.fuzz_kernel` with its own seed
against one shared :class:`hypothesis.database.DirectoryBasedExampleDatabase` (one file per example,
safe for concurrent writers), so a counterexample found once is replayed first by every later run.
With ``db="redis://HOST:PORT"`` the examples also go to that Redis server (hypothesis'
``RedisExampleDatabase``), so campaigns on several machines replay each other's failures.
The first counterexample stops the campaign.

Parser targets (``gguf``, ``state-blob``, ``prompt-cache``, ``kv-spelling``) are mutation campaigns
against the file parsers: :mod:`tqbridge.parity.plugin.parsers`.
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

OUR_TARGETS = ("quantize", "dequantize", "append", "decode-attention")
from .parsers.named_targets import PARSER_TARGETS  # noqa: E402 - mutation campaigns against the file parsers
from .campaigns import (check_budget, check_shared_db, db_path, default_db_root, example_database,  # noqa: E402
                        hypothesis_home, is_shared_db)
from .profiles import EXAMPLES as PROFILES  # noqa: E402 - examples per campaign when --examples is not given
ROUND = 25                                            # examples per round when the campaign is timed
GRACE_S = 5.0                                         # after a counterexample, how long other workers may finish


class FuzzError(ValueError):
    """A campaign cannot start (unknown target, bad claim); one line says why."""


# ----------------------------------------------------------------------------------- targets


def _np(a):
    from ...metal.attention.problem import to_numpy

    return to_numpy(a)


def _int8_mma_refuses(q, k_blocks, v_blocks, kw) -> bool:
    """Whether kernel int8-mma (int8 q) cannot serve this call (a malformed call: False, and the call raises)."""
    from ...metal.attention import check_problem
    from ...metal.attention.plan import int8_mma_refusal

    try:
        return int8_mma_refusal(check_problem(q, k_blocks, v_blocks, **kw)) is not None
    except Exception:   # the call itself then raises its own error, as it would without the option
        return False


def our_target(name: str, backend: str, q_precision: "str | None" = None):
    """``(fn, claim)`` of one of tqbridge's own kernels; ``fn`` carries its claim and the source line
    that rebuilds it (for counterexample snippets)."""
    from ... import bridge
    from .byok import make_claim

    if name == "quantize":
        fn, claim = (lambda x, fmt: _np(bridge.mlx_quantize(fmt, x))), make_claim("quantize")
    elif name == "dequantize":
        fn, claim = (lambda b, n, fmt: _np(bridge.mlx_dequantize(fmt, b, n))), make_claim("dequantize")
    elif name == "append":
        from ...metal import quantize_append

        fn, claim = (lambda rows, fmt: _np(quantize_append(fmt, rows, backend=backend))), make_claim("append")
    elif name == "decode-attention":
        from ...metal.attention import decode_attention, last_run

        def fn(q, k_blocks, v_blocks, **kw):
            qp = {} if q_precision is None else {"q_precision": q_precision}
            if q_precision == "int8" and _int8_mma_refuses(q, k_blocks, v_blocks, kw):
                qp = {}   # "int8 wherever int8-mma serves the pair": the rest keep the backend's default
            return _np(decode_attention(q, k_blocks, v_blocks, backend=backend, **qp, **kw))

        claim = make_claim("decode-attention", chain=lambda: last_run().get("chain"),
                           q_precision=lambda: last_run().get("q_precision", "exact"), starts=True)
    else:
        raise FuzzError(f"unknown target {name!r}: use one of {', '.join(OUR_TARGETS + PARSER_TARGETS)} or module:function")
    fn.__tqbridge_claim__ = claim
    args = f"{name!r}, {backend!r}" + (f", q_precision={q_precision!r}" if q_precision is not None else "")
    fn.__tqbridge_source__ = f"from tqbridge.parity.plugin.fuzz import our_target\nfn, _ = our_target({args})\n"
    return fn, claim


def user_target(spec: str, op: "str | None", fmt: "list[str] | None", k_format: "list[str] | None",
                v_format: "list[str] | None"):
    """``(fn, claim)`` for ``module:function`` (the module importable from the current directory)."""
    from .byok import KernelClaimError, make_claim

    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise FuzzError(f"target {spec!r}: write module:function, e.g. mykernels:dequantize_q4_0")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise FuzzError(f"target {spec!r}: cannot import {mod_name}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FuzzError(f"target {spec!r}: {mod_name} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FuzzError(f"target {spec!r}: {attr} is not callable")
    recorded = getattr(obj, "__tqbridge_claim__", None)
    try:
        if op is None and recorded is None:
            raise FuzzError(f"target {spec!r}: say what it implements with --op (and --format), "
                            "or decorate it with tqbridge.parity.plugin.byok.claims(...)")
        if op is None:
            return obj, recorded
        return obj, make_claim(op, fmt, k_format=k_format, v_format=v_format)
    except KernelClaimError as e:
        raise FuzzError(f"target {spec!r}: {e}") from None


def resolve_target(spec: dict):
    t = spec["target"]
    if t in OUR_TARGETS:
        if any(spec.get(k) for k in ("op", "fmt", "k_format", "v_format")):
            fn, c = our_target(t, spec["backend"], spec.get("q_precision"))
            from .byok import Claim, make_claim

            c2 = make_claim(c.op, spec.get("fmt") if c.op != "decode-attention" else None,
                            k_format=spec.get("k_format"), v_format=spec.get("v_format"))
            if c2.formats is not None and len(c2.formats) == 1:   # one format: it is no longer passed
                fn = functools.partial(fn, fmt=c2.formats[0])
            return fn, Claim(c2.op, c2.formats, c2.k_formats, c2.v_formats, c.chain, c.q_precision)
        return our_target(t, spec["backend"], spec.get("q_precision"))
    if spec.get("q_precision"):
        raise FuzzError("--q-precision applies to tqbridge's own decode-attention target")
    if ":" in t:
        return user_target(t, spec.get("op"), spec.get("fmt"), spec.get("k_format"), spec.get("v_format"))
    raise FuzzError(f"unknown target {t!r}: use one of {', '.join(OUR_TARGETS + PARSER_TARGETS)} or module:function")


# ----------------------------------------------------------------------------------- workers


def _worker(spec: dict, worker: int, conn: Any, stop: Any) -> None:
    """Run rounds of fuzz_kernel until the budget or the deadline; report on ``conn``.

    ``conn`` is this worker's own pipe to the parent, written synchronously from this thread: a
    message is in the pipe when ``send`` returns, so a kernel that kills the process on the next
    example loses nothing, and no lock is shared with other workers. Until the fix, all workers shared
    one multiprocessing.Queue, sent by a feeder thread: a worker dying before that thread ran lost its
    last messages (measured: campaigns of 6 workers that each die on their second example counted 1-5
    examples, not 6), and one killed while its feeder held the queue's shared write lock, or
    mid-message, would stall the other workers' messages and hang the campaign — the race the parser
    harness had (parsers.campaign._parser_worker). The inputs are drawn here, by hypothesis, not handed out
    by the parent; what the parser harness gets by recording each input before sending it, this one
    gets from ``running-<worker>.case``, written synchronously before each call."""
    try:
        # Before hypothesis stores anything: its caches go to tqbridge's cache, not ./.hypothesis.
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", spec["hypothesis_home"])
        from .byok import fuzz_kernel

        fn, claim = resolve_target(spec)
        db = example_database(spec["db"], spec.get("shared_db"), Path(spec["db"]).name)
        sent_shapes: set = set()
        sent_formats: set = set()
        state = {"examples": 0, "worst": 0.0, "last": 0.0}
        base = 0

        def report(r, force=False):
            now = time.monotonic()
            if not force and now - state["last"] < 0.5:
                return
            state["last"] = now
            new_s, new_f = r.shapes - sent_shapes, r.formats - sent_formats
            sent_shapes.update(new_s)
            sent_formats.update(new_f)
            conn.send(("progress", worker, base + r.examples, sorted(new_s), sorted(new_f),
                       max(state["worst"], r.worst_ratio)))

        current = Path(spec["db"]) / f"running-{worker}.case"

        def save_current(case) -> None:
            current.write_text(case.to_text())

        budget = spec.get("examples_per_worker")
        deadline = spec.get("deadline")
        rnd = 0
        while not stop.is_set():
            if deadline is not None:
                if time.time() >= deadline:
                    break
                n = ROUND
            else:
                n = min(budget - state["examples"], 4 * ROUND)
                if n <= 0:
                    break
            r = fuzz_kernel(fn, claim.op, claim.formats if claim.op != "decode-attention" else None,
                            k_format=claim.k_formats, v_format=claim.v_formats, chain=claim.chain,
                            q_precision=claim.q_precision,
                            max_examples=n, seed=spec["seed"] * 1_000_003 + worker * 7919 + rnd, database=db,
                            on_example=lambda r: report(r), before_each=save_current)
            report(r, force=True)
            base += r.examples
            state["examples"] += r.examples
            state["worst"] = max(state["worst"], r.worst_ratio)
            rnd += 1
            if r.examples == 0:     # the strategy has nothing left to draw
                break
            if not r.ok:
                conn.send(("failure", worker, repr(r.failure), r.message, r.snippet))
                break
        current.unlink(missing_ok=True)
        conn.send(("done", worker, state["examples"]))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        try:
            conn.send(("error", worker, f"{type(e).__name__}: {e}"))
        except OSError:          # the parent is gone
            pass


# ----------------------------------------------------------------------------------- campaign


@dataclass
class Campaign:
    """Totals of a campaign, merged from the workers' reports."""

    target: str
    backend: str
    jobs: int
    seed: int
    db: str
    examples_per_worker: dict = field(default_factory=dict)
    shapes: set = field(default_factory=set)
    formats: set = field(default_factory=set)
    worst_ratio: float = 0.0
    seconds: float = 0.0
    failure: "dict | None" = None
    errors: list = field(default_factory=list)
    q_precision: "str | None" = None     # decode-attention: passed to every call (None: the backend's default)
    shared_db: "str | None" = None       # a Redis server's URL whose examples this campaign shares

    @property
    def examples(self) -> int:
        return sum(self.examples_per_worker.values())

    def handle(self, msg) -> None:
        kind, worker = msg[0], msg[1]
        if kind == "progress":
            self.examples_per_worker[worker] = msg[2]
            self.shapes.update(tuple(s) for s in msg[3])
            self.formats.update(msg[4])
            self.worst_ratio = max(self.worst_ratio, msg[5])
        elif kind == "failure" and self.failure is None:
            self.failure = {"worker": worker, "case": msg[2], "message": msg[3], "snippet": msg[4]}
        elif kind == "error":
            self.errors.append(f"worker {worker}: {msg[2]}")

    def progress_line(self) -> str:
        return (f"fuzz {self.target} [{self.backend}, {self.jobs} job{'s' if self.jobs > 1 else ''}]: "
                f"{self.examples} examples, {len(self.shapes)} shapes, {len(self.formats)} formats, "
                f"worst error/allowed {self.worst_ratio:.3g}, {self.seconds:.0f} s")

    def summary(self) -> dict:
        return {"target": self.target, "backend": self.backend, "q_precision": self.q_precision,
                "jobs": self.jobs, "seed": self.seed,
                "database": self.db, "shared_database": self.shared_db, "examples": self.examples, "shapes": len(self.shapes),
                "formats": sorted(self.formats), "worst_error_over_allowed": self.worst_ratio,
                "seconds": round(self.seconds, 2), "ok": self.failure is None and not self.errors,
                "failure": self.failure, "errors": self.errors}


def _crashed(camp: Campaign, spec: dict, worker: int, exitcode: int) -> None:
    """A worker died without reporting (a crash inside the kernel): report the case it was running."""
    how = f"signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
    saved = Path(spec["db"]) / f"running-{worker}.case"
    if camp.failure is not None or not saved.is_file():
        camp.errors.append(f"worker {worker} died ({how})")
        return
    from .byok import Case, snippet

    fn, claim = resolve_target(spec)
    case = Case.from_text(saved.read_text())
    camp.failure = {"worker": worker, "case": repr(case),
                    "message": f"the kernel crashed its process ({how}) on this case (not shrunk)",
                    "snippet": snippet(fn, case, claim)}


def run_campaign(target: str, *, backend: str = "auto", examples: "int | None" = None, minutes: "float | None" = None,
                 profile: str = "ci", jobs: int = 1, seed: "int | None" = None, db: "str | os.PathLike[str] | None" = None,
                 op: "str | None" = None, fmt: "list[str] | None" = None, k_format: "list[str] | None" = None,
                 v_format: "list[str] | None" = None, progress: "Callable[[Campaign], None] | None" = None,
                 q_precision: "str | None" = None) -> Campaign:
    """Run one campaign and return its totals (never raises for a counterexample: see ``failure``).
    ``q_precision`` ("exact" / "int8"; decode-attention only) is passed to every call: "int8" fuzzes
    kernel int8-mma wherever it serves the pair."""
    check_budget(profile, examples, minutes, jobs, FuzzError)
    if q_precision is not None:
        if target != "decode-attention":
            raise FuzzError("--q-precision applies to tqbridge's own decode-attention target")
        if q_precision not in ("exact", "int8"):
            raise FuzzError(f"--q-precision must be exact or int8, got {q_precision!r}")
    if backend != "auto" and target in ("append", "decode-attention"):
        from ...metal import backends as usable

        if backend not in usable():
            raise FuzzError(f"backend {backend!r} is not usable here (usable: {', '.join(usable())})")
    seed = (0 if profile == "ci" else random.randrange(1 << 30)) if seed is None else int(seed)
    shared = None
    if is_shared_db(db):        # a Redis server: examples shared there, the rest in the default folder
        shared, db = str(db), None
        check_shared_db(shared, FuzzError)
    root = Path(db) if db is not None else default_db_root()
    path = db_path(root, target if op is None else f"{target}-{op}")
    path.mkdir(parents=True, exist_ok=True)
    spec = {"target": target, "backend": backend, "op": op, "fmt": fmt, "k_format": k_format, "v_format": v_format,
            "q_precision": q_precision,
            "db": str(path), "shared_db": shared, "seed": seed, "hypothesis_home": str(hypothesis_home())}
    resolve_target(spec)          # fail fast, in this process, with a clear message
    total = PROFILES[profile] if examples is None and minutes is None else examples
    if minutes is not None:
        spec["deadline"] = time.time() + 60.0 * minutes
    else:
        spec["examples_per_worker"] = -(-total // jobs)
    camp = Campaign(target, backend, jobs, seed, str(path), q_precision=q_precision, shared_db=shared)
    deadline = spec.get("deadline")
    t0 = time.monotonic()

    def tick():
        camp.seconds = time.monotonic() - t0
        if progress is not None:
            progress(camp)

    # Workers are processes even for one job: a kernel that crashes takes down its worker, not the
    # campaign, and the case it was running is reported. Each has its own pipe (see _worker).
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs, conns = [], {}
    for w in range(jobs):
        conns[w], theirs = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(spec, w, theirs, stop), daemon=True)
        p.start()
        theirs.close()             # only the worker holds its end: its death is the end of this pipe
        procs.append(p)
    finished: set = set()
    closed: set = set()            # workers whose pipe has ended (every message read; the process is gone)
    stopped_at = None
    try:
        while len(finished) < jobs:
            if stopped_at is not None and time.monotonic() - stopped_at > GRACE_S:
                break                      # a counterexample is in; the others stop at their next round
            if deadline is not None and time.time() > deadline + GRACE_S:
                break                      # time is up: rounds in flight (a GPU build can take many seconds)
                                           # are cut; what the workers reported counts
            waiting = {conns[w]: w for w in conns if w not in finished and w not in closed}
            if not waiting:
                break                      # every worker has finished or died
            for c in mp_connection.wait(list(waiting), timeout=1.0):
                w = waiting[c]
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    closed.add(w)
                    continue
                camp.handle(msg)
                if msg[0] == "failure" and stopped_at is None:
                    stop.set()
                    stopped_at = time.monotonic()
                if msg[0] in ("done", "error"):
                    finished.add(w)
            tick()
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=GRACE_S)
            if p.is_alive():
                p.terminate()
                p.join()
        for c in conns.values():
            c.close()
    for w, p in enumerate(procs):
        if w not in finished and p.exitcode not in (0, None, -15):
            _crashed(camp, spec, w, p.exitcode)
        elif p.exitcode == -15:          # cut at the deadline: its case was not a crash
            (path / f"running-{w}.case").unlink(missing_ok=True)
    camp.seconds = time.monotonic() - t0
    if camp.failure:
        (path / "counterexample.py").write_text(camp.failure["snippet"])
    return camp
