/* attention_check.cc - the attention templates (runtime/kernels/rt_attention.cuh, rt_attention_tc.cuh)
 * against a float64 reference, on the emulated GPU. tests/cudaemu/check_attention.sh appends this
 * file to the prelude and templates of a program's CUDA C (what mbtc puts before its kernels) and
 * builds it with cudaemu.h into an executable.
 *
 * The training steps of tests/gpu/run.sh start from initial weights, whose scores are all near 0:
 * the running maximum hardly moves, so the rescaling of sums from tile to tile is hardly exercised.
 * Here q and k are drawn large (scores with a standard deviation of 4, moving the maximum often),
 * rows span several tiles of keys, heads are grouped, widths differ (D != E), keys can be fewer or
 * more than queries and some causal rows see no key. Each case runs the forward, the backward of q
 * (computing and storing the statistics) and the backward of k and v (loading them) and holds every
 * output to the reference computed in double from the same (rounded) inputs:
 *   f32          within 1e-5 of the largest |reference| of the tensor (each statistic: of its own)
 *   bf16         within 1e-2: results are stored in bf16 (8 significand bits: 2^-9 relative), the
 *                statistics in f32, and the tensor-core kernels round P (and the backward dS) to
 *                bf16 for their products with V, dO, K and Q
 * The backward of q runs twice, computing the statistics and loading them, and dk and dv are made
 * together and each alone: the variants must agree bit for bit.
 * Prints `PASS name` / `FAIL name: why` lines and `N passed, M failed`; exit status 1 on a failure. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#include <vector>

namespace check {

int passed, failed;

/* A launch of kernel K on `blocks` blocks of 128 threads with arguments args. */
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

template <typename T, int D, int E, bool C, bool TC>
__global__ void k_forward(MbtAttn a, const T *q, const T *k, const T *v, T *o) {
    T *const out[1] = {o};
    if constexpr (TC) mbt_attn_forward_tc<T, D, E, C, 1>(a, q, k, v, out);
    else mbt_attn_forward<T, D, E, C, 1>(a, q, k, v, out, nullptr);
}
template <typename T, int D, int E, bool C, bool TC>
__global__ void k_bwd_q(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, float *stats, T *dq) {
    T *const out[1] = {dq};
    if constexpr (TC) mbt_attn_bwd_q_tc<T, D, E, C, true, 1>(a, q, k, v, dout, nullptr, stats, out);
    else mbt_attn_bwd_q<T, D, E, C, true, 1>(a, q, k, v, dout, nullptr, stats, out);
}
/* the CUDA-core forward storing each row's m and l into stats (what programs run since issue 14) */
template <typename T, int D, int E, bool C>
__global__ void k_forward_st(MbtAttn a, const T *q, const T *k, const T *v, T *o, float *stats) {
    T *const out[1] = {o};
    mbt_attn_forward<T, D, E, C, 1>(a, q, k, v, out, stats);
}
/* the flash-attention-2 forward (rt_attention_fa2.cuh), storing m and l into stats */
template <typename T, int D, int E, bool C>
__global__ void k_forward_fa2(MbtAttn a, const T *q, const T *k, const T *v, T *o, float *stats) {
    T *const out[1] = {o};
    mbt_attn_fa2_forward<T, D, E, C, 1>(a, q, k, v, out, stats);
}
/* the f32 forward in the flash-attention-2 design on the CUDA cores (rt_attention.cuh's
   mbt_attn_f32t_forward, what f32 programs run), storing m and l into stats */
template <typename T, int D, int E, bool C>
__global__ void k_forward_f32t(MbtAttn a, const T *q, const T *k, const T *v, T *o, float *stats) {
    T *const out[1] = {o};
    mbt_attn_f32t_forward<T, D, E, C, 1>(a, q, k, v, out, stats);
}
/* the f32 backward in the same tiling: dq computing the statistics or loading them, dk and dv */
template <typename T, int D, int E, bool C, bool COMPUTE>
__global__ void k_bwd_q_f32t(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, float *stats, T *dq) {
    T *const out[1] = {dq};
    mbt_attn_f32t_bwd_q<T, D, E, C, COMPUTE, 1>(a, q, k, v, dout, COMPUTE ? nullptr : stats, COMPUTE ? stats : nullptr, out);
}
template <typename T, int D, int E, bool C, bool WK, bool WV>
__global__ void k_bwd_kv_f32t(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, const float *stats, T *dk, T *dv) {
    T *const outk[1] = {dk}, *const outv[1] = {dv};
    T *const *first = WK ? outk : nullptr, *const *second = WK ? outv : outk;
    mbt_attn_f32t_bwd_kv<T, D, E, C, WK, WV, WK ? 1 : 0, WV ? 1 : 0>(a, q, k, v, dout, stats, first, WV ? second : nullptr);
}
/* the flash-attention-2 backward: dq computing the statistics or loading them, dk and dv */
template <typename T, int D, int E, bool C, bool COMPUTE>
__global__ void k_bwd_q_fa2(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, float *stats, T *dq) {
    T *const out[1] = {dq};
    mbt_attn_fa2_bwd_q<T, D, E, C, COMPUTE, 1>(a, q, k, v, dout, COMPUTE ? nullptr : stats, COMPUTE ? stats : nullptr, out);
}
template <typename T, int D, int E, bool C, bool WK, bool WV>
__global__ void k_bwd_kv_fa2(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, const float *stats, T *dk, T *dv) {
    T *const outk[1] = {dk}, *const outv[1] = {dv};
    T *const *first = WK ? outk : nullptr, *const *second = WK ? outv : outk;
    mbt_attn_fa2_bwd_kv<T, D, E, C, WK, WV, WK ? 1 : 0, WV ? 1 : 0>(a, q, k, v, dout, stats, first, WV ? second : nullptr);
}
/* the flash-attention-2 kernels with the document mask (DOCS: a.pos read) or without it */
template <typename T, int D, int E, bool DOCS>
__global__ void k_forward_fa2_docs(MbtAttn a, const T *q, const T *k, const T *v, T *o, float *stats) {
    T *const out[1] = {o};
    mbt_attn_fa2_forward<T, D, E, true, 1, DOCS>(a, q, k, v, out, stats);
}
template <typename T, int D, int E, bool COMPUTE, bool DOCS>
__global__ void k_bwd_q_fa2_docs(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, float *stats, T *dq) {
    T *const out[1] = {dq};
    mbt_attn_fa2_bwd_q<T, D, E, true, COMPUTE, 1, DOCS>(a, q, k, v, dout, COMPUTE ? nullptr : stats, COMPUTE ? stats : nullptr, out);
}
template <typename T, int D, int E, bool DOCS>
__global__ void k_bwd_kv_fa2_docs(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, const float *stats, T *dk, T *dv) {
    T *const outk[1] = {dk}, *const outv[1] = {dv};
    mbt_attn_fa2_bwd_kv<T, D, E, true, true, true, 1, 1, DOCS>(a, q, k, v, dout, stats, outk, outv);
}
/* dq again from the stored statistics (the kernel fusion makes when dq's kernel does not compute them) */
template <typename T, int D, int E, bool C, bool TC>
__global__ void k_bwd_q_loaded(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, const float *stats, T *dq) {
    T *const out[1] = {dq};
    if constexpr (TC) mbt_attn_bwd_q_tc<T, D, E, C, false, 1>(a, q, k, v, dout, stats, nullptr, out);
    else mbt_attn_bwd_q<T, D, E, C, false, 1>(a, q, k, v, dout, stats, nullptr, out);
}
/* dk and dv: together (WK and WV) or either alone */
template <typename T, int D, int E, bool C, bool TC, bool WK, bool WV>
__global__ void k_bwd_kv(MbtAttn a, const T *q, const T *k, const T *v, const T *dout, const float *stats, T *dk, T *dv) {
    T *const outk[1] = {dk}, *const outv[1] = {dv};
    T *const *first = WK ? outk : nullptr, *const *second = WK ? outv : outk;
    if constexpr (TC) mbt_attn_bwd_kv_tc<T, D, E, C, WK, WV, WK ? 1 : 0, WV ? 1 : 0>(a, q, k, v, dout, stats, first, WV ? second : nullptr);
    else mbt_attn_bwd_kv<T, D, E, C, WK, WV, WK ? 1 : 0, WV ? 1 : 0>(a, q, k, v, dout, stats, first, WV ? second : nullptr);
}

