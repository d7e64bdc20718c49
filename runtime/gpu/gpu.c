/* gpu.c - the GPU's work for one run (rt_gpu.h; what generated code calls is in rt_program.h):
 * the context, memory and copies, launches of the program's kernels and of the runtime's own
 * (runtime/kernels/rt_kernels.cu), waits, and the report of GPU timing.
 *
 * Pipeline position: beside pool.c and blas.c, the CPU's equivalents. The GPU's files call
 * downwards only: gpu_api.c (the libraries, through dlopen) <- gpu_timing.c (events, statistics,
 * the trace) <- gpu.c (this file) <- gpu_blas.c (GEMMs on cuBLASLt) <- gpu_open.c (opening and
 * closing: the device, the module, its functions, cuBLASLt and the timer).
 *
 * Every call is queued on one stream (CU_STREAM_NON_BLOCKING: it never waits for the legacy
 * default stream); only rt_gpu_download, rt_gpu_sync and rt_gpu_sumsq_blocks wait for it (and
 * hand over the losses rt_gpu_loss queued). The
 * context is the device's primary context, made current again at the start of every call (a
 * context is current per thread, and the caller may use the GPU from more than one). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu_internal.h"

#define RT_GPU_THREADS 256       /* threads per block of mbt_rt_axpy and mbt_rt_scale */
#define RT_GPU_SUMSQ_THREADS 256 /* MBT_RT_SUMSQ_THREADS of rt_kernels.cu: the kernel needs exactly this */
#define RT_GPU_MAX_ROWS 65535    /* gridDim.y's limit (mbt_rt_scale strides over the rest) */

/* ---- sizes ---------------------------------------------------------------------------------- */

const char *rt_gpu_format_bytes(int64_t bytes, char buf[32]) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, 32, "%lld B", (long long)bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

/* ---- the context, launches ------------------------------------------------------------------ */

RtStatus rt_gpu_use(RtGpu *g, RtError *err) {
    return rt_cu_check(&g->api, g->api.cuCtxSetCurrent(g->ctx), err, "cuCtxSetCurrent", "the GPU's context");
}

RtStatus rt_gpu_side_stream(RtGpu *g, CUstream *s, CUevent *fork, CUevent *join, const char *stream_what, const char *events_what,
                            RtError *err) {
    RtStatus st = rt_gpu_use(g, err);
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuStreamCreate(s, CU_STREAM_NON_BLOCKING), err, "cuStreamCreate", "%s", stream_what);
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(fork, CU_EVENT_DEFAULT), err, "cuEventCreate", "%s", events_what);
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(join, CU_EVENT_DEFAULT), err, "cuEventCreate", "%s", events_what);
    return st;
}

/* One launch on the stream (timed under MBT_DEBUG); an error names the function and geometry. */
static RtStatus rt_gpu_run(RtGpu *g, CUfunction fn, const char *name, unsigned gx, unsigned gy, unsigned block, void **params,
                           RtError *err) {
    RtStatus st = rt_gpu_use(g, err);
    int64_t slot = -1;
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin(g, &slot, err);
    if (st != RT_OK) return st;
    CUresult rc = g->api.cuLaunchKernel(fn, gx, gy, 1, block, 1, 1, 0, g->stream, params, NULL);
    if (gy > 1) st = rt_cu_check(&g->api, rc, err, "cuLaunchKernel", "%s, %u x %u blocks of %u threads", name, gx, gy, block);
    else st = rt_cu_check(&g->api, rc, err, "cuLaunchKernel", "%s, %u blocks of %u threads", name, gx, block);
    if (slot >= 0) st = rt_gpu_time_end(g, slot, name, st, err);
    return st;
}

