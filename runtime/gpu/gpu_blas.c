/* gpu_blas.c - rt_gpu_sgemm_batched and rt_gpu_bgemm_batched: rt_sgemm_batched's and
 * rt_bgemm_batched's contracts (rt_program.h) on device memory, through cuBLASLt.
 *
 * Pipeline position: every matrix multiply of a program's GPU step is a call here from the
 * generated host code, between kernel launches on the same stream.
 *
 * Numerics. Compute type CUBLAS_COMPUTE_32F with f32 scale and matrices: full f32 products and
 * sums, never TF32 (which would need CUBLAS_COMPUTE_32F_FAST_TF32), so results agree with the
 * CPU's OpenBLAS to f32 rounding (the summation order differs). For one shape cuBLASLt runs the
 * same algorithm every time (chosen once, below), and its results are then the same run to run
 * on one GPU model. bf16 products (rt_gpu_bgemm_batched) have bf16 A, B and C and the same f32
 * compute: products of bf16 values are exact in f32, sums are f32, and C is rounded to bf16 once.
 *
 * Row-major. cuBLASLt's default order is column-major, and a row-major matrix read as
 * column-major is its transpose. So C = op(A) op(B), row-major M x N, is computed as the
 * column-major product C^T = op(B)^T op(A)^T (N x M): cuBLASLt's "A" is our B and its "B" our A,
 * each with its own transpose flag, pitches unchanged. CUBLASLT_ORDER_ROW layouts would say the
 * same thing directly, but fewer of cuBLASLt's f32 kernels accept them; the swap keeps every
 * algorithm available.
 *
 * Plans. The matmul descriptor, the three layouts and the heuristic's algorithm depend only on
 * the shape (sizes, pitches, strides, batch, transposes) and on how the pointers are aligned;
 * they are made once per distinct one and kept in a small hash table, so the GEMMs of a step,
 * which repeat every step, run without a heuristic query.
 *
 * Epilogue. RT_GEMM_BIAS is CUBLASLT_EPILOGUE_BIAS: cuBLASLt's bias vector runs along the rows of
 * its (column-major, N x M) D, which are our columns, so it is our per-column bias as it is; its
 * type is C's, and it is added to the f32 sum before D is rounded. RT_GEMM_BGRAD_B, the column
 * sums of our B over k, is CUBLASLT_EPILOGUE_BGRADA: cuBLASLt's A is our B, and its bias gradient
 * "based on A" is a vector along D's rows summed over k. The plan's descriptor carries the
 * epilogue; the vector's pointer is set on it before each call (the heuristic reads its alignment,
 * which is part of the plan's key). Where cuBLASLt's heuristic has no algorithm with the
 * bias-gradient epilogue (its documentation does not say for which types and transposes it has
 * one), the plan is the plain product and the sums a second one, ones[1, k] op(B): B read twice,
 * the same numbers (f32 sums, rounded to C's type).
 *
 * RT_GEMM_ADD is no cuBLASLt epilogue: cuBLASLt's C input is the matrix vec, its D output our C,
 * with beta 1 (out of place: C and D share the layout, as cuBLASLt requires), so D = alpha AB + vec
 * in one call, unrounded in between (f32 only, as on the CPU).
 *
 * Beta. With beta == 0 cuBLASLt does not read C (NaNs in it do not propagate), as in BLAS. K == 0
 * (a sum of nothing) gives C = beta C without cuBLASLt: a 2D memset for beta == 0, the runtime's
 * mbt_rt_scale kernel for other betas (the contract allows no epilogue there). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "rt_gemm.h"

#define RT_GPU_WORKSPACE ((size_t)32 << 20) /* cuBLASLt's workspace: 32 MiB */

/* What a plan depends on. Built zeroed (memset), so padding compares equal. */
typedef struct RtGemmKey {
    int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch;
    int32_t trans_a, trans_b;
    int32_t type;                       /* of A, B and C: CUDA_R_32F or CUDA_R_16BF */
    int32_t epilogue;                   /* RtGemmEpilogue */
    uint32_t align_a, align_b, align_c; /* bytes, a power of two <= 256 */
    uint32_t align_vec;                 /* the epilogue's vector (0 without one) */
} RtGemmKey;

