/* target_gpu.c - the GPU target of the host functions (HostTarget, host_internal.h) and the GPU
 * side of an executable. On the GPU each kernel launch is rt_gpu_launch with its index in the
 * kernel table, each GEMM rt_gpu_sgemm_batched / rt_gpu_bgemm_batched, and the moves around them
 * rt_gpu_* calls (rt_program.h), each status checked. */
#include <string.h>

#include "cuda_program.h"
#include "diag.h"
#include "host_internal.h"
#include "nvrtc.h"

/* The runtime's rt_gpu_* calls (rt_program.h), declared when the GPU functions are emitted. */
static void gpu_declare(Host *h) {
    LLVMTypeRef P = h->ptr, I = h->i64, W = h->i32;
    LLVMTypeRef launch[] = {P, W, P, P};
    h->gpu_launch_t = LLVMFunctionType(W, launch, 4, 0);
    h->gpu_launch = LLVMAddFunction(h->m, "rt_gpu_launch", h->gpu_launch_t);
    h->gpu_gemm = LLVMAddFunction(h->m, "rt_gpu_sgemm_batched", h->gemm_t);
    h->gpu_bgemm = NULL;
    LLVMTypeRef axpy[] = {P, P, P, h->f32, I, P};
    h->gpu_axpy_t = LLVMFunctionType(W, axpy, 6, 0);
    h->gpu_axpy = LLVMAddFunction(h->m, "rt_gpu_axpy", h->gpu_axpy_t);
    LLVMTypeRef axpy_table[] = {P, P, I, h->f32, P}; /* (gpu, table, count, scale, err) */
    h->gpu_axpy_table_t = LLVMFunctionType(W, axpy_table, 5, 0);
    h->gpu_axpy_table = LLVMAddFunction(h->m, "rt_gpu_axpy_table", h->gpu_axpy_table_t);
    LLVMTypeRef copy[] = {P, P, P, I, P}; /* (gpu, dst, src, bytes, err): copy, upload, download */
    h->gpu_copy_t = LLVMFunctionType(W, copy, 5, 0);
    h->gpu_copy = LLVMAddFunction(h->m, "rt_gpu_copy", h->gpu_copy_t);
    h->gpu_upload = LLVMAddFunction(h->m, "rt_gpu_upload", h->gpu_copy_t);
    h->gpu_download = LLVMAddFunction(h->m, "rt_gpu_download", h->gpu_copy_t);
    LLVMTypeRef loss[] = {P, P, P, P}; /* (gpu, double *dst, const float *dev, err) */
    h->gpu_loss_t = LLVMFunctionType(W, loss, 4, 0);
    h->gpu_loss = LLVMAddFunction(h->m, "rt_gpu_loss", h->gpu_loss_t);
}

static LLVMValueRef gpu_executor(Host *h, LLVMValueRef s) { return step_field(h, s, RT_STEP_gpu, h->ptr, "gpu"); }

static void gpu_launch(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef bufs) {
    const Kernel *k = S->r->kernels[kernel];
    LLVMValueRef a[4] = {f->exec, ci32(h, S->gpu_base + kernel), bufs, f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_launch_t, h->gpu_launch, a, 4, arena_printf(h->ar, "%s.", k->name)));
}

static LLVMValueRef gpu_gemm(Host *h, DType dt) {
    if (dt == DT_F32) return h->gpu_gemm;
    if (!h->gpu_bgemm) h->gpu_bgemm = LLVMAddFunction(h->m, "rt_gpu_bgemm_batched", h->gemm_t);
    return h->gpu_bgemm;
}

static void gpu_accumulate(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef scale, int64_t n) {
    LLVMValueRef a[6] = {f->exec, dst, src, scale, ci64(h, n), f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_axpy_t, h->gpu_axpy, a, 6, ""));
}

/* Every gradient of the micro-batch added in one launch: a stack table of (dst, src, n) rows for
 * rt_gpu_axpy_table (the runtime uploads each distinct table once; under a CUDA graph the
 * table's contents are part of the captured calls' key). */
static void gpu_accumulate_all(Host *h, const HostFn *f, const LLVMValueRef *dst, const LLVMValueRef *src, const int64_t *n,
                               int count, LLVMValueRef scale) {
    LLVMTypeRef arr_t = LLVMArrayType2(h->i64, (uint64_t)(3 * count));
    LLVMValueRef table = LLVMBuildAlloca(h->b, arr_t, "axpy_table");
    for (int i = 0; i < count; i++) {
        LLVMValueRef v[3] = {LLVMBuildPtrToInt(h->b, dst[i], h->i64, ""), LLVMBuildPtrToInt(h->b, src[i], h->i64, ""),
                             ci64(h, n[i])};
        for (int j = 0; j < 3; j++) {
            LLVMValueRef idx[2] = {ci64(h, 0), ci64(h, 3 * i + j)};
            LLVMBuildStore(h->b, v[j], LLVMBuildInBoundsGEP2(h->b, arr_t, table, idx, 2, ""));
        }
    }
    LLVMValueRef a[5] = {f->exec, table, ci64(h, count), scale, f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_axpy_table_t, h->gpu_axpy_table, a, 5, ""));
}

