/* plan.h - the step program and the static memory plan of a train block.
 *
 * Pipeline position: graph (the step graph after autodiff, the update graph) -> fuse -> [plan] ->
 * back ends -> host code. The plan says what one optimizer step does, in order, and
 * where every value lives; `mbtc --emit=plan` prints both.
 *
 * The step program (one per distinct accumulation count: a batch-size ramp has one per stage):
 *     for k in 0 .. accumulation-1:         each micro-batch
 *         load     data.x, data.y <- micro-batch k, into the input region
 *         run      the step graph: forward, then backward seeded with d loss = 1; every
 *                  micro-batch adds loss_scale = 1 / (accumulation x data) times its gradients
 *                  into the gradient region (the runtime zeroes it after each update)
 *         loss     the reported loss += loss_scale x this micro-batch's loss
 *     allreduce    (data > 1) sum the gradient region and the loss over the data ranks
 *     clip         (clip > 0) scale = min(1, clip / (||gradients||_2 + 1e-6)); gradients *= scale
 *     schedule     host: lr = lr_base x schedule(step), t = step + 1 (1-based, as f32)
 *     update       the update graph over the parameter, gradient and state regions
 * Each micro-batch's loss is its own mean (cross_entropy is a mean over its tokens); scaling it by
 * 1 / (accumulation x data) makes the summed gradient the gradient of the mean over the global
 * batch. The scale enters where forward_backward adds the gradient buffers into the gradient
 * region, so the graph stays the same for every program; only the scale and the loop count differ.
 *
 * The memory plan, made after fusion from the fused schedules' buffers, assigns every address the
 * executable uses. Parameters, gradients and optimizer state each live in one contiguous region
 * with the update graph's flat layout (graph.h, GraphUpdate): parameter i at the same byte offset
 * (a multiple of PLAN_ALIGN) in the parameter and gradient regions and in each state variable's
 * part of the state region, so the optimizer is one elementwise pass over the regions and a
 * data-parallel all-reduce one collective over the gradient region. data.x and data.y are the
 * runtime's two batch buffers. Every other buffer of a schedule lives in the activation arena at
 * an offset assigned by liveness over its launches (plan_assign_offsets); the phases (step,
 * update, logits) never run at once, so each starts at byte 0 - the update after its lr and t
 * slots - and the arena is the largest of their peaks. The host code (compiler/host) takes every
 * address from here. */
#ifndef MBT_PLAN_H
#define MBT_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "fuse.h"
#include "graph.h"
#include "kv.h"
#include "scalar.h"
#include "sema.h"

#define PLAN_ALIGN                                                                                                               \
    64                                    /* bytes: every region offset and arena offset is a multiple (RT_ALIGN:
                                             host_abi.c asserts they are equal) */
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

/* ---- the fused schedules the plan is made of (schedules.c) ---- */

/* The phases of an executable, each one schedule of launches; no two run at once, so each one's
 * arena starts at byte 0 and the executable's arena is the largest of their peaks. */
typedef enum PlanPhase {
    PLAN_STEP,   /* forward_backward: one micro-batch's forward and backward (forward_loss: its prefix) */
    PLAN_UPDATE, /* optimizer_update */
    PLAN_LOGITS, /* forward_logits: generation's forward at batch 1 */
    PLAN_CHUNK,  /* forward_chunk: the forward over new tokens with the paged KV cache (kv.h) */
    PLAN_NPHASES
} PlanPhase;

/* The schedules -o builds, fused and verified: step (differentiated), update, and the batch-1
 * logits (absent when the program cannot generate: why_no_logits says why, at no_logits_at). Each
 * kernel is named with its schedule's prefix (step_k3_add). */
typedef struct PlanSchedules {
    int n;                            /* 2, 3 with the logits, 4 with the chunk phase too */
    const char *prefix[PLAN_NPHASES]; /* "step_", "update_", "logits_", "chunk_" */
    FuseResult *r[PLAN_NPHASES];
    const Graph *g[PLAN_NPHASES];
    int disjoint[PLAN_NPHASES]; /* buffers of the schedule never overlap (cpu_lower_kernel's flag) */
    int logits_node;            /* the logits' node in g[PLAN_LOGITS] (-1 without) */
    int64_t vocab;              /* the last dimension of what the loss's cross_entropy reads; 0: none */
    const char *why_no_logits;  /* NULL with the logits */
    Span no_logits_at;
    /* the chunk phase (present only with the logits): the forward over kv.rows new tokens */
    KvConfig kv;
    KvChunk chunk;            /* chunk.g, chunk.out: its graph and logits node */
    int chunk_node;           /* the logits' node in g[PLAN_CHUNK] (-1 without) */
    const char *why_no_chunk; /* NULL with the chunk phase */
    Span no_chunk_at;
    /* a model with LoRA layers whose step has no fused LoRA launch (docs/architecture.md, "Fusion":
     * f32 products only): why, and the train block's name to point at; NULL otherwise */
    const char *why_no_lora_fusion;
    Span no_lora_fusion_at;
} PlanSchedules;

