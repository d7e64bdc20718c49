/* eval_call.c - calls in sema's evaluator: arguments bound to parameters, function bodies run,
 * models instantiated and optimizers bound; models, functions and optimizers checked on their
 * own; an optimizer's update run with its hyper-parameters; learning-rate schedules bound.
 *
 * Pipeline position: AST -> [sema: eval.c evaluates expressions and statements, this file the
 * calls they make] -> graph IR (the hooks marked "graph builder hook"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "eval_internal.h"

/* ---- calls: arguments ---- */

void build_call(Frame *f, const Node *n, Call *c) {
    Sema *s = f->s;
    memset(c, 0, sizeof *c);
    int np = 0, nk = 0;
    for (int i = 0; i < n->list.n; i++) {
        if (!n->list.v[i]) continue;
        if (n->list.v[i]->kind == N_KWARG) nk++;
        else np++;
    }
    /* One block for the six arrays (Str and pointers first, for alignment). */
    char *mem = arena_alloc(s->ar, (sizeof(Value *) + sizeof(Span)) * (size_t)np +
                                       (sizeof(Str) + sizeof(Value *) + 2 * sizeof(Span)) * (size_t)nk + 8);
    c->a.kw_name = (Str *)mem;
    mem += sizeof(Str) * (size_t)nk;
    c->a.pos = (Value **)mem;
    mem += sizeof(Value *) * (size_t)np;
    c->a.kw = (Value **)mem;
    mem += sizeof(Value *) * (size_t)nk;
    c->a.pos_at = (Span *)mem;
    mem += sizeof(Span) * (size_t)np;
    c->a.kw_at = (Span *)mem;
    mem += sizeof(Span) * (size_t)nk;
    c->kw_name_at = (Span *)mem;
    for (int i = 0; i < n->list.n; i++) {
        const Node *it = n->list.v[i];
        if (!it) continue;
        if (it->kind == N_KWARG) {
            int k = c->a.nkw++;
            c->a.kw_name[k] = it->name;
            c->a.kw[k] = eval_expr(f, it->a);
            c->a.kw_at[k] = span_or(it->a, it->span);
            c->kw_name_at[k] = sema_span_of(it, it->name);
        } else {
            int k = c->a.npos++;
            c->a.pos[k] = eval_expr(f, it);
            c->a.pos_at[k] = it->span;
        }
    }
    c->a.callee_at = span_or(n->a, n->span);
    c->a.at = n->span;
    c->generic = f->generic;
}

/* Matches a call's arguments to declared parameters: vals[i]/at[i] receive the argument given
 * for params->v[i] (NULL when none). Parameters before `first` are supplied by the compiler
 * (a schedule's `step`), and giving one is an error. Returns 0 after reporting too many,
 * unknown or repeated arguments; missing ones are the caller's to report (defaults first). */
static int bind_args(Sema *s, const Call *c, const NodeList *params, int first, const char *what, const Node *decl, Value **vals,
                     Span *at) {
    int ok = 1;
    int np = params->n - first;
    for (int i = 0; i < c->a.npos; i++) {
        if (i >= np) {
            if (sema_error(s, c->a.pos_at[i], "'%s' takes %d argument%s but %d %s given", what, np, np == 1 ? "" : "s", c->a.npos,
                           c->a.npos == 1 ? "was" : "were"))
                sema_note(s, decl_name_span(decl), "'%s' is declared here", what);
            ok = 0;
            break;
        }
        vals[first + i] = c->a.pos[i];
        at[first + i] = c->a.pos_at[i];
    }
    for (int k = 0; k < c->a.nkw; k++) {
        Str kn = c->a.kw_name[k];
        int j = -1;
        for (int i = 0; i < params->n; i++)
            if (params->v[i] && str_eq(params->v[i]->name, kn)) {
                j = i;
                break;
            }
        if (j >= 0 && j < first) {
            sema_error(s, c->kw_name_at[k], "'%.*s' is supplied by the training loop and cannot be given", STR_ARG(kn));
            ok = 0;
            continue;
        }
        if (j < 0) {
            if (sema_error(s, c->kw_name_at[k], "'%s' has no parameter '%.*s'", what, STR_ARG(kn))) {
                sema_note(s, decl_name_span(decl), "'%s' is declared here", what);
                Suggest g;
                suggest_init(&g, kn);
                for (int i = first; i < params->n; i++)
                    if (params->v[i]) suggest_try(&g, params->v[i]->name.p, params->v[i]->name.len);
                sema_hint_suggest(s, &g);
            }
            ok = 0;
            continue;
        }
        if (vals[j]) {
            if (sema_error(s, c->kw_name_at[k], "argument '%.*s' of '%s' is given twice", STR_ARG(kn), what))
                sema_note(s, at[j], "first given here");
            ok = 0;
            continue;
        }
        vals[j] = c->a.kw[k];
        at[j] = c->a.kw_at[k];
    }
    return ok;
}

static void missing_arg(Sema *s, Span call_at, const Node *param, const char *what) {
    if (sema_error(s, call_at, "missing argument '%.*s' in the call to '%s'", STR_ARG(param->name), what))
        sema_note(s, param->span, "'%.*s' is declared here", STR_ARG(param->name));
}

static const char *kind_word(ValueKind k) {
    switch (k) {
    case V_INT: return "an integer";
    case V_FLOAT: return "a float";
    case V_BOOL: return "a bool";
    case V_STRING: return "a string";
    default: return "a value";
    }
}

