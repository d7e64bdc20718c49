/* graph_pad.h - aligned GEMM shapes: padding a parameter's leading dimension (pad.c).
 *
 * graph_pad_params rewrites a forward graph (before autodiff) so that each parameter [n0, ...]
 * whose rows reach a matmul as its m or n, with n0 not a multiple of `mult` and n0 >= min_rows, is
 * stored as [np, ...] (np = n0 rounded up to mult; G_PARAM's iattr[2] = n0, the program's rows),
 * its padded rows carried through casts, transposes, matmuls and a gather's table, and every other
 * use reading the slice of the program's rows. With `like` (the step graph, already padded) it pads
 * exactly the parameters padded there, by name: the batch-1 forward shares their storage. `keep`,
 * when not NULL, is an old node id rewritten to the new id of its program value (the forward's
 * output). Returns the number of parameters padded; mult <= 1 pads nothing. */
#ifndef MBT_GRAPH_PAD_H
#define MBT_GRAPH_PAD_H

#include "graph.h"

int graph_pad_params(Graph *g, int64_t mult, int64_t min_rows, const Graph *like, int *keep);

/* The program's rows of a parameter node: its iattr[2] when padded, else its shape[0]. */
static inline int64_t graph_param_rows(const GNode *p) { return p->iattr[2] > 0 ? p->iattr[2] : p->shape[0]; }
/* Its element count as the program sees it (RtParam's numel). */
static inline int64_t graph_param_numel(const GNode *p) {
    int64_t n = graph_param_rows(p);
    for (int i = 1; i < p->rank; i++) n *= p->shape[i];
    return p->rank ? n : 1;
}

#endif
