/* rt_program.h - the ABI between a compiled .mbt program and libmbtrt: what the generated object
 * provides (an RtProgram descriptor exported as the global `mbt_program`) and the runtime services
 * its code may call (the thread pool, batched SGEMM).
 *
 * Pipeline position: the seam between compiler/host (which emits the descriptor and the step
 * functions as LLVM IR) and the runtime (runtime/cli: main.c, cli.c, train.c, generate.c, which
 * own the command line, the loop, the data, logging and weights). tests/runtime/bigram_program.c
 * implements this ABI by hand for the runtime's own tests. docs/runtime.md, "The program ABI", is
 * the prose version of this header.
 *
 * Division of labour. The runtime allocates every region (64-byte aligned), initialises the
 * parameters (rt_init_param, from the seed and each parameter's dotted name), loads and saves
 * weights, reads the data, runs the step loop (micro-batches, gradient accumulation, clipping,
 * the learning-rate schedule), logs, evaluates and samples. The generated code computes: the
 * forward and backward pass of one micro-batch, the loss-only forward, the logits for generation,
 * and the optimizer's elementwise update. It keeps no state of its own between calls: everything
 * it reads or writes is in an RtStep.
 *
 * Memory. Parameters, gradients and optimizer state are three f32 regions. The gradient region
 * has exactly the parameter region's layout (parameter i's gradient is at grads + offset_i). The
 * optimizer-state layout is the generated code's business (adamw: m then v, each shaped like the
 * parameter region). Activations live in one arena whose offsets the compiler's memory plan
 * assigns; it is scratch, valid only during one call.
 *
 * Determinism. Every function must give bit-identical results whatever the pool's thread count:
 * work is split with rt_parallel_for so that each output element is computed by exactly one
 * thread, and a floating-point reduction across elements is done in a fixed order that does not
 * depend on the split (see rt_parallel_for). rt_sgemm_batched obeys the same rule. */
#ifndef MBT_RT_PROGRAM_H
#define MBT_RT_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "rt.h"

/* The layout version of RtProgram and RtStep. A program compiled against another version is
 * refused when it starts (the compiler and the runtime come from one build, so a mismatch is a
 * stale object file). */
#define RT_ABI_VERSION                                                                                                           \
    24 /* 2: RtTrainSettings gained data, nramp and ramp (batch-size ramps); 3: checkpoints
                          * (RtTrainSettings.ckpt_*, RtProgram.hash, nstate, state_names); 4: the GPU
                          * (RtStep.gpu, RtProgram.gpu); 5: the GEMMs' epilogue arguments; 6: RtProgram.plan;
                          * 7: documents (RtStep.pos, RtTrainSettings.docs);
                          * 8: RtTrainSettings.zero, RtStep.lo and hi (ZeRO's ranged optimizer_update);
                          * 9: global_mean (RtStep.stats, stats_out; RtProgram.stat_floats,
                          * forward_stats; RtGpuProgram.forward_stats);
                          * 10: RtGenerateSettings carries the serve block (top_p, batch, kv, port, tokenizer, chat);
                          *    the KV cache (RtStep.kv and kv_pool, RtProgram.forward_chunk and kv, the chunk phase);
                          * 11: RtTrainSettings.adapter_config, adapter_modules (PEFT adapters);
                          * 12: RtTrainSettings.ncurriculum, curriculum, curriculum_lens (sequence-length buckets);
                          * 13: RT_GEMM_ADD (the GEMMs' add epilogue: fused LoRA);
                          * 14: RtTrainSettings.offload_optimizer, offload_chunk (optimizer state in a store file);
                          * 15: RtStep.grad_hook and rt_grad_ready (the gradient reduction overlapped with the backward);
                          * 16: RtProgram.nrunning, running, running_momentum (running statistics),
                          *    RtStep.training;
                          * 17: RtTrainSettings.offload_act_bytes, RtStep.act, rt_act_copy (activations in a store file);
                          * 18: RtStep.param_hook, rt_param_need and rt_param_done, RtPlanInfo.gather_window and
                          *    gather_units (ZeRO-3's parameters gathered around their uses);
                          * 19: RtTrainSettings.offload_act, offload_gbps (activations in pinned host memory
                          *    on a GPU build; the copy rate the plan assumed);
                          * 20: RtGpuProgram.forward_chunk (the chunk phase on the GPU);
                          * 21: RtStep.casts_kept (the parameters' casts run once an optimizer step);
                          * 22: RtStep.pcasts, RtProgram.pcast_bytes (the parameter casts' region the update
                          *    writes), casts_kept 2;
                          * 23: RtPlanInfo.gather_page, gather_window_pages (ZeRO-3's gathers by the target's page);
                          * 24: RtStep.state_stride (optimizer_update over a chunk of a whole region's state) */