/* The schedules of tb (its step differentiated): fused[0] and fused[1] are the step's and the
 * update's launches (the kernels stage), and the train block's model(data.x) at batch 1 (tb->forward,
 * built in sema's one walk) is fused here for its logits. The kernels keep their names (the host
 * code prefixes them: host_schedules). Returns 0, or 1 after errors were reported through diag. */
int plan_schedules(const TrainBuild *tb, FuseResult *const fused[2], PlanSchedules *out, Arena *ar);
/* The warning -o and the CUDA source give for a program without the logits: it builds without
 * generation. Nothing when it has them. */
void plan_warn_no_logits(const PlanSchedules *s, const char *train);
/* The warning -o and the CUDA source give for a bf16 (or f16) program with LoRA layers: their down
 * and up products stay GEMMs (fused LoRA is for f32 products). Nothing otherwise. */
void plan_warn_lora_unfused(const PlanSchedules *s, const char *train);
/* The chunk phase's settings for a train block (schedules.c). */
/* the most rows (new tokens) a call of forward_chunk takes (plan_kv_config) */
#define PLAN_KV_ROWS_MAX 256
const char *plan_kv_config(const TrainBuild *tb, KvConfig *kv);

/* ---- the memory plan: every address the executable uses ---- */

typedef enum PlanHome {
    PH_NONE,   /* no memory: a buffer no launch touches */
    PH_PARAMS, /* the parameter region */
    PH_GRADS,  /* the gradient region */
    PH_STATE,  /* the optimizer-state region */
    PH_X,      /* data.x: the runtime's input batch (RtStep.x) */
    PH_Y,      /* data.y: the runtime's target batch (RtStep.y) */
    PH_POS,    /* data.pos: each token's position in its document (RtStep.pos), with tokens(docs = ...) */
    PH_STATS,  /* the statistics over the global batch, global_mean's inputs (RtStep.stats) */
    PH_ARENA,  /* the activation arena */
    PH_KV,     /* the chunk phase's "kv" input: the metadata, then the pool (RtStep.kv) */
    PH_PCAST,  /* the parameter casts' region (RtStep.pcasts): parameter element i's bf16 copy at byte 2i */
} PlanHome;

/* Where one fused buffer (FuseResult.buffers) lives. */
typedef struct PlanSlot {
    PlanHome home;
    int64_t offset; /* bytes from the start of its region */
    int64_t bytes;
    int first, last; /* PH_ARENA: its live range, in launches of its schedule */
} PlanSlot;

/* A move: a parameter's gradient added into the gradient region right after the last launch that
 * touches its buffer (step: dst += loss_scale x src, so micro-batch k > 0 adds to k = 0's), or an
 * update result copied into its region after the schedule's last launch (update). Nothing is computed in place: every kernel writes arena buffers, and
 * these moves put the results where the runtime reads them. */
typedef struct PlanWrite {
    const char *what; /* "grad h.0.attn.weight", "p", "state.m" */
    int buffer;       /* the source: a buffer of the schedule, in the arena */
    PlanHome to;
    int64_t offset, bytes;
    int accumulate; /* 1: added, scaled by the micro-batch's loss_scale; 0: copied */
    int after;      /* step: the move runs right after this position of the step program (the last
                       launch that touches the buffer), so the buffer's life ends there; update: 0,
                       after the last launch */
} PlanWrite;

/* The memory of one phase: a slot for every buffer of its schedule, and its moves. */
typedef struct PlanPhaseMem {
    const char *name;    /* "step", "update", "logits" */
    const FuseResult *r; /* NULL: the phase is absent (no logits) */
    PlanSlot *slots;     /* [r->nbuffers] */
    int nwrites;
    PlanWrite *writes;
    int64_t reserve;     /* arena bytes before the first buffer: the update's lr and t slots, the
                                 step's dropout key */
    int64_t rng_offset;  /* the step's "rng" key (graph.h: dropout's i64[GRAPH_RNG_WORDS]) at this
                                 arena offset, which forward_backward and forward_loss fill; -1: no
                                 launch reads one */
    int64_t peak, naive; /* the arena during the phase: planned (reserve included), and without reuse */
    int kernels, gemms;  /* launches per call */
} PlanPhaseMem;

