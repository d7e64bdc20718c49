/* test_grad.c - gradient checks of compiler/autodiff.c and of the reference evaluator's backward
 * ops (compiler/ref_bwd.c) against central finite differences, in double precision.
 *
 * Build: make unit (links build/libmbtc.a: graph.c builds and verifies, ref.c and ref_bwd.c
 * evaluate, autodiff.c differentiates). Prints `PASS name` or `FAIL name: why` per case, a
 * `# name: max relative error ...` line per gradient check, then `N passed, M failed`; exits 1 on
 * a failure.
 *
 * Each gradient case builds a small forward graph with graph_add: parameters and inputs filled
 * from a seeded PRNG, the op (or stdlib-like layer) under test, and the loss sum(out * R) with R
 * a fixed random input of out's shape (so every output element carries its own weight). Then
 * autodiff; graph_verify must pass and every added node must carry the span of a forward node;
 * ref_run evaluates the whole graph; and each parameter's gradient is compared element by element
 * with (L(p + h) - L(p - h)) / 2h, h = 1e-6, computed by evaluating the forward nodes only.
 *
 * Tolerance: the error of a parameter is max |analytic - numeric| / max(max |numeric|,
 * max |analytic|) over its elements (relative to the largest entry, so an entry that happens to
 * be near zero does not inflate it), and must be below 1e-6. In double precision the central
 * difference's truncation error is about h^2 |L'''| ~ 1e-12 and its rounding error about
 * eps |L| / h ~ 1e-16 * 10 / 1e-6 = 1e-9 for these sizes, so a correct rule lands near 1e-9 or
 * below, while a wrong one is off by O(1). Inputs of non-smooth ops are kept away from their
 * kinks (relu at 0, abs at 0, clamp's ends, floor's integers) by far more than h; the tie cases
 * (max2, max) rely on a central difference at a tie of two measuring exactly 1/2, which is the
 * even split autodiff gives. */
#include "unit.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "autodiff.h"
#include "ref.h"

#define TG_H 1e-6
#define TG_TOL 1e-6
#define TG_MAX_NODES 4096

/* ---- the case under construction ---- */

typedef struct TShape {
    int rank;
    int64_t d[GRAPH_MAX_RANK];
} TShape;

/* S(2, 3) is the shape [2, 3]; S0 a scalar. */
#define S(...) ((TShape){(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}})
#define S0 ((TShape){0, {0}})

typedef struct TG {
    Arena ar; /* the graph, the leaves, names */
    Graph *g;
    uint64_t rng;               /* xorshift64* state */
    uint32_t file;              /* the fake source every node's span points into */
    int nparams, ninputs;       /* for names */
    double *leaf[TG_MAX_NODES]; /* values of each G_PARAM / G_INPUT by id */
} TG;

static TG *tg_begin(uint64_t seed) {
    TG *t = calloc(1, sizeof(TG));
    if (!t) {
        printf("FAIL %s: out of memory\n", unit_case);
        exit(UNIT_EXIT_FAILED);
    }
    t->g = graph_new(&t->ar);
    t->rng = 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
    if (!t->rng) t->rng = 1;
    /* a line long enough that every node's column lies inside it */
    enum { LEN = TG_MAX_NODES + 2 };
    char *text = arena_alloc(&t->ar, LEN);
    memset(text, 'x', LEN - 1);
    text[LEN - 2] = '\n';
    t->file = diag_add_source("grad.mbt", text, LEN - 1);
    return t;
}

static void tg_end(TG *t) {
    arena_free(&t->ar);
    free(t);
}

static double tg_uniform(TG *t, double lo, double hi) {
    t->rng ^= t->rng >> 12;
    t->rng ^= t->rng << 25;
    t->rng ^= t->rng >> 27;
    uint64_t r = t->rng * 2685821657736338717ull;
    return lo + (hi - lo) * ((double)(r >> 11) / 9007199254740992.0);
}

static GNode *tg_n(TG *t, int id) { return graph_node(t->g, id); }
static int64_t tg_numel(TG *t, int id) { return graph_numel(tg_n(t, id)); }

static TShape tg_shape(TG *t, int id) {
    TShape s = {tg_n(t, id)->rank, {0}};
    memcpy(s.d, tg_n(t, id)->shape, sizeof s.d);
    return s;
}

/* Forward node k's span: column k + 1 of the fake source (distinct per node). */
static Span tg_span(TG *t, int id) { return (Span){t->file, (uint32_t)id, 1, 1, (uint32_t)id + 1}; }

static int tg_node(TG *t, GOp op, DType dt, TShape s, int nin, const int *in) {
    if (t->g->n >= TG_MAX_NODES - 1) {
        printf("FAIL %s: the case has too many nodes\n", unit_case);
        exit(UNIT_EXIT_FAILED);
    }
    return graph_add(t->g, op, dt, s.rank, s.d, nin, in, tg_span(t, t->g->n));
}

/* ---- leaves ---- */

/* A leaf with uniform values in [lo, hi). */
static int tg_leaf(TG *t, GOp op, DType dt, TShape s, double lo, double hi) {
    int id = tg_node(t, op, dt, s, 0, NULL);
    GNode *n = tg_n(t, id);
    if (op == G_PARAM) n->name = arena_printf(&t->ar, "p%d", t->nparams++);
    else n->name = arena_printf(&t->ar, "data.in%d", t->ninputs++);
    int64_t k = graph_numel(n);
    t->leaf[id] = arena_alloc(&t->ar, sizeof(double) * (size_t)(k ? k : 1));
    for (int64_t i = 0; i < k; i++) t->leaf[id][i] = tg_uniform(t, lo, hi);
    return id;
}

static int tg_param_in(TG *t, TShape s, double lo, double hi) { return tg_leaf(t, G_PARAM, DT_F32, s, lo, hi); }
static int tg_param(TG *t, TShape s) { return tg_param_in(t, s, -1.0, 1.0); }
static int tg_input_in(TG *t, TShape s, double lo, double hi) { return tg_leaf(t, G_INPUT, DT_F32, s, lo, hi); }
static int tg_input(TG *t, TShape s) { return tg_input_in(t, s, -1.0, 1.0); }

/* A parameter whose values have magnitude in [gap, 1] with a random sign (away from 0). */
static int tg_param_away(TG *t, TShape s, double gap) {
    int id = tg_param(t, s);
    for (int64_t i = 0; i < tg_numel(t, id); i++) {
        double v = t->leaf[id][i];
        t->leaf[id][i] = (v < 0 ? -1.0 : 1.0) * (gap + (1.0 - gap) * fabs(v));
    }
    return id;
}

/* An i32 input of indices in [0, n). */
static int tg_index(TG *t, TShape s, int64_t n) {
    int id = tg_leaf(t, G_INPUT, DT_I32, s, 0.0, (double)n);
    for (int64_t i = 0; i < tg_numel(t, id); i++) t->leaf[id][i] = floor(t->leaf[id][i]);
    return id;
}

/* An i32 input with the given index values. */
static int tg_index_of(TG *t, TShape s, const double *v) {
    int id = tg_leaf(t, G_INPUT, DT_I32, s, 0.0, 1.0);
    for (int64_t i = 0; i < tg_numel(t, id); i++) t->leaf[id][i] = v[i];
    return id;
}

/* ---- op builders (shape rules as graph.h states them) ---- */

static int tg_const(TG *t, double v, DType dt) {
    int id = tg_node(t, G_CONST, dt, S0, 0, NULL);
    tg_n(t, id)->fattr[0] = v;
    return id;
}

static int tg_un(TG *t, GOp op, int x) { return tg_node(t, op, tg_n(t, x)->dt, tg_shape(t, x), 1, &x); }

static int tg_cast(TG *t, int x, DType dt) { return tg_node(t, G_CAST, dt, tg_shape(t, x), 1, &x); }

static TShape tg_bcast(TShape a, TShape b) {
    TShape s = {a.rank > b.rank ? a.rank : b.rank, {0}};
    for (int i = 0; i < s.rank; i++) {
        int ia = i - (s.rank - a.rank), ib = i - (s.rank - b.rank);
        int64_t x = ia >= 0 ? a.d[ia] : 1, y = ib >= 0 ? b.d[ib] : 1;
        s.d[i] = x == 1 ? y : x;
    }
    return s;
}

static int tg_bin(TG *t, GOp op, int a, int b) {
    int in[2] = {a, b};
    int cmp = (op >= G_EQ && op <= G_GE) || op == G_AND || op == G_OR;
    return tg_node(t, op, cmp ? DT_BOOL : tg_n(t, a)->dt, tg_bcast(tg_shape(t, a), tg_shape(t, b)), 2, in);
}

static int tg_where(TG *t, int c, int a, int b) {
    int in[3] = {c, a, b};
    TShape s = tg_bcast(tg_shape(t, c), tg_bcast(tg_shape(t, a), tg_shape(t, b)));
    return tg_node(t, G_WHERE, tg_n(t, a)->dt, s, 3, in);
}