/* Global-norm clipping, done by the runtime between the micro-batches and optimizer_update: with
 * threshold c > 0 and gradient norm n, the gradients are scaled by c / (n + RT_CLIP_EPS) when that
 * is below 1 (PyTorch's clip_grad_norm_ rule). */
#define RT_CLIP_EPS 1e-6

/* Regions and arena are aligned to this many bytes (one cache line, one AVX-512 vector). The
 * compiler keeps each parameter's offset a multiple of RT_ALIGN / sizeof(float) elements so
 * every parameter starts aligned; the runtime does not require it. */
#define RT_ALIGN 64

/* ==== the thread pool (pool.c) =============================================================== */

/* A fixed set of threads created once per run (`--threads N`, default the cores this process may
 * use). The caller's thread is worker 0 and takes part; workers 1..N-1 sleep on a condition
 * variable between jobs. */
typedef struct RtPool RtPool;

#define RT_POOL_MAX_THREADS 64 /* --threads limit: OpenBLAS (Debian's build) is made for at most 64 threads */

/* One chunk of a parallel loop: indices [begin, end) of the range. `worker` (0..threads-1) is
 * which thread runs it; use it only to pick per-thread scratch, never to change a result. */
typedef void (*RtRangeFn)(void *ctx, int64_t begin, int64_t end, int worker);

RtStatus rt_pool_create(RtPool **out, int nthreads,
                        RtError *err); /* nthreads <= 0: rt_cpu_count(); at most RT_POOL_MAX_THREADS */
void rt_pool_destroy(RtPool *p);       /* joins the workers (NULL is fine) */
int rt_pool_threads(const RtPool *p);  /* N (1 for a NULL pool) */
int rt_cpu_count(void);                /* CPUs this process may run on (sched_getaffinity), capped at RT_POOL_MAX_THREADS */

/* Runs fn over [0, n) split into at most N contiguous chunks, one per thread, and returns when
 * all are done. Each index is in exactly one chunk, and fn must compute each index's results
 * from that index alone, so results never depend on N. The pool itself never reduces across
 * chunks: a sum over the range is written as partial results per fixed-size block (the block size
 * a constant, not N) combined in block order by the caller. A NULL pool, n <= 1, a one-thread
 * pool, or a call made while the pool is busy (nested, from inside fn) runs serially on the
 * calling thread, with the same results and that thread's worker index. A pool serves one thread
 * at a time (plus nesting). */
void rt_parallel_for(RtPool *p, int64_t n, RtRangeFn fn, void *ctx);

/* ==== GEMM (blas.c) ========================================================================== */

/* Batched single-precision GEMM, row-major, on OpenBLAS's cblas_sgemm:
 *
 *     for b in [0, batch):  C_b = alpha * op(A_b) @ op(B_b) + beta * C_b
 *
 * with op(A_b) M x K (A_b is K x M, read transposed, when trans_a), op(B_b) K x N (B_b is N x K
 * when trans_b), C_b M x N; X_b = X + b * stride_x (a stride of 0 broadcasts one matrix over
 * the batch, except for C); lda/ldb/ldc are row pitches in elements. beta == 0 overwrites C
 * (NaNs in C do not propagate), as in BLAS. K == 0 gives C = beta * C.
 *
 * Threading: OpenBLAS runs single-threaded (rt_sgemm_batched sets openblas_set_num_threads(1)
 * before its first call) and all parallelism is the pool's. The batch and each C matrix are cut
 * into tiles whose size depends only on (M, N, K), never on the thread count; each tile is one
 * cblas_sgemm call by one thread, so results are bit-identical for any --threads and no more
 * threads than --threads ever run. The C batches must not overlap. Dimensions and pitches must fit
 * OpenBLAS's 32-bit integers.
 *
 * The epilogue (RtGemmEpilogue) is what the product does besides: RT_GEMM_PLAIN nothing (vec is
 * not read, may be NULL); RT_GEMM_BIAS adds vec[j] (n values of C's type) to column j of every
 * row of every C_b, in f32 before C is rounded to its type - a linear layer's bias, which the
 * compiler folds into the GEMM of `x @ w + b` (docs/architecture.md, fusion); RT_GEMM_BGRAD_B
 * (one matrix) also writes vec[j] = sum over k of op(B)[k, j], in f32 rounded to C's type - the
 * bias gradient beside a weight gradient x^T dy, whose B is dy; RT_GEMM_ADD (f32 only, beta 0)
 * adds vec, a matrix of C's layout (ldc, stride_c), to C: C = alpha op(A) op(B) + vec, vec
 * joining the sum unrounded (C starts as vec, then beta 1; vec may be C itself) - LoRA's scaled
 * up product added to its base layer's (compiler/fuse/fuse_lower.c, fl_gemm_add). An epilogue
 * needs k > 0. */
