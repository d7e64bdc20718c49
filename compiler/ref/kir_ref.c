/* kir_ref.c - the kernel IR interpreter (kir_ref.h): kernels instruction by instruction, GEMMs by a
 * naive triple loop, in double precision.
 *
 * Pipeline position: beside the back ends: an oracle, not a stage of what -o builds (mbtc links ref.c only for --verify-step). The tests run a fused schedule
 * here and compare it with the reference evaluator (ref.c) on the unfused graph; a future CPU
 * back end is compared with this. Semantics are kir.h's: floats in double (no rounding to f32),
 * integer arithmetic in 64 bits (i32 results wrapped to 32), u64 wrapping, NumPy's remainder,
 * NaN-propagating max/min, a cast from float to integer truncating. */
#include "kir_ref.h"
#include "ref.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "diag.h"

typedef union KVal {
    double f;
    int64_t i;
    uint64_t u;
} KVal;

/* ---- scalar semantics ---------------------------------------------------------------------------- */

static int64_t kr_wrap(KType t, int64_t v) { return t == KT_I32 ? (int64_t)(int32_t)v : t == KT_BOOL ? v != 0 : v; }

static double kr_fmax(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double kr_fmin(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }

/* A double truncated to an integer without undefined behaviour (NaN and overflow saturate). */
static int64_t kr_trunc(double x) {
    if (isnan(x)) return 0;
    if (x >= 9.2233720368547758e18) return INT64_MAX;
    if (x <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)trunc(x);
}

static KVal kr_binary(KOp op, KType t, KVal a, KVal b) {
    KVal r = {.i = 0};
    if (kir_type_is_float(t)) {
        switch (op) {
        case K_ADD: r.f = a.f + b.f; break;
        case K_SUB: r.f = a.f - b.f; break;
        case K_MUL: r.f = a.f * b.f; break;
        case K_DIV: r.f = a.f / b.f; break;
        case K_MOD: r.f = ref_mod(a.f, b.f); break;
        case K_POW: r.f = pow(a.f, b.f); break;
        case K_MAX: r.f = kr_fmax(a.f, b.f); break;
        case K_MIN: r.f = kr_fmin(a.f, b.f); break;
        default: INTERNAL("kir_ref: %s on %s", kir_op_name(op), kir_type_name(t));
        }
        return r;
    }
    if (t == KT_U64) {
        switch (op) {
        case K_ADD: r.u = a.u + b.u; break;
        case K_SUB: r.u = a.u - b.u; break;
        case K_MUL: r.u = a.u * b.u; break;
        case K_XOR: r.u = a.u ^ b.u; break;
        case K_SHR: r.u = b.u < 64 ? a.u >> b.u : 0; break;
        case K_MAX: r.u = a.u > b.u ? a.u : b.u; break;
        case K_MIN: r.u = a.u < b.u ? a.u : b.u; break;
        default: INTERNAL("kir_ref: %s on u64", kir_op_name(op));
        }
        return r;
    }
    uint64_t ua = (uint64_t)a.i, ub = (uint64_t)b.i;
    switch (op) {
    case K_ADD: r.i = (int64_t)(ua + ub); break;
    case K_SUB: r.i = (int64_t)(ua - ub); break;
    case K_MUL: r.i = (int64_t)(ua * ub); break;
    case K_DIV: /* floor division; by zero gives 0 (never generated) */
        r.i = b.i == 0 || (a.i == INT64_MIN && b.i == -1) ? 0 : a.i / b.i - ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0)));
        break;
    case K_MOD: {
        int64_t m = b.i == 0 || b.i == -1 ? 0 : a.i % b.i;
        if (m != 0 && ((m < 0) != (b.i < 0))) m += b.i;
        r.i = m;
        break;
    }
    case K_POW: r.i = kr_trunc(pow((double)a.i, (double)b.i)); break;
    case K_MAX: r.i = a.i > b.i ? a.i : b.i; break;
    case K_MIN: r.i = a.i < b.i ? a.i : b.i; break;
    case K_IDIV:
    case K_IMOD:
        if (a.i < 0 || b.i <= 0) INTERNAL("kir_ref: %s of %" PRId64 " by %" PRId64, kir_op_name(op), a.i, b.i);
        r.i = op == K_IDIV ? a.i / b.i : a.i % b.i;
        break;
    case K_AND: r.i = a.i && b.i; break;
    case K_OR: r.i = a.i || b.i; break;
    default: INTERNAL("kir_ref: %s on %s", kir_op_name(op), kir_type_name(t));
    }
    r.i = kr_wrap(t, r.i);
    return r;
}