/* the kernel's buffers, then lo and hi as 8-byte parameters (the CUDA function's long longs:
 * rt_gpu_launch passes each slot's 8 bytes as they are; the table counts nbufs + 2) */
static void gpu_launch_range(Host *h, const HostFn *f, const Sched *S, int kernel, LLVMValueRef *bufs, LLVMValueRef lo,
                             LLVMValueRef hi) {
    const Kernel *k = S->r->kernels[kernel];
    LLVMValueRef *all = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 2));
    for (int i = 0; i < k->nbufs; i++) all[i] = bufs[i];
    all[k->nbufs] = LLVMBuildIntToPtr(h->b, lo, h->ptr, "lo_param");
    all[k->nbufs + 1] = LLVMBuildIntToPtr(h->b, hi, h->ptr, "hi_param");
    gpu_launch(h, f, S, kernel, ptr_array(h, all, k->nbufs + 2, "bufs"));
}

/* rt_gpu_copy of a run-time count (nothing when it is 0 or below: the runtime takes 0 bytes) */
static void gpu_copy_n(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef count) {
    LLVMValueRef pos = LLVMBuildSelect(h->b, LLVMBuildICmp(h->b, LLVMIntSGT, count, ci64(h, 0), ""), count, ci64(h, 0), "");
    LLVMValueRef a[5] = {f->exec, dst, src, LLVMBuildMul(h->b, pos, ci64(h, 4), "bytes"), f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_copy_t, h->gpu_copy, a, 5, ""));
}

/* rt_gpu_download into host memory, else rt_gpu_copy */
static void gpu_copy(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src, int64_t n, int to_host) {
    LLVMValueRef a[5] = {f->exec, dst, src, ci64(h, n * 4), f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_copy_t, to_host ? h->gpu_download : h->gpu_copy, a, 5, ""));
}

/* queued for the host, which has it after its next wait: nothing here waits */
static void gpu_read_loss(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef src) {
    LLVMValueRef a[4] = {f->exec, dst, src, f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_loss_t, h->gpu_loss, a, 4, ""));
}

static LLVMValueRef gpu_staging(Host *h, LLVMValueRef dst, int64_t n, const char *name) {
    (void)dst;
    return LLVMBuildAlloca(h->b, LLVMArrayType2(h->f32, (uint64_t)n), name);
}

static void gpu_upload(Host *h, const HostFn *f, LLVMValueRef dst, LLVMValueRef staged, int64_t n) {
    LLVMValueRef a[5] = {f->exec, dst, staged, ci64(h, n * 4), f->err};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, h->gpu_copy_t, h->gpu_upload, a, 5, ""));
}

const HostTarget host_target_gpu = {.name = "gpu",
                                    .fn_prefix = "gpu.",
                                    .declare = gpu_declare,
                                    .executor = gpu_executor,
                                    .launch = gpu_launch,
                                    .launch_range = gpu_launch_range,
                                    .gemm = gpu_gemm,
                                    .accumulate = gpu_accumulate,
                                    .accumulate_all = gpu_accumulate_all,
                                    .copy = gpu_copy,
                                    .copy_n = gpu_copy_n,
                                    .read_loss = gpu_read_loss,
                                    .staging = gpu_staging,
                                    .upload = gpu_upload};

/* ---- the GPU functions ------------------------------------------------------------------------
 * The same schedules, memory plan and host code as the CPU functions (one emit_* each, with
 * h->target the GPU): every region and arena address is a device address, each kernel launch is
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

/* Emits the GPU functions for the schedules S[0..n) (S[2] may be absent: no logits; S[3]: no
 * chunk phase) and returns
 * the RtGpuProgram global. res[0..narch): the compiled images (narch 0: none, for --emit=program). */