/* A model constant given at an instantiation: integers, floats, bools and strings only, of the
 * kind of its default when it has a literal one. */
static Value *check_constant(Sema *s, const Node *p, Value *v, Span at, const char *model) {
    if (v->kind == V_UNKNOWN) return v;
    if (v->kind != V_INT && v->kind != V_FLOAT && v->kind != V_BOOL && v->kind != V_STRING) {
        sema_error(s, at, "constant '%.*s' of '%s' must be an integer, float, bool or string, but it is %s", STR_ARG(p->name),
                   model, value_describe(s->ar, v));
        return unknown_at(s, at);
    }
    const Node *d = p->a;
    if (d && d->kind == N_UNARY && d->a) d = d->a;
    ValueKind want = V_UNKNOWN;
    if (d && d->kind == N_INT) want = V_INT;
    else if (d && d->kind == N_FLOAT) want = V_FLOAT;
    else if (d && d->kind == N_BOOL) want = V_BOOL;
    else if (d && d->kind == N_STRING) want = V_STRING;
    if (want == V_UNKNOWN || want == v->kind || (want == V_FLOAT && v->kind == V_INT)) return v;
    if (sema_error(s, at, "constant '%.*s' of '%s' must be %s like its default, but it is %s", STR_ARG(p->name), model,
                   kind_word(want), value_describe(s->ar, v)))
        sema_note(s, p->span, "'%.*s' is declared here", STR_ARG(p->name));
    return unknown_at(s, at);
}

static int hyper_ok(const Value *v, int depth) {
    if (v->kind == V_INT || v->kind == V_FLOAT || v->kind == V_BOOL || v->kind == V_UNKNOWN) return 1;
    if (v->kind == V_TUPLE && depth < 4) {
        for (int i = 0; i < v->n; i++)
            if (!v->items[i] || !hyper_ok(v->items[i], depth + 1)) return 0;
        return 1;
    }
    return 0;
}

/* The range of a hyper-parameter, by its name: `lr` in every optimizer (the train block's schedule
 * scales it: the learning rate), the others in the stdlib's (optim.mbt, as in PyTorch). */
typedef struct HyperRange {
    const char *name;
    double lo, hi; /* lo <= x < hi, or lo < x when lo_open */
    int lo_open, std_only;
    const char *allowed;
} HyperRange;

static const HyperRange hyper_ranges[] = {
    {"lr", 0, INFINITY, 1, 0, "a positive number (the learning rate)"},
    {"betas", 0, 1, 0, 1, "a pair of numbers in [0, 1)"},
    {"momentum", 0, 1, 0, 1, "a number in [0, 1)"},
    {"eps", 0, INFINITY, 1, 1, "a positive number"},
    {"weight_decay", 0, INFINITY, 0, 1, "zero or a positive number"},
};

static int hyper_in(const HyperRange *r, double x) { return x == x && (r->lo_open ? x > r->lo : x >= r->lo) && x < r->hi; }

/* 0 after reporting a known value out of its range. */
static int hyper_range_ok(Sema *s, const Node *p, const Value *v, Span at, const char *opt, int std) {
    for (size_t i = 0; i < sizeof hyper_ranges / sizeof *hyper_ranges; i++) {
        const HyperRange *r = &hyper_ranges[i];
        if (!str_eqc(p->name, r->name) || (r->std_only && !std)) continue;
        const Value *const *items = v->kind == V_TUPLE ? (const Value *const *)v->items : &v;
        int n = v->kind == V_TUPLE ? v->n : 1;
        for (int j = 0; j < n; j++) {
            double x;
            if (!items[j] || !value_number(items[j], &x) || hyper_in(r, x)) continue;
            sema_error(s, at, "hyper-parameter '%s' of '%s' must be %s, but it is %s", r->name, opt, r->allowed,
                       diag_span_text(s->ar, at));
            return 0;
        }
    }
    return 1;
}

static Value *check_hyper(Sema *s, const Node *p, Value *v, Span at, const char *opt, int std) {
    if (hyper_ok(v, 0)) return hyper_range_ok(s, p, v, at, opt, std) ? v : unknown_at(s, at);
    sema_error(s, at, "hyper-parameter '%.*s' of '%s' must be a number or a tuple of numbers, but it is %s", STR_ARG(p->name),
               opt, value_describe(s->ar, v));
    return unknown_at(s, at);
}

/* Gives each parameter of a function its value: vals[i] when given, else its default
 * (evaluated where the earlier parameters are visible), else a `missing argument` error. Then
 * binds upper-case dimensions from the arguments and checks every declared type. Parameters
 * are defined in loc. Returns 0 after any error. */
