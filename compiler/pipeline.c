/* pipeline.c - the stage table (pipeline.h): every stage of the compiler in order, each with what
 * it consumes, its run function, its verifier and its printer.
 *
 * A run function takes its inputs from the Pipeline (the results of the stages it names) and
 * leaves its result there; it returns 1 after reporting errors. A verifier checks the result's
 * invariants (a failure is a compiler bug: an internal error). A printer writes the result as
 * --emit=STAGE and --dump-dir show it; a stage without one is listed but cannot be emitted.
 * pipeline_run runs a stage's inputs first, each once, in the order its row names them.
 *
 * Where a stage reads another's result in place: grad differentiates the ir graph (so ir prints
 * before grad runs), and the schedules of cuda, program and object rename the fused kernels with
 * their schedule's prefix (so kernels and llvm print before them). Running the table in order, as
 * --dump-dir does, keeps both. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ast.h"
#include "autodiff.h"
#include "diag.h"
#include "graph.h"
#include "parse.h"
#include "pipeline.h"
#include "scalar.h"

/* One stage. */
typedef struct Stage {
    const char *name;
    const char *what; /* one line, for --emit=list */
    int nneeds;
    StageId needs[2];                     /* the stages whose results it consumes, run in this order */
    int (*run)(Pipeline *p);              /* NULL: its result is made by a stage it needs */
    void (*verify)(Pipeline *p);          /* NULL: nothing to check beyond its inputs' verifiers */
    int (*print)(Pipeline *p, FILE *out); /* returns 1 when it printed nothing */
    const char *no_print;                 /* print NULL: why, for --emit=list and --emit's error */
} Stage;

static const char *const graph_what[2] = {"step", "update"};

/* ---- front end: tokens, ast, check ---- */

static int run_tokens(Pipeline *p) {
    uint32_t len = 0;
    const char *why = NULL;
    char *text = loader_read_file(p->ar, p->o.input, &len, &why);
    if (!text) {
        diag_error_noloc("cannot read '%s': %s", p->o.input, why);
        return 1;
    }
    p->source = diag_add_source(p->o.input, text, len);
    return 0;
}

static int print_tokens(Pipeline *p, FILE *out) {
    parse_dump_tokens(out, p->source);
    return 0;
}

static int run_ast(Pipeline *p) {
    p->main_mod = loader_main(p->ld, p->o.input);
    return !p->main_mod; /* syntax errors: pipeline_run sees the error count grow */
}

static int print_ast(Pipeline *p, FILE *out) {
    ast_print(out, p->main_mod->ast);
    return 0;
}

/* Sema checks a module once, and builds the graphs in the same walk: what it builds depends on how
 * far the run goes - nothing for --check, the step's forward graph for ir and grad, and with the
 * optimizer's update graph beyond (its parameters laid out PLAN_ALIGN bytes apart). */
static int run_check(Pipeline *p) {
    if (p->goal <= ST_CHECK) return sema_check(p->ld, p->main_mod) != 0;
    if (p->goal <= ST_GRAD) {
        Graph *g = sema_build_train_graph_padded(p->ld, p->main_mod, p->o.train, p->o.pad_gemm > 1 ? p->o.pad_gemm : 1,
                                                 p->o.pad_min, p->ar);
        if (!g) return 1;
        p->tb = arena_alloc(p->ar, sizeof *p->tb);
        p->tb->step = g;
        return 0;
    }
    p->tb = sema_build_train_padded(p->ld, p->main_mod, p->o.train, PLAN_ALIGN / 4, p->o.pad_gemm > 1 ? p->o.pad_gemm : 1,
                                    p->o.pad_min, p->ar);
    if (p->tb && p->o.offload_gbps > 0) {
        /* the plan's copy rate: a flag that would change nothing is refused */
        if (p->tb->config->offload_activations == STORE_NONE) {
            diag_error_noloc("--offload-gbps: the train block offloads no activations (it has no offload { activations = host "
                             "or nvme }), so there are no copies to time");
            return 1;
        }
        ((TrainConfig *)p->tb->config)->offload_gbps = p->o.offload_gbps; /* sema's, in the run's arena */
    }
    if (p->tb) ((TrainConfig *)p->tb->config)->offload_gpu = p->o.narch > 0;
    if (p->tb && p->o.zero3_page > 0 && p->tb->config->zero != 3 &&
        !(p->tb->config->offload_optimizer == STORE_HOST && p->o.narch > 0)) {
        /* the page only sizes ZeRO-3's gathers, and the ranges whose uploads the forward waits for
         * when the host's update is deferred to it (offload { optimizer = host } on a GPU build:
         * docs/memory.md): a flag that would change nothing is refused */
        diag_error_noloc("--zero3-page: the train block does not gather its parameters (it has no parallel { zero = 3 }) "
                         "nor waits for the host's update by ranges (offload { optimizer = host }, built for a GPU)");
        return 1;
    }
    /* ZeRO-3's page: the target's (the CPU's 4 KiB; a GPU's allocation granularity, 2 MiB on the
     * GPUs we know), or --zero3-page's (an emulated GPU's granularity, MBT_FAKE_CUDA_GRANULARITY) */
    if (p->tb)
        ((TrainConfig *)p->tb->config)->zero3_page = p->o.zero3_page > 0 ? p->o.zero3_page : p->o.narch > 0 ? 2097152 : 4096;
    return !p->tb;
}

