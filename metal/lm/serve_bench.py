"""Batched decode through mlx-lm's ``BatchGenerator``: ``tqbridge bench serve``.

What a server decoding many sequences at once sees: per cache kind (mlx-lm's fp16 cache, TQCache pairs),
context and batch size B, B single-sequence prompt caches are filled to the context with model-shaped
random K/V rows (:func:`tqbridge.metal.lm.decode_bench.prefill`), handed to a ``BatchGenerator`` as
cached prompts of one remaining token (mlx-lm merges them into its batch cache: ``BatchKVCache`` for
fp16, :class:`~tqbridge.metal.lm.cache.BatchTQCache` for TQCache), and decoded ``tokens`` steps inside
:func:`~tqbridge.metal.lm.routing.route_attention`. Rounds are interleaved (each round runs every kind
and batch size in turn); every run builds its batch afresh.

Per run: aggregate decode tokens/s (B over the mean step time, the first 2 steps dropped; the median beside it), MLX's peak
memory while the batch decodes (reset after the batch is formed) and over the whole run (prefill and
merge included). Per kind and context: the KV bytes one sequence holds after its prefill (``nbytes`` of
its caches, measured) and the largest number of such sequences a KV budget holds. A run that would not
fit the device memory (the sequences' KV twice, as they merge, plus the weights) is not run; its row
says so.
"""

from __future__ import annotations

import gc
import statistics
import time

import mlx.core as mx

from .decode_bench import build_model, make_caches, model_bytes, prefill, report_head

__all__ = ["serve_group", "run", "fits", "device_memory"]

WARMUP_STEPS = 2


def fits(budget_bytes: int, per_sequence: int) -> int:
    """How many sequences of ``per_sequence`` KV bytes a budget of ``budget_bytes`` holds."""
    return budget_bytes // per_sequence if per_sequence > 0 else 0


def _sequences(model, kind: str, context: int, batch: int, dtype) -> list:
    from ..profiling import split_options

    base, opts = split_options(kind)   # "q8_0/turbo3{fold_append=0}": that cache with those decode options
    out = []
    for i in range(batch):
        cache = make_caches(model, base, opts)
        prefill(cache, model, context, dtype, seed=1 + i)
        mx.eval([c.state for c in cache])
        out.append(cache)
    return out


def _decode(model, kind: str, context: int, batch: int, tokens: int, dtype) -> dict:
    """One run: ``batch`` sequences of ``context`` positions decoding ``tokens`` steps as one batch."""
    from mlx_lm.generate import BatchGenerator

    from .report import paths_line
    from .routing import route_attention

    gc.collect()                           # the previous run's batch is gone before this one's is built
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    caches = _sequences(model, kind, context, batch, dtype)
    gen = BatchGenerator(model, max_tokens=tokens + WARMUP_STEPS + 8, completion_batch_size=batch,
                         prefill_batch_size=batch)
    row: dict = {}
    try:
        with route_attention():
            gen.insert([[1]] * batch, caches=caches)
            del caches
            gen.next()                     # merge the caches into one batch cache, first step
            mx.synchronize()
            row["batch_kv_bytes"] = gen.prompt_cache_nbytes
            row["batch_cache"] = type(gen._generation_batch.prompt_cache[0]).__name__
            mx.reset_peak_memory()
            steps = []
            for _ in range(tokens + WARMUP_STEPS):
                t0 = time.perf_counter()
                got = gen.next()[1]
                steps.append(time.perf_counter() - t0)
                if len(got) != batch:
                    raise RuntimeError(f"a step answered {len(got)} of {batch} sequences")
            mx.synchronize()
            row["decode_peak_bytes"] = mx.get_peak_memory()
            if row["batch_cache"] == "BatchTQCache":   # which paths and kernels the batch's steps ran
                row["paths"] = paths_line(gen._generation_batch.prompt_cache)
    finally:
        gen.close()
    row["step_s"] = statistics.fmean(steps[WARMUP_STEPS:])   # the mean: what tokens/s a server sees
    row["step_median_ms"] = statistics.median(steps[WARMUP_STEPS:]) * 1e3
    row["run_peak_bytes"] = max(mx.get_peak_memory(), row["decode_peak_bytes"])
    return row


def device_memory() -> "int | None":
    """The device's memory in bytes where MLX reports it (``mx.device_info()``), else None."""
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    for key in ("memory_size", "total_memory"):
        if isinstance(info.get(key), int):
            return info[key]
    return None


