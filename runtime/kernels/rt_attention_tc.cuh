/* rt_attention_tc.cuh - attention on the tensor cores, for bf16 and f16 programs: the same
 * computations as rt_attention.cuh's templates (which these follow, and whose helpers they use),
 * with the matrix products of each tile made by warp matrix multiply-accumulate (nvcuda::wmma,
 * 16 x 16 x 16, f32 accumulation): the forward's scores Q K^T and weighted values P V, and the
 * backward's scores, dP = dO V^T and the gradients' sums (below, "the backward").
 *
 * compiler/cuda.c writes an attention kernel whose element type is bf16 or f16 and whose head
 * widths D and E are multiples of 16, at most 64, as a call of mbt_attn_forward_tc,
 * mbt_attn_bwd_q_tc or mbt_attn_bwd_kv_tc (the Makefile embeds this file as
 * mbt_rt_attention_tc_cuh; it follows rt_attention.cuh in the translation unit).
 * tests/cudaemu/cudaemu.h emulates wmma (each thread holding the whole tile, its documented
 * alignment rules checked), so the gpu-emu layer runs them, and tests/cudaemu/attention_check.cc
 * holds each to a float64 reference.
 *
 * The forward: 4 warps a block, 16 query rows a warp (64 a block), tiles of 32 keys in shared
 * memory as the element type. Per tile a warp computes its 16 x 32 scores with wmma into shared memory
 * (f32); the lanes then take a key each, as in the CUDA-core kernel: the row's running maximum by
 * the warp's butterfly, each lane's share of the row sum, and P = exp(s - m) rounded to the element
 * type for the second product (as flash attention does; the row sums keep P unrounded); P V comes
 * back from wmma through shared memory, and each lane folds its columns into the row's output,
 * which it keeps in registers so that the rescaling by exp(m_old - m_new) is per row. Static
 * shared memory: 41 KB at D = E = 64. */

#include <mma.h>

/* The warp's 16 x 32 block of A B^T into its scratch: A's 16 rows and B's 32 rows, K wide (the
 * element type; pitches AP and BP), f32 sums over K in steps of 16. */
