/* test_ref.c - unit tests of the reference evaluator (compiler/ref.c): every forward op.
 *
 * Build: make build/tests/test_ref (links build/libmbtc.a; needs ref_bwd.c's ref_eval_bwd).
 * Prints `PASS name` or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure.
 *
 * The graphs are built here by filling GNode structs directly (nothing of graph.c is used), run
 * with ref_run, and each result is held against values worked out by hand or by an independent
 * formula written out in the test: naive loops over padded shapes instead of ref_bcast_index,
 * softmax without max subtraction on small inputs, attention as an explicit score matrix with
 * a -inf mask, and so on. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "unit.h"
#include "ref.h"

/* ---- building graphs by hand ---------------------------------------------------------------- */

#define MAXN 64
static Arena ar;
static Graph G;
static GNode nodes[MAXN];
static GNode *nodeptr[MAXN];
static double *leaf[MAXN];

static void reset(void) {
    arena_free(&ar);
    memset(&G, 0, sizeof G);
    memset(nodes, 0, sizeof nodes);
    memset(leaf, 0, sizeof leaf);
    G.ar = &ar;
    G.node = nodeptr;
    G.cap = MAXN;
    G.loss = -1;
}

/* Appends a node with the given shape and inputs; attributes are set on the result after. */
static int add(GOp op, DType dt, int rank, const int64_t *shape, int nin, const int *in) {
    if (G.n >= MAXN) {
        fprintf(stderr, "test_ref: too many nodes\n");
        exit(1);
    }
    int id = G.n++;
    GNode *n = &nodes[id];
    memset(n, 0, sizeof *n);
    n->id = id;
    n->op = op;
    n->dt = dt;
    n->rank = rank;
    for (int d = 0; d < rank; d++) n->shape[d] = shape[d];
    n->nin = nin;
    for (int k = 0; k < nin; k++) n->in[k] = in[k];
    n->src = span_none();
    nodeptr[id] = n;
    return id;
}

static GNode *N(int id) { return &nodes[id]; }

#define SHAPE(...)                                                                                                               \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) { __VA_ARGS__ }
#define SCALAR 0, NULL
#define INS(...)                                                                                                                 \
    (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (const int[]) { __VA_ARGS__ }

/* A G_INPUT leaf holding data (not copied: it must outlive the run). */
static int input(DType dt, int rank, const int64_t *shape, double *data) {
    int id = add(G_INPUT, dt, rank, shape, 0, NULL);
    N(id)->name = "data.x";
    leaf[id] = data;
    return id;
}

static double **run(void) { return ref_run(&G, leaf, &ar); }

static int64_t numel_of(int id) {
    int64_t p = 1;
    for (int d = 0; d < N(id)->rank; d++) p *= N(id)->shape[d];
    return p;
}

/* ---- numbers -------------------------------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static double rnd(void) { /* xorshift64, uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static double *rnd_fill(double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = rnd();
    return v;
}

static int near(double got, double want, double tol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

#define TOL 1e-12

/* The first element of got that differs from want, reported at the caller's line. */
static void check_arr_at(const char *file, int line, const char *what, const double *got, const double *want, int64_t n,
                         double tol) {
    if (!got) {
        unit_fail_at(file, line, "%s: no result", what);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!near(got[i], want[i], tol)) {
            unit_fail_at(file, line, "%s[%lld]: got %.17g, want %.17g", what, (long long)i, got[i], want[i]);
            return;
        }
    }
}
#define CHECK_ARR(got, want, n, tol, what) check_arr_at(__FILE__, __LINE__, (what), (got), (want), (n), (tol))
#define REQUIRE_RUN(v)                                                                                                           \
    do {                                                                                                                         \
        if (!(v)) {                                                                                                              \
            CHECK(0, "ref_run failed");                                                                                          \
            return;                                                                                                              \
        }                                                                                                                        \
    } while (0)
#define CHECK_NEAR(got, want, tol, what)                                                                                         \
    do {                                                                                                                         \
        double w_[1] = {(want)}, g_[1] = {(got)};                                                                                \
        check_arr_at(__FILE__, __LINE__, (what), g_, w_, 1, (tol));                                                              \
    } while (0)

/* Right-aligned shapes padded with leading 1s to rank 4, and the flat index of a 4-d
 * coordinate in such a shape (size-1 axes read index 0): the test's own broadcasting. */
static void pad4(int rank, const int64_t *shape, int64_t out[4]) {
    for (int d = 0; d < 4; d++) out[d] = 1;
    for (int d = 0; d < rank; d++) out[4 - rank + d] = shape[d];
}
static int64_t flat4(const int64_t s[4], int64_t a, int64_t b, int64_t c, int64_t d) {
    if (s[0] == 1) a = 0;
    if (s[1] == 1) b = 0;
    if (s[2] == 1) c = 0;
    if (s[3] == 1) d = 0;
    return ((a * s[1] + b) * s[2] + c) * s[3] + d;
}

/* ---- indexing, leaves, constants ------------------------------------------------------------ */

static void test_bcast_index(void) {
    int64_t o23[] = {2, 3}, o234[] = {2, 3, 4};
    CHECK(ref_bcast_index(2, o23, 4, 1, (int64_t[]){3}) == 1, "[2,3] -> [3]");
    CHECK(ref_bcast_index(2, o23, 4, 2, (int64_t[]){2, 1}) == 1, "[2,3] -> [2,1]");
    CHECK(ref_bcast_index(2, o23, 5, 2, (int64_t[]){1, 3}) == 2, "[2,3] -> [1,3]");
    CHECK(ref_bcast_index(2, o23, 5, 0, NULL) == 0, "[2,3] -> []");
    CHECK(ref_bcast_index(2, o23, 5, 2, o23) == 5, "same shape is the identity");
    CHECK(ref_bcast_index(3, o234, 23, 2, (int64_t[]){3, 1}) == 2, "[2,3,4] -> [3,1]");
    CHECK(ref_bcast_index(3, o234, 23, 3, (int64_t[]){2, 1, 4}) == 7, "[2,3,4] -> [2,1,4]");
    CHECK(ref_bcast_index(3, o234, 13, 1, (int64_t[]){1}) == 0, "[2,3,4] -> [1]");
    /* sum_to's direction: a larger-rank "input" whose extra leading axes are 1 */
    CHECK(ref_bcast_index(2, o23, 4, 3, (int64_t[]){1, 2, 3}) == 4, "[2,3] -> [1,2,3]");
}

static void test_leaves_and_constants(void) {
    reset();
    double xv[] = {1, -2, 3.5, 4};
    int x = input(DT_F32, SHAPE(2, 2), xv);
    int w = add(G_PARAM, DT_F32, SHAPE(3), SCALAR);
    N(w)->name = "w";
    double wv[] = {7, 8, 9};
    leaf[w] = wv;
    int ones = add(G_PARAM, DT_F32, SHAPE(2), SCALAR);
    N(ones)->iattr[0] = GI_ONES;
    int zeros = add(G_PARAM, DT_F32, SHAPE(2), SCALAR);
    N(zeros)->iattr[0] = GI_ZEROS;
    int cst = add(G_PARAM, DT_F32, SHAPE(2), SCALAR);
    N(cst)->iattr[0] = GI_CONSTANT;
    N(cst)->fattr[0] = 2.5;
    int c = add(G_CONST, DT_F32, SHAPE(2, 3), SCALAR);
    N(c)->fattr[0] = -0.75;
    int c0 = add(G_CONST, DT_F32, SCALAR, SCALAR);
    N(c0)->fattr[0] = 3;
    int ar5 = add(G_ARANGE, DT_I32, SHAPE(5), SCALAR);
    double **v = run();
    CHECK(v != NULL, "ref_run failed");
    if (!v) return;
    CHECK(v[x] != xv, "the input is copied, not aliased");
    CHECK_ARR(v[x], xv, 4, 0, "input");
    CHECK_ARR(v[w], wv, 3, 0, "param from leaves");
    CHECK_ARR(v[ones], ((double[]){1, 1}), 2, 0, "GI_ONES");
    CHECK_ARR(v[zeros], ((double[]){0, 0}), 2, 0, "GI_ZEROS");
    CHECK_ARR(v[cst], ((double[]){2.5, 2.5}), 2, 0, "GI_CONSTANT");
    CHECK_ARR(v[c], ((double[]){-0.75, -0.75, -0.75, -0.75, -0.75, -0.75}), 6, 0, "const");
    CHECK_ARR(v[c0], ((double[]){3}), 1, 0, "rank-0 const");
    CHECK_ARR(v[ar5], ((double[]){0, 1, 2, 3, 4}), 5, 0, "arange");
}

