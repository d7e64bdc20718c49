/* dim.c - symbolic tensor dimensions (see dim.h).
 *
 * Pipeline position: below sema. Every compile-time integer and every tensor dimension that sema,
 * shape.c and builtins.c compute is a Dim made here.
 *
 * A Dim is a sum of terms; a term is a rational coefficient times a product of symbols with
 * non-zero integer exponents (negative ones come from division: `d/heads` is d*heads^-1). The
 * form is canonical - factors sorted by name, terms sorted by a fixed monomial order, equal
 * monomials merged, zero terms dropped - so two Dims are equal exactly when they are structurally
 * equal. Coefficients stay below 2^62 in magnitude so that no intermediate step of the checked
 * arithmetic below can overflow int64; anything larger makes the operation return NULL. */
#include "dim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

/* ---- representation ---- */

#define DIM_LIMIT ((int64_t)1 << 62) /* coefficients and denominators stay strictly below this */
#define DIM_MAX_EXP 4096             /* larger exponents count as overflow */
#define DIM_MAX_TERMS 256            /* a dimension with more terms than this is not a dimension */
#define DIM_MAX_PRODUCT 4096         /* term pairs tried by one multiplication before merging */
#define DIM_MAX_DIV_STEPS 512        /* polynomial long division gives up after this many steps */

typedef struct DimFactor {
    const char *sym; /* symbol name (not owned) */
    int exp;         /* never 0 */
} DimFactor;

typedef struct DimTerm {
    int64_t num, den; /* coefficient num/den: reduced, den > 0, num != 0 in a finished Dim */
    int nf;
    const DimFactor *f; /* sorted by name, names distinct */
} DimTerm;

struct Dim {
    int nt;
    const DimTerm *t; /* canonical order; nt == 0 is the dimension 0 */
};

/* ---- checked rational arithmetic ----
 * Inputs are always below DIM_LIMIT in magnitude, so sums never overflow int64 before the check. */

static int64_t i64_abs(int64_t x) { return x < 0 ? -x : x; }