inline float to_f(float x) { return x; }
inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> T from_f(float x);
template <> float from_f<float>(float x) { return x; }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __ushort_as_bfloat16(mbt_bf16_bits(x)); }

/* A contiguous [Z, heads, rows, cols] tensor's view. */
MbtView view(long long heads, long long rows, long long cols) { return MbtView{0, heads * rows * cols, rows * cols, cols, 1}; }

/* max |got - want| over max |want|: `what` of case `name` within tol */
void expect(const char *name, const char *what, const std::vector<double> &want, const std::vector<float> &got, double tol) {
    double m = 0, e = 0;
    for (size_t i = 0; i < want.size(); i++) m = fmax(m, fabs(want[i]));
    for (size_t i = 0; i < want.size(); i++) e = fmax(e, fabs(want[i] - got[i]) / (m > 0 ? m : 1));
    if (e <= tol && e == e) {
        printf("PASS %s/%s (%.2g of the largest)\n", name, what, e);
        passed++;
    } else {
        printf("FAIL %s/%s: off by %.3g of the largest |value| %.3g (tolerance %g)\n", name, what, e, m, tol);
        failed++;
    }
}

/* The FA2 forward of case `name` (its operands, contiguous; its reference out o, maxima sm and sums
 * sl): with k and v as they are (16-byte rows: cp.async) and again from a copy whose rows are one
 * element longer and start one element in (the element-by-element staging); both against the
 * reference, the row statistics too, and the two runs bit for bit the same. */
template <typename T, int D, int E, bool C>
void fa2_forward(const char *name, MbtAttn a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                 const std::vector<double> &o, const std::vector<double> &sm, const std::vector<double> &sl, double tol) {
    a.out[0] = view(a.H, a.T, E);
    a.stats = view(a.H, a.T, 3);
    const long long blocks = a.Z * a.H * ((a.T + 63) / 64);
    std::vector<T> go(o.size()), go2(o.size());
    std::vector<float> st(sm.size() * 3, 0.0f), st2(st.size(), 0.0f);
    if (!launch<&k_forward_fa2<T, D, E, C>>(name, blocks, a, q.data(), k.data(), v.data(), go.data(), st.data())) return;
    /* the odd layout: [Z, Hk, S, W + 1] from element 1 */
    auto odd = [&](const std::vector<T> &x, int W, MbtView &w) {
        std::vector<T> y(x.size() / W * (W + 1) + 1, from_f<T>(0.0f));
        for (size_t r = 0; r < x.size() / W; r++)
            for (int c = 0; c < W; c++) y[1 + r * (W + 1) + c] = x[r * W + c];
        w = MbtView{1, a.Hk * a.S * (W + 1), a.S * (W + 1), W + 1, 1};
        return y;
    };
    MbtAttn b = a;
    std::vector<T> k2 = odd(k, D, b.k), v2 = odd(v, E, b.v);
    if (!launch<&k_forward_fa2<T, D, E, C>>(name, blocks, b, q.data(), k2.data(), v2.data(), go2.data(), st2.data())) return;
    std::vector<float> f(go.size());
    for (size_t i = 0; i < go.size(); i++) f[i] = to_f(go[i]);
    expect(name, "forward (flash-attention-2)", o, f, tol);
    std::vector<float> m1, l1;
    std::vector<double> mw, lw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue; /* a row that sees no key */
        mw.push_back(sm[r]), lw.push_back(sl[r]), m1.push_back(st[r * 3]), l1.push_back(st[r * 3 + 1]);
    }
    expect(name, "flash-attention-2 statistics: row max", mw, m1, tol);
    expect(name, "flash-attention-2 statistics: row sum", lw, l1, tol);
    const bool eq = memcmp(go.data(), go2.data(), go.size() * sizeof(T)) == 0 && memcmp(st.data(), st2.data(), st.size() * 4) == 0;
    printf("%s %s/flash-attention-2 with element-by-element staging, as with cp.async\n", eq ? "PASS" : "FAIL", name);
    eq ? passed++ : failed++;
}

/* The f32 tiled backward (mbt_attn_f32t_bwd_q, mbt_attn_f32t_bwd_kv) of case `name`: as fa2_backward
 * below (dq computing and loading the statistics, dk and dv together and alone, all again from
 * strided views, bit for bit the same), against the reference. */
