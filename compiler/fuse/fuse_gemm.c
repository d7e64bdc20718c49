/* fuse_gemm.c - the lowering's GEMMs (fuse_lower.c calls it): a matmul resolved into one GEMM (an
 * operand that is a transpose of the last two axes becomes the GEMM's trans flag, applied
 * repeatedly: transpose of a transpose is none; reshapes are views of the same buffer; a batch of
 * a rank-3 activation times an unbatched weight becomes one GEMM with M = batch * rows), and the
 * epilogues fused into a GEMM: the bias (`x @ w + b`), the add of a product onto another GEMM's
 * result (LoRA's up product onto its base), LoRA's down and up products as one launch, and the
 * bias gradient (a batched A^T B whose only use is a sum over the batch - autodiff's weight
 * gradient, matmul then sum_to - becomes one GEMM with K = batch * rows, its column sums the
 * bias's gradient).
 *
 * Pipeline position: inside fuse_lower (graph -> autodiff -> fuse: [fuse_lower] -> partition ...);
 * fuse_lower.h is what the two files share. */
#include "fuse_lower.h"

#include <string.h>

/* ---- GEMMs
 * ----------------------------------------------------------------------------------------- */

typedef struct FLOperand {
    int node; /* after peeling transposes: the stored layout */
    int buf;  /* the node whose buffer holds it (reshapes peeled) */
    int trans;
    int64_t rows, cols, batch;
} FLOperand;

static void fl_operand(FL *L, int f, int left, FLOperand *o) {
    o->trans = 0;
    for (;;) {
        const FNode *n = fl_n(L, f);
        if (n->op == F_PERMUTE && n->rank >= 2 && n->ia[0] == n->rank - 2 && n->ia[1] == n->rank - 1) {
            o->trans ^= 1;
            f = n->in[0];
            continue;
        }
        break;
    }
    const FNode *n = fl_n(L, f);
    o->node = f;
    if (n->rank >= 2) {
        o->rows = n->shape[n->rank - 2];
        o->cols = n->shape[n->rank - 1];
    } else { /* a vector: a row on the left, a column on the right */
        o->rows = left ? 1 : n->shape[0];
        o->cols = left ? n->shape[0] : 1;
        o->trans = 0;
    }
    o->batch = fuse_numel(n) / (o->rows * o->cols);
    int b = f;
    while (fl_n(L, b)->op == F_RESHAPE) b = fl_n(L, b)->in[0];
    o->buf = b;
}

/* An operand whose batch dims broadcast partially (neither one matrix nor one per batch index)
 * is expanded to the output's batch dims: a copy the partition materialises. */
static void fl_operand_expand(FL *L, FLOperand *o, int nbatch, const int64_t *bshape) {
    const FNode *n = fl_n(L, o->node);
    int64_t shape[GRAPH_MAX_RANK] = {0};
    for (int i = 0; i < nbatch; i++) shape[i] = bshape[i];
    shape[nbatch] = n->shape[n->rank - 2];
    shape[nbatch + 1] = n->shape[n->rank - 1];
    o->node = o->buf = fl_expand(L, o->node, nbatch + 2, shape);
    o->batch = 1;
    for (int i = 0; i < nbatch; i++) o->batch *= bshape[i];
}

