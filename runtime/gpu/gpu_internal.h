/* gpu_internal.h - what the GPU runtime's files (gpu_api.c, gpu.c, gpu_blas.c, gpu_timing.c) share:
 * the few CUDA driver and cuBLASLt types and constants they use, the table of library functions,
 * and struct RtGpu. Not part of the library's surface (that is rt_gpu.h and rt_program.h).
 *
 * No CUDA header is included: the declarations below mirror cuda.h and cublasLt.h of CUDA 12
 * and 13 (the values and signatures are the same in both). Enumerations are declared as int,
 * which is how the C ABI passes them. When the toolkit's headers are on the build machine, the
 * Makefile compiles tests/unit/gpu_decls_check.c, which includes them and this file with
 * RT_GPU_CHECK_DECLS defined: every constant and function signature here is then checked
 * against NVIDIA's own (a mismatch fails the build). */
#ifndef MBT_GPU_INTERNAL_H
#define MBT_GPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "rt_gpu.h"

/* ==== CUDA's types (cuda.h, cublasLt.h, library_types.h, nccl.h) ================================== */

#ifndef RT_GPU_CHECK_DECLS
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2: 64 bits on every 64-bit host */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUlinkState_st *CUlinkState;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef void (*CUhostFn)(void *userData);
typedef int CUstreamCaptureMode;
typedef int CUdevice_attribute;
typedef int CUjit_option;
typedef int CUjitInputType;
/* the virtual memory management API (ZeRO-3's parameter region: gpu_vmm.c) */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUmemAllocationGranularity_flags;
typedef struct CUmemLocation_st {
    int type; /* CUmemLocationType: CU_MEM_LOCATION_TYPE_DEVICE */
    int id;   /* the device ordinal */
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;                 /* CUmemAllocationType: CU_MEM_ALLOCATION_TYPE_PINNED */
    int requestedHandleTypes; /* CUmemAllocationHandleType: none (0) */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
} CUmemAccessDesc;

typedef int cublasStatus_t;
typedef int cublasComputeType_t;
typedef int cudaDataType_t;
typedef int cudaDataType;
typedef int cublasLtMatmulDescAttributes_t;
typedef int cublasLtMatrixLayoutAttribute_t;
typedef int cublasLtMatmulPreferenceAttributes_t;
typedef CUstream cudaStream_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct RtLtMatmulDesc *cublasLtMatmulDesc_t;             /* cublasLtMatmulDescOpaque_t * */
typedef struct RtLtMatrixLayout *cublasLtMatrixLayout_t;         /* cublasLtMatrixLayoutOpaque_t * */
typedef struct RtLtMatmulPreference *cublasLtMatmulPreference_t; /* cublasLtMatmulPreferenceOpaque_t * */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef struct ncclComm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
/* ncclConfig_t as NCCL 2.14 laid it out (size, magic and version first): NCCL reads a config by
 * its size and version, so this older layout is valid with every later library. */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
} ncclConfig_t;
#endif
#define RT_NCCL_CONFIG_MAGIC 0xcafebeefu
#define RT_NCCL_CONFIG_VERSION 21400 /* NCCL_VERSION(2, 14, 0) */

/* Layouts cuBLASLt fills or reads (checked against cublasLt.h too). */
_Static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "cublasLtMatmulAlgo_t is 64 bytes");
_Static_assert(sizeof(cublasLtMatmulHeuristicResult_t) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");
_Static_assert(offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize) == 64, "workspaceSize's offset");
_Static_assert(offsetof(cublasLtMatmulHeuristicResult_t, state) == 72, "state's offset");

/* The VMM structures the runtime fills (checked against cuda.h too). */
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location's offset");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "win32HandleMetaData's offset");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");

