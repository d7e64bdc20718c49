/* graph_build_update.c - the update graph of a train block (sema_build_train; graph_build.h): the
 * optimizer's update run with p, g and the state variables as f32[n] inputs over the flat
 * parameter layout (the parameters ordered by group: decayed, not decayed, frozen), t and lr as
 * f32[] inputs; a scalar result computed from a per-element value is lifted to f32[n] (a value per
 * parameter, held by each of its elements), and norm of a per-element value is G_SEG_NORM.
 * Anything else is a located user error ("... is not supported yet"), never an assertion.
 *
 * Pipeline position: sema (settings.c runs the optimizer's update while this builds) -> [the
 * update graph] -> fusion; graph_build_internal.h is what it shares with graph_build.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph_build_internal.h"
#include "graph_pad.h"

/* ---- the update graph ---- */

int gb_updating(const GraphBuilder *gb) { return gb && gb->updating; }

/* A parameter's group, the order of the layout: 0 decayed, 1 not decayed, 2 frozen. */
static int gb_group_of(const GNode *p) { return p->iattr[1] & GP_FROZEN ? 2 : p->iattr[1] & GP_NO_DECAY ? 1 : 0; }

/* Orders the step graph's parameters by group (stable: declaration order within a group), and
 * the batch-1 forward's alike, since the plan gives both the same parameter slots by position. */
