/* parse.c - drives the lexer and the lemon parser over one source file, builds AST nodes for the
 * grammar's actions (parse_ctx.h), and turns lemon's syntax errors into messages that say what
 * was expected. Pipeline position: source -> [lexer + parser] -> AST -> sema.
 *
 * Error recovery: after a syntax error the parser is thrown away and a fresh one starts at the
 * next declaration keyword in column 1, so one run reports the errors of several declarations
 * without a cascade of follow-on errors from the same one. */
#include "parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lexer.h"
#include "mbt.h"
#include "parse_ctx.h"

/* lemon's generated interface (build/mbt.c) */
void *mbtParseAlloc(void *(*alloc)(size_t), ParseCtx *ctx);
void mbtParse(void *parser, int code, Token tok);
void mbtParseFree(void *parser, void (*dealloc)(void *));

/* ---- node construction helpers -------------------------------------------------------------- */

static Str tok_str(const Token *t) {
    uint32_t len;
    const char *text = diag_source_text(t->span.file, &len);
    return (Str){text + t->span.off, t->span.len};
}

static Span spans(Span a, Span b) { return span_join(a, b); }

static uint32_t maxu(uint32_t a, uint32_t b) { return a > b ? a : b; }

/* Records the height of n from its children and reports trees deeper than the limit once. */
static Node *deepen(ParseCtx *c, Node *n, uint32_t child_depth) {
    n->depth = child_depth + 1;
    if (n->depth > PARSE_MAX_DEPTH && !c->depth_error) {
        c->depth_error = 1;
        diag_error(n->span, "expression nested more than %d deep", PARSE_MAX_DEPTH);
        diag_hint("split the expression into several statements");
    }
    return n;
}

static uint32_t list_depth(const NodeList *l) {
    uint32_t d = 0;
    for (int i = 0; l && i < l->n; i++) d = maxu(d, l->v[i]->depth);
    return d;
}

static Node *mk(ParseCtx *c, NodeKind k, Span sp) { return ast_new(c->ar, k, sp); }

/* ---- syntax errors ------------------------------------------------------------------------- */

/* How a token reads in a message: its own text for names and literals, else its description.
 * An inserted statement end (length 0) reads as what stands there: a '}', a line end or the end. */
static const char *tok_show(ParseCtx *c, int code, const Token *t) {
    uint32_t len;
    const char *text = diag_source_text(t->span.file, &len);
    if (code == TK_SEMI && t->span.len == 0) {
        if (t->span.off < len && text[t->span.off] == '}') return "'}'";
        return t->span.off >= len ? "end of file" : "end of line";
    }
    if (code == TK_IDENT || code == TK_INT || code == TK_FLOAT) {
        Str s = tok_str(t);
        return arena_printf(c->ar, "'%.*s'", (int)(s.len > 40 ? 40 : s.len), s.p);
    }
    return lex_token_desc(code);
}

/* Tokens that can only start an expression, and tokens that can only continue one. */
static int starts_expression(int code) {
    switch (code) {
    case TK_IDENT:
    case TK_INT:
    case TK_FLOAT:
    case TK_STRING:
    case TK_TRUE:
    case TK_FALSE:
    case TK_MODEL:
    case TK_NOT:
    case TK_PARAM: return 1;
    default: return 0;
    }
}

static int continues_expression(int code) {
    switch (code) {
    case TK_STAR:
    case TK_SLASH:
    case TK_PERCENT:
    case TK_CARET:
    case TK_AT:
    case TK_EQ:
    case TK_NE:
    case TK_LT:
    case TK_LE:
    case TK_GT:
    case TK_GE:
    case TK_AND:
    case TK_OR:
    case TK_DOTDOT:
    case TK_DOT: return 1;
    default: return 0;
    }
}

/* Either: '(' '[' '+' '-' start an expression (grouping, list, sign) or continue one. */
static int either_expression(int code) { return code == TK_LPAREN || code == TK_LBRACKET || code == TK_PLUS || code == TK_MINUS; }

static int is_keyword(int code) {
    switch (code) {
    case TK_IMPORT:
    case TK_AS:
    case TK_FN:
    case TK_PARAM:
    case TK_RETURN:
    case TK_FOR:
    case TK_IN:
    case TK_IF:
    case TK_ELSE:
    case TK_OPTIMIZER:
    case TK_STATE:
    case TK_TRAIN:
    case TK_SERVE:
    case TK_AND:
    case TK_OR:
    case TK_NOT:
    case TK_MODEL: return 1;
    default: return 0;
    }
}

