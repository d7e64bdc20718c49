/* zero3.c - ZeRO-3's parameter region: gathers around the step's uses, a prefetch thread, releases
 * by madvise, residency by mincore (zero3.h; docs/parallel.md, "ZeRO-3").
 *
 * The hook's calls come from the one thread that runs forward_backward, in the order the plan's
 * schedule fixes, which is the same on every rank: need(k) waits for gather k (or runs it itself
 * when none was started: the first of the call) and starts gather k + 1 on the thread; done(k)
 * releases. So the ranks' gathers, the only collectives while forward_backward runs, are called
 * in one order on every rank, one at a time (comm.h's rule), by whichever thread runs them. */
#include "zero3.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rt_exec.h"
#include "rt_gpu.h"

struct RtZero3 {
    RtComm *comm;
    float *base; /* the mapping: n floats, `map` bytes */
    int64_t n, map, lo, hi;
    const int64_t *off;
    int size;
    int64_t page;
    unsigned char *vec; /* mincore's */
    int64_t *sub;       /* a gather's shard boundaries (one gather runs at a time) */
    int32_t *held;      /* per page: the gathers holding a float of it (started, not released) */
    RtParamHook hook;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the gather handed to the thread: posted (0 none), running, finished; quit stops it */
    int posted, finished, quit;
    int64_t plo, phi;
    RtStatus st; /* the first failure (the hook cannot return one) */
    RtError err;
    int64_t high, gathers, floats;
    double waited_s, gather_s;
    /* on the GPU (rt_zero3_open_gpu): the region is the device's, pages of the allocation
     * granularity mapped on demand (gpu_vmm.c); host: the host's copy of the parameters (whole
     * after rt_zero3_whole; the own shard current at a step's start without NCCL, which the
     * host-staged gathers send from); the gathers queue on the region's stream, gather k + 1's
     * issued at gather k's need; slot: the next gather's event (two alternate) */
    RtGpu *gpu;
    RtGpuRegion *region;
    float *host, **dptr;
    int nccl, slot, pslot;
    int64_t *pages; /* scratch: the pages a release gives back */
    int early;      /* MBT_TEST_ZERO3_RELEASE_EARLY=1: a broken schedule (tests/gpu/run.sh) */
};

/* [lo, hi) of every rank's shard: the part each rank holds, clipped to the range. */
static RtStatus gather_range(RtZero3 *z, int64_t lo, int64_t hi, RtError *err) {
    int64_t *sub = z->sub;
    for (int j = 0; j <= z->size; j++) {
        int64_t b = z->off[j] < lo ? lo : z->off[j] > hi ? hi : z->off[j];
        sub[j] = b - lo;
    }
    double t0 = rt_now();
    RtStatus st = rt_comm_gather_shards(z->comm, z->base + lo, sub, err);
    double dt = rt_now() - t0;
    pthread_mutex_lock(&z->mu);
    z->gather_s += dt, z->gathers++;
    z->floats += hi - lo - (sub[rt_comm_rank(z->comm) + 1] - sub[rt_comm_rank(z->comm)]);
    pthread_mutex_unlock(&z->mu);
    return st;
}

static void *zero3_thread(void *arg) {
    RtZero3 *z = arg;
    pthread_mutex_lock(&z->mu);
    for (;;) {
        while (!z->quit && (!z->posted || z->finished)) pthread_cond_wait(&z->cv, &z->mu);
        if (z->quit) break;
        int64_t lo = z->plo, hi = z->phi;
        int failed = z->st != RT_OK;
        pthread_mutex_unlock(&z->mu);
        RtError e;
        RtStatus st = failed ? RT_OK : gather_range(z, lo, hi, &e);
        pthread_mutex_lock(&z->mu);
        if (st != RT_OK && z->st == RT_OK) z->st = st, z->err = e;
        z->finished = 1;
        pthread_cond_broadcast(&z->cv);
    }
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* The region's resident bytes, by mincore (the GPU's: its pages mapped). */
int64_t rt_zero3_resident(RtZero3 *z) {
    if (z->gpu) return rt_gpu_region_mapped(z->region) * z->page;
    if (mincore(z->base, (size_t)z->map, z->vec)) return -1;
    int64_t pages = 0, np = z->map / z->page;
    for (int64_t i = 0; i < np; i++) pages += z->vec[i] & 1;
    return pages * z->page;
}

