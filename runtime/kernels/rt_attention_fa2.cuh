/* rt_attention_fa2.cuh - attention in the flash-attention-2 design, for bf16 and f16
 * programs on sm_80 and later (issue 14): the same computation as rt_attention.cuh's
 * mbt_attn_forward (whose helpers it uses), organised as FA2 does it.
 *
 *   - A block of 4 warps owns 64 query rows, 16 a warp. Each warp keeps its rows of Q as mma
 *     A-fragments in registers (read once from the strided view), and its scores, the online
 *     softmax's running maximum and sums, and its 16 x E output all in registers: no score or
 *     probability goes through shared memory.
 *   - Keys and values come in tiles of BK rows (64, or 32 when D + E > 128 so that the tiles fit
 *     48 KB of static shared memory), staged in shared memory with cp.async (16-byte copies, when
 *     the views allow them: unit column stride, rows and bases 16-byte aligned; otherwise
 *     element by element) and double-buffered: tile i + 1 is in flight while tile i is used.
 *   - Q K^T and P V are mma.sync.m16n8k16 (bf16 or f16 inputs, f32 accumulators) through
 *     mbt_mma_16816, whose fragment layout is documented (PTX ISA, "Matrix Fragments for
 *     mma.m16n8k16"): the accumulator of two neighbouring 8-key score tiles is, element for
 *     element, the A-fragment of P for the next product, so P goes from the softmax to the
 *     tensor cores without leaving the registers (rounded to the element type, as flash
 *     attention does; the row sums keep P unrounded, as rt_attention_tc.cuh). The B-fragments
 *     come from the shared tiles by ldmatrix (.trans for V), two 8-wide tiles a load.
 *   - A row's scores live in the 4 lanes of a quad (lanes 4g .. 4g + 3 hold rows g and g + 8):
 *     its maximum and, at the end, its sum are combined with two shuffles, in a fixed order.
 *   - Causal: the block stops at the last key its last row sees (whole tiles above the diagonal
 *     are never loaded); only tiles that cross the diagonal or the end of the keys are masked.
 *   - The log-sum-exp: with `stats` non-null the kernel stores each row's maximum m and sum l
 *     (slots 0 and 1 of the statistics view, rt_attention.cuh's layout) for a backward to load.
 *
 * Under tests/cudaemu/cudaemu.h (MBT_CUDAEMU) mbt_mma_16816 and the cp.async functions are the
 * emulator's (a warp collective that implements the documented lane layout; a plain copy); here
 * they are inline PTX. The order of every sum depends only on the shapes: runs are bit-identical.
 *
 * The backward follows below. Not here yet (docs/cuda.md): wgmma and TMA on sm_90. */

#ifndef MBT_CUDAEMU
template <typename T> static __device__ __forceinline__ void mbt_mma_16816(float *d, const unsigned *a, const unsigned *b,
                                                                          const float *c);
template <>
__device__ __forceinline__ void mbt_mma_16816<__nv_bfloat16>(float *d, const unsigned *a, const unsigned *b, const float *c) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}
template <>
__device__ __forceinline__ void mbt_mma_16816<__half>(float *d, const unsigned *a, const unsigned *b, const float *c) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}
/* ldmatrix.x4: four 8 x 8 matrices of 16-bit elements from shared memory, lane l naming row l % 8 of
 * matrix l / 8 (16-byte aligned rows); lane l receives in r[i] matrix i's (row l / 4, columns
 * 2 (l % 4), 2 (l % 4) + 1) - with .trans (rows 2 (l % 4), 2 (l % 4) + 1, column l / 4): an
 * mma B-fragment from a tile stored with B's columns as rows (trans: B's rows as rows). */
static __device__ __forceinline__ void mbt_ldsm4(unsigned *r, const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
static __device__ __forceinline__ void mbt_ldsm4_trans(unsigned *r, const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
/* 2^x on the special-function unit (ex2.approx: relative error within 2^-22; 2^-inf = 0). */
static __device__ __forceinline__ float mbt_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ void mbt_cp_async16(void *shared, const void *global) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global));
}
static __device__ __forceinline__ void mbt_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void mbt_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#else
static inline float mbt_exp2(float x) { return exp2f(x); }
#endif

