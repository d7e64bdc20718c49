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
 *   dedicated    attention (forward, row statistics, backward of q, k, v), topk, scatter_add, ce_stats:
 *                written out in fuse_codegen_dedicated.c, as ref.c and ref_bwd.c compute them. */
#include "fuse_cg.h"

#include <math.h>
#include <string.h>

/* ---- state ------------------------------------------------------------------------------------- */

/* A failure: on trial it is remembered (the merge being tried is then refused) and generation
 * finishes the kernel with zero values in place of what could not be computed; in the final
 * generation it is a compiler bug, so a kernel that runs never contains such a value. */
void cg_fail(CG *g, const char *why) {
    if (g->c->final) INTERNAL("fuse: kernel %d: %s", g->kid, why);
    if (!g->why) g->why = why;
}

/* v clamped to [lo, hi] (i64), each side only when it is needed. */
static int cg_clamp(CG *g, int v, int64_t lo, int64_t hi, int need_lo, int need_hi) {
    if (need_lo) v = cg_op2(g, K_MAX, KT_I64, v, cg_i(g, lo));
    if (need_hi) v = cg_op2(g, K_MIN, KT_I64, v, cg_i(g, hi));
    return v;
}

/* ---- indices ------------------------------------------------------------------------------------ */

void ix_init(KIdx *ix, int rank, const int64_t *shape) {
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

int ix_dim(CG *g, KIdx *ix, int d) {
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
int ix_flat(CG *g, KIdx *ix) {
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

/* The groups into out[]; their number, or -1 when the element counts differ. */
int reshape_groups(int ra, const int64_t *a, int rb, const int64_t *b, ReshapeGroup *out) {
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
KIdx ix_reshape(CG *g, KIdx *ix, int rank, const int64_t *shape) {
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
KIdx ix_of(int rank, const int64_t *shape, const int *dims) {
    KIdx o;
    ix_init(&o, rank, shape);
    for (int d = 0; d < rank; d++) o.dim[d] = dims[d];
    return o;
}

/* ---- buffers ------------------------------------------------------------------------------------ */

int cg_buf(CG *g, int f, int written) {
    const FNode *n = cg_n(g, f);
    int buffer = g->c->buf_of ? g->c->buf_of[f] : -1;
    if (g->c->final && buffer < 0) INTERNAL("fuse: kernel %d uses node %d, which has no buffer", g->kid, f);
    int node = n->op == F_LEAF ? (int)n->ia[0] : -1;
    if (g->c->final && g->c->buf_node) node = g->c->buf_node[buffer];
    return kb_buf(g->b, f, buffer, node, n->dt, n->rank, n->shape, written);
}

static int cg_load(CG *g, int f, KIdx *ix) { return kb_load(g->b, cg_buf(g, f, 0), ix_flat(g, ix)); }

void cg_store(CG *g, int f, KIdx *ix, int v) {
    if (!g->c->mat[f]) return;
    kb_store(g->b, cg_buf(g, f, 1), ix_flat(g, ix), v);
}

/* ---- values ------------------------------------------------------------------------------------- */

/* Computed here (a member, or inlined) rather than loaded. */
int cg_computes(const CG *g, int f) {
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

/* ---- dropout's mask: Philox4x32-10 on u64 values holding 32-bit words (graph.h, GRAPH_RNG_WORDS) */

static int cg_u64(CG *g, uint64_t v) { return kb_const_i(g->b, KT_U64, (int64_t)v); }

/* v mod 2^32 of a u64 value (the kernel IR has no bitwise and on u64). */
static int cg_lo32(CG *g, int v) {
    int hi = cg_op2(g, K_SHR, KT_U64, v, cg_u64(g, 32));
    return cg_op2(g, K_SUB, KT_U64, v, cg_op2(g, K_MUL, KT_U64, hi, cg_u64(g, (uint64_t)1 << 32)));
}

/* The first output word of Philox4x32-10 (ref.c's ref_philox4x32, runtime/base/rng.c's
 * rt_philox4x32) of counter c and key k, each word a u64 value below 2^32. The products of two
 * 32-bit words are exact in u64, so each round is two multiplications, their high and low
 * halves, and xors. */
static int cg_philox_word0(CG *g, int c[4], int k[2]) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k[0] = cg_lo32(g, cg_op2(g, K_ADD, KT_U64, k[0], cg_u64(g, 0x9E3779B9u)));
            k[1] = cg_lo32(g, cg_op2(g, K_ADD, KT_U64, k[1], cg_u64(g, 0xBB67AE85u)));
        }
        int p0 = cg_op2(g, K_MUL, KT_U64, c[0], cg_u64(g, 0xD2511F53u));
        int p1 = cg_op2(g, K_MUL, KT_U64, c[2], cg_u64(g, 0xCD9E8D57u));
        int hi0 = cg_op2(g, K_SHR, KT_U64, p0, cg_u64(g, 32)), hi1 = cg_op2(g, K_SHR, KT_U64, p1, cg_u64(g, 32));
        int n0 = cg_op2(g, K_XOR, KT_U64, cg_op2(g, K_XOR, KT_U64, hi1, c[1]), k[0]);
        int n2 = cg_op2(g, K_XOR, KT_U64, cg_op2(g, K_XOR, KT_U64, hi0, c[3]), k[1]);
        c[1] = cg_lo32(g, p1);
        c[3] = cg_lo32(g, p0);
        c[0] = n0;
        c[2] = n2;
    }
    return c[0];
}

/* An i32 index tensor's element as a row number clamped into [0, n). The reference evaluator
 * rejects an index out of range; a kernel must not read outside its buffer, so it clamps (the
 * data loader checks token ids). */
int cg_index(CG *g, int f, KIdx *ix, int64_t n) {
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
    case F_DROPOUT: { /* ref.c's ref_eval_dropout: graph.h's mask of the "rng" key, at the flat index */
        const FNode *x = cg_n(g, n->in[0]), *key = cg_n(g, n->in[1]);
        int xv = cg_value(g, x->id, ix);
        double p = n->fa[0];
        int w[GRAPH_RNG_WORDS];
        for (int i = 0; i < GRAPH_RNG_WORDS; i++) {
            int dim = cg_i(g, i);
            KIdx wi = ix_of(1, key->shape, &dim);
            w[i] = cg_op1(g, K_CAST, KT_U64, cg_value(g, key->id, &wi));
        }
        int k[2] = {w[0], cg_op2(g, K_XOR, KT_U64, w[1], cg_u64(g, GRAPH_RNG_DOMAIN))};
        int c[4] = {cg_op1(g, K_CAST, KT_U64, ix_flat(g, ix)), cg_u64(g, (uint64_t)n->ia[0]), w[2], w[3]};
        int r = cg_op2(g, K_SHR, KT_U64, cg_philox_word0(g, c, k), cg_u64(g, 8));
        int on = cg_op2(g, K_NE, KT_BOOL, w[4], cg_u64(g, 0));
        int keep = cg_op2(g, K_GE, KT_BOOL, r, cg_u64(g, (uint64_t)ceil(p * 16777216.0)));
        int scaled = cg_op2(g, K_MUL, t, xv, cg_f(g, t, 1.0 / (1.0 - p)));
        return cg_op3(g, K_SELECT, t, on, cg_op3(g, K_SELECT, t, keep, scaled, cg_f(g, t, 0.0)), xv);
    }
    case F_ROPE: { /* ref.c's ref_eval_rope (ia[0] = 0) and ref_bwd.c's ref_rope_bwd (ia[0] = 1) */
        const FNode *x = cg_n(g, n->in[0]);
        int last = n->rank - 1;
        int64_t hd = n->shape[last], half = hd / 2;
        int pos = n->rank >= 2 ? ix_dim(g, ix, n->rank - 2) : cg_i(g, 0);
        if (n->ia[1] && cg_n(g, n->in[1])->rank == 1) { /* the row's position, given (plan/kv.c) */
            const FNode *pn = cg_n(g, n->in[1]);
            int d0[GRAPH_MAX_RANK] = {pos};
            KIdx pix0 = ix_of(1, pn->shape, d0);
            pos = cg_value(g, n->in[1], &pix0);
        } else if (n->ia[1]) { /* the position in its document: pos [B, T] at (batch, row) */
            const FNode *pn = cg_n(g, n->in[1]);
            int pd[GRAPH_MAX_RANK] = {ix_dim(g, ix, 0), pos};
            KIdx pix = ix_of(pn->rank, pn->shape, pd);
            pos = cg_as(g, cg_value(g, pn->id, &pix), KT_I64);
        }
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
    default: cg_fail(g, "a dedicated op computed as a value"); return cg_refused_value(g, n);
    }
}

/* cg_value's recursion: 1024 levels are about half a megabyte of stack. fuse_partition.c keeps
 * every kernel's own inline chains within FZ_MAX_INLINE_DEPTH (256); a merge trial that would nest
 * deeper is refused, and the kernels stay apart. */
#define CG_MAX_DEPTH 1024

int cg_value(CG *g, int f, KIdx *ix) {
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
    if (computed && g->depth >= CG_MAX_DEPTH) { /* a merge trial refused; the partition bounds a kernel's own */
        cg_fail(g, "the values computed inline nest too deeply");
        return cg_refused_value(g, n);
    }
    g->depth++;
    int v = computed ? cg_compute(g, n, ix) : cg_load(g, f, ix);
    g->depth--;
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
    for (int a = rank - 1; a >= 0; a--) /* the innermost axis longer than 1: kept, a column reduction */
        if (K->shape[a] != 1) {
            if (!(mask & (1u << a)) && !suffix) g->k->columns = K->shape[a];
            break;
        }

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
        } else if (fuse_squeeze_eq(n->rank, n->shape, rank, K->shape)) {
            lv = cg_dep(g, f) + 1;
            where[i] = lv;
        } else if (fuse_squeeze_eq(n->rank, n->shape, rank, kept_shape)) {
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
    for (int i = 0; i < K->members.n; i++) { /* the dedicated op (the forward's statistics only if alone) */
        const FNode *n = c->fg->node[K->members.v[i]];
        if (n->op >= F_ATTN && n->op <= F_SEG_NORM &&
            (!*main || (*main)->op == F_ATTN_LSE || (*main)->op == F_LORA_S || (*main)->op == F_CE_STATS))
            *main = n;
    }
    if (!*main) INTERNAL("fuse: a dedicated kernel without its op");
    switch ((*main)->op) {
    case F_TOPK: return KK_TOPK;
    case F_SCATTER_ADD: return KK_SCATTER;
    case F_SEG_NORM: return KK_REDUCE;
    case F_CE_STATS:
    case F_CE_GRAD: return KK_ROW;
    case F_LORA: return KK_ROW;
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
        case F_ATTN:
        case F_ATTN_LSE: cg_attention(&g, main); break;
        case F_ATTN_STATS: cg_attention_stats(&g, main); break;
        case F_ATTN_BWD_Q: cg_attention_bwd_q(&g, main); break;
        case F_ATTN_BWD_K:
        case F_ATTN_BWD_V: cg_attention_bwd_kv(&g, main); break;
        case F_KV_ATTN: cg_kv_attention(&g, main); break;
        case F_TOPK: cg_topk(&g, main); break;
        case F_SCATTER_ADD: cg_scatter_add(&g, main); break;
        case F_SEG_NORM: cg_seg_norm(&g, main); break;
        case F_CE_STATS: cg_ce_stats(&g, main); break;
        case F_CE_GRAD: cg_ce_grad(&g, main); break;
        case F_LORA: cg_lora(&g, main); break;
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
        if (f >= 0 && c->fg->node[f]->op == F_CE_GRAD) /* the backward and the concat the classifier kernel took in */
            for (int i = 0; i < K->members.n; i++) {
                const FNode *a = c->fg->node[K->members.v[i]], *b = c->fg->node[f];
                if (a->op == F_CE_GRAD && memcmp(a->in, b->in, sizeof(int) * 4) == 0) want[id] = 1;
            }
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
