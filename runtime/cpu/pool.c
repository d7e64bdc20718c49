/* pool.c - the runtime's thread pool: a fixed set of pthreads that split a range of indices into
 * contiguous chunks (see rt_program.h, rt_parallel_for).
 *
 * Pipeline position: under every CPU kernel. The generated step functions and rt_sgemm_batched
 * parallelise with rt_parallel_for; the train loop uses it for initialisation, the gradient norm
 * and zeroing. One pool is created per run (`--threads N`) and lives until the run ends.
 *
 * Design. Workers sleep on a condition variable and wake when the job generation changes; the
 * calling thread runs chunk 0 itself, then waits for the others. A chunk's bounds depend only on
 * (n, number of chunks), and the contract of rt_parallel_for is that each index's result depends
 * on that index alone, so a result never depends on the thread count or on timing. The pool's
 * mutex, condition variables and job fields are the only mutable state shared between threads.
 *
 * A lock, unlock or wait on a valid mutex cannot fail; if one does, memory is corrupt and the
 * process stops with an internal error (exit status 2) rather than compute on. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_profile.h"
#include "rt_program.h"

/* ---- checks ------------------------------------------------------------------------------------- */

static void rt_pool_die(int rc, const char *what, const char *file, int line) {
    char buf[256];
    const char *why = strerror_r(rc, buf, sizeof buf);
    fprintf(stderr, "internal error at %s:%d: thread pool: %s: %s\n", file, line, what, why);
    fflush(stderr);
    _exit(2);
}

#define RT_PT(call, what)                                                                                                        \
    do {                                                                                                                         \
        int rc_ = (call);                                                                                                        \
        if (rc_ != 0) rt_pool_die(rc_, what, __FILE__, __LINE__);                                                                \
    } while (0)

/* ---- the pool ----------------------------------------------------------------------------------- */

struct RtPool {
    int nthreads;
    pthread_t *threads; /* workers 1..nthreads-1 (index 0 unused: the caller is worker 0) */
    int started;        /* workers created so far */
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* generation changed, or stop */
    pthread_cond_t done_cv; /* pending reached 0 */
    uint64_t generation;    /* bumped for each job */
    int pending;            /* workers that have not finished the current job */
    int busy;               /* a job is running: further calls run serially */
    int stop;
    /* the current job */
    RtRangeFn fn;
    void *ctx;
    int64_t n;
    int nchunks;
    RtProfile *prof; /* MBT_PROFILE: parallel loops add their wall time (rt_profile.h); NULL: off */
};

typedef struct RtWorkerArg {
    RtPool *pool;
    int index;
} RtWorkerArg;

/* Chunk i of n indices cut into k parts: the first n % k chunks have one index more. */
static void rt_chunk(int64_t n, int k, int i, int64_t *begin, int64_t *end) {
    int64_t base = n / k, rem = n % k;
    *begin = (int64_t)i * base + (i < rem ? i : rem);
    *end = *begin + base + (i < rem ? 1 : 0);
}

static void *rt_worker_main(void *arg) {
    RtWorkerArg a = *(RtWorkerArg *)arg;
    free(arg);
    RtPool *p = a.pool;
    uint64_t seen = 0;
    RT_PT(pthread_mutex_lock(&p->mu), "locking the pool in a worker");
    for (;;) {
        while (!p->stop && p->generation == seen) RT_PT(pthread_cond_wait(&p->work_cv, &p->mu), "waiting for work");
        if (p->stop) break;
        seen = p->generation;
        RtRangeFn fn = p->fn;
        void *ctx = p->ctx;
        int64_t n = p->n;
        int k = p->nchunks;
        RT_PT(pthread_mutex_unlock(&p->mu), "unlocking the pool in a worker");
        if (a.index < k) {
            int64_t b, e;
            rt_chunk(n, k, a.index, &b, &e);
            if (e > b) fn(ctx, b, e, a.index);
        }
        RT_PT(pthread_mutex_lock(&p->mu), "locking the pool in a worker");
        if (--p->pending == 0) RT_PT(pthread_cond_signal(&p->done_cv), "signalling the end of a job");
    }
    RT_PT(pthread_mutex_unlock(&p->mu), "unlocking the pool in a worker");
    return NULL;
}

int rt_cpu_count(void) {
    int n = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n < 1) {
        long m = sysconf(_SC_NPROCESSORS_ONLN);
        n = m > 0 ? (m > RT_POOL_MAX_THREADS ? RT_POOL_MAX_THREADS : (int)m) : 1;
    }
    return n > RT_POOL_MAX_THREADS ? RT_POOL_MAX_THREADS : n;
}

