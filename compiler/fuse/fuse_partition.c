/* fuse_partition.c - fusion's grouping: the nodes of the fused graph (fuse_lower.c) partitioned
 * into launches, merged and put in order. fuse.c then gives the launches their buffers and
 * kernels (fuse_codegen.c).
 *
 * Pipeline position: graph -> autodiff -> fuse: fuse_lower -> [partition] ->
 * fuse_codegen -> kernel IR (kir.h) -> back ends (cpu, cuda).
 *
 * The fused graph holds primitive, hash-consed nodes: maps, views, reductions, GEMMs, dedicated
 * ops. Every node is
 *   a leaf (parameter, input: a buffer the step is given),
 *   anchored: a reduction, a GEMM or a dedicated op (attention and its backward, topk,
 *     scatter_add, an update graph's per-parameter norm) belongs to exactly one launch, or
 *   inline: a map or view is computed inside every kernel that reads it, unless it is
 *     materialised - then one kernel computes and stores it and the others load it.
 * Materialised: the outputs (the loss, the gradients); GEMM operands and results (a transpose of
 * the last two axes is the GEMM's trans flag and a reshape a view of the same buffer, so neither
 * is copied); what attention and topk read, past pure views (a slice/reshape/transpose of the
 * qkv projection is index arithmetic in the attention kernel); a map read by more than one
 * kernel, unless it is one element (a scalar is recomputed where needed) or cheap to recompute
 * (FZ_REMAT_OPS); a reduction or dedicated result read by another launch; every FZ_MAX_INLINE_DEPTH-th
 * op of a long chain of inline ops (fz_bound_inline_depth: the code generator recurses over a
 * kernel's inline chain).
 * A GEMM's bias gradient (F_GEMM_BGRAD: its B's column sums, fuse_lower.c) is pinned to the GEMM:
 * one launch, the library's epilogue. LoRA's down product (F_LORA_S) is pinned to its up product's
 * kernel (F_LORA): one launch computing both (fuse_lower.c's fl_lora_chain). Cross-entropy's
 * statistics (F_CE_STATS) are pinned to the classifier kernel (F_CE_GRAD) that reads them, when
 * one does: one launch reads the logits for both (fz_setup; fuse.c's fz_ce_inplace may then give
 * the gradient the logits' buffer).
 * Each anchored and each materialised inline node starts as a launch of its own; launches then
 * merge while the launch graph stays acyclic and the merged kernel can be written (a row
 * reduction may only be read at its own row; fuse_codegen refuses otherwise):
 *   1. reductions over the same shape and axes, one reading the other (softmax's max and sum,
 *      layernorm's mean and variance) or both reading a buffer of this step (layernorm's weight
 *      and bias gradients; cross-entropy with its backward: one classifier kernel);
 *   2. an elementwise kernel into a row reduction (reduced axes trailing) when its shape is the
 *      reduction's input (residual add + layernorm) or its output (the per-row statistics), and
 *      into any reduction when it has the output's shape;
 *   3. an elementwise kernel reading a reduction, of those shapes (softmax's divide, layernorm's
 *      scale and shift, a mean's division), into the reduction;
 *   4. elementwise kernels of one shape, one reading the other (bias + GELU after a GEMM) or both
 *      reading a common buffer of that size;
 *   5. a permute/reshape chain of an attention result that a GEMM needs: attention stores its rows
 *      straight in that layout;
 *   6. attention's backward row statistics into the kernel of dq, which needs them first;
 *   7. finally, consecutive independent launches: elementwise ones become one kernel with a
 *      segment each (the optimizer update over parameters of several shapes: one launch),
 *      reductions of one shape and axes one kernel;
 *   8. (among siblings) attention's backward of k and of v, which read the same: one kernel
 *      computing each key row's weights once for both.
 * A map shared by several kernels is found after a round of merges; it is then materialised -
 * as a launch of its own, or pinned to the first kernel that computes it when its own launch would
 * read that kernel (layernorm's rstd, stored by the forward kernel for the backward) - and the
 * partition starts again from the singletons, until nothing more is shared.
 * Launches are ordered topologically, earliest graph position first. */
#include "fuse_internal.h"
#include "diag.h"

#include <string.h>

/* ---- small vectors ------------------------------------------------------------------------------ */

