/* test_fuse.c - unit tests of fusion and the kernel IR (compiler/fuse*.c, kir.c, kir_ref.c).
 *
 * Build: make unit (links build/libmbtc.a). Prints `PASS name` / `FAIL name: why` per case, a
 * `# name: ...` line per fused graph (launches, buffers compared, the largest error), then
 * `N passed, M failed`. Run from the repository root (the programs under tests/ are read).
 *
 * What is checked:
 *   - the kernel IR: the builder folds index arithmetic and hash-conses, dead code goes, the
 *     verifier catches broken kernels, the printer's form, the interpreter's semantics;
 *   - kernel counts of typical blocks, asserted exactly: Linear + bias + GELU, residual add +
 *     layernorm, softmax, cross-entropy with its backward, an AdamW update over parameters of
 *     several shapes (built by hand with graph_add) and the update graph of a real program, a
 *     GPT-2 block forward and forward + backward (counts explained at the case);
 *   - GEMM resolution: transposes folded into trans flags, batched strides, M folded over a batch
 *     times a weight, K folded over a batch for a weight gradient, a partially broadcast batch;
 *   - fused == unfused: every buffer a schedule materialises, run by kir_ref (kernels instruction
 *     by instruction, GEMMs by a naive loop), against ref_run's value of the node it holds, for
 *     the hand-built graphs and for the step graph (after autodiff) and the update graph of every
 *     program in tests/golden and tests/fuse, on random parameters and inputs.
 * Tolerance: for each buffer, max |fused - unfused| / max |unfused| <= 1e-12 (normwise: a value
 * that cancels to near zero is measured against the tensor's scale). Both sides compute in
 * double; they differ only in the order of some sums (a GEMM folding K over a batch, a norm
 * without scaling), so the observed error is near 1e-16. */
#include "unit.h"

#include <math.h>
#include <stdint.h>

#include "autodiff.h"
#include "fuse.h"
#include "fuse_internal.h"
#include "kir.h"
#include "kir_ref.h"
#include "module.h"
#include "plan.h"
#include "ref.h"
#include "sema.h"

#define TF_TOL 1e-12
#define TF_MAX_NODES 8192

/* ---- graphs by hand --------------------------------------------------------------------------------- */

typedef struct TShape {
    int rank;
    int64_t d[GRAPH_MAX_RANK];
} TShape;

#define S(...) ((TShape){(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}})
#define S0 ((TShape){0, {0}})

typedef struct TF {
    Arena ar;
    Graph *g;
    uint64_t rng;
    uint32_t file;
    int np, ni;
    double **leaf; /* [TF_MAX_NODES] values of each leaf by id */
} TF;

static TF *tf_begin(uint64_t seed) {
    TF *t = calloc(1, sizeof(TF));
    if (!t) exit(1);
    t->g = graph_new(&t->ar);
    t->leaf = arena_alloc(&t->ar, sizeof(double *) * TF_MAX_NODES);
    t->rng = 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
    enum { LEN = 200 };
    char *text = arena_alloc(&t->ar, LEN + 1);
    memset(text, 'x', LEN);
    text[LEN - 1] = '\n';
    t->file = diag_add_source("hand.mbt", text, LEN);
    return t;
}

static void tf_end(TF *t) {
    arena_free(&t->ar);
    free(t);
}

static double tf_uniform(uint64_t *rng, double lo, double hi) {
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    uint64_t r = *rng * 2685821657736338717ull;
    return lo + (hi - lo) * ((double)(r >> 11) / 9007199254740992.0);
}

static GNode *tf_n(TF *t, int id) { return graph_node(t->g, id); }

static TShape tf_shape(TF *t, int id) {
    TShape s = {tf_n(t, id)->rank, {0}};
    memcpy(s.d, tf_n(t, id)->shape, sizeof s.d);
    return s;
}

static int tf_node(TF *t, GOp op, DType dt, TShape s, int nin, const int *in) {
    if (t->g->n >= TF_MAX_NODES - 1) {
        printf("FAIL %s: the graph has too many nodes\n", unit_case);
        exit(UNIT_EXIT_FAILED);
    }
    Span sp = {t->file, (uint32_t)(t->g->n % 150), 1, 1, (uint32_t)(t->g->n % 150) + 1};
    return graph_add(t->g, op, dt, s.rank, s.d, nin, in, sp);
}

static int tf_leaf(TF *t, GOp op, DType dt, TShape s, double lo, double hi) {
    int id = tf_node(t, op, dt, s, 0, NULL);
    GNode *n = tf_n(t, id);
    n->name = op == G_PARAM ? arena_printf(&t->ar, "p%d", t->np++) : arena_printf(&t->ar, "data.in%d", t->ni++);
    if (op == G_PARAM) n->iattr[0] = GI_NORMAL;
    int64_t k = graph_numel(n);
    t->leaf[id] = arena_alloc(&t->ar, sizeof(double) * (size_t)(k ? k : 1));
    for (int64_t i = 0; i < k; i++) {
        t->leaf[id][i] = tf_uniform(&t->rng, lo, hi);
        if (dt == DT_I32) t->leaf[id][i] = floor(t->leaf[id][i]);
    }
    return id;
}

static int tf_param(TF *t, TShape s) { return tf_leaf(t, G_PARAM, DT_F32, s, -1.0, 1.0); }
static int tf_input(TF *t, TShape s) { return tf_leaf(t, G_INPUT, DT_F32, s, -1.0, 1.0); }
static int tf_input_in(TF *t, TShape s, double lo, double hi) { return tf_leaf(t, G_INPUT, DT_F32, s, lo, hi); }
static int tf_index(TF *t, TShape s, int64_t n) { return tf_leaf(t, G_INPUT, DT_I32, s, 0.0, (double)n); }

static int tf_const(TF *t, double v) {
    int id = tf_node(t, G_CONST, DT_F32, S0, 0, NULL);
    tf_n(t, id)->fattr[0] = v;
    return id;
}

static int tf_un(TF *t, GOp op, int x) { return tf_node(t, op, tf_n(t, x)->dt, tf_shape(t, x), 1, &x); }

static int tf_bin(TF *t, GOp op, int a, int b) {
    TShape sa = tf_shape(t, a), sb = tf_shape(t, b), s;
    s.rank = sa.rank > sb.rank ? sa.rank : sb.rank;
    for (int i = 0; i < s.rank; i++) {
        int ia = i - (s.rank - sa.rank), ib = i - (s.rank - sb.rank);
        int64_t da = ia >= 0 ? sa.d[ia] : 1, db = ib >= 0 ? sb.d[ib] : 1;
        s.d[i] = da == 1 ? db : da;
    }
    int in[2] = {a, b};
    return tf_node(t, op, op >= G_EQ && op <= G_GE ? DT_BOOL : DT_F32, s, 2, in);
}

static int tf_matmul(TF *t, int a, int b) {
    TShape sa = tf_shape(t, a), sb = tf_shape(t, b), s = sa;
    s.d[s.rank - 1] = sb.d[sb.rank - 1];
    int in[2] = {a, b};
    return tf_node(t, G_MATMUL, DT_F32, s, 2, in);
}

static int tf_transpose(TF *t, int x, int i, int j) {
    TShape s = tf_shape(t, x);
    int64_t d = s.d[i];
    s.d[i] = s.d[j];
    s.d[j] = d;
    int id = tf_node(t, G_TRANSPOSE, DT_F32, s, 1, &x);
    tf_n(t, id)->iattr[0] = i;
    tf_n(t, id)->iattr[1] = j;
    return id;
}

static int tf_reshape(TF *t, int x, TShape s) { return tf_node(t, G_RESHAPE, tf_n(t, x)->dt, s, 1, &x); }

static int tf_slice(TF *t, int x, int axis, int64_t lo, int64_t hi) {
    TShape s = tf_shape(t, x);
    s.d[axis] = hi - lo;
    int id = tf_node(t, G_SLICE, DT_F32, s, 1, &x);
    tf_n(t, id)->iattr[0] = axis;
    tf_n(t, id)->iattr[1] = lo;
    tf_n(t, id)->iattr[2] = hi;
    return id;
}

static int tf_layernorm(TF *t, int x, int w, int b) {
    int in[3] = {x, w, b};
    int id = tf_node(t, G_LAYERNORM, DT_F32, tf_shape(t, x), 3, in);
    tf_n(t, id)->fattr[0] = 1e-5;
    return id;
}

static int tf_softmax(TF *t, int x, int axis) {
    int id = tf_node(t, G_SOFTMAX, DT_F32, tf_shape(t, x), 1, &x);
    tf_n(t, id)->iattr[0] = axis;
    return id;
}

static int tf_cross_entropy(TF *t, int logits, int targets) {
    int in[2] = {logits, targets};
    return tf_node(t, G_CROSS_ENTROPY, DT_F32, S0, 2, in);
}

static int tf_sum_all(TF *t, int x) {
    int id = tf_node(t, G_SUM, DT_F32, S0, 1, &x);
    tf_n(t, id)->iattr[0] = -1;
    return id;
}

/* x @ w + b */
static int tf_linear(TF *t, int x, int w, int b) { return tf_bin(t, G_ADD, tf_matmul(t, x, w), b); }

