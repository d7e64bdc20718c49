/* kv_check.cc - the paged KV cache's attention template (runtime/kernels/rt_kv_attention.cuh)
 * against a float64 reference, on the emulated GPU. tests/cudaemu/check_kv.sh appends this file to
 * the prelude and templates of tests/cudaemu/kv_shapes.mbt's CUDA C (what mbtc puts before its
 * kernels) and builds it with cudaemu.h into an executable.
 *
 * Each case is one launch of N rows over a pool of scattered blocks (block tables in reverse and
 * interleaved order), whose positions before each sequence's first row were written beforehand (as
 * earlier launches would have, rounded to the pool's type), with q, k and v drawn large (scores with
 * a standard deviation of about 3, so the running maximum moves). Its sequences:
 *   a prefill from position 0 (5 rows: causal within the chunk, every key from the launch's rows);
 *   a decode after 300 cached positions (its 301 keys split 76/76/76/73 across the 4 warps, the
 *   partial results combined in the second pass);
 *   a chunk of 3 rows after 37 cached positions (keys from the pool and from the launch);
 *   decodes at positions 1 and 2 (2 and 3 keys: warps with no key in the combination);
 *   padding rows (no sequence).
 * Two cases launch a scheduler's iteration instead: 64 decodes and a prefill chunk of 9, 73 rows
 * and the 2 padding rows (decode_batch).
 * Held to:
 *   out    within tol of the largest |reference| (f32 results: 1e-5; bf16 results: 1e-2), the
 *          reference in double over the keys as the pool holds them (rounded to its type);
 *          padding rows exactly 0;
 *   pool   each row's key and value in its slot, rounded to the pool's type, bit for bit, and every
 *          other element of the pool unchanged;
 *   alone  each sequence's rows launched alone (at row 0, with no other row) give the same bits as
 *          in the batch (the kernel is batch-invariant), and a launch on 3 blocks (each taking
 *          several rows, the grid-stride loop) the same bits as on N x Hk.
 * Prints `PASS name` / `FAIL name: why` lines and `N passed, M failed`; exit status 1 on a failure. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

namespace kvcheck {

int passed, failed;

template <auto K> void thunk(void **p) { cudaemu::call(K, p); }
template <auto K, class... A> bool launch(const char *name, long long blocks, A... args) {
    void *params[] = {&args...};
    unsigned grid[3] = {(unsigned)(blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks), 1, 1}, block[3] = {128, 1, 1};
    char err[600];
    if (cudaemu::launch(thunk<K>, name, grid, block, params, err, sizeof err)) {
        printf("FAIL %s: %s\n", name, err);
        failed++;
        return false;
    }
    return true;
}

template <typename T, typename P, int D, int G>
__global__ void k_kv(MbtKvAttn a, const T *q, const T *k, const T *v, const int *meta, P *pool, T *out) {
    mbt_kv_attn<T, P, D, G>(a, q, k, v, meta, pool, out);
}

inline float to_f(float x) { return x; }
inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_f(__half x) { return __half2float(x); }
template <typename T> T from_f(float x);
template <> float from_f<float>(float x) { return x; }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __ushort_as_bfloat16(mbt_bf16_bits(x)); }
template <> __half from_f<__half>(float x) { return __float2half_rn(x); }
template <typename T> unsigned bits(T x) {
    unsigned b = 0;
    memcpy(&b, &x, sizeof x);
    return b;
}

unsigned long long rng = 88172645463325252ULL;
double uniform() { /* xorshift64, [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

void check(bool ok, const char *name, const char *what, const char *detail) {
    if (ok) {
        printf("PASS %s/%s%s\n", name, what, detail);
        passed++;
    } else {
        printf("FAIL %s/%s%s\n", name, what, detail);
        failed++;
    }
}

struct Seq {
    int start, n; /* cached positions, new rows */
};

