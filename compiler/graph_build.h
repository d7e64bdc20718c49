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
 * any error of the program, the hooks stop adding nodes and the build returns NULL. */
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

/* ---- hooks in eval.c (each gets the operands and the result sema computed) ---- */

void gb_binary(GraphBuilder *gb, Op op, Value *a, Span sa, Value *b, Span sb, Value *r, Span at); /* a op b, a op= b */
void gb_unary(GraphBuilder *gb, Op op, Value *a, Value *r, Span at);                              /* -x, +x, not x */
void gb_builtin(GraphBuilder *gb, const Builtin *b, const CallArgs *args, Value *r);              /* builtin calls */
void gb_index(GraphBuilder *gb, Value *base, Value **idx, const int *is_slice, Value **lo, Value **hi, int nidx,
              Value *r, Span at);                                                                 /* x[...] */
void gb_attr(GraphBuilder *gb, Value *base, Str name, Value *r, Span at);                         /* x.T */
/* `name = param DT[dims] ~ init`: init is "normal", "uniform", "zeros", "ones", "constant" or NULL
 * (zeros); x[i] its arguments, known[i] whether each is known. */
void gb_param(GraphBuilder *gb, Value *v, const char *init, const double x[2], const int known[2], Span at);
/* Something the builder cannot follow (`what` completes "... is not supported yet"). */
void gb_unsupported(GraphBuilder *gb, Span at, const char *what);

#endif
