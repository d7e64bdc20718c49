/* cuda.c - the CUDA back end's code generator (cuda.h): one Kernel -> one readable `extern "C"
 * __global__` CUDA C function, in one pass over the KIR like compiler/backend/cpu/cpu.c, after
 * cuda_scan.c's scan has made its plan (the launch geometry, split loops, vectors, 32-bit values,
 * select arms).
 *
 * Pipeline position: fuse -> kir -> [cuda] -> nvrtc (PTX, cubin) -> the executable.
 *
 * Shapes of a generated kernel (names are the KIR's: `add12` is KIR value %12, `i4` the counter of
 * loop %4, `acc3` accumulator %3, `p0` buffer parameter 0):
 *
 *   thread mode (no reduction to split): one thread per work item, a grid-stride loop
 *       for (long long gid = blockIdx.x * 256LL + threadIdx.x; gid < GRID; gid += gridDim.x * 256LL) { body }
 *     vectorised (every access that depends on gid is at exactly gid, all of them f32, i32, f16
 *     or bf16 elements, grid % 4 == 0, no loops or ifs): 4 consecutive items a thread, each buffer
 *     read or written once as a float4/int4 (16 bytes at gid0 * 4 bytes) or MbtHalf4/MbtBf16x4
 *     (8 bytes at gid0 * 2): aligned because every base is 64-byte aligned, cuda.h) and the body
 *     written once per lane (.x .y .z .w).
 *   warp and block modes (a row kernel: a top-level loop accumulating into a top-level K_ACC):
 *     every thread of the warp (block) runs the work item's body; each top-level loop that can be
 *     split (below) runs its iterations i = lane, lane + 32, ... (i = threadIdx.x, + BLOCK) with a
 *     per-thread partial accumulator started at the op's identity, then combined in a fixed tree:
 *     __shfl_xor_sync butterflies (every lane gets the same value: the ops are commutative), then
 *     in block mode the 8 warps' values through shared memory in warp order. So every value
 *     outside split loops is the same in every thread of the work item; stores made there are
 *     made by lane (thread) 0 alone. When the kernel reads a buffer it writes, a __syncwarp /
 *     __syncthreads follows each such store and each split loop that stores.
 *   A top-level loop is split when no accumulator it folds into is read inside it, it folds
 *   into no bool accumulator, and it does not both load and store one buffer (a scatter's
 *   read-modify-write); otherwise it runs whole in every thread. */
#include "cuda.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "diag.h"
#include "rt_attention_cuh.h"     /* mbt_rt_attention_cuh: runtime/kernels/rt_attention.cuh as a string (the Makefile makes it) */
#include "rt_attention_tc_cuh.h"  /* mbt_rt_attention_tc_cuh: rt_attention_tc.cuh, likewise */
#include "rt_attention_fa2_cuh.h" /* mbt_rt_attention_fa2_cuh: rt_attention_fa2.cuh, likewise */
#include "rt_kv_attention_cuh.h"  /* mbt_rt_kv_attention_cuh: rt_kv_attention.cuh, likewise */
#include "value.h"

const char *cuda_mode_name(CudaMode m) {
    switch (m) {
    case CUDA_THREAD: return "thread";
    case CUDA_WARP: return "warp";
    case CUDA_BLOCK: return "block";
    case CUDA_ATTENTION: return "attention";
    case CUDA_SCATTER: return "scatter";
    case CUDA_CE_STATS: return "ce_stats";
    case CUDA_KV_ATTN: return "kv_attention";
    }
    return "?";
}

/* ---- the prelude ---------------------------------------------------------------------------- */

static const char cuda_prelude_text[] =
    "/* Device helpers of mbt's generated kernels (compiler/cuda.c; numerics in docs/cuda.md). */\n"
    "#define MBT_INF_F __int_as_float(0x7f800000)\n"
    "#define MBT_NAN_F __int_as_float(0x7fc00000)\n"
    "#define MBT_INF_D __longlong_as_double(0x7ff0000000000000LL)\n"
    "#define MBT_NAN_D __longlong_as_double(0x7ff8000000000000LL)\n"
    "\n"
    "/* max/min: NaN when either is NaN, -0 < +0 (the CPU back end's llvm.maximum/minimum) */\n"
    "template <typename F> static __device__ __forceinline__ F mbt_fmax(F a, F b) {\n"
    "    if (a != a || b != b) return a + b;\n"
    "    if (a == b) return signbit(a) ? b : a;\n"
    "    return a > b ? a : b;\n"
    "}\n"
    "template <typename F> static __device__ __forceinline__ F mbt_fmin(F a, F b) {\n"
    "    if (a != a || b != b) return a + b;\n"
    "    if (a == b) return signbit(a) ? a : b;\n"
    "    return a < b ? a : b;\n"
    "}\n"
    "static __device__ __forceinline__ float mbt_max(float a, float b) { return mbt_fmax(a, b); }\n"
    "static __device__ __forceinline__ double mbt_max(double a, double b) { return mbt_fmax(a, b); }\n"
    "static __device__ __forceinline__ float mbt_min(float a, float b) { return mbt_fmin(a, b); }\n"
    "static __device__ __forceinline__ double mbt_min(double a, double b) { return mbt_fmin(a, b); }\n"
    "template <typename I> static __device__ __forceinline__ I mbt_max(I a, I b) { return a > b ? a : b; }\n"
    "template <typename I> static __device__ __forceinline__ I mbt_min(I a, I b) { return a < b ? a : b; }\n"
    "\n"
    "/* NumPy's remainder: the divisor's sign; float x mod 0 is NaN, integer 0; // floors, x // 0 = 0 */\n"
    "template <typename F> static __device__ __forceinline__ F mbt_fmod_np(F x, F y) {\n"
    "    F r = fmod(x, y);\n"
    "    if (r != 0 && ((r < 0) != (y < 0))) r += y;\n"
    "    if (r == 0) r = copysign((F)0, y);\n"
    "    return r;\n"
    "}\n"
    "static __device__ __forceinline__ float mbt_mod(float x, float y) { return mbt_fmod_np(x, y); }\n"
    "static __device__ __forceinline__ double mbt_mod(double x, double y) { return mbt_fmod_np(x, y); }\n"
    "template <typename I> static __device__ __forceinline__ I mbt_mod(I x, I y) {\n"
    "    if (y == 0 || y == -1) return 0;\n"
    "    I r = x % y;\n"
    "    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;\n"
    "}\n"
    "template <typename I> static __device__ __forceinline__ I mbt_div(I x, I y) {\n"
    "    if (y == 0) return 0;\n"
    "    if (y == -1) return (I)(0ULL - (unsigned long long)x); /* MIN // -1 wraps */\n"
    "    I q = x / y, r = x % y;\n"
    "    return (r != 0 && ((r < 0) != (y < 0))) ? q - 1 : q;\n"
    "}\n"
    "static __device__ __forceinline__ unsigned long long mbt_div(unsigned long long x, unsigned long long y) { return y ? x / y : 0; }\n"
    "static __device__ __forceinline__ unsigned long long mbt_mod(unsigned long long x, unsigned long long y) { return y ? x % y : 0; }\n"
    "/* index arithmetic: operands >= 0; a divisor <= 0 gives 0 */\n"
    "static __device__ __forceinline__ long long mbt_idiv(long long x, long long y) { return y > 0 ? (long long)((unsigned long long)x / (unsigned long long)y) : 0; }\n"
    "static __device__ __forceinline__ long long mbt_imod(long long x, long long y) { return y > 0 ? (long long)((unsigned long long)x % (unsigned long long)y) : 0; }\n"
    "static __device__ __forceinline__ unsigned long long mbt_shr(unsigned long long x, unsigned long long s) { return s >= 64 ? 0ULL : x >> s; }\n"
    "template <typename I> static __device__ __forceinline__ I mbt_iabs(I x) { return x < 0 ? (I)(0ULL - (unsigned long long)x) : x; }\n"
    "\n"
    "/* f32 -> bf16 bits, round to nearest even, NaN kept quiet (bit for bit the CPU back end's) */\n"
    "static __device__ __forceinline__ unsigned short mbt_bf16_bits(float x) {\n"
    "    unsigned int b = __float_as_uint(x), hi = b >> 16;\n"
    "    if (x != x) return (unsigned short)(hi | 0x40u);\n"
    "    return (unsigned short)((b + (hi & 1u) + 0x7fffu) >> 16);\n"
    "}\n"
    "static __device__ __forceinline__ float mbt_round_bf16(float x) { return __uint_as_float((unsigned int)mbt_bf16_bits(x) << 16); }\n"
    "\n"
    "/* The fixed reduction trees: a butterfly over the warp's 32 lanes (every lane ends with the same\n"
    " * value), then in block mode the warps' values in warp order through shared memory. */\n"
    "struct MbtAdd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };\n"
    "struct MbtMax { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return mbt_max(a, b); } };\n"
    "struct MbtMin { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return mbt_min(a, b); } };\n"
    "template <typename T, typename Op> static __device__ __forceinline__ T mbt_warp_reduce(T v, Op op) {\n"
    "    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n"
    "}\n"
    "template <int NWARPS, typename T, typename Op> static __device__ __forceinline__ T mbt_block_reduce(T v, Op op, unsigned char *scratch) {\n"
    "    T *s = reinterpret_cast<T *>(scratch);\n"
    "    v = mbt_warp_reduce(v, op);\n"
    "    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;\n"
    "    __syncthreads();\n"
    "    T r = s[0];\n"
    "    for (int w = 1; w < NWARPS; w++) r = op(r, s[w]);\n"
    "    __syncthreads(); /* the scratch is free for the next reduction */\n"
    "    return r;\n"
    "}\n";

