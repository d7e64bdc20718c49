/* graph_build.c - the forward graph IR of a train block, built while sema instantiates it.
 *
 * Pipeline position: sema (eval.c evaluates, settings.c checks the train block, build.c drives
 * the build) -> [graph_build] -> graph IR (graph.h) -> autodiff. The checker already walks the
 * train block's model with
 * concrete constants, unrolling every loop and evaluating every call inline; the hooks here
 * (graph_build.h) are called at each place that walk makes a tensor and append the op that
 * made it, so what `--check` accepts is exactly what gets built. Rules followed:
 *   - node ids live in Value.graph_id as id + 1 (0 = none);
 *   - a number next to a tensor becomes a rank-0 G_CONST of the dtype the op computes in, and an
 *     operand of another dtype gets a G_CAST (bool masks in arithmetic, i32 in true division,
 *     mean of integers), so every elementwise op sees inputs of one dtype (graph.h);
 *   - axes are normalised to >= 0; a reduction over everything has axis -1;
 *   - integer selection x[:, 0] is a slice and a reshape dropping the axis; split is one slice
 *     per part; topk two nodes; concat of more than GRAPH_MAX_CONCAT items a chain;
 *   - parameters are named after instantiation by their path from the model (sema walks its
 *     members, sub-models and lists of them by index): `h.3.attn.c_attn.weight`.
 * Then, for sema_build_train, the update graph: graph_build_update.c. Anything else is a located
 * user error ("... is not supported yet"), never an assertion. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "graph_build_internal.h"
#include "graph_pad.h"

/* ---- errors ---- */

/* Stops the build. The message is reported only when the program had no error before: a value
 * the builder cannot follow after an error is a consequence of that error. 1 when reported. */
int gb_fail(GraphBuilder *gb, Span at, const char *fmt, ...) {
    if (gb->failed) return 0;
    gb->failed = 1;
    if (diag_error_count() > gb->errors_before) return 0;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag_error(at, "building the %s graph: %s", gb->updating ? "optimizer" : "training", msg);
    return 1;
}

void gb_unsupported(GraphBuilder *gb, Span at, const char *what) {
    if (gb) gb_fail(gb, at, "%s is not supported yet", what);
}

/* The hooks' common guard: building, and r a fresh tensor (one already in the graph, such as a
 * value passed through unchanged, keeps its node). */
static int gb_wants(GraphBuilder *gb, const Value *r) {
    return gb && !gb->failed && r && r->kind == V_TENSOR && r->graph_id == 0;
}

/* ---- nodes ---- */

/* The concrete shape of t into shape; 0 after an error. */
static int gb_dims(GraphBuilder *gb, const TensorType *t, int64_t *shape, Span at) {
    if (t->rank > GRAPH_MAX_RANK) {
        gb_fail(gb, at, "a tensor of rank %d is not supported yet (at most %d dimensions)", t->rank, GRAPH_MAX_RANK);
        return 0;
    }
    for (int i = 0; i < t->rank; i++) {
        int64_t k;
        if (!t->dims || !t->dims[i] || !dim_const(t->dims[i], &k) || k <= 0) {
            gb_fail(gb, at,
                    "the shape %s is not known at compile time (only concrete shapes "
                    "are supported yet)",
                    tensor_type_str(gb->ar, t));
            return 0;
        }
        shape[i] = k;
    }
    int64_t numel = 1;
    for (int i = 0; i < t->rank; i++) {
        if (shape[i] > GB_MAX_NUMEL / numel) {
            gb_fail(gb, at, "the tensor %s has more than 2^62 elements", tensor_type_str(gb->ar, t));
            return 0;
        }
        numel *= shape[i];
    }
    return 1;
}

GNode *gb_node(GraphBuilder *gb, int id) { return graph_node(gb->g, id); }

/* Appends a node; -1 (adding nothing) when an input is missing after an error. */
int gb_add(GraphBuilder *gb, GOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in, Span at) {
    if (gb->failed) return -1;
    for (int i = 0; i < nin; i++)
        if (in[i] < 0) return -1;
    return graph_add(gb->g, op, dt, rank, shape, nin, in, at);
}

/* The graph's "rng" input (graph.h: dropout's key), made at its first dropout. Its id or -1. */
static int gb_rng(GraphBuilder *gb, Span at) {
    if (gb->rng > 0) return gb->rng - 1;
    int64_t words = GRAPH_RNG_WORDS;
    int id = gb_add(gb, G_INPUT, DT_I64, 1, &words, 0, NULL, at);
    if (id < 0) return -1;
    gb_node(gb, id)->name = GRAPH_RNG_NAME;
    gb->rng = id + 1;
    return id;
}

/* Appends the node that makes tensor r and records it in r. Returns its id or -1. */
int gb_result(GraphBuilder *gb, Value *r, GOp op, int nin, const int *in, Span at) {
    int64_t shape[GRAPH_MAX_RANK];
    if (gb->failed || !gb_dims(gb, &r->t, shape, at)) return -1;
    int rank = r->t.rank;
    if (gb->updating && rank == 0) /* a scalar per parameter: lifted to f32[n] (graph_build.h) */
        for (int i = 0; i < nin; i++)
            if (in[i] >= 0 && gb_node(gb, in[i])->rank == 1) {
                rank = 1;
                shape[0] = gb_node(gb, in[i])->shape[0];
            }
    int id = gb_add(gb, op, r->t.dt, rank, shape, nin, in, at);
    if (id >= 0) r->graph_id = id + 1;
    return id;
}

