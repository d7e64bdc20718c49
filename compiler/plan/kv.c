/* kv.c - the forward over new tokens with a paged KV cache (issue 17): the batch-1 forward graph
 * (T = seq positions 0 .. T-1) rewritten into a graph over N rows of new tokens, each at its own
 * position of its own sequence, whose attention ops read and write the paged pool (G_KV_ATTENTION,
 * fuse_kv.h). plan_schedules fuses it as the chunk phase (forward_chunk).
 *
 * Pipeline position: plan (schedules.c calls kv_chunk_graph on the logits graph) -> fuse ->
 * host (forward_chunk). docs/serve.md, "The KV cache in the generated code".
 *
 * The rewrite follows the token axis. Every node is one of
 *   - CONST: depends on neither the tokens nor their positions (parameters, constants, what is
 *     computed from them alone);
 *   - TOK(a): its axis a runs over the tokens, and slice i along it depends only on token i (its
 *     id and position): the embedding lookup, and every position-wise op after it;
 *   - POS(a): independent of the token ids but indexed by position along a: a position table
 *     sliced [0, T) along its first axis (wpe[0:T]) or arange(T).
 * A TOK or POS node keeps its shape with the token axis resized from T to N. A POS slice becomes a
 * gather of the table's rows at each row's position (read from the metadata, fuse_kv.h); an
 * attention over TOK q, k, v (token axis 2, causal) becomes a G_KV_ATTENTION. Everything else
 * must not mix positions: a reduction, softmax or norm over the token axis, a matmul that
 * contracts it or multiplies two token-dependent values, a reshape that merges it with another
 * axis, a slice or concat along it, or a constant of T rows combined row by row with the tokens,
 * would make row i depend on other rows, which the cached forward does not have. Such a program
 * cannot use the cache: kv_chunk_graph says why and where, and the program keeps the recompute
 * path (forward_logits). rope gets each row's position as a second input (its angle is otherwise
 * the row's index). A constant of T rows met row by row with the tokens (wpe itself, when wpe[0:T]
 * is the whole table) is a position table too; a G_CONST of that shape is one number everywhere. */
#include <string.h>

#include "diag.h"
#include "fuse_kv.h"
#include "kv.h"

enum { KS_CONST, KS_TOK, KS_POS };

typedef struct KvState {
    unsigned char kind;
    signed char axis;
} KvState;

typedef struct KvCtx {
    const Graph *g;
    Graph *ng;
    const KvConfig *cfg;
    int64_t T, N;
    int *map;
    KvState *st;
    int kv_in;   /* the "kv" input */
    int pos;     /* i32[N]: each row's position (-1 until needed) */
    int layer;   /* attention ops so far */
    int nlayers; /* attention ops in the graph */
    const char *why;
    Span at;
    Arena *ar;
    int64_t heads_kv, head_dim; /* of the first attention (every layer must agree) */
    /* kv_window_local: only whether a row's positions stay apart, for sequence-length buckets
     * (docs/runtime.md, "Sequence-length buckets"): data.pos is an input of the tokens, attention
     * must take pos, and positions by the row's index (arange, a table sliced [0, T)) are refused,
     * since they do not restart at each window */
    int windows;
} KvCtx;

static int kv_refuse(KvCtx *c, const GNode *n, const char *why) {
    if (!c->why) {
        c->why = why;
        c->at = n->src;
    }
    return -1;
}

/* n copied into the new graph with its token axis (or none: -1) resized to N and its inputs
 * mapped; attributes and name kept. */
static int kv_copy(KvCtx *c, const GNode *n, int axis) {
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n->shape, sizeof shape);
    if (axis >= 0) shape[axis] = c->N;
    int in[GRAPH_MAX_IN];
    for (int i = 0; i < n->nin; i++) in[i] = c->map[n->in[i]];
    int id = graph_add(c->ng, n->op, n->dt, n->rank, shape, n->nin, in, n->src);
    GNode *m = graph_node(c->ng, id);
    memcpy(m->iattr, n->iattr, sizeof m->iattr);
    memcpy(m->fattr, n->fattr, sizeof m->fattr);
    m->name = n->name;
    return id;
}