void cuda_emit_prelude(FILE *out, int half, int attn, int kv) {
    fprintf(out, "/* generated by mbtc: CUDA C for NVRTC (docs/cuda.md) */\n");
    if (half) fprintf(out, "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
    fprintf(out, "\n%s", cuda_prelude_text);
    if (half)
        fprintf(out, "\n/* four f16 / bf16 elements, 8 bytes: a vectorised kernel's one access for its 4 work items */\n"
                     "struct __align__(8) MbtHalf4 { __half x, y, z, w; };\n"
                     "struct __align__(8) MbtBf16x4 { __nv_bfloat16 x, y, z, w; };\n");
    if (attn) fprintf(out, "\n#define MBT_HALF %d\n%s", half, mbt_rt_attention_cuh);
    if (attn >= CUDA_ATTN_TENSOR_CORES) fprintf(out, "\n%s", mbt_rt_attention_tc_cuh);
    if (attn == CUDA_ATTN_FA2) fprintf(out, "\n%s", mbt_rt_attention_fa2_cuh);
    if (kv) {
        if (!attn) fprintf(out, "\n#define MBT_HALF %d\n%s", half, mbt_rt_attention_cuh); /* MbtView, mbt_ld, mbt_st */
        fprintf(out, "\n%s", mbt_rt_kv_attention_cuh);
    }
}

int cuda_kernel_uses_kv(const Kernel *k) {
    const KKvAttn *a = k->kv;
    if (!a || a->D < 1 || a->D > 256 || a->Hk < 1 || a->H % a->Hk || (a->H / a->Hk) * a->D > 1024) return 0;
    if (a->dt != DT_F32 && a->dt != DT_F16 && a->dt != DT_BF16) return 0;
    return a->kv_dt == DT_F32 || a->kv_dt == DT_F16 || a->kv_dt == DT_BF16;
}

int cuda_kernel_uses_attention(const Kernel *k) {
    const KAttn *a = k->attn;
    if (!a || a->D > 128 || a->E > 128 || a->D < 1 || a->E < 1 || (a->dt != DT_F32 && a->dt != DT_F16 && a->dt != DT_BF16))
        return CUDA_ATTN_NONE;
    /* the FA2 kernels, forward and backward, for every head width up to 128: at D = E = 128 the dk-dv
     * kernel is at 255 registers (Llama-like, 8 on 2 heads, causal: no spill on sm_80 or sm_90) */
    if (a->dt != DT_F32 && a->D % 16 == 0 && a->E % 16 == 0) return CUDA_ATTN_FA2;
    /* the document mask is carried out by the FA2 kernels alone (their template argument DOCS): a
       masked attention they do not take runs the body, which masks it */
    if (a->pos.param >= 0) return CUDA_ATTN_NONE;
    return CUDA_ATTN_CUDA_CORES;
}

int cuda_attention_f32_tiled(const Kernel *k) {
    return cuda_kernel_uses_attention(k) == CUDA_ATTN_CUDA_CORES && k->attn->dt == DT_F32;
}

int cuda_kernel_uses_scatter(const Kernel *k) {
    const KScatter *s = k->scatter;
    if (!s || s->R > INT32_MAX || s->P > INT32_MAX || s->W < 1) return 0;
    if (s->dt != DT_F32 && s->dt != DT_F64 && s->dt != DT_F16 && s->dt != DT_BF16) return 0;
    /* rows of another type only widened to f32 or f64: exact, no rounding to write */
    return s->upd_dt == s->dt ||
           ((s->dt == DT_F32 || s->dt == DT_F64) && (s->upd_dt == DT_F16 || s->upd_dt == DT_BF16 || s->upd_dt == DT_F32));
}

int cuda_kernel_uses_ce(const Kernel *k) {
    const KCeStats *c = k->ce;
    return c && c->dt == DT_F32 && (c->in_dt == DT_F32 || c->in_dt == DT_F16 || c->in_dt == DT_BF16) && c->V >= 1 &&
           c->stride >= c->V && c->V <= INT32_MAX &&
           (c->grad < 0 || (c->gW >= c->V && (c->grad_dt == DT_F32 || c->grad_dt == DT_F16 || c->grad_dt == DT_BF16)));
}

int cuda_kernel_uses_half(const Kernel *k) {
    for (int p = 0; p < k->nbufs; p++)
        if (k->bufs[p].dt == DT_F16 || k->bufs[p].dt == DT_BF16) return 1;
    for (int i = 0; i < k->n; i++)
        if (k->inst[i].type == KT_F16 || k->inst[i].type == KT_BF16) return 1;
    return 0;
}

/* ---- emission: types, names, constants ------------------------------------------------------ */

/* The C type a KIR value is computed in: f16 and bf16 in float. */
static const char *cuda_value_type(const CudaEmit *E, KType t) {
    switch (t) {
    case KT_BOOL: return "bool";
    case KT_I32: return "int";
    case KT_I64: return "long long";
    case KT_U64: return "unsigned long long";
    case KT_F16:
    case KT_BF16:
    case KT_F32: return "float";
    case KT_F64: return "double";
    default: INTERNAL("cuda: %s: no C type for a %s value", E->k->name, kir_type_name(t));
    }
}

/* The C type a buffer element is stored as. */
const char *cuda_memory_type(const CudaEmit *E, DType dt) {
    switch (dt) {
    case DT_F32: return "float";
    case DT_F64: return "double";
    case DT_F16: return "__half";
    case DT_BF16: return "__nv_bfloat16";
    case DT_I32: return "int";
    case DT_I64: return "long long";
    case DT_BOOL: return "unsigned char";
    default: INTERNAL("cuda: %s: no memory type for dtype %d", E->k->name, (int)dt);
    }
}

static int cuda_is_float(KType t) { return kir_type_is_float(t); }

/* x / c or x % c in index arithmetic (x >= 0, c > 0 a constant), exact either way: in 32 bits when
 * x is below 2^32 (u32: the work item - gid, or a vector's first gid0, below a grid of at most 2^32
 * - or a value whose range says so, cuda_ranges) and c fits, where the GPU divides in a
 * multiply-high and a shift - a 64-bit division by a constant is several times as many
 * instructions, and elementwise kernels over a padded vocabulary (GPT-2's classifier gradient: a
 * division and a remainder by 50,304 an element) were bound by them. `as` is the result's C type
 * (int for a narrowed value). */
static const char *cuda_index_divmod(Arena *ar, const char *as, const char *x, int u32, int mod, int64_t c) {
    if (u32 && c <= (int64_t)UINT32_MAX) return arena_printf(ar, "(%s)((unsigned)%s %c %" PRId64 "U)", as, x, mod ? '%' : '/', c);
    return arena_printf(ar, "(%s)((unsigned long long)%s %c %" PRId64 "ULL)", as, x, mod ? '%' : '/', c);
}

/* A value's name: `add12`, `load7`, `i4` (a loop counter), `acc3`, `gid`. */
static const char *cuda_name(CudaEmit *E, int id) {
    const KInst *in = &E->k->inst[id];
    switch (in->op) {
    case K_GID: return "gid";
    case K_LOOP: return arena_printf(E->ar, "i%d", id);
    default: return arena_printf(E->ar, "%s%d", kir_op_name(in->op), id);
    }
}

/* A float literal of type t (f16/bf16/f32 as float, exactly the f32 the CPU's LLVMConstReal makes). */
const char *cuda_float_literal(CudaEmit *E, KType t, double v) {
    int dbl = t == KT_F64;
    if (isnan(v)) return dbl ? "MBT_NAN_D" : "MBT_NAN_F";
    if (isinf(v)) return v < 0 ? (dbl ? "(-MBT_INF_D)" : "(-MBT_INF_F)") : (dbl ? "MBT_INF_D" : "MBT_INF_F");
    char buf[64];
    if (dbl) snprintf(buf, sizeof buf, "%.17g", v);
    else snprintf(buf, sizeof buf, "%.9g", (double)(float)v);
    const char *s = arena_printf(E->ar, "%s%s%s", buf, strpbrk(buf, ".e") ? "" : ".0", dbl ? "" : "f");
    return s[0] == '-' ? arena_printf(E->ar, "(%s)", s) : s;
}

static const char *cuda_const(CudaEmit *E, const KInst *in) {
    switch (in->type) {
    case KT_BOOL: return in->i ? "true" : "false";
    case KT_I32: return arena_printf(E->ar, in->i < 0 ? "(%" PRId64 ")" : "%" PRId64, in->i);
    case KT_I64:
        if (in->i == INT64_MIN) return "(-9223372036854775807LL - 1)";
        return arena_printf(E->ar, in->i < 0 ? "(%" PRId64 "LL)" : "%" PRId64 "LL", in->i);
    case KT_U64: return arena_printf(E->ar, "%" PRIu64 "ULL", (uint64_t)in->i);
    default: return cuda_float_literal(E, in->type, in->f);
    }
}

/* Operand a as an expression: a constant inline, else the value's (or accumulator's) name. An
 * i64 operand of an instruction written in 32 bits (CudaPlan.ctx32: every i64 operand in range)
 * is an int: a constant without its LL, a narrowed value as it is, any other (gid, a loop's
 * counter, a value that varies with one) cast, exact as it is in range;
 * elsewhere a narrowed value is widened, so that the arithmetic stays 64-bit where it must (and
 * mbt_max's and mbt_min's templates see one type). */
static const char *cuda_operand(CudaEmit *E, int a) {
    const KInst *in = &E->k->inst[a];
    if (in->type == KT_I64 && E->P.known) {
        if (E->ctx32 && in->op == K_CONST) return arena_printf(E->ar, in->i < 0 ? "(%" PRId64 ")" : "%" PRId64, in->i);
        if (E->ctx32 && !E->P.narrow[a]) return arena_printf(E->ar, "(int)%s", cuda_name(E, a)); /* in range: exact */
        if (!E->ctx32 && E->P.narrow[a]) return arena_printf(E->ar, "(long long)%s", cuda_name(E, a));
    }
    if (in->op == K_CONST) return cuda_const(E, in);
    return cuda_name(E, a);
}

void cuda_line(CudaEmit *E, const char *fmt, ...) {
    fprintf(E->out, "%*s", E->indent * 4, "");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(E->out, fmt, ap);
    va_end(ap);
    fputc('\n', E->out);
}

static void cuda_define(CudaEmit *E, int id, const char *expr) {
    const char *t = E->P.narrow && E->P.narrow[id] ? "int" : cuda_value_type(E, E->k->inst[id].type);
    cuda_line(E, "const %s %s = %s;", t, cuda_name(E, id), expr);
}

/* ---- emission: expressions -------------------------------------------------------------------- */

static const char *cuda_binary(CudaEmit *E, const KInst *in, int id) {
    const char *x = cuda_operand(E, in->a[0]), *y = cuda_operand(E, in->a[1]);
    KType t = in->type;
    Arena *ar = E->ar;
    if (cuda_is_float(t)) {
        int f = t != KT_F64;
        switch (in->op) {
        case K_ADD: return arena_printf(ar, "%s + %s", x, y);
        case K_SUB: return arena_printf(ar, "%s - %s", x, y);
        case K_MUL: return arena_printf(ar, "%s * %s", x, y);
        case K_DIV: return arena_printf(ar, "%s / %s", x, y);
        case K_MOD: return arena_printf(ar, "mbt_mod(%s, %s)", x, y);
        case K_POW: return arena_printf(ar, "%s(%s, %s)", f ? "powf" : "pow", x, y);
        case K_MAX: return arena_printf(ar, "mbt_max(%s, %s)", x, y);
        case K_MIN: return arena_printf(ar, "mbt_min(%s, %s)", x, y);
        default: break;
        }
    } else if (t == KT_BOOL) {
        switch (in->op) { /* NumPy's bool arithmetic, as the CPU back end's */
        case K_ADD:
        case K_MAX: return arena_printf(ar, "%s || %s", x, y);
        case K_MUL:
        case K_MIN: return arena_printf(ar, "%s && %s", x, y);
        case K_SUB: return arena_printf(ar, "%s != %s", x, y);
        default: break;
        }
    } else {
        switch (in->op) {
        case K_ADD: return arena_printf(ar, "%s + %s", x, y);
        case K_SUB: return arena_printf(ar, "%s - %s", x, y);
        case K_MUL: return arena_printf(ar, "%s * %s", x, y);
        case K_DIV: return arena_printf(ar, "mbt_div(%s, %s)", x, y);
        case K_MOD: return arena_printf(ar, "mbt_mod(%s, %s)", x, y);
        case K_MAX: return arena_printf(ar, "mbt_max(%s, %s)", x, y);
        case K_MIN: return arena_printf(ar, "mbt_min(%s, %s)", x, y);
        case K_IDIV:
        case K_IMOD: {
            const KInst *d = &E->k->inst[in->a[1]];
            int mod = in->op == K_IMOD;
            if (d->op == K_CONST && d->i > 0) { /* unsigned: a power of two is a shift or a mask */
                int a = in->a[0], u32 = E->P.known[a] && E->P.lo[a] >= 0 && E->P.hi[a] <= (int64_t)UINT32_MAX;
                KOp xop = E->k->inst[a].op;
                return cuda_index_divmod(ar, E->P.narrow[id] ? "int" : "long long",
                                         u32 && (xop == K_GID || xop == K_LOOP) ? cuda_name(E, a) : x, u32, mod, d->i);
            }
            return arena_printf(ar, "%s(%s, %s)", mod ? "mbt_imod" : "mbt_idiv", x, y);
        }
        case K_XOR: return arena_printf(ar, "%s ^ %s", x, y);
        case K_SHR: {
            const KInst *s = &E->k->inst[in->a[1]];
            if (s->op == K_CONST && (uint64_t)s->i < 64) return arena_printf(ar, "%s >> %s", x, y);
            return arena_printf(ar, "mbt_shr(%s, %s)", x, y);
        }
        default: break;
        }
    }
    INTERNAL("cuda: %s: %%%d: no lowering of %s on %s", E->k->name, id, kir_op_name(in->op), kir_type_name(t));
}

static const char *cuda_unary(CudaEmit *E, const KInst *in, int id) {
    const char *x = cuda_operand(E, in->a[0]);
    KType t = in->type;
    if (!cuda_is_float(t)) {
        if (in->op == K_NEG && t != KT_BOOL) return arena_printf(E->ar, "-%s", x);
        if (in->op == K_ABS && (t == KT_I32 || t == KT_I64)) return arena_printf(E->ar, "mbt_iabs(%s)", x);
        if (in->op == K_ABS || in->op == K_NEG) return x; /* u64, bool */
        INTERNAL("cuda: %s: %%%d: no lowering of %s on %s", E->k->name, id, kir_op_name(in->op), kir_type_name(t));
    }
    const char *sfx = t == KT_F64 ? "" : "f";
    switch (in->op) {
    case K_NEG: return arena_printf(E->ar, "-%s", x);
    case K_ABS: return arena_printf(E->ar, "fabs%s(%s)", sfx, x);
    case K_EXP: return arena_printf(E->ar, "exp%s(%s)", sfx, x);
    case K_LOG: return arena_printf(E->ar, "log%s(%s)", sfx, x);
    case K_SQRT: return arena_printf(E->ar, "sqrt%s(%s)", sfx, x);
    case K_TANH: return arena_printf(E->ar, "tanh%s(%s)", sfx, x);
    case K_SIN: return arena_printf(E->ar, "sin%s(%s)", sfx, x);
    case K_COS: return arena_printf(E->ar, "cos%s(%s)", sfx, x);
    case K_FLOOR: return arena_printf(E->ar, "floor%s(%s)", sfx, x);
    default: INTERNAL("cuda: %s: %%%d: no lowering of %s", E->k->name, id, kir_op_name(in->op));
    }
}

/* An f32 expression rounded to t's precision (f16, bf16), still a float. */
static const char *cuda_round_to(CudaEmit *E, KType t, const char *x) {
    if (t == KT_F16) return arena_printf(E->ar, "__half2float(__float2half_rn(%s))", x);
    if (t == KT_BF16) return arena_printf(E->ar, "mbt_round_bf16(%s)", x);
    return x;
}

static const char *cuda_cast(CudaEmit *E, const KInst *in) {
    const char *x = cuda_operand(E, in->a[0]);
    KType from = E->k->inst[in->a[0]].type, to = in->type;
    if (from == to) return x;
    int narrow = to == KT_F16 || to == KT_BF16;
    if (cuda_is_float(from) && cuda_is_float(to)) {
        const char *v = x;
        if (from == KT_F64 && to != KT_F64) v = arena_printf(E->ar, "(float)%s", x);
        else if (to == KT_F64) v = arena_printf(E->ar, "(double)%s", x);
        return narrow ? cuda_round_to(E, to, v) : v;
    }
    if (cuda_is_float(from)) { /* truncates, saturates, NaN -> 0 (PTX cvt.rzi) */
        const char *d = from == KT_F64 ? "double" : "float";
        switch (to) {
        case KT_BOOL: return arena_printf(E->ar, "%s != %s", x, from == KT_F64 ? "0.0" : "0.0f");
        case KT_I32: return arena_printf(E->ar, "__%s2int_rz(%s)", d, x);
        case KT_I64: return arena_printf(E->ar, "__%s2ll_rz(%s)", d, x);
        case KT_U64: return arena_printf(E->ar, "__%s2ull_rz(%s)", d, x);
        default: break;
        }
    }
    if (cuda_is_float(to)) {
        const char *v = arena_printf(E->ar, "(%s)%s", to == KT_F64 ? "double" : "float", x);
        return narrow ? cuda_round_to(E, to, v) : v;
    }
    if (to == KT_BOOL) return arena_printf(E->ar, "%s != 0", x);
    return arena_printf(E->ar, "(%s)%s", cuda_value_type(E, to), x);
}

/* ---- emission: memory ------------------------------------------------------------------------ */

static const char *cuda_vec_lane(int lane) { return lane == 0 ? "x" : lane == 1 ? "y" : lane == 2 ? "z" : "w"; }

/* The type of 4 consecutive elements, read or written at once by the vectorised kernels. */
static const char *cuda_vec_type(DType dt) {
    switch (dt) {
    case DT_F32: return "float4";
    case DT_I32: return "int4";
    case DT_F16: return "MbtHalf4";
    case DT_BF16: return "MbtBf16x4";
    default: INTERNAL("cuda: no vector type for dtype %d", (int)dt);
    }
}

/* The same, while a lane of the vectorised body is being written. */
static int cuda_at_gid(const CudaEmit *E, const KInst *in) { return E->lane >= 0 && cuda_vec_access(&E->P, E->k, in); }

static void cuda_load(CudaEmit *E, const KInst *in, int id) {
    DType dt = E->k->bufs[in->buf].dt;
    const char *elem = !cuda_at_gid(E, in)                 ? arena_printf(E->ar, "p%d[%s]", in->buf, cuda_operand(E, in->a[0]))
                       : E->P.vec[in->buf] == CUDA_VEC_DIV ? arena_printf(E->ar, "p%ds", in->buf)
                                                           : arena_printf(E->ar, "p%dv.%s", in->buf, cuda_vec_lane(E->lane));
    switch (dt) {
    case DT_BOOL: cuda_define(E, id, arena_printf(E->ar, "%s != 0", elem)); return;
    case DT_F16: cuda_define(E, id, arena_printf(E->ar, "__half2float(%s)", elem)); return;
    case DT_BF16: cuda_define(E, id, arena_printf(E->ar, "__bfloat162float(%s)", elem)); return;
    default: cuda_define(E, id, elem); return;
    }
}

static void cuda_sync(CudaEmit *E) { cuda_line(E, "%s", E->P.launch.mode == CUDA_WARP ? "__syncwarp();" : "__syncthreads();"); }

static void cuda_store(CudaEmit *E, const KInst *in) {
    DType dt = E->k->bufs[in->buf].dt;
    const char *v = cuda_operand(E, in->a[1]);
    switch (dt) {
    case DT_BOOL: v = arena_printf(E->ar, "(unsigned char)%s", v); break;
    case DT_F16: v = arena_printf(E->ar, "__float2half_rn(%s)", v); break;
    case DT_BF16: v = arena_printf(E->ar, "__ushort_as_bfloat16(mbt_bf16_bits(%s))", v); break;
    default: break;
    }
    if (cuda_at_gid(E, in)) {
        cuda_line(E, "p%dv.%s = %s;", in->buf, cuda_vec_lane(E->lane), v);
        return;
    }
    const char *st = arena_printf(E->ar, "p%d[%s] = %s;", in->buf, cuda_operand(E, in->a[0]), v);
    if (E->P.launch.mode != CUDA_THREAD && E->in_split < 0) {
        /* every thread of the work item has the value: one stores it */
        cuda_line(E, "if (%s == 0) %s", E->P.launch.mode == CUDA_WARP ? "lane" : "threadIdx.x", st);
        if (E->P.needs_sync) cuda_sync(E);
    } else cuda_line(E, "%s", st);
}

/* ---- emission: accumulators and control ------------------------------------------------------ */

/* The identity of an accumulator's combine op: where a thread's partial starts. */
static const char *cuda_identity(CudaEmit *E, const KInst *acc) {
    KType t = acc->type;
    if (acc->aop == K_ADD) return cuda_is_float(t) ? (t == KT_F64 ? "0.0" : "0.0f") : "0";
    int mx = acc->aop == K_MAX; /* identity of max is the lowest value */
    switch (t) {
    case KT_F64: return mx ? "(-MBT_INF_D)" : "MBT_INF_D";
    case KT_F16:
    case KT_BF16:
    case KT_F32: return mx ? "(-MBT_INF_F)" : "MBT_INF_F";
    case KT_I32: return mx ? "(-2147483647 - 1)" : "2147483647";
    case KT_I64: return mx ? "(-9223372036854775807LL - 1)" : "9223372036854775807LL";
    case KT_U64: return mx ? "0ULL" : "18446744073709551615ULL";
    default: INTERNAL("cuda: %s: no identity for a %s accumulator", E->k->name, kir_type_name(t));
    }
}

static const char *cuda_combine(CudaEmit *E, KOp aop, const char *a, const char *b) {
    switch (aop) {
    case K_ADD: return arena_printf(E->ar, "%s + %s", a, b);
    case K_MAX: return arena_printf(E->ar, "mbt_max(%s, %s)", a, b);
    case K_MIN: return arena_printf(E->ar, "mbt_min(%s, %s)", a, b);
    default: INTERNAL("cuda: %s: accumulator combine op %s", E->k->name, kir_op_name(aop));
    }
}

static void cuda_accum(CudaEmit *E, const KInst *in, int id) {
    int a = in->a[0];
    const KInst *acc = &E->k->inst[a];
    if (acc->op != K_ACC) INTERNAL("cuda: %s: %%%d accumulates into %%%d, not an acc", E->k->name, id, a);
    const char *nm = cuda_name(E, a);
    if (E->in_split >= 0 && a < E->in_split) nm = arena_printf(E->ar, "%s_part", nm);
    if (acc->type == KT_BOOL) {
        const char *v = cuda_operand(E, in->a[1]);
        cuda_line(E, "%s = %s %s %s;", nm, nm, acc->aop == K_MIN ? "&&" : "||", v);
        return;
    }
    cuda_line(E, "%s = %s;", nm, cuda_combine(E, acc->aop, nm, cuda_operand(E, in->a[1])));
}

/* The accumulators declared before split loop `loop` that it folds into, each once. */
static int cuda_split_accs(CudaEmit *E, int loop, int *accs) {
    const Kernel *k = E->k;
    int n = 0;
    for (int j = loop + 1; j < E->P.end[loop]; j++) {
        if (k->inst[j].op != K_ACCUM || k->inst[j].a[0] >= loop) continue;
        int seen = 0;
        for (int q = 0; q < n; q++) seen |= accs[q] == k->inst[j].a[0];
        if (!seen) accs[n++] = k->inst[j].a[0];
    }
    return n;
}

static void cuda_loop(CudaEmit *E, const KInst *in, int id) {
    const char *ext = in->nin ? cuda_operand(E, in->a[0]) : arena_printf(E->ar, "%" PRId64 "LL", in->i);
    const char *i = cuda_name(E, id);
    if (!E->P.split[id]) {
        cuda_line(E, "for (long long %s = 0; %s < %s; %s++) {", i, i, ext, i);
        E->indent++;
        return;
    }
    int warp = E->P.launch.mode == CUDA_WARP;
    int *accs = arena_alloc(E->ar, sizeof(int) * (size_t)(E->k->n + 1));
    int n = cuda_split_accs(E, id, accs);
    cuda_line(E, "/* loop %%%d split across the %s's %s */", id, warp ? "warp" : "block", warp ? "lanes" : "threads");
    for (int q = 0; q < n; q++) {
        const KInst *acc = &E->k->inst[accs[q]];
        cuda_line(E, "%s %s_part = %s;", cuda_value_type(E, acc->type), cuda_name(E, accs[q]), cuda_identity(E, acc));
    }
    cuda_line(E, "for (long long %s = %s; %s < %s; %s += %d) {", i, warp ? "lane" : "threadIdx.x", i, ext, i,
              warp ? 32 : E->P.launch.block);
    E->indent++;
    E->in_split = id;
}

static void cuda_endloop(CudaEmit *E, int id) {
    E->indent--;
    cuda_line(E, "}");
    int loop = -1;
    for (int j = id - 1; j >= 0; j--)
        if (E->k->inst[j].op == K_LOOP && E->P.end[j] == id) {
            loop = j;
            break;
        }
    if (loop < 0 || loop != E->in_split) return;
    E->in_split = -1;
    int warp = E->P.launch.mode == CUDA_WARP;
    int *accs = arena_alloc(E->ar, sizeof(int) * (size_t)(E->k->n + 1));
    int n = cuda_split_accs(E, loop, accs);
    for (int q = 0; q < n; q++) {
        const KInst *acc = &E->k->inst[accs[q]];
        const char *nm = cuda_name(E, accs[q]);
        const char *op = acc->aop == K_ADD ? "MbtAdd()" : acc->aop == K_MAX ? "MbtMax()" : "MbtMin()";
        const char *tree =
            warp ? arena_printf(E->ar, "mbt_warp_reduce(%s_part, %s)", nm, op)
                 : arena_printf(E->ar, "mbt_block_reduce<%d>(%s_part, %s, mbt_scratch)", E->P.launch.block / 32, nm, op);
        cuda_line(E, "%s = %s;", nm, cuda_combine(E, acc->aop, nm, tree));
    }
    if (E->P.needs_sync) {
        int stores = 0;
        for (int j = loop + 1; j < id; j++) stores |= E->k->inst[j].op == K_STORE;
        if (stores) cuda_sync(E);
    }
}

/* ---- emission: one instruction, one kernel ---------------------------------------------------- */

static void cuda_inst(CudaEmit *E, int id) {
    const KInst *in = &E->k->inst[id];
    E->ctx32 = E->P.ctx32 && E->P.ctx32[id];
    switch (in->op) {
    case K_CONST: return; /* inline in its uses */
    case K_GID: return;   /* the work-item loop's variable */
    case K_LOOP: cuda_loop(E, in, id); return;
    case K_ENDLOOP: cuda_endloop(E, id); return;
    case K_IF:
        cuda_line(E, "if (%s) {", cuda_operand(E, in->a[0]));
        E->indent++;
        return;
    case K_ENDIF:
        E->indent--;
        cuda_line(E, "}");
        return;
    case K_ACC: cuda_line(E, "%s %s = %s;", cuda_value_type(E, in->type), cuda_name(E, id), cuda_const(E, in)); return;
    case K_ACCUM: cuda_accum(E, in, id); return;
    case K_LOAD: cuda_load(E, in, id); return;
    case K_STORE: cuda_store(E, in); return;
    case K_SELECT:
        cuda_define(
            E, id,
            arena_printf(E->ar, "%s ? %s : %s", cuda_operand(E, in->a[0]), cuda_operand(E, in->a[1]), cuda_operand(E, in->a[2])));
        return;
    case K_CAST: /* an i32 (or bool) widened to an i64 that is narrowed: the int itself */
        if (E->P.narrow && E->P.narrow[id] && E->k->inst[in->a[0]].type != KT_I64) {
            cuda_define(E, id, arena_printf(E->ar, "(int)%s", cuda_operand(E, in->a[0])));
            return;
        }
        cuda_define(E, id, cuda_cast(E, in));
        return;
    case K_AND: cuda_define(E, id, arena_printf(E->ar, "%s && %s", cuda_operand(E, in->a[0]), cuda_operand(E, in->a[1]))); return;
    case K_OR: cuda_define(E, id, arena_printf(E->ar, "%s || %s", cuda_operand(E, in->a[0]), cuda_operand(E, in->a[1]))); return;
    case K_NOT: cuda_define(E, id, arena_printf(E->ar, "!%s", cuda_operand(E, in->a[0]))); return;
    default: break;
    }
    if (in->op >= K_ADD && in->op <= K_SHR) cuda_define(E, id, cuda_binary(E, in, id));
    else if (in->op >= K_NEG && in->op <= K_FLOOR) cuda_define(E, id, cuda_unary(E, in, id));
    else if (in->op >= K_EQ && in->op <= K_GE) {
        static const char *const cmp[] = {"==", "!=", "<", "<=", ">", ">="}; /* C's: ordered, != unordered */
        cuda_define(E, id,
                    arena_printf(E->ar, "%s %s %s", cuda_operand(E, in->a[0]), cmp[in->op - K_EQ], cuda_operand(E, in->a[1])));
    } else INTERNAL("cuda: %s: %%%d: unknown op %d", E->k->name, id, (int)in->op);
}

/* The body; in a vectorised lane, without the offsets only its vector accesses used (gid mod N,
 * gid / M: the vectors were read at gid0's). */
static void cuda_body_inst(CudaEmit *E, int id, const unsigned char *used);

/* Select %s with an arm of its own (CudaPlan.arm): an if/else, each side its arm's instructions
 * and the assignment. */
static void cuda_select_arms(CudaEmit *E, int s, const unsigned char *used) {
    const KInst *in = &E->k->inst[s];
    const char *t = E->P.narrow[s] ? "int" : cuda_value_type(E, in->type), *nm = cuda_name(E, s);
    cuda_line(E, "%s %s; /* each arm's own offsets and loads where it is taken */", t, nm);
    E->ctx32 = 0;
    cuda_line(E, "if (%s) {", cuda_operand(E, in->a[0]));
    for (int side = 1; side <= 2; side++) {
        E->indent++;
        for (int j = 0; j < s; j++)
            if (E->P.arm[j] == 2 * s + side) cuda_body_inst(E, j, used);
        E->ctx32 = E->P.ctx32[s];
        cuda_line(E, "%s = %s;", nm, cuda_operand(E, in->a[side]));
        E->indent--;
        cuda_line(E, "%s", side == 1 ? "} else {" : "}");
    }
}

static void cuda_body_inst(CudaEmit *E, int id, const unsigned char *used) {
    KOp op = E->k->inst[id].op;
    if (used && !used[id] && (op == K_IMOD || op == K_IDIV)) return;
    if (op == K_SELECT)
        for (int j = 0; j < id; j++)
            if (E->P.arm[j] == 2 * id + 1 || E->P.arm[j] == 2 * id + 2) {
                cuda_select_arms(E, id, used);
                return;
            }
    cuda_inst(E, id);
}

static void cuda_body(CudaEmit *E) {
    const Kernel *k = E->k;
    unsigned char *used = NULL;
    if (E->lane >= 0) {
        used = arena_alloc(E->ar, (size_t)k->n + 1);
        for (int i = 0; i < k->n; i++) {
            const KInst *in = &k->inst[i];
            for (int a = 0; a < in->nin; a++)
                if (a > 0 || !((in->op == K_LOAD || in->op == K_STORE) && cuda_vec_access(&E->P, k, in))) used[in->a[a]] = 1;
        }
    }
    for (int i = 0; i < k->n; i++)
        if (!E->P.arm[i]) cuda_body_inst(E, i, used);
}

/* text as ` * ` comment lines, each prefixed with lead. */
static void cuda_comment_lines(FILE *out, const char *lead, const char *text) {
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, '\n');
        int n = e ? (int)(e - p) : (int)strlen(p);
        fprintf(out, " *%s%.*s\n", lead, n, p);
        p += n + (e ? 1 : 0);
    }
}

