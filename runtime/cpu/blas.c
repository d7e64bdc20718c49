/* blas.c - batched SGEMM for the CPU back end, on OpenBLAS's cblas_sgemm (see rt_program.h).
 *
 * Pipeline position: every matrix multiply of a compiled program on the CPU (`x @ w`, attention's
 * q @ k.T) is a call to rt_sgemm_batched from the generated host code; the elementwise work
 * around it is fused kernels run on the same thread pool.
 *
 * Threading. OpenBLAS can parallelise one GEMM with its own threads, but then two pools would
 * compete for the cores (the runtime's between GEMMs, OpenBLAS's during them) and a result could
 * depend on how OpenBLAS split the work for the thread count it had. Instead OpenBLAS is told to
 * run single-threaded and the runtime's pool runs the tiles: the batch and each C matrix are cut
 * into tiles whose size is a function of (M, N, K) alone, each tile is one single-threaded
 * cblas_sgemm call, and the pool hands tiles to threads. Every element of C is then computed by
 * the same code on the same data for any --threads, so results are bit-identical across thread
 * counts, small batched products (attention heads) are spread over the cores, and --threads is
 * the one knob. OpenBLAS's threaded build is safe to call from several threads at once when each
 * call is single-threaded. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "rt_gemm.h"
#include "rt_profile.h"

/* ---- tiling ------------------------------------------------------------------------------------- */

/* A tile is about this many multiply-adds (8 Mi: ~0.2 ms on one core). On a 2-vCPU EPYC VM a
 * 1024^3 product tiled at 2^22 ran ~15-25% below one untiled call, at 2^24 ~10%; 2^23 keeps most
 * of that while a 256 x 768 x 768 product (a GPT-2 small layer at 256 tokens) still makes 18 tiles
 * and 1024^3 makes 128, enough for 16-64 cores. */
#define RT_GEMM_TILE_MACS (INT64_C(1) << 23)
#define RT_GEMM_MIN_ROWS 16 /* tiles keep whole micro-kernel panels */
#define RT_GEMM_MIN_COLS 64

static int64_t rt_round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

typedef struct RtGemmJob {
    CBLAS_TRANSPOSE ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    const float *bias; /* RT_GEMM_BIAS: added to every row; else NULL */
    int64_t lda, ldb, ldc, sa, sb, sc;
    int64_t bm, bn; /* tile size */
    int64_t tm, tn; /* tiles per matrix in each direction */
} RtGemmJob;

static void rt_gemm_tiles(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtGemmJob *j = ctx;
    int64_t per = j->tm * j->tn;
    for (int64_t t = begin; t < end; t++) {
        int64_t bi = t / per, r = t % per;
        int64_t r0 = (r / j->tn) * j->bm, c0 = (r % j->tn) * j->bn;
        int64_t rows = j->m - r0 < j->bm ? j->m - r0 : j->bm;
        int64_t cols = j->n - c0 < j->bn ? j->n - c0 : j->bn;
        const float *a = j->a + bi * j->sa + (j->ta == CblasTrans ? r0 : r0 * j->lda);
        const float *b = j->b + bi * j->sb + (j->tb == CblasTrans ? c0 * j->ldb : c0);
        float *c = j->c + bi * j->sc + r0 * j->ldc + c0;
        float beta = j->beta;
        if (j->bias && beta == 0.0f) { /* C = bias, then C = alpha AB + C: the bias joins the sum unrounded */
            for (int64_t i = 0; i < rows; i++) memcpy(c + i * j->ldc, j->bias + c0, sizeof(float) * (size_t)cols);
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, j->ta, j->tb, (int)rows, (int)cols, (int)j->k, j->alpha, a, (int)j->lda, b, (int)j->ldb, beta,
                    c, (int)j->ldc);
        if (j->bias && j->beta != 0.0f)
            for (int64_t i = 0; i < rows; i++)
                for (int64_t x = 0; x < cols; x++) c[i * j->ldc + x] += j->bias[c0 + x];
    }
}

