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

/* The region's resident bytes, by mincore. */
int64_t rt_zero3_resident(RtZero3 *z) {
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
    pthread_mutex_lock(&z->mu);
    while (z->posted && !z->finished) pthread_cond_wait(&z->cv, &z->mu);
    z->posted = 0;
    RtStatus st = z->st;
    if (st != RT_OK && err) *err = z->err;
    pthread_mutex_unlock(&z->mu);
    return st;
}

RtStatus rt_zero3_whole(RtZero3 *z, RtError *err) {
    RtStatus st = rt_zero3_settle(z, err);
    if (st == RT_OK) st = rt_comm_gather_shards(z->comm, z->base, z->off, err);
    return st == RT_OK ? st : rt_error_context(err, "ZeRO-3: gathering the whole parameter region");
}

void rt_zero3_release_all(RtZero3 *z) {
    int64_t np = z->map / z->page;
    memset(z->held, 0, (size_t)np * sizeof *z->held); /* between calls no gather is held */
    drop_pages(z, 0, np);
}

int64_t rt_zero3_high_water(const RtZero3 *z) { return z->high; }

void rt_zero3_reset_high_water(RtZero3 *z) { z->high = 0; }

void rt_zero3_stats(const RtZero3 *z, int64_t *gathers, int64_t *floats, double *waited_s, double *gather_s) {
    *gathers = z->gathers, *floats = z->floats, *waited_s = z->waited_s, *gather_s = z->gather_s;
}
