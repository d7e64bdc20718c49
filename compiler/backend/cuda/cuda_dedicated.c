/* cuda_dedicated.c - the CUDA back end's kernels with a body of their own (cuda_internal.h), which
 * cuda_emit_kernel (cuda.c) writes instead of the KIR's loops when the scan chose their launch
 * mode: attention as a call of the runtime's templates (runtime/kernels/rt_attention*.cuh), the
 * embedding backward as a segmented sum with no atomics, and cross-entropy's row statistics in one
 * online pass. Each is held to its reference on the emulated GPU (tests/cudaemu; docs/cuda.md). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "diag.h"

/* ---- attention: a template call ---------------------------------------------------------------- */

static const char *cuda_view(CudaEmit *E, const KView *v) {
    if (v->param < 0) return "{0, 0, 0, 0, 0}";
    return arena_printf(E->ar, "{%" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL}", v->offset,
                        v->stride[0], v->stride[1], v->stride[2], v->stride[3]);
}

static const char *cuda_param_or_null(CudaEmit *E, int param) {
    return param < 0 ? "nullptr" : arena_printf(E->ar, "p%d", param);
}

/* The body of an attention kernel (CUDA_ATTENTION): its layout as constants and one template call. */
void cuda_attention_call(CudaEmit *E) {
    const KAttn *a = E->k->attn;
    const char *t = cuda_memory_type(E, a->dt);
    const char *causal = a->causal ? "true" : "false";
    static const char *what[] = {"forward", "backward of q", "backward of k", "backward of v", "backward of k and v"};
    cuda_line(E,
              "/* attention %s: Z %" PRId64 ", heads %" PRId64 " (kv %" PRId64 "), T %" PRId64 ", S %" PRId64 ", D %" PRId64
              ", E %" PRId64 "; views {offset, z, h, r, c} */",
              what[a->op], a->Z, a->H, a->Hk, a->T, a->S, a->D, a->E);
    cuda_line(E, "const MbtAttn a = {%" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %s,", a->Z, a->H,
              a->Hk, a->T, a->S, cuda_float_literal(E, KT_F32, a->scale));
    cuda_line(E, "    %s, /* q */", cuda_view(E, &a->q));
    cuda_line(E, "    %s, /* k */", cuda_view(E, &a->k));
    cuda_line(E, "    %s, /* v */", cuda_view(E, &a->v));
    cuda_line(E, "    %s, /* dout */", cuda_view(E, &a->dout));
    cuda_line(E, "    %s, /* statistics */", cuda_view(E, &a->stats));
    cuda_line(E, "    %d, { /* %s */", a->nout, a->op == KA_BWD_KV ? "dk" : "the result");
    for (int i = 0; i < a->nout; i++) cuda_line(E, "        %s,", cuda_view(E, &a->out[i]));
    /* the document mask's positions and their view (rt_attention.cuh's mbt_attn_first), when given */
    const char *docs = a->pos.param < 0 ? "" : arena_printf(E->ar, ", p%d, %s", a->pos.param, cuda_view(E, &a->pos));
    if (a->op != KA_BWD_KV) {
        cuda_line(E, "    }, 0, {}%s};", docs);
    } else {
        cuda_line(E, "    },");
        cuda_line(E, "    %d, { /* dv */", a->nout_v);
        for (int i = 0; i < a->nout_v; i++) cuda_line(E, "        %s,", cuda_view(E, &a->out_v[i]));
        cuda_line(E, "    }%s};", docs);
    }
    const char *dt = a->pos.param < 0 ? "" : ", true"; /* the templates' DOCS */
    if (*dt && cuda_kernel_uses_attention(E->k) != CUDA_ATTN_FA2) INTERNAL("cuda: a document mask for a template without one");
    const char *outs = "", *outs_v = "";
    for (int i = 0; i < a->nout; i++) outs = arena_printf(E->ar, "%s%sp%d", outs, i ? ", " : "", a->out[i].param);
    for (int i = 0; i < a->nout_v; i++) outs_v = arena_printf(E->ar, "%s%sp%d", outs_v, i ? ", " : "", a->out_v[i].param);
    cuda_line(E, "%s *const out[%d] = {%s};", t, a->nout, outs);
    if (a->op == KA_BWD_KV) cuda_line(E, "%s *const out_v[%d] = {%s};", t, a->nout_v, outs_v);
    const char *q = cuda_param_or_null(E, a->q.param), *k = cuda_param_or_null(E, a->k.param);
    const char *v = cuda_param_or_null(E, a->v.param), *dout = cuda_param_or_null(E, a->dout.param);
    const char *st = cuda_param_or_null(E, a->stats.param);
    const char *tc = cuda_kernel_uses_attention(E->k) == CUDA_ATTN_TENSOR_CORES ? "_tc" : "";
    const char *fa2 = cuda_kernel_uses_attention(E->k) == CUDA_ATTN_FA2 ? "_fa2" : ""; /* rt_attention_fa2.cuh */
    /* f32 on the CUDA cores: the flash-attention-2 tiling (rt_attention.cuh's mbt_attn_f32t_*) */
    if (cuda_attention_f32_tiled(E->k)) fa2 = "_f32t";
    switch (a->op) {
    case KA_FORWARD: /* each row's m and l stored at stats when a backward reads them (nullptr: not stored) */
        if (*tc) INTERNAL("cuda: the tensor-core forward stores no statistics");
        cuda_line(E, "mbt_attn%s_forward<%s, %" PRId64 ", %" PRId64 ", %s, %d%s>(a, %s, %s, %s, out, %s);", fa2, t, a->D, a->E,
                  causal, a->nout, dt, q, k, v, st);
        break;
    case KA_BWD_Q: /* COMPUTE = false: the statistics loaded (the forward's m and l, and rowsum(dout * o)) */
        cuda_line(E, "mbt_attn%s_bwd_q%s<%s, %" PRId64 ", %" PRId64 ", %s, false, %d%s>(a, %s, %s, %s, %s, %s, nullptr, out);",
                  fa2, tc, t, a->D, a->E, causal, a->nout, dt, q, k, v, dout, st);
        break;
    default: { /* dk and dv, or either: dk's places in out, dv's in out_v (in out when alone) */
        int wk = a->op != KA_BWD_V, wv = a->op != KA_BWD_K;
        cuda_line(E, "mbt_attn%s_bwd_kv%s<%s, %" PRId64 ", %" PRId64 ", %s, %s, %s, %d, %d%s>(a, %s, %s, %s, %s, %s, %s, %s);",
                  fa2, tc, t, a->D, a->E, causal, wk ? "true" : "false", wv ? "true" : "false", wk ? a->nout : 0,
                  wv ? (wk ? a->nout_v : a->nout) : 0, dt, q, k, v, dout, st, wk ? "out" : "nullptr",
                  !wv  ? "nullptr"
                  : wk ? "out_v"
                       : "out");
        break;
    }
    }
}

