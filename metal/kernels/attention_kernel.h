// Fused decode attention: device helpers (tqbridge kernel dialect; see docs/kernels.md).
//
// Inline dequantization of 4 consecutive values of one cache row, for every block format the
// attention kernel reads. `e` is a multiple of 4, so the 4 values never straddle a block. Turbo
// values stay in the rotated basis (the kernel rotates q and the output instead). `tab` holds the
// 16-entry value table of iq4_nl or the centroids of a turbo format (index 0 most negative).
// Format ids (TQA_*) are the constants the builder passes as template values; every argument
// but `row` and `e` is a compile-time constant at the call sites, so the switch folds away.

#define TQA_F32 0
#define TQA_F16 1
#define TQA_BF16 2
#define TQA_Q8_0 3
#define TQA_Q4_0 4
#define TQA_Q4_1 5
#define TQA_Q5_0 6
#define TQA_Q5_1 7
#define TQA_IQ4_NL 8
#define TQA_TURBO2 9
#define TQA_TURBO3 10
#define TQA_TURBO4 11

#define TQA_NEG_BIG (-3.0e38f)

// The launch parameters every pass-1 body reads (one threadgroup per batch row x KV head x split):
// ip = {l_max, split_len, splits, window, KV heads, the format constants ip[5..18] (TQA_DYN builds),
// the length of each batch row from ip[19], then the first visible key of each batch row (its left
// padding: row_lo, at ip[19 + B] with B = threadgroups / (splits x KV heads))}, fp = {scale, softcap}.
// G (query heads per KV head) is the body's.
#define TQA_SPLIT_PARAMS \
    const int l_max = ip[0], split_len = ip[1], n_splits = ip[2], window = ip[3], hkv = ip[4]; \
    const float scale = fp[0], softcap = fp[1]; \
    const int split = (int)(tq_gx % (uint)n_splits); \
    const int bh = (int)(tq_gx / (uint)n_splits); \
    const int h = bh % hkv; \
    const int b = bh / hkv; \
    const int hq_all = hkv * G; \
    const int len = ip[19 + b]; \
    const int row_lo = ip[19 + (int)(tq_ngx / (uint)n_splits) / hkv + b];

// The tabs buffer: K and V value tables (16 each), then the rotation sign tables s1, s2 of K and of V
// (TQA_RMAX each: turbo's signs, or ones for llama.cpp's plain Hadamard rotation of legacy types),
// then the K and V rotation scales.
#define TQA_RMAX 256
#define TQA_TAB_KS1 32
#define TQA_TAB_KS2 (32 + TQA_RMAX)
#define TQA_TAB_VS1 (32 + 2 * TQA_RMAX)
#define TQA_TAB_VS2 (32 + 3 * TQA_RMAX)
#define TQA_TAB_KSCALE (32 + 4 * TQA_RMAX)
#define TQA_TAB_VSCALE (33 + 4 * TQA_RMAX)

// q and the output travel in q's element type: float32, or fp16 / bf16 bits (TQA_QTYPE 0 / 1 / 2)
// (the buffers arrive typed as the caller's arrays: TQA_Q / TQA_OUT view them as TQA_QT elements)
#if TQA_QTYPE == 1
#define TQA_QT ushort
#define TQA_QLOAD(x) tq_half_to_float(x)
#define TQA_QSTORE(x) tq_f32_to_f16_bits(x)
#elif TQA_QTYPE == 2
#define TQA_QT ushort
#define TQA_QLOAD(x) tq_bf16_bits_to_f32(x)
#define TQA_QSTORE(x) tq_f32_to_bf16_bits(x)
#else
#define TQA_QT float
#define TQA_QLOAD(x) (x)
#define TQA_QSTORE(x) (x)
#endif
#define TQA_Q(p) ((TQ_CONST_DEVICE TQA_QT*)(p))
#define TQA_OUT(p) ((TQ_DEVICE TQA_QT*)(p))
// Pass 1's load of q's element x (head hq, channel d of the head dim). With TQA_QSC 1 (key-calibrated
// caches, whose keys are stored as (k - mu) / s) the input qsc (float32, Hq x TQA_D) holds the keys'
// channel scales and the element loads as q * s: the product in float32, rounded to q's element type
// and back, the bits of q * s made in float32 and cast to q's dtype before the kernel.
#if defined(TQA_QSC) && TQA_QSC
#define TQA_QIN(x, hq, d) TQA_QLOAD(TQA_QSTORE(tq_mul(TQA_QLOAD(x), qsc[(hq) * TQA_D + (d)])))
#else
#define TQA_QIN(x, hq, d) TQA_QLOAD(x)
#endif