/* The constants used, as (name, value). */
#define RT_CUDA_CONSTANTS(X)                                                                                                     \
    X(CUDA_SUCCESS, 0)                                                                                                           \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2)                                                                                               \
    X(CUDA_ERROR_STUB_LIBRARY, 34)                                                                                               \
    X(CUDA_ERROR_NO_DEVICE, 100)                                                                                                 \
    X(CUDA_ERROR_NOT_READY, 600)                                                                                                 \
    X(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 16)                                                                              \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75)                                                                          \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 76)                                                                          \
    X(CU_JIT_INFO_LOG_BUFFER, 3)                                                                                                 \
    X(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, 4)                                                                                      \
    X(CU_JIT_ERROR_LOG_BUFFER, 5)                                                                                                \
    X(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, 6)                                                                                     \
    X(CU_JIT_INPUT_PTX, 1)                                                                                                       \
    X(CU_STREAM_NON_BLOCKING, 1)                                                                                                 \
    X(CU_STREAM_CAPTURE_MODE_RELAXED, 2)                                                                                         \
    X(CU_EVENT_DEFAULT, 0)                                                                                                       \
    X(CU_MEMHOSTALLOC_PORTABLE, 1)                                                                                               \
    X(CU_MEM_ALLOCATION_TYPE_PINNED, 1)                                                                                          \
    X(CU_MEM_LOCATION_TYPE_DEVICE, 1)                                                                                            \
    X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 3)                                                                                     \
    X(CU_MEM_ALLOC_GRANULARITY_MINIMUM, 0)                                                                                       \
    X(CUBLAS_STATUS_SUCCESS, 0)                                                                                                  \
    X(CUBLAS_COMPUTE_32F, 68)                                                                                                    \
    X(CUDA_R_32F, 0)                                                                                                             \
    X(CUDA_R_16BF, 14)                                                                                                           \
    X(CUBLAS_OP_N, 0)                                                                                                            \
    X(CUBLAS_OP_T, 1)                                                                                                            \
    X(CUBLASLT_MATMUL_DESC_TRANSA, 3)                                                                                            \
    X(CUBLASLT_MATMUL_DESC_TRANSB, 4)                                                                                            \
    X(CUBLASLT_MATMUL_DESC_EPILOGUE, 7)                                                                                          \
    X(CUBLASLT_MATMUL_DESC_BIAS_POINTER, 8)                                                                                      \
    X(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, 26)                                                                                   \
    X(CUBLASLT_EPILOGUE_BIAS, 4)                                                                                                 \
    X(CUBLASLT_EPILOGUE_BGRADA, 256)                                                                                             \
    X(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 5)                                                                                     \
    X(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 6)                                                                            \
    X(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 1)                                                                               \
    X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 5)                                                                             \
    X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, 6)                                                                             \
    X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, 7)                                                                             \
    X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, 8)                                                                             \
    X(ncclSuccess, 0)                                                                                                            \
    X(ncclInProgress, 7)                                                                                                         \
    X(ncclFloat32, 7)

#ifndef RT_GPU_CHECK_DECLS
#define RT_GPU_ENUM(name, value) name = value,
enum { RT_CUDA_CONSTANTS(RT_GPU_ENUM) };
#undef RT_GPU_ENUM
#endif

/* ==== the table of library functions (gpu_api.c loads it) ========================================= */

/* X(return type, name, exported symbol, parameters). The symbol is the versioned entry point
 * where the driver has one (cuMemAlloc_v2, ...), as cuda.h maps the plain names. One exception:
 * cuEventElapsedTime stays the original entry point, which every driver exports; CUDA 13's header
 * maps it to cuEventElapsedTime_v2 (same signature), which drivers before 12.8 lack. The primary
 * context (cuDevicePrimaryCtxRetain) is used rather than cuCtxCreate, whose signature changed
 * (_v4 in CUDA 13); it is also the context cuBLASLt's runtime uses. */
