/* train_dp.c - the train command's data-parallel ranks (docs/parallel.md): the world of ranks
 * opened and agreed on, the step's tree of partial sums and the ranks' shards, the gradient reduced
 * over the ranks (in buckets by the communication thread, overlapped with the backward of the
 * step's last micro-batch on the CPU), the losses gathered with every rank's pending stop signal,
 * and ZeRO's sharded optimizer state. train.c's loop calls these; RtTrainRun is train_internal.h's. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

/* rt_grad_ready's hook (RtGradHook): elements [lo, hi) of the gradient have their last addition
 * of the step's last micro-batch. */
static void rt_train_grad_ready(void *ctx, int64_t lo, int64_t hi) { rt_dp_reduce_ready(((RtTrainRun *)ctx)->buckets, lo, hi); }

/* The bucket's elements made this rank's final sum, on the communication thread: the local
 * tree's additions after the last micro-batch, over [lo, hi). */
void rt_train_fold(void *ctx, int64_t lo, int64_t hi) {
    RtTrainRun *r = ctx;
    rt_exec_tree_fold_range(&r->x, &r->fold_tree, lo, hi);
}

/* MBT_DP_OVERLAP (1, the default, or 0): whether the buckets start during the backward of the
 * step's last micro-batch. The GPU keeps the reduction after the backward: its gradient adds are
 * queued on a stream and the reduction stages the whole gradient through the host. A bucket is
 * ready once every parameter's range in it was announced (a parameter whose gradient the program
 * never writes, a zero gradient, holds its bucket until the backward ends). */
static RtStatus rt_train_overlap_open(RtTrainRun *r) {
    const char *s = getenv("MBT_DP_OVERLAP");
    r->overlap = 1;
    if (s && *s) {
        if (strcmp(s, "0") && strcmp(s, "1"))
            return rt_fail(&r->e, RT_ERR_ARG, "MBT_DP_OVERLAP is '%s': it must be 1 (the default) or 0", s);
        r->overlap = s[0] == '1';
    }
    if (r->x.gpu) r->overlap = 0;
    if (!r->overlap) return RT_OK;
    const RtProgram *p = r->p;
    int64_t *lo = malloc((size_t)(p->nparams + 1) * sizeof *lo), *hi = malloc((size_t)(p->nparams + 1) * sizeof *hi);
    if (!lo || !hi) {
        free(lo), free(hi);
        return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the parameters' ranges");
    }
    for (int64_t i = 0; i < p->nparams; i++) lo[i] = p->params[i].offset, hi[i] = p->params[i].offset + p->params[i].numel;
    rt_dp_reduce_expect(r->buckets, lo, hi, (int)p->nparams);
    free(lo), free(hi);
    r->hook = (RtGradHook){rt_train_grad_ready, r};
    return RT_OK;
}

/* The step's tree of partial sums and the micro-batches' losses, for the largest accumulation of
 * the batch ramp. */