static int64_t i64_gcd(int64_t a, int64_t b) {
    a = i64_abs(a);
    b = i64_abs(b);
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int i64_mul(int64_t a, int64_t b, int64_t *r) {
    if (a == 0 || b == 0) {
        *r = 0;
        return 1;
    }
    if (i64_abs(a) > (DIM_LIMIT - 1) / i64_abs(b)) return 0;
    *r = a * b;
    return 1;
}

static int i64_add(int64_t a, int64_t b, int64_t *r) {
    int64_t s = a + b;
    if (i64_abs(s) >= DIM_LIMIT) return 0;
    *r = s;
    return 1;
}

/* Reduces n/d (d != 0) to lowest terms with a positive denominator. */
static void rat_reduce(int64_t *n, int64_t *d) {
    int64_t g = i64_gcd(*n, *d);
    if (g > 1) {
        *n /= g;
        *d /= g;
    }
    if (*d < 0) {
        *n = -*n;
        *d = -*d;
    }
}

static int rat_add(int64_t an, int64_t ad, int64_t bn, int64_t bd, int64_t *rn, int64_t *rd) {
    int64_t g = i64_gcd(ad, bd), x, y, n, d;
    if (!i64_mul(an, bd / g, &x) || !i64_mul(bn, ad / g, &y) || !i64_add(x, y, &n) || !i64_mul(ad / g, bd, &d)) return 0;
    if (n == 0) d = 1;
    rat_reduce(&n, &d);
    *rn = n;
    *rd = d;
    return 1;
}

static int rat_mul(int64_t an, int64_t ad, int64_t bn, int64_t bd, int64_t *rn, int64_t *rd) {
    /* Cross-cancel first so that results which fit are never refused. */
    int64_t g1 = i64_gcd(an, bd), g2 = i64_gcd(bn, ad);
    if (g1 == 0) g1 = 1;
    if (g2 == 0) g2 = 1;
    int64_t n, d;
    if (!i64_mul(an / g1, bn / g2, &n) || !i64_mul(ad / g2, bd / g1, &d)) return 0;
    if (n == 0) d = 1;
    rat_reduce(&n, &d);
    *rn = n;
    *rd = d;
    return 1;
}

/* ---- terms ---- */

/* Monomial order: the constant term last; otherwise higher total degree first, then the
 * exponent vectors compared symbol by symbol in name order (larger exponent first). For
 * non-negative exponents this is graded lexicographic order, which long division needs. */
static int mono_cmp(const DimTerm *a, const DimTerm *b) {
    if (a->nf == 0 || b->nf == 0) return (a->nf == 0) - (b->nf == 0);
    long da = 0, db = 0;
    for (int i = 0; i < a->nf; i++) da += a->f[i].exp;
    for (int i = 0; i < b->nf; i++) db += b->f[i].exp;
    if (da != db) return da > db ? -1 : 1;
    int i = 0, j = 0;
    while (i < a->nf || j < b->nf) {
        int c = i >= a->nf ? 1 : j >= b->nf ? -1 : strcmp(a->f[i].sym, b->f[j].sym);
        int ea = c <= 0 ? a->f[i].exp : 0;
        int eb = c >= 0 ? b->f[j].exp : 0;
        if (ea != eb) return ea > eb ? -1 : 1;
        if (c <= 0) i++;
        if (c >= 0) j++;
    }
    return 0;
}

static int mono_cmp_qsort(const void *x, const void *y) { return mono_cmp(x, y); }

/* out = a * b (coefficients and factors); 0 on overflow. */
static int term_mul(Arena *ar, const DimTerm *a, const DimTerm *b, DimTerm *out) {
    if (!rat_mul(a->num, a->den, b->num, b->den, &out->num, &out->den)) return 0;
    DimFactor *f = arena_alloc(ar, sizeof(DimFactor) * (size_t)(a->nf + b->nf + 1));
    int n = 0, i = 0, j = 0;
    while (i < a->nf || j < b->nf) {
        int c = i >= a->nf ? 1 : j >= b->nf ? -1 : strcmp(a->f[i].sym, b->f[j].sym);
        DimFactor x;
        if (c < 0) x = a->f[i++];
        else if (c > 0) x = b->f[j++];
        else {
            x.sym = a->f[i].sym;
            x.exp = a->f[i++].exp + b->f[j++].exp;
        }
        if (x.exp > DIM_MAX_EXP || x.exp < -DIM_MAX_EXP) return 0;
        if (x.exp) f[n++] = x;
    }
    out->nf = n;
    out->f = f;
    return 1;
}

/* 1/t: reciprocal coefficient, negated exponents. t's coefficient must be non-zero. */
static DimTerm term_inv(Arena *ar, const DimTerm *t) {
    DimTerm r = {t->den, t->num, t->nf, NULL};
    rat_reduce(&r.num, &r.den);
    DimFactor *f = arena_alloc(ar, sizeof(DimFactor) * (size_t)(t->nf + 1));
    for (int i = 0; i < t->nf; i++) f[i] = (DimFactor){t->f[i].sym, -t->f[i].exp};
    r.f = f;
    return r;
}

/* ---- building canonical dims ---- */

typedef struct TermBuf {
    DimTerm *v;
    int n, cap;
} TermBuf;

static void tb_push(Arena *ar, TermBuf *tb, DimTerm t) {
    if (tb->n == tb->cap) {
        int cap = tb->cap ? tb->cap * 2 : 8;
        DimTerm *v = arena_alloc(ar, sizeof(DimTerm) * (size_t)cap);
        if (tb->n) memcpy(v, tb->v, sizeof(DimTerm) * (size_t)tb->n);
        tb->v = v;
        tb->cap = cap;
    }
    tb->v[tb->n++] = t;
}

/* Sorts, merges equal monomials and drops zero terms; NULL on overflow or too many terms. */
static const Dim *tb_finish(Arena *ar, TermBuf *tb) {
    if (tb->n > 1) qsort(tb->v, (size_t)tb->n, sizeof(DimTerm), mono_cmp_qsort);
    DimTerm *out = arena_alloc(ar, sizeof(DimTerm) * (size_t)(tb->n + 1));
    int n = 0;
    for (int i = 0; i < tb->n; i++) {
        if (n > 0 && mono_cmp(&out[n - 1], &tb->v[i]) == 0) {
            if (!rat_add(out[n - 1].num, out[n - 1].den, tb->v[i].num, tb->v[i].den, &out[n - 1].num, &out[n - 1].den))
                return NULL;
        } else {
            if (n > 0 && out[n - 1].num == 0) n--; /* the previous monomial cancelled out */
            out[n++] = tb->v[i];
        }
    }
    if (n > 0 && out[n - 1].num == 0) n--;
    if (n > DIM_MAX_TERMS) return NULL;
    Dim *d = arena_alloc(ar, sizeof(Dim));
    d->nt = n;
    d->t = out;
    return d;
}

static const Dim *dim_from_term(Arena *ar, DimTerm t) {
    TermBuf tb = {0};
    tb_push(ar, &tb, t);
    return tb_finish(ar, &tb);
}

/* a * t for a single term t. */
static const Dim *dim_mul_term(Arena *ar, const Dim *a, const DimTerm *t) {
    TermBuf tb = {0};
    for (int i = 0; i < a->nt; i++) {
        DimTerm r;
        if (!term_mul(ar, &a->t[i], t, &r)) return NULL;
        tb_push(ar, &tb, r);
    }
    return tb_finish(ar, &tb);
}

/* ---- constructors and arithmetic ---- */

const Dim *dim_int(Arena *ar, int64_t v) {
    if (v >= DIM_LIMIT || v <= -DIM_LIMIT) return NULL;
    if (v == 0) return arena_alloc(ar, sizeof(Dim));
    return dim_from_term(ar, (DimTerm){v, 1, 0, NULL});
}

const Dim *dim_sym(Arena *ar, const char *name) {
    if (!name || !*name) INTERNAL("dim_sym: empty symbol name");
    DimFactor *f = arena_alloc(ar, sizeof(DimFactor));
    f->sym = name;
    f->exp = 1;
    return dim_from_term(ar, (DimTerm){1, 1, 1, f});
}

const Dim *dim_add(Arena *ar, const Dim *a, const Dim *b) {
    if (!a || !b) return NULL;
    TermBuf tb = {0};
    for (int i = 0; i < a->nt; i++) tb_push(ar, &tb, a->t[i]);
    for (int i = 0; i < b->nt; i++) tb_push(ar, &tb, b->t[i]);
    return tb_finish(ar, &tb);
}

const Dim *dim_sub(Arena *ar, const Dim *a, const Dim *b) {
    if (!a || !b) return NULL;
    TermBuf tb = {0};
    for (int i = 0; i < a->nt; i++) tb_push(ar, &tb, a->t[i]);
    for (int i = 0; i < b->nt; i++) {
        DimTerm t = b->t[i];
        t.num = -t.num; /* |num| < 2^62, so negation is safe */
        tb_push(ar, &tb, t);
    }
    return tb_finish(ar, &tb);
}

const Dim *dim_mul(Arena *ar, const Dim *a, const Dim *b) {
    if (!a || !b) return NULL;
    if ((int64_t)a->nt * b->nt > DIM_MAX_PRODUCT) return NULL;
    TermBuf tb = {0};
    for (int i = 0; i < a->nt; i++)
        for (int j = 0; j < b->nt; j++) {
            DimTerm r;
            if (!term_mul(ar, &a->t[i], &b->t[j], &r)) return NULL;
            tb_push(ar, &tb, r);
        }
    return tb_finish(ar, &tb);
}

const Dim *dim_pow(Arena *ar, const Dim *a, int64_t e) {
    if (!a || e < 0) return NULL;
    const Dim *r = dim_int(ar, 1), *base = a;
    /* Square and multiply: 1^huge and 0^huge stay cheap; symbols overflow DIM_MAX_EXP early. */
    while (e > 0 && r) {
        if (e & 1) r = dim_mul(ar, r, base);
        e >>= 1;
        if (e > 0) {
            base = dim_mul(ar, base, base);
            if (!base) return NULL;
        }
    }
    return r;
}

/* ---- division ---- */

/* The monomial made of each symbol's smallest exponent over all terms of a (a symbol missing
 * from a term counts as exponent 0). Dividing by it leaves a polynomial with no negative
 * exponents and no monomial factor. */
static DimTerm dim_min_mono(Arena *ar, const Dim *a) {
    int cap = 0;
    for (int i = 0; i < a->nt; i++) cap += a->t[i].nf;
    DimFactor *f = arena_alloc(ar, sizeof(DimFactor) * (size_t)(cap + 1));
    int n = 0;
    for (int i = 0; i < a->nt; i++)
        for (int k = 0; k < a->t[i].nf; k++) {
            const char *s = a->t[i].f[k].sym;
            int seen = 0;
            for (int m = 0; m < n; m++) seen |= strcmp(f[m].sym, s) == 0;
            if (seen) continue;
            int lo = 0;
            for (int j = 0; j < a->nt; j++) {
                int e = 0;
                for (int q = 0; q < a->t[j].nf; q++)
                    if (strcmp(a->t[j].f[q].sym, s) == 0) e = a->t[j].f[q].exp;
                if (j == 0 || e < lo) lo = e;
            }
            if (lo) f[n++] = (DimFactor){s, lo};
        }
    /* keep factors sorted by name, as every term's factors are */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(f[j - 1].sym, f[j].sym) > 0; j--) {
            DimFactor t = f[j];
            f[j] = f[j - 1];
            f[j - 1] = t;
        }
    return (DimTerm){1, 1, n, f};
}

