/* fuse_codegen.c - the last step of fusion: one kernel of the partition written as kernel IR.
 *
 * Pipeline position: fuse: fuse_lower -> partition (fuse_partition.c) -> [fuse_codegen] -> kernel IR
 * (kir.h) -> back ends. The partition also calls it on trial while deciding a merge: a merge
 * whose kernel cannot be written (a row reduction read at another row) is refused.
 *
 * The heart is cg_value(node, index): the SSA value of a fused node at an index (one i64 value
 * per dimension, or the flat row-major offset, each computed when first needed). A node the
 * kernel computes is generated from its inputs at the indices its op implies (broadcasting
 * drops dimensions, a permute swaps them, a slice adds its start, a reshape maps groups of
 * dimensions, a gather loads the row number); a node held in a buffer is loaded. Values are
 * remembered per (node, flat index) for as long as the loop that computed them is open.
 *
 * Kernel shapes:
 *   elementwise  gid is the flat index of every member (one segment), or of one segment chosen
 *                by a range of gid;
 *   reduction    gid numbers the kept coordinates of the reduced shape F; loop 1 .. L over the
 *                reduced coordinates, each holding the reductions of its level (a reduction's
 *                level is one more than the deepest reduction it reads) and the stores of the
 *                full-shaped members of that level; per-row members are stored between loops;
 *   dedicated    attention (forward, row statistics, backward of q, k, v), topk, scatter_add:
 *                written out below, as ref.c and ref_bwd.c compute them. */
#include "fuse_internal.h"

#include <math.h>
#include <string.h>

/* ---- state ------------------------------------------------------------------------------------- */

typedef struct KIdx {
    int rank;
    int64_t shape[GRAPH_MAX_RANK];
    int dim[GRAPH_MAX_RANK]; /* SSA ids, -1 until computed */
    int flat;                /* SSA id, -1 until computed */
} KIdx;

typedef struct CG {
    FuseCtx *c;
    int kid;
    FKern *K;
    Arena *ar;
    Kernel *k;
    KBuilder *b;
    const char *why;  /* the first failure (trial mode) */
    int red;          /* a reduction kernel */
    int *acc;         /* [n] a reduce member's accumulator */
    unsigned char *done; /* [n] its loop has ended */
    int *dep;         /* [n] memo of cg_dep + 1 (0: unknown) */
    int kept[GRAPH_MAX_RANK]; /* SSA of F's kept coordinates */
} CG;

static const FNode *cg_n(const CG *g, int f) { return g->c->fg->node[f]; }

/* A failure: on trial it is remembered (the merge being tried is then refused) and generation
 * finishes the kernel with zero values in place of what could not be computed; in the final
 * generation it is a compiler bug, so a kernel that runs never contains such a value. */
static void cg_fail(CG *g, const char *why) {
    if (g->c->final) INTERNAL("fuse: kernel %d: %s", g->kid, why);
    if (!g->why) g->why = why;
}

static KType cg_t(const FNode *n) { return kir_type_of(n->dt); }

static int cg_i(CG *g, int64_t v) { return kb_const_i(g->b, KT_I64, v); }

static int cg_f(CG *g, KType t, double v) {
    return kir_type_is_float(t) ? kb_const_f(g->b, t, v) : kb_const_i(g->b, t, (int64_t)v);
}

static int cg_op1(CG *g, KOp op, KType t, int a) { return kb_op(g->b, op, t, 1, a, -1, -1); }
static int cg_op2(CG *g, KOp op, KType t, int a, int b) { return kb_op(g->b, op, t, 2, a, b, -1); }
static int cg_as(CG *g, int v, KType t) { return kb_type(g->b, v) == t ? v : cg_op1(g, K_CAST, t, v); } /* v as type t */
static int cg_op3(CG *g, KOp op, KType t, int a, int b, int c) { return kb_op(g->b, op, t, 3, a, b, c); }

static int cg_iadd(CG *g, int a, int b) { return cg_op2(g, K_ADD, KT_I64, a, b); }
static int cg_isub(CG *g, int a, int b) { return cg_op2(g, K_SUB, KT_I64, a, b); }
static int cg_imul(CG *g, int a, int b) { return cg_op2(g, K_MUL, KT_I64, a, b); }

/* v clamped to [lo, hi] (i64), each side only when it is needed. */
static int cg_clamp(CG *g, int v, int64_t lo, int64_t hi, int need_lo, int need_hi) {
    if (need_lo) v = cg_op2(g, K_MAX, KT_I64, v, cg_i(g, lo));
    if (need_hi) v = cg_op2(g, K_MIN, KT_I64, v, cg_i(g, hi));
    return v;
}

/* ---- indices ------------------------------------------------------------------------------------ */

static void ix_init(KIdx *ix, int rank, const int64_t *shape) {
    ix->rank = rank;
    for (int i = 0; i < GRAPH_MAX_RANK; i++) {
        ix->shape[i] = i < rank ? shape[i] : 1;
        ix->dim[i] = -1;
    }
    ix->flat = -1;
}

/* flat / (the product of the dimensions after d), as a chain of divisions (q_d = q_{d+1} / n_{d+1})
 * so that recombining the dimensions folds back to the values they came from. */
static int ix_quot(CG *g, KIdx *ix, int d) {
    if (d == ix->rank - 1) return ix->flat;
    int q = ix_quot(g, ix, d + 1);
    return ix->shape[d + 1] == 1 ? q : cg_op2(g, K_IDIV, KT_I64, q, cg_i(g, ix->shape[d + 1]));
}

static int ix_dim(CG *g, KIdx *ix, int d) {
    if (ix->dim[d] >= 0) return ix->dim[d];
    if (ix->shape[d] == 1) return ix->dim[d] = cg_i(g, 0);
    if (ix->flat < 0) INTERNAL("fuse: an index with neither dimension %d nor offset", d);
    int64_t before = 1;
    for (int i = 0; i < d; i++) before *= ix->shape[i];
    int v = ix_quot(g, ix, d);
    if (before > 1) v = cg_op2(g, K_IMOD, KT_I64, v, cg_i(g, ix->shape[d]));
    return ix->dim[d] = v;
}

/* The flat offset in Horner form, ((d0 n1 + d1) n2 + d2) ..., which the builder folds back to
 * the offset the dimensions were taken from. */
static int ix_flat(CG *g, KIdx *ix) {
    if (ix->flat >= 0) return ix->flat;
    int acc = cg_i(g, 0);
    for (int d = 0; d < ix->rank; d++)
        if (ix->shape[d] != 1) acc = cg_iadd(g, cg_imul(g, acc, cg_i(g, ix->shape[d])), ix_dim(g, ix, d));
    return ix->flat = acc;
}

static int ix_all_dims_known(const KIdx *ix) {
    for (int d = 0; d < ix->rank; d++)
        if (ix->dim[d] < 0 && ix->shape[d] != 1) return 0;
    return 1;
}

/* A reshape from shape a to shape b as groups of axes with equal products (size-1 axes left out):
 * group k is a's axes gi[0 .. ni) and b's gj[0 .. nj), in order. */
typedef struct ReshapeGroup {
    int gi[GRAPH_MAX_RANK], gj[GRAPH_MAX_RANK], ni, nj;
} ReshapeGroup;

/* The groups into out[]; their number, or -1 when the element counts differ. */
static int reshape_groups(int ra, const int64_t *a, int rb, const int64_t *b, ReshapeGroup *out) {
    int src[GRAPH_MAX_RANK], dst[GRAPH_MAX_RANK], ns = 0, nd = 0, n = 0;
    for (int d = 0; d < ra; d++)
        if (a[d] != 1) src[ns++] = d;
    for (int d = 0; d < rb; d++)
        if (b[d] != 1) dst[nd++] = d;
    int i = 0, j = 0;
    while (i < ns && j < nd) {
        ReshapeGroup *G = &out[n++];
        int64_t ps = a[src[i]], pd = b[dst[j]];
        G->ni = G->nj = 0;
        G->gi[G->ni++] = src[i++];
        G->gj[G->nj++] = dst[j++];
        while (ps != pd) {
            if (ps < pd && i < ns) {
                ps *= a[src[i]];
                G->gi[G->ni++] = src[i++];
            } else if (pd < ps && j < nd) {
                pd *= b[dst[j]];
                G->gj[G->nj++] = dst[j++];
            } else {
                return -1;
            }
        }
    }
    return i == ns && j == nd ? n : -1;
}

/* The same elements seen with another shape: with every dimension known, groups of dimensions
 * with equal products map onto each other (one to one where the group is one dimension on both
 * sides, through a linear index otherwise), so that [B, T, 1] -> [B, T] keeps the very values of
 * b and t; otherwise the flat offset carries over. */
