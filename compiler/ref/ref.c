/* ref.c - the reference evaluator: every forward op of the graph IR in double precision.
 *
 * Pipeline position: beside the back ends: the oracle, not a stage of what -o builds (see ref.h). Everything the
 * compiler produces later - gradients (against finite differences), fused kernels, the CPU and
 * CUDA back ends - is tested against the numbers this file computes, so it is written for
 * obvious correctness: one straight loop nest per op, the semantics of graph.h taken literally,
 * and the numerically careful formulation wherever there is one (max subtraction in softmax,
 * logsumexp and cross-entropy; two-pass mean/variance in layernorm; a scaled L2 norm). The
 * backward ops (G_SCATTER_ADD ... G_CROSS_ENTROPY_BWD) live in ref_bwd.c; ref_eval_node hands
 * them over. This file uses nothing of graph.c, so it can be tested on hand-built graphs.
 *
 * Conventions settled here where graph.h is silent (each is repeated at its op):
 *   - G_PARAM / G_INPUT: ref_run copies leaves[id]; a missing parameter with a deterministic
 *     initialiser (zeros, ones, constant) is filled from it, any other missing leaf is an error.
 *   - G_CAST to f32 or f64 is the identity; to bf16 or f16 it rounds to that format (nearest, ties
 *     to even, straight from double): precision = bf16 reads the f32 parameters through such a
 *     cast, so the reference computes with the very weights the compiled step does. Nothing else
 *     rounds (a bf16 node's value is exact, where the back ends round what they store).
 *   - G_ATTENTION with causal = 1 and T != S aligns the mask at the bottom right (query t sees
 *     keys j <= t + S - T, as a KV cache needs; the usual mask when T == S); a query row that
 *     sees no key gives zeros.
 *   - G_GATHER, G_ONE_HOT and G_CROSS_ENTROPY accept indices in [0, n) only (no negative
 *     wrap-around); anything else is reported and the evaluation fails.
 *   - NaN propagates through max/min (elementwise and reductions), clamp, relu and topk (where
 *     NaN ranks above every number), as in PyTorch.
 * Contract violations that would index memory wrongly (mismatched shapes) are internal errors. */
#include "ref.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define REF_PI 3.14159265358979323846

/* A graph that breaks its own contract is a compiler bug: stop with file and line. */
#define REF_REQUIRE(n, cond, what)                                                                                               \
    do {                                                                                                                         \
        if (!(cond)) INTERNAL("reference evaluator: node %%%d (op %d): %s", (n)->id, (int)(n)->op, (what));                      \
    } while (0)

/* ---- shapes and indexing -------------------------------------------------------------------- */

static int64_t ref_prod(const int64_t *shape, int from, int to) {
    int64_t p = 1;
    for (int d = from; d < to; d++) p *= shape[d];
    return p;
}

static int64_t ref_numel(const GNode *n) { return ref_prod(n->shape, 0, n->rank); }

static const GNode *ref_in(const Graph *g, const GNode *n, int k) {
    REF_REQUIRE(n, k < n->nin && n->in[k] >= 0 && n->in[k] < n->id, "missing or invalid input");
    return g->node[n->in[k]];
}

static const double *ref_val(const GNode *n, double **vals, int k) { return vals[n->in[k]]; }

/* An axis attribute: normalised already, but a negative one is taken from the end defensively. */
static int ref_axis(const GNode *n, int rank, int64_t axis) {
    if (axis < 0) axis += rank;
    REF_REQUIRE(n, axis >= 0 && axis < rank, "axis out of range");
    return (int)axis;
}

/* Right-aligned broadcasting: decompose i over out_shape from the last axis; an input axis of
 * size 1 contributes index 0. Input axes beyond out_rank (which must have size 1) are ignored. */
int64_t ref_bcast_index(int out_rank, const int64_t *out_shape, int64_t i, int in_rank, const int64_t *in_shape) {
    int64_t idx = 0, stride = 1;
    for (int d = 1; d <= in_rank; d++) {
        int64_t c = 0;
        if (d <= out_rank) {
            int64_t od = out_shape[out_rank - d];
            c = od ? i % od : 0;
            i = od ? i / od : 0;
        }
        int64_t id = in_shape[in_rank - d];
        if (id != 1) idx += c * stride;
        stride *= id;
    }
    return idx;
}

/* (in_rank, in_shape) broadcasts to (out_rank, out_shape): right-aligned, each axis 1 or equal. */
static int ref_bcasts_to(int in_rank, const int64_t *in_shape, int out_rank, const int64_t *out_shape) {
    for (int d = 1; d <= in_rank; d++) {
        int64_t id = in_shape[in_rank - d];
        if (d > out_rank) {
            if (id != 1) return 0;
        } else if (id != 1 && id != out_shape[out_rank - d]) {
            return 0;
        }
    }
    return 1;
}

static void ref_require_bcast(const GNode *n, const GNode *x) {
    REF_REQUIRE(n, ref_bcasts_to(x->rank, x->shape, n->rank, n->shape), "input does not broadcast to the node's shape");
}

/* ---- scalar functions ----------------------------------------------------------------------- */

/* x rounded to a binary format with `bits` significand bits (the implicit one included), normal
 * exponents from emin (subnormals below) and largest finite value max: to nearest, ties to even
 * (nearbyint in the default rounding mode); beyond max + half an ulp, infinity. */
static double ref_round_float(double x, int bits, int emin, double max) {
    if (!isfinite(x) || x == 0) return x;
    int e;
    (void)frexp(x, &e); /* |x| = m 2^e, m in [0.5, 1): x's exponent is e - 1 */
    if (e - 1 < emin) e = emin + 1;
    double ulp = ldexp(1.0, e - bits);
    double r = nearbyint(x / ulp) * ulp;
    return fabs(r) > max ? copysign(INFINITY, x) : r;
}