template <typename T, int K, int AP, int BP, int SP>
static __device__ __forceinline__ void mbt_attn_tc_abt(T (*a)[AP], T (*b)[BP], float (*s)[SP]) {
    using namespace nvcuda;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MBT_ATTN_TILE / 16];
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb; /* B^T: B's rows, column-major */
#pragma unroll
    for (int n = 0; n < MBT_ATTN_TILE / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
        wmma::load_matrix_sync(fa, &a[0][k0], AP);
#pragma unroll
        for (int n = 0; n < MBT_ATTN_TILE / 16; n++) {
            wmma::load_matrix_sync(fb, &b[n * 16][k0], BP);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
#pragma unroll
    for (int n = 0; n < MBT_ATTN_TILE / 16; n++) wmma::store_matrix_sync(&s[0][n * 16], acc[n], SP, wmma::mem_row_major);
}

/* acc (W / 16 accumulator tiles: a 16 x W block) += A B, A the warp's 16 x 32 (pitch AP), B 32 x W
 * (pitch BP), both the element type. */
template <typename T, int W, int AP, int BP, typename F>
static __device__ __forceinline__ void mbt_attn_tc_accum(F *acc, T (*a)[AP], T (*b)[BP]) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
#pragma unroll
    for (int k0 = 0; k0 < MBT_ATTN_TILE; k0 += 16) {
        wmma::load_matrix_sync(fa, &a[0][k0], AP);
#pragma unroll
        for (int n = 0; n < W / 16; n++) {
            wmma::load_matrix_sync(fb, &b[k0][n * 16], BP);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

/* A warp's 16 x W result (W / 16 accumulator tiles) to every place of the result (NOUT): 32
 * columns at a time through the warp's scratch, a column a lane; rows r0 + r at or past `rows`
 * are not written. */
template <typename T, int W, int NOUT, int SP, typename F>
static __device__ __forceinline__ void mbt_attn_tc_put(const F *acc, float (*s)[SP], const MbtView *views, T *const *out,
                                                       long long z, long long h, long long r0, long long rows) {
    using namespace nvcuda;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c0 = 0; c0 < W; c0 += 32) {
#pragma unroll
        for (int n = c0 / 16; n < W / 16 && n < c0 / 16 + 2; n++)
            wmma::store_matrix_sync(&s[0][n * 16 - c0], acc[n], SP, wmma::mem_row_major);
        __syncwarp();
        if (c0 + lane < W)
            for (int r = 0; r < 16 && r0 + r < rows; r++)
#pragma unroll
                for (int o = 0; o < NOUT; o++) mbt_st(out[o] + mbt_at(views[o], z, h, r0 + r, c0 + lane), s[r][lane]);
        __syncwarp();
    }
}


template <typename T, int D, int E, bool CAUSAL, int NOUT>
static __device__ void mbt_attn_forward_tc(const MbtAttn &a, const T *q, const T *k, const T *v, T *const *out) {
    using namespace nvcuda;
    const int BK = MBT_ATTN_TILE, BQ = 16 * MBT_ATTN_WARPS, EC = (E + 31) / 32;
    const int QP = D + 8, VP = E + 8, PP = BK + 8, SP = (BK > E ? BK : E) + 4; /* pitches: wmma wants
        multiples of 16 bytes; the extra 16 bytes spread a column's elements over the banks */
    static_assert(D % 16 == 0 && E % 16 == 0 && D <= 64 && E <= 64, "heads of 16 to 64, multiples of 16");
    __shared__ __align__(32) T qs[BQ][QP];
    __shared__ __align__(32) T ks[BK][QP];
    __shared__ __align__(32) T vs[BK][VP];
    __shared__ __align__(32) T ps[MBT_ATTN_WARPS][16][PP];   /* a warp's P, the element type */
    __shared__ __align__(32) float ss[MBT_ATTN_WARPS][16][SP]; /* a warp's scores, then its P V */
    __shared__ float al[MBT_ATTN_WARPS][16];                   /* a warp's rescaling of each row */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = tile % tiles * BQ, kh = h / G;
        __syncthreads();
        mbt_attn_tile<T, BQ, D, QP>(qs, q, a.q, z, h, t0, a.T);
        float m[16], l[16], o[16][EC];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            m[r] = -MBT_INF_F;
            l[r] = 0.0f;
#pragma unroll
            for (int cc = 0; cc < EC; cc++) o[r][cc] = 0.0f;
        }
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ);
        for (long long j0 = 0; j0 < kend; j0 += BK) {
            mbt_attn_key_tile<T, D, E, QP, VP>(ks, vs, k, v, a, z, kh, j0);
            mbt_attn_tc_abt<T, D, QP, QP, SP>(&qs[warp * 16], ks, ss[warp]); /* the warp's scores Q K^T: 16 x 32 */
            __syncwarp();
            /* the softmax's running statistics, a key a lane (as mbt_attn_forward) */
#pragma unroll
            for (int r = 0; r < 16; r++) {
                const long long t = t0 + warp * 16 + r, j = j0 + lane;
                float p, alpha;
                mbt_attn_online(mbt_attn_sees<CAUSAL>(a, t, j) ? a.scale * ss[warp][r][lane] : -MBT_INF_F, m[r], p, alpha);
                l[r] = l[r] * alpha + p;
                mbt_st(&ps[warp][r][lane], p); /* rounded to nearest even, as every store */
                if (lane == 0) al[warp][r] = alpha;
            }
            __syncwarp();
            /* P V: 16 x E, an accumulator tile per 16 columns over the tile's 32 keys */
            {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> pv;
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fp;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fv;
#pragma unroll
                for (int n0 = 0; n0 < E; n0 += 16) {
                    wmma::fill_fragment(pv, 0.0f);
#pragma unroll
                    for (int k0 = 0; k0 < BK; k0 += 16) {
                        wmma::load_matrix_sync(fp, &ps[warp][0][k0], PP);
                        wmma::load_matrix_sync(fv, &vs[k0][n0], VP);
                        wmma::mma_sync(pv, fp, fv, pv);
                    }
                    wmma::store_matrix_sync(&ss[warp][0][n0], pv, SP, wmma::mem_row_major);
                }
            }
            __syncwarp();
#pragma unroll
            for (int r = 0; r < 16; r++) {
                const float alpha = al[warp][r];
#pragma unroll
                for (int cc = 0; cc < EC; cc++) {
                    const int c = lane + 32 * cc;
                    if (c < E) o[r][cc] = o[r][cc] * alpha + ss[warp][r][c];
                }
            }
            /* the next tile's __syncthreads orders the reuse of ss, ps and al */
        }
#pragma unroll
        for (int r = 0; r < 16; r++) {
            const long long t = t0 + warp * 16 + r;
            const float sum = mbt_warp_reduce(l[r], MbtAdd());
            if (t < a.T) mbt_attn_put<T, E, EC, NOUT>(a.out, out, z, h, t, o[r], sum);
        }
    }
}

