/* dp_reduce.c - the gradient summed over the ranks in buckets by a communication thread
 * (dp_reduce.h; docs/parallel.md). */
#include "dp_reduce.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { RT_DP_EXCHANGE, RT_DP_GATHER };

typedef struct {
    int kind, bucket;
} RtDpJob;

struct RtDpReduce {
    RtComm *comm;
    RtPool *pool;
    int rank, size, nbuckets;
    int64_t n, bucket_floats, most; /* most: the largest shard of any bucket on this rank */
    int64_t *off;                   /* bucket b's shard boundaries: off[b x (size + 1) + j], absolute */
    int64_t *rel;                   /* the thread's: one bucket's, from its start */
    float *got[2];                  /* every rank's copy of this rank's shard: buckets b, b + 1 alternate */
    /* ZeRO-2's buckets by shard (rt_dp_reduce_open_shards): each bucket cut at the ZeRO shards'
     * boundaries, rank r's piece summed back into place (v's shard r becomes this rank's shard of
     * the micro-batch block's sum), nothing gathered; one receive buffer (got[0]) */
    int shards;
    float *v; /* the vector of the run under way */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    RtDpJob *jobs; /* this run's collectives, in the order every rank runs them */
    int posted, done, quit;
    RtStatus status; /* the first failure of the run, with its message in e */
    RtError e;
    double comm_s, wait_s; /* over every run: the thread in collectives; the caller waiting */
    int64_t runs;
    /* the overlapped run (rt_dp_reduce_begin .. finish): the thread takes bucket next once its
     * elements are all ready (ready[b] >= need[b], or all of them after the backward), folds it
     * (fold), exchanges, sums and gathers it */
    int ovl, next, ovl_done, all_ready;
    int64_t *ready, *need;
    double *t_ready, *t_start; /* this run's: when bucket b became ready, when the thread took it (0: not yet) */
    RtDpFold fold;
    void *fold_ctx;
    double t_end; /* rt_dp_reduce_finish's call: the end of the backward */
    int64_t ovl_runs, ready_before, started_before, buckets_seen;
    double lead_s; /* over every overlapped run: the largest start before the backward's end */
};

RtStatus rt_dp_bucket_env(int64_t *floats, RtError *err) {
    const char *s = getenv("MBT_DP_BUCKET_MB");
    double mb = 25;
    if (s && *s) {
        char *end;
        errno = 0;
        mb = strtod(s, &end);
        if (errno || *end || !(mb > 0) || mb > 1e6)
            return rt_fail(err, RT_ERR_ARG, "MBT_DP_BUCKET_MB is '%s': it must be a number of megabytes above 0, at most 1e6", s);
    }
    int64_t f = (int64_t)(mb * 1e6 / sizeof(float)) / RT_GRAD_BLOCK * RT_GRAD_BLOCK;
    *floats = f < RT_GRAD_BLOCK ? RT_GRAD_BLOCK : f;
    return RT_OK;
}

void rt_dp_tree_walk(int n, void (*add)(void *ctx, int a, int b), void *ctx) {
    int at[RT_TREE_MAX + 1];
    int64_t size[RT_TREE_MAX + 1];
    int d = 0;
    for (int i = 0; i < n; i++) {
        at[d] = i, size[d++] = 1;
        while (d >= 2 && size[d - 1] == size[d - 2]) {
            add(ctx, at[d - 2], at[d - 1]);
            size[d - 2] *= 2, d--;
        }
    }
    while (d >= 2) {
        add(ctx, at[d - 2], at[d - 1]);
        size[d - 2] += size[d - 1], d--;
    }
}

typedef struct {
    RtPool *pool;
    float *v;
    int64_t len;
} RtHostTree;

static void rt_host_tree_add(void *ctx, int a, int b) {
    RtHostTree *t = ctx;
    rt_host_add(t->pool, t->v + a * t->len, t->v + b * t->len, t->len);
}

void rt_dp_tree_sum_f32(RtPool *pool, float *v, int n, int64_t len) {
    RtHostTree t = {pool, v, len};
    rt_dp_tree_walk(n, rt_host_tree_add, &t);
}

static const int64_t *bucket_off(const RtDpReduce *d, int b) { return d->off + (int64_t)b * (d->size + 1); }

/* Bucket b's receive buffer: two alternate after the backward (rt_dp_reduce_run); the shard
 * mode's thread takes one bucket at a time and has one. */
