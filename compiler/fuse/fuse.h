/* fuse.h - fusion: a graph lowered to the fused IR, then partitioned into launches (library GEMMs
 * and generated kernels) with the buffers the launches read and write.
 *
 * Pipeline position: graph -> autodiff -> [fuse: fused IR -> launches] -> kernel IR
 * (kir.h) -> back ends. Two stages: fuse_lower_graph makes the fused IR (FusedGraph: primitive,
 * hash-consed nodes, `mbtc --emit=fused`), fuse_codegen partitions it into launches and writes
 * their kernels (FuseResult, `mbtc --emit=kernels`); fuse_graph is the two in one.
 * The result is self-contained: the back ends lower each Kernel without the graph, the memory
 * planner takes every buffer's size and first/last launch, and the host code calls the launches
 * in order. The rules (which ops fuse, what is materialised) are in fuse_partition.c's first
 * comment and docs/architecture.md. */
#ifndef MBT_FUSE_H
#define MBT_FUSE_H

#include <stdint.h>
#include <stdio.h>

#include "graph.h"
#include "kir.h"

/* A GEMM as a library call, row-major: for each batch index t < batch,
 *   C_t[m, n] = alpha * sum_k opA_t[m, k] * opB_t[k, n] + beta * C_t[m, n] (+ bias[n], FE_BIAS)
 *                                                                          (+ D_t[m, n], FE_ADD)
 * and with FE_BGRAD_B (batch 1) also bias[n] = sum_k opB[k, n].
 * where opA_t[m, k] is A[t*stride_a + m*lda + k] (trans_a = 0) or A[t*stride_a + k*lda + m]
 * (trans_a = 1), opB likewise with ldb, and C_t[m, n] is C[t*stride_c + m*ldc + n]. A stride of
 * 0 reuses one matrix for every batch index (broadcasting). Elements, not bytes. (cuBLAS is
 * column-major: a back end computes C^T = opB^T opA^T, swapping the operands.) */
typedef enum FuseEpilogue {
    FE_NONE,
    FE_BIAS,    /* C_t[m, n] += bias[n]: `x @ w + b` as one GEMM (the library's epilogue) */
    FE_BGRAD_B, /* bias[n] = sum_k opB[k, n], written: a linear layer's bias gradient, summed
                                from the output gradient that its weight gradient's GEMM reads as B */
    FE_ADD,     /* C_t[m, n] += D_t[m, n] (D laid out as C, a contiguous f32 C): LoRA's scaled up product
                                added to the base layer's (fuse_gemm.c's fl_gemm_add; the library starts C as D,
                                beta 1) */
} FuseEpilogue;

typedef struct FuseGemm {
    int a, b, c; /* buffers (FuseResult.buffers indices) */
    FuseEpilogue epilogue;
    int bias; /* the epilogue's buffer: FE_BIAS's bias (read), FE_BGRAD_B's sums (written), FE_ADD's D
                 (read, C's shape); else -1 */
    int trans_a, trans_b;
    int64_t m, n, k, batch;
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
    double alpha, beta;
    DType dt;
} FuseGemm;

typedef enum FuseBufKind {
    FB_PARAM,  /* a parameter: given to the step */
    FB_INPUT,  /* data fed each step */
    FB_OUTPUT, /* asked for (the loss, a gradient): live after the last launch */
    FB_TEMP,   /* an activation or an internal value between two launches */
} FuseBufKind;

typedef struct FuseBuffer {
    int node;         /* the graph node whose value it holds; -1 for an internal one */
    const char *what; /* "%21 layernorm", "param wte", "row max of %48" */
    DType dt;
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    int64_t bytes; /* elements * dtype size */
    FuseBufKind kind;
    int first, last; /* launches: the first that touches it (writes it, or reads a leaf), the last
                        that does (an output's last is nlaunches - 1); -1, -1 when none does */
    int over;        /* the launch that writes another node's value over node's (the classifier
                        kernel's gradient over its logits, fuse.c's fz_ce_inplace; an update's new
                        parameters or state over the old, fz_update_in_place): node's value is
                        there until that launch; -1 for none */
} FuseBuffer;

typedef enum FuseLaunchKind { FL_GEMM, FL_KERNEL } FuseLaunchKind;

typedef struct FuseLaunch {
    FuseLaunchKind kind;
    int kernel;    /* FL_KERNEL: index into kernels */
    FuseGemm gemm; /* FL_GEMM */
    int nnodes;
    int *nodes; /* FL_GEMM: the graph nodes it computes (a matmul, the sum_to or bias add it absorbed, a
                        bias gradient) */
} FuseLaunch;

