/* autodiff.c - reverse-mode differentiation of the graph IR (see autodiff.h).
 *
 * Pipeline position: graph (forward, with a scalar loss) -> [autodiff] -> plan. The backward pass
 * is appended to the same Graph: a walk over the forward nodes in reverse id order (ids are a
 * topological order) from the loss, seeded with a G_CONST 1.0 of the loss's shape. Each node's
 * gradient is the G_ADD of the contributions of its uses. Only nodes on a path from a G_PARAM to
 * the loss are differentiated, so a parameter-free subgraph costs no backward node.
 *
 * Rules, by kind of op:
 *   - elementwise ops through primitive ops (d tanh = dy * (1 - y*y); gelu's tanh approximation
 *     written out, see ad_gelu_grad);
 *   - broadcasting undone with G_SUM_TO back to each input's shape;
 *   - matmul through matmuls with transposed operands (rank-1 operands promoted to matrices);
 *   - data movement through its inverse (slice -> concat with zero G_CONST pieces, concat ->
 *     slices, gather -> G_SCATTER_ADD, topk values -> one_hot of the indices times dy);
 *   - composite ops through their backward ops (G_SOFTMAX_BWD ... G_CROSS_ENTROPY_BWD).
 * Conventions:
 *   - max/min reductions and max2/min2 split the gradient evenly between tied elements (a
 *     mask of the maxima divided by their count; a tie of max2 gives each operand half), which
 *     is also what a central difference measures at a tie of two;
 *   - relu passes dy where x > 0, abs multiplies by sign(x) (0 at 0); clamp passes dy where
 *     lo <= x <= hi (both ends included, as PyTorch);
 *   - dropout's backward is dropout again, on dy, with the same p, the same RNG stream id
 *     (iattr[0]) and the same "rng" key input: the mask is a function of the key (seed, step,
 *     micro-batch), the stream id and the flat element index only (graph.h, GRAPH_RNG_WORDS), so
 *     it is the forward's mask, recomputed, and dx = dy * mask / (1 - p). A pass that renumbers
 *     stream ids must keep the pair equal; the key gets no gradient;
 *   - sign, floor, comparisons, logic, one_hot, topk indices, arange and every integer or bool
 *     result contribute no gradient; a parameter reached only through them gets zeros;
 *   - a frozen parameter (G_PARAM's GP_FROZEN) is differentiated as a constant: nothing that only
 *     it depends on gets a backward node, no GEMM computes its gradient, and its gradient is a
 *     zero constant (the update leaves it as it is);
 *   - of the backward ops only scatter_add has a rule (its gradient is a gather): there are no
 *     second derivatives, and a graph that needs one is an internal error.
 * Every node added keeps the source span of the forward node it differentiates. */
#include "autodiff.h"

#include <string.h>

/* ---- the pass's state ---- */

typedef struct AdCtx {
    Graph *g;
    int nfwd;            /* forward nodes: ids 0 .. nfwd-1 */
    int *grad;           /* [nfwd] accumulated gradient of each forward node, -1 for none yet */
    unsigned char *need; /* [nfwd] 1 when on a path from a parameter to the loss */
    Span src;            /* the span of the forward node being differentiated */
} AdCtx;

static GNode *ad_node(const AdCtx *c, int id) { return graph_node(c->g, id); }

static int ad_is_float(DType dt) { return dtype_is_float(dt); }

static int ad_same_shape(const GNode *a, int rank, const int64_t *shape) {
    if (a->rank != rank) return 0;
    for (int i = 0; i < rank; i++)
        if (a->shape[i] != shape[i]) return 0;
    return 1;
}

/* ---- emitting nodes ---- */

static int ad_emit(AdCtx *c, GOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in) {
    return graph_add(c->g, op, dt, rank, shape, nin, in, c->src);
}

static int ad_emit1(AdCtx *c, GOp op, DType dt, int rank, const int64_t *shape, int a) {
    return ad_emit(c, op, dt, rank, shape, 1, &a);
}

/* A constant v of the given shape (rank 0 for a scalar that broadcasts). */
static int ad_const_shaped(AdCtx *c, double v, DType dt, int rank, const int64_t *shape) {
    int id = ad_emit(c, G_CONST, dt, rank, shape, 0, NULL);
    ad_node(c, id)->fattr[0] = v;
    return id;
}

static int ad_const(AdCtx *c, double v, DType dt) { return ad_const_shaped(c, v, dt, 0, NULL); }

/* Same shape and dtype as x. */
static int ad_unary(AdCtx *c, GOp op, int x) {
    const GNode *n = ad_node(c, x);
    return ad_emit1(c, op, n->dt, n->rank, n->shape, x);
}

/* NumPy broadcast of shapes a and b (already known compatible: they come from a valid graph)
 * into out; returns its rank. out may be a or b. */
