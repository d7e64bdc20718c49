/* train_internal.h - what the train command's files share (runtime/cli/: train.c, the run and its
 * loop; train_dp.c, its data-parallel ranks; train_outputs.c, its outputs checked before it starts):
 * the run's state, RtTrainRun, and the functions one file calls in another. Not part of the
 * library's surface (rt.h). */
#ifndef MBT_TRAIN_INTERNAL_H
#define MBT_TRAIN_INTERNAL_H

#include <signal.h>

#include "comm.h"
#include "dp_reduce.h"
#include "rt_exec.h"
#include "rt_offload.h"
#include "rt_profile.h"
#include "zero3.h"

/* Shard boundaries fall on multiples of the gradient norm's blocks (RT_GRAD_BLOCK), so that each
 * block's sum of squares is one rank's, whatever the number of ranks. */
#define RT_SHARD_ALIGN RT_GRAD_BLOCK

/* Everything one training run holds, from rt_train_open to rt_train_close. */
typedef struct RtTrainRun {
    const RtProgram *p;
    const RtOptions *given; /* the options as parsed */
    RtOptions o;            /* the run's: a resumed run takes the checkpoint's seed */
    RtError e;
    RtExec x;
    RtData *train, *val;
    RtDataSpec spec;
    RtLog log;
    int log_open;
    double *partial; /* the gradient norm's blocks */
    RtProfile *prof; /* MBT_PROFILE=1: where the step time goes (rt_profile.h) */
    /* offload { activations = host } on the GPU: the copy stream's measured rates (GB/s) and the
     * bytes they were measured over (0: not measured) */
    double act_gbps_out, act_gbps_back;
    int64_t act_rate_bytes;
    RtCkptWriter *ckpt;
    RtCkptInfo resumed;
    char *resume_path;
    struct sigaction old_handlers[2];
    int handlers;
    /* --dump-step keeps step 1's batches (micro-batch after micro-batch), and its parameters and
     * gradients as they were before clipping and the update */
    int32_t *dump_x, *dump_y;
    float *dump_p, *dump_g;
    int64_t window; /* tokens of one micro-batch */
    double waited;  /* training's wait for the last checkpoint snapshot */
    int ckpt_lock;  /* the checkpoint directory's lock, until the writer takes it; -1: none */
    RtComm *comm;   /* the world of ranks (runtime/comm/comm.h): one rank unless a launcher started several */
    /* data parallelism (docs/parallel.md): this process is rank `rank` of `nranks` (the world's) */
    int rank, nranks;
    double *micro_loss; /* this rank's micro-batches' losses, the largest accum of the ramp, + 1 */
    double *all_loss;   /* every rank's, in rank order: (accum + 1) x nranks, then accum x nranks */
    /* the signal that stops the run after this step (0: none), and the rank it came to: with
     * several ranks every rank's pending signal travels with the losses' gather, so that all of
     * them stop after the same step (rt_train_gather_losses) */
    int stop_sig, stop_rank;
    int64_t *shard_off; /* nranks + 1 shard boundaries of the gradient (rt_comm_shards) */
    float *shard_got;   /* every rank's copy of this rank's shard (rt_comm_exchange_shards) */
    float *d_shard_got; /* the same on the GPU when NCCL moves the gradient whole (else NULL) */
    int nccl_grads;     /* NCCL moves the gradient GPU to GPU (its sums on the device): rt_comm_nccl */
    /* ZeRO (parallel { zero }, docs/parallel.md): with several ranks, 1, 2 or 3; this rank's
     * optimizer state is its shard alone, [shard_off[rank], shard_off[rank + 1]) of each variable */
    int zero;
    /* ZeRO-1/2 and a bf16 program (RtProgram.pcast_bytes): shard_off / 2, the shards of the parameter
     * casts' region counted in f32 pairs (2 bytes a parameter), which rt_train_gather_params gathers
     * beside the parameters so that the region stays current (RtExec.pcasts_current); NULL when it
     * cannot (an odd boundary, or none). pcasts_gathered: this step's gather did. */
    int64_t *pcast_off;
    int pcasts_gathered;
    /* offload { optimizer } on a GPU build, this step: the host's parameters are current (the
     * CPU's update wrote the shard there), so a gather staged through the host starts from them
     * instead of pulling the device's (rt_train_gather_f32); the shard was not uploaded */
    int host_params_current;
    int64_t host_steps; /* the host's updates run (for the bytes they moved, printed at the end) */
    /* offload { optimizer = host } alone on a GPU: the host's update deferred to the next step's
     * reads (train_step.c's rt_host_defer): chunk c's update runs when a launch first reads its
     * parameters (the hook), or at a flush (rt_train_host_flush) before anything on the host reads
     * the parameters or the state */
    struct {
        int on;      /* chunks are pending */
        RtStatus st; /* the first failure of a chunk the hook ran (its message in e) */
        RtStep step; /* the update's RtStep (lr, t, the host's regions) */
        int64_t lo, hi, chunk, part, nchunks, ndone;
        unsigned char *done; /* [nchunks] */
        RtParamHook hook;
    } defer;
    float *zero_scratch;   /* one vector of param_floats: a state variable gathered for a checkpoint */
    float *state_full;     /* rank 0: the whole optimizer state, gathered for a checkpoint */
    double *norm_all;      /* ZeRO-2 and 3: every rank's gradient-norm blocks, rank after rank */
    RtZero3 *zero3;        /* ZeRO-3: the parameter region, this rank's shard resident, the rest gathered around its uses */
    RtDpReduce *buckets;   /* the gradient reduced in buckets by a communication thread (dp_reduce.h), or NULL */
    int64_t bucket_floats; /* MBT_DP_BUCKET_MB's */
    /* the buckets overlapped with the backward of the step's last micro-batch (MBT_DP_OVERLAP,
     * default on; the CPU alone): the generated code's rt_grad_ready calls hook, which marks the
     * range ready in buckets; fold_tree is the local tree the thread folds each bucket of */
    int overlap;
    RtGradHook hook;
    RtTree fold_tree;
    /* the GPU's buckets overlapped with the backward (train_dp.c, over NCCL on a communication
     * stream), or NULL; then overlap is 1 and hook queues each bucket once it is final */
    struct RtGpuBuckets *gbuckets;
    int gbuckets_n;      /* their number */
    double model_gbps;   /* MBT_DP_MODEL_GBPS: the overlap model's link bandwidth, 0 for none */
    double fb_s;         /* the micro-batches' forward_backward time (for the model) */
    int high_water_done; /* --arena-high-water: measured (the first step this process runs) */
    int64_t fb_n;
    /* global_mean: the step's micro-batches of this rank, read once for the statistics pass and kept
     * for the step's own pass (rt_train_stats); stat_cap micro-batches; stat_mine their statistics
     * (accum x stat_floats), stat_all every rank's (rank order, which is micro-batch order) */
    int32_t *stat_x, *stat_y;
    int64_t stat_cap;
    double *stat_mine, *stat_all;
    /* offload { optimizer = nvme } (docs/memory.md): the optimizer state in a store file; x.state
     * is then NULL, and a checkpoint reads the state back into a buffer of its own */
    RtOptOffload *offload;
    /* ZeRO-2 and 3's partial sums by shard (docs/parallel.md, "ZeRO-2's partial sums by shard"):
     * shard_tree_on when the run takes that path (zero >= 2, N ranks a power of two > 1, the CPU);
     * a step with 2 or more micro-batches a rank then runs global micro-batches j x N + rank
     * (interleaved, this step's) and pushes each one's summed shard into shard_tree. data_at: the
     * global micro-batch the data stand at in the step under way (rt_train_seek_micro);
     * loss_order: the step's losses put back in micro-batch order */
    int shard_tree_on, interleaved;
    RtShardTree shard_tree;
    /* ZeRO-2's buckets by shard overlapped with each micro-batch's backward (the CPU, MBT_DP_OVERLAP,
     * more than one bucket; docs/parallel.md): the reducer (it leaves this rank's shard of a
     * micro-batch block's sum in the gradient region's shard) and the hook that marks ranges ready */
    RtDpReduce *zbuckets;
    /* the same on the GPU over NCCL: gbuckets in shard mode (train_dp.c), begun for every
     * micro-batch; gz_recv_bytes its device receive buffer */
    int gzbuckets;
    int64_t gz_recv_bytes;
    RtGradHook zhook;
    int test_drop_join;   /* MBT_TEST_DROP_JOIN=1, tests only: the join left out (it must be caught) */
    RtShardOps shard_ops; /* the device's regions' additions and copies (over NCCL) */
    int64_t data_at;
    double *loss_order;
} RtTrainRun;