static int tg_reduce(TG *t, GOp op, int x, int axis, int keep) {
    TShape xs = tg_shape(t, x), s = {0, {0}};
    for (int i = 0; i < xs.rank; i++) {
        if (axis == -1 || i == axis) {
            if (keep) s.d[s.rank++] = 1;
        } else {
            s.d[s.rank++] = xs.d[i];
        }
    }
    int id = tg_node(t, op, tg_n(t, x)->dt, s, 1, &x);
    tg_n(t, id)->iattr[0] = axis;
    tg_n(t, id)->iattr[1] = keep;
    return id;
}

static int tg_sum_all(TG *t, int x) { return tg_reduce(t, G_SUM, x, -1, 0); }

static int tg_to_shape(TG *t, GOp op, int x, TShape s) { return tg_node(t, op, tg_n(t, x)->dt, s, 1, &x); }

static int tg_matmul(TG *t, int a, int b) {
    TShape as = tg_shape(t, a), bs = tg_shape(t, b);
    TShape ab = {as.rank >= 2 ? as.rank - 2 : 0, {0}}, bb = {bs.rank >= 2 ? bs.rank - 2 : 0, {0}};
    memcpy(ab.d, as.d, sizeof(int64_t) * (size_t)ab.rank);
    memcpy(bb.d, bs.d, sizeof(int64_t) * (size_t)bb.rank);
    TShape s = tg_bcast(ab, bb);
    if (as.rank >= 2) s.d[s.rank++] = as.d[as.rank - 2];
    if (bs.rank >= 2) s.d[s.rank++] = bs.d[bs.rank - 1];
    int in[2] = {a, b};
    return tg_node(t, G_MATMUL, tg_n(t, a)->dt, s, 2, in);
}

static int tg_transpose(TG *t, int x, int i, int j) {
    TShape s = tg_shape(t, x);
    int64_t k = s.d[i];
    s.d[i] = s.d[j];
    s.d[j] = k;
    int id = tg_node(t, G_TRANSPOSE, tg_n(t, x)->dt, s, 1, &x);
    tg_n(t, id)->iattr[0] = i;
    tg_n(t, id)->iattr[1] = j;
    return id;
}

/* x.T: the last two axes swapped. */
static int tg_T(TG *t, int x) {
    int r = tg_n(t, x)->rank;
    return tg_transpose(t, x, r - 2, r - 1);
}

static int tg_slice(TG *t, int x, int axis, int64_t lo, int64_t hi) {
    TShape s = tg_shape(t, x);
    s.d[axis] = hi - lo;
    int id = tg_node(t, G_SLICE, tg_n(t, x)->dt, s, 1, &x);
    tg_n(t, id)->iattr[0] = axis;
    tg_n(t, id)->iattr[1] = lo;
    tg_n(t, id)->iattr[2] = hi;
    return id;
}

static int tg_concat(TG *t, int n, const int *in, int axis) {
    TShape s = tg_shape(t, in[0]);
    for (int i = 1; i < n; i++) s.d[axis] += tg_n(t, in[i])->shape[axis];
    int id = tg_node(t, G_CONCAT, tg_n(t, in[0])->dt, s, n, in);
    tg_n(t, id)->iattr[0] = axis;
    return id;
}

static int tg_gather(TG *t, int w, int idx) {
    TShape ws = tg_shape(t, w), is = tg_shape(t, idx), s = is;
    for (int i = 1; i < ws.rank; i++) s.d[s.rank++] = ws.d[i];
    int in[2] = {w, idx};
    return tg_node(t, G_GATHER, tg_n(t, w)->dt, s, 2, in);
}

/* An op of x's shape with iattr[0] / fattr[0] set (softmax, log_softmax, rope, dropout ...). */
static int tg_same(TG *t, GOp op, int x, int64_t i0, double f0) {
    int id = tg_un(t, op, x);
    tg_n(t, id)->iattr[0] = i0;
    tg_n(t, id)->fattr[0] = f0;
    return id;
}

static int tg_clamp(TG *t, int x, double lo, double hi) {
    int id = tg_un(t, G_CLAMP, x);
    tg_n(t, id)->fattr[0] = lo;
    tg_n(t, id)->fattr[1] = hi;
    return id;
}

static int tg_layernorm(TG *t, int x, int w, int b, double eps) {
    int in[3] = {x, w, b};
    int id = tg_node(t, G_LAYERNORM, tg_n(t, x)->dt, tg_shape(t, x), 3, in);
    tg_n(t, id)->fattr[0] = eps;
    return id;
}

static int tg_rmsnorm(TG *t, int x, int w, double eps) {
    int in[2] = {x, w};
    int id = tg_node(t, G_RMSNORM, tg_n(t, x)->dt, tg_shape(t, x), 2, in);
    tg_n(t, id)->fattr[0] = eps;
    return id;
}

static int tg_attention(TG *t, int q, int k, int v, int causal) {
    TShape s = tg_shape(t, q);
    s.d[3] = tg_n(t, v)->shape[3];
    int in[3] = {q, k, v};
    int id = tg_node(t, G_ATTENTION, tg_n(t, q)->dt, s, 3, in);
    tg_n(t, id)->iattr[0] = causal;
    tg_n(t, id)->fattr[0] = 1.0 / sqrt((double)tg_n(t, q)->shape[3]);
    return id;
}

static int tg_cross_entropy(TG *t, int logits, int targets) {
    int in[2] = {logits, targets};
    return tg_node(t, G_CROSS_ENTROPY, DT_F32, S0, 2, in);
}

static int tg_topk(TG *t, GOp op, int x, int64_t k, int axis) {
    TShape s = tg_shape(t, x);
    s.d[axis] = k;
    int id = tg_node(t, op, op == G_TOPK_VALUES ? tg_n(t, x)->dt : DT_I32, s, 1, &x);
    tg_n(t, id)->iattr[0] = k;
    tg_n(t, id)->iattr[1] = axis;
    return id;
}

static int tg_one_hot(TG *t, int idx, int64_t n) {
    TShape s = tg_shape(t, idx);
    s.d[s.rank++] = n;
    int id = tg_node(t, G_ONE_HOT, DT_F32, s, 1, &idx);
    tg_n(t, id)->iattr[0] = n;
    return id;
}

/* x @ w + b: nn.Linear (GPT-2's Conv1D layout, w [din, dout]). */
static int tg_linear(TG *t, int x, int64_t din, int64_t dout, int bias) {
    int y = tg_matmul(t, x, tg_param_in(t, S(din, dout), -0.5, 0.5));
    return bias ? tg_bin(t, G_ADD, y, tg_param_in(t, S(dout), -0.5, 0.5)) : y;
}

/* x @ w.T: nn.LinearT (PyTorch's layout, w [dout, din]), no bias. */
static int tg_linear_t(TG *t, int x, int64_t din, int64_t dout) {
    return tg_matmul(t, x, tg_T(t, tg_param_in(t, S(dout, din), -0.5, 0.5)));
}

/* [B, T, heads * hd] -> [B, heads, T, hd] */
static int tg_heads(TG *t, int x, int64_t B, int64_t T, int64_t heads, int64_t hd) {
    return tg_transpose(t, tg_to_shape(t, G_RESHAPE, x, S(B, T, heads, hd)), 1, 2);
}

/* [B, heads, T, hd] -> [B, T, heads * hd] */
static int tg_merge_heads(TG *t, int y, int64_t B, int64_t T, int64_t d) {
    return tg_to_shape(t, G_RESHAPE, tg_transpose(t, y, 1, 2), S(B, T, d));
}

/* ---- evaluation and the check ---- */

/* The loss with the forward nodes only (ids < nfwd), or NAN when the evaluation failed. */
static double tg_forward_loss(TG *t, int nfwd) {
    int n = t->g->n;
    t->g->n = nfwd;
    Arena ar = {0};
    double **vals = ref_run(t->g, t->leaf, &ar);
    double loss = vals ? vals[t->g->loss][0] : NAN;
    arena_free(&ar);
    t->g->n = n;
    return loss;
}

/* Runs autodiff and verifies the result: graph_verify, every added node carrying a forward
 * node's span, every parameter's gradient a new node. Returns the first backward node. */
static int tg_autodiff(TG *t) {
    Graph *g = t->g;
    int nfwd = g->n;
    int first = autodiff(g);
    CHECK(first == nfwd, "autodiff returned %d, the forward graph has %d nodes", first, nfwd);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    int problems = m ? graph_verify(g, m) : -1;
    if (m) fclose(m);
    if (problems != 0) {
        unit_fail_at(__FILE__, __LINE__, "graph_verify found %d problems after autodiff", problems);
        unit_detail("graph_verify", buf);
    }
    free(buf);
    for (int id = nfwd; id < g->n; id++) {
        Span s = tg_n(t, id)->src;
        if (s.file != t->file || (int)s.off >= nfwd) {
            unit_fail_at(__FILE__, __LINE__, "backward node %%%d (%s) has no forward node's span", id,
                         graph_op_name(tg_n(t, id)->op));
            break;
        }
    }
    CHECK(g->grads != NULL, "autodiff left g->grads NULL");
    for (int i = 0; g->grads && i < g->nparams; i++)
        CHECK(g->grads[i] >= nfwd && g->grads[i] < g->n, "the gradient of %%%d is %%%d, not a backward node", g->params[i],
              g->grads[i]);
    return first;
}

