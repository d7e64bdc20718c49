/* host.c - the host code of an executable (host.h): one LLVM module with every kernel, the
 * RtProgram functions that launch them, and the `mbt_program` descriptor; then the object file
 * and the link with libmbtrt.
 *
 * Memory. Every buffer of a schedule (fuse.h) gets its address from the memory plan (plan.h): the
 * RtStep field of its home (params, grads, state, x, y, arena) plus the plan's offset. The moves
 * after the launches are the plan's too: forward_backward adds loss_scale x each gradient buffer
 * into the gradient region (the ABI's +=), optimizer_update copies the new parameters and state
 * into their regions, after filling the plan's lr and t slots.
 *
 * Generation. forward_logits runs a third schedule (plan.h, PLAN_LOGITS): the train block's
 * model(data.x) at batch 1, fused for the logits alone. The descriptor's arena_bytes is the plan's
 * largest peak; its RtPlanInfo carries the plan's summary for `./prog info`. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>

#include "autodiff.h"
#include "cuda_program.h"
#include "diag.h"
#include "fuse.h"
#include "graph.h"
#include "host.h"
#include "host_abi.h"
#include "nvrtc.h"
#include "plan.h"
#include "sema.h"
#include "sema_internal.h"

#ifndef MBT_RT_LIB
#define MBT_RT_LIB "build/libmbtrt.a"
#endif
#ifndef MBT_RT_LDLIBS
#define MBT_RT_LDLIBS "-lopenblas -lpthread -lm"
#endif

#define SMALL_GRID 256 /* work items below which a kernel is called directly, not through the pool */

typedef struct Host {
    Arena *ar;
    LLVMContextRef ctx;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMTypeRef i8, i32, i64, f32, f64, ptr, vd;
    LLVMTypeRef step_t, param_t, train_t, gen_t, prog_t, ramp_t, plan_t;
    LLVMTypeRef range_fn_t, pfor_t, gemm_t;
    LLVMValueRef pfor, gemm, bgemm; /* rt_sgemm_batched, rt_bgemm_batched (one type: pointers are opaque) */
    const Plan *plan;
    const TrainSettings *ts;
    /* emitting the GPU functions (host_gpu below): launches and copies go through the runtime's
     * rt_gpu_* calls, every region address is a device address */
    int gpu;
    LLVMTypeRef gpu_image_t, gpu_kernel_t, gpu_prog_t, gpu_launch_t, gpu_axpy_t, gpu_copy_t, gpu_loss_t;
    LLVMValueRef gpu_launch, gpu_gemm, gpu_bgemm, gpu_axpy, gpu_copy, gpu_upload, gpu_download, gpu_loss;
} Host;

/* one schedule: its launches and where the plan puts its buffers */
typedef struct Sched {
    const char *prefix;
    FuseResult *r;
    const PlanPhaseMem *mem; /* the plan's slots and moves for it */
    int gpu_base;      /* the index of its first kernel in the GPU kernel table */
    LLVMValueRef *kfn, *kwrap; /* per kernel */
} Sched;

/* ---- ABI struct types, checked against the C layout ----------------------------------------- */

static LLVMTypeRef host_struct(Host *h, HostAbiStruct which, const char *name, LLVMTypeRef *f, int n) {
    LLVMTypeRef t = LLVMStructCreateNamed(h->ctx, name);
    LLVMStructSetBody(t, f, (unsigned)n, 0);
    LLVMTargetDataRef td = LLVMGetModuleDataLayout(h->m);
    int nf = 0;
    int64_t size = 0;
    const int64_t *off = host_abi_layout(which, &nf, &size);
    if (nf != n) INTERNAL("host: %s has %d fields in C, %d in LLVM", host_abi_name(which), nf, n);
    for (int i = 0; i < n; i++)
        if ((int64_t)LLVMOffsetOfElement(td, t, (unsigned)i) != off[i])
            INTERNAL("host: %s field %d is at byte %" PRId64 " in C but %llu in LLVM", host_abi_name(which), i, off[i],
                     (unsigned long long)LLVMOffsetOfElement(td, t, (unsigned)i));
    if ((int64_t)LLVMABISizeOfType(td, t) != size)
        INTERNAL("host: %s is %" PRId64 " bytes in C, %llu in LLVM", host_abi_name(which), size,
                 (unsigned long long)LLVMABISizeOfType(td, t));
    return t;
}

static void host_types(Host *h) {
    h->i8 = LLVMInt8TypeInContext(h->ctx), h->i32 = LLVMInt32TypeInContext(h->ctx), h->i64 = LLVMInt64TypeInContext(h->ctx);
    h->f32 = LLVMFloatTypeInContext(h->ctx), h->f64 = LLVMDoubleTypeInContext(h->ctx);
    h->ptr = LLVMPointerTypeInContext(h->ctx, 0), h->vd = LLVMVoidTypeInContext(h->ctx);
    LLVMTypeRef P = h->ptr, I = h->i64, D = h->f64, W = h->i32;
    LLVMTypeRef step[] = {P, P, P, P, P, P, P, I, I, I, P, D, D, D, I, I, I, I, P, P};
    h->step_t = host_struct(h, HA_STEP, "RtStep", step, 20);
    LLVMTypeRef param[] = {P, W, LLVMArrayType2(I, (uint64_t)host_abi_max_rank()), I, I, W, D, D};
    h->param_t = host_struct(h, HA_PARAM, "RtParam", param, 8);
    LLVMTypeRef train[] = {P, I, I, I, I, I, I, D, I, I, D, P, P, W, I, I, I, I, P, I, P, I, W};
    h->train_t = host_struct(h, HA_TRAIN, "RtTrainSettings", train, 23);
    LLVMTypeRef ramp[] = {I, I, I};
    h->ramp_t = host_struct(h, HA_RAMP, "RtRampStage", ramp, 3);
    LLVMTypeRef gen[] = {P, D, I, I};
    h->gen_t = host_struct(h, HA_GENERATE, "RtGenerateSettings", gen, 4);
    LLVMTypeRef phases = LLVMArrayType2(I, (uint64_t)host_abi_phases());
    LLVMTypeRef plan[] = {phases, phases, phases, I};
    h->plan_t = host_struct(h, HA_PLAN_INFO, "RtPlanInfo", plan, 4);
    LLVMTypeRef prog[] = {W, P, h->train_t, h->gen_t, P, I, I, I, I, I, P, P, P, P, P, P, P, I, P, P, h->plan_t};
    h->prog_t = host_struct(h, HA_PROGRAM, "RtProgram", prog, 21);
    LLVMTypeRef rargs[] = {P, I, I, W};
    h->range_fn_t = LLVMFunctionType(h->vd, rargs, 4, 0);
    LLVMTypeRef pargs[] = {P, I, P, P};
    h->pfor_t = LLVMFunctionType(h->vd, pargs, 4, 0);
    h->pfor = LLVMAddFunction(h->m, "rt_parallel_for", h->pfor_t);
    LLVMTypeRef gargs[] = {P, W, W, I, I, I, h->f32, P, I, I, P, I, I, h->f32, P, I, I, I, W, P, P};
    h->gemm_t = LLVMFunctionType(W, gargs, 21, 0);
    h->gemm = LLVMAddFunction(h->m, "rt_sgemm_batched", h->gemm_t);
    h->bgemm = NULL; /* declared on first use: f32 programs never name it */
    LLVMTypeRef image[] = {P, W, P, I};
    h->gpu_image_t = host_struct(h, HA_GPU_IMAGE, "RtGpuImage", image, 4);
    LLVMTypeRef kern[] = {P, W, W, I, W};
    h->gpu_kernel_t = host_struct(h, HA_GPU_KERNEL, "RtGpuKernel", kern, 5);
    LLVMTypeRef gprog[] = {P, I, P, I, P, P, P, P, P};
    h->gpu_prog_t = host_struct(h, HA_GPU_PROGRAM, "RtGpuProgram", gprog, 9);
}

