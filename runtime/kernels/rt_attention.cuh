/* rt_attention.cuh - attention on the GPU without the T x S matrix: hand-written templates that
 * a program's attention kernels call, specialised by NVRTC for the program's shapes.
 *
 * compiler/cuda.c writes each KK_ATTENTION kernel whose layout fusion resolved (kir.h, KAttn) as
 * a wrapper: its operands as strided views (MbtAttn, every size and stride a constant) and one
 * call of the template below for its op. The Makefile turns this file into a C string
 * (build/gen/rt_attention_cuh.h) that mbtc puts in the translation unit after the prelude when a
 * program has such a kernel; it uses the prelude's mbt_warp_reduce, MbtMax/MbtAdd and
 * mbt_bf16_bits. tests/cudaemu/attention_check.cc runs these templates against a float64
 * reference on the CPU (tests/cudaemu/cudaemu.h).
 *
 * What each computes is graph.h's G_ATTENTION and its backward ops (ref.c, ref_bwd.c):
 *   s_ij = scale * (q_i . k_j) over the keys j row i sees (all S, or j <= i + S - T when causal);
 *   forward:  out_i = sum_j exp(s_ij - m_i) v_j / l_i, m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i)
 *             (a row that sees no key is 0);
 *   backward: P_ij = exp(s_ij - m_i) / l_i, dP_ij = dout_i . v_j, pdp_i = sum_j P_ij dP_ij,
 *             dq_i = sum_j scale P_ij (dP_ij - pdp_i) k_j, dk_j = sum_i scale P_ij (dP_ij - pdp_i) q_i,
 *             dv_j = sum_i P_ij dout_i (i over the query rows that see j, of the query heads that
 *             share key head j's: grouped-query attention);
 *   the statistics (m_i, l_i, pdp_i) of each query row are what the backward of q computes and
 *   stores ([Z, H, T, 3], f32 whatever the element type) and the backward of k and v load; one kernel computes dk and dv together
 *   (fusion's rule 8), each P_ij once for both, or either alone.
 * The forward and the statistics are one pass over the keys with the running maximum (each tile's
 * contributions rescaled by exp(m_old - m_new)); no pass stores anything per key.
 *
 * The work: 4 warps a block; each warp owns RPW query rows (forward, dq) or key rows (dk, dv) and
 * walks tiles of 32 keys (queries), one a lane, read into shared memory by the whole block. A lane
 * computes its key's score (a dot product over D, in order), the warp combines the row's running
 * maximum with the prelude's fixed butterfly, each lane keeps its own part of the row sums (added
 * up by the same butterfly once, after the last tile), and the lanes then own output columns
 * (c = lane, lane + 32, ...) and add the tile's 32 terms in key order, reading the weights each
 * lane wrote to its row's slot in shared memory. Sums are in f32 whatever the element
 * type; loads widen f16/bf16 exactly, stores round to nearest even. The order of every sum depends
 * only on the shapes: results are the same run to run. Compute stays on the CUDA cores (f32,
 * like the rest of mbt's f32 numerics); bf16 and f16 programs with heads of 16 to 64 use
 * rt_attention_tc.cuh, the same on the tensor cores. */

#define MBT_ATTN_WARPS 4
#define MBT_ATTN_TILE 32 /* keys (or queries) a tile: one a lane */

struct MbtView {
    long long off, z, h, r, c; /* element (z, h, r, c) at off + z*z_ + h*h_ + r*r_ + c*c_ */
};

struct MbtAttn {
    long long Z, H, Hk, T, S;
    float scale;
    MbtView q, k, v, dout, stats;
    int nout;
    MbtView out[4];   /* the places of the result (dk for the backward of k and v) */
    int nout_v;
    MbtView out_v[4]; /* the backward of k and v: dv's */
    /* the document mask (attention(..., pos = ...), causal, S = T): query row t of batch z sees the
       keys from mbt_attn_first on; pos (i32, element (z, t) at the view's off + z*z_ + t*r_) is
       nullptr without it. Only the flash-attention-2 kernels (rt_attention_fa2.cuh) read it, with
       their template argument DOCS: compiler/cuda.c gives the others no masked attention. */
    const int *pos;
    MbtView posv;
};

static __device__ __forceinline__ long long mbt_at(const MbtView &w, long long z, long long h, long long r, long long c) {
    return w.off + z * w.z + h * w.h + r * w.r + c * w.c;
}

static __device__ __forceinline__ float mbt_ld(const float *p) { return *p; }
static __device__ __forceinline__ void mbt_st(float *p, float x) { *p = x; }
#if MBT_HALF
static __device__ __forceinline__ float mbt_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ void mbt_st(__nv_bfloat16 *p, float x) { *p = __ushort_as_bfloat16(mbt_bf16_bits(x)); }
static __device__ __forceinline__ float mbt_ld(const __half *p) { return __half2float(*p); }
static __device__ __forceinline__ void mbt_st(__half *p, float x) { *p = __float2half_rn(x); }
#endif

/* Rows a warp owns: fewer for wide heads, so that the tiles fit 48 KB of static shared memory. */
template <int D, int E> struct MbtAttnRows {
    static const int per_warp = D + E > 192 ? 2 : 4;
    static const int per_block = per_warp * MBT_ATTN_WARPS;
};

/* An element into a shared tile: widened to f32 (the CUDA-core kernels), or as it is (the tensor
 * cores' tiles keep the element type). */
template <typename T> static __device__ __forceinline__ void mbt_tile_set(float *d, const T *x) { *d = mbt_ld(x); }
template <typename T> static __device__ __forceinline__ void mbt_tile_set(T *d, const T *x) { *d = *x; }
static __device__ __forceinline__ void mbt_tile_set(float *d, const float *x) { *d = *x; }

