"""Pass 1 and the combine inside a decode (cold) against the same launches repeated right after (warm), on CUDA.

    python benchmarks/scripts/pass1_cold_warm.py [--model llama-3.1-8b] [--context 4096,32768]
        [--cache q8_0/turbo3] [--tokens 16] [--no-fold] [--json out.json]

Each layer's decode step runs as usual (on CUDA: pass 1 with the step's append folded in, then the combine),
then once more without the append over the same buffers (ordered after the append's flag): plain pass 1 and
the combine, whose output is added times 0 to the layer's, so it runs and changes nothing. The second pair
finds the kernel's code, the tables and the layer's blocks just used; the first meets them after the
weights' matrix-vector products. Per context, from CUPTI (PyTorch's profiler) over a decode of ``--tokens``
tokens through mlx-lm: the median duration of the first (folded) pass 1, of the plain pass 1 after it, of the first
and of the second combine. The second pass 1 does not wait for the first combine, so the two may overlap:
the first combine's duration can include that overlap. ``--no-fold``: the cache's append kernel runs first
(``fold_append`` off) and both pairs are plain: their first pass 1 against the folded one measures what the
fold adds to pass 1's critical path.
"""

from __future__ import annotations

import argparse
import json
import statistics


def cold_warm(events: list, no_fold: bool) -> "dict | None":
    """The medians of :func:`main`'s decode from ``(name, start_us, end_us)`` kernel stamps (by start): each
    layer's first pass 1 (the folded build, or with ``no_fold`` the first of two plain ones) and the plain
    one after it, the first and second combine; None where no first pass 1 ran (or, folded, unpaired)."""
    p1 = [(n, e - s) for n, s, e in events if "tq_attention_split" in n]
    comb = [e - s for n, s, e in events if "tq_attention_combine" in n]
    if no_fold:
        first, second = [d for _, d in p1[0::2]], [d for _, d in p1[1::2]]
    else:
        first, second = [d for n, d in p1 if "_fold" in n], [d for n, d in p1 if "_fold" not in n]
    if not first or not second or (not no_fold and len(first) != len(second)):
        return None
    return {("pass1_first_us" if no_fold else "pass1_folded_us"): statistics.median(first),
            "pass1_plain_after_us": statistics.median(second),
            "combine_first_us": statistics.median(comb[0::2]), "combine_second_us": statistics.median(comb[1::2]),
            "pass1_launches": len(p1)}


def main(argv=None) -> int:
    import mlx.core as mx
    import torch
    from mlx_lm.generate import generate_step
    from torch.profiler import ProfilerActivity, profile

    from decode_token_timeline import kernel_events   # the sibling script's CUPTI stamps (run from this folder)
    from tqbridge.metal.attention import launch as attention_launch
    from tqbridge.metal.decode_options import DecodeOptions
    from tqbridge.metal.lm import decode_bench
    from tqbridge.metal.lm.routing import route_attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--context", default="4096,32768")
    ap.add_argument("--cache", default="q8_0/turbo3")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--no-fold", action="store_true", help="the append kernel, then two plain pairs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    folded = attention_launch.Launches.launch_folded

    def twice(self, k1f, append, q, kb, vb, ip1, k_rows, v_rows, params, flag_in, *qsc):
        flag, out = folded(self, k1f, append, q, kb, vb, ip1, k_rows, v_rows, params, flag_in, *qsc)
        again = self.launch(q, kb, vb, None, ip1, flag, *qsc)
        return flag, out + 0 * again

    plain = attention_launch.Launches.launch

    def plain_twice(self, q, kb, vb, sinks, ip1, dep, *qsc):
        out = plain(self, q, kb, vb, sinks, ip1, dep, *qsc)
        after = mx.view(out, mx.uint32)   # the second pair runs after the first (a view: no kernel)
        return out + 0 * plain(self, q, kb, vb, sinks, ip1, after, *qsc)

    if args.no_fold:
        attention_launch.Launches.launch = plain_twice
    else:
        attention_launch.Launches.launch_folded = twice
    options = DecodeOptions(fold_append=False) if args.no_fold else None
    model, _ = decode_bench.build_model(args.model, mx.float16)
    report = {"model": args.model, "cache": args.cache, "tokens": args.tokens, "fold": not args.no_fold,
              "contexts": {}}
    for ctx in (int(c) for c in args.context.split(",")):
        row, cache = decode_bench.prepare_cache(model, args.cache, ctx, mx.float16, options)
        if cache is None:
            raise SystemExit(f"{args.cache} at {ctx}: {row}")

        def decode(n):
            with route_attention():
                for _ in generate_step(mx.array([1], mx.uint32), model, prompt_cache=cache, max_tokens=n):
                    pass
            mx.synchronize()

        decode(4)   # builds and first-step allocations
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            decode(args.tokens)
            torch.cuda.synchronize()
        got = cold_warm(kernel_events(prof), args.no_fold)
        if got is None:
            raise SystemExit(f"no {'plain' if args.no_fold else 'folded'} pass 1 pairs at {ctx} (a fold off or refused "
                             "where asked: the cache report says why)")
        report["contexts"][str(ctx)] = got
        print(ctx, json.dumps(got), flush=True)
        del cache
        mx.clear_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
