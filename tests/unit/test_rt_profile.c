/* test_rt_profile.c - unit tests of the opt-in step profile (runtime/rt_profile.h, profile.c and
 * its hooks in pool.c and blas.c): what a GEMM and a parallel loop add to an attached profile,
 * that a GEMM's own parallel loop is not counted twice, that nothing is counted without one,
 * phase marks, and the report's summary line.
 *
 * Build: make build/tests/test_rt_profile (links build/libmbtrt.a and OpenBLAS). Prints `PASS name`
 * or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure. */
#include <stdint.h>
#include <stdlib.h>

#include "rt_profile.h"
#include "unit.h"

static void touch(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    float *v = ctx;
    for (int64_t i = begin; i < end; i++) v[i] += 1.0f;
}

/* A GEMM big enough to be tiled (so it runs its own parallel loop), then two pooled loops. */
static void run_work(RtPool *pool, float *a, float *b, float *c, float *v) {
    RtError e;
    rt_error_clear(&e);
    RtStatus st =
        rt_sgemm_batched(pool, 0, 1, 256, 512, 128, 1.0f, a, 128, 0, b, 128, 0, 0.0f, c, 512, 0, 1, RT_GEMM_PLAIN, NULL, &e);
    CHECK(st == RT_OK, "gemm failed: %s", e.msg);
    rt_parallel_for(pool, 1000, touch, v);
    rt_parallel_for(pool, 1000, touch, v);
}

static void counts_gemm_and_pool(void) {
    RtError e;
    RtPool *pool = NULL;
    CHECK(rt_pool_create(&pool, 2, &e) == RT_OK, "pool: %s", e.msg);
    float *a = calloc(256 * 128, sizeof *a), *b = calloc(512 * 128, sizeof *b), *c = calloc(256 * 512, sizeof *c);
    float *v = calloc(1000, sizeof *v);
    RtProfile *p = calloc(1, sizeof *p);
    CHECK(rt_pool_profile(pool) == NULL, "a new pool has no profile");
    rt_pool_set_profile(pool, p);
    CHECK(rt_pool_profile(pool) == p, "attached profile not returned");
    rt_profile_begin_step(p);
    run_work(pool, a, b, c, v);
    rt_profile_phase(p, RT_PROF_FB);
    CHECK(p->gemm_calls == 1, "gemm calls %lld, want 1", (long long)p->gemm_calls);
    CHECK(p->gemm_flop == 2.0 * 256 * 512 * 128, "gemm flop %g", p->gemm_flop);
    CHECK(p->pool_calls == 2, "pool calls %lld, want 2 (the GEMM's tiles are not a pool call)", (long long)p->pool_calls);
    CHECK(p->gemm_s > 0 && p->pool_s > 0, "times gemm %g pool %g", p->gemm_s, p->pool_s);
    CHECK(p->nshapes == 1 && p->shapes[0].m == 256 && p->shapes[0].n == 512 && p->shapes[0].k == 128 &&
              p->shapes[0].trans_b == 1 && p->shapes[0].calls == 1,
          "shape table: %d shapes", p->nshapes);
    CHECK(p->phase_gemm_s[RT_PROF_FB] == p->gemm_s && p->phase_pool_s[RT_PROF_FB] == p->pool_s,
          "the phase holds the GEMM and pool time");
    CHECK(p->phase_s[RT_PROF_FB] >= p->gemm_s + p->pool_s, "phase %g < gemm %g + pool %g", p->phase_s[RT_PROF_FB], p->gemm_s,
          p->pool_s);
    CHECK(p->depth == 0, "depth %d after the calls", p->depth);
    CHECK(v[0] == 2.0f && v[999] == 2.0f, "the loops ran");

    /* the report's last line, for scripts */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    rt_profile_print(f, p, 2);
    fclose(f);
    CHECK(strstr(buf, "profile summary: steps=1 ") != NULL, "no summary line in:\n%s", buf);
    CHECK(strstr(buf, "gemm_share=") != NULL, "no gemm_share in:\n%s", buf);
    CHECK(strstr(buf, "256 x    512 x    128") != NULL, "no shape line in:\n%s", buf);
    free(buf);

    /* detached: nothing more is counted */
    rt_pool_set_profile(pool, NULL);
    run_work(pool, a, b, c, v);
    CHECK(p->gemm_calls == 1 && p->pool_calls == 2, "counted while detached");
    free(p);
    free(a);
    free(b);
    free(c);
    free(v);
    rt_pool_destroy(pool);
}

/* A one-thread pool runs loops inline; they are still timed. A NULL pool has no profile. */
static void one_thread_and_null_pool(void) {
    RtError e;
    RtPool *pool = NULL;
    CHECK(rt_pool_create(&pool, 1, &e) == RT_OK, "pool: %s", e.msg);
    RtProfile p = {0};
    rt_pool_set_profile(pool, &p);
    float v[10] = {0};
    rt_parallel_for(pool, 10, touch, v);
    CHECK(p.pool_calls == 1, "pool calls %lld", (long long)p.pool_calls);
    rt_pool_destroy(pool);
    CHECK(rt_pool_profile(NULL) == NULL, "a NULL pool has a profile");
    rt_pool_set_profile(NULL, &p); /* no effect, no crash */
}

static void requested_by_environment(void) {
    unsetenv("MBT_PROFILE");
    CHECK(!rt_profile_requested(), "unset");
    setenv("MBT_PROFILE", "", 1);
    CHECK(!rt_profile_requested(), "empty");
    setenv("MBT_PROFILE", "0", 1);
    CHECK(!rt_profile_requested(), "0");
    setenv("MBT_PROFILE", "1", 1);
    CHECK(rt_profile_requested(), "1");
    unsetenv("MBT_PROFILE");
}

int main(void) {
    RUN(counts_gemm_and_pool);
    RUN(one_thread_and_null_pool);
    RUN(requested_by_environment);
    return unit_finish();
}
