/* test_rt_pool.c - unit tests of runtime/pool.c, the thread pool behind rt_parallel_for: every
 * index is visited exactly once, in contiguous chunks, one per thread; results never depend on
 * the thread count; nested calls and the serial cases work; errors are clear.
 *
 * Build: make build/tests/test_rt_pool (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure. Under the asan
 * build the many-small-jobs case doubles as a race and leak check of the wake-up protocol. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include "rt_program.h"
#include "unit.h"

/* ---- coverage ----------------------------------------------------------------------------------- */

#define MAXCHUNK 128

typedef struct Visit {
    atomic_int *hits; /* per index */
    int64_t begin[MAXCHUNK], end[MAXCHUNK];
    int worker[MAXCHUNK];
    atomic_int nchunks;
    atomic_int bad_worker;
    int threads;
} Visit;

static void visit(void *ctx, int64_t begin, int64_t end, int worker) {
    Visit *v = ctx;
    int c = atomic_fetch_add(&v->nchunks, 1);
    if (c < MAXCHUNK) {
        v->begin[c] = begin;
        v->end[c] = end;
        v->worker[c] = worker;
    }
    if (worker < 0 || worker >= v->threads) atomic_store(&v->bad_worker, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&v->hits[i], 1);
}

static void each_index_once(void) {
    static const int64_t sizes[] = {0, 1, 2, 3, 5, 7, 64, 1000, 100003};
    for (int threads = 1; threads <= 5; threads++) {
        RtPool *p;
        RtError e;
        CHECK(rt_pool_create(&p, threads, &e) == RT_OK, "create %d threads: %s", threads, e.msg);
        CHECK(rt_pool_threads(p) == threads, "rt_pool_threads says %d, expected %d", rt_pool_threads(p), threads);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int64_t n = sizes[s];
            Visit v = {.threads = threads};
            v.hits = calloc((size_t)n + 1, sizeof *v.hits);
            rt_parallel_for(p, n, visit, &v);
            int64_t wrong = 0;
            for (int64_t i = 0; i < n; i++) wrong += atomic_load(&v.hits[i]) != 1;
            CHECK(wrong == 0, "%d threads, n %lld: %lld indices not visited exactly once", threads, (long long)n,
                  (long long)wrong);
            int k = atomic_load(&v.nchunks);
            int64_t want = n == 0 ? 0 : n < threads ? n : threads;
            CHECK(k == want, "%d threads, n %lld: %d chunks, expected %lld", threads, (long long)n, k, (long long)want);
            /* contiguous chunks of nearly equal size, each on a different worker */
            int64_t covered = 0, lo = n, hi = 0;
            for (int c = 0; c < k && c < MAXCHUNK; c++) {
                covered += v.end[c] - v.begin[c];
                int64_t len = v.end[c] - v.begin[c];
                if (len < lo) lo = len;
                if (len > hi) hi = len;
                for (int d = 0; d < c; d++)
                    CHECK(v.worker[d] != v.worker[c], "%d threads, n %lld: two chunks on worker %d", threads, (long long)n,
                          v.worker[c]);
            }
            CHECK(covered == n, "chunks cover %lld of %lld", (long long)covered, (long long)n);
            CHECK(k == 0 || hi - lo <= 1, "%d threads, n %lld: chunk sizes from %lld to %lld", threads, (long long)n,
                  (long long)lo, (long long)hi);
            CHECK(!atomic_load(&v.bad_worker), "a worker index outside [0, %d)", threads);
            free(v.hits);
        }
        rt_pool_destroy(p);
    }
}

/* ---- results do not depend on the thread count -------------------------------------------------- */

#define NBLOCK 4096
#define NVAL (NBLOCK * 37 + 11)

typedef struct Work {
    const float *in;
    float *out;
    double *partial; /* per fixed block of NBLOCK */
} Work;

static void work_elems(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    Work *w = ctx;
    for (int64_t i = begin; i < end; i++) w->out[i] = sinf(w->in[i]) * 0.5f + w->in[i] * w->in[i];
}

static void work_blocks(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    Work *w = ctx;
    for (int64_t b = begin; b < end; b++) {
        double s = 0;
        int64_t e = (b + 1) * NBLOCK < NVAL ? (b + 1) * NBLOCK : NVAL;
        for (int64_t i = b * NBLOCK; i < e; i++) s += w->out[i];
        w->partial[b] = s;
    }
}