/* r is the same tensor as node id (x.T.T aside: reshape to the same shape, float(x) of an f32). */
static void gb_alias(Value *r, int id) {
    if (id >= 0) r->graph_id = id + 1;
}

int gb_const(GraphBuilder *gb, DType dt, double x, Span at) {
    int id = gb_add(gb, G_CONST, dt, 0, NULL, 0, NULL, at);
    if (id >= 0) gb_node(gb, id)->fattr[0] = x;
    return id;
}

/* A tensor's node cast to dt (dt < 0: as it is). */
static int gb_cast(GraphBuilder *gb, int id, int dt, Span at) {
    if (id < 0 || dt < 0) return id;
    const GNode *n = gb_node(gb, id);
    if ((int)n->dt == dt) return id;
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n->shape, sizeof(int64_t) * (size_t)n->rank);
    return gb_add(gb, G_CAST, (DType)dt, n->rank, shape, 1, &id, at);
}

/* The node of an operand: a tensor's own, cast to dt when dt >= 0; a number known at compile
 * time becomes a rank-0 constant of dtype dt (dt < 0: f32 for floats, i32 for integers, bool). */
static int gb_operand(GraphBuilder *gb, const Value *v, int dt, Span at) {
    if (gb->failed) return -1;
    if (!v) {
        gb_fail(gb, at, "a call without this operand is not supported yet");
        return -1;
    }
    if (v->kind == V_TENSOR) {
        if (v->graph_id <= 0) {
            gb_fail(gb, at, "following the tensor %s made here is not supported yet", tensor_type_str(gb->ar, &v->t));
            return -1;
        }
        if (v->graph_id > gb->g->n) INTERNAL("graph builder: a value names node %d of %d", v->graph_id - 1, gb->g->n);
        return gb_cast(gb, v->graph_id - 1, dt, at);
    }
    double x = 0;
    DType def = DT_F32;
    int known = 0;
    if (v->kind == V_BOOL) {
        known = v->bknown;
        x = v->b;
        def = DT_BOOL;
    } else if (v->kind == V_INT || v->kind == V_FLOAT) {
        known = value_number(v, &x);
        def = v->kind == V_INT ? DT_I32 : DT_F32;
    }
    if (!known) {
        gb_fail(gb, at,
                "%s, a value not known at compile time, next to a tensor is not "
                "supported yet",
                value_type_str(gb->ar, v));
        return -1;
    }
    return gb_const(gb, dt >= 0 ? (DType)dt : def, x, at);
}

/* The dtype two operands are compared in (shape.c's rule for elementwise ops: floats win,
 * then the wider integer; a number takes the tensor's dtype unless it needs more). */
static DType gb_join(const Value *a, const Value *b) {
    if (a->kind == V_TENSOR && b->kind == V_TENSOR) {
        DType x = a->t.dt, y = b->t.dt;
        if (dtype_is_float(x) || dtype_is_float(y)) return dtype_is_float(x) ? x : y;
        if (x == DT_I64 || y == DT_I64) return DT_I64;
        if (x == DT_I32 || y == DT_I32) return DT_I32;
        return DT_BOOL;
    }
    const Value *t = a->kind == V_TENSOR ? a : b, *s = t == a ? b : a;
    if (s->kind == V_FLOAT) return dtype_is_float(t->t.dt) ? t->t.dt : DT_F32;
    if (s->kind == V_INT) return t->t.dt == DT_BOOL ? DT_I32 : t->t.dt;
    return t->t.dt;
}

/* ---- arguments known at compile time ---- */

static int gb_number(GraphBuilder *gb, const Value *v, double def, double *out, Span at, const char *what) {
    *out = def;
    if (!v) return 1;
    if (value_number(v, out)) return 1;
    gb_fail(gb, at, "%s not known at compile time is not supported yet", what);
    return 0;
}

static int gb_int(GraphBuilder *gb, const Value *v, int64_t *out, Span at, const char *what) {
    if (v && v->kind == V_INT && v->dim && dim_const(v->dim, out)) return 1;
    gb_fail(gb, at, "%s not known at compile time is not supported yet", what);
    return 0;
}

/* An axis argument normalised for rank (def when absent). */
static int gb_axis(GraphBuilder *gb, const Value *v, int64_t def, int rank, int64_t *out, Span at) {
    int64_t a = def;
    if (v && !gb_int(gb, v, &a, at, "an axis")) return 0;
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) {
        gb_fail(gb, at, "axis %lld is out of range for rank %d", (long long)a, rank);
        return 0;
    }
    *out = a;
    return 1;
}

/* A bool flag argument (def when absent). */
static int gb_flag(GraphBuilder *gb, const Value *v, int def, int *out, Span at, const char *what) {
    *out = def;
    if (!v) return 1;
    if (v->kind == V_BOOL && v->bknown) {
        *out = v->b;
        return 1;
    }
    gb_fail(gb, at, "%s not known at compile time is not supported yet", what);
    return 0;
}

/* ---- operators ---- */

static GOp gb_binary_op(Op op) {
    switch (op) {
    case OP_ADD: return G_ADD;
    case OP_SUB: return G_SUB;
    case OP_MUL: return G_MUL;
    case OP_DIV: return G_DIV;
    case OP_MOD: return G_MOD;
    case OP_POW: return G_POW;
    case OP_MATMUL: return G_MATMUL;
    case OP_EQ: return G_EQ;
    case OP_NE: return G_NE;
    case OP_LT: return G_LT;
    case OP_LE: return G_LE;
    case OP_GT: return G_GT;
    case OP_GE: return G_GE;
    case OP_AND: return G_AND;
    case OP_OR: return G_OR;
    default: return G_OP_COUNT;
    }
}