RtStatus rt_train_tree_alloc(RtTrainRun *r) {
    const RtTrainSettings *t = &r->p->train;
    int64_t accum = t->accum;
    for (int64_t i = 0; i < t->nramp; i++)
        if (t->ramp[i].accum > accum) accum = t->ramp[i].accum;
    accum = accum * t->data_ranks / r->nranks; /* this process's micro-batches a step, at most */
    RtStatus st = rt_exec_tree_open(&r->x, accum, &r->e);
    if (st != RT_OK) return st;
    r->micro_loss = calloc((size_t)accum + 1, sizeof *r->micro_loss);
    r->all_loss = calloc((size_t)((accum + 1) * r->nranks), sizeof *r->all_loss);
    if (!r->micro_loss || !r->all_loss) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the micro-batches' losses");
    st = rt_dp_bucket_env(&r->bucket_floats, &r->e);
    if (st == RT_OK) st = rt_dp_model_env(&r->model_gbps, &r->e);
    if (st != RT_OK || r->nranks == 1) return st;
    r->shard_off = calloc((size_t)r->nranks + 1, sizeof *r->shard_off);
    if (!r->shard_off) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's shards");
    rt_comm_shards(r->p->param_floats, r->nranks, RT_SHARD_ALIGN, r->shard_off);
    int64_t len = r->shard_off[r->rank + 1] - r->shard_off[r->rank];
    r->shard_got = calloc((size_t)(len * r->nranks) + 1, sizeof *r->shard_got);
    if (!r->shard_got) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's shards");
    r->zero = (int)t->zero;
    if (r->x.gpu) { /* NCCL between the GPUs when it is there: the sum then stays on the device */
        st = rt_comm_set_gpu(r->comm, r->x.gpu, &r->e);
        if (st == RT_OK && rt_comm_nccl(r->comm))
            st = rt_gpu_alloc(r->x.gpu, (void **)&r->d_shard_got, (len * r->nranks + 1) * (int64_t)sizeof(float),
                              "every rank's copy of this rank's gradient shard", &r->e);
        /* without NCCL the ranks' sum runs on host copies that rt_train_reduce makes itself (one
         * download, the buckets, one upload): the collectives then take host buffers */
        else if (st == RT_OK) st = rt_comm_set_gpu(r->comm, NULL, &r->e);
        if (st != RT_OK) return st;
    }
    /* the reduction in buckets by a thread (not with ZeRO-2, whose rank keeps its shard of the
     * whole vector alone; nor for one bucket, where the thread would only add a hand-over; nor over
     * NCCL, which sums on the device after the backward) */
    if (r->zero < 2 && r->p->param_floats > r->bucket_floats && !r->d_shard_got) {
        st = rt_dp_reduce_open(&r->buckets, r->comm, r->x.pool, r->p->param_floats, r->bucket_floats, &r->e);
        if (st != RT_OK) return st;
        st = rt_train_overlap_open(r);
        if (st != RT_OK) return st;
    }
    if (r->zero == 3) { /* the parameters' shard: the rest is released before the first step */
        st = rt_zero3_open(&r->zero3, r->comm, &r->x.params, r->p->param_floats, r->shard_off, &r->e);
        if (st != RT_OK) return st;
        r->x.param_hook = rt_zero3_hook(r->zero3); /* every RtStep of the run carries it */
    }
    if (r->zero >= 2) {
        r->norm_all = calloc((size_t)(rt_exec_grad_blocks(r->p) * r->nranks) + 1, sizeof *r->norm_all);
        if (!r->norm_all) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient norm's blocks");
    }
    return r->zero ? rt_train_shard_state(r) : RT_OK;
}

/* Every rank's micro-batch losses, rank 0's first, into *all (this rank's alone when it is the
 * only one). The stop signal rides along: each rank appends the signal it has seen (0: none) to
 * its losses, and every rank takes the first nonzero one in rank order, so that all of them agree
 * to stop after this step (a signal that comes to one rank, or to each at a slightly different
 * time, stops them all after the same step; docs/parallel.md). One double a rank a step: no
 * collective of its own. */
RtStatus rt_train_gather_losses(RtTrainRun *r, int64_t accum, double **all) {
    if (r->nranks == 1) { /* (alone the signal is read after the step: rt_train_after_step) */
        *all = r->micro_loss;
        return RT_OK;
    }
    *all = r->all_loss;
    r->micro_loss[accum] = (double)rt_stop_signal;
    RtStatus st = rt_comm_gather_f64(r->comm, r->micro_loss, accum + 1, r->all_loss, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "gathering the step's losses");
    r->stop_sig = 0;
    for (int k = 0; k < r->nranks; k++) {
        int ks = (int)r->all_loss[k * (accum + 1) + accum];
        if (ks && !r->stop_sig) r->stop_sig = ks, r->stop_rank = k;
        /* the losses alone, rank after rank (the destination never passes the source) */
        memmove(r->all_loss + k * accum, r->all_loss + k * (accum + 1), (size_t)accum * sizeof *r->all_loss);
    }
    return RT_OK;
}

