/* exec.c - the memory of a run and the calls into the program, on the CPU or the GPU (rt_exec.h,
 * "running").
 *
 * Pipeline position: between the commands (train.c, generate.c) and the generated functions. On
 * the CPU the regions are host memory and the program's functions run on the thread pool. On the
 * GPU (rt_gpu.h) the regions are device memory and RtGpuProgram's functions run; the host keeps
 * copies of the parameters and the optimizer state for what the host does with them
 * (initialisation, weights files, checkpoints, step dumps), moved by rt_exec_push / rt_exec_pull,
 * and the micro-batch's token ids in page-locked buffers uploaded by rt_exec_batch.
 *
 * Order on the GPU. Every device call is queued on the GPU's one stream; forward_backward and
 * forward_loss end by queuing the loss's copy to the host (rt_gpu_loss), so they return with the
 * whole micro-batch queued. rt_exec_call then waits for it; rt_exec_queue does not, and the
 * caller reads the next micro-batch into the other pair of page-locked buffers (rt_exec_flip)
 * while the GPU computes, then waits (rt_exec_wait). A pair is written again only after a wait
 * that followed its upload. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt_exec.h"
#include "rt_gpu.h"
#include "rt_store.h"

/* ---- regions ------------------------------------------------------------------------------------ */

static RtStatus rt_alloc_aligned(void **out, int64_t bytes, size_t align, const char *what, RtError *err) {
    *out = NULL;
    size_t n = bytes > 0 ? (size_t)bytes : align;
    n = (n + align - 1) / align * align;
    int rc = posix_memalign(out, align, n);
    if (rc != 0) {
        *out = NULL;
        return rt_fail_errno(err, rc, "cannot allocate the %s (%lld bytes)", what, (long long)bytes);
    }
    memset(*out, 0, n);
    return RT_OK;
}

static RtStatus rt_alloc_region(void **out, int64_t bytes, const char *what, RtError *err) {
    return rt_alloc_aligned(out, bytes, RT_ALIGN, what, err);
}

/* The batch buffers: page-locked on the GPU (uploads from them do not stage through a copy). */
static RtStatus rt_alloc_batch(RtExec *e, void **out, int64_t bytes, const char *what, RtError *err) {
    if (!e->gpu) return rt_alloc_region(out, bytes, what, err);
    return rt_gpu_host_alloc(e->gpu, out, bytes > 0 ? bytes : RT_ALIGN, what, err);
}

/* Page-locked host memory, RT_ALIGN-aligned (*raw: what the GPU gave, for rt_gpu_host_free) */
static RtStatus rt_exec_pinned(RtExec *e, void **raw, void **out, int64_t bytes, const char *what, RtError *err) {
    RtStatus st = rt_gpu_host_alloc(e->gpu, raw, bytes + RT_ALIGN, what, err);
    if (st != RT_OK) return st;
    *out = (void *)(((uintptr_t)*raw + RT_ALIGN - 1) & ~(uintptr_t)(RT_ALIGN - 1));
    e->pinned_bytes += bytes + RT_ALIGN;
    return RT_OK;
}

static RtStatus rt_exec_open_gpu(RtExec *e, int64_t tokens, RtError *err) {
    const RtProgram *p = e->prog;
    RtStatus st = rt_gpu_alloc(e->gpu, (void **)&e->d_params, p->param_floats * 4, "the parameter region", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_grads, p->param_floats * 4, "the gradient region", err);
    /* (the optimizer-state region at the first rt_exec_push, at its size then: ZeRO's shard) */
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_arena, p->arena_bytes, "the activation arena", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_x, tokens * 4, "the input batch", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_y, tokens * 4, "the target batch", err);
    if (st == RT_OK && p->train.docs >= 0)
        st = rt_gpu_alloc(e->gpu, (void **)&e->d_pos, tokens * 4, "the document positions", err);
    if (st == RT_OK && p->stat_floats > 0)
        st = rt_gpu_alloc(e->gpu, (void **)&e->d_stats, p->stat_floats * 4, "the global_mean statistics", err);
    if (st == RT_OK && p->pcast_bytes > 0) st = rt_gpu_alloc(e->gpu, &e->d_pcasts, p->pcast_bytes, "the parameter casts", err);
    return st;
}

