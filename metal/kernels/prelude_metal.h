// tqbridge kernel dialect on Metal (mx.fast.metal_kernel; see docs/kernels.md).
//
// Passed to MLX as the kernel `header`. The thread ids are bound by lines that the builder puts at
// the top of the body, because MLX adds a Metal attribute ([[thread_index_in_simdgroup]], ...) to
// the generated signature only when its name appears in the body text.
//
// Float exactness: MLX compiles custom kernels with fast math off (MathMode::Safe); on top of that
// FP contraction is switched off for this source, and division and square root use precise::.
// Written against MLX's metal_kernel documentation and the Metal Shading Language specification;
// not run on Apple hardware by this project's CI.
#define TQ_BACKEND_METAL 1
#include <metal_stdlib>
using namespace metal;
#pragma METAL fp contract(off)

#define TQ_FUNC inline
#define TQ_DEVICE device
#define TQ_CONST_DEVICE const device
#define TQ_SHARED threadgroup
#define TQ_THREAD thread
// a hint to unroll the next loop (its trip count is a compile-time constant)
#define TQ_UNROLL _Pragma("unroll")

TQ_FUNC uint tq_as_uint(float f) { return as_type<uint>(f); }
TQ_FUNC float tq_as_float(uint u) { return as_type<float>(u); }
TQ_FUNC int tq_as_int(float f) { return as_type<int>(f); }

TQ_FUNC float tq_add(float a, float b) { return a + b; }
TQ_FUNC float tq_sub(float a, float b) { return a - b; }
TQ_FUNC float tq_mul(float a, float b) { return a * b; }
TQ_FUNC float tq_div(float a, float b) { return precise::divide(a, b); }
TQ_FUNC float tq_sqrt(float a) { return precise::sqrt(a); }
TQ_FUNC float tq_fma(float a, float b, float c) { return fma(a, b, c); }
TQ_FUNC float tq_trunc(float a) { return trunc(a); }
TQ_FUNC float tq_floor(float a) { return floor(a); }
TQ_FUNC float tq_exp(float a) { return precise::exp(a); }
TQ_FUNC float tq_exp2(float a) { return precise::exp2(a); }
// binary16 bits -> float32 with the hardware conversion (exact for every non-NaN input)
TQ_FUNC float tq_half_to_float(uint h) { return float(as_type<half>((ushort)h)); }

// SIMD-group ops (32 lanes). Sum/max/min use the xor butterfly 16, 8, 4, 2, 1 (not simd_sum,
// whose order is unspecified), so every backend gives the same bits.
#define tq_simd_shuffle(v, lane) simd_shuffle((v), (ushort)(lane))
#define tq_simd_shuffle_xor(v, mask) simd_shuffle_xor((v), (ushort)(mask))
#define tq_simd_broadcast(v, lane) simd_broadcast((v), (ushort)(lane))
TQ_FUNC float tq_simd_sum(float v) { for (ushort o = 16; o > 0; o >>= 1) v = v + simd_shuffle_xor(v, o); return v; }
TQ_FUNC int tq_simd_sum(int v) { for (ushort o = 16; o > 0; o >>= 1) v = v + simd_shuffle_xor(v, o); return v; }
TQ_FUNC uint tq_simd_sum(uint v) { for (ushort o = 16; o > 0; o >>= 1) v = v + simd_shuffle_xor(v, o); return v; }
#define tq_barrier() threadgroup_barrier(mem_flags::mem_threadgroup)
#define tq_barrier_device() threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup)
#define tq_simd_barrier() simdgroup_barrier(mem_flags::mem_threadgroup)
#define TQ_SHARED_ARRAY(T, name, n) threadgroup T name[n]
// MLX's Metal kernels take no dynamic threadgroup memory: a kernel built with TQ_DSMEM fails here, loudly
#define TQ_DYN_SHARED_ARRAY(T, name) static_assert(false, "no dynamic threadgroup memory on Metal (TQ_DSMEM)")