const std::vector<Seq> mixed = {{0, 5}, {300, 1}, {37, 3}, {1, 1}, {2, 1}};

/* A scheduler's whole iteration in one launch (docs/serve.md: a call takes batch.tokens rows, up to
 * 256): 64 decodes after 0 to 189 cached positions, then a prefill chunk of 9 rows after 20: 73
 * rows, more than the 16 a call once took. */
std::vector<Seq> decode_batch() {
    std::vector<Seq> s;
    for (int i = 0; i < 64; i++) s.push_back({(i * 37) % 190, 1});
    s.push_back({20, 9});
    return s;
}

/* One case: T the type of q, k, v and the result, P the pool's; Hk key/value heads of D columns,
 * G query heads each; blocks of B tokens; the launch's sequences seqs (mixed unless given). */
template <typename T, typename P, int D, int G>
void run(const char *name, long long Hk, long long B, double tol, const std::vector<Seq> &seqs = mixed) {
    const long long pad = 2, H = Hk * G, L = 3, layer = 1;
    long long N = pad, maxlen = 0;
    for (const Seq &s : seqs) N += s.n, maxlen = maxlen > s.start + s.n ? maxlen : s.start + s.n;
    const long long maxb = (maxlen + B - 1) / B, nseq = (long long)seqs.size(), nblocks = nseq * maxb + 3;
    /* block tables: sequence i's block b is i + nseq * (maxb - 1 - b) + 3: reversed, interleaved */
    std::vector<int> table(nseq * maxb);
    for (long long i = 0; i < nseq; i++)
        for (long long b = 0; b < maxb; b++) table[i * maxb + b] = (int)(i + nseq * (maxb - 1 - b) + 3);
    const long long per_slot = L * 2 * Hk * D, k_off = layer * 2 * Hk * D, v_off = k_off + Hk * D;
    std::vector<P> pool(nblocks * B * per_slot);
    for (auto &x : pool) x = from_f<P>((float)uniform());
    /* the rows: sequence i's rows in order; their metadata */
    std::vector<int> meta(N * (4 + maxb), 0);
    std::vector<long long> row_seq(N, -1);
    long long r = 0;
    for (long long i = 0; i < nseq; i++) {
        for (int t = 0; t < seqs[i].n; t++, r++) {
            int pos = seqs[i].start + t;
            meta[0 * N + r] = pos, meta[1 * N + r] = (int)i, meta[2 * N + r] = seqs[i].start;
            meta[3 * N + r] = table[i * maxb + pos / B] * (int)B + pos % (int)B;
            row_seq[r] = i;
        }
        for (long long b = 0; b < maxb; b++) meta[4 * N + i * maxb + b] = table[i * maxb + b];
    }
    for (; r < N; r++) meta[0 * N + r] = 0, meta[1 * N + r] = -1, meta[3 * N + r] = -1;
    std::vector<T> q(H * N * D), k(Hk * N * D), v(Hk * N * D);
    for (auto &x : q) x = from_f<T>((float)(2.5 * uniform()));
    for (auto &x : k) x = from_f<T>((float)(2.5 * uniform()));
    for (auto &x : v) x = from_f<T>((float)uniform());
    const double scale = 1.0 / sqrt((double)D);
    MbtKvAttn a = {N, Hk, B, maxb, per_slot, k_off, v_off, (float)scale, {0, 0, N * D, D, 1}, {0, 0, N * D, D, 1},
                   {0, 0, N * D, D, 1}, {0, 0, N * D, D, 1}};
    /* the reference: keys j < start from the pool as it was, the rest the launch's rows rounded to P */
    std::vector<double> want(H * N * D, 0.0);
    auto key = [&](long long t, long long j, long long kh, int c, int which) -> double {
        long long seq = meta[1 * N + t], pos = meta[0 * N + t], start = meta[2 * N + t];
        if (j < start) {
            long long s = (long long)table[seq * maxb + j / B] * B + j % B;
            return to_f(pool[s * per_slot + (which ? v_off : k_off) + kh * D + c]);
        }
        long long row = t - pos + j;
        return to_f(from_f<P>(to_f((which ? v : k)[(kh * N + row) * D + c])));
    };
    for (long long t = 0; t < N; t++) {
        if (row_seq[t] < 0) continue;
        long long pos = meta[0 * N + t];
        for (long long h = 0; h < H; h++) {
            long long kh = h / G;
            std::vector<double> s(pos + 1);
            double m = -INFINITY, l = 0;
            for (long long j = 0; j <= pos; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double)to_f(q[(h * N + t) * D + c]) * key(t, j, kh, c, 0);
                s[j] = scale * d, m = fmax(m, s[j]);
            }
            for (long long j = 0; j <= pos; j++) l += exp(s[j] - m);
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (long long j = 0; j <= pos; j++) o += exp(s[j] - m) * key(t, j, kh, c, 1);
                want[(h * N + t) * D + c] = o / l;
            }
        }
    }
    std::vector<P> pool0 = pool;
    std::vector<T> out(H * N * D, from_f<T>(7.0f));
    if (!launch<&k_kv<T, P, D, G>>(name, N * Hk, a, q.data(), k.data(), v.data(), meta.data(), pool.data(), out.data())) return;
    double mx = 0, err = 0;
    bool pad_zero = true;
    for (long long h = 0; h < H; h++)
        for (long long t = 0; t < N; t++)
            for (int c = 0; c < D; c++) {
                long long i = (h * N + t) * D + c;
                if (row_seq[t] < 0) pad_zero &= to_f(out[i]) == 0.0f;
                else mx = fmax(mx, fabs(want[i]));
            }
    for (long long h = 0; h < H; h++)
        for (long long t = 0; t < N; t++)
            for (int c = 0; c < D && row_seq[t] >= 0; c++) {
                long long i = (h * N + t) * D + c;
                double e = fabs(want[i] - to_f(out[i])) / (mx > 0 ? mx : 1);
                err = e == e && err == err ? fmax(err, e) : NAN;
            }
    char detail[160];
    snprintf(detail, sizeof detail, " (%.2g of the largest |value| %.3g; tolerance %g)", err, mx, tol);
    check(err <= tol, name, "out", detail);
    check(pad_zero, name, "padding", pad_zero ? " (zeros)" : ": a padding row is not 0");
    /* the pool: each row's slot holds its key and value rounded to P; nothing else changed */
    long long wrong = 0;
    std::vector<char> touched(pool.size(), 0);
    for (long long t = 0; t < N; t++) {
        if (row_seq[t] < 0) continue;
        long long s = meta[3 * N + t];
        for (long long kh = 0; kh < Hk; kh++)
            for (int c = 0; c < D; c++)
                for (int which = 0; which < 2; which++) {
                    long long at = s * per_slot + (which ? v_off : k_off) + kh * D + c;
                    touched[at] = 1;
                    wrong += bits(pool[at]) != bits(from_f<P>(to_f((which ? v : k)[(kh * N + t) * D + c])));
                }
    }
    for (size_t i = 0; i < pool.size(); i++) wrong += !touched[i] && bits(pool[i]) != bits(pool0[i]);
    snprintf(detail, sizeof detail, wrong ? ": %lld elements wrong" : " (each row's key and value in its slot, the rest as it was)",
             wrong);
    check(wrong == 0, name, "pool", detail);
    /* each sequence alone, from the pool as it was: the same bits */
    long long differ = 0;
    r = 0;
    for (long long i = 0; i < nseq; i++) {
        long long n = seqs[i].n;
        std::vector<int> m1((size_t)(n * (4 + maxb)), 0);
        for (long long t = 0; t < n; t++)
            for (int f = 0; f < 4; f++) m1[f * n + t] = meta[f * N + r + t];
        for (long long t = 0; t < n; t++) m1[1 * n + t] = 0; /* its table's row 0 */
        for (long long b = 0; b < maxb; b++) m1[4 * n + b] = table[i * maxb + b];
        std::vector<T> q1(H * n * D), k1(Hk * n * D), v1(Hk * n * D), o1(H * n * D);
        for (long long h = 0; h < H; h++)
            for (long long t = 0; t < n; t++)
                for (int c = 0; c < D; c++) q1[(h * n + t) * D + c] = q[(h * N + r + t) * D + c];
        for (long long h = 0; h < Hk; h++)
            for (long long t = 0; t < n; t++)
                for (int c = 0; c < D; c++)
                    k1[(h * n + t) * D + c] = k[(h * N + r + t) * D + c], v1[(h * n + t) * D + c] = v[(h * N + r + t) * D + c];
        std::vector<P> p1 = pool0;
        MbtKvAttn a1 = a;
        a1.N = n;
        a1.q = a1.k = a1.v = a1.out = MbtView{0, 0, n * D, D, 1};
        if (!launch<&k_kv<T, P, D, G>>(name, n * Hk, a1, q1.data(), k1.data(), v1.data(), m1.data(), p1.data(), o1.data())) return;
        for (long long h = 0; h < H; h++)
            for (long long t = 0; t < n; t++)
                for (int c = 0; c < D; c++) differ += bits(o1[(h * n + t) * D + c]) != bits(out[(h * N + r + t) * D + c]);
        r += n;
    }
    snprintf(detail, sizeof detail, differ ? ": %lld elements differ from the batch's" : " (each sequence alone: bit for bit the batch's)",
             differ);
    check(differ == 0, name, "alone", detail);
    /* 3 blocks taking every row in turn: the same bits */
    std::vector<P> p3 = pool0;
    std::vector<T> o3(out.size(), from_f<T>(7.0f));
    if (!launch<&k_kv<T, P, D, G>>(name, 3, a, q.data(), k.data(), v.data(), meta.data(), p3.data(), o3.data())) return;
    differ = 0;
    for (size_t i = 0; i < out.size(); i++) differ += bits(o3[i]) != bits(out[i]);
    for (size_t i = 0; i < pool.size(); i++) differ += bits(p3[i]) != bits(pool[i]);
    snprintf(detail, sizeof detail, differ ? ": %lld elements differ" : " (3 blocks: bit for bit)", differ);
    check(differ == 0, name, "grid-stride", detail);
}

} // namespace kvcheck

