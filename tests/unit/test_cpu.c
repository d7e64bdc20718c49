/* test_cpu.c - unit tests of the CPU back end (compiler/cpu.c): kernels lowered to LLVM IR,
 * optimised at O2 for the host, JIT-compiled with ORC's LLJIT and run on random inputs, against
 * kir_ref (the KIR interpreter in double precision, compiler/kir_ref.c) on the same inputs.
 *
 * Build: make build/tests/test_cpu (links build/libmbtc.a and LLVM). Prints `PASS name` or
 * `FAIL name: why` per case, `# name: ...` lines with the largest errors seen, then
 * `N passed, M failed`; exits 1 on a failure.
 *
 * What is covered:
 *   - hand-built kernels (kb_* builder) for every KOp and value type: float binary and unary ops
 *     (f32, f64), integer arithmetic with NumPy's // and % (negative and zero divisors), index
 *     arithmetic, comparisons and logic, every cast, a u64 hash (also against C: the wrapping
 *     u64 arithmetic dropout's Philox rounds are made of),
 *     f16/bf16 loads and stores (also bit-exact against an independent rounding in C), counted
 *     loops (static, dynamic, empty, nested), accumulators (add/max/min, re-initialised in a
 *     loop), nested ifs, NaN/inf/-0 through max/min/mod;
 *   - the ABI: any split of [0, grid) into ranges gives bit-identical results, an empty range
 *     writes nothing;
 *   - the module after cpu_optimize verifies, cpu_emit_object writes an ELF object defining the
 *     kernel, and cpu_print_module shows the kernel listing above each function;
 *   - every kernel fusion makes of the programs in tests/golden/ and tests/fuse/ (the training
 *     step, forward and backward, and the optimizer update).
 *
 * Tolerances (f32 computed here, double in kir_ref; the inputs are the same f32 values):
 *   - integers, bools and u64: exact.
 *   - f32 elementwise: |cpu - ref| <= 1e-5 * |ref|. One f32 operation rounds with relative error
 *     2^-24 (6e-8); libm's expf/logf/powf/sinf/cosf/tanhf are within 1-2 ulp; a chain of k
 *     operations stays within about 2k ulp when every step is well conditioned (no cancellation),
 *     so 1e-5 (~170 ulp) is an order of magnitude of slack, and still catches a wrong constant,
 *     a wrong op or a double rounding to f16.
 *   - f32 kernels with reductions or subtractions (the fused kernels, the loops test): the same
 *     1e-5, relative to |ref| + S, S the larger of the output buffer's mean |ref| and the largest
 *     mean |x| of the kernel's float inputs: a sum of n terms is off by up to n * 2^-24 * sum
 *     |terms|, i.e. relative to the size of what was summed, not to a result that cancelled to
 *     nearly 0 (a softmax gradient summed over its row is 0 exactly and ~1e-9 in f32); S stands
 *     for that size. Observed: below 5e-7, but for the update kernels of Adam and LAMB, whose
 *     bias correction 1 - 0.999^t turns the f32 rounding of the constant 0.999 (1.3e-8) into a
 *     relative 1.3e-5 / t, halved by the sqrt it goes through: up to 6.5e-6 at t = 1 (seen 3e-6).
 *   - f64: 1e-12 (both sides double; libm differences only).
 *   - f16 / bf16 outputs: kir_ref does not round to them at all, so half an ulp of the format is
 *     added to the bound (2^-11 = 4.9e-4 and 2^-8 = 3.9e-3 relative; the inputs keep clear of
 *     f16's subnormals and overflow). Their rounding itself is checked bit-exactly against C
 *     (_Float16, and an independent nearest-even search for bf16). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Object.h>
#include <llvm-c/Orc.h>

#include "kir_build.h"
#include "unit.h"
#include "autodiff.h"
#include "cpu.h"
#include "diag.h"
#include "fuse.h"
#include "fuse_kv.h"
#include "kir.h"
#include "kir_ref.h"
#include "module.h"
#include "plan.h"
#include "sema.h"

/* ---- random numbers ------------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(double lo, double hi) { return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1.0p-53; }

/* ---- f16 and bf16 in C, independently of cpu.c ------------------------------------------------ */

static double f16_to_double(uint16_t h) {
    _Float16 f;
    memcpy(&f, &h, 2);
    return (double)f;
}

static uint16_t f16_from_float(float x) { /* the C compiler's conversion: round to nearest even */
    _Float16 f = (_Float16)x;
    uint16_t h;
    memcpy(&h, &f, 2);
    return h;
}

static double bf16_to_double(uint16_t b) {
    uint32_t w = (uint32_t)b << 16;
    float f;
    memcpy(&f, &w, 4);
    return (double)f;
}

/* Nearest bf16 to x, ties to the even pattern, by comparing the two candidates in double. */
static uint16_t bf16_from_float(float x) {
    uint32_t w;
    memcpy(&w, &x, 4);
    if (isnan(x)) return (uint16_t)((w >> 16) | 0x40);
    uint16_t lo = (uint16_t)(w >> 16), hi = (uint16_t)(lo + 1); /* truncated, and one further out */
    double vlo = bf16_to_double(lo);
    double vhi = (hi & 0x7FFF) == 0x7F80 ? copysign(ldexp(1.0, 128), x) : bf16_to_double(hi);
    double dlo = fabs((double)x - vlo), dhi = fabs((double)x - vhi);
    if (dlo < dhi) return lo;
    if (dhi < dlo) return hi;
    return (lo & 1) ? hi : lo;
}

/* ---- buffers ----------------------------------------------------------------------------------- */

static double mem_get(DType dt, const void *m, int64_t i) {
    switch (dt) {
    case DT_F32: return ((const float *)m)[i];
    case DT_F64: return ((const double *)m)[i];
    case DT_F16: return f16_to_double(((const uint16_t *)m)[i]);
    case DT_BF16: return bf16_to_double(((const uint16_t *)m)[i]);
    case DT_I32: return ((const int32_t *)m)[i];
    case DT_I64: return (double)((const int64_t *)m)[i];
    default: return ((const uint8_t *)m)[i];
    }
}

static void mem_set(DType dt, void *m, int64_t i, double v) {
    switch (dt) {
    case DT_F32: ((float *)m)[i] = (float)v; break;
    case DT_F64: ((double *)m)[i] = v; break;
    case DT_F16: ((uint16_t *)m)[i] = f16_from_float((float)v); break;
    case DT_BF16: ((uint16_t *)m)[i] = bf16_from_float((float)v); break;
    case DT_I32: ((int32_t *)m)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)m)[i] = (int64_t)v; break;
    default: ((uint8_t *)m)[i] = v != 0; break;
    }
}

static int64_t buf_numel(const KBuf *b) {
    int64_t n = 1;
    for (int d = 0; d < b->rank; d++) n *= b->shape[d];
    return n;
}

/* How a buffer's initial values are drawn: uniform in [lo, hi] (integers: floor of it), then
 * the listed special values at the first positions. */
typedef struct Init {
    double lo, hi;
    int nspecial;
    const double *special;
} Init;

static const Init init_default = {-1.0, 1.0, 0, NULL};

/* ---- the JIT -------------------------------------------------------------------------------------- */

typedef void (*KernelFn)(void **bufs, int64_t gid_begin, int64_t gid_end);

typedef struct Jit {
    Arena ar;
    CpuTarget target;
    LLVMOrcThreadSafeContextRef tsc;
    LLVMOrcLLJITRef jit;
    LLVMModuleRef module; /* until added to the JIT */
    int ok;
} Jit;

static int jit_check_error(LLVMErrorRef e, const char *what) {
    if (!e) return 1;
    char *msg = LLVMGetErrorMessage(e);
    CHECK(0, "%s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
    return 0;
}

/* A module with the kernels lowered (with `disjoint`, cpu.h) and optimised (it verifies), added
 * to a new LLJIT that resolves libm's functions from this process; fns[i] is kernel i's entry. */
static int jit_open(Jit *j, Kernel *const *ks, int n, KernelFn *fns, int disjoint) {
    memset(j, 0, sizeof *j);
    const char *err = NULL;
    if (cpu_target_host(&j->target, &j->ar, &err)) {
        CHECK(0, "host target: %s", err);
        return 0;
    }
    j->tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMContextRef ctx = LLVMOrcThreadSafeContextGetContext(j->tsc);
    j->module = cpu_module_new(ctx, &j->target, "test_cpu");
    for (int i = 0; i < n; i++) cpu_lower_kernel(j->module, ks[i], disjoint);
    if (cpu_verify(j->module, &j->ar, &err)) {
        CHECK(0, "the lowered module verifies: %s", err);
        return 0;
    }
    if (cpu_optimize(j->module, &j->target, &j->ar, &err)) {
        CHECK(0, "cpu_optimize: %s", err);
        return 0;
    }
    if (!jit_check_error(LLVMOrcCreateLLJIT(&j->jit, NULL), "creating the LLJIT")) return 0;
    LLVMOrcDefinitionGeneratorRef gen = NULL;
    char prefix = LLVMOrcLLJITGetGlobalPrefix(j->jit);
    if (!jit_check_error(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, prefix, NULL, NULL), "process symbols"))
        return 0;
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->jit), gen);
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(j->module, j->tsc);
    j->module = NULL; /* owned by the JIT now */
    if (!jit_check_error(LLVMOrcLLJITAddLLVMIRModule(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), tsm), "adding the module")) {
        LLVMOrcDisposeThreadSafeModule(tsm);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        LLVMOrcExecutorAddress addr = 0;
        if (!jit_check_error(LLVMOrcLLJITLookup(j->jit, &addr, ks[i]->name), ks[i]->name)) return 0;
        fns[i] = (KernelFn)(uintptr_t)addr;
    }
    j->ok = 1;
    return 1;
}