static double ref_sigmoid(double x) {
    /* exp of a non-positive number only, so neither branch overflows */
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static double ref_gelu(double x) {
    double c = sqrt(2.0 / REF_PI);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

/* NumPy's float remainder (npy_divmod): the result takes the sign of the divisor; x % 0 is NaN. */
double ref_mod(double a, double b) {
    double m = fmod(a, b);
    if (b == 0) return m;
    if (m != 0) {
        if ((b < 0) != (m < 0)) m += b;
    } else {
        m = copysign(0.0, b);
    }
    return m;
}

static double ref_max2(double a, double b) {
    if (isnan(a) || isnan(b)) return NAN;
    return a > b ? a : b;
}

static double ref_min2(double a, double b) {
    if (isnan(a) || isnan(b)) return NAN;
    return a < b ? a : b;
}

static double ref_unary(const GNode *n, double x) {
    switch (n->op) {
    case G_NEG: return -x;
    case G_EXP: return exp(x);
    case G_LOG: return log(x);
    case G_SQRT: return sqrt(x);
    case G_RSQRT: return 1.0 / sqrt(x);
    case G_TANH: return tanh(x);
    case G_SIGMOID: return ref_sigmoid(x);
    case G_RELU: return x > 0 || isnan(x) ? x : 0.0;
    case G_GELU: return ref_gelu(x);
    case G_SILU: return x * ref_sigmoid(x);
    case G_ABS: return fabs(x);
    case G_SIGN: return x > 0 ? 1.0 : x < 0 ? -1.0 : x; /* 0, -0 and NaN as they are */
    case G_SIN: return sin(x);
    case G_COS: return cos(x);
    case G_FLOOR: return floor(x);
    case G_NOT: return x == 0 ? 1.0 : 0.0;
    case G_CAST:
        /* integers truncate toward zero, bool is != 0 (NaN is true, as in NumPy); f32 and f64
         * are the identity, bf16 and f16 round (see the top) */
        if (n->dt == DT_I32 || n->dt == DT_I64) return trunc(x);
        if (n->dt == DT_BOOL) return x != 0 ? 1.0 : 0.0;
        if (n->dt == DT_BF16) return ref_round_float(x, 8, -126, 0x1.fep127);
        if (n->dt == DT_F16) return ref_round_float(x, 11, -14, 65504.0);
        return x;
    case G_CLAMP: {
        double lo = n->fattr[0], hi = n->fattr[1];
        return x < lo ? lo : x > hi ? hi : x; /* NaN passes through */
    }
    default: INTERNAL("reference evaluator: op %d is not unary", (int)n->op);
    }
}

static double ref_binary(GOp op, double a, double b) {
    switch (op) {
    case G_ADD: return a + b;
    case G_SUB: return a - b;
    case G_MUL: return a * b;
    case G_DIV: return a / b;
    case G_POW: return pow(a, b);
    case G_MOD: return ref_mod(a, b);
    case G_MAX2: return ref_max2(a, b);
    case G_MIN2: return ref_min2(a, b);
    case G_EQ: return a == b;
    case G_NE: return a != b;
    case G_LT: return a < b;
    case G_LE: return a <= b;
    case G_GT: return a > b;
    case G_GE: return a >= b;
    case G_AND: return a != 0 && b != 0;
    case G_OR: return a != 0 || b != 0;
    default: INTERNAL("reference evaluator: op %d is not binary", (int)op);
    }
}

/* ---- leaves and elementwise ops ------------------------------------------------------------- */

static void ref_eval_unary(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, ref_numel(x) == ref_numel(n), "elementwise input has another element count");
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    for (int64_t i = 0; i < ref_numel(n); i++) out[i] = ref_unary(n, xv[i]);
}

/* Philox4x32-10 as runtime/base/rng.c computes it (rt_philox4x32; Salmon et al., SC'11): the
 * compiler does not link the runtime, so it is written again here, and tests/unit/test_ref.c
 * holds it to the Random123 known answers that test_rt_rng.c holds the runtime's to. */
void ref_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0, c[1] = (uint32_t)p1, c[2] = n2, c[3] = (uint32_t)p0;
    }
    memcpy(out, c, sizeof c);
}

int ref_dropout_keep(const uint32_t rng[GRAPH_RNG_WORDS], int64_t stream, int64_t i, double p) {
    if (!(p > 0) || !rng[4]) return 1;
    uint32_t key[2] = {rng[0], rng[1] ^ GRAPH_RNG_DOMAIN};
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)stream, rng[2], rng[3]}, out[4];
    ref_philox4x32(ctr, key, out);
    return (uint64_t)(out[0] >> 8) >= (uint64_t)ceil(p * 16777216.0); /* p * 2^24 is exact in double */
}

/* Dropout, deterministic and counter-based, so every back end reproduces the mask exactly
 * without sharing RNG state (graph.h, GRAPH_RNG_WORDS, states the draw): for the flat
 * (row-major) element index i, out = keep(i) ? x * (1 / (1 - p)) : 0. 24 bits make the
 * comparison exact in f32, so a float back end draws the same mask; the keep probability is
 * 1 - p to 2^-24. p = 0, or the key's word "on" = 0 (evaluation), is the identity. The key's
 * words are i64 values in [0, 2^32), exact as doubles. */
static void ref_eval_dropout(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0), *k = ref_in(g, n, 1);
    REF_REQUIRE(n, ref_numel(x) == ref_numel(n), "dropout input has another element count");
    REF_REQUIRE(n, ref_numel(k) == GRAPH_RNG_WORDS, "dropout's key is not GRAPH_RNG_WORDS words");
    const double *xv = ref_val(n, vals, 0), *kv = ref_val(n, vals, 1);
    uint32_t rng[GRAPH_RNG_WORDS];
    for (int w = 0; w < GRAPH_RNG_WORDS; w++) {
        REF_REQUIRE(n, kv[w] >= 0 && kv[w] < 4294967296.0 && kv[w] == floor(kv[w]), "a word of the rng key is not 32 bits");
        rng[w] = (uint32_t)kv[w];
    }
    double *out = vals[n->id];
    double p = n->fattr[0];
    REF_REQUIRE(n, p >= 0 && p < 1, "dropout's p is not in [0, 1)");
    double scale = p > 0 && rng[4] ? 1.0 / (1.0 - p) : 1.0;
    int64_t total = ref_numel(n);
    for (int64_t i = 0; i < total; i++) out[i] = ref_dropout_keep(rng, n->iattr[0], i, p) ? xv[i] * scale : 0.0;
}

