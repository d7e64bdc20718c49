/* fuse.c - fusion's result: the launches of the partition (fuse_partition.c) with their buffers
 * and lives and their kernels (fuse_codegen.c), checked and printed as `mbtc --emit=kernels`.
 *
 * Pipeline position: graph -> autodiff -> [fuse: fuse_lower.c -> fuse_partition.c ->
 * this file, fuse_codegen.c] -> kernel IR (kir.h) -> back ends (cpu, cuda). The memory planner
 * takes the buffers' (bytes, first launch, last launch). The rules of the partition are in
 * fuse_partition.c's first comment and docs/architecture.md. */
#include "fuse_internal.h"
#include "diag.h"

#include <inttypes.h>
#include <string.h>

static const FNode *fz_n(const FuseCtx *c, int f) { return c->fg->node[f]; }

/* ---- outputs ------------------------------------------------------------------------------------------ */

int fuse_default_outputs(const Graph *g, int **outputs, Arena *ar) {
    int n = 0;
    const GraphUpdate *u = g->update;
    int *o = arena_alloc(ar, sizeof(int) * (size_t)(g->n + g->nparams + g->nstats + (u ? u->nstate : 0) + 3));
    if (u) { /* the new parameters and optimizer state (a result equal to its input needs nothing) */
        if (u->p_out != u->p_in) o[n++] = u->p_out;
        if (u->cast_out >= 0) o[n++] = u->cast_out; /* the parameter casts' region (plan.h, PH_PCAST) */
        for (int i = 0; i < u->nstate; i++)
            if (u->state_out[i] != u->state_in[i]) o[n++] = u->state_out[i];
    } else if (g->loss >= 0 || g->grads) {
        if (g->loss >= 0) o[n++] = g->loss;
        for (int i = 0; g->grads && i < g->nparams; i++) /* a frozen parameter's zero gradient: nothing to add */
            if (!(graph_node(g, g->params[i])->iattr[1] & GP_FROZEN)) o[n++] = g->grads[i];
        for (int k = 0; k < g->nstats; k++) o[n++] = g->stat_expr[k]; /* forward_stats reads them (plan.h) */
    } else {
        unsigned char *used = arena_alloc(ar, (size_t)g->n + 1);
        for (int id = 0; id < g->n; id++)
            for (int i = 0; i < g->node[id]->nin; i++) used[g->node[id]->in[i]] = 1;
        for (int id = 0; id < g->n; id++)
            if (!used[id]) o[n++] = id;
    }
    *outputs = o;
    return n;
}

/* ---- names ------------------------------------------------------------------------------------------- */

/* How much an op says about a kernel, for its name: dedicated and composite ops first. */
static int fz_name_rank(GOp op) {
    if (op >= G_SOFTMAX || op == G_GATHER)
        return op == G_MATMUL || op == G_RESHAPE || op == G_TRANSPOSE || op == G_SLICE || op == G_CONCAT || op == G_BROADCAST ? 1
                                                                                                                              : 3;
    if (op >= G_SUM && op <= G_SUM_TO) return 2;
    return op == G_CONST ? 0 : 1;
}

/* "k3_add_layernorm": the kernel's index and its two most telling ops (in graph order). */
static const char *fz_kernel_name(FuseCtx *c, int kid, int index) {
    const FKern *K = &c->k[kid];
    int best = 0;
    for (int i = 0; i < K->members.n; i++) /* made for dq's graph node, but not dq: named apart in profiles */
        if (fz_n(c, K->members.v[i])->op == F_ATTN_STATS) return arena_printf(c->ar, "k%d_attention_stats", index);
    for (int i = 0; i < K->members.n; i++) /* two matmuls, a multiply and an add: LoRA's, named so in profiles */
        if (fz_n(c, K->members.v[i])->op == F_LORA) return arena_printf(c->ar, "k%d_lora", index);
    for (int i = 0; i < K->members.n; i++) {
        int gid = fz_n(c, K->members.v[i])->gid;
        if (gid >= 0 && gid < c->g->n && fz_name_rank(graph_node(c->g, gid)->op) > best)
            best = fz_name_rank(graph_node(c->g, gid)->op);
    }
    char buf[96];
    int len = snprintf(buf, sizeof buf, "k%d", index), parts = 0;
    for (int rank = best; rank >= 0 && parts < 2; rank--) {
        for (int i = 0; i < K->members.n && parts < 2; i++) {
            int gid = fz_n(c, K->members.v[i])->gid;
            if (gid < 0 || gid >= c->g->n || fz_name_rank(graph_node(c->g, gid)->op) != rank) continue;
            const char *op = graph_op_name(graph_node(c->g, gid)->op);
            char pat[48];
            snprintf(pat, sizeof pat, "_%s", op);
            size_t pl = strlen(pat);
            int dup = 0;
            for (const char *p = strstr(buf, pat); p && !dup; p = strstr(p + 1, pat)) dup = p[pl] == 0 || p[pl] == '_';
            if (dup || len + (int)pl >= (int)sizeof buf) continue;
            len += snprintf(buf + len, sizeof buf - (size_t)len, "%s", pat);
            parts++;
        }
    }
    return arena_strndup(c->ar, buf, strlen(buf));
}

