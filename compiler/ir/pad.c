/* pad.c - aligned GEMM shapes: a parameter's leading dimension padded in storage (graph_pad.h).
 *
 * Pipeline position: sema's graph builder (graph_build.c) calls graph_pad_params on the step graph
 * once its loss is recorded and before the update graph lays the parameters out, and on the batch-1
 * forward at the end; autodiff, fuse and plan then see the padded shapes (docs/cuda.md, "Aligned
 * GEMM shapes").
 *
 * Why: cuBLAS runs a GEMM whose n is 50257 (GPT-2's vocabulary) 5-7x slower than the same product
 * at 50304 (shared/perf/h100-2026-11-25.md). The program's shapes stay what it says; only the
 * storage of a parameter widens. A parameter [n0, ...] whose rows reach a GEMM as an output
 * dimension becomes [np, ...], np = n0 rounded up to the multiple, and its extra rows are zero. Only
 * the leading axis is padded, so the program's tensor is the first n0 x ... elements of the padded
 * one: the runtime (RtParam's shape and numel stay the program's) loads, saves, initialises and
 * checkpoints exactly those elements and never sees the tail, which the plan leaves zero like the
 * padding between parameters.
 *
 * The rewrite keeps every value the program computes: a padded value flows on through casts,
 * transposes, a matmul that keeps the padded axis as its m or n (the product's padded rows or
 * columns are zero), and a gather's table (an index below n0 never reads a padded row); every other
 * use reads `slice(x, axis, 0, n0)`, the value as the program wrote it. The slice's backward pads
 * the gradient with zeros, so the padded rows' gradient is exactly zero and an optimizer whose
 * update of (0, 0) is 0 (every stdlib optimizer: weight decay of 0 is 0) keeps them zero. */
#include <string.h>

#include "graph.h"
#include "graph_pad.h"

/* The axis of x's padding after op n, which takes the padded x as input `pos`; -1 when n does not
 * carry the padding (its input is then the slice). `other` is the padded axis of n's other matmul
 * input (-1 when none). */
static int pad_carry(const Graph *g, const GNode *n, int pos, int ax, int other) {
    const GNode *x = g->node[n->in[pos]];
    switch (n->op) {
    case G_CAST: return ax;
    case G_TRANSPOSE: return ax == n->iattr[0] ? (int)n->iattr[1] : ax == n->iattr[1] ? (int)n->iattr[0] : ax;
    case G_MATMUL:
        if (x->rank < 2) return -1;
        if (pos == 0 && ax == x->rank - 2) return n->rank - 2;
        if (pos == 1 && ax == x->rank - 1 && other < 0) return n->rank - 1;
        return -1;
    default: return -1;
    }
}

/* Params to pad, decided on the step graph: candidates whose padded rows reach a matmul's m or n
 * through casts, transposes and matmuls. want[id] = 1 for each such G_PARAM. */
static void pad_decide(const Graph *g, int64_t mult, int64_t min_rows, unsigned char *want) {
    int *ax = arena_alloc(g->ar, sizeof(int) * (size_t)(g->n + 1));
    int *org = arena_alloc(g->ar, sizeof(int) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        ax[id] = org[id] = -1;
        if (n->op == G_PARAM) {
            if (n->rank >= 2 && n->shape[0] % mult != 0 && n->shape[0] >= min_rows) ax[id] = 0, org[id] = id;
            continue;
        }
        if (n->op != G_CAST && n->op != G_TRANSPOSE && n->op != G_MATMUL) continue;
        int a0 = ax[n->in[0]], a1 = n->nin > 1 ? ax[n->in[1]] : -1;
        int c0 = a0 >= 0 ? pad_carry(g, n, 0, a0, -1) : -1;
        int c1 = a1 >= 0 ? pad_carry(g, n, 1, a1, c0) : -1;
        if (c0 >= 0) ax[id] = c0, org[id] = org[n->in[0]];
        else if (c1 >= 0) ax[id] = c1, org[id] = org[n->in[1]];
        if (n->op == G_MATMUL && ax[id] >= 0) want[org[id]] = 1;
    }
}

typedef struct PadCtx {
    Graph *ng;  /* the rebuilt graph */
    int *map;   /* old id -> new id */
    int *ax;    /* old id -> the padded axis of its new node, -1 when unpadded */
    int *slice; /* old id -> its slice in the new graph (the program's value), -1 until made */
    const Graph *g;
} PadCtx;