/* ---- graphs: ir, grad, update ---- */

static int run_ir(Pipeline *p) {
    if (!p->tb || !p->tb->step) INTERNAL("pipeline: check built no step graph");
    return 0;
}

static void verify_ir(Pipeline *p) {
    if (graph_verify(p->tb->step, stderr)) INTERNAL("the forward graph fails graph_verify (problems above)");
}

static int print_ir(Pipeline *p, FILE *out) {
    if (p->state[ST_GRAD]) INTERNAL("pipeline: the forward graph is printed after grad differentiated it");
    graph_print(out, p->tb->step, 0);
    return 0;
}

static int run_grad(Pipeline *p) {
    p->first_bwd = autodiff(p->tb->step);
    return 0;
}

static void verify_grad(Pipeline *p) {
    if (graph_verify(p->tb->step, stderr)) INTERNAL("the gradient graph fails graph_verify (problems above)");
}

static int print_grad(Pipeline *p, FILE *out) {
    graph_print(out, p->tb->step, 0);
    return 0;
}

static int run_update(Pipeline *p) {
    if (!p->tb->update) INTERNAL("pipeline: check built no update graph");
    return 0;
}

static void verify_update(Pipeline *p) {
    if (graph_verify(p->tb->update, stderr)) INTERNAL("the update graph fails graph_verify (problems above)");
}

static int print_update(Pipeline *p, FILE *out) {
    graph_print(out, p->tb->update, 0);
    return 0;
}

/* ---- the learning-rate schedule ---- */

/* Sema lowered the schedule into the scalar IR (scalar.h) while it checked the train block;
 * backend/cpu/cpu_scalar.c compiles it into the executable's lr_schedule. */
static int run_schedule(Pipeline *p) {
    if (!p->tb->config || !p->tb->config->lr) INTERNAL("pipeline: check lowered no learning-rate schedule");
    return 0;
}

static void verify_schedule(Pipeline *p) {
    if (scalar_verify(p->tb->config->lr, stderr)) INTERNAL("the learning-rate schedule fails scalar_verify (problems above)");
}

static int print_schedule(Pipeline *p, FILE *out) {
    const TrainConfig *c = p->tb->config;
    scalar_print(c->lr, out);
    /* A schedule that reads the global batch (lr.batch_scale): its value at the first step of each
     * stage of the batch ramp, as the compiled program computes it. */
    for (int i = 0; c->lr_batch && i <= c->nramp; i++) {
        int64_t step = i == 0 ? 0 : c->ramp[i - 1].step, global = i == 0 ? c->global : c->ramp[i - 1].global;
        if (step >= c->steps || (i < c->nramp && c->ramp[i].step == step)) continue; /* never reached, or replaced */
        fprintf(out, "# at step %lld (global batch %lld): %.17g\n", (long long)step, (long long)global, scalar_eval(c->lr, step));
    }
    return 0;
}

/* ---- fusion: fused, kernels ---- */

