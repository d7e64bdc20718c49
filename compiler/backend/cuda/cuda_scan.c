/* cuda_scan.c - the CUDA back end's scan of a generic kernel (cuda_internal.h, CudaPlan): what
 * cuda.c's emission writes is decided here, before a line of CUDA C. For one Kernel: which top-level
 * loops split across a warp's lanes or a block's threads, the launch's mode and geometry
 * (cuda_launch_for), vectorisation (4 work items a thread), the integer ranges that let offsets be
 * computed in 32 bits, and the select arms written inside an if/else so that only the taken one runs.
 *
 * Pipeline position: fuse -> kir -> cuda [scan -> emission, cuda.c] -> nvrtc. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"
#include "diag.h"

/* ---- the scan: which loops split, the geometry, vectorisation ------------------------------- */

/* 1 when buffer parameters p and q are bound to one schedule buffer, or are the same parameter. */
static int cuda_same_buffer(const Kernel *k, int p, int q) { return p == q || k->bufs[p].buffer == k->bufs[q].buffer; }

/* Does [from, to) both load and store one buffer? */
static int cuda_loads_what_it_stores(const Kernel *k, int from, int to) {
    for (int i = from; i < to; i++) {
        if (k->inst[i].op != K_STORE) continue;
        for (int j = from; j < to; j++)
            if (k->inst[j].op == K_LOAD && cuda_same_buffer(k, k->inst[i].buf, k->inst[j].buf)) return 1;
    }
    return 0;
}

/* Whether every buffer the kernel stores to is loaded only before its first store, in the body's
 * order: vectorised, such a buffer (the optimizer update's parameters and state written over their
 * old values: fuse.c's fz_update_in_place) is read into its vector before any lane writes a lane
 * of it, and each lane reads its own element before it writes it. */
static int cuda_loads_before_stores(const Kernel *k) {
    for (int i = 0; i < k->n; i++) {
        if (k->inst[i].op != K_STORE) continue;
        for (int j = i + 1; j < k->n; j++)
            if (k->inst[j].op == K_LOAD && cuda_same_buffer(k, k->inst[i].buf, k->inst[j].buf)) return 0;
    }
    return 1;
}

/* Rows (query rows, or key rows for dk and dv) a block of an attention template takes at a time,
 * and the static shared memory it declares: rt_attention.cuh's MbtAttnRows and tiles, or
 * rt_attention_tc.cuh's (16 rows a warp; its tiles in the element type, f32 scores). */
static int cuda_attention_rows(const Kernel *k) {
    const KAttn *a = k->attn;
    if (cuda_kernel_uses_attention(k) >= CUDA_ATTN_TENSOR_CORES) return 16 * 4;
    if (cuda_attention_f32_tiled(k)) { /* rt_attention.cuh's MbtAttnF32t::BQ (forward), MbtAttnF32tB::BR */
        if (a->op == KA_FORWARD) return a->D > 64 ? 32 : 64;
        return a->D + a->E > 128 ? 16 : a->D + a->E > 64 ? 32 : 64;
    }
    return (a->D + a->E > 192 ? 2 : 4) * 4;
}