static KIdx ix_reshape(CG *g, KIdx *ix, int rank, const int64_t *shape) {
    KIdx o;
    ix_init(&o, rank, shape);
    o.flat = ix->flat;
    if (!ix_all_dims_known(ix)) {
        o.flat = ix_flat(g, ix);
        return o;
    }
    ReshapeGroup groups[GRAPH_MAX_RANK];
    int ng = reshape_groups(ix->rank, ix->shape, rank, shape, groups);
    if (ng < 0) INTERNAL("fuse: reshape of a different element count");
    for (int q = 0; q < ng; q++) {
        const int *gi = groups[q].gi, *gj = groups[q].gj, ni = groups[q].ni, nj = groups[q].nj;
        if (ni == 1 && nj == 1) {
            o.dim[gj[0]] = ix_dim(g, ix, gi[0]);
            continue;
        }
        int lin = cg_i(g, 0);
        int64_t inner = 1;
        for (int k = 0; k < ni; k++) {
            lin = cg_iadd(g, cg_imul(g, lin, cg_i(g, ix->shape[gi[k]])), ix_dim(g, ix, gi[k]));
            inner *= ix->shape[gi[k]];
        }
        for (int k = 0; k < nj; k++) {
            inner /= shape[gj[k]];
            int v = inner == 1 ? lin : cg_op2(g, K_IDIV, KT_I64, lin, cg_i(g, inner));
            if (k > 0) v = cg_op2(g, K_IMOD, KT_I64, v, cg_i(g, shape[gj[k]]));
            o.dim[gj[k]] = v;
        }
    }
    return o;
}

/* The index of an input of shape (rank, shape) broadcast (right-aligned) to ix's shape. */
static KIdx ix_bcast(CG *g, KIdx *ix, int rank, const int64_t *shape) {
    KIdx o;
    ix_init(&o, rank, shape);
    int same = rank == ix->rank;
    for (int d = 0; same && d < rank; d++) same = shape[d] == ix->shape[d];
    if (same) return *ix;
    for (int d = 0; d < rank; d++) {
        int od = d + (ix->rank - rank);
        o.dim[d] = shape[d] == 1 ? cg_i(g, 0) : ix_dim(g, ix, od);
    }
    return o;
}

/* An index of shape (rank, shape) from the given dimension values (-1: size 1). */
static KIdx ix_of(int rank, const int64_t *shape, const int *dims) {
    KIdx o;
    ix_init(&o, rank, shape);
    for (int d = 0; d < rank; d++) o.dim[d] = dims[d];
    return o;
}

/* ---- buffers ------------------------------------------------------------------------------------ */

static int cg_buf(CG *g, int f, int written) {
    const FNode *n = cg_n(g, f);
    int buffer = g->c->buf_of ? g->c->buf_of[f] : -1;
    if (g->c->final && buffer < 0) INTERNAL("fuse: kernel %d uses node %d, which has no buffer", g->kid, f);
    int node = n->op == F_LEAF ? (int)n->ia[0] : -1;
    if (g->c->final && g->c->buf_node) node = g->c->buf_node[buffer];
    return kb_buf(g->b, f, buffer, node, n->dt, n->rank, n->shape, written);
}

static int cg_load(CG *g, int f, KIdx *ix) { return kb_load(g->b, cg_buf(g, f, 0), ix_flat(g, ix)); }

static void cg_store(CG *g, int f, KIdx *ix, int v) {
    if (!g->c->mat[f]) return;
    kb_store(g->b, cg_buf(g, f, 1), ix_flat(g, ix), v);
}

/* ---- values ------------------------------------------------------------------------------------- */

static int cg_value(CG *g, int f, KIdx *ix);

/* Computed here (a member, or inlined) rather than loaded. */
static int cg_computes(const CG *g, int f) {
    const FuseCtx *c = g->c;
    return c->owner[f] == g->kid || (c->cat[f] == FC_INLINE && !c->mat[f]);
}

/* The value standing in for one a refused trial could not compute (never in a final kernel). */
static int cg_refused_value(CG *g, const FNode *n) { return cg_f(g, cg_t(n), 0.0); }

/* A reduction of this kernel read at ix: legal only at the row being computed. */
static int cg_reduce_read(CG *g, int f, KIdx *ix) {
    const FNode *n = cg_n(g, f);
    if (!g->red) {
        cg_fail(g, "a reduction read outside a reduction kernel");
        return cg_refused_value(g, n);
    }
    uint32_t mask = (uint32_t)g->K->mask;
    for (int a = 0; a < n->rank; a++) {
        if (mask & (1u << a) || n->shape[a] == 1) continue;
        if (ix->dim[a] < 0 || ix->dim[a] != g->kept[a]) {
            cg_fail(g, "a row reduction read at another row");
            return cg_refused_value(g, n);
        }
    }
    if (!g->done[f]) {
        cg_fail(g, "a reduction read before its loop ends");
        return cg_refused_value(g, n);
    }
    return g->acc[f];
}

static uint64_t cg_mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z;
}

/* The same mix on a u64 value of the kernel. */
static int cg_mix64_ir(CG *g, int z) {
    z = cg_op2(g, K_XOR, KT_U64, z, cg_op2(g, K_SHR, KT_U64, z, kb_const_i(g->b, KT_U64, 30)));
    z = cg_op2(g, K_MUL, KT_U64, z, kb_const_i(g->b, KT_U64, (int64_t)0xBF58476D1CE4E5B9ull));
    z = cg_op2(g, K_XOR, KT_U64, z, cg_op2(g, K_SHR, KT_U64, z, kb_const_i(g->b, KT_U64, 27)));
    z = cg_op2(g, K_MUL, KT_U64, z, kb_const_i(g->b, KT_U64, (int64_t)0x94D049BB133111EBull));
    return cg_op2(g, K_XOR, KT_U64, z, cg_op2(g, K_SHR, KT_U64, z, kb_const_i(g->b, KT_U64, 31)));
}

/* An i32 index tensor's element as a row number clamped into [0, n). The reference evaluator
 * rejects an index out of range; a kernel must not read outside its buffer, so it clamps (the
 * data loader checks token ids). */
static int cg_index(CG *g, int f, KIdx *ix, int64_t n) {
    int v = cg_op1(g, K_CAST, KT_I64, cg_value(g, f, ix));
    return cg_clamp(g, v, 0, n - 1, 1, 1);
}