typedef enum RtGemmEpilogue { RT_GEMM_PLAIN = 0, RT_GEMM_BIAS = 1, RT_GEMM_BGRAD_B = 2, RT_GEMM_ADD = 3 } RtGemmEpilogue;
RtStatus rt_sgemm_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                          int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec, RtError *err);
/* Fused LoRA (compiler/kir/kir.h's KLora, docs/runtime.md "Fused LoRA"): LoRA's down and up
 * products in one call, f32. For each batch index t and row i < m,
 *   S[t*m + i, :] = x_t[i, :] @ op(A_t)          (k -> r; op(A_t) is A_t^T, A_t [r, k], when trans_a)
 *   C[t*m + i, :] = D[t*m + i, :] + alpha * S[t*m + i, :] @ op(B_t)   (r -> n; B_t [n, r] when trans_b)
 * with x_t = x + t*stride_x (row pitch ldx), A_t = a + t*stride_a (lda), B_t = b + t*stride_b
 * (ldb); S, D and C are contiguous [batch*m, r] / [batch*m, n]; s may be NULL (S not kept). The
 * rows go in tiles of 4096 / r (rounded down to 16: 64 rows at rank 64, 512 at rank 8; a function
 * of the shape alone, so bit-identical for any --threads), each tile's S (16 KiB) made and used
 * while it is in cache: two single-threaded cblas_sgemm calls a tile, the pool spreading the
 * tiles. 1 <= r <= 64. */
RtStatus rt_lora_f32(RtPool *pool, int64_t batch, int64_t m, int64_t k, int64_t r, int64_t n, int64_t ldx, int64_t stride_x,
                     int64_t lda, int64_t stride_a, int64_t ldb, int64_t stride_b, int32_t trans_a, int32_t trans_b, float alpha,
                     const float *x, const float *a, const float *b, const float *d, float *s, float *c, RtError *err);
/* The same with A, B and C in bf16 (their 16 bits, uint16_t): A and B are widened to f32
 * exactly, the product is rt_sgemm_batched's (f32 accumulation, the same tiles, so bit-identical
 * for any --threads), and C is rounded to bf16, to nearest even. */
RtStatus rt_bgemm_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                          int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                          uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec, RtError *err);
/* The same contract, with every row of C a function of its row of op(A) alone: the same bits
 * whatever the row's index, the row count or the other rows (OpenBLAS's sgemm rounds a row by its
 * index). The chunk phase's products (the KV cache: a token's logits must not depend on where it
 * sits in a call, nor on the batch) use these; slower than OpenBLAS on large products (blas.c). */
RtStatus rt_sgemm_rows_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                               float beta, float *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                               RtError *err);
RtStatus rt_bgemm_rows_batched(RtPool *pool, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b,
                               float beta, uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                               RtError *err);
const char *rt_blas_config(void); /* OpenBLAS's build and the core it chose ("OpenBLAS 0.3.21 ... Zen") */

/* ==== the GPU (gpu.c): what generated GPU code calls ========================================== */

/* A GPU opened for one run (rt_gpu.h has the rest of its interface): the CUDA driver API, cuBLASLt
 * and NCCL through dlopen, one context, one stream, the program's module loaded. Every call below
 * is queued on that stream in order (nothing waits for the GPU except rt_gpu_download). Device
 * addresses are passed as plain pointers; they are never dereferenced on the host. A failing call
 * fills err with the CUDA call that failed, its error name and what it was doing ("cuLaunchKernel
 * (step_k12_softmax, 96 blocks of 128 threads): CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"). */
typedef struct RtGpu RtGpu;

