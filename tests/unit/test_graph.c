/* test_graph.c - unit tests of the graph IR (compiler/graph.c): building nodes (graph_add,
 * graph_node, graph_numel, graph_op_name), the printed form (graph_print), and graph_verify
 * accepting a well-formed graph and catching each kind of deliberately broken one.
 *
 * Each broken case starts from a small valid graph, breaks one thing (an input that does not
 * precede its node, inner dimensions of a matmul, a reshape's element count, a slice past the
 * end, a float gather index, a reduction's result shape, a backward op's shape...) and checks
 * that graph_verify counts a problem and names it. Run from the repository root. */
#include <stdint.h>

#include "unit.h"

#include "graph.h"

/* ---- helpers ---- */

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define INS(...) ((const int[]){__VA_ARGS__})

static int add0(Graph *g, GOp op, DType dt, int rank, const int64_t *shape) {
    return graph_add(g, op, dt, rank, shape, 0, NULL, span_none());
}

static int add1(Graph *g, GOp op, DType dt, int rank, const int64_t *shape, int a) {
    return graph_add(g, op, dt, rank, shape, 1, INS(a), span_none());
}

static int add2(Graph *g, GOp op, DType dt, int rank, const int64_t *shape, int a, int b) {
    return graph_add(g, op, dt, rank, shape, 2, INS(a, b), span_none());
}

static int param(Graph *g, const char *name, int rank, const int64_t *shape) {
    int id = add0(g, G_PARAM, DT_F32, rank, shape);
    graph_node(g, id)->name = name;
    graph_node(g, id)->iattr[0] = GI_NORMAL;
    graph_node(g, id)->fattr[1] = 0.02;
    return id;
}

/* What graph_verify prints, and its count. */
static int verify_text(const Graph *g, char **text) {
    size_t len = 0;
    FILE *m = open_memstream(text, &len);
    int n = graph_verify(g, m);
    fclose(m);
    return n;
}

/* A small valid graph: an embedding, a layer norm, a linear map, and cross entropy.
 *   %0 wte [16, 8]  %1 w [8, 16]  %2 b [16]  %3 ln_w [8]  %4 ln_b [8]  %5 x i32[2, 4]  %6 y i32[2, 4]
 *   %7 gather [2, 4, 8]  %8 layernorm  %9 matmul [2, 4, 16]  %10 add  %11 cross_entropy [] */
static Graph *small_graph(Arena *ar) {
    Graph *g = graph_new(ar);
    param(g, "wte", 2, SHAPE(16, 8));
    param(g, "w", 2, SHAPE(8, 16));
    param(g, "b", 1, SHAPE(16));
    param(g, "ln.weight", 1, SHAPE(8));
    param(g, "ln.bias", 1, SHAPE(8));
    int x = add0(g, G_INPUT, DT_I32, 2, SHAPE(2, 4));
    graph_node(g, x)->name = "data.x";
    int y = add0(g, G_INPUT, DT_I32, 2, SHAPE(2, 4));
    graph_node(g, y)->name = "data.y";
    int e = add2(g, G_GATHER, DT_F32, 3, SHAPE(2, 4, 8), 0, x);
    int ln = graph_add(g, G_LAYERNORM, DT_F32, 3, SHAPE(2, 4, 8), 3, INS(e, 3, 4), span_none());
    graph_node(g, ln)->fattr[0] = 1e-5;
    int mm = add2(g, G_MATMUL, DT_F32, 3, SHAPE(2, 4, 16), ln, 1);
    int lg = add2(g, G_ADD, DT_F32, 3, SHAPE(2, 4, 16), mm, 2);
    g->loss = add2(g, G_CROSS_ENTROPY, DT_F32, 0, NULL, lg, y);
    return g;
}

