/* lexer.h - the re2c lexer's interface (compiler/front/lexer.re).
 *
 * Tokens carry the lemon grammar's own codes (TK_* from build/mbt.h) and a Span into the source:
 * no copying. Newlines become TK_SEMI where a statement can end (see docs/language.md, "Lexical
 * structure"), and a TK_SEMI is inserted before every '}' that does not already follow one.
 * Lexical errors (bad characters, NUL bytes, invalid UTF-8, unterminated strings, oversized
 * literals) are reported through diag and the offending bytes skipped. */
#ifndef MBT_LEXER_H
#define MBT_LEXER_H

#include <stdint.h>

#include "diag.h"

#define LEX_MAX_IDENT 1024  /* longest identifier accepted, in bytes */
#define LEX_MAX_NESTING 256 /* deepest nesting of ( and [ accepted */

typedef struct Token {
    int code;  /* TK_* ; 0 at end of input */
    Span span; /* the token's bytes (an inserted TK_SEMI has len 0) */
} Token;

typedef struct Lexer {
    uint32_t file;            /* diag source id */
    const unsigned char *src; /* source text; src[len] must be 0 (sentinel) */
    uint32_t len;
    const unsigned char *cur; /* next byte to read */
    const unsigned char *line_start;
    uint32_t line;
    int depth;                       /* open ( and [ */
    Span open[LEX_MAX_NESTING + 1];  /* where each open ( or [ is */
    int braces;                      /* open { */
    Span brace[LEX_MAX_NESTING + 1]; /* where each open { is */
    int errors;                      /* lexical errors reported */
    uint32_t last_error_off;         /* where the latest one was */
    int last;                        /* code of the last token returned */
    int pending;                     /* a token held back while an inserted TK_SEMI is returned */
    Token held;
    int too_deep; /* nesting limit hit: the rest of the file is skipped */
} Lexer;

void lex_init(Lexer *lx, uint32_t file); /* the source must be registered with diag */
Token lex_next(Lexer *lx);               /* next token; code 0 at end */
const char *lex_token_desc(int code);    /* "')'", "identifier", "end of file" ... */

#endif
