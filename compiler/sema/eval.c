/* eval.c - abstract evaluation of .mbt statements and expressions to Values (value.h).
 *
 * Pipeline position: AST -> [sema: sema.c drives, eval.c evaluates] -> graph IR.
 * One walk serves two purposes. Checked on its own ("generic"), a model's constants are
 * symbolic integers (dim_sym of their names), so a shape error found then holds for every
 * instantiation; a function's parameters take their declared types with fresh symbols for the
 * upper-case dimensions. Instantiated by a train or serve block, constants are numbers, every
 * `for` over a known range is unrolled, every sub-model is built, and every call is evaluated
 * inline with the argument's shapes (eval_call.c) - the walk along which the graph builder
 * (graph_build.c) hangs IR nodes off tensor values (Value.graph_id), through the hooks marked
 * "graph builder hook" below: each is a no-op unless gb_listening(), so --check is unaffected.
 *
 * Errors inside a body are reported once: a body that reported errors is marked broken (its
 * NodeInfo) and is not evaluated again - calls to it give its declared result, instances of it
 * V_UNKNOWN - and sema_error drops exact repeats. Shape rules of operators and builtins live in
 * shape.c and builtins.c; this file decides what to evaluate, in which scope, and checks
 * names, declared types, returns and statements. */
#include <stdio.h>
#include <string.h>

#include "eval_internal.h"
/* ---- small helpers ---- */

Value *unknown_at(Sema *s, Span at) { return value_unknown(s->ar, at); }

Span span_or(const Node *n, Span fallback) { return n ? n->span : fallback; }

int is_upper_name(Str name) { return name.len > 0 && name.p[0] >= 'A' && name.p[0] <= 'Z'; }

Frame frame_make(Sema *s, FrameKind k, Scope *sc, int generic) {
    Frame f;
    memset(&f, 0, sizeof f);
    f.s = s;
    f.kind = k;
    f.scope = sc;
    f.fname = sc && sc->name ? sc->name : "";
    f.generic = generic;
    return f;
}

Span decl_name_span(const Node *decl) { return decl ? sema_span_of(decl, decl->name) : span_none(); }

/* A number known at compile time (an integer or a float). */
static int number_known(const Value *v, double *out) {
    int64_t k;
    if (v->kind == V_INT && v->dim && dim_const(v->dim, &k)) {
        *out = (double)k;
        return 1;
    }
    if (v->kind == V_FLOAT && v->fknown) {
        *out = v->f;
        return 1;
    }
    return 0;
}

int is_number(const Value *v) {
    return v->kind == V_INT || v->kind == V_FLOAT || v->kind == V_UNKNOWN ||
           (v->kind == V_TENSOR && v->t.rank == 0 && dtype_is_float(v->t.dt));
}

static int is_submodel(const Value *v) {
    if (v->kind == V_MODEL) return 1;
    if ((v->kind == V_LIST || v->kind == V_TUPLE) && v->n > 0 && v->items[0] && v->items[0]->kind == V_MODEL) return 1;
    return 0;
}

int on_stack(Sema *s, const Node *n) {
    for (int i = 0; i < s->depth; i++)
        if (s->stack[i] == n) return 1;
    return 0;
}

Entry *find_member(Scope *sc, const char *name) { return sc ? scope_find(sc, str_from(name)) : NULL; }

const Node *find_fn(const Node *owner, const char *name) {
    for (int i = 0; i < owner->list2.n; i++) {
        const Node *it = owner->list2.v[i];
        if (it && it->kind == N_FN && str_eqc(it->name, name)) return it;
    }
    return NULL;
}

/* The value of a constant as written in an instantiation note: "768", "0.02", "true". */
static const char *const_text(Sema *s, const Value *v) {
    int64_t k;
    switch (v->kind) {
    case V_INT:
        if (v->dim && dim_const(v->dim, &k)) return arena_printf(s->ar, "%lld", (long long)k);
        return v->dim ? dim_str(s->ar, v->dim) : "?";
    case V_FLOAT: return v->fknown ? arena_printf(s->ar, "%g", v->f) : "?";
    case V_BOOL: return v->bknown ? (v->b ? "true" : "false") : "?";
    case V_STRING: return v->s ? arena_printf(s->ar, "\"%s\"", v->s) : "?";
    default: return value_describe(s->ar, v);
    }
}

/* "d = 768, heads = 12": the constants of an instance, for notes. */
const char *scope_sig(Sema *s, Scope *sc) {
    const char *out = "";
    for (int i = 0; i < sc->n; i++) {
        if (sc->e[i].kind != ENT_CONST) continue;
        out = arena_printf(s->ar, "%s%s%.*s = %s", out, *out ? ", " : "", STR_ARG(sc->e[i].name),
                           const_text(s, sc->e[i].v ? sc->e[i].v : unknown_at(s, span_none())));
        if (strlen(out) > 300) return arena_printf(s->ar, "%s, ...", out);
    }
    return out;
}

/* A value of the same kind as a default, with its value forgotten: a model checked on its own
 * must be right for every value of its constants. Integers become symbols named after the
 * constant, so shapes built from them stay exact polynomials. */
Value *unknownify(Sema *s, Value *v, Str name, Span at, int depth) {
    switch (v->kind) {
    case V_INT: return name.len ? value_int(s->ar, dim_sym(s->ar, sema_cstr(s, name)), at) : unknown_at(s, at);
    case V_FLOAT: return value_float(s->ar, 0, 0, at);
    case V_BOOL: return value_bool(s->ar, 0, 0, at);
    case V_STRING: return unknown_at(s, at);
    case V_TUPLE: {
        if (depth > 8) return unknown_at(s, at);
        Value *t = value_new(s->ar, V_TUPLE, at);
        t->n = v->n;
        t->items = arena_alloc(s->ar, sizeof(Value *) * (size_t)(v->n ? v->n : 1));
        for (int i = 0; i < v->n; i++) t->items[i] = unknownify(s, v->items[i], (Str){0, 0}, at, depth + 1);
        return t;
    }
    default: return v;
    }
}

/* The value after an `if` whose condition is unknown, from the values of the two branches. */
static Value *value_join(Sema *s, Value *a, Value *b) {
    if (a == b) return a;
    if (!a || !b) return a ? a : b;
    if (a->kind == V_UNKNOWN || b->kind == V_UNKNOWN) return unknown_at(s, a->origin);
    if (a->kind != b->kind) {
        if ((a->kind == V_INT || a->kind == V_FLOAT) && (b->kind == V_INT || b->kind == V_FLOAT))
            return value_float(s->ar, 0, 0, a->origin);
        return unknown_at(s, a->origin);
    }
    switch (a->kind) {
    case V_TENSOR: return tensor_type_eq(&a->t, &b->t) ? a : unknown_at(s, a->origin);
    case V_INT: return a->dim && b->dim && dim_eq(a->dim, b->dim) ? a : unknown_at(s, a->origin);
    case V_FLOAT: return a->fknown && b->fknown && a->f == b->f ? a : value_float(s->ar, 0, 0, a->origin);
    case V_BOOL: return a->bknown && b->bknown && a->b == b->b ? a : value_bool(s->ar, 0, 0, a->origin);
    case V_STRING: return a->s && b->s && strcmp(a->s, b->s) == 0 ? a : unknown_at(s, a->origin);
    case V_NONE: return a;
    default: return unknown_at(s, a->origin);
    }
}