static int setup_params(Sema *s, const Node *fn, const char *fname, Value **vals, Span *at, Scope *loc, Span call_at,
                        int generic) {
    int ok = 1, np = fn->list.n;
    int *given = arena_alloc(s->ar, sizeof(int) * (size_t)(np + 1));
    Frame df = frame_make(s, FR_EXPR, loc, generic);
    for (int i = 0; i < np; i++) {
        const Node *p = fn->list.v[i];
        if (!p) continue;
        given[i] = vals[i] != NULL;
        if (!vals[i]) {
            if (p->a) {
                vals[i] = eval_expr(&df, p->a);
                at[i] = p->a->span;
            } else {
                missing_arg(s, call_at, p, fname);
                vals[i] = unknown_at(s, call_at);
                ok = 0;
            }
        }
        scope_define(s, loc, p->name, vals[i], ENT_LOCAL, p->span);
    }
    for (int i = 0; i < np; i++) {
        const Node *p = fn->list.v[i];
        if (p && p->type) type_bind(s, loc, p->type, vals[i], p->span);
    }
    /* An upper-case dimension no argument could bind (the argument is unknown after an earlier
     * error) is unknown too, so the body's uses of it stay quiet. */
    for (int i = 0; i < np; i++) {
        const Node *p = fn->list.v[i];
        if (!p || !p->type || !p->type->ival) continue;
        for (int j = 0; j < p->type->list.n; j++) {
            const Node *d = p->type->list.v[j];
            if (!d || d->kind != N_NAME || !is_upper_name(d->name)) continue;
            Entry *e = scope_lookup(loc, d->name, NULL);
            if (!e || !(e->kind == ENT_DIM || (e->v && e->v->kind == V_INT)))
                scope_define(s, loc, d->name, unknown_at(s, p->span), ENT_DIM, p->span);
        }
    }
    for (int i = 0; i < np; i++) {
        const Node *p = fn->list.v[i];
        if (!p || !p->type || type_match(s, loc, p->type, vals[i])) continue;
        const Value *v = vals[i];
        const char *decl = type_text(s, p->type);
        const char *with = type_with(s, loc, p->type, p->span);
        Span where = given[i] ? at[i] : call_at;
        int rep;
        DType dt;
        if (v->kind == V_TENSOR && p->type->ival && dtype_parse(p->type->name, &dt))
            rep = sema_error(s, where, "argument '%.*s' of '%s' has %s %s but the parameter is declared %s%s", STR_ARG(p->name),
                             fname, v->t.dt == dt ? "shape" : "type", value_describe(s->ar, v), decl, with);
        else
            rep = sema_error(s, where, "argument '%.*s' of '%s' is %s but the parameter is declared %s%s", STR_ARG(p->name),
                             fname, value_describe(s->ar, v), decl, with);
        if (rep) sema_note(s, p->span, "parameter '%.*s' is declared here", STR_ARG(p->name));
        ok = 0;
    }
    return ok;
}

/* ---- calls: bodies ---- */

static int enter_call(Sema *s, const Node *decl, const char *name, Span call_at) {
    if (on_stack(s, decl)) {
        if (sema_error(s, call_at.file ? call_at : decl_name_span(decl), "recursive call to '%s'", name))
            sema_note(s, decl_name_span(decl), "'%s' is declared here", name);
        return 0;
    }
    if (s->depth >= SEMA_MAX_CALL_DEPTH) {
        sema_error(s, call_at.file ? call_at : decl_name_span(decl), "calls are nested more than %d deep", SEMA_MAX_CALL_DEPTH);
        return 0;
    }
    s->stack[s->depth++] = decl;
    return 1;
}

/* Evaluates a function's body with its parameters already in loc. */
static Value *run_fn(Sema *s, Value *fnv, Scope *loc, Span call_at, FrameKind kind, int generic, const TensorType *p_type) {
    const Node *fn = fnv->node;
    const char *fname = sema_cstr(s, fn->name);
    if (!enter_call(s, fn, fname, call_at)) return declared_result(s, fn, loc, call_at);
    int before = diag_error_count();
    Frame ff = frame_make(s, kind, loc, generic);
    ff.fn = fn;
    ff.fname = fname;
    ff.result = fn->type;
    ff.owner = fnv->scope ? fnv->scope->name : "";
    if (p_type) ff.p_type = *p_type;
    eval_body(&ff, &fn->list2);
    if (fn->type && !ff.returned && !s->over_budget)
        sema_error(s, decl_name_span(fn), "missing return in '%s', which is declared to return %s", fname,
                   type_text(s, fn->type));
    s->depth--;
    Value *r = ff.ret;
    if (!r) r = fn->type ? declared_result(s, fn, loc, call_at) : value_new(s->ar, V_NONE, call_at);
    if (diag_error_count() > before) {
        sema_info(s, fn)->broken = 1;
        if (call_at.file) sema_note(s, call_at, "'%s' is called here", fname);
    }
    return r;
}

/* Every parameter and the result have declared types. */
static int fully_typed(const Node *fn) {
    if (!fn->type) return 0;
    for (int i = 0; i < fn->list.n; i++)
        if (!fn->list.v[i] || !fn->list.v[i]->type) return 0;
    return 1;
}

static Value *call_fn(Sema *s, Value *fnv, Call *c) {
    const Node *fn = fnv->node;
    if (!fn) return unknown_at(s, c->a.at);
    const char *fname = sema_cstr(s, fn->name);
    NodeInfo *inf = sema_info(s, fn);
    if (!inf->generic) eval_check_fn(s, fn);
    int np = fn->list.n;
    Value **vals = arena_alloc(s->ar, sizeof(Value *) * (size_t)(np + 1));
    Span *at = arena_alloc(s->ar, sizeof(Span) * (size_t)(np + 1));
    int ok = bind_args(s, c, &fn->list, 0, fname, fn, vals, at);
    Scope *loc = scope_new(s, fnv->scope, SC_LOCAL, fname, NULL);
    ok &= setup_params(s, fn, fname, vals, at, loc, c->a.at, 0);
    if (!ok) return unknown_at(s, c->a.at); /* the caller's mistake: nothing more to say */
    if (inf->broken) return declared_result(s, fn, loc, c->a.at);
    if (c->generic && inf->generic == 2 && fully_typed(fn)) {
        /* Checked on its own for every value of its constants and dimensions, and the arguments
         * fit its declared types: its declared result is exact, and evaluating the body again
         * could find nothing new (concrete values come with a train or serve block). */
        Value *r = declared_result(s, fn, loc, c->a.at);
        if (r->kind != V_UNKNOWN) return r;
    }
    return run_fn(s, fnv, loc, c->a.at, FR_FN, c->generic, NULL);
}

