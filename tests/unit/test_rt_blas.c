/* test_rt_blas.c - unit tests of runtime/blas.c, rt_sgemm_batched on OpenBLAS: every transpose
 * combination, padded pitches, batch strides (and a broadcast operand), alpha/beta, shapes large
 * enough to be tiled, against a naive double-precision loop; bit-identical results for any
 * thread count; argument errors; rt_bgemm_batched (bf16) the same way.
 *
 * Build: make build/tests/test_rt_blas (links build/libmbtrt.a and OpenBLAS). Prints `PASS name`
 * or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure.
 *
 * Tolerance: each element of C is compared with the double-precision sum; the allowed error is
 * 1e-5 x (|alpha| sum_k |a_ik b_kj| + |beta c_ij|) + 1e-30, about 100 float roundings of the
 * absolute terms, generous for any summation order OpenBLAS uses with K up to a few hundred and
 * tight enough to catch a wrong element, transpose, pitch or stride. */
#include <math.h>
#include <stdint.h>

#include "rt.h"
#include "rt_program.h"
#include "unit.h"

/* A deterministic fill in [-1, 1). */
static void fill(float *v, int64_t n, uint32_t seed) {
    RtRng r;
    rt_rng_init(&r, seed, 0x74657374, 0);
    for (int64_t i = 0; i < n; i++) v[i] = 2.0f * rt_u01_f32(rt_rng_u32(&r)) - 1.0f;
}

typedef struct Case {
    int ta, tb;
    int64_t m, n, k, batch;
    int64_t pad;     /* extra elements at the end of every row (pitch = cols + pad) */
    int broadcast_a; /* stride_a = 0 */
    float alpha, beta;
    int bf16; /* rt_bgemm_batched: A, B and C in bf16 */
    int bias; /* 1: RT_GEMM_BIAS (a vector of n added to every row); 2: RT_GEMM_BGRAD_B (B's column sums) */
} Case;

static int use_rows; /* run_case calls rt_sgemm_rows_batched / rt_bgemm_rows_batched (row-independent) instead */