/* RT_GEMM_BGRAD_B: out[j] = sum over p < k of op(B)[p, j], in f32 and in order, 64 columns a job
 * (so the sums never depend on the thread count). */
#define RT_COLSUM_COLS 64

typedef struct RtColsumJob {
    const float *b;
    int64_t n, k, ldb;
    int trans;
    float *out;
} RtColsumJob;

static void rt_colsum_chunks(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtColsumJob *j = ctx;
    for (int64_t chunk = begin; chunk < end; chunk++) {
        int64_t j0 = chunk * RT_COLSUM_COLS, j1 = j0 + RT_COLSUM_COLS < j->n ? j0 + RT_COLSUM_COLS : j->n;
        for (int64_t c = j0; c < j1; c++) j->out[c] = 0.0f;
        for (int64_t p = 0; p < j->k; p++)
            for (int64_t c = j0; c < j1; c++) j->out[c] += j->trans ? j->b[c * j->ldb + p] : j->b[p * j->ldb + c];
    }
}

/* ---- the call ----------------------------------------------------------------------------------- */

/* The contract's argument rules (rt_gemm.h), shared with the GPU's GEMM (gpu_blas.c). */
RtStatus rt_sgemm_check(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda, int64_t stride_a,
                        const void *b, int64_t ldb, int64_t stride_b, const void *c, int64_t ldc, int64_t stride_c, int64_t batch,
                        int32_t epilogue, const void *vec, int *nothing, RtError *err) {
    *nothing = 0;
    if (epilogue != RT_GEMM_PLAIN && epilogue != RT_GEMM_BIAS && epilogue != RT_GEMM_BGRAD_B && epilogue != RT_GEMM_ADD)
        return rt_fail(err, RT_ERR_ARG, "sgemm: unknown epilogue %d", (int)epilogue);
    if (epilogue != RT_GEMM_PLAIN && !vec)
        return rt_fail(err, RT_ERR_ARG, "sgemm: the %s epilogue without its %s",
                       epilogue == RT_GEMM_BIAS  ? "bias"
                       : epilogue == RT_GEMM_ADD ? "add"
                                                 : "bias-gradient",
                       epilogue == RT_GEMM_ADD ? "matrix" : "vector");
    if (epilogue != RT_GEMM_PLAIN && k == 0)
        return rt_fail(err, RT_ERR_ARG, "sgemm: an epilogue on a product over nothing (k = 0)");
    if (epilogue == RT_GEMM_BGRAD_B && batch != 1)
        return rt_fail(err, RT_ERR_ARG, "sgemm: the bias-gradient epilogue on a batch of %lld", (long long)batch);
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return rt_fail(err, RT_ERR_ARG, "sgemm: negative size (m %lld, n %lld, k %lld, batch %lld)", (long long)m, (long long)n,
                       (long long)k, (long long)batch);
    int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) || ldc < (n > 1 ? n : 1))
        return rt_fail(err, RT_ERR_ARG,
                       "sgemm: a row pitch is shorter than its row (lda %lld for %lld columns, ldb %lld for %lld, ldc %lld "
                       "for %lld)",
                       (long long)lda, (long long)a_cols, (long long)ldb, (long long)b_cols, (long long)ldc, (long long)n);
    if (stride_a < 0 || stride_b < 0 || stride_c < 0) return rt_fail(err, RT_ERR_ARG, "sgemm: negative batch stride");
    if (m == 0 || n == 0 || batch == 0) {
        *nothing = 1;
        return RT_OK;
    }
    /* Each C matrix spans (m - 1) x ldc + n elements (ldc >= 1 here, so the division is safe). */
    if (m - 1 > (INT64_MAX - n) / ldc)
        return rt_fail(err, RT_ERR_ARG, "sgemm: a C matrix spans more than 2^63 elements (m %lld, ldc %lld)", (long long)m,
                       (long long)ldc);
    if (batch > 1 && stride_c < (m - 1) * ldc + n)
        return rt_fail(err, RT_ERR_ARG, "sgemm: the C matrices of the batch overlap (stride %lld, each spans %lld elements)",
                       (long long)stride_c, (long long)((m - 1) * ldc + n));
    if ((k > 0 && (!a || !b)) || !c) return rt_fail(err, RT_ERR_ARG, "sgemm: a matrix pointer is NULL");
    return RT_OK;
}

