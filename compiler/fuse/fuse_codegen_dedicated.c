/* fuse_codegen_dedicated.c - the kernels of fusion's dedicated ops written as kernel IR:
 * attention (forward, row statistics, backward of q, k and v), topk, scatter_add, cross-entropy's statistics and an update
 * graph's per-parameter norm, as ref.c and ref_bwd.c compute them.
 *
 * Pipeline position: fuse: fuse_lower -> partition -> fuse_codegen.c, [this file] -> kernel IR
 * (kir.h) -> back ends. fuse_codegen.c picks the op (fuse_gen_kernel) and provides indices and
 * values (fuse_cg.h). */
#include "fuse_cg.h"
#include "fuse_kv.h"

#include <math.h>
#include <string.h>

/* ---- dedicated kernels: attention --------------------------------------------------------------- */

typedef struct CGAttn {
    int dout, q, k, v, stats;
    int pos; /* the document mask, i32 [B, T] (the last input when ia[1]); -1: none */
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
    a->stats = n->op >= F_ATTN_BWD_Q ? n->in[4] : -1;
    a->pos = n->ia[1] ? n->in[n->nin - 1] : -1;
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

/* The index (batch, head, row, col) into node n of shape [..., heads, rows, cols]. */
static KIdx cg_attn_ix(const CGAttn *a, const FNode *n, int head, int row, int col) {
    int dims[GRAPH_MAX_RANK] = {0};
    for (int i = 0; i < a->r - 3; i++) dims[i] = a->bd[i];
    dims[a->r - 3] = head;
    dims[a->r - 2] = row;
    dims[a->r - 1] = col;
    KIdx ix = ix_of(n->rank, n->shape, dims);
    return ix;
}

/* Element (batch, head, row, col) of a [..., heads, rows, cols] operand. */
static int cg_attn_at(CG *g, const CGAttn *a, int f, int head, int row, int col) {
    const FNode *n = cg_n(g, f);
    KIdx ix = cg_attn_ix(a, n, head, row, col);
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

/* The first key query row i sees: 0, or with the document mask the first token of its document,
 * i - pos[b, i] clamped to [0, i + 1] (ref.c's ref_attn_first). */
static int cg_attn_first(CG *g, const CGAttn *a, int i) {
    if (a->pos < 0) return cg_i(g, 0);
    const FNode *pn = cg_n(g, a->pos);
    int dims[GRAPH_MAX_RANK] = {a->bd[0], i};
    KIdx ix = ix_of(pn->rank, pn->shape, dims);
    int p = cg_as(g, cg_value(g, a->pos, &ix), KT_I64);
    int first = cg_isub(g, i, p);
    first = cg_op2(g, K_MAX, KT_I64, first, cg_i(g, 0));
    return cg_op2(g, K_MIN, KT_I64, first, cg_iadd(g, i, cg_i(g, 1)));
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
    KIdx ix = cg_attn_ix(a, n, head, row, col);
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
    d->pos.param = -1;
    if (a->pos >= 0) { /* the document mask: pos i32 [B, T] as a strided view, for q [B, H, T, D] */
        const FNode *pn = cg_n(g, a->pos);
        CGLayout L;
        int param = -1;
        if (a->r != 4 || !a->causal || a->S != a->T || pn->dt != DT_I32 || pn->rank != 2 || !cg_layout_in(g, a->pos, &L, &param))
            return;
        d->pos.param = param;
        d->pos.offset = L.off;
        d->pos.stride[0] = L.shape[0] == 1 ? 0 : L.stride[0];
        d->pos.stride[2] = L.stride[1];
    }
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
    if (a->stats >= 0 && c->mat[a->stats]) { /* the forward's m and l, stored; or the backward's three, loaded */
        const FNode *st = cg_n(g, a->stats);
        CGLayout L;
        lay_rowmajor(&L, st->rank, st->shape);
        if (st->dt != DT_F32 || !cg_kview(&L, cg_buf(g, a->stats, op == KA_FORWARD), &d->stats)) return;
    } else if (op != KA_FORWARD) {
        return;
    }
    g->k->attn = d;
}

static void cg_attn_stats_store(CG *g, const CGAttn *a, int h, int i, const int *st, int n);

/* Forward: ref.c's ref_eval_attention, one query row per work item; with the kernel's member
 * F_ATTN_LSE (rule 6), each row's max m and sum l stored for the backward (n the F_ATTN_LSE
 * alone: those only). */
void cg_attention(CG *g, const FNode *n) {
    CGAttn a;
    cg_attn_init(g, n, 0, &a);
    for (int i = 0; i < g->K->members.n; i++)
        if (cg_n(g, g->K->members.v[i])->op == F_ATTN_LSE) a.stats = g->K->members.v[i];
    int res = n->op == F_ATTN ? n->id : -1; /* the result, when this kernel computes it */
    int h, t;
    cg_attn_row(g, &a, n, &h, &t);
    int kh = cg_op2(g, K_IDIV, KT_I64, h, cg_i(g, a.G));
    int first = cg_attn_first(g, &a, t);
    int cnt = cg_isub(g, cg_attn_visible(g, &a, t), first); /* keys first .. first + cnt - 1 */
    if (res >= 0) {
        int c = kb_loop(g->b, a.E);
        cg_out_put(g, &a, res, h, t, c, cg_f(g, a.t, 0.0), K_NONE);
        kb_endloop(g->b);
    }
    int m = kb_acc(g->b, a.t, K_MAX, -INFINITY);
    int j = cg_iadd(g, first, kb_loop_dyn(g->b, cnt));
    int s = cg_attn_dot(g, &a, a.q, h, t, a.k, kh, j, a.D);
    kb_accum(g->b, m, cg_op2(g, K_MUL, a.t, cg_f(g, a.t, a.scale), s));
    kb_endloop(g->b);
    int sum = kb_acc(g->b, a.t, K_ADD, 0.0);
    j = cg_iadd(g, first, kb_loop_dyn(g->b, cnt));
    s = cg_attn_dot(g, &a, a.q, h, t, a.k, kh, j, a.D);
    int p = cg_op1(g, K_EXP, a.t, cg_op2(g, K_SUB, a.t, cg_op2(g, K_MUL, a.t, cg_f(g, a.t, a.scale), s), m));
    kb_accum(g->b, sum, p);
    if (res >= 0) {
        int c = kb_loop(g->b, a.E);
        cg_out_put(g, &a, res, h, t, c, cg_op2(g, K_MUL, a.t, p, cg_attn_at(g, &a, a.v, kh, j, c)), K_ADD);
        kb_endloop(g->b);
    }
    kb_endloop(g->b);
    if (a.stats >= 0) { /* m = -inf and l = 0 for a row that sees no key: the backward skips it */
        int st[2] = {m, sum};
        cg_attn_stats_store(g, &a, h, t, st, 2);
    }
    if (res < 0) return;
    if (a.causal) kb_if(g->b, cg_op2(g, K_GT, KT_BOOL, cnt, cg_i(g, 0))); /* a row that sees no key stays zero */
    int c = kb_loop(g->b, a.E);
    cg_out_put(g, &a, res, h, t, c, sum, K_DIV);
    kb_endloop(g->b);
    if (a.causal) kb_endif(g->b);
    cg_attn_describe(g, n, NULL, &a, KA_FORWARD);
}

/* P_ij for query row (h, i) against key j, given the row's max and sum. */
static int cg_attn_p(CG *g, const CGAttn *a, int h, int i, int kh, int j, int m, int sum) {
    int s = cg_op2(g, K_MUL, a->t, cg_attn_dot(g, a, a->q, h, i, a->k, kh, j, a->D), cg_f(g, a->t, a->scale));
    return cg_op2(g, K_DIV, a->t, cg_op1(g, K_EXP, a->t, cg_op2(g, K_SUB, a->t, s, m)), sum);
}

/* The statistics of query row (h, i) read from their buffer. */
static void cg_attn_stats_load(CG *g, const CGAttn *a, int h, int i, int out[3]) {
    for (int s = 0; s < 3; s++) out[s] = cg_attn_at(g, a, a->stats, h, i, cg_i(g, s));
}

/* st[0 .. n) into columns 0 .. n of a->stats's row (h, i), when it has a buffer. */
static void cg_attn_stats_store(CG *g, const CGAttn *a, int h, int i, const int *st, int n_st) {
    if (!g->c->mat[a->stats]) return;
    const FNode *n = cg_n(g, a->stats);
    for (int s = 0; s < n_st; s++) {
        int dims[GRAPH_MAX_RANK] = {0};
        for (int d = 0; d < a->r - 3; d++) dims[d] = a->bd[d];
        dims[a->r - 3] = h;
        dims[a->r - 2] = i;
        dims[a->r - 1] = cg_i(g, s);
        KIdx ix = ix_of(n->rank, n->shape, dims);
        cg_store(g, a->stats, &ix, st[s]);
    }
}

/* The backward's statistics [..., H, T, 3] of query row (h, i) a work item: m and l copied from
 * the forward's F_ATTN_LSE, and sum_j P_ij dP_ij as sum_c dout_ic o_ic (fuse_lower.c's
 * fl_attn_stats), in f32 (f64 for f64) from the elements as stored, in column order. */
void cg_attention_stats(CG *g, const FNode *n) {
    CGAttn a;
    memset(&a, 0, sizeof a);
    a.r = n->rank;
    a.t = cg_t(n);
    a.stats = n->id;
    a.pos = -1;
    int h, i;
    cg_attn_row(g, &a, n, &h, &i);
    const FNode *o = cg_n(g, n->in[1]);
    int st[3];
    st[0] = cg_attn_at(g, &a, n->in[2], h, i, cg_i(g, 0));
    st[1] = cg_attn_at(g, &a, n->in[2], h, i, cg_i(g, 1));
    st[2] = cg_attn_dot(g, &a, n->in[0], h, i, n->in[1], h, i, o->shape[o->rank - 1]);
    cg_attn_stats_store(g, &a, h, i, st, 3);
}

/* dq_i = scale * sum_j dS_ij k_j with dS_ij = P_ij (dP_ij - pdp_i); one query row a work item. */
void cg_attention_bwd_q(CG *g, const FNode *n) {
    CGAttn a;
    cg_attn_init(g, n, 1, &a);
    int h, i;
    cg_attn_row(g, &a, n, &h, &i);
    int kh = cg_op2(g, K_IDIV, KT_I64, h, cg_i(g, a.G));
    int st[3];
    cg_attn_stats_load(g, &a, h, i, st);
    int d = kb_loop(g->b, a.D);
    cg_out_put(g, &a, n->id, h, i, d, cg_f(g, a.t, 0.0), K_NONE);
    kb_endloop(g->b);
    int first = cg_attn_first(g, &a, i);
    int j = cg_iadd(g, first, kb_loop_dyn(g->b, cg_isub(g, cg_attn_visible(g, &a, i), first)));
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
void cg_attention_bwd_kv(CG *g, const FNode *n) {
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
    int first = cg_i(g, 0); /* the first query row that sees key j */
    if (a.causal) first = cg_op2(g, K_MAX, KT_I64, cg_isub(g, j, cg_i(g, a.S - a.T)), cg_i(g, 0));
    int count = cg_isub(g, cg_i(g, a.T), first); /* query rows first .. first + count - 1 */
    if (a.pos >= 0) {
        /* With the document mask only the rows of j's document see key j: the loop below ends
         * after the last row that does, so that its iterations, like the forward's keys, are
         * proportional to the document's length rather than to the row's (a short bucket costs
         * less than a long one; the rows past the document cost only their branch before, so on
         * the CPU this saves little: docs/bench.md, bench/buckets.py). A scan of the rows' first
         * keys finds the last - integer work, vectorisable - and holds for any pos (rows after
         * the last are skipped, rows before it that do not see j are still skipped by the `if`),
         * so the rows added and their order, and so every result, are the same as before. */
        int end = kb_acc(g->b, KT_I64, K_MAX, 0.0); /* 1 + the last row that sees j, or 0 */
        int si = cg_iadd(g, first, kb_loop_dyn(g->b, count));
        int sees = cg_op2(g, K_LE, KT_BOOL, cg_attn_first(g, &a, si), j);
        kb_accum(g->b, end, cg_op3(g, K_SELECT, KT_I64, sees, cg_iadd(g, si, cg_i(g, 1)), cg_i(g, 0)));
        kb_endloop(g->b);
        count = cg_op2(g, K_MAX, KT_I64, cg_isub(g, end, first), cg_i(g, 0));
    }
    int gi = kb_loop(g->b, a.G);
    int h = cg_iadd(g, cg_imul(g, kh, cg_i(g, a.G)), gi);
    int ii = kb_loop_dyn(g->b, count);
    int i = cg_iadd(g, first, ii);
    if (a.pos >= 0) kb_if(g->b, cg_op2(g, K_LE, KT_BOOL, cg_attn_first(g, &a, i), j)); /* i is in j's document */
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
    if (a.pos >= 0) kb_endif(g->b);
    kb_endloop(g->b);
    kb_endloop(g->b);
    if (nk && nv) cg_attn_describe(g, nk, nv, &a, KA_BWD_KV);
    else cg_attn_describe(g, n, NULL, &a, nk ? KA_BWD_K : KA_BWD_V);
}

/* ---- dedicated kernels: topk and scatter_add ----------------------------------------------------- */

/* One row of the selected axis a work item. Element j's rank is the number of elements before it
 * (larger, NaN above any number, equal ones earlier); rank < k goes to position rank. */
void cg_topk(CG *g, const FNode *n) {
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

/* Whether layout L is its shape's row-major layout from L->off on (size-1 axes aside). */
static int lay_contiguous(const CGLayout *L) {
    int64_t s = 1;
    for (int d = L->rank - 1; d >= 0; d--) {
        if (L->shape[d] == 1) continue;
        if (L->stride[d] != s) return 0;
        s *= L->shape[d];
    }
    return 1;
}

/* Kernel.scatter for scatter_add n, when the kernel computes n alone into its own buffer and reads
 * the indices and the rows as contiguous views of buffers; otherwise it stays NULL and the body
 * is the kernel (the CUDA back end's segmented kernel needs plain row-major operands). */
static void cg_scatter_describe(CG *g, const FNode *n) {
    const FNode *upd = cg_n(g, n->in[0]), *idx = cg_n(g, n->in[1]);
    if (g->K->members.n != 1 || g->K->members.v[0] != n->id || !g->c->mat[n->id] || n->shape[0] < 1) return;
    if (upd->dt != n->dt || (idx->dt != DT_I32 && idx->dt != DT_I64)) return;
    /* a mixed-precision program's rows arrive in bf16 and are widened inline: read them as such */
    const FNode *src = upd;
    if (upd->op == F_MAP && upd->kop == K_CAST && cg_computes(g, upd->id) && fuse_numel(cg_n(g, upd->in[0])) == fuse_numel(upd))
        src = cg_n(g, upd->in[0]);
    if (src != upd && !(dtype_is_float(src->dt) && dtype_size(src->dt) <= dtype_size(n->dt))) return; /* widening only */
    CGLayout lu, li;
    int pu = -1, pi = -1;
    if (!cg_layout_in(g, src->id, &lu, &pu) || !lay_contiguous(&lu)) return;
    if (!cg_layout_in(g, idx->id, &li, &pi) || !lay_contiguous(&li)) return;
    KScatter *d = arena_alloc(g->ar, sizeof *d);
    d->dt = n->dt;
    d->upd_dt = src->dt;
    d->idx_dt = idx->dt;
    d->R = n->shape[0];
    d->W = fuse_numel(n) / d->R;
    d->P = fuse_numel(idx);
    d->out = cg_buf(g, n->id, 1);
    d->idx = pi;
    d->upd = pu;
    d->idx_off = li.off;
    d->upd_off = lu.off;
    g->k->scatter = d;
}

/* out [R, ...] = zeros, then row idx[p] += updates[p] for every p in order; one column of the
 * rows a work item (ref_bwd.c's ref_scatter_add, the same order of additions). */
void cg_scatter_add(CG *g, const FNode *n) {
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
    cg_scatter_describe(g, n);
}

/* ---- cross-entropy's statistics ------------------------------------------------------------------ */

/* Cross-entropy's statistics st (F_CE_STATS) of row gid: the max m of the row, then the sum s of
 * exp(x - m), each in the statistics' type, as the two reductions they replace (fuse_lower.c's
 * fl_ce_stats) added them, and the target's logit; stored when st has a buffer. */
static void cg_ce_row_stats(CG *g, const FNode *st, int gid, int *m, int *s) {
    const FNode *x = cg_n(g, st->in[0]), *tg = cg_n(g, st->in[1]);
    int rank = x->rank;
    int64_t V = x->shape[rank - 1];
    KType t = cg_t(st);
    int row0 = cg_imul(g, gid, cg_i(g, V));
    *m = kb_acc(g->b, t, K_MAX, -INFINITY);
    int j = kb_loop(g->b, V);
    KIdx ix;
    ix_init(&ix, rank, x->shape);
    ix.flat = cg_iadd(g, row0, j);
    kb_accum(g->b, *m, cg_as(g, cg_value(g, x->id, &ix), t));
    kb_endloop(g->b);
    *s = kb_acc(g->b, t, K_ADD, 0.0);
    j = kb_loop(g->b, V);
    ix_init(&ix, rank, x->shape);
    ix.flat = cg_iadd(g, row0, j);
    kb_accum(g->b, *s, cg_op1(g, K_EXP, t, cg_op2(g, K_SUB, t, cg_as(g, cg_value(g, x->id, &ix), t), *m)));
    kb_endloop(g->b);
    KIdx ti;
    ix_init(&ti, tg->rank, tg->shape);
    ti.flat = gid;
    ix_init(&ix, rank, x->shape);
    ix.flat = cg_iadd(g, row0, cg_index(g, tg->id, &ti, V)); /* as F_TAKE reads it */
    int xt = cg_as(g, cg_value(g, x->id, &ix), t);
    if (!g->c->mat[st->id]) return;
    int buf = cg_buf(g, st->id, 1), at = cg_imul(g, gid, cg_i(g, 3));
    kb_store(g->b, buf, at, *m);
    kb_store(g->b, buf, cg_iadd(g, at, cg_i(g, 1)), *s);
    kb_store(g->b, buf, cg_iadd(g, at, cg_i(g, 2)), xt);
}

/* The logits x of a cross-entropy as rows of a buffer, for Kernel.ce: read through a slice from
 * column 0 of the last axis (a padded vocabulary) and a widening cast, both computed here, from a
 * buffer of row-major rows. 0 when they are not. */
static int cg_ce_rows(CG *g, const FNode *x, KCeStats *d) {
    const FNode *src = x;
    int rank = x->rank;
    if (src->op == F_SLICE && src->ia[0] == rank - 1 && src->ia[1] == 0 && cg_computes(g, src->id)) src = cg_n(g, src->in[0]);
    if (src->op == F_MAP && src->kop == K_CAST && cg_computes(g, src->id)) src = cg_n(g, src->in[0]);
    if (src != x && src->op == F_SLICE && src->ia[0] == rank - 1 && src->ia[1] == 0 && cg_computes(g, src->id))
        src = cg_n(g, src->in[0]);
    if (!dtype_is_float(src->dt) || dtype_size(src->dt) > dtype_size(d->dt) || src->rank != rank) return 0;
    for (int a = 0; a + 1 < rank; a++)
        if (src->shape[a] != x->shape[a]) return 0; /* a cast that broadcasts is not rows of a buffer */
    CGLayout L;
    int param = -1;
    if (!cg_layout_in(g, src->id, &L, &param) || !lay_contiguous(&L)) return 0;
    d->in_dt = src->dt;
    d->V = x->shape[rank - 1];
    d->stride = src->shape[rank - 1];
    d->rows = fuse_numel(x) / d->V;
    d->in_off = L.off;
    d->in = param;
    return 1;
}

/* Kernel.ce's targets: a contiguous i32 buffer of one per row. */
static int cg_ce_targets(CG *g, const FNode *tg, KCeStats *d) {
    CGLayout L;
    int param = -1;
    if (tg->dt != DT_I32 || fuse_numel(tg) != d->rows || !cg_layout_in(g, tg->id, &L, &param) || !lay_contiguous(&L)) return 0;
    d->tgt = param;
    d->tgt_off = L.off;
    return 1;
}

/* F_CE_STATS: a row of logits a work item (cg_ce_row_stats). Kernel.ce when the logits are rows of
 * a buffer (a widening cast read through). */
void cg_ce_stats(CG *g, const FNode *n) {
    const FNode *x = cg_n(g, n->in[0]);
    int64_t rows = fuse_numel(x) / x->shape[x->rank - 1];
    int gid = kb_gid(g->b), m, s;
    g->k->grid = rows;
    cg_ce_row_stats(g, n, gid, &m, &s);
    if (g->K->members.n != 1 || g->K->members.v[0] != n->id || !g->c->mat[n->id]) return;
    KCeStats *d = arena_alloc(g->ar, sizeof *d);
    d->dt = n->dt;
    d->grad = -1;
    if (!cg_ce_rows(g, x, d) || !cg_ce_targets(g, cg_n(g, n->in[1]), d)) return;
    d->out = cg_buf(g, n->id, 1);
    g->k->ce = d;
}

/* The buffer node the classifier kernel n writes its gradient over (its logits' buffer: fuse.c's
 * fz_ce_inplace gives n that buffer), else -1. */
int fuse_ce_inplace_base(const FuseCtx *c, const FNode *n) {
    if (n->op != F_CE_GRAD || !c->buf_of || c->buf_of[n->id] < 0) return -1;
    int f = n->in[1];
    for (;;) {
        const FNode *x = c->fg->node[f];
        if (c->buf_of[f] >= 0 && c->fg->node[f]->op != F_CE_GRAD) return c->buf_of[f] == c->buf_of[n->id] ? f : -1;
        if (x->op == F_SLICE || (x->op == F_MAP && x->kop == K_CAST)) f = x->in[0];
        else return -1;
    }
}

/* F_CE_GRAD, the classifier kernel: a row a work item. Its statistics (a member: cg_ce_row_stats,
 * stored for the loss's mean), then each column's gradient in the logits' type as the maps it
 * replaces computed it (fuse_lower.c's fl_ce_grad: exp(x - m) / s, minus the one-hot, times dloss,
 * divided by N), stored as n's type; the columns past V zero. The row's logits are all read (by the
 * statistics' loops, and column j by column j's gradient) before column j is written, so the
 * gradient may be stored over them (fz_ce_inplace): one parameter then, loaded and stored. */
void cg_ce_grad(CG *g, const FNode *n) {
    const FNode *st = cg_n(g, n->in[0]), *x = cg_n(g, n->in[1]), *tg = cg_n(g, n->in[2]), *dl = cg_n(g, n->in[3]);
    int rank = x->rank, own = g->c->owner[st->id] == g->kid;
    int64_t V = x->shape[rank - 1], W = n->shape[rank - 1], rows = fuse_numel(x) / V, N = fuse_numel(tg);
    KType t = cg_t(x), ot = cg_t(n);
    int gid = kb_gid(g->b), m, s;
    g->k->grid = rows;
    if (own) cg_ce_row_stats(g, st, gid, &m, &s);
    else { /* statistics two classifier kernels read (the partition pins them to neither): loaded */
        int sb = cg_buf(g, st->id, 0), at = cg_imul(g, gid, cg_i(g, 3));
        m = kb_load(g->b, sb, at);
        s = kb_load(g->b, sb, cg_iadd(g, at, cg_i(g, 1)));
    }
    int mt = cg_as(g, m, t), s_t = cg_as(g, s, t);
    KIdx di;
    ix_init(&di, dl->rank, dl->shape);
    di.flat = cg_i(g, 0);
    int dlv = cg_as(g, cg_value(g, dl->id, &di), t);
    KIdx ti;
    ix_init(&ti, tg->rank, tg->shape);
    ti.flat = gid;
    int target = cg_value(g, tg->id, &ti);
    int base = fuse_ce_inplace_base(g->c, n);
    int obuf = base >= 0 ? cg_buf(g, base, 1) : cg_buf(g, n->id, 1);
    int orow = cg_imul(g, gid, cg_i(g, W));
    int j = kb_loop(g->b, V);
    KIdx ix;
    ix_init(&ix, rank, x->shape);
    ix.flat = cg_iadd(g, cg_imul(g, gid, cg_i(g, V)), j);
    int e = cg_op1(g, K_EXP, t, cg_op2(g, K_SUB, t, cg_value(g, x->id, &ix), mt));
    int hot =
        cg_op3(g, K_SELECT, t, cg_op2(g, K_EQ, KT_BOOL, cg_op1(g, K_CAST, KT_I32, j), target), cg_f(g, t, 1.0), cg_f(g, t, 0.0));
    int v = cg_op2(g, K_MUL, t, dlv, cg_op2(g, K_SUB, t, cg_op2(g, K_DIV, t, e, s_t), hot));
    v = cg_op2(g, K_DIV, t, v, cg_f(g, t, (double)N));
    kb_store(g->b, obuf, cg_iadd(g, orow, j), cg_as(g, v, ot));
    kb_endloop(g->b);
    if (W > V) {
        j = kb_loop(g->b, W - V);
        kb_store(g->b, obuf, cg_iadd(g, orow, cg_iadd(g, cg_i(g, V), j)), cg_f(g, ot, 0.0));
        kb_endloop(g->b);
    }
    /* the seed a constant (the step's 1, or a loss's constant factor folded into it): a value the
     * CUDA kernel takes as k = dloss / N */
    if (!own || g->K->members.n != 2 || !g->c->mat[st->id] || g->k->inst[dlv].op != K_CONST) return;
    KCeStats *d = arena_alloc(g->ar, sizeof *d);
    d->dt = st->dt;
    if (t != cg_t(st) || !cg_ce_rows(g, x, d) || !cg_ce_targets(g, tg, d)) return;
    d->out = cg_buf(g, st->id, 1);
    d->grad = obuf;
    d->gW = W;
    d->grad_dt = n->dt;
    d->dloss = g->k->inst[dlv].f;
    d->N = (double)N;
    if (d->grad == d->in && (d->gW != d->stride || d->in_off != 0))
        INTERNAL("fuse: a classifier kernel in place over other rows");
    g->k->ce = d;
}

/* ---- fused LoRA ------------------------------------------------------------------------------------ */

/* F_LORA with its F_LORA_S (a member, pinned): a row a work item; the row's rank values S[q] in
 * accumulators over the input's row (the down product), stored when another launch reads S, then
 * C = D + alpha S @ op(B) along the row (the up product and the add epilogue), as kir.h's KLora
 * says. S never leaves registers on its way to the up product. */
void cg_lora(CG *g, const FNode *n) {
    const FNode *sn = cg_n(g, n->in[0]);
    if (sn->op != F_LORA_S || g->c->owner[sn->id] != g->kid) INTERNAL("fuse: a fused LoRA kernel without its down product");
    const FuseGemm *dm = &sn->gemm, *um = &n->gemm;
    KLora *d = arena_alloc(g->ar, sizeof *d);
    *d = (KLora){.batch = dm->batch,
                 .m = dm->m,
                 .k = dm->k,
                 .r = dm->n,
                 .n = um->n,
                 .ldx = dm->lda,
                 .stride_x = dm->batch > 1 ? dm->stride_a : 0,
                 .lda = dm->ldb,
                 .stride_a = dm->batch > 1 ? dm->stride_b : 0,
                 .ldb = um->ldb,
                 .stride_b = um->batch > 1 ? um->stride_b : 0,
                 .trans_a = dm->trans_b,
                 .trans_b = um->trans_b,
                 .alpha = um->alpha};
    d->x = cg_buf(g, sn->in[0], 0);
    d->a = cg_buf(g, sn->in[1], 0);
    d->b = cg_buf(g, n->in[1], 0);
    d->d = cg_buf(g, n->in[2], 0);
    d->s = g->c->mat[sn->id] ? cg_buf(g, sn->id, 1) : -1;
    d->c = cg_buf(g, n->id, 1);
    KType t = KT_F32;
    int gid = kb_gid(g->b);
    g->k->grid = d->batch * d->m;
    int tb = d->batch > 1 ? cg_op2(g, K_IDIV, KT_I64, gid, cg_i(g, d->m)) : cg_i(g, 0);
    int row = d->batch > 1 ? cg_op2(g, K_IMOD, KT_I64, gid, cg_i(g, d->m)) : gid;
    int xrow = cg_iadd(g, cg_imul(g, tb, cg_i(g, d->stride_x)), cg_imul(g, row, cg_i(g, d->ldx)));
    int a0 = cg_imul(g, tb, cg_i(g, d->stride_a)), b0 = cg_imul(g, tb, cg_i(g, d->stride_b));
    int acc[FUSE_LORA_MAX_RANK];
    for (int q = 0; q < d->r; q++) acc[q] = kb_acc(g->b, t, K_ADD, 0.0);
    int p = kb_loop(g->b, d->k);
    int xv = kb_load(g->b, d->x, cg_iadd(g, xrow, p));
    for (int q = 0; q < d->r; q++) {
        int off = d->trans_a ? cg_iadd(g, cg_i(g, q * d->lda), p) : cg_iadd(g, cg_imul(g, p, cg_i(g, d->lda)), cg_i(g, q));
        kb_accum(g->b, acc[q], cg_op2(g, K_MUL, t, xv, kb_load(g->b, d->a, cg_iadd(g, a0, off))));
    }
    kb_endloop(g->b);
    if (d->s >= 0) {
        int s0 = cg_imul(g, gid, cg_i(g, d->r));
        for (int q = 0; q < d->r; q++) kb_store(g->b, d->s, cg_iadd(g, s0, cg_i(g, q)), acc[q]);
    }
    int c0 = cg_imul(g, gid, cg_i(g, d->n));
    int j = kb_loop(g->b, d->n);
    int sum = -1;
    for (int q = 0; q < d->r; q++) {
        int off = d->trans_b ? cg_iadd(g, cg_imul(g, j, cg_i(g, d->ldb)), cg_i(g, q)) : cg_iadd(g, cg_i(g, q * d->ldb), j);
        int term = cg_op2(g, K_MUL, t, acc[q], kb_load(g->b, d->b, cg_iadd(g, b0, off)));
        sum = sum < 0 ? term : cg_op2(g, K_ADD, t, sum, term);
    }
    int at = cg_iadd(g, c0, j);
    kb_store(g->b, d->c, at, cg_op2(g, K_ADD, t, kb_load(g->b, d->d, at), cg_op2(g, K_MUL, t, cg_f(g, t, d->alpha), sum)));
    kb_endloop(g->b);
    g->k->lora = d;
}

/* The per-parameter L2 norm of an update graph's flat vector, broadcast over the parameter: one
 * segment (and one work item) per parameter, which also zeroes the padding after it. */
void cg_seg_norm(CG *g, const FNode *n) {
    const GraphUpdate *u = g->c->g->update;
    const FNode *x = cg_n(g, n->in[0]);
    if (!u || n->rank != 1 || n->shape[0] != u->n) INTERNAL("fuse: seg_norm outside an update graph");
    KType t = cg_t(n);
    int gid = kb_gid(g->b);
    g->k->grid = u->nsegs > 0 ? u->nsegs : 1;
    g->k->nsegments = g->k->grid;
    for (int s = 0; s < u->nsegs; s++) {
        if (u->seg_off[s] >= u->n) continue; /* a frozen parameter, past the update's vectors: no work item */
        int64_t off = u->seg_off[s], len = u->seg_len[s];
        int64_t end = s + 1 < u->nsegs && u->seg_off[s + 1] < u->n ? u->seg_off[s + 1] : u->n;
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

/* ---- attention over the paged KV cache (fuse_kv.h) ----------------------------------------------- */

/* G_KV_ATTENTION: q, k and v as strided views of the buffers they are read from (as Kernel.attn
 * resolves them), the result in its own buffer, the "kv" input as the i32 metadata, and the pool as
 * a parameter of its own (kv_dt, written) on the kv input's buffer: the host binds a parameter of
 * that buffer that is not i32 to RtStep.kv_pool instead (host.c, emit_launches). */
void cg_kv_attention(CG *g, const FNode *n) {
    const FNode *q = cg_n(g, n->in[0]), *k = cg_n(g, n->in[1]);
    KvAttnShape s = {.N = q->shape[2],
                     .H = q->shape[1],
                     .Hk = k->shape[1],
                     .D = q->shape[3],
                     .block = n->ia[2],
                     .max_blocks = n->ia[3],
                     .layer = n->ia[0],
                     .L = n->ia[1],
                     .dt = n->dt,
                     .kv_dt = (DType)n->fa[1],
                     .scale = n->fa[0]};
    KView *views[3] = {&s.q, &s.k, &s.v};
    for (int i = 0; i < 3; i++)
        if (!cg_kview_of(g, n->in[i], views[i])) {
            cg_fail(g, "kv attention: an operand is not a strided view of a buffer");
            return;
        }
    if (!g->c->mat[n->id]) {
        cg_fail(g, "kv attention: the result has no buffer of its own");
        return;
    }
    CGLayout L;
    lay_rowmajor(&L, n->rank, n->shape);
    if (!cg_kview(&L, cg_buf(g, n->id, 1), &s.out)) INTERNAL("kv attention: a row-major result is not a view");
    int meta = cg_buf(g, n->in[3], 0);
    const KBuf *mb = &g->k->bufs[meta];
    int64_t one = 1;
    int pool = kb_buf(g->b, n->in[3] + g->c->n, mb->buffer, mb->node, s.kv_dt, 1, &one, 1);
    s.pool_off = 0;
    const char *why = kv_shape_problem(&s);
    if (why) {
        cg_fail(g, why);
        return;
    }
    kv_emit_attn(g->b, g->k, &s, meta, pool);
}