/* ---- the result ----------------------------------------------------------------------------------------- */

static int fz_add_buffer(FuseResult *r, Arena *ar, int *cap, int node, const char *what, DType dt, int rank, const int64_t *shape,
                         FuseBufKind kind) {
    if (r->nbuffers == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        FuseBuffer *nb = arena_alloc(ar, sizeof(FuseBuffer) * (size_t)nc);
        if (r->nbuffers) memcpy(nb, r->buffers, sizeof(FuseBuffer) * (size_t)r->nbuffers);
        r->buffers = nb;
        *cap = nc;
    }
    FuseBuffer *b = &r->buffers[r->nbuffers];
    memset(b, 0, sizeof *b);
    b->node = node;
    b->what = what;
    b->dt = dt;
    b->rank = rank;
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        b->shape[i] = shape[i];
        numel *= shape[i];
    }
    b->bytes = numel * dtype_size(dt);
    b->kind = kind;
    b->first = b->last = b->over = -1;
    return r->nbuffers++;
}

static void fz_touch(FuseResult *r, int buf, int launch) {
    FuseBuffer *b = &r->buffers[buf];
    if (b->first < 0 || launch < b->first) b->first = launch;
    if (launch > b->last) b->last = launch;
}

/* The node whose buffer the classifier kernel f (F_CE_GRAD, a member of launch li's kernel) may write
 * its gradient over: its logits (read through a slice from column 0 and casts, computed in the
 * kernel), when they are a temporary of the gradient's type and shape, the kernel computes nothing
 * but the gradient and its statistics, and no later launch reads them - the classifier kernel is
 * their last reader, and it reads each row before writing it. Else -1 (the gradient gets a buffer
 * of its own: a program that reads the logits after the loss, or asks for them). */
static int fz_ce_inplace(const FuseCtx *c, const int *order, int nl, int li, int f) {
    const FNode *n = fz_n(c, f);
    const FKern *K = &c->k[order[li]];
    if (n->op != F_CE_GRAD || c->isout[f] || K->members.n != 2) return -1;
    int b = n->in[1];
    while (!c->mat[b] && fz_n(c, b)->op != F_LEAF) {
        const FNode *x = fz_n(c, b);
        if (x->op == F_SLICE && x->ia[0] == x->rank - 1 && x->ia[1] == 0) b = x->in[0];
        else if (x->op == F_MAP && x->kop == K_CAST && dtype_is_float(x->dt) && dtype_is_float(fz_n(c, x->in[0])->dt))
            b = x->in[0];
        else return -1;
    }
    const FNode *x = fz_n(c, b);
    if (x->op == F_LEAF || c->isout[b] || c->buf_of[b] < 0 || x->dt != n->dt || x->rank != n->rank) return -1;
    for (int k = 0; k < c->g->nstats; k++) /* global_mean's statistics are read from their buffers */
        if (c->fg->g2f[c->g->stat_expr[k]] == b) return -1;
    for (int d = 0; d < n->rank; d++)
        if (x->shape[d] != n->shape[d]) return -1;
    for (int lj = li + 1; lj < nl; lj++)
        if (fuse_ivec_has(&c->k[order[lj]].reads, b)) return -1;
    return b;
}