struct RtGemmPlan {
    RtGemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lt_a, lt_b, lt_c; /* cuBLASLt's A (our B), B (our A) and C (see the top) */
    cublasLtMatmulAlgo_t algo;
    int colsum_gemm; /* RT_GEMM_BGRAD_B without cuBLASLt's epilogue: the sums are a second product */
    char name[96];   /* "sgemm NT 128x768x3072 x12": messages and timing */
};

/* The alignment cuBLASLt may assume for every matrix of a batch: the largest power of two (at
 * most 256, its default assumption) dividing the base address and the batch stride in bytes. The
 * heuristic only picks algorithms that work with it. */
static uint32_t rt_align(const void *p, int64_t stride, int64_t batch, size_t size) {
    uint64_t bits = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1) bits |= (uint64_t)stride * size;
    return (uint32_t)(bits & (~bits + 1));
}

static uint64_t rt_key_hash(const RtGemmKey *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    return h;
}

/* ---- making a plan ---------------------------------------------------------------------------- */

static RtStatus rt_gemm_layout(RtGpu *g, cublasLtMatrixLayout_t *out, int type, int64_t rows, int64_t cols, int64_t ld,
                               int64_t batch, int64_t stride, const char *name, RtError *err) {
    RtGpuApi *api = &g->api;
    RtStatus st = rt_lt_check(api, api->cublasLtMatrixLayoutCreate(out, type, (uint64_t)rows, (uint64_t)cols, ld), err,
                              "cublasLtMatrixLayoutCreate", "%s", name);
    if (st != RT_OK || batch <= 1) return st;
    int32_t count = (int32_t)batch;
    st = rt_lt_check(api, api->cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                     err, "cublasLtMatrixLayoutSetAttribute", "%s, batch count", name);
    if (st == RT_OK)
        st = rt_lt_check(
            api, api->cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            err, "cublasLtMatrixLayoutSetAttribute", "%s, batch stride", name);
    return st;
}

static RtStatus rt_gemm_desc(RtGpu *g, RtGemmPlan *p, RtError *err) {
    RtGpuApi *api = &g->api;
    int32_t op_a = p->key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A is our B */
    int32_t op_b = p->key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    RtStatus st = rt_lt_check(api, api->cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), err,
                              "cublasLtMatmulDescCreate", "%s", p->name);
    if (st == RT_OK)
        st = rt_lt_check(api, api->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), err,
                         "cublasLtMatmulDescSetAttribute", "%s, transa", p->name);
    if (st == RT_OK)
        st = rt_lt_check(api, api->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), err,
                         "cublasLtMatmulDescSetAttribute", "%s, transb", p->name);
    if (st != RT_OK || p->key.epilogue == RT_GEMM_PLAIN || p->key.epilogue == RT_GEMM_ADD || p->colsum_gemm) return st;
    uint32_t epilogue = p->key.epilogue == RT_GEMM_BIAS ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADA;
    int32_t type = p->key.type;
    st = rt_lt_check(api, api->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
                     err, "cublasLtMatmulDescSetAttribute", "%s, epilogue", p->name);
    if (st == RT_OK)
        st = rt_lt_check(api,
                         api->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type),
                         err, "cublasLtMatmulDescSetAttribute", "%s, bias type", p->name);
    return st;
}

/* The epilogue's vector for the next call (and for the heuristic, which reads its alignment). */
static RtStatus rt_gemm_set_vec(RtGpu *g, RtGemmPlan *p, const void *vec, RtError *err) {
    if (p->key.epilogue == RT_GEMM_PLAIN || p->key.epilogue == RT_GEMM_ADD || p->colsum_gemm) return RT_OK;
    return rt_lt_check(&g->api,
                       g->api.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec), err,
                       "cublasLtMatmulDescSetAttribute", "%s, bias pointer", p->name);
}