template <typename T, int D, int E, bool C>
void f32t_backward(const char *name, MbtAttn a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                  const std::vector<T> &dout, const std::vector<double> &dq, const std::vector<double> &dk,
                  const std::vector<double> &dv, const std::vector<double> &sm, const std::vector<double> &sl,
                  const std::vector<double> &sp, double tol) {
    auto odd = [&](const std::vector<T> &x, int W, long long heads, long long rows, MbtView &w) {
        std::vector<T> y(x.size() / W * (W + 1) + 1, from_f<T>(0.0f));
        for (size_t r = 0; r < x.size() / W; r++)
            for (int c = 0; c < W; c++) y[1 + r * (W + 1) + c] = x[r * W + c];
        w = MbtView{1, heads * rows * (W + 1), rows * (W + 1), W + 1, 1};
        return y;
    };
    struct Out {
        std::vector<T> dq, dq2, dk, dv, dk1, dv1;
        std::vector<float> st;
    } res[2];
    for (int pass = 0; pass < 2; pass++) {
        MbtAttn b = a;
        std::vector<T> q2 = q, k2 = k, v2 = v, d2 = dout;
        if (pass) {
            q2 = odd(q, D, a.H, a.T, b.q), k2 = odd(k, D, a.Hk, a.S, b.k), v2 = odd(v, E, a.Hk, a.S, b.v);
            d2 = odd(dout, E, a.H, a.T, b.dout);
        }
        Out &r = res[pass];
        r.dq.resize(dq.size()), r.dq2.resize(dq.size()), r.dk.resize(dk.size()), r.dv.resize(dv.size());
        r.dk1.resize(dk.size()), r.dv1.resize(dv.size()), r.st.assign(sm.size() * 3, 0.0f);
        b.stats = view(a.H, a.T, 3);
        b.nout = 1, b.out[0] = view(a.H, a.T, D), b.nout_v = 0;
        const long long br = MbtAttnF32tB<D, E>::BR;
        const long long qblocks = a.Z * a.H * ((a.T + br - 1) / br), kblocks = a.Z * a.Hk * ((a.S + br - 1) / br);
        const T *qd = q2.data(), *kd = k2.data(), *vd = v2.data(), *dd = d2.data();
        if (!launch<&k_bwd_q_f32t<T, D, E, C, true>>(name, qblocks, b, qd, kd, vd, dd, r.st.data(), r.dq.data()) ||
            !launch<&k_bwd_q_f32t<T, D, E, C, false>>(name, qblocks, b, qd, kd, vd, dd, r.st.data(), r.dq2.data()))
            return;
        b.out[0] = view(a.Hk, a.S, D), b.nout_v = 1, b.out_v[0] = view(a.Hk, a.S, E);
        const float *sd = r.st.data();
        if (!launch<&k_bwd_kv_f32t<T, D, E, C, true, true>>(name, kblocks, b, qd, kd, vd, dd, sd, r.dk.data(), r.dv.data()) ||
            !launch<&k_bwd_kv_f32t<T, D, E, C, true, false>>(name, kblocks, b, qd, kd, vd, dd, sd, r.dk1.data(), (T *)nullptr))
            return;
        b.out[0] = view(a.Hk, a.S, E);
        if (!launch<&k_bwd_kv_f32t<T, D, E, C, false, true>>(name, kblocks, b, qd, kd, vd, dd, sd, r.dv1.data(), (T *)nullptr))
            return;
    }
    auto floats = [](const std::vector<T> &x) {
        std::vector<float> f(x.size());
        for (size_t i = 0; i < x.size(); i++) f[i] = to_f(x[i]);
        return f;
    };
    std::vector<float> m1, l1, p1;
    std::vector<double> mw, lw, pw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue;
        mw.push_back(sm[r]), lw.push_back(sl[r]), pw.push_back(sp[r]);
        m1.push_back(res[0].st[r * 3]), l1.push_back(res[0].st[r * 3 + 1]), p1.push_back(res[0].st[r * 3 + 2]);
    }
    expect(name, "f32 tiled backward statistics: row max", mw, m1, tol);
    expect(name, "f32 tiled backward statistics: row sum", lw, l1, tol);
    expect(name, "f32 tiled backward statistics: sum P dP", pw, p1, tol);
    expect(name, "dq (f32 tiled)", dq, floats(res[0].dq), tol);
    expect(name, "dk (f32 tiled)", dk, floats(res[0].dk), tol);
    expect(name, "dv (f32 tiled)", dv, floats(res[0].dv), tol);
    auto same = [&](const char *what, const std::vector<T> &x, const std::vector<T> &y) {
        bool eq = memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
        printf("%s %s/%s\n", eq ? "PASS" : "FAIL", name, what);
        eq ? passed++ : failed++;
    };
    same("f32 tiled dq from the stored statistics, as computed", res[0].dq, res[0].dq2);
    same("f32 tiled dk alone, as with dv", res[0].dk, res[0].dk1);
    same("f32 tiled dv alone, as with dk", res[0].dv, res[0].dv1);
    same("f32 tiled dq, from strided views as from contiguous ones", res[0].dq, res[1].dq);
    same("f32 tiled dk, from strided views as from contiguous ones", res[0].dk, res[1].dk);
    same("f32 tiled dv, from strided views as from contiguous ones", res[0].dv, res[1].dv);
}

/* The FA2 backward of case `name` against the reference (dq, dk, dv and the statistics): dq
 * computing the statistics, then again loading them (bit for bit the same); dk and dv together
 * from those statistics, and each alone (bit for bit the same); and all of it again with k, v, q
 * and dout from the odd layout (element-by-element staging), bit for bit the same. */
