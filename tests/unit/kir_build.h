/* kir_build.h - the unit tests' shorthand for building a kernel by hand with kir.h's builder
 * (test_cpu.c, test_cuda.c): one arena and builder per kernel, 1-d buffers numbered in order. */
#ifndef MBT_KIR_BUILD_H
#define MBT_KIR_BUILD_H

#include <stdlib.h>

#include "kir.h"
#include "unit.h"

typedef struct KB {
    Arena ar;
    Kernel *k;
    KBuilder *b;
    int g; /* gid */
    int nbufs;
} KB;

UNIT_FN KB *kb_start(const char *name, KKind kind, int64_t grid) {
    KB *t = calloc(1, sizeof(KB));
    if (!t) exit(1);
    t->k = kir_new(&t->ar, name, kind, grid);
    t->b = kb_new(&t->ar, t->k);
    t->g = kb_gid(t->b);
    return t;
}

UNIT_FN void kb_done(KB *t) {
    arena_free(&t->ar);
    free(t);
}

/* A 1-d buffer of n elements. */
UNIT_FN int B1(KB *t, DType dt, int64_t n, int written) {
    int key = t->nbufs++;
    return kb_buf(t->b, key, key, -1, dt, 1, &n, written);
}

UNIT_FN int C_f(KB *t, KType ty, double v) { return kb_const_f(t->b, ty, v); }
UNIT_FN int C_i(KB *t, KType ty, int64_t v) { return kb_const_i(t->b, ty, v); }
UNIT_FN int OP1(KB *t, KOp op, KType ty, int a) { return kb_op(t->b, op, ty, 1, a, -1, -1); }
UNIT_FN int OP2(KB *t, KOp op, KType ty, int a, int b) { return kb_op(t->b, op, ty, 2, a, b, -1); }
UNIT_FN int LD(KB *t, int p, int off) { return kb_load(t->b, p, off); }
UNIT_FN void ST(KB *t, int p, int off, int v) { kb_store(t->b, p, off, v); }

#endif