RtStatus rt_gpu_launch(RtGpu *g, int32_t kernel, void *const *bufs, RtError *err) {
    const RtGpuProgram *p = g->prog;
    if (kernel < 0 || kernel >= p->nkernels)
        return rt_fail(err, RT_ERR_ARG, "rt_gpu_launch: kernel %d is not in the program's table of %lld", (int)kernel,
                       (long long)p->nkernels);
    const RtGpuKernel *k = &p->kernels[kernel];
    if (g->graphs.mode == RT_GRAPH_PROBE) {
        rt_gpu_graph_probe(g, 'K', &kernel, sizeof kernel, 0);
        rt_gpu_graph_probe(g, 'B', bufs, sizeof *bufs * (size_t)k->nbufs, 0);
        return RT_OK;
    }
    void *params[RT_GPU_MAX_PARAMS];
    for (int32_t i = 0; i < k->nbufs; i++) params[i] = (void *)&bufs[i]; /* the driver reads each pointer */
    return rt_gpu_run(g, g->fns[kernel], k->function, (unsigned)k->blocks, 1, (unsigned)k->block, params, err);
}

/* Blocks for `items` work items of `threads` each: every item its thread, up to 32 blocks a
 * multiprocessor (the kernels stride over the rest). */
static unsigned rt_gpu_grid(const RtGpu *g, int64_t items, int threads) {
    int64_t blocks = (items + threads - 1) / threads, most = (int64_t)g->sms * 32;
    if (blocks > most) blocks = most;
    return blocks < 1 ? 1 : (unsigned)blocks;
}

RtStatus rt_gpu_axpy(RtGpu *g, float *dst, const float *src, float scale, int64_t n, RtError *err) {
    if (n < 0) return rt_fail(err, RT_ERR_ARG, "rt_gpu_axpy: negative length %lld", (long long)n);
    if (n == 0) return RT_OK;
    long long len = n;
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    uint64_t rec[4] = {(uintptr_t)dst, (uintptr_t)src, bits, (uint64_t)n};
    if (rt_gpu_graph_probe(g, 'A', rec, sizeof rec, 0)) return RT_OK;
    void *params[] = {&dst, &src, &scale, &len};
    return rt_gpu_run(g, g->fn_axpy, "mbt_rt_axpy", rt_gpu_grid(g, n, RT_GPU_THREADS), 1, RT_GPU_THREADS, params, err);
}

/* The device copy of a table (rt_gpu_axpy_table), uploaded the first time it is seen. Never
 * during a capture: a graph is captured only after its calls ran eagerly once. */
static RtStatus rt_gpu_table(RtGpu *g, const int64_t *table, int64_t count, CUdeviceptr *dev, RtError *err) {
    size_t bytes = (size_t)count * 3 * sizeof *table;
    for (int i = 0; i < g->tables.n; i++)
        if (g->tables.count[i] == count && memcmp(g->tables.host[i], table, bytes) == 0) {
            *dev = g->tables.dev[i];
            return RT_OK;
        }
    if (g->graphs.mode == RT_GRAPH_CAPTURE)
        return rt_fail(err, RT_ERR_ARG, "rt_gpu_axpy_table: a table first seen inside a CUDA graph capture");
    RtStatus st = RT_OK;
    if (g->tables.n == (int)(sizeof g->tables.dev / sizeof g->tables.dev[0])) { /* full: the oldest goes */
        st = rt_cu_check(&g->api, g->api.cuStreamSynchronize(g->stream), err, "cuStreamSynchronize", "freeing an axpy table");
        if (st != RT_OK) return st;
        rt_gpu_graph_forget(g); /* a graph may hold the table's address */
        rt_gpu_mem_free(g, g->tables.dev[0]);
        free(g->tables.host[0]);
        g->tables.n--;
        memmove(g->tables.host, g->tables.host + 1, (size_t)g->tables.n * sizeof g->tables.host[0]);
        memmove(g->tables.count, g->tables.count + 1, (size_t)g->tables.n * sizeof g->tables.count[0]);
        memmove(g->tables.dev, g->tables.dev + 1, (size_t)g->tables.n * sizeof g->tables.dev[0]);
    }
    int64_t *copy = malloc(bytes);
    if (!copy) return rt_fail(err, RT_ERR_NOMEM, "rt_gpu_axpy_table: out of memory");
    memcpy(copy, table, bytes);
    CUdeviceptr p = 0;
    st = rt_cu_check(&g->api, rt_gpu_mem_alloc(g, &p, bytes), err, "cuMemAlloc", "the gradients' axpy table, %lld entries",
                     (long long)count);
    /* from pageable memory: the driver has the bytes when this returns */
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuMemcpyHtoDAsync(p, table, bytes, g->stream), err, "cuMemcpyHtoDAsync",
                         "the gradients' axpy table");
    if (st != RT_OK) {
        if (p) rt_gpu_mem_free(g, p);
        free(copy);
        return st;
    }
    int i = g->tables.n++;
    g->tables.host[i] = copy;
    g->tables.count[i] = count;
    g->tables.dev[i] = p;
    *dev = p;
    return RT_OK;
}