static void ref_eval_binary(const Graph *g, const GNode *n, double **vals) {
    const GNode *a = ref_in(g, n, 0), *b = ref_in(g, n, 1);
    ref_require_bcast(n, a);
    ref_require_bcast(n, b);
    const double *av = ref_val(n, vals, 0), *bv = ref_val(n, vals, 1);
    double *out = vals[n->id];
    for (int64_t i = 0; i < ref_numel(n); i++) {
        double x = av[ref_bcast_index(n->rank, n->shape, i, a->rank, a->shape)];
        double y = bv[ref_bcast_index(n->rank, n->shape, i, b->rank, b->shape)];
        out[i] = ref_binary(n->op, x, y);
    }
}

static void ref_eval_where(const Graph *g, const GNode *n, double **vals) {
    const GNode *c = ref_in(g, n, 0), *a = ref_in(g, n, 1), *b = ref_in(g, n, 2);
    ref_require_bcast(n, c);
    ref_require_bcast(n, a);
    ref_require_bcast(n, b);
    const double *cv = ref_val(n, vals, 0), *av = ref_val(n, vals, 1), *bv = ref_val(n, vals, 2);
    double *out = vals[n->id];
    for (int64_t i = 0; i < ref_numel(n); i++) {
        int pick = cv[ref_bcast_index(n->rank, n->shape, i, c->rank, c->shape)] != 0;
        out[i] = pick ? av[ref_bcast_index(n->rank, n->shape, i, a->rank, a->shape)]
                      : bv[ref_bcast_index(n->rank, n->shape, i, b->rank, b->shape)];
    }
}

/* ---- reductions ----------------------------------------------------------------------------- */

/* An input seen as [outer, len, inner] around the reduced (or softmaxed, ...) axis. */
typedef struct RefAxis {
    int64_t outer, len, inner;
} RefAxis;

static RefAxis ref_split(const GNode *x, int axis) {
    RefAxis s = {ref_prod(x->shape, 0, axis), x->shape[axis], ref_prod(x->shape, axis + 1, x->rank)};
    return s;
}

/* Reduces len values v[0], v[stride], ... with op. Empty reductions give the identity
 * (0, -inf, +inf, -inf for logsumexp) and NaN for the mean. */
static double ref_reduce(GOp op, const double *v, int64_t len, int64_t stride) {
    switch (op) {
    case G_SUM:
    case G_MEAN: {
        double s = 0;
        for (int64_t j = 0; j < len; j++) s += v[j * stride];
        return op == G_MEAN ? s / (double)len : s;
    }
    case G_MAX: {
        double m = -INFINITY;
        for (int64_t j = 0; j < len; j++) m = ref_max2(m, v[j * stride]);
        return m;
    }
    case G_MIN: {
        double m = INFINITY;
        for (int64_t j = 0; j < len; j++) m = ref_min2(m, v[j * stride]);
        return m;
    }
    case G_LOGSUMEXP: {
        double m = ref_reduce(G_MAX, v, len, stride);
        if (isinf(m) || isnan(m)) return m; /* all -inf, some +inf, or a NaN */
        double s = 0;
        for (int64_t j = 0; j < len; j++) s += exp(v[j * stride] - m);
        return m + log(s);
    }
    default: INTERNAL("reference evaluator: op %d is not a reduction", (int)op);
    }
}

/* iattr[0] = axis (-1: all elements), iattr[1] = keepdim (the output's layout is the same
 * either way, so only the element counts matter here). */
static void ref_eval_reduce(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    if (n->iattr[0] == -1) {
        REF_REQUIRE(n, ref_numel(n) == 1, "a reduction over all axes gives one element");
        out[0] = ref_reduce(n->op, xv, ref_numel(x), 1);
        return;
    }
    RefAxis s = ref_split(x, ref_axis(n, x->rank, n->iattr[0]));
    REF_REQUIRE(n, ref_numel(n) == s.outer * s.inner, "reduction output has the wrong element count");
    for (int64_t o = 0; o < s.outer; o++)
        for (int64_t k = 0; k < s.inner; k++)
            out[o * s.inner + k] = ref_reduce(n->op, xv + o * s.len * s.inner + k, s.len, s.inner);
}

/* L2 norm of all elements, scaled by the largest magnitude so no square overflows or underflows. */
static void ref_eval_norm(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    const double *xv = ref_val(n, vals, 0);
    int64_t total = ref_numel(x);
    double m = 0;
    for (int64_t i = 0; i < total; i++) {
        double a = fabs(xv[i]);
        if (isnan(a)) {
            vals[n->id][0] = NAN;
            return;
        }
        if (a > m) m = a;
    }
    if (m == 0 || isinf(m)) {
        vals[n->id][0] = m;
        return;
    }
    double s = 0;
    for (int64_t i = 0; i < total; i++) s += (xv[i] / m) * (xv[i] / m);
    vals[n->id][0] = m * sqrt(s);
}

/* Sums in0 down to the node's shape: each input element lands on the output element it would
 * have been broadcast from. */
static void ref_eval_sum_to(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, ref_bcasts_to(n->rank, n->shape, x->rank, x->shape),
                "sum_to: the node's shape does not broadcast to the input's");
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    for (int64_t i = 0; i < ref_numel(n); i++) out[i] = 0;
    for (int64_t i = 0; i < ref_numel(x); i++) out[ref_bcast_index(x->rank, x->shape, i, n->rank, n->shape)] += xv[i];
}

/* ---- composite ops -------------------------------------------------------------------------- */

