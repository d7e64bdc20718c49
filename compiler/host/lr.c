/* lr.c - lr_schedule (RtProgram.lr_schedule): the train block's learning-rate function compiled
 * from its syntax tree to LLVM. */
#include <string.h>

#include "diag.h"
#include "host_internal.h"

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

LLVMValueRef emit_lr_schedule(Host *h) {
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