static void sample(RtZero3 *z) {
    int64_t b = rt_zero3_resident(z);
    if (b > z->high) z->high = b;
}

/* The pages [lo, hi) floats touch. */
static void pages_of(const RtZero3 *z, int64_t lo, int64_t hi, int64_t *p0, int64_t *p1) {
    *p0 = lo * 4 / z->page, *p1 = (hi * 4 + z->page - 1) / z->page;
}

/* A gather of [lo, hi) starts: its pages are held (the step's thread alone counts). */
static void hold(RtZero3 *z, int64_t lo, int64_t hi) {
    int64_t p0, p1;
    pages_of(z, lo, hi, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) z->held[p]++;
}

/* Pages [p0, p1) that no gather holds and that hold nothing of this rank's shard, given back to
 * the system (a page a neighbouring gather still holds stays, and goes when that one is released). */
static void drop_pages(RtZero3 *z, int64_t p0, int64_t p1) {
    if (z->gpu) { /* the device's pages: unmapped once the launches queued so far are done */
        int64_t n = 0;
        for (int64_t p = p0; p < p1; p++) {
            int64_t f0 = p * z->page / 4, f1 = (p + 1) * z->page / 4;
            if (z->held[p] == 0 && (f1 <= z->lo || f0 >= z->hi)) z->pages[n++] = p;
        }
        RtError e;
        RtStatus st = rt_gpu_region_release(z->region, z->pages, n, &e);
        if (st != RT_OK && z->st == RT_OK) z->st = st, z->err = e;
        return;
    }
    int64_t run = -1;
    for (int64_t p = p0; p <= p1; p++) {
        int64_t f0 = p * z->page / 4, f1 = (p + 1) * z->page / 4; /* the floats of page p */
        int free_page = p < p1 && z->held[p] == 0 && (f1 <= z->lo || f0 >= z->hi);
        if (free_page && run < 0) run = p;
        if (!free_page && run >= 0) {
            (void)madvise((char *)z->base + run * z->page, (size_t)((p - run) * z->page), MADV_DONTNEED);
            run = -1;
        }
    }
}

/* A gather of [lo, hi) is released. */
static void release(RtZero3 *z, int64_t lo, int64_t hi) {
    int64_t p0, p1;
    pages_of(z, lo, hi, &p0, &p1);
    for (int64_t p = p0; p < p1; p++)
        if (z->held[p] > 0) z->held[p]--;
    drop_pages(z, p0, p1);
}

static void hook_need(void *ctx, int64_t lo, int64_t hi, int64_t next_lo, int64_t next_hi) {
    RtZero3 *z = ctx;
    pthread_mutex_lock(&z->mu);
    int mine = z->posted && z->plo == lo && z->phi == hi;
    if (z->posted && !mine && z->st == RT_OK) { /* the schedule and the calls disagree: cannot happen */
        z->st = rt_fail(&z->err, RT_ERR_ARG, "ZeRO-3: parameters [%lld, %lld) are needed while [%lld, %lld) is being gathered",
                        (long long)lo, (long long)hi, (long long)z->plo, (long long)z->phi);
    }
    if (z->posted) {
        double t0 = rt_now();
        while (!z->finished) pthread_cond_wait(&z->cv, &z->mu);
        z->waited_s += rt_now() - t0;
        z->posted = 0;
    }
    int failed = z->st != RT_OK;
    pthread_mutex_unlock(&z->mu);
    if (!mine && !failed) { /* the call's first gather: on this thread (the other is idle) */
        hold(z, lo, hi);
        RtError e;
        double t0 = rt_now();
        RtStatus st = gather_range(z, lo, hi, &e);
        pthread_mutex_lock(&z->mu);
        z->waited_s += rt_now() - t0;
        if (st != RT_OK && z->st == RT_OK) z->st = st, z->err = e;
        failed = z->st != RT_OK;
        pthread_mutex_unlock(&z->mu);
    }
    if (next_hi > next_lo && !failed) {
        hold(z, next_lo, next_hi);
        pthread_mutex_lock(&z->mu);
        z->plo = next_lo, z->phi = next_hi, z->posted = 1, z->finished = 0;
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
    }
    sample(z);
}

