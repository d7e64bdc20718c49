/* comm_check.c - the collectives of runtime/comm across processes (tests/comm/run.sh starts it
 * under mpirun and as tcp ranks from a shell loop).
 *
 *   comm_check                 every collective, several rounds, with uneven shard sizes (an empty
 *                              shard among them) and a large exchange; each result checked exactly
 *   comm_check --die R         rank R exits right after the world opened (exit 0, no goodbye)
 *   comm_check --kill R        rank R kills itself with SIGKILL after the world opened
 *   comm_check --hang R        rank R sleeps (2 x the timeout + 1 s) instead of calling the collectives
 *   comm_check --mismatch R    rank R calls broadcast where the others call exchange_shards
 *   comm_check --zero3 N       ZeRO-3's parameter region (runtime/comm/zero3.h) of N floats: ranges
 *                              needed through the hook in turn (the next one prefetched), each
 *                              checked to hold the owners' values, released; pages shared by
 *                              neighbouring ranges; the resident bytes against the ranges held;
 *                              the whole region gathered at the end
 *   comm_check --bench N       no checks: times 10 exchange_shards + gather_shards pairs of an
 *                              N-float vector (after 2 untimed), the all-reduce's traffic; rank 0
 *                              prints the mean time a pair and the bytes a rank sent per second
 *
 * Each rank prints `rank R of P (BACKEND): ok, N values checked` (with MBT_DEBUG=1 its table of the
 * collectives' timing; with MBT_TRACE=F.json `trace: F.comm-rankR.json`, the file it wrote) and exits 0, or prints
 * `comm_check: rank R: MESSAGE` on stderr and stops the world with rt_comm_abort(1). The timeout
 * is MBT_COMM_TIMEOUT's (rt_comm_timeout_env). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "zero3.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static RtComm *world;
static int64_t checked;

static _Noreturn void die(const char *what, const RtError *e) {
    fprintf(stderr, "comm_check: rank %d: %s%s%s\n", world ? rt_comm_rank(world) : -1, what, e ? ": " : "", e ? e->msg : "");
    rt_comm_abort(world, 1);
}

static void check(int ok, const char *what, long long i, double got, double want) {
    checked++;
    if (ok) return;
    char msg[256];
    snprintf(msg, sizeof msg, "%s: element %lld is %.17g, expected %.17g", what, i, got, want);
    die(msg, NULL);
}

/* Rank i's value for element k of round t: exact in float for the sizes used here. */
static float val(int i, int64_t k, int t) { return (float)(i * 4096 + t) + (float)(k % 1000003) * 0.25f; }

/* Uneven boundaries: shard j has (j * 37 + 5) * scale elements, except shard 1 (empty when size > 2). */
static void uneven(int P, int64_t scale, int64_t *off) {
    off[0] = 0;
    for (int j = 0; j < P; j++) off[j + 1] = off[j] + (j == 1 && P > 2 ? 0 : (int64_t)(j * 37 + 5) * scale);
}

static void round_trip(int t, int64_t scale) {
    RtError e;
    int P = rt_comm_size(world), r = rt_comm_rank(world);
    int64_t *off = malloc((size_t)(P + 1) * sizeof *off);
    uneven(P, scale, off);
    int64_t n = off[P], len = off[r + 1] - off[r];
    float *mine = malloc((size_t)(n ? n : 1) * sizeof *mine), *got = malloc((size_t)(len * P + 1) * sizeof *got);
    for (int64_t k = 0; k < n; k++) mine[k] = val(r, k, t);
    for (int64_t k = 0; k < len * P; k++) got[k] = -1;
    if (rt_comm_exchange_shards(world, mine, off, got, &e) != RT_OK) die("exchange_shards", &e);
    for (int i = 0; i < P; i++)
        for (int64_t k = 0; k < len; k++)
            check(got[i * len + k] == val(i, off[r] + k, t), "exchange_shards", (long long)(i * len + k), got[i * len + k],
                  val(i, off[r] + k, t));
    /* gather_shards: this rank's shard final (the owner's values), the rest garbage to be replaced */
    for (int64_t k = 0; k < n; k++) mine[k] = k >= off[r] && k < off[r + 1] ? val(r, k, t + 1) : -7.0f;
    if (rt_comm_gather_shards(world, mine, off, &e) != RT_OK) die("gather_shards", &e);
    for (int j = 0; j < P; j++)
        for (int64_t k = off[j]; k < off[j + 1]; k++)
            check(mine[k] == val(j, k, t + 1), "gather_shards", (long long)k, mine[k], val(j, k, t + 1));
    /* gather_f64: 3 doubles a rank, not representable in float */
    double d[3] = {r + 0.1 * t, -1e300 / (r + 1), 1.0 / 3.0 + r}, all[3 * 64];
    if (P > 64) die("more than 64 ranks", NULL);
    if (rt_comm_gather_f64(world, d, 3, all, &e) != RT_OK) die("gather_f64", &e);
    for (int i = 0; i < P; i++) {
        double w[3] = {i + 0.1 * t, -1e300 / (i + 1), 1.0 / 3.0 + i};
        for (int k = 0; k < 3; k++) check(all[3 * i + k] == w[k], "gather_f64", 3 * i + k, all[3 * i + k], w[k]);
    }
    /* broadcast from the last rank and from rank 0, an odd number of bytes */
    for (int root = P - 1;; root = 0) {
        unsigned char b[1237];
        for (size_t k = 0; k < sizeof b; k++) b[k] = r == root ? (unsigned char)(k * 7 + root + t) : 0xee;
        if (rt_comm_broadcast(world, b, (int64_t)sizeof b, root, &e) != RT_OK) die("broadcast", &e);
        for (size_t k = 0; k < sizeof b; k++)
            check(b[k] == (unsigned char)(k * 7 + root + t), "broadcast", (long long)k, b[k], (unsigned char)(k * 7 + root + t));
        if (root == 0) break;
    }
    if (rt_comm_barrier(world, &e) != RT_OK) die("barrier", &e);
    free(off);
    free(mine);
    free(got);
}