/* softmax and log_softmax along iattr[0]: y = exp(x - m) / sum exp(x - m), m the row's max;
 * log_softmax = (x - m) - log(sum exp(x - m)). */
static void ref_eval_softmax(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, ref_numel(x) == ref_numel(n), "softmax input has another element count");
    RefAxis s = ref_split(x, ref_axis(n, x->rank, n->iattr[0]));
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    for (int64_t o = 0; o < s.outer; o++) {
        for (int64_t k = 0; k < s.inner; k++) {
            int64_t base = o * s.len * s.inner + k;
            double m = ref_reduce(G_MAX, xv + base, s.len, s.inner);
            double sum = 0;
            for (int64_t j = 0; j < s.len; j++) sum += exp(xv[base + j * s.inner] - m);
            for (int64_t j = 0; j < s.len; j++) {
                double z = xv[base + j * s.inner] - m;
                out[base + j * s.inner] = n->op == G_SOFTMAX ? exp(z) / sum : z - log(sum);
            }
        }
    }
}

/* Over the last axis (length c): y = (x - mean) / sqrt(var + eps) * w + b with the biased
 * variance mean((x - mean)^2), computed in two passes as PyTorch does. A missing bias (nin == 2)
 * is zero. */
static void ref_eval_layernorm(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0), *w = ref_in(g, n, 1);
    REF_REQUIRE(n, x->rank >= 1 && ref_numel(x) == ref_numel(n), "layernorm input shape");
    int64_t c = x->shape[x->rank - 1], rows = c ? ref_numel(x) / c : 0;
    REF_REQUIRE(n, ref_numel(w) == c, "layernorm weight length");
    const double *xv = ref_val(n, vals, 0), *wv = ref_val(n, vals, 1), *bv = NULL;
    if (n->nin > 2) {
        REF_REQUIRE(n, ref_numel(ref_in(g, n, 2)) == c, "layernorm bias length");
        bv = ref_val(n, vals, 2);
    }
    double eps = n->fattr[0];
    double *out = vals[n->id];
    for (int64_t r = 0; r < rows; r++) {
        const double *row = xv + r * c;
        double mean = 0;
        for (int64_t j = 0; j < c; j++) mean += row[j];
        mean /= (double)c;
        double var = 0;
        for (int64_t j = 0; j < c; j++) var += (row[j] - mean) * (row[j] - mean);
        var /= (double)c;
        double rstd = 1.0 / sqrt(var + eps);
        for (int64_t j = 0; j < c; j++) out[r * c + j] = (row[j] - mean) * rstd * wv[j] + (bv ? bv[j] : 0.0);
    }
}

/* Over the last axis: y = x * rsqrt(mean(x^2) + eps) * w (Llama's RMSNorm). */
static void ref_eval_rmsnorm(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0), *w = ref_in(g, n, 1);
    REF_REQUIRE(n, x->rank >= 1 && ref_numel(x) == ref_numel(n), "rmsnorm input shape");
    int64_t c = x->shape[x->rank - 1], rows = c ? ref_numel(x) / c : 0;
    REF_REQUIRE(n, ref_numel(w) == c, "rmsnorm weight length");
    const double *xv = ref_val(n, vals, 0), *wv = ref_val(n, vals, 1);
    double eps = n->fattr[0];
    double *out = vals[n->id];
    for (int64_t r = 0; r < rows; r++) {
        const double *row = xv + r * c;
        double ms = 0;
        for (int64_t j = 0; j < c; j++) ms += row[j] * row[j];
        ms /= (double)c;
        double rs = 1.0 / sqrt(ms + eps);
        for (int64_t j = 0; j < c; j++) out[r * c + j] = row[j] * rs * wv[j];
    }
}

/* Rotary embedding over [..., T, hd], GPT-NeoX / Hugging Face Llama layout: position t is the
 * index along axis -2 (a rank-1 input is one position, t = 0); for i < hd/2 the pair
 * (x[i], x[i + hd/2]) is rotated by the angle t * theta^(-2i/hd):
 *     y[i]        = x[i] cos - x[i + hd/2] sin
 *     y[i + hd/2] = x[i + hd/2] cos + x[i] sin */
static void ref_eval_rope(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, x->rank >= 1 && ref_numel(x) == ref_numel(n), "rope input shape");
    int64_t hd = x->shape[x->rank - 1], T = x->rank >= 2 ? x->shape[x->rank - 2] : 1;
    REF_REQUIRE(n, hd % 2 == 0, "rope head size is odd");
    int64_t half = hd / 2, rows = hd ? ref_numel(x) / hd : 0;
    double theta = n->fattr[0];
    const double *xv = ref_val(n, vals, 0);
    /* explicit positions: [B, T] for x [B, H, T, hd] with documents, or [T] in the forward over new
     * tokens (plan/kv.c) */
    const double *pos = n->nin > 1 ? ref_val(n, vals, 1) : NULL;
    int pos_rows = n->nin > 1 && ref_in(g, n, 1)->rank == 1; /* one position a row, whatever the batch */
    int64_t per_b = x->rank >= 3 ? ref_numel(x) / hd / x->shape[0] : rows;
    double *out = vals[n->id];
    for (int64_t r = 0; r < rows; r++) {
        double t = !pos ? (double)(r % T) : pos_rows ? pos[r % T] : pos[(r / per_b) * T + r % T];
        const double *row = xv + r * hd;
        double *y = out + r * hd;
        for (int64_t i = 0; i < half; i++) {
            double angle = t * pow(theta, -2.0 * (double)i / (double)hd);
            double c = cos(angle), s = sin(angle);
            double x1 = row[i], x2 = row[i + half];
            y[i] = x1 * c - x2 * s;
            y[i + half] = x2 * c + x1 * s;
        }
    }
}

/* With pos (the document mask, i32 [B, T]), query t sees only the keys of its own document: j from
 * t - pos[b, t] (its document's first token) to t. A pos outside [0, t] is clamped there (pos < 0:
 * no key, the row is zeros), as the kernels do. */
