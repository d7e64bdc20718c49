/* cpu.c - the CPU back end (cpu.h): lowers each Kernel to an LLVM IR function through the LLVM 19
 * C API, optimises the module for the host (new pass manager, default<O2>, vectorisation on),
 * writes object files and prints the module with the kernels' listings as comments.
 *
 * Pipeline position: fuse -> kir -> [cpu] -> object file linked with libmbtrt; compiler/host
 * (next) calls these functions from the step program through rt_parallel_for.
 *
 * Shape of a lowered kernel (names are the KIR's: %add12 is KIR value %12, an add):
 *
 *     define void @k3_scale(ptr %bufs, i64 %gid_begin, i64 %gid_end) {
 *     entry:                           ; buffer base pointers, one alloca per accumulator
 *       %p0 = load ptr, ptr %bufs.p0
 *       br label %gid.loop
 *     gid.loop:                        ; for gid in [gid_begin, gid_end)
 *       %gid = phi i64 [ %gid_begin, %entry ], [ %gid.next, ... ]
 *       br i1 %gid.more, label %work, label %done
 *     work:                            ; the KIR body, in order
 *       ...                            ; K_LOOP: loopN / loopN.body / loopN.end, counter %iN
 *       ...                            ; K_IF:   ifN.then / ifN.end
 *       br label %gid.loop
 *     done:
 *       ret void
 *
 * Values defined inside a loop or if are never used after it (the KIR's scoping), so no phi is
 * needed but the counters'; accumulators are allocas that mem2reg/SROA turn into phis. Everything
 * else - hoisting the index math, vectorising across work items - is left to LLVM's O2. Opaque
 * pointers throughout: every load, GEP and call is built with its type (the *2 builders). */
#include "cpu.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "diag.h"
#include "value.h"

/* ---- LLVM's strings ------------------------------------------------------------------------------ */

/* A copy in the arena of a string LLVM allocated, which is disposed (NULL gives ""). */
static const char *cpu_take_message(Arena *ar, char *msg) {
    const char *s = arena_printf(ar, "%s", msg ? msg : "");
    if (msg) LLVMDisposeMessage(msg);
    return s;
}

/* The message of an LLVMErrorRef, which is consumed. */
static const char *cpu_take_error(Arena *ar, LLVMErrorRef e) {
    char *msg = LLVMGetErrorMessage(e);
    const char *s = arena_printf(ar, "%s", msg ? msg : "");
    LLVMDisposeErrorMessage(msg);
    return s;
}

/* ---- the target ---------------------------------------------------------------------------------- */

int cpu_target_host(CpuTarget *t, Arena *ar, const char **err) {
    memset(t, 0, sizeof *t);
    if (LLVMInitializeNativeTarget()) {
        *err = "cannot initialise LLVM's native target (this LLVM was built without the host's target)";
        return 1;
    }
    if (LLVMInitializeNativeAsmPrinter()) {
        *err = "cannot initialise LLVM's code emitter for the host (this LLVM has no asm printer for it)";
        return 1;
    }
    char *raw = LLVMGetDefaultTargetTriple();
    t->triple = cpu_take_message(ar, LLVMNormalizeTargetTriple(raw));
    LLVMDisposeMessage(raw);
    t->cpu = cpu_take_message(ar, LLVMGetHostCPUName());
    t->features = cpu_take_message(ar, LLVMGetHostCPUFeatures());
    LLVMTargetRef target = NULL;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(t->triple, &target, &msg)) {
        *err = arena_printf(ar, "cannot find an LLVM target for %s: %s", t->triple, cpu_take_message(ar, msg));
        return 1;
    }
    if (msg) LLVMDisposeMessage(msg);
    t->tm = LLVMCreateTargetMachine(target, t->triple, t->cpu, t->features, LLVMCodeGenLevelDefault, LLVMRelocPIC,
                                    LLVMCodeModelDefault);
    if (!t->tm) {
        *err = arena_printf(ar, "cannot create target machine for %s (CPU %s)", t->triple, t->cpu);
        return 1;
    }
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(t->tm);
    t->layout = cpu_take_message(ar, LLVMCopyStringRepOfTargetData(td));
    LLVMDisposeTargetData(td);
    return 0;
}

void cpu_target_dispose(CpuTarget *t) {
    if (t->tm) LLVMDisposeTargetMachine(t->tm);
    t->tm = NULL;
}

LLVMModuleRef cpu_module_new(LLVMContextRef ctx, const CpuTarget *t, const char *name) {
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(name, ctx);
    LLVMSetTarget(m, t->triple);
    LLVMSetDataLayout(m, t->layout);
    return m;
}

/* ---- lowering: state and types ------------------------------------------------------------------- */

typedef struct CpuFrame {
    KOp op;                   /* K_LOOP or K_IF */
    int inst;                 /* its KIR id */
    LLVMValueRef counter;     /* K_LOOP: the counter's phi */
    LLVMBasicBlockRef header; /* K_LOOP: where the counter is tested */
    LLVMBasicBlockRef exit;   /* the block after the loop or if */
} CpuFrame;

typedef struct CpuLower {
    LLVMContextRef ctx;
    LLVMModuleRef m;
    LLVMBuilderRef b;        /* the body */
    LLVMBuilderRef at_entry; /* allocas, before the entry block's branch */
    LLVMValueRef fn;
    const Kernel *k;
    LLVMValueRef *val;    /* per KIR id: its value; for a K_ACC, its alloca */
    LLVMValueRef *narrow; /* per KIR id: an f16/bf16 value's 16-bit form when one was built */
    LLVMValueRef *base;   /* per buffer: its base pointer */
    LLVMValueRef *scope;  /* per buffer, when disjoint: its !alias.scope and !noalias lists */
    LLVMValueRef *noalias;
    CpuFrame *stack; /* open loops and ifs */
    int sp;
    LLVMTypeRef t_void, t_i1, t_i8, t_i16, t_i32, t_i64, t_half, t_f32, t_f64, t_ptr;
    Arena *scratch; /* value names, the arrays above; dropped when the kernel is done */
} CpuLower;

/* The LLVM type a KIR value is computed in: f16 and bf16 in f32, bool as i1, u64 as i64. */
static LLVMTypeRef cpu_value_type(const CpuLower *L, KType t) {
    switch (t) {
    case KT_BOOL: return L->t_i1;
    case KT_I32: return L->t_i32;
    case KT_I64:
    case KT_U64: return L->t_i64;
    case KT_F16:
    case KT_BF16:
    case KT_F32: return L->t_f32;
    case KT_F64: return L->t_f64;
    default: INTERNAL("cpu: %s: no LLVM type for a %s value", L->k->name, kir_type_name(t));
    }
}

/* The LLVM type a buffer element is stored as: bool one byte, bf16 its 16 bits. */
static LLVMTypeRef cpu_memory_type(const CpuLower *L, DType dt) {
    switch (dt) {
    case DT_F32: return L->t_f32;
    case DT_F64: return L->t_f64;
    case DT_F16: return L->t_half;
    case DT_BF16: return L->t_i16;
    case DT_I32: return L->t_i32;
    case DT_I64: return L->t_i64;
    case DT_BOOL: return L->t_i8;
    default: INTERNAL("cpu: %s: no memory type for dtype %d", L->k->name, (int)dt);
    }
}