struct tqa_f4 { float v[4]; };
// 4 floats on a 16-byte boundary: one wide load from threadgroup memory on the GPUs (the
// emulator's coroutine stacks and arena do not promise 16-byte alignment to the host compiler)
#ifdef TQ_EMULATOR
struct tqa_f4a { float v[4]; };
#else
struct alignas(16) tqa_f4a { float v[4]; };
#endif

// tanh from exp (the dialect has exp): exact limits +-1, absolute error a few ulp of 1.
TQ_FUNC float tqa_tanh(float x) { return 1.0f - 2.0f / (tq_exp(2.0f * x) + 1.0f); }

// Rows are decoded from a tile staged in threadgroup memory (tqa_stage). Every block size and
// field offset the kernel reads is even, and staged rows start at even offsets, so 16-bit fields
// are read with one aligned 16-bit load (little-endian on every backend).
TQ_FUNC uint tqa_u16(TQ_SHARED const uchar* p, int off) {
    return (uint)((TQ_SHARED const ushort*)(p + off))[0];
}

TQ_FUNC uint tqa_u32(TQ_SHARED const uchar* p, int off) { return tqa_u16(p, off) | (tqa_u16(p, off + 2) << 16); }

// Kernel int8-mma: the 16-bit field at byte `off` of two staged rows (keys ka, kb of a tile at `tile`, rows of
// `rb` bytes) as one pair, low half key ka; 0 for a key without weight (ok_a / ok_b false) — the binary16
// scales or norms that multiply the two keys' values of a fragment register.
TQ_FUNC uint tqa_key_pair_u16(TQ_SHARED const uchar* tile, const int rb, const int ka, const int kb, const bool ok_a,
                              const bool ok_b, const int off) {
    return (ok_a ? tqa_u16(tile + ka * rb + off, 0) : 0u) | ((ok_b ? tqa_u16(tile + kb * rb + off, 0) : 0u) << 16);
}

// fp16 fields: the backend's exact binary16 -> float32 conversion (tq_half_to_float).
TQ_FUNC float tqa_half(TQ_SHARED const uchar* p, int off) { return tq_half_to_float(tqa_u16(p, off)); }