RtStatus rt_exec_open(RtExec *e, const RtProgram *p, int threads, RtDeviceWant want, RtError *err) {
    memset(e, 0, sizeof *e);
    e->prog = p;
    if ((uint64_t)p->param_floats > (uint64_t)INT64_MAX / 4 || (uint64_t)p->state_floats > (uint64_t)INT64_MAX / 4)
        return rt_fail(err, RT_ERR_NOMEM, "cannot allocate %lld parameters", (long long)p->param_floats);
    int64_t tokens = p->train.micro * p->train.seq;
    if (p->logits_seq > tokens) tokens = p->logits_seq;
    if (p->kv.rows > tokens) tokens = p->kv.rows; /* a call of forward_chunk: its rows' token ids */
    e->state_len = p->state_floats;
    RtStatus st = rt_gpu_open(&e->gpu, p->gpu, want, &e->cpu_reason, err);
    if (st != RT_OK && want == RT_DEVICE_CUDA) rt_error_context(err, "--device cuda");
    if (st == RT_OK) st = rt_pool_create(&e->pool, threads, err);
    /* offload { optimizer } on the GPU: the host's parameters and gradient are what the host's
     * update copies each step, asynchronously on a copy stream (gpu_opt.c), so page-locked */
    if (st == RT_OK && e->gpu && p->train.offload_optimizer != 0) {
        st = rt_exec_pinned(e, &e->params_raw, (void **)&e->params, p->param_floats * 4, "the parameters (the host's update)",
                            err);
        if (st == RT_OK)
            st = rt_exec_pinned(e, &e->grads_raw, (void **)&e->grads, p->param_floats * 4, "the gradient (the host's update)",
                                err);
        if (st == RT_OK) st = rt_gpu_opt_open(e->gpu, err);
    }
    if (st == RT_OK && !e->params) st = rt_alloc_region((void **)&e->params, p->param_floats * 4, "parameter region", err);
    if (st == RT_OK && !e->grads) st = rt_alloc_region((void **)&e->grads, p->param_floats * 4, "gradient region", err);
    /* offload { optimizer = nvme }: the state lives in a store file (the train loop's; docs/memory.md),
     * so no region is allocated for it: a resumed run allocates one while it fills the store */
    if (st == RT_OK && p->train.offload_optimizer != 2)
        st = rt_alloc_region((void **)&e->state, p->state_floats * 4, "optimizer-state region", err);
    /* the host arena only where the host runs the program; with offload { optimizer = host | nvme }
     * on the GPU, the update's arena, for the CPU's optimizer_update */
    /* the arena starts a page: offload { activations = nvme } reads and writes its slots with
     * O_DIRECT, and the plan places them at whole pages of it (docs/memory.md) */
    if (st == RT_OK && !e->gpu) st = rt_alloc_aligned((void **)&e->arena, p->arena_bytes, 4096, "activation arena", err);
    if (st == RT_OK && e->gpu && p->train.offload_optimizer != 0)
        st = rt_alloc_region((void **)&e->arena, p->plan.arena[RT_PHASE_UPDATE], "the host update's arena", err);
    if (st == RT_OK) st = rt_alloc_batch(e, (void **)&e->x, tokens * 4, "input batch", err);
    if (st == RT_OK) st = rt_alloc_batch(e, (void **)&e->y, tokens * 4, "target batch", err);
    /* the parameter casts' region: the program's on the CPU; on a GPU build with offload { optimizer }
     * the CPU's optimizer_update writes casts too (of parameters it then uploads), into this scratch */
    if (st == RT_OK && p->pcast_bytes > 0 && (!e->gpu || p->train.offload_optimizer != 0))
        st = rt_alloc_region(&e->pcasts, p->pcast_bytes, "parameter casts", err);
    if (st == RT_OK && e->gpu) st = rt_alloc_batch(e, (void **)&e->x_next, tokens * 4, "next input batch", err);
    if (st == RT_OK && e->gpu) st = rt_alloc_batch(e, (void **)&e->y_next, tokens * 4, "next target batch", err);
    if (st == RT_OK && p->train.docs >= 0) st = rt_alloc_region((void **)&e->pos, tokens * 4, "document positions", err);
    if (st == RT_OK && p->stat_floats > 0) st = rt_alloc_region((void **)&e->stats, p->stat_floats * 4, "statistics", err);
    if (st == RT_OK && p->stat_floats > 0)
        st = rt_alloc_region((void **)&e->stats_out, p->stat_floats * 4, "micro-batch statistics", err);
    if (st == RT_OK && e->gpu) st = rt_exec_open_gpu(e, tokens, err);
    if (st != RT_OK) rt_exec_close(e);
    return st;
}

