/* fuse_kv.c - the paged KV cache's kernels as kernel IR (fuse_kv.h says what they compute).
 *
 * Pipeline position: fusion's code generator; the kernels are built from a KvAttnShape alone
 * (no fused graph), so tests/unit/test_cpu.c runs them on their own against a reference, and a
 * schedule's launches bind their buffer parameters. */
#include <math.h>
#include <string.h>

#include "diag.h"
#include "fuse_kv.h"

typedef struct KvB {
    KBuilder *b;
    KType t; /* the arithmetic type: f32 (f16/bf16 computed in f32, as cpu.h says) */
} KvB;

static int ci(KvB *g, int64_t v) { return kb_const_i(g->b, KT_I64, v); }
static int op2(KvB *g, KOp op, KType t, int a, int b) { return kb_op(g->b, op, t, 2, a, b, 0); }
static int iadd(KvB *g, int a, int b) { return op2(g, K_ADD, KT_I64, a, b); }
static int imul(KvB *g, int a, int b) { return op2(g, K_MUL, KT_I64, a, b); }
static int as(KvB *g, int v, KType t) { return kb_type(g->b, v) == t ? v : kb_op(g->b, K_CAST, t, 1, v, 0, 0); }

/* The element offset of (head, row, col) in view v. */
static int view_at(KvB *g, const KView *v, int head, int row, int col) {
    int o = ci(g, v->offset);
    o = iadd(g, o, imul(g, head, ci(g, v->stride[1])));
    o = iadd(g, o, imul(g, row, ci(g, v->stride[2])));
    return iadd(g, o, imul(g, col, ci(g, v->stride[3])));
}

/* The element offset of (slot, kv head, col) in a [slots, Hk, D] pool. */
static int pool_at(KvB *g, const KvAttnShape *s, int slot, int kh, int col) {
    return iadd(g, imul(g, iadd(g, imul(g, slot, ci(g, s->Hk)), kh), ci(g, s->D)), col);
}

static void add_sources(KBuilder *b, const KvAttnShape *s) {
    for (int i = 0; i < s->nsrc; i++) kb_buf(b, i, -1, -1, s->dt, 1, &s->src_numel[i], 0);
}

const char *kv_shape_problem(const KvAttnShape *s) {
    if (s->N < 1 || s->H < 1 || s->Hk < 1 || s->D < 1 || s->block < 1 || s->seqs < 1 || s->max_blocks < 1 || s->slots < 1)
        return "a size is not positive";
    if (s->H % s->Hk) return "the query heads are not a multiple of the key/value heads";
    if (s->kv_dt != DT_F32 && s->kv_dt != DT_BF16) return "the pool's dtype is neither f32 nor bf16";
    if (s->nsrc < 1 || s->nsrc > 3) return "one to three source buffers";
    const KView *v[3] = {&s->q, &s->k, &s->v};
    for (int i = 0; i < 3; i++)
        if (v[i]->param < 0 || v[i]->param >= s->nsrc) return "a view names no source buffer";
    return NULL;
}

static Kernel *kv_begin(Arena *ar, const char *name, const KvAttnShape *s, int64_t grid, KvB *g) {
    const char *why = kv_shape_problem(s);
    if (why) INTERNAL("kv kernel %s: %s", name, why);
    Kernel *k = kir_new(ar, name, KK_ATTENTION, grid);
    g->b = kb_new(ar, k);
    g->t = s->dt == DT_F64 ? KT_F64 : KT_F32;
    add_sources(g->b, s);
    return k;
}

Kernel *kv_write_kernel(Arena *ar, const char *name, const KvAttnShape *s) {
    KvB g;
    Kernel *k = kv_begin(ar, name, s, s->N * s->Hk, &g);
    int64_t pool[3] = {s->slots, s->Hk, s->D};
    int pslot = kb_buf(g.b, s->nsrc + KV_W_SLOT, -1, -1, DT_I32, 1, &s->N, 0);
    int pk = kb_buf(g.b, s->nsrc + KV_W_KPOOL, -1, -1, s->kv_dt, 3, pool, 1);
    int pv = kb_buf(g.b, s->nsrc + KV_W_VPOOL, -1, -1, s->kv_dt, 3, pool, 1);
    KType kt = kir_type_of(s->kv_dt);
    int gid = kb_gid(g.b);
    int t = op2(&g, K_IDIV, KT_I64, gid, ci(&g, s->Hk));
    int kh = op2(&g, K_IMOD, KT_I64, gid, ci(&g, s->Hk));
    int slot = as(&g, kb_load(g.b, pslot, t), KT_I64);
    kb_if(g.b, op2(&g, K_GE, KT_BOOL, slot, ci(&g, 0)));
    int c = kb_loop(g.b, s->D);
    int dst = pool_at(&g, s, slot, kh, c);
    kb_store(g.b, pk, dst, as(&g, kb_load(g.b, s->k.param, view_at(&g, &s->k, kh, t, c)), kt));
    kb_store(g.b, pv, dst, as(&g, kb_load(g.b, s->v.param, view_at(&g, &s->v, kh, t, c)), kt));
    kb_endloop(g.b);
    kb_endif(g.b);
    kir_finish(k);
    return k;
}

