/* fuse_internal.h - what the files of fusion share: the fused graph's nodes (a primitive form of
 * the graph IR the partition works on) and the partition's state.
 *
 * Pipeline position: inside fuse (graph -> [fuse_lower.c -> fuse_partition.c -> fuse.c,
 * fuse_codegen.c] -> kernel IR). Not a public interface: fuse.h is. */
#ifndef MBT_FUSE_INTERNAL_H
#define MBT_FUSE_INTERNAL_H

#include "fuse.h"

/* ---- the fused graph -------------------------------------------------------------------------
 * fuse_lower rewrites the graph into primitive nodes (FNode), hash-consed so that a value two
 * graph nodes compute alike is one node (layernorm's mean in the forward and in the backward):
 *   - leaves, constants and iota (the coordinate along an axis);
 *   - views: reshape, permute (swap two axes), expand (broadcast), slice, concat, gather (rows
 *     picked by an index tensor), take (one element of each last-axis row): index arithmetic;
 *   - pointwise maps: one KIR instruction each (F_MAP with its KOp), inputs broadcast to the
 *     node's shape; dropout and rope, which read their input at computed positions;
 *   - reductions (F_REDUCE): add, max or min over a set of axes, keeping them as size 1;
 *   - GEMMs (F_GEMM): operands already resolved to buffers with transposes folded in;
 *   - dedicated kernels: attention (forward, row statistics for the backward, the backward of
 *     q, k and v), topk, scatter_add, cross-entropy's row statistics, and the per-parameter norm of an update graph.
 * Composite ops (softmax, layernorm, cross-entropy and their backward ops, logsumexp, mse, ...)
 * become maps and reductions, written in the reference evaluator's order of operations. */

