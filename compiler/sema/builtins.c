/* builtins.c - the builtin functions of the language and their shape rules (docs/language.md,
 * section Builtins).
 *
 * Pipeline position: sema calls builtin_call for every call whose callee is a builtin, with the
 * arguments already evaluated to Values. Arguments are first bound to named parameters the way a
 * user-defined function binds them (positional, then keywords; unknown and duplicate keywords are
 * errors); then the builtin's rule checks types, axes and shapes and computes the result type,
 * folding numbers known at compile time. Initialisers after `~` (normal, uniform, ...) and
 * tokens(...) are sema's, not builtins.
 *
 * Messages start with the builtin's name (`layernorm: ...`) and point at the offending argument.
 * After an error the result is V_UNKNOWN, and a V_UNKNOWN argument silences the checks that
 * depend on it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "value.h"

/* ---- the call being checked ---- */

#define BUILTIN_MAX_PARAMS 6
#define BUILTIN_MAX_PARTS 4096 /* split into more parts than this is surely a mistake */

typedef struct BCall {
    Arena *ar;
    const Builtin *b;
    const CallArgs *args;
    Value *v[BUILTIN_MAX_PARAMS]; /* bound arguments by parameter; NULL when not given */
    Span at[BUILTIN_MAX_PARAMS];
    Value **rest; /* positional arguments past the named parameters (variadic builtins) */
    Span *rest_at;
    int nrest;
    int failed;    /* an error has been reported */
    int unknown;   /* an argument the result depends on is not known */
    DType fill_dt; /* the dtype zeros and ones make (builtin_call) */
} BCall;

typedef Value *(*BuiltinFn)(BCall *c);

struct Builtin {
    const char *name;
    const char *params[BUILTIN_MAX_PARAMS + 1]; /* NULL-terminated */
    int nreq;                                   /* the first nreq parameters must be given */
    int variadic;                               /* extra positional arguments go to rest */
    BuiltinFn fn;
    int op;            /* which member of a family (math functions, reductions) */
    const char *usage; /* for hints */
};

static const char *bname(const BCall *c) { return c->b->name; }

/* Where to point for parameter i: the argument when given, else the whole call. */
static Span barg_at(const BCall *c, int i) { return c->v[i] ? c->at[i] : c->args->at; }

static int bopaque(const Value *v) { return !v || v->kind == V_UNKNOWN || (v->kind == V_INT && !v->dim); }

static int bis_number(const Value *v) { return v->kind == V_INT || v->kind == V_FLOAT; }

/* The result of a builtin: V_UNKNOWN once anything went wrong or is unknown. */
static Value *bresult(BCall *c, Value *v) { return c->failed || c->unknown || !v ? value_unknown(c->ar, c->args->at) : v; }

static Value *bstop(BCall *c) { return value_unknown(c->ar, c->args->at); }

/* 1 when origin lies outside the call, so a note pointing there adds something. */
static void bnote_origin(BCall *c, const Value *v, const char *what) {
    Span at = c->args->at, o = v->origin;
    if (o.file == 0) return;
    if (o.file == at.file && o.off >= at.off && o.off + o.len <= at.off + at.len) return;
    diag_note(o, "%s comes from here", what);
}

static const char *bdims_str(Arena *ar, const Dim **dims, int n) {
    TensorType t = {DT_F32, n, dims};
    const char *s = tensor_type_str(ar, &t);
    return s + strlen(dtype_name(DT_F32)); /* "[a, b]" */
}

/* ---- argument readers ----
 * Each returns what it read, or NULL/-1 when the argument is unknown (c->unknown) or wrong (an
 * error is reported and c->failed set). */

static const Value *btensor(BCall *c, int i, int need_float) {
    Value *v = c->v[i];
    if (!v) return NULL;
    if (bopaque(v)) {
        c->unknown = 1;
        return NULL;
    }
    if (v->kind != V_TENSOR) {
        diag_error(c->at[i], "%s: '%s' must be a tensor, got %s", bname(c), c->b->params[i], value_type_str(c->ar, v));
        c->failed = 1;
        return NULL;
    }
    if (need_float && !dtype_is_float(v->t.dt)) {
        diag_error(c->at[i], "%s: '%s' must be a float tensor, got %s", bname(c), c->b->params[i], tensor_type_str(c->ar, &v->t));
        diag_hint("convert with float(x)");
        c->failed = 1;
        return NULL;
    }
    return v;
}

/* An axis for tensor x (NULL: x not known, so only the type is checked), def when not given.
 * Negative axes count from the end. */
static int baxis(BCall *c, int i, const Value *x, int64_t def) {
    Value *v = c->v[i];
    int64_t a = def;
    if (v) {
        if (bopaque(v)) {
            c->unknown = 1;
            return -1;
        }
        if (v->kind != V_INT || !dim_const(v->dim, &a)) {
            diag_error(c->at[i], "%s: axis must be a known integer, got %s", bname(c), value_type_str(c->ar, v));
            c->failed = 1;
            return -1;
        }
    }
    if (!x) return -1;
    int r = x->t.rank;
    if (a < -r || a >= r) {
        diag_error(barg_at(c, i), "%s: axis %lld is out of range for %s (rank %d)", bname(c), (long long)a,
                   tensor_type_str(c->ar, &x->t), r);
        diag_hint("axes count from 0, or from the end with -1");
        c->failed = 1;
        return -1;
    }
    return (int)(a < 0 ? a + r : a);
}

/* A positive integer used as a size (`what` names it in messages: "'n'", "dimension 2"). */
static const Dim *bsize(BCall *c, const Value *v, Span at, const char *what) {
    if (bopaque(v)) {
        c->unknown = 1;
        return NULL;
    }
    int64_t n, d;
    if (v->kind != V_INT || (dim_rational(v->dim, &n, &d) && d != 1)) {
        diag_error(at, "%s: %s must be an integer, got %s", bname(c), what, value_type_str(c->ar, v));
        c->failed = 1;
        return NULL;
    }
    if (dim_const(v->dim, &n) && n <= 0) {
        diag_error(at, "%s: %s must be positive, got %lld", bname(c), what, (long long)n);
        c->failed = 1;
        return NULL;
    }
    return v->dim;
}

/* A number argument: 1 with *out and *known (known only when its value is), 0 when absent,
 * unknown or wrong. def is used when the argument was not given. */
static int bnumber(BCall *c, int i, double def, double *out, int *known) {
    Value *v = c->v[i];
    *out = def;
    *known = 1;
    if (!v) return 1;
    if (bopaque(v)) {
        c->unknown = 1;
        return 0;
    }
    if (!bis_number(v)) {
        diag_error(c->at[i], "%s: '%s' must be a number, got %s", bname(c), c->b->params[i], value_type_str(c->ar, v));
        c->failed = 1;
        return 0;
    }
    *known = value_number(v, out);
    return 1;
}