static void hook_done(void *ctx, int64_t lo, int64_t hi) {
    RtZero3 *z = ctx;
    sample(z);
    release(z, lo, hi);
}

/* ---- the GPU (rt_zero3_open_gpu) ---------------------------------------------------------------- */

/* The hook's first failure, kept for rt_zero3_settle. The generated function goes on launching
 * after it (the hook cannot stop it), and its kernels must not read unmapped pages (a fault would
 * end the run without the reason): the whole region is mapped, holding whatever it holds, until
 * the run stops at the settle. */
static void gpu_fail(RtZero3 *z, RtStatus st, const RtError *e) {
    if (st == RT_OK || z->st != RT_OK) return;
    z->st = st, z->err = *e;
    RtError ignored;
    (void)rt_gpu_region_map(z->region, 0, z->map / z->page, &ignored);
}

/* Gather [lo, hi) into the device's region (its pages held by the caller): the pages mapped, then
 * on the region's stream, after what the compute stream has queued so far, NCCL's gather of the
 * range GPU to GPU, or (no NCCL) the host's all-gather of its copy of the range and the other
 * ranks' parts uploaded; its event is slot `slot`'s. */
static RtStatus gather_gpu(RtZero3 *z, int64_t lo, int64_t hi, int slot, RtError *err) {
    int64_t p0, p1;
    pages_of(z, lo, hi, &p0, &p1);
    RtStatus st = rt_gpu_region_map(z->region, p0, p1, err);
    if (st != RT_OK) return st;
    int64_t *sub = z->sub;
    for (int j = 0; j <= z->size; j++) {
        int64_t b = z->off[j] < lo ? lo : z->off[j] > hi ? hi : z->off[j];
        sub[j] = b - lo;
    }
    int r = rt_comm_rank(z->comm);
    double t0 = rt_now();
    st = rt_gpu_region_begin(z->region, err);
    if (st == RT_OK && z->nccl) {
        rt_comm_nccl_queue_only(z->comm, 1); /* queued on the region's stream; the compute stream waits for it */
        st = rt_comm_gather_shards(z->comm, z->base + lo, sub, err);
        rt_comm_nccl_queue_only(z->comm, 0);
    } else if (st == RT_OK) {
        st = rt_comm_gather_shards(z->comm, z->host + lo, sub, err); /* host memory: every rank's part */
        int64_t a = lo + sub[r], b = lo + sub[r + 1];                /* this rank's part, on the device already */
        if (st == RT_OK && a > lo) st = rt_gpu_upload(z->gpu, z->base + lo, z->host + lo, (a - lo) * 4, err);
        if (st == RT_OK && hi > b) st = rt_gpu_upload(z->gpu, z->base + b, z->host + b, (hi - b) * 4, err);
    }
    RtStatus est = rt_gpu_region_end(z->region, slot, st == RT_OK ? err : NULL);
    if (st == RT_OK) st = est;
    z->gather_s += rt_now() - t0, z->gathers++;
    z->floats += hi - lo - (sub[r + 1] - sub[r]);
    return st == RT_OK
               ? st
               : rt_error_context(err, "ZeRO-3: gathering parameters [%lld, %lld) on the GPU", (long long)lo, (long long)hi);
}

static void gpu_sample(RtZero3 *z) {
    int64_t b = rt_gpu_region_mapped(z->region) * z->page;
    if (b > z->high) z->high = b;
}

