/* test_parse.c - unit tests of the parser (grammar/mbt.y driven by compiler/parse.c): the shape of
 * the AST for each syntax form, written as an s-expression; precedence and associativity; spans;
 * syntax errors and recovery at the next declaration. Run from the repository root (one test
 * parses examples/ and stdlib/). Prints `PASS name` / `FAIL name: ...` and `N passed, M failed`. */
#include "unit.h"

#include <dirent.h>
#include <stdint.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "parse.h"

/* ---- the s-expression rendering ------------------------------------------------------------ */

static void sx(Buf *b, const Node *n);

static void sx_list(Buf *b, const NodeList *l) {
    for (int i = 0; i < l->n; i++) {
        buf_printf(b, " ");
        sx(b, l->v[i]);
    }
}

static const char *unop(Op op) { return op == OP_NEG ? "neg" : op == OP_POS ? "pos" : op == OP_NOT ? "not" : "?"; }

/* names: x; literals: 1 2.5 "s" true; (op a b); (neg a); (.. a b); (call f args); k=v; (index b i);
 * (: lo hi) with _ for a missing bound; (. b name); (tuple ...); [list ...]; (comp e v iter);
 * statements and declarations as (kind ...). */
static void sx(Buf *b, const Node *n) {
    if (!n) {
        buf_printf(b, "_");
        return;
    }
    switch (n->kind) {
    case N_NAME: buf_printf(b, "%.*s", (int)n->name.len, n->name.p); break;
    case N_INT: buf_printf(b, "%lld", (long long)n->ival); break;
    case N_FLOAT: buf_printf(b, "%g", n->fval); break;
    case N_BOOL: buf_printf(b, "%s", n->ival ? "true" : "false"); break;
    case N_STRING:
        buf_printf(b, "\"");
        for (uint32_t i = 0; i < n->slen; i++) {
            char c = n->sval[i];
            if (c == '\n') buf_printf(b, "\\n");
            else if (c == '\t') buf_printf(b, "\\t");
            else if (c == '"' || c == '\\') buf_printf(b, "\\%c", c);
            else buf_printf(b, "%c", c);
        }
        buf_printf(b, "\"");
        break;
    case N_BINARY:
        buf_printf(b, "(%s ", ast_op_text(n->op));
        sx(b, n->a);
        buf_printf(b, " ");
        sx(b, n->b);
        buf_printf(b, ")");
        break;
    case N_UNARY:
        buf_printf(b, "(%s ", unop(n->op));
        sx(b, n->a);
        buf_printf(b, ")");
        break;
    case N_RANGE:
        buf_printf(b, "(.. ");
        sx(b, n->a);
        buf_printf(b, " ");
        sx(b, n->b);
        buf_printf(b, ")");
        break;
    case N_CALL:
        buf_printf(b, "(call ");
        sx(b, n->a);
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_KWARG:
        buf_printf(b, "%.*s=", (int)n->name.len, n->name.p);
        sx(b, n->a);
        break;
    case N_INDEX:
        buf_printf(b, "(index ");
        sx(b, n->a);
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_SLICE:
        buf_printf(b, "(: ");
        sx(b, n->a);
        buf_printf(b, " ");
        sx(b, n->b);
        buf_printf(b, ")");
        break;
    case N_ATTR:
        buf_printf(b, "(. ");
        sx(b, n->a);
        buf_printf(b, " %.*s)", (int)n->name.len, n->name.p);
        break;
    case N_TUPLE:
        buf_printf(b, "(tuple");
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_LIST:
        buf_printf(b, "[list");
        sx_list(b, &n->list);
        buf_printf(b, "]");
        break;
    case N_COMP:
        buf_printf(b, "(comp ");
        sx(b, n->a);
        buf_printf(b, " %.*s ", (int)n->name.len, n->name.p);
        sx(b, n->b);
        buf_printf(b, ")");
        break;
    case N_TYPE:
        buf_printf(b, "%.*s", (int)n->name.len, n->name.p);
        if (n->ival) {
            buf_printf(b, "[");
            for (int i = 0; i < n->list.n; i++) {
                if (i) buf_printf(b, ", ");
                sx(b, n->list.v[i]);
            }
            buf_printf(b, "]");
        }
        break;
    case N_FPARAM:
        buf_printf(b, "%.*s", (int)n->name.len, n->name.p);
        if (n->type) {
            buf_printf(b, ":");
            sx(b, n->type);
        }
        if (n->a) {
            buf_printf(b, "=");
            sx(b, n->a);
        }
        break;
    case N_ASSIGN:
        buf_printf(b, "(=");
        sx_list(b, &n->list);
        buf_printf(b, " ");
        sx(b, n->a);
        buf_printf(b, ")");
        break;
    case N_AUG_ASSIGN:
        buf_printf(b, "(%s= ", ast_op_text(n->op));
        sx(b, n->a);
        buf_printf(b, " ");
        sx(b, n->b);
        buf_printf(b, ")");
        break;
    case N_PARAM_DECL:
        buf_printf(b, "(param %.*s ", (int)n->name.len, n->name.p);
        sx(b, n->type);
        if (n->a) {
            buf_printf(b, " ~ ");
            sx(b, n->a);
        }
        buf_printf(b, ")");
        break;
    case N_EXPR_STMT:
        buf_printf(b, "(expr ");
        sx(b, n->a);
        buf_printf(b, ")");
        break;
    case N_RETURN:
        buf_printf(b, "(return");
        if (n->a) {
            buf_printf(b, " ");
            sx(b, n->a);
        }
        buf_printf(b, ")");
        break;
    case N_FOR:
        buf_printf(b, "(for %.*s ", (int)n->name.len, n->name.p);
        sx(b, n->a);
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_IF:
        buf_printf(b, "(if ");
        sx(b, n->a);
        buf_printf(b, " (then");
        sx_list(b, &n->list);
        buf_printf(b, ")");
        if (n->list2.n) {
            buf_printf(b, " (else");
            sx_list(b, &n->list2);
            buf_printf(b, ")");
        }
        buf_printf(b, ")");
        break;
    case N_STATE:
        buf_printf(b, "(state");
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_SETTING:
        buf_printf(b, "(set %.*s ", (int)n->name.len, n->name.p);
        sx(b, n->a);
        buf_printf(b, ")");
        break;
    case N_SETTING_BLOCK:
        buf_printf(b, "(block %.*s", (int)n->name.len, n->name.p);
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_IMPORT:
        buf_printf(b, "(import %.*s", (int)n->name.len, n->name.p);
        if (n->alias.len) buf_printf(b, " as %.*s", (int)n->alias.len, n->alias.p);
        buf_printf(b, ")");
        break;
    case N_MODEL:
    case N_FN:
    case N_OPTIMIZER:
        buf_printf(b, "(%s %.*s (", ast_kind_name(n->kind), (int)n->name.len, n->name.p);
        for (int i = 0; i < n->list.n; i++) {
            if (i) buf_printf(b, " ");
            sx(b, n->list.v[i]);
        }
        buf_printf(b, ")");
        if (n->type) {
            buf_printf(b, " -> ");
            sx(b, n->type);
        }
        sx_list(b, &n->list2);
        buf_printf(b, ")");
        break;
    case N_TRAIN:
    case N_SERVE:
        buf_printf(b, "(%s %.*s", ast_kind_name(n->kind), (int)n->name.len, n->name.p);
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    case N_PROGRAM:
        buf_printf(b, "(program");
        sx_list(b, &n->list);
        buf_printf(b, ")");
        break;
    default: buf_printf(b, "(?%d)", (int)n->kind); break;
    }
}

