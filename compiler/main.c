/* main.c - the mbtc command line: reads options, runs the pipeline stages in order and prints
 * the stage asked for with --emit. Exit status: 0 success, 1 user errors, 2 internal error. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "graph.h"
#include "module.h"
#include "parse.h"
#include "sema.h"
#include "autodiff.h"
#include "plan.h"
#include "fuse.h"
#include "cpu.h"
#include "host.h"
#include "cuda_program.h"
#include "verify_step.h"

#define MBT_VERSION "0.1.0"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mbtc [options] FILE.mbt\n"
            "\n"
            "options:\n"
            "  --check            parse and check the program (names, types, shapes, settings); no output\n"
            "  --emit=STAGE       print a stage to stdout: tokens, ast, ir (the training step's forward\n"
            "                     graph), grad (forward and backward graph), plan (the step program,\n"
            "                     the optimizer's update graph and the memory plan), kernels (both\n"
            "                     graphs fused into GEMMs and generated kernels, with their bodies),\n"
            "                     llvm (the generated kernels as LLVM IR for the host CPU), program\n"
            "                     (the whole program -o builds, before optimisation: every kernel, the\n"
            "                     step functions that launch them and the descriptor, as LLVM IR)\n"
            "                     cuda (every kernel of the step, update and logits schedules as CUDA C),\n"
            "                     ptx, sass (that source compiled by NVRTC for each --cuda-arch; sass\n"
            "                     needs cuobjdump or nvdisasm)\n"
            "  --opt              with --emit=llvm: the IR after LLVM's O2 pipeline for this CPU\n"
            "  --cuda-arch=LIST   GPU architectures -o builds cubins for (with the PTX of the highest, which\n"
            "                     newer GPUs compile on first use), and those of ptx, sass, --cuda-info and\n"
            "                     --dump-dir (default sm_80,sm_90; none: -o builds for the CPU alone)\n"
            "  --cuda-info        with --emit=kernels: a '# ptxas' line a kernel (registers, spills, shared\n"
            "                     memory per architecture; needs NVRTC)\n"
            "  --dump-dir DIR     write every kernel's stages to DIR: .kir, .cu, .ARCH.ptx, .ARCH.sass, and\n"
            "                     the program's .cu, .ARCH.cubin, .ARCH.ptx, .ARCH.ptxas.log (needs NVRTC)\n"
            "  --train NAME       the train block -o and --emit=ir/grad/plan/kernels/llvm build (default: the first)\n"
            "  -o FILE            build the executable FILE for a train block (train, eval; see docs/cli.md)\n"
            "  --verify-step F    check a step the executable computed (`PROG train --steps 1 --dump-step F`)\n"
            "                     against the reference evaluator in double precision: loss and gradients\n"
            "  -I DIR             add DIR to the module search path (before $MBT_PATH and the stdlib)\n"
            "  --color            colour diagnostics (default: when stderr is a terminal)\n"
            "  --no-color         never colour diagnostics\n"
            "  --version          print the version\n"
            "  -h, --help         print this help\n"
            "\n"
            "environment:\n"
            "  MBT_PATH           colon-separated directories searched for imports\n"
            "  MBT_CUDA_ARCH      the default of --cuda-arch (none: executables for the CPU alone)\n"
            "  MBT_CACHE_DIR      NVRTC's output cache (default $XDG_CACHE_HOME/mbt or ~/.cache/mbt; off: none)\n"
            "\n"
            "exit status: 0 success, 1 errors in the program, 2 internal compiler error\n");
}

/* The stdlib shipped beside the compiler: <dir of mbtc>/../stdlib, else the source tree's. */
static const char *default_stdlib(Arena *ar) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    const char *beside = arena_printf(ar, "%s/../stdlib", exe);
    struct stat st;
    if (stat(beside, &st) == 0 && S_ISDIR(st.st_mode)) return beside;
#ifdef MBT_SOURCE_STDLIB
    return MBT_SOURCE_STDLIB; /* a build directory elsewhere (build/asan): the source tree's stdlib */
#else
    return beside;
#endif
}

/* --emit=ir and --emit=grad: the training step's graph, built while sema instantiates the train
 * block, verified (a failure is a compiler bug), then printed. */
