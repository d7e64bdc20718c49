/* plan.h - the step program and the static memory plan of a train block.
 *
 * Pipeline position: graph (the step graph after autodiff, the update graph) -> [plan] -> fuse ->
 * kernel IR -> back ends -> host code. The plan says what one optimizer step does, in order, and
 * where every value lives; `mbtc --emit=plan` prints both.
 *
 * The step program (one per distinct accumulation count: a batch-size ramp has one per stage):
 *     for k in 0 .. accumulation-1:         each micro-batch
 *         load     data.x, data.y <- micro-batch k, into the input region
 *         run      the step graph: forward, then backward seeded with d loss = loss_scale
 *                  = 1 / (accumulation x data); gradients: k = 0 writes the gradient region,
 *                  k > 0 adds to it (no zeroing pass)
 *         loss     the reported loss += loss_scale x this micro-batch's loss
 *     allreduce    (data > 1) sum the gradient region and the loss over the data ranks
 *     clip         (clip > 0) scale = min(1, clip / (||gradients||_2 + 1e-6)); gradients *= scale
 *     schedule     host: lr = lr_base x schedule(step), t = step + 1 (1-based, as f32)
 *     update       the update graph over the parameter, gradient and state regions
 * Each micro-batch's loss is its own mean (cross_entropy is a mean over its tokens); scaling it by
 * 1 / (accumulation x data) makes the summed gradient the gradient of the mean over the global
 * batch. The scale enters as the seed of the backward (the G_CONST 1.0 autodiff puts at the loss),
 * so the graph stays the same for every program; only the seed and the loop count differ.
 *
 * The memory plan. Parameters, gradients and optimizer state each live in one contiguous region
 * with the update graph's flat layout (graph.h, GraphUpdate): parameter i at the same byte offset
 * (a multiple of PLAN_ALIGN) in the parameter and gradient regions and in each state variable's
 * part of the state region, so the optimizer is one elementwise pass over the regions and a
 * data-parallel all-reduce one collective over the gradient region. Data inputs (data.x, data.y)
 * and the update's scalars (lr, t) live in an input region. Every other value lives in the
 * activation arena at an offset assigned by liveness (plan_assign_offsets); the micro-batch's
 * graph and the update graph never run at once, so the arena is the larger of their two peaks.
 * For now the plan is of the unfused graphs: every node is a buffer (a rank-0 constant is an
 * immediate and needs none); the fusion stage calls plan_assign_offsets again with only the
 * buffers its kernels materialise. */
#ifndef MBT_PLAN_H
#define MBT_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "graph.h"
#include "sema.h"

#define PLAN_ALIGN 64                     /* bytes: every region offset and arena offset is a multiple */
#define PLAN_MAX_BYTES ((int64_t)1 << 60) /* a region, the arena or a naive total beyond this is refused */
#define PLAN_GREEDY_MAX 10000             /* buffers: plan_assign_offsets' greedy-by-size limit */

/* ---- offsets by liveness (reusable: the fusion stage passes the buffers its kernels keep) ---- */

typedef struct PlanBuffer {
    int64_t size;    /* bytes; 0 needs no memory (offset 0) */
    int first, last; /* live from the step that writes it to the last step that reads it, inclusive */
    int64_t offset;  /* out: bytes from the arena's start, a multiple of the alignment */
} PlanBuffer;

/* Assigns every buffer an offset such that two buffers live at a common step never share a byte,
 * and returns the peak: the arena bytes needed (the largest offset + size, sizes rounded up to
 * align). Greedy by size, best fit: buffers in order of decreasing size (ties: earlier first use,
 * then index); each goes into the smallest gap, among the buffers already placed that are live
 * with it, that holds it (lowest offset on a tie), else above the highest of them. That costs
 * O(n^2), so above PLAN_GREEDY_MAX buffers (a long unrolled loop, unfused) it is time-ordered best
 * fit instead: buffers by first use, each taking the smallest free block that holds it, blocks
 * freed after the last use and merged with their neighbours. Either way the peak is never more
 * than plan_naive_bytes, and the same input gives the same offsets. align is a power of two;
 * sizes must be >= 0 and sum to at most PLAN_MAX_BYTES, first <= last (else an internal error).
 * Temporary memory comes from scratch. */
int64_t plan_assign_offsets(PlanBuffer *buf, int n, int64_t align, Arena *scratch);
/* The bytes without reuse: the sum of the sizes, each rounded up to align. */
int64_t plan_naive_bytes(const PlanBuffer *buf, int n, int64_t align);
/* x rounded up to a multiple of align (a power of two). */
int64_t plan_align_up(int64_t x, int64_t align);

/* ---- the memory plan ---- */

typedef enum PlanHome {
    PH_NONE,   /* no memory: a rank-0 constant, folded into the kernels that read it */
    PH_PARAMS, /* the parameter region */
    PH_GRADS,  /* the gradient region */
    PH_STATE,  /* the optimizer-state region */
    PH_INPUTS, /* the input region: data.x, data.y, and the update's lr and t */
    PH_ARENA,  /* the activation arena */
} PlanHome;