// 4 consecutive values starting at index j (a multiple of 4) of the block at `p`, for the block
// formats (not f32 / f16 / bf16). d (and m for q4_1 / q5_1) are the block's decoded fp16 fields,
// read once per block by the caller. qso / sgo: offsets of the turbo index fields.
TQ_FUNC tqa_f4 tqa_dq4_blk(const int fmt, const int qso, const int sgo, TQ_SHARED const uchar* p, const int j,
                           const float d, const float m, TQ_SHARED const float* tab) {
    tqa_f4 r;
    if (fmt == TQA_Q8_0) {                 // fp16 d, int8 qs[32]: x = d * q
        const uint w = tqa_u32(p, 2 + j);  // j % 4 == 0: 4 int8 in two aligned 16-bit loads
        for (int i = 0; i < 4; ++i) r.v[i] = d * (float)((int)(((w >> (8 * i)) & 0xffu) ^ 0x80u) - 0x80);
    } else if (fmt == TQA_Q4_0 || fmt == TQA_IQ4_NL) {  // fp16 d, qs[16]: low nibbles 0..15, high 16..31
        for (int i = 0; i < 4; ++i) {
            const int k = j + i;
            const uint nib = k < 16 ? (p[2 + k] & 15u) : (p[2 + k - 16] >> 4);
            r.v[i] = fmt == TQA_Q4_0 ? d * (float)((int)nib - 8) : d * tab[nib];
        }
    } else if (fmt == TQA_Q4_1) {          // fp16 d, fp16 m, qs[16]: x = d * q + m
        for (int i = 0; i < 4; ++i) {
            const int k = j + i;
            const uint nib = k < 16 ? (p[4 + k] & 15u) : (p[4 + k - 16] >> 4);
            r.v[i] = d * (float)nib + m;
        }
    } else if (fmt == TQA_Q5_0 || fmt == TQA_Q5_1) {  // fp16 d, [fp16 m], u32 qh, qs[16]
        const int o = fmt == TQA_Q5_0 ? 2 : 4;
        const uint qh = tqa_u32(p, o);
        for (int i = 0; i < 4; ++i) {
            const int k = j + i;
            const uint nib = k < 16 ? (p[o + 4 + k] & 15u) : (p[o + 4 + k - 16] >> 4);
            const uint q = nib | (((qh >> k) & 1u) << 4);
            r.v[i] = fmt == TQA_Q5_0 ? d * (float)((int)q - 16) : d * (float)q + m;
        }
    } else if (fmt == TQA_TURBO2 || fmt == TQA_TURBO3) {  // fp16 norm, 2-bit qs, [1-bit signs]
        const uint lo = p[qso + j / 4];   // j % 4 == 0: one byte holds the 4 low fields
        const uint hi = fmt == TQA_TURBO3 ? (uint)(p[sgo + j / 8] >> (j & 7)) : 0u;
        for (int i = 0; i < 4; ++i) {
            const uint idx = ((lo >> (2 * i)) & 3u) | (((hi >> i) & 1u) << 2);
            r.v[i] = tab[idx] * d;
        }
    } else {                               // turbo4: fp16 norm, [fp16 rnorm], 4-bit qs
        const uint w = tqa_u16(p, qso + j / 2);
        for (int i = 0; i < 4; ++i) r.v[i] = tab[(w >> (4 * i)) & 15u] * d;
    }
    return r;
}

// The block formats with a second fp16 field (the offset m).
TQ_FUNC bool tqa_has_m(const int fmt) { return fmt == TQA_Q4_1 || fmt == TQA_Q5_1; }

// 4 consecutive values of a row starting at index e (a multiple of 4), any format.
// bb: bytes per block, group: values per block, qso / sgo: offsets of the turbo index fields.
TQ_FUNC tqa_f4 tqa_dq4(const int fmt, const int bb, const int group, const int qso, const int sgo,
                       TQ_SHARED const uchar* row, int e, TQ_SHARED const float* tab) {
    tqa_f4 r;
    if (fmt == TQA_F32) {
        for (int i = 0; i < 4; ++i) r.v[i] = tq_as_float(tqa_u32(row, 4 * (e + i)));
    } else if (fmt == TQA_F16) {
        for (int i = 0; i < 4; ++i) r.v[i] = tqa_half(row, 2 * (e + i));
    } else if (fmt == TQA_BF16) {
        for (int i = 0; i < 4; ++i) r.v[i] = tq_bf16_bits_to_f32((ushort)tqa_u16(row, 2 * (e + i)));
    } else {
        const int blk = e / group;
        TQ_SHARED const uchar* p = row + blk * bb;
        const float d = tqa_half(p, 0);
        const float m = tqa_has_m(fmt) ? tqa_half(p, 2) : 0.0f;
        r = tqa_dq4_blk(fmt, qso, sgo, p, e - blk * group, d, m, tab);
    }
    return r;
}

