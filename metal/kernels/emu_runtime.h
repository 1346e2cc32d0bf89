// CPU SIMT emulator runtime: runs a kernel body (tq_kernel_body, defined before this file is
// included) over a grid of threadgroups with real barrier and SIMD-group semantics.
//
// Each thread of a threadgroup is a coroutine with its own stack. A barrier or SIMD op suspends the
// thread; when no thread can run, the scheduler completes the SIMD ops whose 32 lanes have all
// arrived at the same op, or releases the barrier once every thread waits at it. Anything else is
// an error (divergent SIMD op, barrier not reached by every thread). To expose what GPUs hide:
// threadgroup memory is poisoned (0xFF bytes: float NaN, integer -1) when each threadgroup starts,
// threads run in a seeded random order between scheduling points, threadgroups run in a seeded
// random order, and guard bytes after every threadgroup array and at the end of every stack are
// checked. Kernels that use no barrier and no SIMD op run as plain calls (same random orders).
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ucontext.h>
#include <vector>

// Context switch: a few instructions of assembly on x86-64 (no signal-mask system call; about 10x
// faster than swapcontext, measured); ucontext elsewhere, or when TQ_EMU_UCONTEXT is defined.
#if defined(__x86_64__) && !defined(TQ_EMU_UCONTEXT)
#define TQ_EMU_ASM_SWITCH 1
#if defined(__APPLE__)
#define TQ_EMU_SYM "_tqemu_switch"
#define TQ_EMU_HIDE ".private_extern _tqemu_switch\n"
#else
#define TQ_EMU_SYM "tqemu_switch"
#define TQ_EMU_HIDE ".hidden tqemu_switch\n"
#endif
// tqemu_switch(save, to): push the callee-saved registers, store the stack pointer in *save,
// continue on the stack `to` (popping the registers it saved, or a fresh frame).
extern "C" void tqemu_switch(void** save, void* to);
__asm__(".text\n.globl " TQ_EMU_SYM "\n" TQ_EMU_HIDE ".p2align 4\n" TQ_EMU_SYM ":\n"
        "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
        "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
        "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n");
#endif

namespace tqemu {

enum { ST_READY = 0, ST_BARRIER, ST_SIMD, ST_DONE };
static const size_t STACK_BYTES = 64 * 1024;
static const size_t STACK_GUARD = 256;
static const size_t SHARED_LIMIT = 32 * 1024;  // Metal's threadgroup memory limit
static const size_t SHARED_GUARD = 64;
static const unsigned char POISON = 0xFF, CANARY = 0xA5;

struct Thread {
#ifdef TQ_EMU_ASM_SWITCH
    void* sp;
#else
    ucontext_t ctx;
#endif
    int state;
    Ids id;
    int line;
    uint nbar, nsimd_ops;  // barriers and SIMD ops passed
    int op, ty;
    uint val, arg, res;
    size_t shared_off;
    size_t shared_count;
    char* stack;
};

struct Launch {
    uint gx, gy, gz, tg;
    std::vector<Thread> th;
    Thread* cur;
#ifdef TQ_EMU_ASM_SWITCH
    void* sched_sp;
#else
    ucontext_t sched;
#endif
    alignas(16) unsigned char arena[SHARED_LIMIT + SHARED_GUARD];
    size_t arena_used;
    std::vector<size_t> arr_off, arr_bytes;
    std::vector<int> arr_line;
    unsigned long long rng;
    char* err;
    int errlen;
    int failed;
    bool fibers;
};

static Launch* g = nullptr;
static char* g_stacks = nullptr;
static size_t g_stacks_n = 0;
static void* g_bufs[64];

static void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char* fmt, ...) {
    if (g->failed) return;
    g->failed = 1;
    int n = std::snprintf(g->err, (size_t)g->errlen, "kernel %s: ", TQ_KERNEL_NAME);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && n < g->errlen) std::vsnprintf(g->err + n, (size_t)(g->errlen - n), fmt, ap);
    va_end(ap);
}

