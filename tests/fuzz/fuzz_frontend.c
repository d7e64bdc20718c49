/* fuzz_frontend.c - libFuzzer target for the front end and the checker: every input is lexed and
 * parsed as a .mbt file ("fuzz.mbt"); when it has no syntax error it is checked (sema_check) as
 * the main module, with `import` resolved against ./stdlib (run from the repository root, as
 * tests/fuzz/run.sh does). An input with a train block is checked with the graph builder on
 * (sema_build_train, as `mbtc --emit=plan` does: the step graph and the optimizer's update
 * graph), and the graphs it returns must pass graph_verify, then the step graph is
 * differentiated and the plan built, which must pass plan_verify (else abort: a finding). Built by `make fuzz-build` with ASan and UBSan; a crash, a sanitizer
 * report, an internal error (mbtc exits 2: libFuzzer reports "fuzz target exited") or a hang is
 * a finding.
 *
 * diag prints every message to the C stream `stderr`. To keep the fuzzer fast that stream is
 * pointed at /dev/null once, in LLVMFuzzerInitialize. File descriptor 2 itself stays open, so the
 * sanitizers' reports and libFuzzer's own messages (which keep their own FILE* to fd 2) still
 * show. Set MBT_FUZZ_VERBOSE=1 to see the compiler's messages, e.g. when replaying a crash:
 *     MBT_FUZZ_VERBOSE=1 build/fuzz/fuzz_frontend build/fuzz/artifacts/crash-...
 *
 * diag's error counter is global and only grows across inputs; nothing here needs it to be 0: a
 * syntax error is detected by comparing the count before and after parsing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "autodiff.h"
#include "graph.h"
#include "module.h"
#include "parse.h"
#include "plan.h"
#include "sema.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *verbose = getenv("MBT_FUZZ_VERBOSE");
    if (!verbose || !*verbose || strcmp(verbose, "0") == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null) stderr = null;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (64u << 20)) return 0; /* far beyond -max_len; keeps the uint32_t length exact */

    /* The lexer wants the text NUL-terminated. A malloc'd copy of exactly size + 1 bytes, so
     * ASan catches any read past the sentinel. */
    char *text = malloc(size + 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    text[size] = 0;

    Arena ar = {0};
    uint32_t file = diag_add_source("fuzz.mbt", text, (uint32_t)size);
    int before = diag_error_count();

    /* The main module, built as loader_main would but from memory. */
    Module *m = arena_alloc(&ar, sizeof(Module));
    m->name = "fuzz";
    m->path = "fuzz.mbt";
    m->file = file;
    m->ast = parse_source(&ar, file);
    if (!m->ast) abort();                  /* parse_source never returns NULL */
    if (!ast_check_spans(m->ast)) abort(); /* every node is located inside the file */

    if (diag_error_count() == before) {
        Loader ld;
        loader_init(&ld, &ar, NULL, 0, "stdlib");
        ptrvec_push(&ar, &ld.modules, m);
        int has_train = 0;
        for (int i = 0; i < m->ast->list.n; i++) has_train |= m->ast->list.v[i] && m->ast->list.v[i]->kind == N_TRAIN;
        if (has_train) {
            TrainBuild *tb = sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, &ar);
            if (tb) {
                /* a graph the builder made is malformed, or a plan breaks its invariants */
                if (graph_verify(tb->step, NULL) != 0 || graph_verify(tb->update, NULL) != 0) abort();
                int first_bwd = autodiff(tb->step);
                if (graph_verify(tb->step, NULL) != 0) abort();
                PlanSchedules sched; /* the memory plan is made after fusion, as mbtc makes it */
                FuseResult *fused[2] = {fuse_graph(tb->step, NULL, 0, &ar), fuse_graph(tb->update, NULL, 0, &ar)};
                Plan *plan = plan_schedules(tb, fused, &sched, &ar) ? NULL : plan_build(tb, first_bwd, &sched, &ar);
                if (plan && plan_verify(plan, NULL) != 0) abort();
            }
        } else {
            sema_check(&ld, m);
        }
    }

    arena_free(&ar);
    free(text);
    return 0;
}
