/* kir.c - the kernel IR (kir.h): the builder fuse.c generates kernels with (hash-consing,
 * folding of index arithmetic, scoped memo), dead-code removal, the verifier and the printer.
 *
 * Pipeline position: fuse -> [kir] -> back ends. Nothing here knows the graph: a Kernel is
 * complete in itself, which is what lets the CPU and CUDA back ends lower it without fuse.
 *
 * Printed form (kir_print_body), constants inline, one instruction a line:
 *     %0 = gid : i64
 *     %3 = acc add 0.0 : f32
 *     %4 = loop 16 {
 *       %6 = load p0[%5] : f32
 *       %3 += %6
 *     }
 *     %9 = div %3, 16.0 : f32
 *     store p1[%0] = %9
 * p0, p1 are the kernel's buffer parameters (Kernel.bufs), `+=` / `max=` / `min=` accumulate. */
#include "kir.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "diag.h"
#include "value.h"

/* ---- names ------------------------------------------------------------------------------------ */

static const char *const kir_op_names[K_OP_COUNT] = {
    [K_NONE] = "?",      [K_CONST] = "const",   [K_GID] = "gid",   [K_LOOP] = "loop",   [K_ENDLOOP] = "endloop",
    [K_IF] = "if",       [K_ENDIF] = "endif",   [K_ACC] = "acc",   [K_ACCUM] = "accum", [K_LOAD] = "load",
    [K_STORE] = "store", [K_ADD] = "add",       [K_SUB] = "sub",   [K_MUL] = "mul",     [K_DIV] = "div",
    [K_MOD] = "mod",     [K_POW] = "pow",       [K_MAX] = "max",   [K_MIN] = "min",     [K_IDIV] = "idiv",
    [K_IMOD] = "imod",   [K_XOR] = "xor",       [K_SHR] = "shr",   [K_NEG] = "neg",     [K_ABS] = "abs",
    [K_EXP] = "exp",     [K_LOG] = "log",       [K_SQRT] = "sqrt", [K_TANH] = "tanh",   [K_SIN] = "sin",
    [K_COS] = "cos",     [K_FLOOR] = "floor",   [K_EQ] = "eq",     [K_NE] = "ne",       [K_LT] = "lt",
    [K_LE] = "le",       [K_GT] = "gt",         [K_GE] = "ge",     [K_AND] = "and",     [K_OR] = "or",
    [K_NOT] = "not",     [K_SELECT] = "select", [K_CAST] = "cast",
};

const char *kir_op_name(KOp op) { return op >= 0 && op < K_OP_COUNT && kir_op_names[op] ? kir_op_names[op] : "?"; }

static const char *const kir_type_names[KT_COUNT] = {"void", "bool", "i32", "i64", "u64", "f16", "bf16", "f32", "f64"};

const char *kir_type_name(KType t) { return t >= 0 && t < KT_COUNT ? kir_type_names[t] : "?"; }

KType kir_type_of(DType dt) {
    switch (dt) {
    case DT_F32: return KT_F32;
    case DT_F16: return KT_F16;
    case DT_BF16: return KT_BF16;
    case DT_F64: return KT_F64;
    case DT_I32: return KT_I32;
    case DT_I64: return KT_I64;
    case DT_BOOL: return KT_BOOL;
    default: INTERNAL("kir: no value type for dtype %d", (int)dt);
    }
}

int kir_type_is_float(KType t) { return t == KT_F16 || t == KT_BF16 || t == KT_F32 || t == KT_F64; }

static const char *const kir_kind_names[KK_COUNT] = {"elementwise", "row", "reduce", "attention", "topk", "scatter"};

const char *kir_kind_name(KKind k) { return k >= 0 && k < KK_COUNT ? kir_kind_names[k] : "?"; }

static int kir_is_binary(KOp op) { return op >= K_ADD && op <= K_SHR; }
static int kir_is_unary(KOp op) { return op >= K_NEG && op <= K_FLOOR; }
static int kir_is_compare(KOp op) { return op >= K_EQ && op <= K_GE; }

/* ---- the scoped map ----------------------------------------------------------------------------
 * Open addressing over 6-word keys. Each entry remembers the scope (a serial number, one per
 * loop or if opened) it was made in; an entry whose scope has closed is invisible, and a new
 * entry with the same key takes its slot. */

typedef struct KMapEnt {
    int64_t key[6];
    int v;
    int serial;
    int used;
} KMapEnt;

typedef struct KMap {
    KMapEnt *e;
    int cap, n;
} KMap;

#define KB_MAX_DEPTH 64

struct KBuilder {
    Arena *ar;
    Kernel *k;
    KMap cons, memo;
    unsigned char *open; /* open[serial]: the scope is still open */
    int nserial, capserial;
    int depth;
    int serial[KB_MAX_DEPTH + 1]; /* serial of each open scope; [0] is the body */
    KOp kind[KB_MAX_DEPTH + 1];   /* K_LOOP or K_IF */
    int *scope_of;                /* per instruction: the serial of the scope it is defined in */
    int scope_cap;
};

static uint64_t kmap_hash(const int64_t *key) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 6; i++) {
        h ^= (uint64_t)key[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
    }
    return h ^ (h >> 31);
}