/* Evaluates a model body into the instance scope inst (its constants already there). */
static Value *instantiate_body(Sema *s, const Node *m, Scope *inst, Span call_at, int generic) {
    const char *mname = inst->name;
    if (!enter_call(s, m, mname, call_at)) return unknown_at(s, call_at);
    int before = diag_error_count();
    /* Functions are members from the start, so the body may name them in any order. */
    for (int i = 0; i < m->list2.n; i++) {
        const Node *it = m->list2.v[i];
        if (!it || it->kind != N_FN) continue;
        Entry *old = scope_find(inst, it->name);
        if (old) {
            if (sema_error(s, decl_name_span(it), "redefinition of '%.*s' in model '%s'", STR_ARG(it->name), mname))
                sema_note(s, old->decl, "'%.*s' was first defined here", STR_ARG(it->name));
            continue;
        }
        Value *fv = value_new(s->ar, V_FN, it->span);
        fv->node = it;
        fv->scope = inst;
        scope_define(s, inst, it->name, fv, ENT_FN, decl_name_span(it));
    }
    Frame bf = frame_make(s, FR_MODEL_BODY, inst, generic);
    bf.owner = mname;
    eval_body(&bf, &m->list2);
    s->depth--;
    Value *v = value_new(s->ar, V_MODEL, call_at.file ? call_at : m->span);
    v->node = m;
    v->scope = inst;
    if (diag_error_count() > before) {
        sema_info(s, m)->broken = 1;
        if (call_at.file) {
            const char *sig = scope_sig(s, inst);
            if (*sig) sema_note(s, call_at, "'%s' is instantiated here with %s", mname, sig);
            else sema_note(s, call_at, "'%s' is instantiated here", mname);
        }
    }
    return v;
}

/* Takes the keyword argument `name` out of c unless params declare it: the keywords every model
 * (trainable) and every optimizer (no_decay) accepts (groups.c). Its value, or NULL when absent. */
static Value *take_keyword(Call *c, const NodeList *params, const char *name) {
    for (int i = 0; i < params->n; i++)
        if (params->v[i] && str_eqc(params->v[i]->name, name)) return NULL; /* declared: an ordinary argument */
    for (int k = 0; k < c->a.nkw; k++) {
        if (!str_eqc(c->a.kw_name[k], name)) continue;
        Value *v = c->a.kw[k];
        for (int j = k + 1; j < c->a.nkw; j++) {
            c->a.kw_name[j - 1] = c->a.kw_name[j];
            c->a.kw[j - 1] = c->a.kw[j];
            c->a.kw_at[j - 1] = c->a.kw_at[j];
            if (c->kw_name_at) c->kw_name_at[j - 1] = c->kw_name_at[j];
        }
        c->a.nkw--;
        return v;
    }
    return NULL;
}

static Value *instantiate(Sema *s, Value *defv, Call *c) {
    const Node *m = defv->node;
    if (!m) return unknown_at(s, c->a.at);
    const char *mname = sema_cstr(s, m->name);
    NodeInfo *inf = sema_info(s, m);
    if (!inf->generic) eval_check_model(s, m);
    Value *trainable = take_keyword(c, &m->list, "trainable");
    int frozen = 0;
    if (trainable && trainable->kind != V_UNKNOWN) {
        if (trainable->kind != V_BOOL) {
            if (sema_error(s, trainable->origin, "'trainable' must be true or false, but it is %s",
                           value_describe(s->ar, trainable)))
                sema_hint(s, "trainable = false freezes every parameter of the instance");
        } else frozen = trainable->bknown && !trainable->b; /* unknown while a model is checked on its own */
    }
    int np = m->list.n;
    Value **vals = arena_alloc(s->ar, sizeof(Value *) * (size_t)(np + 1));
    Span *at = arena_alloc(s->ar, sizeof(Span) * (size_t)(np + 1));
    int ok = bind_args(s, c, &m->list, 0, mname, m, vals, at);
    Scope *inst = scope_new(s, defv->scope, SC_MODEL, mname, NULL);
    Frame df = frame_make(s, FR_EXPR, inst, 0);
    for (int i = 0; i < np; i++) {
        const Node *p = m->list.v[i];
        if (!p) continue;
        Value *v = vals[i];
        if (v) v = check_constant(s, p, v, at[i], mname);
        else if (p->a) v = eval_expr(&df, p->a);
        else {
            missing_arg(s, c->a.at, p, mname);
            v = unknown_at(s, c->a.at);
            ok = 0;
        }
        scope_define(s, inst, p->name, v, ENT_CONST, p->span);
    }
    if (!ok || inf->broken) return unknown_at(s, c->a.at);
    Value *r = instantiate_body(s, m, inst, c->a.at, 0);
    if (r && r->kind == V_MODEL) r->frozen = frozen;
    return r;
}