static LLVMValueRef host_gpu(Host *h, const CudaProgram *cp, Sched *const *S, int n, const HostSchedules *hs,
                             const NvrtcResult *res, int narch) {
    host_target_gpu.declare(h);
    int base = 0;
    for (int i = 0; i < n; i++)
        if (S[i]) {
            S[i]->gpu_base = base;
            base += S[i]->r->nkernels;
        }
    if (base != cp->nkernels) INTERNAL("host: %d kernels in the schedules, %d in the CUDA program", base, cp->nkernels);
    h->target = &host_target_gpu;
    LLVMValueRef fb = emit_forward(h, S[0], 1), fl = emit_forward(h, S[0], 0), ou = emit_update(h, S[1]);
    LLVMValueRef flog = S[2] ? emit_logits(h, S[2], hs->logits_node, h->plan->sched.vocab) : LLVMConstPointerNull(h->ptr);
    LLVMValueRef fst = emit_stats(h, S[0]);
    LLVMValueRef fchunk = n > 3 && S[3] ? emit_chunk(h, S[3], hs->chunk_node, hs->kv.rows, h->plan->sched.vocab) : NULL;
    h->target = &host_target_cpu;
    LLVMValueRef fn0 = begin_fn(h, "mbt.gpu_strings", h->vd); /* a builder position for global strings */
    LLVMValueRef *krows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(cp->nkernels + 1));
    for (int k = 0; k < cp->nkernels; k++) {
        const CudaLaunch *L = &cp->launch[k];
        LLVMValueRef f[RT_GPU_KERNEL_NFIELDS] = {0};
        f[RT_GPU_KERNEL_function] = str_const(h, cuda_program_function(cp, k));
        f[RT_GPU_KERNEL_block] = ci32(h, L->block);
        f[RT_GPU_KERNEL_shared] = ci32(h, L->shared);
        f[RT_GPU_KERNEL_blocks] = ci64(h, L->blocks);
        f[RT_GPU_KERNEL_nbufs] = ci32(h, cp->kernels[k]->nbufs + (cp->kernels[k]->ranged ? 2 : 0)); /* + lo, hi */
        krows[k] = named_struct(h->gpu_kernel_t, f, RT_GPU_KERNEL_NFIELDS);
    }
    LLVMValueRef *irows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(2 * narch + 1));
    int nimg = 0;
    for (int a = 0; a < narch; a++) {
        const char *code[2] = {res[a].cubin, res[a].ptx};
        size_t size[2] = {res[a].cubin_size, res[a].ptx ? strlen(res[a].ptx) + 1 : 0};
        for (int ptx = 0; ptx < 2; ptx++) {
            if (!code[ptx]) continue;
            const char *arch = ptx ? arena_printf(h->ar, "compute_%s", res[a].arch + 3) : res[a].arch;
            LLVMValueRef f[RT_GPU_IMAGE_NFIELDS] = {0};
            f[RT_GPU_IMAGE_arch] = str_const(h, arch);
            f[RT_GPU_IMAGE_ptx] = ci32(h, ptx);
            f[RT_GPU_IMAGE_data] = bytes_global(h, code[ptx], size[ptx], arena_printf(h->ar, "mbt.gpu.%s", arch));
            f[RT_GPU_IMAGE_size] = ci64(h, (int64_t)size[ptx]);
            irows[nimg++] = named_struct(h->gpu_image_t, f, RT_GPU_IMAGE_NFIELDS);
        }
    }
    char hex[HOST_ABI_CHECKSUM_CHARS + 1];
    host_abi_checksum(cp->source, strlen(cp->source), hex);
    LLVMValueRef f[RT_GPU_PROG_NFIELDS] = {0};
    f[RT_GPU_PROG_images] = table_global(h, h->gpu_image_t, irows, nimg, "mbt.gpu_images");
    f[RT_GPU_PROG_nimages] = ci64(h, nimg);
    f[RT_GPU_PROG_kernels] = table_global(h, h->gpu_kernel_t, krows, cp->nkernels, "mbt.gpu_kernels");
    f[RT_GPU_PROG_nkernels] = ci64(h, cp->nkernels);
    f[RT_GPU_PROG_module_hash] = str_const(h, arena_printf(h->ar, "xxh3-128:%s", hex));
    f[RT_GPU_PROG_forward_backward] = fb;
    f[RT_GPU_PROG_forward_loss] = fl;
    f[RT_GPU_PROG_forward_logits] = flog;
    f[RT_GPU_PROG_optimizer_update] = ou;
    f[RT_GPU_PROG_forward_stats] = fst ? fst : LLVMConstPointerNull(h->ptr);
    f[RT_GPU_PROG_forward_chunk] = fchunk ? fchunk : LLVMConstPointerNull(h->ptr);
    LLVMBuildRetVoid(h->b);
    LLVMDeleteFunction(fn0);
    LLVMValueRef g = LLVMAddGlobal(h->m, h->gpu_prog_t, "mbt.gpu");
    LLVMSetInitializer(g, named_struct(h->gpu_prog_t, f, RT_GPU_PROG_NFIELDS));
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    return g;
}

/* host_internal.h */
LLVMValueRef host_cuda(Host *h, Sched *const *S, const HostSchedules *hs, const HostCuda *cuda, int emit_only) {
    if (!cuda || cuda->narch == 0) return NULL;
    CudaSchedule cs[4];
    int n = hs->n < 4 ? hs->n : 4; /* step, update, logits, chunk (the KV cache: docs/serve.md) */
    for (int i = 0; i < n; i++) cs[i] = (CudaSchedule){hs->r[i], hs->g[i], hs->disjoint[i]};
    CudaProgram *cp = cuda_program_build(cs, n, h->ar);
    NvrtcResult *res = arena_alloc(h->ar, sizeof *res * (size_t)cuda->narch);
    if (!emit_only) {
        const char *why = NULL;
        if (!nvrtc_open(h->ar, &why)) {
            diag_warning(span_none(),
                         "the executable is built for the CPU alone: NVRTC, which compiles its CUDA kernels, is not "
                         "installed here (%s)",
                         why);
            diag_hint("install the CUDA toolkit, or give --cuda-arch=none to build for the CPU without this warning");
            return NULL;
        }
        if (cuda_program_compile(cp, cuda->archs, cuda->narch, CUDA_PTX_HIGHEST, res, "-o", h->ar)) return NULL;
    }
    return host_gpu(h, cp, S, 4, hs, res, emit_only ? 0 : cuda->narch);
}