/* train.c: the signal (SIGTERM, SIGINT) that asks the run to stop after this step, 0 for none;
 * with several ranks it travels with the losses' gather (rt_train_gather_losses) */
extern volatile sig_atomic_t rt_stop_signal;

/* train_step.c: one optimizer step (its micro-batches, the reduction, the norm, the update, step 1's
 * dump); its log record comes back in *sl */
RtStatus rt_train_step(RtTrainRun *r, int64_t step, RtStepLog *sl);
/* The deferred host update's chunks not yet run, run now (offload { optimizer = host }: before
 * anything on the host reads the parameters or the optimizer state); RT_OK when none is pending. */
RtStatus rt_train_host_flush(RtTrainRun *r);

/* train_dp.c: data parallelism (docs/parallel.md) */
RtStatus rt_train_world(RtTrainRun *r, char *prog, size_t nprog, int *agreed);
RtStatus rt_train_tree_alloc(RtTrainRun *r);
/* the communication thread's fold of a bucket (rt_dp_reduce_begin's callback; ctx is the run) */
void rt_train_fold(void *ctx, int64_t lo, int64_t hi);
/* The GPU's buckets (MBT_DP_OVERLAP with NCCL): _begin before the step's last micro-batch (the
 * tree as it stands before its leaf); rt_train_reduce queues the rest and joins them; _print is
 * MBT_DEBUG's buckets line; _close waits for the communication stream and frees them. */
