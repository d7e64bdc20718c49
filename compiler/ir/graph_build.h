/* graph_build.h - building the forward graph IR of a train block during sema's instantiation.
 *
 * Pipeline position: sema (eval.c, settings.c) -> [graph_build] -> graph IR -> autodiff.
 * sema_build_train_graph (sema.h) runs the whole checker with a GraphBuilder waiting for one
 * train block. While that block instantiates its model and evaluates its data and loss, Sema.gb
 * is set, and the hooks below - called from eval.c and settings.c at every site that makes a
 * tensor - append a node for each tensor result and store it in the Value:
 *
 *     Value.graph_id = node id + 1      (0 = no node; so zeroed Values never alias node 0)
 *
 * Numbers next to tensors become G_CONST rank-0 nodes, `param` declarations G_PARAM nodes named
 * by their dotted path from the model (`h.3.attn.c_attn.weight`, list items by index), data.x
 * and data.y G_INPUT nodes, the loss g->loss. Every hook is a no-op unless gb_listening() (never
 * under --check, never while a declaration is checked on its own with symbolic constants). A
 * construct the builder cannot express (a shape not known at compile time, an `if` on a value
 * only known at run time, ...) is a located user error saying so; after the first one, or after
 * any error of the program, the hooks stop adding nodes and the build returns NULL.
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

#include "graph.h"
#include "sema_internal.h"

/* 1 while the graph builder listens: sema is evaluating the train block being built with
 * concrete constants (generic: the frame or call checks a declaration on its own). */
static inline int gb_listening(const Sema *s, int generic) { return s->gb != NULL && !generic; }

/* ---- hooks in settings.c (the train block) ---- */

GraphBuilder *gb_for_train(Sema *s, const Node *train); /* the builder when `train` is the block being built */
void gb_model(GraphBuilder *gb, Value *model);          /* after instantiation: names the parameters */
void gb_data(GraphBuilder *gb, Value *data);            /* data.x, data.y -> G_INPUT */
void gb_loss(GraphBuilder *gb, Value *loss, Span at);   /* the loss -> g->loss; the graph is complete */

/* Generation's forward (sema_build_train): beside the step's builder rides a second one, for
 * the train block's `model(data.x)` with data.x of one row. After the loss, settings.c
 * instantiates the model again with it listening (gb_model names its parameters as in the
 * step), gives it that data.x and the model's result. gb_forward_of is NULL when no forward is
 * wanted (sema_build_train_graph) or the step's build failed. */
GraphBuilder *gb_forward_of(GraphBuilder *gb);
void gb_forward_input(GraphBuilder *gb, Value *x);      /* x (i32[1, seq]) -> G_INPUT data.x */
void gb_forward_output(GraphBuilder *gb, Value *out);    /* the model's result; the graph is complete */

/* ---- hooks in eval.c (each gets the operands and the result sema computed) ---- */

void gb_binary(GraphBuilder *gb, Op op, Value *a, Span sa, Value *b, Span sb, Value *r, Span at); /* a op b, a op= b */
void gb_unary(GraphBuilder *gb, Op op, Value *a, Value *r, Span at);                              /* -x, +x, not x */
void gb_builtin(GraphBuilder *gb, const Builtin *b, const CallArgs *args, Value *r);              /* builtin calls */
void gb_index(GraphBuilder *gb, Value *base, Value **idx, const int *is_slice, Value **lo, Value **hi, int nidx,
              Value *r, Span at);                                                                 /* x[...] */
void gb_attr(GraphBuilder *gb, Value *base, Str name, Value *r, Span at);                         /* x.T */
/* `name = param DT[dims] ~ init`: init is "normal", "uniform", "zeros", "ones", "constant" or NULL
 * (zeros); x[i] its arguments, known[i] whether each is known. */
void gb_param(GraphBuilder *gb, Value *v, DType stored, const char *init, const double x[2], const int known[2],
              Span at);
/* ---- the update graph: hooks in settings.c and eval.c (eval_check_update) ---- */

/* 1 while gb builds the update graph (eval.c's messages about run-time values differ there). */
int gb_updating(const GraphBuilder *gb);

/* Before the train block's optimizer runs update: 1 when gb builds the update graph now (started,
 * with the flat layout of the step graph's parameters); 0 when it is not asked for, or failed. */
int gb_update_begin(GraphBuilder *gb, Value *opt, Span at);
/* A value update starts from: role "p", "g" or "state" (name its name, init its starting value,
 * NULL for 0) is an f32[n] input, "t" an f32[] input. NULL after a failure (use the generic one). */
Value *gb_update_leaf(GraphBuilder *gb, const char *role, Str name, const Value *init, Span at);
/* While update runs (on = 1) the optimizer's hyper-parameter lr is the f32[] input "lr"; on = 0
 * gives it its number back. opt_scope is the bound optimizer's scope. */
void gb_update_lr(GraphBuilder *gb, Scope *opt_scope, int on);
/* After update ran in loc: the values of p (named p_name) and of the state variables are the
 * update graph's results. */
void gb_update_results(GraphBuilder *gb, Scope *loc, Str p_name, Span at);
/* After the update: the builder is done with it (the results are recorded unless it failed). */
void gb_update_end(GraphBuilder *gb);

/* Something the builder cannot follow (`what` completes "... is not supported yet"). */
void gb_unsupported(GraphBuilder *gb, Span at, const char *what);

#endif
