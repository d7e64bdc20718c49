/* scalar.h - the scalar program IR: a function of one integer, the training step, to a double.
 *
 * Pipeline position: sema (schedule.c lowers the train block's learning-rate schedule into it)
 * -> [scalar program] -> the CPU back end (cpu_scalar.c: an LLVM function
 * `double lr_schedule(int64_t step)`). It is straight-line SSA: instruction i defines %i, every
 * operand is an earlier instruction, and control flow is gone (an `if` became selects, early
 * returns a select of "returned already"), so each instruction is computed on every call and the
 * result is the one the source's own path would compute, operation for operation. Values are
 * doubles (integers included: a schedule's steps are far below 2^53) or booleans (comparisons,
 * and/or/not). */
#ifndef MBT_SCALAR_H
#define MBT_SCALAR_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"

typedef enum ScalarOp {
    /* leaves */
    SC_CONST,  /* f64: k */
    SC_BCONST, /* bool: k != 0 */
    SC_STEP,   /* f64: the argument, converted from int64 */
    /* one operand */
    SC_NEG,     /* f64: -a */
    SC_NOT,     /* bool: not a */
    SC_TO_F64,  /* f64: a bool as 0 or 1 */
    SC_NONZERO, /* bool: a != 0 (an `if` on a number) */
    SC_TRUNC,   /* f64: a rounded toward zero (int(a)) */
    SC_COS,
    SC_SIN,
    SC_EXP,
    SC_LOG,
    SC_SQRT,
    SC_ABS,
    /* two operands, f64 */
    SC_ADD,
    SC_SUB,
    SC_MUL,
    SC_DIV,
    SC_MOD,
    SC_POW,
    SC_MIN,
    SC_MAX, /* NaN if either is; -0 below +0 */
    /* comparisons of two f64 (ordered; NE unordered), bool */
    SC_EQ,
    SC_NE,
    SC_LT,
    SC_LE,
    SC_GT,
    SC_GE,
    /* two bools */
    SC_AND,
    SC_OR,
    /* c ? a : b (a and b of one type) */
    SC_SELECT,
    SC_NOPS
} ScalarOp;

typedef struct ScalarInst {
    ScalarOp op;
    int is_bool; /* the result is a bool (else an f64) */
    int a, b, c; /* operands (instruction indices; -1 unused); SC_SELECT: c ? a : b */
    double k;    /* SC_CONST, SC_BCONST */
    Span src;    /* the source it comes from (span_none for the defaults) */
} ScalarInst;

typedef struct ScalarProg {
    const char *name; /* what it computes, for listings: "lr.cosine(step, warmup = 20, ...)" */
    ScalarInst *v;
    int n, cap;
    int result; /* the f64 instruction returned */
    Arena *ar;
} ScalarProg;

ScalarProg *scalar_new(Arena *ar, const char *name);
/* Appends an instruction and returns its index; the result's type follows from op and operands. */
int scalar_add(ScalarProg *p, ScalarOp op, int a, int b, int c, Span src);
int scalar_const(ScalarProg *p, double k, Span src);
const char *scalar_op_name(ScalarOp op); /* "add", "select", ... */
/* Checks SSA order, operand counts and types; 0 when well formed, else the problems (to out, if
 * not NULL). */
int scalar_verify(const ScalarProg *p, FILE *out);
/* The program's value at step, computed here in double precision, operation for operation as
 * cpu_scalar.c's lr_schedule computes it (for listings: the plan's rate per ramp stage). */
double scalar_eval(const ScalarProg *p, int64_t step);
/* The listing: `scalar NAME(step) -> f64 { %0 = step ... return %k }`. */
void scalar_print(const ScalarProg *p, FILE *out);

#endif