/* The runtime's rt_gpu_* calls (rt_program.h), declared when the GPU functions are emitted. */
static void host_gpu_calls(Host *h) {
    LLVMTypeRef P = h->ptr, I = h->i64, W = h->i32;
    LLVMTypeRef launch[] = {P, W, P, P};
    h->gpu_launch_t = LLVMFunctionType(W, launch, 4, 0);
    h->gpu_launch = LLVMAddFunction(h->m, "rt_gpu_launch", h->gpu_launch_t);
    h->gpu_gemm = LLVMAddFunction(h->m, "rt_gpu_sgemm_batched", h->gemm_t);
    h->gpu_bgemm = NULL;
    LLVMTypeRef axpy[] = {P, P, P, h->f32, I, P};
    h->gpu_axpy_t = LLVMFunctionType(W, axpy, 6, 0);
    h->gpu_axpy = LLVMAddFunction(h->m, "rt_gpu_axpy", h->gpu_axpy_t);
    LLVMTypeRef copy[] = {P, P, P, I, P}; /* (gpu, dst, src, bytes, err): copy, upload, download */
    h->gpu_copy_t = LLVMFunctionType(W, copy, 5, 0);
    h->gpu_copy = LLVMAddFunction(h->m, "rt_gpu_copy", h->gpu_copy_t);
    h->gpu_upload = LLVMAddFunction(h->m, "rt_gpu_upload", h->gpu_copy_t);
    h->gpu_download = LLVMAddFunction(h->m, "rt_gpu_download", h->gpu_copy_t);
    LLVMTypeRef loss[] = {P, P, P, P}; /* (gpu, double *dst, const float *dev, err) */
    h->gpu_loss_t = LLVMFunctionType(W, loss, 4, 0);
    h->gpu_loss = LLVMAddFunction(h->m, "rt_gpu_loss", h->gpu_loss_t);
}

/* ---- small builders --------------------------------------------------------------------------- */

static LLVMValueRef ci64(Host *h, int64_t v) { return LLVMConstInt(h->i64, (unsigned long long)v, 1); }
static LLVMValueRef ci32(Host *h, int64_t v) { return LLVMConstInt(h->i32, (unsigned long long)v, 1); }

static LLVMValueRef step_field(Host *h, LLVMValueRef s, int field, LLVMTypeRef t, const char *name) {
    LLVMValueRef p = LLVMBuildStructGEP2(h->b, h->step_t, s, (unsigned)field, "");
    return LLVMBuildLoad2(h->b, t, p, name);
}

static LLVMValueRef byte_gep(Host *h, LLVMValueRef base, int64_t off, const char *name) {
    if (!off) return base;
    LLVMValueRef idx = ci64(h, off);
    return LLVMBuildInBoundsGEP2(h->b, h->i8, base, &idx, 1, name);
}

static LLVMValueRef str_const(Host *h, const char *s) {
    if (!s) return LLVMConstPointerNull(h->ptr);
    return LLVMBuildGlobalStringPtr(h->b, s, ".str");
}

/* for (j = 0; j < n; j++) dst[j] = mode 0: src[j]; 1: dst[j] + scale * src[j]; 2: value (f32) */
static void emit_f32_loop(Host *h, LLVMValueRef fn, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef scale, int64_t n, int mode) {
    if (n <= 0) return;
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(h->b);
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(h->ctx, fn, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(h->ctx, fn, "done");
    LLVMBuildBr(h->b, body);
    LLVMPositionBuilderAtEnd(h->b, body);
    LLVMValueRef j = LLVMBuildPhi(h->b, h->i64, "j");
    LLVMValueRef pd = LLVMBuildInBoundsGEP2(h->b, h->f32, dst, &j, 1, "");
    LLVMValueRef v;
    if (mode == 2) v = scale;
    else {
        LLVMValueRef ps = LLVMBuildInBoundsGEP2(h->b, h->f32, src, &j, 1, "");
        v = LLVMBuildLoad2(h->b, h->f32, ps, "");
        if (mode == 1) v = LLVMBuildFAdd(h->b, LLVMBuildLoad2(h->b, h->f32, pd, ""), LLVMBuildFMul(h->b, scale, v, ""), "");
    }
    LLVMBuildStore(h->b, v, pd);
    LLVMValueRef next = LLVMBuildAdd(h->b, j, ci64(h, 1), "");
    LLVMValueRef in[2] = {ci64(h, 0), next};
    LLVMBasicBlockRef from[2] = {pre, body};
    LLVMAddIncoming(j, in, from, 2);
    LLVMBuildCondBr(h->b, LLVMBuildICmp(h->b, LLVMIntSLT, next, ci64(h, n), ""), body, done);
    LLVMPositionBuilderAtEnd(h->b, done);
}

/* A function `NAME(ptr s)` with an entry block, the builder at its end; comments for --emit=llvm. */
static LLVMValueRef begin_fn(Host *h, const char *name, LLVMTypeRef ret) {
    LLVMTypeRef args[1] = {h->ptr};
    if (h->gpu) name = arena_printf(h->ar, "gpu.%s", name);
    LLVMValueRef fn = LLVMAddFunction(h->m, name, LLVMFunctionType(ret, args, 1, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, fn, "entry"));
    return fn;
}

/* ---- schedules ---------------------------------------------------------------------------------- */

static void sched_kernels(Host *h, Sched *S, int disjoint) {
    FuseResult *r = S->r;
    S->kfn = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(r->nkernels + 1));
    S->kwrap = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(r->nkernels + 1));
    for (int k = 0; k < r->nkernels; k++) {
        Kernel *kn = r->kernels[k]; /* named with its schedule's prefix (plan_schedules) */
        S->kfn[k] = cpu_lower_kernel(h->m, kn, disjoint);
        LLVMSetLinkage(S->kfn[k], LLVMInternalLinkage);
        LLVMValueRef w = LLVMAddFunction(h->m, arena_printf(h->ar, "%s.range", kn->name), h->range_fn_t);
        LLVMSetLinkage(w, LLVMInternalLinkage);
        LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, w, "entry"));
        LLVMValueRef a[3] = {LLVMGetParam(w, 0), LLVMGetParam(w, 1), LLVMGetParam(w, 2)};
        LLVMBuildCall2(h->b, LLVMGlobalGetValueType(S->kfn[k]), S->kfn[k], a, 3, "");
        LLVMBuildRetVoid(h->b);
        S->kwrap[k] = w;
    }
}

/* The executor a function's launches go to: RtStep.pool on the CPU, RtStep.gpu on the GPU. */
static LLVMValueRef step_exec(Host *h, LLVMValueRef s) {
    return h->gpu ? step_field(h, s, 19, h->ptr, "gpu") : step_field(h, s, 0, h->ptr, "pool");
}

/* Returns the status st from fn when it is not RT_OK (the callee filled RtStep.err). */
static void emit_check(Host *h, LLVMValueRef fn, LLVMValueRef st) {
    LLVMBasicBlockRef fail = LLVMAppendBasicBlockInContext(h->ctx, fn, "failed");
    LLVMBasicBlockRef ok = LLVMAppendBasicBlockInContext(h->ctx, fn, "ok");
    LLVMBuildCondBr(h->b, LLVMBuildICmp(h->b, LLVMIntNE, st, ci32(h, 0), ""), fail, ok);
    LLVMPositionBuilderAtEnd(h->b, fail);
    LLVMBuildRet(h->b, st);
    LLVMPositionBuilderAtEnd(h->b, ok);
}

/* An array of n pointers on the stack holding v[0..n), for a callee that takes them as one. */
static LLVMValueRef ptr_array(Host *h, LLVMValueRef const *v, int n, const char *name) {
    LLVMTypeRef arr_t = LLVMArrayType2(h->ptr, (uint64_t)(n ? n : 1));
    LLVMValueRef arr = LLVMBuildAlloca(h->b, arr_t, name);
    for (int i = 0; i < n; i++) {
        LLVMValueRef idx[2] = {ci64(h, 0), ci64(h, i)};
        LLVMBuildStore(h->b, v[i], LLVMBuildInBoundsGEP2(h->b, arr_t, arr, idx, 2, ""));
    }
    return arr;
}

/* The runtime's GEMM for matrices of dtype dt on the CPU or (h->gpu) the GPU: f32 or bf16. */
static LLVMValueRef host_gemm_fn(Host *h, DType dt) {
    if (dt == DT_F32) return h->gpu ? h->gpu_gemm : h->gemm;
    LLVMValueRef *fn = h->gpu ? &h->gpu_bgemm : &h->bgemm;
    if (!*fn) *fn = LLVMAddFunction(h->m, h->gpu ? "rt_gpu_bgemm_batched" : "rt_bgemm_batched", h->gemm_t);
    return *fn;
}

