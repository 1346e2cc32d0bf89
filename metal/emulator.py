"""The CPU SIMT emulator: a dialect kernel compiled with the system C++ compiler, run over numpy.

Libraries are cached by source hash under ``$TQBRIDGE_CACHE/emu`` (default ``~/.cache/tqbridge/emu``).
Every buffer is copied into a larger allocation whose margins hold guard bytes: random bytes after
outputs (an out-of-bounds write is an error naming the kernel and the buffer), 0xFF (NaN) around
inputs (an out-of-bounds read gives NaN, not a plausible value). Outputs start as 0xFF bytes unless
an ``init`` value is given. ``runs=2`` runs the kernel a second time with another thread order and
fails if any output differs (a race). See emu_runtime.h for the scheduling.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .kernel import Kernel, KernelError, cache_root

GUARD = 256  # bytes of guard on each side of every buffer
ALIGN = 64
_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
          "-fvisibility=hidden", "-w"]
if sys.platform == "darwin":  # ucontext is deprecated there but still works
    _FLAGS += ["-D_XOPEN_SOURCE=700"]


def _flags() -> list[str]:
    # TQBRIDGE_EMU_UCONTEXT=1 switches threads with ucontext instead of the x86-64 assembly switch
    return _FLAGS + (["-DTQ_EMU_UCONTEXT"] if os.environ.get("TQBRIDGE_EMU_UCONTEXT") == "1" else [])
_DTYPES = {"float32": np.float32, "int32": np.int32, "uint32": np.uint32, "uint16": np.uint16,
           "uint8": np.uint8}
DEFAULT_SEED = 0x7B1D6E
_LOCKS: dict[str, threading.Lock] = {}  # one per loaded library: its launch state is global
_LOCKS_GUARD = threading.Lock()


class EmulatorError(RuntimeError):
    """The emulator found a problem in a kernel (race, divergence, out-of-bounds) or cannot build it."""


def cache_dir() -> Path:
    return cache_root() / "emu"


def find_compiler() -> str:
    """The C++ compiler: ``$CXX``, else c++, g++ or clang++ on PATH; a clear error if none."""
    cand = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    for c in cand:
        path = shutil.which(c)
        if path:
            return path
    raise EmulatorError("no C++ compiler found (set CXX or install g++ or clang++): the CPU kernel "
                        "emulator compiles kernels with it")


def _aligned(nbytes: int, fill: "int | np.ndarray") -> tuple[np.ndarray, int]:
    raw = np.empty(nbytes + 2 * GUARD + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    buf = raw[start:start + nbytes + 2 * GUARD]
    if isinstance(fill, np.ndarray):
        buf[:] = fill[: buf.size]
    else:
        buf[:] = fill
    return buf, buf.ctypes.data + GUARD


def _dlclose(dll) -> None:
    """Unload a library loaded by ctypes (POSIX dlclose, from the process's own symbols)."""
    libc = ctypes.CDLL(None)
    libc.dlclose.argtypes = [ctypes.c_void_p]
    libc.dlclose(dll._handle)


def _load(lib: Path) -> "ctypes.CDLL | None":
    """``lib`` loaded, or None where the file does not load or lacks the entry point ``tq_emu_launch``."""
    try:
        dll = ctypes.CDLL(str(lib))
    except OSError:
        return None
    if not hasattr(dll, "tq_emu_launch"):
        _dlclose(dll)   # else a rebuilt file at the same path would load as this handle again
        return None
    return dll


def _build(name: str, src: str, cxx: str, flags: list, srcfile: Path, lib: Path) -> None:
    """Compile ``src`` into ``lib``. Processes building the same library at once each compile a source
    file of their own and rename their result over ``lib`` (the last rename wins; every one is whole):
    no compiler reads a file another build is writing (a source read while another build truncates it
    compiles into a library without its entry point). ``srcfile``: the source, kept for reading."""
    d = lib.parent
    fd, tmp_src = tempfile.mkstemp(prefix=f".{srcfile.name}.", suffix=".cpp", dir=d)
    with os.fdopen(fd, "w") as f:
        f.write(src)
    fd, tmp = tempfile.mkstemp(prefix=f".{lib.name}.", suffix=".so", dir=d)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *flags, tmp_src, "-o", tmp], capture_output=True, text=True)
        os.replace(tmp_src, srcfile)
        if proc.returncode != 0:
            msg = "\n".join((proc.stderr or proc.stdout).replace(tmp_src, str(srcfile)).splitlines()[:40])
            raise EmulatorError(f"kernel {name}: the C++ compiler failed on {srcfile}:\n{msg}")
        os.replace(tmp, lib)
    finally:
        for t in (tmp_src, tmp):
            if os.path.exists(t):
                os.unlink(t)


