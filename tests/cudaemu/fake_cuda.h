/* fake_cuda.h - the controls of tests/cudaemu/fake_cuda.c, a stand-in for the CUDA driver and
 * cuBLASLt that runs on the CPU (test_rt_gpu loads it through MBT_LIBCUDA and MBT_LIBCUBLASLT and
 * reaches this struct with dlsym(handle, "fake_control")). */
#ifndef MBT_FAKE_CUDA_H
#define MBT_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_CUBIN "FAKECUBIN\n" /* a module image: this line, then one function name a line, NUL-terminated */
#define FAKE_PTX "FAKEPTX\n"     /* PTX: this line, then the names; cuLink* turns it into a cubin */

typedef struct FakeControl {
    /* settings */
    int major, minor, sms, devices; /* the device (8.0, 4 SMs, 1 device) */
    int init_result;                /* what cuInit returns (0) */
    size_t oom_above;               /* cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY above this (0: never) */
    int no_algo;                    /* cublasLtMatmulAlgoGetHeuristic finds nothing */
    int no_bgrad;                   /* ... nothing with the bias-gradient epilogue */
    /* counters and what the last calls saw */
    int links; /* PTX compilations (cuLinkComplete) */
    int heuristics, matmuls, launches;
    int live_allocs;        /* device allocations not freed */
    uint32_t last_align[4]; /* the last heuristic's minimum alignments of A, B, C, D */
    char last_kernel[64];
    unsigned last_grid[2], last_block;
    double clock_ms;                  /* a launch takes 0.5 ms, a matmul 2 ms; events read this clock */
    long long htod_bytes, dtoh_bytes; /* bytes copied host to device, device to host */
} FakeControl;

#endif