static float *bucket_got(const RtDpReduce *d, int b) { return d->shards ? d->got[0] : d->got[b & 1]; }

/* One collective of the run, on the thread. The offsets passed are relative to the bucket's
 * start: the collectives see the bucket as a vector of its own. */
static RtStatus run_job(RtDpReduce *d, RtDpJob j, RtError *err) {
    const int64_t *abs = bucket_off(d, j.bucket);
    int64_t lo = abs[0];
    for (int k = 0; k <= d->size; k++) d->rel[k] = abs[k] - lo;
    if (j.kind == RT_DP_EXCHANGE) return rt_comm_exchange_shards(d->comm, d->v + lo, d->rel, bucket_got(d, j.bucket), err);
    return rt_comm_gather_shards(d->comm, d->v + lo, d->rel, err);
}

/* Whether the overlapped run's bucket b may start (the mutex held). */
static int bucket_ready(const RtDpReduce *d, int b) { return d->all_ready || d->ready[b] >= d->need[b]; }

/* The overlapped run's bucket b, all on the thread: made final (the caller's fold: the local
 * tree's remaining additions over its elements), its shards exchanged, this rank's shard summed
 * by the tree over the ranks (serially: the pool is the backward's), gathered back. The same
 * additions in the same order per element as rt_dp_reduce_run. *comm_s: the collectives' time. */
static RtStatus run_bucket(RtDpReduce *d, int b, RtError *err, double *comm_s) {
    const int64_t *o = bucket_off(d, b);
    if (d->fold) d->fold(d->fold_ctx, o[0], o[d->size]);
    double t0 = rt_now();
    RtStatus st = run_job(d, (RtDpJob){RT_DP_EXCHANGE, b}, err);
    *comm_s += rt_now() - t0;
    if (st != RT_OK) return st;
    int64_t lo = o[d->rank], len = o[d->rank + 1] - lo;
    float *got = bucket_got(d, b);
    rt_dp_tree_sum_f32(NULL, got, d->size, len);
    /* in place: the exchange has sent these elements, and nothing else reads them this micro-batch */
    if (len > 0) memcpy(d->v + lo, got, (size_t)len * sizeof *d->v);
    if (d->shards) return RT_OK; /* ZeRO-2: this rank keeps its shard; nothing to gather */
    t0 = rt_now();
    st = run_job(d, (RtDpJob){RT_DP_GATHER, b}, err);
    *comm_s += rt_now() - t0;
    return st;
}

static void *comm_thread(void *arg) {
    RtDpReduce *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->quit && d->done == d->posted && !(d->ovl && d->next < d->nbuckets && bucket_ready(d, d->next)))
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->quit) break;
        if (d->ovl && d->next < d->nbuckets && bucket_ready(d, d->next)) {
            int b = d->next++;
            int failed = d->status != RT_OK;
            d->t_start[b] = rt_now();
            pthread_mutex_unlock(&d->mu);
            RtStatus st = RT_OK;
            RtError e;
            double dt = 0;
            if (!failed) st = run_bucket(d, b, &e, &dt);
            pthread_mutex_lock(&d->mu);
            d->comm_s += dt;
            if (st != RT_OK && d->status == RT_OK) d->status = st, d->e = e;
            d->ovl_done++;
            pthread_cond_broadcast(&d->cv);
            continue;
        }
        RtDpJob j = d->jobs[d->done];
        int failed = d->status != RT_OK;
        pthread_mutex_unlock(&d->mu);
        RtStatus st = RT_OK;
        RtError e;
        double t0 = rt_now();
        if (!failed) st = run_job(d, j, &e); /* after a failure the rest are skipped: the caller stops */
        double dt = rt_now() - t0;
        pthread_mutex_lock(&d->mu);
        d->comm_s += dt;
        if (st != RT_OK && d->status == RT_OK) d->status = st, d->e = e;
        d->done++;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* shard_off: NULL (each bucket cut into 64-byte pieces of its own), or the ZeRO shards' size + 1
 * boundaries (each bucket cut at them) */