static int cg_compute(CG *g, const FNode *n, KIdx *ix) {
    KType t = cg_t(n);
    switch (n->op) {
    case F_CONST: return cg_f(g, t, n->fa[0]);
    case F_IOTA: return cg_op1(g, K_CAST, t, ix_dim(g, ix, (int)n->ia[0]));
    case F_RESHAPE: {
        const FNode *x = cg_n(g, n->in[0]);
        KIdx o = ix_reshape(g, ix, x->rank, x->shape);
        return cg_value(g, x->id, &o);
    }
    case F_PERMUTE: {
        const FNode *x = cg_n(g, n->in[0]);
        int dims[GRAPH_MAX_RANK] = {0};
        for (int d = 0; d < n->rank; d++) {
            int s = d == n->ia[0] ? (int)n->ia[1] : d == n->ia[1] ? (int)n->ia[0] : d;
            dims[s] = ix_dim(g, ix, d);
        }
        KIdx o = ix_of(x->rank, x->shape, dims);
        return cg_value(g, x->id, &o);
    }
    case F_EXPAND: {
        const FNode *x = cg_n(g, n->in[0]);
        KIdx o = ix_bcast(g, ix, x->rank, x->shape);
        return cg_value(g, x->id, &o);
    }
    case F_SLICE: {
        const FNode *x = cg_n(g, n->in[0]);
        int dims[GRAPH_MAX_RANK] = {0};
        for (int d = 0; d < n->rank; d++) dims[d] = ix_dim(g, ix, d);
        dims[n->ia[0]] = cg_iadd(g, dims[n->ia[0]], cg_i(g, n->ia[1]));
        KIdx o = ix_of(x->rank, x->shape, dims);
        return cg_value(g, x->id, &o);
    }
    case F_CONCAT: {
        int axis = (int)n->ia[0];
        int d = ix_dim(g, ix, axis);
        int64_t off[FUSE_MAX_IN + 1] = {0};
        off[0] = 0;
        for (int k = 0; k < n->nin; k++) off[k + 1] = off[k] + cg_n(g, n->in[k])->shape[axis];
        int vals[FUSE_MAX_IN] = {0};
        for (int k = 0; k < n->nin; k++) { /* every part at its clamped position, then a select */
            const FNode *x = cg_n(g, n->in[k]);
            int dims[GRAPH_MAX_RANK] = {0};
            for (int a = 0; a < n->rank; a++) dims[a] = ix_dim(g, ix, a);
            dims[axis] = cg_clamp(g, cg_isub(g, d, cg_i(g, off[k])), 0, x->shape[axis] - 1, k > 0, k < n->nin - 1);
            KIdx o = ix_of(x->rank, x->shape, dims);
            vals[k] = cg_value(g, x->id, &o);
        }
        int v = vals[n->nin - 1];
        for (int k = n->nin - 2; k >= 0; k--)
            v = cg_op3(g, K_SELECT, t, cg_op2(g, K_LT, KT_BOOL, d, cg_i(g, off[k + 1])), vals[k], v);
        return v;
    }
    case F_GATHER: { /* rows of x [R, ...] at idx [P...]: out [P..., ...] */
        const FNode *x = cg_n(g, n->in[0]), *idx = cg_n(g, n->in[1]);
        int dims[GRAPH_MAX_RANK] = {0};
        for (int a = 0; a < idx->rank; a++) dims[a] = ix_dim(g, ix, a);
        KIdx ii = ix_of(idx->rank, idx->shape, dims);
        int xd[GRAPH_MAX_RANK] = {0};
        xd[0] = cg_index(g, idx->id, &ii, x->shape[0]);
        for (int a = 1; a < x->rank; a++) xd[a] = ix_dim(g, ix, idx->rank + a - 1);
        KIdx xo = ix_of(x->rank, x->shape, xd);
        return cg_value(g, x->id, &xo);
    }
    case F_TAKE: { /* x [..., V] at column t[...] of each row */
        const FNode *x = cg_n(g, n->in[0]), *tt = cg_n(g, n->in[1]);
        int xd[GRAPH_MAX_RANK] = {0};
        for (int a = 0; a < n->rank; a++) xd[a] = ix_dim(g, ix, a);
        KIdx ti = *ix;
        xd[x->rank - 1] = cg_index(g, tt->id, &ti, x->shape[x->rank - 1]);
        KIdx xo = ix_of(x->rank, x->shape, xd);
        return cg_value(g, x->id, &xo);
    }
    case F_MAP: {
        int v[3] = {-1, -1, -1};
        for (int i = 0; i < n->nin; i++) {
            const FNode *x = cg_n(g, n->in[i]);
            KIdx o = ix_bcast(g, ix, x->rank, x->shape);
            v[i] = cg_value(g, x->id, &o);
        }
        return kb_op(g->b, n->kop, t, n->nin, v[0], v[1], v[2]);
    }
    case F_DROPOUT: { /* ref.c's ref_eval_dropout, on the flat index of the node's shape */
        const FNode *x = cg_n(g, n->in[0]);
        int xv = cg_value(g, x->id, ix);
        double p = n->fa[0];
        uint64_t threshold = (uint64_t)ceil(p * 16777216.0), key = cg_mix64((uint64_t)n->ia[0]);
        int i = cg_op1(g, K_CAST, KT_U64, ix_flat(g, ix));
        int step = cg_op2(g, K_MUL, KT_U64, cg_op2(g, K_ADD, KT_U64, i, kb_const_i(g->b, KT_U64, 1)),
                          kb_const_i(g->b, KT_U64, (int64_t)0x9E3779B97F4A7C15ull));
        int h = cg_mix64_ir(g, cg_op2(g, K_ADD, KT_U64, kb_const_i(g->b, KT_U64, (int64_t)key), step));
        int r = cg_op2(g, K_SHR, KT_U64, h, kb_const_i(g->b, KT_U64, 40));
        int keep = cg_op2(g, K_GE, KT_BOOL, r, kb_const_i(g->b, KT_U64, (int64_t)threshold));
        int scaled = cg_op2(g, K_MUL, t, xv, cg_f(g, t, 1.0 / (1.0 - p)));
        return cg_op3(g, K_SELECT, t, keep, scaled, cg_f(g, t, 0.0));
    }
    case F_ROPE: { /* ref.c's ref_eval_rope (ia[0] = 0) and ref_bwd.c's ref_rope_bwd (ia[0] = 1) */
        const FNode *x = cg_n(g, n->in[0]);
        int last = n->rank - 1;
        int64_t hd = n->shape[last], half = hd / 2;
        int pos = n->rank >= 2 ? ix_dim(g, ix, n->rank - 2) : cg_i(g, 0);
        int i = ix_dim(g, ix, last);
        int lo = cg_op2(g, K_LT, KT_BOOL, i, cg_i(g, half));
        int ip = cg_op3(g, K_SELECT, KT_I64, lo, i, cg_isub(g, i, cg_i(g, half)));
        int partner = cg_op3(g, K_SELECT, KT_I64, lo, cg_iadd(g, i, cg_i(g, half)), cg_isub(g, i, cg_i(g, half)));
        int dims[GRAPH_MAX_RANK] = {0};
        for (int a = 0; a < n->rank; a++) dims[a] = ix_dim(g, ix, a);
        dims[last] = partner;
        KIdx pix = ix_of(x->rank, x->shape, dims);
        int xa = cg_value(g, x->id, ix), xb = cg_value(g, x->id, &pix);
        int expo = cg_op2(g, K_DIV, t, cg_op2(g, K_MUL, t, cg_f(g, t, -2.0), cg_op1(g, K_CAST, t, ip)), cg_f(g, t, (double)hd));
        int ang = cg_op2(g, K_MUL, t, cg_op1(g, K_CAST, t, pos), cg_op2(g, K_POW, t, cg_f(g, t, n->fa[0]), expo));
        int cs = cg_op1(g, K_COS, t, ang), sn = cg_op1(g, K_SIN, t, ang);
        int ac = cg_op2(g, K_MUL, t, xa, cs), bs = cg_op2(g, K_MUL, t, xb, sn);
        int minus = cg_op2(g, K_SUB, t, ac, bs), plus = cg_op2(g, K_ADD, t, ac, bs);
        return n->ia[0] ? cg_op3(g, K_SELECT, t, lo, plus, minus) : cg_op3(g, K_SELECT, t, lo, minus, plus);
    }
    default:
        cg_fail(g, "a dedicated op computed as a value");
        return cg_refused_value(g, n);
    }
}

static int cg_value(CG *g, int f, KIdx *ix) {
    const FNode *n = cg_n(g, f);
    if (g->why) return cg_refused_value(g, n);
    if (n->op == F_REDUCE && g->c->owner[f] == g->kid) return cg_reduce_read(g, f, ix);
    int computed = cg_computes(g, f);
    if (computed && g->c->cat[f] == FC_ANCHOR) {
        cg_fail(g, "a dedicated op read inside its own kernel");
        return cg_refused_value(g, n);
    }
    int key = ix_flat(g, ix);
    int m = kb_memo_get(g->b, f, key);
    if (m >= 0) return m;
    int v = computed ? cg_compute(g, n, ix) : cg_load(g, f, ix);
    kb_memo_put(g->b, f, key, v);
    return v;
}

/* ---- elementwise kernels ------------------------------------------------------------------------ */

static void cg_elementwise(CG *g) {
    const FKern *K = g->K;
    int gid = kb_gid(g->b);
    int64_t lo = 0, total = 0;
    for (int s = 0; s < K->nseg; s++) {
        int64_t cnt = 1;
        for (int d = 0; d < K->seg[s].rank; d++) cnt *= K->seg[s].shape[d];
        total += cnt;
    }
    for (int s = 0; s < K->nseg; s++) {
        const FSeg *sg = &K->seg[s];
        int64_t cnt = 1;
        for (int d = 0; d < sg->rank; d++) cnt *= sg->shape[d];
        int local = gid;
        if (K->nseg > 1) {
            int cond = -1;
            if (lo > 0) cond = cg_op2(g, K_GE, KT_BOOL, gid, cg_i(g, lo));
            if (lo + cnt < total) {
                int below = cg_op2(g, K_LT, KT_BOOL, gid, cg_i(g, lo + cnt));
                cond = cond < 0 ? below : cg_op2(g, K_AND, KT_BOOL, cond, below);
            }
            kb_if(g->b, cond);
            local = cg_isub(g, gid, cg_i(g, lo));
        }
        for (int i = 0; i < sg->members.n; i++) {
            int f = sg->members.v[i];
            KIdx ix;
            ix_init(&ix, sg->rank, sg->shape);
            ix.flat = local;
            const FNode *n = cg_n(g, f);
            KIdx own = ix_reshape(g, &ix, n->rank, n->shape);
            cg_store(g, f, &own, cg_value(g, f, &own));
        }
        if (K->nseg > 1) kb_endif(g->b);
        lo += cnt;
    }
    g->k->grid = total;
    g->k->nsegments = K->nseg;
}

/* ---- reduction kernels --------------------------------------------------------------------------- */

/* The deepest level of this kernel's reductions that f reads (0: none). */
static int cg_dep(CG *g, int f) {
    if (g->dep[f]) return g->dep[f] - 1;
    const FNode *n = cg_n(g, f);
    int d = 0;
    if (n->op == F_REDUCE && g->c->owner[f] == g->kid) {
        d = 1 + cg_dep(g, n->in[0]);
    } else if (cg_computes(g, f)) {
        for (int i = 0; i < n->nin; i++) {
            int x = cg_dep(g, n->in[i]);
            if (x > d) d = x;
        }
    }
    g->dep[f] = d + 1;
    return d;
}