void fuse_ivec_push(Arena *ar, IVec *v, int x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        int *nv = arena_alloc(ar, sizeof(int) * (size_t)cap);
        if (v->n) memcpy(nv, v->v, sizeof(int) * (size_t)v->n);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

int fuse_ivec_has(const IVec *v, int x) {
    for (int i = 0; i < v->n; i++)
        if (v->v[i] == x) return 1;
    return 0;
}

static void fuse_ivec_sort(IVec *v) { /* insertion sort: member lists are short or nearly sorted */
    for (int i = 1; i < v->n; i++) {
        int x = v->v[i], j = i - 1;
        while (j >= 0 && v->v[j] > x) {
            v->v[j + 1] = v->v[j];
            j--;
        }
        v->v[j + 1] = x;
    }
}

/* ---- classification ------------------------------------------------------------------------------ */

static int fz_cat(FOp op) {
    if (op == F_LEAF) return FC_LEAF;
    if (op == F_REDUCE || op >= F_GEMM) return FC_ANCHOR;
    return FC_INLINE;
}

static int fz_pure_view(FOp op) { return op == F_RESHAPE || op == F_PERMUTE || op == F_EXPAND || op == F_SLICE; }

/* A node with arithmetic worth not repeating in several kernels (views are index arithmetic). */
static int fz_compute(FOp op) { return op == F_MAP || op == F_DROPOUT || op == F_ROPE; }

static FNode *fz_n(const FuseCtx *c, int f) { return c->fg->node[f]; }

/* ---- kernels --------------------------------------------------------------------------------------- */

static int fz_new_kernel(FuseCtx *c, int kind) {
    if (c->nk == c->capk) {
        int cap = c->capk ? c->capk * 2 : 64;
        FKern *nk = arena_alloc(c->tmp, sizeof(FKern) * (size_t)cap);
        if (c->nk) memcpy(nk, c->k, sizeof(FKern) * (size_t)c->nk);
        int *mark = arena_alloc(c->tmp, sizeof(int) * (size_t)cap), *ver = arena_alloc(c->tmp, sizeof(int) * (size_t)cap);
        if (c->nk) {
            memcpy(mark, c->kmark, sizeof(int) * (size_t)c->nk);
            memcpy(ver, c->kver, sizeof(int) * (size_t)c->nk);
        }
        c->k = nk;
        c->kmark = mark;
        c->kver = ver;
        c->capk = cap;
    }
    FKern *K = &c->k[c->nk];
    memset(K, 0, sizeof *K);
    K->alive = 1;
    K->kind = kind;
    c->kmark[c->nk] = 0;
    c->kver[c->nk] = 0;
    return c->nk++;
}

/* A launch for node f alone. */
static int fz_kernel_for(FuseCtx *c, int f) {
    const FNode *n = fz_n(c, f);
    int kind = n->op == F_GEMM ? FK_GEMM : n->op == F_REDUCE ? FK_REDUCE : fz_cat(n->op) == FC_ANCHOR ? FK_OPAQUE : FK_ELEM;
    int kid = fz_new_kernel(c, kind);
    FKern *K = &c->k[kid];
    fuse_ivec_push(c->tmp, &K->members, f);
    c->owner[f] = kid;
    if (kind == FK_REDUCE) {
        const FNode *x = fz_n(c, n->in[0]);
        K->rank = x->rank;
        memcpy(K->shape, x->shape, sizeof K->shape);
        K->mask = (uint32_t)n->ia[0];
    } else if (kind == FK_ELEM) {
        K->rank = n->rank;
        memcpy(K->shape, n->shape, sizeof K->shape);
        K->nseg = 1;
        K->seg = arena_alloc(c->tmp, sizeof(FSeg));
        K->seg[0].rank = n->rank;
        memcpy(K->seg[0].shape, n->shape, sizeof K->seg[0].shape);
        fuse_ivec_push(c->tmp, &K->seg[0].members, f);
    }
    return kid;
}

/* What kernel kid computes inline, what it loads, and which kernels it reads from. */
static void fz_eval(FuseCtx *c, int kid) {
    FKern *K = &c->k[kid];
    K->reads.n = K->inl.n = K->deps.n = 0;
    int st = ++c->stampv, sp = 0;
    for (int i = 0; i < K->members.n; i++) {
        c->stamp[K->members.v[i]] = st;
        c->work[sp++] = K->members.v[i];
    }
    while (sp) {
        const FNode *n = fz_n(c, c->work[--sp]);
        for (int i = 0; i < n->nin; i++) {
            int y = n->in[i];
            if (c->stamp[y] == st) continue;
            c->stamp[y] = st;
            if (c->owner[y] == kid) continue;
            if (c->cat[y] == FC_INLINE && !c->mat[y]) {
                fuse_ivec_push(c->tmp, &K->inl, y);
                c->work[sp++] = y;
            } else {
                fuse_ivec_push(c->tmp, &K->reads, y);
                if (c->owner[y] >= 0 && !fuse_ivec_has(&K->deps, c->owner[y])) fuse_ivec_push(c->tmp, &K->deps, c->owner[y]);
            }
        }
    }
}

static void fz_eval_all(FuseCtx *c) {
    for (int kid = 0; kid < c->nk; kid++)
        if (c->k[kid].alive) fz_eval(c, kid);
}

/* A path src -> x -> ... -> dst through another launch x (then src and dst cannot merge). */
static int fz_reaches(FuseCtx *c, int src, int dst) {
    int mark = ++c->kmarkv, sp = 0;
    const FKern *D = &c->k[dst];
    for (int i = 0; i < D->deps.n; i++) {
        int x = D->deps.v[i];
        if (x != src && c->kmark[x] != mark) {
            c->kmark[x] = mark;
            c->work[sp++] = x;
        }
    }
    while (sp) {
        const FKern *X = &c->k[c->work[--sp]];
        for (int i = 0; i < X->deps.n; i++) {
            int y = X->deps.v[i];
            if (y == src) return 1;
            if (c->kmark[y] != mark) {
                c->kmark[y] = mark;
                c->work[sp++] = y;
            }
        }
    }
    return 0;
}

/* ---- spaces --------------------------------------------------------------------------------------- */

static int fz_same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
    if (ra != rb) return 0;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* fuse_internal.h */
int fuse_squeeze_eq(int ra, const int64_t *a, int rb, const int64_t *b) {
    int i = 0, j = 0;
    for (;;) {
        while (i < ra && a[i] == 1) i++;
        while (j < rb && b[j] == 1) j++;
        if (i == ra || j == rb) return i == ra && j == rb;
        if (a[i++] != b[j++]) return 0;
    }
}

static int fz_same_space(const FKern *a, const FKern *b) {
    return a->mask == b->mask && fz_same_shape(a->rank, a->shape, b->rank, b->shape);
}

static void fz_kept(const FKern *K, int64_t *kept) {
    for (int a = 0; a < GRAPH_MAX_RANK; a++) kept[a] = a >= K->rank || K->mask & (1u << a) ? 1 : K->shape[a];
}

/* A row reduction: more than one row, and the reduced axes trailing (norms, softmax, cross-entropy
 * over the last axis: contiguous rows). Such a kernel also computes and stores full-shaped values,
 * a loop over its row at a time. A reduction over leading or middle axes (a bias gradient summing
 * over every row, a softmax over axis 1) walks strided columns, often with few work items: it
 * stores only its per-row results, and full-shaped values get an elementwise kernel of their own. */
static int fz_row_kernel(const FKern *K) {
    int64_t keptn = 1;
    int seen = 0;
    for (int a = 0; a < K->rank; a++) {
        if (K->mask & (1u << a)) seen = 1;
        else {
            if (seen && K->shape[a] != 1) return 0;
            keptn *= K->shape[a];
        }
    }
    return keptn > 1;
}

static int fz_elem_single(const FKern *K) { return K->kind == FK_ELEM && K->nseg == 1; }

/* An elementwise kernel whose shape fits reduction R: its input's shape (row kernels only) or its
 * output's. */
static int fz_fits_reduction(const FKern *E, const FKern *R) {
    int64_t kept[GRAPH_MAX_RANK] = {0};
    fz_kept(R, kept);
    if (fuse_squeeze_eq(E->rank, E->shape, R->rank, kept)) return 1;
    return fz_row_kernel(R) && fuse_squeeze_eq(E->rank, E->shape, R->rank, R->shape);
}

/* ---- merging -------------------------------------------------------------------------------------- */

/* Moves b's members into a (a keeps its kind and space) and updates the launch graph. */
static void fz_merge_into(FuseCtx *c, int a, int b) {
    FKern *A = &c->k[a], *B = &c->k[b];
    for (int i = 0; i < B->members.n; i++) {
        fuse_ivec_push(c->tmp, &A->members, B->members.v[i]);
        c->owner[B->members.v[i]] = a;
    }
    fuse_ivec_sort(&A->members);
    if (A->kind == FK_ELEM && B->kind == FK_ELEM) {
        for (int s = 0; s < B->nseg; s++) {
            int into = -1;
            for (int t = 0; t < A->nseg && into < 0; t++)
                if (fz_same_shape(A->seg[t].rank, A->seg[t].shape, B->seg[s].rank, B->seg[s].shape)) into = t;
            if (into < 0) {
                FSeg *ns = arena_alloc(c->tmp, sizeof(FSeg) * (size_t)(A->nseg + 1));
                memcpy(ns, A->seg, sizeof(FSeg) * (size_t)A->nseg);
                ns[A->nseg] = B->seg[s];
                A->seg = ns;
                A->nseg++;
                continue;
            }
            for (int i = 0; i < B->seg[s].members.n; i++) fuse_ivec_push(c->tmp, &A->seg[into].members, B->seg[s].members.v[i]);
            fuse_ivec_sort(&A->seg[into].members);
        }
    }
    B->alive = 0;
    B->members.n = 0;
    c->kver[a]++;
    c->kver[b]++;
    for (int kid = 0; kid < c->nk; kid++) { /* readers of b now read a */
        FKern *X = &c->k[kid];
        if (!X->alive || kid == a) continue;
        for (int i = 0; i < X->deps.n; i++)
            if (X->deps.v[i] == b) {
                X->deps.v[i] = a;
                for (int j = 0; j < X->deps.n; j++)
                    if (j != i && X->deps.v[j] == a) {
                        X->deps.v[i] = X->deps.v[--X->deps.n];
                        break;
                    }
                break;
            }
    }
    fz_eval(c, a);
}

/* The failed-merge cache: (a, version of a, b, version of b). */
typedef struct FzFail {
    int64_t *keys;
    int cap, n;
} FzFail;

static uint64_t fz_fail_hash(int64_t k) { return ((uint64_t)k * 0x9E3779B97F4A7C15ull) >> 17; }

static int64_t fz_fail_key(const FuseCtx *c, int a, int b) {
    return ((int64_t)a << 42) ^ ((int64_t)c->kver[a] << 32) ^ ((int64_t)b << 10) ^ (int64_t)c->kver[b];
}

static int fz_failed(const FzFail *f, int64_t key) {
    if (!f->cap) return 0;
    for (uint64_t h = fz_fail_hash(key) & (uint64_t)(f->cap - 1);; h = (h + 1) & (uint64_t)(f->cap - 1)) {
        if (f->keys[h] == -1) return 0;
        if (f->keys[h] == key) return 1;
    }
}

static void fz_fail_add(FuseCtx *c, FzFail *f, int64_t key) {
    if ((f->n + 1) * 2 > f->cap) {
        int cap = f->cap ? f->cap * 2 : 1024;
        int64_t *k = arena_alloc(c->tmp, sizeof(int64_t) * (size_t)cap);
        for (int i = 0; i < cap; i++) k[i] = -1;
        for (int i = 0; i < f->cap; i++) {
            if (f->keys[i] == -1) continue;
            uint64_t h = fz_fail_hash(f->keys[i]) & (uint64_t)(cap - 1);
            while (k[h] != -1) h = (h + 1) & (uint64_t)(cap - 1);
            k[h] = f->keys[i];
        }
        f->keys = k;
        f->cap = cap;
    }
    uint64_t h = fz_fail_hash(key) & (uint64_t)(f->cap - 1);
    while (f->keys[h] != -1) h = (h + 1) & (uint64_t)(f->cap - 1);
    f->keys[h] = key;
    f->n++;
}

/* Merges b into a when the launch graph stays acyclic and (trial) the kernel can be written. */
static int fz_try_merge(FuseCtx *c, FzFail *fail, int a, int b, int trial) {
    int64_t key = fz_fail_key(c, a, b);
    if (fz_failed(fail, key)) return 0;
    if (fz_reaches(c, a, b) || fz_reaches(c, b, a)) {
        fz_fail_add(c, fail, key);
        return 0;
    }
    if (trial) { /* the merged kernel, written on a scratch arena and thrown away */
        int m = fz_new_kernel(c, c->k[a].kind);
        FKern *A = &c->k[a], *B = &c->k[b], *M = &c->k[m];
        M->rank = A->rank;
        memcpy(M->shape, A->shape, sizeof M->shape);
        M->mask = A->mask;
        for (int i = 0; i < A->members.n; i++) fuse_ivec_push(c->tmp, &M->members, A->members.v[i]);
        for (int i = 0; i < B->members.n; i++) fuse_ivec_push(c->tmp, &M->members, B->members.v[i]);
        fuse_ivec_sort(&M->members);
        for (int i = 0; i < M->members.n; i++) c->owner[M->members.v[i]] = m;
        Arena scratch = {0};
        const char *why = NULL;
        Kernel *k = fuse_gen_kernel(c, m, &scratch, &why);
        arena_free(&scratch);
        A = &c->k[a];
        B = &c->k[b];
        for (int i = 0; i < A->members.n; i++) c->owner[A->members.v[i]] = a;
        for (int i = 0; i < B->members.n; i++) c->owner[B->members.v[i]] = b;
        c->nk--;
        if (!k) {
            fz_fail_add(c, fail, key);
            return 0;
        }
    }
    fz_merge_into(c, a, b);
    return 1;
}

/* Rule 5: kernel e is one permute/reshape chain of the attention result owned by o (nothing else
 * reads the links). */
static int fz_view_of_attention(const FuseCtx *c, int o, const FKern *E) {
    if (!fz_elem_single(E) || E->members.n != 1) return 0;
    const FNode *v = fz_n(c, E->members.v[0]);
    if (v->op != F_PERMUTE && v->op != F_RESHAPE) return 0;
    int x = v->in[0];
    while (c->owner[x] != o) {
        const FNode *n = fz_n(c, x);
        if ((n->op != F_PERMUTE && n->op != F_RESHAPE) || c->users[x].n != 1 || c->isout[x] || c->mat[x]) return 0;
        x = n->in[0];
    }
    const FNode *a = fz_n(c, x);
    return a->op >= F_ATTN && a->op <= F_ATTN_BWD_V && a->op != F_ATTN_LSE && a->op != F_ATTN_STATS && c->users[x].n == 1 &&
           !c->isout[x];
}

/* Rules 1-6 for producer p and consumer k. */
static int fz_try_pair(FuseCtx *c, FzFail *fail, int p, int k) {
    const FKern *P = &c->k[p], *K = &c->k[k];
    if (P->kind == FK_REDUCE && K->kind == FK_REDUCE && fz_same_space(P, K)) return fz_try_merge(c, fail, p, k, 1);
    if (fz_elem_single(P) && K->kind == FK_REDUCE && fz_fits_reduction(P, K)) return fz_try_merge(c, fail, k, p, 1);
    if (P->kind == FK_REDUCE && fz_elem_single(K) && fz_fits_reduction(K, P)) return fz_try_merge(c, fail, p, k, 1);
    if (fz_elem_single(P) && fz_elem_single(K) && fz_same_shape(P->rank, P->shape, K->rank, K->shape))
        return fz_try_merge(c, fail, p, k, 0);
    if (P->kind == FK_OPAQUE && K->kind == FK_ELEM && fz_view_of_attention(c, p, K)) return fz_try_merge(c, fail, p, k, 0);
    return 0;
}

/* Rule 6: the forward's statistics (F_ATTN_LSE, alone in kernel k) go into the kernel of the
 * attention with the same inputs and attributes, which computes them anyway. */
static int fz_attention_lse(FuseCtx *c, FzFail *fail, int a, int k) {
    const FKern *A = &c->k[a], *K = &c->k[k];
    if (A->kind != FK_OPAQUE || K->kind != FK_OPAQUE || K->members.n != 1) return 0;
    const FNode *l = fz_n(c, K->members.v[0]);
    if (l->op != F_ATTN_LSE) return 0;
    for (int i = 0; i < A->members.n; i++) {
        const FNode *n = fz_n(c, A->members.v[i]);
        if (n->op != F_ATTN || n->nin != l->nin || n->ia[0] != l->ia[0] || n->ia[1] != l->ia[1] || n->fa[0] != l->fa[0]) continue;
        int same = 1;
        for (int j = 0; j < n->nin; j++) same &= n->in[j] == l->in[j];
        if (same) return fz_try_merge(c, fail, a, k, 0);
    }
    return 0;
}

/* The dedicated op of an opaque kernel (its other members are views of its result, rule 5). */
static const FNode *fz_opaque_op(const FuseCtx *c, const FKern *K) {
    const FNode *op = NULL;
    for (int i = 0; i < K->members.n; i++) {
        const FNode *n = fz_n(c, K->members.v[i]);
        if (n->op >= F_ATTN && n->op <= F_SEG_NORM) {
            if (op) return NULL;
            op = n;
        }
    }
    return op;
}

/* Rule 8: the backward of k and the backward of v of one attention (the same inputs). */
static int fz_attention_kv(const FuseCtx *c, const FKern *A, const FKern *B) {
    if (A->kind != FK_OPAQUE || B->kind != FK_OPAQUE) return 0;
    const FNode *a = fz_opaque_op(c, A), *b = fz_opaque_op(c, B);
    if (!a || !b || !((a->op == F_ATTN_BWD_K && b->op == F_ATTN_BWD_V) || (a->op == F_ATTN_BWD_V && b->op == F_ATTN_BWD_K)))
        return 0;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i]) return 0;
    return 1;
}

