// Fused decode attention, pass 1 of 2, kernel lanes (tqbridge kernel dialect): one threadgroup per
// (batch row, KV head, split of the context). All G*T query rows of the GQA group are scored from
// ONE read of each K/V row. Inside a SIMD group, LPK lanes share a key (each owns DK/LPK values of
// K and DV/LPK of V), so 32/LPK keys are in flight per SIMD group; each lane slot keeps its own
// online-softmax state, merged across slots by shuffles at the end. Each SIMD group writes one
// partial (running max m, sum l, unnormalised output o in the rotated basis for turbo V) that the
// combine pass merges.
//
// Compile-time (each name prefixed TQA_): KF VF (format ids), KBB VBB (bytes per block), KGRP VGRP (values per block),
// KQS VQS KSG VSG (turbo field offsets), DK DV (values per cache row), D (head dim), G (query heads
// per KV head), T (query rows), LPK (lanes per key), NW (SIMD groups), TILE (keys per staged tile),
// KTB VTB (tile bytes: at least TILE rows, a multiple of 4), KROT VROT (rotation groups of q and of the output: turbo's group, llama.cpp's Hadamard group, 0: none),
// QTYPE (q's element type), QSC (1: q times the keys' channel scales, input qsc; absent: no qsc).
// Buffers: q (B, Hq, T, D); kb, vb (B, Hkv, L_max, row bytes); with QSC, qsc (Hq, D) last (TQA_QIN);
// ip = {L_max, split_len, n_splits, window, Hkv, 14 format ints (see TQA_DYN), lengths (B), starts (B)}; fp = {scale, softcap}; tabs: K table [0, 16),
// V table [16, 32), K s1/s2 at 32/160, V s1/s2 at 288/416, K/V rotation scales at 544/545. Out: po (rows, NP, DV), pml (rows, NP, 2)
// with rows = B*Hq*T and NP = n_splits * NW. With TQA_DYN = 1 the format constants, G and T come from
// ip[5..18] instead (the emulator builds once for every format pair).
#if TQA_DYN  // format, G and T from ip[5..19] (one build serves every format pair; used by the emulator)
const int kf = ip[5], vf = ip[6], kbb = ip[7], vbb = ip[8], kgrp = ip[9], vgrp = ip[10], kqs = ip[11];
const int vqs = ip[12], ksg = ip[13], vsg = ip[14], krot = ip[15], vrot = ip[16], G = ip[17], T = ip[18];
#define TQA_QA 32
#else
const int kf = TQA_KF, vf = TQA_VF, kbb = TQA_KBB, vbb = TQA_VBB, kgrp = TQA_KGRP, vgrp = TQA_VGRP;
const int kqs = TQA_KQS, vqs = TQA_VQS, ksg = TQA_KSG, vsg = TQA_VSG, krot = TQA_KROT, vrot = TQA_VROT;
const int G = TQA_G, T = TQA_T;
#define TQA_QA (TQA_G * TQA_T)
#endif
(void)vrot;
const int Q = G * T;
constexpr int KPW = 32 / TQA_LPK;
constexpr int CK = TQA_DK / TQA_LPK;
constexpr int CV = TQA_DV / TQA_LPK;
const int KRB = TQA_DK / kgrp * kbb;
const int VRB = TQA_DV / vgrp * vbb;
const uint tid = tq_tid;
const uint lane = tid & 31u;
const uint warp = tid >> 5;
const int sub = (int)(lane / (uint)TQA_LPK);
const int c = (int)(lane % (uint)TQA_LPK);
TQA_SPLIT_PARAMS

TQ_SHARED_ARRAY(float, ktab, 16);
TQ_SHARED_ARRAY(float, vtab, 16);
TQ_SHARED_ARRAY(float, qsh, TQA_DK);
if (tid < 16u) { ktab[tid] = tabs[tid]; vtab[tid] = tabs[16u + tid]; }

// q rows of this group, zero-padded to TQA_DK, rotated once when K is turbo, scale folded in
float qr[TQA_QA][CK];
for (int r = 0; r < Q; ++r) {
    const int hq = h * G + r / T, t = r % T;
    for (uint i = tid; i < (uint)TQA_DK; i += (uint)(TQA_NW * 32))
        qsh[i] = (int)i < TQA_D ? TQA_QIN(TQA_Q(q)[((b * hq_all + hq) * T + t) * TQA_D + (int)i], hq, (int)i) : 0.0f;
    tq_barrier();
    if (krot) tqa_rotate(qsh, TQA_DK, krot, tabs + TQA_TAB_KS1, tabs + TQA_TAB_KS2, tabs[TQA_TAB_KSCALE], tid, (uint)(TQA_NW * 32));
    for (int j = 0; j < CK; ++j) qr[r][j] = qsh[c * CK + j] * scale;
    tq_barrier();
}

// keys this split may need: the union of the query rows' visible ranges
const int hi_all = len;                                   // last row sees up to len - 1
const int lo_all = window > 0 ? (len - T + 1 - window > 0 ? len - T + 1 - window : 0) : 0;
int start = split * split_len;
int end = start + split_len;
if (start < lo_all) start = lo_all;
if (start < row_lo) start = row_lo;   // the batch row's left padding is invisible
if (end > hi_all) end = hi_all;