/* Tokens after which an expression is complete (so a following operand means a missing ','). */
static int ends_operand(int code) {
    switch (code) {
    case TK_IDENT:
    case TK_INT:
    case TK_FLOAT:
    case TK_STRING:
    case TK_TRUE:
    case TK_FALSE:
    case TK_RPAREN:
    case TK_RBRACKET: return 1;
    default: return 0;
    }
}

static int is_comparison(int code) {
    return code == TK_EQ || code == TK_NE || code == TK_LT || code == TK_LE || code == TK_GT || code == TK_GE;
}

/* Could only a closing bracket, a ',' or an operator follow here? (then a missing ',' is likely) */
static int wants_separator(const int *expected, int nexpected) {
    for (int i = 0; i < nexpected; i++) {
        int t = expected[i];
        if (t != TK_RPAREN && t != TK_RBRACKET && t != TK_COMMA && !continues_expression(t) && !either_expression(t)) return 0;
    }
    return nexpected > 0;
}

/* Is the parser inside a function header: 'fn' on the stack with no '{' above it? */
static int in_fn_header(const int *terms, int nterms) {
    for (int i = 0; i < nterms; i++) {
        if (terms[i] == TK_LBRACE) return 0;
        if (terms[i] == TK_FN || terms[i] == TK_OPTIMIZER || terms[i] == TK_MODEL) return 1;
    }
    return 0;
}

/* "expected X to close Y opened at L:C" for the innermost open bracket or brace. */
static void error_unclosed(Span at, const char *got, Span open) {
    uint32_t len;
    const char *text = diag_source_text(open.file, &len);
    char o = text[open.off], close = o == '(' ? ')' : o == '[' ? ']' : '}';
    diag_error(at, "expected '%c' to close '%c' opened at %u:%u, got %s", close, o, open.line, open.col, got);
    diag_note(open, "'%c' opened here", o);
}

