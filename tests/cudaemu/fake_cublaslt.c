/* fake_cublaslt.c - the emulated cuBLASLt of libmbt_fake_cuda.so (fake_cuda.c is the driver; see its
 * header for what the stand-in checks and cannot). cublasLtMatmul computes the column-major
 * product its layouts and transposes describe, after checking that they agree, with OpenBLAS on
 * f32 copies of the operands, and the bias and bias-gradient epilogues; the heuristic hands out one
 * algorithm. In a stream capture the product is recorded (fake_rec_matmul) and run at replay.
 * test_rt_gpu compares rt_gpu_sgemm_batched with the CPU's rt_sgemm_batched, which tests the
 * row-major to column-major mapping; that NVIDIA's library means the same by these descriptors is
 * what this cannot show.
 *
 * MBT_FAKE_CUBLAS_ROWWISE=1 computes each row of a product alone (the same OpenBLAS call on the
 * same aligned buffers for every row), so that a row's bits do not depend on its index in the
 * product: what the serving chunk phase assumes of cuBLASLt at a fixed shape and algorithm
 * (docs/serve.md, "On the GPU"), which OpenBLAS's blocked product does not give at every shape (at
 * 64 rows of tests/serve/gpt.mbt's products it does not). It models the assumption; only a GPU can
 * check it (tests/gpu/kv.sh sets it on the emulated GPU). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_internal.h"

/* ---- cuBLASLt -------------------------------------------------------------------------------- */

int fake_handle; /* its address is the one handle */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)(void *)&fake_handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return 130001; }

const char *cublasLtGetStatusName(cublasStatus_t s) {
    return s == 0                       ? "CUBLAS_STATUS_SUCCESS"
           : s == FAKE_LT_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                        : "CUBLAS_STATUS_NOT_SUPPORTED";
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
    return s == 0                       ? "success"
           : s == FAKE_LT_INVALID_VALUE ? "an invalid value was used as an argument"
                                        : "the functionality requested is not supported";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    FakeDesc *desc = calloc(1, sizeof *desc);
    desc->compute = compute;
    desc->scale = scale;
    desc->epilogue = 1;
    desc->bias_type = -1;
    *d = (cublasLtMatmulDesc_t)(void *)desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free((void *)d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    FakeDesc *desc = (FakeDesc *)(void *)d;
    if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER && size == sizeof(void *)) {
        memcpy(&desc->bias, buf, sizeof desc->bias);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (size != sizeof(int32_t)) return FAKE_LT_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA) desc->op_a = *(const int32_t *)buf;
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) desc->op_b = *(const int32_t *)buf;
    else if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE) desc->epilogue = *(const uint32_t *)buf;
    else if (attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) desc->bias_type = *(const int32_t *)buf;
    else return FAKE_LT_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (ld < (int64_t)rows) return FAKE_LT_INVALID_VALUE; /* column-major: a column is `rows` long */
    FakeLayout *lay = calloc(1, sizeof *lay);
    *lay = (FakeLayout){type, rows, cols, ld, 0, 1};
    *l = (cublasLtMatrixLayout_t)(void *)lay;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    free((void *)l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                size_t size) {
    FakeLayout *lay = (FakeLayout *)(void *)l;
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) lay->batch = *(const int32_t *)buf;
    else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) lay->stride = *(const int64_t *)buf;
    else return FAKE_LT_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    FakePref *pref = calloc(1, sizeof *pref);
    for (int i = 0; i < 4; i++) pref->align[i] = 256;
    *p = (cublasLtMatmulPreference_t)(void *)pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free((void *)p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    FakePref *pref = (FakePref *)(void *)p;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t)) pref->workspace = *(const uint64_t *)buf;
    else if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
             size == sizeof(uint32_t))
        pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = *(const uint32_t *)buf;
    else return FAKE_LT_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

