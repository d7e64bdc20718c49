/* test_rt_batch.c - unit tests of the batch schedule in the runtime (runtime/train.c): which
 * ramp stage each optimizer step runs (rt_train_stage), and the descriptor check of the batch
 * fields - data ranks, the ramp table - that an executable's rt_main refuses as an internal error.
 * The train loop itself, ramp and data ranks included, is tested end to end by tests/run.sh's
 * exec layer (tests/exec/ramp.mbt).
 *
 * Build: make build/tests/test_rt_batch (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure. */
#include <string.h>

#include "rt_exec.h"
#include "unit.h"

static RtStatus nop(RtStep *s) {
    (void)s;
    return RT_OK;
}
static double one(int64_t step) {
    (void)step;
    return 1.0;
}

static const RtParam params[1] = {{"w", 1, {16}, 16, 0, RT_INIT_ZEROS, 0.0, 0.0}};

/* A valid program: micro 4, global 8 = 4 x accumulation 2 x 1 data rank, no ramp. */
static RtProgram program(void) {
    RtProgram p = {.abi_version = RT_ABI_VERSION,
                   .source = "test",
                   .train = {.name = "t",
                             .micro = 4,
                             .seq = 16,
                             .global = 8,
                             .accum = 2,
                             .steps = 10,
                             .seed = 1,
                             .vocab = 64,
                             .ctx = 16,
                             .lr = 1e-3,
                             .data = "x.bin",
                             .eval_steps = 20,
                             .data_ranks = 1},
                   .generate = {.temperature = 1.0, .max_tokens = 16},
                   .params = params,
                   .nparams = 1,
                   .param_floats = 16,
                   .forward_backward = nop,
                   .optimizer_update = nop,
                   .lr_schedule = one};
    return p;
}

/* The check's message for p ("" when it passes). */
static const char *check(const RtProgram *p) {
    static RtError e;
    rt_error_clear(&e);
    return rt_program_check(p, &e) == RT_OK ? "" : e.msg;
}

static void stages(void) {
    RtTrainSettings t = program().train;
    RtRampStage s = rt_train_stage(&t, 0);
    CHECK(s.step == 0 && s.global == 8 && s.accum == 2, "no ramp, step 0: {%lld, %lld, %lld}", (long long)s.step,
          (long long)s.global, (long long)s.accum);
    s = rt_train_stage(&t, 1000000);
    CHECK(s.step == 0 && s.global == 8 && s.accum == 2, "no ramp, step 10^6: {%lld, %lld, %lld}", (long long)s.step,
          (long long)s.global, (long long)s.accum);
    static const RtRampStage ramp[2] = {{5, 16, 4}, {7, 32, 8}};
    t.nramp = 2;
    t.ramp = ramp;
    static const struct {
        int64_t step, first, global, accum;
    } want[] = {{0, 0, 8, 2}, {4, 0, 8, 2}, {5, 5, 16, 4}, {6, 5, 16, 4}, {7, 7, 32, 8}, {100, 7, 32, 8}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        s = rt_train_stage(&t, want[i].step);
        CHECK(s.step == want[i].first && s.global == want[i].global && s.accum == want[i].accum,
              "step %lld: stage {%lld, %lld, %lld}, expected {%lld, %lld, %lld}", (long long)want[i].step, (long long)s.step,
              (long long)s.global, (long long)s.accum, (long long)want[i].first, (long long)want[i].global,
              (long long)want[i].accum);
    }
}

static void valid_programs(void) {
    RtProgram p = program();
    CHECK_STR(check(&p), "", "micro 4 x accumulation 2");
    p.train.data_ranks = 2;
    p.train.accum = 1;
    CHECK_STR(check(&p), "", "micro 4 x accumulation 1 x 2 data ranks");
    static const RtRampStage ramp[2] = {{1, 16, 2}, {500, 64, 8}};
    p.train.nramp = 2;
    p.train.ramp = ramp;
    CHECK_STR(check(&p), "", "data 2 with a ramp to 16 at step 1 and 64 at step 500");
}

static void bad_batches(void) {
    RtProgram p = program();
    p.train.data_ranks = 0;
    CHECK_STR(check(&p), "batch: global 8 is not micro 4 x accumulation 2 x data 0 (seq 16)", "data 0");
    p = program();
    p.train.data_ranks = 2; /* 4 x 2 x 2 is 16, not 8 */
    CHECK_STR(check(&p), "batch: global 8 is not micro 4 x accumulation 2 x data 2 (seq 16)", "data 2, accumulation 2");
    p = program();
    p.train.accum = INT64_MAX / 2; /* the product would overflow: refused before it is computed */
    CHECK_STR(check(&p), "batch: global 8 is not micro 4 x accumulation 4611686018427387903 x data 1 (seq 16)",
              "a huge accumulation");

    static const RtRampStage at0[1] = {{0, 16, 4}};
    static const RtRampStage back[2] = {{5, 16, 4}, {5, 32, 8}};
    static const RtRampStage wrong[1] = {{5, 24, 4}};
    static const RtRampStage noacc[1] = {{5, 0, 0}};
    p = program();
    p.train.nramp = 1;
    CHECK_STR(check(&p), "batch: nramp is 1 (it must be 0 or more, with a ramp table when above 0)", "nramp without a table");
    p.train.nramp = -1;
    p.train.ramp = at0;
    CHECK_STR(check(&p), "batch: nramp is -1 (it must be 0 or more, with a ramp table when above 0)", "nramp -1");
    p.train.nramp = 1;
    CHECK_STR(check(&p), "batch: ramp stage 1 starts at step 0, not after step 0", "a stage at step 0");
    p.train.nramp = 2;
    p.train.ramp = back;
    CHECK_STR(check(&p), "batch: ramp stage 2 starts at step 5, not after step 5", "two stages at one step");
    p.train.nramp = 1;
    p.train.ramp = wrong;
    CHECK_STR(check(&p), "batch: ramp stage 1 (step 5): global 24 is not micro 4 x accumulation 4 x data 1",
              "a stage whose global is not micro x accum");
    p.train.ramp = noacc;
    CHECK_STR(check(&p), "batch: ramp stage 1 (step 5) has accumulation 0", "a stage with accumulation 0");
}

/* data.pos of packed documents (issue 20): 0 at each row's start and after each EOT token. */
static void doc_positions(void) {
    const int32_t x[12] = {5, 7, 3, 9, 3, 3, /* row 2: */ 8, 3, 1, 2, 4, 6};
    const int32_t want[12] = {0, 1, 2, 0, 1, 0, /* a new row restarts */ 0, 1, 0, 1, 2, 3};
    int32_t pos[12];
    rt_doc_positions(x, 12, 6, 3, pos);
    for (int i = 0; i < 12; i++) CHECK(pos[i] == want[i], "pos[%d] = %d, want %d", i, (int)pos[i], (int)want[i]);
    int32_t one_row[12]; /* row 0: the whole context is one row (generation) */
    rt_doc_positions(x, 12, 0, 3, one_row);
    CHECK(one_row[6] == 0 && one_row[7] == 1 && one_row[8] == 0, "one row: %d %d %d", (int)one_row[6], (int)one_row[7],
          (int)one_row[8]);
    rt_doc_positions(x, 6, 6, -1, pos); /* no EOT id matches: positions 0..5 */
    for (int i = 0; i < 6; i++) CHECK(pos[i] == i, "no documents: pos[%d] = %d", i, (int)pos[i]);
}

int main(void) {
    RUN(doc_positions);
    RUN(stages);
    RUN(valid_programs);
    RUN(bad_batches);
    return unit_finish();
}