/* The heuristic's first algorithm for the plan, within the workspace and the alignments. */
static RtStatus rt_gemm_algo(RtGpu *g, RtGemmPlan *p, RtError *err) {
    RtGpuApi *api = &g->api;
    cublasLtMatmulPreference_t pref = NULL;
    RtStatus st =
        rt_lt_check(api, api->cublasLtMatmulPreferenceCreate(&pref), err, "cublasLtMatmulPreferenceCreate", "%s", p->name);
    if (st != RT_OK) return st;
    uint64_t ws = g->workspace_size;
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *value;
        size_t size;
    } prefs[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->key.align_b, sizeof p->key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->key.align_a, sizeof p->key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->key.align_c, sizeof p->key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->key.align_c, sizeof p->key.align_c},
    };
    for (size_t i = 0; i < sizeof prefs / sizeof prefs[0] && st == RT_OK; i++)
        st = rt_lt_check(api, api->cublasLtMatmulPreferenceSetAttribute(pref, prefs[i].attr, prefs[i].value, prefs[i].size), err,
                         "cublasLtMatmulPreferenceSetAttribute", "%s, preference %d", p->name, (int)prefs[i].attr);
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    int found = 0;
    if (st == RT_OK)
        st = rt_lt_check(
            api,
            api->cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->lt_a, p->lt_b, p->lt_c, p->lt_c, pref, 1, &result, &found),
            err, "cublasLtMatmulAlgoGetHeuristic", "%s", p->name);
    if (st == RT_OK && found < 1)
        st = rt_fail(err, RT_ERR_IO, "cublasLtMatmulAlgoGetHeuristic (%s): no algorithm for this shape and alignment", p->name);
    if (st == RT_OK) p->algo = result.algo;
    api->cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static void rt_gemm_plan_free(RtGpu *g, RtGemmPlan *p) {
    if (!p) return;
    if (p->lt_a) g->api.cublasLtMatrixLayoutDestroy(p->lt_a);
    if (p->lt_b) g->api.cublasLtMatrixLayoutDestroy(p->lt_b);
    if (p->lt_c) g->api.cublasLtMatrixLayoutDestroy(p->lt_c);
    if (p->desc) g->api.cublasLtMatmulDescDestroy(p->desc);
    free(p);
}

static RtStatus rt_gemm_plan_make(RtGpu *g, const RtGemmKey *k, const void *vec, RtGemmPlan **out, RtError *err) {
    RtGemmPlan *p = calloc(1, sizeof *p);
    if (!p) return rt_fail(err, RT_ERR_NOMEM, "sgemm: out of memory for a plan");
    p->key = *k;
    int n = snprintf(p->name, sizeof p->name, "%s %c%c %lldx%lldx%lld", k->type == CUDA_R_16BF ? "bgemm" : "sgemm",
                     k->trans_a ? 'T' : 'N', k->trans_b ? 'T' : 'N', (long long)k->m, (long long)k->n, (long long)k->k);
    if (k->batch > 1 && n > 0 && (size_t)n < sizeof p->name)
        n += snprintf(p->name + n, sizeof p->name - (size_t)n, " x%lld", (long long)k->batch);
    if (k->epilogue != RT_GEMM_PLAIN && n > 0 && (size_t)n < sizeof p->name)
        snprintf(p->name + n, sizeof p->name - (size_t)n,
                 k->epilogue == RT_GEMM_BIAS  ? " +bias"
                 : k->epilogue == RT_GEMM_ADD ? " +add"
                                              : " +bgrad");
    /* Column-major views (see the top): a row-major R x C matrix of pitch ld is the column-major
     * C x R matrix of leading dimension ld. Our B, K x N (N x K when trans_b), is cuBLASLt's A,
     * N x K (K x N); our A, M x K (K x M), its B, K x M (M x K); C, M x N, its N x M. */
    RtStatus st = rt_gemm_layout(g, &p->lt_a, k->type, k->trans_b ? k->k : k->n, k->trans_b ? k->n : k->k, k->ldb, k->batch,
                                 k->stride_b, p->name, err);
    if (st == RT_OK)
        st = rt_gemm_layout(g, &p->lt_b, k->type, k->trans_a ? k->m : k->k, k->trans_a ? k->k : k->m, k->lda, k->batch,
                            k->stride_a, p->name, err);
    if (st == RT_OK) st = rt_gemm_layout(g, &p->lt_c, k->type, k->n, k->m, k->ldc, k->batch, k->stride_c, p->name, err);
    for (int attempt = 0; st == RT_OK && attempt < 2; attempt++) {
        st = rt_gemm_desc(g, p, err);
        if (st == RT_OK) st = rt_gemm_set_vec(g, p, vec, err);
        if (st == RT_OK) st = rt_gemm_algo(g, p, err);
        if (st == RT_OK || k->epilogue != RT_GEMM_BGRAD_B || p->colsum_gemm) break;
        g->api.cublasLtMatmulDescDestroy(p->desc); /* no bias-gradient algorithm: the plain product */
        p->desc = NULL;
        p->colsum_gemm = 1;
        st = RT_OK;
    }
    if (st != RT_OK) {
        rt_gemm_plan_free(g, p);
        return st;
    }
    *out = p;
    return RT_OK;
}