/* MBT_PROFILE (rt_profile.h): a product's wall time, its tiles included, counts as GEMM time; the
 * pool does not count the parallel loops inside it again. rt_gemm_time_begin returns the profile
 * when this call is the outermost timed one (else NULL: nothing to do; off, one NULL test), and
 * rt_gemm_time_end adds the call as one GEMM of that shape. */
static RtProfile *rt_gemm_time_begin(RtPool *pool) {
    RtProfile *prof = rt_pool_profile(pool);
    if (!prof || prof->depth != 0) return NULL;
    prof->depth = 1;
    prof->gemm_t0 = rt_profile_now();
    return prof;
}

static void rt_gemm_time_end(RtProfile *prof, int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t batch) {
    if (!prof) return;
    rt_profile_gemm(prof, ta, tb, m, n, k, batch, rt_profile_now() - prof->gemm_t0);
    prof->depth = 0;
}

/* RT_GEMM_ADD: C starts as the matrix vec (unless vec is C), then the product adds itself with
 * beta 1 - the sum is the one the bias epilogue forms, alpha AB + D rounded once. Returns with
 * *done set when there is nothing more to do (an error, or nothing to compute). */
static RtStatus rt_gemm_add_start(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                  int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                                  int64_t ldc, int64_t stride_c, int64_t batch, const float *vec, int *done, RtError *err) {
    int nothing = 0;
    *done = 1;
    RtStatus st = rt_sgemm_check(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch,
                                 RT_GEMM_ADD, vec, &nothing, err);
    if (st != RT_OK || nothing) return st;
    if (beta != 0.0f) return rt_fail(err, RT_ERR_ARG, "sgemm: the add epilogue with beta %g (it needs 0)", (double)beta);
    if (vec != c)
        for (int64_t t = 0; t < batch; t++)
            for (int64_t i = 0; i < m; i++)
                memmove(c + t * stride_c + i * ldc, vec + t * stride_c + i * ldc, sizeof(float) * (size_t)n);
    *done = 0;
    return RT_OK;
}