typedef struct FuseResult {
    const Graph *g;
    int nlaunches;
    FuseLaunch *launches; /* in order */
    int nbuffers;
    FuseBuffer *buffers; /* leaves first (graph order), then the rest by first use */
    int nkernels;
    Kernel **kernels; /* in launch order */
    int ngemms;
    int *node_buffer; /* [g->n]: the buffer holding a node's value, -1 when none does */
    int noutputs;
    int *outputs; /* the graph nodes asked for */
    /* An update graph's new parameters and state written over their inputs (fuse.c's
     * fz_update_in_place; docs/memory.md, "The update in place"): n_in_place of its results have no
     * buffer of their own, their node_buffer is the input's (whose FuseBuffer.over is the launch);
     * not_in_place names the first of the others and says why it is copied into its region instead
     * ("state.a: ..."; NULL: none) */
    int n_in_place;
    const char *not_in_place;
} FuseResult;

/* The fused IR: the graph nodes the outputs need, rewritten into primitive nodes - leaves,
 * constants, views, pointwise maps, reductions, GEMMs with their operands' transposes and
 * epilogues resolved, dedicated ops (attention, topk, ...) - a value computed alike twice being
 * one node. Its nodes are in fuse_internal.h; fused_print shows them. */
typedef struct FusedGraph FusedGraph;

/* Lowers the nodes of g that the outputs need into the fused IR. outputs: graph node ids whose
 * values must exist after the step (NULL: fuse_default_outputs). Everything lives in ar. */
FusedGraph *fuse_lower_graph(const Graph *g, const int *outputs, int noutputs, Arena *ar);

/* For parallel { zero = 3 } (docs/parallel.md, "ZeRO-3 and a bf16 program's casts"): fuse_codegen
 * of fg keeps each kernel that loads nothing but parameters (a bf16 program's weight casts) a
 * launch of its own, never one kernel with another such (rule 7), and schedules it just before
 * the first launch that reads it, so that ZeRO-3's gathers see each parameter read where its
 * copy is used rather than all at the step's first launch. The same arithmetic, other launches. */
void fuse_casts_apart(FusedGraph *fg, int on);

/* Checks the fused IR: inputs defined before use, each node's shape and type against its op and
 * operands, every GEMM's operands large enough, every lowered graph node's value of its size and
 * type, every output lowered. Returns the number of problems, each printed to out (may be NULL)
 * as `fused: fN (op, for %G op): ...`. */
int fused_verify(const FusedGraph *fg, FILE *out);

/* `mbtc --emit=fused`: a summary line, then one line a node in the style of graph_print
 * (`f12 = map mul f7, f11 : f32[4, 16]   # %21 layernorm  tiny.mbt:12:5`), nodes no output
 * needs marked `(unused)`, then each matmul folded into a GEMM and the node holding each output. */
void fused_print(FILE *out, const FusedGraph *fg);

/* Partitions the fused IR's nodes that its outputs need into launches, gives them buffers and
 * generates every kernel. The result lives in ar and does not refer to fg. */
FuseResult *fuse_codegen(const FusedGraph *fg, Arena *ar);

/* fuse_codegen(fuse_lower_graph(...)), the fused IR freed. An internal inconsistency is an
 * internal error (a compiler bug). */
FuseResult *fuse_graph(const Graph *g, const int *outputs, int noutputs, Arena *ar);

/* An update graph's new parameters and state; else the loss and every gradient when the graph has
 * them; else every node no other node uses. */
int fuse_default_outputs(const Graph *g, int **outputs, Arena *ar);

/* `mbtc --emit=kernels`: a summary line, the launches in order, the buffers with their lives,
 * then every GEMM's parameters and every kernel (its ops with their source lines, its buffer
 * parameters, its body). */
void fuse_print(FILE *out, const FuseResult *r);

/* Checks every kernel (kir_verify), every launch's buffers and every buffer's life. Returns the
 * number of problems, printed to out (may be NULL). */
int fuse_verify(const FuseResult *r, FILE *out);

/* LoRA's down and up products as one launch (fuse_gemm.c's fl_lora_chain) when 1, the default; 0
 * keeps them two GEMMs: `mbtc --no-lora-fusion`, the unfused arm of a benchmark and the tests'
 * control. Read by every fuse_lower_graph. */
extern int fuse_lora_chain;

/* Cross-entropy's backward as the classifier kernel (fuse_lower.c's fl_ce_grad: the statistics, the
 * gradient and a padded vocabulary's zero columns in one launch a row block, written over the
 * logits where nothing reads them later) when 1, the default; 0 keeps the elementwise gradient
 * kernel with a buffer of its own: `mbtc --no-ce-fusion`, the tests' control (the same step on
 * the CPU, bit for bit). Read by every fuse_lower_graph. */
extern int fuse_ce_fused;

/* Launches of each kind: GEMMs and generated kernels. */
void fuse_counts(const FuseResult *r, int *gemms, int *kernels);
/* The graph ops kernel k fuses, one a line as --emit=kernels lists them (`%7 mul   tiny.mbt:13:9`),
 * for the listings above each kernel in --emit=llvm and --emit=program. */
const char *fuse_kernel_ops_note(const Graph *g, const Kernel *k, Arena *ar);

#endif
