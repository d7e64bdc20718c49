/* shape.c - the type and shape algebra of operators: arithmetic, comparisons, logic, `@`,
 * indexing and slicing, `x.T` (see value.h).
 *
 * Pipeline position: called by sema for every operator expression while it interprets a program
 * abstractly (and again, with concrete constants, when a train/serve block instantiates a model).
 * Numbers known at compile time are folded here; tensors are reduced to dtype + shape, with
 * NumPy broadcasting over symbolic dims. Each function reports its own errors and then returns
 * V_UNKNOWN, which every function here accepts silently, so one mistake gives one message. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "value.h"

/* ---- small helpers ---- */

/* Operator text for messages (ast.c has one too, but this module must not depend on the parser). */

static int shape_is_compare(Op op) { return op >= OP_EQ && op <= OP_GE; }

/* A value nothing can be said about: V_UNKNOWN, or an integer whose Dim was lost to overflow. */
static int shape_opaque(const Value *v) { return !v || v->kind == V_UNKNOWN || (v->kind == V_INT && !v->dim); }

static int shape_is_number(const Value *v) { return v->kind == V_INT || v->kind == V_FLOAT; }

/* 1 when origin lies outside the expression at: then a note pointing at it tells the user
 * something the caret does not. */
static int shape_note_worthy(Span origin, Span at) {
    if (origin.file == 0) return 0;
    if (origin.file != at.file) return 1;
    return origin.off < at.off || origin.off + origin.len > at.off + at.len;
}

/* Decides the sign of a - b when the difference is a constant: 1 and *sign in {-1, 0, 1}. */
static int shape_dim_cmp(Arena *ar, const Dim *a, const Dim *b, int *sign) {
    int64_t n, d;
    const Dim *diff = dim_sub(ar, a, b);
    if (!dim_rational(diff, &n, &d)) return 0;
    *sign = n > 0 ? 1 : n < 0 ? -1 : 0;
    return 1;
}

static int shape_dim_is_one(const Dim *d) {
    int64_t v;
    return dim_const(d, &v) && v == 1;
}

/* ---- dtypes ---- */

/* Joins the dtypes of two tensors for an elementwise op: floats must agree; a float wins over
 * integers and bools; the wider integer wins; two bools stay bool. 0 on a float mismatch. */
static int shape_dtype_join(DType a, DType b, DType *out) {
    int fa = dtype_is_float(a), fb = dtype_is_float(b);
    if (fa && fb) {
        *out = a;
        return a == b;
    }
    if (fa || fb) *out = fa ? a : b;
    else if (a == DT_I64 || b == DT_I64) *out = DT_I64;
    else if (a == DT_I32 || b == DT_I32) *out = DT_I32;
    else *out = DT_BOOL;
    return 1;
}

/* A number next to a tensor is weakly typed: it takes the tensor's dtype unless it needs more
 * (a float next to an integer tensor makes f32; an integer next to a bool tensor makes i32). */
static DType shape_dtype_with_scalar(DType t, const Value *scalar) {
    if (scalar->kind == V_FLOAT) return dtype_is_float(t) ? t : DT_F32;
    if (scalar->kind == V_INT) return t == DT_BOOL ? DT_I32 : t;
    return t;
}

/* ---- broadcasting ---- */

/* NumPy broadcasting of two shapes into *out. On a conflict returns 0 with *bad the axis of
 * the result and *da, *db the two dimensions. */
static int shape_broadcast(Arena *ar, const TensorType *a, const TensorType *b, TensorType *out, int *bad, const Dim **da,
                           const Dim **db) {
    int r = a->rank > b->rank ? a->rank : b->rank;
    const Dim **dims = arena_alloc(ar, sizeof(const Dim *) * (size_t)(r + 1));
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        const Dim *x = ia >= 0 ? a->dims[ia] : NULL, *y = ib >= 0 ? b->dims[ib] : NULL;
        if (!x) dims[i] = y;
        else if (!y) dims[i] = x;
        else if (dim_eq(x, y) || shape_dim_is_one(y)) dims[i] = x;
        else if (shape_dim_is_one(x)) dims[i] = y;
        else {
            *bad = i;
            *da = x;
            *db = y;
            return 0;
        }
    }
    out->rank = r;
    out->dims = dims;
    return 1;
}

/* The common shape and joined dtype of two operands of which at least one is a tensor. `opname`
 * is the operator between the two shapes in the mismatch message ("+", "and"), `prefix` starts
 * the message ("" for operators, "max: " for builtins). Returns 0 after reporting an error. */
