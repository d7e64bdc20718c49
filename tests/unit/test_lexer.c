/* test_lexer.c - unit tests of the re2c lexer (grammar/lexer.re) through lex_init/lex_next:
 * token codes, spans, statement-end insertion, numbers, keywords, operators, comments, strings
 * and the lexical errors. Run from the repository root (the span test reads examples/ and
 * stdlib/). Prints `PASS name` / `FAIL name: ...` per test and `N passed, M failed` last. */
#include "unit.h"

#include <dirent.h>
#include <stdint.h>

#include "diag.h"
#include "lexer.h"
#include "mbt.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Registers a copy of text[0..len) (NUL-terminated, as the lexer requires) with diag. The copy
 * stays alive: diag keeps a pointer to it. */
static uint32_t add_source(const char *text, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy) exit(1);
    memcpy(copy, text, len);
    copy[len] = 0;
    return diag_add_source("test.mbt", copy, (uint32_t)len);
}

/* The spelling of each fixed token, and a tag for the others. */
static const char *tok_name(int code) {
    switch (code) {
    case 0: return "EOF";
    case TK_IMPORT: return "import";
    case TK_AS: return "as";
    case TK_MODEL: return "model";
    case TK_FN: return "fn";
    case TK_PARAM: return "param";
    case TK_RETURN: return "return";
    case TK_FOR: return "for";
    case TK_IN: return "in";
    case TK_IF: return "if";
    case TK_ELSE: return "else";
    case TK_OPTIMIZER: return "optimizer";
    case TK_STATE: return "state";
    case TK_TRAIN: return "train";
    case TK_SERVE: return "serve";
    case TK_TRUE: return "true";
    case TK_FALSE: return "false";
    case TK_AND: return "and";
    case TK_OR: return "or";
    case TK_NOT: return "not";
    case TK_IDENT: return "ident";
    case TK_INT: return "int";
    case TK_FLOAT: return "float";
    case TK_STRING: return "str";
    case TK_SEMI: return ";";
    case TK_COMMA: return ",";
    case TK_COLON: return ":";
    case TK_ASSIGN: return "=";
    case TK_PLUSEQ: return "+=";
    case TK_MINUSEQ: return "-=";
    case TK_STAREQ: return "*=";
    case TK_SLASHEQ: return "/=";
    case TK_TILDE: return "~";
    case TK_ARROW: return "->";
    case TK_DOT: return ".";
    case TK_DOTDOT: return "..";
    case TK_LPAREN: return "(";
    case TK_RPAREN: return ")";
    case TK_LBRACKET: return "[";
    case TK_RBRACKET: return "]";
    case TK_LBRACE: return "{";
    case TK_RBRACE: return "}";
    case TK_PLUS: return "+";
    case TK_MINUS: return "-";
    case TK_STAR: return "*";
    case TK_SLASH: return "/";
    case TK_PERCENT: return "%";
    case TK_AT: return "@";
    case TK_CARET: return "^";
    case TK_EQ: return "==";
    case TK_NE: return "!=";
    case TK_LT: return "<";
    case TK_LE: return "<=";
    case TK_GT: return ">";
    case TK_GE: return ">=";
    default: return "?";
    }
}

/* Result of lexing a whole source. */
typedef struct Lexed {
    Buf text;        /* tokens rendered: `ident:x = int:1 $ EOF` ($ = inserted statement end) */
    int errors;      /* diag errors reported while lexing */
    const char *log; /* what diag printed */
    Token *toks;     /* the tokens, the final EOF included */
    int n;
    uint32_t file;
} Lexed;

#define MAX_TOKENS 4000000

static Lexed lex_all(const char *src, size_t len) {
    Lexed r;
    memset(&r, 0, sizeof r);
    r.file = add_source(src, len);
    int before = diag_error_count();
    capture_begin();
    Lexer *lx = malloc(sizeof *lx); /* the Lexer is large (nesting table) */
    if (!lx) exit(1);
    lex_init(lx, r.file);
    int cap = 64;
    r.toks = malloc(sizeof(Token) * (size_t)cap);
    for (;;) {
        Token t = lex_next(lx);
        if (r.n == cap) {
            cap *= 2;
            r.toks = realloc(r.toks, sizeof(Token) * (size_t)cap);
            if (!r.toks) exit(1);
        }
        r.toks[r.n++] = t;
        if (r.n > 1) buf_printf(&r.text, " ");
        if (t.code == TK_IDENT || t.code == TK_INT || t.code == TK_FLOAT || t.code == TK_STRING) {
            uint32_t slen;
            const char *s = diag_source_text(r.file, &slen);
            uint32_t n = t.span.len > 60 ? 60 : t.span.len;
            buf_printf(&r.text, "%s:%.*s", tok_name(t.code), (int)n, s + t.span.off);
        } else if (t.code == TK_SEMI && t.span.len == 0) {
            buf_printf(&r.text, "$");
        } else {
            buf_printf(&r.text, "%s", tok_name(t.code));
        }
        if (t.code == 0 || r.n >= MAX_TOKENS) break;
    }
    free(lx);
    r.log = strdup(capture_end());
    r.errors = diag_error_count() - before;
    return r;
}