/* ---- the backward on the tensor cores ---------------------------------------------------------
 * The same computations as rt_attention.cuh's mbt_attn_bwd_q and mbt_attn_bwd_kv, with each
 * tile's four kinds of product on the tensor cores: the scores (Q K^T), dP (dO V^T), and the
 * gradients' sums over the tile (dQ += dS K, dK += dS^T Q, dV += P^T dO). A warp owns 16 rows
 * (query rows for dq, key rows for dk and dv), 4 warps a block; the other side comes in tiles
 * of 32 rows. A warp's 16 x 32 products land in its f32 scratch, where a lane takes a column (a
 * key for dq, a query for dk and dv) and computes P and dS = scale P (dP - sum P dP) in f32 from
 * the scores and the statistics; P and dS are rounded to the element type for the gradients'
 * products (as flash attention does), whose sums stay in f32 accumulator tiles across the whole
 * walk and leave through the scratch at the end. Static shared memory: 42 KB (dq) and 47 KB (dk
 * and dv) at D = E = 64. */

/* A tile of keys for the backward of q: k's and v's rows [j0, j0 + 32) into the shared tiles,
 * the warp's scores Q K^T into sv (a key a lane: sv[r] is row r's) and its dP = dO V^T into its
 * scratch s. */
template <typename T, int D, int E, int QP, int VP, int SP>
static __device__ __forceinline__ void mbt_attn_tc_scores_dp(const MbtAttn &a, T (*qw)[QP], T (*dow)[VP], T (*ks)[QP],
                                                             T (*vs)[VP], float (*s)[SP], float *sv, const T *k,
                                                             const T *v, long long z, long long kh, long long j0) {
    const int lane = threadIdx.x & 31;
    mbt_attn_key_tile<T, D, E, QP, VP>(ks, vs, k, v, a, z, kh, j0);
    mbt_attn_tc_abt<T, D, QP, QP, SP>(qw, ks, s);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++) sv[r] = s[r][lane];
    __syncwarp();
    mbt_attn_tc_abt<T, E, VP, VP, SP>(dow, vs, s);
    __syncwarp();
}