static void test_missing_leaf(void) {
    reset();
    int w = add(G_PARAM, DT_F32, SHAPE(2), SCALAR);
    N(w)->name = "h.0.w";
    N(w)->iattr[0] = GI_NORMAL;
    capture_begin();
    double **v = run();
    const char *err = capture_end();
    CHECK(v == NULL, "a missing normal-initialised parameter must fail");
    CHECK(strstr(err, "no values given for parameter 'h.0.w'") != NULL, "message: %s", err);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

static double gelu_formula(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * pow(x, 3))));
}

static void test_unary(void) {
    double xs[] = {-40, -3, -0.5, 0, 0.25, 1, 2, 40};
    enum { NX = 8 };
    struct {
        GOp op;
        double (*f)(double);
    } fs[] = {
        {G_EXP, exp}, {G_TANH, tanh}, {G_SIN, sin}, {G_COS, cos}, {G_ABS, fabs}, {G_FLOOR, floor}, {G_GELU, gelu_formula},
    };
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        reset();
        int x = input(DT_F32, SHAPE(NX), xs);
        int y = add(fs[k].op, DT_F32, SHAPE(NX), INS(x));
        double **v = run();
        double want[NX];
        for (int i = 0; i < NX; i++) want[i] = fs[k].f(xs[i]);
        CHECK_ARR(v ? v[y] : NULL, want, NX, TOL, "libm op");
    }
    double want[NX];
    /* the rest by their formulas */
    struct {
        GOp op;
    } rest[] = {{G_NEG}, {G_SIGMOID}, {G_RELU}, {G_SILU}, {G_SIGN}, {G_NOT}};
    for (size_t k = 0; k < sizeof rest / sizeof rest[0]; k++) {
        reset();
        int x = input(DT_F32, SHAPE(NX), xs);
        int y = add(rest[k].op, DT_F32, SHAPE(NX), INS(x));
        double **v = run();
        for (int i = 0; i < NX; i++) {
            double t = xs[i];
            switch (rest[k].op) {
            case G_NEG: want[i] = -t; break;
            case G_SIGMOID: want[i] = 1 / (1 + exp(-t)); break;
            case G_RELU: want[i] = t > 0 ? t : 0; break;
            case G_SILU: want[i] = t / (1 + exp(-t)); break;
            case G_SIGN: want[i] = t > 0 ? 1 : t < 0 ? -1 : 0; break;
            case G_NOT: want[i] = t == 0; break;
            default: break;
            }
        }
        CHECK_ARR(v ? v[y] : NULL, want, NX, TOL, "op by formula");
    }
    /* log, sqrt, rsqrt on positive numbers */
    double ps[] = {1e-8, 0.25, 1, 2, 1e8};
    GOp pops[] = {G_LOG, G_SQRT, G_RSQRT};
    for (int k = 0; k < 3; k++) {
        reset();
        int x = input(DT_F32, SHAPE(5), ps);
        int y = add(pops[k], DT_F32, SHAPE(5), INS(x));
        double **v = run();
        for (int i = 0; i < 5; i++) want[i] = pops[k] == G_LOG ? log(ps[i]) : pops[k] == G_SQRT ? sqrt(ps[i]) : 1 / sqrt(ps[i]);
        CHECK_ARR(v ? v[y] : NULL, want, 5, TOL, "log/sqrt/rsqrt");
    }
}

static void test_unary_extremes(void) {
    reset();
    double xs[] = {-800, 800, NAN};
    int x = input(DT_F32, SHAPE(3), xs);
    int sg = add(G_SIGMOID, DT_F32, SHAPE(3), INS(x));
    int si = add(G_SILU, DT_F32, SHAPE(3), INS(x));
    int re = add(G_RELU, DT_F32, SHAPE(3), INS(x));
    int ge = add(G_GELU, DT_F32, SHAPE(3), INS(x));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[sg], ((double[]){0, 1, NAN}), 3, 0, "sigmoid saturates without NaN");
    CHECK_ARR(v[si], ((double[]){-0.0, 800, NAN}), 3, 0, "silu saturates");
    CHECK_ARR(v[re], ((double[]){0, 800, NAN}), 3, 0, "relu propagates NaN");
    CHECK_ARR(v[ge], ((double[]){0, 800, NAN}), 3, 0, "gelu saturates");
}

static void test_cast(void) {
    reset();
    double xs[] = {-2.7, 2.7, -0.5, 3, 0, NAN};
    int x = input(DT_F32, SHAPE(6), xs);
    int i32 = add(G_CAST, DT_I32, SHAPE(6), INS(x));
    int i64 = add(G_CAST, DT_I64, SHAPE(6), INS(x));
    int b = add(G_CAST, DT_BOOL, SHAPE(6), INS(x));
    int f = add(G_CAST, DT_BF16, SHAPE(6), INS(x));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[i32], ((double[]){-2, 2, 0, 3, 0, NAN}), 6, 0, "to i32 truncates toward zero");
    CHECK_ARR(v[i64], ((double[]){-2, 2, 0, 3, 0}), 5, 0, "to i64 truncates toward zero");
    CHECK_ARR(v[b], ((double[]){1, 1, 1, 1, 0, 1}), 6, 0, "to bool is != 0 (NaN is true)");
    CHECK_ARR(v[f], ((double[]){-2.703125, 2.703125, -0.5, 3, 0, NAN}), 6, 0, "to bf16 rounds");
}

/* Casts to bf16 and f16 round straight from double: to nearest, ties to even, subnormals, and
 * infinity past the largest finite value plus half an ulp. */
static void test_cast_half(void) {
    reset();
    double bs[] = {1 + 0x1p-8, 1 + 3 * 0x1p-8, 0x1.ffp127, -0x1.fe8p127, 0x1p-134, 3 * 0x1p-134, 1e39, -0.0};
    double hs[] = {65519, 65520, 0x1p-25, 3 * 0x1p-25, 1 + 0x1p-11, 0.1, -70000, 0x1p-24};
    int xb = input(DT_F32, SHAPE(8), bs), xh = input(DT_F32, SHAPE(8), hs);
    int b = add(G_CAST, DT_BF16, SHAPE(8), INS(xb));
    int h = add(G_CAST, DT_F16, SHAPE(8), INS(xh));
    int f = add(G_CAST, DT_F32, SHAPE(8), INS(xb));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[b], ((double[]){1, 1 + 0x1p-6, INFINITY, -0x1.fep127, 0, 0x1p-132, INFINITY, -0.0}), 8, 0,
              "to bf16: ties to even, overflow, subnormal ties");
    CHECK_ARR(v[h], ((double[]){65504, INFINITY, 0, 0x1p-23, 1, 0.0999755859375, -INFINITY, 0x1p-24}), 8, 0,
              "to f16: ties to even, overflow, subnormals");
    CHECK_ARR(v[f], bs, 8, 0, "to f32 is the identity");
}

static void test_clamp(void) {
    reset();
    double xs[] = {-2, 0.5, 3, -1, 1, NAN};
    int x = input(DT_F32, SHAPE(6), xs);
    int y = add(G_CLAMP, DT_F32, SHAPE(6), INS(x));
    N(y)->fattr[0] = -1;
    N(y)->fattr[1] = 1;
    double **v = run();
    CHECK_ARR(v ? v[y] : NULL, ((double[]){-1, 0.5, 1, -1, 1, NAN}), 6, 0, "clamp");
}

