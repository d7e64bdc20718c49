/* fuse_lower.c - the first step of fusion: the graph IR rewritten into primitive, hash-consed
 * nodes (FNode, see fuse_internal.h) that the partition (fuse_partition.c) groups into kernels.
 *
 * Pipeline position: graph -> autodiff -> fuse: [fuse_lower: the fused IR] -> partition ->
 * fuse_codegen -> kernel IR. Every composite op becomes maps and reductions in the order of
 * operations of the reference evaluator (ref.c, ref_bwd.c), so that a fused kernel computes the
 * same numbers up to the order of its sums: softmax is max, exp(x - max), sum, divide;
 * layernorm is sum, mean, (x - mean)^2, sum, rstd, scale; cross-entropy is the row max and
 * row sum of the logits, the log-probability of the target per row, and their mean. Values the
 * forward and backward both compute (layernorm's mean and rstd, cross-entropy's row max and
 * sum) come out as the same node, so the fused backward reads them instead of recomputing.
 *
 * GEMMs are resolved by fuse_gemm.c, which this file calls for every matmul, every `x @ w + b`
 * and add of a product, and every sum_to (fuse_lower.h). */
#include "fuse_lower.h"

#include <math.h>
#include <string.h>

static const char *const fuse_fop_names[F_OP_COUNT] = {
    [F_LEAF] = "leaf",
    [F_CONST] = "const",
    [F_IOTA] = "iota",
    [F_RESHAPE] = "reshape",
    [F_PERMUTE] = "permute",
    [F_EXPAND] = "expand",
    [F_SLICE] = "slice",
    [F_CONCAT] = "concat",
    [F_GATHER] = "gather",
    [F_TAKE] = "take",
    [F_MAP] = "map",
    [F_DROPOUT] = "dropout",
    [F_ROPE] = "rope",
    [F_REDUCE] = "reduce",
    [F_GEMM] = "gemm",
    [F_GEMM_BGRAD] = "gemm_bgrad",
    [F_ATTN] = "attention",
    [F_ATTN_LSE] = "attention_lse",
    [F_ATTN_STATS] = "attention_stats",
    [F_ATTN_BWD_Q] = "attention_bwd_q",
    [F_ATTN_BWD_K] = "attention_bwd_k",
    [F_ATTN_BWD_V] = "attention_bwd_v",
    [F_KV_ATTN] = "kv_attention",
    [F_TOPK] = "topk",
    [F_SCATTER_ADD] = "scatter_add",
    [F_SEG_NORM] = "seg_norm",
    [F_CE_STATS] = "ce_stats",
    [F_CE_GRAD] = "ce_grad",
    [F_LORA_S] = "lora_down",
    [F_LORA] = "lora",
};

int fuse_lora_chain = 1;
int fuse_ce_fused = 1;

const char *fuse_fop_name(FOp op) { return op >= 0 && op < F_OP_COUNT ? fuse_fop_names[op] : "?"; }

int64_t fuse_numel(const FNode *n) {
    int64_t k = 1;
    for (int i = 0; i < n->rank; i++) k *= n->shape[i];
    return k;
}

const FNode *fl_n(const FL *L, int f) {
    if (f < 0 || f >= L->fg->n) INTERNAL("fuse: lowering %%%d: no fused node %d", L->gid, f);
    return L->fg->node[f];
}

/* ---- hash-consed nodes
 * -------------------------------------------------------------------------- */

static uint64_t fl_mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ull;
}

static uint64_t fl_hash(const FNode *p) {
    uint64_t h = fl_mix(fl_mix(fl_mix((uint64_t)p->op, (uint64_t)p->kop), (uint64_t)p->dt), (uint64_t)p->rank);
    for (int i = 0; i < p->rank; i++) h = fl_mix(h, (uint64_t)p->shape[i]);
    h = fl_mix(h, (uint64_t)p->nin);
    for (int i = 0; i < p->nin; i++) h = fl_mix(h, (uint64_t)p->in[i]);
    for (int i = 0; i < 4; i++) h = fl_mix(h, (uint64_t)p->ia[i]);
    for (int i = 0; i < 2; i++) {
        uint64_t b;
        memcpy(&b, &p->fa[i], sizeof b);
        h = fl_mix(h, b);
    }
    if (p->op == F_GEMM) {
        const FuseGemm *m = &p->gemm;
        int64_t w[] = {m->trans_a, m->trans_b, m->m,        m->n,        m->k,        m->batch,   m->lda,
                       m->ldb,     m->ldc,     m->stride_a, m->stride_b, m->stride_c, m->epilogue};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++) h = fl_mix(h, (uint64_t)w[i]);
    }
    return h ^ (h >> 29);
}

static int fl_same(const FNode *a, const FNode *b) {
    if (a->op != b->op || a->kop != b->kop || a->dt != b->dt || a->rank != b->rank || a->nin != b->nin) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i]) return 0;
    for (int i = 0; i < 4; i++)
        if (a->ia[i] != b->ia[i]) return 0;
    if (memcmp(a->fa, b->fa, sizeof a->fa) != 0) return 0;
    if (a->op == F_GEMM) {
        const FuseGemm *x = &a->gemm, *y = &b->gemm;
        if (x->trans_a != y->trans_a || x->trans_b != y->trans_b || x->m != y->m || x->n != y->n || x->k != y->k ||
            x->batch != y->batch || x->lda != y->lda || x->ldb != y->ldb || x->ldc != y->ldc || x->stride_a != y->stride_a ||
            x->stride_b != y->stride_b || x->stride_c != y->stride_c || x->epilogue != y->epilogue)
            return 0;
    }
    return 1;
}

static void fl_rehash(FusedGraph *fg) {
    int cap = fg->hcap ? fg->hcap * 2 : 1024;
    int *h = arena_alloc(fg->ar, sizeof(int) * (size_t)cap);
    for (int i = 0; i < cap; i++) h[i] = -1;
    for (int id = 0; id < fg->n; id++) {
        if (fg->node[id]->op == F_LEAF) continue;
        uint64_t s = fl_hash(fg->node[id]) & (uint64_t)(cap - 1);
        while (h[s] >= 0) s = (s + 1) & (uint64_t)(cap - 1);
        h[s] = id;
    }
    fg->hash = h;
    fg->hcap = cap;
}

