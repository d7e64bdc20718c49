/* test_rt_comm.c - unit tests of runtime/comm/comm.c on the self backend (a world of one rank):
 * the backend chosen from the environment, every collective's result, the argument checks and
 * their messages, equal shard boundaries, and the MBT_DEBUG table. The mpi and tcp backends are
 * tested with several processes by tests/comm/run.sh.
 *
 * Build: make build/tests/test_rt_comm (links build/libmbtrt.a). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "dp_reduce.h"
#include "train_internal.h"
#include "unit.h"

/* No launcher's variables: the self backend. */
static void clear_env(void) {
    static const char *const vars[] = {"MBT_COMM",     "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",  "PMI_RANK",  "PMI_SIZE",
                                       "RANK",         "WORLD_SIZE",           "MBT_DEBUG",  "MBT_TRACE", "SLURM_STEP_NUM_TASKS",
                                       "SLURM_PROCID", "MASTER_ADDR",          "MASTER_PORT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static RtComm *open_self(void) {
    clear_env();
    RtComm *c = NULL;
    RtError e;
    RtStatus st = rt_comm_open(&c, 5, &e);
    CHECK(st == RT_OK && c, "rt_comm_open: %s", st == RT_OK ? "no world" : e.msg);
    return c;
}

static void self_world(void) {
    RtComm *c = open_self();
    if (!c) return;
    CHECK(rt_comm_rank(c) == 0 && rt_comm_size(c) == 1 && rt_comm_local_rank(c) == 0, "rank %d size %d local %d", rt_comm_rank(c),
          rt_comm_size(c), rt_comm_local_rank(c));
    CHECK_STR(rt_comm_backend(c), "self", "backend");
    CHECK_STR(rt_comm_launcher(c), "nothing", "launcher");
    rt_comm_close(c);
    rt_comm_close(NULL); /* allowed */
    /* forced by MBT_COMM even where a launcher's variables are set */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MBT_COMM", "self", 1);
    RtError e;
    CHECK(rt_comm_open(&c, 5, &e) == RT_OK && rt_comm_size(c) == 1, "MBT_COMM=self: %s", e.msg);
    CHECK_STR(rt_comm_launcher(c), "MBT_COMM=self", "launcher");
    rt_comm_close(c);
}

/* srun's tasks without PMI (--mpi=none): refused unless MASTER_ADDR/MASTER_PORT give a rendezvous;
 * one task, or a batch script's shell (SLURM_NTASKS without a step), is a world of one. */
static void slurm_env(void) {
    clear_env();
    RtComm *c = NULL;
    RtError e;
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    setenv("SLURM_PROCID", "1", 1);
    CHECK(rt_comm_open(&c, 5, &e) == RT_ERR_ARG && !c, "srun -n 2 without PMIx or MASTER_ADDR was not refused");
    CHECK(strstr(e.msg, "srun started 2 tasks without PMIx (srun --mpi=none, Slurm's default)") != NULL, "message: %s", e.msg);
    setenv("SLURM_STEP_NUM_TASKS", "1", 1);
    CHECK(rt_comm_open(&c, 5, &e) == RT_OK && rt_comm_size(c) == 1, "srun -n 1: %s", e.msg);
    CHECK_STR(rt_comm_launcher(c), "nothing", "srun -n 1's launcher");
    rt_comm_close(c);
    /* MASTER_PORT alone is not enough; SLURM_PROCID out of range names the variable */
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    setenv("MASTER_PORT", "1", 1);
    CHECK(rt_comm_open(&c, 5, &e) == RT_ERR_ARG, "srun -n 2 with MASTER_PORT alone was not refused");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("SLURM_PROCID", "2", 1);
    CHECK(rt_comm_open(&c, 5, &e) == RT_ERR_ARG && strstr(e.msg, "SLURM_PROCID is '2': it must be a whole number from 0 to 1"),
          "SLURM_PROCID 2 of 2: %s", e.msg);
    clear_env();
}

static void self_collectives(void) {
    RtComm *c = open_self();
    if (!c) return;
    RtError e;
    float mine[7], got[7], v[7];
    for (int i = 0; i < 7; i++) mine[i] = (float)(i * i) + 0.25f, got[i] = -1, v[i] = (float)i;
    int64_t off[2] = {0, 7};
    CHECK(rt_comm_exchange_shards(c, mine, off, got, &e) == RT_OK, "exchange_shards: %s", e.msg);
    int bad = 0;
    for (int i = 0; i < 7; i++) bad += got[i] != mine[i];
    CHECK(bad == 0, "exchange_shards: %d of 7 values differ from this rank's own", bad);
    /* got overlapping mine is refused on every backend (MPI forbids it) */
    CHECK(rt_comm_exchange_shards(c, mine, off, mine + 3, &e) == RT_ERR_ARG && strstr(e.msg, "overlaps"),
          "exchange_shards in place: %s", e.msg);
    CHECK(rt_comm_gather_shards(c, v, off, &e) == RT_OK, "gather_shards: %s", e.msg);
    bad = 0;
    for (int i = 0; i < 7; i++) bad += v[i] != (float)i;
    CHECK(bad == 0, "gather_shards changed %d values of a world of one", bad);
    double d[3] = {1.5, -2.0, 1e300}, all[3] = {0, 0, 0};
    CHECK(rt_comm_gather_f64(c, d, 3, all, &e) == RT_OK && all[0] == 1.5 && all[1] == -2.0 && all[2] == 1e300,
          "gather_f64: %s (%g %g %g)", e.msg, all[0], all[1], all[2]);
    char buf[5] = "abcd";
    CHECK(rt_comm_broadcast(c, buf, 5, 0, &e) == RT_OK && strcmp(buf, "abcd") == 0, "broadcast: %s", e.msg);
    CHECK(rt_comm_barrier(c, &e) == RT_OK, "barrier: %s", e.msg);
    /* empty calls */
    int64_t none[2] = {0, 0};
    CHECK(rt_comm_exchange_shards(c, NULL, none, NULL, &e) == RT_OK, "empty exchange_shards: %s", e.msg);
    CHECK(rt_comm_gather_f64(c, NULL, 0, NULL, &e) == RT_OK, "empty gather_f64: %s", e.msg);
    CHECK(rt_comm_broadcast(c, NULL, 0, 0, &e) == RT_OK, "empty broadcast: %s", e.msg);
    rt_comm_close(c);
}

#define CHECK_FAILS(call, want)                                                                                                  \
    do {                                                                                                                         \
        rt_error_clear(&e);                                                                                                      \
        RtStatus st_ = (call);                                                                                                   \
        CHECK(st_ == RT_ERR_ARG, "%s: status %d, expected an argument error", #call, (int)st_);                                  \
        CHECK(strstr(e.msg, want) != NULL, "%s: message '%s' lacks '%s'", #call, e.msg, want);                                   \
    } while (0)

static void refusals(void) {
    RtComm *c = open_self();
    if (!c) return;
    RtError e;
    float x[4] = {0};
    int64_t late[2] = {1, 4}, back[2] = {0, -1};
    CHECK_FAILS(rt_comm_exchange_shards(c, x, late, x, &e), "the first shard starts at 1, not 0");
    CHECK_FAILS(rt_comm_gather_shards(c, x, back, &e), "shard 0 ends at -1, before it starts (0)");
    CHECK_FAILS(rt_comm_gather_shards(c, x, NULL, &e), "no shard boundaries");
    CHECK_FAILS(rt_comm_broadcast(c, x, 4, 1, &e), "root 1 is not a rank of this world (size 1)");
    CHECK_FAILS(rt_comm_broadcast(c, x, -4, 0, &e), "-4 bytes");
    CHECK_FAILS(rt_comm_gather_f64(c, NULL, 2, NULL, &e), "a NULL buffer");
    rt_comm_close(c);
    RtComm *w = (RtComm *)&e;
    CHECK_FAILS(rt_comm_open(&w, 0, &e), "the timeout must be a number of seconds above 0 (it is 0)");
    CHECK(w == NULL, "a failed open left *out set");
    setenv("MBT_COMM", "nccl", 1);
    CHECK_FAILS(rt_comm_open(&w, 5, &e), "MBT_COMM is 'nccl': it must be self, mpi or tcp");
    clear_env();
}

/* The shard boundaries: off[0] = 0, off[size] = n, aligned inner boundaries, every element once. */
static void shards(void) {
    int64_t off[9];
    rt_comm_shards(10, 4, 1, off);
    CHECK(off[0] == 0 && off[1] == 3 && off[2] == 6 && off[3] == 9 && off[4] == 10, "10 over 4: %lld %lld %lld %lld %lld",
          (long long)off[0], (long long)off[1], (long long)off[2], (long long)off[3], (long long)off[4]);
    rt_comm_shards(10, 4, 4, off);
    CHECK(off[1] == 4 && off[2] == 8 && off[3] == 10 && off[4] == 10, "10 over 4 aligned 4: %lld %lld %lld %lld",
          (long long)off[1], (long long)off[2], (long long)off[3], (long long)off[4]);
    rt_comm_shards(3, 8, 1, off);
    CHECK(off[3] == 3 && off[8] == 3 && off[2] == 2, "3 over 8: off[2] %lld off[3] %lld off[8] %lld", (long long)off[2],
          (long long)off[3], (long long)off[8]);
    for (int size = 1; size <= 8; size++)
        for (int64_t n = 0; n < 200; n += 7)
            for (int64_t align = 1; align <= 16; align *= 2) {
                rt_comm_shards(n, size, align, off);
                int ok = off[0] == 0 && off[size] == n;
                for (int j = 0; j < size; j++) {
                    ok = ok && off[j + 1] >= off[j];
                    if (j > 0 && off[j] != n) ok = ok && off[j] % align == 0;
                }
                CHECK(ok, "n %lld size %d align %lld: bad boundaries", (long long)n, size, (long long)align);
            }
}

/* The overlap model (dp_reduce.h): 4 buckets of 1000 floats on 2 ranks at 0.004 GB/s reduce in
 * 1 ms each (2 x 1/2 x 4 bytes x 1000 / 4e6 B/s). With an 8 ms backward they are final at 2, 4, 6
 * and 8 ms, end at 3, 5, 7, 9: 1 ms exposed of 4, 75% hidden. With a 2 ms backward (final at 0.5,
 * 1, 1.5, 2) they queue: 0.5-1.5, 1.5-2.5, 2.5-3.5, 3.5-4.5: 2.5 ms exposed, 37.5% hidden. A short
 * last bucket, and one rank (nothing to send: all hidden). */
static void overlap_model(void) {
    RtDpModel m;
    rt_dp_model(4000, 1000, 2, 0.004, 8e-3, &m, NULL, "");
    CHECK(m.nbuckets == 4 && fabs(m.comm_s - 4e-3) < 1e-12 && fabs(m.exposed_s - 1e-3) < 1e-12 && fabs(m.hidden - 0.75) < 1e-9,
          "8 ms backward: %d buckets, %g s, exposed %g s, hidden %g", m.nbuckets, m.comm_s, m.exposed_s, m.hidden);
    rt_dp_model(4000, 1000, 2, 0.004, 2e-3, &m, NULL, "");
    CHECK(fabs(m.exposed_s - 2.5e-3) < 1e-12 && fabs(m.hidden - 0.375) < 1e-9, "2 ms backward: exposed %g s, hidden %g",
          m.exposed_s, m.hidden);
    /* 3500 floats: buckets [2500, 3500), [1500, 2500), [500, 1500), [0, 500); 4 ranks send 1.5 x 4 bytes an element */
    rt_dp_model(3500, 1000, 4, 0.006, 7e-3, &m, NULL, "");
    CHECK(m.nbuckets == 4 && fabs(m.comm_s - 3.5e-3) < 1e-12 && fabs(m.exposed_s - 0.5e-3) < 1e-12,
          "3500 floats on 4 ranks: %d buckets, %g s, exposed %g s", m.nbuckets, m.comm_s, m.exposed_s);
    rt_dp_model(4000, 1000, 1, 1, 1e-3, &m, NULL, "");
    CHECK(m.comm_s == 0 && m.hidden == 1, "one rank: %g s, hidden %g", m.comm_s, m.hidden);
    setenv("MBT_DP_MODEL_GBPS", "-1", 1);
    double g;
    RtError e;
    CHECK(rt_dp_model_env(&g, &e) != RT_OK && strstr(e.msg, "MBT_DP_MODEL_GBPS is '-1'"), "MBT_DP_MODEL_GBPS=-1 accepted");
    setenv("MBT_DP_MODEL_GBPS", "12.5", 1);
    CHECK(rt_dp_model_env(&g, &e) == RT_OK && g == 12.5, "MBT_DP_MODEL_GBPS=12.5: %g", g);
    unsetenv("MBT_DP_MODEL_GBPS");
    CHECK(rt_dp_model_env(&g, &e) == RT_OK && g == 0, "MBT_DP_MODEL_GBPS unset: %g", g);
    setenv("MBT_DP_BUCKET_MB", "0.1", 1);
    int64_t f = 0;
    CHECK(rt_dp_bucket_env(&f, &e) == RT_OK && f == 16384, "MBT_DP_BUCKET_MB=0.1: %lld floats", (long long)f);
    setenv("MBT_DP_BUCKET_MB", "1e7", 1);
    CHECK(rt_dp_bucket_env(&f, &e) != RT_OK, "MBT_DP_BUCKET_MB=1e7 accepted");
    unsetenv("MBT_DP_BUCKET_MB");
    CHECK(rt_dp_bucket_env(&f, &e) == RT_OK && f == 6242304, "default: %lld floats (25 MB: 6.25 M floats, whole blocks)",
          (long long)f);
}

/* MBT_DEBUG: a table with one row per collective that was called; nothing without MBT_DEBUG. */
static void timing_table(void) {
    RtComm *c = open_self();
    if (!c) return;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    RtError e;
    CHECK(rt_comm_barrier(c, &e) == RT_OK, "barrier: %s", e.msg);
    rt_comm_print_timing(m, c);
    fflush(m);
    CHECK(len == 0, "a table without MBT_DEBUG: %s", text);
    rt_comm_close(c);
    setenv("MBT_DEBUG", "1", 1);
    RtComm *d = NULL;
    CHECK(rt_comm_open(&d, 5, &e) == RT_OK, "open: %s", e.msg);
    rt_comm_print_timing(m, d);
    fflush(m);
    CHECK(len == 0, "a table before any call: %s", text);
    double x[2] = {1, 2}, y[2];
    for (int i = 0; i < 3; i++) CHECK(rt_comm_gather_f64(d, x, 2, y, &e) == RT_OK, "gather_f64: %s", e.msg);
    CHECK(rt_comm_barrier(d, &e) == RT_OK, "barrier: %s", e.msg);
    rt_comm_print_timing(m, d);
    fclose(m);
    CHECK(text && strstr(text, "collectives: rank 0 of 1, self, timeout 5 s\n"), "table header missing: %s", text);
    CHECK(text && strstr(text, "  gather_f64              3 "), "gather_f64 row (3 calls) missing: %s", text);
    CHECK(text && strstr(text, "  barrier                 1 "), "barrier row missing: %s", text);
    CHECK(text && !strstr(text, "broadcast"), "a row for a collective never called: %s", text);
    free(text);
    rt_comm_close(d);
    clear_env();
}

/* MBT_COMM_TIMEOUT: the default, a value, refusals naming the variable. */
static void timeout_env(void) {
    RtError e;
    double t = 0;
    unsetenv("MBT_COMM_TIMEOUT");
    CHECK(rt_comm_timeout_env(&t, &e) == RT_OK && t == RT_COMM_TIMEOUT_DEFAULT, "default: %g %s", t, e.msg);
    setenv("MBT_COMM_TIMEOUT", "2.5", 1);
    CHECK(rt_comm_timeout_env(&t, &e) == RT_OK && t == 2.5, "2.5: %g %s", t, e.msg);
    static const char *const bad[] = {"0", "-1", "5s", "nan", "inf", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MBT_COMM_TIMEOUT", bad[i], 1);
        rt_error_clear(&e);
        CHECK(rt_comm_timeout_env(&t, &e) == RT_ERR_ARG && strstr(e.msg, "MBT_COMM_TIMEOUT is '"), "'%s' accepted (%s)", bad[i],
              e.msg);
    }
    unsetenv("MBT_COMM_TIMEOUT");
}

/* MBT_TRACE=F.json: F.comm-rank0.json with one event per call; nothing without calls; an
 * unwritable place is an error naming the trace. */
static void trace_file(void) {
    clear_env();
    char dir[] = "/tmp/mbt_comm_traceXXXXXX", want[256], file[300];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    snprintf(file, sizeof file, "%s/t.json", dir);
    snprintf(want, sizeof want, "%s/t.comm-rank0.json", dir);
    setenv("MBT_TRACE", file, 1);
    RtComm *c = NULL;
    RtError e;
    const char *path = "x";
    CHECK(rt_comm_open(&c, 5, &e) == RT_OK, "open: %s", e.msg);
    if (!c) return;
    CHECK(rt_comm_trace_write(c, &path, &e) == RT_OK && path == NULL, "a trace without calls: %s", path ? path : e.msg);
    double x = 1, y;
    CHECK(rt_comm_barrier(c, &e) == RT_OK && rt_comm_gather_f64(c, &x, 1, &y, &e) == RT_OK, "calls: %s", e.msg);
    CHECK(rt_comm_trace_write(c, &path, &e) == RT_OK && path && strcmp(path, want) == 0, "trace: %s", path ? path : e.msg);
    FILE *f = fopen(want, "r");
    char text[4096] = "";
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    CHECK(strstr(text, "{\"name\":\"barrier\",\"ph\":\"X\"") && strstr(text, "{\"name\":\"gather_f64\",\"ph\":\"X\""),
          "the trace lacks the calls: %s", text);
    rt_comm_close(c);
    remove(want);
    rmdir(dir);
    setenv("MBT_TRACE", "/nonexistent/dir/t.json", 1);
    CHECK(rt_comm_open(&c, 5, &e) == RT_OK && rt_comm_barrier(c, &e) == RT_OK, "open: %s", e.msg);
    rt_error_clear(&e);
    CHECK(rt_comm_trace_write(c, &path, &e) != RT_OK && strstr(e.msg, "the collectives' trace (MBT_TRACE)") &&
              strstr(e.msg, "/nonexistent/dir/t.comm-rank0.json"),
          "an unwritable trace: '%s'", e.msg);
    rt_comm_close(c);
    clear_env();
}

/* ZeRO-2's partial sums by shard (dp_reduce.h, RtShardTree): N ranks, rank r running global
 * micro-batches jN + r; each block of N leaves summed by the tree over the ranks
 * (rt_dp_tree_sum_f32) and pushed into the shard-size counter must give, bit for bit, the
 * reference: one binary counter over all M = N x accum leaves (rt_dp_tree_walk's shape, which is
 * RtTree's). For N a power of two at every accum; the controls - N = 3, the blocks pushed in
 * reverse order, and the contiguous split (each rank's own tree over its accum leaves, then the
 * tree over the ranks) at accum 3 - must differ, or this test could not fail. */
static uint64_t tree_rng = 88172645463325252ull;
static float tree_value(void) { /* magnitudes from 2^-12 to 2^12 and both signs: the order of additions shows */
    tree_rng ^= tree_rng << 13, tree_rng ^= tree_rng >> 7, tree_rng ^= tree_rng << 17;
    double u = (double)(tree_rng >> 11) / 9007199254740992.0;
    int ex = (int)(tree_rng % 25) - 12;
    return (float)((tree_rng & 1 ? -1 : 1) * (1 + u) * ldexp(1, ex));
}

/* Sums M leaves of len floats by the sharded design (order 0), with the blocks pushed in reverse
 * (1) or by the contiguous split (2) into out; the number of pushes past the tree's room, if any,
 * fails. */
static int shard_design(const float *leaves, int N, int A, int64_t len, int order, float *out) {
    RtShardTree t;
    memset(&t, 0, sizeof t);
    RtError e;
    float *block = malloc((size_t)(N > A ? N : A) * (size_t)len * sizeof *block);
    int ok = rt_shard_tree_open(&t, len, order == 2 ? N : A, NULL, &e) == RT_OK && block;
    if (order == 2) { /* rank k's accum leaves by its own tree, then the ranks' sums by the counter */
        float *ranks = malloc((size_t)N * (size_t)len * sizeof *ranks);
        for (int k = 0; ok && k < N; k++) {
            memcpy(block, leaves + (int64_t)k * A * len, (size_t)A * (size_t)len * sizeof *block);
            rt_dp_tree_sum_f32(NULL, block, A, len);
            memcpy(ranks + (int64_t)k * len, block, (size_t)len * sizeof *block);
        }
        if (ok) rt_dp_tree_sum_f32(NULL, ranks, N, len);
        if (ok) memcpy(out, ranks, (size_t)len * sizeof *out);
        free(ranks);
    }
    for (int jj = 0; ok && order != 2 && jj < A; jj++) {
        int j = order == 1 ? A - 1 - jj : jj;
        memcpy(block, leaves + (int64_t)j * N * len, (size_t)N * (size_t)len * sizeof *block); /* micro-batches jN .. jN+N-1 */
        rt_dp_tree_sum_f32(NULL, block, N, len);
        const float *sum = NULL;
        ok = rt_shard_tree_push(&t, block, jj + 1 == A, &sum, &e) == RT_OK;
        CHECK(ok, "push %d of %d: %s", jj, A, e.msg);
        if (ok && jj + 1 == A) memcpy(out, sum, (size_t)len * sizeof *out);
    }
    CHECK(rt_shard_tree_bytes(&t) == (int64_t)(A >= 2 && order != 2 ? (int)floor(log2(A)) : t.nreg) * len * 4,
          "N %d accum %d: %lld bytes of partial sums", N, A, (long long)rt_shard_tree_bytes(&t));
    rt_shard_tree_close(&t);
    free(block);
    return ok;
}

static void shard_tree(void) {
    enum { LEN = 64 };
    int differ_n3 = 0, differ_rev = 0, differ_contig = 0;
    for (int N = 1; N <= 8; N++) {
        for (int A = 1; A <= 9; A++) {
            int M = N * A;
            float *leaves = malloc((size_t)M * LEN * sizeof *leaves), *ref = malloc((size_t)M * LEN * sizeof *ref);
            float got[LEN];
            for (int64_t i = 0; i < (int64_t)M * LEN; i++) leaves[i] = tree_value();
            memcpy(ref, leaves, (size_t)M * LEN * sizeof *ref);
            rt_dp_tree_sum_f32(NULL, ref, M, LEN); /* the reference: one counter over the M micro-batches */
            int pow2 = (N & (N - 1)) == 0;
            if (shard_design(leaves, N, A, LEN, 0, got)) {
                int same = memcmp(got, ref, sizeof got) == 0;
                if (pow2) CHECK(same, "N %d, accum %d: the shard tree is not the reference's sum", N, A);
                else if (!same && N == 3) differ_n3++;
            }
            if (A >= 3 && shard_design(leaves, N, A, LEN, 1, got) && memcmp(got, ref, sizeof got)) differ_rev++;
            if (N == 2 && A == 3 && shard_design(leaves, N, A, LEN, 2, got) && memcmp(got, ref, sizeof got)) differ_contig++;
            free(leaves), free(ref);
        }
    }
    CHECK(differ_n3 > 0, "N = 3: the blocks of 3 are not nodes of the reference tree, yet every accum gave its bits");
    CHECK(differ_rev > 0, "the blocks pushed in reverse order never differed from the reference");
    CHECK(differ_contig == 1, "the contiguous split at 2 ranks x 3 gave the reference's bits");
    /* more leaves than the tree was opened for: an error, not a write past its regions */
    RtShardTree t;
    memset(&t, 0, sizeof t);
    RtError e;
    float leaf[4] = {1, 2, 3, 4};
    const float *sum = NULL;
    CHECK(rt_shard_tree_open(&t, 4, 2, NULL, &e) == RT_OK, "open: %s", e.msg);
    CHECK(rt_shard_tree_push(&t, leaf, 0, &sum, &e) == RT_OK, "push 1");
    CHECK(rt_shard_tree_push(&t, leaf, 0, &sum, &e) == RT_OK, "push 2 (merges)");
    CHECK(rt_shard_tree_push(&t, leaf, 0, &sum, &e) != RT_OK && strstr(e.msg, "the gradient shard's tree is full"),
          "a third leaf in a tree for 2: '%s'", e.msg);
    rt_shard_tree_close(&t);
}

/* The interleaved step's bookkeeping (train_internal.h): rank k's local micro-batch j is global
 * j x N + k, and the losses and statistics gathered in rank order are taken back in micro-batch
 * order through rt_train_gathered_at, its inverse (the contiguous split: k x accum + j both
 * ways). A wrong order there does not show in the logs (a sum in double of a dozen losses printed
 * to 9 digits; the statistics' mean rounded to f32), so it is checked here. */
static void interleaved_order(void) {
    RtTrainRun r;
    memset(&r, 0, sizeof r);
    for (int inter = 0; inter <= 1; inter++)
        for (int N = 2; N <= 4; N += 2)
            for (int64_t accum = 1; accum <= 5; accum++) {
                r.interleaved = inter, r.nranks = N;
                int seen[64] = {0};
                for (int k = 0; k < N; k++)
                    for (int64_t j = 0; j < accum; j++) {
                        r.rank = k;
                        int64_t g = rt_train_global_micro(&r, j, accum);
                        CHECK(g >= 0 && g < N * accum && !seen[g]++, "interleaved %d, N %d, accum %lld: rank %d's %lld is %lld",
                              inter, N, (long long)accum, k, (long long)j, (long long)g);
                        CHECK(g < N * accum && rt_train_gathered_at(&r, g, accum) == k * accum + j,
                              "micro-batch %lld gathered at %lld, not rank %d's %lld", (long long)g,
                              (long long)rt_train_gathered_at(&r, g, accum), k, (long long)j);
                        if (inter) CHECK(g == j * N + k, "rank %d's %lld is %lld", k, (long long)j, (long long)g);
                    }
            }
}

int main(void) {
    RUN(self_world);
    RUN(slurm_env);
    RUN(self_collectives);
    RUN(refusals);
    RUN(shards);
    RUN(overlap_model);
    RUN(timing_table);
    RUN(timeout_env);
    RUN(trace_file);
    RUN(shard_tree);
    RUN(interleaved_order);
    return unit_finish();
}
