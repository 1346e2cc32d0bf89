"""Bring your own kernel *source*: wrap a kernel body as a callable that :mod:`.byok` can fuzz.

Two kinds of source, both for ``quantize`` and ``dequantize`` of one format, one thread per block:

- :func:`dialect_kernel`: a body in tqbridge's kernel dialect (docs/kernels.md); it runs on Metal,
  CUDA and the CPU emulator, so it is fuzzed in CI without a GPU.
- :func:`mlx_source_kernel`: a raw ``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel`` body; it runs
  only where MLX has that GPU backend.

Buffers the body sees (one block per thread; ``params[0]`` is the number of blocks):

==========  =====================================  ======================================
op          inputs                                 output
==========  =====================================  ======================================
dequantize  ``blocks`` (uint8), ``params`` (uint32)  ``y`` (float32, block_size per block)
quantize    ``x`` (float32), ``params`` (uint32)     ``blocks`` (uint8, type_size per block)
==========  =====================================  ======================================

``BLOCK_SIZE`` and ``TYPE_SIZE`` are defined as the format's values. Example (q8_0, dialect)::

    uint i = tq_gx * tq_tg_size + tq_tid;
    if (i < params[0]) {
        float d = tq_f16_bits_to_f32((uint)blocks[i * TYPE_SIZE] | ((uint)blocks[i * TYPE_SIZE + 1] << 8));
        for (uint j = 0; j < BLOCK_SIZE; j++) {
            int q = (int)blocks[i * TYPE_SIZE + 2 + j];
            y[i * BLOCK_SIZE + j] = tq_mul(d, (float)(q > 127 ? q - 256 : q));
        }
    }
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ... import bridge
from .byok import KernelClaimError, make_claim

THREADS = 64     # threads per threadgroup of the wrapped kernels

_IO = {
    "dequantize": ((("blocks", "uint8"), ("params", "uint32")), (("y", "float32"),)),
    "quantize": ((("x", "float32"), ("params", "uint32")), (("blocks", "uint8"),)),
}


def _check(op: str, fmt: Any):
    if op not in _IO:
        raise KernelClaimError(f"a kernel source can claim quantize or dequantize, not {op!r} "
                               "(wrap an attention kernel in a Python callable instead)")
    try:
        return bridge.get_format(fmt)
    except bridge.FormatError as e:
        raise KernelClaimError(str(e)) from None


def _wrap(run: Callable, op: str, f, to_numpy: Callable) -> Callable:
    claim = make_claim(op, f.key)
    if op == "dequantize":
        def fn(blocks, n):
            b = np.ascontiguousarray(np.asarray(blocks, np.uint8))
            rows = b.shape[0]
            nb = b.size // f.type_size
            (y,) = run([b.reshape(-1), np.array([nb], np.uint32)], [(nb * f.block_size,)],
                       grid=(-(-nb // THREADS), 1, 1), threads=THREADS)
            return to_numpy(y).reshape(rows, n)
    else:
        def fn(x):
            x = np.ascontiguousarray(np.asarray(x, np.float32))
            rows = x.shape[0]
            nb = x.size // f.block_size
            (b,) = run([x.reshape(-1), np.array([nb], np.uint32)], [(nb * f.type_size,)],
                       grid=(-(-nb // THREADS), 1, 1), threads=THREADS)
            return to_numpy(b).reshape(rows, -1)
    fn.__tqbridge_claim__ = claim
    fn.__name__ = f"{op}_{f.name}_kernel"   # (its qualname stays local: a snippet cannot import it)
    return fn


def dialect_kernel(body: str, *, op: str, fmt: Any, header: str = "", backend: str = "auto",
                   name: str = "user_kernel") -> Callable:
    """A callable running a tqbridge-dialect ``body`` that claims ``op`` for ``fmt``."""
    from ...metal import Kernel, build

    f = _check(op, fmt)
    ins, outs = _IO[op]
    k = Kernel(name, ins, outs, body, header, ("BLOCK_SIZE", "TYPE_SIZE"))
    run = build(k, {"BLOCK_SIZE": f.block_size, "TYPE_SIZE": f.type_size}, backend=backend)
    return _wrap(run, op, f, lambda a: np.asarray(a) if isinstance(a, np.ndarray) else np.array(a))


def mlx_source_kernel(source: str, *, op: str, fmt: Any, backend: str, header: str = "",
                      name: str = "user_kernel") -> Callable:
    """A callable running a raw ``mx.fast.metal_kernel`` (``backend="metal"``) or
    ``mx.fast.cuda_kernel`` (``"cuda"``) body that claims ``op`` for ``fmt``. The body finds its
    block index from the backend's own thread ids (Metal: ``thread_position_in_grid.x``; CUDA:
    ``blockIdx.x * blockDim.x + threadIdx.x``)."""
    f = _check(op, fmt)
    if backend not in ("metal", "cuda"):
        raise KernelClaimError(f"backend must be 'metal' or 'cuda' for a raw MLX kernel source, not {backend!r}")
    from ...metal import backends

    if backend not in backends():
        raise KernelClaimError(f"a raw {backend} kernel needs MLX's {backend} backend; this machine has "
                               f"{', '.join(backends())} (write the body in the tqbridge dialect to fuzz it here)")
    import mlx.core as mx

    ins, outs = _IO[op]
    make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
    defines = f"#define BLOCK_SIZE ({f.block_size})\n#define TYPE_SIZE ({f.type_size})\n"
    kern = make(name=name, input_names=[n for n, _ in ins], output_names=[n for n, _ in outs],
                source=source, header=defines + header, ensure_row_contiguous=True)
    odt = mx.float32 if op == "dequantize" else mx.uint8

    def run(inputs, shapes, grid, threads):
        return kern(inputs=[mx.array(a) for a in inputs], output_shapes=shapes, output_dtypes=[odt],
                    grid=(grid[0] * threads, 1, 1), threadgroup=(threads, 1, 1))

    return _wrap(run, op, f, lambda a: np.array(a))