/* A positive number such as eps or theta. */
static void bpositive(BCall *c, int i, double def) {
    double x;
    int known;
    if (bnumber(c, i, def, &x, &known) && known && !(x > 0)) {
        diag_error(c->at[i], "%s: '%s' must be positive, got %s", bname(c), c->b->params[i], value_float_str(c->ar, x));
        c->failed = 1;
    }
}

/* A bool flag; def when not given, -1 when unknown or wrong. */
static int bflag(BCall *c, int i, int def) {
    Value *v = c->v[i];
    if (!v) return def;
    if (v->kind == V_UNKNOWN) {
        c->unknown = 1;
        return -1;
    }
    if (v->kind != V_BOOL) {
        diag_error(c->at[i], "%s: '%s' must be true or false, got %s", bname(c), c->b->params[i], value_type_str(c->ar, v));
        c->failed = 1;
        return -1;
    }
    return v->bknown ? v->b : def; /* a run-time flag cannot change a shape; the default stands in */
}

/* ---- elementwise math ---- */

enum { M_EXP, M_LOG, M_SQRT, M_RSQRT, M_TANH, M_SIGMOID, M_RELU, M_GELU, M_SILU, M_ABS, M_SIGN, M_SIN, M_COS };

/* relu, abs and sign make sense on integers and keep them integers. */
static int bmath_keeps_int(int op) { return op == M_RELU || op == M_ABS || op == M_SIGN; }

static double bmath_eval(int op, double x) {
    switch (op) {
    case M_EXP: return exp(x);
    case M_LOG: return log(x);
    case M_SQRT: return sqrt(x);
    case M_RSQRT: return 1.0 / sqrt(x);
    case M_TANH: return tanh(x);
    case M_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case M_RELU: return x > 0 ? x : 0.0;
    case M_GELU: /* the tanh approximation (GPT-2's) */
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case M_SILU: return x / (1.0 + exp(-x));
    case M_ABS: return fabs(x);
    case M_SIGN: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
    case M_SIN: return sin(x);
    case M_COS: return cos(x);
    default: INTERNAL("bmath_eval: op %d", op);
    }
}

static Value *b_math(BCall *c) {
    Value *x = c->v[0];
    int op = c->b->op;
    if (bopaque(x)) return bstop(c);
    if (x->kind == V_TENSOR) {
        if (x->t.dt == DT_BOOL || (!bmath_keeps_int(op) && !dtype_is_float(x->t.dt))) {
            diag_error(c->at[0], "%s: needs a float tensor, got %s", bname(c), tensor_type_str(c->ar, &x->t));
            diag_hint("convert with float(x)");
            return bstop(c);
        }
        return value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
    }
    if (!bis_number(x)) {
        diag_error(c->at[0], "%s: 'x' must be a number or a tensor, got %s", bname(c), value_type_str(c->ar, x));
        return bstop(c);
    }
    double v;
    if (!value_number(x, &v)) {
        /* abs(d) is an integer, but no Dim says which */
        if (x->kind == V_INT && bmath_keeps_int(op)) return bstop(c);
        return value_float(c->ar, 0, 0, c->args->at);
    }
    const char *vs = value_float_str(c->ar, v);
    if ((op == M_LOG || op == M_RSQRT) && !(v > 0)) {
        diag_error(c->at[0], "%s: the argument must be positive, got %s", bname(c), vs);
        return bstop(c);
    }
    if (op == M_SQRT && v < 0) {
        diag_error(c->at[0], "%s: the argument must not be negative, got %s", bname(c), vs);
        return bstop(c);
    }
    if (x->kind == V_INT && bmath_keeps_int(op)) {
        int64_t n;
        if (dim_const(x->dim, &n))
            return value_int(c->ar,
                             dim_int(c->ar, op == M_ABS    ? (n < 0 ? -n : n)
                                            : op == M_RELU ? (n > 0 ? n : 0)
                                                           : (n > 0) - (n < 0)),
                             c->args->at);
    }
    double r = bmath_eval(op, v);
    if (!isfinite(r)) {
        diag_error(c->at[0], "%s: the result for %s is not a finite number", bname(c), vs);
        return bstop(c);
    }
    return value_float(c->ar, r, 1, c->args->at);
}

/* ---- float, int, floor ---- */

enum { CONV_FLOAT, CONV_INT, CONV_FLOOR };

static Value *b_convert(BCall *c) {
    Value *x = c->v[0];
    Span at = c->args->at;
    int op = c->b->op;
    if (bopaque(x)) return bstop(c);
    if (x->kind == V_TENSOR) {
        if (op == CONV_FLOOR && !dtype_is_float(x->t.dt)) {
            diag_error(c->at[0], "floor: needs a float tensor, got %s", tensor_type_str(c->ar, &x->t));
            return bstop(c);
        }
        DType dt = op == CONV_FLOAT ? DT_F32 : op == CONV_INT ? DT_I32 : x->t.dt;
        return value_tensor(c->ar, dt, x->t.rank, x->t.dims, at);
    }
    if (x->kind == V_BOOL) {
        if (op == CONV_FLOOR) goto bad;
        if (!x->bknown) return op == CONV_FLOAT ? value_float(c->ar, 0, 0, at) : bstop(c);
        return op == CONV_FLOAT ? value_float(c->ar, x->b, 1, at) : value_int(c->ar, dim_int(c->ar, x->b), at);
    }
    if (!bis_number(x)) goto bad;
    if (op == CONV_FLOAT) {
        double v;
        int known = value_number(x, &v);
        return value_float(c->ar, v, known, at);
    }
    if (x->kind == V_INT) {
        if (dim_is_integral(x->dim)) return value_int(c->ar, x->dim, at);
        int64_t n, d;
        if (dim_rational(x->dim, &n, &d)) {
            /* 7/2: int truncates toward zero, floor rounds down */
            int64_t q = n / d;
            if (op == CONV_FLOOR && n % d != 0 && n < 0) q--;
            return value_int(c->ar, dim_int(c->ar, q), at);
        }
        return op == CONV_FLOOR ? value_float(c->ar, 0, 0, at) : bstop(c);
    }
    if (!x->fknown) return op == CONV_FLOOR ? value_float(c->ar, 0, 0, at) : bstop(c);
    double r = op == CONV_INT ? trunc(x->f) : floor(x->f);
    const Dim *d = fabs(r) < 4.0e18 ? dim_int(c->ar, (int64_t)r) : NULL;
    if (!d) {
        diag_error(c->at[0], "%s: %s does not fit in 62 bits", bname(c), value_float_str(c->ar, x->f));
        return bstop(c);
    }
    return value_int(c->ar, d, at);
bad:
    diag_error(c->at[0], "%s: 'x' must be a number or a tensor, got %s", bname(c), value_type_str(c->ar, x));
    return bstop(c);
}

/* ---- matmul, transpose, reshape ---- */

static Value *b_matmul(BCall *c) { return value_matmul(c->ar, "matmul", c->v[0], c->at[0], c->v[1], c->at[1], c->args->at); }