/* Sets the loss sum(out * R), differentiates, and compares every parameter's gradient with
 * central differences. Prints and returns the largest relative error. */
static double tg_check(TG *t, int out) {
    Graph *g = t->g;
    int r = tg_leaf(t, G_INPUT, tg_n(t, out)->dt, tg_shape(t, out), -1.0, 1.0);
    g->loss = tg_sum_all(t, tg_bin(t, G_MUL, out, r));
    int nfwd = g->n;
    tg_autodiff(t);
    if (!g->grads) return INFINITY;
    Arena ar = {0};
    double **vals = ref_run(g, t->leaf, &ar);
    CHECK(vals != NULL, "ref_run failed on the differentiated graph");
    double worst = 0.0;
    int64_t count = 0;
    for (int i = 0; vals && i < g->nparams; i++) {
        int p = g->params[i];
        const double *an = vals[g->grads[i]];
        double *v = t->leaf[p];
        double maxdiff = 0.0, maxnum = 0.0, maxan = 0.0;
        int64_t worst_at = 0;
        double worst_an = 0.0, worst_num = 0.0;
        for (int64_t e = 0; e < tg_numel(t, p); e++) {
            double v0 = v[e];
            v[e] = v0 + TG_H;
            double lp = tg_forward_loss(t, nfwd);
            v[e] = v0 - TG_H;
            double lm = tg_forward_loss(t, nfwd);
            v[e] = v0;
            double num = (lp - lm) / (2.0 * TG_H);
            double diff = fabs(an[e] - num);
            if (!(diff <= maxdiff)) { /* also catches NaN */
                maxdiff = diff;
                worst_at = e;
                worst_an = an[e];
                worst_num = num;
            }
            if (fabs(num) > maxnum) maxnum = fabs(num);
            if (fabs(an[e]) > maxan) maxan = fabs(an[e]);
            count++;
        }
        double denom = maxnum > maxan ? maxnum : maxan;
        double err = denom > 0 ? maxdiff / denom : maxdiff;
        if (!(err < TG_TOL))
            unit_fail_at(__FILE__, __LINE__,
                         "d loss / d %s: relative error %.3g at element %lld (autodiff %.12g, finite difference %.12g)",
                         tg_n(t, p)->name, err, (long long)worst_at, worst_an, worst_num);
        if (!(err <= worst)) worst = err;
    }
    arena_free(&ar);
    printf("# %s: max relative error %.2e over %lld parameter values\n", unit_case, worst, (long long)count);
    fflush(stdout);
    return worst;
}

/* ---- elementwise unary ops ---- */

#define UNARY_CASE(fname, OP, lo, hi)                                                                                            \
    static void fname(void) {                                                                                                    \
        TG *t = tg_begin(__LINE__);                                                                                              \
        tg_check(t, tg_un(t, OP, tg_param_in(t, S(3, 4), lo, hi)));                                                              \
        tg_end(t);                                                                                                               \
    }

UNARY_CASE(grad_neg, G_NEG, -1, 1)
UNARY_CASE(grad_exp, G_EXP, -1, 1)
UNARY_CASE(grad_log, G_LOG, 0.5, 2)
UNARY_CASE(grad_sqrt, G_SQRT, 0.5, 2)
UNARY_CASE(grad_rsqrt, G_RSQRT, 0.5, 2)
UNARY_CASE(grad_tanh, G_TANH, -2, 2)
UNARY_CASE(grad_sigmoid, G_SIGMOID, -3, 3)
UNARY_CASE(grad_gelu, G_GELU, -3, 3)
UNARY_CASE(grad_silu, G_SILU, -3, 3)
UNARY_CASE(grad_sin, G_SIN, -3, 3)
UNARY_CASE(grad_cos, G_COS, -3, 3)

/* The kinked ones, with inputs at least 0.05 away from the kink. */
static void grad_relu(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_un(t, G_RELU, tg_param_away(t, S(3, 4), 0.05)));
    tg_end(t);
}

static void grad_abs(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_un(t, G_ABS, tg_param_away(t, S(3, 4), 0.05)));
    tg_end(t);
}

/* sign and floor are piecewise constant: the gradient is zero, and so is the difference. */
static void grad_sign(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param_away(t, S(3, 4), 0.05);
    tg_check(t, tg_bin(t, G_ADD, tg_un(t, G_SIGN, p), tg_un(t, G_TANH, p)));
    tg_end(t);
}

static void grad_floor(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param_in(t, S(3, 4), -3, 3);
    for (int i = 0; i < 12; i++) { /* fractional parts in [0.1, 0.9] */
        double v = t->leaf[p][i], f = v - floor(v);
        t->leaf[p][i] = floor(v) + 0.1 + 0.8 * f;
    }
    tg_check(t, tg_bin(t, G_MUL, tg_un(t, G_FLOOR, p), tg_un(t, G_SIN, p)));
    tg_end(t);
}

/* f32 -> f64 -> tanh -> f32: the gradient is cast back at each step. */
static void grad_cast(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 4));
    tg_check(t, tg_cast(t, tg_un(t, G_TANH, tg_cast(t, p, DT_F64)), DT_F32));
    tg_end(t);
}

/* The backward is dropout of dy with the same p, stream and key (graph.h): the forward's mask,
 * recomputed, so dx = dy * mask / (1 - p), which the finite differences measure. */
static void grad_dropout(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(4, 6));
    int rng = tg_leaf(t, G_INPUT, DT_I64, S(GRAPH_RNG_WORDS), 0.0, 1.0);
    tg_n(t, rng)->name = GRAPH_RNG_NAME;
    const double key[GRAPH_RNG_WORDS] = {1337, 0, 2, 1, 1}; /* seed 1337, step 2, micro-batch 1, on */
    memcpy(t->leaf[rng], key, sizeof key);
    int in[2] = {p, rng};
    int d = tg_node(t, G_DROPOUT, DT_F32, tg_shape(t, p), 2, in);
    tg_n(t, d)->iattr[0] = 11;
    tg_n(t, d)->fattr[0] = 0.3;
    tg_check(t, tg_un(t, G_TANH, d));
    int found = 0;
    for (int id = 0; id < t->g->n; id++) {
        GNode *n = tg_n(t, id);
        if (id != d && n->op == G_DROPOUT) {
            found++;
            CHECK(n->iattr[0] == 11 && n->fattr[0] == 0.3 && n->nin == 2 && n->in[1] == rng,
                  "the backward dropout has stream %lld, p %g and key %%%d", (long long)n->iattr[0], n->fattr[0],
                  n->nin == 2 ? n->in[1] : -1);
        }
    }
    CHECK(found == 1, "%d backward dropout nodes, expected 1", found);
    Arena ar = {0}; /* the mask dropped something and kept something (else the case tests little) */
    double **vals = ref_run(t->g, t->leaf, &ar);
    int zeros = 0;
    for (int i = 0; vals && i < 24; i++) zeros += vals[d][i] == 0.0;
    CHECK(zeros > 0 && zeros < 24, "dropout zeroed %d of 24 values", zeros);
    arena_free(&ar);
    tg_end(t);
}

/* clamp to [-0.5, 0.5]: inputs on both sides of both ends, none within 0.02 of them. */
static void grad_clamp(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(4, 5));
    for (int i = 0; i < 20; i++)
        if (fabs(fabs(t->leaf[p][i]) - 0.5) < 0.02) t->leaf[p][i] *= 1.1;
    tg_check(t, tg_clamp(t, p, -0.5, 0.5));
    tg_end(t);
}

/* ---- elementwise binary ops, broadcasting both ways: [2, 1, 4] with [3, 1] -> [2, 3, 4] ---- */

#define BINARY_CASE(fname, OP, alo, ahi, blo, bhi)                                                                               \
    static void fname(void) {                                                                                                    \
        TG *t = tg_begin(__LINE__);                                                                                              \
        int a = tg_param_in(t, S(2, 1, 4), alo, ahi), b = tg_param_in(t, S(3, 1), blo, bhi);                                     \
        tg_check(t, tg_bin(t, OP, a, b));                                                                                        \
        tg_end(t);                                                                                                               \
    }