/* Each row's position: the metadata's first N elements. */
static int kv_positions(KvCtx *c) {
    if (c->pos >= 0) return c->pos;
    int64_t n = c->N;
    int id = graph_add(c->ng, G_SLICE, DT_I32, 1, &n, 1, &c->kv_in, span_none());
    GNode *s = graph_node(c->ng, id);
    s->iattr[0] = 0, s->iattr[1] = KV_META_POS * c->N, s->iattr[2] = KV_META_POS * c->N + c->N;
    return c->pos = id;
}

/* The rows of x (its new-graph node nx) at each row's position: [N, ...]. */
static int kv_gather_rows(KvCtx *c, const GNode *x, int nx) {
    int in[2] = {nx, kv_positions(c)};
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = c->N;
    return graph_add(c->ng, G_GATHER, x->dt, x->rank, shape, 2, in, x->src);
}

/* Elementwise ops (and broadcast): the inputs' token axes, right-aligned, must agree; a constant
 * input of T rows along the token axis is a position table (kv_gather_rows). */
static int kv_pointwise(KvCtx *c, const GNode *n) {
    int axis = -1, kind = KS_CONST;
    for (int i = 0; i < n->nin; i++) {
        KvState s = c->st[n->in[i]];
        if (s.kind == KS_CONST) continue;
        int a = s.axis + (n->rank - graph_node(c->g, n->in[i])->rank);
        if (axis >= 0 && a != axis) return kv_refuse(c, n, "it combines values whose token axes differ, which mixes positions");
        axis = a;
        if (s.kind == KS_TOK || kind == KS_CONST) kind = s.kind;
    }
    int in[GRAPH_MAX_IN];
    for (int i = 0; i < n->nin; i++) in[i] = c->map[n->in[i]];
    if (axis >= 0)
        for (int i = 0; i < n->nin; i++) {
            const GNode *x = graph_node(c->g, n->in[i]);
            int d = axis - (n->rank - x->rank);
            if (c->st[n->in[i]].kind != KS_CONST || d < 0 || x->shape[d] != c->T || c->T == 1) continue;
            if (x->op == G_CONST) { /* one number everywhere (zeros(B, T, d)): the same over N rows */
                in[i] = kv_copy(c, x, d);
                continue;
            }
            /* a constant of T rows met row by row: row t is position t's (wpe itself when its slice
             * [0, T) is the whole table), so the cached forward gathers the rows at the positions */
            if (c->windows)
                return kv_refuse(c, n,
                                 "it combines the tokens row by row with a table indexed by the row's position, which "
                                 "does not restart at each window; index it by data.pos");
            if (d != 0)
                return kv_refuse(c, n,
                                 "it combines the tokens row by row with a constant indexed by position along an axis "
                                 "other than its first");
            in[i] = kv_gather_rows(c, x, in[i]);
        }
    c->st[n->id] = (KvState){(unsigned char)kind, (signed char)axis};
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n->shape, sizeof shape);
    if (axis >= 0) shape[axis] = c->N;
    int id = graph_add(c->ng, n->op, n->dt, n->rank, shape, n->nin, in, n->src);
    GNode *m = graph_node(c->ng, id);
    memcpy(m->iattr, n->iattr, sizeof m->iattr);
    memcpy(m->fattr, n->fattr, sizeof m->fattr);
    return id;
}

/* The axis of out's shape that holds in's token axis a through a reshape, or -1. */
static int kv_reshape_axis(const GNode *in, int a, const GNode *out) {
    int64_t before = 1;
    for (int d = 0; d < a; d++) before *= in->shape[d];
    int64_t p = 1;
    for (int d = 0; d < out->rank; d++) {
        if (p == before && out->shape[d] == in->shape[a]) return d;
        p *= out->shape[d];
        if (p > before) break;
    }
    return -1;
}