/* The node equal to p (leaves are never shared), appended when new. */
int fl_add(FL *L, const FNode *p) {
    FusedGraph *fg = L->fg;
    for (int i = 0; i < p->nin; i++)
        if (p->in[i] < 0 || p->in[i] >= fg->n) INTERNAL("fuse: lowering %%%d: input %d is %d", L->gid, i, p->in[i]);
    if ((fg->n + 1) * 2 > fg->hcap) fl_rehash(fg);
    uint64_t s = 0;
    if (p->op != F_LEAF) {
        s = fl_hash(p) & (uint64_t)(fg->hcap - 1);
        while (fg->hash[s] >= 0) {
            if (fl_same(fg->node[fg->hash[s]], p)) return fg->hash[s];
            s = (s + 1) & (uint64_t)(fg->hcap - 1);
        }
    }
    if (fg->n == fg->cap) {
        int cap = fg->cap ? fg->cap * 2 : 256;
        FNode **nv = arena_alloc(fg->ar, sizeof(FNode *) * (size_t)cap);
        if (fg->n) memcpy(nv, fg->node, sizeof(FNode *) * (size_t)fg->n);
        fg->node = nv;
        fg->cap = cap;
    }
    FNode *n = arena_alloc(fg->ar, sizeof(FNode));
    *n = *p;
    n->id = fg->n;
    n->gid = L->gid;
    fg->node[fg->n++] = n;
    if (p->op != F_LEAF) fg->hash[s] = n->id;
    return n->id;
}

FNode fl_proto(FOp op, DType dt, int rank, const int64_t *shape) {
    FNode p;
    memset(&p, 0, sizeof p);
    p.op = op;
    p.dt = dt;
    p.rank = rank;
    for (int i = 0; i < rank; i++) p.shape[i] = shape[i];
    return p;
}

/* ---- constructors
 * ------------------------------------------------------------------------------- */

static int fl_const_shaped(FL *L, double v, DType dt, int rank, const int64_t *shape) {
    FNode p = fl_proto(F_CONST, dt, rank, shape);
    p.fa[0] = v;
    return fl_add(L, &p);
}

static int fl_c(FL *L, double v, DType dt) { return fl_const_shaped(L, v, dt, 0, NULL); }

static int fl_is_compare(KOp op) { return op >= K_EQ && op <= K_GE; }

/* NumPy broadcasting of the inputs' shapes (valid: they come from a verified graph). */
static int fl_bcast(const FL *L, int nin, const int *in, int64_t *shape) {
    int rank = 0;
    for (int i = 0; i < nin; i++)
        if (fl_n(L, in[i])->rank > rank) rank = fl_n(L, in[i])->rank;
    for (int d = 0; d < rank; d++) shape[d] = 1;
    for (int i = 0; i < nin; i++) {
        const FNode *x = fl_n(L, in[i]);
        for (int d = 0; d < x->rank; d++) {
            int64_t s = x->shape[d], *o = &shape[rank - x->rank + d];
            if (s != 1) {
                if (*o != 1 && *o != s) INTERNAL("fuse: lowering %%%d: shapes do not broadcast", L->gid);
                *o = s;
            }
        }
    }
    return rank;
}

static int fl_map(FL *L, KOp kop, DType dt, int nin, int a, int b, int c) {
    int in[3] = {a, b, c};
    int64_t shape[GRAPH_MAX_RANK] = {0};
    int rank = fl_bcast(L, nin, in, shape);
    FNode p = fl_proto(F_MAP, dt, rank, shape);
    p.kop = kop;
    p.nin = nin;
    for (int i = 0; i < nin; i++) p.in[i] = in[i];
    return fl_add(L, &p);
}

static int fl_un(FL *L, KOp kop, int x) { return fl_map(L, kop, fl_n(L, x)->dt, 1, x, -1, -1); }

static int fl_bin(FL *L, KOp kop, int a, int b) {
    return fl_map(L, kop, fl_is_compare(kop) ? DT_BOOL : fl_n(L, a)->dt, 2, a, b, -1);
}

static int fl_sel(FL *L, int c, int a, int b) { return fl_map(L, K_SELECT, fl_n(L, a)->dt, 3, c, a, b); }

static int fl_cast(FL *L, int x, DType dt) {
    if (fl_n(L, x)->dt == dt) return x;
    return fl_map(L, K_CAST, dt, 1, x, -1, -1);
}

static int fl_add2(FL *L, int a, int b) { return fl_bin(L, K_ADD, a, b); }
static int fl_sub2(FL *L, int a, int b) { return fl_bin(L, K_SUB, a, b); }
static int fl_mul2(FL *L, int a, int b) { return fl_bin(L, K_MUL, a, b); }
static int fl_div2(FL *L, int a, int b) { return fl_bin(L, K_DIV, a, b); }

static int fl_reshape(FL *L, int x, int rank, const int64_t *shape);

/* One F_REDUCE node: x [rank, shape of x] reduced with kop over the axes in mask, to shape. */
static int fl_reduce1(FL *L, KOp kop, int x, uint32_t mask, int rank, const int64_t *shape) {
    FNode p = fl_proto(F_REDUCE, fl_n(L, x)->dt, rank, shape);
    p.kop = kop;
    p.nin = 1;
    p.in[0] = x;
    p.ia[0] = mask;
    return fl_add(L, &p);
}

/* x reduced with kop over the axes in mask (kept as size 1). Axes of size 1 need no reduction:
 * a mask left empty returns x.
 *
 * A sum over the leading axes of at least FL_SPLIT_ROWS rows (a bias or LayerNorm weight gradient
 * over every token of the batch: M rows of N) is made in two levels: the rows viewed as [S, R, N]
 * with R the largest divisor of M in [32, FL_SPLIT_SLICE] for which the S x N partial sums number
 * FL_SPLIT_ITEMS or more (else the smallest divisor there, the most partials), R rows summed into
 * each of S partial rows
 * (kept in a buffer), then the S partials summed. Each level is a reduction kernel of its own with
 * many more work items than N alone (S x N, then N), so it fills a GPU, and the order of additions
 * is fixed by M alone: deterministic, whatever the device or its thread count. The first level fuses
 * what produces the rows, the second what consumes the sum (the cast, the accumulation). Fewer rows
 * (every CPU-size example) or an M with no such divisor keep the one reduction. The sum's order of
 * additions is not the CPU reference's (ref.c adds the rows in order): the verify layer's
 * tolerances hold it. Why FL_SPLIT_ITEMS: on the H100 (docs/cuda.md, "Two-level sums") GPT-2's
 * LayerNorm weight gradients (M = 12,288 rows of N = 768) as 96 partials of 128 rows were 73,728
 * threads a loop of 128 dependent-latency loads each: 65.5 us a launch for 38 MB, a fifth of the copy
 * rate; 384 partials of 32 rows give 294,912 threads a quarter of the loop. */
