/* nvrtc.h - NVRTC, opened at run time: CUDA C -> PTX and cubin for one GPU architecture, with
 * ptxas's per-kernel figures (registers, spills, shared memory).
 *
 * Pipeline position: cuda (CUDA C) -> [nvrtc] -> embedded in the executable / --emit=ptx, sass.
 * libnvrtc is dlopen'ed (the library path, then $CUDA_HOME/lib64 and /usr/local/cuda/lib64) and
 * its few functions declared here: mbtc builds and runs without CUDA, and only what needs NVRTC
 * (--emit=ptx, --emit=sass, --cuda-info, the cuda test layer) says it is missing.
 *
 * Options every compilation gets (the numerics of cuda.h): --fmad=false (no contraction into
 * FMA, as the CPU back end), -ftz=false, -prec-div=true, -prec-sqrt=true, --std=c++17, -default-device,
 * --ptxas-options=-v (the figures), and -I the CUDA include directory when the source includes
 * cuda_fp16.h / cuda_bf16.h (found beside the library: LIBDIR/../include, or $CUDA_HOME/include). */
#ifndef MBT_NVRTC_H
#define MBT_NVRTC_H

#include <stddef.h>

#include "arena.h"

typedef struct Nvrtc Nvrtc;

/* ptxas's figures for one kernel, from `--ptxas-options=-v` in the program log. */
typedef struct NvrtcKernelInfo {
    const char *name;
    int registers;
    int spill_stores, spill_loads; /* bytes */
    int stack;                     /* bytes of stack frame (local memory) */
    int shared;                    /* bytes of static shared memory */
} NvrtcKernelInfo;

/* One translation unit compiled for one architecture. */
typedef struct NvrtcResult {
    const char *arch;  /* "sm_90" */
    const char *ptx;   /* NUL-terminated (compute_XX), or NULL when not asked for */
    const char *cubin; /* sm_XX */
    size_t cubin_size;
    const char *log; /* NVRTC's log of the cubin compilation (ptxas info lines) */
    int nkernels;
    NvrtcKernelInfo *info;
    double ms; /* wall time of the NVRTC calls */
} NvrtcResult;

/* Opens libnvrtc. Returns NULL with *why (what was tried, dlerror's words) when it is absent. */
Nvrtc *nvrtc_open(Arena *ar, const char **why);

/* NVRTC's version ("13.0"). */
const char *nvrtc_version(Nvrtc *nv, Arena *ar);

/* Compiles source (named `name` in messages) for arch ("sm_80") to cubin with ptxas's figures,
 * and to PTX (compute_80) when want_ptx. Returns 0, or 1 with *err (NVRTC's words and its log). */
int nvrtc_compile(Nvrtc *nv, const char *source, const char *name, const char *arch, int want_ptx, NvrtcResult *out, Arena *ar,
                  const char **err);

/* The options nvrtc_compile passes for arch (without -I), as one line for an nvcc command. */
const char *nvrtc_options_line(void);

/* Parses ptxas -v lines (`Compiling entry function 'NAME'`, `N bytes stack frame, N bytes spill
 * stores, N bytes spill loads`, `Used N registers, ... N bytes smem`) into info[]. Returns the
 * number of kernels found (exposed for the unit test). */
int nvrtc_parse_ptxas(const char *log, NvrtcKernelInfo **info, Arena *ar);

/* The figures of kernel `name` in r, or NULL. */
const NvrtcKernelInfo *nvrtc_find(const NvrtcResult *r, const char *name);

#endif