/* ---- parsing helpers ---------------------------------------------------------------------- */

typedef struct Parsed {
    Arena ar;
    Node *prog;
    uint32_t file;
    int errors;      /* diag errors while parsing */
    const char *log; /* what diag printed */
    const char *text;
    size_t len;
} Parsed;

static Parsed parse_text(const char *src, size_t len) {
    Parsed p;
    memset(&p, 0, sizeof p);
    char *copy = malloc(len + 1); /* kept: diag holds on to the text */
    if (!copy) exit(1);
    memcpy(copy, src, len);
    copy[len] = 0;
    p.text = copy;
    p.len = len;
    p.file = diag_add_source("test.mbt", copy, (uint32_t)len);
    int before = diag_error_count();
    capture_begin();
    p.prog = parse_source(&p.ar, p.file);
    p.log = strdup(capture_end());
    p.errors = diag_error_count() - before;
    return p;
}

static void parsed_free(Parsed *p) {
    arena_free(&p->ar);
    free((void *)p->log);
}

static char *render(const Node *n) {
    Buf b = {0};
    sx(&b, n);
    return b.p ? b.p : strdup("");
}

/* A well-placed span: inside the file, non-empty, with line and column matching its offset. */
static int span_ok(const Parsed *p, const Node *n, char *why, size_t whylen) {
    Span s = n->span;
    if (s.file != p->file) return snprintf(why, whylen, "%s: file %u", ast_kind_name(n->kind), s.file), 0;
    if (s.off + s.len > p->len) return snprintf(why, whylen, "%s: ends past the file", ast_kind_name(n->kind)), 0;
    if (s.len == 0) return snprintf(why, whylen, "%s at %u:%u: empty span", ast_kind_name(n->kind), s.line, s.col), 0;
    uint32_t line = 1, col = 1;
    for (uint32_t i = 0; i < s.off; i++) {
        if (p->text[i] == '\n') line++, col = 1;
        else col++;
    }
    if (line != s.line || col != s.col)
        return snprintf(why, whylen, "%s: says %u:%u, its offset is at %u:%u", ast_kind_name(n->kind), s.line, s.col, line, col),
               0;
    return 1;
}

