// K/V append for one decode (or prefill) step, in place (tqbridge kernel dialect; the row's work is
// kva_row of kv_append_row.h, with the block helpers of quantize_append.h): the step's K rows and V rows are rotated (llama.cpp's
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
// the rows arrive typed as the caller's arrays (float, half or bfloat16): viewed as float32 or as bits
#define KVA_ROWS(p) ((TQ_CONST_DEVICE KVA_ROW_T*)(p))
const uint g = tq_gx;
TQ_SHARED_ARRAY(float, xs, KV_MAX_DP);
#if KV_CAL
const uint bad = kva_row(g, tq_lane, params[0], params[1], params[2], params[3], params[4], KVA_ROWS(k), KVA_ROWS(v), kc_w,
                         vc_w, ktab, vtab, kcal, xs);
#else
const uint bad = kva_row(g, tq_lane, params[0], params[1], params[2], params[3], params[4], KVA_ROWS(k), KVA_ROWS(v), kc_w,
                         vc_w, ktab, vtab, ktab, xs);
#endif
if (tq_lane == 0u) flag[g] = flag_in[g % params[5]] | bad;
if (g == 0u && tq_lane == 0u) for (uint i = 2u * params[0]; i < (uint)KV_FLAG_MIN; ++i) flag[i] = 0u;