#define FL_SPLIT_ROWS 4096
#define FL_SPLIT_SLICE 128
#define FL_SPLIT_ITEMS 262144 /* first-level work items wanted: about two H100s' worth of threads (132 SMs x 2048) */

static int fl_reduce(FL *L, KOp kop, int x, uint32_t mask) {
    const FNode *n = fl_n(L, x);
    int rank = n->rank;
    int64_t shape[GRAPH_MAX_RANK] = {0}, in_shape[GRAPH_MAX_RANK] = {0};
    for (int d = 0; d < rank; d++) {
        in_shape[d] = n->shape[d];
        if (n->shape[d] == 1) mask &= ~(1u << d);
        shape[d] = mask & (1u << d) ? 1 : n->shape[d];
    }
    mask &= (rank >= 32 ? ~0u : (1u << rank) - 1);
    if (!mask) return x;
    int64_t M = 1, N = 1;
    int leading = 1; /* no reduced axis after a kept one longer than 1: the rows are [M, N] row-major */
    for (int d = 0, kept_seen = 0; d < rank; d++) {
        if (mask & (1u << d)) {
            M *= in_shape[d];
            if (kept_seen) leading = 0;
        } else {
            N *= in_shape[d];
            kept_seen |= in_shape[d] != 1;
        }
    }
    DType dt = fl_n(L, x)->dt;
    if (kop == K_ADD && dtype_is_float(dt) && leading && N > 1 && M >= FL_SPLIT_ROWS) {
        int64_t R = 0; /* the largest divisor that gives FL_SPLIT_ITEMS partial sums, else the smallest */
        for (int64_t r = FL_SPLIT_SLICE; r >= 32; r--)
            if (M % r == 0) {
                R = r;
                if ((M / r) * N >= FL_SPLIT_ITEMS) break;
            }
        if (R) {
            /* f16 and bf16 rows are summed in f32 (their partials would otherwise be rounded to
             * 8 or 11 bits in the buffer), the total rounded once to the sum's type */
            int wide = dt == DT_F32 || dt == DT_F64;
            int64_t s3[3] = {M / R, R, N}, p3[3] = {M / R, 1, N}, t3[3] = {1, 1, N};
            int part = fl_reduce1(L, kop, fl_reshape(L, wide ? x : fl_cast(L, x, DT_F32), 3, s3), 2u, 3, p3);
            L->fg->node[part]->keep = 1; /* a buffer of partials: the second level reads S x N values */
            int total = fl_reduce1(L, kop, part, 1u, 3, t3);
            return fl_reshape(L, wide ? total : fl_cast(L, total, dt), rank, shape);
        }
    }
    return fl_reduce1(L, kop, x, mask, rank, shape);
}

int fl_same_shape(const FNode *n, int rank, const int64_t *shape) {
    if (n->rank != rank) return 0;
    for (int i = 0; i < rank; i++)
        if (n->shape[i] != shape[i]) return 0;
    return 1;
}

static int fl_reshape(FL *L, int x, int rank, const int64_t *shape) {
    const FNode *n = fl_n(L, x);
    while (n->op == F_RESHAPE) n = fl_n(L, n->in[0]); /* a reshape of a reshape is one reshape */
    if (fl_same_shape(n, rank, shape)) return n->id;
    FNode p = fl_proto(F_RESHAPE, n->dt, rank, shape);
    p.nin = 1;
    p.in[0] = n->id;
    return fl_add(L, &p);
}

static int fl_permute(FL *L, int x, int a, int b) {
    const FNode *n = fl_n(L, x);
    if (a == b) return x;
    if (a > b) {
        int t = a;
        a = b;
        b = t;
    }
    if (n->op == F_PERMUTE && n->ia[0] == a && n->ia[1] == b) return n->in[0]; /* swapped back */
    int64_t shape[GRAPH_MAX_RANK] = {0};
    memcpy(shape, n->shape, sizeof shape);
    shape[a] = n->shape[b];
    shape[b] = n->shape[a];
    FNode p = fl_proto(F_PERMUTE, n->dt, n->rank, shape);
    p.nin = 1;
    p.in[0] = x;
    p.ia[0] = a;
    p.ia[1] = b;
    return fl_add(L, &p);
}

int fl_expand(FL *L, int x, int rank, const int64_t *shape) {
    const FNode *n = fl_n(L, x);
    if (fl_same_shape(n, rank, shape)) return x;
    FNode p = fl_proto(F_EXPAND, n->dt, rank, shape);
    p.nin = 1;
    p.in[0] = x;
    return fl_add(L, &p);
}

static int fl_iota(FL *L, DType dt, int rank, const int64_t *shape, int axis) {
    FNode p = fl_proto(F_IOTA, dt, rank, shape);
    p.ia[0] = axis;
    return fl_add(L, &p);
}

/* A node of op with the given shape, inputs and attributes. */
static int fl_op(FL *L, FOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in) {
    FNode p = fl_proto(op, dt, rank, shape);
    p.nin = nin;
    for (int i = 0; i < nin; i++) p.in[i] = in[i];
    const GNode *gn = graph_node(L->g, L->gid);
    memcpy(p.ia, gn->iattr, sizeof p.ia);
    memcpy(p.fa, gn->fattr, sizeof p.fa);
    return fl_add(L, &p);
}

uint32_t fl_all_axes(int rank) { return rank >= 32 ? ~0u : (1u << rank) - 1; }

/* x's shape with the last axis removed (rank - 1), then reshaped to keep it as 1 and so on. */
static int fl_keep_last1(FL *L, int x) {
    const FNode *n = fl_n(L, x);
    int64_t shape[GRAPH_MAX_RANK] = {0};
    memcpy(shape, n->shape, sizeof shape);
    shape[n->rank] = 1;
    return fl_reshape(L, x, n->rank + 1, shape);
}

/* ---- composite ops
 * ------------------------------------------------------------------------------ */

/* ref.c's sigmoid: both branches evaluated, the stable one selected. */
static int fl_sigmoid(FL *L, int x) {
    DType dt = fl_n(L, x)->dt;
    int one = fl_c(L, 1.0, dt);
    int pos = fl_div2(L, one, fl_add2(L, one, fl_un(L, K_EXP, fl_un(L, K_NEG, x))));
    int e = fl_un(L, K_EXP, x);
    int neg = fl_div2(L, e, fl_add2(L, one, e));
    return fl_sel(L, fl_bin(L, K_GE, x, fl_c(L, 0.0, dt)), pos, neg);
}

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), associated as ref.c writes it. */
static int fl_gelu(FL *L, int x) {
    DType dt = fl_n(L, x)->dt;
    int cube = fl_mul2(L, fl_mul2(L, fl_mul2(L, fl_c(L, 0.044715, dt), x), x), x);
    int t = fl_un(L, K_TANH, fl_mul2(L, fl_c(L, sqrt(2.0 / 3.14159265358979323846), dt), fl_add2(L, x, cube)));
    return fl_mul2(L, fl_mul2(L, fl_c(L, 0.5, dt), x), fl_add2(L, fl_c(L, 1.0, dt), t));
}

