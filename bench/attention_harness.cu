/* attention_harness.cu - bench/attention's driver of mbt's attention kernels: the prelude and
 * templates a program's CUDA C starts with (mbtc --emit=cuda, up to the first kernel: the file
 * bench/attention passes as -include), then a few kernels that call the templates on contiguous
 * [B, heads, rows, width] bf16 tensors, and one C entry point that launches one of them.
 *
 * Built two ways by bench/attention:
 *   on a GPU machine: nvcc -shared (sm_80 or later), launched with <<<>>> on the current stream;
 *   --dry, on any machine: g++ with tests/cudaemu/cudaemu.h forced in (MBT_CUDAEMU), launched on
 *   the emulated GPU (host pointers, synchronous).
 * Nothing here is product code (tests and benchmarks only). */

#include <stdio.h>

typedef __nv_bfloat16 bf16;

/* kind: 0 the flash-attention-2 forward (rt_attention_fa2.cuh), 1 rt_attention_tc.cuh's wmma
 * forward (heads of at most 64), 2 rt_attention.cuh's CUDA-core forward */
/* The forward's launch bounds: compiler/backend/cuda/cuda.c's, 3 blocks an SM for the FA2 forward
 * with D + E <= 128, else 2; -DMBT_BENCH_FWD_BLOCKS=N (bench/attention --define) tries another. */
#ifdef MBT_BENCH_FWD_BLOCKS
template <int KIND, int D> constexpr int bench_fwd_blocks = MBT_BENCH_FWD_BLOCKS;
#else
template <int KIND, int D> constexpr int bench_fwd_blocks = KIND == 0 && 2 * D <= 128 ? 3 : 2;
#endif

/* The document mask (issue 20): positions [B, T] (i32) that mbt_bench_set_pos sets for the calls
 * after it (nullptr: none); the FA2 kernels then run with DOCS (query t sees keys t - pos .. t). */
static const int *bench_pos = nullptr;
extern "C" void mbt_bench_set_pos(const void *pos) { bench_pos = (const int *)pos; }
static void bench_docs(MbtAttn &a) {
    a.pos = bench_pos;
    a.posv = MbtView{0, a.T, 0, 1, 0};
}

template <int KIND, int D, bool C, bool DOCS = false>
__global__ void __launch_bounds__(128, (bench_fwd_blocks<KIND, D>)) bench_fwd(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v, bf16 *o, float *stats) {
    bf16 *const out[1] = {o};
    if constexpr (KIND == 0) mbt_attn_fa2_forward<bf16, D, D, C, 1, DOCS>(a, q, k, v, out, stats);
    else if constexpr (KIND == 1) {
        if constexpr (D <= 64) mbt_attn_forward_tc<bf16, D, D, C, 1>(a, q, k, v, out);
    } else mbt_attn_forward<bf16, D, D, C, 1>(a, q, k, v, out, stats);
}

static MbtView bench_view(long long heads, long long rows, long long cols) {
    return MbtView{0, heads * rows * cols, rows * cols, cols, 1};
}

#ifdef MBT_CUDAEMU
template <auto K> static void bench_thunk(void **p) { cudaemu::call(K, p); }
#endif

template <int KIND, int D, bool C, bool DOCS = false>
static int bench_launch(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v, bf16 *o, float *stats) {
    const long long rows = KIND == 2 ? MbtAttnRows<D, D>::per_block : 64, tiles = a.Z * a.H * ((a.T + rows - 1) / rows);
    const unsigned blocks = (unsigned)(tiles < 1 ? 1 : tiles > 2147483647LL ? 2147483647LL : tiles);
#ifdef MBT_CUDAEMU
    void *params[] = {&a, &q, &k, &v, &o, &stats};
    unsigned grid[3] = {blocks, 1, 1}, block[3] = {128, 1, 1};
    char err[600];
    if (cudaemu::launch(bench_thunk<&bench_fwd<KIND, D, C, DOCS>>, "bench_fwd", grid, block, params, err, sizeof err)) {
        fprintf(stderr, "attention_harness: %s\n", err);
        return 1;
    }
    return 0;
#else
    bench_fwd<KIND, D, C, DOCS><<<blocks, 128>>>(a, q, k, v, o, stats);
    return cudaGetLastError() != cudaSuccess;
#endif
}