/* Launches [0, upto] of S in fn; addr[i] is buffer i's address, exec the pool (CPU) or the GPU. A
 * GEMM's status (and on the GPU a launch's) is checked inline: a failure returns it. */
static void emit_launches(Host *h, LLVMValueRef fn, Sched *S, LLVMValueRef *addr, LLVMValueRef exec, LLVMValueRef err, int upto) {
    FuseResult *r = S->r;
    for (int li = 0; li <= upto && li < r->nlaunches; li++) {
        const FuseLaunch *L = &r->launches[li];
        if (L->kind == FL_GEMM) {
            const FuseGemm *g = &L->gemm;
            if (g->dt != DT_F32 && g->dt != DT_BF16) INTERNAL("host: a GEMM of %s", dtype_name(g->dt));
            LLVMValueRef callee = host_gemm_fn(h, g->dt);
            int vec = g->epilogue != FE_NONE;
            LLVMValueRef a[21] = {exec, ci32(h, g->trans_a), ci32(h, g->trans_b), ci64(h, g->m), ci64(h, g->n), ci64(h, g->k),
                                  LLVMConstReal(h->f32, g->alpha), addr[g->a], ci64(h, g->lda), ci64(h, g->stride_a),
                                  addr[g->b], ci64(h, g->ldb), ci64(h, g->stride_b), LLVMConstReal(h->f32, g->beta),
                                  addr[g->c], ci64(h, g->ldc), ci64(h, g->stride_c), ci64(h, g->batch),
                                  ci32(h, host_abi_gemm_epilogue(g->epilogue)), vec ? addr[g->bias] : LLVMConstPointerNull(h->ptr),
                                  err};
            /* named after the launch, so --emit=program can annotate it (print_program) */
            LLVMValueRef st = LLVMBuildCall2(h->b, h->gemm_t, callee, a, 21,
                                             arena_printf(h->ar, "%sgemm%d.", S->prefix, li));
            emit_check(h, fn, st);
            continue;
        }
        const Kernel *k = r->kernels[L->kernel];
        LLVMValueRef *bufs = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
        for (int i = 0; i < k->nbufs; i++) bufs[i] = addr[k->bufs[i].buffer];
        LLVMValueRef arr = ptr_array(h, bufs, k->nbufs, "bufs");
        if (h->gpu) {
            LLVMValueRef a[4] = {exec, ci32(h, S->gpu_base + L->kernel), arr, err};
            emit_check(h, fn, LLVMBuildCall2(h->b, h->gpu_launch_t, h->gpu_launch, a, 4, arena_printf(h->ar, "%s.", k->name)));
        } else if (k->grid < SMALL_GRID) {
            LLVMValueRef a[3] = {arr, ci64(h, 0), ci64(h, k->grid)};
            LLVMBuildCall2(h->b, LLVMGlobalGetValueType(S->kfn[L->kernel]), S->kfn[L->kernel], a, 3, "");
        } else {
            LLVMValueRef a[4] = {exec, ci64(h, k->grid), S->kwrap[L->kernel], arr};
            LLVMBuildCall2(h->b, h->pfor_t, h->pfor, a, 4, "");
        }
    }
}

/* Data movement around the launches, n f32 elements. On the CPU loops (emit_f32_loop); on the GPU
 * the runtime's calls, each status checked. */
static void emit_accumulate(Host *h, LLVMValueRef fn, LLVMValueRef exec, LLVMValueRef err, LLVMValueRef dst, LLVMValueRef src,
                            LLVMValueRef scale, int64_t n) { /* dst += scale x src (device: rt_gpu_axpy) */
    if (!h->gpu) {
        emit_f32_loop(h, fn, dst, src, scale, n, 1);
        return;
    }
    LLVMValueRef a[6] = {exec, dst, src, scale, ci64(h, n), err};
    emit_check(h, fn, LLVMBuildCall2(h->b, h->gpu_axpy_t, h->gpu_axpy, a, 6, ""));
}

/* dst = src; `to_host`: dst is host memory (rt_gpu_download on the GPU), else the region's kind (rt_gpu_copy). */
static void emit_copy(Host *h, LLVMValueRef fn, LLVMValueRef exec, LLVMValueRef err, LLVMValueRef dst, LLVMValueRef src, int64_t n,
                      int to_host) {
    if (!h->gpu) {
        emit_f32_loop(h, fn, dst, src, NULL, n, 0);
        return;
    }
    LLVMValueRef a[5] = {exec, dst, src, ci64(h, n * 4), err};
    emit_check(h, fn, LLVMBuildCall2(h->b, h->gpu_copy_t, to_host ? h->gpu_download : h->gpu_copy, a, 5, ""));
}

/* The address of every buffer of S in the current function: the RtStep field of its plan home
 * plus its offset (null for a buffer no launch touches). */
static LLVMValueRef *sched_addrs(Host *h, const Sched *S, LLVMValueRef s) {
    const PlanPhaseMem *pm = S->mem;
    LLVMValueRef base[PH_ARENA + 1] = {NULL};
    base[PH_PARAMS] = step_field(h, s, 1, h->ptr, "params"), base[PH_GRADS] = step_field(h, s, 2, h->ptr, "grads");
    base[PH_STATE] = step_field(h, s, 3, h->ptr, "state"), base[PH_ARENA] = step_field(h, s, 4, h->ptr, "arena");
    base[PH_X] = step_field(h, s, 5, h->ptr, "x"), base[PH_Y] = step_field(h, s, 6, h->ptr, "y");
    LLVMValueRef *addr = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(S->r->nbuffers + 1));
    for (int i = 0; i < S->r->nbuffers; i++) {
        const PlanSlot *sl = &pm->slots[i];
        addr[i] = sl->home == PH_NONE ? LLVMConstPointerNull(h->ptr) : byte_gep(h, base[sl->home], sl->offset, "");
    }
    return addr;
}

static LLVMValueRef emit_forward(Host *h, Sched *S, int grad) {
    const FuseResult *r = S->r;
    const Graph *g = r->g;
    LLVMValueRef fn = begin_fn(h, grad ? "forward_backward" : "forward_loss", h->i32);
    LLVMValueRef s = LLVMGetParam(fn, 0);
    LLVMValueRef exec = step_exec(h, s), err = step_field(h, s, 18, h->ptr, "err");
    LLVMValueRef *addr = sched_addrs(h, S, s);
    int lb = g->loss >= 0 ? r->node_buffer[g->loss] : -1;
    if (lb < 0) INTERNAL("host: the loss has no buffer");
    emit_launches(h, fn, S, addr, exec, err, grad ? r->nlaunches - 1 : r->buffers[lb].first);
    LLVMValueRef loss_field = LLVMBuildStructGEP2(h->b, h->step_t, s, 12, "");
    if (h->gpu) { /* queued for the host, which has it after its next wait: nothing here waits */
        LLVMValueRef a[4] = {exec, loss_field, addr[lb], err};
        emit_check(h, fn, LLVMBuildCall2(h->b, h->gpu_loss_t, h->gpu_loss, a, 4, ""));
    } else {
        LLVMBuildStore(h->b, LLVMBuildFPExt(h->b, LLVMBuildLoad2(h->b, h->f32, addr[lb], "loss"), h->f64, ""), loss_field);
    }
    if (grad) {
        LLVMValueRef grads = step_field(h, s, 2, h->ptr, "grads");
        LLVMValueRef ls = LLVMBuildFPTrunc(h->b, step_field(h, s, 11, h->f64, "loss_scale"), h->f32, "");
        for (int i = 0; i < S->mem->nwrites; i++) {
            const PlanWrite *w = &S->mem->writes[i];
            if (!w->accumulate || w->to != PH_GRADS) INTERNAL("host: the step's move '%s' is not a gradient's", w->what);
            emit_accumulate(h, fn, exec, err, byte_gep(h, grads, w->offset, ""), addr[w->buffer], ls, w->bytes / 4);
        }
    }
    LLVMBuildRet(h->b, ci32(h, 0));
    return fn;
}

/* ---- forward_logits: generation's forward ----------------------------------------------------
 * The runtime calls forward_logits with x = [1, T] (the context x[0, len), zeros after it); it runs
 * every launch of the logits schedule (plan.h, PLAN_LOGITS) and copies row len - 1 of the logits
 * into s->logits. */

