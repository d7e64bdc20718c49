/* schedule.c - the train block's learning-rate schedule lowered to a scalar program (scalar.h).
 *
 * Pipeline position: sema (settings.c binds the schedule; eval.c has checked its function) ->
 * [schedule.c] -> scalar program -> the CPU back end's `lr_schedule`. The function's body is
 * walked once, with its parameters bound: `step` is the program's argument, every other parameter
 * the number the train block binds (or its default, lowered as an expression). Every number is a
 * double, comparisons and and/or/not are bools; locals are the instructions last assigned to
 * them; an `if` lowers both branches and selects each local, and a `return` under a condition
 * selects between the value returned before and this one (`done` holds "returned already").
 * Builtins: float, int (truncation), min, max, abs, cos, sin, exp, log, sqrt, and `pi`. A body
 * that runs off its end returns 1.0. A parameter bound to a string is a name, compared (== and
 * !=) with other names at compile time (lr.batch_scale's rule). A second parameter named `batch`
 * is the global batch at the step: the ramp's piecewise constant, selected by comparing the step
 * with each ramp entry's. The schedule `lr = A * B` is the product of its factors, each walked
 * in turn. Any other construct is an error at its source, reported when the program is checked. */
#include <inttypes.h>
#include <string.h>

#include "scalar.h"
#include "sema_internal.h"

enum { DONE_NEVER = -1, DONE_ALWAYS = -2 }; /* Outcome.done, besides a bool instruction */

typedef struct Outcome {
    int done; /* whether the statements so far have returned: DONE_NEVER, DONE_ALWAYS or a bool */
    int rv;   /* the value returned when done (an f64), else -1 */
} Outcome;

typedef struct Env {
    Str *name;
    int *val;
    int n, cap;
} Env;

/* The parameters bound to strings (lr.batch_scale's rule): names, compared at compile time. */
typedef struct SEnv {
    Str *name;
    const char **val;
    int n, cap;
} SEnv;

typedef struct Lower {
    Sema *s;
    ScalarProg *p;
    Env env;
    SEnv senv;
    int bad; /* an error was reported */
} Lower;

static void senv_set(Lower *L, Str name, const char *val) {
    SEnv *e = &L->senv;
    if (e->n == e->cap) {
        int cap = e->cap ? e->cap * 2 : 4;
        Str *nn = arena_alloc(L->s->ar, sizeof(Str) * (size_t)cap);
        const char **nv = arena_alloc(L->s->ar, sizeof(char *) * (size_t)cap);
        if (e->n) memcpy(nn, e->name, sizeof(Str) * (size_t)e->n), memcpy(nv, e->val, sizeof(char *) * (size_t)e->n);
        e->name = nn, e->val = nv, e->cap = cap;
    }
    e->name[e->n] = name;
    e->val[e->n++] = val;
}

/* The string e stands for: a literal, or a parameter bound to a string; NULL when it is not one. */
static const char *string_of(const Lower *L, const Node *e) {
    if (!e) return NULL;
    if (e->kind == N_STRING) return e->sval;
    if (e->kind == N_NAME)
        for (int i = L->senv.n - 1; i >= 0; i--)
            if (str_eq(L->senv.name[i], e->name)) return L->senv.val[i];
    return NULL;
}

static int env_find(const Env *e, Str name) {
    for (int i = e->n - 1; i >= 0; i--)
        if (str_eq(e->name[i], name)) return i;
    return -1;
}

static void env_set(Lower *L, Str name, int val) {
    Env *e = &L->env;
    int i = env_find(e, name);
    if (i >= 0) {
        e->val[i] = val;
        return;
    }
    if (e->n == e->cap) {
        int cap = e->cap ? e->cap * 2 : 16;
        Str *nn = arena_alloc(L->s->ar, sizeof(Str) * (size_t)cap);
        int *nv = arena_alloc(L->s->ar, sizeof(int) * (size_t)cap);
        if (e->n) memcpy(nn, e->name, sizeof(Str) * (size_t)e->n), memcpy(nv, e->val, sizeof(int) * (size_t)e->n);
        e->name = nn, e->val = nv, e->cap = cap;
    }
    e->name[e->n] = name;
    e->val[e->n++] = val;
}