static Value *b_transpose(BCall *c) {
    const Value *x = btensor(c, 0, 0);
    int i = baxis(c, 1, x, 0), j = baxis(c, 2, x, 0);
    if (c->failed || c->unknown || !x) return bstop(c);
    Value *r = value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
    const Dim **d = (const Dim **)r->t.dims;
    const Dim *t = d[i];
    d[i] = d[j];
    d[j] = t;
    return r;
}

/* The product of dims, or NULL on overflow. */
static const Dim *bproduct(Arena *ar, const Dim **dims, int n, int skip) {
    const Dim *p = dim_int(ar, 1);
    for (int i = 0; i < n && p; i++)
        if (i != skip) p = dim_mul(ar, p, dims[i]);
    return p;
}

/* The dimensions given as the rest of the arguments: f(x, B, T, d), or one tuple f(x, (B, T, d)).
 * Returns their count; each dimension's span is its argument's (the tuple's, for a tuple). */
static int bdims_args(BCall *c, Value ***vals, Span **spans) {
    *vals = c->rest;
    *spans = c->rest_at;
    int n = c->nrest;
    if (n == 1 && !bopaque((*vals)[0]) && ((*vals)[0]->kind == V_TUPLE || (*vals)[0]->kind == V_LIST)) {
        Span s = (*spans)[0];
        n = (*vals)[0]->n;
        *vals = (*vals)[0]->items;
        *spans = arena_alloc(c->ar, sizeof(Span) * (size_t)(n + 1));
        for (int i = 0; i < n; i++) (*spans)[i] = s;
    }
    return n;
}

static Value *b_reshape(BCall *c) {
    const Value *x = btensor(c, 0, 0);
    Value **vals;
    Span *spans;
    int n = bdims_args(c, &vals, &spans);
    if (n == 0) {
        diag_error(c->args->at, "reshape: missing the new dimensions");
        diag_hint("usage: %s", c->b->usage);
        return bstop(c);
    }
    const Dim **dims = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)n);
    int infer = -1;
    for (int i = 0; i < n; i++) {
        int64_t k;
        if (!bopaque(vals[i]) && vals[i]->kind == V_INT && dim_const(vals[i]->dim, &k) && k == -1) {
            if (infer >= 0) {
                diag_error(spans[i], "reshape: only one dimension can be -1");
                c->failed = 1;
            }
            infer = i;
            continue;
        }
        dims[i] = bsize(c, vals[i], spans[i], arena_printf(c->ar, "dimension %d", i));
    }
    if (c->failed || c->unknown || !x) return bstop(c);
    const char *xs = tensor_type_str(c->ar, &x->t);
    const Dim *have = bproduct(c->ar, x->t.dims, x->t.rank, -1), *want = bproduct(c->ar, dims, n, infer);
    if (!have || !want) {
        diag_error(c->args->at, "reshape: the element count of %s does not fit in 62 bits", have ? "the new shape" : xs);
        return bstop(c);
    }
    if (infer >= 0) {
        int exact = 1;
        const Dim *q = dim_div(c->ar, have, want, &exact);
        if (!q) {
            dims[infer] = dim_int(c->ar, -1);
            diag_error(c->args->at, "reshape: cannot infer the -1 in %s: %s has %s elements, not a multiple of %s",
                       bdims_str(c->ar, dims, n), xs, dim_str(c->ar, have), dim_str(c->ar, want));
            return bstop(c);
        }
        dims[infer] = q;
    } else if (!dim_eq(have, want)) {
        diag_error(c->args->at, "reshape: %s has %s elements but the new shape %s has %s", xs, dim_str(c->ar, have),
                   bdims_str(c->ar, dims, n), dim_str(c->ar, want));
        bnote_origin(c, x, "the shape of 'x'");
        diag_hint("the product of the new dimensions must equal the product of the old ones");
        return bstop(c);
    }
    return value_tensor(c->ar, x->t.dt, n, dims, c->args->at);
}

/* ---- split, concat ---- */

static Value *b_split(BCall *c) {
    const Value *x = btensor(c, 0, 0);
    int axis = baxis(c, 2, x, -1);
    Value *nv = c->v[1];
    if (bopaque(nv)) return bstop(c);
    int parts = 0;
    const Dim **sizes = NULL;
    if (nv->kind == V_INT) {
        int64_t k;
        if (!dim_const(nv->dim, &k)) {
            diag_error(c->at[1], "split: the number of parts must be known at compile time, got %s", value_type_str(c->ar, nv));
            diag_hint("use reshape to cut a dimension into a symbolic number of parts");
            return bstop(c);
        }
        if (k <= 0 || k > BUILTIN_MAX_PARTS) {
            diag_error(c->at[1], "split: the number of parts must be between 1 and %d, got %lld", BUILTIN_MAX_PARTS,
                       (long long)k);
            return bstop(c);
        }
        parts = (int)k;
    } else if (nv->kind == V_LIST || nv->kind == V_TUPLE) {
        int64_t len = nv->n;
        if (nv->kind == V_LIST && nv->len && (!dim_const(nv->len, &len) || len != nv->n)) {
            diag_error(c->at[1], "split: the list of sizes must have a known length, got %s", value_type_str(c->ar, nv));
            return bstop(c);
        }
        if (nv->n == 0) {
            diag_error(c->at[1], "split: the list of sizes is empty");
            return bstop(c);
        }
        parts = nv->n;
        sizes = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)parts);
        for (int i = 0; i < parts; i++) sizes[i] = bsize(c, nv->items[i], c->at[1], arena_printf(c->ar, "size %d", i));
    } else {
        diag_error(c->at[1], "split: 'n' must be an integer or a list of sizes, got %s", value_type_str(c->ar, nv));
        return bstop(c);
    }
    if (c->failed || c->unknown || !x || axis < 0) return bstop(c);
    const Dim *size = x->t.dims[axis];
    const char *xs = tensor_type_str(c->ar, &x->t);
    if (sizes) {
        const Dim *sum = dim_int(c->ar, 0);
        for (int i = 0; i < parts && sum; i++) sum = dim_add(c->ar, sum, sizes[i]);
        if (!sum || !dim_eq(sum, size)) {
            diag_error(c->at[1], "split: the sizes add up to %s but dimension %d of %s is %s", dim_str(c->ar, sum), axis, xs,
                       dim_str(c->ar, size));
            return bstop(c);
        }
    } else {
        int exact = 1;
        const Dim *part = dim_div(c->ar, size, dim_int(c->ar, parts), &exact);
        if (!part) {
            diag_error(c->at[1], "split: dimension %d of %s (size %s) does not divide into %d equal parts", axis, xs,
                       dim_str(c->ar, size), parts);
            diag_hint("give the sizes as a list instead: split(x, [s1, s2, ...])");
            return bstop(c);
        }
        sizes = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)parts);
        for (int i = 0; i < parts; i++) sizes[i] = part;
    }
    Value *tup = value_new(c->ar, V_TUPLE, c->args->at);
    tup->n = parts;
    tup->items = arena_alloc(c->ar, sizeof(Value *) * (size_t)parts);
    for (int i = 0; i < parts; i++) {
        Value *p = value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
        ((const Dim **)p->t.dims)[axis] = sizes[i];
        tup->items[i] = p;
    }
    return tup;
}