/* Where one node's value lives. */
typedef struct PlanSlot {
    PlanHome home;
    int64_t offset;  /* bytes from the start of its region */
    int64_t bytes;
    int first, last; /* PH_ARENA: its live range, in node ids of its graph (the unfused order) */
} PlanSlot;

/* A value that must end up in a region: a parameter's gradient (step graph), or an update result
 * (update graph). In place: the node's own slot is that place. Otherwise a separate write right
 * after the node is computed (gradients) or after the whole graph ran (update results). */
typedef struct PlanWrite {
    const char *what; /* "grad h.0.attn.weight", "p", "state.m" */
    int node;         /* the value, a node of its graph */
    PlanHome to;
    int64_t offset, bytes;
    int accumulate;   /* gradients: micro-batch k = 0 writes, k > 0 adds */
    int in_place;
    int unchanged;    /* an update result that is its own input: nothing to write */
} PlanWrite;

typedef struct PlanParam {
    const char *name;
    int node;         /* its G_PARAM in the step graph */
    int64_t numel;
    int64_t offset;   /* bytes; the same in the parameter and gradient regions and in each state part */
} PlanParam;

typedef struct PlanInput {
    const char *name; /* "data.x", "lr" */
    int update;       /* 1: a node of the update graph, 0: of the step graph */
    int node;
    int64_t offset, bytes;
} PlanInput;

typedef struct PlanMemory {
    int64_t param_bytes;    /* the parameter region; the gradient region and each state part alike */
    int nparams;
    PlanParam *params;
    int nstate;
    int64_t state_bytes;    /* nstate x param_bytes */
    int ninputs;
    PlanInput *inputs;
    int64_t input_bytes;
    PlanSlot *step;         /* [step graph's n]: where each node's value lives */
    PlanSlot *update;       /* [update graph's n] */
    PlanWrite *grad_writes; /* [nparams] */
    int nupdate_writes;     /* 1 + nstate: p, then each state variable */
    PlanWrite *update_writes;
    int64_t step_peak, step_naive;     /* the arena while a micro-batch runs: planned, and without reuse */
    int64_t update_peak, update_naive; /* the arena while the update runs */
    int64_t arena_bytes;               /* the larger peak */
} PlanMemory;

/* ---- the step program ---- */

typedef enum PlanOpKind {
    PO_LOAD,      /* per micro-batch: its data.x, data.y into the input region */
    PO_RUN,       /* per micro-batch: the step graph, backward seeded with d loss = loss_scale */
    PO_LOSS,      /* per micro-batch: reported loss += loss_scale x the micro-batch's loss */
    PO_ALLREDUCE, /* sum the gradient region and the loss over the data ranks */
    PO_CLIP,      /* global-norm clipping of the gradient region */
    PO_SCHEDULE,  /* host: lr = lr_base x schedule(step), t = step + 1 */
    PO_UPDATE,    /* the update graph over the regions */
} PlanOpKind;

typedef struct PlanOp {
    PlanOpKind kind;
    int per_micro; /* inside the loop over micro-batches */
} PlanOp;

typedef struct PlanProgram {
    int64_t first_step, last_step; /* the optimizer steps it runs (0-based, inclusive); first_step >= steps:
                                      a ramp stage the run never reaches */
    int64_t global, micro, data, accumulation; /* global = micro x accumulation x data */
    double loss_scale;             /* 1 / (accumulation x data) */
    int nops;
    PlanOp *ops;
} PlanProgram;

typedef struct Plan {
    const char *name;         /* the train block's name */
    const Graph *step;        /* the step graph, differentiated */
    const Graph *update;      /* the update graph */
    int first_bwd;            /* the step graph's first backward node */
    int seed;                 /* the backward's seed (d loss / d loss, a G_CONST 1.0), or -1: no parameter
                                 reaches the loss, and every gradient is zero */
    int64_t steps, seq, micro, data;
    double clip;              /* 0: none */
    int has_lr;               /* the optimizer has the hyper-parameter lr (the update's input "lr") */
    double lr_base;
    const char *schedule;     /* "lr.cosine(step, warmup = 20, total = 400, min_ratio = 0.1)", NULL: constant */
    int nprograms;
    PlanProgram *programs;
    PlanMemory mem;
    int nnotes;
    const char **notes;       /* settings of the block this plan does not carry out yet */
} Plan;

/* The plan of a train block: tb from sema_build_train, its step graph already differentiated
 * (autodiff, which returned first_bwd). Returns NULL after reporting a user error (a learning-rate
 * schedule for an optimizer without lr, a tensor or region beyond PLAN_MAX_BYTES). */
Plan *plan_build(const TrainBuild *tb, int first_bwd, Arena *ar);
/* Checks the plan's invariants: regions contiguous, aligned and matching the update graph's
 * layout; no two arena buffers live at once share a byte; every write lands inside its region.
 * Returns the number of problems, each printed to out (when not NULL) as `plan: ...`. */
int plan_verify(const Plan *p, FILE *out);
/* --emit=plan: the settings, the step programs, the update graph, the regions and the arenas. */
void plan_print(FILE *out, const Plan *p);

#endif
