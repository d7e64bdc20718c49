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

/* Checks the main module and everything it imports. Returns the number of errors reported. */
int sema_check(Loader *ld, Module *main);

/* Checks the program as sema_check does and builds the forward graph of one train block of the
 * main module (train_name, or the first when NULL) while its model is instantiated and its loss
 * evaluated (graph_build.c). The graph lives in ar. Returns NULL after reporting errors: the
 * program's, an unknown block name (the message lists the blocks), or a construct the graph
 * builder does not support yet. */
Graph *sema_build_train_graph(Loader *ld, Module *main, const char *train_name, Arena *ar);

/* (added) The graph of the train block's `model(data.x)` alone, with data.x of `batch` rows instead
 * of the micro-batch (host.c builds generation's forward at batch 1): the parameters as in the
 * step graph (same names, same order), the G_INPUT data.x, the model's forward. *output is the
 * node of its result, -1 when that is not one tensor. The block is checked as written (its loss
 * at the micro-batch, without the builder). main must not have been checked yet: sema checks a
 * Module once (loader_reparse gives a fresh copy). NULL after reporting errors. */
Graph *sema_build_forward(Loader *ld, Module *main, const char *train_name, int64_t batch, int *output, Arena *ar);

typedef struct TrainSettings TrainSettings; /* sema_internal.h: a train block's resolved settings */

/* (added) Everything a train block compiles from (plan.h takes it from here). */
typedef struct TrainBuild {
    Graph *step;                   /* the forward graph of one micro-batch (autodiff appends the backward) */
    Graph *update;                 /* the optimizer's update over every parameter at once (graph.h, GraphUpdate) */
    const TrainSettings *settings; /* the block's resolved settings: batch, schedule, clip, parallel layout */
} TrainBuild;

/* (added) sema_build_train_graph, and in the same walk the update graph: the train block's optimizer
 * `update` over the flat vector of every parameter, parameter i at a multiple of `align` elements
 * (a power of two; plan.h passes PLAN_ALIGN / 4). NULL after reporting errors, as above, or a
 * construct inside update the builder does not support yet. */
TrainBuild *sema_build_train(Loader *ld, Module *main, const char *train_name, int64_t align, Arena *ar);

#endif
