/* cuda_program.h - a whole program's CUDA: every kernel of its schedules in one translation unit,
 * compiled by NVRTC once per architecture, and what mbtc shows of it (--emit=cuda, ptx, sass,
 * --cuda-info, --dump-dir).
 *
 * Pipeline position: fuse (the schedules host_schedules lists) -> cuda (each kernel) ->
 * [cuda_program] (the translation unit) -> nvrtc. One NVRTC call per architecture for the whole
 * program, not one per kernel: ptxas's figures come back per kernel in its log. */
#ifndef MBT_CUDA_PROGRAM_H
#define MBT_CUDA_PROGRAM_H

#include <stdio.h>

#include "cuda.h"
#include "fuse.h"
#include "nvrtc.h"

/* One schedule of the program (its kernels already named with the schedule's prefix: step_k3_add). */
typedef struct CudaSchedule {
    FuseResult *r;
    const Graph *g; /* for the fused ops' source lines */
    int disjoint;   /* cuda_emit_kernel's flag */
} CudaSchedule;

typedef struct CudaProgram {
    const char *source; /* the translation unit: prelude, then every kernel */
    int nkernels;
    Kernel **kernels;           /* renamed with their schedule's prefix */
    const char **notes;         /* the fused ops and their source lines, per kernel */
    CudaLaunch *launch;         /* per kernel */
    const char **kernel_source; /* per kernel: the prelude and that kernel alone (--dump-dir) */
    int *same_as;               /* per kernel: the earlier kernel whose function it shares, or -1 */
    int nfunctions;             /* distinct functions in the translation unit */
} CudaProgram;

/* The function kernel k is launched as: its own, or that of the kernel with the same code. */
const char *cuda_program_function(const CudaProgram *p, int k);

/* Generates the program's CUDA C: the kernels of s[0..n) in order, then the runtime's own
 * (runtime/kernels/rt_kernels.cu: mbt_rt_axpy, mbt_rt_scale, mbt_rt_sumsq_blocks). A kernel
 * whose function is the same as an earlier one's but for its name (a layer's kernels, once per
 * layer) is not emitted again: its comment names the function it is launched as (same_as), so
 * NVRTC compiles each distinct kernel once. */
CudaProgram *cuda_program_build(const CudaSchedule *s, int n, Arena *ar);

/* Splits "sm_80,sm_90" into archs (at most max); "none" is none. Returns the count, or -1 with *err. */
int cuda_parse_archs(const char *list, const char **archs, int max, Arena *ar, const char **err);

/* Which architectures cuda_program_compile also makes PTX for. */
enum { CUDA_PTX_NONE, CUDA_PTX_ALL, CUDA_PTX_HIGHEST };
/* Compiles the program for every arch, and to PTX as want_ptx says, into res[0..narch). On
 * failure reports through diag: NVRTC's log, the numbered source lines it names, and an nvcc
 * command that reproduces it (the source written to a file). Returns 0 or 1. A missing NVRTC is
 * an error that says what needed it (`what`, e.g. "--emit=ptx"). */
int cuda_program_compile(const CudaProgram *p, const char *const *archs, int narch, int want_ptx, NvrtcResult *res,
                         const char *what, Arena *ar);

/* The SASS of a cubin, by cuobjdump -sass (else nvdisasm) from $CUDA_HOME/bin, the PATH or
 * /usr/local/cuda/bin. Returns the text, or NULL with *err. */
const char *cuda_sass(const NvrtcResult *r, Arena *ar, const char **err);

/* One line a kernel: `# ptxas NAME: sm_80 24 registers, 0 B spill stores, 0 B spill loads,
 * 0 B stack, 0 B smem, occupancy 8 blocks of 256 threads (100% of 64 warps); sm_90 ...` (the
 * lines --cuda-info appends to --emit=kernels; the occupancy is cuda_occupancy's, left out for an
 * architecture it does not know). */
int cuda_occupancy(const char *arch, int threads, int registers, int shared, int *max_warps);
void cuda_print_info(FILE *out, const CudaProgram *p, const NvrtcResult *res, int narch);

/* --dump-dir: writes DIR/program.cu, and per kernel NAME.kir, NAME.cu, and per arch
 * NAME.ARCH.ptx (with want_ptx), NAME.ARCH.sass (when cuobjdump is found), plus the whole
 * program's program.ARCH.cubin, .ptx and .ptxas.log. Returns 0, or 1 after a diag error. */
int cuda_program_dump(const CudaProgram *p, const NvrtcResult *res, int narch, const char *dir, Arena *ar);

#endif
