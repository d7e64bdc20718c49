/* mbt.y - the lemon grammar of the .mbt language: tokens (from compiler/front/lexer.re) -> AST.
 *
 * Pipeline position: lexer -> [parser] -> sema. docs/language.md is the reference this grammar
 * implements. Statements end with TK_SEMI, which the lexer inserts at line ends and before '}'.
 * Each reduced declaration is appended to the program at once (ctx->prog), so when a syntax
 * error makes compiler/parse.c restart the parser at the next declaration, what parsed before
 * is kept. Nesting depth is tracked per node so later recursive passes stay within bounds. */

%name mbtParse
%token_prefix TK_
%token_type {Token}
%extra_context {ParseCtx *ctx}
%default_type {Node *}
%start_symbol program
%stack_size 2000

%include {
#include <stdlib.h>
#include <string.h>

#include "ast.h"
#include "lexer.h"
#include "parse_ctx.h"
}

%syntax_error {
    /* The tokens the parser could have taken here: those with an action in the current state. */
    int expected[YYNTOKEN];
    int nexpected = 0;
    for (int t = 1; t < YYNTOKEN; t++)
        if (yy_find_shift_action((YYCODETYPE)t, yypParser->yytos->stateno) != YY_ERROR_ACTION)
            expected[nexpected++] = t;
    /* The parser's stack, top first, for context ("in a function header", "after import"):
     * terminals as their TK_ code, nonterminals as -1. */
    int terms[64];
    int nterms = 0;
    for (yyStackEntry *e = yypParser->yytos; e > yypParser->yystack && nterms < 64; e--)
        terms[nterms++] = e->major < YYNTOKEN ? e->major : -1;
    parse_syntax_error(ctx, yymajor, &TOKEN, expected, nexpected, terms, nterms);
}

%stack_overflow {
    parse_stack_overflow(ctx);
}

/* Token order here fixes the TK_* codes (the lexer includes build/mbt.h). */
%token IMPORT AS MODEL FN PARAM RETURN FOR IN IF ELSE OPTIMIZER STATE TRAIN SERVE TRUE FALSE.
%token IDENT INT FLOAT STRING.
%token SEMI COMMA COLON ASSIGN PLUSEQ MINUSEQ STAREQ SLASHEQ TILDE ARROW DOT.
%token LPAREN RPAREN LBRACKET RBRACKET LBRACE RBRACE.

%left OR.
%left AND.
%right NOT.
%nonassoc EQ NE LT LE GT GE.
%nonassoc DOTDOT.
%left PLUS MINUS.
%left STAR SLASH PERCENT AT.
%right UMINUS.
%right CARET.

%type fparams {NodeList}
%type fplist {NodeList}
%type stmts {NodeList}
%type block {NodeList}
%type model_items {NodeList}
%type opt_items {NodeList}
%type state_list {NodeList}
%type settings {NodeList}
%type exprlist {NodeList}
%type args {NodeList}
%type arglist {NodeList}
%type indices {NodeList}
%type elems {NodeList}
%type key {Token}

/* ---- program and declarations ---------------------------------------------------------- */

program ::= decls.

decls ::= .
decls ::= decls SEMI.
decls ::= decls decl(D) SEMI.                      { parse_add_decl(ctx, D); }

decl(D) ::= IMPORT(K) IDENT(N).                    { D = parse_import(ctx, &K, &N, NULL); }
decl(D) ::= IMPORT(K) IDENT(N) AS IDENT(A).        { D = parse_import(ctx, &K, &N, &A); }

decl(D) ::= MODEL(K) IDENT(N) LPAREN fparams(P) RPAREN LBRACE model_items(B) RBRACE(E).
    { D = parse_decl(ctx, N_MODEL, &K, &N, &P, &B, &E); }
decl(D) ::= MODEL(K) IDENT(N) LBRACE model_items(B) RBRACE(E).
    { NodeList none = {0, 0}; D = parse_decl(ctx, N_MODEL, &K, &N, &none, &B, &E); }
decl(D) ::= fn_decl(F).                            { D = F; }
decl(D) ::= OPTIMIZER(K) IDENT(N) LPAREN fparams(P) RPAREN LBRACE opt_items(B) RBRACE(E).
    { D = parse_decl(ctx, N_OPTIMIZER, &K, &N, &P, &B, &E); }
decl(D) ::= TRAIN(K) IDENT(N) LBRACE settings(S) RBRACE(E).
    { NodeList none = {0, 0}; D = parse_decl(ctx, N_TRAIN, &K, &N, &S, &none, &E); }