/* A GPT-2 block on x [B, T, d] (nn.GPT2Block with `heads` heads), as the graph builder makes it. */
static int tf_gpt2_block(TF *t, int x, int64_t heads) {
    TShape sx = tf_shape(t, x);
    int64_t B = sx.d[0], T = sx.d[1], d = sx.d[2], hd = d / heads;
    int ln1w = tf_param(t, S(d)), ln1b = tf_param(t, S(d));
    int wa = tf_param(t, S(d, 3 * d)), ba = tf_param(t, S(3 * d));
    int wp = tf_param(t, S(d, d)), bp = tf_param(t, S(d));
    int ln2w = tf_param(t, S(d)), ln2b = tf_param(t, S(d));
    int wf = tf_param(t, S(d, 4 * d)), bf = tf_param(t, S(4 * d));
    int wo = tf_param(t, S(4 * d, d)), bo = tf_param(t, S(d));
    int qkv = tf_linear(t, tf_layernorm(t, x, ln1w, ln1b), wa, ba);
    int heads_of[3];
    for (int i = 0; i < 3; i++) {
        int part = tf_slice(t, qkv, 2, i * d, (i + 1) * d);
        heads_of[i] = tf_transpose(t, tf_reshape(t, part, S(B, T, heads, hd)), 1, 2);
    }
    int att = tf_node(t, G_ATTENTION, DT_F32, S(B, heads, T, hd), 3, heads_of);
    tf_n(t, att)->iattr[0] = 1;
    tf_n(t, att)->fattr[0] = 1.0 / sqrt((double)hd);
    int y = tf_reshape(t, tf_transpose(t, att, 1, 2), S(B, T, d));
    int x1 = tf_bin(t, G_ADD, x, tf_linear(t, y, wp, bp));
    int h = tf_un(t, G_GELU, tf_linear(t, tf_layernorm(t, x1, ln2w, ln2b), wf, bf));
    return tf_bin(t, G_ADD, x1, tf_linear(t, h, wo, bo));
}

/* loss = sum(out * R), R a random input of out's shape. */
static int tf_weighted_loss(TF *t, int out) {
    int r = tf_input(t, tf_shape(t, out));
    t->g->loss = tf_sum_all(t, tf_bin(t, G_MUL, out, r));
    return t->g->loss;
}

/* ---- fused == unfused ------------------------------------------------------------------------------ */

typedef struct Fused {
    FuseResult *r;
    int gemms, kernels;
    int compared, overwritten;
    double err;
} Fused;

/* max |a - b| / max |b| over n values; equal NaNs and equal infinities agree, a mismatch of
 * either is an infinite error. */
static double rel_error(const double *a, const double *b, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(b[i]) && fabs(b[i]) > scale) scale = fabs(b[i]);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]) || isinf(a[i]) || isinf(b[i])) {
            if (!((isnan(a[i]) && isnan(b[i])) || a[i] == b[i])) return INFINITY;
            continue;
        }
        double e = fabs(a[i] - b[i]);
        if (e > worst) worst = e;
    }
    return scale > 0 ? worst / scale : worst;
}

/* Whether launch li of r computes graph node id. */
static int launch_computes(const FuseResult *r, int li, int id) {
    const FuseLaunch *L = &r->launches[li];
    for (int i = 0; i < L->nnodes; i++)
        if (L->nodes[i] == id) return 1;
    return 0;
}

/* Fuses g (for outputs, or the default ones) in its two stages, the fused IR (verified) and the
 * launches (verified), runs it with kir_ref and
 * compares every materialised buffer of a graph node with ref_run's value. */
static Fused fuse_check(const char *what, const Graph *g, double *const *leaves, const int *outputs, int noutputs, Arena *ar) {
    Fused f = {0};
    capture_begin();
    FusedGraph *fg = fuse_lower_graph(g, outputs, noutputs, ar);
    char *vt = NULL;
    size_t vl = 0;
    FILE *m = open_memstream(&vt, &vl);
    int fproblems = fused_verify(fg, m);
    fclose(m);
    CHECK(fproblems == 0, "%s: fused_verify found %d problems", what, fproblems);
    if (fproblems) unit_detail("problems", vt);
    free(vt);
    f.r = fuse_codegen(fg, ar);
    const char *msg = capture_end();
    CHECK(!*msg, "%s: fusion printed", what);
    if (*msg) unit_detail("stderr", msg);
    vt = NULL;
    m = open_memstream(&vt, &vl);
    int problems = fuse_verify(f.r, m);
    fclose(m);
    CHECK(problems == 0, "%s: fuse_verify found %d problems", what, problems);
    if (problems) unit_detail("problems", vt);
    free(vt);
    fuse_counts(f.r, &f.gemms, &f.kernels);
    for (int i = 0; i < f.r->noutputs; i++)
        CHECK(f.r->node_buffer[f.r->outputs[i]] >= 0, "%s: output %%%d has no buffer", what, f.r->outputs[i]);
    capture_begin();
    double **ref = ref_run(g, leaves, ar);
    double **fused = ref ? kir_ref_schedule(f.r, leaves, ar) : NULL;
    msg = capture_end();
    CHECK(ref != NULL, "%s: ref_run failed", what);
    CHECK(!ref || fused != NULL, "%s: kir_ref_schedule failed", what);
    if (!ref || !fused) {
        unit_detail("stderr", msg);
        return f;
    }
    for (int id = 0; id < g->n; id++) {
        int b = f.r->node_buffer[id];
        const GNode *n = g->node[id];
        if (b < 0 || n->op == G_PARAM || n->op == G_INPUT) continue;
        CHECK(f.r->buffers[b].bytes > 0, "%s: buffer b%d of %%%d is empty", what, b, id);
        if (f.r->buffers[b].over >= 0 && !launch_computes(f.r, f.r->buffers[b].over, id)) {
            f.overwritten++; /* the classifier's logits: the gradient is there at the end (compared) */
            continue;
        }
        double e = rel_error(fused[b], ref[id], graph_numel(n));
        f.compared++;
        if (e > f.err || isnan(e)) f.err = e;
        CHECK(e <= TF_TOL, "%s: %%%d (%s) in b%d differs from the unfused graph by %.3g", what, id, graph_op_name(n->op), b, e);
    }
    printf("# %s: %d launches (%d gemm, %d kernels), %d buffers compared, max relative error %.2g%s\n", what, f.r->nlaunches,
           f.gemms, f.kernels, f.compared, f.err, f.overwritten ? " (logits overwritten by their gradient, not compared)" : "");
    return f;
}

/* The launches of r that read buffer b. */
static int readers_of(const FuseResult *r, int b) {
    int n = 0;
    for (int i = 0; i < r->nlaunches; i++) {
        const FuseLaunch *L = &r->launches[i];
        if (L->kind == FL_GEMM) {
            n += L->gemm.a == b || L->gemm.b == b;
            continue;
        }
        const Kernel *k = r->kernels[L->kernel];
        int reads = 0;
        for (int p = 0; p < k->nbufs; p++) reads |= k->bufs[p].buffer == b && !k->bufs[p].written;
        n += reads;
    }
    return n;
}

/* The first GEMM launch of r. */
static const FuseGemm *first_gemm(const FuseResult *r) {
    for (int i = 0; i < r->nlaunches; i++)
        if (r->launches[i].kind == FL_GEMM) return &r->launches[i].gemm;
    return NULL;
}

/* ---- the kernel IR ------------------------------------------------------------------------------- */

static void test_kir_builder_folds(void) {
    Arena ar = {0};
    Kernel *k = kir_new(&ar, "k_fold", KK_ELEMENTWISE, 24);
    KBuilder *b = kb_new(&ar, k);
    int64_t shape[1] = {24};
    int in = kb_buf(b, 0, 0, -1, DT_F32, 1, shape, 0), out = kb_buf(b, 1, 1, -1, DT_F32, 1, shape, 1);
    int gid = kb_gid(b);
    int c4 = kb_const_i(b, KT_I64, 4);
    CHECK(kb_op(b, K_ADD, KT_I64, 2, gid, kb_const_i(b, KT_I64, 0), -1) == gid, "x + 0 is x");
    CHECK(kb_op(b, K_MUL, KT_I64, 2, kb_const_i(b, KT_I64, 1), gid, -1) == gid, "1 * x is x");
    int64_t v;
    CHECK(kb_is_const(b, kb_op(b, K_MUL, KT_I64, 2, kb_const_i(b, KT_I64, 6), kb_const_i(b, KT_I64, 7), -1), &v) && v == 42,
          "6 * 7 folds to 42");
    int q = kb_op(b, K_IDIV, KT_I64, 2, gid, c4, -1), r = kb_op(b, K_IMOD, KT_I64, 2, gid, c4, -1);
    CHECK(kb_op(b, K_IDIV, KT_I64, 2, gid, c4, -1) == q, "the same division is hash-consed");
    int back = kb_op(b, K_ADD, KT_I64, 2, kb_op(b, K_MUL, KT_I64, 2, q, c4, -1), r, -1);
    CHECK(back == gid, "(x idiv 4) * 4 + x imod 4 folds to x");
    int x = kb_load(b, in, back);
    CHECK(kb_load(b, in, gid) == x, "loads of a read-only buffer are hash-consed");
    int f1 = kb_const_f(b, KT_F32, 1.0);
    CHECK(kb_op(b, K_MUL, KT_F32, 2, x, f1, -1) == x, "x * 1.0 is x");
    int dead = kb_op(b, K_EXP, KT_F32, 1, x, -1, -1);
    (void)dead;
    kb_store(b, out, gid, kb_op(b, K_NEG, KT_F32, 1, x, -1, -1));
    int before = k->n;
    kir_finish(k);
    CHECK(k->n < before, "dead code is removed (%d -> %d instructions)", before, k->n);
    for (int i = 0; i < k->n; i++) CHECK(k->inst[i].op != K_EXP, "the unused exp is gone");
    CHECK(kir_verify(k, stdout) == 0, "the kernel verifies");
    arena_free(&ar);
}

