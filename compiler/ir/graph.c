/* graph.c - the tensor graph IR (graph.h): building nodes, printing them (--emit=ir) and checking
 * every op's shape and dtype rule (graph_verify).
 *
 * Pipeline position: sema (graph_build.c builds the forward graph of a train block) -> [graph]
 * -> autodiff -> plan -> ... Every pass after sema reads and appends nodes through this file, and
 * the verifier runs between passes in the tests and in `mbtc --emit=ir|grad`.
 *
 * Printed form: a header line, then one node a line (padded so the source locations line up):
 *     # graph train tiny: 161 nodes, 52 parameters (817920 values), loss %160
 *     %0 = param wte init=normal(mean=0.0, std=0.02) : f32[64, 128]           # tiny.mbt:16:3
 *     %56 = add %54, %55 : f32[8, 64, 128]                                    # tiny.mbt:22:9
 *     %57 = layernorm %56, %2, %3 eps=1e-5 : f32[8, 64, 128]                  # nn.mbt:75:12
 * inputs are `%id`, attributes `key=value` after them, then ` : dtype[shape]`, then the source
 * location of what produced the node (file name without its directory, line, column). After
 * autodiff, `# grad NAME = %id` lines follow for every parameter. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "graph.h"

/* ---- op names and arities ---- */

static const char *const graph_op_names[G_OP_COUNT] = {
    [G_PARAM] = "param",
    [G_INPUT] = "input",
    [G_CONST] = "const",
    [G_ARANGE] = "arange",
    [G_NEG] = "neg",
    [G_EXP] = "exp",
    [G_LOG] = "log",
    [G_SQRT] = "sqrt",
    [G_RSQRT] = "rsqrt",
    [G_TANH] = "tanh",
    [G_SIGMOID] = "sigmoid",
    [G_RELU] = "relu",
    [G_GELU] = "gelu",
    [G_SILU] = "silu",
    [G_ABS] = "abs",
    [G_SIGN] = "sign",
    [G_SIN] = "sin",
    [G_COS] = "cos",
    [G_FLOOR] = "floor",
    [G_NOT] = "not",
    [G_CAST] = "cast",
    [G_DROPOUT] = "dropout",
    [G_CLAMP] = "clamp",
    [G_ADD] = "add",
    [G_SUB] = "sub",
    [G_MUL] = "mul",
    [G_DIV] = "div",
    [G_POW] = "pow",
    [G_MOD] = "mod",
    [G_MAX2] = "max2",
    [G_MIN2] = "min2",
    [G_EQ] = "eq",
    [G_NE] = "ne",
    [G_LT] = "lt",
    [G_LE] = "le",
    [G_GT] = "gt",
    [G_GE] = "ge",
    [G_AND] = "and",
    [G_OR] = "or",
    [G_WHERE] = "where",
    [G_SUM] = "sum",
    [G_MEAN] = "mean",
    [G_MAX] = "max",
    [G_MIN] = "min",
    [G_LOGSUMEXP] = "logsumexp",
    [G_NORM] = "norm",
    [G_SEG_NORM] = "seg_norm",
    [G_SUM_TO] = "sum_to",
    [G_SOFTMAX] = "softmax",
    [G_LOG_SOFTMAX] = "log_softmax",
    [G_LAYERNORM] = "layernorm",
    [G_RMSNORM] = "rmsnorm",
    [G_ROPE] = "rope",
    [G_ATTENTION] = "attention",
    [G_CROSS_ENTROPY] = "cross_entropy",
    [G_MSE] = "mse",
    [G_ONE_HOT] = "one_hot",
    [G_TOPK_VALUES] = "topk_values",
    [G_TOPK_INDICES] = "topk_indices",
    [G_MATMUL] = "matmul",
    [G_RESHAPE] = "reshape",
    [G_TRANSPOSE] = "transpose",
    [G_SLICE] = "slice",
    [G_GATHER] = "gather",
    [G_CONCAT] = "concat",
    [G_BROADCAST] = "broadcast",
    [G_SCATTER_ADD] = "scatter_add",
    [G_SOFTMAX_BWD] = "softmax_bwd",
    [G_LAYERNORM_BWD_X] = "layernorm_bwd_x",
    [G_LAYERNORM_BWD_W] = "layernorm_bwd_w",
    [G_RMSNORM_BWD_X] = "rmsnorm_bwd_x",
    [G_RMSNORM_BWD_W] = "rmsnorm_bwd_w",
    [G_ROPE_BWD] = "rope_bwd",
    [G_ATTENTION_BWD_Q] = "attention_bwd_q",
    [G_ATTENTION_BWD_K] = "attention_bwd_k",
    [G_ATTENTION_BWD_V] = "attention_bwd_v",
    [G_CROSS_ENTROPY_BWD] = "cross_entropy_bwd",
    [G_KV_ATTENTION] = "kv_attention",
};

const char *graph_op_name(GOp op) { return op >= 0 && op < G_OP_COUNT && graph_op_names[op] ? graph_op_names[op] : "?"; }

static int graph_is_unary(GOp op) { return op >= G_NEG && op <= G_CLAMP; }
static int graph_is_binary(GOp op) { return op >= G_ADD && op <= G_OR; }
static int graph_is_compare(GOp op) { return op >= G_EQ && op <= G_GE; }
static int graph_is_reduce(GOp op) { return op >= G_SUM && op <= G_LOGSUMEXP; }

/* The number of inputs each op takes: min and max (concat takes 1 to GRAPH_MAX_CONCAT). */
static void graph_arity(GOp op, int *lo, int *hi) {
    int n = 1;
    if (op <= G_ARANGE) n = 0;
    else if (op == G_DROPOUT) n = 2; /* x and the "rng" key */
    else if (graph_is_unary(op) || graph_is_reduce(op)) n = 1;
    else if (graph_is_binary(op)) n = 2;
    else switch (op) {
        case G_ROPE:
        case G_ROPE_BWD:
            *lo = 1; /* x (or dy), and the positions: pos (i32 [B, T]) when they restart per document,
                      * or one a row in the forward over new tokens (plan/kv.c) */
            *hi = 2;
            return;
        case G_ATTENTION:
            *lo = 3; /* q, k, v, and pos (i32 [B, T]) when documents mask the attention */
            *hi = 4;
            return;
        case G_WHERE:
        case G_LAYERNORM:
        case G_LAYERNORM_BWD_X:
        case G_RMSNORM_BWD_X:
        case G_CROSS_ENTROPY_BWD: n = 3; break;
        case G_RMSNORM:
        case G_CROSS_ENTROPY:
        case G_MSE:
        case G_MATMUL:
        case G_GATHER:
        case G_SCATTER_ADD:
        case G_SOFTMAX_BWD:
        case G_LAYERNORM_BWD_W:
        case G_RMSNORM_BWD_W: n = 2; break;
        case G_ATTENTION_BWD_Q:
        case G_ATTENTION_BWD_K:
        case G_ATTENTION_BWD_V:
            *lo = 4; /* and pos, the document mask, as the attention had it */
            *hi = 5;
            return;
        case G_KV_ATTENTION: n = 4; break;
        case G_CONCAT:
            *lo = 1;
            *hi = GRAPH_MAX_CONCAT;
            return;
        default: n = 1; break;
        }
    *lo = *hi = n;
}

/* ---- building ---- */

Graph *graph_new(Arena *ar) {
    Graph *g = arena_alloc(ar, sizeof(Graph));
    g->ar = ar;
    g->loss = -1;
    return g;
}