decl(D) ::= SERVE(K) IDENT(N) LBRACE settings(S) RBRACE(E).
    { NodeList none = {0, 0}; D = parse_decl(ctx, N_SERVE, &K, &N, &S, &none, &E); }

fn_decl(D) ::= FN(K) IDENT(N) LPAREN fparams(P) RPAREN block(B) RBRACE(E).
    { D = parse_decl(ctx, N_FN, &K, &N, &P, &B, &E); }
fn_decl(D) ::= FN(K) IDENT(N) LPAREN fparams(P) RPAREN ARROW type(T) block(B) RBRACE(E).
    { D = parse_decl(ctx, N_FN, &K, &N, &P, &B, &E); D->type = T; }

fparams(L) ::= .                                   { L.v = 0; L.n = 0; }
fparams(L) ::= fplist(A).                          { L = A; }
fparams(L) ::= fplist(A) COMMA.                    { L = A; }
fplist(L) ::= fparam(P).                           { L.v = 0; L.n = 0; ast_push(ctx->ar, &L, P); }
fplist(L) ::= fplist(A) COMMA fparam(P).           { L = A; ast_push(ctx->ar, &L, P); }

fparam(P) ::= IDENT(N).                            { P = parse_fparam(ctx, &N, NULL, NULL); }
fparam(P) ::= IDENT(N) COLON type(T).              { P = parse_fparam(ctx, &N, T, NULL); }
fparam(P) ::= IDENT(N) ASSIGN expr(V).             { P = parse_fparam(ctx, &N, NULL, V); }
fparam(P) ::= IDENT(N) COLON type(T) ASSIGN expr(V). { P = parse_fparam(ctx, &N, T, V); }

type(T) ::= IDENT(N).                              { T = parse_type(ctx, &N, NULL, NULL, 0); }
type(T) ::= IDENT(N) LBRACKET RBRACKET(E).         { T = parse_type(ctx, &N, NULL, &E, 1); }
type(T) ::= IDENT(N) LBRACKET exprlist(D) RBRACKET(E). { T = parse_type(ctx, &N, &D, &E, 1); }

/* ---- bodies --------------------------------------------------------------------------- */

/* A block is '{' statements, without its '}' so rules can take the closing span. */
block(L) ::= LBRACE stmts(S).                      { L = S; }

stmts(L) ::= .                                     { L.v = 0; L.n = 0; }
stmts(L) ::= stmts(A) SEMI.                        { L = A; }
stmts(L) ::= stmts(A) stmt(S) SEMI.                { L = A; ast_push(ctx->ar, &L, S); }

model_items(L) ::= .                               { L.v = 0; L.n = 0; }
model_items(L) ::= model_items(A) SEMI.            { L = A; }
model_items(L) ::= model_items(A) stmt(S) SEMI.    { L = A; ast_push(ctx->ar, &L, S); }
model_items(L) ::= model_items(A) fn_decl(F) SEMI. { L = A; ast_push(ctx->ar, &L, F); }

opt_items(L) ::= .                                 { L.v = 0; L.n = 0; }
opt_items(L) ::= opt_items(A) SEMI.                { L = A; }
opt_items(L) ::= opt_items(A) STATE(K) state_list(S) SEMI.
    { L = A; ast_push(ctx->ar, &L, parse_state(ctx, &K, &S)); }
opt_items(L) ::= opt_items(A) fn_decl(F) SEMI.     { L = A; ast_push(ctx->ar, &L, F); }

state_list(L) ::= IDENT(N) ASSIGN expr(V).         { L.v = 0; L.n = 0; ast_push(ctx->ar, &L, parse_fparam(ctx, &N, NULL, V)); }
state_list(L) ::= state_list(A) COMMA IDENT(N) ASSIGN expr(V). { L = A; ast_push(ctx->ar, &L, parse_fparam(ctx, &N, NULL, V)); }

/* Settings of train/serve blocks: `key = value` or `key { ... }`, separated by newlines or ','. */
settings(L) ::= .                                  { L.v = 0; L.n = 0; }
settings(L) ::= settings(A) SEMI.                  { L = A; }
settings(L) ::= settings(A) setting(S) SEMI.       { L = A; ast_push(ctx->ar, &L, S); }
settings(L) ::= settings(A) setting(S) COMMA.      { L = A; ast_push(ctx->ar, &L, S); }

setting(S) ::= key(K) ASSIGN expr(V).              { S = parse_setting(ctx, &K, V); }
setting(S) ::= key(K) LBRACE settings(L) RBRACE(E). { S = parse_setting_block(ctx, &K, &L, &E); }
key(K) ::= IDENT(N).                               { K = N; }
key(K) ::= MODEL(N).                               { K = N; }
key(K) ::= OPTIMIZER(N).                           { K = N; }