RtStatus rt_gpu_axpy_table(RtGpu *g, const int64_t *table, int64_t count, float scale, RtError *err) {
    if (count < 0) return rt_fail(err, RT_ERR_ARG, "rt_gpu_axpy_table: negative count %lld", (long long)count);
    int64_t most = 0;
    for (int64_t e = 0; e < count; e++) {
        if (table[3 * e + 2] < 0)
            return rt_fail(err, RT_ERR_ARG, "rt_gpu_axpy_table: entry %lld has negative length %lld", (long long)e,
                           (long long)table[3 * e + 2]);
        if (table[3 * e + 2] > most) most = table[3 * e + 2];
    }
    if (count == 0 || most == 0) return RT_OK;
    if (g->graphs.mode == RT_GRAPH_PROBE) {
        uint32_t bits;
        memcpy(&bits, &scale, sizeof bits);
        uint64_t head[2] = {(uint64_t)count, bits};
        rt_gpu_graph_probe(g, 'T', head, sizeof head, 0);
        rt_gpu_graph_probe(g, 't', table, (size_t)count * 3 * sizeof *table, 0);
        return RT_OK;
    }
    RtStatus st = rt_gpu_use(g, err);
    CUdeviceptr dev = 0;
    if (st == RT_OK) st = rt_gpu_table(g, table, count, &dev, err);
    if (st != RT_OK) return st;
    long long n = count;
    void *params[] = {&dev, &n, &scale};
    /* every entry its row of blocks; the x blocks cover the largest entry (at most 8 a multiprocessor:
     * the rows of small entries are mostly idle blocks, which cost little) */
    unsigned gx = rt_gpu_grid(g, most, RT_GPU_THREADS), cap = (unsigned)(g->sms > 0 ? g->sms * 8 : 8);
    if (gx > cap) gx = cap;
    unsigned gy = count < RT_GPU_MAX_ROWS ? (unsigned)count : RT_GPU_MAX_ROWS;
    return rt_gpu_run(g, g->fn_axpy_table, "mbt_rt_axpy_table", gx, gy, RT_GPU_THREADS, params, err);
}

RtStatus rt_gpu_scale_rows(RtGpu *g, float *x, float scale, int64_t rows, int64_t cols, int64_t pitch, RtError *err) {
    if (rows <= 0 || cols <= 0) return RT_OK;
    long long r = rows, c = cols, p = pitch;
    void *params[] = {&x, &scale, &r, &c, &p};
    unsigned gy = rows < RT_GPU_MAX_ROWS ? (unsigned)rows : RT_GPU_MAX_ROWS;
    return rt_gpu_run(g, g->fn_scale, "mbt_rt_scale", rt_gpu_grid(g, cols, RT_GPU_THREADS), gy, RT_GPU_THREADS, params, err);
}

RtStatus rt_gpu_scale(RtGpu *g, float *dev, float scale, int64_t n, RtError *err) {
    if (n < 0) return rt_fail(err, RT_ERR_ARG, "rt_gpu_scale: negative length %lld", (long long)n);
    return rt_gpu_scale_rows(g, dev, scale, 1, n, n, err);
}

/* ---- memory and copies ---------------------------------------------------------------------- */