/* The buffers: every leaf of the graph, then what each launch stores, in launch order. */
static void fz_buffers(FuseCtx *c, FuseResult *r, const int *order, int nl) {
    const Graph *g = c->g;
    Arena *ar = c->ar;
    int n = c->n;
    int cap = 0;
    r->node_buffer = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) r->node_buffer[id] = -1;
    int *leaf_buf = arena_alloc(c->tmp, sizeof(int) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        const GNode *gn = g->node[id];
        leaf_buf[id] = -1;
        if (gn->op != G_PARAM && gn->op != G_INPUT) continue;
        const char *what = arena_printf(ar, "%s %s", gn->op == G_PARAM ? "param" : "input", gn->name ? gn->name : "?");
        leaf_buf[id] = fz_add_buffer(r, ar, &cap, id, what, gn->dt, gn->rank, gn->shape, gn->op == G_PARAM ? FB_PARAM : FB_INPUT);
        r->node_buffer[id] = leaf_buf[id];
    }
    for (int f = 0; f < n; f++)
        if (fz_n(c, f)->op == F_LEAF) c->buf_of[f] = leaf_buf[fz_n(c, f)->ia[0]];
    int *first_gid = arena_alloc(c->tmp, sizeof(int) * (size_t)(n + 1)); /* a graph node each fused node holds */
    for (int f = 0; f < n; f++) first_gid[f] = -1;
    for (int i = 0; i < c->fg->noutputs; i++)
        if (first_gid[c->fg->g2f[c->fg->outputs[i]]] < 0) first_gid[c->fg->g2f[c->fg->outputs[i]]] = c->fg->outputs[i];
    for (int id = 0; id < g->n; id++) {
        int f = c->fg->g2f[id];
        if (f >= 0 && first_gid[f] < 0) first_gid[f] = id;
    }
    for (int li = 0; li < nl; li++) {
        const FKern *K = &c->k[order[li]];
        for (int i = 0; i < K->members.n; i++) {
            int f = K->members.v[i];
            if (!c->mat[f]) continue;
            const FNode *x = fz_n(c, f);
            int over = fz_ce_inplace(c, order, nl, li, f);
            if (over >= 0) { /* the classifier's gradient over its logits: no buffer of its own */
                c->buf_of[f] = c->buf_of[over];
                r->buffers[c->buf_of[f]].over = li;
                continue;
            }
            int gid = first_gid[f];
            const char *what = gid >= 0 ? arena_printf(ar, "%%%d %s", gid, graph_op_name(graph_node(g, gid)->op))
                                        : arena_printf(ar, "%s of %%%d", fuse_fop_name(x->op), x->gid);
            c->buf_of[f] = fz_add_buffer(r, ar, &cap, gid, what, x->dt, x->rank, x->shape, c->isout[f] ? FB_OUTPUT : FB_TEMP);
        }
    }
    c->buf_node = arena_alloc(c->tmp, sizeof(int) * (size_t)(r->nbuffers + 1));
    for (int i = 0; i < r->nbuffers; i++) c->buf_node[i] = r->buffers[i].node;
    for (int id = 0; id < g->n; id++) {
        int f = c->fg->g2f[id];
        if (f >= 0 && c->buf_of[f] >= 0) r->node_buffer[id] = c->buf_of[f];
    }
}

/* Launch li, a GEMM: its operands' buffers, its bias gradient as the epilogue (F_GEMM_BGRAD). */
static void fz_gemm_launch(FuseCtx *c, FuseResult *r, int kid, int li) {
    const FKern *K = &c->k[kid];
    FuseLaunch *L = &r->launches[li];
    const FNode *x = fz_n(c, K->members.v[0]);
    L->kind = FL_GEMM;
    L->gemm = x->gemm;
    L->gemm.a = c->buf_of[x->in[0]];
    L->gemm.b = c->buf_of[x->in[1]];
    L->gemm.c = c->buf_of[x->id];
    L->gemm.bias = x->nin > 2 ? c->buf_of[x->in[2]] : -1;
    if (K->members.n > 1) { /* its bias gradient (F_GEMM_BGRAD) */
        const FNode *v = fz_n(c, K->members.v[1]);
        if (K->members.n > 2 || v->op != F_GEMM_BGRAD || v->in[0] != x->id)
            INTERNAL("fuse: a GEMM launch computes %d nodes", K->members.n);
        L->gemm.epilogue = FE_BGRAD_B;
        L->gemm.bias = c->buf_of[v->id];
    }
    if (L->gemm.a < 0 || L->gemm.b < 0 || L->gemm.c < 0 || (L->gemm.epilogue != FE_NONE && L->gemm.bias < 0))
        INTERNAL("fuse: a GEMM operand without a buffer");
    fz_touch(r, L->gemm.a, li);
    fz_touch(r, L->gemm.b, li);
    fz_touch(r, L->gemm.c, li);
    if (L->gemm.bias >= 0) fz_touch(r, L->gemm.bias, li);
    L->nnodes = fuse_kernel_nodes(c, kid, &L->nodes, c->ar);
    r->ngemms++;
}