/* Philox4x32-10 against the Random123 distribution's known answers (the vectors test_rt_rng.c
 * holds the runtime's rt_philox4x32 to): ref.c's copy computes what the runtime computes. */
static void test_philox(void) {
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[3] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        ref_philox4x32(kat[k].ctr, kat[k].key, out);
        for (int w = 0; w < 4; w++)
            CHECK(out[w] == kat[k].out[w], "vector %d word %d: %08x, want %08x", k, w, out[w], kat[k].out[w]);
    }
}

/* The documented draw (graph.h, GRAPH_RNG_WORDS), written out again: keep when the top 24 bits of
 * word 0 of Philox(counter {i, stream, step, micro}, key {seed_lo, seed_hi ^ "drop"}) reach p 2^24. */
static int documented_keep(uint64_t seed, uint32_t step, uint32_t micro, uint32_t stream, uint32_t i, double p) {
    uint32_t ctr[4] = {i, stream, step, micro}, key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x64726f70u}, out[4];
    ref_philox4x32(ctr, key, out);
    return (out[0] >> 8) >= (uint32_t)ceil(p * 16777216.0);
}

/* dropout(x) over M ones under key k, with stream and p. */
static double *dropout_of(double *ones, int M, const double k[GRAPH_RNG_WORDS], int64_t stream, double p, Arena *a) {
    reset();
    int x = input(DT_F32, SHAPE(M), ones);
    static double key[GRAPH_RNG_WORDS];
    memcpy(key, k, sizeof key);
    int r = add(G_INPUT, DT_I64, SHAPE(GRAPH_RNG_WORDS), 0, NULL);
    N(r)->name = GRAPH_RNG_NAME;
    leaf[r] = key;
    int d = add(G_DROPOUT, DT_F32, SHAPE(M), INS(x, r));
    N(d)->fattr[0] = p;
    N(d)->iattr[0] = stream;
    double **v = run();
    if (!v) return NULL;
    double *out = arena_alloc(a, sizeof(double) * (size_t)M);
    memcpy(out, v[d], sizeof(double) * (size_t)M);
    return out;
}

static void test_dropout(void) {
    enum { M = 20000 };
    static double ones[M];
    for (int i = 0; i < M; i++) ones[i] = 1;
    Arena a = {0};
    const uint64_t seed = 0x123456789abcdefull;
    const double base[GRAPH_RNG_WORDS] = {(double)(uint32_t)seed, (double)(uint32_t)(seed >> 32), 3, 1, 1};
    double k[GRAPH_RNG_WORDS];
    double *d1 = dropout_of(ones, M, base, 7, 0.25, &a), *d2 = dropout_of(ones, M, base, 7, 0.25, &a);
    double *d0 = dropout_of(ones, M, base, 5, 0, &a), *d3 = dropout_of(ones, M, base, 8, 0.25, &a);
    memcpy(k, base, sizeof k), k[2] = 4;
    double *step = dropout_of(ones, M, k, 7, 0.25, &a);
    memcpy(k, base, sizeof k), k[3] = 0;
    double *micro = dropout_of(ones, M, k, 7, 0.25, &a);
    memcpy(k, base, sizeof k), k[0] += 1;
    double *seed2 = dropout_of(ones, M, k, 7, 0.25, &a);
    memcpy(k, base, sizeof k), k[4] = 0;
    double *off = dropout_of(ones, M, k, 7, 0.25, &a);
    REQUIRE_RUN(d1 && d2 && d0 && d3 && step && micro && seed2 && off);
    CHECK_ARR(d0, ones, M, 0, "p = 0 is the identity");
    CHECK_ARR(off, ones, M, 0, "the key's word on = 0 (evaluation) is the identity");
    int64_t kept = 0;
    double sum = 0;
    for (int i = 0; i < M; i++) {
        double y = d1[i];
        CHECK(y == 0 || y == 1 / 0.75, "element %d is %g, neither 0 nor 1/(1-p)", i, y);
        kept += y != 0;
        sum += y;
        if (i < 4096)
            CHECK((y != 0) == documented_keep(seed, 3, 1, 7, (uint32_t)i, 0.25), "element %d disagrees with the documented draw",
                  i);
    }
    CHECK(fabs((double)kept / M - 0.75) < 0.02, "kept fraction %g, want about 0.75", (double)kept / M);
    CHECK(fabs(sum / M - 1) < 0.03, "mean %g, want about 1 (expectation preserved)", sum / M);
    CHECK_ARR(d2, d1, M, 0, "same key and stream, same mask");
    const double *other[4] = {d3, step, micro, seed2};
    static const char *const what[4] = {"another stream", "another step", "another micro-batch", "another seed"};
    for (int o = 0; o < 4; o++) {
        int64_t differ = 0;
        for (int i = 0; i < M; i++) differ += (d1[i] != 0) != (other[o][i] != 0);
        /* independent masks of keep rate 0.75 differ at 2 x 0.75 x 0.25 = 37.5% of the elements */
        CHECK(differ > M / 4 && differ < M / 2, "%s should give an independent mask (%lld of %d differ)", what[o],
              (long long)differ, M);
    }
    arena_free(&a);
}

/* ---- binary ops and broadcasting ------------------------------------------------------------ */

static double binary_formula(GOp op, double a, double b) {
    switch (op) {
    case G_ADD: return a + b;
    case G_SUB: return a - b;
    case G_MUL: return a * b;
    case G_DIV: return a / b;
    case G_POW: return pow(a, b);
    case G_MOD: return a - b * floor(a / b);
    case G_MAX2: return a > b ? a : b;
    case G_MIN2: return a < b ? a : b;
    case G_EQ: return a == b;
    case G_NE: return a != b;
    case G_LT: return a < b;
    case G_LE: return a <= b;
    case G_GT: return a > b;
    case G_GE: return a >= b;
    case G_AND: return a != 0 && b != 0;
    case G_OR: return a != 0 || b != 0;
    default: return NAN;
    }
}

static void test_binary_broadcast(void) {
    static const GOp ops[] = {G_ADD, G_SUB, G_MUL, G_DIV, G_POW, G_MOD, G_MAX2, G_MIN2,
                              G_EQ,  G_NE,  G_LT,  G_LE,  G_GT,  G_GE,  G_AND,  G_OR};
    static const char *names[] = {"add", "sub", "mul", "div", "pow", "mod", "max2", "min2",
                                  "eq",  "ne",  "lt",  "le",  "gt",  "ge",  "and",  "or"};
    struct {
        int ra;
        int64_t a[3];
        int rb;
        int64_t b[3];
        int ro;
        int64_t o[3];
    } cases[] = {
        {2, {2, 3}, 1, {3}, 2, {2, 3}}, {2, {2, 1}, 2, {1, 3}, 2, {2, 3}},          {0, {0}, 2, {2, 3}, 2, {2, 3}},
        {2, {2, 3}, 0, {0}, 2, {2, 3}}, {3, {2, 3, 1}, 1, {4}, 3, {2, 3, 4}},       {1, {1}, 1, {3}, 1, {3}},
        {0, {0}, 0, {0}, 0, {0}},       {3, {1, 3, 1}, 3, {2, 1, 2}, 3, {2, 3, 2}},
    };
    /* small integers and halves, zeros and repeats: comparisons tie, mod and pow are exact */
    double pool[] = {2, -3, 0.5, 0, 4, -1.5, 2, 3, -2, 1, 0, 5, -0.5, 6, 2, -4, 3, 1, 0.5, -2, 7, 2, 1, 3};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            reset();
            double av[24], bv[24];
            for (int i = 0; i < 24; i++) {
                av[i] = pool[i];
                bv[i] = pool[(i * 7 + 3) % 24];
            }
            int a = input(DT_F32, cases[c].ra, cases[c].a, av);
            int b = input(DT_F32, cases[c].rb, cases[c].b, bv);
            int y = add(ops[k], DT_F32, cases[c].ro, cases[c].o, INS(a, b));
            double **v = run();
            int64_t sa[4], sb[4], so[4];
            pad4(cases[c].ra, cases[c].a, sa);
            pad4(cases[c].rb, cases[c].b, sb);
            pad4(cases[c].ro, cases[c].o, so);
            double want[64];
            int64_t i = 0;
            for (int64_t p = 0; p < so[0]; p++)
                for (int64_t q = 0; q < so[1]; q++)
                    for (int64_t r = 0; r < so[2]; r++)
                        for (int64_t s = 0; s < so[3]; s++)
                            want[i++] = binary_formula(ops[k], av[flat4(sa, p, q, r, s)], bv[flat4(sb, p, q, r, s)]);
            char what[64];
            snprintf(what, sizeof what, "%s, shapes case %zu", names[k], c);
            CHECK_ARR(v ? v[y] : NULL, want, i, TOL, what);
        }
    }
}