/* ---- statements ----------------------------------------------------------------------- */

stmt(S) ::= exprlist(L) ASSIGN expr(V).            { S = parse_assign(ctx, &L, V); }
stmt(S) ::= exprlist(L) ASSIGN PARAM(K) type(T).   { S = parse_param_decl(ctx, &L, &K, T, NULL); }
stmt(S) ::= exprlist(L) ASSIGN PARAM(K) type(T) TILDE expr(I). { S = parse_param_decl(ctx, &L, &K, T, I); }
stmt(S) ::= expr(A) PLUSEQ expr(B).                { S = parse_aug(ctx, OP_ADD, A, B); }
stmt(S) ::= expr(A) MINUSEQ expr(B).               { S = parse_aug(ctx, OP_SUB, A, B); }
stmt(S) ::= expr(A) STAREQ expr(B).                { S = parse_aug(ctx, OP_MUL, A, B); }
stmt(S) ::= expr(A) SLASHEQ expr(B).               { S = parse_aug(ctx, OP_DIV, A, B); }
stmt(S) ::= exprlist(L).                           { S = parse_expr_stmt(ctx, &L); }
stmt(S) ::= RETURN(K).                             { S = parse_return(ctx, &K, NULL); }
stmt(S) ::= RETURN(K) expr(V).                     { S = parse_return(ctx, &K, V); }
stmt(S) ::= RETURN(K) expr(V) COMMA exprlist(L).   { S = parse_return(ctx, &K, parse_tuple_of(ctx, V, &L)); }
stmt(S) ::= FOR(K) IDENT(N) IN expr(I) block(B) RBRACE(E). { S = parse_for(ctx, &K, &N, I, &B, &E); }
stmt(S) ::= if_stmt(I).                            { S = I; }

if_stmt(S) ::= IF(K) expr(C) block(B) RBRACE(E).   { S = parse_if(ctx, &K, C, &B, NULL, &E); }
if_stmt(S) ::= IF(K) expr(C) block(B) RBRACE ELSE block(X) RBRACE(E). { S = parse_if(ctx, &K, C, &B, &X, &E); }
if_stmt(S) ::= IF(K) expr(C) block(B) RBRACE ELSE if_stmt(X).
    { NodeList el = {0, 0}; ast_push(ctx->ar, &el, X); S = parse_if(ctx, &K, C, &B, &el, NULL); S->span = span_join(S->span, X->span); }

/* ---- expressions ---------------------------------------------------------------------- */

exprlist(L) ::= expr(E).                           { L.v = 0; L.n = 0; ast_push(ctx->ar, &L, E); }
exprlist(L) ::= exprlist(A) COMMA expr(E).         { L = A; ast_push(ctx->ar, &L, E); }

expr(E) ::= postfix(P).                            { E = P; }
expr(E) ::= expr(A) OR expr(B).                    { E = parse_binary(ctx, OP_OR, A, B); }
expr(E) ::= expr(A) AND expr(B).                   { E = parse_binary(ctx, OP_AND, A, B); }
expr(E) ::= NOT(K) expr(A).                        { E = parse_unary(ctx, OP_NOT, &K, A); }
expr(E) ::= expr(A) EQ expr(B).                    { E = parse_binary(ctx, OP_EQ, A, B); }
expr(E) ::= expr(A) NE expr(B).                    { E = parse_binary(ctx, OP_NE, A, B); }
expr(E) ::= expr(A) LT expr(B).                    { E = parse_binary(ctx, OP_LT, A, B); }
expr(E) ::= expr(A) LE expr(B).                    { E = parse_binary(ctx, OP_LE, A, B); }
expr(E) ::= expr(A) GT expr(B).                    { E = parse_binary(ctx, OP_GT, A, B); }
expr(E) ::= expr(A) GE expr(B).                    { E = parse_binary(ctx, OP_GE, A, B); }
expr(E) ::= expr(A) DOTDOT expr(B).                { E = parse_range(ctx, A, B); }
expr(E) ::= expr(A) PLUS expr(B).                  { E = parse_binary(ctx, OP_ADD, A, B); }
expr(E) ::= expr(A) MINUS expr(B).                 { E = parse_binary(ctx, OP_SUB, A, B); }
expr(E) ::= expr(A) STAR expr(B).                  { E = parse_binary(ctx, OP_MUL, A, B); }
expr(E) ::= expr(A) SLASH expr(B).                 { E = parse_binary(ctx, OP_DIV, A, B); }
expr(E) ::= expr(A) PERCENT expr(B).               { E = parse_binary(ctx, OP_MOD, A, B); }
expr(E) ::= expr(A) AT expr(B).                    { E = parse_binary(ctx, OP_MATMUL, A, B); }
expr(E) ::= expr(A) CARET expr(B).                 { E = parse_binary(ctx, OP_POW, A, B); }
expr(E) ::= MINUS(K) expr(A). [UMINUS]             { E = parse_unary(ctx, OP_NEG, &K, A); }
expr(E) ::= PLUS(K) expr(A). [UMINUS]              { E = parse_unary(ctx, OP_POS, &K, A); }