/* Same non-1 dimensions in the same order. */
static int cg_squeeze_eq(int ra, const int64_t *a, int rb, const int64_t *b) {
    int i = 0, j = 0;
    for (;;) {
        while (i < ra && a[i] == 1) i++;
        while (j < rb && b[j] == 1) j++;
        if (i == ra || j == rb) return i == ra && j == rb;
        if (a[i++] != b[j++]) return 0;
    }
}

static void cg_reduction(CG *g) {
    const FKern *K = g->K;
    FuseCtx *c = g->c;
    int rank = K->rank;
    uint32_t mask = K->mask;
    int64_t kept_shape[GRAPH_MAX_RANK], keptn = 1, redn = 1;
    for (int a = 0; a < rank; a++) {
        kept_shape[a] = mask & (1u << a) ? 1 : K->shape[a];
        if (mask & (1u << a)) redn *= K->shape[a];
        else keptn *= K->shape[a];
    }
    int suffix = 1; /* the reduced axes are the trailing ones: offset = gid * redn + j */
    for (int a = 0, seen = 0; a < rank; a++) {
        if (mask & (1u << a)) seen = 1;
        else if (seen && K->shape[a] != 1) suffix = 0;
    }
    int gid = kb_gid(g->b);
    KIdx kept_ix;
    ix_init(&kept_ix, rank, kept_shape);
    kept_ix.flat = gid;
    for (int a = 0; a < rank; a++) g->kept[a] = mask & (1u << a) ? -1 : ix_dim(g, &kept_ix, a);
    g->k->grid = keptn;

    /* levels: reductions, full-shaped members (stored in the loop of their level), per-row ones */
    int nl = 0;
    int *where = arena_alloc(g->ar, sizeof(int) * (size_t)K->members.n); /* loop, or -(1 + after) */
    for (int i = 0; i < K->members.n; i++) {
        int f = K->members.v[i];
        const FNode *n = cg_n(g, f);
        int lv;
        if (n->op == F_REDUCE) {
            if (n->in[0] < 0 || n->rank != rank || (uint32_t)n->ia[0] != mask) cg_fail(g, "a reduction of another shape");
            lv = 1 + cg_dep(g, n->in[0]);
            where[i] = lv;
        } else if (cg_squeeze_eq(n->rank, n->shape, rank, K->shape)) {
            lv = cg_dep(g, f) + 1;
            where[i] = lv;
        } else if (cg_squeeze_eq(n->rank, n->shape, rank, kept_shape)) {
            lv = cg_dep(g, f);
            where[i] = -(1 + lv);
        } else {
            cg_fail(g, "a member of neither the full nor the reduced shape");
            lv = 0;
            where[i] = 0;
        }
        if (lv > nl) nl = lv;
    }
    if (g->why) return;
    for (int L = 0; L <= nl; L++) {
        if (L > 0) {
            for (int i = 0; i < K->members.n; i++) {
                const FNode *n = cg_n(g, K->members.v[i]);
                if (n->op != F_REDUCE || where[i] != L) continue;
                double init = n->kop == K_ADD ? 0.0 : n->kop == K_MAX ? -INFINITY : INFINITY;
                g->acc[n->id] = kb_acc(g->b, cg_t(n), n->kop, init);
            }
            int j = kb_loop(g->b, redn);
            int dims[GRAPH_MAX_RANK] = {0};
            KIdx red_ix;
            int64_t red_shape[GRAPH_MAX_RANK] = {0};
            for (int a = 0; a < rank; a++) red_shape[a] = mask & (1u << a) ? K->shape[a] : 1;
            ix_init(&red_ix, rank, red_shape);
            red_ix.flat = j;
            for (int a = 0; a < rank; a++) dims[a] = mask & (1u << a) ? ix_dim(g, &red_ix, a) : g->kept[a];
            KIdx full = ix_of(rank, K->shape, dims);
            if (suffix) full.flat = cg_iadd(g, cg_imul(g, gid, cg_i(g, redn)), j);
            for (int i = 0; i < K->members.n && !g->why; i++) {
                const FNode *n = cg_n(g, K->members.v[i]);
                if (where[i] != L) continue;
                if (n->op == F_REDUCE) {
                    KIdx in = full;
                    kb_accum(g->b, g->acc[n->id], cg_value(g, n->in[0], &in));
                } else {
                    KIdx own = ix_reshape(g, &full, n->rank, n->shape);
                    cg_store(g, n->id, &own, cg_value(g, n->id, &own));
                }
            }
            kb_endloop(g->b);
            for (int i = 0; i < K->members.n; i++)
                if (cg_n(g, K->members.v[i])->op == F_REDUCE && where[i] == L) g->done[K->members.v[i]] = 1;
        }
        for (int i = 0; i < K->members.n && !g->why; i++) { /* per-row values: after loop L */
            const FNode *n = cg_n(g, K->members.v[i]);
            int after = n->op == F_REDUCE ? where[i] : where[i] < 0 ? -where[i] - 1 : -1;
            if (after != L || !c->mat[n->id]) continue;
            KIdx own = ix_reshape(g, &kept_ix, n->rank, n->shape);
            int v = n->op == F_REDUCE ? g->acc[n->id] : cg_value(g, n->id, &own);
            cg_store(g, n->id, &own, v);
        }
    }
}

/* ---- dedicated kernels: attention --------------------------------------------------------------- */

typedef struct CGAttn {
    int dout, q, k, v, stats;
    int r;
    int64_t H, T, D, Hk, S, E, G;
    int causal;
    double scale;
    KType t;
    int bd[GRAPH_MAX_RANK]; /* the leading (batch) coordinates */
} CGAttn;

static void cg_attn_init(CG *g, const FNode *n, int qpos, CGAttn *a) {
    memset(a, 0, sizeof *a);
    a->dout = qpos ? n->in[0] : -1;
    a->q = n->in[qpos];
    a->k = n->in[qpos + 1];
    a->v = n->in[qpos + 2];
    a->stats = n->nin > 4 ? n->in[4] : -1;
    const FNode *q = cg_n(g, a->q), *k = cg_n(g, a->k), *v = cg_n(g, a->v);
    a->r = q->rank;
    if (a->r < 3 || k->rank != a->r || v->rank != a->r) INTERNAL("fuse: attention of rank %d", a->r);
    for (int i = 0; i < a->r - 3; i++)
        if (q->shape[i] != k->shape[i] || q->shape[i] != v->shape[i])
            INTERNAL("fuse: attention whose q, k, v batch dimensions differ");
    a->H = q->shape[a->r - 3];
    a->T = q->shape[a->r - 2];
    a->D = q->shape[a->r - 1];
    a->Hk = k->shape[a->r - 3];
    a->S = k->shape[a->r - 2];
    a->E = v->shape[a->r - 1];
    a->G = a->H / a->Hk;
    a->causal = n->ia[0] != 0;
    a->scale = n->fa[0];
    /* f16/bf16 operands are computed in f32 anyway (kir.h); saying so lets the statistics be kept in
     * f32 (fuse_lower.c) without a rounding where they are read back */
    a->t = cg_t(q) == KT_F16 || cg_t(q) == KT_BF16 ? KT_F32 : cg_t(q);
}

/* Element (batch, head, row, col) of a [..., heads, rows, cols] operand. */
static int cg_attn_at(CG *g, const CGAttn *a, int f, int head, int row, int col) {
    const FNode *n = cg_n(g, f);
    int dims[GRAPH_MAX_RANK] = {0};
    for (int i = 0; i < a->r - 3; i++) dims[i] = a->bd[i];
    dims[a->r - 3] = head;
    dims[a->r - 2] = row;
    dims[a->r - 1] = col;
    KIdx ix = ix_of(n->rank, n->shape, dims);
    return cg_as(g, cg_value(g, f, &ix), a->t);
}

/* sum over c < len of x(head_x, row_x, c) * y(head_y, row_y, c) */
static int cg_attn_dot(CG *g, const CGAttn *a, int x, int hx, int rx, int y, int hy, int ry, int64_t len) {
    int s = kb_acc(g->b, a->t, K_ADD, 0.0);
    int c = kb_loop(g->b, len);
    kb_accum(g->b, s, cg_op2(g, K_MUL, a->t, cg_attn_at(g, a, x, hx, rx, c), cg_attn_at(g, a, y, hy, ry, c)));
    kb_endloop(g->b);
    return s;
}