static int emit_graph(Loader *ld, Arena *ar, Module *main_mod, const char *train, int grad) {
    Graph *g = sema_build_train_graph(ld, main_mod, train, ar);
    if (!g) return diag_finish();
    if (grad) autodiff(g);
    if (graph_verify(g, stderr))
        INTERNAL("the %s graph fails graph_verify (problems above)", grad ? "gradient" : "forward");
    graph_print(stdout, g, 0);
    return diag_finish();
}

/* --emit=plan: both graphs of the train block (the step, differentiated, and the optimizer's
 * update), verified, then the step program and memory plan built, verified and printed. */
static int emit_plan(Loader *ld, Arena *ar, Module *main_mod, const char *train) {
    TrainBuild *tb;
    Plan *plan = plan_for_train(ld, main_mod, train, &tb, ar);
    if (!plan) return diag_finish();
    plan_print(stdout, plan);
    return diag_finish();
}

/* --emit=kernels: the step graph (differentiated) and the optimizer's update graph, each fused
 * into launches (fuse.h), verified, and printed with their kernels. */
static int emit_kernels(Loader *ld, Arena *ar, Module *main_mod, const char *train, int fused) {
    TrainBuild *tb = sema_build_train(ld, main_mod, train, PLAN_ALIGN / 4, ar);
    if (!tb) return diag_finish();
    autodiff(tb->step);
    Graph *graphs[2] = {tb->step, tb->update};
    for (int i = 0; i < 2; i++) {
        if (!graphs[i]) continue;
        if (graph_verify(graphs[i], stderr)) INTERNAL("the %s graph fails graph_verify (problems above)", i ? "update" : "gradient");
        if (fused) { /* --emit=fused: the fused IR the launches are made from */
            FusedGraph *fg = fuse_lower_graph(graphs[i], NULL, 0, ar);
            if (fused_verify(fg, stderr)) INTERNAL("the fused IR fails fused_verify (problems above)");
            if (i) printf("\n");
            fused_print(stdout, fg);
            continue;
        }
        FuseResult *r = fuse_graph(graphs[i], NULL, 0, ar);
        if (fuse_verify(r, stderr)) INTERNAL("the fused %s graph fails fuse_verify (problems above)", i ? "update" : "step");
        if (i) printf("\n");
        fuse_print(stdout, r);
    }
    return diag_finish();
}

/* --emit=llvm: the kernels of --emit=kernels (the step graph's, then the update graph's), each
 * schedule's lowered by the CPU back end into one LLVM module for the host and printed with every
 * kernel's listing above its function; with --opt, after the O2 pipeline. */
static int emit_llvm(Loader *ld, Arena *ar, Module *main_mod, const char *train, int opt) {
    TrainBuild *tb = sema_build_train(ld, main_mod, train, PLAN_ALIGN / 4, ar);
    if (!tb) return diag_finish();
    autodiff(tb->step);
    CpuTarget target;
    const char *err = NULL;
    if (cpu_target_host(&target, ar, &err)) {
        diag_error_noloc("%s", err);
        return diag_finish();
    }
    LLVMContextRef ctx = LLVMContextCreate();
    Graph *graphs[2] = {tb->step, tb->update};
    static const char *const what[2] = {"step", "update"};
    for (int i = 0; i < 2 && !diag_error_count(); i++) {
        if (!graphs[i]) continue;
        if (graph_verify(graphs[i], stderr)) INTERNAL("the %s graph fails graph_verify (problems above)", what[i]);
        FuseResult *r = fuse_graph(graphs[i], NULL, 0, ar);
        if (fuse_verify(r, stderr)) INTERNAL("the fused %s graph fails fuse_verify (problems above)", what[i]);
        const char *name = arena_printf(ar, "%s %s", tb->step->name ? tb->step->name : "train", what[i]);
        LLVMModuleRef m = cpu_module_new(ctx, &target, name);
        const char **notes = arena_alloc(ar, sizeof(char *) * (size_t)(r->nkernels + 1));
        for (int k = 0; k < r->nkernels; k++) {
            /* the step's buffers are distinct activations (disjoint); the update writes in place */
            cpu_lower_kernel(m, r->kernels[k], i == 0);
            notes[k] = fuse_kernel_ops_note(graphs[i], r->kernels[k], ar);
        }
        if (cpu_verify(m, ar, &err)) INTERNAL("the %s kernels' LLVM module fails LLVMVerifyModule: %s", what[i], err);
        if (opt && cpu_optimize(m, &target, ar, &err)) diag_error_noloc("%s", err);
        else {
            if (i) printf("\n");
            cpu_print_module(stdout, m, r->kernels, notes, r->nkernels, NULL, 0);
        }
        LLVMDisposeModule(m);
    }
    LLVMContextDispose(ctx);
    cpu_target_dispose(&target);
    return diag_finish();
}