static void hook_need_gpu(void *ctx, int64_t lo, int64_t hi, int64_t next_lo, int64_t next_hi) {
    RtZero3 *z = ctx;
    if (z->st != RT_OK) return;
    RtError e;
    RtStatus st = rt_gpu_region_reclaim(z->region, 0, &e); /* the releases the GPU is done with */
    int mine = z->posted && z->plo == lo && z->phi == hi;
    if (st == RT_OK && z->posted && !mine) /* the schedule and the calls disagree: cannot happen */
        st = rt_fail(&e, RT_ERR_ARG, "ZeRO-3: parameters [%lld, %lld) are needed while [%lld, %lld) is being gathered",
                     (long long)lo, (long long)hi, (long long)z->plo, (long long)z->phi);
    int slot = z->pslot;
    if (st == RT_OK && !mine) { /* the call's first gather */
        hold(z, lo, hi);
        slot = z->slot++ & 1;
        double t0 = rt_now();
        st = gather_gpu(z, lo, hi, slot, &e);
        z->waited_s += rt_now() - t0;
    }
    z->posted = 0;
    if (st == RT_OK) st = rt_gpu_region_wait(z->region, slot, &e); /* the launches after this wait for its data */
    if (st == RT_OK && z->early) {                                 /* the test's broken schedule: released before its launches */
        int64_t p0, p1;
        pages_of(z, lo, hi, &p0, &p1);
        int64_t n = 0;
        for (int64_t p = p0; p < p1; p++) {
            int64_t f0 = p * z->page / 4, f1 = (p + 1) * z->page / 4;
            if (f1 <= z->lo || f0 >= z->hi) z->pages[n++] = p;
        }
        st = rt_gpu_region_unmap_now(z->region, z->pages, n, &e);
    }
    if (st == RT_OK && next_hi > next_lo) { /* the next one, on the region's stream while these launches run */
        hold(z, next_lo, next_hi);
        z->pslot = z->slot++ & 1;
        st = gather_gpu(z, next_lo, next_hi, z->pslot, &e);
        if (st == RT_OK) z->plo = next_lo, z->phi = next_hi, z->posted = 1;
    }
    gpu_fail(z, st, &e);
    gpu_sample(z);
}

static void hook_done_gpu(void *ctx, int64_t lo, int64_t hi) {
    RtZero3 *z = ctx;
    if (z->st != RT_OK) return;
    gpu_sample(z);
    release(z, lo, hi);
}

static RtStatus zero3_alloc(RtZero3 **out, RtComm *c, int64_t n, const int64_t *off, RtError *err) {
    RtZero3 *z = calloc(1, sizeof *z);
    if (!z) return rt_fail_errno(err, ENOMEM, "ZeRO-3: cannot allocate its state");
    int size = rt_comm_size(c), rank = rt_comm_rank(c);
    z->comm = c, z->n = n, z->off = off, z->size = size, z->lo = off[rank], z->hi = off[rank + 1];
    z->sub = malloc(sizeof *z->sub * (size_t)(size + 1));
    if (!z->sub) {
        free(z);
        return rt_fail_errno(err, ENOMEM, "ZeRO-3: cannot allocate its state");
    }
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    *out = z;
    return RT_OK;
}

RtStatus rt_zero3_open_gpu(RtZero3 **out, RtComm *c, RtGpu *g, float *host, float **d_params, int64_t n, const int64_t *off,
                           RtError *err) {
    *out = NULL;
    RtZero3 *z = NULL;
    RtStatus st = zero3_alloc(&z, c, n, off, err);
    if (st != RT_OK) return st;
    z->gpu = g, z->host = host, z->dptr = d_params, z->nccl = rt_comm_nccl(c);
    const char *early = getenv("MBT_TEST_ZERO3_RELEASE_EARLY");
    z->early = early && *early == '1';
    void *base = NULL;
    st = rt_gpu_region_open(g, n * 4, &z->region, &base, &z->page, err);
    if (st == RT_OK) {
        z->map = (n * 4 + z->page - 1) / z->page * z->page;
        if (z->map == 0) z->map = z->page;
        z->held = calloc((size_t)(z->map / z->page) + 1, sizeof *z->held);
        z->pages = calloc((size_t)(z->map / z->page) + 1, sizeof *z->pages);
        if (!z->held || !z->pages) st = rt_fail_errno(err, ENOMEM, "ZeRO-3: cannot allocate its pages");
    }
    /* the device's whole region goes; this rank's shard is mapped for good and uploaded from the
     * host's copy (whole: initialised or read alike on every rank) */
    if (st == RT_OK) {
        rt_gpu_free(g, *d_params);
        *d_params = z->base = base;
        int64_t p0, p1;
        pages_of(z, z->lo, z->hi, &p0, &p1);
        if (z->hi > z->lo) st = rt_gpu_region_map(z->region, p0, p1, err);
        if (st == RT_OK && z->hi > z->lo) st = rt_gpu_upload(g, z->base + z->lo, host + z->lo, (z->hi - z->lo) * 4, err);
        if (st == RT_OK) st = rt_gpu_sync(g, "ZeRO-3: uploading this rank's shard of the parameters", err);
    }
    if (st != RT_OK) {
        rt_zero3_close(z, NULL);
        return rt_error_context(err, "ZeRO-3: the parameter region on the GPU");
    }
    z->hook = (RtParamHook){hook_need_gpu, hook_done_gpu, z};
    *out = z;
    return RT_OK;
}

