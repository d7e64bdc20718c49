/* ref_bwd.c - the reference evaluator's backward ops (G_SCATTER_ADD ... G_CROSS_ENTROPY_BWD), in
 * double precision (see ref.h; ref.c holds the forward ops and the driver).
 *
 * Pipeline position: beside the back ends, not in the build path: the oracle that autodiff's
 * output is checked against (tests/unit/test_grad.c compares it with finite differences) and that
 * the fused backward kernels will be held to. Straight loops over row-major arrays, no scratch
 * memory: what a row needs twice (a softmax's max and sum, a norm's statistics) is recomputed.
 * The formulas are the standard ones, written next to each op. */
#include <math.h>

#include "ref.h"

/* ---- layout helpers ---- */

static int64_t ref_numel(const GNode *n) { return graph_numel(n); }

/* The node's shape split around axis: outer (before), len (the axis), inner (after). */
static void ref_split(const GNode *n, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < axis; i++) *outer *= n->shape[i];
    for (int i = axis + 1; i < n->rank; i++) *inner *= n->shape[i];
    *len = n->shape[axis];
}

/* An index tensor's element: a whole number in [0, limit) (as ref.c's gather and cross_entropy). */
static int ref_index_ok(double v, int64_t limit) { return v >= 0 && v < (double)limit && v == floor(v); }

/* ---- gather's backward ---- */

/* out: zeros [n, ...]; for every index position p, row idx[p] += row p of the updates. */
static int ref_scatter_add(const Graph *g, const GNode *n, double **vals) {
    double *out = vals[n->id];
    const double *upd = vals[n->in[0]], *idx = vals[n->in[1]];
    int64_t rows = n->shape[0], numel = ref_numel(n);
    int64_t row = rows ? numel / rows : 0;
    int64_t nidx = ref_numel(graph_node(g, n->in[1]));
    for (int64_t i = 0; i < numel; i++) out[i] = 0.0;
    for (int64_t p = 0; p < nidx; p++) {
        double r = idx[p];
        if (!ref_index_ok(r, rows)) {
            diag_error_noloc("scatter_add: index %.17g at position %lld is out of range [0, %lld)", r, (long long)p,
                             (long long)rows);
            return -1;
        }
        int64_t ri = (int64_t)r;
        for (int64_t j = 0; j < row; j++) out[ri * row + j] += upd[p * row + j];
    }
    return 0;
}

/* ---- softmax ---- */

