/* autodiff.h - reverse-mode differentiation of the graph IR.
 *
 * Pipeline position: graph (forward, with a scalar loss) -> [autodiff] -> plan. The backward
 * pass is appended to the same graph, so `--emit=grad` prints forward then backward, and every
 * backward node keeps the source span of the forward op it differentiates. */
#ifndef MBT_AUTODIFF_H
#define MBT_AUTODIFF_H

#include "graph.h"

/* Appends d g->loss / d p for every G_PARAM p (g->grads[i] for g->params[i]); a parameter the
 * loss does not depend on gets a zero-filled G_CONST of its shape. Only nodes on a path from a
 * parameter to the loss are differentiated. Returns the id of the first backward node. An op
 * without a derivative that the loss needs is an internal error (every op has one). */
int autodiff(Graph *g);

#endif
