// tqbridge kernel dialect: helpers shared by every backend.
//
// Included after the backend prelude (prelude_metal.h / prelude_cuda.h / prelude_cpu.h), which
// defines TQ_FUNC, the integer types uint/ushort/uchar, tq_as_uint / tq_as_float and the rounded
// float ops tq_add / tq_sub / tq_mul / tq_div. Everything here is integer code or those ops, so it
// gives the same bits on every backend.

// float32 -> IEEE binary16 bits, round to nearest even. Overflow gives +-inf; a NaN keeps the top
// ten bits of its payload and stays a NaN (numpy's float32 -> float16 cast does the same).
TQ_FUNC ushort tq_f32_to_f16_bits(float f) {
    uint x = tq_as_uint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (ushort)(sign | 0x7c00u);
        uint r = 0x7c00u + ((ax & 0x007fffffu) >> 13);
        if (r == 0x7c00u) r += 1u;
        return (ushort)(sign | r);
    }
    if (ax >= 0x47800000u) return (ushort)(sign | 0x7c00u);  // >= 65536: inf
    uint e = ax >> 23;
    uint m = ax & 0x007fffffu;
    if (e >= 113u) {  // a normal half
        uint h = ((e - 112u) << 10) | (m >> 13);
        uint rem = m & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1u;  // may carry into inf: correct
        return (ushort)(sign | h);
    }
    if (e < 102u) return (ushort)sign;  // below half of the smallest subnormal (or a float subnormal)
    m |= 0x00800000u;
    uint shift = 126u - e;  // 14..24
    uint h = m >> shift;
    uint rem = m & ((1u << shift) - 1u);
    uint half_ulp = 1u << (shift - 1u);
    if (rem > half_ulp || (rem == half_ulp && (h & 1u))) h += 1u;
    return (ushort)(sign | h);
}

// IEEE binary16 bits -> float32 (exact).
TQ_FUNC float tq_f16_bits_to_f32(ushort hb) {
    uint h = (uint)hb;
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint m = h & 0x3ffu;
    uint x;
    if (e == 0u) {
        if (m == 0u) {
            x = sign;
        } else {  // subnormal: normalise
            uint s = 0u;
            while ((m & 0x400u) == 0u) { m <<= 1; s += 1u; }
            x = sign | ((113u - s) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31u) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return tq_as_float(x);
}

// float32 -> bfloat16 bits, round to nearest even; NaN made quiet (ggml's / gguf-py's rule).
TQ_FUNC ushort tq_f32_to_bf16_bits(float f) {
    uint x = tq_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) x = (x & 0xffff0000u) | 0x00400000u;
    return (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

TQ_FUNC float tq_bf16_bits_to_f32(ushort b) { return tq_as_float(((uint)b) << 16); }

TQ_FUNC bool tq_isnan(float f) { return (tq_as_uint(f) & 0x7fffffffu) > 0x7f800000u; }
TQ_FUNC bool tq_isinf(float f) { return (tq_as_uint(f) & 0x7fffffffu) == 0x7f800000u; }
TQ_FUNC float tq_abs(float f) { return tq_as_float(tq_as_uint(f) & 0x7fffffffu); }

// numpy's float32 -> uint8 / int8 cast on x86-64 (what `.astype(np.uint8)` gives): truncate to a
// 32-bit integer (NaN and |t| >= 2^31 give INT_MIN) and keep the low byte.
TQ_FUNC uchar tq_f32_to_u8_np(float t) {
    if (!(t > -2147483648.0f && t < 2147483648.0f)) return (uchar)0;
    return (uchar)((uint)((int)t) & 0xffu);
}

// Ordered comparisons that are symmetric in their arguments (so a SIMD butterfly gives every lane
// the same bits): NaN loses, and +0 beats -0 in max (-0 beats +0 in min).
TQ_FUNC float tq_max(float a, float b) {
    if (tq_isnan(a)) return b;
    if (tq_isnan(b)) return a;
    if (a == b) return tq_as_float(tq_as_uint(a) & tq_as_uint(b));
    return a > b ? a : b;
}
TQ_FUNC float tq_min(float a, float b) {
    if (tq_isnan(a)) return b;
    if (tq_isnan(b)) return a;
    if (a == b) return tq_as_float(tq_as_uint(a) | tq_as_uint(b));
    return a < b ? a : b;
}

#ifndef TQ_EMULATOR
// SIMD max / min: the xor butterfly with the symmetric tq_max / tq_min (the emulator has its own).
TQ_FUNC float tq_simd_max(float v) { for (uint o = 16; o > 0; o >>= 1) v = tq_max(v, tq_simd_shuffle_xor(v, o)); return v; }
TQ_FUNC float tq_simd_min(float v) { for (uint o = 16; o > 0; o >>= 1) v = tq_min(v, tq_simd_shuffle_xor(v, o)); return v; }
TQ_FUNC int tq_simd_max(int v) { for (uint o = 16; o > 0; o >>= 1) { int w = tq_simd_shuffle_xor(v, o); v = w > v ? w : v; } return v; }
TQ_FUNC int tq_simd_min(int v) { for (uint o = 16; o > 0; o >>= 1) { int w = tq_simd_shuffle_xor(v, o); v = w < v ? w : v; } return v; }
TQ_FUNC uint tq_simd_max(uint v) { for (uint o = 16; o > 0; o >>= 1) { uint w = tq_simd_shuffle_xor(v, o); v = w > v ? w : v; } return v; }
TQ_FUNC uint tq_simd_min(uint v) { for (uint o = 16; o > 0; o >>= 1) { uint w = tq_simd_shuffle_xor(v, o); v = w < v ? w : v; } return v; }
#endif
