// Fused decode attention, pass 1 of 2, kernel int8-mma: matrix fragments (tqbridge kernel dialect; the
// primitives are in attention_mma.h). One threadgroup per (batch row, KV head, split), as lanes / tiles, and
// the same partial outputs for the combine pass. The GQA group's query rows (at most 8) are the N
// side of every product, so each K/V byte is read once for all of them:
//   q: rotated (turbo K / llama.cpp's rotation), then quantized to int8 per 32 values exactly as
//      ggml's quantize_row_q8_0_ref (q8_1_ref for K formats with an offset m: q4_1, q5_1), the
//      vec_dot arithmetic llama.cpp uses for these K types;
//   scores: per 16 keys and 32-value K block, one int8 product S^T[16 keys x 8 rows] of the K codes
//      with q's codes (exact int32), then times d_k * d_q (+ m_k * s_q) in float32;
//   softmax: online, per SIMD group, in registers, base 2 (scores times log2 e; row max by 3 shuffles
//      per tile of 16 keys; the outputs rescaled only when a max moved);
//   V: O^T[DV x 8 rows] += V^T[DV x 16 keys] * P^T, binary16 inputs, float32 accumulators: V values
//      decoded (scale applied) and rounded to binary16, P scaled by 2^15 (so that small weights stay
//      normal binary16 numbers) and moved into fragment layout by a transpose (movmatrix).
// Each SIMD group keeps its own max, sum and output; the groups merge once at the end through
// threadgroup memory, and the threadgroup writes one partial per query row.
// Lane mapping of the V product: row r (0..15) of m-tile i holds output column r * (DV / 16) + i,
// so each lane decodes two runs of DV / 16 consecutive values per key (turbo2 / turbo3 with DV 128: the
// run's values in the order tqa_v23_col, see below).
//
// Compile-time (each name prefixed TQA_): as tiles (KF VF KBB VBB KGRP VGRP KQS VQS KSG VSG DK DV D G
// T NW TILE KTB VTB KROT VROT QTYPE QSC; buffers as theirs), KM (K has an offset m: q8_1 q), STB (bytes of the staging /
// merge area), VB (turbo V: bits per index, 2 / 3 / 4; 0: another V format), V23 / VCODE (1: the byte-permute
// decodes of turbo2 / turbo3 and of q4_0 / q5_0 / q8_0 where they apply; attention_kernel.int8_mma_v_decode), NS (tiles in the copy ring), KC (16-key chunks per SIMD-group step). K formats: q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl (32-value blocks); V: any block format
// whose values fit binary16, or f16; G*T <= 8; DK % 32 == 0; DV % 64 == 0. No TQA_DYN build.
const int kf = TQA_KF, vf = TQA_VF, kbb = TQA_KBB, vbb = TQA_VBB, vgrp = TQA_VGRP;
const int vqs = TQA_VQS, vsg = TQA_VSG, krot = TQA_KROT;
const int G = TQA_G, T = TQA_T;
const int Q = G * T;
constexpr int NT = TQA_NW * 32;
constexpr int NB = TQA_DK / 32;             // K blocks per row
constexpr int RV = TQA_DV / 16;             // V values per run (and m-tiles)
constexpr int KRB = TQA_DK / 32 * TQA_KBB;
constexpr int VRB = TQA_DV / TQA_VGRP * TQA_VBB;
// q8_0 K rows of 4-byte aligned length: whole-word code loads, even blocks' slots rotated by 2 (tqa_q8_pair)
constexpr bool Q8W = TQA_KF == TQA_Q8_0 && (KRB & 3) == 0;
const uint tid = tq_tid;
const uint lane = tid & 31u;
const uint warp = tid >> 5;
const uint g = lane >> 2, t4 = lane & 3u;
TQA_SPLIT_PARAMS
// TQA_PHASES (a profiling build, CUDA and the emulator: benchmarks/scripts/pass1_phases.py): thread 0 stamps five
// points of its threadgroup, 0 entry, 1 q rotated and quantized, 2 the first tile landed, 3 the key loop done,
// 4 the partial written, with the global timer (tq_timer, ns) and the SM's cycle counter (tq_cycles), in
// registers; after the last point it writes them into one more output, clk: per threadgroup 20 words, the five
// timer values, then the five cycle counts, each a uint32 pair, low word first (0: a point not reached). The
// stores come after the last stamp, so no phase holds their latency (on CUDA a store to a page the host last
// touched waits for its migration: hundreds of µs). The other outputs are those of the plain build.
#if TQA_PHASES
unsigned long long tqa_st[5] = {0ull, 0ull, 0ull, 0ull, 0ull}, tqa_sc[5] = {0ull, 0ull, 0ull, 0ull, 0ull};
#define TQA_PHASE(i) do { if (tid == 0u) { tqa_st[i] = tq_timer(); tqa_sc[i] = tq_cycles(); } } while (0)
#define TQA_PHASES_WRITE() do { if (tid == 0u) for (int i_ = 0; i_ < 5; ++i_) { \
    const uint at_ = tq_gx * 20u + 2u * (uint)i_; \
    clk[at_] = (uint)tqa_st[i_]; clk[at_ + 1u] = (uint)(tqa_st[i_] >> 32); \
    clk[at_ + 10u] = (uint)tqa_sc[i_]; clk[at_ + 11u] = (uint)(tqa_sc[i_] >> 32); } } while (0)
