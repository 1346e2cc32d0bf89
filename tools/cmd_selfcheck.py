"""``tqbridge selfcheck``: our quantizers against ggml's own C code, byte for byte.

A fixed set of adversarial float rows (``tqbridge.parity.plugin.strategies.adversarial_rows``) is quantized
per format by ggml's C (``ggml_quantize_chunk`` in llama-cpp-python's libggml-base), by the numpy
reference and by the MLX ops. Bytes must be identical, and decoding ggml's bytes must give the same
float32 bits as ggml's ``to_float``. Exit code 0 when everything matches, 1 on any mismatch.
"""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from tqbridge import bridge
from tqbridge.bridge.blocks import registry
from tqbridge.parity.plugin.strategies import FAMILIES, adversarial_rows

from .cli import CliError


def add_arguments(p) -> None:
    ggml_formats = registry.names(lambda f: f.ggml_id is not None)   # the formats ggml's C code can check
    p.add_argument("--formats", default=",".join(ggml_formats),
                   help="comma-separated formats to check (default: every ggml legacy format)")
    p.add_argument("--rows-per-family", type=int, default=80,
                   help=f"rows per value family ({len(FAMILIES)} families; default 80 -> 720 rows)")
    p.add_argument("--blocks", type=int, default=4, help="blocks per row (default 4)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")


def _ver(pkg: str) -> "str | None":
    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def _gaussian_error(fmt, n: int) -> float:
    """Largest |x - dequantize(quantize(x))| over 256 fixed N(0, 1) rows, ggml's own bytes."""
    from tqbridge.bridge.llama import ggml_c

    x = np.random.default_rng(20260).standard_normal((256, n)).astype(np.float32)
    y = ggml_c.c_dequantize(fmt, ggml_c.c_quantize(fmt, x), n)
    return float(np.abs(x.astype(np.float64) - y).max())


def check_format(name: str, x: np.ndarray, mx) -> dict:
    from tqbridge.bridge.llama import ggml_c

    fmt = bridge.get_format(name)
    n = x.shape[-1]
    ref = ggml_c.c_quantize(fmt, x)
    ref_dec = ggml_c.c_dequantize(fmt, ref, n)
    ref_bits = ref_dec.view(np.uint32)

    def same(q, dec) -> bool:
        return bool(np.array_equal(q, ref) and np.array_equal(np.asarray(dec, np.float32).view(np.uint32), ref_bits))

    numpy_ok = same(bridge.quantize(fmt, x), bridge.dequantize(fmt, ref, n))
    mlx_ok = None
    if mx is not None:
        q = np.array(bridge.mlx_quantize(fmt, mx.array(x)))
        dec = np.array(bridge.mlx_dequantize(fmt, mx.array(ref), n))
        mlx_ok = same(q, dec)
    return {"format": name, "rows": int(x.shape[0]), "bytes_compared": int(ref.size),
            "numpy_equal_c": numpy_ok, "mlx_equal_c": mlx_ok,
            "max_abs_error_gaussian": _gaussian_error(fmt, n)}


def run(args) -> int:
    from tqbridge.bridge.llama import ggml_c
    from tqbridge.bridge.llama.side import GgmlUnavailable, library_path

    try:
        lib = library_path()
        ggml_c.load()
    except GgmlUnavailable as e:
        raise CliError(str(e)) from e
    names = [s.strip() for s in args.formats.split(",") if s.strip()]
    if not names:
        raise CliError("--formats is empty")
    for s in names:
        try:
            f = bridge.get_format(s)
        except bridge.FormatError as e:
            raise CliError(str(e)) from e
        if f.ggml_id is None:
            raise CliError(f"{s} has no ggml type id: ggml's C code cannot check it")
    if args.rows_per_family < 1 or args.blocks < 1:
        raise CliError("--rows-per-family and --blocks must be at least 1")
    try:
        import mlx.core as mx
    except ImportError:
        mx = None
        print("MLX is not installed: the MLX column is skipped (pip install 'tqbridge[mlx]')", file=sys.stderr)

    results = []
    for name in names:
        bs = bridge.get_format(name).block_size
        blocks = max(1, (32 * args.blocks) // bs)
        x = adversarial_rows(block_size=bs, n_blocks=blocks, per_family=args.rows_per_family)
        results.append(check_format(name, x, mx))

    def yn(v):
        return "n/a" if v is None else ("yes" if v else "NO")

    head = ["format", "rows", "bytes compared", "numpy==C", "MLX==C", "max |err| N(0,1)"]
    table = [[r["format"], str(r["rows"]), str(r["bytes_compared"]), yn(r["numpy_equal_c"]), yn(r["mlx_equal_c"]),
              f"{r['max_abs_error_gaussian']:.3g}"] for r in results]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    print(f"ggml C oracle: {lib.name} from llama-cpp-python {_ver('llama_cpp_python') or '?'}; "
          f"rows: {len(FAMILIES)} value families x {args.rows_per_family}")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)))
    print("(max |err| N(0,1): largest |x - decode(ggml's bytes)| over 256 fixed standard-normal rows)")

    bad = [(r["format"], path) for r in results for path, key in (("numpy", "numpy_equal_c"), ("MLX", "mlx_equal_c"))
           if r[key] is False]
    if args.json:
        doc = {"ok": not bad, "results": results, "families": list(FAMILIES),
               "versions": {"tqbridge": _ver("tqbridge"), "numpy": np.__version__, "gguf": _ver("gguf"),
                            "mlx": _ver("mlx"), "llama_cpp_python": _ver("llama_cpp_python")},
               "machine": platform.machine(), "system": platform.system()}
        from tqbridge.bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(doc, indent=2))
    if bad:
        print("selfcheck FAILED: differs from ggml's C code in " + ", ".join(f"{f} ({p})" for f, p in bad))
        return 1
    paths = "numpy and MLX" if mx is not None else "numpy (MLX not installed)"
    print(f"selfcheck passed: {len(results)} formats byte-identical to ggml's C code ({paths}), "
          f"{sum(r['bytes_compared'] for r in results)} bytes compared")
    return 0