void graph_add_stat(Graph *g, int in, int expr) {
    if (in < 0 || in >= g->n || expr < 0 || expr >= g->n) INTERNAL("graph_add_stat: %%%d, %%%d", in, expr);
    if (g->nstats == g->statcap) {
        int cap = g->statcap ? g->statcap * 2 : 4;
        int *a = arena_alloc(g->ar, sizeof(int) * (size_t)cap), *b = arena_alloc(g->ar, sizeof(int) * (size_t)cap);
        for (int i = 0; i < g->nstats; i++) a[i] = g->stat_in[i], b[i] = g->stat_expr[i];
        g->stat_in = a, g->stat_expr = b, g->statcap = cap;
    }
    g->stat_in[g->nstats] = in;
    g->stat_expr[g->nstats++] = expr;
}

void graph_add_running(Graph *g, int param, int stat, double momentum) {
    if (param < 0 || param >= g->n || stat < 0 || stat >= g->nstats) INTERNAL("graph_add_running: %%%d, %d", param, stat);
    if (g->nrunning == g->runcap) {
        int cap = g->runcap ? g->runcap * 2 : 4;
        int *a = arena_alloc(g->ar, sizeof(int) * (size_t)cap), *b = arena_alloc(g->ar, sizeof(int) * (size_t)cap);
        double *m = arena_alloc(g->ar, sizeof(double) * (size_t)cap);
        for (int i = 0; i < g->nrunning; i++) a[i] = g->run_param[i], b[i] = g->run_stat[i], m[i] = g->run_momentum[i];
        g->run_param = a, g->run_stat = b, g->run_momentum = m, g->runcap = cap;
    }
    g->run_param[g->nrunning] = param;
    g->run_stat[g->nrunning] = stat;
    g->run_momentum[g->nrunning++] = momentum;
}

void graph_inline_stats(Graph *g) {
    for (int k = 0; k < g->nstats; k++) {
        int in = g->stat_in[k], e = g->stat_expr[k];
        for (int id = in + 1; id < g->n; id++)
            for (int j = 0; j < g->node[id]->nin; j++)
                if (g->node[id]->in[j] == in) g->node[id]->in[j] = e; /* e < in: the order stays topological */
        GNode *n = g->node[in];
        n->op = G_CONST;
        n->name = NULL;
        n->fattr[0] = 0;
    }
    g->nstats = 0;
}

int graph_add(Graph *g, GOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in, Span src) {
    if (op < 0 || op >= G_OP_COUNT) INTERNAL("graph_add: op %d", (int)op);
    if (rank < 0 || rank > GRAPH_MAX_RANK) INTERNAL("graph_add: rank %d", rank);
    if (nin < 0 || nin > GRAPH_MAX_IN) INTERNAL("graph_add: %d inputs", nin);
    for (int i = 0; i < nin; i++)
        if (in[i] < 0 || in[i] >= g->n) INTERNAL("graph_add: %s input %d is %%%d of %d nodes", graph_op_name(op), i, in[i], g->n);
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        GNode **nv = arena_alloc(g->ar, sizeof(GNode *) * (size_t)cap);
        if (g->n) memcpy(nv, g->node, sizeof(GNode *) * (size_t)g->n);
        g->node = nv;
        g->cap = cap;
    }
    GNode *n = arena_alloc(g->ar, sizeof(GNode));
    n->id = g->n;
    n->op = op;
    n->dt = dt;
    n->rank = rank;
    for (int i = 0; i < rank; i++) n->shape[i] = shape[i];
    n->nin = nin;
    for (int i = 0; i < nin; i++) n->in[i] = in[i];
    n->src = src;
    g->node[g->n++] = n;
    if (op == G_PARAM) {
        int *p = arena_alloc(g->ar, sizeof(int) * (size_t)(g->nparams + 1));
        if (g->nparams) memcpy(p, g->params, sizeof(int) * (size_t)g->nparams);
        p[g->nparams++] = n->id;
        g->params = p;
    }
    return n->id;
}

GNode *graph_node(const Graph *g, int id) {
    if (id < 0 || id >= g->n) INTERNAL("graph_node: %%%d of %d nodes", id, g->n);
    return g->node[id];
}

int64_t graph_numel(const GNode *n) {
    /* Saturates at INT64_MAX, so a corrupt shape handed to graph_verify cannot overflow. */
    int64_t k = 1;
    for (int i = 0; i < n->rank && i < GRAPH_MAX_RANK; i++) {
        if (n->shape[i] <= 0) return 0;
        if (k > INT64_MAX / n->shape[i]) return INT64_MAX;
        k *= n->shape[i];
    }
    return k;
}

/* ---- printing ---- */

static const char *const graph_init_names[] = {"zeros", "ones", "constant", "normal", "uniform"};

/* A growable line. */
typedef struct GraphLine {
    char buf[1024];
    size_t n;
} GraphLine;

