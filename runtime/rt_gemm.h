/* rt_gemm.h - the argument rules of rt_sgemm_batched's contract (rt_program.h), shared by its two
 * implementations: blas.c (OpenBLAS on the CPU) and gpu_blas.c (cuBLASLt). Internal to libmbtrt. */
#ifndef MBT_RT_GEMM_H
#define MBT_RT_GEMM_H

#include "rt_program.h"

/* RT_ERR_ARG with "sgemm: ..." for a negative size or stride, a row pitch shorter than its row, C
 * matrices of the batch that overlap, or a NULL matrix the product reads (A and B may be NULL when
 * k is 0). RT_OK otherwise, with *nothing set when the product is empty (m, n or batch 0): the
 * overlap and pointers are then not checked. Limits of one implementation (OpenBLAS's 32-bit
 * sizes, cuBLASLt's 32-bit batch count) are its own checks. The pointers are only compared with
 * NULL: the bf16 products (rt_bgemm_batched) share the rules. An epilogue other than
 * RtGemmEpilogue's, one without its vector, an epilogue with k = 0 (which cuBLASLt never sees:
 * its C = beta C is a memset or a scale) or RT_GEMM_BGRAD_B on a batch is RT_ERR_ARG too. */
RtStatus rt_sgemm_check(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda, int64_t stride_a,
                        const void *b, int64_t ldb, int64_t stride_b, const void *c, int64_t ldc, int64_t stride_c, int64_t batch,
                        int32_t epilogue, const void *vec, int *nothing, RtError *err);

#endif
