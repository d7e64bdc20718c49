/* fuse_kv.c - the paged KV cache's attention kernel as kernel IR (fuse_kv.h says what it
 * computes).
 *
 * Pipeline position: fusion's code generator. kv_emit_attn writes the body into a kernel the
 * caller made (cg_kv_attention, for a G_KV_ATTENTION of a schedule), kv_attn_kernel into one of
 * its own (tests/unit/test_cpu.c runs that against a reference). */
#include <math.h>
#include <string.h>

#include "diag.h"
#include "fuse_kv.h"

typedef struct KvB {
    KBuilder *b;
    const KvAttnShape *s;
    KType t; /* the arithmetic type: f32 (f16/bf16 computed in f32, as cpu.h says), f64 */
    int meta, pool;
} KvB;

static int ci(KvB *g, int64_t v) { return kb_const_i(g->b, KT_I64, v); }
static int op2(KvB *g, KOp op, KType t, int a, int b) { return kb_op(g->b, op, t, 2, a, b, 0); }
static int iadd(KvB *g, int a, int b) { return op2(g, K_ADD, KT_I64, a, b); }
static int imul(KvB *g, int a, int b) { return op2(g, K_MUL, KT_I64, a, b); }
static int as(KvB *g, int v, KType t) { return kb_type(g->b, v) == t ? v : kb_op(g->b, K_CAST, t, 1, v, 0, 0); }

int64_t kv_meta_numel(int64_t N, int64_t max_blocks) { return N * (KV_META_TABLE + max_blocks); }

/* Element (head, row, col) of view v. */
static int view_load(KvB *g, const KView *v, int head, int row, int col) {
    int o = ci(g, v->offset);
    o = iadd(g, o, imul(g, head, ci(g, v->stride[1])));
    o = iadd(g, o, imul(g, row, ci(g, v->stride[2])));
    o = iadd(g, o, imul(g, col, ci(g, v->stride[3])));
    return kb_load(g->b, v->param, o);
}

static int view_off(KvB *g, const KView *v, int head, int row, int col) {
    int o = ci(g, v->offset);
    o = iadd(g, o, imul(g, head, ci(g, v->stride[1])));
    o = iadd(g, o, imul(g, row, ci(g, v->stride[2])));
    return iadd(g, o, imul(g, col, ci(g, v->stride[3])));
}

/* The pool's element (slot, this layer, which = 0 key / 1 value, kv head, col). */
static int pool_off(KvB *g, int slot, int which, int kh, int col) {
    const KvAttnShape *s = g->s;
    int64_t per_slot = s->L * 2 * s->Hk * s->D, base = s->pool_off + (s->layer * 2 + which) * s->Hk * s->D;
    return iadd(g, iadd(g, ci(g, base), imul(g, slot, ci(g, per_slot))), iadd(g, imul(g, kh, ci(g, s->D)), col));
}

static int meta(KvB *g, int field, int t) { return as(g, kb_load(g->b, g->meta, iadd(g, ci(g, field * g->s->N), t)), KT_I64); }

/* Position j's slot, through the table row of sequence seq. */
static int slot_of(KvB *g, int seq, int j) {
    const KvAttnShape *s = g->s;
    int at = iadd(g, ci(g, KV_META_TABLE * s->N),
                  iadd(g, imul(g, seq, ci(g, s->max_blocks)), op2(g, K_IDIV, KT_I64, j, ci(g, s->block))));
    int blk = as(g, kb_load(g->b, g->meta, at), KT_I64);
    return iadd(g, imul(g, blk, ci(g, s->block)), op2(g, K_IMOD, KT_I64, j, ci(g, s->block)));
}

/* A source value as the pool holds it: rounded to kv_dt, in the arithmetic type. */
static int as_kv(KvB *g, int v) { return as(g, as(g, v, kir_type_of(g->s->kv_dt)), g->t); }

/* Key or value element c of position j: from the pool (slot >= 0) or the sources (row >= 0). */
typedef struct KvKey {
    int from_pool; /* 1: slot; 0: row */
    int at;        /* the slot or the source row */
} KvKey;