template <typename T, int D, int E, bool C>
void fa2_backward(const char *name, MbtAttn a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                  const std::vector<T> &dout, const std::vector<double> &dq, const std::vector<double> &dk,
                  const std::vector<double> &dv, const std::vector<double> &sm, const std::vector<double> &sl,
                  const std::vector<double> &sp, double tol) {
    auto odd = [&](const std::vector<T> &x, int W, long long heads, long long rows, MbtView &w) {
        std::vector<T> y(x.size() / W * (W + 1) + 1, from_f<T>(0.0f));
        for (size_t r = 0; r < x.size() / W; r++)
            for (int c = 0; c < W; c++) y[1 + r * (W + 1) + c] = x[r * W + c];
        w = MbtView{1, heads * rows * (W + 1), rows * (W + 1), W + 1, 1};
        return y;
    };
    struct Out {
        std::vector<T> dq, dq2, dk, dv, dk1, dv1;
        std::vector<float> st;
    } res[2];
    for (int pass = 0; pass < 2; pass++) {
        MbtAttn b = a;
        std::vector<T> q2 = q, k2 = k, v2 = v, d2 = dout;
        if (pass) {
            q2 = odd(q, D, a.H, a.T, b.q), k2 = odd(k, D, a.Hk, a.S, b.k), v2 = odd(v, E, a.Hk, a.S, b.v);
            d2 = odd(dout, E, a.H, a.T, b.dout);
        }
        Out &r = res[pass];
        r.dq.resize(dq.size()), r.dq2.resize(dq.size()), r.dk.resize(dk.size()), r.dv.resize(dv.size());
        r.dk1.resize(dk.size()), r.dv1.resize(dv.size()), r.st.assign(sm.size() * 3, 0.0f);
        b.stats = view(a.H, a.T, 3);
        b.nout = 1, b.out[0] = view(a.H, a.T, D), b.nout_v = 0;
        const long long qblocks = a.Z * a.H * ((a.T + 63) / 64), kblocks = a.Z * a.Hk * ((a.S + 63) / 64);
        const T *qd = q2.data(), *kd = k2.data(), *vd = v2.data(), *dd = d2.data();
        if (!launch<&k_bwd_q_fa2<T, D, E, C, true>>(name, qblocks, b, qd, kd, vd, dd, r.st.data(), r.dq.data()) ||
            !launch<&k_bwd_q_fa2<T, D, E, C, false>>(name, qblocks, b, qd, kd, vd, dd, r.st.data(), r.dq2.data()))
            return;
        b.out[0] = view(a.Hk, a.S, D), b.nout_v = 1, b.out_v[0] = view(a.Hk, a.S, E);
        const float *sd = r.st.data();
        if (!launch<&k_bwd_kv_fa2<T, D, E, C, true, true>>(name, kblocks, b, qd, kd, vd, dd, sd, r.dk.data(), r.dv.data()) ||
            !launch<&k_bwd_kv_fa2<T, D, E, C, true, false>>(name, kblocks, b, qd, kd, vd, dd, sd, r.dk1.data(), (T *)nullptr))
            return;
        b.out[0] = view(a.Hk, a.S, E);
        if (!launch<&k_bwd_kv_fa2<T, D, E, C, false, true>>(name, kblocks, b, qd, kd, vd, dd, sd, r.dv1.data(), (T *)nullptr))
            return;
    }
    auto floats = [](const std::vector<T> &x) {
        std::vector<float> f(x.size());
        for (size_t i = 0; i < x.size(); i++) f[i] = to_f(x[i]);
        return f;
    };
    std::vector<float> m1, l1, p1;
    std::vector<double> mw, lw, pw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue;
        mw.push_back(sm[r]), lw.push_back(sl[r]), pw.push_back(sp[r]);
        m1.push_back(res[0].st[r * 3]), l1.push_back(res[0].st[r * 3 + 1]), p1.push_back(res[0].st[r * 3 + 2]);
    }
    expect(name, "flash-attention-2 backward statistics: row max", mw, m1, tol);
    expect(name, "flash-attention-2 backward statistics: row sum", lw, l1, tol);
    expect(name, "flash-attention-2 backward statistics: sum P dP", pw, p1, tol);
    expect(name, "dq (flash-attention-2)", dq, floats(res[0].dq), tol);
    expect(name, "dk (flash-attention-2)", dk, floats(res[0].dk), tol);
    expect(name, "dv (flash-attention-2)", dv, floats(res[0].dv), tol);
    auto same = [&](const char *what, const std::vector<T> &x, const std::vector<T> &y) {
        bool eq = memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
        printf("%s %s/%s\n", eq ? "PASS" : "FAIL", name, what);
        eq ? passed++ : failed++;
    };
    same("flash-attention-2 dq from the stored statistics, as computed", res[0].dq, res[0].dq2);
    same("flash-attention-2 dk alone, as with dv", res[0].dk, res[0].dk1);
    same("flash-attention-2 dv alone, as with dk", res[0].dv, res[0].dv1);
    same("flash-attention-2 dq, element-by-element staging as cp.async", res[0].dq, res[1].dq);
    same("flash-attention-2 dk, element-by-element staging as cp.async", res[0].dk, res[1].dk);
    same("flash-attention-2 dv, element-by-element staging as cp.async", res[0].dv, res[1].dv);
}

/* The f32 tiled forward (mbt_attn_f32t_forward) of case `name` against the reference (out, and the
 * row statistics m and l), with k and v contiguous and again from the odd layout (rows one element
 * longer, starting one element in: strided views), bit for bit the same; and run twice, bit for bit
 * the same (no order depends on anything but the shapes). */
template <typename T, int D, int E, bool C>
void f32t_forward(const char *name, MbtAttn a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                  const std::vector<double> &o, const std::vector<double> &sm, const std::vector<double> &sl, double tol) {
    a.out[0] = view(a.H, a.T, E), a.nout = 1, a.nout_v = 0;
    a.stats = view(a.H, a.T, 3);
    const long long BQ = MbtAttnF32t<D, E>::BQ, blocks = a.Z * a.H * ((a.T + BQ - 1) / BQ);
    std::vector<T> go(o.size()), go2(o.size()), go3(o.size());
    std::vector<float> st(sm.size() * 3, 0.0f), st2(st.size(), 0.0f), st3(st.size(), 0.0f);
    if (!launch<&k_forward_f32t<T, D, E, C>>(name, blocks, a, q.data(), k.data(), v.data(), go.data(), st.data())) return;
    /* fewer blocks than tiles: the grid-stride loop takes several tiles a block */
    if (!launch<&k_forward_f32t<T, D, E, C>>(name, (blocks + 2) / 3, a, q.data(), k.data(), v.data(), go3.data(), st3.data()))
        return;
    auto odd = [&](const std::vector<T> &x, int W, MbtView &w) {
        std::vector<T> y(x.size() / W * (W + 1) + 1, from_f<T>(0.0f));
        for (size_t r = 0; r < x.size() / W; r++)
            for (int c = 0; c < W; c++) y[1 + r * (W + 1) + c] = x[r * W + c];
        w = MbtView{1, a.Hk * a.S * (W + 1), a.S * (W + 1), W + 1, 1};
        return y;
    };
    MbtAttn b = a;
    std::vector<T> k2 = odd(k, D, b.k), v2 = odd(v, E, b.v);
    if (!launch<&k_forward_f32t<T, D, E, C>>(name, blocks, b, q.data(), k2.data(), v2.data(), go2.data(), st2.data())) return;
    std::vector<float> f(go.size());
    for (size_t i = 0; i < go.size(); i++) f[i] = to_f(go[i]);
    expect(name, "forward (f32 tiled, CUDA cores)", o, f, tol);
    std::vector<float> m1, l1;
    std::vector<double> mw, lw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue; /* a row that sees no key */
        mw.push_back(sm[r]), lw.push_back(sl[r]), m1.push_back(st[r * 3]), l1.push_back(st[r * 3 + 1]);
    }
    expect(name, "f32 tiled statistics: row max", mw, m1, tol);
    expect(name, "f32 tiled statistics: row sum", lw, l1, tol);
    const bool eq = memcmp(go.data(), go2.data(), go.size() * sizeof(T)) == 0 && memcmp(st.data(), st2.data(), st.size() * 4) == 0;
    printf("%s %s/f32 tiled forward from strided views, as from contiguous ones\n", eq ? "PASS" : "FAIL", name);
    eq ? passed++ : failed++;
    const bool eq3 = memcmp(go.data(), go3.data(), go.size() * sizeof(T)) == 0 && memcmp(st.data(), st3.data(), st.size() * 4) == 0;
    printf("%s %s/f32 tiled forward on fewer blocks, as on one a tile\n", eq3 ? "PASS" : "FAIL", name);
    eq3 ? passed++ : failed++;
}

/* What a program runs since the forward hands its statistics to the backward (docs/cuda.md, "The
 * statistics from the forward"): the forward (the CUDA-core kernel, or FA2's) storing m and l into
 * a [Z, H, T, 2] buffer, sum P dP as rowsum(dout * o) from the stored (rounded) output in f32, in
 * column order (fusion's attention_stats kernel), dq loading the three (COMPUTE = false), dk and
 * dv from them; the statistics, dq, dk and dv against the reference. */