/* forward_logits(s): the logits schedule on s->x, then s->logits[0, V) = logits[len - 1, 0, V). */
static LLVMValueRef emit_logits(Host *h, Sched *S, int node, int64_t vocab) {
    FuseResult *r = S->r;
    LLVMValueRef fn = begin_fn(h, "forward_logits", h->i32);
    LLVMValueRef s = LLVMGetParam(fn, 0);
    LLVMValueRef exec = step_exec(h, s), err = step_field(h, s, 18, h->ptr, "err");
    LLVMValueRef *addr = sched_addrs(h, S, s);
    int lb = r->node_buffer[node];
    if (lb < 0) INTERNAL("host: the logits %%%d have no buffer", node);
    emit_launches(h, fn, S, addr, exec, err, r->nlaunches - 1);
    LLVMValueRef len = step_field(h, s, 9, h->i64, "len");
    LLVMValueRef first = LLVMBuildMul(h->b, LLVMBuildSub(h->b, len, ci64(h, 1), ""), ci64(h, vocab), "last_row");
    LLVMValueRef src = LLVMBuildInBoundsGEP2(h->b, h->f32, addr[lb], &first, 1, "last_logits");
    emit_copy(h, fn, exec, err, step_field(h, s, 10, h->ptr, "logits"), src, vocab, 1);
    LLVMBuildRet(h->b, ci32(h, 0));
    return fn;
}

static LLVMValueRef emit_update(Host *h, Sched *S) {
    const PlanMemory *m = &h->plan->mem;
    LLVMValueRef fn = begin_fn(h, "optimizer_update", h->i32);
    LLVMValueRef s = LLVMGetParam(fn, 0);
    LLVMValueRef exec = step_exec(h, s), err = step_field(h, s, 18, h->ptr, "err");
    LLVMValueRef arena = step_field(h, s, 4, h->ptr, "arena");
    /* lr and t as f32 in the plan's arena slots (on the GPU written on the host, then uploaded) */
    if (m->t_offset != m->lr_offset + 4) INTERNAL("host: the plan's lr and t slots are not adjacent");
    LLVMValueRef slots = byte_gep(h, arena, m->lr_offset, "lr_slot");
    LLVMValueRef host_slots = h->gpu ? LLVMBuildAlloca(h->b, LLVMArrayType2(h->f32, 2), "lr_t_host") : slots;
    LLVMBuildStore(h->b, LLVMBuildFPTrunc(h->b, step_field(h, s, 13, h->f64, "lr"), h->f32, ""), host_slots);
    LLVMBuildStore(h->b, LLVMBuildSIToFP(h->b, step_field(h, s, 14, h->i64, "t"), h->f32, ""), byte_gep(h, host_slots, 4, ""));
    if (h->gpu) {
        LLVMValueRef a[5] = {exec, slots, host_slots, ci64(h, 8), err};
        emit_check(h, fn, LLVMBuildCall2(h->b, h->gpu_copy_t, h->gpu_upload, a, 5, ""));
    }
    LLVMValueRef *addr = sched_addrs(h, S, s);
    emit_launches(h, fn, S, addr, exec, err, S->r->nlaunches - 1);
    LLVMValueRef region[PH_ARENA + 1] = {NULL};
    region[PH_PARAMS] = step_field(h, s, 1, h->ptr, "params"), region[PH_STATE] = step_field(h, s, 3, h->ptr, "state");
    for (int i = 0; i < S->mem->nwrites; i++) {
        const PlanWrite *w = &S->mem->writes[i];
        if (w->accumulate || !region[w->to]) INTERNAL("host: the update's move '%s'", w->what);
        emit_copy(h, fn, exec, err, byte_gep(h, region[w->to], w->offset, ""), addr[w->buffer], w->bytes / 4, 0);
    }
    LLVMBuildRet(h->b, ci32(h, 0));
    return fn;
}

/* optimizer_init: each state variable's initial value over every segment (padding stays 0);
 * NULL when every one starts at 0 (the runtime zeroes the region). */
static LLVMValueRef emit_optimizer_init(Host *h, const GraphUpdate *u) {
    int any = 0;
    for (int j = 0; j < u->nstate; j++) any |= u->state_init[j] != 0;
    if (!any) return NULL;
    LLVMValueRef fn = begin_fn(h, "optimizer_init", h->i32);
    LLVMValueRef state = step_field(h, LLVMGetParam(fn, 0), 3, h->ptr, "state");
    for (int j = 0; j < u->nstate; j++)
        for (int i = 0; i < u->nsegs && u->state_init[j] != 0; i++)
            emit_f32_loop(h, fn, byte_gep(h, state, (j * u->n + u->seg_off[i]) * 4, ""), NULL,
                          LLVMConstReal(h->f32, u->state_init[j]), u->seg_len[i], 2);
    LLVMBuildRet(h->b, ci32(h, 0));
    return fn;
}

/* ---- lr_schedule: the train block's `lr` function compiled from its AST ---------------------
 * Every number is a double (ints included: a schedule's steps are far below 2^53), comparisons
 * and and/or are i1; names are the parameters (`step` an int64 converted, the rest bound by the
 * train block) and locals assigned in the body, each an alloca; builtins: float, int (truncation),
 * min, max, abs, cos, sin, exp, log, sqrt, and `pi`. */
typedef struct LrCtx {
    Host *h;
    LLVMValueRef fn;
    int n;
    Str names[64];
    LLVMValueRef slots[64];
    int bad;
} LrCtx;

static LLVMValueRef lr_slot(LrCtx *c, Str name, int create) {
    for (int i = 0; i < c->n; i++)
        if (c->names[i].len == name.len && memcmp(c->names[i].p, name.p, name.len) == 0) return c->slots[i];
    if (!create || c->n == 64) return NULL;
    LLVMBuilderRef b = c->h->b;
    LLVMBasicBlockRef cur = LLVMGetInsertBlock(b), entry = LLVMGetEntryBasicBlock(c->fn);
    LLVMValueRef first = LLVMGetFirstInstruction(entry);
    if (first) LLVMPositionBuilderBefore(b, first);
    else LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef s = LLVMBuildAlloca(b, c->h->f64, "");
    LLVMPositionBuilderAtEnd(b, cur);
    c->names[c->n] = name, c->slots[c->n++] = s;
    return s;
}

static LLVMValueRef lr_intrinsic(LrCtx *c, const char *name, LLVMValueRef *a, int n) {
    Host *h = c->h;
    LLVMTypeRef ts[1] = {h->f64};
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(h->m, id, ts, 1);
    return LLVMBuildCall2(h->b, LLVMIntrinsicGetType(h->ctx, id, ts, 1), f, a, (unsigned)n, "");
}

static LLVMValueRef lr_as_double(LrCtx *c, LLVMValueRef v) {
    if (LLVMTypeOf(v) == c->h->f64) return v;
    return LLVMBuildUIToFP(c->h->b, v, c->h->f64, "");
}