static void jit_close(Jit *j) {
    if (j->module) LLVMDisposeModule(j->module);
    if (j->jit) jit_check_error(LLVMOrcDisposeLLJIT(j->jit), "disposing the LLJIT");
    if (j->tsc) LLVMOrcDisposeThreadSafeContext(j->tsc);
    cpu_target_dispose(&j->target);
    arena_free(&j->ar);
}

/* ---- running one kernel both ways -------------------------------------------------------------- */

typedef struct Outcome {
    double max_err;   /* largest scaled error over the written f32 and f64 buffers */
    double max_err16; /* the same over f16 and bf16 buffers (their rounding included) */
    int64_t mismatches;
} Outcome;

/* Mean |v| over the finite values of a buffer. */
static double mean_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i])) m += fabs(v[i]) / (double)n;
    return m;
}

/* Compares the CPU's written buffers with the reference's (after both ran): integers and bools
 * exactly; floats with |cpu - ref| <= tol * (|ref| + scale * S), where S is the larger of the
 * output buffer's mean |ref| and the largest mean |x| of the kernel's float inputs: the size of
 * the numbers the kernel works with, which is what f32 rounding is relative to when a sum
 * cancels (a softmax gradient summed over its row is 0 in exact arithmetic, ~1e-9 in f32).
 * scale = 0 makes the test purely relative. f16/bf16 outputs get their half ulp on top. */
static Outcome compare(const char *what, const Kernel *k, void **mem, double **ref, double tol, double scale) {
    Outcome o = {0, 0, 0};
    double in_mean = 0;
    for (int p = 0; p < k->nbufs; p++)
        if (!k->bufs[p].written && dtype_is_float(k->bufs[p].dt)) {
            double m = mean_abs(ref[p], buf_numel(&k->bufs[p]));
            if (m > in_mean) in_mean = m;
        }
    for (int p = 0; p < k->nbufs; p++) {
        const KBuf *b = &k->bufs[p];
        if (!b->written) continue;
        int64_t n = buf_numel(b);
        double S = mean_abs(ref[p], n);
        if (in_mean > S) S = in_mean;
        int half = b->dt == DT_F16 || b->dt == DT_BF16;
        double t = tol + (b->dt == DT_F16 ? 4.9e-4 : b->dt == DT_BF16 ? 3.9e-3 : 0);
        double *worst = half ? &o.max_err16 : &o.max_err;
        for (int64_t i = 0; i < n; i++) {
            double c = mem_get(b->dt, mem[p], i), r = ref[p][i];
            int bad;
            if (!dtype_is_float(b->dt)) bad = c != r;
            else if (isnan(r) || isnan(c)) bad = isnan(r) != isnan(c);
            else if (isinf(r) || isinf(c)) bad = c != r;
            else {
                double e = fabs(c - r) / (fabs(r) + scale * S + 1e-300);
                if (e > *worst) *worst = e;
                bad = e > t;
            }
            if (bad && o.mismatches++ < 5) CHECK(0, "%s: p%d[%" PRId64 "] is %.9g, kir_ref says %.17g", what, p, i, c, r);
        }
    }
    return o;
}

/* Runs kernel k (fn) on the buffers mem (in place), and compares: the same work split into
 * uneven ranges on a copy must give bit-identical results, and kir_ref on a copy (as doubles)
 * must agree within tol (compare). The max error is printed as a `#` line. */
static Outcome run_on(const char *what, const Kernel *k, KernelFn fn, void **mem, double tol, double scale) {
    int nb = k->nbufs;
    void **mem2 = calloc((size_t)nb + 1, sizeof(void *));
    double **ref = calloc((size_t)nb + 1, sizeof(double *));
    Outcome o = {0, 0, 0};
    if (!mem2 || !ref) exit(1);
    for (int p = 0; p < nb; p++) {
        const KBuf *b = &k->bufs[p];
        int64_t n = buf_numel(b);
        mem2[p] = malloc(((size_t)n + 1) * (size_t)dtype_size(b->dt));
        ref[p] = malloc(((size_t)n + 1) * sizeof(double));
        if (!mem2[p] || !ref[p]) exit(1);
        memcpy(mem2[p], mem[p], (size_t)n * (size_t)dtype_size(b->dt));
        for (int64_t i = 0; i < n; i++) ref[p][i] = mem_get(b->dt, mem[p], i);
    }
    fn(mem, 0, k->grid);
    /* the same work in pieces: [0, a), an empty range, [a, c), [c, grid) */
    int64_t a = k->grid / 3, c = k->grid - k->grid / 4;
    fn(mem2, 0, a);
    fn(mem2, a, a);
    fn(mem2, a, c);
    fn(mem2, c, k->grid);
    for (int p = 0; p < nb; p++)
        CHECK(memcmp(mem[p], mem2[p], (size_t)buf_numel(&k->bufs[p]) * (size_t)dtype_size(k->bufs[p].dt)) == 0,
              "%s: p%d differs when [0, %" PRId64 ") runs in pieces", what, p, k->grid);
    if (kir_ref_kernel(k, ref) != 0) CHECK(0, "%s: kir_ref failed", what);
    else o = compare(what, k, mem, ref, tol, scale);
    printf("# %s: max error %.3g (tolerance %.0e)", what, o.max_err, tol);
    if (o.max_err16 > 0) printf("; f16/bf16 outputs %.3g (tolerance %.0e + half an ulp)", o.max_err16, tol);
    printf("\n");
    for (int p = 0; p < nb; p++) {
        free(mem2[p]);
        free(ref[p]);
    }
    free(mem2);
    free(ref);
    return o;
}

/* run_on with inputs drawn per buffer: init[p], or init_default when init is NULL or
 * init[p].hi < init[p].lo. */
static Outcome run_kernel(const char *what, const Kernel *k, KernelFn fn, const Init *init, double tol, double scale) {
    int nb = k->nbufs;
    void **mem = calloc((size_t)nb + 1, sizeof(void *));
    if (!mem) exit(1);
    for (int p = 0; p < nb; p++) {
        const KBuf *b = &k->bufs[p];
        int64_t n = buf_numel(b);
        Init in = init && init[p].hi >= init[p].lo ? init[p] : init_default;
        mem[p] = calloc((size_t)n + 1, (size_t)dtype_size(b->dt));
        if (!mem[p]) exit(1);
        for (int64_t i = 0; i < n; i++) {
            double v = rng_uniform(in.lo, in.hi);
            if (!dtype_is_float(b->dt)) v = floor(v);
            if (i < in.nspecial) v = in.special[i];
            mem_set(b->dt, mem[p], i, v);
        }
    }
    Outcome o = run_on(what, k, fn, mem, tol, scale);
    for (int p = 0; p < nb; p++) free(mem[p]);
    free(mem);
    return o;
}

/* Lowers, optimises and JIT-compiles one kernel, then run_kernel; twice: assuming nothing about
 * aliasing, and with `disjoint` (the buffers here never overlap). Returns the larger error. */
static Outcome check_kernel(const char *what, Kernel *k, const Init *init, double tol) {
    Outcome o = {0, 0, 0};
    CHECK(kir_verify(k, stdout) == 0, "%s verifies", what);
    for (int disjoint = 0; disjoint < 2; disjoint++) {
        Jit j;
        KernelFn fn = NULL;
        char name[256];
        snprintf(name, sizeof name, "%s%s", what, disjoint ? " (disjoint)" : "");
        if (jit_open(&j, &k, 1, &fn, disjoint)) {
            Outcome od = run_kernel(name, k, fn, init, tol, 0.0);
            if (od.max_err > o.max_err) o.max_err = od.max_err;
            if (od.max_err16 > o.max_err16) o.max_err16 = od.max_err16;
            o.mismatches += od.mismatches;
        }
        jit_close(&j);
    }
    return o;
}

/* ---- float ops ------------------------------------------------------------------------------------ */

#define N_ELEM 1000

/* out_op[gid] = op(x[gid], y[gid]) for every binary float op, in one kernel of type ty. */
static void float_binary(KType ty, DType dt, double tol) {
    static const KOp ops[] = {K_ADD, K_SUB, K_MUL, K_DIV, K_MOD, K_MAX, K_MIN};
    KB *t = kb_start(ty == KT_F64 ? "k_binary_f64" : "k_binary_f32", KK_ELEMENTWISE, N_ELEM);
    int x = B1(t, dt, N_ELEM, 0), y = B1(t, dt, N_ELEM, 0), pp = B1(t, dt, N_ELEM, 0);
    int lx = LD(t, x, t->g), ly = LD(t, y, t->g);
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) ST(t, B1(t, dt, N_ELEM, 1), t->g, OP2(t, ops[i], ty, lx, ly));
    /* pow on a positive base */
    ST(t, B1(t, dt, N_ELEM, 1), t->g, OP2(t, K_POW, ty, LD(t, pp, t->g), ly));
    kir_finish(t->k);
    /* x, y in [-4, 4] with NaN, infinities, signed zeros and equal pairs first */
    static const double sx[] = {NAN, 1.0, 0.0, -0.0, INFINITY, -INFINITY, 2.5, -2.5, 3.0, -7.0, 7.0, 1.0};
    static const double sy[] = {1.0, NAN, -0.0, 0.0, 1.0, 2.0, 2.5, 2.5, 0.0, 2.0, -2.0, -INFINITY};
    Init init[16];
    for (int i = 0; i < 16; i++) init[i] = init_default;
    init[0] = (Init){-4, 4, 12, sx};
    init[1] = (Init){-4, 4, 12, sy};
    init[2] = (Init){0.25, 4, 0, NULL};
    check_kernel(t->k->name, t->k, init, tol);
    kb_done(t);
}