static Env env_copy(Lower *L, const Env *e) {
    Env c = {0};
    c.cap = c.n = e->n;
    if (!e->n) return c;
    c.name = arena_dup(L->s->ar, e->name, sizeof(Str) * (size_t)e->n);
    c.val = arena_dup(L->s->ar, e->val, sizeof(int) * (size_t)e->n);
    return c;
}

static int op1(Lower *L, ScalarOp op, int a, Span at) { return scalar_add(L->p, op, a, -1, -1, at); }
static int op2(Lower *L, ScalarOp op, int a, int b, Span at) { return scalar_add(L->p, op, a, b, -1, at); }
static int sel(Lower *L, int c, int a, int b, Span at) { return scalar_add(L->p, SC_SELECT, c, a, b, at); }
static int is_bool(const Lower *L, int v) { return L->p->v[v].is_bool; }
static int as_f64(Lower *L, int v, Span at) { return is_bool(L, v) ? op1(L, SC_TO_F64, v, at) : v; }
static int as_bool(Lower *L, int v, Span at) { return is_bool(L, v) ? v : op1(L, SC_NONZERO, v, at); }

static int unsupported(Lower *L, const Node *e, const char *what) {
    if (!L->bad && sema_error(L->s, e->span, "the learning-rate schedule uses %s, which schedules do not support yet", what))
        sema_hint(L->s, "a schedule may use numbers, its parameters and locals, if/else, return, arithmetic, "
                        "comparisons, and/or/not, pi and float, int, min, max, abs, cos, sin, exp, log, sqrt");
    L->bad = 1;
    return scalar_const(L->p, 0, e->span);
}

static int lower_expr(Lower *L, const Node *e);

/* A call of a builtin by name: float, int, and the math functions of one or two numbers. */
static int lower_call(Lower *L, const Node *e) {
    if (!e->a || e->a->kind != N_NAME || e->list.n < 1 || e->list.n > 2) return unsupported(L, e, "this call");
    int a[2];
    for (int i = 0; i < e->list.n; i++)
        a[i] = as_f64(L, lower_expr(L, e->list.v[i]), e->list.v[i] ? e->list.v[i]->span : e->span);
    static const struct {
        const char *name;
        ScalarOp op;
        int n;
    } fns[] = {{"float", SC_NOPS, 1}, {"int", SC_TRUNC, 1}, {"cos", SC_COS, 1}, {"sin", SC_SIN, 1}, {"exp", SC_EXP, 1},
               {"log", SC_LOG, 1},    {"sqrt", SC_SQRT, 1}, {"abs", SC_ABS, 1}, {"min", SC_MIN, 2}, {"max", SC_MAX, 2}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
        if (!str_eqc(e->a->name, fns[i].name) || e->list.n != fns[i].n) continue;
        if (fns[i].op == SC_NOPS) return a[0]; /* float(x): every number is a double already */
        return fns[i].n == 1 ? op1(L, fns[i].op, a[0], e->span) : op2(L, fns[i].op, a[0], a[1], e->span);
    }
    return unsupported(L, e, arena_printf(L->s->ar, "a call of '%s'", sema_cstr(L->s, e->a->name)));
}