CUresult rt_gpu_mem_alloc(RtGpu *g, CUdeviceptr *p, size_t bytes) {
    if (g->mem.n == g->mem.cap) {
        int64_t cap = g->mem.cap ? 2 * g->mem.cap : 64;
        CUdeviceptr *ptr = realloc(g->mem.ptr, (size_t)cap * sizeof *ptr);
        if (ptr) g->mem.ptr = ptr;
        int64_t *b = ptr ? realloc(g->mem.bytes, (size_t)cap * sizeof *b) : NULL;
        if (b) g->mem.bytes = b;
        if (!ptr || !b) return CUDA_ERROR_OUT_OF_MEMORY;
        g->mem.cap = cap;
    }
    CUresult rc = g->api.cuMemAlloc(p, bytes);
    if (rc != CUDA_SUCCESS) return rc;
    g->mem.ptr[g->mem.n] = *p;
    g->mem.bytes[g->mem.n++] = (int64_t)bytes;
    g->mem.now += (int64_t)bytes;
    if (g->mem.now > g->mem.peak) g->mem.peak = g->mem.now;
    return rc;
}

void rt_gpu_mem_free(RtGpu *g, CUdeviceptr p) {
    if (!p) return;
    for (int64_t i = g->mem.n - 1; i >= 0; i--)
        if (g->mem.ptr[i] == p) {
            g->mem.now -= g->mem.bytes[i];
            g->mem.ptr[i] = g->mem.ptr[--g->mem.n];
            g->mem.bytes[i] = g->mem.bytes[g->mem.n];
            break;
        }
    g->api.cuMemFree(p);
}

int64_t rt_gpu_peak_bytes(const RtGpu *g) { return g ? g->mem.peak : 0; }

RtStatus rt_gpu_alloc(RtGpu *g, void **dev, int64_t bytes, const char *what, RtError *err) {
    *dev = NULL;
    if (bytes < 0) return rt_fail(err, RT_ERR_ARG, "cannot allocate %s on the GPU: negative size %lld", what, (long long)bytes);
    if (bytes == 0) return RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    char size[32];
    CUdeviceptr p = 0;
    st = rt_cu_check(&g->api, rt_gpu_mem_alloc(g, &p, (size_t)bytes), err, "cuMemAlloc", "%s, %s", what,
                     rt_gpu_format_bytes(bytes, size));
    if (st != RT_OK) return st;
    st = rt_cu_check(&g->api, g->api.cuMemsetD8Async(p, 0, (size_t)bytes, g->stream), err, "cuMemsetD8Async", "zeroing %s, %s",
                     what, size);
    if (st != RT_OK) {
        rt_gpu_mem_free(g, p);
        return st;
    }
    *dev = (void *)(uintptr_t)p;
    return RT_OK;
}

/* Freeing synchronises with the device, so memory a queued kernel still uses is not reused under it. */
void rt_gpu_free(RtGpu *g, void *dev) {
    if (!g || !dev) return;
    g->api.cuCtxSetCurrent(g->ctx);
    rt_gpu_mem_free(g, rt_dptr(dev));
}

RtStatus rt_gpu_mem_info(RtGpu *g, int64_t *free_bytes, int64_t *total_bytes, RtError *err) {
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    size_t f = 0, t = 0;
    st = rt_cu_check(&g->api, g->api.cuMemGetInfo(&f, &t), err, "cuMemGetInfo", "reading the device's free memory");
    *free_bytes = (int64_t)f, *total_bytes = (int64_t)t;
    return st;
}

RtStatus rt_gpu_host_alloc(RtGpu *g, void **host, int64_t bytes, const char *what, RtError *err) {
    *host = NULL;
    if (bytes < 0) return rt_fail(err, RT_ERR_ARG, "cannot allocate %s: negative size %lld", what, (long long)bytes);
    if (bytes == 0) return RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    char size[32];
    st = rt_cu_check(&g->api, g->api.cuMemHostAlloc(host, (size_t)bytes, CU_MEMHOSTALLOC_PORTABLE), err, "cuMemHostAlloc",
                     "%s, %s of page-locked host memory", what, rt_gpu_format_bytes(bytes, size));
    if (st != RT_OK) {
        *host = NULL;
        return st;
    }
    memset(*host, 0, (size_t)bytes);
    return RT_OK;
}