void parse_syntax_error(ParseCtx *c, int code, const Token *tok, const int *expected, int nexpected, const int *terms,
                        int nterms) {
    if (c->failed) return;
    c->failed = 1;
    const Lexer *lx = c->lx;
    /* A declaration with a lexical error already has its message; what follows is noise. */
    if (lx->errors && lx->last_error_off >= c->decl_off) return;
    const char *got = tok_show(c, code, tok);
    Span at = tok->span;
    int has_start = 0, has_cont = 0, has_either = 0, want_close = 0, want_decl = 0, nshow = 0;
    const char *show[16];
    for (int i = 0; i < nexpected; i++) {
        int t = expected[i];
        if (t == TK_RPAREN || t == TK_RBRACKET) want_close = 1;
        if (t == TK_IMPORT) want_decl = 1;
        if (starts_expression(t)) has_start = 1;
        else if (continues_expression(t)) has_cont = 1;
        else if (either_expression(t)) has_either = 1;
        else if (nshow < 16) show[nshow++] = lex_token_desc(t);
    }
    int has_expr = has_start, has_op = has_cont || (has_either && !has_start);
    int top_term = nterms > 0 ? terms[0] : 0;
    /* The innermost bracket still open (the failing token itself may be a new one). */
    int top = lx->depth - 1;
    if (top >= 0 && (code == TK_LPAREN || code == TK_LBRACKET) && lx->open[top].off == tok->span.off) top--;
    char closer = 0;
    if (top >= 0) {
        uint32_t len;
        closer = diag_source_text(lx->open[top].file, &len)[lx->open[top].off] == '(' ? ')' : ']';
    }

    int same_line = c->prev_span.line == tok->span.line;
    if (want_decl && nterms <= 1) {
        diag_error(at, "expected a declaration (import, model, fn, optimizer, train or serve), got %s", got);
    } else if (is_comparison(code) && nterms >= 2 && terms[0] == -1 && is_comparison(terms[1])) {
        diag_error(at, "comparisons cannot be chained");
        diag_hint("write 'a < b and b < c'");
    } else if (top_term == TK_IMPORT || top_term == TK_AS) {
        diag_error(at, "expected a module name, got %s", got);
    } else if (top_term == TK_ARROW || (top_term == TK_COLON && in_fn_header(terms, nterms))) {
        diag_error(at, "expected a type, got %s", got);
        diag_hint("a type is a dtype with dimensions, such as f32[B, T, d], or a dtype alone for a scalar");
    } else if (is_keyword(code) && code != TK_NOT && code != TK_MODEL && (c->prev == TK_LPAREN || c->prev == TK_COMMA) &&
               in_fn_header(terms, nterms)) {
        diag_error(at, "expected a parameter name, got %s", got);
        diag_hint("%s is a keyword; choose another name", got);
    } else if (is_keyword(code) && (c->prev == TK_DOT || c->prev == TK_FN || c->prev == TK_FOR)) {
        diag_error(at, "expected a name, got %s", got);
        diag_hint("%s is a keyword; choose another name", got);
    } else if (code == TK_ELSE && !has_expr) {
        diag_error(at, "'else' must be on the same line as the '}' before it");
        diag_hint("write '} else {' on one line");
    } else if (code == TK_COMMA && (c->prev == TK_COMMA || c->prev == TK_LPAREN || c->prev == TK_LBRACKET) && closer) {
        diag_error(at, "expected an expression or '%c', got ','", closer);
    } else if (closer && same_line && ends_operand(c->prev) && (starts_expression(code) || code == TK_LPAREN) &&
               wants_separator(expected, nexpected)) {
        diag_error(at, "expected ',' or '%c', got %s", closer, got);
    } else if (want_close && !has_expr && top >= 0 && code != TK_RPAREN && code != TK_RBRACKET) {
        error_unclosed(at, got, lx->open[top]);
    } else if (code == 0 && lx->braces > 0) {
        at.len = 0;
        error_unclosed(at, got, lx->brace[lx->braces - 1]);
    } else if (has_expr && nshow == 0 && !has_op) {
        diag_error(at, "expected an expression, got %s", got);
    } else if (nexpected > 0 && nshow + has_op + has_expr <= 4) {
        const char *items[20];
        int k = 0;
        for (int i = 0; i < nshow; i++) items[k++] = show[i];
        if (has_expr) items[k++] = "an expression";
        if (has_op) items[k++] = "an operator";
        char buf[512];
        size_t n = 0;
        buf[0] = 0;
        for (int i = 0; i < k && n < sizeof buf; i++) {
            const char *sep = i == 0 ? "" : i == k - 1 ? " or " : ", ";
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", sep, items[i]);
        }
        diag_error(at, "expected %s, got %s", buf, got);
        if (code == TK_ASSIGN && has_op) diag_hint("'=' assigns; '==' compares");
        if (code == TK_LBRACE) diag_hint("a block opens after the header on the same line: 'for x in xs {'");
    } else {
        diag_error(at, "unexpected %s", got);
    }
}

void parse_stack_overflow(ParseCtx *c) {
    if (c->failed) return;
    c->failed = 1;
    diag_error(c->cur.span, "program nested too deeply for the parser (more than %d levels)", PARSE_STACK_DEPTH);
    diag_hint("split the expression or block into several statements or functions");
}

/* ---- declarations -------------------------------------------------------------------------- */

void parse_add_decl(ParseCtx *c, Node *d) {
    if (d) ast_push(c->ar, &c->prog->list, d);
}

Node *parse_import(ParseCtx *c, const Token *kw, const Token *name, const Token *alias) {
    Node *n = mk(c, N_IMPORT, spans(kw->span, (alias ? alias : name)->span));
    n->name = tok_str(name);
    if (alias) n->alias = tok_str(alias);
    return n;
}

Node *parse_decl(ParseCtx *c, NodeKind k, const Token *kw, const Token *name, NodeList *params, NodeList *body,
                 const Token *end) {
    Node *n = mk(c, k, spans(kw->span, end->span));
    n->name = tok_str(name);
    n->list = *params;
    n->list2 = *body;
    return n;
}

Node *parse_fparam(ParseCtx *c, const Token *name, Node *type, Node *dflt) {
    Span sp = name->span;
    if (type) sp = spans(sp, type->span);
    if (dflt) sp = spans(sp, dflt->span);
    Node *n = mk(c, N_FPARAM, sp);
    n->name = tok_str(name);
    n->type = type;
    n->a = dflt;
    return n;
}