/* Rows [r0, r0 + N) of an operand into sh[N][PITCH] (zeros past `rows`), by the whole block. */
template <typename T, int N, int W, int PITCH, typename S>
static __device__ __forceinline__ void mbt_attn_tile(S (*sh)[PITCH], const T *x, const MbtView &w, long long z,
                                                     long long h, long long r0, long long rows) {
    for (int i = threadIdx.x; i < N * W; i += MBT_ATTN_WARPS * 32) {
        const int rr = i / W, c = i % W;
        if (r0 + rr < rows) mbt_tile_set(&sh[rr][c], x + mbt_at(w, z, h, r0 + rr, c));
        else mbt_st(&sh[rr][c], 0.0f);
    }
}

/* Keys [j0, j0 + 32) of k and v into the shared tiles (pitches DP, EP), between barriers (the
 * previous tile's readers are done; every thread sees the new one). */
template <typename T, int D, int E, int DP, int EP, typename S>
static __device__ __forceinline__ void mbt_attn_key_tile(S (*ks)[DP], S (*vs)[EP], const T *k, const T *v,
                                                         const MbtAttn &a, long long z, long long kh, long long j0) {
    __syncthreads();
    mbt_attn_tile<T, MBT_ATTN_TILE, D, DP>(ks, k, a.k, z, kh, j0, a.S);
    mbt_attn_tile<T, MBT_ATTN_TILE, E, EP>(vs, v, a.v, z, kh, j0, a.S);
    __syncthreads();
}

/* Query rows [i0, i0 + 32) of q, dout and the statistics into the shared tiles (pitches DP, EP),
 * between barriers: the backward of k and v's tile of queries. */
template <typename T, int D, int E, int DP, int EP, typename S>
static __device__ __forceinline__ void mbt_attn_query_tile(S (*qs)[DP], S (*dos)[EP], float (*st)[3], const T *q,
                                                           const T *dout, const float *stats, const MbtAttn &a, long long z,
                                                           long long h, long long i0) {
    __syncthreads();
    mbt_attn_tile<T, MBT_ATTN_TILE, D, DP>(qs, q, a.q, z, h, i0, a.T);
    mbt_attn_tile<T, MBT_ATTN_TILE, E, EP>(dos, dout, a.dout, z, h, i0, a.T);
    mbt_attn_tile<float, MBT_ATTN_TILE, 3, 3>(st, stats, a.stats, z, h, i0, a.T);
    __syncthreads();
}

/* Whether query row t sees key j (row t of T, key j of S; causal: j <= t + S - T). */
template <bool CAUSAL>
static __device__ __forceinline__ bool mbt_attn_sees(const MbtAttn &a, long long t, long long j) {
    return t < a.T && j < a.S && (!CAUSAL || j <= t + a.S - a.T);
}

/* The first key query row t of batch z sees under the document mask: t - pos[z, t] clamped to
 * [0, t + 1] (ref.c's ref_attn_first; t + 1: none); 0 without the mask. */
static __device__ __forceinline__ long long mbt_attn_first(const MbtAttn &a, long long z, long long t) {
    if (!a.pos) return 0;
    const long long p = a.pos[a.posv.off + z * a.posv.z + t * a.posv.r];
    return p > t ? 0 : p < 0 ? t + 1 : t - p;
}

/* One tile of a row's online softmax, a key a lane: s is this lane's scaled score (-inf for a key
 * the row does not see). m, the row's running maximum (the same in every lane), becomes the
 * maximum over the tile too; p = exp(s - m) and alpha = exp(m_old - m), the factor the row's sums
 * so far are rescaled by. False, m unchanged, p 0 and alpha 1 while the row has seen no key (the
 * warp agrees on it). */
static __device__ __forceinline__ bool mbt_attn_online(float s, float &m, float &p, float &alpha) {
    const float mt = mbt_warp_reduce(s, MbtMax());
    const float mn = m > mt ? m : mt;
    p = 0.0f;
    alpha = 1.0f;
    if (mn == -MBT_INF_F) return false;
    p = s == -MBT_INF_F ? 0.0f : expf(s - mn);
    alpha = expf(m - mn);
    m = mn;
    return true;
}

/* sum over c < W of a[c] * b[c], in order */
template <int W> static __device__ __forceinline__ float mbt_dot(const float *a, const float *b) {
    float acc = 0.0f;
    for (int c = 0; c < W; c++) acc = acc + a[c] * b[c];
    return acc;
}

/* The CUDA-core kernels' online step for query row t (its shared row q) and key j (this lane's,
 * row kr): seen says whether the row sees the key, the score is scale * q . kr, then
 * mbt_attn_online. */
template <int D, bool CAUSAL>
static __device__ __forceinline__ bool mbt_attn_score_online(const MbtAttn &a, const float *q, const float *kr, long long t,
                                                             long long j, bool &seen, float &m, float &p, float &alpha) {
    seen = mbt_attn_sees<CAUSAL>(a, t, j);
    return mbt_attn_online(seen ? a.scale * mbt_dot<D>(q, kr) : -MBT_INF_F, m, p, alpha);
}

/* The keys [0, end) that the tile of query rows [t0, t0 + rows) sees: causal rows stop at the
 * last key their last row sees. */
template <bool CAUSAL>
static __device__ __forceinline__ long long mbt_attn_keys_seen(const MbtAttn &a, long long t0, int rows) {
    if (!CAUSAL) return a.S;
    const long long last = t0 + rows - 1 < a.T - 1 ? t0 + rows - 1 : a.T - 1, end = last + a.S - a.T + 1;
    return end < a.S ? end : a.S;
}

/* A row's columns (c = lane, lane + 32, ... < W, in acc[]): acc = acc * keep + sum over the tile's
 * 32 rows jj, in order, of w[jj] * x[jj][c]. */