static void kmap_grow(KBuilder *b, KMap *m) {
    int cap = m->cap ? m->cap * 2 : 256;
    KMapEnt *e = arena_alloc(b->ar, sizeof(KMapEnt) * (size_t)cap);
    for (int i = 0; i < m->cap; i++) {
        if (!m->e[i].used || !b->open[m->e[i].serial]) continue; /* drop what is out of scope */
        uint64_t h = kmap_hash(m->e[i].key) & (uint64_t)(cap - 1);
        while (e[h].used) h = (h + 1) & (uint64_t)(cap - 1);
        e[h] = m->e[i];
    }
    m->e = e;
    m->cap = cap;
    m->n = 0;
    for (int i = 0; i < cap; i++) m->n += e[i].used;
}

/* The slot holding key, or the empty slot where it would go. */
static KMapEnt *kmap_slot(KMap *m, const int64_t *key) {
    uint64_t h = kmap_hash(key) & (uint64_t)(m->cap - 1);
    while (m->e[h].used && memcmp(m->e[h].key, key, sizeof m->e[h].key) != 0) h = (h + 1) & (uint64_t)(m->cap - 1);
    return &m->e[h];
}

static int kmap_get(KBuilder *b, KMap *m, const int64_t *key) {
    if (!m->cap) return -1;
    KMapEnt *s = kmap_slot(m, key);
    return s->used && b->open[s->serial] ? s->v : -1;
}

static void kmap_put(KBuilder *b, KMap *m, const int64_t *key, int v) {
    if ((m->n + 1) * 2 > m->cap) kmap_grow(b, m);
    KMapEnt *s = kmap_slot(m, key);
    if (!s->used) m->n++;
    memcpy(s->key, key, sizeof s->key);
    s->used = 1;
    s->v = v;
    s->serial = b->serial[b->depth];
}

/* ---- building --------------------------------------------------------------------------------- */

Kernel *kir_new(Arena *ar, const char *name, KKind kind, int64_t grid) {
    Kernel *k = arena_alloc(ar, sizeof(Kernel));
    k->name = name;
    k->kind = kind;
    k->grid = grid;
    k->nsegments = 1;
    return k;
}

static int kb_new_serial(KBuilder *b) {
    if (b->nserial == b->capserial) {
        int cap = b->capserial ? b->capserial * 2 : 64;
        unsigned char *o = arena_alloc(b->ar, (size_t)cap);
        if (b->nserial) memcpy(o, b->open, (size_t)b->nserial);
        b->open = o;
        b->capserial = cap;
    }
    b->open[b->nserial] = 1;
    return b->nserial++;
}

KBuilder *kb_new(Arena *ar, Kernel *k) {
    KBuilder *b = arena_alloc(ar, sizeof(KBuilder));
    b->ar = ar;
    b->k = k;
    b->serial[0] = kb_new_serial(b);
    return b;
}

Arena *kb_arena(const KBuilder *b) { return b->ar; }

int kb_buf(KBuilder *b, int key, int buffer, int node, DType dt, int rank, const int64_t *shape, int written) {
    Kernel *k = b->k;
    for (int i = 0; i < k->nbufs; i++)
        if (k->bufs[i].key == key) {
            if (written) k->bufs[i].written = 1;
            return i;
        }
    KBuf *nb = arena_alloc(b->ar, sizeof(KBuf) * (size_t)(k->nbufs + 1));
    if (k->nbufs) memcpy(nb, k->bufs, sizeof(KBuf) * (size_t)k->nbufs);
    KBuf *p = &nb[k->nbufs];
    p->buffer = buffer;
    p->node = node;
    p->dt = dt;
    p->rank = rank;
    for (int i = 0; i < rank; i++) p->shape[i] = shape[i];
    p->written = written;
    p->key = key;
    k->bufs = nb;
    return k->nbufs++;
}

static int kb_emit(KBuilder *b, KInst in) {
    Kernel *k = b->k;
    if (k->n == k->cap) {
        int cap = k->cap ? k->cap * 2 : 64;
        KInst *ni = arena_alloc(b->ar, sizeof(KInst) * (size_t)cap);
        if (k->n) memcpy(ni, k->inst, sizeof(KInst) * (size_t)k->n);
        k->inst = ni;
        k->cap = cap;
        int *so = arena_alloc(b->ar, sizeof(int) * (size_t)cap);
        if (k->n) memcpy(so, b->scope_of, sizeof(int) * (size_t)k->n);
        b->scope_of = so;
        b->scope_cap = cap;
    }
    b->scope_of[k->n] = b->serial[b->depth];
    k->inst[k->n] = in;
    return k->n++;
}

static void kb_check_value(const KBuilder *b, int v, const char *what) {
    if (v < 0 || v >= b->k->n) INTERNAL("kir builder: %s: no value %%%d in %s", what, v, b->k->name);
    if (!b->open[b->scope_of[v]]) INTERNAL("kir builder: %s: %%%d is out of scope in %s", what, v, b->k->name);
}

KType kb_type(const KBuilder *b, int v) { return b->k->inst[v].type; }

int kb_is_const(const KBuilder *b, int v, int64_t *iv) {
    const KInst *in = &b->k->inst[v];
    if (in->op != K_CONST || kir_type_is_float(in->type)) return 0;
    if (iv) *iv = in->i;
    return 1;
}