static Value *b_concat(BCall *c) {
    Value *xs = c->v[0];
    if (bopaque(xs)) return bstop(c);
    if (xs->kind != V_LIST && xs->kind != V_TUPLE) {
        diag_error(c->at[0], "concat: 'xs' must be a list of tensors, got %s", value_type_str(c->ar, xs));
        diag_hint("write concat([a, b], axis = -1)");
        return bstop(c);
    }
    if (xs->n == 0) {
        diag_error(c->at[0], "concat: the list is empty");
        return bstop(c);
    }
    for (int i = 0; i < xs->n; i++) {
        Value *it = xs->items[i];
        if (bopaque(it)) return bstop(c);
        if (it->kind != V_TENSOR) {
            diag_error(c->at[0], "concat: item %d is %s, not a tensor", i, value_type_str(c->ar, it));
            return bstop(c);
        }
    }
    const Value *first = xs->items[0];
    int axis = baxis(c, 1, first, -1);
    if (c->failed || c->unknown) return bstop(c);
    const char *fs = tensor_type_str(c->ar, &first->t);
    const Dim *total = first->t.dims[axis];
    for (int i = 1; i < xs->n; i++) {
        const Value *it = xs->items[i];
        const char *is = tensor_type_str(c->ar, &it->t);
        int bad = -1;
        if (it->t.rank == first->t.rank)
            for (int k = 0; k < it->t.rank && bad < 0; k++)
                if (k != axis && !dim_eq(it->t.dims[k], first->t.dims[k])) bad = k;
        if (it->t.dt != first->t.dt || it->t.rank != first->t.rank || bad >= 0) {
            diag_error(c->at[0], "concat: item %d has shape %s but item 0 has shape %s", i, is, fs);
            bnote_origin(c, it, arena_printf(c->ar, "the shape of item %d", i));
            if (it->t.dt != first->t.dt) diag_hint("give every item the same dtype");
            else if (it->t.rank != first->t.rank) diag_hint("every item needs the same rank");
            else diag_hint("dimension %d differs; only the concatenation axis (%d) may", bad, axis);
            return bstop(c);
        }
        total = dim_add(c->ar, total, it->t.dims[axis]);
    }
    if (xs->kind == V_LIST && xs->len) {
        int64_t len;
        /* a list of symbolic length holds one representative item */
        if (!dim_const(xs->len, &len)) total = dim_mul(c->ar, xs->len, first->t.dims[axis]);
    }
    if (!total) {
        diag_error(c->at[0], "concat: the concatenated size does not fit in 62 bits");
        return bstop(c);
    }
    Value *r = value_tensor(c->ar, first->t.dt, first->t.rank, first->t.dims, c->args->at);
    ((const Dim **)r->t.dims)[axis] = total;
    return r;
}

/* ---- reductions ---- */

enum { R_SUM, R_MEAN, R_MAX, R_MIN };

/* max(a, b) / min(a, b): elementwise, folded when both are known numbers. */
static Value *b_minmax2(BCall *c) {
    Value *a = c->v[0], *b = c->v[1];
    int is_max = c->b->op == R_MAX;
    if (c->v[2]) {
        diag_error(c->at[2], "%s: keepdim applies only to a reduction of one tensor", bname(c));
        return bstop(c);
    }
    if (bopaque(a) || bopaque(b)) return bstop(c);
    if (bis_number(a) && bis_number(b)) {
        int64_t n, d;
        double x, y;
        if (a->kind == V_INT && b->kind == V_INT) {
            const Dim *diff = dim_sub(c->ar, a->dim, b->dim);
            if (!dim_rational(diff, &n, &d)) return bstop(c); /* max(d, 64): depends on d */
            return (n >= 0) == is_max ? a : b;
        }
        if (value_number(a, &x) && value_number(b, &y)) return (x >= y) == is_max ? a : b;
        return value_float(c->ar, 0, 0, c->args->at);
    }
    return value_elementwise(c->ar, bname(c), a, c->at[0], b, c->at[1], c->args->at);
}

static Value *b_reduce(BCall *c) {
    int op = c->b->op;
    if ((op == R_MAX || op == R_MIN) && c->args->npos == 2) return b_minmax2(c);
    Value *xv = c->v[0];
    if (!bopaque(xv) && bis_number(xv)) {
        diag_error(c->at[0], "%s: 'x' must be a tensor, got %s", bname(c), value_type_str(c->ar, xv));
        if (op == R_MAX || op == R_MIN) diag_hint("%s(a, b) of two numbers takes both as positional arguments", bname(c));
        return bstop(c);
    }
    const Value *x = btensor(c, 0, 0);
    int all = !c->v[1] || c->v[1]->kind == V_NONE;
    int axis = all ? -1 : baxis(c, 1, x, 0);
    int keep = bflag(c, 2, 0);
    if (c->failed || c->unknown || !x) return bstop(c);
    DType dt = x->t.dt;
    if (op == R_MEAN && !dtype_is_float(dt)) dt = DT_F32;
    if (op == R_SUM && dt == DT_BOOL) dt = DT_I32;
    const Dim **dims = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)(x->t.rank + 1));
    int r = 0;
    for (int i = 0; i < x->t.rank; i++) {
        if (all || i == axis) {
            if (keep) dims[r++] = dim_int(c->ar, 1);
        } else {
            dims[r++] = x->t.dims[i];
        }
    }
    return value_tensor(c->ar, dt, r, dims, c->args->at);
}

enum { S_SOFTMAX, S_LOG_SOFTMAX, S_LOGSUMEXP };

static Value *b_softmax(BCall *c) {
    const Value *x = btensor(c, 0, 1);
    int axis = baxis(c, 1, x, -1);
    int keep = c->b->op == S_LOGSUMEXP ? bflag(c, 2, 0) : 1;
    if (c->failed || c->unknown || !x) return bstop(c);
    if (c->b->op != S_LOGSUMEXP) return value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
    const Dim **dims = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)(x->t.rank + 1));
    int r = 0;
    for (int i = 0; i < x->t.rank; i++) {
        if (i != axis) dims[r++] = x->t.dims[i];
        else if (keep) dims[r++] = dim_int(c->ar, 1);
    }
    return value_tensor(c->ar, x->t.dt, r, dims, c->args->at);
}

/* ---- normalisation, rope, attention ---- */