/* Every node's span is well placed and covers its children's spans. */
static int spans_nested(const Parsed *p, const Node *n, const Node *parent, char *why, size_t whylen) {
    if (!n) return 1;
    if (n->kind != N_PROGRAM) {
        if (!span_ok(p, n, why, whylen)) return 0;
        if (parent && parent->kind != N_PROGRAM &&
            (n->span.off < parent->span.off || n->span.off + n->span.len > parent->span.off + parent->span.len))
            return snprintf(why, whylen, "%s at %u:%u is not inside its parent %s at %u:%u", ast_kind_name(n->kind), n->span.line,
                            n->span.col, ast_kind_name(parent->kind), parent->span.line, parent->span.col),
                   0;
    }
    const Node *kids[] = {n->a, n->b, n->type};
    for (int i = 0; i < 3; i++)
        if (!spans_nested(p, kids[i], n, why, whylen)) return 0;
    for (int i = 0; i < n->list.n; i++)
        if (!spans_nested(p, n->list.v[i], n, why, whylen)) return 0;
    for (int i = 0; i < n->list2.n; i++)
        if (!spans_nested(p, n->list2.v[i], n, why, whylen)) return 0;
    return 1;
}

/* Parses src as the body of a function and returns its statements rendered, space-separated. */
static char *stmts_of(const char *body, int *errors, const char **log) {
    Buf src = {0};
    buf_printf(&src, "fn t() {\n%s\n}\n", body);
    Parsed p = parse_text(src.p, src.n);
    buf_free(&src);
    *errors = p.errors;
    Buf out = {0};
    if (p.prog->list.n == 1 && p.prog->list.v[0]->kind == N_FN) {
        const NodeList *l = &p.prog->list.v[0]->list2;
        for (int i = 0; i < l->n; i++) {
            if (i) buf_printf(&out, " ");
            sx(&out, l->v[i]);
        }
    } else {
        buf_printf(&out, "<%d declarations>", p.prog->list.n);
    }
    char why[256];
    if (!p.errors && !spans_nested(&p, p.prog, NULL, why, sizeof why)) { buf_printf(&out, " <bad span: %s>", why); }
    if (log) *log = strdup(p.log);
    parsed_free(&p);
    return out.p ? out.p : strdup("");
}

/* The statement(s) `body` parse to `want`, with no error. */
#define STMT(body, want)                                                                                                         \
    do {                                                                                                                         \
        int e_;                                                                                                                  \
        const char *log_;                                                                                                        \
        char *got_ = stmts_of((body), &e_, &log_);                                                                               \
        CHECK_STR(got_, (want), "AST of `" body "`");                                                                            \
        CHECK(e_ == 0, "`%s`: %d unexpected error(s)", (body), e_);                                                              \
        if (e_) unit_detail("diag printed", log_);                                                                               \
        free(got_);                                                                                                              \
        free((void *)log_);                                                                                                      \
    } while (0)

/* The expression `e` (as `return e`) parses to `want`. */
#define EXPR(e, want) STMT("return " e, "(return " want ")")

/* A whole file parses to `want` with no error. */
#define FILE_OK(src, want)                                                                                                       \
    do {                                                                                                                         \
        Parsed p_ = parse_text((src), strlen(src));                                                                              \
        char *got_ = render(p_.prog);                                                                                            \
        CHECK_STR(got_, (want), "AST");                                                                                          \
        CHECK(p_.errors == 0, "%d unexpected error(s)", p_.errors);                                                              \
        if (p_.errors) unit_detail("diag printed", p_.log);                                                                      \
        char why_[256];                                                                                                          \
        CHECK(p_.errors || spans_nested(&p_, p_.prog, NULL, why_, sizeof why_), "bad span: %s", why_);                           \
        CHECK(p_.errors || ast_check_spans(p_.prog), "ast_check_spans failed");                                                  \
        free(got_);                                                                                                              \
        parsed_free(&p_);                                                                                                        \
    } while (0)