int64_t ref_attn_first(int64_t t, double pos) {
    int64_t first = t - (int64_t)pos;
    if (pos > (double)t) first = 0;
    if (pos < 0) first = t + 1;
    return first;
}

/* Scaled dot-product attention, q [..., H, T, hd], k [..., Hk, S, hd], v [..., Hk, S, hv]
 * -> [..., H, T, hv]: out[t] = sum_j softmax_j(scale * q[t].k[j]) v[j] over the keys j that
 * query t sees. Grouped-query: q head h reads kv head h / (H / Hk). causal = iattr[0]: query t
 * sees keys j <= t + (S - T) (bottom-right aligned; j <= t when S == T); a query that sees no
 * key gives zeros. The softmax subtracts the row maximum; scores are recomputed in a second
 * pass instead of being stored, so no scratch memory is needed. With pos (in3), query t sees
 * keys j >= ref_attn_first(t, pos[b, t]) as well. */
static void ref_eval_attention(const Graph *g, const GNode *n, double **vals) {
    const GNode *q = ref_in(g, n, 0), *k = ref_in(g, n, 1), *v = ref_in(g, n, 2);
    int r = q->rank;
    REF_REQUIRE(n, r >= 3 && k->rank == r && v->rank == r && n->rank == r, "attention ranks");
    int64_t H = q->shape[r - 3], T = q->shape[r - 2], hd = q->shape[r - 1];
    int64_t Hk = k->shape[r - 3], S = k->shape[r - 2], hv = v->shape[r - 1];
    int64_t batch = ref_prod(q->shape, 0, r - 3);
    REF_REQUIRE(n, ref_prod(k->shape, 0, r - 3) == batch && ref_prod(v->shape, 0, r - 3) == batch, "attention batch dims");
    REF_REQUIRE(n, k->shape[r - 1] == hd && v->shape[r - 3] == Hk && v->shape[r - 2] == S, "attention k/v shapes");
    REF_REQUIRE(n, Hk > 0 && H % Hk == 0, "attention heads are not a multiple of kv heads");
    REF_REQUIRE(n, ref_numel(n) == batch * H * T * hv, "attention output shape");
    int64_t group = H / Hk;
    int causal = n->iattr[0] != 0;
    double scale = n->fattr[0];
    const double *qv = ref_val(n, vals, 0), *kv = ref_val(n, vals, 1), *vv = ref_val(n, vals, 2);
    const double *pos = n->nin > 3 ? ref_val(n, vals, 3) : NULL; /* the document mask, [batch, T] */
    REF_REQUIRE(n, !pos || (causal && S == T), "attention's pos needs causal attention with S == T");
    double *out = vals[n->id];
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / group;
            const double *K = kv + (b * Hk + hk) * S * hd;
            const double *V = vv + (b * Hk + hk) * S * hv;
            for (int64_t t = 0; t < T; t++) {
                const double *Q = qv + ((b * H + h) * T + t) * hd;
                double *O = out + ((b * H + h) * T + t) * hv;
                int64_t last = causal ? t + (S - T) : S - 1; /* the last key this query sees */
                if (last > S - 1) last = S - 1;
                int64_t first = pos ? ref_attn_first(t, pos[b * T + t]) : 0; /* the first key: its document's start */
                for (int64_t c = 0; c < hv; c++) O[c] = 0;
                if (last < first) continue;
                double m = -INFINITY;
                for (int64_t j = first; j <= last; j++) {
                    double s = 0;
                    for (int64_t c = 0; c < hd; c++) s += Q[c] * K[j * hd + c];
                    m = ref_max2(m, scale * s);
                }
                double sum = 0;
                for (int64_t j = first; j <= last; j++) {
                    double s = 0;
                    for (int64_t c = 0; c < hd; c++) s += Q[c] * K[j * hd + c];
                    double p = exp(scale * s - m);
                    sum += p;
                    for (int64_t c = 0; c < hv; c++) O[c] += p * V[j * hv + c];
                }
                for (int64_t c = 0; c < hv; c++) O[c] /= sum;
            }
        }
    }
}

/* An index tensor's element: must be a whole number in [0, limit). */
static int ref_index_ok(double v, int64_t limit) { return v >= 0 && v < (double)limit && v == floor(v); }

/* Mean over all positions of -log softmax(logits)[target], each term computed as
 * log(sum exp(x - m)) - (x[target] - m). A target outside [0, V) is reported. */
static int ref_eval_cross_entropy(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0), *t = ref_in(g, n, 1);
    REF_REQUIRE(n, x->rank >= 1, "cross_entropy logits are rank 0");
    int64_t V = x->shape[x->rank - 1], N = ref_numel(t);
    REF_REQUIRE(n, ref_numel(x) == N * V, "cross_entropy targets do not match the logits");
    const double *xv = ref_val(n, vals, 0), *tv = ref_val(n, vals, 1);
    double total = 0;
    for (int64_t p = 0; p < N; p++) {
        if (!ref_index_ok(tv[p], V)) {
            diag_error_noloc("cross_entropy: target %.17g at position %lld is out of range [0, %lld)", tv[p], (long long)p,
                             (long long)V);
            return -1;
        }
        const double *row = xv + p * V;
        double m = ref_reduce(G_MAX, row, V, 1);
        double sum = 0;
        for (int64_t j = 0; j < V; j++) sum += exp(row[j] - m);
        total += log(sum) - (row[(int64_t)tv[p]] - m);
    }
    vals[n->id][0] = total / (double)N; /* NaN for no positions, like PyTorch's empty mean */
    return 0;
}

static void ref_eval_mse(const Graph *g, const GNode *n, double **vals) {
    const GNode *a = ref_in(g, n, 0), *b = ref_in(g, n, 1);
    REF_REQUIRE(n, ref_numel(a) == ref_numel(b), "mse inputs have different element counts");
    const double *av = ref_val(n, vals, 0), *bv = ref_val(n, vals, 1);
    double s = 0;
    for (int64_t i = 0; i < ref_numel(a); i++) s += (av[i] - bv[i]) * (av[i] - bv[i]);
    vals[n->id][0] = s / (double)ref_numel(a);
}