/* ---- declared types ---- */

static const char *const dtype_names[] = {"f32", "f16", "bf16", "f64", "i32", "i64", "bool"};

/* Checks that a type names a dtype; reports `unknown dtype` once per place. */
int type_dtype(Sema *s, const Node *ty, DType *dt) {
    if (!ty) return 0;
    if (dtype_parse(ty->name, dt)) return 1;
    if (sema_error(s, sema_span_of(ty, ty->name), "unknown dtype '%.*s'", STR_ARG(ty->name))) {
        Suggest g;
        suggest_init(&g, ty->name);
        for (size_t i = 0; i < sizeof dtype_names / sizeof *dtype_names; i++)
            suggest_try(&g, dtype_names[i], (uint32_t)strlen(dtype_names[i]));
        sema_hint_suggest(s, &g);
    }
    return 0;
}

/* The type as declared, from its source: "f32[B, T, d]". */
const char *type_text(Sema *s, const Node *ty) {
    if (!ty) return "?";
    const char *out = sema_cstr(s, ty->name);
    if (!ty->ival) return out;
    out = arena_printf(s->ar, "%s[", out);
    for (int i = 0; i < ty->list.n; i++)
        out = arena_printf(s->ar, "%s%s%s", out, i ? ", " : "", ty->list.v[i] ? diag_span_text(s->ar, ty->list.v[i]->span) : "?");
    return arena_printf(s->ar, "%s]", out);
}

/* The path of the module `import name` would load in the file of span at, or NULL. */
static const char *importable(Sema *s, Span at, Str name) {
    if (!s->ld || at.file == 0 || !name.len) return NULL;
    for (int i = 0; i < s->ld->modules.n; i++) {
        const Module *m = s->ld->modules.v[i];
        if (m->file == at.file) return loader_find(s->ld, m->path, name);
    }
    return NULL;
}

static void unknown_name(Sema *s, Scope *sc, const Node *n) {
    if (sema_error(s, n->span, "unknown name '%.*s'", STR_ARG(n->name))) {
        const char *path = importable(s, n->span, n->name);
        if (path) {
            sema_hint(s, "'%.*s' is a module: add `import %.*s` at the top of the file", STR_ARG(n->name), STR_ARG(n->name));
            return;
        }
        Suggest g;
        suggest_init(&g, n->name);
        suggest_scope(&g, sc, 1);
        suggest_builtins(&g);
        sema_hint_suggest(s, &g);
    }
}

static const Dim *dim_checked(Sema *s, const Node *n, const Dim *r) {
    if (!r) sema_error(s, n->span, "dimension '%s' overflows", diag_span_text(s->ar, n->span));
    return r;
}

static const Dim *eval_dim_inner(Sema *s, Scope *sc, const Node *n, int free_upper) {
    switch (n->kind) {
    case N_INT: return dim_int(s->ar, n->ival);
    case N_NAME: {
        Entry *e = scope_lookup(sc, n->name, NULL);
        if (free_upper && is_upper_name(n->name) && (!e || !(e->kind == ENT_DIM || (e->v && e->v->kind == V_INT))))
            return dim_sym(s->ar, sema_cstr(s, n->name)); /* bound at the call, not yet seen */
        if (!e || e->kind == ENT_BLOCK) {
            unknown_name(s, sc, n);
            return NULL;
        }
        if (!e->v || e->v->kind == V_UNKNOWN) return NULL;
        if (e->v->kind == V_INT && e->v->dim) return e->v->dim;
        sema_error(s, n->span, "dimension '%.*s' must be an integer, but it is %s", STR_ARG(n->name),
                   value_describe(s->ar, e->v));
        return NULL;
    }
    case N_UNARY: {
        if (!n->a || (n->op != OP_NEG && n->op != OP_POS)) break;
        const Dim *a = eval_dim(s, sc, n->a, free_upper);
        if (!a) return NULL;
        return n->op == OP_POS ? a : dim_checked(s, n, dim_sub(s->ar, dim_int(s->ar, 0), a));
    }
    case N_BINARY: {
        if (!n->a || !n->b || (n->op != OP_ADD && n->op != OP_SUB && n->op != OP_MUL && n->op != OP_DIV)) break;
        const Dim *a = eval_dim(s, sc, n->a, free_upper);
        const Dim *b = eval_dim(s, sc, n->b, free_upper);
        if (!a || !b) return NULL;
        if (n->op == OP_ADD) return dim_checked(s, n, dim_add(s->ar, a, b));
        if (n->op == OP_SUB) return dim_checked(s, n, dim_sub(s->ar, a, b));
        if (n->op == OP_MUL) return dim_checked(s, n, dim_mul(s->ar, a, b));
        int exact = 1;
        const Dim *r = dim_div(s->ar, a, b, &exact);
        int64_t bv;
        if (dim_const(b, &bv) && bv == 0) {
            sema_error(s, n->span, "dimension '%s' divides by zero", diag_span_text(s->ar, n->span));
            return NULL;
        }
        if (!exact) {
            sema_error(s, n->span, "dimension '%s' = %s / %s is not a whole number", diag_span_text(s->ar, n->span),
                       dim_str(s->ar, a), dim_str(s->ar, b));
            return NULL;
        }
        return dim_checked(s, n, r);
    }
    default: break;
    }
    sema_error(s, n->span, "'%s' cannot be a dimension: dimensions are integers, constants and + - * / of them",
               diag_span_text(s->ar, n->span));
    return NULL;
}

const Dim *eval_dim(Sema *s, Scope *sc, const Node *n, int free_upper) {
    if (!n) return NULL;
    if (!sema_enter(s, n->span)) return NULL;
    const Dim *r = eval_dim_inner(s, sc, n, free_upper);
    sema_leave(s);
    return r;
}

/* Pass 1 of matching a value to a declared type: a bare upper-case dimension not bound yet
 * takes the argument's dimension (B, T at a call). `decl` marks who bound it. */
void type_bind(Sema *s, Scope *loc, const Node *ty, const Value *v, Span decl) {
    if (!ty || !ty->ival || v->kind != V_TENSOR || v->t.rank != ty->list.n) return;
    for (int i = 0; i < ty->list.n; i++) {
        const Node *d = ty->list.v[i];
        if (!d || d->kind != N_NAME || !is_upper_name(d->name) || !v->t.dims || !v->t.dims[i]) continue;
        Entry *e = scope_lookup(loc, d->name, NULL);
        if (e && (e->kind == ENT_DIM || (e->v && e->v->kind == V_INT))) continue;
        scope_define(s, loc, d->name, value_int(s->ar, v->t.dims[i], decl), ENT_DIM, decl);
    }
}