/* A row sum: acc, loop, accum, a division after the loop; printed and interpreted. */
static Kernel *row_mean_kernel(Arena *ar) {
    Kernel *k = kir_new(ar, "k_mean", KK_ROW, 2);
    KBuilder *b = kb_new(ar, k);
    int64_t s_in[2] = {2, 3}, s_out[1] = {2};
    int in = kb_buf(b, 0, 0, -1, DT_F32, 2, s_in, 0), out = kb_buf(b, 1, 1, -1, DT_F32, 1, s_out, 1);
    int gid = kb_gid(b);
    int acc = kb_acc(b, KT_F32, K_ADD, 0.0);
    int j = kb_loop(b, 3);
    int off = kb_op(b, K_ADD, KT_I64, 2, kb_op(b, K_MUL, KT_I64, 2, gid, kb_const_i(b, KT_I64, 3), -1), j, -1);
    kb_accum(b, acc, kb_load(b, in, off));
    kb_endloop(b);
    kb_store(b, out, gid, kb_op(b, K_DIV, KT_F32, 2, acc, kb_const_f(b, KT_F32, 3.0), -1));
    kir_finish(k);
    return k;
}

static void test_kir_print_and_run(void) {
    Arena ar = {0};
    Kernel *k = row_mean_kernel(&ar);
    CHECK(kir_verify(k, stdout) == 0, "the kernel verifies");
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    kir_print_body(m, k, 0);
    fclose(m);
    CHECK_STR(text,
              "%0 = gid : i64\n"
              "%1 = acc add 0.0 : f32\n"
              "%2 = loop 3 {\n"
              "  %4 = mul %0, 3 : i64\n"
              "  %5 = add %4, %2 : i64\n"
              "  %6 = load p0[%5] : f32\n"
              "  %1 += %6\n"
              "}\n"
              "%10 = div %1, 3.0 : f32\n"
              "store p1[%0] = %10\n",
              "the printed body");
    free(text);
    double in[6] = {1, 2, 3, 4, 5, 9}, out[2] = {0, 0};
    double *bufs[2] = {in, out};
    CHECK(kir_ref_kernel(k, bufs) == 0, "kir_ref runs it");
    CHECK(out[0] == 2.0 && out[1] == 6.0, "row means 2 and 6, got %g and %g", out[0], out[1]);
    arena_free(&ar);
}

static void test_kir_verify_catches(void) {
    Arena ar = {0};
    Kernel *k = row_mean_kernel(&ar);
    /* an operand used after its loop closed */
    int loopvar = -1;
    for (int i = 0; i < k->n; i++)
        if (k->inst[i].op == K_LOOP) loopvar = i;
    KInst bad = {.op = K_ADD, .type = KT_I64, .nin = 2, .a = {loopvar, loopvar, -1}};
    KInst *ni = arena_alloc(&ar, sizeof(KInst) * (size_t)(k->n + 1));
    memcpy(ni, k->inst, sizeof(KInst) * (size_t)k->n);
    ni[k->n] = bad;
    k->inst = ni;
    k->n++;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    int n = kir_verify(k, m);
    fclose(m);
    CHECK(n > 0 && strstr(text, "out of scope"), "a loop counter used after the loop is caught");
    free(text);
    /* a store to a buffer not marked written, a load of the wrong type */
    Kernel *k2 = row_mean_kernel(&ar);
    k2->bufs[1].written = 0;
    k2->bufs[0].dt = DT_I32;
    text = NULL;
    m = open_memstream(&text, &len);
    n = kir_verify(k2, m);
    fclose(m);
    CHECK(n >= 2 && strstr(text, "read-only") && strstr(text, "load of f32 from a i32 buffer"),
          "a store to a read-only buffer and a mistyped load are caught");
    if (text && !(strstr(text, "read-only") && strstr(text, "load of f32"))) unit_detail("got", text);
    free(text);
    arena_free(&ar);
}

/* NumPy's remainder, NaN-propagating max, an if, a dynamic loop, a u64 hash step. */
static void test_kir_ref_semantics(void) {
    Arena ar = {0};
    Kernel *k = kir_new(&ar, "k_sem", KK_ELEMENTWISE, 1);
    KBuilder *b = kb_new(&ar, k);
    int64_t s6[1] = {6};
    int out = kb_buf(b, 0, 0, -1, DT_F32, 1, s6, 1);
    kb_gid(b);
    int a = kb_const_f(b, KT_F32, -7.0), c3 = kb_const_f(b, KT_F32, 3.0);
    kb_store(b, out, kb_const_i(b, KT_I64, 0), kb_op(b, K_MOD, KT_F32, 2, a, c3, -1));
    kb_store(b, out, kb_const_i(b, KT_I64, 1), kb_op(b, K_MAX, KT_F32, 2, kb_const_f(b, KT_F32, NAN), c3, -1));
    int sum = kb_acc(b, KT_I64, K_ADD, 0);
    int j = kb_loop_dyn(b, kb_op(b, K_ADD, KT_I64, 2, kb_gid(b), kb_const_i(b, KT_I64, 0), -1)); /* extent 0 */
    kb_accum(b, sum, j);
    kb_endloop(b);
    int j2 = kb_loop(b, 4);
    kb_if(b, kb_op(b, K_LT, KT_BOOL, 2, j2, kb_const_i(b, KT_I64, 2), -1));
    kb_accum(b, sum, j2);
    kb_endif(b);
    kb_endloop(b);
    kb_store(b, out, kb_const_i(b, KT_I64, 2), kb_op(b, K_CAST, KT_F32, 1, sum, -1, -1));
    int h = kb_op(b, K_SHR, KT_U64, 2, kb_const_i(b, KT_U64, (int64_t)0xF000000000000000ull), kb_const_i(b, KT_U64, 60), -1);
    kb_store(b, out, kb_const_i(b, KT_I64, 3), kb_op(b, K_CAST, KT_F32, 1, h, -1, -1));
    kb_store(b, out, kb_const_i(b, KT_I64, 4),
             kb_op(b, K_CAST, KT_F32, 1, kb_op(b, K_CAST, KT_I32, 1, kb_const_f(b, KT_F32, -2.7), -1, -1), -1, -1));
    kb_store(b, out, kb_const_i(b, KT_I64, 5),
             kb_op(b, K_MOD, KT_F32, 2, kb_const_f(b, KT_F32, 7.0), kb_const_f(b, KT_F32, -3.0), -1));
    kir_finish(k);
    CHECK(kir_verify(k, stdout) == 0, "the kernel verifies");
    double o[6] = {0};
    double *bufs[1] = {o};
    CHECK(kir_ref_kernel(k, bufs) == 0, "kir_ref runs it");
    CHECK(o[0] == 2.0, "-7 mod 3 is 2 (the divisor's sign), got %g", o[0]);
    CHECK(isnan(o[1]), "max(NaN, 3) is NaN, got %g", o[1]);
    CHECK(o[2] == 1.0, "an empty dynamic loop and an if inside a loop sum to 0 + 1, got %g", o[2]);
    CHECK(o[3] == 15.0, "u64 shift right, got %g", o[3]);
    CHECK(o[4] == -2.0, "float -> i32 truncates, got %g", o[4]);
    CHECK(o[5] == -2.0, "7 mod -3 is -2, got %g", o[5]);
    /* a store outside its buffer is reported, not performed */
    Kernel *k2 = kir_new(&ar, "k_oob", KK_ELEMENTWISE, 7);
    KBuilder *b2 = kb_new(&ar, k2);
    int o2 = kb_buf(b2, 0, 0, -1, DT_F32, 1, s6, 1);
    kb_store(b2, o2, kb_gid(b2), kb_const_f(b2, KT_F32, 1.0));
    kir_finish(k2);
    capture_begin();
    int rc = kir_ref_kernel(k2, bufs);
    const char *msg = capture_end();
    CHECK(rc == -1 && strstr(msg, "outside p0"), "an out-of-range store is reported");
    arena_free(&ar);
}

/* ---- the fused IR ------------------------------------------------------------------------------------ */