/* [...] indices -> [..., C] with C the node's last dimension (iattr[0]). */
static int ref_eval_one_hot(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, n->rank >= 1, "one_hot output is rank 0");
    int64_t C = n->shape[n->rank - 1], N = ref_numel(x);
    REF_REQUIRE(n, ref_numel(n) == N * C, "one_hot output shape");
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    for (int64_t p = 0; p < N; p++) {
        if (!ref_index_ok(xv[p], C)) {
            diag_error_noloc("one_hot: index %.17g at position %lld is out of range [0, %lld)", xv[p], (long long)p,
                             (long long)C);
            return -1;
        }
        for (int64_t j = 0; j < C; j++) out[p * C + j] = 0;
        out[p * C + (int64_t)xv[p]] = 1;
    }
    return 0;
}

/* a ranks before b in topk: larger, or NaN against a number (NaN counts as the largest, as in
 * PyTorch). Equal values are not "before": the earlier index stays first. */
static int ref_topk_before(double a, double b) { return (isnan(a) && !isnan(b)) || a > b; }

/* topk along iattr[1], k = iattr[0]: the k largest, largest first, ties to the lower index.
 * Each output row is filled by insertion in index order, holding indices while it is built
 * (an element is inserted after every equal one already there, which breaks ties); values are
 * looked up at the end. */
static void ref_eval_topk(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    int axis = ref_axis(n, x->rank, n->iattr[1]);
    RefAxis s = ref_split(x, axis);
    int64_t k = n->iattr[0];
    REF_REQUIRE(n, k >= 0 && k <= s.len && ref_numel(n) == s.outer * k * s.inner, "topk k or output shape");
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    for (int64_t o = 0; o < s.outer; o++) {
        for (int64_t in = 0; in < s.inner; in++) {
            const double *row = xv + o * s.len * s.inner + in; /* stride s.inner */
            double *dst = out + o * k * s.inner + in;          /* stride s.inner */
            int64_t cnt = 0;
            for (int64_t j = 0; j < s.len && k > 0; j++) {
                double v = row[j * s.inner];
                int64_t pos = cnt;
                while (pos > 0 && ref_topk_before(v, row[(int64_t)dst[(pos - 1) * s.inner] * s.inner])) pos--;
                if (pos >= k) continue;
                int64_t end = cnt < k ? cnt : k - 1; /* shift [pos, end) down one; the last falls off when full */
                for (int64_t q = end; q > pos; q--) dst[q * s.inner] = dst[(q - 1) * s.inner];
                dst[pos * s.inner] = (double)j;
                if (cnt < k) cnt++;
            }
            if (n->op == G_TOPK_VALUES)
                for (int64_t q = 0; q < k; q++) dst[q * s.inner] = row[(int64_t)dst[q * s.inner] * s.inner];
        }
    }
}

/* ---- linear algebra and data movement ------------------------------------------------------- */

/* in0 [..., N, K] @ in1 [..., K, M] -> [..., N, M] with the batch dims broadcast. As in NumPy a
 * rank-1 in0 [K] is a row [1, K] and a rank-1 in1 [K] a column [K, 1], the added axis dropped from
 * the result. */
static void ref_eval_matmul(const Graph *g, const GNode *n, double **vals) {
    const GNode *a = ref_in(g, n, 0), *b = ref_in(g, n, 1);
    REF_REQUIRE(n, a->rank >= 1 && b->rank >= 1, "matmul of a rank-0 tensor");
    int avec = a->rank == 1, bvec = b->rank == 1;
    int64_t N = avec ? 1 : a->shape[a->rank - 2], K = a->shape[a->rank - 1];
    int64_t M = bvec ? 1 : b->shape[b->rank - 1], Kb = bvec ? b->shape[0] : b->shape[b->rank - 2];
    int abr = avec ? 0 : a->rank - 2, bbr = bvec ? 0 : b->rank - 2;
    int obr = n->rank - (avec ? 0 : 1) - (bvec ? 0 : 1);
    REF_REQUIRE(n, K == Kb, "matmul inner dimensions differ");
    REF_REQUIRE(n, obr >= 0 && (avec || n->shape[obr] == N) && (bvec || n->shape[n->rank - 1] == M), "matmul output shape");
    REF_REQUIRE(n, ref_bcasts_to(abr, a->shape, obr, n->shape) && ref_bcasts_to(bbr, b->shape, obr, n->shape),
                "matmul batch dims do not broadcast");
    const double *av = ref_val(n, vals, 0), *bv = ref_val(n, vals, 1);
    double *out = vals[n->id];
    int64_t nb = ref_prod(n->shape, 0, obr);
    for (int64_t bi = 0; bi < nb; bi++) {
        const double *A = av + ref_bcast_index(obr, n->shape, bi, abr, a->shape) * N * K;
        const double *B = bv + ref_bcast_index(obr, n->shape, bi, bbr, b->shape) * K * M;
        double *C = out + bi * N * M;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = 0; j < M; j++) {
                double s = 0;
                for (int64_t p = 0; p < K; p++) s += A[i * K + p] * B[p * M + j];
                C[i * M + j] = s;
            }
        }
    }
}

static void ref_eval_copy(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, ref_numel(x) == ref_numel(n), "reshape changes the element count");
    if (ref_numel(n)) memcpy(vals[n->id], ref_val(n, vals, 0), (size_t)ref_numel(n) * sizeof(double));
}

