/* graph.h - the tensor graph IR: SSA ops with static shapes and dtypes.
 *
 * Pipeline position: sema (instantiation of a train block) -> [graph] -> autodiff -> plan ->
 * fuse -> kernel IR -> back ends. One Graph per entry point (the training step's forward and
 * backward, the optimizer update, a serving step). Nodes are appended in a valid topological
 * order (inputs always have smaller ids), so a pass is a loop over ids. Every node remembers the
 * source span that produced it, so kernels can name the lines they fused. Shapes are concrete
 * (int64 per dimension): a graph is built only from an instantiated model.
 *
 * Printed by `mbtc --emit=ir` (forward) and `--emit=grad` (forward + backward), checked by
 * graph_verify between passes in tests and debug builds. */
#ifndef MBT_GRAPH_H
#define MBT_GRAPH_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"
#include "value.h"

#define GRAPH_MAX_RANK 8
#define GRAPH_MAX_IN 5     /* attention_bwd with its document mask */
#define GRAPH_MAX_CONCAT 4 /* longer concatenations are chains */

/* Dropout's key. Every G_DROPOUT of a graph takes as its second input the graph's one G_INPUT
 * named "rng": i64[GRAPH_RNG_WORDS], each word in [0, 2^32), filled per call by the executable
 * (host.c) and by --verify-step (verify_step.c):
 *     [0] seed & 0xffffffff   [1] seed >> 32   [2] the 0-based optimizer step (mod 2^32)
 *     [3] the micro-batch within the step, all data ranks' counted in turn   [4] on: 1 in a
 *     training step's forward and backward, 0 in forward_loss (evaluation): dropout is the identity
 * The mask element i of a dropout with stream s (iattr[0]) keeps x[i] when the top 24 bits of the
 * first word of Philox4x32-10 (runtime/base/rng.c) with
 *     key     = {seed_lo, seed_hi ^ GRAPH_RNG_DOMAIN}
 *     counter = {i, s, step, micro}
 * are >= ceil(p * 2^24); kept values are scaled by 1 / (1 - p). So the mask is a function of
 * (seed, step, micro-batch, op, element), recomputed (not stored) by the backward, and a resumed
 * run draws what an uninterrupted one draws. ref.c (ref_dropout_keep) states it once for the
 * reference, fuse_codegen.c writes the same arithmetic as kernel IR. A dropout's element count
 * must be below 2^32 (graph_build.c refuses more, graph_verify checks it). */
#define GRAPH_RNG_WORDS 5
#define GRAPH_RNG_NAME "rng"
#define GRAPH_RNG_DOMAIN UINT32_C(0x64726f70) /* "drop", as rt.h's RT_RNG_DOMAIN_* name theirs */