static int kb_cons(KBuilder *b, KInst in, int pure) {
    if (!pure) return kb_emit(b, in);
    int64_t fb;
    memcpy(&fb, &in.f, sizeof fb);
    int64_t key[6] = {
        (int64_t)in.op * 65536 + (int64_t)in.type * 256 + in.nin, in.a[0], in.a[1], in.a[2], in.op == K_LOAD ? in.buf : in.i, fb};
    int v = kmap_get(b, &b->cons, key);
    if (v >= 0) return v;
    v = kb_emit(b, in);
    kmap_put(b, &b->cons, key, v);
    return v;
}

int kb_const_f(KBuilder *b, KType t, double v) {
    if (!kir_type_is_float(t)) INTERNAL("kir builder: float constant of type %s", kir_type_name(t));
    KInst in = {.op = K_CONST, .type = t, .f = v, .a = {-1, -1, -1}};
    return kb_cons(b, in, 1);
}

int kb_const_i(KBuilder *b, KType t, int64_t v) {
    if (kir_type_is_float(t) || t == KT_VOID) INTERNAL("kir builder: integer constant of type %s", kir_type_name(t));
    if (t == KT_BOOL) v = v != 0;
    if (t == KT_I32) v = (int32_t)v;
    KInst in = {.op = K_CONST, .type = t, .i = v, .a = {-1, -1, -1}};
    return kb_cons(b, in, 1);
}

int kb_gid(KBuilder *b) {
    KInst in = {.op = K_GID, .type = KT_I64, .a = {-1, -1, -1}};
    return kb_cons(b, in, 1);
}

/* Integer arithmetic on constants, for i64 and u64 (index and hash math); returns 1 when folded. */
static int kb_fold_int(KOp op, KType t, int64_t x, int64_t y, int64_t *out) {
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    if (t != KT_I64 && t != KT_U64) return 0;
    switch (op) {
    case K_ADD: *out = (int64_t)(ux + uy); return 1;
    case K_SUB: *out = (int64_t)(ux - uy); return 1;
    case K_MUL: *out = (int64_t)(ux * uy); return 1;
    case K_IDIV:
        if (y <= 0 || x < 0) return 0;
        *out = x / y;
        return 1;
    case K_IMOD:
        if (y <= 0 || x < 0) return 0;
        *out = x % y;
        return 1;
    case K_MAX: *out = t == KT_U64 ? (int64_t)(ux > uy ? ux : uy) : (x > y ? x : y); return 1;
    case K_MIN: *out = t == KT_U64 ? (int64_t)(ux < uy ? ux : uy) : (x < y ? x : y); return 1;
    case K_XOR: *out = (int64_t)(ux ^ uy); return 1;
    case K_SHR: *out = uy < 64 ? (int64_t)(ux >> uy) : 0; return 1;
    default: return 0;
    }
}

static int kb_fold_compare(KOp op, int64_t x, int64_t y) {
    switch (op) {
    case K_EQ: return x == y;
    case K_NE: return x != y;
    case K_LT: return x < y;
    case K_LE: return x <= y;
    case K_GT: return x > y;
    default: return x >= y;
    }
}

int kb_op(KBuilder *b, KOp op, KType t, int nin, int a0, int a1, int a2) {
    int a[3] = {a0, a1, a2};
    if (nin < 1 || nin > 3) INTERNAL("kir builder: %s with %d operands", kir_op_name(op), nin);
    for (int i = 0; i < nin; i++) kb_check_value(b, a[i], kir_op_name(op));
    int64_t x = 0, y = 0;
    int cx = kb_is_const(b, a[0], &x), cy = nin > 1 && kb_is_const(b, a[1], &y);
    KType ta = kb_type(b, a[0]);
    /* folding: integer index and hash arithmetic only (float rounding is the back end's) */
    if (kir_is_binary(op) && (t == KT_I64 || t == KT_U64)) {
        int64_t r;
        if (cx && cy && kb_fold_int(op, t, x, y, &r)) return kb_const_i(b, t, r);
        if ((op == K_ADD || op == K_SUB || op == K_SHR) && cy && y == 0) return a[0];
        if (op == K_ADD && cx && x == 0) return a[1];
        if (op == K_MUL && cy && y == 1) return a[0];
        if (op == K_MUL && cx && x == 1) return a[1];
        if (op == K_MUL && ((cx && x == 0) || (cy && y == 0))) return kb_const_i(b, t, 0);
        if (op == K_IDIV && cy && y == 1) return a[0];
        if (op == K_IMOD && cy && y == 1) return kb_const_i(b, t, 0);
        if (op == K_IDIV && cx && x == 0) return kb_const_i(b, t, 0);
        if (op == K_IMOD && cx && x == 0) return kb_const_i(b, t, 0);
        if ((op == K_MAX || op == K_MIN) && a[0] == a[1]) return a[0];
        if (op == K_ADD && t == KT_I64) { /* (y idiv c) * c + (y imod c) = y */
            const KInst *m = &b->k->inst[a[0]], *r = &b->k->inst[a[1]];
            if (m->op == K_MUL && r->op == K_IMOD) {
                for (int s = 0; s < 2; s++) {
                    const KInst *q = &b->k->inst[m->a[s]];
                    if (q->op == K_IDIV && q->a[0] == r->a[0] && q->a[1] == r->a[1] && m->a[1 - s] == r->a[1]) return r->a[0];
                }
            }
        }
    }
    if ((op == K_MUL || op == K_DIV) && kir_type_is_float(t) && nin == 2) { /* x * 1 and x / 1 are x exactly */
        const KInst *y = &b->k->inst[a[1]], *x = &b->k->inst[a[0]];
        if (y->op == K_CONST && y->f == 1.0) return a[0];
        if (op == K_MUL && x->op == K_CONST && x->f == 1.0) return a[1];
    }
    if (kir_is_compare(op) && cx && cy && (ta == KT_I64 || ta == KT_I32))
        return kb_const_i(b, KT_BOOL, kb_fold_compare(op, x, y));
    if (op == K_SELECT) {
        int64_t c;
        if (kb_is_const(b, a[0], &c)) return c ? a[1] : a[2];
        if (a[1] == a[2]) return a[1];
    }
    if (op == K_CAST) {
        if (ta == t) return a[0];
        if (cx && !kir_type_is_float(t) && !kir_type_is_float(ta)) return kb_const_i(b, t, x);
    }
    if (op == K_AND && cx) return x ? a[1] : a[0];
    if (op == K_AND && cy) return y ? a[0] : a[1];
    KInst in = {.op = op, .type = t, .nin = nin, .a = {a[0], nin > 1 ? a[1] : -1, nin > 2 ? a[2] : -1}};
    int pure = 1;
    for (int i = 0; i < nin; i++)
        if (b->k->inst[a[i]].op == K_ACC) pure = 0; /* its value changes as the kernel runs */
    return kb_cons(b, in, pure);
}

