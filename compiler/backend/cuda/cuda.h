/* cuda.h - the CUDA back end's code generator: kernel IR (kir.h) -> readable CUDA C for NVRTC.
 *
 * Pipeline position: fuse -> kir -> [cuda] (beside compiler/cpu) -> nvrtc (compiler/nvrtc.h:
 * PTX and cubin per architecture) -> embedded in the executable by the host code (later).
 *
 * The ABI of a generated kernel (one `extern "C" __global__` function per Kernel, named after
 * Kernel.name):
 *
 *     __global__ void NAME(const float *__restrict__ p0, ..., float *__restrict__ pN);
 *
 *   - parameter i is the base address of the kernel's buffer i (Kernel.bufs[i]) in device memory,
 *     a dense row-major array of its element type: f32 `float`, f64 `double`, i32 `int`, i64
 *     `long long`, bool `unsigned char` (0 or 1), f16 `__half`, bf16 `__nv_bfloat16`. Read-only
 *     buffers are `const`. Every base address is 64-byte aligned (the runtime's arena and regions
 *     are: PLAN_ALIGN offsets from cudaMalloc'd bases): the vectorised kernels rely on it.
 *   - it is launched with CudaLaunch's geometry, exactly (block size and shared memory are baked
 *     into the code; the block count may be any >= 1: every kernel loops over its work items with
 *     a grid stride, so a smaller grid only means more items per thread).
 *   - __restrict__ is written when the schedule's buffers are disjoint (cuda_emit_kernel's
 *     `disjoint`, as cpu_lower_kernel's) and no two parameters share a buffer.
 *
 * Numerics follow compiler/cpu.h (see docs/cuda.md): IEEE f32/f64 without fast math (NVRTC runs
 * with --fmad=false, -prec-div and -prec-sqrt on, no -ftz); f16/bf16 computed in f32, stored
 * rounded to nearest even (bf16 with the CPU back end's integer rounding, bit for bit); max/min
 * propagate NaN with -0 < +0; mod is NumPy's; float->int casts truncate and saturate, NaN -> 0.
 * A reduction split across threads (row kernels) adds in a fixed tree whose shape depends only on
 * the kernel: its result is deterministic, and may round differently from the CPU's serial sum. */
#ifndef MBT_CUDA_H
#define MBT_CUDA_H

#include <stdint.h>
#include <stdio.h>

#include "kir.h"

/* How a kernel's work items map onto threads. */
typedef enum CudaMode {
    CUDA_THREAD,    /* one thread per work item (or per 4 consecutive items when vectorised) */
    CUDA_WARP,      /* one warp per work item: its reduction loops split across the 32 lanes */
    CUDA_BLOCK,     /* one block per work item: split across its threads, combined through shared memory */
    CUDA_ATTENTION, /* an attention kernel whose layout fusion resolved (Kernel.attn): a call of a
                       template of runtime/kernels/rt_attention.cuh, 4 warps a block, a block per
                       tile of query (key) rows */
    CUDA_SCATTER,   /* scatter_add with plain row-major operands (Kernel.scatter): the deterministic
                       embedding backward, a block per group of output rows (docs/cuda.md) */
    CUDA_CE_STATS,  /* cross-entropy's row statistics from rows of a buffer (Kernel.ce): a block per
                       row, one online pass (docs/cuda.md) */
    CUDA_KV_ATTN,   /* attention over the paged KV cache (Kernel.kv): a call of
                       runtime/kernels/rt_kv_attention.cuh, 4 warps a block, a block per (row,
                       key/value head), the keys split across the warps (docs/serve.md) */
} CudaMode;

/* The launch geometry chosen for a kernel: what the host side passes to cuLaunchKernel. */
typedef struct CudaLaunch {
    CudaMode mode;
    int block;         /* threads per block (blockDim.x; the kernel assumes exactly this) */
    int64_t blocks;    /* gridDim.x: enough blocks to give every thread or warp work, capped */
    int shared;        /* bytes of static shared memory (none dynamic) */
    int vector;        /* consecutive work items per thread step: 4 with vector accesses, else 1 */
    int64_t per_block; /* work items a block takes at a time (block, block / 32 or 1; x vector) */
} CudaLaunch;