static int ad_bcast_shape(int ra, const int64_t *a, int rb, const int64_t *b, int64_t *out) {
    int rank = ra > rb ? ra : rb;
    int64_t tmp[GRAPH_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        int ia = i - (rank - ra), ib = i - (rank - rb);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) INTERNAL("autodiff: shapes do not broadcast");
        tmp[i] = da == 1 ? db : da;
    }
    memcpy(out, tmp, sizeof(int64_t) * (size_t)rank);
    return rank;
}

static int ad_is_compare(GOp op) { return (op >= G_EQ && op <= G_GE) || op == G_AND || op == G_OR; }

/* An elementwise binary op with broadcasting; comparisons give bool, the rest the float dtype of
 * their operands. */
static int ad_bin(AdCtx *c, GOp op, int a, int b) {
    const GNode *na = ad_node(c, a), *nb = ad_node(c, b);
    int64_t shape[GRAPH_MAX_RANK];
    int rank = ad_bcast_shape(na->rank, na->shape, nb->rank, nb->shape, shape);
    DType dt = ad_is_compare(op) ? DT_BOOL : ad_is_float(na->dt) ? na->dt : nb->dt;
    int in[2] = {a, b};
    return ad_emit(c, op, dt, rank, shape, 2, in);
}

static int ad_add(AdCtx *c, int a, int b) { return ad_bin(c, G_ADD, a, b); }
static int ad_sub(AdCtx *c, int a, int b) { return ad_bin(c, G_SUB, a, b); }
static int ad_mul(AdCtx *c, int a, int b) { return ad_bin(c, G_MUL, a, b); }
static int ad_div(AdCtx *c, int a, int b) { return ad_bin(c, G_DIV, a, b); }

/* a * v for a number v. */
static int ad_scale(AdCtx *c, int a, double v) { return ad_mul(c, a, ad_const(c, v, ad_node(c, a)->dt)); }

/* v - a for a number v. */
static int ad_rsub(AdCtx *c, double v, int a) { return ad_sub(c, ad_const(c, v, ad_node(c, a)->dt), a); }

/* cond ? a : b, broadcast; the dtype is that of the values. */
static int ad_where(AdCtx *c, int cond, int a, int b) {
    const GNode *nc = ad_node(c, cond), *na = ad_node(c, a), *nb = ad_node(c, b);
    int64_t shape[GRAPH_MAX_RANK];
    int rank = ad_bcast_shape(na->rank, na->shape, nb->rank, nb->shape, shape);
    rank = ad_bcast_shape(nc->rank, nc->shape, rank, shape, shape);
    int in[3] = {cond, a, b};
    return ad_emit(c, G_WHERE, ad_is_float(na->dt) ? na->dt : nb->dt, rank, shape, 3, in);
}

/* cond ? a : 0 and cond ? 0 : a. */
static int ad_mask(AdCtx *c, int cond, int a) { return ad_where(c, cond, a, ad_const(c, 0.0, ad_node(c, a)->dt)); }
static int ad_mask_not(AdCtx *c, int cond, int a) { return ad_where(c, cond, ad_const(c, 0.0, ad_node(c, a)->dt), a); }

static int ad_cast(AdCtx *c, int x, DType dt) {
    const GNode *n = ad_node(c, x);
    if (n->dt == dt) return x;
    return ad_emit1(c, G_CAST, dt, n->rank, n->shape, x);
}

/* Sums x down to (rank, shape): the inverse of broadcasting. No node when the shapes agree. */
static int ad_sum_to(AdCtx *c, int x, int rank, const int64_t *shape) {
    const GNode *n = ad_node(c, x);
    if (ad_same_shape(n, rank, shape)) return x;
    return ad_emit1(c, G_SUM_TO, n->dt, rank, shape, x);
}

static int ad_sum_to_node(AdCtx *c, int x, const GNode *like) { return ad_sum_to(c, x, like->rank, like->shape); }

static int ad_broadcast(AdCtx *c, int x, int rank, const int64_t *shape) {
    const GNode *n = ad_node(c, x);
    if (ad_same_shape(n, rank, shape)) return x;
    return ad_emit1(c, G_BROADCAST, n->dt, rank, shape, x);
}

static int ad_reshape(AdCtx *c, int x, int rank, const int64_t *shape) {
    const GNode *n = ad_node(c, x);
    if (ad_same_shape(n, rank, shape)) return x;
    return ad_emit1(c, G_RESHAPE, n->dt, rank, shape, x);
}

/* Swaps axes i and j (both normalised). */
static int ad_transpose(AdCtx *c, int x, int i, int j) {
    const GNode *n = ad_node(c, x);
    if (i == j) return x;
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n->shape, sizeof shape);
    int64_t t = shape[i];
    shape[i] = shape[j];
    shape[j] = t;
    int id = ad_emit1(c, G_TRANSPOSE, n->dt, n->rank, shape, x);
    ad_node(c, id)->iattr[0] = i;
    ad_node(c, id)->iattr[1] = j;
    return id;
}

static int ad_transpose_last(AdCtx *c, int x) {
    int r = ad_node(c, x)->rank;
    return ad_transpose(c, x, r - 2, r - 1);
}

