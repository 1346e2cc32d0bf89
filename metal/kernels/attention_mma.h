// Matrix-fragment primitives of the tqbridge kernel dialect (kernel int8-mma; see docs/kernels.md).
//
// One SIMD group of 32 lanes multiplies small matrices held in registers, each lane holding a fixed
// piece ("fragment"). The fragment layouts are those of the PTX `mma.sync` shapes named below
// (lane = 4 * g + t, g = lane >> 2 the "group", t = lane & 3); every backend uses the same layouts:
//
//   tq_mma_s8 (m16n8k32, int8 in, int32 accumulate): C[16x8] += A[16x32] * B[32x8]
//     a[0]: A[g][4t..4t+3]   a[1]: A[g+8][4t..4t+3]   a[2]: A[g][4t+16..]   a[3]: A[g+8][4t+16..]
//     b[0]: B[4t..4t+3][g]   b[1]: B[4t+16..4t+19][g]          (4 int8 per register, low byte first)
//   tq_mma_f16 (m16n8k16, binary16 in, float32 accumulate): C[16x8] += A[16x16] * B[16x8]
//     a[0]: A[g][2t..2t+1]   a[1]: A[g+8][2t..2t+1]   a[2]: A[g][2t+8..]    a[3]: A[g+8][2t+8..]
//     b[0]: B[2t..2t+1][g]   b[1]: B[2t+8..2t+9][g]            (2 halves per register, low first)
//   C (both): c[0], c[1]: C[g][2t], C[g][2t+1]   c[2], c[3]: C[g+8][2t], C[g+8][2t+1]
//   tq_movmatrix_t: an 8x8 matrix of halves, lane holding M[g][2t..2t+1], becomes its transpose.
//
// CUDA (sm_80+, MLX's NVRTC targets sm_90a) runs them on the tensor cores with inline PTX. Everywhere
// else (the CPU emulator, Metal until it gets simdgroup_matrix versions) they are SIMD shuffles and
// plain arithmetic: the same results for the integer product; for binary16 products (exact in
// float32) the float32 sums may round differently from the tensor cores, which the oracle's bound
// for kernel int8-mma covers. TQ_MMA_GENERIC forces the portable versions on CUDA (to test one against
// the other).

