/* parse.h - the front end's entry points: source text -> tokens (compiler/front/lexer.re) -> AST
 * (compiler/front/mbt.y). Syntax errors are reported through diag; the parser recovers at the next
 * declaration so one run reports the errors of several declarations. */
#ifndef MBT_PARSE_H
#define MBT_PARSE_H

#include <stdio.h>

#include "arena.h"
#include "ast.h"

/* Parses registered source `file` into an N_PROGRAM (never NULL; on errors it holds what parsed). */
Node *parse_source(Arena *ar, uint32_t file);
/* --emit=tokens: one line per token: `line:col KIND 'text'`. */
void parse_dump_tokens(FILE *out, uint32_t file);

#endif