static void define_member_fns(Sema *s, const Node *owner, Scope *sc) {
    for (int i = 0; i < owner->list2.n; i++) {
        const Node *it = owner->list2.v[i];
        if (!it || it->kind != N_FN) continue;
        Entry *old = scope_find(sc, it->name);
        if (old) {
            if (sema_error(s, decl_name_span(it), "redefinition of '%.*s' in '%s'", STR_ARG(it->name), sc->name))
                sema_note(s, old->decl, "'%.*s' was first defined here", STR_ARG(it->name));
            continue;
        }
        Value *fv = value_new(s->ar, V_FN, it->span);
        fv->node = it;
        fv->scope = sc;
        scope_define(s, sc, it->name, fv, ENT_FN, decl_name_span(it));
    }
}

static Value *bind_optimizer(Sema *s, Value *defv, Call *c) {
    const Node *o = defv->node;
    if (!o) return unknown_at(s, c->a.at);
    const char *oname = sema_cstr(s, o->name);
    NodeInfo *inf = sema_info(s, o);
    if (!inf->generic) eval_check_optimizer(s, o);
    Value *no_decay = take_keyword(c, &o->list, "no_decay");
    int np = o->list.n;
    Value **vals = arena_alloc(s->ar, sizeof(Value *) * (size_t)(np + 1));
    Span *at = arena_alloc(s->ar, sizeof(Span) * (size_t)(np + 1));
    int ok = bind_args(s, c, &o->list, 0, oname, o, vals, at);
    if (no_decay) {
        int has_wd = 0;
        for (int i = 0; i < np; i++) has_wd |= o->list.v[i] && str_eqc(o->list.v[i]->name, "weight_decay");
        if (!has_wd) {
            if (sema_error(s, no_decay->origin, "'no_decay' needs a hyper-parameter 'weight_decay', which '%s' does not have",
                           oname))
                sema_note(s, decl_name_span(o), "'%s' is declared here", oname);
            ok = 0;
        } else ok &= groups_check_list(s, no_decay, "no_decay");
    }
    int std = defv->scope && defv->scope->module && strcmp(defv->scope->module->name, "optim") == 0;
    Scope *os = scope_new(s, defv->scope, SC_OPTIMIZER, oname, NULL);
    Frame df = frame_make(s, FR_EXPR, os, 0);
    for (int i = 0; i < np; i++) {
        const Node *p = o->list.v[i];
        if (!p) continue;
        Value *v = vals[i];
        if (v) v = check_hyper(s, p, v, at[i], oname, std);
        else if (p->a) v = check_hyper(s, p, eval_expr(&df, p->a), p->a->span, oname, std);
        else {
            missing_arg(s, c->a.at, p, oname);
            v = unknown_at(s, c->a.at);
            ok = 0;
        }
        scope_define(s, os, p->name, v, ENT_CONST, p->span);
    }
    define_member_fns(s, o, os);
    if (!ok) return unknown_at(s, c->a.at);
    Value *v = value_new(s->ar, V_OPTIMIZER, c->a.at);
    v->node = o;
    v->scope = os;
    if (no_decay) { /* matched against the model's parameters by the train block (groups.c) */
        v->items = arena_alloc(s->ar, sizeof(Value *));
        v->items[0] = no_decay;
        v->n = 1;
    }
    return v;
}

Value *eval_apply(Sema *s, Value *callee, Call *c) {
    switch (callee->kind) {
    case V_UNKNOWN: return unknown_at(s, c->a.at);
    case V_BUILTIN: {
        Value *r =
            callee->builtin ? builtin_call(s->ar, callee->builtin, &c->a, s->precision == PREC_BF16 ? DT_BF16 : DT_F32) : NULL;
        if (r && gb_listening(s, c->generic)) gb_builtin(s->gb, callee->builtin, &c->a, r); /* graph builder hook */
        return r ? r : unknown_at(s, c->a.at);
    }
    case V_MODEL_DEF: return instantiate(s, callee, c);
    case V_MODEL: {
        Entry *e = find_member(callee->scope, "forward");
        if (!e || e->kind != ENT_FN || !e->v || e->v->kind != V_FN) {
            const char *mname = callee->node ? sema_cstr(s, callee->node->name) : "?";
            if (sema_error(s, c->a.callee_at, "'%s' cannot be called: model '%s' has no 'forward' function",
                           diag_span_text(s->ar, c->a.callee_at), mname) &&
                callee->node)
                sema_note(s, decl_name_span(callee->node), "'%s' is declared here", mname);
            return unknown_at(s, c->a.at);
        }
        return call_fn(s, e->v, c);
    }
    case V_FN: return call_fn(s, callee, c);
    case V_OPTIMIZER_DEF: return bind_optimizer(s, callee, c);
    default:
        sema_error(s, c->a.callee_at, "'%s' cannot be called: it is %s", diag_span_text(s->ar, c->a.callee_at),
                   value_describe(s->ar, callee));
        return unknown_at(s, c->a.at);
    }
}

/* `model(x)` for a model value and an argument value, as if written at `at` (checked with
 * the block's concrete constants, so the graph builder listens). */
Value *eval_call_model(Sema *s, Value *model, Value *x, Value *pos, Span at) {
    Call c;
    memset(&c, 0, sizeof c);
    c.a.pos = arena_alloc(s->ar, sizeof(Value *) * 2);
    c.a.pos_at = arena_alloc(s->ar, sizeof(Span) * 2);
    c.a.pos[0] = x;
    c.a.pos_at[0] = at;
    c.a.pos[1] = pos;
    c.a.pos_at[1] = at;
    c.a.npos = pos ? 2 : 1;
    c.a.callee_at = c.a.at = at;
    return eval_apply(s, model, &c);
}