/* A layernorm's row statistics over the last axis: mean and 1/sqrt(var + eps), two passes. */
static void fl_ln_stats(FL *L, int x, double eps, int *mean, int *rstd, int *centred) {
    const FNode *n = fl_n(L, x);
    DType dt = n->dt;
    uint32_t last = 1u << (n->rank - 1);
    int c = fl_c(L, (double)n->shape[n->rank - 1], dt);
    *mean = fl_div2(L, fl_reduce(L, K_ADD, x, last), c);
    *centred = fl_sub2(L, x, *mean);
    int var = fl_div2(L, fl_reduce(L, K_ADD, fl_mul2(L, *centred, *centred), last), c);
    *rstd = fl_div2(L, fl_c(L, 1.0, dt), fl_un(L, K_SQRT, fl_add2(L, var, fl_c(L, eps, dt))));
}

/* An rmsnorm's 1/sqrt(mean(x^2) + eps) over the last axis. */
static int fl_rms_stats(FL *L, int x, double eps) {
    const FNode *n = fl_n(L, x);
    DType dt = n->dt;
    int c = fl_c(L, (double)n->shape[n->rank - 1], dt);
    int ms = fl_div2(L, fl_reduce(L, K_ADD, fl_mul2(L, x, x), 1u << (n->rank - 1)), c);
    return fl_div2(L, fl_c(L, 1.0, dt), fl_un(L, K_SQRT, fl_add2(L, ms, fl_c(L, eps, dt))));
}

/* Cross-entropy's row statistics of logits x [..., V] and targets t [...]: the max m, the sum s of
 * exp(x - m) and the target's logit xt, each [..., 1] in x's type, and e = exp(x - m). One
 * dedicated node computes them (F_CE_STATS [..., 3], in f32 at least: a bf16 program's logits are
 * summed in f32 and m, s rounded to its type once; xt is a logit, exact in f32), so that a GPU reads
 * the logits once for them (an online max and sum, docs/cuda.md), the loss's mean reads N x 3
 * values, and the classifier kernel (F_CE_GRAD) can write the gradient over the logits; the CPU's
 * kernel adds as the two reductions did. */
static int fl_ce_stats(FL *L, int x, int t, int *m, int *s, int *xt, int *e) {
    const FNode *n = fl_n(L, x);
    int rank = n->rank;
    DType dt = n->dt, sdt = dt == DT_F64 ? DT_F64 : DT_F32;
    int64_t shape[GRAPH_MAX_RANK] = {0}, one[GRAPH_MAX_RANK] = {0};
    for (int d = 0; d < rank; d++) shape[d] = one[d] = n->shape[d];
    shape[rank - 1] = 3;
    one[rank - 1] = 1;
    FNode sp = fl_proto(F_CE_STATS, sdt, rank, shape);
    sp.nin = 2;
    sp.in[0] = x;
    sp.in[1] = t;
    int st = fl_add(L, &sp);
    for (int k = 0; k < 3; k++) {
        FNode p = fl_proto(F_SLICE, sdt, rank, one);
        p.nin = 1;
        p.in[0] = st;
        p.ia[0] = rank - 1;
        p.ia[1] = k;
        int v = fl_add(L, &p);
        *(k == 0 ? m : k == 1 ? s : xt) = sdt == dt ? v : fl_cast(L, v, dt);
    }
    if (e) *e = fl_un(L, K_EXP, fl_sub2(L, x, *m));
    return st;
}

/* The classifier kernel's node (F_CE_GRAD) for a cross-entropy's backward: dloss, the logits as
 * read (y) and the targets (z). Its value is what the maps it replaces computed, in y's type:
 * p = exp(x - m) / s, dl = dloss * (p - onehot), dl / N, N the number of targets. */
static int fl_ce_grad(FL *L, int x, int y, int z) {
    const FNode *lg = fl_n(L, y);
    int m, s, xt;
    FNode p = fl_proto(F_CE_GRAD, lg->dt, lg->rank, lg->shape);
    p.nin = 4;
    p.in[0] = fl_ce_stats(L, y, z, &m, &s, &xt, NULL);
    p.in[1] = y;
    p.in[2] = z;
    p.in[3] = x;
    p.ia[0] = lg->shape[lg->rank - 1];
    return fl_add(L, &p);
}

/* The classifier kernel's node f with its result widened to W columns by a concat of zeros along
 * the last axis (a padded vocabulary's gradient), or stored as dt (a cast after it): the same
 * node with the wider shape or the other type, -1 when the concat or cast is not of that form. */
static int fl_ce_grad_absorb(FL *L, const GNode *n, const int *in) {
    if (n->nin < 1 || in[0] < 0 || L->guses[n->in[0]] != 1) return -1;
    const FNode *f = fl_n(L, in[0]);
    if (f->op != F_CE_GRAD || n->rank != f->rank) return -1;
    FNode p = *f;
    if (n->op == G_CAST) {
        if (!dtype_is_float(n->dt)) return -1;
        p.dt = n->dt;
    } else { /* G_CONCAT */
        const FNode *z = fl_n(L, in[1]);
        while (z->op == F_EXPAND || z->op == F_RESHAPE) z = fl_n(L, z->in[0]);
        if (n->nin != 2 || n->iattr[0] != n->rank - 1 || f->shape[f->rank - 1] != f->ia[0] || z->op != F_CONST ||
            z->fa[0] != 0.0 || signbit(z->fa[0]) || f->dt != fl_n(L, f->in[1])->dt)
            return -1;
        p.shape[p.rank - 1] = n->shape[n->rank - 1];
    }
    for (int d = 0; d < n->rank; d++)
        if (p.shape[d] != n->shape[d]) return -1;
    return fl_add(L, &p);
}

/* The bits of the axes a reduction with attribute axis (-1: all) reduces. */
static uint32_t fl_axis_mask(const FNode *x, int64_t axis) {
    if (axis < 0) return fl_all_axes(x->rank);
    return 1u << axis;
}

/* ---- one graph node ---------------------------------------------------------------------------- */

/* The value of graph node n from its inputs' fused nodes in[], by op family: the fused node, -1 for
 * a matmul folded into its sum_to, or FL_OTHER when n is not of the family. */
#define FL_OTHER INT32_MIN