/* x[lo:hi] along axis. */
static int ad_slice(AdCtx *c, int x, int axis, int64_t lo, int64_t hi) {
    const GNode *n = ad_node(c, x);
    if (lo == 0 && hi == n->shape[axis]) return x;
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n->shape, sizeof shape);
    shape[axis] = hi - lo;
    int id = ad_emit1(c, G_SLICE, n->dt, n->rank, shape, x);
    ad_node(c, id)->iattr[0] = axis;
    ad_node(c, id)->iattr[1] = lo;
    ad_node(c, id)->iattr[2] = hi;
    return id;
}

/* Concatenation of nin (<= GRAPH_MAX_CONCAT) pieces along axis. */
static int ad_concat(AdCtx *c, int nin, const int *in, int axis) {
    if (nin == 1) return in[0];
    const GNode *n0 = ad_node(c, in[0]);
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, n0->shape, sizeof shape);
    shape[axis] = 0;
    for (int i = 0; i < nin; i++) shape[axis] += ad_node(c, in[i])->shape[axis];
    int id = ad_emit(c, G_CONCAT, n0->dt, n0->rank, shape, nin, in);
    ad_node(c, id)->iattr[0] = axis;
    return id;
}

/* A reduction over one axis (or all, axis -1) with keepdim. */
static int ad_reduce(AdCtx *c, GOp op, int x, int axis, int keepdim) {
    const GNode *n = ad_node(c, x);
    int64_t shape[GRAPH_MAX_RANK];
    int rank = 0;
    for (int i = 0; i < n->rank; i++) {
        if (axis == -1 || i == axis) {
            if (keepdim) shape[rank++] = 1;
        } else {
            shape[rank++] = n->shape[i];
        }
    }
    int id = ad_emit1(c, op, n->dt, rank, shape, x);
    ad_node(c, id)->iattr[0] = axis;
    ad_node(c, id)->iattr[1] = keepdim;
    return id;
}

/* a @ b for operands of rank >= 2, batch dimensions broadcast. */
static int ad_matmul(AdCtx *c, int a, int b) {
    const GNode *na = ad_node(c, a), *nb = ad_node(c, b);
    if (na->rank < 2 || nb->rank < 2) INTERNAL("autodiff: ad_matmul wants matrices");
    int64_t shape[GRAPH_MAX_RANK];
    int rank = ad_bcast_shape(na->rank - 2, na->shape, nb->rank - 2, nb->shape, shape); /* batch dims */
    shape[rank++] = na->shape[na->rank - 2];
    shape[rank++] = nb->shape[nb->rank - 1];
    int in[2] = {a, b};
    return ad_emit(c, G_MATMUL, na->dt, rank, shape, 2, in);
}

/* ---- accumulation ---- */

/* Adds contribution d to the gradient of forward node x (cast to x's dtype if it differs). */
static void ad_accum(AdCtx *c, int x, int d) {
    const GNode *nx = ad_node(c, x), *nd = ad_node(c, d);
    if (!ad_same_shape(nd, nx->rank, nx->shape))
        INTERNAL("autodiff: the gradient of %%%d (%s) has the wrong shape", x, graph_op_name(nx->op));
    if (nd->dt != nx->dt) d = ad_cast(c, d, nx->dt);
    c->grad[x] = c->grad[x] < 0 ? d : ad_add(c, c->grad[x], d);
}

/* Contribution d of a broadcasting op's output to input x: summed to x's shape first. */
static void ad_accum_bcast(AdCtx *c, int x, int d) { ad_accum(c, x, ad_sum_to_node(c, d, ad_node(c, x))); }

/* ---- elementwise rules ---- */

/* d gelu(x) / dx for gelu(x) = 0.5 x (1 + tanh(u)), u = k (x + a x^3), k = sqrt(2/pi),
 * a = 0.044715:  0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2), t = tanh(u). */
static int ad_gelu_grad(AdCtx *c, int x) {
    const double k = 0.7978845608028654, a = 0.044715;
    DType dt = ad_node(c, x)->dt;
    int x2 = ad_mul(c, x, x);
    int inner = ad_mul(c, x, ad_add(c, ad_const(c, 1.0, dt), ad_scale(c, x2, a)));
    int t = ad_unary(c, G_TANH, ad_scale(c, inner, k));
    int left = ad_scale(c, ad_add(c, ad_const(c, 1.0, dt), t), 0.5);
    int sech2 = ad_rsub(c, 1.0, ad_mul(c, t, t));
    int du = ad_add(c, ad_const(c, k, dt), ad_scale(c, x2, 3.0 * a * k));
    int right = ad_mul(c, ad_mul(c, ad_scale(c, x, 0.5), sech2), du);
    return ad_add(c, left, right);
}

