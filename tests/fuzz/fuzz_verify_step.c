/* fuzz_verify_step.c - libFuzzer target for `mbtc --verify-step`'s step-dump reader
 * (compiler/ref/step_dump.c): once per process, a fixed small program (PROGRAM, below) is checked
 * and its train block's step graph built, as mbtc builds it; then every input is opened with the
 * runtime's safetensors reader (rt_st_open_memory) and, when it opens, read with step_dump_read
 * against that graph: its metadata (mbt.micro, mbt.accum, mbt.seq, mbt.loss, mbt.lr, mbt.clip)
 * checked, every parameter's weights, gradient and update and the token batches read. The reader's
 * promises are held (else abort: a finding):
 *   - it returns 0 or 1; 1 exactly when it reported errors (diag), 0 with every array read:
 *     each parameter's three tensors and batches of micro x accum x seq tokens;
 *   - it never reads past a tensor or the input (ASan: the input is an exact-size copy).
 * Built by `make fuzz-build` with ASan and UBSan; run by tests/fuzz/run.sh (from the repository
 * root: the program imports stdlib/) with the corpus tests/fuzz/corpus_verify_step (written by
 * tests/fuzz/make_corpus_vs.py). MBT_FUZZ_VERBOSE=1 shows the messages and prints the graph's
 * parameters. A crash, a sanitizer report, an abort, a leak or a hang is a finding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "diag.h"
#include "graph.h"
#include "module.h"
#include "parse.h"
#include "plan.h"
#include "sema.h"
#include "step_dump.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* examples/mlp.mbt made small: 3 parameters' worth of layers, micro-batches of 2 x 4 tokens, 2
 * of them a step. */
static const char PROGRAM[] = "import nn\n"
                              "import optim\n"
                              "model M(vocab = 8, d = 4) {\n"
                              "  emb = nn.Embedding(vocab, d)\n"
                              "  fc = nn.Linear(d, vocab)\n"
                              "  fn forward(idx: i32[B, T]) -> f32[B, T, vocab] { return fc(relu(emb(idx))) }\n"
                              "}\n"
                              "train t {\n"
                              "  model = M()\n"
                              "  data = tokens(\"data.bin\", seq = 4)\n"
                              "  loss = cross_entropy(model(data.x), data.y)\n"
                              "  optimizer = optim.adamw(lr = 1e-2)\n"
                              "  batch { global = 4, micro = 2 }\n"
                              "  steps = 1\n"
                              "}\n";

static Arena prog_ar;
static const Graph *step;
static int verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *v = getenv("MBT_FUZZ_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    uint32_t file = diag_add_source("fuzz_verify_step.mbt", PROGRAM, (uint32_t)strlen(PROGRAM));
    Module *m = arena_alloc(&prog_ar, sizeof(Module));
    m->name = "fuzz_verify_step";
    m->path = "fuzz_verify_step.mbt";
    m->file = file;
    m->ast = parse_source(&prog_ar, file);
    static Loader ld;
    loader_init(&ld, &prog_ar, NULL, 0, "stdlib");
    ptrvec_push(&prog_ar, &ld.modules, m);
    TrainBuild *tb = diag_error_count() ? NULL : sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, &prog_ar);
    if (!tb || diag_error_count()) {
        diag_finish();
        fprintf(stderr, "fuzz_verify_step: the fixed program does not build (run from the repository root)\n");
        abort();
    }
    step = tb->step;
    for (int i = 0; verbose && i < step->nparams; i++) {
        const GNode *p = step->node[step->params[i]];
        fprintf(stderr, "param %s:", p->name);
        for (int d = 0; d < p->rank; d++) fprintf(stderr, " %lld", (long long)p->shape[d]);
        fprintf(stderr, "\n");
    }
    if (!verbose) {
        FILE *null = fopen("/dev/null", "w");
        if (null) stderr = null;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *p = malloc(size ? size : 1);
    if (!p) return 0;
    if (size) memcpy(p, data, size);
    RtStFile *f = NULL;
    RtError e;
    if (rt_st_open_memory(&f, p, size, "step.safetensors", &e) == RT_OK) {
        Arena ar = {0};
        StepDump d;
        int before = diag_error_count();
        int rc = step_dump_read(step, f, "step.safetensors", &d, &ar);
        int reported = diag_error_count() != before;
        if (rc != reported) abort();
        if (rc == 0) {
            if (d.micro < 1 || d.accum < 1 || d.seq < 1 || d.rows != d.micro * d.accum || d.cells != d.rows * d.seq) abort();
            if (!d.bx || !d.by) abort();
            for (int i = 0; i < step->nparams; i++)
                if (!d.leaves[step->params[i]] || !d.grad[i] || !d.next[i]) abort();
            int64_t sum = 0; /* every token was written (ASan/MSan-free: read them all) */
            for (int64_t k = 0; k < d.cells; k++) sum += (int64_t)d.bx[k] + d.by[k];
            if (verbose) fprintf(stderr, "read: %lld tokens (sum %lld)\n", (long long)d.cells, (long long)sum);
        }
        step_dump_free(&d);
        arena_free(&ar);
        rt_st_close(f);
    } else if (verbose) {
        fprintf(stderr, "not opened: %s\n", e.msg);
    }
    free(p);
    return 0;
}