/* The CUDA stages: --emit=cuda (the source), ptx, sass, --cuda-info (after --emit=kernels'
 * listing) and --dump-dir, all from the schedules -o builds (host_schedules) in one translation
 * unit (cuda_program.h), compiled once per architecture. */
typedef struct CudaOpts {
    const char *archs[8];
    int narch;
    int info;            /* --cuda-info */
    const char *dump;    /* --dump-dir */
} CudaOpts;

static int emit_cuda(Loader *ld, Arena *ar, Module *main_mod, const char *train, const char *emit, const CudaOpts *co) {
    HostSchedules hs;
    if (host_schedules(ld, main_mod, train, &hs, ar)) return diag_finish();
    CudaSchedule cs[3];
    for (int i = 0; i < hs.n; i++) cs[i] = (CudaSchedule){hs.r[i], hs.g[i], hs.disjoint[i]};
    CudaProgram *p = cuda_program_build(cs, hs.n, ar);
    if (emit && strcmp(emit, "cuda") == 0) {
        fputs(p->source, stdout);
        if (!co->dump) return diag_finish();
    }
    int want_ptx = (emit && strcmp(emit, "ptx") == 0) || co->dump ? CUDA_PTX_ALL : CUDA_PTX_NONE;
    const char *what = co->dump ? "--dump-dir" : co->info ? "--cuda-info" : emit ? arena_printf(ar, "--emit=%s", emit) : "mbtc";
    NvrtcResult *res = arena_alloc(ar, sizeof *res * (size_t)co->narch);
    if (cuda_program_compile(p, co->archs, co->narch, want_ptx, res, what, ar)) return diag_finish();
    for (int a = 0; emit && a < co->narch; a++) {
        if (strcmp(emit, "ptx") == 0) {
            printf("%s// ---- %s (compute_%s) ----\n%s", a ? "\n" : "", co->archs[a], co->archs[a] + 3, res[a].ptx);
        } else if (strcmp(emit, "sass") == 0) {
            const char *err = NULL, *sass = cuda_sass(&res[a], ar, &err);
            if (!sass) {
                diag_error_noloc("%s", err);
                return diag_finish();
            }
            printf("%s// ---- %s ----\n%s", a ? "\n" : "", co->archs[a], sass);
        }
    }
    if (co->info) cuda_print_info(stdout, p, res, co->narch);
    if (co->dump && cuda_program_dump(p, res, co->narch, co->dump, ar) == 0)
        fprintf(stderr, "mbtc: wrote %d kernels' stages for %d architectures to %s\n", p->nkernels, co->narch, co->dump);
    return diag_finish();
}

