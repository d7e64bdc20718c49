/* kir.h - the kernel IR: one generated kernel as a small loop nest of SSA scalar instructions.
 *
 * Pipeline position: graph -> autodiff -> plan -> fuse -> [kir] -> back ends (compiler/cpu:
 * LLVM IR functions; compiler/cuda: CUDA C for NVRTC). fuse.c builds every kernel through the
 * builder below; the back ends read a finished Kernel and nothing else (no graph), and kir_ref.c
 * interprets one in double precision for the tests.
 *
 * A Kernel is
 *   - buffer parameters (KBuf): element type, shape, read or written, and which buffer of the
 *     schedule (FuseResult.buffers) the launch binds to it;
 *   - an index space: `grid` independent work items, gid = 0 .. grid-1. The runtime splits them
 *     across threads (CPU) or blocks/threads (CUDA) in any order; work items never communicate,
 *     and no two write the same element (fuse guarantees it). A row kernel has one work item per
 *     row, an elementwise kernel one per element (see KKind);
 *   - a body run once per work item: a flat list of instructions, each defining at most one
 *     value (its index in the list is its SSA id, printed %N), with structured control flow:
 *     K_LOOP .. K_ENDLOOP (a counted loop; the K_LOOP's value is the counter) and K_IF ..
 *     K_ENDIF, properly nested. A value defined inside a loop or if is not visible after its end.
 *   - mutable scalars for reductions: K_ACC declares one (initial value, combine op add/max/min),
 *     K_ACCUM folds a value into it, and any use of the K_ACC's id reads its current value. A
 *     reduction is `%a = acc; loop { ...; accum %a, %v }` and %a after the loop is the result. A
 *     back end may split such a loop across the threads of a block and combine in a fixed tree:
 *     the result is deterministic, its rounding back-end defined.
 * Broadcasting, transposes, slices, concatenation and gathers are index arithmetic on i64
 * values feeding K_LOAD offsets (elements, row-major, from the buffer's start): buffers are
 * dense and contiguous. Types: every value has a KType; floats of f16/bf16 may be computed in
 * f32 by a back end; kir_ref computes every float in double. Integer K_IDIV/K_IMOD are index
 * arithmetic (both operands >= 0); K_MOD is NumPy's remainder (sign of the divisor) for floats
 * and integers; K_MAX/K_MIN propagate NaN. u64 values (K_XOR, K_SHR, wrapping K_ADD/K_MUL)
 * exist for dropout's counter-based Philox (fuse_codegen.c: products of 32-bit words).
 *
 * Printed by `mbtc --emit=kernels` (kir_print), checked by kir_verify. */
#ifndef MBT_KIR_H
#define MBT_KIR_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "graph.h"

/* ---- types and opcodes ---------------------------------------------------------------------- */

typedef enum KType { KT_VOID, KT_BOOL, KT_I32, KT_I64, KT_U64, KT_F16, KT_BF16, KT_F32, KT_F64, KT_COUNT } KType;

typedef enum KOp {
    K_NONE,
    /* ---- values without operands ---------------------------------------------------------- */
    K_CONST, /* .f (float types) or .i (integer and bool types)                              */
    K_GID,   /* the work item's index in [0, grid), i64                                      */
    /* ---- control (void): structured and properly nested ----------------------------------- */
    K_LOOP, /* value: the counter (i64) in [0, extent); extent .i, or a[0] (i64) if nin = 1 */
    K_ENDLOOP,
    K_IF, /* a[0] bool: the block up to the matching K_ENDIF runs when it is true         */
    K_ENDIF,
    /* ---- accumulators --------------------------------------------------------------------- */
    K_ACC,   /* a mutable scalar: initial value .f/.i, combine op .aop (K_ADD, K_MAX, K_MIN)  */
    K_ACCUM, /* void: a[0] (a K_ACC) = aop(a[0], a[1])                                        */
    /* ---- memory ----------------------------------------------------------------------------- */
    K_LOAD,  /* buffer .buf, a[0] = element offset (i64); the buffer's element type           */
    K_STORE, /* void: buffer .buf, a[0] = offset, a[1] = value                                */
    /* ---- binary, operands of the result type -------------------------------------------------- */
    K_ADD,
    K_SUB,
    K_MUL,
    K_DIV,
    K_MOD,
    K_POW,
    K_MAX,
    K_MIN,
    K_IDIV,
    K_IMOD, /* i64, operands >= 0 (index arithmetic)                                     */
    K_XOR,
    K_SHR, /* u64                                                                       */
    /* ---- unary, operand of the result type -------------------------------------------------- */
    K_NEG,
    K_ABS,
    K_EXP,
    K_LOG,
    K_SQRT,
    K_TANH,
    K_SIN,
    K_COS,
    K_FLOOR,
    /* ---- comparisons (bool result, operands of one type) and logic on bool ------------------- */
    K_EQ,
    K_NE,
    K_LT,
    K_LE,
    K_GT,
    K_GE,
    K_AND,
    K_OR,
    K_NOT,
    /* ---- the rest --------------------------------------------------------------------------- */
    K_SELECT, /* a[0] bool ? a[1] : a[2]                                                      */
    K_CAST,   /* a[0] converted to the result type: float -> int truncates, -> bool is != 0    */
    K_OP_COUNT
} KOp;