/* 1 if monomial d divides monomial r with non-negative exponents left over. */
static int mono_divides(const DimTerm *d, const DimTerm *r) {
    for (int i = 0; i < d->nf; i++) {
        int e = 0;
        for (int j = 0; j < r->nf; j++)
            if (strcmp(r->f[j].sym, d->f[i].sym) == 0) e = r->f[j].exp;
        if (e < d->f[i].exp) return 0;
    }
    return 1;
}

/* a / b for a divisor of several terms: exact polynomial long division after clearing monomial
 * factors (monomials are units here, so that loses nothing). NULL when b does not divide a. */
static const Dim *dim_div_poly(Arena *ar, const Dim *a, const Dim *b) {
    DimTerm ma = dim_min_mono(ar, a), mb = dim_min_mono(ar, b);
    DimTerm ima = term_inv(ar, &ma), imb = term_inv(ar, &mb);
    const Dim *r = dim_mul_term(ar, a, &ima), *bb = dim_mul_term(ar, b, &imb);
    if (!r || !bb || bb->nt == 0) return NULL;
    const DimTerm *lead = &bb->t[0];
    DimTerm ilead = term_inv(ar, lead);
    TermBuf q = {0};
    for (int step = 0; r->nt > 0; step++) {
        if (step >= DIM_MAX_DIV_STEPS || !mono_divides(lead, &r->t[0])) return NULL;
        DimTerm qt;
        if (!term_mul(ar, &r->t[0], &ilead, &qt)) return NULL;
        tb_push(ar, &q, qt);
        const Dim *sub = dim_mul_term(ar, bb, &qt);
        r = sub ? dim_sub(ar, r, sub) : NULL;
        if (!r) return NULL;
    }
    const Dim *quot = tb_finish(ar, &q);
    DimTerm scale;
    if (!quot || !term_mul(ar, &ma, &imb, &scale)) return NULL;
    return dim_mul_term(ar, quot, &scale);
}