int64_t rt_zero3_page(const RtZero3 *z) { return z->page; }

int rt_zero3_on_gpu(const RtZero3 *z) { return z && z->gpu; }

RtStatus rt_zero3_open(RtZero3 **out, RtComm *c, float **params, int64_t n, const int64_t *off, RtError *err) {
    *out = NULL;
    int size = rt_comm_size(c), rank = rt_comm_rank(c);
    RtZero3 *z = calloc(1, sizeof *z);
    if (!z) return rt_fail_errno(err, ENOMEM, "ZeRO-3: cannot allocate its state");
    z->comm = c, z->n = n, z->off = off, z->size = size, z->lo = off[rank], z->hi = off[rank + 1];
    z->page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    z->map = ((n > 0 ? n : 1) * 4 + z->page - 1) / z->page * z->page;
    void *m = mmap(NULL, (size_t)z->map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    z->vec = malloc((size_t)(z->map / z->page) + 1);
    z->sub = malloc(sizeof *z->sub * (size_t)(size + 1));
    z->held = calloc((size_t)(z->map / z->page) + 1, sizeof *z->held);
    if (m == MAP_FAILED || !z->vec || !z->sub || !z->held) {
        int e = m == MAP_FAILED ? errno : ENOMEM;
        if (m != MAP_FAILED) munmap(m, (size_t)z->map);
        free(z->vec), free(z->sub), free(z->held), free(z);
        return rt_fail_errno(err, e, "ZeRO-3: cannot map the parameter region (%lld bytes)", (long long)(n * 4));
    }
    /* 4 KiB pages: a huge page would be resident whole for any part of it a gather fills */
#ifdef MADV_NOHUGEPAGE
    (void)madvise(m, (size_t)z->map, MADV_NOHUGEPAGE);
#endif
    z->base = m;
    memcpy(z->base, *params, (size_t)n * 4);
    free(*params);
    *params = z->base;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    if (pthread_create(&z->thread, NULL, zero3_thread, z)) {
        rt_zero3_close(z, params);
        return rt_fail(err, RT_ERR_NOMEM, "ZeRO-3: cannot start the gathers' thread");
    }
    z->started = 1;
    z->hook = (RtParamHook){hook_need, hook_done, z};
    *out = z;
    return RT_OK;
}

void rt_zero3_close(RtZero3 *z, float **params) {
    if (!z) return;
    if (z->gpu) { /* the device's region (RtExec's d_params) */
        rt_gpu_region_close(z->region);
        if (z->dptr && *z->dptr == z->base) *z->dptr = NULL;
        pthread_mutex_destroy(&z->mu);
        pthread_cond_destroy(&z->cv);
        free(z->sub), free(z->held), free(z->pages), free(z);
        return;
    }
    if (z->started) {
        pthread_mutex_lock(&z->mu);
        while (z->posted && !z->finished) pthread_cond_wait(&z->cv, &z->mu);
        z->quit = 1;
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
        pthread_join(z->thread, NULL);
    }
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    munmap(z->base, (size_t)z->map);
    if (params && *params == z->base) *params = NULL;
    free(z->vec);
    free(z->sub);
    free(z->held);
    free(z);
}

const RtParamHook *rt_zero3_hook(RtZero3 *z) { return &z->hook; }

RtStatus rt_zero3_settle(RtZero3 *z, RtError *err) {
    if (z->gpu) { /* a gather prefetched by a call that failed is on the stream: it lands harmlessly */
        z->posted = 0;
        /* over NCCL: the GPU's work polled against the world's timeout (a rank that stopped ends the
         * wait with an error, not a hang in the stream's synchronisation) */
        if (z->st == RT_OK && z->nccl) {
            RtError e;
            RtStatus st = rt_comm_nccl_settle(z->comm, "ZeRO-3: the parameter gathers over NCCL", &e);
            gpu_fail(z, st, &e);
        }
        if (z->st != RT_OK && err) *err = z->err;
        return z->st;
    }
    pthread_mutex_lock(&z->mu);
    while (z->posted && !z->finished) pthread_cond_wait(&z->cv, &z->mu);
    z->posted = 0;
    RtStatus st = z->st;
    if (st != RT_OK && err) *err = z->err;
    pthread_mutex_unlock(&z->mu);
    return st;
}

/* The GPU's whole region: every page mapped and filled, and the host's copy whole too (what
 * reads the parameters reads the host's: checkpoints, --save-weights, --dump-step). */
static RtStatus whole_gpu(RtZero3 *z, RtError *err) {
    int64_t np = z->map / z->page, len = z->hi - z->lo;
    RtStatus st = rt_gpu_region_map(z->region, 0, np, err);
    if (st == RT_OK && z->nccl) { /* GPU to GPU, then the whole region down */
        st = rt_comm_gather_shards(z->comm, z->base, z->off, err);
        if (st == RT_OK) st = rt_gpu_download(z->gpu, z->host, z->base, z->n * 4, err);
    } else if (st == RT_OK) { /* this rank's shard down, every rank's gathered on the host, the others' up */
        if (len > 0) st = rt_gpu_download(z->gpu, z->host + z->lo, z->base + z->lo, len * 4, err);
        if (st == RT_OK) st = rt_gpu_sync(z->gpu, "ZeRO-3: downloading this rank's shard", err);
        if (st == RT_OK) st = rt_comm_gather_shards(z->comm, z->host, z->off, err);
        if (st == RT_OK && z->lo > 0) st = rt_gpu_upload(z->gpu, z->base, z->host, z->lo * 4, err);
        if (st == RT_OK && z->n > z->hi) st = rt_gpu_upload(z->gpu, z->base + z->hi, z->host + z->hi, (z->n - z->hi) * 4, err);
    }
    return st == RT_OK ? rt_gpu_sync(z->gpu, "ZeRO-3: gathering the whole parameter region", err) : st;
}

RtStatus rt_zero3_whole(RtZero3 *z, RtError *err) {
    if (z->gpu) {
        RtStatus st = rt_zero3_settle(z, err);
        if (st == RT_OK) st = whole_gpu(z, err);
        return st == RT_OK ? st : rt_error_context(err, "ZeRO-3: gathering the whole parameter region");
    }
    RtStatus st = rt_zero3_settle(z, err);
    if (st == RT_OK) st = rt_comm_gather_shards(z->comm, z->base, z->off, err);
    return st == RT_OK ? st : rt_error_context(err, "ZeRO-3: gathering the whole parameter region");
}

void rt_zero3_release_all(RtZero3 *z) {
    int64_t np = z->map / z->page;
    if (z->gpu) { /* after the GPU is done: every page but the shard's unmapped; without NCCL the
                   * host's copy of the shard made current (the update wrote the device's) */
        if (z->st != RT_OK) return;
        RtError e;
        int64_t n = 0;
        for (int64_t p = 0; p < np; p++) {
            int64_t f0 = p * z->page / 4, f1 = (p + 1) * z->page / 4;
            if (f1 <= z->lo || f0 >= z->hi) z->pages[n++] = p;
        }
        memset(z->held, 0, (size_t)np * sizeof *z->held);
        z->posted = 0;
        RtStatus st = rt_gpu_region_unmap_now(z->region, z->pages, n, &e);
        if (st == RT_OK && !z->nccl && z->hi > z->lo)
            st = rt_gpu_download(z->gpu, z->host + z->lo, z->base + z->lo, (z->hi - z->lo) * 4, &e);
        if (st == RT_OK) st = rt_gpu_sync(z->gpu, "ZeRO-3: this rank's shard of the parameters", &e);
        gpu_fail(z, st, &e);
        return;
    }
    memset(z->held, 0, (size_t)np * sizeof *z->held); /* between calls no gather is held */
    drop_pages(z, 0, np);
}

int64_t rt_zero3_high_water(const RtZero3 *z) { return z->high; }

void rt_zero3_reset_high_water(RtZero3 *z) { z->high = 0; }

void rt_zero3_stats(const RtZero3 *z, int64_t *gathers, int64_t *floats, double *waited_s, double *gather_s) {
    *gathers = z->gathers, *floats = z->floats, *waited_s = z->waited_s, *gather_s = z->gather_s;
}