/* Rules for ops of one input with the output's shape. Returns dx, or -1 for no gradient. */
static int ad_rule_unary(AdCtx *c, const GNode *n, int dy) {
    int x = n->in[0], y = n->id;
    DType dt = n->dt;
    switch (n->op) {
    case G_NEG: return ad_unary(c, G_NEG, dy);
    case G_EXP: return ad_mul(c, dy, y);
    case G_LOG: return ad_div(c, dy, x);
    case G_SQRT: return ad_div(c, ad_scale(c, dy, 0.5), y); /* dy / (2 sqrt x) */
    case G_RSQRT: /* -0.5 x^-1.5 = -0.5 y^3 */ return ad_mul(c, dy, ad_scale(c, ad_mul(c, y, ad_mul(c, y, y)), -0.5));
    case G_TANH: return ad_mul(c, dy, ad_rsub(c, 1.0, ad_mul(c, y, y)));
    case G_SIGMOID: return ad_mul(c, dy, ad_mul(c, y, ad_rsub(c, 1.0, y)));
    case G_RELU: return ad_mask(c, ad_bin(c, G_GT, x, ad_const(c, 0.0, dt)), dy);
    case G_GELU: return ad_mul(c, dy, ad_gelu_grad(c, x));
    case G_SILU: { /* s (1 + x (1 - s)) */
        int s = ad_unary(c, G_SIGMOID, x);
        int d = ad_mul(c, s, ad_add(c, ad_const(c, 1.0, dt), ad_mul(c, x, ad_rsub(c, 1.0, s))));
        return ad_mul(c, dy, d);
    }
    case G_ABS: return ad_mul(c, dy, ad_unary(c, G_SIGN, x));
    case G_SIN: return ad_mul(c, dy, ad_unary(c, G_COS, x));
    case G_COS: return ad_mul(c, dy, ad_unary(c, G_NEG, ad_unary(c, G_SIN, x)));
    case G_SIGN:
    case G_FLOOR: return -1; /* piecewise constant */
    case G_CAST:
        if (!ad_is_float(ad_node(c, x)->dt)) return -1;
        return ad_cast(c, dy, ad_node(c, x)->dt);
    case G_DROPOUT: { /* the same mask: same p, stream id and key (see the file comment) */
        const GNode *yn = ad_node(c, dy);
        int in[2] = {dy, n->in[1]};
        int id = ad_emit(c, G_DROPOUT, yn->dt, yn->rank, yn->shape, 2, in);
        GNode *d = ad_node(c, id);
        d->fattr[0] = n->fattr[0];
        d->iattr[0] = n->iattr[0];
        return id;
    }
    case G_CLAMP: {
        int lo = ad_const(c, n->fattr[0], ad_node(c, x)->dt), hi = ad_const(c, n->fattr[1], ad_node(c, x)->dt);
        int inside = ad_bin(c, G_AND, ad_bin(c, G_GE, x, lo), ad_bin(c, G_LE, x, hi));
        return ad_mask(c, inside, dy);
    }
    default: INTERNAL("autodiff: %s is not a unary op", graph_op_name(n->op));
    }
}

/* Weights of max2's (or min2's) first operand: 1 where it wins, 0.5 at a tie, 0 where it loses;
 * the second operand's weight is 1 minus this. */
static int ad_pick_weight(AdCtx *c, GOp win, int a, int b, DType dt) {
    int half = ad_where(c, ad_bin(c, G_EQ, a, b), ad_const(c, 0.5, dt), ad_const(c, 0.0, dt));
    return ad_where(c, ad_bin(c, win, a, b), ad_const(c, 1.0, dt), half);
}

/* Rules for the broadcasting binary ops and where. */
static void ad_rule_binary(AdCtx *c, const GNode *n, int dy) {
    int y = n->id;
    if (n->op == G_WHERE) {
        int cond = n->in[0], a = n->in[1], b = n->in[2];
        if (c->need[a]) ad_accum_bcast(c, a, ad_mask(c, cond, dy));
        if (c->need[b]) ad_accum_bcast(c, b, ad_mask_not(c, cond, dy));
        return;
    }
    int a = n->in[0], b = n->in[1];
    int na = c->need[a], nb = c->need[b];
    DType dt = n->dt;
    switch (n->op) {
    case G_ADD:
        if (na) ad_accum_bcast(c, a, dy);
        if (nb) ad_accum_bcast(c, b, dy);
        return;
    case G_SUB:
        if (na) ad_accum_bcast(c, a, dy);
        if (nb) ad_accum_bcast(c, b, ad_unary(c, G_NEG, dy));
        return;
    case G_MUL:
        if (na) ad_accum_bcast(c, a, ad_mul(c, dy, b));
        if (nb) ad_accum_bcast(c, b, ad_mul(c, dy, a));
        return;
    case G_DIV: /* d/db (a / b) = -a / b^2 = -y / b */
        if (na) ad_accum_bcast(c, a, ad_div(c, dy, b));
        if (nb) ad_accum_bcast(c, b, ad_unary(c, G_NEG, ad_div(c, ad_mul(c, dy, y), b)));
        return;
    case G_POW: /* d/da a^b = b a^(b-1); d/db a^b = a^b log a */
        if (na) {
            int bm1 = ad_sub(c, b, ad_const(c, 1.0, dt));
            ad_accum_bcast(c, a, ad_mul(c, dy, ad_mul(c, b, ad_bin(c, G_POW, a, bm1))));
        }
        if (nb) ad_accum_bcast(c, b, ad_mul(c, dy, ad_mul(c, y, ad_unary(c, G_LOG, a))));
        return;
    case G_MOD: /* y = a - b q with q = (a - y) / b locally constant: d/da = 1, d/db = -q */
        if (na) ad_accum_bcast(c, a, dy);
        if (nb) ad_accum_bcast(c, b, ad_mul(c, dy, ad_div(c, ad_sub(c, y, a), b)));
        return;
    case G_MAX2:
    case G_MIN2: {
        int w = ad_pick_weight(c, n->op == G_MAX2 ? G_GT : G_LT, a, b, dt);
        if (na) ad_accum_bcast(c, a, ad_mul(c, dy, w));
        if (nb) ad_accum_bcast(c, b, ad_mul(c, dy, ad_rsub(c, 1.0, w)));
        return;
    }
    default: INTERNAL("autodiff: %s is not a binary op", graph_op_name(n->op));
    }
}