void rt_exec_close(RtExec *e) {
    for (int i = 1; i < e->ntree; i++) {
        if (e->gpu) rt_gpu_free(e->gpu, e->tree[i]);
        else free(e->tree[i]);
    }
    if (e->gpu) {
        /* the activations' copy stream first: a step stopped by an error may leave copies queued
         * there that read or write the arena */
        rt_gpu_act_close(e->gpu);
        rt_gpu_opt_close(e->gpu); /* (its copies read and write the pinned regions below) */
        if (e->params_raw) rt_gpu_host_free(e->gpu, e->params_raw), e->params = NULL;
        if (e->grads_raw) rt_gpu_host_free(e->gpu, e->grads_raw), e->grads = NULL;
        rt_gpu_free(e->gpu, e->d_params);
        rt_gpu_free(e->gpu, e->d_grads);
        rt_gpu_free(e->gpu, e->d_state);
        rt_gpu_free(e->gpu, e->d_arena);
        rt_gpu_free(e->gpu, e->d_x);
        rt_gpu_free(e->gpu, e->d_y);
        rt_gpu_free(e->gpu, e->d_pos);
        rt_gpu_free(e->gpu, e->d_stats);
        rt_gpu_free(e->gpu, e->d_pcasts);
        rt_gpu_host_free(e->gpu, e->x);
        rt_gpu_host_free(e->gpu, e->y);
        rt_gpu_host_free(e->gpu, e->x_next);
        rt_gpu_host_free(e->gpu, e->y_next);
        rt_gpu_close(e->gpu);
    } else {
        free(e->x);
        free(e->y);
    }
    free(e->pos);
    rt_pool_destroy(e->pool);
    free(e->params);
    free(e->grads);
    free(e->state);
    free(e->arena);
    rt_store_close(e->act_store);
    free(e->act_host);
    free(e->stats);
    free(e->stats_out);
    free(e->pcasts);
    memset(e, 0, sizeof *e);
}

RtStatus rt_exec_arena_mark(RtExec *e, RtError *err) {
    int64_t n = e->prog->arena_bytes;
    if (n <= 0) return RT_OK;
    if (!e->gpu) {
        memset(e->arena, RT_ARENA_PATTERN, (size_t)n);
        return RT_OK;
    }
    unsigned char *h = malloc((size_t)n);
    if (!h) return rt_fail(err, RT_ERR_NOMEM, "out of memory for the arena's pattern (%lld bytes)", (long long)n);
    memset(h, RT_ARENA_PATTERN, (size_t)n);
    RtStatus st = rt_gpu_upload(e->gpu, e->d_arena, h, n, err);
    if (st == RT_OK) st = rt_gpu_sync(e->gpu, "marking the arena", err);
    free(h);
    return st;
}

