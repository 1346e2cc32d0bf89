// Fused decode attention, pass 1 of 2, kernel tiles: a key-per-lane layout (tqbridge kernel dialect): one
// threadgroup per (batch row, KV head, split of the context). All Q = G*T query rows of the GQA
// group are scored from ONE read of each K/V row. Per tile of TQA_TILE keys staged in threadgroup
// memory:
//   A. scores: each thread owns one key (two when the tile holds two per thread: each q load then
//      serves both), decodes its whole K row once and computes the Q dot
//      products in registers against q rows read from threadgroup memory (the same address in every
//      lane: broadcasts); scores (softcap, masks applied) go to s[row][key];
//   B. per query row, one SIMD group: tile max, new running max, p = exp(s - m) in place, the
//      tile's sum and the rescale factor of the accumulators, computed once per row and tile;
//   C. V: each SIMD group takes TQA_KS keys at a time (32 / KS lanes per key); each lane owns
//      4-value column chunks of the output (chunk c, c + 32 / KS, ...) for all Q rows and
//      accumulates p[row][key] * v; the KS key slots are added by shuffles at the end.
// All SIMD groups share one running max and sum per row, so their accumulators add up at the end;
// each threadgroup writes ONE partial (max m, sum l, unnormalised output in the rotated basis for
// turbo V) that the combine pass merges.
//
// Compile-time (each name prefixed TQA_): KF VF (format ids), KBB VBB (bytes per block), KGRP VGRP
// (values per block), KQS VQS KSG VSG (turbo field offsets), DK DV (values per cache row), D (head
// dim), G T (query heads per KV head, query rows), QA (room for query rows, >= G*T), NW (SIMD
// groups), KS (keys per SIMD group in phase C: 1, 2 or 4), TILE (keys per staged tile), KTB VTB
// (tile bytes, multiples of 4), KROT VROT (rotation groups of q and of the output: turbo's group, llama.cpp's Hadamard group, 0: none), QTYPE (q's element type), QSC. Buffers as in pass 1 of attention_kernel_split_lanes.cpp; out: po (rows,
// n_splits, DV), pml (rows, n_splits, 2). With TQA_DYN = 1 the format constants, G and T come from
// ip[5..18] (one build serves every format pair; used by the emulator).
#if TQA_DYN
const int kf = ip[5], vf = ip[6], kbb = ip[7], vbb = ip[8], kgrp = ip[9], vgrp = ip[10], kqs = ip[11];
const int vqs = ip[12], ksg = ip[13], vsg = ip[14], krot = ip[15], vrot = ip[16], G = ip[17], T = ip[18];
#else
const int kf = TQA_KF, vf = TQA_VF, kbb = TQA_KBB, vbb = TQA_VBB, kgrp = TQA_KGRP, vgrp = TQA_VGRP;
const int kqs = TQA_KQS, vqs = TQA_VQS, ksg = TQA_KSG, vsg = TQA_VSG, krot = TQA_KROT, vrot = TQA_VROT;
const int G = TQA_G, T = TQA_T;
#endif
(void)vrot;
const int Q = G * T;
constexpr int NT = TQA_NW * 32;
constexpr int KPT = TQA_TILE % (2 * NT) == 0 ? 2 : 1;   // keys per thread in phase A
constexpr int LK = 32 / TQA_KS;                  // lanes per key in phase C
constexpr int NCH = (TQA_DV / 4 + LK - 1) / LK;   // 4-value column chunks per lane in phase C
const int KRB = TQA_DK / kgrp * kbb;
const int VRB = TQA_DV / vgrp * vbb;
const uint tid = tq_tid;
const uint lane = tid & 31u;
const uint warp = tid >> 5;
const int slot = (int)lane / LK, cl = (int)lane % LK;
TQA_SPLIT_PARAMS

TQ_SHARED_ARRAY(float, ktab, 16);
TQ_SHARED_ARRAY(float, vtab, 16);
TQ_SHARED_ARRAY(tqa_f4a, qsh4, TQA_QA * TQA_DK / 4);   // q rows: rotated for turbo K, scale folded in
TQ_SHARED_ARRAY(float, ssh, TQA_QA * TQA_TILE);   // scores, then p, of the current tile
TQ_SHARED_ARRAY(float, msh, TQA_QA);              // running max per query row
TQ_SHARED_ARRAY(float, lsh, TQA_QA);              // running sum per query row
TQ_SHARED_ARRAY(float, ash, TQA_QA);              // this tile's rescale factor per query row
TQ_SHARED_ARRAY(float, red, TQA_NW * TQA_DV);     // the SIMD groups' outputs, summed at the end
TQ_SHARED_ARRAY(uint, ktile, TQA_KTB / 4);
TQ_SHARED_ARRAY(uint, vtile, TQA_VTB / 4);
TQ_SHARED const uchar* kts = (TQ_SHARED const uchar*)ktile;
TQ_SHARED const uchar* vts = (TQ_SHARED const uchar*)vtile;

