"""Generation through the tqbridge cache on a machine without llama-cpp-python (e.g. a GPU box).

``tqbridge generate`` takes its tokenizer from llama-cpp-python. Where that is not installed, split
the run in three:

    python benchmarks/scripts/generate_ids.py prepare MODEL --prompt "..." [--chat] --out ids.json   # llama.cpp tokenizer
    python benchmarks/scripts/generate_ids.py run MODEL.gguf --ids ids.json --kv q8_0/turbo3 --out gen.json
    python benchmarks/scripts/generate_ids.py show MODEL --gen gen.json                            # text back

``run`` needs only MLX, mlx-lm and gguf-py; it records which attention path each layer took
(``decode:cuda`` when the fused kernel ran on the GPU), tokens per second and peak memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tqbridge.bridge.atomic import write_atomic  # noqa: E402


def prepare(args) -> None:
    from tqbridge.bridge.gguf.tokenizer import ChatTokenizer
    from tqbridge.tools.cmd_generate import chat_prompt, resolve_model

    path = resolve_model(args.model)
    tok = ChatTokenizer(path)
    prompt = chat_prompt(path, args.prompt) if args.chat else args.prompt
    ids = tok.encode(prompt, add_bos=True)
    write_atomic(args.out, json.dumps({"model": Path(path).name, "prompt": args.prompt, "chat": args.chat,
                                       "ids": ids, "eos": sorted(tok.eos_token_ids)}))
    print(f"{len(ids)} prompt tokens -> {args.out}")


def run(args) -> None:
    import mlx.core as mx

    from tqbridge.bridge.gguf.model import load_gguf_model
    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.bridge.blocks.kv_spec import kv_name, parse_kv_spec
    from tqbridge.metal.lm.report import cache_report
    from tqbridge.metal.lm.routing import route_attention
    from tqbridge.tools.cmd_generate import generate_tokens

    spec = json.loads(Path(args.ids).read_text())
    kf, vf, cal = parse_kv_spec(args.kv)
    model, _ = load_gguf_model(args.model)
    cache = make_cache(model, kf, vf, calibration=cal)
    if args.q_precision:
        for c in cache:
            if hasattr(c, "q_precision"):
                c.q_precision = args.q_precision
    mx.reset_peak_memory()
    out, t0, t_first = [], time.perf_counter(), None
    with route_attention("auto"):
        for token in generate_tokens(model, spec["ids"], cache, args.max_tokens):
            t_first = t_first or time.perf_counter()
            if token in spec["eos"]:
                break
            out.append(int(token))
    t1 = time.perf_counter()
    rep = cache_report(cache)
    res = {"model": Path(args.model).name, "kv": kv_name(kf, vf, cal), "device": str(mx.default_device()),
           "q_precision_asked": args.q_precision or "default", "decode_runs": _decode_runs(cache),
           "host": platform.node(), "mlx": mx.__version__, "prompt_tokens": len(spec["ids"]),
           "generated": out, "paths": rep["paths"], "layer_kinds": rep["layer_kinds"],
           "cache_used_bytes": rep["used_nbytes"], "peak_memory_bytes": mx.get_peak_memory(),
           "decode_tok_per_s": (len(out) - 1) / (t1 - t_first) if t_first and len(out) > 1 else None,
           "date": time.strftime("%Y-%m-%d")}
    write_atomic(args.out, json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "generated"}))


def _decode_runs(cache) -> dict:
    """Which fused kernel and q precision the decode steps ran, counted over layers."""
    from collections import Counter

    runs = Counter()
    for c in cache:
        info = getattr(getattr(getattr(c, "decoder", None), "launch", None), "run_info", None)
        if info:
            runs[f"{info.get('kernel')}/{info.get('q_precision')}"] += 1
    return dict(runs)


def show(args) -> None:
    from tqbridge.bridge.gguf.tokenizer import ChatTokenizer
    from tqbridge.tools.cmd_generate import resolve_model

    res = json.loads(Path(args.gen).read_text())
    print(ChatTokenizer(resolve_model(args.model)).decode(res["generated"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("model")
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true")
    p.add_argument("--out", required=True)
    p = sub.add_parser("run")
    p.add_argument("model")
    p.add_argument("--ids", required=True)
    p.add_argument("--kv", default="q8_0/turbo3")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--q-precision", choices=("exact", "int8"), default=None,
                   help="decode attention's q precision (default: the backend's)")
    p.add_argument("--out", required=True)
    p = sub.add_parser("show")
    p.add_argument("model")
    p.add_argument("--gen", required=True)
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "show": show}[args.cmd](args)


if __name__ == "__main__":
    main()
