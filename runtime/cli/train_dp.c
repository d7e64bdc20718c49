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
/* ZeRO-2's: the range has its last addition of the micro-batch under way (every micro-batch's). */
static void rt_train_zgrad_ready(void *ctx, int64_t lo, int64_t hi) { rt_dp_reduce_ready(((RtTrainRun *)ctx)->zbuckets, lo, hi); }

/* The bucket's elements made this rank's final sum, on the communication thread: the local
 * tree's additions after the last micro-batch, over [lo, hi). */
void rt_train_fold(void *ctx, int64_t lo, int64_t hi) {
    RtTrainRun *r = ctx;
    rt_exec_tree_fold_range(&r->x, &r->fold_tree, lo, hi);
}

/* MBT_DP_OVERLAP (1, the default, or 0) into *on. */
static RtStatus rt_train_overlap_env(RtTrainRun *r, int *on) {
    const char *s = getenv("MBT_DP_OVERLAP");
    *on = 1;
    if (s && *s) {
        if (strcmp(s, "0") && strcmp(s, "1"))
            return rt_fail(&r->e, RT_ERR_ARG, "MBT_DP_OVERLAP is '%s': it must be 1 (the default) or 0", s);
        *on = s[0] == '1';
    }
    return RT_OK;
}

/* MBT_DP_OVERLAP (1, the default, or 0): whether the buckets start during the backward of the
 * step's last micro-batch. Without NCCL the GPU keeps the reduction after the backward: it stages
 * the whole gradient through the host (with NCCL, rt_train_gpu_buckets_open). A bucket is ready
 * once every parameter's range in it was announced (a parameter whose gradient the program never
 * writes, a zero gradient, holds its bucket until the backward ends). */
/* The parameters' gradient ranges: what the backward writes, each range announced once a
 * micro-batch (rt_grad_ready). */
static RtStatus rt_train_expect(RtTrainRun *r, RtDpReduce *d) {
    const RtProgram *p = r->p;
    int64_t *lo = malloc((size_t)(p->nparams + 1) * sizeof *lo), *hi = malloc((size_t)(p->nparams + 1) * sizeof *hi);
    if (!lo || !hi) {
        free(lo), free(hi);
        return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the parameters' ranges");
    }
    for (int64_t i = 0; i < p->nparams; i++) lo[i] = p->params[i].offset, hi[i] = p->params[i].offset + p->params[i].numel;
    rt_dp_reduce_expect(d, lo, hi, (int)p->nparams);
    free(lo), free(hi);
    return RT_OK;
}

static RtStatus rt_train_overlap_open(RtTrainRun *r) {
    RtStatus st = rt_train_overlap_env(r, &r->overlap);
    if (st != RT_OK) return st;
    if (r->x.gpu) r->overlap = 0;
    if (!r->overlap) return RT_OK;
    st = rt_train_expect(r, r->buckets);
    if (st != RT_OK) return st;
    r->hook = (RtGradHook){rt_train_grad_ready, r};
    return RT_OK;
}

/* ZeRO-2's buckets by shard, overlapped with every micro-batch's backward (docs/parallel.md,
 * "ZeRO-2's buckets overlapped with each backward"): on the CPU, zero = 2 with the partial sums
 * by shard, more than one bucket and MBT_DP_OVERLAP=1. Not ZeRO-3: its parameter gathers run
 * collectives on the same communicator during the backward (zero3.c's thread), and two threads'
 * collectives on one communicator would not match across the ranks. Not the GPU (the staged path
 * downloads the gradient whole; over NCCL the exchange is whole after the backward: not built). */
static RtStatus rt_train_zbuckets_open(RtTrainRun *r) {
    int on;
    RtStatus st = rt_train_overlap_env(r, &on);
    if (st != RT_OK || !on || !r->shard_tree_on || r->zero != 2 || r->x.gpu || r->p->param_floats <= r->bucket_floats) return st;
    st = rt_dp_reduce_open_shards(&r->zbuckets, r->comm, r->p->param_floats, r->bucket_floats, r->shard_off, &r->e);
    if (st == RT_OK) st = rt_train_expect(r, r->zbuckets);
    r->zhook = (RtGradHook){rt_train_zgrad_ready, r};
    /* For tests only (tests/exec/zero2.mbt's control): MBT_TEST_DROP_JOIN=1 leaves the join out, so
     * that the next micro-batch's reduction begins under the one before; it must be caught */
    const char *drop = getenv("MBT_TEST_DROP_JOIN");
    r->test_drop_join = drop && !strcmp(drop, "1");
    return st;
}

