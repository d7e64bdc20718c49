/* test_dim.c - unit tests of compiler/dim.c: canonical forms, equality, printing, substitution,
 * division and overflow of symbolic dimensions.
 *
 * Build: cc -std=c11 -Icompiler tests/unit/test_dim.c compiler/dim.c compiler/arena.c compiler/diag.c
 * Prints `PASS name` or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure. */
#include <stdio.h>
#include <string.h>

#include "dim.h"

/* ---- harness ---- */

static int passed, failed;

static void check(const char *name, int ok, const char *why) {
    if (ok) {
        passed++;
        printf("PASS %s\n", name);
    } else {
        failed++;
        printf("FAIL %s: %s\n", name, why);
    }
}

/* Checks that d prints as want. */
static void check_str(Arena *ar, const char *name, const Dim *d, const char *want) {
    const char *got = dim_str(ar, d);
    char why[256];
    snprintf(why, sizeof why, "got '%s', want '%s'", got, want);
    check(name, strcmp(got, want) == 0, why);
}

/* ---- a parser for printed dims, to check that dim_str reads back as the same dim ---- */

static const char *pp;
static Arena *par;
static const Dim *parse_sum(void);
static const Dim *parse_atom(void) {
    if (*pp == '(') {
        pp++;
        const Dim *d = parse_sum();
        if (*pp == ')') pp++;
        return d;
    }
    if (*pp >= '0' && *pp <= '9') {
        int64_t v = 0;
        while (*pp >= '0' && *pp <= '9') v = v * 10 + (*pp++ - '0');
        return dim_int(par, v);
    }
    const char *s = pp;
    while ((*pp >= 'a' && *pp <= 'z') || (*pp >= 'A' && *pp <= 'Z') || *pp == '_') pp++;
    if (pp == s) return NULL;
    /* Symbols must outlive the dim; interned by first letter is enough for a, b, c, B, T. */
    static const char *const names[] = {"a", "b", "c", "B", "T"};
    for (int i = 0; i < 5; i++)
        if ((size_t)(pp - s) == strlen(names[i]) && strncmp(s, names[i], (size_t)(pp - s)) == 0) return dim_sym(par, names[i]);
    return NULL;
}
static const Dim *parse_pow(void) {
    const Dim *d = parse_atom();
    if (*pp == '^') {
        pp++;
        int64_t e = 0;
        while (*pp >= '0' && *pp <= '9') e = e * 10 + (*pp++ - '0');
        d = dim_pow(par, d, e);
    }
    return d;
}
static const Dim *parse_prod(void) {
    const Dim *d = parse_pow();
    for (;;) {
        int exact;
        if (*pp == '*') pp++, d = dim_mul(par, d, parse_pow());
        else if (*pp == '/') {
            pp++;
            const Dim *q = parse_pow();
            int64_t n, den;
            /* the printer writes fractions like 3/2: keep them exact */
            if (dim_rational(d, &n, &den) && dim_rational(q, &n, &den)) {
                const Dim *sym = dim_sym(par, "a");
                d = dim_div(par, dim_mul(par, d, sym), dim_mul(par, q, sym), &exact);
                d = dim_subst(par, d, "a", dim_int(par, 1));
            } else {
                d = dim_div(par, d, q, &exact);
            }
        } else return d;
    }
}
static const Dim *parse_sum(void) {
    const Dim *d;
    if (*pp == '-') pp++, d = dim_sub(par, dim_int(par, 0), parse_prod());
    else d = parse_prod();
    for (;;) {
        if (*pp == '+') pp++, d = dim_add(par, d, parse_prod());
        else if (*pp == '-') pp++, d = dim_sub(par, d, parse_prod());
        else return d;
    }
}
static const Dim *parse_dim(Arena *ar, const char *s) {
    par = ar;
    pp = s;
    const Dim *d = parse_sum();
    return *pp ? NULL : d;
}

/* A small deterministic generator, so the property cases are the same on every run. */
static uint64_t rng_state = 88172645463325252ull;
static unsigned rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 32);
}

/* A random dim over a, b, c: sums of small monomials, some with negative powers. */
static const Dim *random_dim(Arena *ar, int depth) {
    static const char *const names[] = {"a", "b", "c"};
    int exact;
    switch (depth > 2 ? rng() % 2 : rng() % 6) {
    case 0: return dim_int(ar, (int64_t)(rng() % 9) - 4);
    case 1: return dim_sym(ar, names[rng() % 3]);
    case 2: return dim_add(ar, random_dim(ar, depth + 1), random_dim(ar, depth + 1));
    case 3: return dim_sub(ar, random_dim(ar, depth + 1), random_dim(ar, depth + 1));
    case 4: return dim_mul(ar, random_dim(ar, depth + 1), random_dim(ar, depth + 1));
    default: {
        /* divide by a monomial such as 2*b or c */
        const Dim *m = dim_mul(ar, dim_int(ar, 1 + (int64_t)(rng() % 3)), dim_sym(ar, names[rng() % 3]));
        return dim_div(ar, random_dim(ar, depth + 1), m, &exact);
    }
    }
}

