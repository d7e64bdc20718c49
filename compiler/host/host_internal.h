/* host_internal.h - what the host code's files share (host.h is their interface to the rest of
 * the compiler). The files, in the order a program goes through them:
 *
 *   host.c        the driver (host_compile), the schedules and the emitters of the RtProgram
 *                 functions (forward_backward, forward_loss, forward_logits, optimizer_update,
 *                 optimizer_init), each written once against a HostTarget
 *   builders.c    the ABI's struct types in LLVM (checked against the C layout) and small builders
 *   target_cpu.c  the CPU target: the thread pool, rt_sgemm_batched, loops
 *   target_gpu.c  the GPU target (rt_gpu_*), and the GPU side: the CUDA program, its images and
 *                 kernel table, the GPU functions and the RtGpuProgram descriptor
 *   descriptor.c  the `mbt_program` descriptor and the program's hash
 *   link.c        the object file and the link with libmbtrt
 *
 * Not part of the compiler's public surface: only compiler/host includes it. */
#ifndef MBT_HOST_INTERNAL_H
#define MBT_HOST_INTERNAL_H

#include <llvm-c/Core.h>

#include "host.h"
#include "host_abi.h"
#include "plan.h"
#include "rt_program_fields.h"
#include "sema.h"

/* ---- the ABI structs' field indices, from their field lists (RT_STEP_gpu, RT_PROG_hash ...) ---- */

#define HOST_STEP_INDEX(ctype, f, kind) RT_STEP_##f,
#define HOST_PARAM_INDEX(ctype, f, kind) RT_PARAM_##f,
#define HOST_TRAIN_INDEX(ctype, f, kind) RT_TRAIN_##f,
#define HOST_RAMP_INDEX(ctype, f, kind) RT_RAMP_##f,
#define HOST_GEN_INDEX(ctype, f, kind) RT_GEN_##f,
#define HOST_PROG_INDEX(ctype, f, kind) RT_PROG_##f,
#define HOST_GPU_IMAGE_INDEX(ctype, f, kind) RT_GPU_IMAGE_##f,
#define HOST_GPU_KERNEL_INDEX(ctype, f, kind) RT_GPU_KERNEL_##f,
#define HOST_GPU_PROG_INDEX(ctype, f, kind) RT_GPU_PROG_##f,
#define HOST_PLAN_INFO_INDEX(ctype, f, kind) RT_PLAN_INFO_##f,
#define HOST_KV_INFO_INDEX(ctype, f, kind) RT_KV_INFO_##f,
enum { RT_STEP_FIELDS(HOST_STEP_INDEX) RT_STEP_NFIELDS };
enum { RT_PARAM_FIELDS(HOST_PARAM_INDEX) RT_PARAM_NFIELDS };
enum { RT_TRAIN_FIELDS(HOST_TRAIN_INDEX) RT_TRAIN_NFIELDS };
enum { RT_RAMP_FIELDS(HOST_RAMP_INDEX) RT_RAMP_NFIELDS };
enum { RT_GEN_FIELDS(HOST_GEN_INDEX) RT_GEN_NFIELDS };
enum { RT_PROG_FIELDS(HOST_PROG_INDEX) RT_PROG_NFIELDS };
enum { RT_GPU_IMAGE_FIELDS(HOST_GPU_IMAGE_INDEX) RT_GPU_IMAGE_NFIELDS };
enum { RT_GPU_KERNEL_FIELDS(HOST_GPU_KERNEL_INDEX) RT_GPU_KERNEL_NFIELDS };
enum { RT_GPU_PROG_FIELDS(HOST_GPU_PROG_INDEX) RT_GPU_PROG_NFIELDS };
enum { RT_PLAN_INFO_FIELDS(HOST_PLAN_INFO_INDEX) RT_PLAN_INFO_NFIELDS };
enum { RT_KV_INFO_FIELDS(HOST_KV_INFO_INDEX) RT_KV_INFO_NFIELDS };

/* ---- the emitter's state ------------------------------------------------------------------------ */

typedef struct HostTarget HostTarget;