int kb_load(KBuilder *b, int buf, int off) {
    if (buf < 0 || buf >= b->k->nbufs) INTERNAL("kir builder: load from buffer %d of %d", buf, b->k->nbufs);
    kb_check_value(b, off, "load");
    KInst in = {.op = K_LOAD, .type = kir_type_of(b->k->bufs[buf].dt), .nin = 1, .a = {off, -1, -1}, .buf = buf};
    /* a buffer the kernel writes may change between two loads; the others are constant */
    return kb_cons(b, in, !b->k->bufs[buf].written && b->k->inst[off].op != K_ACC);
}

void kb_store(KBuilder *b, int buf, int off, int v) {
    if (buf < 0 || buf >= b->k->nbufs) INTERNAL("kir builder: store to buffer %d of %d", buf, b->k->nbufs);
    kb_check_value(b, off, "store");
    kb_check_value(b, v, "store");
    b->k->bufs[buf].written = 1;
    KInst in = {.op = K_STORE, .type = KT_VOID, .nin = 2, .a = {off, v, -1}, .buf = buf};
    kb_emit(b, in);
}

static void kb_open(KBuilder *b, KOp kind) {
    if (b->depth == KB_MAX_DEPTH) INTERNAL("kir builder: loops and ifs nested over %d deep", KB_MAX_DEPTH);
    b->depth++;
    b->serial[b->depth] = kb_new_serial(b);
    b->kind[b->depth] = kind;
}

static void kb_close(KBuilder *b, KOp kind) {
    if (b->depth == 0 || b->kind[b->depth] != kind)
        INTERNAL("kir builder: %s without its opening in %s", kind == K_LOOP ? "endloop" : "endif", b->k->name);
    b->open[b->serial[b->depth]] = 0;
    b->depth--;
}

int kb_loop(KBuilder *b, int64_t extent) {
    KInst in = {.op = K_LOOP, .type = KT_I64, .i = extent, .a = {-1, -1, -1}};
    int v = kb_emit(b, in);
    kb_open(b, K_LOOP);
    b->scope_of[v] = b->serial[b->depth]; /* the counter lives inside the loop */
    return v;
}

int kb_loop_dyn(KBuilder *b, int extent) {
    int64_t c;
    if (kb_is_const(b, extent, &c)) return kb_loop(b, c);
    kb_check_value(b, extent, "loop");
    KInst in = {.op = K_LOOP, .type = KT_I64, .nin = 1, .a = {extent, -1, -1}};
    int v = kb_emit(b, in);
    kb_open(b, K_LOOP);
    b->scope_of[v] = b->serial[b->depth];
    return v;
}

void kb_endloop(KBuilder *b) {
    kb_close(b, K_LOOP);
    KInst in = {.op = K_ENDLOOP, .type = KT_VOID, .a = {-1, -1, -1}};
    kb_emit(b, in);
}

void kb_if(KBuilder *b, int cond) {
    kb_check_value(b, cond, "if");
    KInst in = {.op = K_IF, .type = KT_VOID, .nin = 1, .a = {cond, -1, -1}};
    kb_emit(b, in);
    kb_open(b, K_IF);
}

void kb_endif(KBuilder *b) {
    kb_close(b, K_IF);
    KInst in = {.op = K_ENDIF, .type = KT_VOID, .a = {-1, -1, -1}};
    kb_emit(b, in);
}

int kb_acc(KBuilder *b, KType t, KOp aop, double init) {
    KInst in = {.op = K_ACC, .type = t, .aop = aop, .a = {-1, -1, -1}};
    if (kir_type_is_float(t)) in.f = init;
    else in.i = (int64_t)init;
    return kb_emit(b, in);
}