RtStatus rt_sgemm_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                          int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec, RtError *err) {
    if (epilogue == RT_GEMM_ADD) {
        int done;
        RtStatus st = rt_gemm_add_start(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                                        batch, vec, &done, err);
        if (st != RT_OK || done) return st;
        return rt_sgemm_batched(pool, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, 1.0f, c, ldc,
                                stride_c, batch, RT_GEMM_PLAIN, NULL, err);
    }
    int nothing = 0;
    RtStatus st = rt_sgemm_check(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, epilogue,
                                 vec, &nothing, err);
    if (st != RT_OK) return st;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return rt_fail(err, RT_ERR_ARG, "sgemm: a size or pitch exceeds OpenBLAS's 32-bit limit (m %lld, n %lld, k %lld)",
                       (long long)m, (long long)n, (long long)k);
    if (nothing) return RT_OK;

    /* OpenBLAS's own threads stay idle: the pool supplies the parallelism (see the top). */
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);

    RtGemmJob j = {trans_a ? CblasTrans : CblasNoTrans,
                   trans_b ? CblasTrans : CblasNoTrans,
                   m,
                   n,
                   k,
                   alpha,
                   beta,
                   a,
                   b,
                   c,
                   epilogue == RT_GEMM_BIAS ? vec : NULL,
                   lda,
                   ldb,
                   ldc,
                   stride_a,
                   stride_b,
                   stride_c,
                   m,
                   n,
                   1,
                   1};
    /* Halve the larger side of the tile (rows preferred) until it is about RT_GEMM_TILE_MACS: a
     * function of (m, n, k) only, so the tiling never depends on the thread count. */
    int64_t kk = k > 0 ? k : 1;
    while ((double)j.bm * (double)j.bn * (double)kk > (double)RT_GEMM_TILE_MACS) {
        if (j.bm >= 2 * RT_GEMM_MIN_ROWS && (j.bm * 4 >= j.bn || j.bn < 2 * RT_GEMM_MIN_COLS))
            j.bm = rt_round_up((j.bm + 1) / 2, RT_GEMM_MIN_ROWS);
        else if (j.bn >= 2 * RT_GEMM_MIN_COLS) j.bn = rt_round_up((j.bn + 1) / 2, RT_GEMM_MIN_COLS);
        else break;
    }
    j.tm = (m + j.bm - 1) / j.bm;
    j.tn = (n + j.bn - 1) / j.bn;
    RtProfile *prof = rt_gemm_time_begin(pool); /* MBT_PROFILE: the call, tiles included */
    rt_parallel_for(pool, batch * j.tm * j.tn, rt_gemm_tiles, &j);
    if (epilogue == RT_GEMM_BGRAD_B) {
        RtColsumJob cj = {b, n, k, ldb, trans_b != 0, (float *)vec};
        rt_parallel_for(pool, (n + RT_COLSUM_COLS - 1) / RT_COLSUM_COLS, rt_colsum_chunks, &cj);
    }
    rt_gemm_time_end(prof, trans_a != 0, trans_b != 0, m, n, k, batch);
    return RT_OK;
}

/* ---- row-independent products (rt_sgemm_rows_batched) ------------------------------------------ */

/* OpenBLAS rounds a row of C differently depending on its index in the matrix and on the matrix's
 * row count (its micro-kernels block rows, and a row's sum is split differently in a full block and
 * in an edge block). The chunk phase (the KV cache) needs a token's row to come out the same bits
 * wherever it sits in a call and whoever shares the call, so its products run here instead: every
 * element C[i][j] is alpha x (the sum over p = 0, 1, ..., k-1 of A[i][p] x B[p][j], each product
 * rounded, then added in that order) then + beta x C[i][j], then + bias[j] - a function of row i of
 * A and column j of B alone. Vectors run across columns (8 at a time), never across the sum, and
 * no multiply is fused with its add (ISO C's FP_CONTRACT off, no FMA target), so the AVX2 path and
 * the generic one give the same bits too, and so do the four-row and the one-row micro-kernels. A
 * tile is RT_ROWS_CB columns of every row of one matrix of the batch: B's rows are read in place
 * (x @ w), or its columns packed, zero-padded (x @ w^T, and a last tile narrower than 16); rows
 * go RT_ROWS_RB at a time, the rest one at a time. */
#define RT_ROWS_RB 4
#define RT_ROWS_CB 16

typedef float RtV8 __attribute__((vector_size(32)));

typedef struct RtRowsJob {
    int ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    const float *bias;
    int64_t lda, ldb, ldc, sa, sb, sc;
    int64_t tn; /* column tiles a matrix */
    int avx2;
} RtRowsJob;

/* out[r][x] = sum over p of arow[r][p * as] x panel[p * ps + x], in order of p, for r < nr (a
 * constant where it is inlined): one row or four, the same operations on each element either way. */
static inline __attribute__((always_inline)) void rt_rows_micro_body(int nr, const float *const *arow, int64_t as,
                                                                     const float *panel, int64_t ps, int64_t k,
                                                                     float out[RT_ROWS_RB][RT_ROWS_CB]) {
    RtV8 acc[RT_ROWS_RB][2];
    memset(acc, 0, sizeof acc);
    for (int64_t p = 0; p < k; p++) {
        RtV8 b0, b1;
        memcpy(&b0, panel + p * ps, sizeof b0);
        memcpy(&b1, panel + p * ps + 8, sizeof b1);
        for (int r = 0; r < nr; r++) {
            float av = arow[r][p * as];
            acc[r][0] += av * b0;
            acc[r][1] += av * b1;
        }
    }
    memcpy(out, acc, sizeof acc);
}