/* The statistics over the global batch (global_mean, Graph.stat_in) in what fusion lowers. With
 * one micro-batch a step (accumulation x data = 1 in every stage of the batch schedule), the mean
 * over the global batch is the micro-batch's own value: each statistic's input is replaced by its
 * expression (graph_inline_stats; the backward already treats it as a constant), and the step
 * needs no statistics pass - unless the step has running statistics (`running`), whose update the
 * runtime applies from the statistics pass's values. With more, the statistics stay inputs: the executable's forward_stats
 * computes them per micro-batch and the runtime averages them before the step's micro-batches
 * (docs/runtime.md, "Statistics over the global batch"). */
static void stats_inline(const TrainBuild *tb) {
    Graph *g = tb->step;
    if (g->nstats == 0) return;
    if (g->nrunning > 0) return; /* running(...): the runtime reads the statistics after the step */
    const TrainConfig *c = tb->config;
    int64_t most = c->accumulation;
    for (int i = 0; i < c->nramp; i++)
        if (c->ramp[i].accumulation > most) most = c->ramp[i].accumulation;
    if (most * (c->data_par > 1 ? c->data_par : 1) == 1) graph_inline_stats(g);
}

/* The fused IR: each graph lowered to primitive, hash-consed nodes (fuse_lower_graph). */
static int run_fused(Pipeline *p) {
    stats_inline(p->tb);
    const Graph *graphs[2] = {p->tb->step, p->tb->update};
    for (int i = 0; i < 2; i++) p->fgraph[i] = fuse_lower_graph(graphs[i], NULL, 0, p->ar);
    /* ZeRO-3: the step's weight casts each at its first use, so the gathers hold a window
     * (docs/parallel.md, "ZeRO-3 and a bf16 program's casts") */
    fuse_casts_apart(p->fgraph[0], p->tb->config && p->tb->config->zero == 3);
    return 0;
}

static void verify_fused(Pipeline *p) {
    for (int i = 0; i < 2; i++)
        if (fused_verify(p->fgraph[i], stderr)) INTERNAL("the %s's fused IR fails fused_verify (problems above)", graph_what[i]);
}

static int print_fused(Pipeline *p, FILE *out) {
    fused_print(out, p->fgraph[0]);
    fprintf(out, "\n");
    fused_print(out, p->fgraph[1]);
    return 0;
}

/* The fused IR partitioned into launches and their kernels written (fuse_codegen). */
static int run_kernels(Pipeline *p) {
    for (int i = 0; i < 2; i++) p->fused[i] = fuse_codegen(p->fgraph[i], p->ar);
    return 0;
}

static void verify_kernels(Pipeline *p) {
    for (int i = 0; i < 2; i++)
        if (fuse_verify(p->fused[i], stderr)) INTERNAL("the fused %s graph fails fuse_verify (problems above)", graph_what[i]);
}

static int print_kernels(Pipeline *p, FILE *out) {
    fuse_print(out, p->fused[0]);
    fprintf(out, "\n");
    fuse_print(out, p->fused[1]);
    if (!p->o.cuda_info) return 0;
    /* --cuda-info: a `# ptxas` line a kernel of the CUDA program, after the listing */
    fprintf(out, "\n");
    fflush(out);
    if (pipeline_run(p, ST_PTX)) return 1;
    cuda_print_info(out, p->cuda, p->nvrtc, p->o.narch);
    return 0;
}

/* ---- the plan ---- */

/* The plan is made after fusion, of the fused schedules: the step's and update's launches and the
 * batch-1 logits fused here (plan_schedules). */
static int run_plan(Pipeline *p) {
    PlanSchedules sched;
    if (plan_schedules(p->tb, p->fused, &sched, p->ar)) return 1;
    p->plan = plan_build(p->tb, p->first_bwd, &sched, p->ar);
    return !p->plan;
}

static void verify_plan(Pipeline *p) {
    if (plan_verify(p->plan, stderr)) INTERNAL("the plan fails plan_verify (problems above)");
}

static int print_plan(Pipeline *p, FILE *out) {
    plan_print(out, p->plan);
    return 0;
}

/* ---- the CPU back end: llvm ---- */

/* Each schedule's kernels lowered into one LLVM module for the host: the step's buffers are
 * distinct activations (disjoint), the update writes in place. */
