/* scalar.c - the scalar program IR (scalar.h): building, checking and printing it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "scalar.h"

static const char *const op_names[SC_NOPS] = {"const", "bconst", "step", "neg", "not",  "to_f64", "nonzero", "trunc",
                                              "cos",   "sin",    "exp",  "log", "sqrt", "abs",    "add",     "sub",
                                              "mul",   "div",    "mod",  "pow", "min",  "max",    "eq",      "ne",
                                              "lt",    "le",     "gt",   "ge",  "and",  "or",     "select"};

const char *scalar_op_name(ScalarOp op) { return op >= 0 && op < SC_NOPS ? op_names[op] : "?"; }

/* Operands of op, and the types they take and give: 'f' f64, 'b' bool, 'T' either (select). */
static int op_arity(ScalarOp op) {
    if (op <= SC_STEP) return 0;
    if (op <= SC_ABS) return 1;
    if (op <= SC_OR) return 2;
    return 3;
}

static char op_operand_type(ScalarOp op) {
    return op == SC_NOT || op == SC_TO_F64 || op == SC_AND || op == SC_OR ? 'b' : op == SC_SELECT ? 'T' : 'f';
}

static int op_gives_bool(ScalarOp op) {
    return op == SC_BCONST || op == SC_NOT || op == SC_NONZERO || (op >= SC_EQ && op <= SC_OR);
}

ScalarProg *scalar_new(Arena *ar, const char *name) {
    ScalarProg *p = arena_alloc(ar, sizeof(ScalarProg));
    p->ar = ar;
    p->name = name;
    p->result = -1;
    return p;
}

int scalar_add(ScalarProg *p, ScalarOp op, int a, int b, int c, Span src) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 32;
        ScalarInst *nv = arena_alloc(p->ar, sizeof(ScalarInst) * (size_t)cap);
        if (p->n) memcpy(nv, p->v, sizeof(ScalarInst) * (size_t)p->n);
        p->v = nv;
        p->cap = cap;
    }
    ScalarInst *in = &p->v[p->n];
    memset(in, 0, sizeof *in);
    in->op = op;
    in->a = a, in->b = b, in->c = c;
    in->src = src;
    in->is_bool = op == SC_SELECT ? (b >= 0 && b < p->n && p->v[b].is_bool) : op_gives_bool(op);
    return p->n++;
}

int scalar_const(ScalarProg *p, double k, Span src) {
    int i = scalar_add(p, SC_CONST, -1, -1, -1, src);
    p->v[i].k = k;
    return i;
}

static int verify_fail(FILE *out, const ScalarProg *p, int i, const char *what) {
    if (out) fprintf(out, "scalar %s: %%%d (%s): %s\n", p->name ? p->name : "?", i, scalar_op_name(p->v[i].op), what);
    return 1;
}

int scalar_verify(const ScalarProg *p, FILE *out) {
    int problems = 0;
    for (int i = 0; i < p->n; i++) {
        const ScalarInst *in = &p->v[i];
        if (in->op < 0 || in->op >= SC_NOPS) {
            problems += verify_fail(out, p, i, "no such op");
            continue;
        }
        int arity = op_arity(in->op), ops[3] = {in->a, in->b, in->c};
        char want = op_operand_type(in->op);
        for (int k = 0; k < 3; k++) {
            if (k >= arity) {
                if (ops[k] != -1) problems += verify_fail(out, p, i, "an operand past its arity");
                continue;
            }
            if (ops[k] < 0 || ops[k] >= i) {
                problems += verify_fail(out, p, i, "an operand that is not an earlier instruction");
                continue;
            }
            int is_bool = p->v[ops[k]].is_bool;
            if (want == 'T' && k == 0 ? !is_bool : want == 'b' ? !is_bool : want == 'f' ? is_bool : 0)
                problems += verify_fail(out, p, i, "an operand of the wrong type");
        }
        if (in->op == SC_SELECT && ops[1] >= 0 && ops[2] >= 0 && ops[1] < i && ops[2] < i &&
            p->v[ops[1]].is_bool != p->v[ops[2]].is_bool)
            problems += verify_fail(out, p, i, "select between a bool and an f64");
        int want_bool = in->op == SC_SELECT ? (ops[1] >= 0 && ops[1] < i && p->v[ops[1]].is_bool) : op_gives_bool(in->op);
        if (in->is_bool != want_bool) problems += verify_fail(out, p, i, "the wrong result type");
    }
    if (p->result < 0 || p->result >= p->n || p->v[p->result].is_bool) {
        if (out) fprintf(out, "scalar %s: the result %%%d is not an f64 instruction\n", p->name ? p->name : "?", p->result);
        problems++;
    }
    return problems;
}