/* Siblings a and b (a < b) both reading r: the backward of k and of v of one attention (rule 8);
 * otherwise r must be a buffer this step computes, of the size of their iteration space:
 * reductions of one space, or elementwise kernels of one shape. */
static int fz_try_siblings(FuseCtx *c, FzFail *fail, int a, int b, int r) {
    const FKern *A = &c->k[a], *B = &c->k[b];
    if (fz_attention_kv(c, A, B)) return fz_try_merge(c, fail, a, b, 0); /* always writable */
    if (fz_attention_lse(c, fail, a, b) || fz_attention_lse(c, fail, b, a)) return 1;
    int64_t n = 1;
    for (int d = 0; d < A->rank; d++) n *= A->shape[d];
    if (fz_n(c, r)->op == F_LEAF || fuse_numel(fz_n(c, r)) != n) return 0; /* a buffer of this step, of full size */
    if (A->kind == FK_REDUCE && B->kind == FK_REDUCE && fz_same_space(A, B)) return fz_try_merge(c, fail, a, b, 1);
    if (fz_elem_single(A) && fz_elem_single(B) && fz_same_shape(A->rank, A->shape, B->rank, B->shape))
        return fz_try_merge(c, fail, a, b, 0);
    return 0;
}

static void fz_merge_all(FuseCtx *c, FzFail *fail) {
    for (int progress = 1; progress;) {
        progress = 0;
        for (int kid = 0; kid < c->nk; kid++) {
            for (int again = 1; again && c->k[kid].alive;) {
                again = 0;
                for (int i = 0; i < c->k[kid].deps.n && c->k[kid].alive; i++)
                    if (fz_try_pair(c, fail, c->k[kid].deps.v[i], kid)) {
                        again = progress = 1;
                        break;
                    }
            }
        }
        /* siblings: kernels reading a common node, found through each node's readers */
        int restart = 1;
        while (restart) {
            restart = 0;
            IVec *readers = arena_alloc(c->tmp, sizeof(IVec) * (size_t)c->n);
            for (int kid = 0; kid < c->nk; kid++)
                if (c->k[kid].alive)
                    for (int i = 0; i < c->k[kid].reads.n; i++) fuse_ivec_push(c->tmp, &readers[c->k[kid].reads.v[i]], kid);
            for (int r = 0; r < c->n && !restart; r++)
                for (int i = 0; i < readers[r].n && !restart; i++)
                    for (int j = i + 1; j < readers[r].n && !restart; j++)
                        if (fz_try_siblings(c, fail, readers[r].v[i], readers[r].v[j], r)) restart = progress = 1;
        }
    }
}

