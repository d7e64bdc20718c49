/* fuse_lower.h - what the lowering's two files share: fuse_lower.c (the graph IR into fused nodes)
 * and fuse_gemm.c (its GEMMs and their epilogues). Not used outside compiler/fuse's lowering. */
#ifndef MBT_FUSE_LOWER_H
#define MBT_FUSE_LOWER_H

#include "fuse_internal.h"

/* The lowering's state. */
typedef struct FL {
    FusedGraph *fg;
    const Graph *g;
    int gid;    /* the graph node being lowered */
    int *guses; /* [g->n] uses by live nodes */
    int *guser; /* [g->n] the last live user */
    const unsigned char *glive;
} FL;

/* fuse_lower.c: the fused node f (an internal error when there is none), a node added hash-consed
 * (its id), a node's prototype, whether n has the shape, x broadcast to a shape, every axis's bit */
const FNode *fl_n(const FL *L, int f);
int fl_add(FL *L, const FNode *p);
FNode fl_proto(FOp op, DType dt, int rank, const int64_t *shape);
int fl_same_shape(const FNode *n, int rank, const int64_t *shape);
int fl_expand(FL *L, int x, int rank, const int64_t *shape);
uint32_t fl_all_axes(int rank);

/* fuse_gemm.c: x @ y as a GEMM (graph node gn; its fused node); x @ w + b with the bias epilogue,
 * an add of a product onto a GEMM's result with the add epilogue (each: the fused node, or -1 when
 * n is not of that form); sum_to node id's matmul as one GEMM with the bias-gradient epilogue;
 * LoRA's down and up products as one launch wherever the graph has them (after every node). */
int fl_matmul(FL *L, const GNode *gn, int x, int y);
int fl_gemm_bias(FL *L, const GNode *n);
int fl_gemm_add(FL *L, const GNode *n);
void fl_gemm_bgrad(FL *L, int id);
void fl_lora_chain(FL *L);

#endif