static int cpu_is_float(KType t) { return kir_type_is_float(t); }
static int cpu_is_unsigned(KType t) { return t == KT_U64 || t == KT_BOOL; }

/* A value name: what it is and its KIR id ("add12"), with an optional suffix ("mod12.fix"); in
 * the lowering's scratch arena, so names built for one instruction never overwrite each other. */
static const char *cpu_name(CpuLower *L, const char *what, int id, const char *suffix) {
    return arena_printf(L->scratch, "%s%d%s%s", what, id, suffix ? "." : "", suffix ? suffix : "");
}

/* ---- lowering: calls ------------------------------------------------------------------------------ */

/* A call of an overloaded intrinsic ("llvm.exp" at type ty; two overload types for the
 * saturating casts), built with its function type. */
static LLVMValueRef cpu_intrinsic(CpuLower *L, const char *iname, LLVMTypeRef *over, int nover, LLVMValueRef *args, int nargs,
                                  const char *vname) {
    unsigned id = LLVMLookupIntrinsicID(iname, strlen(iname));
    if (!id) INTERNAL("cpu: LLVM 19 has no intrinsic %s", iname);
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(L->m, id, over, (size_t)nover);
    LLVMTypeRef fty = LLVMIntrinsicGetType(L->ctx, id, over, (size_t)nover);
    return LLVMBuildCall2(L->b, fty, f, args, (unsigned)nargs, vname);
}

static LLVMValueRef cpu_intrinsic1(CpuLower *L, const char *iname, LLVMValueRef x, const char *vname) {
    LLVMTypeRef ty = LLVMTypeOf(x);
    return cpu_intrinsic(L, iname, &ty, 1, &x, 1, vname);
}

static LLVMValueRef cpu_intrinsic2(CpuLower *L, const char *iname, LLVMValueRef x, LLVMValueRef y, const char *vname) {
    LLVMTypeRef ty = LLVMTypeOf(x);
    LLVMValueRef args[2] = {x, y};
    return cpu_intrinsic(L, iname, &ty, 1, args, 2, vname);
}

static void cpu_add_fn_attr(CpuLower *L, LLVMValueRef f, LLVMAttributeIndex idx, const char *attr, uint64_t v) {
    unsigned kind = LLVMGetEnumAttributeKindForName(attr, strlen(attr));
    if (!kind) INTERNAL("cpu: LLVM 19 has no attribute %s", attr);
    LLVMAddAttributeAtIndex(f, idx, LLVMCreateEnumAttribute(L->ctx, kind, v));
}

/* tanh has no intrinsic in LLVM 19: libm's tanhf / tanh, declared as touching no memory (glibc's
 * tanh sets no errno), so LLVM may hoist and vectorise around it. */
static LLVMValueRef cpu_libm1(CpuLower *L, const char *fname, LLVMValueRef x, const char *vname) {
    LLVMTypeRef ty = LLVMTypeOf(x);
    LLVMTypeRef fty = LLVMFunctionType(ty, &ty, 1, 0);
    LLVMValueRef f = LLVMGetNamedFunction(L->m, fname);
    if (!f) {
        f = LLVMAddFunction(L->m, fname, fty);
        cpu_add_fn_attr(L, f, LLVMAttributeFunctionIndex, "nounwind", 0);
        cpu_add_fn_attr(L, f, LLVMAttributeFunctionIndex, "willreturn", 0);
        cpu_add_fn_attr(L, f, LLVMAttributeFunctionIndex, "memory", 0); /* memory(none) */
    }
    LLVMValueRef call = LLVMBuildCall2(L->b, fty, f, &x, 1, vname);
    LLVMSetInstructionCallConv(call, LLVMCCallConv);
    return call;
}

/* ---- lowering: f16 and bf16 ------------------------------------------------------------------------ */

/* f32 -> bf16 bits, rounding to nearest even; a NaN stays a (quiet) NaN with its sign. */
static LLVMValueRef cpu_bf16_bits(CpuLower *L, LLVMValueRef x, int id) {
    LLVMBuilderRef b = L->b;
    LLVMValueRef bits = LLVMBuildBitCast(b, x, L->t_i32, cpu_name(L, "bf", id, "bits"));
    LLVMValueRef c16 = LLVMConstInt(L->t_i32, 16, 0);
    LLVMValueRef hi = LLVMBuildLShr(b, bits, c16, cpu_name(L, "bf", id, "hi"));
    LLVMValueRef lsb = LLVMBuildAnd(b, hi, LLVMConstInt(L->t_i32, 1, 0), cpu_name(L, "bf", id, "lsb"));
    LLVMValueRef bias = LLVMBuildAdd(b, lsb, LLVMConstInt(L->t_i32, 0x7FFF, 0), cpu_name(L, "bf", id, "bias"));
    LLVMValueRef sum = LLVMBuildAdd(b, bits, bias, cpu_name(L, "bf", id, "sum"));
    LLVMValueRef rne = LLVMBuildLShr(b, sum, c16, cpu_name(L, "bf", id, "rne"));
    LLVMValueRef qnan = LLVMBuildOr(b, hi, LLVMConstInt(L->t_i32, 0x40, 0), cpu_name(L, "bf", id, "qnan"));
    LLVMValueRef isnan = LLVMBuildFCmp(b, LLVMRealUNO, x, x, cpu_name(L, "bf", id, "isnan"));
    LLVMValueRef r = LLVMBuildSelect(b, isnan, qnan, rne, cpu_name(L, "bf", id, "r"));
    return LLVMBuildTrunc(b, r, L->t_i16, cpu_name(L, "bf", id, NULL));
}

/* bf16 bits -> f32 (exact): the bits are the top half of the f32's. */
static LLVMValueRef cpu_bf16_extend(CpuLower *L, LLVMValueRef bits16, int id, const char *vname) {
    LLVMValueRef w = LLVMBuildZExt(L->b, bits16, L->t_i32, cpu_name(L, "bf", id, "wide"));
    LLVMValueRef s = LLVMBuildShl(L->b, w, LLVMConstInt(L->t_i32, 16, 0), cpu_name(L, "bf", id, "f32bits"));
    return LLVMBuildBitCast(L->b, s, L->t_f32, vname);
}

/* An f32 value rounded to the precision of t (f16 or bf16), still as an f32; the 16-bit form is
 * remembered as value id's, so that storing it does not round it again. */
static LLVMValueRef cpu_round_to(CpuLower *L, LLVMValueRef x, KType t, int id, const char *vname) {
    if (t == KT_F16) {
        L->narrow[id] = LLVMBuildFPTrunc(L->b, x, L->t_half, cpu_name(L, "half", id, NULL));
        return LLVMBuildFPExt(L->b, L->narrow[id], L->t_f32, vname);
    }
    if (t == KT_BF16) {
        L->narrow[id] = cpu_bf16_bits(L, x, id);
        return cpu_bf16_extend(L, L->narrow[id], id, vname);
    }
    return x;
}

/* ---- lowering: operands, constants, memory ------------------------------------------------------- */