static void test_float_binary_f32(void) { float_binary(KT_F32, DT_F32, 1e-5); }
static void test_float_binary_f64(void) { float_binary(KT_F64, DT_F64, 1e-12); }

/* out_op[gid] = op(x[gid]) for every unary float op, inputs in each op's domain. */
static void float_unary(KType ty, DType dt, double tol) {
    KB *t = kb_start(ty == KT_F64 ? "k_unary_f64" : "k_unary_f32", KK_ELEMENTWISE, N_ELEM);
    int x = B1(t, dt, N_ELEM, 0), pos = B1(t, dt, N_ELEM, 0);
    int lx = LD(t, x, t->g), lp = LD(t, pos, t->g);
    static const KOp any[] = {K_NEG, K_ABS, K_EXP, K_TANH, K_SIN, K_COS, K_FLOOR};
    for (size_t i = 0; i < sizeof any / sizeof *any; i++) ST(t, B1(t, dt, N_ELEM, 1), t->g, OP1(t, any[i], ty, lx));
    ST(t, B1(t, dt, N_ELEM, 1), t->g, OP1(t, K_LOG, ty, lp));
    ST(t, B1(t, dt, N_ELEM, 1), t->g, OP1(t, K_SQRT, ty, lp));
    kir_finish(t->k);
    static const double sx[] = {-0.0, 0.0, 2.0, -2.0, -0.5, 0.5, 20.0, -20.0};
    Init init[16];
    for (int i = 0; i < 16; i++) init[i] = init_default;
    init[0] = (Init){-6, 6, 8, sx};
    init[1] = (Init){1e-3, 100, 0, NULL};
    check_kernel(t->k->name, t->k, init, tol);
    kb_done(t);
}

static void test_float_unary_f32(void) { float_unary(KT_F32, DT_F32, 1e-5); }
static void test_float_unary_f64(void) { float_unary(KT_F64, DT_F64, 1e-12); }

/* NaN propagation of max/min and NumPy's mod, checked directly (not only against kir_ref). */
static void test_nan_max_min_mod(void) {
    KB *t = kb_start("k_special", KK_ELEMENTWISE, 6);
    int x = B1(t, DT_F32, 6, 0), y = B1(t, DT_F32, 6, 0);
    int omax = B1(t, DT_F32, 6, 1), omin = B1(t, DT_F32, 6, 1), omod = B1(t, DT_F32, 6, 1);
    int lx = LD(t, x, t->g), ly = LD(t, y, t->g);
    ST(t, omax, t->g, OP2(t, K_MAX, KT_F32, lx, ly));
    ST(t, omin, t->g, OP2(t, K_MIN, KT_F32, lx, ly));
    ST(t, omod, t->g, OP2(t, K_MOD, KT_F32, lx, ly));
    kir_finish(t->k);
    Jit j;
    KernelFn fn = NULL;
    if (jit_open(&j, &t->k, 1, &fn, 0)) {
        float xs[6] = {NAN, 1.0f, -0.0f, 5.5f, -5.5f, 4.0f}, ys[6] = {1.0f, NAN, 0.0f, 2.0f, 2.0f, -2.0f};
        float mx[6], mn[6], md[6];
        void *bufs[5] = {xs, ys, mx, mn, md};
        fn(bufs, 0, 6);
        CHECK(isnan(mx[0]) && isnan(mx[1]) && isnan(mn[0]) && isnan(mn[1]), "max/min propagate NaN");
        CHECK(mx[2] == 0.0f && !signbit(mx[2]) && mn[2] == 0.0f && signbit(mn[2]), "max(-0, +0) = +0, min = -0");
        CHECK(isnan(md[0]) && isnan(md[1]) && isnan(md[2]), "mod with a NaN operand or by 0 is NaN");
        CHECK(md[3] == 1.5f && md[4] == 0.5f, "-5.5 mod 2 = 0.5 (the divisor's sign): got %g, %g", md[3], md[4]);
        CHECK(md[5] == 0.0f && signbit(md[5]), "4 mod -2 = -0 (a zero takes the divisor's sign)");
    }
    jit_close(&j);
    kb_done(t);
}

/* ---- integers, comparisons, logic --------------------------------------------------------------------- */

/* NumPy's // and % on i32/i64 (negative and zero divisors), + - * max min neg abs; idiv/imod. */
static void test_integer_ops(void) {
    static const KOp ops[] = {K_ADD, K_SUB, K_MUL, K_DIV, K_MOD, K_MAX, K_MIN};
    KB *t = kb_start("k_integer", KK_ELEMENTWISE, N_ELEM);
    for (int w = 0; w < 2; w++) {
        KType ty = w ? KT_I64 : KT_I32;
        DType dt = w ? DT_I64 : DT_I32;
        int x = B1(t, dt, N_ELEM, 0), y = B1(t, dt, N_ELEM, 0);
        int lx = LD(t, x, t->g), ly = LD(t, y, t->g);
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) ST(t, B1(t, dt, N_ELEM, 1), t->g, OP2(t, ops[i], ty, lx, ly));
        ST(t, B1(t, dt, N_ELEM, 1), t->g, OP1(t, K_NEG, ty, lx));
        ST(t, B1(t, dt, N_ELEM, 1), t->g, OP1(t, K_ABS, ty, lx));
    }
    /* index arithmetic on gid: idiv/imod by constants and by a loaded (positive) divisor */
    int d = B1(t, DT_I64, N_ELEM, 0);
    int ld = LD(t, d, t->g);
    ST(t, B1(t, DT_I64, N_ELEM, 1), t->g, OP2(t, K_IDIV, KT_I64, t->g, C_i(t, KT_I64, 7)));
    ST(t, B1(t, DT_I64, N_ELEM, 1), t->g, OP2(t, K_IMOD, KT_I64, t->g, C_i(t, KT_I64, 7)));
    ST(t, B1(t, DT_I64, N_ELEM, 1), t->g, OP2(t, K_IDIV, KT_I64, t->g, ld));
    ST(t, B1(t, DT_I64, N_ELEM, 1), t->g, OP2(t, K_IMOD, KT_I64, t->g, ld));
    kir_finish(t->k);
    static const double sx[] = {7, -7, 7, -7, 0, 5};
    static const double sy[] = {2, 2, -2, -2, 0, 0};
    Init init[40];
    for (int i = 0; i < 40; i++) init[i] = init_default;
    init[0] = (Init){-100, 100, 6, sx};
    init[1] = (Init){-9, 9, 6, sy};
    init[11] = (Init){-100000, 100000, 6, sx};
    init[12] = (Init){-9, 9, 6, sy};
    init[22] = (Init){1, 50, 0, NULL};
    check_kernel("k_integer", t->k, init, 0);
    kb_done(t);
}

/* Comparisons on every type, and/or/not, select. */
static void test_compare_logic(void) {
    static const KOp cmps[] = {K_EQ, K_NE, K_LT, K_LE, K_GT, K_GE};
    static const struct {
        KType t;
        DType dt;
        double lo, hi;
    } types[] = {{KT_F32, DT_F32, -2, 2},
                 {KT_F64, DT_F64, -2, 2},
                 {KT_I32, DT_I32, -3, 3},
                 {KT_I64, DT_I64, -3, 3},
                 {KT_BOOL, DT_BOOL, 0, 2}};
    KB *t = kb_start("k_compare", KK_ELEMENTWISE, N_ELEM);
    Init init[80];
    for (int i = 0; i < 80; i++) init[i] = init_default;
    static const double snan[] = {NAN, 1.0, NAN, 0.5, 0.5};
    static const double snan2[] = {1.0, NAN, NAN, 0.5, 0.25};
    int conds[2] = {-1, -1};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        int x = B1(t, types[ti].dt, N_ELEM, 0), y = B1(t, types[ti].dt, N_ELEM, 0);
        init[x] = (Init){types[ti].lo, types[ti].hi, kir_type_is_float(types[ti].t) ? 5 : 0, snan};
        init[y] = (Init){types[ti].lo, types[ti].hi, kir_type_is_float(types[ti].t) ? 5 : 0, snan2};
        int lx = LD(t, x, t->g), ly = LD(t, y, t->g);
        for (size_t i = 0; i < sizeof cmps / sizeof *cmps; i++) {
            int c = OP2(t, cmps[i], KT_BOOL, lx, ly);
            ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, c);
            if (ti == 0 && i == 2) conds[0] = c;
            if (ti == 2 && i == 5) conds[1] = c;
        }
        if (ti == 3) { /* select on i64 */
            ST(t, B1(t, DT_I64, N_ELEM, 1), t->g, kb_op(t->b, K_SELECT, KT_I64, 3, conds[0], lx, ly));
        }
        if (ti == 0)
            ST(t, B1(t, DT_F32, N_ELEM, 1), t->g, kb_op(t->b, K_SELECT, KT_F32, 3, OP2(t, K_GT, KT_BOOL, lx, ly), lx, ly));
    }
    ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, OP2(t, K_AND, KT_BOOL, conds[0], conds[1]));
    ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, OP2(t, K_OR, KT_BOOL, conds[0], conds[1]));
    ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, OP1(t, K_NOT, KT_BOOL, conds[1]));
    /* NumPy's bool arithmetic: + and max are or, * and min are and, - is xor, -x and |x| are x */
    static const KOp bool_ops[] = {K_ADD, K_SUB, K_MUL, K_MAX, K_MIN};
    for (size_t i = 0; i < sizeof bool_ops / sizeof *bool_ops; i++)
        ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, OP2(t, bool_ops[i], KT_BOOL, conds[0], conds[1]));
    ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, OP1(t, K_NEG, KT_BOOL, conds[0]));
    ST(t, B1(t, DT_BOOL, N_ELEM, 1), t->g, OP1(t, K_ABS, KT_BOOL, conds[1]));
    kir_finish(t->k);
    check_kernel("k_compare", t->k, init, 0);
    kb_done(t);
}