template <int W, int WC, int PITCH>
static __device__ __forceinline__ void mbt_attn_accum(float *acc, const float *w, const float (*x)[PITCH], float keep) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int cc = 0; cc < WC; cc++) {
        const int c = lane + 32 * cc;
        if (c >= W) break;
        float t = acc[cc] * keep;
        for (int jj = 0; jj < MBT_ATTN_TILE; jj++) t = t + w[jj] * x[jj][c];
        acc[cc] = t;
    }
}

/* One result row to every place of a result (NOUT of them, unrolled: no array in local memory). */
template <typename T, int W, int WC, int NOUT>
static __device__ __forceinline__ void mbt_attn_put(const MbtView *views, T *const *out, long long z, long long h,
                                                    long long r, const float *acc, float div) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int cc = 0; cc < WC; cc++) {
        const int c = lane + 32 * cc;
        if (c >= W) break;
        const float x = div == 1.0f ? acc[cc] : div > 0.0f ? acc[cc] / div : 0.0f;
#pragma unroll
        for (int o = 0; o < NOUT; o++) mbt_st(out[o] + mbt_at(views[o], z, h, r, c), x);
    }
}

/* ---- the forward: out [Z, H, T, E] --------------------------------------------------------------- */

template <typename T, int D, int E, bool CAUSAL, int NOUT>
static __device__ void mbt_attn_forward(const MbtAttn &a, const T *q, const T *k, const T *v, T *const *out,
                                        float *stats) {
    const int RPW = MbtAttnRows<D, E>::per_warp, BQ = MbtAttnRows<D, E>::per_block, BK = MBT_ATTN_TILE;
    const int EC = (E + 31) / 32;
    __shared__ float qs[BQ][D], ks[BK][D + 1], vs[BK][E + 1], ps[BQ][BK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = tile % tiles * BQ, kh = h / G;
        __syncthreads(); /* the previous tile is done with the shared rows */
        mbt_attn_tile<T, BQ, D, D>(qs, q, a.q, z, h, t0, a.T);
        float m[RPW], l[RPW], o[RPW][EC];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            m[rr] = -MBT_INF_F;
            l[rr] = 0.0f;
#pragma unroll
            for (int cc = 0; cc < EC; cc++) o[rr][cc] = 0.0f;
        }
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ);
        for (long long j0 = 0; j0 < kend; j0 += BK) {
            mbt_attn_key_tile<T, D, E, D + 1, E + 1>(ks, vs, k, v, a, z, kh, j0);
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int r = warp * RPW + rr;
                const long long t = t0 + r, j = j0 + lane;
                if (t >= a.T) break; /* the same for the whole warp */
                bool seen;
                float p, alpha;
                if (!mbt_attn_score_online<D, CAUSAL>(a, qs[r], ks[lane], t, j, seen, m[rr], p, alpha)) continue;
                l[rr] = l[rr] * alpha + p; /* this lane's part of the row sum: added up at the end */
                ps[r][lane] = p; /* a slot a row: the next tile's __syncthreads orders its reuse */
                __syncwarp();
                mbt_attn_accum<E, EC, E + 1>(o[rr], ps[r], vs, alpha);
            }
        }
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const long long t = t0 + warp * RPW + rr;
            if (t >= a.T) break;
            const float sum = mbt_warp_reduce(l[rr], MbtAdd());
            mbt_attn_put<T, E, EC, NOUT>(a.out, out, z, h, t, o[rr], sum);
            /* the row's max (the same in every lane) and sum, for the backward (a.stats [Z, H, T, 2]) */
            if (stats && lane < 2) mbt_st(stats + mbt_at(a.stats, z, h, t, lane), lane == 0 ? m[rr] : sum);
        }
    }
}

/* ---- the backward of q: dq [Z, H, T, D], and the statistics ------------------------------------- */

template <typename T, int D, int E, bool CAUSAL, bool COMPUTE, int NOUT>
static __device__ void mbt_attn_bwd_q(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                      const float *stats_in, float *stats_out, T *const *out) {
    const int RPW = MbtAttnRows<D, E>::per_warp, BQ = MbtAttnRows<D, E>::per_block, BK = MBT_ATTN_TILE;
    const int DC = (D + 31) / 32;
    __shared__ float qs[BQ][D], dos[BQ][E], ks[BK][D + 1], vs[BK][E + 1], ws[BQ][BK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = tile % tiles * BQ, kh = h / G;
        __syncthreads();
        mbt_attn_tile<T, BQ, D, D>(qs, q, a.q, z, h, t0, a.T);
        mbt_attn_tile<T, BQ, E, E>(dos, dout, a.dout, z, h, t0, a.T);
        float m[RPW], l[RPW], pdp[RPW], dq[RPW][DC];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            m[rr] = -MBT_INF_F;
            l[rr] = pdp[rr] = 0.0f;
#pragma unroll
            for (int dc = 0; dc < DC; dc++) dq[rr][dc] = 0.0f;
        }
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ);
        if (COMPUTE) { /* m, l and sum P dP in one pass: the running sums rescaled as m grows */
            for (long long j0 = 0; j0 < kend; j0 += BK) {
                mbt_attn_key_tile<T, D, E, D + 1, E + 1>(ks, vs, k, v, a, z, kh, j0);
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
                    const int r = warp * RPW + rr;
                    const long long t = t0 + r, j = j0 + lane;
                    if (t >= a.T) break;
                    bool seen;
                    float p, alpha;
                    if (!mbt_attn_score_online<D, CAUSAL>(a, qs[r], ks[lane], t, j, seen, m[rr], p, alpha)) continue;
                    const float dp = seen ? mbt_dot<E>(dos[r], vs[lane]) : 0.0f;
                    l[rr] = l[rr] * alpha + p; /* this lane's parts, added up below */
                    pdp[rr] = pdp[rr] * alpha + p * dp;
                }
            }
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const long long t = t0 + warp * RPW + rr;
                if (t >= a.T) break;
                l[rr] = mbt_warp_reduce(l[rr], MbtAdd());
                pdp[rr] = mbt_warp_reduce(pdp[rr], MbtAdd());
                pdp[rr] = l[rr] > 0.0f ? pdp[rr] / l[rr] : 0.0f;
                if (stats_out && t < a.T && lane < 3)
                    mbt_st(stats_out + mbt_at(a.stats, z, h, t, lane), lane == 0 ? m[rr] : lane == 1 ? l[rr] : pdp[rr]);
            }
        } else {
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const long long t = t0 + warp * RPW + rr;
                if (t >= a.T) break;
                m[rr] = mbt_ld(stats_in + mbt_at(a.stats, z, h, t, 0));
                l[rr] = mbt_ld(stats_in + mbt_at(a.stats, z, h, t, 1));
                pdp[rr] = mbt_ld(stats_in + mbt_at(a.stats, z, h, t, 2));
            }
        }
        for (long long j0 = 0; j0 < kend; j0 += BK) { /* dq_i = sum_j scale P_ij (dP_ij - pdp_i) k_j */
            mbt_attn_key_tile<T, D, E, D + 1, E + 1>(ks, vs, k, v, a, z, kh, j0);
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int r = warp * RPW + rr;
                const long long t = t0 + r, j = j0 + lane;
                if (t >= a.T) break;
                if (!(l[rr] > 0.0f)) continue; /* a row that sees no key: dq stays 0 */
                const bool seen = mbt_attn_sees<CAUSAL>(a, t, j);
                float w = 0.0f;
                if (seen) {
                    const float s = a.scale * mbt_dot<D>(qs[r], ks[lane]);
                    const float p = expf(s - m[rr]) / l[rr], dp = mbt_dot<E>(dos[r], vs[lane]);
                    w = a.scale * (p * (dp - pdp[rr]));
                }
                ws[r][lane] = w;
                __syncwarp();
                mbt_attn_accum<D, DC, D + 1>(dq[rr], ws[r], ks, 1.0f);
            }
        }
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const long long t = t0 + warp * RPW + rr;
            if (t < a.T) mbt_attn_put<T, D, DC, NOUT>(a.out, out, z, h, t, dq[rr], 1.0f);
        }
    }
}

