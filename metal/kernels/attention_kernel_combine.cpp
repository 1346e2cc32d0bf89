// Fused decode attention, pass 2 of 2 (tqbridge kernel dialect): one threadgroup per output row
// (batch row, query head, query row). Merges the NP partials of pass 1 (and the head's sink
// logit), divides by the softmax sum, rotates the row back once when V is turbo, and writes the
// first D values in q's element type. A row that sees no key (and no sink mass) is zero.
//
// Compile-time (each name prefixed TQA_): DV, D, T, VGRP, VROT (rotation group of the output, 0: none), NT (threads, >= DV, a power of 2),
// MAXP (most partials), QTYPE. Buffers: po (rows, NP, DV), pml (rows,
// NP, 2), ip = {NP, Hq, has_sinks, [T, VGRP, VROT with TQA_DYN]}, sinks (Hq), tabs (as in pass 1). Out: out (rows, D).
const uint tid = tq_tid;
const uint row = tq_gx;
const int np = ip[0], hq_all = ip[1], has_sinks = ip[2];
#if TQA_DYN  // T, VGRP, VROT from ip[3..5]
const int T = ip[3], vgrp = ip[4], vrot = ip[5];
#else
const int T = TQA_T, vgrp = TQA_VGRP, vrot = TQA_VROT;
#endif
(void)vgrp;
const int hq = (int)(row / (uint)T) % hq_all;
TQ_SHARED_ARRAY(float, osh, TQA_DV);
TQ_SHARED_ARRAY(float, wsh, TQA_MAXP);
TQ_SHARED_ARRAY(float, red, TQA_NT);
constexpr int NSG = TQA_NT / 32;      // SIMD groups
TQ_SHARED_ARRAY(float, sg_max, NSG);
TQ_SHARED_ARRAY(float, sg_den, NSG);
const uint lane = tid % 32u, sg = tid / 32u;
const size_t base = (size_t)row * (size_t)np;
// The partial outputs a thread weighs (up to PR of them, into registers) and the partials' (max, sum)
// pairs are loaded first, before any reduction, and the reductions run in SIMD groups (one barrier
// each): a row costs a few dependent memory round trips and barriers, not one per step of a tree.
constexpr int PG = TQA_NT / TQA_DV;   // groups of threads splitting the partials in the weighted sum
constexpr int PR = 64;                // partial outputs per thread held in registers (the rest: a loop)
const int dcol = (int)tid % TQA_DV, g = (int)tid / TQA_DV;
const bool summer = (int)tid < PG * TQA_DV;
float pv[PR];
TQ_UNROLL
for (int j = 0; j < PR; ++j) {
    const int i = g + j * PG;
    pv[j] = (summer && i < np) ? po[(base + i) * TQA_DV + dcol] : 0.0f;
}
const bool one = np <= TQA_NT;        // each thread holds at most one (max, sum) pair
const float m0 = ((int)tid < np) ? pml[(base + tid) * 2] : TQA_NEG_BIG;
const float l0 = ((int)tid < np) ? pml[(base + tid) * 2 + 1] : 0.0f;
// the largest of the partial maxima and the sink: per thread, per SIMD group, then across groups
float mx = m0;
if (!one) for (int i = (int)tid + TQA_NT; i < np; i += TQA_NT) { const float mi = pml[(base + i) * 2]; mx = mi > mx ? mi : mx; }
mx = tq_simd_max(mx);
if (lane == 0u) sg_max[sg] = mx;
tq_barrier();
mx = sg_max[0];
for (int w = 1; w < NSG; ++w) mx = sg_max[w] > mx ? sg_max[w] : mx;
const float sink = has_sinks ? sinks[hq] : TQA_NEG_BIG;
if (has_sinks && sink > mx) mx = sink;
// weights of the partials and the softmax denominator (same layout)
float dp = 0.0f;
if ((int)tid < np) { const float w = tq_exp(m0 - mx); wsh[tid] = w; dp = l0 * w; }
if (!one) {
    for (int i = (int)tid + TQA_NT; i < np; i += TQA_NT) {
        const float w = tq_exp(pml[(base + i) * 2] - mx);
        wsh[i] = w;
        dp += pml[(base + i) * 2 + 1] * w;
    }
}
dp = tq_simd_sum(dp);
if (lane == 0u) sg_den[sg] = dp;
tq_barrier();
float den = 0.0f;
for (int w = 0; w < NSG; ++w) den += sg_den[w];
den += has_sinks ? tq_exp(sink - mx) : 0.0f;
// weighted sum of the partial outputs: PG groups of threads split the partials, then add up
if (summer) {
    float a0 = 0.0f, a1 = 0.0f;
    TQ_UNROLL
    for (int j = 0; j < PR; j += 2) {
        const int i = g + j * PG;
        if (i < np) a0 += pv[j] * wsh[i];
        if (i + PG < np) a1 += pv[j + 1] * wsh[i + PG];
    }
    for (int i = g + PR * PG; i < np; i += PG) a0 += po[(base + i) * TQA_DV + dcol] * wsh[i];
    red[tid] = a0 + a1;
}
tq_barrier();
if ((int)tid < TQA_DV) {
    float a = 0.0f;
    for (int gg = 0; gg < PG; ++gg) a += red[gg * TQA_DV + (int)tid];
    osh[tid] = den > 0.0f ? a / den : 0.0f;
}
tq_barrier();
// the rotation back: by SIMD group 0 in registers where the row is 32 x a power of 2 up to 8 values
// (bit-identical to tqa_rotate, without its barrier per stage), else by the threadgroup
constexpr int RVPL = TQA_DV / 32;
constexpr bool SIMD_ROT = TQA_DV % 32 == 0 && RVPL >= 1 && RVPL <= 8 && (RVPL & (RVPL - 1)) == 0;
if (vrot && SIMD_ROT) {
    if (sg == 0u) tqa_rotate_simd<SIMD_ROT ? RVPL : 1>(osh, vrot, tabs + TQA_TAB_VS2, tabs + TQA_TAB_VS1, tabs[TQA_TAB_VSCALE], lane);
    tq_barrier();
} else if (vrot) {
    tqa_rotate(osh, TQA_DV, vrot, tabs + TQA_TAB_VS2, tabs + TQA_TAB_VS1, tabs[TQA_TAB_VSCALE], tid, (uint)TQA_NT);
}
for (int d = (int)tid; d < TQA_D; d += TQA_NT) TQA_OUT(out)[(size_t)row * TQA_D + d] = TQA_QSTORE(osh[d]);