void kb_accum(KBuilder *b, int acc, int v) {
    kb_check_value(b, acc, "accum");
    kb_check_value(b, v, "accum");
    if (b->k->inst[acc].op != K_ACC) INTERNAL("kir builder: accum into %%%d, not an accumulator", acc);
    KInst in = {.op = K_ACCUM, .type = KT_VOID, .nin = 2, .a = {acc, v, -1}};
    kb_emit(b, in);
}

int kb_depth(const KBuilder *b) { return b->depth; }

int kb_memo_get(KBuilder *b, int64_t k1, int64_t k2) {
    int64_t key[6] = {k1, k2, 0, 0, 0, 0};
    return kmap_get(b, &b->memo, key);
}

void kb_memo_put(KBuilder *b, int64_t k1, int64_t k2, int v) {
    int64_t key[6] = {k1, k2, 0, 0, 0, 0};
    kmap_put(b, &b->memo, key, v);
}

/* ---- queries ------------------------------------------------------------------------------------ */

int kir_loads(const Kernel *k, int p) {
    for (int i = 0; i < k->n; i++)
        if (k->inst[i].op == K_LOAD && k->inst[i].buf == p) return 1;
    return 0;
}

/* ---- dead code ---------------------------------------------------------------------------------- */

void kir_finish(Kernel *k) {
    int n = k->n;
    if (!n) return;
    Arena scratch = {0};
    unsigned char *live = arena_alloc(&scratch, (size_t)n);
    int *parent = arena_alloc(&scratch, sizeof(int) * (size_t)n); /* enclosing loop/if, -1 at top */
    int *match = arena_alloc(&scratch, sizeof(int) * (size_t)n);  /* opening <-> closing */
    int *stack = arena_alloc(&scratch, sizeof(int) * (size_t)n);
    int *work = arena_alloc(&scratch, sizeof(int) * (size_t)n);
    int sp = 0, nw = 0;
    for (int i = 0; i < n; i++) {
        KOp op = k->inst[i].op;
        match[i] = -1;
        if (op == K_ENDLOOP || op == K_ENDIF) {
            if (!sp) INTERNAL("kir: %s: unbalanced %s", k->name, kir_op_name(op));
            int o = stack[--sp];
            match[o] = i;
            match[i] = o;
        }
        parent[i] = sp ? stack[sp - 1] : -1;
        if (op == K_LOOP || op == K_IF) stack[sp++] = i;
    }
    if (sp) INTERNAL("kir: %s: unclosed loop or if", k->name);
    for (int i = 0; i < n; i++)
        if (k->inst[i].op == K_STORE) {
            live[i] = 1;
            work[nw++] = i;
        }
    while (nw) {
        int i = work[--nw];
        const KInst *in = &k->inst[i];
        for (int j = 0; j < in->nin; j++) {
            int a = in->a[j];
            if (a >= 0 && !live[a]) {
                live[a] = 1;
                work[nw++] = a;
            }
        }
        if (parent[i] >= 0 && !live[parent[i]]) { /* what holds a live instruction is live */
            live[parent[i]] = 1;
            work[nw++] = parent[i];
        }
        if ((in->op == K_LOOP || in->op == K_IF) && !live[match[i]]) live[match[i]] = 1;
        if (in->op == K_ACC) /* a live accumulator keeps everything folded into it */
            for (int j = i + 1; j < n; j++)
                if (k->inst[j].op == K_ACCUM && k->inst[j].a[0] == i && !live[j]) {
                    live[j] = 1;
                    work[nw++] = j;
                }
    }
    int *renum = arena_alloc(&scratch, sizeof(int) * (size_t)n);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!live[i]) {
            renum[i] = -1;
            continue;
        }
        renum[i] = m;
        KInst in = k->inst[i];
        for (int j = 0; j < in.nin; j++) {
            if (in.a[j] < 0 || renum[in.a[j]] < 0) INTERNAL("kir: %s: live %%%d uses dead %%%d", k->name, i, in.a[j]);
            in.a[j] = renum[in.a[j]];
        }
        k->inst[m++] = in;
    }
    k->n = m;
    arena_free(&scratch);
}

/* ---- verifying ------------------------------------------------------------------------------------ */

typedef struct KirV {
    const Kernel *k;
    FILE *out;
    int problems;
} KirV;

