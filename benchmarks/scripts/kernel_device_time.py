"""Device time and resources of the attention kernels' pass 1 on CUDA, without MLX in the loop.

Compiles the same dialect source MLX compiles (header + body, the signature MLX would generate) with
NVRTC through CuPy, then reports per kernel build: registers per thread, local-memory (spill) bytes,
static shared memory, the resident threadgroups per SM those allow, and the device time of pass 1
measured with CUDA events over many launches on random cache bytes at a fixed length. Pass 2
(combine) is timed the same way. What MLX adds on top (graph building, per-call source hashing) is
what ``tqbridge bench attention`` / ``bench decode`` measure.

    python benchmarks/scripts/kernel_device_time.py --context 4096,32768,131072 --kernels tiles,int8-mma --json out.json

``--managed`` puts every array in managed memory, as MLX's CUDA allocator does (the same kernel's
device time inside MLX's chain exceeds CuPy's by 12-16 us per call: docs/benchmark-history.md, 2026-12-01, commit 97f5219).
Needs CuPy and a CUDA GPU (H200 here). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys

import numpy as np

COLD_BYTES = 160 << 20   # > 2x the H200's L2 (60 MB): with --cold, a launch's K/V were evicted since their last use


def cuda_unit(kdef, static: dict) -> str:
    """The CUDA translation unit of a build (benchmarks/scripts/ablate_pass1.py edits it through this name)."""
    return kdef.cuda_source(static)


def random_problem(kf, vf, hq: int, hkv: int, d: int, ctx: int, rng):
    """``(q, kb, vb, prob)``: one query row per head and a cache of ``ctx`` rows, 256 random rows of blocks
    repeated (the kernel reads every byte; their values do not change its time)."""
    from tqbridge import bridge
    from tqbridge.metal.attention import check_problem

    q = rng.standard_normal((1, hq, d)).astype(np.float32)
    kb = np.tile(bridge.quantize(kf, rng.standard_normal((1, hkv, 256, d)).astype(np.float32)), (1, 1, ctx // 256, 1))
    vb = np.tile(bridge.quantize(vf, rng.standard_normal((1, hkv, 256, d)).astype(np.float32)), (1, 1, ctx // 256, 1))
    return q, kb, vb, check_problem(q, kb, vb, k_format=kf, v_format=vf, length=ctx)


def main(argv=None) -> int:
    import cupy as cp

    from tqbridge import bridge
    from tqbridge.metal.attention import build as ab
    from tqbridge.metal.attention import plan as ap_

    p = argparse.ArgumentParser()
    p.add_argument("--context", default="4096,32768,131072")
    p.add_argument("--kernels", default="tiles,int8-mma")
    p.add_argument("--k-format", default="q8_0")
    p.add_argument("--v-format", default="turbo3")
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--splits", default="", help="comma-separated split counts to sweep (default: the plan's)")
    p.add_argument("--warps", default="", help="comma-separated warps to sweep (default: the plan's)")
    p.add_argument("--tiles", default="", help="comma-separated keys per tile to sweep (default: the plan's)")
    p.add_argument("--chunks", default="", help="int8-mma: comma-separated 16-key chunks per SIMD-group step to sweep "
                   "(default: the plan's)")
    p.add_argument("--stages", default="", help="int8-mma: comma-separated tiles in the copy ring to sweep, each at most "
                   "the plan's (fewer stages: less threadgroup memory, more threadgroups per SM; default: the plan's)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--chain", action="store_true",
                   help="time pass 1 and pass 2 alternately, as a chain of layers runs them (an event around each "
                        "kernel), instead of each pass back to back with itself")
    p.add_argument("--cold", action="store_true",
                   help="launch over enough copies of the cache (>= COLD_BYTES in all) that no launch finds its "
                        "K/V in the L2 cache, as in a chain of layers (default: one copy, L2-resident up to ~32K)")
    p.add_argument("--managed", action="store_true",
                   help="every CuPy array in managed (unified) memory, cudaMallocManaged, as MLX's CUDA allocator "
                        "makes every buffer (default: device memory)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.managed:
        cp.cuda.set_allocator(cp.cuda.MemoryPool(cp.cuda.malloc_managed).malloc)
    kf, vf = bridge.get_format(a.k_format), bridge.get_format(a.v_format)
    hq, hkv, d = a.q_heads, a.kv_heads, a.head_dim
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = props["multiProcessorCount"]
    out = {"hardware": platform.node(), "gpu": props["name"].decode(), "sms": sms, "formats": [kf.key, vf.key],
           "shape": dict(q_heads=hq, kv_heads=hkv, head_dim=d), "memory": "managed" if a.managed else "device",
           "rows": []}
    rng = np.random.default_rng(0)
    for ctx in [int(x) for x in a.context.split(",")]:
        q, kb, vb, prob = random_problem(kf, vf, hq, hkv, d, ctx, rng)
        bytes_read = kb.nbytes + vb.nbytes
        dq = cp.asarray(q)
        copies = -(-COLD_BYTES // bytes_read) if a.cold else 1
        dkbs, dvbs = [cp.asarray(kb) for _ in range(copies)], [cp.asarray(vb) for _ in range(copies)]
        for kern in a.kernels.split(","):
            sweep = [(nw, ns, tl, kc, st) for nw in ([int(x) for x in a.warps.split(",") if x] or [None])
                     for ns in ([int(x) for x in a.splits.split(",") if x] or [None])
                     for tl in ([int(x) for x in a.tiles.split(",") if x] or [None])
                     for kc in ([int(x) for x in a.chunks.split(",") if x] or [None])
                     for st in ([int(x) for x in a.stages.split(",") if x] or [None])]
            for nw, ns, tl, kc, st in sweep:
                try:
                    plan = ap_.make_plan(prob, "cuda", kernel=kern, warps=nw, splits=ns, tile=tl,
                                        **({"chunks": kc} if kc is not None else {}))
                except Exception as e:
                    print(f"{ctx} {kern} warps={nw} splits={ns} tile={tl} chunks={kc}: {e}", file=sys.stderr)
                    continue
                if st is not None:
                    if plan.kernel != "int8-mma" or not 2 <= st <= plan.stages:
                        print(f"{ctx} {kern} stages={st}: int8-mma takes 2..{plan.stages} here", file=sys.stderr)
                        continue
                    plan = dataclasses.replace(plan, stages=st)   # a smaller ring fits where the plan's did
                split_s, comb_s, extra1, extra2 = ab.static_params(prob, plan, 0, False)
                k1def, k2def = ab.kernel_defs(0, plan.kernel)
                k1 = cp.RawKernel(cuda_unit(k1def, split_s), k1def.name, options=("--std=c++17",))
                dsmem = int(split_s.get("TQ_DSMEM", 0))   # dynamic shared memory (>= attention_plan.DSMEM_MIN on CUDA), as MLX requests it
                if dsmem:
                    k1.max_dynamic_shared_size_bytes = dsmem
                k2 = cp.RawKernel(cuda_unit(k2def, comb_s), k2def.name, options=("--std=c++17",))
                # the one batch row's length and start follow the head
                ip1 = cp.asarray(np.array([prob.l_max, plan.split_len, plan.splits, prob.window, hkv, *extra1, ctx, 0],
                                          np.int32))
                fp1 = cp.asarray(np.array([prob.scale, 0.0], np.float32))
                tabs = cp.asarray(ab.tables(prob))
                dep = cp.zeros(1, cp.uint32)
                rows = hq
                po = cp.empty((rows, plan.partials, prob.v_dim), cp.float32)
                pml = cp.empty((rows, plan.partials, 2), cp.float32)
                ip2 = cp.asarray(np.array([plan.partials, hq, 0, *extra2], np.int32))
                sinks = cp.zeros(hq, cp.float32)
                res = cp.empty((rows, d), cp.float32)
                g1, t1 = (hkv * plan.splits,), (32 * plan.warps,)
                g2, t2 = (rows,), (ap_.COMBINE_THREADS,)

                turn = [0]

                def one():
                    i = turn[0] = (turn[0] + 1) % copies
                    k1(g1, t1, (dq, dkbs[i], dvbs[i], ip1, fp1, tabs, dep, po, pml), shared_mem=dsmem)

                def two():
                    k2(g2, t2, (po, pml, ip2, sinks, tabs, res))

                times = {}
                if a.chain:
                    one(), two()
                    cp.cuda.Device().synchronize()
                    ev = [[cp.cuda.Event() for _ in range(3)] for _ in range(a.iters)]
                    for e in ev:
                        e[0].record()
                        one()
                        e[1].record()
                        two()
                        e[2].record()
                    ev[-1][2].synchronize()
                    for name, i in (("pass1", 0), ("pass2", 1)):
                        ts = sorted(cp.cuda.get_elapsed_time(e[i], e[i + 1]) * 1e3 for e in ev)
                        times[name] = ts[len(ts) // 2]
                for name, fn in (() if times else (("pass1", one), ("pass2", two))):
                    fn()
                    cp.cuda.Device().synchronize()
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    for _ in range(a.iters):
                        fn()
                    e1.record()
                    e1.synchronize()
                    times[name] = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / a.iters
                at = k1.attributes
                regs, local, smem = at["num_regs"], at["local_size_bytes"], at["shared_size_bytes"]
                threads = 32 * plan.warps
                by_regs = 65536 // max(1, regs * threads)
                by_smem = (props.get("sharedMemPerMultiprocessor", 233472)) // max(1, smem + dsmem + 1024)
                row = dict(context=ctx, kernel=plan.kernel, warps=plan.warps, splits=plan.splits, tile=plan.tile,
                           stages=plan.stages, chunks=plan.chunks, dynamic_shared_bytes=dsmem,
                           ctas=hkv * plan.splits, regs=regs, local_bytes=local, shared_bytes=smem,
                           resident_ctas_per_sm=min(by_regs, by_smem, 32), pass1_us=times["pass1"],
                           pass2_us=times["pass2"], bytes_read=bytes_read, copies=copies, chain=a.chain,
                           pass1_TBps=bytes_read / times["pass1"] / 1e6)
                out["rows"].append(row)
                print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
                      flush=True)
        del dq, dkbs, dvbs
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