/* ---- the backward of k and v: dk [Z, Hk, S, D], dv [Z, Hk, S, E] (either or both) ----------------- */

template <typename T, int D, int E, bool CAUSAL, bool WANT_K, bool WANT_V, int NOUT_K, int NOUT_V>
static __device__ void mbt_attn_bwd_kv(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                       const float *stats, T *const *out_k, T *const *out_v) {
    const int RPW = MbtAttnRows<D, E>::per_warp, BKR = MbtAttnRows<D, E>::per_block, BQ = MBT_ATTN_TILE;
    const int DC = (D + 31) / 32, EC = (E + 31) / 32;
    __shared__ float kr[BKR][D], vr[BKR][WANT_K ? E : 1], qs[BQ][D + 1], dos[BQ][E + 1], st[BQ][3];
    __shared__ float wk[WANT_K ? BKR : 1][BQ], wv[WANT_V ? BKR : 1][BQ];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long G = a.H / a.Hk, tiles = (a.S + BKR - 1) / BKR, shift = a.S - a.T;
    for (long long tile = blockIdx.x; tile < a.Z * a.Hk * tiles; tile += gridDim.x) {
        const long long z = tile / (a.Hk * tiles), kh = tile / tiles % a.Hk, j0 = tile % tiles * BKR;
        __syncthreads();
        mbt_attn_tile<T, BKR, D, D>(kr, k, a.k, z, kh, j0, a.S);
        if constexpr (WANT_K) mbt_attn_tile<T, BKR, E, E>(vr, v, a.v, z, kh, j0, a.S);
        float dk[RPW][DC], dv[RPW][EC];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
#pragma unroll
            for (int dc = 0; dc < DC; dc++) dk[rr][dc] = 0.0f;
#pragma unroll
            for (int ec = 0; ec < EC; ec++) dv[rr][ec] = 0.0f;
        }
        long long ifirst = CAUSAL ? j0 - shift : 0; /* the first query row that sees the tile's first key */
        if (ifirst < 0) ifirst = 0;
        for (long long g = 0; g < G; g++) {
            const long long h = kh * G + g;
            for (long long i0 = ifirst; i0 < a.T; i0 += BQ) {
                mbt_attn_query_tile<T, D, E, D + 1, E + 1>(qs, dos, st, q, dout, stats, a, z, h, i0);
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
                    const int r = warp * RPW + rr;
                    const long long j = j0 + r, i = i0 + lane;
                    if (j >= a.S) break;
                    const bool seen = mbt_attn_sees<CAUSAL>(a, i, j);
                    float p = 0.0f, w = 0.0f;
                    if (seen) {
                        const float s = a.scale * mbt_dot<D>(qs[lane], kr[r]);
                        p = expf(s - st[lane][0]) / st[lane][1];
                        if (WANT_K) w = a.scale * (p * (mbt_dot<E>(dos[lane], vr[r]) - st[lane][2]));
                    }
                    if (WANT_K) wk[r][lane] = w;
                    if (WANT_V) wv[r][lane] = p;
                    __syncwarp();
                    if (WANT_K) mbt_attn_accum<D, DC, D + 1>(dk[rr], wk[r], qs, 1.0f);
                    if (WANT_V) mbt_attn_accum<E, EC, E + 1>(dv[rr], wv[r], dos, 1.0f);
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const long long j = j0 + warp * RPW + rr;
            if (j >= a.S) break;
            if (WANT_K) mbt_attn_put<T, D, DC, NOUT_K>(a.out, out_k, z, kh, j, dk[rr], 1.0f);
            if (WANT_V) mbt_attn_put<T, E, EC, NOUT_V>(WANT_K ? a.out_v : a.out, out_v, z, kh, j, dv[rr], 1.0f);
        }
    }
}