static KVal kr_unary(KOp op, KType t, KVal a) {
    KVal r = {.i = 0};
    if (kir_type_is_float(t)) {
        switch (op) {
        case K_NEG: r.f = -a.f; break;
        case K_ABS: r.f = fabs(a.f); break;
        case K_EXP: r.f = exp(a.f); break;
        case K_LOG: r.f = log(a.f); break;
        case K_SQRT: r.f = sqrt(a.f); break;
        case K_TANH: r.f = tanh(a.f); break;
        case K_SIN: r.f = sin(a.f); break;
        case K_COS: r.f = cos(a.f); break;
        case K_FLOOR: r.f = floor(a.f); break;
        default: INTERNAL("kir_ref: %s on %s", kir_op_name(op), kir_type_name(t));
        }
        return r;
    }
    switch (op) {
    case K_NEG: r.i = (int64_t)(0 - (uint64_t)a.i); break;
    case K_ABS: r.i = a.i < 0 ? (int64_t)(0 - (uint64_t)a.i) : a.i; break;
    case K_NOT: r.i = !a.i; break;
    default: INTERNAL("kir_ref: %s on %s", kir_op_name(op), kir_type_name(t));
    }
    r.i = kr_wrap(t, r.i);
    return r;
}

static int kr_compare(KOp op, KType t, KVal a, KVal b) {
    if (kir_type_is_float(t)) {
        switch (op) {
        case K_EQ: return a.f == b.f;
        case K_NE: return a.f != b.f;
        case K_LT: return a.f < b.f;
        case K_LE: return a.f <= b.f;
        case K_GT: return a.f > b.f;
        default: return a.f >= b.f;
        }
    }
    if (t == KT_U64) {
        switch (op) {
        case K_EQ: return a.u == b.u;
        case K_NE: return a.u != b.u;
        case K_LT: return a.u < b.u;
        case K_LE: return a.u <= b.u;
        case K_GT: return a.u > b.u;
        default: return a.u >= b.u;
        }
    }
    switch (op) {
    case K_EQ: return a.i == b.i;
    case K_NE: return a.i != b.i;
    case K_LT: return a.i < b.i;
    case K_LE: return a.i <= b.i;
    case K_GT: return a.i > b.i;
    default: return a.i >= b.i;
    }
}

static KVal kr_cast(KType to, KType from, KVal a) {
    KVal r = {.i = 0};
    int ff = kir_type_is_float(from), tf = kir_type_is_float(to);
    if (tf) {
        r.f = ff ? a.f : from == KT_U64 ? (double)a.u : (double)a.i;
    } else if (to == KT_BOOL) {
        r.i = ff ? a.f != 0 : a.i != 0;
    } else if (to == KT_U64) {
        r.u = ff ? (uint64_t)kr_trunc(a.f) : (uint64_t)a.i;
    } else {
        r.i = kr_wrap(to, ff ? kr_trunc(a.f) : a.i);
    }
    return r;
}

/* ---- kernels ---------------------------------------------------------------------------------------- */

static int64_t kr_numel(const KBuf *b) {
    int64_t n = 1;
    for (int i = 0; i < b->rank; i++) n *= b->shape[i];
    return n;
}

