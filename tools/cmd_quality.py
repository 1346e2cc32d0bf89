"""``tqbridge quality MODEL.gguf --kv q8_0/turbo3 ...``: KL vs the f16 cache, top-1, bytes per token."""

from __future__ import annotations

import json
import os
import sys

from tqbridge.bridge.blocks.kv_spec import CALIBRATED_KV, LAYERED_EXAMPLE_KV, QUALITY_KV

from .cli import CliError
from .cmd_generate import resolve_model

DEFAULT_KVS = list(QUALITY_KV)     # the standard table (named in tqbridge.bridge.blocks.kv_spec)


def add_arguments(p) -> None:
    p.add_argument("model", help="GGUF model file, or a model name: smollm2, gemma3")
    p.add_argument("--kv", action="append", default=None,
                   help="a K/V format pair (repeatable), keys optionally calibrated per channel: "
                        f"{CALIBRATED_KV}, or given per layer: '{LAYERED_EXAMPLE_KV}'; default: the standard table. "
                        "f16/f16 is always included")
    p.add_argument("--tokens", type=int, default=2048, help="tokens of text to score (default 2048)")
    p.add_argument("--chunk", type=int, default=256, help="fixed prefill chunk size (default 256)")
    p.add_argument("--text", default=None, help="a text file to score instead of pydoc_data.topics")
    p.add_argument("--rotation", choices=["llama", "none"], default="llama",
                   help="Hadamard-rotate K/V rows of ggml quantized formats as llama.cpp does (default), or not")
    p.add_argument("--sliding", choices=["quantize", "float"], default="quantize",
                   help="sliding-window layers: quantized like the rest, or kept in float")
    p.add_argument("--q-precision", choices=["exact", "int8"], default=None,
                   help="decode attention's q precision for the caches under test: exact, or int8 (q "
                        "quantized per 32 values to q8_0 / q8_1, as llama.cpp's vec_dot does); default: the "
                        "backend's. Acts on decode steps only (one-token chunks): use it with --chunk 1")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--markdown", default=None, help="write a Markdown table here")
    p.add_argument("--plot", default=None, help="write a PNG plot of KL vs bits per value here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _write_atomic(path: str, data: "str | bytes") -> None:
    from tqbridge.bridge.atomic import write_atomic

    write_atomic(path, data)


def run(args) -> int:
    from tqbridge.bridge.mlx_blas import prefer_fast_blas

    prefer_fast_blas()  # before MLX is imported: OpenBLAS for float32 matmuls on Linux CPUs
    from tqbridge.bridge import FormatError
    from tqbridge.bridge.gguf.model import GGUFModelError, load_gguf_model
    from tqbridge.metal.lm.cache import layer_count
    from tqbridge.bridge.blocks.kv_spec import parse_layered_kv_spec
    from tqbridge.parity import quality as q

    kvs = args.kv or DEFAULT_KVS
    try:
        specs = [parse_layered_kv_spec(s) for s in kvs]
    except FormatError as e:
        raise CliError(str(e)) from e
    if args.tokens < 2:
        raise CliError(f"--tokens must be >= 2, got {args.tokens}")
    if args.chunk < 1:
        raise CliError(f"--chunk must be >= 1, got {args.chunk}")
    if args.text:
        try:
            with open(args.text, encoding="utf-8") as f:
                text, source = f.read(), os.path.basename(args.text)
        except OSError as e:
            raise CliError(f"{args.text}: {e.strerror}") from e
    else:
        text, source = q.default_text(), "pydoc_data.topics"
    args.model = resolve_model(args.model)
    try:
        model, cfg = load_gguf_model(args.model)
    except GGUFModelError as e:
        raise CliError(str(e)) from e
    try:   # per-layer indices against this model, before any scoring
        for kv in specs:
            kv.pairs(layer_count(model))
    except FormatError as e:
        raise CliError(str(e)) from e
    tok = q.GGUFTokenizer(args.model)
    ids = tok.encode(text, add_bos=True)
    if len(ids) < args.tokens:
        raise CliError(f"the text has only {len(ids)} tokens, fewer than --tokens {args.tokens}")
    ids = ids[:args.tokens]
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), unit="tok", desc="quality", file=sys.stderr)
        except ImportError:  # pragma: no cover
            bar = None
    done = [0]

    def progress(n: int) -> None:
        if bar is not None:
            bar.update(n - done[0])
        done[0] = n

    rows = q.evaluate(model, ids, kvs, chunk=args.chunk, sliding=args.sliding, rotation=args.rotation,
                      progress=progress, q_precision=args.q_precision)
    if bar is not None:
        bar.close()
    env = q.environment()
    model_name = os.path.basename(args.model)
    # positions scored through decode steps (one-token chunks): all of them with --chunk 1
    decode_positions = len(ids) if args.chunk == 1 else int(len(ids) % args.chunk == 1)
    qp_option = args.q_precision or "default"
    for r in rows:
        r.update(model=model_name, text=source, tokens=len(ids), chunk=args.chunk, sliding=args.sliding,
                 rotation=args.rotation, q_precision_option=qp_option, decode_positions=decode_positions,
                 environment=env)
    title = f"{model_name}, {len(ids)} tokens of {source}, chunk {args.chunk}, rotation {args.rotation}"
    if args.q_precision or args.chunk == 1:
        title += f", decode q precision {qp_option} (reference f16: exact)"
    if args.q_precision and decode_positions < len(ids):
        print(f"note: --q-precision acts on decode steps only; with --chunk {args.chunk}, {decode_positions} "
              f"of {len(ids)} positions are scored through one (use --chunk 1)", file=sys.stderr)
    md = q.to_markdown(rows, title)
    print(md)
    for r in rows:   # which paths ran, and any fallback, always visible
        if r.get("paths_line"):
            print(f"{r['kv']}: {r['paths_line']}", file=sys.stderr)
        if r.get("decode_q"):
            print(f"{r['kv']}: decode q: " + ", ".join(f"{k} x{v}" for k, v in r["decode_q"].items()),
                  file=sys.stderr)
    if args.json_out:
        _write_atomic(args.json_out, json.dumps(rows, indent=2))
    if args.markdown:
        _write_atomic(args.markdown, md)
    if args.plot:
        q.plot(rows, args.plot, title)
    return 0