int fl_matmul(FL *L, const GNode *gn, int x, int y) {
    const Graph *g = L->g;
    FLOperand A, B;
    fl_operand(L, x, 1, &A);
    fl_operand(L, y, 0, &B);
    int64_t M = A.trans ? A.cols : A.rows, K = A.trans ? A.rows : A.cols;
    int64_t N = B.trans ? B.rows : B.cols;
    int64_t out = graph_numel(gn), obatch = out / (M * N);
    int nbatch = gn->rank - (fl_n(L, A.node)->rank >= 2) - (fl_n(L, B.node)->rank >= 2);
    if (nbatch < 0 || obatch * M * N != out) INTERNAL("fuse: matmul %%%d: output shape", gn->id);
    if (A.batch != 1 && A.batch != obatch) fl_operand_expand(L, &A, nbatch, gn->shape);
    if (B.batch != 1 && B.batch != obatch) fl_operand_expand(L, &B, nbatch, gn->shape);
    FuseGemm m = {.a = -1,
                  .b = -1,
                  .c = -1,
                  .epilogue = FE_NONE,
                  .bias = -1,
                  .trans_a = A.trans,
                  .trans_b = B.trans,
                  .m = M,
                  .n = N,
                  .k = K,
                  .batch = obatch,
                  .lda = A.cols,
                  .ldb = B.cols,
                  .ldc = N,
                  .alpha = 1.0,
                  .beta = 0.0,
                  .dt = gn->dt};
    m.stride_a = A.batch > 1 ? A.rows * A.cols : 0;
    m.stride_b = B.batch > 1 ? B.rows * B.cols : 0;
    m.stride_c = obatch > 1 ? M * N : 0;
    int rank = gn->rank;
    const int64_t *shape = gn->shape;
    if (obatch > 1 && m.stride_b == 0 && !m.trans_a && m.stride_a) {
        /* activations [batch, rows, k] @ weight [k, n]: one GEMM over batch * rows */
        m.m *= obatch;
        m.batch = 1;
        m.stride_a = m.stride_c = 0;
    } else if (obatch > 1 && m.trans_a && !m.trans_b && m.stride_a && m.stride_b && L->guses[gn->id] == 1 &&
               L->guser[gn->id] >= 0 && L->glive[gn->id] != 2) {
        /* sum over the batch of A_t^T B_t (a weight gradient): one GEMM with K = batch * k */
        const GNode *u = graph_node(g, L->guser[gn->id]);
        int ok = u->op == G_SUM_TO && u->rank >= 2 && u->shape[u->rank - 2] == M && u->shape[u->rank - 1] == N;
        for (int i = 0; ok && i < u->rank - 2; i++) ok = u->shape[i] == 1;
        if (ok) {
            m.k *= obatch;
            m.batch = 1;
            m.stride_a = m.stride_b = m.stride_c = 0;
            rank = u->rank;
            shape = u->shape;
        }
    }
    FNode p = fl_proto(F_GEMM, gn->dt, rank, shape);
    p.nin = 2;
    p.in[0] = A.buf;
    p.in[1] = B.buf;
    p.gemm = m;
    return fl_add(L, &p);
}

/* `x @ w + b`, b a vector along the last axis (a linear layer's bias): one GEMM that adds b as it
 * stores the product (FE_BIAS, the library's epilogue), when the product is a plain one (one
 * matrix, beta 0, k > 0) of the add's shape and type that nothing but the add reads. The matmul
 * is then absorbed like a weight gradient's into its sum_to. Returns the GEMM node, or -1 when
 * the add stays an add. */
int fl_gemm_bias(FL *L, const GNode *n) {
    for (int side = 0; side < 2; side++) {
        int mm = n->in[side], f = L->fg->g2f[mm];
        if (f < 0 || graph_node(L->g, mm)->op != G_MATMUL || L->guses[mm] != 1 || L->glive[mm] == 2) continue;
        const FNode *G = fl_n(L, f);
        const FuseGemm *m = &G->gemm;
        if (G->op != F_GEMM || G->nin != 2 || m->batch != 1 || m->beta != 0 || m->k == 0 || G->dt != n->dt ||
            !fl_same_shape(G, n->rank, n->shape))
            continue;
        int b = L->fg->g2f[n->in[1 - side]];
        while (fl_n(L, b)->op == F_RESHAPE) b = fl_n(L, b)->in[0];
        const FNode *B = fl_n(L, b);
        if (B->dt != n->dt || B->rank < 1 || fuse_numel(B) != m->n || B->shape[B->rank - 1] != m->n) continue;
        FNode p = *G;
        p.nin = 3;
        p.in[2] = b;
        p.gemm.epilogue = FE_BIAS;
        int r = fl_add(L, &p);
        L->fg->g2f[mm] = -1;
        L->fg->absorbed[mm] = r;
        return r;
    }
    return -1;
}

/* A graph node read by its user alone and not an output: a value a fusion may fold away. */
static int fl_private(const FL *L, int id) { return L->guses[id] == 1 && L->glive[id] != 2; }