static void test_mod_sign(void) {
    reset();
    double a[] = {5, -5, 5, -5, 5.5, -5.5, 6, -6, 1};
    double b[] = {3, 3, -3, -3, 2, 2, 3, -3, 0};
    int x = input(DT_F32, SHAPE(9), a);
    int y = input(DT_F32, SHAPE(9), b);
    int m = add(G_MOD, DT_F32, SHAPE(9), INS(x, y));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[m], ((double[]){2, 1, -1, -2, 1.5, 0.5, 0, 0, NAN}), 9, 0, "mod takes the divisor's sign");
    CHECK(!signbit(v[m][6]) && signbit(v[m][7]), "a zero remainder has the divisor's sign, as in NumPy");
}

static void test_minmax_nan(void) {
    reset();
    double a[] = {NAN, 1, 2};
    double b[] = {1, NAN, 3};
    int x = input(DT_F32, SHAPE(3), a);
    int y = input(DT_F32, SHAPE(3), b);
    int mx = add(G_MAX2, DT_F32, SHAPE(3), INS(x, y));
    int mn = add(G_MIN2, DT_F32, SHAPE(3), INS(x, y));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[mx], ((double[]){NAN, NAN, 3}), 3, 0, "max propagates NaN");
    CHECK_ARR(v[mn], ((double[]){NAN, NAN, 2}), 3, 0, "min propagates NaN");
}

static void test_where(void) {
    reset();
    double cv[] = {1, 0}, av[] = {10, 20, 30}, bv[] = {-1};
    int c = input(DT_BOOL, SHAPE(2, 1), cv);
    int a = input(DT_F32, SHAPE(3), av);
    int b = input(DT_F32, SCALAR, bv);
    int y = add(G_WHERE, DT_F32, SHAPE(2, 3), INS(c, a, b));
    double **v = run();
    CHECK_ARR(v ? v[y] : NULL, ((double[]){10, 20, 30, -1, -1, -1}), 6, 0, "where");
}

/* ---- reductions ----------------------------------------------------------------------------- */

static void test_reductions(void) {
    static const GOp ops[] = {G_SUM, G_MEAN, G_MAX, G_MIN, G_LOGSUMEXP};
    static const char *names[] = {"sum", "mean", "max", "min", "logsumexp"};
    double xv[24];
    rnd_fill(xv, 24);
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        for (int axis = -1; axis < 3; axis++) {
            for (int keep = 0; keep < 2; keep++) {
                reset();
                int64_t in[3] = {2, 3, 4}, os[3];
                int orank = 0;
                for (int d = 0; d < 3; d++) {
                    if (axis == -1 || d == axis) {
                        if (keep) os[orank++] = 1;
                    } else {
                        os[orank++] = in[d];
                    }
                }
                int x = input(DT_F32, 3, in, xv);
                int y = add(ops[k], DT_F32, orank, os, INS(x));
                N(y)->iattr[0] = axis;
                N(y)->iattr[1] = keep;
                double **v = run();
                /* expected: accumulate every element into its output slot */
                double acc[24], cnt[24];
                int64_t nout = numel_of(y);
                for (int64_t o = 0; o < nout; o++) {
                    acc[o] = ops[k] == G_MAX ? -INFINITY : ops[k] == G_MIN ? INFINITY : 0;
                    cnt[o] = 0;
                }
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 3; j++)
                        for (int l = 0; l < 4; l++) {
                            int64_t o = axis == -1 ? 0 : axis == 0 ? j * 4 + l : axis == 1 ? i * 4 + l : i * 3 + j;
                            double t = xv[(i * 3 + j) * 4 + l];
                            if (ops[k] == G_MAX) acc[o] = fmax(acc[o], t);
                            else if (ops[k] == G_MIN) acc[o] = fmin(acc[o], t);
                            else if (ops[k] == G_LOGSUMEXP) acc[o] += exp(t);
                            else acc[o] += t;
                            cnt[o]++;
                        }
                for (int64_t o = 0; o < nout; o++) {
                    if (ops[k] == G_MEAN) acc[o] /= cnt[o];
                    if (ops[k] == G_LOGSUMEXP) acc[o] = log(acc[o]);
                }
                char what[64];
                snprintf(what, sizeof what, "%s axis %d keepdim %d", names[k], axis, keep);
                CHECK_ARR(v ? v[y] : NULL, acc, nout, TOL, what);
            }
        }
    }
}

static void test_logsumexp_stable(void) {
    reset();
    double xv[] = {1000, 1000, -1000, -INFINITY, -INFINITY, -INFINITY};
    int x = input(DT_F32, SHAPE(2, 3), xv);
    int y = add(G_LOGSUMEXP, DT_F32, SHAPE(2), INS(x));
    N(y)->iattr[0] = 1;
    double **v = run();
    CHECK_ARR(v ? v[y] : NULL, ((double[]){1000 + log(2.0), -INFINITY}), 2, TOL, "logsumexp of large / all -inf rows");
}

static void test_norm(void) {
    reset();
    double a[] = {3, 4, 0, 0}, b[] = {3e200, -4e200}, z[] = {0, 0, 0};
    int x = input(DT_F32, SHAPE(2, 2), a);
    int y = input(DT_F32, SHAPE(2), b);
    int w = input(DT_F32, SHAPE(3), z);
    int nx = add(G_NORM, DT_F32, SCALAR, INS(x));
    int ny = add(G_NORM, DT_F32, SCALAR, INS(y));
    int nw = add(G_NORM, DT_F32, SCALAR, INS(w));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_NEAR(v[nx][0], 5, TOL, "norm");
    CHECK_NEAR(v[ny][0], 5e200, TOL, "norm of huge values does not overflow");
    CHECK_NEAR(v[nw][0], 0, 0, "norm of zeros");
}

static void test_sum_to(void) {
    double xv[24];
    rnd_fill(xv, 24);
    struct {
        int r;
        int64_t s[3];
    } outs[] = {{2, {3, 1}}, {1, {4}}, {0, {0}}, {3, {2, 1, 4}}, {3, {2, 3, 4}}};
    for (size_t c = 0; c < sizeof outs / sizeof outs[0]; c++) {
        reset();
        int x = input(DT_F32, SHAPE(2, 3, 4), xv);
        int y = add(G_SUM_TO, DT_F32, outs[c].r, outs[c].s, INS(x));
        double **v = run();
        int64_t so[4], sx[4] = {1, 2, 3, 4};
        pad4(outs[c].r, outs[c].s, so);
        double want[24] = {0};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                for (int l = 0; l < 4; l++) want[flat4(so, 0, i, j, l)] += xv[flat4(sx, 0, i, j, l)];
        char what[32];
        snprintf(what, sizeof what, "sum_to case %zu", c);
        CHECK_ARR(v ? v[y] : NULL, want, numel_of(y), TOL, what);
    }
    /* to a shape with an extra leading 1 */
    reset();
    double a[] = {1, 2, 3, 4, 5, 6};
    int x = input(DT_F32, SHAPE(2, 3), a);
    int y = add(G_SUM_TO, DT_F32, SHAPE(1, 2, 3), INS(x));
    double **v = run();
    CHECK_ARR(v ? v[y] : NULL, a, 6, 0, "sum_to [2,3] -> [1,2,3]");
}

