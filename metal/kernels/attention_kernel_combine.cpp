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
const size_t base = (size_t)row * (size_t)np;
// the largest of the partial maxima and the sink (tree over the threads)
float mx = TQA_NEG_BIG;
for (int i = (int)tid; i < np; i += TQA_NT) { const float mi = pml[(base + i) * 2]; mx = mi > mx ? mi : mx; }
red[tid] = mx;
tq_barrier();
for (int w = TQA_NT / 2; w > 0; w >>= 1) {
    if ((int)tid < w) red[tid] = red[tid + w] > red[tid] ? red[tid + w] : red[tid];
    tq_barrier();
}
mx = red[0];
const float sink = has_sinks ? sinks[hq] : TQA_NEG_BIG;
if (has_sinks && sink > mx) mx = sink;
tq_barrier();
// weights of the partials and the softmax denominator
float dp = 0.0f;
for (int i = (int)tid; i < np; i += TQA_NT) {
    const float w = tq_exp(pml[(base + i) * 2] - mx);
    wsh[i] = w;
    dp += pml[(base + i) * 2 + 1] * w;
}
red[tid] = dp;
tq_barrier();
for (int w = TQA_NT / 2; w > 0; w >>= 1) {
    if ((int)tid < w) red[tid] = red[tid] + red[tid + w];
    tq_barrier();
}
const float den = red[0] + (has_sinks ? tq_exp(sink - mx) : 0.0f);
tq_barrier();
// weighted sum of the partial outputs: PG groups of threads split the partials, then add up
constexpr int PG = TQA_NT / TQA_DV;
if ((int)tid < PG * TQA_DV) {
    const int d = (int)tid % TQA_DV, g = (int)tid / TQA_DV;
    float a = 0.0f;
    for (int i = g; i < np; i += PG) a += po[(base + i) * TQA_DV + d] * wsh[i];
    red[tid] = a;
}
tq_barrier();
if ((int)tid < TQA_DV) {
    float a = 0.0f;
    for (int g = 0; g < PG; ++g) a += red[g * TQA_DV + (int)tid];
    osh[tid] = den > 0.0f ? a / den : 0.0f;
}
tq_barrier();
if (vrot) tqa_rotate(osh, TQA_DV, vrot, tabs + TQA_TAB_VS2, tabs + TQA_TAB_VS1, tabs[TQA_TAB_VSCALE], tid, (uint)TQA_NT);
for (int d = (int)tid; d < TQA_D; d += TQA_NT) TQA_OUT(out)[(size_t)row * TQA_D + d] = TQA_QSTORE(osh[d]);