/* Down product d and up product u (d's result u's A operand) of LoRA's shape: both weights parameters
 * (B operands that are leaves), a bottleneck of at most FUSE_LORA_MAX_RANK columns narrower than
 * both the down product's input and the up product's output (rank < din, rank < dout), so that
 * only an adapter's pair of products - forward (x @ A^T, then @ B^T) or the input gradient's
 * ((scaling dy) @ B, then @ A) - and not an ordinary chain of layers is taken for one. */
static int fl_lora_pair(const FusedGraph *fg, const FNode *d, const FNode *u) {
    int64_t r = d->gemm.n;
    return fg->node[d->in[1]]->op == F_LEAF && fg->node[u->in[1]]->op == F_LEAF && r >= 1 && r <= FUSE_LORA_MAX_RANK &&
           r < d->gemm.k && r < u->gemm.n && u->gemm.k == r;
}

/* The backward's counterpart of LoRA's scaled up product: graph node d a matmul (through reshapes)
 * whose A operand is the result of a plain f32 GEMM of at most FUSE_LORA_MAX_RANK columns - the
 * input gradient's LoRA part dS @ A, dS = (scaling dy) @ B of rank columns - which fl_gemm_add then
 * adds to the base layer's input gradient dy @ W by the add epilogue (alpha 1), and fl_lora_chain
 * makes one launch of with dS's product. Only with the LoRA fusion on: --no-lora-fusion keeps the
 * schedules as they were. */
static int fl_lora_delta(const FL *L, int d) {
    if (!fuse_lora_chain) return 0;
    const GNode *dn = graph_node(L->g, d);
    while (dn->op == G_RESHAPE) dn = graph_node(L->g, dn->in[0]);
    int f = dn->op == G_MATMUL ? L->fg->g2f[dn->id] : -1;
    if (f < 0) return 0;
    const FNode *G = fl_n(L, f);
    if (G->op != F_GEMM || G->nin != 2 || G->gemm.trans_a) return 0;
    const FNode *s = fl_n(L, G->in[0]);
    return s->op == F_GEMM && s->nin == 2 && s->gemm.epilogue == FE_NONE && s->dt == DT_F32 && fl_lora_pair(L->fg, s, G);
}

/* LoRA's `base(x) + lora_B(lora_A(x)) * scaling` (nn.LoRALinear, MultiLoRALinear): the up
 * product, scaled, added to the base product - one GEMM that starts C as the base's product and
 * adds alpha = scaling times its own (FE_ADD, beta 1 in the library's call; LoRAFusion's fusion
 * of the adapter's output into the base's), so the [rows, dout] delta is never stored and read
 * back. The add's one side is a plain f32 product multiplied by a scalar constant (through
 * reshapes; each read by the next alone), with a contiguous C of the add's size; the other side
 * is a GEMM's result too (the base layer's) that only the add reads - so a residual stream, which
 * others read, never takes this path. The same fusion would apply to any sum of two such GEMM
 * results (the input gradient of two branches: llama's q/k/v and SwiGLU's gate/up in the
 * backward), but the multiply keeps it to LoRA: those schedules, and their cuBLASLt calls, stay as
 * they were (no GPU could check a change to them). The one side taken without the multiply is
 * LoRA's input gradient dS @ A (fl_lora_delta: its A operand a rank-wide down product of LoRA's
 * shape, alpha 1), which fl_lora_chain then fuses with dS's product. Returns the GEMM node, or -1
 * when the add stays an add. */
