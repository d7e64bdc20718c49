/* gpu_open.c - opening and closing the GPU for one run (rt_gpu.h): device 0 with the program's
 * module, its functions, cuBLASLt and the timer; the cache of JIT-compiled PTX.
 *
 * Pipeline position: the top of the GPU's files (gpu.c describes their layering): it starts and
 * stops what gpu.c, gpu_blas.c and gpu_timing.c use, and nothing below calls back into it.
 *
 * Opening, in order: the libraries (gpu_api.c); cuInit; device 0 (CUDA_VISIBLE_DEVICES chooses
 * which GPU that is, as for every CUDA program); its compute capability; the module image for it.
 * A failure up to there means "no usable GPU": --device auto then runs on the CPU and says why,
 * --device cuda fails with that reason. After it (the primary context, a stream, the module, its
 * functions, cuBLASLt) every failure is an error either way.
 *
 * The module is the program's cubin for exactly the device's architecture, else the PTX of the
 * highest virtual architecture not above it, which the driver compiles (cuLink*) for the device.
 * That takes seconds for a large program, so the cubin is kept in the JIT cache
 * (rt_gpu_cache_dir, one file per module hash, architecture and driver version) and loaded from
 * there by later runs; a cache file that does not load is compiled again and replaced. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu_internal.h"

#define RT_GPU_LOG 8192 /* bytes of a JIT error log kept */

/* The reason rt_gpu_open gives for not using a GPU (rt_gpu.h: valid until this thread's next open). */
static _Thread_local char rt_gpu_why[RT_ERROR_MAX];

/* ---- names, the cache's files -------------------------------------------------------------- */

