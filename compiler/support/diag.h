/* diag.h - the diagnostic sink: the compiler's only global mutable state.
 *
 * Every source file the compiler reads is registered here, so a Span (file id + byte range)
 * can be printed as `path:line:col`, followed by the source line and a caret/underline.
 *
 * Output format (stderr), one diagnostic:
 *
 *     path:3:14: error: shape mismatch: f32[B, T, 768] + f32[B, T, 512]
 *         3 |     x = a + b
 *           |         ^~~~~
 *     path:2:5: note: 'b' has shape f32[B, T, 512] from here
 *         2 |     b = h(x)
 *           |     ^~~~~~~~
 *       hint: make the last dimensions agree
 *
 * At most DIAG_MAX_ERRORS errors are printed; the rest are counted and summarised at the end.
 * User errors make mbtc exit 1; diag_internal() reports a compiler bug and exits 2. */
#ifndef MBT_DIAG_H
#define MBT_DIAG_H

#include <stdint.h>

#include "arena.h"

#define DIAG_MAX_ERRORS 20

/* A byte range in a registered source file. file == 0 means "no location". */
typedef struct Span {
    uint32_t file; /* id from diag_add_source; 0 = none */
    uint32_t off;  /* byte offset of the first byte */
    uint32_t len;  /* length in bytes (0 = a point) */
    uint32_t line; /* 1-based line of the first byte */
    uint32_t col;  /* 1-based column (in bytes) of the first byte */
} Span;

static inline Span span_none(void) { return (Span){0, 0, 0, 0, 0}; }
Span span_join(Span a, Span b); /* smallest span covering a and b (same file) */

uint32_t diag_add_source(const char *path, const char *text, uint32_t len); /* register; returns id >= 1 */
const char *diag_source_path(uint32_t file);                                /* the path a file was registered with */
const char *diag_source_text(uint32_t file, uint32_t *len);                 /* its bytes */
/* The source text of a span for a message, in ar: whitespace runs (a call spread over lines) as
 * one space, cut after 60 bytes with "..."; "?" for no location. */
char *diag_span_text(Arena *ar, Span at);

void diag_error(Span at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));   /* a user error */
void diag_warning(Span at, const char *fmt, ...) __attribute__((format(printf, 2, 3))); /* a warning */
void diag_note(Span at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));    /* attach to last error */
void diag_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));             /* attach to last error */
void diag_error_noloc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));      /* `mbtc: error: ...` */

int diag_error_count(void);  /* errors reported so far (including those not printed) */
int diag_finish(void);       /* print the "N more errors" summary; returns 1 if any error, else 0 */
void diag_set_color(int on); /* colour output (default: off) */

/* A compiler bug: prints `internal error at FILE:LINE: ...` and exits with status 2. */
_Noreturn void diag_internal(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define INTERNAL(...) diag_internal(__FILE__, __LINE__, __VA_ARGS__)

/* Edit distance for "did you mean" suggestions (bounded; returns > limit when farther). */
int diag_edit_distance(const char *a, uint32_t alen, const char *b, uint32_t blen, int limit);

#endif