static void cuda_header(CudaEmit *E, const char *note) {
    const Kernel *k = E->k;
    const CudaLaunch *L = &E->P.launch;
    FILE *out = E->out;
    fprintf(out, "/* kernel %s: %s, grid %" PRId64, k->name, kir_kind_name(k->kind), k->grid);
    if (k->nsegments > 1) fprintf(out, ", %d segments", k->nsegments);
    fprintf(out, "\n * launch: %s mode, block %d, %" PRId64 " blocks, %d B shared", cuda_mode_name(L->mode), L->block, L->blocks,
            L->shared);
    if (L->mode == CUDA_WARP) fprintf(out, " (a warp per work item, %d per block)", L->block / 32);
    if (L->mode == CUDA_BLOCK) fprintf(out, " (a block per work item)");
    if (L->mode == CUDA_CE_STATS)
        fprintf(out, " (a block per row: cross-entropy's statistics in one online pass%s, docs/cuda.md)",
                k->ce->grad < 0            ? ""
                : k->ce->grad == k->ce->in ? ", then the gradient over the logits"
                                           : ", then the gradient");
    if (L->mode == CUDA_SCATTER)
        fprintf(out, " (%" PRId64 " output rows a block: the segmented scatter_add, docs/cuda.md)", L->per_block);
    if (L->mode == CUDA_ATTENTION)
        fprintf(out, " (%" PRId64 " rows a block; the body: runtime/kernels/%s)", L->per_block,
                cuda_kernel_uses_attention(k) == CUDA_ATTN_FA2 ? "rt_attention_fa2.cuh, flash-attention-2 on the tensor cores"
                : cuda_kernel_uses_attention(k) == CUDA_ATTN_TENSOR_CORES ? "rt_attention_tc.cuh, on the tensor cores"
                : cuda_attention_f32_tiled(k) ? "rt_attention.cuh, mbt_attn_f32t_*: the flash-attention-2 tiling in f32"
                                              : "rt_attention.cuh");
    if (L->mode == CUDA_KV_ATTN)
        fprintf(out, " (a block per row and key/value head, the keys split across its 4 warps; the body: "
                     "runtime/kernels/rt_kv_attention.cuh)");
    if (L->vector > 1) fprintf(out, " (%d work items a thread: vector loads and stores)", L->vector);
    fprintf(out, "\n");
    if (note && *note) {
        fprintf(out, " * fuses:\n");
        cuda_comment_lines(out, "   ", note);
    }
    fprintf(out, " * buffers:\n");
    for (int p = 0; p < k->nbufs; p++) {
        const KBuf *bf = &k->bufs[p];
        fprintf(out, " *   p%d: %s[", p, dtype_name(bf->dt));
        for (int d = 0; d < bf->rank; d++) fprintf(out, "%s%" PRId64, d ? ", " : "", bf->shape[d]);
        fprintf(out, "] %s, buffer %d", bf->written ? (kir_loads(k, p) ? "read and written" : "written") : "read", bf->buffer);
        if (bf->node >= 0) fprintf(out, " (%%%d)", bf->node);
        fprintf(out, "\n");
    }
    fprintf(out, " */\n");
}