/* a / b with no integrality requirement (constants may give fractions); NULL when b is 0, when
 * the quotient is not a Laurent polynomial, or on overflow. */
static const Dim *dim_div_rational(Arena *ar, const Dim *a, const Dim *b) {
    if (!a || !b || b->nt == 0) return NULL;
    if (b->nt == 1) {
        DimTerm inv = term_inv(ar, &b->t[0]);
        return dim_mul_term(ar, a, &inv);
    }
    return dim_div_poly(ar, a, b);
}

const Dim *dim_div(Arena *ar, const Dim *a, const Dim *b, int *exact) {
    int ex_dummy;
    if (!exact) exact = &ex_dummy;
    *exact = 1;
    if (!a || !b) return NULL;
    if (b->nt == 0) {
        *exact = 0;
        return NULL;
    }
    int64_t an, ad, bn, bd;
    if (dim_rational(a, &an, &ad) && dim_rational(b, &bn, &bd)) {
        int64_t qn, qd;
        /* bn/bd inverted is bd/bn: rat_mul reduces and fixes the sign */
        if (!rat_mul(an, ad, bd, bn, &qn, &qd)) return NULL;
        if (qd != 1) {
            *exact = 0;
            return NULL;
        }
        return dim_int(ar, qn);
    }
    if (b->nt == 1) return dim_div_rational(ar, a, b);
    /* A sum as divisor: fine when it divides a (T*T-T over T-1); otherwise the quotient is not a
     * polynomial and there is no Dim for it. */
    const Dim *q = dim_div_poly(ar, a, b);
    if (!q) *exact = 0;
    return q;
}

