/* value.c - dtypes, value constructors and how values are printed in diagnostics (see value.h).
 *
 * Pipeline position: sema's abstract interpreter produces Values; shape.c and builtins.c compute
 * new ones from old. Everything a diagnostic says about a value's type comes from
 * tensor_type_str, value_type_str (shape.c's and builtins.c's wording) and value_describe (the
 * checker's and the graph builder's) here, so the wording is decided in one place. */
#include "value.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- dtypes ---- */

static const char *const dtype_names[DT_COUNT] = {"f32", "f16", "bf16", "f64", "i32", "i64", "bool"};

const char *dtype_name(DType dt) { return dt >= 0 && dt < DT_COUNT ? dtype_names[dt] : "?"; }

int dtype_size(DType dt) {
    switch (dt) {
    case DT_F16:
    case DT_BF16: return 2;
    case DT_F64:
    case DT_I64: return 8;
    case DT_BOOL: return 1;
    case DT_F32:
    case DT_I32: return 4;
    case DT_COUNT: break;
    }
    return 0;
}

int dtype_parse(Str s, DType *out) {
    for (int i = 0; i < DT_COUNT; i++)
        if (str_eqc(s, dtype_names[i])) {
            *out = (DType)i;
            return 1;
        }
    return 0;
}

int dtype_is_float(DType dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16 || dt == DT_F64; }

/* ---- tensor types ---- */

char *tensor_type_str(Arena *ar, const TensorType *t) {
    /* Measure first, then fill: shapes are short but dims can be long polynomials. */
    char **parts = arena_alloc(ar, sizeof(char *) * (size_t)(t->rank + 1));
    size_t len = strlen(dtype_name(t->dt)) + 3;
    for (int i = 0; i < t->rank; i++) {
        parts[i] = dim_str(ar, t->dims ? t->dims[i] : NULL);
        len += strlen(parts[i]) + 2;
    }
    char *s = arena_alloc(ar, len), *p = s;
    p += sprintf(p, "%s[", dtype_name(t->dt));
    for (int i = 0; i < t->rank; i++) p += sprintf(p, "%s%s", i ? ", " : "", parts[i]);
    strcpy(p, "]");
    return s;
}

int tensor_type_eq(const TensorType *a, const TensorType *b) {
    if (a->dt != b->dt || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (!dim_eq(a->dims[i], b->dims[i])) return 0;
    return 1;
}

/* ---- constructors ---- */

static const char *const kind_names[V_KIND_COUNT] = {
    [V_UNKNOWN] = "unknown",     [V_NONE] = "none",        [V_INT] = "integer",     [V_FLOAT] = "float",
    [V_BOOL] = "bool",           [V_STRING] = "string",    [V_TENSOR] = "tensor",   [V_TUPLE] = "tuple",
    [V_LIST] = "list",           [V_RANGE] = "range",      [V_MODULE] = "module",   [V_MODEL_DEF] = "model declaration",
    [V_MODEL] = "model",         [V_FN] = "function",      [V_BUILTIN] = "builtin", [V_OPTIMIZER_DEF] = "optimizer declaration",
    [V_OPTIMIZER] = "optimizer", [V_DATA] = "data source",
};

const char *value_kind_name(ValueKind k) { return k >= 0 && k < V_KIND_COUNT ? kind_names[k] : "?"; }

Value *value_new(Arena *ar, ValueKind k, Span origin) {
    Value *v = arena_alloc(ar, sizeof(Value));
    v->kind = k;
    v->origin = origin;
    return v;
}

Value *value_unknown(Arena *ar, Span origin) { return value_new(ar, V_UNKNOWN, origin); }

Value *value_int(Arena *ar, const Dim *d, Span origin) {
    Value *v = value_new(ar, V_INT, origin);
    v->dim = d;
    return v;
}

Value *value_float(Arena *ar, double f, int known, Span origin) {
    Value *v = value_new(ar, V_FLOAT, origin);
    v->f = known ? f : 0.0;
    v->fknown = known;
    return v;
}

Value *value_bool(Arena *ar, int b, int known, Span origin) {
    Value *v = value_new(ar, V_BOOL, origin);
    v->b = known ? (b != 0) : 0;
    v->bknown = known;
    return v;
}

Value *value_tensor(Arena *ar, DType dt, int rank, const Dim **dims, Span origin) {
    Value *v = value_new(ar, V_TENSOR, origin);
    v->t.dt = dt;
    v->t.rank = rank;
    v->t.dims = arena_dup(ar, dims, sizeof(const Dim *) * (size_t)rank);
    return v;
}

/* ---- printing ---- */

char *value_float_str(Arena *ar, double f) {
    if (isnan(f)) return arena_printf(ar, "nan");
    if (isinf(f)) return arena_printf(ar, f < 0 ? "-inf" : "inf");
    /* The fewest significant digits that read back exactly are what the user most likely wrote;
     * like Python's repr, plain notation for 1e-4 <= |f| < 1e16 and an exponent outside. */
    char sci[40], out[400];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, f);
        if (strtod(sci, NULL) == f) break;
    }
    snprintf(sci, sizeof sci, "%.*e", prec - 1, f);
    char *e = strchr(sci, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (f != 0 && (exp10 < -4 || exp10 >= 16)) {
        /* 1.5e-08 -> 1.5e-8 */
        *e = 0;
        snprintf(out, sizeof out, "%se%d", sci, exp10);
        return arena_strndup(ar, out, strlen(out));
    }
    int decimals = prec - 1 - exp10;
    snprintf(out, sizeof out, "%.*f", decimals > 0 ? decimals : 0, f);
    if (!strchr(out, '.')) strcat(out, ".0");
    return arena_strndup(ar, out, strlen(out));
}