// Copy nbytes (even) of device memory starting at byte `off` (even) of `src` into threadgroup
// words `dst`, all threads together: 32-bit loads when `off` is 4-aligned (8 in flight per thread),
// else 16-bit loads. Never reads past src[off + nbytes - 1].
TQ_FUNC void tqa_stage(TQ_SHARED uint* dst, TQ_CONST_DEVICE uchar* src, size_t off, int nbytes, uint tid, uint nt) {
    if ((off & 3u) == 0u) {
        TQ_CONST_DEVICE uint* s32 = (TQ_CONST_DEVICE uint*)(src + off);
        const int nw = nbytes >> 2;
        for (int i = (int)tid; i < nw; i += 8 * (int)nt) {
            uint w[8];
            for (int k = 0; k < 8; ++k) { const int j = i + k * (int)nt; w[k] = j < nw ? s32[j] : 0u; }
            for (int k = 0; k < 8; ++k) { const int j = i + k * (int)nt; if (j < nw) dst[j] = w[k]; }
        }
        if ((nbytes & 2) && tid == 0u) {  // the last 16 bits of an odd number of halfwords
            const int last = (nbytes >> 1) - 1;
            ((TQ_SHARED ushort*)dst)[last] = ((TQ_CONST_DEVICE ushort*)(src + off))[last];
        }
    } else {
        TQ_CONST_DEVICE ushort* s16 = (TQ_CONST_DEVICE ushort*)(src + off);
        TQ_SHARED ushort* d16 = (TQ_SHARED ushort*)dst;
        const int nh = nbytes >> 1;
        for (int i = (int)tid; i < nh; i += 8 * (int)nt) {
            uint w[8];
            for (int k = 0; k < 8; ++k) { const int j = i + k * (int)nt; w[k] = j < nh ? (uint)s16[j] : 0u; }
            for (int k = 0; k < 8; ++k) { const int j = i + k * (int)nt; if (j < nh) d16[j] = (ushort)w[k]; }
        }
    }
}

// In-place rotation of n values in threadgroup memory, per group of `group` values (turbo's
// randomised Hadamard transform): x *= first; butterfly; x *= scale * last. Forward: first = s1,
// last = s2; inverse: first = s2, last = s1. Every thread of the threadgroup must call it.
TQ_FUNC void tqa_rotate(TQ_SHARED float* x, const int n, const int group, TQ_CONST_DEVICE float* first,
                        TQ_CONST_DEVICE float* last, const float scale, uint tid, uint nthreads) {
    for (uint i = tid; i < (uint)n; i += nthreads) x[i] = x[i] * first[i % (uint)group];
    tq_barrier();
    for (int h = 1; h < group; h <<= 1) {
        for (uint k = tid; k < (uint)(n / 2); k += nthreads) {
            const uint a = (k / (uint)h) * (uint)(2 * h) + k % (uint)h;
            const float u = x[a], v = x[a + (uint)h];
            x[a] = u + v;
            x[a + (uint)h] = u - v;
        }
        tq_barrier();
    }
    for (uint i = tid; i < (uint)n; i += nthreads) x[i] = x[i] * (scale * last[i % (uint)group]);
    tq_barrier();
}

