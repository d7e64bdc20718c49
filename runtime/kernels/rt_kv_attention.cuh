/* rt_kv_attention.cuh - attention over the paged KV cache on the GPU: the template the chunk
 * phase's attention kernels call (the forward over new tokens only: serve and generate,
 * docs/serve.md), specialised by NVRTC for the program's shapes.
 *
 * compiler/backend/cuda writes each kernel with a KKvAttn (kir.h; compiler/fuse/fuse_kv.h says
 * what it computes, and its kernel-IR body, which the CPU runs, computes the same) as a wrapper:
 * the layout as constants (MbtKvAttn) and one call of mbt_kv_attn. The Makefile turns this file
 * into a C string (build/gen/rt_kv_attention_cuh.h) that mbtc puts after rt_attention.cuh (whose
 * MbtView, mbt_at, mbt_ld and mbt_st it uses) when a program has such a kernel.
 * tests/cudaemu/kv_check.cc runs it against a float64 reference on the emulated GPU.
 *
 * A launch's N rows are new tokens of any sequences (a decode is one row of its sequence, a
 * prefill chunk consecutive rows of one); the metadata (fuse_kv.h) gives each row its position
 * pos, its sequence's row of the block table (-1: padding), the position `start` of its
 * sequence's first row in this launch and the pool slot of its own key and value.
 *
 * The work: a block (4 warps) per (row t, key/value head kh), for the G = H / Hk query heads that
 * share kh (grouped-query attention reads each key once for all of them). It
 *   1. writes row t's key and value of head kh into its slot, rounded to the pool's type;
 *   2. splits the row's keys 0 .. pos into 4 contiguous ranges, one a warp (flash-decoding's split
 *      over the cached length, within the block): a warp walks its range in order, keys before
 *      `start` from the pool through the block table (written by earlier launches: nothing in
 *      this launch writes them), the rest from this launch's own k and v rows (row t - pos + j,
 *      rounded to the pool's type as the pool holds them, so the rows of a chunk need no ordering
 *      between blocks). Lane l owns columns l, l + 32, ... of the head: a score is the lanes'
 *      partial dot products summed by the prelude's fixed butterfly, times scale; the warp keeps
 *      the online softmax's running maximum m, sum l and output acc;
 *   3. the second pass: each warp's (m, l, acc) through shared memory, combined in warp order
 *      (M = the largest m, L = sum l exp(m - M), out = sum acc exp(m - M) / L).
 * A padding row's output is zeros. The split depends only on the row's key count, and every sum's
 * order on the shapes alone: a row's result is the same run to run and whatever else the launch
 * holds (batch-invariant, bit for bit). It is not the CPU kernel's bit for bit: that one takes two
 * passes over the keys in order and sums each dot product serially (the emulated check holds both
 * to a float64 reference). */

#define MBT_KV_WARPS 4

struct MbtKvAttn {
    long long N, Hk, block, max_blocks;
    long long per_slot;     /* pool elements a slot: L x 2 x Hk x D */
    long long k_off, v_off; /* elements from the pool's start to this layer's keys (values) of slot 0 */
    float scale;
    MbtView q, k, v, out; /* {offset, -, head, row, col}: [1, heads, N, D] */
};

/* A key or value element as the pool holds it: rounded to P, widened. */
template <typename P> static __device__ __forceinline__ float mbt_kv_round(float x) { return x; }
#if MBT_HALF
template <> __device__ __forceinline__ float mbt_kv_round<__nv_bfloat16>(float x) { return mbt_round_bf16(x); }
template <> __device__ __forceinline__ float mbt_kv_round<__half>(float x) { return __half2float(__float2half_rn(x)); }
#endif

