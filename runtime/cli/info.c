/* info.c - `PROG info`: the compiler's memory plan, printed back from the program's descriptor
 * (RtProgram.plan and the region sizes), in the words and numbers of the `plan:` lines of
 * `mbtc --emit=plan` (compiler/plan/plan_memory.c, plan_print_summary), so that a test can hold the
 * two equal (tests/info/run.sh). Then what a run allocates, from the same descriptor, and a check
 * that the arena it allocates is the plan's largest phase. */
#include <stdio.h>

#include "rt_exec.h"

/* offload { optimizer = nvme }: the store file's bytes and the staging buffers' (as the plan
 * chunks the state: compiler/plan/plan_memory.c, plan_offload_optimizer); 0 without offload. */
static int64_t rt_info_slot(const RtProgram *p) {
    if (p->train.offload_optimizer != 2 || p->train.offload_chunk < 1) return 0;
    return (p->nstate * p->train.offload_chunk * 4 + 4095) / 4096 * 4096;
}

static int64_t rt_info_nchunks(const RtProgram *p) {
    return p->train.offload_chunk > 0 ? (rt_state_part(p) + p->train.offload_chunk - 1) / p->train.offload_chunk : 0;
}

/* offload { optimizer = host } (with state): the state in host memory, none on the device. */
static int rt_info_host(const RtProgram *p) { return p->train.offload_optimizer == 1 && p->state_floats > 0; }

/* The optimizer state in the plan's memory: the three staging buffers when it lives in a store
 * file, none when it lives in host memory (off the device). */
static int64_t rt_info_state_bytes(const RtProgram *p) {
    return rt_info_slot(p) ? 3 * rt_info_slot(p) : rt_info_host(p) ? 0 : p->state_floats * 4;
}

/* The plan's summary lines. Keep them as plan_print_summary writes them. */
static void rt_info_plan(FILE *f, const RtProgram *p) {
    static const char *const phase[RT_NPHASES] = {"step", "update", "logits", "chunk"};
    static const char *const call[RT_NPHASES] = {"micro-batch (forward and backward)", "update", "logits call", "chunk call"};
    const RtPlanInfo *pl = &p->plan;
    const RtTrainSettings *t = &p->train;
    for (int i = 0; i < RT_NPHASES; i++) fprintf(f, "plan: arena %s %lld bytes\n", phase[i], (long long)pl->arena[i]);
    fprintf(f, "plan: arena %lld bytes, the largest\n", (long long)p->arena_bytes);
    fprintf(f, "plan: parameters %lld bytes, gradients %lld bytes, optimizer state %lld bytes, inputs %lld bytes\n",
            (long long)(p->param_floats * 4), (long long)(p->param_floats * 4), (long long)rt_info_state_bytes(p),
            (long long)pl->input_bytes);
    if (p->pcast_bytes > 0)
        fprintf(f, "plan: parameter casts %lld bytes, written by the update, read by the step\n", (long long)p->pcast_bytes);
    if (rt_info_host(p))
        fprintf(f,
                "plan: optimizer state offloaded to host: %lld bytes in host memory, updated there by the CPU (the gradients "
                "copied down, the parameters up, each step)\n",
                (long long)(p->state_floats * 4));
    if (rt_info_slot(p))
        fprintf(f,
                "plan: optimizer state offloaded to nvme: %lld bytes in a store file, %lld chunks of %lld parameters streamed "
                "through 3 staging buffers (%lld bytes in memory)\n",
                (long long)(rt_info_nchunks(p) * rt_info_slot(p)), (long long)rt_info_nchunks(p),
                (long long)p->train.offload_chunk, (long long)rt_info_state_bytes(p));
    if (p->train.offload_act == 2)
        fprintf(f, "plan: activations offloaded to nvme: a store file of %lld bytes during each micro-batch's step%s\n",
                (long long)p->train.offload_act_bytes,
                p->gpu ? " (on a GPU through pinned staging of 4 slots, at most 64 MiB: train --offload-staging)" : "");
    if (t->zero == 3) { /* plan_gather.c's line: a rank's shard as rt_comm_shards cuts it (RT_SHARD_ALIGN) */
        int64_t whole = p->param_floats, per = (whole + t->data_ranks - 1) / t->data_ranks;
        per = (per + RT_GRAD_BLOCK - 1) / RT_GRAD_BLOCK * RT_GRAD_BLOCK;
        if (per > whole) per = whole;
        fprintf(f,
                "plan: ZeRO-3: a rank holds its shard of at most %lld bytes of the parameters and gathers at most %lld bytes "
                "more at once (%lld gathers): %lld of the region's %lld bytes\n",
                (long long)(per * 4), (long long)(pl->gather_window * 4), (long long)pl->gather_units,
                (long long)((per + pl->gather_window) * 4), (long long)(whole * 4));
        /* the pages: plan_gather.c's plan_shard_pages and its second line */
        int64_t pg = pl->gather_page > 0 ? pl->gather_page : 4096, region = (whole * 4 + pg - 1) / pg;
        int64_t sp = (per * 4 + pg - 1) / pg + (pg > RT_GRAD_BLOCK * 4 && per > 0 ? 1 : 0);
        if (sp > region) sp = region;
        int64_t most = sp + pl->gather_window_pages < region ? sp + pl->gather_window_pages : region;
        fprintf(f,
                "plan: ZeRO-3: pages of %lld bytes: the gathers map at most %lld pages at once besides the %lld of a shard: "
                "%lld of the region's %lld pages (%lld bytes)\n",
                (long long)pg, (long long)pl->gather_window_pages, (long long)sp, (long long)most, (long long)region,
                (long long)(most * pg));
    }
    if (p->train.offload_act == 1)
        fprintf(f,
                "plan: activations offloaded to host: %lld bytes of pinned host memory, copied on a second stream during "
                "each micro-batch's step\n",
                (long long)p->train.offload_act_bytes);
    for (int i = 0; i < RT_NPHASES; i++)
        fprintf(f, "plan: per %s %lld kernels, %lld GEMMs\n", call[i], (long long)pl->kernels[i], (long long)pl->gemms[i]);
    if (p->kv.rows > 0) fprintf(f, "plan: a chunk call takes up to %lld new tokens\n", (long long)p->kv.rows);
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
    fprintf(stdout,
            "allocated: arena %lld bytes, parameters %lld, gradients %lld, parameter casts %lld, optimizer state %lld%s\n",
            (long long)p->arena_bytes, (long long)(p->param_floats * 4), (long long)(p->param_floats * 4),
            (long long)p->pcast_bytes, (long long)rt_info_state_bytes(p),
            rt_info_slot(p) ? (p->gpu ? " (staging in host memory; the state is in a store file in --offload-dir while training, "
                                        "none on the device)"
                                      : " (staging; the state is in a store file in --offload-dir while training)")
            : rt_info_host(p) ? " on the device (the state's bytes are in host memory)"
                              : "");
    if (largest != p->arena_bytes) {
        fprintf(stderr, "%s: the arena allocated (%lld bytes) is not the plan's largest phase (%lld bytes)\n", prog,
                (long long)p->arena_bytes, (long long)largest);
        return 1;
    }
    return 0;
}