/* Launches kernel `kernel` of the program's table (RtGpuProgram.kernels) with its geometry; bufs
 * are its device buffers, RtGpuKernel.nbufs of them, in the kernel's parameter order. */
RtStatus rt_gpu_launch(RtGpu *g, int32_t kernel, void *const *bufs, RtError *err);
/* rt_sgemm_batched's contract on device memory (f32, row-major, strided batch), through cuBLASLt
 * with f32 compute (no TF32): same arguments but the GPU in place of the pool; RT_GEMM_BIAS is
 * cuBLASLt's bias epilogue, RT_GEMM_BGRAD_B its bias-gradient one (gpu_blas.c). */
RtStatus rt_gpu_sgemm_batched(RtGpu *g, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                              int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                              int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec, RtError *err);
/* rt_bgemm_batched's contract on device memory: bf16 A, B and C, f32 compute (cuBLASLt). */
RtStatus rt_gpu_bgemm_batched(RtGpu *g, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                              int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                              uint16_t *c, int64_t ldc, int64_t stride_c, int64_t batch, int32_t epilogue, void *vec,
                              RtError *err);
/* dst[i] += scale * src[i] for i < n, on the device (forward_backward's gradient accumulation). */
RtStatus rt_gpu_axpy(RtGpu *g, float *dst, const float *src, float scale, int64_t n, RtError *err);
/* For each entry e < count: dst += scale * src over n elements, as rt_gpu_axpy, in one launch;
 * table[3e], table[3e + 1] are dst's and src's device addresses, table[3e + 2] is n (host memory,
 * read before the call returns). forward_backward's gradient accumulation: every gradient of the
 * micro-batch added into the gradient region at once. The runtime keeps a device copy of each
 * distinct table it is given (they are few: one a gradient region). */
RtStatus rt_gpu_axpy_table(RtGpu *g, const int64_t *table, int64_t count, float scale, RtError *err);
/* Device to device copy of `bytes` (optimizer_update's new parameters and state). */
RtStatus rt_gpu_copy(RtGpu *g, void *dst, const void *src, int64_t bytes, RtError *err);
/* Host memory to the device, queued. From pageable memory it returns once `host` may be reused
 * (the driver has staged it); from page-locked memory (rt_gpu_host_alloc) the transfer reads
 * `host` when the stream reaches it, so `host` must not change before a later call that waits
 * (rt_gpu_sync, rt_gpu_download). */
RtStatus rt_gpu_upload(RtGpu *g, void *dev, const void *host, int64_t bytes, RtError *err);
/* The device to host memory; waits for everything queued before it and for the copy. */
RtStatus rt_gpu_download(RtGpu *g, void *host, const void *dev, int64_t bytes, RtError *err);
/* The f32 loss at `dev` for the host, without waiting: queued into page-locked memory, *dst is NaN
 * until the next wait (rt_gpu_sync, rt_gpu_download) sets it. The GPU's forward_backward and
 * forward_loss end with it, so they return with the whole step queued, and the runtime reads the
 * next micro-batch while the GPU runs this one (train.c). */
RtStatus rt_gpu_loss(RtGpu *g, double *dst, const float *dev, RtError *err);

/* ==== what the generated code provides ====================================================== */

/* The structs' fields are listed once, in rt_program_fields.h (with a comment each), and declared
 * here from those lists; the compiler's host code reads the same lists for its LLVM layouts. */
#include "rt_program_fields.h"

#define RT_DECLARE_FIELD(ctype, name, kind) ctype name;

typedef int64_t RtDims[RT_ST_MAX_RANK]; /* a parameter's shape: dims 0..rank-1, the rest 0 */

/* One parameter of the model, as the checkpoint names it; its initialiser's two numbers are
 * normal(mean a, std b), uniform(a, b) or constant(a). */
typedef struct RtParam {
    RT_PARAM_FIELDS(RT_DECLARE_FIELD)
} RtParam;

/* One stage of a batch-size ramp (`batch { ramp = [(step, global), ...] }`): from 0-based optimizer
 * step `step` on, a step takes `global` sequences, `accum` micro-batches of `micro` sequences per
 * data-parallel rank (global = micro x accum x data_ranks). */
typedef struct RtRampStage {
    RT_RAMP_FIELDS(RT_DECLARE_FIELD)
} RtRampStage;

