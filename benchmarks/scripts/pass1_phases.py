"""Where pass 1's time goes inside the kernel: kernel int8-mma's profiling build (static parameter
TQA_PHASES), launched through MLX as tqbridge launches it (``--backend cuda``), or on the CPU emulator.

Each threadgroup stamps five points (entry; q rotated and quantized; the first tile landed; the key loop
done; its partial written) with the GPU's global timer and the SM's cycle counter. Per launch this reports
the span (first entry to last exit, global timer) next to the launch's wall time, how the threadgroups'
entries and exits spread over the span (quantiles from the first entry), and the median per-threadgroup
durations of the four phases in cycles and, at the SM clock the launch implies, in µs. A kernel whose
span is mostly entry skew and exit spread is limited by its grid, one whose threadgroups spend it in the
key loop by its streaming; the read bandwidth measured here (CuPy's sum over 1 GiB in device memory)
gives the streaming floor.

    python benchmarks/scripts/pass1_phases.py --context 4096,32768,131072 --json out.json

On the emulator (``--backend cpu-emulator``: small contexts) both counters count their calls, so the
report shows the points' order, not times: tests/test_attention_int8_mma_phases.py runs the script so.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np

# between the kernel's five stamps (entry, q ready, first tile landed, key loop done, partial written)
PHASES = ("prologue", "first_tile_wait", "key_loop", "epilogue")
STAMP_WORDS = 2 * 5 * 2   # per threadgroup: (timer, cycles) x 5 points x (low, high) uint32 words


def _quantiles(x: np.ndarray) -> dict:
    return {f"p{q}": float(np.percentile(x, q)) for q in (10, 50, 90, 100)}


def summarize(stamps: np.ndarray, cycles: np.ndarray, event_us: float) -> dict:
    """One launch's profile from per-threadgroup global-timer stamps (ns) and cycle stamps, both
    (threadgroups, 5), and its wall time (``event_us``); threadgroups with no keys (a zero stamp) are left
    out."""
    ok = (stamps > 0).all(axis=1) & (cycles > 0).all(axis=1)
    t, c = stamps[ok].astype(np.int64), cycles[ok].astype(np.int64)
    t0 = t[:, 0].min()
    span_ns = float(t[:, 4].max() - t0)
    dur_cycles = c[:, 4] - c[:, 0]
    dur_ns = t[:, 4] - t[:, 0]
    ghz = float(np.median(dur_cycles) / max(np.median(dur_ns), 1.0))   # the SM clock, cycles per ns
    phases = {}
    for i, name in enumerate(PHASES):
        cyc = float(np.median(c[:, i + 1] - c[:, i]))
        phases[name] = {"cycles": cyc, "us": cyc / ghz / 1e3 if ghz > 0 else None}
    return {"threadgroups": int(ok.sum()), "empty_threadgroups": int((~ok).sum()), "event_us": event_us,
            "span_us": span_ns / 1e3, "sm_ghz": ghz,
            "entry_after_first_us": {k: v / 1e3 for k, v in _quantiles(t[:, 0] - t0).items()},
            "exit_after_first_entry_us": {k: v / 1e3 for k, v in _quantiles(t[:, 4] - t0).items()},
            "threadgroup_us": {k: v / 1e3 for k, v in _quantiles(dur_ns).items()},
            "phases_median": phases}


def read_gbps() -> "float | None":
    """Bytes per second of CuPy's sum over 1 GiB in device memory: the read floor pass 1 streams against
    (None without CuPy: MLX's own passes are no floor, on the H200 its sum read 2.3 TB/s and an
    elementwise pass ~1.1 TB/s, while pass 1's key loop streams ~4 TB/s)."""
    try:
        import cupy as cp
    except ImportError:
        return None
    x = cp.ones(1 << 28, cp.float32)
    for _ in range(2):
        x.sum()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        x.sum()
    stop.record()
    stop.synchronize()
    return x.nbytes * 10 / (cp.cuda.get_elapsed_time(start, stop) * 1e-3) / 1e9


def launcher(backend: str, prob, plan, q, kb, vb, copies: int):
    """``run(i) -> (clk words, wall µs)``: one launch of the profiling build over copy ``i % copies`` of the
    cache, through MLX on CUDA or on the emulator."""
    import time

    import mlx.core as mx

    from tqbridge.metal.attention import build as ab
    from tqbridge.metal.attention.launch import const_buffer

    split_s, _, _, _ = ab.static_params(prob, plan, 0, False)
    k1 = ab.built(backend, 0, 0, {**split_s, "TQA_PHASES": 1}, "int8-mma")
    groups, threads = prob.batch * prob.kv_heads * plan.splits, 32 * plan.warps
    rows = prob.batch * prob.q_heads * prob.rows
    ip1 = np.array(ab.pass1_params(prob, plan), np.int32)
    fixed = [ip1, np.array([prob.scale, 0.0], np.float32), ab.tables(prob), np.zeros(1, np.uint32)]
    shapes = [(rows, plan.partials, prob.v_dim), (rows, plan.partials, 2), (groups * STAMP_WORDS,)]
    if backend == "cpu-emulator":
        def run(i):
            t0 = time.perf_counter()
            _, _, clk = k1([q, kb, vb, *fixed], shapes, (groups, 1, 1), threads)
            return clk, (time.perf_counter() - t0) * 1e6
        return run
    # every input in device memory, written by a device kernel as the decode lane's are (const_buffer):
    # an array made from host data is read through a mapping or migrated on the first touch, which the
    # launches it reaches would time as their prologue
    mq, mfixed = const_buffer(q, True), [const_buffer(a, True) for a in fixed]
    caches = [(const_buffer(kb, True), const_buffer(vb, True)) for _ in range(copies)]
    mx.eval(mq, mfixed, caches)

    read = []   # the device copies of clk the host has read (kept: see run)

    def run(i):
        mk, mv = caches[i % copies]
        mx.synchronize()
        t0 = time.perf_counter()
        _, _, clk = k1(inputs=[mq, mk, mv, *mfixed], output_shapes=shapes,
                       output_dtypes=[mx.float32, mx.float32, mx.uint32], grid=(groups * threads, 1, 1),
                       threadgroup=(threads, 1, 1))
        mx.eval(clk)
        mx.synchronize()
        wall = (time.perf_counter() - t0) * 1e6
        # the host reads a device copy of clk, kept alive: a buffer the host has read holds pages in host
        # memory, and a later launch handed it by MLX's buffer cache would wait on their migration (the
        # stall that UVM's fault handling spreads over the whole launch)
        seen = clk * 1
        mx.eval(seen)
        read.append(seen)
        return np.array(seen), wall
    return run


def main(argv=None) -> int:
    import mlx.core as mx

    from kernel_device_time import COLD_BYTES, random_problem
    from tqbridge import bridge
    from tqbridge.metal.attention import plan as ap_

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", default="4096,32768,131072")
    p.add_argument("--backend", default="cuda", choices=("cuda", "cpu-emulator"))
    p.add_argument("--k-format", default="q8_0")
    p.add_argument("--v-format", default="turbo3")
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--splits", default="", help="comma-separated split counts (default: the plan's)")
    p.add_argument("--launches", type=int, default=20, help="profiled launches per row (medians over them)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    kf, vf = bridge.get_format(a.k_format), bridge.get_format(a.v_format)
    hq, hkv, d = a.q_heads, a.kv_heads, a.head_dim
    gpu = a.backend == "cuda"
    out = {"hardware": platform.node(), "backend": a.backend, "device": str(mx.default_device()),
           "formats": [kf.key, vf.key], "shape": dict(q_heads=hq, kv_heads=hkv, head_dim=d),
           "read_GBps": read_gbps() if gpu else None, "rows": []}
    rng = np.random.default_rng(0)
    for ctx in [int(x) for x in a.context.split(",")]:
        q, kb, vb, prob = random_problem(kf, vf, hq, hkv, d, ctx, rng)
        bytes_read = kb.nbytes + vb.nbytes
        copies = -(-COLD_BYTES // bytes_read) if gpu else 1   # each launch's K/V evicted from L2 since last read
        for ns in [int(x) for x in a.splits.split(",") if x] or [None]:
            plan = ap_.make_plan(prob, a.backend, kernel="int8-mma", splits=ns)
            groups = hkv * plan.splits
            run = launcher(a.backend, prob, plan, q, kb, vb, copies)
            runs = []
            for i in range(a.launches + 2):   # two warm-up launches
                clk, wall = run(i)
                if i < 2:
                    continue
                w = np.asarray(clk).reshape(groups, 2, 5, 2).astype(np.uint64)
                st = w[..., 0] | (w[..., 1] << np.uint64(32))
                runs.append(summarize(st[:, 0], st[:, 1], wall))
            med = lambda f: float(np.median([f(r) for r in runs]))   # noqa: E731
            row = dict(context=ctx, splits=plan.splits, warps=plan.warps, tile=plan.tile, stages=plan.stages,
                       chunks=plan.chunks, threadgroups=groups, bytes_read=bytes_read,
                       read_floor_us=bytes_read / out["read_GBps"] / 1e3 if out["read_GBps"] else None,
                       wall_us=med(lambda r: r["event_us"]), span_us=med(lambda r: r["span_us"]),
                       span_us_min=min(r["span_us"] for r in runs),
                       sm_ghz=med(lambda r: r["sm_ghz"]),
                       entry_p90_us=med(lambda r: r["entry_after_first_us"]["p90"]),
                       entry_max_us=med(lambda r: r["entry_after_first_us"]["p100"]),
                       exit_p10_us=med(lambda r: r["exit_after_first_entry_us"]["p10"]),
                       exit_max_us=med(lambda r: r["exit_after_first_entry_us"]["p100"]),
                       threadgroup_median_us=med(lambda r: r["threadgroup_us"]["p50"]),
                       phases_us={k: med(lambda r, k=k: r["phases_median"][k]["us"] or 0.0)
                                  for k in PHASES},
                       phases_cycles={k: med(lambda r, k=k: r["phases_median"][k]["cycles"])
                                      for k in PHASES},
                       launches=runs)
            out["rows"].append(row)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                              if k != "launches"}), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