static void graph_line_printf(GraphLine *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void graph_line_printf(GraphLine *l, const char *fmt, ...) {
    if (l->n >= sizeof l->buf - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->buf + l->n, sizeof l->buf - l->n, fmt, ap);
    va_end(ap);
    if (k > 0) l->n += (size_t)k < sizeof l->buf - l->n ? (size_t)k : sizeof l->buf - l->n - 1;
}

static void graph_line_type(GraphLine *l, DType dt, int rank, const int64_t *shape) {
    if (rank < 0 || rank > GRAPH_MAX_RANK) rank = 0; /* a broken node: graph_verify says so */
    graph_line_printf(l, "%s[", dtype_name(dt));
    for (int i = 0; i < rank; i++) graph_line_printf(l, "%s%" PRId64, i ? ", " : "", shape[i]);
    graph_line_printf(l, "]");
}

/* A constant as written in the program: integers plainly, floats as sema prints them. */
static const char *graph_num_str(Arena *ar, double v, DType dt) {
    if (dt == DT_BOOL) return v != 0 ? "true" : "false";
    if (!dtype_is_float(dt) && v == (double)(int64_t)v) return arena_printf(ar, "%" PRId64, (int64_t)v);
    return value_float_str(ar, v);
}

static void graph_line_attrs(GraphLine *l, Arena *ar, const GNode *n) {
    const int64_t *ia = n->iattr;
    const double *fa = n->fattr;
    switch (n->op) {
    case G_PARAM: {
        int k = (int)ia[0];
        const char *in = k >= 0 && k <= GI_UNIFORM ? graph_init_names[k] : "?";
        const char *x0 = value_float_str(ar, fa[0]), *x1 = value_float_str(ar, fa[1]);
        if (k == GI_NORMAL) graph_line_printf(l, " init=normal(mean=%s, std=%s)", x0, x1);
        else if (k == GI_UNIFORM) graph_line_printf(l, " init=uniform(lo=%s, hi=%s)", x0, x1);
        else if (k == GI_CONSTANT) graph_line_printf(l, " init=constant(%s)", x0);
        else graph_line_printf(l, " init=%s", in);
        if (ia[1] & GP_FROZEN) graph_line_printf(l, " frozen");
        if (ia[1] & GP_NO_DECAY) graph_line_printf(l, " no_decay");
        if (ia[2] > 0) graph_line_printf(l, " rows=%" PRId64, ia[2]); /* stored padded: graph_pad.h */
        break;
    }
    case G_DROPOUT: graph_line_printf(l, " p=%s stream=%" PRId64, value_float_str(ar, fa[0]), ia[0]); break;
    case G_CLAMP: graph_line_printf(l, " lo=%s hi=%s", value_float_str(ar, fa[0]), value_float_str(ar, fa[1])); break;
    case G_SUM:
    case G_MEAN:
    case G_MAX:
    case G_MIN:
    case G_LOGSUMEXP:
        if (ia[0] < 0) graph_line_printf(l, " axis=all");
        else graph_line_printf(l, " axis=%" PRId64, ia[0]);
        if (ia[1]) graph_line_printf(l, " keepdim=true");
        break;
    case G_SOFTMAX:
    case G_LOG_SOFTMAX:
    case G_SOFTMAX_BWD:
    case G_CONCAT: graph_line_printf(l, " axis=%" PRId64, ia[0]); break;
    case G_LAYERNORM:
    case G_RMSNORM:
    case G_LAYERNORM_BWD_X:
    case G_LAYERNORM_BWD_W:
    case G_RMSNORM_BWD_X:
    case G_RMSNORM_BWD_W: graph_line_printf(l, " eps=%s", value_float_str(ar, fa[0])); break;
    case G_ROPE:
    case G_ROPE_BWD: graph_line_printf(l, " theta=%s%s", value_float_str(ar, fa[0]), ia[1] ? " docs" : ""); break;
    case G_ATTENTION:
    case G_ATTENTION_BWD_Q:
    case G_ATTENTION_BWD_K:
    case G_ATTENTION_BWD_V:
        graph_line_printf(l, " causal=%s scale=%s%s", ia[0] ? "true" : "false", value_float_str(ar, fa[0]), ia[1] ? " docs" : "");
        break;
    case G_KV_ATTENTION:
        graph_line_printf(l, " layer=%" PRId64 "/%" PRId64 " block=%" PRId64 " max_blocks=%" PRId64 " kv=%s scale=%s", ia[0],
                          ia[1], ia[2], ia[3], dtype_name((DType)fa[1]), value_float_str(ar, fa[0]));
        break;
    case G_ONE_HOT: graph_line_printf(l, " n=%" PRId64, ia[0]); break;
    case G_TOPK_VALUES:
    case G_TOPK_INDICES: graph_line_printf(l, " k=%" PRId64 " axis=%" PRId64, ia[0], ia[1]); break;
    case G_TRANSPOSE: graph_line_printf(l, " axes=%" PRId64 ",%" PRId64, ia[0], ia[1]); break;
    case G_SLICE: graph_line_printf(l, " axis=%" PRId64 " start=%" PRId64 " end=%" PRId64, ia[0], ia[1], ia[2]); break;
    default: break;
    }
}

/* "tiny.mbt:21:9" for a node's source, or NULL when it has none. */
static const char *graph_where(Arena *ar, Span s) {
    if (!s.file) return NULL;
    const char *path = diag_source_path(s.file);
    if (!path) return NULL;
    const char *slash = strrchr(path, '/');
    return arena_printf(ar, "%s:%u:%u", slash ? slash + 1 : path, s.line, s.col);
}

#define GRAPH_PRINT_COLUMN 72 /* where the `# file:line:col` comments start */

void graph_print(FILE *out, const Graph *g, int first) {
    int64_t values = 0;
    for (int i = 0; i < g->nparams; i++)
        if (g->params[i] >= 0 && g->params[i] < g->n) {
            const GNode *pn = g->node[g->params[i]];
            int64_t k = graph_numel(pn);
            if (pn->iattr[2] > 0 && pn->shape[0] > 0) k = k / pn->shape[0] * pn->iattr[2]; /* the program's, not the padded */
            values = values > INT64_MAX - k ? INT64_MAX : values + k;
        }
    if (g->update) /* an update graph: its layout instead of parameters */
        fprintf(out, "# graph%s%s: %d nodes, %d segment%s over %" PRId64 " values", g->name ? " " : "", g->name ? g->name : "",
                g->n, g->update->nsegs, g->update->nsegs == 1 ? "" : "s", g->update->n);
    if (g->update && g->update->decay_end < g->update->n)
        fprintf(out, " (weight decay on [0, %" PRId64 "))", g->update->decay_end);
    if (g->update && g->update->n_params > g->update->n)
        fprintf(out, " (frozen: [%" PRId64 ", %" PRId64 "), not updated)", g->update->n, g->update->n_params);
    if (!g->update)
        fprintf(out, "# graph%s%s: %d nodes, %d parameter%s (%" PRId64 " values)", g->name ? " " : "", g->name ? g->name : "",
                g->n, g->nparams, g->nparams == 1 ? "" : "s", values);
    if (g->loss >= 0) fprintf(out, ", loss %%%d", g->loss);
    if (first > 0) fprintf(out, "; from %%%d on", first);
    fprintf(out, "\n");
    Arena scratch = {0};
    for (int id = first < 0 ? 0 : first; id < g->n; id++) {
        const GNode *n = g->node[id];
        GraphLine l = {.n = 0};
        graph_line_printf(&l, "%%%d = %s", n->id, graph_op_name(n->op));
        if (n->op == G_PARAM || n->op == G_INPUT) graph_line_printf(&l, " %s", n->name ? n->name : "?");
        if (n->op == G_CONST) graph_line_printf(&l, " %s", graph_num_str(&scratch, n->fattr[0], n->dt));
        for (int i = 0; i < n->nin; i++) graph_line_printf(&l, "%s%%%d", i ? ", " : " ", n->in[i]);
        graph_line_attrs(&l, &scratch, n);
        graph_line_printf(&l, " : ");
        graph_line_type(&l, n->dt, n->rank, n->shape);
        const char *where = graph_where(&scratch, n->src);
        if (where) fprintf(out, "%-*s  # %s\n", GRAPH_PRINT_COLUMN - 2, l.buf, where);
        else fprintf(out, "%s\n", l.buf);
    }
    if (g->grads)
        for (int i = 0; i < g->nparams; i++) {
            const GNode *p = g->params[i] >= 0 && g->params[i] < g->n ? g->node[g->params[i]] : NULL;
            fprintf(out, "# grad %s = %%%d%s\n", p && p->name ? p->name : "?", g->grads[i],
                    p && (p->iattr[1] & GP_FROZEN) ? " (frozen: zero, none computed)" : "");
        }
    for (int k = 0; k < g->nstats; k++) fprintf(out, "# stat %%%d = global_mean(%%%d)\n", g->stat_in[k], g->stat_expr[k]);
    for (int i = 0; i < g->nrunning; i++)
        fprintf(out, "# running %%%d = (1 - %.9g) * itself + %.9g * stat %%%d, after each step\n", g->run_param[i],
                g->run_momentum[i], g->run_momentum[i], g->stat_in[g->run_stat[i]]);
    if (g->update) { /* the results of an update graph */
        const GraphUpdate *u = g->update;
        fprintf(out, "# out p = %%%d\n", u->p_out);
        if (u->cast_out >= 0)
            fprintf(out, "# out cast(p) = %%%d (%s: the parameter casts' region, which the step reads)\n", u->cast_out,
                    dtype_name(g->node[u->cast_out]->dt));
        for (int i = 0; i < u->nstate; i++) fprintf(out, "# out state.%s = %%%d\n", u->state_name[i], u->state_out[i]);
    }
    arena_free(&scratch);
}

/* ---- verifying ---- */

typedef struct GraphVerify {
    const Graph *g;
    FILE *out;
    int problems;
    const GNode *n; /* the node being checked */
} GraphVerify;

static void graph_v_fail(GraphVerify *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void graph_v_fail(GraphVerify *v, const char *fmt, ...) {
    v->problems++;
    if (!v->out) return;
    va_list ap;
    va_start(ap, fmt);
    if (v->n) fprintf(v->out, "graph: %%%d: %s: ", v->n->id, graph_op_name(v->n->op));
    else fprintf(v->out, "graph: ");
    vfprintf(v->out, fmt, ap);
    fprintf(v->out, "\n");
    va_end(ap);
}

/* "f32[2, 3]" in a buffer the caller holds (no arena needed for messages). */
typedef struct GraphTypeText {
    char s[200];
} GraphTypeText;

static GraphTypeText graph_v_type(DType dt, int rank, const int64_t *shape) {
    GraphLine l = {.n = 0};
    graph_line_type(&l, dt, rank, shape);
    GraphTypeText t;
    size_t k = l.n < sizeof t.s - 1 ? l.n : sizeof t.s - 1; /* rank <= 8: always fits */
    memcpy(t.s, l.buf, k);
    t.s[k] = 0;
    return t;
}

static GraphTypeText graph_v_ntype(const GNode *n) { return graph_v_type(n->dt, n->rank, n->shape); }

static int graph_v_same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
    if (ra != rb) return 0;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* The node's shape must be (rank, shape). */
static void graph_v_shape(GraphVerify *v, int rank, const int64_t *shape, const char *why) {
    if (graph_v_same_shape(v->n->rank, v->n->shape, rank, shape)) return;
    GraphTypeText want = graph_v_type(v->n->dt, rank, shape), got = graph_v_ntype(v->n);
    graph_v_fail(v, "result is %s but %s gives %s", got.s, why, want.s);
}

static void graph_v_shape_of(GraphVerify *v, const GNode *x, const char *why) { graph_v_shape(v, x->rank, x->shape, why); }

static void graph_v_dtype(GraphVerify *v, const GNode *x, DType want, const char *what) {
    if (x->dt != want) graph_v_fail(v, "%s is %s, expected %s", what, dtype_name(x->dt), dtype_name(want));
}

static void graph_v_float(GraphVerify *v, const GNode *x, const char *what) {
    if (!dtype_is_float(x->dt)) graph_v_fail(v, "%s must be a float tensor, got %s", what, graph_v_ntype(x).s);
}

/* NumPy broadcasting of a and b into out; 0 when they do not broadcast. */
static int graph_v_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *rout, int64_t *out) {
    int r = ra > rb ? ra : rb;
    if (r > GRAPH_MAX_RANK) return 0;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - ra), ib = i - (r - rb);
        int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
        if (x != y && x != 1 && y != 1) return 0;
        out[i] = x == 1 ? y : x;
    }
    *rout = r;
    return 1;
}