/* A file with a syntax error: `nerr` errors, the first message containing `msg` (a substring of
 * `path:line:col: error: ...`), and the declarations that did parse rendered as `want` (or NULL). */
#define FILE_ERR(src, nerr, msg, want)                                                                                           \
    do {                                                                                                                         \
        Parsed p_ = parse_text((src), strlen(src));                                                                              \
        CHECK(p_.errors == (nerr), "%d errors, expected %d", p_.errors, (nerr));                                                 \
        CHECK(strstr(p_.log, (msg)) != NULL, "message \"%s\" not printed", (msg));                                               \
        if (p_.errors != (nerr) || !strstr(p_.log, (msg))) unit_detail("diag printed", p_.log);                                  \
        if ((want) != NULL) {                                                                                                    \
            char *got_ = render(p_.prog);                                                                                        \
            CHECK_STR(got_, (const char *)(want), "what parsed");                                                                \
            free(got_);                                                                                                          \
        }                                                                                                                        \
        CHECK(ast_check_spans(p_.prog), "ast_check_spans failed after errors");                                                  \
        parsed_free(&p_);                                                                                                        \
    } while (0)

/* ---- precedence and associativity ------------------------------------------------------- */

static void t_arith_precedence(void) {
    EXPR("a + b * c", "(+ a (* b c))");
    EXPR("a * b + c", "(+ (* a b) c)");
    EXPR("a - b - c", "(- (- a b) c)");
    EXPR("a / b / c", "(/ (/ a b) c)");
    EXPR("a % b * c", "(* (% a b) c)");
    EXPR("(a + b) * c", "(* (+ a b) c)");
    EXPR("a @ b + c", "(+ (@ a b) c)");
    EXPR("a + b @ c", "(+ a (@ b c))");
    EXPR("a @ b @ c", "(@ (@ a b) c)");
    EXPR("a * b @ c", "(@ (* a b) c)");
    EXPR("x @ w.T", "(@ x (. w T))");
}

static void t_unary_and_power(void) {
    EXPR("-x^2", "(neg (^ x 2))");
    EXPR("-x * y", "(* (neg x) y)");
    EXPR("a ^ b ^ c", "(^ a (^ b c))");
    EXPR("2 ^ -1", "(^ 2 (neg 1))");
    EXPR("- -x", "(neg (neg x))");
    EXPR("+x", "(pos x)");
    EXPR("a - -b", "(- a (neg b))");
    EXPR("-f(x)[0]", "(neg (index (call f x) 0))");
    EXPR("x^2 * y", "(* (^ x 2) y)");
}

static void t_comparisons_and_logic(void) {
    EXPR("a < b", "(< a b)");
    EXPR("a + 1 <= b * 2", "(<= (+ a 1) (* b 2))");
    EXPR("a == b", "(== a b)");
    EXPR("a != b", "(!= a b)");
    EXPR("a > b and c >= d", "(and (> a b) (>= c d))");
    EXPR("a or b and c", "(or a (and b c))");
    EXPR("a and b or c", "(or (and a b) c)");
    EXPR("not a and b", "(and (not a) b)");
    EXPR("not a == b", "(not (== a b))");
    EXPR("not not a", "(not (not a))");
    EXPR("a or b or c", "(or (or a b) c)");
}

static void t_ranges(void) {
    EXPR("0..n", "(.. 0 n)");
    EXPR("0..n + 1", "(.. 0 (+ n 1))");
    EXPR("a * 2..b - 1", "(.. (* a 2) (- b 1))");
    EXPR("i < 0..n", "(< i (.. 0 n))");
}

static void t_postfix(void) {
    EXPR("f()", "(call f)");
    EXPR("f(x)", "(call f x)");
    EXPR("f(x, y,)", "(call f x y)");
    EXPR("nn.Linear(d, 4 * d)", "(call (. nn Linear) d (* 4 d))");
    EXPR("optim.adamw(lr = 6e-4, weight_decay = 0.1)", "(call (. optim adamw) lr=0.0006 weight_decay=0.1)");
    EXPR("tokens(\"a.bin\", seq = 64)", "(call tokens \"a.bin\" seq=64)");
    EXPR("f(g(x))(y)", "(call (call f (call g x)) y)");
    EXPR("x.T", "(. x T)");
    EXPR("betas.0", "(. betas 0)");
    EXPR("data.x.shape", "(. (. data x) shape)");
    EXPR("h[3].attn", "(. (index h 3) attn)");
}