/* ---- the partition ---------------------------------------------------------------------------------- */

/* x == y, or a path x -> ... -> y. */
static int fz_ancestor(FuseCtx *c, int x, int y) {
    if (x == y) return 1;
    int mark = ++c->kmarkv, sp = 0;
    c->kmark[y] = mark;
    c->work[sp++] = y;
    while (sp) {
        const FKern *Y = &c->k[c->work[--sp]];
        for (int i = 0; i < Y->deps.n; i++) {
            int z = Y->deps.v[i];
            if (z == x) return 1;
            if (c->kmark[z] != mark) {
                c->kmark[z] = mark;
                c->work[sp++] = z;
            }
        }
    }
    return 0;
}

/* A shared map costing at most this many arithmetic nodes, and reading at most one buffer as
 * large as itself, is computed again by every kernel that needs it rather than stored: that saves
 * a store, a load and a buffer for a few operations (layernorm's x - mean and x-hat in its
 * backward, recomputed from x and the row statistics; a bias add before gelu, from the GEMM's
 * result). Reading two large buffers to save one (a residual sum) is not cheaper: stored. */
#define FZ_REMAT_OPS 3
#define FZ_MAX_INLINE_DEPTH 256 /* inline nodes above the nearest buffer (fz_bound_inline_depth) */