/* The number of keys query row i sees: all S, or j <= i + (S - T) when causal. */
static int cg_attn_visible(CG *g, const CGAttn *a, int i) {
    if (!a->causal) return cg_i(g, a->S);
    int last = cg_op2(g, K_MIN, KT_I64, cg_iadd(g, i, cg_i(g, a->S - a->T)), cg_i(g, a->S - 1));
    return cg_op2(g, K_MAX, KT_I64, cg_iadd(g, last, cg_i(g, 1)), cg_i(g, 0));
}

/* Decomposes gid over shape[0 .. r-2): the batch coordinates into a->bd, then head and row. */
static void cg_attn_row(CG *g, CGAttn *a, const FNode *like, int *head, int *row) {
    KIdx ix;
    int64_t shape[GRAPH_MAX_RANK] = {0};
    for (int i = 0; i < a->r - 1; i++) shape[i] = like->shape[i];
    ix_init(&ix, a->r - 1, shape);
    ix.flat = kb_gid(g->b);
    for (int i = 0; i < a->r - 3; i++) a->bd[i] = ix_dim(g, &ix, i);
    *head = ix_dim(g, &ix, a->r - 3);
    *row = ix_dim(g, &ix, a->r - 2);
    g->k->grid = fuse_numel(like) / like->shape[a->r - 1];
}

/* When member f is a chain of permutes and reshapes of node o: its links from f down to (not
 * including) o into chain[], and their number; else -1. */
static int cg_view_chain(CG *g, int o, int f, int chain[64]) {
    int nc = 0, x = f;
    while (x != o && nc < 64) {
        const FNode *n = cg_n(g, x);
        if (n->op != F_PERMUTE && n->op != F_RESHAPE) break;
        chain[nc++] = x;
        x = n->in[0];
    }
    return x == o ? nc : -1;
}

/* Where the kernel's dedicated output node o is stored for index ix of o: its own buffer, or the
 * buffer of a member that is a chain of permutes and reshapes of it (o is then not stored).
 * Returns the number of places. */
static int cg_out_places(CG *g, int o, KIdx *ix, int *bufs, int *offs) {
    int np = 0;
    const FKern *K = g->K;
    if (g->c->mat[o]) {
        bufs[np] = cg_buf(g, o, 1);
        offs[np++] = ix_flat(g, ix);
    }
    for (int m = 0; m < K->members.n && np < 4; m++) {
        int f = K->members.v[m];
        int chain[64], nc = f == o || !g->c->mat[f] ? -1 : cg_view_chain(g, o, f, chain);
        if (nc < 0) continue;
        KIdx cur = *ix;
        for (int i = nc - 1; i >= 0; i--) { /* from o up to the member */
            const FNode *n = cg_n(g, chain[i]);
            if (n->op == F_RESHAPE) {
                cur = ix_reshape(g, &cur, n->rank, n->shape);
            } else {
                int dims[GRAPH_MAX_RANK] = {0};
                for (int d = 0; d < n->rank; d++) {
                    int s = d == n->ia[0] ? (int)n->ia[1] : d == n->ia[1] ? (int)n->ia[0] : d;
                    dims[d] = ix_dim(g, &cur, s);
                }
                cur = ix_of(n->rank, n->shape, dims);
            }
        }
        bufs[np] = cg_buf(g, f, 1);
        offs[np++] = ix_flat(g, &cur);
    }
    if (!np) cg_fail(g, "a dedicated kernel with nowhere to store its result");
    return np;
}

/* out(head, row, col) of node o: zero it, add to it, scale it (rows are owned by one work item,
 * so the result buffer itself is the accumulator). */
static void cg_out_put(CG *g, const CGAttn *a, int o, int head, int row, int col, int v, KOp how) {
    const FNode *n = cg_n(g, o);
    int dims[GRAPH_MAX_RANK] = {0};
    for (int i = 0; i < a->r - 3; i++) dims[i] = a->bd[i];
    dims[a->r - 3] = head;
    dims[a->r - 2] = row;
    dims[a->r - 1] = col;
    KIdx ix = ix_of(n->rank, n->shape, dims);
    int bufs[4], offs[4];
    int np = cg_out_places(g, o, &ix, bufs, offs);
    if (!np) return;
    int nv = v;
    if (how != K_NONE) nv = cg_op2(g, how, a->t, cg_as(g, kb_load(g->b, bufs[0], offs[0]), a->t), v);
    nv = cg_as(g, nv, cg_t(n)); /* f16/bf16 results: rounded as the store rounds */
    for (int i = 0; i < np; i++) kb_store(g->b, bufs[i], offs[i], nv);
}

/* ---- attention's layout (Kernel.attn) ------------------------------------------------------------ */

/* A node's elements as a strided view of a buffer: element (i0, i1, ...) at
 * off + sum i_d * stride[d]. */
typedef struct CGLayout {
    int rank;
    int64_t off;
    int64_t shape[GRAPH_MAX_RANK], stride[GRAPH_MAX_RANK];
} CGLayout;

static void lay_rowmajor(CGLayout *L, int rank, const int64_t *shape) {
    L->rank = rank;
    L->off = 0;
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        L->shape[d] = shape[d];
        L->stride[d] = s;
        s *= shape[d];
    }
}

static void lay_swap(CGLayout *L, int a, int b) {
    int64_t t = L->shape[a];
    L->shape[a] = L->shape[b];
    L->shape[b] = t;
    t = L->stride[a];
    L->stride[a] = L->stride[b];
    L->stride[b] = t;
}

/* The same elements seen with another shape, grouped as ix_reshape groups them: a group of
 * several axes must be contiguous in `in` (each axis's stride its inner neighbour's times that
 * one's size). Returns 0 when one is not: the reshape is then no strided view. */
static int lay_reshape(const CGLayout *in, int rank, const int64_t *shape, CGLayout *out) {
    out->rank = rank;
    out->off = in->off;
    for (int d = 0; d < rank; d++) {
        out->shape[d] = shape[d];
        out->stride[d] = 0;
    }
    ReshapeGroup groups[GRAPH_MAX_RANK];
    int ng = reshape_groups(in->rank, in->shape, rank, shape, groups);
    if (ng < 0) return 0;
    for (int q = 0; q < ng; q++) {
        const int *gi = groups[q].gi, *gj = groups[q].gj, ni = groups[q].ni, nj = groups[q].nj;
        for (int k = 0; k + 1 < ni; k++)
            if (in->stride[gi[k]] != in->stride[gi[k + 1]] * in->shape[gi[k + 1]]) return 0;
        int64_t inner = in->stride[gi[ni - 1]];
        for (int k = nj - 1; k >= 0; k--) {
            out->stride[gj[k]] = inner;
            inner *= shape[gj[k]];
        }
    }
    return 1;
}

/* The layout of node f over the buffer it is read from (*param): f itself when this kernel loads
 * it, else the pure views this kernel computes it by. 0 when it is computed otherwise or a view
 * on the way is not strided. */
static int cg_layout_in(CG *g, int f, CGLayout *L, int *param) {
    const FNode *n = cg_n(g, f);
    if (!cg_computes(g, f)) {
        *param = cg_buf(g, f, 0);
        lay_rowmajor(L, n->rank, n->shape);
        return 1;
    }
    if (n->op != F_RESHAPE && n->op != F_PERMUTE && n->op != F_SLICE && n->op != F_EXPAND) return 0;
    CGLayout in;
    if (!cg_layout_in(g, n->in[0], &in, param)) return 0;
    switch (n->op) {
    case F_RESHAPE: return lay_reshape(&in, n->rank, n->shape, L);
    case F_PERMUTE:
        *L = in;
        lay_swap(L, (int)n->ia[0], (int)n->ia[1]);
        return 1;
    case F_SLICE:
        *L = in;
        L->off += n->ia[1] * in.stride[n->ia[0]];
        L->shape[n->ia[0]] = n->shape[n->ia[0]];
        return 1;
    default: /* F_EXPAND, right-aligned: new axes and size-1 axes broadcast with stride 0 */
        L->rank = n->rank;
        L->off = in.off;
        for (int d = 0; d < n->rank; d++) {
            int id = d - (n->rank - in.rank);
            L->shape[d] = n->shape[d];
            L->stride[d] = id < 0 || in.shape[id] == 1 ? 0 : in.stride[id];
        }
        return 1;
    }
}

/* A [..., heads, rows, cols] layout as a KView: the leading axes merged into one (0 when their
 * strides do not allow it). */
static int cg_kview(const CGLayout *L, int param, KView *v) {
    int r = L->rank;
    int64_t zs = 0, prod = 1;
    int any = 0;
    for (int i = r - 4; i >= 0; i--) {
        if (L->shape[i] == 1) continue;
        if (!any) zs = L->stride[i], any = 1;
        else if (L->stride[i] != zs * prod) return 0;
        prod *= L->shape[i];
    }
    v->param = param;
    v->offset = L->off;
    v->stride[0] = zs;
    for (int i = 0; i < 3; i++) v->stride[i + 1] = L->stride[r - 3 + i];
    return 1;
}