class EmulatedKernel:
    """A kernel compiled for the emulator (one static-parameter set)."""

    path = "cpu-emulator"

    def __init__(self, kernel: Kernel, static: Mapping[str, int]):
        self.kernel = kernel
        self.static = dict(static)
        src = kernel.cpu_source(static)
        cxx = find_compiler()
        import hashlib

        flags = _flags()
        key = hashlib.sha256((src + "\0" + " ".join(flags) + "\0" + cxx).encode()).hexdigest()[:24]
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        lib = d / f"{kernel.name}-{key}.so"
        self._lib = _load(lib) if lib.exists() else None
        if self._lib is None:   # not built yet, or a library without the entry point
            _build(kernel.name, src, cxx, flags, d / f"{kernel.name}-{key}.cpp", lib)
            self._lib = _load(lib)
            if self._lib is None:
                raise EmulatorError(f"kernel {kernel.name}: {lib} has no tq_emu_launch after a build")
        fn = self._lib.tq_emu_launch
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_int]
        self._fn = fn
        with _LOCKS_GUARD:
            self._lock = _LOCKS.setdefault(str(lib), threading.Lock())

    def __call__(self, inputs: Sequence[np.ndarray], output_shapes: Sequence[tuple[int, ...]], grid,
                 threads: int, *, init: "float | None" = None, seed: "int | None" = None,
                 runs: int = 1) -> list[np.ndarray]:
        """Run over ``grid`` threadgroups (gx, gy, gz) of ``threads`` threads; numpy outputs."""
        k = self.kernel
        gx, gy, gz = (tuple(grid) + (1, 1, 1))[:3]
        if min(gx, gy, gz) < 1 or threads < 1 or threads % 32:
            raise KernelError(f"kernel {k.name}: grid {grid} must be positive and threads ({threads}) a "
                              "positive multiple of 32")
        if len(inputs) != len(k.inputs) or len(output_shapes) != len(k.outputs):
            raise KernelError(f"kernel {k.name}: takes {len(k.inputs)} inputs and {len(k.outputs)} outputs, "
                              f"got {len(inputs)} and {len(output_shapes)}")
        if seed is None:
            seed = int(os.environ.get("TQBRIDGE_EMU_SEED", DEFAULT_SEED))
        results = []
        for r in range(max(1, runs)):
            results.append(self._run_once(inputs, output_shapes, (gx, gy, gz), threads, init, seed + 7919 * r))
        for r in range(1, len(results)):
            for (name, _), a, b in zip(k.outputs, results[0], results[r]):
                if a.tobytes() != b.tobytes():
                    raise EmulatorError(
                        f"kernel {k.name}: output '{name}' depends on the thread order (two runs with "
                        "different orders differ): a race, e.g. a missing barrier")
        return results[0]

    def _run_once(self, inputs, output_shapes, grid, threads, init, seed) -> list[np.ndarray]:
        k = self.kernel
        bufs, keep, ins = [], [], []
        for (name, dtype), a in zip(k.inputs, inputs):
            a = np.asarray(a)
            if a.dtype != _DTYPES[dtype]:
                raise KernelError(f"kernel {k.name}: input '{name}' must be {dtype}, got {a.dtype}")
            raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            buf, ptr = _aligned(raw.size, 0xFF)
            buf[GUARD:GUARD + raw.size] = raw
            ins.append((name, buf, raw))
            keep.append(buf)
            bufs.append(ptr)
        rng = np.random.default_rng(seed)
        outs = []
        for (name, dtype), shape in zip(k.outputs, output_shapes):
            shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
            guard = rng.integers(0, 256, size=nbytes + 2 * GUARD, dtype=np.uint8)
            buf, ptr = _aligned(nbytes, guard)
            if init is None:
                buf[GUARD:GUARD + nbytes] = 0xFF
            else:
                buf[GUARD:GUARD + nbytes].view(_DTYPES[dtype])[:] = init
            outs.append((name, dtype, shape, nbytes, buf, guard))
            keep.append(buf)
            bufs.append(ptr)
        arr = (ctypes.c_void_p * max(1, len(bufs)))(*bufs)
        err = ctypes.create_string_buffer(1024)
        with self._lock:
            rc = self._fn(arr, len(bufs), grid[0], grid[1], grid[2], threads, seed & (2**64 - 1), err, 1024)
        if rc != 0:
            raise EmulatorError(err.value.decode(errors="replace") or f"kernel {k.name}: failed ({rc})")
        for (name, buf, raw), a in zip(ins, inputs):
            n = raw.size
            if not (np.all(buf[:GUARD] == 0xFF) and np.all(buf[GUARD + n:] == 0xFF)):
                raise EmulatorError(f"kernel {k.name}: out-of-bounds write around input '{name}'")
            if name in k.inplace:   # written in place, as on a GPU: the caller's array takes the bytes
                if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable):
                    raise KernelError(f"kernel {k.name}: in-place input '{name}' must be a writable "
                                      "C-contiguous numpy array")
                a.reshape(-1).view(np.uint8)[:] = buf[GUARD:GUARD + n]
            elif not np.array_equal(buf[GUARD:GUARD + n], raw):
                raise EmulatorError(f"kernel {k.name}: wrote into its input '{name}'")
        result = []
        for name, dtype, shape, nbytes, buf, guard in outs:
            for lo, hi, where in ((0, GUARD, "before the start"), (GUARD + nbytes, 2 * GUARD + nbytes, "past the end")):
                bad = np.flatnonzero(buf[lo:hi] != guard[lo:hi])
                if bad.size:
                    if where == "past the end":
                        at = f"up to {int(lo + bad[-1] - GUARD - nbytes) + 1} bytes after it"
                    else:
                        at = f"from {int(GUARD - lo - bad[0])} bytes before it"
                    raise EmulatorError(
                        f"kernel {k.name}: out-of-bounds write {where} of output '{name}' "
                        f"({nbytes} bytes; changed guard bytes {at})")
            result.append(buf[GUARD:GUARD + nbytes].copy().view(_DTYPES[dtype]).reshape(shape))
        return result
