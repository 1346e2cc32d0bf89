"""What the combine pass costs a decode token: bench decode's interleaved rounds with one more cache whose
combine pass is not launched at all.

    python benchmarks/scripts/ablate_combine.py [--model llama-3.1-8b] [--context 4096,32768]
        [--cache q8_0/turbo3] [--tokens 32] [--rounds 6] [--json out.json]

Per context, four caches decode in interleaved rounds (metal/lm/decode_bench.decode_group): fp16, the cache
as it ships, the cache without mx.compile (``compile=0``), and the same without mx.compile whose
combine pass returns a resident zero array that depends on pass 1's partials (``mx.depends``: no kernel),
so pass 1 (with the folded append) still runs every step. Without mx.compile each step calls the launch
afresh, which is how the ablated cache can skip the combine while the others keep it. The last two
caches' difference is the most any change to the combine (folding it into pass 1, say) can save; the
first two show what mx.compile is worth. The ablated cache's attention outputs are zero: only its time
means something.
"""

from __future__ import annotations

import argparse
import json
import statistics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--context", default="4096,32768")
    ap.add_argument("--cache", default="q8_0/turbo3")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import mlx.core as mx

    from tqbridge.metal.attention import launch as launch_mod
    from tqbridge.metal.lm import decode_bench

    kinds = ["fp16", args.cache, args.cache + "{compile=0}", args.cache + "{compile=0}"]
    ablated_index = 3
    state = {"ablate": False, "prepared": 0, "ablated": set(), "skipped": 0}
    zeros: dict = {}
    original_combine = launch_mod.Launches.combine

    def combine(self, po, pml, sk, dtype):
        if not state["ablate"]:
            return original_combine(self, po, pml, sk, dtype)
        key = (tuple(self.shape[0]), dtype)
        z = zeros.get(key)
        if z is None:
            z = zeros[key] = mx.zeros(self.shape[0], dtype)
            mx.eval(z)
        state["skipped"] += 1
        return mx.depends([z], [po, pml])[0]

    launch_mod.Launches.combine = combine
    original_prepare = decode_bench.prepare_cache

    def prepare_cache(*a, **k):
        row, cache = original_prepare(*a, **k)
        if state["prepared"] % len(kinds) == ablated_index and cache is not None:
            state["ablated"].add(id(cache))
        state["prepared"] += 1
        return row, cache

    def flagged(fn, cache_arg):
        def run(*a, **k):
            state["ablate"] = id(a[cache_arg]) in state["ablated"]
            try:
                return fn(*a, **k)
            finally:
                state["ablate"] = False
        return run

    decode_bench.prepare_cache = prepare_cache
    decode_bench.decode_tokens = flagged(decode_bench.decode_tokens, 1)
    decode_bench.device_profile = flagged(decode_bench.device_profile, 1)
    decode_bench.layer_step_profile = flagged(decode_bench.layer_step_profile, 0)

    model, desc = decode_bench.build_model(args.model)
    out = {"command": "python benchmarks/scripts/ablate_combine.py " + " ".join(
        f"--{k} {v}" for k, v in (("model", args.model), ("context", args.context), ("cache", args.cache),
                                  ("tokens", args.tokens), ("rounds", args.rounds))),
           "device": str(mx.default_device()), "mlx": mx.__version__, "model": desc, "runs": []}
    for ctx in [int(x) for x in args.context.split(",") if x]:
        state["skipped"] = 0
        rows = decode_bench.decode_group(model, kinds, ctx, args.tokens, args.rounds)
        if state["skipped"] == 0:
            raise SystemExit("the ablated cache never reached the combine pass: the patch no longer applies")
        names = ["fp16", "shipped", "uncompiled", "uncompiled_no_combine"]
        for name, row in zip(names, rows):
            keep = {k: row[k] for k in ("cache", "context", "ms_per_token", "tokens_per_s", "speedup_vs_fp16",
                                         "speedup_vs_fp16_spread", "ms_per_token_rounds", "device_ms_per_token",
                                         "device_kernels_ms_per_token", "decode_kernel", "error") if k in row}
            out["runs"].append({"variant": name, **keep})
        by = {n: r for n, r in zip(names, rows)}
        saved = [a - b for a, b in zip(by["uncompiled"]["ms_per_token_rounds"],
                                       by["uncompiled_no_combine"]["ms_per_token_rounds"])]
        summary = {"context": ctx, "combine_saved_ms_per_token_median": statistics.median(saved),
                   "combine_saved_ms_per_token_rounds": saved,
                   "no_combine_vs_fp16": by["uncompiled_no_combine"].get("speedup_vs_fp16"),
                   "uncompiled_vs_fp16": by["uncompiled"].get("speedup_vs_fp16"),
                   "shipped_vs_fp16": by["shipped"].get("speedup_vs_fp16")}
        out.setdefault("summary", []).append(summary)
        print(json.dumps(summary), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