def serve_group(model, kinds: list[str], context: int, batches: list[int], tokens: int, rounds: int,
                budget_bytes: int, *, memory_bytes: "int | None" = None, dtype=mx.float16, log=print) -> dict:
    """Every kind x batch size at ``context``, ``rounds`` interleaved rounds: ``{"runs": [...], "budget":
    [...]}`` (per kind: KV bytes per sequence and the sequences the budget holds)."""
    per_seq = {}
    budget = []
    weights = model_bytes(model)
    for kind in kinds:
        mx.clear_cache()
        one = _sequences(model, kind, context, 1, dtype)[0]
        per_seq[kind] = sum(c.nbytes for c in one if not c.empty())
        del one
        budget.append({"cache": kind, "context": context, "kv_bytes_per_sequence": per_seq[kind],
                       "budget_bytes": budget_bytes, "sequences_in_budget": fits(budget_bytes, per_seq[kind])})
    for b in budget:
        if budget[0]["sequences_in_budget"]:
            b["sequences_vs_" + kinds[0]] = b["sequences_in_budget"] / budget[0]["sequences_in_budget"]
    rows = {(k, b): {"cache": k, "context": context, "batch": b, "tokens": tokens, "rounds": rounds,
                     "kv_bytes_per_sequence": per_seq[k]} for k in kinds for b in batches}
    steps: dict = {key: [] for key in rows}
    for _ in range(rounds):
        for b in batches:
            for k in kinds:
                row = rows[(k, b)]
                if "error" in row:
                    continue
                need = 2 * b * per_seq[k] + weights
                if memory_bytes is not None and need > memory_bytes:
                    row["error"] = (f"not run: {b} sequences need about {need / 1e9:.1f} GB (their KV twice while "
                                    f"they merge, and the weights); the device has {memory_bytes / 1e9:.1f} GB")
                    continue
                try:
                    got = _decode(model, k, context, b, tokens, dtype)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    continue
                steps[(k, b)].append(got.pop("step_s"))
                row.setdefault("step_median_ms_rounds", []).append(got.pop("step_median_ms"))
                for name in ("decode_peak_bytes", "run_peak_bytes"):
                    row[name] = max(row.get(name, 0), got.pop(name))
                row.update(got)
    for (k, b), row in rows.items():
        if steps[(k, b)]:
            row["step_ms_rounds"] = [s * 1e3 for s in steps[(k, b)]]
            row["step_ms"] = statistics.median(steps[(k, b)]) * 1e3
            row["tokens_per_s"] = b / statistics.median(steps[(k, b)])
            base = steps[(kinds[0], b)]
            if len(base) == len(steps[(k, b)]):
                row["tokens_per_s_vs_" + kinds[0]] = statistics.median(
                    [x / y for x, y in zip(base, steps[(k, b)])])
        log(row)
    return {"runs": list(rows.values()), "budget": budget}


def run(models: list[str], contexts: list[int], batches: list[int], caches: list[str], tokens: int,
        rounds: int, budget_bytes: int, *, memory_bytes: "int | None" = None, dtype=mx.float16, log=print,
        save=None) -> dict:
    """The whole benchmark: every model x context (:func:`serve_group`); ratios against the first cache."""
    out = report_head(prefill="model-shaped random K/V rows (N(0,1), model dtype) per sequence",
                      decode=f"mlx_lm.generate.BatchGenerator under route_attention(), {rounds} interleaved rounds "
                             f"of {tokens} steps per cache and batch size, mean step time ({WARMUP_STEPS} warm-up "
                             "steps dropped); tokens/s = batch / step time",
                      budget="KV bytes only (the model's weights not counted)", runs=[], budgets=[])
    for name in models:
        model, desc = build_model(name, dtype)
        out.setdefault("models", {})[name] = {**desc, "model_bytes": model_bytes(model)}
        for ctx in contexts:
            got = serve_group(model, caches, ctx, batches, tokens, rounds, budget_bytes, memory_bytes=memory_bytes,
                              dtype=dtype, log=log)
            out["runs"] += [{"model": name, **r} for r in got["runs"]]
            out["budgets"] += [{"model": name, **b} for b in got["budget"]]
            if save is not None:
                save(out)
        del model
        mx.clear_cache()
    return out
