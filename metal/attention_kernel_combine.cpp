// Fused decode attention, pass 2 of 2 (tqbridge kernel dialect): one threadgroup per output row
// (batch row, query head, query row). Merges the NP partials of pass 1 (and the head's sink
// logit), divides by the softmax sum, rotates the row back once when V is turbo, and writes the
// first D values in q's element type. A row that sees no key (and no sink mass) is zero.
//
// Compile-time (each name prefixed TQA_): DV, D, T, VGRP, VROT, NT (threads), QTYPE. Buffers: po (rows, NP, DV), pml (rows,
// NP, 2), ip = {NP, Hq, has_sinks, [T, VGRP, VROT with TQA_DYN]}, sinks (Hq), tabs (as in pass 1). Out: out (rows, D).
const uint tid = tq_tid;
const uint row = tq_gx;
const int np = ip[0], hq_all = ip[1], has_sinks = ip[2];
#if TQA_DYN  // T, VGRP, VROT from ip[3..5]
const int T = ip[3], vgrp = ip[4], vrot = ip[5];
#else
const int T = TQA_T, vgrp = TQA_VGRP, vrot = TQA_VROT;
#endif
const int hq = (int)(row / (uint)T) % hq_all;
TQ_SHARED_ARRAY(float, osh, TQA_DV);
TQ_SHARED_ARRAY(float, wsh, 1024);
float mx = TQA_NEG_BIG;
for (int i = 0; i < np; ++i) { const float mi = pml[((size_t)row * np + i) * 2]; mx = mi > mx ? mi : mx; }
const float sink = has_sinks ? sinks[hq] : TQA_NEG_BIG;
if (has_sinks && sink > mx) mx = sink;
for (int i = (int)tid; i < np; i += TQA_NT) wsh[i] = tq_exp(pml[((size_t)row * np + i) * 2] - mx);
tq_barrier();
float den = has_sinks ? tq_exp(sink - mx) : 0.0f;
for (int i = 0; i < np; ++i) den += pml[((size_t)row * np + i) * 2 + 1] * wsh[i];
for (int d = (int)tid; d < TQA_DV; d += TQA_NT) {
    float a = 0.0f;
    for (int i = 0; i < np; ++i) a += po[((size_t)row * np + i) * TQA_DV + d] * wsh[i];
    osh[d] = den > 0.0f ? a / den : 0.0f;
}
tq_barrier();
if (vrot) tqa_rotate(osh, TQA_DV, vgrp, tabs + 416, tabs + 288, tabs[545], tid, (uint)TQA_NT);
for (int d = (int)tid; d < TQA_D; d += TQA_NT) out[(size_t)row * TQA_D + d] = TQA_QSTORE(osh[d]);