/* ---- the plan table ---------------------------------------------------------------------------- */

static int64_t rt_plan_slot(RtGemmPlan **table, int64_t cap, const RtGemmKey *k) {
    int64_t i = (int64_t)(rt_key_hash(k) & (uint64_t)(cap - 1));
    while (table[i] && memcmp(&table[i]->key, k, sizeof *k) != 0) i = (i + 1) & (cap - 1);
    return i;
}

static RtStatus rt_plan_grow(RtGpu *g, RtError *err) {
    int64_t cap = g->cap_plans ? g->cap_plans * 2 : 64;
    RtGemmPlan **table = calloc((size_t)cap, sizeof *table);
    if (!table) return rt_fail(err, RT_ERR_NOMEM, "sgemm: out of memory for the plan table");
    for (int64_t i = 0; i < g->cap_plans; i++)
        if (g->plans[i]) table[rt_plan_slot(table, cap, &g->plans[i]->key)] = g->plans[i];
    free(g->plans);
    g->plans = table;
    g->cap_plans = cap;
    return RT_OK;
}

/* The plan for key, made on first use (vec: the epilogue's vector, whose alignment the key has). */
static RtStatus rt_plan_get(RtGpu *g, const RtGemmKey *k, const void *vec, RtGemmPlan **out, RtError *err) {
    if (2 * (g->nplans + 1) > g->cap_plans) {
        RtStatus st = rt_plan_grow(g, err);
        if (st != RT_OK) return st;
    }
    int64_t i = rt_plan_slot(g->plans, g->cap_plans, k);
    if (!g->plans[i]) {
        RtStatus st = rt_gemm_plan_make(g, k, vec, &g->plans[i], err);
        if (st != RT_OK) return st;
        g->nplans++;
    }
    *out = g->plans[i];
    return RT_OK;
}

/* ---- the call ------------------------------------------------------------------------------------ */

/* K == 0: C = beta C for each matrix of the batch (one call when the batch's rows are evenly spaced). */
static RtStatus rt_gemm_scale_c(RtGpu *g, float beta, void *c, int type, int64_t m, int64_t n, int64_t ldc, int64_t stride_c,
                                int64_t batch, RtError *err) {
    if (beta == 1.0f) return RT_OK;
    if (type == CUDA_R_16BF && beta != 0.0f) /* no bf16 scaling kernel: no program makes this call */
        return rt_fail(err, RT_ERR_ARG, "bgemm: k = 0 with beta %g (only 0 and 1 are supported for bf16)", (double)beta);
    size_t size = type == CUDA_R_16BF ? 2 : 4;
    int one_call = batch == 1 || stride_c == m * ldc;
    int64_t rows = one_call ? m * batch : m, calls = one_call ? 1 : batch;
    RtStatus st = RT_OK;
    for (int64_t i = 0; i < calls && st == RT_OK; i++) {
        char *ci = (char *)c + (size_t)(i * stride_c) * size;
        if (beta == 0.0f && type == CUDA_R_16BF) /* row by row: the gaps between rows may be another tensor's */
            for (int64_t r = 0; r < rows && st == RT_OK; r++)
                st = rt_cu_check(&g->api,
                                 g->api.cuMemsetD8Async((CUdeviceptr)(uintptr_t)(ci + (size_t)(r * ldc) * size), 0,
                                                        (size_t)n * size, g->stream),
                                 err, "cuMemsetD8Async", "bgemm with k = 0, C = 0 (%lld x %lld)", (long long)rows, (long long)n);
        else if (beta == 0.0f)
            st = rt_cu_check(&g->api,
                             g->api.cuMemsetD2D32Async((CUdeviceptr)(uintptr_t)ci, (size_t)ldc * sizeof(float), 0u, (size_t)n,
                                                       (size_t)rows, g->stream),
                             err, "cuMemsetD2D32Async", "sgemm with k = 0, C = 0 (%lld x %lld)", (long long)rows, (long long)n);
        else st = rt_gpu_scale_rows(g, (float *)ci, beta, rows, n, ldc, err);
    }
    return st;
}