/* graph_verify must find at least one problem, and its text must contain `want`. */
#define EXPECT_BROKEN(g, want)                                                                                                   \
    do {                                                                                                                         \
        char *t_ = NULL;                                                                                                         \
        int n_ = verify_text((g), &t_);                                                                                          \
        CHECK(n_ > 0, "graph_verify found no problem (wanted '%s')", (want));                                                    \
        if (n_ > 0 && !strstr(t_, (want))) {                                                                                     \
            unit_fail_at(__FILE__, __LINE__, "graph_verify's message lacks '%s'", (want));                                       \
            unit_detail("got", t_);                                                                                              \
        }                                                                                                                        \
        free(t_);                                                                                                                \
    } while (0)

#define EXPECT_OK(g)                                                                                                             \
    do {                                                                                                                         \
        char *t_ = NULL;                                                                                                         \
        int n_ = verify_text((g), &t_);                                                                                          \
        if (n_ != 0) {                                                                                                           \
            unit_fail_at(__FILE__, __LINE__, "graph_verify found %d problem(s)", n_);                                            \
            unit_detail("problems", t_);                                                                                         \
        }                                                                                                                        \
        free(t_);                                                                                                                \
    } while (0)

/* ---- building ---- */

static void test_add_and_numel(void) {
    Arena ar = {0};
    Graph *g = graph_new(&ar);
    CHECK(g->n == 0 && g->loss == -1 && g->nparams == 0, "a new graph is empty with no loss");
    int a = param(g, "a", 2, SHAPE(3, 4));
    int c = add0(g, G_CONST, DT_F32, 0, NULL);
    int b = param(g, "b", 3, SHAPE(2, 3, 5));
    int m = add2(g, G_MUL, DT_F32, 2, SHAPE(3, 4), a, c);
    CHECK(a == 0 && c == 1 && b == 2 && m == 3, "ids are 0, 1, 2, 3 in order (got %d %d %d %d)", a, c, b, m);
    CHECK(g->nparams == 2 && g->params[0] == a && g->params[1] == b, "params lists the two parameters in order");
    GNode *n = graph_node(g, m);
    CHECK(n->id == m && n->op == G_MUL && n->nin == 2 && n->in[0] == a && n->in[1] == c, "node fields are stored");
    CHECK(n->iattr[0] == 0 && n->fattr[0] == 0 && n->name == NULL, "attributes start zeroed");
    CHECK(graph_numel(graph_node(g, a)) == 12, "numel of [3, 4] is 12");
    CHECK(graph_numel(graph_node(g, c)) == 1, "numel of a scalar is 1");
    CHECK(graph_numel(graph_node(g, b)) == 30, "numel of [2, 3, 5] is 30");
    /* the shape is copied */
    int64_t s[2] = {7, 9};
    int d = add0(g, G_CONST, DT_F32, 2, s);
    s[0] = 1;
    CHECK(graph_node(g, d)->shape[0] == 7, "graph_add copies the shape");
    /* many nodes: the table grows */
    for (int i = 0; i < 1000; i++) add1(g, G_NEG, DT_F32, 2, SHAPE(3, 4), a);
    CHECK(g->n == 1005 && graph_node(g, 1004)->id == 1004, "a thousand more nodes");
    EXPECT_OK(g);
    arena_free(&ar);
}

static void test_op_names(void) {
    CHECK_STR(graph_op_name(G_MATMUL), "matmul", "G_MATMUL");
    CHECK_STR(graph_op_name(G_PARAM), "param", "G_PARAM");
    CHECK_STR(graph_op_name(G_LAYERNORM_BWD_X), "layernorm_bwd_x", "G_LAYERNORM_BWD_X");
    CHECK_STR(graph_op_name(G_CROSS_ENTROPY_BWD), "cross_entropy_bwd", "G_CROSS_ENTROPY_BWD");
    CHECK_STR(graph_op_name(G_TOPK_INDICES), "topk_indices", "G_TOPK_INDICES");
    CHECK_STR(graph_op_name(G_OP_COUNT), "?", "G_OP_COUNT");
    for (int op = 0; op < G_OP_COUNT; op++) {
        const char *s = graph_op_name((GOp)op);
        CHECK(s && strcmp(s, "?") != 0, "op %d has a name", op);
        for (int k = 0; k < op; k++)
            if (strcmp(graph_op_name((GOp)k), s) == 0) CHECK(0, "ops %d and %d are both named '%s'", k, op, s);
    }
}