/* ---- reductions ---- */

/* dy of a reduction of x reshaped so that it broadcasts against x: the reduced axis kept as 1
 * (a reduction of everything gives rank 0 or all ones, which broadcast as they are). */
static int ad_unreduce(AdCtx *c, int dy, const GNode *x, int axis, int keepdim) {
    if (axis < 0 || keepdim) return dy;
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, x->shape, sizeof shape);
    shape[axis] = 1;
    return ad_reshape(c, dy, x->rank, shape);
}

static void ad_rule_reduce(AdCtx *c, const GNode *n, int dy) {
    int x = n->in[0];
    const GNode *nx = ad_node(c, x);
    int all = n->op == G_NORM; /* norm: of every element, to rank 0 */
    int axis = all ? -1 : (int)n->iattr[0], keepdim = all ? 0 : (int)n->iattr[1];
    int dyk = ad_unreduce(c, dy, nx, axis, keepdim);
    switch (n->op) {
    case G_SUM: ad_accum(c, x, ad_broadcast(c, dyk, nx->rank, nx->shape)); return;
    case G_MEAN: {
        double count = (double)graph_numel(nx) / (double)graph_numel(n);
        ad_accum(c, x, ad_broadcast(c, ad_scale(c, dyk, 1.0 / count), nx->rank, nx->shape));
        return;
    }
    case G_MAX:
    case G_MIN: { /* ties share dy evenly: mask / count */
        int yk = ad_unreduce(c, n->id, nx, axis, keepdim);
        int mask = ad_cast(c, ad_bin(c, G_EQ, x, yk), nx->dt);
        int count = ad_reduce(c, G_SUM, mask, axis, axis >= 0);
        ad_accum(c, x, ad_mul(c, mask, ad_div(c, dyk, count)));
        return;
    }
    case G_LOGSUMEXP: { /* dx = dy * softmax(x) = dy * exp(x - y) */
        int yk = ad_unreduce(c, n->id, nx, axis, keepdim);
        ad_accum(c, x, ad_mul(c, dyk, ad_unary(c, G_EXP, ad_sub(c, x, yk))));
        return;
    }
    case G_NORM: /* d |x| = x / |x| */ ad_accum(c, x, ad_mul(c, x, ad_div(c, dy, n->id))); return;
    default: INTERNAL("autodiff: %s is not a reduction", graph_op_name(n->op));
    }
}

/* ---- matmul ---- */

/* Promotes a rank-1 operand to a matrix: [k] -> [1, k] (left) or [k, 1] (right). */
static int ad_as_matrix(AdCtx *c, int x, int left) {
    const GNode *n = ad_node(c, x);
    if (n->rank >= 2) return x;
    int64_t shape[2] = {left ? 1 : n->shape[0], left ? n->shape[0] : 1};
    return ad_reshape(c, x, 2, shape);
}

/* y = a @ b: da = dy @ b^T, db = a^T @ dy, summed over broadcast batch dimensions. Rank-1
 * operands are promoted to matrices (dy gains the matching unit axis) and reshaped back. */
