/* gpu_api.c - the CUDA driver, cuBLASLt and NCCL opened with dlopen, every function the runtime
 * calls looked up once into one table (RtGpuApi, gpu_internal.h), and CUDA's errors as messages.
 *
 * Pipeline position: under gpu.c, gpu_blas.c and gpu_timing.c, which call the libraries only
 * through the table. Executables have no link-time dependency on CUDA: on a machine without it
 * only opening a GPU fails, saying which library was missing and where it was looked for.
 *
 * Where the libraries are looked for:
 *   the driver   $MBT_LIBCUDA when set (tests, unusual installs), else libcuda.so.1 on the
 *                loader's path (the driver installs it there; it is never in the toolkit);
 *   cuBLASLt     $MBT_LIBCUBLASLT when set, else libcublasLt.so.13, .so.12, .so on the loader's
 *                path, then in $CUDA_HOME/lib64 and /usr/local/cuda/lib64;
 *   NCCL         $MBT_LIBNCCL when set (the emulated GPU's tests/cudaemu/fake_nccl.c), else
 *                libnccl.so.2 on the loader's path, then the same two directories; optional: the
 *                data-parallel ranks' collectives use it on GPU buffers when it is there
 *                (runtime/comm/comm_nccl.c). */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu_internal.h"

/* ---- opening a library ---------------------------------------------------------------------- */

#define RT_MAX_CANDIDATES 12

/* Candidate files: each name on the loader's path, then in $CUDA_HOME/lib64 and
 * /usr/local/cuda/lib64. Returns how many were written into cand. */
static int rt_candidates(char cand[][RT_GPU_PATH_MAX], const char *const *names, int nnames) {
    const char *home = getenv("CUDA_HOME");
    const char *dirs[2];
    int ndirs = 0;
    if (home && *home) dirs[ndirs++] = home;
    dirs[ndirs++] = "/usr/local/cuda";
    int n = 0;
    for (int i = 0; i < nnames; i++) snprintf(cand[n++], RT_GPU_PATH_MAX, "%s", names[i]);
    for (int d = 0; d < ndirs; d++)
        for (int i = 0; i < nnames && n < RT_MAX_CANDIDATES; i++)
            snprintf(cand[n++], RT_GPU_PATH_MAX, "%s/lib64/%s", dirs[d], names[i]);
    return n;
}

/* A library path that names something other than a regular file (a FIFO would block dlopen's
 * open for good, a directory fails obscurely): 1, with why it is refused in why. A bare name
 * (no '/') is the loader's to search, and a missing file is dlopen's to report. */
static int rt_dl_not_regular(const char *path, char *why, size_t cap) {
    struct stat sb;
    if (!strchr(path, '/') || stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return 0;
    snprintf(why, cap, "%s is %s, not a library", path, rt_file_kind(sb.st_mode));
    return 1;
}

/* dlopens the first candidate that loads, recording its name in path; else NULL and the first
 * failure's dlerror text (the most telling: the loader's own search) in first_error. */
static void *rt_open_first(char cand[][RT_GPU_PATH_MAX], int n, char *path, char *first_error, size_t cap) {
    first_error[0] = 0;
    for (int i = 0; i < n; i++) {
        char why[64];
        if (rt_dl_not_regular(cand[i], i == 0 ? first_error : why, i == 0 ? cap : sizeof why)) continue;
        void *lib = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(path, RT_GPU_PATH_MAX, "%s", cand[i]);
            return lib;
        }
        const char *e = dlerror();
        if (i == 0) snprintf(first_error, cap, "%s", e ? e : "unknown error");
    }
    return NULL;
}

static int rt_missing(char *why, size_t cap, const char *lib, const char *path, const char *sym, const char *hint) {
    snprintf(why, cap, "%s %s has no function %s (%s)", lib, path, sym, hint);
    return 0;
}

/* ---- each library's functions --------------------------------------------------------------- */

