/* graph_build.h - building the graph IR of a train block from the values sema computes.
 *
 * Pipeline position: sema (eval.c, eval_call.c, settings.c; driven by sema/build.c) ->
 * [graph_build] -> graph IR -> autodiff. The builder knows values (value.h), the graph (graph.h)
 * and diagnostics (diag.h), nothing of the checker's scopes or frames: sema/build.c runs the whole
 * checker with a builder waiting for one train block, and while that block instantiates its model
 * and evaluates its data and loss, the hooks below - called at every site that makes a tensor -
 * append a node for each tensor result and store it in the Value:
 *
 *     Value.graph_id = node id + 1      (0 = no node; so zeroed Values never alias node 0)
 *
 * Numbers next to tensors become G_CONST rank-0 nodes, `param` declarations G_PARAM nodes named
 * by their dotted path from the model (`h.3.attn.c_attn.weight`, list items by index; sema walks
 * the model's members and names each through gb_name_param), data.x and data.y G_INPUT nodes,
 * the loss g->loss. The hooks run only while sema listens (never under --check, never while a
 * declaration is checked on its own with symbolic constants). A construct the builder cannot
 * express (a shape not known at compile time, an `if` on a value only known at run time, ...) is
 * a located user error saying so (diag_error); after the first one, or after any error of the
 * program, the hooks stop adding nodes and the build gives no graph.
 *
 * The update graph (sema_build_train): after the loss, when the train block's optimizer
 * runs its `update` with the block's hyper-parameters, the same hooks build a second graph, the
 * update applied to every parameter at once (graph.h, GraphUpdate). p, g and each state variable
 * are f32[n] inputs over the flat layout of the step graph's parameters; t and the optimizer's lr
 * are f32[] inputs (the host feeds lr = lr_base x schedule(step) and t = step + 1). Inside update
 * every tensor is either per element (f32[n]) or a scalar; a scalar computed from a per-parameter
 * value - norm(x), LAMB's trust ratio - is a scalar per parameter, so its node is lifted to f32[n]
 * (each element holds its parameter's value) and norm(x) of a per-element x is G_SEG_NORM. Only
 * elementwise builtins and norm may be used there; anything else is "not supported yet". */
#ifndef MBT_GRAPH_BUILD_H
#define MBT_GRAPH_BUILD_H

#include "diag.h"
#include "graph.h"
#include "value.h"

typedef struct GraphBuilder GraphBuilder;

/* ---- the builder's life (sema/build.c) ---- */

/* A builder of the graph named name, in ar. The errors reported from now on stop the build. */
GraphBuilder *gb_new(Arena *ar, const char *name);
/* Asks for the update graph too, each parameter at a multiple of align elements (a power of two),
 * and for generation's forward, built by fwd (another gb_new) after the loss. */
void gb_want_update(GraphBuilder *gb, int64_t align, GraphBuilder *fwd);
/* Aligned GEMM shapes (graph_pad.h): with the update, the parameters' leading dimensions that reach
 * a GEMM are padded to a multiple of mult (> 1) when at least min_rows. */
void gb_want_pad(GraphBuilder *gb, int64_t mult, int64_t min_rows);
/* The checker reached the block being built: the values the hooks make, and the text of their
 * messages, live in values. */
void gb_start(GraphBuilder *gb, Arena *values);

/* What the walk left: the graphs (GB_BUILT), or why there are none. */
typedef enum GbOutcome {
    GB_BUILT,     /* every graph asked for is complete */
    GB_ERRORS,    /* errors were reported since gb_new */
    GB_FAILED,    /* the build stopped without reporting an error (a compiler bug) */
    GB_NO_LOSS,   /* the step graph never got its loss (a compiler bug) */
    GB_NO_UPDATE, /* the update or the batch-1 forward asked for was not built (a compiler bug) */
} GbOutcome;
typedef struct GraphBuilt {
    Graph *step;        /* the forward graph of one micro-batch */
    Graph *update;      /* gb_want_update's update graph, or NULL */
    Graph *forward;     /* gb_want_update's batch-1 forward, or NULL */
    int forward_output; /* its node of model(data.x); -1 when that is not one tensor */
} GraphBuilt;
GbOutcome gb_finish(GraphBuilder *gb, GraphBuilt *out);

/* ---- hooks for the train block (settings.c) ---- */

/* Names the parameter v (a tensor made by gb_param, read as it is or through its cast) path,
 * unless it has a name already: the first path that reaches a parameter names it. */