/* The softmax works in base 2 on the raw scores s = q . k: a row's maximum m is taken over them
 * (the scale is 1 / sqrt(D) > 0, so it is the scaled scores' maximum too), and a probability is
 * 2^(s scale log2(e) - m scale log2(e)): one fused multiply-add and one ex2 a score (explicit fmaf:
 * programs are compiled with --fmad=false). The statistics they store and load are every
 * attention kernel's (rt_attention.cuh's layout, natural units: slot 0 the maximum of the scaled
 * scores, m scale); the backward turns a stored maximum into its exponent's offset as
 * (m scale) log2(e), and one it computes the same way, so that P is bit for bit the same either way. */
#define MBT_LOG2E 1.4426950408889634f

/* An element's 16 bits, and two elements into one .b32 register (the first in the low half). */
static __device__ __forceinline__ unsigned mbt_bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
static __device__ __forceinline__ unsigned mbt_bits16(__half x) { return __half_as_ushort(x); }
template <typename T> static __device__ __forceinline__ unsigned mbt_pack2(float lo, float hi) {
    T x[2];
    mbt_st(&x[0], lo);
    mbt_st(&x[1], hi);
    return mbt_bits16(x[0]) | mbt_bits16(x[1]) << 16;
}
/* Rows [j0, j0 + BK) of a key-side operand (W wide) into a shared tile, by the whole block: 16-byte
 * cp.async copies when `fast` (the view's rows contiguous and 16-byte aligned), else element by
 * element; zeros past the S rows (a P of 0 times a stale value could be NaN). */
template <typename T, int BK, int W, int PITCH>
static __device__ __forceinline__ void mbt_fa2_stage(T (*sh)[PITCH], const T *x, const MbtView &w, long long z, long long h,
                                                     long long j0, long long S, bool fast) {
    const int CH = W / 8; /* 16-byte chunks a row */
    for (int i = threadIdx.x; i < BK * CH; i += MBT_ATTN_WARPS * 32) {
        const int rr = i / CH, c = i % CH * 8;
        if (j0 + rr < S) {
            const T *src = x + mbt_at(w, z, h, j0 + rr, c);
            if (fast) mbt_cp_async16(&sh[rr][c], src);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) sh[rr][c + e] = src[e * w.c];
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) mbt_st(&sh[rr][c + e], 0.0f);
        }
    }
}

/* Whether view w's rows of head (z, h) can be copied 16 bytes at a time from base x. */
template <typename T>
static __device__ __forceinline__ bool mbt_fa2_fast(const T *x, const MbtView &w, long long z, long long h) {
    return w.c == 1 && w.r % 8 == 0 && (w.off + z * w.z + h * w.h) % 8 == 0 && (unsigned long long)x % 16 == 0;
}

/* 16 rows [r0, r0 + 16) of a view (W wide) as A-fragments (zeros past `rows`). */
template <typename T, int W>
static __device__ __forceinline__ void mbt_fa2_rows_a(unsigned (*fa)[4], const T *x, const MbtView &w, long long z,
                                                      long long h, long long r0, long long rows) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kc = 0; kc < W / 16; kc++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const long long row = r0 + g + (r & 1) * 8;
            const int col = kc * 16 + 2 * t + (r >> 1) * 8;
            unsigned u = 0;
            if (row < rows) {
                const T *p = x + mbt_at(w, z, h, row, col);
                u = mbt_bits16(p[0]) | mbt_bits16(p[w.c]) << 16;
            }
            fa[kc][r] = u;
        }
}

/* acc[N / 8] (16 x N) = A B^T: A the warp's 16 x W (fragments fa), B's N rows in shared memory
 * (pitch P). One ldmatrix gives the B-fragments of two 8-row tiles: matrices (rows n8, columns
 * 16 kc), (n8, 16 kc + 8), (n8 + 8, 16 kc), (n8 + 8, 16 kc + 8). */
template <typename T, int W, int N, int P>
static __device__ __forceinline__ void mbt_fa2_abt(float (*acc)[4], const unsigned (*fa)[4], const T (*b)[P]) {
    static_assert(N % 16 == 0, "B's rows in pairs of 8-row tiles");
    const int lane = threadIdx.x & 31, lr = lane & 7, lm = lane >> 3;
#pragma unroll
    for (int n = 0; n < N / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < W / 16; kc++)
#pragma unroll
        for (int n = 0; n < N / 8; n += 2) {
            unsigned bb[4];
            mbt_ldsm4(bb, &b[n * 8 + (lm >> 1) * 8 + lr][kc * 16 + (lm & 1) * 8]);
            mbt_mma_16816<T>(acc[n], fa[kc], bb, acc[n]);
            mbt_mma_16816<T>(acc[n + 1], fa[kc], bb + 2, acc[n + 1]);
        }
}