static unsigned long long next_rand() {  // splitmix64
    unsigned long long z = (g->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <typename V> static void shuffle(V& v) {
    for (size_t i = v.size(); i > 1; --i) {
        size_t j = (size_t)(next_rand() % i);
        auto t = v[i - 1]; v[i - 1] = v[j]; v[j] = t;
    }
}

const Ids& ids() { return g->cur->id; }

static void yield_to_scheduler() {
    Thread* t = g->cur;
#ifdef TQ_EMU_ASM_SWITCH
    tqemu_switch(&t->sp, g->sched_sp);
#else
    swapcontext(&t->ctx, &g->sched);
#endif
}

uint sync_simd(int op, int ty, uint val, uint arg, int line) {
    Thread* t = g->cur;
    if (!g->fibers) {
        fail("SIMD op at line %d in a kernel built without scheduling points", line);
        return 0;
    }
    t->state = ST_SIMD; t->op = op; t->ty = ty; t->val = val; t->arg = arg; t->line = line;
    yield_to_scheduler();
    return t->res;
}

void sync_barrier(int line) {
    Thread* t = g->cur;
    if (!g->fibers) {
        fail("barrier at line %d in a kernel built without scheduling points", line);
        return;
    }
    t->state = ST_BARRIER; t->line = line;
    yield_to_scheduler();
}

void* shared_alloc(size_t bytes, size_t align, int line) {
    Thread* t = g->cur;
    if (align < 16) align = 16;
    size_t off = (t->shared_off + align - 1) / align * align;
    size_t k = t->shared_count++;
    if (k < g->arr_off.size()) {
        if (g->arr_off[k] != off || g->arr_bytes[k] != bytes || g->arr_line[k] != line) {
            fail("threadgroup array at line %d declared differently by thread %u (declare them "
                 "unconditionally, in the same order, in every thread)", line, t->id.tid);
            return g->arena;
        }
    } else {
        if (off + bytes > SHARED_LIMIT) {
            fail("threadgroup arrays need %zu bytes, over the %zu-byte limit", off + bytes, SHARED_LIMIT);
            return g->arena;
        }
        g->arr_off.push_back(off); g->arr_bytes.push_back(bytes); g->arr_line.push_back(line);
        std::memset(g->arena + off + bytes, CANARY, SHARED_GUARD);
        if (off + bytes + SHARED_GUARD > g->arena_used) g->arena_used = off + bytes + SHARED_GUARD;
    }
    t->shared_off = off + bytes + SHARED_GUARD;
    return g->arena + off;
}

static void trampoline() {
    tq_kernel_body();
    g->cur->state = ST_DONE;
#ifdef TQ_EMU_ASM_SWITCH
    tqemu_switch(&g->cur->sp, g->sched_sp);  // never resumed
    std::abort();
#endif
    // (ucontext) returning resumes g->sched through uc_link
}

static void start_thread(Thread& t) {
#ifdef TQ_EMU_ASM_SWITCH
    // a fresh frame: six zero registers, then `ret` into trampoline with the stack pointer at
    // 8 mod 16, as after a call
    uintptr_t top = ((uintptr_t)(t.stack + STACK_BYTES)) & ~(uintptr_t)15;
    void** f = (void**)(top - 64);
    for (int i = 0; i < 6; ++i) f[i] = nullptr;
    f[6] = (void*)&trampoline;
    f[7] = nullptr;
    t.sp = (void*)f;
#else
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack;
    t.ctx.uc_stack.ss_size = STACK_BYTES;
    t.ctx.uc_link = &g->sched;
    makecontext(&t.ctx, trampoline, 0);
#endif
}

static void enter_thread(Thread& t) {
#ifdef TQ_EMU_ASM_SWITCH
    tqemu_switch(&g->sched_sp, t.sp);
#else
    swapcontext(&g->sched, &t.ctx);
#endif
}

static const char* state_name(int s) {
    switch (s) {
        case ST_BARRIER: return "waits at a barrier";
        case ST_SIMD: return "waits at a SIMD op";
        case ST_DONE: return "has exited";
        default: return "is running";
    }
}

static uint apply_op(int op, int ty, uint a, uint b) {
    if (ty == TY_F32) {
        float x = tq_as_float(a), y = tq_as_float(b);
        if (op == OP_SUM) return tq_as_uint(x + y);
        if (op == OP_MAX) return tq_as_uint(tq_max(x, y));
        return tq_as_uint(tq_min(x, y));
    }
    if (op == OP_SUM) return a + b;
    if (ty == TY_I32) {
        int x = (int)a, y = (int)b;
        return (uint)(op == OP_MAX ? (x > y ? x : y) : (x < y ? x : y));
    }
    return op == OP_MAX ? (a > b ? a : b) : (a < b ? a : b);
}

// Completes the SIMD op pending in simdgroup s (all lanes waiting); false on an error.
static bool resolve_simd(uint s, uint n_lanes) {
    Thread* L = &g->th[s * 32];
    Thread& a = L[0];
    for (uint i = 1; i < n_lanes; ++i) {
        Thread& b = L[i];
        if (b.op != a.op || b.ty != a.ty || b.line != a.line || b.nsimd_ops != a.nsimd_ops) {
            fail("divergent SIMD op: in simdgroup %u, lane 0 is at line %d (SIMD op #%u) and lane %u at "
                 "line %d (SIMD op #%u)", s, a.line, a.nsimd_ops, i, b.line, b.nsimd_ops);
            return false;
        }
    }
    uint v[32], w[32];
    for (uint i = 0; i < n_lanes; ++i) v[i] = L[i].val;
    if (a.op == OP_SUM || a.op == OP_MAX || a.op == OP_MIN) {
        if (n_lanes != 32) { fail("SIMD reduction at line %d in a partial simdgroup", a.line); return false; }
        for (uint o = 16; o > 0; o >>= 1) {
            for (uint i = 0; i < 32; ++i) w[i] = apply_op(a.op, a.ty, v[i], v[i ^ o]);
            for (uint i = 0; i < 32; ++i) v[i] = w[i];
        }
        for (uint i = 0; i < 32; ++i) L[i].res = v[i];
    } else {
        for (uint i = 0; i < n_lanes; ++i) {
            uint src = a.op == OP_SHUFFLE_XOR ? (i ^ L[i].arg) : L[i].arg;
            if (a.op == OP_BROADCAST && L[i].arg != a.arg) {
                fail("simd broadcast at line %d: source lane differs between lanes (%u vs %u)", a.line, a.arg, L[i].arg);
                return false;
            }
            if (src >= n_lanes) {
                fail("SIMD shuffle at line %d: lane %u reads lane %u, outside the simdgroup", a.line, i, src);
                return false;
            }
            L[i].res = v[src];
        }
    }
    for (uint i = 0; i < n_lanes; ++i) { L[i].state = ST_READY; L[i].nsimd_ops++; }
    return true;
}

static void check_guards() {
    for (size_t k = 0; k < g->arr_off.size(); ++k) {
        const unsigned char* p = g->arena + g->arr_off[k] + g->arr_bytes[k];
        for (size_t i = 0; i < SHARED_GUARD; ++i) {
            if (p[i] != CANARY) {
                fail("write past the end of the threadgroup array declared at line %d (%zu bytes)",
                     g->arr_line[k], g->arr_bytes[k]);
                return;
            }
        }
    }
    if (g->fibers) {
        for (uint i = 0; i < g->tg; ++i) {
            for (size_t j = 0; j < STACK_GUARD; ++j) {
                if ((unsigned char)g->th[i].stack[j] != CANARY) {
                    fail("thread %u overflowed its %zu-byte emulator stack", i, STACK_BYTES);
                    return;
                }
            }
        }
    }
}

static void run_group(uint gx, uint gy, uint gz) {
    const uint tg = g->tg;
    std::memset(g->arena, POISON, g->arena_used ? g->arena_used : sizeof(g->arena));
    g->arena_used = 0;
    g->arr_off.clear(); g->arr_bytes.clear(); g->arr_line.clear();
    std::vector<uint> order(tg);
    for (uint i = 0; i < tg; ++i) {
        Thread& t = g->th[i];
        t.state = ST_READY; t.nbar = 0; t.nsimd_ops = 0; t.shared_off = 0; t.shared_count = 0; t.line = 0;
        t.id = Ids{i, tg, i % 32, i / 32, (tg + 31) / 32, gx, gy, gz, g->gx, g->gy, g->gz};
        order[i] = i;
    }
    shuffle(order);
    if (!g->fibers) {
        for (uint i : order) {
            g->cur = &g->th[i];
            tq_kernel_body();
            if (g->failed) return;
        }
        check_guards();
        return;
    }
    for (uint i = 0; i < tg; ++i) {
        Thread& t = g->th[i];
        t.stack = g_stacks + (size_t)i * STACK_BYTES;
        std::memset(t.stack, CANARY, STACK_GUARD);
        start_thread(t);
    }
    const uint nsimd = (tg + 31) / 32;
    std::vector<uint> pool(order);     // runnable threads; one is picked at random each time
    std::vector<uint> arrived(nsimd, 0);  // lanes of each simdgroup waiting at a SIMD op
    for (;;) {
        while (!pool.empty()) {
            size_t j = (size_t)(next_rand() % pool.size());
            uint i = pool[j];
            pool[j] = pool.back();
            pool.pop_back();
            Thread& t = g->th[i];
            g->cur = &t;
            enter_thread(t);
            if (g->failed) return;
            if (t.state == ST_SIMD) {
                // a simdgroup whose lanes have all arrived goes on at once, while other
                // simdgroups may still be behind (as on a GPU)
                uint s = t.id.simd;
                uint n_lanes = (s + 1) * 32 <= tg ? 32 : tg - s * 32;
                if (++arrived[s] == n_lanes) {
                    arrived[s] = 0;
                    if (!resolve_simd(s, n_lanes)) return;
                    for (uint l = 0; l < n_lanes; ++l) pool.push_back(s * 32 + l);
                }
            }
        }
        uint n_done = 0;
        int first_barrier = -1;
        for (uint i = 0; i < tg; ++i) {
            if (g->th[i].state == ST_DONE) n_done++;
            if (g->th[i].state == ST_BARRIER && first_barrier < 0) first_barrier = (int)i;
        }
        if (n_done == tg) break;
        for (uint s = 0; s < nsimd; ++s) {
            if (arrived[s] == 0) continue;
            uint n_lanes = (s + 1) * 32 <= tg ? 32 : tg - s * 32;
            int lane_at = -1, lane_off = -1;
            for (uint l = 0; l < n_lanes; ++l) {
                if (g->th[s * 32 + l].state == ST_SIMD) { if (lane_at < 0) lane_at = (int)l; }
                else if (lane_off < 0) lane_off = (int)l;
            }
            const Thread& a = g->th[s * 32 + (uint)lane_at];
            const Thread& b = g->th[s * 32 + (uint)lane_off];
            fail("divergent SIMD op at line %d: in simdgroup %u only %u of %u lanes arrived; lane %d %s%s",
                 a.line, s, arrived[s], n_lanes, lane_off, state_name(b.state),
                 b.state == ST_BARRIER ? " (at line " : "");
            if (b.state == ST_BARRIER) {
                size_t n = std::strlen(g->err);
                std::snprintf(g->err + n, (size_t)g->errlen - n, "%d)", b.line);
            }
            return;
        }
        // every thread left waits at a barrier (or has exited)
        const Thread& a = g->th[(uint)first_barrier];
        if (n_done > 0) {
            fail("barrier at line %d not reached by every thread: %u of %u threads exited before it",
                 a.line, n_done, tg);
            return;
        }
        for (uint i = 0; i < tg; ++i) {
            const Thread& b = g->th[i];
            if (b.line != a.line || b.nbar != a.nbar) {
                fail("threads wait at different barriers: thread %d at line %d (barrier #%u), thread %u at "
                     "line %d (barrier #%u)", first_barrier, a.line, a.nbar, i, b.line, b.nbar);
                return;
            }
        }
        for (uint i = 0; i < tg; ++i) { g->th[i].state = ST_READY; g->th[i].nbar++; pool.push_back(i); }
    }
    check_guards();
}

}  // namespace tqemu

extern "C" __attribute__((visibility("default"))) int tq_emu_launch(void** bufs, int nbufs, unsigned gx, unsigned gy, unsigned gz, unsigned tg,
                             unsigned long long seed, char* err, int errlen) {
    using namespace tqemu;
    static Launch L;
    g = &L;
    L.err = err; L.errlen = errlen; L.failed = 0; L.rng = seed; L.arena_used = 0;
    L.gx = gx; L.gy = gy; L.gz = gz; L.tg = tg;
    L.fibers = TQ_USES_SYNC != 0;
    err[0] = 0;
    if (nbufs > 64) { fail("at most 64 buffers"); return 1; }
    if (tg == 0 || tg > 1024) { fail("threadgroup size %u outside 1..1024", tg); return 1; }
    for (int i = 0; i < nbufs; ++i) g_bufs[i] = bufs[i];
    L.th.assign(tg, Thread());
    if (L.fibers && g_stacks_n < tg) {
        std::free(g_stacks);
        g_stacks = (char*)std::malloc((size_t)tg * STACK_BYTES);
        g_stacks_n = g_stacks ? tg : 0;
        if (!g_stacks) { fail("out of memory for %u thread stacks", tg); return 1; }
    }
    std::vector<unsigned long long> groups((size_t)gx * gy * gz);
    for (size_t i = 0; i < groups.size(); ++i) groups[i] = i;
    shuffle(groups);
    for (unsigned long long k : groups) {
        uint x = (uint)(k % gx), y = (uint)((k / gx) % gy), z = (uint)(k / ((unsigned long long)gx * gy));
        run_group(x, y, z);
        if (L.failed) return 1;
    }
    return 0;
}