int kir_ref_kernel(const Kernel *k, double *const *bufs) {
    int n = k->n;
    Arena scratch = {0};
    KVal *v = arena_alloc(&scratch, sizeof(KVal) * (size_t)(n + 1));
    int *match = arena_alloc(&scratch, sizeof(int) * (size_t)(n + 1));
    int *stack = arena_alloc(&scratch, sizeof(int) * (size_t)(n + 1));
    int64_t *count = arena_alloc(&scratch, sizeof(int64_t) * (size_t)(n + 1));
    int64_t *extent = arena_alloc(&scratch, sizeof(int64_t) * (size_t)(n + 1));
    int64_t *numel = arena_alloc(&scratch, sizeof(int64_t) * (size_t)(k->nbufs + 1));
    for (int b = 0; b < k->nbufs; b++) numel[b] = kr_numel(&k->bufs[b]);
    int sp = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        KOp op = k->inst[i].op;
        if (op == K_LOOP || op == K_IF) stack[sp++] = i;
        if (op == K_ENDLOOP || op == K_ENDIF) {
            if (!sp) INTERNAL("kir_ref: %s: unbalanced %s", k->name, kir_op_name(op));
            int o = stack[--sp];
            match[o] = i;
            match[i] = o;
        }
    }
    for (int i = 0; i < n; i++)
        if (k->inst[i].op == K_CONST) {
            if (kir_type_is_float(k->inst[i].type)) v[i].f = k->inst[i].f;
            else v[i].i = k->inst[i].i;
        }
    for (int64_t gid = 0; gid < k->grid && !rc; gid++) {
        sp = 0;
        for (int pc = 0; pc < n;) {
            const KInst *in = &k->inst[pc];
            KVal a = in->nin > 0 ? v[in->a[0]] : (KVal){.i = 0};
            KVal b = in->nin > 1 ? v[in->a[1]] : (KVal){.i = 0};
            KType ta = in->nin > 0 ? k->inst[in->a[0]].type : KT_VOID;
            switch (in->op) {
            case K_CONST: break;
            case K_GID: v[pc].i = gid; break;
            case K_LOOP: {
                int64_t e = in->nin ? a.i : in->i;
                if (e <= 0) {
                    pc = match[pc] + 1;
                    continue;
                }
                stack[sp++] = pc;
                count[pc] = 0;
                extent[pc] = e;
                v[pc].i = 0;
                break;
            }
            case K_ENDLOOP: {
                int o = stack[sp - 1];
                if (++count[o] < extent[o]) {
                    v[o].i = count[o];
                    pc = o + 1;
                    continue;
                }
                sp--;
                break;
            }
            case K_IF:
                if (!a.i) {
                    pc = match[pc] + 1;
                    continue;
                }
                break;
            case K_ENDIF: break;
            case K_ACC:
                if (kir_type_is_float(in->type)) v[pc].f = in->f;
                else v[pc].i = in->i;
                break;
            case K_ACCUM: {
                const KInst *acc = &k->inst[in->a[0]];
                v[in->a[0]] = kr_binary(acc->aop, acc->type, a, b);
                break;
            }
            case K_LOAD:
            case K_STORE: {
                const KBuf *kb = &k->bufs[in->buf];
                if (a.i < 0 || a.i >= numel[in->buf]) {
                    diag_error_noloc("kernel %s: %%%d: %s at %" PRId64 " outside p%d's %" PRId64 " elements (work item %" PRId64
                                     ")",
                                     k->name ? k->name : "?", pc, kir_op_name(in->op), a.i, in->buf, numel[in->buf], gid);
                    rc = -1;
                    pc = n;
                    continue;
                }
                double *cell = &bufs[in->buf][a.i];
                KType bt = kir_type_of(kb->dt);
                if (in->op == K_LOAD) {
                    if (kir_type_is_float(bt)) v[pc].f = *cell;
                    else v[pc].i = kr_wrap(bt, kr_trunc(*cell));
                } else {
                    *cell = kir_type_is_float(bt) ? b.f : (double)kr_wrap(bt, b.i);
                }
                break;
            }
            case K_SELECT: v[pc] = a.i ? b : v[in->a[2]]; break;
            case K_CAST: v[pc] = kr_cast(in->type, ta, a); break;
            case K_EQ:
            case K_NE:
            case K_LT:
            case K_LE:
            case K_GT:
            case K_GE: v[pc].i = kr_compare(in->op, ta, a, b); break;
            case K_NEG:
            case K_ABS:
            case K_EXP:
            case K_LOG:
            case K_SQRT:
            case K_TANH:
            case K_SIN:
            case K_COS:
            case K_FLOOR:
            case K_NOT: v[pc] = kr_unary(in->op, in->type, a); break;
            default: v[pc] = kr_binary(in->op, in->type, a, b); break;
            }
            pc++;
        }
    }
    arena_free(&scratch);
    return rc;
}