int model_forward_arity(Value *model) {
    if (!model || model->kind != V_MODEL || !model->scope) return -1;
    Entry *e = find_member(model->scope, "forward");
    if (!e || e->kind != ENT_FN || !e->v || e->v->kind != V_FN || !e->v->node) return -1;
    return e->v->node->list.n;
}

/* ---- checking declarations on their own ---- */

/* Duplicate parameter names and unknown dtypes in a parameter list. */
static void check_param_list(Sema *s, const NodeList *params) {
    for (int i = 0; i < params->n; i++) {
        const Node *p = params->v[i];
        if (!p) continue;
        for (int j = 0; j < i; j++) {
            const Node *q = params->v[j];
            if (q && str_eq(q->name, p->name)) {
                if (sema_error(s, sema_span_of(p, p->name), "redefinition of '%.*s'", STR_ARG(p->name)))
                    sema_note(s, sema_span_of(q, q->name), "'%.*s' was first defined here", STR_ARG(q->name));
                break;
            }
        }
        DType dt;
        if (p->type) (void)type_dtype(s, p->type, &dt);
    }
}

/* Checks one function with parameters of their declared types (untyped ones unknown). */
static void check_fn_in(Sema *s, const Node *fn, Scope *scope) {
    NodeInfo *inf = sema_info(s, fn);
    if (inf->generic) return;
    inf->generic = 1;
    const char *fname = sema_cstr(s, fn->name);
    check_param_list(s, &fn->list);
    DType dt;
    if (fn->type) (void)type_dtype(s, fn->type, &dt);
    Value *fnv = value_new(s->ar, V_FN, fn->span);
    fnv->node = fn;
    fnv->scope = scope;
    Scope *loc = scope_new(s, scope, SC_LOCAL, fname, NULL);
    for (int i = 0; i < fn->list.n; i++) {
        const Node *p = fn->list.v[i];
        if (!p) continue;
        Value *v = p->type ? value_of_type(s, loc, p->type, p->span, 1, p->name) : unknown_at(s, p->span);
        scope_define(s, loc, p->name, v, ENT_LOCAL, p->span);
    }
    (void)run_fn(s, fnv, loc, span_none(), FR_FN, 1, NULL);
    inf->generic = 2;
}

void eval_check_fn(Sema *s, const Node *fn) {
    NodeInfo *inf = sema_info(s, fn);
    if (inf->generic) return;
    if (!inf->owner) {
        if (inf->defscope) check_fn_in(s, fn, inf->defscope);
        return;
    }
    if (inf->owner->kind == N_MODEL) eval_check_model(s, inf->owner);
    else if (inf->owner->kind == N_OPTIMIZER) eval_check_optimizer(s, inf->owner);
    /* The owner is being checked and its instance is ready: check this one now, before a call
     * evaluates it with other arguments. */
    NodeInfo *oi = sema_info(s, inf->owner);
    if (!inf->generic && oi->generic_inst && oi->generic_inst->scope) check_fn_in(s, fn, oi->generic_inst->scope);
}

/* The value a model constant or hyper-parameter has when its declaration is checked on its own. */
static Value *generic_const(Sema *s, Frame *df, const Node *p, Scope *sc, int optimizer) {
    if (p->type) return value_of_type(s, sc, p->type, p->span, 1, p->name);
    if (p->a) return unknownify(s, eval_expr(df, p->a), p->name, p->span, 0);
    if (optimizer) return value_float(s->ar, 0, 0, p->span);
    return value_int(s->ar, dim_sym(s->ar, sema_cstr(s, p->name)), p->span);
}

void eval_check_model(Sema *s, const Node *m) {
    NodeInfo *inf = sema_info(s, m);
    if (inf->generic) return;
    inf->generic = 1;
    if (!inf->defscope) {
        inf->generic = 2;
        return;
    }
    const char *mname = sema_cstr(s, m->name);
    check_param_list(s, &m->list);
    Scope *inst = scope_new(s, inf->defscope, SC_MODEL, mname, inf->module);
    Frame df = frame_make(s, FR_EXPR, inst, 1);
    for (int i = 0; i < m->list.n; i++) {
        const Node *p = m->list.v[i];
        if (p) scope_define(s, inst, p->name, generic_const(s, &df, p, inst, 0), ENT_CONST, p->span);
    }
    inf->generic_inst = instantiate_body(s, m, inst, span_none(), 1);
    for (int i = 0; i < m->list2.n; i++) {
        const Node *it = m->list2.v[i];
        if (it && it->kind == N_FN) check_fn_in(s, it, inst);
    }
    inf->generic_inst = NULL; /* it may live in a scratch arena that is about to go */
    inf->generic = 2;
}