/* ---- scatter_add: the deterministic embedding backward ---------------------------------------- */

/* Element `x` of a buffer of dt as a computing value (f16 and bf16 in float), and value `v` as an
 * element to store: the conversions cuda_load and cuda_store write. */
static const char *cuda_elem_in(CudaEmit *E, DType dt, const char *x) {
    if (dt == DT_F16) return arena_printf(E->ar, "__half2float(%s)", x);
    if (dt == DT_BF16) return arena_printf(E->ar, "__bfloat162float(%s)", x);
    return x;
}

static const char *cuda_elem_out(CudaEmit *E, DType dt, const char *v) {
    if (dt == DT_F16) return arena_printf(E->ar, "__float2half_rn(%s)", v);
    if (dt == DT_BF16) return arena_printf(E->ar, "__ushort_as_bfloat16(mbt_bf16_bits(%s))", v);
    return v;
}

/* out [R, W] = 0, then row clamp(idx[p]) += row p of upd for p = 0 .. P-1: ref_bwd.c's
 * ref_scatter_add and the body's order of additions for every element, without atomics. Block g
 * owns the output rows [g * ROWS, g * ROWS + ROWS) and all their columns; thread t owns the columns
 * t, t + 256, ... of them, zeroes them and is the only one to add to them. The block reads the
 * indices 256 positions at a time, compacts the positions whose row it owns into shared memory in
 * position order (a scan of the flags: warp shuffles, then the 8 warps' counts in warp order), and
 * every thread adds those rows of upd, in that order, to its columns. So each element's additions
 * happen in position order in one thread: bit-identical to the body and across runs, whatever the
 * GPU. (Sorting the positions by row first would let each block skip the indices it does not own;
 * here every block reads all P indices, from L2: P x 4 bytes a block.) */
