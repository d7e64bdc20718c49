/* test_schedule.c - the learning-rate schedule lowered by sema (schedule.c) to a scalar program
 * (scalar.h) and by the CPU back end to `double lr_schedule(int64_t)` (cpu_scalar.c): its values,
 * JIT-compiled, equal bit for bit a C evaluation in doubles of the same schedule written out by
 * hand (the same operations in the same order), at many steps; lr.cosine, lr.linear_warmup,
 * lr.constant, no schedule, and a hand-written one with if/else, early returns, locals, and/or/not
 * and the math builtins. Constructs a schedule cannot use are errors sema reports at their source. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>

#include "arena.h"
#include "cpu.h"
#include "cpu_scalar.h"
#include "diag.h"
#include "module.h"
#include "parse.h"
#include "plan.h"
#include "scalar.h"
#include "sema.h"
#include "unit.h"

#define MODEL                                                                                                                    \
    "model P(n = 5) {\n"                                                                                                         \
    "  b = param f32[n, 3] ~ normal(0, 1)\n"                                                                                     \
    "  fn forward(idx: i32[B, T]) -> f32[B, T, 3] {\n"                                                                           \
    "    return one_hot(idx, n) @ b\n"                                                                                           \
    "  }\n"                                                                                                                      \
    "}\n"

#define HAND                                                                                                                     \
    "fn hand(step, base = 2.0, k = 3) -> f32 {\n"                                                                                \
    "  x = float(step) * 0.01\n"                                                                                                 \
    "  if step < 10 and not (step == 3) {\n"                                                                                     \
    "    y = x + 1.0\n"                                                                                                          \
    "  } else {\n"                                                                                                               \
    "    if step % 7 == 0 or step > 1000 {\n"                                                                                    \
    "      return min(sqrt(x), 5.0) / base\n"                                                                                    \
    "    }\n"                                                                                                                    \
    "    y = exp(-x) + abs(sin(x)) ^ 2.0\n"                                                                                      \
    "  }\n"                                                                                                                      \
    "  if y > 1.5 {\n"                                                                                                           \
    "    return log(y) * int(k * 1.5)\n"                                                                                         \
    "  }\n"                                                                                                                      \
    "  y = max(y, pi / 10.0)\n"                                                                                                  \
    "  return y\n"                                                                                                               \
    "}\n"

/* The train block with `lr = <lr>` (none when lr is NULL), its functions `extra`, and the batch
 * setting `batch` (none when NULL). */
static const char *program_batch(Arena *ar, const char *lr, const char *extra, const char *batch) {
    return arena_printf(ar,
                        "import optim\nimport lr\n" MODEL "%s"
                        "train t {\n  model = P()\n  data = tokens(\"x.bin\", seq = 4)\n"
                        "  loss = cross_entropy(model(data.x), data.y)\n  optimizer = optim.sgd(lr = 0.1)\n"
                        "  steps = 100\n%s%s%s%s%s}\n",
                        extra, lr ? "  lr = " : "", lr ? lr : "", lr ? "\n" : "", batch ? batch : "", batch ? "\n" : "");
}

static const char *program(Arena *ar, const char *lr, const char *extra) { return program_batch(ar, lr, extra, NULL); }

/* The train block's schedule as sema lowered it; NULL after errors. */
static const ScalarProg *lowered(Arena *ar, const char *src) {
    size_t len = strlen(src);
    char *text = arena_strndup(ar, src, len);
    uint32_t file = diag_add_source("schedule_test.mbt", text, (uint32_t)len);
    Module *m = arena_alloc(ar, sizeof(Module));
    m->name = "schedule_test";
    m->path = "schedule_test.mbt";
    m->file = file;
    int before = diag_error_count();
    m->ast = parse_source(ar, file);
    if (diag_error_count() != before) return NULL;
    Loader ld;
    loader_init(&ld, ar, NULL, 0, "stdlib");
    ptrvec_push(ar, &ld.modules, m);
    TrainBuild *tb = sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, ar);
    return tb ? tb->config->lr : NULL;
}

typedef double (*LrFn)(int64_t);

typedef struct Jit {
    Arena ar;
    CpuTarget target;
    LLVMOrcThreadSafeContextRef tsc;
    LLVMOrcLLJITRef jit;
} Jit;