/* Leaves, constants and pointwise ops: maps (a composite such as gelu or sigmoid as several),
 * dropout, and `x @ w + b` as a GEMM with the bias epilogue (fl_gemm_bias). */
static int fl_lower_pointwise(FL *L, const GNode *n, const int *in) {
    int x = in[0], y = in[1], z = in[2];
    DType dt = n->dt;
    const FNode *nx = x >= 0 ? fl_n(L, x) : NULL;
    switch (n->op) {
    case G_PARAM:
    case G_INPUT: {
        FNode p = fl_proto(F_LEAF, dt, n->rank, n->shape);
        p.ia[0] = n->id;
        return fl_add(L, &p);
    }
    case G_CONST: return fl_const_shaped(L, n->fattr[0], dt, n->rank, n->shape);
    case G_ARANGE: return fl_iota(L, DT_I32, n->rank, n->shape, 0);
    case G_NEG: return fl_un(L, K_NEG, x);
    case G_EXP: return fl_un(L, K_EXP, x);
    case G_LOG: return fl_un(L, K_LOG, x);
    case G_SQRT: return fl_un(L, K_SQRT, x);
    case G_TANH: return fl_un(L, K_TANH, x);
    case G_SIN: return fl_un(L, K_SIN, x);
    case G_COS: return fl_un(L, K_COS, x);
    case G_FLOOR: return fl_un(L, K_FLOOR, x);
    case G_ABS: return fl_un(L, K_ABS, x);
    case G_RSQRT: return fl_div2(L, fl_c(L, 1.0, dt), fl_un(L, K_SQRT, x));
    case G_SIGMOID: return fl_sigmoid(L, x);
    case G_RELU: /* x > 0 or NaN: x, else 0 */ return fl_sel(L, fl_bin(L, K_LE, x, fl_c(L, 0.0, dt)), fl_c(L, 0.0, dt), x);
    case G_GELU: return fl_gelu(L, x);
    case G_SILU: return fl_mul2(L, x, fl_sigmoid(L, x));
    case G_SIGN:
        return fl_sel(L, fl_bin(L, K_GT, x, fl_c(L, 0.0, dt)), fl_c(L, 1.0, dt),
                      fl_sel(L, fl_bin(L, K_LT, x, fl_c(L, 0.0, dt)), fl_c(L, -1.0, dt), x));
    case G_NOT:
        if (nx->dt == DT_BOOL) return fl_un(L, K_NOT, x);
        return fl_bin(L, K_EQ, x, fl_c(L, 0.0, nx->dt));
    case G_CAST: {
        int f = fl_ce_grad_absorb(L, n, in);
        return f >= 0 ? f : fl_cast(L, x, dt);
    }
    case G_DROPOUT: {
        double p = n->fattr[0];
        if (!(p > 0)) return x;
        if (p >= 1) return fl_const_shaped(L, 0.0, dt, n->rank, n->shape);
        FNode q = fl_proto(F_DROPOUT, dt, n->rank, n->shape);
        q.nin = 2;
        q.in[0] = x;
        q.in[1] = y; /* the "rng" key (graph.h) */
        q.ia[0] = n->iattr[0];
        q.fa[0] = p;
        return fl_add(L, &q);
    }
    case G_CLAMP: {
        int lo = fl_c(L, n->fattr[0], dt), hi = fl_c(L, n->fattr[1], dt);
        return fl_sel(L, fl_bin(L, K_LT, x, lo), lo, fl_sel(L, fl_bin(L, K_GT, x, hi), hi, x));
    }
    case G_ADD: {
        int f = fl_gemm_bias(L, n);
        if (f < 0) f = fl_gemm_add(L, n);
        return f >= 0 ? f : fl_bin(L, K_ADD, x, y);
    }
    case G_SUB: return fl_bin(L, K_SUB, x, y);
    case G_MUL: return fl_bin(L, K_MUL, x, y);
    case G_DIV: return fl_bin(L, K_DIV, x, y);
    case G_POW: return fl_bin(L, K_POW, x, y);
    case G_MOD: return fl_bin(L, K_MOD, x, y);
    case G_MAX2: return fl_bin(L, K_MAX, x, y);
    case G_MIN2: return fl_bin(L, K_MIN, x, y);
    case G_EQ: return fl_bin(L, K_EQ, x, y);
    case G_NE: return fl_bin(L, K_NE, x, y);
    case G_LT: return fl_bin(L, K_LT, x, y);
    case G_LE: return fl_bin(L, K_LE, x, y);
    case G_GT: return fl_bin(L, K_GT, x, y);
    case G_GE: return fl_bin(L, K_GE, x, y);
    case G_AND: return fl_bin(L, K_AND, fl_cast(L, x, DT_BOOL), fl_cast(L, y, DT_BOOL));
    case G_OR: return fl_bin(L, K_OR, fl_cast(L, x, DT_BOOL), fl_cast(L, y, DT_BOOL));
    case G_WHERE: return fl_map(L, K_SELECT, dt, 3, fl_cast(L, x, DT_BOOL), y, z);
    default: return FL_OTHER;
    }
}

/* Reductions and the composites made of them (softmax, layernorm, rmsnorm and their backward ops),
 * in the reference evaluator's order of operations. */