static LLVMValueRef lr_expr(LrCtx *c, const Node *e) {
    Host *h = c->h;
    LLVMBuilderRef b = h->b;
    if (!e) { c->bad = 1; return LLVMConstReal(h->f64, 0); }
    switch (e->kind) {
    case N_INT: return LLVMConstReal(h->f64, (double)e->ival);
    case N_FLOAT: return LLVMConstReal(h->f64, e->fval);
    case N_BOOL: return LLVMConstInt(LLVMInt1TypeInContext(h->ctx), (unsigned long long)e->ival, 0);
    case N_NAME: {
        LLVMValueRef s = lr_slot(c, e->name, 0);
        if (s) return LLVMBuildLoad2(b, h->f64, s, "");
        if (e->name.len == 2 && memcmp(e->name.p, "pi", 2) == 0) return LLVMConstReal(h->f64, 3.14159265358979323846);
        break;
    }
    case N_UNARY: {
        LLVMValueRef a = lr_expr(c, e->a);
        if (e->op == OP_NEG) return LLVMBuildFNeg(b, lr_as_double(c, a), "");
        if (e->op == OP_POS) return a;
        if (e->op == OP_NOT) return LLVMBuildNot(b, a, "");
        break;
    }
    case N_BINARY: {
        LLVMValueRef x = lr_expr(c, e->a), y = lr_expr(c, e->b);
        if (e->op == OP_AND) return LLVMBuildAnd(b, x, y, "");
        if (e->op == OP_OR) return LLVMBuildOr(b, x, y, "");
        x = lr_as_double(c, x), y = lr_as_double(c, y);
        switch (e->op) {
        case OP_ADD: return LLVMBuildFAdd(b, x, y, "");
        case OP_SUB: return LLVMBuildFSub(b, x, y, "");
        case OP_MUL: return LLVMBuildFMul(b, x, y, "");
        case OP_DIV: return LLVMBuildFDiv(b, x, y, "");
        case OP_MOD: return LLVMBuildFRem(b, x, y, "");
        case OP_POW: { LLVMValueRef a[2] = {x, y}; return lr_intrinsic(c, "llvm.pow", a, 2); }
        case OP_EQ: return LLVMBuildFCmp(b, LLVMRealOEQ, x, y, "");
        case OP_NE: return LLVMBuildFCmp(b, LLVMRealUNE, x, y, "");
        case OP_LT: return LLVMBuildFCmp(b, LLVMRealOLT, x, y, "");
        case OP_LE: return LLVMBuildFCmp(b, LLVMRealOLE, x, y, "");
        case OP_GT: return LLVMBuildFCmp(b, LLVMRealOGT, x, y, "");
        case OP_GE: return LLVMBuildFCmp(b, LLVMRealOGE, x, y, "");
        default: break;
        }
        break;
    }
    case N_CALL: {
        if (!e->a || e->a->kind != N_NAME || e->list.n < 1 || e->list.n > 2) break;
        Str f = e->a->name;
        LLVMValueRef a[2];
        for (int i = 0; i < e->list.n; i++) a[i] = lr_as_double(c, lr_expr(c, e->list.v[i]));
        static const char *const unary[][2] = {{"cos", "llvm.cos"}, {"sin", "llvm.sin"}, {"exp", "llvm.exp"},
                                               {"log", "llvm.log"}, {"sqrt", "llvm.sqrt"}, {"abs", "llvm.fabs"},
                                               {"min", "llvm.minimum"}, {"max", "llvm.maximum"}};
        if (f.len == 5 && memcmp(f.p, "float", 5) == 0 && e->list.n == 1) return a[0];
        if (f.len == 3 && memcmp(f.p, "int", 3) == 0 && e->list.n == 1) {
            LLVMValueRef t[1] = {a[0]};
            return lr_intrinsic(c, "llvm.trunc", t, 1);
        }
        for (size_t i = 0; i < sizeof unary / sizeof *unary; i++)
            if (strlen(unary[i][0]) == f.len && memcmp(f.p, unary[i][0], f.len) == 0 &&
                (e->list.n == 2) == (i >= 6))
                return lr_intrinsic(c, unary[i][1], a, e->list.n);
        break;
    }
    default: break;
    }
    diag_error(e->span, "the learning-rate schedule uses '%s', which host code does not compile yet", ast_kind_name(e->kind));
    c->bad = 1;
    return LLVMConstReal(h->f64, 0);
}

static void lr_stmts(LrCtx *c, const NodeList *l) {
    Host *h = c->h;
    for (int i = 0; i < l->n && !c->bad; i++) {
        const Node *s = l->v[i];
        if (LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(h->b))) /* after a return: unreachable code */
            LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, c->fn, "dead"));
        if (s->kind == N_RETURN) LLVMBuildRet(h->b, lr_as_double(c, lr_expr(c, s->a)));
        else if (s->kind == N_ASSIGN && s->list.n == 1 && s->list.v[0]->kind == N_NAME) {
            LLVMValueRef v = lr_as_double(c, lr_expr(c, s->a));
            LLVMBuildStore(h->b, v, lr_slot(c, s->list.v[0]->name, 1));
        } else if (s->kind == N_IF) {
            LLVMValueRef cond = lr_expr(c, s->a);
            if (LLVMTypeOf(cond) == h->f64) cond = LLVMBuildFCmp(h->b, LLVMRealUNE, cond, LLVMConstReal(h->f64, 0), "");
            LLVMBasicBlockRef th = LLVMAppendBasicBlockInContext(h->ctx, c->fn, "then");
            LLVMBasicBlockRef el = LLVMAppendBasicBlockInContext(h->ctx, c->fn, "else");
            LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(h->ctx, c->fn, "endif");
            LLVMBuildCondBr(h->b, cond, th, el);
            LLVMPositionBuilderAtEnd(h->b, th);
            lr_stmts(c, &s->list);
            if (!LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(h->b))) LLVMBuildBr(h->b, join);
            LLVMPositionBuilderAtEnd(h->b, el);
            lr_stmts(c, &s->list2);
            if (!LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(h->b))) LLVMBuildBr(h->b, join);
            LLVMPositionBuilderAtEnd(h->b, join);
        } else if (s->kind != N_EXPR_STMT) {
            diag_error(s->span, "the learning-rate schedule uses a '%s' statement, which host code does not compile yet",
                       ast_kind_name(s->kind));
            c->bad = 1;
        }
    }
}

static LLVMValueRef emit_lr_schedule(Host *h) {
    LLVMTypeRef args[1] = {h->i64};
    LLVMValueRef fn = LLVMAddFunction(h->m, "lr_schedule", LLVMFunctionType(h->f64, args, 1, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, fn, "entry"));
    const TrainSettings *ts = h->ts;
    const Node *f = ts->lr_fn ? ts->lr_fn->node : NULL;
    if (!f) {
        LLVMBuildRet(h->b, LLVMConstReal(h->f64, 1.0));
        return fn;
    }
    LrCtx c = {.h = h, .fn = fn};
    for (int i = 0; i < f->list.n; i++) {
        const Node *p = f->list.v[i];
        LLVMValueRef v;
        double num = 0;
        if (i == 0) v = LLVMBuildSIToFP(h->b, LLVMGetParam(fn, 0), h->f64, "step");
        else if (i - 1 < ts->lr_nargs && ts->lr_args[i - 1] && value_number(ts->lr_args[i - 1], &num))
            v = LLVMConstReal(h->f64, num);
        else if (p->a) v = lr_as_double(&c, lr_expr(&c, p->a));
        else {
            diag_error(p->span, "the schedule's parameter '%.*s' has no number bound", STR_ARG(p->name));
            return fn;
        }
        LLVMBuildStore(h->b, v, lr_slot(&c, p->name, 1));
    }
    lr_stmts(&c, &f->list2);
    if (!LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(h->b))) LLVMBuildRet(h->b, LLVMConstReal(h->f64, 1.0));
    return fn;
}

/* ---- the descriptor ----------------------------------------------------------------------------- */

static LLVMValueRef named_struct(LLVMTypeRef t, LLVMValueRef *v, int n) { return LLVMConstNamedStruct(t, v, (unsigned)n); }

/* The batch-size ramp: the plan's step programs after the first, one RtRampStage each (the
 * step it starts at, its global batch and accumulation), or a null pointer without a ramp. The
 * micro-batch and the data ranks are the same in every program, so one forward_backward serves
 * them all; only the runtime's loop count and loss_scale change. A stage the block's `steps`
 * never reaches is kept: `--steps` may run past it. */
static LLVMValueRef emit_ramp_table(Host *h) {
    const Plan *p = h->plan;
    int n = p->nprograms - 1;
    if (n < 1) return LLVMConstPointerNull(h->ptr);
    LLVMValueRef *rows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)n);
    for (int i = 0; i < n; i++) {
        const PlanProgram *pg = &p->programs[i + 1];
        if (pg->micro != p->programs[0].micro || pg->data != p->programs[0].data || pg->first_step <= 0 ||
            pg->first_step <= p->programs[i].first_step || pg->global != pg->micro * pg->accumulation * pg->data)
            INTERNAL("host: step program %d (from step %" PRId64 ", global %" PRId64 " = %" PRId64 " x %" PRId64
                     " x %" PRId64 ") does not extend the batch schedule",
                     i + 2, pg->first_step, pg->global, pg->micro, pg->accumulation, pg->data);
        LLVMValueRef f[3] = {ci64(h, pg->first_step), ci64(h, pg->global), ci64(h, pg->accumulation)};
        rows[i] = named_struct(h->ramp_t, f, 3);
    }
    LLVMValueRef table = LLVMAddGlobal(h->m, LLVMArrayType2(h->ramp_t, (uint64_t)n), "mbt.ramp");
    LLVMSetInitializer(table, LLVMConstArray2(h->ramp_t, rows, (uint64_t)n));
    LLVMSetGlobalConstant(table, 1);
    LLVMSetLinkage(table, LLVMPrivateLinkage);
    return table;
}