/* ---- the GPU's buckets overlapped with the backward (docs/parallel.md, "The GPU's buckets") ----
 *
 * With NCCL, zero < 2 and more than one bucket. The buckets are the CPU's (dp_reduce.c: bucket 0
 * the last elements, each cut into 64-byte shard pieces) and are taken in the same order, bucket 0
 * first, on every rank. During the step's last micro-batch the generated forward_backward calls
 * rt_grad_ready right after queuing each gradient's add on the compute stream; the hook counts the
 * bucket's elements, and each time the next bucket in order is complete it queues, on the
 * communication stream after an event of the compute stream (rt_gpu_comm_fork): the local tree's
 * last additions over the bucket's range (the ones rt_exec_tree_push and _finish would make after
 * the leaf), its NCCL exchange, the tree over the ranks (rt_gpu_axpy, rt_dp_tree_walk's order),
 * the copy of the sum into place and its NCCL gather. Nothing waits on the host: NCCL's calls
 * return once NCCL has taken the group (rt_comm_nccl_queue_only). After the backward
 * rt_train_reduce queues what is left, makes the compute stream wait for the communication
 * stream's last event (rt_gpu_comm_join) and waits, against the timeout, for both
 * (rt_comm_nccl_settle). Every element gets the additions of the reduction after the backward in
 * the same order: the same bits. The communication stream's order lets every bucket use one
 * buffer for the ranks' copies of its shard. */
struct RtGpuBuckets {
    int nbuckets, next;
    int64_t most;   /* the largest shard of any bucket on this rank */
    int64_t *off;   /* bucket b's shard boundaries, absolute: off[b x (nranks + 1) + k] */
    int64_t *rel;   /* one bucket's, from its start (the collectives see the bucket as a vector) */
    int64_t *ready; /* this run's: bucket b's elements announced so far */
    int64_t *need;  /* the elements of bucket b the backward writes (the parameters' ranges in it) */
    float *d_got;   /* every rank's copy of this rank's shard of one bucket, on the device */
    RtTree tree;    /* the step's tree before the last leaf: what each bucket's fold completes */
    int active;     /* between rt_train_gpu_buckets_begin and the join */
    int shards;     /* ZeRO-2's buckets by shard: cut at the ZeRO shards, every micro-batch's, no fold, no gather */
    RtStatus st;    /* the first failure while queuing (the hook cannot return it), with e */
    RtError e;
    int64_t runs, seen, queued_before; /* over the run: reductions, buckets, those queued during the backward */
    double wait_s, queue_s;            /* the step's wait at the join; the hook's time queuing */
};
typedef struct RtGpuBuckets RtGpuBuckets;

static void rt_gpu_buckets_free(RtGpuBuckets *b, RtGpu *g) {
    if (!b) return;
    if (b->d_got) rt_gpu_free(g, b->d_got);
    free(b->off), free(b->rel), free(b->ready), free(b->need);
    free(b);
}

/* The local tree's additions after the last leaf over [lo, hi) of the GPU's partial sums, queued
 * (rt_exec_tree_fold_range's, with rt_gpu_axpy: scale 1 adds as a + b, rounded once). */
static RtStatus rt_gpu_tree_fold_range(RtTrainRun *r, const RtTree *t0, int64_t lo, int64_t hi) {
    RtExec *x = &r->x;
    RtTree t = *t0;
    int64_t n = hi - lo;
    RtStatus st = RT_OK;
    if (n <= 0) return RT_OK;
    t.size[t.depth++] = 1;
    while (st == RT_OK && t.depth >= 2 && t.size[t.depth - 1] == t.size[t.depth - 2]) {
        st = rt_gpu_axpy(x->gpu, x->tree[t.depth - 2] + lo, x->tree[t.depth - 1] + lo, 1.0f, n, &r->e);
        t.size[t.depth - 2] *= 2, t.depth--;
    }
    while (st == RT_OK && t.depth >= 2) {
        st = rt_gpu_axpy(x->gpu, x->tree[t.depth - 2] + lo, x->tree[t.depth - 1] + lo, 1.0f, n, &r->e);
        t.size[t.depth - 2] += t.size[t.depth - 1], t.depth--;
    }
    return st;
}

typedef struct {
    RtTrainRun *r;
    float *got;
    int64_t len;
    RtStatus st;
} RtGpuTree;

static void rt_gpu_tree_add(void *ctx, int a, int b) {
    RtGpuTree *t = ctx;
    if (t->st == RT_OK && t->len > 0)
        t->st = rt_gpu_axpy(t->r->x.gpu, t->got + a * t->len, t->got + b * t->len, 1.0f, t->len, &t->r->e);
}