void eval_check_optimizer(Sema *s, const Node *o) {
    NodeInfo *inf = sema_info(s, o);
    if (inf->generic) return;
    inf->generic = 1;
    if (!inf->defscope) {
        inf->generic = 2;
        return;
    }
    const char *oname = sema_cstr(s, o->name);
    check_param_list(s, &o->list);
    Scope *os = scope_new(s, inf->defscope, SC_OPTIMIZER, oname, inf->module);
    int std = inf->module && strcmp(inf->module->name, "optim") == 0;
    Frame df = frame_make(s, FR_EXPR, os, 1);
    for (int i = 0; i < o->list.n; i++) {
        const Node *p = o->list.v[i];
        if (!p) continue;
        if (p->a) (void)check_hyper(s, p, eval_expr(&df, p->a), p->a->span, oname, std);
        scope_define(s, os, p->name, generic_const(s, &df, p, os, 1), ENT_CONST, p->span);
    }
    define_member_fns(s, o, os);
    Value *ov = value_new(s->ar, V_OPTIMIZER, o->span);
    ov->node = o;
    ov->scope = os;
    inf->generic_inst = ov;
    /* State variables: numbers to start from, names of their own. */
    Scope *names = scope_new(s, NULL, SC_LOCAL, oname, inf->module);
    for (int i = 0; i < o->list2.n; i++) {
        const Node *st = o->list2.v[i];
        if (!st || st->kind != N_STATE) continue;
        for (int j = 0; j < st->list.n; j++) {
            const Node *sv = st->list.v[j];
            if (!sv) continue;
            Span sv_at = sema_span_of(sv, sv->name);
            Entry *old = scope_find(names, sv->name);
            if (!old) old = scope_find(os, sv->name);
            if (old) {
                if (sema_error(s, sv_at, "redefinition of '%.*s'", STR_ARG(sv->name)))
                    sema_note(s, old->decl, "'%.*s' was first defined here", STR_ARG(sv->name));
                continue;
            }
            scope_define(s, names, sv->name, unknown_at(s, sv_at), ENT_STATE, sv_at);
            if (!sv->a) continue;
            Value *init = eval_expr(&df, sv->a);
            if (init->kind != V_INT && init->kind != V_FLOAT && init->kind != V_UNKNOWN)
                sema_error(s, sv->a->span, "state '%.*s' must start from a number, but it is %s", STR_ARG(sv->name),
                           value_describe(s->ar, init));
        }
    }
    const Node *upd = find_fn(o, "update");
    if (!upd) {
        if (sema_error(s, decl_name_span(o), "optimizer '%s' has no 'update' function", oname))
            sema_hint(s, "add fn update(p, g, t) { ... }, which assigns the new value of p");
    } else if (upd->list.n != 3) {
        sema_error(s, decl_name_span(upd), "'update' must take 3 parameters (p, g, t), but it takes %d", upd->list.n);
    }
    for (int i = 0; i < o->list2.n; i++) {
        const Node *it = o->list2.v[i];
        if (it && it->kind == N_FN && it != upd) check_fn_in(s, it, os);
    }
    if (upd) {
        NodeInfo *ui = sema_info(s, upd);
        ui->generic = 1;
        check_param_list(s, &upd->list);
        eval_check_update(s, ov, span_none());
        ui->generic = 2;
    }
    inf->generic_inst = NULL; /* it may live in a scratch arena that is about to go */
    inf->generic = 2;
}

void eval_check_update(Sema *s, Value *ov, Span at) {
    const Node *o = ov->node;
    if (!o || !ov->scope) return;
    const Node *upd = find_fn(o, "update");
    if (!upd || upd->list.n != 3 || sema_info(s, upd)->broken) return;
    Scope *loc = scope_new(s, ov->scope, SC_LOCAL, "update", NULL);
    /* Elementwise over every parameter: one symbolic length stands for all of their shapes. */
    const Dim *dims[1] = {dim_sym(s->ar, "P")};
    const Node *pp = upd->list.v[0], *gp = upd->list.v[1], *tp = upd->list.v[2];
    if (!pp || !gp || !tp) return;
    /* graph builder hook: building the update graph, p, g and the state variables are the f32[n]
     * inputs over the flat parameter layout and t an f32[] input (graph_build.h); each hook gives
     * NULL after a failure, and the generic value stands in. */
    GraphBuilder *gb = gb_listening(s, at.file == 0) ? s->gb : NULL;
    Value *pt = gb ? gb_update_leaf(gb, "p", pp->name, NULL, pp->span) : NULL;
    Value *gt = gb ? gb_update_leaf(gb, "g", gp->name, NULL, gp->span) : NULL;
    Value *tt = gb ? gb_update_leaf(gb, "t", tp->name, NULL, tp->span) : NULL;
    if (!pt) pt = value_tensor(s->ar, DT_F32, 1, dims, upd->span);
    if (!gt) gt = value_tensor(s->ar, DT_F32, 1, dims, gp->span);
    if (!tt) tt = value_int(s->ar, dim_sym(s->ar, sema_cstr(s, tp->name)), tp->span);
    scope_define(s, loc, pp->name, pt, ENT_UPDATE_P, pp->span);
    scope_define(s, loc, gp->name, gt, ENT_READONLY, gp->span);
    scope_define(s, loc, tp->name, tt, ENT_READONLY, tp->span);
    Frame init_frame = frame_make(s, FR_EXPR, ov->scope, 0);
    for (int i = 0; i < o->list2.n; i++) {
        const Node *st = o->list2.v[i];
        if (!st || st->kind != N_STATE) continue;
        for (int j = 0; j < st->list.n; j++) {
            const Node *sv = st->list.v[j];
            if (!sv || scope_find(loc, sv->name)) continue;
            Value *sv_value = NULL;
            if (gb) /* graph builder hook: the state's input, with the number it starts from */
                sv_value = gb_update_leaf(gb, "state", sv->name, sv->a ? eval_expr(&init_frame, sv->a) : NULL,
                                          sema_span_of(sv, sv->name));
            if (!sv_value) sv_value = value_tensor(s->ar, DT_F32, 1, dims, sv->span);
            scope_define(s, loc, sv->name, sv_value, ENT_STATE, sema_span_of(sv, sv->name));
        }
    }
    Value *fnv = value_new(s->ar, V_FN, upd->span);
    fnv->node = upd;
    fnv->scope = ov->scope;
    Value *lr_number = NULL; /* graph builder hook: lr is the input "lr" while update runs */
    Entry *lr = gb ? sema_gb_lr_swap(gb, ov->scope, &lr_number) : NULL;
    Value *wd_number = NULL; /* graph builder hook: weight_decay is 0 on the no_decay group */
    Entry *wd = gb ? sema_gb_decay_swap(gb, ov->scope, &wd_number) : NULL;
    (void)run_fn(s, fnv, loc, at, FR_UPDATE, at.file == 0, &pt->t);
    if (gb) {
        sema_gb_lr_restore(wd, wd_number);
        sema_gb_lr_restore(lr, lr_number);
        sema_gb_update_results(gb, loc, pp->name, at); /* graph builder hook: p and the states are the results */
    }
}

