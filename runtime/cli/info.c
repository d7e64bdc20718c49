/* info.c - `PROG info`: the compiler's memory plan, printed back from the program's descriptor
 * (RtProgram.plan and the region sizes), in the words and numbers of the `plan:` lines of
 * `mbtc --emit=plan` (compiler/plan/plan_memory.c, plan_print_summary), so that a test can hold the
 * two equal (tests/info/run.sh). Then what a run allocates, from the same descriptor, and a check
 * that the arena it allocates is the plan's largest phase. */
#include <stdio.h>

#include "rt_exec.h"

/* The plan's summary lines. Keep them as plan_print_summary writes them. */
static void rt_info_plan(FILE *f, const RtProgram *p) {
    static const char *const phase[RT_NPHASES] = {"step", "update", "logits", "chunk"};
    static const char *const call[RT_NPHASES] = {"micro-batch (forward and backward)", "update", "logits call", "chunk call"};
    const RtPlanInfo *pl = &p->plan;
    const RtTrainSettings *t = &p->train;
    for (int i = 0; i < RT_NPHASES; i++) fprintf(f, "plan: arena %s %lld bytes\n", phase[i], (long long)pl->arena[i]);
    fprintf(f, "plan: arena %lld bytes, the largest\n", (long long)p->arena_bytes);
    fprintf(f, "plan: parameters %lld bytes, gradients %lld bytes, optimizer state %lld bytes, inputs %lld bytes\n",
            (long long)(p->param_floats * 4), (long long)(p->param_floats * 4), (long long)(p->state_floats * 4),
            (long long)pl->input_bytes);
    for (int i = 0; i < RT_NPHASES; i++)
        fprintf(f, "plan: per %s %lld kernels, %lld GEMMs\n", call[i], (long long)pl->kernels[i], (long long)pl->gemms[i]);
    for (int64_t s = 0; s <= t->nramp; s++) {
        RtRampStage st = s == 0 ? (RtRampStage){0, t->global, t->accum} : t->ramp[s - 1];
        int64_t nmicro = st.accum * t->data_ranks;
        fprintf(f, "plan: per optimizer step from step %lld (%lld micro-batches and the update) %lld kernels, %lld GEMMs\n",
                (long long)st.step, (long long)nmicro,
                (long long)(nmicro * pl->kernels[RT_PHASE_STEP] + pl->kernels[RT_PHASE_UPDATE]),
                (long long)(nmicro * pl->gemms[RT_PHASE_STEP] + pl->gemms[RT_PHASE_UPDATE]));
    }
}

int rt_cmd_info(const RtProgram *p, const char *prog, int nargs) {
    if (nargs > 0) {
        fprintf(stderr, "%s: info takes no options\n", prog);
        return 1;
    }
    fprintf(stdout, "info: %s, compiled from %s, train block '%s'\n", prog, p->source ? p->source : "?", p->train.name);
    rt_info_plan(stdout, p);
    /* what rt_exec_open allocates: the arena is the descriptor's arena_bytes, which no phase exceeds */
    int64_t largest = 0;
    for (int i = 0; i < RT_NPHASES; i++)
        if (p->plan.arena[i] > largest) largest = p->plan.arena[i];
    fprintf(stdout, "allocated: arena %lld bytes, parameters %lld, gradients %lld, optimizer state %lld\n",
            (long long)p->arena_bytes, (long long)(p->param_floats * 4), (long long)(p->param_floats * 4),
            (long long)(p->state_floats * 4));
    if (largest != p->arena_bytes) {
        fprintf(stderr, "%s: the arena allocated (%lld bytes) is not the plan's largest phase (%lld bytes)\n", prog,
                (long long)p->arena_bytes, (long long)largest);
        return 1;
    }
    return 0;
}