static int cuda_attention_shared(const Kernel *k) {
    const KAttn *a = k->attn;
    if (cuda_kernel_uses_attention(k) == CUDA_ATTN_FA2) { /* two buffers of BK rows of two operands, pitches D + 8,
                                                              E + 8; dk and dv add two of BK rows' statistics */
        int64_t bk = a->D + a->E > 128 ? 32 : 64, by_key = a->op != KA_FORWARD && a->op != KA_BWD_Q;
        /* the document mask: the block's first key (8 B); dk and dv: each query row's first key in
           two tiles and a long long a thread for the scan */
        int64_t docs = a->pos.param < 0 ? 0 : by_key ? 8 * (2 * bk + 128) : 8;
        return (int)(2 * 2 * bk * (a->D + 8 + a->E + 8) + (by_key ? 2 * bk * 3 * 4 : 0) + docs);
    }
    if (cuda_kernel_uses_attention(k) == CUDA_ATTN_TENSOR_CORES) { /* 2-byte tiles, f32 scratch (pitches as there) */
        int64_t qp = a->D + 8, vp = a->E + 8, pp = 32 + 8, scratch = 4 * 4 * 16 * (32 + 4);
        int want_k = a->op != KA_BWD_V, want_v = a->op != KA_BWD_K;
        switch (a->op) {
        case KA_FORWARD:
            return (int)(2 * (64 * qp + 32 * qp + 32 * vp + 4 * 16 * pp) + 4 * (4 * 16 * ((a->E > 32 ? a->E : 32) + 4) + 4 * 16));
        case KA_BWD_Q: return (int)(2 * (64 * qp + 64 * vp + 32 * qp + 32 * vp + 4 * 16 * pp) + scratch);
        default: /* k rows, v rows (for dk), q, dout, P^T (for dv), dS^T (for dk), stats */
            return (int)(2 * (64 * qp + (want_k ? 64 : 16) * vp + 32 * qp + 32 * vp + (want_v ? 4 : 1) * 16 * pp +
                              (want_k ? 4 : 1) * 16 * pp) +
                         4 * 32 * 3 + scratch);
        }
    }
    if (cuda_attention_f32_tiled(k)) { /* rt_attention.cuh's tiles (MbtAttnF32t, MbtAttnF32tB) */
        int64_t br = cuda_attention_rows(k), bt = a->D + a->E > 128 ? 16 : 32, d1 = a->D + 1, e1 = a->E + 1;
        int want_k = a->op != KA_BWD_V, want_v = a->op != KA_BWD_K;
        switch (a->op) {
        case KA_FORWARD: return (int)(4 * (br * d1 + bt * d1 + bt * e1 + br * (bt + 1)));   /* qs, ks, vs, ps */
        case KA_BWD_Q: return (int)(4 * (br * (d1 + e1) + bt * (d1 + e1) + br * (bt + 1))); /* qs, dos, ks, vs, ws */
        default: /* kr, vr (for dk), qs, dos, st, pw (for dv), dw (for dk) */
            return (int)(4 * (br * d1 + (want_k ? br : 1) * e1 + bt * (d1 + e1) + bt * 3 +
                              ((want_v ? br : 1) + (want_k ? br : 1)) * (bt + 1)));
        }
    }
    int64_t rows = cuda_attention_rows(k), tile = 32 * (a->D + 1) + 32 * (a->E + 1), slots = rows * 32;
    switch (a->op) {
    case KA_FORWARD: return (int)(4 * (rows * a->D + tile + slots));
    case KA_BWD_Q: return (int)(4 * (rows * (a->D + a->E) + tile + slots));
    default: { /* rt_attention.cuh's mbt_attn_bwd_kv: k rows, v rows (for dk), q, dout, stats, slots */
        int want_k = a->op != KA_BWD_V, want_v = a->op != KA_BWD_K;
        return (int)(4 * (rows * a->D + (want_k ? rows * a->E : rows) + tile + 32 * 3 + (want_k ? slots : 32) +
                          (want_v ? slots : 32)));
    }
    }
}

/* The segmented scatter_add's geometry: a block per group of CUDA_SCATTER_ROWS(R) consecutive
 * output rows, at most CUDA_SCATTER_GROUPS groups (every block reads all P indices, from L2: the
 * groups trade that against filling the GPU). */
int64_t cuda_scatter_rows(const KScatter *s) { return (s->R + CUDA_SCATTER_GROUPS - 1) / CUDA_SCATTER_GROUPS; }

/* ---- the scan: integer ranges, 32-bit index arithmetic ---------------------------------------- */