/* The program's hash (RtProgram.hash): the LLVM module as it stands before the descriptor (every
 * kernel and host function, without the source file's name) followed by the batch settings the
 * runtime applies around them. Two compilations of one program hash alike wherever its file lies
 * and however its comments change; a change to the step's computation changes the hash. */
static const char *program_hash(Host *h) {
    const Plan *p = h->plan;
    const TrainSettings *ts = h->ts;
    size_t idlen = 0, srclen = 0;
    const char *id0 = LLVMGetModuleIdentifier(h->m, &idlen);
    const char *id = arena_printf(h->ar, "%.*s", (int)idlen, id0);
    const char *src0 = LLVMGetSourceFileName(h->m, &srclen);
    const char *src = arena_printf(h->ar, "%.*s", (int)srclen, src0);
    LLVMSetModuleIdentifier(h->m, "", 0);
    LLVMSetSourceFileName(h->m, "", 0);
    char *ir = LLVMPrintModuleToString(h->m);
    LLVMSetModuleIdentifier(h->m, id, idlen);
    LLVMSetSourceFileName(h->m, src, srclen);
    const char *text = arena_printf(h->ar, "%s\nbatch micro=%" PRId64 " seq=%" PRId64 " data=%" PRId64 " clip=%.17g lr=%.17g "
                                           "shuffle=%d vocab=%" PRId64,
                                    ir, p->programs[0].micro, p->seq, p->programs[0].data, p->clip,
                                    p->has_lr ? p->lr_base : 1.0, ts->shuffle, p->sched.vocab);
    LLVMDisposeMessage(ir);
    for (int i = 0; i < p->nprograms; i++)
        text = arena_printf(h->ar, "%s\nstage from=%" PRId64 " global=%" PRId64 " accum=%" PRId64, text, p->programs[i].first_step,
                            p->programs[i].global, p->programs[i].accumulation);
    char hex[HOST_ABI_CHECKSUM_CHARS + 1];
    host_abi_checksum(text, strlen(text), hex);
    return arena_printf(h->ar, "xxh3-128:%s", hex);
}

/* RtPlanInfo: the plan's summary, phase by phase (PlanPhase and the runtime's RT_PHASE_* agree). */
static LLVMValueRef emit_plan_info(Host *h) {
    const PlanMemory *m = &h->plan->mem;
    if (host_abi_phases() != PLAN_NPHASES) INTERNAL("host: %d phases in the runtime, %d in the plan", host_abi_phases(), PLAN_NPHASES);
    LLVMValueRef arena[PLAN_NPHASES], kernels[PLAN_NPHASES], gemms[PLAN_NPHASES];
    for (int i = 0; i < PLAN_NPHASES; i++)
        arena[i] = ci64(h, m->phase[i].peak), kernels[i] = ci64(h, m->phase[i].kernels), gemms[i] = ci64(h, m->phase[i].gemms);
    LLVMValueRef f[4] = {LLVMConstArray2(h->i64, arena, PLAN_NPHASES), LLVMConstArray2(h->i64, kernels, PLAN_NPHASES),
                         LLVMConstArray2(h->i64, gemms, PLAN_NPHASES), ci64(h, m->input_bytes)};
    return named_struct(h->plan_t, f, 4);
}

static void emit_descriptor(Host *h, const char *source, LLVMValueRef fb, LLVMValueRef fl, LLVMValueRef flog,
                            LLVMValueRef oinit, LLVMValueRef oupd, LLVMValueRef lrs, const char *hash,
                            const GraphUpdate *u, LLVMValueRef gpu) {
    const Plan *p = h->plan;
    const TrainSettings *ts = h->ts;
    const Graph *g = p->step;
    LLVMValueRef fn0 = begin_fn(h, "mbt.strings", h->vd); /* a builder position for global strings */
    (void)fn0;
    int np = p->mem.nparams, maxr = host_abi_max_rank();
    LLVMValueRef *rows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(np + 1));
    for (int i = 0; i < np; i++) {
        const PlanParam *pp = &p->mem.params[i];
        const GNode *n = graph_node(g, pp->node);
        if (n->rank > maxr) INTERNAL("host: parameter %s has rank %d", pp->name, n->rank);
        LLVMValueRef dims[64];
        for (int d = 0; d < maxr; d++) dims[d] = ci64(h, d < n->rank ? n->shape[d] : 0);
        int init = (int)n->iattr[0]; /* GInit and RtInitKind list the same initialisers in the same order */
        LLVMValueRef f[8] = {str_const(h, pp->name), ci32(h, n->rank), LLVMConstArray2(h->i64, dims, (uint64_t)maxr),
                             ci64(h, pp->numel), ci64(h, pp->offset / 4), ci32(h, init),
                             LLVMConstReal(h->f64, n->fattr[0]), LLVMConstReal(h->f64, n->fattr[1])};
        rows[i] = named_struct(h->param_t, f, 8);
    }
    LLVMValueRef table = LLVMAddGlobal(h->m, LLVMArrayType2(h->param_t, (uint64_t)np), "mbt.params");
    LLVMSetInitializer(table, LLVMConstArray2(h->param_t, rows, (uint64_t)np));
    LLVMSetGlobalConstant(table, 1);
    LLVMSetLinkage(table, LLVMPrivateLinkage);
    const PlanProgram *pg = &p->programs[0];
    LLVMValueRef ramp = emit_ramp_table(h);
    LLVMValueRef tr[23] = {str_const(h, ts->name), ci64(h, pg->micro), ci64(h, p->seq), ci64(h, pg->global),
                           ci64(h, pg->accumulation), ci64(h, p->steps), ci64(h, ts->seed), LLVMConstReal(h->f64, p->clip),
                           ci64(h, p->sched.vocab), ci64(h, p->seq), LLVMConstReal(h->f64, p->has_lr ? p->lr_base : 1.0),
                           str_const(h, ts->data_glob), str_const(h, ts->val_glob), ci32(h, ts->shuffle),
                           ci64(h, ts->eval_every), ci64(h, ts->eval_steps ? ts->eval_steps : 20),
                           ci64(h, pg->data), ci64(h, p->nprograms - 1), ramp, ci64(h, ts->ckpt_every),
                           str_const(h, ts->ckpt_dir), ci64(h, ts->ckpt_keep), ci32(h, ts->ckpt_continue_on_error)};
    LLVMValueRef ge[4] = {LLVMConstPointerNull(h->ptr), LLVMConstReal(h->f64, 1.0), ci64(h, 0), ci64(h, 64)};
    LLVMValueRef null = LLVMConstPointerNull(h->ptr);
    LLVMValueRef *names = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(u->nstate + 1));
    for (int j = 0; j < u->nstate; j++) names[j] = str_const(h, u->state_name[j]);
    LLVMValueRef state_names = LLVMConstPointerNull(h->ptr);
    if (u->nstate > 0) {
        state_names = LLVMAddGlobal(h->m, LLVMArrayType2(h->ptr, (uint64_t)u->nstate), "mbt.state_names");
        LLVMSetInitializer(state_names, LLVMConstArray2(h->ptr, names, (uint64_t)u->nstate));
        LLVMSetGlobalConstant(state_names, 1);
        LLVMSetLinkage(state_names, LLVMPrivateLinkage);
    }
    LLVMValueRef pr[21] = {ci32(h, host_abi_version()), str_const(h, source), named_struct(h->train_t, tr, 23),
                           named_struct(h->gen_t, ge, 4), table, ci64(h, np), ci64(h, p->mem.param_bytes / 4),
                           ci64(h, p->mem.state_bytes / 4), ci64(h, p->mem.arena_bytes), ci64(h, p->seq), fb, fl ? fl : null,
                           flog ? flog : null, oinit ? oinit : null, oupd, lrs, str_const(h, hash), ci64(h, u->nstate),
                           state_names, gpu ? gpu : null, emit_plan_info(h)};
    LLVMBuildRetVoid(h->b);
    LLVMDeleteFunction(fn0);
    LLVMValueRef desc = LLVMAddGlobal(h->m, h->prog_t, "mbt_program");
    LLVMSetInitializer(desc, named_struct(h->prog_t, pr, 21));
    LLVMSetGlobalConstant(desc, 1);
}