typedef enum FOp {
    F_LEAF,       /* a parameter or input; ia[0] = graph node                                  */
    F_CONST,      /* fa[0] everywhere                                                          */
    F_IOTA,       /* the coordinate along axis ia[0]                                           */
    F_RESHAPE,    /* same elements, row-major                                                  */
    F_PERMUTE,    /* swaps axes ia[0] and ia[1]                                                 */
    F_EXPAND,     /* in0 broadcast (right-aligned) to the shape                                */
    F_SLICE,      /* along axis ia[0] from ia[1]                                                */
    F_CONCAT,     /* along axis ia[0]                                                           */
    F_GATHER,     /* rows of in0 [R, ...] at the i32 indices in1 [...] -> [..., ...]          */
    F_TAKE,       /* in0 [..., V] at the i32 column in1 [...] of each row -> [...]            */
    F_MAP,        /* kop applied to in0..in2 broadcast to the shape                            */
    F_DROPOUT,    /* in[1] the "rng" key; fa[0] = p, ia[0] = stream: graph.h's Philox mask   */
    F_ROPE,       /* fa[0] = theta, ia[0] = 1 for the backward (the transposed rotation)      */
    F_REDUCE,     /* kop over the axes in the bit mask ia[0] of in0; those axes become 1       */
    F_GEMM,       /* in0 = A's buffer node, in1 = B's, in2 = the bias's (FE_BIAS); gemm holds the rest */
    F_GEMM_BGRAD, /* in0 = a GEMM whose B is [k, n] (not transposed): B's column sums, computed by
                      that GEMM's launch (FE_BGRAD_B: a bias gradient beside its weight gradient)    */
    F_ATTN,       /* q, k, v; ia[0] = causal; fa[0] = scale                                    */
    F_ATTN_LSE,   /* q, k, v (attrs as F_ATTN) -> [..., H, T, 2] (f32, f64 for f64): each query
                      row's max m of the scaled scores and sum l of exp(s - m), stored by the
                      forward's kernel (a member of F_ATTN's) for the backward                  */
    F_ATTN_STATS, /* dout, o, lse -> [..., H, T, 3]: m and l (lse's), and sum_j P dP = rowsum(dout * o)
                      per query row (o the forward's result, read where its kernel stored it)  */
    F_ATTN_BWD_Q, /* dout, q, k, v, stats                                                      */
    F_ATTN_BWD_K,
    F_ATTN_BWD_V,
    F_KV_ATTN,     /* q, k, v, the "kv" input; ia[0..3], fa[0..1] as G_KV_ATTENTION (fuse_kv.h)   */
    F_TOPK,        /* ia[0] = k, ia[1] = axis, ia[2] = 1 for the indices                        */
    F_SCATTER_ADD, /* in0 = rows, in1 = i32 indices; zeros of the shape, rows added            */
    F_CE_STATS,    /* in0 = logits [..., V], in1 = the i32 targets [...] -> [..., 3] (f32, f64 for
                      f64): each row's max m, sum of exp(x - m) and the target's logit (clamped to
                      [0, V) as F_TAKE), cross-entropy's statistics (one online pass on the GPU) */
    F_CE_GRAD,     /* in0 = its F_CE_STATS, in1 = the logits [..., V] as read, in2 = the targets,
                      in3 = dloss -> [..., W] (W >= V, ia[0] = V): cross-entropy's backward in
                      in1's type, (exp(x - m) / s - onehot) * dloss / N, the columns past V zero
                      (a padded vocabulary's concat), stored in dt (its cast): the classifier
                      kernel, computing F_CE_STATS too (pinned) and written over the logits'
                      buffer when nothing reads them later (fuse.c's fz_ce_inplace)          */
    F_LORA_S,      /* LoRA's down product S = x @ A^T (in0 = x's buffer node, in1 = A's; gemm as the
                      F_GEMM it replaced): computed by its F_LORA's kernel (pinned there), stored
                      only when another launch reads it (the backward)                         */
    F_LORA,        /* in0 = its F_LORA_S, in1 = the up weight's buffer node, in2 = D (the base
                      product); gemm = the up product's: C = D + alpha S @ opB - the down and up
                      products in one launch (fuse_gemm.c's fl_lora_chain, LoRAFusion's FusedLoRA) */
    F_SEG_NORM,    /* in0 f32[n] of an update graph: each element the L2 norm of its parameter's
                      segment (graph.h, GraphUpdate), 0 between segments                        */
    F_OP_COUNT
} FOp;

#define FUSE_MAX_IN 6 /* attention_bwd_*: dout, q, k, v, stats, pos */

typedef struct FNode {
    int id;
    FOp op;
    KOp kop;
    DType dt;
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    int nin;
    int in[FUSE_MAX_IN];
    int64_t ia[4];
    double fa[2];
    int gid;       /* the graph node it was made for (a composite's parts: the composite) */
    int keep;      /* lowering's hint: give it a buffer (cross-entropy's per-row loss, so that the
                       loss's mean reads N values rather than the logits); not part of its identity */
    FuseGemm gemm; /* F_GEMM: a, b, c filled in by the partition; F_LORA_S, F_LORA: the products' shapes */
} FNode;

struct FusedGraph {
    Arena *ar;
    const Graph *g;
    FNode **node;
    int n, cap;
    int *hash; /* open addressing over node ids, -1 empty */
    int hcap;
    int *g2f;      /* [g->n] the node holding each graph node's value, -1 when not lowered */
    int *absorbed; /* [g->n] a matmul folded into the GEMM of its sum_to or bias add: that GEMM, else -1 */
    int noutputs;
    int *outputs;    /* the graph nodes asked for */
    int casts_apart; /* fuse_casts_apart: each parameter-only kernel its own launch, before its first reader */
};

const char *fuse_fop_name(FOp op); /* "map", "reduce" ... */

#define FUSE_LORA_MAX_RANK 64       /* the fused kernel keeps a row's rank values in registers */
int64_t fuse_numel(const FNode *n); /* elements */

/* ---- the partition --------------------------------------------------------------------------- */

typedef struct IVec {
    int *v;
    int n, cap;
} IVec;