int value_number(const Value *v, double *out) {
    if (!v) return 0;
    if (v->kind == V_FLOAT && v->fknown) {
        *out = v->f;
        return 1;
    }
    int64_t n, d;
    if (v->kind == V_INT && dim_rational(v->dim, &n, &d)) {
        *out = (double)n / (double)d;
        return 1;
    }
    return 0;
}

/* The name of the declaration behind a model/fn/optimizer value, or "" when there is none. */
static const char *value_decl_name(Arena *ar, const Value *v) {
    if (!v->node || v->node->name.len == 0) return "";
    return arena_printf(ar, " %.*s", (int)v->node->name.len, v->node->name.p);
}

/* Lists nest as deep as a program makes them (`x = [x]` in a loop: a million levels within the
 * checker's memory limit), so the description looks 4 levels in and no further: bounded C stack
 * and message length. */
#define VALUE_TYPE_DEPTH 4

static char *value_type_str_at(Arena *ar, const Value *v, int depth);

char *value_type_str(Arena *ar, const Value *v) { return value_type_str_at(ar, v, 0); }

static char *value_type_str_at(Arena *ar, const Value *v, int depth) {
    if (!v) return arena_printf(ar, "unknown");
    switch (v->kind) {
    case V_INT: return v->dim ? arena_printf(ar, "integer %s", dim_str(ar, v->dim)) : arena_printf(ar, "integer");
    case V_FLOAT: return v->fknown ? arena_printf(ar, "float %s", value_float_str(ar, v->f)) : arena_printf(ar, "float");
    case V_BOOL: return v->bknown ? arena_printf(ar, "bool %s", v->b ? "true" : "false") : arena_printf(ar, "bool");
    case V_TENSOR: return tensor_type_str(ar, &v->t);
    case V_TUPLE: return arena_printf(ar, "tuple of %d", v->n);
    case V_LIST: {
        const char *len = v->len ? dim_str(ar, v->len) : arena_printf(ar, "%d", v->n);
        if (v->n == 0 || !v->items) return arena_printf(ar, "empty list");
        if (depth >= VALUE_TYPE_DEPTH) return arena_printf(ar, "list of %s items", len);
        /* Name the items when they all look alike (the usual list of blocks). */
        const char *first = value_type_str_at(ar, v->items[0], depth + 1);
        for (int i = 1; i < v->n; i++)
            if (strcmp(first, value_type_str_at(ar, v->items[i], depth + 1)) != 0)
                return arena_printf(ar, "list of %s items", len);
        return arena_printf(ar, "list of %s %s", len, first);
    }
    case V_RANGE: return arena_printf(ar, "range %s..%s", dim_str(ar, v->dim), dim_str(ar, v->len));
    case V_MODEL_DEF:
    case V_MODEL:
    case V_FN:
    case V_OPTIMIZER_DEF:
    case V_OPTIMIZER: return arena_printf(ar, "%s%s", value_kind_name(v->kind), value_decl_name(ar, v));
    case V_BUILTIN: return v->builtin ? arena_printf(ar, "builtin %s", builtin_name(v->builtin)) : arena_printf(ar, "builtin");
    default: return arena_printf(ar, "%s", value_kind_name(v->kind));
    }
}

char *value_describe(Arena *ar, const Value *v) {
    if (!v) return "an unknown value";
    const char *nm = "?";
    if (v->node) /* the declaration's name (an empty one when it has none) */
        nm = v->node->name.p ? arena_strndup(ar, v->node->name.p, v->node->name.len) : "";
    int64_t k;
    switch (v->kind) {
    case V_UNKNOWN: return "an unknown value";
    case V_NONE: return "none";
    case V_INT:
        if (!v->dim) return "an integer";
        if (dim_const(v->dim, &k)) return arena_printf(ar, "integer %lld", (long long)k);
        return arena_printf(ar, "integer %s", dim_str(ar, v->dim));
    case V_FLOAT: return v->fknown ? arena_printf(ar, "float %g", v->f) : "a float";
    case V_BOOL: return v->bknown ? (v->b ? "bool true" : "bool false") : "a bool";
    case V_STRING: return v->s ? arena_printf(ar, "string \"%s\"", v->s) : "a string";
    case V_TENSOR: return tensor_type_str(ar, &v->t);
    case V_TUPLE: return arena_printf(ar, "a tuple of %d", v->n);
    case V_LIST:
        if (v->len && dim_const(v->len, &k)) return arena_printf(ar, "a list of %lld", (long long)k);
        return "a list";
    case V_RANGE: return "a range";
    case V_MODULE: return v->s ? arena_printf(ar, "module '%s'", v->s) : "a module";
    case V_MODEL_DEF: return arena_printf(ar, "model definition '%s'", nm);
    case V_MODEL: return arena_printf(ar, "model '%s'", nm);
    case V_FN: return arena_printf(ar, "function '%s'", nm);
    case V_BUILTIN: return arena_printf(ar, "builtin '%s'", v->builtin ? builtin_name(v->builtin) : "?");
    case V_OPTIMIZER_DEF: return arena_printf(ar, "optimizer definition '%s'", nm);
    case V_OPTIMIZER: return arena_printf(ar, "optimizer '%s'", nm);
    case V_DATA: return "a data source";
    default: return "a value";
    }
}