template <typename T, int D, int E, bool C, bool FA2, bool F32T = false>
void handed(const char *name, MbtAttn a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
            const std::vector<T> &dout, const std::vector<double> &dq, const std::vector<double> &dk,
            const std::vector<double> &dv, const std::vector<double> &sm, const std::vector<double> &sl, double tol) {
    const long long rows = FA2 ? 64 : MbtAttnRows<D, E>::per_block;
    const long long qblocks = a.Z * a.H * ((a.T + rows - 1) / rows), kblocks = a.Z * a.Hk * ((a.S + rows - 1) / rows);
    std::vector<T> go((size_t)(a.Z * a.H * a.T * E)), gdq(dq.size()), gdk(dk.size()), gdv(dv.size());
    std::vector<float> lse(sm.size() * 2, -1.0f), st(sm.size() * 3);
    a.out[0] = view(a.H, a.T, E), a.nout_v = 0;
    a.stats = view(a.H, a.T, 2);
    const T *qd = q.data(), *kd = k.data(), *vd = v.data(), *dd = dout.data();
    bool ok;
    if constexpr (FA2) ok = launch<&k_forward_fa2<T, D, E, C>>(name, qblocks, a, qd, kd, vd, go.data(), lse.data());
    else if constexpr (F32T)
        ok = launch<&k_forward_f32t<T, D, E, C>>(name, a.Z * a.H * ((a.T + MbtAttnF32t<D, E>::BQ - 1) / MbtAttnF32t<D, E>::BQ),
                                                 a, qd, kd, vd, go.data(), lse.data());
    else ok = launch<&k_forward_st<T, D, E, C>>(name, qblocks, a, qd, kd, vd, go.data(), lse.data());
    if (!ok) return;
    for (size_t r = 0; r < sm.size(); r++) {
        float pdp = 0.0f;
        for (int c = 0; c < E; c++) pdp = pdp + to_f(dout[r * E + c]) * to_f(go[r * E + c]);
        st[r * 3] = lse[r * 2], st[r * 3 + 1] = lse[r * 2 + 1], st[r * 3 + 2] = pdp;
    }
    a.stats = view(a.H, a.T, 3);
    a.out[0] = view(a.H, a.T, D);
    const float *sd = st.data();
    const long long bq = MbtAttnF32tB<D, E>::BR, qb = a.Z * a.H * ((a.T + bq - 1) / bq), kb = a.Z * a.Hk * ((a.S + bq - 1) / bq);
    if constexpr (FA2) ok = launch<&k_bwd_q_fa2<T, D, E, C, false>>(name, qblocks, a, qd, kd, vd, dd, st.data(), gdq.data());
    else if constexpr (F32T) ok = launch<&k_bwd_q_f32t<T, D, E, C, false>>(name, qb, a, qd, kd, vd, dd, st.data(), gdq.data());
    else ok = launch<&k_bwd_q_loaded<T, D, E, C, false>>(name, qblocks, a, qd, kd, vd, dd, sd, gdq.data());
    if (!ok) return;
    a.out[0] = view(a.Hk, a.S, D), a.nout_v = 1, a.out_v[0] = view(a.Hk, a.S, E);
    if constexpr (FA2) ok = launch<&k_bwd_kv_fa2<T, D, E, C, true, true>>(name, kblocks, a, qd, kd, vd, dd, sd, gdk.data(), gdv.data());
    else if constexpr (F32T) ok = launch<&k_bwd_kv_f32t<T, D, E, C, true, true>>(name, kb, a, qd, kd, vd, dd, sd, gdk.data(), gdv.data());
    else ok = launch<&k_bwd_kv<T, D, E, C, false, true, true>>(name, kblocks, a, qd, kd, vd, dd, sd, gdk.data(), gdv.data());
    if (!ok) return;
    std::vector<float> m1, l1, f;
    std::vector<double> mw, lw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue; /* a row that sees no key */
        mw.push_back(sm[r]), lw.push_back(sl[r]), m1.push_back(lse[r * 2]), l1.push_back(lse[r * 2 + 1]);
    }
    const char *who = FA2 ? "flash-attention-2" : F32T ? "f32 tiled" : "CUDA cores";
    char what[160];
    auto check = [&](const char *x, const std::vector<double> &want, const std::vector<T> &got) {
        f.resize(got.size());
        for (size_t i = 0; i < got.size(); i++) f[i] = to_f(got[i]);
        snprintf(what, sizeof what, "%s from the forward's statistics (%s)", x, who);
        expect(name, what, want, f, tol);
    };
    snprintf(what, sizeof what, "the forward's row max, [.., 2] (%s)", who);
    expect(name, what, mw, m1, tol);
    snprintf(what, sizeof what, "the forward's row sum, [.., 2] (%s)", who);
    expect(name, what, lw, l1, tol);
    check("dq", dq, gdq);
    check("dk", dk, gdk);
    check("dv", dv, gdv);
}