void gb_binary(GraphBuilder *gb, Op op, Value *a, Span sa, Value *b, Span sb, Value *r, Span at) {
    if (!gb_wants(gb, r)) return;
    GOp g = gb_binary_op(op);
    if (g == G_MATMUL && gb->updating) {
        gb_unsupported(gb, at, "'@' inside an optimizer's update (it runs elementwise)");
        return;
    }
    if (g == G_OP_COUNT) {
        gb_unsupported(gb, at, arena_printf(gb->ar, "the operator '%s' on tensors", ast_op_text(op)));
        return;
    }
    int dt;
    if (g == G_MATMUL) dt = -1;
    else if (g >= G_EQ && g <= G_GE) dt = (int)gb_join(a, b);
    else if (g == G_AND || g == G_OR) dt = DT_BOOL;
    else dt = (int)r->t.dt;
    int in[2] = {gb_operand(gb, a, dt, sa), -1};
    in[1] = gb_operand(gb, b, dt, sb);
    gb_result(gb, r, g, 2, in, at);
}

void gb_unary(GraphBuilder *gb, Op op, Value *a, Value *r, Span at) {
    if (!gb_wants(gb, r)) return;
    int x = gb_operand(gb, a, (int)r->t.dt, at);
    if (op == OP_POS) gb_alias(r, x);
    else gb_result(gb, r, op == OP_NOT ? G_NOT : G_NEG, 1, &x, at);
}

/* x.T: the last two axes swapped. */
static void gb_transpose(GraphBuilder *gb, int x, int64_t i, int64_t j, Value *r, Span at) {
    if (i == j) {
        gb_alias(r, x);
        return;
    }
    int id = gb_result(gb, r, G_TRANSPOSE, 1, &x, at);
    if (id < 0) return;
    gb_node(gb, id)->iattr[0] = i < j ? i : j;
    gb_node(gb, id)->iattr[1] = i < j ? j : i;
}

void gb_attr(GraphBuilder *gb, Value *base, Str name, Value *r, Span at) {
    if (!gb_wants(gb, r) || base->kind != V_TENSOR || !str_eqc(name, "T")) return;
    if (gb->updating) {
        gb_unsupported(gb, at, "'.T' inside an optimizer's update (it runs elementwise)");
        return;
    }
    int x = gb_operand(gb, base, -1, at);
    gb_transpose(gb, x, r->t.rank - 2, r->t.rank - 1, r, at);
}

/* A slice bound or position: negative counts from the end of a dimension of size `size`. */
static int gb_position(GraphBuilder *gb, const Value *v, int64_t size, int64_t *out, Span at) {
    if (!gb_int(gb, v, out, at, "a slice bound or index")) return 0;
    if (*out < 0) *out += size;
    return 1;
}

static int gb_slice(GraphBuilder *gb, int x, int64_t axis, int64_t lo, int64_t hi, Span at) {
    if (x < 0) return -1;
    const GNode *n = gb_node(gb, x);
    if (lo < 0 || lo >= hi || hi > n->shape[axis]) {
        gb_fail(gb, at, "the slice [%lld, %lld) of dimension %lld (size %lld) is out of range", (long long)lo, (long long)hi,
                (long long)axis, (long long)n->shape[axis]);
        return -1;
    }
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n->shape, sizeof(int64_t) * (size_t)n->rank);
    shape[axis] = hi - lo;
    int id = gb_add(gb, G_SLICE, n->dt, n->rank, shape, 1, &x, at);
    if (id >= 0) {
        GNode *s = gb_node(gb, id);
        s->iattr[0] = axis;
        s->iattr[1] = lo;
        s->iattr[2] = hi;
    }
    return id;
}

void gb_index(GraphBuilder *gb, Value *base, Value **idx, const int *is_slice, Value **lo, Value **hi, int nidx, Value *r,
              Span at) {
    if (!gb_wants(gb, r) || base->kind != V_TENSOR) return;
    if (gb->updating) {
        gb_unsupported(gb, at, "indexing inside an optimizer's update (it runs elementwise)");
        return;
    }
    int x = gb_operand(gb, base, -1, at);
    if (x < 0) return;
    if (nidx == 1 && !is_slice[0] && idx[0] && idx[0]->kind == V_TENSOR) { /* gather: w[idx] */
        int in[2] = {x, gb_operand(gb, idx[0], DT_I32, at)};
        gb_result(gb, r, G_GATHER, 2, in, at);
        return;
    }
    int dropped = 0;
    for (int i = 0; i < nidx && i < base->t.rank; i++) {
        int64_t size = gb_node(gb, x)->shape[i], a = 0, b = size;
        if (is_slice[i]) {
            if (lo && lo[i] && !gb_position(gb, lo[i], size, &a, at)) return;
            if (hi && hi[i] && !gb_position(gb, hi[i], size, &b, at)) return;
        } else {
            if (!gb_position(gb, idx[i], size, &a, at)) return;
            b = a + 1;
            dropped = 1;
        }
        if (a == 0 && b == size) continue;
        x = gb_slice(gb, x, i, a, b, at);
        if (x < 0) return;
    }
    if (dropped) gb_result(gb, r, G_RESHAPE, 1, &x, at);
    else gb_alias(r, x);
}

/* ---- builtins ---- */