/* w (the weight or bias of a norm) must be [n] with n x's last dimension, in x's dtype. */
static void bnorm_vector(BCall *c, int i, const char *role, const Value *x) {
    const Value *w = btensor(c, i, 1);
    if (!w || !x) return;
    const Dim *n = x->t.dims[x->t.rank - 1];
    if (w->t.rank != 1 || !dim_eq(w->t.dims[0], n)) {
        diag_error(c->at[i], "%s: %s has shape %s but x's last dimension is %s", bname(c), role, tensor_type_str(c->ar, &w->t),
                   dim_str(c->ar, n));
        bnote_origin(c, w, arena_printf(c->ar, "the shape of '%s'", c->b->params[i]));
        diag_hint("%s", c->b->op ? "layernorm's weight and bias have shape [n], where n is x's last dimension"
                                 : "rmsnorm's weight has shape [n], where n is x's last dimension");
        c->failed = 1;
        return;
    }
    if (w->t.dt != x->t.dt) {
        diag_error(c->at[i], "%s: %s is %s but x is %s; their dtypes differ", bname(c), role, tensor_type_str(c->ar, &w->t),
                   tensor_type_str(c->ar, &x->t));
        c->failed = 1;
    }
}

static Value *b_norm_layer(BCall *c) {
    int has_bias = c->b->op;
    const Value *x = btensor(c, 0, 1);
    if (x && x->t.rank == 0) {
        diag_error(c->at[0], "%s: 'x' must have at least one dimension, got %s", bname(c), tensor_type_str(c->ar, &x->t));
        c->failed = 1;
        x = NULL;
    }
    bnorm_vector(c, 1, "weight", x);
    if (has_bias) bnorm_vector(c, 2, "bias", x);
    bpositive(c, has_bias ? 3 : 2, 1e-5);
    if (c->failed || c->unknown || !x) return bstop(c);
    return value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
}

static Value *b_rope(BCall *c) {
    const Value *x = btensor(c, 0, 1);
    bpositive(c, 1, 10000.0);
    if (!x) return bstop(c);
    const char *xs = tensor_type_str(c->ar, &x->t);
    if (x->t.rank < 2) {
        diag_error(c->at[0], "rope: 'x' must have rank 2 or more ([..., T, hd]), got %s", xs);
        return bstop(c);
    }
    int64_t hd;
    if (dim_const(x->t.dims[x->t.rank - 1], &hd) && hd % 2 != 0) {
        diag_error(c->at[0], "rope: the last dimension of %s must be even, got %lld", xs, (long long)hd);
        diag_hint("rope rotates pairs of features");
        return bstop(c);
    }
    if (c->v[2]) { /* pos: each row's position in its document, restarting the rotation there */
        const Value *pos = btensor(c, 2, 0);
        if (c->failed || c->unknown || !pos) return bstop(c);
        if (x->t.rank != 4 || pos->t.dt != DT_I32 || pos->t.rank != 2 || !dim_eq(pos->t.dims[0], x->t.dims[0]) ||
            !dim_eq(pos->t.dims[1], x->t.dims[2])) {
            diag_error(c->at[2], "rope: 'pos' must be i32[B, T] for 'x' [B, H, T, hd] (%s), got %s", xs,
                       tensor_type_str(c->ar, &pos->t));
            diag_hint("pass data.pos, the positions that restart at each document of tokens(..., docs = EOT)");
            return bstop(c);
        }
    }
    if (c->failed || c->unknown) return bstop(c);
    return value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
}

static Value *b_attention(BCall *c) {
    static const char *const layout[3] = {"[B, H, T, hd]", "[B, Hk, S, hd]", "[B, Hk, S, hv]"};
    const Value *t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = btensor(c, i, 1);
        if (t[i] && t[i]->t.rank != 4) {
            diag_error(c->at[i], "attention: '%s' must have rank 4 %s, got %s", c->b->params[i], layout[i],
                       tensor_type_str(c->ar, &t[i]->t));
            c->failed = 1;
            t[i] = NULL;
        }
    }
    bflag(c, 3, 1);
    if (c->failed || c->unknown || !t[0] || !t[1] || !t[2]) return bstop(c);
    const Value *q = t[0], *k = t[1], *v = t[2];
    const char *qs = tensor_type_str(c->ar, &q->t), *ks = tensor_type_str(c->ar, &k->t), *vs = tensor_type_str(c->ar, &v->t);
    if (k->t.dt != q->t.dt || v->t.dt != q->t.dt) {
        int i = k->t.dt != q->t.dt ? 1 : 2;
        diag_error(c->at[i], "attention: '%s' is %s but 'q' is %s; their dtypes differ", c->b->params[i], i == 1 ? ks : vs, qs);
        return bstop(c);
    }
    if (!dim_eq(k->t.dims[0], q->t.dims[0])) {
        diag_error(c->at[1], "attention: the batch dimension of 'k' is %s but that of 'q' is %s", dim_str(c->ar, k->t.dims[0]),
                   dim_str(c->ar, q->t.dims[0]));
        bnote_origin(c, k, "the shape of 'k'");
        return bstop(c);
    }
    if (!dim_eq(k->t.dims[3], q->t.dims[3])) {
        diag_error(c->at[1], "attention: the head dimension of 'k' is %s but that of 'q' is %s", dim_str(c->ar, k->t.dims[3]),
                   dim_str(c->ar, q->t.dims[3]));
        bnote_origin(c, k, "the shape of 'k'");
        diag_hint("q is [B, H, T, hd] and k is [B, Hk, S, hd]: their last dimensions must agree");
        return bstop(c);
    }
    for (int i = 0; i < 3; i++)
        if (!dim_eq(v->t.dims[i], k->t.dims[i])) {
            diag_error(c->at[2], "attention: 'v' has shape %s but 'k' has shape %s; they must agree in B, Hk and S", vs, ks);
            bnote_origin(c, v, "the shape of 'v'");
            return bstop(c);
        }
    int64_t h, hk;
    const Dim *H = q->t.dims[1], *Hk = k->t.dims[1];
    if (dim_const(H, &h) && dim_const(Hk, &hk) && hk > 0 && h % hk != 0) {
        diag_error(c->at[1], "attention: 'q' has %lld heads, not a multiple of the %lld heads of 'k'", (long long)h,
                   (long long)hk);
        diag_hint("grouped-query attention shares each key/value head among H / Hk query heads");
        return bstop(c);
    }
    if (c->v[4]) { /* pos: each query's position in its document, which masks keys of earlier documents */
        const Value *pos = btensor(c, 4, 0);
        if (c->failed || c->unknown || !pos) return bstop(c);
        if (pos->t.dt != DT_I32 || pos->t.rank != 2 || !dim_eq(pos->t.dims[0], q->t.dims[0]) ||
            !dim_eq(pos->t.dims[1], q->t.dims[2])) {
            diag_error(c->at[4], "attention: 'pos' must be i32[B, T] (the batch and query length of 'q', %s), got %s", qs,
                       tensor_type_str(c->ar, &pos->t));
            diag_hint("pass data.pos, the positions that restart at each document of tokens(..., docs = EOT)");
            return bstop(c);
        }
        if (!dim_eq(k->t.dims[2], q->t.dims[2])) {
            diag_error(c->at[4], "attention: 'pos' needs as many keys as queries, but 'k' has %s and 'q' %s",
                       dim_str(c->ar, k->t.dims[2]), dim_str(c->ar, q->t.dims[2]));
            return bstop(c);
        }
        if (!bflag(c, 3, 1)) {
            diag_error(c->at[4], "attention: 'pos' masks documents within causal attention; it needs causal = true");
            return bstop(c);
        }
    }
    const Dim *dims[4] = {q->t.dims[0], q->t.dims[1], q->t.dims[2], v->t.dims[3]};
    return value_tensor(c->ar, q->t.dt, 4, dims, c->args->at);
}