const char *kir_op_name(KOp op);    /* "add", "loop" ... */
const char *kir_type_name(KType t); /* "f32", "i64" ... */
KType kir_type_of(DType dt);        /* the value type of a graph dtype */
int kir_type_is_float(KType t);     /* f16, bf16, f32, f64 */

/* ---- kernels -------------------------------------------------------------------------------- */

/* What a kernel's work items are, for the back ends' launch shape (the body says everything). */
typedef enum KKind {
    KK_ELEMENTWISE, /* one work item per output element (or per element of each segment)       */
    KK_ROW,         /* one per row: loops over the trailing axes (norms, softmax, cross-entropy) */
    KK_REDUCE,      /* one per output element of a reduction over leading axes or everything     */
    KK_ATTENTION,   /* one per query row (forward, backward of q) or key row (backward of k, v)  */
    KK_TOPK,        /* one per row of the selected axis                                          */
    KK_SCATTER,     /* one per column of the scattered rows                                      */
    KK_COUNT
} KKind;

const char *kir_kind_name(KKind k); /* "elementwise", "row" ... */

typedef struct KInst {
    KOp op;
    KType type; /* of the value defined; KT_VOID for stores, accumulations and control */
    int nin;
    int a[3];  /* operand SSA ids */
    int buf;   /* K_LOAD / K_STORE: index into Kernel.bufs */
    KOp aop;   /* K_ACC: the combine op */
    double f;  /* K_CONST / K_ACC of a float type */
    int64_t i; /* K_CONST / K_ACC of an integer type; K_LOOP's static extent */
} KInst;

typedef struct KBuf {
    int buffer; /* the schedule's buffer (FuseResult.buffers index) bound to it */
    int node;   /* graph node whose value the buffer holds, -1 for an internal one */
    DType dt;
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    int written; /* 1 when the kernel stores to it (it may also load what it stored) */
    int key;     /* fuse's bookkeeping (the fused node the buffer holds) */
} KBuf;

/* ---- attention's layout, for a back end's hand-written attention kernel ---------------------- */

/* A strided view of a buffer parameter as [Z, heads, rows, cols] (Z: the leading batch axes
 * flattened): element (z, h, r, c) is bufs[param][offset + z*stride[0] + h*stride[1] +
 * r*stride[2] + c*stride[3]] (elements). param -1: absent. */
typedef struct KView {
    int param;
    int64_t offset;
    int64_t stride[4];
} KView;

typedef enum KAttnOp { KA_FORWARD, KA_BWD_Q, KA_BWD_K, KA_BWD_V, KA_BWD_KV } KAttnOp;

/* What a KK_ATTENTION kernel computes, in the terms of graph.h's G_ATTENTION and its backward
 * ops (ref.c and ref_bwd.c define them), with every operand and result a strided view: the
 * slices, reshapes and transposes fusion folded into the kernel's index arithmetic, resolved.
 * A back end may run a kernel of its own from this instead of the body (compiler/cuda.c does,
 * with runtime/kernels/rt_attention.cuh); the body computes the same. Set by fusion when every
 * view is strided, else NULL. */
