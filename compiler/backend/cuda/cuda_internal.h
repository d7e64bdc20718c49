/* cuda_internal.h - what the CUDA back end's two code generators share: cuda.c (the generic
 * kernels: the scan that decides a launch's geometry, and the emission of the KIR as CUDA C) and
 * cuda_dedicated.c (the kernels with a body of their own: attention's template calls, the
 * segmented scatter_add, cross-entropy's online row statistics); cuda_scan.c is cuda.c's scan. Not for other stages: cuda.h is
 * the back end's surface. */
#ifndef MBT_CUDA_INTERNAL_H
#define MBT_CUDA_INTERNAL_H

#include <stdio.h>

#include "cuda.h"

#define CUDA_THREAD_BLOCK 256     /* threads per block in thread mode */
#define CUDA_WARP_BLOCK 128       /* warp mode: 4 work items per block */
#define CUDA_BLOCK_BLOCK 256      /* block mode: 8 warps per work item */
#define CUDA_MAX_BLOCKS 65536     /* grid cap: beyond it threads take more items (grid stride) */
#define CUDA_REGISTER_BUDGET 128  /* registers a thread that __launch_bounds__ allows */
#define CUDA_WARP_MAX_EXTENT 1024 /* split loops up to this long: a warp; longer: a block */
#define CUDA_COLUMN_THREADS 16384 /* a column reduction with this many work items: a thread each */
#define CUDA_COLUMN_SHORT 128     /* ... or with loops this short (the second level of a two-level sum) */
#define CUDA_SCATTER_GROUPS 1024
#define CUDA_SCATTER_BLOCK 256

typedef struct CudaPlan {
    CudaLaunch launch;
    int *split;     /* per KIR id: 1 for a top-level K_LOOP that runs split across the threads */
    int *end;       /* per K_LOOP / K_IF id: its K_ENDLOOP / K_ENDIF */
    int needs_sync; /* the kernel loads a buffer it stores to */
    int *vec;       /* vectorised: per buffer, how its accesses go (CUDA_VEC_*) */
    int *vec_n;     /* per buffer: the divisor of CUDA_VEC_MOD and CUDA_VEC_DIV */
    /* the integer values' ranges (cuda_ranges: interval arithmetic from gid < grid, the loops'
       extents and the constants): known[id] when every value of %id lies in [lo[id], hi[id]] */
    unsigned char *known;
    int64_t *lo, *hi;
    unsigned char *narrow; /* per KIR id: an i64 value computed and kept in 32 bits (an `int`) */
    unsigned char *ctx32;  /* per KIR id: its i64 operands are written as 32-bit values */
    int *arm;              /* per KIR id: 0, or the select arm it is written in (2s + 1, 2s + 2: cuda.c's cuda_arms) */
} CudaPlan;

/* How a vectorised kernel reaches a buffer for its 4 work items gid0 .. gid0 + 3 (all accesses to
 * one buffer alike): at gid (4 consecutive elements, one vector), at gid mod N with 4 | N (a
 * broadcast row such as a bias: 4 consecutive elements starting at gid0 mod N, one vector), or at
 * gid / M with 4 | M (one element for all four: one scalar load). */
enum { CUDA_VEC_NONE, CUDA_VEC_GID, CUDA_VEC_MOD, CUDA_VEC_DIV };

/* cuda_scan.c: the plan of one generic kernel (its launch, split loops, vectors, 32-bit values,
 * select arms), in ar; and whether an access is one the vectorised form makes through its vector */
void cuda_scan(const Kernel *k, CudaPlan *P, Arena *ar);
int cuda_vec_access(const CudaPlan *P, const Kernel *k, const KInst *in);

typedef struct CudaEmit {
    FILE *out;
    const Kernel *k;
    CudaPlan P;
    Arena *ar;
    int lane;     /* vectorised: the lane (0..3) being written; -1 otherwise */
    int in_split; /* the K_LOOP id of the split loop being written, -1 outside */
    int ctx32;    /* the instruction being written takes its i64 operands in 32 bits (CudaPlan.ctx32) */
    int indent;
} CudaEmit;

/* cuda.c's emission helpers */
void cuda_line(CudaEmit *E, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *cuda_memory_type(const CudaEmit *E, DType dt);
const char *cuda_float_literal(CudaEmit *E, KType t, double v);
int64_t cuda_scatter_rows(const KScatter *s);

/* cuda_dedicated.c: the bodies of the launch modes CUDA_ATTENTION, CUDA_SCATTER and CUDA_CE_STATS */
void cuda_attention_call(CudaEmit *E);
void cuda_scatter_body(CudaEmit *E);
void cuda_ce_body(CudaEmit *E);
void cuda_kv_attention_call(CudaEmit *E); /* CUDA_KV_ATTN: rt_kv_attention.cuh's template */

#endif