/* Index arithmetic is i64 in the KIR, and 64-bit integer work is several instructions a step on
 * the GPU (an add two, a multiply three or more, a min/max four, a division by a constant a
 * 64-bit multiply-high): an elementwise kernel reading through transposes and concatenations
 * (GPT-2's attention backward joining dq, dk and dv: ~30 such operations an element) was bound by
 * them, not by memory. So every i64 value whose every possible value provably fits in 32 bits is
 * computed in an `int`: the ranges come by interval arithmetic from gid in [0, grid), each loop
 * counter in [0, extent), the constants, the divisions and remainders by positive constants (the
 * KIR's IDIV/IMOD have operands >= 0), min, max, select and the casts from i32 and bool. Anything
 * else (a load's value, an accumulator, a float's truncation, a u64 hash word, an interval that
 * would overflow 64 bits) has no range and stays 64-bit, as does everything computed from it: an
 * `int` result is exact because the 64-bit result it replaces is the same number. A value is
 * narrowed only when its operands are narrow too (or constants, gid, a counter, all in range),
 * so its 32-bit arithmetic never wraps; a 64-bit value reads a narrowed operand widened. */
static int cuda_fits32(const CudaPlan *P, int id) { return P->known[id] && P->lo[id] >= INT32_MIN && P->hi[id] <= INT32_MAX; }

static void cuda_range_set(CudaPlan *P, int id, int64_t lo, int64_t hi) {
    P->known[id] = 1;
    P->lo[id] = lo;
    P->hi[id] = hi;
}

/* [lo, hi] of x op y over the corners (add, sub, mul), 0 on overflow. */
static int cuda_range_corners(KOp op, const int64_t x[2], const int64_t y[2], int64_t *lo, int64_t *hi) {
    int64_t v[4];
    for (int c = 0; c < 4; c++) {
        int64_t a = x[c >> 1], b = y[c & 1];
        int bad = op == K_ADD   ? __builtin_add_overflow(a, b, &v[c])
                  : op == K_SUB ? __builtin_sub_overflow(a, b, &v[c])
                                : __builtin_mul_overflow(a, b, &v[c]);
        if (bad) return 0;
    }
    *lo = *hi = v[0];
    for (int c = 1; c < 4; c++) {
        if (v[c] < *lo) *lo = v[c];
        if (v[c] > *hi) *hi = v[c];
    }
    return 1;
}