/* ---- printing ---- */

static void test_print(void) {
    Arena ar = {0};
    static const char src[] = "model M {\n  w = param f32[3] ~ ones\n}\n";
    uint32_t file = diag_add_source("dir/m.mbt", src, (uint32_t)strlen(src));
    Graph *g = graph_new(&ar);
    g->name = "train t";
    Span at = {file, 12, 1, 2, 3};
    int w = graph_add(g, G_PARAM, DT_F32, 1, SHAPE(3), 0, NULL, at);
    graph_node(g, w)->name = "blk.0.w";
    graph_node(g, w)->iattr[0] = GI_ONES;
    int c = add0(g, G_CONST, DT_F32, 0, NULL);
    graph_node(g, c)->fattr[0] = 0.5;
    int m = add2(g, G_MUL, DT_F32, 1, SHAPE(3), w, c);
    int s = add1(g, G_SUM, DT_F32, 0, NULL, m);
    graph_node(g, s)->iattr[0] = -1;
    int sm = add1(g, G_SOFTMAX, DT_F32, 1, SHAPE(3), m);
    graph_node(g, sm)->iattr[0] = 0;
    g->loss = s;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    graph_print(f, g, 0);
    fclose(f);
    const char *want = "# graph train t: 5 nodes, 1 parameter (3 values), loss %3\n"
                       "%0 = param blk.0.w init=ones : f32[3]                                   # m.mbt:2:3\n"
                       "%1 = const 0.5 : f32[]\n"
                       "%2 = mul %0, %1 : f32[3]\n"
                       "%3 = sum %2 axis=all : f32[]\n"
                       "%4 = softmax %2 axis=0 : f32[3]\n";
    CHECK_STR(text, want, "printed graph");
    free(text);
    text = NULL;
    f = open_memstream(&text, &len);
    graph_print(f, g, 3);
    fclose(f);
    CHECK(strstr(text, "from %3 on") && !strstr(text, "%1 =") && strstr(text, "%4 ="), "printing from node 3 on");
    free(text);
    EXPECT_OK(g);
    arena_free(&ar);
}

/* ---- verifying ---- */

static void test_verify_small_ok(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    EXPECT_OK(g);
    arena_free(&ar);
}