/* ---- recompute (plan_recompute.c; docs/memory.md) ----
 * With `recompute = [...]` the step phase's forward launches that write the chosen held buffers
 * (forward values the backward reads) are run a second time, just before the first backward launch
 * that reads what they write, with the same kernels on the same inputs: their outputs are dropped
 * after their last forward use and their memory is free in between. The step program is then the
 * schedule's launches with the re-runs inserted (order); every step slot's first and last are
 * positions in that order, and a buffer a re-run writes has a second slot (again) from the re-run
 * to its last use. */
typedef enum PlanFate {
    PF_NONE,     /* not a forward value the backward reads, and no re-run needs it */
    PF_KEPT,     /* held: kept from the forward to the backward */
    PF_RECOMP,   /* held: dropped after the forward, recomputed by a re-run */
    PF_REMADE,   /* a forward value only a re-run reads: made again by an earlier re-run */
    PF_KEPT_FOR, /* a forward value only a re-run reads, kept until that re-run (its launch cannot run again) */
    PF_OFFLOAD,  /* held: copied to the store after its last forward use, read back before its first backward use */
} PlanFate;

typedef struct PlanRerun {
    int launch;      /* the forward launch run again */
    int before;      /* just before this launch of the schedule (its first backward reader) */
    const char *why; /* the keyword that chose it, or "needed by a re-run" */
} PlanRerun;

/* offload.activations (plan_offload.c; docs/memory.md, "Activation offload"): a held buffer kept
 * from the forward to the backward is copied to the store after its last forward use and read back
 * before its first backward use; its first copy (slots) dies when the write has been waited for,
 * its second copy (again) lives from the read to its last use. Positions are of the step program
 * (PlanRecompute.order). The runtime waits for everything queued at a wait, so a wait before
 * position q covers every request issued before it. */
#define PLAN_OFFLOAD_PAGE 4096 /* runtime/offload/rt_store.h, RT_STORE_ALIGN; the arena starts a page */
typedef struct PlanOffload {
    int buffer;
    int64_t bytes;     /* the buffer's */
    int64_t store_off; /* its slot in the store file (4096-aligned, store_bytes of the file in all) */
    int write_after;   /* the write is issued right after this position (its last forward use) */
    int write_wait;    /* and waited for just before this one: the first copy lives to write_wait - 1 */
    int read_at;       /* the read is issued just before this position: the second copy lives from it */
    int use;           /* waited for just before this one (its first backward use): read_at + k_read */
} PlanOffload;

typedef struct PlanRecompute {
    unsigned mask; /* TrainConfig.recompute (0: none) */
    int on;        /* mask or offload set: the step program below is planned (else nothing below is set) */
    int offload;   /* TrainConfig.offload_activations (Storage): 0 none */
    int boundary;  /* the first backward launch: re-runs come at or after it */
    int nreruns;
    PlanRerun *reruns; /* in the order they run */
    int norder;
    int *order;                         /* the step program: i >= 0 launch i of the schedule, -1 - j re-run j */
    unsigned char *fate;                /* [nbuffers] PlanFate */
    int *rerun;                         /* [nbuffers] the re-run that writes its second copy, -1 */
    PlanSlot *again;                    /* [nbuffers] that copy's slot (home PH_NONE: none) */
    int64_t peak_without;               /* the step phase's peak without recompute */
    int64_t held_kept, held_recomputed; /* bytes of held buffers, by fate */
    /* offload.activations: the chosen buffers (PF_OFFLOAD) in store order */
    int noffloads;
    PlanOffload *offloads;
    int *off;                   /* [nbuffers] index into offloads, -1 */
    int64_t store_bytes;        /* the store file */
    int64_t held_offloaded;     /* their bytes */
    int64_t peak_no_offload;    /* the step phase's peak with the re-runs but without offload */
    double store_bw, launch_bw; /* the assumed bandwidths the plan timed the copies with (bytes/s) */
    int gpu;                    /* a GPU build: nvme's copies go through pinned staging (gpu_act.c) */
} PlanRecompute;

/* ZeRO-3's gather schedule (plan_gather.c; docs/parallel.md, "ZeRO-3"): the parameter ranges the
 * step program reads, merged into disjoint units (floats of the parameter region), each gathered
 * before its first use in the forward and again before its first use in the backward, and
 * released after its last use in each; the next gather is prefetched while the current one is
 * used. Computed for every program (the CPU's forward_backward, forward_loss and forward_stats
 * signal it whatever the zero setting, so the code and the program hash do not depend on it). */