typedef void (*RtRowsMicro)(const float *const *, int64_t, const float *, int64_t, int64_t, float[RT_ROWS_RB][RT_ROWS_CB]);

__attribute__((target("avx2"))) static void rt_rows_micro4_avx2(const float *const *arow, int64_t as, const float *panel,
                                                                int64_t ps, int64_t k, float out[RT_ROWS_RB][RT_ROWS_CB]) {
    rt_rows_micro_body(RT_ROWS_RB, arow, as, panel, ps, k, out);
}
__attribute__((target("avx2"))) static void rt_rows_micro1_avx2(const float *const *arow, int64_t as, const float *panel,
                                                                int64_t ps, int64_t k, float out[RT_ROWS_RB][RT_ROWS_CB]) {
    rt_rows_micro_body(1, arow, as, panel, ps, k, out);
}
static void rt_rows_micro4_generic(const float *const *arow, int64_t as, const float *panel, int64_t ps, int64_t k,
                                   float out[RT_ROWS_RB][RT_ROWS_CB]) {
    rt_rows_micro_body(RT_ROWS_RB, arow, as, panel, ps, k, out);
}
static void rt_rows_micro1_generic(const float *const *arow, int64_t as, const float *panel, int64_t ps, int64_t k,
                                   float out[RT_ROWS_RB][RT_ROWS_CB]) {
    rt_rows_micro_body(1, arow, as, panel, ps, k, out);
}

static void rt_rows_tiles(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtRowsJob *j = ctx;
    RtRowsMicro micro4 = j->avx2 ? rt_rows_micro4_avx2 : rt_rows_micro4_generic;
    RtRowsMicro micro1 = j->avx2 ? rt_rows_micro1_avx2 : rt_rows_micro1_generic;
    float *pack = NULL;
    for (int64_t t = begin; t < end; t++) {
        int64_t bi = t / j->tn, c0 = (t % j->tn) * RT_ROWS_CB;
        int64_t cols = j->n - c0 < RT_ROWS_CB ? j->n - c0 : RT_ROWS_CB;
        const float *a = j->a + bi * j->sa, *b = j->b + bi * j->sb;
        float *c = j->c + bi * j->sc;
        const float *panel = b + c0; /* B's rows as they are when they hold the tile's 16 columns */
        int64_t ps = j->ldb;
        if (j->tb || cols < RT_ROWS_CB) { /* else packed: op(B)'s columns, zero-padded */
            if (!pack) pack = malloc(sizeof(float) * (size_t)(j->k > 0 ? j->k : 1) * RT_ROWS_CB);
            if (!pack) abort(); /* k x 16 floats; the caller checked the product's own sizes */
            for (int64_t p = 0; p < j->k; p++)
                for (int64_t x = 0; x < RT_ROWS_CB; x++)
                    pack[p * RT_ROWS_CB + x] = x >= cols ? 0.0f : j->tb ? b[(c0 + x) * j->ldb + p] : b[p * j->ldb + c0 + x];
            panel = pack, ps = RT_ROWS_CB;
        }
        for (int64_t i0 = 0; i0 < j->m;) {
            int nr = j->m - i0 >= RT_ROWS_RB ? RT_ROWS_RB : 1;
            const float *arow[RT_ROWS_RB];
            for (int r = 0; r < RT_ROWS_RB; r++) {
                int64_t i = i0 + (r < nr ? r : 0);
                arow[r] = j->ta ? a + i : a + i * j->lda;
            }
            float out[RT_ROWS_RB][RT_ROWS_CB];
            (nr == RT_ROWS_RB ? micro4 : micro1)(arow, j->ta ? j->lda : 1, panel, ps, j->k, out);
            for (int r = 0; r < nr; r++) {
                float *cr = c + (i0 + r) * j->ldc + c0;
                for (int64_t x = 0; x < cols; x++) {
                    float v = j->alpha * out[r][x];
                    if (j->beta != 0.0f) v += j->beta * cr[x];
                    if (j->bias) v += j->bias[c0 + x];
                    cr[x] = v;
                }
            }
            i0 += nr;
        }
    }
    free(pack);
}