static uint16_t *to_bf16(float *v, int64_t n) { /* v rounded in place; its bf16 bits returned */
    uint16_t *h = malloc((size_t)(n + 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++) {
        h[i] = rt_f32_to_bf16(v[i]);
        v[i] = rt_bf16_to_f32(h[i]);
    }
    return h;
}

/* Runs one case on `pool` and checks it against the naive loop; returns C (caller frees). */
static float *run_case(const Case *c, RtPool *pool, int check) {
    int64_t a_rows = c->ta ? c->k : c->m, a_cols = c->ta ? c->m : c->k;
    int64_t b_rows = c->tb ? c->n : c->k, b_cols = c->tb ? c->k : c->n;
    /* a pitch is at least 1, even for K = 0 (as BLAS requires) */
    int64_t lda = (a_cols > 0 ? a_cols : 1) + c->pad, ldb = (b_cols > 0 ? b_cols : 1) + c->pad, ldc = c->n + c->pad;
    int64_t sa = c->broadcast_a ? 0 : a_rows * lda + 3, sb = b_rows * ldb + 5, sc = c->m * ldc + 7;
    int64_t na = (c->broadcast_a ? 1 : c->batch) * (a_rows * lda + 3), nb = c->batch * sb, nc = c->batch * sc;
    float *a = malloc((size_t)(na + 1) * sizeof *a), *b = malloc((size_t)(nb + 1) * sizeof *b);
    float *cc = malloc((size_t)(nc + 1) * sizeof *cc), *c0 = malloc((size_t)(nc + 1) * sizeof *c0);
    float *v = malloc((size_t)(c->n + 1) * sizeof *v);
    fill(a, na, 1);
    fill(b, nb, 2);
    fill(c0, nc, 3);
    fill(v, c->n, 4);
    if (c->beta == 0.0f)
        for (int64_t i = 0; i < nc; i++) c0[i] = NAN; /* beta 0 must overwrite, not multiply */
    uint16_t *a16 = NULL, *b16 = NULL, *c16 = NULL, *c016 = NULL, *v16 = NULL;
    if (c->bf16) { /* the inputs become bf16 values, so the double reference uses exactly them */
        a16 = to_bf16(a, na);
        b16 = to_bf16(b, nb);
        v16 = to_bf16(v, c->n);
        c016 = to_bf16(c0, nc);
        c16 = malloc((size_t)(nc + 1) * sizeof *c16);
        memcpy(c16, c016, (size_t)nc * sizeof *c16);
    }
    memcpy(cc, c0, (size_t)nc * sizeof *cc);
    RtError e;
    int32_t ep = c->bias == 1 ? RT_GEMM_BIAS : c->bias == 2 ? RT_GEMM_BGRAD_B : RT_GEMM_PLAIN;
    RtStatus st;
    if (c->bf16)
        st = (use_rows ? rt_bgemm_rows_batched : rt_bgemm_batched)(pool, c->ta, c->tb, c->m, c->n, c->k, c->alpha, a16, lda, sa,
                                                                   b16, ldb, sb, c->beta, c16, ldc, sc, c->batch, ep,
                                                                   c->bias ? v16 : NULL, &e);
    else
        st = (use_rows ? rt_sgemm_rows_batched : rt_sgemm_batched)(pool, c->ta, c->tb, c->m, c->n, c->k, c->alpha, a, lda, sa, b,
                                                                   ldb, sb, c->beta, cc, ldc, sc, c->batch, ep,
                                                                   c->bias ? v : NULL, &e);
    for (int64_t i = 0; c->bf16 && i < nc; i++) cc[i] = rt_bf16_to_f32(c16[i]);
    CHECK(st == RT_OK, "ta %d tb %d m %lld n %lld k %lld: %s", c->ta, c->tb, (long long)c->m, (long long)c->n, (long long)c->k,
          e.msg);
    if (check && st == RT_OK) {
        int64_t bad = 0, untouched = 0;
        double worst = 0;
        for (int64_t bi = 0; bi < c->batch; bi++) {
            const float *A = a + bi * sa, *B = b + bi * sb;
            const float *C0 = c0 + bi * sc, *C = cc + bi * sc;
            for (int64_t i = 0; i < c->m; i++)
                for (int64_t j = 0; j < c->n; j++) {
                    double s = 0, mag = 0;
                    for (int64_t k = 0; k < c->k; k++) {
                        double x = c->ta ? A[k * lda + i] : A[i * lda + k];
                        double y = c->tb ? B[j * ldb + k] : B[k * ldb + j];
                        s += x * y;
                        mag += fabs(x * y);
                    }
                    double base = (c->beta == 0.0f ? 0.0 : (double)c->beta * C0[i * ldc + j]) + (c->bias == 1 ? v[j] : 0.0);
                    double ref = (double)c->alpha * s + base;
                    /* bf16: plus C's one rounding to nearest: half an ulp, at most 2^-8 relative (8 significand bits) */
                    double tol = 1e-5 * (fabs(c->alpha) * mag + fabs(base)) + (c->bf16 ? 0x1p-8 * fabs(ref) : 0) + 1e-30;
                    double err = fabs((double)C[i * ldc + j] - ref);
                    if (!(err <= tol)) bad++;
                    if (err / tol > worst) worst = err / tol;
                }
            /* the padding after each row and the gap between matrices are not written */
            for (int64_t i = 0; i < c->m; i++)
                for (int64_t j = c->n; j < ldc; j++) {
                    float x = C[i * ldc + j], y = C0[i * ldc + j];
                    untouched +=
                        c->bf16 ? c16[bi * sc + i * ldc + j] != c016[bi * sc + i * ldc + j] : memcmp(&x, &y, sizeof x) != 0;
                }
        }
        CHECK(bad == 0,
              "%s%s%sta %d tb %d m %lld n %lld k %lld batch %lld pad %lld alpha %g beta %g: %lld elements off (worst %.2g x tol)",
              use_rows ? "rows " : "", c->bf16 ? "bf16 " : "",
              c->bias == 1   ? "bias "
              : c->bias == 2 ? "bias gradient "
                             : "",
              c->ta, c->tb, (long long)c->m, (long long)c->n, (long long)c->k, (long long)c->batch, (long long)c->pad,
              (double)c->alpha, (double)c->beta, (long long)bad, worst);
        CHECK(untouched == 0, "%lld padding elements were written", (long long)untouched);
        for (int64_t j = 0; c->bias == 2 && j < c->n; j++) { /* B's column sums, in f32 (C's type) */
            double s = 0, mag = 0;
            for (int64_t k = 0; k < c->k; k++) {
                double y = c->tb ? b[j * ldb + k] : b[k * ldb + j];
                s += y;
                mag += fabs(y);
            }
            double got = c->bf16 ? rt_bf16_to_f32(v16[j]) : v[j];
            double tol = 1e-5 * mag + (c->bf16 ? 0x1p-8 * fabs(s) : 0) + 1e-30;
            if (!(fabs(got - s) <= tol)) bad++;
        }
        CHECK(bad == 0, "bias gradient: %lld column sums off", (long long)bad);
    }
    free(a);
    free(b);
    free(c0);
    free(a16);
    free(b16);
    free(c16);
    free(c016);
    free(v);
    free(v16);
    return cc;
}

/* ---- correctness -------------------------------------------------------------------------------- */

/* rt_bgemm_batched: every transpose, padded pitches (the padding must stay as it was), batches
 * with a broadcast A, beta 0 (C's NaNs ignored) and 1, and a product large enough to be tiled. */
static void bf16_products(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 2, &e) == RT_OK, "pool: %s", e.msg);
    for (int t = 0; t < 4; t++) {
        Case c = {t & 1, t >> 1, 17, 33, 40, 1, 3, 0, 1.0f, 0.0f, 1, 0};
        free(run_case(&c, p, 1));
        c.batch = 3;
        c.broadcast_a = 1;
        c.beta = 1.0f;
        free(run_case(&c, p, 1));
        c.pad = 0; /* contiguous C: converted back in one pass */
        c.broadcast_a = 0;
        c.beta = 0.0f;
        free(run_case(&c, p, 1));
    }
    Case big = {0, 1, 300, 200, 96, 1, 0, 0, 1.0f, 0.0f, 1, 0};
    free(run_case(&big, p, 1));
    big.bias = 1; /* added before C's rounding: within the same half ulp */
    free(run_case(&big, p, 1));
    Case biased = {1, 0, 17, 33, 40, 3, 3, 0, 1.0f, 1.0f, 1, 1};
    free(run_case(&biased, p, 1));
    for (int t = 0; t < 4; t++) { /* the bias gradient, rounded to bf16 once */
        Case bg = {t & 1, t >> 1, 300, 200, 96, 1, 2, 0, 1.0f, 0.0f, 1, 2};
        free(run_case(&bg, p, 1));
    }
    rt_pool_destroy(p);
}