/* ZeRO-2's partial sums by shard on the device (RtShardTree's operations over NCCL). */
static RtStatus rt_gpu_shard_add(void *ctx, float *dst, const float *src, int64_t n, RtError *err) {
    return n > 0 ? rt_gpu_axpy(((RtTrainRun *)ctx)->x.gpu, dst, src, 1.0f, n, err) : RT_OK;
}
static RtStatus rt_gpu_shard_copy(void *ctx, float *dst, const float *src, int64_t n, RtError *err) {
    return n > 0 ? rt_gpu_copy(((RtTrainRun *)ctx)->x.gpu, dst, src, n * (int64_t)sizeof(float), err) : RT_OK;
}

/* Bucket k's reduction queued on the communication stream (which already waits for the compute
 * stream's event after the bucket's last add). */
static RtStatus rt_gpu_bucket_queue(RtTrainRun *r, int k) {
    RtGpuBuckets *b = r->gbuckets;
    RtGpu *g = r->x.gpu;
    const int64_t *o = b->off + (int64_t)k * (r->nranks + 1);
    int64_t lo = o[0], mine = o[r->rank], len = o[r->rank + 1] - mine;
    for (int j = 0; j <= r->nranks; j++) b->rel[j] = o[j] - lo;
    rt_gpu_comm_enter(g);
    rt_comm_nccl_queue_only(r->comm, 1);
    RtStatus st = b->shards ? RT_OK : rt_gpu_tree_fold_range(r, &b->tree, lo, o[r->nranks]);
    if (st == RT_OK) st = rt_comm_exchange_shards(r->comm, r->x.d_grads + lo, b->rel, b->d_got, &r->e);
    RtGpuTree t = {r, b->d_got, len, st};
    if (st == RT_OK) rt_dp_tree_walk(r->nranks, rt_gpu_tree_add, &t);
    st = t.st;
    if (st == RT_OK && len > 0) st = rt_gpu_copy(g, r->x.d_grads + mine, b->d_got, len * (int64_t)sizeof(float), &r->e);
    /* ZeRO-2 keeps its shard: the piece summed in place is this rank's of the block sum */
    if (st == RT_OK && !b->shards) st = rt_comm_gather_shards(r->comm, r->x.d_grads + lo, b->rel, &r->e);
    rt_comm_nccl_queue_only(r->comm, 0);
    rt_gpu_comm_leave(g);
    return st == RT_OK ? st : rt_error_context(&r->e, "the gradient's bucket %d", k);
}

/* Queues every bucket, in order, that is complete (all of them with all set), after one event of
 * the compute stream; the run's first failure is kept (the hook cannot return it). */
static void rt_gpu_buckets_take(RtTrainRun *r, int all) {
    RtGpuBuckets *b = r->gbuckets;
    if (b->st != RT_OK || b->next >= b->nbuckets || !(all || b->ready[b->next] >= b->need[b->next])) return;
    double t0 = rt_now();
    RtStatus st = rt_gpu_comm_fork(r->x.gpu, &r->e);
    while (st == RT_OK && b->next < b->nbuckets && (all || b->ready[b->next] >= b->need[b->next])) {
        st = rt_gpu_bucket_queue(r, b->next++);
        if (!all) b->queued_before++;
    }
    if (st != RT_OK) b->st = st, b->e = r->e;
    b->queue_s += rt_now() - t0;
}

/* rt_grad_ready's hook on the GPU: elements [lo, hi) of the last micro-batch's gradient have their
 * add queued on the compute stream. */
static void rt_train_gpu_ready(void *ctx, int64_t lo, int64_t hi) {
    RtTrainRun *r = ctx;
    RtGpuBuckets *b = r->gbuckets;
    if (!b->active) return;
    for (int k = 0; k < b->nbuckets; k++) { /* few buckets: a scan */
        const int64_t *o = b->off + (int64_t)k * (r->nranks + 1);
        int64_t a = lo > o[0] ? lo : o[0], z = hi < o[r->nranks] ? hi : o[r->nranks];
        if (z > a) b->ready[k] += z - a;
    }
    rt_gpu_buckets_take(r, 0);
}

RtStatus rt_train_gpu_buckets_begin(RtTrainRun *r, const RtTree *tree) {
    RtGpuBuckets *b = r->gbuckets;
    if (b->active) /* the reduction before was never joined: its buckets may still read d_grads */
        return rt_fail(&r->e, RT_ERR_ARG,
                       "the GPU's gradient buckets: a reduction began while the one before was not joined: its vector "
                       "would be overwritten under it");
    b->tree = *tree, b->next = 0, b->active = 1, b->st = RT_OK;
    for (int k = 0; k < b->nbuckets; k++) b->ready[k] = 0;
    return RT_OK;
}

