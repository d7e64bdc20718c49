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

/* ---- regions ------------------------------------------------------------------------------------ */

static RtStatus rt_alloc_region(void **out, int64_t bytes, const char *what, RtError *err) {
    *out = NULL;
    size_t n = bytes > 0 ? (size_t)bytes : RT_ALIGN;
    n = (n + RT_ALIGN - 1) / RT_ALIGN * RT_ALIGN;
    int rc = posix_memalign(out, RT_ALIGN, n);
    if (rc != 0) {
        *out = NULL;
        return rt_fail_errno(err, rc, "cannot allocate the %s (%lld bytes)", what, (long long)bytes);
    }
    memset(*out, 0, n);
    return RT_OK;
}

/* The batch buffers: page-locked on the GPU (uploads from them do not stage through a copy). */
static RtStatus rt_alloc_batch(RtExec *e, void **out, int64_t bytes, const char *what, RtError *err) {
    if (!e->gpu) return rt_alloc_region(out, bytes, what, err);
    return rt_gpu_host_alloc(e->gpu, out, bytes > 0 ? bytes : RT_ALIGN, what, err);
}

static RtStatus rt_exec_open_gpu(RtExec *e, int64_t tokens, RtError *err) {
    const RtProgram *p = e->prog;
    RtStatus st = rt_gpu_alloc(e->gpu, (void **)&e->d_params, p->param_floats * 4, "the parameter region", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_grads, p->param_floats * 4, "the gradient region", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_state, p->state_floats * 4, "the optimizer-state region", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_arena, p->arena_bytes, "the activation arena", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_x, tokens * 4, "the input batch", err);
    if (st == RT_OK) st = rt_gpu_alloc(e->gpu, (void **)&e->d_y, tokens * 4, "the target batch", err);
    return st;
}

RtStatus rt_exec_open(RtExec *e, const RtProgram *p, int threads, RtDeviceWant want, RtError *err) {
    memset(e, 0, sizeof *e);
    e->prog = p;
    if ((uint64_t)p->param_floats > (uint64_t)INT64_MAX / 4 || (uint64_t)p->state_floats > (uint64_t)INT64_MAX / 4)
        return rt_fail(err, RT_ERR_NOMEM, "cannot allocate %lld parameters", (long long)p->param_floats);
    int64_t tokens = p->train.micro * p->train.seq;
    if (p->logits_seq > tokens) tokens = p->logits_seq;
    RtStatus st = rt_gpu_open(&e->gpu, p->gpu, want, &e->cpu_reason, err);
    if (st != RT_OK && want == RT_DEVICE_CUDA) rt_error_context(err, "--device cuda");
    if (st == RT_OK) st = rt_pool_create(&e->pool, threads, err);
    if (st == RT_OK) st = rt_alloc_region((void **)&e->params, p->param_floats * 4, "parameter region", err);
    if (st == RT_OK) st = rt_alloc_region((void **)&e->grads, p->param_floats * 4, "gradient region", err);
    if (st == RT_OK) st = rt_alloc_region((void **)&e->state, p->state_floats * 4, "optimizer-state region", err);
    /* the host arena only where the host runs the program */
    if (st == RT_OK && !e->gpu) st = rt_alloc_region((void **)&e->arena, p->arena_bytes, "activation arena", err);
    if (st == RT_OK) st = rt_alloc_batch(e, (void **)&e->x, tokens * 4, "input batch", err);
    if (st == RT_OK) st = rt_alloc_batch(e, (void **)&e->y, tokens * 4, "target batch", err);
    if (st == RT_OK && e->gpu) st = rt_alloc_batch(e, (void **)&e->x_next, tokens * 4, "next input batch", err);
    if (st == RT_OK && e->gpu) st = rt_alloc_batch(e, (void **)&e->y_next, tokens * 4, "next target batch", err);
    if (st == RT_OK && e->gpu) st = rt_exec_open_gpu(e, tokens, err);
    if (st != RT_OK) rt_exec_close(e);
    return st;
}

void rt_exec_close(RtExec *e) {
    if (e->gpu) {
        rt_gpu_free(e->gpu, e->d_params);
        rt_gpu_free(e->gpu, e->d_grads);
        rt_gpu_free(e->gpu, e->d_state);
        rt_gpu_free(e->gpu, e->d_arena);
        rt_gpu_free(e->gpu, e->d_x);
        rt_gpu_free(e->gpu, e->d_y);
        rt_gpu_host_free(e->gpu, e->x);
        rt_gpu_host_free(e->gpu, e->y);
        rt_gpu_host_free(e->gpu, e->x_next);
        rt_gpu_host_free(e->gpu, e->y_next);
        rt_gpu_close(e->gpu);
    } else {
        free(e->x);
        free(e->y);
    }
    rt_pool_destroy(e->pool);
    free(e->params);
    free(e->grads);
    free(e->state);
    free(e->arena);
    memset(e, 0, sizeof *e);
}