/* Launches kernel `kind` on q [B, H, T, D], k and v [B, Hk, S, D] (bf16, contiguous) into o
 * [B, H, T, D] and, for the FA2 and CUDA-core kernels when stats is not null, the rows' max and sum into
 * stats [B, H, T, 3]. Returns 0, 1 on a failed launch, 2 for a combination not built here. */
extern "C" int mbt_bench_attention(int kind, int D, int causal, long long B, long long H, long long Hk, long long T,
                                   long long S, const void *q, const void *k, const void *v, void *o, float *stats) {
    MbtAttn a = {B, H, Hk, T, S, 1.0f / sqrtf((float)D), bench_view(H, T, D), bench_view(Hk, S, D), bench_view(Hk, S, D),
                 bench_view(H, T, D), bench_view(H, T, 3), 1, {bench_view(H, T, D)}, 0, {}};
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    bf16 *oo = (bf16 *)o;
    if (bench_pos) { /* the document mask: the FA2 forward, causal, T = S */
        bench_docs(a);
        if (kind != 0 || !causal || T != S) return 2;
        if (D == 64) return bench_launch<0, 64, true, true>(a, qq, kk, vv, oo, stats);
        if (D == 128) return bench_launch<0, 128, true, true>(a, qq, kk, vv, oo, stats);
        return 2;
    }
#define BENCH_CASE(KIND, DD)                                                                                                \
    if (kind == KIND && D == DD)                                                                                           \
        return causal ? bench_launch<KIND, DD, true>(a, qq, kk, vv, oo, stats)                                             \
                      : bench_launch<KIND, DD, false>(a, qq, kk, vv, oo, stats);
    BENCH_CASE(0, 64)
    BENCH_CASE(0, 128)
    BENCH_CASE(1, 64)
    BENCH_CASE(2, 64)
    BENCH_CASE(2, 128)
#undef BENCH_CASE
    return 2;
}

/* The backward: dq (computing the statistics into stats [B, H, T, 3]), then dk and dv together
 * from them; kind as above (0 FA2, 1 wmma for heads of at most 64, 2 CUDA cores). */
template <int KIND, int D, bool C>
__global__ void __launch_bounds__(128, 2) bench_bwd_q(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                                      float *stats, bf16 *dq) {
    bf16 *const out[1] = {dq};
    if constexpr (KIND == 0) mbt_attn_fa2_bwd_q<bf16, D, D, C, true, 1>(a, q, k, v, dout, nullptr, stats, out);
    else if constexpr (KIND == 1) {
        if constexpr (D <= 64) mbt_attn_bwd_q_tc<bf16, D, D, C, true, 1>(a, q, k, v, dout, nullptr, stats, out);
    } else mbt_attn_bwd_q<bf16, D, D, C, true, 1>(a, q, k, v, dout, nullptr, stats, out);
}
template <int KIND, int D, bool C, bool DOCS = false>
__global__ void __launch_bounds__(128, 2) bench_bwd_kv(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                                       const float *stats, bf16 *dk, bf16 *dv) {
    bf16 *const outk[1] = {dk}, *const outv[1] = {dv};
    if constexpr (KIND == 0) mbt_attn_fa2_bwd_kv<bf16, D, D, C, true, true, 1, 1, DOCS>(a, q, k, v, dout, stats, outk, outv);
    else if constexpr (KIND == 1) {
        if constexpr (D <= 64) mbt_attn_bwd_kv_tc<bf16, D, D, C, true, true, 1, 1>(a, q, k, v, dout, stats, outk, outv);
    } else mbt_attn_bwd_kv<bf16, D, D, C, true, true, 1, 1>(a, q, k, v, dout, stats, outk, outv);
}

