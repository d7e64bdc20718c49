/* parse_ctx.h - what the lemon grammar's actions call: the parser's context and the AST
 * constructors behind each rule (implemented in compiler/parse.c). Internal to the front end. */
#ifndef MBT_PARSE_CTX_H
#define MBT_PARSE_CTX_H

#include "arena.h"
#include "ast.h"
#include "lexer.h"

#define PARSE_MAX_DEPTH 1000   /* deepest expression tree accepted */
#define PARSE_STACK_DEPTH 2000 /* the parser's stack (compiler/front/mbt.y %stack_size) */

typedef struct ParseCtx {
    Arena *ar;
    Node *prog; /* N_PROGRAM being filled */
    Lexer *lx;
    int failed;        /* a syntax error was reported: parse.c restarts at the next declaration */
    int depth_error;   /* "nested too deeply" already reported */
    Token cur;         /* the token being fed to the parser */
    int prev;          /* the code of the token fed before it */
    Span prev_span;    /* and where it was */
    uint32_t decl_off; /* where the current top-level declaration starts */
} ParseCtx;

/* expected: the terminals the parser could take; terms: its stack, top first (nonterminals -1). */
void parse_syntax_error(ParseCtx *c, int code, const Token *tok, const int *expected, int nexpected, const int *terms,
                        int nterms);
void parse_stack_overflow(ParseCtx *c);
void parse_add_decl(ParseCtx *c, Node *d);

Node *parse_import(ParseCtx *c, const Token *kw, const Token *name, const Token *alias);
Node *parse_decl(ParseCtx *c, NodeKind k, const Token *kw, const Token *name, NodeList *params, NodeList *body, const Token *end);
Node *parse_fparam(ParseCtx *c, const Token *name, Node *type, Node *dflt);
Node *parse_type(ParseCtx *c, const Token *dtype, NodeList *dims, const Token *end, int has_dims);
Node *parse_state(ParseCtx *c, const Token *kw, NodeList *vars);
Node *parse_setting(ParseCtx *c, const Token *key, Node *value);
Node *parse_setting_block(ParseCtx *c, const Token *key, NodeList *items, const Token *end);
Node *parse_assign(ParseCtx *c, NodeList *targets, Node *value);
Node *parse_param_decl(ParseCtx *c, NodeList *targets, const Token *kw, Node *type, Node *init);
Node *parse_aug(ParseCtx *c, Op op, Node *target, Node *value);
Node *parse_expr_stmt(ParseCtx *c, NodeList *exprs);
Node *parse_return(ParseCtx *c, const Token *kw, Node *value);
Node *parse_tuple_of(ParseCtx *c, Node *first, NodeList *rest);
Node *parse_for(ParseCtx *c, const Token *kw, const Token *var, Node *iter, NodeList *body, const Token *end);
Node *parse_if(ParseCtx *c, const Token *kw, Node *cond, NodeList *then, NodeList *els, const Token *end);
Node *parse_binary(ParseCtx *c, Op op, Node *a, Node *b);
Node *parse_unary(ParseCtx *c, Op op, const Token *kw, Node *a);
Node *parse_range(ParseCtx *c, Node *a, Node *b);
Node *parse_call(ParseCtx *c, Node *callee, NodeList *args, const Token *end);
Node *parse_index(ParseCtx *c, Node *base, NodeList *idx, const Token *end);
Node *parse_attr(ParseCtx *c, Node *base, const Token *name);
Node *parse_name(ParseCtx *c, const Token *name);
Node *parse_int(ParseCtx *c, const Token *t);
Node *parse_float(ParseCtx *c, const Token *t);
Node *parse_string(ParseCtx *c, const Token *t);
Node *parse_bool(ParseCtx *c, const Token *t, int v);
Node *parse_paren(ParseCtx *c, const Token *l, Node *e, const Token *r);
Node *parse_seq(ParseCtx *c, NodeKind k, const Token *l, Node *first, NodeList *rest, const Token *r);
Node *parse_comp(ParseCtx *c, const Token *l, Node *elem, const Token *var, Node *iter, const Token *r);
Node *parse_holder(ParseCtx *c, NodeList *l);
Node *parse_kwarg(ParseCtx *c, const Token *name, Node *value);
Node *parse_slice(ParseCtx *c, const Token *colon, Node *lo, Node *hi);

#endif