#else
#define TQA_PHASE(i) do { } while (0)
#define TQA_PHASES_WRITE() do { } while (0)
#endif
TQA_PHASE(0);
const float LOG2E = 1.4426950408889634f;   // the softmax runs in base 2: scores times log2(e), then exp2

TQ_SHARED_ARRAY(float, ktab, 16);
TQ_SHARED_ARRAY(float, vtab, 16);
// q's int8 codes, 8 rows of DK/4 words padded by 4 (the key loop's lanes g read 8 rows at one word
// offset: the pad puts them in 8 different banks)
constexpr int QIS = TQA_DK / 4 + 4;
TQ_SHARED_ARRAY(uint, qi, 8 * QIS);
TQ_SHARED_ARRAY(float, qd, 8 * NB);           // q's block scales (binary16 values)
TQ_SHARED_ARRAY(float, qsm, 8 * NB);          // q8_1's s = d * sum(codes) (binary16 values)
// NS tiles (K rows, V rows) in a ring; first q, last the merge. Dynamic threadgroup memory where the plan
// asks (TQ_DSMEM >= TQA_STB bytes: CUDA, tiles beyond its 48 KB of static shared memory)
#if TQ_DSMEM
TQ_DYN_SHARED_ARRAY(uint, stage);
#else
TQ_SHARED_ARRAY(uint, stage, TQA_STB / 4);
#endif
constexpr int HALF = (TQA_KTB + TQA_VTB) / 4;  // words per staged tile
// The prologue: the tables and q's rows are loaded first, then the first NS - 1 tiles' copies are issued, so
// their latency hides q's rotation and quantization (loads issued behind the copies would wait for them;
// docs/kernel-history.md has the other order's cycles). q's rows live in the ring's last buffer, which the key loop refills only after its first barrier; the staging area
// is sized for that: attention_plan.int8_mma_stage_bytes
static_assert(TQA_NS >= 2 && (TQA_NS - 1) * HALF * 4 + 32 * TQA_DK <= TQA_STB, "q's rows must fit after the ring's head");
// q rows (rows >= Q zero), rotated: only until the key loop's first barrier
TQ_SHARED float* qf = (TQ_SHARED float*)(stage + (TQA_NS - 1) * HALF);
// turbo2 / turbo3 rows whose runs of RV = 8 or 16 values each lie in one block (TQA_V23, unless the
// generic turbo path is forced): the centroids are looked up four at a time by byte permutes of
// registers (tq_byte_perm), the indices of 8 values assembled as 4-bit fields from one 16-bit load of qs
// and, for turbo3, a table keyed by the sign byte. Within each 8 values of a run the m-tiles then hold
// the values in the order 0 2 4 6 1 3 5 7 (tqa_v23_col), which the final write undoes.
constexpr bool V23 = TQA_V23 && (TQA_VB == 2 || TQA_VB == 3) && (RV == 8 || RV == 16) && TQA_VGRP % RV == 0;
// q4_0 / q5_0 / q8_0 V (TQA_VCODE): codes turned into binary16 integers by byte permutes (a run of RV values
// lies in one 32-value block)
constexpr bool VQ = TQA_VCODE && (TQA_VF == TQA_Q4_0 || TQA_VF == TQA_Q5_0 || TQA_VF == TQA_Q8_0) && 32 % RV == 0;
// turbo V: binary16 centroid pairs, entry i0 | i1 << VB = (c[i0], c[i1]) (the A register of two keys);
// for V23 turbo3 instead the sign table: entry s = the sign bits of s at bit 2 of the 4-bit fields
TQ_SHARED_ARRAY(uint, ptab, TQA_VB ? ((TQA_VB == 4 || V23) ? 256 : 64) : 1);

// keys this split may need: the union of the query rows' visible ranges
const int lo_all = window > 0 ? (len - T + 1 - window > 0 ? len - T + 1 - window : 0) : 0;
int start = split * split_len;
int end = start + split_len;
if (start < lo_all) start = lo_all;
if (start < row_lo) start = row_lo;   // the batch row's left padding is invisible
if (end > len) end = len;
const size_t koff = (size_t)(b * hkv + h) * (size_t)l_max * (size_t)KRB;
const size_t voff = (size_t)(b * hkv + h) * (size_t)l_max * (size_t)VRB;
// tiles start at an even position (every staged row at an even byte); TQA_NS buffers in a ring:
// while tile i is computed, tiles i + 1 .. i + NS - 1 are being copied asynchronously. A whole tile whose
// rows start 16-aligned (the usual case: even row lengths, splits of a multiple of 8 keys) is staged by
// straight 16-byte copies (tqa_stage_full16), any other by the generic loop
const bool stage16 = tq_aligned16_shared(stage);   // (tqa_stage_tile checks the rest, tile by tile)
const int first = start - (start & 1);