static void cuda_ranges(const Kernel *k, CudaPlan *P, Arena *ar) {
    size_t n = (size_t)k->n + 1;
    P->known = arena_alloc(ar, n);
    P->narrow = arena_alloc(ar, n);
    P->ctx32 = arena_alloc(ar, n);
    P->lo = arena_alloc(ar, sizeof(int64_t) * n);
    P->hi = arena_alloc(ar, sizeof(int64_t) * n);
    memset(P->known, 0, n);
    memset(P->narrow, 0, n);
    memset(P->ctx32, 0, n);
    for (int i = 0; i < k->n; i++) {
        const KInst *in = &k->inst[i];
        KType t = in->type;
        if (t != KT_I64 && t != KT_I32 && t != KT_BOOL) continue;
        int a0 = in->nin > 0 ? in->a[0] : -1, a1 = in->nin > 1 ? in->a[1] : -1;
        int k0 = a0 >= 0 && P->known[a0], k1 = a1 >= 0 && P->known[a1];
        int64_t x[2] = {k0 ? P->lo[a0] : 0, k0 ? P->hi[a0] : 0}, y[2] = {k1 ? P->lo[a1] : 0, k1 ? P->hi[a1] : 0}, lo, hi;
        switch (in->op) {
        case K_CONST:
            if (t != KT_BOOL) cuda_range_set(P, i, in->i, in->i);
            break;
        case K_GID: /* a ranged kernel's [lo, hi) lies within [0, grid) */
            if (k->grid >= 1) cuda_range_set(P, i, 0, k->grid - 1);
            break;
        case K_LOOP: /* the counter, in [0, extent) (a loop that does not run: no value at all) */
            if (!in->nin) cuda_range_set(P, i, 0, in->i > 0 ? in->i - 1 : 0);
            else if (k0) cuda_range_set(P, i, 0, x[1] > 0 ? x[1] - 1 : 0);
            break;
        case K_ADD:
        case K_SUB:
        case K_MUL:
            if (t != KT_BOOL && k0 && k1 && cuda_range_corners(in->op, x, y, &lo, &hi)) cuda_range_set(P, i, lo, hi);
            break;
        case K_MAX:
        case K_MIN:
            if (t != KT_BOOL && k0 && k1) {
                int mx = in->op == K_MAX;
                cuda_range_set(P, i, mx ? (x[0] > y[0] ? x[0] : y[0]) : (x[0] < y[0] ? x[0] : y[0]),
                               mx ? (x[1] > y[1] ? x[1] : y[1]) : (x[1] < y[1] ? x[1] : y[1]));
            }
            break;
        case K_IDIV:
        case K_IMOD: /* by a positive constant, of a value >= 0 */
            if (k0 && x[0] >= 0 && k->inst[a1].op == K_CONST && k->inst[a1].i > 0) {
                int64_t c = k->inst[a1].i;
                if (in->op == K_IDIV) cuda_range_set(P, i, x[0] / c, x[1] / c);
                else if (x[1] < c) cuda_range_set(P, i, x[0], x[1]);
                else cuda_range_set(P, i, 0, c - 1);
            }
            break;
        case K_NEG:
            if (t != KT_BOOL && k0 && x[0] > INT64_MIN) cuda_range_set(P, i, -x[1], -x[0]);
            break;
        case K_ABS:
            if (t != KT_BOOL && k0 && x[0] > INT64_MIN) {
                if (x[0] >= 0) cuda_range_set(P, i, x[0], x[1]);
                else cuda_range_set(P, i, 0, -x[0] > x[1] ? -x[0] : x[1]);
            }
            break;
        case K_SELECT: {
            int a2 = in->a[2];
            if (t != KT_BOOL && P->known[a1] && P->known[a2])
                cuda_range_set(P, i, P->lo[a1] < P->lo[a2] ? P->lo[a1] : P->lo[a2],
                               P->hi[a1] > P->hi[a2] ? P->hi[a1] : P->hi[a2]);
            break;
        }
        case K_CAST: {
            KType from = k->inst[a0].type;
            if (t == KT_BOOL) break;
            if (from == KT_BOOL) cuda_range_set(P, i, 0, 1);
            else if (from == KT_I32) cuda_range_set(P, i, k0 ? x[0] : INT32_MIN, k0 ? x[1] : INT32_MAX);
            else if (from == KT_I64 && k0 && (t == KT_I64 || (x[0] >= INT32_MIN && x[1] <= INT32_MAX)))
                cuda_range_set(P, i, x[0], x[1]);
            break;
        }
        case K_LOAD: /* an i32 buffer's elements are i32s */
            if (t == KT_I32) cuda_range_set(P, i, INT32_MIN, INT32_MAX);
            break;
        default: break; /* accumulators, u64 words, floats' truncations: no range */
        }
        if (t == KT_I32 && P->known[i] && (P->lo[i] < INT32_MIN || P->hi[i] > INT32_MAX)) /* i32 arithmetic wraps */
            cuda_range_set(P, i, INT32_MIN, INT32_MAX);
    }
    /* which i64 values are narrowed, and which instructions read their i64 operands in 32 bits.
     * Not a value that varies with a loop's counter: an offset affine in the counter is
     * strength-reduced in 64 bits (one pointer, immediate offsets: a column sum's loads), which a
     * sign extension of an int offset at each access defeats (measured in the SASS of GPT-2's
     * LayerNorm weight-gradient sums: 116 instructions a loop became 215). */
    unsigned char *in_loop = arena_alloc(ar, n);
    for (int i = 0; i < k->n; i++) {
        const KInst *in = &k->inst[i];
        in_loop[i] = in->op == K_LOOP;
        for (int a = 0; a < in->nin; a++) in_loop[i] |= in_loop[in->a[a]];
    }
    for (int i = 0; i < k->n; i++) {
        const KInst *in = &k->inst[i];
        int ops = 1, any = 0;
        for (int a = 0; a < in->nin; a++) {
            if (k->inst[in->a[a]].type != KT_I64) continue;
            any = 1;
            ops &= cuda_fits32(P, in->a[a]);
        }
        if (in->type == KT_I64) {
            int arith = (in->op >= K_ADD && in->op <= K_MIN && in->op != K_DIV && in->op != K_MOD && in->op != K_POW) ||
                        in->op == K_IDIV || in->op == K_IMOD || in->op == K_NEG || in->op == K_ABS || in->op == K_SELECT ||
                        in->op == K_CAST;
            P->narrow[i] = arith && ops && cuda_fits32(P, i) && !in_loop[i];
            P->ctx32[i] = P->narrow[i];
        } else if (in->op != K_ACCUM && in->op != K_LOOP && in->op != K_LOAD && in->op != K_STORE)
            P->ctx32[i] = any && ops; /* an offset stays as it is: p[gid] (64-bit, as the loop's) or p[narrowed] */
    }
}