/* fused_print's text for fg, in ar. */
static const char *fused_text(const FusedGraph *fg) {
    char *t = NULL;
    size_t l = 0;
    FILE *m = open_memstream(&t, &l);
    fused_print(m, fg);
    fclose(m);
    return t;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Linear + bias + GELU as the fused IR: a GEMM with the bias epilogue, the matmul it absorbed
 * left unused, gelu's maps; one line a node between the header and the trailer. */
static void test_fused_print(void) {
    TF *t = tf_begin(1);
    int x = tf_input(t, S(2, 4, 8)), w = tf_param(t, S(8, 16)), b = tf_param(t, S(16));
    int y = tf_un(t, G_GELU, tf_linear(t, x, w, b));
    FusedGraph *fg = fuse_lower_graph(t->g, &y, 1, &t->ar);
    CHECK(fused_verify(fg, stdout) == 0, "the fused IR verifies");
    char *text = (char *)fused_text(fg);
    CHECK(strncmp(text, "# fused", 7) == 0, "a header line first");
    CHECK(strstr(text, "f0 = leaf input") != NULL, "the input is leaf f0");
    CHECK(strstr(text, "= gemm f0, f1, f2 m=8 n=16 k=8 ld=8,16,16 +bias : f32[2, 4, 16]") != NULL,
          "the GEMM folds the batch into m and adds the bias");
    CHECK(strstr(text, "(unused)") != NULL, "the plain product the bias GEMM replaced is marked unused");
    CHECK(strstr(text, "map tanh") != NULL, "gelu's tanh is a map");
    CHECK(strstr(text, "matmul folded into f") != NULL, "the folded matmul is listed");
    CHECK(strstr(text, "# out %") != NULL, "the output's node is listed");
    CHECK(count_lines(text) == 1 + fg->n + 1 + 1, "header, %d nodes, one fold, one output: %d lines", fg->n, count_lines(text));
    if (unit_case_failures) unit_detail("fused", text);
    free(text);
    tf_end(t);
}

/* A fresh fused IR of a softmax over a GEMM, broken by corrupt, must fail fused_verify with a
 * message naming `want`. */
static void fused_breaks(const char *what, void (*corrupt)(FusedGraph *), const char *want) {
    TF *t = tf_begin(5);
    int x = tf_input(t, S(4, 8)), w = tf_param(t, S(8, 6));
    int y = tf_softmax(t, tf_matmul(t, x, w), 1);
    FusedGraph *fg = fuse_lower_graph(t->g, &y, 1, &t->ar);
    CHECK(fused_verify(fg, NULL) == 0, "%s: verifies before it is broken", what);
    corrupt(fg);
    char *msg = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&msg, &len);
    int problems = fused_verify(fg, m);
    fclose(m);
    CHECK(problems > 0, "%s: fused_verify finds it", what);
    CHECK(strstr(msg, "fused: f") && strstr(msg, want), "%s: the message says '%s': %s", what, want, msg);
    free(msg);
    tf_end(t);
}

static FNode *fused_first(FusedGraph *fg, FOp op) {
    for (int f = 0; f < fg->n; f++)
        if (fg->node[f]->op == op) return fg->node[f];
    return fg->node[0];
}

static void break_map_shape(FusedGraph *fg) { fused_first(fg, F_MAP)->shape[0] = 3; }
static void break_reduce_axes(FusedGraph *fg) { fused_first(fg, F_REDUCE)->ia[0] = 1u << 5; }
static void break_forward_input(FusedGraph *fg) { fused_first(fg, F_MAP)->in[0] = fg->n - 1; }
static void break_gemm_k(FusedGraph *fg) { fused_first(fg, F_GEMM)->gemm.k = 9; }
static void break_leaf(FusedGraph *fg) { fused_first(fg, F_LEAF)->dt = DT_F64; }

static void test_fused_verify_catches(void) {
    fused_breaks("a map of the wrong shape", break_map_shape, "does not broadcast");
    fused_breaks("a reduction over an axis it lacks", break_reduce_axes, "axes outside");
    fused_breaks("an input defined later", break_forward_input, "not an earlier node");
    fused_breaks("a GEMM reading past its operand", break_gemm_k, "elements,");
    fused_breaks("a leaf of another type", break_leaf, "type");
}

/* ---- kernel counts of typical blocks ------------------------------------------------------------- */

/* Linear + bias + GELU: the GEMM, then one elementwise kernel (bias add and gelu). */
static void test_count_linear_bias_gelu(void) {
    TF *t = tf_begin(1);
    int x = tf_input(t, S(2, 4, 8)), w = tf_param(t, S(8, 16)), b = tf_param(t, S(16));
    int y = tf_un(t, G_GELU, tf_linear(t, x, w, b));
    Fused f = fuse_check("linear_bias_gelu", t->g, t->leaf, &y, 1, &t->ar);
    CHECK(f.gemms == 1 && f.kernels == 1, "Linear + bias + GELU: 1 GEMM + 1 kernel, got %d + %d", f.gemms, f.kernels);
    const FuseGemm *m = first_gemm(f.r);
    CHECK(m && m->m == 8 && m->n == 16 && m->k == 8 && m->batch == 1, "one GEMM over batch x rows (m = 8)");
    CHECK(f.r->nbuffers == 5, "buffers: x, w, b, the GEMM's result and y (%d)", f.r->nbuffers);
    tf_end(t);
}

/* Residual add + layernorm: one row kernel storing both the sum (the next residual) and the norm. */
static void test_count_residual_layernorm(void) {
    TF *t = tf_begin(2);
    int a = tf_input(t, S(2, 4, 8)), b = tf_input(t, S(2, 4, 8));
    int w = tf_param(t, S(8)), bias = tf_param(t, S(8));
    int s = tf_bin(t, G_ADD, a, b);
    int y = tf_layernorm(t, s, w, bias);
    int outs[2] = {s, y};
    Fused f = fuse_check("residual_layernorm", t->g, t->leaf, outs, 2, &t->ar);
    CHECK(f.gemms == 0 && f.kernels == 1, "residual add + layernorm: 1 kernel, got %d + %d", f.gemms, f.kernels);
    CHECK(f.kernels == 1 && f.r->kernels[0]->kind == KK_ROW && f.r->kernels[0]->grid == 8, "one row kernel, a row per work item");
    Fused g = fuse_check("layernorm_only", t->g, t->leaf, &y, 1, &t->ar);
    CHECK(g.kernels == 1 && g.r->nbuffers == 5, "without the sum as an output: 1 kernel and no buffer for the sum");
    tf_end(t);
}

/* Softmax over the last axis: one row kernel (max, sum of exp, divide). */
static void test_count_softmax(void) {
    TF *t = tf_begin(3);
    int x = tf_input(t, S(2, 3, 5, 7));
    int y = tf_softmax(t, x, 3);
    Fused f = fuse_check("softmax", t->g, t->leaf, &y, 1, &t->ar);
    CHECK(f.gemms == 0 && f.kernels == 1, "softmax: 1 kernel, got %d + %d", f.gemms, f.kernels);
    /* over a middle axis the rows are strided: the statistics (max, sum) in one kernel, the
     * elementwise divide in another (a strided reduction stores only per-row values) */
    int z = tf_softmax(t, x, 1);
    Fused g = fuse_check("softmax_axis1", t->g, t->leaf, &z, 1, &t->ar);
    CHECK(g.kernels == 2 && g.r->kernels[0]->kind == KK_REDUCE && g.r->kernels[1]->kind == KK_ELEMENTWISE,
          "softmax over axis 1: a reduction and an elementwise kernel, got %d kernels", g.kernels);
    tf_end(t);
}

/* Cross-entropy with its backward: the classifier kernel (a row kernel computing the row statistics
 * - max, sum of exp and the target's logit, Kernel.ce, whose logits a GPU reads once for them - and
 * the logits' gradient, Kernel.ce's grad) and the mean of the row losses (one work item: the sum
 * over rows in a fixed order, no atomics, each row's loss from the statistics alone). The logits
 * here are a parameter, which is never overwritten: the gradient has a buffer of its own. With
 * --no-ce-fusion (fuse_ce_fused = 0) the gradient is an elementwise kernel of its own again. */
static void test_count_cross_entropy(void) {
    TF *t = tf_begin(4);
    int logits = tf_param(t, S(2, 4, 10)), y = tf_index(t, S(2, 4), 10);
    t->g->loss = tf_cross_entropy(t, logits, y);
    autodiff(t->g);
    Fused f = fuse_check("cross_entropy_fwd_bwd", t->g, t->leaf, NULL, 0, &t->ar);
    CHECK(f.gemms == 0 && f.kernels == 2, "cross-entropy forward + backward: 2 kernels, got %d + %d", f.gemms, f.kernels);
    int b = f.r->node_buffer[logits];
    CHECK(readers_of(f.r, b) == 1, "the classifier kernel alone reads the logits, %d launches do", readers_of(f.r, b));
    const KCeStats *ce = f.kernels == 2 ? f.r->kernels[0]->ce : NULL;
    CHECK(f.kernels == 2 && f.r->kernels[0]->kind == KK_ROW && ce && ce->V == 10 && ce->rows == 8 && ce->grad >= 0 &&
              ce->gW == 10 && ce->grad != ce->in && ce->N == 8 && ce->dloss == 1.0,
          "the classifier first: a row kernel with its logits resolved (8 rows of 10) and its gradient (a buffer of its own)");
    CHECK(f.kernels == 2 && f.r->kernels[1]->grid == 1, "then the mean (one work item)");
    fuse_ce_fused = 0;
    Fused u = fuse_check("cross_entropy_fwd_bwd unfused", t->g, t->leaf, NULL, 0, &t->ar);
    fuse_ce_fused = 1;
    CHECK(u.kernels == 3 && u.r->kernels[0]->ce && u.r->kernels[0]->ce->grad < 0 && u.r->kernels[2]->kind == KK_ELEMENTWISE &&
              u.r->kernels[2]->grid == 80,
          "--no-ce-fusion: the statistics alone, the mean, and the gradient elementwise (80 items)");
    tf_end(t);
}