/* out[W / 8] (16 x W) += X B: X the warp's 16 x K as accumulators x[K / 8] (rounded to the element
 * type into A-fragments: the accumulators of two neighbouring 8-column tiles are, element for
 * element, an A-fragment), B K x W in shared memory (pitch P). One ldmatrix.trans gives the
 * B-fragments of two 8-column tiles: matrices (rows 16 kc, columns n8), (16 kc + 8, n8),
 * (16 kc, n8 + 8), (16 kc + 8, n8 + 8). */
template <typename T, int K, int W, int P>
static __device__ __forceinline__ void mbt_fa2_xb(float (*out)[4], const float (*x)[4], const T (*b)[P]) {
    static_assert(W % 16 == 0, "B's columns in pairs of 8-column tiles");
    const int lane = threadIdx.x & 31, lr = lane & 7, lm = lane >> 3;
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) {
        const unsigned pa[4] = {mbt_pack2<T>(x[2 * kc][0], x[2 * kc][1]), mbt_pack2<T>(x[2 * kc][2], x[2 * kc][3]),
                                mbt_pack2<T>(x[2 * kc + 1][0], x[2 * kc + 1][1]),
                                mbt_pack2<T>(x[2 * kc + 1][2], x[2 * kc + 1][3])};
#pragma unroll
        for (int n = 0; n < W / 8; n += 2) {
            unsigned bb[4];
            mbt_ldsm4_trans(bb, &b[kc * 16 + (lm & 1) * 8 + lr][n * 8 + (lm >> 1) * 8]);
            mbt_mma_16816<T>(out[n], pa, bb, out[n]);
            mbt_mma_16816<T>(out[n + 1], pa, bb + 2, out[n + 1]);
        }
    }
}

/* A warp's 16 x W accumulators to every place of a result (NOUT views), rows r0 + ... < rows. */
template <typename T, int W, int NOUT>
static __device__ __forceinline__ void mbt_fa2_put(const float (*acc)[4], const MbtView *views, T *const *out, long long z,
                                                   long long h, long long r0, long long rows) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const long long row = r0 + g + r * 8;
        if (row >= rows) continue;
#pragma unroll
        for (int n = 0; n < W / 8; n++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int u = 0; u < NOUT; u++) mbt_st(out[u] + mbt_at(views[u], z, h, row, n * 8 + 2 * t + i), acc[n][2 * r + i]);
    }
}

/* The document mask's first key tile (of BK keys) for the block's rows [t0, t0 + rows): the tile
 * of the smallest first key among them (0 without the mask, or for a row that sees key 0). Thread
 * 0 finds it and hands it on through shared memory, between two barriers; every thread returns
 * it. Without the mask (DOCS false) it is 0, with no barrier and no shared memory. */
template <bool DOCS>
static __device__ __forceinline__ long long mbt_fa2_first_tile(const MbtAttn &a, long long z, long long t0, int rows, int BK) {
    if constexpr (!DOCS) {
        return 0;
    } else {
        __shared__ long long sh;
        if (threadIdx.x == 0) {
            long long f = a.S;
            for (long long t = t0; t < t0 + rows && t < a.T; t++) {
                const long long x = mbt_attn_first(a, z, t);
                f = x < f ? x : f;
            }
            sh = f;
        }
        __syncthreads();
        const long long f = sh;
        __syncthreads(); /* every thread has read it before thread 0 writes the next rows' */
        return f / BK;
    }
}