/* ---- composite ops -------------------------------------------------------------------------- */

static void test_softmax(void) {
    reset();
    double xv[15];
    rnd_fill(xv, 10);
    for (int j = 0; j < 5; j++) xv[10 + j] = 1000 + j; /* a row that overflows exp() unless shifted */
    int x = input(DT_F32, SHAPE(3, 5), xv);
    int s = add(G_SOFTMAX, DT_F32, SHAPE(3, 5), INS(x));
    N(s)->iattr[0] = 1;
    int l = add(G_LOG_SOFTMAX, DT_F32, SHAPE(3, 5), INS(x));
    N(l)->iattr[0] = 1;
    int s0 = add(G_SOFTMAX, DT_F32, SHAPE(3, 5), INS(x)); /* along axis 0 */
    N(s0)->iattr[0] = 0;
    double **v = run();
    REQUIRE_RUN(v);
    double want[15], lwant[15];
    for (int r = 0; r < 3; r++) {
        double sum = 0, rowsum = 0;
        for (int j = 0; j < 5; j++) sum += exp(xv[r * 5 + j] - (r == 2 ? 1000 : 0));
        for (int j = 0; j < 5; j++) {
            want[r * 5 + j] = exp(xv[r * 5 + j] - (r == 2 ? 1000 : 0)) / sum;
            lwant[r * 5 + j] = log(want[r * 5 + j]);
            rowsum += v[s][r * 5 + j];
        }
        CHECK_NEAR(rowsum, 1, TOL, "softmax row sums to 1");
    }
    CHECK_ARR(v[s], want, 15, TOL, "softmax");
    CHECK_ARR(v[l], lwant, 15, TOL, "log_softmax");
    /* axis 0: columns of the first two rows plus the large row (the large row takes all) */
    for (int j = 0; j < 5; j++) {
        double sum = 0;
        for (int r = 0; r < 3; r++) sum += v[s0][r * 5 + j];
        CHECK_NEAR(sum, 1, TOL, "softmax column sums to 1");
        CHECK_NEAR(v[s0][10 + j], 1, TOL, "the large entry takes the column");
    }
}

static void test_layernorm(void) {
    enum { R = 3, C = 8 };
    double xv[R * C], wv[C], bv[C], ones[C], zeros[C], big[R * C];
    rnd_fill(xv, R * C);
    rnd_fill(wv, C);
    rnd_fill(bv, C);
    for (int j = 0; j < C; j++) ones[j] = 1, zeros[j] = 0;
    for (int i = 0; i < R * C; i++) big[i] = 1e8 + xv[i];
    reset();
    int x = input(DT_F32, SHAPE(R, C), xv);
    int w = input(DT_F32, SHAPE(C), wv);
    int b = input(DT_F32, SHAPE(C), bv);
    int w1 = input(DT_F32, SHAPE(C), ones);
    int b0 = input(DT_F32, SHAPE(C), zeros);
    int xb = input(DT_F32, SHAPE(R, C), big);
    int unit = add(G_LAYERNORM, DT_F32, SHAPE(R, C), INS(x, w1, b0)); /* eps = 0 */
    int full = add(G_LAYERNORM, DT_F32, SHAPE(R, C), INS(x, w, b));
    N(full)->fattr[0] = 1e-5;
    int off = add(G_LAYERNORM, DT_F32, SHAPE(R, C), INS(xb, w1, b0));
    N(off)->fattr[0] = 1e-5;
    int nob = add(G_LAYERNORM, DT_F32, SHAPE(R, C), INS(x, w));
    N(nob)->fattr[0] = 1e-5;
    double **v = run();
    REQUIRE_RUN(v);
    double want[R * C], wantoff[R * C], wantnob[R * C];
    for (int r = 0; r < R; r++) {
        double mean = 0, var = 0, m2 = 0, v2 = 0;
        for (int j = 0; j < C; j++) mean += xv[r * C + j] / C;
        for (int j = 0; j < C; j++) var += (xv[r * C + j] - mean) * (xv[r * C + j] - mean) / C;
        for (int j = 0; j < C; j++) {
            double xhat = (xv[r * C + j] - mean) / sqrt(var + 1e-5);
            want[r * C + j] = xhat * wv[j] + bv[j];
            wantnob[r * C + j] = xhat * wv[j];
            wantoff[r * C + j] = xhat;
            m2 += v[unit][r * C + j] / C;
        }
        for (int j = 0; j < C; j++) v2 += (v[unit][r * C + j] - m2) * (v[unit][r * C + j] - m2) / C;
        CHECK_NEAR(m2, 0, TOL, "w = 1, b = 0: mean 0");
        CHECK_NEAR(v2, 1, TOL, "w = 1, b = 0: variance 1 (biased)");
    }
    CHECK_ARR(v[full], want, R * C, TOL, "layernorm with weight and bias");
    CHECK_ARR(v[nob], wantnob, R * C, TOL, "layernorm without bias");
    /* x = 1e8 + r: the two-pass variance keeps r's spread (one pass would lose it entirely) */
    CHECK_ARR(v[off], wantoff, R * C, 1e-6, "layernorm of values with a large offset");
}

static void test_rmsnorm(void) {
    enum { R = 4, C = 6 };
    double xv[R * C], wv[C];
    rnd_fill(xv, R * C);
    rnd_fill(wv, C);
    reset();
    int x = input(DT_F32, SHAPE(2, 2, C), xv);
    int w = input(DT_F32, SHAPE(C), wv);
    int y = add(G_RMSNORM, DT_F32, SHAPE(2, 2, C), INS(x, w));
    N(y)->fattr[0] = 1e-6;
    double **v = run();
    double want[R * C];
    for (int r = 0; r < R; r++) {
        double ms = 0;
        for (int j = 0; j < C; j++) ms += xv[r * C + j] * xv[r * C + j];
        for (int j = 0; j < C; j++) want[r * C + j] = xv[r * C + j] / sqrt(ms / C + 1e-6) * wv[j];
    }
    CHECK_ARR(v ? v[y] : NULL, want, R * C, TOL, "rmsnorm");
}

static void test_rope(void) {
    struct {
        int rank;
        int64_t s[4];
        double theta;
    } cases[] = {{3, {2, 3, 4}, 10000}, {4, {1, 2, 5, 6}, 500}};
    for (int c = 0; c < 2; c++) {
        reset();
        double xv[60];
        int r = cases[c].rank;
        int64_t T = cases[c].s[r - 2], hd = cases[c].s[r - 1], total = 1;
        for (int d = 0; d < r; d++) total *= cases[c].s[d];
        rnd_fill(xv, total);
        int x = input(DT_F32, r, cases[c].s, xv);
        int y = add(G_ROPE, DT_F32, r, cases[c].s, INS(x));
        N(y)->fattr[0] = cases[c].theta;
        double **v = run();
        REQUIRE_RUN(v);
        double want[60];
        for (int64_t row = 0; row < total / hd; row++) {
            int64_t t = row % T, h = hd / 2;
            const double *in = xv + row * hd;
            for (int64_t i = 0; i < h; i++) {
                double inv_freq = 1.0 / pow(cases[c].theta, (double)(2 * i) / (double)hd);
                double a = (double)t * inv_freq;
                /* [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]: rotate_half(x) = [-x2, x1] */
                want[row * hd + i] = in[i] * cos(a) + (-in[i + h]) * sin(a);
                want[row * hd + i + h] = in[i + h] * cos(a) + in[i] * sin(a);
            }
            if (t == 0) CHECK_ARR(v[y] + row * hd, in, hd, 0, "position 0 is unrotated");
            for (int64_t i = 0; i < h; i++) { /* each pair keeps its length */
                double n0 = hypot(in[i], in[i + h]), n1 = hypot(v[y][row * hd + i], v[y][row * hd + i + h]);
                CHECK_NEAR(n1, n0, TOL, "rotation preserves the pair's norm");
            }
        }
        CHECK_ARR(v[y], want, total, TOL, "rope against the rotation formula");
    }
}