/* The classifier kernel in place: logits computed by a GEMM (x @ w) whose last reader it is get the
 * gradient written over them - one buffer for both, the GEMMs of the backward reading it - and the
 * gradient equals the unfused graph's (fuse_check compares every buffer, the logits' excepted, which
 * hold the gradient at the end). Then the fall-backs: the logits asked for (an output), or read
 * by a launch after the classifier (the backward of a second loss term over them), keep them: the
 * gradient gets a buffer of its own. And the control: the classifier kernel's division by N
 * corrupted (x 1.5) must differ from the unfused graph. */
static void test_cross_entropy_inplace(void) {
    TF *t = tf_begin(6);
    int x = tf_input(t, S(2, 4, 6)), w = tf_param(t, S(6, 10)), y = tf_index(t, S(2, 4), 10);
    int logits = tf_matmul(t, x, w);
    t->g->loss = tf_cross_entropy(t, logits, y);
    autodiff(t->g);
    Fused f = fuse_check("cross_entropy in place", t->g, t->leaf, NULL, 0, &t->ar);
    int b = f.r->node_buffer[logits];
    const KCeStats *ce = NULL;
    for (int i = 0; i < f.r->nkernels; i++)
        if (f.r->kernels[i]->ce) ce = f.r->kernels[i]->ce;
    CHECK(b >= 0 && f.r->buffers[b].over >= 0 && ce && ce->grad == ce->in && f.overwritten == 1,
          "the gradient is written over the logits (one buffer, one kernel parameter)");
    CHECK(f.compared > 0 && f.err <= TF_TOL, "every other buffer as the unfused graph (%d compared)", f.compared);

    /* the logits an output: kept */
    int outs[3] = {t->g->loss, logits, t->g->grads[0]};
    Fused o = fuse_check("cross_entropy logits asked for", t->g, t->leaf, outs, 3, &t->ar);
    int ob = o.r->node_buffer[logits];
    CHECK(ob >= 0 && o.r->buffers[ob].over < 0 && o.overwritten == 0, "logits asked for: not overwritten");

    /* the control: the fused kernel's 1/N corrupted */
    int broken = 0;
    for (int i = 0; i < f.r->nkernels; i++) {
        Kernel *k = f.r->kernels[i];
        if (!k->ce) continue;
        for (int j = 0; j < k->n; j++)
            if (k->inst[j].op == K_CONST && k->inst[j].f == 8.0 && kir_type_is_float(k->inst[j].type)) {
                k->inst[j].f = 12.0;
                broken++;
            }
    }
    capture_begin();
    double **ref = ref_run(t->g, t->leaf, &t->ar);
    double **bad = ref ? kir_ref_schedule(f.r, t->leaf, &t->ar) : NULL;
    capture_end();
    double worst = 0;
    for (int i = 0; bad && i < t->g->nparams; i++) {
        int gid = t->g->grads[i], gb = gid >= 0 ? f.r->node_buffer[gid] : -1;
        if (gb < 0) continue;
        double e = rel_error(bad[gb], ref[gid], graph_numel(t->g->node[gid]));
        if (e > worst || isnan(e)) worst = e;
    }
    CHECK(broken >= 1 && worst > 1e-3, "control: the classifier kernel dividing by 12 for 8 differs (max relative error %.3g)",
          worst);
    printf("# cross_entropy control: N = 12 for 8 in the classifier kernel, the weight gradient's max relative error %.3g\n",
           worst);
    tf_end(t);

    /* a second loss term over the logits, read by a launch after the classifier: kept */
    t = tf_begin(7);
    x = tf_input(t, S(2, 4, 6));
    w = tf_param(t, S(6, 10));
    y = tf_index(t, S(2, 4), 10);
    logits = tf_matmul(t, x, w);
    int sq = tf_bin(t, G_MUL, logits, logits);
    t->g->loss = tf_bin(t, G_ADD, tf_cross_entropy(t, logits, y), tf_sum_all(t, sq));
    autodiff(t->g);
    Fused s2 = fuse_check("cross_entropy logits read later", t->g, t->leaf, NULL, 0, &t->ar);
    int sb = s2.r->node_buffer[logits];
    CHECK(sb >= 0 && s2.r->buffers[sb].over < 0 && s2.overwritten == 0, "logits read after the classifier: not overwritten");
    tf_end(t);

    /* the same cross-entropy twice, two graph nodes (ce + 2 ce'): two classifier kernels (their
     * seeds differ) read one statistics node, which then is a kernel of its own that both load */
    t = tf_begin(8);
    x = tf_input(t, S(2, 4, 6));
    w = tf_param(t, S(6, 10));
    y = tf_index(t, S(2, 4), 10);
    logits = tf_matmul(t, x, w);
    int l1 = tf_cross_entropy(t, logits, y), l2 = tf_cross_entropy(t, logits, y);
    t->g->loss = tf_bin(t, G_ADD, l1, tf_bin(t, G_MUL, tf_const(t, 2.0), l2));
    autodiff(t->g);
    Fused two = fuse_check("cross_entropy twice", t->g, t->leaf, NULL, 0, &t->ar);
    int bwd = 0;
    for (int li = 0; li < two.r->nlaunches; li++)
        for (int i = 0; i < two.r->launches[li].nnodes; i++)
            bwd += t->g->node[two.r->launches[li].nodes[i]]->op == G_CROSS_ENTROPY_BWD;
    CHECK(two.compared > 0 && two.err <= TF_TOL && bwd == 2,
          "two classifier kernels over one statistics node: as the unfused graph (%d launches compute a backward)", bwd);
    tf_end(t);
}

/* AdamW written out per parameter with graph_add, three parameters of different shapes: a purely
 * elementwise graph, one kernel with a segment per shape. */
static void test_count_adamw_by_hand(void) {
    TF *t = tf_begin(5);
    TShape shapes[3] = {S(4, 8), S(8), S(3, 5, 2)};
    int lr = tf_input_in(t, S0, 0.001, 0.01), step = tf_input_in(t, S0, 1.0, 5.0);
    int outs[9], no = 0;
    double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    for (int i = 0; i < 3; i++) {
        int p = tf_param(t, shapes[i]), g = tf_input(t, shapes[i]);
        int m = tf_input(t, shapes[i]), v = tf_input_in(t, shapes[i], 0.01, 1.0);
        int p1 = tf_bin(t, G_SUB, p, tf_bin(t, G_MUL, tf_bin(t, G_MUL, lr, tf_const(t, wd)), p));
        int m1 = tf_bin(t, G_ADD, tf_bin(t, G_MUL, tf_const(t, b1), m), tf_bin(t, G_MUL, tf_const(t, 1 - b1), g));
        int v1 =
            tf_bin(t, G_ADD, tf_bin(t, G_MUL, tf_const(t, b2), v), tf_bin(t, G_MUL, tf_bin(t, G_MUL, tf_const(t, 1 - b2), g), g));
        int c1 = tf_bin(t, G_SUB, tf_const(t, 1.0), tf_bin(t, G_POW, tf_const(t, b1), step));
        int c2 = tf_bin(t, G_SUB, tf_const(t, 1.0), tf_bin(t, G_POW, tf_const(t, b2), step));
        int mh = tf_bin(t, G_DIV, m1, c1), vh = tf_bin(t, G_DIV, v1, c2);
        int upd = tf_bin(t, G_DIV, tf_bin(t, G_MUL, lr, mh), tf_bin(t, G_ADD, tf_un(t, G_SQRT, vh), tf_const(t, eps)));
        outs[no++] = tf_bin(t, G_SUB, p1, upd);
        outs[no++] = m1;
        outs[no++] = v1;
    }
    Fused f = fuse_check("adamw_by_hand", t->g, t->leaf, outs, no, &t->ar);
    CHECK(f.gemms == 0 && f.kernels == 1, "the AdamW update: 1 kernel, got %d + %d", f.gemms, f.kernels);
    CHECK(f.kernels == 1 && f.r->kernels[0]->nsegments == 3, "one segment per parameter shape, got %d",
          f.kernels ? f.r->kernels[0]->nsegments : 0);
    tf_end(t);
}

/* A GPT-2 block on an input x [2, 8, 16] with 2 heads.
 * Forward, the block's result the output: 4 GEMMs (c_attn, c_proj, c_fc, the MLP's c_proj, each
 * adding its bias as it stores: the bias epilogue) and 5 kernels: ln_1 (a row kernel); attention
 * (reading the qkv GEMM's result through the split, reshape and transpose views, storing its rows
 * straight into the [B, T, heads, hd] layout the next GEMM reads); the residual + ln_2 (one row
 * kernel storing the residual stream and the norm); gelu; the last residual add.
 * Forward + backward, loss = sum(out * R): 12 GEMMs (the 4, and for each weight the gradient of
 * its input and of itself, the latter one GEMM with K folded over the batch that also sums its
 * output gradient's columns into the bias's gradient: the bias-gradient epilogue) and 13 kernels:
 *   ln_1, attention (storing each row's max and sum for the backward), residual + ln_2, as
 *   forward (3);
 *   the loss: the last residual add computed inside the sum (one work item) (1);
 *   d out = R * 1 (a GEMM operand) (1);
 *   gelu together with gelu's backward (about 20 nodes: its input x is read by both,
 *   and d out does not depend on the forward here, so the two can share a kernel) (1);
 *   ln_2's backward: the input gradient with the residual's gradient added (a row kernel) (1),
 *   its weight and bias gradients (a column reduction) (1);
 *   attention's backward: the row statistics (the forward's max and sum, and rowsum(dout * o) read
 *   from the forward's result where c_proj's GEMM reads it), dq loading them, dk and dv together
 *   (rule 8) (3); the heads'
 *   gradients concatenated into c_attn's output gradient (1);
 *   ln_1's weight and bias gradients (x is an input, so ln_1's input gradient is not needed) (1).
 * MBT_SHOW=1 prints both schedules. */