static int shape_combine(Arena *ar, const char *prefix, const char *opname, const Value *a, const Value *b, Span at,
                         TensorType *out) {
    if (a->kind == V_TENSOR && b->kind == V_TENSOR) {
        int bad = 0;
        const Dim *da = NULL, *db = NULL;
        if (!shape_broadcast(ar, &a->t, &b->t, out, &bad, &da, &db)) {
            diag_error(at, "%sshape mismatch: %s %s %s", prefix, tensor_type_str(ar, &a->t), opname, tensor_type_str(ar, &b->t));
            if (shape_note_worthy(a->origin, at)) diag_note(a->origin, "the left operand's shape comes from here");
            if (shape_note_worthy(b->origin, at)) diag_note(b->origin, "the right operand's shape comes from here");
            diag_hint("dimension %d is %s on the left and %s on the right; they must be equal, or one of them 1", bad,
                      dim_str(ar, da), dim_str(ar, db));
            return 0;
        }
        if (!shape_dtype_join(a->t.dt, b->t.dt, &out->dt)) {
            diag_error(at, "%sdtype mismatch: %s %s %s", prefix, tensor_type_str(ar, &a->t), opname, tensor_type_str(ar, &b->t));
            if (shape_note_worthy(a->origin, at)) diag_note(a->origin, "the left operand's dtype comes from here");
            if (shape_note_worthy(b->origin, at)) diag_note(b->origin, "the right operand's dtype comes from here");
            diag_hint("float tensors of different dtypes are not mixed implicitly; give both operands the same dtype");
            return 0;
        }
        return 1;
    }
    const Value *t = a->kind == V_TENSOR ? a : b, *s = a->kind == V_TENSOR ? b : a;
    out->rank = t->t.rank;
    out->dims = t->t.dims;
    out->dt = shape_dtype_with_scalar(t->t.dt, s);
    return 1;
}

/* ---- numbers ---- */

static char *shape_num_str(Arena *ar, const Value *v) {
    if (v->kind == V_INT) return dim_str(ar, v->dim);
    if (v->kind == V_FLOAT && v->fknown) return value_float_str(ar, v->f);
    return value_type_str(ar, v);
}

/* 1 and *out when v is an integer known at compile time. */
static int shape_known_int(const Value *v, int64_t *out) { return v->kind == V_INT && dim_const(v->dim, out); }

/* a / b for two integers: an integer when the quotient is exact or symbolic (d/heads), a float
 * when both are known and it is not, an unknown float when no Dim can hold it. */
static Value *shape_int_div(Arena *ar, const Dim *a, const Dim *b, Span sb, Span at, const char *atext, const char *btext) {
    int64_t zn, zd;
    if (dim_rational(b, &zn, &zd) && zn == 0) {
        diag_error(sb, "division by zero");
        return value_unknown(ar, at);
    }
    int exact = 1;
    const Dim *q = dim_div(ar, a, b, &exact);
    if (q) return value_int(ar, q, at);
    int64_t an, ad, bn, bd;
    if (!exact && dim_rational(a, &an, &ad) && dim_rational(b, &bn, &bd))
        return value_float(ar, ((double)an / (double)ad) / ((double)bn / (double)bd), 1, at);
    if (!exact) return value_float(ar, 0, 0, at); /* T / (T+1): a number known only at run time */
    diag_error(at, "integer overflow: %s / %s does not fit in 62 bits", atext, btext);
    return value_unknown(ar, at);
}