static void kir_v_fail(KirV *v, int at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void kir_v_fail(KirV *v, int at, const char *fmt, ...) {
    v->problems++;
    if (!v->out) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(v->out, "kir: %s: %%%d: ", v->k->name ? v->k->name : "?", at);
    vfprintf(v->out, fmt, ap);
    fprintf(v->out, "\n");
    va_end(ap);
}

int kir_verify(const Kernel *k, FILE *out) {
    KirV v = {k, out, 0};
    Arena scratch = {0};
    int n = k->n;
    int *scope = arena_alloc(&scratch, sizeof(int) * (size_t)(n + 1)); /* serial of each value's scope */
    unsigned char *open = arena_alloc(&scratch, (size_t)(n + 2));
    int stack[KB_MAX_DEPTH + 2], kinds[KB_MAX_DEPTH + 2], sp = 0, serials = 1;
    stack[0] = 0;
    kinds[0] = K_NONE;
    open[0] = 1;
    if (k->grid < 1) kir_v_fail(&v, 0, "grid %" PRId64 " is not positive", k->grid);
    for (int i = 0; i < n; i++) {
        const KInst *in = &k->inst[i];
        scope[i] = stack[sp];
        if (in->op <= K_NONE || in->op >= K_OP_COUNT) {
            kir_v_fail(&v, i, "unknown op %d", (int)in->op);
            continue;
        }
        if (in->nin < 0 || in->nin > 3) {
            kir_v_fail(&v, i, "%d operands", in->nin);
            continue;
        }
        int ok = 1;
        for (int j = 0; j < in->nin; j++) {
            int a = in->a[j];
            if (a < 0 || a >= i) {
                kir_v_fail(&v, i, "%s: operand %d is %%%d, not defined before", kir_op_name(in->op), j, a);
                ok = 0;
            } else if (!open[scope[a]]) {
                kir_v_fail(&v, i, "%s: operand %%%d is out of scope", kir_op_name(in->op), a);
                ok = 0;
            } else if (k->inst[a].type == KT_VOID) {
                kir_v_fail(&v, i, "%s: operand %%%d has no value", kir_op_name(in->op), a);
                ok = 0;
            }
        }
        if (!ok) continue;
        KType t = in->type, t0 = in->nin > 0 ? k->inst[in->a[0]].type : KT_VOID;
        KType t1 = in->nin > 1 ? k->inst[in->a[1]].type : KT_VOID, t2 = in->nin > 2 ? k->inst[in->a[2]].type : KT_VOID;
        switch (in->op) {
        case K_CONST:
            if (t == KT_VOID) kir_v_fail(&v, i, "constant without a type");
            break;
        case K_GID:
            if (t != KT_I64) kir_v_fail(&v, i, "gid must be i64");
            break;
        case K_LOOP:
            if (t != KT_I64) kir_v_fail(&v, i, "a loop counter must be i64");
            if (in->nin == 1 && t0 != KT_I64) kir_v_fail(&v, i, "a loop extent must be i64");
            if (in->nin == 0 && in->i < 0) kir_v_fail(&v, i, "loop extent %" PRId64, in->i);
            /* fallthrough */
        case K_IF:
            if (in->op == K_IF && t0 != KT_BOOL) kir_v_fail(&v, i, "an if condition must be bool");
            if (sp == KB_MAX_DEPTH) {
                kir_v_fail(&v, i, "nested over %d deep", KB_MAX_DEPTH);
                break;
            }
            stack[++sp] = serials;
            kinds[sp] = in->op;
            open[serials++] = 1;
            if (in->op == K_LOOP) scope[i] = stack[sp];
            break;
        case K_ENDLOOP:
        case K_ENDIF:
            if (sp == 0 || kinds[sp] != (in->op == K_ENDLOOP ? K_LOOP : K_IF)) {
                kir_v_fail(&v, i, "%s without its opening", kir_op_name(in->op));
                break;
            }
            open[stack[sp--]] = 0;
            break;
        case K_ACC:
            if (in->aop != K_ADD && in->aop != K_MAX && in->aop != K_MIN)
                kir_v_fail(&v, i, "accumulator combine op %s", kir_op_name(in->aop));
            if (t == KT_VOID || t == KT_BOOL) kir_v_fail(&v, i, "accumulator of type %s", kir_type_name(t));
            break;
        case K_ACCUM:
            if (k->inst[in->a[0]].op != K_ACC) kir_v_fail(&v, i, "accum into %%%d, not an accumulator", in->a[0]);
            else if (t0 != t1) kir_v_fail(&v, i, "accum of %s into %s", kir_type_name(t1), kir_type_name(t0));
            break;
        case K_LOAD:
        case K_STORE:
            if (in->buf < 0 || in->buf >= k->nbufs) {
                kir_v_fail(&v, i, "%s: no buffer p%d", kir_op_name(in->op), in->buf);
                break;
            }
            if (t0 != KT_I64) kir_v_fail(&v, i, "%s offset must be i64", kir_op_name(in->op));
            if (in->op == K_LOAD && t != kir_type_of(k->bufs[in->buf].dt))
                kir_v_fail(&v, i, "load of %s from a %s buffer", kir_type_name(t), dtype_name(k->bufs[in->buf].dt));
            if (in->op == K_STORE && t1 != kir_type_of(k->bufs[in->buf].dt))
                kir_v_fail(&v, i, "store of %s to a %s buffer", kir_type_name(t1), dtype_name(k->bufs[in->buf].dt));
            if (in->op == K_STORE && !k->bufs[in->buf].written) kir_v_fail(&v, i, "store to read-only p%d", in->buf);
            break;
        case K_IDIV:
        case K_IMOD:
            if (t != KT_I64 || t0 != KT_I64 || t1 != KT_I64) kir_v_fail(&v, i, "%s must be on i64", kir_op_name(in->op));
            break;
        case K_XOR:
        case K_SHR:
            if (t != KT_U64 || t0 != KT_U64 || t1 != KT_U64) kir_v_fail(&v, i, "%s must be on u64", kir_op_name(in->op));
            break;
        case K_AND:
        case K_OR:
            if (t != KT_BOOL || t0 != KT_BOOL || t1 != KT_BOOL) kir_v_fail(&v, i, "%s must be on bool", kir_op_name(in->op));
            break;
        case K_NOT:
            if (t != KT_BOOL || t0 != KT_BOOL) kir_v_fail(&v, i, "not must be on bool");
            break;
        case K_SELECT:
            if (t0 != KT_BOOL) kir_v_fail(&v, i, "select condition must be bool");
            if (t1 != t || t2 != t)
                kir_v_fail(&v, i, "select of %s and %s as %s", kir_type_name(t1), kir_type_name(t2), kir_type_name(t));
            break;
        case K_CAST:
            if (t == KT_VOID) kir_v_fail(&v, i, "cast to void");
            break;
        default:
            if (kir_is_compare(in->op)) {
                if (t != KT_BOOL || t0 != t1)
                    kir_v_fail(&v, i, "%s of %s and %s", kir_op_name(in->op), kir_type_name(t0), kir_type_name(t1));
            } else if (kir_is_binary(in->op)) {
                if (t0 != t || t1 != t)
                    kir_v_fail(&v, i, "%s of %s and %s as %s", kir_op_name(in->op), kir_type_name(t0), kir_type_name(t1),
                               kir_type_name(t));
                if ((in->op == K_POW || in->op == K_DIV) && !kir_type_is_float(t) && in->op == K_POW)
                    kir_v_fail(&v, i, "pow of %s", kir_type_name(t));
            } else if (kir_is_unary(in->op)) {
                if (t0 != t) kir_v_fail(&v, i, "%s of %s as %s", kir_op_name(in->op), kir_type_name(t0), kir_type_name(t));
                if (in->op != K_NEG && in->op != K_ABS && !kir_type_is_float(t))
                    kir_v_fail(&v, i, "%s of %s", kir_op_name(in->op), kir_type_name(t));
            }
            break;
        }
    }
    if (sp != 0) kir_v_fail(&v, n, "%d loops or ifs left open", sp);
    for (int i = 0; i < k->nbufs; i++)
        if (k->bufs[i].rank < 0 || k->bufs[i].rank > GRAPH_MAX_RANK)
            kir_v_fail(&v, 0, "buffer p%d has rank %d", i, k->bufs[i].rank);
    arena_free(&scratch);
    return v.problems;
}

/* ---- printing ------------------------------------------------------------------------------------- */

/* An operand: a constant inline, anything else %N. */
static void kir_print_operand(FILE *out, const Kernel *k, int a, Arena *ar) {
    const KInst *c = a >= 0 && a < k->n ? &k->inst[a] : NULL;
    if (!c || c->op != K_CONST) {
        fprintf(out, "%%%d", a);
        return;
    }
    if (kir_type_is_float(c->type)) fprintf(out, "%s", value_float_str(ar, c->f));
    else if (c->type == KT_BOOL) fprintf(out, "%s", c->i ? "true" : "false");
    else if (c->type == KT_U64) fprintf(out, "0x%" PRIx64, (uint64_t)c->i);
    else fprintf(out, "%" PRId64, c->i);
}

static const char *kir_accum_op(KOp aop) { return aop == K_ADD ? "+=" : aop == K_MAX ? "max=" : aop == K_MIN ? "min=" : "?="; }

void kir_print_body(FILE *out, const Kernel *k, int indent) {
    Arena scratch = {0};
    int depth = 0;
    for (int i = 0; i < k->n; i++) {
        const KInst *in = &k->inst[i];
        if (in->op == K_CONST) continue; /* printed where used */
        if (in->op == K_ENDLOOP || in->op == K_ENDIF) {
            depth--;
            fprintf(out, "%*s}\n", indent + 2 * depth, "");
            continue;
        }
        fprintf(out, "%*s", indent + 2 * depth, "");
        switch (in->op) {
        case K_GID: fprintf(out, "%%%d = gid : i64\n", i); break;
        case K_LOOP:
            fprintf(out, "%%%d = loop ", i);
            if (in->nin) kir_print_operand(out, k, in->a[0], &scratch);
            else fprintf(out, "%" PRId64, in->i);
            fprintf(out, " {\n");
            depth++;
            break;
        case K_IF:
            fprintf(out, "if ");
            kir_print_operand(out, k, in->a[0], &scratch);
            fprintf(out, " {\n");
            depth++;
            break;
        case K_ACC:
            fprintf(out, "%%%d = acc %s ", i, kir_op_name(in->aop));
            if (kir_type_is_float(in->type)) fprintf(out, "%s", value_float_str(&scratch, in->f));
            else fprintf(out, "%" PRId64, in->i);
            fprintf(out, " : %s\n", kir_type_name(in->type));
            break;
        case K_ACCUM: {
            const KInst *acc = in->a[0] >= 0 && in->a[0] < k->n ? &k->inst[in->a[0]] : in;
            fprintf(out, "%%%d %s ", in->a[0], kir_accum_op(acc->aop));
            kir_print_operand(out, k, in->a[1], &scratch);
            fprintf(out, "\n");
            break;
        }
        case K_LOAD:
            fprintf(out, "%%%d = load p%d[", i, in->buf);
            kir_print_operand(out, k, in->a[0], &scratch);
            fprintf(out, "] : %s\n", kir_type_name(in->type));
            break;
        case K_STORE:
            fprintf(out, "store p%d[", in->buf);
            kir_print_operand(out, k, in->a[0], &scratch);
            fprintf(out, "] = ");
            kir_print_operand(out, k, in->a[1], &scratch);
            fprintf(out, "\n");
            break;
        default:
            fprintf(out, "%%%d = %s ", i, kir_op_name(in->op));
            for (int j = 0; j < in->nin; j++) {
                if (j) fprintf(out, ", ");
                kir_print_operand(out, k, in->a[j], &scratch);
            }
            fprintf(out, " : %s\n", kir_type_name(in->type));
            break;
        }
    }
    arena_free(&scratch);
}

/* ---- attention's layout ------------------------------------------------------------------------ */

static void kir_print_view(FILE *out, const char *prefix, const char *what, const KView *v, const char *note) {
    fprintf(out, "%s  %-6s p%d + %" PRId64 "  strides [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]%s\n", prefix, what,
            v->param, v->offset, v->stride[0], v->stride[1], v->stride[2], v->stride[3], note);
}

void kir_print_attn(FILE *out, const KAttn *a, const char *prefix) {
    static const char *ops[] = {"forward", "backward of q", "backward of k", "backward of v", "backward of k and v"};
    fprintf(out,
            "%sattention %s: Z %" PRId64 ", heads %" PRId64 " (kv %" PRId64 "), T %" PRId64 ", S %" PRId64 ", D %" PRId64
            ", E %" PRId64 ", %s, scale %.9g, %s\n",
            prefix, ops[a->op], a->Z, a->H, a->Hk, a->T, a->S, a->D, a->E, a->causal ? "causal" : "not causal", a->scale,
            dtype_name(a->dt));
    kir_print_view(out, prefix, "q", &a->q, "");
    kir_print_view(out, prefix, "k", &a->k, "");
    kir_print_view(out, prefix, "v", &a->v, "");
    if (a->dout.param >= 0) kir_print_view(out, prefix, "dout", &a->dout, "");
    for (int i = 0; i < a->nout; i++) kir_print_view(out, prefix, a->op == KA_BWD_KV ? "dk" : "out", &a->out[i], "");
    for (int i = 0; i < a->nout_v; i++) kir_print_view(out, prefix, "dv", &a->out_v[i], "");
    if (a->stats.param >= 0) kir_print_view(out, prefix, "stats", &a->stats, a->op == KA_FORWARD ? " (m and l stored here)" : "");
    if (a->pos.param >= 0) kir_print_view(out, prefix, "pos", &a->pos, " (the document mask, i32 [Z, T])");
}

/* ---- scatter_add's operands -------------------------------------------------------------------- */

void kir_print_scatter(FILE *out, const KScatter *s, const char *prefix) {
    fprintf(out,
            "%sscatter_add: R %" PRId64 ", W %" PRId64 ", P %" PRId64 ", %s; out p%d, idx p%d + %" PRId64
            " (%s), upd p%d + %" PRId64 " (%s)\n",
            prefix, s->R, s->W, s->P, dtype_name(s->dt), s->out, s->idx, s->idx_off, dtype_name(s->idx_dt), s->upd, s->upd_off,
            dtype_name(s->upd_dt));
}

/* ---- fused LoRA ------------------------------------------------------------------------------------ */

void kir_print_lora(FILE *out, const KLora *l, const char *prefix) {
    fprintf(out,
            "%slora: S[rows, %" PRId64 "] = x p%d (ld %" PRId64 ") @ p%d%s (ld %" PRId64
            "), then C p%d = D p%d + %g * S @ p%d%s (ld %" PRId64 "); rows %" PRId64 " x batch %" PRId64 ", k %" PRId64
            ", n %" PRId64 "; S %s\n",
            prefix, l->r, l->x, l->ldx, l->a, l->trans_a ? "^T" : "", l->lda, l->c, l->d, l->alpha, l->b, l->trans_b ? "^T" : "",
            l->ldb, l->m, l->batch, l->k, l->n, l->s >= 0 ? "stored" : "in registers only");
    if (l->batch > 1)
        fprintf(out, "%s  batch strides: x %" PRId64 ", a %" PRId64 ", b %" PRId64 "\n", prefix, l->stride_x, l->stride_a,
                l->stride_b);
}

/* ---- cross-entropy's statistics ------------------------------------------------------------------ */

void kir_print_ce(FILE *out, const KCeStats *s, const char *prefix) {
    fprintf(out,
            "%sce_stats: rows %" PRId64 ", V %" PRId64 ", stride %" PRId64 ", %s; logits p%d + %" PRId64
            " (%s), targets p%d + %" PRId64 ", out p%d\n",
            prefix, s->rows, s->V, s->stride, dtype_name(s->dt), s->in, s->in_off, dtype_name(s->in_dt), s->tgt, s->tgt_off,
            s->out);
    if (s->grad >= 0)
        fprintf(out, "%sce_grad: p%d (%s, rows of %" PRId64 ", zero past %" PRId64 "%s), scale %.17g / %.17g\n", prefix, s->grad,
                dtype_name(s->grad_dt), s->gW, s->V, s->grad == s->in ? ", over the logits" : "", s->dloss, s->N);
}