// tqa_rotate by one SIMD group, for rows of n = 32 * VPL values (VPL a power of 2 up to 8; every
// lane of the group calls it, the rest of the threadgroup need not): lane l holds values l * VPL ..
// l * VPL + VPL - 1 in registers; pairs closer than VPL are in one lane, the others one shuffle
// apart. Each value goes through the same operations in the same order as in tqa_rotate, rounded
// alike (tq_mul: no contraction into an FMA), so the results are bit-identical; no barrier inside.
template <int VPL>
TQ_FUNC void tqa_rotate_simd(TQ_SHARED float* x, const int group, TQ_CONST_DEVICE float* first,
                             TQ_CONST_DEVICE float* last, const float scale, const uint lane) {
    float v[VPL];
    TQ_UNROLL
    for (int j = 0; j < VPL; ++j) {
        const uint i = lane * (uint)VPL + (uint)j;
        v[j] = tq_mul(x[i], first[i % (uint)group]);
    }
    for (int h = 1; h < group; h <<= 1) {
        if (h < VPL) {
            TQ_UNROLL
            for (int j = 0; j < VPL; ++j) {
                if ((j & h) == 0) {
                    const float u = v[j], w = v[j + h];
                    v[j] = tq_add(u, w);
                    v[j + h] = tq_sub(u, w);
                }
            }
        } else {
            const uint m = (uint)(h / VPL);
            const bool upper = (lane & m) != 0u;
            TQ_UNROLL
            for (int j = 0; j < VPL; ++j) {
                const float o = tq_simd_shuffle_xor(v[j], m);
                v[j] = upper ? tq_sub(o, v[j]) : tq_add(v[j], o);
            }
        }
    }
    TQ_UNROLL
    for (int j = 0; j < VPL; ++j) {
        const uint i = lane * (uint)VPL + (uint)j;
        x[i] = tq_mul(v[j], tq_mul(scale, last[i % (uint)group]));
    }
}

// ----- kernel int8-mma (attention_kernel_split_int8_mma.cpp) -----

// P is scaled by 2^15 before it is rounded to binary16 (weights in [0, 1] stay normal numbers down
// to 2^-29); the output is scaled back exactly.
#define TQA_P_SCALE 32768.0f
#define TQA_P_UNSCALE (1.0f / 32768.0f)

// C's roundf (half away from zero), exact: x - trunc(x) is exact in float32.
TQ_FUNC float tqa_round_away(const float x) {
    const float t = tq_trunc(x);
    const float r = x - t;
    return r >= 0.5f ? t + 1.0f : (r <= -0.5f ? t - 1.0f : t);
}

// The int8 codes of a 32-value K block at `p` that fragment lane t holds: values 4t..4t+3 (*lo) and
// 4t+16..4t+19 (*hi), low byte first. q8_0: its int8 codes; q4_0 / q5_0: code - 8 / - 16; q4_1 / q5_1:
// the unsigned code (the block's m is added by the caller); iq4_nl: its int8 table value.
TQ_FUNC void tqa_codes8(const int fmt, TQ_SHARED const uchar* p, const int t, TQ_SHARED const float* tab,
                        TQ_THREAD uint* lo, TQ_THREAD uint* hi, const bool qs4 = false) {
    if (fmt == TQA_Q8_0) {   // qs4: p + 2 is 4-byte aligned (one 32-bit load per word)
        *lo = qs4 ? ((TQ_SHARED const uint*)(p + 2 + 4 * t))[0] : tqa_u32(p, 2 + 4 * t);
        *hi = qs4 ? ((TQ_SHARED const uint*)(p + 18 + 4 * t))[0] : tqa_u32(p, 18 + 4 * t);
    } else if (fmt == TQA_Q4_0 || fmt == TQA_Q4_1 || fmt == TQA_IQ4_NL) {
        const uint w = tqa_u32(p, (fmt == TQA_Q4_1 ? 4 : 2) + 4 * t);   // qs[4t..4t+3]: low nibbles 4t.., high 4t+16..
        uint l = w & 0x0f0f0f0fu, h = (w >> 4) & 0x0f0f0f0fu;
        if (fmt == TQA_Q4_0) {        // nibble - 8 as int8, per byte without carries
            l = (l + 0x78787878u) ^ 0x80808080u;
            h = (h + 0x78787878u) ^ 0x80808080u;
        } else if (fmt == TQA_IQ4_NL) {
            uint l2 = 0u, h2 = 0u;
            for (int u = 0; u < 4; ++u) {
                l2 |= ((uint)(int)tab[(l >> (8 * u)) & 15u] & 0xffu) << (8 * u);
                h2 |= ((uint)(int)tab[(h >> (8 * u)) & 15u] & 0xffu) << (8 * u);
            }
            l = l2;
            h = h2;
        }
        *lo = l;
        *hi = h;
    } else {                          // q5_0 / q5_1: fp16 d, [fp16 m], u32 qh, qs[16]
        const int o = fmt == TQA_Q5_0 ? 2 : 4;
        const uint qh = tqa_u32(p, o);
        const uint w = tqa_u32(p, o + 4 + 4 * t);
        uint l = w & 0x0f0f0f0fu, h = (w >> 4) & 0x0f0f0f0fu;
        for (int u = 0; u < 4; ++u) {
            l |= ((qh >> (4 * t + u)) & 1u) << (8 * u + 4);
            h |= ((qh >> (4 * t + 16 + u)) & 1u) << (8 * u + 4);
        }
        if (fmt == TQA_Q5_0) {        // code - 16 as int8
            l = (l + 0x70707070u) ^ 0x80808080u;
            h = (h + 0x70707070u) ^ 0x80808080u;
        }
        *lo = l;
        *hi = h;
    }
}