static int run_llvm(Pipeline *p) {
    const char *err = NULL;
    if (cpu_target_host(&p->cpu, p->ar, &err)) {
        diag_error_noloc("%s", err);
        return 1;
    }
    p->llvm_ctx = LLVMContextCreate();
    for (int i = 0; i < 2; i++) {
        const char *name = arena_printf(p->ar, "%s %s", p->tb->step->name ? p->tb->step->name : "train", graph_what[i]);
        p->llvm[i] = cpu_module_new(p->llvm_ctx, &p->cpu, name);
        for (int k = 0; k < p->fused[i]->nkernels; k++) cpu_lower_kernel(p->llvm[i], p->fused[i]->kernels[k], i == 0);
    }
    return 0;
}

static void verify_llvm(Pipeline *p) {
    const char *err = NULL;
    for (int i = 0; i < 2; i++)
        if (cpu_verify(p->llvm[i], p->ar, &err))
            INTERNAL("the %s kernels' LLVM module fails LLVMVerifyModule: %s", graph_what[i], err);
}

/* Every kernel's listing above its function; with --opt, after the O2 pipeline for this CPU. */
static int print_llvm(Pipeline *p, FILE *out) {
    for (int i = 0; i < 2; i++) {
        const FuseResult *r = p->fused[i];
        const char *err = NULL;
        if (p->o.opt && cpu_optimize(p->llvm[i], &p->cpu, p->ar, &err)) {
            diag_error_noloc("%s", err);
            return 1;
        }
        const char **notes = arena_alloc(p->ar, sizeof(char *) * (size_t)(r->nkernels + 1));
        for (int k = 0; k < r->nkernels; k++) notes[k] = fuse_kernel_ops_note(r->g, r->kernels[k], p->ar);
        if (i) fprintf(out, "\n");
        cpu_print_module(out, p->llvm[i], r->kernels, notes, r->nkernels, NULL, 0);
    }
    return 0;
}

/* ---- the CUDA back end: cuda, ptx, sass ---- */

/* The schedules -o builds (host.h), made once for cuda, program and object: the fused step and
 * update renamed with their prefixes, and the batch-1 logits. */
static int need_schedules(Pipeline *p) {
    if (!p->have_hs) {
        if (host_schedules(p->plan, &p->hs, p->ar)) return 1;
        p->have_hs = 1;
    }
    return 0;
}

static int run_cuda(Pipeline *p) {
    if (need_schedules(p)) return 1;
    CudaSchedule cs[4];
    int n = p->hs.n < 4 ? p->hs.n : 4; /* step, update, logits and the chunk phase (KV cache) */
    for (int i = 0; i < n; i++) cs[i] = (CudaSchedule){p->hs.r[i], p->hs.g[i], p->hs.disjoint[i]};
    p->cuda = cuda_program_build(cs, n, p->ar);
    return 0;
}

static int print_cuda(Pipeline *p, FILE *out) {
    fputs(p->cuda->source, out);
    return 0;
}

/* NVRTC, once per --cuda-arch for the whole program; PTX too where it is printed or dumped. A
 * missing NVRTC is an error naming the option that needed it. */
static int run_ptx(Pipeline *p) {
    const PipelineOptions *o = &p->o;
    int want_ptx = o->emit == ST_PTX || o->dump_dir ? CUDA_PTX_ALL : CUDA_PTX_NONE;
    const char *what = o->dump_dir    ? "--dump-dir"
                       : o->cuda_info ? "--cuda-info"
                       : o->emit >= 0 ? arena_printf(p->ar, "--emit=%s", pipeline_stage_name((StageId)o->emit))
                                      : "mbtc";
    p->nvrtc = arena_alloc(p->ar, sizeof *p->nvrtc * (size_t)(o->narch + 1));
    return cuda_program_compile(p->cuda, o->archs, o->narch, want_ptx, p->nvrtc, what, p->ar);
}

static int print_ptx(Pipeline *p, FILE *out) {
    for (int a = 0; a < p->o.narch; a++)
        fprintf(out, "%s// ---- %s (compute_%s) ----\n%s", a ? "\n" : "", p->o.archs[a], p->o.archs[a] + 3, p->nvrtc[a].ptx);
    return 0;
}

/* cuobjdump (or nvdisasm) on each cubin; where neither is found the printer says why. */
static int run_sass(Pipeline *p) {
    p->sass = arena_alloc(p->ar, sizeof(char *) * (size_t)(p->o.narch + 1));
    for (int a = 0; a < p->o.narch; a++) {
        const char *err = NULL;
        p->sass[a] = cuda_sass(&p->nvrtc[a], p->ar, &err);
        if (!p->sass[a] && !p->sass_err) p->sass_err = err;
    }
    return 0;
}