#if TQA_FOLD
// The decode step's append, folded in (DecodeOptions.fold_append; kv_append.cpp's static parameters and
// buffers ak, av, aktab, avtab, ap, aflag_in, with KV_CAL akcal, out aflag; kb and vb written in place): the threadgroup whose
// split holds buffer row ap[3] + s of its (batch row, KV head) quantizes that row's K and V into the
// buffers (kva_row: SIMD group 0 the K row, group 1 the V row, one group both in turn; scratch in the
// staging area, before q and the first tiles use it), then reads them like any other row. aflag as
// kv_append.cpp writes it. Splits never read past their own rows, so no other threadgroup waits for it.
{
    static_assert(2 * KV_MAX_DP * 4 <= TQA_STB, "the folded append's scratch must fit the staging area");
    const uint aR = ap[0], aS = ap[1], apos = ap[3];
    bool mine = false;   // uniform over the threadgroup
    for (uint s = 0u; s < aS; ++s) {
        if ((int)(apos + s) / split_len != split) continue;
        mine = true;
        const uint r = (uint)bh * aS + s;
        for (uint side = warp; side < 2u; side += (uint)TQA_NW) {   // uniform per SIMD group
            const uint row = side == 0u ? r : aR + r;
#if KV_CAL
            TQ_CONST_DEVICE float* cal = akcal;
#else
            TQ_CONST_DEVICE float* cal = aktab;   // not read
#endif
            const uint bad = kva_row(row, lane, aR, aS, ap[2], apos, ap[4], (TQ_CONST_DEVICE KVA_ROW_T*)(ak),
                                     (TQ_CONST_DEVICE KVA_ROW_T*)(av), kb_w, vb_w, aktab, avtab, cal,
                                     (TQ_SHARED float*)stage + (side % 2u) * KV_MAX_DP);
            if (lane == 0u) aflag[row] = aflag_in[row % ap[5]] | bad;
            tq_simd_barrier();   // the next row of this SIMD group rewrites its scratch
        }
    }
    if (tq_gx == 0u && tid == 0u) for (uint i = 2u * aR; i < (uint)KV_FLAG_MIN; ++i) aflag[i] = 0u;
    if (mine) tq_barrier_device();   // the rows written before this threadgroup copies them
}
#endif
if (tid < 16u) { ktab[tid] = tabs[tid]; vtab[tid] = tabs[16u + tid]; }
// V23: the 8 (turbo2: 4) binary16 centroids as low bytes (clo0: entries 0..3, clo1: 4..7) and high bytes
uint clo0 = 0u, clo1 = 0u, chi0 = 0u, chi1 = 0u;
if (V23) {
    for (int i = 0; i < (1 << TQA_VB); ++i) {
        const uint h16 = tq_f2h(tabs[16 + i]);
        if (i < 4) { clo0 |= (h16 & 0xffu) << (8 * i); chi0 |= (h16 >> 8) << (8 * i); }
        else { clo1 |= (h16 & 0xffu) << (8 * (i - 4)); chi1 |= (h16 >> 8) << (8 * (i - 4)); }
    }
    if (TQA_VB == 3)
        for (int i = (int)tid; i < 256; i += NT) {
            uint w = 0u;
            for (int j = 0; j < 8; ++j) w |= (((uint)i >> tqa_v23_col(j)) & 1u) << (4 * j + 2);
            ptab[i] = w;
        }
} else if (TQA_VB) {
    for (int i = (int)tid; i < (1 << (2 * TQA_VB)); i += NT)
        ptab[i] = tq_pack_h2(tabs[16 + (i & ((1 << TQA_VB) - 1))], tabs[16 + (i >> TQA_VB)]);
}
for (int x = (int)tid; x < 8 * TQA_DK; x += NT) {
    const int r = x / TQA_DK, i = x % TQA_DK;
    const int hq = h * G + r / T, t = r % T;
    qf[x] = (r < Q && i < TQA_D) ? TQA_QIN(TQA_Q(q)[((b * hq_all + hq) * T + t) * TQA_D + i], hq, i) : 0.0f;
}
// the ring's first NS - 1 tiles (see the prologue's note above)
tqa_stage_ring_head<TQA_TILE, KRB, VRB, TQA_KTB, TQA_VTB, NT, TQA_NS>(stage, kb, koff, vb, voff, first, end,
                                                                               stage16, tid);