#define RT_CUDA_FUNCTIONS(X)                                                                                                     \
    X(CUresult, cuGetErrorName, "cuGetErrorName", (CUresult, const char **))                                                     \
    X(CUresult, cuGetErrorString, "cuGetErrorString", (CUresult, const char **))                                                 \
    X(CUresult, cuInit, "cuInit", (unsigned int))                                                                                \
    X(CUresult, cuDriverGetVersion, "cuDriverGetVersion", (int *))                                                               \
    X(CUresult, cuDeviceGetCount, "cuDeviceGetCount", (int *))                                                                   \
    X(CUresult, cuDeviceGet, "cuDeviceGet", (CUdevice *, int))                                                                   \
    X(CUresult, cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *, CUdevice_attribute, CUdevice))                             \
    X(CUresult, cuDeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                                                     \
    X(CUresult, cuDeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *, CUdevice))                                                   \
    X(CUresult, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))                                   \
    X(CUresult, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice))                                           \
    X(CUresult, cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                                                 \
    X(CUresult, cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))                                                            \
    X(CUresult, cuMemGetInfo, "cuMemGetInfo_v2", (size_t *, size_t *))                                                           \
    X(CUresult, cuMemFree, "cuMemFree_v2", (CUdeviceptr))                                                                        \
    X(CUresult, cuMemHostAlloc, "cuMemHostAlloc", (void **, size_t, unsigned int))                                               \
    X(CUresult, cuMemFreeHost, "cuMemFreeHost", (void *))                                                                        \
    X(CUresult, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CUdeviceptr, const void *, size_t, CUstream))                        \
    X(CUresult, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *, CUdeviceptr, size_t, CUstream))                              \
    X(CUresult, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CUdeviceptr, CUdeviceptr, size_t, CUstream))                         \
    X(CUresult, cuMemsetD8Async, "cuMemsetD8Async", (CUdeviceptr, unsigned char, size_t, CUstream))                              \
    X(CUresult, cuMemsetD2D32Async, "cuMemsetD2D32Async", (CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream))         \
    X(CUresult, cuModuleLoadDataEx, "cuModuleLoadDataEx", (CUmodule *, const void *, unsigned int, CUjit_option *, void **))     \
    X(CUresult, cuModuleUnload, "cuModuleUnload", (CUmodule))                                                                    \
    X(CUresult, cuModuleGetFunction, "cuModuleGetFunction", (CUfunction *, CUmodule, const char *))                              \
    X(CUresult, cuLinkCreate, "cuLinkCreate_v2", (unsigned int, CUjit_option *, void **, CUlinkState *))                         \
    X(CUresult, cuLinkAddData, "cuLinkAddData_v2",                                                                               \
      (CUlinkState, CUjitInputType, void *, size_t, const char *, unsigned int, CUjit_option *, void **))                        \
    X(CUresult, cuLinkComplete, "cuLinkComplete", (CUlinkState, void **, size_t *))                                              \
    X(CUresult, cuLinkDestroy, "cuLinkDestroy", (CUlinkState))                                                                   \
    X(CUresult, cuStreamCreate, "cuStreamCreate", (CUstream *, unsigned int))                                                    \
    X(CUresult, cuStreamDestroy, "cuStreamDestroy_v2", (CUstream))                                                               \
    X(CUresult, cuStreamSynchronize, "cuStreamSynchronize", (CUstream))                                                          \
    X(CUresult, cuStreamQuery, "cuStreamQuery", (CUstream))                                                                      \
    X(CUresult, cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream, CUevent, unsigned int))                                       \
    X(CUresult, cuEventCreate, "cuEventCreate", (CUevent *, unsigned int))                                                       \
    X(CUresult, cuEventDestroy, "cuEventDestroy_v2", (CUevent))                                                                  \
    X(CUresult, cuEventRecord, "cuEventRecord", (CUevent, CUstream))                                                             \
    X(CUresult, cuEventSynchronize, "cuEventSynchronize", (CUevent))                                                             \
    X(CUresult, cuEventQuery, "cuEventQuery", (CUevent))                                                                         \
    X(CUresult, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",                                                  \
      (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))                                                 \
    X(CUresult, cuMemAddressReserve, "cuMemAddressReserve", (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))    \
    X(CUresult, cuMemAddressFree, "cuMemAddressFree", (CUdeviceptr, size_t))                                                     \
    X(CUresult, cuMemCreate, "cuMemCreate",                                                                                      \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))                                 \
    X(CUresult, cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle))                                                    \
    X(CUresult, cuMemMap, "cuMemMap", (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))           \
    X(CUresult, cuMemUnmap, "cuMemUnmap", (CUdeviceptr, size_t))                                                                 \
    X(CUresult, cuMemSetAccess, "cuMemSetAccess", (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                        \
    X(CUresult, cuLaunchHostFunc, "cuLaunchHostFunc", (CUstream, CUhostFn, void *))                                              \
    X(CUresult, cuEventElapsedTime, "cuEventElapsedTime", (float *, CUevent, CUevent))                                           \
    X(CUresult, cuLaunchKernel, "cuLaunchKernel",                                                                                \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, CUstream,   \
       void **, void **))                                                                                                        \
    X(CUresult, cuStreamBeginCapture, "cuStreamBeginCapture_v2", (CUstream, CUstreamCaptureMode))                                \
    X(CUresult, cuStreamEndCapture, "cuStreamEndCapture", (CUstream, CUgraph *))                                                 \
    X(CUresult, cuGraphInstantiate, "cuGraphInstantiateWithFlags", (CUgraphExec *, CUgraph, unsigned long long))                 \
    X(CUresult, cuGraphLaunch, "cuGraphLaunch", (CUgraphExec, CUstream))                                                         \
    X(CUresult, cuGraphExecDestroy, "cuGraphExecDestroy", (CUgraphExec))                                                         \
    X(CUresult, cuGraphDestroy, "cuGraphDestroy", (CUgraph))

#define RT_CUBLASLT_FUNCTIONS(X)                                                                                                 \
    X(cublasStatus_t, cublasLtCreate, "cublasLtCreate", (cublasLtHandle_t *))                                                    \
    X(cublasStatus_t, cublasLtDestroy, "cublasLtDestroy", (cublasLtHandle_t))                                                    \
    X(size_t, cublasLtGetVersion, "cublasLtGetVersion", (void))                                                                  \
    X(const char *, cublasLtGetStatusName, "cublasLtGetStatusName", (cublasStatus_t))                                            \
    X(const char *, cublasLtGetStatusString, "cublasLtGetStatusString", (cublasStatus_t))                                        \
    X(cublasStatus_t, cublasLtMatmul, "cublasLtMatmul",                                                                          \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t, const void *,                 \
       cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,               \
       const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t))                                                              \
    X(cublasStatus_t, cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate",                                                      \
      (cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t))                                                             \
    X(cublasStatus_t, cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy", (cublasLtMatmulDesc_t))                            \
    X(cublasStatus_t, cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute",                                          \
      (cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t))                                              \
    X(cublasStatus_t, cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate",                                                  \
      (cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t))                                                     \
    X(cublasStatus_t, cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy", (cublasLtMatrixLayout_t))                      \
    X(cublasStatus_t, cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute",                                      \
      (cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void *, size_t))                                           \
    X(cublasStatus_t, cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate", (cublasLtMatmulPreference_t *))          \
    X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy", (cublasLtMatmulPreference_t))          \
    X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute",                              \
      (cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t))                                  \
    X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic",                                          \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,           \
       cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *))