static void t_index_and_slices(void) {
    EXPR("wte[idx]", "(index wte idx)");
    EXPR("x[i, j]", "(index x i j)");
    EXPR("wpe[0:T]", "(index wpe (: 0 T))");
    EXPR("x[:, i]", "(index x (: _ _) i)");
    EXPR("x[a:]", "(index x (: a _))");
    EXPR("x[:b]", "(index x (: _ b))");
    EXPR("x[:, :, 0:d / 2]", "(index x (: _ _) (: _ _) (: 0 (/ d 2)))");
    EXPR("x[-1]", "(index x (neg 1))");
}

static void t_literals_and_collections(void) {
    EXPR("1024", "1024");
    EXPR("50_257", "50257");
    EXPR("9223372036854775807", "9223372036854775807");
    EXPR("0.02", "0.02");
    EXPR("1e-8", "1e-08");
    EXPR("2.5E+3", "2500");
    EXPR("true", "true");
    EXPR("false", "false");
    EXPR("\"a\\\"b\\\\c\\nd\\te\"", "\"a\\\"b\\\\c\\nd\\te\"");
    EXPR("\"\"", "\"\"");
    EXPR("(0.9, 0.999)", "(tuple 0.9 0.999)");
    EXPR("(a,)", "(tuple a)");
    EXPR("(a, b, c,)", "(tuple a b c)");
    EXPR("(a)", "a");
    EXPR("[]", "[list]");
    EXPR("[a]", "[list a]");
    EXPR("[a, b,]", "[list a b]");
    EXPR("[(1, 2), (3, 4)]", "[list (tuple 1 2) (tuple 3 4)]");
    EXPR("[nn.Block(d) for _ in 0..layers]", "(comp (call (. nn Block) d) _ (.. 0 layers))");
    EXPR("[x * 2 for x in xs]", "(comp (* x 2) x xs)");
}

static void t_multiline_expressions(void) {
    STMT("y = f(a,\n      b)", "(= y (call f a b))");
    STMT("y = a +\n    b", "(= y (+ a b))");
    STMT("y = [a,\n  b,\n]", "(= y [list a b])");
    STMT("y = (a\n  * b)", "(= y (* a b))");
}

/* ---- statements ------------------------------------------------------------------------- */

static void t_statements(void) {
    STMT("x = 1", "(= x 1)");
    STMT("a, b = f(x)", "(= a b (call f x))");
    STMT("q, k, v = split(x, 3)", "(= q k v (call split x 3))");
    STMT("x[0] = 1", "(= (index x 0) 1)");
    STMT("x += 1", "(+= x 1)");
    STMT("x -= y * 2", "(-= x (* y 2))");
    STMT("x *= 2", "(*= x 2)");
    STMT("x /= n", "(/= x n)");
    STMT("f(x)", "(expr (call f x))");
    STMT("return", "(return)");
    STMT("return x", "(return x)");
    STMT("return a, b", "(return (tuple a b))");
    STMT("x = 1; y = 2", "(= x 1) (= y 2)");
    STMT("x = 1\n\n\ny = 2\n", "(= x 1) (= y 2)");
    STMT("w = param f32[d] ~ ones", "(param w f32[d] ~ ones)");
    STMT("w = param f32[din, dout] ~ normal(0, 0.02)", "(param w f32[din, dout] ~ (call normal 0 0.02))");
    STMT("w = param bf16[n]", "(param w bf16[n])");
    STMT("s = param f32[]", "(param s f32[])");
}

static void t_control_flow(void) {
    STMT("for blk in h { x = blk(x) }", "(for blk h (= x (call blk x)))");
    STMT("for i in 0..n {\n  x = x + i\n  y = y * i\n}", "(for i (.. 0 n) (= x (+ x i)) (= y (* y i)))");
    STMT("for i in 0..n {\n}", "(for i (.. 0 n))");
    STMT("if a { x = 1 }", "(if a (then (= x 1)))");
    STMT("if a { x = 1 } else { x = 2 }", "(if a (then (= x 1)) (else (= x 2)))");
    STMT("if a {\n  x = 1\n} else if b {\n  x = 2\n} else if c {\n  x = 3\n} else {\n  x = 4\n}",
         "(if a (then (= x 1)) (else (if b (then (= x 2)) (else (if c (then (= x 3)) (else (= x 4)))))))");
    STMT("if step < warmup {\n  return step / warmup\n}\nreturn 1.0",
         "(if (< step warmup) (then (return (/ step warmup)))) (return 1)");
    STMT("for b in h { if b { return b } }", "(for b h (if b (then (return b))))");
}