/* snprintf for the reasons and notes kept in fixed buffers: a text too long is cut, as RtError's are. */
static void rt_gpu_text(char *buf, size_t cap, const char *fmt, ...) RT_PRINTF(3, 4);
static void rt_gpu_text(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

const char *rt_gpu_cache_dir(void) {
    static _Thread_local char dir[RT_GPU_PATH_MAX];
    const char *env = getenv("MBT_CACHE_DIR");
    int n = -1;
    if (env && *env) n = snprintf(dir, sizeof dir, "%s", env);
    else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/') /* the XDG spec: relative paths are ignored */
        n = snprintf(dir, sizeof dir, "%s/mbt", env);
    else if ((env = getenv("HOME")) && *env) n = snprintf(dir, sizeof dir, "%s/.cache/mbt", env);
    return n >= 0 && (size_t)n < sizeof dir ? dir : NULL;
}

int rt_gpu_cache_file(char *buf, size_t cap, const char *dir, const char *module_hash, int arch, int driver) {
    int n = snprintf(buf, cap, "%s/", dir);
    if (n < 0 || (size_t)n >= cap) return 0;
    size_t len = (size_t)n;
    for (const char *p = module_hash; *p; p++) {
        if (len + 1 >= cap) return 0;
        char c = *p;
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        buf[len++] = keep ? c : '-';
    }
    n = snprintf(buf + len, cap - len, "-sm_%d-%d.cubin", arch, driver);
    return n >= 0 && (size_t)n < cap - len;
}

/* mkdir -p: the cache's directory and its parents (0755 before umask). */
static RtStatus rt_make_dirs(const char *dir, RtError *err) {
    char path[RT_GPU_PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return rt_fail(err, RT_ERR_ARG, "the JIT cache directory '%s' is too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return rt_fail_errno(err, errno, "cannot create the JIT cache directory '%s'", path);
        *p = c;
        if (!c) return RT_OK;
    }
}

/* rt_gpu_bind_local_rank's rank: which device a GPU opens (modulo the devices the driver sees). */
static int rt_gpu_local_rank;

void rt_gpu_bind_local_rank(int local_rank) { rt_gpu_local_rank = local_rank > 0 ? local_rank : 0; }

/* ---- opening: the device --------------------------------------------------------------------- */

/* "compute_90" with prefix "compute_": 1 and *v = 90; an architecture with a suffix (sm_90a, whose
 * code runs on that GPU alone) or anything else: 0. */
static int rt_parse_arch(const char *arch, const char *prefix, int *v) {
    size_t n = strlen(prefix);
    if (!arch || strncmp(arch, prefix, n) != 0 || !arch[n]) return 0;
    int x = 0;
    for (const char *p = arch + n; *p; p++) {
        if (*p < '0' || *p > '9' || x > 10000) return 0;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    return 1;
}

/* The cubin for exactly sm_<arch>, else the PTX of the highest compute_XX <= arch, else NULL. */
static const RtGpuImage *rt_gpu_pick_image(const RtGpuProgram *p, int arch) {
    const RtGpuImage *best = NULL;
    int best_v = -1, v;
    for (int64_t i = 0; i < p->nimages; i++) {
        const RtGpuImage *img = &p->images[i];
        if (!img->data || img->size <= 0) continue;
        if (!img->ptx && rt_parse_arch(img->arch, "sm_", &v) && v == arch) return img;
        if (img->ptx && rt_parse_arch(img->arch, "compute_", &v) && v <= arch && v > best_v) {
            best = img;
            best_v = v;
        }
    }
    return best;
}

static void rt_gpu_no_image(const RtGpu *g, char *why, size_t cap) {
    int n = snprintf(why, cap, "the program's CUDA module has no image for this GPU's sm_%d (it has", g->arch);
    for (int64_t i = 0; i < g->prog->nimages && n > 0 && (size_t)n < cap; i++)
        n += snprintf(why + n, cap - (size_t)n, "%s %s", i ? "," : "", g->prog->images[i].arch);
    if (n > 0 && (size_t)n < cap) snprintf(why + n, cap - (size_t)n, "%s)", g->prog->nimages ? "" : " none");
}

/* A driver query that must succeed for the GPU to be usable; 0 with the reason in why. */
static int rt_gpu_query(RtGpu *g, CUresult rc, const char *call, char *why, size_t cap) {
    RtError e;
    if (rt_cu_check(&g->api, rc, &e, call, "device 0") == RT_OK) return 1;
    rt_gpu_text(why, cap, "the CUDA device cannot be used: %s", e.msg);
    return 0;
}

/* cuInit, device 0, its architecture and the module image for it: 1, or 0 with why (no usable GPU). */
static int rt_gpu_find_device(RtGpu *g, char *why, size_t cap) {
    RtGpuApi *api = &g->api;
    CUresult rc = api->cuInit(0);
    if (rc != CUDA_SUCCESS) {
        RtError e;
        rt_cu_check(api, rc, &e, "cuInit", "the CUDA driver %s", api->cuda_path);
        if (rc == CUDA_ERROR_STUB_LIBRARY)
            rt_gpu_text(why, cap, "no CUDA driver: %s (the toolkit's stub for linking, not an installed NVIDIA driver)", e.msg);
        else
            rt_gpu_text(why, cap, "%s: %s", rc == CUDA_ERROR_NO_DEVICE ? "no CUDA device" : "the CUDA driver cannot start",
                        e.msg);
        return 0;
    }
    api->initialized = 1;
    if (api->cuDriverGetVersion(&g->driver) != CUDA_SUCCESS) g->driver = 0;
    int count = 0, major = 0, minor = 0;
    if (!rt_gpu_query(g, api->cuDeviceGetCount(&count), "cuDeviceGetCount", why, cap)) return 0;
    if (count < 1) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(why, cap, "no CUDA device (the driver sees none%s%s%s)", vis ? "; CUDA_VISIBLE_DEVICES='" : "", vis ? vis : "",
                 vis ? "'" : "");
        return 0;
    }
    g->ordinal = rt_gpu_local_rank % count; /* one rank per GPU, by local rank (docs/parallel.md) */
    if (!rt_gpu_query(g, api->cuDeviceGet(&g->dev, g->ordinal), "cuDeviceGet", why, cap) ||
        !rt_gpu_query(g, api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g->dev),
                      "cuDeviceGetAttribute", why, cap) ||
        !rt_gpu_query(g, api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g->dev),
                      "cuDeviceGetAttribute", why, cap) ||
        !rt_gpu_query(g, api->cuDeviceGetAttribute(&g->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g->dev),
                      "cuDeviceGetAttribute", why, cap))
        return 0;
    g->arch = major * 10 + minor;
    g->image = rt_gpu_pick_image(g->prog, g->arch);
    if (!g->image) {
        rt_gpu_no_image(g, why, cap);
        return 0;
    }
    return 1;
}

/* ---- opening: the module --------------------------------------------------------------------- */