RtStatus rt_train_gpu_buckets_begin(RtTrainRun *r, const RtTree *tree);
void rt_train_gpu_buckets_print(const RtTrainRun *r, FILE *f, const char *prefix);
void rt_train_gpu_buckets_close(RtTrainRun *r);
RtStatus rt_train_gather_losses(RtTrainRun *r, int64_t accum, double **all);
/* ZeRO-2's partial sums by shard: local micro-batch m (of accum) of an interleaved step done, its
 * gradient in the gradient region: exchanged by shards, this rank's shard summed over the ranks
 * and pushed into the shard's tree; after the last the shard of the step's sum is in place
 * (the region zeroed for the next one otherwise). */
RtStatus rt_train_shard_push(RtTrainRun *r, int64_t m, int64_t accum, int64_t step);
/* The global micro-batch index of this rank's local micro-batch m in a step of accum a rank. */
static inline int64_t rt_train_global_micro(const RtTrainRun *r, int64_t m, int64_t accum) {
    return r->interleaved ? m * r->nranks + r->rank : r->rank * accum + m;
}
/* Which rank ran global micro-batch g, and as which of its own: rank x accum + local, the
 * position of its loss or statistics among every rank's gathered in rank order. */
static inline int64_t rt_train_gathered_at(const RtTrainRun *r, int64_t g, int64_t accum) {
    return r->interleaved ? (g % r->nranks) * accum + g / r->nranks : g;
}
RtStatus rt_train_reduce(RtTrainRun *r, int64_t step);
RtStatus rt_train_shard_norm(RtTrainRun *r, double *norm);
RtStatus rt_train_shard_state(RtTrainRun *r);
RtStatus rt_train_gather_state(RtTrainRun *r);
/* ZeRO, after the update: every rank's updated shard of the parameters gathered on every rank. */
RtStatus rt_train_gather_params(RtTrainRun *r);
/* ZeRO-3: the whole parameter region gathered on every rank (every rank calls it alike), before
 * what reads it whole; nothing without ZeRO-3 */
RtStatus rt_train_zero3_whole(RtTrainRun *r);

/* train_outputs.c: every file the run writes checked before it starts */
RtStatus rt_train_check_outputs(RtTrainRun *r);

#endif