static int rt_open_driver(RtGpuApi *api, char *why, size_t cap) {
    const char *env = getenv("MBT_LIBCUDA");
    const char *name = env && *env ? env : "libcuda.so.1";
    char kind[RT_GPU_PATH_MAX + 64];
    int bad = rt_dl_not_regular(name, kind, sizeof kind);
    api->cuda_lib = bad ? NULL : dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!api->cuda_lib) {
        const char *e = bad ? kind : dlerror();
        snprintf(why, cap, "no CUDA driver (%s%s: %s)", env && *env ? "MBT_LIBCUDA=" : "",
                 env && *env ? name : "libcuda.so.1 on the loader's path", e ? e : "unknown error");
        return 0;
    }
    snprintf(api->cuda_path, sizeof api->cuda_path, "%s", name);
#define RT_LOAD(ret, fn, sym, args)                                                                                              \
    if (!(*(void **)&api->fn = dlsym(api->cuda_lib, sym)))                                                                       \
        return rt_missing(why, cap, "the CUDA driver", api->cuda_path, sym, "not a CUDA driver, or one older than CUDA 11");
    RT_CUDA_FUNCTIONS(RT_LOAD)
#undef RT_LOAD
    return 1;
}

static int rt_open_cublaslt(RtGpuApi *api, char *why, size_t cap) {
    static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    char cand[RT_MAX_CANDIDATES][RT_GPU_PATH_MAX], first[RT_GPU_PATH_MAX];
    const char *env = getenv("MBT_LIBCUBLASLT");
    int n = 1;
    if (env && *env) snprintf(cand[0], sizeof cand[0], "%s", env);
    else n = rt_candidates(cand, names, 3);
    api->lt_lib = rt_open_first(cand, n, api->lt_path, first, sizeof first);
    if (!api->lt_lib && env && *env) {
        snprintf(why, cap, "no cuBLASLt (MBT_LIBCUBLASLT=%s: %s)", env, first);
        return 0;
    }
    if (!api->lt_lib) {
        snprintf(why, cap,
                 "no cuBLASLt (looked for libcublasLt.so.13, .so.12 and .so on the loader's path, in $CUDA_HOME/lib64 "
                 "and /usr/local/cuda/lib64: %s)",
                 first);
        return 0;
    }
#define RT_LOAD(ret, fn, sym, args)                                                                                              \
    if (!(*(void **)&api->fn = dlsym(api->lt_lib, sym)))                                                                         \
        return rt_missing(why, cap, "cuBLASLt", api->lt_path, sym, "older than CUDA 11.4?");
    RT_CUBLASLT_FUNCTIONS(RT_LOAD)
#undef RT_LOAD
    return 1;
}

/* NCCL is optional: absent, or without its functions, it is simply not there. */
static void rt_open_nccl(RtGpuApi *api) {
    static const char *const names[] = {"libnccl.so.2"};
    char cand[RT_MAX_CANDIDATES][RT_GPU_PATH_MAX], first[RT_GPU_PATH_MAX];
    const char *env = getenv("MBT_LIBNCCL");
    int n = 1;
    if (env && *env) snprintf(cand[0], sizeof cand[0], "%s", env);
    else n = rt_candidates(cand, names, 1);
    api->nccl_lib = rt_open_first(cand, n, api->nccl_path, first, sizeof first);
    if (!api->nccl_lib) return;
    int ok = 1;
#define RT_LOAD(ret, fn, sym, args) ok = ok && (*(void **)&api->fn = dlsym(api->nccl_lib, sym)) != NULL;
    RT_NCCL_FUNCTIONS(RT_LOAD)
#undef RT_LOAD
    if (!ok) {
        dlclose(api->nccl_lib);
        api->nccl_lib = NULL;
        api->nccl_path[0] = 0;
    }
}

int rt_gpu_api_open(RtGpuApi *api, char *why, size_t cap) {
    memset(api, 0, sizeof *api);
    if (rt_open_driver(api, why, cap) && rt_open_cublaslt(api, why, cap)) {
        rt_open_nccl(api);
        return 1;
    }
    rt_gpu_api_close(api);
    return 0;
}

/* Once cuInit has run, the driver has threads of its own and cuBLASLt (which links the CUDA
 * runtime statically) has registered exit handlers: unloading either then can crash the process
 * later, so both stay loaded (a later open finds them again through dlopen's reference count). */