static void all_transposes_small(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 2, &e) == RT_OK, "pool: %s", e.msg);
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 3}, {5, 1, 4}, {17, 33, 5}, {8, 8, 8}, {31, 2, 65}, {3, 4, 0}};
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int pad = 0; pad <= 3; pad += 3) {
                Case c = {t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 1, pad, 0, 1.0f, 0.0f, 0, 0};
                free(run_case(&c, p, 1));
                c.alpha = 0.5f;
                c.beta = 1.0f;
                free(run_case(&c, p, 1));
                c.alpha = -2.0f;
                c.beta = 0.25f;
                free(run_case(&c, p, 1));
                if (c.k == 0) continue; /* an epilogue needs k > 0 (argument_errors) */
                c.bias = 1;
                free(run_case(&c, p, 1));
                c.alpha = 1.0f;
                c.beta = 0.0f; /* the bias is C's starting value (blas.c) */
                free(run_case(&c, p, 1));
                c.bias = 2; /* B's column sums */
                free(run_case(&c, p, 1));
            }
    rt_pool_destroy(p);
}

static void batches_and_strides(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 3, &e) == RT_OK, "pool: %s", e.msg);
    for (int t = 0; t < 4; t++) {
        Case c = {t & 1, t >> 1, 12, 20, 16, 5, 2, 0, 1.0f, 0.0f, 0, 0}; /* attention-like: many small products */
        free(run_case(&c, p, 1));
        c.broadcast_a = 1; /* one A for every batch entry */
        c.beta = 1.0f;
        free(run_case(&c, p, 1));
    }
    rt_pool_destroy(p);
}