/* NCCL is optional: the data-parallel ranks' collectives on GPU buffers (runtime/comm/comm_nccl.c).
 * Send and receive (NCCL 2.7) and the non-blocking communicator (2.14) are all it uses. */
#define RT_NCCL_FUNCTIONS(X)                                                                                                     \
    X(ncclResult_t, ncclGetVersion, "ncclGetVersion", (int *))                                                                   \
    X(const char *, ncclGetErrorString, "ncclGetErrorString", (ncclResult_t))                                                    \
    X(ncclResult_t, ncclGetUniqueId, "ncclGetUniqueId", (ncclUniqueId *))                                                        \
    X(ncclResult_t, ncclCommInitRankConfig, "ncclCommInitRankConfig", (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *))    \
    X(ncclResult_t, ncclCommGetAsyncError, "ncclCommGetAsyncError", (ncclComm_t, ncclResult_t *))                                \
    X(ncclResult_t, ncclCommAbort, "ncclCommAbort", (ncclComm_t))                                                                \
    X(ncclResult_t, ncclCommDestroy, "ncclCommDestroy", (ncclComm_t))                                                            \
    X(ncclResult_t, ncclGroupStart, "ncclGroupStart", (void))                                                                    \
    X(ncclResult_t, ncclGroupEnd, "ncclGroupEnd", (void))                                                                        \
    X(ncclResult_t, ncclSend, "ncclSend", (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))                 \
    X(ncclResult_t, ncclRecv, "ncclRecv", (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))

