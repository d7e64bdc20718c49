/* train_step.c - one optimizer step of the train loop (train.c's rt_train_loop calls rt_train_step):
 * the step's micro-batches (the statistics pass first when the program has global_mean statistics),
 * the gradient's tree over them, the ranks' reduction (train_dp.c), the step's loss, the gradient
 * norm and clipping, the update (on the device, or the host's with offload { optimizer }) and, at
 * step 1 with --dump-step, the dump. docs/runtime.md, "The train loop"; docs/parallel.md for the
 * ranks' side.
 *
 * train.c keeps the run around the steps: its memory, its start, banner, logs, evaluations,
 * checkpoints and end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

/* v[0, n) summed in place by the step's tree (rt_exec.h, RtTree): a binary counter over the
 * indices, the older sum on the left, and what is left folded from the right. The sum is in v[0].
 * The gradient's regions (rt_exec_tree_*), the ranks' shards (rt_train_reduce) and the step's loss
 * are all summed by this one shape, so each is a function of the number of micro-batches alone. */
static double rt_tree_sum_f64(double *v, int64_t n) {
    int64_t at[RT_TREE_MAX + 1], size[RT_TREE_MAX + 1];
    int d = 0;
    for (int64_t i = 0; i < n; i++) {
        at[d] = i, size[d++] = 1;
        while (d >= 2 && size[d - 1] == size[d - 2]) v[at[d - 2]] += v[at[d - 1]], size[d - 2] *= 2, d--;
    }
    while (d >= 2) v[at[d - 2]] += v[at[d - 1]], size[d - 2] += size[d - 1], d--;
    return n > 0 ? v[0] : 0;
}

/* ---- global_mean: the statistics pass (docs/runtime.md, "Statistics over the global batch") ---- */

/* The data moved to global micro-batch g of the step under way (the windows of the micro-batches
 * in between skipped: other ranks'), then one micro-batch read. */
static RtStatus rt_train_read_micro(RtTrainRun *r, int64_t g, int32_t *x, int32_t *y, RtError *err) {
    rt_data_skip(r->train, (g - r->data_at) * r->p->train.micro);
    r->data_at = g + 1;
    return rt_data_next(r->train, r->p->train.micro, x, y, err);
}

/* Reads this rank's accum micro-batches of the step (rt_train_global_micro: the global batch's
 * [first, first + accum), or every N-th from the rank's with the interleaved partial sums by
 * shard) into stat_x/stat_y, runs forward_stats on each, and sets the statistics to the mean over
 * all M = accum x ranks micro-batches of the step: every micro-batch's statistics are gathered
 * from the ranks (rt_comm_gather_f64, rank order), taken in micro-batch order
 * (rt_train_gathered_at), summed in double in that order, divided by M, stored as f32 (and
 * uploaded to the GPU) - the same numbers at any number of ranks. The step's forward and
 * backward then read the same micro-batches back (rt_train_read). Nothing without statistics. */
