/* nvrtc.c - NVRTC through dlopen (nvrtc.h): no link-time dependency on CUDA. The handful of
 * functions used are declared here with NVRTC's C ABI (nvrtcResult is an int enum, nvrtcProgram
 * an opaque pointer), as an X-macro that also loads them.
 *
 * Pipeline position: cuda -> [nvrtc] -> PTX, cubin, ptxas figures. */
#include "nvrtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL /* header-only, as in runtime/rt_file.c */
#include <xxhash.h>

typedef void *nvrtcProgram;

#define NVRTC_FUNCTIONS(X)                                                                                                       \
    X(const char *, nvrtcGetErrorString, (int))                                                                                  \
    X(int, nvrtcVersion, (int *, int *))                                                                                         \
    X(int, nvrtcCreateProgram, (nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *))      \
    X(int, nvrtcDestroyProgram, (nvrtcProgram *))                                                                                \
    X(int, nvrtcCompileProgram, (nvrtcProgram, int, const char *const *))                                                        \
    X(int, nvrtcGetProgramLogSize, (nvrtcProgram, size_t *))                                                                     \
    X(int, nvrtcGetProgramLog, (nvrtcProgram, char *))                                                                           \
    X(int, nvrtcGetPTXSize, (nvrtcProgram, size_t *))                                                                            \
    X(int, nvrtcGetPTX, (nvrtcProgram, char *))                                                                                  \
    X(int, nvrtcGetCUBINSize, (nvrtcProgram, size_t *))                                                                          \
    X(int, nvrtcGetCUBIN, (nvrtcProgram, char *))

struct Nvrtc {
    void *lib;
    const char *libpath; /* where it was found */
    const char *include; /* the CUDA include directory (cuda_fp16.h), or NULL */
#define NVRTC_FIELD(ret, name, args) ret(*name) args;
    NVRTC_FUNCTIONS(NVRTC_FIELD)
#undef NVRTC_FIELD
};

static int nvrtc_is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The include directory holding cuda_fp16.h: beside the library (LIBDIR/../include, also
 * LIBDIR/../../include for lib64/stubs-like layouts), $CUDA_HOME/include, /usr/local/cuda/include. */
static const char *nvrtc_find_include(Nvrtc *nv, Arena *ar) {
    Dl_info di;
    const char *cands[4] = {0};
    int n = 0;
    if (dladdr((void *)nv->nvrtcVersion, &di) && di.dli_fname) {
        char *dir = arena_printf(ar, "%s", di.dli_fname), *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            cands[n++] = arena_printf(ar, "%s/../include", dir);
        }
    }
    const char *home = getenv("CUDA_HOME");
    if (home && *home) cands[n++] = arena_printf(ar, "%s/include", home);
    cands[n++] = "/usr/local/cuda/include";
    for (int i = 0; i < n; i++)
        if (nvrtc_is_file(arena_printf(ar, "%s/cuda_fp16.h", cands[i]))) return cands[i];
    return NULL;
}

Nvrtc *nvrtc_open(Arena *ar, const char **why) {
    const char *home = getenv("CUDA_HOME");
    const char *names[6];
    int n = 0;
    names[n++] = "libnvrtc.so";
    names[n++] = "libnvrtc.so.13";
    names[n++] = "libnvrtc.so.12";
    if (home && *home) names[n++] = arena_printf(ar, "%s/lib64/libnvrtc.so", home);
    names[n++] = "/usr/local/cuda/lib64/libnvrtc.so";
    const char *tried = "";
    void *lib = NULL;
    const char *found = NULL;
    for (int i = 0; i < n && !lib; i++) {
        /* a path (not a bare name) that is not a regular file: a FIFO would block dlopen for good */
        struct stat sb;
        if (strchr(names[i], '/') && stat(names[i], &sb) == 0 && !S_ISREG(sb.st_mode)) {
            tried = arena_printf(ar, "%s%s%s: not a regular file", tried, *tried ? "; " : "", names[i]);
            continue;
        }
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) found = names[i];
        else tried = arena_printf(ar, "%s%s%s", tried, *tried ? "; " : "", dlerror());
    }
    if (!lib) {
        *why = arena_printf(ar,
                            "cannot load NVRTC (libnvrtc.so from the library path, $CUDA_HOME/lib64 or "
                            "/usr/local/cuda/lib64): %s",
                            tried);
        return NULL;
    }
    Nvrtc *nv = arena_alloc(ar, sizeof *nv);
    nv->lib = lib;
    nv->libpath = found;