/* Pass 2: 1 when v fits the declared type (V_UNKNOWN fits everything), else 0. */
int type_match(Sema *s, Scope *loc, const Node *ty, const Value *v) {
    DType dt;
    if (!ty || !dtype_parse(ty->name, &dt) || v->kind == V_UNKNOWN) return 1;
    if (!ty->ival) { /* a scalar */
        if (v->kind == V_TENSOR) return v->t.rank == 0 && v->t.dt == dt;
        if (dt == DT_BOOL) return v->kind == V_BOOL;
        if (dtype_is_float(dt)) return v->kind == V_FLOAT || v->kind == V_INT;
        return v->kind == V_INT;
    }
    if (v->kind != V_TENSOR) return ty->list.n == 0 && dtype_is_float(dt) && (v->kind == V_FLOAT || v->kind == V_INT);
    if ((v->t.dt != dt && !(dt == DT_F32 && v->t.dt == DT_BF16 && s->precision == PREC_BF16)) || v->t.rank != ty->list.n)
        return 0;
    for (int i = 0; i < ty->list.n; i++) {
        const Dim *want = eval_dim(s, loc, ty->list.v[i], 1);
        if (!want || !v->t.dims || !v->t.dims[i]) continue;
        if (!dim_eq(want, v->t.dims[i])) return 0;
    }
    return 1;
}

static void collect_names(const Node *n, const Node **out, int *nout, int cap, int depth) {
    if (!n || depth > 64 || *nout >= cap) return;
    if (n->kind == N_NAME) {
        for (int i = 0; i < *nout; i++)
            if (str_eq(out[i]->name, n->name)) return;
        out[(*nout)++] = n;
        return;
    }
    collect_names(n->a, out, nout, cap, depth + 1);
    collect_names(n->b, out, nout, cap, depth + 1);
}

static int bare_count(const Node *ty, Str name) {
    int k = 0;
    for (int i = 0; ty && i < ty->list.n; i++) {
        const Node *d = ty->list.v[i];
        if (d && d->kind == N_NAME && str_eq(d->name, name)) k++;
    }
    return k;
}

/* " with d = 768, T = 64": the names in a declared type whose values are not obvious from the
 * message (dimensions bound by the very argument being reported are left out). */
const char *type_with(Sema *s, Scope *loc, const Node *ty, Span own) {
    const Node *names[32];
    int n = 0;
    for (int i = 0; ty && i < ty->list.n; i++) collect_names(ty->list.v[i], names, &n, 32, 0);
    const char *out = "";
    for (int i = 0; i < n; i++) {
        Entry *e = scope_lookup(loc, names[i]->name, NULL);
        if (!e || !e->v || e->v->kind != V_INT || !e->v->dim) continue;
        /* Bound by the very argument reported: obvious from its shape, unless it occurs twice
         * (f32[B, B] given [3, 4] says B = 3). */
        if (e->kind == ENT_DIM && e->decl.file == own.file && e->decl.off == own.off && bare_count(ty, names[i]->name) < 2)
            continue;
        const char *val = dim_str(s->ar, e->v->dim);
        if (strlen(val) == names[i]->name.len && memcmp(val, names[i]->name.p, names[i]->name.len) == 0) continue;
        out = arena_printf(s->ar, "%s%s%.*s = %s", out, *out ? ", " : " with ", STR_ARG(names[i]->name), val);
    }
    return out;
}

/* A value of a declared type, for a parameter checked on its own (fresh = 1: bare upper-case
 * dimensions not bound yet become symbols) or a declared result (fresh = 0: one not bound
 * makes the result unknown). Scalars have unknown values; an integer is a symbol named name. */
Value *value_of_type(Sema *s, Scope *loc, const Node *ty, Span origin, int fresh, Str name) {
    DType dt;
    if (!ty || !dtype_parse(ty->name, &dt)) return unknown_at(s, origin);
    if (!ty->ival) {
        if (dt == DT_BOOL) return value_bool(s->ar, 0, 0, origin);
        if (dtype_is_float(dt)) return value_float(s->ar, 0, 0, origin);
        return value_int(s->ar, dim_sym(s->ar, name.len ? sema_cstr(s, name) : "n"), origin);
    }
    int rank = ty->list.n;
    const Dim **dims = arena_alloc(s->ar, sizeof(Dim *) * (size_t)(rank ? rank : 1));
    for (int i = 0; i < rank; i++) {
        const Node *d = ty->list.v[i];
        if (d && d->kind == N_NAME && is_upper_name(d->name)) {
            Entry *e = scope_lookup(loc, d->name, NULL);
            if (!e || !(e->kind == ENT_DIM || (e->v && e->v->kind == V_INT))) {
                if (!fresh) return unknown_at(s, origin);
                scope_define(s, loc, d->name, value_int(s->ar, dim_sym(s->ar, sema_cstr(s, d->name)), origin), ENT_DIM, origin);
            }
        }
        dims[i] = eval_dim(s, loc, d, 1);
        if (!dims[i]) return unknown_at(s, origin);
    }
    return value_tensor(s->ar, dt, rank, dims, origin);
}

Value *declared_result(Sema *s, const Node *fn, Scope *loc, Span at) {
    if (!fn->type) return unknown_at(s, at);
    return value_of_type(s, loc, fn->type, at, 0, fn->name);
}

/* ---- expressions ---- */

static Value *eval_name(Frame *f, const Node *n) {
    Sema *s = f->s;
    Entry *e = scope_lookup(f->scope, n->name, NULL);
    if (e) {
        if (e->kind == ENT_BLOCK) {
            sema_error(s, n->span, "'%.*s' is a train or serve block, not a value", STR_ARG(n->name));
            return unknown_at(s, n->span);
        }
        return e->v ? e->v : unknown_at(s, n->span);
    }
    if (str_eqc(n->name, "pi")) return value_float(s->ar, SEMA_PI, 1, n->span);
    const Builtin *b = builtin_find(n->name);
    if (b) {
        Value *v = value_new(s->ar, V_BUILTIN, n->span);
        v->builtin = b;
        return v;
    }
    if (str_eqc(n->name, "none")) return value_new(s->ar, V_NONE, n->span);
    unknown_name(s, f->scope, n);
    return unknown_at(s, n->span);
}

static int all_digits(Str x) {
    if (!x.len) return 0;
    for (uint32_t i = 0; i < x.len; i++)
        if (x.p[i] < '0' || x.p[i] > '9') return 0;
    return 1;
}

