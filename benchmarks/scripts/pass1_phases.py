"""Where pass 1's time goes inside the kernel: kernel int8-mma's profiling build (static parameter
TQA_PHASES) on CUDA, without MLX in the loop.

Each threadgroup stamps five points (entry; q rotated and quantized; the first tile landed; the key loop
done; its partial written) with the GPU's global timer and the SM's cycle counter. Per launch this reports
the span (first entry to last exit, global timer) next to the CUDA-event time of the same launch, how
the threadgroups' entries and exits spread over the span (quantiles from the first entry), and the
median per-threadgroup durations of the four phases in cycles and, at the SM clock the launch implies,
in µs. A kernel whose span is mostly entry skew and exit spread is limited by its grid, one whose
threadgroups spend it in the key loop by its streaming; the copy bandwidth measured here (a device copy
of a large buffer) gives the streaming floor.

    python benchmarks/scripts/pass1_phases.py --context 4096,32768,131072 --json out.json

Needs CuPy and a CUDA GPU. Not part of the test suite (tests/test_attention_int8_mma_phases.py checks the
build on the emulator, tests/test_cuda_compile.py compiles it for sm_90a).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np

POINTS = ("entry", "q_ready", "first_tile", "loop_done", "written")


def _quantiles(x: np.ndarray) -> dict:
    return {f"p{q}": float(np.percentile(x, q)) for q in (10, 50, 90, 100)}


def summarize(stamps: np.ndarray, cycles: np.ndarray, event_us: float) -> dict:
    """One launch's profile from per-threadgroup global-timer stamps (ns) and cycle stamps, both
    (threadgroups, 5); threadgroups with no keys (a zero stamp) are left out."""
    ok = (stamps > 0).all(axis=1) & (cycles > 0).all(axis=1)
    t, c = stamps[ok].astype(np.int64), cycles[ok].astype(np.int64)
    t0 = t[:, 0].min()
    span_ns = float(t[:, 4].max() - t0)
    dur_cycles = c[:, 4] - c[:, 0]
    dur_ns = t[:, 4] - t[:, 0]
    ghz = float(np.median(dur_cycles) / max(np.median(dur_ns), 1.0))   # the SM clock, cycles per ns
    phases = {}
    for i, name in enumerate(("prologue", "first_tile_wait", "key_loop", "epilogue")):
        cyc = float(np.median(c[:, i + 1] - c[:, i]))
        phases[name] = {"cycles": cyc, "us": cyc / ghz / 1e3 if ghz > 0 else None}
    return {"threadgroups": int(ok.sum()), "empty_threadgroups": int((~ok).sum()), "event_us": event_us,
            "span_us": span_ns / 1e3, "sm_ghz": ghz,
            "entry_after_first_us": {k: v / 1e3 for k, v in _quantiles(t[:, 0] - t0).items()},
            "exit_after_first_entry_us": {k: v / 1e3 for k, v in _quantiles(t[:, 4] - t0).items()},
            "threadgroup_us": {k: v / 1e3 for k, v in _quantiles(dur_ns).items()},
            "phases_median": phases}


def main(argv=None) -> int:
    import cupy as cp

    from kernel_device_time import COLD_BYTES, random_problem
    from tqbridge import bridge
    from tqbridge.metal import attention_build as ab, attention_plan as ap_

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", default="4096,32768,131072")
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
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    # the copy bandwidth: a device copy of 1 GiB, bytes of the source per second
    src = cp.ones(1 << 28, cp.float32)
    dst = cp.empty_like(src)
    cp.copyto(dst, src)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(5):
        cp.copyto(dst, src)
    e1.record()
    e1.synchronize()
    copy_gbps = src.nbytes * 5 / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9
    del src, dst
    out = {"hardware": platform.node(), "gpu": props["name"].decode(), "sms": props["multiProcessorCount"],
           "formats": [kf.key, vf.key], "shape": dict(q_heads=hq, kv_heads=hkv, head_dim=d),
           "copy_GBps": copy_gbps, "rows": []}
    rng = np.random.default_rng(0)
    for ctx in [int(x) for x in a.context.split(",")]:
        q, kb, vb, prob = random_problem(kf, vf, hq, hkv, d, ctx, rng)
        bytes_read = kb.nbytes + vb.nbytes
        copies = -(-COLD_BYTES // bytes_read)
        dkbs, dvbs = [cp.asarray(kb) for _ in range(copies)], [cp.asarray(vb) for _ in range(copies)]
        dq = cp.asarray(q)
        for ns in [int(x) for x in a.splits.split(",") if x] or [None]:
            plan = ap_.make_plan(prob, "cuda", kernel="int8-mma", splits=ns)
            static = {**ab.static_params(prob, plan, 0, False)[0], "TQA_PHASES": 1}
            kdef = ab.kernel_defs(0, "int8-mma", False, True)[0]
            k1 = cp.RawKernel(kdef.cuda_source(static), kdef.name, options=("--std=c++17",))
            dsmem = int(static.get("TQ_DSMEM", 0))
            if dsmem:
                k1.max_dynamic_shared_size_bytes = dsmem
            extra1 = ab.static_params(prob, plan, 0, False)[2]
            ip1 = cp.asarray(np.array([prob.l_max, plan.split_len, plan.splits, prob.window, hkv, *extra1, ctx], np.int32))
            fp1 = cp.asarray(np.array([prob.scale, 0.0], np.float32))
            tabs, dep = cp.asarray(ab.tables(prob)), cp.zeros(1, cp.uint32)
            po = cp.empty((hq, plan.partials, prob.v_dim), cp.float32)
            pml = cp.empty((hq, plan.partials, 2), cp.float32)
            groups = hkv * plan.splits
            clk = cp.zeros(groups * 20, cp.uint32)
            runs = []
            for i in range(a.launches + 2):   # two warm-up launches
                j = i % copies
                clk.fill(0)
                s0, s1 = cp.cuda.Event(), cp.cuda.Event()
                s0.record()
                k1((groups,), (32 * plan.warps,), (dq, dkbs[j], dvbs[j], ip1, fp1, tabs, dep, po, pml, clk),
                   shared_mem=dsmem)
                s1.record()
                s1.synchronize()
                if i < 2:
                    continue
                w = cp.asnumpy(clk).reshape(groups, 2, 5, 2).astype(np.uint64)
                st = w[..., 0] | (w[..., 1] << np.uint64(32))
                runs.append(summarize(st[:, 0], st[:, 1], cp.cuda.get_elapsed_time(s0, s1) * 1e3))
            med = lambda f: float(np.median([f(r) for r in runs]))   # noqa: E731
            row = dict(context=ctx, splits=plan.splits, warps=plan.warps, tile=plan.tile, stages=plan.stages,
                       chunks=plan.chunks, threadgroups=groups, bytes_read=bytes_read,
                       copy_floor_us=bytes_read / copy_gbps / 1e3, event_us=med(lambda r: r["event_us"]),
                       span_us=med(lambda r: r["span_us"]), sm_ghz=med(lambda r: r["sm_ghz"]),
                       entry_p90_us=med(lambda r: r["entry_after_first_us"]["p90"]),
                       entry_max_us=med(lambda r: r["entry_after_first_us"]["p100"]),
                       exit_p10_us=med(lambda r: r["exit_after_first_entry_us"]["p10"]),
                       exit_max_us=med(lambda r: r["exit_after_first_entry_us"]["p100"]),
                       threadgroup_median_us=med(lambda r: r["threadgroup_us"]["p50"]),
                       phases_us={k: med(lambda r, k=k: r["phases_median"][k]["us"] or 0.0)
                                  for k in ("prologue", "first_tile_wait", "key_loop", "epilogue")},
                       launches=runs)
            out["rows"].append(row)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                              if k != "launches"}), flush=True)
        del dq, dkbs, dvbs
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
