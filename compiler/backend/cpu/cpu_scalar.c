/* cpu_scalar.c - a scalar program (scalar.h) as an LLVM function `double NAME(int64_t)`. */
#include "cpu_scalar.h"

#include <stdlib.h>
#include <string.h>

#include "diag.h"

static LLVMValueRef intrinsic(LLVMModuleRef m, LLVMBuilderRef b, const char *name, LLVMValueRef *a, int n) {
    LLVMContextRef ctx = LLVMGetModuleContext(m);
    LLVMTypeRef ts[1] = {LLVMDoubleTypeInContext(ctx)};
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    if (!id) INTERNAL("cpu_scalar: no intrinsic %s", name);
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(m, id, ts, 1);
    return LLVMBuildCall2(b, LLVMIntrinsicGetType(ctx, id, ts, 1), f, a, (unsigned)n, "");
}

static LLVMValueRef inst(LLVMModuleRef m, LLVMBuilderRef b, const ScalarInst *in, LLVMValueRef *v, LLVMValueRef step) {
    LLVMContextRef ctx = LLVMGetModuleContext(m);
    LLVMTypeRef f64 = LLVMDoubleTypeInContext(ctx), i1 = LLVMInt1TypeInContext(ctx);
    LLVMValueRef a = in->a >= 0 ? v[in->a] : NULL, c = in->b >= 0 ? v[in->b] : NULL;
    LLVMValueRef two[2] = {a, c};
    static const char *const math[] = {
        [SC_TRUNC] = "llvm.trunc", [SC_COS] = "llvm.cos",    [SC_SIN] = "llvm.sin",  [SC_EXP] = "llvm.exp",
        [SC_LOG] = "llvm.log",     [SC_SQRT] = "llvm.sqrt",  [SC_ABS] = "llvm.fabs", [SC_POW] = "llvm.pow",
        [SC_MIN] = "llvm.minimum", [SC_MAX] = "llvm.maximum"};
    static const LLVMRealPredicate cmp[] = {[SC_EQ] = LLVMRealOEQ, [SC_NE] = LLVMRealUNE, [SC_LT] = LLVMRealOLT,
                                            [SC_LE] = LLVMRealOLE, [SC_GT] = LLVMRealOGT, [SC_GE] = LLVMRealOGE};
    switch (in->op) {
    case SC_CONST: return LLVMConstReal(f64, in->k);
    case SC_BCONST: return LLVMConstInt(i1, in->k != 0, 0);
    case SC_STEP: return step;
    case SC_NEG: return LLVMBuildFNeg(b, a, "");
    case SC_NOT: return LLVMBuildNot(b, a, "");
    case SC_TO_F64: return LLVMBuildUIToFP(b, a, f64, "");
    case SC_NONZERO: return LLVMBuildFCmp(b, LLVMRealUNE, a, LLVMConstReal(f64, 0), "");
    case SC_TRUNC:
    case SC_COS:
    case SC_SIN:
    case SC_EXP:
    case SC_LOG:
    case SC_SQRT:
    case SC_ABS: return intrinsic(m, b, math[in->op], two, 1);
    case SC_POW:
    case SC_MIN:
    case SC_MAX: return intrinsic(m, b, math[in->op], two, 2);
    case SC_ADD: return LLVMBuildFAdd(b, a, c, "");
    case SC_SUB: return LLVMBuildFSub(b, a, c, "");
    case SC_MUL: return LLVMBuildFMul(b, a, c, "");
    case SC_DIV: return LLVMBuildFDiv(b, a, c, "");
    case SC_MOD: return LLVMBuildFRem(b, a, c, "");
    case SC_EQ:
    case SC_NE:
    case SC_LT:
    case SC_LE:
    case SC_GT:
    case SC_GE: return LLVMBuildFCmp(b, cmp[in->op], a, c, "");
    case SC_AND: return LLVMBuildAnd(b, a, c, "");
    case SC_OR: return LLVMBuildOr(b, a, c, "");
    case SC_SELECT: return LLVMBuildSelect(b, a, c, v[in->c], "");
    default: INTERNAL("cpu_scalar: op %d", (int)in->op);
    }
}

LLVMValueRef cpu_scalar_function(LLVMModuleRef m, const ScalarProg *p, const char *name) {
    if (!p || scalar_verify(p, stderr)) INTERNAL("cpu_scalar: %s's scalar program fails scalar_verify", name);
    LLVMContextRef ctx = LLVMGetModuleContext(m);
    LLVMTypeRef f64 = LLVMDoubleTypeInContext(ctx);
    LLVMTypeRef args[1] = {LLVMInt64TypeInContext(ctx)};
    LLVMValueRef fn = LLVMAddFunction(m, name, LLVMFunctionType(f64, args, 1, 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(ctx, fn, "entry"));
    LLVMValueRef step = LLVMBuildSIToFP(b, LLVMGetParam(fn, 0), f64, "step");
    LLVMValueRef *v = calloc((size_t)p->n + 1, sizeof(LLVMValueRef));
    if (!v) INTERNAL("cpu_scalar: out of memory");
    for (int i = 0; i < p->n; i++) v[i] = inst(m, b, &p->v[i], v, step);
    LLVMBuildRet(b, v[p->result]);
    free(v);
    LLVMDisposeBuilder(b);
    return fn;
}