/* ---- queries ---- */

static int term_eq(const DimTerm *a, const DimTerm *b) {
    if (a->num != b->num || a->den != b->den || a->nf != b->nf) return 0;
    for (int i = 0; i < a->nf; i++)
        if (a->f[i].exp != b->f[i].exp || strcmp(a->f[i].sym, b->f[i].sym) != 0) return 0;
    return 1;
}

int dim_eq(const Dim *a, const Dim *b) {
    if (!a || !b) return a == b;
    if (a->nt != b->nt) return 0;
    for (int i = 0; i < a->nt; i++)
        if (!term_eq(&a->t[i], &b->t[i])) return 0;
    return 1;
}

int dim_rational(const Dim *a, int64_t *num, int64_t *den) {
    if (!a) return 0;
    if (a->nt == 0) {
        *num = 0;
        *den = 1;
        return 1;
    }
    if (a->nt != 1 || a->t[0].nf != 0) return 0;
    *num = a->t[0].num;
    *den = a->t[0].den;
    return 1;
}

int dim_const(const Dim *a, int64_t *out) {
    int64_t n, d;
    if (!dim_rational(a, &n, &d) || d != 1) return 0;
    *out = n;
    return 1;
}

int dim_is_integral(const Dim *a) {
    if (!a) return 0;
    for (int i = 0; i < a->nt; i++) {
        if (a->t[i].den != 1) return 0;
        for (int k = 0; k < a->t[i].nf; k++)
            if (a->t[i].f[k].exp < 0) return 0;
    }
    return 1;
}

int dim_is_sym(const Dim *a, const char **name) {
    if (!a || a->nt != 1) return 0;
    const DimTerm *t = &a->t[0];
    if (t->num != 1 || t->den != 1 || t->nf != 1 || t->f[0].exp != 1) return 0;
    if (name) *name = t->f[0].sym;
    return 1;
}