typedef enum GOp {
    /* ---- leaves ------------------------------------------------------------------------ */
    G_PARAM,  /* trainable parameter; name = dotted path; init in iattr/fattr (below)    */
    G_INPUT,  /* data fed each step (data.x, data.y); name                               */
    G_CONST,  /* scalar constant fattr[0] broadcast to the node's shape (usually rank 0) */
    G_ARANGE, /* 0, 1, ..., shape[0]-1 (i32)                                             */
    /* ---- elementwise unary: out = f(in0), same shape ------------------------------------ */
    G_NEG,
    G_EXP,
    G_LOG,
    G_SQRT,
    G_RSQRT,
    G_TANH,
    G_SIGMOID,
    G_RELU,
    G_GELU,
    G_SILU,
    G_ABS,
    G_SIGN,
    G_SIN,
    G_COS,
    G_FLOOR,
    G_NOT,
    G_CAST,    /* to the node's dtype                                                     */
    G_DROPOUT, /* in1: the step's "rng" key (below); fattr[0] = p; iattr[0] = RNG stream id */
    G_CLAMP,   /* fattr[0] = lo, fattr[1] = hi                                            */
    /* ---- elementwise binary, NumPy broadcasting of in0 and in1 to the node's shape ------ */
    /* dtypes: arithmetic, max2/min2, reductions and unary ops but cast take inputs of the node's
       dtype (the builder inserts G_CAST); comparisons: in0, in1 of one dtype -> bool; and/or/not: bool;
       where: in0 bool, in1 and in2 of the node's dtype                                                  */
    G_ADD,
    G_SUB,
    G_MUL,
    G_DIV,
    G_POW,
    G_MOD,
    G_MAX2,
    G_MIN2,
    G_EQ,
    G_NE,
    G_LT,
    G_LE,
    G_GT,
    G_GE,
    G_AND,
    G_OR,
    G_WHERE, /* in0 ? in1 : in2, broadcast                                              */
    /* ---- reductions: iattr[0] = axis (-1 after normalisation means all), iattr[1] = keepdim */
    G_SUM,
    G_MEAN,
    G_MAX,
    G_MIN,
    G_LOGSUMEXP,
    G_NORM,     /* L2 norm of all elements -> rank 0                                       */
    G_SEG_NORM, /* per-segment L2 norm, broadcast back: in0 f32[n] -> f32[n], out[i] =
                       the norm of the segment holding i (0 outside every segment); the segments
                       are the graph's update->seg_off/seg_len (an update graph's parameters) */
    G_SUM_TO,   /* sum in0 down to the node's shape (undoes broadcasting; for autodiff)    */
    /* ---- composite ops with their own fused kernels (and backward ops below) ------------- */
    G_SOFTMAX,       /* iattr[0] = axis (normalised, >= 0)                                     */
    G_LOG_SOFTMAX,   /* iattr[0] = axis                                                         */
    G_LAYERNORM,     /* in0 = x, in1 = weight, in2 = bias; fattr[0] = eps; over the last axis  */
    G_RMSNORM,       /* in0 = x, in1 = weight; fattr[0] = eps                                   */
    G_ROPE,          /* in0 = x [..., T, hd]; fattr[0] = theta; halves rotated (NeoX layout);
                        row t at position t, or in1[t] when given (i32 [T]: plan/kv.c)       */
    G_ATTENTION,     /* in0..2 = q [B,H,T,hd], k, v [B,Hk,S,hd]; iattr[0] = causal;
                       fattr[0] = scale (1/sqrt(hd))                                           */
    G_CROSS_ENTROPY, /* in0 = logits [..., V], in1 = targets i32 [...] -> rank 0, the mean       */
    G_MSE,           /* in0, in1 same shape -> rank 0, the mean of squared differences          */
    G_ONE_HOT,       /* in0 = i32 idx -> f32 [..., iattr[0]]                                    */
    G_TOPK_VALUES,   /* in0; iattr[0] = k, iattr[1] = axis; largest first                       */
    G_TOPK_INDICES,  /* same, the i32 positions                                                 */
    /* ---- linear algebra and data movement ---------------------------------------------- */
    G_MATMUL,    /* in0 [..., n, k] @ in1 [..., k, m], batch dims broadcast; rank-1 cases
                       as in NumPy                                                             */
    G_RESHAPE,   /* same element count, the node's shape                                    */
    G_TRANSPOSE, /* swap axes iattr[0] and iattr[1] (normalised)                            */
    G_SLICE,     /* along axis iattr[0]: [iattr[1], iattr[2]) (normalised, in range)        */
    G_GATHER,    /* rows of in0 [n, ...] picked by i32 in1 [...] -> [..., ...]             */
    G_CONCAT,    /* along axis iattr[0]; in0..in(nin-1) (up to GRAPH_MAX_CONCAT; longer lists
                       are a chain of concats)                                                 */
    G_BROADCAST, /* in0 broadcast to the node's shape                                       */
    /* ---- backward ops: what autodiff emits for the composite ops ------------------------- */
    G_SCATTER_ADD,     /* gather's backward: zeros of the node's shape [n, ...], rows in1 += in0  */
    G_SOFTMAX_BWD,     /* in0 = dy, in1 = y (softmax output); iattr[0] = axis                     */
    G_LAYERNORM_BWD_X, /* in0 = dy, in1 = x, in2 = weight; fattr[0] = eps -> dx               */
    G_LAYERNORM_BWD_W, /* in0 = dy, in1 = x; fattr[0] = eps -> dweight (summed over rows)     */
    G_RMSNORM_BWD_X,   /* in0 = dy, in1 = x, in2 = weight; fattr[0] = eps -> dx               */
    G_RMSNORM_BWD_W,   /* in0 = dy, in1 = x; fattr[0] = eps -> dweight                        */
    G_ROPE_BWD,        /* in0 = dy; fattr[0] = theta (rotation by the negative angle)             */
    G_ATTENTION_BWD_Q,
    G_ATTENTION_BWD_K,
    G_ATTENTION_BWD_V,
    /* in0 = dout, in1 = q, in2 = k, in3 = v; iattr/fattr as the forward      */
    G_CROSS_ENTROPY_BWD, /* in0 = dloss (rank 0), in1 = logits, in2 = targets -> dlogits       */
    /* ---- inference only: the forward over new tokens with a paged KV cache (plan/kv.c) ---- */
    G_KV_ATTENTION, /* in0..2 = q [1,H,N,hd], k, v [1,Hk,N,hd] of N new tokens; in3 = the i32 input
                       "kv" (fuse_kv.h: the metadata; the pool is RtStep.kv_pool); causal over each token's
                       sequence; iattr[0] = layer, iattr[1] = layers, iattr[2] = block,
                       iattr[3] = max_blocks; fattr[0] = scale, fattr[1] = the pool's DType */
    G_OP_COUNT
} GOp;