/* The step's gradient summed over the ranks (nothing to do with one rank): each rank receives
 * every rank's partial sum of its shard (rt_comm_exchange_shards, rank order = micro-batch order),
 * sums them by the step's tree over the ranks, and the summed shards are gathered back so that
 * every rank holds the whole gradient. With accum a power of two each rank's partial sum is a
 * node of the one tree over the step's M micro-batches, and the tree over the ranks is the rest
 * of that tree: the gradient is the bits one process gets (docs/parallel.md). On the GPU the
 * gradient stays on the device with NCCL (rt_train_reduce_nccl), else goes through host memory. */
typedef struct {
    RtTrainRun *r;
    int64_t len;
    RtStatus st;
} RtGpuTree;

static void rt_gpu_tree_add(void *ctx, int a, int b) {
    RtGpuTree *t = ctx;
    float *got = t->r->d_shard_got;
    if (t->st == RT_OK && t->len > 0)
        t->st = rt_gpu_axpy(t->r->x.gpu, got + a * t->len, got + b * t->len, 1.0f, t->len, &t->r->e);
}

/* The GPU's sum over NCCL: the shards exchanged GPU to GPU, summed on the device in the same tree
 * (rt_dp_tree_walk; rt_gpu_axpy with scale 1 adds as the host does, bit for bit), gathered back. */
static RtStatus rt_train_reduce_nccl(RtTrainRun *r, int64_t step) {
    RtExec *x = &r->x;
    int64_t lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    RtGpuTree t = {r, len, rt_comm_exchange_shards(r->comm, x->d_grads, r->shard_off, r->d_shard_got, &r->e)};
    rt_dp_tree_walk(r->nranks, rt_gpu_tree_add, &t);
    RtStatus st = t.st;
    if (st == RT_OK && len > 0) st = rt_gpu_copy(x->gpu, x->d_grads + lo, r->d_shard_got, len * (int64_t)sizeof(float), &r->e);
    /* ZeRO-2 keeps its shard of the summed gradient alone (as rt_train_reduce's host path) */
    if (st == RT_OK && (r->zero < 2 || (r->given->dump_step && step == 0)))
        st = rt_comm_gather_shards(r->comm, x->d_grads, r->shard_off, &r->e);
    return st;
}

RtStatus rt_train_reduce(RtTrainRun *r, int64_t step) {
    if (r->nranks == 1) return RT_OK;
    RtExec *x = &r->x;
    if (r->d_shard_got) {
        RtStatus st = rt_train_reduce_nccl(r, step);
        return st == RT_OK
                   ? st
                   : rt_error_context(&r->e, "step %lld: summing the gradient over the ranks (NCCL)", (long long)(step + 1));
    }
    int64_t n = r->p->param_floats, lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    RtStatus st = rt_exec_pull(x, RT_PULL_GRADS, &r->e);
    if (st == RT_OK && r->buckets && r->overlap) { /* started during the last backward: its end */
        st = rt_dp_reduce_finish(r->buckets, &r->e);
    } else if (st == RT_OK && r->buckets) { /* zero < 2: the whole sum on every rank, bucket by bucket */
        st = rt_dp_reduce_run(r->buckets, x->grads, &r->e);
    } else if (st == RT_OK) {
        st = rt_comm_exchange_shards(r->comm, x->grads, r->shard_off, r->shard_got, &r->e);
    }
    if (st == RT_OK && !r->buckets) {
        rt_dp_tree_sum_f32(x->pool, r->shard_got, r->nranks, len);
        if (len > 0) memcpy(x->grads + lo, r->shard_got, (size_t)len * sizeof *x->grads);
        /* ZeRO-2 and 3 keep their shard of the summed gradient alone (but for --dump-step's step 1, which
         * writes all of it; r->given is the same on every rank) */
        if (r->zero < 2 || (r->given->dump_step && step == 0)) st = rt_comm_gather_shards(r->comm, x->grads, r->shard_off, &r->e);
    }
    if (st == RT_OK && x->gpu) st = rt_gpu_upload(x->gpu, x->d_grads, x->grads, n * 4, &r->e);
    return st == RT_OK ? st : rt_error_context(&r->e, "step %lld: summing the gradient over the ranks", (long long)(step + 1));
}

