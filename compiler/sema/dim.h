/* dim.h - symbolic tensor dimensions.
 *
 * A dimension is a canonical polynomial with rational coefficients over named symbols, where a
 * symbol may carry a negative exponent: `768`, `B`, `d*4`, `d/heads`, `T-1`, `heads*(d/heads)`
 * (which is just `d`). Canonical means two dimensions are equal exactly when dim_eq says so, so
 * shape checking is polynomial identity. Upper-case symbols (B, T) are bound at calls; lower-case
 * ones are model constants that stay symbolic when a model is checked on its own and become
 * numbers when it is instantiated by a train/serve block (dim_subst).
 *
 * Dims are immutable and arena-allocated; every operation returns a new one or NULL when the
 * result would overflow 62 bits. */
#ifndef MBT_DIM_H
#define MBT_DIM_H

#include <stdint.h>

#include "arena.h"

typedef struct Dim Dim;

const Dim *dim_int(Arena *ar, int64_t v);                  /* a known integer */
const Dim *dim_sym(Arena *ar, const char *name);           /* a symbol (name must outlive the dim) */
const Dim *dim_add(Arena *ar, const Dim *a, const Dim *b); /* a + b; NULL on overflow */
const Dim *dim_sub(Arena *ar, const Dim *a, const Dim *b); /* a - b; NULL on overflow */
const Dim *dim_mul(Arena *ar, const Dim *a, const Dim *b); /* a * b; NULL on overflow */
/* a / b. *exact is set to 0 when both are known and b does not divide a (or b is 0) - the
 * result is then NULL; symbolic quotients are exact by construction (d/heads). */
const Dim *dim_div(Arena *ar, const Dim *a, const Dim *b, int *exact);
int dim_eq(const Dim *a, const Dim *b);                                         /* polynomial identity */
int dim_const(const Dim *a, int64_t *out);                                      /* 1 and *out if a is a known integer */
int dim_is_sym(const Dim *a, const char **name);                                /* 1 if a is exactly one bare symbol */
int dim_has_sym(const Dim *a, const char *name);                                /* 1 if the symbol occurs in a */
const Dim *dim_subst(Arena *ar, const Dim *a, const char *sym, const Dim *val); /* replace sym by val */
char *dim_str(Arena *ar, const Dim *a);                                         /* "B", "768", "d*4", "d/heads", "T-1" */
int dim_rational(const Dim *a, int64_t *num, int64_t *den); /* 1 if a has no symbols: value num/den (den > 1: not an integer) */
const Dim *dim_pow(Arena *ar, const Dim *a, int64_t e);     /* a^e for e >= 0; NULL on overflow or e < 0 */
int dim_is_integral(const Dim *a); /* 1 if whole for all integer symbols: integer coefficients, no division */

#endif
