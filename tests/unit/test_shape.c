/* test_shape.c - unit tests of the type/shape algebra: compiler/value.c (printing), shape.c
 * (operators, indexing, .T) and builtins.c (every builtin's shape rule and its errors).
 *
 * Build: cc -std=c11 -Icompiler tests/unit/test_shape.c compiler/{arena,diag,dim,value,shape,builtins}.c -lm
 * Prints `PASS name` or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure.
 *
 * Each case builds Values directly (tensor types from a spec string such as "f32[B, T, d*4]"),
 * runs one operation with stderr captured, and checks the result's printed type, or - for an
 * error case - that the result is V_UNKNOWN, exactly one error was counted, and the exact message
 * was printed at the expected column (error cases run in a child process, see ERR). Set
 * TEST_SHAPE_NOCAPTURE=1 to see stderr as it happens. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "value.h"

/* ---- harness ---- */

static Arena ar_;
static Arena *ar = &ar_;
static int passed, failed;
static char out[16384]; /* what the last captured operation printed on stderr */
static FILE *cap_file;
static int cap_saved = -1;

static void check(const char *name, int ok, const char *fmt, ...) {
    if (ok) {
        passed++;
        printf("PASS %s\n", name);
        return;
    }
    failed++;
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static void capture_begin(void) {
    out[0] = 0;
    if (getenv("TEST_SHAPE_NOCAPTURE")) return;
    fflush(stderr);
    cap_file = tmpfile();
    if (!cap_file) return;
    cap_saved = dup(2);
    dup2(fileno(cap_file), 2);
}

static void capture_end(void) {
    if (!cap_file) return;
    fflush(stderr);
    dup2(cap_saved, 2);
    close(cap_saved);
    rewind(cap_file);
    size_t n = fread(out, 1, sizeof out - 1, cap_file);
    out[n] = 0;
    fclose(cap_file);
    cap_file = NULL;
}

/* The only source file: line 1 holds the expressions (arguments at columns 11, 21, 31, ...),
 * line 2 is where values with a "remote" origin come from. */
static uint32_t src_file;
static Span sp(uint32_t off, uint32_t len) {
    uint32_t line = off < 201 ? 1 : 2, col = off < 201 ? off + 1 : off - 201 + 1;
    return (Span){src_file, off, len, line, col};
}
#define AT sp(0, 100)
#define SA sp(10, 5)
#define SB sp(20, 5)
#define REMOTE sp(201, 5)

static void expect_ok(const char *name, Value *v, int errs, const char *want) {
    const char *got = value_type_str(ar, v);
    if (diag_error_count() != errs || out[0]) {
        check(name, 0, "unexpected diagnostic: %s", out[0] ? out : "(error counted, nothing printed)");
        return;
    }
    check(name, strcmp(got, want) == 0, "got '%s', want '%s'", got, want);
}

#define OK(name, expr, want)                                                                                                     \
    do {                                                                                                                         \
        int e_ = diag_error_count();                                                                                             \
        capture_begin();                                                                                                         \
        Value *v_ = (expr);                                                                                                      \
        capture_end();                                                                                                           \
        expect_ok(name, v_, e_, want);                                                                                           \
    } while (0)

/* Error cases run in a child process: diag prints at most DIAG_MAX_ERRORS errors per process,
 * and this file checks far more than that. The child sends back whether the result was
 * V_UNKNOWN, how many errors it counted and what it printed; the parent checks them. */
typedef struct ChildResult {
    int unknown, nerr;
    char result[256];
} ChildResult;

static void child_send(int fd, Value *v, int errs) {
    ChildResult r = {v && v->kind == V_UNKNOWN, diag_error_count() - errs, {0}};
    snprintf(r.result, sizeof r.result, "%s", value_type_str(ar, v));
    size_t n = strlen(out);
    if (write(fd, &r, sizeof r) != (ssize_t)sizeof r || write(fd, out, n) != (ssize_t)n) _exit(3);
    _exit(0);
}

static void parent_check(const char *name, int fd, pid_t pid, int col, const char *msg) {
    ChildResult r;
    size_t got = 0;
    ssize_t k;
    while (got < sizeof r && (k = read(fd, (char *)&r + got, sizeof r - got)) > 0) got += (size_t)k;
    size_t n = 0;
    while (n < sizeof out - 1 && (k = read(fd, out + n, sizeof out - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != sizeof r || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        check(name, 0, "the case crashed (status %d); output:\n%s", status, out);
        return;
    }
    char want[1024];
    snprintf(want, sizeof want, "t.mbt:1:%d: error: %s\n", col, msg);
    if (!r.unknown) check(name, 0, "result is %s, not unknown", r.result);
    else if (r.nerr != 1) check(name, 0, "%d errors counted, want 1; printed:\n%s", r.nerr, out);
    else check(name, strstr(out, want) != NULL, "want '%.*s' in:\n%s", (int)strlen(want) - 1, want, out);
}

#define ERR(name, expr, col, msg)                                                                                                \
    do {                                                                                                                         \
        int fd_[2];                                                                                                              \
        fflush(stdout);                                                                                                          \
        fflush(stderr);                                                                                                          \
        if (pipe(fd_) != 0) {                                                                                                    \
            check(name, 0, "pipe failed");                                                                                       \
            break;                                                                                                               \
        }                                                                                                                        \
        pid_t p_ = fork();                                                                                                       \
        if (p_ == 0) {                                                                                                           \
            close(fd_[0]);                                                                                                       \
            int e_ = diag_error_count();                                                                                         \
            capture_begin();                                                                                                     \
            Value *v_ = (expr);                                                                                                  \
            capture_end();                                                                                                       \
            child_send(fd_[1], v_, e_);                                                                                          \
        }                                                                                                                        \
        close(fd_[1]);                                                                                                           \
        if (p_ < 0) {                                                                                                            \
            close(fd_[0]);                                                                                                       \
            check(name, 0, "fork failed");                                                                                       \
            break;                                                                                                               \
        }                                                                                                                        \
        parent_check(name, fd_[0], p_, col, msg);                                                                                \
    } while (0)

/* Checks that the last captured output holds text (a note or a hint). */
static void has(const char *name, const char *text) { check(name, strstr(out, text) != NULL, "want '%s' in:\n%s", text, out); }

/* ---- building values ---- */

/* Dims from text: integers, names, + - * / and parentheses (a test-only parser). */
static const char *pp;
static const Dim *p_sum(void);
static void p_ws(void) {
    while (*pp == ' ') pp++;
}
static const Dim *p_atom(void) {
    p_ws();
    if (*pp == '(') {
        pp++;
        const Dim *d = p_sum();
        p_ws();
        pp++; /* ')' */
        return d;
    }
    if (*pp == '-') {
        pp++;
        return dim_sub(ar, dim_int(ar, 0), p_atom());
    }
    if (isdigit((unsigned char)*pp)) {
        long long v = strtoll(pp, (char **)&pp, 10);
        return dim_int(ar, v);
    }
    const char *s = pp;
    while (isalnum((unsigned char)*pp) || *pp == '_') pp++;
    return dim_sym(ar, arena_strndup(ar, s, (size_t)(pp - s)));
}
static const Dim *p_prod(void) {
    const Dim *d = p_atom();
    for (;;) {
        p_ws();
        int exact;
        if (*pp == '*') pp++, d = dim_mul(ar, d, p_atom());
        else if (*pp == '/') pp++, d = dim_div(ar, d, p_atom(), &exact);
        else return d;
    }
}
static const Dim *p_sum(void) {
    const Dim *d = p_prod();
    for (;;) {
        p_ws();
        if (*pp == '+') pp++, d = dim_add(ar, d, p_prod());
        else if (*pp == '-') pp++, d = dim_sub(ar, d, p_prod());
        else return d;
    }
}
static const Dim *D(const char *text) {
    pp = text;
    return p_sum();
}

static Value *I(const char *text) { return value_int(ar, D(text), span_none()); }
static Value *F(double f) { return value_float(ar, f, 1, span_none()); }
static Value *Fu(void) { return value_float(ar, 0, 0, span_none()); }
static Value *Bo(int b) { return value_bool(ar, b, 1, span_none()); }
static Value *Bu(void) { return value_bool(ar, 0, 0, span_none()); }
static Value *U(void) { return value_unknown(ar, span_none()); }
static Value *S(const char *s) {
    Value *v = value_new(ar, V_STRING, span_none());
    v->s = s;
    return v;
}

/* A tensor from a spec: "f32[B, T, 768]", "i32[]". */
static Value *Tn(const char *spec) {
    const char *lb = strchr(spec, '[');
    DType dt;
    if (!lb || !dtype_parse((Str){spec, (uint32_t)(lb - spec)}, &dt)) {
        fprintf(stderr, "bad tensor spec %s\n", spec);
        exit(2);
    }
    const Dim *dims[16];
    int r = 0;
    pp = lb + 1;
    p_ws();
    while (*pp && *pp != ']') {
        dims[r++] = p_sum();
        p_ws();
        if (*pp == ',') pp++;
        p_ws();
    }
    return value_tensor(ar, dt, r, dims, span_none());
}

static Value *remote(Value *v) {
    v->origin = REMOTE;
    return v;
}

static Value *seq(ValueKind k, int n, ...) {
    Value *v = value_new(ar, k, span_none());
    v->n = n;
    v->items = arena_alloc(ar, sizeof(Value *) * (size_t)(n + 1));
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) v->items[i] = va_arg(ap, Value *);
    va_end(ap);
    if (k == V_LIST) v->len = dim_int(ar, n);
    return v;
}

static Value *bin(Op op, Value *a, Value *b) { return value_binary(ar, op, a, SA, b, SB, AT); }

/* base[i0, i1, ...]: each index is a Value, or a slice made by SL(lo, hi) (NULL bounds = omitted). */
typedef struct Ix {
    int slice;
    Value *v, *lo, *hi;
} Ix;
#define IX(v) ((Ix){0, (v), NULL, NULL})
#define SL(lo, hi) ((Ix){1, NULL, (lo), (hi)})
static Value *index_(Value *base, int n, const Ix *ix) {
    Value *idx[8], *lo[8], *hi[8];
    Span s[8];
    int sl[8];
    for (int i = 0; i < n; i++) {
        idx[i] = ix[i].v;
        lo[i] = ix[i].lo;
        hi[i] = ix[i].hi;
        sl[i] = ix[i].slice;
        s[i] = sp((uint32_t)(20 + 10 * i), 5);
    }
    return value_index(ar, base, SA, idx, s, n, sl, lo, hi, AT);
}
#define INDEX(base, ...) index_(base, (int)(sizeof((Ix[]){__VA_ARGS__}) / sizeof(Ix)), (Ix[]){__VA_ARGS__})

/* name(args...): A(v) positional, K("name", v) keyword; argument i sits at column 11 + 10*i. */
typedef struct Arg {
    const char *kw;
    Value *v;
} Arg;
#define A(v) ((Arg){NULL, (v)})
#define K(k, v) ((Arg){(k), (v)})
static Value *call_(const char *name, int n, const Arg *args) {
    const Builtin *b = builtin_find(str_from(name));
    if (!b) {
        fprintf(stderr, "no builtin %s\n", name);
        exit(2);
    }
    CallArgs c = {0};
    c.pos = arena_alloc(ar, sizeof(Value *) * 8);
    c.pos_at = arena_alloc(ar, sizeof(Span) * 8);
    c.kw = arena_alloc(ar, sizeof(Value *) * 8);
    c.kw_at = arena_alloc(ar, sizeof(Span) * 8);
    c.kw_name = arena_alloc(ar, sizeof(Str) * 8);
    for (int i = 0; i < n; i++) {
        Span s = sp((uint32_t)(10 + 10 * i), 5);
        if (args[i].kw) {
            c.kw_name[c.nkw] = str_from(args[i].kw);
            c.kw[c.nkw] = args[i].v;
            c.kw_at[c.nkw++] = s;
        } else {
            c.pos[c.npos] = args[i].v;
            c.pos_at[c.npos++] = s;
        }
    }
    c.callee_at = sp(0, 5);
    c.at = AT;
    return builtin_call(ar, b, &c, DT_F32);
}
#define CALL(name, ...) call_(name, (int)(sizeof((Arg[]){__VA_ARGS__}) / sizeof(Arg)), (Arg[]){__VA_ARGS__})
static Value *call0(const char *name) { return call_(name, 0, NULL); }

/* ---- printing of types and values ---- */

static void test_printing(void) {
    OK("type_tensor", Tn("f32[B, T, 768]"), "f32[B, T, 768]");
    OK("type_scalar_tensor", Tn("bf16[]"), "bf16[]");
    OK("type_int", I("768"), "integer 768");
    OK("type_int_div", I("d/heads"), "integer d/heads");
    OK("type_float", F(0.02), "float 0.02");
    OK("type_float_exp", F(1e-8), "float 1e-8");
    OK("type_float_whole", F(2), "float 2.0");
    OK("type_float_small", F(6e-4), "float 0.0006");
    OK("type_float_big", F(1e20), "float 1e20");
    OK("type_float_thousand", F(1000), "float 1000.0");
    OK("type_float_1e_5", F(1e-5), "float 1e-5");
    OK("type_float_mantissa", F(-2.5e-8), "float -2.5e-8");
    OK("type_float_pi", F(3.141592653589793), "float 3.141592653589793");
    OK("type_float_1e15", F(1e15), "float 1000000000000000.0");
    OK("type_float_third", F(1.0 / 3), "float 0.3333333333333333");
    OK("type_float_unknown", Fu(), "float");
    OK("type_bool", Bo(1), "bool true");
    OK("type_bool_unknown", Bu(), "bool");
    OK("type_string", S("x"), "string");
    OK("type_tuple", seq(V_TUPLE, 2, I("1"), I("2")), "tuple of 2");
    OK("type_unknown", U(), "unknown");

    Node block = {0};
    block.kind = N_MODEL;
    block.name = str_from("Block");
    Value *m = value_new(ar, V_MODEL, span_none());
    m->node = &block;
    OK("type_model", m, "model Block");
    Value *l = value_new(ar, V_LIST, span_none());
    l->n = 12;
    l->len = dim_int(ar, 12);
    l->items = arena_alloc(ar, sizeof(Value *) * 12);
    for (int i = 0; i < 12; i++) l->items[i] = m;
    OK("type_list_models", l, "list of 12 model Block");
    Value *ls = value_new(ar, V_LIST, span_none());
    ls->n = 1;
    ls->len = D("layers");
    ls->items = arena_alloc(ar, sizeof(Value *));
    ls->items[0] = m;
    OK("type_list_symbolic", ls, "list of layers model Block");
    OK("type_list_mixed", seq(V_LIST, 2, I("1"), F(2)), "list of 2 items");
    OK("type_empty_list", seq(V_LIST, 0), "empty list");
    Value *bv = builtin_value(ar, builtin_find(str_from("layernorm")), span_none());
    OK("type_builtin", bv, "builtin layernorm");

    TensorType a = Tn("f32[B, d*4]")->t, b = Tn("f32[B, 4*d]")->t, c = Tn("bf16[B, 4*d]")->t;
    check("tensor_type_eq", tensor_type_eq(&a, &b), "f32[B, d*4] != f32[B, 4*d]");
    check("tensor_type_ne_dtype", !tensor_type_eq(&a, &c), "dtype ignored");
    DType dt;
    check("dtype_parse", dtype_parse(str_from("bf16"), &dt) && dt == DT_BF16 && !dtype_parse(str_from("f8"), &dt), "dtype_parse");
    check("dtype_is_float", dtype_is_float(DT_F16) && !dtype_is_float(DT_I64) && !dtype_is_float(DT_BOOL), "dtype_is_float");
    check("kind_name", strcmp(value_kind_name(V_TENSOR), "tensor") == 0 && strcmp(value_kind_name(V_INT), "integer") == 0,
          "kind names");
    int known;
    check("truthy_bool", value_truthy(Bo(1), &known) && known, "true");
    check("truthy_unknown", !value_truthy(Bu(), &known) && !known, "unknown bool");
    check("truthy_int", !value_truthy(I("0"), &known) && known, "0");
    check("truthy_symbolic", !value_truthy(I("d"), &known) && !known, "d");
}

/* ---- numbers ---- */

static void test_numbers(void) {
    OK("int_add", bin(OP_ADD, I("768"), I("1")), "integer 769");
    OK("int_mul_sym", bin(OP_MUL, I("d"), I("4")), "integer d*4");
    OK("int_sub_cancel", bin(OP_SUB, I("T+1"), I("1")), "integer T");
    OK("int_div_sym", bin(OP_DIV, I("d"), I("heads")), "integer d/heads");
    OK("int_div_exact", bin(OP_DIV, I("768"), I("12")), "integer 64");
    OK("int_div_inexact", bin(OP_DIV, I("7"), I("2")), "float 3.5");
    OK("int_div_poly", bin(OP_DIV, I("T"), I("T+1")), "float");
    OK("int_div_cancel", bin(OP_MUL, I("heads"), bin(OP_DIV, I("d"), I("heads"))), "integer d");
    ERR("int_div_zero", bin(OP_DIV, I("d"), I("0")), 21, "division by zero");
    OK("int_mod", bin(OP_MOD, I("7"), I("3")), "integer 1");
    OK("int_mod_negative", bin(OP_MOD, I("-7"), I("3")), "integer 2");
    OK("int_mod_sym_divisible", bin(OP_MOD, I("d*4"), I("4")), "integer 0");
    OK("int_mod_sym_unknown", bin(OP_MOD, I("d"), I("3")), "unknown");
    ERR("int_mod_zero", bin(OP_MOD, I("5"), I("0")), 21, "modulo by zero");
    OK("int_pow", bin(OP_POW, I("2"), I("10")), "integer 1024");
    OK("int_pow_sym", bin(OP_POW, I("T"), I("2")), "integer T^2");
    OK("int_pow_negative", bin(OP_POW, I("2"), I("-1")), "float 0.5");
    OK("int_pow_negative_sym", bin(OP_POW, I("d"), I("-1")), "integer 1/d");
    OK("int_pow_sym_exp", bin(OP_POW, I("2"), I("n")), "unknown");
    ERR("int_pow_overflow", bin(OP_POW, I("2"), I("70")), 1, "integer overflow: 2 ^ 70 does not fit in 62 bits");
    ERR("int_mul_overflow", bin(OP_MUL, I("4000000000000"), I("4000000000000")), 1,
        "integer overflow: 4000000000000 * 4000000000000 does not fit in 62 bits");
    OK("float_mul", bin(OP_MUL, F(0.5), I("4")), "float 2.0");
    OK("float_sym", bin(OP_MUL, I("d"), F(0.5)), "float");
    OK("float_pow", bin(OP_POW, F(0.9), I("2")), "float 0.81");
    OK("float_mod", bin(OP_MOD, F(-1.5), F(1.0)), "float 0.5");
    ERR("float_div_zero", bin(OP_DIV, F(1), F(0)), 21, "division by zero");
    ERR("float_not_finite", bin(OP_POW, F(-8), F(0.5)), 1, "-8.0 ^ 0.5 is not a finite number");
    OK("cmp_known", bin(OP_LT, I("3"), I("4")), "bool true");
    OK("cmp_sym_decided", bin(OP_LT, I("T-1"), I("T")), "bool true");
    OK("cmp_sym_eq", bin(OP_EQ, I("heads*(d/heads)"), I("d")), "bool true");
    OK("cmp_sym_ne_known", bin(OP_EQ, I("T"), I("T+1")), "bool false");
    OK("cmp_sym_unknown", bin(OP_EQ, I("d"), I("heads")), "bool");
    OK("cmp_float", bin(OP_GE, F(0.5), I("1")), "bool false");
    OK("cmp_float_unknown", bin(OP_LT, I("d"), F(1)), "bool");
    OK("cmp_bool", bin(OP_NE, Bo(1), Bo(0)), "bool true");
    OK("cmp_string", bin(OP_EQ, S("gelu"), S("gelu")), "bool true");
    OK("string_concat", bin(OP_ADD, S("a"), S("b")), "string");
    ERR("string_plus_int", bin(OP_ADD, S("a"), I("1")), 1, "unsupported operands for '+': string and integer 1");
    ERR("bool_arith", bin(OP_MUL, Bo(1), I("2")), 1, "unsupported operands for '*': bool true and integer 2");
    ERR("bool_order", bin(OP_LT, Bo(1), Bo(0)), 1, "unsupported operands for '<': bool true and bool false");
    OK("and_known", bin(OP_AND, Bo(1), Bo(0)), "bool false");
    OK("and_short", bin(OP_AND, Bu(), Bo(0)), "bool false");
    OK("or_short", bin(OP_OR, Bo(1), Bu()), "bool true");
    OK("or_unknown", bin(OP_OR, Bo(0), Bu()), "bool");
    ERR("and_int", bin(OP_AND, I("1"), Bo(1)), 11, "'and' needs bools, got integer 1");
    has("and_int_hint", "hint: compare explicitly, e.g. n > 0");
    OK("unknown_silent", bin(OP_ADD, U(), S("x")), "unknown");
    OK("neg_int", value_unary(ar, OP_NEG, I("d"), AT), "integer -d");
    OK("neg_float", value_unary(ar, OP_NEG, F(0.5), AT), "float -0.5");
    OK("pos_int", value_unary(ar, OP_POS, I("3"), AT), "integer 3");
    OK("not_bool", value_unary(ar, OP_NOT, Bo(1), AT), "bool false");
    OK("not_unknown", value_unary(ar, OP_NOT, Bu(), AT), "bool");
    ERR("not_int", value_unary(ar, OP_NOT, I("1"), AT), 1, "'not' needs a bool, got integer 1");
    ERR("neg_string", value_unary(ar, OP_NEG, S("s"), AT), 1, "unsupported operand for '-': string");
}

/* ---- tensors: broadcasting, dtypes, matmul ---- */

static void test_tensors(void) {
    OK("bcast_bias", bin(OP_ADD, Tn("f32[B, T, 768]"), Tn("f32[768]")), "f32[B, T, 768]");
    OK("bcast_ones", bin(OP_MUL, Tn("f32[B, 1, d]"), Tn("f32[T, 1]")), "f32[B, T, d]");
    OK("bcast_sym_equal", bin(OP_ADD, Tn("f32[B, heads*(d/heads)]"), Tn("f32[B, d]")), "f32[B, d]");
    OK("bcast_scalar_tensor", bin(OP_ADD, Tn("f32[]"), Tn("f32[B, T]")), "f32[B, T]");
    OK("scalar_float", bin(OP_MUL, Tn("bf16[B, T]"), F(0.5)), "bf16[B, T]");
    OK("scalar_int_tensor_float", bin(OP_MUL, Tn("i32[B, T]"), F(0.5)), "f32[B, T]");
    OK("scalar_int_int", bin(OP_ADD, I("1"), Tn("i32[B, T]")), "i32[B, T]");
    OK("scalar_sym_int", bin(OP_MUL, Tn("f32[B, T]"), I("d")), "f32[B, T]");
    OK("true_div_int", bin(OP_DIV, Tn("i32[B]"), I("2")), "f32[B]");
    OK("true_div_int_tensors", bin(OP_DIV, Tn("i64[B]"), Tn("i32[B]")), "f32[B]");
    OK("int_widen", bin(OP_ADD, Tn("i64[B]"), Tn("i32[B]")), "i64[B]");
    OK("float_int_tensors", bin(OP_MUL, Tn("f16[B]"), Tn("i32[B]")), "f16[B]");
    OK("mask_arith", bin(OP_ADD, Tn("bool[B]"), I("1")), "i32[B]");
    OK("mask_times_float", bin(OP_MUL, Tn("bool[B, T]"), Tn("f32[B, T]")), "f32[B, T]");
    OK("tensor_compare", bin(OP_GT, Tn("f32[B, T]"), I("0")), "bool[B, T]");
    OK("tensor_compare_bcast", bin(OP_EQ, Tn("i32[B, T]"), Tn("i32[T]")), "bool[B, T]");
    OK("tensor_and", bin(OP_AND, Tn("bool[B, T]"), Tn("bool[T]")), "bool[B, T]");
    OK("tensor_and_scalar", bin(OP_OR, Tn("bool[B]"), Bo(1)), "bool[B]");
    OK("tensor_not", value_unary(ar, OP_NOT, Tn("bool[B]"), AT), "bool[B]");
    OK("tensor_neg", value_unary(ar, OP_NEG, Tn("f32[B]"), AT), "f32[B]");
    ERR("tensor_neg_bool", value_unary(ar, OP_NEG, Tn("bool[B]"), AT), 1, "unsupported operand for '-': bool[B]");
    ERR("tensor_and_float", bin(OP_AND, Tn("bool[B]"), Tn("f32[B]")), 21, "'and' needs bools, got f32[B]");

    ERR("bcast_mismatch", bin(OP_ADD, Tn("f32[B, T, 768]"), remote(Tn("f32[B, T, 512]"))), 1,
        "shape mismatch: f32[B, T, 768] + f32[B, T, 512]");
    has("bcast_mismatch_note", "t.mbt:2:1: note: the right operand's shape comes from here");
    has("bcast_mismatch_hint", "hint: dimension 2 is 768 on the left and 512 on the right; they must be equal, or one of them 1");
    check("bcast_mismatch_no_left_note", strstr(out, "left operand's shape") == NULL, "note for a local operand");
    ERR("bcast_symbolic_vs_known", bin(OP_MUL, Tn("f32[d]"), Tn("f32[768]")), 1, "shape mismatch: f32[d] * f32[768]");
    ERR("bcast_rank_mismatch", bin(OP_SUB, Tn("f32[T, d]"), Tn("f32[B, T, d*4]")), 1,
        "shape mismatch: f32[T, d] - f32[B, T, d*4]");
    ERR("dtype_mismatch", bin(OP_ADD, Tn("f32[B]"), Tn("bf16[B]")), 1, "dtype mismatch: f32[B] + bf16[B]");
    has("dtype_mismatch_hint", "hint: float tensors of different dtypes are not mixed implicitly");
    ERR("tensor_plus_string", bin(OP_ADD, Tn("f32[B]"), S("s")), 1, "unsupported operands for '+': f32[B] and string");
    OK("tensor_unknown", bin(OP_ADD, Tn("f32[B]"), U()), "unknown");

    OK("matmul_linear", bin(OP_MATMUL, Tn("f32[B, T, 768]"), Tn("f32[768, 3072]")), "f32[B, T, 3072]");
    OK("matmul_attn", bin(OP_MATMUL, Tn("f32[B, H, T, hd]"), Tn("f32[B, H, hd, T]")), "f32[B, H, T, T]");
    OK("matmul_vec_mat", bin(OP_MATMUL, Tn("f32[k]"), Tn("f32[k, m]")), "f32[m]");
    OK("matmul_mat_vec", bin(OP_MATMUL, Tn("f32[B, n, k]"), Tn("f32[k]")), "f32[B, n]");
    OK("matmul_dot", bin(OP_MATMUL, Tn("f32[k]"), Tn("f32[k]")), "f32[]");
    OK("matmul_batch_bcast", bin(OP_MATMUL, Tn("f32[B, 1, n, k]"), Tn("f32[H, k, m]")), "f32[B, H, n, m]");
    OK("matmul_tied", bin(OP_MATMUL, Tn("f32[B, T, d]"), value_tensor_attr(ar, Tn("f32[vocab, d]"), str_from("T"), AT)),
       "f32[B, T, vocab]");
    ERR("matmul_inner", bin(OP_MATMUL, Tn("f32[B, T, 768]"), Tn("f32[512, 10]")), 1,
        "'@': inner dimensions differ: f32[B, T, 768] @ f32[512, 10] (768 vs 512)");
    has("matmul_inner_hint",
        "hint: the last dimension of the left operand must equal the second-to-last dimension of the right operand");
    ERR("matmul_batch", bin(OP_MATMUL, Tn("f32[2, n, k]"), Tn("f32[3, k, m]")), 1,
        "'@': batch dimensions do not broadcast: f32[2, n, k] @ f32[3, k, m]");
    ERR("matmul_int", bin(OP_MATMUL, Tn("i32[n, k]"), Tn("f32[k, m]")), 1, "'@' needs float tensors: i32[n, k] @ f32[k, m]");
    ERR("matmul_number", bin(OP_MATMUL, F(0.5), Tn("f32[3, 3]")), 1, "'@' needs two tensors, got float 0.5 and f32[3, 3]");
    has("matmul_number_hint", "hint: use '*' to multiply by a number");
    ERR("matmul_rank0", bin(OP_MATMUL, Tn("f32[]"), Tn("f32[3, 3]")), 1, "'@' of a scalar tensor: f32[] @ f32[3, 3]");
    ERR("matmul_dtype", bin(OP_MATMUL, Tn("bf16[n, k]"), Tn("f32[k, m]")), 1, "'@': dtype mismatch: bf16[n, k] @ f32[k, m]");
}

/* ---- indexing, slicing, .T ---- */

static void test_indexing(void) {
    OK("gather", INDEX(Tn("f32[vocab, d]"), IX(Tn("i32[B, T]"))), "f32[B, T, d]");
    OK("gather_vector", INDEX(Tn("f32[n]"), IX(Tn("i64[B]"))), "f32[B]");
    ERR("gather_float_index", INDEX(Tn("f32[vocab, d]"), IX(Tn("f32[B, T]"))), 21,
        "gather index must be an integer tensor, got f32[B, T]");
    ERR("gather_scalar", INDEX(Tn("f32[]"), IX(Tn("i32[B]"))), 11, "gather needs a tensor of rank 1 or more, got f32[]");
    ERR("gather_not_alone", INDEX(Tn("f32[n, d]"), IX(Tn("i32[B]")), SL(NULL, NULL)), 21,
        "an index tensor must be the only index");
    OK("slice_pos", INDEX(Tn("f32[ctx, d]"), SL(I("0"), I("T"))), "f32[T, d]");
    OK("slice_second_axis", INDEX(Tn("f32[ctx, d]"), SL(NULL, NULL), SL(I("0"), I("64"))), "f32[ctx, 64]");
    OK("slice_open_end", INDEX(Tn("f32[T, d]"), SL(I("1"), NULL)), "f32[T-1, d]");
    OK("slice_negative_end", INDEX(Tn("f32[T]"), SL(NULL, I("-1"))), "f32[T-1]");
    OK("slice_both_ends", INDEX(Tn("f32[T]"), SL(I("1"), I("-1"))), "f32[T-2]");
    OK("slice_known", INDEX(Tn("f32[1024, 768]"), SL(I("0"), I("512"))), "f32[512, 768]");
    OK("select_first", INDEX(Tn("f32[B, T, d]"), IX(I("0"))), "f32[T, d]");
    OK("select_last", INDEX(Tn("f32[B, T, d]"), SL(NULL, NULL), IX(I("-1"))), "f32[B, d]");
    OK("select_unknown", INDEX(Tn("f32[B, T]"), IX(U())), "f32[T]");
    OK("slice_unknown", INDEX(Tn("f32[B, T]"), SL(U(), NULL)), "unknown");
    ERR("slice_past_end", INDEX(Tn("f32[1024, 768]"), SL(I("0"), I("2048"))), 21,
        "slice 0:2048 is out of range for dimension 0 of f32[1024, 768] (size 1024)");
    ERR("slice_past_end_sym", INDEX(Tn("f32[T, d]"), SL(NULL, NULL), SL(I("0"), I("d+1"))), 31,
        "slice 0:d+1 is out of range for dimension 1 of f32[T, d] (size d)");
    ERR("slice_negative_start", INDEX(Tn("f32[8]"), SL(I("-9"), NULL)), 21,
        "slice -9: is out of range for dimension 0 of f32[8] (size 8)");
    ERR("slice_empty", INDEX(Tn("f32[8]"), SL(I("3"), I("3"))), 21, "slice 3:3 of dimension 0 of f32[8] is empty");
    ERR("index_out_of_range", INDEX(Tn("f32[4, 3]"), IX(I("4"))), 21,
        "index 4 is out of range for dimension 0 of f32[4, 3] (size 4)");
    ERR("index_negative_out_of_range", INDEX(Tn("f32[4]"), IX(I("-5"))), 21,
        "index -5 is out of range for dimension 0 of f32[4] (size 4)");
    ERR("too_many_indices", INDEX(Tn("f32[B]"), IX(I("0")), IX(I("0"))), 1,
        "too many indices: f32[B] has rank 1 but 2 indices were given");
    ERR("index_float", INDEX(Tn("f32[B]"), IX(F(0.5))), 21,
        "tensor index must be an integer, a slice or an integer tensor, got float 0.5");
    ERR("slice_float_bound", INDEX(Tn("f32[B]"), SL(F(0.5), NULL)), 21, "slice start must be an integer, got float 0.5");
    ERR("index_int", INDEX(I("3"), IX(I("0"))), 11, "integer 3 cannot be indexed");

    Value *t = seq(V_TUPLE, 2, Tn("f32[B]"), Tn("i32[B]"));
    OK("tuple_index", INDEX(t, IX(I("1"))), "i32[B]");
    OK("tuple_index_negative", INDEX(t, IX(I("-2"))), "f32[B]");
    ERR("tuple_out_of_range", INDEX(t, IX(I("2"))), 21, "index 2 is out of range for a tuple of 2");
    ERR("tuple_symbolic", INDEX(t, IX(I("k"))), 21, "tuple index must be a known integer, got integer k");
    ERR("tuple_slice", INDEX(t, SL(NULL, NULL)), 21, "a tuple cannot be sliced");
    OK("tuple_attr", value_tensor_attr(ar, t, str_from("0"), AT), "f32[B]");
    ERR("tuple_attr_range", value_tensor_attr(ar, t, str_from("5"), AT), 1, "index 5 is out of range for a tuple of 2");
    Value *l = seq(V_LIST, 3, I("1"), I("2"), I("3"));
    OK("list_index", INDEX(l, IX(I("1"))), "integer 2");
    OK("list_index_symbolic", INDEX(l, IX(I("e"))), "integer 1");
    Value *ls = seq(V_LIST, 1, Tn("f32[d]"));
    ls->len = D("layers");
    OK("list_symbolic_len", INDEX(ls, IX(I("i"))), "f32[d]");
    OK("list_symbolic_len_known", INDEX(ls, IX(I("3"))), "f32[d]");
    ERR("list_out_of_range", INDEX(l, IX(I("3"))), 21, "index 3 is out of range for a list of 3");

    OK("transpose_attr", value_tensor_attr(ar, Tn("f32[B, T, d]"), str_from("T"), AT), "f32[B, d, T]");
    ERR("transpose_attr_rank1", value_tensor_attr(ar, Tn("f32[3]"), str_from("T"), AT), 1,
        "'.T' needs a tensor of rank 2 or more, got f32[3]");
    ERR("attr_unknown", value_tensor_attr(ar, Tn("f32[B, T]"), str_from("shape"), AT), 1,
        "tensor f32[B, T] has no attribute 'shape'");
    has("attr_unknown_hint", "hint: a tensor's only attribute is '.T' (its last two dimensions swapped)");
    ERR("attr_on_int", value_tensor_attr(ar, I("3"), str_from("T"), AT), 1, "integer 3 has no attribute 'T'");
    OK("attr_unknown_base", value_tensor_attr(ar, U(), str_from("T"), AT), "unknown");
}

/* ---- builtins ---- */

static void test_builtin_table(void) {
    int all = 1;
    for (int i = 0; i < builtin_count(); i++) {
        const Builtin *b = builtin_find(str_from(builtin_name_at(i)));
        if (!b || strcmp(builtin_name(b), builtin_name_at(i)) != 0) all = 0;
    }
    check("builtin_table", all && builtin_count() >= 40, "table lookups");
    check("builtin_not_found", builtin_find(str_from("normal")) == NULL && builtin_find(str_from("lyernorm")) == NULL,
          "initialisers are not builtins");
    OK("pi_value", builtin_value(ar, builtin_find(str_from("pi")), AT), "float 3.141592653589793");
    ERR("pi_call", call0("pi"), 1, "'pi' is a number, not a function");
    ERR("pi_call_args", CALL("pi", A(I("1"))), 1, "'pi' is a number, not a function");
}

static void test_builtin_binding(void) {
    Value *x = Tn("f32[B, T, 768]"), *w = Tn("f32[768]");
    ERR("missing_arg", CALL("layernorm", A(x), A(w)), 1, "layernorm: missing argument 'b'");
    has("missing_arg_hint", "hint: usage: layernorm(x, w, b, eps = 1e-5)");
    ERR("unknown_kw", CALL("layernorm", A(x), A(w), A(w), K("esp", F(1e-5))), 41, "layernorm: unknown keyword argument 'esp'");
    has("unknown_kw_hint", "hint: did you mean 'eps'?");
    ERR("unknown_kw_far", CALL("softmax", A(x), K("dimension", I("1"))), 21, "softmax: unknown keyword argument 'dimension'");
    has("unknown_kw_far_hint", "hint: usage: softmax(x, axis = -1)");
    ERR("duplicate_kw", CALL("layernorm", A(x), A(w), A(w), K("w", w)), 41, "layernorm: argument 'w' given twice");
    ERR("duplicate_kw_kw", CALL("softmax", A(x), K("axis", I("1")), K("axis", I("0"))), 31,
        "softmax: argument 'axis' given twice");
    ERR("too_many", CALL("layernorm", A(x), A(w), A(w), A(F(1e-5)), A(I("1"))), 51,
        "layernorm: takes at most 4 arguments, got 5");
    ERR("too_many_one", CALL("arange", A(I("3")), A(I("4"))), 21, "arange: takes at most 1 argument, got 2");
    OK("kw_positional_name", CALL("layernorm", K("x", x), K("w", w), K("b", w)), "f32[B, T, 768]");
    OK("unknown_arg_silent", CALL("layernorm", A(U()), A(w), A(w)), "unknown");
}

static void test_builtin_math(void) {
    static const char *const names[] = {"exp",  "log",  "sqrt", "rsqrt", "tanh", "sigmoid", "relu",
                                        "gelu", "silu", "abs",  "sign",  "sin",  "cos"};
    char name[64];
    for (int i = 0; i < 13; i++) {
        snprintf(name, sizeof name, "%s_tensor", names[i]);
        OK(name, CALL(names[i], A(Tn("bf16[B, T]"))), "bf16[B, T]");
        snprintf(name, sizeof name, "%s_unknown_float", names[i]);
        OK(name, CALL(names[i], A(Fu())), "float");
    }
    OK("sqrt_fold", CALL("sqrt", A(F(2))), "float 1.4142135623730951");
    OK("rsqrt_fold", CALL("rsqrt", A(I("4"))), "float 0.5");
    OK("cos_fold", CALL("cos", A(F(0))), "float 1.0");
    OK("exp_fold", CALL("exp", A(I("0"))), "float 1.0");
    OK("log_fold", CALL("log", A(F(1))), "float 0.0");
    OK("abs_int", CALL("abs", A(I("-3"))), "integer 3");
    OK("relu_int", CALL("relu", A(I("-3"))), "integer 0");
    OK("sign_float", CALL("sign", A(F(-2.5))), "float -1.0");
    OK("sigmoid_fold", CALL("sigmoid", A(F(0))), "float 0.5");
    OK("relu_int_tensor", CALL("relu", A(Tn("i32[B]"))), "i32[B]");
    OK("abs_sym", CALL("abs", A(I("d"))), "unknown");
    OK("exp_sym", CALL("exp", A(I("d"))), "float");
    ERR("exp_int_tensor", CALL("exp", A(Tn("i32[B, T]"))), 11, "exp: needs a float tensor, got i32[B, T]");
    has("exp_int_tensor_hint", "hint: convert with float(x)");
    ERR("sqrt_negative", CALL("sqrt", A(F(-1))), 11, "sqrt: the argument must not be negative, got -1.0");
    ERR("log_zero", CALL("log", A(I("0"))), 11, "log: the argument must be positive, got 0.0");
    ERR("rsqrt_zero", CALL("rsqrt", A(F(0))), 11, "rsqrt: the argument must be positive, got 0.0");
    ERR("exp_overflow", CALL("exp", A(F(1000))), 11, "exp: the result for 1000.0 is not a finite number");
    ERR("tanh_string", CALL("tanh", A(S("s"))), 11, "tanh: 'x' must be a number or a tensor, got string");
    ERR("relu_bool_tensor", CALL("relu", A(Tn("bool[B]"))), 11, "relu: needs a float tensor, got bool[B]");

    OK("float_int", CALL("float", A(I("3"))), "float 3.0");
    OK("float_sym", CALL("float", A(I("d"))), "float");
    OK("float_tensor", CALL("float", A(Tn("i32[B]"))), "f32[B]");
    OK("float_bool", CALL("float", A(Bo(1))), "float 1.0");
    OK("int_float", CALL("int", A(F(2.7))), "integer 2");
    OK("int_negative", CALL("int", A(F(-2.7))), "integer -2");
    OK("int_tensor", CALL("int", A(Tn("f32[B]"))), "i32[B]");
    OK("int_sym", CALL("int", A(I("d"))), "integer d");
    OK("floor_float", CALL("floor", A(F(-2.5))), "integer -3");
    OK("floor_fraction", CALL("floor", A(bin(OP_DIV, I("7"), I("2")))), "integer 3");
    OK("floor_tensor", CALL("floor", A(Tn("f32[B]"))), "f32[B]");
    OK("floor_unknown", CALL("floor", A(Fu())), "float");
    ERR("int_string", CALL("int", A(S("s"))), 11, "int: 'x' must be a number or a tensor, got string");
    ERR("int_huge", CALL("int", A(F(1e30))), 11, "int: 1e30 does not fit in 62 bits");
    ERR("floor_int_tensor", CALL("floor", A(Tn("i32[B]"))), 11, "floor: needs a float tensor, got i32[B]");
}

static void test_builtin_shapes(void) {
    Value *x = Tn("f32[B, T, d]");
    OK("matmul_fn", CALL("matmul", A(Tn("f32[B, T, d]")), A(Tn("f32[d, 4*d]"))), "f32[B, T, d*4]");
    ERR("matmul_fn_inner", CALL("matmul", A(Tn("f32[n, 3]")), A(Tn("f32[4, m]"))), 1,
        "matmul: inner dimensions differ: f32[n, 3] @ f32[4, m] (3 vs 4)");

    OK("transpose", CALL("transpose", A(x), A(I("0")), A(I("-1"))), "f32[d, T, B]");
    OK("transpose_heads", CALL("transpose", A(Tn("f32[B, T, H, hd]")), A(I("1")), A(I("2"))), "f32[B, H, T, hd]");
    ERR("transpose_axis", CALL("transpose", A(x), A(I("0")), A(I("3"))), 31,
        "transpose: axis 3 is out of range for f32[B, T, d] (rank 3)");
    has("transpose_axis_hint", "hint: axes count from 0, or from the end with -1");
    ERR("transpose_axis_float", CALL("transpose", A(x), A(F(1.5)), A(I("0"))), 21,
        "transpose: axis must be a known integer, got float 1.5");
    ERR("transpose_axis_sym", CALL("transpose", A(x), A(I("k")), A(I("0"))), 21,
        "transpose: axis must be a known integer, got integer k");

    OK("reshape_heads", CALL("reshape", A(x), A(I("B")), A(I("T")), A(I("heads")), A(I("d/heads"))), "f32[B, T, heads, d/heads]");
    OK("reshape_infer_sym", CALL("reshape", A(x), A(I("B")), A(I("T")), A(I("heads")), A(I("-1"))), "f32[B, T, heads, d/heads]");
    OK("reshape_infer_known", CALL("reshape", A(Tn("f32[B, T, 768]")), A(I("B")), A(I("T")), A(I("12")), A(I("-1"))),
       "f32[B, T, 12, 64]");
    OK("reshape_merge", CALL("reshape", A(Tn("f32[B, T, heads, d/heads]")), A(I("B")), A(I("T")), A(I("d"))), "f32[B, T, d]");
    OK("reshape_tuple", CALL("reshape", A(x), A(seq(V_TUPLE, 2, I("B"), I("T*d")))), "f32[B, T*d]");
    OK("reshape_flatten", CALL("reshape", A(x), A(I("-1"))), "f32[B*T*d]");
    ERR("reshape_count", CALL("reshape", A(Tn("f32[B, T, 768]")), A(I("B")), A(I("T")), A(I("12")), A(I("32"))), 1,
        "reshape: f32[B, T, 768] has B*T*768 elements but the new shape [B, T, 12, 32] has B*T*384");
    has("reshape_count_hint", "hint: the product of the new dimensions must equal the product of the old ones");
    ERR("reshape_symbolic_count", CALL("reshape", A(x), A(I("B")), A(I("T")), A(I("768"))), 1,
        "reshape: f32[B, T, d] has B*T*d elements but the new shape [B, T, 768] has B*T*768");
    ERR("reshape_infer_inexact", CALL("reshape", A(Tn("f32[10]")), A(I("3")), A(I("-1"))), 1,
        "reshape: cannot infer the -1 in [3, -1]: f32[10] has 10 elements, not a multiple of 3");
    ERR("reshape_two_infer", CALL("reshape", A(x), A(I("-1")), A(I("-1"))), 31, "reshape: only one dimension can be -1");
    ERR("reshape_zero", CALL("reshape", A(x), A(I("B")), A(I("0"))), 31, "reshape: dimension 1 must be positive, got 0");
    ERR("reshape_float_dim", CALL("reshape", A(x), A(F(2.5))), 21, "reshape: dimension 0 must be an integer, got float 2.5");
    ERR("reshape_nothing", CALL("reshape", A(x)), 1, "reshape: missing the new dimensions");
    ERR("reshape_not_tensor", CALL("reshape", A(I("3")), A(I("3"))), 11, "reshape: 'x' must be a tensor, got integer 3");

    Value *qkv = CALL("split", A(Tn("f32[B, T, 3*d]")), A(I("3")), K("axis", I("-1")));
    OK("split_tuple", qkv, "tuple of 3");
    OK("split_item", qkv->kind == V_TUPLE ? qkv->items[2] : U(), "f32[B, T, d]");
    OK("split_known", CALL("split", A(Tn("f32[B, 2304]")), A(I("3")))->items[0], "f32[B, 768]");
    Value *sz = CALL("split", A(Tn("f32[10, d]")), A(seq(V_LIST, 2, I("3"), I("7"))), K("axis", I("0")));
    OK("split_sizes", sz->kind == V_TUPLE ? sz->items[1] : U(), "f32[7, d]");
    ERR("split_inexact", CALL("split", A(Tn("f32[B, T, 768]")), A(I("5"))), 21,
        "split: dimension 2 of f32[B, T, 768] (size 768) does not divide into 5 equal parts");
    ERR("split_sizes_sum", CALL("split", A(Tn("f32[10]")), A(seq(V_LIST, 2, I("3"), I("6")))), 21,
        "split: the sizes add up to 9 but dimension 0 of f32[10] is 10");
    ERR("split_symbolic_n", CALL("split", A(x), A(I("heads"))), 21,
        "split: the number of parts must be known at compile time, got integer heads");
    ERR("split_zero", CALL("split", A(x), A(I("0"))), 21, "split: the number of parts must be between 1 and 4096, got 0");
    ERR("split_axis", CALL("split", A(x), A(I("2")), K("axis", I("3"))), 31,
        "split: axis 3 is out of range for f32[B, T, d] (rank 3)");

    OK("concat", CALL("concat", A(seq(V_LIST, 2, Tn("f32[B, T, 64]"), Tn("f32[B, T, 32]")))), "f32[B, T, 96]");
    OK("concat_axis0", CALL("concat", A(seq(V_TUPLE, 2, Tn("f32[T, d]"), Tn("f32[1, d]"))), K("axis", I("0"))), "f32[T+1, d]");
    Value *heads = seq(V_LIST, 1, Tn("f32[B, T, hd]"));
    heads->len = D("heads");
    OK("concat_symbolic_list", CALL("concat", A(heads)), "f32[B, T, hd*heads]");
    ERR("concat_mismatch", CALL("concat", A(seq(V_LIST, 2, Tn("f32[B, T, 64]"), Tn("f32[B, S, 64]")))), 11,
        "concat: item 1 has shape f32[B, S, 64] but item 0 has shape f32[B, T, 64]");
    has("concat_mismatch_hint", "hint: dimension 1 differs; only the concatenation axis (2) may");
    ERR("concat_not_list", CALL("concat", A(Tn("f32[3]"))), 11, "concat: 'xs' must be a list of tensors, got f32[3]");
    ERR("concat_empty", CALL("concat", A(seq(V_LIST, 0))), 11, "concat: the list is empty");
    ERR("concat_item", CALL("concat", A(seq(V_LIST, 2, Tn("f32[3]"), I("1")))), 11, "concat: item 1 is integer 1, not a tensor");

    OK("sum_all", CALL("sum", A(x)), "f32[]");
    OK("sum_axis", CALL("sum", A(x), K("axis", I("1"))), "f32[B, d]");
    OK("sum_axis_positional_keepdim", CALL("sum", A(x), A(I("1")), A(Bo(1))), "f32[B, 1, d]");
    OK("sum_all_keepdim", CALL("sum", A(x), K("keepdim", Bo(1))), "f32[1, 1, 1]");
    OK("sum_bool", CALL("sum", A(Tn("bool[B]"))), "i32[]");
    OK("mean_int", CALL("mean", A(Tn("i32[B, T]")), K("axis", I("-1"))), "f32[B]");
    OK("max_axis", CALL("max", A(x), K("axis", I("-1"))), "f32[B, T]");
    OK("min_all", CALL("min", A(Tn("i32[B]"))), "i32[]");
    OK("max_elementwise", CALL("max", A(x), A(Tn("f32[d]"))), "f32[B, T, d]");
    OK("max_tensor_number", CALL("max", A(x), A(F(0))), "f32[B, T, d]");
    OK("max_numbers", CALL("max", A(I("3")), A(I("5"))), "integer 5");
    OK("max_symbolic_decided", CALL("max", A(I("T")), A(I("T-1"))), "integer T");
    OK("min_floats", CALL("min", A(F(0.5)), A(I("2"))), "float 0.5");
    OK("max_symbolic_unknown", CALL("max", A(I("d")), A(I("64"))), "unknown");
    OK("max_float_unknown", CALL("max", A(Fu()), A(F(0.1))), "float");
    ERR("max_axis_range", CALL("max", A(x), K("axis", I("5"))), 21, "max: axis 5 is out of range for f32[B, T, d] (rank 3)");
    ERR("sum_number", CALL("sum", A(I("3"))), 11, "sum: 'x' must be a tensor, got integer 3");
    ERR("max_mismatch", CALL("max", A(Tn("f32[3]")), A(Tn("f32[4]"))), 1, "max: shape mismatch: f32[3] and f32[4]");
    ERR("max_keepdim_two", CALL("max", A(x), A(x), K("keepdim", Bo(1))), 31,
        "max: keepdim applies only to a reduction of one tensor");
    ERR("sum_keepdim_int", CALL("sum", A(x), K("keepdim", I("1"))), 21, "sum: 'keepdim' must be true or false, got integer 1");

    OK("softmax", CALL("softmax", A(x)), "f32[B, T, d]");
    OK("log_softmax_axis", CALL("log_softmax", A(x), K("axis", I("0"))), "f32[B, T, d]");
    OK("logsumexp", CALL("logsumexp", A(x)), "f32[B, T]");
    OK("logsumexp_keepdim", CALL("logsumexp", A(x), K("axis", I("0")), K("keepdim", Bo(1))), "f32[1, T, d]");
    ERR("softmax_int", CALL("softmax", A(Tn("i32[B]"))), 11, "softmax: 'x' must be a float tensor, got i32[B]");
    ERR("logsumexp_axis", CALL("logsumexp", A(x), K("axis", I("-4"))), 21,
        "logsumexp: axis -4 is out of range for f32[B, T, d] (rank 3)");
}

static void test_builtin_layers(void) {
    Value *x = Tn("f32[B, T, 768]"), *w = Tn("f32[768]");
    OK("layernorm", CALL("layernorm", A(x), A(w), A(w)), "f32[B, T, 768]");
    OK("layernorm_eps", CALL("layernorm", A(x), A(w), A(w), K("eps", F(1e-6))), "f32[B, T, 768]");
    ERR("layernorm_weight", CALL("layernorm", A(x), A(remote(Tn("f32[512]"))), A(w)), 21,
        "layernorm: weight has shape f32[512] but x's last dimension is 768");
    has("layernorm_weight_note", "t.mbt:2:1: note: the shape of 'w' comes from here");
    has("layernorm_weight_hint", "hint: layernorm's weight and bias have shape [n], where n is x's last dimension");
    ERR("layernorm_bias", CALL("layernorm", A(x), A(w), A(Tn("f32[768, 1]"))), 31,
        "layernorm: bias has shape f32[768, 1] but x's last dimension is 768");
    ERR("layernorm_dtype", CALL("layernorm", A(x), A(Tn("bf16[768]")), A(w)), 21,
        "layernorm: weight is bf16[768] but x is f32[B, T, 768]; their dtypes differ");
    ERR("layernorm_eps_zero", CALL("layernorm", A(x), A(w), A(w), K("eps", F(0))), 41,
        "layernorm: 'eps' must be positive, got 0.0");
    ERR("layernorm_scalar", CALL("layernorm", A(Tn("f32[]")), A(w), A(w)), 11,
        "layernorm: 'x' must have at least one dimension, got f32[]");
    OK("rmsnorm", CALL("rmsnorm", A(Tn("bf16[B, T, d]")), A(Tn("bf16[d]"))), "bf16[B, T, d]");
    ERR("rmsnorm_weight", CALL("rmsnorm", A(Tn("f32[B, T, d]")), A(Tn("f32[d*4]"))), 21,
        "rmsnorm: weight has shape f32[d*4] but x's last dimension is d");
    has("rmsnorm_weight_hint", "hint: rmsnorm's weight has shape [n], where n is x's last dimension");
    ERR("rmsnorm_int_weight", CALL("rmsnorm", A(x), A(Tn("i32[768]"))), 21, "rmsnorm: 'w' must be a float tensor, got i32[768]");

    OK("rope", CALL("rope", A(Tn("f32[B, H, T, 64]"))), "f32[B, H, T, 64]");
    OK("rope_symbolic", CALL("rope", A(Tn("f32[B, H, T, d/heads]")), K("theta", F(500000))), "f32[B, H, T, d/heads]");
    ERR("rope_odd", CALL("rope", A(Tn("f32[B, H, T, 63]"))), 11,
        "rope: the last dimension of f32[B, H, T, 63] must be even, got 63");
    ERR("rope_rank", CALL("rope", A(Tn("f32[64]"))), 11, "rope: 'x' must have rank 2 or more ([..., T, hd]), got f32[64]");
    ERR("rope_theta", CALL("rope", A(Tn("f32[T, 64]")), K("theta", F(-1))), 21, "rope: 'theta' must be positive, got -1.0");

    Value *q = Tn("f32[B, H, T, hd]");
    OK("attention", CALL("attention", A(q), A(q), A(q)), "f32[B, H, T, hd]");
    OK("attention_gqa",
       CALL("attention", A(Tn("f32[B, 12, T, 64]")), A(Tn("f32[B, 4, S, 64]")), A(Tn("f32[B, 4, S, 32]")), K("causal", Bo(0))),
       "f32[B, 12, T, 32]");
    ERR("attention_heads", CALL("attention", A(Tn("f32[B, 12, T, 64]")), A(Tn("f32[B, 5, T, 64]")), A(Tn("f32[B, 5, T, 64]"))),
        21, "attention: 'q' has 12 heads, not a multiple of the 5 heads of 'k'");
    ERR("attention_hd", CALL("attention", A(Tn("f32[B, H, T, 64]")), A(Tn("f32[B, H, T, 32]")), A(Tn("f32[B, H, T, 32]"))), 21,
        "attention: the head dimension of 'k' is 32 but that of 'q' is 64");
    ERR("attention_batch", CALL("attention", A(q), A(Tn("f32[2, H, T, hd]")), A(q)), 21,
        "attention: the batch dimension of 'k' is 2 but that of 'q' is B");
    ERR("attention_v", CALL("attention", A(q), A(q), A(Tn("f32[B, H, S, hd]"))), 31,
        "attention: 'v' has shape f32[B, H, S, hd] but 'k' has shape f32[B, H, T, hd]; they must agree in B, Hk and S");
    ERR("attention_rank", CALL("attention", A(Tn("f32[B, T, 768]")), A(q), A(q)), 11,
        "attention: 'q' must have rank 4 [B, H, T, hd], got f32[B, T, 768]");
    ERR("attention_causal", CALL("attention", A(q), A(q), A(q), K("causal", I("1"))), 41,
        "attention: 'causal' must be true or false, got integer 1");
    ERR("attention_dtype", CALL("attention", A(q), A(Tn("bf16[B, H, T, hd]")), A(q)), 21,
        "attention: 'k' is bf16[B, H, T, hd] but 'q' is f32[B, H, T, hd]; their dtypes differ");

    OK("cross_entropy", CALL("cross_entropy", A(Tn("f32[B, T, V]")), A(Tn("i32[B, T]"))), "f32[]");
    ERR("cross_entropy_float_targets", CALL("cross_entropy", A(Tn("f32[B, T, V]")), A(Tn("f32[B, T]"))), 21,
        "cross_entropy: 'targets' must be an integer tensor, got f32[B, T]");
    ERR("cross_entropy_shape", CALL("cross_entropy", A(Tn("f32[B, T, V]")), A(Tn("i32[B, S]"))), 21,
        "cross_entropy: 'targets' has shape i32[B, S] but 'logits' has shape f32[B, T, V]");
    has("cross_entropy_shape_hint", "hint: targets must have the shape of logits without its last (class) dimension");
    ERR("cross_entropy_int_logits", CALL("cross_entropy", A(Tn("i32[B, V]")), A(Tn("i32[B]"))), 11,
        "cross_entropy: 'logits' must be a float tensor, got i32[B, V]");
    OK("mse", CALL("mse", A(Tn("f32[B, 1]")), A(Tn("f32[B, 1]"))), "f32[]");
    ERR("mse_shapes", CALL("mse", A(Tn("f32[3]")), A(Tn("f32[4]"))), 1, "mse: shapes differ: f32[3] vs f32[4]");
    ERR("mse_dtypes", CALL("mse", A(Tn("f32[3]")), A(Tn("bf16[3]"))), 1, "mse: dtypes differ: f32[3] vs bf16[3]");

    Value *tk = CALL("topk", A(Tn("f32[B, V]")), A(I("5")));
    OK("topk", tk, "tuple of 2");
    OK("topk_values", tk->kind == V_TUPLE ? tk->items[0] : U(), "f32[B, 5]");
    OK("topk_indices", tk->kind == V_TUPLE ? tk->items[1] : U(), "i32[B, 5]");
    Value *tk0 = CALL("topk", A(Tn("f32[E, T]")), A(I("k")), K("axis", I("0")));
    OK("topk_axis", tk0->kind == V_TUPLE ? tk0->items[1] : U(), "i32[k, T]");
    ERR("topk_too_big", CALL("topk", A(Tn("f32[B, 4]")), A(I("5"))), 21,
        "topk: k = 5 is larger than dimension 1 of f32[B, 4] (size 4)");
    ERR("topk_zero", CALL("topk", A(Tn("f32[B, 4]")), A(I("0"))), 21, "topk: 'k' must be positive, got 0");

    OK("where", CALL("where", A(Tn("bool[T, T]")), A(Tn("f32[B, H, T, T]")), A(F(-1e9))), "f32[B, H, T, T]");
    OK("where_numbers", CALL("where", A(Tn("bool[B]")), A(I("1")), A(I("0"))), "i32[B]");
    OK("where_scalar_cond", CALL("where", A(Bo(1)), A(I("1")), A(I("2"))), "integer 1");
    ERR("where_cond", CALL("where", A(Tn("f32[B, T]")), A(F(1)), A(F(0))), 11,
        "where: the condition must be a bool or a bool tensor, got f32[B, T]");
    ERR("where_mismatch", CALL("where", A(Tn("bool[3]")), A(Tn("f32[3]")), A(Tn("f32[4]"))), 1,
        "where: shape mismatch: f32[3] and f32[4]");
    ERR("where_dtype", CALL("where", A(Tn("bool[3]")), A(Tn("f32[3]")), A(Tn("f16[3]"))), 1,
        "where: dtype mismatch: f32[3] and f16[3]");

    OK("one_hot", CALL("one_hot", A(Tn("i32[B, T]")), A(I("V"))), "f32[B, T, V]");
    ERR("one_hot_float", CALL("one_hot", A(Tn("f32[B]")), A(I("10"))), 11,
        "one_hot: 'idx' must be an integer tensor, got f32[B]");
    ERR("one_hot_zero", CALL("one_hot", A(Tn("i32[B]")), A(I("0"))), 21, "one_hot: 'n' must be positive, got 0");
    OK("arange", CALL("arange", A(I("T"))), "i32[T]");
    ERR("arange_float", CALL("arange", A(F(0.5))), 11, "arange: 'n' must be an integer, got float 0.5");
    Value *half7 = value_int(ar, dim_subst(ar, D("d/2"), "d", dim_int(ar, 7)), span_none());
    ERR("arange_fraction", CALL("arange", A(half7)), 11, "arange: 'n' must be an integer, got integer 7/2");
    OK("zeros", CALL("zeros", A(I("B")), A(I("T"))), "f32[B, T]");
    OK("ones_tuple", CALL("ones", A(seq(V_TUPLE, 2, I("3"), I("4")))), "f32[3, 4]");
    OK("zeros_scalar", call0("zeros"), "f32[]");
    ERR("zeros_negative", CALL("zeros", A(I("3")), A(I("-1"))), 21, "zeros: dimension 1 must be positive, got -1");
    ERR("ones_string", CALL("ones", A(S("a"))), 11, "ones: dimension 0 must be an integer, got string");

    OK("dropout", CALL("dropout", A(x), A(F(0.1))), "f32[B, T, 768]");
    ERR("dropout_p", CALL("dropout", A(x), A(F(1.5))), 21, "dropout: 'p' must be in [0, 1), got 1.5");
    ERR("dropout_int_tensor", CALL("dropout", A(Tn("i32[B]")), A(F(0.1))), 11, "dropout: 'x' must be a float tensor, got i32[B]");
    OK("norm", CALL("norm", A(x)), "f32[]");
    ERR("norm_number", CALL("norm", A(I("3"))), 11, "norm: 'x' must be a tensor, got integer 3");
    OK("clamp_tensor", CALL("clamp", A(x), A(F(-1)), A(F(1))), "f32[B, T, 768]");
    OK("clamp_int", CALL("clamp", A(I("5")), A(I("0")), A(I("3"))), "integer 3");
    OK("clamp_float", CALL("clamp", A(F(0.5)), A(F(0)), A(F(1))), "float 0.5");
    OK("clamp_unknown", CALL("clamp", A(Fu()), A(F(0)), A(F(1))), "float");
    ERR("clamp_order", CALL("clamp", A(x), A(F(1)), A(F(0))), 1, "clamp: 'lo' (1.0) is greater than 'hi' (0.0)");
    ERR("clamp_string", CALL("clamp", A(x), A(S("a")), A(I("1"))), 21, "clamp: 'lo' must be a number, got string");
}

int main(void) {
    static char text[402];
    memset(text, ' ', sizeof text);
    text[200] = '\n';
    text[401] = '\n';
    src_file = diag_add_source("t.mbt", text, sizeof text);

    test_printing();
    test_numbers();
    test_tensors();
    test_indexing();
    test_builtin_table();
    test_builtin_binding();
    test_builtin_math();
    test_builtin_shapes();
    test_builtin_layers();

    arena_free(ar);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