static void bench(int64_t n) {
    RtError e;
    int P = rt_comm_size(world);
    int64_t *off = malloc((size_t)(P + 1) * sizeof *off);
    rt_comm_shards(n, P, 16, off);
    int64_t len = off[rt_comm_rank(world) + 1] - off[rt_comm_rank(world)];
    float *v = calloc((size_t)n + 1, sizeof *v), *got = calloc((size_t)(len * P) + 1, sizeof *got);
    if (!off || !v || !got) die("out of memory", NULL);
    double t0 = 0;
    for (int i = 0; i < 12; i++) {
        if (i == 2) {
            if (rt_comm_barrier(world, &e) != RT_OK) die("barrier", &e);
            t0 = now_seconds();
        }
        if (rt_comm_exchange_shards(world, v, off, got, &e) != RT_OK) die("exchange_shards", &e);
        if (rt_comm_gather_shards(world, v, off, &e) != RT_OK) die("gather_shards", &e);
    }
    double dt = (now_seconds() - t0) / 10;
    double sent = 4.0 * (double)(n - len) + 4.0 * (double)len * (P - 1);
    if (rt_comm_rank(world) == 0)
        printf("bench: %d ranks (%s), %lld floats: %.3f ms a pair, %.1f MB sent a pair, %.2f GB/s sent a rank\n", P,
               rt_comm_backend(world), (long long)n, 1e3 * dt, sent / 1e6, sent / dt / 1e9);
    free(off);
    free(v);
    free(got);
}

/* ZeRO-3 over n floats: shards on page boundaries (1024 floats), every value a function of its
 * index (the owner's), the other ranks' parts poisoned before the region is handed over. Ranges
 * of uneven lengths (some inside one page, some across pages and shard boundaries) are needed in
 * turn through the hook as forward_backward calls it: need(k) with range k + 1 as the next, done(k)
 * after. A range's values are checked after its need (a page dropped while a neighbour was being
 * gathered into it would read zeros); the resident bytes never exceed the shard plus the two
 * ranges that can be held at once (the one in use and the prefetched one) plus two pages each. */