int dim_has_sym(const Dim *a, const char *name) {
    if (!a) return 0;
    for (int i = 0; i < a->nt; i++)
        for (int k = 0; k < a->t[i].nf; k++)
            if (strcmp(a->t[i].f[k].sym, name) == 0) return 1;
    return 0;
}

/* ---- substitution ---- */

const Dim *dim_subst(Arena *ar, const Dim *a, const char *sym, const Dim *val) {
    if (!a || !val) return NULL;
    if (!dim_has_sym(a, sym)) return a;
    const Dim *sum = dim_int(ar, 0);
    for (int i = 0; i < a->nt && sum; i++) {
        const DimTerm *t = &a->t[i];
        DimTerm rest = {t->num, t->den, 0, NULL};
        DimFactor *f = arena_alloc(ar, sizeof(DimFactor) * (size_t)(t->nf + 1));
        int e = 0;
        for (int k = 0; k < t->nf; k++) {
            if (strcmp(t->f[k].sym, sym) == 0) e = t->f[k].exp;
            else f[rest.nf++] = t->f[k];
        }
        rest.f = f;
        const Dim *part = dim_from_term(ar, rest);
        if (e > 0) part = dim_mul(ar, part, dim_pow(ar, val, e));
        else if (e < 0) part = dim_div_rational(ar, part, dim_pow(ar, val, -(int64_t)e));
        /* part is NULL on overflow, on a zero divisor, or when val^-e does not divide it */
        sum = part ? dim_add(ar, sum, part) : NULL;
    }
    return sum;
}

/* ---- printing ---- */

typedef struct DimBuf {
    Arena *ar;
    char *p;
    size_t n, cap;
} DimBuf;

static void db_puts(DimBuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 32;
        while (cap < b->n + k + 1) cap *= 2;
        char *p = arena_alloc(b->ar, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

static void db_factor(DimBuf *b, const DimFactor *f, int e) {
    db_puts(b, f->sym);
    if (e != 1) {
        char tmp[24];
        snprintf(tmp, sizeof tmp, "^%d", e);
        db_puts(b, tmp);
    }
}

/* One term's magnitude: numerator factors then the coefficient (`d*4`), then `/` and the
 * denominator, parenthesised when it is a product (`d/(heads*2)`). */
static void db_term(DimBuf *b, const DimTerm *t) {
    char tmp[32];
    int top = 0, bottom = 0;
    for (int i = 0; i < t->nf; i++) {
        if (t->f[i].exp > 0) {
            if (top++) db_puts(b, "*");
            db_factor(b, &t->f[i], t->f[i].exp);
        } else {
            bottom++;
        }
    }
    int64_t num = i64_abs(t->num);
    if (num != 1 || top == 0) {
        snprintf(tmp, sizeof tmp, "%s%" PRId64, top ? "*" : "", num);
        db_puts(b, tmp);
    }
    if (t->den != 1) bottom++;
    if (!bottom) return;
    db_puts(b, bottom > 1 ? "/(" : "/");
    int k = 0;
    for (int i = 0; i < t->nf; i++)
        if (t->f[i].exp < 0) {
            if (k++) db_puts(b, "*");
            db_factor(b, &t->f[i], -t->f[i].exp);
        }
    if (t->den != 1) {
        snprintf(tmp, sizeof tmp, "%s%" PRId64, k ? "*" : "", t->den);
        db_puts(b, tmp);
    }
    if (bottom > 1) db_puts(b, ")");
}

char *dim_str(Arena *ar, const Dim *a) {
    if (!a) return arena_strndup(ar, "?", 1);
    if (a->nt == 0) return arena_strndup(ar, "0", 1);
    DimBuf b = {ar, NULL, 0, 0};
    for (int i = 0; i < a->nt; i++) {
        if (a->t[i].num < 0) db_puts(&b, "-");
        else if (i > 0) db_puts(&b, "+");
        db_term(&b, &a->t[i]);
    }
    return b.p;
}