/* Without the disassembler --emit=sass is an error; --dump-dir leaves the file out (the CUDA
 * files' warning, cuda_program_dump, says why). */
static int print_sass(Pipeline *p, FILE *out) {
    for (int a = 0; a < p->o.narch; a++) {
        if (!p->sass[a]) {
            if (!p->dumping) diag_error_noloc("%s", p->sass_err);
            return 1;
        }
        fprintf(out, "%s// ---- %s ----\n%s", a ? "\n" : "", p->o.archs[a], p->sass[a]);
    }
    return 0;
}

/* ---- the executable: program, object ----
 * host_compile builds the program's LLVM module and then prints it or links it, in one call; so
 * program keeps its printout, and object builds the module again (-o runs object alone). */

static int run_program(Pipeline *p) {
    if (host_refuses(p->tb, p->o.narch) || need_schedules(p)) return 1;
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) INTERNAL("pipeline: cannot open a memory stream");
    HostCuda hc = {p->o.archs, p->o.narch};
    int rc = host_compile(p->tb, p->plan, &p->hs, p->o.input, NULL, mem, &hc, p->ar);
    fclose(mem);
    p->program = arena_strndup(p->ar, buf, len);
    free(buf);
    return rc;
}

static int print_program(Pipeline *p, FILE *out) {
    fputs(p->program, out);
    return 0;
}

/* The executable serves the train block's model: the first serve block of that model lends it
 * its settings (TrainBuild.serve); any other serve block is checked but not compiled, and -o says
 * so rather than drop it silently. */
static void warn_serve_blocks(Pipeline *p) {
    const Node *prog = p->main_mod ? p->main_mod->ast : NULL;
    const char *used = p->tb && p->tb->serve ? p->tb->serve->name : NULL;
    for (int i = 0; prog && i < prog->list.n; i++) {
        const Node *d = prog->list.v[i];
        if (!d || d->kind != N_SERVE) continue;
        if (used && str_eqc(d->name, used)) continue;
        diag_warning(d->span,
                     "serve block '%.*s' is not compiled into the executable: `PROG serve` serves the train block's model "
                     "with the first serve block of that model, and this one is %s",
                     STR_ARG(d->name), used ? "not the first" : "of another model");
    }
}

/* -o must not name a module of the program (main.c checked the main file before the run; the
 * imports are known now): linking would replace it. */
static int output_is_module(Pipeline *p) {
    struct stat so, sm;
    if (stat(p->o.output, &so) != 0) return 0;
    for (int i = 0; i < p->ld->modules.n; i++) {
        const Module *m = p->ld->modules.v[i];
        if (stat(m->path, &sm) == 0 && sm.st_dev == so.st_dev && sm.st_ino == so.st_ino) {
            diag_error_noloc("-o '%s' is the module '%s' (%s) of this program: it would be overwritten", p->o.output, m->name,
                             m->path);
            diag_hint("give the executable another name");
            return 1;
        }
    }
    return 0;
}

/* A serve block's kv settings are carried out by the chunk phase (plan/kv.c): a model that cannot
 * run over new tokens alone (or an unsupported kv.dtype) cannot have them, which is an error at the
 * reason's place, with a note at the serve block. */
static int refuse_serve_without_cache(Pipeline *p) {
    const ServeConfig *sv = p->tb ? p->tb->serve : NULL;
    const PlanSchedules *s = &p->plan->sched;
    if (!sv || !s->why_no_chunk) return 0;
    Span at = s->no_chunk_at.file ? s->no_chunk_at : sv->at;
    diag_error(at, "serve block '%s' needs the KV cache, which this model cannot use: %s", sv->name, s->why_no_chunk);
    if (s->no_chunk_at.file) diag_note(sv->at, "the serve block is here");
    diag_hint("only attention may mix positions (docs/serve.md, \"The KV cache in the generated code\"); without the serve "
              "block, generate recomputes the context for every token");
    return 1;
}

