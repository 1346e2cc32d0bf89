// tqbridge kernel dialect on CUDA (mx.fast.cuda_kernel, MLX's CUDA backend; see docs/kernels.md).
//
// Passed to MLX as the kernel `header` (MLX compiles it with NVRTC). Float exactness: NVRTC
// contracts a*b+c into an FMA by default, so tq_add/tq_sub/tq_mul/tq_div/tq_sqrt are the
// round-to-nearest intrinsics (__fadd_rn, ...), which are never contracted; NVRTC's defaults keep
// IEEE division, square root and denormals (no -use_fast_math, no -ftz).
#define TQ_BACKEND_CUDA 1
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;

#define TQ_FUNC __device__ __forceinline__
#define TQ_DEVICE
#define TQ_CONST_DEVICE const
#define TQ_SHARED
#define TQ_THREAD
// a hint to unroll the next loop (its trip count is a compile-time constant)
#define TQ_UNROLL _Pragma("unroll")

TQ_FUNC uint tq_as_uint(float f) { return __float_as_uint(f); }
TQ_FUNC float tq_as_float(uint u) { return __uint_as_float(u); }
TQ_FUNC int tq_as_int(float f) { return __float_as_int(f); }

TQ_FUNC float tq_add(float a, float b) { return __fadd_rn(a, b); }
TQ_FUNC float tq_sub(float a, float b) { return __fsub_rn(a, b); }
TQ_FUNC float tq_mul(float a, float b) { return __fmul_rn(a, b); }
TQ_FUNC float tq_div(float a, float b) { return __fdiv_rn(a, b); }
TQ_FUNC float tq_sqrt(float a) { return __fsqrt_rn(a); }
TQ_FUNC float tq_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
TQ_FUNC float tq_trunc(float a) { return truncf(a); }
TQ_FUNC float tq_floor(float a) { return floorf(a); }
TQ_FUNC float tq_exp(float a) { return expf(a); }
TQ_FUNC float tq_exp2(float a) { return exp2f(a); }
// binary16 bits -> float32 with the hardware conversion (exact for every non-NaN input)
TQ_FUNC float tq_half_to_float(uint h) { return __half2float(__ushort_as_half((unsigned short)h)); }

// profiling builds only (TQA_PHASES): the GPU's global timer (ns; its update interval depends on the GPU)
// and the SM's cycle counter (the SM's own clock: durations within one threadgroup)
TQ_FUNC unsigned long long tq_timer() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
TQ_FUNC unsigned long long tq_cycles() { return (unsigned long long)clock64(); }

// SIMD-group (warp) ops: all 32 lanes must call them (the emulator enforces it).
#define tq_simd_shuffle(v, lane) __shfl_sync(0xffffffffu, (v), (int)(lane))
#define tq_simd_shuffle_xor(v, mask) __shfl_xor_sync(0xffffffffu, (v), (int)(mask))
#define tq_simd_broadcast(v, lane) __shfl_sync(0xffffffffu, (v), (int)(lane))
TQ_FUNC float tq_simd_sum(float v) { for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }
TQ_FUNC int tq_simd_sum(int v) { for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o); return v; }
TQ_FUNC uint tq_simd_sum(uint v) { for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o); return v; }
#define tq_barrier() __syncthreads()
// a barrier that also orders the threadgroup's device-memory writes before its later reads (and copies)
#define tq_barrier_device() __syncthreads()
// one SIMD group's lanes meet; their threadgroup-memory writes before it are visible to each other after
#define tq_simd_barrier() __syncwarp()
#define TQ_SHARED_ARRAY(T, name, n) __shared__ T name[n]
// the kernel's dynamic threadgroup memory (TQ_DSMEM bytes, a static parameter the launch requests): one
// array per kernel; CUDA's static shared memory stops at 48 KB, the dynamic one may go beyond
#define TQ_DYN_SHARED_ARRAY(T, name) extern __shared__ __align__(16) T name[]