RtStatus rt_exec_arena_high(RtExec *e, int64_t *bytes, RtError *err) {
    int64_t n = e->prog->arena_bytes;
    *bytes = 0;
    if (n <= 0) return RT_OK;
    const unsigned char *a = e->arena;
    unsigned char *h = NULL;
    if (e->gpu) {
        h = malloc((size_t)n);
        if (!h) return rt_fail(err, RT_ERR_NOMEM, "out of memory for the arena's copy (%lld bytes)", (long long)n);
        RtStatus st = rt_gpu_sync(e->gpu, "measuring the arena", err);
        if (st == RT_OK) st = rt_gpu_download(e->gpu, h, e->d_arena, n, err);
        if (st == RT_OK) st = rt_gpu_sync(e->gpu, "measuring the arena", err);
        if (st != RT_OK) {
            free(h);
            return st;
        }
        a = h;
    }
    int64_t i = n;
    while (i > 0 && a[i - 1] == RT_ARENA_PATTERN) i--;
    *bytes = i;
    free(h);
    return RT_OK;
}

const char *rt_exec_device(const RtExec *e) { return e->gpu ? rt_gpu_describe(e->gpu) : "cpu"; }

/* ---- host copies -------------------------------------------------------------------------------- */

RtStatus rt_exec_push(RtExec *e, RtError *err) {
    e->pcasts_current = 0; /* new parameters (a start, a load, a resume, the host's update) */
    if (!e->gpu) return RT_OK;
    const RtProgram *p = e->prog;
    int64_t lo = e->d_param_lo, hi = e->d_param_hi > 0 ? e->d_param_hi : p->param_floats; /* ZeRO-3: the shard */
    RtStatus st = rt_gpu_upload(e->gpu, e->d_params + lo, e->params + lo, (hi - lo) * 4, err);
    /* offload { optimizer = host }: the state stays in host memory, where the CPU updates it */
    if (st == RT_OK && !e->d_state && p->train.offload_optimizer != 1 && e->state)
        st = rt_gpu_alloc(
            e->gpu, (void **)&e->d_state, e->state_len * 4,
            e->state_len < p->state_floats ? "this rank's shard of the optimizer state" : "the optimizer-state region", err);
    if (st == RT_OK && e->d_state) st = rt_gpu_upload(e->gpu, e->d_state, e->state, e->state_len * 4, err);
    return st == RT_OK ? rt_gpu_sync(e->gpu, "uploading the parameters and optimizer state", err) : st;
}

RtStatus rt_exec_shard_state(RtExec *e, float *shard, int64_t len, RtError *err) {
    if (e->d_state) return rt_fail(err, RT_ERR_ARG, "the optimizer state is sharded after it went to the GPU");
    free(e->state);
    e->state = shard;
    e->state_len = len;
    return RT_OK;
}

RtStatus rt_exec_pull(RtExec *e, int what, RtError *err) {
    if (!e->gpu) return RT_OK;
    const RtProgram *p = e->prog;
    RtStatus st = RT_OK;
    int64_t lo = e->d_param_lo, hi = e->d_param_hi > 0 ? e->d_param_hi : p->param_floats; /* ZeRO-3: the shard */
    if (what & RT_PULL_PARAMS) st = rt_gpu_download(e->gpu, e->params + lo, e->d_params + lo, (hi - lo) * 4, err);
    if (st == RT_OK && (what & RT_PULL_GRADS)) st = rt_gpu_download(e->gpu, e->grads, e->d_grads, p->param_floats * 4, err);
    /* (offload { optimizer = host }: no d_state, the host's state is the state) */
    if (st == RT_OK && (what & RT_PULL_STATE) && e->d_state)
        st = rt_gpu_download(e->gpu, e->state, e->d_state, e->state_len * 4, err);
    return st;
}

void rt_doc_positions(const int32_t *x, int64_t tokens, int64_t row, int64_t eot, int32_t *pos) {
    if (row <= 0) row = tokens;
    for (int64_t i = 0; i < tokens; i++) pos[i] = i % row == 0 || x[i - 1] == eot ? 0 : pos[i - 1] + 1;
}