template <typename T, int D, int E, bool CAUSAL, int NOUT, bool DOCS = false>
static __device__ void mbt_attn_fa2_forward(const MbtAttn &a, const T *q, const T *k, const T *v, T *const *out,
                                            float *stats) {
    static_assert(D % 16 == 0 && E % 16 == 0 && D <= 128 && E <= 128, "heads of 16 to 128, multiples of 16");
    const int BQ = 16 * MBT_ATTN_WARPS, BK = D + E > 128 ? 32 : 64, KP = D + 8, VP = E + 8; /* pitches: rows of a
        multiple of 16 bytes (cp.async), 16 more than the data so that a quad's 8 rows fall on distinct banks */
    __shared__ __align__(16) T ks[2][BK][KP];
    __shared__ __align__(16) T vs[2][BK][VP];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    const float scale2 = a.scale * MBT_LOG2E;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        /* a head's last rows first: under a causal mask they see the most keys, and the blocks
           started last then get the shortest tiles */
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = (tiles - 1 - tile % tiles) * BQ, kh = h / G;
        const long long tw = t0 + warp * 16; /* the warp's first row */
        /* the warp's Q as A-fragments: qa[kc] covers columns [16 kc, 16 kc + 16) */
        unsigned qa[D / 16][4];
        mbt_fa2_rows_a<T, D>(qa, q, a.q, z, h, tw, a.T);
        float o[E / 8][4], m[2] = {-MBT_INF_F, -MBT_INF_F}, l[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < E / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ), ntiles = (kend + BK - 1) / BK;
        const bool kfast = mbt_fa2_fast(k, a.k, z, kh), vfast = mbt_fa2_fast(v, a.v, z, kh);
        __syncthreads(); /* the previous tile of rows is done with the buffers */
        /* the document mask: the first keys of this lane's rows (fr), and the block's first key
           tile it0 (whole tiles before every row's document are never loaded) */
        long long fr[2] = {0, 0}, it0 = mbt_fa2_first_tile<DOCS>(a, z, t0, BQ, BK);
        if (DOCS)
            for (int r = 0; r < 2; r++) fr[r] = tw + g + r * 8 < a.T ? mbt_attn_first(a, z, tw + g + r * 8) : 0;
        const long long fmax = fr[0] > fr[1] ? fr[0] : fr[1];
        if (it0 < ntiles) {
            mbt_fa2_stage<T, BK, D, KP>(ks[0], k, a.k, z, kh, it0 * BK, a.S, kfast);
            mbt_fa2_stage<T, BK, E, VP>(vs[0], v, a.v, z, kh, it0 * BK, a.S, vfast);
            mbt_cp_async_commit();
        }
        for (long long it = it0; it < ntiles; it++) {
            const int buf = (int)((it - it0) & 1);
            const long long j0 = it * BK;
            if (it + 1 < ntiles) { /* the next tile into the other buffer, while this one is used */
                mbt_fa2_stage<T, BK, D, KP>(ks[buf ^ 1], k, a.k, z, kh, j0 + BK, a.S, kfast);
                mbt_fa2_stage<T, BK, E, VP>(vs[buf ^ 1], v, a.v, z, kh, j0 + BK, a.S, vfast);
                mbt_cp_async_commit();
                mbt_cp_async_wait<1>();
            } else {
                mbt_cp_async_wait<0>();
            }
            __syncthreads(); /* this thread's copies are done: everyone's are, after the barrier */
            /* S = Q K^T: 16 x BK, BK / 8 accumulators; s[n] holds keys [8n, 8n + 8) */
            float s[BK / 8][4];
            mbt_fa2_abt<T, D, BK, KP>(s, qa, ks[buf]);
            /* masked where the tile crosses the diagonal, the end of the keys or a document's start */
            const bool mask = j0 + BK > a.S || (CAUSAL && j0 + BK - 1 > tw + a.S - a.T) || j0 < fmax;
            float mt[2] = {-MBT_INF_F, -MBT_INF_F};
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const long long j = j0 + n * 8 + 2 * t + (i & 1);
                    if (mask && (!mbt_attn_sees<CAUSAL>(a, tw + g + (i >> 1) * 8, j) || j < fr[i >> 1])) s[n][i] = -MBT_INF_F;
                    mt[i >> 1] = mt[i >> 1] > s[n][i] ? mt[i >> 1] : s[n][i];
                }
            float alpha[2], ms[2];
#pragma unroll
            for (int r = 0; r < 2; r++) { /* the row's maximum over its quad */
                float x = __shfl_xor_sync(0xffffffffu, mt[r], 1);
                mt[r] = mt[r] > x ? mt[r] : x;
                x = __shfl_xor_sync(0xffffffffu, mt[r], 2);
                mt[r] = mt[r] > x ? mt[r] : x;
                const float mn = m[r] > mt[r] ? m[r] : mt[r];
                alpha[r] = mn == -MBT_INF_F ? 1.0f : mbt_exp2((m[r] - mn) * scale2);
                ms[r] = mn == -MBT_INF_F ? 0.0f : mn * scale2; /* a row that has seen no key yet: its P is 0 */
                m[r] = mn;
            }
            float ls[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float p = mbt_exp2(fmaf(s[n][i], scale2, -ms[i >> 1]));
                    s[n][i] = p;
                    ls[i >> 1] = ls[i >> 1] + p;
                }
            l[0] = l[0] * alpha[0] + ls[0];
            l[1] = l[1] * alpha[1] + ls[1];
#pragma unroll
            for (int n = 0; n < E / 8; n++) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
            /* O += P V: P's A-fragment for keys [16 kc, 16 kc + 16) is score tiles 2 kc and 2 kc + 1 */
            mbt_fa2_xb<T, BK, E, VP>(o, s, vs[buf]);
            __syncthreads(); /* everyone is done with this buffer before the next tile refills it */
        }
        /* the row sums over the quad, then out = O / l (a row that saw no key: 0) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const long long row = tw + g + r * 8;
            if (row >= a.T) continue;
#pragma unroll
            for (int n = 0; n < E / 8; n++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const float x = l[r] > 0.0f ? o[n][2 * r + i] / l[r] : 0.0f;
#pragma unroll
                    for (int u = 0; u < NOUT; u++) mbt_st(out[u] + mbt_at(a.out[u], z, h, row, n * 8 + 2 * t + i), x);
                }
            if (stats && t < 2) mbt_st(stats + mbt_at(a.stats, z, h, row, t), t == 0 ? m[r] * a.scale : l[r]);
        }
    }
}

/* ---- the backward in the FA2 design ------------------------------------------------------------
 * Two kernels, no atomics (runs stay bit-identical): dq per tile of 64 query rows (a warp's 16),
 * walking the keys; dk and dv per tile of 64 key rows (a warp's 16), walking the query rows of
 * every query head of the key head's group. The operand a warp owns rows of is held as
 * A-fragments in registers (Q and dO for dq; K and V for dk and dv); the other side streams
 * through double-buffered shared tiles. Every product is mbt_mma_16816; P and dS go from the
 * accumulators of one product to the A-fragments of the next without leaving the registers
 * (rounded to the element type, as flash attention and rt_attention_tc.cuh do). The statistics
 * (m, l, sum P dP, rt_attention.cuh's [Z, H, T, 3]) are computed by the dq kernel in a first walk
 * (COMPUTE) or loaded, as the programs' kernel graph asks. */