/* Appends the JIT log's first lines to err's message (one line: newlines become "; "). */
static void rt_append_log(RtError *err, const char *log) {
    if (!err || !log[0]) return;
    size_t len = strlen(err->msg);
    int n = snprintf(err->msg + len, sizeof err->msg - len, " (log: %s)", log);
    if (n < 0) return;
    for (char *p = err->msg + len; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
}

static RtStatus rt_gpu_load_image(RtGpu *g, const void *image, const char *what, RtError *err) {
    char log[RT_GPU_LOG] = "";
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, (void *)(uintptr_t)sizeof log};
    RtStatus st =
        rt_cu_check(&g->api, g->api.cuModuleLoadDataEx(&g->module, image, 2, opts, vals), err, "cuModuleLoadDataEx", "%s", what);
    if (st != RT_OK) {
        g->module = NULL;
        rt_append_log(err, log);
    }
    return st;
}

/* The cached cubin for this module, architecture and driver: 1 when it loaded. A file that is
 * there but does not load is noted (and replaced by the caller). */
static int rt_gpu_load_cached(RtGpu *g, const char *path) {
    unsigned char *data;
    size_t size;
    RtError e;
    if (rt_read_file(path, "JIT cache file", (int64_t)1 << 30, &data, &size, &e) != RT_OK) return 0; /* not cached yet */
    RtStatus st = size ? rt_gpu_load_image(g, data, path, &e) : rt_fail(&e, RT_ERR_FORMAT, "'%s' is empty", path);
    free(data);
    if (st == RT_OK) return 1;
    rt_gpu_text(g->module_note, sizeof g->module_note, ", the cached cubin did not load (%s)", e.msg);
    return 0;
}

/* Writes the JIT-compiled cubin into the cache; a failure only costs later runs the compilation. */
static void rt_gpu_save_cached(RtGpu *g, const char *dir, const char *path, const void *cubin, size_t size) {
    RtError e;
    size_t len = strlen(g->module_note);
    if (rt_make_dirs(dir, &e) == RT_OK && rt_atomic_write_file(path, "JIT cache file", cubin, size, &e) == RT_OK)
        rt_gpu_text(g->module_note + len, sizeof g->module_note - len, ", saved in the cache");
    else rt_gpu_text(g->module_note + len, sizeof g->module_note - len, ", not cached: %s", e.msg);
}

/* Compiles the PTX image for the device (the context's architecture) and loads the cubin. */
static RtStatus rt_gpu_jit(RtGpu *g, const char *dir, const char *path, RtError *err) {
    RtGpuApi *api = &g->api;
    char log[RT_GPU_LOG] = "", what[64];
    snprintf(what, sizeof what, "JIT-compiling the PTX for %s to sm_%d", g->image->arch, g->arch);
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, (void *)(uintptr_t)sizeof log};
    CUlinkState link = NULL;
    RtStatus st = rt_cu_check(api, api->cuLinkCreate(2, opts, vals, &link), err, "cuLinkCreate", "%s", what);
    if (st != RT_OK) return st;
    void *cubin = NULL;
    size_t size = 0;
    st = rt_cu_check(api,
                     api->cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)g->image->data, (size_t)g->image->size, "mbt_program.ptx",
                                        0, NULL, NULL),
                     err, "cuLinkAddData", "%s", what);
    if (st == RT_OK) st = rt_cu_check(api, api->cuLinkComplete(link, &cubin, &size), err, "cuLinkComplete", "%s", what);
    if (st != RT_OK) rt_append_log(err, log);
    if (st == RT_OK) st = rt_gpu_load_image(g, cubin, "the JIT-compiled cubin", err);
    if (st == RT_OK && path) rt_gpu_save_cached(g, dir, path, cubin, size); /* cubin belongs to link */
    api->cuLinkDestroy(link);
    return st;
}

static RtStatus rt_gpu_load_module(RtGpu *g, RtError *err) {
    const RtGpuImage *img = g->image;
    g->module_note[0] = 0;
    if (!img->ptx) {
        snprintf(g->module_kind, sizeof g->module_kind, "cubin %s", img->arch);
        return rt_gpu_load_image(g, img->data, g->module_kind, err);
    }
    snprintf(g->module_kind, sizeof g->module_kind, "PTX %s, JIT-compiled for sm_%d", img->arch, g->arch);
    if (img->data[img->size - 1] != 0)
        return rt_fail(err, RT_ERR_ARG, "the program's PTX image for %s is not NUL-terminated", img->arch);
    const char *dir = rt_gpu_cache_dir(), *hash = g->prog->module_hash;
    char path[RT_GPU_PATH_MAX];
    int cached = dir && hash && *hash && rt_gpu_cache_file(path, sizeof path, dir, hash, g->arch, g->driver);
    if (cached && rt_gpu_load_cached(g, path)) {
        snprintf(g->module_note, sizeof g->module_note, ", from the cache");
        return RT_OK;
    }
    if (!cached)
        snprintf(g->module_note, sizeof g->module_note, ", not cached: %s",
                 !dir              ? "no cache directory (set MBT_CACHE_DIR or HOME)"
                 : !hash || !*hash ? "the program has no module hash"
                                   : "the cache path is too long");
    return rt_gpu_jit(g, dir, cached ? path : NULL, err);
}

