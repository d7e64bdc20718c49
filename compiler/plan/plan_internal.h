/* plan_internal.h - what plan.c (the settings, the step programs, offsets by liveness) and
 * plan_memory.c (the memory plan after fusion) share; not for the stages after the plan. */
#ifndef MBT_PLAN_INTERNAL_H
#define MBT_PLAN_INTERNAL_H

#include <stdio.h>

#include "plan.h"
#include "sema.h"

typedef struct PlanCtx {
    Arena *ar;
    Plan *p;
    const TrainConfig *ts;
    Span at; /* the train block's name: where whole-plan errors point */
} PlanCtx;

/* An entry of a sort by time: a size rounded up to the alignment, a time and an index. */
typedef struct PlanOrder {
    int64_t size;
    int first, idx;
} PlanOrder;
/* By .first, then decreasing size, then index: a total order. */
int plan_first_cmp(const void *a, const void *b);

/* a x b bytes, or -1 beyond PLAN_MAX_BYTES. */
int64_t plan_mul_bytes(int64_t a, int64_t b);
/* "16506014784 bytes (15.4 GiB)" */
const char *plan_bytes_text(Arena *ar, int64_t b);

/* plan_verify's problems: counted, and printed to out (when not NULL) as `plan: ...`. */
typedef struct PlanVerify {
    FILE *out;
    int problems;
} PlanVerify;
void plan_v_fail(PlanVerify *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* plan_memory.c: the regions and every phase's slots and moves (0 after a reported error); their
 * checks; their listing in --emit=plan. */
int plan_memory(PlanCtx *c, const PlanSchedules *s);
void plan_verify_memory(PlanVerify *v, const Plan *p);
void plan_print_memory(FILE *out, Arena *ar, const Plan *p);

/* A note in the plan's listing (`note: ...`): a setting carried out only in part, or not yet. */
void plan_note(PlanCtx *c, const char *text);

/* plan_recompute.c: the step's re-runs (rc->mask set by the caller) over its fused schedule r,
 * placed after loss_launch and stats_last; then the lives of its buffers' first copies (slots)
 * and second copies (rc->again) over the resulting order (an output lives to the end, unless early
 * marks it: a gradient, moved right after its last toucher). */
int plan_recompute(PlanCtx *c, const FuseResult *r, int loss_launch, int stats_last, PlanRecompute *rc);
void plan_recompute_lives(const FuseResult *r, PlanRecompute *rc, PlanSlot *slots, const unsigned char *early);
/* plan_offload.c: offload.activations over the step program (rc->order, slots and rc->again set
 * by plan_recompute_lives): chooses the buffers, times their copies, shortens their first copies
 * and gives them second ones (rc->again). */
void plan_offload(PlanCtx *c, const FuseResult *r, PlanRecompute *rc, PlanSlot *slots);
/* plan_gather.c: ZeRO-3's gather schedule over the step program (PlanMemory.gathers), and its
 * listing in --emit=plan (with parallel.zero = 3). */
void plan_gather(PlanCtx *c);
void plan_print_gather(FILE *out, const Plan *p);
void plan_print_gather_summary(FILE *out, const Plan *p); /* info.c prints the same line */
void plan_verify_gather(PlanVerify *v, const Plan *p);
/* The buffers launch li reads and writes (out, wr: 1 when written; cap entries at most). */
int plan_launch_bufs(const FuseResult *r, int li, int *out, unsigned char *wr, int cap);
/* last[b]: the last launch of r that reads or writes buffer b (-1: none) */
void plan_last_touch(const FuseResult *r, int *last);

#endif
