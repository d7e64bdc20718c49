/* fake_cuda_internal.h - what the emulated driver (fake_cuda.c) and the emulated cuBLASLt
 * (fake_cublaslt.c) share inside libmbt_fake_cuda.so: the controls and counters, the error codes,
 * cuBLASLt's descriptors (a capture copies them by value and replays the product), and the
 * capture's record of a product. Hidden: the library exports only CUDA's and cuBLASLt's names and
 * fake_control. */
#ifndef MBT_FAKE_CUDA_INTERNAL_H
#define MBT_FAKE_CUDA_INTERNAL_H

#include "fake_cuda.h"
#include "gpu_internal.h"

#pragma GCC visibility push(hidden)

enum {
    FAKE_INVALID_VALUE = 1,
    FAKE_INVALID_IMAGE = 200,
    FAKE_INVALID_PTX = 218,
    FAKE_NOT_FOUND = 500,
    FAKE_OUT_OF_RESOURCES = 701,
    FAKE_LAUNCH_FAILED = 719,
    FAKE_CAPTURE_UNSUPPORTED = 900,
    FAKE_CAPTURE_INVALIDATED = 901,
    FAKE_CAPTURE_UNJOINED = 904,
    FAKE_LT_INVALID_VALUE = 7,
    FAKE_LT_NOT_SUPPORTED = 15,
};

extern FakeControl fake; /* fake_control() hands it to the tests */

/* ---- cuBLASLt's descriptors (fake_cublaslt.c) ---- */
typedef struct FakeDesc {
    int compute, scale, op_a, op_b;
    uint32_t epilogue; /* CUBLASLT_EPILOGUE_DEFAULT (1), _BIAS or _BGRADA */
    int32_t bias_type; /* -1: D's */
    void *bias;
} FakeDesc;

typedef struct FakeLayout {
    int type;
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
} FakeLayout;

typedef struct FakePref {
    uint64_t workspace;
    uint32_t align[4];
} FakePref;

extern int fake_handle; /* &fake_handle is cublasLtCreate's handle */

/* ---- stream capture (fake_cuda.c) ---- */
typedef struct FakeGraph FakeGraph;
extern FakeGraph *fake_capture; /* the graph being captured, or NULL */
/* Records cublasLtMatmul's product in the capture (replayed by cuGraphLaunch). */
cublasStatus_t fake_rec_matmul(cublasLtMatmulDesc_t d, const void *alpha, const void *a, cublasLtMatrixLayout_t al, const void *b,
                               cublasLtMatrixLayout_t bl, const void *beta, const void *c, cublasLtMatrixLayout_t cl, void *dst,
                               cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo);

#pragma GCC visibility pop

/* fake_cublaslt.c's product (exported: it is cuBLASLt's), which a capture's replay calls */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t al, const void *b, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *c, cublasLtMatrixLayout_t cl, void *dst, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_size, CUstream s);

#endif