static int key_elem(KvB *g, KvKey key, int which, int kh, int c) {
    if (key.from_pool) return as(g, kb_load(g->b, g->pool, pool_off(g, key.at, which, kh, c)), g->t);
    return as_kv(g, view_load(g, which ? &g->s->v : &g->s->k, kh, key.at, c));
}

/* scale * sum_c q(h, t, c) * key(c), summed in c's order as cg_attn_dot sums. */
static int score(KvB *g, int h, int t, KvKey key, int kh) {
    int acc = kb_acc(g->b, g->t, K_ADD, 0.0);
    int c = kb_loop(g->b, g->s->D);
    int q = as(g, view_load(g, &g->s->q, h, t, c), g->t);
    kb_accum(g->b, acc, op2(g, K_MUL, g->t, q, key_elem(g, key, 0, kh, c)));
    kb_endloop(g->b);
    return op2(g, K_MUL, g->t, kb_const_f(g->b, g->t, g->s->scale), acc);
}

/* The keys 0 .. cnt-1 in order: [0, ncached) from the pool, [ncached, cnt) from the sources. The
 * callback runs once per key inside the loop. */
typedef void (*KvEach)(KvB *g, KvKey key, void *ctx);

static void each_key(KvB *g, int seq, int t, int pos, int ncached, int cnt, KvEach fn, void *ctx) {
    int j = kb_loop_dyn(g->b, ncached);
    fn(g, (KvKey){1, slot_of(g, seq, j)}, ctx);
    kb_endloop(g->b);
    int j2 = kb_loop_dyn(g->b, op2(g, K_SUB, KT_I64, cnt, ncached));
    int jj = iadd(g, ncached, j2);                                      /* the position */
    fn(g, (KvKey){0, iadd(g, op2(g, K_SUB, KT_I64, t, pos), jj)}, ctx); /* its row: t - pos + j */
    kb_endloop(g->b);
}

typedef struct KvRow {
    int h, t, kh, m, sum, out_param;
} KvRow;

static void max_pass(KvB *g, KvKey key, void *ctx) {
    KvRow *r = ctx;
    kb_accum(g->b, r->m, score(g, r->h, r->t, key, r->kh));
}

static void sum_pass(KvB *g, KvKey key, void *ctx) {
    KvRow *r = ctx;
    const KvAttnShape *s = g->s;
    int p = kb_op(g->b, K_EXP, g->t, 1, op2(g, K_SUB, g->t, score(g, r->h, r->t, key, r->kh), r->m), 0, 0);
    kb_accum(g->b, r->sum, p);
    KType ot = kir_type_of(s->dt);
    int c = kb_loop(g->b, s->D);
    int at = view_off(g, &s->out, r->h, r->t, c);
    int cur = as(g, kb_load(g->b, s->out.param, at), g->t);
    kb_store(g->b, s->out.param, at, as(g, op2(g, K_ADD, g->t, cur, op2(g, K_MUL, g->t, p, key_elem(g, key, 1, r->kh, c))), ot));
    kb_endloop(g->b);
}

const char *kv_shape_problem(const KvAttnShape *s) {
    if (s->N < 1 || s->H < 1 || s->Hk < 1 || s->D < 1 || s->block < 1 || s->max_blocks < 1 || s->L < 1)
        return "a size is not positive";
    if (s->layer < 0 || s->layer >= s->L) return "the layer is out of range";
    if (s->H % s->Hk) return "the query heads are not a multiple of the key/value heads";
    if (s->kv_dt != DT_F32 && s->kv_dt != DT_BF16 && s->kv_dt != DT_F16) return "the pool's dtype is not f32, bf16 or f16";
    if (s->dt != DT_F32 && s->dt != DT_F64 && s->dt != DT_BF16 && s->dt != DT_F16) return "q, k and v are not floats";
    return NULL;
}