static int jit_ok(LLVMErrorRef e, const char *what) {
    if (!e) return 1;
    char *msg = LLVMGetErrorMessage(e);
    CHECK(0, "%s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
    return 0;
}

/* p as lr_schedule in an optimised module (as the host code's), JIT-compiled; NULL on failure. */
static LrFn jit_schedule(Jit *j, const ScalarProg *p) {
    memset(j, 0, sizeof *j);
    const char *err = NULL;
    if (cpu_target_host(&j->target, &j->ar, &err)) {
        CHECK(0, "host target: %s", err);
        return NULL;
    }
    j->tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMModuleRef m = cpu_module_new(LLVMOrcThreadSafeContextGetContext(j->tsc), &j->target, "test_schedule");
    LLVMValueRef fn = cpu_scalar_function(m, p, "lr_schedule");
    LLVMSetLinkage(fn, LLVMExternalLinkage);
    if (cpu_verify(m, &j->ar, &err) || cpu_optimize(m, &j->target, &j->ar, &err)) {
        CHECK(0, "the module: %s", err);
        LLVMDisposeModule(m);
        return NULL;
    }
    if (!jit_ok(LLVMOrcCreateLLJIT(&j->jit, NULL), "creating the LLJIT")) return NULL;
    LLVMOrcDefinitionGeneratorRef gen = NULL;
    if (!jit_ok(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL),
                "process symbols"))
        return NULL;
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->jit), gen);
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m, j->tsc);
    if (!jit_ok(LLVMOrcLLJITAddLLVMIRModule(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), tsm), "adding the module")) {
        LLVMOrcDisposeThreadSafeModule(tsm);
        return NULL;
    }
    LLVMOrcExecutorAddress addr = 0;
    if (!jit_ok(LLVMOrcLLJITLookup(j->jit, &addr, "lr_schedule"), "lr_schedule")) return NULL;
    return (LrFn)(uintptr_t)addr;
}

static void jit_close(Jit *j) {
    if (j->jit) jit_ok(LLVMOrcDisposeLLJIT(j->jit), "disposing the LLJIT");
    if (j->tsc) LLVMOrcDisposeThreadSafeContext(j->tsc);
    cpu_target_dispose(&j->target);
    arena_free(&j->ar);
}

/* ---- the schedules in C doubles, as the source writes them ---- */

static double c_cosine(int64_t s) { /* lr.cosine(warmup = 20, total = 400, min_ratio = 0.1) */
    double step = (double)s, warmup = 20, total = 400, min_ratio = 0.1;
    if (step < warmup) return (step + 1) / warmup;
    if (step >= total) return min_ratio;
    double progress = (step - warmup) / fmax(total - warmup, 1);
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
}

static double c_linear(int64_t s) { /* lr.linear_warmup(warmup = 50) */
    double step = (double)s, warmup = 50;
    if (step < warmup) return (step + 1) / warmup;
    return 1.0;
}

static double c_one(int64_t s) { return (void)s, 1.0; }

static double c_hand(int64_t s) { /* hand(base = 2.0), k from its default */
    double step = (double)s, base = 2.0, k = 3, y;
    double x = step * 0.01;
    if (step < 10 && !(step == 3)) {
        y = x + 1.0;
    } else {
        if (fmod(step, 7) == 0 || step > 1000) return fmin(sqrt(x), 5.0) / base;
        y = exp(-x) + pow(fabs(sin(x)), 2.0);
    }
    if (y > 1.5) return log(y) * trunc(k * 1.5);
    y = fmax(y, 3.14159265358979323846 / 10.0);
    return y;
}

/* The lowered schedule of `lr` (with the batch setting `batch`, NULL for none) equals want at
 * steps 0 .. 3000 and some far ones, bit for bit, compiled and in scalar_eval (the plan's listing). */
static void check_schedule_batch(const char *lr, const char *extra, const char *batch, double (*want)(int64_t)) {
    Arena ar = {0};
    const ScalarProg *p = lowered(&ar, program_batch(&ar, lr, extra, batch));
    CHECK(p != NULL, "%s: the program builds", lr ? lr : "(no lr)");
    Jit j;
    LrFn fn = p ? jit_schedule(&j, p) : NULL;
    int bad = 0;
    for (int64_t i = 0; fn && i < 3100 && bad < 5; i++) {
        int64_t step = i < 3000 ? i : ((int64_t)1 << 20) * (i - 2999) + i;
        double got = fn(step), w = want(step), e = scalar_eval(p, step);
        if (memcmp(&got, &w, sizeof got) != 0) {
            CHECK(0, "%s at step %lld: %.17g, the C evaluation %.17g", lr ? lr : "(no lr)", (long long)step, got, w);
            bad++;
        }
        if (memcmp(&e, &w, sizeof e) != 0) {
            CHECK(0, "%s at step %lld: scalar_eval %.17g, the C evaluation %.17g", lr ? lr : "(no lr)", (long long)step, e, w);
            bad++;
        }
    }
    if (p) jit_close(&j);
    arena_free(&ar);
}