/* hint: "'nn' has 9 members: Linear, Embedding, ..." (the first 24, in declaration order). */
static void member_list_hint(Sema *s, const char *what, Scope *members, const char *const *extra, int nextra) {
    enum { SHOWN = 24 };
    const char *list = "";
    int n = 0;
    for (int i = 0; i < nextra; i++, n++) list = arena_printf(s->ar, "%s%s%s", list, n ? ", " : "", extra[i]);
    for (int i = 0; members && i < members->n; i++) {
        const Entry *e = &members->e[i];
        if (e->kind == ENT_BLOCK || e->kind == ENT_IMPORT || !e->name.len) continue;
        if (n < SHOWN) list = arena_printf(s->ar, "%s%s%.*s", list, n ? ", " : "", STR_ARG(e->name));
        n++;
    }
    if (n == 0) sema_hint(s, "'%s' has no members", what);
    else
        sema_hint(s, "'%s' has %d member%s: %s%s", what, n, n == 1 ? "" : "s", list,
                  n > SHOWN ? arena_printf(s->ar, ", ... (%d more)", n - SHOWN) : "");
}

static Value *no_member(Sema *s, const Node *n, Scope *members, const char *const *extra, int nextra) {
    if (sema_error(s, sema_span_of(n, n->name), "'%s' has no member '%.*s'", diag_span_text(s->ar, n->a->span),
                   STR_ARG(n->name))) {
        Suggest g;
        suggest_init(&g, n->name);
        if (members) suggest_scope(&g, members, 0);
        for (int i = 0; i < nextra; i++) suggest_try(&g, extra[i], (uint32_t)strlen(extra[i]));
        if (g.pick) sema_hint_suggest(s, &g);
        else if (members || nextra) member_list_hint(s, diag_span_text(s->ar, n->a->span), members, extra, nextra);
    }
    return unknown_at(s, n->span);
}

static Value *eval_attr(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *base = eval_expr(f, n->a);
    if (!n->a) return unknown_at(s, n->span);
    switch (base->kind) {
    case V_UNKNOWN: return unknown_at(s, n->span);
    case V_MODULE:
    case V_MODEL:
    case V_OPTIMIZER: {
        Entry *e = scope_find(base->scope, n->name);
        if (!e || e->kind == ENT_BLOCK || (base->kind == V_MODULE && e->kind == ENT_IMPORT))
            return no_member(s, n, base->scope, NULL, 0);
        return e->v ? e->v : unknown_at(s, n->span);
    }
    case V_DATA: {
        static const char *const items[] = {"x", "y", "pos"};
        if (str_eqc(n->name, "pos") && base->n < 3) {
            if (sema_error(s, sema_span_of(n, n->name), "'data.pos' needs documents: the token source has no 'docs'"))
                sema_hint(s, "split the tokens into documents at their end-of-text id: tokens(PATH, seq = T, docs = 50256)");
            return unknown_at(s, n->span);
        }
        for (int i = 0; i < 3; i++)
            if (str_eqc(n->name, items[i])) return i < base->n && base->items[i] ? base->items[i] : unknown_at(s, n->span);
        return no_member(s, n, NULL, items, 3);
    }
    case V_TENSOR: {
        Value *r = value_tensor_attr(s->ar, base, n->name, n->span);
        if (gb_listening(s, f->generic)) gb_attr(s->gb, base, n->name, r, n->span); /* graph builder hook */
        return r;
    }
    case V_TUPLE:
    case V_LIST: {
        if (!all_digits(n->name)) return no_member(s, n, NULL, NULL, 0);
        long long k = 0;
        for (uint32_t i = 0; i < n->name.len && k < 1000000000LL; i++) k = k * 10 + (n->name.p[i] - '0');
        int64_t len;
        int known = base->kind == V_TUPLE || (base->len && dim_const(base->len, &len) && len == base->n);
        if (!known) return base->n ? base->items[0] : unknown_at(s, n->span);
        if (k >= base->n) {
            sema_error(s, sema_span_of(n, n->name), "'%s' has %d element%s, so '.%.*s' is out of range",
                       diag_span_text(s->ar, n->a->span), base->n, base->n == 1 ? "" : "s", STR_ARG(n->name));
            return unknown_at(s, n->span);
        }
        return base->items[k] ? base->items[k] : unknown_at(s, n->span);
    }
    default:
        if (sema_error(s, sema_span_of(n, n->name), "'%s' has no member '%.*s'", diag_span_text(s->ar, n->a->span),
                       STR_ARG(n->name)))
            sema_hint(s, "'%s' is %s", diag_span_text(s->ar, n->a->span), value_describe(s->ar, base));
        return unknown_at(s, n->span);
    }
}

static Value *eval_range(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *lo = eval_expr(f, n->a), *hi = eval_expr(f, n->b);
    int ok = 1;
    Value *bounds[2] = {lo, hi};
    const Node *nodes[2] = {n->a, n->b};
    for (int i = 0; i < 2; i++) {
        if (bounds[i]->kind == V_INT && bounds[i]->dim) continue;
        ok = 0;
        if (bounds[i]->kind != V_UNKNOWN)
            sema_error(s, span_or(nodes[i], n->span), "a range bound must be an integer, but it is %s",
                       value_describe(s->ar, bounds[i]));
    }
    if (!ok) return unknown_at(s, n->span);
    Value *r = value_new(s->ar, V_RANGE, n->span);
    r->dim = lo->dim;
    r->len = hi->dim;
    return r;
}

/* How a `for` or a comprehension walks a value: item by item when the count is known and
 * small, else once with a representative item. */
typedef struct Iter {
    int ok;    /* 0: not iterable (reported) */
    int known; /* count items, from iter_at */
    int64_t count;
    Value *src;
    int64_t lo;     /* a known range's start */
    const Dim *len; /* the length (NULL when not known at all) */
    Value *rep;     /* the representative item; NULL: a symbol named after the variable */
} Iter;

static Iter iter_of(Sema *s, Value *it, Span at) {
    Iter r;
    memset(&r, 0, sizeof r);
    r.ok = 1;
    r.src = it;
    int64_t lo, hi, k;
    switch (it->kind) {
    case V_RANGE:
        if (it->dim && it->len && dim_const(it->dim, &lo) && dim_const(it->len, &hi)) {
            int64_t cnt = hi > lo && hi - lo > 0 ? hi - lo : 0;
            r.len = dim_int(s->ar, cnt);
            if (cnt <= SEMA_MAX_UNROLL) {
                r.known = 1;
                r.count = cnt;
                r.lo = lo;
            }
        } else if (it->dim && it->len) {
            r.len = dim_sub(s->ar, it->len, it->dim);
        }
        break;
    case V_LIST:
        if (it->len && dim_const(it->len, &k) && k == it->n && k <= SEMA_MAX_UNROLL) {
            r.known = 1;
            r.count = k;
        } else {
            r.len = it->len;
            r.rep = it->n ? it->items[0] : unknown_at(s, at);
        }
        break;
    case V_TUPLE:
        r.known = 1;
        r.count = it->n;
        break;
    case V_UNKNOWN: r.rep = it; break;
    default:
        sema_error(s, at, "cannot iterate over %s: a loop takes a range, a list or a tuple", value_describe(s->ar, it));
        r.ok = 0;
        break;
    }
    return r;
}

