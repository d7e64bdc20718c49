/* fused.c - the fused IR as a stage of its own: its printer (`mbtc --emit=fused`) and its
 * verifier.
 *
 * Pipeline position: graph -> autodiff -> fuse: fuse_lower.c -> [the fused IR] ->
 * partition (fuse_partition.c) -> kernels (fuse.c, fuse_codegen.c) -> kernel IR. The nodes are
 * described in fuse_internal.h; a line of the listing reads
 *   f12 = map mul f7, f11 : f32[4, 16]          # %21 layernorm  tiny.mbt:12:5
 * with the graph node each fused node was made for (a composite's parts name the composite). */
#include "fuse_internal.h"
#include "diag.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- printing -------------------------------------------------------------------------------- */

#define FUSED_PRINT_COLUMN 72 /* where the `# %N op  file:line:col` comments start, as graph_print */

/* A constant as the program would write it: booleans and integers plainly, floats shortest. */
static const char *fd_num(Arena *ar, double v, DType dt) {
    if (dt == DT_BOOL) return v != 0 ? "true" : "false";
    if (!dtype_is_float(dt) && v == (double)(int64_t)v) return arena_printf(ar, "%" PRId64, (int64_t)v);
    return value_float_str(ar, v);
}

static void fd_axes(FILE *l, uint32_t mask) {
    fprintf(l, " axes=");
    for (int a = 0, first = 1; a < 32; a++)
        if (mask & (1u << a)) {
            fprintf(l, "%s%d", first ? "" : ",", a);
            first = 0;
        }
}

static void fd_gemm(FILE *l, const FuseGemm *m) {
    fprintf(l, " m=%" PRId64 " n=%" PRId64 " k=%" PRId64, m->m, m->n, m->k);
    if (m->batch != 1)
        fprintf(l, " batch=%" PRId64 " strides=%" PRId64 ",%" PRId64 ",%" PRId64, m->batch, m->stride_a, m->stride_b,
                m->stride_c);
    if (m->trans_a) fprintf(l, " trans_a");
    if (m->trans_b) fprintf(l, " trans_b");
    fprintf(l, " ld=%" PRId64 ",%" PRId64 ",%" PRId64, m->lda, m->ldb, m->ldc);
    if (m->alpha != 1.0 || m->beta != 0.0) fprintf(l, " alpha=%g beta=%g", m->alpha, m->beta);
    if (m->epilogue == FE_BIAS) fprintf(l, " +bias");
    if (m->epilogue == FE_ADD) fprintf(l, " +add");
}

/* The op and its attributes: "map mul", "reduce max", "leaf param wte", "const 0.5". */
static void fd_head(FILE *l, Arena *ar, const FusedGraph *fg, const FNode *n) {
    fprintf(l, "f%d = %s", n->id, fuse_fop_name(n->op));
    if (n->op == F_MAP || n->op == F_REDUCE) fprintf(l, " %s", kir_op_name(n->kop));
    if (n->op == F_LEAF) {
        const GNode *gn = n->ia[0] >= 0 && n->ia[0] < fg->g->n ? graph_node(fg->g, (int)n->ia[0]) : NULL;
        fprintf(l, " %s %s", gn && gn->op == G_PARAM ? "param" : "input", gn && gn->name ? gn->name : "?");
    }
    if (n->op == F_CONST) fprintf(l, " %s", fd_num(ar, n->fa[0], n->dt));
}