void cuda_scatter_body(CudaEmit *E) {
    const KScatter *s = E->k->scatter;
    const char *t = cuda_memory_type(E, s->dt), *vt = s->dt == DT_F64 ? "double" : "float";
    int64_t rows = cuda_scatter_rows(s), groups = (s->R + rows - 1) / rows;
    const char *zero = cuda_elem_out(E, s->dt, s->dt == DT_F64 ? "0.0" : "0.0f");
    cuda_line(E, "/* scatter_add: R %" PRId64 ", W %" PRId64 ", P %" PRId64 ", %s (rows read as %s); %" PRId64 " rows a block */",
              s->R, s->W, s->P, t, cuda_memory_type(E, s->upd_dt), rows);
    cuda_line(E, "__shared__ int mbt_pos[%d];", CUDA_SCATTER_BLOCK);
    cuda_line(E, "__shared__ int mbt_row[%d];", CUDA_SCATTER_BLOCK);
    cuda_line(E, "__shared__ int mbt_warp[%d];", CUDA_SCATTER_BLOCK / 32);
    cuda_line(E, "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    cuda_line(E, "for (long long g = blockIdx.x; g < %" PRId64 "LL; g += gridDim.x) {", groups);
    E->indent++;
    cuda_line(E,
              "const long long r0 = g * %" PRId64 "LL, r1 = r0 + %" PRId64 "LL < %" PRId64 "LL ? r0 + %" PRId64 "LL : %" PRId64
              "LL;",
              rows, rows, s->R, rows, s->R);
    cuda_line(E, "for (long long r = r0; r < r1; r++) /* this thread's columns of the block's rows */");
    cuda_line(E, "    for (long long c = threadIdx.x; c < %" PRId64 "LL; c += %dLL) p%d[r * %" PRId64 "LL + c] = %s;", s->W,
              CUDA_SCATTER_BLOCK, s->out, s->W, zero);
    cuda_line(E, "for (long long base = 0; base < %" PRId64 "LL; base += %dLL) {", s->P, CUDA_SCATTER_BLOCK);
    E->indent++;
    cuda_line(E, "const long long p = base + threadIdx.x;");
    cuda_line(E,
              "const long long r = p < %" PRId64 "LL ? mbt_min(mbt_max((long long)p%d[%" PRId64 "LL + p], 0LL), %" PRId64
              "LL) : -1LL;",
              s->P, s->idx, s->idx_off, s->R - 1);
    cuda_line(E, "const int mine = r >= r0 && r < r1;");
    cuda_line(E, "int incl = mine; /* the flags' inclusive scan: in the warp, then the warps before */");
    cuda_line(E, "for (int d = 1; d < 32; d <<= 1) {");
    cuda_line(E, "    const int o = __shfl_up_sync(0xffffffffu, incl, d);");
    cuda_line(E, "    if (lane >= d) incl += o;");
    cuda_line(E, "}");
    cuda_line(E, "if (lane == 31) mbt_warp[warp] = incl;");
    cuda_line(E, "__syncthreads();");
    cuda_line(E, "int before = 0, total = 0;");
    cuda_line(E, "for (int w = 0; w < %d; w++) {", CUDA_SCATTER_BLOCK / 32);
    cuda_line(E, "    before += w < warp ? mbt_warp[w] : 0;");
    cuda_line(E, "    total += mbt_warp[w];");
    cuda_line(E, "}");
    cuda_line(E, "if (mine) {");
    cuda_line(E, "    mbt_pos[before + incl - 1] = (int)p;");
    cuda_line(E, "    mbt_row[before + incl - 1] = (int)r;");
    cuda_line(E, "}");
    cuda_line(E, "__syncthreads();");
    cuda_line(E, "for (int j = 0; j < total; j++) { /* the owned positions in order */");
    E->indent++;
    cuda_line(E, "const long long q = mbt_pos[j], o = (long long)mbt_row[j] * %" PRId64 "LL;", s->W);
    cuda_line(E, "for (long long c = threadIdx.x; c < %" PRId64 "LL; c += %dLL) {", s->W, CUDA_SCATTER_BLOCK);
    E->indent++;
    cuda_line(
        E, "const %s sum = %s + %s;", vt, cuda_elem_in(E, s->dt, arena_printf(E->ar, "p%d[o + c]", s->out)),
        cuda_elem_in(E, s->upd_dt, arena_printf(E->ar, "p%d[%" PRId64 "LL + q * %" PRId64 "LL + c]", s->upd, s->upd_off, s->W)));
    cuda_line(E, "p%d[o + c] = %s;", s->out, cuda_elem_out(E, s->dt, "sum"));
    E->indent--;
    cuda_line(E, "}");
    E->indent--;
    cuda_line(E, "}");
    cuda_line(E, "__syncthreads(); /* the next positions reuse mbt_pos, mbt_row and mbt_warp */");
    E->indent--;
    cuda_line(E, "}");
    E->indent--;
    cuda_line(E, "}");
}

/* ---- cross-entropy's statistics: one online pass ------------------------------------------------ */

/* The elements a thread reads (and, the classifier, writes) at once in cuda_ce_body's main loops:
 * 16 bytes (8 bf16 or f16, 4 f32) when every row starts 16-byte aligned (the arena's buffers are
 * PLAN_ALIGN-aligned, so the element offset and the row strides must be multiples) and the gradient,
 * when written, has the logits' type; else 1 (an element at a time). */
static int cuda_ce_vec(const KCeStats *c) {
    if (c->in_dt != DT_F32 && c->in_dt != DT_BF16 && c->in_dt != DT_F16) return 1;
    if (c->grad >= 0 && c->grad_dt != c->in_dt) return 1;
    int vec = c->in_dt == DT_F32 ? 4 : 8;
    if (c->V < vec || c->in_off % vec || c->stride % vec || (c->grad >= 0 && c->gW % vec)) return 1;
    return vec;
}

/* `float v[VEC]` from the 16 bytes at element `at` of buffer p`buf` (of dt): one uint4 load, the
 * elements widened exactly (bf16 is the high half of an f32) */
static void cuda_ce_load_vec(CudaEmit *E, DType dt, int buf, const char *at) {
    cuda_line(E, "const uint4 u = *reinterpret_cast<const uint4 *>(p%d + (%s));", buf, at);
    cuda_line(E, "const unsigned w[4] = {u.x, u.y, u.z, u.w};");
    if (dt == DT_F32) {
        cuda_line(E, "float v[4];");
        cuda_line(E, "for (int e = 0; e < 4; e++) v[e] = __uint_as_float(w[e]);");
    } else {
        cuda_line(E, "float v[8];");
        if (dt == DT_BF16)
            cuda_line(E,
                      "for (int e = 0; e < 8; e++) v[e] = __uint_as_float(e & 1 ? w[e >> 1] & 0xffff0000u : w[e >> 1] << 16);");
        else
            cuda_line(
                E,
                "for (int e = 0; e < 8; e++) v[e] = __half2float(__ushort_as_half((unsigned short)(e & 1 ? w[e >> 1] >> 16 : w[e >> 1] & 0xffffu)));");
    }
}

/* The head of cuda_ce_body's loops over a row's columns, opened (the caller closes it): the vectors
 * [0, vv) vec columns a thread (thread t's first at vec x t), or the columns [vv, V) one a thread.
 * Both passes use the same two, so the thread that writes column j is the one that read it. */
static void cuda_ce_loop(CudaEmit *E, int vec, int64_t vv, int64_t V) {
    if (vec > 1)
        cuda_line(E, "for (long long j = threadIdx.x * %dLL; j < %" PRId64 "LL; j += %dLL) {", vec, vv, vec * CUDA_BLOCK_BLOCK);
    else cuda_line(E, "for (long long j = %" PRId64 "LL + threadIdx.x; j < %" PRId64 "LL; j += %dLL) {", vv, V, CUDA_BLOCK_BLOCK);
    E->indent++;
}

/* Kernel.ce: per row, the max m and the sum s of exp(x - m) in one read of the logits, and the
 * target's logit; with Kernel.ce's grad, the classifier kernel: then the row's gradient too, in a
 * second read of the row (from L2 mostly: the rows in flight at once fit in it), written in the
 * gradient's type (over the logits when grad is their parameter: every read of the row - the
 * statistics' loop and the target's logit - ends at the __syncthreads before the first write, and
 * column j's gradient is written by the thread that read column j), the padded columns zero. The
 * gradient multiplies by one reciprocal of s a row and the constant dloss / N (in f32) where the
 * body divides each element by s and by N: a few ulps of f32 apart (docs/cuda.md).
 *
 * Each thread keeps a running (m, s) (the online softmax of Milakov and Gimelshein, as llm.c's
 * classifier). Where cuda_ce_vec allows, it reads 16 bytes at a time (columns [8t, 8t + 8), then
 * + 2048, ...; 4 for f32): the vector's max first, one rescale of s by exp(m - max) when it grows,
 * then the vector's exp(x - m) summed and added - one exp an element plus one a vector, no branch an
 * element, and independent exps in flight; the columns past the last whole vector (V not a multiple)
 * one at a time as the scalar form does. The measured H100 profile (docs/cuda.md) had the scalar
 * form, a 2-byte load and a dependent update an element, at 3.2 ms for GPT-2's 12288 x 50304 bf16
 * logits: latency-bound, far from the 0.8 ms its bytes take. The 32 lanes' pairs are merged in a
 * __shfl_xor_sync butterfly (the merge is commutative, so every lane ends with the same pair) and
 * the 8 warps' in warp order by thread 0: a fixed tree, deterministic run to run and GPU to GPU. NaN
 * propagates as the body's max does, +inf gives a NaN sum as the body's exp(inf - inf) does, and
 * -inf logits add nothing (a row of -inf alone: s = 0 where the body has NaN; the loss and the
 * gradient are NaN either way). The sum's rounding differs from the body's (which adds exp(x - max)
 * with the row's final max, in column order) by a few ulps: within tests/gpu/run.sh's tolerances. */
void cuda_ce_body(CudaEmit *E) {
    const KCeStats *c = E->k->ce;
    const int vec = cuda_ce_vec(c);
    const int64_t vv = vec > 1 ? c->V - c->V % vec : 0; /* columns [0, vv) by vectors, [vv, V) one at a time */
    const char *row_at = arena_printf(E->ar, "%" PRId64 "LL + row * %" PRId64 "LL", c->in_off, c->stride);
    const char *x = cuda_elem_in(E, c->in_dt, arena_printf(E->ar, "p%d[%s + j]", c->in, row_at));
    cuda_line(E, "/* cross-entropy statistics: %" PRId64 " rows of V %" PRId64 " (stride %" PRId64 ", %s), one online pass%s */",
              c->rows, c->V, c->stride, cuda_memory_type(E, c->in_dt),
              vec > 1 ? arena_printf(E->ar, ", %d columns a load", vec) : "");
    cuda_line(E, "__shared__ float mbt_wm[%d], mbt_ws[%d];", CUDA_BLOCK_BLOCK / 32, CUDA_BLOCK_BLOCK / 32);
    cuda_line(E, "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    cuda_line(E, "for (long long row = blockIdx.x; row < %" PRId64 "LL; row += gridDim.x) {", c->rows);
    E->indent++;
    cuda_line(E, "float m = -MBT_INF_F, s = 0.0f;");
    if (vec > 1) {
        cuda_ce_loop(E, vec, vv, c->V);
        cuda_ce_load_vec(E, c->in_dt, c->in, arena_printf(E->ar, "%s + j", row_at));
        cuda_line(E, "float vm = v[0];");
        cuda_line(E, "bool nan = v[0] != v[0];");
        cuda_line(E, "for (int e = 1; e < %d; e++) {", vec);
        cuda_line(E, "    vm = fmaxf(vm, v[e]);");
        cuda_line(E, "    nan |= v[e] != v[e];");
        cuda_line(E, "}");
        cuda_line(E, "if (nan || m != m) m = s = __int_as_float(0x7fc00000); /* NaN: both NaN from here on */");
        cuda_line(E, "else {");
        E->indent++;
        cuda_line(E, "if (vm > m) { /* s rescaled once a vector (0 while m is -inf: s is 0 then) */");
        cuda_line(E, "    s *= expf(m - vm);");
        cuda_line(E, "    m = vm;");
        cuda_line(E, "}");
        cuda_line(E, "if (m != -MBT_INF_F) { /* m -inf: every element so far -inf, nothing to add */");
        cuda_line(E, "    float vs = 0.0f; /* exp(inf - inf) is NaN for a +inf, as the body's */");
        cuda_line(E, "    for (int e = 0; e < %d; e++) vs += expf(v[e] - m);", vec);
        cuda_line(E, "    s += vs;");
        cuda_line(E, "}");
        E->indent--;
        cuda_line(E, "}");
        E->indent--;
        cuda_line(E, "}");
    }
    if (vv < c->V) {
        cuda_ce_loop(E, 1, vv, c->V);
        cuda_line(E, "const float v = %s;", x);
        cuda_line(E, "if (v != v || m != m) m = s = v + m; /* NaN: both NaN from here on */");
        cuda_line(E, "else if (v > m) {");
        cuda_line(E, "    s = s * expf(m - v) + expf(v - v); /* 1, or NaN for +inf as the body's exp(inf - inf) */");
        cuda_line(E, "    m = v;");
        cuda_line(E, "} else if (v != -MBT_INF_F) s += expf(v - m);");
        E->indent--;
        cuda_line(E, "}");
    }
    cuda_line(E, "for (int o = 16; o > 0; o >>= 1) { /* the lanes' pairs, merged: every lane gets the same pair */");
    E->indent++;
    cuda_line(E, "const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);");
    cuda_line(E, "if (m2 != m2 || m != m) m = s = m + m2;");
    cuda_line(E, "else if (m2 > m) {");
    cuda_line(E, "    s = s * expf(m - m2) + s2;");
    cuda_line(E, "    m = m2;");
    cuda_line(E, "} else if (m2 != -MBT_INF_F) s = s + s2 * expf(m2 - m);");
    E->indent--;
    cuda_line(E, "}");
    cuda_line(E, "if (lane == 0) {");
    cuda_line(E, "    mbt_wm[warp] = m;");
    cuda_line(E, "    mbt_ws[warp] = s;");
    cuda_line(E, "}");
    cuda_line(E, "__syncthreads();");
    cuda_line(E, "if (threadIdx.x == 0) { /* the warps' pairs in warp order */");
    E->indent++;
    cuda_line(E, "float M = mbt_wm[0], S = mbt_ws[0];");
    cuda_line(E, "for (int w = 1; w < %d; w++) {", CUDA_BLOCK_BLOCK / 32);
    cuda_line(E, "    const float m2 = mbt_wm[w], s2 = mbt_ws[w];");
    cuda_line(E, "    if (m2 != m2 || M != M) M = S = M + m2;");
    cuda_line(E, "    else if (m2 > M) {");
    cuda_line(E, "        S = S * expf(M - m2) + s2;");
    cuda_line(E, "        M = m2;");
    cuda_line(E, "    } else if (m2 != -MBT_INF_F) S = S + s2 * expf(m2 - M);");
    cuda_line(E, "}");
    cuda_line(E, "const long long t = (long long)p%d[%" PRId64 "LL + row];", c->tgt, c->tgt_off);
    cuda_line(E, "const long long tc = t < 0LL ? 0LL : t > %" PRId64 "LL ? %" PRId64 "LL : t; /* clamped as the body's take */",
              c->V - 1, c->V - 1);
    cuda_line(E, "p%d[row * 3LL] = M;", c->out);
    cuda_line(E, "p%d[row * 3LL + 1LL] = S;", c->out);
    cuda_line(E, "p%d[row * 3LL + 2LL] = %s;", c->out,
              cuda_elem_in(E, c->in_dt, arena_printf(E->ar, "p%d[%s + tc]", c->in, row_at)));
    if (c->grad >= 0) {
        cuda_line(E, "mbt_wm[0] = M;");
        cuda_line(E, "mbt_ws[0] = S;");
    }
    E->indent--;
    cuda_line(E, "}");
    cuda_line(E, "__syncthreads(); /* the row's statistics are in; every read of the row for them is done */");
    if (c->grad >= 0) {
        cuda_line(E, "{");
        E->indent++;
        cuda_line(E, "const float M = mbt_wm[0], rs = 1.0f / mbt_ws[0], k = %s; /* one reciprocal a row; dloss / N */",
                  cuda_float_literal(E, KT_F32, c->dloss / c->N));
        cuda_line(E, "const int t = p%d[%" PRId64 "LL + row];", c->tgt, c->tgt_off);
        if (vec > 1) {
            cuda_ce_loop(E, vec, vv, c->V); /* the statistics' columns: a thread overwrites what it read */
            cuda_ce_load_vec(E, c->in_dt, c->in, arena_printf(E->ar, "%s + j", row_at));
            cuda_line(E, "unsigned o[4];");
            const char *g = "(expf(v[e] - M) * rs - ((int)j + e == t ? 1.0f : 0.0f)) * k";
            if (c->in_dt == DT_F32) cuda_line(E, "for (int e = 0; e < 4; e++) o[e] = __float_as_uint(%s);", g);
            else {
                cuda_line(E, "float g[8];");
                cuda_line(E, "for (int e = 0; e < 8; e++) g[e] = %s;", g);
                cuda_line(E, "for (int e = 0; e < 4; e++)");
                if (c->in_dt == DT_BF16)
                    cuda_line(E, "    o[e] = (unsigned)mbt_bf16_bits(g[2 * e]) | (unsigned)mbt_bf16_bits(g[2 * e + 1]) << 16;");
                else
                    cuda_line(
                        E,
                        "    o[e] = (unsigned)__half_as_ushort(__float2half_rn(g[2 * e])) | (unsigned)__half_as_ushort(__float2half_rn(g[2 * e + 1])) << 16;");
            }
            cuda_line(E, "uint4 r;");
            cuda_line(E, "r.x = o[0], r.y = o[1], r.z = o[2], r.w = o[3];");
            cuda_line(E, "*reinterpret_cast<uint4 *>(p%d + (row * %" PRId64 "LL + j)) = r;", c->grad, c->gW);
            E->indent--;
            cuda_line(E, "}");
        }
        if (vv < c->V) {
            cuda_ce_loop(E, 1, vv, c->V);
            cuda_line(E, "const float g = (expf(%s - M) * rs - ((int)j == t ? 1.0f : 0.0f)) * k;", x);
            cuda_line(E, "p%d[row * %" PRId64 "LL + j] = %s;", c->grad, c->gW, cuda_elem_out(E, c->grad_dt, "g"));
            E->indent--;
            cuda_line(E, "}");
        }
        if (c->gW > c->V)
            cuda_line(E,
                      "for (long long j = %" PRId64 "LL + threadIdx.x; j < %" PRId64 "LL; j += %dLL) p%d[row * %" PRId64
                      "LL + j] = %s;",
                      c->V, c->gW, CUDA_BLOCK_BLOCK, c->grad, c->gW, cuda_elem_out(E, c->grad_dt, "0.0f"));
        E->indent--;
        cuda_line(E, "}");
        cuda_line(E, "__syncthreads(); /* mbt_wm and mbt_ws are rewritten for the next row */");
    }
    E->indent--;
    cuda_line(E, "}");
}

/* ---- attention over the paged KV cache: a template call ---------------------------------------- */

/* The body of a CUDA_KV_ATTN kernel: its layout (Kernel.kv) as constants and one call of
 * mbt_kv_attn (runtime/kernels/rt_kv_attention.cuh), which computes what fuse_kv.h's body does. */
void cuda_kv_attention_call(CudaEmit *E) {
    const KKvAttn *a = E->k->kv;
    int64_t G = a->H / a->Hk, per_slot = a->L * 2 * a->Hk * a->D;
    int64_t k_off = a->pool_off + (a->layer * 2) * a->Hk * a->D, v_off = a->pool_off + (a->layer * 2 + 1) * a->Hk * a->D;
    cuda_line(E,
              "/* kv attention: layer %" PRId64 " of %" PRId64 ", %" PRId64 " rows, heads %" PRId64 " (kv %" PRId64
              "), D %" PRId64 ", blocks of %" PRId64 " tokens, %" PRId64 " a sequence; views {offset, -, h, r, c} */",
              a->layer, a->L, a->N, a->H, a->Hk, a->D, a->block, a->max_blocks);
    cuda_line(E,
              "const MbtKvAttn a = {%" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64
              "LL, %" PRId64 "LL, %s,",
              a->N, a->Hk, a->block, a->max_blocks, per_slot, k_off, v_off, cuda_float_literal(E, KT_F32, a->scale));
    cuda_line(E, "    %s, /* q */", cuda_view(E, &a->q));
    cuda_line(E, "    %s, /* k */", cuda_view(E, &a->k));
    cuda_line(E, "    %s, /* v */", cuda_view(E, &a->v));
    cuda_line(E, "    %s}; /* out */", cuda_view(E, &a->out));
    cuda_line(E, "mbt_kv_attn<%s, %s, %" PRId64 ", %" PRId64 ">(a, p%d, p%d, p%d, p%d, p%d, p%d);", cuda_memory_type(E, a->dt),
              cuda_memory_type(E, a->kv_dt), a->D, G, a->q.param, a->k.param, a->v.param, a->meta, a->pool, a->out.param);
}