/* The arithmetic nodes (maps, dropout, rope) a kernel evaluates to compute f from buffers, or
 * INT32_MAX when that reads more than one buffer of f's size or more. */
static int fz_remat_cost(FuseCtx *c, int f) {
    int st = ++c->stampv, sp = 0, cost = 0, big = 0;
    int64_t size = fuse_numel(fz_n(c, f));
    c->stamp[f] = st;
    c->work[sp++] = f;
    while (sp) {
        const FNode *x = fz_n(c, c->work[--sp]);
        cost += fz_compute(x->op);
        for (int i = 0; i < x->nin; i++) {
            int y = x->in[i];
            if (c->stamp[y] == st) continue;
            c->stamp[y] = st;
            if (c->cat[y] == FC_INLINE && !c->mat[y]) c->work[sp++] = y;
            else if (fuse_numel(fz_n(c, y)) >= size) big++;
        }
    }
    return big > 1 ? INT32_MAX : cost;
}

/* Map f is computed inline by several kernels: give it a buffer. A launch of its own is safe when
 * none of those kernels produces what f reads (else the launch graph would have a cycle: f's
 * launch reading a kernel that reads f); otherwise f is pinned to the first of them in launch
 * order (it will be stored by the kernel holding the pin's node), when f fits that kernel.
 * Returns 1 when f gets a buffer, 0 when nothing is needed, -1 when f must stay inline. Changes
 * no kernel: the next round of the partition starts afresh. */
static int fz_materialise_shared(FuseCtx *c, int f) {
    IVec S = {0}, O = {0};
    for (int kid = 0; kid < c->nk; kid++)
        if (c->k[kid].alive && fuse_ivec_has(&c->k[kid].inl, f)) fuse_ivec_push(c->tmp, &S, kid);
    if (S.n < 2) return 0;
    /* the launches owning what f's inline closure reads */
    int st = ++c->stampv, sp = 0;
    c->stamp[f] = st;
    c->work[sp++] = f;
    while (sp) {
        const FNode *x = fz_n(c, c->work[--sp]);
        for (int i = 0; i < x->nin; i++) {
            int y = x->in[i];
            if (c->stamp[y] == st) continue;
            c->stamp[y] = st;
            if (c->cat[y] == FC_INLINE && !c->mat[y] && c->owner[y] < 0) c->work[sp++] = y;
            else if (c->owner[y] >= 0 && !fuse_ivec_has(&O, c->owner[y])) fuse_ivec_push(c->tmp, &O, c->owner[y]);
        }
    }
    int safe = 1;
    for (int i = 0; i < S.n && safe; i++)
        for (int j = 0; j < O.n && safe; j++) safe = !fz_ancestor(c, S.v[i], O.v[j]);
    if (safe) {
        c->mat[f] = 1;
        return 1;
    }
    int first = -1; /* an evaluator no other evaluator leads to */
    for (int i = 0; i < S.n && first < 0; i++) {
        int minimal = 1;
        for (int j = 0; j < S.n && minimal; j++) minimal = j == i || !fz_ancestor(c, S.v[j], S.v[i]);
        if (minimal) first = S.v[i];
    }
    if (first < 0) return -1;
    const FKern *K = &c->k[first];
    const FNode *x = fz_n(c, f);
    int pin = -1;
    if (K->kind == FK_ELEM && K->nseg == 1 && fz_same_shape(K->rank, K->shape, x->rank, x->shape)) {
        pin = K->members.v[0];
    } else if (K->kind == FK_REDUCE) {
        int64_t kept[GRAPH_MAX_RANK] = {0};
        fz_kept(K, kept);
        if (fuse_squeeze_eq(x->rank, x->shape, K->rank, kept) ||
            (fz_row_kernel(K) && fuse_squeeze_eq(x->rank, x->shape, K->rank, K->shape)))
            for (int i = 0; i < K->members.n && pin < 0; i++)
                if (fz_n(c, K->members.v[i])->op == F_REDUCE) pin = K->members.v[i];
    }
    if (pin < 0) return -1;
    c->mat[f] = 1;
    c->pin[f] = pin;
    return 1;
}

/* The launches of one round: one per anchored or materialised node, a pinned node joining the
 * launch of its pin. */
static void fz_build_kernels(FuseCtx *c) {
    c->nk = 0;
    for (int f = 0; f < c->n; f++) c->owner[f] = -1;
    for (int f = 0; f < c->n; f++)
        if (c->live[f] && c->pin[f] < 0 && (c->cat[f] == FC_ANCHOR || (c->cat[f] == FC_INLINE && c->mat[f]))) fz_kernel_for(c, f);
    for (int placed = 1; placed;) {
        placed = 0;
        for (int f = 0; f < c->n; f++) {
            if (!c->live[f] || c->pin[f] < 0 || c->owner[f] >= 0 || c->owner[c->pin[f]] < 0) continue;
            int kid = c->owner[c->pin[f]];
            FKern *K = &c->k[kid];
            fuse_ivec_push(c->tmp, &K->members, f);
            fuse_ivec_sort(&K->members);
            if (K->kind == FK_ELEM) {
                fuse_ivec_push(c->tmp, &K->seg[0].members, f);
                fuse_ivec_sort(&K->seg[0].members);
            }
            c->owner[f] = kid;
            placed = 1;
        }
    }
    for (int f = 0; f < c->n; f++)
        if (c->live[f] && c->pin[f] >= 0 && c->owner[f] < 0)
            INTERNAL("fuse: node %d is pinned to %d, which has no launch", f, c->pin[f]);
}