TQ_SHARED float* qsh = (TQ_SHARED float*)qsh4;
if (tid < 16u) { ktab[tid] = tabs[tid]; vtab[tid] = tabs[16u + tid]; }
if ((int)tid < Q) { msh[tid] = TQA_NEG_BIG; lsh[tid] = 0.0f; ash[tid] = 1.0f; }
for (int x = (int)tid; x < Q * TQA_DK; x += NT) {
    const int r = x / TQA_DK, i = x % TQA_DK;
    const int hq = h * G + r / T, t = r % T;
    qsh[x] = i < TQA_D ? TQA_QIN(TQA_Q(q)[((b * hq_all + hq) * T + t) * TQA_D + i], hq, i) : 0.0f;
}
tq_barrier();
if (krot) tqa_rotate(qsh, Q * TQA_DK, krot, tabs + TQA_TAB_KS1, tabs + TQA_TAB_KS2, tabs[TQA_TAB_KSCALE], tid, (uint)NT);
for (int x = (int)tid; x < Q * TQA_DK; x += NT) qsh[x] = qsh[x] * scale;
tq_barrier();

// keys this split may need: the union of the query rows' visible ranges
const int lo_all = window > 0 ? (len - T + 1 - window > 0 ? len - T + 1 - window : 0) : 0;
int start = split * split_len;
int end = start + split_len;
if (start < lo_all) start = lo_all;
if (start < row_lo) start = row_lo;   // the batch row's left padding is invisible
if (end > len) end = len;

float o[TQA_QA][NCH * 4];
for (int r = 0; r < Q; ++r)
    for (int c = 0; c < NCH * 4; ++c) o[r][c] = 0.0f;
const size_t koff = (size_t)(b * hkv + h) * (size_t)l_max * (size_t)KRB;   // this head's first row
const size_t voff = (size_t)(b * hkv + h) * (size_t)l_max * (size_t)VRB;