static void test_count_gpt2_block(void) {
    TF *t = tf_begin(6);
    int x = tf_input(t, S(2, 8, 16));
    int y = tf_gpt2_block(t, x, 2);
    Fused f = fuse_check("gpt2_block_forward", t->g, t->leaf, &y, 1, &t->ar);
    CHECK(f.gemms == 4 && f.kernels == 5, "GPT-2 block forward: 4 GEMMs + 5 kernels, got %d + %d", f.gemms, f.kernels);
    if (getenv("MBT_SHOW")) fuse_print(stdout, f.r);
    tf_weighted_loss(t, y);
    autodiff(t->g);
    Fused b = fuse_check("gpt2_block_fwd_bwd", t->g, t->leaf, NULL, 0, &t->ar);
    CHECK(b.gemms == 12 && b.kernels == 13, "GPT-2 block forward + backward: 12 GEMMs + 13 kernels, got %d + %d", b.gemms,
          b.kernels);
    /* the forward stores m and l ([.., 2]), the backward's kernels load the three statistics: no
     * kernel walks the keys for them again, and the attention's result has no buffer of its own */
    int fwd = 0, bwd = 0;
    for (int i = 0; i < b.r->nkernels; i++) {
        const KAttn *a = b.r->kernels[i]->attn;
        if (!a) continue;
        if (a->op == KA_FORWARD) fwd += a->stats.param >= 0 && a->stats.stride[2] == 2 && a->nout == 1;
        else bwd += a->stats.param >= 0 && a->stats.stride[2] == 3;
    }
    CHECK(fwd == 1 && bwd == 2, "the forward storing its statistics (1), dq and dk-dv loading them (2): got %d and %d", fwd, bwd);
    if (getenv("MBT_SHOW")) fuse_print(stdout, b.r);
    tf_end(t);
}

/* The document mask (attention(..., pos = ...), issue 20) with positions that are not documents:
 * batch 0 numbers documents of 3, 4 and 5 tokens, batch 1 anything (first keys that go back,
 * pos > t: every key up to t, pos < 0: no key). Query t sees keys t - pos .. t (clamped), so key
 * 0 of batch 1 is seen by rows 0, 2 and 7 but not 3..6: dk-dv's loop, which ends at the last row
 * that sees the key (fuse_codegen_dedicated.c), must reach row 7 past rows that do not. Forward
 * and backward fused == unfused (every buffer, dk and dv among them), and each of the three
 * attention kernels (forward, dq, dk-dv) described with the positions as a view (KAttn.pos, what
 * the CUDA back end's FA2 kernels read). */
static void test_attention_docs_any_pos(void) {
    TF *t = tf_begin(21);
    const int64_t B = 2, H = 2, T = 12, hd = 4;
    int q = tf_param(t, S(B, H, T, hd)), k = tf_param(t, S(B, H, T, hd)), v = tf_param(t, S(B, H, T, hd));
    int pos = tf_index(t, S(B, T), 1);
    static const double pv[24] = {0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 3, 0, 7, 1, -1, 2, 0, 9, 1, 5, 0, 2};
    memcpy(t->leaf[pos], pv, sizeof pv);
    int in[4] = {q, k, v, pos};
    int att = tf_node(t, G_ATTENTION, DT_F32, S(B, H, T, hd), 4, in);
    tf_n(t, att)->iattr[0] = 1;
    tf_n(t, att)->iattr[1] = 1;
    tf_n(t, att)->fattr[0] = 0.5;
    tf_weighted_loss(t, att);
    autodiff(t->g);
    Fused f = fuse_check("attention_docs_any_pos", t->g, t->leaf, NULL, 0, &t->ar);
    int masked = 0;
    for (int i = 0; f.r && i < f.r->nkernels; i++) {
        const KAttn *a = f.r->kernels[i]->attn;
        masked += a && a->pos.param >= 0 && a->pos.stride[0] == T && a->pos.stride[2] == 1;
    }
    CHECK(masked == 3, "the forward, dq and dk-dv described with the positions [B, T]: got %d", masked);
    tf_end(t);
}

/* ---- GEMM resolution ------------------------------------------------------------------------------ */

static void test_gemm_transposes(void) {
    TF *t = tf_begin(7);
    int x = tf_input(t, S(2, 4, 8)), w = tf_param(t, S(16, 8));
    int y = tf_matmul(t, x, tf_transpose(t, w, 0, 1)); /* x @ w.T */
    Fused f = fuse_check("x_at_wT", t->g, t->leaf, &y, 1, &t->ar);
    const FuseGemm *m = first_gemm(f.r);
    CHECK(f.kernels == 0 && m && m->trans_b && !m->trans_a && m->m == 8 && m->n == 16 && m->k == 8 && m->ldb == 8,
          "x @ w.T: one GEMM with trans_b, no transpose kernel");
    int yy = tf_matmul(t, x, tf_transpose(t, tf_transpose(t, tf_param(t, S(8, 5)), 0, 1), 0, 1));
    Fused g = fuse_check("x_at_wTT", t->g, t->leaf, &yy, 1, &t->ar);
    m = first_gemm(g.r);
    CHECK(g.kernels == 0 && m && !m->trans_b, "a transpose of a transpose is no transpose");
    /* batched: [2, 3, 4, 5] @ [2, 3, 5, 6] and a^T b with a [2, 3, 5, 4] */
    int a = tf_param(t, S(2, 3, 4, 5)), b = tf_param(t, S(2, 3, 5, 6)), a2 = tf_param(t, S(2, 3, 5, 4));
    int outs[2] = {tf_matmul(t, a, b), tf_matmul(t, tf_transpose(t, a2, 2, 3), b)};
    Fused h = fuse_check("batched", t->g, t->leaf, outs, 2, &t->ar);
    CHECK(h.gemms == 2 && h.kernels == 0, "two batched GEMMs, no kernel");
    m = first_gemm(h.r);
    CHECK(m && m->batch == 6 && m->stride_a == 20 && m->stride_b == 30 && m->stride_c == 24, "batch 6 with its strides");
    tf_end(t);
}

/* autodiff's weight gradient: transpose(x) @ dy summed over the batch is one GEMM with K = B * T. */
static void test_gemm_weight_gradient(void) {
    TF *t = tf_begin(8);
    int x = tf_input(t, S(2, 4, 8)), w = tf_param(t, S(8, 16));
    tf_weighted_loss(t, tf_matmul(t, x, w));
    autodiff(t->g);
    Fused f = fuse_check("weight_gradient", t->g, t->leaf, NULL, 0, &t->ar);
    const FuseGemm *m = NULL;
    for (int i = 0; i < f.r->nlaunches; i++)
        if (f.r->launches[i].kind == FL_GEMM && f.r->launches[i].gemm.trans_a) m = &f.r->launches[i].gemm;
    CHECK(m && m->m == 8 && m->n == 16 && m->k == 8 && m->batch == 1, "dW = x^T dy: m 8, n 16, k = 2 * 4, one matrix");
    CHECK(f.gemms == 2, "the forward GEMM and the weight gradient's, got %d", f.gemms);
    tf_end(t);
}

/* `x @ w + b`, b along the last axis: one GEMM adding b as it stores (the bias epilogue), b on
 * either side of the add and of any rank that is a vector; fuse_check holds its result to the
 * unfused graph's. Not folded: a bias of another shape, a product something else reads too, a
 * product that is an output itself. */