/* An axis attribute: 0 <= axis < rank (all = 1 lets -1 mean every axis). */
static int graph_v_axis(GraphVerify *v, int64_t axis, int rank, int all, const char *what) {
    if ((all && axis == -1) || (axis >= 0 && axis < rank)) return 1;
    graph_v_fail(v, "%s %" PRId64 " is out of range for rank %d", what, axis, rank);
    return 0;
}

static void graph_v_unary(GraphVerify *v, const GNode *x) {
    const GNode *n = v->n;
    graph_v_shape_of(v, x, "the input");
    switch (n->op) {
    case G_CAST: return;
    case G_NOT:
        graph_v_dtype(v, x, DT_BOOL, "the input");
        graph_v_dtype(v, n, DT_BOOL, "the result");
        return;
    case G_NEG:
    case G_RELU:
    case G_ABS:
    case G_SIGN:
    case G_CLAMP:
        if (x->dt == DT_BOOL) graph_v_fail(v, "the input must be numeric, got %s", graph_v_ntype(x).s);
        break;
    default: graph_v_float(v, x, "the input"); break;
    }
    if (x->dt != n->dt) graph_v_fail(v, "the input is %s but the result is %s", dtype_name(x->dt), dtype_name(n->dt));
    if (n->op == G_DROPOUT && !(n->fattr[0] >= 0 && n->fattr[0] < 1)) graph_v_fail(v, "p = %g is not in [0, 1)", n->fattr[0]);
    if (n->op == G_DROPOUT) {
        const GNode *k = v->g->node[n->in[1]];
        if (k->op != G_INPUT || !k->name || strcmp(k->name, GRAPH_RNG_NAME) != 0 || k->dt != DT_I64 || k->rank != 1 ||
            k->shape[0] != GRAPH_RNG_WORDS)
            graph_v_fail(v, "input 1 is not the graph's \"rng\" key i64[%d]", GRAPH_RNG_WORDS);
        if (graph_numel(n) > ((int64_t)1 << 32)) graph_v_fail(v, "more than 2^32 elements (the mask's counter is 32 bits)");
        if (n->iattr[0] < 0 || n->iattr[0] > (int64_t)UINT32_MAX)
            graph_v_fail(v, "stream %" PRId64 " is not 32 bits", n->iattr[0]);
    }
    if (n->op == G_CLAMP && !(n->fattr[0] <= n->fattr[1]))
        graph_v_fail(v, "lo = %g is greater than hi = %g", n->fattr[0], n->fattr[1]);
}

static void graph_v_binary(GraphVerify *v, const GNode *a, const GNode *b) {
    const GNode *n = v->n;
    int r;
    int64_t s[GRAPH_MAX_RANK];
    if (!graph_v_broadcast(a->rank, a->shape, b->rank, b->shape, &r, s)) {
        graph_v_fail(v, "%s and %s do not broadcast", graph_v_ntype(a).s, graph_v_ntype(b).s);
        return;
    }
    graph_v_shape(v, r, s, "broadcasting the inputs");
    if (a->dt != b->dt) graph_v_fail(v, "the inputs differ in dtype: %s and %s", dtype_name(a->dt), dtype_name(b->dt));
    if (graph_is_compare(n->op)) graph_v_dtype(v, n, DT_BOOL, "the result");
    else if (n->op == G_AND || n->op == G_OR) {
        graph_v_dtype(v, a, DT_BOOL, "input 0");
        graph_v_dtype(v, n, DT_BOOL, "the result");
    } else {
        if (a->dt != n->dt) graph_v_fail(v, "the inputs are %s but the result is %s", dtype_name(a->dt), dtype_name(n->dt));
        if (n->dt == DT_BOOL) graph_v_fail(v, "arithmetic on bool tensors");
    }
}

static void graph_v_where(GraphVerify *v, const GNode *c, const GNode *a, const GNode *b) {
    int r1, r2;
    int64_t s1[GRAPH_MAX_RANK], s2[GRAPH_MAX_RANK];
    if (!graph_v_broadcast(a->rank, a->shape, b->rank, b->shape, &r1, s1) ||
        !graph_v_broadcast(c->rank, c->shape, r1, s1, &r2, s2)) {
        graph_v_fail(v, "%s, %s and %s do not broadcast", graph_v_ntype(c).s, graph_v_ntype(a).s, graph_v_ntype(b).s);
        return;
    }
    graph_v_shape(v, r2, s2, "broadcasting the inputs");
    graph_v_dtype(v, c, DT_BOOL, "the condition");
    graph_v_dtype(v, a, v->n->dt, "input 1");
    graph_v_dtype(v, b, v->n->dt, "input 2");
}

/* The shape of x reduced over axis (-1: all) with or without keepdim. */
static int graph_v_reduced(const GNode *x, int64_t axis, int keep, int64_t *out) {
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (axis == -1 || i == axis) {
            if (keep) out[r++] = 1;
        } else {
            out[r++] = x->shape[i];
        }
    }
    return r;
}

static void graph_v_reduce(GraphVerify *v, const GNode *x) {
    const GNode *n = v->n;
    if (!graph_v_axis(v, n->iattr[0], x->rank, 1, "axis")) return;
    if (n->iattr[1] != 0 && n->iattr[1] != 1) graph_v_fail(v, "keepdim is %" PRId64 ", not 0 or 1", n->iattr[1]);
    int64_t s[GRAPH_MAX_RANK];
    int r = graph_v_reduced(x, n->iattr[0], n->iattr[1] != 0, s);
    graph_v_shape(v, r, s, "the reduction");
    if (x->dt != n->dt) graph_v_fail(v, "the input is %s but the result is %s", dtype_name(x->dt), dtype_name(n->dt));
    if (n->op == G_LOGSUMEXP || n->op == G_MEAN) graph_v_float(v, x, "the input");
    if (x->dt == DT_BOOL) graph_v_fail(v, "reduction of a bool tensor");
}