static int lower_binary(Lower *L, const Node *e) {
    const char *sa = string_of(L, e->a), *sb = string_of(L, e->b);
    if ((e->op == OP_EQ || e->op == OP_NE) && sa && sb) { /* names compare at compile time */
        int i = scalar_add(L->p, SC_BCONST, -1, -1, -1, e->span);
        L->p->v[i].k = (strcmp(sa, sb) == 0) == (e->op == OP_EQ);
        return i;
    }
    int x = lower_expr(L, e->a), y = lower_expr(L, e->b);
    if (e->op == OP_AND || e->op == OP_OR)
        return op2(L, e->op == OP_AND ? SC_AND : SC_OR, as_bool(L, x, e->span), as_bool(L, y, e->span), e->span);
    static const struct {
        Op op;
        ScalarOp sc;
    } ops[] = {{OP_ADD, SC_ADD}, {OP_SUB, SC_SUB}, {OP_MUL, SC_MUL}, {OP_DIV, SC_DIV}, {OP_MOD, SC_MOD}, {OP_POW, SC_POW},
               {OP_EQ, SC_EQ},   {OP_NE, SC_NE},   {OP_LT, SC_LT},   {OP_LE, SC_LE},   {OP_GT, SC_GT},   {OP_GE, SC_GE}};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (ops[i].op == e->op) return op2(L, ops[i].sc, as_f64(L, x, e->span), as_f64(L, y, e->span), e->span);
    return unsupported(L, e, "this operator");
}

static int lower_expr(Lower *L, const Node *e) {
    if (!e) return scalar_const(L->p, 0, span_none());
    switch (e->kind) {
    case N_INT: return scalar_const(L->p, (double)e->ival, e->span);
    case N_FLOAT: return scalar_const(L->p, e->fval, e->span);
    case N_BOOL: {
        int i = scalar_add(L->p, SC_BCONST, -1, -1, -1, e->span);
        L->p->v[i].k = e->ival != 0;
        return i;
    }
    case N_NAME: {
        int i = env_find(&L->env, e->name);
        if (i >= 0) return L->env.val[i];
        if (str_eqc(e->name, "pi")) return scalar_const(L->p, 3.14159265358979323846, e->span);
        return unsupported(
            L, e, arena_printf(L->s->ar, "'%s', which is not one of its parameters or locals", sema_cstr(L->s, e->name)));
    }
    case N_UNARY: {
        int a = lower_expr(L, e->a);
        if (e->op == OP_NEG) return op1(L, SC_NEG, as_f64(L, a, e->span), e->span);
        if (e->op == OP_POS) return a;
        if (e->op == OP_NOT) return op1(L, SC_NOT, as_bool(L, a, e->span), e->span);
        return unsupported(L, e, "this operator");
    }
    case N_BINARY: return lower_binary(L, e);
    case N_CALL: return lower_call(L, e);
    default: return unsupported(L, e, arena_printf(L->s->ar, "a '%s' expression", ast_kind_name(e->kind)));
    }
}

static int done_bool(Lower *L, int done, Span at) {
    if (done >= 0) return done;
    int i = scalar_add(L->p, SC_BCONST, -1, -1, -1, at);
    L->p->v[i].k = done == DONE_ALWAYS;
    return i;
}

/* o, then (when o has not returned yet) the outcome b of later statements. */
static void outcome_then(Lower *L, Outcome *o, Outcome b, Span at) {
    if (o->done == DONE_ALWAYS || b.done == DONE_NEVER) return;
    if (o->done == DONE_NEVER) {
        *o = b;
        return;
    }
    o->rv = sel(L, o->done, o->rv, b.rv, at);
    o->done = b.done == DONE_ALWAYS ? DONE_ALWAYS : op2(L, SC_OR, o->done, b.done, at);
}

/* The outcome of `if c { t } else { e }`. */
static Outcome outcome_if(Lower *L, int c, Outcome t, Outcome e, Span at) {
    Outcome r = {DONE_NEVER, -1};
    if (t.done == DONE_NEVER && e.done == DONE_NEVER) return r;
    r.rv = t.done == DONE_NEVER ? e.rv : e.done == DONE_NEVER ? t.rv : sel(L, c, t.rv, e.rv, at);
    r.done = t.done == DONE_ALWAYS && e.done == DONE_ALWAYS ? DONE_ALWAYS
                                                            : sel(L, c, done_bool(L, t.done, at), done_bool(L, e.done, at), at);
    return r;
}