/* A train block's settings, as the compiler resolved them; command-line flags override some
 * (--steps, --seed, --data).
 *
 * The batch. Optimizer step s takes the global batch of the stage in force at s: (global, accum)
 * below before ramp[0].step, then ramp[i] from ramp[i].step on. data_ranks > 1 is the program's
 * `parallel { data = N }`: N processes (a launcher's) run accum micro-batches each, or one
 * process alone runs all N ranks' in turn, accum x N a step; each is seeded with
 * loss_scale = 1 / (accum x N), and their gradients are summed by one tree over the global
 * batch's micro-batch indices (docs/parallel.md). */
typedef struct RtTrainSettings {
    RT_TRAIN_FIELDS(RT_DECLARE_FIELD)
} RtTrainSettings;

/* Defaults of `./prog generate` and `./prog serve` (from the serve block when there is one). */
typedef struct RtGenerateSettings {
    RT_GEN_FIELDS(RT_DECLARE_FIELD)
} RtGenerateSettings;

/* Everything one call of a generated function reads and writes. Fields not listed for a
 * function are unspecified during that call. */
typedef struct RtStep {
    RT_STEP_FIELDS(RT_DECLARE_FIELD)
} RtStep;

/* A generated function of the step (RtProgram's and RtGpuProgram's forward_backward ...), and
 * the learning-rate schedule's multiplier at 0-based step `step`. */
typedef RtStatus (*RtStepFn)(RtStep *s);
/* Called by forward_backward right after it has added a parameter's gradient into s->grads[lo,
 * hi) (the plan's PlanWrite.after: no later launch touches it; on the GPU, right after that add
 * is queued on the compute stream), so that the runtime can start reducing it across data ranks
 * while the backward goes on (docs/parallel.md, "The reduction overlapped with the backward").
 * Nothing when s->grad_hook is NULL. The hook is an
 * RtGradHook (defined by the runtime): fn(ctx, lo, hi) on the calling thread. */
typedef struct RtGradHook {
    void (*fn)(void *ctx, int64_t lo, int64_t hi);
    void *ctx;
} RtGradHook;
void rt_grad_ready(RtStep *s, int64_t lo, int64_t hi);
/* Called by the CPU's and the GPU's forward_backward (and forward_loss, forward_stats) around their
 * launches' reads of the parameter region, by the
 * plan's schedule (plan.h, PlanGather; docs/parallel.md, "ZeRO-3"): rt_param_need before the first
 * launch of a gather that reads params[lo, hi) (next_lo, next_hi: the schedule's next gather, to
 * start now; equal when none), rt_param_done after its last. Nothing when s->param_hook is NULL.
 * The hook is an RtParamHook: need must return with params[lo, hi) in place. */
typedef struct RtParamHook {
    void (*need)(void *ctx, int64_t lo, int64_t hi, int64_t next_lo, int64_t next_hi);
    void (*done)(void *ctx, int64_t lo, int64_t hi);
    void *ctx;
} RtParamHook;
void rt_param_need(RtStep *s, int64_t lo, int64_t hi, int64_t next_lo, int64_t next_hi);
void rt_param_done(RtStep *s, int64_t lo, int64_t hi);
typedef double (*RtLrScheduleFn)(int64_t step);

/* One image of the program's CUDA module, embedded by mbtc (--cuda-arch): the cubin for one
 * architecture, or the PTX of one virtual architecture, which the driver compiles for a GPU that
 * no cubin fits (rt_gpu.h: the JIT cache). */
typedef struct RtGpuImage {
    RT_GPU_IMAGE_FIELDS(RT_DECLARE_FIELD)
} RtGpuImage;

/* One kernel launch site's function and geometry (compiler/backend/cuda/cuda.h: CudaLaunch). The
 * generated GPU code names a kernel by its index in the table. */
typedef struct RtGpuKernel {
    RT_GPU_KERNEL_FIELDS(RT_DECLARE_FIELD)
} RtGpuKernel;

/* The program's GPU side: NULL in RtProgram when mbtc built it without CUDA (--cuda-arch=none,
 * or no NVRTC). The functions have the CPU functions' contracts with device regions (RtStep.gpu
 * set); a NULL one means the GPU cannot run that function. */
typedef struct RtGpuProgram {
    RT_GPU_PROG_FIELDS(RT_DECLARE_FIELD)
} RtGpuProgram;

/* The phases of a step, each one generated function; no two run at once, so they share the arena
 * (compiler/plan/plan.h: PlanPhase, in the same order). */
