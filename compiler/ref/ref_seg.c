/* ref_seg.c - the reference evaluator's segmented ops: G_SEG_NORM, the per-parameter L2 norm of an
 * update graph (graph.h, GraphUpdate), in double precision.
 *
 * Pipeline position: beside the back ends, never in the build path (see ref.h); ref.c's
 * ref_eval_node hands segmented ops over to this file. An update graph runs the optimizer over
 * the flat vector of every parameter at once, but `norm(x)` inside `update` (LAMB's trust ratio)
 * means the norm of x over one parameter tensor: the segments are the parameters, and each
 * element gets the norm of its own segment (0 for padding between segments). The norm is the
 * scaled two-pass form ref.c uses for G_NORM (max |x| first), so it neither overflows nor
 * underflows where the plain sum of squares would. */
#include <math.h>
#include <stdint.h>

#include "ref.h"

/* ---- G_SEG_NORM ------------------------------------------------------------------------------ */

/* The L2 norm of x[0 .. len), NaN if any element is NaN. */
static double ref_seg_l2(const double *x, int64_t len) {
    double m = 0;
    for (int64_t i = 0; i < len; i++) {
        double a = fabs(x[i]);
        if (isnan(a)) return NAN;
        if (a > m) m = a;
    }
    if (m == 0 || isinf(m)) return m;
    double s = 0;
    for (int64_t i = 0; i < len; i++) {
        double r = x[i] / m;
        s += r * r;
    }
    return m * sqrt(s);
}

static void ref_eval_seg_norm(const Graph *g, const GNode *n, double **vals) {
    const GraphUpdate *u = g->update;
    if (!u) INTERNAL("reference evaluator: node %%%d: seg_norm outside an update graph", n->id);
    if (n->nin != 1 || n->in[0] < 0 || n->in[0] >= n->id) INTERNAL("reference evaluator: node %%%d: bad input", n->id);
    const GNode *x = g->node[n->in[0]];
    if (n->rank != 1 || x->rank != 1 || n->shape[0] != u->n || x->shape[0] != u->n)
        INTERNAL("reference evaluator: node %%%d: seg_norm of a vector that is not the update graph's length", n->id);
    const double *xv = vals[x->id];
    double *out = vals[n->id];
    for (int64_t i = 0; i < u->n; i++) out[i] = 0.0; /* padding */
    for (int s = 0; s < u->nsegs; s++) {
        int64_t off = u->seg_off[s], len = u->seg_len[s];
        if (off >= u->n) continue; /* a frozen parameter: not in the update's vectors */
        if (off < 0 || len < 0 || off + len > u->n) INTERNAL("reference evaluator: segment %d out of range", s);
        double norm = ref_seg_l2(xv + off, len);
        for (int64_t i = 0; i < len; i++) out[off + i] = norm;
    }
}

/* ---- dispatch -------------------------------------------------------------------------------- */

int ref_eval_seg(const Graph *g, const GNode *n, double **vals) {
    switch (n->op) {
    case G_SEG_NORM: ref_eval_seg_norm(g, n, vals); return 0;
    default: break;
    }
    INTERNAL("reference evaluator: node %%%d: op %d is not a segmented op", n->id, (int)n->op);
}