const char *rt_exec_device(const RtExec *e) { return e->gpu ? rt_gpu_describe(e->gpu) : "cpu"; }

/* ---- host copies -------------------------------------------------------------------------------- */

RtStatus rt_exec_push(RtExec *e, RtError *err) {
    if (!e->gpu) return RT_OK;
    const RtProgram *p = e->prog;
    RtStatus st = rt_gpu_upload(e->gpu, e->d_params, e->params, p->param_floats * 4, err);
    if (st == RT_OK) st = rt_gpu_upload(e->gpu, e->d_state, e->state, p->state_floats * 4, err);
    return st == RT_OK ? rt_gpu_sync(e->gpu, "uploading the parameters and optimizer state", err) : st;
}

RtStatus rt_exec_pull(RtExec *e, int what, RtError *err) {
    if (!e->gpu) return RT_OK;
    const RtProgram *p = e->prog;
    RtStatus st = RT_OK;
    if (what & RT_PULL_PARAMS) st = rt_gpu_download(e->gpu, e->params, e->d_params, p->param_floats * 4, err);
    if (st == RT_OK && (what & RT_PULL_GRADS)) st = rt_gpu_download(e->gpu, e->grads, e->d_grads, p->param_floats * 4, err);
    if (st == RT_OK && (what & RT_PULL_STATE)) st = rt_gpu_download(e->gpu, e->state, e->d_state, p->state_floats * 4, err);
    return st;
}

RtStatus rt_exec_batch(RtExec *e, int64_t tokens, RtError *err) {
    if (!e->gpu) return RT_OK;
    RtStatus st = rt_gpu_upload(e->gpu, e->d_x, e->x, tokens * 4, err);
    return st == RT_OK ? rt_gpu_upload(e->gpu, e->d_y, e->y, tokens * 4, err) : st;
}

/* ---- calls -------------------------------------------------------------------------------------- */

RtStep rt_exec_step(const RtExec *e, RtError *err) {
    RtStep s = {.pool = e->pool, .err = err};
    if (e->gpu) {
        s.gpu = e->gpu;
        s.params = e->d_params, s.grads = e->d_grads, s.state = e->d_state, s.arena = e->d_arena;
        s.x = e->d_x, s.y = e->d_y;
    } else {
        s.params = e->params, s.grads = e->grads, s.state = e->state, s.arena = e->arena;
        s.x = e->x, s.y = e->y;
    }
    return s;
}

void rt_exec_flip(RtExec *e) {
    if (!e->gpu) return;
    int32_t *x = e->x, *y = e->y;
    e->x = e->x_next, e->y = e->y_next;
    e->x_next = x, e->y_next = y;
}

RtStatus rt_exec_wait(RtExec *e, RtError *err) {
    return e->gpu ? rt_gpu_sync(e->gpu, "waiting for the micro-batch", err) : RT_OK;
}

RtStatus rt_exec_call(RtExec *e, RtExecFn fn, RtStep *s) {
    RtStatus st = rt_exec_queue(e, fn, s);
    return st == RT_OK && (fn == RT_EXEC_FORWARD_BACKWARD || fn == RT_EXEC_FORWARD_LOSS) ? rt_exec_wait(e, s->err) : st;
}

RtStatus rt_exec_queue(RtExec *e, RtExecFn fn, RtStep *s) {
    const RtProgram *p = e->prog;
    const RtGpuProgram *g = e->gpu ? p->gpu : NULL;
    RtStatus (*f)(RtStep *) = NULL;
    static const char *const names[] = {"forward_backward", "forward_loss", "forward_logits", "optimizer_update",
                                        "forward_chunk"};
    switch (fn) {
    case RT_EXEC_FORWARD_BACKWARD: f = g ? g->forward_backward : p->forward_backward; break;
    case RT_EXEC_FORWARD_LOSS: f = g ? g->forward_loss : p->forward_loss; break;
    case RT_EXEC_FORWARD_LOGITS: f = g ? g->forward_logits : p->forward_logits; break;
    case RT_EXEC_UPDATE: f = g ? g->optimizer_update : p->optimizer_update; break;
    case RT_EXEC_FORWARD_CHUNK: f = g ? NULL : p->forward_chunk; break;
    }
    if (!f) return rt_fail(s->err, RT_ERR_ARG, "the program has no %s for the %s", names[fn], g ? "GPU" : "CPU");
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
