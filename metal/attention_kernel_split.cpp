// Fused decode attention, pass 1 of 2 (tqbridge kernel dialect): one threadgroup per
// (batch row, KV head, split of the context). All G*T query rows of the GQA group are scored from
// ONE read of each K/V row. Inside a SIMD group, LPK lanes share a key (each owns DK/LPK values of
// K and DV/LPK of V), so 32/LPK keys are in flight per SIMD group; each lane slot keeps its own
// online-softmax state, merged across slots by shuffles at the end. Each SIMD group writes one
// partial (running max m, sum l, unnormalised output o in the rotated basis for turbo V) that the
// combine pass merges.
//
// Compile-time (each name prefixed TQA_): KF VF (format ids), KBB VBB (bytes per block), KGRP VGRP (values per block),
// KQS VQS KSG VSG (turbo field offsets), DK DV (values per cache row), D (head dim), G (query heads
// per KV head), T (query rows), LPK (lanes per key), NW (SIMD groups), KROT VROT (turbo: 1),
// QTYPE (q's element type). Buffers: q (B, Hq, T, D); kb, vb (B, Hkv, L_max, row bytes); lens (B);
// ip = {L_max, split_len, n_splits, window, Hkv}; fp = {scale, softcap}; tabs: K table [0, 16),
// V table [16, 32), K s1/s2 at 32/160, V s1/s2 at 288/416, K/V rotation scales at 544/545. Out: po (rows, NP, DV), pml (rows, NP, 2)
// with rows = B*Hq*T and NP = n_splits * NW.
constexpr int Q = TQA_G * TQA_T;
constexpr int KPW = 32 / TQA_LPK;
constexpr int CK = TQA_DK / TQA_LPK;
constexpr int CV = TQA_DV / TQA_LPK;
constexpr int KRB = TQA_DK / TQA_KGRP * TQA_KBB;
constexpr int VRB = TQA_DV / TQA_VGRP * TQA_VBB;
const uint tid = tq_tid;
const uint tgid = tq_gx;
const uint lane = tid & 31u;
const uint warp = tid >> 5;
const int sub = (int)(lane / (uint)TQA_LPK);
const int c = (int)(lane % (uint)TQA_LPK);
const int l_max = ip[0], split_len = ip[1], n_splits = ip[2], window = ip[3], hkv = ip[4];
const float scale = fp[0], softcap = fp[1];
const int split = (int)(tgid % (uint)n_splits);
const int bh = (int)(tgid / (uint)n_splits);
const int h = bh % hkv;
const int b = bh / hkv;
const int hq_all = hkv * TQA_G;
const int len = lens[b];

TQ_SHARED_ARRAY(float, ktab, 16);
TQ_SHARED_ARRAY(float, vtab, 16);
TQ_SHARED_ARRAY(float, qsh, TQA_DK);
if (tid < 16u) { ktab[tid] = tabs[tid]; vtab[tid] = tabs[16u + tid]; }

// q rows of this group, zero-padded to TQA_DK, rotated once when K is turbo, scale folded in
float qr[Q][CK];
for (int r = 0; r < Q; ++r) {
    const int hq = h * TQA_G + r / TQA_T, t = r % TQA_T;
    for (uint i = tid; i < (uint)TQA_DK; i += (uint)(TQA_NW * 32))
        qsh[i] = (int)i < TQA_D ? TQA_QLOAD(q[((b * hq_all + hq) * TQA_T + t) * TQA_D + (int)i]) : 0.0f;
    tq_barrier();
    if (TQA_KROT) tqa_rotate(qsh, TQA_DK, TQA_KGRP, tabs + 32, tabs + 160, tabs[544], tid, (uint)(TQA_NW * 32));
    for (int j = 0; j < CK; ++j) qr[r][j] = qsh[c * CK + j] * scale;
    tq_barrier();
}

// keys this split may need: the union of the query rows' visible ranges
const int hi_all = len;                                   // last row sees up to len - 1
const int lo_all = window > 0 ? (len - TQA_T + 1 - window > 0 ? len - TQA_T + 1 - window : 0) : 0;
int start = split * split_len;
int end = start + split_len;
if (start < lo_all) start = lo_all;
if (end > hi_all) end = hi_all;

float m[Q], l[Q], o[Q][CV];
for (int r = 0; r < Q; ++r) {
    m[r] = TQA_NEG_BIG; l[r] = 0.0f;
    for (int j = 0; j < CV; ++j) o[r][j] = 0.0f;
}
TQ_CONST_DEVICE uchar* kbase = kb + (size_t)(b * hkv + h) * (size_t)l_max * KRB;
TQ_CONST_DEVICE uchar* vbase = vb + (size_t)(b * hkv + h) * (size_t)l_max * VRB;

for (int p0 = start + (int)warp * KPW; p0 < end; p0 += TQA_NW * KPW) {   // uniform per SIMD group
    const int p = p0 + sub;
    const bool valid = p < end;
    float kv[CK];
    if (valid) {
        TQ_CONST_DEVICE uchar* krow = kbase + (size_t)p * KRB;
        for (int j = 0; j < CK; j += 4) {
            const tqa_f4 f = tqa_dq4(TQA_KF, TQA_KBB, TQA_KGRP, TQA_KQS, TQA_KSG, krow, c * CK + j, ktab);
            kv[j] = f.v[0]; kv[j + 1] = f.v[1]; kv[j + 2] = f.v[2]; kv[j + 3] = f.v[3];
        }
    } else {
        for (int j = 0; j < CK; ++j) kv[j] = 0.0f;
    }
    float s[Q];
    for (int r = 0; r < Q; ++r) {
        float a = 0.0f;
        for (int j = 0; j < CK; ++j) a += qr[r][j] * kv[j];
        for (int off = TQA_LPK / 2; off > 0; off >>= 1) a += tq_simd_shuffle_xor(a, off);
        s[r] = softcap > 0.0f ? softcap * tqa_tanh(a / softcap) : a;
    }
    if (valid) {
        float vv[CV];
        TQ_CONST_DEVICE uchar* vrow = vbase + (size_t)p * VRB;
        for (int j = 0; j < CV; j += 4) {
            const tqa_f4 f = tqa_dq4(TQA_VF, TQA_VBB, TQA_VGRP, TQA_VQS, TQA_VSG, vrow, c * CV + j, vtab);
            vv[j] = f.v[0]; vv[j + 1] = f.v[1]; vv[j + 2] = f.v[2]; vv[j + 3] = f.v[3];
        }
        for (int r = 0; r < Q; ++r) {
            const int t = r % TQA_T;
            const int hi_t = len - TQA_T + t + 1;
            const int lo_t = window > 0 ? hi_t - window : 0;
            if (p >= hi_t || p < lo_t) continue;
            const float mn = s[r] > m[r] ? s[r] : m[r];
            const float alpha = tq_exp(m[r] - mn);
            const float e = tq_exp(s[r] - mn);
            l[r] = l[r] * alpha + e;
            for (int j = 0; j < CV; ++j) o[r][j] = o[r][j] * alpha + e * vv[j];
            m[r] = mn;
        }
    }
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
        const int hq = h * TQA_G + r / TQA_T, t = r % TQA_T;
        const size_t row = (size_t)((b * hq_all + hq) * TQA_T + t);
        for (int j = 0; j < CV; ++j) po[(row * np + pi) * TQA_DV + c * CV + j] = o[r][j];
        if (c == 0) { pml[(row * np + pi) * 2] = m[r]; pml[(row * np + pi) * 2 + 1] = l[r]; }
    }
}