BINARY_CASE(grad_add, G_ADD, -1, 1, -1, 1)
BINARY_CASE(grad_sub, G_SUB, -1, 1, -1, 1)
BINARY_CASE(grad_mul, G_MUL, -1, 1, -1, 1)
BINARY_CASE(grad_div, G_DIV, -1, 1, 0.5, 2)
BINARY_CASE(grad_pow, G_POW, 0.5, 2, -1.5, 2.5)
BINARY_CASE(grad_mod, G_MOD, -3, 3, 0.7, 1.5)
BINARY_CASE(grad_max2, G_MAX2, -1, 1, -1, 1)
BINARY_CASE(grad_min2, G_MIN2, -1, 1, -1, 1)

/* x ^ 2 with a constant exponent (the exponent needs no gradient). */
static void grad_pow_const(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 4));
    tg_check(t, tg_bin(t, G_POW, p, tg_const(t, 2.0, DT_F32)));
    tg_end(t);
}

/* a % b with a negative divisor (the remainder takes the divisor's sign). */
static void grad_mod_negative(void) {
    TG *t = tg_begin(__LINE__);
    int a = tg_param_in(t, S(3, 4), -3, 3), b = tg_param_in(t, S(4), -1.5, -0.7);
    tg_check(t, tg_bin(t, G_MOD, a, b));
    tg_end(t);
}

/* max2 / min2 at exact ties: each side gets half (and the central difference measures 1/2). */
static void grad_max2_ties(void) {
    TG *t = tg_begin(__LINE__);
    int a = tg_param(t, S(3, 4)), b = tg_param(t, S(3, 4));
    for (int i = 0; i < 12; i += 2) t->leaf[b][i] = t->leaf[a][i];
    tg_check(t, tg_bin(t, G_ADD, tg_bin(t, G_MAX2, a, b), tg_bin(t, G_MIN2, a, b)));
    tg_end(t);
}

/* where(c > 0, a, b) with a [3, 4] and b [4] broadcast. */
static void grad_where(void) {
    TG *t = tg_begin(__LINE__);
    int c = tg_input(t, S(3, 4));
    int a = tg_param(t, S(3, 4)), b = tg_param(t, S(4));
    int cond = tg_bin(t, G_GT, c, tg_const(t, 0.0, DT_F32));
    tg_check(t, tg_where(t, cond, a, b));
    tg_end(t);
}

/* ---- reductions ---- */

#define REDUCE_CASE(fname, OP, axis, keep)                                                                                       \
    static void fname(void) {                                                                                                    \
        TG *t = tg_begin(__LINE__);                                                                                              \
        tg_check(t, tg_reduce(t, OP, tg_param(t, S(3, 4, 5)), axis, keep));                                                      \
        tg_end(t);                                                                                                               \
    }

REDUCE_CASE(grad_sum_axis1, G_SUM, 1, 0)
REDUCE_CASE(grad_sum_all, G_SUM, -1, 0)
REDUCE_CASE(grad_sum_keepdim, G_SUM, 2, 1)
REDUCE_CASE(grad_mean_axis0, G_MEAN, 0, 0)
REDUCE_CASE(grad_mean_all_keepdim, G_MEAN, -1, 1)
REDUCE_CASE(grad_max_axis2, G_MAX, 2, 0)
REDUCE_CASE(grad_max_all, G_MAX, -1, 0)
REDUCE_CASE(grad_min_axis1_keepdim, G_MIN, 1, 1)
REDUCE_CASE(grad_min_all, G_MIN, -1, 0)
REDUCE_CASE(grad_logsumexp_axis2, G_LOGSUMEXP, 2, 0)
REDUCE_CASE(grad_logsumexp_all_keepdim, G_LOGSUMEXP, -1, 1)

/* max over rows where some row holds its maximum twice: the two share dy evenly. */
static void grad_max_ties(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 5));
    double *v = t->leaf[p];
    v[1] = v[3] = 1.5;    /* row 0: a tie for the maximum */
    v[10] = v[14] = -1.5; /* row 2: a tie for the minimum */
    tg_check(t, tg_bin(t, G_ADD, tg_reduce(t, G_MAX, p, 1, 0), tg_reduce(t, G_MIN, p, 1, 0)));
    tg_end(t);
}

static void grad_norm(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 4));
    tg_check(t, tg_to_shape(t, G_NORM, p, S0));
    tg_end(t);
}

static void grad_sum_to(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_to_shape(t, G_SUM_TO, tg_param(t, S(2, 3, 4)), S(3, 1)));
    tg_end(t);
}

static void grad_broadcast(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_to_shape(t, G_BROADCAST, tg_param(t, S(3, 1)), S(2, 3, 4)));
    tg_end(t);
}

/* ---- composite ops ---- */

static void grad_softmax(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_same(t, G_SOFTMAX, tg_param_in(t, S(2, 3, 5), -2, 2), 2, 0));
    tg_end(t);
}

static void grad_softmax_axis1(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_same(t, G_SOFTMAX, tg_param_in(t, S(2, 4, 3), -2, 2), 1, 0));
    tg_end(t);
}

static void grad_log_softmax(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_same(t, G_LOG_SOFTMAX, tg_param_in(t, S(2, 3, 5), -2, 2), 2, 0));
    tg_end(t);
}

static void grad_log_softmax_axis0(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_same(t, G_LOG_SOFTMAX, tg_param_in(t, S(4, 3), -2, 2), 0, 0));
    tg_end(t);
}

static void grad_layernorm(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param_in(t, S(2, 3, 6), -2, 2), w = tg_param_in(t, S(6), 0.5, 1.5), b = tg_param(t, S(6));
    tg_check(t, tg_layernorm(t, x, w, b, 1e-5));
    tg_end(t);
}

static void grad_rmsnorm(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param_in(t, S(2, 3, 6), -2, 2), w = tg_param_in(t, S(6), 0.5, 1.5);
    tg_check(t, tg_rmsnorm(t, x, w, 1e-6));
    tg_end(t);
}

static void grad_rope(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_same(t, G_ROPE, tg_param(t, S(2, 2, 5, 6)), 0, 10000.0));
    tg_end(t);
}

/* q [B, H, T, hd], k, v [B, Hk, S, hd / hv]; all three parameters. */
static void tg_attention_case(int64_t H, int64_t Hk, int64_t T, int64_t Sk, int64_t hd, int64_t hv, int causal, int line) {
    TG *t = tg_begin((uint64_t)line);
    int q = tg_param_in(t, S(2, H, T, hd), -1.5, 1.5);
    int k = tg_param_in(t, S(2, Hk, Sk, hd), -1.5, 1.5);
    int v = tg_param(t, S(2, Hk, Sk, hv));
    tg_check(t, tg_attention(t, q, k, v, causal));
    tg_end(t);
}

/* Attention masked at document boundaries (issue 20): pos [B, T] the positions within documents,
 * here row 0 holding documents of 2, 3 and 1 tokens and row 1 one document of 6 (and a pos of 9
 * past the row's start, which clamps to it, and a negative one, whose row sees nothing). */
static void grad_attention_docs(void) {
    TG *t = tg_begin((uint64_t)__LINE__);
    int q = tg_param_in(t, S(2, 2, 6, 3), -1.5, 1.5);
    int k = tg_param_in(t, S(2, 1, 6, 3), -1.5, 1.5);
    int v = tg_param(t, S(2, 1, 6, 4));
    static const double pos[12] = {0, 1, 0, 1, 2, 0, 0, 1, 9, 3, -1, 5};
    int p = tg_index_of(t, S(2, 6), pos);
    int id = tg_attention(t, q, k, v, 1);
    GNode *n = tg_n(t, id);
    n->in[n->nin++] = p;
    n->iattr[1] = 1;
    tg_check(t, id);
    tg_end(t);
}

/* rope with positions restarting per document (issue 20): x [B, H, T, hd], pos [B, T]. */
static void grad_rope_docs(void) {
    TG *t = tg_begin(__LINE__);
    static const double pos[8] = {0, 1, 0, 1, 0, 1, 2, 3};
    int x = tg_param(t, S(2, 2, 4, 6));
    int p = tg_index_of(t, S(2, 4), pos);
    int id = tg_same(t, G_ROPE, x, 0, 10000.0);
    GNode *n = tg_n(t, id);
    n->in[n->nin++] = p;
    n->iattr[1] = 1;
    tg_check(t, id);
    tg_end(t);
}

static void grad_attention(void) { tg_attention_case(2, 2, 4, 4, 3, 3, 0, __LINE__); }
static void grad_attention_causal(void) { tg_attention_case(2, 2, 4, 4, 3, 3, 1, __LINE__); }
static void grad_attention_gqa(void) { tg_attention_case(4, 2, 4, 4, 3, 5, 1, __LINE__); }
/* T = 3 queries over S = 5 keys, causal (bottom-right aligned: query t sees keys <= t + 2). */
static void grad_attention_cross_causal(void) { tg_attention_case(2, 1, 3, 5, 4, 2, 1, __LINE__); }

static void grad_cross_entropy(void) {
    TG *t = tg_begin(__LINE__);
    int logits = tg_param_in(t, S(2, 3, 5), -2, 2);
    tg_check(t, tg_cross_entropy(t, logits, tg_index(t, S(2, 3), 5)));
    tg_end(t);
}

