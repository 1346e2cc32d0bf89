"""A parser campaign: worker processes that warm up on the seeds and run the inputs the parent hands
them, the parent that supervises them (time limits, dying workers, replayed findings first), and the
:class:`ParserCampaign` record of counts and findings; :func:`run_parser_campaign` runs one."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import random
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .mutation import Mutator
from .named_targets import PARSER_TARGETS, resolve_target
from .outcome import ALLOC_FACTOR, ALLOC_SLACK, INPUT_TIMEOUT_S, PeakMemory, hang_site, run_all, set_input_timeout
from .target import ParserFuzzError

PROFILE_MUTANTS = {"ci": 200, "dev": 1000, "deep": 10000}
ADDRESS_SPACE_HEADROOM = 4 << 30   # the worker's address-space cap above its size after warm-up
KEEP_PER_SIGNATURE = 3
_KINDS = ("ok", "clean", "long", "crash", "hang", "alloc", "inconsistent", "upstream")


# ----------------------------------------------------------------------------------- workers


def _mutant_rng(seed: int, index: int) -> random.Random:
    return random.Random(f"tqbridge-parser-fuzz:{seed}:{index}")


def _cap_address_space() -> None:
    try:
        import resource

        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        cap = size + ADDRESS_SPACE_HEADROOM
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (OSError, ValueError, StopIteration, ImportError):
        pass


def _parser_worker(spec: dict, worker: int, conn: Any, slot: Any) -> None:
    """Warm up, say ``ready``, then run each input the parent sends on ``conn`` until ``None``: a
    negative index ``-(r + 1)`` is saved finding ``r``, any other index ``i`` is mutant ``i``.

    ``conn`` is this worker's own pipe to the parent, written synchronously from this thread: no
    feeder thread whose unsent messages die with the process, no lock shared with other workers that
    a process killed mid-write would hold forever (both happened with one multiprocessing.Queue for
    all workers: lost messages, and a campaign hung). ``slot`` is shared memory ``[consumer number,
    start in ns]`` written before each consumer call (``-1`` after the last): the parent knows which
    input it handed out, and the slot which consumer was running and since when, without a message."""
    try:
        # C code (llama.cpp, MLX) writes to the process's stderr: keep it in the database's worker log
        log = os.open(str(Path(spec["db"]) / f"worker-{worker}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        set_input_timeout(spec["input_timeout"])
        watchdog = open(Path(spec["db"]) / f"stack-{worker}.txt", "w+")
        target = resolve_target(spec)
        scratch = Path(tempfile.mkdtemp(prefix=f"tqbridge-fuzz-{worker}-"))
        seeds = target.seeds(scratch)
        mem = PeakMemory()
        # warm up: every consumer on every seed (imports, kernel builds) before limits are set
        seed_results = [run_all(target, s.data, scratch, mem) for s in seeds]
        conn.send(("ready", worker, [{"name": s.name, "bytes": len(s.data), "fields": len(s.fields),
                                      "outcomes": {r["consumer"]: r["kind"] for r in rs}}
                                     for s, rs in zip(seeds, seed_results)]))
        _cap_address_space()
        mut = Mutator(target, seeds)
        running = Path(spec["db"]) / f"running-{worker}.json"
        replays = spec["replays"]
        numbers = {c: n for n, c in enumerate(target.consumers)}

        def starting(consumer: str) -> None:
            slot[1] = time.time_ns()                 # the time first: the parent reads the number first
            slot[0] = numbers[consumer]

        while True:
            try:
                index = conn.recv()
            except EOFError:                         # the parent is gone
                break
            if index is None:
                break
            if index < 0:
                path = replays[-index - 1]
                data, origin = Path(path).read_bytes(), {"replay": os.path.basename(path)}
            else:
                data, seed_name, ops = mut.mutant(_mutant_rng(spec["seed"], index))
                origin = {"seed": seed_name, "ops": ops}
            # the bytes, for the parent to save if this input kills the process (written once per input)
            running.write_text(json.dumps({"index": index, "origin": origin, "data": data.hex()}))
            results = run_all(target, data, scratch, mem, watchdog, starting)
            slot[1] = time.time_ns()
            slot[0] = -1
            conn.send(("result", worker, index, origin, len(data), results,
                       data.hex() if any(r["kind"] not in ("ok", "clean") for r in results) else None))
        running.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        conn.send(("done", worker))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        try:
            conn.send(("error", worker, f"{type(e).__name__}: {e}", traceback.format_exc()))
        except OSError:
            pass


# ----------------------------------------------------------------------------------- campaign


@dataclass
class ParserCampaign:
    target: str
    consumers: tuple
    jobs: int
    seed: int
    db: str
    input_timeout: float
    mutants: int = 0
    replayed: int = 0
    counts: dict = field(default_factory=dict)        # consumer -> kind -> n
    peak_growth: dict = field(default_factory=dict)   # consumer -> bytes (largest per-call peak-RSS growth)
    slowest: dict = field(default_factory=dict)       # consumer -> seconds
    findings: dict = field(default_factory=dict)      # signature -> {kind, consumer, message, count, example}
    clean_sites: dict = field(default_factory=dict)   # signature of a clean error (class and raising line) -> n
    seeds: list = field(default_factory=list)
    seconds: float = 0.0
    errors: list = field(default_factory=list)
    memory_measured: bool = True
    upstream_peak: int = 0                           # peak growth of calls that ended in an upstream error

    def __post_init__(self):
        for c in self.consumers:
            self.counts[c] = {k: 0 for k in _KINDS}
            self.peak_growth[c] = 0
            self.slowest[c] = 0.0

    def add(self, index: int, origin: dict, size: int, results: list, data_hex: "str | None") -> None:
        if index < 0:
            self.replayed += 1
        self.mutants += 1
        for r in results:
            c = r["consumer"]
            self.counts[c][r["kind"]] += 1
            if r["kind"] == "upstream":
                self.upstream_peak = max(self.upstream_peak, r["peak_growth"])
            else:
                self.peak_growth[c] = max(self.peak_growth[c], r["peak_growth"])
            self.slowest[c] = max(self.slowest[c], r["seconds"])
            if r["kind"] == "clean":
                self.clean_sites[r["signature"]] = self.clean_sites.get(r["signature"], 0) + 1
            if r["kind"] not in ("ok", "clean"):
                self._finding(r["kind"], c, r["signature"], r["message"], origin, size, data_hex)

    def _finding(self, kind, consumer, sig, message, origin, size, data_hex) -> None:
        f = self.findings.get(sig)
        if f is None:
            f = self.findings[sig] = {"kind": kind, "consumer": consumer, "signature": sig, "message": message,
                                      "count": 0, "example": {"origin": origin, "bytes": size}, "saved": []}
        f["count"] += 1
        if data_hex is not None and len(f["saved"]) < KEEP_PER_SIGNATURE:
            data = bytes.fromhex(data_hex)
            h = hashlib.sha1(data).hexdigest()[:12]
            sh = hashlib.sha1(sig.encode()).hexdigest()[:8]
            d = Path(self.db) / "findings"
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"{sh}-{h}{'.bin'}"
            if not p.exists():
                p.write_bytes(data)
                (d / f"{sh}-{h}.json").write_text(json.dumps(
                    {"signature": sig, "kind": kind, "message": message, "origin": origin}, indent=1))
            if p.name not in f["saved"]:
                f["saved"].append(p.name)

    def total(self, kind: str) -> int:
        return sum(c[kind] for c in self.counts.values())

    @property
    def ok(self) -> bool:
        return not self.errors and all(self.total(k) == 0 for k in ("crash", "hang", "alloc", "inconsistent"))

    def progress_line(self) -> str:
        return (f"fuzz {self.target} [{self.jobs} job{'s' if self.jobs > 1 else ''}]: {self.mutants} mutants, "
                f"{self.total('crash')} crashes, {self.total('hang')} hangs, {self.total('alloc')} over-allocations, "
                f"{self.seconds:.0f} s")

    def summary(self) -> dict:
        return {
            "target": self.target, "kind": "parser", "consumers": list(self.consumers), "jobs": self.jobs,
            "seed": self.seed, "database": self.db, "input_timeout_s": self.input_timeout,
            "mutants": self.mutants, "replayed": self.replayed,
            "totals": {k: self.total(k) for k in _KINDS},
            "per_consumer": self.counts,
            "peak_memory_growth_bytes": self.peak_growth if self.memory_measured else None,
            "upstream_peak_memory_growth_bytes": self.upstream_peak if self.memory_measured else None,
            "alloc_limit": f"{ALLOC_SLACK >> 20} MiB + {ALLOC_FACTOR} x input bytes per call; address space capped "
                           f"at the warmed-up size + {ADDRESS_SPACE_HEADROOM >> 30} GiB",
            "slowest_call_s": {k: round(v, 3) for k, v in self.slowest.items()},
            "seeds": self.seeds, "seconds": round(self.seconds, 2), "ok": self.ok,
            "findings": sorted(self.findings.values(), key=lambda f: (-f["count"], f["signature"])),
            "clean_error_sites": dict(sorted(self.clean_sites.items(), key=lambda kv: -kv[1])),
            "errors": self.errors,
        }


def run_parser_campaign(target: str, *, examples: "int | None" = None, minutes: "float | None" = None,
                        profile: str = "ci", jobs: int = 1, seed: "int | None" = None,
                        db: "str | os.PathLike[str] | None" = None, input_timeout: float = INPUT_TIMEOUT_S,
                        replay: bool = True, real_seeds: bool = True,
                        progress: "Callable[[ParserCampaign], None] | None" = None) -> ParserCampaign:
    """Run a mutation campaign against one parser target; never raises for findings (see the counts).

    ``--minutes`` counts from the moment every worker has made its seeds and warmed up."""
    from ..campaigns import check_budget, db_path, default_db_root

    if target not in PARSER_TARGETS and ":" not in target:
        raise ParserFuzzError(f"unknown parser target {target!r}: use one of {', '.join(PARSER_TARGETS)}")
    check_budget(profile, examples, minutes, jobs, ParserFuzzError)
    if not input_timeout > 0:
        raise ParserFuzzError(f"--input-timeout must be positive, got {input_timeout}")
    seed = (0 if profile == "ci" else random.randrange(1 << 30)) if seed is None else int(seed)
    camp_target = resolve_target({"target": target, "real_seeds": real_seeds})   # fail fast, here, with one line
    path = db_path(Path(db) if db is not None else default_db_root(), target)
    path.mkdir(parents=True, exist_ok=True)
    replays = sorted(str(p) for p in (path / "findings").glob("*.bin")) if replay else []
    spec = {"target": target, "db": str(path), "seed": seed, "jobs": jobs, "replays": replays,
            "real_seeds": real_seeds, "input_timeout": input_timeout,
            "mutants": (1 << 62) if minutes is not None else (examples or PROFILE_MUTANTS[profile])}
    camp = ParserCampaign(target, camp_target.consumers, jobs, seed, str(path), input_timeout)
    camp.memory_measured = PeakMemory().ok
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    procs: dict = {}
    conns: dict = {}          # worker -> the parent's end of its pipe (tasks out, messages in)
    closed: set = set()       # workers whose pipe has reached its end
    slots: dict = {}          # worker -> shared [consumer number (-1: none), start in ns] (_parser_worker)
    current: dict = {}        # worker -> the index handed to it and not answered yet
    finished: set = set()
    ready: set = set()
    clock: list = []          # monotonic end of a timed campaign, once every worker is warm
    todo = [-(r + 1) for r in range(len(replays))][::-1]   # saved findings first (popped from the end)
    nxt = [0]                 # the next mutant index

    def start(w: int) -> None:
        slots[w] = ctx.RawArray("q", [-1, time.time_ns()])
        if w in conns:
            conns[w].close()
        conns[w], theirs = ctx.Pipe()
        p = ctx.Process(target=_parser_worker, args=(spec, w, theirs, slots[w]), daemon=True)
        p.start()
        theirs.close()        # only the worker holds its end: its death is the end of this pipe
        procs[w] = p
        closed.discard(w)
        current.pop(w, None)

    def send(w: int, index: "int | None") -> None:
        try:
            conns[w].send(index)
        except OSError:       # it died: the liveness check below classifies it
            pass

    def receive(w: int) -> None:
        """Every message waiting on worker ``w``'s pipe."""
        try:
            while w not in closed and conns[w].poll():
                handle(conns[w].recv())
        except (EOFError, OSError):
            closed.add(w)

    def dispatch(w: int) -> None:
        """Hand worker ``w`` its next input, recorded here before it is sent; ``None`` ends the worker."""
        index = None
        if not stop[0]:
            if todo:
                index = todo.pop()
            elif nxt[0] < spec["mutants"]:
                index = nxt[0]
                nxt[0] += 1
        if index is None:
            send(w, None)
            return
        slots[w][0] = -1
        slots[w][1] = time.time_ns()
        current[w] = index
        send(w, index)

    def handle(m) -> None:
        kind, w = m[0], m[1]
        if kind == "ready":
            if not camp.seeds:
                camp.seeds = m[2]
            ready.add(w)
            if minutes is not None and not clock and len(ready) == jobs:
                clock.append(time.monotonic() + 60.0 * minutes)
            dispatch(w)
        elif kind == "result":
            camp.add(m[2], m[3], m[4], m[5], m[6])
            current.pop(w, None)
            dispatch(w)
        elif kind == "done":
            finished.add(w)
            current.pop(w, None)
        elif kind == "error":
            camp.errors.append(f"worker {w}: {m[2]}")
            finished.add(w)

    def lost(w: int, how: str, kind: str) -> None:
        """Worker ``w`` hung or died: record the input it was handed, start a fresh worker."""
        index = current.pop(w, None)
        number = slots[w][0]
        if index is None or number < 0:
            where = "outside any input" if index is None else f"on input {index} outside any consumer call"
            camp.errors.append(f"worker {w}: {how} {where}")
            finished.add(w)
            return
        consumer = camp_target.consumers[number]
        data_hex, origin = None, {}
        try:
            rec = json.loads((Path(spec["db"]) / f"running-{w}.json").read_text())
            if rec["index"] == index:
                data_hex, origin = rec["data"], rec["origin"]
        except (OSError, ValueError, KeyError):
            pass
        sig = f"{consumer}: {how}"
        if kind == "hang":
            try:
                stack = (Path(spec["db"]) / f"stack-{w}.txt").read_text()
            except OSError:
                stack = ""
            sig, ours = hang_site(stack, consumer, target)
            if camp_target.upstream and stack and not ours:
                kind = "upstream"
            how = f"{how} ({sig.split(': ', 1)[1]})"
        camp.add(index, origin, len(data_hex or "") // 2,
                 [{"consumer": consumer, "kind": kind, "signature": sig, "message": how,
                   "seconds": input_timeout if kind == "hang" else 0.0, "peak_growth": 0}], data_hex)
        if stop[0] or not (todo or nxt[0] < spec["mutants"]):
            finished.add(w)
        else:
            start(w)

    stop = [False]
    for w in range(jobs):
        start(w)
    try:
        while len(finished) < jobs:
            waiting = {conns[w]: w for w in procs if w not in finished and w not in closed}
            for c in mp_connection.wait(list(waiting), timeout=0.25):
                receive(waiting[c])
            if not waiting:
                time.sleep(0.05)
            for w, p in list(procs.items()):
                if w in finished:
                    continue
                # a consumer call past the limit is a hang; the harness's own work on an input (a
                # mutant, the result message) gets a wider one, past it the worker is lost as an error
                limit = input_timeout if slots[w][0] >= 0 else max(60.0, 5 * input_timeout)
                if w in current and time.time_ns() - slots[w][1] > limit * 1e9:
                    p.kill()
                    p.join()
                    lost(w, f"no answer within {limit:g} s", "hang")
                elif not p.is_alive():
                    p.join()
                    receive(w)           # what it said before it died (a result, its last words)
                    if w not in finished:
                        code = p.exitcode
                        how = f"process died (signal {-code})" if code and code < 0 else f"process died (exit code {code})"
                        lost(w, how, "crash")
            if clock and time.monotonic() >= clock[0]:
                stop[0] = True
            camp.seconds = time.monotonic() - t0
            if progress is not None:
                progress(camp)
    finally:
        stop[0] = True
        for w, p in procs.items():
            if p.is_alive():
                send(w, None)
        for p in procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        for c in conns.values():
            c.close()
        for w in range(jobs):
            for name in (f"running-{w}.json", f"stack-{w}.txt"):
                (Path(spec["db"]) / name).unlink(missing_ok=True)
    camp.seconds = time.monotonic() - t0
    return camp