void kv_emit_attn(KBuilder *b, Kernel *k, const KvAttnShape *s, int meta_param, int pool_param) {
    const char *why = kv_shape_problem(s);
    if (why) INTERNAL("kv attention %s: %s", k->name ? k->name : "?", why);
    KvB g = {.b = b, .s = s, .t = s->dt == DT_F64 ? KT_F64 : KT_F32, .meta = meta_param, .pool = pool_param};
    k->grid = s->N * s->H;
    KKvAttn *d = arena_alloc(kb_arena(b), sizeof *d);
    *d = *s;
    d->meta = meta_param, d->pool = pool_param;
    k->kv = d;
    KType ot = kir_type_of(s->dt), kt = kir_type_of(s->kv_dt);
    int gid = kb_gid(b);
    int t = op2(&g, K_IDIV, KT_I64, gid, ci(&g, s->H));
    int h = op2(&g, K_IMOD, KT_I64, gid, ci(&g, s->H));
    int64_t G = s->H / s->Hk;
    int kh = op2(&g, K_IDIV, KT_I64, h, ci(&g, G));
    int c = kb_loop(b, s->D); /* zeros first: a padding row stays zero */
    kb_store(b, s->out.param, view_off(&g, &s->out, h, t, c), as(&g, kb_const_f(b, g.t, 0.0), ot));
    kb_endloop(b);
    int seq = meta(&g, KV_META_SEQ, t);
    kb_if(b, op2(&g, K_GE, KT_BOOL, seq, ci(&g, 0)));
    int pos = meta(&g, KV_META_POS, t), start = meta(&g, KV_META_START, t);
    kb_if(b, op2(&g, K_EQ, KT_BOOL, op2(&g, K_IMOD, KT_I64, h, ci(&g, G)), ci(&g, 0))); /* this row's key and value */
    int slot = meta(&g, KV_META_SLOT, t);
    c = kb_loop(b, s->D);
    kb_store(b, pool_param, pool_off(&g, slot, 0, kh, c), as(&g, view_load(&g, &s->k, kh, t, c), kt));
    kb_store(b, pool_param, pool_off(&g, slot, 1, kh, c), as(&g, view_load(&g, &s->v, kh, t, c), kt));
    kb_endloop(b);
    kb_endif(b);
    int cnt = iadd(&g, pos, ci(&g, 1)); /* keys 0 .. pos */
    KvRow r = {.h = h, .t = t, .kh = kh};
    r.m = kb_acc(b, g.t, K_MAX, -INFINITY);
    each_key(&g, seq, t, pos, start, cnt, max_pass, &r);
    r.sum = kb_acc(b, g.t, K_ADD, 0.0);
    each_key(&g, seq, t, pos, start, cnt, sum_pass, &r);
    c = kb_loop(b, s->D);
    int at = view_off(&g, &s->out, h, t, c);
    kb_store(b, s->out.param, at, as(&g, op2(&g, K_DIV, g.t, as(&g, kb_load(b, s->out.param, at), g.t), r.sum), ot));
    kb_endloop(b);
    kb_endif(b);
}

Kernel *kv_attn_kernel(Arena *ar, const char *name, const KvAttnShape *s, int nsrc, const int64_t *src_numel, int64_t pool_numel,
                       int64_t out_numel) {
    Kernel *k = kir_new(ar, name, KK_ATTENTION, 1);
    KBuilder *b = kb_new(ar, k);
    for (int i = 0; i < nsrc; i++) kb_buf(b, i, -1, -1, s->dt, 1, &src_numel[i], 0);
    int64_t mn = kv_meta_numel(s->N, s->max_blocks);
    int meta = kb_buf(b, nsrc, -1, -1, DT_I32, 1, &mn, 0);
    int pool = kb_buf(b, nsrc + 1, -1, -1, s->kv_dt, 1, &pool_numel, 1);
    int out = kb_buf(b, nsrc + 2, -1, -1, s->dt, 1, &out_numel, 1);
    KvAttnShape sh = *s;
    sh.out.param = out;
    kv_emit_attn(b, k, &sh, meta, pool);
    kir_finish(k);
    return k;
}