static void thread_count_invariance(void) {
    float *in = malloc(NVAL * sizeof *in), *ref = malloc(NVAL * sizeof *ref), *out = malloc(NVAL * sizeof *out);
    int64_t nb = (NVAL + NBLOCK - 1) / NBLOCK;
    double *partial = malloc((size_t)nb * sizeof *partial);
    for (int64_t i = 0; i < NVAL; i++) in[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    double ref_sum = 0;
    for (int threads = 1; threads <= 4; threads++) {
        RtPool *p;
        RtError e;
        CHECK(rt_pool_create(&p, threads, &e) == RT_OK, "create: %s", e.msg);
        Work w = {in, threads == 1 ? ref : out, partial};
        rt_parallel_for(p, NVAL, work_elems, &w);
        rt_parallel_for(p, nb, work_blocks, &w);
        double sum = 0;
        for (int64_t b = 0; b < nb; b++) sum += partial[b]; /* blocks in order: the documented pattern */
        if (threads == 1) ref_sum = sum;
        else {
            CHECK(memcmp(ref, out, NVAL * sizeof *out) == 0, "elementwise results differ with %d threads", threads);
            CHECK(memcmp(&sum, &ref_sum, sizeof sum) == 0, "the block sum differs with %d threads: %.17g vs %.17g", threads, sum,
                  ref_sum);
        }
        rt_pool_destroy(p);
    }
    free(in);
    free(ref);
    free(out);
    free(partial);
}

/* ---- nesting, serial cases, many jobs ----------------------------------------------------------- */

typedef struct Nest {
    RtPool *pool;
    atomic_int inner_hits[64 * 16];
    atomic_int wrong_worker;
} Nest;

typedef struct Inner {
    Nest *n;
    int64_t row;
    int outer_worker;
} Inner;

static void inner(void *ctx, int64_t begin, int64_t end, int worker) {
    Inner *in = ctx;
    if (worker != in->outer_worker) atomic_store(&in->n->wrong_worker, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&in->n->inner_hits[in->row * 16 + i], 1);
}

static void outer(void *ctx, int64_t begin, int64_t end, int worker) {
    Nest *n = ctx;
    for (int64_t r = begin; r < end; r++) {
        Inner in = {n, r, worker};
        rt_parallel_for(n->pool, 16, inner, &in); /* the pool is busy: runs here, as this worker */
    }
}

static void nested_calls(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 3, &e) == RT_OK, "create: %s", e.msg);
    Nest *n = calloc(1, sizeof *n);
    n->pool = p;
    rt_parallel_for(p, 64, outer, n);
    int64_t wrong = 0;
    for (int i = 0; i < 64 * 16; i++) wrong += atomic_load(&n->inner_hits[i]) != 1;
    CHECK(wrong == 0, "%lld inner indices not visited exactly once", (long long)wrong);
    CHECK(!atomic_load(&n->wrong_worker), "a nested call did not report its thread's worker index");
    /* the pool still works after nesting */
    Visit v = {.threads = 3};
    v.hits = calloc(100, sizeof *v.hits);
    rt_parallel_for(p, 100, visit, &v);
    CHECK(atomic_load(&v.nchunks) == 3, "after nesting: %d chunks", atomic_load(&v.nchunks));
    free(v.hits);
    free(n);
    rt_pool_destroy(p);
}

static void serial_cases(void) {
    Visit v = {.threads = 1};
    v.hits = calloc(10, sizeof *v.hits);
    rt_parallel_for(NULL, 10, visit, &v);
    CHECK(atomic_load(&v.nchunks) == 1 && v.begin[0] == 0 && v.end[0] == 10 && v.worker[0] == 0,
          "a NULL pool runs one chunk [0, 10) on worker 0");
    CHECK(rt_pool_threads(NULL) == 1, "a NULL pool has %d threads", rt_pool_threads(NULL));
    rt_parallel_for(NULL, 0, visit, &v);
    rt_parallel_for(NULL, -5, visit, &v);
    CHECK(atomic_load(&v.nchunks) == 1, "an empty range ran fn");
    free(v.hits);
}

typedef struct Counter {
    int64_t *slots;
} Counter;

static void bump(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    Counter *c = ctx;
    for (int64_t i = begin; i < end; i++) c->slots[i]++;
}

static void many_small_jobs(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 4, &e) == RT_OK, "create: %s", e.msg);
    int64_t slots[8] = {0};
    Counter c = {slots};
    for (int j = 0; j < 5000; j++) rt_parallel_for(p, 8, bump, &c);
    for (int i = 0; i < 8; i++) CHECK(slots[i] == 5000, "slot %d counted %lld of 5000", i, (long long)slots[i]);
    rt_pool_destroy(p);
}

static void create_and_destroy(void) {
    RtError e;
    RtPool *p = (RtPool *)1;
    CHECK(rt_pool_create(&p, RT_POOL_MAX_THREADS + 1, &e) == RT_ERR_ARG && p == NULL, "too many threads accepted");
    CHECK_STR(e.msg, "cannot start 65 threads: at most 64 are supported", "message");
    int n = rt_cpu_count();
    CHECK(n >= 1 && n <= RT_POOL_MAX_THREADS, "rt_cpu_count() = %d", n);
    CHECK(rt_pool_create(&p, 0, &e) == RT_OK && rt_pool_threads(p) == n, "threads 0 should mean rt_cpu_count() = %d", n);
    rt_pool_destroy(p);
    rt_pool_destroy(NULL);
    for (int i = 0; i < 50; i++) { /* creation and teardown without a job */
        CHECK(rt_pool_create(&p, 3, &e) == RT_OK, "create: %s", e.msg);
        rt_pool_destroy(p);
    }
}

int main(void) {
    RUN(each_index_once);
    RUN(thread_count_invariance);
    RUN(nested_calls);
    RUN(serial_cases);
    RUN(many_small_jobs);
    RUN(create_and_destroy);
    return unit_finish();
}