/* Parameter initialisers (G_PARAM's iattr[0]; fattr[0], fattr[1] their numbers). */
typedef enum GInit { GI_ZEROS, GI_ONES, GI_CONSTANT, GI_NORMAL, GI_UNIFORM } GInit;

/* A parameter's group (G_PARAM's iattr[1], bits): frozen (the train block's `freeze`, or a sub-model
 * made with trainable = false): autodiff computes no gradient for it and the update leaves it and its
 * state as they are; no_decay (the optimizer's `no_decay`): its `weight_decay` is 0 in update. */
enum { GP_FROZEN = 1, GP_NO_DECAY = 2 };

typedef struct GNode {
    int id;
    GOp op;
    DType dt;
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    int nin;
    int in[GRAPH_MAX_IN]; /* input node ids, all < id */
    int64_t iattr[4];
    double fattr[2];
    const char *name; /* G_PARAM: dotted path; G_INPUT: "data.x"; else NULL */
    Span src;         /* the source that produced it (span_none for synthesised nodes) */
} GNode;

/* What makes a graph an update graph: the optimizer's `update` applied to every parameter at
 * once (sema_build_train builds it, plan.h runs it after the micro-batches). Its flat vectors hold the
 * parameters one after another, parameter i at elements [seg_off[i], seg_off[i] + seg_len[i]), each
 * seg_off a multiple of the layout's alignment; the elements in between are padding (zero in every
 * region, and the stdlib's optimizers keep them zero). The same layout is the parameter, gradient
 * and optimizer-state regions of the memory plan, so the update runs over each region as it lies. */
typedef struct GraphUpdate {
    const char *optimizer;       /* its name ("adamw") */
    int64_t n;                   /* length of the flat vectors (elements, padding included): the
                                    parameters the optimizer updates, every one but the frozen */
    int64_t n_params;            /* the whole parameter region: n, then the frozen parameters (laid
                                    out last: no gradient, no update, no state); n without them */
    int nsegs;                   /* one segment per parameter, in the step graph's parameter order */
    const int64_t *seg_off;      /* [nsegs] first element of each */
    const int64_t *seg_len;      /* [nsegs] its element count */
    const char *const *seg_name; /* [nsegs] the parameter's dotted name */
    int p_in, g_in;              /* G_INPUT "p" and "g": f32[n] */
    int lr_in;                   /* G_INPUT "lr": f32[], the step's rate (lr_base x schedule); -1 if the
                                 optimizer has no hyper-parameter lr */
    int t_in;                    /* G_INPUT "t": f32[], the 1-based step number */
    double lr_base;              /* the hyper-parameter lr as bound (0 when lr_in < 0) */
    int nstate;
    const char **state_name; /* [nstate] "m", "v" in declaration order */
    double *state_init;      /* [nstate] the number each starts from */
    int *state_in;           /* [nstate] G_INPUT "state.m": f32[n] */
    int *state_out;          /* [nstate] the node of its new value (state_in[i] when unchanged) */
    int p_out;               /* the node of the new parameters (p_in when unchanged) */
    /* The parameter casts (docs/memory.md, "The parameter casts' region"): a bf16 program's update
     * also writes cast(p_new), the half-precision copies the step reads, so that no micro-batch has
     * to cast them; -1 when it does not (f32, or recompute / offload.activations: graph_update_add_cast) */
    int cast_out;
    /* Parameter groups: the parameters are laid out decayed first, then those with GP_NO_DECAY,
     * then the frozen ones (each group in declaration order; the step graph's params list follows
     * the layout), so a group is one range of elements: weight_decay applies to [0, decay_end),
     * the update runs over [0, n) and the frozen parameters lie in [n, n_params), segments the
     * update's vectors do not reach. decay_end is n without no_decay. */
    int64_t decay_end;
} GraphUpdate;