/* The argument given for the builtin's i-th parameter (positional or keyword), or NULL. */
static Value *gb_arg(const Builtin *b, const CallArgs *a, int i, Span *at) {
    const char *name = builtin_param(b, i);
    *at = a->at;
    if (!name) return NULL;
    if (i < a->npos) {
        *at = a->pos_at[i];
        return a->pos[i];
    }
    for (int k = 0; k < a->nkw; k++)
        if (str_eqc(a->kw_name[k], name)) {
            *at = a->kw_at[k];
            return a->kw[k];
        }
    return NULL;
}

static const struct {
    const char *name;
    GOp op;
} gb_math[] = {
    {"exp", G_EXP},
    {"log", G_LOG},
    {"sqrt", G_SQRT},
    {"rsqrt", G_RSQRT},
    {"tanh", G_TANH},
    {"sigmoid", G_SIGMOID},
    {"relu", G_RELU},
    {"gelu", G_GELU},
    {"silu", G_SILU},
    {"abs", G_ABS},
    {"sign", G_SIGN},
    {"sin", G_SIN},
    {"cos", G_COS},
    {"floor", G_FLOOR},
    {"matmul", G_MATMUL},
    {"cross_entropy", G_CROSS_ENTROPY},
    {"mse", G_MSE},
    {"softmax", G_SOFTMAX},
    {"log_softmax", G_LOG_SOFTMAX},
    {"logsumexp", G_LOGSUMEXP},
    {"sum", G_SUM},
    {"mean", G_MEAN},
    {"max", G_MAX},
    {"min", G_MIN},
};

static GOp gb_builtin_op(const char *name) {
    for (size_t i = 0; i < sizeof gb_math / sizeof *gb_math; i++)
        if (strcmp(gb_math[i].name, name) == 0) return gb_math[i].op;
    return G_OP_COUNT;
}

static void gb_split(GraphBuilder *gb, const Builtin *b, const CallArgs *a, Value *r) {
    Span xat, axat;
    Value *xv = gb_arg(b, a, 0, &xat), *axv = gb_arg(b, a, 2, &axat);
    if (!xv || xv->kind != V_TENSOR || r->kind != V_TUPLE) return;
    int x = gb_operand(gb, xv, -1, xat);
    int64_t axis, off = 0;
    if (x < 0 || !gb_axis(gb, axv, -1, xv->t.rank, &axis, axat)) return;
    for (int i = 0; i < r->n; i++) {
        Value *part = r->items[i];
        int64_t size;
        if (!gb_wants(gb, part) || !part->t.dims || !dim_const(part->t.dims[axis], &size)) {
            gb_unsupported(gb, a->at, "a split whose part sizes are not known at compile time");
            return;
        }
        int id = gb_slice(gb, x, axis, off, off + size, a->at);
        if (id < 0) return;
        gb_alias(part, id);
        off += size;
    }
}

static void gb_concat(GraphBuilder *gb, const Builtin *b, const CallArgs *a, Value *r) {
    Span xsat, axat;
    Value *xs = gb_arg(b, a, 0, &xsat), *axv = gb_arg(b, a, 1, &axat);
    if (!xs || (xs->kind != V_LIST && xs->kind != V_TUPLE) || xs->n < 1) return;
    int64_t axis;
    if (!gb_axis(gb, axv, -1, r->t.rank, &axis, axat)) return;
    if (xs->n == 1) {
        gb_alias(r, gb_operand(gb, xs->items[0], -1, xsat));
        return;
    }
    int64_t shape[GRAPH_MAX_RANK];
    if (!gb_dims(gb, &r->t, shape, a->at)) return;
    int acc = -1, i = 0;
    int64_t total = 0;
    while (i < xs->n) {
        int in[GRAPH_MAX_CONCAT], k = 0;
        if (acc >= 0) in[k++] = acc;
        for (; k < GRAPH_MAX_CONCAT && i < xs->n; i++) {
            in[k] = gb_operand(gb, xs->items[i], -1, xsat);
            if (in[k] < 0) return;
            total += gb_node(gb, in[k])->shape[axis];
            k++;
        }
        int id;
        if (i == xs->n) {
            id = gb_result(gb, r, G_CONCAT, k, in, a->at);
        } else { /* more than GRAPH_MAX_CONCAT items: a chain of concats */
            shape[axis] = total;
            id = gb_add(gb, G_CONCAT, r->t.dt, r->t.rank, shape, k, in, a->at);
        }
        if (id < 0) return;
        gb_node(gb, id)->iattr[0] = axis;
        acc = id;
    }
}

static void gb_topk(GraphBuilder *gb, const Builtin *b, const CallArgs *a, Value *r) {
    Span xat, kat, axat;
    Value *xv = gb_arg(b, a, 0, &xat), *kv = gb_arg(b, a, 1, &kat), *axv = gb_arg(b, a, 2, &axat);
    if (!xv || xv->kind != V_TENSOR || r->kind != V_TUPLE || r->n != 2 || !gb_wants(gb, r->items[0]) ||
        !gb_wants(gb, r->items[1]))
        return;
    int x = gb_operand(gb, xv, -1, xat);
    int64_t k, axis;
    if (x < 0 || !gb_int(gb, kv, &k, kat, "topk's k") || !gb_axis(gb, axv, -1, xv->t.rank, &axis, axat)) return;
    for (int i = 0; i < 2; i++) {
        int id = gb_result(gb, r->items[i], i ? G_TOPK_INDICES : G_TOPK_VALUES, 1, &x, a->at);
        if (id < 0) return;
        gb_node(gb, id)->iattr[0] = k;
        gb_node(gb, id)->iattr[1] = axis;
    }
}

