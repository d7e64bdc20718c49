/* mma.h - the warp matrix operations (nvcuda::wmma) for tests/cudaemu/cudaemu.h's emulated GPU,
 * the 16 x 16 x 16 shapes in f16, bf16 and f32 accumulation that runtime/kernels/
 * rt_attention_tc.cuh uses.
 *
 * On a GPU a fragment's elements are spread over the warp's lanes in a layout the programming
 * guide leaves unspecified, so correct code touches them only through these functions (and
 * element-wise operations the same for every element). Here every thread holds the whole tile,
 * row-major: loads and stores need no exchange between lanes, and mma_sync computes the product
 * in each thread with f32 sums in order of k. What the guide requires is checked, and a launch
 * that breaks it fails with cudaemu's message: a pointer aligned to 32 bytes, a leading dimension
 * that is a multiple of 16 bytes. */
#ifndef MBT_CUDAEMU_MMA_H
#define MBT_CUDAEMU_MMA_H

#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float to_float(float x) { return x; }
inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_float(__half x) { return __half2float(x); }

/* rows x cols of the tile a fragment holds */
template <class Use, int M, int N, int K> struct shape_of;
template <int M, int N, int K> struct shape_of<matrix_a, M, N, K> {
    static const int rows = M, cols = K;
};
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> {
    static const int rows = K, cols = N;
};
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> {
    static const int rows = M, cols = N;
};

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment {
  public:
    static const int rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols;
    static const int num_elements = rows * cols;
    T x[num_elements]; /* the whole tile, row-major (this emulation's layout) */
};

inline void check(const void *p, unsigned ldm, size_t elem) {
    if ((uintptr_t)p % 32 != 0) cudaemu::fail("wmma: a matrix pointer not aligned to 32 bytes");
    if ((ldm * elem) % 16 != 0) cudaemu::fail("wmma: a leading dimension not a multiple of 16 bytes");
}

template <class Use, int M, int N, int K, class T, class Layout, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, const V &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

template <class Use, int M, int N, int K, class T, class Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm) {
    check(p, ldm, sizeof(T));
    const bool col = std::is_same<Layout, col_major>::value;
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) f.x[r * f.cols + c] = col ? p[c * ldm + r] : p[r * ldm + c];
}

template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm, layout_t layout) {
    check(p, ldm, sizeof(T));
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) f.x[r * N + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}

template <int M, int N, int K, class T>
inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t layout) {
    check(p, ldm, sizeof(T));
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * N + c];
}

template <int M, int N, int K, class TA, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TA, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
    float fa[M * K], fb[K * N], out[M * N];
    for (int i = 0; i < M * K; i++) fa[i] = to_float(a.x[i]);
    for (int i = 0; i < K * N; i++) fb[i] = to_float(b.x[i]);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = c.x[i * N + j];
            for (int k = 0; k < K; k++) s = s + fa[i * K + k] * fb[k * N + j];
            out[i * N + j] = s;
        }
    for (int i = 0; i < M * N; i++) d.x[i] = out[i];
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif
