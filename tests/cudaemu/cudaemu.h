/* cudaemu.h - runs mbt's CUDA C on the CPU, for testing the GPU path on machines without a GPU.
 *
 * A program's translation unit (`mbtc --emit=cuda`: the generated kernels and the runtime's own,
 * runtime/kernels/rt_kernels.cu) is compiled as C++ for the host with this header forced in
 * first (`g++ -include cudaemu.h`, tests/cudaemu/build.sh), into a shared object that the CPU
 * stand-in for the CUDA driver (tests/cudaemu/fake_cuda.c, MBT_FAKE_CUDA_EMU) loads and launches
 * kernels from. The kernels' source is NVRTC's, unchanged: what runs is the code the GPU runs,
 * with the host's arithmetic.
 *
 * The execution model. Blocks run one after another; the threads of a block run as fibers on
 * one OS thread, each until it finishes or reaches a barrier:
 *   - __syncthreads() waits until every thread of the block that has not exited is there;
 *   - __syncwarp(), and each __shfl*_sync (which is a barrier, a write, a barrier, a read), wait
 *     for every lane of the warp.
 * A barrier that can never be passed (lanes of one warp at different kinds of barrier, a warp
 * barrier some of whose lanes exited, threads of a block split between warp and block barriers
 * with none able to go on) is reported with the kernel, block and threads, and the launch fails:
 * on a GPU that is a hang or undefined behaviour. Fibers are started with makecontext and then
 * switch with GCC's __builtin_setjmp/__builtin_longjmp (no system call, no libc): a few
 * nanoseconds a switch.
 *
 * What it shows and what it cannot:
 *   - it shows indexing, launch geometry against what the code assumes, reduction trees,
 *     shared-memory use and barrier placement, vector accesses, f16/bf16 conversions;
 *   - floating point is the host's: IEEE f32/f64 without contraction (compile with
 *     -ffp-contract=off), libm's expf/tanhf/... instead of CUDA's (both within 1-2 ulp, not
 *     bit-identical);
 *   - memory is the host's: no memory model, no races (fibers never run at once), no
 *     out-of-bounds detection beyond what the host would fault on;
 *   - only 32-lane warps and full masks (0xffffffff), which is all mbt's code uses; other masks
 *     are reported as not emulated.
 *
 * The entry points the shared object exports (declared by MBT_EMU_EXPORTS at the end of the
 * translation unit, tests/cudaemu/build.sh writes one MBT_EMU_KERNEL line a kernel):
 *   int mbt_emu_find(const char *name)                      index of kernel `name`, or -1
 *   int mbt_emu_launch(int kernel, const unsigned grid[3], const unsigned block[3],
 *                      void **params, char *err, size_t errlen)
 *        runs the kernel to completion with cuLaunchKernel's parameter convention (params[i]
 *        points at argument i); 0, or 1 with a message in err.
 *   int mbt_emu_params(int kernel, const size_t **sizes)
 *        the kernel's parameter count, and in *sizes each one's size (fake_cuda.c's stream
 *        capture copies the values, as CUDA's does). */
#ifndef MBT_CUDAEMU_H
#define MBT_CUDAEMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cmath>
#include <type_traits>
#include <utility>

using std::copysign;
using std::fmod;
using std::signbit;

/* ---- the language's keywords ---------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static /* one block at a time: a function's static is its block's shared memory */
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};
static const int warpSize = 32;

/* ---- the fibers ----------------------------------------------------------------------------- */

