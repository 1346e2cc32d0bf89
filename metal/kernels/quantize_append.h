// Quantize-on-append: float rows -> blocks of one registered format, one thread per block
// (tqbridge kernel dialect; see docs/kernels.md). Byte-identical to tqbridge.bridge.quantize: every
// float operation is one tq_* op in the reference's order, the scans are C's first-wins scans, and
// every sum is sequential (j = 0, 1, ...).
//
// Static parameters: QA_FMT (format code below), QA_SRC (0 float32 rows, 1 float16 bits, 2 bfloat16
// bits), QA_BLOCK (values per block), QA_TYPE_SIZE (bytes per block); turbo formats also QA_BITS,
// QA_QS_OFF, QA_SIGNS_OFF, QA_RNORM (1: a zero fp16 at bytes 2..3), QA_VPL (values per lane).
// Turbo formats take one simdgroup per block, the others one thread per block.
// Buffers: x (rows), tab (float32 tables; iq4_nl: the host's default NaN at 0; turbo: centroids at 0, midpoints at 16, s1 at 32,
// s2 * scale at 32 + QA_BLOCK), params (uint32: [0] number of blocks), out (uint8 blocks).

#define QA_F32 0
#define QA_F16 1
#define QA_BF16 2
#define QA_Q8_0 3
#define QA_Q4_0 4
#define QA_Q4_1 5
#define QA_Q5_0 6
#define QA_Q5_1 7
#define QA_IQ4_NL 8
#define QA_TURBO 9
#define QA_IQ4_NL_REF 10  // iq4_nl through quantize_row_iq4_nl_ref (what llama.cpp writes into its KV cache)

#define QA_TAB_C 0
#define QA_TAB_M 16
#define QA_TAB_S1 32
#define QA_FLT_MAX 3.402823466e+38f
#define QA_MAX_VPL 4

TQ_FUNC float qa_load(TQ_CONST_DEVICE float* x, uint i) { return x[i]; }
TQ_FUNC float qa_load(TQ_CONST_DEVICE ushort* x, uint i) {
    return QA_SRC == 2 ? tq_bf16_bits_to_f32(x[i]) : tq_f16_bits_to_f32(x[i]);
}

TQ_FUNC void qa_put16(TQ_DEVICE uchar* o, uint off, ushort h) {
    o[off] = (uchar)(h & 0xffu);
    o[off + 1] = (uchar)(h >> 8);
}

// ggml's iq4_nl table (ggml-common.h kvalues_iq4nl) and best_index_int8 (NaN -> 15).
TQ_FUNC float qa_kv(uint i) {
    const float kv[16] = {-127.f, -104.f, -83.f, -65.f, -49.f, -35.f, -22.f, -10.f,
                          1.f, 13.f, 25.f, 38.f, 53.f, 69.f, 89.f, 113.f};
    return kv[i];
}

TQ_FUNC uint qa_best_index(float x) {
    if (tq_isnan(x)) return 15u;
    if (x <= -127.f) return 0u;
    if (x >= 113.f) return 15u;
    uint mu = 0u;
    for (uint k = 0u; k < 16u; ++k) mu += qa_kv(k) <= x ? 1u : 0u;
    float lo = qa_kv(mu - 1u), hi = qa_kv(mu);
    return tq_sub(x, lo) < tq_sub(hi, x) ? mu - 1u : mu;
}

// numpy's np_roundf of gguf-py (round half away from zero through floor), then the int8 cast.
TQ_FUNC uchar qa_round_i8(float n) {
    float a = tq_abs(n);
    float fl = tq_floor(a);
    float b = tq_add(fl, tq_floor(tq_mul(2.0f, tq_sub(a, fl))));
    float s = n > 0.0f ? 1.0f : (n < 0.0f ? -1.0f : n);
    return tq_f32_to_u8_np(tq_mul(s, b));
}