/* Each local after `if c`: the branch's own value where the two differ (a local only one branch
 * assigns keeps that value: the other path never reads it). */
static void env_merge(Lower *L, int c, const Env *t, const Env *e, Span at) {
    L->env = env_copy(L, e);
    for (int i = 0; i < t->n; i++) {
        int k = env_find(e, t->name[i]);
        int v = k < 0 || e->val[k] == t->val[i] ? t->val[i] : sel(L, c, t->val[i], e->val[k], at);
        env_set(L, t->name[i], v);
    }
}

static Outcome lower_stmts(Lower *L, const NodeList *l) {
    Outcome o = {DONE_NEVER, -1};
    for (int i = 0; i < l->n; i++) {
        const Node *st = l->v[i];
        if (!st) continue;
        if (st->kind == N_RETURN) {
            if (!st->a) {
                unsupported(L, st, "a return without a value");
                continue;
            }
            Outcome r = {DONE_ALWAYS, as_f64(L, lower_expr(L, st->a), st->span)};
            outcome_then(L, &o, r, st->span);
        } else if (st->kind == N_ASSIGN && st->list.n == 1 && st->list.v[0] && st->list.v[0]->kind == N_NAME) {
            env_set(L, st->list.v[0]->name, as_f64(L, lower_expr(L, st->a), st->span));
        } else if (st->kind == N_IF) {
            int c = as_bool(L, lower_expr(L, st->a), st->span);
            Env before = env_copy(L, &L->env);
            Outcome t = lower_stmts(L, &st->list);
            Env after_t = L->env;
            L->env = before;
            Outcome e = lower_stmts(L, &st->list2);
            Env after_e = L->env;
            env_merge(L, c, &after_t, &after_e, st->span);
            outcome_then(L, &o, outcome_if(L, c, t, e, st->span), st->span);
        } else if (st->kind != N_EXPR_STMT) {
            unsupported(L, st, arena_printf(L->s->ar, "a '%s' statement", ast_kind_name(st->kind)));
        }
    }
    return o;
}

/* A bound value as the program would write it: 20, 0.1, true, (0.9, 0.95). */
static const char *value_text(Arena *ar, const Value *v, int depth) {
    int64_t k;
    if (!v) return "?";
    switch (v->kind) {
    case V_INT: return v->dim && dim_const(v->dim, &k) ? arena_printf(ar, "%" PRId64, k) : "?";
    case V_FLOAT: return v->fknown ? value_float_str(ar, v->f) : "?";
    case V_BOOL: return v->bknown ? (v->b ? "true" : "false") : "?";
    case V_STRING: return v->s ? arena_printf(ar, "\"%s\"", v->s) : "?";
    case V_TUPLE: {
        if (depth > 4) return "(...)";
        const char *out = "(";
        for (int i = 0; i < v->n; i++)
            out = arena_printf(ar, "%s%s%s", out, i ? ", " : "", value_text(ar, v->items[i], depth + 1));
        return arena_printf(ar, "%s)", out);
    }
    default: return "?";
    }
}

/* "lr.cosine(step, warmup = 20, total = 400, min_ratio = 0.1)": one factor as bound. */
static const char *factor_text(Sema *s, const TrainSettings *ts, const LrFactor *x) {
    const Node *fn = x->fn->node;
    const Scope *sc = x->fn->scope;
    const char *out = "";
    if (sc && sc->kind == SC_MODULE && sc->module && sc->module != ts->module && sc->module->name)
        out = arena_printf(s->keep, "%s.", sc->module->name);
    out = arena_printf(s->keep, "%s%.*s(step%s", out, STR_ARG(fn->name), x->loop == 2 ? ", batch" : "");
    for (int i = x->loop; i < fn->list.n && i - x->loop < x->nargs; i++) {
        const Node *p = fn->list.v[i];
        if (p) out = arena_printf(s->keep, "%s, %.*s = %s", out, STR_ARG(p->name), value_text(s->keep, x->args[i - x->loop], 0));
    }
    return arena_printf(s->keep, "%s)", out);
}