RtStatus rt_train_zero3_whole(RtTrainRun *r) { return r->zero3 ? rt_zero3_whole(r->zero3, &r->e) : RT_OK; }

/* ZeRO-2's (and 3's) gradient norm: this rank's blocks of RT_GRAD_BLOCK elements (its shard is whole blocks,
 * RT_SHARD_ALIGN), every rank's gathered, and block b taken from the rank that holds it, summed in
 * block order: the sum rt_exec_grad_norm makes of the whole gradient. */
RtStatus rt_train_shard_norm(RtTrainRun *r, double *norm) {
    int64_t nblocks = rt_exec_grad_blocks(r->p), lo = r->shard_off[r->rank], hi = r->shard_off[r->rank + 1];
    memset(r->partial, 0, (size_t)nblocks * sizeof *r->partial);
    RtStatus st = RT_OK;
    if (r->x.gpu && hi > lo) /* the blocks of the shard (lo is a block boundary), as the whole gradient's norm sums them */
        st = rt_gpu_sumsq_blocks(r->x.gpu, r->x.d_grads + lo, hi - lo, RT_GRAD_BLOCK, r->partial + lo / RT_GRAD_BLOCK, &r->e);
    else rt_exec_grad_norm_blocks(&r->x, r->partial, lo / RT_GRAD_BLOCK, (hi + RT_GRAD_BLOCK - 1) / RT_GRAD_BLOCK);
    if (st == RT_OK) st = rt_comm_gather_f64(r->comm, r->partial, nblocks, r->norm_all, &r->e);
    if (st != RT_OK) return st;
    double sumsq = 0;
    int owner = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        while (owner + 1 < r->nranks && r->shard_off[owner + 1] <= b * RT_GRAD_BLOCK) owner++;
        sumsq += r->norm_all[owner * nblocks + b];
    }
    *norm = sqrt(sumsq);
    return RT_OK;
}

/* ZeRO: the optimizer state becomes this rank's shard of each variable (after it was read whole
 * from a checkpoint or initialised), the layout optimizer_update takes with RtStep.lo/hi, on the
 * host and (the GPU's update kernels take the range too) on the device. */
RtStatus rt_train_shard_state(RtTrainRun *r) {
    const RtProgram *p = r->p;
    int64_t n = p->param_floats, lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    if (p->state_floats != p->nstate * n)
        return rt_fail(&r->e, RT_ERR_ARG, "parallel.zero: the optimizer state is %lld floats, not %lld variables of %lld",
                       (long long)p->state_floats, (long long)p->nstate, (long long)n);
    float *shard = malloc((size_t)(p->nstate * len + 1) * sizeof *shard);
    r->zero_scratch = malloc((size_t)(n + 1) * sizeof *r->zero_scratch);
    if (!shard || !r->zero_scratch) {
        free(shard);
        return rt_fail_errno(&r->e, ENOMEM, "parallel.zero: cannot allocate the optimizer state's shard");
    }
    for (int64_t j = 0; j < p->nstate; j++)
        if (len > 0) memcpy(shard + j * len, r->x.state + j * n + lo, (size_t)len * sizeof *shard);
    return rt_exec_shard_state(&r->x, shard, p->nstate * len, &r->e); /* on the GPU, the device's too */
}

/* ZeRO, after the update: every rank's updated shard of the parameters to every rank. On the GPU
 * with NCCL device to device; without it through the host (the parameters down, gathered, up). */