/* The launches in order, each kernel generated, and every buffer's life. */
static void fz_launches(FuseCtx *c, FuseResult *r, const int *order, int nl) {
    c->final = 1;
    r->nlaunches = nl;
    r->launches = arena_alloc(c->ar, sizeof(FuseLaunch) * (size_t)(nl + 1));
    r->kernels = arena_alloc(c->ar, sizeof(Kernel *) * (size_t)(nl + 1));
    for (int li = 0; li < nl; li++) {
        int kid = order[li];
        FuseLaunch *L = &r->launches[li];
        if (c->k[kid].kind == FK_GEMM) {
            fz_gemm_launch(c, r, kid, li);
            continue;
        }
        Kernel *k = fuse_gen_kernel(c, kid, c->ar, NULL);
        k->name = fz_kernel_name(c, kid, r->nkernels);
        k->nnodes = fuse_kernel_nodes(c, kid, &k->nodes, c->ar);
        for (int i = 0; i < k->nbufs; i++) fz_touch(r, k->bufs[i].buffer, li);
        L->kind = FL_KERNEL;
        L->kernel = r->nkernels;
        L->nnodes = k->nnodes;
        L->nodes = k->nodes;
        r->kernels[r->nkernels++] = k;
    }
    for (int i = 0; i < r->nbuffers; i++)
        if (r->buffers[i].kind == FB_OUTPUT && nl > 0) fz_touch(r, i, nl - 1);
}

/* ---- the update in place --------------------------------------------------------------------- */

/* Why the update's result ob (of node out_node) cannot be written over its input ib by the launch
 * that writes it, or NULL: ob is computed, and ib is no other result (which the plan copies from it
 * after the launches); that launch (*launch) is a generated elementwise kernel, the only writer of
 * ob, and the last launch that reads ib; it binds each to one parameter (*pin, *pout); its body
 * has no loops or branches, reads ib and reads or writes ob at the work item's own element only
 * (offset gid), and reads ib only before it first writes ob. Then every work item reads its element of the old value
 * before it writes the new one, and no work item reads another's: the result may take the input's
 * place. */