/* ---- declarations ----------------------------------------------------------------------- */

static void t_imports(void) { FILE_OK("import nn\nimport optim as o\n", "(program (import nn) (import optim as o))"); }

static void t_fn_decls(void) {
    FILE_OK("fn f() {\n}\n", "(program (fn f ()))");
    FILE_OK("fn cosine(step, warmup, total, min_ratio = 0.1) -> f32 {\n  return min_ratio\n}\n",
            "(program (fn cosine (step warmup total min_ratio=0.1) -> f32 (return min_ratio)))");
    FILE_OK("fn forward(idx: i32[B, T], scale: f32 = 1.0,) -> f32[B, T, d * 4] {\n  return idx\n}\n",
            "(program (fn forward (idx:i32[B, T] scale:f32=1) -> f32[B, T, (* d 4)] (return idx)))");
}

static void t_model_decls(void) {
    FILE_OK("model TinyGPT(vocab = 64, d = 128, layers = 4) {\n"
            "  wte  = param f32[vocab, d] ~ normal(0, 0.02)\n"
            "  h    = [nn.GPT2Block(d, 4) for _ in 0..layers]\n"
            "  ln_f = nn.LayerNorm(d)\n"
            "  hd   = d / 4\n"
            "  if d > 64 {\n    extra = param f32[d]\n  }\n"
            "\n"
            "  fn forward(idx: i32[B, T]) -> f32[B, T, vocab] {\n"
            "    x = wte[idx]\n"
            "    for blk in h { x = blk(x) }\n"
            "    return ln_f(x) @ wte.T\n"
            "  }\n"
            "}\n",
            "(program (model TinyGPT (vocab=64 d=128 layers=4) (param wte f32[vocab, d] ~ (call normal 0 0.02)) "
            "(= h (comp (call (. nn GPT2Block) d 4) _ (.. 0 layers))) (= ln_f (call (. nn LayerNorm) d)) "
            "(= hd (/ d 4)) (if (> d 64) (then (param extra f32[d]))) "
            "(fn forward (idx:i32[B, T]) -> f32[B, T, vocab] (= x (index wte idx)) (for blk h (= x (call blk x))) "
            "(return (@ (call ln_f x) (. wte T))))))");
    FILE_OK("model Empty {\n}\n", "(program (model Empty ()))");
    FILE_OK("model M() { w = param f32[4] }\n", "(program (model M () (param w f32[4])))");
}

static void t_optimizer_decls(void) {
    FILE_OK("optimizer adamw(lr, betas = (0.9, 0.999), eps = 1e-8) {\n"
            "  state m = 0, v = 0\n"
            "  fn update(p, g, t) {\n"
            "    m = betas.0 * m + (1 - betas.0) * g\n"
            "    p -= lr * m\n"
            "  }\n"
            "}\n",
            "(program (optimizer adamw (lr betas=(tuple 0.9 0.999) eps=1e-08) (state m=0 v=0) "
            "(fn update (p g t) (= m (+ (* (. betas 0) m) (* (- 1 (. betas 0)) g))) (-= p (* lr m)))))");
}

static void t_train_serve_decls(void) {
    FILE_OK("train tiny {\n"
            "  model     = TinyGPT()\n"
            "  data      = tokens(\"data/tiny_train.bin\", seq = 64)\n"
            "  loss      = cross_entropy(model(data.x), data.y)\n"
            "  optimizer = optim.adamw(lr = 1e-3)\n"
            "  batch     { global = 32, micro = 8 }\n"
            "  parallel  {\n    data = 2\n    zero = 1,\n  }\n"
            "  recompute = [gelu, attention]\n"
            "  steps     = 400\n"
            "}\n",
            "(program (train tiny (set model (call TinyGPT)) (set data (call tokens \"data/tiny_train.bin\" seq=64)) "
            "(set loss (call cross_entropy (call model (. data x)) (. data y))) "
            "(set optimizer (call (. optim adamw) lr=0.001)) (block batch (set global 32) (set micro 8)) "
            "(block parallel (set data 2) (set zero 1)) (set recompute [list gelu attention]) (set steps 400)))");
    FILE_OK("serve chat {\n  model = GPT2()\n  weights = \"gpt2.safetensors\"\n  kv { block = 16, dtype = bf16 }\n"
            "  port = 8000\n}\n",
            "(program (serve chat (set model (call GPT2)) (set weights \"gpt2.safetensors\") "
            "(block kv (set block 16) (set dtype bf16)) (set port 8000)))");
    FILE_OK("train t { steps = 1, seed = 2 }\n", "(program (train t (set steps 1) (set seed 2)))");
}