/* x at a = 2, b = 3, c = 5 as a rational, or 0 when it fails. */
static int eval_dim(Arena *ar, const Dim *x, int64_t *n, int64_t *d) {
    x = dim_subst(ar, x, "a", dim_int(ar, 2));
    x = dim_subst(ar, x, "b", dim_int(ar, 3));
    x = dim_subst(ar, x, "c", dim_int(ar, 5));
    return dim_rational(x, n, d);
}

static void property_cases(Arena *ar) {
    int roundtrip = 1, addsub = 1, commute = 1, divmul = 1, evalmul = 1, polydiv = 1;
    char why[512] = "";
    for (int i = 0; i < 2000; i++) {
        const Dim *x = random_dim(ar, 0), *y = random_dim(ar, 0);
        if (!x || !y) continue;
        const char *xs = dim_str(ar, x);
        const Dim *back = parse_dim(ar, xs);
        if (roundtrip && !dim_eq(back, x)) {
            roundtrip = 0;
            snprintf(why, sizeof why, "'%s' reads back as '%s'", xs, dim_str(ar, back));
        }
        if (!dim_eq(dim_sub(ar, dim_add(ar, x, y), y), x)) addsub = 0;
        if (!dim_eq(dim_mul(ar, x, y), dim_mul(ar, y, x))) commute = 0;
        int exact;
        const Dim *xy = dim_mul(ar, x, y);
        int64_t yn, yd;
        if (xy && !(dim_rational(y, &yn, &yd) && yn == 0)) {
            /* (x*y)/y == x, also when y is a sum (exact polynomial division) */
            const Dim *q = dim_div(ar, xy, y, &exact);
            int both_known = dim_rational(x, &yn, &yd) && dim_rational(y, &yn, &yd);
            if (!both_known && !dim_eq(q, x)) {
                if (y && dim_str(ar, y) && strchr(dim_str(ar, y), '+')) polydiv = 0;
                else divmul = 0;
                if (!why[0])
                    snprintf(why, sizeof why, "(%s)*(%s) / (%s) gave %s", xs, dim_str(ar, y), dim_str(ar, y), dim_str(ar, q));
            }
            int64_t n1, d1, n2, d2, n3, d3;
            if (eval_dim(ar, x, &n1, &d1) && eval_dim(ar, y, &n2, &d2) && eval_dim(ar, xy, &n3, &d3)) {
                /* (n1/d1)*(n2/d2) == n3/d3, compared in long double to stay clear of overflow */
                long double l = (long double)n1 * n2 * d3, r = (long double)n3 * d1 * d2;
                if (l != r) evalmul = 0;
            }
        }
    }
    check("prop_str_roundtrip", roundtrip, why);
    check("prop_add_sub", addsub, "(x+y)-y != x");
    check("prop_mul_commutes", commute, "x*y != y*x");
    check("prop_div_monomial", divmul, why);
    check("prop_div_poly", polydiv, why);
    check("prop_subst_homomorphic", evalmul, "subst(x*y) != subst(x)*subst(y)");
}

/* ---- cases ---- */