int fl_gemm_add(FL *L, const GNode *n) {
    const Graph *g = L->g;
    if (n->dt != DT_F32) return -1;
    for (int side = 0; side < 2; side++) {
        int d = n->in[side], base = n->in[1 - side];
        double alpha = 1.0;
        int chain[GRAPH_MAX_RANK + 8], nchain = 0;
        if (!fl_private(L, d)) continue;
        const GNode *dn = graph_node(g, d);
        if (dn->op != G_MUL && !fl_lora_delta(L, d)) continue; /* the scaling marks LoRA's up product (see above) */
        if (dn->op == G_MUL) {
            int c = -1;
            for (int i = 0; i < 2 && c < 0; i++) {
                const GNode *k = graph_node(g, dn->in[i]);
                if (k->op == G_CONST && k->rank == 0) {
                    c = i;
                    alpha = k->fattr[0];
                }
            }
            if (c < 0) continue;
            chain[nchain++] = d;
            d = dn->in[1 - c];
            if (!fl_private(L, d)) continue;
            dn = graph_node(g, d);
        }
        while (dn->op == G_RESHAPE && nchain < (int)(sizeof chain / sizeof *chain) && fl_private(L, dn->in[0])) {
            chain[nchain++] = d;
            d = dn->in[0];
            dn = graph_node(g, d);
        }
        int f = L->fg->g2f[d];
        if (dn->op != G_MATMUL || f < 0 || !fl_private(L, d)) continue;
        const FNode *G = fl_n(L, f);
        const FuseGemm *m = &G->gemm;
        if (G->op != F_GEMM || G->nin != 2 || m->epilogue != FE_NONE || m->beta != 0 || m->alpha != 1.0 || m->k == 0 ||
            G->dt != DT_F32 || m->ldc != m->n || (m->batch > 1 && m->stride_c != m->m * m->n) || fuse_numel(G) != graph_numel(n))
            continue;
        /* the base: a GEMM's result (through reshapes) that nothing but the add reads */
        int b = L->fg->g2f[base];
        if (b < 0 || !fl_private(L, base) || graph_node(g, base)->dt != DT_F32) continue;
        while (fl_n(L, b)->op == F_RESHAPE) b = fl_n(L, b)->in[0];
        if (fl_n(L, b)->op != F_GEMM || fuse_numel(fl_n(L, b)) != graph_numel(n)) continue;
        FNode p = *G;
        p.rank = n->rank;
        memcpy(p.shape, n->shape, sizeof(int64_t) * (size_t)n->rank);
        p.nin = 3;
        p.in[2] = b;
        p.gemm.epilogue = FE_ADD;
        p.gemm.alpha = alpha;
        int r = fl_add(L, &p);
        L->fg->g2f[d] = -1;
        L->fg->absorbed[d] = r;
        for (int i = 0; i < nchain; i++) {
            L->fg->g2f[chain[i]] = -1;
            L->fg->absorbed[chain[i]] = r;
        }
        return r;
    }
    return -1;
}

/* Whether node f depends on node t (reads it, directly or through others): a search over f's inputs
 * that stops below t (ids are topological); seen[] marks with stamp, stack holds fg->n ids. */
static int fl_depends(const FusedGraph *fg, int f, int t, int *seen, int *stack, int stamp) {
    int sp = 0;
    stack[sp++] = f;
    while (sp) {
        int x = stack[--sp];
        if (x == t) return 1;
        if (x < t || seen[x] == stamp) continue;
        seen[x] = stamp;
        for (int i = 0; i < fg->node[x]->nin; i++)
            if (seen[fg->node[x]->in[i]] != stamp) stack[sp++] = fg->node[x]->in[i];
    }
    return 0;
}

/* LoRA's down and up products in one launch (LoRAFusion's FusedLoRA): an up product folded into
 * its base's (FE_ADD, fl_gemm_add) whose A operand is the down product S = x @ op(A) - a plain f32
 * GEMM of small width (the rank, at most FUSE_LORA_MAX_RANK), contiguous rows, the same rows and
 * batch as the up product, read as they are - becomes F_LORA (the up product's node) and S becomes
 * F_LORA_S (the down product's). Their kernel computes each row's S in registers and then C = D +
 * alpha S @ op(B) from them, storing S only when another launch reads it (the backward: lora_B's
 * gradient dy^T S), so the [rows, rank] result is not read back by a second launch. The nodes keep
 * their ids (their users are unchanged); the hash table still names them by their GEMM keys, which
 * no later node looks up (this runs after the lowering). */