typedef struct PlanGather {
    int64_t lo, hi; /* floats of the parameter region */
    int need;       /* gathered before this position of the step program (its first use here) */
    int done;       /* released after this one (its last use here) */
    int post;       /* the gather is started (prefetched) just before this position: the previous
                       gather's need (its own need for the first) */
} PlanGather;

/* A schedule of gathers for one generated function: forward_backward's step program, forward_loss's
 * launches up to the loss, forward_stats's launches (positions: of the step program, or launch
 * indices of the step schedule). */
enum { PLAN_GATHER_STEP, PLAN_GATHER_LOSS, PLAN_GATHER_STATS, PLAN_NGATHER };
typedef struct PlanGatherSched {
    int n;
    PlanGather *g;        /* in the order of need (posts follow the same order) */
    int64_t window;       /* floats: the most the gathers hold at once (the prefetched one included) */
    int units;            /* how many gathers that is at most */
    int64_t window_pages; /* the most pages (PlanMemory.gather_page) the held gathers cover at once */
} PlanGatherSched;

typedef struct PlanParam {
    const char *name;
    int node;       /* its G_PARAM in the step graph */
    int64_t numel;  /* its storage: the segment's length (with a padded leading dimension, graph_pad.h) */
    int64_t valid;  /* the program's element count (RtParam's numel): numel unless padded */
    int64_t offset; /* bytes; the same in the parameter and gradient regions and in each state part */
} PlanParam;

typedef struct PlanInput {
    const char *name; /* "data.x", "data.y" */
    PlanHome home;    /* PH_X, PH_Y */
    int node;         /* in the step graph */
    int64_t bytes;    /* what the runtime allocates: the step's [micro, seq] (the logits' [1, seq] fits) */
} PlanInput;

typedef struct PlanMemory {
    int64_t param_bytes; /* the parameter region; the gradient region alike */
    int64_t state_part;  /* each state variable's part of the state region: the update's length n
                            (param_bytes but for the frozen parameters, laid out last, which have none) */
    int nparams;
    PlanParam *params;
    int nstate;
    int64_t state_bytes; /* nstate x state_part */
    /* offload.optimizer = nvme (docs/memory.md): the state lives in a store file of store_bytes,
     * offload_nchunks chunks of offload_chunk parameters (the last may be shorter), each chunk's
     * nstate parts together in one 4096-aligned slot; the update streams it through 3 staging
     * buffers of staging_bytes / 3 (chunk i+1 read, chunk i updated, chunk i-1 written back).
     * offload_chunk 0: the state is in memory. */
    int64_t offload_chunk, offload_nchunks, store_bytes, staging_bytes;
    /* offload.optimizer = host: the state (state_bytes) in host memory, updated by the CPU's
     * optimizer_update on a GPU build; the device holds none of it */
    int offload_host;
    int ninputs;
    PlanInput inputs[3]; /* data.x, data.y and data.pos, those the step reads */
    int64_t input_bytes; /* data.x and data.y together */
    /* global_mean (Graph.stat_in): statistic k, f32, at stat_offset[k] bytes of the stats region
     * (RtStep.stats), stat_bytes in all (0: none); forward_stats runs the step's launches that
     * write what the statistics' expressions need (stats_keep, none past stats_last, the last that
     * writes an expression: dead launches pruned, walking back from the expressions' buffers) and
     * copies each expression's buffer to RtStep.stats_out at the same offset. */
    int nstats;
    int64_t *stat_offset;
    int64_t stat_bytes;
    int stats_last;
    unsigned char *stats_keep; /* [step launches]: 1 for those forward_stats runs (what the expressions need) */
    int stats_launches;        /* how many */
    PlanPhaseMem phase[PLAN_NPHASES];
    PlanRecompute rc;                     /* the step phase's re-runs (recompute = [...]) */
    PlanGatherSched gather[PLAN_NGATHER]; /* ZeRO-3's schedules (plan_gather.c) */
    int64_t gather_window;                /* floats: the largest of their windows */
    int gather_units;                     /* the most gathers any holds at once */
    int64_t gather_page;                  /* bytes: the target's page the gathers map (TrainConfig.zero3_page) */
    int64_t gather_window_pages;          /* the most pages any schedule's held gathers cover at once */
    int64_t lr_offset, t_offset;          /* the update's f32 lr and t: arena bytes optimizer_update fills (lr -1: none) */
    /* The step's kernel launches that read nothing but parameters (a bf16 program's weight casts,
     * one multi-segment kernel): what they write is the same for every micro-batch of an optimizer
     * step, so their outputs live over the whole step program (no other buffer shares their bytes
     * in the arena) and forward_backward runs these launches only when RtStep.casts_kept is 0 (the
     * first micro-batch of each step, rt_program.h). NULL (none) with recompute or
     * offload.activations, whose step programs run them every micro-batch as before. */
    unsigned char *param_only; /* [step launches]: 1 for such a launch, 2 when every buffer it writes is
                                  in the parameter casts' region (below); NULL when none is */
    int nparam_only;           /* how many */
    int64_t param_only_bytes;  /* the bytes their outputs hold in the arena */
    /* The parameter casts' region (docs/memory.md, "The parameter casts' region"): with the update
     * graph's cast_out (graph.h), pcast_bytes = 2 bytes an element of the parameter region (element i
     * at byte 2i, so parameter k's cast at its offset / 2). The update writes cast(p_new) over [0, n)
     * into it, and each step buffer a param_only launch writes that is a whole parameter's cast
     * (pcast_buffers) lives there instead of the arena: a launch all of whose buffers do (param_only
     * 2) is skipped also at a step's first micro-batch when the runtime says the region is current
     * (RtStep.casts_kept 2). 0: none (f32, recompute, offload.activations). */
    int64_t pcast_bytes;
    DType pcast_dt;      /* DT_BF16 (or DT_F16) */
    int npcast;          /* step buffers homed in the region */
    int64_t pcast_use;   /* their bytes */
    int nparam_skip;     /* param_only launches marked 2 */
    int64_t arena_bytes; /* the largest peak: what the executable allocates */
} PlanMemory;