/* acc[i][c] += the W-long dot product of shared row rg + 16 i of x and row cg + 8 c of y (rg, cg: the
 * thread's row and column groups), each term an fmaf in d's order: one load of a row feeds CT
 * (or RT) multiply-adds. The forward's scores, and the backward's scores and dP. */
template <int W, int RT, int CT, int P>
static __device__ __forceinline__ void mbt_attn_f32t_dot(const float (*x)[P], const float (*y)[P], float (*acc)[CT]) {
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
#pragma unroll 4
    for (int d = 0; d < W; d++) {
        float xr[RT], yc[CT];
#pragma unroll
        for (int i = 0; i < RT; i++) xr[i] = x[rg + 16 * i][d];
#pragma unroll
        for (int c = 0; c < CT; c++) yc[c] = y[cg + 8 * c][d];
#pragma unroll
        for (int i = 0; i < RT; i++)
#pragma unroll
            for (int c = 0; c < CT; c++) acc[i][c] = fmaf(xr[i], yc[c], acc[i][c]);
    }
}

/* ---- the forward in the flash-attention-2 design on the CUDA cores (f32 programs, issue 14) ------
 * What programs of f32 run for the forward (compiler/backend/cuda/cuda_dedicated.c): the same
 * computation as mbt_attn_forward above, in f32 (no TF32), organised as rt_attention_fa2.cuh's
 * forward rather than a key a lane:
 *   - a block of 128 threads owns BQ query rows (64; 32 when D > 64, so that the tiles fit 48 KB of
 *     static shared memory), staged once in shared memory; keys and values come in tiles of BK rows
 *     (32; 16 when D + E > 128);
 *   - the threads are 16 row groups x 8 column groups: thread (rg, cg) owns rows rg + 16 i (i < RT =
 *     BQ / 16) and, of the BQ x BK score tile, keys cg + 8 c (c < BK / 8), of the output columns
 *     cg + 8 e (e < ET = ceil(E / 8)): the scores and the BQ x E output stay in registers, each
 *     shared value read serves RT or BK / 8 (ET) multiply-adds instead of one;
 *   - a row's 8 column groups are 8 neighbouring lanes of one warp: its maximum and, at the end, its
 *     sum are combined with three shuffles in a fixed order (xor 1, 2, 4), and its probabilities go
 *     through a shared slot that only its own warp reads (__syncwarp, no block barrier);
 *   - causal: the block stops at the last key its last row sees (tiles above the diagonal are
 *     never loaded); masked elements are -inf, P 0.
 * Products are fmaf in a fixed order (d ascending for a score, keys ascending for the output), so
 * results depend only on the shapes: bit-identical run to run. Statistics as mbt_attn_forward
 * (slot 0 the maximum of the scaled scores, slot 1 the sum), so that either backward loads them.
 * Not here (docs/cuda.md): cp.async double buffering, float4 shared loads, the document mask, and
 * the backward in this design (the backward of f32 programs is the kernels above). */
template <int D, int E> struct MbtAttnF32t {
    static const int BQ = D > 64 ? 32 : 64, BK = D + E > 128 ? 16 : 32;
    static const int RT = BQ / 16, CT = BK / 8, ET = (E + 7) / 8;
};

template <typename T, int D, int E, bool CAUSAL, int NOUT>
static __device__ void mbt_attn_f32t_forward(const MbtAttn &a, const T *q, const T *k, const T *v, T *const *out,
                                             float *stats) {
    const int BQ = MbtAttnF32t<D, E>::BQ, BK = MbtAttnF32t<D, E>::BK, RT = MbtAttnF32t<D, E>::RT;
    const int CT = MbtAttnF32t<D, E>::CT, ET = MbtAttnF32t<D, E>::ET;
    static_assert(MBT_ATTN_WARPS * 32 == 128, "16 row groups of 8 threads");
    /* pitches one more than the width: the rows a warp reads at once fall on distinct banks */
    __shared__ float qs[BQ][D + 1], ks[BK][D + 1], vs[BK][E + 1], ps[BQ][BK + 1];
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        /* a head's last rows first: under a causal mask they see the most keys */
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = (tiles - 1 - tile % tiles) * BQ, kh = h / G;
        __syncthreads(); /* the previous tile is done with the shared rows */
        mbt_attn_tile<T, BQ, D, D + 1>(qs, q, a.q, z, h, t0, a.T);
        float m[RT], l[RT], o[RT][ET];
#pragma unroll
        for (int i = 0; i < RT; i++) {
            m[i] = -MBT_INF_F;
            l[i] = 0.0f;
#pragma unroll
            for (int e = 0; e < ET; e++) o[i][e] = 0.0f;
        }
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ);
        for (long long j0 = 0; j0 < kend; j0 += BK) {
            __syncthreads(); /* every thread is done with the previous tile (and its slots in ps) */
            mbt_attn_tile<T, BK, D, D + 1>(ks, k, a.k, z, kh, j0, a.S);
            mbt_attn_tile<T, BK, E, E + 1>(vs, v, a.v, z, kh, j0, a.S);
            __syncthreads();
            float s[RT][CT];
#pragma unroll
            for (int i = 0; i < RT; i++)
#pragma unroll
                for (int c = 0; c < CT; c++) s[i][c] = 0.0f;
            mbt_attn_f32t_dot<D, RT, CT>(qs, ks, s);
#pragma unroll
            for (int i = 0; i < RT; i++) {
                const int r = rg + 16 * i;
                const long long t = t0 + r;
                float mt = -MBT_INF_F;
#pragma unroll
                for (int c = 0; c < CT; c++) {
                    s[i][c] = mbt_attn_sees<CAUSAL>(a, t, j0 + cg + 8 * c) ? a.scale * s[i][c] : -MBT_INF_F;
                    mt = mt > s[i][c] ? mt : s[i][c];
                }
#pragma unroll
                for (int x = 1; x < 8; x <<= 1) { /* the row's 8 lanes, a fixed order */
                    const float y = __shfl_xor_sync(0xffffffffu, mt, x);
                    mt = mt > y ? mt : y;
                }
                const float mn = m[i] > mt ? m[i] : mt;
                /* a row that has seen no key yet: its P is 0 and nothing is rescaled */
                const float alpha = mn == -MBT_INF_F ? 1.0f : expf(m[i] - mn);
                float ls = 0.0f;
#pragma unroll
                for (int c = 0; c < CT; c++) {
                    const float p = s[i][c] == -MBT_INF_F ? 0.0f : expf(s[i][c] - mn);
                    ls = ls + p;
                    ps[r][cg + 8 * c] = p;
                }
                m[i] = mn;
                l[i] = l[i] * alpha + ls; /* this lane's part of the row sum: added up at the end */
#pragma unroll
                for (int e = 0; e < ET; e++) o[i][e] *= alpha;
            }
            __syncwarp(); /* a row's slots are written and read by its own 8 lanes, one warp */
            for (int jj = 0; jj < BK; jj++) { /* O += P V, keys in order */
                float pr[RT];
#pragma unroll
                for (int i = 0; i < RT; i++) pr[i] = ps[rg + 16 * i][jj];
#pragma unroll
                for (int e = 0; e < ET; e++) {
                    const int c = cg + 8 * e;
                    if (E % 8 != 0 && c >= E) break;
                    const float x = vs[jj][c];
#pragma unroll
                    for (int i = 0; i < RT; i++) o[i][e] = fmaf(pr[i], x, o[i][e]);
                }
            }
            /* the next tile's first barrier orders the reuse of ps, ks and vs */
        }