/* After the backward: the buckets left queued (a bucket whose gradient the backward never writes
 * all of waits for this), the compute stream joined to the communication stream, and both waited
 * for against the world's timeout. */
static RtStatus rt_train_gpu_buckets_finish(RtTrainRun *r) {
    RtGpuBuckets *b = r->gbuckets;
    if (!b->active) return rt_fail(&r->e, RT_ERR_ARG, "the GPU's buckets: the micro-batch did not start them");
    double t0 = rt_now();
    rt_gpu_buckets_take(r, 1);
    b->active = 0;
    b->runs++, b->seen += b->nbuckets;
    RtStatus st = b->st;
    if (st != RT_OK) r->e = b->e;
    /* joined even after a failure, so that the update never runs before what was queued */
    RtStatus jst = rt_gpu_comm_join(r->x.gpu, st == RT_OK ? &r->e : &b->e);
    if (st == RT_OK) st = jst;
    if (st == RT_OK) st = rt_comm_nccl_settle(r->comm, "collectives: the buckets' reductions over NCCL", &r->e);
    b->wait_s += rt_now() - t0;
    return st;
}

/* With NCCL, zero < 2 and more than one bucket: the buckets (MBT_DP_OVERLAP=1, the default). With
 * shards, ZeRO-2's (docs/parallel.md, "ZeRO-2's buckets overlapped with each backward"): cut at the
 * ZeRO shards, begun for every micro-batch and joined after each (rt_train_shard_push). */
static RtStatus rt_train_gpu_buckets_open(RtTrainRun *r, int shards) {
    int on;
    RtStatus st = rt_train_overlap_env(r, &on);
    if (st != RT_OK || !on) return st;
    const RtProgram *p = r->p;
    int64_t n = p->param_floats, bf = r->bucket_floats;
    int size = r->nranks;
    RtGpuBuckets *b = calloc(1, sizeof *b);
    if (!b) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's buckets");
    b->nbuckets = (int)((n + bf - 1) / bf);
    b->off = calloc((size_t)b->nbuckets * (size + 1) + 1, sizeof *b->off);
    b->rel = calloc((size_t)size + 1, sizeof *b->rel);
    b->ready = calloc((size_t)b->nbuckets + 1, sizeof *b->ready);
    b->need = calloc((size_t)b->nbuckets + 1, sizeof *b->need);
    if (!b->off || !b->rel || !b->ready || !b->need) {
        rt_gpu_buckets_free(b, r->x.gpu);
        return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's buckets");
    }
    for (int k = 0; k < b->nbuckets; k++) { /* as dp_reduce.c's: bucket 0 holds the last elements */
        int64_t hi = n - (int64_t)k * bf, lo = hi - bf < 0 ? 0 : hi - bf;
        int64_t *o = b->off + (int64_t)k * (size + 1);
        if (shards) /* piece j: the bucket's elements in ZeRO shard j (dp_reduce.c's open_shards) */
            for (int j = 0; j <= size; j++) o[j] = r->shard_off[j] < lo ? lo : r->shard_off[j] > hi ? hi : r->shard_off[j];
        else {
            rt_comm_shards(hi - lo, size, 16, o);
            for (int j = 0; j <= size; j++) o[j] += lo;
        }
        if (o[r->rank + 1] - o[r->rank] > b->most) b->most = o[r->rank + 1] - o[r->rank];
        for (int64_t i = 0; i < p->nparams; i++) { /* the elements the backward writes */
            int64_t a = p->params[i].offset, z = a + p->params[i].numel;
            a = a > lo ? a : lo, z = z < hi ? z : hi;
            if (z > a) b->need[k] += z - a;
        }
    }
    st = rt_gpu_alloc(r->x.gpu, (void **)&b->d_got, (b->most * size + 1) * (int64_t)sizeof(float),
                      "every rank's copy of this rank's shard of a gradient bucket", &r->e);
    if (st == RT_OK) st = rt_gpu_comm_open(r->x.gpu, &r->e);
    if (st != RT_OK) {
        rt_gpu_buckets_free(b, r->x.gpu);
        return st;
    }
    r->gbuckets = b, r->gbuckets_n = b->nbuckets;
    b->shards = shards;
    if (shards) { /* every micro-batch's hook (train.c), not the last one's overlap */
        r->gzbuckets = 1;
        r->zhook = (RtGradHook){rt_train_gpu_ready, r};
        r->gz_recv_bytes = b->most * size * (int64_t)sizeof(float);
        const char *drop = getenv("MBT_TEST_DROP_JOIN");
        r->test_drop_join = drop && !strcmp(drop, "1");
        return RT_OK;
    }
    r->overlap = 1;
    r->hook = (RtGradHook){rt_train_gpu_ready, r};
    return RT_OK;
}