float m[TQA_QA], l[TQA_QA], o[TQA_QA][CV];
for (int r = 0; r < Q; ++r) {
    m[r] = TQA_NEG_BIG; l[r] = 0.0f;
    for (int j = 0; j < CV; ++j) o[r][j] = 0.0f;
}
const size_t koff = (size_t)(b * hkv + h) * (size_t)l_max * (size_t)KRB;   // this head's first row
const size_t voff = (size_t)(b * hkv + h) * (size_t)l_max * (size_t)VRB;
TQ_SHARED_ARRAY(uint, ktile, TQA_KTB / 4);
TQ_SHARED_ARRAY(uint, vtile, TQA_VTB / 4);
TQ_SHARED const uchar* kts = (TQ_SHARED const uchar*)ktile;
TQ_SHARED const uchar* vts = (TQ_SHARED const uchar*)vtile;

// Tiles of TQA_TILE keys (starting at an even position, so every row starts at an even byte) are
// staged into threadgroup memory with wide coalesced loads by all threads, then decoded from there.
for (int t0 = start - (start & 1); t0 < end; t0 += TQA_TILE) {   // uniform across the threadgroup
    const int n = end - t0 < TQA_TILE ? end - t0 : TQA_TILE;
    tqa_stage(ktile, kb, koff + (size_t)t0 * (size_t)KRB, n * KRB, tid, (uint)(TQA_NW * 32));
    tqa_stage(vtile, vb, voff + (size_t)t0 * (size_t)VRB, n * VRB, tid, (uint)(TQA_NW * 32));
    tq_barrier();
    for (int i0 = (int)warp * KPW; i0 < n; i0 += TQA_NW * KPW) {   // uniform per SIMD group
        const int i = i0 + sub;
        const int p = t0 + i;
        const bool valid = i < n && p >= start;
        float kv[CK], vv[CV];
        if (valid) {
            TQ_SHARED const uchar* krow = kts + i * KRB;
            TQ_SHARED const uchar* vrow = vts + i * VRB;
            for (int j = 0; j < CK; j += 4) {
                const tqa_f4 f = tqa_dq4(kf, kbb, kgrp, kqs, ksg, krow, c * CK + j, ktab);
                kv[j] = f.v[0]; kv[j + 1] = f.v[1]; kv[j + 2] = f.v[2]; kv[j + 3] = f.v[3];
            }
            for (int j = 0; j < CV; j += 4) {
                const tqa_f4 f = tqa_dq4(vf, vbb, vgrp, vqs, vsg, vrow, c * CV + j, vtab);
                vv[j] = f.v[0]; vv[j + 1] = f.v[1]; vv[j + 2] = f.v[2]; vv[j + 3] = f.v[3];
            }
        } else {
            for (int j = 0; j < CK; ++j) kv[j] = 0.0f;
            for (int j = 0; j < CV; ++j) vv[j] = 0.0f;
        }
        float s[TQA_QA];
        for (int r = 0; r < Q; ++r) {
            float a = 0.0f;
            for (int j = 0; j < CK; ++j) a += qr[r][j] * kv[j];
            for (int off = TQA_LPK / 2; off > 0; off >>= 1) a += tq_simd_shuffle_xor(a, off);
            s[r] = softcap > 0.0f ? softcap * tqa_tanh(a / softcap) : a;
        }
        if (valid) {
            for (int r = 0; r < Q; ++r) {
                const int t = r % T;
                const int hi_t = len - T + t + 1;
                const int lo_t = window > 0 ? hi_t - window : 0;
                if (p >= hi_t || p < lo_t) continue;
                const float sc = s[r];
                if (sc > m[r]) {         // new running max: rescale what we have (one exp)
                    const float alpha = tq_exp(m[r] - sc);
                    l[r] = l[r] * alpha + 1.0f;
                    for (int j = 0; j < CV; ++j) o[r][j] = o[r][j] * alpha + vv[j];
                    m[r] = sc;
                } else {                 // the common case: one exp, no rescale
                    const float e = tq_exp(sc - m[r]);
                    l[r] = l[r] + e;
                    for (int j = 0; j < CV; ++j) o[r][j] = o[r][j] + e * vv[j];
                }
            }
        }
    }
    tq_barrier();
}

// merge the 32/TQA_LPK key slots of this SIMD group (lanes with the same c)
for (int off = TQA_LPK; off < 32; off <<= 1) {
    for (int r = 0; r < Q; ++r) {
        const float mo = tq_simd_shuffle_xor(m[r], off);
        const float lo = tq_simd_shuffle_xor(l[r], off);
        const float mn = mo > m[r] ? mo : m[r];
        const float a = tq_exp(m[r] - mn), bw = tq_exp(mo - mn);
        l[r] = l[r] * a + lo * bw;
        for (int j = 0; j < CV; ++j) {
            const float oo = tq_simd_shuffle_xor(o[r][j], off);
            o[r][j] = o[r][j] * a + oo * bw;
        }
        m[r] = mn;
    }
}
if (sub == 0) {
    const int np = n_splits * TQA_NW;
    const int pi = split * TQA_NW + (int)warp;
    for (int r = 0; r < Q; ++r) {
        const int hq = h * G + r / T, t = r % T;
        const size_t row = (size_t)((b * hq_all + hq) * T + t);
        for (int j = 0; j < CV; ++j) po[(row * np + pi) * TQA_DV + c * CV + j] = o[r][j];
        if (c == 0) { pml[(row * np + pi) * 2] = m[r]; pml[(row * np + pi) * 2 + 1] = l[r]; }
    }
}