typedef struct KAttn {
    KAttnOp op;
    DType dt;               /* of q, k, v, dout and the results */
    int64_t Z, H, Hk, T, S; /* batch, query heads, key/value heads (H a multiple), query rows, key rows */
    int64_t D, E;           /* the width of q and k, of v and the output */
    int causal;             /* key j is visible to query row i when j <= i + S - T */
    double scale;           /* of the scores: scale * (q . k) */
    KView q, k, v;
    KView dout; /* the output's gradient [Z, H, T, E]: the backward ops */
    int nout;
    KView out[4]; /* the result [Z, H, T, E] (forward), dq [Z, H, T, D], dk [Z, Hk, S, D]
                                 (KA_BWD_K, KA_BWD_KV) or dv [Z, Hk, S, E]; each place gets every element */
    int nout_v;
    KView out_v[4]; /* KA_BWD_KV: dv [Z, Hk, S, E], likewise */
    KView stats;    /* f32 per query row: the max m of the scaled scores and the sum l of exp(s - m)
                          in columns 0 and 1, which the forward stores ([Z, H, T, 2]; param -1 when
                          no backward reads them), and sum over keys of P dP in column 2, which the
                          backward ops load ([Z, H, T, 3], computed before them as rowsum(dout * o)) */
    KView pos;      /* the document mask (attention(..., pos = ...): causal, S = T), i32 [Z, T]: query row t
                  of batch z sees keys t - pos[z, t] .. t only (ref.c's ref_attn_first), element
                  (z, t) at offset + z*stride[0] + t*stride[2]; param -1: no mask. A back end that
                  cannot carry it out runs the body, which does */
} KAttn;

/* What a KK_SCATTER kernel computes when its operands are plain row-major buffers (graph.h's
 * G_SCATTER_ADD, ref_bwd.c's ref_scatter_add): out [R, W] = zeros, then for p = 0 .. P-1 in order,
 * row clamp(idx[p], 0, R - 1) += row p of upd [P, W] (converted to dt). A back end may run a kernel of its own from
 * this instead of the body (compiler/backend/cuda/cuda.c: the deterministic embedding backward,
 * docs/cuda.md), adding in the same order for every element; the body computes the same. Set by
 * fusion when every operand is contiguous and the kernel computes nothing else, else NULL. */
typedef struct KScatter {
    DType dt;                 /* of out (and of the rows added: upd's elements, widened from upd_dt) */
    DType upd_dt;             /* of upd's buffer: dt, or a narrower float type read and widened exactly */
    DType idx_dt;             /* of the indices (an integer type) */
    int64_t R, W, P;          /* rows of out, elements a row, positions (rows of upd) */
    int out, idx, upd;        /* buffer parameters */
    int64_t idx_off, upd_off; /* element offsets of the views into their buffers (out's is 0) */
} KScatter;

/* What a cross-entropy statistics kernel computes (fuse_internal.h's F_CE_STATS) when it reads
 * the logits as rows of a buffer: for each of `rows` rows of V logits (element j of row r at
 * in_off + r * stride + j, widened from in_dt to dt) and its target t_r (i32 at tgt[tgt_off + r],
 * clamped to [0, V)), out[3r] = the max m, out[3r + 1] = the sum s of exp(x - m), out[3r + 2] =
 * x[r, t_r]. stride >= V: a padded vocabulary's columns past V are not read. With grad >= 0 it is
 * the classifier kernel (F_CE_GRAD, its statistics a member): then also, for j < V,
 * grad[r * gW + j] = (exp(x - m) / s - (j == t_r)) * dloss / N in dt, stored as grad_dt, and 0 for
 * V <= j < gW (a padded vocabulary's columns); dloss / N is the constant scale. grad may be the
 * logits' own parameter (grad == in, gW == stride: written in place, each row read before it is
 * written). A back end may run a kernel of its own from this (compiler/backend/cuda/cuda.c: one
 * online pass, docs/cuda.md); the body computes the same in two passes (and the gradient with
 * two divisions an element, where the CUDA kernel multiplies by a reciprocal). Set by fusion when
 * the kernel computes nothing else and the scale is a constant. */
typedef struct KCeStats {
    DType dt, in_dt;
    int64_t rows, V, stride, in_off, tgt_off;
    int in, out, tgt; /* buffer parameters */
    int grad;         /* the gradient's buffer parameter, -1 for the statistics alone */
    int64_t gW;       /* the gradient's row width (>= V) */
    DType grad_dt;
    double dloss, N; /* the backward's seed (a constant) and the number of targets */
} KCeStats;

