/* logits.c - the graph generation's forward_logits runs (host.c emits the function). */
#include <stdio.h>
#include <string.h>

#include "diag.h"
#include "graph.h"
#include "host_internal.h"
#include "sema.h"

/* ---- forward_logits: generation's forward ----------------------------------------------------
 * The logits are the model's output: the train block's `model(data.x)` built as a graph of its own
 * with data.x of one row (sema_build_train builds it in the same walk as the step), so the loss
 * and data.y are not part of it. It must be f32[1, T, vocab], vocab the
 * last dimension of the logits the loss's cross_entropy reads. Dropout is off (p = 0): generation
 * runs the model for inference. The runtime calls forward_logits with x = [1, T] (the context
 * x[0, len), zeros after it); it runs every launch and copies row len - 1 of the logits into
 * s->logits. A causal model's row len - 1 does not depend on the zeros; a program whose model is
 * visibly not causal (attention with causal = false) gets no forward_logits. */

/* Whether g's output node (-1: none) is logits generation can use: NULL when it is, else why not,
 * with *at where (span_none when nowhere). T = seq, vocab from the step graph (0: no cross_entropy). */
static const char *logits_refusal(const Graph *g, int out, int64_t T, int64_t vocab, Span *at, Arena *ar) {
    *at = span_none();
    for (int i = 0; i < g->n; i++) {
        const GNode *n = graph_node(g, i);
        if (n->op == G_ATTENTION && !n->iattr[0]) { /* a position would see the tokens after it */
            *at = n->src;
            return "its attention is not causal, so a position's logits depend on the tokens after it";
        }
    }
    if (vocab <= 0) return "its loss has no cross_entropy, so the model's output is not known to be logits of the next token";
    if (out < 0) return "the model's forward does not return one tensor";
    const GNode *ln = graph_node(g, out);
    *at = ln->src;
    if (ln->dt == DT_F32 && ln->rank == 3 && ln->shape[0] == 1 && ln->shape[1] == T && ln->shape[2] == vocab) return NULL;
    const char *shape = "";
    for (int d = 0; d < ln->rank; d++) shape = arena_printf(ar, "%s%s%lld", shape, d ? ", " : "", (long long)ln->shape[d]);
    return arena_printf(ar, "the model's forward returns %s[%s] at batch 1, not logits f32[1, %lld, %lld] ([B, T, vocab])",
                        dtype_name(ln->dt), shape, (long long)T, (long long)vocab);
}

/* The graph of the train block's model(data.x) at batch 1, its logits in *node; or NULL with a
 * warning saying why this program cannot generate. Its parameters must be the step graph's, in the
 * same order (step_addrs finds them through the plan's table). */
Graph *logits_graph(Host *h, const TrainBuild *tb, int64_t vocab, int *node) {
    const Graph *step = tb->step;
    Graph *g = tb->forward;
    *node = tb->forward_output;
    if (!g) INTERNAL("host: the train build has no batch-1 forward");
    if (g->nparams != step->nparams) INTERNAL("host: %d parameters at batch 1, %d in the step", g->nparams, step->nparams);
    for (int i = 0; i < g->nparams; i++)
        if (strcmp(graph_node(g, g->params[i])->name, graph_node(step, step->params[i])->name) != 0)
            INTERNAL("host: parameter %d is '%s' at batch 1 but '%s' in the step", i, graph_node(g, g->params[i])->name,
                     graph_node(step, step->params[i])->name);
    Span at;
    const char *why = logits_refusal(g, *node, h->plan->seq, vocab, &at, h->ar);
    if (why) {
        diag_warning(at, "train block '%s' compiles without generation: %s", h->ts->name, why);
        diag_hint("the executable is built without forward_logits: its generate command says that it cannot generate");
        return NULL;
    }
    for (int i = 0; i < g->n; i++) /* inference: dropout off */
        if (graph_node(g, i)->op == G_DROPOUT) graph_node(g, i)->fattr[0] = 0;
    if (graph_verify(g, stderr)) INTERNAL("the batch-1 forward graph fails graph_verify (problems above)");
    return g;
}