/* 1 when node id depends on one of the graph's statistics (a global_mean). */
static int gb_uses_stat(GraphBuilder *gb, int id) {
    Graph *g = gb->g;
    if (g->nstats == 0) return 0;
    char *seen = arena_alloc(gb->ar, (size_t)id + 1);
    seen[id] = 1;
    for (int i = id; i >= 0; i--) {
        if (!seen[i]) continue;
        const GNode *n = g->node[i];
        for (int k = 0; k < g->nstats; k++)
            if (g->stat_in[k] == i) return 1;
        for (int j = 0; j < n->nin; j++) seen[n->in[j]] = 1;
    }
    return 0;
}

/* global_mean(x) (docs/language.md): in the step graph a new f32 input "stat.K", recorded with x's
 * node as its statistic (Graph.stat_in, stat_expr); the runtime and the reference evaluator feed
 * it the mean of x over the step's micro-batches. Generation's batch-1 forward has no step: there
 * the batch is all there is, and the mean over it is x itself. */
static void gb_global_mean(GraphBuilder *gb, Value *x, Span xat, Value *r, Span at) {
    int e = gb_operand(gb, x, DT_F32, xat);
    if (e < 0) return;
    if (gb->is_forward) {
        gb_alias(r, e);
        return;
    }
    if (gb_uses_stat(gb, e)) {
        if (gb_fail(gb, xat, "global_mean of a value computed from another global_mean is not supported"))
            diag_hint("one statistics pass over the step's micro-batches computes every global_mean before the loss: a "
                      "statistic cannot wait for another");
        return;
    }
    int id = gb_result(gb, r, G_INPUT, 0, NULL, at);
    if (id < 0) return;
    gb_node(gb, id)->name = arena_printf(gb->g->ar, "stat.%d", gb->g->nstats);
    graph_add_stat(gb->g, id, e);
}

/* running(buf, x, momentum) (docs/language.md): buf's own value, here and in generation's forward;
 * in the step graph x also becomes a statistic (as global_mean's, though nothing in the step reads
 * its input) and (buf, that statistic, momentum) a running update the runtime applies after each
 * optimizer step. buf must be a parameter; it becomes frozen (no gradient, no optimizer state). */
static void gb_running(GraphBuilder *gb, Value *buf, Span bat, Value *x, Span xat, Value *mv, Span mat, Value *r, Span at) {
    if (gb->updating) {
        gb_fail(gb, at, "running in an optimizer's update is not supported");
        return;
    }
    int b = gb_operand(gb, buf, -1, bat);
    if (b < 0) return;
    GNode *p = gb_node(gb, b);
    if (p->op == G_CAST && gb_node(gb, p->in[0])->op == G_PARAM) p = gb_node(gb, p->in[0]); /* bf16: its f32 master */
    if (p->op != G_PARAM || p->dt != DT_F32) {
        if (gb_fail(gb, bat, "running: the buffer must be an f32 parameter of the model (a `param` member)"))
            diag_hint("declare it as `running_mean = param f32[d] ~ zeros` and pass it by name");
        return;
    }
    double m;
    if (!gb_number(gb, mv, 0.1, &m, mat, "running's momentum")) return;
    gb_alias(r, b);
    if (gb->is_forward) return;
    for (int i = 0; i < gb->g->nrunning; i++)
        if (gb->g->run_param[i] == p->id) {
            gb_fail(gb, bat, "running: this buffer already has a running update (a layer with running statistics called twice?)");
            return;
        }
    int e = gb_operand(gb, x, DT_F32, xat);
    if (e < 0) return;
    if (gb_uses_stat(gb, e)) {
        gb_fail(gb, xat, "running of a value computed from a global_mean is not supported");
        return;
    }
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, p->shape, sizeof(int64_t) * (size_t)p->rank);
    int in = gb_add(gb, G_INPUT, DT_F32, p->rank, shape, 0, NULL, xat);
    if (in < 0) return;
    gb_node(gb, in)->name = arena_printf(gb->g->ar, "stat.%d", gb->g->nstats);
    graph_add_stat(gb->g, in, e);
    graph_add_running(gb->g, p->id, gb->g->nstats - 1, m);
    p->iattr[1] |= GP_FROZEN;
}