static LLVMValueRef cpu_const(CpuLower *L, KType t, double f, int64_t i) {
    if (cpu_is_float(t)) return LLVMConstReal(cpu_value_type(L, t), f);
    if (t == KT_BOOL) return LLVMConstInt(L->t_i1, i != 0, 0);
    return LLVMConstInt(cpu_value_type(L, t), (unsigned long long)i, 1);
}

/* Operand a: its value, or an accumulator's current value (a load of its alloca). */
static LLVMValueRef cpu_operand(CpuLower *L, int a) {
    const KInst *in = &L->k->inst[a];
    if (in->op == K_ACC) return LLVMBuildLoad2(L->b, cpu_value_type(L, in->type), L->val[a], cpu_name(L, "acc", a, "now"));
    if (!L->val[a]) INTERNAL("cpu: %s: %%%d used before it was lowered", L->k->name, a);
    return L->val[a];
}

/* The address of element off of buffer p, named after the load or store ("load7.addr"). */
static LLVMValueRef cpu_address(CpuLower *L, int p, LLVMValueRef off, const char *what, int id) {
    LLVMTypeRef et = cpu_memory_type(L, L->k->bufs[p].dt);
    return LLVMBuildInBoundsGEP2(L->b, et, L->base[p], &off, 1, cpu_name(L, what, id, "addr"));
}

/* With `disjoint`: the access to buffer p is in p's alias scope and in none of the others'. */
static void cpu_mark_access(CpuLower *L, LLVMValueRef access, int p) {
    if (!L->scope) return;
    LLVMSetMetadata(access, LLVMGetMDKindIDInContext(L->ctx, "alias.scope", 11), L->scope[p]);
    if (L->noalias[p]) LLVMSetMetadata(access, LLVMGetMDKindIDInContext(L->ctx, "noalias", 7), L->noalias[p]);
}

/* The alias scopes of `disjoint` (cpu.h): a domain per kernel, a scope per schedule buffer
 * (KBuf.buffer, so two parameters bound to one buffer share it), named after both
 * (`!"k3_add.b7"`): an access to p is in p's scope and declared not to alias the other scopes. */
