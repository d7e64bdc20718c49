/* plan_recompute.c - selective recompute of the step phase (plan.h, PlanRecompute; docs/memory.md).
 *
 * Works on the fused step schedule's launches, not on graph ops: fusion decided what is
 * materialised, so the unit that can run again is a launch, and a launch run again writes every
 * buffer it writes. A held buffer (written by a forward launch, read by a backward one) is
 * recomputed when its launch is chosen and can run again: it is a GEMM with beta = 0 or a
 * generated kernel, and it is the one writer of everything it writes (so running it again from the
 * same inputs stores the same bits). What a chosen launch reads must exist at its re-run: a leaf
 * (parameter, input, dropout's key) always does; a held buffer that is kept is kept until then;
 * a forward-only value is made again by running its own launch first when that launch can run
 * again, else it is kept until the re-run.
 *
 * The re-run of a launch comes just before the first backward launch that reads what it writes,
 * or earlier when another re-run reads it. Every later reader reads the second copy, which the
 * memory plan places by liveness like any buffer; the first copy dies after its last forward use.
 * Re-runs come after the loss and after the statistics' launches, so forward_loss and
 * forward_stats, which run a prefix of the schedule, see the first copies only. */
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "plan_internal.h"

/* The buffers launch li reads and writes: out[i] = buffer, wr[i] = 1 when written. */
int plan_launch_bufs(const FuseResult *r, int li, int *out, unsigned char *wr, int cap) {
    const FuseLaunch *L = &r->launches[li];
    int n = 0;
    if (L->kind == FL_GEMM) {
        const FuseGemm *g = &L->gemm;
        out[n] = g->a, wr[n++] = 0;
        out[n] = g->b, wr[n++] = 0;
        out[n] = g->c, wr[n++] = 1;
        if (g->bias >= 0) out[n] = g->bias, wr[n++] = g->epilogue == FE_BGRAD_B;
        return n;
    }
    const Kernel *K = r->kernels[L->kernel];
    for (int i = 0; i < K->nbufs && n < cap; i++) out[n] = K->bufs[i].buffer, wr[n++] = (unsigned char)K->bufs[i].written;
    return n;
}

static int launch_nodes(const FuseResult *r, int li, const int **nodes) {
    const FuseLaunch *L = &r->launches[li];
    if (L->kind == FL_GEMM) {
        *nodes = L->nodes;
        return L->nnodes;
    }
    *nodes = r->kernels[L->kernel]->nodes;
    return r->kernels[L->kernel]->nnodes;
}

/* "h.3" for "h.3.attn.c_attn.weight": the path up to its first numeric component (an element of a
 * list of sub-models: a block); NULL when it has none. */