RtStatus rt_exec_batch(RtExec *e, int64_t tokens, RtError *err) {
    const RtTrainSettings *t = &e->prog->train;
    /* rows of seq tokens (a training or evaluation batch; a curriculum step's windows of e->row),
     * else one row (generation's context) */
    int64_t row = e->row > 0 ? e->row : t->seq;
    if (e->pos) rt_doc_positions(e->x, tokens, row > 0 && tokens % row == 0 ? row : tokens, t->docs, e->pos);
    if (!e->gpu) return RT_OK;
    RtStatus st = rt_gpu_upload(e->gpu, e->d_x, e->x, tokens * 4, err);
    if (st == RT_OK && e->d_pos) st = rt_gpu_upload(e->gpu, e->d_pos, e->pos, tokens * 4, err);
    return st == RT_OK ? rt_gpu_upload(e->gpu, e->d_y, e->y, tokens * 4, err) : st;
}

RtStatus rt_exec_running(RtExec *e, RtError *err) {
    const RtProgram *p = e->prog;
    RtStatus st = RT_OK;
    if (p->nrunning > 0) e->pcasts_current = 0; /* frozen parameters the step reads through casts, rewritten */
    for (int64_t i = 0; i < p->nrunning && st == RT_OK; i++) {
        int64_t o = p->running[3 * i], so = p->running[3 * i + 1], n = p->running[3 * i + 2];
        double m = p->running_momentum[i];
        if (o < 0 || n < 0 || o + n > p->param_floats || so < 0 || so + n > p->stat_floats)
            return rt_fail(err, RT_ERR_ARG, "running statistic %lld lies outside its region", (long long)i);
        float *r = e->params + o;
        if (e->gpu) st = rt_gpu_download(e->gpu, r, e->d_params + o, n * 4, err);
        /* in double, rounded once to f32: --verify-step's reference and the tests compute the same */
        for (int64_t j = 0; st == RT_OK && j < n; j++) r[j] = (float)((1.0 - m) * (double)r[j] + m * (double)e->stats[so + j]);
        if (st == RT_OK && e->gpu) st = rt_gpu_upload(e->gpu, e->d_params + o, r, n * 4, err);
    }
    return st == RT_OK && e->gpu && p->nrunning ? rt_gpu_sync(e->gpu, "the running statistics", err) : st;
}

RtStatus rt_exec_stats(RtExec *e, RtError *err) {
    if (!e->gpu || !e->d_stats) return RT_OK;
    return rt_gpu_upload(e->gpu, e->d_stats, e->stats, e->prog->stat_floats * 4, err); /* pageable: staged on return */
}

/* ---- calls -------------------------------------------------------------------------------------- */

void rt_grad_ready(RtStep *s, int64_t lo, int64_t hi) {
    const RtGradHook *h = s->grad_hook;
    if (h && h->fn) h->fn(h->ctx, lo, hi);
}

void rt_param_need(RtStep *s, int64_t lo, int64_t hi, int64_t next_lo, int64_t next_hi) {
    const RtParamHook *h = s->param_hook;
    if (h && h->need) h->need(h->ctx, lo, hi, next_lo, next_hi);
}

void rt_param_done(RtStep *s, int64_t lo, int64_t hi) {
    const RtParamHook *h = s->param_hook;
    if (h && h->done) h->done(h->ctx, lo, hi);
}

RtStep rt_exec_step(const RtExec *e, RtError *err) {
    RtStep s = {
        .pool = e->pool, .err = err, .stats = e->gpu ? e->d_stats : e->stats, .stats_out = e->stats_out, .act = (void *)e};
    if (e->gpu) {
        s.gpu = e->gpu;
        s.params = e->d_params, s.grads = e->d_grads, s.state = e->d_state, s.arena = e->d_arena, s.pcasts = e->d_pcasts;
        s.x = e->d_x, s.y = e->d_y, s.pos = e->d_pos;
    } else {
        s.params = e->params, s.grads = e->grads, s.state = e->state, s.arena = e->arena, s.pcasts = e->pcasts;
        s.x = e->x, s.y = e->y, s.pos = e->pos;
    }
    s.param_hook = (void *)e->param_hook;
    return s;
}