RtStatus rt_pool_create(RtPool **out, int nthreads, RtError *err) {
    *out = NULL;
    if (nthreads <= 0) nthreads = rt_cpu_count();
    if (nthreads > RT_POOL_MAX_THREADS)
        return rt_fail(err, RT_ERR_ARG, "cannot start %d threads: at most %d are supported", nthreads, RT_POOL_MAX_THREADS);
    RtPool *p = calloc(1, sizeof *p);
    if (!p) return rt_fail_errno(err, ENOMEM, "cannot create a pool of %d threads", nthreads);
    p->nthreads = nthreads;
    int rc = pthread_mutex_init(&p->mu, NULL);
    if (rc != 0) {
        free(p);
        return rt_fail_errno(err, rc, "cannot create the thread pool's mutex");
    }
    rc = pthread_cond_init(&p->work_cv, NULL);
    if (rc != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return rt_fail_errno(err, rc, "cannot create the thread pool's condition variable");
    }
    rc = pthread_cond_init(&p->done_cv, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return rt_fail_errno(err, rc, "cannot create the thread pool's condition variable");
    }
    p->started = 1;
    if (nthreads > 1) {
        p->threads = calloc((size_t)nthreads, sizeof *p->threads);
        if (!p->threads) {
            rt_pool_destroy(p);
            return rt_fail_errno(err, ENOMEM, "cannot create a pool of %d threads", nthreads);
        }
    }
    for (int i = 1; i < nthreads; i++) {
        RtWorkerArg *a = malloc(sizeof *a);
        if (!a) {
            rt_pool_destroy(p);
            return rt_fail_errno(err, ENOMEM, "cannot start thread %d of %d", i + 1, nthreads);
        }
        a->pool = p;
        a->index = i;
        rc = pthread_create(&p->threads[i], NULL, rt_worker_main, a);
        if (rc != 0) {
            free(a);
            rt_pool_destroy(p);
            return rt_fail_errno(err, rc, "cannot start thread %d of %d", i + 1, nthreads);
        }
        p->started = i + 1;
    }
    *out = p;
    return RT_OK;
}

void rt_pool_destroy(RtPool *p) {
    if (!p) return;
    RT_PT(pthread_mutex_lock(&p->mu), "locking the pool to stop it");
    p->stop = 1;
    RT_PT(pthread_cond_broadcast(&p->work_cv), "waking the workers to stop");
    RT_PT(pthread_mutex_unlock(&p->mu), "unlocking the pool to stop it");
    for (int i = 1; i < p->started; i++) RT_PT(pthread_join(p->threads[i], NULL), "joining a worker");
    RT_PT(pthread_cond_destroy(&p->done_cv), "destroying a condition variable");
    RT_PT(pthread_cond_destroy(&p->work_cv), "destroying a condition variable");
    RT_PT(pthread_mutex_destroy(&p->mu), "destroying the pool's mutex");
    free(p->threads);
    free(p);
}

int rt_pool_threads(const RtPool *p) { return p ? p->nthreads : 1; }

void rt_pool_set_profile(RtPool *p, RtProfile *prof) {
    if (p) p->prof = prof;
}

RtProfile *rt_pool_profile(const RtPool *p) { return p ? p->prof : NULL; }

/* ---- running a range ---------------------------------------------------------------------------- */

static void rt_parallel_for_run(RtPool *p, int64_t n, RtRangeFn fn, void *ctx);

void rt_parallel_for(RtPool *p, int64_t n, RtRangeFn fn, void *ctx) {
    if (n <= 0) return;
    RtProfile *prof = p ? p->prof : NULL;
    if (prof && prof->depth == 0) { /* a top-level loop outside any GEMM: time it */
        prof->depth = 1;
        double t0 = rt_profile_now();
        rt_parallel_for_run(p, n, fn, ctx);
        prof->pool_s += rt_profile_now() - t0;
        prof->pool_calls++;
        prof->depth = 0;
        return;
    }
    rt_parallel_for_run(p, n, fn, ctx);
}

static void rt_parallel_for_run(RtPool *p, int64_t n, RtRangeFn fn, void *ctx) {
    if (!p || p->nthreads == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    RT_PT(pthread_mutex_lock(&p->mu), "locking the pool");
    if (p->busy) {
        /* Nested (from inside fn) or concurrent: the workers are taken, so run it here, as the
         * worker the calling thread is, so that per-worker scratch stays its own. */
        pthread_t self = pthread_self();
        int me = 0;
        for (int i = 1; i < p->started; i++)
            if (pthread_equal(self, p->threads[i])) me = i;
        RT_PT(pthread_mutex_unlock(&p->mu), "unlocking the pool");
        fn(ctx, 0, n, me);
        return;
    }
    p->busy = 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->nchunks = n < p->nthreads ? (int)n : p->nthreads;
    p->pending = p->nthreads - 1;
    p->generation++;
    RT_PT(pthread_cond_broadcast(&p->work_cv), "waking the workers");
    int k = p->nchunks;
    RT_PT(pthread_mutex_unlock(&p->mu), "unlocking the pool");
    int64_t b, e;
    rt_chunk(n, k, 0, &b, &e);
    fn(ctx, b, e, 0);
    RT_PT(pthread_mutex_lock(&p->mu), "locking the pool");
    while (p->pending > 0) RT_PT(pthread_cond_wait(&p->done_cv, &p->mu), "waiting for the workers");
    p->busy = 0;
    RT_PT(pthread_mutex_unlock(&p->mu), "unlocking the pool");
}