static RtStatus rt_train_stats(RtTrainRun *r, int64_t step, int64_t accum, int64_t M) {
    const RtProgram *p = r->p;
    int64_t sf = p->stat_floats;
    if (sf <= 0) return RT_OK;
    RtExec *x = &r->x;
    if (accum > r->stat_cap) {
        free(r->stat_x);
        free(r->stat_y);
        free(r->stat_mine);
        free(r->stat_all);
        r->stat_x = malloc((size_t)(accum * r->window) * sizeof *r->stat_x);
        r->stat_y = malloc((size_t)(accum * r->window) * sizeof *r->stat_y);
        r->stat_mine = malloc((size_t)(accum * sf) * sizeof *r->stat_mine);
        r->stat_all = malloc((size_t)(accum * r->nranks * sf) * sizeof *r->stat_all);
        r->stat_cap = r->stat_x && r->stat_y && r->stat_mine && r->stat_all ? accum : 0;
        if (!r->stat_cap) return rt_fail(&r->e, RT_ERR_NOMEM, "cannot allocate the step's %lld micro-batches", (long long)accum);
    }
    RtStatus st = RT_OK;
    for (int64_t m = 0; m < accum && st == RT_OK; m++) {
        int32_t *bx = r->stat_x + m * r->window, *by = r->stat_y + m * r->window;
        int64_t g = rt_train_global_micro(r, m, accum);
        st = rt_train_read_micro(r, g, bx, by, &r->e);
        if (st != RT_OK) break;
        memcpy(x->x, bx, (size_t)r->window * sizeof *bx);
        memcpy(x->y, by, (size_t)r->window * sizeof *by);
        st = rt_exec_batch(x, r->window, &r->e);
        RtStep s = rt_exec_step(x, &r->e);
        s.B = p->train.micro, s.T = p->train.seq, s.step = step, s.micro = g, s.seed = r->o.seed;
        s.training = 1; /* forward_backward's key: its dropout masks, training() = 1 */
        if (st == RT_OK) st = rt_exec_call(x, RT_EXEC_FORWARD_STATS, &s);
        if (r->zero3) { /* its gathers (the hook cannot return a failure) */
            RtStatus zs = rt_zero3_settle(r->zero3, st == RT_OK ? &r->e : NULL);
            if (st == RT_OK) st = zs;
        }
        if (st != RT_OK) {
            rt_error_context(&r->e, "step %lld, statistics of micro-batch %lld", (long long)(step + 1), (long long)(g + 1));
            break;
        }
        for (int64_t i = 0; i < sf; i++) r->stat_mine[m * sf + i] = (double)x->stats_out[i];
    }
    double *all = r->stat_mine;
    if (st == RT_OK && r->nranks > 1) {
        all = r->stat_all;
        st = rt_comm_gather_f64(r->comm, r->stat_mine, accum * sf, all, &r->e);
        if (st != RT_OK) rt_error_context(&r->e, "step %lld: gathering the statistics", (long long)(step + 1));
    }
    for (int64_t i = 0; st == RT_OK && i < sf; i++) {
        double sum = 0;
        for (int64_t g = 0; g < M; g++) sum += all[rt_train_gathered_at(r, g, accum) * sf + i];
        x->stats[i] = (float)(sum / (double)M);
    }
    if (st == RT_OK) st = rt_exec_stats(x, &r->e);
    return st;
}

/* Micro-batch m (of accum) of this rank's step: from the statistics pass's copy when there is
 * one, else the data. */
static RtStatus rt_train_read(RtTrainRun *r, int64_t m, int64_t accum, int32_t *x, int32_t *y, RtError *err) {
    if (r->p->stat_floats <= 0) return rt_train_read_micro(r, rt_train_global_micro(r, m, accum), x, y, err);
    memcpy(x, r->stat_x + m * r->window, (size_t)r->window * sizeof *x);
    memcpy(y, r->stat_y + m * r->window, (size_t)r->window * sizeof *y);
    return RT_OK;
}

/* This process's `accum` micro-batches of one step: forward and backward of each into the step's
 * tree of partial sums (rt_exec_tree_*), so that afterwards the gradient region holds their sum;
 * each one's loss goes to r->micro_loss. The global batch is M = accum x nranks micro-batches,
 * numbered in the order of the data; rank r computes [r x accum, (r + 1) x accum) and skips the windows of
 * the others, so every rank leaves the data where the whole step ends (docs/parallel.md). With
 * ZeRO-2's partial sums by shard (r->shard_tree_on, 2 or more micro-batches a rank) rank r computes
 * global micro-batches j x nranks + r instead, and each one's gradient is reduced by shards as it
 * comes (rt_train_shard_push): the gradient region then holds this rank's shard of the sum. Each
 * next batch is read while the GPU runs the one before (exec.c: the GPU has two pairs of batch
 * buffers). */