/* The global batch at the step: the base batch, then each ramp entry from its step on (a
 * piecewise constant the ramp fixes at compile time). */
static int lower_batch(Lower *L, const TrainSettings *ts, int step, Span at) {
    const TrainConfig *c = &ts->cfg;
    int v = scalar_const(L->p, (double)c->global, at);
    for (int i = 0; i < c->nramp; i++) {
        int from = op2(L, SC_GE, step, scalar_const(L->p, (double)c->ramp[i].step, at), at);
        v = sel(L, from, scalar_const(L->p, (double)c->ramp[i].global, at), v, at);
    }
    return v;
}

/* One factor's value: its body walked with its parameters bound. */
static int lower_factor(Lower *L, const TrainSettings *ts, const LrFactor *x, int step) {
    const Node *fn = x->fn->node;
    L->env = (Env){0};
    L->senv = (SEnv){0};
    for (int i = 0; i < fn->list.n; i++) {
        const Node *prm = fn->list.v[i];
        const Value *bound = i >= x->loop && i - x->loop < x->nargs ? x->args[i - x->loop] : NULL;
        double num = 0;
        int v;
        if (!prm) continue;
        if (i == 0) v = step;
        else if (i == 1 && x->loop == 2) v = lower_batch(L, ts, step, prm->span);
        else if (bound && bound->kind == V_STRING && bound->s) { /* a name, compared at compile time */
            senv_set(L, prm->name, bound->s);
            continue;
        } else if (bound && value_number(bound, &num)) v = scalar_const(L->p, num, prm->span);
        else if (!bound && prm->a && prm->a->kind == N_STRING) {
            senv_set(L, prm->name, prm->a->sval);
            continue;
        } else if (prm->a) v = as_f64(L, lower_expr(L, prm->a), prm->span);
        else {
            sema_error(L->s, prm->span, "the schedule's parameter '%.*s' has no number bound", STR_ARG(prm->name));
            L->bad = 1;
            continue;
        }
        env_set(L, prm->name, v);
    }
    Outcome o = lower_stmts(L, &fn->list2);
    int one = o.done == DONE_ALWAYS ? -1 : scalar_const(L->p, 1.0, fn->span);
    return o.done == DONE_ALWAYS ? o.rv : o.done == DONE_NEVER ? one : sel(L, o.done, o.rv, one, fn->span);
}

void schedule_lower(Sema *s, TrainSettings *ts) {
    TrainConfig *c = &ts->cfg;
    const char *text = NULL;
    for (int i = 0; i < ts->nlr; i++)
        text = arena_printf(s->keep, "%s%s%s", text ? text : "", text ? " * " : "", factor_text(s, ts, &ts->lr[i]));
    c->schedule_text = text;
    ScalarProg *p = scalar_new(s->keep, text ? text : "1.0");
    c->lr = p;
    if (ts->nlr == 0) {
        p->result = scalar_const(p, 1.0, span_none());
        return;
    }
    Lower L = {.s = s, .p = p};
    int step = scalar_add(p, SC_STEP, -1, -1, -1, ts->lr[0].fn->node->list.v[0] ? ts->lr[0].fn->node->list.v[0]->span : c->lr_at);
    int r = -1;
    for (int i = 0; i < ts->nlr; i++) {
        int v = lower_factor(&L, ts, &ts->lr[i], step);
        c->lr_batch |= ts->lr[i].loop == 2;
        r = r < 0 ? v : op2(&L, SC_MUL, r, v, ts->lr[i].at);
    }
    p->result = r;
    if (!L.bad && scalar_verify(p, stderr)) INTERNAL("the schedule's scalar program fails scalar_verify (problems above)");
}