#pragma unroll
        for (int i = 0; i < RT; i++) {
            const long long t = t0 + rg + 16 * i;
            float sum = l[i];
#pragma unroll
            for (int x = 1; x < 8; x <<= 1) sum = sum + __shfl_xor_sync(0xffffffffu, sum, x);
            if (t >= a.T) continue;
#pragma unroll
            for (int e = 0; e < ET; e++) {
                const int c = cg + 8 * e;
                if (E % 8 != 0 && c >= E) break;
                const float x = sum > 0.0f ? o[i][e] / sum : 0.0f;
#pragma unroll
                for (int u = 0; u < NOUT; u++) mbt_st(out[u] + mbt_at(a.out[u], z, h, t, c), x);
            }
            if (stats && cg < 2) mbt_st(stats + mbt_at(a.stats, z, h, t, cg), cg == 0 ? m[i] : sum);
        }
    }
}

/* ---- the backward in the same tiling (f32 programs, issue 14) ------------------------------------
 * dq per block of BR query rows (Q and dO staged once), walking tiles of BT keys (K and V); dk and
 * dv per block of BR key rows (K and V staged once), walking tiles of BT query rows (Q, dO and the
 * statistics) of every query head of the key head's group: no atomics, bit-identical runs. Threads
 * are 16 row groups x 8 column groups as in the forward: thread (rg, cg) holds, for its rows rg + 16 i,
 * the tile's scores and dP against columns cg + 8 c, and the result columns cg + 8 e, in registers;
 * the weights (dS for dq and dk, P for dv) go through a shared row only that row's warp reads.
 * The statistics are the contract's (slot 0 the scaled maximum, 1 the sum, 2 sum P dP), computed by
 * dq's first walk (COMPUTE) or loaded. Sizes: BR = 64 rows (32 when D + E > 64, 16 when D + E > 128)
 * and BT = 32 (16 when D + E > 128), so that the tiles fit 48 KB of static shared memory. */
template <int D, int E> struct MbtAttnF32tB {
    static const int BR = D + E > 128 ? 16 : D + E > 64 ? 32 : 64, BT = D + E > 128 ? 16 : 32;
    static const int RT = BR / 16, CT = BT / 8;
};

/* The tile's scores (scaled; -inf where row t0 + rg + 16 i does not see key j0 + cg + 8 c, or, with
 * KEYROWS, where query j0 + cg + 8 c does not see key t0 + rg + 16 i) and, with DP, the products
 * dP of the second pair of operands: rows x (D wide) against cols y, rows x2 (E wide) against y2. */
template <int D, int E, int RT, int CT, bool CAUSAL, bool KEYROWS, bool DP, int P1, int P2>
static __device__ __forceinline__ void mbt_attn_f32t_scores(const MbtAttn &a, const float (*x)[P1], const float (*y)[P1],
                                                            const float (*x2)[P2], const float (*y2)[P2], long long t0,
                                                            long long j0, float (*s)[CT], float (*dp)[CT]) {
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int c = 0; c < CT; c++) s[i][c] = dp[i][c] = 0.0f;
    mbt_attn_f32t_dot<D, RT, CT>(x, y, s);
    if (DP) mbt_attn_f32t_dot<E, RT, CT>(x2, y2, dp);
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int c = 0; c < CT; c++) {
            const long long r = t0 + rg + 16 * i, col = j0 + cg + 8 * c;
            const bool seen = KEYROWS ? mbt_attn_sees<CAUSAL>(a, col, r) : mbt_attn_sees<CAUSAL>(a, r, col);
            s[i][c] = seen ? a.scale * s[i][c] : -MBT_INF_F;
        }
}

/* acc[i][e] (columns cg + 8 e < W of rows rg + 16 i) += sum over the tile's N rows jj, in order, of
 * w[rg + 16 i][jj] * x[jj][cg + 8 e] */