static void cuda_arms(const Kernel *k, CudaPlan *P, Arena *ar);

void cuda_scan(const Kernel *k, CudaPlan *P, Arena *ar) {
    memset(P, 0, sizeof *P);
    if (cuda_kernel_uses_ce(k)) { /* a block per row; the body is not written */
        CudaLaunch *L = &P->launch;
        L->mode = CUDA_CE_STATS;
        L->block = CUDA_BLOCK_BLOCK;
        L->vector = 1;
        L->per_block = 1;
        L->shared = 2 * 4 * (CUDA_BLOCK_BLOCK / 32);
        L->blocks = k->ce->rows < 1 ? 1 : k->ce->rows > CUDA_MAX_BLOCKS ? CUDA_MAX_BLOCKS : k->ce->rows;
        return;
    }
    if (cuda_kernel_uses_scatter(k)) { /* the segmented kernel's geometry; the body is not written */
        const KScatter *s = k->scatter;
        CudaLaunch *L = &P->launch;
        int64_t rows = cuda_scatter_rows(s);
        L->mode = CUDA_SCATTER;
        L->block = CUDA_SCATTER_BLOCK;
        L->vector = 1;
        L->per_block = rows;
        L->shared = 4 * (2 * CUDA_SCATTER_BLOCK + CUDA_SCATTER_BLOCK / 32);
        L->blocks = (s->R + rows - 1) / rows;
        return;
    }
    if (cuda_kernel_uses_kv(k)) { /* rt_kv_attention.cuh's geometry: a block per (row, kv head) */
        const KKvAttn *a = k->kv;
        CudaLaunch *L = &P->launch;
        int64_t G = a->H / a->Hk, items = a->N * a->Hk;
        L->mode = CUDA_KV_ATTN;
        L->block = 128;
        L->vector = 1;
        L->per_block = 1;
        L->shared = (int)(4 * 4 * G * (2 + a->D)); /* part_m, part_l and part_o of 4 warps */
        L->blocks = items < 1 ? 1 : items > CUDA_MAX_BLOCKS ? CUDA_MAX_BLOCKS : items;
        return;
    }
    if (cuda_kernel_uses_attention(k)) { /* the template's geometry; the body is not written */
        const KAttn *a = k->attn;
        CudaLaunch *L = &P->launch;
        int64_t rows = cuda_attention_rows(k);
        int by_key = a->op == KA_BWD_K || a->op == KA_BWD_V || a->op == KA_BWD_KV;
        int64_t tiles = a->Z * (by_key ? a->Hk * ((a->S + rows - 1) / rows) : a->H * ((a->T + rows - 1) / rows));
        L->mode = CUDA_ATTENTION;
        L->block = 128;
        L->vector = 1;
        L->per_block = rows;
        L->shared = cuda_attention_shared(k);
        L->blocks = tiles < 1 ? 1 : tiles > CUDA_MAX_BLOCKS ? CUDA_MAX_BLOCKS : tiles;
        return;
    }
    cuda_ranges(k, P, ar);
    P->split = arena_alloc(ar, sizeof(int) * (size_t)(k->n + 1));
    P->end = arena_alloc(ar, sizeof(int) * (size_t)(k->n + 1));
    int *stack = arena_alloc(ar, sizeof(int) * (size_t)(k->n + 1)), sp = 0;
    for (int i = 0; i < k->n; i++) {
        KOp op = k->inst[i].op;
        if (op == K_LOOP || op == K_IF) stack[sp++] = i;
        else if (op == K_ENDLOOP || op == K_ENDIF) {
            if (!sp) INTERNAL("cuda: %s: %%%d: %s without its opening", k->name, i, kir_op_name(op));
            P->end[stack[--sp]] = i;
        }
    }
    if (sp) INTERNAL("cuda: %s: %d loops or ifs left open", k->name, sp);
    P->needs_sync = cuda_loads_what_it_stores(k, 0, k->n);

    /* the top-level loops that may split, and whether any of them reduces */
    int depth = 0, reduces = 0;
    int64_t longest = 0;
    for (int i = 0; i < k->n; i++) {
        const KInst *in = &k->inst[i];
        if (in->op == K_LOOP && depth == 0) {
            int e = P->end[i], ok = 1, folds = 0;
            for (int j = i + 1; j < e && ok; j++) {
                const KInst *x = &k->inst[j];
                if (x->op == K_ACCUM && x->a[0] < i) {
                    folds = 1;
                    if (k->inst[x->a[0]].type == KT_BOOL) ok = 0;
                    for (int u = i + 1; u < e && ok; u++) { /* the partial sum is not the running value */
                        const KInst *y = &k->inst[u];
                        for (int a = y->op == K_ACCUM ? 1 : 0; a < y->nin; a++)
                            if (y->a[a] == x->a[0]) ok = 0;
                    }
                }
            }
            if (ok && cuda_loads_what_it_stores(k, i, e)) ok = 0;
            P->split[i] = ok;
            if (ok && folds) {
                reduces = 1;
                int64_t ext = in->nin ? INT64_MAX : in->i;
                if (ext > longest) longest = ext;
            }
        }
        if (in->op == K_LOOP || in->op == K_IF) depth++;
        else if (in->op == K_ENDLOOP || in->op == K_ENDIF) depth--;
    }
    /* A column reduction (Kernel.columns: work item n sums rows of column n, as the levels of
     * fuse_lower.c's two-level sums do) with many work items, or short loops, runs a work item a
     * thread: a warp's 32 threads then read 32 consecutive elements of a row at each step (one
     * transaction), where a warp per item would read 32 rows of one column (32). */
    if (reduces && k->columns >= 32 && (k->grid >= CUDA_COLUMN_THREADS || longest <= CUDA_COLUMN_SHORT)) reduces = 0;
    CudaLaunch *L = &P->launch;
    if (!reduces) {
        memset(P->split, 0, sizeof(int) * (size_t)(k->n + 1));
        L->mode = CUDA_THREAD;
        L->block = CUDA_THREAD_BLOCK;
        L->vector = 1;
        /* vectorise: every gid-dependent access at gid (or, loads, at gid mod N or gid / M with
         * 4 | N, M), one way a buffer, on f32, i32, f16 or bf16 elements, with no control; a
         * buffer both loaded and stored (in place) loaded only before its first store */
        int gid = -1, unit = 1, any = 0;
        int *dep = arena_alloc(ar, sizeof(int) * (size_t)(k->n + 1)); /* depends on gid */
        P->vec = arena_alloc(ar, sizeof(int) * (size_t)(k->nbufs + 1));
        P->vec_n = arena_alloc(ar, sizeof(int) * (size_t)(k->nbufs + 1));
        for (int i = 0; i < k->n && unit; i++) {
            const KInst *in = &k->inst[i];
            if (in->op == K_GID) gid = i, dep[i] = 1;
            for (int a = 0; a < in->nin; a++) dep[i] |= dep[in->a[a]];
            if (in->op == K_LOOP || in->op == K_IF || in->op == K_ACC) unit = 0;
            if ((in->op == K_LOAD || in->op == K_STORE) && dep[in->a[0]]) {
                DType dt = k->bufs[in->buf].dt;
                const KInst *o = &k->inst[in->a[0]];
                int64_t n = 0;
                int how = in->a[0] == gid ? CUDA_VEC_GID : CUDA_VEC_NONE;
                if (in->op == K_LOAD && (o->op == K_IMOD || o->op == K_IDIV) && o->a[0] == gid &&
                    k->inst[o->a[1]].op == K_CONST && (n = k->inst[o->a[1]].i) > 0 && n % 4 == 0 && n <= INT32_MAX)
                    how = o->op == K_IMOD ? CUDA_VEC_MOD : CUDA_VEC_DIV;
                if (how == CUDA_VEC_NONE || (dt != DT_F32 && dt != DT_I32 && dt != DT_F16 && dt != DT_BF16) ||
                    (P->vec[in->buf] && (P->vec[in->buf] != how || P->vec_n[in->buf] != n)))
                    unit = 0;
                P->vec[in->buf] = how;
                P->vec_n[in->buf] = (int)n;
                any = 1;
            }
        }
        if (unit && any && k->grid % 4 == 0 && k->grid >= 4 && k->nsegments <= 1 &&
            (!P->needs_sync || cuda_loads_before_stores(k)))
            L->vector = 4;
        L->per_block = (int64_t)L->block * L->vector;
    } else if (longest <= CUDA_WARP_MAX_EXTENT) {
        L->mode = CUDA_WARP;
        L->block = CUDA_WARP_BLOCK;
        L->vector = 1;
        L->per_block = CUDA_WARP_BLOCK / 32;
    } else {
        L->mode = CUDA_BLOCK;
        L->block = CUDA_BLOCK_BLOCK;
        L->vector = 1;
        L->per_block = 1;
        L->shared = (CUDA_BLOCK_BLOCK / 32) * 8; /* one 8-byte slot per warp */
    }
    int64_t blocks = (k->grid + L->per_block - 1) / L->per_block;
    L->blocks = blocks < 1 ? 1 : blocks > CUDA_MAX_BLOCKS ? CUDA_MAX_BLOCKS : blocks;
    cuda_arms(k, P, ar);
}