#ifndef RT_GPU_CHECK_DECLS

#define RT_GPU_PATH_MAX 512
#define RT_GPU_ACT_SLOTS 4    /* offload { activations = nvme }: the pinned staging slots (gpu_act.c) */
#define RT_GPU_ACT_TASKS 4096 /* ... and the chunks that may be queued on the copy stream at once */
struct RtGpu;
/* one chunk's store request, run by a host function on the copy stream (gpu_act.c) */
typedef struct RtActTask {
    struct RtGpu *g;
    int op, slot;
    int64_t off, len;
    int done; /* set (atomic) when the host function has run */
} RtActTask;

/* The loaded libraries and every function the runtime calls in them. */
typedef struct RtGpuApi {
    void *cuda_lib, *lt_lib, *nccl_lib; /* dlopen handles (nccl_lib NULL: no NCCL) */
    char cuda_path[RT_GPU_PATH_MAX];    /* the name or path each was opened by */
    char lt_path[RT_GPU_PATH_MAX];
    char nccl_path[RT_GPU_PATH_MAX];
    int initialized; /* cuInit ran: the libraries then stay loaded (see rt_gpu_api_close) */
#define RT_GPU_FIELD(ret, name, sym, args) ret(*name) args;
    RT_CUDA_FUNCTIONS(RT_GPU_FIELD)
    RT_CUBLASLT_FUNCTIONS(RT_GPU_FIELD)
    RT_NCCL_FUNCTIONS(RT_GPU_FIELD)
#undef RT_GPU_FIELD
} RtGpuApi;

/* gpu_api.c. Opens the driver ($MBT_LIBCUDA, else libcuda.so.1), cuBLASLt ($MBT_LIBCUBLASLT, else
 * found by name) and NCCL (optional)
 * and resolves every function: 1, or 0 with `why` saying which library or function is missing
 * (every library closed again). rt_gpu_api_close undoes it (see there). */
int rt_gpu_api_open(RtGpuApi *api, char *why, size_t cap);
void rt_gpu_api_close(RtGpuApi *api);
/* CUDA's name and description of rc ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"); a few codes the
 * driver cannot name itself (the stub library answers every call with 34) come from a table;
 * *name NULL for any other code the driver does not name. */
void rt_gpu_error_text(const RtGpuApi *api, CUresult rc, const char **name, const char **text);
/* RT_OK when rc is CUDA_SUCCESS; else fills err with "<call> (<what>): <name>: <text>" (`what`
 * formatted as printf does) and returns RT_ERR_NOMEM for an out-of-memory error, else RT_ERR_IO. */
RtStatus rt_cu_check(const RtGpuApi *api, CUresult rc, RtError *err, const char *call, const char *what, ...) RT_PRINTF(5, 6);
/* The same for a cuBLASLt status: "<call> (<what>): CUBLAS_STATUS_...: <text>". */
RtStatus rt_lt_check(const RtGpuApi *api, cublasStatus_t rc, RtError *err, const char *call, const char *what, ...)
    RT_PRINTF(5, 6);

/* ==== the open GPU =============================================================================== */

/* One kernel launch, GEMM, copy or wait being timed (MBT_DEBUG): its two events on its stream. */
typedef struct RtGpuPending {
    const char *name;
    CUevent start, stop; /* created once, reused after each resolution */
    CUstream stream;     /* where they are recorded: the compute stream or a copy stream */
    int tid;             /* its track (RT_GPU_TRACK_*) */
} RtGpuPending;

/* Timing (gpu_timing.c). Events are read back whenever the stream has been waited for: times
 * are offsets from an anchor event recorded at the previous read-back, so each float the driver
 * returns spans at most the time between two waits. */
typedef struct RtGpuTimer {
    int on;                                 /* MBT_DEBUG >= 1 or MBT_TRACE set */
    char *trace_path;                       /* a copy of MBT_TRACE, or NULL */
    RtGpuPending *pending;                  /* launches since the last read-back */
    int64_t npending, cap_pending, created; /* created: pending slots whose events exist */
    CUevent anchor[2];
    int cur;                                       /* anchor[cur] is the current origin */
    double anchor_us;                              /* its time since the first anchor */
    RtGpuEvent *events;                            /* MBT_TRACE: every event read back (up to RT_GPU_TRACE_MAX) */
    int64_t nevents, cap_events, dropped, written; /* written: events in the trace file already */
    RtGpuStats stats;                              /* per name */
} RtGpuTimer;