/* Every family of ops in a valid form, forward and backward. */
static void test_verify_every_op_ok(void) {
    Arena ar = {0};
    Graph *g = graph_new(&ar);
    int x = param(g, "x", 3, SHAPE(2, 4, 8));
    int w = param(g, "w", 1, SHAPE(8));
    int idx = add0(g, G_INPUT, DT_I32, 2, SHAPE(2, 4));
    graph_node(g, idx)->name = "data.x";
    int ar4 = add0(g, G_ARANGE, DT_I32, 1, SHAPE(4));
    int c = add0(g, G_CONST, DT_F32, 0, NULL);
    for (int op = G_NEG; op <= G_SIGN; op++) add1(g, (GOp)op, DT_F32, 3, SHAPE(2, 4, 8), x);
    add1(g, G_CAST, DT_I32, 3, SHAPE(2, 4, 8), x);
    int cl = add1(g, G_CLAMP, DT_F32, 3, SHAPE(2, 4, 8), x);
    graph_node(g, cl)->fattr[1] = 1;
    add2(g, G_ADD, DT_F32, 3, SHAPE(2, 4, 8), x, w);
    add2(g, G_SUB, DT_F32, 3, SHAPE(2, 4, 8), c, x);
    int mask = add2(g, G_GT, DT_BOOL, 3, SHAPE(2, 4, 8), x, c);
    add2(g, G_AND, DT_BOOL, 3, SHAPE(2, 4, 8), mask, mask);
    add1(g, G_NOT, DT_BOOL, 3, SHAPE(2, 4, 8), mask);
    graph_add(g, G_WHERE, DT_F32, 3, SHAPE(2, 4, 8), 3, INS(mask, x, c), span_none());
    int red = add1(g, G_SUM, DT_F32, 2, SHAPE(2, 8), x);
    graph_node(g, red)->iattr[0] = 1;
    red = add1(g, G_MAX, DT_F32, 3, SHAPE(2, 4, 1), x);
    graph_node(g, red)->iattr[0] = 2;
    graph_node(g, red)->iattr[1] = 1;
    red = add1(g, G_MEAN, DT_F32, 0, NULL, x);
    graph_node(g, red)->iattr[0] = -1;
    add1(g, G_NORM, DT_F32, 0, NULL, x);
    add1(g, G_SUM_TO, DT_F32, 1, SHAPE(8), x);
    int sm = add1(g, G_SOFTMAX, DT_F32, 3, SHAPE(2, 4, 8), x);
    graph_node(g, sm)->iattr[0] = 2;
    int rn = add2(g, G_RMSNORM, DT_F32, 3, SHAPE(2, 4, 8), x, w);
    graph_node(g, rn)->fattr[0] = 1e-6;
    int r4 = add1(g, G_RESHAPE, DT_F32, 4, SHAPE(2, 2, 2, 8), x);
    int rp = add1(g, G_ROPE, DT_F32, 4, SHAPE(2, 2, 2, 8), r4);
    graph_node(g, rp)->fattr[0] = 10000;
    int kv = add1(g, G_SLICE, DT_F32, 4, SHAPE(2, 1, 2, 8), r4);
    graph_node(g, kv)->iattr[0] = 1;
    graph_node(g, kv)->iattr[1] = 1;
    graph_node(g, kv)->iattr[2] = 2;
    int at = graph_add(g, G_ATTENTION, DT_F32, 4, SHAPE(2, 2, 2, 8), 3, INS(r4, kv, kv), span_none());
    graph_node(g, at)->iattr[0] = 1;
    graph_node(g, at)->fattr[0] = 0.35;
    int oh = add1(g, G_ONE_HOT, DT_F32, 3, SHAPE(2, 4, 8), idx);
    graph_node(g, oh)->iattr[0] = 8;
    int tk = add1(g, G_TOPK_INDICES, DT_I32, 3, SHAPE(2, 4, 3), x);
    graph_node(g, tk)->iattr[0] = 3;
    graph_node(g, tk)->iattr[1] = 2;
    add2(g, G_MATMUL, DT_F32, 2, SHAPE(2, 4), x, w); /* [2, 4, 8] @ [8] -> [2, 4] */
    int tr = add1(g, G_TRANSPOSE, DT_F32, 3, SHAPE(8, 4, 2), x);
    graph_node(g, tr)->iattr[0] = 0;
    graph_node(g, tr)->iattr[1] = 2;
    add2(g, G_GATHER, DT_F32, 4, SHAPE(4, 2, 2, 8), r4, ar4); /* rows of [2, 2, 2, 8] by i32[4] */
    int cc = graph_add(g, G_CONCAT, DT_F32, 3, SHAPE(2, 4, 24), 3, INS(x, x, x), span_none());
    graph_node(g, cc)->iattr[0] = 2;
    add1(g, G_BROADCAST, DT_F32, 3, SHAPE(2, 4, 8), w);
    add2(g, G_SCATTER_ADD, DT_F32, 2, SHAPE(16, 8), oh, idx);
    int sb = add2(g, G_SOFTMAX_BWD, DT_F32, 3, SHAPE(2, 4, 8), x, sm);
    graph_node(g, sb)->iattr[0] = 2;
    int lbx = graph_add(g, G_LAYERNORM_BWD_X, DT_F32, 3, SHAPE(2, 4, 8), 3, INS(x, x, w), span_none());
    graph_node(g, lbx)->fattr[0] = 1e-5;
    int lbw = add2(g, G_LAYERNORM_BWD_W, DT_F32, 1, SHAPE(8), x, x);
    graph_node(g, lbw)->fattr[0] = 1e-5;
    int rb = add1(g, G_ROPE_BWD, DT_F32, 4, SHAPE(2, 2, 2, 8), r4);
    graph_node(g, rb)->fattr[0] = 10000;
    for (int op = G_ATTENTION_BWD_Q; op <= G_ATTENTION_BWD_V; op++) {
        const int64_t *s = op == G_ATTENTION_BWD_Q ? SHAPE(2, 2, 2, 8) : SHAPE(2, 1, 2, 8);
        int b = graph_add(g, (GOp)op, DT_F32, 4, s, 4, INS(at, r4, kv, kv), span_none());
        graph_node(g, b)->fattr[0] = 0.35;
    }
    int lg = add1(g, G_RESHAPE, DT_F32, 3, SHAPE(2, 4, 8), x);
    int ce = add2(g, G_CROSS_ENTROPY, DT_F32, 0, NULL, lg, idx);
    graph_add(g, G_CROSS_ENTROPY_BWD, DT_F32, 3, SHAPE(2, 4, 8), 3, INS(c, lg, idx), span_none());
    g->loss = ce;
    EXPECT_OK(g);
    arena_free(&ar);
}