static void grad_mse(void) {
    TG *t = tg_begin(__LINE__);
    int a = tg_param(t, S(3, 4)), b = tg_param(t, S(3, 4));
    int in[2] = {a, b};
    tg_check(t, tg_node(t, G_MSE, DT_F32, S0, 2, in));
    tg_end(t);
}

static void grad_topk(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_topk(t, G_TOPK_VALUES, tg_param(t, S(3, 6)), 3, 1));
    tg_end(t);
}

static void grad_topk_axis0(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_topk(t, G_TOPK_VALUES, tg_param(t, S(5, 2, 3)), 2, 0));
    tg_end(t);
}

/* ---- matmul ---- */

#define MATMUL_CASE(fname, SA, SB)                                                                                               \
    static void fname(void) {                                                                                                    \
        TG *t = tg_begin(__LINE__);                                                                                              \
        tg_check(t, tg_matmul(t, tg_param(t, SA), tg_param(t, SB)));                                                             \
        tg_end(t);                                                                                                               \
    }

MATMUL_CASE(grad_matmul, S(3, 4), S(4, 5))
MATMUL_CASE(grad_matmul_batched, S(2, 3, 4), S(2, 4, 5))
MATMUL_CASE(grad_matmul_bcast_right, S(2, 3, 4), S(4, 5))
MATMUL_CASE(grad_matmul_bcast_both, S(2, 1, 3, 4), S(3, 4, 2))
MATMUL_CASE(grad_matmul_vec_left, S(4), S(2, 4, 3))
MATMUL_CASE(grad_matmul_vec_right, S(2, 3, 4), S(4))
MATMUL_CASE(grad_matmul_dot, S(4), S(4))

/* ---- data movement ---- */

static void grad_reshape(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(2, 3, 4));
    tg_check(t, tg_un(t, G_TANH, tg_to_shape(t, G_RESHAPE, p, S(4, 6))));
    tg_end(t);
}

static void grad_transpose(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_transpose(t, tg_param(t, S(2, 3, 4)), 0, 2));
    tg_end(t);
}

static void grad_slice(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 6));
    int a = tg_slice(t, p, 1, 1, 4), b = tg_slice(t, p, 1, 0, 2), c = tg_slice(t, p, 0, 1, 3);
    int ab = tg_bin(t, G_MUL, tg_slice(t, a, 1, 1, 3), b); /* [3, 2] */
    tg_check(t, tg_bin(t, G_ADD, tg_sum_all(t, ab), tg_sum_all(t, tg_un(t, G_SIN, c))));
    tg_end(t);
}

/* Embedding-style gather with repeated indices: their rows' gradients add up. */
static void grad_gather(void) {
    TG *t = tg_begin(__LINE__);
    int w = tg_param(t, S(5, 3));
    static const double idx[8] = {0, 3, 3, 1, 4, 0, 3, 2};
    tg_check(t, tg_gather(t, w, tg_index_of(t, S(2, 4), idx)));
    tg_end(t);
}

static void grad_gather_rows3d(void) {
    TG *t = tg_begin(__LINE__);
    int w = tg_param(t, S(4, 2, 3));
    static const double idx[3] = {2, 2, 0};
    tg_check(t, tg_gather(t, w, tg_index_of(t, S(3), idx)));
    tg_end(t);
}

static void grad_concat(void) {
    TG *t = tg_begin(__LINE__);
    int in[3] = {tg_param(t, S(2, 3)), tg_param(t, S(2, 1)), tg_param(t, S(2, 4))};
    int c1 = tg_concat(t, 3, in, 1);
    int in2[2] = {tg_param(t, S(1, 8)), c1};
    tg_check(t, tg_concat(t, 2, in2, 0));
    tg_end(t);
}

/* scatter_add (gather's backward) used forward: its own gradient is a gather. */
static void grad_scatter_add(void) {
    TG *t = tg_begin(__LINE__);
    int u = tg_param(t, S(4, 3));
    static const double idx[4] = {1, 0, 1, 4};
    int in[2] = {u, tg_index_of(t, S(4), idx)};
    tg_check(t, tg_node(t, G_SCATTER_ADD, DT_F32, S(5, 3), 2, in));
    tg_end(t);
}

/* ---- ops without a gradient ---- */

/* Comparisons, logic, integer casts, arange and one_hot in the forward graph contribute no
 * gradient (and the differences agree: they are locally constant). */
static void grad_nondiff_ops(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 4)), q = tg_param(t, S(3, 4));
    int zero = tg_const(t, 0.0, DT_F32), half = tg_const(t, 0.5, DT_F32);
    int m = tg_bin(t, G_AND, tg_bin(t, G_GT, p, zero), tg_un(t, G_NOT, tg_bin(t, G_GT, p, half)));
    m = tg_bin(t, G_OR, m, tg_bin(t, G_EQ, q, tg_const(t, 7.0, DT_F32)));
    int w = tg_where(t, m, p, q);
    int three = tg_const(t, 3.0, DT_F32);
    int ip = tg_cast(t, tg_cast(t, tg_bin(t, G_MUL, p, three), DT_I32), DT_F32); /* trunc(3p) */
    int ar = tg_cast(t, tg_node(t, G_ARANGE, DT_I32, S(4), 0, NULL), DT_F32);
    static const double idx[3] = {2, 0, 3};
    int oh = tg_one_hot(t, tg_index_of(t, S(3), idx), 4);
    int out = tg_bin(t, G_ADD, w, tg_bin(t, G_MUL, ip, ar));
    out = tg_bin(t, G_ADD, out, tg_bin(t, G_MUL, oh, q));
    tg_check(t, out);
    tg_end(t);
}

/* A parameter that reaches the loss only through topk's indices gets a zero gradient. */
static void grad_indices_only(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3, 5)), w = tg_param(t, S(5, 2));
    int idx = tg_topk(t, G_TOPK_INDICES, p, 2, 1); /* [3, 2] */
    tg_check(t, tg_gather(t, w, idx));
    GNode *d = tg_n(t, t->g->grads[0]);
    CHECK(d->op == G_CONST && d->fattr[0] == 0.0, "p's gradient is %s, not a zero constant", graph_op_name(d->op));
    tg_end(t);
}

/* ---- layers as the stdlib writes them ---- */

/* nn.Linear with bias on [B, T, din] data. */
static void grad_linear_bias(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_linear(t, tg_input(t, S(2, 3, 4)), 4, 5, 1));
    tg_end(t);
}

/* nn.MLP: c_proj(gelu(c_fc(x))), x a parameter too (its gradient flows back to earlier layers). */
static void grad_mlp(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param(t, S(2, 3, 4));
    tg_check(t, tg_linear(t, tg_un(t, G_GELU, tg_linear(t, x, 4, 8, 1)), 8, 4, 1));
    tg_end(t);
}

/* nn.WSLinear (Weight Standardization): x @ w_hat + b with w_hat's columns the raw weight's,
 * centred over the fan-in (axis 0) and divided by sqrt(their variance + eps), as stdlib/nn.mbt
 * writes it. The raw weight's gradient flows through the mean and the variance; the weight is
 * drawn in [-1, 1] so that every column's variance is far above eps. */
static void grad_ws_linear(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param(t, S(2, 3, 4));
    int w = tg_param(t, S(4, 5));
    int c = tg_bin(t, G_SUB, w, tg_reduce(t, G_MEAN, w, 0, 1));
    int var = tg_reduce(t, G_MEAN, tg_bin(t, G_MUL, c, c), 0, 1);
    int what = tg_bin(t, G_MUL, c, tg_un(t, G_RSQRT, tg_bin(t, G_ADD, var, tg_const(t, 1e-5, DT_F32))));
    tg_check(t, tg_bin(t, G_ADD, tg_matmul(t, x, what), tg_param(t, S(5))));
    tg_end(t);
}

/* x normalised over axis `axis` of its (already reshaped) view: (x - mean) * rsqrt(var + eps),
 * the biased variance, as stdlib/nn.mbt writes GhostBatchNorm's and BatchChannelNorm's steps. */
static int tg_standardize(TG *t, int x, int axis, double eps) {
    int c = tg_bin(t, G_SUB, x, tg_reduce(t, G_MEAN, x, axis, 1));
    int var = tg_reduce(t, G_MEAN, tg_bin(t, G_MUL, c, c), axis, 1);
    return tg_bin(t, G_MUL, c, tg_un(t, G_RSQRT, tg_bin(t, G_ADD, var, tg_const(t, eps, DT_F32))));
}

/* nn.GhostBatchNorm(5, ghost = 2) on [4, 3, 5]: the 4 samples as 2 ghost batches of 2, each
 * channel normalised over its ghost batch's (samples, positions), then weight and bias. The
 * gradient reaches x through both statistics. */
