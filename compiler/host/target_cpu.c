/* target_cpu.c - the CPU target of the host functions (HostTarget, host_internal.h): kernels run
 * on RtStep.pool through rt_parallel_for (a small one called directly), GEMMs are
 * rt_sgemm_batched / rt_bgemm_batched, and the moves around them are loops over host memory. */
#include "host_internal.h"

#define SMALL_GRID 256 /* work items below which a kernel is called directly, not through the pool */

static void cpu_declare(Host *h) {
    h->pfor = LLVMAddFunction(h->m, "rt_parallel_for", h->pfor_t);
    h->gemm = LLVMAddFunction(h->m, "rt_sgemm_batched", h->gemm_t);
    h->bgemm = NULL; /* declared on first use: f32 programs never name it */
}

static LLVMValueRef cpu_executor(Host *h, LLVMValueRef s) { return step_field(h, s, RT_STEP_pool, h->ptr, "pool"); }

/* kernel(bufs, 0, grid) on this thread, or its range wrapper over [0, grid) on the pool */
static void cpu_launch(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef bufs) {
    const Kernel *k = S->r->kernels[kernel];
    if (k->grid < SMALL_GRID) {
        LLVMValueRef a[3] = {bufs, ci64(h, 0), ci64(h, k->grid)};
        LLVMBuildCall2(h->b, LLVMGlobalGetValueType(S->kfn[kernel]), S->kfn[kernel], a, 3, "");
    } else {
        LLVMValueRef a[4] = {f->exec, ci64(h, k->grid), S->kwrap[kernel], bufs};
        LLVMBuildCall2(h->b, h->pfor_t, h->pfor, a, 4, "");
    }
}

void host_cpu_launch_count(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef bufs, LLVMValueRef count) {
    LLVMBasicBlockRef small = LLVMAppendBasicBlockInContext(h->ctx, f->fn, "direct");
    LLVMBasicBlockRef pool = LLVMAppendBasicBlockInContext(h->ctx, f->fn, "pooled");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(h->ctx, f->fn, "launched");
    LLVMBuildCondBr(h->b, LLVMBuildICmp(h->b, LLVMIntSLT, count, ci64(h, SMALL_GRID), ""), small, pool);
    LLVMPositionBuilderAtEnd(h->b, small);
    LLVMValueRef a[3] = {bufs, ci64(h, 0), count};
    LLVMBuildCall2(h->b, LLVMGlobalGetValueType(S->kfn[kernel]), S->kfn[kernel], a, 3, "");
    LLVMBuildBr(h->b, done);
    LLVMPositionBuilderAtEnd(h->b, pool);
    LLVMValueRef p[4] = {f->exec, count, S->kwrap[kernel], bufs};
    LLVMBuildCall2(h->b, h->pfor_t, h->pfor, p, 4, "");
    LLVMBuildBr(h->b, done);
    LLVMPositionBuilderAtEnd(h->b, done);
}

static LLVMValueRef cpu_gemm(Host *h, DType dt) {
    if (dt == DT_F32) return h->gemm;
    if (!h->bgemm) h->bgemm = LLVMAddFunction(h->m, "rt_bgemm_batched", h->gemm_t);
    return h->bgemm;
}

/* rt_sgemm_rows_batched / rt_bgemm_rows_batched: the CPU's chunk phase (KV cache), where a token's
 * row of every product must come out the same bits wherever it sits in a call (docs/serve.md,
 * "Numerics"), which OpenBLAS's sgemm does not give. (The GPU's chunk phase keeps cuBLASLt at a
 * fixed shape instead: chunk_gemm_rows, host.c.) */
LLVMValueRef host_rows_gemm(Host *h, DType dt) {
    const char *name = dt == DT_F32 ? "rt_sgemm_rows_batched" : "rt_bgemm_rows_batched";
    LLVMValueRef f = LLVMGetNamedFunction(h->m, name);
    return f ? f : LLVMAddFunction(h->m, name, h->gemm_t);
}

static void cpu_accumulate(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef scale, int64_t n) {
    emit_f32_loop(h, f->fn, dst, src, scale, n, 1);
}

static void cpu_copy(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, int64_t n, int to_host) {
    (void)to_host; /* every address is host memory */
    emit_f32_loop(h, f->fn, dst, src, NULL, n, 0);
}

static void cpu_read_loss(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src) {
    (void)f;
    LLVMBuildStore(h->b, LLVMBuildFPExt(h->b, LLVMBuildLoad2(h->b, h->f32, src, "loss"), h->f64, ""), dst);
}

