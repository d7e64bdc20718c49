/* rt_attention_tc.cuh - attention's forward on the tensor cores, for bf16 and f16 programs: the
 * same computation as rt_attention.cuh's mbt_attn_forward (which it follows, and whose helpers it
 * uses), with the two matrix products of each tile - the scores Q K^T and the weighted values
 * P V - made by warp matrix multiply-accumulate (nvcuda::wmma, 16 x 16 x 16, f32 accumulation).
 *
 * compiler/cuda.c writes an attention forward whose element type is bf16 or f16 and whose head
 * widths D and E are multiples of 16, at most 64, as a call of mbt_attn_forward_tc (the Makefile
 * embeds this file as mbt_rt_attention_tc_cuh; it follows rt_attention.cuh in the translation
 * unit). tests/cudaemu/cudaemu.h emulates wmma (each thread holding the whole tile, its documented
 * alignment rules checked), so the gpu-emu layer runs it.
 *
 * The work: 4 warps a block, 16 query rows a warp (64 a block), tiles of 32 keys in shared memory
 * as the element type. Per tile a warp computes its 16 x 32 scores with wmma into shared memory
 * (f32); the lanes then take a key each, as in the CUDA-core kernel: the row's running maximum by
 * the warp's butterfly, each lane's share of the row sum, and P = exp(s - m) rounded to the element
 * type for the second product (as flash attention does; the row sums keep P unrounded); P V comes
 * back from wmma through shared memory, and each lane folds its columns into the row's output,
 * which it keeps in registers so that the rescaling by exp(m_old - m_new) is per row. Static
 * shared memory: 41 KB at D = E = 64. */

#include <mma.h>

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
            /* the warp's scores Q K^T: 16 x 32, two accumulator tiles over D in steps of 16 */
            {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> sc[BK / 16];
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb; /* K^T: K's rows, column-major */
#pragma unroll
                for (int n = 0; n < BK / 16; n++) wmma::fill_fragment(sc[n], 0.0f);
#pragma unroll
                for (int k0 = 0; k0 < D; k0 += 16) {
                    wmma::load_matrix_sync(fa, &qs[warp * 16][k0], QP);
#pragma unroll
                    for (int n = 0; n < BK / 16; n++) {
                        wmma::load_matrix_sync(fb, &ks[n * 16][k0], QP);
                        wmma::mma_sync(sc[n], fa, fb, sc[n]);
                    }
                }
#pragma unroll
                for (int n = 0; n < BK / 16; n++) wmma::store_matrix_sync(&ss[warp][0][n * 16], sc[n], SP, wmma::mem_row_major);
            }
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