/* What a fused LoRA kernel computes (fuse_internal.h's F_LORA with its F_LORA_S: LoRA's down and up
 * products in one launch), every operand a buffer parameter read at element offset 0: for each
 * batch index t < batch and row i < m (work item t * m + i),
 *   S[q] = sum over p < k of x[t*stride_x + i*ldx + p] * opA[p, q]      (q < r; f32, in p's order)
 *   C[(t*m + i)*n + j] = D[(t*m + i)*n + j] + alpha * sum over q < r of S[q] * opB[q, j]
 * with opA[p, q] = a[t*stride_a + (trans_a ? q*lda + p : p*lda + q)] (the down weight [r, k] is
 * trans_a with lda = k) and opB[q, j] = b[t*stride_b + (trans_b ? j*ldb + q : q*ldb + j)]; S is
 * also stored at s[(t*m + i)*r + q] when s >= 0 (the backward reads it). The body computes exactly
 * this, a row a work item; the CPU back end's host code calls the runtime's tiled routine
 * (rt_lora_f32: OpenBLAS on cache-sized row tiles) instead, except where a row's bits must not
 * depend on the call (the KV cache's chunk phase). Set by fusion for every F_LORA kernel. */
typedef struct KLora {
    int64_t batch, m, k, r, n;
    int64_t ldx, stride_x, lda, stride_a, ldb, stride_b;
    int trans_a, trans_b;
    double alpha;
    int x, a, b, d, s, c; /* buffer parameters; s -1 when S is not stored */
} KLora;
/* What a paged-KV-cache attention kernel computes (compiler/fuse/fuse_kv.h says it in full: the
 * new tokens' keys and values written into the pool, each row's attention over its sequence's
 * cached prefix and the call's own rows). A back end may run a kernel of its own from this instead
 * of the body (compiler/backend/cuda: runtime/kernels/rt_kv_attention.cuh, a block per row and
 * key/value head, the keys split across its warps); the body computes the same. fuse_kv.c sets it
 * for every such kernel; meta and pool are the kernel's parameters of the metadata and the pool. */
typedef struct KKvAttn {
    int64_t N;          /* rows (new tokens) of a launch */
    int64_t H, Hk, D;   /* query heads, key/value heads (H a multiple of Hk), head width */
    int64_t block;      /* tokens per KV block */
    int64_t max_blocks; /* columns of the block table */
    int64_t layer, L;   /* this attention's layer, of L */
    DType dt;           /* of q, k, v and the output (f32; bf16/f16 computed in f32) */
    DType kv_dt;        /* of the pool: DT_F32, DT_BF16 or DT_F16 */
    double scale;       /* of the scores: scale * (q . k) */
    KView q, k, v;      /* [1, heads, N, D] (stride[0] unused) views of kernel parameters */
    KView out;          /* the result [1, H, N, D] */
    int64_t pool_off;   /* elements from the pool parameter's start to slot 0 */
    int meta, pool;     /* the parameters of the metadata (i32) and of the pool (kv_dt, written) */
} KKvAttn;

typedef struct Kernel {
    const char *name; /* "k3_add_layernorm": unique in a schedule, a C identifier */
    KKind kind;
    int64_t grid;  /* work items */
    int nsegments; /* > 1: independent parts chosen by ranges of gid (the optimizer update) */
    int nbufs;
    KBuf *bufs;
    int n, cap;
    KInst *inst;
    int nnodes;
    int *nodes;              /* the graph nodes it computes, ascending (for the listing and tests) */
    const KAttn *attn;       /* KK_ATTENTION: its layout when strided, else NULL */
    const KScatter *scatter; /* KK_SCATTER: its operands when contiguous, else NULL */
    const KCeStats *ce;      /* F_CE_STATS's kernel: its logits as rows of a buffer, else NULL */
    const KLora *lora;       /* fused LoRA's kernel (KK_ROW): its products, else NULL */
    const KKvAttn *kv;       /* the paged KV cache's attention (fuse_kv.h), else NULL */
    int64_t columns;         /* KK_REDUCE over leading axes with the innermost axis kept: its extent
                                (consecutive work items read consecutive elements of each row they
                                sum), else 0 */
    int ranged;              /* the optimizer update's kernel, run over work items [lo, hi) alone (ZeRO's
                                shard): the CUDA function takes lo and hi after its buffers
                                (host.c's host_schedules sets it; the CPU passes them its own way) */
} Kernel;