template <int W, int RT, int N, int WP, int XP>
static __device__ __forceinline__ void mbt_attn_f32t_accum(float (*acc)[(W + 7) / 8], const float (*w)[WP],
                                                           const float (*x)[XP]) {
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
    for (int jj = 0; jj < N; jj++) {
        float wr[RT];
#pragma unroll
        for (int i = 0; i < RT; i++) wr[i] = w[rg + 16 * i][jj];
#pragma unroll
        for (int e = 0; e < (W + 7) / 8; e++) {
            const int c = cg + 8 * e;
            if (W % 8 != 0 && c >= W) break;
            const float xv = x[jj][c];
#pragma unroll
            for (int i = 0; i < RT; i++) acc[i][e] = fmaf(wr[i], xv, acc[i][e]);
        }
    }
}

/* A thread's result rows (rows r0 + rg + 16 i < rows, columns cg + 8 e < W) to every place. */
template <typename T, int W, int RT, int NOUT>
static __device__ __forceinline__ void mbt_attn_f32t_put(const MbtView *views, T *const *out, long long z, long long h,
                                                         long long r0, long long rows, const float (*acc)[(W + 7) / 8]) {
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
#pragma unroll
    for (int i = 0; i < RT; i++) {
        const long long r = r0 + rg + 16 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int e = 0; e < (W + 7) / 8; e++) {
            const int c = cg + 8 * e;
            if (W % 8 != 0 && c >= W) break;
#pragma unroll
            for (int u = 0; u < NOUT; u++) mbt_st(out[u] + mbt_at(views[u], z, h, r, c), acc[i][e]);
        }
    }
}