/* ---- opening: functions, the rest ------------------------------------------------------------ */

static RtStatus rt_gpu_check_kernel(const RtGpuKernel *k, int64_t i, RtError *err) {
    if (!k->function) return rt_fail(err, RT_ERR_ARG, "the program's kernel %lld has no function name", (long long)i);
    if (k->block < 1 || k->block > 1024 || k->blocks < 1 || k->blocks > INT32_MAX || k->nbufs < 0 || k->nbufs > RT_GPU_MAX_PARAMS)
        return rt_fail(err, RT_ERR_ARG,
                       "the program's kernel %lld (%s) cannot be launched: %lld blocks of %d threads, %d buffers (at most "
                       "2147483647 blocks of 1024 threads, %d buffers)",
                       (long long)i, k->function, (long long)k->blocks, (int)k->block, (int)k->nbufs, RT_GPU_MAX_PARAMS);
    return RT_OK;
}

/* Every function of the program's kernel table and the runtime's own, looked up once. */
static RtStatus rt_gpu_functions(RtGpu *g, RtError *err) {
    const RtGpuProgram *p = g->prog;
    if (p->nkernels < 0 || (p->nkernels > 0 && !p->kernels))
        return rt_fail(err, RT_ERR_ARG, "the program's kernel table is invalid (%lld kernels)", (long long)p->nkernels);
    g->fns = calloc(p->nkernels > 0 ? (size_t)p->nkernels : 1, sizeof *g->fns);
    if (!g->fns) return rt_fail(err, RT_ERR_NOMEM, "cannot open the GPU: out of memory for %lld kernels", (long long)p->nkernels);
    RtStatus st = RT_OK;
    for (int64_t i = 0; i < p->nkernels && st == RT_OK; i++) {
        const RtGpuKernel *k = &p->kernels[i];
        st = rt_gpu_check_kernel(k, i, err);
        if (st == RT_OK)
            st = rt_cu_check(&g->api, g->api.cuModuleGetFunction(&g->fns[i], g->module, k->function), err, "cuModuleGetFunction",
                             "the program's kernel %lld, %s", (long long)i, k->function);
    }
    const struct {
        CUfunction *fn;
        const char *name;
    } own[] = {{&g->fn_axpy, "mbt_rt_axpy"},
               {&g->fn_axpy_table, "mbt_rt_axpy_table"},
               {&g->fn_scale, "mbt_rt_scale"},
               {&g->fn_sumsq, "mbt_rt_sumsq_blocks"}};
    for (size_t i = 0; i < sizeof own / sizeof own[0] && st == RT_OK; i++)
        st = rt_cu_check(&g->api, g->api.cuModuleGetFunction(own[i].fn, g->module, own[i].name), err, "cuModuleGetFunction",
                         "the runtime's kernel %s, which mbtc appends to every program's CUDA source", own[i].name);
    return st;
}

static void rt_gpu_fill_describe(RtGpu *g) {
    char name[256] = "unknown GPU", mem[32] = "? GiB", nccl[32] = "no NCCL";
    size_t total = 0;
    if (g->api.cuDeviceGetName(name, (int)sizeof name, g->dev) != CUDA_SUCCESS) snprintf(name, sizeof name, "unknown GPU");
    if (g->api.cuDeviceTotalMem(&total, g->dev) == CUDA_SUCCESS) rt_gpu_format_bytes((int64_t)total, mem);
    int nv = 0;
    if (g->api.nccl_lib && g->api.ncclGetVersion(&nv) == 0)
        snprintf(nccl, sizeof nccl, "NCCL %d.%d.%d", nv / 10000, nv / 100 % 100, nv % 100);
    size_t lt = g->api.cublasLtGetVersion();
    snprintf(g->describe, sizeof g->describe, "%s, sm_%d, %d SMs, %s; driver %d.%d; module: %s%s; cuBLASLt %zu.%zu.%zu; %s", name,
             g->arch, g->sms, mem, g->driver / 1000, g->driver % 1000 / 10, g->module_kind, g->module_note, lt / 10000,
             lt / 100 % 100, lt % 100, nccl);
}