/* The double-buffered walk over `count` tiles of rows of two operands x (W1 wide) and y (W2): tile
 * i is rows row0(i) .. + BR of head head(i); fn(buf, i) runs on it while tile i + 1 is in flight.
 * extra(buf, i), run by the whole block right after a tile's copies are issued, stages anything
 * else the tile needs (plain loads). */
template <typename T, int BR, int W1, int W2, int P1, int P2, typename Row, typename Head, typename Extra, typename Fn>
static __device__ __forceinline__ void mbt_fa2_walk(T (*xs)[BR][P1], T (*ys)[BR][P2], const T *x, const MbtView &wx,
                                                    const T *y, const MbtView &wy, long long z, long long rows,
                                                    long long count, Row row0, Head head, Extra extra, Fn fn) {
    __syncthreads(); /* the previous user of the buffers is done */
    if (count <= 0) return;
    long long h = head(0);
    bool xf = mbt_fa2_fast(x, wx, z, h), yf = mbt_fa2_fast(y, wy, z, h);
    mbt_fa2_stage<T, BR, W1, P1>(xs[0], x, wx, z, h, row0(0), rows, xf);
    mbt_fa2_stage<T, BR, W2, P2>(ys[0], y, wy, z, h, row0(0), rows, yf);
    mbt_cp_async_commit();
    extra(0, 0LL);
    for (long long it = 0; it < count; it++) {
        const int buf = (int)(it & 1);
        if (it + 1 < count) {
            h = head(it + 1);
            xf = mbt_fa2_fast(x, wx, z, h), yf = mbt_fa2_fast(y, wy, z, h);
            mbt_fa2_stage<T, BR, W1, P1>(xs[buf ^ 1], x, wx, z, h, row0(it + 1), rows, xf);
            mbt_fa2_stage<T, BR, W2, P2>(ys[buf ^ 1], y, wy, z, h, row0(it + 1), rows, yf);
            mbt_cp_async_commit();
            extra(buf ^ 1, it + 1);
            mbt_cp_async_wait<1>();
        } else {
            mbt_cp_async_wait<0>();
        }
        __syncthreads();
        fn(buf, it);
        __syncthreads();
    }
}