static int cg_kview_of(CG *g, int f, KView *v) {
    CGLayout L;
    int param = -1;
    return cg_layout_in(g, f, &L, &param) && cg_kview(&L, param, v);
}

/* The places cg_out_places stores result o at, as views (out[0 .. *nout)): o's own buffer, and
 * each member that is a permute/reshape chain of o seen back through the chain. 0 when one is not
 * strided. */
static int cg_out_views(CG *g, int o, KView *out, int *nout) {
    const FNode *on = cg_n(g, o);
    CGLayout L;
    *nout = 0;
    if (g->c->mat[o]) {
        lay_rowmajor(&L, on->rank, on->shape);
        if (!cg_kview(&L, cg_buf(g, o, 1), &out[(*nout)++])) return 0;
    }
    const FKern *K = g->K;
    for (int m = 0; m < K->members.n && *nout < 4; m++) {
        int f = K->members.v[m];
        int chain[64], nc = f == o || !g->c->mat[f] ? -1 : cg_view_chain(g, o, f, chain);
        if (nc < 0) continue;
        lay_rowmajor(&L, cg_n(g, f)->rank, cg_n(g, f)->shape);
        for (int i = 0; i < nc; i++) { /* from the member down to o */
            const FNode *n = cg_n(g, chain[i]), *in = cg_n(g, n->in[0]);
            if (n->op == F_PERMUTE) {
                lay_swap(&L, (int)n->ia[0], (int)n->ia[1]);
            } else {
                CGLayout t;
                if (!lay_reshape(&L, in->rank, in->shape, &t)) return 0;
                L = t;
            }
        }
        if (!cg_kview(&L, cg_buf(g, f, 1), &out[(*nout)++])) return 0;
    }
    return *nout > 0;
}

/* Kernel.attn for attention op n (KA_*; with KA_BWD_KV, n is dk's node and dv its partner's), when
 * every operand and result is a strided view and the kernel computes nothing else; otherwise it
 * stays NULL and the body is the kernel. */
static void cg_attn_describe(CG *g, const FNode *n, const FNode *dv, const CGAttn *a, KAttnOp op) {
    const FuseCtx *c = g->c;
    KAttn *d = arena_alloc(g->ar, sizeof *d);
    memset(d, 0, sizeof *d);
    d->op = op;
    d->dt = n->dt;
    const FNode *q = cg_n(g, a->q);
    d->Z = 1;
    for (int i = 0; i < a->r - 3; i++) d->Z *= q->shape[i];
    d->H = a->H, d->Hk = a->Hk, d->T = a->T, d->S = a->S, d->D = a->D, d->E = a->E;
    d->causal = a->causal;
    d->scale = a->scale;
    d->dout.param = d->stats.param = -1;
    int ops[4] = {a->q, a->k, a->v, a->dout};
    KView *views[4] = {&d->q, &d->k, &d->v, &d->dout};
    for (int i = 0; i < 4; i++) {
        if (ops[i] < 0) continue;
        if (cg_n(g, ops[i])->dt != n->dt || !cg_kview_of(g, ops[i], views[i])) return;
    }
    if (!cg_out_views(g, n->id, d->out, &d->nout)) return;
    if (dv && !cg_out_views(g, dv->id, d->out_v, &d->nout_v)) return;
    int others = 0; /* members besides n (and dv), the statistics and the views of results it stores */
    for (int m = 0; m < g->K->members.n; m++) {
        int f = g->K->members.v[m];
        if (f == n->id || f == a->stats || (dv && f == dv->id)) continue;
        const FNode *x = cg_n(g, f);
        others += (x->op != F_PERMUTE && x->op != F_RESHAPE) || !c->mat[f];
    }
    if (others) return;
    if (a->stats >= 0) {
        const FNode *st = cg_n(g, a->stats);
        CGLayout L;
        lay_rowmajor(&L, st->rank, st->shape);
        d->stats_computed = op == KA_BWD_Q && c->owner[a->stats] == g->kid;
        if (!d->stats_computed || c->mat[a->stats])
            if (st->dt != DT_F32 || !cg_kview(&L, cg_buf(g, a->stats, d->stats_computed), &d->stats)) return;
    }
    g->k->attn = d;
}

/* Forward: ref.c's ref_eval_attention, one query row per work item. */
static void cg_attention(CG *g, const FNode *n) {
    CGAttn a;
    cg_attn_init(g, n, 0, &a);
    int h, t;
    cg_attn_row(g, &a, n, &h, &t);
    int kh = cg_op2(g, K_IDIV, KT_I64, h, cg_i(g, a.G));
    int cnt = cg_attn_visible(g, &a, t);
    int c = kb_loop(g->b, a.E);
    cg_out_put(g, &a, n->id, h, t, c, cg_f(g, a.t, 0.0), K_NONE);
    kb_endloop(g->b);
    int m = kb_acc(g->b, a.t, K_MAX, -INFINITY);
    int j = kb_loop_dyn(g->b, cnt);
    int s = cg_attn_dot(g, &a, a.q, h, t, a.k, kh, j, a.D);
    kb_accum(g->b, m, cg_op2(g, K_MUL, a.t, cg_f(g, a.t, a.scale), s));
    kb_endloop(g->b);
    int sum = kb_acc(g->b, a.t, K_ADD, 0.0);
    j = kb_loop_dyn(g->b, cnt);
    s = cg_attn_dot(g, &a, a.q, h, t, a.k, kh, j, a.D);
    int p = cg_op1(g, K_EXP, a.t, cg_op2(g, K_SUB, a.t, cg_op2(g, K_MUL, a.t, cg_f(g, a.t, a.scale), s), m));
    kb_accum(g->b, sum, p);
    c = kb_loop(g->b, a.E);
    cg_out_put(g, &a, n->id, h, t, c, cg_op2(g, K_MUL, a.t, p, cg_attn_at(g, &a, a.v, kh, j, c)), K_ADD);
    kb_endloop(g->b);
    kb_endloop(g->b);
    if (a.causal) kb_if(g->b, cg_op2(g, K_GT, KT_BOOL, cnt, cg_i(g, 0))); /* a row that sees no key stays zero */
    c = kb_loop(g->b, a.E);
    cg_out_put(g, &a, n->id, h, t, c, sum, K_DIV);
    kb_endloop(g->b);
    if (a.causal) kb_endif(g->b);
    cg_attn_describe(g, n, NULL, &a, KA_FORWARD);
}

/* P_ij for query row (h, i) against key j, given the row's max and sum. */
static int cg_attn_p(CG *g, const CGAttn *a, int h, int i, int kh, int j, int m, int sum) {
    int s = cg_op2(g, K_MUL, a->t, cg_attn_dot(g, a, a->q, h, i, a->k, kh, j, a->D), cg_f(g, a->t, a->scale));
    return cg_op2(g, K_DIV, a->t, cg_op1(g, K_EXP, a->t, cg_op2(g, K_SUB, a->t, s, m)), sum);
}

/* The statistics of query row (h, i): m = max_j s_ij, sum = sum_j exp(s_ij - m),
 * pdp = sum_j P_ij dP_ij with dP_ij = dout_i . v_j (ref_bwd.c's ref_attn_row). */
static void cg_attn_stats_compute(CG *g, const CGAttn *a, int h, int i, int kh, int out[3]) {
    int cnt = cg_attn_visible(g, a, i);
    int m = kb_acc(g->b, a->t, K_MAX, -INFINITY);
    int j = kb_loop_dyn(g->b, cnt);
    kb_accum(g->b, m, cg_op2(g, K_MUL, a->t, cg_attn_dot(g, a, a->q, h, i, a->k, kh, j, a->D), cg_f(g, a->t, a->scale)));
    kb_endloop(g->b);
    int sum = kb_acc(g->b, a->t, K_ADD, 0.0);
    j = kb_loop_dyn(g->b, cnt);
    int s = cg_op2(g, K_MUL, a->t, cg_attn_dot(g, a, a->q, h, i, a->k, kh, j, a->D), cg_f(g, a->t, a->scale));
    kb_accum(g->b, sum, cg_op1(g, K_EXP, a->t, cg_op2(g, K_SUB, a->t, s, m)));
    kb_endloop(g->b);
    int pdp = kb_acc(g->b, a->t, K_ADD, 0.0);
    j = kb_loop_dyn(g->b, cnt);
    int p = cg_attn_p(g, a, h, i, kh, j, m, sum);
    int dp = cg_attn_dot(g, a, a->dout, h, i, a->v, kh, j, a->E);
    kb_accum(g->b, pdp, cg_op2(g, K_MUL, a->t, p, dp));
    kb_endloop(g->b);
    out[0] = m;
    out[1] = sum;
    out[2] = pdp;
}