/* The pipeline, stage by stage; returns the exit status. */
static int run(Loader *ld, Arena *ar, const char *input, const char *emit, int check, const char *output,
               const char *train, int opt, const char *verify, const CudaOpts *co) {
    if (emit && strcmp(emit, "tokens") == 0) {
        uint32_t len = 0;
        const char *why = NULL;
        char *text = loader_read_file(ar, input, &len, &why);
        if (!text) {
            diag_error_noloc("cannot read '%s': %s", input, why);
            return diag_finish();
        }
        parse_dump_tokens(stdout, diag_add_source(input, text, len));
        return diag_finish();
    }
    Module *main_mod = loader_main(ld, input);
    if (!main_mod || diag_error_count()) return diag_finish(); /* unreadable, or syntax errors */
    if (emit && strcmp(emit, "ast") == 0) {
        ast_print(stdout, main_mod->ast);
        return diag_finish();
    }
    if (emit && (strcmp(emit, "ir") == 0 || strcmp(emit, "grad") == 0))
        return emit_graph(ld, ar, main_mod, train, strcmp(emit, "grad") == 0);
    if (emit && strcmp(emit, "plan") == 0) return emit_plan(ld, ar, main_mod, train);
    if (emit && strcmp(emit, "fused") == 0) return emit_kernels(ld, ar, main_mod, train, 1);
    if (emit && strcmp(emit, "kernels") == 0) {
        int rc = emit_kernels(ld, ar, main_mod, train, 0);
        if (rc || !co->info) return rc;
        printf("\n");
        fflush(stdout);
        Loader fresh; /* sema checks a module once: the CUDA schedules are built from a second parse */
        Module *again = loader_reparse(&fresh, ld);
        if (!again) INTERNAL("cannot parse '%s' a second time", input);
        return emit_cuda(&fresh, ar, again, train, NULL, co);
    }
    if (co->info || co->dump || (emit && (strcmp(emit, "cuda") == 0 || strcmp(emit, "ptx") == 0 || strcmp(emit, "sass") == 0)))
        return emit_cuda(ld, ar, main_mod, train, emit && strcmp(emit, "kernels") != 0 ? emit : NULL, co);
    if (emit && strcmp(emit, "llvm") == 0) return emit_llvm(ld, ar, main_mod, train, opt);
    HostCuda hc = {co->archs, co->narch};
    if (emit && strcmp(emit, "program") == 0) return host_compile(ld, main_mod, input, train, NULL, &hc, ar);
    if (verify) return verify_step(ld, main_mod, train, verify, ar);
    if (output && !check) return host_compile(ld, main_mod, input, train, output, &hc, ar);
    sema_check(ld, main_mod);
    if (diag_error_count() || check) return diag_finish();
    {
        diag_error_noloc("no output file: give -o FILE to build an executable");
        diag_hint("use --check to check a program, or --emit=ast to print it");
        return diag_finish();
    }
}