/* Swaps axes iattr[0] and iattr[1]: output coordinate d reads input axis perm(d). */
static void ref_eval_transpose(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    REF_REQUIRE(n, x->rank == n->rank, "transpose changes the rank");
    int a = ref_axis(n, n->rank, n->iattr[0]), b = ref_axis(n, n->rank, n->iattr[1]);
    int64_t xstride[GRAPH_MAX_RANK], st = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        xstride[d] = st;
        st *= x->shape[d];
    }
    for (int d = 0; d < n->rank; d++) {
        int src = d == a ? b : d == b ? a : d;
        REF_REQUIRE(n, n->shape[d] == x->shape[src], "transpose output shape");
    }
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    for (int64_t i = 0; i < ref_numel(n); i++) {
        int64_t rest = i, idx = 0;
        for (int d = n->rank - 1; d >= 0; d--) {
            int src = d == a ? b : d == b ? a : d;
            idx += (rest % n->shape[d]) * xstride[src];
            rest /= n->shape[d];
        }
        out[i] = xv[idx];
    }
}

/* [lo, hi) along iattr[0] = axis, iattr[1] = lo, iattr[2] = hi. */
static void ref_eval_slice(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    int axis = ref_axis(n, x->rank, n->iattr[0]);
    int64_t lo = n->iattr[1], hi = n->iattr[2];
    RefAxis s = ref_split(x, axis);
    REF_REQUIRE(n, 0 <= lo && lo <= hi && hi <= s.len, "slice bounds");
    REF_REQUIRE(n, ref_numel(n) == s.outer * (hi - lo) * s.inner, "slice output shape");
    const double *xv = ref_val(n, vals, 0);
    double *out = vals[n->id];
    int64_t w = (hi - lo) * s.inner; /* a contiguous run per outer index */
    for (int64_t o = 0; o < s.outer; o++)
        for (int64_t j = 0; j < w; j++) out[o * w + j] = xv[o * s.len * s.inner + lo * s.inner + j];
}

/* Rows of in0 [R, ...] picked by in1 [...]: out[p, :] = in0[in1[p], :]. */
static int ref_eval_gather(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0), *ix = ref_in(g, n, 1);
    REF_REQUIRE(n, x->rank >= 1, "gather from a rank-0 tensor");
    int64_t R = x->shape[0], row = ref_prod(x->shape, 1, x->rank), N = ref_numel(ix);
    REF_REQUIRE(n, ref_numel(n) == N * row, "gather output shape");
    const double *xv = ref_val(n, vals, 0), *iv = ref_val(n, vals, 1);
    double *out = vals[n->id];
    for (int64_t p = 0; p < N; p++) {
        if (!ref_index_ok(iv[p], R)) {
            diag_error_noloc("gather: index %.17g at position %lld is out of range [0, %lld)", iv[p], (long long)p, (long long)R);
            return -1;
        }
        for (int64_t j = 0; j < row; j++) out[p * row + j] = xv[(int64_t)iv[p] * row + j];
    }
    return 0;
}

/* Along iattr[0]: for each outer index, the inputs' runs one after another. */
static void ref_eval_concat(const Graph *g, const GNode *n, double **vals) {
    int axis = ref_axis(n, n->rank, n->iattr[0]);
    RefAxis s = ref_split(n, axis);
    int64_t at = 0; /* position along the axis where input k starts */
    for (int k = 0; k < n->nin; k++) {
        const GNode *x = ref_in(g, n, k);
        REF_REQUIRE(n, x->rank == n->rank && at + x->shape[axis] <= s.len, "concat input shape");
        int64_t w = x->shape[axis] * s.inner;
        REF_REQUIRE(n, ref_numel(x) == s.outer * w, "concat input shape");
        const double *xv = ref_val(n, vals, k);
        for (int64_t o = 0; o < s.outer; o++)
            for (int64_t j = 0; j < w; j++) vals[n->id][o * s.len * s.inner + at * s.inner + j] = xv[o * w + j];
        at += x->shape[axis];
    }
    REF_REQUIRE(n, at == s.len, "concat inputs do not fill the output");
}

static void ref_eval_broadcast(const Graph *g, const GNode *n, double **vals) {
    const GNode *x = ref_in(g, n, 0);
    ref_require_bcast(n, x);
    const double *xv = ref_val(n, vals, 0);
    for (int64_t i = 0; i < ref_numel(n); i++) vals[n->id][i] = xv[ref_bcast_index(n->rank, n->shape, i, x->rank, x->shape)];
}

/* ---- dispatch ------------------------------------------------------------------------------- */