static void test_gemm_bias_epilogue(void) {
    TF *t = tf_begin(12);
    int x = tf_input(t, S(2, 4, 8)), w = tf_param(t, S(8, 16)), b = tf_param(t, S(16)), b3 = tf_param(t, S(1, 1, 16));
    int outs[2] = {tf_linear(t, x, w, b), tf_bin(t, G_ADD, b3, tf_matmul(t, x, tf_param(t, S(8, 16))))};
    Fused f = fuse_check("bias_epilogue", t->g, t->leaf, outs, 2, &t->ar);
    int folded = 0;
    for (int i = 0; i < f.r->nlaunches; i++) {
        const FuseGemm *m = &f.r->launches[i].gemm;
        if (f.r->launches[i].kind != FL_GEMM || m->epilogue != FE_BIAS) continue;
        folded++;
        CHECK(f.r->buffers[m->bias].node == b || f.r->buffers[m->bias].node == b3, "the bias buffer is the bias");
        CHECK(f.r->buffers[m->c].node == outs[0] || f.r->buffers[m->c].node == outs[1], "C holds the sum");
    }
    CHECK(f.gemms == 2 && f.kernels == 0 && folded == 2, "two GEMMs with the bias epilogue, no kernel: %d + %d, %d folded",
          f.gemms, f.kernels, folded);
    /* a bias per row, not per column */
    int y = tf_bin(t, G_ADD, tf_matmul(t, x, w), tf_param(t, S(2, 4, 1)));
    Fused g = fuse_check("row_bias", t->g, t->leaf, &y, 1, &t->ar);
    CHECK(g.gemms == 1 && g.kernels == 1 && first_gemm(g.r)->epilogue == FE_NONE, "a per-row bias stays an add");
    /* the product read twice, or asked for */
    int p = tf_matmul(t, x, w);
    int two[2] = {tf_bin(t, G_ADD, p, b), tf_bin(t, G_MUL, p, p)};
    Fused h = fuse_check("product_shared", t->g, t->leaf, two, 2, &t->ar);
    CHECK(first_gemm(h.r)->epilogue == FE_NONE, "a product read twice stays a product");
    int q = tf_matmul(t, x, w);
    int asked[2] = {q, tf_bin(t, G_ADD, q, b)};
    Fused o = fuse_check("product_output", t->g, t->leaf, asked, 2, &t->ar);
    CHECK(first_gemm(o.r)->epilogue == FE_NONE, "a product asked for stays a product");
    tf_end(t);
}

/* The bias's gradient beside the weight's: the weight gradient's GEMM (x^T dy, k = B * T) sums
 * its B, dy, over k as well (FE_BGRAD_B) into the bias's gradient, and no kernel computes it. */
static void test_gemm_bias_gradient(void) {
    TF *t = tf_begin(13);
    int x = tf_input(t, S(2, 4, 8)), w = tf_param(t, S(8, 16)), b = tf_param(t, S(16));
    (void)w, (void)b;
    tf_weighted_loss(t, tf_linear(t, x, w, b));
    autodiff(t->g);
    Fused f = fuse_check("bias_gradient", t->g, t->leaf, NULL, 0, &t->ar);
    int db = t->g->grads[1], in_kernel = 0;
    const FuseGemm *m = NULL;
    for (int i = 0; i < f.r->nlaunches; i++) {
        const FuseLaunch *L = &f.r->launches[i];
        if (L->kind == FL_GEMM && L->gemm.epilogue == FE_BGRAD_B) m = &L->gemm;
        for (int j = 0; L->kind == FL_KERNEL && j < L->nnodes; j++) in_kernel |= L->nodes[j] == db;
    }
    CHECK(m && m->trans_a && !m->trans_b && m->k == 8 && f.r->buffers[m->bias].node == db,
          "the weight gradient's GEMM writes the bias's gradient");
    CHECK(!in_kernel, "a kernel computes the bias's gradient too");
    tf_end(t);
}

/* A batch dimension broadcast partly ([2, 1] against [1, 3]) cannot be a stride: the operands are
 * expanded to the output's batch by a copy (independent neighbours, so one kernel). */
static void test_gemm_partial_broadcast(void) {
    TF *t = tf_begin(9);
    int a = tf_param(t, S(2, 1, 4, 5)), b = tf_param(t, S(1, 3, 5, 6));
    int in[2] = {a, b};
    int y = tf_node(t, G_MATMUL, DT_F32, S(2, 3, 4, 6), 2, in);
    Fused f = fuse_check("partial_broadcast", t->g, t->leaf, &y, 1, &t->ar);
    CHECK(f.gemms == 1 && f.kernels == 1, "both operands expanded by one kernel, then one GEMM: got %d + %d", f.gemms, f.kernels);
    CHECK(f.kernels == 1 && f.r->kernels[0]->nsegments == 2, "the copies are the two segments of one kernel (rule 7)");
    tf_end(t);
}

/* Outputs that need no arithmetic: an unused parameter's zero gradient gets a buffer and a
 * kernel filling it; an output that is a leaf is its buffer; a reshape of a GEMM result is a
 * copy (a buffer of its own). */
static void test_outputs_without_arithmetic(void) {
    TF *t = tf_begin(10);
    int used = tf_param(t, S(3, 4)), unused = tf_param(t, S(5));
    (void)unused;
    tf_weighted_loss(t, tf_un(t, G_TANH, used));
    autodiff(t->g);
    Fused f = fuse_check("unused_parameter", t->g, t->leaf, NULL, 0, &t->ar);
    int zero = t->g->grads[1];
    CHECK(tf_n(t, zero)->op == G_CONST && f.r->node_buffer[zero] >= 0, "the zero gradient has a buffer");
    int x = tf_param(t, S(2, 3)), w = tf_param(t, S(3, 4));
    int outs[2] = {x, tf_reshape(t, tf_matmul(t, x, w), S(8))};
    Fused g = fuse_check("leaf_and_reshape_outputs", t->g, t->leaf, outs, 2, &t->ar);
    CHECK(g.r->node_buffer[x] >= 0 && g.r->buffers[g.r->node_buffer[x]].kind == FB_PARAM, "a leaf output is its own buffer");
    CHECK(g.gemms == 1 && g.kernels == 1, "the GEMM and a copy for the reshaped output, got %d + %d", g.gemms, g.kernels);
    tf_end(t);
}

/* ---- programs ------------------------------------------------------------------------------------ */

/* The exclusive upper bound of the values an i32 input may hold: the size of what it indexes. */
static int64_t index_limit(const Graph *g, int id) {
    int64_t lim = INT64_MAX;
    for (int u = 0; u < g->n; u++) {
        const GNode *n = g->node[u];
        for (int i = 0; i < n->nin; i++) {
            if (n->in[i] != id) continue;
            int64_t l = INT64_MAX;
            if (n->op == G_GATHER && i == 1) l = g->node[n->in[0]]->shape[0];
            if (n->op == G_SCATTER_ADD && i == 1) l = n->shape[0];
            if (n->op == G_CROSS_ENTROPY && i == 1) l = g->node[n->in[0]]->shape[g->node[n->in[0]]->rank - 1];
            if (n->op == G_CROSS_ENTROPY_BWD && i == 2) l = n->shape[n->rank - 1];
            if (n->op == G_ONE_HOT) l = n->shape[n->rank - 1];
            if (l < lim) lim = l;
        }
    }
    return lim == INT64_MAX ? 4 : lim;
}

/* Random values for every leaf of g: parameters and float inputs in [-1, 1] (an update graph's
 * state and step in ranges its formulas take), index inputs in range. */
static double **random_leaves(const Graph *g, uint64_t seed, Arena *ar) {
    double **leaves = arena_alloc(ar, sizeof(double *) * (size_t)(g->n + 1));
    uint64_t rng = 0x243F6A8885A308D3ull ^ seed;
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        if (n->op != G_PARAM && n->op != G_INPUT) continue;
        int64_t k = graph_numel(n);
        leaves[id] = arena_alloc(ar, sizeof(double) * (size_t)(k ? k : 1));
        double lo = -1, hi = 1;
        const char *name = n->name ? n->name : "";
        if (g->update && (strncmp(name, "state", 5) == 0 || strcmp(name, "t") == 0)) lo = 0.5, hi = 3;
        if (g->update && strcmp(name, "lr") == 0) lo = 0.001, hi = 0.01;
        int64_t lim = n->dt == DT_I32 ? index_limit(g, id) : 0;
        for (int64_t i = 0; i < k; i++) {
            double v = tf_uniform(&rng, lo, hi);
            if (n->dt == DT_I32) v = floor(tf_uniform(&rng, 0, (double)lim));
            if (g->update && strcmp(name, "t") == 0) v = floor(v);
            if (strcmp(name, GRAPH_RNG_NAME) == 0) /* dropout's key (graph.h): 32-bit words, on */
                v = i == GRAPH_RNG_WORDS - 1 ? 1 : floor(tf_uniform(&rng, 0, 4294967296.0));
            leaves[id][i] = v;
        }
    }
    return leaves;
}

/* The step graph (with its backward) and the update graph of every train block in path, each
 * fused and checked. Returns the number of graphs checked. */
static int check_program(const char *path) {
    Arena ar = {0};
    Loader ld;
    loader_init(&ld, &ar, NULL, 0, "stdlib");
    capture_begin();
    Module *m = loader_main(&ld, path);
    TrainBuild *tb = m ? sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, &ar) : NULL;
    const char *msg = capture_end();
    CHECK(tb != NULL, "%s builds", path);
    if (!tb) {
        unit_detail("stderr", msg);
        arena_free(&ar);
        return 0;
    }
    autodiff(tb->step);
    Graph *gs[2] = {tb->step, tb->update};
    int checked = 0;
    for (int i = 0; i < 2; i++) {
        if (!gs[i]) continue;
        CHECK(graph_verify(gs[i], stdout) == 0, "%s: the %s graph verifies", path, i ? "update" : "step");
        const char *what = arena_printf(&ar, "%s %s", path, i ? "update" : "step");
        fuse_check(what, gs[i], random_leaves(gs[i], (uint64_t)i + 17, &ar), NULL, 0, &ar);
        checked++;
    }
    arena_free(&ar);
    return checked;
}