void rt_exec_flip(RtExec *e) {
    if (!e->gpu) return;
    int32_t *x = e->x, *y = e->y;
    e->x = e->x_next, e->y = e->y_next;
    e->x_next = x, e->y_next = y;
}

RtStatus rt_exec_wait(RtExec *e, RtError *err) {
    if (!e->gpu) return RT_OK;
    RtStatus st = rt_gpu_sync(e->gpu, "waiting for the micro-batch", err);
    /* offload { activations = nvme }: the store requests of the copy stream's host functions, all
     * run by now (the compute stream waited for every copy), cannot fail the stream themselves */
    return st == RT_OK ? rt_gpu_act_check(e->gpu, err) : st;
}

RtStatus rt_exec_call(RtExec *e, RtExecFn fn, RtStep *s) {
    RtStatus st = rt_exec_queue(e, fn, s);
    return st == RT_OK && (fn == RT_EXEC_FORWARD_BACKWARD || fn == RT_EXEC_FORWARD_LOSS) ? rt_exec_wait(e, s->err) : st;
}

RtStatus rt_exec_queue(RtExec *e, RtExecFn fn, RtStep *s) {
    const RtProgram *p = e->prog;
    const RtGpuProgram *g = e->gpu ? p->gpu : NULL;
    RtStatus (*f)(RtStep *) = NULL;
    static const char *const names[] = {"forward_backward", "forward_loss",  "forward_logits",
                                        "optimizer_update", "forward_stats", "forward_chunk"};
    switch (fn) {
    case RT_EXEC_FORWARD_BACKWARD: f = g ? g->forward_backward : p->forward_backward; break;
    case RT_EXEC_FORWARD_LOSS: f = g ? g->forward_loss : p->forward_loss; break;
    case RT_EXEC_FORWARD_LOGITS: f = g ? g->forward_logits : p->forward_logits; break;
    case RT_EXEC_UPDATE: f = g ? g->optimizer_update : p->optimizer_update; break;
    case RT_EXEC_FORWARD_STATS: f = g ? g->forward_stats : p->forward_stats; break;
    case RT_EXEC_FORWARD_CHUNK: f = g ? g->forward_chunk : p->forward_chunk; break;
    }
    if (!f) return rt_fail(s->err, RT_ERR_ARG, "the program has no %s for the %s", names[fn], g ? "GPU" : "CPU");
    /* the step's functions on the GPU as CUDA graphs, when they can be (gpu_graph.c); not a
     * forward_backward whose rt_grad_ready calls queue the data-parallel buckets' reductions on the
     * communication stream (train_dp.c): a graph would replay the launches without the host code
     * that queues them */
    if (g && fn == RT_EXEC_FORWARD_BACKWARD && s->grad_hook) return rt_gpu_call_eager(e->gpu, f, s);
    /* nor a function whose rt_param_need / rt_param_done calls map and gather ZeRO-3's parameters
     * between its launches (runtime/comm/zero3.c): the host's calls are the gathers */
    if (g && s->param_hook && (fn == RT_EXEC_FORWARD_BACKWARD || fn == RT_EXEC_FORWARD_LOSS || fn == RT_EXEC_FORWARD_STATS))
        return rt_gpu_call_eager(e->gpu, f, s);
    if (g && (fn == RT_EXEC_FORWARD_BACKWARD || fn == RT_EXEC_FORWARD_LOSS || fn == RT_EXEC_UPDATE))
        return rt_gpu_call(e->gpu, (int)fn, f, s);
    return f(s);
}

/* ---- the gradient region ------------------------------------------------------------------------ */

typedef struct RtGradJob {
    float *g;
    int64_t n;
    double *partial; /* one per block */
    float scale;
} RtGradJob;

static void rt_grad_sumsq(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    RtGradJob *j = ctx;
    for (int64_t blk = begin; blk < end; blk++) {
        int64_t b = blk * RT_GRAD_BLOCK, e = b + RT_GRAD_BLOCK < j->n ? b + RT_GRAD_BLOCK : j->n;
        double s = 0;
        for (int64_t i = b; i < e; i++) s += (double)j->g[i] * (double)j->g[i];
        j->partial[blk] = s;
    }
}