static void large_tiled(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 2, &e) == RT_OK, "pool: %s", e.msg);
    /* 300 x 260 x 200 = 15.6M multiply-adds: several tiles; 16 x 700 x 512: column tiles */
    for (int t = 0; t < 4; t++) {
        Case c = {t & 1, t >> 1, 300, 260, 200, 1, 1, 0, 1.0f, 0.0f, 0, 0};
        free(run_case(&c, p, 1));
        Case d = {t & 1, t >> 1, 16, 700, 512, 2, 0, 0, 1.0f, 1.0f, 0, 0};
        free(run_case(&d, p, 1));
        c.bias = d.bias = 1; /* each tile adds its own columns of the bias */
        free(run_case(&c, p, 1));
        free(run_case(&d, p, 1));
        c.bias = 2; /* column sums over k = 200, 260 columns: chunks of 64 */
        free(run_case(&c, p, 1));
    }
    rt_pool_destroy(p);
}

/* ---- determinism -------------------------------------------------------------------------------- */

static void thread_count_invariance(void) {
    Case cases[] = {
        {0, 0, 300, 260, 200, 1, 0, 0, 1.0f, 0.0f, 0, 0}, {1, 1, 16, 700, 512, 2, 1, 0, 1.0f, 1.0f, 0, 0},
        {0, 1, 64, 64, 64, 24, 0, 1, 0.125f, 0.0f, 0, 0}, {0, 0, 300, 260, 200, 1, 0, 0, 1.0f, 0.0f, 0, 1},
        {0, 1, 300, 260, 200, 1, 0, 0, 1.0f, 0.0f, 0, 2},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const Case *c = &cases[ci];
        int64_t nc = c->batch * (c->m * (c->n + c->pad) + 7);
        float *ref = NULL;
        for (int threads = 1; threads <= 4; threads++) {
            RtPool *p;
            RtError e;
            CHECK(rt_pool_create(&p, threads, &e) == RT_OK, "pool: %s", e.msg);
            float *out = run_case(c, p, 0);
            if (!ref) ref = out;
            else {
                CHECK(memcmp(ref, out, (size_t)nc * sizeof *out) == 0, "case %zu differs between 1 and %d threads", ci, threads);
                free(out);
            }
            rt_pool_destroy(p);
        }
        float *serial = run_case(c, NULL, 0);
        CHECK(memcmp(ref, serial, (size_t)nc * sizeof *serial) == 0, "case %zu differs without a pool", ci);
        free(serial);
        free(ref);
    }
}

/* ---- errors ------------------------------------------------------------------------------------- */

static void argument_errors(void) {
    float a[64] = {0}, b[64] = {0}, c[64] = {0};
    RtError e;
    CHECK(rt_sgemm_batched(NULL, 0, 0, -1, 2, 2, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_ERR_ARG,
          "negative m");
    CHECK_STR(e.msg, "sgemm: negative size (m -1, n 2, k 2, batch 1)", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 3, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_ERR_ARG,
          "short lda");
    CHECK_STR(e.msg, "sgemm: a row pitch is shorter than its row (lda 2 for 3 columns, ldb 2 for 2, ldc 2 for 2)", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 2, 1, a, 2, 4, b, 2, 4, 0, c, 2, 3, 2, RT_GEMM_PLAIN, NULL, &e) == RT_ERR_ARG,
          "overlapping C");
    CHECK_STR(e.msg, "sgemm: the C matrices of the batch overlap (stride 3, each spans 4 elements)", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, (int64_t)1 << 31, 2, 2, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, RT_GEMM_PLAIN, NULL, &e) ==
              RT_ERR_ARG,
          "m over 2^31");
    CHECK_STR(e.msg, "sgemm: a size or pitch exceeds OpenBLAS's 32-bit limit (m 2147483648, n 2, k 2)", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 2, 1, a, 2, 0, b, 2, 0, 0, NULL, 2, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_ERR_ARG,
          "NULL C");
    CHECK_STR(e.msg, "sgemm: a matrix pointer is NULL", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 2, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, 7, NULL, &e) == RT_ERR_ARG, "epilogue 7");
    CHECK_STR(e.msg, "sgemm: unknown epilogue 7", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 2, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, RT_GEMM_BIAS, NULL, &e) == RT_ERR_ARG,
          "bias without a vector");
    CHECK_STR(e.msg, "sgemm: the bias epilogue without its vector", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 2, 1, a, 2, 4, b, 2, 4, 0, c, 2, 4, 2, RT_GEMM_BGRAD_B, a + 32, &e) == RT_ERR_ARG,
          "bias gradient on a batch");
    CHECK_STR(e.msg, "sgemm: the bias-gradient epilogue on a batch of 2", "message");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 0, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, RT_GEMM_BIAS, a, &e) == RT_ERR_ARG,
          "bias with k = 0");
    CHECK_STR(e.msg, "sgemm: an epilogue on a product over nothing (k = 0)", "message");
    /* empty products are fine and touch nothing */
    c[0] = 5;
    CHECK(rt_sgemm_batched(NULL, 0, 0, 0, 2, 2, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_OK &&
              c[0] == 5,
          "m = 0");
    CHECK(rt_sgemm_batched(NULL, 0, 0, 2, 2, 2, 1, a, 2, 0, b, 2, 0, 0, c, 2, 0, 0, RT_GEMM_PLAIN, NULL, &e) == RT_OK &&
              c[0] == 5,
          "batch 0");
    const char *cfg = rt_blas_config();
    CHECK(cfg && strstr(cfg, "OpenBLAS"), "rt_blas_config() = '%s'", cfg ? cfg : "(null)");
}