/* ---- building (used by fuse.c) ---------------------------------------------------------------- */

/* A builder appends instructions to one kernel. Pure instructions are hash-consed (the same op on
 * the same operands gives the same id, within the scopes still open) and integer arithmetic on
 * constants is folded, so index math stays small. kb_memo_* is a map with the same scoping for
 * the builder's client (fuse remembers which value a node has at an index). */
typedef struct KBuilder KBuilder;

KBuilder *kb_new(Arena *ar, Kernel *k);                                 /* a builder appending to k */
Arena *kb_arena(const KBuilder *b);                                     /* the arena it allocates from */
Kernel *kir_new(Arena *ar, const char *name, KKind kind, int64_t grid); /* an empty kernel */
int kb_buf(KBuilder *b, int key, int buffer, int node, DType dt, int rank, const int64_t *shape, int written);
/* the parameter for key (added once) */
int kb_const_f(KBuilder *b, KType t, double v);                           /* a float constant */
int kb_const_i(KBuilder *b, KType t, int64_t v);                          /* an integer or bool constant */
int kb_gid(KBuilder *b);                                                  /* the work item's index */
int kb_op(KBuilder *b, KOp op, KType t, int nin, int a0, int a1, int a2); /* a pure instruction */
int kb_load(KBuilder *b, int buf, int off);                               /* buffer element */
void kb_store(KBuilder *b, int buf, int off, int v);                      /* buffer element = v */
int kb_loop(KBuilder *b, int64_t extent);                                 /* opens a loop; returns the counter */
int kb_loop_dyn(KBuilder *b, int extent);                                 /* the same, extent an i64 value */
void kb_endloop(KBuilder *b);                                             /* closes the innermost loop */
void kb_if(KBuilder *b, int cond);                                        /* opens an if block */
void kb_endif(KBuilder *b);                                               /* closes the innermost if */
int kb_acc(KBuilder *b, KType t, KOp aop, double init);                   /* declares an accumulator */
void kb_accum(KBuilder *b, int acc, int v);                               /* acc = aop(acc, v) */
int kb_depth(const KBuilder *b);                                          /* open loops and ifs */
int kb_memo_get(KBuilder *b, int64_t k1, int64_t k2);                     /* -1 when absent or out of scope */
void kb_memo_put(KBuilder *b, int64_t k1, int64_t k2, int v);             /* valid until its scope closes */
KType kb_type(const KBuilder *b, int v);                                  /* the type of value v */
int kb_is_const(const KBuilder *b, int v, int64_t *iv);                   /* 1 when v is an integer constant */

/* Removes instructions whose values nothing uses (and loops and ifs left empty), renumbering the
 * rest. Called once the body is complete. */
void kir_finish(Kernel *k);

/* Whether the body loads buffer parameter p (a written one that is also loaded is read and written:
 * the classifier's gradient over its logits, an update's results over their old values). */
int kir_loads(const Kernel *k, int p);

/* ---- checking and printing -------------------------------------------------------------------- */

/* Checks that operands are defined before use and in scope, nesting is balanced, types agree
 * with each op's rule, buffers exist, loads and stores use i64 offsets, and no store goes to a
 * buffer not marked written. Returns the number of problems, each printed to out (may be NULL)
 * as `kir: NAME: %N: ...`. A failure is a compiler bug. */
int kir_verify(const Kernel *k, FILE *out);

/* The body, one instruction a line, indented by loop and if depth; constants are printed
 * inline as operands. `indent` spaces before every line. */
void kir_print_body(FILE *out, const Kernel *k, int indent);

/* Kernel.attn, a few lines each starting with `prefix`: the op and sizes, then each view as
 * `q  p0 + 128  strides [z, h, r, c]`. */
void kir_print_attn(FILE *out, const KAttn *a, const char *prefix);

/* Kernel.ce, one line starting with `prefix`: the sizes and the operands. */
void kir_print_ce(FILE *out, const KCeStats *s, const char *prefix);

/* Kernel.lora, a line or two starting with `prefix`: the products and their operands. */
void kir_print_lora(FILE *out, const KLora *l, const char *prefix);

/* Kernel.scatter, one line starting with `prefix`: the sizes and the operands. */
void kir_print_scatter(FILE *out, const KScatter *s, const char *prefix);

#endif