/* Every cast among bool, i32, i64, u64 (through i64), f16, bf16, f32, f64. */
static void test_casts(void) {
    static const struct {
        KType t;
        DType dt;
    } types[] = {{KT_BOOL, DT_BOOL}, {KT_I32, DT_I32}, {KT_I64, DT_I64}, {KT_F16, DT_F16},
                 {KT_BF16, DT_BF16}, {KT_F32, DT_F32}, {KT_F64, DT_F64}};
    int nt = (int)(sizeof types / sizeof *types);
    for (int from = 0; from < nt; from++) {
        KB *t = kb_start("k_cast", KK_ELEMENTWISE, N_ELEM);
        int x = B1(t, types[from].dt, N_ELEM, 0);
        int lx = LD(t, x, t->g);
        for (int to = 0; to < nt; to++) ST(t, B1(t, types[to].dt, N_ELEM, 1), t->g, OP1(t, K_CAST, types[to].t, lx));
        /* through u64 and back (i64 -> u64 -> f32, f32 -> u64 -> i64) */
        if (types[from].t == KT_I64 || types[from].t == KT_F32) {
            int u = OP1(t, K_CAST, KT_U64, lx);
            ST(t, B1(t, DT_F32, N_ELEM, 1), t->g, OP1(t, K_CAST, KT_F32, u));
            ST(t, B1(t, DT_I64, N_ELEM, 1), t->g, OP1(t, K_CAST, KT_I64, u));
        }
        kir_finish(t->k);
        /* values where every conversion is defined: |x| < 60000 (f16's range), non-negative for u64 */
        int to_u64 = types[from].t == KT_I64 || types[from].t == KT_F32;
        /* (none rounds to an f16 subnormal or overflows it: kir_ref does not round to f16) */
        static const double sx[] = {0.0, 1.0, 2.5, 3.5, -2.5, 1.00048828125, 1.00390625, 60000.0, 1e-3};
        Init init[16];
        for (int i = 0; i < 16; i++) init[i] = init_default;
        init[0] = (Init){to_u64 ? 0 : -3000, 3000, types[from].t == KT_BOOL ? 0 : to_u64 ? 3 : 9, sx};
        if (types[from].t == KT_BOOL) init[0] = (Init){0, 2, 0, NULL};
        char name[64];
        snprintf(name, sizeof name, "k_cast_from_%s", kir_type_name(types[from].t));
        t->k->name = name;
        check_kernel(name, t->k, init, 1e-5);
        kb_done(t);
    }
}

/* ---- a u64 hash: u64 xor, shr, mul, add, wrapping ------------------------------------------------- */

static uint64_t c_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void test_u64_hash(void) {
    KB *t = kb_start("k_hash", KK_ELEMENTWISE, N_ELEM);
    int ohash = B1(t, DT_I64, N_ELEM, 1), otop = B1(t, DT_I64, N_ELEM, 1), okeep = B1(t, DT_BOOL, N_ELEM, 1);
    int oshift = B1(t, DT_I64, N_ELEM, 1), sh = B1(t, DT_I64, N_ELEM, 0);
    int i = OP1(t, K_CAST, KT_U64, t->g);
    int step = OP2(t, K_MUL, KT_U64, OP2(t, K_ADD, KT_U64, i, C_i(t, KT_U64, 1)), C_i(t, KT_U64, (int64_t)0x9E3779B97F4A7C15ull));
    int z = OP2(t, K_ADD, KT_U64, C_i(t, KT_U64, (int64_t)0x0123456789ABCDEFull), step);
    z = OP2(t, K_MUL, KT_U64, OP2(t, K_XOR, KT_U64, z, OP2(t, K_SHR, KT_U64, z, C_i(t, KT_U64, 30))),
            C_i(t, KT_U64, (int64_t)0xBF58476D1CE4E5B9ull));
    z = OP2(t, K_MUL, KT_U64, OP2(t, K_XOR, KT_U64, z, OP2(t, K_SHR, KT_U64, z, C_i(t, KT_U64, 27))),
            C_i(t, KT_U64, (int64_t)0x94D049BB133111EBull));
    z = OP2(t, K_XOR, KT_U64, z, OP2(t, K_SHR, KT_U64, z, C_i(t, KT_U64, 31)));
    ST(t, ohash, t->g, OP1(t, K_CAST, KT_I64, z));
    int top = OP2(t, K_SHR, KT_U64, z, C_i(t, KT_U64, 40));
    ST(t, otop, t->g, OP1(t, K_CAST, KT_I64, top));
    ST(t, okeep, t->g, OP2(t, K_GE, KT_BOOL, top, C_i(t, KT_U64, 1 << 22)));
    /* a shift by a loaded amount, 0..70: 64 and more give 0; of a value below 2^53 so kir_ref's
     * doubles hold the result exactly */
    int amount = OP1(t, K_CAST, KT_U64, LD(t, sh, t->g));
    ST(t, oshift, t->g, OP1(t, K_CAST, KT_I64, OP2(t, K_SHR, KT_U64, OP2(t, K_SHR, KT_U64, z, C_i(t, KT_U64, 12)), amount)));
    kir_finish(t->k);
    Init init[5] = {init_default, init_default, init_default, init_default, {0, 71, 0, NULL}};
    /* against C: the whole 64-bit hash (kir_ref's doubles cannot hold it exactly) */
    Jit j;
    KernelFn fn = NULL;
    if (jit_open(&j, &t->k, 1, &fn, 0)) {
        int64_t *hash = calloc(N_ELEM, 8), *tops = calloc(N_ELEM, 8), *shifted = calloc(N_ELEM, 8), *amounts = calloc(N_ELEM, 8);
        uint8_t *keep = calloc(N_ELEM, 1);
        for (int e = 0; e < N_ELEM; e++) amounts[e] = e % 71;
        void *bufs[5] = {hash, tops, keep, shifted, amounts};
        fn(bufs, 0, N_ELEM);
        int bad = 0;
        for (int e = 0; e < N_ELEM && bad < 3; e++) {
            uint64_t want = c_mix64(0x0123456789ABCDEFull + ((uint64_t)e + 1) * 0x9E3779B97F4A7C15ull);
            uint64_t wsh = amounts[e] >= 64 ? 0 : (want >> 12) >> amounts[e];
            if ((uint64_t)hash[e] != want || (uint64_t)tops[e] != want >> 40 || keep[e] != ((want >> 40) >= (1u << 22)) ||
                (uint64_t)shifted[e] != wsh) {
                CHECK(0, "hash of %d: got %016" PRIx64 ", C says %016" PRIx64, e, (uint64_t)hash[e], want);
                bad++;
            }
        }
        free(hash);
        free(tops);
        free(shifted);
        free(amounts);
        free(keep);
    }
    jit_close(&j);
    /* against kir_ref, whose buffers are doubles: the hash rounded to a double the same way */
    check_kernel("k_hash", t->k, init, 0);
    kb_done(t);
}

/* ---- f16 and bf16 buffers -------------------------------------------------------------------------------- */

/* y = x * 3 + 0.1 from and to each 16-bit format, bit-exact against C's rounding of the f32
 * result, and against kir_ref within the format's tolerance. */
static void half_format(DType dt) {
    KType ty = kir_type_of(dt);
    KB *t = kb_start(dt == DT_F16 ? "k_f16" : "k_bf16", KK_ELEMENTWISE, N_ELEM);
    int x = B1(t, dt, N_ELEM, 0), y = B1(t, dt, N_ELEM, 1), y32 = B1(t, DT_F32, N_ELEM, 1);
    int v = OP2(t, K_ADD, ty, OP2(t, K_MUL, ty, LD(t, x, t->g), C_f(t, ty, 3.0)), C_f(t, ty, 0.1));
    ST(t, y, t->g, v);
    ST(t, y32, t->g, OP1(t, K_CAST, KT_F32, v)); /* the f32 value before rounding */
    kir_finish(t->k);
    Jit j;
    KernelFn fn = NULL;
    if (jit_open(&j, &t->k, 1, &fn, 0)) {
        uint16_t xs[N_ELEM], ys[N_ELEM];
        float fs[N_ELEM];
        for (int i = 0; i < N_ELEM; i++) {
            float f = (float)rng_uniform(-30000, 30000) / (float)(1 + i % 200);
            if (i == 0) f = NAN;
            if (i == 1) f = INFINITY;
            if (i == 2) f = dt == DT_BF16 ? 2e38f : 30000.0f; /* 3x overflows to inf */
            xs[i] = dt == DT_F16 ? f16_from_float(f) : bf16_from_float(f);
        }
        void *bufs[3] = {xs, ys, fs};
        fn(bufs, 0, N_ELEM);
        int bad = 0;
        for (int i = 0; i < N_ELEM && bad < 3; i++) {
            float xf = (float)(dt == DT_F16 ? f16_to_double(xs[i]) : bf16_to_double(xs[i]));
            float want32 = xf * 3.0f + 0.1f;
            uint16_t want = dt == DT_F16 ? f16_from_float(want32) : bf16_from_float(want32);
            int same = ys[i] == want || (isnan(want32) && isnan(dt == DT_F16 ? f16_to_double(ys[i]) : bf16_to_double(ys[i])));
            if (!same || (memcmp(&fs[i], &want32, 4) != 0 && !isnan(want32))) {
                CHECK(0, "%s: x = %g: stored %04x, C rounds %.9g to %04x", dtype_name(dt), xf, ys[i], want32, want);
                bad++;
            }
        }
    }
    jit_close(&j);
    check_kernel(t->k->name, t->k, NULL, 1e-5);
    kb_done(t);
}