/* Attention written as in a textbook: a full T x S score matrix, -inf where masked, softmax by
 * exp/sum (inputs are small), then the weighted sum of v. mask: key j visible to query t iff
 * j <= t + S - T. */
static void naive_attention(const double *q, const double *k, const double *v, double *out, int B, int H, int Hk, int T, int S,
                            int hd, int hv, int causal, double scale) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / Hk);
            for (int t = 0; t < T; t++) {
                double sc[16], sum = 0;
                for (int j = 0; j < S; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += q[((b * H + h) * T + t) * hd + c] * k[((b * Hk + g) * S + j) * hd + c];
                    sc[j] = causal && j > t + S - T ? -INFINITY : d * scale;
                    sum += exp(sc[j]);
                }
                for (int c = 0; c < hv; c++) {
                    double o = 0;
                    for (int j = 0; j < S; j++) o += exp(sc[j]) / sum * v[((b * Hk + g) * S + j) * hv + c];
                    out[((b * H + h) * T + t) * hv + c] = o;
                }
            }
        }
}

static void test_attention(void) {
    struct {
        int B, H, Hk, T, S, hd, hv, causal;
        double scale;
    } cases[] = {
        {1, 2, 2, 3, 3, 4, 4, 1, 0.5}, /* 2 heads, T = 3, causal */
        {1, 2, 2, 3, 3, 4, 4, 0, 0.5}, /* the same, not causal */
        {2, 4, 2, 3, 3, 4, 3, 1, 0.7}, /* grouped-query: 4 q heads on 2 kv heads, hv != hd */
        {1, 2, 1, 3, 3, 2, 2, 0, 1.0}, /* multi-query */
        {1, 2, 2, 1, 3, 4, 4, 1, 0.5}, /* one new query against a cache of 3: sees all */
        {1, 2, 2, 2, 3, 4, 4, 1, 0.5}, /* bottom-right aligned mask */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        reset();
        int B = cases[c].B, H = cases[c].H, Hk = cases[c].Hk, T = cases[c].T, S = cases[c].S;
        int hd = cases[c].hd, hv = cases[c].hv;
        static double qv[256], kv[256], vv[256];
        rnd_fill(qv, B * H * T * hd);
        rnd_fill(kv, B * Hk * S * hd);
        rnd_fill(vv, B * Hk * S * hv);
        int q = input(DT_F32, SHAPE(B, H, T, hd), qv);
        int k = input(DT_F32, SHAPE(B, Hk, S, hd), kv);
        int vn = input(DT_F32, SHAPE(B, Hk, S, hv), vv);
        int y = add(G_ATTENTION, DT_F32, SHAPE(B, H, T, hv), INS(q, k, vn));
        N(y)->iattr[0] = cases[c].causal;
        N(y)->fattr[0] = cases[c].scale;
        double **v = run();
        double want[256];
        naive_attention(qv, kv, vv, want, B, H, Hk, T, S, hd, hv, cases[c].causal, cases[c].scale);
        char what[32];
        snprintf(what, sizeof what, "attention case %zu", c);
        CHECK_ARR(v ? v[y] : NULL, want, B * H * T * hv, TOL, what);
        if (v && c == 0) /* causal: the first query sees only the first key */
            CHECK_ARR(v[y], vv, hv, TOL, "causal first row is v[0]");
    }
    /* more queries than keys under a causal mask: the first query sees nothing and gives zeros */
    reset();
    double qv[8], kv[4], vv[4];
    rnd_fill(qv, 8);
    rnd_fill(kv, 4);
    rnd_fill(vv, 4);
    int q = input(DT_F32, SHAPE(1, 1, 2, 4), qv);
    int k = input(DT_F32, SHAPE(1, 1, 1, 4), kv);
    int vn = input(DT_F32, SHAPE(1, 1, 1, 4), vv);
    int y = add(G_ATTENTION, DT_F32, SHAPE(1, 1, 2, 4), INS(q, k, vn));
    N(y)->iattr[0] = 1;
    N(y)->fattr[0] = 0.5;
    double **v = run();
    double want[8] = {0, 0, 0, 0, vv[0], vv[1], vv[2], vv[3]};
    CHECK_ARR(v ? v[y] : NULL, want, 8, TOL, "T > S causal");
}

static void test_cross_entropy(void) {
    reset();
    double zeros[30] = {0}, lv[24], tv[] = {0, 4, 2, 3, 1, 4}, t4[] = {5, 0, 1, 2};
    rnd_fill(lv, 24);
    for (int i = 0; i < 24; i++) lv[i] *= 5;
    int u = input(DT_F32, SHAPE(2, 3, 5), zeros);
    int ut = input(DT_I32, SHAPE(2, 3), tv);
    int ce_u = add(G_CROSS_ENTROPY, DT_F32, SCALAR, INS(u, ut));
    int l = input(DT_F32, SHAPE(4, 6), lv);
    int lt = input(DT_I32, SHAPE(4), t4);
    int ce = add(G_CROSS_ENTROPY, DT_F32, SCALAR, INS(l, lt));
    double bigv[] = {1000, 0, 0, 1000}, bt[] = {0, 0};
    int big = input(DT_F32, SHAPE(2, 2), bigv);
    int btn = input(DT_I32, SHAPE(2), bt);
    int ce_big = add(G_CROSS_ENTROPY, DT_F32, SCALAR, INS(big, btn));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_NEAR(v[ce_u][0], log(5.0), TOL, "uniform logits give log V");
    double want = 0;
    for (int p = 0; p < 4; p++) {
        double sum = 0;
        for (int j = 0; j < 6; j++) sum += exp(lv[p * 6 + j]);
        want += -log(exp(lv[p * 6 + (int)t4[p]]) / sum) / 4;
    }
    CHECK_NEAR(v[ce][0], want, TOL, "cross_entropy against -log(exp(x_t) / sum exp(x))");
    CHECK_NEAR(v[ce_big][0], 500, TOL, "large logits: (0 + 1000) / 2 without overflow");
}

static void test_cross_entropy_bad_target(void) {
    double bad[][2] = {{1, 5}, {-1, 0}, {0.5, 0}};
    const char *msg[] = {"cross_entropy: target 5 at position 1 is out of range [0, 5)",
                         "cross_entropy: target -1 at position 0 is out of range [0, 5)",
                         "cross_entropy: target 0.5 at position 0 is out of range [0, 5)"};
    for (int c = 0; c < 3; c++) {
        reset();
        double lv[10] = {0};
        int l = input(DT_F32, SHAPE(2, 5), lv);
        int t = input(DT_I32, SHAPE(2), bad[c]);
        add(G_CROSS_ENTROPY, DT_F32, SCALAR, INS(l, t));
        int before = diag_error_count();
        capture_begin();
        double **v = run();
        const char *err = capture_end();
        CHECK(v == NULL, "an out-of-range target must fail the run");
        CHECK(diag_error_count() == before + 1, "one error reported");
        CHECK(strstr(err, msg[c]) != NULL, "message: %s", err);
        /* ref_eval_node itself returns -1 */
        double *vals[3] = {lv, bad[c], (double[1]){0}};
        capture_begin();
        int rc = ref_eval_node(&G, N(2), vals);
        capture_end();
        CHECK(rc == -1, "ref_eval_node returns -1");
    }
}

