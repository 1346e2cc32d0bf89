// One row of an in-place K/V append (tqbridge kernel dialect): the work of one SIMD group of 32 lanes in
// kv_append.cpp (one threadgroup per row) and in kernel int8-mma's folded append (the threadgroup whose
// split holds the step's row). Needs quantize_append.h's helpers and the static parameters of
// kv_append.cpp (KA_* / VA_*, QA_SRC, KV_CAL); the includer defines KVA_SYNC(), the synchronisation of
// the lanes between the phases (they share xs): a threadgroup barrier where the threadgroup is the SIMD
// group, a SIMD-group barrier where other SIMD groups work beside it.
//
// Row g of the 2R rows: g < R K row g, else V row g - R (rows in the input's (B, H, S) order). Load the
// row (zero-padded to the stored width DP), note whether a value is NaN/inf, calibrate K (KV_CAL:
// (x - mu) / s), rotate (butterfly over groups of ROT values, then * 1/sqrt(group); Sylvester order,
// fp32), quantize into the cache buffer at row pos + s of head (b, h): turbo blocks one per SIMD-group
// pass, the other formats one block per lane. Returns 1 where the row held a NaN/inf (every lane).

// the rows arrive typed as the caller's arrays (float, half or bfloat16): read them as float32 or as bits
#if QA_SRC == 0
#define KVA_ROW_T float
#else
#define KVA_ROW_T ushort
#endif

// A stored row's blocks from the rotated values xs (dp of them): turbo formats one block per SIMD-group pass
// (vpl values per lane), the others (blocks of at most 32 values) one block per lane.
TQ_FUNC void kva_blocks(const int fmt, const int block, const int ts, const int dp, const int bits, const int vpl,
                        const int qs, const int sg, const int rn, TQ_SHARED const float* xs, TQ_DEVICE uchar* dst,
                        TQ_CONST_DEVICE float* tab, const uint lane) {
    if (fmt == QA_TURBO) {
        for (int blk = 0; blk < dp / block; ++blk) {
            float vv[QA_MAX_VPL];
            for (int i = 0; i < vpl; ++i) vv[i] = xs[blk * block + (int)lane * vpl + i];
            qa_turbo_block(bits, vpl, qs, sg, rn, vv, dst + blk * ts, tab, lane);
        }
    } else {
        for (int blk = (int)lane; blk < dp / block; blk += 32) {
            float vv[32];
            for (int j = 0; j < block; ++j) vv[j] = xs[blk * block + j];
            qa_plain_block(fmt, block, vv, dst + blk * ts, tab);
        }
    }
}

TQ_FUNC uint kva_row(const uint g, const uint lane, const uint R, const uint S, const uint cap, const uint pos,
                     const uint H, TQ_CONST_DEVICE KVA_ROW_T* k, TQ_CONST_DEVICE KVA_ROW_T* v, TQ_DEVICE uchar* kc_w,
                     TQ_DEVICE uchar* vc_w, TQ_CONST_DEVICE float* ktab, TQ_CONST_DEVICE float* vtab,
                     TQ_CONST_DEVICE float* kcal, TQ_SHARED float* xs) {
    const bool is_k = g < R;
    const uint r = is_k ? g : g - R;
    const uint bh = r / S, s = r % S;
    const uint h = bh % H;
    (void)h; (void)kcal;
    const int din = is_k ? KA_DIN : VA_DIN;
    const int dp = is_k ? KA_DP : VA_DP;
    const int rot = is_k ? KA_ROT : VA_ROT;
    uint bad = 0u;
    for (int i = (int)lane; i < dp; i += 32) {
        const float x = i < din ? (is_k ? qa_load(k, r * (uint)KA_DIN + (uint)i) : qa_load(v, r * (uint)VA_DIN + (uint)i))
                                : 0.0f;
        bad |= (tq_isnan(x) || tq_isinf(x)) ? 1u : 0u;
#if KV_CAL
        xs[i] = (is_k && i < din) ? tq_div(tq_sub(x, kcal[h * (uint)KA_DIN + (uint)i]),
                                           kcal[(H + h) * (uint)KA_DIN + (uint)i]) : x;
#else
        xs[i] = x;
#endif
    }
    bad = tq_simd_max(bad);
    KVA_SYNC();
    if (rot > 0) {
        for (int hh = 1; hh < rot; hh <<= 1) {
            for (int kk = (int)lane; kk < dp / 2; kk += 32) {
                const int a = (kk / hh) * (2 * hh) + kk % hh;
                const float u = xs[a], w = xs[a + hh];
                xs[a] = tq_add(u, w);
                xs[a + hh] = tq_sub(u, w);
            }
            KVA_SYNC();
        }
        const float rs = tq_div(1.0f, tq_sqrt((float)rot));
        for (int i = (int)lane; i < dp; i += 32) xs[i] = tq_mul(xs[i], rs);
        KVA_SYNC();
    }
    const size_t row_bytes = is_k ? (size_t)(KA_DP / KA_BLOCK * KA_TS) : (size_t)(VA_DP / VA_BLOCK * VA_TS);
    TQ_DEVICE uchar* dst = (is_k ? kc_w : vc_w) + ((size_t)bh * (size_t)cap + (size_t)(pos + s)) * row_bytes;
    if (is_k) kva_blocks(KA_FMT, KA_BLOCK, KA_TS, KA_DP, KA_BITS, KA_VPL, KA_QS, KA_SG, KA_RN, xs, dst, ktab, lane);
    else kva_blocks(VA_FMT, VA_BLOCK, VA_TS, VA_DP, VA_BITS, VA_VPL, VA_QS, VA_SG, VA_RN, xs, dst, vtab, lane);
    return bad;
}