int main(void) {
    Arena ar = {0};
    Arena *a = &ar;
    const Dim *d = dim_sym(a, "d"), *heads = dim_sym(a, "heads"), *T = dim_sym(a, "T"), *B = dim_sym(a, "B");
    const Dim *one = dim_int(a, 1), *two = dim_int(a, 2), *four = dim_int(a, 4), *zero = dim_int(a, 0);
    int exact;

    /* canonical forms and equality */
    check("mul_commutes", dim_eq(dim_mul(a, d, four), dim_mul(a, four, d)), "d*4 != 4*d");
    const Dim *hd = dim_div(a, d, heads, &exact);
    check("div_symbolic_exact", hd && exact, "d/heads not exact");
    check("heads_times_d_over_heads", dim_eq(dim_mul(a, heads, hd), d), "heads*(d/heads) != d");
    check("d_over_heads_ne_d", !dim_eq(hd, d), "d/heads == d");
    check("t_minus_1_plus_1", dim_eq(dim_add(a, dim_sub(a, T, one), one), T), "T-1+1 != T");
    check("add_commutes", dim_eq(dim_add(a, B, T), dim_add(a, T, B)), "B+T != T+B");
    check("distributes", dim_eq(dim_mul(a, dim_add(a, T, one), two), dim_add(a, dim_add(a, T, T), two)), "(T+1)*2 != T+T+2");
    check("sub_self_zero", dim_eq(dim_sub(a, dim_mul(a, B, T), dim_mul(a, T, B)), zero), "B*T-T*B != 0");
    check("d_ne_768", !dim_eq(d, dim_int(a, 768)), "d == 768");
    check("const_eq", dim_eq(dim_mul(a, dim_int(a, 32), dim_int(a, 24)), dim_int(a, 768)), "32*24 != 768");
    check("mul_assoc", dim_eq(dim_mul(a, dim_mul(a, B, T), d), dim_mul(a, B, dim_mul(a, T, d))), "(B*T)*d != B*(T*d)");
    check("expand_square",
          dim_eq(dim_mul(a, dim_add(a, T, one), dim_add(a, T, one)),
                 dim_add(a, dim_add(a, dim_mul(a, T, T), dim_mul(a, two, T)), one)),
          "(T+1)^2 != T^2+2T+1");
    check("same_name_other_pointer", dim_eq(dim_sym(a, "d"), dim_sym(a, (char[]){'d', 0})), "symbols compare by name");

    /* queries */
    int64_t v = 0;
    check("const_known", dim_const(dim_int(a, 768), &v) && v == 768, "768 not known");
    check("const_symbolic", !dim_const(d, &v), "d known");
    check("const_zero", dim_const(zero, &v) && v == 0, "0 not known");
    check("const_after_cancel", dim_const(dim_sub(a, dim_add(a, T, dim_int(a, 5)), T), &v) && v == 5, "T+5-T != 5");
    const char *nm = NULL;
    check("is_sym", dim_is_sym(T, &nm) && strcmp(nm, "T") == 0, "T not a bare symbol");
    check("is_sym_not_product", !dim_is_sym(dim_mul(a, T, two), &nm), "T*2 is a bare symbol");
    check("is_sym_from_cancel", dim_is_sym(dim_mul(a, heads, hd), &nm) && strcmp(nm, "d") == 0, "heads*(d/heads)");
    check("has_sym", dim_has_sym(hd, "heads") && dim_has_sym(hd, "d") && !dim_has_sym(hd, "T"), "has_sym d/heads");
    int64_t n, den;
    check("rational_half", dim_rational(dim_div(a, d, two, &exact), &n, &den) == 0, "d/2 is rational");
    check("integral_poly", dim_is_integral(dim_add(a, dim_mul(a, T, four), one)), "4*T+1 not integral");
    check("integral_not_div", !dim_is_integral(hd), "d/heads integral");

    /* printing */
    check_str(a, "str_sym", B, "B");
    check_str(a, "str_int", dim_int(a, 768), "768");
    check_str(a, "str_zero", zero, "0");
    check_str(a, "str_negative", dim_int(a, -3), "-3");
    check_str(a, "str_mul", dim_mul(a, four, d), "d*4");
    check_str(a, "str_div", hd, "d/heads");
    check_str(a, "str_t_minus_1", dim_sub(a, T, one), "T-1");
    check_str(a, "str_t_plus_1", dim_add(a, one, T), "T+1");
    check_str(a, "str_product", dim_mul(a, dim_mul(a, T, d), B), "B*T*d");
    check_str(a, "str_square", dim_mul(a, T, T), "T^2");
    check_str(a, "str_poly", dim_add(a, dim_mul(a, dim_add(a, T, one), dim_add(a, T, one)), zero), "T^2+T*2+1");
    check_str(a, "str_half", dim_div(a, d, two, &exact), "d/2");
    check_str(a, "str_three_halves_d", dim_div(a, dim_mul(a, d, dim_int(a, 3)), two, &exact), "d*3/2");
    check_str(a, "str_denominator_product", dim_div(a, d, dim_mul(a, heads, two), &exact), "d/(heads*2)");
    check_str(a, "str_inverse", dim_div(a, one, heads, &exact), "1/heads");
    check_str(a, "str_neg_term", dim_sub(a, one, T), "-T+1");
    check_str(a, "str_neg_div", dim_sub(a, zero, hd), "-d/heads");
    check_str(a, "str_mixed", dim_add(a, dim_mul(a, B, T), dim_sub(a, hd, one)), "B*T+d/heads-1");
    check_str(a, "str_null", NULL, "?");

    /* division */
    const Dim *q = dim_div(a, dim_int(a, 768), dim_int(a, 12), &exact);
    check("div_known_exact", q && exact && dim_const(q, &v) && v == 64, "768/12 != 64");
    q = dim_div(a, dim_int(a, 768), dim_int(a, 5), &exact);
    check("div_known_inexact", !q && !exact, "768/5 should be inexact");
    q = dim_div(a, d, zero, &exact);
    check("div_by_zero", !q && !exact, "d/0 should fail");
    q = dim_div(a, dim_mul(a, d, four), four, &exact);
    check("div_cancel", q && exact && dim_eq(q, d), "(d*4)/4 != d");
    q = dim_div(a, dim_sub(a, dim_mul(a, T, T), T), dim_sub(a, T, one), &exact); /* (T^2-T)/(T-1) = T */
    check("div_poly_exact", q && exact && dim_eq(q, T), "(T^2-T)/(T-1) != T");
    q = dim_div(a, dim_sub(a, dim_mul(a, T, T), one), dim_add(a, T, one), &exact); /* (T^2-1)/(T+1) = T-1 */
    check("div_poly_exact2", q && exact && dim_eq(q, dim_sub(a, T, one)), "(T^2-1)/(T+1) != T-1");
    q = dim_div(a, T, dim_add(a, T, one), &exact);
    check("div_poly_inexact", !q && !exact, "T/(T+1) is not a polynomial");
    q = dim_div(a, dim_int(a, -6), dim_int(a, 3), &exact);
    check("div_negative", q && exact && dim_const(q, &v) && v == -2, "-6/3 != -2");

    /* substitution */
    const Dim *s = dim_subst(a, dim_subst(a, hd, "d", dim_int(a, 768)), "heads", dim_int(a, 12));
    check("subst_div", s && dim_const(s, &v) && v == 64, "d/heads at 768, 12 != 64");
    s = dim_subst(a, dim_subst(a, hd, "d", dim_int(a, 768)), "heads", dim_int(a, 5));
    check("subst_inexact_rational", s && !dim_const(s, &v) && dim_rational(s, &n, &den) && n == 768 && den == 5,
          "768/5 should stay the fraction 768/5");
    s = dim_subst(a, hd, "heads", zero);
    check("subst_zero_divisor", s == NULL, "d/0 should fail");
    s = dim_subst(a, dim_sub(a, T, one), "T", dim_int(a, 1024));
    check("subst_t_minus_1", s && dim_const(s, &v) && v == 1023, "T-1 at 1024");
    s = dim_subst(a, dim_mul(a, T, T), "T", dim_add(a, B, one));
    check_str(a, "subst_poly", s, "B^2+B*2+1");
    s = dim_subst(a, d, "T", dim_int(a, 3));
    check("subst_absent", s && dim_eq(s, d), "substituting an absent symbol changed d");
    s = dim_subst(a, hd, "heads", dim_sym(a, "h"));
    check_str(a, "subst_rename", s, "d/h");

    /* powers */
    check_str(a, "pow_sym", dim_pow(a, T, 3), "T^3");
    check("pow_zero", dim_const(dim_pow(a, d, 0), &v) && v == 1, "d^0 != 1");
    check("pow_known", dim_const(dim_pow(a, two, 10), &v) && v == 1024, "2^10 != 1024");
    check("pow_one_huge", dim_const(dim_pow(a, one, 1000000000), &v) && v == 1, "1^1e9 != 1");
    check("pow_negative_exp", dim_pow(a, d, -1) == NULL, "d^-1 via dim_pow should be NULL");

    /* overflow */
    const Dim *big = dim_int(a, (int64_t)1 << 40);
    check("overflow_mul", dim_mul(a, big, big) == NULL, "2^80 should overflow");
    check("overflow_pow", dim_pow(a, two, 62) == NULL, "2^62 should overflow");
    check("fits_pow", dim_pow(a, two, 61) != NULL, "2^61 should fit");
    const Dim *m61 = dim_pow(a, two, 61);
    check("overflow_add", dim_add(a, m61, m61) == NULL, "2^61+2^61 should overflow");
    check("overflow_int", dim_int(a, INT64_MAX) == NULL, "INT64_MAX should not be a dim");
    check("overflow_sym_mul", dim_mul(a, dim_mul(a, T, big), big) == NULL, "T*2^80 should overflow");
    check("overflow_exp", dim_pow(a, T, 100000) == NULL, "T^100000 should overflow");
    check("null_propagates", dim_add(a, NULL, T) == NULL && dim_mul(a, T, NULL) == NULL, "NULL input");

    property_cases(a);

    arena_free(&ar);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