/* The program's value of old node x in the new graph: its node, or a slice of its padded one. */
static int pad_value(PadCtx *c, int x) {
    if (c->ax[x] < 0) return c->map[x];
    if (c->slice[x] >= 0) return c->slice[x];
    const GNode *o = c->g->node[x];
    int in = c->map[x];
    int id = graph_add(c->ng, G_SLICE, o->dt, o->rank, o->shape, 1, &in, o->src);
    GNode *s = graph_node(c->ng, id);
    s->iattr[0] = c->ax[x];
    s->iattr[1] = 0;
    s->iattr[2] = o->shape[c->ax[x]];
    return c->slice[x] = id;
}

int graph_pad_params(Graph *g, int64_t mult, int64_t min_rows, const Graph *like, int *keep) {
    if (mult <= 1 || g->update || g->grads) return 0;
    unsigned char *want = arena_alloc(g->ar, (size_t)(g->n + 1));
    int64_t *rows = arena_alloc(g->ar, sizeof(int64_t) * (size_t)(g->n + 1)); /* the padded rows */
    int count = 0;
    if (like) { /* the batch-1 forward: the step's parameters, padded as there (they share storage) */
        for (int i = 0; i < g->nparams; i++) {
            const GNode *p = g->node[g->params[i]];
            for (int j = 0; j < like->nparams; j++) {
                const GNode *q = like->node[like->params[j]];
                if (q->iattr[2] > 0 && p->name && q->name && strcmp(p->name, q->name) == 0 && q->iattr[2] == p->shape[0]) {
                    want[p->id] = 1;
                    rows[p->id] = q->shape[0];
                }
            }
        }
    } else {
        pad_decide(g, mult, min_rows, want);
        for (int id = 0; id < g->n; id++)
            if (want[id]) rows[id] = (g->node[id]->shape[0] + mult - 1) / mult * mult;
    }
    for (int id = 0; id < g->n; id++) count += want[id];
    if (!count) return 0;

    PadCtx c = {graph_new(g->ar), NULL, NULL, NULL, g};
    c.ng->name = g->name;
    c.map = arena_alloc(g->ar, sizeof(int) * (size_t)(g->n + 1));
    c.ax = arena_alloc(g->ar, sizeof(int) * (size_t)(g->n + 1));
    c.slice = arena_alloc(g->ar, sizeof(int) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        int64_t shape[GRAPH_MAX_RANK];
        memcpy(shape, n->shape, sizeof shape);
        int in[GRAPH_MAX_IN] = {0};
        int ax = -1;
        c.ax[id] = -1;
        c.slice[id] = -1;
        if (n->op == G_PARAM && want[id]) {
            ax = 0;
            shape[0] = rows[id];
        } else {
            int c0 = -1;
            for (int i = 0; i < n->nin; i++) {
                int x = n->in[i], a = c.ax[x];
                int carry = a >= 0 ? pad_carry(g, n, i, a, c0) : -1;
                if (a >= 0 && n->op == G_GATHER && i == 0 && a == 0) { /* rows picked by index < n0 */
                    in[i] = c.map[x];
                } else if (carry >= 0 && ax < 0) {
                    in[i] = c.map[x];
                    ax = carry;
                    shape[ax] = graph_node(c.ng, c.map[x])->shape[a];
                    if (i == 0) c0 = carry;
                } else {
                    in[i] = pad_value(&c, x);
                }
            }
        }
        int nid = graph_add(c.ng, n->op, n->dt, n->rank, shape, n->nin, in, n->src);
        GNode *nn = graph_node(c.ng, nid);
        memcpy(nn->iattr, n->iattr, sizeof nn->iattr);
        memcpy(nn->fattr, n->fattr, sizeof nn->fattr);
        nn->name = n->name;
        if (n->op == G_PARAM && want[id]) nn->iattr[2] = n->shape[0];
        c.map[id] = nid;
        c.ax[id] = ax;
    }
    /* The graph keeps its identity (the builder and TrainBuild hold it): its nodes are replaced. */
    int *params = arena_alloc(g->ar, sizeof(int) * (size_t)(g->nparams + 1));
    for (int i = 0; i < g->nparams; i++) params[i] = c.map[g->params[i]];
    if (g->loss >= 0) g->loss = pad_value(&c, g->loss);
    for (int k = 0; k < g->nstats; k++) {
        g->stat_in[k] = pad_value(&c, g->stat_in[k]);
        g->stat_expr[k] = pad_value(&c, g->stat_expr[k]);
    }
    if (keep && *keep >= 0) *keep = pad_value(&c, *keep);
    g->node = c.ng->node;
    g->n = c.ng->n;
    g->cap = c.ng->cap;
    g->params = params;
    return count;
}