Node *parse_type(ParseCtx *c, const Token *dtype, NodeList *dims, const Token *end, int has_dims) {
    Node *n = mk(c, N_TYPE, end ? spans(dtype->span, end->span) : dtype->span);
    n->name = tok_str(dtype);
    if (dims) n->list = *dims;
    n->ival = has_dims;
    return deepen(c, n, list_depth(dims));
}

Node *parse_state(ParseCtx *c, const Token *kw, NodeList *vars) {
    Node *n = mk(c, N_STATE, spans(kw->span, vars->v[vars->n - 1]->span));
    n->list = *vars;
    return n;
}

Node *parse_setting(ParseCtx *c, const Token *key, Node *value) {
    Node *n = mk(c, N_SETTING, spans(key->span, value->span));
    n->name = tok_str(key);
    n->a = value;
    return n;
}

Node *parse_setting_block(ParseCtx *c, const Token *key, NodeList *items, const Token *end) {
    Node *n = mk(c, N_SETTING_BLOCK, spans(key->span, end->span));
    n->name = tok_str(key);
    n->list = *items;
    return n;
}

/* ---- statements -------------------------------------------------------------------------- */

Node *parse_assign(ParseCtx *c, NodeList *targets, Node *value) {
    Node *n = mk(c, N_ASSIGN, spans(targets->v[0]->span, value->span));
    n->list = *targets;
    n->a = value;
    return n;
}

Node *parse_param_decl(ParseCtx *c, NodeList *targets, const Token *kw, Node *type, Node *init) {
    Node *t = targets->v[0];
    Node *n = mk(c, N_PARAM_DECL, spans(t->span, init ? init->span : type->span));
    if (targets->n != 1 || t->kind != N_NAME) {
        diag_error(t->span, "a parameter is declared with one name: 'w = param f32[n, m]'");
    } else {
        n->name = t->name;
    }
    (void)kw;
    n->type = type;
    n->a = init;
    return n;
}

Node *parse_aug(ParseCtx *c, Op op, Node *target, Node *value) {
    Node *n = mk(c, N_AUG_ASSIGN, spans(target->span, value->span));
    n->op = op;
    n->a = target;
    n->b = value;
    return n;
}

Node *parse_tuple_of(ParseCtx *c, Node *first, NodeList *rest) {
    Node *n = mk(c, N_TUPLE, spans(first->span, rest->v[rest->n - 1]->span));
    ast_push(c->ar, &n->list, first);
    for (int i = 0; i < rest->n; i++) ast_push(c->ar, &n->list, rest->v[i]);
    return deepen(c, n, list_depth(&n->list));
}

Node *parse_expr_stmt(ParseCtx *c, NodeList *exprs) {
    Node *e = exprs->v[0];
    if (exprs->n > 1) {
        NodeList rest = {exprs->v + 1, exprs->n - 1};
        e = parse_tuple_of(c, e, &rest);
    }
    Node *n = mk(c, N_EXPR_STMT, e->span);
    n->a = e;
    return n;
}

Node *parse_return(ParseCtx *c, const Token *kw, Node *value) {
    Node *n = mk(c, N_RETURN, value ? spans(kw->span, value->span) : kw->span);
    n->a = value;
    return n;
}

Node *parse_for(ParseCtx *c, const Token *kw, const Token *var, Node *iter, NodeList *body, const Token *end) {
    Node *n = mk(c, N_FOR, spans(kw->span, end->span));
    n->name = tok_str(var);
    n->a = iter;
    n->list = *body;
    return n;
}

Node *parse_if(ParseCtx *c, const Token *kw, Node *cond, NodeList *then, NodeList *els, const Token *end) {
    Node *n = mk(c, N_IF, end ? spans(kw->span, end->span) : kw->span);
    n->a = cond;
    n->list = *then;
    if (els) n->list2 = *els;
    return n;
}

/* ---- expressions ------------------------------------------------------------------------- */

Node *parse_binary(ParseCtx *c, Op op, Node *a, Node *b) {
    Node *n = mk(c, N_BINARY, spans(a->span, b->span));
    n->op = op;
    n->a = a;
    n->b = b;
    return deepen(c, n, maxu(a->depth, b->depth));
}

Node *parse_unary(ParseCtx *c, Op op, const Token *kw, Node *a) {
    Node *n = mk(c, N_UNARY, spans(kw->span, a->span));
    n->op = op;
    n->a = a;
    return deepen(c, n, a->depth);
}