/* ---- losses ---- */

static Value *b_cross_entropy(BCall *c) {
    const Value *logits = btensor(c, 0, 1), *tg = btensor(c, 1, 0);
    if (logits && logits->t.rank == 0) {
        diag_error(c->at[0], "cross_entropy: 'logits' must have at least one dimension, got %s",
                   tensor_type_str(c->ar, &logits->t));
        return bstop(c);
    }
    if (tg && tg->t.dt != DT_I32 && tg->t.dt != DT_I64) {
        diag_error(c->at[1], "cross_entropy: 'targets' must be an integer tensor, got %s", tensor_type_str(c->ar, &tg->t));
        return bstop(c);
    }
    if (c->failed || c->unknown || !logits || !tg) return bstop(c);
    int ok = tg->t.rank == logits->t.rank - 1;
    for (int i = 0; ok && i < tg->t.rank; i++) ok = dim_eq(tg->t.dims[i], logits->t.dims[i]);
    if (!ok) {
        diag_error(c->at[1], "cross_entropy: 'targets' has shape %s but 'logits' has shape %s", tensor_type_str(c->ar, &tg->t),
                   tensor_type_str(c->ar, &logits->t));
        bnote_origin(c, tg, "the shape of 'targets'");
        diag_hint("targets must have the shape of logits without its last (class) dimension");
        return bstop(c);
    }
    return value_tensor(c->ar, DT_F32, 0, NULL, c->args->at);
}

static Value *b_mse(BCall *c) {
    const Value *a = btensor(c, 0, 1), *b = btensor(c, 1, 1);
    if (c->failed || c->unknown || !a || !b) return bstop(c);
    if (a->t.dt != b->t.dt) {
        diag_error(c->args->at, "mse: dtypes differ: %s vs %s", tensor_type_str(c->ar, &a->t), tensor_type_str(c->ar, &b->t));
        return bstop(c);
    }
    if (!tensor_type_eq(&a->t, &b->t)) {
        diag_error(c->args->at, "mse: shapes differ: %s vs %s", tensor_type_str(c->ar, &a->t), tensor_type_str(c->ar, &b->t));
        bnote_origin(c, b, "the shape of 'b'");
        return bstop(c);
    }
    return value_tensor(c->ar, DT_F32, 0, NULL, c->args->at);
}

/* ---- topk, where, one_hot, arange, zeros, ones ---- */

static Value *b_topk(BCall *c) {
    const Value *x = btensor(c, 0, 0);
    const Dim *k = c->v[1] ? bsize(c, c->v[1], c->at[1], "'k'") : NULL;
    int axis = baxis(c, 2, x, -1);
    if (c->failed || c->unknown || !x || !k || axis < 0) return bstop(c);
    const Dim *size = x->t.dims[axis];
    const Dim *diff = dim_sub(c->ar, k, size);
    int64_t n, d;
    if (dim_rational(diff, &n, &d) && n > 0) {
        diag_error(c->at[1], "topk: k = %s is larger than dimension %d of %s (size %s)", dim_str(c->ar, k), axis,
                   tensor_type_str(c->ar, &x->t), dim_str(c->ar, size));
        return bstop(c);
    }
    Value *vals = value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
    Value *idx = value_tensor(c->ar, DT_I32, x->t.rank, x->t.dims, c->args->at);
    ((const Dim **)vals->t.dims)[axis] = k;
    ((const Dim **)idx->t.dims)[axis] = k;
    Value *tup = value_new(c->ar, V_TUPLE, c->args->at);
    tup->n = 2;
    tup->items = arena_alloc(c->ar, sizeof(Value *) * 2);
    tup->items[0] = vals;
    tup->items[1] = idx;
    return tup;
}

static Value *b_where(BCall *c) {
    Value *cond = c->v[0], *a = c->v[1], *b = c->v[2];
    if (!bopaque(cond) && cond->kind != V_BOOL && !(cond->kind == V_TENSOR && cond->t.dt == DT_BOOL)) {
        diag_error(c->at[0], "where: the condition must be a bool or a bool tensor, got %s", value_type_str(c->ar, cond));
        diag_hint("make a mask with a comparison, e.g. x > 0");
        return bstop(c);
    }
    if (bopaque(cond) || bopaque(a) || bopaque(b)) return bstop(c);
    if (cond->kind == V_BOOL) {
        if (cond->bknown && bis_number(a) && bis_number(b)) return cond->b ? a : b;
        return value_elementwise(c->ar, "where", a, c->at[1], b, c->at[2], c->args->at);
    }
    if (bis_number(a) && bis_number(b)) {
        /* where(mask, 1, 0): the mask's shape, the numbers' kind */
        DType dt = a->kind == V_FLOAT || b->kind == V_FLOAT ? DT_F32 : DT_I32;
        return value_tensor(c->ar, dt, cond->t.rank, cond->t.dims, c->args->at);
    }
    Value *ab = value_elementwise(c->ar, "where", a, c->at[1], b, c->at[2], c->args->at);
    if (bopaque(ab)) return ab;
    Value *r = value_elementwise(c->ar, "where", cond, c->at[0], ab, span_join(c->at[1], c->at[2]), c->args->at);
    if (bopaque(r)) return r;
    r->t.dt = ab->t.dt; /* the mask only selects: the dtype is that of the values */
    return r;
}

static Value *b_one_hot(BCall *c) {
    const Value *idx = btensor(c, 0, 0);
    const Dim *n = c->v[1] ? bsize(c, c->v[1], c->at[1], "'n'") : NULL;
    if (idx && idx->t.dt != DT_I32 && idx->t.dt != DT_I64) {
        diag_error(c->at[0], "one_hot: 'idx' must be an integer tensor, got %s", tensor_type_str(c->ar, &idx->t));
        return bstop(c);
    }
    if (c->failed || c->unknown || !idx || !n) return bstop(c);
    const Dim **dims = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)(idx->t.rank + 1));
    for (int i = 0; i < idx->t.rank; i++) dims[i] = idx->t.dims[i];
    dims[idx->t.rank] = n;
    return value_tensor(c->ar, DT_F32, idx->t.rank + 1, dims, c->args->at);
}

static Value *b_arange(BCall *c) {
    const Dim *n = c->v[0] ? bsize(c, c->v[0], c->at[0], "'n'") : NULL;
    if (c->failed || c->unknown || !n) return bstop(c);
    return value_tensor(c->ar, DT_I32, 1, &n, c->args->at);
}