#define NVRTC_LOAD(ret, name, args)                                                                                              \
    *(void **)(&nv->name) = dlsym(lib, #name);                                                                                   \
    if (!nv->name) {                                                                                                             \
        *why = arena_printf(ar, "NVRTC at %s has no function %s (too old?)", found, #name);                                      \
        dlclose(lib);                                                                                                            \
        return NULL;                                                                                                             \
    }
    NVRTC_FUNCTIONS(NVRTC_LOAD)
#undef NVRTC_LOAD
    nv->include = nvrtc_find_include(nv, ar);
    return nv;
}

const char *nvrtc_version(Nvrtc *nv, Arena *ar) {
    int major = 0, minor = 0;
    if (nv->nvrtcVersion(&major, &minor) != 0) return "unknown";
    return arena_printf(ar, "%d.%d", major, minor);
}

static double nvrtc_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *nvrtc_options_line(void) { return "-std=c++17 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xptxas -v"; }

/* One NVRTC compilation of source for `arch` (sm_XX or compute_XX). Returns the program (to be
 * destroyed by the caller) or NULL with *err. */
static nvrtcProgram nvrtc_run(Nvrtc *nv, const char *source, const char *name, const char *arch, const char **log, Arena *ar,
                              const char **err) {
    nvrtcProgram prog = NULL;
    int rc = nv->nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
    if (rc != 0) {
        *err = arena_printf(ar, "NVRTC cannot create a program for %s: %s", name, nv->nvrtcGetErrorString(rc));
        return NULL;
    }
    const char *opts[12];
    int n = 0;
    opts[n++] = arena_printf(ar, "--gpu-architecture=%s", arch);
    opts[n++] = "--std=c++17";
    opts[n++] = "--fmad=false";
    opts[n++] = "-ftz=false";
    opts[n++] = "-prec-div=true";
    opts[n++] = "-prec-sqrt=true";
    opts[n++] = "--ptxas-options=-v";
    if (nv->include) opts[n++] = arena_printf(ar, "-I%s", nv->include);
    rc = nv->nvrtcCompileProgram(prog, n, opts);
    size_t lsize = 0;
    char *text = NULL;
    if (nv->nvrtcGetProgramLogSize(prog, &lsize) == 0 && lsize) {
        text = arena_alloc(ar, lsize + 1);
        if (nv->nvrtcGetProgramLog(prog, text) != 0) text[0] = 0;
    }
    *log = text ? text : "";
    if (rc != 0) {
        *err = arena_printf(ar, "NVRTC cannot compile %s for %s: %s%s%s", name, arch, nv->nvrtcGetErrorString(rc),
                            **log ? "\n" : "", *log);
        nv->nvrtcDestroyProgram(&prog);
        return NULL;
    }
    return prog;
}

/* ---- the cache ----------------------------------------------------------------------------------
 * Each NVRTC output (a cubin with its log, or PTX) is kept in DIR/nvrtc/KEY.bin and KEY.log, KEY the
 * XXH3-128 of NVRTC's version, the target, the options and the source; DIR is $MBT_CACHE_DIR, else
 * $XDG_CACHE_HOME/mbt, else ~/.cache/mbt (the runtime's JIT cache's directory, rt_gpu.h). A file is
 * written under a temporary name and renamed, so a reader sees it whole or not at all; any failure
 * to read or write the cache only means compiling. MBT_CACHE_DIR=off turns it off. */

static const char *nvrtc_cache_dir(Arena *ar) {
    const char *d = getenv("MBT_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    const char *base = d && *d   ? d
                       : x && *x ? arena_printf(ar, "%s/mbt", x)
                       : h && *h ? arena_printf(ar, "%s/.cache/mbt", h)
                                 : NULL;
    if (!base || strcmp(base, "off") == 0) return NULL;
    const char *dir = arena_printf(ar, "%s/nvrtc", base);
    for (char *p = (char *)dir + 1; *p; p++) /* mkdir -p */
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0777);
            *p = '/';
        }
    return mkdir(dir, 0777) == 0 || errno == EEXIST ? dir : NULL;
}