RtStatus rt_sgemm_rows_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                               float beta, float *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                               RtError *err) {
    if (epilogue == RT_GEMM_ADD) { /* C = vec, then beta 1: each row still a function of its own rows alone */
        int done;
        RtStatus st = rt_gemm_add_start(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                                        batch, vec, &done, err);
        if (st != RT_OK || done) return st;
        return rt_sgemm_rows_batched(pool, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, 1.0f, c, ldc,
                                     stride_c, batch, RT_GEMM_PLAIN, NULL, err);
    }
    /* The bias gradient is a training product (a sum over rows): never in the chunk phase; OpenBLAS. */
    if (epilogue == RT_GEMM_BGRAD_B)
        return rt_sgemm_batched(pool, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                                stride_c, batch, epilogue, vec, err);
    int nothing = 0;
    RtStatus st = rt_sgemm_check(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, epilogue,
                                 vec, &nothing, err);
    if (st != RT_OK || nothing) return st;
    int avx2 = __builtin_cpu_supports("avx2") ? 1 : 0; /* either path gives the same bits (above) */
    RtRowsJob j = {trans_a != 0,
                   trans_b != 0,
                   m,
                   n,
                   k,
                   alpha,
                   beta,
                   a,
                   b,
                   c,
                   epilogue == RT_GEMM_BIAS ? vec : NULL,
                   lda,
                   ldb,
                   ldc,
                   stride_a,
                   stride_b,
                   stride_c,
                   (n + RT_ROWS_CB - 1) / RT_ROWS_CB,
                   avx2};
    RtProfile *prof = rt_gemm_time_begin(pool);
    rt_parallel_for(pool, batch * j.tn, rt_rows_tiles, &j);
    rt_gemm_time_end(prof, trans_a != 0, trans_b != 0, m, n, k, batch);
    return RT_OK;
}

/* ---- bf16 ---------------------------------------------------------------------------------------- */

/* The elements a strided batch of matrices spans: rows x cols at pitch ld, batch of them at stride
 * (0 broadcasts one). */
static int64_t rt_gemm_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
    if (rows == 0 || cols == 0) return 0;
    return (stride ? (batch - 1) * stride : 0) + (rows - 1) * ld + cols;
}

typedef struct RtConvert {
    const uint16_t *from16;
    const float *from32;
    float *to32;
    uint16_t *to16;
} RtConvert;

#define RT_CONVERT_CHUNK 65536

static void rt_convert_chunks(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtConvert *c = ctx;
    for (int64_t i = begin * RT_CONVERT_CHUNK; i < end * RT_CONVERT_CHUNK; i++) {
        if (c->to32) c->to32[i] = rt_bf16_to_f32(c->from16[i]);
        else c->to16[i] = rt_f32_to_bf16(c->from32[i]);
    }
}

/* n elements between bf16 and f32, on the pool (the tail after the last whole chunk here). */
static void rt_convert(RtPool *pool, const uint16_t *from16, const float *from32, float *to32, uint16_t *to16, int64_t n) {
    RtConvert c = {from16, from32, to32, to16};
    int64_t chunks = n / RT_CONVERT_CHUNK;
    rt_parallel_for(pool, chunks, rt_convert_chunks, &c);
    for (int64_t i = chunks * RT_CONVERT_CHUNK; i < n; i++) {
        if (to32) to32[i] = rt_bf16_to_f32(from16[i]);
        else to16[i] = rt_f32_to_bf16(from32[i]);
    }
}

typedef RtStatus (*RtSgemmFn)(RtPool *, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, int64_t,
                              const float *, int64_t, int64_t, float, float *, int64_t, int64_t, int64_t, int32_t, void *,
                              RtError *);