static int fl_lower_reduction(FL *L, const GNode *n, const int *in) {
    int x = in[0], y = in[1], z = in[2];
    DType dt = n->dt;
    const FNode *nx = x >= 0 ? fl_n(L, x) : NULL;
    switch (n->op) {
    case G_SUM:
    case G_MEAN:
    case G_MAX:
    case G_MIN:
    case G_LOGSUMEXP: {
        uint32_t mask = fl_axis_mask(nx, n->iattr[0]);
        int r;
        if (n->op == G_SUM || n->op == G_MEAN) {
            r = fl_reduce(L, K_ADD, x, mask);
            if (n->op == G_MEAN) r = fl_div2(L, r, fl_c(L, (double)fuse_numel(nx) / (double)graph_numel(n), dt));
        } else if (n->op == G_MAX || n->op == G_MIN) {
            r = fl_reduce(L, n->op == G_MAX ? K_MAX : K_MIN, x, mask);
        } else { /* max, then log of the sum of exp(x - max); an infinite or NaN max as it is */
            int m = fl_reduce(L, K_MAX, x, mask);
            int s = fl_reduce(L, K_ADD, fl_un(L, K_EXP, fl_sub2(L, x, m)), mask);
            int finite = fl_bin(L, K_EQ, fl_sub2(L, m, m), fl_c(L, 0.0, dt));
            r = fl_sel(L, finite, fl_add2(L, m, fl_un(L, K_LOG, s)), m);
        }
        return fl_reshape(L, r, n->rank, n->shape);
    }
    case G_SEG_NORM: return fl_op(L, F_SEG_NORM, dt, n->rank, n->shape, 1, in);
    case G_NORM: {
        int s = fl_reduce(L, K_ADD, fl_mul2(L, x, x), fl_all_axes(nx->rank));
        return fl_reshape(L, fl_un(L, K_SQRT, s), n->rank, n->shape);
    }
    case G_SUM_TO: {
        if (x < 0) return L->fg->absorbed[n->in[0]]; /* the GEMM summed over the batch already */
        uint32_t mask = 0;
        for (int a = 0; a < nx->rank; a++) {
            int j = a - (nx->rank - n->rank);
            if (j < 0 || (n->shape[j] == 1 && nx->shape[a] != 1)) mask |= 1u << a;
        }
        return fl_reshape(L, fl_reduce(L, K_ADD, x, mask), n->rank, n->shape);
    }
    case G_SOFTMAX:
    case G_LOG_SOFTMAX: {
        uint32_t mask = 1u << n->iattr[0];
        int m = fl_reduce(L, K_MAX, x, mask);
        int zc = fl_sub2(L, x, m);
        int e = fl_un(L, K_EXP, zc);
        int s = fl_reduce(L, K_ADD, e, mask);
        return n->op == G_SOFTMAX ? fl_div2(L, e, s) : fl_sub2(L, zc, fl_un(L, K_LOG, s));
    }
    case G_LAYERNORM: {
        int mean, rstd, d;
        fl_ln_stats(L, x, n->fattr[0], &mean, &rstd, &d);
        int r = fl_mul2(L, fl_mul2(L, d, rstd), y);
        return n->nin > 2 ? fl_add2(L, r, z) : r;
    }
    case G_RMSNORM: return fl_mul2(L, fl_mul2(L, x, fl_rms_stats(L, x, n->fattr[0])), y);
    case G_SOFTMAX_BWD: {
        int s = fl_reduce(L, K_ADD, fl_mul2(L, x, y), 1u << n->iattr[0]);
        return fl_mul2(L, y, fl_sub2(L, x, s));
    }
    case G_LAYERNORM_BWD_X: { /* in0 = dy, in1 = x, in2 = w */
        const FNode *xn = fl_n(L, y);
        int mean, rstd, d;
        fl_ln_stats(L, y, n->fattr[0], &mean, &rstd, &d);
        uint32_t last = 1u << (xn->rank - 1);
        int c = fl_c(L, (double)xn->shape[xn->rank - 1], xn->dt);
        int gr = fl_mul2(L, x, z);
        int xhat = fl_mul2(L, d, rstd);
        int mg = fl_div2(L, fl_reduce(L, K_ADD, gr, last), c);
        int mgx = fl_div2(L, fl_reduce(L, K_ADD, fl_mul2(L, gr, xhat), last), c);
        return fl_mul2(L, rstd, fl_sub2(L, fl_sub2(L, gr, mg), fl_mul2(L, xhat, mgx)));
    }
    case G_LAYERNORM_BWD_W:
    case G_RMSNORM_BWD_W: { /* in0 = dy, in1 = x: sum over rows of dy * xhat */
        const FNode *xn = fl_n(L, y);
        int t;
        if (n->op == G_LAYERNORM_BWD_W) {
            int mean, rstd, d;
            fl_ln_stats(L, y, n->fattr[0], &mean, &rstd, &d);
            t = fl_mul2(L, fl_mul2(L, x, d), rstd);
        } else {
            t = fl_mul2(L, fl_mul2(L, x, y), fl_rms_stats(L, y, n->fattr[0]));
        }
        uint32_t rows = fl_all_axes(xn->rank) & ~(1u << (xn->rank - 1));
        return fl_reshape(L, fl_reduce(L, K_ADD, t, rows), n->rank, n->shape);
    }
    case G_RMSNORM_BWD_X: {
        const FNode *xn = fl_n(L, y);
        int rs = fl_rms_stats(L, y, n->fattr[0]);
        int c = fl_c(L, (double)xn->shape[xn->rank - 1], xn->dt);
        int gr = fl_mul2(L, x, z);
        int mgx = fl_div2(L, fl_reduce(L, K_ADD, fl_mul2(L, gr, y), 1u << (xn->rank - 1)), c);
        int cube = fl_mul2(L, fl_mul2(L, fl_mul2(L, y, rs), rs), rs);
        return fl_sub2(L, fl_mul2(L, rs, gr), fl_mul2(L, cube, mgx));
    }
    default: return FL_OTHER;
    }
}

/* The forward's result o of the attention whose backward op n is (in = dout, q, k, v[, pos]), as a node
 * that reads it where the forward's kernel stores it: the forward's F_ATTN (hash-consing finds it),
 * or, when its one reader is a chain of permutes and reshapes (the heads merged back: [B, T, H * E],
 * which the projection's GEMM reads and its weight gradient keeps), the chain's end seen back
 * through the inverse views. The partition gives F_ATTN no buffer of its own then (rule 5: the
 * forward kernel stores straight into the chain's end), so reading F_ATTN itself would make one:
 * a second copy of every layer's attention output, held until the backward. The inverse views are
 * added raw (fl_reshape and fl_permute would fold them back into F_ATTN). */
static int fl_attn_output(FL *L, const GNode *n, const int *in) {
    const FNode *v = fl_n(L, in[3]), *q = fl_n(L, in[1]);
    int64_t shape[GRAPH_MAX_RANK] = {0};
    memcpy(shape, q->shape, sizeof shape);
    shape[q->rank - 1] = v->shape[v->rank - 1];
    int o = fl_op(L, F_ATTN, n->dt, q->rank, shape, n->nin - 1, in + 1);
    const FusedGraph *fg = L->fg;
    int chain[64], nc = 0, x = o;
    while (nc < 64) { /* x's one reader, when x has one and it is a view */
        int user = -1, users = 0;
        for (int f = x + 1; f < fg->n; f++)
            for (int i = 0; i < fg->node[f]->nin; i++)
                if (fg->node[f]->in[i] == x) users++, user = f;
        for (int i = 0; i < fg->noutputs; i++) users += fg->g2f[fg->outputs[i]] == x;
        if (users != 1 || (fg->node[user]->op != F_PERMUTE && fg->node[user]->op != F_RESHAPE)) break;
        chain[nc++] = x = user;
    }
    for (int i = nc - 1; i >= 0; i--) { /* from the end back to o: each link undone */
        const FNode *link = fl_n(L, chain[i]), *below = fl_n(L, link->in[0]);
        FNode p = fl_proto(link->op, below->dt, below->rank, below->shape);
        p.nin = 1;
        p.in[0] = x;
        if (link->op == F_PERMUTE) p.ia[0] = link->ia[0], p.ia[1] = link->ia[1];
        x = fl_add(L, &p);
    }
    return x;
}