// q8_0 rows of 4-byte aligned length (an even number of blocks, e.g. DK 128: 136 bytes): two 34-byte
// blocks fill 17 aligned words W[0..16], so every code word is one 32-bit load. Word W[i] = bytes 4i..4i+3
// of the pair: W[0] = (d of the even block, its codes 0, 1), W[1..7] its codes 2..29, W[8] = (its codes 30,
// 31, d of the odd block), W[9..16] the odd block's codes. The even block's fragment slots are its codes
// rotated by 2 (slot j holds code (j + 2) % 32; lane t: W[1 + t] and W[5 + t], lane 3 with codes 0, 1 from
// W[0] in place of the odd d); q's codes for even blocks are rotated alike (the int32 products' sum does not
// depend on the order of its terms). `pair` is the even block (4-byte aligned), `odd` which block.
TQ_FUNC void tqa_q8_pair(TQ_SHARED const uchar* pair, const int odd, const int t, TQ_THREAD uint* lo,
                         TQ_THREAD uint* hi, TQ_THREAD float* d) {
    TQ_SHARED const uint* w = (TQ_SHARED const uint*)pair;
    const uint w8 = w[8];
    if (odd) {
        *lo = w[9 + t];
        *hi = w[13 + t];
        *d = tq_half_to_float(w8 >> 16);
    } else {
        const uint w0 = w[0];
        const uint h = w[5 + t];   // lane 3: W[8]
        *lo = w[1 + t];
        *hi = t == 3 ? ((h & 0xffffu) | (w0 & 0xffff0000u)) : h;
        *d = tq_half_to_float(w0 & 0xffffu);
    }
}

// Turbo indices of 4 consecutive values j..j+3 (j % 4 == 0) of the block at `p`, as 4-bit fields
// (value u at bits 4u..4u+3): turbo2 2-bit qs, turbo3 2-bit qs + 1-bit signs, turbo4 4-bit qs.
TQ_FUNC uint tqa_turbo_idx4(const int fmt, TQ_SHARED const uchar* p, const int qso, const int sgo, const int j) {
    uint r = 0u;
    if (fmt == TQA_TURBO4) {
        const uint w = tqa_u16(p, qso + j / 2);
        for (int u = 0; u < 4; ++u) r |= ((w >> (4 * u)) & 15u) << (4 * u);
    } else {
        const uint lo = p[qso + j / 4];
        const uint hi = fmt == TQA_TURBO3 ? (uint)(p[sgo + j / 8] >> (j & 7)) : 0u;
        for (int u = 0; u < 4; ++u) r |= (((lo >> (2 * u)) & 3u) | (((hi >> u) & 1u) << 2)) << (4 * u);
    }
    return r;
}

// Kernel int8-mma's turbo2 / turbo3 decode (TQA_V23): field / m-tile j of a run of 8 values holds value
// tqa_v23_col(j) of the run: 0 2 4 6 1 3 5 7 (qs's even 2-bit fields, then its odd ones).
TQ_FUNC int tqa_v23_col(const int j) { return ((j & 3) << 1) | (j >> 2); }