static void test_mse(void) {
    reset();
    double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 3, 1, 5, 10};
    int x = input(DT_F32, SHAPE(2, 3), a);
    int y = input(DT_F32, SHAPE(2, 3), b);
    int m = add(G_MSE, DT_F32, SCALAR, INS(x, y));
    double **v = run();
    CHECK_ARR(v ? v[m] : NULL, ((double[]){(4.0 + 9 + 16) / 6}), 1, TOL, "mse");
}

static void test_one_hot(void) {
    reset();
    double iv[] = {0, 3, 1, 1};
    int i = input(DT_I32, SHAPE(2, 2), iv);
    int y = add(G_ONE_HOT, DT_F32, SHAPE(2, 2, 4), INS(i));
    N(y)->iattr[0] = 4;
    double **v = run();
    double want[16] = {1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0};
    CHECK_ARR(v ? v[y] : NULL, want, 16, 0, "one_hot");
    reset();
    double bad[] = {4};
    i = input(DT_I32, SHAPE(1), bad);
    y = add(G_ONE_HOT, DT_F32, SHAPE(1, 4), INS(i));
    N(y)->iattr[0] = 4;
    capture_begin();
    v = run();
    const char *err = capture_end();
    CHECK(v == NULL, "an out-of-range index must fail");
    CHECK(strstr(err, "one_hot: index 4 at position 0 is out of range [0, 4)") != NULL, "message: %s", err);
}

static void test_topk(void) {
    reset();
    double xv[] = {1, 3, 3, 2, 3, 0, /**/ 5, -1, 5, 7, 7, 0};
    int x = input(DT_F32, SHAPE(2, 6), xv);
    int val = add(G_TOPK_VALUES, DT_F32, SHAPE(2, 3), INS(x));
    N(val)->iattr[0] = 3;
    N(val)->iattr[1] = 1;
    int idx = add(G_TOPK_INDICES, DT_I32, SHAPE(2, 3), INS(x));
    N(idx)->iattr[0] = 3;
    N(idx)->iattr[1] = 1;
    int all = add(G_TOPK_INDICES, DT_I32, SHAPE(2, 6), INS(x)); /* a full stable sort */
    N(all)->iattr[0] = 6;
    N(all)->iattr[1] = 1;
    double cv[] = {1, 9, 4, 2, 4, 8, 0, 7}; /* [4, 2], along axis 0 */
    int c = input(DT_F32, SHAPE(4, 2), cv);
    int cval = add(G_TOPK_VALUES, DT_F32, SHAPE(2, 2), INS(c));
    N(cval)->iattr[0] = 2;
    N(cval)->iattr[1] = 0;
    int cidx = add(G_TOPK_INDICES, DT_I32, SHAPE(2, 2), INS(c));
    N(cidx)->iattr[0] = 2;
    N(cidx)->iattr[1] = 0;
    double nv[] = {1, NAN, 2};
    int nn = input(DT_F32, SHAPE(3), nv);
    int nidx = add(G_TOPK_INDICES, DT_I32, SHAPE(2), INS(nn));
    N(nidx)->iattr[0] = 2;
    N(nidx)->iattr[1] = 0;
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[val], ((double[]){3, 3, 3, 7, 7, 5}), 6, 0, "topk values, largest first");
    CHECK_ARR(v[idx], ((double[]){1, 2, 4, 3, 4, 0}), 6, 0, "topk indices, ties to the lower index");
    CHECK_ARR(v[all], ((double[]){1, 2, 4, 3, 0, 5, 3, 4, 0, 2, 5, 1}), 12, 0, "k = n is a stable descending sort");
    CHECK_ARR(v[cval], ((double[]){4, 9, 4, 8}), 4, 0, "topk values along axis 0");
    CHECK_ARR(v[cidx], ((double[]){1, 0, 2, 2}), 4, 0, "topk indices along axis 0");
    CHECK_ARR(v[nidx], ((double[]){1, 2}), 2, 0, "NaN ranks first");
}

/* ---- linear algebra and data movement ------------------------------------------------------- */

static void test_matmul(void) {
    /* shapes of a, b and the result; a rank-1 operand is marked by rank 1 */
    struct {
        int ra;
        int64_t a[4];
        int rb;
        int64_t b[4];
        int ro;
        int64_t o[4];
    } cases[] = {
        {2, {2, 3}, 2, {3, 4}, 2, {2, 4}},
        {3, {2, 2, 3}, 2, {3, 4}, 3, {2, 2, 4}},
        {4, {2, 1, 2, 3}, 3, {3, 3, 4}, 4, {2, 3, 2, 4}},
        {1, {3}, 2, {3, 4}, 1, {4}},
        {2, {2, 3}, 1, {3}, 1, {2}},
        {1, {3}, 1, {3}, 0, {0}},
        {1, {3}, 3, {2, 3, 4}, 2, {2, 4}},
        {3, {2, 2, 3}, 1, {3}, 2, {2, 2}},
        {2, {1, 3}, 3, {2, 3, 1}, 3, {2, 1, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        reset();
        double av[64], bv[64];
        rnd_fill(av, 64);
        rnd_fill(bv, 64);
        int a = input(DT_F32, cases[c].ra, cases[c].a, av);
        int b = input(DT_F32, cases[c].rb, cases[c].b, bv);
        int y = add(G_MATMUL, DT_F32, cases[c].ro, cases[c].o, INS(a, b));
        double **v = run();
        /* as NumPy: lift rank-1 operands to matrices, pad the batch dims to rank 2, loop */
        int ra = cases[c].ra, rb = cases[c].rb;
        int64_t am[4], bm[4];
        int rA = ra == 1 ? 2 : ra, rB = rb == 1 ? 2 : rb;
        if (ra == 1) am[0] = 1, am[1] = cases[c].a[0];
        else memcpy(am, cases[c].a, sizeof am);
        if (rb == 1) bm[0] = cases[c].b[0], bm[1] = 1;
        else memcpy(bm, cases[c].b, sizeof bm);
        int64_t n = am[rA - 2], k = am[rA - 1], m = bm[rB - 1];
        int64_t ab[4], bb[4]; /* batch dims padded to rank 4 (2 used) */
        pad4(rA - 2, am, ab);
        pad4(rB - 2, bm, bb);
        double want[64];
        int64_t o = 0;
        for (int64_t p = 0; p < (ab[2] > bb[2] ? ab[2] : bb[2]); p++)
            for (int64_t q = 0; q < (ab[3] > bb[3] ? ab[3] : bb[3]); q++) {
                int64_t ao = flat4(ab, 0, 0, p, q) * n * k, bo = flat4(bb, 0, 0, p, q) * k * m;
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < m; j++) {
                        double s = 0;
                        for (int64_t l = 0; l < k; l++) s += av[ao + i * k + l] * bv[bo + l * m + j];
                        want[o++] = s;
                    }
            }
        char what[32];
        snprintf(what, sizeof what, "matmul case %zu", c);
        CHECK(o == numel_of(y), "%s: %lld results for %lld outputs", what, (long long)o, (long long)numel_of(y));
        CHECK_ARR(v ? v[y] : NULL, want, o, TOL, what);
    }
}

static void test_reshape_transpose(void) {
    reset();
    double xv[24];
    for (int i = 0; i < 24; i++) xv[i] = i;
    int x = input(DT_F32, SHAPE(2, 3, 4), xv);
    int r = add(G_RESHAPE, DT_F32, SHAPE(6, 4), INS(x));
    int t02 = add(G_TRANSPOSE, DT_F32, SHAPE(4, 3, 2), INS(x));
    N(t02)->iattr[0] = 0;
    N(t02)->iattr[1] = 2;
    int t12 = add(G_TRANSPOSE, DT_F32, SHAPE(2, 4, 3), INS(x));
    N(t12)->iattr[0] = 1;
    N(t12)->iattr[1] = 2;
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[r], xv, 24, 0, "reshape keeps the order");
    double w02[24], w12[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                w02[(k * 3 + j) * 2 + i] = xv[(i * 3 + j) * 4 + k];
                w12[(i * 4 + k) * 3 + j] = xv[(i * 3 + j) * 4 + k];
            }
    CHECK_ARR(v[t02], w02, 24, 0, "transpose axes 0, 2");
    CHECK_ARR(v[t12], w12, 24, 0, "transpose axes 1, 2");
}