/* The statistics the backward ops of an attention read, [..., H, T, 3]: the max m and sum l of
 * every query row, stored by the forward's kernel (F_ATTN_LSE, a member of F_ATTN's kernel: kept
 * from the forward to the backward like any activation), and sum_j P_ij dP_ij, which equals
 * rowsum(dout * o) (sum_j P_ij (dout_i . v_j) = dout_i . sum_j P_ij v_j = dout_i . o_i): one read
 * of two rows a query row instead of a second walk over the keys (F_ATTN_STATS, a small kernel
 * of its own before the backward of q). */
static int fl_attn_stats(FL *L, const GNode *n, const int *in) {
    const FNode *q = fl_n(L, in[1]);
    /* the statistics in f32 at least: a row maximum in bf16 would be off by up to 2^-9 of itself,
     * and every P computed from it by that much (relatively) times |max| */
    DType sdt = q->dt == DT_F64 ? DT_F64 : DT_F32;
    int64_t shape[GRAPH_MAX_RANK] = {0};
    memcpy(shape, q->shape, sizeof shape);
    shape[q->rank - 1] = 2;
    int o = fl_attn_output(L, n, in), attn = o;
    while (fl_n(L, attn)->op != F_ATTN) attn = fl_n(L, attn)->in[0];
    FNode lp = fl_proto(F_ATTN_LSE, sdt, q->rank, shape); /* named after the forward's attention */
    lp.nin = n->nin - 1;
    for (int i = 0; i < lp.nin; i++) lp.in[i] = in[i + 1];
    memcpy(lp.ia, fl_n(L, attn)->ia, sizeof lp.ia);
    memcpy(lp.fa, fl_n(L, attn)->fa, sizeof lp.fa);
    int lse = fl_add(L, &lp);
    L->fg->node[lse]->gid = fl_n(L, attn)->gid;
    shape[q->rank - 1] = 3;
    FNode p = fl_proto(F_ATTN_STATS, sdt, q->rank, shape);
    p.nin = 3;
    p.in[0] = in[0];
    p.in[1] = o;
    p.in[2] = lse;
    return fl_add(L, &p);
}

/* The ops with kernels of their own (rope, attention and its backward, topk, scatter_add) and the
 * losses (cross-entropy and its backward, mse, one_hot). */
static int fl_lower_dedicated(FL *L, const GNode *n, const int *in) {
    int x = in[0], y = in[1], z = in[2];
    DType dt = n->dt;
    const FNode *nx = x >= 0 ? fl_n(L, x) : NULL;
    switch (n->op) {
    case G_ROPE:
    case G_ROPE_BWD: {
        FNode p = fl_proto(F_ROPE, dt, n->rank, n->shape);
        p.nin = n->nin; /* x, and the positions: pos [B, T] when positions restart per document, or
                         * [rows] in the forward over new tokens (plan/kv.c) */
        p.in[0] = x;
        p.in[1] = n->nin > 1 ? y : -1;
        p.fa[0] = n->fattr[0];
        p.ia[0] = n->op == G_ROPE_BWD;
        p.ia[1] = n->nin > 1;
        return fl_add(L, &p);
    }
    case G_ATTENTION: return fl_op(L, F_ATTN, dt, n->rank, n->shape, n->nin, in); /* pos last (ia[1]) */
    case G_KV_ATTENTION: {
        FNode p = fl_proto(F_KV_ATTN, dt, n->rank, n->shape);
        p.nin = 4;
        for (int i = 0; i < 4; i++) p.in[i] = in[i], p.ia[i] = n->iattr[i];
        p.fa[0] = n->fattr[0];
        p.fa[1] = n->fattr[1];
        return fl_add(L, &p);
    }
    case G_ATTENTION_BWD_Q:
    case G_ATTENTION_BWD_K:
    case G_ATTENTION_BWD_V: {
        int stats = fl_attn_stats(L, n, in);
        int all[6] = {in[0], in[1], in[2], in[3], stats, in[4]}; /* the document mask pos last, when given */
        FOp op = n->op == G_ATTENTION_BWD_Q ? F_ATTN_BWD_Q : n->op == G_ATTENTION_BWD_K ? F_ATTN_BWD_K : F_ATTN_BWD_V;
        return fl_op(L, op, dt, n->rank, n->shape, n->nin + 1, all);
    }
    case G_CROSS_ENTROPY: {
        int m, s, xt;
        fl_ce_stats(L, x, y, &m, &s, &xt, NULL);
        /* no buffer of its own: the mean's kernel computes each row's loss from the statistics'
         * buffer, which holds the target's logit too, reading N x 3 values (the logits are read by
         * ce_stats alone, so that the classifier kernel may overwrite them) */
        int rowloss = fl_sub2(L, fl_un(L, K_LOG, s), fl_sub2(L, xt, m));
        int total = fl_reduce(L, K_ADD, rowloss, fl_all_axes(nx->rank));
        int mean = fl_div2(L, total, fl_c(L, (double)fuse_numel(fl_n(L, y)), nx->dt));
        return fl_cast(L, fl_reshape(L, mean, n->rank, n->shape), dt);
    }
    case G_CROSS_ENTROPY_BWD: /* in0 = dloss, in1 = logits, in2 = targets: the classifier kernel */
        if (fuse_ce_fused) return fl_ce_grad(L, x, y, z);
        {
            const FNode *lg = fl_n(L, y);
            int m, s, xt, e;
            fl_ce_stats(L, y, z, &m, &s, &xt, &e);
            int p = fl_div2(L, e, s);
            int iota = fl_iota(L, DT_I32, lg->rank, lg->shape, lg->rank - 1);
            int hot = fl_sel(L, fl_bin(L, K_EQ, iota, fl_keep_last1(L, z)), fl_c(L, 1.0, lg->dt), fl_c(L, 0.0, lg->dt));
            int dl = fl_mul2(L, fl_cast(L, x, lg->dt), fl_sub2(L, p, hot));
            return fl_div2(L, dl, fl_c(L, (double)fuse_numel(fl_n(L, z)), lg->dt));
        }
    case G_MSE: {
        int d = fl_sub2(L, x, y);
        int s = fl_reduce(L, K_ADD, fl_mul2(L, d, d), fl_all_axes(nx->rank));
        int mean = fl_div2(L, s, fl_c(L, (double)fuse_numel(nx), nx->dt));
        return fl_cast(L, fl_reshape(L, mean, n->rank, n->shape), dt);
    }
    case G_ONE_HOT: {
        int iota = fl_iota(L, DT_I32, n->rank, n->shape, n->rank - 1);
        return fl_sel(L, fl_bin(L, K_EQ, iota, fl_keep_last1(L, x)), fl_c(L, 1.0, dt), fl_c(L, 0.0, dt));
    }
    case G_TOPK_VALUES:
    case G_TOPK_INDICES: {
        FNode p = fl_proto(F_TOPK, dt, n->rank, n->shape);
        p.nin = 1;
        p.in[0] = x;
        p.ia[0] = n->iattr[0];
        p.ia[1] = n->iattr[1] < 0 ? n->iattr[1] + nx->rank : n->iattr[1];
        p.ia[2] = n->op == G_TOPK_INDICES;
        return fl_add(L, &p);
    }
    case G_SCATTER_ADD: return fl_op(L, F_SCATTER_ADD, dt, n->rank, n->shape, 2, in);
    default: return FL_OTHER;
    }
}