static Value *b_fill(BCall *c) {
    Value **vals;
    Span *spans;
    int n = bdims_args(c, &vals, &spans);
    const Dim **dims = arena_alloc(c->ar, sizeof(const Dim *) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) dims[i] = bsize(c, vals[i], spans[i], arena_printf(c->ar, "dimension %d", i));
    if (c->failed || c->unknown) return bstop(c);
    return value_tensor(c->ar, c->fill_dt, n, dims, c->args->at);
}

/* ---- dropout, norm, clamp ---- */

static Value *b_dropout(BCall *c) {
    const Value *x = btensor(c, 0, 1);
    double p;
    int known;
    if (bnumber(c, 1, 0, &p, &known) && known && !(p >= 0 && p < 1)) {
        diag_error(c->at[1], "dropout: 'p' must be in [0, 1), got %s", value_float_str(c->ar, p));
        return bstop(c);
    }
    if (c->failed || c->unknown || !x) return bstop(c);
    return value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
}

/* global_mean(x): the mean of x over every micro-batch of the step (docs/language.md); f32, shaped
 * like x, a constant of the backward. */
static Value *b_global_mean(BCall *c) {
    const Value *x = btensor(c, 0, 1);
    return bresult(c, x ? value_tensor(c->ar, DT_F32, x->t.rank, x->t.dims, c->args->at) : NULL);
}

/* training(): 1 in the training step (forward_backward and its statistics pass), 0 in evaluation
 * (forward_loss) and generation (forward_logits): f32[], the dropout key's training word
 * (docs/language.md). A layer selects batch or running statistics with it. */
static Value *b_training(BCall *c) { return bresult(c, value_tensor(c->ar, DT_F32, 0, NULL, c->args->at)); }

/* running(buf, x, momentum = 0.1): buf's value (a parameter, frozen by this; the builder checks
 * that), which after every optimizer step becomes (1 - momentum) buf + momentum global_mean(x)
 * (docs/language.md); x has buf's shape. */
static Value *b_running(BCall *c) {
    const Value *buf = btensor(c, 0, 1), *x = btensor(c, 1, 1);
    double m;
    int known;
    if (bnumber(c, 2, 0.1, &m, &known) && known && !(m > 0 && m <= 1)) {
        diag_error(c->at[2], "running: 'momentum' must be in (0, 1], got %s", value_float_str(c->ar, m));
        return bstop(c);
    }
    if (c->failed || c->unknown || !buf || !x) return bstop(c);
    int same = x->t.rank == buf->t.rank;
    for (int i = 0; same && i < x->t.rank; i++) same = dim_eq(x->t.dims[i], buf->t.dims[i]);
    if (!same) {
        diag_error(c->at[1], "running: the statistic's shape differs from the buffer's");
        return bstop(c);
    }
    return value_tensor(c->ar, buf->t.dt, buf->t.rank, buf->t.dims, c->args->at); /* bf16 under precision = bf16 */
}

static Value *b_norm(BCall *c) {
    const Value *x = btensor(c, 0, 1);
    return bresult(c, x ? value_tensor(c->ar, DT_F32, 0, NULL, c->args->at) : NULL);
}

static Value *b_clamp(BCall *c) {
    Value *x = c->v[0];
    double lo, hi, v;
    int klo = 0, khi = 0;
    int ok = bnumber(c, 1, 0, &lo, &klo) & bnumber(c, 2, 0, &hi, &khi);
    if (ok && klo && khi && lo > hi) {
        diag_error(c->args->at, "clamp: 'lo' (%s) is greater than 'hi' (%s)", value_float_str(c->ar, lo),
                   value_float_str(c->ar, hi));
        return bstop(c);
    }
    if (bopaque(x) || c->failed || c->unknown) return bstop(c);
    if (x->kind == V_TENSOR) {
        if (x->t.dt == DT_BOOL) {
            diag_error(c->at[0], "clamp: 'x' must be a numeric tensor, got %s", tensor_type_str(c->ar, &x->t));
            return bstop(c);
        }
        return value_tensor(c->ar, x->t.dt, x->t.rank, x->t.dims, c->args->at);
    }
    if (!bis_number(x)) {
        diag_error(c->at[0], "clamp: 'x' must be a number or a tensor, got %s", value_type_str(c->ar, x));
        return bstop(c);
    }
    int all_int = x->kind == V_INT && c->v[1]->kind == V_INT && c->v[2]->kind == V_INT;
    if (!value_number(x, &v) || !klo || !khi) return all_int ? bstop(c) : value_float(c->ar, 0, 0, c->args->at);
    if (all_int) return v < lo ? c->v[1] : v > hi ? c->v[2] : x;
    return value_float(c->ar, v < lo ? lo : v > hi ? hi : v, 1, c->args->at);
}

/* ---- pi ---- */

static Value *b_pi(BCall *c) {
    diag_error(c->args->callee_at, "'pi' is a number, not a function");
    diag_hint("write pi without parentheses");
    return bstop(c);
}

/* ---- the table ---- */

#define P(...) {__VA_ARGS__, NULL}
#define MATH(n, o) {n, P("x"), 1, 0, b_math, o, n "(x)"}