/* Kernels of a cycle in the launch graph, if any (a pinned node whose pin turned out wrong):
 * marks them in cyc and returns how many. */
static int fz_cycles(FuseCtx *c, unsigned char *cyc) {
    int *indeg = arena_alloc(c->tmp, sizeof(int) * (size_t)(c->nk + 1));
    int *queue = arena_alloc(c->tmp, sizeof(int) * (size_t)(c->nk + 1));
    int qn = 0, alive = 0, done = 0;
    for (int kid = 0; kid < c->nk; kid++) {
        cyc[kid] = 0;
        if (!c->k[kid].alive) continue;
        alive++;
        indeg[kid] = c->k[kid].deps.n;
        if (!indeg[kid]) queue[qn++] = kid;
    }
    for (int qi = 0; qi < qn; qi++, done++)
        for (int kid = 0; kid < c->nk; kid++)
            if (c->k[kid].alive && fuse_ivec_has(&c->k[kid].deps, queue[qi]) && --indeg[kid] == 0) queue[qn++] = kid;
    for (int kid = 0; kid < c->nk; kid++) cyc[kid] = c->k[kid].alive && indeg[kid] > 0;
    return alive - done;
}

/* Marks the node a dedicated kernel, a GEMM or the step's caller must read from a buffer: f, or
 * what f is a pure view of (a constant or iota needs no buffer unless even_const). */
static void fz_force_base(FuseCtx *c, int f, int through_views, int even_const) {
    while (through_views && fz_pure_view(fz_n(c, f)->op)) f = fz_n(c, f)->in[0];
    FOp op = fz_n(c, f)->op;
    if (op == F_LEAF || (!even_const && (op == F_CONST || op == F_IOTA))) return;
    c->forced[f] = 1;
    if (c->cat[f] == FC_INLINE) c->mat[f] = 1;
}

/* Bounds the chains of inline nodes: a node more than FZ_MAX_INLINE_DEPTH inline nodes above the
 * nearest buffer (a leaf, an anchored or materialised node) gets a buffer of its own, so that the
 * code generator's recursion over what a kernel computes inline (fuse_codegen.c's cg_value) stays
 * shallow however long the program's elementwise chain (x = x + 1 twenty thousand times). Node ids
 * are topological: every input precedes its user. */
static void fz_bound_inline_depth(FuseCtx *c) {
    int *depth = arena_alloc(c->tmp, sizeof(int) * (size_t)c->n);
    for (int f = 0; f < c->n; f++) {
        const FNode *x = fz_n(c, f);
        if (!c->live[f] || c->cat[f] != FC_INLINE || c->mat[f]) continue;
        int d = 0;
        for (int i = 0; i < x->nin; i++) {
            if (x->in[i] >= f) INTERNAL("fuse: node %d reads node %d, which does not precede it", f, x->in[i]);
            if (depth[x->in[i]] > d) d = depth[x->in[i]];
        }
        if (d + 1 > FZ_MAX_INLINE_DEPTH && x->op != F_CONST && x->op != F_IOTA) {
            c->forced[f] = c->mat[f] = 1; /* forced: never sent back inline when only its own kernel reads it */
            d = -1;
        }
        depth[f] = d + 1;
    }
}