/* The backward of q: dq [Z, H, T, D], and the statistics (COMPUTE) or loading them. */
template <typename T, int D, int E, bool CAUSAL, bool COMPUTE, int NOUT>
static __device__ void mbt_attn_bwd_q_tc(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                         const float *stats_in, float *stats_out, T *const *out) {
    using namespace nvcuda;
    const int BK = MBT_ATTN_TILE, BQ = 16 * MBT_ATTN_WARPS;
    const int QP = D + 8, VP = E + 8, PP = BK + 8, SP = BK + 4; /* pitches, as the forward's */
    static_assert(D % 16 == 0 && E % 16 == 0 && D <= 64 && E <= 64, "heads of 16 to 64, multiples of 16");
    __shared__ __align__(32) T qs[BQ][QP];
    __shared__ __align__(32) T dos[BQ][VP];
    __shared__ __align__(32) T ks[BK][QP];
    __shared__ __align__(32) T vs[BK][VP];
    __shared__ __align__(32) T ws[MBT_ATTN_WARPS][16][PP];      /* a warp's dS, the element type */
    __shared__ __align__(32) float ss[MBT_ATTN_WARPS][16][SP];  /* a warp's scores, then its dP */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = tile % tiles * BQ, kh = h / G;
        const long long tw = t0 + warp * 16; /* the warp's first row */
        __syncthreads();
        mbt_attn_tile<T, BQ, D, QP>(qs, q, a.q, z, h, t0, a.T);
        mbt_attn_tile<T, BQ, E, VP>(dos, dout, a.dout, z, h, t0, a.T);
        float m[16], l[16], pdp[16], sv[16];
#pragma unroll
        for (int r = 0; r < 16; r++) m[r] = -MBT_INF_F, l[r] = pdp[r] = 0.0f;
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ);
        if (COMPUTE) { /* m, l and sum P dP in one pass, a key a lane (as mbt_attn_bwd_q) */
            for (long long j0 = 0; j0 < kend; j0 += BK) {
                mbt_attn_tc_scores_dp<T, D, E, QP, VP, SP>(a, &qs[warp * 16], &dos[warp * 16], ks, vs, ss[warp], sv, k, v, z,
                                                           kh, j0);
#pragma unroll
                for (int r = 0; r < 16; r++) {
                    const bool seen = mbt_attn_sees<CAUSAL>(a, tw + r, j0 + lane);
                    float p, alpha;
                    if (!mbt_attn_online(seen ? a.scale * sv[r] : -MBT_INF_F, m[r], p, alpha)) continue;
                    l[r] = l[r] * alpha + p; /* this lane's parts, added up below */
                    pdp[r] = pdp[r] * alpha + (seen ? p * ss[warp][r][lane] : 0.0f);
                }
            }
#pragma unroll
            for (int r = 0; r < 16; r++) {
                l[r] = mbt_warp_reduce(l[r], MbtAdd());
                pdp[r] = mbt_warp_reduce(pdp[r], MbtAdd());
                pdp[r] = l[r] > 0.0f ? pdp[r] / l[r] : 0.0f;
                if (stats_out && tw + r < a.T && lane < 3)
                    mbt_st(stats_out + mbt_at(a.stats, z, h, tw + r, lane), lane == 0 ? m[r] : lane == 1 ? l[r] : pdp[r]);
            }
        } else {
#pragma unroll
            for (int r = 0; r < 16; r++) {
                if (tw + r >= a.T) break;
                m[r] = mbt_ld(stats_in + mbt_at(a.stats, z, h, tw + r, 0));
                l[r] = mbt_ld(stats_in + mbt_at(a.stats, z, h, tw + r, 1));
                pdp[r] = mbt_ld(stats_in + mbt_at(a.stats, z, h, tw + r, 2));
            }
        }
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> dq[D / 16];
#pragma unroll
        for (int n = 0; n < D / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
        for (long long j0 = 0; j0 < kend; j0 += BK) { /* dq_i = sum_j scale P_ij (dP_ij - pdp_i) k_j */
            mbt_attn_tc_scores_dp<T, D, E, QP, VP, SP>(a, &qs[warp * 16], &dos[warp * 16], ks, vs, ss[warp], sv, k, v, z, kh,
                                                       j0);
#pragma unroll
            for (int r = 0; r < 16; r++) {
                float w = 0.0f;
                if (l[r] > 0.0f && mbt_attn_sees<CAUSAL>(a, tw + r, j0 + lane)) {
                    const float p = expf(a.scale * sv[r] - m[r]) / l[r];
                    w = a.scale * (p * (ss[warp][r][lane] - pdp[r]));
                }
                mbt_st(&ws[warp][r][lane], w);
            }
            __syncwarp();
            mbt_attn_tc_accum<T, D, PP, QP>(dq, ws[warp], ks);
        }
        mbt_attn_tc_put<T, D, NOUT, SP>(dq, ss[warp], a.out, out, z, h, tw, a.T);
    }
}