/* ---- row-independent products (rt_sgemm_rows_batched) -------------------------------------------- */

/* The same contract as rt_sgemm_batched: every transpose, pitches, batches, alpha/beta, bias,
 * bf16, against the double loop. */
static void rows_products(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 2, &e) == RT_OK, "pool: %s", e.msg);
    use_rows = 1;
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 3},   {5, 1, 4}, {17, 33, 5},
                                        {8, 8, 8}, {31, 2, 65}, {3, 4, 0}, {37, 70, 96}};
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int pad = 0; pad <= 3; pad += 3) {
                Case c = {t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 1, pad, 0, 1.0f, 0.0f, 0, 0};
                free(run_case(&c, p, 1));
                c.alpha = -2.0f;
                c.beta = 0.25f;
                c.batch = 3;
                c.broadcast_a = 1;
                free(run_case(&c, p, 1));
                if (c.k == 0) continue;
                c.bias = 1;
                free(run_case(&c, p, 1));
                c.bf16 = 1;
                free(run_case(&c, p, 1));
            }
    use_rows = 0;
    rt_pool_destroy(p);
}

/* What the chunk phase needs: a row of C is the same bits whatever its index, the row count and
 * the other rows. Row i of a 16-row product (x @ w, and x @ w^T as a tied head reads it) against
 * the same row computed alone (m = 1) and at index 22 of a 37-row product whose other rows differ;
 * and over 1 and 3 threads. */
static void rows_independent(void) {
    RtPool *p;
    RtError e;
    CHECK(rt_pool_create(&p, 3, &e) == RT_OK, "pool: %s", e.msg);
    enum { M = 16, BIG = 37, AT = 22, N = 96, K = 67 };
    for (int tb = 0; tb <= 1; tb++) {
        float *a = malloc(sizeof(float) * BIG * K), *big = malloc(sizeof(float) * BIG * K), *w = malloc(sizeof(float) * N * K);
        float *bias = malloc(sizeof(float) * N), *c = malloc(sizeof(float) * M * N), *one = malloc(sizeof(float) * N);
        float *cbig = malloc(sizeof(float) * BIG * N);
        fill(a, M * K, 11);
        fill(big, BIG * K, 12);
        fill(w, N * K, 13);
        fill(bias, N, 14);
        int64_t ldb = tb ? K : N;
        CHECK(rt_sgemm_rows_batched(p, 0, tb, M, N, K, 1.0f, a, K, 0, w, ldb, 0, 0.0f, c, N, 0, 1, RT_GEMM_BIAS, bias, &e) ==
                  RT_OK,
              "%s", e.msg);
        int64_t bad_alone = 0, bad_big = 0;
        for (int i = 0; i < M; i++) {
            CHECK(rt_sgemm_rows_batched(NULL, 0, tb, 1, N, K, 1.0f, a + i * K, K, 0, w, ldb, 0, 0.0f, one, N, 0, 1, RT_GEMM_BIAS,
                                        bias, &e) == RT_OK,
                  "%s", e.msg);
            bad_alone += memcmp(one, c + i * N, sizeof(float) * N) != 0;
            memcpy(big + AT * K, a + i * K, sizeof(float) * K);
            CHECK(rt_sgemm_rows_batched(p, 0, tb, BIG, N, K, 1.0f, big, K, 0, w, ldb, 0, 0.0f, cbig, N, 0, 1, RT_GEMM_BIAS, bias,
                                        &e) == RT_OK,
                  "%s", e.msg);
            bad_big += memcmp(cbig + AT * N, c + i * N, sizeof(float) * N) != 0;
        }
        CHECK(bad_alone == 0, "tb %d: %lld of %d rows differ from the same row computed alone", tb, (long long)bad_alone, M);
        CHECK(bad_big == 0, "tb %d: %lld of %d rows differ at row %d of a %d-row product", tb, (long long)bad_big, M, AT, BIG);
        free(a), free(big), free(w), free(bias), free(c), free(one), free(cbig);
    }
    rt_pool_destroy(p);
}