// One block of a legacy ggml or float format, one thread: v holds the block's `block` values
// (32, or 1 for the float formats).
TQ_FUNC void qa_plain_block(const int fmt, const int block, TQ_THREAD const float* v,
                            TQ_DEVICE uchar* o, TQ_CONST_DEVICE float* tab) {

    if (fmt == QA_F32) {
        for (uint j = 0u; j < (uint)block; ++j) {
            uint u = tq_as_uint(v[j]);
            qa_put16(o, 4u * j, (ushort)(u & 0xffffu));
            qa_put16(o, 4u * j + 2u, (ushort)(u >> 16));
        }
    } else if (fmt == QA_F16) {
        // ggml's fp32 -> fp16: any NaN becomes sign | 0x7e00
        uint u = tq_as_uint(v[0]);
        ushort h = tq_isnan(v[0]) ? (ushort)(((u >> 16) & 0x8000u) | 0x7e00u) : tq_f32_to_f16_bits(v[0]);
        qa_put16(o, 0u, h);
    } else if (fmt == QA_BF16) {
        qa_put16(o, 0u, tq_f32_to_bf16_bits(v[0]));
    } else if (fmt == QA_Q8_0) {
        float amax = 0.0f;
        for (uint j = 0u; j < 32u; ++j) { float a = tq_abs(v[j]); amax = amax > a ? amax : a; }
        float d = tq_div(amax, 127.0f);
        float id = d != 0.0f ? tq_div(1.0f, d) : 0.0f;
        qa_put16(o, 0u, tq_f32_to_f16_bits(d));
        for (uint j = 0u; j < 32u; ++j) o[2u + j] = qa_round_i8(tq_mul(v[j], id));
    } else if (fmt == QA_Q4_0 || fmt == QA_Q5_0) {
        const bool five = fmt == QA_Q5_0;
        float amax = 0.0f, mx = 0.0f;
        for (uint j = 0u; j < 32u; ++j) { float a = tq_abs(v[j]); if (amax < a) { amax = a; mx = v[j]; } }
        float d = tq_div(mx, five ? -16.0f : -8.0f);
        float id = d != 0.0f ? tq_div(1.0f, d) : 0.0f;
        uchar q[32];
        uint top = five ? 31u : 15u;
        for (uint j = 0u; j < 32u; ++j) {
            uint t = (uint)tq_f32_to_u8_np(tq_trunc(tq_add(tq_mul(v[j], id), five ? 16.5f : 8.5f)));
            q[j] = (uchar)(t < top ? t : top);
        }
        qa_put16(o, 0u, tq_f32_to_f16_bits(d));
        uint qs = 2u;
        if (five) {
            uint qh = 0u;
            for (uint j = 0u; j < 32u; ++j) qh |= ((uint)(q[j] >> 4) & 1u) << j;
            for (uint k = 0u; k < 4u; ++k) o[2u + k] = (uchar)((qh >> (8u * k)) & 0xffu);
            qs = 6u;
        }
        for (uint j = 0u; j < 16u; ++j) o[qs + j] = (uchar)((q[j] & 0x0fu) | ((q[j + 16u] & 0x0fu) << 4));
    } else if (fmt == QA_Q4_1 || fmt == QA_Q5_1) {
        const bool five = fmt == QA_Q5_1;
        float mn = QA_FLT_MAX, mxv = -QA_FLT_MAX;
        for (uint j = 0u; j < 32u; ++j) { if (v[j] < mn) mn = v[j]; if (v[j] > mxv) mxv = v[j]; }
        float d = tq_div(tq_sub(mxv, mn), five ? 31.0f : 15.0f);
        float id = d != 0.0f ? tq_div(1.0f, d) : 0.0f;
        uchar q[32];
        uint top = five ? 31u : 15u;
        for (uint j = 0u; j < 32u; ++j) {
            uint t = (uint)tq_f32_to_u8_np(tq_trunc(tq_add(tq_mul(tq_sub(v[j], mn), id), 0.5f)));
            q[j] = (uchar)(t < top ? t : top);
        }
        qa_put16(o, 0u, tq_f32_to_f16_bits(d));
        qa_put16(o, 2u, tq_f32_to_f16_bits(mn));
        uint qs = 4u;
        if (five) {
            uint qh = 0u;
            for (uint j = 0u; j < 32u; ++j) qh |= ((uint)(q[j] >> 4) & 1u) << j;
            for (uint k = 0u; k < 4u; ++k) o[4u + k] = (uchar)((qh >> (8u * k)) & 0xffu);
            qs = 8u;
        }
        for (uint j = 0u; j < 16u; ++j) o[qs + j] = (uchar)((q[j] & 0x0fu) | ((q[j + 16u] & 0x0fu) << 4));
    } else if (fmt == QA_IQ4_NL_REF) {
        // ntry = -1: d0 = max / kv[0] (no minus), one pass, its indices kept; sums sequential
        uint imax = 0u;
        float amax = tq_abs(v[0]);
        for (uint j = 0u; j < 32u; ++j) {
            float a = tq_abs(v[j]);
            if (a > amax) { amax = a; imax = j; }
        }
        bool live = amax >= 1e-15f;
        float d0 = tq_div(live ? v[imax] : 1.0f, -127.0f);
        float id = tq_div(1.0f, d0);
        uint L[32];
        float sqx = 0.0f, sq2 = 0.0f;
        for (uint j = 0u; j < 32u; ++j) {
            L[j] = qa_best_index(tq_mul(id, v[j]));
            float q = qa_kv(L[j]);
            float wq = tq_mul(tq_mul(v[j], v[j]), q);
            sqx = tq_add(sqx, tq_mul(wq, v[j]));
            sq2 = tq_add(sq2, tq_mul(wq, q));
        }
        float d = live ? tq_div(sqx, sq2) : 0.0f;
        if (tq_isnan(d)) d = tab[0];   // the host CPU's default NaN, as the reference stores it
        qa_put16(o, 0u, tq_f32_to_f16_bits(d));
        for (uint j = 0u; j < 16u; ++j) {
            uint lo = live ? L[j] : 8u, hi = live ? L[j + 16u] : 8u;
            o[2u + j] = (uchar)(lo | (hi << 4));
        }
    } else if (fmt == QA_IQ4_NL) {
        float w[32];
        uint imax = 0u;
        float amax = tq_abs(v[0]);
        for (uint j = 0u; j < 32u; ++j) {
            w[j] = tq_mul(v[j], v[j]);
            float a = tq_abs(v[j]);
            if (a > amax) { amax = a; imax = j; }
        }
        float mx = v[imax];
        bool live = amax >= 1e-15f;
        float d = tq_div(-mx, -127.0f);
        float best = 0.0f;
        // the scale search: sequential sums of (w*q)*x and (w*q)*q for q = kv[best_index(id*x)]
        for (int itry = -8; itry <= 7; ++itry) {
            // itry == -8: the initial guess id = 1/d; then id = (itry + kv[0]) / max
            float id = itry < -7 ? tq_div(1.0f, d) : tq_div((float)(itry + -127), mx);
            float sqx = 0.0f, sq2 = 0.0f;
            for (uint j = 0u; j < 32u; ++j) {
                float q = qa_kv(qa_best_index(tq_mul(id, v[j])));
                float wq = tq_mul(w[j], q);
                sqx = tq_add(sqx, tq_mul(wq, v[j]));
                sq2 = tq_add(sq2, tq_mul(wq, q));
            }
            if (itry < -7) {
                d = tq_div(sqx, sq2);
                best = tq_mul(d, sqx);
            } else if (sq2 > 0.0f && tq_mul(sqx, sqx) > tq_mul(best, sq2)) {
                d = tq_div(sqx, sq2);
                best = tq_mul(d, sqx);
            }
        }
        if (!live) d = 0.0f;
        // a NaN scale (inf - inf in the sums of huge rows) is stored as the host CPU's default NaN
        // (tab[0]), the NaN the reference computes; GPUs make NaNs with other sign and payload bits
        if (tq_isnan(d)) d = tab[0];
        float inv = d != 0.0f ? tq_div(1.0f, d) : 0.0f;
        qa_put16(o, 0u, tq_f32_to_f16_bits(d));
        for (uint j = 0u; j < 16u; ++j) {
            uint lo = qa_best_index(tq_mul(inv, v[j]));
            uint hi = qa_best_index(tq_mul(inv, v[j + 16u]));
            o[2u + j] = (uchar)(lo | (hi << 4));
        }
    }
}