/* ---- schedules ---- */

Value *eval_schedule(Frame *f, const Node *value, const char *key, Value ***args, int *nargs) {
    Sema *s = f->s;
    const Node *callee_node = value->kind == N_CALL ? value->a : value;
    Value *fnv = eval_expr(f, callee_node);
    Call c;
    if (value->kind == N_CALL) build_call(f, value, &c);
    if (fnv->kind == V_UNKNOWN) return NULL;
    if (fnv->kind != V_FN || !fnv->node) {
        if (sema_error(s, value->span, "'%s' must be a schedule, a function whose first parameter is 'step', but it is %s", key,
                       value_describe(s->ar, fnv)))
            sema_hint(s, "for example: %s = lr.cosine(warmup = 700, total = 18865)", key);
        return NULL;
    }
    const Node *fn = fnv->node;
    const char *fname = sema_cstr(s, fn->name);
    if (fn->list.n == 0 || !fn->list.v[0] || !str_eqc(fn->list.v[0]->name, "step")) {
        if (sema_error(s, callee_node->span, "'%s' cannot be a schedule: its first parameter must be 'step'", fname))
            sema_note(s, decl_name_span(fn), "'%s' is declared here", fname);
        return NULL;
    }
    NodeInfo *inf = sema_info(s, fn);
    if (!inf->generic) eval_check_fn(s, fn);
    int np = fn->list.n;
    /* A second parameter named `batch` is supplied too: the global batch at the step (schedule.c
     * computes it from the batch ramp). */
    int loop = np > 1 && fn->list.v[1] && str_eqc(fn->list.v[1]->name, "batch") ? 2 : 1;
    Value **vals = arena_alloc(s->ar, sizeof(Value *) * (size_t)(np + 1));
    Span *at = arena_alloc(s->ar, sizeof(Span) * (size_t)(np + 1));
    int ok = value->kind == N_CALL ? bind_args(s, &c, &fn->list, loop, fname, fn, vals, at) : 1;
    /* The training loop passes the step (and the batch): runtime integers. */
    vals[0] = value_int(s->ar, dim_sym(s->ar, "step"), value->span);
    at[0] = value->span;
    if (loop == 2) {
        vals[1] = value_int(s->ar, dim_sym(s->ar, "batch"), value->span);
        at[1] = value->span;
    }
    /* The stdlib's lr.batch_scale: its rule is one of two names and its base a batch size. */
    int std_lr = fnv->scope && fnv->scope->module && fnv->scope->module->name && strcmp(fnv->scope->module->name, "lr") == 0;
    for (int i = loop; std_lr && i < np; i++) {
        const Node *p = fn->list.v[i];
        Value *v = vals[i];
        if (!p || !v || v->kind == V_UNKNOWN) continue;
        int64_t k;
        if (str_eqc(p->name, "rule") &&
            (v->kind != V_STRING || !v->s || (strcmp(v->s, "sqrt") != 0 && strcmp(v->s, "linear") != 0))) {
            if (sema_error(s, at[i], "'rule' of '%s' must be \"sqrt\" or \"linear\", but it is %s", fname,
                           value_describe(s->ar, v)))
                sema_hint(s, "\"sqrt\" for Adam-type optimizers, \"linear\" for SGD");
            ok = 0;
        } else if (str_eqc(p->name, "base") && fn->list.v[1] && str_eqc(fn->list.v[1]->name, "batch") &&
                   (v->kind != V_INT || !dim_const(v->dim, &k) || k < 1)) {
            if (sema_error(s, at[i], "'base' of '%s' must be a positive whole number of sequences, but it is %s", fname,
                           value_describe(s->ar, v)))
                sema_hint(s, "the global batch the base learning rate was tuned at, e.g. base = 64");
            ok = 0;
        }
    }
    Scope *loc = scope_new(s, fnv->scope, SC_LOCAL, fname, NULL);
    ok &= setup_params(s, fn, fname, vals, at, loc, value->span, 0);
    if (!ok) return NULL;
    *args = vals + loop;
    *nargs = np - loop;
    if (inf->broken) return fnv;
    Value *r = run_fn(s, fnv, loc, value->span, FR_FN, 0, NULL);
    if (!is_number(r)) {
        sema_error(s, value->span, "the schedule '%s' must return a number, but it returns %s", fname, value_describe(s->ar, r));
        return NULL;
    }
    return fnv;
}