static Value *iter_at(Sema *s, const Iter *it, int64_t i, Span at) {
    if (it->src->kind == V_RANGE) return value_int(s->ar, dim_int(s->ar, it->lo + i), at);
    Value *v = i < it->src->n ? it->src->items[i] : NULL;
    return v ? v : unknown_at(s, at);
}

static Value *iter_rep(Sema *s, const Iter *it, Str var, Span at) {
    if (it->rep) return it->rep;
    return value_int(s->ar, dim_sym(s->ar, sema_cstr(s, var)), at);
}

static Value *make_list(Sema *s, Value **items, int n, const Dim *len, Span at) {
    Value *l = value_new(s->ar, V_LIST, at);
    l->items = items;
    l->n = n;
    l->len = len;
    return l;
}

static Value *eval_comp(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *src = eval_expr(f, n->b);
    Iter it = iter_of(s, src, span_or(n->b, n->span));
    if (!it.ok) return unknown_at(s, n->span);
    Scope *cs = scope_new(s, f->scope, SC_LOCAL, f->scope ? f->scope->name : "", NULL);
    Frame cf = *f;
    cf.scope = cs;
    Span var_at = sema_span_of(n, n->name);
    if (it.known) {
        Value **items = arena_alloc(s->ar, sizeof(Value *) * (size_t)(it.count + 1));
        int64_t i;
        for (i = 0; i < it.count && !s->over_budget; i++) {
            scope_define(s, cs, n->name, iter_at(s, &it, i, var_at), ENT_LOCAL, var_at);
            items[i] = eval_expr(&cf, n->a);
        }
        for (; i < it.count; i++) items[i] = unknown_at(s, n->span);
        return make_list(s, items, (int)it.count, dim_int(s->ar, it.count), n->span);
    }
    if (gb_listening(s, f->generic)) /* graph builder hook: it needs every comprehension unrolled */
        gb_unsupported(s->gb, span_or(n->b, n->span),
                       arena_printf(s->ar, "a comprehension whose number of items is not known at compile time (or above %d)",
                                    SEMA_MAX_UNROLL));
    scope_define(s, cs, n->name, iter_rep(s, &it, n->name, var_at), ENT_LOCAL, var_at);
    Value *e = eval_expr(&cf, n->a);
    if (!it.len) return unknown_at(s, n->span);
    int64_t k;
    if (dim_const(it.len, &k)) { /* known but too long to unroll: every item is the one evaluated */
        if (k > SEMA_MAX_LIST) {
            sema_error(s, n->span, "a list of %lld elements is too long (at most %d)", (long long)k, SEMA_MAX_LIST);
            return unknown_at(s, n->span);
        }
        Value **items = arena_alloc(s->ar, sizeof(Value *) * (size_t)(k + 1));
        for (int64_t i = 0; i < k; i++) items[i] = e;
        return make_list(s, items, (int)k, it.len, n->span);
    }
    Value **items = arena_alloc(s->ar, sizeof(Value *));
    items[0] = e;
    return make_list(s, items, 1, it.len, n->span);
}

static Value *eval_index(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *base = eval_expr(f, n->a);
    int k = n->list.n;
    Value **idx = arena_alloc(s->ar, sizeof(Value *) * (size_t)(k + 1));
    Span *sidx = arena_alloc(s->ar, sizeof(Span) * (size_t)(k + 1));
    int *is_slice = arena_alloc(s->ar, sizeof(int) * (size_t)(k + 1));
    Value **lo = arena_alloc(s->ar, sizeof(Value *) * (size_t)(k + 1));
    Value **hi = arena_alloc(s->ar, sizeof(Value *) * (size_t)(k + 1));
    int any_unknown = base->kind == V_UNKNOWN;
    for (int i = 0; i < k; i++) {
        const Node *it = n->list.v[i];
        if (!it) {
            idx[i] = unknown_at(s, n->span);
            sidx[i] = n->span;
            continue;
        }
        sidx[i] = it->span;
        if (it->kind == N_SLICE) {
            is_slice[i] = 1;
            lo[i] = it->a ? eval_expr(f, it->a) : NULL;
            hi[i] = it->b ? eval_expr(f, it->b) : NULL;
            any_unknown |= (lo[i] && lo[i]->kind == V_UNKNOWN) || (hi[i] && hi[i]->kind == V_UNKNOWN);
        } else {
            idx[i] = eval_expr(f, it);
            any_unknown |= idx[i]->kind == V_UNKNOWN; /* even the result's rank is unknown */
        }
    }
    if (any_unknown) return unknown_at(s, n->span);
    Value *r = value_index(s->ar, base, span_or(n->a, n->span), idx, sidx, k, is_slice, lo, hi, n->span);
    if (r && gb_listening(s, f->generic)) /* graph builder hook */
        gb_index(s->gb, base, idx, is_slice, lo, hi, k, r, n->span);
    return r ? r : unknown_at(s, n->span);
}

static Value *eval_seq(Frame *f, const Node *n, ValueKind kind) {
    Sema *s = f->s;
    Value *v = value_new(s->ar, kind, n->span);
    v->n = n->list.n;
    v->items = arena_alloc(s->ar, sizeof(Value *) * (size_t)(v->n + 1));
    for (int i = 0; i < v->n; i++) v->items[i] = eval_expr(f, n->list.v[i]);
    if (kind == V_LIST) v->len = dim_int(s->ar, v->n);
    return v;
}

/* Whether the frame evaluates code of a model (its body, its functions, its constants'
 * defaults) rather than a top-level function or a block. */
static int in_model(const Frame *f) {
    for (const Scope *sc = f->scope; sc; sc = sc->parent) {
        if (sc->kind == SC_MODEL) return 1;
        if (sc->kind == SC_MODULE) return 0;
    }
    return 0;
}