static void ad_rule_matmul(AdCtx *c, const GNode *n, int dy) {
    int a = n->in[0], b = n->in[1];
    const GNode *na = ad_node(c, a), *nb = ad_node(c, b);
    int a2 = ad_as_matrix(c, a, 1), b2 = ad_as_matrix(c, b, 0);
    /* dy as the output of a2 @ b2: the batch dimensions, then [n or 1, m or 1] */
    int64_t shape[GRAPH_MAX_RANK];
    int rank = n->rank - (na->rank >= 2) - (nb->rank >= 2);
    memcpy(shape, n->shape, sizeof(int64_t) * (size_t)rank);
    shape[rank++] = na->rank >= 2 ? na->shape[na->rank - 2] : 1;
    shape[rank++] = nb->rank >= 2 ? nb->shape[nb->rank - 1] : 1;
    int dy2 = ad_reshape(c, dy, rank, shape);
    if (c->need[a]) {
        int d = ad_sum_to_node(c, ad_matmul(c, dy2, ad_transpose_last(c, b2)), ad_node(c, a2));
        ad_accum(c, a, ad_reshape(c, d, na->rank, na->shape));
    }
    if (c->need[b]) {
        int d = ad_sum_to_node(c, ad_matmul(c, ad_transpose_last(c, a2), dy2), ad_node(c, b2));
        ad_accum(c, b, ad_reshape(c, d, nb->rank, nb->shape));
    }
}

/* ---- data movement ---- */

static void ad_rule_slice(AdCtx *c, const GNode *n, int dy) {
    int x = n->in[0];
    const GNode *nx = ad_node(c, x);
    int axis = (int)n->iattr[0];
    int64_t lo = n->iattr[1], hi = n->iattr[2];
    int pieces[3], np = 0;
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, nx->shape, sizeof shape);
    if (lo > 0) {
        shape[axis] = lo;
        pieces[np++] = ad_const_shaped(c, 0.0, n->dt, nx->rank, shape);
    }
    pieces[np++] = dy;
    if (hi < nx->shape[axis]) {
        shape[axis] = nx->shape[axis] - hi;
        pieces[np++] = ad_const_shaped(c, 0.0, n->dt, nx->rank, shape);
    }
    ad_accum(c, x, ad_concat(c, np, pieces, axis));
}

static void ad_rule_concat(AdCtx *c, const GNode *n, int dy) {
    int axis = (int)n->iattr[0];
    int64_t off = 0;
    for (int i = 0; i < n->nin; i++) {
        int x = n->in[i];
        int64_t size = ad_node(c, x)->shape[axis];
        if (c->need[x]) ad_accum(c, x, ad_slice(c, dy, axis, off, off + size));
        off += size;
    }
}

/* y = topk values of x along axis: dx = sum over the k picks of one_hot(index, n) * dy, done
 * with the axis moved last: [..., k, n] * [..., k, 1] summed over k. */
static void ad_rule_topk(AdCtx *c, const GNode *n, int dy) {
    int x = n->in[0];
    const GNode *nx = ad_node(c, x);
    int r = nx->rank, axis = (int)n->iattr[1];
    if (axis < 0) axis += r;
    if (r + 1 > GRAPH_MAX_RANK) INTERNAL("autodiff: topk of rank %d leaves no room for one_hot's axis", r);
    int idx = -1;
    for (int i = x + 1; i < c->nfwd && idx < 0; i++) { /* reuse the forward's indices if taken */
        const GNode *m = ad_node(c, i);
        if (m->op == G_TOPK_INDICES && m->in[0] == x && m->iattr[0] == n->iattr[0] && m->iattr[1] == n->iattr[1]) idx = i;
    }
    if (idx < 0) {
        idx = ad_emit1(c, G_TOPK_INDICES, DT_I32, n->rank, n->shape, x);
        ad_node(c, idx)->iattr[0] = n->iattr[0];
        ad_node(c, idx)->iattr[1] = n->iattr[1];
    }
    int dyt = ad_transpose(c, dy, axis, r - 1), idxt = ad_transpose(c, idx, axis, r - 1);
    const GNode *ni = ad_node(c, idxt);
    int64_t shape[GRAPH_MAX_RANK];
    memcpy(shape, ni->shape, sizeof shape);
    shape[r] = nx->shape[axis];
    int oh = ad_emit1(c, G_ONE_HOT, n->dt, r + 1, shape, idxt); /* [..., k, n] */
    ad_node(c, oh)->iattr[0] = nx->shape[axis];
    shape[r] = 1;
    int dy2 = ad_reshape(c, dyt, r + 1, shape); /* [..., k, 1] */
    int s = ad_reduce(c, G_SUM, ad_mul(c, oh, dy2), r - 1, 0);
    ad_accum(c, x, ad_transpose(c, s, axis, r - 1));
}

/* ---- composite ops ---- */

/* One backward op: shape and dtype of `like`, inputs in, attributes of the forward node f. */
static int ad_bwd_op(AdCtx *c, GOp op, const GNode *like, const GNode *f, int nin, const int *in) {
    int id = ad_emit(c, op, like->dt, like->rank, like->shape, nin, in);
    GNode *d = ad_node(c, id);
    memcpy(d->iattr, f->iattr, sizeof d->iattr);
    memcpy(d->fattr, f->fattr, sizeof d->fattr);
    return id;
}