#if defined(TQ_BACKEND_CUDA) && !defined(TQ_MMA_GENERIC)
TQ_FUNC void tq_mma_s8(TQ_THREAD int* c, const uint a0, const uint a1, const uint a2, const uint a3,
                       const uint b0, const uint b1, const uint lane) {
    (void)lane;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
TQ_FUNC void tq_mma_f16(TQ_THREAD float* c, const uint a0, const uint a1, const uint a2, const uint a3,
                        const uint b0, const uint b1, const uint lane) {
    (void)lane;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
TQ_FUNC uint tq_movmatrix_t(const uint x, const uint lane) {
    (void)lane;
    uint y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
#else
// int8 lanes of a 32-bit word, sign-extended
TQ_FUNC int tq_s8_at(const uint w, const int i) { return (int)((((w >> (8 * i)) & 0xffu) ^ 0x80u)) - 0x80; }
TQ_FUNC int tq_dot4_s8(const uint a, const uint b) {
    int s = 0;
    for (int i = 0; i < 4; ++i) s += tq_s8_at(a, i) * tq_s8_at(b, i);
    return s;
}
TQ_FUNC void tq_mma_s8(TQ_THREAD int* c, const uint a0, const uint a1, const uint a2, const uint a3,
                       const uint b0, const uint b1, const uint lane) {
    const uint g = lane >> 2, t = lane & 3u;
    for (uint k = 0; k < 4u; ++k) {   // the 4 lanes holding row g of A / column n of B
        const uint ra0 = tq_simd_shuffle(a0, 4u * g + k), ra2 = tq_simd_shuffle(a2, 4u * g + k);
        const uint ra1 = tq_simd_shuffle(a1, 4u * g + k), ra3 = tq_simd_shuffle(a3, 4u * g + k);
        const uint rb00 = tq_simd_shuffle(b0, 8u * t + k), rb01 = tq_simd_shuffle(b1, 8u * t + k);
        const uint rb10 = tq_simd_shuffle(b0, 8u * t + 4u + k), rb11 = tq_simd_shuffle(b1, 8u * t + 4u + k);
        c[0] += tq_dot4_s8(ra0, rb00) + tq_dot4_s8(ra2, rb01);
        c[1] += tq_dot4_s8(ra0, rb10) + tq_dot4_s8(ra2, rb11);
        c[2] += tq_dot4_s8(ra1, rb00) + tq_dot4_s8(ra3, rb01);
        c[3] += tq_dot4_s8(ra1, rb10) + tq_dot4_s8(ra3, rb11);
    }
}
TQ_FUNC float tq_h2_dot(const uint a, const uint b) {   // exact products, one rounding per add
    return tq_half_to_float(a & 0xffffu) * tq_half_to_float(b & 0xffffu)
         + tq_half_to_float(a >> 16) * tq_half_to_float(b >> 16);
}
TQ_FUNC void tq_mma_f16(TQ_THREAD float* c, const uint a0, const uint a1, const uint a2, const uint a3,
                        const uint b0, const uint b1, const uint lane) {
    const uint g = lane >> 2, t = lane & 3u;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (uint k = 0; k < 4u; ++k) {
        const uint ra0 = tq_simd_shuffle(a0, 4u * g + k), ra2 = tq_simd_shuffle(a2, 4u * g + k);
        const uint ra1 = tq_simd_shuffle(a1, 4u * g + k), ra3 = tq_simd_shuffle(a3, 4u * g + k);
        const uint rb00 = tq_simd_shuffle(b0, 8u * t + k), rb01 = tq_simd_shuffle(b1, 8u * t + k);
        const uint rb10 = tq_simd_shuffle(b0, 8u * t + 4u + k), rb11 = tq_simd_shuffle(b1, 8u * t + 4u + k);
        s0 += tq_h2_dot(ra0, rb00) + tq_h2_dot(ra2, rb01);
        s1 += tq_h2_dot(ra0, rb10) + tq_h2_dot(ra2, rb11);
        s2 += tq_h2_dot(ra1, rb00) + tq_h2_dot(ra3, rb01);
        s3 += tq_h2_dot(ra1, rb10) + tq_h2_dot(ra3, rb11);
    }
    c[0] += s0; c[1] += s1; c[2] += s2; c[3] += s3;
}
TQ_FUNC uint tq_movmatrix_t(const uint x, const uint lane) {
    // lane 4g + t receives M[2t][g] and M[2t+1][g]; M[r][c] is half (c & 1) of lane 4r + c / 2
    const uint g = lane >> 2, t = lane & 3u;
    const uint lo = tq_simd_shuffle(x, 8u * t + (g >> 1));
    const uint hi = tq_simd_shuffle(x, 8u * t + 4u + (g >> 1));
    const uint sh = 16u * (g & 1u);
    return ((lo >> sh) & 0xffffu) | (((hi >> sh) & 0xffffu) << 16);
}
#endif

// Asynchronous copies of global memory into threadgroup memory (cp.async on CUDA; plain copies
// elsewhere, where the waits are no-ops): tq_cp_async4 / 16 copy 4 / 16 bytes (both pointers aligned to
// that size), tq_cp_commit closes a group of copies, tq_cp_wait_n(n) waits until at most n groups are
// pending, tq_cp_wait0 for all. A thread's waits cover its own copies: a barrier must follow before others read.
#if defined(TQ_BACKEND_CUDA)
TQ_FUNC void tq_cp_async4(TQ_SHARED void* dst, TQ_CONST_DEVICE void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
TQ_FUNC void tq_cp_async16(TQ_SHARED void* dst, TQ_CONST_DEVICE void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
TQ_FUNC void tq_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
TQ_FUNC void tq_cp_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
TQ_FUNC void tq_cp_wait_n(const int n) {   // wait until at most n groups are pending (n: 0..3)
    if (n <= 0) asm volatile("cp.async.wait_group 0;" ::: "memory");
    else if (n == 1) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else if (n == 2) asm volatile("cp.async.wait_group 2;" ::: "memory");
    else asm volatile("cp.async.wait_group 3;" ::: "memory");
}
TQ_FUNC bool tq_aligned16(TQ_CONST_DEVICE void* p) { return (((size_t)p) & 15u) == 0u; }
TQ_FUNC bool tq_aligned16_shared(TQ_SHARED const void* p) { return ((unsigned)__cvta_generic_to_shared(p) & 15u) == 0u; }
#else
TQ_FUNC void tq_cp_async4(TQ_SHARED void* dst, TQ_CONST_DEVICE void* src) {
    *(TQ_SHARED uint*)dst = *(TQ_CONST_DEVICE uint*)src;
}
TQ_FUNC void tq_cp_async16(TQ_SHARED void* dst, TQ_CONST_DEVICE void* src) {
    for (int i = 0; i < 4; ++i) ((TQ_SHARED uint*)dst)[i] = ((TQ_CONST_DEVICE uint*)src)[i];
}
TQ_FUNC void tq_cp_commit() {}
TQ_FUNC void tq_cp_wait0() {}
TQ_FUNC void tq_cp_wait_n(const int n) { (void)n; }
#if defined(TQ_EMULATOR)
// the emulator takes the 16-byte paths where CUDA would, so CI runs the code CUDA runs
TQ_FUNC bool tq_aligned16(TQ_CONST_DEVICE void* p) { return (((size_t)p) & 15u) == 0u; }
TQ_FUNC bool tq_aligned16_shared(TQ_SHARED const void* p) { return (((size_t)p) & 15u) == 0u; }
#else
TQ_FUNC bool tq_aligned16(TQ_CONST_DEVICE void* p) { (void)p; return false; }
TQ_FUNC bool tq_aligned16_shared(TQ_SHARED const void* p) { (void)p; return false; }
#endif
#endif

// Stage one whole tile of NBYTES (a multiple of 16) from 16-aligned device memory into 16-aligned
// threadgroup words, all NT threads together, asynchronously: NBYTES / 16 copies of 16 bytes, thread
// tid taking copies tid, tid + NT, ..; the trip count is static, so the loop unrolls into straight
// copies at constant offsets (only the last round's are predicated). The generic tqa_stage_async
// below pays a loop with run-time bounds and alignment branches per call (kernel int8-mma's pass 1 on the
// H200: 129 of its 647 instructions per 16 keys, benchmarks/records/h200/2026-12-02-ncu-pass1.json).
template <int NBYTES, int NT>
TQ_FUNC void tqa_stage_full16(TQ_SHARED uint* dst, TQ_CONST_DEVICE uchar* s, uint tid) {
    static_assert(NBYTES % 16 == 0, "whole 16-byte copies");
    constexpr int N16 = NBYTES / 16;
    // this thread's first copy, then the others at constant offsets (immediates in the copy instructions)
    TQ_SHARED uint* d = dst + 4u * tid;
    TQ_CONST_DEVICE uchar* p = s + 16u * tid;
    TQ_UNROLL
    for (int j = 0; j < (N16 + NT - 1) / NT; ++j)
        if ((j + 1) * NT <= N16 || (int)tid + j * NT < N16) tq_cp_async16(d + 4 * NT * j, p + 16 * NT * j);
}

// Stage nbytes (even) of device memory from byte `off` (even) of `src` into threadgroup words `dst`,
// all threads together, asynchronously (then tq_cp_commit / wait / barrier): 16-byte copies when
// both ends allow, else 4-byte copies, the last odd halfword by a plain load; 2-byte plain loads
// when `off` is not 4-aligned. Never reads past src[off + nbytes - 1].
TQ_FUNC void tqa_stage_async(TQ_SHARED uint* dst, TQ_CONST_DEVICE uchar* src, size_t off, int nbytes, uint tid, uint nt) {
    if ((off & 3u) == 0u) {
        TQ_CONST_DEVICE uchar* s = src + off;
        const int nw = nbytes >> 2;
        int done = 0;
        if (tq_aligned16(s)) {
            const int n16 = nw >> 2;
            for (int i = (int)tid; i < n16; i += (int)nt) tq_cp_async16(dst + 4 * i, s + 16 * i);
            done = 4 * n16;
        }
        for (int i = done + (int)tid; i < nw; i += (int)nt) tq_cp_async4(dst + i, s + 4 * i);
        if ((nbytes & 2) && tid == 0u) {
            const int last = (nbytes >> 1) - 1;
            ((TQ_SHARED ushort*)dst)[last] = ((TQ_CONST_DEVICE ushort*)s)[last];
        }
    } else {
        TQ_CONST_DEVICE ushort* s16 = (TQ_CONST_DEVICE ushort*)(src + off);
        TQ_SHARED ushort* d16 = (TQ_SHARED ushort*)dst;
        for (int i = (int)tid; i < (nbytes >> 1); i += (int)nt) d16[i] = s16[i];
    }
}

// Stage one tile of n (<= TILE) K rows (KRB bytes each; KTB bytes of staging area) and V rows (VRB, VTB) from
// row ts of the row blocks at koff / voff into dst (K) and dst + KTB / 4 (V): straight 16-byte copies for a
// whole tile of 16-aligned rows where the area allows them (stage16), the generic loop otherwise.
template <int TILE, int KRB, int VRB, int KTB, int VTB, int NT>
TQ_FUNC void tqa_stage_tile(TQ_SHARED uint* dst, TQ_CONST_DEVICE uchar* kb, size_t koff, TQ_CONST_DEVICE uchar* vb,
                            size_t voff, int ts, int n, bool stage16, uint tid) {
    constexpr bool FULL16 = KTB == TILE * KRB && VTB == TILE * VRB && KTB % 16 == 0 && VTB % 16 == 0;
    const size_t ko = koff + (size_t)ts * (size_t)KRB, vo = voff + (size_t)ts * (size_t)VRB;
    if (FULL16 && stage16 && n == TILE && tq_aligned16(kb + ko) && tq_aligned16(vb + vo)) {
        tqa_stage_full16<FULL16 ? KTB : 16, NT>(dst, kb + ko, tid);
        tqa_stage_full16<FULL16 ? VTB : 16, NT>(dst + KTB / 4, vb + vo, tid);
    } else {
        tqa_stage_async(dst, kb, ko, n * KRB, tid, (uint)NT);
        tqa_stage_async(dst + KTB / 4, vb, vo, n * VRB, tid, (uint)NT);
    }
}

// The ring's head: the first NS - 1 tiles from key `first` (below `end`) into buffers 0 .. NS - 2 of `stage`
// (HALF words each), one commit group per buffer, so the key loop's waits count groups alike either way.
template <int TILE, int KRB, int VRB, int KTB, int VTB, int NT, int NS>
TQ_FUNC void tqa_stage_ring_head(TQ_SHARED uint* stage, TQ_CONST_DEVICE uchar* kb, size_t koff, TQ_CONST_DEVICE uchar* vb,
                                 size_t voff, int first, int end, bool stage16, uint tid) {
    for (int s0 = 0; s0 < NS - 1; ++s0) {
        const int ts = first + s0 * TILE;
        if (ts < end)
            tqa_stage_tile<TILE, KRB, VRB, KTB, VTB, NT>(stage + s0 * ((KTB + VTB) / 4), kb, koff, vb, voff, ts,
                                                         end - ts < TILE ? end - ts : TILE, stage16, tid);
        tq_cp_commit();
    }
}

// 2^x with results below 2^-126 flushed to zero. On CUDA one MUFU.EX2 (`ex2.approx.ftz`: the same
// instruction and bits exp2f computes for results >= 2^-126; exp2f spends 4 more instructions on
// denormal results); elsewhere the backend's exp2, flushed. Kernel int8-mma's softmax weights below 2^-126
// vanish anyway (times 2^15 they are below binary16's smallest subnormal).
#if defined(TQ_BACKEND_CUDA)
TQ_FUNC float tq_exp2_ftz(const float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
TQ_FUNC float tq_exp2_ftz(const float x) {
    const float y = tq_exp2(x);
    return y < 1.1754943508222875e-38f ? 0.0f : y;
}
#endif

// float32 -> binary16 bits, round to nearest even (the hardware conversion on the GPUs)
#if defined(TQ_BACKEND_CUDA)
TQ_FUNC uint tq_f2h(const float x) { return (uint)__half_as_ushort(__float2half_rn(x)); }
#elif defined(TQ_BACKEND_METAL)
TQ_FUNC uint tq_f2h(const float x) { return (uint)as_type<ushort>(half(x)); }
#else
TQ_FUNC uint tq_f2h(const float x) { return (uint)tq_f32_to_f16_bits(x); }
#endif
TQ_FUNC uint tq_pack_h2(const float lo, const float hi) { return tq_f2h(lo) | (tq_f2h(hi) << 16); }

// Byte permute (PTX prmt in its default mode): byte n of the result is byte ((s >> 4n) & 7) of the
// 8 bytes {b:a} (a's bytes 0..3, b's 4..7), or, where bit 3 of that nibble is set, that byte's top
// bit copied into all 8 bits (prmt's sign replication, kept here so the emulator shows a selector
// that sets it by mistake); bits 16..31 of s are ignored. Kernel int8-mma uses it as a table lookup of
// four 3-bit indices at once (its nibbles stay 0..7).
#if defined(TQ_BACKEND_CUDA)
TQ_FUNC uint tq_byte_perm(const uint a, const uint b, const uint s) {   // prmt itself: no mask of s
    uint r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}
#else
TQ_FUNC uint tq_byte_perm(const uint a, const uint b, const uint s) {
    uint r = 0u;
    for (int n = 0; n < 4; ++n) {
        const uint i = (s >> (4 * n)) & 7u;
        uint v = ((i < 4u ? a : b) >> (8u * (i & 3u))) & 0xffu;
        if ((s >> (4 * n + 3)) & 1u) v = (v & 0x80u) ? 0xffu : 0u;
        r |= v << (8 * n);
    }
    return r;
}
#endif

// two binary16 sums at once, each correctly rounded (kernel int8-mma uses it where the sums are exact)
#if defined(TQ_BACKEND_CUDA)
TQ_FUNC uint tq_hadd2(const uint a, const uint b) {
    uint r;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#elif defined(TQ_BACKEND_METAL)
TQ_FUNC uint tq_hadd2(const uint a, const uint b) { return as_type<uint>(as_type<half2>(a) + as_type<half2>(b)); }
#else
TQ_FUNC uint tq_hadd2(const uint a, const uint b) {
    return tq_pack_h2(tq_half_to_float(a & 0xffffu) + tq_half_to_float(b & 0xffffu),
                      tq_half_to_float(a >> 16) + tq_half_to_float(b >> 16));
}
#endif

// two binary16 products at once, each correctly rounded (an f16 x f16 product is exact in float32,
// so one rounding of it to binary16 is the hardware's result)
#if defined(TQ_BACKEND_CUDA)
TQ_FUNC uint tq_hmul2(const uint a, const uint b) {
    uint r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#elif defined(TQ_BACKEND_METAL)
TQ_FUNC uint tq_hmul2(const uint a, const uint b) { return as_type<uint>(as_type<half2>(a) * as_type<half2>(b)); }
#else
TQ_FUNC uint tq_hmul2(const uint a, const uint b) {
    return tq_pack_h2(tq_half_to_float(a & 0xffffu) * tq_half_to_float(b & 0xffffu),
                      tq_half_to_float(a >> 16) * tq_half_to_float(b >> 16));
}
#endif