void gb_name_param(GraphBuilder *gb, const Value *v, const char *path);
/* Adds the group bits (graph.h: GP_FROZEN, GP_NO_DECAY) to the parameter whose value is v. */
void gb_param_group(GraphBuilder *gb, const Value *v, int bits);
void gb_data(GraphBuilder *gb, Value *data);          /* data.x, data.y -> G_INPUT */
void gb_loss(GraphBuilder *gb, Value *loss, Span at); /* the loss -> g->loss; the graph is complete */

/* Generation's forward: beside the step's builder rides a second one (gb_want_update), for the
 * train block's `model(data.x)` with data.x of one row. After the loss, settings.c instantiates
 * the model again with it listening (its parameters named as in the step), gives it that data.x
 * and the model's result. gb_forward_of is NULL when no forward is wanted or the step's build
 * failed. */
GraphBuilder *gb_forward_of(GraphBuilder *gb);
void gb_forward_input(GraphBuilder *gb, Value *x, const char *name); /* x (i32[1, seq]) -> G_INPUT name (data.x, data.pos) */
void gb_forward_output(GraphBuilder *gb, Value *out);                /* the model's result; the graph is complete */

/* ---- hooks for expressions (eval.c, eval_call.c; each gets the operands and the result sema computed) ---- */

void gb_binary(GraphBuilder *gb, Op op, Value *a, Span sa, Value *b, Span sb, Value *r, Span at); /* a op b, a op= b */
void gb_unary(GraphBuilder *gb, Op op, Value *a, Value *r, Span at);                              /* -x, +x, not x */
void gb_builtin(GraphBuilder *gb, const Builtin *b, const CallArgs *args, Value *r);              /* builtin calls */
void gb_index(GraphBuilder *gb, Value *base, Value **idx, const int *is_slice, Value **lo, Value **hi, int nidx, Value *r,
              Span at);                                                   /* x[...] */
void gb_attr(GraphBuilder *gb, Value *base, Str name, Value *r, Span at); /* x.T */
/* `name = param DT[dims] ~ init`: init is "normal", "uniform", "zeros", "ones", "constant" or NULL
 * (zeros); x[i] its arguments, known[i] whether each is known. */
void gb_param(GraphBuilder *gb, Value *v, DType stored, const char *init, const double x[2], const int known[2], Span at);

/* ---- the update graph (settings.c, eval_call.c's eval_check_update) ---- */

/* 1 while gb builds the update graph (eval.c's messages about run-time values differ there). */
int gb_updating(const GraphBuilder *gb);

/* Before the train block's optimizer (named optimizer, declaring nstate state variables) runs
 * update: 1 when gb builds the update graph now (started, with the flat layout of the step graph's
 * parameters); 0 when it is not asked for, or failed. */
int gb_update_begin(GraphBuilder *gb, Str optimizer, int nstate, Span at);
/* A value update starts from: role "p", "g" or "state" (name its name, init its starting value,
 * NULL for 0) is an f32[n] input, "t" an f32[] input. NULL after a failure (use the generic one). */
Value *gb_update_leaf(GraphBuilder *gb, const char *role, Str name, const Value *init, Span at);
/* The f32[] input "lr" that stands for the optimizer's hyper-parameter lr (its number lr, defined
 * at decl) while update runs; NULL when it cannot (a failure). */
Value *gb_update_lr(GraphBuilder *gb, const Value *lr, Span decl);
/* While update runs with parameter groups: the hyper-parameter weight_decay (its bound number wd)
 * as an f32[n] that is wd on the decayed parameters and 0 on the others (GP_NO_DECAY); NULL when
 * no trained parameter is undecayed (nothing to swap) or after a failure. */
Value *gb_update_decay(GraphBuilder *gb, const Value *wd, Span decl);
/* After update ran: the values of p (named p_name) and of the state variables, as lookup(ctx, name)
 * finds them where update ended, are the update graph's results. */
typedef Value *(*GbLookup)(void *ctx, Str name);
void gb_update_results(GraphBuilder *gb, GbLookup lookup, void *ctx, Str p_name, Span at);
/* After the update: the builder is done with it (the results are recorded unless it failed). */
void gb_update_end(GraphBuilder *gb);

/* Something the builder cannot follow (`what` completes "... is not supported yet"). */
void gb_unsupported(GraphBuilder *gb, Span at, const char *what);

#endif