/* The step's functions as CUDA graphs (gpu_graph.c). */
#define RT_GPU_GRAPH_FNS 8   /* RtExecFn values a graph may stand for (rt_gpu_call's fn) */
#define RT_GPU_GRAPH_CACHE 8 /* graphs kept a function: one a distinct call (the gradient tree's regions, loss scales) */

typedef struct RtGpuGraph {
    unsigned char *sig; /* the calls it holds, as the probe recorded them */
    size_t nsig;
    CUgraph graph;
    CUgraphExec exec;
    CUdeviceptr stage; /* the uploads' bytes, written before each launch and copied inside the graph */
    CUdeviceptr loss;  /* the losses, copied there inside the graph and to the host after it */
    int64_t nup, nloss;
    uint64_t used; /* when last launched (for eviction) */
} RtGpuGraph;

typedef struct RtGpuUpload {
    void *dev;
    int64_t bytes, off; /* off: in the probe's host copy and in the graph's stage */
} RtGpuUpload;

typedef struct RtGpuGraphs {
    int on;          /* MBT_CUDA_GRAPH is not 0 and timing is off */
    int mode;        /* RT_GRAPH_EAGER, _PROBE, _CAPTURE */
    const char *bad; /* the probe met a call a graph cannot hold (a wait, a download): which */
    unsigned char *sig;
    size_t nsig, cap_sig;
    RtGpuUpload *up; /* the probe's uploads, their bytes in data */
    int64_t nup, cap_up;
    unsigned char *data;
    int64_t ndata, cap_data;
    double **loss_dst; /* the probe's losses, where each goes */
    int64_t nloss, cap_loss;
    RtGpuGraph *cur; /* the graph being captured, and its next upload and loss */
    int64_t next_up, next_loss;
    RtGpuGraph *cache[RT_GPU_GRAPH_FNS][RT_GPU_GRAPH_CACHE];
    unsigned char *seen[RT_GPU_GRAPH_FNS][RT_GPU_GRAPH_CACHE]; /* calls run eagerly lately: seen again, they are captured */
    size_t nseen[RT_GPU_GRAPH_FNS][RT_GPU_GRAPH_CACHE];
    int next_seen[RT_GPU_GRAPH_FNS]; /* the ring's next slot */
    int refused[RT_GPU_GRAPH_FNS];   /* the function cannot be a graph: it always runs eagerly */
    char refused_why[256];           /* the first failed capture's error (the report says it) */
    uint64_t tick;
    int64_t captured, launched, eager; /* counts for rt_gpu_graph_report */
} RtGpuGraphs;

enum { RT_GRAPH_EAGER, RT_GRAPH_PROBE, RT_GRAPH_CAPTURE };

typedef struct RtGemmPlan RtGemmPlan; /* x[r * pitch + c] *= scale for r < rows, c < cols (mbt_rt_scale), queued. */
RtStatus rt_gpu_scale_rows(RtGpu *g, float *x, float scale, int64_t rows, int64_t cols, int64_t pitch, RtError *err);

/* gpu_blas.c */