template <typename T, int D, int E, bool C, bool TC, bool FA2 = TC>
void run_case(const char *name, long long Z, long long H, long long Hk, long long Tq, long long S, double tol, unsigned seed) {
    const long long G = H / Hk, shift = S - Tq;
    const float scale = 1.0f / sqrtf((float)D);
    srand(seed);
    auto draw = [](long long n, double sd) {
        std::vector<float> x((size_t)n);
        for (auto &v : x) { /* Irwin-Hall: near normal, deterministic everywhere */
            double s = 0;
            for (int i = 0; i < 12; i++) s += rand() / (RAND_MAX + 1.0);
            v = (float)((s - 6) * sd);
        }
        return x;
    };
    /* scores s = scale q.k with q, k ~ N(0, 2^2): standard deviation 4 */
    std::vector<float> qf = draw(Z * H * Tq * D, 2), kf = draw(Z * Hk * S * D, 2), vf = draw(Z * Hk * S * E, 1),
                       df = draw(Z * H * Tq * E, 1);
    std::vector<T> q(qf.size()), k(kf.size()), v(vf.size()), dout(df.size());
    for (size_t i = 0; i < q.size(); i++) q[i] = from_f<T>(qf[i]), qf[i] = to_f(q[i]);
    for (size_t i = 0; i < k.size(); i++) k[i] = from_f<T>(kf[i]), kf[i] = to_f(k[i]);
    for (size_t i = 0; i < v.size(); i++) v[i] = from_f<T>(vf[i]), vf[i] = to_f(v[i]);
    for (size_t i = 0; i < dout.size(); i++) dout[i] = from_f<T>(df[i]), df[i] = to_f(dout[i]);

    /* the reference, in double */
    std::vector<double> o((size_t)(Z * H * Tq * E)), dq((size_t)(Z * H * Tq * D)), dk(k.size()), dv(v.size());
    std::vector<double> sm((size_t)(Z * H * Tq)), sl(sm.size()), sp(sm.size());
    std::vector<double> s((size_t)S), p((size_t)S), dp((size_t)S);
    for (long long z = 0; z < Z; z++)
        for (long long h = 0; h < H; h++)
            for (long long t = 0; t < Tq; t++) {
                const long long kh = h / G, row = (z * H + h) * Tq + t;
                long long n = C ? t + shift + 1 : S;
                if (n > S) n = S;
                if (n < 0) n = 0;
                double m = -INFINITY, l = 0, pdp = 0;
                for (long long j = 0; j < n; j++) {
                    double acc = 0;
                    for (int c = 0; c < D; c++) acc += (double)qf[row * D + c] * kf[((z * Hk + kh) * S + j) * D + c];
                    s[j] = scale * acc;
                    m = fmax(m, s[j]);
                }
                for (long long j = 0; j < n; j++) l += exp(s[j] - m);
                for (long long j = 0; j < n; j++) {
                    p[j] = exp(s[j] - m) / l;
                    double acc = 0;
                    for (int c = 0; c < E; c++) acc += (double)df[row * E + c] * vf[((z * Hk + kh) * S + j) * E + c];
                    dp[j] = acc;
                    pdp += p[j] * dp[j];
                }
                sm[row] = n ? m : -INFINITY, sl[row] = l, sp[row] = pdp;
                for (long long j = 0; j < n; j++) {
                    const long long kr = (z * Hk + kh) * S + j;
                    const double ds = scale * p[j] * (dp[j] - pdp);
                    for (int c = 0; c < E; c++) o[row * E + c] += p[j] * vf[kr * E + c];
                    for (int c = 0; c < D; c++) dq[row * D + c] += ds * kf[kr * D + c];
                    for (int c = 0; c < D; c++) dk[kr * D + c] += ds * qf[row * D + c];
                    for (int c = 0; c < E; c++) dv[kr * E + c] += p[j] * df[row * E + c];
                }
            }

    /* the kernels */
    MbtAttn a = {Z, H, Hk, Tq, S, scale, view(H, Tq, D), view(Hk, S, D), view(Hk, S, E), view(H, Tq, E),
                 view(H, Tq, 3), 1, {view(H, Tq, E)}, 0, {}};
    std::vector<T> go(o.size()), gdq(dq.size()), gdk(dk.size()), gdv(dv.size());
    std::vector<float> gstats(sm.size() * 3);
    const int rows = TC ? 64 : MbtAttnRows<D, E>::per_block; /* a block's rows, every kernel */
    if (!launch<&k_forward<T, D, E, C, TC>>(name, Z * H * ((Tq + rows - 1) / rows), a, (const T *)q.data(),
                                             (const T *)k.data(), (const T *)v.data(), go.data()))
        return;
    a.out[0] = view(H, Tq, D);
    const T *qd = q.data(), *kd = k.data(), *vd = v.data(), *dd = dout.data();
    if (!launch<&k_bwd_q<T, D, E, C, TC>>(name, Z * H * ((Tq + rows - 1) / rows), a, qd, kd, vd, dd, gstats.data(), gdq.data()))
        return;
    std::vector<T> gdq2(dq.size()), gdk1(dk.size()), gdv1(dv.size());
    if (!launch<&k_bwd_q_loaded<T, D, E, C, TC>>(name, Z * H * ((Tq + rows - 1) / rows), a, qd, kd, vd, dd,
                                                  (const float *)gstats.data(), gdq2.data()))
        return;
    a.out[0] = view(Hk, S, D);
    a.nout_v = 1;
    a.out_v[0] = view(Hk, S, E);
    const long long kblocks = Z * Hk * ((S + rows - 1) / rows);
    const float *sd = gstats.data();
    if (!launch<&k_bwd_kv<T, D, E, C, TC, true, true>>(name, kblocks, a, qd, kd, vd, dd, sd, gdk.data(), gdv.data()) ||
        !launch<&k_bwd_kv<T, D, E, C, TC, true, false>>(name, kblocks, a, qd, kd, vd, dd, sd, gdk1.data(), (T *)nullptr))
        return;
    a.out[0] = view(Hk, S, E); /* dv alone: its places are the result's */
    if (!launch<&k_bwd_kv<T, D, E, C, TC, false, true>>(name, kblocks, a, qd, kd, vd, dd, sd, gdv1.data(), (T *)nullptr)) return;

    auto floats = [](const std::vector<T> &x) {
        std::vector<float> f(x.size());
        for (size_t i = 0; i < x.size(); i++) f[i] = to_f(x[i]);
        return f;
    };
    expect(name, TC ? "forward (tensor cores)" : "forward", o, floats(go), tol);
    std::vector<float> st = gstats, m1, l1, p1;
    std::vector<double> mw, lw, pw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue; /* a row that sees no key: its statistics are not used */
        mw.push_back(sm[r]), lw.push_back(sl[r]), pw.push_back(sp[r]);
        m1.push_back(st[r * 3]), l1.push_back(st[r * 3 + 1]), p1.push_back(st[r * 3 + 2]);
    }
    expect(name, "statistics: row max", mw, m1, tol);
    expect(name, "statistics: row sum", lw, l1, tol);
    expect(name, "statistics: sum P dP", pw, p1, tol);
    const char *dq_name = TC ? "dq (tensor cores)" : "dq", *dk_name = TC ? "dk (tensor cores)" : "dk";
    const char *dv_name = TC ? "dv (tensor cores)" : "dv";
    expect(name, dq_name, dq, floats(gdq), tol);
    expect(name, dk_name, dk, floats(gdk), tol);
    expect(name, dv_name, dv, floats(gdv), tol);
    /* the same sums made by the other variants: exactly the same values */
    auto same = [&](const char *what, const std::vector<T> &x, const std::vector<T> &y) {
        bool eq = memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
        printf("%s %s/%s\n", eq ? "PASS" : "FAIL", name, what);
        eq ? passed++ : failed++;
    };
    same("dq from the stored statistics, as computed", gdq, gdq2);
    same("dk alone, as with dv", gdk, gdk1);
    same("dv alone, as with dk", gdv, gdv1);
    if constexpr (!TC) handed<T, D, E, C, false>(name, a, q, k, v, dout, dq, dk, dv, sm, sl, tol);
    if constexpr (std::is_same<T, float>::value) {
        f32t_forward<T, D, E, C>(name, a, q, k, v, o, sm, sl, tol);
        f32t_backward<T, D, E, C>(name, a, q, k, v, dout, dq, dk, dv, sm, sl, sp, tol);
        handed<T, D, E, C, false, true>(name, a, q, k, v, dout, dq, dk, dv, sm, sl, tol);
    }
    if constexpr (FA2) handed<T, D, E, C, true>(name, a, q, k, v, dout, dq, dk, dv, sm, sl, tol);
    if constexpr (FA2) fa2_forward<T, D, E, C>(name, a, q, k, v, o, sm, sl, tol);
    if constexpr (FA2) fa2_backward<T, D, E, C>(name, a, q, k, v, dout, dq, dk, dv, sm, sl, sp, tol);
}