void rt_gpu_api_close(RtGpuApi *api) {
    if (api->nccl_lib) dlclose(api->nccl_lib);
    if (!api->initialized) {
        if (api->lt_lib) dlclose(api->lt_lib);
        if (api->cuda_lib) dlclose(api->cuda_lib);
    }
    memset(api, 0, sizeof *api);
}

/* ---- messages ------------------------------------------------------------------------------- */

/* Codes a stub or broken driver cannot name (its cuGetErrorName fails like every other call). */
static const struct {
    CUresult rc;
    const char *name, *text;
} rt_cuda_known_errors[] = {
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
};

void rt_gpu_error_text(const RtGpuApi *api, CUresult rc, const char **name, const char **text) {
    *name = NULL;
    *text = NULL;
    if (api->cuGetErrorName && api->cuGetErrorName(rc, name) != CUDA_SUCCESS) *name = NULL;
    if (api->cuGetErrorString && api->cuGetErrorString(rc, text) != CUDA_SUCCESS) *text = NULL;
    if (*name) return;
    for (size_t i = 0; i < sizeof rt_cuda_known_errors / sizeof rt_cuda_known_errors[0]; i++)
        if (rt_cuda_known_errors[i].rc == rc) {
            *name = rt_cuda_known_errors[i].name;
            *text = rt_cuda_known_errors[i].text;
        }
}

static RtStatus rt_gpu_vfail(RtError *err, RtStatus code, const char *call, const char *name, int rc, const char *text,
                             const char *what, va_list ap) {
    char w[RT_ERROR_MAX];
    vsnprintf(w, sizeof w, what, ap);
    if (!name) return rt_fail(err, code, "%s (%s): error %d", call, w, rc);
    return rt_fail(err, code, "%s (%s): %s%s%s", call, w, name, text ? ": " : "", text ? text : "");
}

RtStatus rt_cu_check(const RtGpuApi *api, CUresult rc, RtError *err, const char *call, const char *what, ...) {
    if (rc == CUDA_SUCCESS) return RT_OK;
    const char *name, *text;
    rt_gpu_error_text(api, rc, &name, &text);
    va_list ap;
    va_start(ap, what);
    RtStatus st =
        rt_gpu_vfail(err, rc == CUDA_ERROR_OUT_OF_MEMORY ? RT_ERR_NOMEM : RT_ERR_IO, call, name, (int)rc, text, what, ap);
    va_end(ap);
    return st;
}

RtStatus rt_lt_check(const RtGpuApi *api, cublasStatus_t rc, RtError *err, const char *call, const char *what, ...) {
    if (rc == CUBLAS_STATUS_SUCCESS) return RT_OK;
    va_list ap;
    va_start(ap, what);
    RtStatus st =
        rt_gpu_vfail(err, RT_ERR_IO, call, api->cublasLtGetStatusName(rc), (int)rc, api->cublasLtGetStatusString(rc), what, ap);
    va_end(ap);
    return st;
}

/* ---- for tests ------------------------------------------------------------------------------ */

#define RT_COUNT(ret, fn, sym, args) +1
enum {
    RT_N_CUDA_FUNCTIONS = 0 RT_CUDA_FUNCTIONS(RT_COUNT),
    RT_N_CUBLASLT_FUNCTIONS = 0 RT_CUBLASLT_FUNCTIONS(RT_COUNT),
};
#undef RT_COUNT

RtStatus rt_gpu_libraries(char *found, size_t cap, RtError *err) {
    RtGpuApi *api = calloc(1, sizeof *api);
    if (!api) return rt_fail(err, RT_ERR_NOMEM, "cannot look for the GPU libraries: out of memory");
    char why[RT_ERROR_MAX];
    if (!rt_gpu_api_open(api, why, sizeof why)) {
        free(api);
        return rt_fail(err, RT_ERR_NOTFOUND, "%s", why);
    }
    snprintf(found, cap, "CUDA driver %s (%d functions); cuBLASLt %s (%d functions); %s%s", api->cuda_path, RT_N_CUDA_FUNCTIONS,
             api->lt_path, RT_N_CUBLASLT_FUNCTIONS, api->nccl_lib ? "NCCL " : "no NCCL", api->nccl_path);
    rt_gpu_api_close(api);
    free(api);
    return RT_OK;
}
