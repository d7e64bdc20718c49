/* build.c - the graph build driven from sema: sema_build_train_graph and sema_build_train (sema.h).
 *
 * Pipeline position: AST -> [sema, with build.c driving graph_build] -> graph IR. The checker
 * runs once over the whole program with a graph builder (graph_build.h) waiting for one train
 * block; settings.c starts it when it reaches that block, and the hooks in eval.c, eval_call.c
 * and settings.c hand it every tensor the walk makes. What needs the checker's own structures
 * is done here, so that the builder sees values only:
 *   - naming the parameters by their path from the model, walking its members (sub-models, lists
 *     of them by index): `h.3.attn.c_attn.weight`;
 *   - the update graph's optimizer: its name and how many state variables it declares;
 *   - while update runs, the optimizer's `lr` swapped for the graph's input "lr", and after it
 *     the values p and the state variables end with, looked up in update's scope.
 * Afterwards the builder's outcome becomes a TrainBuild with the block's checked settings. */
#include <string.h>

#include "sema_internal.h"

/* ---- the builder's sema-side work ---- */

GraphBuilder *sema_gb_for_train(Sema *s, const Node *train) {
    if (!s->gb_want || s->gb_train != train) return NULL;
    gb_start(s->gb_want, s->ar);
    return s->gb_want;
}

/* The walk over a model's instances that names their parameters (docs/language.md's paths: prefix
 * + member path, list items by index): from v (a model instance, or a list or tuple of them), each
 * instance met for the first time is handed to w->model (a sub-model reachable twice is named by
 * its first path), then its parameter entries to w->param and its sub-models walked, unless
 * w->model returned 1. frozen is inherited from an instance made with trainable = false. */
static void walk(SemaWalk *w, PtrMap *seen, Value *v, const char *prefix, int frozen, int depth) {
    Sema *s = w->s;
    if (!v || depth > SEMA_MAX_CALL_DEPTH + 8) return;
    if (v->kind == V_MODEL) {
        int fresh;
        if (!v->scope) return;
        ptrmap_slot(s->ar, seen, v->scope, &fresh);
        if (!fresh) return;
        frozen |= v->frozen;
        if (w->model && w->model(w, v, prefix, frozen)) return;
        Scope *sc = v->scope;
        for (int i = 0; i < sc->n; i++) {
            Entry *e = &sc->e[i];
            if (!e->v) continue;
            if (e->kind == ENT_PARAM) {
                if (w->param) w->param(w, e, arena_printf(s->ar, "%s%.*s", prefix, STR_ARG(e->name)), frozen);
            } else if (e->kind == ENT_SUB)
                walk(w, seen, e->v, arena_printf(s->ar, "%s%.*s.", prefix, STR_ARG(e->name)), frozen, depth + 1);
        }
    } else if (v->kind == V_LIST || v->kind == V_TUPLE) {
        for (int i = 0; i < v->n; i++) walk(w, seen, v->items[i], arena_printf(s->ar, "%s%d.", prefix, i), frozen, depth + 1);
    }
}

void sema_walk_models(SemaWalk *w, Value *model) {
    PtrMap seen;
    memset(&seen, 0, sizeof seen);
    walk(w, &seen, model, "", 0, 0);
}

static void name_param(SemaWalk *w, Entry *e, const char *name, int frozen) {
    (void)frozen;
    gb_name_param(w->ctx, e->v, name);
}

void sema_gb_name_params(Sema *s, GraphBuilder *gb, Value *model) {
    if (!gb || !model || model->kind != V_MODEL) return;
    SemaWalk w = {.s = s, .ctx = gb, .param = name_param};
    sema_walk_models(&w, model);
}

int sema_gb_update_begin(GraphBuilder *gb, Value *opt, Span at) {
    if (!gb || !opt || opt->kind != V_OPTIMIZER || !opt->node) return 0;
    int nstate = 0;
    for (int i = 0; i < opt->node->list2.n; i++) {
        const Node *st = opt->node->list2.v[i];
        if (st && st->kind == N_STATE) nstate += st->list.n;
    }
    return gb_update_begin(gb, opt->node->name, nstate, at);
}