static void t_whole_programs(void) {
    /* Every example and stdlib file parses without error, with well-placed, nested spans. */
    const char *dirs[] = {"examples", "stdlib"};
    int files = 0;
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir) continue;
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            size_t n = strlen(e->d_name);
            if (n < 5 || strcmp(e->d_name + n - 4, ".mbt") != 0) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            Buf b = {0};
            char chunk[4096];
            size_t got;
            while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) buf_printf(&b, "%.*s", (int)got, chunk);
            fclose(f);
            files++;
            Parsed p = parse_text(buf_str(&b), b.n);
            CHECK(p.errors == 0, "%s: %d syntax error(s)", path, p.errors);
            if (p.errors) unit_detail("diag printed", p.log);
            CHECK(p.prog->list.n > 0, "%s: no declarations", path);
            char why[256];
            CHECK(spans_nested(&p, p.prog, NULL, why, sizeof why), "%s: %s", path, why);
            CHECK(ast_check_spans(p.prog), "%s: ast_check_spans failed", path);
            /* ast_print writes something for every node. */
            char *mem = NULL;
            size_t memlen = 0;
            FILE *m = open_memstream(&mem, &memlen);
            ast_print(m, p.prog);
            fclose(m);
            CHECK(memlen > 0 && strncmp(mem, "program", 7) == 0, "%s: ast_print output starts \"%.20s\"", path, mem ? mem : "");
            free(mem);
            parsed_free(&p);
            buf_free(&b);
        }
        closedir(dir);
    }
    CHECK(files > 0, "no examples/*.mbt or stdlib/*.mbt found (run from the repository root)");
}

static void t_ast_print(void) {
    const char *src = "fn f(x) {\n  return -x^2 + 1\n}\n";
    Parsed p = parse_text(src, strlen(src));
    char *mem = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&mem, &len);
    ast_print(m, p.prog);
    fclose(m);
    CHECK_STR(mem,
              "program @1:1\n"
              "  fn f @1:1\n"
              "    params:\n"
              "      fparam x @1:6\n"
              "    body:\n"
              "      return @2:3\n"
              "        binary + @2:10\n"
              "          unary - @2:10\n"
              "            binary ^ @2:11\n"
              "              name x @2:11\n"
              "              int 2 @2:13\n"
              "          int 1 @2:17\n",
              "ast_print output");
    free(mem);
    parsed_free(&p);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void t_err_literals(void) {
    FILE_ERR("fn f() {\n  return 9223372036854775808\n}\n", 1,
             "test.mbt:2:10: error: integer literal too large (the limit is 9223372036854775807)", NULL);
    FILE_ERR("fn f() {\n  return 99999999999999999999999\n}\n", 1, "integer literal too large", NULL);
    FILE_ERR("fn f() {\n  return 1e999\n}\n", 1, "test.mbt:2:10: error: number literal out of range", NULL);
}

static void t_err_arguments(void) {
    FILE_ERR("fn f() {\n  return g(a = 1, 2)\n}\n", 1, "test.mbt:2:19: error: positional argument after a keyword argument",
             NULL);
    FILE_ERR("model M(d) {\n  w, b = param f32[d]\n}\n", 1, "test.mbt:2:3: error: a parameter is declared with one name", NULL);
    FILE_ERR("model M(d) {\n  w.x = param f32[d]\n}\n", 1, "a parameter is declared with one name", NULL);
}