CudaLaunch cuda_launch_for(const Kernel *k) {
    Arena ar = {0};
    CudaPlan P;
    cuda_scan(k, &P, &ar);
    CudaLaunch L = P.launch;
    arena_free(&ar);
    return L;
}

/* Is this load or store one the vectorised form makes through its vector (CUDA_VEC_*)? (The
 * plan's only gid-dependent accesses are those; the others are at constant offsets.) */
int cuda_vec_access(const CudaPlan *P, const Kernel *k, const KInst *in) {
    return P->launch.vector > 1 && P->vec[in->buf] != CUDA_VEC_NONE && k->inst[in->a[0]].op != K_CONST;
}

/* ---- the scan: select arms evaluated when taken ---------------------------------------------- */

/* The KIR's select evaluates both arms: a concatenation's backward (or forward) is a sum of
 * selects, each arm a load through its own index chain (clamped so that it stays in bounds), so
 * every output element computed every input's offsets and loaded every input (GPT-2's attention
 * backward joining dq, dk, dv: three chains and three loads an element, one used). In thread
 * mode a select arm's own instructions - those every use of which lies in that arm, directly or
 * through other such instructions, in the select's block - are written inside an if/else, so
 * that only the taken arm's offsets and loads run; on a GPU a concatenation's pieces are whole
 * warps (boundaries at multiples of 32 elements), so the branch does not diverge there. Only
 * arms holding a load of their own (one not from a vectorised kernel's vector registers) are
 * moved: an arm of arithmetic alone stays a select, which ptxas makes a SEL, not a branch.
 * P->arm[i] is 0 or the arm instruction i is written in: 2 * s + 1 for select %s's first value
 * operand, 2 * s + 2 for its second. Pure instructions alone move: loads, arithmetic, casts. */