static char *nvrtc_read_file(const char *path, size_t *size, Arena *ar) {
    /* A cache entry that is not a regular file (a FIFO would block fopen for good) is a miss. */
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *data = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) {
            data = arena_alloc(ar, (size_t)n + 1);
            if (fread(data, 1, (size_t)n, f) != (size_t)n) data = NULL;
            else data[n] = 0, *size = (size_t)n;
        }
    }
    fclose(f);
    return data;
}

static void nvrtc_write_file(const char *path, const char *data, size_t size, Arena *ar) {
    const char *tmp = arena_printf(ar, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) unlink(tmp);
}

/* One NVRTC output of source for `target` (sm_XX: the cubin; compute_XX: the PTX) and its log,
 * from the cache or compiled. Returns 0, or 1 with *err. */
static int nvrtc_output(Nvrtc *nv, const char *source, const char *name, const char *target, char **data, size_t *size,
                        const char **log, Arena *ar, const char **err) {
    int ptx = strncmp(target, "compute_", 8) == 0;
    const char *dir = nvrtc_cache_dir(ar), *path = NULL;
    if (dir) {
        XXH3_state_t *st = XXH3_createState();
        const char *head = arena_printf(ar, "mbt nvrtc 1\n%s\n%s\n%s -I%s\n", nvrtc_version(nv, ar), target, nvrtc_options_line(),
                                        nv->include ? nv->include : "");
        XXH3_128bits_reset(st);
        XXH3_128bits_update(st, head, strlen(head));
        XXH3_128bits_update(st, source, strlen(source));
        XXH128_hash_t hv = XXH3_128bits_digest(st);
        XXH3_freeState(st);
        path = arena_printf(ar, "%s/%016llx%016llx", dir, (unsigned long long)hv.high64, (unsigned long long)hv.low64);
        size_t lsize = 0;
        *data = nvrtc_read_file(arena_printf(ar, "%s.bin", path), size, ar);
        *log = *data ? nvrtc_read_file(arena_printf(ar, "%s.log", path), &lsize, ar) : NULL;
        if (*data && *log) return 0;
    }
    nvrtcProgram prog = nvrtc_run(nv, source, name, target, log, ar, err);
    if (!prog) return 1;
    int rc = ptx ? nv->nvrtcGetPTXSize(prog, size) : nv->nvrtcGetCUBINSize(prog, size);
    *data = rc == 0 ? arena_alloc(ar, *size + 1) : NULL;
    if (rc == 0) rc = ptx ? nv->nvrtcGetPTX(prog, *data) : nv->nvrtcGetCUBIN(prog, *data);
    nv->nvrtcDestroyProgram(&prog);
    if (rc != 0) {
        *err = arena_printf(ar, "NVRTC compiled %s for %s but returned no %s: %s", name, target, ptx ? "PTX" : "cubin",
                            nv->nvrtcGetErrorString(rc));
        return 1;
    }
    if (ptx) *size = strlen(*data); /* NVRTC's size counts the NUL */
    if (path) {                     /* the log last: an entry counts only when both are there */
        nvrtc_write_file(arena_printf(ar, "%s.bin", path), *data, *size, ar);
        nvrtc_write_file(arena_printf(ar, "%s.log", path), *log, strlen(*log), ar);
    }
    return 0;
}