void fl_lora_chain(FL *L) {
    FusedGraph *fg = L->fg;
    if (!fuse_lora_chain) return;
    int *seen = arena_alloc(fg->ar, sizeof(int) * (size_t)(fg->n + 1)), stamp = 0;
    int *stack = arena_alloc(fg->ar, sizeof(int) * (size_t)(FUSE_MAX_IN * fg->n + 1));
    for (int f = 0; f < fg->n; f++) {
        FNode *u = fg->node[f];
        const FuseGemm *um = &u->gemm;
        if (u->op != F_GEMM || u->nin != 3 || um->epilogue != FE_ADD || u->dt != DT_F32 || um->trans_a) continue;
        FNode *d = fg->node[u->in[0]];
        const FuseGemm *dm = &d->gemm;
        if (d->op != F_GEMM || d->nin != 2 || dm->epilogue != FE_NONE || dm->alpha != 1.0 || dm->beta != 0 || d->dt != DT_F32 ||
            dm->trans_a || dm->k < 1 || dm->n < 1 || dm->n > FUSE_LORA_MAX_RANK || dm->ldc != dm->n || dm->m != um->m ||
            dm->batch != um->batch || um->k != dm->n || um->lda != dm->n || um->beta != 0)
            continue;
        if (dm->batch > 1 && (dm->stride_c != dm->m * dm->n || um->stride_a != dm->stride_c)) continue;
        if (!fl_lora_pair(fg, d, u) || fl_depends(fg, u->in[2], d->id, seen, stack, ++stamp)) continue; /* D computed before S */
        int ups = 0; /* S feeds one up product (each F_LORA_S is pinned to one kernel) */
        for (int v = 0; v < fg->n; v++)
            if (fg->node[v]->op == F_GEMM && fg->node[v]->nin == 3 && fg->node[v]->gemm.epilogue == FE_ADD &&
                fg->node[v]->in[0] == d->id)
                ups++;
        if (ups != 1) continue;
        d->op = F_LORA_S;
        u->op = F_LORA;
    }
}

/* A bias gradient, graph node sum_to `id` of dy [..., n] down to n values, when a GEMM reads the
 * same dy as its B operand (not transposed, one matrix, k = the rows of dy: the weight gradient
 * x^T dy of the same linear layer): that GEMM sums B's columns as well (FE_BGRAD_B), so dy is
 * read once for both. The sum_to becomes an F_GEMM_BGRAD node of that GEMM's; the reduction it
 * replaces is left to nobody. */
void fl_gemm_bgrad(FL *L, int id) {
    FusedGraph *fg = L->fg;
    const GNode *s = graph_node(L->g, id);
    int f = fg->g2f[id];
    if (f < 0) return;
    const FNode *r = fl_n(L, f);
    if (r->op == F_RESHAPE) r = fl_n(L, r->in[0]);
    if (r->op != F_REDUCE || r->kop != K_ADD) return;
    const FNode *y = fl_n(L, r->in[0]);
    if (y->rank < 2) return;
    int64_t n = y->shape[y->rank - 1];
    uint32_t rows = fl_all_axes(y->rank) & ~(1u << (y->rank - 1));
    for (int a = 0; a < y->rank - 1; a++)
        if (y->shape[a] == 1) rows &= ~(1u << a); /* fl_reduce leaves size-1 axes out of the mask */
    if ((uint32_t)r->ia[0] != rows || graph_numel(s) != n || s->dt != y->dt) return;
    int b = r->in[0];
    while (fl_n(L, b)->op == F_RESHAPE) b = fl_n(L, b)->in[0];
    for (int gm = 0; gm < fg->n; gm++) {
        const FNode *G = fl_n(L, gm);
        const FuseGemm *m = &G->gemm;
        if (G->op != F_GEMM || G->nin != 2 || G->in[1] != b || m->trans_b || m->batch != 1 || m->n != n || m->ldb != n ||
            m->k * n != fuse_numel(y) || G->dt != y->dt)
            continue;
        for (int v = 0; v < fg->n; v++) /* one bias gradient a GEMM */
            if (fl_n(L, v)->op == F_GEMM_BGRAD && fl_n(L, v)->in[0] == gm) return;
        FNode p = fl_proto(F_GEMM_BGRAD, s->dt, s->rank, s->shape);
        p.nin = 1;
        p.in[0] = gm;
        L->gid = id;
        fg->g2f[id] = fl_add(L, &p);
        return;
    }
}