namespace cudaemu {

enum { RUN, AT_WARP, AT_BLOCK, DONE };
enum { MAX_THREADS = 1024, STACK = 256 * 1024 };

/* A saved execution point: GCC's __builtin_setjmp/__builtin_longjmp keep the frame and stack
 * pointers and the resume address only (the compiler saves the rest around the call), with no
 * call into libc, which is what makes a switch cheap. */
typedef void *Jump[5];

__attribute__((noinline)) inline void jump(Jump to) { __builtin_longjmp(to, 1); }

struct Fiber {
    Jump env;
    char *stack;
    uint3 idx;
    int tid;
    unsigned shuffles; /* this thread's shuffles so far in the block: which exchange slots it uses */
};

struct State {
    uint3 block;
    dim3 grid, bdim;
    Fiber fibers[MAX_THREADS];
    unsigned char state[MAX_THREADS]; /* each thread's RUN, AT_WARP, AT_BLOCK or DONE: compact, as
                                         the barriers scan it */
    int created;                      /* fibers with a stack */
    Fiber *cur;
    Jump sched;
    ucontext_t creator;
    void (*body)(void **); /* the kernel's thunk, run by each thread */
    void **params;
    const char *kernel;
    char err[512];                          /* the launch's failure, if any */
    int nthreads;                           /* of the block being run */
    int arrived[MAX_THREADS / 32];          /* each warp's lanes waiting at its barrier */
    unsigned char lanes[2][MAX_THREADS][8]; /* the shuffles' exchange slots: a pair per thread */
};

inline State &st() {
    static State s;
    return s;
}

__attribute__((noinline)) inline void fiber_main() {
    State &s = st();
    Fiber *f = s.cur;
    if (!__builtin_setjmp(f->env)) setcontext(&s.creator); /* parked until the first job */
    for (;;) {
        s.body(s.params);
        s.state[f->tid] = DONE;
        if (!__builtin_setjmp(f->env)) jump(s.sched); /* parked until the next block */
    }
}

inline int make_fiber(Fiber *f, char *err, size_t errlen) {
    void *mem = mmap(NULL, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(err, errlen, "cudaemu: cannot map a fiber stack of %d bytes", STACK);
        return 1;
    }
    mprotect(mem, 4096, PROT_NONE); /* a guard page: an overflow faults instead of corrupting */
    f->stack = (char *)mem;
    ucontext_t uc; /* only to start the fiber: it parks at once, and switches by Jump from then on */
    getcontext(&uc);
    uc.uc_stack.ss_sp = f->stack;
    uc.uc_stack.ss_size = STACK;
    uc.uc_link = NULL;
    makecontext(&uc, fiber_main, 0);
    st().cur = f;
    swapcontext(&st().creator, &uc);
    return 0;
}

/* The running thread stops, waiting as `state` says, and gives the CPU back to the scheduler. */
__attribute__((noinline)) inline void wait_at(int state) {
    Fiber *f = st().cur;
    st().state[f->tid] = (unsigned char)state;
    if (!__builtin_setjmp(f->env)) jump(st().sched);
}

/* A warp barrier, without the scheduler in the common case: the thread hands the CPU straight to
 * the next lane of its warp still running, and the last to arrive releases the warp and goes on.
 * When some lane has exited or waits at __syncthreads, the scheduler takes over (and reports the
 * barrier that can never be passed). */
__attribute__((noinline)) inline void wait_warp() {
    State &s = st();
    Fiber *f = s.cur;
    int w0 = f->tid & ~31, n = s.nthreads - w0 < 32 ? s.nthreads - w0 : 32, lane = f->tid & 31, next = -1;
    unsigned char *w = s.state + w0;
    w[lane] = AT_WARP;
    if (++s.arrived[f->tid >> 5] == n) { /* the last one here: the warp goes on */
        s.arrived[f->tid >> 5] = 0;
        memset(w, RUN, (size_t)n);
        return;
    }
    for (int i = 1; i < n && next < 0; i++) {
        int l = lane + i < n ? lane + i : lane + i - n;
        if (w[l] == RUN) next = l;
    }
    if (!__builtin_setjmp(f->env)) {
        if (next >= 0) {
            s.cur = f + (next - lane);
            jump(s.cur->env);
        }
        jump(s.sched);
    }
}

inline void fail(const char *what) {
    State &s = st();
    Fiber *f = s.cur;
    if (!s.err[0])
        snprintf(s.err, sizeof s.err, "cudaemu: kernel %s, block (%u, %u, %u), thread (%u, %u, %u): %s", s.kernel, s.block.x,
                 s.block.y, s.block.z, f->idx.x, f->idx.y, f->idx.z, what);
    wait_at(DONE); /* this thread stops here; the launch reports the failure */
}

inline unsigned lane() { return (unsigned)st().cur->tid & 31u; }

inline void check_mask(unsigned mask) {
    if (mask != 0xffffffffu) fail("a warp operation with a mask other than 0xffffffff (not emulated)");
}

/* Runs one block; returns 0, or 1 with s.err set. */
inline int run_block(State &s, int nthreads) {
    s.nthreads = nthreads;
    memset(s.arrived, 0, sizeof s.arrived);
    for (int t = 0; t < nthreads; t++) {
        Fiber *f = &s.fibers[t];
        f->tid = t;
        f->shuffles = 0;
        f->idx.x = (unsigned)t % s.bdim.x;
        f->idx.y = (unsigned)t / s.bdim.x % s.bdim.y;
        f->idx.z = (unsigned)t / (s.bdim.x * s.bdim.y);
        s.state[t] = RUN;
    }
    for (;;) {
        for (int t = 0; t < nthreads; t++) {
            Fiber *f = &s.fibers[t];
            while (s.state[t] == RUN) { /* until it waits or ends: its warp may go on with it */
                s.cur = f;
                if (!__builtin_setjmp(s.sched)) jump(f->env);
            }
        }
        if (s.err[0]) return 1;
        int live = 0, at_block = 0;
        for (int t = 0; t < nthreads; t++) {
            live += s.state[t] != DONE;
            at_block += s.state[t] == AT_BLOCK;
        }
        if (live == 0) return 0;
        /* __syncthreads: every thread still running is there (Volta and later count exited
         * threads as arrived). Otherwise some wait at warp barriers, and each such warp is
         * released whole, or can never be. */
        if (at_block == live) {
            for (int t = 0; t < nthreads; t++)
                if (s.state[t] == AT_BLOCK) s.state[t] = RUN;
            continue;
        }
        for (int w = 0; w * 32 < nthreads; w++) {
            int n = nthreads - w * 32 < 32 ? nthreads - w * 32 : 32, at_warp = 0, done = 0;
            for (int l = 0; l < n; l++) {
                at_warp += s.state[w * 32 + l] == AT_WARP;
                done += s.state[w * 32 + l] == DONE;
            }
            if (at_warp == n) {
                for (int l = 0; l < n; l++) s.state[w * 32 + l] = RUN;
                s.arrived[w] = 0;
            } else if (at_warp > 0) {
                snprintf(s.err, sizeof s.err,
                         "cudaemu: kernel %s, block (%u, %u, %u), warp %d: %d of its %d lanes wait at a warp barrier "
                         "(__syncwarp or a shuffle) while %d have exited and %d wait at __syncthreads: on a GPU, "
                         "a hang or undefined behaviour",
                         s.kernel, s.block.x, s.block.y, s.block.z, w, at_warp, n, done, n - at_warp - done);
                return 1;
            }
        }
    }
}

/* After a failed launch the fibers are stopped inside the kernel: drop them all. */
inline void reset(State &s) {
    for (int t = 0; t < s.created; t++) munmap(s.fibers[t].stack, STACK);
    s.created = 0;
}

inline int launch(void (*body)(void **), const char *kernel, const unsigned grid[3], const unsigned block[3], void **params,
                  char *err, size_t errlen) {
    State &s = st();
    unsigned long long nthreads = (unsigned long long)block[0] * block[1] * block[2];
    if (nthreads == 0 || nthreads > MAX_THREADS || grid[0] == 0 || grid[1] == 0 || grid[2] == 0) {
        snprintf(err, errlen, "cudaemu: kernel %s: grid (%u, %u, %u), block (%u, %u, %u): invalid geometry", kernel, grid[0],
                 grid[1], grid[2], block[0], block[1], block[2]);
        return 1;
    }
    for (; s.created < (int)nthreads; s.created++)
        if (make_fiber(&s.fibers[s.created], err, errlen)) return 1;
    s.body = body;
    s.params = params;
    s.kernel = kernel;
    s.err[0] = 0;
    s.grid = dim3{grid[0], grid[1], grid[2]};
    s.bdim = dim3{block[0], block[1], block[2]};
    for (unsigned z = 0; z < grid[2]; z++)
        for (unsigned y = 0; y < grid[1]; y++)
            for (unsigned x = 0; x < grid[0]; x++) {
                s.block = uint3{x, y, z};
                if (run_block(s, (int)nthreads)) {
                    snprintf(err, errlen, "%s", s.err);
                    reset(s);
                    return 1;
                }
            }
    return 0;
}

/* Calls kernel k with the arguments params[i] points at (cuLaunchKernel's convention). */
template <class... A, size_t... I> inline void call_with(void (*k)(A...), void **p, std::index_sequence<I...>) {
    k(*static_cast<typename std::remove_reference<A>::type *>(p[I])...);
}
template <class... A> inline void call(void (*k)(A...), void **p) { call_with(k, p, std::index_sequence_for<A...>{}); }

/* The kernel's parameter count and sizes (a stream capture copies the values, as CUDA does). */
template <class... A> inline int param_sizes(void (*)(A...), const size_t **sizes) {
    static const size_t s[] = {sizeof(typename std::remove_reference<A>::type)..., 0};
    *sizes = s;
    return (int)sizeof...(A);
}

struct Entry {
    const char *name;
    void (*thunk)(void **);
    int (*params)(const size_t **);
};

} /* namespace cudaemu */