int main() {
    using namespace kvcheck;
    run<float, float, 64, 1>("f32-d64", 2, 16, 1e-5);               /* GPT-2's head width, blocks of 16 */
    run<float, float, 16, 2>("f32-d16-gqa", 2, 4, 1e-5);            /* narrow heads (lanes 16..31 idle), 2 query heads a kv head */
    run<float, float, 40, 3>("f32-d40-gqa", 1, 7, 1e-5);            /* a width not a multiple of 32, blocks of 7 */
    run<float, __nv_bfloat16, 64, 4>("bf16-pool-d64-gqa", 2, 16, 1e-5); /* a bf16 pool (the reference reads it rounded) */
    run<float, __half, 128, 2>("f16-pool-d128", 1, 16, 1e-5);       /* an f16 pool, 4 columns a lane */
    run<__nv_bfloat16, __nv_bfloat16, 32, 2>("bf16-d32", 2, 8, 1e-2); /* bf16 q, k, v and results */
    run<float, float, 256, 4>("f32-d256-g4", 1, 16, 1e-5);           /* the largest G x D: 1024 */
    run<float, float, 64, 1>("f32-d64-rows75", 2, 16, 1e-5, decode_batch()); /* 75 rows: a decode batch of 64 and a chunk */
    run<float, __nv_bfloat16, 32, 2>("bf16-pool-d32-rows75", 2, 8, 1e-5, decode_batch()); /* the same, a bf16 pool, GQA */
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