static int kv_node(KvCtx *c, const GNode *n) {
    const GNode *x = n->nin ? graph_node(c->g, n->in[0]) : NULL;
    KvState s0 = n->nin ? c->st[n->in[0]] : (KvState){KS_CONST, -1};
    int any = 0;
    for (int i = 0; i < n->nin; i++) any |= c->st[n->in[i]].kind != KS_CONST;
    switch (n->op) {
    case G_INPUT:
        if (c->windows && n->name && strcmp(n->name, "data.pos") == 0 && n->rank == 2 && n->shape[1] == c->T) {
            c->st[n->id] = (KvState){KS_TOK, 1};
            return kv_copy(c, n, 1);
        }
        if (!n->name || strcmp(n->name, "data.x") != 0 || n->rank != 2 || n->shape[1] != c->T || n->dt != DT_I32)
            return kv_refuse(c, n, "the forward reads an input other than the token ids data.x");
        c->st[n->id] = (KvState){KS_TOK, 1};
        return kv_copy(c, n, 1);
    case G_ARANGE:
        if (n->shape[0] != c->T) break;
        if (c->windows)
            return kv_refuse(c, n, "it numbers the row's positions by index, which do not restart at each window; use data.pos");
        c->st[n->id] = (KvState){KS_POS, 0};
        return kv_positions(c);
    default: break;
    }
    if (!any) return kv_copy(c, n, -1); /* CONST */
    if (n->op >= G_NEG && n->op <= G_WHERE && n->op != G_DROPOUT) return kv_pointwise(c, n);
    switch (n->op) {
    case G_DROPOUT:
    case G_BROADCAST: return kv_pointwise(c, n);
    case G_SLICE:
        if (n->iattr[0] == s0.axis) return kv_refuse(c, n, "it slices the token axis, which mixes positions");
        c->st[n->id] = s0;
        return kv_copy(c, n, s0.axis);
    case G_TRANSPOSE: {
        int a = s0.axis == n->iattr[0] ? (int)n->iattr[1] : s0.axis == n->iattr[1] ? (int)n->iattr[0] : s0.axis;
        c->st[n->id] = (KvState){s0.kind, (signed char)a};
        return kv_copy(c, n, a);
    }
    case G_RESHAPE: {
        int a = kv_reshape_axis(x, s0.axis, n);
        if (a < 0) return kv_refuse(c, n, "it reshapes the token axis together with another axis, which mixes positions");
        c->st[n->id] = (KvState){s0.kind, (signed char)a};
        return kv_copy(c, n, a);
    }
    case G_SUM:
    case G_MEAN:
    case G_MAX:
    case G_MIN:
    case G_LOGSUMEXP: {
        int64_t ax = n->iattr[0];
        if (ax < 0 || ax == s0.axis) return kv_refuse(c, n, "it reduces over the token axis, which mixes positions");
        int a = n->iattr[1] || ax > s0.axis ? s0.axis : s0.axis - 1;
        c->st[n->id] = (KvState){s0.kind, (signed char)a};
        return kv_copy(c, n, a);
    }
    case G_SOFTMAX:
    case G_LOG_SOFTMAX:
    case G_TOPK_VALUES:
    case G_TOPK_INDICES: {
        int64_t ax = n->op == G_SOFTMAX || n->op == G_LOG_SOFTMAX ? n->iattr[0] : n->iattr[1];
        if (ax == s0.axis) return kv_refuse(c, n, "it works along the token axis, which mixes positions");
        c->st[n->id] = s0;
        return kv_copy(c, n, s0.axis);
    }
    case G_LAYERNORM:
    case G_RMSNORM:
        for (int i = 1; i < n->nin; i++)
            if (c->st[n->in[i]].kind != KS_CONST) return kv_refuse(c, n, "its weight depends on the tokens");
        if (s0.axis == x->rank - 1) return kv_refuse(c, n, "it normalises over the token axis, which mixes positions");
        c->st[n->id] = s0;
        return kv_copy(c, n, s0.axis);
    case G_ONE_HOT: c->st[n->id] = s0; return kv_copy(c, n, s0.axis);
    case G_GATHER: {
        KvState si = c->st[n->in[1]];
        if (s0.kind != KS_CONST) return kv_refuse(c, n, "it gathers from a table that depends on the tokens");
        c->st[n->id] = si;
        return kv_copy(c, n, si.axis);
    }
    case G_CONCAT:
        for (int i = 0; i < n->nin; i++)
            if (c->st[n->in[i]].kind == KS_CONST || c->st[n->in[i]].axis != s0.axis)
                return kv_refuse(c, n, "it concatenates a constant with token-dependent values, which is indexed by position");
        if (n->iattr[0] == s0.axis) return kv_refuse(c, n, "it concatenates along the token axis, which mixes positions");
        c->st[n->id] = s0;
        return kv_copy(c, n, s0.axis);
    case G_MATMUL: {
        const GNode *b = graph_node(c->g, n->in[1]);
        KvState s1 = c->st[n->in[1]];
        if (s0.kind != KS_CONST && s1.kind != KS_CONST)
            return kv_refuse(c, n,
                             "it multiplies two token-dependent values (an attention written out by hand?), which "
                             "mixes positions; use attention(q, k, v, causal = true)");
        const GNode *t = s0.kind != KS_CONST ? x : b, *w = s0.kind != KS_CONST ? b : x;
        int a = s0.kind != KS_CONST ? s0.axis : s1.axis;
        if (t->rank < 2 || w->rank < 2) return kv_refuse(c, n, "a matrix-vector product over the tokens is not supported");
        int contracted = s0.kind != KS_CONST ? t->rank - 1 : t->rank - 2;
        if (a == contracted) return kv_refuse(c, n, "it contracts the token axis, which mixes positions");
        int out;
        if (a >= t->rank - 2) {
            out = n->rank - 2 + (a - (t->rank - 2));
        } else {
            out = a + (n->rank - t->rank);
            int wd = out - (n->rank - w->rank);
            if (wd >= 0 && w->shape[wd] != 1) return kv_refuse(c, n, "its other operand has a batch axis the tokens meet");
        }
        c->st[n->id] = (KvState){KS_TOK, (signed char)out};
        return kv_copy(c, n, out);
    }
    case G_ROPE: { /* the angle of each row's position, not of its index */
        if (s0.axis != x->rank - 2) return kv_refuse(c, n, "it rotates along an axis other than the tokens'");
        if (c->windows) {
            if (n->nin < 2)
                return kv_refuse(c, n,
                                 "it rotates by the row's index, which does not restart at each window; pass pos = data.pos");
            c->st[n->id] = s0;
            return kv_copy(c, n, s0.axis);
        }
        int64_t shape[GRAPH_MAX_RANK];
        memcpy(shape, n->shape, sizeof shape);
        shape[s0.axis] = c->N;
        int in[2] = {c->map[n->in[0]], kv_positions(c)};
        int id = graph_add(c->ng, G_ROPE, n->dt, n->rank, shape, 2, in, n->src);
        graph_node(c->ng, id)->fattr[0] = n->fattr[0];
        c->st[n->id] = s0;
        return id;
    }
    case G_ATTENTION: {
        for (int i = 0; i < 3; i++)
            if (c->st[n->in[i]].kind != KS_TOK || c->st[n->in[i]].axis != 2)
                return kv_refuse(c, n, "its q, k and v are not [1, heads, tokens, head size] of the tokens");
        if (!n->iattr[0]) return kv_refuse(c, n, "it is not causal");
        if (c->windows) {
            if (n->nin < 4) return kv_refuse(c, n, "it has no pos, so a window would see the one before it");
            c->st[n->id] = (KvState){KS_TOK, 2};
            return kv_copy(c, n, 2);
        }
        const GNode *k = graph_node(c->g, n->in[1]), *v = graph_node(c->g, n->in[2]);
        if (v->shape[3] != x->shape[3]) return kv_refuse(c, n, "its values' head size differs from its keys'");
        if (c->layer == 0) c->heads_kv = k->shape[1], c->head_dim = k->shape[3];
        else if (k->shape[1] != c->heads_kv || k->shape[3] != c->head_dim)
            return kv_refuse(c, n, "its key/value heads differ from the first attention's (the pool has one layout)");
        int64_t shape[GRAPH_MAX_RANK];
        memcpy(shape, n->shape, sizeof shape);
        shape[2] = c->N;
        int in[4] = {c->map[n->in[0]], c->map[n->in[1]], c->map[n->in[2]], c->kv_in};
        int id = graph_add(c->ng, G_KV_ATTENTION, n->dt, n->rank, shape, 4, in, n->src);
        GNode *m = graph_node(c->ng, id);
        m->iattr[0] = c->layer++, m->iattr[1] = c->nlayers, m->iattr[2] = c->cfg->block, m->iattr[3] = c->cfg->max_blocks;
        m->fattr[0] = n->fattr[0], m->fattr[1] = c->cfg->kv_dt;
        c->st[n->id] = (KvState){KS_TOK, 2};
        return id;
    }
    default: break;
    }
    return kv_refuse(c, n, arena_printf(c->ar, "%s is not supported in the forward over new tokens", graph_op_name(n->op)));
}