static void fz_partition(FuseCtx *c) {
    int n = c->n;
    for (int f = 0; f < n; f++) {
        if (!c->live[f]) continue;
        const FNode *x = fz_n(c, f);
        if (c->isout[f]) fz_force_base(c, f, 0, 1);
        if (x->keep && c->cat[f] == FC_INLINE) c->mat[f] = 1;
        if (x->op == F_GEMM) {
            for (int i = 0; i < x->nin; i++) fz_force_base(c, x->in[i], 0, 1);
        } else if (x->op == F_LORA_S || x->op == F_LORA) {
            /* read as the GEMMs they replace read them; F_LORA's S is its own kernel's member, stored
             * only when another launch reads it */
            for (int i = x->op == F_LORA; i < x->nin; i++) fz_force_base(c, x->in[i], 0, 1);
        } else if (x->op == F_ATTN_STATS) {
            /* a kernel body of its own, reading its inputs as any kernel does: forcing the base of
             * o (fuse_lower.c's fl_attn_output: inverse views of where the forward stored it) would
             * give the attention's result a second buffer */
        } else if (x->op >= F_ATTN && x->op <= F_TOPK) {
            for (int i = 0; i < x->nin; i++) fz_force_base(c, x->in[i], 1, 0);
        } else if (x->op == F_SCATTER_ADD) {
            fz_force_base(c, x->in[1], 1, 0);
        } else if (x->op == F_CE_STATS || x->op == F_CE_GRAD) {
            /* the logits from a buffer, read through views (the padded vocabulary's slice) and a
             * widening cast: bf16 logits are not copied to f32 for the classifier's kernels, each
             * widens what it reads (the cast is cheap to recompute: FZ_REMAT_OPS) */
            int in = x->in[x->op == F_CE_GRAD];
            while (fz_pure_view(fz_n(c, in)->op)) in = fz_n(c, in)->in[0];
            const FNode *y = fz_n(c, in);
            fz_force_base(c, y->op == F_MAP && y->kop == K_CAST ? y->in[0] : in, 1, 0);
        }
    }
    fz_bound_inline_depth(c);
    int *cnt = arena_alloc(c->tmp, sizeof(int) * (size_t)n);
    unsigned char *keep_inline = arena_alloc(c->tmp, (size_t)n); /* shared, but no kernel can own it */
    for (int round = 0;; round++) {
        if (round > 2 * n + 2) INTERNAL("fuse: the partition does not settle");
        FzFail fail = {0};
        fz_build_kernels(c);
        fz_eval_all(c);
        fz_merge_all(c, &fail);
        unsigned char *cyc = arena_alloc(c->tmp, (size_t)c->nk + 1);
        if (fz_cycles(c, cyc)) { /* undo the pins that made it, and start again */
            int undone = 0;
            for (int again = 1; again;) {
                again = 0;
                for (int f = 0; f < n; f++)
                    if (c->pin[f] >= 0 && ((c->owner[f] >= 0 && cyc[c->owner[f]]) || keep_inline[c->pin[f]])) {
                        c->pin[f] = -1;
                        c->mat[f] = c->forced[f];
                        keep_inline[f] = 1;
                        undone = again = 1;
                    }
            }
            if (!undone) INTERNAL("fuse: the launches depend on each other in a cycle");
            continue;
        }
        /* a computed value two kernels would both compute: materialise it (scalars excepted) */
        memset(cnt, 0, sizeof(int) * (size_t)n);
        for (int kid = 0; kid < c->nk; kid++)
            if (c->k[kid].alive)
                for (int i = 0; i < c->k[kid].inl.n; i++) cnt[c->k[kid].inl.v[i]]++;
        int added = 0;
        for (int f = 0; f < n; f++)
            if (cnt[f] >= 2 && !keep_inline[f] && !c->mat[f] && fz_compute(fz_n(c, f)->op) && fuse_numel(fz_n(c, f)) > 1) {
                if (fz_remat_cost(c, f) <= FZ_REMAT_OPS) { /* cheaper to compute again than to store and load */
                    keep_inline[f] = 1;
                    continue;
                }
                int r = fz_materialise_shared(c, f);
                if (r < 0) keep_inline[f] = 1;
                added += r > 0;
            }
        if (!added) break;
    }
    /* a materialised map that only its own kernel reads goes back to being inline */
    unsigned char *read_elsewhere = arena_alloc(c->tmp, (size_t)n);
    for (int kid = 0; kid < c->nk; kid++)
        if (c->k[kid].alive)
            for (int i = 0; i < c->k[kid].reads.n; i++) read_elsewhere[c->k[kid].reads.v[i]] = 1;
    for (int kid = 0; kid < c->nk; kid++) {
        FKern *K = &c->k[kid];
        if (!K->alive) continue;
        for (int i = 0; i < K->members.n; i++) {
            int f = K->members.v[i];
            if (c->cat[f] != FC_INLINE || c->forced[f] || read_elsewhere[f]) continue;
            int used = 0; /* by another member or what it inlines */
            for (int j = 0; j < c->users[f].n && !used; j++) {
                int u = c->users[f].v[j];
                used = c->owner[u] == kid || fuse_ivec_has(&K->inl, u);
            }
            if (!used) continue;
            c->mat[f] = 0;
            c->owner[f] = -1;
            K->members.v[i] = K->members.v[--K->members.n];
            fuse_ivec_sort(&K->members);
            for (int s = 0; s < K->nseg; s++)
                for (int j = 0; j < K->seg[s].members.n; j++)
                    if (K->seg[s].members.v[j] == f) K->seg[s].members.v[j] = K->seg[s].members.v[--K->seg[s].members.n];
            i = -1;
        }
    }
    fz_eval_all(c);
    /* anchored results another launch reads, or that are asked for, get a buffer */
    memset(read_elsewhere, 0, (size_t)n);
    for (int kid = 0; kid < c->nk; kid++)
        if (c->k[kid].alive)
            for (int i = 0; i < c->k[kid].reads.n; i++) read_elsewhere[c->k[kid].reads.v[i]] = 1;
    for (int f = 0; f < n; f++)
        if (c->live[f] && c->cat[f] == FC_ANCHOR) c->mat[f] = read_elsewhere[f] || c->isout[f] || c->forced[f];
}

/* ---- order ------------------------------------------------------------------------------------------ */

static int fz_params_only(FuseCtx *c, int kid);

/* Topological order of the live launches, the earliest graph position first (but see
 * fuse_casts_apart). */
static int fz_schedule(FuseCtx *c, int *order) {
    int nl = 0;
    unsigned char *placed = arena_alloc(c->tmp, (size_t)c->nk + 1);
    int *key = arena_alloc(c->tmp, sizeof(int) * (size_t)c->nk + 1);
    int alive = 0;
    for (int kid = 0; kid < c->nk; kid++) {
        if (!c->k[kid].alive) continue;
        alive++;
        key[kid] = c->k[kid].members.n ? c->k[kid].members.v[0] : 0;
    }
    /* fuse_casts_apart (ZeRO-3): a kernel that loads only parameters takes the key of its first
     * reader, so it is placed just before that launch rather than with the graph's casts at the
     * step's start (a reader cannot be ready before it; the keys of others are unique) */
    if (c->casts_apart) {
        int *first = arena_alloc(c->tmp, sizeof(int) * (size_t)c->nk + 1);
        for (int kid = 0; kid < c->nk; kid++) first[kid] = -1;
        for (int kid = 0; kid < c->nk; kid++)
            if (c->k[kid].alive)
                for (int i = 0; i < c->k[kid].deps.n; i++) {
                    int d = c->k[kid].deps.v[i];
                    if (first[d] < 0 || key[kid] < first[d]) first[d] = key[kid];
                }
        for (int kid = 0; kid < c->nk; kid++)
            if (c->k[kid].alive && first[kid] >= 0 && fz_params_only(c, kid)) key[kid] = first[kid];
    }
    while (nl < alive) {
        int best = -1;
        for (int kid = 0; kid < c->nk; kid++) {
            if (!c->k[kid].alive || placed[kid]) continue;
            int ready = 1;
            for (int i = 0; i < c->k[kid].deps.n && ready; i++) ready = placed[c->k[kid].deps.v[i]];
            if (ready && (best < 0 || key[kid] < key[best])) best = kid;
        }
        if (best < 0) INTERNAL("fuse: the launches depend on each other in a cycle");
        placed[best] = 1;
        c->k[best].order = nl;
        order[nl++] = best;
    }
    return nl;
}

/* A kernel that loads nothing but parameters (a bf16 program's weight casts). In the step's
 * schedule (a graph with a loss) its values are the same at every micro-batch of an optimizer
 * step, so the plan runs its launch once a step (plan.h, PlanMemory.param_only); rule 7 keeps it
 * apart from kernels that load anything else (an embedding's gather), which must run every time. */