/* x: [..., n]; w: [n] of x's dtype (norm weights and biases). */
static void graph_v_norm_vector(GraphVerify *v, const GNode *x, const GNode *w, const char *what) {
    if (x->rank < 1) {
        graph_v_fail(v, "x must have rank 1 or more, got %s", graph_v_ntype(x).s);
        return;
    }
    if (w->rank != 1 || w->shape[0] != x->shape[x->rank - 1])
        graph_v_fail(v, "%s is %s but x's last dimension is %" PRId64, what, graph_v_ntype(w).s, x->shape[x->rank - 1]);
    if (w->dt != x->dt) graph_v_fail(v, "%s is %s but x is %s", what, dtype_name(w->dt), dtype_name(x->dt));
}

/* q [B, H, T, hd], k [B, Hk, S, hd], v [B, Hk, S, hv] -> [B, H, T, hv] into out. */
/* pos, the document mask: i32 [B, T] for q [B, H, T, hd], causal, as many keys as queries. */
static void graph_v_attention_pos(GraphVerify *v, const GNode *n, const GNode *q, const GNode *k, const GNode *pos) {
    if (pos->dt != DT_I32 || pos->rank != 2 || q->rank != 4 || pos->shape[0] != q->shape[0] || pos->shape[1] != q->shape[2])
        graph_v_fail(v, "pos %s is not i32 [B, T] of q %s", graph_v_ntype(pos).s, graph_v_ntype(q).s);
    if (k->rank == 4 && q->rank == 4 && k->shape[2] != q->shape[2])
        graph_v_fail(v, "pos needs as many keys as queries, got %" PRId64 " and %" PRId64, k->shape[2], q->shape[2]);
    if (!n->iattr[0]) graph_v_fail(v, "pos on an attention that is not causal");
    if (!n->iattr[1]) graph_v_fail(v, "pos given but iattr[1] (docs) is 0");
}

static int graph_v_attention_shape(GraphVerify *v, const GNode *q, const GNode *k, const GNode *vv, int64_t *out) {
    if (q->rank != 4 || k->rank != 4 || vv->rank != 4) {
        graph_v_fail(v, "q, k and v must have rank 4, got %s, %s and %s", graph_v_ntype(q).s, graph_v_ntype(k).s,
                     graph_v_ntype(vv).s);
        return 0;
    }
    int ok = 1;
    if (k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3]) {
        graph_v_fail(v, "k %s does not match q %s in batch or head size", graph_v_ntype(k).s, graph_v_ntype(q).s);
        ok = 0;
    }
    if (vv->shape[0] != k->shape[0] || vv->shape[1] != k->shape[1] || vv->shape[2] != k->shape[2]) {
        graph_v_fail(v, "v %s does not match k %s in B, Hk, S", graph_v_ntype(vv).s, graph_v_ntype(k).s);
        ok = 0;
    }
    if (k->shape[1] <= 0 || q->shape[1] % k->shape[1] != 0) {
        graph_v_fail(v, "q's %" PRId64 " heads are not a multiple of k's %" PRId64, q->shape[1], k->shape[1]);
        ok = 0;
    }
    if (k->dt != q->dt || vv->dt != q->dt) {
        graph_v_fail(v, "q, k and v differ in dtype");
        ok = 0;
    }
    graph_v_float(v, q, "q");
    if (!(v->n->fattr[0] > 0)) graph_v_fail(v, "scale %g is not positive", v->n->fattr[0]);
    out[0] = q->shape[0];
    out[1] = q->shape[1];
    out[2] = q->shape[2];
    out[3] = vv->shape[3];
    return ok;
}

/* logits [..., V] float, targets i32 [...]. */
static void graph_v_logits_targets(GraphVerify *v, const GNode *lg, const GNode *tg) {
    graph_v_float(v, lg, "the logits");
    graph_v_dtype(v, tg, DT_I32, "the targets");
    if (lg->rank < 1 || !graph_v_same_shape(lg->rank - 1, lg->shape, tg->rank, tg->shape))
        graph_v_fail(v, "targets %s do not match logits %s without their last dimension", graph_v_ntype(tg).s,
                     graph_v_ntype(lg).s);
}

static void graph_v_matmul(GraphVerify *v, const GNode *a, const GNode *b) {
    if (a->rank < 1 || b->rank < 1) {
        graph_v_fail(v, "matmul of a rank-0 tensor");
        return;
    }
    graph_v_float(v, a, "input 0");
    if (a->dt != b->dt || a->dt != v->n->dt)
        graph_v_fail(v, "dtypes differ: %s @ %s -> %s", dtype_name(a->dt), dtype_name(b->dt), dtype_name(v->n->dt));
    int64_t ka = a->shape[a->rank - 1], kb = b->rank >= 2 ? b->shape[b->rank - 2] : b->shape[0];
    if (ka != kb) {
        graph_v_fail(v, "inner dimensions differ: %s @ %s", graph_v_ntype(a).s, graph_v_ntype(b).s);
        return;
    }
    int ra = a->rank >= 2 ? a->rank - 2 : 0, rb = b->rank >= 2 ? b->rank - 2 : 0, r;
    int64_t s[GRAPH_MAX_RANK + 2];
    if (!graph_v_broadcast(ra, a->shape, rb, b->shape, &r, s)) {
        graph_v_fail(v, "batch dimensions do not broadcast: %s @ %s", graph_v_ntype(a).s, graph_v_ntype(b).s);
        return;
    }
    if (a->rank >= 2) s[r++] = a->shape[a->rank - 2];
    if (b->rank >= 2) s[r++] = b->shape[b->rank - 1];
    if (r > GRAPH_MAX_RANK) {
        graph_v_fail(v, "result rank %d is too large", r);
        return;
    }
    graph_v_shape(v, r, s, "the matmul");
}

/* The node's own fields and its inputs (into in[]): 0, the problems reported, when the rules by op
 * cannot be applied. */