/* The backward of q: dq [Z, H, T, D], and the statistics (COMPUTE) or loading them. */
template <typename T, int D, int E, bool CAUSAL, bool COMPUTE, int NOUT, bool DOCS = false>
static __device__ void mbt_attn_fa2_bwd_q(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                          const float *stats_in, float *stats_out, T *const *out) {
    static_assert(D % 16 == 0 && E % 16 == 0 && D <= 128 && E <= 128, "heads of 16 to 128, multiples of 16");
    const int BQ = 16 * MBT_ATTN_WARPS, BK = D + E > 128 ? 32 : 64, KP = D + 8, VP = E + 8;
    __shared__ __align__(16) T ks[2][BK][KP];
    __shared__ __align__(16) T vs[2][BK][VP];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    const float scale2 = a.scale * MBT_LOG2E;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = (tiles - 1 - tile % tiles) * BQ, kh = h / G;
        const long long tw = t0 + warp * 16; /* (the longest tiles first, as the forward) */
        unsigned qa[D / 16][4], da[E / 16][4];
        mbt_fa2_rows_a<T, D>(qa, q, a.q, z, h, tw, a.T);
        mbt_fa2_rows_a<T, E>(da, dout, a.dout, z, h, tw, a.T);
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ), ntiles = (kend + BK - 1) / BK;
        /* the document mask, as the forward: this lane's rows' first keys, the block's first tile */
        long long fr[2] = {0, 0};
        const long long it0 = mbt_fa2_first_tile<DOCS>(a, z, t0, BQ, BK), count = ntiles - it0;
        if (DOCS)
            for (int r = 0; r < 2; r++) fr[r] = tw + g + r * 8 < a.T ? mbt_attn_first(a, z, tw + g + r * 8) : 0;
        const long long fmax = fr[0] > fr[1] ? fr[0] : fr[1];
        auto row0 = [&](long long i) { return (i + it0) * BK; };
        auto head = [&](long long) { return kh; };
        auto none = [&](int, long long) {};
        /* each row's maximum (raw scores when computed here), sum and sum P dP; msr: its maximum as
           the exponent wants it (scaled to base 2; 0 for a row that sees nothing, whose P is 0) */
        float m[2] = {-MBT_INF_F, -MBT_INF_F}, l[2] = {0.0f, 0.0f}, pdp[2] = {0.0f, 0.0f}, msr[2] = {0.0f, 0.0f};
        /* a tile's raw, masked scores and dP = dO V^T; the mask only where the tile crosses the
           diagonal or the end of the keys (rows past T are never stored) */
        auto scores = [&](int buf, long long j0, float (*s)[4], float (*dp)[4]) {
            mbt_fa2_abt<T, D, BK, KP>(s, qa, ks[buf]);
            mbt_fa2_abt<T, E, BK, VP>(dp, da, vs[buf]);
            const bool mask = j0 + BK > a.S || (CAUSAL && j0 + BK - 1 > tw + a.S - a.T) || j0 < fmax;
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const long long j = j0 + n * 8 + 2 * t + (i & 1);
                    if (mask && (!mbt_attn_sees<CAUSAL>(a, tw + g + (i >> 1) * 8, j) || j < fr[i >> 1])) s[n][i] = -MBT_INF_F;
                }
        };
        if (COMPUTE) {
            mbt_fa2_walk<T, BK, D, E, KP, VP>(ks, vs, k, a.k, v, a.v, z, a.S, count, row0, head, none, [&](int buf, long long it) {
                float s[BK / 8][4], dp[BK / 8][4], mt[2] = {-MBT_INF_F, -MBT_INF_F}, ms[2];
                scores(buf, row0(it), s, dp);
#pragma unroll
                for (int n = 0; n < BK / 8; n++)
#pragma unroll
                    for (int i = 0; i < 4; i++) mt[i >> 1] = mt[i >> 1] > s[n][i] ? mt[i >> 1] : s[n][i];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float x = __shfl_xor_sync(0xffffffffu, mt[r], 1);
                    mt[r] = mt[r] > x ? mt[r] : x;
                    x = __shfl_xor_sync(0xffffffffu, mt[r], 2);
                    mt[r] = mt[r] > x ? mt[r] : x;
                    const float mn = m[r] > mt[r] ? m[r] : mt[r];
                    const float alpha = mn == -MBT_INF_F ? 1.0f : mbt_exp2((m[r] - mn) * scale2);
                    ms[r] = mn == -MBT_INF_F ? 0.0f : mn * scale2;
                    m[r] = mn;
                    l[r] *= alpha;
                    pdp[r] *= alpha;
                }
#pragma unroll
                for (int n = 0; n < BK / 8; n++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float p = mbt_exp2(fmaf(s[n][i], scale2, -ms[i >> 1]));
                        l[i >> 1] = l[i >> 1] + p;
                        pdp[i >> 1] = pdp[i >> 1] + p * dp[n][i];
                    }
            });