void rt_gpu_host_free(RtGpu *g, void *host) {
    if (!g || !host) return;
    g->api.cuCtxSetCurrent(g->ctx);
    g->api.cuMemFreeHost(host);
}

RtStatus rt_gpu_zero(RtGpu *g, void *dev, int64_t bytes, RtError *err) {
    if (bytes <= 0) return bytes < 0 ? rt_fail(err, RT_ERR_ARG, "rt_gpu_zero: negative size %lld", (long long)bytes) : RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    char size[32];
    return rt_cu_check(&g->api, g->api.cuMemsetD8Async(rt_dptr(dev), 0, (size_t)bytes, g->stream), err, "cuMemsetD8Async",
                       "zeroing %s", rt_gpu_format_bytes(bytes, size));
}

RtStatus rt_gpu_copy(RtGpu *g, void *dst, const void *src, int64_t bytes, RtError *err) {
    if (bytes <= 0) return bytes < 0 ? rt_fail(err, RT_ERR_ARG, "rt_gpu_copy: negative size %lld", (long long)bytes) : RT_OK;
    const void *rec[3] = {dst, src, (const void *)(intptr_t)bytes};
    if (rt_gpu_graph_probe(g, 'C', rec, sizeof rec, 0)) return RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    char size[32];
    return rt_cu_check(&g->api, g->api.cuMemcpyDtoDAsync(rt_dptr(dst), rt_dptr(src), (size_t)bytes, g->stream), err,
                       "cuMemcpyDtoDAsync", "copying %s on the device", rt_gpu_format_bytes(bytes, size));
}

/* From pageable memory the driver copies `host` into its own staging buffer before returning, so
 * the caller may reuse it at once (the transfer to the device is still queued). From page-locked
 * memory (rt_gpu_host_alloc) the transfer reads `host` when the stream reaches it: the caller
 * must not rewrite it before a later call that waits (rt_gpu_sync, rt_gpu_download). */
RtStatus rt_gpu_upload(RtGpu *g, void *dev, const void *host, int64_t bytes, RtError *err) {
    if (bytes <= 0) return bytes < 0 ? rt_fail(err, RT_ERR_ARG, "rt_gpu_upload: negative size %lld", (long long)bytes) : RT_OK;
    RtStatus st;
    if (rt_gpu_graph_upload(g, dev, host, bytes, &st, err)) return st; /* probed, or a copy inside a graph */
    st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    char size[32];
    return rt_cu_check(&g->api, g->api.cuMemcpyHtoDAsync(rt_dptr(dev), host, (size_t)bytes, g->stream), err, "cuMemcpyHtoDAsync",
                       "uploading %s", rt_gpu_format_bytes(bytes, size));
}

/* Waits for the stream, then hands over the losses it copied and reads back the timing events it
 * passed. */
static RtStatus rt_gpu_wait(RtGpu *g, const char *what, RtError *err) {
    RtStatus st = rt_cu_check(&g->api, g->api.cuStreamSynchronize(g->stream), err, "cuStreamSynchronize", "%s", what);
    for (int i = 0; i < g->nlosses && st == RT_OK; i++) *g->loss_dst[i] = g->losses[i];
    g->nlosses = 0; /* after a failure the losses stay NaN */
    if (st == RT_OK && g->timer.on) st = rt_gpu_timer_resolve(g, err);
    return st;
}

RtStatus rt_gpu_loss(RtGpu *g, double *dst, const float *dev, RtError *err) {
    *dst = NAN;
    RtStatus st;
    if (rt_gpu_graph_loss(g, dst, dev, &st, err)) return st; /* probed, or a copy inside a graph */
    st = rt_gpu_use(g, err);
    if (st == RT_OK && !g->losses)
        st = rt_gpu_host_alloc(g, (void **)&g->losses, RT_GPU_LOSSES * (int64_t)sizeof(float), "the losses' slots", err);
    if (st == RT_OK && g->nlosses == RT_GPU_LOSSES) st = rt_gpu_wait(g, "collecting the queued losses", err);
    if (st != RT_OK) return st;
    st = rt_cu_check(&g->api, g->api.cuMemcpyDtoHAsync(&g->losses[g->nlosses], rt_dptr(dev), sizeof(float), g->stream), err,
                     "cuMemcpyDtoHAsync", "the loss");
    if (st == RT_OK) g->loss_dst[g->nlosses++] = dst;
    return st;
}