static int cuda_arm_parent(const CudaPlan *P, int c) { return c ? P->arm[(c - 1) / 2] : 0; }

static int cuda_arm_depth(const CudaPlan *P, int c) {
    int d = 0;
    for (; c; c = cuda_arm_parent(P, c)) d++;
    return d;
}

static int cuda_arm_common(const CudaPlan *P, int a, int b) {
    int da = cuda_arm_depth(P, a), db = cuda_arm_depth(P, b);
    for (; da > db; da--) a = cuda_arm_parent(P, a);
    for (; db > da; db--) b = cuda_arm_parent(P, b);
    while (a != b) a = cuda_arm_parent(P, a), b = cuda_arm_parent(P, b);
    return a;
}

static void cuda_arms(const Kernel *k, CudaPlan *P, Arena *ar) {
    size_t n = (size_t)k->n + 1;
    P->arm = arena_alloc(ar, sizeof(int) * n);
    memset(P->arm, 0, sizeof(int) * n);
    if (P->launch.mode != CUDA_THREAD || P->needs_sync) return; /* a load moved past a store of its buffer would change */
    int *block = arena_alloc(ar, sizeof(int) * n), *stack = arena_alloc(ar, sizeof(int) * n), sp = 0, any = 0;
    for (int i = 0; i < k->n; i++) { /* the innermost loop or if around each instruction, -1 at the top */
        KOp op = k->inst[i].op;
        if (op == K_ENDLOOP || op == K_ENDIF) sp--;
        block[i] = sp ? stack[sp - 1] : -1;
        if (op == K_LOOP || op == K_IF) stack[sp++] = i;
        any |= op == K_SELECT;
    }
    if (!any) return;
    /* users before definitions: each instruction's arm is the innermost one holding all its uses */
    int *uses = arena_alloc(ar, sizeof(int) * n); /* -2: not yet used; -1: used where it cannot move */
    for (int i = 0; i < k->n; i++) uses[i] = -2;
    for (int i = k->n - 1; i >= 0; i--) {
        const KInst *in = &k->inst[i];
        int pure = in->op == K_LOAD || (in->op >= K_ADD && in->op <= K_NOT) || in->op == K_SELECT || in->op == K_CAST;
        P->arm[i] = pure && uses[i] >= 0 ? uses[i] : 0;
        for (int a = 0; a < in->nin; a++) { /* what this instruction's use of each operand asks */
            int x = in->a[a], c = P->arm[i];
            if (in->op == K_SELECT && a > 0 && in->a[1] != in->a[2] && in->a[0] != x) c = 2 * i + a;
            if (block[x] != block[i] || in->op == K_ACCUM || in->op == K_STORE || in->op == K_IF || in->op == K_LOOP) c = -1;
            if (uses[x] == -1 || c == -1) uses[x] = -1;
            else uses[x] = uses[x] == -2 ? c : cuda_arm_common(P, uses[x], c);
        }
    }
    /* keep the arms that hold a load of their own (or a kept arm), innermost (lowest select) first */
    unsigned char *keep = arena_alloc(ar, 2 * n + 2);
    memset(keep, 0, 2 * n + 2);
    for (int i = 0; i < k->n; i++) {
        const KInst *in = &k->inst[i];
        if (in->op == K_LOAD && P->arm[i] && !cuda_vec_access(P, k, in)) keep[P->arm[i]] = 1;
    }
    for (int s = 0; s < k->n; s++) {
        if (k->inst[s].op != K_SELECT) continue;
        for (int c = 2 * s + 1; c <= 2 * s + 2; c++) {
            if (keep[c]) {
                if (P->arm[s]) keep[P->arm[s]] = 1;
                continue;
            }
            for (int j = 0; j < s; j++) /* not kept: its instructions are written where the select is */
                if (P->arm[j] == c) P->arm[j] = P->arm[s];
        }
    }
}