void rt_train_gpu_buckets_print(const RtTrainRun *r, FILE *f, const char *prefix) {
    const RtGpuBuckets *b = r->gbuckets;
    if (!b || b->runs == 0) return;
    fprintf(f,
            "%sbuckets: %d of at most %lld floats, %lld reductions on the GPU's communication stream (NCCL): the backward's "
            "hook spent %.3f ms queuing them, the step waited %.3f ms at the join after the backward\n",
            prefix, b->nbuckets, (long long)r->bucket_floats, (long long)b->runs, 1e3 * b->queue_s, 1e3 * b->wait_s);
    fprintf(f,
            "%sbuckets overlapped with the backward in %lld reductions: %lld of %lld buckets queued on the communication "
            "stream before the backward ended (each after an event of the compute stream)\n",
            prefix, (long long)b->runs, (long long)b->queued_before, (long long)b->seen);
}

void rt_train_gpu_buckets_close(RtTrainRun *r) {
    RtGpuBuckets *b = r->gbuckets;
    if (!b) return;
    RtError e;
    /* the communication stream's work done before NCCL's communicator and the buffers go (after a
     * step's join nothing is left; after a failure in the middle of one, bounded by the timeout) */
    if (rt_gpu_comm_join(r->x.gpu, &e) == RT_OK) rt_comm_nccl_settle(r->comm, "the buckets' reductions", &e);
    rt_gpu_buckets_free(b, r->x.gpu);
    r->gbuckets = NULL;
}

/* The step's tree of partial sums and the micro-batches' losses, for the largest accumulation of
 * the batch ramp. */