static void test_f16_buffers(void) { half_format(DT_F16); }
static void test_bf16_buffers(void) { half_format(DT_BF16); }

/* Ties and the edges of bf16's rounding, through a cast (f32 -> bf16 -> f32). */
static void test_bf16_rounding_edges(void) {
    KB *t = kb_start("k_bf16_edges", KK_ELEMENTWISE, 12);
    int x = B1(t, DT_F32, 12, 0), y = B1(t, DT_BF16, 12, 1), z = B1(t, DT_F32, 12, 1);
    int c = OP1(t, K_CAST, KT_BF16, LD(t, x, t->g));
    ST(t, y, t->g, c);
    ST(t, z, t->g, OP1(t, K_CAST, KT_F32, c));
    kir_finish(t->k);
    Jit j;
    KernelFn fn = NULL;
    if (jit_open(&j, &t->k, 1, &fn, 0)) {
        uint32_t bits[12] = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0x7F7FFFFFu, 0xFF7FFFFFu,
                             0x7FC00001u, 0xFF800001u, 0x00008000u, 0x80018000u, 0x7F7F8000u, 0x3F800000u};
        float xs[12], zs[12];
        uint16_t ys[12];
        memcpy(xs, bits, sizeof xs);
        void *bufs[3] = {xs, ys, zs};
        fn(bufs, 0, 12);
        for (int i = 0; i < 12; i++) {
            uint16_t want = bf16_from_float(xs[i]);
            if (isnan(xs[i]))
                CHECK(isnan(bf16_to_double(ys[i])) && isnan(zs[i]), "bf16 of NaN %08x is NaN (got %04x)", bits[i], ys[i]);
            else
                CHECK(ys[i] == want && (double)zs[i] == bf16_to_double(want), "bf16 of %08x: got %04x, want %04x", bits[i], ys[i],
                      want);
        }
    }
    jit_close(&j);
    kb_done(t);
}

/* ---- control: loops, accumulators, ifs -------------------------------------------------------------------- */

/* Row reductions: sum, max, min over a row of 37 (f32 and i64), a nested loop with an
 * accumulator re-initialised per outer iteration (sum over i of max over j), a loop whose
 * extent is loaded (0 included: the empty loop), and stores inside nested ifs. */
static void test_loops_accumulators_ifs(void) {
    enum { R = 64, W = 37, I = 5, J = 7 };
    KB *t = kb_start("k_control", KK_ROW, R);
    int64_t sx[2] = {R, W}, s3[3] = {R, I, J};
    int x = kb_buf(t->b, 0, 0, -1, DT_F32, 2, sx, 0);
    int xi = kb_buf(t->b, 1, 1, -1, DT_I64, 2, sx, 0);
    int x3 = kb_buf(t->b, 2, 2, -1, DT_F32, 3, s3, 0);
    int len = kb_buf(t->b, 3, 3, -1, DT_I64, 1, (int64_t[]){R}, 0);
    int osum = kb_buf(t->b, 4, 4, -1, DT_F32, 1, (int64_t[]){R}, 1);
    int omax = kb_buf(t->b, 5, 5, -1, DT_F32, 1, (int64_t[]){R}, 1);
    int omin = kb_buf(t->b, 6, 6, -1, DT_F32, 1, (int64_t[]){R}, 1);
    int oisum = kb_buf(t->b, 7, 7, -1, DT_I64, 1, (int64_t[]){R}, 1);
    int oimax = kb_buf(t->b, 8, 8, -1, DT_I64, 1, (int64_t[]){R}, 1);
    int onest = kb_buf(t->b, 9, 9, -1, DT_F32, 1, (int64_t[]){R}, 1);
    int odyn = kb_buf(t->b, 10, 10, -1, DT_F32, 1, (int64_t[]){R}, 1);
    int oif = kb_buf(t->b, 11, 11, -1, DT_F32, 2, sx, 1);
    int od = kb_buf(t->b, 12, 12, -1, DT_F64, 1, (int64_t[]){R}, 1);
    int oimin = kb_buf(t->b, 13, 13, -1, DT_I32, 1, (int64_t[]){R}, 1);
    KBuilder *b = t->b;
    int row = OP2(t, K_MUL, KT_I64, t->g, C_i(t, KT_I64, W));
    int asum = kb_acc(b, KT_F32, K_ADD, 0.0), amax = kb_acc(b, KT_F32, K_MAX, -INFINITY),
        amin = kb_acc(b, KT_F32, K_MIN, INFINITY);
    int aisum = kb_acc(b, KT_I64, K_ADD, 0), aimax = kb_acc(b, KT_I64, K_MAX, -1e18);
    int adsum = kb_acc(b, KT_F64, K_ADD, 0.0), aimin = kb_acc(b, KT_I32, K_MIN, 2147483647.0);
    int j = kb_loop(b, W);
    int off = OP2(t, K_ADD, KT_I64, row, j);
    int v = LD(t, x, off), vi = LD(t, xi, off);
    kb_accum(b, asum, v);
    kb_accum(b, amax, v);
    kb_accum(b, amin, v);
    kb_accum(b, aisum, vi);
    kb_accum(b, aimax, vi);
    kb_accum(b, adsum, OP1(t, K_CAST, KT_F64, v));
    kb_accum(b, aimin, OP1(t, K_CAST, KT_I32, vi));
    /* nested ifs: v > 0 ? (v > 0.5 ? 2v : v) : (running sum > 0 ? -1 : 1) */
    kb_if(b, OP2(t, K_GT, KT_BOOL, v, C_f(t, KT_F32, 0.0)));
    kb_if(b, OP2(t, K_GT, KT_BOOL, v, C_f(t, KT_F32, 0.5)));
    ST(t, oif, off, OP2(t, K_MUL, KT_F32, v, C_f(t, KT_F32, 2.0)));
    kb_endif(b);
    kb_if(b, OP2(t, K_LE, KT_BOOL, v, C_f(t, KT_F32, 0.5)));
    ST(t, oif, off, v);
    kb_endif(b);
    kb_endif(b);
    kb_if(b, OP2(t, K_LE, KT_BOOL, v, C_f(t, KT_F32, 0.0)));
    kb_if(b, OP2(t, K_GT, KT_BOOL, asum, C_f(t, KT_F32, 0.0)));
    ST(t, oif, off, C_f(t, KT_F32, -1.0));
    kb_endif(b);
    kb_if(b, OP2(t, K_LE, KT_BOOL, asum, C_f(t, KT_F32, 0.0)));
    ST(t, oif, off, C_f(t, KT_F32, 1.0));
    kb_endif(b);
    kb_endif(b);
    kb_endloop(b);
    ST(t, osum, t->g, asum);
    ST(t, omax, t->g, amax);
    ST(t, omin, t->g, amin);
    ST(t, oisum, t->g, aisum);
    ST(t, oimax, t->g, aimax);
    ST(t, od, t->g, adsum);
    ST(t, oimin, t->g, aimin);
    /* sum over i of max over j of x3[row, i, j] */
    int outer = kb_acc(b, KT_F32, K_ADD, 0.0);
    int i = kb_loop(b, I);
    int inner = kb_acc(b, KT_F32, K_MAX, -INFINITY);
    int jj = kb_loop(b, J);
    int off3 = OP2(
        t, K_ADD, KT_I64,
        OP2(t, K_MUL, KT_I64, OP2(t, K_ADD, KT_I64, OP2(t, K_MUL, KT_I64, t->g, C_i(t, KT_I64, I)), i), C_i(t, KT_I64, J)), jj);
    kb_accum(b, inner, LD(t, x3, off3));
    kb_endloop(b);
    kb_accum(b, outer, inner);
    kb_endloop(b);
    ST(t, onest, t->g, outer);
    /* a loop of loaded extent (0 .. W-1): sum of x[row, 0..len) */
    int dsum = kb_acc(b, KT_F32, K_ADD, 0.0);
    int dj = kb_loop_dyn(b, LD(t, len, t->g));
    kb_accum(b, dsum, LD(t, x, OP2(t, K_ADD, KT_I64, row, dj)));
    kb_endloop(b);
    ST(t, odyn, t->g, dsum);
    kir_finish(t->k);
    static const double zero_len[] = {0, 0, W, 1};
    Init init[14];
    for (int k = 0; k < 14; k++) init[k] = init_default;
    init[1] = (Init){-1000, 1000, 0, NULL};
    init[3] = (Init){0, W, 4, zero_len};
    /* sums of 37 values in [-1, 1]: scaled by the buffer's mean magnitude (see the top) */
    for (int disjoint = 0; disjoint < 2; disjoint++) {
        Jit jt;
        KernelFn fn = NULL;
        if (jit_open(&jt, &t->k, 1, &fn, disjoint))
            run_kernel(disjoint ? "k_control (disjoint)" : "k_control", t->k, fn, init, 1e-5, 1.0);
        jit_close(&jt);
    }
    kb_done(t);
}