/* k ones of the type (device memory kept for the run): the left operand of a column sum. */
static RtStatus rt_gpu_ones(RtGpu *g, int type, int64_t k, const void **out, RtError *err) {
    int t = type == CUDA_R_16BF;
    size_t size = t ? 2 : 4;
    if (g->ones_cap[t] < k) {
        void *host = malloc((size_t)k * size);
        if (!host) return rt_fail(err, RT_ERR_NOMEM, "sgemm: out of memory for %lld ones", (long long)k);
        for (int64_t i = 0; i < k; i++) {
            if (t) ((uint16_t *)host)[i] = 0x3f80; /* bf16 1.0 */
            else ((float *)host)[i] = 1.0f;
        }
        if (g->ones[t]) { /* a larger k (rare: a program's are fixed): the queued products are done with it */
            g->api.cuStreamSynchronize(g->stream);
            rt_gpu_mem_free(g, g->ones[t]);
        }
        g->ones[t] = 0;
        g->ones_cap[t] = 0;
        RtStatus st = rt_cu_check(&g->api, rt_gpu_mem_alloc(g, &g->ones[t], (size_t)k * size), err, "cuMemAlloc",
                                  "%lld ones for a column sum", (long long)k);
        if (st == RT_OK) /* from pageable memory: staged before it returns */
            st = rt_cu_check(&g->api, g->api.cuMemcpyHtoDAsync(g->ones[t], host, (size_t)k * size, g->stream), err,
                             "cuMemcpyHtoDAsync", "%lld ones for a column sum", (long long)k);
        free(host);
        if (st != RT_OK) return st;
        g->ones_cap[t] = k;
    }
    *out = (const void *)(uintptr_t)g->ones[t];
    return RT_OK;
}

/* Both contracts: A, B and C of one type (CUDA_R_32F or CUDA_R_16BF), f32 compute. */
static RtStatus rt_gpu_gemm(RtGpu *g, int type, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                            const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                            float beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                            RtError *err) {
    int nothing = 0;
    RtStatus st = rt_sgemm_check(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, epilogue,
                                 vec, &nothing, err);
    if (st != RT_OK || nothing) return st;
    if (g->graphs.mode == RT_GRAPH_PROBE) {
        uint32_t ab, bb;
        memcpy(&ab, &alpha, 4);
        memcpy(&bb, &beta, 4);
        uint64_t rec[] = {
            (uint64_t)type, (uint64_t)trans_a, (uint64_t)trans_b,  (uint64_t)m,     (uint64_t)n,        (uint64_t)k,        ab,
            (uintptr_t)a,   (uint64_t)lda,     (uint64_t)stride_a, (uintptr_t)b,    (uint64_t)ldb,      (uint64_t)stride_b, bb,
            (uintptr_t)c,   (uint64_t)ldc,     (uint64_t)stride_c, (uint64_t)batch, (uint64_t)epilogue, (uintptr_t)vec};
        rt_gpu_graph_probe(g, 'G', rec, sizeof rec, 0);
        return RT_OK;
    }
    if (batch > INT32_MAX)
        return rt_fail(err, RT_ERR_ARG, "sgemm: batch %lld exceeds cuBLASLt's 32-bit batch count", (long long)batch);
    if (epilogue == RT_GEMM_ADD && (type != CUDA_R_32F || beta != 0.0f))
        return rt_fail(err, RT_ERR_ARG, "sgemm: the add epilogue is for f32 products with beta 0 only");
    st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    if (k == 0) return rt_gemm_scale_c(g, beta, c, type, m, n, ldc, stride_c, batch, err);
    const void *cin = c; /* cuBLASLt's C: ours, or the add epilogue's matrix */
    if (epilogue == RT_GEMM_ADD) {
        cin = vec;
        beta = 1.0f;
    }

    size_t size = type == CUDA_R_16BF ? 2 : 4;
    RtGemmKey key;
    memset(&key, 0, sizeof key); /* the padding too: keys are compared and hashed as bytes */
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.stride_a = batch > 1 ? stride_a : 0; /* unused for one matrix: one plan whatever the caller passed */
    key.stride_b = batch > 1 ? stride_b : 0;
    key.stride_c = batch > 1 ? stride_c : 0;
    key.batch = batch;
    key.trans_a = trans_a != 0;
    key.trans_b = trans_b != 0;
    key.type = type;
    key.align_a = rt_align(a, stride_a, batch, size);
    key.align_b = rt_align(b, stride_b, batch, size);
    key.align_c = rt_align(c, stride_c, batch, size);
    key.epilogue = epilogue;
    key.align_vec = epilogue == RT_GEMM_PLAIN ? 0
                    : epilogue == RT_GEMM_ADD ? rt_align(vec, stride_c, batch, size)
                                              : rt_align(vec, 0, 1, size);
    /* the add epilogue's matrix is cuBLASLt's C, which the heuristic is told the alignment of
     * with D's (one value for both) */
    if (epilogue == RT_GEMM_ADD && key.align_vec < key.align_c) key.align_c = key.align_vec;
    RtGemmPlan *p = NULL;
    st = rt_plan_get(g, &key, vec, &p, err);
    if (st == RT_OK) st = rt_gemm_set_vec(g, p, vec, err);
    int64_t slot = -1;
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin(g, &slot, err);
    if (st != RT_OK) return st;
    st = rt_lt_check(&g->api,
                     g->api.cublasLtMatmul(g->lt, p->desc, &alpha, b, p->lt_a, a, p->lt_b, &beta, cin, p->lt_c, c, p->lt_c,
                                           &p->algo, (void *)(uintptr_t)g->workspace, g->workspace_size, g->stream),
                     err, "cublasLtMatmul", "%s", p->name);
    if (slot >= 0) st = rt_gpu_time_end(g, slot, p->name, st, err);
    if (st == RT_OK && p->colsum_gemm) { /* vec[1, n] = ones[1, k] op(B) */
        const void *ones = NULL;
        st = rt_gpu_ones(g, type, k, &ones, err);
        if (st == RT_OK)
            st = rt_gpu_gemm(g, type, 0, trans_b, 1, n, k, 1.0f, ones, k, 0, b, ldb, 0, 0.0f, vec, n, 0, 1, RT_GEMM_PLAIN, NULL,
                             err);
    }
    return st;
}