struct RtGpu {
    RtGpuApi api;
    const RtGpuProgram *prog;
    CUdevice dev;
    CUcontext ctx; /* the device's primary context (retained) */
    CUstream stream;
    CUmodule module;
    CUfunction *fns;                        /* [prog->nkernels] */
    CUfunction fn_axpy, fn_scale, fn_sumsq; /* the runtime's kernels (runtime/kernels/rt_kernels.cu) */
    CUfunction fn_axpy_table;
    struct {                 /* rt_gpu_axpy_table's tables on the device, one a distinct table */
        int64_t *host[64];   /* each table's entries (3 a row), as given */
        int64_t count[64];   /* its rows */
        CUdeviceptr dev[64]; /* its copy on the device */
        int n;
    } tables;
    const RtGpuImage *image; /* the module image loaded */
    char module_kind[96];    /* "cubin sm_90", "PTX compute_80, JIT-compiled for sm_90" */
    char module_note[640];   /* ", from the cache", ", saved in the cache", ", not cached: why" */
    int arch;                /* compute capability x 10 + minor: 90 */
    int sms;                 /* multiprocessors */
    int ordinal;             /* the device's index among the driver's (rt_gpu_bind_local_rank) */
    int driver;              /* cuDriverGetVersion: 12080 */
    double *partial;         /* device scratch of rt_gpu_sumsq_blocks */
    int64_t partial_cap;
    float *losses;                   /* page-locked: the losses rt_gpu_loss queued since the last wait */
    double *loss_dst[RT_GPU_LOSSES]; /* where each goes when the wait is over */
    int nlosses;
    /* cuBLASLt (gpu_blas.c) */
    cublasLtHandle_t lt;
    CUdeviceptr workspace;
    size_t workspace_size;
    RtGemmPlan **plans; /* open addressing, power-of-two capacity */
    int64_t nplans, cap_plans;
    CUdeviceptr ones[2]; /* k ones (f32, bf16): the column sums' product when cuBLASLt has no epilogue for them */
    int64_t ones_cap[2];
    RtGpuTimer timer;
    RtGpuGraphs graphs;
    struct { /* offload { activations = host | nvme } (gpu_act.c): the copy stream, its two events, the pinned memory */
        CUstream stream;
        CUevent issued, copied; /* recorded on the compute stream before a copy, on the copy stream before a wait */
        /* the event after the last copy of each offset (a buffer's place in the store or the pinned
         * memory), which a wait for that buffer waits for (gpu_act.c's act_event) */
        struct RtActEvent *events;
        int nevents, cap_events;
        unsigned char *host; /* host: the plan's bytes; nvme: the staging slots (page-aligned) */
        int64_t bytes;       /* the pinned bytes in use (host: the plan's; nvme: nslots x slot_bytes) */
        /* nvme: the store (RtExec's, not owned) and the ring of staging slots each chunk of a copy goes
         * through, with the host functions' task records (gpu_act.c) */
        struct RtStore *store;
        void *raw; /* what cuMemHostAlloc gave (host may be above it, aligned) */
        int nslots, cursor;
        int64_t slot_bytes, ntasks;
        struct RtActTask *tasks;
        double io_s;   /* the host functions' seconds in the store's I/O (CUDA's callback thread) */
        double wait_s; /* the main thread's seconds waiting for task records */
        int failed;    /* a host function's store request failed (atomic); why says how */
        char why[512];
    } act;
    struct { /* offload { optimizer } (gpu_opt.c): the host update's copy stream and its events */
        CUstream stream;
        CUevent issued, copied; /* recorded on the compute stream before the downloads, on the copy stream after the uploads */
        CUevent *got, *put;     /* chunk c's download done, its upload done (rt_gpu_opt_events) */
        int nevents;
        int64_t down_bytes, up_bytes; /* queued so far, in all */
    } opt;
    struct {                      /* the data-parallel reduction's communication stream (gpu_comm.c) */
        CUstream stream, compute; /* compute: the compute stream, while rt_gpu_comm_enter has swapped them */
        CUevent ready, done;      /* recorded on the compute stream before a bucket, on the comm stream at the join */
    } comm;
    struct {
        CUdeviceptr *ptr; /* the live device allocations (rt_gpu_mem_alloc), their sizes in bytes */
        int64_t *bytes, n, cap;
        int64_t now, peak; /* bytes live, the high-water mark */
    } mem;
    char describe[1536];
};

#define RT_GPU_MAX_PARAMS 512 /* kernel parameters: 4 KiB of pointers, every driver's limit */

/* A device pointer as the driver API takes it. */
static inline CUdeviceptr rt_dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* gpu.c. Every device allocation of the runtime goes through these two, which keep the bytes
 * live and their high-water mark (rt_gpu_peak_bytes). */
CUresult rt_gpu_mem_alloc(RtGpu *g, CUdeviceptr *p, size_t bytes);
void rt_gpu_mem_free(RtGpu *g, CUdeviceptr p);