/* ---- the driver ------------------------------------------------------------------------------ */

static const char *shell_quote(Arena *ar, const char *s) {
    const char *out = "'";
    for (const char *p = s; *p; p++) out = *p == '\'' ? arena_printf(ar, "%s'\\''", out) : arena_printf(ar, "%s%c", out, *p);
    return arena_printf(ar, "%s'", out);
}

/* --emit=program: the kernels of every schedule (each under its listing: kind, grid, buffers and
 * the graph ops it fuses with their source lines), then the host functions and the descriptor,
 * every launch in them preceded by a comment naming what it computes and where in the source. */
static void print_program(Host *h, const Sched *const *scheds, const Graph *const *graphs, int n) {
    int total = 0, nlaunch = 0;
    for (int i = 0; i < n; i++) total += scheds[i] ? scheds[i]->r->nkernels : 0;
    for (int i = 0; i < n; i++) nlaunch += scheds[i] ? scheds[i]->r->nlaunches : 0;
    Kernel **kernels = arena_alloc(h->ar, sizeof(Kernel *) * (size_t)(total + 1));
    const char **notes = arena_alloc(h->ar, sizeof(char *) * (size_t)(total + 1));
    CpuAnnotation *ann = arena_alloc(h->ar, sizeof(CpuAnnotation) * (size_t)(2 * nlaunch + 1)); /* a kernel: CPU and GPU calls */
    int k = 0, a = 0;
    for (int i = 0; i < n; i++) {
        const Sched *S = scheds[i];
        for (int j = 0; S && j < S->r->nkernels; j++, k++) {
            kernels[k] = S->r->kernels[j];
            notes[k] = fuse_kernel_ops_note(graphs[i], kernels[k], h->ar);
        }
        for (int li = 0; S && li < S->r->nlaunches; li++) {
            const FuseLaunch *L = &S->r->launches[li];
            if (L->kind == FL_GEMM) {
                const FuseBuffer *c = &S->r->buffers[L->gemm.c];
                const GNode *gn = c->node >= 0 ? graph_node(graphs[i], c->node) : NULL;
                const char *at = gn && gn->src.file ? diag_source_path(gn->src.file) : NULL;
                const char *base = at && strrchr(at, '/') ? strrchr(at, '/') + 1 : at;
                ann[a].needle = arena_printf(h->ar, "%%%sgemm%d.", S->prefix, li);
                ann[a++].comment = arena_printf(
                    h->ar, "%sGEMM %" PRId64 "x%" PRId64 "x%" PRId64 "%s%s%s into %s%s", L->gemm.dt == DT_BF16 ? "bf16 " : "",
                    L->gemm.m, L->gemm.n, L->gemm.k,
                    L->gemm.batch > 1 ? arena_printf(h->ar, " (batch %" PRId64 ")", L->gemm.batch) : "",
                    L->gemm.trans_a || L->gemm.trans_b ? (L->gemm.trans_a ? (L->gemm.trans_b ? ", A^T B^T" : ", A^T B")
                                                                          : ", A B^T")
                                                       : "",
                    L->gemm.epilogue == FE_NONE ? ""
                    : arena_printf(h->ar, L->gemm.epilogue == FE_BIAS ? " + bias %s" : ", B's column sums into %s",
                                   S->r->buffers[L->gemm.bias].what),
                    c->what, base ? arena_printf(h->ar, " %s:%u:%u", base, gn->src.line, gn->src.col) : "");
            } else {
                const Kernel *kn = S->r->kernels[L->kernel];
                const char *note = fuse_kernel_ops_note(graphs[i], kn, h->ar), *nl = strchr(note, '\n');
                int nops = 0;
                for (const char *q = note; (q = strchr(q, '\n')) != NULL; q++) nops++;
                char *first = arena_printf(h->ar, "%.*s", nl ? (int)(nl - note) : (int)strlen(note), note), *w = first;
                for (const char *q = first; *q; q++)
                    if (*q != ' ' || q[1] != ' ') *w++ = *q; /* the listing's column padding, squeezed */
                *w = 0;
                ann[a].needle = arena_printf(h->ar, "@%s.range,", kn->name);
                ann[a++].comment = arena_printf(h->ar, "kernel %s: %s%s", kn->name, first,
                                                nops > 1 ? arena_printf(h->ar, " (and %d more ops)", nops - 1) : "");
                ann[a].needle = arena_printf(h->ar, "%%%s. = call i32 @rt_gpu_launch", kn->name); /* emit_launches names it */
                ann[a].comment = ann[a - 1].comment;
                a++;
            }
        }
    }
    cpu_print_module(stdout, h->m, kernels, notes, total, ann, a);
}

/* ---- the GPU functions ------------------------------------------------------------------------
 * The same schedules, memory plan and host code as the CPU functions (one emit_* each, with
 * h->gpu set): every region and arena address is a device address, each kernel launch is
 * rt_gpu_launch with its index in the kernel table, each GEMM rt_gpu_sgemm_batched, and the
 * moves around them (the loss, the gradient accumulation, the logits, the update's copies, lr and
 * t) rt_gpu_* calls. The kernels themselves are the CUDA program (cuda_program.h): its images -
 * a cubin per --cuda-arch and the PTX of the highest - and its launch table go into the
 * RtGpuProgram descriptor. optimizer_init has no GPU version: the runtime runs the CPU one and
 * uploads the state. */

/* A byte array constant as a private global. */
static LLVMValueRef bytes_global(Host *h, const char *data, size_t n, const char *name) {
    LLVMValueRef init = LLVMConstStringInContext2(h->ctx, data, n, 1);
    LLVMValueRef g = LLVMAddGlobal(h->m, LLVMTypeOf(init), name);
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    LLVMSetAlignment(g, 16);
    return g;
}

/* A constant array of `t` rows as a private global (a null pointer when n is 0). */
static LLVMValueRef table_global(Host *h, LLVMTypeRef t, LLVMValueRef *rows, int64_t n, const char *name) {
    if (n == 0) return LLVMConstPointerNull(h->ptr);
    LLVMValueRef g = LLVMAddGlobal(h->m, LLVMArrayType2(t, (uint64_t)n), name);
    LLVMSetInitializer(g, LLVMConstArray2(t, rows, (uint64_t)n));
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    return g;
}

/* Emits the GPU functions for the schedules S[0..n) (S[2] may be absent: no logits) and returns
 * the RtGpuProgram global. res[0..narch): the compiled images (narch 0: none, for --emit=program). */
static LLVMValueRef host_gpu(Host *h, const CudaProgram *cp, Sched *const *S, int n, const HostSchedules *hs, const NvrtcResult *res,
                             int narch) {
    host_gpu_calls(h);
    int base = 0;
    for (int i = 0; i < n; i++)
        if (S[i]) {
            S[i]->gpu_base = base;
            base += S[i]->r->nkernels;
        }
    if (base != cp->nkernels) INTERNAL("host: %d kernels in the schedules, %d in the CUDA program", base, cp->nkernels);
    h->gpu = 1;
    LLVMValueRef fb = emit_forward(h, S[0], 1), fl = emit_forward(h, S[0], 0), ou = emit_update(h, S[1]);
    LLVMValueRef flog = S[2] ? emit_logits(h, S[2], hs->logits_node, h->plan->sched.vocab) : LLVMConstPointerNull(h->ptr);
    h->gpu = 0;
    LLVMValueRef fn0 = begin_fn(h, "mbt.gpu_strings", h->vd); /* a builder position for global strings */
    LLVMValueRef *krows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(cp->nkernels + 1));
    for (int k = 0; k < cp->nkernels; k++) {
        const CudaLaunch *L = &cp->launch[k];
        LLVMValueRef f[5] = {str_const(h, cuda_program_function(cp, k)), ci32(h, L->block), ci32(h, L->shared), ci64(h, L->blocks),
                             ci32(h, cp->kernels[k]->nbufs)};
        krows[k] = named_struct(h->gpu_kernel_t, f, 5);
    }
    LLVMValueRef *irows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(2 * narch + 1));
    int nimg = 0;
    for (int a = 0; a < narch; a++) {
        const char *code[2] = {res[a].cubin, res[a].ptx};
        size_t size[2] = {res[a].cubin_size, res[a].ptx ? strlen(res[a].ptx) + 1 : 0};
        for (int ptx = 0; ptx < 2; ptx++) {
            if (!code[ptx]) continue;
            const char *arch = ptx ? arena_printf(h->ar, "compute_%s", res[a].arch + 3) : res[a].arch;
            LLVMValueRef f[4] = {str_const(h, arch), ci32(h, ptx),
                                 bytes_global(h, code[ptx], size[ptx], arena_printf(h->ar, "mbt.gpu.%s", arch)),
                                 ci64(h, (int64_t)size[ptx])};
            irows[nimg++] = named_struct(h->gpu_image_t, f, 4);
        }
    }
    char hex[HOST_ABI_CHECKSUM_CHARS + 1];
    host_abi_checksum(cp->source, strlen(cp->source), hex);
    LLVMValueRef f[9] = {table_global(h, h->gpu_image_t, irows, nimg, "mbt.gpu_images"), ci64(h, nimg),
                         table_global(h, h->gpu_kernel_t, krows, cp->nkernels, "mbt.gpu_kernels"), ci64(h, cp->nkernels),
                         str_const(h, arena_printf(h->ar, "xxh3-128:%s", hex)), fb, fl, flog, ou};
    LLVMBuildRetVoid(h->b);
    LLVMDeleteFunction(fn0);
    LLVMValueRef g = LLVMAddGlobal(h->m, h->gpu_prog_t, "mbt.gpu");
    LLVMSetInitializer(g, named_struct(h->gpu_prog_t, f, 9));
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    return g;
}