template <typename T, typename P, int D, int G>
static __device__ __forceinline__ void mbt_kv_attn(const MbtKvAttn &a, const T *q, const T *k, const T *v, const int *meta,
                                                   P *pool, T *out) {
    constexpr int C = (D + 31) / 32; /* columns a lane */
    __shared__ float part_m[MBT_KV_WARPS][G], part_l[MBT_KV_WARPS][G];
    __shared__ float part_o[MBT_KV_WARPS][G][D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long N = a.N;
    for (long long b = blockIdx.x; b < N * a.Hk; b += gridDim.x) {
        const long long t = b / a.Hk, kh = b % a.Hk;
        const int seq = meta[1 * N + t];
        if (seq < 0) { /* a padding row: zeros, nothing written to the pool */
            for (int i = threadIdx.x; i < G * D; i += MBT_KV_WARPS * 32)
                mbt_st(out + mbt_at(a.out, 0, kh * G + i / D, t, i % D), 0.0f);
            continue;
        }
        const long long pos = meta[0 * N + t], start = meta[2 * N + t], slot = meta[3 * N + t];
        const int *table = meta + 4 * N + (long long)seq * a.max_blocks;
        /* 1. this row's key and value */
        for (int c = threadIdx.x; c < D; c += MBT_KV_WARPS * 32) {
            mbt_st(pool + slot * a.per_slot + a.k_off + kh * D + c, mbt_ld(k + mbt_at(a.k, 0, kh, t, c)));
            mbt_st(pool + slot * a.per_slot + a.v_off + kh * D + c, mbt_ld(v + mbt_at(a.v, 0, kh, t, c)));
        }
        /* 2. this warp's range of keys */
        float qr[G][C], acc[G][C], m[G], l[G];
        for (int g = 0; g < G; g++) {
            m[g] = -MBT_INF_F, l[g] = 0.0f;
            for (int i = 0; i < C; i++) {
                const int c = lane + 32 * i;
                qr[g][i] = c < D ? mbt_ld(q + mbt_at(a.q, 0, kh * G + g, t, c)) : 0.0f;
                acc[g][i] = 0.0f;
            }
        }
        const long long cnt = pos + 1, per = (cnt + MBT_KV_WARPS - 1) / MBT_KV_WARPS;
        const long long j0 = warp * per, j1 = j0 + per < cnt ? j0 + per : cnt;
        for (long long j = j0; j < j1; j++) {
            float kc[C], vc[C];
            if (j < start) { /* cached: the pool, through the block table */
                const long long s = (long long)table[j / a.block] * a.block + j % a.block;
                const P *kp = pool + s * a.per_slot + a.k_off + kh * D, *vp = pool + s * a.per_slot + a.v_off + kh * D;
                for (int i = 0; i < C; i++) {
                    const int c = lane + 32 * i;
                    kc[i] = c < D ? mbt_ld(kp + c) : 0.0f;
                    vc[i] = c < D ? mbt_ld(vp + c) : 0.0f;
                }
            } else { /* this launch's row of position j */
                const long long r = t - pos + j;
                for (int i = 0; i < C; i++) {
                    const int c = lane + 32 * i;
                    kc[i] = c < D ? mbt_kv_round<P>(mbt_ld(k + mbt_at(a.k, 0, kh, r, c))) : 0.0f;
                    vc[i] = c < D ? mbt_kv_round<P>(mbt_ld(v + mbt_at(a.v, 0, kh, r, c))) : 0.0f;
                }
            }
            for (int g = 0; g < G; g++) {
                float dot = 0.0f;
                for (int i = 0; i < C; i++) dot += qr[g][i] * kc[i];
                const float s = a.scale * mbt_warp_reduce(dot, MbtAdd());
                const float mn = s > m[g] ? s : m[g];
                const float corr = expf(m[g] - mn), p = expf(s - mn);
                l[g] = l[g] * corr + p;
                for (int i = 0; i < C; i++) acc[g][i] = acc[g][i] * corr + p * vc[i];
                m[g] = mn;
            }
        }
        for (int g = 0; g < G; g++) {
            if (lane == 0) part_m[warp][g] = m[g], part_l[warp][g] = l[g];
            for (int i = 0; i < C; i++)
                if (lane + 32 * i < D) part_o[warp][g][lane + 32 * i] = acc[g][i];
        }
        __syncthreads();
        /* 3. the warps' partial results, in warp order */
        for (int i = threadIdx.x; i < G * D; i += MBT_KV_WARPS * 32) {
            const int g = i / D, c = i % D;
            float M = -MBT_INF_F;
            for (int w = 0; w < MBT_KV_WARPS; w++)
                if (part_l[w][g] > 0.0f && part_m[w][g] > M) M = part_m[w][g];
            float L = 0.0f, o = 0.0f;
            for (int w = 0; w < MBT_KV_WARPS; w++) {
                if (!(part_l[w][g] > 0.0f)) continue; /* a warp with no key (cnt < 4 ranges) */
                const float f = expf(part_m[w][g] - M);
                L += part_l[w][g] * f;
                o += part_o[w][g][c] * f;
            }
            mbt_st(out + mbt_at(a.out, 0, kh * G + g, t, c), o / L);
        }
        __syncthreads(); /* the shared partials are read before the next row's overwrite them */
    }
}