#define threadIdx (cudaemu::st().cur->idx)
#define blockIdx (cudaemu::st().block)
#define blockDim (cudaemu::st().bdim)
#define gridDim (cudaemu::st().grid)

/* ---- barriers and warp operations --------------------------------------------------------- */

inline void __syncthreads() { cudaemu::wait_at(cudaemu::AT_BLOCK); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    cudaemu::check_mask(mask);
    cudaemu::wait_warp();
}

namespace cudaemu {
/* Every lane publishes v, then reads lane src's (src outside the warp: its own value). The slots
 * alternate between two sets: a lane can be at most one shuffle ahead of another (each shuffle's
 * barrier waits for the whole warp), so the set it writes is never the one a slower lane reads. */
template <class T> inline T shuffle(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffles of up to 8 bytes");
    check_mask(mask);
    State &s = st();
    Fiber *f = s.cur;
    unsigned char(*slots)[8] = s.lanes[f->shuffles++ & 1];
    memcpy(slots[f->tid], &v, sizeof v);
    wait_warp();
    T r = v;
    if (src >= 0 && src < 32) memcpy(&r, slots[(f->tid & ~31) + src], sizeof r);
    return r;
}
} /* namespace cudaemu */

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int l = (int)cudaemu::lane();
    return cudaemu::shuffle(mask, v, (l & ~(width - 1)) + (src & (width - 1)));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    int l = (int)cudaemu::lane(), src = l ^ m;
    return cudaemu::shuffle(mask, v, (src & ~(width - 1)) == (l & ~(width - 1)) ? src : l);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int l = (int)cudaemu::lane(), src = l + (int)d;
    return cudaemu::shuffle(mask, v, (src & ~(width - 1)) == (l & ~(width - 1)) ? src : l);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int l = (int)cudaemu::lane(), src = l - (int)d;
    return cudaemu::shuffle(mask, v, src >= (l & ~(width - 1)) ? src : l);
}