/* dx = y * (dy - sum(dy * y)) along the axis. */
static void ref_softmax_bwd(const GNode *n, double **vals) {
    const double *dy = vals[n->in[0]], *y = vals[n->in[1]];
    double *dx = vals[n->id];
    int64_t outer, len, inner;
    ref_split(n, (int)n->iattr[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            double s = 0.0;
            for (int64_t j = 0; j < len; j++) s += dy[base + j * inner] * y[base + j * inner];
            for (int64_t j = 0; j < len; j++) dx[base + j * inner] = y[base + j * inner] * (dy[base + j * inner] - s);
        }
}

/* ---- layernorm and rmsnorm (over the last axis) ---- */

/* Mean and 1/sqrt(var + eps) of a row (biased variance, as the forward). */
static void ref_ln_stats(const double *x, int64_t d, double eps, double *mean, double *rstd) {
    double m = 0.0, v = 0.0;
    for (int64_t j = 0; j < d; j++) m += x[j];
    m /= (double)d;
    for (int64_t j = 0; j < d; j++) v += (x[j] - m) * (x[j] - m);
    v /= (double)d;
    *mean = m;
    *rstd = 1.0 / sqrt(v + eps);
}

/* 1/sqrt(mean(x^2) + eps) of a row. */
static double ref_rms_rstd(const double *x, int64_t d, double eps) {
    double ms = 0.0;
    for (int64_t j = 0; j < d; j++) ms += x[j] * x[j];
    return 1.0 / sqrt(ms / (double)d + eps);
}

/* LayerNorm: xhat = (x - mean) * rstd, g = dy * w;
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum over rows of dy * xhat.
 * RMSNorm: y = x * r * w with r = 1/sqrt(mean(x^2) + eps), g = dy * w;
 *   dx = r * g - x * r^3 * mean(g * x),                  dw = sum over rows of dy * x * r. */
static void ref_norm_bwd(const Graph *g, const GNode *n, double **vals) {
    int ln = n->op == G_LAYERNORM_BWD_X || n->op == G_LAYERNORM_BWD_W;
    int want_w = n->op == G_LAYERNORM_BWD_W || n->op == G_RMSNORM_BWD_W;
    const GNode *nx = graph_node(g, n->in[1]);
    const double *dy = vals[n->in[0]], *x = vals[n->in[1]];
    const double *w = want_w ? NULL : vals[n->in[2]];
    double *out = vals[n->id];
    double eps = n->fattr[0];
    int64_t d = nx->shape[nx->rank - 1], rows = d ? ref_numel(nx) / d : 0;
    if (want_w)
        for (int64_t j = 0; j < d; j++) out[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d, *dyr = dy + r * d;
        double mean = 0.0, rstd;
        if (ln) ref_ln_stats(xr, d, eps, &mean, &rstd);
        else rstd = ref_rms_rstd(xr, d, eps);
        if (want_w) {
            for (int64_t j = 0; j < d; j++) out[j] += dyr[j] * (xr[j] - mean) * rstd;
            continue;
        }
        double mg = 0.0, mgx = 0.0; /* mean(g), mean(g * xhat) (layernorm) or mean(g * x) (rmsnorm) */
        for (int64_t j = 0; j < d; j++) {
            double gj = dyr[j] * w[j];
            mg += gj;
            mgx += gj * (ln ? (xr[j] - mean) * rstd : xr[j]);
        }
        mg /= (double)d;
        mgx /= (double)d;
        double *dxr = out + r * d;
        for (int64_t j = 0; j < d; j++) {
            double gj = dyr[j] * w[j];
            if (ln) dxr[j] = rstd * (gj - mg - (xr[j] - mean) * rstd * mgx);
            else dxr[j] = rstd * gj - xr[j] * rstd * rstd * rstd * mgx;
        }
    }
}

/* ---- rope ---- */

/* The forward rotates the halves (x1, x2) of each head at position t (the index along axis
 * rank-2) by angle t * theta^(-2i/hd):  y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin.
 * The backward is the transposed rotation (by the negative angle):
 *   dx1 = dy1 cos + dy2 sin,  dx2 = dy2 cos - dy1 sin. */
static void ref_rope_bwd(const GNode *n, double **vals) {
    const double *dy = vals[n->in[0]];
    double *dx = vals[n->id];
    int64_t hd = n->shape[n->rank - 1], T = n->rank >= 2 ? n->shape[n->rank - 2] : 1, half = hd / 2;
    int64_t rows = hd ? ref_numel(n) / hd : 0;
    double theta = n->fattr[0];
    const double *pos = n->nin > 1 ? vals[n->in[1]] : NULL; /* [B, T] for [B, H, T, hd] */
    int64_t per_b = n->rank >= 3 ? ref_numel(n) / hd / n->shape[0] : rows;
    for (int64_t r = 0; r < rows; r++) {
        double t = pos ? pos[(r / per_b) * T + r % T] : (double)(r % T);
        const double *a = dy + r * hd;
        double *o = dx + r * hd;
        for (int64_t i = 0; i < half; i++) {
            double ang = t * pow(theta, -2.0 * (double)i / (double)hd);
            double cs = cos(ang), sn = sin(ang);
            o[i] = a[i] * cs + a[i + half] * sn;
            o[i + half] = a[i + half] * cs - a[i] * sn;
        }
    }
}

/* ---- attention ---- */

/* q [..., H, T, D], k [..., Hk, S, D], v [..., Hk, S, E] (B = the product of the leading
 * dimensions); query head h reads key/value head h / (H / Hk).
 * Causal: query i sees key j when j <= i + (S - T) (the queries are the last T positions of the
 * S keys; with S == T this is j <= i). */
typedef struct RefAttn {
    const double *dout, *q, *k, *v;
    int64_t B, H, Hk, T, S, D, E;
    int causal;
    double scale;
    const double *pos; /* the document mask [B, T] (ref.c's ref_attn_first), NULL: none */
    int64_t b;         /* the batch row ref_visible is asked about */
} RefAttn;

static int ref_visible(const RefAttn *a, int64_t i, int64_t j) {
    if (a->pos && j < ref_attn_first(i, a->pos[a->b * a->T + i])) return 0;
    return !a->causal || j <= i + (a->S - a->T);
}

/* The score of query row qi against key row kj (both D long). */
static double ref_score(const RefAttn *a, const double *qi, const double *kj) {
    double s = 0.0;
    for (int64_t d = 0; d < a->D; d++) s += qi[d] * kj[d];
    return s * a->scale;
}

/* Recomputes the probabilities P_j = softmax_j(s_j) of one query row and, with the row's dout,
 *   dP_j = dout . v_j,  dS_j = P_j (dP_j - sum_l P_l dP_l),
 *   dq_i = scale * sum_j dS_j k_j,  dk_j += scale * dS_j q_i,  dv_j += P_j dout_i,
 * adding the one the node asks for into out. */
static void ref_attn_row(const RefAttn *a, GOp op, int64_t b, int64_t h, int64_t i, double *out) {
    int64_t kh = h / (a->H / a->Hk);
    const double *qi = a->q + ((b * a->H + h) * a->T + i) * a->D;
    const double *doi = a->dout + ((b * a->H + h) * a->T + i) * a->E;
    const double *kb = a->k + (b * a->Hk + kh) * a->S * a->D;
    const double *vb = a->v + (b * a->Hk + kh) * a->S * a->E;
    double mx = -INFINITY, sum = 0.0, pdp = 0.0;
    for (int64_t j = 0; j < a->S; j++)
        if (ref_visible(a, i, j)) {
            double s = ref_score(a, qi, kb + j * a->D);
            if (s > mx) mx = s;
        }
    if (mx == -INFINITY) return; /* no visible key: the row is all zeros */
    for (int64_t j = 0; j < a->S; j++)
        if (ref_visible(a, i, j)) sum += exp(ref_score(a, qi, kb + j * a->D) - mx);
    for (int64_t j = 0; j < a->S; j++) {
        if (!ref_visible(a, i, j)) continue;
        double p = exp(ref_score(a, qi, kb + j * a->D) - mx) / sum, dp = 0.0;
        for (int64_t e = 0; e < a->E; e++) dp += doi[e] * vb[j * a->E + e];
        pdp += p * dp;
    }
    for (int64_t j = 0; j < a->S; j++) {
        if (!ref_visible(a, i, j)) continue;
        const double *kj = kb + j * a->D;
        double p = exp(ref_score(a, qi, kj) - mx) / sum, dp = 0.0;
        for (int64_t e = 0; e < a->E; e++) dp += doi[e] * vb[j * a->E + e];
        double ds = p * (dp - pdp);
        if (op == G_ATTENTION_BWD_Q) {
            double *dq = out + ((b * a->H + h) * a->T + i) * a->D;
            for (int64_t d = 0; d < a->D; d++) dq[d] += a->scale * ds * kj[d];
        } else if (op == G_ATTENTION_BWD_K) {
            double *dk = out + ((b * a->Hk + kh) * a->S + j) * a->D;
            for (int64_t d = 0; d < a->D; d++) dk[d] += a->scale * ds * qi[d];
        } else {
            double *dv = out + ((b * a->Hk + kh) * a->S + j) * a->E;
            for (int64_t e = 0; e < a->E; e++) dv[e] += p * doi[e];
        }
    }
}

static void ref_attention_bwd(const Graph *g, const GNode *n, double **vals) {
    const GNode *q = graph_node(g, n->in[1]), *k = graph_node(g, n->in[2]), *v = graph_node(g, n->in[3]);
    int r = q->rank;
    if (r < 3 || k->rank != r || v->rank != r) INTERNAL("ref: attention_bwd of rank %d", r);
    int64_t B = 1;
    for (int i = 0; i < r - 3; i++) B *= q->shape[i];
    RefAttn a = {
        .dout = vals[n->in[0]],
        .q = vals[n->in[1]],
        .k = vals[n->in[2]],
        .v = vals[n->in[3]],
        .B = B,
        .H = q->shape[r - 3],
        .Hk = k->shape[r - 3],
        .T = q->shape[r - 2],
        .S = k->shape[r - 2],
        .D = q->shape[r - 1],
        .E = v->shape[r - 1],
        .causal = n->iattr[0] != 0,
        .scale = n->fattr[0],
        .pos = n->nin > 4 ? vals[n->in[4]] : NULL,
    };
    double *out = vals[n->id];
    int64_t numel = ref_numel(n);
    for (int64_t i = 0; i < numel; i++) out[i] = 0.0;
    if (a.Hk <= 0 || a.H % a.Hk != 0)
        INTERNAL("ref: attention with %lld query heads and %lld key heads", (long long)a.H, (long long)a.Hk);
    for (int64_t b = 0; b < a.B; b++) {
        a.b = b;
        for (int64_t h = 0; h < a.H; h++)
            for (int64_t i = 0; i < a.T; i++) ref_attn_row(&a, n->op, b, h, i, out);
    }
}

/* ---- cross-entropy ---- */

/* dlogits = dloss * (softmax(logits) - onehot(target)) / N, N the number of targets (the
 * forward is the mean over them). */
static int ref_cross_entropy_bwd(const Graph *g, const GNode *n, double **vals) {
    double dloss = vals[n->in[0]][0];
    const double *logits = vals[n->in[1]], *tg = vals[n->in[2]];
    double *dx = vals[n->id];
    int64_t V = n->shape[n->rank - 1];
    int64_t N = ref_numel(graph_node(g, n->in[2]));
    for (int64_t r = 0; r < N; r++) {
        const double *l = logits + r * V;
        double t = tg[r];
        if (!ref_index_ok(t, V)) {
            diag_error_noloc("cross_entropy: target %.17g at position %lld is out of range [0, %lld)", t, (long long)r,
                             (long long)V);
            return -1;
        }
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < V; j++)
            if (l[j] > mx) mx = l[j];
        for (int64_t j = 0; j < V; j++) sum += exp(l[j] - mx);
        for (int64_t j = 0; j < V; j++)
            dx[r * V + j] = dloss * (exp(l[j] - mx) / sum - (j == (int64_t)t ? 1.0 : 0.0)) / (double)N;
    }
    return 0;
}

/* ---- dispatch ---- */

int ref_eval_bwd(const Graph *g, const GNode *n, double **vals) {
    switch (n->op) {
    case G_SCATTER_ADD: return ref_scatter_add(g, n, vals);
    case G_SOFTMAX_BWD: ref_softmax_bwd(n, vals); return 0;
    case G_LAYERNORM_BWD_X:
    case G_LAYERNORM_BWD_W:
    case G_RMSNORM_BWD_X:
    case G_RMSNORM_BWD_W: ref_norm_bwd(g, n, vals); return 0;
    case G_ROPE_BWD: ref_rope_bwd(n, vals); return 0;
    case G_ATTENTION_BWD_Q:
    case G_ATTENTION_BWD_K:
    case G_ATTENTION_BWD_V: ref_attention_bwd(g, n, vals); return 0;
    case G_CROSS_ENTROPY_BWD: return ref_cross_entropy_bwd(g, n, vals);
    default: INTERNAL("ref: %s is not a backward op", graph_op_name(n->op));
    }
}