static void test_verify_input_order(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    graph_node(g, 9)->in[1] = 10; /* matmul reads the add after it */
    EXPECT_BROKEN(g, "does not precede");
    arena_free(&ar);
    g = small_graph(&ar);
    graph_node(g, 9)->in[0] = 9; /* reads itself */
    EXPECT_BROKEN(g, "%9: matmul: input 0 is %9");
    arena_free(&ar);
    g = small_graph(&ar);
    graph_node(g, 10)->nin = 1; /* add with one input */
    EXPECT_BROKEN(g, "takes 2 inputs, has 1");
    arena_free(&ar);
}

static void test_verify_matmul(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    graph_node(g, 1)->shape[0] = 9; /* w [9, 16]: inner dimensions 8 and 9 */
    EXPECT_BROKEN(g, "inner dimensions differ");
    arena_free(&ar);
    g = small_graph(&ar);
    graph_node(g, 9)->shape[2] = 17; /* result [2, 4, 17] */
    EXPECT_BROKEN(g, "%9: matmul: result is f32[2, 4, 17] but the matmul gives f32[2, 4, 16]");
    arena_free(&ar);
}

static void test_verify_broadcast_and_dtype(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    graph_node(g, 2)->shape[0] = 5; /* bias [5] against [2, 4, 16] */
    EXPECT_BROKEN(g, "do not broadcast");
    arena_free(&ar);
    g = small_graph(&ar);
    int i = add0(g, G_CONST, DT_I32, 0, NULL);
    add2(g, G_ADD, DT_F32, 3, SHAPE(2, 4, 16), 10, i); /* f32 + i32 without a cast */
    EXPECT_BROKEN(g, "the inputs differ in dtype");
    arena_free(&ar);
    g = small_graph(&ar);
    add2(g, G_LT, DT_F32, 3, SHAPE(2, 4, 16), 10, 10); /* a comparison must give bool */
    EXPECT_BROKEN(g, "the result is f32, expected bool");
    arena_free(&ar);
}

