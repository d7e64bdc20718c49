/* builders.c - the runtime's ABI structs as LLVM types, each built from its field list
 * (rt_program_fields.h) and checked against the C compiler's layout (host_abi.h), and the small
 * builders every host file uses. */
#include <inttypes.h>

#include "diag.h"
#include "host_internal.h"

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

/* The LLVM type of a field of machine type `kind` (rt_program_fields.h). */
#define HOST_KIND_ptr(h) (h)->ptr
#define HOST_KIND_i32(h) (h)->i32
#define HOST_KIND_i64(h) (h)->i64
#define HOST_KIND_f64(h) (h)->f64
#define HOST_KIND_dims(h) LLVMArrayType2((h)->i64, (uint64_t)host_abi_max_rank())
#define HOST_KIND_train(h) (h)->train_t
#define HOST_KIND_generate(h) (h)->gen_t
#define HOST_KIND_phases(h) LLVMArrayType2((h)->i64, (uint64_t)host_abi_phases())
#define HOST_KIND_plan(h) (h)->plan_t
#define HOST_KIND_kvinfo(h) (h)->kv_t
#define HOST_FIELD_TYPE(ctype, f, kind) HOST_KIND_##kind(h),
/* h->member = the named struct `name` of the fields in LIST, checked against the C layout */
#define HOST_STRUCT(member, which, name, LIST, n)                                                                                \
    do {                                                                                                                         \
        LLVMTypeRef fields_[] = {LIST(HOST_FIELD_TYPE)};                                                                         \
        h->member = host_struct(h, which, name, fields_, n);                                                                     \
    } while (0)

void host_types(Host *h) {
    h->i8 = LLVMInt8TypeInContext(h->ctx), h->i32 = LLVMInt32TypeInContext(h->ctx), h->i64 = LLVMInt64TypeInContext(h->ctx);
    h->f32 = LLVMFloatTypeInContext(h->ctx), h->f64 = LLVMDoubleTypeInContext(h->ctx);
    h->ptr = LLVMPointerTypeInContext(h->ctx, 0), h->vd = LLVMVoidTypeInContext(h->ctx);
    LLVMTypeRef P = h->ptr, I = h->i64, W = h->i32;
    HOST_STRUCT(step_t, HA_STEP, "RtStep", RT_STEP_FIELDS, RT_STEP_NFIELDS);
    HOST_STRUCT(param_t, HA_PARAM, "RtParam", RT_PARAM_FIELDS, RT_PARAM_NFIELDS);
    HOST_STRUCT(train_t, HA_TRAIN, "RtTrainSettings", RT_TRAIN_FIELDS, RT_TRAIN_NFIELDS);
    HOST_STRUCT(ramp_t, HA_RAMP, "RtRampStage", RT_RAMP_FIELDS, RT_RAMP_NFIELDS);
    HOST_STRUCT(gen_t, HA_GENERATE, "RtGenerateSettings", RT_GEN_FIELDS, RT_GEN_NFIELDS);
    HOST_STRUCT(plan_t, HA_PLAN_INFO, "RtPlanInfo", RT_PLAN_INFO_FIELDS, RT_PLAN_INFO_NFIELDS);
    HOST_STRUCT(kv_t, HA_KV_INFO, "RtKvInfo", RT_KV_INFO_FIELDS, RT_KV_INFO_NFIELDS);
    HOST_STRUCT(prog_t, HA_PROGRAM, "RtProgram", RT_PROG_FIELDS, RT_PROG_NFIELDS);
    LLVMTypeRef rargs[] = {P, I, I, W};
    h->range_fn_t = LLVMFunctionType(h->vd, rargs, 4, 0);
    LLVMTypeRef pargs[] = {P, I, P, P};
    h->pfor_t = LLVMFunctionType(h->vd, pargs, 4, 0);
    LLVMTypeRef gargs[] = {P, W, W, I, I, I, h->f32, P, I, I, P, I, I, h->f32, P, I, I, I, W, P, P};
    h->gemm_t = LLVMFunctionType(W, gargs, 21, 0);
    host_target_cpu.declare(h);
    HOST_STRUCT(gpu_image_t, HA_GPU_IMAGE, "RtGpuImage", RT_GPU_IMAGE_FIELDS, RT_GPU_IMAGE_NFIELDS);
    HOST_STRUCT(gpu_kernel_t, HA_GPU_KERNEL, "RtGpuKernel", RT_GPU_KERNEL_FIELDS, RT_GPU_KERNEL_NFIELDS);
    HOST_STRUCT(gpu_prog_t, HA_GPU_PROGRAM, "RtGpuProgram", RT_GPU_PROG_FIELDS, RT_GPU_PROG_NFIELDS);
}