static int graph_v_frame(GraphVerify *v, const GNode *n, const GNode **in) {
    const Graph *g = v->g;
    int lo, hi;
    if (n->op < 0 || n->op >= G_OP_COUNT) {
        graph_v_fail(v, "unknown op %d", (int)n->op);
        return 0;
    }
    if (n->rank < 0 || n->rank > GRAPH_MAX_RANK) {
        graph_v_fail(v, "rank %d is out of range", n->rank);
        return 0;
    }
    if (n->dt < 0 || n->dt >= DT_COUNT) {
        graph_v_fail(v, "unknown dtype %d", (int)n->dt);
        return 0;
    }
    for (int i = 0; i < n->rank; i++)
        if (n->shape[i] < 1) graph_v_fail(v, "dimension %d is %" PRId64 ", not positive", i, n->shape[i]);
    graph_arity(n->op, &lo, &hi);
    if (n->nin < lo || n->nin > hi) {
        if (lo == hi) graph_v_fail(v, "takes %d input%s, has %d", lo, lo == 1 ? "" : "s", n->nin);
        else graph_v_fail(v, "takes %d to %d inputs, has %d", lo, hi, n->nin);
        return 0;
    }
    for (int i = 0; i < n->nin; i++) {
        if (n->in[i] < 0 || n->in[i] >= n->id) {
            graph_v_fail(v, "input %d is %%%d, which does not precede it", i, n->in[i]);
            return 0;
        }
        in[i] = g->node[n->in[i]];
        if (!in[i] || in[i]->rank < 0 || in[i]->rank > GRAPH_MAX_RANK) {
            graph_v_fail(v, "input %d (%%%d) is broken", i, n->in[i]);
            return 0;
        }
    }
    return 1;
}
/* Leaves and the ops of the forward pass other than views and matmuls: checks n, returns 1; 0 when n is not one of them. */
static int graph_v_leaf(GraphVerify *v, const GNode *n, const GNode *const *in) {
    const Graph *g = v->g;
    const GNode *x = in[0];
    int64_t s[GRAPH_MAX_RANK];
    const int64_t *ia = n->iattr;
    switch (n->op) {
    case G_PARAM:
        if (!n->name || !*n->name) graph_v_fail(v, "a parameter without a name");
        if (!dtype_is_float(n->dt)) graph_v_fail(v, "a parameter must be a float tensor, got %s", graph_v_ntype(n).s);
        if (ia[0] < GI_ZEROS || ia[0] > GI_UNIFORM) graph_v_fail(v, "unknown initialiser %" PRId64, ia[0]);
        if (ia[1] & ~(int64_t)(GP_FROZEN | GP_NO_DECAY)) graph_v_fail(v, "unknown group bits %" PRId64, ia[1]);
        if (ia[2] < 0 || (ia[2] > 0 && (n->rank < 1 || ia[2] >= n->shape[0])))
            graph_v_fail(v, "padded from %" PRId64 " rows, which is not fewer than its %" PRId64, ia[2],
                         n->rank ? n->shape[0] : 0);
        if (ia[0] == GI_NORMAL && !(n->fattr[1] >= 0)) graph_v_fail(v, "normal's std %g is negative", n->fattr[1]);
        if (ia[0] == GI_UNIFORM && !(n->fattr[0] < n->fattr[1]))
            graph_v_fail(v, "uniform's lo %g is not below hi %g", n->fattr[0], n->fattr[1]);
        break;
    case G_INPUT:
        if (!n->name || !*n->name) graph_v_fail(v, "an input without a name");
        break;
    case G_CONST: break;
    case G_ARANGE:
        if (n->rank != 1) graph_v_fail(v, "arange must have rank 1, got %s", graph_v_ntype(n).s);
        graph_v_dtype(v, n, DT_I32, "the result");
        break;
    case G_WHERE: graph_v_where(v, x, in[1], in[2]); break;
    case G_NORM:
        if (n->rank != 0) graph_v_fail(v, "the result must have rank 0, got %s", graph_v_ntype(n).s);
        graph_v_float(v, x, "the input");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_SEG_NORM:
        if (!g->update) graph_v_fail(v, "a segmented norm outside an update graph (no segments)");
        else if (n->rank != 1 || n->shape[0] != g->update->n)
            graph_v_fail(v, "the result must be [%" PRId64 "], the update graph's length, got %s", g->update->n,
                         graph_v_ntype(n).s);
        graph_v_shape_of(v, x, "the input");
        graph_v_float(v, x, "the input");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_SUM_TO: {
        int r;
        if (!graph_v_broadcast(n->rank, n->shape, x->rank, x->shape, &r, s) || !graph_v_same_shape(r, s, x->rank, x->shape))
            graph_v_fail(v, "%s does not sum down to %s", graph_v_ntype(x).s, graph_v_ntype(n).s);
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    }
    case G_SOFTMAX:
    case G_LOG_SOFTMAX:
        graph_v_axis(v, ia[0], x->rank, 0, "axis");
        graph_v_shape_of(v, x, "the input");
        graph_v_float(v, x, "the input");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_LAYERNORM:
    case G_RMSNORM:
        graph_v_float(v, x, "x");
        graph_v_norm_vector(v, x, in[1], "the weight");
        if (n->op == G_LAYERNORM) graph_v_norm_vector(v, x, in[2], "the bias");
        graph_v_shape_of(v, x, "x");
        graph_v_dtype(v, n, x->dt, "the result");
        if (!(n->fattr[0] > 0)) graph_v_fail(v, "eps %g is not positive", n->fattr[0]);
        break;
    case G_ROPE:
    case G_ROPE_BWD: {
        if (x->rank < 2 || x->shape[x->rank - 1] % 2 != 0)
            graph_v_fail(v, "x must be [..., T, hd] with hd even, got %s", graph_v_ntype(x).s);
        graph_v_float(v, x, "x");
        graph_v_shape_of(v, x, "x");
        graph_v_dtype(v, n, x->dt, "the result");
        if (!(n->fattr[0] > 0)) graph_v_fail(v, "theta %g is not positive", n->fattr[0]);
        /* the positions, when given: one a row, i32 [T] (the forward over new tokens, plan/kv.c), or
         * each token's position in its document, i32 [B, T] of x [B, H, T, hd] (iattr[1] set) */
        int rows =
            n->nin > 1 && x->rank >= 2 && in[1]->dt == DT_I32 && in[1]->rank == 1 && in[1]->shape[0] == x->shape[x->rank - 2];
        int docs = n->nin > 1 && in[1]->dt == DT_I32 && in[1]->rank == 2 && x->rank == 4 && in[1]->shape[0] == x->shape[0] &&
                   in[1]->shape[1] == x->shape[2];
        if (n->nin > 1 && !rows && !docs)
            graph_v_fail(v, "the positions %s are neither i32 [T] nor i32 [B, T] of x %s", graph_v_ntype(in[1]).s,
                         graph_v_ntype(x).s);
        if (docs != (n->iattr[1] != 0)) graph_v_fail(v, "document positions and iattr[1] disagree");
        break;
    }
    case G_ATTENTION:
        if (graph_v_attention_shape(v, x, in[1], in[2], s)) graph_v_shape(v, 4, s, "attention of q, k, v");
        if (n->nin > 3) graph_v_attention_pos(v, n, x, in[1], in[3]);
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_KV_ATTENTION:
        if (graph_v_attention_shape(v, x, in[1], in[2], s)) graph_v_shape(v, 4, s, "attention of q, k, v");
        graph_v_dtype(v, n, x->dt, "the result");
        graph_v_dtype(v, in[3], DT_I32, "the kv input");
        if (x->rank != 4 || x->shape[0] != 1 || x->shape[2] != in[1]->shape[2])
            graph_v_fail(v, "q must be [1, H, N, hd] with k's N, got %s", graph_v_ntype(x).s);
        if (ia[1] < 1 || ia[0] < 0 || ia[0] >= ia[1] || ia[2] < 1 || ia[3] < 1)
            graph_v_fail(v, "layer %" PRId64 " of %" PRId64 ", block %" PRId64 ", %" PRId64 " blocks", ia[0], ia[1], ia[2],
                         ia[3]);
        if (n->fattr[1] != DT_F32 && n->fattr[1] != DT_BF16 && n->fattr[1] != DT_F16)
            graph_v_fail(v, "the pool's dtype is not f32, bf16 or f16");
        break;
    case G_CROSS_ENTROPY:
        graph_v_logits_targets(v, x, in[1]);
        if (n->rank != 0) graph_v_fail(v, "the result must have rank 0, got %s", graph_v_ntype(n).s);
        graph_v_float(v, n, "the result");
        break;
    case G_MSE:
        if (!graph_v_same_shape(x->rank, x->shape, in[1]->rank, in[1]->shape) || x->dt != in[1]->dt)
            graph_v_fail(v, "the inputs differ: %s and %s", graph_v_ntype(x).s, graph_v_ntype(in[1]).s);
        graph_v_float(v, x, "the input");
        if (n->rank != 0) graph_v_fail(v, "the result must have rank 0, got %s", graph_v_ntype(n).s);
        graph_v_float(v, n, "the result");
        break;
    case G_ONE_HOT:
        graph_v_dtype(v, x, DT_I32, "the index");
        if (x->rank + 1 > GRAPH_MAX_RANK) graph_v_fail(v, "the result rank is too large");
        else {
            memcpy(s, x->shape, sizeof(int64_t) * (size_t)x->rank);
            s[x->rank] = ia[0];
            graph_v_shape(v, x->rank + 1, s, "one_hot of the index");
        }
        graph_v_float(v, n, "the result");
        break;
    case G_TOPK_VALUES:
    case G_TOPK_INDICES:
        if (!graph_v_axis(v, ia[1], x->rank, 0, "axis")) break;
        if (ia[0] < 1 || ia[0] > x->shape[ia[1]]) {
            graph_v_fail(v, "k = %" PRId64 " is out of range for dimension %" PRId64 " of %s", ia[0], ia[1], graph_v_ntype(x).s);
            break;
        }
        memcpy(s, x->shape, sizeof(int64_t) * (size_t)x->rank);
        s[ia[1]] = ia[0];
        graph_v_shape(v, x->rank, s, "topk");
        graph_v_dtype(v, n, n->op == G_TOPK_VALUES ? x->dt : DT_I32, "the result");
        break;
    default: return 0;
    }
    return 1;
}