static void zero3(int64_t n) {
    RtError e;
    int P = rt_comm_size(world), r = rt_comm_rank(world);
    int64_t *off = malloc(sizeof *off * (size_t)(P + 1));
    float *params = malloc(sizeof *params * (size_t)n);
    if (!off || !params) die("out of memory", NULL);
    rt_comm_shards(n, P, 1024, off);
    for (int64_t k = 0; k < n; k++) params[k] = k >= off[r] && k < off[r + 1] ? (float)k * 0.5f + 1 : -7.0f;
    RtZero3 *z;
    if (rt_zero3_open(&z, world, &params, n, off, &e) != RT_OK) die("rt_zero3_open", &e);
    rt_zero3_release_all(z);
    int64_t page = sysconf(_SC_PAGESIZE), shard = (off[r + 1] - off[r]) * 4, at_start = rt_zero3_resident(z);
    if (at_start > shard + page) die("more than the shard resident after release_all", NULL);
    static const int64_t len[] = {100, 3000, 1, 5000, 1023, 1025, 7, 20000, 333, 4096};
    int64_t lo[64], hi[64], nr = 0, biggest = 0;
    for (int64_t a = 0; a < n && nr < 64; nr++) {
        lo[nr] = a, hi[nr] = a + len[nr % 10] < n ? a + len[nr % 10] : n, a = hi[nr];
        if (hi[nr] - lo[nr] > biggest) biggest = hi[nr] - lo[nr];
    }
    if (hi[nr - 1] != n) die("the ranges do not cover the region (make N smaller)", NULL);
    const RtParamHook *h = rt_zero3_hook(z);
    for (int round = 0; round < 2; round++) {
        rt_zero3_release_all(z);
        for (int64_t k = 0; k < nr; k++) {
            h->need(h->ctx, lo[k], hi[k], k + 1 < nr ? lo[k + 1] : 0, k + 1 < nr ? hi[k + 1] : 0);
            for (int64_t i = lo[k]; i < hi[k]; i++)
                check(params[i] == (float)i * 0.5f + 1, "zero3 need", i, params[i], (float)i * 0.5f + 1);
            h->done(h->ctx, lo[k], hi[k]);
        }
        if (rt_zero3_settle(z, &e) != RT_OK) die("the gathers", &e);
    }
    int64_t high = rt_zero3_high_water(z), bound = shard + 2 * biggest * 4 + 4 * page;
    if (high < shard || high > bound) {
        char msg[160];
        snprintf(msg, sizeof msg, "high-water %lld bytes, not between the shard (%lld) and %lld", (long long)high,
                 (long long)shard, (long long)bound);
        die(msg, NULL);
    }
    rt_zero3_release_all(z);
    if (rt_zero3_resident(z) > shard + page) die("more than the shard resident after the ranges", NULL);
    if (rt_zero3_whole(z, &e) != RT_OK) die("rt_zero3_whole", &e);
    for (int64_t i = 0; i < n; i++) check(params[i] == (float)i * 0.5f + 1, "zero3 whole", i, params[i], (float)i * 0.5f + 1);
    int64_t gathers, floats;
    double waited, in;
    rt_zero3_stats(z, &gathers, &floats, &waited, &in);
    printf("rank %d of %d (%s): zero3 ok, %lld values checked, %lld gathers, high-water %lld bytes (shard %lld, bound %lld)\n", r,
           P, rt_comm_backend(world), (long long)checked, (long long)gathers, (long long)high, (long long)shard,
           (long long)bound);
    rt_zero3_close(z, &params);
    free(off);
}

int main(int argc, char **argv) {
    const char *mode = argc >= 3 ? argv[1] : "";
    int who = argc >= 3 ? atoi(argv[2]) : -1;
    if (argc != 1 && (argc != 3 || (strcmp(mode, "--die") && strcmp(mode, "--kill") && strcmp(mode, "--hang") &&
                                    strcmp(mode, "--mismatch") && strcmp(mode, "--bench") && strcmp(mode, "--zero3")))) {
        fprintf(stderr, "usage: comm_check [--die R | --kill R | --hang R | --mismatch R | --bench N | --zero3 N]\n");
        return 2;
    }
    RtError e;
    double timeout;
    if (rt_comm_timeout_env(&timeout, &e) != RT_OK) {
        fprintf(stderr, "comm_check: %s\n", e.msg);
        return 2;
    }
    if (rt_comm_open(&world, timeout, &e) != RT_OK) {
        fprintf(stderr, "comm_check: %s\n", e.msg);
        return 1;
    }
    int r = rt_comm_rank(world);
    if (!strcmp(mode, "--bench")) {
        bench(atoll(argv[2]));
        rt_comm_close(world);
        return 0;
    }
    if (!strcmp(mode, "--zero3")) {
        zero3(atoll(argv[2]));
        fflush(stdout);
        rt_comm_close(world);
        return 0;
    }
    if (r == who && !strcmp(mode, "--die")) _exit(0);
    if (r == who && !strcmp(mode, "--kill")) raise(SIGKILL);
    if (r == who && !strcmp(mode, "--hang")) {
        sleep((unsigned)(2 * timeout + 1));
        return 0;
    }
    if (r == who && !strcmp(mode, "--mismatch")) {
        char b[8] = {0};
        if (rt_comm_broadcast(world, b, sizeof b, 0, &e) != RT_OK) die("broadcast", &e);
    }
    for (int t = 0; t < 3; t++) round_trip(t, 1);
    round_trip(5, 4001); /* ~1.4 M floats a rank at 4 ranks: many partial sends and receives */
    printf("rank %d of %d (%s): ok, %lld values checked\n", r, rt_comm_size(world), rt_comm_backend(world), (long long)checked);
    rt_comm_print_timing(stdout, world); /* MBT_DEBUG */
    const char *trace;
    if (rt_comm_trace_write(world, &trace, &e) != RT_OK) die("MBT_TRACE", &e);
    if (trace) printf("trace: %s\n", trace);
    fflush(stdout);
    rt_comm_close(world);
    return 0;
}