/* A slice [0, T) of a constant's first axis: a position table (wpe[0:T]). */
static int kv_position_table(KvCtx *c, const GNode *n) {
    if (c->windows) return -1; /* a constant: refused where the tokens meet it row by row (kv_pointwise) */
    if (n->op != G_SLICE || c->st[n->in[0]].kind != KS_CONST || n->iattr[0] != 0 || n->iattr[1] != 0 || n->iattr[2] != c->T)
        return -1;
    c->st[n->id] = (KvState){KS_POS, 0};
    return kv_gather_rows(c, n, c->map[n->in[0]]);
}

const char *kv_chunk_graph(const Graph *g, int out, int64_t T, const KvConfig *cfg, KvChunk *res, Span *at, Arena *ar) {
    memset(res, 0, sizeof *res);
    *at = span_none();
    KvCtx c = {.g = g, .cfg = cfg, .T = T, .N = cfg->rows, .pos = -1, .ar = ar};
    c.ng = graph_new(ar);
    c.ng->name = arena_printf(ar, "%s, over %lld new tokens with the KV cache", g->name ? g->name : "forward", (long long)c.N);
    c.map = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    c.st = arena_alloc(ar, sizeof(KvState) * (size_t)(g->n + 1));
    for (int i = 0; i < g->n; i++) c.nlayers += graph_node(g, i)->op == G_ATTENTION;
    if (c.nlayers == 0) return "the model has no attention, so there is nothing to cache";
    int64_t meta = kv_meta_numel(c.N, cfg->max_blocks);
    c.kv_in = graph_add(c.ng, G_INPUT, DT_I32, 1, &meta, 0, NULL, span_none());
    graph_node(c.ng, c.kv_in)->name = "kv";
    for (int i = 0; i < g->n && !c.why; i++) {
        const GNode *n = graph_node(g, i);
        c.st[i] = (KvState){KS_CONST, -1};
        int id = kv_position_table(&c, n);
        c.map[i] = id >= 0 ? id : kv_node(&c, n);
    }
    if (c.why) {
        *at = c.at;
        return c.why;
    }
    const GNode *o = graph_node(g, out);
    if (c.st[out].kind != KS_TOK || c.st[out].axis != 1 || o->rank != 3)
        return "the logits are not [1, tokens, vocab] of the tokens";
    res->g = c.ng;
    res->out = c.map[out];
    res->layers = c.nlayers;
    res->heads_kv = c.heads_kv;
    res->head_dim = c.head_dim;
    res->meta_bytes = meta * 4;
    res->bytes_per_token = (int64_t)c.nlayers * 2 * c.heads_kv * c.head_dim * dtype_size(cfg->kv_dt);
    signed char *axis = arena_alloc(ar, (size_t)c.ng->n + 1);
    memset(axis, -1, (size_t)c.ng->n + 1);
    for (int i = 0; i < g->n; i++) /* token-wise nodes keep their axis, resized to N (kv_node) */
        if (c.st[i].kind == KS_TOK && c.map[i] >= 0 && c.map[i] < c.ng->n) axis[c.map[i]] = c.st[i].axis;
    res->token_axis = axis;
    res->ntoken_axis = c.ng->n;
    if (graph_verify(c.ng, stderr)) INTERNAL("the forward over new tokens fails graph_verify (problems above)");
    return NULL;
}