static const char *fz_in_place_refusal(const FuseResult *r, int ib, int ob, int out_node, int *launch, int *pin, int *pout) {
    const FuseBuffer *in = &r->buffers[ib], *out = &r->buffers[ob];
    if (out->kind == FB_PARAM || out->kind == FB_INPUT) return "it is another input's value";
    for (int i = 0; i < r->noutputs; i++) /* (state b = a: b's new value is a's old one, copied after the launches) */
        if (r->outputs[i] != out_node && r->node_buffer[r->outputs[i]] == ib) return "its old value is another result";
    if (in->dt != out->dt || in->bytes != out->bytes) return "its type differs from its input's";
    int li = out->first;
    if (li < 0 || r->launches[li].kind != FL_KERNEL) return "no generated kernel writes it";
    if (in->last > li) return "a later launch reads the old value";
    for (int lj = li + 1; lj < r->nlaunches; lj++) {
        const FuseLaunch *L = &r->launches[lj];
        if (L->kind == FL_GEMM) {
            if (L->gemm.c == ob || L->gemm.bias == ob) return "another launch writes it";
            continue;
        }
        const Kernel *k = r->kernels[L->kernel];
        for (int q = 0; q < k->nbufs; q++)
            if (k->bufs[q].buffer == ob && k->bufs[q].written) return "another launch writes it";
    }
    const Kernel *k = r->kernels[r->launches[li].kernel];
    if (k->kind != KK_ELEMENTWISE || k->attn || k->scatter || k->ce || k->lora || k->kv) return "its kernel is not elementwise";
    int qi = -1, qo = -1;
    for (int q = 0; q < k->nbufs; q++) {
        if (k->bufs[q].buffer == ib) {
            if (qi >= 0 || k->bufs[q].written) return "its kernel binds the input twice or writes it";
            qi = q;
        }
        if (k->bufs[q].buffer == ob) {
            if (qo >= 0) return "its kernel binds it twice";
            qo = q;
        }
    }
    if (qi < 0 || qo < 0 || !k->bufs[qo].written) return "its kernel does not read the input or write the result";
    int gid = -1, stored = 0;
    for (int i = 0; i < k->n; i++) {
        const KInst *x = &k->inst[i];
        if (x->op == K_GID) gid = i;
        if (x->op == K_LOOP || x->op == K_IF) return "its kernel has loops or branches";
        if ((x->op != K_LOAD && x->op != K_STORE) || (x->buf != qi && x->buf != qo)) continue;
        if (gid < 0 || x->a[0] != gid) return "its kernel reads or writes another work item's element";
        if (x->op == K_STORE && x->buf == qo) stored = 1;
        if (x->op == K_LOAD && x->buf == qi && stored) return "its kernel reads the old value after writing the new one";
    }
    *launch = li, *pin = qi, *pout = qo;
    return NULL;
}

/* Buffer ob's number goes: every reference to a later buffer moves down one (none is left to ob). */
static void fz_drop_buffer(FuseResult *r, int ob) {
    memmove(&r->buffers[ob], &r->buffers[ob + 1], sizeof(FuseBuffer) * (size_t)(r->nbuffers - ob - 1));
    r->nbuffers--;
#define FZ_RENUMBER(x) ((x) = (x) > ob ? (x) - 1 : (x))
    for (int id = 0; id < r->g->n; id++) FZ_RENUMBER(r->node_buffer[id]);
    for (int li = 0; li < r->nlaunches; li++) {
        FuseLaunch *L = &r->launches[li];
        if (L->kind == FL_GEMM) {
            FZ_RENUMBER(L->gemm.a), FZ_RENUMBER(L->gemm.b), FZ_RENUMBER(L->gemm.c), FZ_RENUMBER(L->gemm.bias);
            continue;
        }
        Kernel *k = r->kernels[L->kernel];
        for (int q = 0; q < k->nbufs; q++) FZ_RENUMBER(k->bufs[q].buffer);
    }
#undef FZ_RENUMBER
}

/* An update graph (GraphUpdate): each new value - the parameters, each state variable - written
 * over its old one where fz_in_place_refusal allows, so that optimizer_update needs neither an
 * arena buffer for it nor a copy into its region afterwards (for GPT-2 124M's AdamW, 1.5 GB of
 * arena and 3 x 0.5 GB copied a step). The kernel's parameter of the result becomes the input's,
 * now read and written (one pointer: the CPU back end's vectoriser sees the same address), and
 * the result's buffer is gone. The same arithmetic on the same values. */
static void fz_update_in_place(FuseResult *r, Arena *ar) {
    const GraphUpdate *u = r->g->update;
    for (int j = 0; j <= u->nstate; j++) {
        int in_node = j == 0 ? u->p_in : u->state_in[j - 1], out_node = j == 0 ? u->p_out : u->state_out[j - 1];
        int ib = r->node_buffer[in_node], ob = r->node_buffer[out_node], li = -1, qi = -1, qo = -1;
        if (in_node == out_node || ib < 0 || ob < 0 || ib == ob) continue;
        const char *why = fz_in_place_refusal(r, ib, ob, out_node, &li, &qi, &qo);
        if (why) {
            if (!r->not_in_place)
                r->not_in_place =
                    j == 0 ? arena_printf(ar, "p: %s", why) : arena_printf(ar, "state.%s: %s", u->state_name[j - 1], why);
            continue;
        }
        Kernel *k = r->kernels[r->launches[li].kernel];
        for (int i = 0; i < k->n; i++) {
            KInst *x = &k->inst[i];
            if (x->op != K_LOAD && x->op != K_STORE) continue;
            if (x->buf == qo) x->buf = qi;
            if (x->buf > qo) x->buf--;
        }
        k->bufs[qi].written = 1;
        memmove(&k->bufs[qo], &k->bufs[qo + 1], sizeof(KBuf) * (size_t)(k->nbufs - qo - 1));
        k->nbufs--;
        FuseBuffer *in = &r->buffers[ib];
        if (r->buffers[ob].last > in->last) in->last = r->buffers[ob].last;
        in->over = li;
        for (int id = 0; id < r->g->n; id++)
            if (r->node_buffer[id] == ob) r->node_buffer[id] = ib;
        fz_drop_buffer(r, ob);
        r->n_in_place++;
    }
}

