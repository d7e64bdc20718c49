/* graph_build_internal.h - what the graph builder's two files share: graph_build.c (the step's
 * forward graph, built while sema instantiates the train block) and graph_build_update.c (the
 * optimizer's update graph). The hooks sema calls are graph_build.h's. */
#ifndef MBT_GRAPH_BUILD_INTERNAL_H
#define MBT_GRAPH_BUILD_INTERNAL_H

#include "graph_build.h"

struct GraphBuilder {
    Arena *ar; /* the checker's: values the hooks make, text of messages (gb_start) */
    Graph *g;
    int errors_before; /* diag's error count when the build started */
    int failed;        /* an error stopped the build: hooks add nothing more */
    int done;          /* the loss is recorded */
    int64_t streams;   /* dropout RNG streams handed out */
    int rng;           /* the "rng" input's node + 1 (graph.h, GRAPH_RNG_WORDS); 0: not made yet */
    /* the update graph, for sema_build_train */
    int64_t align;   /* parameters at multiples of this many elements; 0: no update graph wanted */
    Graph *step;     /* the step graph, once the update graph is being built (g is then the update) */
    Graph *upd;      /* the update graph */
    int updating;    /* g is the update graph: the rules of update apply (graph_build.h) */
    int update_done; /* its results are recorded */
    Value *lr_value; /* the f32[] value of the input "lr" */
    Str *state_str;  /* [statecap] the state variables' names, as update's scope knows them */
    int statecap;
    /* generation's forward, for sema_build_train */
    GraphBuilder *forward; /* the batch-1 builder riding along with the step's (NULL: none wanted) */
    int output;            /* a forward builder's node of model(data.x); -1 when it is not one tensor */
    int is_forward;        /* this is such a forward builder (global_mean is then its operand itself) */
    /* aligned GEMM shapes (graph_pad.h): parameters' leading dimensions padded to pad_mult */
    int64_t pad_mult, pad_min; /* 0 or 1: none */
};

#define GB_MAX_NUMEL ((int64_t)1 << 62) /* so that element counts and sums of them never overflow */

/* graph_build.c's helpers: stop the build with a located error (always 0); node id; a node added
 * (its id, or -1 after a failure); r made the result of a new node; a rank-0 constant of dt */
int gb_fail(GraphBuilder *gb, Span at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
GNode *gb_node(GraphBuilder *gb, int id);
int gb_add(GraphBuilder *gb, GOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in, Span at);
int gb_result(GraphBuilder *gb, Value *r, GOp op, int nin, const int *in, Span at);
int gb_const(GraphBuilder *gb, DType dt, double x, Span at);

#endif
