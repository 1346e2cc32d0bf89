// tqbridge kernel dialect on the CPU SIMT emulator (see docs/kernels.md).
//
// The kernel body becomes a function run once per thread; threads are coroutines
// scheduled by emu_runtime.h, and every barrier or SIMD op is a scheduling point. Compiled with
// -ffp-contract=off -fno-fast-math, so tq_add/tq_mul/... and plain float operators round each
// operation to float32, as the reference does.
#define TQ_EMULATOR 1
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;

#define TQ_FUNC static inline
#define TQ_DEVICE
#define TQ_CONST_DEVICE const
#define TQ_SHARED
#define TQ_THREAD
// a hint to unroll the next loop (its trip count is a compile-time constant)
#define TQ_UNROLL

TQ_FUNC uint tq_as_uint(float f) { uint u; std::memcpy(&u, &f, 4); return u; }
TQ_FUNC float tq_as_float(uint u) { float f; std::memcpy(&f, &u, 4); return f; }
TQ_FUNC int tq_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }

TQ_FUNC float tq_add(float a, float b) { return a + b; }
TQ_FUNC float tq_sub(float a, float b) { return a - b; }
TQ_FUNC float tq_mul(float a, float b) { return a * b; }
TQ_FUNC float tq_div(float a, float b) { return a / b; }
TQ_FUNC float tq_sqrt(float a) { return std::sqrt(a); }
TQ_FUNC float tq_fma(float a, float b, float c) { return std::fma(a, b, c); }
TQ_FUNC float tq_trunc(float a) { return std::trunc(a); }
TQ_FUNC float tq_floor(float a) { return std::floor(a); }
TQ_FUNC float tq_exp(float a) { return std::exp(a); }
TQ_FUNC float tq_exp2(float a) { return std::exp2(a); }
// profiling builds (TQA_PHASES): the emulator's "timer" counts its calls, so it orders the points a kernel
// stamps (one kernel runs at a time in a process) but measures no time
static unsigned long long tq_emu_timer_calls = 0;
TQ_FUNC unsigned long long tq_timer() { return ++tq_emu_timer_calls; }
TQ_FUNC unsigned long long tq_cycles() { return ++tq_emu_timer_calls; }
// binary16 bits -> float32, exact, without a loop (the GPUs use their conversion instruction):
// normals by re-biasing the exponent, subnormals as an exact integer times 2^-24, inf / NaN by bits.
TQ_FUNC float tq_half_to_float(uint h) {
    const uint sign = (h & 0x8000u) << 16;
    const uint e = h & 0x7c00u;
    float mag;
    if (e == 0u) mag = (float)(h & 0x3ffu) * 5.9604644775390625e-8f;
    else if (e == 0x7c00u) mag = tq_as_float(0x7f800000u | ((h & 0x3ffu) << 13));
    else mag = tq_as_float(((h & 0x7fffu) << 13) + (112u << 23));
    return tq_as_float(tq_as_uint(mag) | sign);
}

namespace tqemu {
uint sync_simd(int op, int ty, uint val, uint arg, int line);
void sync_barrier(int line);
void* shared_alloc(size_t bytes, size_t align, int line);
struct Ids { uint tid, tg_size, lane, simd, nsimd, gx, gy, gz, ngx, ngy, ngz; };
const Ids& ids();
enum { OP_SUM = 1, OP_MAX, OP_MIN, OP_SHUFFLE, OP_SHUFFLE_XOR, OP_BROADCAST };
enum { TY_F32 = 1, TY_I32, TY_U32 };
template <typename T> struct Ty;
template <> struct Ty<float> { static const int id = TY_F32; static uint enc(float v) { return tq_as_uint(v); } static float dec(uint u) { return tq_as_float(u); } };
template <> struct Ty<int> { static const int id = TY_I32; static uint enc(int v) { return (uint)v; } static int dec(uint u) { return (int)u; } };
template <> struct Ty<uint> { static const int id = TY_U32; static uint enc(uint v) { return v; } static uint dec(uint u) { return u; } };
template <typename T> inline T simd(int op, T v, uint arg, int line) {
    return Ty<T>::dec(sync_simd(op, Ty<T>::id, Ty<T>::enc(v), arg, line));
}
}  // namespace tqemu

// SIMD-group ops (32 lanes). Sum/max/min follow the xor butterfly 16, 8, 4, 2, 1 on every backend.
#define tq_simd_sum(v) tqemu::simd(tqemu::OP_SUM, (v), 0u, __LINE__)
#define tq_simd_max(v) tqemu::simd(tqemu::OP_MAX, (v), 0u, __LINE__)
#define tq_simd_min(v) tqemu::simd(tqemu::OP_MIN, (v), 0u, __LINE__)
#define tq_simd_shuffle(v, lane) tqemu::simd(tqemu::OP_SHUFFLE, (v), (uint)(lane), __LINE__)
#define tq_simd_shuffle_xor(v, mask) tqemu::simd(tqemu::OP_SHUFFLE_XOR, (v), (uint)(mask), __LINE__)
#define tq_simd_broadcast(v, lane) tqemu::simd(tqemu::OP_BROADCAST, (v), (uint)(lane), __LINE__)
#define tq_barrier() tqemu::sync_barrier(__LINE__)
#define tq_barrier_device() tqemu::sync_barrier(__LINE__)
// the SIMD group's lanes meet (a SIMD op without a value): a scheduling point like any other
#define tq_simd_barrier() ((void)tqemu::simd(tqemu::OP_MAX, 0u, 0u, __LINE__))
#define TQ_SHARED_ARRAY(T, name, n) T* name = (T*)tqemu::shared_alloc(sizeof(T) * (size_t)(n), alignof(T), __LINE__)
// dynamic threadgroup memory (TQ_DSMEM bytes): from the same arena, under the same limit
#define TQ_DYN_SHARED_ARRAY(T, name) T* name = (T*)tqemu::shared_alloc((size_t)(TQ_DSMEM), 16, __LINE__)