// tiles start at an even position, so every staged row starts at an even byte
for (int t0 = start - (start & 1); t0 < end; t0 += TQA_TILE) {   // uniform across the threadgroup
    const int n = end - t0 < TQA_TILE ? end - t0 : TQA_TILE;
    tqa_stage(ktile, kb, koff + (size_t)t0 * (size_t)KRB, n * KRB, tid, (uint)NT);
    tqa_stage(vtile, vb, voff + (size_t)t0 * (size_t)VRB, n * VRB, tid, (uint)NT);
    tq_barrier();

    // A. one key per thread (KPT keys when the tile holds KPT per thread, sharing each q load):
    // Q scores from one decode of the K row
    for (int i0 = (int)tid; i0 < TQA_TILE; i0 += KPT * NT) {
        bool ok[KPT];
        bool any = false;
        TQ_SHARED const uchar* krow[KPT];
        float acc[KPT][TQA_QA];
        for (int x = 0; x < KPT; ++x) {
            const int i = i0 + x * NT;
            ok[x] = i < n && t0 + i >= start;
            any = any || ok[x];
            krow[x] = kts + i * KRB;
            for (int r = 0; r < Q; ++r) acc[x][r] = 0.0f;
        }
        if (any) {
            if (kf <= TQA_BF16) {
                for (int e = 0; e < TQA_DK; e += 4) {
                    tqa_f4 f[KPT];
                    for (int x = 0; x < KPT; ++x) f[x] = tqa_dq4(kf, kbb, kgrp, kqs, ksg, krow[x], e, ktab);
                    for (int r = 0; r < Q; ++r) {
                        TQ_SHARED const tqa_f4a* qq = qsh4 + (r * TQA_DK + e) / 4;
                        for (int x = 0; x < KPT; ++x)
                            for (int u = 0; u < 4; ++u) acc[x][r] += qq->v[u] * f[x].v[u];
                    }
                }
            } else {
                // every block format but q4_1 / q5_1 is d times a raw value: the block's dot
                // product is taken on the raw values and multiplied by d once
                const bool fold = !tqa_has_m(kf);
                for (int blk = 0; blk < TQA_DK / kgrp; ++blk) {
                    float d[KPT], mm[KPT], pa[KPT][TQA_QA];
                    for (int x = 0; x < KPT; ++x) {
                        d[x] = tqa_half(krow[x] + blk * kbb, 0);
                        mm[x] = fold ? 0.0f : tqa_half(krow[x] + blk * kbb, 2);
                        for (int r = 0; r < Q; ++r) pa[x][r] = 0.0f;
                    }
                    for (int j = 0; j < kgrp; j += 4) {
                        tqa_f4 f[KPT];
                        for (int x = 0; x < KPT; ++x)
                            f[x] = tqa_dq4_blk(kf, kqs, ksg, krow[x] + blk * kbb, j, fold ? 1.0f : d[x], mm[x], ktab);
                        for (int r = 0; r < Q; ++r) {
                            TQ_SHARED const tqa_f4a* qq = qsh4 + (r * TQA_DK + blk * kgrp + j) / 4;
                            for (int x = 0; x < KPT; ++x)
                                for (int u = 0; u < 4; ++u) pa[x][r] += qq->v[u] * f[x].v[u];
                        }
                    }
                    for (int x = 0; x < KPT; ++x)
                        for (int r = 0; r < Q; ++r) acc[x][r] += fold ? d[x] * pa[x][r] : pa[x][r];
                }
            }
        }
        for (int x = 0; x < KPT; ++x) {
            const int i = i0 + x * NT;
            const int p = t0 + i;
            for (int r = 0; r < Q; ++r) {
                const int hi_t = len - T + r % T + 1;
                const int lo_t = window > 0 ? hi_t - window : 0;
                const float a = softcap > 0.0f ? softcap * tqa_tanh(acc[x][r] / softcap) : acc[x][r];
                ssh[r * TQA_TILE + i] = (!ok[x] || p >= hi_t || p < lo_t) ? TQA_NEG_BIG : a;
            }
        }
    }
    tq_barrier();

    // B. per query row, one SIMD group: running max, p = exp(s - m), sum, rescale factor
    for (int r = (int)warp; r < Q; r += TQA_NW) {   // uniform per SIMD group
        TQ_SHARED float* sr = ssh + r * TQA_TILE;
        float mt = TQA_NEG_BIG;
        for (int i = (int)lane; i < TQA_TILE; i += 32) mt = sr[i] > mt ? sr[i] : mt;
        mt = tq_simd_max(mt);
        const float mo = msh[r];
        const float mn = mt > mo ? mt : mo;
        float ps = 0.0f;
        for (int i = (int)lane; i < TQA_TILE; i += 32) {
            const float e = sr[i] > TQA_NEG_BIG ? tq_exp(sr[i] - mn) : 0.0f;
            sr[i] = e;
            ps += e;
        }
        ps = tq_simd_sum(ps);
        if (lane == 0u) {
            const float alpha = tq_exp(mo - mn);
            ash[r] = alpha;
            lsh[r] = lsh[r] * alpha + ps;
            msh[r] = mn;
        }
    }
    tq_barrier();

    // C. V: SIMD groups take turns over the keys; each lane owns column chunks for all rows
    for (int r = 0; r < Q; ++r) {
        const float alpha = ash[r];
        for (int c = 0; c < NCH * 4; ++c) o[r][c] = o[r][c] * alpha;
    }
    for (int i = (int)warp * TQA_KS + slot; i < n; i += TQA_NW * TQA_KS) {
        if (t0 + i < start) continue;
        TQ_SHARED const uchar* vrow = vts + i * VRB;
        // a row of one block (turbo): its fp16 fields are decoded once per key, not per chunk, and
        // a scale without an offset is folded into the Q weights (Q products per key, not DV)
        const bool one_blk = vf > TQA_BF16 && vgrp >= TQA_DV;
        const bool fold = one_blk && !tqa_has_m(vf);
        const float vd = one_blk ? tqa_half(vrow, 0) : 0.0f;
        const float vm = one_blk && tqa_has_m(vf) ? tqa_half(vrow, 2) : 0.0f;
        float pw[TQA_QA];
        for (int r = 0; r < Q; ++r) pw[r] = fold ? ssh[r * TQA_TILE + i] * vd : ssh[r * TQA_TILE + i];
        for (int k = 0; k < NCH; ++k) {
            const int e = (cl + LK * k) * 4;
            if (e < TQA_DV) {
                const tqa_f4 f = one_blk ? tqa_dq4_blk(vf, vqs, vsg, vrow, e, fold ? 1.0f : vd, vm, vtab)
                                         : tqa_dq4(vf, vbb, vgrp, vqs, vsg, vrow, e, vtab);
                for (int r = 0; r < Q; ++r)
                    for (int u = 0; u < 4; ++u) o[r][4 * k + u] += pw[r] * f.v[u];
            }
        }
    }
    tq_barrier();
}

// every key slot and SIMD group shares the running max and sum: add up their accumulators
for (int off = LK; off < 32; off <<= 1)
    for (int r = 0; r < Q; ++r)
        for (int c = 0; c < NCH * 4; ++c) o[r][c] += tq_simd_shuffle_xor(o[r][c], (uint)off);
const size_t row0 = (size_t)((b * hq_all + h * G) * T);   // first output row of this group
for (int r = 0; r < Q; ++r) {
    for (int k = 0; k < NCH; ++k) {
        const int e = (cl + LK * k) * 4;
        if (slot == 0 && e < TQA_DV)
            for (int u = 0; u < 4; ++u) red[(int)warp * TQA_DV + e + u] = o[r][4 * k + u];
    }
    tq_barrier();
    const size_t pi = (row0 + (size_t)r) * (size_t)n_splits + (size_t)split;
    for (int e = (int)tid; e < TQA_DV; e += NT) {
        float a = red[e];
        for (int w = 1; w < TQA_NW; ++w) a += red[w * TQA_DV + e];
        po[pi * TQA_DV + e] = a;
    }
    if (tid == 0u) { pml[pi * 2] = msh[r]; pml[pi * 2 + 1] = lsh[r]; }
    tq_barrier();
}