#pragma unroll
            for (int r = 0; r < 2; r++) {
                l[r] = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
                l[r] = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 2);
                pdp[r] = pdp[r] + __shfl_xor_sync(0xffffffffu, pdp[r], 1);
                pdp[r] = pdp[r] + __shfl_xor_sync(0xffffffffu, pdp[r], 2);
                pdp[r] = l[r] > 0.0f ? pdp[r] / l[r] : 0.0f;
                m[r] = m[r] * a.scale; /* of the scaled scores, as stored */
                msr[r] = m[r] == -MBT_INF_F ? 0.0f : m[r] * MBT_LOG2E;
                const long long row = tw + g + r * 8;
                if (stats_out && row < a.T && t < 3)
                    mbt_st(stats_out + mbt_at(a.stats, z, h, row, t), t == 0 ? m[r] : t == 1 ? l[r] : pdp[r]);
            }
        } else {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const long long row = tw + g + r * 8;
                if (row >= a.T) continue;
                m[r] = mbt_ld(stats_in + mbt_at(a.stats, z, h, row, 0)); /* of the scaled scores */
                l[r] = mbt_ld(stats_in + mbt_at(a.stats, z, h, row, 1));
                pdp[r] = mbt_ld(stats_in + mbt_at(a.stats, z, h, row, 2));
                msr[r] = m[r] == -MBT_INF_F ? 0.0f : m[r] * MBT_LOG2E;
            }
        }
        const float linv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
        float dq[D / 8][4];
#pragma unroll
        for (int n = 0; n < D / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
        mbt_fa2_walk<T, BK, D, E, KP, VP>(ks, vs, k, a.k, v, a.v, z, a.S, count, row0, head, none, [&](int buf, long long it) {
            float s[BK / 8][4], dp[BK / 8][4];
            scores(buf, row0(it), s, dp);
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) { /* dS = scale P (dP - sum P dP), in place of the scores */
                    const int r = i >> 1;
                    s[n][i] = a.scale * ((mbt_exp2(fmaf(s[n][i], scale2, -msr[r])) * linv[r]) * (dp[n][i] - pdp[r]));
                }
            mbt_fa2_xb<T, BK, D, KP>(dq, s, ks[buf]);
        });
        mbt_fa2_put<T, D, NOUT>(dq, a.out, out, z, h, tw, a.T);
    }
}