static void ad_rule_composite(AdCtx *c, const GNode *n, int dy) {
    int x = n->in[0];
    const GNode *nx = ad_node(c, x);
    switch (n->op) {
    case G_SOFTMAX: {
        int in[2] = {dy, n->id};
        ad_accum(c, x, ad_bwd_op(c, G_SOFTMAX_BWD, nx, n, 2, in));
        return;
    }
    case G_LOG_SOFTMAX: { /* dx = dy - softmax(x) * sum(dy) = dy - exp(y) * sum(dy) */
        int s = ad_reduce(c, G_SUM, dy, (int)n->iattr[0], 1);
        ad_accum(c, x, ad_sub(c, dy, ad_mul(c, ad_unary(c, G_EXP, n->id), s)));
        return;
    }
    case G_LAYERNORM:
    case G_RMSNORM: {
        int ln = n->op == G_LAYERNORM;
        int w = n->in[1];
        if (c->need[x]) {
            int in[3] = {dy, x, w};
            ad_accum(c, x, ad_bwd_op(c, ln ? G_LAYERNORM_BWD_X : G_RMSNORM_BWD_X, nx, n, 3, in));
        }
        if (c->need[w]) {
            int in[2] = {dy, x};
            ad_accum(c, w, ad_bwd_op(c, ln ? G_LAYERNORM_BWD_W : G_RMSNORM_BWD_W, ad_node(c, w), n, 2, in));
        }
        if (ln && n->nin > 2 && c->need[n->in[2]]) ad_accum_bcast(c, n->in[2], dy); /* bias: optional */
        return;
    }
    case G_ROPE: {
        int in[2] = {dy, n->nin > 1 ? n->in[1] : -1}; /* pos: no gradient (i32) */
        ad_accum(c, x, ad_bwd_op(c, G_ROPE_BWD, nx, n, n->nin, in));
        return;
    }
    case G_ATTENTION: {
        static const GOp ops[3] = {G_ATTENTION_BWD_Q, G_ATTENTION_BWD_K, G_ATTENTION_BWD_V};
        int in[5] = {dy, n->in[0], n->in[1], n->in[2], n->nin > 3 ? n->in[3] : -1}; /* pos: no gradient (i32) */
        for (int i = 0; i < 3; i++)
            if (c->need[n->in[i]]) ad_accum(c, n->in[i], ad_bwd_op(c, ops[i], ad_node(c, n->in[i]), n, n->nin > 3 ? 5 : 4, in));
        return;
    }
    case G_CROSS_ENTROPY: {
        int in[3] = {dy, x, n->in[1]};
        ad_accum(c, x, ad_bwd_op(c, G_CROSS_ENTROPY_BWD, nx, n, 3, in));
        return;
    }
    case G_MSE: { /* mean((a - b)^2): da = dy * 2 (a - b) / N, db = -da */
        int a = n->in[0], b = n->in[1];
        int dyx = ad_cast(c, dy, nx->dt); /* the loss is f32 whatever the inputs' dtype */
        int da = ad_mul(c, dyx, ad_scale(c, ad_sub(c, a, b), 2.0 / (double)graph_numel(nx)));
        if (c->need[a]) ad_accum(c, a, da);
        if (c->need[b]) ad_accum(c, b, ad_unary(c, G_NEG, da));
        return;
    }
    default: INTERNAL("autodiff: %s is not a composite op", graph_op_name(n->op));
    }
}

/* ---- the walk ---- */