template <int KIND, int D, bool C>
static int bench_launch_bwd(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, float *stats, bf16 *dq,
                            bf16 *dk, bf16 *dv) {
    const long long rows = KIND == 2 ? MbtAttnRows<D, D>::per_block : 64;
    const long long qt = a.Z * a.H * ((a.T + rows - 1) / rows), kt = a.Z * a.Hk * ((a.S + rows - 1) / rows);
    const unsigned qb = (unsigned)(qt < 1 ? 1 : qt), kb = (unsigned)(kt < 1 ? 1 : kt);
    MbtAttn b = a; /* dk's places in out, dv's in out_v */
    b.out[0] = bench_view(a.Hk, a.S, D);
    b.nout_v = 1;
    b.out_v[0] = bench_view(a.Hk, a.S, D);
    const float *cst = stats;
#ifdef MBT_CUDAEMU
    void *p1[] = {&a, &q, &k, &v, &dout, &stats, &dq}, *p2[] = {&b, &q, &k, &v, &dout, &cst, &dk, &dv};
    unsigned g1[3] = {qb, 1, 1}, g2[3] = {kb, 1, 1}, block[3] = {128, 1, 1};
    char err[600];
    if (cudaemu::launch(bench_thunk<&bench_bwd_q<KIND, D, C>>, "bench_bwd_q", g1, block, p1, err, sizeof err) ||
        cudaemu::launch(bench_thunk<&bench_bwd_kv<KIND, D, C>>, "bench_bwd_kv", g2, block, p2, err, sizeof err)) {
        fprintf(stderr, "attention_harness: %s\n", err);
        return 1;
    }
    return 0;
#else
    bench_bwd_q<KIND, D, C><<<qb, 128>>>(a, q, k, v, dout, stats, dq);
    bench_bwd_kv<KIND, D, C><<<kb, 128>>>(b, q, k, v, dout, cst, dk, dv);
    return cudaGetLastError() != cudaSuccess;
#endif
}

/* The backward of the forward above: dout [B, H, T, D] in; stats [B, H, T, 3] (f32) scratch;
 * dq [B, H, T, D], dk and dv [B, Hk, S, D] out. Returns as mbt_bench_attention. */
extern "C" int mbt_bench_attention_bwd(int kind, int D, int causal, long long B, long long H, long long Hk, long long T,
                                       long long S, const void *q, const void *k, const void *v, const void *dout,
                                       float *stats, void *dq, void *dk, void *dv) {
    MbtAttn a = {B, H, Hk, T, S, 1.0f / sqrtf((float)D), bench_view(H, T, D), bench_view(Hk, S, D), bench_view(Hk, S, D),
                 bench_view(H, T, D), bench_view(H, T, 3), 1, {bench_view(H, T, D)}, 0, {}};
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v, *dd = (const bf16 *)dout;
    bf16 *a1 = (bf16 *)dq, *a2 = (bf16 *)dk, *a3 = (bf16 *)dv;
    if (bench_pos) return 2; /* the document mask: the handed backward only (below) */
#define BENCH_CASE(KIND, DD)                                                                                                \
    if (kind == KIND && D == DD)                                                                                           \
        return causal ? bench_launch_bwd<KIND, DD, true>(a, qq, kk, vv, dd, stats, a1, a2, a3)                             \
                      : bench_launch_bwd<KIND, DD, false>(a, qq, kk, vv, dd, stats, a1, a2, a3);
    BENCH_CASE(0, 64)
    BENCH_CASE(0, 128)
    BENCH_CASE(1, 64)
    BENCH_CASE(2, 64)
    BENCH_CASE(2, 128)
#undef BENCH_CASE
    return 2;
}

/* ---- the backward as programs run it since the forward hands its statistics over (issue 14) ----
 * docs/cuda.md, "The statistics from the forward": the forward (kind 0, with stats) has stored each
 * row's m and l in slots 0 and 1 of stats [B, H, T, 3]; sum P dP = rowsum(dout * o) goes into slot
 * 2, a warp a row as fusion's attention_stats kernel (which also copies m and l from the forward's
 * [.., 2] buffer: 16 more bytes a row than here), then dq loading the three (COMPUTE = false) and dk
 * and dv from them. */
__global__ void __launch_bounds__(128) bench_rowsum(long long rows, int D, const bf16 *o, const bf16 *dout, float *stats) {
    const int lane = threadIdx.x & 31;
    for (long long r = blockIdx.x * 4LL + (threadIdx.x >> 5); r < rows; r += gridDim.x * 4LL) {
        float acc = 0.0f;
        for (int c = lane; c < D; c += 32) acc = acc + __bfloat162float(o[r * D + c]) * __bfloat162float(dout[r * D + c]);
        acc = mbt_warp_reduce(acc, MbtAdd());
        if (lane == 0) stats[r * 3 + 2] = acc;
    }
}
template <int D, bool C, bool DOCS = false>
__global__ void __launch_bounds__(128, 2) bench_bwd_q_loaded(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v,
                                                             const bf16 *dout, const float *stats, bf16 *dq) {
    bf16 *const out[1] = {dq};
    mbt_attn_fa2_bwd_q<bf16, D, D, C, false, 1, DOCS>(a, q, k, v, dout, stats, nullptr, out);
}