/* The backward of k and v: dk [Z, Hk, S, D], dv [Z, Hk, S, E] (either or both). */
template <typename T, int D, int E, bool CAUSAL, bool WANT_K, bool WANT_V, int NOUT_K, int NOUT_V>
static __device__ void mbt_attn_bwd_kv_tc(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                          const float *stats, T *const *out_k, T *const *out_v) {
    using namespace nvcuda;
    const int BQ = MBT_ATTN_TILE, BKR = 16 * MBT_ATTN_WARPS;
    const int QP = D + 8, VP = E + 8, PP = BQ + 8, SP = BQ + 4;
    static_assert(D % 16 == 0 && E % 16 == 0 && D <= 64 && E <= 64, "heads of 16 to 64, multiples of 16");
    __shared__ __align__(32) T kr[BKR][QP];
    __shared__ __align__(32) T vr[WANT_K ? BKR : 16][VP];
    __shared__ __align__(32) T qs[BQ][QP];
    __shared__ __align__(32) T dos[BQ][VP];
    __shared__ float st[BQ][3];
    __shared__ __align__(32) T pt[WANT_V ? MBT_ATTN_WARPS : 1][16][PP]; /* a warp's P^T (keys x queries) */
    __shared__ __align__(32) T dst[WANT_K ? MBT_ATTN_WARPS : 1][16][PP]; /* and its dS^T */
    __shared__ __align__(32) float ss[MBT_ATTN_WARPS][16][SP];          /* its scores, then dP */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long G = a.H / a.Hk, tiles = (a.S + BKR - 1) / BKR, shift = a.S - a.T;
    for (long long tile = blockIdx.x; tile < a.Z * a.Hk * tiles; tile += gridDim.x) {
        const long long z = tile / (a.Hk * tiles), kh = tile / tiles % a.Hk, j0 = tile % tiles * BKR;
        const long long jw = j0 + warp * 16; /* the warp's first key */
        __syncthreads();
        mbt_attn_tile<T, BKR, D, QP>(kr, k, a.k, z, kh, j0, a.S);
        if constexpr (WANT_K) mbt_attn_tile<T, BKR, E, VP>(vr, v, a.v, z, kh, j0, a.S);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[WANT_K ? D / 16 : 1], dv[WANT_V ? E / 16 : 1];
#pragma unroll
        for (int n = 0; n < (WANT_K ? D / 16 : 0); n++) wmma::fill_fragment(dk[n], 0.0f);
#pragma unroll
        for (int n = 0; n < (WANT_V ? E / 16 : 0); n++) wmma::fill_fragment(dv[n], 0.0f);
        long long ifirst = CAUSAL ? j0 - shift : 0; /* the first query row that sees the tile's first key */
        if (ifirst < 0) ifirst = 0;
        for (long long g = 0; g < G; g++) {
            const long long h = kh * G + g;
            for (long long i0 = ifirst; i0 < a.T; i0 += BQ) {
                mbt_attn_query_tile<T, D, E, QP, VP>(qs, dos, st, q, dout, stats, a, z, h, i0);
                /* S^T: the warp's 16 keys against the tile's 32 queries; a lane takes a query */
                mbt_attn_tc_abt<T, D, QP, QP, SP>(&kr[warp * 16], qs, ss[warp]);
                __syncwarp();
                const long long i = i0 + lane;
                float p[16];
#pragma unroll
                for (int r = 0; r < 16; r++) {
                    p[r] = 0.0f;
                    if (mbt_attn_sees<CAUSAL>(a, i, jw + r))
                        p[r] = expf(a.scale * ss[warp][r][lane] - st[lane][0]) / st[lane][1];
                    if constexpr (WANT_V) mbt_st(&pt[warp][r][lane], p[r]);
                }
                __syncwarp();
                if constexpr (WANT_K) { /* dP^T = V dO^T, then dS^T */
                    mbt_attn_tc_abt<T, E, VP, VP, SP>(&vr[warp * 16], dos, ss[warp]);
                    __syncwarp();
#pragma unroll
                    for (int r = 0; r < 16; r++)
                        mbt_st(&dst[warp][r][lane], a.scale * (p[r] * (ss[warp][r][lane] - st[lane][2])));
                    __syncwarp();
                    mbt_attn_tc_accum<T, D, PP, QP>(dk, dst[warp], qs);
                }
                if constexpr (WANT_V) mbt_attn_tc_accum<T, E, PP, VP>(dv, pt[warp], dos);
                __syncwarp(); /* ss, pt and dst are rewritten by the next tile */
            }
        }
        if constexpr (WANT_K) mbt_attn_tc_put<T, D, NOUT_K, SP>(dk, ss[warp], a.out, out_k, z, kh, jw, a.S);
        if constexpr (WANT_V)
            mbt_attn_tc_put<T, E, NOUT_V, SP>(dv, ss[warp], WANT_K ? a.out_v : a.out, out_v, z, kh, jw, a.S);
    }
}