RtStatus rt_gpu_download(RtGpu *g, void *host, const void *dev, int64_t bytes, RtError *err) {
    if (bytes < 0) return rt_fail(err, RT_ERR_ARG, "rt_gpu_download: negative size %lld", (long long)bytes);
    const void *rec[3] = {host, dev, (const void *)(intptr_t)bytes};
    if (rt_gpu_graph_probe(g, 'D', rec, sizeof rec, 1)) return RT_OK; /* it waits: no graph */
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    char size[32], what[64];
    snprintf(what, sizeof what, "downloading %s", rt_gpu_format_bytes(bytes, size));
    if (bytes > 0)
        st = rt_cu_check(&g->api, g->api.cuMemcpyDtoHAsync(host, rt_dptr(dev), (size_t)bytes, g->stream), err,
                         "cuMemcpyDtoHAsync", "%s", what);
    return st == RT_OK ? rt_gpu_wait(g, what, err) : st;
}

RtStatus rt_gpu_sync(RtGpu *g, const char *what, RtError *err) {
    if (rt_gpu_graph_probe(g, 'S', "", 0, 1)) return RT_OK; /* it waits: no graph */
    RtStatus st = rt_gpu_use(g, err);
    return st == RT_OK ? rt_gpu_wait(g, what ? what : "waiting for the GPU", err) : st;
}

/* ---- the gradient region -------------------------------------------------------------------- */

RtStatus rt_gpu_sumsq_blocks(RtGpu *g, const float *dev, int64_t n, int64_t block, double *partial, RtError *err) {
    if (n < 0 || block <= 0)
        return rt_fail(err, RT_ERR_ARG, "rt_gpu_sumsq_blocks: invalid length %lld or block %lld", (long long)n, (long long)block);
    if (n == 0) return RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    int64_t nblocks = (n + block - 1) / block;
    if (nblocks > g->partial_cap) {
        if (g->partial) rt_gpu_mem_free(g, rt_dptr(g->partial));
        g->partial = NULL;
        g->partial_cap = 0;
        CUdeviceptr p = 0;
        st = rt_cu_check(&g->api, rt_gpu_mem_alloc(g, &p, (size_t)nblocks * sizeof(double)), err, "cuMemAlloc",
                         "the gradient norm's %lld partial sums", (long long)nblocks);
        if (st != RT_OK) return st;
        g->partial = (double *)(uintptr_t)p;
        g->partial_cap = nblocks;
    }
    long long len = n, blk = block;
    void *params[] = {&dev, &len, &blk, &g->partial};
    st = rt_gpu_run(g, g->fn_sumsq, "mbt_rt_sumsq_blocks", rt_gpu_grid(g, nblocks, 1), 1, RT_GPU_SUMSQ_THREADS, params, err);
    if (st != RT_OK) return st;
    return rt_gpu_download(g, partial, g->partial, nblocks * (int64_t)sizeof(double), err);
}

/* ---- the timing report ------------------------------------------------------------------------ */

void rt_gpu_print_timing(FILE *f, RtGpu *g) {
    if (!g || !g->timer.on) return;
    RtGpuTimer *t = &g->timer;
    RtError e;
    RtStatus st = rt_gpu_sync(g, "reading GPU timing", &e);
    if (st != RT_OK) fprintf(f, "GPU timing is incomplete: %s\n", e.msg);
    rt_gpu_stats_print(f, &t->stats);
    if (!t->trace_path) return;
    if (rt_gpu_trace_flush(g, &e) != RT_OK) fprintf(f, "GPU trace: %s\n", e.msg);
    else if (t->dropped)
        fprintf(f, "GPU trace: %s (the first %lld events; %lld more not kept)\n", t->trace_path, (long long)t->nevents,
                (long long)t->dropped);
    else fprintf(f, "GPU trace: %s (%lld events)\n", t->trace_path, (long long)t->nevents);
}