int ref_eval_node(const Graph *g, const GNode *n, double **vals) {
    double *out = vals[n->id];
    switch (n->op) {
    case G_PARAM:
    case G_INPUT: return 0; /* vals[id] holds the leaf already (ref_run copies it) */
    case G_CONST:
        for (int64_t i = 0; i < ref_numel(n); i++) out[i] = n->fattr[0];
        return 0;
    case G_ARANGE:
        for (int64_t i = 0; i < ref_numel(n); i++) out[i] = (double)i;
        return 0;
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
    case G_NOT:
    case G_CAST:
    case G_CLAMP: ref_eval_unary(g, n, vals); return 0;
    case G_DROPOUT: ref_eval_dropout(g, n, vals); return 0;
    case G_ADD:
    case G_SUB:
    case G_MUL:
    case G_DIV:
    case G_POW:
    case G_MOD:
    case G_MAX2:
    case G_MIN2:
    case G_EQ:
    case G_NE:
    case G_LT:
    case G_LE:
    case G_GT:
    case G_GE:
    case G_AND:
    case G_OR: ref_eval_binary(g, n, vals); return 0;
    case G_WHERE: ref_eval_where(g, n, vals); return 0;
    case G_SUM:
    case G_MEAN:
    case G_MAX:
    case G_MIN:
    case G_LOGSUMEXP: ref_eval_reduce(g, n, vals); return 0;
    case G_NORM: ref_eval_norm(g, n, vals); return 0;
    case G_SEG_NORM: return ref_eval_seg(g, n, vals); /* ref_seg.c */
    case G_SUM_TO: ref_eval_sum_to(g, n, vals); return 0;
    case G_SOFTMAX:
    case G_LOG_SOFTMAX: ref_eval_softmax(g, n, vals); return 0;
    case G_LAYERNORM: ref_eval_layernorm(g, n, vals); return 0;
    case G_RMSNORM: ref_eval_rmsnorm(g, n, vals); return 0;
    case G_ROPE: ref_eval_rope(g, n, vals); return 0;
    case G_ATTENTION: ref_eval_attention(g, n, vals); return 0;
    case G_CROSS_ENTROPY: return ref_eval_cross_entropy(g, n, vals);
    case G_MSE: ref_eval_mse(g, n, vals); return 0;
    case G_ONE_HOT: return ref_eval_one_hot(g, n, vals);
    case G_TOPK_VALUES:
    case G_TOPK_INDICES: ref_eval_topk(g, n, vals); return 0;
    case G_MATMUL: ref_eval_matmul(g, n, vals); return 0;
    case G_RESHAPE: ref_eval_copy(g, n, vals); return 0;
    case G_TRANSPOSE: ref_eval_transpose(g, n, vals); return 0;
    case G_SLICE: ref_eval_slice(g, n, vals); return 0;
    case G_GATHER: return ref_eval_gather(g, n, vals);
    case G_CONCAT: ref_eval_concat(g, n, vals); return 0;
    case G_BROADCAST: ref_eval_broadcast(g, n, vals); return 0;
    case G_SCATTER_ADD:
    case G_SOFTMAX_BWD:
    case G_LAYERNORM_BWD_X:
    case G_LAYERNORM_BWD_W:
    case G_RMSNORM_BWD_X:
    case G_RMSNORM_BWD_W:
    case G_ROPE_BWD:
    case G_ATTENTION_BWD_Q:
    case G_ATTENTION_BWD_K:
    case G_ATTENTION_BWD_V:
    case G_CROSS_ENTROPY_BWD: return ref_eval_bwd(g, n, vals);
    case G_KV_ATTENTION: /* its keys live in the KV cache, outside the graph's values */
        diag_error_noloc("reference evaluator: kv_attention (node %%%d) reads the KV cache, which the reference does not model",
                         n->id);
        return -1;
    case G_OP_COUNT: break;
    }
    INTERNAL("reference evaluator: node %%%d has unknown op %d", n->id, (int)n->op);
}

/* A leaf's values: leaves[id] when given; else a parameter whose initialiser is deterministic
 * (zeros, ones, constant fattr[0]) is filled from it. Returns 0, or -1 after an error. */
static int ref_fill_leaf(const GNode *n, double *const *leaves, double *out) {
    int64_t total = ref_numel(n);
    if (leaves && leaves[n->id]) {
        if (total) memcpy(out, leaves[n->id], (size_t)total * sizeof(double));
        return 0;
    }
    if (n->op == G_PARAM && (n->iattr[0] == GI_ZEROS || n->iattr[0] == GI_ONES || n->iattr[0] == GI_CONSTANT)) {
        double v = n->iattr[0] == GI_ZEROS ? 0.0 : n->iattr[0] == GI_ONES ? 1.0 : n->fattr[0];
        for (int64_t i = 0; i < total; i++) out[i] = v;
        return 0;
    }
    diag_error_noloc("reference evaluator: no values given for %s '%s' (node %%%d)", n->op == G_PARAM ? "parameter" : "input",
                     n->name ? n->name : "?", n->id);
    return -1;
}

/* Nodes 0 .. n-1 of g (ref_run's contract). */
static double **ref_run_prefix(const Graph *g, double *const *leaves, int n, Arena *ar) {
    double **vals = arena_alloc(ar, (size_t)(g->n ? g->n : 1) * sizeof(double *));
    for (int id = 0; id < n; id++) {
        const GNode *n = g->node[id];
        if (n->id != id) INTERNAL("reference evaluator: node[%d] has id %d", id, n->id);
        int64_t total = ref_numel(n);
        vals[id] = arena_alloc(ar, (size_t)(total ? total : 1) * sizeof(double));
        int rc = n->op == G_PARAM || n->op == G_INPUT ? ref_fill_leaf(n, leaves, vals[id]) : ref_eval_node(g, n, vals);
        if (rc) return NULL;
    }
    return vals;
}

double **ref_run(const Graph *g, double *const *leaves, Arena *ar) { return ref_run_prefix(g, leaves, g->n, ar); }

int ref_global_stats(const Graph *g, int64_t nmicro, RefMicroFn set_leaves, void *ctx, double **leaves, Arena *ar) {
    if (g->nstats == 0) return 0;
    int last = 0;
    for (int k = 0; k < g->nstats; k++) {
        int64_t n = ref_numel(g->node[g->stat_in[k]]);
        leaves[g->stat_in[k]] = arena_alloc(ar, (size_t)(n ? n : 1) * sizeof(double)); /* zeros while pass 1 runs */
        if (g->stat_expr[k] + 1 > last) last = g->stat_expr[k] + 1;
    }
    double **sum = arena_alloc(ar, (size_t)g->nstats * sizeof *sum);
    for (int k = 0; k < g->nstats; k++)
        sum[k] = arena_alloc(ar, (size_t)(ref_numel(g->node[g->stat_in[k]]) + 1) * sizeof(double));
    for (int64_t m = 0; m < nmicro; m++) {
        set_leaves(ctx, m, leaves);
        Arena scratch = {0};
        double **vals = ref_run_prefix(g, leaves, last, &scratch); /* a statistic needs nothing past its expression */
        if (!vals) {
            arena_free(&scratch);
            return -1;
        }
        for (int k = 0; k < g->nstats; k++) {
            const double *v = vals[g->stat_expr[k]];
            for (int64_t i = 0; i < ref_numel(g->node[g->stat_in[k]]); i++) sum[k][i] += v[i];
        }
        arena_free(&scratch);
    }
    for (int k = 0; k < g->nstats; k++) {
        int64_t n = ref_numel(g->node[g->stat_in[k]]);
        for (int64_t i = 0; i < n; i++) leaves[g->stat_in[k]][i] = sum[k][i] / (double)nmicro;
    }
    return 0;
}