/* RT_GEMM_ADD (fused LoRA: the scaled up product added to the base's): C = alpha AB + D is the
 * same bits as C = D then beta 1, for D apart from C and D being C (in place), for one matrix and
 * a batch, in rt_sgemm_batched (tiled: 300 x 200) and rt_sgemm_rows_batched; within the
 * tolerance of the double sum; refused with beta != 0, without its matrix, and in bf16. */
static void add_epilogue(void) {
    enum { M = 300, N = 200, K = 40, BATCH = 2 };
    RtPool *p = NULL;
    RtError e = {0};
    CHECK(rt_pool_create(&p, 3, &e) == RT_OK, "pool: %s", e.msg);
    float *a = malloc(sizeof(float) * BATCH * M * K), *b = malloc(sizeof(float) * BATCH * K * N);
    float *d = malloc(sizeof(float) * BATCH * M * N), *c = malloc(sizeof(float) * BATCH * M * N);
    float *want = malloc(sizeof(float) * BATCH * M * N);
    fill(a, BATCH * M * K, 1);
    fill(b, BATCH * K * N, 2);
    fill(d, BATCH * M * N, 3);
    for (int rows = 0; rows < 2; rows++)
        for (int64_t batch = 1; batch <= BATCH; batch++) {
            __typeof__(rt_sgemm_batched) *f = rows ? rt_sgemm_rows_batched : rt_sgemm_batched;
            int64_t sc = batch > 1 ? M * N : 0;
            memcpy(want, d, sizeof(float) * BATCH * M * N);
            CHECK(f(p, 0, 1, M, N, K, 2.0f, a, K, M * K, b, K, K * N, 1.0f, want, N, sc, batch, RT_GEMM_PLAIN, NULL, &e) == RT_OK,
                  "beta 1: %s", e.msg);
            memset(c, 0, sizeof(float) * BATCH * M * N);
            CHECK(f(p, 0, 1, M, N, K, 2.0f, a, K, M * K, b, K, K * N, 0.0f, c, N, sc, batch, RT_GEMM_ADD, d, &e) == RT_OK,
                  "add: %s", e.msg);
            CHECK(memcmp(c, want, sizeof(float) * (size_t)(batch * M * N)) == 0,
                  "%s batch %lld: the add epilogue is C = D, beta 1", rows ? "rows" : "tiled", (long long)batch);
            double worst = 0;
            for (int64_t t = 0; t < batch; t++)
                for (int64_t i = 0; i < M; i += 37)
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0, mag = 0;
                        for (int64_t q = 0; q < K; q++) {
                            double x = (double)a[t * M * K + i * K + q] * b[t * K * N + j * K + q];
                            s += x;
                            mag += fabs(x);
                        }
                        double err = fabs(c[t * M * N + i * N + j] - (2.0 * s + d[t * M * N + i * N + j])) / (2.0 * mag + 1.0);
                        if (err > worst) worst = err;
                    }
            CHECK(worst < 1e-5, "%s batch %lld: against the double sum, %g", rows ? "rows" : "tiled", (long long)batch, worst);
            memcpy(c, d, sizeof(float) * BATCH * M * N); /* in place: D is C */
            CHECK(f(p, 0, 1, M, N, K, 2.0f, a, K, M * K, b, K, K * N, 0.0f, c, N, sc, batch, RT_GEMM_ADD, c, &e) == RT_OK &&
                      memcmp(c, want, sizeof(float) * (size_t)(batch * M * N)) == 0,
                  "%s batch %lld: in place", rows ? "rows" : "tiled", (long long)batch);
        }
    CHECK(rt_sgemm_batched(p, 0, 1, M, N, K, 1.0f, a, K, 0, b, K, 0, 1.0f, c, N, 0, 1, RT_GEMM_ADD, d, &e) == RT_ERR_ARG,
          "beta 1");
    CHECK_STR(e.msg, "sgemm: the add epilogue with beta 1 (it needs 0)", "message");
    CHECK(rt_sgemm_batched(p, 0, 1, M, N, K, 1.0f, a, K, 0, b, K, 0, 0.0f, c, N, 0, 1, RT_GEMM_ADD, NULL, &e) == RT_ERR_ARG,
          "no matrix");
    CHECK_STR(e.msg, "sgemm: the add epilogue without its matrix", "message");
    uint16_t h[4] = {0};
    CHECK(rt_bgemm_batched(p, 0, 0, 2, 2, 1, 1.0f, h, 1, 0, h, 2, 0, 0.0f, h, 2, 0, 1, RT_GEMM_ADD, h, &e) == RT_ERR_ARG, "bf16");
    CHECK_STR(e.msg, "bgemm: the add epilogue is for f32 products only", "message");
    free(a), free(b), free(c), free(d), free(want);
    rt_pool_destroy(p);
}

