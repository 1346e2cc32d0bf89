"""One consumer call on one input, in this process, and its outcome (``ok``, ``clean``, ``long``,
``crash``, ``alloc``, ``inconsistent``, ``upstream``; ``hang`` from the stack a watchdog wrote): the
per-call limits, the per-call peak-memory measure, where an exception was raised, and
:func:`check_input` for regression tests."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .named_targets import resolve_target
from .target import ParserTarget

INPUT_TIMEOUT_S = 20.0         # per consumer call; a call past it is a hang
ALLOC_SLACK = 256 << 20        # peak-RSS growth allowed per call, plus ALLOC_FACTOR x input size
ALLOC_FACTOR = 64
MAX_MESSAGE = 2000             # a clean error's message is one line of at most this many characters
_PKG_ROOT = str(Path(__file__).resolve().parents[3])
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep   # the fuzzer's own code (this package)


class PeakMemory:
    """Per-call peak resident memory: reset the kernel's high-water mark, read it after."""

    def __init__(self):
        self.ok = False
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.ok = self._read("VmHWM") > 0
        except OSError:
            self.ok = False

    @staticmethod
    def _read(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def start(self) -> int:
        if not self.ok:
            return 0
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return self._read("VmRSS")

    def peak_growth(self, rss0: int) -> int:
        return max(0, self._read("VmHWM") - rss0) if self.ok else 0


_OUR_DIRS = tuple(os.path.join(_PKG_ROOT, d) + os.sep for d in ("bridge", "metal", "parity", "tools"))


def _ours(filename: str) -> bool:
    """Whether a source file is tqbridge's (not this harness, not a dependency)."""
    p = os.path.abspath(filename)
    return p.startswith(_OUR_DIRS) and not p.startswith(_HARNESS_DIR)


def _raise_site(exc: BaseException) -> "tuple[str, int, bool, bool]":
    """(file, line) of the innermost traceback frame in tqbridge's code (or the innermost frame),
    whether tqbridge's code was on the way at all, and whether the exception was raised by a
    ``raise`` statement there (not by a library function tqbridge called)."""
    import linecache

    tb = exc.__traceback__
    ours = None
    last = None
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        last = (fn, tb.tb_lineno)
        if _ours(fn):
            ours = (fn, tb.tb_lineno)
        tb = tb.tb_next
    site = ours or last or ("?", 0)
    is_raise = False
    if ours is not None and ours == last:
        is_raise = linecache.getline(ours[0], ours[1]).strip().startswith("raise")
    return site[0], site[1], ours is not None, is_raise


def _short_site(fn: str, line: int) -> str:
    p = os.path.abspath(fn)
    m = re.search(r"site-packages/(.*)$", p)
    if m:
        p = m.group(1)
    elif p.startswith(_PKG_ROOT):
        p = os.path.relpath(p, _PKG_ROOT)
    else:
        p = os.path.basename(p)
    return f"{p}:{line}"


def classify(target: ParserTarget, consumer: str, exc: BaseException) -> tuple[str, str, str]:
    """(kind, signature, one-line message) of an exception raised by a consumer."""
    msg = str(exc)
    first = msg.splitlines()[0] if msg else ""
    fn, line, ours, is_raise = _raise_site(exc)
    sig = f"{consumer}: {type(exc).__name__} at {_short_site(fn, line)}"
    text = f"{type(exc).__name__}: {first[:300]}"
    if target.upstream and not ours:
        return "upstream", sig, text
    if isinstance(exc, MemoryError):
        return "alloc", sig, text
    if isinstance(exc, target.clean_classes(consumer)) and (is_raise or not target.raised_by_us_required(consumer)):
        if "\n" in msg:
            return "crash", sig + " (message of several lines)", text
        if len(msg) > MAX_MESSAGE:
            return "long", sig + f" (message of more than {MAX_MESSAGE} characters)", text + f" [{len(msg)} chars]"
        return "clean", sig, text
    return "crash", sig, text


def run_one(target: ParserTarget, consumer: str, data: bytes, scratch: Path, mem: "PeakMemory | None" = None,
            watchdog: "Any | None" = None) -> dict:
    """Run one consumer on one input in this process and classify the outcome. ``watchdog``: a file
    that receives the Python stack if the call is still running after most of the time limit."""
    import faulthandler

    mem = mem or PeakMemory()
    rss0 = mem.start()
    if watchdog is not None:
        watchdog.seek(0)
        watchdog.truncate()
        faulthandler.dump_traceback_later(watchdog_after(), file=watchdog)
    t0 = time.perf_counter()
    sig = f"{consumer}: ok"
    text = ""
    try:
        bad = target.call(consumer, data, scratch)
        kind = "ok" if bad is None else "inconsistent"
        if bad is not None:
            sig, text = f"{consumer}: inconsistent: {bad}", bad
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - every exception is classified
        kind, sig, text = classify(target, consumer, e)
    finally:
        if watchdog is not None:
            faulthandler.cancel_dump_traceback_later()
    seconds = time.perf_counter() - t0
    growth = mem.peak_growth(rss0)
    if kind not in ("alloc", "upstream") and growth > ALLOC_SLACK + ALLOC_FACTOR * len(data):
        kind, sig = "alloc", f"{consumer}: peak memory +{growth >> 20} MiB on a {len(data)}-byte input"
        text = sig
    return {"consumer": consumer, "kind": kind, "signature": sig, "message": text, "seconds": seconds,
            "peak_growth": growth}


_WATCHDOG = [INPUT_TIMEOUT_S]     # this process's per-input time limit (set_input_timeout)


def set_input_timeout(seconds: float) -> None:
    """This process's per-input time limit, which :func:`run_one`'s watchdog is timed from."""
    _WATCHDOG[0] = seconds


def watchdog_after() -> float:
    return max(0.5, 0.8 * _WATCHDOG[0])


def hang_site(stack: str, consumer: str, target: str) -> "tuple[str, bool]":
    """Signature of a hang from the stack faulthandler wrote (innermost frame first), and whether
    tqbridge's code was on the stack."""
    blocks = re.split(r"(?m)^(?:Current thread|Thread) 0x[0-9a-f]+", stack)
    main = next((b for b in blocks if _HARNESS_DIR in b), stack)   # the thread running the input
    frames = re.findall(r'File "([^"]+)", line (\d+)', main)
    ours = [(f, int(n)) for f, n in frames if _ours(f)]
    site = ours[0] if ours else (frames[0][0], int(frames[0][1])) if frames else None
    where = f" in {_short_site(*site)}" if site else ""
    return f"{consumer}: hang{where}", bool(ours)


def run_all(target: ParserTarget, data: bytes, scratch: Path, mem: "PeakMemory | None" = None,
            watchdog: "Any | None" = None, on_start: "Callable[[str], None] | None" = None,
            consumers: "list[str] | None" = None) -> list[dict]:
    """Every consumer of ``target`` on one input (a consumer whose prerequisite did not accept the
    input is skipped)."""
    results: list[dict] = []
    kinds: dict = {}
    for c in consumers or target.consumers:
        dep = target.depends.get(c)
        if dep is not None and kinds.get(dep, "ok") != "ok":
            continue
        if on_start is not None:
            on_start(c)
        r = run_one(target, c, data, scratch, mem, watchdog)
        kinds[c] = r["kind"]
        results.append(r)
    return results


def check_input(target_name: str, data: bytes, consumers: "list[str] | None" = None) -> list[dict]:
    """Run one input through a target's consumers in this process (regression tests use this)."""
    target = resolve_target({"target": target_name, "real_seeds": False})
    with tempfile.TemporaryDirectory(prefix="tqbridge-fuzz-") as d:
        return run_all(target, data, Path(d), consumers=consumers)