typedef struct Host {
    Arena *ar;
    LLVMContextRef ctx;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMTypeRef i8, i32, i64, f32, f64, ptr, vd;
    LLVMTypeRef step_t, param_t, train_t, gen_t, prog_t, ramp_t, plan_t, kv_t;
    LLVMTypeRef range_fn_t, pfor_t, gemm_t;
    LLVMValueRef pfor, gemm, bgemm; /* rt_sgemm_batched, rt_bgemm_batched (one type: pointers are opaque) */
    const Plan *plan;
    LLVMValueRef kv_pool; /* while emit_chunk emits its launches: RtStep.kv_pool (else NULL) */
    /* while emit_chunk emits its launches: the rows the call uses (RtStep.len, within [1, rows]),
     * the compiled rows, and which nodes of the chunk graph depend on the tokens; a GEMM whose A
     * is [1.., rows, k] of the tokens computes the used rows only (emit_launches) */
    LLVMValueRef chunk_len;
    int64_t chunk_rows;
    const unsigned char *chunk_dep;
    const TrainConfig *ts;
    const ServeConfig *serve; /* the serve block whose settings the descriptor carries (TrainBuild.serve), or NULL */
    /* the target the emitters write for: the CPU, or the GPU while host_cuda emits the GPU
     * functions (launches and copies through the runtime's rt_gpu_* calls, every region address a
     * device address) */
    const HostTarget *target;
    LLVMTypeRef gpu_image_t, gpu_kernel_t, gpu_prog_t, gpu_launch_t, gpu_axpy_t, gpu_axpy_table_t, gpu_copy_t, gpu_loss_t;
    LLVMValueRef gpu_launch, gpu_gemm, gpu_bgemm, gpu_axpy, gpu_axpy_table, gpu_copy, gpu_upload, gpu_download, gpu_loss;
} Host;

/* one schedule's buffers: the arena offset of each buffer the arena holds (-1 otherwise) */
typedef struct Sched {
    const char *prefix;
    FuseResult *r;
    int gpu_base;              /* the index of its first kernel in the GPU kernel table */
    const PlanPhaseMem *mem;   /* the plan's slots and moves for it */
    LLVMValueRef *kfn, *kwrap; /* per kernel */
} Sched;

/* The RtProgram function being emitted: the function, its RtStep argument, the target's executor
 * (host_fn_begin loads it) and RtStep.err. */
typedef struct HostFn {
    LLVMValueRef fn, s, exec, err;
} HostFn;

/* ---- targets --------------------------------------------------------------------------------------
 * The operations the host functions emit that differ by target; the emitters (host.c) are written
 * once against them. Every call into the runtime that returns a status is checked: a failure
 * returns it from the function (the callee filled RtStep.err). Collectives (the data-parallel
 * gradient all-reduce) and offload copies will be further entries. */
struct HostTarget {
    const char *name;      /* "cpu", "gpu" */
    const char *fn_prefix; /* of its functions' LLVM names: "" or "gpu." */
    /* declares the runtime functions its operations call */
    void (*declare)(Host *h);
    /* the executor its launches go to: RtStep.pool on the CPU, RtStep.gpu on the GPU */
    LLVMValueRef (*executor)(Host *h, LLVMValueRef s);
    /* launches kernel `kernel` of S on its buffers' addresses, an array of pointers */
    void (*launch)(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef bufs);
    /* launches a ranged kernel (Kernel.ranged: the optimizer update) over work items [lo, hi) on its
     * buffers' addresses bufs[0 .. nbufs) (bufs has room for one more) */
    void (*launch_range)(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef *bufs, LLVMValueRef lo,
                         LLVMValueRef hi);
    /* the runtime's batched GEMM for matrices of dtype dt (f32 or bf16), rt_sgemm_batched's
     * arguments with the executor first */
    LLVMValueRef (*gemm)(Host *h, DType dt);
    /* dst += scale x src over n f32: the gradient accumulation into the gradient region */
    void (*accumulate)(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef scale, int64_t n);
    /* the same for count (dst[i], src[i], n[i]) at once; NULL: accumulate each (the GPU's is one
     * launch, rt_gpu_axpy_table) */
    void (*accumulate_all)(Host *h, const HostFn *f, const LLVMValueRef *dst, const LLVMValueRef *src, const int64_t *n,
                           int count, LLVMValueRef scale);
    /* dst = src over n f32; to_host: dst is host memory (the logits), else the target's */
    void (*copy)(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, int64_t n, int to_host);
    /* dst = src over count f32 (a run-time count; nothing when it is 0 or below), the target's memory */
    void (*copy_n)(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef count);
    /* the f32 loss at src into the double RtStep.loss at dst (the GPU queues it for the host) */
    void (*read_loss)(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src);
    /* where the host function writes n f32 values meant for the target's memory at dst (dst
     * itself on the CPU, a stack array on the GPU), and the upload that puts them there */
    LLVMValueRef (*staging)(Host *h, LLVMValueRef dst, int64_t n, const char *name);
    void (*upload)(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef staged, int64_t n);
};