const char *cuda_mode_name(CudaMode m); /* "thread", "warp", "block", "attention", "scatter", "ce_stats", "kv_attention" */

/* The translation unit's head: includes (cuda_fp16.h / cuda_bf16.h only when half = 1), the
 * device helpers every kernel uses (NaN-propagating max/min, NumPy mod, bf16 rounding, the fixed
 * reduction trees) and the attention templates its kernels need (attn: the largest of their
 * cuda_kernel_uses_attention; CUDA_ATTN_TENSOR_CORES adds rt_attention_tc.cuh to rt_attention.cuh,
 * CUDA_ATTN_FA2 both and rt_attention_fa2.cuh; kv = 1: a kernel uses the paged KV cache's
 * template, rt_kv_attention.cuh, after rt_attention.cuh).
 * Printed once, before the kernels. */
void cuda_emit_prelude(FILE *out, int half, int attn, int kv);

/* 1 when kernel k has an f16 or bf16 buffer or value (the TU then needs the half headers). */
int cuda_kernel_uses_half(const Kernel *k);

/* Whether kernel k is written as a call of an attention template (CUDA_ATTENTION mode): it has a
 * resolved layout (Kernel.attn) with heads at most 128 wide, in f32, f16 or bf16. In f16 or bf16
 * with heads multiples of 16, the forward and the backward are rt_attention_fa2.cuh's
 * flash-attention-2 kernels (CUDA_ATTN_FA2); the rest run on the CUDA
 * cores. CUDA_ATTN_TENSOR_CORES (rt_attention_tc.cuh's wmma kernels) is no longer returned: the
 * FA2 kernels cover every shape it did (docs/cuda.md). */
enum { CUDA_ATTN_NONE, CUDA_ATTN_CUDA_CORES, CUDA_ATTN_TENSOR_CORES, CUDA_ATTN_FA2 };
int cuda_kernel_uses_attention(const Kernel *k);
/* 1 when an attention kernel on the CUDA cores is f32: rt_attention.cuh's mbt_attn_f32t_forward,
 * _bwd_q, _bwd_kv (the flash-attention-2 tiling in f32), not mbt_attn_forward and the others. */
int cuda_attention_f32_tiled(const Kernel *k);

/* Whether kernel k is written as the segmented scatter_add (CUDA_SCATTER mode): it has resolved
 * operands (Kernel.scatter) of at most 2^31 - 1 rows and positions. */
int cuda_kernel_uses_scatter(const Kernel *k);

/* Whether kernel k is written as the online cross-entropy statistics (CUDA_CE_STATS mode): it has
 * resolved logits (Kernel.ce) in f32, f16 or bf16 (f64 keeps the body). */
int cuda_kernel_uses_ce(const Kernel *k);

/* Whether kernel k is written as a call of rt_kv_attention.cuh's template (CUDA_KV_ATTN mode): it
 * has a KKvAttn (Kernel.kv) in f32, f16 or bf16 with heads at most 256 wide and at most 1024
 * columns of query heads a key/value head (G x D: the block's shared partial results). */
int cuda_kernel_uses_kv(const Kernel *k);

/* Writes kernel k as CUDA C to out: a comment naming it, its launch geometry, its buffers and
 * `note` (the fused ops and their source lines, one a line; may be NULL), then the function.
 * Fills *launch (may be NULL). k must pass kir_verify (else an internal error). */
void cuda_emit_kernel(FILE *out, const Kernel *k, const char *note, int disjoint, CudaLaunch *launch);

/* Chooses k's launch geometry (what cuda_emit_kernel bakes in) without writing anything. */
CudaLaunch cuda_launch_for(const Kernel *k);

#endif