/* The CUDA side of an executable: the CUDA program of the schedules, compiled for the archs by
 * NVRTC (none for --emit=program: output NULL), and the GPU functions. NULL when the executable is
 * built without one: no archs (--cuda-arch=none), or no NVRTC here (a warning). */
static LLVMValueRef host_cuda(Host *h, Sched *const *S, const HostSchedules *hs, const HostCuda *cuda, int emit_only) {
    if (!cuda || cuda->narch == 0) return NULL;
    CudaSchedule cs[3];
    for (int i = 0; i < hs->n; i++) cs[i] = (CudaSchedule){hs->r[i], hs->g[i], hs->disjoint[i]};
    CudaProgram *cp = cuda_program_build(cs, hs->n, h->ar);
    NvrtcResult *res = arena_alloc(h->ar, sizeof *res * (size_t)cuda->narch);
    if (!emit_only) {
        const char *why = NULL;
        if (!nvrtc_open(h->ar, &why)) {
            diag_warning(span_none(), "the executable is built for the CPU alone: NVRTC, which compiles its CUDA kernels, is not "
                                      "installed here (%s)", why);
            diag_hint("install the CUDA toolkit, or give --cuda-arch=none to build for the CPU without this warning");
            return NULL;
        }
        if (cuda_program_compile(cp, cuda->archs, cuda->narch, CUDA_PTX_HIGHEST, res, "-o", h->ar)) return NULL;
    }
    return host_gpu(h, cp, S, 3, hs, res, emit_only ? 0 : cuda->narch);
}

/* ---- the driver ---------------------------------------------------------------------------------- */

int host_compile(Loader *ld, Module *main_mod, const char *input, const char *train_name, const char *output,
                 const HostCuda *cuda, Arena *ar) {
    TrainBuild *tb;
    Plan *plan = plan_for_train(ld, main_mod, train_name, &tb, ar);
    if (!plan) return diag_finish();
    /* Dropout's mask is keyed by its stream number alone (graph_build.c), so a compiled step would
     * draw the same mask every step and micro-batch: refused until the key carries the seed, step
     * and micro-batch. */
    for (int id = 0; id < tb->step->n; id++) {
        const GNode *n = tb->step->node[id];
        if (n->op == G_DROPOUT && n->fattr[0] > 0) {
            diag_error(n->src, "dropout is not compiled into executables yet");
            diag_hint("its mask would be the same at every step and micro-batch; --check and --emit accept it");
            return diag_finish();
        }
    }
    CpuTarget target;
    const char *err = NULL;
    if (cpu_target_host(&target, ar, &err)) {
        diag_error_noloc("%s", err);
        return diag_finish();
    }
    Host H = {.ar = ar, .plan = plan, .ts = tb->settings};
    Host *h = &H;
    h->ctx = LLVMContextCreate();
    h->m = cpu_module_new(h->ctx, &target, input);
    h->b = LLVMCreateBuilderInContext(h->ctx);
    host_types(h);

    const HostSchedules hs = plan->sched;
    plan_warn_no_logits(&hs, tb->settings->name);
    const PlanPhaseMem *pm = plan->mem.phase;
    Sched step = {.prefix = "step_", .r = hs.r[PLAN_STEP], .mem = &pm[PLAN_STEP]};
    Sched upd = {.prefix = "update_", .r = hs.r[PLAN_UPDATE], .mem = &pm[PLAN_UPDATE]};
    Sched lsch = {.prefix = "logits_", .r = hs.n > 2 ? hs.r[PLAN_LOGITS] : NULL, .mem = &pm[PLAN_LOGITS]};
    sched_kernels(h, &step, 1);
    sched_kernels(h, &upd, 0);
    LLVMValueRef fb = emit_forward(h, &step, 1), fl = emit_forward(h, &step, 0);
    LLVMValueRef ou = emit_update(h, &upd), oi = emit_optimizer_init(h, tb->update->update);
    LLVMValueRef lrs = emit_lr_schedule(h);
    /* generation: the logits at batch 1 (NULL, with a warning, when the model has none) */
    LLVMValueRef flog = NULL;
    if (lsch.r) {
        sched_kernels(h, &lsch, 1);
        flog = emit_logits(h, &lsch, hs.logits_node, plan->sched.vocab);
    }
    /* the hash covers the CPU functions alone: the GPU ones compute the same step, and a checkpoint
     * resumes on either device */
    const char *hash = diag_error_count() ? NULL : program_hash(h);
    Sched *scheds[3] = {&step, &upd, lsch.r ? &lsch : NULL};
    LLVMValueRef gpu = diag_error_count() ? NULL : host_cuda(h, scheds, &hs, cuda, output == NULL);
    if (!diag_error_count())
        emit_descriptor(h, input, fb, fl, flog, oi, ou, lrs, hash, tb->update->update, gpu);
    int rc = 0;
    if (!diag_error_count() && !output) {
        if (cpu_verify(h->m, ar, &err)) INTERNAL("the program's LLVM module fails LLVMVerifyModule: %s", err);
        const Graph *graphs[3] = {tb->step, tb->update, hs.n > 2 ? hs.g[2] : NULL};
        print_program(h, (const Sched *const *)scheds, graphs, 3);
    } else if (!diag_error_count()) {
        if (cpu_verify(h->m, ar, &err)) INTERNAL("the program's LLVM module fails LLVMVerifyModule: %s", err);
        const char *obj = arena_printf(ar, "%s.o", output);
        if (cpu_optimize(h->m, &target, ar, &err) || cpu_emit_object(h->m, &target, obj, ar, &err))
            diag_error_noloc("%s", err);
        else {
            const char *cmd = arena_printf(ar, "cc %s %s %s -o %s", shell_quote(ar, obj), shell_quote(ar, MBT_RT_LIB),
                                           MBT_RT_LDLIBS, shell_quote(ar, output));
            int st = system(cmd);
            if (st != 0) diag_error_noloc("linking the executable failed (status %d): %s", st, cmd);
            unlink(obj);
        }
    }
    rc = diag_finish();
    LLVMDisposeBuilder(h->b);
    LLVMDisposeModule(h->m);
    LLVMContextDispose(h->ctx);
    cpu_target_dispose(&target);
    return rc;
}

/* ---- the schedules alone (host.h: for the CUDA source) ------------------------------------------ */

int host_schedules(Loader *ld, Module *main_mod, const char *train_name, HostSchedules *out, Arena *ar) {
    memset(out, 0, sizeof *out);
    TrainBuild *tb;
    Plan *plan = plan_for_train(ld, main_mod, train_name, &tb, ar);
    if (!plan) return 1;
    *out = plan->sched;
    plan_warn_no_logits(out, tb->settings->name);
    return diag_error_count() ? 1 : 0;
}