/* Matmuls (resolved into GEMMs, fl_matmul) and views: reshape, transpose, slice, gather, concat,
 * broadcast. */
static int fl_lower_layout(FL *L, const GNode *n, const int *in) {
    int x = in[0], y = in[1];
    DType dt = n->dt;
    const FNode *nx = x >= 0 ? fl_n(L, x) : NULL;
    switch (n->op) {
    case G_MATMUL: {
        int f = fl_matmul(L, n, x, y);
        if (!fl_same_shape(fl_n(L, f), n->rank, n->shape)) { /* absorbed by its sum_to */
            L->fg->absorbed[n->id] = f;
            return -1;
        }
        return f;
    }
    case G_RESHAPE: return fl_reshape(L, x, n->rank, n->shape);
    case G_TRANSPOSE: return fl_permute(L, x, (int)n->iattr[0], (int)n->iattr[1]);
    case G_SLICE: {
        if (n->iattr[1] == 0 && n->iattr[2] == nx->shape[n->iattr[0]]) return x;
        FNode p = fl_proto(F_SLICE, dt, n->rank, n->shape);
        p.nin = 1;
        p.in[0] = x;
        p.ia[0] = n->iattr[0];
        p.ia[1] = n->iattr[1];
        return fl_add(L, &p);
    }
    case G_GATHER: return fl_op(L, F_GATHER, dt, n->rank, n->shape, 2, in);
    case G_CONCAT: {
        if (n->nin == 1) return x;
        int f = fl_ce_grad_absorb(L, n, in);
        if (f >= 0) return f;
        FNode p = fl_proto(F_CONCAT, dt, n->rank, n->shape);
        p.nin = n->nin;
        for (int i = 0; i < n->nin; i++) p.in[i] = in[i];
        p.ia[0] = n->iattr[0];
        return fl_add(L, &p);
    }
    case G_BROADCAST: return fl_expand(L, x, n->rank, n->shape);
    default: return FL_OTHER;
    }
}

static int fl_lower_node(FL *L, const GNode *n) {
    const int *g2f = L->fg->g2f;
    int in[GRAPH_MAX_IN] = {-1, -1, -1, -1, -1};
    for (int i = 0; i < n->nin; i++) {
        in[i] = g2f[n->in[i]];
        if (in[i] < 0 && !(n->op == G_SUM_TO && L->fg->absorbed[n->in[i]] >= 0))
            INTERNAL("fuse: %%%d (%s) reads %%%d, which was not lowered", n->id, graph_op_name(n->op), n->in[i]);
    }
    int (*const family[])(FL *, const GNode *, const int *) = {fl_lower_pointwise, fl_lower_reduction, fl_lower_dedicated,
                                                               fl_lower_layout};
    for (size_t i = 0; i < sizeof family / sizeof *family; i++) {
        int f = family[i](L, n, in);
        if (f != FL_OTHER) return f;
    }
    INTERNAL("fuse: no lowering for %s (%%%d)", graph_op_name(n->op), n->id);
}

/* The graph nodes the outputs need, in tmp: 2 for an output, 1 for a node one of them reads. */
static unsigned char *fl_graph_live(const Graph *g, const int *outs, int nouts, Arena *tmp) {
    unsigned char *glive = arena_alloc(tmp, (size_t)g->n + 1);
    for (int i = 0; i < nouts; i++) {
        if (outs[i] < 0 || outs[i] >= g->n) INTERNAL("fuse: output %%%d is not a node", outs[i]);
        glive[outs[i]] = 2;
    }
    for (int id = g->n - 1; id >= 0; id--)
        if (glive[id])
            for (int i = 0; i < g->node[id]->nin; i++)
                if (!glive[g->node[id]->in[i]]) glive[g->node[id]->in[i]] = 1;
    return glive;
}

/* fuse.h */
FusedGraph *fuse_lower_graph(const Graph *g, const int *outputs, int noutputs, Arena *ar) {
    FusedGraph *fg = arena_alloc(ar, sizeof(FusedGraph));
    fg->ar = ar;
    fg->g = g;
    if (!outputs) noutputs = fuse_default_outputs(g, &fg->outputs, ar);
    else fg->outputs = arena_dup(ar, outputs, sizeof(int) * (size_t)(noutputs ? noutputs : 1));
    fg->noutputs = noutputs;
    Arena tmp = {0};
    const unsigned char *glive = fl_graph_live(g, fg->outputs, noutputs, &tmp);
    fg->g2f = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    fg->absorbed = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    FL L = {.fg = fg, .g = g, .glive = glive};
    L.guses = arena_alloc(&tmp, sizeof(int) * (size_t)(g->n + 1));
    L.guser = arena_alloc(&tmp, sizeof(int) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        fg->g2f[id] = fg->absorbed[id] = -1;
        L.guser[id] = -1;
    }
    for (int id = 0; id < g->n; id++) {
        if (!glive[id]) continue;
        const GNode *n = graph_node(g, id);
        for (int i = 0; i < n->nin; i++) {
            L.guses[n->in[i]]++;
            L.guser[n->in[i]] = id;
        }
    }
    for (int id = 0; id < g->n; id++) {
        if (!glive[id]) continue;
        L.gid = id;
        fg->g2f[id] = fl_lower_node(&L, graph_node(g, id));
    }
    for (int id = 0; id < g->n; id++)
        if (glive[id] && graph_node(g, id)->op == G_SUM_TO) fl_gemm_bgrad(&L, id);
    fl_lora_chain(&L);
    arena_free(&tmp);
    return fg;
}