static void fd_attrs(FILE *l, Arena *ar, const FNode *n) {
    const int64_t *ia = n->ia;
    switch (n->op) {
    case F_IOTA: fprintf(l, " axis=%" PRId64, ia[0]); break;
    case F_PERMUTE: fprintf(l, " axes=%" PRId64 ",%" PRId64, ia[0], ia[1]); break;
    case F_SLICE: fprintf(l, " axis=%" PRId64 " start=%" PRId64, ia[0], ia[1]); break;
    case F_CONCAT: fprintf(l, " axis=%" PRId64, ia[0]); break;
    case F_DROPOUT: fprintf(l, " p=%s stream=%" PRId64, value_float_str(ar, n->fa[0]), ia[0]); break;
    case F_ROPE:
        fprintf(l, " theta=%s%s%s", value_float_str(ar, n->fa[0]), ia[0] ? " backward" : "", ia[1] ? " docs" : "");
        break;
    case F_REDUCE: fd_axes(l, (uint32_t)ia[0]); break;
    case F_GEMM:
    case F_LORA_S:
    case F_LORA: fd_gemm(l, &n->gemm); break;
    case F_ATTN:
    case F_ATTN_LSE:
    case F_ATTN_BWD_Q:
    case F_ATTN_BWD_K:
    case F_ATTN_BWD_V:
        fprintf(l, " causal=%s scale=%s%s", ia[0] ? "true" : "false", value_float_str(ar, n->fa[0]), ia[1] ? " docs" : "");
        break;
    case F_KV_ATTN:
        fprintf(l, " layer=%" PRId64 "/%" PRId64 " block=%" PRId64 " max_blocks=%" PRId64 " kv=%s scale=%s", ia[0], ia[1], ia[2],
                ia[3], dtype_name((DType)n->fa[1]), value_float_str(ar, n->fa[0]));
        break;
    case F_TOPK: fprintf(l, " k=%" PRId64 " axis=%" PRId64 "%s", ia[0], ia[1], ia[2] ? " indices" : ""); break;
    default: break;
    }
}

/* "%21 layernorm  tiny.mbt:12:5": the graph node a fused node was made for, and its source. */
static const char *fd_where(Arena *ar, const Graph *g, int gid) {
    if (gid < 0 || gid >= g->n) return NULL;
    const GNode *x = graph_node(g, gid);
    const char *path = x->src.file ? diag_source_path(x->src.file) : NULL;
    const char *head = arena_printf(ar, "%%%d %s", gid, graph_op_name(x->op));
    if (!path) return head;
    const char *slash = strrchr(path, '/');
    return arena_printf(ar, "%s  %s:%u:%u", head, slash ? slash + 1 : path, x->src.line, x->src.col);
}

/* [fg->n] the nodes the outputs need, in ar. */
static unsigned char *fd_needed(const FusedGraph *fg, Arena *ar) {
    unsigned char *need = arena_alloc(ar, (size_t)fg->n + 1);
    for (int i = 0; i < fg->noutputs; i++) {
        int f = fg->outputs[i] >= 0 && fg->outputs[i] < fg->g->n ? fg->g2f[fg->outputs[i]] : -1;
        if (f >= 0 && f < fg->n) need[f] = 1;
    }
    for (int f = fg->n - 1; f >= 0; f--)
        if (need[f])
            for (int i = 0; i < fg->node[f]->nin; i++)
                if (fg->node[f]->in[i] >= 0 && fg->node[f]->in[i] < f) need[fg->node[f]->in[i]] = 1;
    return need;
}

void fused_print(FILE *out, const FusedGraph *fg) {
    Arena scratch = {0};
    const Graph *g = fg->g;
    unsigned char *need = fd_needed(fg, &scratch);
    int unused = 0;
    for (int f = 0; f < fg->n; f++) unused += !need[f];
    fprintf(out, "# fused%s%s: %d nodes (%d unused) from %d graph nodes, %d output%s\n", g->name ? " " : "",
            g->name ? g->name : "", fg->n, unused, g->n, fg->noutputs, fg->noutputs == 1 ? "" : "s");
    for (int f = 0; f < fg->n; f++) {
        const FNode *n = fg->node[f];
        char *line = NULL;
        size_t len = 0;
        FILE *l = open_memstream(&line, &len);
        if (!l) INTERNAL("fused_print: no memory for a line");
        fd_head(l, &scratch, fg, n);
        for (int i = 0; i < n->nin; i++) fprintf(l, "%sf%d", i ? ", " : " ", n->in[i]);
        fd_attrs(l, &scratch, n);
        fprintf(l, " : %s[", dtype_name(n->dt));
        for (int d = 0; d < n->rank && d < GRAPH_MAX_RANK; d++) fprintf(l, "%s%" PRId64, d ? ", " : "", n->shape[d]);
        fprintf(l, "]%s%s", n->keep ? " keep" : "", need[f] ? "" : " (unused)");
        fclose(l);
        const char *where = fd_where(&scratch, g, n->gid);
        if (where) fprintf(out, "%-*s  # %s\n", FUSED_PRINT_COLUMN - 2, line, where);
        else fprintf(out, "%s\n", line);
        free(line);
    }
    for (int id = 0; id < g->n; id++)
        if (fg->absorbed[id] >= 0)
            fprintf(out, "# %%%d %s folded into f%d\n", id, graph_op_name(graph_node(g, id)->op), fg->absorbed[id]);
    for (int i = 0; i < fg->noutputs; i++) {
        int id = fg->outputs[i];
        fprintf(out, "# out %%%d = f%d\n", id, id >= 0 && id < g->n ? fg->g2f[id] : -1);
    }
    arena_free(&scratch);
}