static void test_verify_reshape_slice_gather(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    add1(g, G_RESHAPE, DT_F32, 2, SHAPE(8, 15), 10); /* 128 elements into 120 */
    EXPECT_BROKEN(g, "has 128 elements but f32[8, 15] has 120");
    arena_free(&ar);
    g = small_graph(&ar);
    int s = add1(g, G_SLICE, DT_F32, 3, SHAPE(2, 4, 4), 10);
    graph_node(g, s)->iattr[0] = 2;
    graph_node(g, s)->iattr[1] = 14;
    graph_node(g, s)->iattr[2] = 18; /* past the end of 16 */
    EXPECT_BROKEN(g, "[14, 18) is out of range for dimension 2");
    arena_free(&ar);
    g = small_graph(&ar);
    s = add1(g, G_SLICE, DT_F32, 3, SHAPE(2, 4, 4), 10);
    graph_node(g, s)->iattr[0] = 2;
    graph_node(g, s)->iattr[1] = 0;
    graph_node(g, s)->iattr[2] = 5; /* 5 wide, result says 4 */
    EXPECT_BROKEN(g, "but the slice gives f32[2, 4, 5]");
    arena_free(&ar);
    g = small_graph(&ar);
    int fidx = add0(g, G_INPUT, DT_F32, 2, SHAPE(2, 4));
    graph_node(g, fidx)->name = "data.f";
    add2(g, G_GATHER, DT_F32, 3, SHAPE(2, 4, 8), 0, fidx); /* a float index */
    EXPECT_BROKEN(g, "the index is f32, expected i32");
    arena_free(&ar);
}

static void test_verify_reductions(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    int r = add1(g, G_SUM, DT_F32, 2, SHAPE(2, 16), 10);
    graph_node(g, r)->iattr[0] = 2; /* sums axis 2 of [2, 4, 16]: [2, 4], not [2, 16] */
    EXPECT_BROKEN(g, "result is f32[2, 16] but the reduction gives f32[2, 4]");
    arena_free(&ar);
    g = small_graph(&ar);
    r = add1(g, G_MEAN, DT_F32, 3, SHAPE(2, 4, 16), 10);
    graph_node(g, r)->iattr[0] = -1;
    graph_node(g, r)->iattr[1] = 0; /* all without keepdim: rank 0 */
    EXPECT_BROKEN(g, "but the reduction gives f32[]");
    arena_free(&ar);
    g = small_graph(&ar);
    r = add1(g, G_MAX, DT_F32, 2, SHAPE(2, 4), 10);
    graph_node(g, r)->iattr[0] = 3;
    EXPECT_BROKEN(g, "axis 3 is out of range for rank 3");
    arena_free(&ar);
}

static void test_verify_composites(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    graph_node(g, 3)->shape[0] = 7; /* layernorm weight [7] for x [..., 8] */
    EXPECT_BROKEN(g, "the weight is f32[7] but x's last dimension is 8");
    arena_free(&ar);
    g = small_graph(&ar);
    graph_node(g, 6)->shape[1] = 5; /* targets [2, 5] for logits [2, 4, 16] */
    EXPECT_BROKEN(g, "do not match logits");
    arena_free(&ar);
    g = small_graph(&ar);
    int q = add1(g, G_RESHAPE, DT_F32, 4, SHAPE(2, 3, 4, 8), 9);
    int k = add1(g, G_RESHAPE, DT_F32, 4, SHAPE(2, 2, 4, 12), 9);
    int a = graph_add(g, G_ATTENTION, DT_F32, 4, SHAPE(2, 3, 4, 12), 3, INS(q, k, k), span_none());
    graph_node(g, a)->fattr[0] = 0.3;
    EXPECT_BROKEN(g, "in batch or head size");
    arena_free(&ar);
}

