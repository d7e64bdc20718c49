/* sema.h - semantic analysis: names, imports, constants, types and shapes, train/serve settings.
 *
 * Pipeline position: AST (parse.h) -> [sema] -> graph IR. `mbtc --check` stops after this;
 * `mbtc --emit=ir` builds a train block's graph during the same walk.
 * Every model and function is checked on its own with its constants symbolic; every train and
 * serve block then instantiates its model with concrete constants and checks the whole step
 * (data shapes, loss, optimizer, schedule, batch arithmetic, parallel layout). */
#ifndef MBT_SEMA_H
#define MBT_SEMA_H

#include "graph.h"
#include "module.h"
#include "settings.h"

/* Checks the main module and everything it imports. Returns the number of errors reported. */
int sema_check(Loader *ld, Module *main);

/* Checks the program as sema_check does and builds the forward graph of one train block of the
 * main module (train_name, or the first when NULL) while its model is instantiated and its loss
 * evaluated (build.c drives the graph builder, graph_build.h). The graph lives in ar. Returns
 * NULL after reporting errors: the program's, an unknown block name (the message lists the
 * blocks), or a construct the graph builder does not support yet. */
Graph *sema_build_train_graph(Loader *ld, Module *main, const char *train_name, Arena *ar);

/* Everything a train block compiles from (plan.h takes it from here). */
typedef struct TrainBuild {
    Graph *step;               /* the forward graph of one micro-batch (autodiff appends the backward) */
    Graph *update;             /* the optimizer's update over every parameter at once (graph.h, GraphUpdate) */
    Graph *forward;            /* generation's forward: the block's `model(data.x)` with data.x of one row
                                 * (T = seq), its parameters the step graph's, in the same order */
    int forward_output;        /* the node of forward's result; -1 when that is not one tensor */
    const TrainConfig *config; /* the block's checked settings (settings.h): batch, schedule, clip, layout */
    const ServeConfig *serve;  /* the main module's first serve block of the same model (its settings are the
                                * executable's `serve` and `generate` defaults), or NULL */
    const char *serve_other;   /* the name of a serve block whose model is another one (not compiled), or NULL */
} TrainBuild;

/* sema_build_train_graph, and in the same walk the update graph - the train block's optimizer
 * `update` over the flat vector of every parameter, parameter i at a multiple of `align` elements
 * (a power of two; plan.h passes PLAN_ALIGN / 4) - and the batch-1 forward. NULL after reporting
 * errors, as above, or a construct the builder does not support yet (in the model, the loss or
 * update; the errors of the model at batch 1 say so in a note). */
TrainBuild *sema_build_train(Loader *ld, Module *main, const char *train_name, int64_t align, Arena *ar);
/* The same with aligned GEMM shapes (graph_pad.h, docs/cuda.md): the parameters' leading dimensions
 * that reach a GEMM padded to a multiple of pad_mult (1: none) when at least pad_min rows. */
Graph *sema_build_train_graph_padded(Loader *ld, Module *main, const char *train_name, int64_t pad_mult, int64_t pad_min,
                                     Arena *ar);
TrainBuild *sema_build_train_padded(Loader *ld, Module *main, const char *train_name, int64_t align, int64_t pad_mult,
                                    int64_t pad_min, Arena *ar);

#endif