/* bf16 through the f32 product `f` (rt_sgemm_batched, or rt_sgemm_rows_batched) on widened copies. */
static RtStatus rt_bgemm_via(RtSgemmFn f, RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const uint16_t *a, int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b,
                             float beta, uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                             RtError *err) {
    /* The argument rules are sgemm's, on the same element counts (the pointers are only compared). */
    int nothing = 0;
    RtStatus st = rt_sgemm_check(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, epilogue,
                                 vec, &nothing, err);
    if (st != RT_OK || nothing) return st;
    if (epilogue == RT_GEMM_ADD) /* the compiler folds only f32 products into their addend (fl_gemm_add) */
        return rt_fail(err, RT_ERR_ARG, "bgemm: the add epilogue is for f32 products only");
    int64_t na = k ? rt_gemm_span(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch) : 0;
    int64_t nb = k ? rt_gemm_span(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch) : 0;
    int64_t nc = rt_gemm_span(m, n, ldc, stride_c, batch);
    int64_t nv = epilogue != RT_GEMM_PLAIN ? n : 0;
    float *fa = malloc(sizeof(float) * (size_t)(na + nb + nc + nv));
    if (!fa)
        return rt_fail(err, RT_ERR_NOMEM, "bgemm: no memory for the f32 copies of a %lld x %lld x %lld product", (long long)m,
                       (long long)n, (long long)k);
    float *fb = fa + na, *fc = fb + nb, *fv = fc + nc;
    /* The gaps between rows and matrices are copied too: their values never reach C. */
    rt_convert(pool, a, NULL, fa, NULL, na);
    rt_convert(pool, b, NULL, fb, NULL, nb);
    if (epilogue == RT_GEMM_BIAS) rt_convert(pool, vec, NULL, fv, NULL, nv);
    if (beta != 0) rt_convert(pool, c, NULL, fc, NULL, nc);
    st = f(pool, trans_a, trans_b, m, n, k, alpha, fa, lda, stride_a, fb, ldb, stride_b, beta, fc, ldc, stride_c, batch, epilogue,
           fv, err);
    if (st == RT_OK && epilogue == RT_GEMM_BGRAD_B) rt_convert(pool, NULL, fv, NULL, (uint16_t *)vec, nv);
    if (st == RT_OK && ldc == n && (batch == 1 || stride_c == m * n)) {
        rt_convert(pool, NULL, fc, NULL, c, nc);
    } else if (st == RT_OK) { /* only C's own elements: the gaps between its rows may be another tensor's */
        for (int64_t bi = 0; bi < batch; bi++)
            for (int64_t i = 0; i < m; i++) {
                int64_t o = bi * stride_c + i * ldc;
                rt_convert(pool, NULL, fc + o, NULL, c + o, n);
            }
    }
    free(fa);
    return st;
}

RtStatus rt_bgemm_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                          int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                          uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec, RtError *err) {
    return rt_bgemm_via(rt_sgemm_batched, pool, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                        ldc, stride_c, batch, epilogue, vec, err);
}

RtStatus rt_bgemm_rows_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b,
                               float beta, uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                               RtError *err) {
    return rt_bgemm_via(rt_sgemm_rows_batched, pool, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                        c, ldc, stride_c, batch, epilogue, vec, err);
}

const char *rt_blas_config(void) { return openblas_get_config(); }

/* ---- fused LoRA: the down and up products by row tiles ------------------------------------------- */

/* A tile's S is RT_LORA_S_FLOATS floats (16 KiB: it stays in L1 between its two products), so a tile
 * has 4096 / r rows (64 at rank 64, 512 at rank 8: fewer, larger calls when the products are small),
 * in multiples of 16 - a function of the shape alone, never of the thread count. */
#define RT_LORA_S_FLOATS 4096
#define RT_LORA_MAX_RANK 64