static void t_err_messages(void) {
    FILE_ERR("fn f(x) {\n  if x = 1 {\n    return x\n  }\n}\n", 1, "test.mbt:2:8: error: expected '{' or an operator, got '='",
             NULL);
    FILE_ERR("fn f(x) {\n  return (x + ) * 2\n}\n", 1, "test.mbt:2:15: error: expected an expression, got ')'", NULL);
    FILE_ERR("fn f(x) {\n  y = g(x, 1\n  return y\n}\n", 1,
             "test.mbt:3:3: error: expected ')' to close '(' opened at 2:8, got 'return'", NULL);
    FILE_ERR("fn f(x) {\n  if x {\n  }\n  else {\n  }\n}\n", 1, "test.mbt:4:3: error:", NULL);
    FILE_ERR("fn f(x) {\n  return x\n", 1, "error:", NULL);
    FILE_ERR("fn f(x) {\n  for i 0..3 {\n  }\n}\n", 1, "test.mbt:2:9: error: expected 'in', got '0'", NULL);
}

static void t_err_recovery(void) {
    /* Errors in three declarations: three errors, and the good declarations are kept. */
    FILE_ERR("import nn\n"
             "\n"
             "model A(d) {\n"
             "  w = param f32[d, d ~ normal(0, 0.02)\n"
             "}\n"
             "\n"
             "fn twice(x) -> f32 {\n"
             "  return 2 * * x\n"
             "}\n"
             "\n"
             "model B(d) {\n"
             "  w = param f32[d] ~ ones\n"
             "}\n"
             "\n"
             "train t {\n"
             "  model = B(8)\n"
             "  steps = = 10\n"
             "}\n"
             "\n"
             "fn ok() -> f32 {\n"
             "  return 1.0\n"
             "}\n",
             3, "test.mbt:4:", "(program (import nn) (model B (d) (param w f32[d] ~ ones)) (fn ok () -> f32 (return 1)))");
    /* Recovery needs a declaration keyword in column 1; an indented one is not a restart. */
    FILE_ERR("fn a() {\n  x = = 1\n  fn b() {\n  }\n}\nfn c() {\n}\n", 1, "test.mbt:2:7:", "(program (fn c ()))");
    /* One error per declaration, however many mistakes it holds. */
    FILE_ERR("fn a() {\n  x = = 1\n  y = = 2\n  z = = 3\n}\n", 1, "test.mbt:2:7:", "(program)");
}

static void t_err_depth(void) {
    /* A 1000-deep expression is fine; one deeper is reported once. */
    Buf b = {0};
    buf_printf(&b, "fn f() {\n  return 1");
    for (int i = 0; i < 1000; i++) buf_printf(&b, "+1");
    buf_printf(&b, "\n}\n");
    Parsed p = parse_text(b.p, b.n);
    CHECK(p.errors == 0, "a 1000-deep sum was refused");
    parsed_free(&p);
    buf_free(&b);
    buf_printf(&b, "fn f() {\n  return 1");
    for (int i = 0; i < 5000; i++) buf_printf(&b, "+1");
    buf_printf(&b, "\n}\n");
    p = parse_text(b.p, b.n);
    CHECK(p.errors == 1, "%d errors for a 5000-deep sum, expected 1", p.errors);
    CHECK(strstr(p.log, "test.mbt:2:10: error: expression nested more than 1000 deep") != NULL,
          "no located message for a 5000-deep sum");
    parsed_free(&p);
    buf_free(&b);
    /* Deep unary chains overflow the parser's stack: still one located error. */
    buf_printf(&b, "fn f() {\n  return ");
    for (int i = 0; i < 5000; i++) buf_printf(&b, "-");
    buf_printf(&b, "1\n}\n");
    p = parse_text(b.p, b.n);
    CHECK(p.errors == 1, "%d errors for 5000 nested '-', expected 1", p.errors);
    CHECK(strstr(p.log, "test.mbt:2:") != NULL, "the error for 5000 nested '-' has no location");
    if (!strstr(p.log, "test.mbt:2:")) unit_detail("diag printed", p.log);
    parsed_free(&p);
    buf_free(&b);
}

int main(void) {
    RUN(t_arith_precedence);
    RUN(t_unary_and_power);
    RUN(t_comparisons_and_logic);
    RUN(t_ranges);
    RUN(t_postfix);
    RUN(t_index_and_slices);
    RUN(t_literals_and_collections);
    RUN(t_multiline_expressions);
    RUN(t_statements);
    RUN(t_control_flow);
    RUN(t_imports);
    RUN(t_fn_decls);
    RUN(t_model_decls);
    RUN(t_optimizer_decls);
    RUN(t_train_serve_decls);
    RUN(t_whole_programs);
    RUN(t_ast_print);
    RUN(t_err_literals);
    RUN(t_err_arguments);
    RUN(t_err_messages);
    RUN(t_err_recovery);
    RUN(t_err_depth);
    return unit_finish();
}