/* Matmuls and views: reshape, transpose, slice, gather, concat, broadcast, scatter_add: checks n, returns 1; 0 when n is not one of them. */
static int graph_v_layout(GraphVerify *v, const GNode *n, const GNode *const *in) {
    const GNode *x = in[0];
    int64_t s[GRAPH_MAX_RANK];
    const int64_t *ia = n->iattr;
    switch (n->op) {
    case G_MATMUL: graph_v_matmul(v, x, in[1]); break;
    case G_RESHAPE:
        if (graph_numel(x) != graph_numel(n))
            graph_v_fail(v, "%s has %" PRId64 " elements but %s has %" PRId64, graph_v_ntype(x).s, graph_numel(x),
                         graph_v_ntype(n).s, graph_numel(n));
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_TRANSPOSE:
        if (!graph_v_axis(v, ia[0], x->rank, 0, "axis") || !graph_v_axis(v, ia[1], x->rank, 0, "axis")) break;
        memcpy(s, x->shape, sizeof(int64_t) * (size_t)x->rank);
        s[ia[0]] = x->shape[ia[1]];
        s[ia[1]] = x->shape[ia[0]];
        graph_v_shape(v, x->rank, s, "swapping the axes");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_SLICE:
        if (!graph_v_axis(v, ia[0], x->rank, 0, "axis")) break;
        if (ia[1] < 0 || ia[1] >= ia[2] || ia[2] > x->shape[ia[0]]) {
            graph_v_fail(v, "[%" PRId64 ", %" PRId64 ") is out of range for dimension %" PRId64 " of %s", ia[1], ia[2], ia[0],
                         graph_v_ntype(x).s);
            break;
        }
        memcpy(s, x->shape, sizeof(int64_t) * (size_t)x->rank);
        s[ia[0]] = ia[2] - ia[1];
        graph_v_shape(v, x->rank, s, "the slice");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    case G_GATHER: {
        const GNode *idx = in[1];
        graph_v_dtype(v, idx, DT_I32, "the index");
        if (x->rank < 1 || idx->rank + x->rank - 1 > GRAPH_MAX_RANK) {
            graph_v_fail(v, "cannot gather from %s with %s", graph_v_ntype(x).s, graph_v_ntype(idx).s);
            break;
        }
        int r = 0;
        for (int i = 0; i < idx->rank; i++) s[r++] = idx->shape[i];
        for (int i = 1; i < x->rank; i++) s[r++] = x->shape[i];
        graph_v_shape(v, r, s, "gathering rows");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    }
    case G_CONCAT: {
        if (!graph_v_axis(v, ia[0], x->rank, 0, "axis")) break;
        int64_t total = 0;
        int ok = 1;
        for (int i = 0; i < n->nin; i++) {
            const GNode *it = in[i];
            int same = it->rank == x->rank && it->dt == x->dt;
            for (int k = 0; same && k < x->rank; k++)
                if (k != ia[0] && it->shape[k] != x->shape[k]) same = 0;
            if (!same) {
                graph_v_fail(v, "input %d %s does not match input 0 %s", i, graph_v_ntype(it).s, graph_v_ntype(x).s);
                ok = 0;
            } else {
                total += it->shape[ia[0]];
            }
        }
        if (!ok) break;
        memcpy(s, x->shape, sizeof(int64_t) * (size_t)x->rank);
        s[ia[0]] = total;
        graph_v_shape(v, x->rank, s, "the concatenation");
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    }
    case G_BROADCAST: {
        int r;
        if (!graph_v_broadcast(x->rank, x->shape, n->rank, n->shape, &r, s) || !graph_v_same_shape(r, s, n->rank, n->shape))
            graph_v_fail(v, "%s does not broadcast to %s", graph_v_ntype(x).s, graph_v_ntype(n).s);
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    }
    case G_SCATTER_ADD: {
        const GNode *idx = in[1];
        graph_v_dtype(v, idx, DT_I32, "the index");
        if (n->rank < 1 || idx->rank + n->rank - 1 > GRAPH_MAX_RANK) {
            graph_v_fail(v, "cannot scatter %s into %s", graph_v_ntype(x).s, graph_v_ntype(n).s);
            break;
        }
        int r = 0;
        for (int i = 0; i < idx->rank; i++) s[r++] = idx->shape[i];
        for (int i = 1; i < n->rank; i++) s[r++] = n->shape[i];
        if (!graph_v_same_shape(x->rank, x->shape, r, s))
            graph_v_fail(v, "the rows %s do not match the index %s and the result %s", graph_v_ntype(x).s, graph_v_ntype(idx).s,
                         graph_v_ntype(n).s);
        graph_v_dtype(v, n, x->dt, "the result");
        break;
    }
    default: return 0;
    }
    return 1;
}

/* The backward ops autodiff makes (softmax, the norms, attention, cross-entropy): checks n, returns 1; 0 when n is not one of them. */
static int graph_v_backward(GraphVerify *v, const GNode *n, const GNode *const *in) {
    const GNode *x = in[0];
    int64_t s[GRAPH_MAX_RANK];
    const int64_t *ia = n->iattr;
    switch (n->op) {
    case G_SOFTMAX_BWD:
        graph_v_axis(v, ia[0], x->rank, 0, "axis");
        if (!graph_v_same_shape(x->rank, x->shape, in[1]->rank, in[1]->shape))
            graph_v_fail(v, "dy %s and y %s differ", graph_v_ntype(x).s, graph_v_ntype(in[1]).s);
        graph_v_shape_of(v, in[1], "the softmax output");
        graph_v_dtype(v, n, in[1]->dt, "the result");
        break;
    case G_LAYERNORM_BWD_X:
    case G_RMSNORM_BWD_X:
        if (!graph_v_same_shape(x->rank, x->shape, in[1]->rank, in[1]->shape))
            graph_v_fail(v, "dy %s and x %s differ", graph_v_ntype(x).s, graph_v_ntype(in[1]).s);
        graph_v_norm_vector(v, in[1], in[2], "the weight");
        graph_v_shape_of(v, in[1], "x");
        graph_v_dtype(v, n, in[1]->dt, "the result");
        break;
    case G_LAYERNORM_BWD_W:
    case G_RMSNORM_BWD_W:
        if (!graph_v_same_shape(x->rank, x->shape, in[1]->rank, in[1]->shape))
            graph_v_fail(v, "dy %s and x %s differ", graph_v_ntype(x).s, graph_v_ntype(in[1]).s);
        if (in[1]->rank < 1) {
            graph_v_fail(v, "x must have rank 1 or more");
            break;
        }
        graph_v_shape(v, 1, &in[1]->shape[in[1]->rank - 1], "the weight of x's last dimension");
        graph_v_dtype(v, n, in[1]->dt, "the result");
        break;
    case G_ATTENTION_BWD_Q:
    case G_ATTENTION_BWD_K:
    case G_ATTENTION_BWD_V: {
        if (!graph_v_attention_shape(v, in[1], in[2], in[3], s)) break;
        if (!graph_v_same_shape(x->rank, x->shape, 4, s))
            graph_v_fail(v, "dout %s does not match the attention output %s", graph_v_ntype(x).s,
                         graph_v_type(in[1]->dt, 4, s).s);
        if (n->nin > 4) graph_v_attention_pos(v, n, in[1], in[2], in[4]);
        const GNode *wrt = in[n->op == G_ATTENTION_BWD_Q ? 1 : n->op == G_ATTENTION_BWD_K ? 2 : 3];
        graph_v_shape_of(v, wrt, n->op == G_ATTENTION_BWD_Q ? "q" : n->op == G_ATTENTION_BWD_K ? "k" : "v");
        graph_v_dtype(v, n, wrt->dt, "the result");
        break;
    }
    case G_CROSS_ENTROPY_BWD:
        if (x->rank != 0) graph_v_fail(v, "dloss must have rank 0, got %s", graph_v_ntype(x).s);
        graph_v_logits_targets(v, in[1], in[2]);
        graph_v_shape_of(v, in[1], "the logits");
        graph_v_dtype(v, n, in[1]->dt, "the result");
        break;
    default: return 0;
    }
    return 1;
}
static void graph_v_node(GraphVerify *v, const GNode *n) {
    const GNode *in[GRAPH_MAX_IN] = {0};
    if (!graph_v_frame(v, n, in)) return;
    if (graph_is_unary(n->op)) graph_v_unary(v, in[0]);
    else if (graph_is_binary(n->op)) graph_v_binary(v, in[0], in[1]);
    else if (graph_is_reduce(n->op)) graph_v_reduce(v, in[0]);
    else if (!graph_v_leaf(v, n, in) && !graph_v_layout(v, n, in) && !graph_v_backward(v, n, in))
        graph_v_fail(v, "no rule for this op");
}