/* The slot of position j of the sequence whose block table row starts at element `row0`. */
static int slot_of(KvB *g, const KvAttnShape *s, int ptab, int row0, int j) {
    int blk = as(g, kb_load(g->b, ptab, iadd(g, row0, op2(g, K_IDIV, KT_I64, j, ci(g, s->block)))), KT_I64);
    return iadd(g, imul(g, blk, ci(g, s->block)), op2(g, K_IMOD, KT_I64, j, ci(g, s->block)));
}

/* scale * sum_c q(h, t, c) * key(slot, kh, c), summed in c's order as cg_attn_dot sums. */
static int score(KvB *g, const KvAttnShape *s, int pk, int h, int t, int slot, int kh) {
    int acc = kb_acc(g->b, g->t, K_ADD, 0.0);
    int c = kb_loop(g->b, s->D);
    int q = as(g, kb_load(g->b, s->q.param, view_at(g, &s->q, h, t, c)), g->t);
    int kv = as(g, kb_load(g->b, pk, pool_at(g, s, slot, kh, c)), g->t);
    kb_accum(g->b, acc, op2(g, K_MUL, g->t, q, kv));
    kb_endloop(g->b);
    return op2(g, K_MUL, g->t, kb_const_f(g->b, g->t, s->scale), acc);
}

Kernel *kv_attn_kernel(Arena *ar, const char *name, const KvAttnShape *s) {
    KvB g;
    Kernel *k = kv_begin(ar, name, s, s->N * s->H, &g);
    int64_t pool[3] = {s->slots, s->Hk, s->D}, table = s->seqs * s->max_blocks;
    int pk = kb_buf(g.b, s->nsrc + KV_A_KPOOL, -1, -1, s->kv_dt, 3, pool, 0);
    int pv = kb_buf(g.b, s->nsrc + KV_A_VPOOL, -1, -1, s->kv_dt, 3, pool, 0);
    int ppos = kb_buf(g.b, s->nsrc + KV_A_POS, -1, -1, DT_I32, 1, &s->N, 0);
    int pseq = kb_buf(g.b, s->nsrc + KV_A_SEQ, -1, -1, DT_I32, 1, &s->N, 0);
    int ptab = kb_buf(g.b, s->nsrc + KV_A_TABLE, -1, -1, DT_I32, 1, &table, 0);
    int pout = kb_buf(g.b, s->nsrc + KV_A_OUT, -1, -1, s->dt, 1, &s->out_numel, 1);
    KType ot = kir_type_of(s->dt);
    int gid = kb_gid(g.b);
    int t = op2(&g, K_IDIV, KT_I64, gid, ci(&g, s->H));
    int h = op2(&g, K_IMOD, KT_I64, gid, ci(&g, s->H));
    int kh = op2(&g, K_IDIV, KT_I64, h, ci(&g, s->H / s->Hk));
    int seq = as(&g, kb_load(g.b, pseq, t), KT_I64);
    int c = kb_loop(g.b, s->D); /* zeros first: a padding row stays zero */
    kb_store(g.b, pout, view_at(&g, &s->out, h, t, c), as(&g, kb_const_f(g.b, g.t, 0.0), ot));
    kb_endloop(g.b);
    kb_if(g.b, op2(&g, K_GE, KT_BOOL, seq, ci(&g, 0)));
    int row0 = imul(&g, seq, ci(&g, s->max_blocks));
    int cnt = iadd(&g, as(&g, kb_load(g.b, ppos, t), KT_I64), ci(&g, 1)); /* keys 0 .. pos */
    int m = kb_acc(g.b, g.t, K_MAX, -INFINITY);
    int j = kb_loop_dyn(g.b, cnt);
    kb_accum(g.b, m, score(&g, s, pk, h, t, slot_of(&g, s, ptab, row0, j), kh));
    kb_endloop(g.b);
    int sum = kb_acc(g.b, g.t, K_ADD, 0.0);
    j = kb_loop_dyn(g.b, cnt);
    int slot = slot_of(&g, s, ptab, row0, j);
    int p = kb_op(g.b, K_EXP, g.t, 1, op2(&g, K_SUB, g.t, score(&g, s, pk, h, t, slot, kh), m), 0, 0);
    kb_accum(g.b, sum, p);
    c = kb_loop(g.b, s->D);
    int at = view_at(&g, &s->out, h, t, c);
    int vv = as(&g, kb_load(g.b, pv, pool_at(&g, s, slot, kh, c)), g.t);
    int cur = as(&g, kb_load(g.b, pout, at), g.t);
    kb_store(g.b, pout, at, as(&g, op2(&g, K_ADD, g.t, cur, op2(&g, K_MUL, g.t, p, vv)), ot));
    kb_endloop(g.b);
    kb_endloop(g.b);
    c = kb_loop(g.b, s->D);
    at = view_at(&g, &s->out, h, t, c);
    kb_store(g.b, pout, at, as(&g, op2(&g, K_DIV, g.t, as(&g, kb_load(g.b, pout, at), g.t), sum), ot));
    kb_endloop(g.b);
    kb_endif(g.b);
    kir_finish(k);
    return k;
}