static void cpu_alias_scopes(CpuLower *L) {
    const Kernel *k = L->k;
    LLVMMetadataRef dname = LLVMMDStringInContext2(L->ctx, k->name, strlen(k->name));
    LLVMMetadataRef domain = LLVMMDNodeInContext2(L->ctx, &dname, 1);
    LLVMMetadataRef *sc = arena_alloc(L->scratch, sizeof(LLVMMetadataRef) * (size_t)(k->nbufs + 1));
    LLVMMetadataRef *others = arena_alloc(L->scratch, sizeof(LLVMMetadataRef) * (size_t)(k->nbufs + 1));
    L->scope = arena_alloc(L->scratch, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
    L->noalias = arena_alloc(L->scratch, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
    for (int p = 0; p < k->nbufs; p++) {
        const char *nm = arena_printf(L->scratch, "%s.b%d", k->name, k->bufs[p].buffer);
        LLVMMetadataRef ops[2] = {LLVMMDStringInContext2(L->ctx, nm, strlen(nm)), domain};
        sc[p] = LLVMMDNodeInContext2(L->ctx, ops, 2); /* uniqued by its name: same buffer, same scope */
    }
    for (int p = 0; p < k->nbufs; p++) {
        L->scope[p] = LLVMMetadataAsValue(L->ctx, LLVMMDNodeInContext2(L->ctx, &sc[p], 1));
        int n = 0;
        for (int q = 0; q < k->nbufs; q++) {
            if (k->bufs[q].buffer == k->bufs[p].buffer) continue;
            int seen = 0;
            for (int r = 0; r < q; r++) seen |= k->bufs[r].buffer == k->bufs[q].buffer;
            if (!seen) others[n++] = sc[q];
        }
        L->noalias[p] = n ? LLVMMetadataAsValue(L->ctx, LLVMMDNodeInContext2(L->ctx, others, (size_t)n)) : NULL;
    }
}

static LLVMValueRef cpu_load(CpuLower *L, const KInst *in, int id) {
    DType dt = L->k->bufs[in->buf].dt;
    LLVMTypeRef et = cpu_memory_type(L, dt);
    LLVMValueRef addr = cpu_address(L, in->buf, cpu_operand(L, in->a[0]), "load", id);
    switch (dt) {
    case DT_BOOL: {
        LLVMValueRef byte = LLVMBuildLoad2(L->b, et, addr, cpu_name(L, "load", id, "byte"));
        cpu_mark_access(L, byte, in->buf);
        return LLVMBuildICmp(L->b, LLVMIntNE, byte, LLVMConstInt(L->t_i8, 0, 0), cpu_name(L, "load", id, NULL));
    }
    case DT_F16:
        L->narrow[id] = LLVMBuildLoad2(L->b, et, addr, cpu_name(L, "load", id, "half"));
        cpu_mark_access(L, L->narrow[id], in->buf);
        return LLVMBuildFPExt(L->b, L->narrow[id], L->t_f32, cpu_name(L, "load", id, NULL));
    case DT_BF16:
        L->narrow[id] = LLVMBuildLoad2(L->b, et, addr, cpu_name(L, "load", id, "bits"));
        cpu_mark_access(L, L->narrow[id], in->buf);
        return cpu_bf16_extend(L, L->narrow[id], id, cpu_name(L, "load", id, NULL));
    default: {
        LLVMValueRef v = LLVMBuildLoad2(L->b, et, addr, cpu_name(L, "load", id, NULL));
        cpu_mark_access(L, v, in->buf);
        return v;
    }
    }
}

static void cpu_store(CpuLower *L, const KInst *in, int id) {
    DType dt = L->k->bufs[in->buf].dt;
    LLVMValueRef v = cpu_operand(L, in->a[1]);
    LLVMValueRef addr = cpu_address(L, in->buf, cpu_operand(L, in->a[0]), "store", id);
    const KInst *src = &L->k->inst[in->a[1]];
    LLVMValueRef narrow = src->op != K_ACC ? L->narrow[in->a[1]] : NULL; /* already 16 bits */
    switch (dt) {
    case DT_BOOL: v = LLVMBuildZExt(L->b, v, L->t_i8, cpu_name(L, "store", id, "byte")); break;
    case DT_F16: v = narrow ? narrow : LLVMBuildFPTrunc(L->b, v, L->t_half, cpu_name(L, "store", id, "half")); break;
    case DT_BF16: v = narrow ? narrow : cpu_bf16_bits(L, v, id); break;
    default: break;
    }
    cpu_mark_access(L, LLVMBuildStore(L->b, v, addr), in->buf);
}

/* ---- lowering: arithmetic ---------------------------------------------------------------------------- */

/* NumPy's float remainder: r = fmod(x, y); r += y when r != 0 and r, y differ in sign; a zero
 * r takes y's sign. x mod 0 is NaN (fmod's). */
static LLVMValueRef cpu_fmod_numpy(CpuLower *L, LLVMValueRef x, LLVMValueRef y, int id) {
    LLVMBuilderRef b = L->b;
    LLVMValueRef zero = LLVMConstReal(LLVMTypeOf(x), 0.0);
    LLVMValueRef r = LLVMBuildFRem(b, x, y, cpu_name(L, "mod", id, "fmod"));
    LLVMValueRef rneg = LLVMBuildFCmp(b, LLVMRealOLT, r, zero, cpu_name(L, "mod", id, "rneg"));
    LLVMValueRef yneg = LLVMBuildFCmp(b, LLVMRealOLT, y, zero, cpu_name(L, "mod", id, "yneg"));
    LLVMValueRef differ = LLVMBuildXor(b, rneg, yneg, cpu_name(L, "mod", id, "differ"));
    LLVMValueRef nonzero = LLVMBuildFCmp(b, LLVMRealUNE, r, zero, cpu_name(L, "mod", id, "nonzero"));
    LLVMValueRef fix = LLVMBuildAnd(b, differ, nonzero, cpu_name(L, "mod", id, "fix"));
    LLVMValueRef ry = LLVMBuildFAdd(b, r, y, cpu_name(L, "mod", id, "plus"));
    LLVMValueRef adj = LLVMBuildSelect(b, fix, ry, r, cpu_name(L, "mod", id, "adj"));
    LLVMValueRef signed0 = cpu_intrinsic2(L, "llvm.copysign", zero, y, cpu_name(L, "mod", id, "zero"));
    LLVMValueRef iszero = LLVMBuildFCmp(b, LLVMRealOEQ, r, zero, cpu_name(L, "mod", id, "iszero"));
    return LLVMBuildSelect(b, iszero, signed0, adj, cpu_name(L, "mod", id, NULL));
}

/* NumPy's integer // and % (signed): floor division and the divisor's sign; a zero divisor
 * gives 0 for both, INT_MIN // -1 wraps to INT_MIN. Built without undefined behaviour: the
 * divisor is replaced by 1 where it is 0 or -1, and those results are chosen afterwards. */
static LLVMValueRef cpu_idivmod_numpy(CpuLower *L, LLVMValueRef x, LLVMValueRef y, int want_mod, int id) {
    LLVMBuilderRef b = L->b;
    const char *what = want_mod ? "mod" : "div";
    LLVMTypeRef ty = LLVMTypeOf(x);
    LLVMValueRef zero = LLVMConstInt(ty, 0, 0), one = LLVMConstInt(ty, 1, 0), minus1 = LLVMConstAllOnes(ty);
    LLVMValueRef y0 = LLVMBuildICmp(b, LLVMIntEQ, y, zero, cpu_name(L, what, id, "by0"));
    LLVMValueRef ym1 = LLVMBuildICmp(b, LLVMIntEQ, y, minus1, cpu_name(L, what, id, "bym1"));
    LLVMValueRef odd = LLVMBuildOr(b, y0, ym1, cpu_name(L, what, id, "odd"));
    LLVMValueRef ys = LLVMBuildSelect(b, odd, one, y, cpu_name(L, what, id, "divisor"));
    LLVMValueRef q = LLVMBuildSDiv(b, x, ys, cpu_name(L, what, id, "q"));
    LLVMValueRef r = LLVMBuildSRem(b, x, ys, cpu_name(L, what, id, "r"));
    LLVMValueRef rnz = LLVMBuildICmp(b, LLVMIntNE, r, zero, cpu_name(L, what, id, "rnz"));
    LLVMValueRef rneg = LLVMBuildICmp(b, LLVMIntSLT, r, zero, cpu_name(L, what, id, "rneg"));
    LLVMValueRef yneg = LLVMBuildICmp(b, LLVMIntSLT, y, zero, cpu_name(L, what, id, "yneg"));
    LLVMValueRef differ = LLVMBuildXor(b, rneg, yneg, cpu_name(L, what, id, "differ"));
    LLVMValueRef fix = LLVMBuildAnd(b, rnz, differ, cpu_name(L, what, id, "fix"));
    LLVMValueRef res;
    if (want_mod) {
        LLVMValueRef ry = LLVMBuildAdd(b, r, y, cpu_name(L, what, id, "plus"));
        res = LLVMBuildSelect(b, fix, ry, r, cpu_name(L, what, id, "floor"));
        /* y == -1: r is 0 already (x srem 1) */
    } else {
        LLVMValueRef qm = LLVMBuildSub(b, q, one, cpu_name(L, what, id, "minus"));
        res = LLVMBuildSelect(b, fix, qm, q, cpu_name(L, what, id, "floor"));
        LLVMValueRef neg = LLVMBuildSub(b, zero, x, cpu_name(L, what, id, "neg"));
        res = LLVMBuildSelect(b, ym1, neg, res, cpu_name(L, what, id, "m1"));
    }
    return LLVMBuildSelect(b, y0, zero, res, cpu_name(L, what, id, NULL));
}

/* u64 / and %: a zero divisor gives 0. */
static LLVMValueRef cpu_udivmod(CpuLower *L, LLVMValueRef x, LLVMValueRef y, int want_mod, int id) {
    LLVMBuilderRef b = L->b;
    const char *what = want_mod ? "mod" : "div";
    LLVMTypeRef ty = LLVMTypeOf(x);
    LLVMValueRef zero = LLVMConstInt(ty, 0, 0);
    LLVMValueRef y0 = LLVMBuildICmp(b, LLVMIntEQ, y, zero, cpu_name(L, what, id, "by0"));
    LLVMValueRef ys = LLVMBuildSelect(b, y0, LLVMConstInt(ty, 1, 0), y, cpu_name(L, what, id, "divisor"));
    LLVMValueRef r =
        want_mod ? LLVMBuildURem(b, x, ys, cpu_name(L, what, id, "r")) : LLVMBuildUDiv(b, x, ys, cpu_name(L, what, id, "q"));
    return LLVMBuildSelect(b, y0, zero, r, cpu_name(L, what, id, NULL));
}

/* Index arithmetic (idiv, imod). The KIR promises operands >= 0 (kir_ref refuses others), where
 * C's / and % are the unsigned ones: udiv/urem, which a power of two turns into a shift or a mask.
 * A divisor that is not a positive constant is guarded so a zero gives 0, not undefined
 * behaviour. */
static LLVMValueRef cpu_index_divmod(CpuLower *L, const KInst *in, LLVMValueRef x, LLVMValueRef y, int id) {
    const KInst *d = &L->k->inst[in->a[1]];
    int is_mod = in->op == K_IMOD;
    const char *what = kir_op_name(in->op);
    if (d->op == K_CONST && d->i > 0)
        return is_mod ? LLVMBuildURem(L->b, x, y, cpu_name(L, what, id, NULL))
                      : LLVMBuildUDiv(L->b, x, y, cpu_name(L, what, id, NULL));
    LLVMValueRef zero = LLVMConstInt(L->t_i64, 0, 0);
    LLVMValueRef y0 = LLVMBuildICmp(L->b, LLVMIntSLE, y, zero, cpu_name(L, what, id, "bad"));
    LLVMValueRef ys = LLVMBuildSelect(L->b, y0, LLVMConstInt(L->t_i64, 1, 0), y, cpu_name(L, what, id, "divisor"));
    LLVMValueRef r =
        is_mod ? LLVMBuildURem(L->b, x, ys, cpu_name(L, what, id, "r")) : LLVMBuildUDiv(L->b, x, ys, cpu_name(L, what, id, "q"));
    return LLVMBuildSelect(L->b, y0, zero, r, cpu_name(L, what, id, NULL));
}

static LLVMValueRef cpu_binary(CpuLower *L, const KInst *in, int id) {
    LLVMBuilderRef b = L->b;
    LLVMValueRef x = cpu_operand(L, in->a[0]), y = cpu_operand(L, in->a[1]);
    KType t = in->type;
    const char *nm = cpu_name(L, kir_op_name(in->op), id, NULL);
    if (cpu_is_float(t)) {
        switch (in->op) {
        case K_ADD: return LLVMBuildFAdd(b, x, y, nm);
        case K_SUB: return LLVMBuildFSub(b, x, y, nm);
        case K_MUL: return LLVMBuildFMul(b, x, y, nm);
        case K_DIV: return LLVMBuildFDiv(b, x, y, nm);
        case K_MOD: return cpu_fmod_numpy(L, x, y, id);
        case K_POW: return cpu_intrinsic2(L, "llvm.pow", x, y, nm);
        case K_MAX: return cpu_intrinsic2(L, "llvm.maximum", x, y, nm);
        case K_MIN: return cpu_intrinsic2(L, "llvm.minimum", x, y, nm);
        default: break;
        }
    } else if (t == KT_BOOL) {
        switch (in->op) { /* NumPy's bool arithmetic: + and max are or, * and min are and */
        case K_ADD:
        case K_MAX: return LLVMBuildOr(b, x, y, nm);
        case K_MUL:
        case K_MIN: return LLVMBuildAnd(b, x, y, nm);
        case K_SUB: return LLVMBuildXor(b, x, y, nm);
        default: break;
        }
    } else {
        int u = cpu_is_unsigned(t);
        switch (in->op) {
        case K_ADD: return LLVMBuildAdd(b, x, y, nm); /* wrapping: no nsw/nuw */
        case K_SUB: return LLVMBuildSub(b, x, y, nm);
        case K_MUL: return LLVMBuildMul(b, x, y, nm);
        case K_DIV: return u ? cpu_udivmod(L, x, y, 0, id) : cpu_idivmod_numpy(L, x, y, 0, id);
        case K_MOD: return u ? cpu_udivmod(L, x, y, 1, id) : cpu_idivmod_numpy(L, x, y, 1, id);
        case K_MAX: return cpu_intrinsic2(L, u ? "llvm.umax" : "llvm.smax", x, y, nm);
        case K_MIN: return cpu_intrinsic2(L, u ? "llvm.umin" : "llvm.smin", x, y, nm);
        case K_IDIV:
        case K_IMOD: return cpu_index_divmod(L, in, x, y, id);
        case K_XOR: return LLVMBuildXor(b, x, y, nm);
        case K_SHR: {
            const KInst *s = &L->k->inst[in->a[1]];
            if (s->op == K_CONST && (uint64_t)s->i < 64) return LLVMBuildLShr(b, x, y, nm);
            /* a shift by 64 or more is 0 (LLVM's lshr would be poison) */
            LLVMValueRef big = LLVMBuildICmp(b, LLVMIntUGE, y, LLVMConstInt(L->t_i64, 64, 0), cpu_name(L, "shr", id, "big"));
            LLVMValueRef ys = LLVMBuildAnd(b, y, LLVMConstInt(L->t_i64, 63, 0), cpu_name(L, "shr", id, "amount"));
            LLVMValueRef r = LLVMBuildLShr(b, x, ys, cpu_name(L, "shr", id, "r"));
            return LLVMBuildSelect(b, big, LLVMConstInt(L->t_i64, 0, 0), r, cpu_name(L, "shr", id, NULL));
        }
        default: break;
        }
    }
    INTERNAL("cpu: %s: %%%d: no lowering of %s on %s", L->k->name, id, kir_op_name(in->op), kir_type_name(t));
}

static LLVMValueRef cpu_unary(CpuLower *L, const KInst *in, int id) {
    LLVMValueRef x = cpu_operand(L, in->a[0]);
    KType t = in->type;
    const char *nm = cpu_name(L, kir_op_name(in->op), id, NULL);
    if (!cpu_is_float(t)) {
        if (in->op == K_NEG && t != KT_BOOL) return LLVMBuildSub(L->b, LLVMConstInt(LLVMTypeOf(x), 0, 0), x, nm);
        if (in->op == K_ABS && (t == KT_I32 || t == KT_I64)) {
            LLVMTypeRef ty = LLVMTypeOf(x);
            LLVMValueRef args[2] = {x, LLVMConstInt(L->t_i1, 0, 0)}; /* abs(INT_MIN) = INT_MIN, not poison */
            return cpu_intrinsic(L, "llvm.abs", &ty, 1, args, 2, nm);
        }
        if (in->op == K_ABS || (in->op == K_NEG && t == KT_BOOL)) return x; /* u64, bool; -x of a bool is x (kir_ref's) */
        INTERNAL("cpu: %s: %%%d: no lowering of %s on %s", L->k->name, id, kir_op_name(in->op), kir_type_name(t));
    }
    switch (in->op) {
    case K_NEG: return LLVMBuildFNeg(L->b, x, nm);
    case K_ABS: return cpu_intrinsic1(L, "llvm.fabs", x, nm);
    case K_EXP: return cpu_intrinsic1(L, "llvm.exp", x, nm);
    case K_LOG: return cpu_intrinsic1(L, "llvm.log", x, nm);
    case K_SQRT: return cpu_intrinsic1(L, "llvm.sqrt", x, nm);
    case K_SIN: return cpu_intrinsic1(L, "llvm.sin", x, nm);
    case K_COS: return cpu_intrinsic1(L, "llvm.cos", x, nm);
    case K_FLOOR: return cpu_intrinsic1(L, "llvm.floor", x, nm);
    case K_TANH: return cpu_libm1(L, t == KT_F64 ? "tanh" : "tanhf", x, nm);
    default: INTERNAL("cpu: %s: %%%d: no lowering of %s", L->k->name, id, kir_op_name(in->op));
    }
}

static LLVMValueRef cpu_compare(CpuLower *L, const KInst *in, int id) {
    LLVMValueRef x = cpu_operand(L, in->a[0]), y = cpu_operand(L, in->a[1]);
    KType t = L->k->inst[in->a[0]].type;
    const char *nm = cpu_name(L, kir_op_name(in->op), id, NULL);
    if (cpu_is_float(t)) { /* ordered, except != (true when either is NaN), as in C */
        static const LLVMRealPredicate fp[] = {LLVMRealOEQ, LLVMRealUNE, LLVMRealOLT, LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
        return LLVMBuildFCmp(L->b, fp[in->op - K_EQ], x, y, nm);
    }
    static const LLVMIntPredicate sp[] = {LLVMIntEQ, LLVMIntNE, LLVMIntSLT, LLVMIntSLE, LLVMIntSGT, LLVMIntSGE};
    static const LLVMIntPredicate up[] = {LLVMIntEQ, LLVMIntNE, LLVMIntULT, LLVMIntULE, LLVMIntUGT, LLVMIntUGE};
    return LLVMBuildICmp(L->b, (cpu_is_unsigned(t) ? up : sp)[in->op - K_EQ], x, y, nm);
}

static LLVMValueRef cpu_cast(CpuLower *L, const KInst *in, int id) {
    LLVMBuilderRef b = L->b;
    LLVMValueRef x = cpu_operand(L, in->a[0]);
    KType from = L->k->inst[in->a[0]].type, to = in->type;
    LLVMTypeRef ft = cpu_value_type(L, from), tt = cpu_value_type(L, to);
    const char *nm = cpu_name(L, "cast", id, NULL);
    if (from == to) return x;
    int narrow = to == KT_F16 || to == KT_BF16; /* rounded after the conversion to f32 */
    if (cpu_is_float(from) && cpu_is_float(to)) {
        /* to f16/bf16: one rounding from f32 (from f64, a second one after f64 -> f32) */
        LLVMValueRef v = x;
        if (ft != tt) {
            const char *vn = narrow ? cpu_name(L, "cast", id, "f32") : nm;
            v = from == KT_F64 ? LLVMBuildFPTrunc(b, x, tt, vn) : LLVMBuildFPExt(b, x, tt, vn);
        }
        return narrow ? cpu_round_to(L, v, to, id, cpu_name(L, "cast", id, NULL)) : v;
    }
    if (cpu_is_float(from)) {
        if (to == KT_BOOL) return LLVMBuildFCmp(b, LLVMRealUNE, x, LLVMConstReal(ft, 0.0), nm);
        LLVMTypeRef over[2] = {tt, ft}; /* truncates, saturates, NaN -> 0 */
        return cpu_intrinsic(L, to == KT_U64 ? "llvm.fptoui.sat" : "llvm.fptosi.sat", over, 2, &x, 1, nm);
    }
    if (cpu_is_float(to)) {
        const char *vn = narrow ? cpu_name(L, "cast", id, "f32") : nm;
        LLVMValueRef v = cpu_is_unsigned(from) ? LLVMBuildUIToFP(b, x, tt, vn) : LLVMBuildSIToFP(b, x, tt, vn);
        return narrow ? cpu_round_to(L, v, to, id, cpu_name(L, "cast", id, NULL)) : v;
    }
    if (to == KT_BOOL) return LLVMBuildICmp(b, LLVMIntNE, x, LLVMConstInt(ft, 0, 0), nm);
    if (ft == tt) return x;                                         /* i64 <-> u64 */
    return LLVMBuildIntCast2(b, x, tt, !cpu_is_unsigned(from), nm); /* sext i32, zext bool, trunc to i32 */
}

/* ---- lowering: accumulators and control ---------------------------------------------------------- */

static void cpu_accum(CpuLower *L, const KInst *in, int id) {
    int a = in->a[0];
    const KInst *acc = &L->k->inst[a];
    LLVMValueRef cur = cpu_operand(L, a), v = cpu_operand(L, in->a[1]), r = NULL;
    const char *nm = cpu_name(L, "acc", a, "next");
    int f = cpu_is_float(acc->type), u = cpu_is_unsigned(acc->type);
    switch (acc->aop) {
    case K_ADD: r = f ? LLVMBuildFAdd(L->b, cur, v, nm) : LLVMBuildAdd(L->b, cur, v, nm); break;
    case K_MAX: r = cpu_intrinsic2(L, f ? "llvm.maximum" : u ? "llvm.umax" : "llvm.smax", cur, v, nm); break;
    case K_MIN: r = cpu_intrinsic2(L, f ? "llvm.minimum" : u ? "llvm.umin" : "llvm.smin", cur, v, nm); break;
    default: INTERNAL("cpu: %s: %%%d: accumulator combine op %s", L->k->name, id, kir_op_name(acc->aop));
    }
    LLVMBuildStore(L->b, r, L->val[a]);
}

static void cpu_push(CpuLower *L, CpuFrame f) {
    if (L->sp >= L->k->n) INTERNAL("cpu: %s: control stack overflow", L->k->name);
    L->stack[L->sp++] = f;
}

static CpuFrame cpu_pop(CpuLower *L, KOp op, int id) {
    if (!L->sp || L->stack[L->sp - 1].op != op)
        INTERNAL("cpu: %s: %%%d: %s without its opening", L->k->name, id, kir_op_name(op));
    return L->stack[--L->sp];
}

/* K_LOOP: header (counter phi, test), body; the counter's latch edge is added at K_ENDLOOP. */
static void cpu_loop(CpuLower *L, const KInst *in, int id) {
    LLVMValueRef extent = in->nin ? cpu_operand(L, in->a[0]) : LLVMConstInt(L->t_i64, (unsigned long long)in->i, 1);
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(L->b);
    LLVMBasicBlockRef header = LLVMAppendBasicBlockInContext(L->ctx, L->fn, cpu_name(L, "loop", id, NULL));
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(L->ctx, L->fn, cpu_name(L, "loop", id, "body"));
    LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(L->ctx, L->fn, cpu_name(L, "loop", id, "end"));
    LLVMBuildBr(L->b, header);
    LLVMPositionBuilderAtEnd(L->b, header);
    LLVMValueRef i = LLVMBuildPhi(L->b, L->t_i64, cpu_name(L, "i", id, NULL));
    LLVMValueRef zero = LLVMConstInt(L->t_i64, 0, 0);
    LLVMAddIncoming(i, &zero, &pre, 1);
    LLVMValueRef more = LLVMBuildICmp(L->b, LLVMIntSLT, i, extent, cpu_name(L, "i", id, "more"));
    LLVMBuildCondBr(L->b, more, body, exit);
    LLVMPositionBuilderAtEnd(L->b, body);
    L->val[id] = i;
    cpu_push(L, (CpuFrame){K_LOOP, id, i, header, exit});
}

static void cpu_endloop(CpuLower *L, int id) {
    CpuFrame f = cpu_pop(L, K_LOOP, id);
    LLVMValueRef next = LLVMBuildNSWAdd(L->b, f.counter, LLVMConstInt(L->t_i64, 1, 0), cpu_name(L, "i", f.inst, "next"));
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(L->b);
    LLVMBuildBr(L->b, f.header);
    LLVMAddIncoming(f.counter, &next, &latch, 1);
    LLVMMoveBasicBlockAfter(f.exit, latch); /* blocks in the order of the KIR text */
    LLVMPositionBuilderAtEnd(L->b, f.exit);
}

static void cpu_if(CpuLower *L, const KInst *in, int id) {
    LLVMValueRef cond = cpu_operand(L, in->a[0]);
    LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(L->ctx, L->fn, cpu_name(L, "if", id, "then"));
    LLVMBasicBlockRef end = LLVMAppendBasicBlockInContext(L->ctx, L->fn, cpu_name(L, "if", id, "end"));
    LLVMBuildCondBr(L->b, cond, then, end);
    LLVMPositionBuilderAtEnd(L->b, then);
    cpu_push(L, (CpuFrame){K_IF, id, NULL, NULL, end});
}

static void cpu_endif(CpuLower *L, int id) {
    CpuFrame f = cpu_pop(L, K_IF, id);
    LLVMMoveBasicBlockAfter(f.exit, LLVMGetInsertBlock(L->b));
    LLVMBuildBr(L->b, f.exit);
    LLVMPositionBuilderAtEnd(L->b, f.exit);
}

/* ---- lowering: one instruction, one kernel ------------------------------------------------------- */

static void cpu_inst(CpuLower *L, int id) {
    const KInst *in = &L->k->inst[id];
    switch (in->op) {
    case K_CONST: L->val[id] = cpu_const(L, in->type, in->f, in->i); return;
    case K_GID: return; /* set before the body: the work-item loop's phi */
    case K_LOOP: cpu_loop(L, in, id); return;
    case K_ENDLOOP: cpu_endloop(L, id); return;
    case K_IF: cpu_if(L, in, id); return;
    case K_ENDIF: cpu_endif(L, id); return;
    case K_ACC: {
        LLVMTypeRef ty = cpu_value_type(L, in->type);
        L->val[id] = LLVMBuildAlloca(L->at_entry, ty, cpu_name(L, "acc", id, NULL));
        LLVMBuildStore(L->b, cpu_const(L, in->type, in->f, in->i), L->val[id]); /* (re)initialised here */
        return;
    }
    case K_ACCUM: cpu_accum(L, in, id); return;
    case K_LOAD: L->val[id] = cpu_load(L, in, id); return;
    case K_STORE: cpu_store(L, in, id); return;
    case K_SELECT: {
        LLVMValueRef c = cpu_operand(L, in->a[0]), x = cpu_operand(L, in->a[1]), y = cpu_operand(L, in->a[2]);
        L->val[id] = LLVMBuildSelect(L->b, c, x, y, cpu_name(L, "select", id, NULL));
        return;
    }
    case K_CAST: L->val[id] = cpu_cast(L, in, id); return;
    case K_AND:
        L->val[id] = LLVMBuildAnd(L->b, cpu_operand(L, in->a[0]), cpu_operand(L, in->a[1]), cpu_name(L, "and", id, NULL));
        return;
    case K_OR:
        L->val[id] = LLVMBuildOr(L->b, cpu_operand(L, in->a[0]), cpu_operand(L, in->a[1]), cpu_name(L, "or", id, NULL));
        return;
    case K_NOT: L->val[id] = LLVMBuildNot(L->b, cpu_operand(L, in->a[0]), cpu_name(L, "not", id, NULL)); return;
    default: break;
    }
    if (in->op >= K_ADD && in->op <= K_SHR) L->val[id] = cpu_binary(L, in, id);
    else if (in->op >= K_NEG && in->op <= K_FLOOR) L->val[id] = cpu_unary(L, in, id);
    else if (in->op >= K_EQ && in->op <= K_GE) L->val[id] = cpu_compare(L, in, id);
    else INTERNAL("cpu: %s: %%%d: unknown op %d", L->k->name, id, (int)in->op);
}

LLVMValueRef cpu_lower_kernel(LLVMModuleRef m, const Kernel *k, int disjoint) {
    if (kir_verify(k, stderr)) INTERNAL("cpu: kernel %s fails kir_verify (problems above)", k->name);
    if (LLVMGetNamedFunction(m, k->name)) INTERNAL("cpu: two kernels named %s in one module", k->name);
    Arena scratch = {0};
    CpuLower L = {0};
    L.ctx = LLVMGetModuleContext(m);
    L.m = m;
    L.k = k;
    L.scratch = &scratch;
    L.t_void = LLVMVoidTypeInContext(L.ctx);
    L.t_i1 = LLVMInt1TypeInContext(L.ctx);
    L.t_i8 = LLVMInt8TypeInContext(L.ctx);
    L.t_i16 = LLVMInt16TypeInContext(L.ctx);
    L.t_i32 = LLVMInt32TypeInContext(L.ctx);
    L.t_i64 = LLVMInt64TypeInContext(L.ctx);
    L.t_half = LLVMHalfTypeInContext(L.ctx);
    L.t_f32 = LLVMFloatTypeInContext(L.ctx);
    L.t_f64 = LLVMDoubleTypeInContext(L.ctx);
    L.t_ptr = LLVMPointerTypeInContext(L.ctx, 0);
    L.val = arena_alloc(&scratch, sizeof(LLVMValueRef) * (size_t)(k->n + 1));
    L.narrow = arena_alloc(&scratch, sizeof(LLVMValueRef) * (size_t)(k->n + 1));
    L.base = arena_alloc(&scratch, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
    L.stack = arena_alloc(&scratch, sizeof(CpuFrame) * (size_t)(k->n + 1));
    if (disjoint) cpu_alias_scopes(&L);

    /* void NAME(ptr bufs, i64 gid_begin, i64 gid_end) */
    LLVMTypeRef params[3] = {L.t_ptr, L.t_i64, L.t_i64};
    LLVMTypeRef fty = LLVMFunctionType(L.t_void, params, 3, 0);
    L.fn = LLVMAddFunction(m, k->name, fty);
    cpu_add_fn_attr(&L, L.fn, LLVMAttributeFunctionIndex, "nounwind", 0);
    cpu_add_fn_attr(&L, L.fn, 1, "nocapture", 0);
    cpu_add_fn_attr(&L, L.fn, 1, "readonly", 0);
    LLVMValueRef bufs = LLVMGetParam(L.fn, 0), gid_begin = LLVMGetParam(L.fn, 1), gid_end = LLVMGetParam(L.fn, 2);
    LLVMSetValueName2(bufs, "bufs", 4);
    LLVMSetValueName2(gid_begin, "gid_begin", 9);
    LLVMSetValueName2(gid_end, "gid_end", 7);

    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(L.ctx, L.fn, "entry");
    LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(L.ctx, L.fn, "gid.loop");
    LLVMBasicBlockRef work = LLVMAppendBasicBlockInContext(L.ctx, L.fn, "work");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(L.ctx, L.fn, "done");
    L.b = LLVMCreateBuilderInContext(L.ctx);
    L.at_entry = LLVMCreateBuilderInContext(L.ctx);

    /* entry: the buffers' base pointers, then (before the branch) the accumulators' allocas */
    LLVMPositionBuilderAtEnd(L.b, entry);
    for (int p = 0; p < k->nbufs; p++) {
        LLVMValueRef idx = LLVMConstInt(L.t_i64, (unsigned long long)p, 0);
        LLVMValueRef slot = LLVMBuildInBoundsGEP2(L.b, L.t_ptr, bufs, &idx, 1, cpu_name(&L, "bufs.p", p, NULL));
        L.base[p] = LLVMBuildLoad2(L.b, L.t_ptr, slot, cpu_name(&L, "p", p, NULL));
    }
    LLVMValueRef to_head = LLVMBuildBr(L.b, head);
    LLVMPositionBuilderBefore(L.at_entry, to_head);

    /* gid.loop: for gid in [gid_begin, gid_end) */
    LLVMPositionBuilderAtEnd(L.b, head);
    LLVMValueRef gid = LLVMBuildPhi(L.b, L.t_i64, "gid");
    LLVMAddIncoming(gid, &gid_begin, &entry, 1);
    LLVMValueRef more = LLVMBuildICmp(L.b, LLVMIntSLT, gid, gid_end, "gid.more");
    LLVMBuildCondBr(L.b, more, work, done);

    /* work: the body, then the next work item */
    LLVMPositionBuilderAtEnd(L.b, work);
    for (int i = 0; i < k->n; i++) {
        if (k->inst[i].op == K_GID) L.val[i] = gid;
        cpu_inst(&L, i);
    }
    if (L.sp) INTERNAL("cpu: %s: %d loops or ifs left open", k->name, L.sp);
    LLVMValueRef next = LLVMBuildNSWAdd(L.b, gid, LLVMConstInt(L.t_i64, 1, 0), "gid.next");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(L.b);
    LLVMBuildBr(L.b, head);
    LLVMAddIncoming(gid, &next, &latch, 1);

    LLVMMoveBasicBlockAfter(done, latch);
    LLVMPositionBuilderAtEnd(L.b, done);
    LLVMBuildRetVoid(L.b);
    LLVMDisposeBuilder(L.b);
    LLVMDisposeBuilder(L.at_entry);
    arena_free(&scratch);

    if (LLVMVerifyFunction(L.fn, LLVMReturnStatusAction)) {
        char *msg = NULL;
        LLVMVerifyModule(m, LLVMReturnStatusAction, &msg);
        fprintf(stderr, "%s", msg ? msg : "");
        if (msg) LLVMDisposeMessage(msg);
        LLVMDumpValue(L.fn);
        INTERNAL("cpu: the LLVM function of kernel %s fails LLVMVerifyFunction (report and function above)", k->name);
    }
    return L.fn;
}

/* ---- verifying, optimising, object files ---------------------------------------------------------- */

int cpu_verify(LLVMModuleRef m, Arena *ar, const char **err) {
    char *msg = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &msg)) {
        *err = cpu_take_message(ar, msg);
        return 1;
    }
    if (msg) LLVMDisposeMessage(msg);
    return 0;
}

int cpu_optimize(LLVMModuleRef m, const CpuTarget *t, Arena *ar, const char **err) {
    const char *why;
    if (cpu_verify(m, ar, &why)) {
        *err = arena_printf(ar, "the kernels' LLVM module fails LLVMVerifyModule before optimisation: %s", why);
        return 1;
    }
    LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(opts, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(opts, 1);
    LLVMPassBuilderOptionsSetLoopInterleaving(opts, 1);
    LLVMPassBuilderOptionsSetLoopUnrolling(opts, 1);
    LLVMErrorRef e = LLVMRunPasses(m, "default<O2>", t->tm, opts);
    LLVMDisposePassBuilderOptions(opts);
    if (e) {
        *err =
            arena_printf(ar, "cannot optimise the kernels' LLVM module (default<O2> for %s): %s", t->cpu, cpu_take_error(ar, e));
        return 1;
    }
    if (cpu_verify(m, ar, &why)) {
        *err = arena_printf(ar, "the kernels' LLVM module fails LLVMVerifyModule after optimisation: %s", why);
        return 1;
    }
    return 0;
}

int cpu_emit_object(LLVMModuleRef m, const CpuTarget *t, const char *path, Arena *ar, const char **err) {
    /* code generation rewrites the IR it is given (CodeGenPrepare ...): it works on a copy, so
     * the caller's module stays as it was (to print, or to run) */
    LLVMModuleRef copy = LLVMCloneModule(m);
    char *msg = NULL;
    LLVMBool failed = LLVMTargetMachineEmitToFile(t->tm, copy, path, LLVMObjectFile, &msg);
    LLVMDisposeModule(copy);
    if (failed) {
        *err = arena_printf(ar, "cannot write object file '%s': %s", path, cpu_take_message(ar, msg));
        return 1;
    }
    if (msg) LLVMDisposeMessage(msg);
    return 0;
}

/* ---- printing -------------------------------------------------------------------------------------- */

/* text as `;` lines, each prefixed with lead. */
static void cpu_comment_lines(FILE *out, const char *lead, const char *text) {
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, '\n');
        int n = e ? (int)(e - p) : (int)strlen(p);
        fprintf(out, ";%s%.*s\n", lead, n, p);
        p += n + (e ? 1 : 0);
    }
}

static void cpu_print_kernel_header(FILE *out, const Kernel *k, const char *note) {
    fprintf(out, "; kernel %s: %s, grid %" PRId64, k->name, kir_kind_name(k->kind), k->grid);
    if (k->nsegments > 1) fprintf(out, ", %d segments", k->nsegments);
    fprintf(out, " (runs gid in [gid_begin, gid_end) of [0, %" PRId64 "))\n", k->grid);
    for (int p = 0; p < k->nbufs; p++) {
        const KBuf *bf = &k->bufs[p];
        fprintf(out, ";   bufs[%d] = p%d: %s[", p, p, dtype_name(bf->dt));
        for (int d = 0; d < bf->rank; d++) fprintf(out, "%s%" PRId64, d ? ", " : "", bf->shape[d]);
        fprintf(out, "] %s, buffer %d", bf->written ? "written" : "read", bf->buffer);
        if (bf->node >= 0) fprintf(out, " (%%%d)", bf->node);
        fprintf(out, "\n");
    }
    if (note && *note) {
        fprintf(out, "; fuses:\n");
        cpu_comment_lines(out, "   ", note);
    }
    char *body = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&body, &len);
    if (!mem) INTERNAL("cpu: cannot open a memory stream to print kernel %s", k->name);
    kir_print_body(mem, k, 2);
    if (fclose(mem) != 0) INTERNAL("cpu: cannot print kernel %s to memory", k->name);
    fprintf(out, "; kir:\n");
    cpu_comment_lines(out, " ", body ? body : "");
    free(body);
}