static void test_slice(void) {
    reset();
    double xv[12];
    for (int i = 0; i < 12; i++) xv[i] = i;
    int x = input(DT_F32, SHAPE(3, 4), xv);
    int s1 = add(G_SLICE, DT_F32, SHAPE(3, 2), INS(x));
    N(s1)->iattr[0] = 1, N(s1)->iattr[1] = 1, N(s1)->iattr[2] = 3;
    int s0 = add(G_SLICE, DT_F32, SHAPE(1, 4), INS(x));
    N(s0)->iattr[0] = 0, N(s0)->iattr[1] = 2, N(s0)->iattr[2] = 3;
    int se = add(G_SLICE, DT_F32, SHAPE(3, 0), INS(x));
    N(se)->iattr[0] = 1, N(se)->iattr[1] = 2, N(se)->iattr[2] = 2;
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[s1], ((double[]){1, 2, 5, 6, 9, 10}), 6, 0, "slice along axis 1");
    CHECK_ARR(v[s0], ((double[]){8, 9, 10, 11}), 4, 0, "slice along axis 0");
}

static void test_gather(void) {
    reset();
    double wv[15];
    for (int i = 0; i < 15; i++) wv[i] = 10 * (i / 3) + i % 3;
    double iv[] = {4, 0, 2, 4}, i0[] = {1};
    int w = input(DT_F32, SHAPE(5, 3), wv);
    int ix = input(DT_I32, SHAPE(2, 2), iv);
    int g = add(G_GATHER, DT_F32, SHAPE(2, 2, 3), INS(w, ix));
    int is = input(DT_I32, SCALAR, i0);
    int gs = add(G_GATHER, DT_F32, SHAPE(3), INS(w, is));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[g], ((double[]){40, 41, 42, 0, 1, 2, 20, 21, 22, 40, 41, 42}), 12, 0, "gather rows");
    CHECK_ARR(v[gs], ((double[]){10, 11, 12}), 3, 0, "gather with a rank-0 index");
    double bad[][1] = {{5}, {-1}};
    const char *msg[] = {"gather: index 5 at position 0 is out of range [0, 5)",
                         "gather: index -1 at position 0 is out of range [0, 5)"};
    for (int c = 0; c < 2; c++) {
        reset();
        w = input(DT_F32, SHAPE(5, 3), wv);
        ix = input(DT_I32, SHAPE(1), bad[c]);
        add(G_GATHER, DT_F32, SHAPE(1, 3), INS(w, ix));
        capture_begin();
        v = run();
        const char *err = capture_end();
        CHECK(v == NULL, "an out-of-range index must fail the run");
        CHECK(strstr(err, msg[c]) != NULL, "message: %s", err);
    }
}

static void test_concat(void) {
    reset();
    double a[] = {1, 2}, b[] = {10, 11, 12, 20, 21, 22}, c[] = {100, 101, 200, 201};
    int x = input(DT_F32, SHAPE(2, 1), a);
    int y = input(DT_F32, SHAPE(2, 3), b);
    int z = input(DT_F32, SHAPE(2, 2), c);
    int c1 = add(G_CONCAT, DT_F32, SHAPE(2, 6), INS(x, y, z));
    N(c1)->iattr[0] = 1;
    double d[] = {7, 8};
    int r = input(DT_F32, SHAPE(1, 2), d);
    int c2 = add(G_CONCAT, DT_F32, SHAPE(5, 2), INS(z, r, z));
    N(c2)->iattr[0] = 0;
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[c1], ((double[]){1, 10, 11, 12, 100, 101, 2, 20, 21, 22, 200, 201}), 12, 0, "concat along axis 1");
    CHECK_ARR(v[c2], ((double[]){100, 101, 200, 201, 7, 8, 100, 101, 200, 201}), 10, 0, "concat along axis 0");
}

static void test_broadcast(void) {
    reset();
    double a[] = {1, 2, 3}, s[] = {9};
    int x = input(DT_F32, SHAPE(3, 1), a);
    int y = add(G_BROADCAST, DT_F32, SHAPE(2, 3, 2), INS(x));
    int z = input(DT_F32, SCALAR, s);
    int w = add(G_BROADCAST, DT_F32, SHAPE(2, 2), INS(z));
    double **v = run();
    REQUIRE_RUN(v);
    CHECK_ARR(v[y], ((double[]){1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}), 12, 0, "broadcast [3,1] -> [2,3,2]");
    CHECK_ARR(v[w], ((double[]){9, 9, 9, 9}), 4, 0, "broadcast [] -> [2,2]");
}

/* ---- whole graphs --------------------------------------------------------------------------- */

/* loss = mean(relu(x @ W + b)), worked by hand. */
static void test_small_mlp(void) {
    reset();
    double xv[] = {1, 2, -1, 0}, Wv[] = {1, -1, 0.5, 2}, bv[] = {0.5, -3};
    int x = input(DT_F32, SHAPE(2, 2), xv);
    int W = add(G_PARAM, DT_F32, SHAPE(2, 2), SCALAR);
    leaf[W] = Wv;
    int b = add(G_PARAM, DT_F32, SHAPE(2), SCALAR);
    leaf[b] = bv;
    int mm = add(G_MATMUL, DT_F32, SHAPE(2, 2), INS(x, W));
    int ad = add(G_ADD, DT_F32, SHAPE(2, 2), INS(mm, b));
    int re = add(G_RELU, DT_F32, SHAPE(2, 2), INS(ad));
    int lo = add(G_MEAN, DT_F32, SCALAR, INS(re));
    N(lo)->iattr[0] = -1;
    G.loss = lo;
    double **v = run();
    REQUIRE_RUN(v);
    /* x @ W = [[2, 3], [-1, 1]]; + b = [[2.5, 0], [-0.5, -2]]; relu = [[2.5, 0], [0, 0]] */
    CHECK_ARR(v[mm], ((double[]){2, 3, -1, 1}), 4, TOL, "x @ W");
    CHECK_ARR(v[re], ((double[]){2.5, 0, 0, 0}), 4, TOL, "relu(x @ W + b)");
    CHECK_NEAR(v[lo][0], 0.625, TOL, "mean");
    /* ref_eval_node on its own, with caller-allocated buffers */
    double out[4];
    double *vals[8] = {v[0], v[1], v[2], out};
    CHECK(ref_eval_node(&G, N(mm), vals) == 0, "ref_eval_node returns 0");
    CHECK_ARR(out, ((double[]){2, 3, -1, 1}), 4, TOL, "ref_eval_node result");
}

int main(void) {
    RUN(test_bcast_index);
    RUN(test_leaves_and_constants);
    RUN(test_missing_leaf);
    RUN(test_unary);
    RUN(test_unary_extremes);
    RUN(test_cast);
    RUN(test_cast_half);
    RUN(test_clamp);
    RUN(test_philox);
    RUN(test_dropout);
    RUN(test_binary_broadcast);
    RUN(test_mod_sign);
    RUN(test_minmax_nan);
    RUN(test_where);
    RUN(test_reductions);
    RUN(test_logsumexp_stable);
    RUN(test_norm);
    RUN(test_sum_to);
    RUN(test_softmax);
    RUN(test_layernorm);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_cross_entropy);
    RUN(test_cross_entropy_bad_target);
    RUN(test_mse);
    RUN(test_one_hot);
    RUN(test_topk);
    RUN(test_matmul);
    RUN(test_reshape_transpose);
    RUN(test_slice);
    RUN(test_gather);
    RUN(test_concat);
    RUN(test_broadcast);
    RUN(test_small_mlp);
    arena_free(&ar);
    return unit_finish();
}