static void gb_group_params(GraphBuilder *gb, Graph *step) {
    int n = step->nparams, k = 0;
    int *order = arena_alloc(step->ar, sizeof(int) * (size_t)(n + 1));
    for (int grp = 0; grp < 3; grp++)
        for (int i = 0; i < n; i++)
            if (gb_group_of(gb_node(gb, step->params[i])) == grp) order[k++] = step->params[i];
    step->params = order;
    Graph *fwd = gb->forward ? gb->forward->g : NULL;
    if (!fwd || fwd->nparams != n) return; /* plan_schedules reports a mismatch */
    int *forder = arena_alloc(fwd->ar, sizeof(int) * (size_t)(n + 1));
    unsigned char *used = arena_alloc(fwd->ar, (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        const char *name = gb_node(gb, order[i])->name;
        forder[i] = -1;
        for (int j = 0; j < n && forder[i] < 0; j++) {
            const GNode *q = graph_node(fwd, fwd->params[j]);
            if (!used[j] && name && q->name && strcmp(q->name, name) == 0) {
                forder[i] = fwd->params[j];
                used[j] = 1;
            }
        }
        if (forder[i] < 0) return; /* names differ: plan_schedules reports it */
    }
    fwd->params = forder;
}

/* bool[n] of the update graph: the element's index is below end (a group's range). */
static int gb_index_below(GraphBuilder *gb, int64_t end, Span at) {
    int64_t n = gb->g->update->n;
    int iota = gb_add(gb, G_ARANGE, DT_I32, 1, &n, 0, NULL, at);
    int in[2] = {iota, gb_const(gb, DT_I32, (double)end, at)};
    return gb_add(gb, G_LT, DT_BOOL, 1, &n, 2, in, at);
}

int gb_update_begin(GraphBuilder *gb, Str optimizer, int nstate, Span at) {
    if (!gb || gb->failed || !gb->done || gb->align <= 0 || gb->upd) return 0;
    Graph *step = gb->g;
    /* The step is complete and nothing refers to its node ids any more: pad before the layout, which
     * gives each parameter its padded length (the runtime's RtParam keeps the program's). */
    graph_pad_params(step, gb->pad_mult, gb->pad_min, NULL, NULL);
    gb->updating = 1; /* from here on errors say "building the optimizer graph" */
    if (step->nparams == 0) {
        gb_fail(gb, at, "the model has no parameters, so the optimizer has nothing to update");
        return 0;
    }
    Arena *ar = step->ar;
    GraphUpdate *u = arena_alloc(ar, sizeof(GraphUpdate));
    int64_t *off = arena_alloc(ar, sizeof(int64_t) * (size_t)step->nparams);
    int64_t *len = arena_alloc(ar, sizeof(int64_t) * (size_t)step->nparams);
    const char **names = arena_alloc(ar, sizeof(char *) * (size_t)step->nparams);
    int64_t end = 0, a = gb->align;
    int64_t group_end[3] = {0, 0, 0};
    gb_group_params(gb, step);
    for (int i = 0; i < step->nparams; i++) {
        const GNode *p = gb_node(gb, step->params[i]);
        if (p->dt != DT_F32) {
            gb_fail(gb, p->src,
                    "parameter '%s' is %s, which is not supported yet (the optimizer's regions hold f32; declare it "
                    "f32, and precision = bf16 for bf16 compute)",
                    p->name ? p->name : "?", dtype_name(p->dt));
            return 0;
        }
        int64_t start = (end + a - 1) / a * a;
        if (graph_numel(p) > GB_MAX_NUMEL - start - a) {
            gb_fail(gb, at, "the parameters hold more than 2^62 values");
            return 0;
        }
        off[i] = start;
        len[i] = graph_numel(p);
        names[i] = p->name;
        end = start + len[i];
        for (int k = gb_group_of(p); k < 3; k++) group_end[k] = (end + a - 1) / a * a;
    }
    u->optimizer = arena_printf(ar, "%.*s", STR_ARG(optimizer));
    u->n_params = (end + a - 1) / a * a;
    u->n = group_end[1]; /* the frozen parameters, laid out last, are not the update's */
    u->decay_end = group_end[0];
    if (u->n == 0) {
        gb_fail(gb, at, "every parameter is frozen, so the optimizer has nothing to update");
        return 0;
    }
    if (u->decay_end < u->n && u->n > INT32_MAX) {
        gb_fail(gb, at, "parameter groups (freeze, no_decay) over more than 2^31 values are not supported yet");
        return 0;
    }
    u->nsegs = step->nparams;
    u->seg_off = off;
    u->seg_len = len;
    u->seg_name = names;
    u->p_in = u->g_in = u->t_in = u->p_out = u->cast_out = -1;
    u->lr_in = -1;
    int cap = nstate < 0 ? 0 : nstate; /* room for every state variable the optimizer declares */
    gb->statecap = cap;
    gb->state_str = arena_alloc(ar, sizeof(Str) * (size_t)(cap + 1));
    u->state_name = arena_alloc(ar, sizeof(char *) * (size_t)(cap + 1));
    u->state_init = arena_alloc(ar, sizeof(double) * (size_t)(cap + 1));
    u->state_in = arena_alloc(ar, sizeof(int) * (size_t)(cap + 1));
    u->state_out = arena_alloc(ar, sizeof(int) * (size_t)(cap + 1));
    Graph *ug = graph_new(ar);
    ug->name = arena_printf(ar, "update %s", u->optimizer);
    ug->update = u;
    gb->step = step;
    gb->upd = ug;
    gb->g = ug;
    return 1;
}

/* A fresh f32 input of the update graph: f32[n], or f32[] when scalar. */
static Value *gb_update_input(GraphBuilder *gb, const char *name, int scalar, Span at) {
    const Dim *dims[1] = {dim_int(gb->ar, gb->g->update->n)};
    Value *v = value_tensor(gb->ar, DT_F32, scalar ? 0 : 1, dims, at);
    int id = gb_result(gb, v, G_INPUT, 0, NULL, at);
    if (id < 0) return NULL;
    gb_node(gb, id)->name = name;
    return v;
}

Value *gb_update_leaf(GraphBuilder *gb, const char *role, Str name, const Value *init, Span at) {
    if (!gb || gb->failed || !gb->updating || gb->update_done) return NULL;
    GraphUpdate *u = gb->g->update;
    Value *v;
    if (strcmp(role, "state") == 0) {
        double x = 0;
        if (init && !value_number(init, &x)) {
            gb_fail(gb, init->origin, "state '%.*s' starting from %s is not supported yet (a number is)", STR_ARG(name),
                    value_describe(gb->ar, init));
            return NULL;
        }
        if (u->nstate >= gb->statecap) INTERNAL("graph builder: more state variables than the optimizer declares");
        const char *sname = arena_printf(gb->g->ar, "%.*s", STR_ARG(name));
        v = gb_update_input(gb, arena_printf(gb->g->ar, "state.%s", sname), 0, at);
        if (!v) return NULL;
        int k = u->nstate++;
        gb->state_str[k] = name;
        u->state_name[k] = sname;
        u->state_init[k] = x;
        u->state_in[k] = u->state_out[k] = v->graph_id - 1;
        return v;
    }
    int t = strcmp(role, "t") == 0;
    v = gb_update_input(gb, t ? "t" : strcmp(role, "p") == 0 ? "p" : "g", t, at);
    if (!v) return NULL;
    if (t) u->t_in = v->graph_id - 1;
    else if (strcmp(role, "p") == 0) u->p_in = u->p_out = v->graph_id - 1;
    else u->g_in = v->graph_id - 1;
    return v;
}

Value *gb_update_lr(GraphBuilder *gb, const Value *lr, Span decl) {
    if (!gb || gb->failed || !gb->updating || gb->update_done || !lr) return NULL;
    double x;
    if (!value_number(lr, &x)) {
        if (lr->kind != V_UNKNOWN)
            gb_fail(gb, decl,
                    "the hyper-parameter 'lr' is %s, but the learning-rate schedule scales a number; this is not "
                    "supported yet",
                    value_describe(gb->ar, lr));
        else gb->failed = 1;
        return NULL;
    }
    if (!gb->lr_value) {
        gb->lr_value = gb_update_input(gb, "lr", 1, decl);
        if (!gb->lr_value) return NULL;
        gb->g->update->lr_in = gb->lr_value->graph_id - 1;
        gb->g->update->lr_base = x;
    }
    return gb->lr_value;
}

Value *gb_update_decay(GraphBuilder *gb, const Value *wd, Span decl) {
    if (!gb || gb->failed || !gb->updating || gb->update_done || !wd) return NULL;
    GraphUpdate *u = gb->g->update;
    if (u->decay_end >= u->n) return NULL; /* no parameter is trained undecayed: nothing to swap */
    double x;
    if (!value_number(wd, &x)) {
        if (wd->kind != V_UNKNOWN)
            gb_fail(gb, decl, "the hyper-parameter 'weight_decay' is %s, but no_decay needs a number",
                    value_describe(gb->ar, wd));
        else gb->failed = 1;
        return NULL;
    }
    const Dim *dims[1] = {dim_int(gb->ar, u->n)};
    Value *v = value_tensor(gb->ar, DT_F32, 1, dims, decl);
    int in[3] = {gb_index_below(gb, u->decay_end, decl), gb_const(gb, DT_F32, x, decl), gb_const(gb, DT_F32, 0.0, decl)};
    return gb_result(gb, v, G_WHERE, 3, in, decl) >= 0 ? v : NULL;
}

/* The node of the value a result ended with; -1 after a failure. */
static int gb_update_out(GraphBuilder *gb, GbLookup lookup, void *ctx, Str name, const char *what, Span at) {
    Value *v = lookup(ctx, name);
    if (!v || v->kind == V_UNKNOWN) { /* an error the checker reported */
        gb->failed = 1;
        return -1;
    }
    if (v->kind != V_TENSOR || v->graph_id <= 0 || v->graph_id > gb->g->n) {
        gb_fail(gb, at, "following the value %s ends with (%s) is not supported yet", what, value_describe(gb->ar, v));
        return -1;
    }
    const GNode *n = gb_node(gb, v->graph_id - 1);
    if (n->rank != 1 || n->dt != DT_F32) {
        gb_fail(gb, at, "%s ends as %s per parameter, which is not supported yet (f32 per element is)", what, dtype_name(n->dt));
        return -1;
    }
    return n->id;
}

void gb_update_results(GraphBuilder *gb, GbLookup lookup, void *ctx, Str p_name, Span at) {
    if (!gb || gb->failed || !gb->updating || gb->update_done || !lookup) return;
    GraphUpdate *u = gb->g->update;
    int p = gb_update_out(gb, lookup, ctx, p_name, arena_printf(gb->ar, "'%.*s'", STR_ARG(p_name)), at);
    if (p < 0) return;
    int *outs = u->state_out;
    for (int k = 0; k < u->nstate; k++) {
        int id = gb_update_out(gb, lookup, ctx, gb->state_str[k], arena_printf(gb->ar, "state '%s'", u->state_name[k]), at);
        if (id < 0) return;
        outs[k] = id;
    }
    u->p_out = p;
    if (u->p_in < 0 || u->g_in < 0 || u->t_in < 0) INTERNAL("graph builder: the update graph lacks p, g or t");
    gb->update_done = 1;
}

int graph_update_add_cast(Graph *update, const Graph *step) {
    GraphUpdate *u = update ? update->update : NULL;
    if (!u || u->p_out < 0 || u->cast_out >= 0) return 0;
    DType dt = DT_F32;
    for (int id = 0; id < step->n && dt == DT_F32; id++) { /* precision = bf16: the parameters read through casts */
        const GNode *n = graph_node(step, id);
        if (n->op == G_CAST && (n->dt == DT_BF16 || n->dt == DT_F16) && graph_node(step, n->in[0])->op == G_PARAM) dt = n->dt;
    }
    if (dt == DT_F32) return 0;
    const GNode *p = graph_node(update, u->p_out);
    int in = u->p_out;
    u->cast_out = graph_add(update, G_CAST, dt, 1, &u->n, 1, &in, p->src);
    return 1;
}

void gb_update_end(GraphBuilder *gb) {
    if (!gb || !gb->updating) return;
    gb->g = gb->step ? gb->step : gb->g;
    gb->updating = 0;
}

/* ---- the builder's life ---- */

GraphBuilder *gb_new(Arena *ar, const char *name) {
    GraphBuilder *gb = arena_alloc(ar, sizeof(GraphBuilder));
    gb->g = graph_new(ar);
    gb->g->name = name;
    gb->output = -1;
    gb->errors_before = diag_error_count();
    return gb;
}

void gb_want_update(GraphBuilder *gb, int64_t align, GraphBuilder *fwd) {
    if (align <= 0 || (align & (align - 1)) != 0) INTERNAL("graph builder: alignment %lld", (long long)align);
    gb->align = align;
    gb->forward = fwd;
    if (fwd) fwd->is_forward = 1;
}

void gb_want_pad(GraphBuilder *gb, int64_t mult, int64_t min_rows) {
    gb->pad_mult = mult;
    gb->pad_min = min_rows;
}

void gb_start(GraphBuilder *gb, Arena *values) { gb->ar = values; }

GbOutcome gb_finish(GraphBuilder *gb, GraphBuilt *out) {
    gb->ar = NULL; /* the checker's values are no longer the builder's to make */
    if (diag_error_count() > gb->errors_before) return GB_ERRORS;
    if (gb->failed) return GB_FAILED;
    if (!gb->done) return GB_NO_LOSS;
    if (gb->align > 0 && (!gb->update_done || !gb->forward || !gb->forward->done)) return GB_NO_UPDATE;
    out->step = gb->step ? gb->step : gb->g;
    if (gb->align == 0 && gb->pad_mult > 1) /* the step alone (ir, grad): padded as with the update */
        graph_pad_params(out->step, gb->pad_mult, gb->pad_min, NULL, NULL);
    if (gb->forward && gb->pad_mult > 1) /* its parameters share the step's storage: padded alike */
        graph_pad_params(gb->forward->g, gb->pad_mult, gb->pad_min, out->step, &gb->forward->output);
    out->update = gb->upd;
    out->forward = gb->forward ? gb->forward->g : NULL;
    out->forward_output = gb->forward ? gb->forward->output : -1;
    return GB_BUILT;
}