/* rt_lora_f32 (fused LoRA: S = x op(A), then C = D + alpha S op(B), by row tiles) against the double
 * sums, for one matrix and a batch of 2 (the adapters' strides), with A and B transposed (PEFT's
 * [r, k] and [n, r], the layout the compiler passes) and not, 1500 rows (rank 6: tiles of 672
 * rows, three, the last short): S as stored, C; with S not kept the same C bits; D being C (in place) the same bits;
 * 1 and 3 threads the same bits; and refused with a rank above 64 or a NULL matrix. The control:
 * the check finds a C computed with the scaling 1.5 times too large. */
static void lora_fused(void) {
    enum { M = 1500, K = 24, R = 6, N = 40, BATCH = 2 };
    RtPool *p1 = NULL, *p3 = NULL;
    RtError e = {0};
    CHECK(rt_pool_create(&p1, 1, &e) == RT_OK && rt_pool_create(&p3, 3, &e) == RT_OK, "pools: %s", e.msg);
    float *x = malloc(sizeof(float) * BATCH * M * K), *a = malloc(sizeof(float) * BATCH * R * K);
    float *b = malloc(sizeof(float) * BATCH * N * R), *d = malloc(sizeof(float) * BATCH * M * N);
    float *s = malloc(sizeof(float) * BATCH * M * R), *c = malloc(sizeof(float) * BATCH * M * N);
    float *c2 = malloc(sizeof(float) * BATCH * M * N), *bad = malloc(sizeof(float) * BATCH * M * N);
    fill(x, BATCH * M * K, 4);
    fill(a, BATCH * R * K, 5);
    fill(b, BATCH * N * R, 6);
    fill(d, BATCH * M * N, 7);
    const float alpha = 2.5f;
    for (int64_t batch = 1; batch <= BATCH; batch++)
        for (int tr = 0; tr < 2; tr++) {
            /* tr: A [R, K] and B [N, R] read transposed (lda K, ldb R); else A [K, R], B [R, N] */
            int64_t lda = tr ? K : R, ldb = tr ? R : N;
            int64_t sx = batch > 1 ? M * K : 0, sa = batch > 1 ? R * K : 0, sb = batch > 1 ? N * R : 0;
            CHECK(rt_lora_f32(p3, batch, M, K, R, N, K, sx, lda, sa, ldb, sb, tr, tr, alpha, x, a, b, d, s, c, &e) == RT_OK, "%s",
                  e.msg);
            CHECK(rt_lora_f32(p3, batch, M, K, R, N, K, sx, lda, sa, ldb, sb, tr, tr, 1.5f * alpha, x, a, b, d, NULL, bad, &e) ==
                      RT_OK,
                  "%s", e.msg);
            double worst_s = 0, worst_c = 0, worst_bad = 0;
            for (int64_t t = 0; t < batch; t++)
                for (int64_t i = 0; i < M; i++) {
                    double sq[R], smag[R];
                    for (int q = 0; q < R; q++) {
                        sq[q] = smag[q] = 0;
                        for (int64_t k = 0; k < K; k++) {
                            double v = (double)x[t * sx + i * K + k] * a[t * sa + (tr ? q * lda + k : k * lda + q)];
                            sq[q] += v;
                            smag[q] += fabs(v);
                        }
                        double err = fabs(s[(t * M + i) * R + q] - sq[q]) / (smag[q] + 1.0);
                        if (err > worst_s) worst_s = err;
                    }
                    for (int64_t j = 0; j < N; j++) {
                        double u = 0, mag = 0;
                        for (int q = 0; q < R; q++) {
                            double v = sq[q] * b[t * sb + (tr ? j * ldb + q : q * ldb + j)];
                            u += v;
                            mag += fabs(v);
                        }
                        double want = d[(t * M + i) * N + j] + alpha * u,
                               scale = alpha * mag + fabs(d[(t * M + i) * N + j]) + 1.0;
                        double err = fabs(c[(t * M + i) * N + j] - want) / scale;
                        double errb = fabs(bad[(t * M + i) * N + j] - want) / scale;
                        if (err > worst_c) worst_c = err;
                        if (errb > worst_bad) worst_bad = errb;
                    }
                }
            CHECK(worst_s < 1e-6 && worst_c < 1e-6, "batch %lld, transposed %d: S %.3g, C %.3g against the double sums",
                  (long long)batch, tr, worst_s, worst_c);
            CHECK(worst_bad > 1e-3, "batch %lld, transposed %d: the control (scaling x1.5) is caught: %.3g", (long long)batch, tr,
                  worst_bad);
            CHECK(rt_lora_f32(p1, batch, M, K, R, N, K, sx, lda, sa, ldb, sb, tr, tr, alpha, x, a, b, d, NULL, c2, &e) == RT_OK &&
                      memcmp(c, c2, sizeof(float) * (size_t)(batch * M * N)) == 0,
                  "batch %lld, transposed %d: 1 thread, S not kept: the same bits", (long long)batch, tr);
            memcpy(c2, d, sizeof(float) * (size_t)(batch * M * N));
            CHECK(rt_lora_f32(p3, batch, M, K, R, N, K, sx, lda, sa, ldb, sb, tr, tr, alpha, x, a, b, c2, NULL, c2, &e) ==
                          RT_OK &&
                      memcmp(c, c2, sizeof(float) * (size_t)(batch * M * N)) == 0,
                  "batch %lld, transposed %d: D being C, the same bits", (long long)batch, tr);
        }
    CHECK(rt_lora_f32(p1, 1, M, K, 65, N, K, 0, K, 0, 65, 0, 1, 1, 1.0f, x, a, b, d, NULL, c, &e) == RT_ERR_ARG, "rank 65");
    CHECK_STR(e.msg, "lora: batch 1, rows 1500, k 24, rank 65 (1 to 64), n 40", "message");
    CHECK(rt_lora_f32(p1, 1, M, K, R, N, K, 0, K, 0, R, 0, 1, 1, 1.0f, x, NULL, b, d, NULL, c, &e) == RT_ERR_ARG, "no A");
    CHECK_STR(e.msg, "lora: a matrix pointer is NULL", "message");
    free(x), free(a), free(b), free(d), free(s), free(c), free(c2), free(bad);
    rt_pool_destroy(p1);
    rt_pool_destroy(p3);
}

int main(void) {
    RUN(add_epilogue);
    RUN(lora_fused);
    RUN(all_transposes_small);
    RUN(batches_and_strides);
    RUN(large_tiled);
    RUN(thread_count_invariance);
    RUN(argument_errors);
    RUN(bf16_products);
    RUN(rows_products);
    RUN(rows_independent);
    return unit_finish();
}