/* Applies the rule of forward node n, whose gradient is dy, adding to its inputs' gradients. */
static void ad_rule(AdCtx *c, const GNode *n, int dy) {
    switch (n->op) {
    case G_PARAM:
    case G_INPUT:
    case G_CONST:
    case G_ARANGE: return;
    case G_NEG:
    case G_EXP:
    case G_LOG:
    case G_SQRT:
    case G_RSQRT:
    case G_TANH:
    case G_SIGMOID:
    case G_RELU:
    case G_GELU:
    case G_SILU:
    case G_ABS:
    case G_SIGN:
    case G_SIN:
    case G_COS:
    case G_FLOOR:
    case G_CAST:
    case G_DROPOUT:
    case G_CLAMP: {
        int dx = ad_rule_unary(c, n, dy);
        if (dx >= 0) ad_accum(c, n->in[0], dx);
        return;
    }
    case G_ADD:
    case G_SUB:
    case G_MUL:
    case G_DIV:
    case G_POW:
    case G_MOD:
    case G_MAX2:
    case G_MIN2:
    case G_WHERE: ad_rule_binary(c, n, dy); return;
    case G_NOT:
    case G_EQ:
    case G_NE:
    case G_LT:
    case G_LE:
    case G_GT:
    case G_GE:
    case G_AND:
    case G_OR:
    case G_ONE_HOT:
    case G_TOPK_INDICES: return; /* bool or integer results: no gradient */
    case G_SUM:
    case G_MEAN:
    case G_MAX:
    case G_MIN:
    case G_LOGSUMEXP:
    case G_NORM: ad_rule_reduce(c, n, dy); return;
    case G_SUM_TO: {
        const GNode *nx = ad_node(c, n->in[0]);
        ad_accum(c, n->in[0], ad_broadcast(c, dy, nx->rank, nx->shape));
        return;
    }
    case G_BROADCAST: ad_accum_bcast(c, n->in[0], dy); return;
    case G_SOFTMAX:
    case G_LOG_SOFTMAX:
    case G_LAYERNORM:
    case G_RMSNORM:
    case G_ROPE:
    case G_ATTENTION:
    case G_CROSS_ENTROPY:
    case G_MSE: ad_rule_composite(c, n, dy); return;
    case G_TOPK_VALUES: ad_rule_topk(c, n, dy); return;
    case G_MATMUL: ad_rule_matmul(c, n, dy); return;
    case G_RESHAPE: {
        const GNode *nx = ad_node(c, n->in[0]);
        ad_accum(c, n->in[0], ad_reshape(c, dy, nx->rank, nx->shape));
        return;
    }
    case G_TRANSPOSE: ad_accum(c, n->in[0], ad_transpose(c, dy, (int)n->iattr[0], (int)n->iattr[1])); return;
    case G_SLICE: ad_rule_slice(c, n, dy); return;
    case G_GATHER: {
        /* A half-precision table (an embedding read as bf16) sums each row's many contributions in
         * f32 and rounds once: adding them in bf16 would round at every add. */
        const GNode *nx = ad_node(c, n->in[0]);
        int half = nx->dt == DT_BF16 || nx->dt == DT_F16;
        int in[2] = {half ? ad_cast(c, dy, DT_F32) : dy, n->in[1]};
        int sum = ad_emit(c, G_SCATTER_ADD, half ? DT_F32 : nx->dt, nx->rank, nx->shape, 2, in);
        ad_accum(c, n->in[0], ad_cast(c, sum, nx->dt));
        return;
    }
    case G_SCATTER_ADD: /* rows in1 += in0: d in0 = the rows of dy at in1 */
        if (c->need[n->in[0]]) {
            const GNode *nu = ad_node(c, n->in[0]);
            int in[2] = {dy, n->in[1]};
            ad_accum(c, n->in[0], ad_emit(c, G_GATHER, nu->dt, nu->rank, nu->shape, 2, in));
        }
        return;
    case G_CONCAT: ad_rule_concat(c, n, dy); return;
    default: INTERNAL("autodiff: no derivative for %s (%%%d), which the loss needs", graph_op_name(n->op), n->id);
    }
}

/* need[id] = 1 when id depends on a parameter through float values and the loss depends on id. */
static void ad_mark(AdCtx *c) {
    unsigned char *dep = arena_alloc(c->g->ar, (size_t)c->nfwd);
    for (int id = 0; id < c->nfwd; id++) {
        const GNode *n = ad_node(c, id);
        if (n->op == G_PARAM) {
            dep[id] = !(n->iattr[1] & GP_FROZEN); /* a frozen parameter is a constant here: no gradient */
            continue;
        }
        if (!ad_is_float(n->dt)) continue;
        for (int i = 0; i < n->nin; i++) dep[id] |= dep[n->in[i]];
    }
    c->need[c->g->loss] = dep[c->g->loss];
    for (int id = c->g->loss; id >= 0; id--) {
        if (!c->need[id]) continue;
        const GNode *n = ad_node(c, id);
        for (int i = 0; i < n->nin; i++)
            if (dep[n->in[i]]) c->need[n->in[i]] = 1;
    }
}

int autodiff(Graph *g) {
    if (g->loss < 0 || g->loss >= g->n) INTERNAL("autodiff: the graph has no loss");
    AdCtx ctx = {.g = g, .nfwd = g->n};
    AdCtx *c = &ctx;
    int first = g->n;
    c->grad = arena_alloc(g->ar, sizeof(int) * (size_t)c->nfwd);
    c->need = arena_alloc(g->ar, (size_t)c->nfwd);
    for (int i = 0; i < c->nfwd; i++) c->grad[i] = -1;
    ad_mark(c);

    const GNode *loss = ad_node(c, g->loss);
    if (c->need[g->loss]) {
        c->src = loss->src;
        c->grad[g->loss] = ad_const_shaped(c, 1.0, loss->dt, loss->rank, loss->shape);
    }
    for (int id = g->loss; id >= 0; id--) {
        if (!c->need[id] || c->grad[id] < 0) continue;
        const GNode *n = ad_node(c, id);
        c->src = n->src;
        ad_rule(c, n, c->grad[id]);
    }

    g->grads = arena_alloc(g->ar, sizeof(int) * (size_t)(g->nparams > 0 ? g->nparams : 1));
    for (int i = 0; i < g->nparams; i++) {
        int p = g->params[i];
        if (c->grad[p] >= 0) {
            g->grads[i] = c->grad[p];
            continue;
        }
        const GNode *np = ad_node(c, p);
        c->src = np->src;
        g->grads[i] = ad_const_shaped(c, 0.0, np->dt, np->rank, np->shape);
    }
    return first;
}