template <int D, bool C, bool DOCS = false>
static int bench_launch_handed(MbtAttn a, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *o, const bf16 *dout,
                               float *stats, bf16 *dq, bf16 *dk, bf16 *dv) {
    long long rows = a.Z * a.H * a.T; /* not const: a launch parameter's address */
    const long long rb = (rows + 3) / 4;
    const long long qt = a.Z * a.H * ((a.T + 63) / 64), kt = a.Z * a.Hk * ((a.S + 63) / 64);
    const unsigned sb = (unsigned)(rb < 1 ? 1 : rb > 65535 ? 65535 : rb), qb = (unsigned)(qt < 1 ? 1 : qt),
                   kb = (unsigned)(kt < 1 ? 1 : kt);
    MbtAttn b = a; /* dk's places in out, dv's in out_v */
    b.out[0] = bench_view(a.Hk, a.S, D);
    b.nout_v = 1;
    b.out_v[0] = bench_view(a.Hk, a.S, D);
    const float *cst = stats;
    int width = D;
#ifdef MBT_CUDAEMU
    void *p0[] = {&rows, &width, &o, &dout, &stats}, *p1[] = {&a, &q, &k, &v, &dout, &cst, &dq},
         *p2[] = {&b, &q, &k, &v, &dout, &cst, &dk, &dv};
    unsigned g0[3] = {sb, 1, 1}, g1[3] = {qb, 1, 1}, g2[3] = {kb, 1, 1}, block[3] = {128, 1, 1};
    char err[600];
    if (cudaemu::launch(bench_thunk<&bench_rowsum>, "bench_rowsum", g0, block, p0, err, sizeof err) ||
        cudaemu::launch(bench_thunk<&bench_bwd_q_loaded<D, C, DOCS>>, "bench_bwd_q_loaded", g1, block, p1, err, sizeof err) ||
        cudaemu::launch(bench_thunk<&bench_bwd_kv<0, D, C, DOCS>>, "bench_bwd_kv", g2, block, p2, err, sizeof err)) {
        fprintf(stderr, "attention_harness: %s\n", err);
        return 1;
    }
    return 0;
#else
    bench_rowsum<<<sb, 128>>>(rows, width, o, dout, stats);
    bench_bwd_q_loaded<D, C, DOCS><<<qb, 128>>>(a, q, k, v, dout, cst, dq);
    bench_bwd_kv<0, D, C, DOCS><<<kb, 128>>>(b, q, k, v, dout, cst, dk, dv);
    return cudaGetLastError() != cudaSuccess;
#endif
}

/* The backward after a kind-0 forward that stored m and l into stats [B, H, T, 3]: o [B, H, T, D]
 * the forward's result, dout likewise; dq, dk and dv out (FA2). Returns as mbt_bench_attention. */
extern "C" int mbt_bench_attention_bwd_handed(int D, int causal, long long B, long long H, long long Hk, long long T,
                                              long long S, const void *q, const void *k, const void *v, const void *o,
                                              const void *dout, float *stats, void *dq, void *dk, void *dv) {
    MbtAttn a = {B, H, Hk, T, S, 1.0f / sqrtf((float)D), bench_view(H, T, D), bench_view(Hk, S, D), bench_view(Hk, S, D),
                 bench_view(H, T, D), bench_view(H, T, 3), 1, {bench_view(H, T, D)}, 0, {}};
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v, *oo = (const bf16 *)o;
    const bf16 *dd = (const bf16 *)dout;
    bf16 *a1 = (bf16 *)dq, *a2 = (bf16 *)dk, *a3 = (bf16 *)dv;
    if (bench_pos) { /* the document mask: causal, T = S */
        bench_docs(a);
        if (!causal || T != S) return 2;
        if (D == 64) return bench_launch_handed<64, true, true>(a, qq, kk, vv, oo, dd, stats, a1, a2, a3);
        if (D == 128) return bench_launch_handed<128, true, true>(a, qq, kk, vv, oo, dd, stats, a1, a2, a3);
        return 2;
    }
    if (D == 64)
        return causal ? bench_launch_handed<64, true>(a, qq, kk, vv, oo, dd, stats, a1, a2, a3)
                      : bench_launch_handed<64, false>(a, qq, kk, vv, oo, dd, stats, a1, a2, a3);
    if (D == 128)
        return causal ? bench_launch_handed<128, true>(a, qq, kk, vv, oo, dd, stats, a1, a2, a3)
                      : bench_launch_handed<128, false>(a, qq, kk, vv, oo, dd, stats, a1, a2, a3);
    return 2;
}
