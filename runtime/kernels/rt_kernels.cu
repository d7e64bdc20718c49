/* rt_kernels.cu - the runtime's own kernels: the GPU side of rt_gpu_axpy, rt_gpu_axpy_table, rt_gpu_scale,
 * rt_gpu_sumsq_blocks and the K == 0 case of rt_gpu_sgemm_batched (runtime/gpu.c).
 *
 * They are not compiled with the runtime: the Makefile turns this file into a C string
 * (build/gen/rt_kernels_cu.h, `mbt_rt_kernels_cu`) and mbtc appends it to each program's CUDA
 * translation unit, so they are in every program's module, compiled with its options (no fast
 * math, no FMA contraction). runtime/gpu.c finds them by name with cuModuleGetFunction.
 *
 * The interface, which gpu.c's launches follow (parameters in this order, any grid):
 *
 *   mbt_rt_axpy(float *dst, const float *src, float scale, long long n)
 *       dst[i] = dst[i] + scale * src[i] for i < n (the product rounded, then the sum)
 *   mbt_rt_axpy_table(const long long *table, long long count, float scale)
 *       for each entry e < count of the table (3 long longs each: dst and src as addresses, n):
 *       mbt_rt_axpy(dst, src, scale, n)'s arithmetic (forward_backward's gradient accumulation,
 *       every gradient in one launch; grid: blockIdx.y strides over the entries, blockIdx.x over
 *       each one's elements)
 *   mbt_rt_scale(float *x, float scale, long long rows, long long cols, long long pitch)
 *       x[r * pitch + c] = x[r * pitch + c] * scale for r < rows, c < cols
 *       (grid: blockIdx.x strides over columns, blockIdx.y over rows)
 *   mbt_rt_sumsq_blocks(const float *x, long long n, long long block, double *partial)
 *       partial[b] = sum of x[i]^2 (in double) over i in [b * block, min((b + 1) * block, n))
 *       for b < ceil(n / block); blocks of exactly MBT_RT_SUMSQ_THREADS threads
 *
 * Every kernel walks its work with a grid stride, so any grid is correct. Results depend only
 * on the data: elementwise kernels compute each element once, and sumsq_blocks adds each RT
 * block's squares in a fixed order (per-thread strided sums, then a fixed binary tree in shared
 * memory) whatever the grid, so the gradient norm is the same on every run. */

#define MBT_RT_SUMSQ_THREADS 256

extern "C" __global__ void mbt_rt_axpy(float *dst, const float *src, float scale, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __fadd_rn(dst[i], __fmul_rn(scale, src[i]));
}

extern "C" __global__ void mbt_rt_axpy_table(const long long *table, long long count, float scale) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = blockIdx.y; e < count; e += gridDim.y) {
        float *dst = (float *)table[3 * e];
        const float *src = (const float *)table[3 * e + 1];
        long long n = table[3 * e + 2];
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            dst[i] = __fadd_rn(dst[i], __fmul_rn(scale, src[i]));
    }
}

extern "C" __global__ void mbt_rt_scale(float *x, float scale, long long rows, long long cols, long long pitch) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        float *row = x + r * pitch;
        for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride)
            row[c] = __fmul_rn(row[c], scale);
    }
}

extern "C" __global__ void __launch_bounds__(MBT_RT_SUMSQ_THREADS)
mbt_rt_sumsq_blocks(const float *x, long long n, long long block, double *partial) {
    __shared__ double part[MBT_RT_SUMSQ_THREADS];
    long long nblocks = (n + block - 1) / block;
    /* b is the same for every thread of a CUDA block, so the barriers below are reached by all. */
    for (long long b = blockIdx.x; b < nblocks; b += gridDim.x) {
        long long begin = b * block;
        long long end = begin + block < n ? begin + block : n;
        double s = 0.0;
        for (long long i = begin + threadIdx.x; i < end; i += MBT_RT_SUMSQ_THREADS) {
            double v = (double)x[i];
            s = __dadd_rn(s, __dmul_rn(v, v));
        }
        part[threadIdx.x] = s;
        __syncthreads();
        for (int half = MBT_RT_SUMSQ_THREADS / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) part[threadIdx.x] = __dadd_rn(part[threadIdx.x], part[threadIdx.x + half]);
            __syncthreads();
        }
        if (threadIdx.x == 0) partial[b] = part[0];
        __syncthreads(); /* part[] is reused for the next b */
    }
}