void scalar_print(const ScalarProg *p, FILE *out) {
    fprintf(out, "scalar %s -> f64 {\n", p->name ? p->name : "(step)");
    for (int i = 0; i < p->n; i++) {
        const ScalarInst *in = &p->v[i];
        char line[160];
        int len = snprintf(line, sizeof line, "  %%%d: %s = %s", i, in->is_bool ? "bool" : "f64", scalar_op_name(in->op));
        if (in->op == SC_CONST) len += snprintf(line + len, sizeof line - (size_t)len, " %.17g", in->k);
        else if (in->op == SC_BCONST)
            len += snprintf(line + len, sizeof line - (size_t)len, " %s", in->k != 0 ? "true" : "false");
        int ops[3] = {in->a, in->b, in->c}, arity = op_arity(in->op);
        for (int k = 0; k < arity; k++) len += snprintf(line + len, sizeof line - (size_t)len, "%s%%%d", k ? ", " : " ", ops[k]);
        fputs(line, out);
        if (in->src.file) { /* the source line it comes from, as graph_print writes it */
            const char *path = diag_source_path(in->src.file), *slash = path ? strrchr(path, '/') : NULL;
            fprintf(out, "%*s# %s:%u:%u", len < 40 ? 40 - len : 1, "",
                    slash  ? slash + 1
                    : path ? path
                           : "?",
                    in->src.line, in->src.col);
        }
        fputc('\n', out);
    }
    fprintf(out, "  return %%%d\n}\n", p->result);
}

/* llvm.minimum / llvm.maximum: NaN if either is, -0 below +0 (what cpu_scalar.c emits). */
static double sc_minmax(double a, double b, int max) {
    if (isnan(a) || isnan(b)) return NAN;
    if (a == b) return max ? (signbit(a) ? b : a) : (signbit(a) ? a : b);
    return max ? (a > b ? a : b) : (a < b ? a : b);
}

double scalar_eval(const ScalarProg *p, int64_t step) {
    double *v = calloc((size_t)p->n + 1, sizeof(double));
    if (!v) INTERNAL("scalar_eval: out of memory");
    for (int i = 0; i < p->n; i++) {
        const ScalarInst *in = &p->v[i];
        double a = in->a >= 0 ? v[in->a] : 0, b = in->b >= 0 ? v[in->b] : 0;
        double r;
        switch (in->op) {
        case SC_CONST: r = in->k; break;
        case SC_BCONST: r = in->k != 0; break;
        case SC_STEP: r = (double)step; break;
        case SC_NEG: r = -a; break;
        case SC_NOT: r = a == 0; break;
        case SC_TO_F64: r = a; break;
        case SC_NONZERO: r = a != 0; break; /* NaN is nonzero, as UNE */
        case SC_TRUNC: r = trunc(a); break;
        case SC_COS: r = cos(a); break;
        case SC_SIN: r = sin(a); break;
        case SC_EXP: r = exp(a); break;
        case SC_LOG: r = log(a); break;
        case SC_SQRT: r = sqrt(a); break;
        case SC_ABS: r = fabs(a); break;
        case SC_ADD: r = a + b; break;
        case SC_SUB: r = a - b; break;
        case SC_MUL: r = a * b; break;
        case SC_DIV: r = a / b; break;
        case SC_MOD: r = fmod(a, b); break;
        case SC_POW: r = pow(a, b); break;
        case SC_MIN: r = sc_minmax(a, b, 0); break;
        case SC_MAX: r = sc_minmax(a, b, 1); break;
        case SC_EQ: r = a == b; break;
        case SC_NE: r = !(a == b); break; /* unordered: NaN != anything */
        case SC_LT: r = a < b; break;
        case SC_LE: r = a <= b; break;
        case SC_GT: r = a > b; break;
        case SC_GE: r = a >= b; break;
        case SC_AND: r = a != 0 && b != 0; break;
        case SC_OR: r = a != 0 || b != 0; break;
        case SC_SELECT: r = a != 0 ? b : v[in->c]; break; /* a ? b : c, as scalar_add(SC_SELECT, cond, then, else) */
        default: INTERNAL("scalar_eval: op %d", (int)in->op);
        }
        v[i] = r;
    }
    double r = p->result >= 0 && p->result < p->n ? v[p->result] : NAN;
    free(v);
    return r;
}