static void rt_grad_scale(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    RtGradJob *j = ctx;
    int64_t b = begin * RT_GRAD_BLOCK, e = end * RT_GRAD_BLOCK < j->n ? end * RT_GRAD_BLOCK : j->n;
    for (int64_t i = b; i < e; i++) j->g[i] *= j->scale;
}

static void rt_grad_zero(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    RtGradJob *j = ctx;
    int64_t b = begin * RT_GRAD_BLOCK, e = end * RT_GRAD_BLOCK < j->n ? end * RT_GRAD_BLOCK : j->n;
    memset(j->g + b, 0, (size_t)(e - b) * sizeof *j->g);
}

int64_t rt_exec_grad_blocks(const RtProgram *p) { return (p->param_floats + RT_GRAD_BLOCK - 1) / RT_GRAD_BLOCK; }

RtStatus rt_exec_grad_norm(RtExec *e, double *partial, double *norm, RtError *err) {
    int64_t n = e->prog->param_floats, nblocks = rt_exec_grad_blocks(e->prog);
    if (e->gpu) {
        RtStatus st = rt_gpu_sumsq_blocks(e->gpu, e->d_grads, n, RT_GRAD_BLOCK, partial, err);
        if (st != RT_OK) return st;
    } else {
        RtGradJob j = {e->grads, n, partial, 1.0f};
        rt_parallel_for(e->pool, nblocks, rt_grad_sumsq, &j);
    }
    double sumsq = 0;
    for (int64_t b = 0; b < nblocks; b++) sumsq += partial[b];
    *norm = sqrt(sumsq);
    return RT_OK;
}

void rt_exec_grad_norm_blocks(RtExec *e, double *partial, int64_t b0, int64_t b1) {
    RtGradJob j = {e->grads, e->prog->param_floats, partial, 1.0f};
    for (int64_t b = b0; b < b1; b++) rt_grad_sumsq(&j, b, b + 1, 0);
}

RtStatus rt_exec_grad_scale(RtExec *e, float scale, RtError *err) {
    if (e->gpu) return rt_gpu_scale(e->gpu, e->d_grads, scale, e->prog->param_floats, err);
    RtGradJob j = {e->grads, e->prog->param_floats, NULL, scale};
    rt_parallel_for(e->pool, rt_exec_grad_blocks(e->prog), rt_grad_scale, &j);
    return RT_OK;
}

RtStatus rt_exec_grad_zero(RtExec *e, RtError *err) {
    if (e->gpu) return rt_gpu_zero(e->gpu, e->d_grads, e->prog->param_floats * 4, err);
    RtGradJob j = {e->grads, e->prog->param_floats, NULL, 0};
    rt_parallel_for(e->pool, rt_exec_grad_blocks(e->prog), rt_grad_zero, &j);
    return RT_OK;
}

/* ---- the step's tree of partial sums ------------------------------------------------------------- */

typedef struct RtAddJob {
    float *dst;
    const float *src;
    int64_t n;
} RtAddJob;

static void rt_add_blocks(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    RtAddJob *j = ctx;
    int64_t b = begin * RT_GRAD_BLOCK, e = end * RT_GRAD_BLOCK < j->n ? end * RT_GRAD_BLOCK : j->n;
    for (int64_t i = b; i < e; i++) j->dst[i] += j->src[i];
}

void rt_host_add(RtPool *pool, float *dst, const float *src, int64_t n) {
    RtAddJob j = {dst, src, n};
    rt_parallel_for(pool, (n + RT_GRAD_BLOCK - 1) / RT_GRAD_BLOCK, rt_add_blocks, &j);
}