/* The statistics of query row (h, i) read from their buffer. */
static void cg_attn_stats_load(CG *g, const CGAttn *a, int h, int i, int out[3]) {
    for (int s = 0; s < 3; s++) out[s] = cg_attn_at(g, a, a->stats, h, i, cg_i(g, s));
}

static void cg_attn_stats_store(CG *g, const CGAttn *a, int h, int i, const int st[3]) {
    if (!g->c->mat[a->stats]) return;
    const FNode *n = cg_n(g, a->stats);
    for (int s = 0; s < 3; s++) {
        int dims[GRAPH_MAX_RANK] = {0};
        for (int d = 0; d < a->r - 3; d++) dims[d] = a->bd[d];
        dims[a->r - 3] = h;
        dims[a->r - 2] = i;
        dims[a->r - 1] = cg_i(g, s);
        KIdx ix = ix_of(n->rank, n->shape, dims);
        cg_store(g, a->stats, &ix, st[s]);
    }
}

/* The statistics alone (when no backward of q computes them). */
static void cg_attention_stats(CG *g, const FNode *n) {
    CGAttn a;
    cg_attn_init(g, n, 1, &a);
    a.stats = n->id;
    int h, i;
    cg_attn_row(g, &a, cg_n(g, a.q), &h, &i);
    int kh = cg_op2(g, K_IDIV, KT_I64, h, cg_i(g, a.G));
    int st[3];
    cg_attn_stats_compute(g, &a, h, i, kh, st);
    cg_attn_stats_store(g, &a, h, i, st);
}

/* dq_i = scale * sum_j dS_ij k_j with dS_ij = P_ij (dP_ij - pdp_i); one query row a work item. */
static void cg_attention_bwd_q(CG *g, const FNode *n) {
    CGAttn a;
    cg_attn_init(g, n, 1, &a);
    int h, i;
    cg_attn_row(g, &a, n, &h, &i);
    int kh = cg_op2(g, K_IDIV, KT_I64, h, cg_i(g, a.G));
    int st[3];
    if (g->c->owner[a.stats] == g->kid) {
        cg_attn_stats_compute(g, &a, h, i, kh, st);
        cg_attn_stats_store(g, &a, h, i, st);
    } else {
        cg_attn_stats_load(g, &a, h, i, st);
    }
    int d = kb_loop(g->b, a.D);
    cg_out_put(g, &a, n->id, h, i, d, cg_f(g, a.t, 0.0), K_NONE);
    kb_endloop(g->b);
    int j = kb_loop_dyn(g->b, cg_attn_visible(g, &a, i));
    int p = cg_attn_p(g, &a, h, i, kh, j, st[0], st[1]);
    int dp = cg_attn_dot(g, &a, a.dout, h, i, a.v, kh, j, a.E);
    int ds = cg_op2(g, K_MUL, a.t, p, cg_op2(g, K_SUB, a.t, dp, st[2]));
    int w = cg_op2(g, K_MUL, a.t, cg_f(g, a.t, a.scale), ds);
    d = kb_loop(g->b, a.D);
    cg_out_put(g, &a, n->id, h, i, d, cg_op2(g, K_MUL, a.t, w, cg_attn_at(g, &a, a.k, kh, j, d)), K_ADD);
    kb_endloop(g->b);
    kb_endloop(g->b);
    cg_attn_describe(g, n, NULL, &a, KA_BWD_Q);
}

/* dk_j = scale * sum dS_ij q_i and dv_j = sum P_ij dout_i over the query heads of key head kh
 * and the query rows i that see key j; one key row a work item. A kernel holding both (rule 8)
 * computes P_ij once for the two. */
static void cg_attention_bwd_kv(CG *g, const FNode *n) {
    const FNode *nk = NULL, *nv = NULL;
    for (int m = 0; m < g->K->members.n; m++) {
        const FNode *x = cg_n(g, g->K->members.v[m]);
        if (x->op == F_ATTN_BWD_K) nk = x;
        if (x->op == F_ATTN_BWD_V) nv = x;
    }
    CGAttn a;
    cg_attn_init(g, n, 1, &a);
    int kh, j;
    cg_attn_row(g, &a, n, &kh, &j);
    const FNode *outs[2] = {nk, nv};
    int64_t widths[2] = {a.D, a.E};
    for (int o = 0; o < 2; o++) {
        if (!outs[o]) continue;
        int d = kb_loop(g->b, widths[o]);
        cg_out_put(g, &a, outs[o]->id, kh, j, d, cg_f(g, a.t, 0.0), K_NONE);
        kb_endloop(g->b);
    }
    int gi = kb_loop(g->b, a.G);
    int h = cg_iadd(g, cg_imul(g, kh, cg_i(g, a.G)), gi);
    int first = cg_i(g, 0); /* the first query row that sees key j */
    if (a.causal) first = cg_op2(g, K_MAX, KT_I64, cg_isub(g, j, cg_i(g, a.S - a.T)), cg_i(g, 0));
    int ii = kb_loop_dyn(g->b, cg_isub(g, cg_i(g, a.T), first));
    int i = cg_iadd(g, first, ii);
    int st[3];
    cg_attn_stats_load(g, &a, h, i, st);
    int p = cg_attn_p(g, &a, h, i, kh, j, st[0], st[1]);
    if (nk) {
        int dp = cg_attn_dot(g, &a, a.dout, h, i, a.v, kh, j, a.E);
        int w = cg_op2(g, K_MUL, a.t, cg_f(g, a.t, a.scale), cg_op2(g, K_MUL, a.t, p, cg_op2(g, K_SUB, a.t, dp, st[2])));
        int d = kb_loop(g->b, a.D);
        cg_out_put(g, &a, nk->id, kh, j, d, cg_op2(g, K_MUL, a.t, w, cg_attn_at(g, &a, a.q, h, i, d)), K_ADD);
        kb_endloop(g->b);
    }
    if (nv) {
        int e = kb_loop(g->b, a.E);
        cg_out_put(g, &a, nv->id, kh, j, e, cg_op2(g, K_MUL, a.t, p, cg_attn_at(g, &a, a.dout, h, i, e)), K_ADD);
        kb_endloop(g->b);
    }
    kb_endloop(g->b);
    kb_endloop(g->b);
    if (nk && nv) cg_attn_describe(g, nk, nv, &a, KA_BWD_KV);
    else cg_attn_describe(g, n, NULL, &a, nk ? KA_BWD_K : KA_BWD_V);
}

/* ---- dedicated kernels: topk and scatter_add ----------------------------------------------------- */

/* One row of the selected axis a work item. Element j's rank is the number of elements before it
 * (larger, NaN above any number, equal ones earlier); rank < k goes to position rank. */
static void cg_topk(CG *g, const FNode *n) {
    const FNode *x = cg_n(g, n->in[0]);
    int axis = (int)n->ia[1];
    int64_t k = n->ia[0], len = x->shape[axis];
    int64_t rows_shape[GRAPH_MAX_RANK] = {0};
    for (int a = 0; a < x->rank; a++) rows_shape[a] = a == axis ? 1 : x->shape[a];
    KIdx rix;
    ix_init(&rix, x->rank, rows_shape);
    rix.flat = kb_gid(g->b);
    int dims[GRAPH_MAX_RANK] = {0};
    for (int a = 0; a < x->rank; a++) dims[a] = ix_dim(g, &rix, a);
    g->k->grid = fuse_numel(x) / len;
    int j = kb_loop(g->b, len);
    dims[axis] = j;
    KIdx jx = ix_of(x->rank, x->shape, dims);
    int xj = cg_value(g, x->id, &jx);
    int rank = kb_acc(g->b, KT_I64, K_ADD, 0.0);
    int l = kb_loop(g->b, len);
    dims[axis] = l;
    KIdx lx = ix_of(x->rank, x->shape, dims);
    int xl = cg_value(g, x->id, &lx);
    int nan_l = cg_op2(g, K_NE, KT_BOOL, xl, xl), nan_j = cg_op2(g, K_NE, KT_BOOL, xj, xj);
    int above = cg_op2(g, K_OR, KT_BOOL, cg_op2(g, K_AND, KT_BOOL, nan_l, cg_op1(g, K_NOT, KT_BOOL, nan_j)),
                       cg_op2(g, K_GT, KT_BOOL, xl, xj));
    int tie = cg_op2(g, K_OR, KT_BOOL, cg_op2(g, K_EQ, KT_BOOL, xl, xj), cg_op2(g, K_AND, KT_BOOL, nan_l, nan_j));
    int before = cg_op2(g, K_OR, KT_BOOL, above, cg_op2(g, K_AND, KT_BOOL, tie, cg_op2(g, K_LT, KT_BOOL, l, j)));
    kb_accum(g->b, rank, cg_op3(g, K_SELECT, KT_I64, before, cg_i(g, 1), cg_i(g, 0)));
    kb_endloop(g->b);
    kb_if(g->b, cg_op2(g, K_LT, KT_BOOL, rank, cg_i(g, k)));
    dims[axis] = rank;
    KIdx ox = ix_of(n->rank, n->shape, dims);
    int v = n->ia[2] ? cg_op1(g, K_CAST, cg_t(n), j) : xj;
    cg_store(g, n->id, &ox, v);
    kb_endif(g->b);
    kb_endloop(g->b);
}