static RtStatus dp_reduce_open(RtDpReduce **out, RtComm *c, RtPool *pool, int64_t n, int64_t bucket_floats,
                               const int64_t *shard_off, RtError *err) {
    *out = NULL;
    int size = rt_comm_size(c);
    if (size < 2) return rt_fail(err, RT_ERR_ARG, "the bucketed reduction needs 2 ranks or more, not %d", size);
    RtDpReduce *d = calloc(1, sizeof *d);
    if (!d) return rt_fail_errno(err, ENOMEM, "cannot allocate the gradient's buckets");
    d->comm = c, d->pool = pool, d->rank = rt_comm_rank(c), d->size = size, d->n = n, d->bucket_floats = bucket_floats;
    d->nbuckets = n > 0 ? (int)((n + bucket_floats - 1) / bucket_floats) : 0;
    d->off = calloc((size_t)d->nbuckets * (size + 1) + 1, sizeof *d->off);
    d->jobs = calloc((size_t)d->nbuckets * 2 + 1, sizeof *d->jobs);
    d->rel = calloc((size_t)size + 1, sizeof *d->rel);
    d->ready = calloc((size_t)d->nbuckets + 1, sizeof *d->ready);
    d->need = calloc((size_t)d->nbuckets + 1, sizeof *d->need);
    d->t_ready = calloc((size_t)d->nbuckets + 1, sizeof *d->t_ready);
    d->t_start = calloc((size_t)d->nbuckets + 1, sizeof *d->t_start);
    if (!d->off || !d->jobs || !d->rel || !d->ready || !d->need || !d->t_ready || !d->t_start) {
        rt_dp_reduce_close(d);
        return rt_fail_errno(err, ENOMEM, "cannot allocate the gradient's buckets");
    }
    for (int b = 0; b < d->nbuckets; b++) { /* bucket 0 holds the last elements */
        int64_t hi = n - (int64_t)b * bucket_floats, lo = hi - bucket_floats < 0 ? 0 : hi - bucket_floats;
        int64_t *o = d->off + (int64_t)b * (size + 1);
        if (shard_off) /* piece k: the bucket's elements in ZeRO shard k (empty where they do not meet) */
            for (int k = 0; k <= size; k++) o[k] = shard_off[k] < lo ? lo : shard_off[k] > hi ? hi : shard_off[k];
        else {
            rt_comm_shards(hi - lo, size, 16, o); /* 64-byte pieces: no ZeRO shard to keep aligned */
            for (int k = 0; k <= size; k++) o[k] += lo;
        }
        if (o[d->rank + 1] - o[d->rank] > d->most) d->most = o[d->rank + 1] - o[d->rank];
        d->need[b] = hi - lo;
    }
    d->shards = shard_off != NULL;
    for (int i = 0; i < (d->shards ? 1 : 2); i++) {
        d->got[i] = malloc((size_t)(d->most * size + 1) * sizeof(float));
        if (!d->got[i]) {
            rt_dp_reduce_close(d);
            return rt_fail_errno(err, ENOMEM, "cannot allocate the gradient's buckets");
        }
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    int e = pthread_create(&d->thread, NULL, comm_thread, d);
    if (e) {
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
        rt_dp_reduce_close(d);
        return rt_fail_errno(err, e, "cannot start the communication thread");
    }
    d->started = 1;
    *out = d;
    return RT_OK;
}

RtStatus rt_dp_reduce_open(RtDpReduce **out, RtComm *c, RtPool *pool, int64_t n, int64_t bucket_floats, RtError *err) {
    return dp_reduce_open(out, c, pool, n, bucket_floats, NULL, err);
}

RtStatus rt_dp_reduce_open_shards(RtDpReduce **out, RtComm *c, int64_t n, int64_t bucket_floats, const int64_t *shard_off,
                                  RtError *err) {
    if (!shard_off) return rt_fail(err, RT_ERR_ARG, "the buckets by shard need the shards' boundaries");
    return dp_reduce_open(out, c, NULL, n, bucket_floats, shard_off, err);
}

int64_t rt_dp_reduce_recv_bytes(const RtDpReduce *d) { return (d->shards ? 1 : 2) * d->most * d->size * (int64_t)sizeof(float); }

int rt_dp_reduce_buckets(const RtDpReduce *d) { return d->nbuckets; }
int64_t rt_dp_reduce_bucket_floats(const RtDpReduce *d) { return d->bucket_floats; }

static void post(RtDpReduce *d, int kind, int bucket) {
    pthread_mutex_lock(&d->mu);
    d->jobs[d->posted++] = (RtDpJob){kind, bucket};
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Waits until the thread has run `count` of the run's jobs; the run's status so far. */
static RtStatus wait_done(RtDpReduce *d, int count) {
    double t0 = rt_now();
    pthread_mutex_lock(&d->mu);
    while (d->done < count) pthread_cond_wait(&d->cv, &d->mu);
    RtStatus st = d->status;
    d->wait_s += rt_now() - t0;
    pthread_mutex_unlock(&d->mu);
    return st;
}

RtStatus rt_dp_reduce_run(RtDpReduce *d, float *v, RtError *err) {
    if (d->shards) return rt_fail(err, RT_ERR_ARG, "the buckets by shard reduce during the backward alone (rt_dp_reduce_begin)");
    pthread_mutex_lock(&d->mu);
    d->v = v, d->posted = d->done = 0, d->status = RT_OK;
    pthread_mutex_unlock(&d->mu);
    /* the jobs' order: exchange 0, then for each b: exchange b + 1, gather b; exchange b + 1 is
     * posted before the sum of b starts, so the thread runs it meanwhile; job index of exchange b
     * is 0 for b = 0 and 2b - 1 after */
    RtStatus st = RT_OK;
    if (d->nbuckets > 0) post(d, RT_DP_EXCHANGE, 0);
    for (int b = 0; b < d->nbuckets && st == RT_OK; b++) {
        if (b + 1 < d->nbuckets) post(d, RT_DP_EXCHANGE, b + 1);
        /* exchange b done: its index, plus one for exchange b + 1 posted after it when b > 0 */
        st = wait_done(d, b == 0 ? 1 : 2 * b);
        if (st != RT_OK) break;
        const int64_t *o = bucket_off(d, b);
        int64_t lo = o[d->rank], len = o[d->rank + 1] - lo;
        rt_dp_tree_sum_f32(d->pool, d->got[b & 1], d->size, len);
        if (len > 0) memcpy(v + lo, d->got[b & 1], (size_t)len * sizeof *v);
        post(d, RT_DP_GATHER, b);
    }
    int posted;
    pthread_mutex_lock(&d->mu);
    posted = d->posted;
    pthread_mutex_unlock(&d->mu);
    RtStatus wst = wait_done(d, posted); /* the thread is idle before the caller's next collective */
    if (st == RT_OK) st = wst;
    d->runs++;
    if (st != RT_OK) {
        *err = d->e;
        return st;
    }
    return RT_OK;
}

void rt_dp_reduce_expect(RtDpReduce *d, const int64_t *lo, const int64_t *hi, int n) {
    for (int b = 0; b < d->nbuckets; b++) {
        const int64_t *o = bucket_off(d, b);
        int64_t need = 0;
        for (int i = 0; i < n; i++) {
            int64_t a = lo[i] > o[0] ? lo[i] : o[0], z = hi[i] < o[d->size] ? hi[i] : o[d->size];
            if (z > a) need += z - a;
        }
        d->need[b] = need;
    }
}

RtStatus rt_dp_reduce_begin(RtDpReduce *d, float *v, RtDpFold fold, void *fold_ctx, RtError *err) {
    pthread_mutex_lock(&d->mu);
    if (d->ovl) { /* the run before was never joined: its buckets may still read the vector */
        int left = d->nbuckets - d->ovl_done;
        pthread_mutex_unlock(&d->mu);
        return rt_fail(err, RT_ERR_ARG,
                       "the gradient's buckets: a reduction began while the one before was not joined (%d of %d buckets "
                       "not done): its vector would be overwritten under it",
                       left, d->nbuckets);
    }
    d->v = v, d->posted = d->done = 0, d->status = RT_OK;
    d->fold = fold, d->fold_ctx = fold_ctx, d->next = d->ovl_done = 0, d->all_ready = 0;
    for (int b = 0; b < d->nbuckets; b++) d->ready[b] = 0, d->t_ready[b] = d->t_start[b] = 0;
    d->ovl = 1; /* last: the thread may now take buckets */
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return RT_OK;
}

void rt_dp_reduce_ready(RtDpReduce *d, int64_t lo, int64_t hi) {
    pthread_mutex_lock(&d->mu);
    int wake = 0;
    double now = rt_now();
    for (int b = 0; b < d->nbuckets; b++) { /* few buckets: a scan */
        const int64_t *o = bucket_off(d, b);
        int64_t a = lo > o[0] ? lo : o[0], z = hi < o[d->size] ? hi : o[d->size];
        if (z <= a) continue;
        int was = d->ready[b] >= d->need[b];
        d->ready[b] += z - a;
        if (!was && d->ready[b] >= d->need[b]) d->t_ready[b] = now, wake = 1;
    }
    if (wake) pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

RtStatus rt_dp_reduce_finish(RtDpReduce *d, RtError *err) {
    double t0 = rt_now();
    pthread_mutex_lock(&d->mu);
    d->t_end = t0, d->all_ready = 1;
    pthread_cond_broadcast(&d->cv);
    while (d->ovl_done < d->nbuckets) pthread_cond_wait(&d->cv, &d->mu);
    d->ovl = 0;
    RtStatus st = d->status;
    d->wait_s += rt_now() - t0;
    for (int b = 0; b < d->nbuckets; b++) {
        if (d->t_ready[b] > 0 && d->t_ready[b] < d->t_end) d->ready_before++;
        if (d->t_start[b] < d->t_end) {
            d->started_before++;
            if (d->t_end - d->t_start[b] > d->lead_s) d->lead_s = d->t_end - d->t_start[b];
        }
    }
    d->buckets_seen += d->nbuckets;
    d->ovl_runs++, d->runs++;
    pthread_mutex_unlock(&d->mu);
    if (st != RT_OK) *err = d->e;
    return st;
}

void rt_dp_reduce_stats(const RtDpReduce *d, double *comm_s, double *wait_s, int64_t *runs) {
    *comm_s = d->comm_s, *wait_s = d->wait_s, *runs = d->runs;
}

void rt_dp_reduce_print(FILE *f, const RtDpReduce *d, const char *prefix) {
    if (!d || d->runs == 0) return;
    double hidden = d->comm_s > 0 ? 1 - d->wait_s / d->comm_s : 0;
    if (hidden < 0) hidden = 0;
    fprintf(f,
            "%sbuckets: %d of at most %lld floats, %lld reductions: the communication thread %.3f ms in collectives, the "
            "step waited %.3f ms for it: %.1f%% hidden behind %s\n",
            prefix, d->nbuckets, (long long)d->bucket_floats, (long long)d->runs, 1e3 * d->comm_s, 1e3 * d->wait_s, 100 * hidden,
            d->ovl_runs ? "the backward" : "the ranks' sums of other buckets");
    if (d->ovl_runs > 0)
        fprintf(f,
                "%sbuckets overlapped with the backward in %lld reductions: %lld of %lld buckets ready before the backward "
                "ended, %lld started before it (the earliest %.3f ms before)\n",
                prefix, (long long)d->ovl_runs, (long long)d->ready_before, (long long)d->buckets_seen,
                (long long)d->started_before, 1e3 * d->lead_s);
}

void rt_dp_reduce_close(RtDpReduce *d) {
    if (!d) return;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->quit = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
    free(d->off);
    free(d->ready);
    free(d->need);
    free(d->t_ready);
    free(d->t_start);
    free(d->rel);
    free(d->jobs);
    free(d->got[0]);
    free(d->got[1]);
    free(d);
}

RtStatus rt_dp_model_env(double *gbps, RtError *err) {
    const char *s = getenv("MBT_DP_MODEL_GBPS");
    *gbps = 0;
    if (!s || !*s) return RT_OK;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v > 0) || v > 1e6)
        return rt_fail(err, RT_ERR_ARG, "MBT_DP_MODEL_GBPS is '%s': it must be a link bandwidth in GB/s above 0, at most 1e6", s);
    *gbps = v;
    return RT_OK;
}

void rt_dp_model(int64_t n, int64_t bucket_floats, int ranks, double gbps, double bwd_s, RtDpModel *m, FILE *f,
                 const char *prefix) {
    memset(m, 0, sizeof *m);
    if (n <= 0 || bucket_floats <= 0 || ranks < 1 || !(gbps > 0)) return;
    m->nbuckets = (int)((n + bucket_floats - 1) / bucket_floats);
    double end = 0, per_float = 2.0 * (ranks - 1) / ranks * sizeof(float) / (gbps * 1e9);
    for (int b = 0; b < m->nbuckets; b++) {
        int64_t hi = n - (int64_t)b * bucket_floats, lo = hi - bucket_floats < 0 ? 0 : hi - bucket_floats;
        double ready = bwd_s * (double)(n - lo) / (double)n, c = per_float * (double)(hi - lo);
        double start = ready > end ? ready : end;
        end = start + c;
        m->comm_s += c;
        if (f)
            fprintf(f, "%s  bucket %d: elements [%lld, %lld), %.3f MB: final at %.3f ms, reduces %.3f .. %.3f ms\n", prefix, b,
                    (long long)lo, (long long)hi, 4e-6 * (double)(hi - lo), 1e3 * ready, 1e3 * start, 1e3 * end);
    }
    m->exposed_s = end > bwd_s ? end - bwd_s : 0;
    m->hidden = m->comm_s > 0 ? 1 - m->exposed_s / m->comm_s : 1;
}

/* ---- ZeRO-2's partial sums by shard (dp_reduce.h, RtShardTree) ---- */

int rt_shard_tree_regions(int64_t leaves) {
    int need = 0; /* floor(log2 leaves): at most popcount(k) sums stay on the stack after k < leaves pushes */
    while (need < RT_TREE_MAX && ((int64_t)2 << need) <= leaves) need++;
    return need >= RT_TREE_MAX ? -1 : need;
}

RtStatus rt_shard_tree_open(RtShardTree *s, int64_t len, int64_t leaves, RtPool *pool, RtError *err) {
    int need = rt_shard_tree_regions(leaves);
    if (need < 0)
        return rt_fail(err, RT_ERR_ARG, "%lld micro-batches a step are more than the gradient tree holds", (long long)leaves);
    s->len = len, s->pool = pool, s->ops = NULL;
    while (s->nreg < need) {
        s->reg[s->nreg] = malloc((size_t)(len + 1) * sizeof(float));
        if (!s->reg[s->nreg]) return rt_fail_errno(err, ENOMEM, "cannot allocate a partial sum of the gradient's shard");
        s->nreg++;
    }
    rt_shard_tree_reset(s);
    return RT_OK;
}

void rt_shard_tree_reset(RtShardTree *s) { s->t.depth = 0; }

static RtStatus shard_add(RtShardTree *s, float *dst, const float *src, RtError *err) {
    if (s->ops) return s->ops->add(s->ops->ctx, dst, src, s->len, err);
    rt_host_add(s->pool, dst, src, s->len);
    return RT_OK;
}

RtStatus rt_shard_tree_push(RtShardTree *s, const float *leaf, int last, const float **sum, RtError *err) {
    RtTree *t = &s->t;
    int64_t n = s->len;
    RtStatus st = RT_OK;
    if (t->depth > 0 && t->size[t->depth - 1] == 1) {
        /* rt_exec_tree_push's: the leaf merges at once with the sum of one on top (the older on the
         * left), then equal sums merge */
        st = shard_add(s, s->reg[t->depth - 1], leaf, err);
        t->size[t->depth - 1] = 2;
        while (st == RT_OK && t->depth >= 2 && t->size[t->depth - 1] == t->size[t->depth - 2]) {
            st = shard_add(s, s->reg[t->depth - 2], s->reg[t->depth - 1], err);
            t->size[t->depth - 2] *= 2, t->depth--;
        }
    } else if (last && t->depth > 0) {
        /* it would stay on the stack, and rt_exec_tree_finish's first addition takes it at once */
        st = shard_add(s, s->reg[t->depth - 1], leaf, err);
        t->size[t->depth - 1] += 1;
    } else if (last) { /* the only leaf: it is the sum */
        *sum = leaf;
        return RT_OK;
    } else {
        if (t->depth >= s->nreg)
            return rt_fail(err, RT_ERR_ARG,
                           "the gradient shard's tree is full (%d partial sums): more micro-batches than it was opened for",
                           s->nreg);
        if (s->ops) st = s->ops->copy(s->ops->ctx, s->reg[t->depth], leaf, n, err);
        else if (n > 0) memcpy(s->reg[t->depth], leaf, (size_t)n * sizeof *leaf);
        t->size[t->depth++] = 1;
    }
    if (st != RT_OK || !last) return st;
    /* rt_exec_tree_finish's: the unequal sums left fold from the right */
    while (st == RT_OK && t->depth >= 2) {
        st = shard_add(s, s->reg[t->depth - 2], s->reg[t->depth - 1], err);
        t->size[t->depth - 2] += t->size[t->depth - 1], t->depth--;
    }
    *sum = s->reg[0];
    return st;
}

int64_t rt_shard_tree_bytes(const RtShardTree *s) { return (int64_t)s->nreg * s->len * (int64_t)sizeof(float); }

void rt_shard_tree_close(RtShardTree *s) {
    if (!s->ops)
        for (int i = 0; i < s->nreg; i++) free(s->reg[i]);
    s->nreg = 0;
}