enum { RT_PHASE_STEP, RT_PHASE_UPDATE, RT_PHASE_LOGITS, RT_PHASE_CHUNK, RT_NPHASES };
typedef int64_t RtPhases[RT_NPHASES]; /* one number a phase */

/* The compiler's memory plan in numbers, which `./prog info` prints back in the words of
 * `mbtc --emit=plan`'s summary: per phase (forward_backward for one micro-batch, optimizer_update,
 * forward_logits), the arena bytes it uses and its launches per call. */
typedef struct RtPlanInfo {
    RT_PLAN_INFO_FIELDS(RT_DECLARE_FIELD)
} RtPlanInfo;

/* forward_chunk's geometry (rt_program_fields.h says what each field is). */
typedef struct RtKvInfo {
    RT_KV_INFO_FIELDS(RT_DECLARE_FIELD)
} RtKvInfo;

/* A compiled program: the descriptor plus its functions. The generated object exports one as
 * `const RtProgram mbt_program`; runtime/main.c passes it to rt_main. All pointers are to
 * constant data with static storage. The functions:
 *
 * forward_backward: one micro-batch. Reads params, x, y; computes this micro-batch's loss L as
 * the program defines it (cross_entropy: the mean over its B x T tokens) into loss, and ADDS
 * loss_scale x dL/dparams into grads. The runtime passes loss_scale = 1 / (accum x data_ranks)
 * of the step's ramp stage, so after the step's last micro-batch grads holds the gradient of
 * the mean loss over the global batch. Its launches that read nothing but the parameters (a bf16
 * program's weight casts: plan.h, PlanMemory.param_only) write buffers the plan keeps live over
 * the whole call, so they still hold their values at the next call: with casts_kept = 1 it skips
 * those launches. The runtime sets it only for the second and later micro-batches of one
 * optimizer step (nothing writes params or the arena between them). The parameter casts' region
 * (pcasts, pcast_bytes; a bf16 program: docs/memory.md, "The parameter casts' region") holds
 * parameter element i's bf16 copy at byte 2i: optimizer_update writes cast(p_new) there for the
 * elements it updates, and the step's casts of whole parameters write it and the step reads it;
 * with casts_kept = 2 (the first micro-batch of a step whose region is current: written by the
 * last forward_backward and, since, by nothing but a whole-region optimizer_update) it skips the
 * launches that write only into that region. Every other call has 0.
 * forward_loss: the same loss without gradients (evaluation). NULL: the program cannot evaluate.
 * forward_logits: generation, B = 1, T = logits_seq: writes the logits of position len - 1 (a
 * causal model ignores x[len, T)). NULL: the program cannot generate.
 * optimizer_init: sets the optimizer state's initial values (`state m = 0`); NULL: the runtime
 * zeroes it.
 * optimizer_update: one optimizer step over the elements [lo, hi) of the parameter region (hi =
 * 0, or 0 and param_floats: every parameter): reads grads (already clipped), updates params and state with lr
 * and t. The runtime zeroes grads afterwards. A range other than the whole region is ZeRO's
 * (parallel { zero }, docs/parallel.md): the state region then holds only the range, variable j's
 * element lo + k at state[j x (hi - lo) + k] (the whole region's layout when lo = 0, hi =
 * param_floats). Only the CPU's update takes a range other than the whole region; mbtc refuses
 * zero > 0 where the update is not elementwise (so that a range of it is the same arithmetic).
 * lr_schedule: the learning-rate multiplier at 0-based step `step` (lr.cosine(...) compiled).
 *
 * What a checkpoint records of the program, so that resuming checks it continues the same
 * computation: `hash` is "xxh3-128:" and 32 hex digits over the compiled step (every kernel, the
 * host functions, the learning-rate schedule) and the batch settings that shape a step (micro,
 * seq, global, accum, data ranks, ramp, clip, base lr, shuffle, vocab) - not the source's
 * comments or layout, nor `steps`, evaluation or checkpoint settings; nstate and state_names
 * name the optimizer state's variables. plan is the memory plan's summary (arena_bytes is the
 * largest of plan.arena). */
typedef struct RtProgram {
    RT_PROG_FIELDS(RT_DECLARE_FIELD)
} RtProgram;

#undef RT_DECLARE_FIELD

/* The descriptor of the program being run, defined by the generated object (or a hand-written
 * one, as in tests/runtime/bigram_program.c). */
extern const RtProgram mbt_program;

#endif