RtStatus rt_train_gather_params(RtTrainRun *r) {
    RtExec *x = &r->x;
    if (!x->gpu) return rt_comm_gather_shards(r->comm, x->params, r->shard_off, &r->e);
    if (r->d_shard_got) return rt_comm_gather_shards(r->comm, x->d_params, r->shard_off, &r->e);
    int64_t n = r->p->param_floats;
    RtStatus st = rt_exec_pull(x, RT_PULL_PARAMS, &r->e);
    if (st == RT_OK) st = rt_comm_gather_shards(r->comm, x->params, r->shard_off, &r->e);
    if (st == RT_OK) st = rt_gpu_upload(x->gpu, x->d_params, x->params, n * 4, &r->e);
    return st;
}

/* ZeRO, before a checkpoint: every rank's shard of each state variable gathered, so that rank 0
 * holds the whole state in r->state_full (the checkpoint is written once, whole, by rank 0). */
RtStatus rt_train_gather_state(RtTrainRun *r) {
    const RtProgram *p = r->p;
    int64_t n = p->param_floats, lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    RtStatus pst = rt_exec_pull(&r->x, RT_PULL_STATE, &r->e); /* the GPU's shard to the host (CPU: nothing) */
    if (pst != RT_OK) return rt_error_context(&r->e, "gathering the optimizer state for a checkpoint");
    if (r->rank == 0 && !r->state_full) {
        r->state_full = malloc((size_t)(p->state_floats + 1) * sizeof *r->state_full);
        if (!r->state_full) return rt_fail_errno(&r->e, ENOMEM, "cannot gather the optimizer state for a checkpoint");
    }
    for (int64_t j = 0; j < p->nstate; j++) {
        if (len > 0) memcpy(r->zero_scratch + lo, r->x.state + j * len, (size_t)len * sizeof *r->zero_scratch);
        RtStatus st = rt_comm_gather_shards(r->comm, r->zero_scratch, r->shard_off, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "gathering the optimizer state for a checkpoint");
        if (r->rank == 0) memcpy(r->state_full + j * n, r->zero_scratch, (size_t)n * sizeof *r->state_full);
    }
    return RT_OK;
}

/* The world of ranks (docs/parallel.md): opened before anything else, so that every rank agrees on
 * it before any work. Its size must be the program's parallel.data, or 1 (then the data ranks run
 * in this one process, in turn). Only rank 0 prints the run's lines and writes --log: the others'
 * standard output goes to /dev/null and their errors name their rank. *agreed is set for a failure
 * every rank sees alike (the world's size): rank 0 alone says why, and no rank aborts the others. */
RtStatus rt_train_world(RtTrainRun *r, char *prog, size_t nprog, int *agreed) {
    double timeout;
    RtStatus st = rt_comm_timeout_env(&timeout, &r->e);
    if (st == RT_OK) st = rt_comm_open(&r->comm, timeout, &r->e);
    if (st != RT_OK) return st;
    int size = rt_comm_size(r->comm), rank = rt_comm_rank(r->comm);
    long long dr = (long long)r->p->train.data_ranks;
    if (rank > 0) {
        snprintf(prog, nprog, "%s (rank %d)", r->o.prog, rank);
        r->o.prog = prog;
        r->o.log_path = NULL; /* rank 0 writes the run's files: the ranks hold the same weights */
        r->o.save_weights = NULL;
        r->o.dump_step = NULL;
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout)) return rt_fail_errno(&r->e, errno, "rank %d: cannot quiet standard output", rank);
    }
    if (size > 1 && size != dr) {
        *agreed = 1;
        return rt_fail(&r->e, RT_ERR_ARG, "this program trains with parallel.data = %lld rank%s; %s started %d (%s)", dr,
                       dr == 1 ? "" : "s", rt_comm_launcher(r->comm), size,
                       dr == 1 ? "run it alone, without a launcher" : "start as many processes as parallel.data");
    }
    r->rank = rank, r->nranks = size;
    rt_gpu_bind_local_rank(rt_comm_local_rank(r->comm)); /* one GPU a rank on a machine */
    return RT_OK;
}
