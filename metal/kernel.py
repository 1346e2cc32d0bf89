"""A kernel written once in the tqbridge dialect, and its source for each backend.

A :class:`Kernel` is a name, typed input and output buffers, an optional ``header`` (helper
functions, declared with ``TQ_FUNC``) and a ``body`` (the kernel function's body). Static
parameters (format codes, block sizes) become ``#define NAME value`` lines in front of the header;
values that change per call travel in an input buffer. See docs/kernels.md for the dialect.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from ..bridge.environ import cache_dir

# The dialect sources (kernel bodies, per-backend preludes, the emulator runtime) live in one folder.
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
BODY_MARKER = "//== body =="

# dialect dtype -> C type (the same spelling on every backend)
CTYPES = {"float32": "float", "int32": "int", "uint32": "uint", "uint16": "ushort", "uint8": "uchar"}
BACKENDS = ("metal", "cuda", "cpu-emulator")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYNC = re.compile(r"\btq_(barrier|simd_\w+)\s*\(")


class KernelError(ValueError):
    """A malformed kernel definition or launch; the message says which."""


def cache_root() -> Path:
    """Where compiled kernels and generated sources are kept: :func:`tqbridge.bridge.environ.cache_dir`
    (the emulator's libraries under ``emu/``, CUDA's included sources under ``cuda-src/``)."""
    return cache_dir()


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (KERNEL_DIR / name).read_text()


@dataclass(frozen=True)
class Kernel:
    name: str
    inputs: tuple[tuple[str, str], ...]   # (buffer name, dtype)
    outputs: tuple[tuple[str, str], ...]
    body: str
    header: str = ""
    static_names: tuple[str, ...] = field(default=())  # the static parameters the source expects
    # inputs the kernel writes in place (a cache buffer an append fills): the body writes through
    # ``<name>_w``; MLX passes inputs as const pointers, the emulator copies such a buffer back
    inplace: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if not _IDENT.match(self.name):
            raise KernelError(f"kernel name {self.name!r} is not a C identifier")
        seen = set()
        for buf, dtype in self.inputs + self.outputs:
            if not _IDENT.match(buf) or buf in seen:
                raise KernelError(f"kernel {self.name}: bad or repeated buffer name {buf!r}")
            if dtype not in CTYPES:
                raise KernelError(f"kernel {self.name}: buffer {buf} has dtype {dtype}; the dialect "
                                  f"takes {', '.join(CTYPES)}")
            seen.add(buf)
        if not self.outputs:
            raise KernelError(f"kernel {self.name}: needs at least one output")
        names = [n for n, _ in self.inputs]
        for n in self.inplace:
            if n not in names:
                raise KernelError(f"kernel {self.name}: in-place buffer {n!r} is not an input")

    @classmethod
    def from_file(cls, path: "str | Path", name: str, inputs, outputs, static_names=()) -> "Kernel":
        """Read a kernel file: helper functions, a line ``//== body ==``, then the body."""
        text = Path(path).read_text()
        if BODY_MARKER not in text:
            raise KernelError(f"{path}: no '{BODY_MARKER}' line separates the header from the body")
        header, body = text.split(BODY_MARKER, 1)
        return cls(name, tuple(map(tuple, inputs)), tuple(map(tuple, outputs)), body, header,
                   tuple(static_names))

    @property
    def uses_sync(self) -> bool:
        """Whether the kernel has barriers or SIMD ops (the emulator then runs threads as fibers)."""
        return bool(_SYNC.search(self.header) or _SYNC.search(self.body))

    def check_static(self, static: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for k, v in static.items():
            if not _IDENT.match(k):
                raise KernelError(f"kernel {self.name}: static parameter name {k!r} is not an identifier")
            if isinstance(v, bool) or not isinstance(v, int):
                raise KernelError(f"kernel {self.name}: static parameter {k} must be an int, got {v!r}")
            out[k] = int(v)
        missing = [k for k in self.static_names if k not in out]
        if missing:
            raise KernelError(f"kernel {self.name}: missing static parameter(s) {', '.join(missing)}")
        return out

    def header_source(self, backend: str, static: Mapping[str, int]) -> str:
        prelude = {"metal": "prelude_metal.h", "cuda": "prelude_cuda.h", "cpu-emulator": "prelude_cpu.h"}
        if backend not in prelude:
            raise KernelError(f"no kernel source for backend {backend!r}; known: {', '.join(BACKENDS)}")
        defines = "".join(f"#define {k} ({v})\n" for k, v in sorted(self.check_static(static).items()))
        text = (_read(prelude[backend]) + "\n" + _read("prelude_common.h") + "\n// static parameters\n"
                + defines + "\n" + self.header + "\n")
        return text if backend == "cpu-emulator" else _without_comment_lines(text)

    def body_source(self, backend: str) -> str:
        """The body with the thread-id bindings of ``backend`` (and the writable views of the
        in-place inputs) in front of it."""
        types = dict(self.inputs)
        writable = "".join(f"    TQ_DEVICE {CTYPES[types[n]]}* {n}_w = (TQ_DEVICE {CTYPES[types[n]]}*){n};\n"
                           for n in self.inplace)
        text = _ids(backend) + writable + self.body
        return text if backend == "cpu-emulator" else _without_comment_lines(text)

    def cuda_source(self, static: Mapping[str, int]) -> str:
        """One CUDA translation unit as MLX's CUDA backend compiles it: the header and body for the CUDA
        prelude under the signature MLX generates (inputs ``const T*``, outputs ``T*``). For compiling a
        build offline (nvcc, NVRTC through CuPy); MLX itself takes header and body apart."""
        args = [f"const {CTYPES[t]}* {n}" for n, t in self.inputs] + [f"{CTYPES[t]}* {n}" for n, t in self.outputs]
        return ("#include <cuda_fp16.h>\n" + self.header_source("cuda", static)
                + f'extern "C" __global__ void {self.name}({", ".join(args)}) {{\n' + self.body_source("cuda") + "\n}\n")

    def cpu_source(self, static: Mapping[str, int]) -> str:
        """One C++ translation unit for the emulator."""
        args = []
        for i, (buf, dtype) in enumerate(self.inputs):
            args.append(f"    const {CTYPES[dtype]}* {buf} = (const {CTYPES[dtype]}*)tqemu::g_bufs[{i}]; (void){buf};\n")
        for j, (buf, dtype) in enumerate(self.outputs):
            i = len(self.inputs) + j
            args.append(f"    {CTYPES[dtype]}* {buf} = ({CTYPES[dtype]}*)tqemu::g_bufs[{i}]; (void){buf};\n")
        return (
            self.header_source("cpu-emulator", static)
            + f'#define TQ_KERNEL_NAME "{self.name}"\n#define TQ_USES_SYNC {int(self.uses_sync)}\n'
            + "static void tq_kernel_body();\n" + _read("emu_runtime.h") + "\n"
            + "static void tq_kernel_body() {\n" + "".join(args) + self.body_source("cpu-emulator") + "\n}\n"
        )

    def digest(self, backend: str, static: Mapping[str, int]) -> str:
        text = self.cpu_source(static) if backend == "cpu-emulator" else (
            self.header_source(backend, static) + self.body_source(backend))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def mlx_sources(kernel: "Kernel", backend: str, static: Mapping[str, int]) -> tuple[str, str]:
    """``(source, header)`` to hand to ``mx.fast.metal_kernel`` / ``cuda_kernel``.

    MLX rebuilds and hashes a custom kernel's whole source string on every call (measured on the
    H200: 15.4 us per call with a 27 KB header, 8.2 us with the header behind an ``#include``). On
    CUDA the header and the body therefore go to content-addressed files that NVRTC includes, so
    the string MLX handles is two lines. Metal has no include path: it gets the text.
    """
    header, body = kernel.header_source(backend, static), kernel.body_source(backend)
    if backend != "cuda":
        return body, header
    return _included(body), _included(header)


@lru_cache(maxsize=256)
def _included(text: str) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    path = cache_root() / "cuda-src" / f"{digest}.cuh"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return f'#include "{path.resolve()}"\n'


@lru_cache(maxsize=64)
def _without_comment_lines(text: str) -> str:
    """The source without its comment-only and blank lines: MLX assembles a GPU kernel's source
    string on every call, so a shorter one costs less per call (the emulator keeps line numbers)."""
    return "".join(ln for ln in text.splitlines(keepends=True) if ln.strip() and not ln.lstrip().startswith("//"))


_ID_NAMES = ("tq_tid", "tq_tg_size", "tq_lane", "tq_simd", "tq_nsimd", "tq_gx", "tq_gy", "tq_gz",
             "tq_ngx", "tq_ngy", "tq_ngz")


def _ids(backend: str) -> str:
    if backend == "metal":
        vals = ("thread_index_in_threadgroup", "threads_per_threadgroup.x", "thread_index_in_simdgroup",
                "simdgroup_index_in_threadgroup", "(threads_per_threadgroup.x + 31) / 32",
                "threadgroup_position_in_grid.x", "threadgroup_position_in_grid.y",
                "threadgroup_position_in_grid.z", "threadgroups_per_grid.x", "threadgroups_per_grid.y",
                "threadgroups_per_grid.z")
    elif backend == "cuda":
        vals = ("threadIdx.x", "blockDim.x", "(threadIdx.x & 31u)", "(threadIdx.x >> 5)",
                "((blockDim.x + 31u) >> 5)", "blockIdx.x", "blockIdx.y", "blockIdx.z",
                "gridDim.x", "gridDim.y", "gridDim.z")
    else:
        vals = tuple(f"tqemu::ids().{f}" for f in ("tid", "tg_size", "lane", "simd", "nsimd", "gx", "gy",
                                                   "gz", "ngx", "ngy", "ngz"))
    lines = "".join(f"    const uint {n} = {v}; (void){n};\n" for n, v in zip(_ID_NAMES, vals))
    return "    // thread ids (tqbridge dialect)\n" + lines