/* The builtins an optimizer's update may use on tensors: elementwise ones, and norm (per parameter). */
static int gb_update_builtin(const char *name, const CallArgs *a) {
    static const char *const ok[] = {"exp",  "log", "sqrt", "rsqrt", "tanh",  "sigmoid", "relu", "gelu",  "silu", "abs",
                                     "sign", "sin", "cos",  "floor", "where", "clamp",   "norm", "float", "int"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (strcmp(name, ok[i]) == 0) return 1;
    return (strcmp(name, "max") == 0 || strcmp(name, "min") == 0) && a->npos == 2 && a->nkw == 0;
}

void gb_builtin(GraphBuilder *gb, const Builtin *b, const CallArgs *a, Value *r) {
    if (!gb || gb->failed || !b || !r) return;
    const char *name = builtin_name(b);
    if (gb->updating && !gb_update_builtin(name, a) && (r->kind == V_TENSOR || r->kind == V_TUPLE || r->kind == V_LIST)) {
        gb_unsupported(gb, a->at,
                       arena_printf(gb->ar,
                                    "'%s' inside an optimizer's update (it runs elementwise; norm(x) is "
                                    "the one reduction, per parameter)",
                                    name));
        return;
    }
    if (strcmp(name, "split") == 0) {
        gb_split(gb, b, a, r);
        return;
    }
    if (strcmp(name, "topk") == 0) {
        gb_topk(gb, b, a, r);
        return;
    }
    if (!gb_wants(gb, r)) return;
    if (strcmp(name, "concat") == 0) {
        gb_concat(gb, b, a, r);
        return;
    }
    Span at = a->at, s0, s1, s2, s3;
    Value *v0 = gb_arg(b, a, 0, &s0), *v1 = gb_arg(b, a, 1, &s1);
    Value *v2 = gb_arg(b, a, 2, &s2), *v3 = gb_arg(b, a, 3, &s3);
    int dt = (int)r->t.dt;
    int id = -1, in[4];
    GOp op = gb_builtin_op(name);
    int x_tensor = v0 && v0->kind == V_TENSOR;
    if ((op == G_MAX || op == G_MIN) && a->npos == 2) { /* max(a, b): elementwise */
        in[0] = gb_operand(gb, v0, dt, s0);
        in[1] = gb_operand(gb, v1, dt, s1);
        gb_result(gb, r, op == G_MAX ? G_MAX2 : G_MIN2, 2, in, at);
        return;
    }
    if (((op >= G_SUM && op <= G_LOGSUMEXP) || op == G_SOFTMAX || op == G_LOG_SOFTMAX) && !x_tensor) return;
    if (op >= G_SUM && op <= G_LOGSUMEXP) { /* reductions */
        int keep = 0;
        int64_t axis = -1;
        int all = op != G_LOGSUMEXP && (!v1 || v1->kind == V_NONE);
        in[0] = gb_operand(gb, v0, dt, s0);
        if (!all && !gb_axis(gb, v1, -1, v0->t.rank, &axis, s1)) return;
        if (!gb_flag(gb, v2, 0, &keep, s2, "keepdim")) return;
        id = gb_result(gb, r, op, 1, in, at);
        if (id < 0) return;
        gb_node(gb, id)->iattr[0] = all ? -1 : axis;
        gb_node(gb, id)->iattr[1] = keep;
        return;
    }
    if (op == G_SOFTMAX || op == G_LOG_SOFTMAX) {
        int64_t axis;
        in[0] = gb_operand(gb, v0, -1, s0);
        if (!gb_axis(gb, v1, -1, v0->t.rank, &axis, s1)) return;
        id = gb_result(gb, r, op, 1, in, at);
        if (id >= 0) gb_node(gb, id)->iattr[0] = axis;
        return;
    }
    if (op == G_CROSS_ENTROPY || op == G_MSE) { /* half-precision inputs are computed in f32, the loss's dtype */
        int half = x_tensor && (v0->t.dt == DT_BF16 || v0->t.dt == DT_F16);
        in[0] = gb_operand(gb, v0, half ? DT_F32 : -1, s0);
        in[1] = gb_operand(gb, v1, op == G_MSE ? (half ? DT_F32 : -1) : DT_I32, s1);
        gb_result(gb, r, op, 2, in, at);
        return;
    }
    if (op != G_OP_COUNT) { /* elementwise math, matmul: the inputs as they are */
        in[0] = gb_operand(gb, v0, -1, s0);
        if (op == G_MATMUL) in[1] = gb_operand(gb, v1, -1, s1);
        gb_result(gb, r, op, op == G_MATMUL ? 2 : 1, in, at);
        return;
    }
    if (strcmp(name, "transpose") == 0) {
        int64_t i, j;
        if (!x_tensor) return;
        int x = gb_operand(gb, v0, -1, s0);
        if (x < 0 || !gb_axis(gb, v1, 0, v0->t.rank, &i, s1) || !gb_axis(gb, v2, 0, v0->t.rank, &j, s2)) return;
        gb_transpose(gb, x, i, j, r, at);
    } else if (strcmp(name, "reshape") == 0) {
        in[0] = gb_operand(gb, v0, -1, s0);
        if (in[0] >= 0 && x_tensor && tensor_type_eq(&v0->t, &r->t)) gb_alias(r, in[0]); /* the same shape */
        else gb_result(gb, r, G_RESHAPE, 1, in, at);
    } else if (strcmp(name, "layernorm") == 0 || strcmp(name, "rmsnorm") == 0) {
        int ln = name[0] == 'l';
        double eps;
        in[0] = gb_operand(gb, v0, -1, s0);
        in[1] = gb_operand(gb, v1, -1, s1);
        if (ln) in[2] = gb_operand(gb, v2, -1, s2);
        if (!gb_number(gb, ln ? v3 : v2, ln ? 1e-5 : 1e-6, &eps, ln ? s3 : s2, "eps")) return;
        id = gb_result(gb, r, ln ? G_LAYERNORM : G_RMSNORM, ln ? 3 : 2, in, at);
        if (id >= 0) gb_node(gb, id)->fattr[0] = eps;
    } else if (strcmp(name, "rope") == 0) {
        double theta;
        in[0] = gb_operand(gb, v0, -1, s0);
        if (!gb_number(gb, v1, 10000.0, &theta, s1, "rope's theta")) return;
        int npos = v2 != NULL; /* pos: the rows' positions, [B, T] (sema checked) */
        if (npos) in[1] = gb_operand(gb, v2, DT_I32, s2);
        id = gb_result(gb, r, G_ROPE, 1 + npos, in, at);
        if (id >= 0) {
            gb_node(gb, id)->fattr[0] = theta;
            gb_node(gb, id)->iattr[1] = npos;
        }
    } else if (strcmp(name, "attention") == 0) {
        int causal;
        in[0] = gb_operand(gb, v0, -1, s0);
        in[1] = gb_operand(gb, v1, -1, s1);
        in[2] = gb_operand(gb, v2, -1, s2);
        if (!gb_flag(gb, v3, 1, &causal, s3, "attention's causal flag")) return;
        Span s4;
        Value *v4 = gb_arg(b, a, 4, &s4); /* pos: the document mask (sema checked it is i32[B, T]) */
        int npos = 0;
        if (v4) {
            in[3] = gb_operand(gb, v4, DT_I32, s4);
            npos = 1;
        }
        id = gb_result(gb, r, G_ATTENTION, 3 + npos, in, at);
        if (id < 0) return;
        GNode *n = gb_node(gb, id);
        n->iattr[0] = causal;
        n->iattr[1] = npos; /* 1: in3 is pos, the document mask */
        n->fattr[0] = 1.0 / sqrt((double)gb_node(gb, in[0])->shape[3]);
    } else if (strcmp(name, "where") == 0) {
        in[0] = gb_operand(gb, v0, DT_BOOL, s0);
        in[1] = gb_operand(gb, v1, dt, s1);
        in[2] = gb_operand(gb, v2, dt, s2);
        gb_result(gb, r, G_WHERE, 3, in, at);
    } else if (strcmp(name, "one_hot") == 0) {
        in[0] = gb_operand(gb, v0, DT_I32, s0);
        id = gb_result(gb, r, G_ONE_HOT, 1, in, at);
        if (id >= 0) gb_node(gb, id)->iattr[0] = gb_node(gb, id)->shape[r->t.rank - 1];
    } else if (strcmp(name, "arange") == 0) {
        gb_result(gb, r, G_ARANGE, 0, NULL, at);
    } else if (strcmp(name, "zeros") == 0 || strcmp(name, "ones") == 0) {
        id = gb_result(gb, r, G_CONST, 0, NULL, at);
        if (id >= 0) gb_node(gb, id)->fattr[0] = name[0] == 'o' ? 1.0 : 0.0;
    } else if (strcmp(name, "dropout") == 0) {
        double p;
        if (gb->updating) {
            gb_fail(gb, at, "dropout in an optimizer's update is not supported (it draws a mask per training step)");
            return;
        }
        in[0] = gb_operand(gb, v0, -1, s0);
        if (!gb_number(gb, v1, 0, &p, s1, "dropout's p")) return;
        if (p == 0) { /* the identity: no node, and no key for a program without dropout */
            gb_alias(r, in[0]);
            return;
        }
        in[1] = gb_rng(gb, at);
        id = gb_result(gb, r, G_DROPOUT, 2, in, at);
        if (id < 0) return;
        if (graph_numel(gb_node(gb, id)) > ((int64_t)1 << 32)) {
            gb_fail(gb, at, "dropout of more than 2^32 elements is not supported (its mask's counter is 32 bits)");
            return;
        }
        gb_node(gb, id)->fattr[0] = p;
        gb_node(gb, id)->iattr[0] = gb->streams++;
    } else if (strcmp(name, "global_mean") == 0) {
        gb_global_mean(gb, v0, s0, r, at);
    } else if (strcmp(name, "running") == 0) {
        Span s2;
        Value *v2 = gb_arg(b, a, 2, &s2);
        gb_running(gb, v0, s0, v1, s1, v2, s2, r, at);
    } else if (strcmp(name, "training") == 0) {
        /* The dropout key's training word (graph.h) as f32: 1 in forward_backward and the
         * statistics pass, 0 in forward_loss. Generation's forward never trains: a constant 0. */
        if (gb->is_forward) {
            gb_alias(r, gb_const(gb, DT_F32, 0, at));
            return;
        }
        int w = gb_slice(gb, gb_rng(gb, at), 0, 4, 5, at);
        in[0] = w < 0 ? -1 : gb_add(gb, G_RESHAPE, DT_I64, 0, NULL, 1, &w, at);
        if (in[0] >= 0) gb_result(gb, r, G_CAST, 1, in, at);
    } else if (strcmp(name, "norm") == 0) {
        in[0] = gb_operand(gb, v0, dt, s0);
        if (gb->updating && in[0] >= 0 && gb_node(gb, in[0])->rank == 1)                   /* per parameter (graph_build.h) */
            gb_result(gb, r, x_tensor && v0->t.rank == 0 ? G_ABS : G_SEG_NORM, 1, in, at); /* lifted to f32[n] */
        else gb_result(gb, r, G_NORM, 1, in, at);
    } else if (strcmp(name, "clamp") == 0) {
        double lo, hi;
        in[0] = gb_operand(gb, v0, dt, s0);
        if (!gb_number(gb, v1, 0, &lo, s1, "clamp's lo") || !gb_number(gb, v2, 0, &hi, s2, "clamp's hi")) return;
        id = gb_result(gb, r, G_CLAMP, 1, in, at);
        if (id < 0) return;
        gb_node(gb, id)->fattr[0] = lo;
        gb_node(gb, id)->fattr[1] = hi;
    } else if (strcmp(name, "float") == 0 || strcmp(name, "int") == 0) {
        gb_alias(r, gb_operand(gb, v0, dt, s0)); /* a cast, or the tensor itself */
    } else {
        gb_unsupported(gb, at, arena_printf(gb->ar, "the builtin '%s' on tensors", name));
    }
}

/* ---- parameters and their names ---- */

void gb_param(GraphBuilder *gb, Value *v, DType stored, const char *init, const double x[2], const int known[2], Span at) {
    if (!gb_wants(gb, v)) return;
    if (gb->updating) {
        gb_unsupported(gb, at, "a parameter declared while an optimizer's update runs");
        return;
    }
    static const struct {
        const char *name;
        GInit init;
        int nargs;
    } inits[] = {{"zeros", GI_ZEROS, 0},
                 {"ones", GI_ONES, 0},
                 {"constant", GI_CONSTANT, 1},
                 {"normal", GI_NORMAL, 2},
                 {"uniform", GI_UNIFORM, 2}};
    int which = 0; /* no initialiser: zeros */
    for (size_t i = 0; init && i < sizeof inits / sizeof *inits; i++)
        if (strcmp(init, inits[i].name) == 0) which = (int)i;
    for (int k = 0; k < inits[which].nargs; k++)
        if (!known[k]) {
            gb_unsupported(gb, at, arena_printf(gb->ar, "an argument of '%s' not known at compile time", inits[which].name));
            return;
        }
    int64_t shape[GRAPH_MAX_RANK];
    if (!gb_dims(gb, &v->t, shape, at)) return;
    int id = gb_add(gb, G_PARAM, stored, v->t.rank, shape, 0, NULL, at);
    if (id < 0) return;
    GNode *n = gb_node(gb, id);
    n->iattr[0] = inits[which].init;
    for (int k = 0; k < inits[which].nargs; k++) n->fattr[k] = x[k];
    gb_alias(v, gb_cast(gb, id, (int)v->t.dt, at)); /* read in another dtype: one cast, every use shares it */
}

void gb_name_param(GraphBuilder *gb, const Value *v, const char *path) {
    if (!gb || gb->failed || !v || v->kind != V_TENSOR || v->graph_id <= 0 || v->graph_id > gb->g->n) return;
    GNode *n = gb_node(gb, v->graph_id - 1);
    if (n->op == G_CAST && gb_node(gb, n->in[0])->op == G_PARAM) n = gb_node(gb, n->in[0]); /* bf16 */
    if (n->op == G_PARAM && !n->name) n->name = arena_strndup(gb->g->ar, path, strlen(path));
}

void gb_param_group(GraphBuilder *gb, const Value *v, int bits) {
    if (!gb || gb->failed || !v || v->kind != V_TENSOR || v->graph_id <= 0 || v->graph_id > gb->g->n) return;
    GNode *n = gb_node(gb, v->graph_id - 1);
    if (n->op == G_CAST && gb_node(gb, n->in[0])->op == G_PARAM) n = gb_node(gb, n->in[0]); /* bf16 */
    if (n->op == G_PARAM) n->iattr[1] |= bits;
}

/* ---- the train block ---- */

void gb_data(GraphBuilder *gb, Value *data) {
    if (!gb || gb->failed || !data || data->kind != V_DATA) return;
    static const char *const names[3] = {"data.x", "data.y", "data.pos"};
    for (int i = 0; i < 3 && i < data->n; i++) {
        Value *v = data->items[i];
        if (!gb_wants(gb, v)) continue;
        int id = gb_result(gb, v, G_INPUT, 0, NULL, v->origin);
        if (id >= 0) gb_node(gb, id)->name = names[i];
    }
}

/* 1 when every parameter has a name (else the build fails with the reason). */
static int gb_params_named(GraphBuilder *gb) {
    for (int i = 0; i < gb->g->nparams; i++) {
        GNode *p = gb_node(gb, gb->g->params[i]);
        if (p->name) continue;
        if (gb_fail(gb, p->src,
                    "parameter '%s' belongs to a model instantiated outside the train "
                    "block's model (in a function or in the loss), which is not supported yet",
                    diag_span_text(gb->ar, p->src)))
            diag_hint("parameters are named by their path from the model: make the sub-model a member of a model");
        return 0;
    }
    return 1;
}

void gb_loss(GraphBuilder *gb, Value *loss, Span at) {
    if (!gb || gb->failed) return;
    if (!loss || loss->kind == V_UNKNOWN) { /* reported by sema */
        gb->failed = 1;
        return;
    }
    int id = gb_operand(gb, loss, loss->kind == V_TENSOR ? -1 : DT_F32, at);
    if (id < 0) return;
    for (int k = 0; k < gb->g->nstats; k++)
        if (gb->g->stat_in[k] == id) {
            if (gb_fail(gb, at, "the loss is a global_mean, which is a constant of the backward: it has no gradient"))
                diag_hint("global_mean is for statistics the loss uses (expert frequencies); the loss is already the mean "
                          "over the global batch");
            return;
        }
    gb->g->loss = id;
    if (gb_params_named(gb)) gb->done = 1;
}

GraphBuilder *gb_forward_of(GraphBuilder *gb) {
    if (!gb || !gb->forward || gb->failed || !gb->done || diag_error_count() > gb->errors_before) return NULL;
    GraphBuilder *fwd = gb->forward;
    fwd->ar = gb->ar;
    fwd->errors_before = diag_error_count();
    return fwd;
}

void gb_forward_input(GraphBuilder *gb, Value *x, const char *name) {
    if (!gb || gb->failed || !gb_wants(gb, x)) return;
    int id = gb_result(gb, x, G_INPUT, 0, NULL, x->origin);
    if (id >= 0) gb_node(gb, id)->name = name;
}

void gb_forward_output(GraphBuilder *gb, Value *out) {
    if (!gb || gb->failed) return;
    if (!out || out->kind == V_UNKNOWN) { /* reported by sema */
        gb->failed = 1;
        return;
    }
    gb->output = out->kind == V_TENSOR && out->graph_id > 0 ? out->graph_id - 1 : -1;
    if (gb->output >= 0 && (out->t.dt == DT_BF16 || out->t.dt == DT_F16)) /* the runtime samples f32 logits */
        gb->output = gb_cast(gb, gb->output, DT_F32, out->origin);
    if (gb_params_named(gb)) gb->done = 1;
}