typedef struct Graph {
    Arena *ar;
    GNode **node; /* node[id] */
    int n, cap;
    int loss; /* id of the scalar loss, -1 if none */
    int nparams;
    int *params;         /* ids of the G_PARAM nodes, in declaration order */
    int *grads;          /* after autodiff: grads[i] is the id of d loss / d params[i] */
    const char *name;    /* what the graph is ("train tiny"), for graph_print's header; may be NULL */
    GraphUpdate *update; /* set for an update graph (its layout and roles), else NULL */
    /* Statistics over the global batch (`global_mean(e)`, docs/language.md): statistic k is the
     * G_INPUT stat_in[k] ("stat.K", f32), whose value is the mean of node stat_expr[k] (the same
     * shape) over every micro-batch of the step (and every data rank). A leaf, so autodiff gives it
     * no gradient: it is a constant of the backward. No stat_expr depends on a stat_in (the
     * builder refuses a statistic of a statistic), so one statistics pass computes them all. */
    int nstats, statcap;
    int *stat_in;   /* [nstats] */
    int *stat_expr; /* [nstats] */
    /* Running statistics (`running(buf, x, momentum)`, docs/language.md): after every optimizer
     * step the frozen parameter run_param[i] (a G_PARAM node) becomes (1 - run_momentum[i]) x
     * itself + run_momentum[i] x statistic run_stat[i] (an index into stat_in / stat_expr: x's
     * mean over the global batch). The runtime applies it (runtime/cli/train.c), and so does
     * --verify-step's reference. */
    int nrunning, runcap;
    int *run_param;
    int *run_stat;
    double *run_momentum;
} Graph;

Graph *graph_new(Arena *ar); /* an empty graph */
/* Appends a node; shape copied; inputs must exist. Returns its id. */
/* iattr/fattr/name start zeroed; a G_PARAM's id is appended to params by graph_add itself. */
int graph_add(Graph *g, GOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in, Span src);
GNode *graph_node(const Graph *g, int id); /* node[id] */
/* Records statistic (in, expr) of a step graph (Graph.stat_in, stat_expr). */
void graph_add_stat(Graph *g, int in, int expr);
/* Records running statistic (param, stat, momentum) of a step graph (Graph.run_param ...). */
void graph_add_running(Graph *g, int param, int stat, double momentum);
/* Rewrites every use of each statistic's input to the statistic's own expression and turns the
 * inputs into unused zero constants: the step at one micro-batch, where the mean over the global
 * batch is the micro-batch's own value. Only after autodiff (the backward keeps treating the
 * statistics as constants); nstats becomes 0. */
void graph_inline_stats(Graph *g);
int64_t graph_numel(const GNode *n);                    /* product of the shape */
const char *graph_op_name(GOp op);                      /* "matmul", "layernorm_bwd_x" ... */
void graph_print(FILE *out, const Graph *g, int first); /* --emit=ir from node `first` on */
/* Checks the invariants (input ids, ranks, shapes each op implies, dtypes). Returns the number of
 * problems, each printed to `out` as `graph: %N: ...`. A failure is a compiler bug. */
int graph_verify(const Graph *g, FILE *out);
/* The update graph's cast_out (GraphUpdate): cast(p_new) to the dtype the step reads its
 * parameters in, when the step reads any through a half-precision G_CAST; returns whether it added one. */
int graph_update_add_cast(Graph *update, const Graph *step);
/* out may be NULL: the problems are then only counted. */

#endif