static int run_object(Pipeline *p) {
    if (output_is_module(p) || host_refuses(p->tb, p->o.narch) || need_schedules(p) || refuse_serve_without_cache(p)) return 1;
    warn_serve_blocks(p);
    HostCuda hc = {p->o.archs, p->o.narch};
    return host_compile(p->tb, p->plan, &p->hs, p->o.input, p->o.output, NULL, &hc, p->ar);
}

/* ---- the table ---- */

#define NEEDS0                                                                                                                   \
    0, { ST_TOKENS, ST_TOKENS }
#define NEEDS1(a)                                                                                                                \
    1, { a, ST_TOKENS }
#define NEEDS2(a, b)                                                                                                             \
    2, { a, b }

static const Stage stages[ST_COUNT] = {
    [ST_TOKENS] = {"tokens", "the lexer's tokens of the main file", NEEDS0, run_tokens, NULL, print_tokens, NULL},
    [ST_AST] = {"ast", "the syntax tree of the main file, parsed with its imports", NEEDS0, run_ast, NULL, print_ast, NULL},
    [ST_CHECK] = {"check", "sema: names, types, shapes and settings checked", NEEDS1(ST_AST), run_check, NULL, NULL,
                  "prints nothing: --check"},
    [ST_IR] = {"ir", "the training step's forward graph", NEEDS1(ST_CHECK), run_ir, verify_ir, print_ir, NULL},
    [ST_GRAD] = {"grad", "the step's forward and backward graph (autodiff)", NEEDS1(ST_IR), run_grad, verify_grad, print_grad,
                 NULL},
    [ST_UPDATE] = {"update", "the optimizer's update graph over every parameter", NEEDS1(ST_CHECK), run_update, verify_update,
                   print_update, NULL},
    [ST_SCHEDULE] = {"schedule", "the learning-rate schedule lowered to the scalar IR", NEEDS1(ST_CHECK), run_schedule,
                     verify_schedule, print_schedule, NULL},
    [ST_FUSED] = {"fused", "both graphs lowered to the fused IR: primitive, hash-consed nodes", NEEDS2(ST_GRAD, ST_UPDATE),
                  run_fused, verify_fused, print_fused, NULL},
    [ST_KERNELS] = {"kernels", "the launches: GEMMs and generated kernels, with their bodies", NEEDS1(ST_FUSED), run_kernels,
                    verify_kernels, print_kernels, NULL},
    [ST_PLAN] = {"plan", "the step program and the memory plan of the fused schedules", NEEDS1(ST_KERNELS), run_plan, verify_plan,
                 print_plan, NULL},
    [ST_LLVM] = {"llvm", "the kernels as LLVM IR for the host CPU (--opt: after O2)", NEEDS1(ST_KERNELS), run_llvm, verify_llvm,
                 print_llvm, NULL},
    [ST_CUDA] = {"cuda", "every kernel of the step, update and logits schedules as CUDA C", NEEDS1(ST_PLAN), run_cuda, NULL,
                 print_cuda, NULL},
    [ST_PTX] = {"ptx", "the CUDA C compiled by NVRTC for each --cuda-arch", NEEDS1(ST_CUDA), run_ptx, NULL, print_ptx, NULL},
    [ST_SASS] = {"sass", "the compiled kernels disassembled (needs cuobjdump or nvdisasm)", NEEDS1(ST_PTX), run_sass, NULL,
                 print_sass, NULL},
    [ST_PROGRAM] = {"program", "the whole program -o builds, as LLVM IR before optimisation", NEEDS1(ST_PLAN), run_program, NULL,
                    print_program, NULL},
    [ST_OBJECT] = {"object", "the program optimised, compiled and linked into an executable", NEEDS1(ST_PLAN), run_object, NULL,
                   NULL, "prints nothing: -o FILE"},
};

/* ---- running it ---- */

void pipeline_init(Pipeline *p, Loader *ld, Arena *ar, const PipelineOptions *o, StageId goal) {
    memset(p, 0, sizeof *p);
    p->ld = ld;
    p->ar = ar;
    p->o = *o;
    p->goal = goal;
}

void pipeline_free(Pipeline *p) {
    if (!p->llvm_ctx) return;
    for (int i = 0; i < 2; i++)
        if (p->llvm[i]) LLVMDisposeModule(p->llvm[i]);
    LLVMContextDispose(p->llvm_ctx);
    cpu_target_dispose(&p->cpu);
    p->llvm_ctx = NULL;
}