/* The kernel a `define` line defines, or -1 (a line of another kind, a function of another name). */
static int cpu_defined_kernel(const char *line, size_t n, Kernel *const *kernels, int nkernels) {
    if (n <= 7 || strncmp(line, "define ", 7) != 0) return -1;
    const char *at = memchr(line, '@', n);
    const char *paren = at ? memchr(at, '(', n - (size_t)(at - line)) : NULL;
    for (int i = 0; paren && i < nkernels; i++) {
        size_t len = strlen(kernels[i]->name);
        if ((size_t)(paren - at - 1) == len && strncmp(at + 1, kernels[i]->name, len) == 0) return i;
    }
    return -1;
}

void cpu_print_module(FILE *out, LLVMModuleRef m, Kernel *const *kernels, const char *const *notes, int nkernels,
                      const CpuAnnotation *ann, int nann) {
    char *text = LLVMPrintModuleToString(m);
    const char *p = text;
    int announced = 0; /* the line before was `; Function Attrs:` and the listing went above it */
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *next = e ? e + 1 : p + n;
        int k = cpu_defined_kernel(p, n, kernels, nkernels);
        if (k < 0 && n >= 17 && strncmp(p, "; Function Attrs:", 17) == 0) {
            const char *ne = strchr(next, '\n');
            k = cpu_defined_kernel(next, ne ? (size_t)(ne - next) : strlen(next), kernels, nkernels);
            if (k >= 0) cpu_print_kernel_header(out, kernels[k], notes ? notes[k] : NULL);
            announced = k >= 0;
        } else {
            if (k >= 0 && !announced) cpu_print_kernel_header(out, kernels[k], notes ? notes[k] : NULL);
            announced = 0;
        }
        for (int a = 0; a < nann; a++)
            if (memmem(p, n, ann[a].needle, strlen(ann[a].needle)) && memmem(p, n, "call ", 5))
                fprintf(out, "  ; %s\n", ann[a].comment);
        fprintf(out, "%.*s\n", (int)n, p);
        p = next;
    }
    LLVMDisposeMessage(text);
}