/* Sequence-length buckets (docs/runtime.md, "Sequence-length buckets"): whether each row of the
 * batch-1 forward g (T positions) keeps a window of its tokens apart from the others, given that
 * data.pos restarts at each window - the walk above, with data.pos an input of the tokens, every
 * attention masked by pos, rope rotated by pos, and no position by the row's index. NULL, or why
 * not (*at where). It sees one row: an op that mixes the rows of a micro-batch (a statistic over
 * the batch axis) is not seen. */
const char *kv_window_local(const Graph *g, int64_t T, Span *at, Arena *ar) {
    *at = span_none();
    KvConfig cfg = {.rows = T, .block = T, .max_blocks = 1, .kv_dt = DT_F32};
    KvCtx c = {.g = g, .cfg = &cfg, .T = T, .N = T, .pos = -1, .ar = ar, .windows = 1};
    c.ng = graph_new(ar);
    c.map = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    c.st = arena_alloc(ar, sizeof(KvState) * (size_t)(g->n + 1));
    int64_t meta = kv_meta_numel(T, 1);
    c.kv_in = graph_add(c.ng, G_INPUT, DT_I32, 1, &meta, 0, NULL, span_none());
    for (int i = 0; i < g->n && !c.why; i++) {
        c.st[i] = (KvState){KS_CONST, -1};
        c.map[i] = kv_node(&c, graph_node(g, i));
    }
    *at = c.why ? c.at : span_none();
    return c.why;
}