/* gpu_comm.c: g's calls queue on stream s until rt_gpu_comm_leave (as rt_gpu_comm_enter does with
 * the communication stream; gpu_vmm.c's gathers) */
void rt_gpu_comm_enter_stream(RtGpu *g, CUstream s);
/* gpu_comm.c: the communication stream's work finished and the stream and its events freed;
 * rt_gpu_close calls it. */
void rt_gpu_comm_close(RtGpu *g);

/* gpu.c. The calling thread's current context becomes the GPU's (a context is current per thread). */
RtStatus rt_gpu_use(RtGpu *g, RtError *err);
/* gpu.c. A side stream (non-blocking) and two events for its fork from and join to the compute
 * stream (the activations' copy stream, the buckets' communication stream); a failure names
 * stream_what or events_what, and what was made is left for the caller's close. */
RtStatus rt_gpu_side_stream(RtGpu *g, CUstream *s, CUevent *fork, CUevent *join, const char *stream_what, const char *events_what,
                            RtError *err);

/* x[r * pitch + c] *= scale for r < rows, c < cols (mbt_rt_scale), queued. */
RtStatus rt_gpu_scale_rows(RtGpu *g, float *x, float scale, int64_t rows, int64_t cols, int64_t pitch, RtError *err);

/* gpu_blas.c */
RtStatus rt_gpu_blas_open(RtGpu *g, RtError *err); /* the handle, the workspace */
void rt_gpu_blas_close(RtGpu *g);                  /* the plans, the workspace, the handle */

/* gpu_timing.c: around every launch and GEMM when g->timer.on. begin records the start event of
 * a new pending slot (its index in *slot) on the compute stream (track 0); end, given the launch's
 * status, records the stop event on the slot's stream (RT_OK) or frees the slot again and returns
 * that status. begin_on: the same on stream s, track tid (the offloads' copies on their copy
 * streams: gpu_act.c, gpu_opt.c); such a pair must be followed by a wait of the compute stream for
 * that stream (the plan's waits, rt_gpu_opt_join) before rt_gpu_timer_resolve, else resolve waits
 * for it (gpu_timing.c). */
RtStatus rt_gpu_timer_open(RtGpu *g, RtError *err);
RtStatus rt_gpu_time_begin(RtGpu *g, int64_t *slot, RtError *err);
RtStatus rt_gpu_time_begin_on(RtGpu *g, CUstream s, int tid, int64_t *slot, RtError *err);
RtStatus rt_gpu_time_end(RtGpu *g, int64_t slot, const char *name, RtStatus launched, RtError *err);
/* After the compute stream was waited for: reads the pending events into stats (and the trace). */
RtStatus rt_gpu_timer_resolve(RtGpu *g, RtError *err);
RtStatus rt_gpu_trace_flush(RtGpu *g, RtError *err); /* writes MBT_TRACE's file when it has new events */
void rt_gpu_timer_close(RtGpu *g);

/* gpu_graph.c. The entry points generated code calls (rt_gpu_launch, the GEMMs, rt_gpu_axpy,
 * rt_gpu_copy, rt_gpu_upload, rt_gpu_download, rt_gpu_loss) first call rt_gpu_graph_probe with
 * their arguments: while a function is probed (graphs.mode == RT_GRAPH_PROBE) it records them and
 * returns 1 (the call then does nothing on the GPU); else 0. tag names the entry point; bad: the
 * call cannot be in a graph (a wait). */
int rt_gpu_graph_probe(RtGpu *g, int tag, const void *args, size_t n, int bad);
/* rt_gpu_upload and rt_gpu_loss in a probe or a capture: 1 when handled (status in *st), else 0. */
int rt_gpu_graph_upload(RtGpu *g, void *dev, const void *host, int64_t bytes, RtStatus *st, RtError *err);
int rt_gpu_graph_loss(RtGpu *g, double *dst, const float *dev, RtStatus *st, RtError *err);
RtStatus rt_gpu_graph_open(RtGpu *g, RtError *err); /* MBT_CUDA_GRAPH */
void rt_gpu_graph_forget(RtGpu *g);                 /* frees every graph kept (the stream waited for first) */
void rt_gpu_graph_close(RtGpu *g);

#endif /* RT_GPU_CHECK_DECLS */

#endif
