/* fuse_cg.h - what the kernel generator's two files share: fuse_codegen.c (indices, values,
 * elementwise and reduction kernels) and fuse_codegen_dedicated.c (attention, topk, scatter_add,
 * an update graph's per-parameter norm).
 *
 * Pipeline position: inside fuse, partition -> [fuse_codegen] -> kernel IR. Not a public
 * interface: fuse.h is. */
#ifndef MBT_FUSE_CG_H
#define MBT_FUSE_CG_H

#include "fuse_internal.h"

/* An index into a node's shape: one i64 SSA value per dimension, or the flat row-major offset,
 * each computed when first needed. */
typedef struct KIdx {
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    int dim[GRAPH_MAX_RANK]; /* SSA ids, -1 until computed */
    int flat;                /* SSA id, -1 until computed */
} KIdx;

/* The state of one kernel being generated. */
typedef struct CG {
    FuseCtx *c;
    int kid;
    FKern *K;
    Arena *ar;
    Kernel *k;
    KBuilder *b;
    const char *why;          /* the first failure (trial mode) */
    int depth;                /* cg_value's recursion depth */
    int red;                  /* a reduction kernel */
    int *acc;                 /* [n] a reduce member's accumulator */
    unsigned char *done;      /* [n] its loop has ended */
    int *dep;                 /* [n] memo of cg_dep + 1 (0: unknown) */
    int kept[GRAPH_MAX_RANK]; /* SSA of F's kept coordinates */
} CG;

/* A reshape from shape a to shape b as groups of axes with equal products (size-1 axes left out):
 * group k is a's axes gi[0 .. ni) and b's gj[0 .. nj), in order. */
typedef struct ReshapeGroup {
    int gi[GRAPH_MAX_RANK], gj[GRAPH_MAX_RANK], ni, nj;
} ReshapeGroup;

static inline const FNode *cg_n(const CG *g, int f) { return g->c->fg->node[f]; }
static inline KType cg_t(const FNode *n) { return kir_type_of(n->dt); }
static inline int cg_i(CG *g, int64_t v) { return kb_const_i(g->b, KT_I64, v); }
static inline int cg_f(CG *g, KType t, double v) {
    return kir_type_is_float(t) ? kb_const_f(g->b, t, v) : kb_const_i(g->b, t, (int64_t)v);
}
static inline int cg_op1(CG *g, KOp op, KType t, int a) { return kb_op(g->b, op, t, 1, a, -1, -1); }
static inline int cg_op2(CG *g, KOp op, KType t, int a, int b) { return kb_op(g->b, op, t, 2, a, b, -1); }
static inline int cg_as(CG *g, int v, KType t) { return kb_type(g->b, v) == t ? v : cg_op1(g, K_CAST, t, v); } /* v as type t */
static inline int cg_op3(CG *g, KOp op, KType t, int a, int b, int c) { return kb_op(g->b, op, t, 3, a, b, c); }
static inline int cg_iadd(CG *g, int a, int b) { return cg_op2(g, K_ADD, KT_I64, a, b); }
static inline int cg_isub(CG *g, int a, int b) { return cg_op2(g, K_SUB, KT_I64, a, b); }
static inline int cg_imul(CG *g, int a, int b) { return cg_op2(g, K_MUL, KT_I64, a, b); }

/* A failure: remembered on trial (the merge is refused), a compiler bug in the final kernel. */
void cg_fail(CG *g, const char *why);

/* ---- indices ---- */
void ix_init(KIdx *ix, int rank, const int64_t *shape);
int ix_dim(CG *g, KIdx *ix, int d); /* dimension d, from the flat offset when unknown */
int ix_flat(CG *g, KIdx *ix);       /* the flat offset, from the dimensions when unknown */
KIdx ix_of(int rank, const int64_t *shape, const int *dims);
int reshape_groups(int ra, const int64_t *a, int rb, const int64_t *b, ReshapeGroup *out);
KIdx ix_reshape(CG *g, KIdx *ix, int rank, const int64_t *shape); /* ix in a reshaped view */

/* ---- values ---- */
int cg_buf(CG *g, int f, int written);           /* kernel parameter of node f's buffer */
void cg_store(CG *g, int f, KIdx *ix, int v);    /* stores v when f has a buffer */
int cg_value(CG *g, int f, KIdx *ix);            /* node f's value at ix, computed or loaded */
int cg_index(CG *g, int f, KIdx *ix, int64_t n); /* an i32 index tensor's element, clamped to [0, n) */
int cg_computes(const CG *g, int f);             /* computed here (a member, or inlined) */

/* ---- dedicated kernels (fuse_codegen_dedicated.c): node n is the kernel's op ---- */
void cg_attention(CG *g, const FNode *n);
void cg_attention_stats(CG *g, const FNode *n);
void cg_attention_bwd_q(CG *g, const FNode *n);
void cg_attention_bwd_kv(CG *g, const FNode *n);
void cg_kv_attention(CG *g, const FNode *n); /* fuse_kv.h's kernel for a G_KV_ATTENTION */
void cg_topk(CG *g, const FNode *n);
void cg_scatter_add(CG *g, const FNode *n);
void cg_ce_stats(CG *g, const FNode *n);
void cg_ce_grad(CG *g, const FNode *n);
void cg_lora(CG *g, const FNode *n);
void cg_seg_norm(CG *g, const FNode *n);

#endif