/* An update graph: segments in order inside [0, n), and its roles are nodes of the right kind
 * and shape (inputs f32[n] G_INPUT with their names, lr and t f32[] inputs, results f32[n]). */
static void graph_v_role(GraphVerify *v, int id, int input, int scalar, const char *name) {
    const Graph *g = v->g;
    if (id < 0 || id >= g->n || !g->node[id]) {
        graph_v_fail(v, "update: %s is %%%d, not a node", name, id);
        return;
    }
    const GNode *n = g->node[id];
    int64_t len = g->update->n;
    if (input && (n->op != G_INPUT || !n->name || strcmp(n->name, name) != 0))
        graph_v_fail(v, "update: %s is %%%d, not the input named '%s'", name, id, name);
    if (n->dt != DT_F32 || (scalar ? n->rank != 0 : !graph_v_same_shape(n->rank, n->shape, 1, &len)))
        graph_v_fail(v, "update: %s %%%d is %s, not f32[%s]", name, id, graph_v_ntype(n).s, scalar ? "" : "n");
}

static void graph_v_update(GraphVerify *v) {
    const GraphUpdate *u = v->g->update;
    if (u->n < 1) graph_v_fail(v, "update: length %" PRId64 " is not positive", u->n);
    if (u->decay_end < 0 || u->decay_end > u->n || u->n > u->n_params)
        graph_v_fail(v, "update: the groups' ends %" PRId64 " <= %" PRId64 " <= %" PRId64 " do not hold", u->decay_end, u->n,
                     u->n_params);
    int64_t end = 0;
    for (int i = 0; i < u->nsegs; i++) {
        int64_t lim = u->seg_off[i] < u->n ? u->n : u->n_params; /* a frozen one lies past n */
        if (u->seg_off[i] < end || u->seg_len[i] < 1 || u->seg_off[i] + u->seg_len[i] > lim)
            graph_v_fail(v, "update: segment %d [%" PRId64 ", +%" PRId64 ") overlaps the previous one or leaves [0, %" PRId64 ")",
                         i, u->seg_off[i], u->seg_len[i], lim);
        end = u->seg_off[i] + u->seg_len[i];
    }
    graph_v_role(v, u->p_in, 1, 0, "p");
    graph_v_role(v, u->g_in, 1, 0, "g");
    graph_v_role(v, u->t_in, 1, 1, "t");
    if (u->lr_in >= 0) graph_v_role(v, u->lr_in, 1, 1, "lr");
    graph_v_role(v, u->p_out, 0, 0, "the new p");
    if (u->cast_out >= 0) {
        const GNode *c = u->cast_out < v->g->n ? v->g->node[u->cast_out] : NULL;
        if (!c || c->op != G_CAST || c->nin != 1 || c->in[0] != u->p_out || (c->dt != DT_BF16 && c->dt != DT_F16) ||
            c->rank != 1 || c->shape[0] != u->n)
            graph_v_fail(v, "update: cast_out %%%d is not a half-precision cast of the new p", u->cast_out);
    }
    for (int i = 0; i < u->nstate; i++) {
        char name[128];
        snprintf(name, sizeof name, "state.%s", u->state_name[i] ? u->state_name[i] : "?");
        graph_v_role(v, u->state_in[i], 1, 0, name);
        graph_v_role(v, u->state_out[i], 0, 0, name);
    }
}

int graph_verify(const Graph *g, FILE *out) {
    GraphVerify v = {g, out, 0, NULL};
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        if (!n) {
            v.n = NULL;
            graph_v_fail(&v, "%%%d is missing", id);
            continue;
        }
        v.n = n;
        if (n->id != id) graph_v_fail(&v, "stored at %%%d but its id is %d", id, n->id);
        graph_v_node(&v, n);
    }
    v.n = NULL;
    if (g->loss != -1) {
        if (g->loss < 0 || g->loss >= g->n) graph_v_fail(&v, "the loss %%%d is not a node", g->loss);
        else if (g->node[g->loss]->rank != 0 || !dtype_is_float(g->node[g->loss]->dt))
            graph_v_fail(&v, "the loss %%%d is %s, not a float scalar", g->loss, graph_v_ntype(g->node[g->loss]).s);
    }
    for (int k = 0; k < g->nstats; k++) {
        int in = g->stat_in[k], e = g->stat_expr[k];
        if (in < 0 || in >= g->n || e < 0 || e >= in || !g->node[in] || !g->node[e]) {
            graph_v_fail(&v, "statistic %d: %%%d = global_mean(%%%d) is not an input after its expression", k, in, e);
            continue;
        }
        const GNode *ni = g->node[in], *ne = g->node[e];
        if (ni->op != G_INPUT || ni->dt != DT_F32 || ni->rank != ne->rank || graph_numel(ni) != graph_numel(ne))
            graph_v_fail(&v, "statistic %d: %%%d is not an f32 input shaped like %%%d", k, in, e);
    }
    int nparam = 0;
    for (int id = 0; id < g->n; id++) nparam += g->node[id] && g->node[id]->op == G_PARAM;
    if (nparam != g->nparams) graph_v_fail(&v, "%d parameter nodes but %d listed in params", nparam, g->nparams);
    for (int i = 0; i < g->nparams; i++) {
        int p = g->params[i];
        if (p < 0 || p >= g->n || !g->node[p] || g->node[p]->op != G_PARAM) {
            graph_v_fail(&v, "params[%d] = %%%d is not a parameter node", i, p);
            continue;
        }
        for (int j = 0; j < i; j++)
            if (g->params[j] == p) graph_v_fail(&v, "params[%d] and params[%d] are both %%%d", j, i, p);
        const char *name = g->node[p]->name;
        for (int j = 0; j < i && name; j++) {
            int q = g->params[j];
            if (q >= 0 && q < g->n && g->node[q] && g->node[q]->name && q != p && strcmp(g->node[q]->name, name) == 0)
                graph_v_fail(&v, "parameters %%%d and %%%d are both named '%s'", q, p, name);
        }
        if (!g->grads) continue;
        int d = g->grads[i];
        if (d < 0 || d >= g->n || !g->node[d]) {
            graph_v_fail(&v, "the gradient of %%%d is %%%d, not a node", p, d);
            continue;
        }
        const GNode *pn = g->node[p], *dn = g->node[d];
        if (!graph_v_same_shape(pn->rank, pn->shape, dn->rank, dn->shape) || pn->dt != dn->dt)
            graph_v_fail(&v, "the gradient %%%d of %%%d is %s, not %s", d, p, graph_v_ntype(dn).s, graph_v_ntype(pn).s);
    }
    if (g->update) graph_v_update(&v);
    return v.problems;
}