template <typename T, int D, int E, bool CAUSAL, bool COMPUTE, int NOUT>
static __device__ void mbt_attn_f32t_bwd_q(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                           const float *stats_in, float *stats_out, T *const *out) {
    const int BQ = MbtAttnF32tB<D, E>::BR, BK = MbtAttnF32tB<D, E>::BT, RT = MbtAttnF32tB<D, E>::RT;
    const int CT = MbtAttnF32tB<D, E>::CT, DT = (D + 7) / 8;
    __shared__ float qs[BQ][D + 1], dos[BQ][E + 1], ks[BK][D + 1], vs[BK][E + 1], ws[BQ][BK + 1];
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
    const long long G = a.H / a.Hk, tiles = (a.T + BQ - 1) / BQ;
    for (long long tile = blockIdx.x; tile < a.Z * a.H * tiles; tile += gridDim.x) {
        const long long z = tile / (a.H * tiles), h = tile / tiles % a.H, t0 = (tiles - 1 - tile % tiles) * BQ, kh = h / G;
        __syncthreads();
        mbt_attn_tile<T, BQ, D, D + 1>(qs, q, a.q, z, h, t0, a.T);
        mbt_attn_tile<T, BQ, E, E + 1>(dos, dout, a.dout, z, h, t0, a.T);
        float m[RT], l[RT], pdp[RT], dq[RT][DT];
#pragma unroll
        for (int i = 0; i < RT; i++) {
            m[i] = -MBT_INF_F;
            l[i] = pdp[i] = 0.0f;
#pragma unroll
            for (int e = 0; e < DT; e++) dq[i][e] = 0.0f;
        }
        const long long kend = mbt_attn_keys_seen<CAUSAL>(a, t0, BQ);
        if (COMPUTE) { /* m, l and sum P dP in one pass, the running sums rescaled as m grows */
            for (long long j0 = 0; j0 < kend; j0 += BK) {
                __syncthreads();
                mbt_attn_tile<T, BK, D, D + 1>(ks, k, a.k, z, kh, j0, a.S);
                mbt_attn_tile<T, BK, E, E + 1>(vs, v, a.v, z, kh, j0, a.S);
                __syncthreads();
                float s[RT][CT], dp[RT][CT];
                mbt_attn_f32t_scores<D, E, RT, CT, CAUSAL, false, true>(a, qs, ks, dos, vs, t0, j0, s, dp);
#pragma unroll
                for (int i = 0; i < RT; i++) {
                    float mt = -MBT_INF_F;
#pragma unroll
                    for (int c = 0; c < CT; c++) mt = mt > s[i][c] ? mt : s[i][c];
#pragma unroll
                    for (int x = 1; x < 8; x <<= 1) {
                        const float y = __shfl_xor_sync(0xffffffffu, mt, x);
                        mt = mt > y ? mt : y;
                    }
                    const float mn = m[i] > mt ? m[i] : mt;
                    const float alpha = mn == -MBT_INF_F ? 1.0f : expf(m[i] - mn);
                    float ls = 0.0f, ps = 0.0f;
#pragma unroll
                    for (int c = 0; c < CT; c++) {
                        const float p = s[i][c] == -MBT_INF_F ? 0.0f : expf(s[i][c] - mn);
                        ls = ls + p;
                        ps = ps + p * dp[i][c];
                    }
                    m[i] = mn;
                    l[i] = l[i] * alpha + ls; /* this lane's parts, added up below */
                    pdp[i] = pdp[i] * alpha + ps;
                }
            }
#pragma unroll
            for (int i = 0; i < RT; i++) {
                const long long t = t0 + rg + 16 * i;
#pragma unroll
                for (int x = 1; x < 8; x <<= 1) {
                    l[i] = l[i] + __shfl_xor_sync(0xffffffffu, l[i], x);
                    pdp[i] = pdp[i] + __shfl_xor_sync(0xffffffffu, pdp[i], x);
                }
                pdp[i] = l[i] > 0.0f ? pdp[i] / l[i] : 0.0f;
                if (stats_out && t < a.T && cg < 3)
                    mbt_st(stats_out + mbt_at(a.stats, z, h, t, cg), cg == 0 ? m[i] : cg == 1 ? l[i] : pdp[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < RT; i++) {
                const long long t = t0 + rg + 16 * i;
                if (t >= a.T) continue;
                m[i] = mbt_ld(stats_in + mbt_at(a.stats, z, h, t, 0));
                l[i] = mbt_ld(stats_in + mbt_at(a.stats, z, h, t, 1));
                pdp[i] = mbt_ld(stats_in + mbt_at(a.stats, z, h, t, 2));
            }
        }
        for (long long j0 = 0; j0 < kend; j0 += BK) { /* dq_i = sum_j scale P_ij (dP_ij - pdp_i) k_j */
            __syncthreads();
            mbt_attn_tile<T, BK, D, D + 1>(ks, k, a.k, z, kh, j0, a.S);
            mbt_attn_tile<T, BK, E, E + 1>(vs, v, a.v, z, kh, j0, a.S);
            __syncthreads();
            float s[RT][CT], dp[RT][CT];
            mbt_attn_f32t_scores<D, E, RT, CT, CAUSAL, false, true>(a, qs, ks, dos, vs, t0, j0, s, dp);
#pragma unroll
            for (int i = 0; i < RT; i++)
#pragma unroll
                for (int c = 0; c < CT; c++) {
                    float w = 0.0f; /* a row that sees no key: dq stays 0 */
                    if (l[i] > 0.0f && s[i][c] != -MBT_INF_F) w = a.scale * ((expf(s[i][c] - m[i]) / l[i]) * (dp[i][c] - pdp[i]));
                    ws[rg + 16 * i][cg + 8 * c] = w;
                }
            __syncwarp(); /* a row's slots: its own warp's */
            mbt_attn_f32t_accum<D, RT, BK, BK + 1, D + 1>(dq, ws, ks);
        }
        mbt_attn_f32t_put<T, D, RT, NOUT>(a.out, out, z, h, t0, a.T, dq);
    }
}

template <typename T, int D, int E, bool CAUSAL, bool WANT_K, bool WANT_V, int NOUT_K, int NOUT_V>
static __device__ void mbt_attn_f32t_bwd_kv(const MbtAttn &a, const T *q, const T *k, const T *v, const T *dout,
                                            const float *stats, T *const *out_k, T *const *out_v) {
    const int BKR = MbtAttnF32tB<D, E>::BR, BQ = MbtAttnF32tB<D, E>::BT, RT = MbtAttnF32tB<D, E>::RT;
    const int CT = MbtAttnF32tB<D, E>::CT;
    __shared__ float kr[BKR][D + 1], vr[WANT_K ? BKR : 1][E + 1], qs[BQ][D + 1], dos[BQ][E + 1], st[BQ][3];
    __shared__ float pw[WANT_V ? BKR : 1][BQ + 1], dw[WANT_K ? BKR : 1][BQ + 1];
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3;
    const long long G = a.H / a.Hk, tiles = (a.S + BKR - 1) / BKR, shift = a.S - a.T;
    for (long long tile = blockIdx.x; tile < a.Z * a.Hk * tiles; tile += gridDim.x) {
        const long long z = tile / (a.Hk * tiles), kh = tile / tiles % a.Hk, j0 = tile % tiles * BKR;
        __syncthreads();
        mbt_attn_tile<T, BKR, D, D + 1>(kr, k, a.k, z, kh, j0, a.S);
        if constexpr (WANT_K) mbt_attn_tile<T, BKR, E, E + 1>(vr, v, a.v, z, kh, j0, a.S);
        float dk[RT][WANT_K ? (D + 7) / 8 : 1], dv[RT][WANT_V ? (E + 7) / 8 : 1];
#pragma unroll
        for (int i = 0; i < RT; i++) {
#pragma unroll
            for (int e = 0; e < (WANT_K ? (D + 7) / 8 : 1); e++) dk[i][e] = 0.0f;
#pragma unroll
            for (int e = 0; e < (WANT_V ? (E + 7) / 8 : 1); e++) dv[i][e] = 0.0f;
        }
        long long ifirst = CAUSAL ? j0 - shift : 0; /* the first query row that sees the tile's first key */
        if (ifirst < 0) ifirst = 0;
        for (long long g = 0; g < G; g++) {
            const long long h = kh * G + g;
            for (long long i0 = ifirst; i0 < a.T; i0 += BQ) {
                __syncthreads();
                mbt_attn_tile<T, BQ, D, D + 1>(qs, q, a.q, z, h, i0, a.T);
                mbt_attn_tile<T, BQ, E, E + 1>(dos, dout, a.dout, z, h, i0, a.T);
                mbt_attn_tile<float, BQ, 3, 3>(st, stats, a.stats, z, h, i0, a.T);
                __syncthreads();
                float s[RT][CT], dp[RT][CT];
                mbt_attn_f32t_scores<D, E, RT, CT, CAUSAL, true, WANT_K>(a, kr, qs, vr, dos, j0, i0, s, dp);
#pragma unroll
                for (int i = 0; i < RT; i++)
#pragma unroll
                    for (int c = 0; c < CT; c++) {
                        const int ii = cg + 8 * c;
                        const float p = s[i][c] == -MBT_INF_F ? 0.0f : expf(s[i][c] - st[ii][0]) / st[ii][1];
                        if constexpr (WANT_V) pw[rg + 16 * i][ii] = p;
                        if constexpr (WANT_K) dw[rg + 16 * i][ii] = a.scale * (p * (dp[i][c] - st[ii][2]));
                    }
                __syncwarp(); /* a row's slots: its own warp's */
                if constexpr (WANT_K) mbt_attn_f32t_accum<D, RT, BQ, BQ + 1, D + 1>(dk, dw, qs);
                if constexpr (WANT_V) mbt_attn_f32t_accum<E, RT, BQ, BQ + 1, E + 1>(dv, pw, dos);
            }
        }
        if constexpr (WANT_K) mbt_attn_f32t_put<T, D, RT, NOUT_K>(a.out, out_k, z, kh, j0, a.S, dk);
        if constexpr (WANT_V) mbt_attn_f32t_put<T, E, RT, NOUT_V>(WANT_K ? a.out_v : a.out, out_v, z, kh, j0, a.S, dv);
    }
}