static void test_programs_golden(void) {
    const char *files[] = {"tests/golden/gpt.mbt", "tests/golden/mlp.mbt", "tests/golden/ops.mbt", "tests/golden/plan_adamw.mbt",
                           "tests/golden/select_train.mbt"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) CHECK(check_program(files[i]) == 2, "%s: 2 graphs", files[i]);
}

static void test_programs_fuse(void) {
    const char *files[] = {"tests/fuse/by_hand.mbt", "tests/fuse/llama_block.mbt", "tests/fuse/moe_small.mbt",
                           "tests/fuse/lora_small.mbt"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) CHECK(check_program(files[i]) == 2, "%s: 2 graphs", files[i]);
}

/* The update in place (fuse.c's fz_update_in_place) on tests/fuse/update_order.mbt's two blocks:
 * each update graph fused and run against the unfused graph (fuse_check: a result written over an
 * old value that is read afterwards would differ), and which results were written in place. */
static void test_update_in_place(void) {
    static const struct {
        const char *block;
        int in_place;       /* results written over their inputs */
        int a_in_place;     /* state.a among them */
        const char *reason; /* why the first other is copied */
    } cases[] = {
        {"hazard", 2, 0, "state.a: its kernel reads the old value after writing the new one"},
        {"alias", 1, 0, "state.a: its old value is another result"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        Arena ar = {0};
        Loader ld;
        loader_init(&ld, &ar, NULL, 0, "stdlib");
        capture_begin();
        Module *m = loader_main(&ld, "tests/fuse/update_order.mbt");
        TrainBuild *tb = m ? sema_build_train(&ld, m, cases[c].block, PLAN_ALIGN / 4, &ar) : NULL;
        const char *msg = capture_end();
        CHECK(tb && tb->update, "update_order.mbt's %s builds", cases[c].block);
        if (!tb || !tb->update) {
            unit_detail("stderr", msg);
            arena_free(&ar);
            continue;
        }
        const Graph *g = tb->update;
        Fused f = fuse_check(arena_printf(&ar, "update_order %s", cases[c].block), g, random_leaves(g, 29, &ar), NULL, 0, &ar);
        const GraphUpdate *u = g->update;
        const int *nb = f.r->node_buffer;
        CHECK(f.r->n_in_place == cases[c].in_place, "%s: %d results in place, expected %d", cases[c].block, f.r->n_in_place,
              cases[c].in_place);
        CHECK(nb[u->p_out] == nb[u->p_in], "%s: p in place", cases[c].block);
        CHECK((nb[u->state_out[0]] == nb[u->state_in[0]]) == cases[c].a_in_place, "%s: state.a %sin place", cases[c].block,
              cases[c].a_in_place ? "" : "not ");
        CHECK(f.r->not_in_place && strcmp(f.r->not_in_place, cases[c].reason) == 0, "%s: copied because '%s', expected '%s'",
              cases[c].block, f.r->not_in_place ? f.r->not_in_place : "(none)", cases[c].reason);
        arena_free(&ar);
    }
}

/* Fused LoRA (fuse_lower.c's fl_lora_chain) on tests/fuse/lora_small.mbt's step: nn.LoRALinear's and
 * nn.MultiLoRALinear's down and up products are one launch each (a row kernel with Kernel.lora, S
 * stored for the backward), and so are MultiLoRALinear's input gradient's dS = (scaling dy) @ B and
 * dS @ A added to the base's dy @ W (LoRALinear's input gradient there is summed with the residual's
 * first, so it stays unfused); four launches fewer than with the fusion off, every buffer equal to the
 * unfused graph's (fuse_check); forward alone (the loss), S is not stored; and a fused kernel whose
 * scaling is corrupted (the control) differs from the unfused graph. */
static int lora_kernels(const FuseResult *r, int *stored) {
    int n = 0;
    *stored = 0;
    for (int i = 0; i < r->nkernels; i++)
        if (r->kernels[i]->lora) {
            n++;
            *stored += r->kernels[i]->lora->s >= 0;
            CHECK(r->kernels[i]->kind == KK_ROW && strstr(r->kernels[i]->name, "_lora"),
                  "a fused LoRA kernel is a row kernel named lora");
        }
    return n;
}

static void test_lora_fused(void) {
    Arena ar = {0};
    Loader ld;
    loader_init(&ld, &ar, NULL, 0, "stdlib");
    capture_begin();
    Module *m = loader_main(&ld, "tests/fuse/lora_small.mbt");
    TrainBuild *tb = m ? sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, &ar) : NULL;
    const char *msg = capture_end();
    CHECK(tb && tb->step, "lora_small.mbt builds");
    if (!tb || !tb->step) {
        unit_detail("stderr", msg);
        arena_free(&ar);
        return;
    }
    Graph *g = tb->step;
    autodiff(g);
    double **leaves = random_leaves(g, 41, &ar);
    int stored = 0;
    Fused f = fuse_check("lora fused", g, leaves, NULL, 0, &ar);
    CHECK(lora_kernels(f.r, &stored) == 3 && stored == 3,
          "three fused LoRA launches (the two layers' forward, MultiLoRALinear's input gradient), each storing S (or dS) for "
          "the weight gradients (%d stored)",
          stored);
    fuse_lora_chain = 0;
    Fused u = fuse_check("lora unfused", g, leaves, NULL, 0, &ar);
    fuse_lora_chain = 1;
    CHECK(lora_kernels(u.r, &stored) == 0, "--no-lora-fusion: no fused LoRA launch");
    CHECK(u.r->nlaunches == f.r->nlaunches + 4 && u.gemms == f.gemms + 6,
          "unfused: 4 launches more (6 GEMMs, the backward's add in a kernel): %d vs %d launches, %d vs %d GEMMs", u.r->nlaunches,
          f.r->nlaunches, u.gemms, f.gemms);
    Fused fw = fuse_check("lora forward", g, leaves, &g->loss, 1, &ar);
    CHECK(lora_kernels(fw.r, &stored) == 2 && stored == 0, "forward alone: two fused launches, S in registers only (%d stored)",
          stored);

    /* the control: the up product's scaling corrupted in the fused IR, the schedule must differ */
    FusedGraph *fg = fuse_lower_graph(g, NULL, 0, &ar);
    int broken = 0;
    for (int i = 0; i < fg->n; i++)
        if (fg->node[i]->op == F_LORA) {
            fg->node[i]->gemm.alpha *= 1.5;
            broken++;
        }
    FuseResult *r = fuse_codegen(fg, &ar);
    capture_begin();
    double **ref = ref_run(g, leaves, &ar);
    double **bad = ref ? kir_ref_schedule(r, leaves, &ar) : NULL;
    capture_end();
    double worst = 0;
    for (int id = 0; bad && id < g->n; id++) {
        int b = r->node_buffer[id];
        if (b < 0 || g->node[id]->op == G_PARAM || g->node[id]->op == G_INPUT) continue;
        double e = rel_error(bad[b], ref[id], graph_numel(g->node[id]));
        if (e > worst || isnan(e)) worst = e;
    }
    CHECK(broken == 3 && worst > 1e-3, "control: a fused LoRA kernel with the wrong scaling differs (max relative error %.3g)",
          worst);
    printf("# lora control: scaling x1.5 in the fused kernels, max relative error %.3g\n", worst);
    arena_free(&ar);
}

/* The update graph of a program's AdamW (flat vectors over every parameter): one kernel. */
static void test_count_adamw_update_graph(void) {
    Arena ar = {0};
    Loader ld;
    loader_init(&ld, &ar, NULL, 0, "stdlib");
    capture_begin();
    Module *m = loader_main(&ld, "tests/golden/plan_adamw.mbt");
    TrainBuild *tb = m ? sema_build_train(&ld, m, NULL, PLAN_ALIGN / 4, &ar) : NULL;
    const char *msg = capture_end();
    CHECK(tb && tb->update, "plan_adamw.mbt builds its update graph");
    if (!tb || !tb->update) {
        unit_detail("stderr", msg);
        arena_free(&ar);
        return;
    }
    Fused f = fuse_check("adamw_update_graph", tb->update, random_leaves(tb->update, 3, &ar), NULL, 0, &ar);
    CHECK(f.gemms == 0 && f.kernels == 1, "AdamW's update graph: 1 kernel, got %d + %d", f.gemms, f.kernels);
    arena_free(&ar);
}

int main(void) {
    RUN(test_kir_builder_folds);
    RUN(test_kir_print_and_run);
    RUN(test_kir_verify_catches);
    RUN(test_kir_ref_semantics);
    RUN(test_fused_print);
    RUN(test_fused_verify_catches);
    RUN(test_count_linear_bias_gelu);
    RUN(test_count_residual_layernorm);
    RUN(test_count_softmax);
    RUN(test_count_cross_entropy);
    RUN(test_cross_entropy_inplace);
    RUN(test_count_adamw_by_hand);
    RUN(test_count_adamw_update_graph);
    RUN(test_update_in_place);
    RUN(test_count_gpt2_block);
    RUN(test_attention_docs_any_pos);
    RUN(test_gemm_transposes);
    RUN(test_gemm_bias_epilogue);
    RUN(test_gemm_bias_gradient);
    RUN(test_gemm_weight_gradient);
    RUN(test_gemm_partial_broadcast);
    RUN(test_outputs_without_arithmetic);
    RUN(test_programs_golden);
    RUN(test_programs_fuse);
    RUN(test_lora_fused);
    return unit_finish();
}