int main(int argc, char **argv) {
    Arena ar = {0};
    const char *input = NULL, *emit = NULL, *output = NULL, *train = NULL, *verify = NULL;
    int check = 0, opt = 0;
    PtrVec incdirs = {0};
    CudaOpts co = {0};
    const char *arch_list = getenv("MBT_CUDA_ARCH") && *getenv("MBT_CUDA_ARCH") ? getenv("MBT_CUDA_ARCH") : "sm_80,sm_90";
    diag_set_color(isatty(2));

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--check") == 0) check = 1;
        else if (strncmp(a, "--emit=", 7) == 0) emit = a + 7;
        else if (strcmp(a, "--opt") == 0) opt = 1;
        else if (strncmp(a, "--cuda-arch=", 12) == 0) arch_list = a + 12;
        else if (strcmp(a, "--cuda-arch") == 0 && i + 1 < argc) arch_list = argv[++i];
        else if (strcmp(a, "--cuda-info") == 0) co.info = 1;
        else if (strcmp(a, "--dump-dir") == 0 && i + 1 < argc) co.dump = argv[++i];
        else if (strncmp(a, "--dump-dir=", 11) == 0) co.dump = a + 11;
        else if (strcmp(a, "-o") == 0 && i + 1 < argc) output = argv[++i];
        else if (strcmp(a, "--verify-step") == 0 && i + 1 < argc) verify = argv[++i];
        else if (strncmp(a, "--verify-step=", 14) == 0) verify = a + 14;
        else if (strcmp(a, "--train") == 0) train = i + 1 < argc ? argv[++i] : "";
        else if (strncmp(a, "--train=", 8) == 0) train = a + 8;
        else if (strcmp(a, "-I") == 0 && i + 1 < argc) ptrvec_push(&ar, &incdirs, argv[++i]);
        else if (strncmp(a, "-I", 2) == 0 && a[2]) ptrvec_push(&ar, &incdirs, (void *)(a + 2));
        else if (strcmp(a, "--color") == 0) diag_set_color(1);
        else if (strcmp(a, "--no-color") == 0) diag_set_color(0);
        else if (strcmp(a, "--version") == 0) { printf("mbtc %s\n", MBT_VERSION); arena_free(&ar); return 0; }
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { usage(stdout); arena_free(&ar); return 0; }
        else if (a[0] == '-' && a[1]) {
            diag_error_noloc("unknown option '%s'", a);
            diag_hint("run 'mbtc --help' for the options");
            { arena_free(&ar); return 1; }
        } else if (input) {
            diag_error_noloc("more than one input file ('%s' and '%s')", input, a);
            { arena_free(&ar); return 1; }
        } else input = a;
    }
    if (!input) {
        diag_error_noloc("no input file");
        usage(stderr);
        { arena_free(&ar); return 1; }
    }
    static const char *const stages[] = {"tokens", "ast", "ir", "grad", "plan", "fused", "kernels", "llvm", "program", "cuda", "ptx", "sass"};
    int known_stage = !emit;
    for (size_t k = 0; emit && k < sizeof stages / sizeof *stages; k++) known_stage |= strcmp(emit, stages[k]) == 0;
    if (!known_stage) {
        diag_error_noloc("unknown stage '%s' for --emit", emit);
        diag_hint("the stages available are: tokens, ast, ir, grad, plan, kernels, llvm, program, cuda, ptx, sass");
        { arena_free(&ar); return 1; }
    }
    if (train && !*train) {
        diag_error_noloc("'--train' needs the name of a train block");
        { arena_free(&ar); return 1; }
    }
    if (verify && (emit || output || check)) {
        diag_error_noloc("'--verify-step' is a mode of its own: give it without --emit, -o or --check");
        { arena_free(&ar); return 1; }
    }
    if (train && !(emit && (strcmp(emit, "ir") == 0 || strcmp(emit, "grad") == 0 || strcmp(emit, "plan") == 0 ||
                            strcmp(emit, "kernels") == 0 || strcmp(emit, "llvm") == 0 || strcmp(emit, "program") == 0 ||
                            strcmp(emit, "cuda") == 0 || strcmp(emit, "ptx") == 0 || strcmp(emit, "sass") == 0)) &&
        !(output && !check && !emit) && !verify && !co.dump) {
        diag_error_noloc("'--train %s' selects the train block for -o or --emit=ir, grad, plan, kernels or llvm, and none "
                         "is given",
                         train);
        { arena_free(&ar); return 1; }
    }

    if (opt && !(emit && strcmp(emit, "llvm") == 0)) {
        diag_error_noloc("'--opt' prints the optimised LLVM IR of --emit=llvm, and --emit=llvm is not given");
        { arena_free(&ar); return 1; }
    }

    {
        const char *err = NULL;
        co.narch = cuda_parse_archs(arch_list, co.archs, 8, &ar, &err);
        if (co.narch < 0) {
            diag_error_noloc("%s", err);
            { arena_free(&ar); return 1; }
        }
    }
    if (co.narch == 0 && (co.info || co.dump || (emit && (strcmp(emit, "ptx") == 0 || strcmp(emit, "sass") == 0)))) {
        diag_error_noloc("--cuda-arch=none: --emit=ptx, sass, --cuda-info and --dump-dir need an architecture");
        { arena_free(&ar); return 1; }
    }
    if (co.info && !(emit && strcmp(emit, "kernels") == 0)) {
        diag_error_noloc("'--cuda-info' adds ptxas's figures to --emit=kernels, and --emit=kernels is not given");
        { arena_free(&ar); return 1; }
    }
    if (co.dump && (output || check || verify || (emit && strcmp(emit, "cuda") != 0))) {
        diag_error_noloc("'--dump-dir' writes the CUDA stages of every kernel: give it alone or with --emit=cuda");
        { arena_free(&ar); return 1; }
    }

    Loader ld;
    loader_init(&ld, &ar, (const char **)incdirs.v, incdirs.n, default_stdlib(&ar));
    int rc = run(&ld, &ar, input, emit, check, output, train, opt, verify, &co);
    arena_free(&ar);
    return rc;
}