static void check_schedule(const char *lr, const char *extra, double (*want)(int64_t)) {
    check_schedule_batch(lr, extra, NULL, want);
}

/* The global batch of RAMP: 4, then 8 from step 10, then 16 from step 20. */
#define RAMP "  batch { global = 4, micro = 2, ramp = [(10, 8), (20, 16)] }"
static double c_batch(int64_t s) { return s >= 20 ? 16 : s >= 10 ? 8 : 4; }
static double c_cosine_sqrt(int64_t s) { return c_cosine(s) * sqrt(c_batch(s) / 4.0); } /* x batch_scale(base = 4) */
static double c_linear_scaled(int64_t s) { return c_batch(s) / 8.0; } /* batch_scale(base = 8, rule = "linear") */
static void batch_sqrt_exact(void) {
    check_schedule_batch("lr.cosine(warmup = 20, total = 400, min_ratio = 0.1) * lr.batch_scale(base = 4)", "", RAMP,
                         c_cosine_sqrt);
}
static void batch_linear_exact(void) {
    check_schedule_batch("lr.batch_scale(base = 8, rule = \"linear\")", "", RAMP, c_linear_scaled);
}
static double c_batch_flat(int64_t s) { return (void)s, sqrt(4.0 / 2.0); } /* no ramp: the global batch throughout */
static void batch_flat_exact(void) {
    check_schedule_batch("lr.batch_scale(base = 2)", "", "  batch { global = 4, micro = 2 }", c_batch_flat);
}

static void cosine_exact(void) { check_schedule("lr.cosine(warmup = 20, total = 400, min_ratio = 0.1)", "", c_cosine); }
static void linear_exact(void) { check_schedule("lr.linear_warmup(warmup = 50)", "", c_linear); }
static void constant_exact(void) { check_schedule("lr.constant", "", c_one); }
static void none_exact(void) { check_schedule(NULL, "", c_one); }
static void hand_exact(void) { check_schedule("hand(base = 2.0)", HAND, c_hand); }

/* The program is straight-line SSA that verifies, and prints with its name and result. */
static void printed(void) {
    Arena ar = {0};
    const ScalarProg *p = lowered(&ar, program(&ar, "lr.linear_warmup(warmup = 50)", ""));
    CHECK(p && scalar_verify(p, stdout) == 0, "the lowered program verifies");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (p && f) scalar_print(p, f);
    if (f) fclose(f);
    CHECK(buf && strstr(buf, "scalar lr.linear_warmup(step, warmup = 50) -> f64 {\n  %0: f64 = step "), "the listing: %s",
          buf ? buf : "");
    CHECK(buf && strstr(buf, "= select ") && strstr(buf, "bool = lt %0, %1 "), "if and return as selects: %s", buf ? buf : "");
    CHECK(buf && strstr(buf, "# lr.mbt:"), "each instruction commented with its source line: %s", buf ? buf : "");
    free(buf);
    arena_free(&ar);
}

/* A loop in a schedule is an error sema reports where it is written, before any code exists. */
static void loop_refused(void) {
    Arena ar = {0};
    capture_begin();
    const ScalarProg *p = lowered(&ar, program(&ar, "looped",
                                               "fn looped(step) -> f32 {\n  x = 1.0\n"
                                               "  for i in [1, 2, 3] {\n    x = x * 0.5\n  }\n  return x\n}\n"));
    const char *out = capture_end();
    CHECK(p == NULL, "the program does not build");
    CHECK(strstr(out, "schedule_test.mbt:11:3: error: the learning-rate schedule uses a 'for' statement"), "the error: %s", out);
    arena_free(&ar);
}

int main(void) {
    RUN(cosine_exact);
    RUN(linear_exact);
    RUN(constant_exact);
    RUN(none_exact);
    RUN(hand_exact);
    RUN(batch_sqrt_exact);
    RUN(batch_linear_exact);
    RUN(batch_flat_exact);
    RUN(printed);
    RUN(loop_refused);
    return unit_finish();
}