/* The flash-attention-2 kernels under the document mask (attention(..., pos = ...), causal, S = T;
 * rt_attention.cuh's mbt_attn_first): pos numbers each batch row's documents (lengths drawn from
 * 1 to 90, so that documents start inside tiles and span several; one row with pos < 0, which
 * sees no key, and one with pos > t, which sees every key up to t). The forward (storing m and l),
 * dq computing the statistics and loading them, and dk and dv together, against a float64
 * reference that lets query t see keys t - pos .. t only, at `tol`; the same kernels ignoring the
 * mask (DOCS = false) must be off from that reference by more (the check can fail); and with pos
 * a plain arange (one document a row) the masked kernels give the unmasked kernels' results bit
 * for bit (no tile skipped, no element masked that the causal mask keeps). */
template <typename T, int D, int E>
void fa2_docs(const char *name, long long Z, long long H, long long Hk, long long Tq, double tol, unsigned seed) {
    const long long G = H / Hk, S = Tq;
    const float scale = 1.0f / sqrtf((float)D);
    srand(seed);
    auto draw = [](long long n, double sd) {
        std::vector<float> x((size_t)n);
        for (auto &v : x) {
            double s = 0;
            for (int i = 0; i < 12; i++) s += rand() / (RAND_MAX + 1.0);
            v = (float)((s - 6) * sd);
        }
        return x;
    };
    std::vector<float> qf = draw(Z * H * Tq * D, 2), kf = draw(Z * Hk * S * D, 2), vf = draw(Z * Hk * S * E, 1),
                       df = draw(Z * H * Tq * E, 1);
    std::vector<T> q(qf.size()), k(kf.size()), v(vf.size()), dout(df.size());
    for (size_t i = 0; i < q.size(); i++) q[i] = from_f<T>(qf[i]), qf[i] = to_f(q[i]);
    for (size_t i = 0; i < k.size(); i++) k[i] = from_f<T>(kf[i]), kf[i] = to_f(k[i]);
    for (size_t i = 0; i < v.size(); i++) v[i] = from_f<T>(vf[i]), vf[i] = to_f(v[i]);
    for (size_t i = 0; i < dout.size(); i++) dout[i] = from_f<T>(df[i]), df[i] = to_f(dout[i]);
    std::vector<int> pos((size_t)(Z * Tq)), arange(pos.size());
    for (long long z = 0; z < Z; z++) {
        long long left = 0;
        for (long long t = 0, p = 0; t < Tq; t++, p++, left--) {
            if (left <= 0) left = 1 + rand() % 90, p = 0; /* a new document */
            pos[z * Tq + t] = (int)p;
            arange[z * Tq + t] = (int)t;
        }
    }
    pos[Tq / 3] = -1;                      /* batch 0, a row that sees no key */
    pos[Tq / 2] = (int)(Tq / 2 + 5);       /* and one that sees all keys up to itself */
    auto first = [&](long long z, long long t) {
        const long long p = pos[z * Tq + t];
        return p > t ? 0 : p < 0 ? t + 1 : t - p;
    };
    std::vector<double> o((size_t)(Z * H * Tq * E)), dq((size_t)(Z * H * Tq * D)), dk(k.size()), dv(v.size());
    std::vector<double> sm((size_t)(Z * H * Tq)), sl(sm.size());
    std::vector<double> sc((size_t)S), p((size_t)S), dp((size_t)S);
    for (long long z = 0; z < Z; z++)
        for (long long h = 0; h < H; h++)
            for (long long t = 0; t < Tq; t++) {
                const long long kh = h / G, row = (z * H + h) * Tq + t, j0 = first(z, t);
                double m = -INFINITY, l = 0, pdp = 0;
                for (long long j = j0; j <= t; j++) {
                    double acc = 0;
                    for (int c = 0; c < D; c++) acc += (double)qf[row * D + c] * kf[((z * Hk + kh) * S + j) * D + c];
                    sc[j] = scale * acc;
                    m = fmax(m, sc[j]);
                }
                for (long long j = j0; j <= t; j++) l += exp(sc[j] - m);
                for (long long j = j0; j <= t; j++) {
                    p[j] = exp(sc[j] - m) / l;
                    double acc = 0;
                    for (int c = 0; c < E; c++) acc += (double)df[row * E + c] * vf[((z * Hk + kh) * S + j) * E + c];
                    dp[j] = acc;
                    pdp += p[j] * dp[j];
                }
                sm[row] = j0 <= t ? m : -INFINITY, sl[row] = l;
                for (long long j = j0; j <= t; j++) {
                    const long long kr = (z * Hk + kh) * S + j;
                    const double ds = scale * p[j] * (dp[j] - pdp);
                    for (int c = 0; c < E; c++) o[row * E + c] += p[j] * vf[kr * E + c];
                    for (int c = 0; c < D; c++) dq[row * D + c] += ds * kf[kr * D + c];
                    for (int c = 0; c < D; c++) dk[kr * D + c] += ds * qf[row * D + c];
                    for (int c = 0; c < E; c++) dv[kr * E + c] += p[j] * df[row * E + c];
                }
            }
    struct Out {
        std::vector<T> o, dq, dq2, dk, dv;
        std::vector<float> lse, st;
    };
    const long long qblocks = Z * H * ((Tq + 63) / 64), kblocks = Z * Hk * ((S + 63) / 64);
    const T *qd = q.data(), *kd = k.data(), *vd = v.data(), *dd = dout.data();
    /* the forward, dq (computing, then loading the statistics) and dk, dv with the mask given by
       positions ps (DOCS) or without it */
    auto run = [&](auto docs, const std::vector<int> *ps, Out &r) {
        constexpr bool DOCS = decltype(docs)::value;
        MbtAttn a = {Z, H, Hk, Tq, S, scale, view(H, Tq, D), view(Hk, S, D), view(Hk, S, E), view(H, Tq, E),
                     view(H, Tq, 2), 1, {view(H, Tq, E)}, 0, {}, ps ? ps->data() : nullptr, MbtView{0, Tq, 0, 1, 0}};
        r.o.resize(o.size()), r.dq.resize(dq.size()), r.dq2.resize(dq.size()), r.dk.resize(dk.size()), r.dv.resize(dv.size());
        r.lse.assign(sm.size() * 2, -1.0f), r.st.assign(sm.size() * 3, 0.0f);
        if (!launch<&k_forward_fa2_docs<T, D, E, DOCS>>(name, qblocks, a, qd, kd, vd, r.o.data(), r.lse.data())) return false;
        a.stats = view(H, Tq, 3), a.out[0] = view(H, Tq, D);
        if (!launch<&k_bwd_q_fa2_docs<T, D, E, true, DOCS>>(name, qblocks, a, qd, kd, vd, dd, r.st.data(), r.dq.data()) ||
            !launch<&k_bwd_q_fa2_docs<T, D, E, false, DOCS>>(name, qblocks, a, qd, kd, vd, dd, r.st.data(), r.dq2.data()))
            return false;
        a.out[0] = view(Hk, S, D), a.nout_v = 1, a.out_v[0] = view(Hk, S, E);
        return launch<&k_bwd_kv_fa2_docs<T, D, E, DOCS>>(name, kblocks, a, qd, kd, vd, dd, (const float *)r.st.data(), r.dk.data(),
                                                         r.dv.data());
    };
    Out masked, unmasked, ranged;
    if (!run(std::true_type(), &pos, masked) || !run(std::false_type(), nullptr, unmasked) ||
        !run(std::true_type(), &arange, ranged))
        return;
    auto floats = [](const std::vector<T> &x) {
        std::vector<float> f(x.size());
        for (size_t i = 0; i < x.size(); i++) f[i] = to_f(x[i]);
        return f;
    };
    std::vector<float> m1, l1, m2, l2;
    std::vector<double> mw, lw;
    for (size_t r = 0; r < sm.size(); r++) {
        if (sl[r] == 0) continue; /* a row that sees no key */
        mw.push_back(sm[r]), lw.push_back(sl[r]);
        m1.push_back(masked.lse[r * 2]), l1.push_back(masked.lse[r * 2 + 1]);
        m2.push_back(masked.st[r * 3]), l2.push_back(masked.st[r * 3 + 1]);
    }
    expect(name, "documents: forward (flash-attention-2)", o, floats(masked.o), tol);
    expect(name, "documents: the forward's row max", mw, m1, tol);
    expect(name, "documents: the forward's row sum", lw, l1, tol);
    expect(name, "documents: dq's statistics, row max", mw, m2, tol);
    expect(name, "documents: dq's statistics, row sum", lw, l2, tol);
    expect(name, "documents: dq (flash-attention-2)", dq, floats(masked.dq), tol);
    expect(name, "documents: dk (flash-attention-2)", dk, floats(masked.dk), tol);
    expect(name, "documents: dv (flash-attention-2)", dv, floats(masked.dv), tol);
    /* the control: without the mask, the kernels are far from the masked reference */
    auto off = [&](const char *what, const std::vector<double> &want, const std::vector<T> &got) {
        double m = 0, e = 0;
        for (size_t i = 0; i < want.size(); i++) m = fmax(m, fabs(want[i]));
        for (size_t i = 0; i < want.size(); i++) e = fmax(e, fabs(want[i] - to_f(got[i])) / m);
        const bool ok = e > 10 * tol;
        printf("%s %s/documents: %s without the mask is off by %.3g of the largest (more than %g)\n", ok ? "PASS" : "FAIL",
               name, what, e, 10 * tol);
        ok ? passed++ : failed++;
    };
    off("forward", o, unmasked.o);
    off("dq", dq, unmasked.dq);
    off("dk", dk, unmasked.dk);
    off("dv", dv, unmasked.dv);
    auto same = [&](const char *what, const void *x, const void *y, size_t bytes) {
        bool eq = memcmp(x, y, bytes) == 0;
        printf("%s %s/%s\n", eq ? "PASS" : "FAIL", name, what);
        eq ? passed++ : failed++;
    };
    same("documents: dq from the stored statistics, as computed", masked.dq.data(), masked.dq2.data(), dq.size() * sizeof(T));
    same("documents: pos = arange gives the unmasked forward bit for bit", ranged.o.data(), unmasked.o.data(), o.size() * sizeof(T));
    same("documents: pos = arange gives the unmasked m and l bit for bit", ranged.lse.data(), unmasked.lse.data(), sm.size() * 8);
    same("documents: pos = arange gives the unmasked statistics bit for bit", ranged.st.data(), unmasked.st.data(), sm.size() * 12);
    same("documents: pos = arange gives the unmasked dq bit for bit", ranged.dq.data(), unmasked.dq.data(), dq.size() * sizeof(T));
    same("documents: pos = arange gives the unmasked dk bit for bit", ranged.dk.data(), unmasked.dk.data(), dk.size() * sizeof(T));
    same("documents: pos = arange gives the unmasked dv bit for bit", ranged.dv.data(), unmasked.dv.data(), dv.size() * sizeof(T));
}

} /* namespace check */