/* ---- the step program ---- */

typedef enum PlanOpKind {
    PO_LOAD,      /* per micro-batch: its data.x, data.y into the input region */
    PO_RUN,       /* per micro-batch: the step graph, backward seeded with d loss = 1 */
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
    int64_t first_step, last_step;             /* the optimizer steps it runs (0-based, inclusive); first_step >= steps:
                                      a ramp stage the run never reaches */
    int64_t global, micro, data, accumulation; /* global = micro x accumulation x data */
    double loss_scale;                         /* 1 / (accumulation x data) */
    int nops;
    PlanOp *ops;
} PlanProgram;

typedef struct Plan {
    const char *name;    /* the train block's name */
    const Graph *step;   /* the step graph, differentiated */
    const Graph *update; /* the update graph */
    int first_bwd;       /* the step graph's first backward node */
    int seed;            /* the backward's seed (d loss / d loss, a G_CONST 1.0), or -1: no parameter
                                 reaches the loss, and every gradient is zero */
    int64_t steps, seq, micro, data;
    const TrainConfig *config; /* the settings: the sequence-length curriculum's stages (printed) */
    double clip;               /* 0: none */
    int has_lr;                /* the optimizer has the hyper-parameter lr (the update's input "lr") */
    double lr_base;
    const char *schedule;      /* "lr.cosine(step, warmup = 20, total = 400, min_ratio = 0.1)", NULL: constant */
    const ScalarProg *lr_prog; /* the schedule's program when it depends on the global batch (a
                                  factor lr.batch_scale): the listing gives its rate per stage */
    int nprograms;
    PlanProgram *programs;
    PlanSchedules sched; /* the fused schedules the memory plan is of */
    PlanMemory mem;
    int nnotes;
    const char **notes; /* settings of the block this plan does not carry out yet */
} Plan;

/* The plan of a train block: tb from sema_build_train, its step graph already differentiated
 * (autodiff, which returned first_bwd), and its fused schedules (plan_schedules). Returns NULL
 * after reporting a user error (a learning-rate schedule for an optimizer without lr, a tensor or
 * region beyond PLAN_MAX_BYTES). */
Plan *plan_build(const TrainBuild *tb, int first_bwd, const PlanSchedules *s, Arena *ar);
/* Checks the plan's invariants: regions contiguous, aligned and matching the update graph's
 * layout; in every phase, every buffer of its schedule placed, no two arena buffers live at once
 * share a byte, and every buffer and every write inside its region.
 * Returns the number of problems, each printed to out (when not NULL) as `plan: ...`. */
int plan_verify(const Plan *p, FILE *out);
/* --emit=plan: the settings, the step programs, the update graph, the regions, each phase's arena
 * and buffers, and the summary `./prog info` prints back (plan_print_summary). */
void plan_print(FILE *out, const Plan *p);
/* The summary lines, `plan: ...`, in the words and numbers of `./prog info` (runtime/cli/info.c):
 * the arena of each phase and the largest, the regions, kernels and GEMMs per call and per step. */
void plan_print_summary(FILE *out, const Plan *p);

#endif