/* ---- GEMMs and schedules ---------------------------------------------------------------------------- */

void kir_ref_gemm(const FuseGemm *m, double *const *bufs) {
    const double *A = bufs[m->a], *B = bufs[m->b];
    double *C = bufs[m->c];
    for (int64_t j = 0; m->epilogue == FE_BGRAD_B && j < m->n; j++) { /* batch 1 */
        double s = 0;
        for (int64_t p = 0; p < m->k; p++) s += m->trans_b ? B[j * m->ldb + p] : B[p * m->ldb + j];
        bufs[m->bias][j] = s;
    }
    for (int64_t t = 0; t < m->batch; t++)
        for (int64_t i = 0; i < m->m; i++)
            for (int64_t j = 0; j < m->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < m->k; p++) {
                    double x = m->trans_a ? A[t * m->stride_a + p * m->lda + i] : A[t * m->stride_a + i * m->lda + p];
                    double y = m->trans_b ? B[t * m->stride_b + j * m->ldb + p] : B[t * m->stride_b + p * m->ldb + j];
                    s += x * y;
                }
                double *out = &C[t * m->stride_c + i * m->ldc + j];
                *out = (m->beta == 0 ? m->alpha * s : m->alpha * s + m->beta * *out) +
                       (m->epilogue == FE_BIAS  ? bufs[m->bias][j]
                        : m->epilogue == FE_ADD ? bufs[m->bias][t * m->stride_c + i * m->ldc + j]
                                                : 0.0);
            }
}

double **kir_ref_schedule(const FuseResult *r, double *const *leaves, Arena *ar) {
    const Graph *g = r->g;
    double **bufs = arena_alloc(ar, sizeof(double *) * (size_t)(r->nbuffers + 1));
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *b = &r->buffers[i];
        int64_t numel = 1;
        for (int d = 0; d < b->rank; d++) numel *= b->shape[d];
        bufs[i] = arena_alloc(ar, sizeof(double) * (size_t)(numel ? numel : 1));
        if (b->kind != FB_PARAM && b->kind != FB_INPUT) {
            for (int64_t j = 0; j < numel; j++) bufs[i][j] = NAN;
            continue;
        }
        const GNode *n = graph_node(g, b->node);
        if (leaves && leaves[n->id]) {
            memcpy(bufs[i], leaves[n->id], sizeof(double) * (size_t)numel);
        } else if (n->op == G_PARAM && (n->iattr[0] == GI_ZEROS || n->iattr[0] == GI_ONES || n->iattr[0] == GI_CONSTANT)) {
            double v = n->iattr[0] == GI_ZEROS ? 0.0 : n->iattr[0] == GI_ONES ? 1.0 : n->fattr[0];
            for (int64_t j = 0; j < numel; j++) bufs[i][j] = v;
        } else {
            diag_error_noloc("kir_ref: no values given for '%s' (node %%%d)", n->name ? n->name : "?", n->id);
            return NULL;
        }
    }
    for (int li = 0; li < r->nlaunches; li++) {
        const FuseLaunch *L = &r->launches[li];
        if (L->kind == FL_GEMM) {
            kir_ref_gemm(&L->gemm, bufs);
            continue;
        }
        const Kernel *k = r->kernels[L->kernel];
        double **kb = arena_alloc(ar, sizeof(double *) * (size_t)(k->nbufs + 1));
        for (int i = 0; i < k->nbufs; i++) kb[i] = bufs[k->bufs[i].buffer];
        if (kir_ref_kernel(k, kb)) return NULL;
    }
    return bufs;
}