/* A static loop of extent 0 and an if that is never taken leave the output as it was. */
static void test_empty_loop(void) {
    KB *t = kb_start("k_empty", KK_ELEMENTWISE, 8);
    int o = B1(t, DT_F32, 8, 1);
    int acc = kb_acc(t->b, KT_F32, K_ADD, 5.0);
    int j = kb_loop(t->b, 0);
    kb_accum(t->b, acc, OP1(t, K_CAST, KT_F32, j));
    ST(t, o, t->g, C_f(t, KT_F32, 99.0));
    kb_endloop(t->b);
    ST(t, o, t->g, OP2(t, K_ADD, KT_F32, acc, LD(t, o, t->g)));
    kir_finish(t->k);
    Jit jt;
    KernelFn fn = NULL;
    if (jit_open(&jt, &t->k, 1, &fn, 1)) {
        float out[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        void *bufs[1] = {out};
        fn(bufs, 2, 6);
        CHECK(out[0] == 1 && out[1] == 2 && out[2] == 8 && out[5] == 11 && out[6] == 7 && out[7] == 8,
              "only work items 2..5 ran, each adding the untouched accumulator 5: %g %g %g %g %g", out[0], out[1], out[2], out[5],
              out[6]);
    }
    jit_close(&jt);
    kb_done(t);
}

/* ---- the module: printing, optimising, object files ---------------------------------------------------------- */

static void test_print_optimize_object(void) {
    KB *t = kb_start("k3_scale_exp", KK_ELEMENTWISE, 1024);
    int x = B1(t, DT_F32, 1024, 0), y = B1(t, DT_F32, 1024, 1);
    ST(t, y, t->g, OP1(t, K_EXP, KT_F32, OP2(t, K_MUL, KT_F32, LD(t, x, t->g), C_f(t, KT_F32, 0.5))));
    kir_finish(t->k);
    KB *t2 = kb_start("k4_axpy", KK_ELEMENTWISE, 1024); /* a loop the vectoriser takes */
    int x2 = B1(t2, DT_F32, 1024, 0), y2 = B1(t2, DT_F32, 1024, 1);
    ST(t2, y2, t2->g, OP2(t2, K_ADD, KT_F32, OP2(t2, K_MUL, KT_F32, LD(t2, x2, t2->g), C_f(t2, KT_F32, 0.5)), LD(t2, y2, t2->g)));
    kir_finish(t2->k);
    Arena ar = {0};
    CpuTarget tg;
    const char *err = NULL;
    if (cpu_target_host(&tg, &ar, &err)) {
        CHECK(0, "host target: %s", err);
        arena_free(&ar);
        kb_done(t);
        return;
    }
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = cpu_module_new(ctx, &tg, "print_test");
    cpu_lower_kernel(m, t->k, 0);
    cpu_lower_kernel(m, t2->k, 0);
    /* the listing: the kernel's header, the note, its KIR, values named after the KIR */
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    Kernel *ks[1] = {t->k};
    const char *notes[1] = {"%7 mul  demo.mbt:3:9\n%8 exp  demo.mbt:3:5"};
    cpu_print_module(out, m, ks, notes, 1, NULL, 0);
    fclose(out);
    CHECK(strstr(text, "; kernel k3_scale_exp: elementwise, grid 1024") != NULL, "kernel header");
    CHECK(strstr(text, ";   bufs[0] = p0: f32[1024] read") && strstr(text, ";   bufs[1] = p1: f32[1024] written"),
          "buffers listed");
    CHECK(strstr(text, ";   %8 exp  demo.mbt:3:5") != NULL, "the note's lines");
    CHECK(strstr(text, "; kir:") && strstr(text, "define void @k3_scale_exp(ptr") && strstr(text, "%gid = phi i64"),
          "KIR listing and the function");
    CHECK(strstr(text, "@llvm.exp.f32") && strstr(text, "%load") && strstr(text, "%mul"), "named values and intrinsics");
    const char *hdr = strstr(text, "; kernel"), *def = strstr(text, "define void @k3");
    CHECK(hdr && def && hdr < def, "the listing comes before the function");
    if (unit_case_failures) unit_detail("module", text);
    free(text);
    CHECK(cpu_optimize(m, &tg, &ar, &err) == 0, "cpu_optimize: %s", err ? err : "");
    CHECK(cpu_verify(m, &ar, &err) == 0, "the optimised module verifies: %s", err ? err : "");
    /* k4_axpy's gid loop is vectorised for the host (AVX2 or SSE2: <8 x float> or <4 x float>) */
    char *opt = LLVMPrintModuleToString(m);
    const char *axpy = strstr(opt, "define void @k4_axpy(");
    CHECK(axpy && strstr(axpy, " x float>") != NULL, "the optimised elementwise loop is vectorised");
    LLVMDisposeMessage(opt);
    char path[] = "/tmp/mbt_test_cpu_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        CHECK(cpu_emit_object(m, &tg, path, &ar, &err) == 0, "cpu_emit_object: %s", err ? err : "");
        LLVMMemoryBufferRef mb = NULL;
        char *msg = NULL;
        if (LLVMCreateMemoryBufferWithContentsOfFile(path, &mb, &msg) == 0) {
            const char *bytes = LLVMGetBufferStart(mb);
            CHECK(LLVMGetBufferSize(mb) > 64 && memcmp(bytes, "\177ELF", 4) == 0, "an ELF object");
            LLVMBinaryRef bin = LLVMCreateBinary(mb, ctx, &msg);
            CHECK(bin != NULL, "LLVM reads the object back: %s", msg ? msg : "");
            int found = 0;
            if (bin) {
                LLVMSymbolIteratorRef it = LLVMObjectFileCopySymbolIterator(bin);
                while (!LLVMObjectFileIsSymbolIteratorAtEnd(bin, it)) {
                    if (strcmp(LLVMGetSymbolName(it), "k3_scale_exp") == 0 && LLVMGetSymbolSize(it) > 0) found = 1;
                    LLVMMoveToNextSymbol(it);
                }
                LLVMDisposeSymbolIterator(it);
                LLVMDisposeBinary(bin);
            }
            CHECK(found, "the object defines k3_scale_exp");
            LLVMDisposeMemoryBuffer(mb);
        } else {
            CHECK(0, "reading %s: %s", path, msg);
        }
        if (msg) LLVMDisposeMessage(msg);
        unlink(path);
        /* an unwritable path is an error that says what was being done */
        err = NULL;
        CHECK(cpu_emit_object(m, &tg, "/nonexistent-dir/x.o", &ar, &err) == 1 && err &&
                  strstr(err, "cannot write object file '/nonexistent-dir/x.o'"),
              "an unwritable object path is reported: %s", err ? err : "(nothing)");
    }
    LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    cpu_target_dispose(&tg);
    arena_free(&ar);
    kb_done(t);
    kb_done(t2);
}

/* ---- the kernels fusion makes --------------------------------------------------------------------------------- */

/* A GEMM launch on f32 buffers (double accumulation): only to carry a schedule's values from
 * one kernel to the next; the GEMMs themselves are the runtime's (OpenBLAS). */
static void gemm_f32(const FuseGemm *m, void **bufs) {
    const float *A = bufs[m->a], *B = bufs[m->b];
    float *C = bufs[m->c];
    for (int64_t j = 0; m->epilogue == FE_BGRAD_B && j < m->n; j++) { /* batch 1 */
        double s = 0;
        for (int64_t p = 0; p < m->k; p++) s += m->trans_b ? B[j * m->ldb + p] : B[p * m->ldb + j];
        ((float *)bufs[m->bias])[j] = (float)s;
    }
    for (int64_t t = 0; t < m->batch; t++)
        for (int64_t i = 0; i < m->m; i++)
            for (int64_t j = 0; j < m->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < m->k; p++) {
                    double x = m->trans_a ? A[t * m->stride_a + p * m->lda + i] : A[t * m->stride_a + i * m->lda + p];
                    double y = m->trans_b ? B[t * m->stride_b + j * m->ldb + p] : B[t * m->stride_b + p * m->ldb + j];
                    s += x * y;
                }
                float *out = &C[t * m->stride_c + i * m->ldc + j];
                *out = (float)((m->beta == 0 ? m->alpha * s : m->alpha * s + m->beta * *out) +
                               (m->epilogue == FE_BIAS ? ((const float *)bufs[m->bias])[j] : 0.0));
            }
}

/* What a leaf of a schedule starts as: token ids and other integers in [0, 2) (valid indices
 * into every table these programs have); the optimizer's step t an integer in [1, 10], its
 * learning rate in [1e-4, 1e-2], its state (second moments included) in [0, 1]; anything else
 * in [-1, 1]. */
static Init leaf_init(const Graph *g, const FuseBuffer *b) {
    const char *name = b->node >= 0 ? graph_node(g, b->node)->name : NULL;
    if (!dtype_is_float(b->dt)) return (Init){0, 2, 0, NULL};
    if (name && strcmp(name, "t") == 0) return (Init){1, 10.999, 0, NULL};
    if (name && strcmp(name, "lr") == 0) return (Init){1e-4, 1e-2, 0, NULL};
    if (name && strncmp(name, "state.", 6) == 0) return (Init){0, 1, 0, NULL};
    return init_default;
}