/* fuse.h */
FuseResult *fuse_codegen(const FusedGraph *fg, Arena *ar) {
    Arena tmp = {0};
    FuseResult *r = arena_alloc(ar, sizeof(FuseResult));
    r->g = fg->g;
    r->noutputs = fg->noutputs;
    r->outputs = arena_dup(ar, fg->outputs, sizeof(int) * (size_t)(fg->noutputs ? fg->noutputs : 1));
    FuseCtx ctx = {.ar = ar, .tmp = &tmp, .g = fg->g, .fg = fg, .casts_apart = fg->casts_apart};
    int *order = NULL;
    int nl = fuse_partition(&ctx, &order);
    fz_buffers(&ctx, r, order, nl);
    fz_launches(&ctx, r, order, nl);
    if (fg->g->update) fz_update_in_place(r, ar);
    arena_free(&tmp);
    return r;
}

/* fuse.h */
void fuse_casts_apart(FusedGraph *fg, int on) { fg->casts_apart = on; }

/* fuse.h */
FuseResult *fuse_graph(const Graph *g, const int *outputs, int noutputs, Arena *ar) {
    Arena tmp = {0}; /* the fused graph lives only while its kernels are generated */
    FuseResult *r = fuse_codegen(fuse_lower_graph(g, outputs, noutputs, &tmp), ar);
    arena_free(&tmp);
    return r;
}

void fuse_counts(const FuseResult *r, int *gemms, int *kernels) {
    if (gemms) *gemms = r->ngemms;
    if (kernels) *kernels = r->nkernels;
}

/* ---- checking ------------------------------------------------------------------------------------------ */

int fuse_verify(const FuseResult *r, FILE *out) {
    int problems = 0;
    for (int i = 0; i < r->nkernels; i++) problems += kir_verify(r->kernels[i], out);
    for (int i = 0; i < r->nlaunches; i++) {
        const FuseLaunch *L = &r->launches[i];
        if (L->kind == FL_KERNEL) {
            const Kernel *k = r->kernels[L->kernel];
            for (int b = 0; b < k->nbufs; b++)
                if (k->bufs[b].buffer < 0 || k->bufs[b].buffer >= r->nbuffers) {
                    problems++;
                    if (out) fprintf(out, "fuse: %s: parameter p%d has no buffer\n", k->name, b);
                }
            continue;
        }
        const FuseGemm *m = &L->gemm;
        int bufs[4] = {m->a, m->b, m->c, m->bias};
        int64_t need[4] = {(m->batch - 1) * m->stride_a + (m->trans_a ? m->k : m->m) * m->lda,
                           (m->batch - 1) * m->stride_b + (m->trans_b ? m->n : m->k) * m->ldb,
                           (m->batch - 1) * m->stride_c + m->m * m->ldc,
                           m->epilogue == FE_ADD ? (m->batch - 1) * m->stride_c + m->m * m->ldc : m->n};
        for (int j = 0; j < (m->epilogue != FE_NONE ? 4 : 3); j++) {
            if (bufs[j] < 0 || bufs[j] >= r->nbuffers) {
                problems++;
                if (out) fprintf(out, "fuse: launch %d: a GEMM operand has no buffer\n", i);
                continue;
            }
            const FuseBuffer *b = &r->buffers[bufs[j]];
            int64_t numel = 1;
            for (int d = 0; d < b->rank; d++) numel *= b->shape[d];
            if (need[j] > numel) {
                problems++;
                if (out)
                    fprintf(out, "fuse: launch %d: GEMM operand %c needs %" PRId64 " elements of b%d's %" PRId64 "\n", i,
                            "abcv"[j], need[j], bufs[j], numel);
            }
        }
    }
    for (int i = 0; i < r->nbuffers; i++)
        if (r->buffers[i].first > r->buffers[i].last) {
            problems++;
            if (out) fprintf(out, "fuse: buffer b%d's life starts after it ends\n", i);
        }
    return problems;
}