RtStatus rt_train_tree_alloc(RtTrainRun *r) {
    const RtTrainSettings *t = &r->p->train;
    int64_t accum = t->accum;
    for (int64_t i = 0; i < t->nramp; i++)
        if (t->ramp[i].accum > accum) accum = t->ramp[i].accum;
    accum = accum * t->data_ranks / r->nranks; /* this process's micro-batches a step, at most */
    /* ZeRO-2's partial sums by shard (docs/parallel.md): with N ranks, N a power of two. Every step
     * of 2 or more micro-batches a rank then takes that path, so the whole-size tree needs the
     * gradient region alone (a step of one micro-batch a rank has one leaf). */
    r->shard_tree_on = r->nranks > 1 && t->zero >= 2 && (r->nranks & (r->nranks - 1)) == 0;
    RtStatus st = rt_exec_tree_open(&r->x, r->shard_tree_on ? 1 : accum, &r->e);
    if (st != RT_OK) return st;
    r->micro_loss = calloc((size_t)accum + 1, sizeof *r->micro_loss);
    r->all_loss = calloc((size_t)((accum + 1) * r->nranks), sizeof *r->all_loss);
    r->loss_order = calloc((size_t)(accum * r->nranks) + 1, sizeof *r->loss_order);
    if (!r->micro_loss || !r->all_loss || !r->loss_order)
        return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the micro-batches' losses");
    st = rt_dp_bucket_env(&r->bucket_floats, &r->e);
    if (st == RT_OK) st = rt_dp_model_env(&r->model_gbps, &r->e);
    if (st != RT_OK || r->nranks == 1) return st;
    r->shard_off = calloc((size_t)r->nranks + 1, sizeof *r->shard_off);
    if (!r->shard_off) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's shards");
    rt_comm_shards(r->p->param_floats, r->nranks, RT_SHARD_ALIGN, r->shard_off);
    int even = 1; /* the parameter casts' region (2 bytes an element) cut at the same elements */
    for (int k = 0; k <= r->nranks; k++) even &= r->shard_off[k] % 2 == 0;
    if (r->p->pcast_bytes > 0 && even && r->p->pcast_bytes == r->p->param_floats * 2) {
        r->pcast_off = calloc((size_t)r->nranks + 1, sizeof *r->pcast_off);
        if (!r->pcast_off) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the parameter casts' shards");
        for (int k = 0; k <= r->nranks; k++) r->pcast_off[k] = r->shard_off[k] / 2;
    }
    int64_t len = r->shard_off[r->rank + 1] - r->shard_off[r->rank];
    r->zero = (int)t->zero;
    st = rt_train_zbuckets_open(r);
    if (st != RT_OK) return st;
    /* the whole exchange's receive buffer: every rank's copy of this rank's shard (not with
     * ZeRO-2's buckets, whose receive buffer is a bucket's) */
    if (!r->zbuckets) {
        r->shard_got = calloc((size_t)(len * r->nranks) + 1, sizeof *r->shard_got);
        if (!r->shard_got) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's shards");
    }
    int gz = 0;     /* ZeRO-2's buckets on the GPU's communication stream (over NCCL) */
    if (r->x.gpu) { /* NCCL between the GPUs when it is there: the sum then stays on the device */
        st = rt_comm_set_gpu(r->comm, r->x.gpu, &r->e);
        int on = 0;
        if (st == RT_OK) st = rt_train_overlap_env(r, &on);
        gz = st == RT_OK && on && rt_comm_nccl(r->comm) && r->shard_tree_on && r->zero == 2 &&
             r->p->param_floats > r->bucket_floats;
        r->nccl_grads = st == RT_OK && rt_comm_nccl(r->comm);
        /* (with ZeRO-2's buckets the whole exchange never runs: no buffer for it) */
        if (r->nccl_grads && !gz)
            st = rt_gpu_alloc(r->x.gpu, (void **)&r->d_shard_got, (len * r->nranks + 1) * (int64_t)sizeof(float),
                              "every rank's copy of this rank's gradient shard", &r->e);
        /* without NCCL the ranks' sum runs on host copies that rt_train_reduce makes itself (one
         * download, the buckets, one upload): the collectives then take host buffers */
        else if (st == RT_OK && !r->nccl_grads) st = rt_comm_set_gpu(r->comm, NULL, &r->e);
        if (st != RT_OK) return st;
    }
    /* floor(log2 accum) partial sums of the shard's size: on the device over NCCL, else in host
     * memory (the CPU's, or the staged GPU's, whose micro-batch gradients come down) */
    if (r->shard_tree_on && r->nccl_grads) {
        int need = rt_shard_tree_regions(accum);
        if (need < 0)
            return rt_fail(&r->e, RT_ERR_ARG, "%lld micro-batches a step are more than the gradient tree holds",
                           (long long)accum);
        r->shard_ops = (RtShardOps){rt_gpu_shard_add, rt_gpu_shard_copy, r};
        r->shard_tree.len = len, r->shard_tree.ops = &r->shard_ops;
        for (; r->shard_tree.nreg < need; r->shard_tree.nreg++) {
            st = rt_gpu_alloc(r->x.gpu, (void **)&r->shard_tree.reg[r->shard_tree.nreg], (len + 1) * (int64_t)sizeof(float),
                              "a partial sum of the gradient's shard", &r->e);
            if (st != RT_OK) return st;
        }
    } else if (r->shard_tree_on) {
        st = rt_shard_tree_open(&r->shard_tree, len, accum, r->x.pool, &r->e);
        if (st != RT_OK) return st;
    }
    /* the reduction in buckets by a thread (not with ZeRO-2, whose rank keeps its shard of the
     * whole vector alone; nor for one bucket, where the thread would only add a hand-over; nor over
     * NCCL, which sums on the device after the backward) */
    if (r->zero < 2 && r->p->param_floats > r->bucket_floats && !r->nccl_grads) {
        st = rt_dp_reduce_open(&r->buckets, r->comm, r->x.pool, r->p->param_floats, r->bucket_floats, &r->e);
        if (st != RT_OK) return st;
        st = rt_train_overlap_open(r);
        if (st != RT_OK) return st;
    }
    /* over NCCL: the GPU's buckets on a communication stream, overlapped with the backward (with
     * MBT_DP_OVERLAP=0, or ZeRO-2, or one bucket, the sum after the backward, whole) */
    if (r->zero < 2 && r->p->param_floats > r->bucket_floats && r->nccl_grads) {
        st = rt_train_gpu_buckets_open(r, 0);
        if (st != RT_OK) return st;
    }
    if (gz) {
        st = rt_train_gpu_buckets_open(r, 1);
        if (st != RT_OK) return st;
    }
    if (r->zero == 3) { /* the parameters' shard: the rest is released before the first step */
        if (r->x.gpu) { /* the device's region (the host keeps its whole copy) */
            st = rt_zero3_open_gpu(&r->zero3, r->comm, r->x.gpu, r->x.params, &r->x.d_params, r->p->param_floats, r->shard_off,
                                   &r->e);
            r->x.d_param_lo = r->shard_off[r->rank], r->x.d_param_hi = r->shard_off[r->rank + 1];
        } else {
            st = rt_zero3_open(&r->zero3, r->comm, &r->x.params, r->p->param_floats, r->shard_off, &r->e);
        }
        if (st != RT_OK) return st;
        /* the plan grouped its gathers and bounds their memory in pages of its target's size: the
         * GPU's must be that (a granularity the plan did not assume breaks both), the CPU's must
         * divide it (its bound in larger pages still holds) */
        int64_t page = rt_zero3_page(r->zero3), planned = r->p->plan.gather_page;
        if (planned > 0 && (rt_zero3_on_gpu(r->zero3) ? page != planned : planned % page != 0))
            return rt_fail(&r->e, RT_ERR_ARG,
                           "ZeRO-3: the program's gathers were planned for pages of %lld bytes, and this %s's %s is %lld bytes: "
                           "rebuild it with mbtc --zero3-page=%lld",
                           (long long)planned, rt_zero3_on_gpu(r->zero3) ? "GPU" : "machine",
                           rt_zero3_on_gpu(r->zero3) ? "allocation granularity (cuMemGetAllocationGranularity)" : "page size",
                           (long long)page, (long long)page);
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
/* The GPU's sum over NCCL: the shards exchanged GPU to GPU, summed on the device in the same tree
 * (rt_dp_tree_walk; rt_gpu_axpy with scale 1 adds as the host does, bit for bit), gathered back. */
static RtStatus rt_train_reduce_nccl(RtTrainRun *r, int64_t step) {
    RtExec *x = &r->x;
    int64_t lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    RtGpuTree t = {r, r->d_shard_got, len, rt_comm_exchange_shards(r->comm, x->d_grads, r->shard_off, r->d_shard_got, &r->e)};
    rt_dp_tree_walk(r->nranks, rt_gpu_tree_add, &t);
    RtStatus st = t.st;
    if (st == RT_OK && len > 0) st = rt_gpu_copy(x->gpu, x->d_grads + lo, r->d_shard_got, len * (int64_t)sizeof(float), &r->e);
    /* ZeRO-2 keeps its shard of the summed gradient alone (as rt_train_reduce's host path) */
    if (st == RT_OK && (r->zero < 2 || (r->given->dump_step && step == 0)))
        st = rt_comm_gather_shards(r->comm, x->d_grads, r->shard_off, &r->e);
    return st;
}

RtStatus rt_train_shard_push(RtTrainRun *r, int64_t m, int64_t accum, int64_t step) {
    RtExec *x = &r->x;
    int64_t lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    int last = m + 1 == accum;
    const float *sum = NULL;
    RtStatus st = RT_OK;
    if (r->gzbuckets) {
        /* ZeRO-2's buckets on the communication stream: the join (the compute stream waits for the
         * last bucket, then both are waited for); d_grads' shard is then the block sum, pushed
         * before the region is zeroed for the next micro-batch */
        if (!r->test_drop_join) st = rt_train_gpu_buckets_finish(r);
        if (st == RT_OK) st = rt_shard_tree_push(&r->shard_tree, x->d_grads + lo, last, &sum, &r->e);
        if (st == RT_OK && last && len > 0 && sum != x->d_grads + lo)
            st = rt_gpu_copy(x->gpu, x->d_grads + lo, sum, len * (int64_t)sizeof(float), &r->e);
    } else if (r->nccl_grads) { /* NCCL: GPU to GPU, the sums on the device (rt_gpu_axpy with scale 1 adds as the host) */
        RtGpuTree t = {r, r->d_shard_got, len, rt_comm_exchange_shards(r->comm, x->d_grads, r->shard_off, r->d_shard_got, &r->e)};
        if (t.st == RT_OK) rt_dp_tree_walk(r->nranks, rt_gpu_tree_add, &t);
        st = t.st;
        if (st == RT_OK) st = rt_shard_tree_push(&r->shard_tree, r->d_shard_got, last, &sum, &r->e);
        if (st == RT_OK && last && len > 0) st = rt_gpu_copy(x->gpu, x->d_grads + lo, sum, len * (int64_t)sizeof(float), &r->e);
    } else if (r->zbuckets) {
        /* the join: the buckets exchanged and summed during the backward, the last ones now; only
         * then is the gradient region's shard the block's sum, and may the region be zeroed for
         * the next micro-batch (after the push has read it) */
        if (!r->test_drop_join) st = rt_dp_reduce_finish(r->zbuckets, &r->e);
        if (st == RT_OK) st = rt_shard_tree_push(&r->shard_tree, x->grads + lo, last, &sum, &r->e);
        if (st == RT_OK && last && len > 0 && sum != x->grads + lo) memcpy(x->grads + lo, sum, (size_t)len * sizeof *x->grads);
    } else {
        /* the CPU, or the GPU staged through the host (the micro-batch's gradient downloaded) */
        st = rt_exec_pull(x, RT_PULL_GRADS, &r->e);
        /* every rank's gradient of global micro-batches m x N .. m x N + N - 1 (rank order), shard r */
        if (st == RT_OK) st = rt_comm_exchange_shards(r->comm, x->grads, r->shard_off, r->shard_got, &r->e);
        /* the block of N micro-batches (N a power of two: a node of the step's tree), then the
         * counter over the step's blocks */
        if (st == RT_OK) rt_dp_tree_sum_f32(x->pool, r->shard_got, r->nranks, len);
        if (st == RT_OK) st = rt_shard_tree_push(&r->shard_tree, r->shard_got, last, &sum, &r->e);
        if (st == RT_OK && last && len > 0) {
            memcpy(x->grads + lo, sum, (size_t)len * sizeof *x->grads);
            if (x->gpu) st = rt_gpu_upload(x->gpu, x->d_grads + lo, x->grads + lo, len * (int64_t)sizeof(float), &r->e);
        }
    }
    if (st == RT_OK && !last) st = rt_exec_grad_zero(x, &r->e); /* the next micro-batch's leaf */
    return st == RT_OK
               ? st
               : rt_error_context(&r->e, "step %lld, micro-batches %lld to %lld: the gradient's shard summed over the ranks",
                                  (long long)(step + 1), (long long)(m * r->nranks + 1), (long long)((m + 1) * r->nranks));
}

RtStatus rt_train_reduce(RtTrainRun *r, int64_t step) {
    if (r->nranks == 1) return RT_OK;
    RtExec *x = &r->x;
    if (r->interleaved) { /* summed by shard as the micro-batches came; --dump-step's step 1 writes all of it */
        RtStatus st = RT_OK;
        if (r->given->dump_step && step == 0) {
            if (r->nccl_grads) st = rt_comm_gather_shards(r->comm, x->d_grads, r->shard_off, &r->e);
            else st = rt_comm_gather_shards(r->comm, x->grads, r->shard_off, &r->e);
            if (st == RT_OK && x->gpu && !r->nccl_grads)
                st = rt_gpu_upload(x->gpu, x->d_grads, x->grads, r->p->param_floats * 4, &r->e);
        }
        return st == RT_OK ? st : rt_error_context(&r->e, "step %lld: gathering the gradient to dump", (long long)(step + 1));
    }
    if (r->gbuckets) { /* queued during the last backward: the rest, and the join */
        RtStatus st = rt_train_gpu_buckets_finish(r);
        return st == RT_OK ? st
                           : rt_error_context(&r->e, "step %lld: summing the gradient over the ranks (NCCL, in buckets)",
                                              (long long)(step + 1));
    }
    if (r->nccl_grads) {
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
static RtStatus rt_train_gather_f32(RtTrainRun *r) {
    RtExec *x = &r->x;
    if (!x->gpu) return rt_comm_gather_shards(r->comm, x->params, r->shard_off, &r->e);
    if (r->nccl_grads) return rt_comm_gather_shards(r->comm, x->d_params, r->shard_off, &r->e);
    int64_t n = r->p->param_floats;
    /* (after the host's update, offload { optimizer }, the host holds the updated shard already) */
    RtStatus st = r->host_params_current ? RT_OK : rt_exec_pull(x, RT_PULL_PARAMS, &r->e);
    r->host_params_current = 0;
    if (st == RT_OK) st = rt_comm_gather_shards(r->comm, x->params, r->shard_off, &r->e);
    if (st == RT_OK) st = rt_gpu_upload(x->gpu, x->d_params, x->params, n * 4, &r->e);
    return st;
}

/* A bf16 program's shard update also wrote its shard's parameter casts (docs/memory.md, "The
 * parameter casts' region"): the others' come with the same gather, as f32 pairs (bytes moved as
 * they are), in the CPU's region or, with NCCL, the device's; then the region is current and the
 * next step's first micro-batch need not cast (r->pcasts_gathered). Without NCCL on the GPU it is
 * not gathered (the step casts). */
RtStatus rt_train_gather_params(RtTrainRun *r) {
    RtExec *x = &r->x;
    RtStatus st = rt_train_gather_f32(r);
    void *casts = !r->pcast_off ? NULL : !x->gpu ? x->pcasts : r->nccl_grads ? x->d_pcasts : NULL;
    if (st == RT_OK && casts) {
        st = rt_comm_gather_shards(r->comm, casts, r->pcast_off, &r->e);
        r->pcasts_gathered = st == RT_OK;
    }
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