static const Builtin builtin_table[] = {
    MATH("exp", M_EXP),
    MATH("log", M_LOG),
    MATH("sqrt", M_SQRT),
    MATH("rsqrt", M_RSQRT),
    MATH("tanh", M_TANH),
    MATH("sigmoid", M_SIGMOID),
    MATH("relu", M_RELU),
    MATH("gelu", M_GELU),
    MATH("silu", M_SILU),
    MATH("abs", M_ABS),
    MATH("sign", M_SIGN),
    MATH("sin", M_SIN),
    MATH("cos", M_COS),
    {"matmul", P("a", "b"), 2, 0, b_matmul, 0, "matmul(a, b)"},
    {"transpose", P("x", "i", "j"), 3, 0, b_transpose, 0, "transpose(x, i, j)"},
    {"reshape", P("x"), 1, 1, b_reshape, 0, "reshape(x, d1, ..., dn)"},
    {"split", P("x", "n", "axis"), 2, 0, b_split, 0, "split(x, n, axis = -1) or split(x, [s1, s2, ...], axis = -1)"},
    {"concat", P("xs", "axis"), 1, 0, b_concat, 0, "concat([a, b, ...], axis = -1)"},
    {"sum", P("x", "axis", "keepdim"), 1, 0, b_reduce, R_SUM, "sum(x, axis = none, keepdim = false)"},
    {"mean", P("x", "axis", "keepdim"), 1, 0, b_reduce, R_MEAN, "mean(x, axis = none, keepdim = false)"},
    {"max", P("x", "axis", "keepdim"), 1, 0, b_reduce, R_MAX, "max(x, axis = none, keepdim = false) or max(a, b)"},
    {"min", P("x", "axis", "keepdim"), 1, 0, b_reduce, R_MIN, "min(x, axis = none, keepdim = false) or min(a, b)"},
    {"softmax", P("x", "axis"), 1, 0, b_softmax, S_SOFTMAX, "softmax(x, axis = -1)"},
    {"log_softmax", P("x", "axis"), 1, 0, b_softmax, S_LOG_SOFTMAX, "log_softmax(x, axis = -1)"},
    {"logsumexp", P("x", "axis", "keepdim"), 1, 0, b_softmax, S_LOGSUMEXP, "logsumexp(x, axis = -1, keepdim = false)"},
    {"layernorm", P("x", "w", "b", "eps"), 3, 0, b_norm_layer, 1, "layernorm(x, w, b, eps = 1e-5)"},
    {"rmsnorm", P("x", "w", "eps"), 2, 0, b_norm_layer, 0, "rmsnorm(x, w, eps = 1e-6)"},
    {"rope", P("x", "theta", "pos"), 1, 0, b_rope, 0, "rope(x, theta = 10000.0, pos = none)"},
    {"attention", P("q", "k", "v", "causal", "pos"), 3, 0, b_attention, 0, "attention(q, k, v, causal = true, pos = none)"},
    {"cross_entropy", P("logits", "targets"), 2, 0, b_cross_entropy, 0, "cross_entropy(logits, targets)"},
    {"mse", P("a", "b"), 2, 0, b_mse, 0, "mse(a, b)"},
    {"topk", P("x", "k", "axis"), 2, 0, b_topk, 0, "topk(x, k, axis = -1)"},
    {"where", P("c", "a", "b"), 3, 0, b_where, 0, "where(c, a, b)"},
    {"one_hot", P("idx", "n"), 2, 0, b_one_hot, 0, "one_hot(idx, n)"},
    {"arange", P("n"), 1, 0, b_arange, 0, "arange(n)"},
    {"zeros", {NULL}, 0, 1, b_fill, 0, "zeros(d1, ..., dn)"},
    {"ones", {NULL}, 0, 1, b_fill, 0, "ones(d1, ..., dn)"},
    {"dropout", P("x", "p"), 2, 0, b_dropout, 0, "dropout(x, p)"},
    {"norm", P("x"), 1, 0, b_norm, 0, "norm(x)"},
    {"global_mean", P("x"), 1, 0, b_global_mean, 0, "global_mean(x)"},
    {"training", {NULL}, 0, 0, b_training, 0, "training()"},
    {"running", P("buf", "x", "momentum"), 2, 0, b_running, 0, "running(buf, x, momentum = 0.1)"},
    {"clamp", P("x", "lo", "hi"), 3, 0, b_clamp, 0, "clamp(x, lo, hi)"},
    {"float", P("x"), 1, 0, b_convert, CONV_FLOAT, "float(x)"},
    {"int", P("x"), 1, 0, b_convert, CONV_INT, "int(x)"},
    {"floor", P("x"), 1, 0, b_convert, CONV_FLOOR, "floor(x)"},
    {"pi", {NULL}, 0, 0, b_pi, 0, "pi"},
};

#define BUILTIN_COUNT ((int)(sizeof builtin_table / sizeof builtin_table[0]))

const Builtin *builtin_find(Str name) {
    for (int i = 0; i < BUILTIN_COUNT; i++)
        if (str_eqc(name, builtin_table[i].name)) return &builtin_table[i];
    return NULL;
}

const char *builtin_name(const Builtin *b) { return b->name; }
int builtin_count(void) { return BUILTIN_COUNT; }
const char *builtin_name_at(int i) { return i >= 0 && i < BUILTIN_COUNT ? builtin_table[i].name : NULL; }
const char *builtin_param(const Builtin *b, int i) {
    return b && i >= 0 && i <= BUILTIN_MAX_PARAMS ? b->params[i] : NULL; /* params is NULL-terminated */
}

Value *builtin_value(Arena *ar, const Builtin *b, Span at) {
    if (b->fn == b_pi) return value_float(ar, 3.14159265358979323846, 1, at);
    Value *v = value_new(ar, V_BUILTIN, at);
    v->builtin = b;
    return v;
}

/* ---- binding arguments to parameters ---- */

static int builtin_nparams(const Builtin *b) {
    int n = 0;
    while (b->params[n]) n++;
    return n;
}

/* Binds positional and keyword arguments; 0 after reporting an error. */
static int builtin_bind(BCall *c) {
    const Builtin *b = c->b;
    const CallArgs *a = c->args;
    int np = builtin_nparams(b);
    if (a->npos > np && !b->variadic) {
        diag_error(a->pos_at[np], "%s: takes at most %d argument%s, got %d", b->name, np, np == 1 ? "" : "s", a->npos);
        diag_hint("usage: %s", b->usage);
        return 0;
    }
    for (int i = 0; i < a->npos && i < np; i++) {
        c->v[i] = a->pos[i];
        c->at[i] = a->pos_at[i];
    }
    if (a->npos > np) {
        c->rest = a->pos + np;
        c->rest_at = a->pos_at + np;
        c->nrest = a->npos - np;
    }
    for (int k = 0; k < a->nkw; k++) {
        Str name = a->kw_name[k];
        int i = 0;
        while (i < np && !str_eqc(name, b->params[i])) i++;
        if (i == np) {
            diag_error(a->kw_at[k], "%s: unknown keyword argument '%.*s'", b->name, (int)name.len, name.p);
            const char *best = NULL;
            int bestd = 3;
            for (int j = 0; j < np; j++) {
                int d = diag_edit_distance(name.p, name.len, b->params[j], (uint32_t)strlen(b->params[j]), 2);
                if (d < bestd) {
                    bestd = d;
                    best = b->params[j];
                }
            }
            if (best) diag_hint("did you mean '%s'?", best);
            else diag_hint("usage: %s", b->usage);
            return 0;
        }
        if (c->v[i]) {
            diag_error(a->kw_at[k], "%s: argument '%s' given twice", b->name, b->params[i]);
            return 0;
        }
        c->v[i] = a->kw[k];
        c->at[i] = a->kw_at[k];
    }
    for (int i = 0; i < b->nreq; i++)
        if (!c->v[i]) {
            diag_error(a->at, "%s: missing argument '%s'", b->name, b->params[i]);
            diag_hint("usage: %s", b->usage);
            return 0;
        }
    return 1;
}

Value *builtin_call(Arena *ar, const Builtin *b, const CallArgs *args, DType fill_dt) {
    if (!b || !args) INTERNAL("builtin_call without a builtin or arguments");
    BCall c = {0};
    c.fill_dt = fill_dt;
    c.ar = ar;
    c.b = b;
    c.args = args;
    if (b->fn == b_pi) return b_pi(&c); /* pi(...) is wrong whatever the arguments */
    if (!builtin_bind(&c)) return value_unknown(ar, args->at);
    Value *r = b->fn(&c);
    return r ? r : value_unknown(ar, args->at);
}