static Value *eval_expr_inner(Frame *f, const Node *n) {
    Sema *s = f->s;
    switch (n->kind) {
    case N_NAME: return eval_name(f, n);
    case N_INT: {
        /* integers are exact in 62 bits (dim.c); a larger literal would be an integer not known at
           compile time, which the graph builder cannot make a constant of */
        const Dim *d = dim_int(s->ar, n->ival);
        if (d) return value_int(s->ar, d, n->span);
        if (sema_error(s, n->span, "integer literal %lld does not fit in 62 bits", (long long)n->ival))
            sema_hint(s, "integers are below 2^62 = 4611686018427387904 in magnitude; write a larger constant as a float (%.3g)",
                      (double)n->ival);
        return value_unknown(s->ar, n->span);
    }
    case N_FLOAT: return value_float(s->ar, n->fval, 1, n->span);
    case N_STRING: {
        Value *v = value_new(s->ar, V_STRING, n->span);
        v->s = n->sval ? n->sval : "";
        return v;
    }
    case N_BOOL: return value_bool(s->ar, n->ival != 0, 1, n->span);
    case N_BINARY: {
        Value *a = eval_expr(f, n->a), *b = eval_expr(f, n->b);
        if (n->op == OP_DIV && a->kind == V_INT && b->kind == V_INT && a->dim && b->dim && in_model(f)) {
            /* In a model, integers are dimensions: `d / heads` must divide exactly. (Elsewhere,
             * in schedules, `/` of two integers is true division.) */
            int exact = 1;
            int64_t bv;
            (void)dim_div(s->ar, a->dim, b->dim, &exact);
            if (!exact && !(dim_const(b->dim, &bv) && bv == 0)) {
                sema_error(s, n->span, "dimension '%s' = %s / %s is not a whole number", diag_span_text(s->ar, n->span),
                           dim_str(s->ar, a->dim), dim_str(s->ar, b->dim));
                return unknown_at(s, n->span);
            }
        }
        Value *r = value_binary(s->ar, n->op, a, span_or(n->a, n->span), b, span_or(n->b, n->span), n->span);
        if (gb_listening(s, f->generic)) /* graph builder hook */
            gb_binary(s->gb, n->op, a, span_or(n->a, n->span), b, span_or(n->b, n->span), r, n->span);
        return r;
    }
    case N_UNARY: {
        Value *a = eval_expr(f, n->a);
        Value *r = value_unary(s->ar, n->op, a, n->span);
        if (gb_listening(s, f->generic)) gb_unary(s->gb, n->op, a, r, n->span); /* graph builder hook */
        return r;
    }
    case N_CALL: {
        Value *callee = eval_expr(f, n->a);
        Call c;
        build_call(f, n, &c);
        return eval_apply(s, callee, &c);
    }
    case N_INDEX: return eval_index(f, n);
    case N_ATTR: return eval_attr(f, n);
    case N_TUPLE: return eval_seq(f, n, V_TUPLE);
    case N_LIST: return eval_seq(f, n, V_LIST);
    case N_COMP: return eval_comp(f, n);
    case N_RANGE: return eval_range(f, n);
    default: return unknown_at(s, n->span); /* not an expression: the parser reported it */
    }
}

Value *eval_expr(Frame *f, const Node *n) {
    Sema *s = f->s;
    if (!n) return unknown_at(s, span_none());
    if (!sema_enter(s, n->span)) return unknown_at(s, n->span);
    Value *v = eval_expr_inner(f, n);
    sema_leave(s);
    return v ? v : unknown_at(s, n->span);
}

/* ---- statements ---- */

static const char *entry_what(const Entry *e, const Scope *where) {
    switch (e->kind) {
    case ENT_CONST: return where->kind == SC_OPTIMIZER ? "hyper-parameter" : "model constant";
    case ENT_PARAM: return "parameter";
    case ENT_SUB: return "sub-model";
    case ENT_FN: return "function";
    default: return "model member";
    }
}

/* Assigns v to a name under the rules of the frame: in a model body a name becomes a member
 * (a parameter, a sub-model or another value; a constant's name may be taken over, as
 * `bias = param ...` does in nn.Linear); in a function, locals only - the model's members
 * and an optimizer's hyper-parameters are read-only; in update, p and the state variables keep
 * p's shape. `kind` forces the entry kind in a model body (ENT_PARAM, ENT_LOCAL), else 0. */
static void assign_name(Frame *f, Str name, Value *v, Span at, Span vat, EntryKind kind) {
    Sema *s = f->s;
    Scope *sc = f->scope;
    if (f->kind == FR_MODEL_BODY) {
        Entry *e = scope_find(sc, name);
        if (e && (e->kind == ENT_PARAM || e->kind == ENT_SUB || e->kind == ENT_FN)) {
            if (sema_error(s, at, "redefinition of '%.*s' in model '%s'", STR_ARG(name), sc->name))
                sema_note(s, e->decl, "'%.*s' was first defined here", STR_ARG(name));
            return;
        }
        EntryKind k = kind ? kind : is_submodel(v) ? ENT_SUB : ENT_MEMBER;
        scope_define(s, sc, name, v, k, at);
        return;
    }
    Entry *e = scope_find(sc, name);
    if (e) {
        switch (e->kind) {
        case ENT_UPDATE_P:
        case ENT_STATE:
            if (v->kind != V_UNKNOWN && !(v->kind == V_TENSOR && tensor_type_eq(&v->t, &f->p_type))) {
                const char *pt = tensor_type_str(s->ar, &f->p_type);
                if (e->kind == ENT_UPDATE_P)
                    sema_error(s, vat, "'%.*s' must keep its shape (%s), but the value is %s", STR_ARG(name), pt,
                               value_describe(s->ar, v));
                else
                    sema_error(s, vat, "state '%.*s' must keep the shape of the parameter (%s), but the value is %s",
                               STR_ARG(name), pt, value_describe(s->ar, v));
                return;
            }
            e->v = v;
            return;
        case ENT_DIM: sema_error(s, at, "cannot assign to dimension '%.*s': it is bound by the call", STR_ARG(name)); return;
        case ENT_READONLY:
            if (f->kind == FR_UPDATE)
                sema_error(
                    s, at,
                    "cannot assign to '%.*s' in 'update': only the parameter, the state variables and locals may be assigned",
                    STR_ARG(name));
            else sema_error(s, at, "cannot assign to '%.*s'", STR_ARG(name));
            return;
        default: e->v = v; return;
        }
    }
    Scope *where = NULL;
    e = sc ? scope_lookup(sc->parent, name, &where) : NULL;
    if (e && where && (where->kind == SC_MODEL || where->kind == SC_OPTIMIZER) && e->kind != ENT_LOCAL) {
        if (sema_error(s, at, "cannot assign to %s '%.*s'", entry_what(e, where), STR_ARG(name))) {
            sema_note(s, e->decl, "'%.*s' is defined here", STR_ARG(name));
            sema_hint(s, "use another name for the local variable");
        }
        return;
    }
    scope_define(s, sc, name, v, ENT_LOCAL, at);
}

static void assign_target(Frame *f, const Node *t, Value *v, Span vat) {
    Sema *s = f->s;
    if (!t) return;
    if (t->kind != N_NAME) {
        sema_error(s, t->span, "cannot assign to '%s': only names can be assigned", diag_span_text(s->ar, t->span));
        return;
    }
    assign_name(f, t->name, v, t->span, vat, 0);
}

static void eval_assign(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *v = eval_expr(f, n->a);
    Span vat = span_or(n->a, n->span);
    int want = n->list.n;
    if (want == 1) {
        assign_target(f, n->list.v[0], v, vat);
        return;
    }
    Value **parts = NULL;
    int64_t k;
    int have = -1;
    if (v->kind == V_TUPLE) have = v->n;
    else if (v->kind == V_LIST && v->len && dim_const(v->len, &k) && k == v->n) have = v->n;
    if (have == want) {
        parts = v->items;
    } else if (have >= 0) {
        sema_error(s, vat, "cannot unpack %d value%s into %d names", have, have == 1 ? "" : "s", want);
    } else if (v->kind != V_UNKNOWN) {
        sema_error(s, vat, "cannot unpack %s into %d names", value_describe(s->ar, v), want);
    }
    for (int i = 0; i < want; i++) assign_target(f, n->list.v[i], parts && parts[i] ? parts[i] : unknown_at(s, vat), vat);
}