static void grad_ghost_batch_norm(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param(t, S(4, 3, 5));
    int g = tg_standardize(t, tg_to_shape(t, G_RESHAPE, x, S(2, 6, 5)), 1, 1e-5);
    int y = tg_bin(t, G_MUL, tg_to_shape(t, G_RESHAPE, g, S(4, 3, 5)), tg_param_in(t, S(5), 0.5, 1.5));
    tg_check(t, tg_bin(t, G_ADD, y, tg_param(t, S(5))));
    tg_end(t);
}

/* nn.BatchChannelNorm(8, groups = 2) on [2, 3, 8]: each channel normalised over the micro-batch's
 * (samples, positions) with batch_weight, batch_bias, then each token's 2 groups of 4 channels
 * normalised with weight, bias. */
static void grad_batch_channel_norm(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param(t, S(2, 3, 8));
    int b = tg_standardize(t, tg_to_shape(t, G_RESHAPE, x, S(6, 8)), 0, 1e-5);
    b = tg_bin(t, G_ADD, tg_bin(t, G_MUL, b, tg_param_in(t, S(8), 0.5, 1.5)), tg_param(t, S(8)));
    int n = tg_standardize(t, tg_to_shape(t, G_RESHAPE, b, S(2, 3, 2, 4)), 3, 1e-5);
    int y = tg_bin(t, G_MUL, tg_to_shape(t, G_RESHAPE, n, S(2, 3, 8)), tg_param_in(t, S(8), 0.5, 1.5));
    tg_check(t, tg_bin(t, G_ADD, y, tg_param(t, S(8))));
    tg_end(t);
}

/* nn.LayerNorm after a linear map. */
static void grad_layernorm_layer(void) {
    TG *t = tg_begin(__LINE__);
    int h = tg_linear(t, tg_input(t, S(2, 3, 4)), 4, 6, 1);
    int w = tg_param_in(t, S(6), 0.5, 1.5), b = tg_param(t, S(6));
    tg_check(t, tg_layernorm(t, h, w, b, 1e-5));
    tg_end(t);
}

/* nn.RMSNorm after nn.LinearT. */
static void grad_rmsnorm_layer(void) {
    TG *t = tg_begin(__LINE__);
    int h = tg_linear_t(t, tg_input(t, S(2, 3, 4)), 4, 6);
    tg_check(t, tg_rmsnorm(t, h, tg_param_in(t, S(6), 0.5, 1.5), 1e-5));
    tg_end(t);
}

/* nn.Embedding plus positions: wte[idx] + wpe[0:T], with repeated token ids. */
static void grad_embedding(void) {
    TG *t = tg_begin(__LINE__);
    int wte = tg_param(t, S(6, 4)), wpe = tg_param(t, S(8, 4));
    static const double ids[10] = {1, 5, 1, 1, 0, 2, 5, 5, 3, 1};
    int x = tg_gather(t, wte, tg_index_of(t, S(2, 5), ids));
    tg_check(t, tg_bin(t, G_ADD, x, tg_slice(t, wpe, 0, 0, 5)));
    tg_end(t);
}

/* Causal self-attention as nn.CausalSelfAttention, with rope on q and k (as Llama): c_attn,
 * split into q, k, v, heads by reshape + transpose, attention, heads merged, c_proj. */
static int tg_self_attention(TG *t, int x, int64_t B, int64_t T, int64_t d, int64_t heads, int rope) {
    int64_t hd = d / heads;
    int qkv = tg_linear(t, x, d, 3 * d, 1);
    int q = tg_heads(t, tg_slice(t, qkv, 2, 0, d), B, T, heads, hd);
    int k = tg_heads(t, tg_slice(t, qkv, 2, d, 2 * d), B, T, heads, hd);
    int v = tg_heads(t, tg_slice(t, qkv, 2, 2 * d, 3 * d), B, T, heads, hd);
    if (rope) {
        q = tg_same(t, G_ROPE, q, 0, 10000.0);
        k = tg_same(t, G_ROPE, k, 0, 10000.0);
    }
    int y = tg_merge_heads(t, tg_attention(t, q, k, v, 1), B, T, d);
    return tg_linear(t, y, d, d, 1);
}

static void grad_causal_self_attention(void) {
    TG *t = tg_begin(__LINE__);
    int x = tg_param(t, S(2, 4, 8));
    tg_check(t, tg_self_attention(t, x, 2, 4, 8, 2, 1));
    tg_end(t);
}

/* nn.GPT2Block: x + attn(ln_1(x)), then + mlp(ln_2(x)). */
static void grad_gpt2_block(void) {
    TG *t = tg_begin(__LINE__);
    int64_t B = 2, T = 3, d = 8;
    int x = tg_param(t, S(B, T, d));
    int h = tg_layernorm(t, x, tg_param_in(t, S(d), 0.5, 1.5), tg_param(t, S(d)), 1e-5);
    x = tg_bin(t, G_ADD, x, tg_self_attention(t, h, B, T, d, 2, 0));
    h = tg_layernorm(t, x, tg_param_in(t, S(d), 0.5, 1.5), tg_param(t, S(d)), 1e-5);
    x = tg_bin(t, G_ADD, x, tg_linear(t, tg_un(t, G_GELU, tg_linear(t, h, d, 2 * d, 1)), 2 * d, d, 1));
    tg_check(t, x);
    tg_end(t);
}

/* nn.LlamaBlock: RMSNorm, grouped-query attention (4 heads over 2 kv heads) with rope, RMSNorm,
 * SwiGLU, both with residuals; LinearT projections without bias. */
static void grad_llama_block(void) {
    TG *t = tg_begin(__LINE__);
    int64_t B = 2, T = 3, d = 8, heads = 4, kvh = 2, hd = 2, hidden = 6;
    int x = tg_param(t, S(B, T, d));
    int h = tg_rmsnorm(t, x, tg_param_in(t, S(d), 0.5, 1.5), 1e-5);
    int q = tg_same(t, G_ROPE, tg_heads(t, tg_linear_t(t, h, d, d), B, T, heads, hd), 0, 10000.0);
    int k = tg_same(t, G_ROPE, tg_heads(t, tg_linear_t(t, h, d, kvh * hd), B, T, kvh, hd), 0, 10000.0);
    int v = tg_heads(t, tg_linear_t(t, h, d, kvh * hd), B, T, kvh, hd);
    int y = tg_merge_heads(t, tg_attention(t, q, k, v, 1), B, T, d);
    x = tg_bin(t, G_ADD, x, tg_linear_t(t, y, d, d));
    h = tg_rmsnorm(t, x, tg_param_in(t, S(d), 0.5, 1.5), 1e-5);
    int gate = tg_un(t, G_SILU, tg_linear_t(t, h, d, hidden)), up = tg_linear_t(t, h, d, hidden);
    x = tg_bin(t, G_ADD, x, tg_linear_t(t, tg_bin(t, G_MUL, gate, up), hidden, d));
    tg_check(t, x);
    tg_end(t);
}

/* A tiny language model's loss: embedding, LayerNorm, logits with the tied embedding (wte used
 * twice), cross-entropy against targets. The loss is already a scalar: out * R with R a scalar. */
static void grad_cross_entropy_lm(void) {
    TG *t = tg_begin(__LINE__);
    int wte = tg_param(t, S(7, 4));
    static const double ids[6] = {3, 1, 3, 6, 0, 3}, tgt[6] = {1, 3, 6, 0, 3, 2};
    int x = tg_gather(t, wte, tg_index_of(t, S(2, 3), ids));
    int h = tg_layernorm(t, x, tg_param_in(t, S(4), 0.5, 1.5), tg_param(t, S(4)), 1e-5);
    int logits = tg_matmul(t, h, tg_T(t, wte));
    tg_check(t, tg_cross_entropy(t, logits, tg_index_of(t, S(2, 3), tgt)));
    tg_end(t);
}

/* nn.MoE with 4 experts, top 2: router scores, the k-th best via topk and min, a softmax over
 * where(logits >= kth, logits, -1e9), each expert's output weighted by its gate column. */
static void grad_moe(void) {
    TG *t = tg_begin(__LINE__);
    int64_t B = 2, T = 3, d = 4, hidden = 3, E = 4, K = 2;
    int x = tg_param(t, S(B, T, d));
    int logits = tg_linear_t(t, x, d, E); /* [B, T, E] */
    int top = tg_topk(t, G_TOPK_VALUES, logits, K, 2);
    int kth = tg_reduce(t, G_MIN, top, 2, 1); /* [B, T, 1] */
    int masked = tg_where(t, tg_bin(t, G_GE, logits, kth), logits, tg_const(t, -1e9, DT_F32));
    int gates = tg_same(t, G_SOFTMAX, masked, 2, 0);
    int y = -1;
    for (int64_t e = 0; e < E; e++) {
        int g = tg_linear_t(t, x, d, hidden), u = tg_linear_t(t, x, d, hidden);
        int ex = tg_linear_t(t, tg_bin(t, G_MUL, tg_un(t, G_SILU, g), u), hidden, d);
        int term = tg_bin(t, G_MUL, tg_slice(t, gates, 2, e, e + 1), ex);
        y = y < 0 ? term : tg_bin(t, G_ADD, y, term);
    }
    tg_check(t, y);
    tg_end(t);
}