// One turbo block, one simdgroup: lane l holds the vpl (2 or 4) consecutive values l*vpl + i of
// the block in v (overwritten). Sums stay sequential over j = 0, 1, ... (every lane adds the
// broadcast terms in the same order). Every lane of the simdgroup must call it.
TQ_FUNC void qa_turbo_block(const int bits, const int vpl, const int qs_off, const int signs_off,
                            const int rnorm, TQ_THREAD float* v, TQ_DEVICE uchar* o,
                            TQ_CONST_DEVICE float* tab, const uint l) {
    const int block = 32 * vpl;
    const uint nlev = 1u << (uint)bits;
    float sq[QA_MAX_VPL];
    for (uint i = 0u; i < (uint)vpl; ++i) sq[i] = tq_mul(v[i], v[i]);
    // 1. norm_sq = x[0]^2 + x[1]^2 + ... in this order; g = sqrt; inv = g > 1e-10 ? 1/g : 0
    float nsq = 0.0f;
    for (uint j = 0u; j < (uint)block; ++j)
        nsq = tq_add(nsq, tq_simd_broadcast(sq[j % (uint)vpl], j / (uint)vpl));
    float g = tq_sqrt(nsq);
    float inv = g > 1e-10f ? tq_div(1.0f, g) : 0.0f;
    // 2. rotation: s1, the butterfly (h < vpl inside a lane, then across lanes), s2 * scale
    for (uint i = 0u; i < (uint)vpl; ++i) v[i] = tq_mul(tq_mul(v[i], inv), tab[QA_TAB_S1 + l * (uint)vpl + i]);
    for (uint h = 1u; h < (uint)vpl; h <<= 1) {
        for (uint i = 0u; i < (uint)vpl; ++i) {
            if ((i & h) == 0u) {
                float a = v[i], c = v[i + h];
                v[i] = tq_add(a, c);
                v[i + h] = tq_sub(a, c);
            }
        }
    }
    for (uint m = 1u; m < 32u; m <<= 1) {  // partner lane l ^ m holds j ^ (m * vpl)
        for (uint i = 0u; i < (uint)vpl; ++i) {
            float other = tq_simd_shuffle_xor(v[i], m);
            v[i] = (l & m) == 0u ? tq_add(v[i], other) : tq_sub(other, v[i]);
        }
    }
    // 3. nearest centroid: the number of midpoints <= u
    uint idx[QA_MAX_VPL];
    float c2[QA_MAX_VPL];
    for (uint i = 0u; i < (uint)vpl; ++i) {
        float u = tq_mul(v[i], tab[QA_TAB_S1 + block + l * (uint)vpl + i]);
        uint k = 0u;
        for (uint m = 0u; m + 1u < nlev; ++m) k += tab[QA_TAB_M + m] <= u ? 1u : 0u;
        idx[i] = k;
        float c = tab[QA_TAB_C + k];
        c2[i] = tq_mul(c, c);
    }
    // 4. corrected norm g / ||c[idx]|| (sequential sum of squares), stored as fp16
    float rsq = 0.0f;
    for (uint j = 0u; j < (uint)block; ++j)
        rsq = tq_add(rsq, tq_simd_broadcast(c2[j % (uint)vpl], j / (uint)vpl));
    float r = tq_sqrt(rsq);
    float norm = r > 1e-10f ? tq_div(g, r) : g;
    if (l == 0u) {
        qa_put16(o, 0u, tq_f32_to_f16_bits(norm));
        if (rnorm) qa_put16(o, 2u, (ushort)0u);
    }
    // packing: `bits` bits per value; lanes OR their fields together until one lane holds a byte
    uint q4 = 0u, q2 = 0u, hb = 0u;
    for (uint i = 0u; i < (uint)vpl; ++i) {
        q4 |= (idx[i] & 15u) << (4u * i);
        q2 |= (idx[i] & 3u) << (2u * i);
        hb |= ((idx[i] >> 2) & 1u) << i;
    }
    if (bits == 4) {
        for (uint k = 0u; k < (uint)vpl / 2u; ++k)
            o[qs_off + l * (uint)vpl / 2u + k] = (uchar)((q4 >> (8u * k)) & 0xffu);
    } else {
        // 2-bit fields: 4 per byte; a lane has 2 * vpl bits
        for (uint m = 1u; m * (uint)vpl < 4u; m <<= 1) {
            uint other = tq_simd_shuffle_xor(q2, m);
            if ((l & m) == 0u) q2 |= other << (2u * (uint)vpl * m);
        }
        const uint lanes2 = (4u + (uint)vpl - 1u) / (uint)vpl;  // lanes per qs byte (1 or 2)
        if (l % lanes2 == 0u) {
            for (uint k = 0u; k < (uint)vpl * lanes2 / 4u; ++k)
                o[qs_off + l * (uint)vpl / 4u + k] = (uchar)((q2 >> (8u * k)) & 0xffu);
        }
        if (bits == 3) {
            // high bits: 8 per byte
            for (uint m = 1u; m * (uint)vpl < 8u; m <<= 1) {
                uint other = tq_simd_shuffle_xor(hb, m);
                if ((l & m) == 0u) hb |= other << ((uint)vpl * m);
            }
            const uint lanes3 = 8u / (uint)vpl;
            if (l % lanes3 == 0u) o[signs_off + l / lanes3] = (uchar)(hb & 0xffu);
        }
    }
}
//== body ==
#if QA_FMT == QA_TURBO
    // one simdgroup per block
    uint b = tq_gx * tq_nsimd + tq_simd;
    if (b >= params[0]) return;  // uniform in the simdgroup
    float v[QA_MAX_VPL];
    for (uint i = 0u; i < (uint)QA_VPL; ++i) v[i] = qa_load(x, b * (uint)QA_BLOCK + tq_lane * (uint)QA_VPL + i);
    qa_turbo_block(QA_BITS, QA_VPL, QA_QS_OFF, QA_SIGNS_OFF, QA_RNORM, v, out + b * (uint)QA_TYPE_SIZE, tab, tq_lane);
#else
    // one thread per block
    uint b = tq_gx * tq_tg_size + tq_tid;
    if (b >= params[0]) return;
    float v[QA_BLOCK];
    for (uint j = 0u; j < (uint)QA_BLOCK; ++j) v[j] = qa_load(x, b * (uint)QA_BLOCK + j);
    qa_plain_block(QA_FMT, QA_BLOCK, v, out + b * (uint)QA_TYPE_SIZE, tab);
#endif