/* Python's modulo: the result has the divisor's sign. */
static double shape_fmod(double a, double b) {
    double r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static Value *shape_int_arith(Arena *ar, Op op, const Value *a, const Value *b, Span sb, Span at) {
    const char *ot = ast_op_text(op);
    const char *as = dim_str(ar, a->dim), *bs = dim_str(ar, b->dim);
    const Dim *r = NULL;
    int64_t x, y;
    switch (op) {
    case OP_ADD: r = dim_add(ar, a->dim, b->dim); break;
    case OP_SUB: r = dim_sub(ar, a->dim, b->dim); break;
    case OP_MUL: r = dim_mul(ar, a->dim, b->dim); break;
    case OP_DIV: return shape_int_div(ar, a->dim, b->dim, sb, at, as, bs);
    case OP_MOD:
        if (shape_known_int(b, &y) && y == 0) {
            diag_error(sb, "modulo by zero");
            return value_unknown(ar, at);
        }
        if (shape_known_int(a, &x) && shape_known_int(b, &y)) {
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return value_int(ar, dim_int(ar, m), at);
        } else {
            /* (4*d) % 4 and (d*heads) % heads are 0 for every value of the symbols: the exact
             * quotient is a polynomial with integer coefficients and no division left in it. */
            int exact = 0;
            const Dim *q = dim_div(ar, a->dim, b->dim, &exact);
            if (q && dim_is_integral(q)) return value_int(ar, dim_int(ar, 0), at);
            return value_unknown(ar, at); /* d % 3: an integer, but no Dim says which */
        }
    case OP_POW: {
        if (!shape_known_int(b, &y)) return value_unknown(ar, at); /* 2 ^ n: not a polynomial */
        if (y >= 0) {
            r = y <= INT32_MAX ? dim_pow(ar, a->dim, y) : NULL;
            int64_t base;
            if (!r && shape_known_int(a, &base) && (base == 0 || base == 1 || base == -1))
                r = dim_int(ar, base == 0 ? 0 : base == 1 ? 1 : (y % 2 ? -1 : 1));
            break;
        }
        int64_t base;
        if (shape_known_int(a, &base) && base == 0) {
            diag_error(sb, "division by zero: 0 ^ %s", bs);
            return value_unknown(ar, at);
        }
        const Dim *p = y >= -(int64_t)INT32_MAX ? dim_pow(ar, a->dim, -y) : NULL;
        if (!p) {
            double av;
            if (value_number(a, &av)) return value_float(ar, pow(av, (double)y), 1, at);
            diag_error(at, "integer overflow: %s ^ %s does not fit in 62 bits", as, bs);
            return value_unknown(ar, at);
        }
        return shape_int_div(ar, dim_int(ar, 1), p, sb, at, "1", dim_str(ar, p));
    }
    default: INTERNAL("shape_int_arith: operator %d", (int)op);
    }
    if (!r) {
        diag_error(at, "integer overflow: %s %s %s does not fit in 62 bits", as, ot, bs);
        return value_unknown(ar, at);
    }
    return value_int(ar, r, at);
}

static Value *shape_float_arith(Arena *ar, Op op, const Value *a, const Value *b, Span sb, Span at) {
    double x, y;
    int kx = value_number(a, &x), ky = value_number(b, &y);
    if ((op == OP_DIV || op == OP_MOD) && ky && y == 0) {
        diag_error(sb, op == OP_DIV ? "division by zero" : "modulo by zero");
        return value_unknown(ar, at);
    }
    if (!kx || !ky) return value_float(ar, 0, 0, at);
    double r = 0;
    switch (op) {
    case OP_ADD: r = x + y; break;
    case OP_SUB: r = x - y; break;
    case OP_MUL: r = x * y; break;
    case OP_DIV: r = x / y; break;
    case OP_MOD: r = shape_fmod(x, y); break;
    case OP_POW: r = pow(x, y); break;
    default: INTERNAL("shape_float_arith: operator %d", (int)op);
    }
    if (!isfinite(r)) {
        diag_error(at, "%s %s %s is not a finite number", shape_num_str(ar, a), ast_op_text(op), shape_num_str(ar, b));
        return value_unknown(ar, at);
    }
    return value_float(ar, r, 1, at);
}

/* ==, <, ... on two numbers: known when the difference is a constant (T-1 < T) or both known. */
static Value *shape_num_compare(Arena *ar, Op op, const Value *a, const Value *b, Span at) {
    int sign = 0, known = 0;
    double x, y;
    if (a->kind == V_INT && b->kind == V_INT) known = shape_dim_cmp(ar, a->dim, b->dim, &sign);
    else if (value_number(a, &x) && value_number(b, &y)) {
        known = 1;
        sign = x > y ? 1 : x < y ? -1 : 0;
    }
    if (!known) return value_bool(ar, 0, 0, at);
    int r = 0;
    switch (op) {
    case OP_EQ: r = sign == 0; break;
    case OP_NE: r = sign != 0; break;
    case OP_LT: r = sign < 0; break;
    case OP_LE: r = sign <= 0; break;
    case OP_GT: r = sign > 0; break;
    case OP_GE: r = sign >= 0; break;
    default: INTERNAL("shape_num_compare: operator %d", (int)op);
    }
    return value_bool(ar, r, 1, at);
}

/* ---- errors shared by the operators ---- */

static Value *shape_unsupported(Arena *ar, Op op, const Value *a, const Value *b, Span at) {
    diag_error(at, "unsupported operands for '%s': %s and %s", ast_op_text(op), value_type_str(ar, a), value_type_str(ar, b));
    return value_unknown(ar, at);
}

/* ---- logic ---- */

static int shape_is_boolish(const Value *v) { return v->kind == V_BOOL || (v->kind == V_TENSOR && v->t.dt == DT_BOOL); }

static Value *shape_logic(Arena *ar, Op op, Value *a, Span sa, Value *b, Span sb, Span at) {
    const char *ot = ast_op_text(op);
    if (!shape_is_boolish(a) || !shape_is_boolish(b)) {
        const Value *bad = shape_is_boolish(a) ? b : a;
        diag_error(shape_is_boolish(a) ? sb : sa, "'%s' needs bools, got %s", ot, value_type_str(ar, bad));
        if (shape_is_number(bad) || bad->kind == V_TENSOR) diag_hint("compare explicitly, e.g. n > 0");
        return value_unknown(ar, at);
    }
    if (a->kind == V_BOOL && b->kind == V_BOOL) {
        /* Short-circuit: `false and x` is known even when x is not. */
        int dominant = op == OP_OR;
        if ((a->bknown && a->b == dominant) || (b->bknown && b->b == dominant)) return value_bool(ar, dominant, 1, at);
        if (a->bknown && b->bknown) return value_bool(ar, op == OP_AND ? a->b && b->b : a->b || b->b, 1, at);
        return value_bool(ar, 0, 0, at);
    }
    TensorType out;
    if (!shape_combine(ar, "", ot, a, b, at, &out)) return value_unknown(ar, at);
    return value_tensor(ar, DT_BOOL, out.rank, out.dims, at);
}

/* ---- matmul ---- */

Value *value_matmul(Arena *ar, const char *what, Value *a, Span sa, Value *b, Span sb, Span at) {
    (void)sa;
    (void)sb;
    if (shape_opaque(a) || shape_opaque(b)) return value_unknown(ar, at);
    if (a->kind != V_TENSOR || b->kind != V_TENSOR) {
        diag_error(at, "%s needs two tensors, got %s and %s", what, value_type_str(ar, a), value_type_str(ar, b));
        if (shape_is_number(a) || shape_is_number(b)) diag_hint("use '*' to multiply by a number");
        return value_unknown(ar, at);
    }
    const char *as = tensor_type_str(ar, &a->t), *bs = tensor_type_str(ar, &b->t);
    if (a->t.rank == 0 || b->t.rank == 0) {
        diag_error(at, "%s of a scalar tensor: %s @ %s", what, as, bs);
        diag_hint("use '*' to multiply by a scalar");
        return value_unknown(ar, at);
    }
    if (!dtype_is_float(a->t.dt) || !dtype_is_float(b->t.dt)) {
        diag_error(at, "%s needs float tensors: %s @ %s", what, as, bs);
        diag_hint("convert integer tensors with float(x)");
        return value_unknown(ar, at);
    }
    if (a->t.dt != b->t.dt) {
        diag_error(at, "%s: dtype mismatch: %s @ %s", what, as, bs);
        diag_hint("float tensors of different dtypes are not mixed implicitly; give both operands the same dtype");
        return value_unknown(ar, at);
    }
    int ra = a->t.rank, rb = b->t.rank;
    /* A vector on the left is a row [1, k], on the right a column [k, 1]; the 1 is dropped again. */
    const Dim *ka = a->t.dims[ra - 1], *kb = b->t.dims[rb == 1 ? 0 : rb - 2];
    if (!dim_eq(ka, kb)) {
        diag_error(at, "%s: inner dimensions differ: %s @ %s (%s vs %s)", what, as, bs, dim_str(ar, ka), dim_str(ar, kb));
        if (shape_note_worthy(a->origin, at)) diag_note(a->origin, "the left operand's shape comes from here");
        if (shape_note_worthy(b->origin, at)) diag_note(b->origin, "the right operand's shape comes from here");
        diag_hint("the last dimension of the left operand must equal %s",
                  rb == 1 ? "the length of the right operand" : "the second-to-last dimension of the right operand");
        return value_unknown(ar, at);
    }
    TensorType ba = {a->t.dt, ra > 2 ? ra - 2 : 0, a->t.dims}, bb = {b->t.dt, rb > 2 ? rb - 2 : 0, b->t.dims}, batch;
    int bad = 0;
    const Dim *da = NULL, *db = NULL;
    if (!shape_broadcast(ar, &ba, &bb, &batch, &bad, &da, &db)) {
        diag_error(at, "%s: batch dimensions do not broadcast: %s @ %s", what, as, bs);
        diag_hint("batch dimension %d is %s on the left and %s on the right; they must be equal, or one of them 1", bad,
                  dim_str(ar, da), dim_str(ar, db));
        return value_unknown(ar, at);
    }
    const Dim **dims = arena_alloc(ar, sizeof(const Dim *) * (size_t)(batch.rank + 3));
    int r = 0;
    for (int i = 0; i < batch.rank; i++) dims[r++] = batch.dims[i];
    if (ra >= 2) dims[r++] = a->t.dims[ra - 2];
    if (rb >= 2) dims[r++] = b->t.dims[rb - 1];
    return value_tensor(ar, a->t.dt, r, dims, at);
}

/* ---- elementwise ---- */

Value *value_elementwise(Arena *ar, const char *what, Value *a, Span sa, Value *b, Span sb, Span at) {
    if (shape_opaque(a) || shape_opaque(b)) return value_unknown(ar, at);
    int ta = a->kind == V_TENSOR, tb = b->kind == V_TENSOR;
    int oka = ta || shape_is_number(a) || a->kind == V_BOOL, okb = tb || shape_is_number(b) || b->kind == V_BOOL;
    if (!oka || !okb) {
        diag_error(oka ? sb : sa, "%s: expected a number or a tensor, got %s", what, value_type_str(ar, oka ? b : a));
        return value_unknown(ar, at);
    }
    if (!ta && !tb) {
        if (a->kind == V_FLOAT || b->kind == V_FLOAT) return value_float(ar, 0, 0, at);
        return value_unknown(ar, at);
    }
    TensorType out;
    char *prefix = arena_printf(ar, "%s: ", what);
    if (!shape_combine(ar, prefix, "and", a, b, at, &out)) return value_unknown(ar, at);
    return value_tensor(ar, out.dt, out.rank, out.dims, at);
}

/* ---- binary operators ---- */

Value *value_binary(Arena *ar, Op op, Value *a, Span sa, Value *b, Span sb, Span at) {
    if (shape_opaque(a) || shape_opaque(b)) return value_unknown(ar, at);
    const char *ot = ast_op_text(op);
    if (op == OP_AND || op == OP_OR) return shape_logic(ar, op, a, sa, b, sb, at);
    if (op == OP_MATMUL) return value_matmul(ar, "'@'", a, sa, b, sb, at);

    if (a->kind == V_TENSOR || b->kind == V_TENSOR) {
        const Value *other = a->kind == V_TENSOR ? b : a;
        if (other->kind != V_TENSOR && !shape_is_number(other)) return shape_unsupported(ar, op, a, b, at);
        TensorType out;
        if (!shape_combine(ar, "", ot, a, b, at, &out)) return value_unknown(ar, at);
        DType dt = out.dt;
        if (shape_is_compare(op)) dt = DT_BOOL;
        else if (op == OP_DIV && !dtype_is_float(dt)) dt = DT_F32; /* `/` is true division */
        else if (dt == DT_BOOL) dt = DT_I32;                       /* arithmetic on masks counts */
        return value_tensor(ar, dt, out.rank, out.dims, at);
    }

    if (shape_is_number(a) && shape_is_number(b)) {
        if (shape_is_compare(op)) return shape_num_compare(ar, op, a, b, at);
        if (a->kind == V_INT && b->kind == V_INT) return shape_int_arith(ar, op, a, b, sb, at);
        return shape_float_arith(ar, op, a, b, sb, at);
    }

    if (a->kind == V_BOOL && b->kind == V_BOOL && (op == OP_EQ || op == OP_NE)) {
        if (!a->bknown || !b->bknown) return value_bool(ar, 0, 0, at);
        return value_bool(ar, (a->b == b->b) == (op == OP_EQ), 1, at);
    }
    if (a->kind == V_STRING && b->kind == V_STRING) {
        if (op == OP_EQ || op == OP_NE) return value_bool(ar, (strcmp(a->s, b->s) == 0) == (op == OP_EQ), 1, at);
        if (op == OP_ADD) {
            Value *v = value_new(ar, V_STRING, at);
            v->s = arena_printf(ar, "%s%s", a->s, b->s);
            return v;
        }
    }
    return shape_unsupported(ar, op, a, b, at);
}

/* ---- unary operators ---- */

Value *value_unary(Arena *ar, Op op, Value *a, Span at) {
    if (shape_opaque(a)) return value_unknown(ar, at);
    if (op == OP_NOT) {
        if (a->kind == V_BOOL) return value_bool(ar, !a->b, a->bknown, at);
        if (a->kind == V_TENSOR && a->t.dt == DT_BOOL) return value_tensor(ar, DT_BOOL, a->t.rank, a->t.dims, at);
        diag_error(at, "'not' needs a bool, got %s", value_type_str(ar, a));
        if (shape_is_number(a) || a->kind == V_TENSOR) diag_hint("compare explicitly, e.g. n > 0");
        return value_unknown(ar, at);
    }
    if (op != OP_NEG && op != OP_POS) INTERNAL("value_unary: operator %d", (int)op);
    if (a->kind == V_INT) {
        if (op == OP_POS) return value_int(ar, a->dim, at);
        /* |coefficients| < 2^62, so negation cannot overflow */
        return value_int(ar, dim_sub(ar, dim_int(ar, 0), a->dim), at);
    }
    if (a->kind == V_FLOAT) return value_float(ar, op == OP_NEG ? -a->f : a->f, a->fknown, at);
    if (a->kind == V_TENSOR && a->t.dt != DT_BOOL) return value_tensor(ar, a->t.dt, a->t.rank, a->t.dims, at);
    diag_error(at, "unsupported operand for '%s': %s", ast_op_text(op), value_type_str(ar, a));
    return value_unknown(ar, at);
}

/* ---- indexing ---- */

/* A tuple or list element by position. Lists of symbolic length hold one representative item. */
static Value *shape_index_seq(Arena *ar, Value *base, Value *idx, Span sidx, int is_slice, int nidx, Span at) {
    const char *what = base->kind == V_TUPLE ? "tuple" : "list";
    if (nidx != 1) {
        diag_error(at, "a %s takes one index, got %d", what, nidx);
        return value_unknown(ar, at);
    }
    if (is_slice) {
        diag_error(sidx, "a %s cannot be sliced", what);
        return value_unknown(ar, at);
    }
    if (shape_opaque(idx)) return value_unknown(ar, at);
    int64_t len = base->n;
    int len_known = base->kind == V_TUPLE || !base->len || dim_const(base->len, &len);
    int64_t i;
    if (idx->kind == V_INT && !len_known && base->n >= 1) return base->items[0];
    if (idx->kind != V_INT || !dim_const(idx->dim, &i)) {
        if (idx->kind == V_INT && base->kind == V_LIST && base->n >= 1) return base->items[0];
        diag_error(sidx, "%s index must be a known integer, got %s", what, value_type_str(ar, idx));
        return value_unknown(ar, at);
    }
    int64_t j = i < 0 ? i + len : i;
    if (j < 0 || j >= len || j >= base->n) {
        diag_error(sidx, "index %lld is out of range for a %s of %lld", (long long)i, what, (long long)len);
        if (shape_note_worthy(base->origin, at)) diag_note(base->origin, "the %s comes from here", what);
        return value_unknown(ar, at);
    }
    return base->items[j];
}

/* base[idx] with an integer tensor: rows of base picked by idx. */
static Value *shape_gather(Arena *ar, const Value *w, const Value *idx, Span sbase, Span sidx, Span at) {
    if (w->t.rank == 0) {
        diag_error(sbase, "gather needs a tensor of rank 1 or more, got %s", tensor_type_str(ar, &w->t));
        return value_unknown(ar, at);
    }
    if (idx->t.dt != DT_I32 && idx->t.dt != DT_I64) {
        diag_error(sidx, "gather index must be an integer tensor, got %s", tensor_type_str(ar, &idx->t));
        diag_hint("convert with int(x)");
        return value_unknown(ar, at);
    }
    int r = idx->t.rank + w->t.rank - 1;
    const Dim **dims = arena_alloc(ar, sizeof(const Dim *) * (size_t)(r + 1));
    for (int i = 0; i < idx->t.rank; i++) dims[i] = idx->t.dims[i];
    for (int i = 1; i < w->t.rank; i++) dims[idx->t.rank + i - 1] = w->t.dims[i];
    return value_tensor(ar, w->t.dt, r, dims, at);
}

/* A slice bound or position as a Dim: NULL and *unknown for V_UNKNOWN, NULL after an error. Known
 * negative values count from the end of the dimension, as in Python. */
static const Dim *shape_position(Arena *ar, const Value *v, const Dim *size, Span sv, const char *what, int *unknown) {
    if (shape_opaque(v)) {
        *unknown = 1;
        return NULL;
    }
    int64_t n, d;
    if (v->kind != V_INT || (dim_rational(v->dim, &n, &d) && d != 1)) {
        diag_error(sv, "%s must be an integer, got %s", what, value_type_str(ar, v));
        return NULL;
    }
    if (dim_const(v->dim, &n) && n < 0) {
        const Dim *p = dim_add(ar, size, v->dim);
        if (!p) diag_error(sv, "integer overflow: %s %s does not fit in 62 bits", dim_str(ar, size), dim_str(ar, v->dim));
        return p;
    }
    return v->dim;
}

static Value *shape_index_tensor(Arena *ar, Value *base, Span sbase, Value **idx, Span *sidx, int nidx, const int *is_slice,
                                 Value **slice_lo, Value **slice_hi, Span at) {
    const TensorType *t = &base->t;
    for (int i = 0; i < nidx; i++) {
        if (is_slice[i] || !idx[i] || idx[i]->kind != V_TENSOR) continue;
        if (nidx == 1) return shape_gather(ar, base, idx[0], sbase, sidx[0], at);
        diag_error(sidx[i], "an index tensor must be the only index");
        diag_hint("gather first, then index the result");
        return value_unknown(ar, at);
    }
    const char *ts = tensor_type_str(ar, t);
    if (nidx > t->rank) {
        diag_error(at, "too many indices: %s has rank %d but %d indices were given", ts, t->rank, nidx);
        return value_unknown(ar, at);
    }
    const Dim **dims = arena_alloc(ar, sizeof(const Dim *) * (size_t)(t->rank + 1));
    int r = 0, unknown = 0, failed = 0;
    for (int i = 0; i < nidx; i++) {
        const Dim *size = t->dims[i];
        const char *ss = dim_str(ar, size);
        int sign;
        if (!is_slice[i]) {
            int unk = 0;
            if (shape_opaque(idx[i])) continue; /* the axis goes away whatever the index is */
            if (idx[i]->kind != V_INT) {
                diag_error(sidx[i], "tensor index must be an integer, a slice or an integer tensor, got %s",
                           value_type_str(ar, idx[i]));
                failed = 1;
                continue;
            }
            const Dim *p = shape_position(ar, idx[i], size, sidx[i], "tensor index", &unk);
            if (!p) {
                failed |= !unk;
                continue;
            }
            if ((shape_dim_cmp(ar, p, dim_int(ar, 0), &sign) && sign < 0) || (shape_dim_cmp(ar, p, size, &sign) && sign >= 0)) {
                diag_error(sidx[i], "index %s is out of range for dimension %d of %s (size %s)", dim_str(ar, idx[i]->dim), i, ts,
                           ss);
                failed = 1;
            }
            continue;
        }
        Value *lo = slice_lo ? slice_lo[i] : NULL, *hi = slice_hi ? slice_hi[i] : NULL;
        int unk = 0;
        const Dim *plo = lo ? shape_position(ar, lo, size, sidx[i], "slice start", &unk) : dim_int(ar, 0);
        const Dim *phi = hi ? shape_position(ar, hi, size, sidx[i], "slice end", &unk) : size;
        if (!plo || !phi) {
            if (unk) unknown = 1;
            else failed = 1;
            continue;
        }
        const char *text = arena_printf(ar, "%s:%s", lo ? dim_str(ar, lo->dim) : "", hi ? dim_str(ar, hi->dim) : "");
        if ((shape_dim_cmp(ar, plo, dim_int(ar, 0), &sign) && sign < 0) || (shape_dim_cmp(ar, phi, size, &sign) && sign > 0)) {
            diag_error(sidx[i], "slice %s is out of range for dimension %d of %s (size %s)", text, i, ts, ss);
            if (shape_note_worthy(base->origin, at)) diag_note(base->origin, "the sliced tensor's shape comes from here");
            failed = 1;
            continue;
        }
        if (shape_dim_cmp(ar, phi, plo, &sign) && sign <= 0) {
            diag_error(sidx[i], "slice %s of dimension %d of %s is empty", text, i, ts);
            diag_hint("the start of a slice must be before its end");
            failed = 1;
            continue;
        }
        const Dim *len = dim_sub(ar, phi, plo);
        if (!len) {
            diag_error(sidx[i], "integer overflow: the length of slice %s does not fit in 62 bits", text);
            failed = 1;
            continue;
        }
        dims[r++] = len;
    }
    if (failed || unknown) return value_unknown(ar, at);
    for (int i = nidx; i < t->rank; i++) dims[r++] = t->dims[i];
    return value_tensor(ar, t->dt, r, dims, at);
}

Value *value_index(Arena *ar, Value *base, Span sbase, Value **idx, Span *sidx, int nidx, const int *is_slice, Value **slice_lo,
                   Value **slice_hi, Span at) {
    if (shape_opaque(base)) return value_unknown(ar, at);
    if (nidx <= 0) INTERNAL("value_index: no indices");
    /* Callers may leave out the arrays they have nothing for. */
    if (!sidx) {
        sidx = arena_alloc(ar, sizeof(Span) * (size_t)nidx);
        for (int i = 0; i < nidx; i++) sidx[i] = at;
    }
    if (!is_slice) is_slice = arena_alloc(ar, sizeof(int) * (size_t)nidx);
    if (!idx) idx = arena_alloc(ar, sizeof(Value *) * (size_t)nidx);
    if (base->kind == V_TUPLE || base->kind == V_LIST) return shape_index_seq(ar, base, idx[0], sidx[0], is_slice[0], nidx, at);
    if (base->kind == V_TENSOR) return shape_index_tensor(ar, base, sbase, idx, sidx, nidx, is_slice, slice_lo, slice_hi, at);
    diag_error(sbase, "%s cannot be indexed", value_type_str(ar, base));
    return value_unknown(ar, at);
}

/* ---- attributes ---- */

Value *value_tensor_attr(Arena *ar, Value *t, Str name, Span at) {
    if (shape_opaque(t)) return value_unknown(ar, at);
    int digits = name.len > 0 && name.len < 10;
    for (uint32_t k = 0; k < name.len; k++) digits &= name.p[k] >= '0' && name.p[k] <= '9';
    if (t->kind == V_TUPLE && digits) {
        /* betas.0: the lexer makes the position an attribute name */
        int64_t i = 0;
        for (uint32_t k = 0; k < name.len; k++) i = i * 10 + (name.p[k] - '0');
        return shape_index_seq(ar, t, value_int(ar, dim_int(ar, i), at), at, 0, 1, at);
    }
    if (t->kind != V_TENSOR) {
        diag_error(at, "%s has no attribute '%.*s'", value_type_str(ar, t), (int)name.len, name.p);
        return value_unknown(ar, at);
    }
    if (!str_eqc(name, "T")) {
        diag_error(at, "tensor %s has no attribute '%.*s'", tensor_type_str(ar, &t->t), (int)name.len, name.p);
        diag_hint("a tensor's only attribute is '.T' (its last two dimensions swapped)");
        return value_unknown(ar, at);
    }
    if (t->t.rank < 2) {
        diag_error(at, "'.T' needs a tensor of rank 2 or more, got %s", tensor_type_str(ar, &t->t));
        diag_hint("reshape a vector to [n, 1] or [1, n] first");
        return value_unknown(ar, at);
    }
    Value *v = value_tensor(ar, t->t.dt, t->t.rank, t->t.dims, at);
    const Dim **d = (const Dim **)v->t.dims;
    const Dim *x = d[v->t.rank - 1];
    d[v->t.rank - 1] = d[v->t.rank - 2];
    d[v->t.rank - 2] = x;
    return v;
}

/* ---- conditions ---- */

int value_truthy(const Value *v, int *known) {
    int64_t n, d;
    *known = 0;
    if (!v) return 0;
    switch (v->kind) {
    case V_BOOL: *known = v->bknown; return v->bknown && v->b;
    case V_INT:
        if (!dim_rational(v->dim, &n, &d)) return 0;
        *known = 1;
        return n != 0;
    case V_FLOAT: *known = v->fknown; return v->fknown && v->f != 0;
    case V_UNKNOWN:
    case V_TENSOR: return 0; /* a tensor's truth is a run-time matter; sema decides whether that is allowed */
    case V_NONE: *known = 1; return 0;
    case V_STRING: *known = 1; return v->s && v->s[0];
    default: *known = 1; return 1;
    }
}