Node *parse_range(ParseCtx *c, Node *a, Node *b) {
    Node *n = mk(c, N_RANGE, spans(a->span, b->span));
    n->a = a;
    n->b = b;
    return deepen(c, n, maxu(a->depth, b->depth));
}

Node *parse_call(ParseCtx *c, Node *callee, NodeList *args, const Token *end) {
    Node *n = mk(c, N_CALL, spans(callee->span, end->span));
    n->a = callee;
    n->list = *args;
    /* Keyword arguments come after positional ones. */
    int seen_kw = 0;
    for (int i = 0; i < args->n; i++) {
        if (args->v[i]->kind == N_KWARG) seen_kw = 1;
        else if (seen_kw) {
            diag_error(args->v[i]->span, "positional argument after a keyword argument");
            diag_hint("put positional arguments first");
            break;
        }
    }
    return deepen(c, n, maxu(callee->depth, list_depth(args)));
}

Node *parse_index(ParseCtx *c, Node *base, NodeList *idx, const Token *end) {
    Node *n = mk(c, N_INDEX, spans(base->span, end->span));
    n->a = base;
    n->list = *idx;
    return deepen(c, n, maxu(base->depth, list_depth(idx)));
}

Node *parse_attr(ParseCtx *c, Node *base, const Token *name) {
    Node *n = mk(c, N_ATTR, spans(base->span, name->span));
    n->a = base;
    n->name = tok_str(name);
    return deepen(c, n, base->depth);
}

Node *parse_name(ParseCtx *c, const Token *name) {
    Node *n = mk(c, N_NAME, name->span);
    n->name = tok_str(name);
    return n;
}

Node *parse_int(ParseCtx *c, const Token *t) {
    Node *n = mk(c, N_INT, t->span);
    Str s = tok_str(t);
    uint64_t v = 0;
    for (uint32_t i = 0; i < s.len; i++) {
        if (s.p[i] == '_') continue;
        if (s.p[i] < '0' || s.p[i] > '9') return n; /* already reported as an invalid number */
        unsigned d = (unsigned)(s.p[i] - '0');
        if (v > (UINT64_C(0x7FFFFFFFFFFFFFFF) - d) / 10) {
            diag_error(t->span, "integer literal too large (the limit is 9223372036854775807)");
            return n;
        }
        v = v * 10 + d;
    }
    n->ival = (int64_t)v;
    return n;
}

Node *parse_float(ParseCtx *c, const Token *t) {
    Node *n = mk(c, N_FLOAT, t->span);
    Str s = tok_str(t);
    char buf[128];
    uint32_t k = 0;
    for (uint32_t i = 0; i < s.len && k + 1 < sizeof buf; i++)
        if (s.p[i] != '_') buf[k++] = s.p[i];
    buf[k] = 0;
    if (s.len >= sizeof buf) {
        diag_error(t->span, "number literal too long");
        return n;
    }
    errno = 0;
    n->fval = strtod(buf, NULL);
    if (errno == ERANGE && isinf(n->fval)) diag_error(t->span, "number literal out of range");
    return n;
}

Node *parse_string(ParseCtx *c, const Token *t) {
    Node *n = mk(c, N_STRING, t->span);
    Str s = tok_str(t); /* includes the quotes; escapes were checked by the lexer */
    char *out = arena_alloc(c->ar, s.len + 1);
    uint32_t k = 0;
    for (uint32_t i = 1; i + 1 < s.len; i++) {
        char ch = s.p[i];
        if (ch == '\\' && i + 2 < s.len) {
            char e = s.p[++i];
            ch = e == 'n' ? '\n' : e == 't' ? '\t' : e;
        }
        out[k++] = ch;
    }
    out[k] = 0;
    n->sval = out;
    n->slen = k;
    return n;
}

Node *parse_bool(ParseCtx *c, const Token *t, int v) {
    Node *n = mk(c, N_BOOL, t->span);
    n->ival = v;
    return n;
}

Node *parse_paren(ParseCtx *c, const Token *l, Node *e, const Token *r) {
    /* Parentheses only group: keep the inner node, widen its span to include them. */
    (void)c;
    e->span = spans(l->span, r->span);
    return e;
}