typedef struct RtLoraJob {
    int64_t batch, m, k, r, n, ldx, sx, lda, sa, ldb, sb;
    CBLAS_TRANSPOSE ta, tb;
    float alpha;
    const float *x, *a, *b, *d;
    float *s, *c;
    int64_t rows;  /* a tile's */
    int64_t tiles; /* per batch index */
} RtLoraJob;

static void rt_lora_tiles(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtLoraJob *j = ctx;
    float local[RT_LORA_S_FLOATS];
    for (int64_t t = begin; t < end; t++) {
        int64_t bi = t / j->tiles, r0 = (t % j->tiles) * j->rows;
        int64_t rows = j->m - r0 < j->rows ? j->m - r0 : j->rows;
        int64_t row = bi * j->m + r0; /* S, D and C are contiguous [batch * m, .] */
        float *st = j->s ? j->s + row * j->r : local;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, j->ta, (int)rows, (int)j->r, (int)j->k, 1.0f, j->x + bi * j->sx + r0 * j->ldx,
                    (int)j->ldx, j->a + bi * j->sa, (int)j->lda, 0.0f, st, (int)j->r);
        float *ct = j->c + row * j->n;
        if (j->d != j->c) memcpy(ct, j->d + row * j->n, sizeof(float) * (size_t)(rows * j->n));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, j->tb, (int)rows, (int)j->n, (int)j->r, j->alpha, st, (int)j->r,
                    j->b + bi * j->sb, (int)j->ldb, 1.0f, ct, (int)j->n);
    }
}

RtStatus rt_lora_f32(RtPool *pool, int64_t batch, int64_t m, int64_t k, int64_t r, int64_t n, int64_t ldx, int64_t stride_x,
                     int64_t lda, int64_t stride_a, int64_t ldb, int64_t stride_b, int32_t trans_a, int32_t trans_b, float alpha,
                     const float *x, const float *a, const float *b, const float *d, float *s, float *c, RtError *err) {
    if (batch < 1 || m < 0 || k < 1 || r < 1 || r > RT_LORA_MAX_RANK || n < 1)
        return rt_fail(err, RT_ERR_ARG, "lora: batch %lld, rows %lld, k %lld, rank %lld (1 to %d), n %lld", (long long)batch,
                       (long long)m, (long long)k, (long long)r, RT_LORA_MAX_RANK, (long long)n);
    if (ldx < k || lda < (trans_a ? k : r) || ldb < (trans_b ? r : n) || stride_x < 0 || stride_a < 0 || stride_b < 0)
        return rt_fail(err, RT_ERR_ARG, "lora: a pitch below its row (ldx %lld, lda %lld, ldb %lld)", (long long)ldx,
                       (long long)lda, (long long)ldb);
    if (!x || !a || !b || !d || !c) return rt_fail(err, RT_ERR_ARG, "lora: a matrix pointer is NULL");
    if (m > INT_MAX || k > INT_MAX || n > INT_MAX || ldx > INT_MAX || lda > INT_MAX || ldb > INT_MAX)
        return rt_fail(err, RT_ERR_ARG, "lora: a size or pitch exceeds OpenBLAS's 32-bit limit");
    if (m == 0) return RT_OK;
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    RtLoraJob j = {batch,
                   m,
                   k,
                   r,
                   n,
                   ldx,
                   stride_x,
                   lda,
                   stride_a,
                   ldb,
                   stride_b,
                   trans_a ? CblasTrans : CblasNoTrans,
                   trans_b ? CblasTrans : CblasNoTrans,
                   alpha,
                   x,
                   a,
                   b,
                   d,
                   s,
                   c,
                   RT_LORA_S_FLOATS / r / 16 * 16,
                   0};
    j.tiles = (m + j.rows - 1) / j.rows;
    RtProfile *prof = rt_gemm_time_begin(pool);
    rt_parallel_for(pool, batch * j.tiles, rt_lora_tiles, &j);
    rt_gemm_time_end(prof, 0, trans_a != 0, m, r, k + n, batch); /* the two products' 2 m r (k + n) flops */
    return RT_OK;
}