int main() {
    using namespace check;
    /* f32 on the CUDA cores: grouped heads and D != E over several tiles; keys fewer than queries
     * (causal rows 0..9 see none); keys more than queries, not causal */
    run_case<float, 24, 40, true, false>("f32-gqa-causal", 2, 4, 2, 70, 70, 1e-5, 1);
    run_case<float, 32, 32, true, false>("f32-fewer-keys", 1, 2, 2, 50, 40, 1e-5, 2);
    run_case<float, 16, 16, false, false>("f32-more-keys", 2, 3, 1, 33, 65, 1e-5, 3);
    /* the f32 tiled forward's other tilings: 32 query rows (D > 64), 16 keys a tile (D + E > 128),
     * heads of 128, E not a multiple of 8, several tiles of rows and keys */
    run_case<float, 128, 128, true, false>("f32-d128-causal", 1, 4, 1, 75, 75, 1e-5, 13);
    run_case<float, 96, 20, false, false>("f32-d96-e20", 1, 2, 2, 40, 45, 1e-5, 14);
    run_case<float, 64, 128, true, false>("f32-d64-e128-fewer-keys", 1, 2, 1, 90, 60, 1e-5, 15);
    run_case<float, 64, 64, true, false>("f32-d64-causal", 2, 2, 1, 130, 130, 1e-5, 16);
    /* bf16 on the tensor cores, and once on the CUDA cores */
    run_case<__nv_bfloat16, 32, 64, true, true>("bf16-gqa-causal", 1, 4, 2, 100, 100, 1e-2, 4);
    run_case<__nv_bfloat16, 64, 64, true, true>("bf16-fewer-keys", 1, 2, 2, 45, 40, 1e-2, 5);
    run_case<__nv_bfloat16, 16, 32, false, true>("bf16-more-keys", 2, 2, 1, 20, 70, 1e-2, 6);
    run_case<__nv_bfloat16, 32, 32, true, false>("bf16-cuda-cores", 1, 2, 2, 70, 70, 1e-2, 7);
    /* the flash-attention-2 forward's wider heads (tiles of 32 keys when D + E > 128), checked
     * with the other kernels of the same case (the backward on the CUDA cores past 64) */
    run_case<__nv_bfloat16, 128, 128, true, false, true>("bf16-fa2-d128-causal", 1, 4, 1, 150, 150, 1e-2, 8);
    run_case<__nv_bfloat16, 96, 64, false, false, true>("bf16-fa2-d96-e64", 2, 2, 2, 70, 45, 1e-2, 9);
    run_case<__nv_bfloat16, 64, 128, true, false, true>("bf16-fa2-fewer-keys", 1, 2, 1, 90, 60, 1e-2, 10);
    /* the flash-attention-2 kernels under the document mask: tiles of 64 keys, and of 32 (D + E > 128);
     * grouped heads; rows not a multiple of the tiles */
    fa2_docs<__nv_bfloat16, 32, 32>("bf16-fa2-docs", 2, 4, 2, 200, 1e-2, 11);
    fa2_docs<__nv_bfloat16, 64, 128>("bf16-fa2-docs-wide", 1, 2, 1, 150, 1e-2, 12);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