Node *parse_seq(ParseCtx *c, NodeKind k, const Token *l, Node *first, NodeList *rest, const Token *r) {
    Node *n = mk(c, k, spans(l->span, r->span));
    if (first) ast_push(c->ar, &n->list, first);
    for (int i = 0; rest && i < rest->n; i++) ast_push(c->ar, &n->list, rest->v[i]);
    return deepen(c, n, list_depth(&n->list));
}

Node *parse_comp(ParseCtx *c, const Token *l, Node *elem, const Token *var, Node *iter, const Token *r) {
    Node *n = mk(c, N_COMP, spans(l->span, r->span));
    n->a = elem;
    n->name = tok_str(var);
    n->b = iter;
    return deepen(c, n, maxu(elem->depth, iter->depth));
}

Node *parse_holder(ParseCtx *c, NodeList *l) {
    Node *n = mk(c, N_LIST, span_none());
    n->list = *l;
    return n;
}

Node *parse_kwarg(ParseCtx *c, const Token *name, Node *value) {
    Node *n = mk(c, N_KWARG, spans(name->span, value->span));
    n->name = tok_str(name);
    n->a = value;
    return deepen(c, n, value->depth);
}

Node *parse_slice(ParseCtx *c, const Token *colon, Node *lo, Node *hi) {
    Span sp = colon->span;
    if (lo) sp = spans(lo->span, sp);
    if (hi) sp = spans(sp, hi->span);
    Node *n = mk(c, N_SLICE, sp);
    n->a = lo;
    n->b = hi;
    return deepen(c, n, maxu(lo ? lo->depth : 0, hi ? hi->depth : 0));
}

/* ---- the driver -------------------------------------------------------------------------- */

static int starts_declaration(const Token *t) {
    if (t->span.col != 1) return 0;
    switch (t->code) {
    case TK_IMPORT:
    case TK_MODEL:
    case TK_FN:
    case TK_OPTIMIZER:
    case TK_TRAIN:
    case TK_SERVE: return 1;
    default: return 0;
    }
}

/* Feeds one token to the parser, remembering it for error messages. */
static void feed(void *p, ParseCtx *c, Token t) {
    if (starts_declaration(&t)) c->decl_off = t.span.off;
    c->cur = t;
    mbtParse(p, t.code, t);
    c->prev = t.code;
    c->prev_span = t.span;
}

Node *parse_source(Arena *ar, uint32_t file) {
    Lexer lx;
    lex_init(&lx, file);
    ParseCtx ctx = {0};
    ctx.ar = ar;
    ctx.lx = &lx;
    uint32_t len;
    diag_source_text(file, &len);
    ctx.prog = ast_new(ar, N_PROGRAM, (Span){file, 0, len, 1, 1});

    void *p = mbtParseAlloc(malloc, &ctx);
    if (!p) INTERNAL("out of memory creating the parser");
    for (;;) {
        Token t = lex_next(&lx);
        if (lx.too_deep) break; /* reported by the lexer; the rest of the file is not parsed */
        feed(p, &ctx, t);
        if (t.code == 0) break;
        if (ctx.failed) {
            /* Skip to the next declaration and start a fresh parser there. */
            mbtParseFree(p, free);
            p = NULL;
            while (t.code != 0 && !starts_declaration(&t)) t = lex_next(&lx);
            if (t.code == 0 || lx.too_deep) break;
            p = mbtParseAlloc(malloc, &ctx);
            if (!p) INTERNAL("out of memory creating the parser");
            ctx.failed = 0;
            ctx.prev = TK_SEMI;
            lx.depth = 0;
            lx.braces = 0;
            feed(p, &ctx, t);
        }
    }
    if (p) mbtParseFree(p, free);
    return ctx.prog;
}

void parse_dump_tokens(FILE *out, uint32_t file) {
    Lexer lx;
    lex_init(&lx, file);
    for (;;) {
        Token t = lex_next(&lx);
        uint32_t len;
        const char *text = diag_source_text(file, &len);
        fprintf(out, "%u:%u\t%s", t.span.line, t.span.col, lex_token_desc(t.code));
        if (t.code == TK_IDENT || t.code == TK_INT || t.code == TK_FLOAT || t.code == TK_STRING)
            fprintf(out, "\t%.*s", (int)(t.span.len > 80 ? 80 : t.span.len), text + t.span.off);
        fputc('\n', out);
        if (t.code == 0) break;
    }
}