/* the host writes the values in place: nothing to upload */
static LLVMValueRef cpu_staging(Host *h, LLVMValueRef dst, int64_t n, const char *name) {
    (void)h, (void)n, (void)name;
    return dst;
}

static void cpu_upload(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef staged, int64_t n) {
    (void)h, (void)f, (void)dst, (void)staged, (void)n;
}

/* dst[j] = src[j] for j < count (a run-time count; nothing when it is 0 or below). */
static void cpu_copy_n(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef count) {
    LLVMValueRef fn = f->fn;
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(h->b);
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(h->ctx, fn, "copy");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(h->ctx, fn, "copied");
    LLVMBuildCondBr(h->b, LLVMBuildICmp(h->b, LLVMIntSGT, count, ci64(h, 0), ""), body, done);
    LLVMPositionBuilderAtEnd(h->b, body);
    LLVMValueRef j = LLVMBuildPhi(h->b, h->i64, "j");
    LLVMValueRef v = LLVMBuildLoad2(h->b, h->f32, LLVMBuildGEP2(h->b, h->f32, src, &j, 1, ""), "");
    LLVMBuildStore(h->b, v, LLVMBuildGEP2(h->b, h->f32, dst, &j, 1, ""));
    LLVMValueRef next = LLVMBuildAdd(h->b, j, ci64(h, 1), "");
    LLVMValueRef in[2] = {ci64(h, 0), next};
    LLVMBasicBlockRef from[2] = {pre, body};
    LLVMAddIncoming(j, in, from, 2);
    LLVMBuildCondBr(h->b, LLVMBuildICmp(h->b, LLVMIntSLT, next, count, ""), body, done);
    LLVMPositionBuilderAtEnd(h->b, done);
}

/* The wrapper of update kernel k that runs work items [begin + lo, end + lo): lo is the pointer
 * slot after the kernel's buffers (rt_parallel_for splits [0, hi - lo)). */
static LLVMValueRef update_range_wrapper(Host *h, const Sched *S, int k) {
    const Kernel *kn = S->r->kernels[k];
    LLVMBasicBlockRef saved = LLVMGetInsertBlock(h->b);
    LLVMValueRef w = LLVMAddFunction(h->m, arena_printf(h->ar, "%s.range_lo", kn->name), h->range_fn_t);
    LLVMSetLinkage(w, LLVMInternalLinkage);
    LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, w, "entry"));
    LLVMValueRef bufs = LLVMGetParam(w, 0), at = ci64(h, kn->nbufs);
    LLVMValueRef lo =
        LLVMBuildPtrToInt(h->b, LLVMBuildLoad2(h->b, h->ptr, LLVMBuildGEP2(h->b, h->ptr, bufs, &at, 1, ""), ""), h->i64, "lo");
    LLVMValueRef a[3] = {bufs, LLVMBuildAdd(h->b, LLVMGetParam(w, 1), lo, ""), LLVMBuildAdd(h->b, LLVMGetParam(w, 2), lo, "")};
    LLVMBuildCall2(h->b, LLVMGlobalGetValueType(S->kfn[k]), S->kfn[k], a, 3, "");
    LLVMBuildRetVoid(h->b);
    LLVMPositionBuilderAtEnd(h->b, saved);
    return w;
}

/* kernel over [lo, hi): its range wrapper over [0, hi - lo) on the pool, lo in the pointer slot
 * after its buffers */
static void cpu_launch_range(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef *bufs, LLVMValueRef lo,
                             LLVMValueRef hi) {
    const Kernel *k = S->r->kernels[kernel];
    bufs[k->nbufs] = LLVMBuildIntToPtr(h->b, lo, h->ptr, "lo_slot");
    LLVMValueRef a[4] = {f->exec, LLVMBuildSub(h->b, hi, lo, "len"), update_range_wrapper(h, S, kernel),
                         ptr_array(h, bufs, k->nbufs + 1, "bufs")};
    LLVMBuildCall2(h->b, h->pfor_t, h->pfor, a, 4, "");
}

const HostTarget host_target_cpu = {.name = "cpu",
                                    .fn_prefix = "",
                                    .declare = cpu_declare,
                                    .executor = cpu_executor,
                                    .launch = cpu_launch,
                                    .launch_range = cpu_launch_range,
                                    .gemm = cpu_gemm,
                                    .accumulate = cpu_accumulate,
                                    .copy = cpu_copy,
                                    .copy_n = cpu_copy_n,
                                    .read_loss = cpu_read_loss,
                                    .staging = cpu_staging,
                                    .upload = cpu_upload};
