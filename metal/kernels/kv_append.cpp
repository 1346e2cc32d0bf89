// K/V append for one decode (or prefill) step, in place (tqbridge kernel dialect; the block
// helpers are those of quantize_append.h): the step's K rows and V rows are rotated (llama.cpp's
// Hadamard, for the legacy ggml types), quantized and written straight into the cache buffers
// kc / vc at rows pos .. pos + S - 1 — one dispatch for both sides, no copy of the cache.
//
// One threadgroup of 32 threads per (side, row): threadgroup g < R quantizes K row g, the others V
// row g - R (rows in the input's (B, H, S) order). Per row: load the row (zero-padded to the stored
// width), note whether any value is NaN/inf, rotate (butterfly over groups of KA_ROT / VA_ROT
// values, then * 1/sqrt(group); Sylvester order, fp32), then quantize: turbo blocks one per
// simdgroup pass, the other formats one block per lane.
//
// Compile-time per side (prefix KA_ / VA_): FMT (QA_* code), BLOCK, TS (bytes per block), DIN (values
// per input row), DP (values per stored row), ROT (rotation group, 0: none), BITS, QS, SG, RN, VPL
// (turbo fields), and QA_SRC (the rows' element type, both sides). Buffers: k, v (rows), kc, vc
// (cache buffers, written in place), ktab, vtab (quantize_append's tables), params (uint32: R rows
// per side, S rows per head, cap (cache rows per head), pos, H, n_in), flag_in (uint32, n_in slots).
// Out: flag (max(2R, KV_FLAG_MIN) uint32): flag_in[g % n_in] | (1 if row g held a NaN/inf), the slots
// past 2R zero — a sticky device-side flag the cache reads once, later, instead of synchronising on
// every append.
// KV_CAL (key calibration, TQCache's "mean"/"scale" in the model's basis): one more buffer, kcal (float32,
// 2 * H * KA_DIN: the per-head channel means mu, then the channel scales s), and each K value is stored as
// (x - mu) / s before the rotation (the padding past KA_DIN stays zero).
// the rows arrive typed as the caller's arrays (float, half or bfloat16): read them as float32 or as bits
#if QA_SRC == 0
#define KV_ROWS(p) ((TQ_CONST_DEVICE float*)(p))
#else
#define KV_ROWS(p) ((TQ_CONST_DEVICE ushort*)(p))
#endif
const uint g = tq_gx;
const uint lane = tq_lane;
const uint R = params[0], S = params[1], cap = params[2], pos = params[3], H = params[4];
const bool is_k = g < R;
const uint r = is_k ? g : g - R;
const uint bh = r / S, s = r % S;
const uint b = bh / H, h = bh % H;
(void)b; (void)h;
const int din = is_k ? KA_DIN : VA_DIN;
const int dp = is_k ? KA_DP : VA_DP;
const int rot = is_k ? KA_ROT : VA_ROT;
TQ_SHARED_ARRAY(float, xs, KV_MAX_DP);
uint bad = 0u;
for (int i = (int)lane; i < dp; i += 32) {
    const float x = i < din ? (is_k ? qa_load(KV_ROWS(k), r * (uint)KA_DIN + (uint)i) : qa_load(KV_ROWS(v), r * (uint)VA_DIN + (uint)i))
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
tq_barrier();
if (rot > 0) {
    for (int hh = 1; hh < rot; hh <<= 1) {
        for (int kk = (int)lane; kk < dp / 2; kk += 32) {
            const int a = (kk / hh) * (2 * hh) + kk % hh;
            const float u = xs[a], w = xs[a + hh];
            xs[a] = tq_add(u, w);
            xs[a + hh] = tq_sub(u, w);
        }
        tq_barrier();
    }
    const float rs = tq_div(1.0f, tq_sqrt((float)rot));
    for (int i = (int)lane; i < dp; i += 32) xs[i] = tq_mul(xs[i], rs);
    tq_barrier();
}
const size_t row_bytes = is_k ? (size_t)(KA_DP / KA_BLOCK * KA_TS) : (size_t)(VA_DP / VA_BLOCK * VA_TS);
TQ_DEVICE uchar* dst = (is_k ? kc_w : vc_w) + ((size_t)bh * (size_t)cap + (size_t)(pos + s)) * row_bytes;
if (is_k) {
#if KA_FMT == QA_TURBO
    for (int blk = 0; blk < KA_DP / KA_BLOCK; ++blk) {
        float vv[QA_MAX_VPL];
        for (int i = 0; i < KA_VPL; ++i) vv[i] = xs[blk * KA_BLOCK + (int)lane * KA_VPL + i];
        qa_turbo_block(KA_BITS, KA_VPL, KA_QS, KA_SG, KA_RN, vv, dst + blk * KA_TS, ktab, lane);
    }
#else
    for (int blk = (int)lane; blk < KA_DP / KA_BLOCK; blk += 32) {
        float vv[KA_BLOCK];
        for (int j = 0; j < KA_BLOCK; ++j) vv[j] = xs[blk * KA_BLOCK + j];
        qa_plain_block(KA_FMT, KA_BLOCK, vv, dst + blk * KA_TS, ktab);
    }
#endif
} else {
#if VA_FMT == QA_TURBO
    for (int blk = 0; blk < VA_DP / VA_BLOCK; ++blk) {
        float vv[QA_MAX_VPL];
        for (int i = 0; i < VA_VPL; ++i) vv[i] = xs[blk * VA_BLOCK + (int)lane * VA_VPL + i];
        qa_turbo_block(VA_BITS, VA_VPL, VA_QS, VA_SG, VA_RN, vv, dst + blk * VA_TS, vtab, lane);
    }
#else
    for (int blk = (int)lane; blk < VA_DP / VA_BLOCK; blk += 32) {
        float vv[VA_BLOCK];
        for (int j = 0; j < VA_BLOCK; ++j) vv[j] = xs[blk * VA_BLOCK + j];
        qa_plain_block(VA_FMT, VA_BLOCK, vv, dst + blk * VA_TS, vtab);
    }
#endif
}
if (lane == 0u) flag[g] = flag_in[g % params[5]] | bad;
if (g == 0u && lane == 0u) for (uint i = 2u * R; i < (uint)KV_FLAG_MIN; ++i) flag[i] = 0u;