#define FAKE_ALGO 0xa160

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *found) {
    (void)h, (void)a, (void)b, (void)c;
    const FakeDesc *desc = (const FakeDesc *)(void *)d;
    const FakePref *pref = (const FakePref *)(void *)p;
    fake.heuristics++;
    memcpy(fake.last_align, pref->align, sizeof fake.last_align);
    if (requested < 1) return FAKE_LT_INVALID_VALUE;
    if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale != CUDA_R_32F) return FAKE_LT_NOT_SUPPORTED;
    /* the epilogues the runtime asks for: none, or a bias of D's type whose pointer (its
     * alignment) the heuristic can see */
    if (desc->epilogue != 1 && desc->epilogue != CUBLASLT_EPILOGUE_BIAS && desc->epilogue != CUBLASLT_EPILOGUE_BGRADA)
        return FAKE_LT_NOT_SUPPORTED;
    if (desc->epilogue != 1 &&
        (!desc->bias || (desc->bias_type != -1 && desc->bias_type != ((const FakeLayout *)(void *)dl)->type)))
        return FAKE_LT_INVALID_VALUE;
    if (desc->epilogue == CUBLASLT_EPILOGUE_BGRADA && ((const FakeLayout *)(void *)dl)->batch != 1) return FAKE_LT_NOT_SUPPORTED;
    *found = fake.no_algo || (fake.no_bgrad && desc->epilogue == CUBLASLT_EPILOGUE_BGRADA) ? 0 : 1;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = FAKE_ALGO;
    return CUBLAS_STATUS_SUCCESS;
}