/* out [R, ...] = zeros, then row idx[p] += updates[p] for every p in order; one column of the
 * rows a work item (ref_bwd.c's ref_scatter_add, the same order of additions). */
static void cg_scatter_add(CG *g, const FNode *n) {
    const FNode *upd = cg_n(g, n->in[0]), *idx = cg_n(g, n->in[1]);
    int64_t R = n->shape[0], width = fuse_numel(n) / R, P = fuse_numel(idx);
    KType t = cg_t(n);
    int col = kb_gid(g->b);
    g->k->grid = width;
    int buf = cg_buf(g, n->id, 1);
    int r = kb_loop(g->b, R);
    kb_store(g->b, buf, cg_iadd(g, cg_imul(g, r, cg_i(g, width)), col), cg_f(g, t, 0.0));
    kb_endloop(g->b);
    int p = kb_loop(g->b, P);
    KIdx pix;
    ix_init(&pix, idx->rank, idx->shape);
    pix.flat = p;
    int row = cg_index(g, idx->id, &pix, R);
    KIdx uix;
    ix_init(&uix, upd->rank, upd->shape);
    uix.flat = cg_iadd(g, cg_imul(g, p, cg_i(g, width)), col);
    int v = cg_value(g, upd->id, &uix);
    int off = cg_iadd(g, cg_imul(g, row, cg_i(g, width)), col);
    kb_store(g->b, buf, off, cg_op2(g, K_ADD, t, kb_load(g->b, buf, off), v));
    kb_endloop(g->b);
}

/* The per-parameter L2 norm of an update graph's flat vector, broadcast over the parameter: one
 * segment (and one work item) per parameter, which also zeroes the padding after it. */
static void cg_seg_norm(CG *g, const FNode *n) {
    const GraphUpdate *u = g->c->g->update;
    const FNode *x = cg_n(g, n->in[0]);
    if (!u || n->rank != 1 || n->shape[0] != u->n) INTERNAL("fuse: seg_norm outside an update graph");
    KType t = cg_t(n);
    int gid = kb_gid(g->b);
    g->k->grid = u->nsegs > 0 ? u->nsegs : 1;
    g->k->nsegments = g->k->grid;
    for (int s = 0; s < u->nsegs; s++) {
        int64_t off = u->seg_off[s], len = u->seg_len[s], end = s + 1 < u->nsegs ? u->seg_off[s + 1] : u->n;
        kb_if(g->b, cg_op2(g, K_EQ, KT_BOOL, gid, cg_i(g, s)));
        int acc = kb_acc(g->b, t, K_ADD, 0.0);
        int j = kb_loop(g->b, len);
        KIdx ix;
        ix_init(&ix, x->rank, x->shape);
        ix.flat = cg_iadd(g, cg_i(g, off), j);
        int v = cg_value(g, x->id, &ix);
        kb_accum(g->b, acc, cg_op2(g, K_MUL, t, v, v));
        kb_endloop(g->b);
        int norm = cg_op1(g, K_SQRT, t, acc);
        int buf = cg_buf(g, n->id, 1);
        j = kb_loop(g->b, len);
        kb_store(g->b, buf, cg_iadd(g, cg_i(g, off), j), norm);
        kb_endloop(g->b);
        int64_t pad_from[2] = {off + len, 0}, pad_to[2] = {end, s == 0 ? off : 0};
        for (int p = 0; p < 2; p++) {
            if (pad_to[p] <= pad_from[p]) continue;
            j = kb_loop(g->b, pad_to[p] - pad_from[p]);
            kb_store(g->b, buf, cg_iadd(g, cg_i(g, pad_from[p]), j), cg_f(g, t, 0.0));
            kb_endloop(g->b);
        }
        kb_endif(g->b);
    }
}

/* ---- the kernel ------------------------------------------------------------------------------------ */

static KKind cg_kind(const FuseCtx *c, const FKern *K, const FNode **main) {
    *main = NULL;
    if (K->kind == FK_ELEM) return KK_ELEMENTWISE;
    if (K->kind == FK_REDUCE) {
        int64_t keptn = 1;
        int suffix = 1;
        for (int a = 0, seen = 0; a < K->rank; a++) {
            if (K->mask & (1u << a)) seen = 1;
            else {
                keptn *= K->shape[a];
                if (seen && K->shape[a] != 1) suffix = 0;
            }
        }
        return suffix && keptn > 1 ? KK_ROW : KK_REDUCE;
    }
    for (int i = 0; i < K->members.n; i++) { /* the dedicated op (the statistics only if alone) */
        const FNode *n = c->fg->node[K->members.v[i]];
        if (n->op >= F_ATTN && n->op <= F_SEG_NORM && (!*main || (*main)->op == F_ATTN_STATS)) *main = n;
    }
    if (!*main) INTERNAL("fuse: a dedicated kernel without its op");
    switch ((*main)->op) {
    case F_TOPK: return KK_TOPK;
    case F_SCATTER_ADD: return KK_SCATTER;
    case F_SEG_NORM: return KK_REDUCE;
    default: return KK_ATTENTION;
    }
}

Kernel *fuse_gen_kernel(FuseCtx *c, int kid, Arena *ar, const char **why) {
    FKern *K = &c->k[kid];
    if (K->kind == FK_GEMM) INTERNAL("fuse: fuse_codegen of a GEMM");
    const FNode *main;
    KKind kind = cg_kind(c, K, &main);
    Kernel *k = kir_new(ar, NULL, kind, 1);
    CG g = {.c = c, .kid = kid, .K = K, .ar = ar, .k = k};
    g.b = kb_new(ar, k);
    if (K->kind == FK_ELEM) {
        cg_elementwise(&g);
    } else if (K->kind == FK_REDUCE) {
        g.red = 1;
        g.acc = arena_alloc(ar, sizeof(int) * (size_t)c->n);
        g.done = arena_alloc(ar, (size_t)c->n);
        g.dep = arena_alloc(ar, sizeof(int) * (size_t)c->n);
        cg_reduction(&g);
    } else {
        switch (main->op) {
        case F_ATTN: cg_attention(&g, main); break;
        case F_ATTN_STATS: cg_attention_stats(&g, main); break;
        case F_ATTN_BWD_Q: cg_attention_bwd_q(&g, main); break;
        case F_ATTN_BWD_K:
        case F_ATTN_BWD_V: cg_attention_bwd_kv(&g, main); break;
        case F_TOPK: cg_topk(&g, main); break;
        case F_SCATTER_ADD: cg_scatter_add(&g, main); break;
        case F_SEG_NORM: cg_seg_norm(&g, main); break;
        default: INTERNAL("fuse: no kernel for %s", fuse_fop_name(main->op));
        }
    }
    if (g.why) {
        if (why) *why = g.why;
        return NULL;
    }
    if (kb_depth(g.b) != 0) INTERNAL("fuse: kernel %d left a loop open", kid);
    kir_finish(k);
    return k;
}

/* ---- what a kernel computes, for the listing ---------------------------------------------------- */

int fuse_kernel_nodes(FuseCtx *c, int kid, int **nodes, Arena *ar) {
    const Graph *gr = c->g;
    const FKern *K = &c->k[kid];
    unsigned char *in = arena_alloc(ar, (size_t)c->n + 1);
    for (int i = 0; i < K->members.n; i++) in[K->members.v[i]] = 1;
    for (int i = 0; i < K->inl.n; i++) in[K->inl.v[i]] = 2;
    unsigned char *want = arena_alloc(ar, (size_t)gr->n + 1);
    for (int id = 0; id < gr->n; id++) {
        int f = c->fg->g2f[id];
        if (f >= 0 && in[f] && (gr->node[id]->op != G_CONST || in[f] == 1)) want[id] = 1; /* constants: when stored */
        if (c->fg->absorbed[id] >= 0 && in[c->fg->absorbed[id]]) want[id] = 1;
    }
    for (int i = 0; i < K->members.n; i++) {
        int gid = c->fg->node[K->members.v[i]]->gid;
        if (gid >= 0 && gid < gr->n) want[gid] = 1;
    }
    int cnt = 0;
    for (int id = 0; id < gr->n; id++) cnt += want[id];
    *nodes = arena_alloc(ar, sizeof(int) * (size_t)(cnt ? cnt : 1));
    cnt = 0;
    for (int id = 0; id < gr->n; id++)
        if (want[id]) (*nodes)[cnt++] = id;
    return cnt;
}