/* Everything after the device was found usable: a failure here is an error. */
static RtStatus rt_gpu_start(RtGpu *g, RtError *err) {
    RtGpuApi *api = &g->api;
    RtStatus st = rt_cu_check(api, api->cuDevicePrimaryCtxRetain(&g->ctx, g->dev), err, "cuDevicePrimaryCtxRetain", "device 0");
    if (st != RT_OK) {
        g->ctx = NULL;
        return st;
    }
    st = rt_gpu_use(g, err);
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING), err, "cuStreamCreate", "the GPU's stream");
    if (st == RT_OK) st = rt_gpu_load_module(g, err);
    if (st == RT_OK) st = rt_gpu_functions(g, err);
    if (st == RT_OK) st = rt_gpu_blas_open(g, err);
    if (st == RT_OK) st = rt_gpu_timer_open(g, err);
    if (st == RT_OK) st = rt_gpu_graph_open(g, err);
    if (st == RT_OK) rt_gpu_fill_describe(g);
    return st;
}

/* No usable GPU: AUTO says why and goes on without one, CUDA fails with the reason. */
static RtStatus rt_gpu_unavailable(RtDeviceWant want, const char **why, RtError *err, const char *fmt, ...) RT_PRINTF(4, 5);
static RtStatus rt_gpu_unavailable(RtDeviceWant want, const char **why, RtError *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt_gpu_why, sizeof rt_gpu_why, fmt, ap);
    va_end(ap);
    if (want == RT_DEVICE_CUDA) return rt_fail(err, RT_ERR_ARG, "%s", rt_gpu_why);
    if (why) *why = rt_gpu_why;
    return RT_OK;
}

RtStatus rt_gpu_open(RtGpu **out, const RtGpuProgram *prog, RtDeviceWant want, const char **why, RtError *err) {
    *out = NULL;
    if (why) *why = NULL;
    if (want == RT_DEVICE_CPU) return rt_gpu_unavailable(want, why, err, "the CPU was asked for");
    if (!prog) return rt_gpu_unavailable(want, why, err, "the program was built without CUDA");
    RtGpu *g = calloc(1, sizeof *g);
    if (!g) return rt_fail(err, RT_ERR_NOMEM, "cannot open the GPU: out of memory");
    g->prog = prog;
    char reason[RT_ERROR_MAX];
    if (!rt_gpu_api_open(&g->api, reason, sizeof reason) || !rt_gpu_find_device(g, reason, sizeof reason)) {
        rt_gpu_close(g);
        return rt_gpu_unavailable(want, why, err, "%s", reason);
    }
    RtStatus st = rt_gpu_start(g, err);
    if (st != RT_OK) {
        rt_gpu_close(g);
        return st;
    }
    *out = g;
    return RT_OK;
}

/* Releasing the primary context (when no one else holds it) frees whatever device and
 * page-locked memory the caller did not free itself. */
void rt_gpu_close(RtGpu *g) {
    if (!g) return;
    if (g->ctx) {
        RtGpuApi *api = &g->api;
        api->cuCtxSetCurrent(g->ctx);
        if (g->stream) api->cuStreamSynchronize(g->stream);
        rt_gpu_timer_close(g); /* its last events may be on the copy streams: read while they exist */
        rt_gpu_act_close(g);
        rt_gpu_opt_close(g);
        rt_gpu_comm_close(g);
        rt_gpu_graph_close(g);
        rt_gpu_blas_close(g);
        if (g->partial) rt_gpu_mem_free(g, rt_dptr(g->partial));
        for (int i = 0; i < g->tables.n; i++) {
            rt_gpu_mem_free(g, g->tables.dev[i]);
            free(g->tables.host[i]);
        }
        if (g->losses) api->cuMemFreeHost(g->losses);
        if (g->module) api->cuModuleUnload(g->module);
        if (g->stream) api->cuStreamDestroy(g->stream);
        api->cuDevicePrimaryCtxRelease(g->dev);
    }
    free(g->fns);
    free(g->mem.ptr);
    free(g->mem.bytes);
    rt_gpu_api_close(&g->api);
    free(g);
}

const char *rt_gpu_describe(const RtGpu *g) { return g ? g->describe : "no GPU"; }

int rt_gpu_arch(const RtGpu *g) { return g ? g->arch : 0; }