/* Element (i, j) of a column-major f32 or bf16 matrix, or of its transpose. */
static float fake_at(const void *x, const FakeLayout *l, int op, int64_t i, int64_t j) {
    int64_t at = op == CUBLAS_OP_T ? j + i * l->ld : i + j * l->ld;
    if (l->type == CUDA_R_16BF) {
        uint32_t bits = (uint32_t)((const uint16_t *)x)[at] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    return ((const float *)x)[at];
}

static void fake_put(void *x, const FakeLayout *l, int64_t i, int64_t j, float v) {
    int64_t at = i + j * l->ld;
    if (l->type == CUDA_R_16BF) { /* round to nearest even, NaN kept quiet */
        uint32_t b;
        memcpy(&b, &v, sizeof b);
        ((uint16_t *)x)[at] = v != v ? (uint16_t)((b >> 16) | 0x40u) : (uint16_t)((b + ((b >> 16) & 1u) + 0x7fffu) >> 16);
    } else {
        ((float *)x)[at] = v;
    }
}

/* AB = A B (row-major m x k by k x n), each row alone: its row of A copied into one aligned buffer,
 * one OpenBLAS call of one row into another, so every row takes the same path (MBT_FAKE_CUBLAS_ROWWISE). */
static void fake_rowwise(int64_t m, int64_t n, int64_t k, const float *A, const float *B, float *AB) {
    float *a1 = aligned_alloc(64, (size_t)(k + 16) / 16 * 64), *c1 = aligned_alloc(64, (size_t)(n + 16) / 16 * 64);
    if (!a1 || !c1) abort();
    for (int64_t i = 0; i < m; i++) {
        memcpy(a1, A + i * k, sizeof(float) * (size_t)k);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, (blasint)n, (blasint)k, 1.0f, a1, (blasint)k, B, (blasint)n,
                    0.0f, c1, (blasint)n);
        memcpy(AB + i * n, c1, sizeof(float) * (size_t)n);
    }
    free(a1), free(c1);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t al, const void *b, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *c, cublasLtMatrixLayout_t cl, void *dst, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wss, cudaStream_t s) {
    (void)h, (void)ws, (void)wss, (void)s;
    if (fake_capture) return fake_rec_matmul(d, alpha, a, al, b, bl, beta, c, cl, dst, dl, algo);
    const FakeDesc *desc = (const FakeDesc *)(void *)d;
    const FakeLayout *la = (const FakeLayout *)(void *)al, *lb = (const FakeLayout *)(void *)bl;
    const FakeLayout *lc = (const FakeLayout *)(void *)cl, *ld = (const FakeLayout *)(void *)dl;
    int64_t m = (int64_t)ld->rows, n = (int64_t)ld->cols;
    int64_t k = (int64_t)(desc->op_a == CUBLAS_OP_T ? la->rows : la->cols);
    int64_t a_m = (int64_t)(desc->op_a == CUBLAS_OP_T ? la->cols : la->rows);
    int64_t b_k = (int64_t)(desc->op_b == CUBLAS_OP_T ? lb->cols : lb->rows);
    int64_t b_n = (int64_t)(desc->op_b == CUBLAS_OP_T ? lb->rows : lb->cols);
    if (!algo || algo->data[0] != FAKE_ALGO || a_m != m || b_k != k || b_n != n || lc->rows != ld->rows || lc->cols != ld->cols ||
        lc->ld != ld->ld || lc->stride != ld->stride || la->batch != ld->batch || lb->batch != ld->batch ||
        lc->batch != ld->batch)
        return FAKE_LT_INVALID_VALUE;
    if ((la->type != CUDA_R_32F && la->type != CUDA_R_16BF) || lb->type != la->type || lc->type != la->type ||
        ld->type != la->type)
        return FAKE_LT_NOT_SUPPORTED;
    size_t size = la->type == CUDA_R_16BF ? 2 : 4;
    float al_ = *(const float *)alpha, be = *(const float *)beta;
    const FakeLayout vec = {ld->type, (uint64_t)m, 1, m, 0, 1}; /* the epilogue's vector: m of D's type */
    /* opA and opB copied out as dense row-major f32 (bf16 widens exactly), their product by
     * OpenBLAS (f32 sums, as cuBLASLt's CUBLAS_COMPUTE_32F), then D = alpha AB + beta C rounded
     * to D's type: fast enough for the emulated GPU's every GEMM. The copying is this file's own
     * reading of the layouts, which is what test_rt_gpu holds against rt_sgemm_batched. */
    openblas_set_num_threads(1); /* the emulator is one thread; OpenBLAS's idle threads would spin */
    const char *rw = getenv("MBT_FAKE_CUBLAS_ROWWISE");
    int rowwise = rw && *rw == '1';
    float *A = malloc(sizeof(float) * (size_t)(m * k + 1)), *B = malloc(sizeof(float) * (size_t)(k * n + 1));
    float *AB = malloc(sizeof(float) * (size_t)(m * n + 1));
    if (!A || !B || !AB) {
        free(A), free(B), free(AB);
        return FAKE_LT_INVALID_VALUE;
    }
    for (int32_t bi = 0; bi < ld->batch; bi++) {
        const char *ab = (const char *)a + bi * la->stride * size, *bb = (const char *)b + bi * lb->stride * size;
        const char *cb = (const char *)c + bi * lc->stride * size;
        char *db = (char *)dst + bi * ld->stride * size;
        for (int64_t i = 0; i < m; i++)
            for (int64_t p = 0; p < k; p++) A[i * k + p] = fake_at(ab, la, desc->op_a, i, p);
        for (int64_t p = 0; p < k; p++)
            for (int64_t j = 0; j < n; j++) B[p * n + j] = fake_at(bb, lb, desc->op_b, p, j);
        if (k > 0 && rowwise) fake_rowwise(m, n, k, A, B, AB);
        else if (k > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, A, (blasint)k, B,
                        (blasint)n, 0.0f, AB, (blasint)n);
        else memset(AB, 0, sizeof(float) * (size_t)(m * n));
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float v = al_ * AB[i * n + j];
                if (be != 0) v += be * fake_at(cb, lc, CUBLAS_OP_N, i, j);
                if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS) /* along D's rows, one vector for the batch */
                    v += fake_at(desc->bias, &vec, CUBLAS_OP_N, i, 0);
                fake_put(db, ld, i, j, v);
            }
    }
    if (desc->epilogue == CUBLASLT_EPILOGUE_BGRADA) /* op(A)'s rows summed over k (one matrix), D's type */
        for (int64_t i = 0; i < m; i++) {
            float sum = 0;
            for (int64_t p = 0; p < k; p++) sum += fake_at(a, la, desc->op_a, i, p);
            fake_put(desc->bias, &vec, i, 0, sum);
        }
    free(A), free(B), free(AB);
    fake.matmuls++;
    fake.clock_ms += 2.0;
    return CUBLAS_STATUS_SUCCESS;
}