static void lexed_free(Lexed *r) {
    buf_free(&r->text);
    free(r->toks);
    free((void *)r->log);
}

/* Lexes src (a C string) and expects exactly these tokens and no error. */
#define LEX_OK(src, want)                                                                                                        \
    do {                                                                                                                         \
        Lexed r_ = lex_all((src), strlen(src));                                                                                  \
        CHECK_STR(buf_str(&r_.text), (want), "tokens of \"" src "\"");                                                           \
        CHECK(r_.errors == 0, "\"%s\": %d unexpected error(s): %s", (src), r_.errors, r_.log);                                   \
        lexed_free(&r_);                                                                                                         \
    } while (0)

/* Lexes src (a string literal or char array: its size gives the length, NULs included); expects
 * an error whose message contains msg, and these tokens (unless want is NULL). */
#define LEX_ERR(src, want, msg)                                                                                                  \
    do {                                                                                                                         \
        Lexed r_ = lex_all((src), sizeof(src) - 1);                                                                              \
        CHECK(r_.errors > 0, "no error reported for %s", #src);                                                                  \
        CHECK(strstr(r_.log, (msg)) != NULL, "message \"%s\" not reported for %s", (msg), #src);                                 \
        if (r_.errors == 0 || !strstr(r_.log, (msg))) unit_detail("diag printed", r_.log);                                       \
        if ((want) != NULL) CHECK_STR(buf_str(&r_.text), (const char *)(want), "tokens of " #src);                               \
        lexed_free(&r_);                                                                                                         \
    } while (0)

/* ---- tokens ------------------------------------------------------------------------------- */

static void t_empty_and_blank(void) {
    LEX_OK("", "EOF");
    LEX_OK("\n\n\n", "EOF");
    LEX_OK("   \t \r\n \f\v ", "EOF");
    LEX_OK("# only a comment", "EOF");
    LEX_OK("# one\n# two\n\n", "EOF");
}

static void t_keywords(void) {
    LEX_OK("import as model fn param return for in if else optimizer state train serve true false and or not",
           "import as model fn param return for in if else optimizer state train serve true false and or not EOF");
    /* Keywords are whole words, and case matters. */
    LEX_OK("imports _model model2 fn_ iff in_ Train True NOT format state_ ifx",
           "ident:imports ident:_model ident:model2 ident:fn_ ident:iff ident:in_ ident:Train ident:True "
           "ident:NOT ident:format ident:state_ ident:ifx $ EOF");
}

static void t_identifiers(void) {
    LEX_OK("x _ _x x_1 ABC aBc9 __init__", "ident:x ident:_ ident:_x ident:x_1 ident:ABC ident:aBc9 ident:__init__ $ EOF");
    /* The longest identifier accepted is LEX_MAX_IDENT bytes. */
    char *id = malloc(LEX_MAX_IDENT + 1);
    memset(id, 'a', LEX_MAX_IDENT);
    id[LEX_MAX_IDENT] = 0;
    Lexed r = lex_all(id, strlen(id));
    CHECK(r.errors == 0, "a %d-byte identifier was refused: %s", LEX_MAX_IDENT, r.log);
    CHECK(r.n == 3 && r.toks[0].code == TK_IDENT && r.toks[0].span.len == LEX_MAX_IDENT, "a %d-byte identifier is not one token",
          LEX_MAX_IDENT);
    lexed_free(&r);
    free(id);
}

static void t_operators(void) {
    LEX_OK("+ - * / % ^ @ == != < <= > >= = += -= *= /= ~ . .. , : ; ( ) [ ] { } ->",
           "+ - * / % ^ @ == != < <= > >= = += -= *= /= ~ . .. , : ; ( ) [ ] { } -> EOF");
    /* Without spaces: the longest operator wins. */
    LEX_OK("a<=b", "ident:a <= ident:b $ EOF");
    LEX_OK("a==b!=c", "ident:a == ident:b != ident:c $ EOF");
    LEX_OK("f()->g", "ident:f ( ) -> ident:g $ EOF");
    LEX_OK("x+=1", "ident:x += int:1 $ EOF");
    LEX_OK("x-=-1", "ident:x -= - int:1 $ EOF");
    LEX_OK("x*=y/=z", "ident:x *= ident:y /= ident:z $ EOF");
    LEX_OK("a===b", "ident:a == = ident:b $ EOF");
    LEX_OK("a<-b", "ident:a < - ident:b $ EOF");
    LEX_OK("a=>b", "ident:a = > ident:b $ EOF");
    LEX_OK("x...y", "ident:x .. . ident:y $ EOF");
    LEX_OK("x.T", "ident:x . ident:T $ EOF");
    LEX_OK("a@b.T", "ident:a @ ident:b . ident:T $ EOF");
    LEX_OK("-x^2", "- ident:x ^ int:2 $ EOF");
}

static void t_numbers(void) {
    LEX_OK("0 7 1024 50_257 1_000_000", "int:0 int:7 int:1024 int:50_257 int:1_000_000 $ EOF");
    LEX_OK("0.02 1.0 3.14159 10.5", "float:0.02 float:1.0 float:3.14159 float:10.5 $ EOF");
    LEX_OK("1e-8 6e-4 2.5E+3 1e10 1E5 3.0e-2", "float:1e-8 float:6e-4 float:2.5E+3 float:1e10 float:1E5 float:3.0e-2 $ EOF");
    /* A digit is needed on both sides of the point: ranges and tuple fields are not floats. */
    LEX_OK("0..n", "int:0 .. ident:n $ EOF");
    LEX_OK("0..10", "int:0 .. int:10 $ EOF");
    LEX_OK("1.5..2", "float:1.5 .. int:2 $ EOF");
    LEX_OK("betas.0", "ident:betas . int:0 $ EOF");
    LEX_OK("betas.1 * m", "ident:betas . int:1 * ident:m $ EOF");
    LEX_OK("x[0:T]", "ident:x [ int:0 : ident:T ] $ EOF");
    LEX_OK("1.", "int:1 . EOF");
    LEX_OK(".5", ". int:5 $ EOF");
    LEX_OK("-1e-8", "- float:1e-8 $ EOF");
    LEX_OK("1e-8+x", "float:1e-8 + ident:x $ EOF");
}

static void t_strings(void) {
    LEX_OK("\"\"", "str:\"\" $ EOF");
    LEX_OK("\"data/tiny_train.bin\"", "str:\"data/tiny_train.bin\" $ EOF");
    LEX_OK("\"a\\\"b\\\\c\\nd\\te\"", "str:\"a\\\"b\\\\c\\nd\\te\" $ EOF");
    LEX_OK("\"# not a comment\" x", "str:\"# not a comment\" ident:x $ EOF");
    LEX_OK("\"héllo ✓ 😀\"", "str:\"héllo ✓ 😀\" $ EOF");
    LEX_OK("f(\"a\", \"b\")", "ident:f ( str:\"a\" , str:\"b\" ) $ EOF");
    /* The span covers both quotes. */
    Lexed r = lex_all("x = \"ab\\\"c\"", 11);
    CHECK(r.n >= 3 && r.toks[2].code == TK_STRING && r.toks[2].span.off == 4 && r.toks[2].span.len == 7,
          "string span is not off 4 len 7");
    lexed_free(&r);
}

static void t_comments(void) {
    LEX_OK("x # a comment\ny", "ident:x $ ident:y $ EOF");
    LEX_OK("x # comment \"with a quote\nz", "ident:x $ ident:z $ EOF");
    LEX_OK("x # no newline at the end", "ident:x $ EOF");
    LEX_OK("#\n#\nx", "ident:x $ EOF");
    LEX_OK("a + # continues\n b", "ident:a + ident:b $ EOF");
    LEX_OK("# naïve ✓ 😀 — UTF-8 is fine here\nx", "ident:x $ EOF");
}

/* ---- statement ends ----------------------------------------------------------------------- */

static void t_semi_after_enders(void) {
    LEX_OK("x\ny\n", "ident:x $ ident:y $ EOF");
    LEX_OK("1\n2.5\n\"s\"\ntrue\nfalse\n", "int:1 $ float:2.5 $ str:\"s\" $ true $ false $ EOF");
    LEX_OK("f()\na[0]\n", "ident:f ( ) $ ident:a [ int:0 ] $ EOF");
    LEX_OK("if x {\n}\ny", "if ident:x { } $ ident:y $ EOF");
    LEX_OK("return\nx", "return $ ident:x $ EOF");
    LEX_OK("model\n", "model $ EOF"); /* `model` names the block's model inside train/serve */
}

static void t_no_semi_after_others(void) {
    /* After an operator or a comma the statement goes on. */
    LEX_OK("a +\nb", "ident:a + ident:b $ EOF");
    LEX_OK("a *\n\n  b", "ident:a * ident:b $ EOF");
    LEX_OK("x =\n1", "ident:x = int:1 $ EOF");
    LEX_OK("a,\nb", "ident:a , ident:b $ EOF");
    LEX_OK("a and\nb", "ident:a and ident:b $ EOF");
    LEX_OK("a @\nb", "ident:a @ ident:b $ EOF");
    LEX_OK("x.\nT", "ident:x . ident:T $ EOF");
    LEX_OK("fn f() -> \nf32", "fn ident:f ( ) -> ident:f32 $ EOF");
    /* Nor after keywords that need more. */
    LEX_OK("import\nnn", "import ident:nn $ EOF");
    LEX_OK("if x {\ny\n}", "if ident:x { ident:y $ } $ EOF");
    LEX_OK("for\nx", "for ident:x $ EOF");
    LEX_OK("not\nx", "not ident:x $ EOF");
}

static void t_no_semi_inside_brackets(void) {
    LEX_OK("f(a,\n  b\n)\n", "ident:f ( ident:a , ident:b ) $ EOF");
    LEX_OK("(a\n)", "( ident:a ) $ EOF");
    LEX_OK("[a\n b\n]", "[ ident:a ident:b ] $ EOF");
    LEX_OK("x[i\n]\ny", "ident:x [ ident:i ] $ ident:y $ EOF");
    LEX_OK("f(g(x\n)\n)\nz", "ident:f ( ident:g ( ident:x ) ) $ ident:z $ EOF");
    /* Once the brackets close, line ends count again. */
    LEX_OK("(a)\n(b)", "( ident:a ) $ ( ident:b ) $ EOF");
    /* A ')' with nothing open does not make the depth negative. */
    LEX_OK(")\nx\ny", ") $ ident:x $ ident:y $ EOF");
}

static void t_semi_before_rbrace(void) {
    LEX_OK("{ x }", "{ ident:x $ } $ EOF");
    LEX_OK("{ x; }", "{ ident:x ; } $ EOF");    /* no second statement end after ';' */
    LEX_OK("{ x\n}", "{ ident:x $ } $ EOF");    /* nor after the line end's */
    LEX_OK("{}", "{ } $ EOF");                  /* nor right after '{' */
    LEX_OK("{ a + }", "{ ident:a + $ } $ EOF"); /* before '}' even after an operator */
    LEX_OK("for b in h { x = b(x) }", "for ident:b in ident:h { ident:x = ident:b ( ident:x ) $ } $ EOF");
    LEX_OK("{ { x } }", "{ { ident:x $ } $ } $ EOF");
}

static void t_semi_at_eof(void) {
    LEX_OK("x", "ident:x $ EOF");
    LEX_OK("x\n", "ident:x $ EOF");
    LEX_OK("x\n\n# end\n", "ident:x $ EOF");
    LEX_OK("x +", "ident:x + EOF");
    LEX_OK("x;", "ident:x ; EOF");
    LEX_OK("x ; ; y", "ident:x ; ; ident:y $ EOF");
    LEX_OK("x\n\n\ny", "ident:x $ ident:y $ EOF"); /* one statement end for several blank lines */
}

static void t_eof_is_sticky(void) {
    uint32_t f = add_source("x", 1);
    Lexer *lx = malloc(sizeof *lx);
    lex_init(lx, f);
    int codes[8];
    for (int i = 0; i < 8; i++) codes[i] = lex_next(lx).code;
    CHECK(codes[0] == TK_IDENT && codes[1] == TK_SEMI && codes[2] == 0, "x does not lex as ident ; EOF");
    for (int i = 3; i < 8; i++) CHECK(codes[i] == 0, "token %d after the end is %s, not EOF", i, tok_name(codes[i]));
    free(lx);
}

/* ---- spans --------------------------------------------------------------------------------- */

static void t_spans(void) {
    const char *src = "fn f(x) {\n\treturn x + 1.5\n}\n";
    Lexed r = lex_all(src, strlen(src));
    /* code line col len, for each token */
    static const struct {
        int code;
        uint32_t line, col, len;
    } want[] = {
        {TK_FN, 1, 1, 2},     {TK_IDENT, 1, 4, 1},  {TK_LPAREN, 1, 5, 1}, {TK_IDENT, 1, 6, 1}, {TK_RPAREN, 1, 7, 1},
        {TK_LBRACE, 1, 9, 1}, {TK_RETURN, 2, 2, 6}, {TK_IDENT, 2, 9, 1},  {TK_PLUS, 2, 11, 1}, {TK_FLOAT, 2, 13, 3},
        {TK_SEMI, 2, 16, 0},  {TK_RBRACE, 3, 1, 1}, {TK_SEMI, 3, 2, 0},   {0, 4, 1, 0},
    };
    int nwant = (int)(sizeof want / sizeof want[0]);
    CHECK(r.n == nwant, "%d tokens, expected %d: %s", r.n, nwant, buf_str(&r.text));
    for (int i = 0; i < r.n && i < nwant; i++) {
        Token t = r.toks[i];
        CHECK(t.code == want[i].code && t.span.line == want[i].line && t.span.col == want[i].col && t.span.len == want[i].len &&
                  t.span.file == r.file,
              "token %d: %s at %u:%u len %u, expected %s at %u:%u len %u", i, tok_name(t.code), t.span.line, t.span.col,
              t.span.len, tok_name(want[i].code), want[i].line, want[i].col, want[i].len);
    }
    lexed_free(&r);

    /* Columns count bytes: after a 2-byte character in a string, x is at byte column 12. */
    r = lex_all("s = \"é\" + x", strlen("s = \"é\" + x"));
    CHECK(r.n >= 5 && r.toks[4].code == TK_IDENT && r.toks[4].span.col == 12 && r.toks[4].span.off == 11,
          "x after \"é\" is not at byte column 12");
    lexed_free(&r);
}

/* Every token's span lies in the file, its line and column agree with its offset, and a
 * non-inserted token's bytes spell it. */
static int spans_consistent(const char *what, const char *src, size_t len) {
    Lexed r = lex_all(src, len);
    int ok = 1;
    uint32_t line = 1, col = 1, pos = 0;
    for (int i = 0; i < r.n && ok; i++) {
        Token t = r.toks[i];
        if (t.span.file != r.file || t.span.off > len || t.span.off + t.span.len > len) {
            unit_fail_at(__FILE__, __LINE__, "%s: token %d (%s) lies outside the file", what, i, tok_name(t.code));
            ok = 0;
            break;
        }
        if (t.span.off < pos) { /* tokens come in order; restart counting only if not */
            line = 1, col = 1, pos = 0;
        }
        for (; pos < t.span.off; pos++) {
            if (src[pos] == '\n') line++, col = 1;
            else col++;
        }
        if (t.span.line != line || t.span.col != col) {
            unit_fail_at(__FILE__, __LINE__, "%s: token %d (%s) at offset %u says %u:%u, but that is %u:%u", what, i,
                         tok_name(t.code), t.span.off, t.span.line, t.span.col, line, col);
            ok = 0;
        }
        const char *name = tok_name(t.code);
        int fixed = t.code != 0 && t.code != TK_IDENT && t.code != TK_INT && t.code != TK_FLOAT && t.code != TK_STRING &&
                    !(t.code == TK_SEMI && t.span.len == 0);
        if (fixed && (strlen(name) != t.span.len || memcmp(src + t.span.off, name, t.span.len) != 0)) {
            unit_fail_at(__FILE__, __LINE__, "%s: token %d (%s) spans '%.*s'", what, i, name, (int)t.span.len, src + t.span.off);
            ok = 0;
        }
    }
    if (r.errors) {
        unit_fail_at(__FILE__, __LINE__, "%s: %d lexical error(s)", what, r.errors);
        unit_detail("diag printed", r.log);
        ok = 0;
    }
    lexed_free(&r);
    return ok;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 65536, n = 0, got;
    char *p = malloc(cap);
    while (p && (got = fread(p + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) p = realloc(p, cap *= 2);
    }
    fclose(f);
    if (!p) exit(1);
    *len = n;
    return p;
}

static void t_spans_of_real_files(void) {
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
            size_t len;
            char *text = read_file(path, &len);
            if (!text) continue;
            files++;
            spans_consistent(path, text, len);
            free(text);
        }
        closedir(dir);
    }
    CHECK(files > 0, "no examples/*.mbt or stdlib/*.mbt found (run from the repository root)");
    const char *s = "model M(d = 4) {\n  w = param f32[d, 4 * d] ~ normal(0, 0.02)\n\n  fn forward(x: f32[B, d]) "
                    "-> f32[B, d] {\n    for i in 0..3 { x = x @ w[:, 0:d] }\n    return x\n  }\n}\n";
    spans_consistent("inline model", s, strlen(s));
}

/* ---- errors ----------------------------------------------------------------------------- */

static void t_err_nul(void) {
    static const char a[] = "x = 1\0 + 2\n";
    LEX_ERR(a, "ident:x = int:1 + int:2 $ EOF", "NUL byte in source");
    static const char b[] = "x\0";
    LEX_ERR(b, "ident:x $ EOF", "NUL byte in source");
    static const char c[] = "\0\0\0x"; /* a NUL is not the end of the input */
    LEX_ERR(c, "ident:x $ EOF", "NUL byte in source");
    static const char d[] = "s = \"a\0b\"";
    LEX_ERR(d, "ident:s = str:\"a $ EOF", "NUL byte in string"); /* shown up to the NUL */
    /* A NUL inside a comment: the rest of the comment is still a comment. */
    static const char e[] = "x # hello\0world(\ny";
    LEX_ERR(e, "ident:x $ ident:y $ EOF", "NUL byte");
    /* The NUL is located where it is. */
    Lexed r = lex_all(a, sizeof a - 1);
    CHECK(strstr(r.log, "test.mbt:1:6: error: NUL byte in source") != NULL, "NUL not located at 1:6");
    lexed_free(&r);
}

static void t_err_utf8(void) {
    static const char code[] = "x = \xff\ny";
    LEX_ERR(code, "ident:x = ident:y $ EOF", "invalid UTF-8 byte 0xFF");
    static const char comment[] = "# caf\xe9\nx";
    LEX_ERR(comment, "ident:x $ EOF", "invalid UTF-8 byte 0xE9 in comment");
    static const char str[] = "s = \"donn\xe9\x65s\"";
    LEX_ERR(str, "ident:s = str:\"donn\xe9\x65s\" $ EOF", "invalid UTF-8 byte 0xE9 in string");
    /* Overlong forms, surrogates, code points above U+10FFFF, truncated sequences. */
    static const char overlong[] = "s = \"\xc0\x80\"";
    LEX_ERR(overlong, NULL, "invalid UTF-8 byte 0xC0 in string");
    static const char surrogate[] = "# \xed\xa0\x80\n";
    LEX_ERR(surrogate, "EOF", "invalid UTF-8 byte 0xED in comment");
    static const char big[] = "# \xf4\x90\x80\x80\n";
    LEX_ERR(big, "EOF", "invalid UTF-8 byte 0xF4 in comment");
    static const char trunc[] = "# \xe2\x82";
    LEX_ERR(trunc, "EOF", "invalid UTF-8 byte 0xE2 in comment");
    static const char trunc_code[] = "x \xe2\x82";
    LEX_ERR(trunc_code, NULL, "invalid UTF-8 byte 0xE2");
    /* Valid non-ASCII in code is an unexpected character, named as such. */
    LEX_ERR("x × w", "ident:x ident:w $ EOF", "unexpected character '×'");
    LEX_ERR("β = 0.9", "= float:0.9 $ EOF", "unexpected character 'β'");
}

static void t_err_strings(void) {
    LEX_ERR("s = \"abc\nt = 1", NULL, "unterminated string");
    LEX_ERR("s = \"abc", NULL, "unterminated string");
    LEX_ERR("\"", NULL, "unterminated string");
    LEX_ERR("\"abc\\\"", NULL, "unterminated string"); /* \" is an escape, not the end */
    LEX_ERR("s = \"a\\qb\"", "ident:s = str:\"a\\qb\" $ EOF", "unknown escape sequence in string");
    LEX_ERR("s = \"C:\\data\"", NULL, "unknown escape sequence in string");
    /* The unterminated string ends at the line end; the next line lexes normally. */
    Lexed r = lex_all("s = \"abc\nt = 1", 14);
    CHECK_STR(buf_str(&r.text), "ident:s = str:\"abc $ ident:t = int:1 $ EOF", "tokens after an unterminated string");
    CHECK(strstr(r.log, "test.mbt:1:5: error: unterminated string") != NULL, "unterminated string not at 1:5");
    CHECK(strstr(r.log, "hint: close the string with '\"' on the same line") != NULL, "no hint for the string");
    lexed_free(&r);
}

static void t_err_characters(void) {
    LEX_ERR("x = 'a'", "ident:x = str:'a' $ EOF", "strings use double quotes, not single quotes");
    LEX_ERR("if !x", "if ident:x $ EOF", "unexpected character '!'");
    LEX_ERR("a && b", "ident:a and ident:b $ EOF", "unexpected '&&'");
    LEX_ERR("a || b", "ident:a or ident:b $ EOF", "unexpected '||'");
    LEX_ERR("$x", "ident:x $ EOF", "unexpected character '$'");
    LEX_ERR("a ? b", "ident:a ident:b $ EOF", "unexpected character '?'");
    LEX_ERR("`x`", "ident:x $ EOF", "unexpected character '`'");
    LEX_ERR("a \\ b", "ident:a ident:b $ EOF", "unexpected character '\\'");
    LEX_ERR("x = \x01", "ident:x = EOF", "unexpected control character 0x01");
    LEX_ERR("x\x7f", "ident:x $ EOF", "unexpected control character 0x7F");
    Lexed r = lex_all("'a'", 3);
    CHECK(strstr(r.log, "hint: write \"...\"") != NULL, "no hint for a single quote");
    lexed_free(&r);
    r = lex_all("!x", 2);
    CHECK(strstr(r.log, "hint: write 'not x'") != NULL, "no hint for '!'");
    lexed_free(&r);
}

static void t_err_numbers(void) {
    LEX_ERR("x = 0x10", "ident:x = int:0x10 $ EOF", "invalid number '0x10'");
    LEX_ERR("schedule = 1f1b", "ident:schedule = int:1f1b $ EOF", "invalid number '1f1b'");
    LEX_ERR("x = 12abc", NULL, "invalid number '12abc'");
    LEX_ERR("x = 1e", NULL, "invalid number '1e'");
    Lexed r = lex_all("0b101", 5);
    CHECK(strstr(r.log, "hint: numbers are decimal") != NULL, "no hint for an invalid number");
    lexed_free(&r);
}

static void t_err_long_identifier(void) {
    size_t n = (size_t)1 << 20;
    char *src = malloc(n + 8);
    memcpy(src, "x = ", 4);
    memset(src + 4, 'a', n);
    memcpy(src + 4 + n, "\ny", 2);
    Lexed r = lex_all(src, n + 6);
    CHECK(r.errors == 1, "%d errors for a 1 MB identifier, expected 1", r.errors);
    CHECK(strstr(r.log, "identifier is 1048576 bytes long; the limit is 1024") != NULL, "no message for a 1 MB identifier");
    CHECK(r.n == 7 && r.toks[2].code == TK_IDENT && r.toks[3].code == TK_SEMI && r.toks[4].code == TK_IDENT,
          "tokens around a 1 MB identifier: %s", buf_str(&r.text));
    CHECK(strlen(r.log) < 4096, "%zu bytes of messages for one long identifier", strlen(r.log));
    lexed_free(&r);
    /* One byte over the limit is refused. */
    memset(src, 'b', LEX_MAX_IDENT + 1);
    r = lex_all(src, LEX_MAX_IDENT + 1);
    CHECK(r.errors == 1 && strstr(r.log, "the limit is 1024"), "a %d-byte identifier was accepted", LEX_MAX_IDENT + 1);
    lexed_free(&r);
    free(src);
}

static void t_err_nesting(void) {
    /* LEX_MAX_NESTING open brackets are fine... */
    Buf b = {0};
    for (int i = 0; i < LEX_MAX_NESTING; i++) buf_printf(&b, i % 2 ? "[" : "(");
    buf_printf(&b, "x");
    for (int i = LEX_MAX_NESTING - 1; i >= 0; i--) buf_printf(&b, i % 2 ? "]" : ")");
    Lexed r = lex_all(b.p, b.n);
    CHECK(r.errors == 0, "%d brackets deep was refused: %.200s", LEX_MAX_NESTING, r.log);
    CHECK(r.n == 2 * LEX_MAX_NESTING + 3, "%d tokens for %d nested brackets", r.n, LEX_MAX_NESTING);
    lexed_free(&r);
    buf_free(&b);
    /* ... one more is an error, reported once, and the lexer stops there. */
    for (int i = 0; i <= LEX_MAX_NESTING; i++) buf_printf(&b, "(");
    buf_printf(&b, "x))))\ny = 1\n");
    for (int i = 0; i < 1000; i++) buf_printf(&b, "((((((\n");
    r = lex_all(b.p, b.n);
    CHECK(r.errors == 1, "%d errors for brackets nested too deep, expected 1", r.errors);
    CHECK(strstr(r.log, "test.mbt:1:257: error: brackets nested more than 256 deep") != NULL,
          "no located message for brackets nested too deep");
    CHECK(r.n == LEX_MAX_NESTING + 1 && r.toks[r.n - 1].code == 0, "%d tokens: the lexer did not stop at the 257th '('", r.n);
    lexed_free(&r);
    buf_free(&b);
}

static void t_err_recovery(void) {
    /* After an error the lexer goes on, and the later tokens are right. */
    static const char src[] = "a $ b\n\"x\\q\" c\n\xff d\n# \xfe\ne";
    Lexed r = lex_all(src, sizeof src - 1);
    CHECK(r.errors == 4, "%d errors, expected 4", r.errors);
    CHECK_STR(buf_str(&r.text), "ident:a ident:b $ str:\"x\\q\" ident:c $ ident:d $ ident:e $ EOF", "tokens");
    lexed_free(&r);
}

static void t_token_desc(void) {
    /* Every token the lexer produces has a description for messages. */
    int codes[] = {TK_IMPORT,  TK_AS,        TK_MODEL,    TK_FN,      TK_PARAM,  TK_RETURN, TK_FOR,   TK_IN,     TK_IF,
                   TK_ELSE,    TK_OPTIMIZER, TK_STATE,    TK_TRAIN,   TK_SERVE,  TK_TRUE,   TK_FALSE, TK_AND,    TK_OR,
                   TK_NOT,     TK_IDENT,     TK_INT,      TK_FLOAT,   TK_STRING, TK_SEMI,   TK_COMMA, TK_COLON,  TK_ASSIGN,
                   TK_PLUSEQ,  TK_MINUSEQ,   TK_STAREQ,   TK_SLASHEQ, TK_TILDE,  TK_ARROW,  TK_DOT,   TK_DOTDOT, TK_LPAREN,
                   TK_RPAREN,  TK_LBRACKET,  TK_RBRACKET, TK_LBRACE,  TK_RBRACE, TK_PLUS,   TK_MINUS, TK_STAR,   TK_SLASH,
                   TK_PERCENT, TK_AT,        TK_CARET,    TK_EQ,      TK_NE,     TK_LT,     TK_LE,    TK_GT,     TK_GE,
                   0};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *d = lex_token_desc(codes[i]);
        CHECK(d && strcmp(d, "a token") != 0, "token %s has no description", tok_name(codes[i]));
        if (codes[i] > 0 && codes[i] != TK_IDENT && codes[i] != TK_INT && codes[i] != TK_FLOAT && codes[i] != TK_STRING &&
            codes[i] != TK_SEMI) {
            char want[32];
            snprintf(want, sizeof want, "'%s'", tok_name(codes[i]));
            CHECK(strcmp(d, want) == 0, "description of %s is %s", want, d);
        }
    }
    CHECK(strcmp(lex_token_desc(0), "end of file") == 0, "description of EOF");
}

int main(void) {
    RUN(t_empty_and_blank);
    RUN(t_keywords);
    RUN(t_identifiers);
    RUN(t_operators);
    RUN(t_numbers);
    RUN(t_strings);
    RUN(t_comments);
    RUN(t_semi_after_enders);
    RUN(t_no_semi_after_others);
    RUN(t_no_semi_inside_brackets);
    RUN(t_semi_before_rbrace);
    RUN(t_semi_at_eof);
    RUN(t_eof_is_sticky);
    RUN(t_spans);
    RUN(t_spans_of_real_files);
    RUN(t_err_nul);
    RUN(t_err_utf8);
    RUN(t_err_strings);
    RUN(t_err_characters);
    RUN(t_err_numbers);
    RUN(t_err_long_identifier);
    RUN(t_err_nesting);
    RUN(t_err_recovery);
    RUN(t_token_desc);
    return unit_finish();
}