/* A fused schedule run in launch order on the CPU (GEMMs by gemm_f32, kernels JIT-compiled in one
 * module) from random leaves, so every kernel sees the values its producers make; each kernel is
 * checked by run_on against kir_ref on its own inputs (tolerances at the top). */
static void check_schedule(const char *what, const FuseResult *r, const Graph *g, int disjoint) {
    Jit j;
    KernelFn *fns = calloc((size_t)r->nkernels, sizeof(KernelFn));
    void **mem = calloc((size_t)r->nbuffers + 1, sizeof(void *));
    if (!fns || !mem) exit(1);
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *b = &r->buffers[i];
        int64_t n = 1;
        for (int d = 0; d < b->rank; d++) n *= b->shape[d];
        mem[i] = calloc((size_t)n + 1, (size_t)dtype_size(b->dt));
        if (!mem[i]) exit(1);
        int leaf = b->kind == FB_PARAM || b->kind == FB_INPUT;
        Init in = leaf_init(g, b);
        for (int64_t e = 0; e < n; e++) {
            double v = leaf ? rng_uniform(in.lo, in.hi) : NAN; /* NaN: read before written shows */
            mem_set(b->dt, mem[i], e, dtype_is_float(b->dt) ? v : leaf ? floor(v) : 0);
        }
    }
    if (jit_open(&j, r->kernels, r->nkernels, fns, disjoint)) {
        double worst = 0;
        for (int li = 0; li < r->nlaunches; li++) {
            const FuseLaunch *L = &r->launches[li];
            if (L->kind == FL_GEMM) {
                gemm_f32(&L->gemm, mem);
                continue;
            }
            Kernel *k = r->kernels[L->kernel];
            void **kb = calloc((size_t)k->nbufs + 1, sizeof(void *));
            if (!kb) exit(1);
            for (int p = 0; p < k->nbufs; p++) kb[p] = mem[k->bufs[p].buffer];
            char name[256];
            snprintf(name, sizeof name, "%s/%s%s", what, k->name, disjoint ? " (disjoint)" : "");
            Outcome o = run_on(name, k, fns[L->kernel], kb, 1e-5, 1.0);
            if (o.max_err > worst) worst = o.max_err;
            free(kb);
        }
        printf("# %s%s: %d kernels, max error %.3g\n", what, disjoint ? " (disjoint)" : "", r->nkernels, worst);
    }
    jit_close(&j);
    for (int i = 0; i < r->nbuffers; i++) free(mem[i]);
    free(mem);
    free(fns);
}

/* A fused graph: its schedule run twice, assuming nothing about aliasing and with `disjoint`
 * (every buffer here has memory of its own). */
static void check_fused(const char *what, const Graph *g, Arena *ar) {
    FuseResult *r = fuse_graph(g, NULL, 0, ar);
    CHECK(fuse_verify(r, stdout) == 0, "%s: the fusion verifies", what);
    if (!r->nkernels) return;
    check_schedule(what, r, g, 0);
    check_schedule(what, r, g, 1);
}

static void fused_program(const char *path) {
    Arena ar = {0};
    Loader ld;
    loader_init(&ld, &ar, NULL, 0, "stdlib");
    Module *m = loader_main(&ld, path);
    CHECK(m && !diag_error_count(), "%s parses", path);
    if (m && !diag_error_count()) {
        TrainBuild *tb = sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, &ar);
        CHECK(tb != NULL, "%s builds its train block", path);
        if (tb) {
            autodiff(tb->step);
            check_fused(arena_printf(&ar, "%s step", path), tb->step, &ar);
            if (tb->update) check_fused(arena_printf(&ar, "%s update", path), tb->update, &ar);
        }
    }
    arena_free(&ar);
}

/* The programs: every .mbt in tests/golden and tests/fuse, without the cases the compiler must
 * refuse (a NAME.err or NAME.STAGE.err beside them). */
static char fused_paths[64][256];
static int nfused;
static int fused_next;

static void test_fused_program(void) { fused_program(fused_paths[fused_next]); }

static void test_fused_programs_found(void) {
    CHECK(nfused >= 5, "the programs of tests/golden and tests/fuse are found (run from the repository root): %d", nfused);
}

static void find_programs(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "for f in %s/*.mbt; do s=${f%%.mbt}; [ -f \"$f\" ] || continue; "
             "[ -e \"$s.err\" ] || ls \"$s\".*.err >/dev/null 2>&1 || echo \"$f\"; done",
             dir);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    char line[256];
    while (nfused < 64 && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        snprintf(fused_paths[nfused++], sizeof fused_paths[0], "%s", line);
    }
    pclose(p);
}

/* ---- main -------------------------------------------------------------------------------------------------------- */

/* ---- the paged KV cache's kernels (fuse_kv.h) --------------------------------------------------
 * Three sequences of different lengths, their blocks scattered through the pool by a permutation,
 * run as launches that mix sequences: every launch takes the next `chunk` positions of each
 * sequence that has any left (a decode when chunk = 1), padded with rows of no sequence. Each
 * output row is held
 *   - bit for bit to a C float reference that computes it in the unpaged kernel's order
 *     (cg_attention: the max pass, then exp and the output accumulated in f32, then the division;
 *     no contraction in either), so every chunk size gives the same bits: chunked prefill ==
 *     unchunked, and a sequence batched with others == alone;
 *   - to a double reference, 1e-5 relative (f32 rounding over at most 22 keys of width 8).
 * With a bf16 pool both references read keys and values rounded to bf16 (nearest even, this
 * file's bf16_from_float), so the rounding on the write is checked too; and the bf16 results
 * stay within 2e-2 of the f32 pool's (bf16 keeps 8 bits: 2^-8 relative per key and value). */

enum { KVT_H = 4, KVT_HK = 2, KVT_D = 8, KVT_BLOCK = 4, KVT_SEQS = 3, KVT_MAXB = 6, KVT_MAXLEN = KVT_BLOCK * KVT_MAXB };
enum { KVT_W = KVT_H + 2 * KVT_HK }; /* a row of the sources: q heads, k heads, v heads */

static const int kvt_len[KVT_SEQS] = {13, 1, 22};
static float kvt_qkv[KVT_SEQS][KVT_MAXLEN][KVT_W][KVT_D];

static void kvt_fill(void) {
    for (int s = 0; s < KVT_SEQS; s++)
        for (int p = 0; p < KVT_MAXLEN; p++)
            for (int w = 0; w < KVT_W; w++)
                for (int c = 0; c < KVT_D; c++) kvt_qkv[s][p][w][c] = (float)rng_uniform(-2.0, 2.0);
}

static float kvt_kv(int s, int p, int w, int c, int bf16) {
    float x = kvt_qkv[s][p][w][c];
    return bf16 ? (float)bf16_to_double(bf16_from_float(x)) : x;
}

/* Row (s, i), head h: out[c] as cg_attention computes it (float), and in double. */
static void kvt_reference(int s, int i, int h, double scale, int bf16, float *outf, double *outd) {
    int kh = h / (KVT_H / KVT_HK), kw = KVT_H + kh, vw = KVT_H + KVT_HK + kh;
    float sc[KVT_MAXLEN];
    double sd[KVT_MAXLEN];
    float m = -INFINITY;
    double md = -INFINITY;
    for (int j = 0; j <= i; j++) {
        float acc = 0;
        double accd = 0;
        for (int c = 0; c < KVT_D; c++) {
            acc += kvt_qkv[s][i][h][c] * kvt_kv(s, j, kw, c, bf16);
            accd += (double)kvt_qkv[s][i][h][c] * kvt_kv(s, j, kw, c, bf16);
        }
        sc[j] = (float)scale * acc;
        sd[j] = scale * accd;
        m = fmaxf(m, sc[j]);
        md = fmax(md, sd[j]);
    }
    float sum = 0;
    double sumd = 0;
    for (int c = 0; c < KVT_D; c++) outf[c] = 0, outd[c] = 0;
    for (int j = 0; j <= i; j++) {
        float p = expf(sc[j] - m);
        double pd = exp(sd[j] - md);
        sum += p;
        sumd += pd;
        for (int c = 0; c < KVT_D; c++) {
            outf[c] = outf[c] + p * kvt_kv(s, j, vw, c, bf16);
            outd[c] += pd * kvt_kv(s, j, vw, c, bf16);
        }
    }
    for (int c = 0; c < KVT_D; c++) outf[c] = outf[c] / sum, outd[c] /= sumd;
}

/* Runs every sequence through launches of `chunk` positions per sequence; out[s][p][h][c]. The
 * kernel is layer 1 of 2, its pool starting 3 elements into its parameter, so the layer and
 * offset arithmetic is exercised; layer 0's part of each slot must stay untouched. */