/* ---- printing ------------------------------------------------------------------------------------------ */

static void fz_print_type(FILE *out, DType dt, int rank, const int64_t *shape) {
    fprintf(out, "%s[", dtype_name(dt));
    for (int i = 0; i < rank; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", shape[i]);
    fprintf(out, "]");
}

static const char *fz_where(Arena *ar, Span s) {
    if (!s.file) return "";
    const char *path = diag_source_path(s.file);
    if (!path) return "";
    const char *slash = strrchr(path, '/');
    return arena_printf(ar, "%s:%u:%u", slash ? slash + 1 : path, s.line, s.col);
}

static void fz_print_nodes(FILE *out, const Graph *g, const int *nodes, int nn, Arena *ar) {
    for (int i = 0; i < nn; i++) {
        const GNode *x = graph_node(g, nodes[i]);
        char head[64];
        snprintf(head, sizeof head, "%%%d %s", x->id, graph_op_name(x->op));
        fprintf(out, "    %-28s %s\n", head, fz_where(ar, x->src));
    }
}

static const char *const fz_buf_kinds[] = {"param", "input", "output", "temp"};

void fuse_print(FILE *out, const FuseResult *r) {
    Arena scratch = {0};
    const Graph *g = r->g;
    int64_t temp = 0;
    for (int i = 0; i < r->nbuffers; i++)
        if (r->buffers[i].kind == FB_TEMP) temp += r->buffers[i].bytes;
    fprintf(out, "# kernels%s%s: %d launches (%d gemm, %d kernels), %d buffers, %" PRId64 " bytes of temporaries\n",
            g->name ? " " : "", g->name ? g->name : "", r->nlaunches, r->ngemms, r->nkernels, r->nbuffers, temp);
    fprintf(out, "\n# launches\n");
    for (int i = 0; i < r->nlaunches; i++) {
        const FuseLaunch *L = &r->launches[i];
        if (L->kind == FL_GEMM) {
            const FuseGemm *m = &L->gemm;
            fprintf(out, "%3d  gemm   b%d = b%d%s @ b%d%s  m=%" PRId64 " n=%" PRId64 " k=%" PRId64, i, m->c, m->a,
                    m->trans_a ? "^T" : "", m->b, m->trans_b ? "^T" : "", m->m, m->n, m->k);
            if (m->batch > 1) fprintf(out, " batch=%" PRId64, m->batch);
            if (m->epilogue == FE_BIAS) fprintf(out, " +bias b%d", m->bias);
            if (m->epilogue == FE_BGRAD_B) fprintf(out, " b%d = colsum b%d", m->bias, m->b);
            if (m->epilogue == FE_ADD) fprintf(out, " +add b%d", m->bias);
        } else {
            const Kernel *k = r->kernels[L->kernel];
            fprintf(out, "%3d  kernel %s  %s grid=%" PRId64, i, k->name, kir_kind_name(k->kind), k->grid);
            if (k->nsegments > 1) fprintf(out, " segments=%d", k->nsegments);
            if (k->lora) fprintf(out, " lora=down+up rank=%" PRId64, k->lora->r);
        }
        fprintf(out, "  ops");
        for (int j = 0; j < L->nnodes; j++) fprintf(out, " %%%d", L->nodes[j]);
        fprintf(out, "\n");
    }
    fprintf(out, "\n# buffers (launches first..last)\n");
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *b = &r->buffers[i];
        char type[160];
        FILE *m = fmemopen(type, sizeof type, "w");
        if (m) {
            fz_print_type(m, b->dt, b->rank, b->shape);
            fclose(m);
        } else {
            snprintf(type, sizeof type, "?");
        }
        fprintf(out, "b%-4d %-6s %-32s %-20s %10" PRId64 " B", i, fz_buf_kinds[b->kind], b->what, type, b->bytes);
        if (b->first >= 0) fprintf(out, "  %d..%d", b->first, b->last);
        else fprintf(out, "  unused");
        if (b->over >= 0) fprintf(out, "  (the %s over it from %d)", r->g->update ? "new value" : "gradient", b->over);
        fprintf(out, "\n");
    }
    for (int i = 0; i < r->nlaunches; i++) {
        const FuseLaunch *L = &r->launches[i];
        fprintf(out, "\n");
        if (L->kind == FL_GEMM) {
            const FuseGemm *m = &L->gemm;
            fprintf(out, "gemm (launch %d): C[m, n] = alpha * opA[m, k] opB[k, n] + beta * C%s\n", i,
                    m->epilogue == FE_BIAS  ? " + bias[n]"
                    : m->epilogue == FE_ADD ? " + D[m, n]"
                                            : "");
            fprintf(out, "  ops:\n");
            fz_print_nodes(out, g, L->nodes, L->nnodes, &scratch);
            fprintf(out, "  a=b%d trans_a=%d lda=%" PRId64 "  b=b%d trans_b=%d ldb=%" PRId64 "  c=b%d ldc=%" PRId64 "\n", m->a,
                    m->trans_a, m->lda, m->b, m->trans_b, m->ldb, m->c, m->ldc);
            fprintf(out,
                    "  m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " batch=%" PRId64 " stride_a=%" PRId64 " stride_b=%" PRId64
                    " stride_c=%" PRId64 " alpha=%s beta=%s %s\n",
                    m->m, m->n, m->k, m->batch, m->stride_a, m->stride_b, m->stride_c, value_float_str(&scratch, m->alpha),
                    value_float_str(&scratch, m->beta), dtype_name(m->dt));
            if (m->epilogue == FE_BIAS) fprintf(out, "  epilogue: bias b%d added to every row of C\n", m->bias);
            if (m->epilogue == FE_BGRAD_B) fprintf(out, "  epilogue: b%d[n] = sum_k opB[k, n] (a bias gradient)\n", m->bias);
            if (m->epilogue == FE_ADD) fprintf(out, "  epilogue: D = b%d (laid out as C) added to C\n", m->bias);
            continue;
        }
        const Kernel *k = r->kernels[L->kernel];
        fprintf(out, "kernel %s (launch %d): %s, grid %" PRId64, k->name, i, kir_kind_name(k->kind), k->grid);
        if (k->nsegments > 1) fprintf(out, ", %d segments", k->nsegments);
        fprintf(out, "\n  ops:\n");
        fz_print_nodes(out, g, k->nodes, k->nnodes, &scratch);
        fprintf(out, "  buffers:\n");
        for (int b = 0; b < k->nbufs; b++) {
            const KBuf *p = &k->bufs[b];
            const FuseBuffer *fb = &r->buffers[p->buffer];
            fprintf(out, "    p%d = b%-4d %-3s %-32s ", b, p->buffer, p->written ? (kir_loads(k, b) ? "i/o" : "out") : "in",
                    fb->what);
            fz_print_type(out, p->dt, p->rank, p->shape);
            fprintf(out, "\n");
        }
        if (k->attn) kir_print_attn(out, k->attn, "  ");
        if (k->scatter) kir_print_scatter(out, k->scatter, "  ");
        if (k->ce) kir_print_ce(out, k->ce, "  ");
        if (k->lora) kir_print_lora(out, k->lora, "  ");
        fprintf(out, "  body:\n");
        kir_print_body(out, k, 4);
    }
    arena_free(&scratch);
}

/* fuse.h */
const char *fuse_kernel_ops_note(const Graph *g, const Kernel *k, Arena *ar) {
    const char *note = "";
    for (int i = 0; i < k->nnodes; i++) {
        const GNode *n = graph_node(g, k->nodes[i]);
        const char *path = n->src.file ? diag_source_path(n->src.file) : NULL;
        const char *base = path && strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        const char *head = arena_printf(ar, "%%%d %s", n->id, graph_op_name(n->op));
        note = base ? arena_printf(ar, "%s%-28s %s:%u:%u\n", note, head, base, n->src.line, n->src.col)
                    : arena_printf(ar, "%s%s\n", note, head);
    }
    return note;
}
