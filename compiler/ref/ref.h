/* ref.h - the reference evaluator: runs a graph op by op in double precision on the CPU.
 *
 * Pipeline position: beside the back ends: an oracle, not a stage of what -o builds (mbtc links ref.c only for --verify-step). It is the oracle the tests
 * hold everything against: gradients against finite differences, fused kernels against the
 * unfused graph, the CPU and CUDA back ends against it. Plain loops, no tricks: correctness and
 * readability over speed. Integer tensors (token ids, indices) are held as doubles (exact below
 * 2^53); bool tensors as 0.0 / 1.0. */
#ifndef MBT_REF_H
#define MBT_REF_H

#include "graph.h"

/* Evaluates every node of g in order. leaves[id] gives the values of each G_PARAM and G_INPUT
 * node (numel doubles, row-major); other entries are ignored. Returns vals with vals[id] the
 * values of node id (allocated in ar). Reports an out-of-range gather index or target as an
 * error (diag_error_noloc) and returns NULL. */
double **ref_run(const Graph *g, double *const *leaves, Arena *ar);

/* Statistics over the global batch (Graph.stat_in, global_mean): the first of the step's two
 * passes. For each micro-batch m in order, set_leaves(ctx, m, leaves) puts its data into leaves and
 * the graph runs up to the statistics' expressions; each statistic is the sum of its values over
 * the micro-batches, in micro-batch order, divided by nmicro. Its input's leaf (allocated in ar) is
 * then that mean, for ref_run's second pass, in which every micro-batch reads the same statistics.
 * Returns 0 (nothing to do without statistics), or -1 after ref_run reported an error. */
typedef void (*RefMicroFn)(void *ctx, int64_t m, double **leaves);
int ref_global_stats(const Graph *g, int64_t nmicro, RefMicroFn set_leaves, void *ctx, double **leaves, Arena *ar);

/* Evaluates one node whose inputs are already in vals; writes vals[n->id] (caller-allocated,
 * graph_numel(n) doubles). Returns 0, or -1 after reporting a bad index. */
int ref_eval_node(const Graph *g, const GNode *n, double **vals);

/* The backward ops (G_SCATTER_ADD ... G_CROSS_ENTROPY_BWD), in ref_bwd.c; same contract. */
int ref_eval_bwd(const Graph *g, const GNode *n, double **vals);

/* The segmented ops of update graphs (G_SEG_NORM), in ref_seg.c; same contract. */
int ref_eval_seg(const Graph *g, const GNode *n, double **vals);

/* Philox4x32-10, the runtime's (runtime/base/rng.c, rt_philox4x32), written again for the
 * compiler; and whether dropout with probability p keeps element i of stream `stream` under the
 * key words rng (graph.h, GRAPH_RNG_WORDS, states the draw): 1 when p <= 0 or rng[4] (on) is 0. */
void ref_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
int ref_dropout_keep(const uint32_t rng[GRAPH_RNG_WORDS], int64_t stream, int64_t i, double p);

/* NumPy's remainder on doubles: the result has the sign of the divisor (x % 0 is NaN). Shared by
 * every interpreter of G_MOD / K_MOD so they cannot disagree. */
double ref_mod(double a, double b);

/* The first key query t of a document-masked attention sees, from its position pos in its
 * document (ref.c): t - pos, clamped to [0, t + 1]. */
int64_t ref_attn_first(int64_t t, double pos);

/* Broadcasting helper shared by both files: the flat index into an input of shape (rank, shape)
 * aligned at the right with the output shape, for output flat index i. */
int64_t ref_bcast_index(int out_rank, const int64_t *out_shape, int64_t i, int in_rank, const int64_t *in_shape);

#endif