/* Params: const and __restrict__ as cuda.h says. */
static void cuda_params(CudaEmit *E, int disjoint) {
    const Kernel *k = E->k;
    for (int p = 0; p < k->nbufs; p++) {
        int shared = 0;
        for (int q = 0; q < k->nbufs; q++) shared |= q != p && k->bufs[q].buffer == k->bufs[p].buffer;
        const KBuf *bf = &k->bufs[p];
        fprintf(E->out, "%s    %s%s *%sp%d", p ? ",\n" : "\n", bf->written ? "" : "const ", cuda_memory_type(E, bf->dt),
                disjoint && !shared ? "__restrict__ " : "", p);
    }
    if (k->ranged) fprintf(E->out, ",\n    long long mbt_lo, long long mbt_hi /* the work items run: [lo, hi) */");
}

void cuda_emit_kernel(FILE *out, const Kernel *k, const char *note, int disjoint, CudaLaunch *launch) {
    if (kir_verify(k, stderr)) INTERNAL("cuda: kernel %s fails kir_verify (problems above)", k->name);
    Arena scratch = {0};
    CudaEmit E = {.out = out, .k = k, .ar = &scratch, .lane = -1, .in_split = -1};
    cuda_scan(k, &E.P, &scratch);
    const CudaLaunch *L = &E.P.launch;
    if (launch) *launch = *L;
    cuda_header(&E, note);
    /* at least 65536 / (block x 128) blocks an SM: a budget of 128 registers a thread. With the
     * block size alone ptxas aims at full occupancy (32 registers on sm_90) and spills row kernels.
     * The tensor-core attention kernels keep 16 rows' statistics (and the forward their outputs) a
     * lane: 2 blocks an SM (255 registers), which their 37-47 KB of shared memory allows anyway.
     * The flash-attention-2 forward with D + E <= 128 asks for 3 (170 registers): GPT-2's (D 64,
     * causal) takes 168 without spills on sm_90. Measured on an H200 (bench/attention, GPT-2's
     * shape; docs/cuda.md): 0.2247 ms at 3 blocks, 0.2209 ms at 4 (128 registers, 32 bytes
     * spilled: the cuda layer refuses spills), 0.2594 ms with two tiles of 16 rows a warp at 2. */
    int min_blocks = cuda_kernel_uses_attention(k) >= CUDA_ATTN_TENSOR_CORES ? 2 : 65536 / (L->block * CUDA_REGISTER_BUDGET);
    if (cuda_kernel_uses_attention(k) == CUDA_ATTN_FA2 && k->attn->op == KA_FORWARD && k->attn->D + k->attn->E <= 128)
        min_blocks = 3;
    fprintf(out, "extern \"C\" __global__ void __launch_bounds__(%d, %d) %s(", L->block, min_blocks, k->name);
    cuda_params(&E, disjoint);
    fprintf(out, ") {\n");
    E.indent = 1;
    if (L->mode == CUDA_CE_STATS) {
        cuda_ce_body(&E);
        fprintf(out, "}\n");
        arena_free(&scratch);
        return;
    }
    if (L->mode == CUDA_SCATTER) {
        cuda_scatter_body(&E);
        fprintf(out, "}\n");
        arena_free(&scratch);
        return;
    }
    if (L->mode == CUDA_KV_ATTN) {
        cuda_kv_attention_call(&E);
        fprintf(out, "}\n");
        arena_free(&scratch);
        return;
    }
    if (L->mode == CUDA_ATTENTION) {
        cuda_attention_call(&E);
        fprintf(out, "}\n");
        arena_free(&scratch);
        return;
    }
    if (k->ranged && L->mode != CUDA_THREAD) INTERNAL("cuda: %s: a ranged kernel that is not a thread a work item", k->name);
    if (L->mode == CUDA_THREAD && L->vector > 1 && k->ranged) {
        /* ZeRO's shard [lo, hi): lo is 0 or a shard boundary (a multiple of 16384), hi one or the
         * grid, which is a multiple of 4 here: whole vectors */
        cuda_line(&E,
                  "for (long long chunk = (mbt_lo >> 2) + blockIdx.x * %dLL + threadIdx.x; chunk < (mbt_hi >> 2); chunk += "
                  "gridDim.x * %dLL) {",
                  L->block, L->block);
    } else if (L->mode == CUDA_THREAD && L->vector > 1) {
        cuda_line(&E,
                  "for (long long chunk = blockIdx.x * %dLL + threadIdx.x; chunk < %" PRId64 "LL; chunk += gridDim.x * %dLL) {",
                  L->block, k->grid / L->vector, L->block);
    }
    if (L->mode == CUDA_THREAD && L->vector > 1) {
        E.indent++;
        cuda_line(&E, "const long long gid0 = chunk * 4;");
        /* one access per buffer at gid, 16 bytes (4-byte elements) or 8 (f16, bf16): the base is
         * 64-byte aligned and gid0 * 4 (* 2) bytes a multiple of 16 (8) (cuda.h) */
        for (int p = 0; p < k->nbufs; p++) {
            int loaded = 0, stored = 0;
            for (int i = 0; i < k->n; i++) {
                const KInst *in = &k->inst[i];
                if (in->buf != p || (in->op != K_LOAD && in->op != K_STORE) || !cuda_vec_access(&E.P, k, in)) continue;
                loaded |= in->op == K_LOAD;
                stored |= in->op == K_STORE;
            }
            if (!loaded && !stored) continue; /* read at constant offsets only (dropout's i64 key), or not at all */
            const char *vt = cuda_vec_type(k->bufs[p].dt);
            int n = E.P.vec_n[p];
            if (loaded && E.P.vec[p] == CUDA_VEC_GID) /* stored too: in place, the lanes' old values first */
                cuda_line(&E, "%s%s p%dv = *reinterpret_cast<const %s *>(p%d + gid0);", stored ? "" : "const ", vt, p, vt, p);
            if (loaded && E.P.vec[p] == CUDA_VEC_MOD) /* gid0 mod N: a multiple of 4, as gid0 is */
                cuda_line(&E, "const %s p%dv = *reinterpret_cast<const %s *>(p%d + %s);", vt, p, vt, p,
                          cuda_index_divmod(E.ar, "long long", "gid0", k->grid <= (int64_t)UINT32_MAX, 1, n));
            if (loaded && E.P.vec[p] == CUDA_VEC_DIV) /* the same element for the four */
                cuda_line(&E, "const %s p%ds = p%d[%s];", cuda_memory_type(&E, k->bufs[p].dt), p, p,
                          cuda_index_divmod(E.ar, "long long", "gid0", k->grid <= (int64_t)UINT32_MAX, 0, n));
            if (stored && !loaded) cuda_line(&E, "%s p%dv;", vt, p);
        }
        for (int lane = 0; lane < L->vector; lane++) {
            E.lane = lane;
            cuda_line(&E, "{");
            E.indent++;
            cuda_line(&E, "const long long gid = gid0 + %d;", lane);
            cuda_body(&E);
            E.indent--;
            cuda_line(&E, "}");
        }
        for (int p = 0; p < k->nbufs; p++) {
            int stored = 0;
            for (int i = 0; i < k->n; i++)
                stored |= k->inst[i].op == K_STORE && k->inst[i].buf == p && cuda_vec_access(&E.P, k, &k->inst[i]);
            if (stored) cuda_line(&E, "*reinterpret_cast<%s *>(p%d + gid0) = p%dv;", cuda_vec_type(k->bufs[p].dt), p, p);
        }
        E.indent--;
        cuda_line(&E, "}");
    } else if (L->mode == CUDA_THREAD && k->ranged) {
        cuda_line(&E, "for (long long gid = mbt_lo + blockIdx.x * %dLL + threadIdx.x; gid < mbt_hi; gid += gridDim.x * %dLL) {",
                  L->block, L->block);
        E.indent++;
        cuda_body(&E);
        E.indent--;
        cuda_line(&E, "}");
    } else if (L->mode == CUDA_THREAD) {
        cuda_line(&E, "for (long long gid = blockIdx.x * %dLL + threadIdx.x; gid < %" PRId64 "LL; gid += gridDim.x * %dLL) {",
                  L->block, k->grid, L->block);
        E.indent++;
        cuda_body(&E);
        E.indent--;
        cuda_line(&E, "}");
    } else if (L->mode == CUDA_WARP) {
        int wpb = L->block / 32;
        cuda_line(&E, "const int lane = threadIdx.x & 31;");
        cuda_line(&E,
                  "for (long long gid = blockIdx.x * %dLL + (threadIdx.x >> 5); gid < %" PRId64 "LL; gid += gridDim.x * %dLL) {",
                  wpb, k->grid, wpb);
        E.indent++;
        cuda_body(&E);
        E.indent--;
        cuda_line(&E, "}");
    } else {
        cuda_line(&E, "__shared__ __align__(8) unsigned char mbt_scratch[%d]; /* a slot per warp */", L->shared);
        cuda_line(&E, "for (long long gid = blockIdx.x; gid < %" PRId64 "LL; gid += gridDim.x) {", k->grid);
        E.indent++;
        cuda_body(&E);
        E.indent--;
        cuda_line(&E, "}");
    }
    if (E.indent != 1 || E.in_split >= 0) INTERNAL("cuda: %s: unbalanced loops or ifs", k->name);
    fprintf(out, "}\n");
    arena_free(&scratch);
}