static int kvt_run(int chunk, DType kv_dt, float (*out)[KVT_MAXLEN][KVT_H][KVT_D]) {
    int64_t N = (int64_t)chunk * KVT_SEQS, slots = (int64_t)KVT_SEQS * KVT_MAXB * KVT_BLOCK, L = 2, off = 3;
    int64_t per_slot = L * 2 * KVT_HK * KVT_D, pool_numel = off + slots * per_slot;
    KvAttnShape sh = {.N = N,
                      .H = KVT_H,
                      .Hk = KVT_HK,
                      .D = KVT_D,
                      .block = KVT_BLOCK,
                      .max_blocks = KVT_MAXB,
                      .layer = 1,
                      .L = L,
                      .dt = DT_F32,
                      .kv_dt = kv_dt,
                      .scale = 1.0 / sqrt((double)KVT_D),
                      .pool_off = off};
    int64_t src_numel = N * KVT_W * KVT_D, out_numel = N * KVT_H * KVT_D, meta_numel = kv_meta_numel(N, KVT_MAXB);
    sh.q = (KView){0, 0, {0, KVT_D, KVT_W * KVT_D, 1}};
    sh.k = (KView){0, KVT_H * KVT_D, {0, KVT_D, KVT_W * KVT_D, 1}};
    sh.v = (KView){0, (KVT_H + KVT_HK) * KVT_D, {0, KVT_D, KVT_W * KVT_D, 1}};
    sh.out = (KView){0, 0, {0, KVT_D, KVT_H * KVT_D, 1}};
    CHECK(kv_shape_problem(&sh) == NULL, "the shape is valid");
    Arena ar = {0};
    Kernel *k = kv_attn_kernel(&ar, "kv_attn", &sh, 1, &src_numel, pool_numel, out_numel);
    int ok = 1;
    if (kir_verify(k, stderr) != 0) {
        CHECK(0, "%s verifies", k->name);
        ok = 0;
    }
    KernelFn fn;
    Jit j;
    if (!ok || !jit_open(&j, &k, 1, &fn, 1)) {
        arena_free(&ar);
        return 0;
    }
    size_t esz = kv_dt == DT_BF16 ? 2 : 4;
    float *src = calloc((size_t)src_numel, sizeof(float)), *o = calloc((size_t)out_numel, sizeof(float));
    unsigned char *pool = calloc((size_t)pool_numel, esz);
    int32_t *meta = calloc((size_t)meta_numel, 4);
    int32_t table[KVT_SEQS][KVT_MAXB];
    for (int b = 0; b < KVT_SEQS * KVT_MAXB; b++)
        table[b / KVT_MAXB][b % KVT_MAXB] = (int32_t)((b * 7 + 5) % (KVT_SEQS * KVT_MAXB));
    for (int s = 0; s < KVT_SEQS; s++) memcpy(meta + KV_META_TABLE * N + s * KVT_MAXB, table[s], sizeof table[s]);
    void *bufs[4] = {src, meta, pool, o};
    for (int start = 0; start < KVT_MAXLEN; start += chunk) {
        int64_t rows = 0;
        int who[64][2];
        for (int s = 0; s < KVT_SEQS; s++)
            for (int p = start; p < start + chunk && p < kvt_len[s]; p++) {
                memcpy(src + rows * KVT_W * KVT_D, kvt_qkv[s][p], sizeof kvt_qkv[s][p]);
                meta[KV_META_POS * N + rows] = p;
                meta[KV_META_SEQ * N + rows] = s;
                meta[KV_META_START * N + rows] = start;
                meta[KV_META_SLOT * N + rows] = table[s][p / KVT_BLOCK] * KVT_BLOCK + p % KVT_BLOCK;
                who[rows][0] = s, who[rows][1] = p;
                rows++;
            }
        if (!rows) break;
        for (int64_t r = rows; r < N; r++) { /* padding: garbage sources, no sequence */
            for (int c = 0; c < KVT_W * KVT_D; c++) src[r * KVT_W * KVT_D + c] = 1e30f;
            meta[KV_META_POS * N + r] = 0, meta[KV_META_SEQ * N + r] = -1;
            meta[KV_META_START * N + r] = 0, meta[KV_META_SLOT * N + r] = -1;
        }
        fn(bufs, 0, N * KVT_H);
        for (int64_t r = 0; r < N; r++)
            for (int h = 0; h < KVT_H; h++)
                for (int c = 0; c < KVT_D; c++) {
                    float v = o[(r * KVT_H + h) * KVT_D + c];
                    if (r < rows) out[who[r][0]][who[r][1]][h][c] = v;
                    else if (v != 0) {
                        CHECK(0, "padding row %lld is zero, not %g", (long long)r, (double)v);
                        ok = 0;
                    }
                }
    }
    int64_t touched = 0; /* layer 0's halves of every slot, and the offset, are never written */
    for (int64_t i = 0; i < off * (int64_t)esz; i++) touched += pool[i] != 0;
    for (int64_t sl = 0; sl < slots; sl++)
        for (int64_t i = 0; i < 2 * KVT_HK * KVT_D * (int64_t)esz; i++)
            touched += pool[(off + sl * per_slot) * (int64_t)esz + i] != 0;
    CHECK(touched == 0, "%lld bytes outside layer 1's part of the pool were written", (long long)touched);
    free(src), free(o), free(pool), free(meta);
    jit_close(&j);
    arena_free(&ar);
    return ok;
}

static float kvt_out[2][KVT_SEQS][KVT_MAXLEN][KVT_H][KVT_D]; /* the last run, and the f32 pool's whole-sequence run */

static void kv_paged(DType kv_dt) {
    int bf16 = kv_dt == DT_BF16;
    double scale = 1.0 / sqrt((double)KVT_D);
    static const int chunks[] = {KVT_MAXLEN, 1, 3, 5};
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
        if (!kvt_run(chunks[ci], kv_dt, kvt_out[0])) return;
        int64_t bad = 0;
        double worst = 0, vs32 = 0;
        for (int s = 0; s < KVT_SEQS; s++)
            for (int i = 0; i < kvt_len[s]; i++)
                for (int h = 0; h < KVT_H; h++) {
                    float rf[KVT_D];
                    double rd[KVT_D];
                    kvt_reference(s, i, h, scale, bf16, rf, rd);
                    for (int c = 0; c < KVT_D; c++) {
                        float got = kvt_out[0][s][i][h][c];
                        bad += memcmp(&got, &rf[c], sizeof got) != 0;
                        worst = fmax(worst, fabs(got - rd[c]) / fmax(1.0, fabs(rd[c])));
                        if (bf16) vs32 = fmax(vs32, fabs((double)got - kvt_out[1][s][i][h][c]));
                    }
                }
        CHECK(bad == 0, "chunk %d, %s pool: %lld values differ from the float reference's bits", chunks[ci], dtype_name(kv_dt),
              (long long)bad);
        CHECK(worst < 1e-5, "chunk %d, %s pool: error %.3g against the double reference", chunks[ci], dtype_name(kv_dt), worst);
        if (bf16) CHECK(vs32 < 2e-2, "chunk %d: the bf16 pool's results are within %.3g of the f32 pool's", chunks[ci], vs32);
        if (!bf16 && ci == 0) memcpy(kvt_out[1], kvt_out[0], sizeof kvt_out[0]);
    }
}

static void test_kv_paged_f32(void) {
    kvt_fill();
    kv_paged(DT_F32);
}

static void test_kv_paged_bf16(void) {
    kvt_fill();
    kv_paged(DT_F32); /* the f32 pool's results first, for the comparison */
    kv_paged(DT_BF16);
}

/* The kernel prints (--emit=kernels shows it as any other kernel). */
static void test_kv_print(void) {
    KvAttnShape sh = {.N = 2,
                      .H = 2,
                      .Hk = 1,
                      .D = 4,
                      .block = 2,
                      .max_blocks = 2,
                      .layer = 0,
                      .L = 1,
                      .dt = DT_F32,
                      .kv_dt = DT_BF16,
                      .scale = 0.5};
    int64_t numel[3] = {16, 8, 8};
    sh.q = (KView){0, 0, {0, 4, 8, 1}};
    sh.k = (KView){1, 0, {0, 4, 4, 1}};
    sh.v = (KView){2, 0, {0, 4, 4, 1}};
    sh.out = (KView){0, 0, {0, 4, 8, 1}};
    Arena ar = {0};
    Kernel *a = kv_attn_kernel(&ar, "kv_attn", &sh, 3, numel, 64, 16);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    kir_print_body(f, a, 2);
    fclose(f);
    CHECK(kir_verify(a, stderr) == 0, "the kernel verifies");
    CHECK(strstr(text, "loop") && strstr(text, "exp"), "the attention body prints with its loops and exp:\n%s", text);
    CHECK(a->bufs[4].dt == DT_BF16 && a->bufs[4].written && a->bufs[5].written, "pool in bf16, pool and output written");
    free(text);
    arena_free(&ar);
}

int main(void) {
    rng_state = 20240611;
    RUN(test_float_binary_f32);
    RUN(test_float_binary_f64);
    RUN(test_float_unary_f32);
    RUN(test_float_unary_f64);
    RUN(test_nan_max_min_mod);
    RUN(test_integer_ops);
    RUN(test_compare_logic);
    RUN(test_casts);
    RUN(test_u64_hash);
    RUN(test_f16_buffers);
    RUN(test_bf16_buffers);
    RUN(test_bf16_rounding_edges);
    RUN(test_loops_accumulators_ifs);
    RUN(test_empty_loop);
    RUN(test_print_optimize_object);
    RUN(test_kv_paged_f32);
    RUN(test_kv_paged_bf16);
    RUN(test_kv_print);
    find_programs("tests/golden");
    find_programs("tests/fuse");
    RUN(test_fused_programs_found);
    for (fused_next = 0; fused_next < nfused; fused_next++) { /* test_fused:golden/gpt ... */
        char name[300];
        const char *path = fused_paths[fused_next];
        snprintf(name, sizeof name, "test_fused:%.*s", (int)strlen(path) - 10, path + 6);
        unit_run(name, test_fused_program);
    }
    return unit_finish();
}