Entry *sema_gb_lr_swap(GraphBuilder *gb, Scope *opt_scope, Value **saved) {
    Entry *e = gb && opt_scope ? scope_find(opt_scope, str_from("lr")) : NULL;
    if (!e || e->kind != ENT_CONST || !e->v) return NULL; /* no lr: no input */
    Value *in = gb_update_lr(gb, e->v, e->decl);
    if (!in) return NULL;
    *saved = e->v;
    e->v = in;
    return e;
}

void sema_gb_lr_restore(Entry *lr, Value *saved) {
    if (lr) lr->v = saved;
}

Entry *sema_gb_decay_swap(GraphBuilder *gb, Scope *opt_scope, Value **saved) {
    Entry *e = gb && opt_scope ? scope_find(opt_scope, str_from("weight_decay")) : NULL;
    if (!e || e->kind != ENT_CONST || !e->v) return NULL;
    Value *in = gb_update_decay(gb, e->v, e->decl);
    if (!in) return NULL;
    *saved = e->v;
    e->v = in;
    return e;
}

static Value *scope_value(void *scope, Str name) {
    Entry *e = scope_find(scope, name);
    return e ? e->v : NULL;
}

void sema_gb_update_results(GraphBuilder *gb, Scope *loc, Str p_name, Span at) {
    if (loc) gb_update_results(gb, scope_value, loc, p_name, at);
}

/* ---- the build ---- */

/* The train block of main named train_name (the first when NULL); NULL after reporting why not:
 * the program's own errors first (a missing import, ...), then the missing block. */
static const Node *find_train(Loader *ld, Module *main, const char *train_name, Arena *ar) {
    const Node *want = NULL;
    const char *names = "";
    int ntrain = 0;
    for (int i = 0; i < main->ast->list.n; i++) {
        const Node *d = main->ast->list.v[i];
        if (!d || d->kind != N_TRAIN) continue;
        names = arena_printf(ar, "%s%s%.*s", names, ntrain++ ? ", " : "", STR_ARG(d->name));
        if (!want && (!train_name || str_eqc(d->name, train_name))) want = d;
    }
    if (want) return want;
    if (sema_check(ld, main) != 0) return NULL;
    if (!ntrain) {
        diag_error_noloc("'%s' has no train block: there is no training step to build", main->path);
        diag_hint("add one: train NAME { model = ..., data = ..., loss = ..., optimizer = ..., steps = ... }");
        for (int i = 0; i < main->ast->list.n; i++) {
            const Node *d = main->ast->list.v[i];
            if (d && d->kind == N_SERVE)
                diag_note(sema_span_of(d, d->name),
                          "serve block '%.*s' is not compiled on its own: `PROG serve` serves the model of a train block, "
                          "with the settings of a serve block of that model",
                          STR_ARG(d->name));
        }
    } else {
        diag_error_noloc("'%s' has no train block named '%s'", main->path, train_name);
        diag_hint("its train block%s: %s", ntrain == 1 ? " is" : "s are", names);
    }
    return NULL;
}

/* Runs the checker with a builder waiting for the train block (align > 0: the update graph and
 * the batch-1 forward too). */