/* The backward of k and v: dk [Z, Hk, S, D], dv [Z, Hk, S, E] (either or both). */
template <typename T, int D, int E, bool CAUSAL, bool WANT_K, bool WANT_V, int NOUT_K, int NOUT_V, bool DOCS = false>
static __device__ void mbt_attn_fa2_bwd_kv(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                           const float *stats, T *const *out_k, T *const *out_v) {
    static_assert(D % 16 == 0 && E % 16 == 0 && D <= 128 && E <= 128, "heads of 16 to 128, multiples of 16");
    const int BKR = 16 * MBT_ATTN_WARPS, BQ = D + E > 128 ? 32 : 64, QP = D + 8, EP = E + 8;
    __shared__ __align__(16) T qs[2][BQ][QP];
    __shared__ __align__(16) T dos[2][BQ][EP];
    __shared__ float st[2][BQ][3];
    /* the document mask: the first key of each query row of a tile (fq[buf * BQ + row]), and each
       thread's part of the scan for the last query row that sees the key tile; no shared memory
       without the mask */
    long long *fq = nullptr, *qend_sh = nullptr;
    if constexpr (DOCS) {
        __shared__ long long fq_sh[2 * BQ], qe_sh[MBT_ATTN_WARPS * 32];
        fq = fq_sh, qend_sh = qe_sh;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long G = a.H / a.Hk, tiles = (a.S + BKR - 1) / BKR, shift = a.S - a.T;
    const float scale2 = a.scale * MBT_LOG2E;
    for (long long tile = blockIdx.x; tile < a.Z * a.Hk * tiles; tile += gridDim.x) {
        const long long z = tile / (a.Hk * tiles), kh = tile / tiles % a.Hk, j0 = tile % tiles * BKR;
        const long long jw = j0 + warp * 16;
        unsigned ka[D / 16][4], va[WANT_K ? E / 16 : 1][4];
        mbt_fa2_rows_a<T, D>(ka, k, a.k, z, kh, jw, a.S);
        if constexpr (WANT_K) mbt_fa2_rows_a<T, E>(va, v, a.v, z, kh, jw, a.S);
        float dk[WANT_K ? D / 8 : 1][4], dv[WANT_V ? E / 8 : 1][4];
#pragma unroll
        for (int n = 0; n < (WANT_K ? D / 8 : 0); n++) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
#pragma unroll
        for (int n = 0; n < (WANT_V ? E / 8 : 0); n++) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
        long long ifirst = CAUSAL ? j0 - shift : 0; /* the first query row that sees the tile's first key */
        if (ifirst < 0) ifirst = 0;
        /* the document mask: only the rows up to the last one that sees a key of the tile (a row
           whose document starts at or before the tile's last key) are walked; a scan of the rows'
           first keys finds it, by the whole block */
        long long qend = a.T;
        if (DOCS) {
            long long e = 0;
            for (long long i = ifirst + threadIdx.x; i < a.T; i += MBT_ATTN_WARPS * 32)
                if (mbt_attn_first(a, z, i) <= j0 + BKR - 1) e = i + 1;
            qend_sh[threadIdx.x] = e;
            __syncthreads();
            qend = 0;
            for (int u = 0; u < MBT_ATTN_WARPS * 32; u++) qend = qend_sh[u] > qend ? qend_sh[u] : qend;
            __syncthreads(); /* every thread has read them before the next key tile's scan */
        }
        const long long per = ifirst < qend ? (qend - ifirst + BQ - 1) / BQ : 0; /* query tiles a head */
        auto row0 = [&](long long i) { return ifirst + i % per * BQ; };
        auto head = [&](long long i) { return kh * G + i / per; };
        /* a tile's statistics as the loop wants them: the exponent's offset (m log2(e), as dq's), 1 / l,
           sum P dP (rows past T: 0) */
        auto stage_stats = [&](int buf, long long i) {
            for (int c = threadIdx.x; c < BQ; c += MBT_ATTN_WARPS * 32) {
                const long long row = row0(i) + c;
                float x[3] = {0.0f, 0.0f, 0.0f};
                if (row < a.T) {
                    const float *p = stats + mbt_at(a.stats, z, head(i), row, 0);
                    x[0] = p[0] == -MBT_INF_F ? 0.0f : p[0] * MBT_LOG2E, x[1] = p[a.stats.c] > 0.0f ? 1.0f / p[a.stats.c] : 0.0f, x[2] = p[2 * a.stats.c];
                }
                st[buf][c][0] = x[0], st[buf][c][1] = x[1], st[buf][c][2] = x[2];
                if (DOCS) fq[buf * BQ + c] = row < a.T ? mbt_attn_first(a, z, row) : a.S;
            }
        };
        mbt_fa2_walk<T, BQ, D, E, QP, EP>(qs, dos, q, a.q, dout, a.dout, z, a.T, G * per, row0, head, stage_stats,
                                          [&](int buf, long long it) {
            const long long i0 = row0(it);
            float p[BQ / 8][4], ds[WANT_K ? BQ / 8 : 1][4];
            mbt_fa2_abt<T, D, BQ, QP>(p, ka, qs[buf]); /* S^T: the warp's 16 keys against the tile's queries */
            if constexpr (WANT_K) mbt_fa2_abt<T, E, BQ, EP>(ds, va, dos[buf]); /* dP^T = V dO^T */
            /* the mask only where the tile reaches past the queries or the keys, or crosses the
               diagonal; and everywhere under the document mask */
            const bool mask = i0 + BQ > a.T || jw + 16 > a.S || (CAUSAL && jw + 15 > i0 + shift) || DOCS;
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int c = n * 8 + 2 * t + (i & 1); /* the query, in the tile */
                    const long long j = jw + g + (i >> 1) * 8;
                    float x = 0.0f;
                    if (!mask || (mbt_attn_sees<CAUSAL>(a, i0 + c, j) && (!DOCS || fq[buf * BQ + c] <= j)))
                        x = mbt_exp2(fmaf(p[n][i], scale2, -st[buf][c][0])) * st[buf][c][1];
                    p[n][i] = x;
                    if constexpr (WANT_K) ds[n][i] = a.scale * (x * (ds[n][i] - st[buf][c][2]));
                }
            if constexpr (WANT_K) mbt_fa2_xb<T, BQ, D, QP>(dk, ds, qs[buf]);
            if constexpr (WANT_V) mbt_fa2_xb<T, BQ, E, EP>(dv, p, dos[buf]);
        });
        if constexpr (WANT_K) mbt_fa2_put<T, D, NOUT_K>(dk, a.out, out_k, z, kh, jw, a.S);
        if constexpr (WANT_V) mbt_fa2_put<T, E, NOUT_V>(dv, WANT_K ? a.out_v : a.out, out_v, z, kh, jw, a.S);
    }
}