static RtStatus rt_train_micro_batches(RtTrainRun *r, int64_t step, int64_t accum) {
    const RtTrainSettings *t = &r->p->train;
    RtExec *x = &r->x;
    int64_t M = accum * r->nranks;
    RtError enext;
    /* with ZeRO-2's buckets a step of one micro-batch a rank takes the path too: rank r's one is
     * global micro-batch r on both paths, and its exchange is then bucketed as well */
    r->interleaved = r->shard_tree_on && (accum >= 2 || r->zbuckets || r->gzbuckets);
    r->data_at = 0;
    if (r->interleaved) rt_shard_tree_reset(&r->shard_tree);
    RtStatus next = rt_train_stats(r, step, accum, M);
    if (next != RT_OK) return next;
    next = rt_train_read(r, 0, accum, x->x, x->y, &enext);
    RtTree tree = {0};
    for (int64_t m = 0; m < accum; m++) {
        RtStatus st = next;
        if (st != RT_OK) r->e = enext;
        if (st == RT_OK) st = rt_exec_batch(x, r->window, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld", (long long)(step + 1));
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_DATA);
        RtStep s = rt_exec_step(x, &r->e);
        float *leaf = x->gpu ? x->d_grads : x->grads; /* interleaved: the gradient region, zeroed after each shard push */
        if (!r->interleaved) st = rt_exec_tree_leaf(x, &tree, &leaf, &r->e);
        s.grads = leaf;
        int64_t g = rt_train_global_micro(r, m, accum);
        /* micro: the micro-batch's index in the global batch, so that a random draw keyed by it is
         * the same at any number of ranks */
        s.B = t->micro, s.T = t->seq, s.loss_scale = 1.0 / (double)M, s.step = step, s.micro = g, s.seed = r->o.seed;
        /* the micro-batches of one step run back to back on this RtExec with the same parameters,
         * and nothing else writes its arena in between: from the second on, what the launches that
         * read only parameters wrote at the first is still there (rt_program.h, casts_kept) */
        s.casts_kept = m > 0 ? 1 : x->pcasts_current ? 2 : 0;
        /* and at the first, the parameter casts' region holds the parameters' casts when the last
         * forward_backward wrote them and nothing but a whole-region update wrote the parameters
         * since (rt_exec.h, pcasts_current) */
        /* the step's last micro-batch: its backward starts the buckets' reduction (the tree as it
         * stands before this leaf is what the thread folds each bucket by) */
        int overlapped = st == RT_OK && r->overlap && m + 1 == accum;
        if (st == RT_OK && (r->zbuckets || r->gzbuckets)) { /* every micro-batch's buckets during its backward */
            RtTree none = {0};
            st =
                r->zbuckets ? rt_dp_reduce_begin(r->zbuckets, x->grads, NULL, NULL, &r->e) : rt_train_gpu_buckets_begin(r, &none);
            s.grad_hook = &r->zhook;
            if (st != RT_OK)
                return rt_error_context(&r->e, "step %lld, micro-batch %lld", (long long)(step + 1), (long long)(g + 1));
        }
        if (overlapped) {
            r->fold_tree = tree;
            s.grad_hook = &r->hook;
            if (r->gbuckets) st = rt_train_gpu_buckets_begin(r, &tree); /* on the GPU's communication stream */
            else st = rt_dp_reduce_begin(r->buckets, x->grads, rt_train_fold, r, &r->e);
        }
        double fb0 = rt_now();
        if (st == RT_OK) st = rt_exec_queue(x, RT_EXEC_FORWARD_BACKWARD, &s);
        if (st == RT_OK && m + 1 < accum) {
            rt_exec_flip(x);
            next = rt_train_read(r, m + 1, accum, x->x, x->y, &enext);
        }
        /* ZeRO-3 on the GPU over NCCL: the GPU's work polled against the timeout before the wait */
        if (st == RT_OK && rt_zero3_on_gpu(r->zero3)) st = rt_zero3_settle(r->zero3, &r->e);
        if (st == RT_OK) st = rt_exec_wait(x, &r->e); /* s.loss is set */
        if (r->zero3) {                               /* a gather's failure (the hook cannot return it) */
            RtStatus zs = rt_zero3_settle(r->zero3, st == RT_OK ? &r->e : NULL);
            if (st == RT_OK) st = zs;
        }
        r->fb_s += rt_now() - fb0, r->fb_n++; /* (the next batch's read included, when there is one) */
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld, micro-batch %lld", (long long)(step + 1), (long long)(g + 1));
        x->pcasts_current = 1; /* its casts ran, or the region was current */
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_FB);
        if (!isfinite(s.loss))
            return rt_fail(&r->e, RT_ERR_ARG, "step %lld, micro-batch %lld: the loss is %s; stopping", (long long)(step + 1),
                           (long long)(g + 1),
                           isnan(s.loss) ? "nan"
                           : s.loss > 0  ? "inf"
                                         : "-inf");
        r->micro_loss[m] = s.loss;
        if (r->interleaved) { /* this micro-batch's gradient reduced by shards now */
            st = rt_train_shard_push(r, m, accum, step);
            if (st != RT_OK) return st;
            continue;
        }
        if (overlapped) { /* the thread folds the tree bucket by bucket: it is finished */
            tree.depth = 1, tree.size[0] = accum;
            continue;
        }
        st = rt_exec_tree_push(x, &tree, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient's partial sums", (long long)(step + 1));
    }
    RtStatus st = r->interleaved ? RT_OK : rt_exec_tree_finish(x, &tree, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient's partial sums", (long long)(step + 1));
    rt_data_skip(r->train, (M - r->data_at) * t->micro); /* every rank ends where the step does */
    return RT_OK;
}

/* The step's loss: the mean of its M micro-batches' losses, summed by the step's tree over all of
 * them (every rank's, gathered in rank order, then taken in micro-batch order), so that it does
 * not depend on the number of ranks. */
static RtStatus rt_train_step_loss(RtTrainRun *r, int64_t accum, double *loss) {
    int64_t M = accum * r->nranks;
    double *all = r->micro_loss;
    RtStatus st = rt_train_gather_losses(r, accum, &all);
    if (st != RT_OK) return st;
    if (r->interleaved) { /* rank k's local j is global micro-batch j x N + k */
        for (int64_t g = 0; g < M; g++) r->loss_order[g] = all[rt_train_gathered_at(r, g, accum)];
        all = r->loss_order;
    }
    for (int64_t m = 0; m < M; m++) all[m] *= 1.0 / (double)M;
    *loss = rt_tree_sum_f64(all, M);
    return RT_OK;
}

/* --dump-step: the whole global batch of step 1 (every rank's micro-batches, in order), read again
 * from where the step starts, so that the dump is the same file at any number of ranks. */
static RtStatus rt_train_dump_batches(RtTrainRun *r, int64_t nmicro) {
    const RtTrainSettings *t = &r->p->train;
    RtDataPos at = rt_data_tell(r->train);
    RtStatus st = RT_OK;
    for (int64_t m = 0; st == RT_OK && m < nmicro; m++)
        st = rt_data_next(r->train, t->micro, r->dump_x + m * r->window, r->dump_y + m * r->window, &r->e);
    if (st == RT_OK) st = rt_data_seek(r->train, &at, &r->e);
    return st == RT_OK ? st : rt_error_context(&r->e, "step 1: reading the batch to dump");
}

/* offload { optimizer = host | nvme } on the GPU: the clipped gradient copied down, the CPU's
 * optimizer_update over the host's parameters (the f32 master copy) and state on the thread pool
 * (nvme: the state streamed from its store a chunk at a time, rt_opt_offload_update), the
 * parameters copied up. *s carries lr, t, step, seed and ZeRO's shard [lo, hi) (docs/memory.md).
 * Under ZeRO only the shard moves: the gradient's shard down (the rest of the region is other
 * ranks' to update) and the parameters' shard up; where the gather that follows is staged
 * through the host, not even that: it starts from the host's parameters (host_params_current)
 * and uploads the whole region once.
 * The copies run on the update's copy stream between page-locked host regions and the device
 * (gpu_opt.c), a chunk at a time, so chunk c + 1's gradient comes down while the CPU updates chunk
 * c, and chunk c's parameters go up while it updates c + 1: nvme's chunks are the store's; host's
 * are rt_host_chunk's pieces of the range, each updated in the state's own layout (the whole
 * region's, or ZeRO's shard's: RtStep.state_stride). Nothing waits for the uploads on the host: the
 * compute stream does, before the next launch (rt_gpu_opt_join). */
typedef struct RtHostCopies {
    RtTrainRun *r;
    int64_t lo, hi, chunk; /* the range that moves, in chunks of `chunk` parameters */
    int up;                /* the parameters go up (not when a host-staged gather uploads them) */
} RtHostCopies;

/* Chunk c's parameters [*a, *b) of the range, and the range's chunks. */
static void rt_host_range(const RtHostCopies *h, int64_t c, int64_t *a, int64_t *b) {
    *a = h->lo + c * h->chunk;
    *b = *a + h->chunk < h->hi ? *a + h->chunk : h->hi;
}

static int64_t rt_host_nchunks(const RtHostCopies *h) { return (h->hi - h->lo + h->chunk - 1) / h->chunk; }

static RtStatus rt_host_down(RtHostCopies *h, int64_t c) {
    RtExec *x = &h->r->x;
    int64_t a, b;
    rt_host_range(h, c, &a, &b);
    return rt_gpu_opt_down(x->gpu, x->grads + a, x->d_grads + a, (b - a) * 4, (int)c, &h->r->e);
}

static RtStatus rt_host_before(void *ctx, int64_t c) { /* chunk c's gradient is here; c + 1's is on its way */
    RtHostCopies *h = ctx;
    RtGpu *g = h->r->x.gpu;
    RtStatus st = RT_OK;
    if (c == 0) st = rt_gpu_opt_fork(g, &h->r->e);
    if (st == RT_OK && c == 0) st = rt_host_down(h, 0);
    if (st == RT_OK && h->lo + (c + 1) * h->chunk < h->hi) st = rt_host_down(h, c + 1);
    return st == RT_OK ? rt_gpu_opt_wait_down(g, (int)c, &h->r->e) : st;
}

static RtStatus rt_host_after(void *ctx, int64_t c) { /* chunk c's parameters go up, not waited for */
    RtHostCopies *h = ctx;
    RtExec *x = &h->r->x;
    int64_t a, b;
    rt_host_range(h, c, &a, &b);
    return h->up ? rt_gpu_opt_up(x->gpu, x->d_params + a, x->params + a, (b - a) * 4, (int)c, &h->r->e) : RT_OK;
}

/* Parameters a chunk of the host's update (offload { optimizer = host }) over n: an eighth of them,
 * so that the copies of the other chunks overlap the update of one, in whole 4 KiB of floats, at
 * most 2^22 (16 MiB a region). */
#define RT_HOST_CHUNK_MAX (INT64_C(1) << 22)
static int64_t rt_host_chunk(int64_t n) {
    int64_t c = (n + 7) / 8;
    c = (c + 1023) / 1024 * 1024;
    return c < RT_HOST_CHUNK_MAX ? c : RT_HOST_CHUNK_MAX;
}

/* The CPU's update of chunk c: its elements below nupd (the update's length; the frozen parameters
 * after it have no state), with h's lr and t and the state at its place in the state's layout -
 * variable j's element e at state[j x stride + e - base] (h itself unchanged). */
static RtStatus rt_host_update_chunk(const RtHostCopies *hc, const RtStep *h, int64_t c, int64_t nupd, int64_t base,
                                     int64_t stride) {
    int64_t a, e;
    rt_host_range(hc, c, &a, &e);
    if (e > nupd) e = nupd;
    if (e <= a) return RT_OK;
    RtStep k = *h;
    k.lo = a, k.hi = e, k.state = h->state + (a - base), k.state_stride = stride;
    return hc->r->p->optimizer_update(&k);
}

/* The host's update (no store) chunk by chunk over [hc->lo, hc->hi), the copies of the neighbouring
 * chunks queued around each (rt_host_before, rt_host_after). */
static RtStatus rt_host_update_chunks(RtHostCopies *hc, const RtStep *h, int64_t nupd, int64_t base, int64_t stride) {
    RtStatus st = RT_OK;
    for (int64_t c = 0; c < rt_host_nchunks(hc) && st == RT_OK; c++) {
        st = rt_host_before(hc, c);
        if (st == RT_OK) st = rt_host_update_chunk(hc, h, c, nupd, base, stride);
        if (st == RT_OK) st = rt_host_after(hc, c);
    }
    return st;
}

/* ---- the host's update deferred to the next step's reads ---------------------------------------
 * offload { optimizer = host } alone (one process, no ZeRO, no store, an optimizer with state): the
 * step queues every chunk's download and returns; the update itself waits for the next step. Its
 * forward_backward, run eagerly with a parameter hook (the one ZeRO-3's gathers use, RtStep.
 * param_hook: rt_param_need before the first launch that reads a range of the parameters), runs,
 * at each need, the update of every chunk of the range not yet run - the host waits for its
 * download, the CPU updates it, its upload is queued and the compute stream waits for that upload
 * alone - so the device computes the launches already queued while the CPU updates the chunks the
 * next ones read. The arithmetic and the ranges are the sync path's, so the bits are the same.
 * rt_train_host_flush runs what is left before anything on the host reads the parameters or the
 * state (an evaluation, a checkpoint, the run's end) and at the next step's norm; a run that dumps
 * step 1 (--dump-step) keeps the update in its step.
 * MBT_OPT_OVERLAP=0 keeps the update in its step (for a comparison). */

/* Chunk c of the deferred update: updated, uploaded, and waited for by the compute stream. */
static RtStatus rt_defer_chunk(RtTrainRun *r, int64_t c) {
    RtExec *x = &r->x;
    RtHostCopies hc = {r, r->defer.lo, r->defer.hi, r->defer.chunk, 1};
    r->defer.done[c] = 1;
    r->defer.ndone++;
    RtStatus st = rt_gpu_opt_wait_down(x->gpu, (int)c, &r->e);
    if (st == RT_OK) st = rt_host_update_chunk(&hc, &r->defer.step, c, r->defer.part, 0, r->defer.part);
    if (st == RT_OK) st = rt_host_after(&hc, c);
    return st == RT_OK ? rt_gpu_opt_need(x->gpu, (int)c, &r->e) : st;
}

static void rt_defer_end(RtTrainRun *r) {
    r->defer.on = 0;
    r->x.param_hook = NULL; /* the later micro-batches' RtSteps: captured as CUDA graphs again */
}

/* The hook's need: the pending chunks that params[lo, hi) overlaps (a failure sticks in defer.st:
 * the generated code cannot take one; the flush after the micro-batches returns it). */
static void rt_defer_need(void *ctx, int64_t lo, int64_t hi, int64_t next_lo, int64_t next_hi) {
    RtTrainRun *r = ctx;
    (void)next_lo, (void)next_hi;
    if (!r->defer.on || r->defer.st != RT_OK) return;
    if (lo < r->defer.lo) lo = r->defer.lo;
    if (hi > r->defer.hi) hi = r->defer.hi;
    for (int64_t c = (lo - r->defer.lo) / r->defer.chunk; lo < hi && c * r->defer.chunk + r->defer.lo < hi; c++)
        if (!r->defer.done[c] && (r->defer.st = rt_defer_chunk(r, c)) != RT_OK) return;
    if (r->defer.ndone == r->defer.nchunks) rt_defer_end(r);
}

RtStatus rt_train_host_flush(RtTrainRun *r) {
    if (!r->defer.on) return RT_OK;
    RtStatus st = r->defer.st;
    for (int64_t c = 0; c < r->defer.nchunks && st == RT_OK; c++)
        if (!r->defer.done[c]) st = rt_defer_chunk(r, c);
    rt_defer_end(r);
    return st;
}

/* Whether this run's host update may be deferred (above), and then its first half: every chunk's
 * download queued, the compute stream waiting for them (the gradient's zeroing comes next). */
static int rt_defer_wanted(const RtTrainRun *r, int64_t part) {
    const char *v = getenv("MBT_OPT_OVERLAP");
    return !r->offload && !r->zero && !r->zero3 && r->nranks == 1 && part > 0 && !r->x.param_hook && !r->dump_x &&
           !(v && strcmp(v, "0") == 0);
}

static RtStatus rt_host_defer(RtTrainRun *r, RtHostCopies *hc, const RtStep *h, int64_t part) {
    RtExec *x = &r->x;
    int64_t n = rt_host_nchunks(hc);
    if (n > r->defer.nchunks) {
        unsigned char *d = realloc(r->defer.done, (size_t)n);
        if (!d) return rt_fail(&r->e, RT_ERR_NOMEM, "the deferred update: out of memory");
        r->defer.done = d;
    }
    memset(r->defer.done, 0, (size_t)n);
    r->defer.nchunks = n, r->defer.ndone = 0, r->defer.lo = hc->lo, r->defer.hi = hc->hi, r->defer.chunk = hc->chunk;
    r->defer.part = part, r->defer.step = *h, r->defer.st = RT_OK;
    RtStatus st = rt_gpu_opt_fork(x->gpu, &r->e);
    for (int64_t c = 0; c < n && st == RT_OK; c++) st = rt_host_down(hc, c);
    if (st == RT_OK) st = rt_gpu_opt_join(x->gpu, "optimizer offload: the step waits for the gradient's downloads", &r->e);
    if (st != RT_OK) return st;
    r->defer.hook = (RtParamHook){rt_defer_need, NULL, r};
    r->defer.on = 1;
    x->param_hook = &r->defer.hook;
    return RT_OK;
}

static RtStatus rt_train_host_update(RtTrainRun *r, const RtStep *s) {
    RtExec *x = &r->x;
    int64_t lo = r->zero ? s->lo : 0, hi = r->zero ? s->hi : r->p->param_floats;
    /* ZeRO-1/2 staged through the host: rt_train_gather_f32 gathers from x->params and uploads */
    int staged = r->zero && !r->zero3 && !r->nccl_grads;
    /* (an optimizer without state - sgd without momentum - updates in one piece: its update's length,
     * short of the frozen parameters, is not the runtime's to know, and it has no state to stride) */
    int64_t part = rt_state_part(r->p);
    RtHostCopies hc = {r, lo, hi,
                       r->offload ? rt_opt_offload_chunk(r->offload)
                       : part > 0 ? rt_host_chunk(hi - lo)
                                  : hi - lo,
                       !staged};
    if (hc.chunk < 1) hc.chunk = 1; /* (an empty shard: nothing moves) */
    RtOptChunkHooks hooks = {rt_host_before, rt_host_after, &hc};
    RtStep h = {.pool = x->pool,
                .params = x->params,
                .grads = x->grads,
                .state = x->state,
                .arena = x->arena,
                .lr = s->lr,
                .t = s->t,
                .step = s->step,
                .seed = s->seed,
                .lo = s->lo,
                .hi = s->hi,
                .pcasts = x->pcasts, /* scratch: the device's casts are made again (the train loop clears the bit) */
                .err = &r->e};
    RtStatus st = rt_gpu_opt_events(x->gpu, (int)rt_host_nchunks(&hc), &r->e);
    if (st != RT_OK) return st;
    if (hi > lo && rt_defer_wanted(r, part)) {
        st = rt_host_defer(r, &hc, &h, part);
    } else if (r->offload) st = rt_opt_offload_update_chunks(r->offload, x, &h, &hooks, &r->e);
    else if (hi > lo && part > 0) /* the state: ZeRO's shard [s->lo, s->hi), or the whole update's */
        st = rt_host_update_chunks(&hc, &h, r->zero ? s->hi : part, r->zero ? s->lo : 0, r->zero ? s->hi - s->lo : part);
    else if (hi > lo) {
        st = rt_host_before(&hc, 0);
        if (st == RT_OK) st = r->p->optimizer_update(&h);
        if (st == RT_OK) st = rt_host_after(&hc, 0);
    }
    /* the next launches (the gradient's zeroing, the next step) after the last upload (deferred:
     * the downloads' join is queued already, the uploads' waits come with the next step's reads) */
    if (!r->defer.on) {
        RtStatus js = rt_gpu_opt_join(x->gpu, "optimizer offload: the step waits for the uploads", &r->e);
        if (st == RT_OK) st = js;
    }
    if (st != RT_OK) return st;
    x->pcasts_current = 0;
    r->host_params_current = staged;
    r->host_steps++;
    return RT_OK;
}

/* One optimizer step: its micro-batches, the gradient norm and clipping, the update, and with
 * --dump-step the dump of step 1. The step's log record comes back in *sl. */
RtStatus rt_train_step(RtTrainRun *r, int64_t step, RtStepLog *sl) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    RtExec *x = &r->x;
    double t0 = rt_now();
    /* this step's batch: its ramp stage; accum micro-batches on each of the ranks */
    RtRampStage stage = rt_train_stage(t, step);
    int64_t nmicro = stage.accum * t->data_ranks;
    double mult = p->lr_schedule(step), lr = t->lr * mult, loss = 0, norm = 0;
    if (!isfinite(lr))
        return rt_fail(&r->e, RT_ERR_ARG, "step %lld: the learning-rate schedule gave %g", (long long)(step + 1), mult);
    RtStatus st = r->dump_x && step == 0 ? rt_train_dump_batches(r, nmicro) : RT_OK;
    /* ZeRO-3: the step starts from this rank's shard alone (an evaluation, a checkpoint or the
     * start gathered the whole region) */
    if (r->zero3) rt_zero3_release_all(r->zero3);
    /* a process runs nmicro / nranks of them: all of them alone, accum with one process a rank */
    int64_t local = nmicro / r->nranks;
    /* the curriculum's length for this step: the same micro x seq tokens read as windows of that
     * length (data.pos restarts every x->row tokens); evaluation and generation keep seq */
    x->row = rt_train_seq_len(t, step);
    int measure = r->o.arena_high_water && !r->high_water_done;
    if (st == RT_OK && measure) st = rt_exec_arena_mark(x, &r->e);
    if (st == RT_OK) st = rt_train_micro_batches(r, step, local);
    if (st == RT_OK && measure) { /* the micro-batches alone: the update's phase has its own peak */
        int64_t hw = 0;
        st = rt_exec_arena_high(x, &hw, &r->e);
        r->high_water_done = 1;
        if (st == RT_OK)
            fprintf(stdout,
                    "arena high-water: step %lld's micro-batches wrote %lld bytes of the arena; the plan's step peak is %lld\n",
                    (long long)(step + 1), (long long)hw, (long long)p->plan.arena[RT_PHASE_STEP]);
    }
    x->row = 0;
    if (st == RT_OK) st = rt_train_host_flush(r); /* the step before's deferred update: what its reads left */
    if (st == RT_OK) st = rt_train_reduce(r, step);
    if (st == RT_OK) st = rt_train_step_loss(r, local, &loss);
    if (st == RT_OK && r->given->dump_step && step == 0) st = rt_train_zero3_whole(r); /* every rank */
    if (st == RT_OK && r->dump_x && step == 0) {
        st = rt_exec_pull(x, RT_PULL_PARAMS | RT_PULL_GRADS, &r->e);
        if (st != RT_OK) return st;
        memcpy(r->dump_p, x->params, (size_t)p->param_floats * sizeof *r->dump_p);
        memcpy(r->dump_g, x->grads, (size_t)p->param_floats * sizeof *r->dump_g);
    }
    if (st != RT_OK) return st;
    st = r->zero >= 2 ? rt_train_shard_norm(r, &norm) : rt_exec_grad_norm(x, r->partial, &norm, &r->e);
    if (st == RT_OK && t->clip > 0 && t->clip / (norm + RT_CLIP_EPS) < 1)
        st = rt_exec_grad_scale(x, (float)(t->clip / (norm + RT_CLIP_EPS)), &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient norm", (long long)(step + 1));
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_NORM);
    RtStep s = rt_exec_step(x, &r->e);
    s.lr = lr, s.t = step + 1, s.step = step, s.seed = r->o.seed;
    if (r->zero) s.lo = r->shard_off[r->rank], s.hi = r->shard_off[r->rank + 1]; /* this rank's shard */
    if (x->gpu && p->train.offload_optimizer != 0) st = rt_train_host_update(r, &s);
    else if (r->offload) st = rt_opt_offload_update(r->offload, x, &s, &r->e);
    else st = rt_exec_call(x, RT_EXEC_UPDATE, &s);
    /* the parameter casts' region stays current only after an update of the whole region on the
     * device the step runs on (the CPU's chunked update with its state in a store file writes every
     * chunk's casts into it too), or a shard's whose region the gather completes (below): not
     * after the host's update on a GPU build (its casts went to a host scratch and the parameters
     * were uploaded: rt_exec_push clears it too) */
    if (x->gpu && p->train.offload_optimizer != 0) x->pcasts_current = 0;
    /* the updated shards; ZeRO-3 keeps its own alone (the next forward gathers); ZeRO-1/2 gather
     * the parameter casts' region too where they can (rt_train_gather_params), else it is stale */
    r->pcasts_gathered = 0;
    if (st == RT_OK && r->zero && !r->zero3) st = rt_train_gather_params(r);
    if (r->zero && !r->pcasts_gathered) x->pcasts_current = 0;
    if (st == RT_OK) st = rt_exec_grad_zero(x, &r->e);
    /* running statistics: from this step's statistics pass (x->stats), the same on every rank */
    if (st == RT_OK) st = rt_exec_running(x, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: optimizer", (long long)(step + 1));
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_UPDATE);
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_ZERO);
    if (r->given->dump_step && step == 0) {
        st = rt_train_zero3_whole(r); /* every rank */
        if (st != RT_OK) return st;
    }
    if (r->dump_x && step == 0) {
        st = rt_exec_pull(x, RT_PULL_PARAMS, &r->e);
        if (st != RT_OK) return st;
        RtStepDump d = {r->dump_p, r->dump_g, x->params, r->dump_x, r->dump_y, nmicro, loss, lr, t->clip, r->o.seed};
        st = rt_step_dump(p, &d, r->o.dump_step, &r->e);
        if (st != RT_OK) return st;
        printf("wrote step 1 (loss %.9g, %lld micro-batch%s) to '%s'\n", loss, (long long)nmicro, nmicro == 1 ? "" : "es",
               r->o.dump_step);
    }
    *sl = (RtStepLog){step + 1, loss, lr, norm, (rt_now() - t0) * 1e3, stage.global * t->seq};
    return RT_OK;
}