static TrainBuild *build_train(Loader *ld, Module *main, const char *train_name, int64_t align, int64_t pad_mult, int64_t pad_min,
                               Arena *ar) {
    if (!main || !main->ast) return NULL;
    const Node *want = find_train(ld, main, train_name, ar);
    if (!want) return NULL;
    if (align < 0 || (align & (align - 1)) != 0) INTERNAL("sema_build_train: alignment %lld", (long long)align);
    GraphBuilder *gb = gb_new(ar, arena_printf(ar, "train %.*s", STR_ARG(want->name)));
    if (align > 0) gb_want_update(gb, align, gb_new(ar, arena_printf(ar, "forward %.*s at batch 1", STR_ARG(want->name))));
    if (pad_mult > 1) gb_want_pad(gb, pad_mult, pad_min);
    SemaResult res;
    memset(&res, 0, sizeof res);
    if (main->state != 0) INTERNAL("sema_build_train_graph: module '%s' was checked already", main->name);
    sema_run_build(ld, main, &res, gb, want);
    GraphBuilt built;
    switch (gb_finish(gb, &built)) {
    case GB_BUILT: break;
    case GB_ERRORS: return NULL;
    case GB_FAILED: INTERNAL("graph builder: train block '%.*s' failed without an error", STR_ARG(want->name));
    case GB_NO_LOSS: INTERNAL("graph builder: train block '%.*s' was checked without building its graph", STR_ARG(want->name));
    case GB_NO_UPDATE:
        INTERNAL("graph builder: train block '%.*s' was checked without building its update or batch-1 graph",
                 STR_ARG(want->name));
    }
    TrainBuild *tb = arena_alloc(ar, sizeof(TrainBuild));
    tb->step = built.step;
    tb->update = built.update;
    tb->forward = built.forward;
    tb->forward_output = built.forward_output;
    for (int i = 0; i < res.trains.n; i++) {
        const TrainSettings *ts = res.trains.v[i];
        if (ts && ts->node == want) tb->config = &ts->cfg;
    }
    if (!tb->config) INTERNAL("graph builder: train block '%.*s' has no settings", STR_ARG(want->name));
    /* a bf16 program's update also writes the parameters' casts into their region (docs/memory.md,
     * "The parameter casts' region"); not with recompute or offload.activations, whose step programs
     * cast into the arena at every micro-batch (plan.h, PlanMemory.param_only) */
    if (tb->update && !tb->config->recompute && !tb->config->offload_activations) graph_update_add_cast(tb->update, tb->step);
    /* The executable serves the train block's model (its batch-1 forward); a serve block of the
     * same model declaration lends it its settings. */
    const Value *tmodel = NULL;
    for (int i = 0; i < res.trains.n; i++) {
        const TrainSettings *ts = res.trains.v[i];
        if (ts && ts->node == want) tmodel = ts->model;
    }
    for (int i = 0; i < res.serves.n; i++) {
        const ServeSettings *ss = res.serves.v[i];
        if (!ss || ss->module != main) continue;
        if (tmodel && ss->model && ss->model->kind == V_MODEL && tmodel->kind == V_MODEL && ss->model->node == tmodel->node) {
            if (!tb->serve) tb->serve = &ss->cfg;
        } else if (!tb->serve_other) {
            tb->serve_other = ss->cfg.name;
        }
    }
    return tb;
}

Graph *sema_build_train_graph(Loader *ld, Module *main, const char *train_name, Arena *ar) {
    return sema_build_train_graph_padded(ld, main, train_name, 1, 0, ar);
}

Graph *sema_build_train_graph_padded(Loader *ld, Module *main, const char *train_name, int64_t pad_mult, int64_t pad_min,
                                     Arena *ar) {
    TrainBuild *tb = build_train(ld, main, train_name, 0, pad_mult, pad_min, ar);
    return tb ? tb->step : NULL;
}

TrainBuild *sema_build_train(Loader *ld, Module *main, const char *train_name, int64_t align, Arena *ar) {
    if (align <= 0) INTERNAL("sema_build_train: alignment %lld", (long long)align);
    return build_train(ld, main, train_name, align, 1, 0, ar);
}

TrainBuild *sema_build_train_padded(Loader *ld, Module *main, const char *train_name, int64_t align, int64_t pad_mult,
                                    int64_t pad_min, Arena *ar) {
    if (align <= 0 || pad_mult < 1)
        INTERNAL("sema_build_train: alignment %lld, padding %lld", (long long)align, (long long)pad_mult);
    return build_train(ld, main, train_name, align, pad_mult, pad_min, ar);
}