static const char *block_of(Arena *ar, const char *name) {
    if (!name) return NULL;
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int digits = len > 0;
        for (size_t i = 0; i < len; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (digits) return arena_printf(ar, "%.*s", (int)(p + len - name), name);
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

/* "h.3.mlp" for "h.3.mlp.c_fc.weight": the path up to a component "mlp"; NULL when none. */
static const char *mlp_of(Arena *ar, const char *name) {
    if (!name) return NULL;
    for (const char *p = name; *p;) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 3 && memcmp(p, "mlp", 3) == 0) return arena_printf(ar, "%.*s", (int)(p + 3 - name), name);
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

typedef struct Rc {
    Arena *ar;
    const FuseResult *r;
    int nl, nb;
    int **bufs;           /* [nl] each launch's buffers */
    unsigned char **wr;   /* [nl] and whether written */
    int *nbufs;           /* [nl] */
    int *writer;          /* [nb] the one launch that writes it; -1 none, -2 several */
    unsigned char *held;  /* [nb] */
    unsigned char *again; /* [nl] can run again */
    unsigned char *inR;   /* [nl] runs again */
    const char **why;     /* [nl] */
} Rc;

static int is_temp(const Rc *c, int b) { return c->r->buffers[b].kind == FB_TEMP && c->r->buffers[b].bytes > 0; }

/* The launch's keyword match (one bit of mask), by the graph ops it computes: 0 when none. */
static unsigned launch_match(const Rc *c, const Graph *g, int li, int first_bwd, const int *mlp_lo, const int *mlp_hi, int nmlp) {
    const int *nodes;
    int n = launch_nodes(c->r, li, &nodes);
    unsigned m = 0;
    int all_mlp = n > 0;
    for (int i = 0; i < n; i++) {
        int id = nodes[i];
        if (id < 0 || id >= g->n || id >= first_bwd) continue;
        GOp op = g->node[id]->op;
        if (op == G_GELU) m |= 1u << 0;
        if (op == G_LAYERNORM || op == G_RMSNORM) m |= 1u << 1;
        if (op == G_ATTENTION) m |= 1u << 2;
        int in_mlp = 0;
        for (int k = 0; k < nmlp; k++) in_mlp |= id >= mlp_lo[k] && id <= mlp_hi[k];
        all_mlp &= in_mlp;
    }
    if (all_mlp) m |= 1u << 3;
    return m;
}

int plan_recompute(PlanCtx *pc, const FuseResult *r, int loss_launch, int stats_last, PlanRecompute *rc) {
    Arena *ar = pc->ar;
    const Graph *g = r->g;
    int first_bwd = pc->p->first_bwd;
    Rc C = {.ar = ar, .r = r, .nl = r->nlaunches, .nb = r->nbuffers};
    Rc *c = &C;
    int nl = c->nl, nb = c->nb;
    c->bufs = arena_alloc(ar, sizeof(int *) * (size_t)(nl + 1));
    c->wr = arena_alloc(ar, sizeof(unsigned char *) * (size_t)(nl + 1));
    c->nbufs = arena_alloc(ar, sizeof(int) * (size_t)(nl + 1));
    c->writer = arena_alloc(ar, sizeof(int) * (size_t)(nb + 1));
    c->held = arena_alloc(ar, (size_t)nb + 1);
    c->again = arena_alloc(ar, (size_t)nl + 1);
    c->inR = arena_alloc(ar, (size_t)nl + 1);
    c->why = arena_alloc(ar, sizeof(char *) * (size_t)(nl + 1));
    for (int b = 0; b < nb; b++) c->writer[b] = -1;
    int boundary = nl;
    for (int li = 0; li < nl; li++) {
        int cap = 4;
        if (r->launches[li].kind == FL_KERNEL) cap = r->kernels[r->launches[li].kernel]->nbufs;
        c->bufs[li] = arena_alloc(ar, sizeof(int) * (size_t)(cap + 1));
        c->wr[li] = arena_alloc(ar, (size_t)cap + 1);
        c->nbufs[li] = plan_launch_bufs(r, li, c->bufs[li], c->wr[li], cap);
        for (int i = 0; i < c->nbufs[li]; i++)
            if (c->wr[li][i]) {
                int b = c->bufs[li][i];
                c->writer[b] = c->writer[b] == -1 || c->writer[b] == li ? li : -2;
            }
        const int *nodes;
        int nn = launch_nodes(r, li, &nodes);
        for (int i = 0; i < nn && boundary == nl; i++)
            if (nodes[i] >= first_bwd) boundary = li;
    }
    if (boundary <= loss_launch) boundary = loss_launch + 1;
    if (boundary <= stats_last) boundary = stats_last + 1;
    if (boundary > nl) boundary = nl;
    rc->boundary = boundary;
    /* held: a temporary written before the boundary (by one launch) and read after it */
    for (int li = boundary; li < nl; li++)
        for (int i = 0; i < c->nbufs[li]; i++) {
            int b = c->bufs[li][i];
            if (!c->wr[li][i] && is_temp(c, b) && c->writer[b] >= 0 && c->writer[b] < boundary) c->held[b] = 1;
        }
    /* which forward launches can run again */
    for (int li = 0; li < boundary; li++) {
        const FuseLaunch *L = &r->launches[li];
        int ok = !(L->kind == FL_GEMM && (L->gemm.beta != 0 || L->gemm.epilogue == FE_BGRAD_B));
        const int *nodes; /* a launch fused with backward ops (cross_entropy's with its gradient) is not re-run */
        int nn = launch_nodes(r, li, &nodes);
        for (int i = 0; i < nn; i++) ok &= nodes[i] < first_bwd;
        for (int i = 0; i < c->nbufs[li] && ok; i++) {
            int b = c->bufs[li][i];
            if (c->wr[li][i]) ok = is_temp(c, b) && c->writer[b] == li && r->buffers[b].first == li;
        }
        c->again[li] = (unsigned char)ok;
    }
    /* the MLPs' forward nodes: for each sub-model path "...mlp", the node ids from the first to the
     * last forward node that reads one of its parameters */
    int nmlp = 0;
    const char **mlp_name = arena_alloc(ar, sizeof(char *) * (size_t)(g->nparams + 1));
    int *mlp_lo = arena_alloc(ar, sizeof(int) * (size_t)(g->nparams + 1));
    int *mlp_hi = arena_alloc(ar, sizeof(int) * (size_t)(g->nparams + 1));
    for (int id = 0; id < first_bwd && id < g->n; id++) {
        const GNode *n = g->node[id];
        for (int k = 0; k < n->nin; k++) {
            const GNode *in = g->node[n->in[k]];
            const char *mn = in->op == G_PARAM ? mlp_of(ar, in->name) : NULL;
            if (!mn) continue;
            int j = 0;
            while (j < nmlp && strcmp(mlp_name[j], mn) != 0) j++;
            if (j == nmlp) mlp_name[nmlp] = mn, mlp_lo[nmlp] = id, mlp_hi[nmlp++] = id;
            if (id < mlp_lo[j]) mlp_lo[j] = id;
            if (id > mlp_hi[j]) mlp_hi[j] = id;
        }
    }
    /* blocks (for `all`): a forward launch's block is that of the parameters it reads (their path
     * up to a numeric component, "h.3"), "" for parameters of none, else the previous launch's; a
     * block input is a buffer a forward launch of another block reads */
    const char **blk = arena_alloc(ar, sizeof(char *) * (size_t)(boundary + 1));
    const char *cur = "";
    for (int li = 0; li < boundary; li++) {
        const char *found = NULL;
        for (int i = 0; i < c->nbufs[li]; i++) {
            const FuseBuffer *fb = &r->buffers[c->bufs[li][i]];
            if (fb->kind != FB_PARAM || fb->node < 0) continue;
            const char *bn = block_of(ar, g->node[fb->node]->name);
            if (!found || (bn && !*found)) found = bn ? bn : "";
        }
        if (found) cur = found;
        blk[li] = cur;
    }
    unsigned char *block_in = arena_alloc(ar, (size_t)nb + 1);
    for (int li = 0; li < boundary; li++)
        for (int i = 0; i < c->nbufs[li]; i++) {
            int b = c->bufs[li][i], w = c->writer[b];
            if (!c->wr[li][i] && is_temp(c, b) && w >= 0 && w < boundary && strcmp(blk[w], blk[li]) != 0) block_in[b] = 1;
        }
    /* the chosen launches */
    static const char *const kw[] = {"gelu", "layernorm", "attention", "mlp", "all"};
    int all = (rc->mask & RECOMPUTE_ALL) != 0;
    for (int li = 0; li < boundary; li++) {
        if (!c->again[li]) continue;
        int writes_held = 0, writes_block_in = 0;
        for (int i = 0; i < c->nbufs[li]; i++)
            if (c->wr[li][i]) writes_held |= c->held[c->bufs[li][i]], writes_block_in |= block_in[c->bufs[li][i]];
        if (!writes_held) continue;
        unsigned m = launch_match(c, g, li, first_bwd, mlp_lo, mlp_hi, nmlp) & rc->mask;
        if (all && !writes_block_in) m |= RECOMPUTE_ALL;
        if (!m) continue;
        c->inR[li] = 1;
        for (int k = 0; k < 5; k++)
            if (m & (1u << k)) {
                c->why[li] = kw[k];
                break;
            }
    }
    unsigned matched = 0;
    for (int li = 0; li < boundary; li++)
        for (int k = 0; k < 5 && c->inR[li]; k++)
            if (c->why[li] == kw[k]) matched |= 1u << k;
    for (int k = 0; k < 5; k++)
        if ((rc->mask & (1u << k)) && !(matched & (1u << k)))
            plan_note(pc, arena_printf(ar,
                                       "recompute: '%s' matches no forward launch that writes a held buffer and can run "
                                       "again: nothing is recomputed for it (docs/memory.md)",
                                       kw[k]));
    /* closure: what a re-run reads exists at the re-run; rc->fate of the kept-for and re-made */
    rc->fate = arena_alloc(ar, (size_t)nb + 1);
    for (int li = boundary - 1; li >= 0; li--) {
        if (!c->inR[li]) continue;
        for (int i = 0; i < c->nbufs[li]; i++) {
            int b = c->bufs[li][i], w = c->writer[b];
            if (c->wr[li][i] || !is_temp(c, b) || w < 0 || c->inR[w] || c->held[b]) continue;
            if (w < boundary && c->again[w] && !(all && block_in[b])) {
                c->inR[w] = 1; /* w < li: the loop reaches it later */
                c->why[w] = "needed by a re-run";
            } else rc->fate[b] = PF_KEPT_FOR;
        }
    }
    /* where each re-run goes: before the first backward reader of what it writes, and before the
     * re-runs that read it (walking down: readers come after their writers) */
    int *before = arena_alloc(ar, sizeof(int) * (size_t)(nl + 1));
    int *first_reader = arena_alloc(ar, sizeof(int) * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) first_reader[b] = nl;
    for (int li = nl - 1; li >= boundary; li--)
        for (int i = 0; i < c->nbufs[li]; i++) first_reader[c->bufs[li][i]] = li;
    int nre = 0;
    for (int li = boundary - 1; li >= 0; li--) {
        if (!c->inR[li]) continue;
        nre++;
        int bf = nl;
        for (int i = 0; i < c->nbufs[li]; i++)
            if (c->wr[li][i] && first_reader[c->bufs[li][i]] < bf) bf = first_reader[c->bufs[li][i]];
        for (int lj = li + 1; lj < boundary; lj++) {
            if (!c->inR[lj] || before[lj] >= bf) continue;
            for (int i = 0; i < c->nbufs[lj]; i++)
                if (!c->wr[lj][i] && c->writer[c->bufs[lj][i]] == li) bf = before[lj];
        }
        if (bf >= nl) INTERNAL("plan: re-run of launch %d has no reader", li);
        before[li] = bf;
    }
    /* the order: the schedule's launches, each re-run before its launch (re-runs in launch order) */
    rc->nreruns = nre;
    rc->reruns = arena_alloc(ar, sizeof(PlanRerun) * (size_t)(nre + 1));
    rc->norder = nl + nre;
    rc->order = arena_alloc(ar, sizeof(int) * (size_t)(rc->norder + 1));
    int q = 0, j = 0;
    for (int li = 0; li < nl; li++) {
        for (int lr = 0; lr < boundary && li >= boundary; lr++)
            if (c->inR[lr] && before[lr] == li) {
                rc->reruns[j] = (PlanRerun){lr, li, c->why[lr]};
                rc->order[q++] = -1 - j++;
            }
        rc->order[q++] = li;
    }
    if (q != rc->norder || j != nre) INTERNAL("plan: the recompute order");
    /* fates and the two copies' lives over the order */
    rc->rerun = arena_alloc(ar, sizeof(int) * (size_t)(nb + 1));
    rc->again = arena_alloc(ar, sizeof(PlanSlot) * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) {
        rc->rerun[b] = -1;
        if (c->held[b]) rc->fate[b] = PF_KEPT;
    }
    for (int k = 0; k < nre; k++) {
        int li = rc->reruns[k].launch;
        for (int i = 0; i < c->nbufs[li]; i++) {
            int b = c->bufs[li][i];
            if (!c->wr[li][i]) continue;
            rc->rerun[b] = k;
            rc->fate[b] = c->held[b] ? PF_RECOMP : PF_REMADE;
            rc->again[b] = (PlanSlot){PH_NONE, 0, r->buffers[b].bytes, -1, -1};
        }
    }
    return 0;
}

/* The lives of the step's buffers over rc's order: slot i's first and last (its first copy),
 * rc->again[i]'s (its second). An output lives to the end. */
void plan_last_touch(const FuseResult *r, int *last) {
    int bufs[64];
    unsigned char wr[64];
    for (int b = 0; b < r->nbuffers; b++) last[b] = -1;
    for (int li = 0; li < r->nlaunches; li++) {
        int cap = r->launches[li].kind == FL_KERNEL ? r->kernels[r->launches[li].kernel]->nbufs : 4;
        int *bv = cap > 64 ? malloc(sizeof(int) * (size_t)cap) : bufs;
        unsigned char *wv = cap > 64 ? malloc((size_t)cap) : wr;
        if (!bv || !wv) INTERNAL("plan: out of memory");
        int n = plan_launch_bufs(r, li, bv, wv, cap);
        for (int i = 0; i < n; i++) last[bv[i]] = li;
        if (bv != bufs) free(bv), free(wv);
    }
}

void plan_recompute_lives(const FuseResult *r, PlanRecompute *rc, PlanSlot *slots, const unsigned char *early) {
    int nb = r->nbuffers;
    unsigned char *second = calloc((size_t)nb + 1, 1);
    int bufs[64];
    unsigned char wr[64];
    for (int b = 0; b < nb; b++) slots[b].first = slots[b].last = -1;
    for (int q = 0; q < rc->norder; q++) {
        int o = rc->order[q], li = o >= 0 ? o : rc->reruns[-1 - o].launch;
        int *bv = bufs;
        unsigned char *wv = wr;
        int cap = r->launches[li].kind == FL_KERNEL ? r->kernels[r->launches[li].kernel]->nbufs : 4;
        if (cap > 64) {
            bv = malloc(sizeof(int) * (size_t)cap);
            wv = malloc((size_t)cap);
        }
        int n = plan_launch_bufs(r, li, bv, wv, cap);
        if (o < 0)
            for (int i = 0; i < n; i++)
                if (wv[i] && rc->rerun[bv[i]] == -1 - o) second[bv[i]] = 1;
        for (int i = 0; i < n; i++) {
            int b = bv[i];
            PlanSlot *s = second[b] ? &rc->again[b] : &slots[b];
            if (s->first < 0) s->first = q;
            s->last = q;
        }
        if (bv != bufs) free(bv), free(wv);
    }
    for (int b = 0; b < nb; b++) {
        if (r->buffers[b].kind == FB_OUTPUT && slots[b].first >= 0 && !early[b]) slots[b].last = rc->norder - 1;
        if (rc->rerun[b] >= 0 && rc->again[b].first < 0) INTERNAL("plan: buffer %d's second copy is never touched", b);
    }
    free(second);
}