extern const HostTarget host_target_cpu, host_target_gpu;
/* the chunk phase's GEMM (target_cpu.c): rt_sgemm_rows_batched / rt_bgemm_rows_batched */
LLVMValueRef host_rows_gemm(Host *h, DType dt);
/* kernel over work items [0, count) on the CPU, count a run-time value: called directly below
 * target_cpu.c's SMALL_GRID, else on the pool (the chunk phase's kernels over the rows a call uses) */
void host_cpu_launch_count(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef bufs, LLVMValueRef count);

/* ---- builders.c: the ABI's types and small builders ----------------------------------------------- */

void host_types(Host *h); /* the ABI structs and the CPU target's runtime calls */
LLVMValueRef ci64(Host *h, int64_t v);
LLVMValueRef ci32(Host *h, int64_t v);
LLVMValueRef step_field(Host *h, LLVMValueRef s, int field, LLVMTypeRef t, const char *name);
LLVMValueRef byte_gep(Host *h, LLVMValueRef base, int64_t off, const char *name);
LLVMValueRef str_const(Host *h, const char *s);
void emit_f32_loop(Host *h, LLVMValueRef fn, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef scale, int64_t n, int mode);
LLVMValueRef begin_fn(Host *h, const char *name, LLVMTypeRef ret);
HostFn host_fn_begin(Host *h, const char *name);
void emit_check(Host *h, LLVMValueRef fn, LLVMValueRef st);
/* NULL when the update schedule can run on a range of the parameter region (ZeRO), else why not */
const char *update_range_refusal(const Plan *plan, const FuseResult *r, const PlanPhaseMem *mem, Arena *ar);
LLVMValueRef ptr_array(Host *h, LLVMValueRef const *v, int n, const char *name);
/* the constant struct t of v[0..n), every field set (an emitter fills v by field index from
 * zeroed arrays: a field it forgot is an internal error, not a garbage pointer) */
LLVMValueRef named_struct(LLVMTypeRef t, LLVMValueRef *v, int n);
LLVMValueRef table_global(Host *h, LLVMTypeRef t, LLVMValueRef *rows, int64_t n, const char *name);

/* ---- host.c: the RtProgram functions, for either target (h->target) ------------------------------ */

LLVMValueRef emit_forward(Host *h, Sched *S, int grad);
LLVMValueRef emit_logits(Host *h, Sched *S, int node, int64_t vocab);
LLVMValueRef emit_stats(Host *h, Sched *S); /* forward_stats; NULL without global_mean */
LLVMValueRef emit_chunk(Host *h, Sched *S, int node, int64_t rows, int64_t vocab);
LLVMValueRef emit_update(Host *h, Sched *S);

/* ---- the other files ------------------------------------------------------------------------------ */

/* target_gpu.c: the CUDA side of an executable: the CUDA program of the schedules, compiled for the
 * archs by NVRTC (none for --emit=program: emit_only), and the GPU functions; the RtGpuProgram
 * global, or NULL when the executable is built without one: no archs (--cuda-arch=none), or no
 * NVRTC here (a warning). */
LLVMValueRef host_cuda(Host *h, Sched *const *S, const HostSchedules *hs, const HostCuda *cuda, int emit_only);

/* descriptor.c */
const char *program_hash(Host *h); /* RtProgram.hash of the module as it stands */
void emit_descriptor(Host *h, const char *source, LLVMValueRef fb, LLVMValueRef fl, LLVMValueRef flog, LLVMValueRef fst,
                     LLVMValueRef fchunk, LLVMValueRef oinit, LLVMValueRef oupd, LLVMValueRef lrs, const char *hash,
                     const GraphUpdate *u, LLVMValueRef gpu);

/* link.c: writes m (verified) as `output`.o, links it with libmbtrt into the executable `output`
 * and removes the object; failures are reported through diag. */
void host_link(LLVMModuleRef m, const CpuTarget *target, const char *output, Arena *ar);

#endif