int nvrtc_compile(Nvrtc *nv, const char *source, const char *name, const char *arch, int want_ptx, NvrtcResult *out, Arena *ar,
                  const char **err) {
    memset(out, 0, sizeof *out);
    out->arch = arch;
    if (strncmp(arch, "sm_", 3) != 0) {
        *err = arena_printf(ar, "'%s' is not a GPU architecture of the form sm_XX", arch);
        return 1;
    }
    double t0 = nvrtc_now_ms();
    char *cubin = NULL, *ptx = NULL;
    size_t size = 0, psize = 0;
    const char *log = NULL, *plog = NULL;
    if (nvrtc_output(nv, source, name, arch, &cubin, &size, &log, ar, err)) return 1;
    out->cubin = cubin;
    out->cubin_size = size;
    out->log = log;
    out->nkernels = nvrtc_parse_ptxas(log, &out->info, ar);
    if (want_ptx && nvrtc_output(nv, source, name, arena_printf(ar, "compute_%s", arch + 3), &ptx, &psize, &plog, ar, err))
        return 1;
    out->ptx = ptx;
    out->ms = nvrtc_now_ms() - t0;
    return 0;
}

/* ---- ptxas -v ------------------------------------------------------------------------------- */

/* The integer before `what` on the line [p, e), or -1. */
static int nvrtc_number_before(const char *p, const char *e, const char *what) {
    size_t wl = strlen(what);
    for (const char *q = p; q + wl <= e; q++) {
        if (memcmp(q, what, wl) != 0) continue;
        const char *d = q;
        while (d > p && d[-1] == ' ') d--;
        const char *s = d;
        while (s > p && s[-1] >= '0' && s[-1] <= '9') s--;
        if (s == d) return -1;
        return atoi(s);
    }
    return -1;
}

int nvrtc_parse_ptxas(const char *log, NvrtcKernelInfo **info, Arena *ar) {
    int n = 0, cap = 0;
    NvrtcKernelInfo *v = NULL, *cur = NULL;
    for (const char *p = log; p && *p;) {
        const char *e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        const char *fn = NULL;
        static const char entry[] = "Compiling entry function '";
        for (const char *q = p; q + sizeof entry - 1 <= e; q++)
            if (memcmp(q, entry, sizeof entry - 1) == 0) {
                fn = q + sizeof entry - 1;
                break;
            }
        if (fn) {
            const char *end = memchr(fn, '\'', (size_t)(e - fn));
            if (n == cap) {
                cap = cap ? 2 * cap : 32;
                NvrtcKernelInfo *nvv = arena_alloc(ar, sizeof *nvv * (size_t)cap);
                if (n) memcpy(nvv, v, sizeof *nvv * (size_t)n);
                v = nvv;
            }
            cur = &v[n++];
            memset(cur, 0, sizeof *cur);
            cur->name = arena_strndup(ar, fn, end ? (size_t)(end - fn) : (size_t)(e - fn));
        } else if (cur) {
            int x;
            if ((x = nvrtc_number_before(p, e, "bytes stack frame")) >= 0) cur->stack = x;
            if ((x = nvrtc_number_before(p, e, "bytes spill stores")) >= 0) cur->spill_stores = x;
            if ((x = nvrtc_number_before(p, e, "bytes spill loads")) >= 0) cur->spill_loads = x;
            if ((x = nvrtc_number_before(p, e, "registers")) >= 0) cur->registers = x;
            if ((x = nvrtc_number_before(p, e, "bytes smem")) >= 0) cur->shared = x;
        }
        p = *e ? e + 1 : e;
    }
    *info = v;
    return n;
}

const NvrtcKernelInfo *nvrtc_find(const NvrtcResult *r, const char *name) {
    for (int i = 0; i < r->nkernels; i++)
        if (strcmp(r->info[i].name, name) == 0) return &r->info[i];
    return NULL;
}