/* Fibers never run at once, so a plain read-modify-write is atomic. */
template <class T> inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <class T> inline T atomicMax(T *p, T v) {
    T old = *p;
    if (v > old) *p = v;
    return old;
}

/* ---- reinterpretation and explicitly rounded arithmetic ---------------------------------- */

template <class To, class From> inline To cudaemu_bits(From x) {
    static_assert(sizeof(To) == sizeof(From), "same size");
    To y;
    memcpy(&y, &x, sizeof y);
    return y;
}
inline float __int_as_float(int x) { return cudaemu_bits<float>(x); }
inline float __uint_as_float(unsigned int x) { return cudaemu_bits<float>(x); }
inline int __float_as_int(float x) { return cudaemu_bits<int>(x); }
inline unsigned int __float_as_uint(float x) { return cudaemu_bits<unsigned int>(x); }
inline double __longlong_as_double(long long x) { return cudaemu_bits<double>(x); }
inline long long __double_as_longlong(double x) { return cudaemu_bits<long long>(x); }

/* -ffp-contract=off keeps these products and sums separately rounded, as the _rn intrinsics are */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* float -> int truncating and saturating, NaN -> 0 (what the PTX cvt.rzi does) */
inline int __float2int_rz(float x) {
    return x != x ? 0 : x >= 2147483648.0f ? 2147483647 : x <= -2147483648.0f ? (-2147483647 - 1) : (int)x;
}
inline long long __float2ll_rz(float x) {
    return x != x                         ? 0
           : x >= 9223372036854775808.0f  ? 9223372036854775807LL
           : x <= -9223372036854775808.0f ? (-9223372036854775807LL - 1)
                                          : (long long)x;
}
inline int __double2int_rz(double x) {
    return x != x ? 0 : x >= 2147483648.0 ? 2147483647 : x <= -2147483648.0 ? (-2147483647 - 1) : (int)x;
}
inline long long __double2ll_rz(double x) {
    return x != x                        ? 0
           : x >= 9223372036854775808.0  ? 9223372036854775807LL
           : x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1)
                                         : (long long)x;
}

/* ---- vector types ----------------------------------------------------------------------------- */

struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