RtStatus rt_gpu_sgemm_batched(RtGpu *g, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                              int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                              int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec, RtError *err) {
    return rt_gpu_gemm(g, CUDA_R_32F, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                       stride_c, batch, epilogue, vec, err);
}

RtStatus rt_gpu_bgemm_batched(RtGpu *g, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                              int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                              uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                              RtError *err) {
    return rt_gpu_gemm(g, CUDA_R_16BF, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                       stride_c, batch, epilogue, vec, err);
}

/* ---- the handle --------------------------------------------------------------------------------- */

RtStatus rt_gpu_blas_open(RtGpu *g, RtError *err) {
    RtGpuApi *api = &g->api;
    RtStatus st = rt_lt_check(api, api->cublasLtCreate(&g->lt), err, "cublasLtCreate", "cuBLASLt %s", api->lt_path);
    if (st != RT_OK) {
        g->lt = NULL;
        return st;
    }
    char size[32];
    st = rt_cu_check(api, rt_gpu_mem_alloc(g, &g->workspace, RT_GPU_WORKSPACE), err, "cuMemAlloc", "cuBLASLt's workspace, %s",
                     rt_gpu_format_bytes((int64_t)RT_GPU_WORKSPACE, size));
    if (st != RT_OK) {
        g->workspace = 0;
        return st;
    }
    g->workspace_size = RT_GPU_WORKSPACE;
    return RT_OK;
}

void rt_gpu_blas_close(RtGpu *g) {
    for (int t = 0; t < 2; t++)
        if (g->ones[t]) rt_gpu_mem_free(g, g->ones[t]);
    for (int64_t i = 0; i < g->cap_plans; i++) rt_gemm_plan_free(g, g->plans[i]);
    free(g->plans);
    g->plans = NULL;
    g->nplans = g->cap_plans = 0;
    if (g->workspace) rt_gpu_mem_free(g, g->workspace);
    g->workspace = 0;
    if (g->lt) g->api.cublasLtDestroy(g->lt);
    g->lt = NULL;
}