static void eval_aug_assign(Frame *f, const Node *n) {
    Sema *s = f->s;
    if (!n->a || n->a->kind != N_NAME) {
        Span at = span_or(n->a, n->span);
        sema_error(s, at, "cannot assign to '%s': only names can be assigned", diag_span_text(s->ar, at));
        return;
    }
    Value *cur = eval_expr(f, n->a);
    Value *rhs = eval_expr(f, n->b);
    Value *nv = value_binary(s->ar, n->op, cur, n->a->span, rhs, span_or(n->b, n->span), n->span);
    if (nv && gb_listening(s, f->generic)) /* graph builder hook */
        gb_binary(s->gb, n->op, cur, n->a->span, rhs, span_or(n->b, n->span), nv, n->span);
    assign_name(f, n->a->name, nv ? nv : unknown_at(s, n->span), n->a->span, n->span, 0);
}

/* The initialisers that may follow `~` in a parameter declaration. */
static const struct {
    const char *name;
    int nargs;
    const char *args[2];
} inits[] = {
    {"normal", 2, {"mean", "std"}}, {"uniform", 2, {"lo", "hi"}}, {"zeros", 0, {0}}, {"ones", 0, {0}}, {"constant", 1, {"v"}},
};

/* Checks `~ init`; returns the initialiser's name ("normal", ...) with its arguments in x and
 * whether each is known in known (for the graph builder), or NULL after an error. */
static const char *check_init(Frame *f, const Node *init, Str pname, double x[2], int known[2]) {
    Sema *s = f->s;
    Str iname;
    const Node *call = NULL;
    if (init->kind == N_NAME) {
        iname = init->name;
    } else if (init->kind == N_CALL && init->a && init->a->kind == N_NAME) {
        iname = init->a->name;
        call = init;
    } else {
        sema_error(s, init->span,
                   "the initialiser of '%.*s' must be normal(mean, std), uniform(lo, hi), zeros, ones or constant(v)",
                   STR_ARG(pname));
        return NULL;
    }
    int which = -1;
    for (size_t i = 0; i < sizeof inits / sizeof *inits; i++)
        if (str_eqc(iname, inits[i].name)) which = (int)i;
    Span name_at = call ? call->a->span : init->span;
    if (which < 0) {
        if (sema_error(s, name_at, "unknown initialiser '%.*s'", STR_ARG(iname))) {
            Suggest g;
            suggest_init(&g, iname);
            for (size_t i = 0; i < sizeof inits / sizeof *inits; i++)
                suggest_try(&g, inits[i].name, (uint32_t)strlen(inits[i].name));
            if (g.pick) sema_hint_suggest(s, &g);
            else sema_hint(s, "the initialisers are normal(mean, std), uniform(lo, hi), zeros, ones and constant(v)");
        }
        return NULL;
    }
    const char *wn = inits[which].name;
    int na = inits[which].nargs;
    if (!call) {
        if (na > 0) {
            if (na == 2)
                sema_error(s, init->span, "'%s' needs arguments: %s(%s, %s)", wn, wn, inits[which].args[0], inits[which].args[1]);
            else sema_error(s, init->span, "'%s' needs an argument: %s(%s)", wn, wn, inits[which].args[0]);
            return NULL;
        }
        return wn;
    }
    Value *vals[2] = {NULL, NULL};
    Span at[2] = {call->span, call->span};
    int ok = 1, npos = 0;
    for (int i = 0; i < call->list.n; i++) {
        const Node *a = call->list.v[i];
        if (!a) continue;
        if (a->kind == N_KWARG) {
            int j = -1;
            for (int k = 0; k < na; k++)
                if (str_eqc(a->name, inits[which].args[k])) j = k;
            if (j < 0) {
                if (sema_error(s, sema_span_of(a, a->name), "'%s' has no parameter '%.*s'", wn, STR_ARG(a->name))) {
                    Suggest g;
                    suggest_init(&g, a->name);
                    for (int k = 0; k < na; k++) suggest_try(&g, inits[which].args[k], (uint32_t)strlen(inits[which].args[k]));
                    sema_hint_suggest(s, &g);
                }
                ok = 0;
            } else if (vals[j]) {
                if (sema_error(s, sema_span_of(a, a->name), "argument '%.*s' of '%s' is given twice", STR_ARG(a->name), wn))
                    sema_note(s, at[j], "first given here");
                ok = 0;
            } else {
                vals[j] = eval_expr(f, a->a);
                at[j] = span_or(a->a, a->span);
            }
        } else {
            if (npos >= na) {
                if (ok)
                    sema_error(s, a->span, "'%s' takes %d argument%s but %d were given", wn, na, na == 1 ? "" : "s",
                               call->list.n);
                ok = 0;
                npos++;
                continue;
            }
            vals[npos] = eval_expr(f, a);
            at[npos] = a->span;
            npos++;
        }
    }
    if (!ok) return NULL;
    for (int k = 0; k < na; k++) {
        if (!vals[k]) {
            sema_error(s, call->span, "missing argument '%s' in the call to '%s'", inits[which].args[k], wn);
            return NULL;
        }
        if (vals[k]->kind != V_INT && vals[k]->kind != V_FLOAT && vals[k]->kind != V_UNKNOWN) {
            sema_error(s, at[k], "argument '%s' of '%s' must be a number, but it is %s", inits[which].args[k], wn,
                       value_describe(s->ar, vals[k]));
            return NULL;
        }
        known[k] = number_known(vals[k], &x[k]);
    }
    if (which == 0 && known[1] && x[1] < 0)
        sema_error(s, at[1], "the standard deviation of 'normal' must not be negative, but it is %g", x[1]);
    if (which == 1 && known[0] && known[1] && !(x[0] < x[1]))
        sema_error(s, call->span, "'uniform' needs lo < hi, but lo = %g and hi = %g", x[0], x[1]);
    return wn;
}

