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

const HostTarget host_target_cpu = {.name = "cpu",
                                    .fn_prefix = "",
                                    .declare = cpu_declare,
                                    .executor = cpu_executor,
                                    .launch = cpu_launch,
                                    .gemm = cpu_gemm,
                                    .accumulate = cpu_accumulate,
                                    .copy = cpu_copy,
                                    .read_loss = cpu_read_loss,
                                    .staging = cpu_staging,
                                    .upload = cpu_upload};