static void test_verify_backward(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    int one = add0(g, G_CONST, DT_F32, 0, NULL);
    int d = graph_add(g, G_CROSS_ENTROPY_BWD, DT_F32, 3, SHAPE(2, 4, 15), 3, INS(one, 10, 6), span_none());
    (void)d; /* dlogits must have the logits' shape [2, 4, 16] */
    EXPECT_BROKEN(g, "cross_entropy_bwd: result is f32[2, 4, 15] but the logits gives f32[2, 4, 16]");
    arena_free(&ar);
    g = small_graph(&ar);
    int dx = graph_add(g, G_LAYERNORM_BWD_X, DT_F32, 3, SHAPE(2, 4, 8), 3, INS(8, 7, 3), span_none());
    graph_node(g, dx)->fattr[0] = 1e-5;
    int dw = add2(g, G_LAYERNORM_BWD_W, DT_F32, 1, SHAPE(4), 8, 7); /* dweight [4], x's last dim is 8 */
    graph_node(g, dw)->fattr[0] = 1e-5;
    EXPECT_BROKEN(g, "layernorm_bwd_w: result is f32[4]");
    arena_free(&ar);
    g = small_graph(&ar);
    int q = add1(g, G_RESHAPE, DT_F32, 4, SHAPE(2, 2, 4, 16), 9);
    int k = add1(g, G_RESHAPE, DT_F32, 4, SHAPE(2, 1, 4, 32), 10);
    int kk = add1(g, G_RESHAPE, DT_F32, 4, SHAPE(2, 1, 8, 16), 9);
    int a = graph_add(g, G_ATTENTION, DT_F32, 4, SHAPE(2, 2, 4, 16), 3, INS(q, kk, kk), span_none());
    graph_node(g, a)->fattr[0] = 0.25;
    (void)k;
    /* d k must have k's shape [2, 1, 8, 16]; this one claims q's */
    int b = graph_add(g, G_ATTENTION_BWD_K, DT_F32, 4, SHAPE(2, 2, 4, 16), 4, INS(a, q, kk, kk), span_none());
    graph_node(g, b)->fattr[0] = 0.25;
    EXPECT_BROKEN(g, "attention_bwd_k: result is f32[2, 2, 4, 16] but k gives f32[2, 1, 8, 16]");
    arena_free(&ar);
    g = small_graph(&ar);
    add2(g, G_SCATTER_ADD, DT_F32, 2, SHAPE(16, 8), 10, 5); /* rows [2, 4, 16] into [16, 8] */
    EXPECT_BROKEN(g, "do not match the index");
    arena_free(&ar);
}

static void test_verify_graph_level(void) {
    Arena ar = {0};
    Graph *g = small_graph(&ar);
    graph_node(g, 1)->name = NULL;
    EXPECT_BROKEN(g, "a parameter without a name");
    arena_free(&ar);
    g = small_graph(&ar);
    graph_node(g, 2)->name = "w";
    EXPECT_BROKEN(g, "are both named 'w'");
    arena_free(&ar);
    g = small_graph(&ar);
    g->loss = 10; /* [2, 4, 16] */
    EXPECT_BROKEN(g, "the loss %10 is f32[2, 4, 16], not a float scalar");
    arena_free(&ar);
    g = small_graph(&ar);
    g->nparams = 4;
    EXPECT_BROKEN(g, "5 parameter nodes but 4 listed");
    arena_free(&ar);
    g = small_graph(&ar);
    int *grads = arena_alloc(&ar, sizeof(int) * 5);
    for (int i = 0; i < 5; i++) grads[i] = g->params[i];
    grads[2] = 1; /* the gradient of b [16] claimed to be w [8, 16] */
    g->grads = grads;
    EXPECT_BROKEN(g, "the gradient %1 of %2 is f32[8, 16], not f32[16]");
    arena_free(&ar);
    g = small_graph(&ar);
    graph_node(g, 7)->shape[1] = 0;
    EXPECT_BROKEN(g, "dimension 1 is 0, not positive");
    arena_free(&ar);
}

int main(void) {
    RUN(test_add_and_numel);
    RUN(test_op_names);
    RUN(test_print);
    RUN(test_verify_small_ok);
    RUN(test_verify_every_op_ok);
    RUN(test_verify_input_order);
    RUN(test_verify_matmul);
    RUN(test_verify_broadcast_and_dtype);
    RUN(test_verify_reshape_slice_gather);
    RUN(test_verify_reductions);
    RUN(test_verify_composites);
    RUN(test_verify_backward);
    RUN(test_verify_graph_level);
    return unit_finish();
}