static void eval_param_decl(Frame *f, const Node *n) {
    Sema *s = f->s;
    Span name_at = sema_span_of(n, n->name);
    if (f->kind != FR_MODEL_BODY) {
        sema_error(s, n->span, "parameters can only be declared in a model body");
        return;
    }
    const Node *ty = n->type;
    DType dt;
    int ok = type_dtype(s, ty, &dt);
    if (ok && !dtype_is_float(dt)) {
        sema_error(s, sema_span_of(ty, ty->name),
                   "parameter '%.*s' must have a floating-point dtype (f32, f16, bf16 or f64), not %s", STR_ARG(n->name),
                   dtype_name(dt));
        ok = 0;
    }
    int rank = ty ? ty->list.n : 0;
    const Dim **dims = arena_alloc(s->ar, sizeof(Dim *) * (size_t)(rank + 1));
    for (int i = 0; ok && i < rank; i++) {
        const Node *dn = ty->list.v[i];
        dims[i] = eval_dim(s, f->scope, dn, 0);
        int64_t k;
        if (!dims[i]) ok = 0;
        else if (dim_const(dims[i], &k) && k <= 0) {
            sema_error(s, dn->span, "dimension '%s' of parameter '%.*s' is %lld, but dimensions must be positive",
                       diag_span_text(s->ar, dn->span), STR_ARG(n->name), (long long)k);
            ok = 0;
        }
    }
    double ix[2] = {0, 0};
    int iknown[2] = {0, 0};
    const char *init = n->a ? check_init(f, n->a, n->name, ix, iknown) : NULL;
    /* precision = bf16: an f32 parameter is read as bf16 (its f32 master copy is the graph's G_PARAM) */
    DType as = ok && dt == DT_F32 && s->precision == PREC_BF16 ? DT_BF16 : dt;
    Value *v = ok ? value_tensor(s->ar, as, rank, dims, n->span) : unknown_at(s, n->span);
    if (gb_listening(s, f->generic)) gb_param(s->gb, v, dt, init, ix, iknown, name_at); /* graph builder hook */
    assign_name(f, n->name, v, name_at, n->span, ENT_PARAM);
}

static void eval_return(Frame *f, const Node *n) {
    Sema *s = f->s;
    if (f->kind != FR_FN && f->kind != FR_UPDATE) {
        sema_error(s, n->span, "'return' outside a function");
        return;
    }
    Value *v = n->a ? eval_expr(f, n->a) : value_new(s->ar, V_NONE, n->span);
    Span vat = span_or(n->a, n->span);
    if (f->result) {
        const Node *ty = f->result;
        type_bind(s, f->scope, ty, v, ty->span);
        if (v->kind == V_NONE) {
            if (sema_error(s, n->span, "'%s' must return a value: it is declared to return %s", f->fname, type_text(s, ty)))
                sema_note(s, ty->span, "the result type is declared here");
            v = declared_result(s, f->fn, f->scope, vat);
        } else if (!type_match(s, f->scope, ty, v)) {
            if (sema_error(s, vat, "'%s' returns %s but is declared to return %s%s", f->fname, value_describe(s->ar, v),
                           type_text(s, ty), type_with(s, f->scope, ty, ty->span)))
                sema_note(s, ty->span, "the result type is declared here");
            v = declared_result(s, f->fn, f->scope, vat);
        }
    }
    if (!f->ret) f->ret = v;
    f->returned = 1;
}

static void eval_for(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *src = eval_expr(f, n->a);
    Iter it = iter_of(s, src, span_or(n->a, n->span));
    if (!it.ok) return;
    Span var_at = sema_span_of(n, n->name);
    if (it.known) {
        for (int64_t i = 0; i < it.count && !f->returned && !s->over_budget; i++) {
            assign_name(f, n->name, iter_at(s, &it, i, var_at), var_at, var_at, ENT_LOCAL);
            eval_body(f, &n->list);
        }
        return;
    }
    if (gb_listening(s, f->generic)) /* graph builder hook: it needs every loop unrolled */
        gb_unsupported(
            s->gb, span_or(n->a, n->span),
            arena_printf(s->ar, "a loop whose number of iterations is not known at compile time (or above %d)", SEMA_MAX_UNROLL));
    int returned = f->returned; /* the loop may run no time at all */
    assign_name(f, n->name, iter_rep(s, &it, n->name, var_at), var_at, var_at, ENT_LOCAL);
    eval_body(f, &n->list);
    f->returned = returned;
}

static void eval_if(Frame *f, const Node *n) {
    Sema *s = f->s;
    Value *c = eval_expr(f, n->a);
    int known = 0, truth = 0;
    if (c->kind == V_TENSOR) {
        Span at = span_or(n->a, n->span);
        if (gb_listening(s, f->generic) && gb_updating(s->gb)) /* graph builder hook: t and lr are run-time values */
            gb_unsupported(s->gb, at,
                           "an 'if' on a value known only when the step runs (t and lr are, in an optimizer's update; "
                           "where(c, a, b) chooses per element)");
        else if (sema_error(s, at, "the condition of 'if' must be known at compile time, but it is a tensor (%s)",
                            value_describe(s->ar, c)))
            sema_hint(s, "use where(condition, a, b) to choose element by element");
    } else if (c->kind == V_BOOL) {
        known = c->bknown;
        truth = c->b;
    } else if (c->kind != V_UNKNOWN) {
        truth = value_truthy(c, &known);
    }
    if (known) {
        eval_body(f, truth ? &n->list : &n->list2);
        return;
    }
    /* Unknown: both branches, each from the state before the `if`, then the two merged. */
    if (gb_listening(s, f->generic) && c->kind != V_UNKNOWN && c->kind != V_TENSOR) /* graph builder hook */
        gb_unsupported(s->gb, span_or(n->a, n->span), "an 'if' whose condition is not known at compile time");
    Scope *sc = f->scope;
    ScopeSnap before = scope_snapshot(s, sc);
    int r0 = f->returned;
    eval_body(f, &n->list);
    int rt = f->returned;
    ScopeSnap after_then = scope_snapshot(s, sc);
    scope_restore(s, sc, before);
    f->returned = r0;
    eval_body(f, &n->list2);
    int re = f->returned;
    if (rt && !re) return; /* only the else path goes on */
    if (re && !rt) {       /* only the then path goes on */
        scope_restore(s, sc, after_then);
        f->returned = r0;
        return;
    }
    for (int i = 0; i < after_then.n; i++) {
        Entry *t = &after_then.e[i];
        Entry *e = scope_find(sc, t->name);
        if (!e) scope_define(s, sc, t->name, t->v, t->kind, t->decl);
        else if (e->v != t->v) e->v = value_join(s, t->v, e->v);
    }
    f->returned = rt && re;
}

static void eval_stmt(Frame *f, const Node *n) {
    Sema *s = f->s;
    if (!n) return;
    if (!sema_enter(s, n->span)) return;
    switch (n->kind) {
    case N_ASSIGN: eval_assign(f, n); break;
    case N_AUG_ASSIGN: eval_aug_assign(f, n); break;
    case N_PARAM_DECL: eval_param_decl(f, n); break;
    case N_EXPR_STMT:
        if (!n->a) break;
        if (n->a->kind != N_CALL) sema_error(s, n->a->span, "this expression does nothing");
        else (void)eval_expr(f, n->a);
        break;
    case N_RETURN: eval_return(f, n); break;
    case N_FOR: eval_for(f, n); break;
    case N_IF: eval_if(f, n); break;
    case N_FN: break; /* a model's functions are defined before its body runs */
    default: break;   /* the parser puts nothing else in a body */
    }
    sema_leave(s);
}

void eval_body(Frame *f, const NodeList *stmts) {
    for (int i = 0; i < stmts->n; i++) {
        if (f->returned || f->s->over_budget) break;
        eval_stmt(f, stmts->v[i]);
    }
}