RtStatus rt_exec_tree_open(RtExec *e, int64_t leaves, RtError *err) {
    int need = 1; /* floor(log2 leaves) + 1 regions: the stack holds popcount(i) sums before leaf i */
    while (need <= RT_TREE_MAX && ((int64_t)1 << need) <= leaves) need++;
    if (need > RT_TREE_MAX)
        return rt_fail(err, RT_ERR_ARG, "%lld micro-batches a step are more than the gradient tree holds", (long long)leaves);
    e->tree[0] = e->gpu ? e->d_grads : e->grads;
    if (e->ntree < 1) e->ntree = 1;
    int64_t n = e->prog->param_floats;
    while (e->ntree < need) {
        RtStatus st = e->gpu ? rt_gpu_alloc(e->gpu, (void **)&e->tree[e->ntree], n * 4, "a partial sum of the gradient", err)
                             : rt_alloc_region((void **)&e->tree[e->ntree], n * 4, "partial sum of the gradient", err);
        if (st != RT_OK) return st;
        e->ntree++;
    }
    return RT_OK;
}

static RtStatus rt_exec_region_zero(RtExec *e, float *r, RtError *err) {
    int64_t n = e->prog->param_floats;
    if (e->gpu) return rt_gpu_zero(e->gpu, r, n * 4, err);
    RtGradJob j = {r, n, NULL, 0};
    rt_parallel_for(e->pool, rt_exec_grad_blocks(e->prog), rt_grad_zero, &j);
    return RT_OK;
}

static RtStatus rt_exec_region_add(RtExec *e, float *dst, const float *src, RtError *err) {
    int64_t n = e->prog->param_floats;
    if (e->gpu) return rt_gpu_axpy(e->gpu, dst, src, 1.0f, n, err); /* 1 x src is exact: dst + src rounded once */
    rt_host_add(e->pool, dst, src, n);
    return RT_OK;
}

RtStatus rt_exec_tree_leaf(RtExec *e, RtTree *t, float **region, RtError *err) {
    if (t->depth >= e->ntree)
        return rt_fail(err, RT_ERR_ARG, "the gradient tree is full (%d partial sums): more micro-batches than it was opened for",
                       e->ntree);
    *region = e->tree[t->depth];
    /* the gradient region is zero after the previous step's update (and at the start) */
    return t->depth == 0 ? RT_OK : rt_exec_region_zero(e, e->tree[t->depth], err);
}

RtStatus rt_exec_tree_push(RtExec *e, RtTree *t, RtError *err) {
    t->size[t->depth++] = 1;
    /* a binary counter: two sums of equal size become one, the older on the left */
    while (t->depth >= 2 && t->size[t->depth - 1] == t->size[t->depth - 2]) {
        RtStatus st = rt_exec_region_add(e, e->tree[t->depth - 2], e->tree[t->depth - 1], err);
        if (st != RT_OK) return st;
        t->size[t->depth - 2] *= 2;
        t->depth--;
    }
    return RT_OK;
}

void rt_exec_tree_fold_range(RtExec *e, const RtTree *t0, int64_t lo, int64_t hi) {
    RtTree t = *t0; /* a copy: rt_exec_tree_push then _finish's additions, over [lo, hi) alone */
    int64_t n = hi - lo;
    if (n <= 0) return;
    t.size[t.depth++] = 1;
    while (t.depth >= 2 && t.size[t.depth - 1] == t.size[t.depth - 2]) {
        rt_host_add(NULL, e->tree[t.depth - 2] + lo, e->tree[t.depth - 1] + lo, n);
        t.size[t.depth - 2] *= 2, t.depth--;
    }
    while (t.depth >= 2) {
        rt_host_add(NULL, e->tree[t.depth - 2] + lo, e->tree[t.depth - 1] + lo, n);
        t.size[t.depth - 2] += t.size[t.depth - 1], t.depth--;
    }
}

RtStatus rt_exec_tree_finish(RtExec *e, RtTree *t, RtError *err) {
    /* the unequal sums left (leaves not a power of two) fold from the right: a + (b + c) */
    while (t->depth >= 2) {
        RtStatus st = rt_exec_region_add(e, e->tree[t->depth - 2], e->tree[t->depth - 1], err);
        if (st != RT_OK) return st;
        t->size[t->depth - 2] += t->size[t->depth - 1];
        t->depth--;
    }
    return RT_OK;
}