double pipeline_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int pipeline_run(Pipeline *p, StageId s) {
    if (s > p->goal) INTERNAL("pipeline: stage %s runs past this run's goal %s", stages[s].name, stages[p->goal].name);
    if (p->state[s]) return p->state[s] == 2;
    const Stage *st = &stages[s];
    p->state[s] = 2; /* failed, unless it finishes */
    for (int i = 0; i < st->nneeds; i++)
        if (pipeline_run(p, st->needs[i])) return 1;
    double t0 = pipeline_seconds();
    int errors = diag_error_count();
    if (st->run && (st->run(p) || diag_error_count() > errors)) return 1;
    if (st->verify) st->verify(p);
    p->state[s] = 1;
    if (p->o.progress && st->run) {
        fprintf(stderr, "mbtc: %-8s %7.2f s  %s\n", st->name, pipeline_seconds() - t0, st->what);
        fflush(stderr);
    }
    return 0;
}

int pipeline_emit(Pipeline *p, StageId s) {
    if (!stages[s].print) {
        diag_error_noloc("--emit=%s: the %s stage prints nothing", stages[s].name, stages[s].name);
        diag_hint(s == ST_CHECK ? "use --check to check a program" : "use -o FILE to build an executable");
        return 1;
    }
    if (pipeline_run(p, s)) return 1;
    int errors = diag_error_count();
    return stages[s].print(p, stdout) || diag_error_count() > errors;
}

/* Writes text to DIR/NAME; returns 0, or 1 after reporting. */
static int write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) {
        diag_error_noloc("cannot write '%s': %s", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* One stage's printout into DIR/NN-name.txt; *written counts the files. Returns 0, or 1 after
 * reporting. */
static int dump_stage(Pipeline *p, const char *dir, StageId s, int *written) {
    if (pipeline_run(p, s)) return 1;
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) INTERNAL("pipeline: cannot open a memory stream");
    int errors = diag_error_count();
    int skip = stages[s].print(p, mem);
    fclose(mem);
    int bad = diag_error_count() > errors ||
              (!skip && write_text(arena_printf(p->ar, "%s/%02d-%s.txt", dir, (int)s + 1, stages[s].name), buf, len));
    free(buf);
    *written += !skip && !bad;
    return bad;
}

int pipeline_dump(Pipeline *p, const char *dir) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        diag_error_noloc("cannot create the dump directory '%s': %s", dir, strerror(errno));
        return 1;
    }
    p->dumping = 1;
    int written = 0, bad = 0;
    for (int s = 0; s < ST_COUNT && !bad; s++) {
        if (!stages[s].print) continue;
        bad = dump_stage(p, dir, (StageId)s, &written);
        /* the CUDA program's own files, as soon as NVRTC has compiled it */
        if (!bad && s == ST_PTX) {
            bad = cuda_program_dump(p->cuda, p->nvrtc, p->o.narch, dir, p->ar);
            if (!bad)
                fprintf(stderr, "mbtc: wrote %d kernels' stages for %d architectures to %s\n", p->cuda->nkernels, p->o.narch,
                        dir);
        }
    }
    fprintf(stderr, "mbtc: wrote %d stages' printouts to %s (NN-STAGE.txt)%s\n", written, dir,
            bad ? ", then stopped at the error above" : "");
    return bad;
}

/* ---- the table's names ---- */

int pipeline_stage(const char *name) {
    for (int s = 0; s < ST_COUNT; s++)
        if (strcmp(name, stages[s].name) == 0) return s;
    return -1;
}

const char *pipeline_stage_name(StageId s) { return stages[s].name; }

int pipeline_printable(StageId s) { return stages[s].print != NULL; }

const char *pipeline_stage_names(Arena *ar) {
    const char *names = "";
    for (int s = 0; s < ST_COUNT; s++)
        if (stages[s].print) names = arena_printf(ar, "%s%s, ", names, stages[s].name);
    return arena_printf(ar, "%slist", names);
}

void pipeline_list(FILE *out) {
    for (int s = 0; s < ST_COUNT; s++)
        fprintf(out, "%-8s  %s%s%s%s\n", stages[s].name, stages[s].what, stages[s].print ? "" : " (",
                stages[s].print ? "" : stages[s].no_print, stages[s].print ? "" : ")");
}