tq_barrier();
if (krot) tqa_rotate(qf, 8 * TQA_DK, krot, tabs + TQA_TAB_KS1, tabs + TQA_TAB_KS2, tabs[TQA_TAB_KSCALE], tid, (uint)NT);
// q to int8 per 32 values, as ggml's quantize_row_q8_0_ref / q8_1_ref. A block's slot j holds value
// (j + rot) % 32 (rot 2 for the even blocks of whole-word q8_0 rows: tqa_q8_pair)
// 8 lanes per block, 4 values (one word of codes) each: the block's max |x| and its code sum by three
// butterfly steps over the 8 lanes (both order-free: the same bits as one thread per block)
constexpr int QW = 8 * NB * 8;   // words of codes: a multiple of 32, so SIMD groups run the loop whole
for (int wi = (int)tid; wi < QW; wi += NT) {   // uniform per SIMD group
    const int bi = wi >> 3, m = wi & 7;
    TQ_SHARED const float* x = qf + bi * 32;
    const int rot = (Q8W && (bi % NB) % 2 == 0) ? 2 : 0;
    float v[4];
    float amax = 0.0f;
    for (int u = 0; u < 4; ++u) {
        v[u] = x[(4 * m + u + rot) & 31];
        const float a = tq_abs(v[u]);
        amax = a > amax ? a : amax;
    }
    for (uint off = 1u; off < 8u; off <<= 1) {
        const float o = tq_simd_shuffle_xor(amax, off);
        amax = o > amax ? o : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    uint w = 0u;
    for (int u = 0; u < 4; ++u) {
        const int c = (int)tqa_round_away(v[u] * id);
        sum += c;
        w |= ((uint)c & 0xffu) << (8 * u);
    }
    for (uint off = 1u; off < 8u; off <<= 1) sum += tq_simd_shuffle_xor(sum, off);
    qi[(bi / NB) * QIS + (bi % NB) * 8 + m] = w;
    if (m == 0) {
        qd[bi] = tq_half_to_float(tq_f2h(d));
        qsm[bi] = tq_half_to_float(tq_f2h((float)sum * d));
    }
}
tq_barrier();
TQA_PHASE(1);

// this lane's q fragments (column g of B) and the scales of its two output columns 2*t4, 2*t4 + 1, in registers
const int qrow = (int)g * QIS + (int)t4;
const int qcol0 = (2 * (int)t4) * NB, qcol1 = (2 * (int)t4 + 1) * NB;
uint bq0[NB], bq1[NB];
float dq0[NB], dq1[NB], sq0[NB], sq1[NB];
for (int k = 0; k < NB; ++k) {
    bq0[k] = qi[qrow + k * 8];
    bq1[k] = qi[qrow + k * 8 + 4];
    dq0[k] = qd[qcol0 + k];
    dq1[k] = qd[qcol1 + k];
    sq0[k] = qsm[qcol0 + k];
    sq1[k] = qsm[qcol1 + k];
}
// visible key range of the two output columns (query rows) of this lane
int hi_c[2], lo_c[2];
bool col_ok[2];
for (int c = 0; c < 2; ++c) {
    const int r = 2 * (int)t4 + c;
    col_ok[c] = r < Q;
    hi_c[c] = len - T + r % T + 1;
    lo_c[c] = window > 0 ? hi_c[c] - window : 0;
}

float mrun[2] = {TQA_NEG_BIG, TQA_NEG_BIG};
float lrun[2] = {0.0f, 0.0f};
float o[RV][4];
for (int i = 0; i < RV; ++i)
    for (int u = 0; u < 4; ++u) o[i][u] = 0.0f;
int buf = 0;
for (int t0 = first; t0 < end; t0 += TQA_TILE) {   // uniform across the threadgroup
    const int n = end - t0 < TQA_TILE ? end - t0 : TQA_TILE;
    // tile i's copies (group i) landed: at most NS - 2 later groups pending; the barrier makes every thread's
    // copies visible and ends every SIMD group's reading of tile i - 1, whose buffer the next copy refills
    tq_cp_wait_n(TQA_NS - 2);
    tq_barrier();
    if (t0 == first) TQA_PHASE(2);
    const int t1 = t0 + (TQA_NS - 1) * TQA_TILE;
    if (t1 < end)   // into tile i - 1's buffer, (buf + NS - 1) % NS
        tqa_stage_tile<TQA_TILE, KRB, VRB, TQA_KTB, TQA_VTB, NT>(stage + (buf == 0 ? TQA_NS - 1 : buf - 1) * HALF, kb,
                                                                 koff, vb, voff, t1,
                                                                 end - t1 < TQA_TILE ? end - t1 : TQA_TILE, stage16, tid);
    tq_cp_commit();
    TQ_SHARED const uchar* kts = (TQ_SHARED const uchar*)(stage + buf * HALF);
    TQ_SHARED const uchar* vts = kts + TQA_KTB;
    // TQA_KC chunks of 16 keys per step of a SIMD group (kc = k0, k0 + 16, ..): their scores, one online-softmax
    // update for all of them, then their V products; the chunks' chains are independent until the max
    for (int k0 = 16 * TQA_KC * (int)warp; k0 < n; k0 += 16 * TQA_KC * TQA_NW) {   // uniform per SIMD group
        float sc[TQA_KC][4];
        TQ_UNROLL
        for (int hc = 0; hc < TQA_KC; ++hc) {
            const int kc = k0 + 16 * hc;
            // scores of keys kc + g and kc + g + 8 against this lane's two columns
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            TQ_SHARED const uchar* r0 = kts + (kc + (int)g) * KRB;
            TQ_SHARED const uchar* r1 = r0 + 8 * KRB;
            TQ_UNROLL
            for (int k = 0; k < NB; ++k) {
                uint a0, a1, a2, a3;
                float d0, d1;
                if (Q8W) {   // 32-bit loads only (tqa_q8_pair; the even blocks' slots rotated by 2, q's too)
                    tqa_q8_pair(r0 + (k & ~1) * kbb, k & 1, (int)t4, &a0, &a2, &d0);
                    tqa_q8_pair(r1 + (k & ~1) * kbb, k & 1, (int)t4, &a1, &a3, &d1);
                } else {
                    tqa_codes8(kf, r0 + k * kbb, (int)t4, ktab, &a0, &a2, ((k * kbb + 2) & 3) == 0 && (KRB & 3) == 0);
                    tqa_codes8(kf, r1 + k * kbb, (int)t4, ktab, &a1, &a3, ((k * kbb + 2) & 3) == 0 && (KRB & 3) == 0);
                    d0 = tqa_half(r0 + k * kbb, 0);
                    d1 = tqa_half(r1 + k * kbb, 0);
                }
                int c[4] = {0, 0, 0, 0};
                tq_mma_s8(c, a0, a1, a2, a3, bq0[k], bq1[k],
                          lane);
                const float e0 = dq0[k], e1 = dq1[k];
                s[0] += (float)c[0] * (d0 * e0);
                s[1] += (float)c[1] * (d0 * e1);
                s[2] += (float)c[2] * (d1 * e0);
                s[3] += (float)c[3] * (d1 * e1);
                if (TQA_KM) {
                    const float m0 = tqa_half(r0 + k * kbb, 2), m1 = tqa_half(r1 + k * kbb, 2);
                    const float u0 = sq0[k], u1 = sq1[k];
                    s[0] += m0 * u0;
                    s[1] += m0 * u1;
                    s[2] += m1 * u0;
                    s[3] += m1 * u1;
                }
            }
            // masks, scale, softcap
            // every key of these 16 visible to every query row (uniform per SIMD group): no per-key masks
            const bool inner = kc + 16 <= n && t0 + kc >= start && t0 + kc + 16 <= len - T + 1
                               && (window <= 0 || t0 + kc >= len - window);
            if (inner && softcap <= 0.0f) {   // the common case, as its own branch: no per-key compares issued
                for (int j = 0; j < 4; ++j) s[j] = col_ok[j & 1] ? (s[j] * scale) * LOG2E : TQA_NEG_BIG;
            } else {
                for (int j = 0; j < 4; ++j) {
                    const int c = j & 1;
                    const int ik = kc + (int)g + 8 * (j >> 1);
                    const int pos = t0 + ik;
                    const bool ok = col_ok[c] && (inner || (ik < n && pos >= start && pos < hi_c[c] && pos >= lo_c[c]));
                    float x = s[j] * scale;
                    if (softcap > 0.0f) x = softcap * tqa_tanh(x / softcap);
                    s[j] = ok ? x * LOG2E : TQA_NEG_BIG;
                }
            }
            for (int j = 0; j < 4; ++j) sc[hc][j] = s[j];
        }
        // the online softmax of each column over the step's TQA_KC * 16 keys: one max, one rescale
        float alpha[2], p[TQA_KC][4];
        for (int c = 0; c < 2; ++c) {
            float mt = sc[0][c] > sc[0][2 + c] ? sc[0][c] : sc[0][2 + c];
            for (int hc = 1; hc < TQA_KC; ++hc) {
                mt = sc[hc][c] > mt ? sc[hc][c] : mt;
                mt = sc[hc][2 + c] > mt ? sc[hc][2 + c] : mt;
            }
            for (uint off = 4u; off < 32u; off <<= 1) {
                const float w = tq_simd_shuffle_xor(mt, off);
                mt = w > mt ? w : mt;
            }
            const float mn = mt > mrun[c] ? mt : mrun[c];
            // one exp2 per weight, results below 2^-126 flushed: a masked score (NEG_BIG) gets weight 0
            // against any finite max; mb stands in for the max while the column has seen no visible key
            const float mb = mn > TQA_NEG_BIG ? mn : 0.0f;
            alpha[c] = tq_exp2_ftz(mrun[c] - mn);   // 1 while both are NEG_BIG: nothing to rescale
            mrun[c] = mn;
            float sum = 0.0f;
            for (int hc = 0; hc < TQA_KC; ++hc) {
                p[hc][c] = tq_exp2_ftz(sc[hc][c] - mb);
                p[hc][2 + c] = tq_exp2_ftz(sc[hc][2 + c] - mb);
                sum = hc ? sum + (p[hc][c] + p[hc][2 + c]) : p[hc][c] + p[hc][2 + c];
            }
            lrun[c] = lrun[c] * alpha[c] + sum;
        }
        // rescale the outputs only when some column's max moved (uniform per SIMD group)
        int moved = (alpha[0] != 1.0f || alpha[1] != 1.0f) ? 1 : 0;
        moved |= tq_simd_shuffle_xor(moved, 1u);
        moved |= tq_simd_shuffle_xor(moved, 2u);
        if (moved) {
            TQ_UNROLL
            for (int i = 0; i < RV; ++i) {
                o[i][0] = o[i][0] * alpha[0];
                o[i][1] = o[i][1] * alpha[1];
                o[i][2] = o[i][2] * alpha[0];
                o[i][3] = o[i][3] * alpha[1];
            }
        }
        TQ_UNROLL
        for (int hc = 0; hc < TQA_KC; ++hc) {
            const int kc = k0 + 16 * hc;
            // P^T as the B fragment: rows (keys) 2*t4.., column (query row) g
            const uint pb0 = tq_movmatrix_t(tq_pack_h2(p[hc][0] * TQA_P_SCALE, p[hc][1] * TQA_P_SCALE), lane);
            const uint pb1 = tq_movmatrix_t(tq_pack_h2(p[hc][2] * TQA_P_SCALE, p[hc][3] * TQA_P_SCALE), lane);
            // V^T fragments: keys kc + 2*t4 + {0, 1, 8, 9}, runs g * RV and (g + 8) * RV
            int kk[4];
            bool kv[4];
            for (int x = 0; x < 4; ++x) {
                kk[x] = kc + 2 * (int)t4 + (x & 1) + 8 * (x >> 1);
                kv[x] = kk[x] < n && t0 + kk[x] >= start;
            }
            if (V23) {
                // turbo2 / turbo3, each run inside one block. Per key and sub-run (8 values): the indices as
                // 4-bit fields in the order 0 2 4 6 1 3 5 7 (qs's even 2-bit fields to fields 0..3, its odd
                // ones to 4..7, turbo3's sign bits from the table); keys without weight read any bytes (the
                // fields stay indices 0..7) and get a zero norm
                uint npair[2][2];   // [key pair][run]: the norms of the run's block
                TQ_UNROLL
                for (int run = 0; run < 2; ++run) {
                    const int blk = (((int)g + 8 * run) * RV) / vgrp;
                    for (int pr = 0; pr < 2; ++pr)
                        npair[pr][run] = tqa_key_pair_u16(vts, VRB, kk[2 * pr], kk[2 * pr + 1], kv[2 * pr],
                                                          kv[2 * pr + 1], blk * vbb);
                }
                TQ_UNROLL
                for (int s8 = 0; s8 < RV / 8; ++s8) {   // m-tiles 8 * s8 .. 8 * s8 + 7
                    uint w[4][2];
                    TQ_UNROLL
                    for (int x = 0; x < 4; ++x) {
                        TQ_SHARED const uchar* vrow = vts + kk[x] * VRB;
                        for (int run = 0; run < 2; ++run) {
                            const int e = ((int)g + 8 * run) * RV + 8 * s8;   // the sub-run's first value
                            const int blk = e / vgrp;
                            const int e8 = (e - blk * vgrp) / 8;   // its sign byte in the block; its qs at 2 * e8
                            TQ_SHARED const uchar* bp = vrow + blk * vbb;
                            const uint qx = tqa_u16(bp, vqs + 2 * e8);
                            w[x][run] = ((qx << 14) | qx) & 0x33333333u;
                            if (TQA_VB == 3) w[x][run] |= ptab[bp[vsg + e8]];
                        }
                    }
                    uint sel[2][2][2];   // [key pair][run]: fields 0..3 / 4..7 of both keys
                    TQ_UNROLL
                    for (int pr = 0; pr < 2; ++pr)
                        for (int run = 0; run < 2; ++run) {
                            // bytes (key a, key b) of fields 0-1, 2-3 / 4-5, 6-7: each 16 bits select 4 centroids
                            sel[pr][run][0] = tq_byte_perm(w[2 * pr][run], w[2 * pr + 1][run], 0x5140u);
                            sel[pr][run][1] = tq_byte_perm(w[2 * pr][run], w[2 * pr + 1][run], 0x7362u);
                        }
                    TQ_UNROLL
                    for (int f = 0; f < 4; ++f) {   // fields 2f and 2f + 1: m-tiles 8 * s8 + 2f, + 1
                        uint a[2][2][2];   // [field][key pair][run]
                        for (int pr = 0; pr < 2; ++pr)
                            for (int run = 0; run < 2; ++run) {
                                const uint sl = sel[pr][run][f >> 1] >> (16 * (f & 1));
                                // low / high bytes of c[a 2f], c[a 2f+1], c[b 2f], c[b 2f+1]
                                const uint lo = tq_byte_perm(clo0, clo1, sl), hi = tq_byte_perm(chi0, chi1, sl);
                                a[0][pr][run] = tq_hmul2(tq_byte_perm(lo, hi, 0x6240u), npair[pr][run]);
                                a[1][pr][run] = tq_hmul2(tq_byte_perm(lo, hi, 0x7351u), npair[pr][run]);
                            }
                        tq_mma_f16(o[8 * s8 + 2 * f], a[0][0][0], a[0][0][1], a[0][1][0], a[0][1][1], pb0, pb1, lane);
                        tq_mma_f16(o[8 * s8 + 2 * f + 1], a[1][0][0], a[1][0][1], a[1][1][0], a[1][1][1], pb0, pb1,
                                   lane);
                    }
                }
            } else if (TQA_VB) {
                // turbo V: centroid pairs from the table, times the two keys' norms (binary16 products).
                // A run of RV values may cross a block boundary (e.g. 64-value blocks, DV 192: runs of 12):
                // then the norms are read per 4 values (a multiple of 4 never crosses one), else once per run
                constexpr bool RUN_IN_BLOCK = TQA_VGRP % RV == 0;
                uint npair[2][2];   // [key pair][run]: the norms of keys (2t, 2t+1) / (2t+8, 2t+9), raw bits
                TQ_UNROLL
                for (int c4 = 0; c4 < RV; c4 += 4) {
                    if (!RUN_IN_BLOCK || c4 == 0) {
                        for (int run = 0; run < 2; ++run) {
                            const int blk = (((int)g + 8 * run) * RV + c4) / vgrp;
                            for (int pr = 0; pr < 2; ++pr)
                                npair[pr][run] = tqa_key_pair_u16(vts, VRB, kk[2 * pr], kk[2 * pr + 1], kv[2 * pr],
                                                                  kv[2 * pr + 1], blk * vbb);
                        }
                    }
                    uint ix[4][2];
                    for (int x = 0; x < 4; ++x) {
                        TQ_SHARED const uchar* vrow = vts + kk[x] * VRB;
                        for (int run = 0; run < 2; ++run) {
                            const int e = ((int)g + 8 * run) * RV + c4;
                            const int blk = e / vgrp;
                            ix[x][run] = kv[x] ? tqa_turbo_idx4(vf, vrow + blk * vbb, vqs, vsg, e - blk * vgrp) : 0u;
                        }
                    }
                    for (int u = 0; u < 4; ++u) {
                        const int sh = 4 * u;
                        const uint a0 = ptab[((ix[0][0] >> sh) & 15u) | (((ix[1][0] >> sh) & 15u) << TQA_VB)];
                        const uint a1 = ptab[((ix[0][1] >> sh) & 15u) | (((ix[1][1] >> sh) & 15u) << TQA_VB)];
                        const uint a2 = ptab[((ix[2][0] >> sh) & 15u) | (((ix[3][0] >> sh) & 15u) << TQA_VB)];
                        const uint a3 = ptab[((ix[2][1] >> sh) & 15u) | (((ix[3][1] >> sh) & 15u) << TQA_VB)];
                        tq_mma_f16(o[c4 + u], tq_hmul2(a0, npair[0][0]), tq_hmul2(a1, npair[0][1]),
                                   tq_hmul2(a2, npair[1][0]), tq_hmul2(a3, npair[1][1]), pb0, pb1, lane);
                    }
                }
            } else if (VQ) {
                // q4_0 / q5_0 / q8_0: x = d * (code - offset). Per key, run and 4 values: the codes as bytes b
                // (q4_0 / q5_0: the 4- / 5-bit code; q8_0: code + 128), interleaved for the key pairs, put into binary16
                // 1024 + b (0x64 high bytes), minus 1024 + offset (exact), times the keys' scales d
                uint dpair[2][2];   // [key pair][run]: the blocks' fp16 scales d (0 for keys without weight)
                TQ_UNROLL
                for (int run = 0; run < 2; ++run) {
                    const int blk = (((int)g + 8 * run) * RV) / 32;
                    for (int pr = 0; pr < 2; ++pr)
                        dpair[pr][run] = tqa_key_pair_u16(vts, VRB, kk[2 * pr], kk[2 * pr + 1], kv[2 * pr], kv[2 * pr + 1],
                                                          blk * vbb);
                }
                // binary16 -(1024 + offset), twice: q8_0 -1152, q5_0 -1040, q4_0 -1032
                const uint bias = TQA_VF == TQA_Q8_0 ? 0xe480e480u : (TQA_VF == TQA_Q5_0 ? 0xe410e410u : 0xe408e408u);
                TQ_UNROLL
                for (int c4 = 0; c4 < RV; c4 += 4) {
                    uint cb[4][2];   // [key][run]
                    for (int x = 0; x < 4; ++x) {
                        TQ_SHARED const uchar* vrow = vts + kk[x] * VRB;
                        for (int run = 0; run < 2; ++run) {
                            const int e = ((int)g + 8 * run) * RV + c4;
                            const int blk = e / 32, j = e - 32 * (e / 32);
                            if (TQA_VF == TQA_Q8_0) {
                                cb[x][run] = tqa_u32(vrow, blk * vbb + 2 + j) ^ 0x80808080u;
                            } else if (TQA_VF == TQA_Q4_0) {   // values 0..15: low nibbles of qs[0..15], 16..31: high
                                const uint w = tqa_u32(vrow, blk * vbb + 2 + (j & 15));
                                cb[x][run] = (j >= 16 ? w >> 4 : w) & 0x0f0f0f0fu;
                            } else {   // q5_0: fp16 d, u32 qh (bit j: the 5th bit of value j), qs[16] as q4_0's
                                const uint w = tqa_u32(vrow, blk * vbb + 6 + (j & 15));
                                const uint hb = (tqa_u32(vrow, blk * vbb + 2) >> j) & 15u;
                                // the 4 high bits to bit 4 of each byte (bit i alone lands at 8i + 4: no carries)
                                cb[x][run] = ((j >= 16 ? w >> 4 : w) & 0x0f0f0f0fu) | ((hb * 0x02040810u) & 0x10101010u);
                            }
                        }
                    }
                    uint a[4][2][2];   // [value][key pair][run]
                    for (int pr = 0; pr < 2; ++pr)
                        for (int run = 0; run < 2; ++run) {
                            const uint m01 = tq_byte_perm(cb[2 * pr][run], cb[2 * pr + 1][run], 0x5140u);   // a0 b0 a1 b1
                            const uint m23 = tq_byte_perm(cb[2 * pr][run], cb[2 * pr + 1][run], 0x7362u);   // a2 b2 a3 b3
                            a[0][pr][run] = tq_byte_perm(m01, 0x64646464u, 0x4140u);
                            a[1][pr][run] = tq_byte_perm(m01, 0x64646464u, 0x4342u);
                            a[2][pr][run] = tq_byte_perm(m23, 0x64646464u, 0x4140u);
                            a[3][pr][run] = tq_byte_perm(m23, 0x64646464u, 0x4342u);
                            for (int u = 0; u < 4; ++u) a[u][pr][run] = tq_hmul2(tq_hadd2(a[u][pr][run], bias), dpair[pr][run]);
                        }
                    for (int u = 0; u < 4; ++u)
                        tq_mma_f16(o[c4 + u], a[u][0][0], a[u][0][1], a[u][1][0], a[u][1][1], pb0, pb1, lane);
                }
            } else {
            TQ_UNROLL
            for (int c4 = 0; c4 < RV; c4 += 4) {
                tqa_f4 f[4][2];
                for (int x = 0; x < 4; ++x) {
                    TQ_SHARED const uchar* vrow = vts + kk[x] * VRB;
                    for (int run = 0; run < 2; ++run) {
                        const int e = ((int)g + 8 * run) * RV + c4;
                        if (kv[x]) {
                            f[x][run] = tqa_dq4(vf, vbb, vgrp, vqs, vsg, vrow, e, vtab);
                        } else {
                            for (int u = 0; u < 4; ++u) f[x][run].v[u] = 0.0f;
                        }
                    }
                }
                for (int u = 0; u < 4; ++u) {
                    tq_mma_f16(o[c4 + u], tq_pack_h2(f[0][0].v[u], f[1][0].v[u]), tq_pack_h2(f[0][1].v[u], f[1][1].v[u]),
                               tq_pack_h2(f[2][0].v[u], f[3][0].v[u]), tq_pack_h2(f[2][1].v[u], f[3][1].v[u]), pb0, pb1,
                               lane);
                }
            }
            }
        }
    }
    buf = buf + 1 == TQA_NS ? 0 : buf + 1;
}
tq_cp_wait0();
tq_barrier();   // every SIMD group is done with the last tile before the merge below reuses the area
TQA_PHASE(3);

// every SIMD group's sums over its lanes, then the groups merged through threadgroup memory
for (int c = 0; c < 2; ++c)
    for (uint off = 4u; off < 32u; off <<= 1) lrun[c] += tq_simd_shuffle_xor(lrun[c], off);
TQ_SHARED float* wm = (TQ_SHARED float*)stage;            // (NW, 8)
TQ_SHARED float* wl = wm + TQA_NW * 8;                    // (NW, 8)
// (NW, 8, WOS): rows of DV values at a stride of DV + 1, so the fragment stores below (lanes g * 4 + t4 write
// row 2 * t4 + c, column g * RV + i) hit at most 2 lanes per bank (a stride of DV, a multiple of 32: 8 lanes)
constexpr int WOS = TQA_DV + 1;
static_assert(4 * TQA_NW * 8 * (2 + WOS) <= TQA_STB, "the SIMD groups' partial rows must fit the staging area");
TQ_SHARED float* wo = wl + TQA_NW * 8;
for (int c = 0; c < 2; ++c) {
    const int r = 2 * (int)t4 + c;
    if (r < Q) {
        if (g == 0u) { wm[warp * 8 + r] = mrun[c]; wl[warp * 8 + r] = lrun[c]; }
        for (int i = 0; i < RV; ++i) {
            const int col = V23 ? ((i & ~7) | tqa_v23_col(i & 7)) : i;
            wo[((int)warp * 8 + r) * WOS + (int)g * RV + col] = o[i][c] * TQA_P_UNSCALE;
            wo[((int)warp * 8 + r) * WOS + ((int)g + 8) * RV + col] = o[i][2 + c] * TQA_P_UNSCALE;
        }
    }
}
tq_barrier();
const size_t row0 = (size_t)((b * hq_all + h * G) * T);   // first output row of this group
for (int x = (int)tid; x < Q * TQA_DV; x += NT) {
    const int r = x / TQA_DV, e = x % TQA_DV;
    float mx = TQA_NEG_BIG;
    for (int w = 0; w < TQA_NW; ++w) mx = wm[w * 8 + r] > mx ? wm[w * 8 + r] : mx;
    float a = 0.0f, l = 0.0f;
    for (int w = 0; w < TQA_NW; ++w) {
        const float f = tq_exp2(wm[w * 8 + r] - mx);
        a += wo[(w * 8 + r) * WOS + e] * f;
        l += wl[w * 8 + r] * f;
    }
    const size_t pi = (row0 + (size_t)r) * (size_t)n_splits + (size_t)split;
    po[pi * TQA_DV + e] = a;
    if (e == 0) { pml[pi * 2] = mx > TQA_NEG_BIG ? mx * (1.0f / LOG2E) : TQA_NEG_BIG; pml[pi * 2 + 1] = l; }
}
TQA_PHASE(4);
TQA_PHASES_WRITE();