/* nn.MoE.forward_aux's router loss on x [B, T, d] with router weight w [E, d], top K:
 * E x sum(f * P) + z, P the mean softmax over tokens, f the mean over tokens of the top-K mask
 * divided by K (a comparison: no gradient), z the mean of logsumexp(logits)^2. With `global`, f is
 * read through a statistic (global_mean): an f32 input recorded with f's node (Graph.stat_in). */
static int tg_router_aux(TG *t, int x, int w, int64_t E, int64_t K, int global) {
    int logits = tg_matmul(t, x, tg_T(t, w)); /* [B, T, E] */
    int kth = tg_reduce(t, G_MIN, tg_topk(t, G_TOPK_VALUES, logits, K, 2), 2, 1);
    int chosen = tg_cast(t, tg_bin(t, G_GE, logits, kth), DT_F32);
    int p = tg_reduce(t, G_MEAN, tg_reduce(t, G_MEAN, tg_same(t, G_SOFTMAX, logits, 2, 0), 0, 0), 0, 0); /* [E] */
    int f = tg_bin(t, G_DIV, tg_reduce(t, G_MEAN, tg_reduce(t, G_MEAN, chosen, 0, 0), 0, 0), tg_const(t, (double)K, DT_F32));
    if (global) {
        int in = tg_input_in(t, tg_shape(t, f), 0.0, 0.5); /* pass 1 overwrites it (ref_global_stats) */
        graph_add_stat(t->g, in, f);
        f = in;
    }
    int lb = tg_bin(t, G_MUL, tg_sum_all(t, tg_bin(t, G_MUL, f, p)), tg_const(t, (double)E, DT_F32));
    int lse = tg_reduce(t, G_LOGSUMEXP, logits, 2, 0);
    int z = tg_reduce(t, G_MEAN, tg_bin(t, G_MUL, lse, lse), -1, 0);
    return tg_bin(t, G_ADD, tg_bin(t, G_MUL, lb, tg_const(t, 0.01, DT_F32)), tg_bin(t, G_MUL, z, tg_const(t, 0.001, DT_F32)));
}

/* The router loss with each micro-batch's own f: P and z carry the gradient, f none. */
static void grad_moe_aux_micro(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_router_aux(t, tg_input(t, S(2, 3, 4)), tg_param(t, S(4, 4)), 4, 2, 0));
    tg_end(t);
}

/* The same with f a statistic: a constant of the backward (its input's value as given). */
static void grad_moe_aux_global(void) {
    TG *t = tg_begin(__LINE__);
    tg_check(t, tg_router_aux(t, tg_input(t, S(2, 3, 4)), tg_param(t, S(4, 4)), 4, 2, 1));
    tg_end(t);
}

/* ---- global_mean over several micro-batches ---- */

typedef struct TgMicro {
    TG *t;
    int xin;
    double *const *xs; /* [M] each micro-batch's x */
} TgMicro;

static void tg_load_micro(void *ctx, int64_t m, double **leaves) {
    TgMicro *c = ctx;
    memcpy(leaves[c->xin], c->xs[m], (size_t)tg_numel(c->t, c->xin) * sizeof(double));
}

/* The step's objective over M micro-batches, (1/M) sum_m L_m, with the statistics over all M
 * (global) or over each micro-batch alone (per micro-batch: the statistics pass over that one).
 * With grad (the graph differentiated), each parameter's accumulated gradient into grad[i]. */
static double tg_step_objective(TG *t, TgMicro *c, int64_t M, int global, int nfwd, double **grad) {
    Graph *g = t->g;
    int n = g->n;
    if (!grad) g->n = nfwd;
    Arena ar = {0};
    double J = 0;
    if (global && ref_global_stats(g, M, tg_load_micro, c, t->leaf, &ar)) J = NAN;
    for (int64_t m = 0; m < M && !isnan(J); m++) {
        TgMicro one = {t, c->xin, c->xs + m};
        if (!global && ref_global_stats(g, 1, tg_load_micro, &one, t->leaf, &ar)) J = NAN;
        tg_load_micro(c, m, t->leaf);
        Arena run = {0};
        double **vals = ref_run(g, t->leaf, &run);
        if (!vals) J = NAN;
        else J += vals[g->loss][0] / (double)M;
        for (int i = 0; vals && grad && i < g->nparams; i++)
            for (int64_t e = 0; e < tg_numel(t, g->params[i]); e++) grad[i][e] += vals[g->grads[i]][e] / (double)M;
        arena_free(&run);
    }
    arena_free(&ar);
    g->n = n;
    return J;
}

/* The global-batch router loss over 4 micro-batches: the gradient the two passes accumulate
 * (statistics first, then each micro-batch's backward reading them) against central differences
 * of the whole step objective, statistics recomputed (no routing decision flips within h); the
 * objective differs from the per-micro-batch one at 4 micro-batches and is bit-identical to it at
 * 1, where the global batch is the micro-batch. */
static void moe_global_micro_batches(void) {
    TG *t = tg_begin(__LINE__);
    enum { M = 4 };
    int x = tg_input(t, S(2, 3, 4));
    int w = tg_param(t, S(4, 4));
    t->g->loss = tg_router_aux(t, x, w, 4, 2, 1);
    int nfwd = t->g->n;
    double *xs[M];
    for (int m = 0; m < M; m++) {
        xs[m] = arena_alloc(&t->ar, sizeof(double) * (size_t)tg_numel(t, x));
        for (int64_t e = 0; e < tg_numel(t, x); e++) xs[m][e] = tg_uniform(t, -1.0, 1.0);
    }
    TgMicro c = {t, x, xs};
    double j1g = tg_step_objective(t, &c, 1, 1, nfwd, NULL), j1m = tg_step_objective(t, &c, 1, 0, nfwd, NULL);
    CHECK(j1g == j1m, "one micro-batch: global %.17g, per micro-batch %.17g (must be the same bits)", j1g, j1m);
    double jg = tg_step_objective(t, &c, M, 1, nfwd, NULL), jm = tg_step_objective(t, &c, M, 0, nfwd, NULL);
    CHECK(fabs(jg - jm) > 1e-6 * fabs(jm), "4 micro-batches: global %.17g and per micro-batch %.17g do not differ", jg, jm);
    printf("# %s: 1 micro-batch %.17g both; 4: global %.12g, per micro-batch %.12g\n", unit_case, j1g, jg, jm);
    tg_autodiff(t);
    double *grad = arena_alloc(&t->ar, sizeof(double) * (size_t)tg_numel(t, w));
    double *gp[1] = {grad};
    tg_step_objective(t, &c, M, 1, nfwd, gp);
    double *v = t->leaf[w], maxdiff = 0, maxnum = 0;
    for (int64_t e = 0; e < tg_numel(t, w); e++) {
        double v0 = v[e];
        v[e] = v0 + TG_H;
        double lp = tg_step_objective(t, &c, M, 1, nfwd, NULL);
        v[e] = v0 - TG_H;
        double lm = tg_step_objective(t, &c, M, 1, nfwd, NULL);
        v[e] = v0;
        double num = (lp - lm) / (2.0 * TG_H);
        if (!(fabs(num - grad[e]) <= maxdiff)) maxdiff = fabs(num - grad[e]);
        if (fabs(num) > maxnum) maxnum = fabs(num);
    }
    double err = maxnum > 0 ? maxdiff / maxnum : maxdiff;
    CHECK(err < TG_TOL, "the two-pass gradient over 4 micro-batches: relative error %.3g", err);
    printf("# %s: max relative error %.2e of the accumulated gradient\n", unit_case, err);
    tg_end(t);
}

/* topk's own backward inside a layer: the mean of each row's 2 best scores. */
static void grad_topk_layer(void) {
    TG *t = tg_begin(__LINE__);
    int logits = tg_linear(t, tg_input(t, S(2, 3, 4)), 4, 5, 1);
    tg_check(t, tg_reduce(t, G_MEAN, tg_topk(t, G_TOPK_VALUES, logits, 2, 2), 2, 0));
    tg_end(t);
}

/* ---- structural properties ---- */

/* Builds loss = sum(x @ W * R) (+ a parameter-free branch sum(tanh(exp(x2)) * R2) when `branch`);
 * returns the number of backward nodes autodiff added, and the branch's ids in [*lo, *hi). */