postfix(E) ::= primary(P).                         { E = P; }
postfix(E) ::= postfix(F) LPAREN args(A) RPAREN(R). { E = parse_call(ctx, F, &A, &R); }
postfix(E) ::= postfix(B) LBRACKET indices(I) RBRACKET(R). { E = parse_index(ctx, B, &I, &R); }
postfix(E) ::= postfix(B) DOT IDENT(N).            { E = parse_attr(ctx, B, &N); }
postfix(E) ::= postfix(B) DOT INT(N).              { E = parse_attr(ctx, B, &N); }

primary(E) ::= IDENT(N).                           { E = parse_name(ctx, &N); }
primary(E) ::= MODEL(N).                           { E = parse_name(ctx, &N); }
primary(E) ::= INT(N).                             { E = parse_int(ctx, &N); }
primary(E) ::= FLOAT(N).                           { E = parse_float(ctx, &N); }
primary(E) ::= STRING(N).                          { E = parse_string(ctx, &N); }
primary(E) ::= TRUE(N).                            { E = parse_bool(ctx, &N, 1); }
primary(E) ::= FALSE(N).                           { E = parse_bool(ctx, &N, 0); }
primary(E) ::= LPAREN(L) expr(A) RPAREN(R).        { E = parse_paren(ctx, &L, A, &R); }
primary(E) ::= LPAREN(L) expr(A) COMMA elems(X) RPAREN(R). { E = parse_seq(ctx, N_TUPLE, &L, A, &X, &R); }
primary(E) ::= LBRACKET(L) RBRACKET(R).            { E = parse_seq(ctx, N_LIST, &L, NULL, NULL, &R); }
primary(E) ::= LBRACKET(L) expr(A) elems_tail(X) RBRACKET(R). { E = parse_seq(ctx, N_LIST, &L, A, X ? &X->list : NULL, &R); }
primary(E) ::= LBRACKET(L) expr(A) FOR IDENT(N) IN expr(I) RBRACKET(R). { E = parse_comp(ctx, &L, A, &N, I, &R); }

/* Tuple/list elements after the first, with an optional trailing comma. */
elems(L) ::= .                                     { L.v = 0; L.n = 0; }
elems(L) ::= exprlist(A).                          { L = A; }
elems(L) ::= exprlist(A) COMMA.                    { L = A; }
%type elems_tail {Node *}
elems_tail(X) ::= .                                { X = NULL; }
elems_tail(X) ::= COMMA elems(L).                  { X = parse_holder(ctx, &L); }

args(L) ::= .                                      { L.v = 0; L.n = 0; }
args(L) ::= arglist(A).                            { L = A; }
args(L) ::= arglist(A) COMMA.                      { L = A; }
arglist(L) ::= arg(X).                             { L.v = 0; L.n = 0; ast_push(ctx->ar, &L, X); }
arglist(L) ::= arglist(A) COMMA arg(X).            { L = A; ast_push(ctx->ar, &L, X); }
arg(X) ::= expr(E).                                { X = E; }
arg(X) ::= IDENT(N) ASSIGN expr(E).                { X = parse_kwarg(ctx, &N, E); }

indices(L) ::= index(X).                           { L.v = 0; L.n = 0; ast_push(ctx->ar, &L, X); }
indices(L) ::= indices(A) COMMA index(X).          { L = A; ast_push(ctx->ar, &L, X); }
index(X) ::= expr(E).                              { X = E; }
index(X) ::= COLON(C).                             { X = parse_slice(ctx, &C, NULL, NULL); }
index(X) ::= expr(A) COLON(C).                     { X = parse_slice(ctx, &C, A, NULL); }
index(X) ::= COLON(C) expr(B).                     { X = parse_slice(ctx, &C, NULL, B); }
index(X) ::= expr(A) COLON(C) expr(B).             { X = parse_slice(ctx, &C, A, B); }