void fuse_ivec_push(Arena *ar, IVec *v, int x); /* append */
int fuse_ivec_has(const IVec *v, int x);        /* membership (linear) */

/* Shapes a and b equal once their size-1 axes are left out. */
int fuse_squeeze_eq(int ra, const int64_t *a, int rb, const int64_t *b);

enum { FC_LEAF, FC_INLINE, FC_ANCHOR };          /* how a node is computed */
enum { FK_ELEM, FK_REDUCE, FK_GEMM, FK_OPAQUE }; /* kinds of launch */

typedef struct FSeg { /* a part of an elementwise kernel: members of one shape */
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    IVec members;
} FSeg;

typedef struct FKern {
    int alive;
    int kind;
    int rank;                      /* FK_ELEM: its first segment's shape; FK_REDUCE: the shape  */
    int64_t shape[GRAPH_MAX_RANK]; /* F of the reduced inputs                                   */
    uint32_t mask;                 /* FK_REDUCE: the reduced axes of F                          */
    IVec members;                  /* the nodes it owns (computes and may store), ascending     */
    int nseg;
    FSeg *seg;  /* FK_ELEM */
    IVec reads; /* nodes it loads (owned elsewhere or leaves)               */
    IVec inl;   /* nodes it computes inline (owned by nobody)                */
    IVec deps;  /* kernels it reads from                                     */
    int order;  /* its launch, once scheduled                                */
} FKern;

typedef struct FuseCtx {
    Arena *ar;  /* the result's arena */
    Arena *tmp; /* the partition's scratch */
    const Graph *g;
    const FusedGraph *fg;
    int n;                 /* fg->n */
    unsigned char *live;   /* [n] needed by an output */
    unsigned char *cat;    /* [n] FC_* */
    unsigned char *mat;    /* [n] has a buffer of its own */
    unsigned char *forced; /* [n] must have one (an output, a GEMM or dedicated kernel operand) */
    unsigned char *isout;  /* [n] an output */
    int *owner;            /* [n] kernel owning it, -1 */
    int *pin;              /* [n] a node whose kernel must also store this one, -1 */
    IVec *users;           /* [n] live users */
    FKern *k;
    int nk, capk;
    int *buf_of;   /* [n] buffer index once assigned, -1 */
    int *buf_node; /* [buffers] the graph node each buffer holds, -1 */
    int final;     /* 1 while generating the kernels of the result */
    int *stamp;    /* [n] visit marks of fz_eval */
    int stampv;
    int *work;  /* [n] fz_eval's stack */
    int *kmark; /* [capk] visit marks of the reachability search */
    int kmarkv;
    int *kver;       /* [capk] bumped when a kernel changes (for the failed-merge cache) */
    int casts_apart; /* FusedGraph.casts_apart */
} FuseCtx;

/* Partitions the nodes of c->fg that its outputs need into launches (c->ar, c->tmp and c->g set
 * by the caller): sets up the rest of c, and points *order at the launches' kernels (c->k
 * indices) in launch order, allocated in c->tmp. Returns the number of launches. */
int fuse_partition(FuseCtx *c, int **order);

/* Generates kernel kid of the partition into a Kernel allocated in ar. With final == 0 (a trial
 * while deciding a merge) it returns NULL and sets *why when the kernel cannot be formed (a row
 * reduction read at another row); with final == 1 that is an internal error. */
Kernel *fuse_gen_kernel(FuseCtx *c, int kid, Arena *ar, const char **why);

/* The graph node ids a kernel computes (members and inlined nodes, composites by their parts). */
int fuse_kernel_nodes(FuseCtx *c, int kid, int **nodes, Arena *ar);

/* The node whose buffer the classifier kernel n (F_CE_GRAD) writes its gradient over - its logits,
 * read through a slice and a cast - when fuse.c gave n that buffer; else -1. */
int fuse_ce_inplace_base(const FuseCtx *c, const FNode *n);

#endif