static int fz_params_only(FuseCtx *c, int kid) {
    if (c->g->loss < 0) return 0;
    fz_eval(c, kid);
    const FKern *K = &c->k[kid];
    for (int i = 0; i < K->reads.n; i++) {
        const FNode *n = fz_n(c, K->reads.v[i]);
        if (n->op != F_LEAF || graph_node(c->g, (int)n->ia[0])->op != G_PARAM) return 0;
    }
    return 1;
}

/* Rule 7: consecutive launches that do not read each other become one kernel when both are
 * elementwise (a segment each) or both reductions of one shape and axes (one loop), and either
 * both or neither load only parameters (fz_params_only); with fuse_casts_apart, neither. */
static int fz_horizontal(FuseCtx *c, int *order, int nl) {
    int m = 0;
    for (int i = 0; i < nl; i++) {
        int kid = order[i];
        int po = m > 0 ? fz_params_only(c, kid) : 0;
        if (m > 0 && !fuse_ivec_has(&c->k[kid].deps, order[m - 1]) && fz_params_only(c, order[m - 1]) == po &&
            !(po && c->casts_apart)) {
            const FKern *P = &c->k[order[m - 1]], *K = &c->k[kid];
            int ok = P->kind == FK_ELEM && K->kind == FK_ELEM;
            if (P->kind == FK_REDUCE && K->kind == FK_REDUCE && fz_same_space(P, K)) {
                Arena scratch = {0}; /* independent reductions always fit one kernel; checked anyway */
                int m2 = fz_new_kernel(c, FK_REDUCE);
                FKern *M = &c->k[m2];
                P = &c->k[order[m - 1]];
                K = &c->k[kid];
                M->rank = P->rank;
                memcpy(M->shape, P->shape, sizeof M->shape);
                M->mask = P->mask;
                for (int j = 0; j < P->members.n; j++) fuse_ivec_push(c->tmp, &M->members, P->members.v[j]);
                for (int j = 0; j < K->members.n; j++) fuse_ivec_push(c->tmp, &M->members, K->members.v[j]);
                fuse_ivec_sort(&M->members);
                for (int j = 0; j < M->members.n; j++) c->owner[M->members.v[j]] = m2;
                ok = fuse_gen_kernel(c, m2, &scratch, NULL) != NULL;
                arena_free(&scratch);
                for (int j = 0; j < c->k[order[m - 1]].members.n; j++) c->owner[c->k[order[m - 1]].members.v[j]] = order[m - 1];
                for (int j = 0; j < c->k[kid].members.n; j++) c->owner[c->k[kid].members.v[j]] = kid;
                c->nk--;
            }
            if (ok) {
                fz_merge_into(c, order[m - 1], kid);
                continue;
            }
        }
        order[m++] = kid;
    }
    for (int i = 0; i < m; i++) c->k[order[i]].order = i;
    return m;
}

/* ---- the entry ------------------------------------------------------------------------------------ */

/* The partition's per-node state: each node's category and pin, the outputs, what they need, and
 * each needed node's users. */
static void fz_setup(FuseCtx *c) {
    Arena *tmp = c->tmp;
    const FusedGraph *fg = c->fg;
    int n = c->n = fg->n;
    c->live = arena_alloc(tmp, (size_t)n + 1);
    c->cat = arena_alloc(tmp, (size_t)n + 1);
    c->mat = arena_alloc(tmp, (size_t)n + 1);
    c->forced = arena_alloc(tmp, (size_t)n + 1);
    c->isout = arena_alloc(tmp, (size_t)n + 1);
    c->owner = arena_alloc(tmp, sizeof(int) * (size_t)(n + 1));
    c->pin = arena_alloc(tmp, sizeof(int) * (size_t)(n + 1));
    c->users = arena_alloc(tmp, sizeof(IVec) * (size_t)(n + 1));
    c->stamp = arena_alloc(tmp, sizeof(int) * (size_t)(n + 1));
    c->work = arena_alloc(tmp, sizeof(int) * (size_t)(n + 1));
    c->buf_of = arena_alloc(tmp, sizeof(int) * (size_t)(n + 1));
    for (int f = 0; f < n; f++) {
        c->owner[f] = c->buf_of[f] = c->pin[f] = -1;
        c->cat[f] = (unsigned char)fz_cat(fz_n(c, f)->op);
        if (fz_n(c, f)->op == F_GEMM_BGRAD) c->pin[f] = fz_n(c, f)->in[0]; /* computed by its GEMM's launch */
        if (fz_n(c, f)->op == F_LORA) c->pin[fz_n(c, f)->in[0]] = f;       /* the down product: computed by the up's kernel */
    }
    for (int i = 0; i < fg->noutputs; i++) {
        int f = fg->g2f[fg->outputs[i]];
        if (f < 0) INTERNAL("fuse: output %%%d was not lowered", fg->outputs[i]);
        c->isout[f] = 1;
        c->live[f] = 1;
    }
    for (int f = n - 1; f >= 0; f--)
        if (c->live[f])
            for (int i = 0; i < fz_n(c, f)->nin; i++) c->live[fz_n(c, f)->in[i]] = 1;
    for (int f = 0; f < n; f++)
        if (c->live[f])
            for (int i = 0; i < fz_n(c, f)->nin; i++) fuse_ivec_push(tmp, &c->users[fz_n(c, f)->in[i]], f);
    /* the classifier kernel computes its statistics itself (and stores them for the loss's mean):
     * one read of the logits for both, when one classifier kernel reads them */
    for (int f = 0; f < n; f++) {
        const FNode *x = fz_n(c, f);
        if (!c->live[f] || x->op != F_CE_GRAD) continue;
        int grads = 0;
        for (int j = 0; j < c->users[x->in[0]].n; j++) grads += fz_n(c, c->users[x->in[0]].v[j])->op == F_CE_GRAD;
        if (grads == 1) c->pin[x->in[0]] = f;
    }
}

/* fuse_internal.h */
int fuse_partition(FuseCtx *c, int **order) {
    fz_setup(c);
    fz_partition(c);
    *order = arena_alloc(c->tmp, sizeof(int) * (size_t)(c->nk + 1));
    int nl = fz_schedule(c, *order);
    return fz_horizontal(c, *order, nl);
}