/* ---- small builders --------------------------------------------------------------------------- */

LLVMValueRef ci64(Host *h, int64_t v) { return LLVMConstInt(h->i64, (unsigned long long)v, 1); }
LLVMValueRef ci32(Host *h, int64_t v) { return LLVMConstInt(h->i32, (unsigned long long)v, 1); }

LLVMValueRef step_field(Host *h, LLVMValueRef s, int field, LLVMTypeRef t, const char *name) {
    LLVMValueRef p = LLVMBuildStructGEP2(h->b, h->step_t, s, (unsigned)field, "");
    return LLVMBuildLoad2(h->b, t, p, name);
}

LLVMValueRef byte_gep(Host *h, LLVMValueRef base, int64_t off, const char *name) {
    if (!off) return base;
    LLVMValueRef idx = ci64(h, off);
    return LLVMBuildInBoundsGEP2(h->b, h->i8, base, &idx, 1, name);
}

LLVMValueRef str_const(Host *h, const char *s) {
    if (!s) return LLVMConstPointerNull(h->ptr);
    return LLVMBuildGlobalStringPtr(h->b, s, ".str");
}

/* for (j = 0; j < n; j++) dst[j] = mode 0: src[j]; 1: dst[j] + scale * src[j]; 2: value (f32) */
void emit_f32_loop(Host *h, LLVMValueRef fn, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef scale, int64_t n, int mode) {
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
LLVMValueRef begin_fn(Host *h, const char *name, LLVMTypeRef ret) {
    LLVMTypeRef args[1] = {h->ptr};
    name = arena_printf(h->ar, "%s%s", h->target->fn_prefix, name);
    LLVMValueRef fn = LLVMAddFunction(h->m, name, LLVMFunctionType(ret, args, 1, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, fn, "entry"));
    return fn;
}

/* begin_fn for an RtProgram function of h->target: its executor and RtStep.err loaded. */
HostFn host_fn_begin(Host *h, const char *name) {
    HostFn f;
    f.fn = begin_fn(h, name, h->i32);
    f.s = LLVMGetParam(f.fn, 0);
    f.exec = h->target->executor(h, f.s);
    f.err = step_field(h, f.s, RT_STEP_err, h->ptr, "err");
    return f;
}

/* Returns the status st from fn when it is not RT_OK (the callee filled RtStep.err). */
void emit_check(Host *h, LLVMValueRef fn, LLVMValueRef st) {
    LLVMBasicBlockRef fail = LLVMAppendBasicBlockInContext(h->ctx, fn, "failed");
    LLVMBasicBlockRef ok = LLVMAppendBasicBlockInContext(h->ctx, fn, "ok");
    LLVMBuildCondBr(h->b, LLVMBuildICmp(h->b, LLVMIntNE, st, ci32(h, 0), ""), fail, ok);
    LLVMPositionBuilderAtEnd(h->b, fail);
    LLVMBuildRet(h->b, st);
    LLVMPositionBuilderAtEnd(h->b, ok);
}

/* An array of n pointers on the stack holding v[0..n), for a callee that takes them as one. */
LLVMValueRef ptr_array(Host *h, LLVMValueRef const *v, int n, const char *name) {
    LLVMTypeRef arr_t = LLVMArrayType2(h->ptr, (uint64_t)(n ? n : 1));
    LLVMValueRef arr = LLVMBuildAlloca(h->b, arr_t, name);
    for (int i = 0; i < n; i++) {
        LLVMValueRef idx[2] = {ci64(h, 0), ci64(h, i)};
        LLVMBuildStore(h->b, v[i], LLVMBuildInBoundsGEP2(h->b, arr_t, arr, idx, 2, ""));
    }
    return arr;
}

LLVMValueRef named_struct(LLVMTypeRef t, LLVMValueRef *v, int n) {
    for (int i = 0; i < n; i++)
        if (!v[i]) INTERNAL("host: field %d of %s has no value", i, LLVMGetStructName(t));
    return LLVMConstNamedStruct(t, v, (unsigned)n);
}

/* A constant array of `t` rows as a private global (a null pointer when n is 0). */
LLVMValueRef table_global(Host *h, LLVMTypeRef t, LLVMValueRef *rows, int64_t n, const char *name) {
    if (n == 0) return LLVMConstPointerNull(h->ptr);
    LLVMValueRef g = LLVMAddGlobal(h->m, LLVMArrayType2(t, (uint64_t)n), name);
    LLVMSetInitializer(g, LLVMConstArray2(t, rows, (uint64_t)n));
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    return g;
}