/* ---- verifying ------------------------------------------------------------------------------- */

typedef struct FusedVerify {
    const FusedGraph *fg;
    FILE *out;
    int problems;
    const FNode *n; /* the node being checked */
} FusedVerify;

/* One problem: `fused: f12 (map, for %21 layernorm): ...`, the graph node the fused node was made
 * for named so that a broken lowering is found from the message alone. */
static void fd_fail(FusedVerify *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fd_fail(FusedVerify *v, const char *fmt, ...) {
    v->problems++;
    if (!v->out) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const FNode *n = v->n;
    const Graph *g = v->fg->g;
    if (!n) fprintf(v->out, "fused: %s\n", msg);
    else if (n->gid >= 0 && n->gid < g->n)
        fprintf(v->out, "fused: f%d (%s, for %%%d %s): %s\n", n->id, fuse_fop_name(n->op), n->gid,
                graph_op_name(graph_node(g, n->gid)->op), msg);
    else fprintf(v->out, "fused: f%d (%s): %s\n", n->id, fuse_fop_name(n->op), msg);
}

static const FNode *fd_in(const FusedVerify *v, int i) { return v->fg->node[v->n->in[i]]; }

static void fd_same_type(FusedVerify *v, const FNode *x, int shape_too) {
    const FNode *n = v->n;
    if (x->dt != n->dt) fd_fail(v, "f%d is %s, the node %s", x->id, dtype_name(x->dt), dtype_name(n->dt));
    if (shape_too && (x->rank != n->rank || memcmp(x->shape, n->shape, sizeof(int64_t) * (size_t)n->rank) != 0))
        fd_fail(v, "f%d's shape differs from the node's", x->id);
}

/* How many inputs op takes: [*lo, *hi]. */
static void fd_arity(FOp op, int *lo, int *hi) {
    static const signed char a[F_OP_COUNT][2] = {
        [F_LEAF] = {0, 0},        [F_CONST] = {0, 0},      [F_IOTA] = {0, 0},       [F_RESHAPE] = {1, 1},
        [F_PERMUTE] = {1, 1},     [F_EXPAND] = {1, 1},     [F_SLICE] = {1, 1},      [F_CONCAT] = {1, FUSE_MAX_IN},
        [F_GATHER] = {2, 2},      [F_TAKE] = {2, 2},       [F_MAP] = {1, 3},        [F_DROPOUT] = {2, 2},
        [F_ROPE] = {1, 2},        [F_REDUCE] = {1, 1},     [F_GEMM] = {2, 3},       [F_GEMM_BGRAD] = {1, 1},
        [F_ATTN] = {3, 4},        [F_ATTN_LSE] = {3, 4},   [F_ATTN_STATS] = {3, 3}, [F_ATTN_BWD_Q] = {5, 6},
        [F_ATTN_BWD_K] = {5, 6},  [F_ATTN_BWD_V] = {5, 6}, [F_KV_ATTN] = {4, 4},    [F_TOPK] = {1, 1},
        [F_SCATTER_ADD] = {2, 2}, [F_SEG_NORM] = {1, 1},   [F_CE_STATS] = {2, 2},   [F_CE_GRAD] = {4, 4},
        [F_LORA_S] = {2, 2},      [F_LORA] = {3, 3},
    };
    *lo = a[op][0];
    *hi = a[op][1];
}

/* The inputs broadcast (right-aligned) to the node's shape. */
static void fd_broadcast(FusedVerify *v) {
    const FNode *n = v->n;
    for (int i = 0; i < n->nin; i++) {
        const FNode *x = fd_in(v, i);
        int ok = x->rank <= n->rank;
        for (int d = 0; ok && d < x->rank; d++) {
            int64_t s = x->shape[d], o = n->shape[n->rank - x->rank + d];
            ok = s == 1 || s == o;
        }
        if (!ok) fd_fail(v, "f%d does not broadcast to the node's shape", x->id);
    }
}

static void fd_view(FusedVerify *v) {
    const FNode *n = v->n, *x = fd_in(v, 0);
    int64_t a = n->ia[0];
    fd_same_type(v, x, 0);
    if (n->op == F_RESHAPE && fuse_numel(x) != fuse_numel(n)) fd_fail(v, "a reshape changes the element count");
    if (n->op == F_PERMUTE) {
        int64_t b = n->ia[1];
        if (a < 0 || b < 0 || a >= n->rank || b >= n->rank || x->rank != n->rank) {
            fd_fail(v, "axes %" PRId64 ",%" PRId64 " outside rank %d", a, b, n->rank);
            return;
        }
        for (int d = 0; d < n->rank; d++)
            if (n->shape[d] != x->shape[d == a ? b : d == b ? a : d])
                fd_fail(v, "the shape is not f%d's with two axes swapped", x->id);
    }
    if (n->op == F_EXPAND) fd_broadcast(v);
    if (n->op == F_SLICE) {
        if (a < 0 || a >= n->rank || x->rank != n->rank) {
            fd_fail(v, "axis %" PRId64 " outside rank %d", a, n->rank);
            return;
        }
        if (n->ia[1] < 0 || n->ia[1] + n->shape[a] > x->shape[a]) fd_fail(v, "the slice runs past f%d's end", x->id);
    }
}

static void fd_reduce(FusedVerify *v) {
    const FNode *n = v->n, *x = fd_in(v, 0);
    uint32_t mask = (uint32_t)n->ia[0];
    fd_same_type(v, x, 0);
    if (x->rank != n->rank || (n->rank < 32 && mask >> n->rank)) {
        fd_fail(v, "axes outside f%d's rank %d", x->id, x->rank);
        return;
    }
    for (int d = 0; d < n->rank; d++)
        if (n->shape[d] != (mask & (1u << d) ? 1 : x->shape[d])) fd_fail(v, "axis %d is not f%d's, reduced or kept", d, x->id);
}

/* A GEMM's operands hold as many elements as its strides and leading dimensions reach. */
static void fd_gemm_check(FusedVerify *v) {
    const FNode *n = v->n;
    const FuseGemm *m = &n->gemm;
    if (m->m * m->n * (m->batch > 0 ? m->batch : 0) != fuse_numel(n)) fd_fail(v, "m * n * batch is not the node's size");
    int64_t need[3] = {(m->batch - 1) * m->stride_a + (m->trans_a ? m->k : m->m) * m->lda,
                       (m->batch - 1) * m->stride_b + (m->trans_b ? m->n : m->k) * m->ldb,
                       m->epilogue == FE_ADD ? fuse_numel(n) : m->n};
    for (int i = 0; i < n->nin; i++)
        if (fuse_numel(fd_in(v, i)) < need[i])
            fd_fail(v, "operand %c (f%d) has %" PRId64 " elements, %" PRId64 " needed", "abv"[i], n -> in[i],
                    fuse_numel(fd_in(v, i)), need[i]);
    if ((n->nin == 3) != (m->epilogue == FE_BIAS || m->epilogue == FE_ADD))
        fd_fail(v, "a bias or addend operand without its epilogue, or the reverse");
    if (m->epilogue == FE_ADD && (n->dt != DT_F32 || m->ldc != m->n || (m->batch > 1 && m->stride_c != m->m * m->n)))
        fd_fail(v, "the add epilogue on a C that is not one contiguous f32 array");
}

static void fd_node(FusedVerify *v) {
    const FNode *n = v->n;
    switch (n->op) {
    case F_LEAF: {
        const Graph *g = v->fg->g;
        const GNode *gn = n->ia[0] >= 0 && n->ia[0] < g->n ? graph_node(g, (int)n->ia[0]) : NULL;
        if (!gn || (gn->op != G_PARAM && gn->op != G_INPUT)) fd_fail(v, "not a parameter or input of the graph");
        else if (gn->dt != n->dt || gn->rank != n->rank || memcmp(gn->shape, n->shape, sizeof(int64_t) * (size_t)n->rank))
            fd_fail(v, "not of %%%d's type", gn->id);
        break;
    }
    case F_RESHAPE:
    case F_PERMUTE:
    case F_EXPAND:
    case F_SLICE: fd_view(v); break;
    case F_MAP: fd_broadcast(v); break;
    case F_DROPOUT:
    case F_ROPE: fd_same_type(v, fd_in(v, 0), 1); break;
    case F_REDUCE: fd_reduce(v); break;
    case F_GEMM: fd_gemm_check(v); break;
    case F_LORA_S: /* the down product: a plain GEMM of contiguous rows, rank columns */
        fd_gemm_check(v);
        if (n->gemm.epilogue != FE_NONE || n->gemm.trans_a || n->gemm.ldc != n->gemm.n || n->gemm.n > FUSE_LORA_MAX_RANK ||
            n->dt != DT_F32)
            fd_fail(v, "not a plain f32 down product of contiguous rows and at most %d columns", FUSE_LORA_MAX_RANK);
        break;
    case F_LORA: { /* the up product of its F_LORA_S's rows, added to D */
        const FNode *d = fd_in(v, 0);
        fd_gemm_check(v);
        if (d->op != F_LORA_S) fd_fail(v, "f%d is not a down product (lora_down)", n->in[0]);
        else if (n->gemm.epilogue != FE_ADD || n->gemm.trans_a || n->gemm.k != d->gemm.n || n->gemm.m != d->gemm.m ||
                 n->gemm.batch != d->gemm.batch || n->gemm.lda != d->gemm.n)
            fd_fail(v, "not the up product of f%d's rows with the add epilogue", n->in[0]);
        break;
    }
    case F_GEMM_BGRAD:
        if (fd_in(v, 0)->op != F_GEMM) fd_fail(v, "f%d is not a GEMM", n->in[0]);
        else if (fuse_numel(n) != fd_in(v, 0)->gemm.n) fd_fail(v, "not n elements of GEMM f%d", n->in[0]);
        break;
    case F_CE_STATS: {
        const FNode *x = fd_in(v, 0), *t = fd_in(v, 1);
        int ok = x->rank == n->rank && n->shape[n->rank - 1] == 3 && dtype_is_float(x->dt) &&
                 n->dt == (x->dt == DT_F64 ? DT_F64 : DT_F32) && t->dt == DT_I32 && fuse_numel(t) * 3 == fuse_numel(n);
        for (int d = 0; ok && d + 1 < n->rank; d++) ok = x->shape[d] == n->shape[d];
        if (!ok) fd_fail(v, "not [..., 3] statistics of f%d's rows and f%d's targets", n->in[0], n->in[1]);
        break;
    }
    case F_CE_GRAD: { /* stats, logits [..., V], targets, dloss -> [..., W >= V] */
        const FNode *s = fd_in(v, 0), *x = fd_in(v, 1), *t = fd_in(v, 2), *d = fd_in(v, 3);
        int r = n->rank, ok = s->op == F_CE_STATS && s->in[0] == n->in[1] && s->in[1] == n->in[2] && x->rank == r &&
                              n->ia[0] == x->shape[r - 1] && n->shape[r - 1] >= n->ia[0] && dtype_is_float(n->dt) &&
                              dtype_is_float(x->dt) && fuse_numel(d) == 1 && t->dt == DT_I32;
        for (int i = 0; ok && i + 1 < r; i++) ok = x->shape[i] == n->shape[i];
        if (!ok) fd_fail(v, "not the gradient of f%d's rows from statistics f%d", n->in[1], n->in[0]);
        break;
    }
    case F_ATTN_STATS: { /* dout and o [..., T, E], lse [..., T, 2] -> [..., T, 3] */
        const FNode *d = fd_in(v, 0), *o = fd_in(v, 1), *l = fd_in(v, 2);
        int r = n->rank, ok = d->rank == r && o->rank == r && l->rank == r && n->shape[r - 1] == 3 && l->shape[r - 1] == 2 &&
                              d->dt == o->dt && l->dt == n->dt && d->shape[r - 1] == o->shape[r - 1];
        for (int i = 0; ok && i + 1 < r; i++)
            ok = d->shape[i] == n->shape[i] && o->shape[i] == n->shape[i] && l->shape[i] == n->shape[i];
        if (!ok) fd_fail(v, "not [..., 3] statistics of dout f%d, output f%d and f%d's [..., 2]", n->in[0], n->in[1], n->in[2]);
        break;
    }
    case F_CONCAT: {
        int64_t sum = 0, a = n->ia[0];
        if (a < 0 || a >= n->rank) {
            fd_fail(v, "axis %" PRId64 " outside rank %d", a, n->rank);
            break;
        }
        for (int i = 0; i < n->nin; i++) sum += fd_in(v, i)->rank == n->rank ? fd_in(v, i)->shape[a] : -1;
        if (sum != n->shape[a]) fd_fail(v, "the inputs' extents along axis %" PRId64 " do not add up", a);
        break;
    }
    default: break;
    }
}

/* Every graph node lowered to a node of its size and type; a folded matmul to a GEMM. */
static void fd_graph_map(FusedVerify *v) {
    const FusedGraph *fg = v->fg;
    const Graph *g = fg->g;
    v->n = NULL;
    for (int id = 0; id < g->n; id++) {
        const GNode *gn = graph_node(g, id);
        int f = fg->g2f[id], a = fg->absorbed[id];
        if (f >= fg->n || a >= fg->n) fd_fail(v, "%%%d maps to no node (f%d, f%d)", id, f, a);
        else if (f >= 0 && (fuse_numel(fg->node[f]) != graph_numel(gn) || fg->node[f]->dt != gn->dt))
            fd_fail(v, "%%%d (%s) is held by f%d, of another size or type", id, graph_op_name(gn->op), f);
        else if (a >= 0 && fg->node[a]->op != F_GEMM && fg->node[a]->op != F_LORA)
            fd_fail(v, "%%%d is folded into f%d, not a GEMM", id, a);
    }
    for (int i = 0; i < fg->noutputs; i++) {
        int id = fg->outputs[i];
        if (id < 0 || id >= g->n || fg->g2f[id] < 0) fd_fail(v, "output %%%d is not lowered", id);
    }
}

int fused_verify(const FusedGraph *fg, FILE *out) {
    FusedVerify v = {.fg = fg, .out = out};
    for (int f = 0; f < fg->n; f++) {
        const FNode *n = v.n = fg->node[f];
        int lo = 0, hi = 0;
        if (n->id != f) fd_fail(&v, "numbered %d", n->id);
        if (n->op < 0 || n->op >= F_OP_COUNT) {
            fd_fail(&v, "op %d", (int)n->op);
            continue;
        }
        fd_arity(n->op, &lo, &hi);
        if (n->nin < lo || n->nin > hi) fd_fail(&v, "%d inputs, %d to %d expected", n->nin, lo, hi);
        if (n->rank < 0 || n->rank > GRAPH_MAX_RANK) fd_fail(&v, "rank %d", n->rank);
        int ok = n->nin >= lo && n->nin <= hi && n->rank >= 0 && n->rank <= GRAPH_MAX_RANK;
        for (int d = 0; ok && d < n->rank; d++)
            if (n->shape[d] < 0) {
                fd_fail(&v, "axis %d of size %" PRId64, d, n->shape[d]);
                ok = 0;
            }
        for (int i = 0; ok && i < n->nin; i++)
            if (n->in[i] < 0 || n->in[i] >= f) {
                fd_fail(&v, "input %d is f%d, not an earlier node", i, n->in[i]);
                ok = 0;
            }
        if (ok) fd_node(&v);
    }
    fd_graph_map(&v);
    return v.problems;
}
