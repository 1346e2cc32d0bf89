"""Any llama.cpp build as tqbridge's llama.cpp side: upstream, or the TurboQuant fork in either variant.

A *build* is a directory holding the shared libraries of one llama.cpp build (``libllama``,
``libggml-base``, ``libggml-cpu``; llama.cpp's CMake puts them in ``bin/``). tqbridge reaches it
through a small C shim of its own (``csrc/llama_shim.c``) compiled against that build's headers:
llama.cpp's structs differ between versions and forks (``llama_context_params`` of the fork at
69d8e4b lacks three fields and one enum of the llama.h llama-cpp-python 0.3.36 binds), so a ctypes
mirror written for one llama.h would corrupt memory on another. The compiler lays the structs out
from the build's own headers; the shim's functions take only scalars and pointers.

What a build holds is found out, not assumed (:func:`describe`, in a child process so that two
builds' libraries never share one address space): ggml's version and commit, the compatibility
checks of :mod:`.llama_compat` on its libraries (type ids and sizes of the legacy types,
``ggml_type_traits``, ``ggml_init_params``, ``ggml_cplan``, a known-answer ``flash_attn_ext``,
the CPU's instruction sets), and which turbo types it has and which registry variant they are:
type ids, bytes per block (turbo4: 68 or 66), the centroid tables read back by dequantizing known
blocks, and our quantizer's bytes and decoder's floats against the build's on drawn rows. A build
whose turbo types match no variant is refused with what differs.

One process, one build: :func:`select` makes a build the llama.cpp side of this process before any
ggml library is loaded (:mod:`.llama_side` then names the build's libraries and type ids to
``ggml_c``, ``ggml_graph`` and the runtimes).
The recipe that makes a build from a source checkout is :func:`build_from_source`
(``tqbridge llama build SRC``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from . import ggml_c
from . import compat
from ..blocks.api import dequantize, quantize
from ..environ import cache_dir
from .ggml_abi import TO_FLOAT, TypeTraits
from .side import BuildInfo, LlamaBuildError, fork_type_id, selected, set_selected, turbo_variants


# The portable flags the Makefile gives llama-cpp-python's build, and only the library targets.
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
              "-DLLAMA_BUILD_TOOLS=OFF", "-DGGML_OPENMP=OFF")
SHIM_SOURCE = Path(__file__).with_name("csrc") / "llama_shim.c"


def _lib_name(stem: str) -> str:
    return f"lib{stem}.dylib" if sys.platform == "darwin" else f"lib{stem}.so"


LIBRARIES = ("llama", "ggml-base", "ggml-cpu", "ggml")


def cache_root() -> Path:
    """Where compiled shims are kept: ``llama-builds/`` of :func:`tqbridge.bridge.environ.cache_dir`."""
    return cache_dir() / "llama-builds"


# ---------------------------------------------------------------------------------------------
# the recipe


def git_commit(src: Path) -> "str | None":
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def build_from_source(src: "str | os.PathLike[str]", out: "str | os.PathLike[str] | None" = None, *,
                      jobs: "int | None" = None, extra_args: "tuple[str, ...]" = (), log=print) -> Path:
    """Configure and build the CPU shared libraries of the llama.cpp checkout ``src`` (upstream or a
    fork) with :data:`CMAKE_ARGS`; returns the build directory (default: the cache, keyed by the
    checkout's directory name and commit). Re-running on a finished build only re-checks it."""
    src = Path(src).resolve()
    if not (src / "CMakeLists.txt").is_file() or not (src / "include" / "llama.h").is_file():
        raise LlamaBuildError(f"{src}: not a llama.cpp source checkout (no CMakeLists.txt and include/llama.h)")
    for tool in ("cmake", "cc"):
        if shutil.which(tool) is None:
            raise LlamaBuildError(f"building llama.cpp needs {tool!r} on PATH")
    commit = git_commit(src)
    out = Path(out) if out else cache_root() / f"{src.name}-{(commit or 'nogit')[:12]}"
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 1
    steps = (["cmake", "-S", str(src), "-B", str(out), *CMAKE_ARGS, *extra_args],
             ["cmake", "--build", str(out), "--target", "llama", "-j", str(jobs)])
    for cmd in steps:
        log("$ " + " ".join(cmd))
        rc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise LlamaBuildError(f"{cmd[0]} {cmd[1]} failed (exit {rc}) for {src}")
    record = {"source": str(src), "commit": commit, "cmake_args": list(CMAKE_ARGS) + list(extra_args)}
    (out / "tqbridge-build.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


# ---------------------------------------------------------------------------------------------
# finding what a directory holds


def find_libraries(build: Path) -> dict[str, Path]:
    """``{"llama": path, "ggml-base": path, "ggml-cpu": path}`` under ``build`` (itself, bin/ or lib/)."""
    found: dict[str, Path] = {}
    for sub in ("", "bin", "lib", "src", "ggml/src"):
        d = build / sub if sub else build
        for stem in LIBRARIES:
            p = d / _lib_name(stem)
            if stem not in found and p.exists():
                found[stem] = p.resolve()
    missing = [s for s in ("llama", "ggml-base", "ggml-cpu") if s not in found]
    if missing:
        raise LlamaBuildError(f"{build}: no {', '.join(_lib_name(s) for s in missing)} (a llama.cpp build with "
                              "shared libraries: tqbridge llama build SRC makes one)")
    return found


def source_of(build: Path) -> Path:
    """The source checkout a CMake build directory was configured from (its CMakeCache.txt)."""
    cache = build / "CMakeCache.txt"
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
                return Path(line.split("=", 1)[1])
    raise LlamaBuildError(f"{build}: no CMakeCache.txt naming its sources (the shim is compiled against "
                          "the build's own llama.h and ggml.h)")


def _include_dirs(src: Path) -> list[Path]:
    dirs = [src / "include", src / "ggml" / "include"]
    for d, h in zip(dirs, ("llama.h", "ggml.h")):
        if not (d / h).is_file():
            raise LlamaBuildError(f"{src}: no {d.name}/{h}")
    return dirs


def shim_path(build: Path) -> Path:
    """The shim compiled for ``build`` (compiled on first use; keyed by the shim's source, the build's
    headers and its libraries)."""
    build = Path(build).resolve()
    libs = find_libraries(build)
    inc = _include_dirs(source_of(build))
    h = hashlib.sha256(SHIM_SOURCE.read_bytes())
    for d, name in ((inc[0], "llama.h"), (inc[1], "ggml.h")):
        h.update((d / name).read_bytes())
    for p in libs.values():
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    out = cache_root() / "shims" / f"tqbridge-llama-shim-{h.hexdigest()[:16]}{Path(_lib_name('x')).suffix}"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC") or "cc"
    lib_dir = libs["llama"].parent
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    cmd = [cc, "-shared", "-fPIC", "-O1", "-o", str(tmp), str(SHIM_SOURCE), *[f"-I{d}" for d in inc],
           f"-L{lib_dir}", f"-L{libs['ggml-base'].parent}", "-lllama", "-lggml-base",
           f"-Wl,-rpath,{lib_dir}", f"-Wl,-rpath,{libs['ggml-base'].parent}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip()[:300])
        raise LlamaBuildError(f"the llama.cpp shim does not compile against {build}'s headers: {first}")
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------
# the probe (run in a child process by describe())


def _drawn_rows(n_rows: int = 24, n: int = 256) -> np.ndarray:
    rng = np.random.default_rng(20261203)
    x = rng.standard_normal((n_rows, n)).astype(np.float32)
    x[1] = 0.0                                     # zero norm
    x[2] *= np.float32(6e4)                        # fp16 overflow of the stored norm
    x[3] *= np.float32(1e-20)                      # near the zero threshold
    x[4, ::7] = 0.0
    x[5, :64] *= 50.0                              # outlier channels
    x[6, 64:] = 0.0                                # a 64-value head zero-padded to 128
    x[6, 192:] = 0.0
    return x


def _probe_turbo(base, names: dict[int, str]) -> dict[str, Any]:
    """Which registry variant the build's turbo types are (or why none)."""
    base.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    have = {n: i for i, n in names.items() if n.startswith("turbo")}
    out: dict[str, Any] = {"types": {}, "variant": None, "mismatch": {}}
    if not have:
        return out
    x = _drawn_rows()
    for name, tid in sorted(have.items()):
        t = base.ggml_get_type_traits(tid).contents
        info: dict[str, Any] = {"id": tid, "block_size": int(t.blck_size), "type_size": int(t.type_size)}
        # centroids read back: a block of norm 1 whose indices run through the table, in the layout of a
        # registry variant with the build's block size (turbo4: 68 or 66 bytes)
        layout = next((f for fmts in turbo_variants().values() for f in fmts.values()
                       if f.name == name and (f.block_size, f.type_size) == (t.blck_size, t.type_size)), None)
        if layout is not None and t.to_float:
            info["centroids"] = _read_centroids(t, layout).tolist()
        out["types"][name] = info
    for variant, fmts in turbo_variants().items():
        diffs = []
        for name, fmt in fmts.items():
            info = out["types"].get(name)
            if info is None:
                diffs.append(f"no {name}")
                continue
            if info["id"] != fork_type_id(fmt):
                diffs.append(f"{name} is type {info['id']} ({variant}: {fork_type_id(fmt)})")
                continue
            if (info["block_size"], info["type_size"]) != (fmt.block_size, fmt.type_size):
                diffs.append(f"{name} has {info['type_size']} bytes per {info['block_size']} values "
                             f"({variant}: {fmt.type_size} per {fmt.block_size})")
                continue
            t = base.ggml_get_type_traits(info["id"]).contents
            ours = quantize(fmt, x)
            theirs = np.zeros_like(ours)
            base.ggml_quantize_chunk(info["id"], x.ctypes.data, theirs.ctypes.data, 0, x.shape[0], x.shape[1], None)
            if not np.array_equal(ours, theirs):
                diffs.append(f"{name}: our quantizer's bytes differ in "
                             f"{int((ours != theirs).any(axis=-1).sum())} of {len(x)} rows")
                continue
            dec = np.zeros(x.shape, np.float32)
            TO_FLOAT(t.to_float)(ours.ctypes.data, dec.ctypes.data, x.size)
            want = dequantize(fmt, ours, x.shape[1], rotated=True)
            if not np.array_equal(dec.view(np.uint32), want.view(np.uint32)):
                diffs.append(f"{name}: the build's decoder differs from ours")
        if diffs:
            out["mismatch"][variant] = diffs
        elif out["variant"] is None:
            out["variant"] = variant
    return out


def _read_centroids(traits, fmt) -> np.ndarray:
    """The build's centroid table, read by decoding one block (packed by ``fmt``'s codec, a variant with
    the build's block layout): norm 1.0, index j at position j."""
    n = 1 << fmt.codec.spec.bits
    idx = (np.arange(fmt.block_size) % n).astype(np.uint8)[None]
    block = np.ascontiguousarray(fmt.codec.pack(np.ones(1, np.float32), idx)[0])
    out = np.zeros(fmt.block_size, np.float32)
    TO_FLOAT(traits.to_float)(block.ctypes.data, out.ctypes.data, fmt.block_size)
    return out[:n]


def probe(build: "str | os.PathLike[str]") -> dict[str, Any]:
    """What ``build`` holds, read in this process (which must have loaded no other ggml)."""
    build = Path(build).resolve()
    libs = find_libraries(build)
    report: dict[str, Any] = {"build": str(build), "libraries": {k: str(v) for k, v in libs.items()},
                              "problems": []}
    rec = build / "tqbridge-build.json"
    if rec.is_file():
        report["recipe"] = json.loads(rec.read_text())
    try:
        report["source"] = str(source_of(build))
        report["commit"] = git_commit(Path(report["source"]))
    except LlamaBuildError as e:
        report["problems"].append(str(e))
        return report
    base = ctypes.CDLL(str(libs["ggml-base"]))
    cpu = ctypes.CDLL(str(libs["ggml-cpu"]))
    for fn in ("ggml_version", "ggml_commit"):
        f = getattr(base, fn, None)
        if f is not None:
            f.restype = ctypes.c_char_p
            report[fn] = (f() or b"").decode(errors="replace")
    problems = compat.check_symbols({"libggml-base": base, "libggml-cpu": cpu})
    if not problems:
        problems = compat.check_cpu(cpu)
    if not problems:
        problems = compat.check_types(base)
    if not problems:
        cpu.ggml_cpu_init()
        problems = compat.check_graph(base, cpu)
    report["problems"] += problems
    if problems:
        return report
    try:
        shim = shim_path(build)
    except LlamaBuildError as e:
        report["problems"].append(str(e))
        return report
    lib = ctypes.CDLL(str(shim))
    lib.tqs_type_count.restype = ctypes.c_int
    base.ggml_type_name.restype, base.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    names = {i: (base.ggml_type_name(i) or b"").decode(errors="replace") for i in range(lib.tqs_type_count())}
    report["shim"] = str(shim)
    report["type_count"] = len(names)
    turbo = _probe_turbo(base, names)
    report["turbo"] = turbo
    if turbo["types"] and turbo["variant"] is None:
        report["problems"].append("its turbo types match no variant tqbridge knows: " + "; ".join(
            f"{v}: {', '.join(d)}" for v, d in turbo["mismatch"].items()))
    return report


# ---------------------------------------------------------------------------------------------
# describe / select


_described: dict[Path, BuildInfo] = {}


def describe(build: "str | os.PathLike[str]") -> BuildInfo:
    """Probe ``build`` in a child process (cached per process); never raises for a bad build — the
    problems are in the result."""
    path = Path(build).expanduser().resolve()
    if path in _described:
        return _described[path]
    if not path.is_dir():
        raise LlamaBuildError(f"{build}: no such directory (a llama.cpp build: tqbridge llama build SRC makes one)")
    find_libraries(path)
    child = subprocess.run([sys.executable, "-m", "tqbridge.bridge.llama.build", "--probe", str(path)],
                           capture_output=True, text=True, timeout=900)
    if child.returncode < 0:
        report = {"build": str(path), "problems": [f"probing the build's libraries killed the process (signal "
                                                   f"{-child.returncode}): built for another CPU?"]}
    else:
        try:
            report = json.loads(child.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            tail = (child.stderr or child.stdout).strip().splitlines()[-1:] or ["no output"]
            report = {"build": str(path), "problems": [f"the probe failed (exit {child.returncode}): {tail[0][:300]}"]}
    info = BuildInfo(path, report)
    _described[path] = info
    return info


def select(build: "str | os.PathLike[str]") -> BuildInfo:
    """Make ``build`` this process's llama.cpp side. Refuses a build with problems, and refuses once a
    ggml library is loaded (one process, one build)."""
    info = describe(build)
    if info.problems:
        raise LlamaBuildError(f"{info.path} cannot be used: {info.one_line()}")
    current = selected()
    if current is not None and current.path == info.path:
        return info
    if ggml_c.load.cache_info().currsize or "llama_cpp" in sys.modules:
        raise LlamaBuildError("a llama.cpp library is already loaded in this process; choose the build "
                              "(--llama) before anything runs llama.cpp")
    set_selected(info)
    sys.modules.setdefault("llama_cpp", None)   # importing llama-cpp-python now fails at once, loudly
    return info


def _main(argv: "list[str] | None" = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tqbridge.bridge.llama.build")
    ap.add_argument("--probe", metavar="BUILD", required=True)
    args = ap.parse_args(argv)
    try:
        report = probe(args.probe)
    except LlamaBuildError as e:
        report = {"build": args.probe, "problems": [str(e)]}
    report["machine"] = platform.machine()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