/* ---- f16 and bf16 (cuda_fp16.h and cuda_bf16.h's names; their headers are empty here) ------ */

struct alignas(2) __half {
    unsigned short x;
};
struct alignas(2) __nv_bfloat16 {
    unsigned short x;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __bfloat162float(__nv_bfloat16 h) { return cudaemu_bits<float>((unsigned int)h.x << 16); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { return __nv_bfloat16{s}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned int b = cudaemu_bits<unsigned int>(f);
    if (f != f) return __nv_bfloat16{(unsigned short)((b >> 16) | 0x40u)};
    return __nv_bfloat16{(unsigned short)((b + ((b >> 16) & 1u) + 0x7fffu) >> 16)};
}
inline __half __ushort_as_half(unsigned short s) { return __half{s}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) {
    unsigned int sign = (unsigned int)(h.x >> 15) << 31, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    if (e == 0x1f) return cudaemu_bits<float>(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero or subnormal: m x 2^-24, exact in f32 */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return cudaemu_bits<float>(sign | ((e + 112) << 23) | (m << 13));
}
/* round to nearest, ties to even; overflow to infinity; subnormals rounded likewise */
inline __half __float2half_rn(float f) {
    unsigned int b = cudaemu_bits<unsigned int>(f), sign = (b >> 16) & 0x8000u;
    float a = fabsf(f);
    if (f != f) return __half{(unsigned short)(sign | 0x7e00u | ((b >> 13) & 0x3ffu))};
    if (a >= 65520.0f) return __half{(unsigned short)(sign | 0x7c00u)}; /* 65504 + half an ulp and up */
    if (a < 0x1p-14f) { /* subnormal: a multiple of 2^-24, nearbyint rounds ties to even */
        unsigned int m = (unsigned int)nearbyintf(a * 0x1p24f);
        return __half{(unsigned short)(sign | m)}; /* m = 1024 is the smallest normal, correctly */
    }
    unsigned int ab = cudaemu_bits<unsigned int>(a);
    unsigned int r = ab + 0xfffu + ((ab >> 13) & 1u); /* round the 13 dropped bits to even */
    return __half{(unsigned short)(sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ffu))};
}

/* ---- mma.sync m16n8k16, cp.async (runtime/kernels/rt_attention_fa2.cuh) -------------------- */

/* Defined here so that rt_attention_fa2.cuh takes these emulations instead of its inline PTX. */
#define MBT_CUDAEMU 1

namespace cudaemu {
inline unsigned char mma_slots[MAX_THREADS][40]; /* each lane's a[4], b[2] (.b32) and c[4] (f32) */
inline float mma_half(unsigned reg, int hi, bool bf16) {
    unsigned short h = (unsigned short)(hi ? reg >> 16 : reg & 0xffffu);
    return bf16 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
}
/* PTX's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 as a warp collective, with
 * the per-lane fragment layout of the PTX ISA ("Matrix Fragments for mma.m16n8k16", g = lane / 4,
 * t = lane % 4; each .b32 register holds two elements, the lower-numbered in its low 16 bits):
 *   A 16 x 16: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
 *   B 16 x 8:  b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]
 *   C, D 16 x 8 (f32): c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1]
 * Every lane publishes its fragments, the warp meets, each lane computes its four results from
 * everyone's (products exact in f32, sums in order of k after c), and the warp meets again before
 * the slots can be rewritten. The hardware's order of the sums is unspecified: results agree to
 * f32 rounding, not bit for bit. */
inline void mma_16816(float *d, const unsigned *a, const unsigned *b, const float *c, bool bf16) {
    State &s = st();
    const int tid = s.cur->tid, w0 = tid & ~31, lane = tid & 31, g = lane >> 2, t = lane & 3;
    memcpy(mma_slots[tid], a, 16);
    memcpy(mma_slots[tid] + 16, b, 8);
    memcpy(mma_slots[tid] + 24, c, 16);
    wait_warp();
    float r[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
        float acc = 0;
        memcpy(&acc, mma_slots[w0 + lane] + 24 + 4 * i, 4);
        for (int k = 0; k < 16; k++) {
            unsigned ra, rb;
            memcpy(&ra, mma_slots[w0 + (row % 8) * 4 + (k % 8) / 2] + 4 * ((row >= 8) + 2 * (k >= 8)), 4);
            memcpy(&rb, mma_slots[w0 + col * 4 + (k % 8) / 2] + 16 + 4 * (k >= 8), 4);
            acc = acc + mma_half(ra, k & 1, bf16) * mma_half(rb, k & 1, bf16);
        }
        r[i] = acc;
    }
    wait_warp();
    memcpy(d, r, sizeof r);
}
} /* namespace cudaemu */

template <typename T> inline void mbt_mma_16816(float *d, const unsigned *a, const unsigned *b, const float *c) {
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "mma of bf16 or f16");
    cudaemu::mma_16816(d, a, b, c, std::is_same<T, __nv_bfloat16>::value);
}
/* PTX's ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 as a warp collective: lane l names row l % 8
 * of matrix l / 8 (8 rows of 8 16-bit elements, each row 16 bytes, 16-byte aligned); lane l then
 * holds in r[i], from matrix i, the elements (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1) - or,
 * with .trans, (rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4) - the lower-numbered in the low 16
 * bits. Every lane publishes its row's address, the warp meets, each lane reads its elements, and
 * the warp meets again (as mma_16816). */
namespace cudaemu {
inline const unsigned char *ldsm_slots[MAX_THREADS];
template <bool TRANS> inline void ldmatrix_x4(unsigned *r, const void *row) {
    if ((uintptr_t)row % 16) fail("ldmatrix: a row address not aligned to 16 bytes");
    State &s = st();
    const int tid = s.cur->tid, w0 = tid & ~31, lane = tid & 31;
    ldsm_slots[tid] = (const unsigned char *)row;
    wait_warp();
    const unsigned char *const *rows = ldsm_slots + w0;
    for (int i = 0; i < 4; i++) {
        unsigned short lo, hi;
        if (TRANS) {
            memcpy(&lo, rows[8 * i + 2 * (lane & 3)] + 2 * (lane >> 2), 2);
            memcpy(&hi, rows[8 * i + 2 * (lane & 3) + 1] + 2 * (lane >> 2), 2);
        } else {
            memcpy(&lo, rows[8 * i + (lane >> 2)] + 4 * (lane & 3), 2);
            memcpy(&hi, rows[8 * i + (lane >> 2)] + 4 * (lane & 3) + 2, 2);
        }
        r[i] = lo | (unsigned)hi << 16;
    }
    wait_warp(); /* everyone has read the slots before they can be rewritten */
}
} /* namespace cudaemu */
inline void mbt_ldsm4(unsigned *r, const void *row) { cudaemu::ldmatrix_x4<false>(r, row); }
inline void mbt_ldsm4_trans(unsigned *r, const void *row) { cudaemu::ldmatrix_x4<true>(r, row); }

/* cp.async of 16 bytes: a plain copy (the emulator has no memory latency to hide); committing and
 * waiting for groups are then nothing to do. */
inline void mbt_cp_async16(void *shared, const void *global) {
    if ((uintptr_t)shared % 16 || (uintptr_t)global % 16) cudaemu::fail("cp.async: an address not aligned to 16 bytes");
    memcpy(shared, global, 16);
}
inline void mbt_cp_async_commit() {}
template <int N> inline void mbt_cp_async_wait() {}

/* ---- the exports -------------------------------------------------------------------------- */

/* build.sh ends the translation unit with
 *     static const cudaemu::Entry cudaemu_kernels[] = { MBT_EMU_KERNEL(name) ... };
 *     MBT_EMU_EXPORTS */
#define MBT_EMU_KERNEL(k)                                                                                                        \
    {#k, [](void **p) { cudaemu::call(k, p); }, [](const size_t **s) { return cudaemu::param_sizes(k, s); }},
#define MBT_EMU_EXPORTS                                                                                                          \
    extern "C" int mbt_emu_find(const char *name) {                                                                              \
        for (size_t i = 0; i < sizeof cudaemu_kernels / sizeof cudaemu_kernels[0]; i++)                                          \
            if (strcmp(cudaemu_kernels[i].name, name) == 0) return (int)i;                                                       \
        return -1;                                                                                                               \
    }                                                                                                                            \
    extern "C" int mbt_emu_launch(int k, const unsigned grid[3], const unsigned block[3], void **params, char *err,              \
                                  size_t errlen) {                                                                               \
        return cudaemu::launch(cudaemu_kernels[k].thunk, cudaemu_kernels[k].name, grid, block, params, err, errlen);             \
    }                                                                                                                            \
    extern "C" int mbt_emu_params(int k, const size_t **sizes) { return cudaemu_kernels[k].params(sizes); }

#endif