static int tg_build_branchy(int branch, int *lo, int *hi) {
    TG *t = tg_begin(7);
    int x = tg_input(t, S(3, 4)), w = tg_param(t, S(4, 2));
    int la = tg_sum_all(t, tg_bin(t, G_MUL, tg_matmul(t, x, w), tg_input(t, S(3, 2))));
    int loss = la;
    *lo = *hi = t->g->n;
    if (branch) {
        int x2 = tg_input(t, S(5));
        int z = tg_un(t, G_TANH, tg_un(t, G_EXP, x2));
        int lb = tg_sum_all(t, tg_bin(t, G_MUL, z, tg_input(t, S(5))));
        *hi = t->g->n;
        loss = tg_bin(t, G_ADD, la, lb);
    }
    t->g->loss = loss;
    int nfwd = t->g->n;
    tg_autodiff(t);
    int added = t->g->n - nfwd;
    for (int id = nfwd; id < t->g->n; id++) /* nothing backward reads the branch */
        for (int i = 0; i < tg_n(t, id)->nin; i++) {
            int in = tg_n(t, id)->in[i];
            CHECK(in < *lo || in >= *hi, "backward node %%%d reads %%%d of the parameter-free branch", id, in);
        }
    tg_end(t);
    return added;
}

static void struct_param_free_subgraph(void) {
    int lo, hi;
    int without = tg_build_branchy(0, &lo, &hi);
    int with = tg_build_branchy(1, &lo, &hi);
    CHECK(with == without, "a parameter-free branch added %d backward nodes (%d with it, %d without)", with - without, with,
          without);
}

/* A loss with no parameter on its path: autodiff adds the zero gradients and nothing else. */
static void struct_loss_without_params(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(2, 3)), x = tg_input(t, S(4));
    (void)p;
    t->g->loss = tg_sum_all(t, tg_un(t, G_TANH, x));
    int nfwd = t->g->n;
    tg_autodiff(t);
    CHECK(t->g->n == nfwd + 1, "autodiff added %d nodes, expected 1 (the zero gradient)", t->g->n - nfwd);
    tg_end(t);
}

/* A parameter the loss does not use gets a zero G_CONST of its shape; the others are right. */
static void struct_unused_param_zero(void) {
    TG *t = tg_begin(__LINE__);
    int w = tg_param(t, S(4, 2)), u = tg_param(t, S(3, 5));
    (void)u;
    tg_check(t, tg_matmul(t, tg_input(t, S(3, 4)), w));
    GNode *d = tg_n(t, t->g->grads[1]);
    CHECK(d->op == G_CONST && d->fattr[0] == 0.0, "the unused parameter's gradient is %s %g", graph_op_name(d->op), d->fattr[0]);
    CHECK(d->rank == 2 && d->shape[0] == 3 && d->shape[1] == 5 && d->dt == DT_F32, "the zero gradient has the wrong type");
    tg_end(t);
}

/* loss = p (a rank-0 parameter): the gradient is the seed, 1. */
static void struct_loss_is_param(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S0);
    t->g->loss = p;
    tg_autodiff(t);
    GNode *d = tg_n(t, t->g->grads[0]);
    CHECK(d->op == G_CONST && d->fattr[0] == 1.0 && d->rank == 0, "d p / d p is %s %g", graph_op_name(d->op), d->fattr[0]);
    tg_end(t);
}

/* A parameter used three times accumulates three contributions with G_ADD. */
static void struct_accumulates(void) {
    TG *t = tg_begin(__LINE__);
    int p = tg_param(t, S(3));
    int y = tg_bin(t, G_ADD, tg_bin(t, G_MUL, p, p), tg_un(t, G_EXP, p));
    tg_check(t, y);
    GNode *d = tg_n(t, t->g->grads[0]);
    CHECK(d->op == G_ADD, "p's gradient is %s, expected the add of its uses", graph_op_name(d->op));
    tg_end(t);
}

/* The reference backward ops report bad indices instead of reading out of bounds. */
static void struct_ref_bwd_bad_index(void) {
    TG *t = tg_begin(__LINE__);
    int u = tg_input(t, S(2, 3));
    static const double idx[2] = {0, 4};
    int in[2] = {u, tg_index_of(t, S(2), idx)};
    int sc = tg_node(t, G_SCATTER_ADD, DT_F32, S(4, 3), 2, in);
    static const double tgt[2] = {1, 5};
    int ce[3] = {tg_const(t, 1.0, DT_F32), tg_input(t, S(2, 5)), tg_index_of(t, S(2), tgt)};
    tg_node(t, G_CROSS_ENTROPY_BWD, DT_F32, S(2, 5), 3, ce);
    Arena ar = {0};
    capture_begin();
    double **vals = ref_run(t->g, t->leaf, &ar);
    const char *err = capture_end();
    CHECK(vals == NULL, "ref_run accepted index 4 for 4 rows");
    CHECK(strstr(err, "scatter_add: index 4") != NULL, "unexpected message: %s", err);
    arena_free(&ar);
    /* the cross-entropy backward alone */
    tg_n(t, sc)->op = G_CONST; /* the scatter_add out of the way: a constant of its shape */
    tg_n(t, sc)->nin = 0;
    capture_begin();
    vals = ref_run(t->g, t->leaf, &ar);
    err = capture_end();
    CHECK(vals == NULL, "ref_run accepted target 5 for 5 classes");
    CHECK(strstr(err, "cross_entropy: target 5") != NULL, "unexpected message: %s", err);
    arena_free(&ar);
    tg_end(t);
}

int main(void) {
    RUN(grad_neg);
    RUN(grad_exp);
    RUN(grad_log);
    RUN(grad_sqrt);
    RUN(grad_rsqrt);
    RUN(grad_tanh);
    RUN(grad_sigmoid);
    RUN(grad_relu);
    RUN(grad_gelu);
    RUN(grad_silu);
    RUN(grad_abs);
    RUN(grad_sign);
    RUN(grad_sin);
    RUN(grad_cos);
    RUN(grad_floor);
    RUN(grad_cast);
    RUN(grad_dropout);
    RUN(grad_clamp);

    RUN(grad_add);
    RUN(grad_sub);
    RUN(grad_mul);
    RUN(grad_div);
    RUN(grad_pow);
    RUN(grad_pow_const);
    RUN(grad_mod);
    RUN(grad_mod_negative);
    RUN(grad_max2);
    RUN(grad_min2);
    RUN(grad_max2_ties);
    RUN(grad_where);

    RUN(grad_sum_axis1);
    RUN(grad_sum_all);
    RUN(grad_sum_keepdim);
    RUN(grad_mean_axis0);
    RUN(grad_mean_all_keepdim);
    RUN(grad_max_axis2);
    RUN(grad_max_all);
    RUN(grad_min_axis1_keepdim);
    RUN(grad_min_all);
    RUN(grad_max_ties);
    RUN(grad_logsumexp_axis2);
    RUN(grad_logsumexp_all_keepdim);
    RUN(grad_norm);
    RUN(grad_sum_to);
    RUN(grad_broadcast);

    RUN(grad_softmax);
    RUN(grad_softmax_axis1);
    RUN(grad_log_softmax);
    RUN(grad_log_softmax_axis0);
    RUN(grad_layernorm);
    RUN(grad_rmsnorm);
    RUN(grad_rope);
    RUN(grad_attention);
    RUN(grad_attention_causal);
    RUN(grad_attention_gqa);
    RUN(grad_attention_docs);
    RUN(grad_rope_docs);
    RUN(grad_attention_cross_causal);
    RUN(grad_cross_entropy);
    RUN(grad_mse);
    RUN(grad_topk);
    RUN(grad_topk_axis0);

    RUN(grad_matmul);
    RUN(grad_matmul_batched);
    RUN(grad_matmul_bcast_right);
    RUN(grad_matmul_bcast_both);
    RUN(grad_matmul_vec_left);
    RUN(grad_matmul_vec_right);
    RUN(grad_matmul_dot);

    RUN(grad_reshape);
    RUN(grad_transpose);
    RUN(grad_slice);
    RUN(grad_gather);
    RUN(grad_gather_rows3d);
    RUN(grad_concat);
    RUN(grad_scatter_add);

    RUN(grad_nondiff_ops);
    RUN(grad_indices_only);

    RUN(grad_linear_bias);
    RUN(grad_mlp);
    RUN(grad_ws_linear);
    RUN(grad_ghost_batch_norm);
    RUN(grad_batch_channel_norm);
    RUN(grad_layernorm_layer);
    RUN(grad_rmsnorm_layer);
    RUN(grad_embedding);
    RUN(grad_causal_self_attention);
    RUN(grad_gpt2_block);
    RUN(grad_llama_block);
    RUN(grad_cross_entropy_lm);
    RUN(grad_moe);
    RUN(grad_moe_aux_micro);
    RUN(grad_moe_aux_global);
    RUN(moe_global_micro_batches);
    RUN(grad_topk_layer);

    RUN(struct_param_free_subgraph);
    RUN(struct_loss_without_params);
    RUN(struct_unused_param_zero);
    RUN(struct_loss_is_param);
    RUN(struct_accumulates);
    RUN(struct_ref_bwd_bad_index);
    return unit_finish();
}
