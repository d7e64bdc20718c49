/* test_rt_gpu.c - unit tests of the GPU runtime (runtime/gpu*.c, rt_gpu.h) on a machine without a
 * GPU:
 *   - no driver (MBT_LIBCUDA naming a missing file), a library that is not a driver, the CUDA
 *     toolkit's stub driver (when installed): what --device auto and cuda say, and that the CPU
 *     and a program without CUDA never load a library;
 *   - the real cuBLASLt's and NCCL's functions resolving (when installed);
 *   - the JIT cache's directory and file names, byte sizes in messages, the per-name timing table
 *     and the Chrome trace writer (plain functions);
 *   - the whole path through build/tests/libmbt_fake_cuda.so (tests/cudaemu/fake_cuda.c, a CPU
 *     stand-in for the driver and cuBLASLt): module choice, the JIT cache (written, read back,
 *     replaced when damaged), error messages, memory, the runtime's kernels' parameters, GEMMs
 *     against the CPU's rt_sgemm_batched, plan caching, MBT_DEBUG timing and MBT_TRACE.
 * What the fake cannot show is that NVIDIA's libraries and kernels behave as it does; that needs
 * a GPU (docs/runtime.md, "The GPU").
 *
 * Build: make build/tests/test_rt_gpu (links build/libmbtrt.a; the fake library is built beside
 * it). Prints `PASS name` or `FAIL name: why` per case, then `N passed, M failed`; a case whose
 * library is not installed is not run, with a `note:` line saying so. */
#include <dlfcn.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "comm.h"
#include "fake_cuda.h"
#include "rt_gpu.h"
#include "unit.h"
#include "scratch.h"

#define STUB_DRIVER "/usr/local/cuda/lib64/stubs/libcuda.so"
#define HASH "xxh3-128:0123456789abcdef0123456789abcdef"

static char fake_path[PATH_MAX];      /* libmbt_fake_cuda.so beside this executable */
static char fake_nccl_path[PATH_MAX]; /* libmbt_fake_nccl.so beside it */
static void dir_make(void) { dir_make_tagged("gpu"); }

/* The whole file, NUL-terminated (NULL when it cannot be read); *n its size. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    int c;
    while ((c = fgetc(f)) != EOF) fputc(c, m);
    fclose(f);
    fclose(m);
    if (n) *n = len;
    return buf;
}

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int loaded(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- a program for the fake -------------------------------------------------------------------- */

#define NAMES "fake_fill7\nfake_fail\nmbt_rt_axpy\nmbt_rt_axpy_table\nmbt_rt_scale\nmbt_rt_sumsq_blocks\n"
static const char cubin[] = FAKE_CUBIN NAMES;
static const char ptx[] = FAKE_PTX NAMES;
static const char bad_ptx[] = "// not PTX\n";

static const RtGpuImage images[] = {
    {"sm_80", 0, (const unsigned char *)cubin, sizeof cubin},  {"compute_70", 1, (const unsigned char *)ptx, sizeof ptx},
    {"compute_75", 1, (const unsigned char *)ptx, sizeof ptx}, {"compute_100", 1, (const unsigned char *)ptx, sizeof ptx},
    {"sm_90a", 0, (const unsigned char *)cubin, sizeof cubin}, /* arch-specific: never chosen for sm_90 */
};

static const RtGpuKernel kernels[] = {
    {"fake_fill7", 64, 0, 2, 1},
    {"fake_fail", 128, 0, 96, 0},
};

static const RtGpuProgram program = {images, 5, kernels, 2, HASH, NULL, NULL, NULL, NULL, NULL, NULL};

/* Loads the fake as both libraries (the runtime's dlopen finds this same instance). No JIT cache
 * unless a case sets one (never the user's ~/.cache). */
static FakeControl *use_fake(void) {
    setenv("MBT_LIBCUDA", fake_path, 1);
    setenv("MBT_LIBCUBLASLT", fake_path, 1);
    setenv("MBT_LIBNCCL", fake_nccl_path, 1); /* never the machine's own NCCL on the fake driver */
    unsetenv("MBT_NCCL");
    unsetenv("MBT_DEBUG");
    unsetenv("MBT_TRACE");
    unsetenv("MBT_CACHE_DIR");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    void *h = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
    FakeControl *(*control)(void) = h ? (FakeControl * (*)(void)) dlsym(h, "fake_control") : NULL;
    if (!control) {
        printf("FAIL setup: cannot load %s: %s\n", fake_path, dlerror());
        exit(1);
    }
    return control();
}

static RtGpu *open_fake(const RtGpuProgram *p) {
    RtGpu *g = NULL;
    RtError e;
    rt_error_clear(&e);
    RtStatus st = rt_gpu_open(&g, p, RT_DEVICE_CUDA, NULL, &e);
    CHECK(st == RT_OK && g, "open on the fake: %s", e.msg);
    return g;
}

/* The module part of rt_gpu_describe: after "module: ", up to "; cuBLASLt". */
static const char *module_of(const RtGpu *g) {
    static char buf[1024];
    const char *d = rt_gpu_describe(g), *s = strstr(d, "module: "), *e = strstr(d, "; cuBLASLt");
    if (!s || !e) return d;
    snprintf(buf, sizeof buf, "%.*s", (int)(e - s - 8), s + 8);
    return buf;
}

/* ==== no driver, stubs, libraries ================================================================= */

static void no_driver(void) {
    setenv("MBT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    RtGpu *g = (RtGpu *)&g;
    const char *why = NULL;
    RtError e;
    rt_error_clear(&e);
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_AUTO, &why, &e) == RT_OK, "auto without a driver failed: %s", e.msg);
    CHECK(g == NULL, "auto without a driver returned a GPU");
    CHECK(e.code == RT_OK && e.msg[0] == 0, "auto filled the error: %s", e.msg);
    CHECK(why && strncmp(why, "no CUDA driver (MBT_LIBCUDA=/nonexistent/libcuda.so.1: /nonexistent/libcuda.so.1: ", 82) == 0,
          "why: %s", why ? why : "(null)");
    char auto_why[RT_ERROR_MAX];
    snprintf(auto_why, sizeof auto_why, "%s", why ? why : "");
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_CUDA, &why, &e) == RT_ERR_ARG, "cuda without a driver did not fail");
    CHECK(g == NULL, "cuda without a driver returned a GPU");
    CHECK_STR(e.msg, auto_why, "cuda's error is auto's reason");
    /* the loader's path: the default name */
    unsetenv("MBT_LIBCUDA");
    char found[1024];
    if (rt_gpu_libraries(found, sizeof found, &e) != RT_OK)
        CHECK(strncmp(e.msg, "no CUDA driver (libcuda.so.1 on the loader's path: ", 50) == 0 || strstr(e.msg, "cuBLASLt"),
              "default driver name: %s", e.msg);
}

/* The CPU and a program without CUDA: the driver library is never opened. */
static void cpu_loads_no_library(void) {
    setenv("MBT_LIBCUDA", fake_path, 1);
    setenv("MBT_LIBCUBLASLT", fake_path, 1);
    RtGpu *g = (RtGpu *)&g;
    const char *why = NULL;
    RtError e;
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_CPU, &why, &e) == RT_OK && g == NULL, "cpu: %s", e.msg);
    CHECK_STR(why, "the CPU was asked for", "cpu's reason");
    g = (RtGpu *)&g;
    CHECK(rt_gpu_open(&g, NULL, RT_DEVICE_AUTO, &why, &e) == RT_OK && g == NULL, "no program, auto: %s", e.msg);
    CHECK_STR(why, "the program was built without CUDA", "no program's reason");
    CHECK(rt_gpu_open(&g, NULL, RT_DEVICE_CUDA, &why, &e) == RT_ERR_ARG && g == NULL, "no program, cuda did not fail");
    CHECK_STR(e.msg, "the program was built without CUDA", "no program's error");
    CHECK(!loaded(fake_path), "the driver library was loaded for the CPU or a program without CUDA");
    /* the control: auto with a program does load it (and keeps it: cuInit ran) */
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_AUTO, &why, &e) == RT_OK && g, "auto on the fake: %s", e.msg);
    CHECK(loaded(fake_path), "auto did not load the driver library");
    rt_gpu_close(g);
}

static void not_a_driver(void) {
    setenv("MBT_LIBCUDA", "libm.so.6", 1);
    char found[1024];
    RtError e;
    CHECK(rt_gpu_libraries(found, sizeof found, &e) == RT_ERR_NOTFOUND, "libm accepted as a driver: %s", found);
    CHECK_STR(e.msg, "the CUDA driver libm.so.6 has no function cuGetErrorName (not a CUDA driver, or one older than CUDA 11)",
              "message");
    const char *why = NULL;
    RtGpu *g = NULL;
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_AUTO, &why, &e) == RT_OK && !g, "auto with libm: %s", e.msg);
    CHECK_STR(why, "the CUDA driver libm.so.6 has no function cuGetErrorName (not a CUDA driver, or one older than CUDA 11)",
              "auto's reason");
    setenv("MBT_LIBCUDA", fake_path, 1);
    setenv("MBT_LIBCUBLASLT", "libm.so.6", 1);
    CHECK(rt_gpu_libraries(found, sizeof found, &e) == RT_ERR_NOTFOUND, "libm accepted as cuBLASLt");
    CHECK_STR(e.msg, "cuBLASLt libm.so.6 has no function cublasLtCreate (older than CUDA 11.4?)", "cuBLASLt message");
    setenv("MBT_LIBCUBLASLT", "/nonexistent/libcublasLt.so", 1);
    CHECK(rt_gpu_libraries(found, sizeof found, &e) == RT_ERR_NOTFOUND, "a missing cuBLASLt accepted");
    CHECK(strncmp(e.msg, "no cuBLASLt (MBT_LIBCUBLASLT=/nonexistent/libcublasLt.so: /nonexistent/libcublasLt.so: ", 86) == 0,
          "missing cuBLASLt: %s", e.msg);
}

/* The toolkit's stub driver: every function resolves, cuInit says it is a stub. */
static void stub_driver(void) {
    setenv("MBT_LIBCUDA", STUB_DRIVER, 1);
    unsetenv("MBT_LIBCUBLASLT");
    char found[1024];
    RtError e;
    CHECK(rt_gpu_libraries(found, sizeof found, &e) == RT_OK, "libraries with the stub: %s", e.msg);
    CHECK(strncmp(found, "CUDA driver " STUB_DRIVER " (", strlen("CUDA driver " STUB_DRIVER " (")) == 0, "found: %s", found);
    const char *want = "no CUDA driver: cuInit (the CUDA driver " STUB_DRIVER "): CUDA_ERROR_STUB_LIBRARY: CUDA driver is a "
                       "stub library (the toolkit's stub for linking, not an installed NVIDIA driver)";
    RtGpu *g = NULL;
    const char *why = NULL;
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_AUTO, &why, &e) == RT_OK && !g, "auto with the stub: %s", e.msg);
    CHECK_STR(why, want, "auto's reason");
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_CUDA, &why, &e) == RT_ERR_ARG && !g, "cuda with the stub did not fail");
    CHECK_STR(e.msg, want, "cuda's error");
    CHECK(!loaded(STUB_DRIVER), "the stub stays loaded although cuInit failed");
}

/* The real cuBLASLt (and NCCL when there) resolve every function the runtime uses. */
static void real_cublaslt(void) {
    setenv("MBT_LIBCUDA", STUB_DRIVER, 1);
    unsetenv("MBT_LIBCUBLASLT");
    char found[1024];
    RtError e;
    CHECK(rt_gpu_libraries(found, sizeof found, &e) == RT_OK, "libraries: %s", e.msg);
    CHECK(strstr(found, "; cuBLASLt libcublasLt.so.1") || strstr(found, "; cuBLASLt /"), "cuBLASLt not named: %s", found);
    void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (nccl) CHECK(strstr(found, "; NCCL libnccl.so.2") != NULL, "NCCL not found: %s", found);
    else CHECK(strstr(found, "; no NCCL") != NULL, "NCCL claimed: %s", found);
}

/* ==== plain functions ============================================================================= */

static void cache_dir_rules(void) {
    setenv("MBT_CACHE_DIR", "/c/mbt-cache", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    setenv("HOME", "/home/u", 1);
    CHECK_STR(rt_gpu_cache_dir(), "/c/mbt-cache", "MBT_CACHE_DIR first");
    setenv("MBT_CACHE_DIR", "", 1);
    CHECK_STR(rt_gpu_cache_dir(), "/xdg/mbt", "an empty MBT_CACHE_DIR is unset; then XDG_CACHE_HOME/mbt");
    unsetenv("MBT_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    CHECK_STR(rt_gpu_cache_dir(), "/home/u/.cache/mbt", "a relative XDG_CACHE_HOME is ignored; then ~/.cache/mbt");
    unsetenv("XDG_CACHE_HOME");
    CHECK_STR(rt_gpu_cache_dir(), "/home/u/.cache/mbt", "HOME");
    unsetenv("HOME");
    CHECK(rt_gpu_cache_dir() == NULL, "no directory without any of them: %s", rt_gpu_cache_dir());
}

static void cache_file_names(void) {
    char buf[256];
    CHECK(rt_gpu_cache_file(buf, sizeof buf, "/c", HASH, 90, 12080) == 1, "fits");
    CHECK_STR(buf, "/c/xxh3-128-0123456789abcdef0123456789abcdef-sm_90-12080.cubin", "name");
    CHECK(rt_gpu_cache_file(buf, sizeof buf, "/c", "a/b c:d.e_f", 75, 13000) == 1, "fits");
    CHECK_STR(buf, "/c/a-b-c-d.e_f-sm_75-13000.cubin", "no separator or odd character survives");
    CHECK(rt_gpu_cache_file(buf, 20, "/c", HASH, 90, 12080) == 0, "a name that does not fit");
    CHECK(rt_gpu_cache_file(buf, 4, "/cache", "x", 90, 12080) == 0, "a directory that does not fit");
}

static void byte_sizes(void) {
    char b[32];
    CHECK_STR(rt_gpu_format_bytes(0, b), "0 B", "0");
    CHECK_STR(rt_gpu_format_bytes(1023, b), "1023 B", "1023");
    CHECK_STR(rt_gpu_format_bytes(1536, b), "1.5 KiB", "1536");
    CHECK_STR(rt_gpu_format_bytes((int64_t)32 << 20, b), "32.0 MiB", "32 MiB");
    CHECK_STR(rt_gpu_format_bytes(1288490189, b), "1.2 GiB", "1.2 GiB");
    CHECK_STR(rt_gpu_format_bytes((int64_t)3 << 40, b), "3.0 TiB", "3 TiB");
}

static void stats_sum_and_sort(void) {
    char a2[] = "k_a"; /* the same name in other storage: names are compared by content */
    RtGpuEvent ev[] = {
        {"k_a", 0, 10, 0}, {"sgemm NT 4x4x4", 10, 30, 0}, {a2, 40, 25, 0}, {"k_d", 65, 5, 0}, {"k_c", 70, 5, 0},
    };
    RtGpuStats s = {0};
    RtError e;
    CHECK(rt_gpu_stats_add(&s, ev, 5, &e) == RT_OK, "add: %s", e.msg);
    CHECK(s.n == 4, "%lld names, want 4", (long long)s.n);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    rt_gpu_stats_print(f, &s);
    fclose(f);
    CHECK_STR(text,
              "GPU time: 5 launches and GEMMs, 75.0 us\n"
              "kernel / GEMM                                      calls        total us       mean us   share\n"
              "k_a                                                    2            35.0         17.50   46.7%\n"
              "sgemm NT 4x4x4                                         1            30.0         30.00   40.0%\n"
              "k_c                                                    1             5.0          5.00    6.7%\n"
              "k_d                                                    1             5.0          5.00    6.7%\n",
              "table (longest first, ties by name)");
    free(text);
    /* after sorting, adding still finds each name */
    CHECK(rt_gpu_stats_add(&s, ev + 3, 1, &e) == RT_OK && s.n == 4, "re-add after sort made %lld names", (long long)s.n);
    rt_gpu_stats_sort(&s);
    CHECK(strcmp(s.items[2].name, "k_d") == 0 && s.items[2].calls == 2, "k_d: %s %lld", s.items[2].name,
          (long long)s.items[2].calls);
    rt_gpu_stats_free(&s);
}

/* The copy streams' events: each stream's total on its own line (never summed with the compute
 * stream's), rows by stream, each share of its own stream's total. */
static void stats_by_track(void) {
    RtGpuEvent ev[] = {
        {"k_a", 0, 30, RT_GPU_TRACK_COMPUTE},
        {"activations: copy to host", 0, 40, RT_GPU_TRACK_ACT},
        {"activations: the step waits for its copies", 30, 10, RT_GPU_TRACK_COMPUTE},
        {"activations: copy back", 50, 20, RT_GPU_TRACK_ACT},
        {"optimizer offload: gradient down", 80, 5, RT_GPU_TRACK_OPT},
        {"k_a", 90, 30, RT_GPU_TRACK_COMPUTE},
    };
    RtGpuStats s = {0};
    RtError e;
    CHECK(rt_gpu_stats_add(&s, ev, 6, &e) == RT_OK, "add: %s", e.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    rt_gpu_stats_print(f, &s);
    fclose(f);
    CHECK_STR(
        text,
        "GPU time: 3 launches, GEMMs and waits for the copy streams on the compute stream, 70.0 us\n"
        "GPU time: activations' copies: 2 copies on their own stream, 60.0 us (beside the compute stream's, not in its "
        "total)\n"
        "GPU time: optimizer's copies: 1 copies on their own stream, 5.0 us (beside the compute stream's, not in its total)\n"
        "kernel / GEMM                                      calls        total us       mean us   share\n"
        "k_a                                                    2            60.0         30.00   85.7%\n"
        "activations: the step waits for its copies             1            10.0         10.00   14.3%\n"
        "activations: copy to host                              1            40.0         40.00   66.7%\n"
        "activations: copy back                                 1            20.0         20.00   33.3%\n"
        "optimizer offload: gradient down                       1             5.0          5.00  100.0%\n",
        "table by stream");
    free(text);
    CHECK_STR(rt_gpu_track_name(RT_GPU_TRACK_OPT), "optimizer's copies", "track name");
    rt_gpu_stats_free(&s);
}

static void stats_many_names(void) {
    enum { N = 1000 };
    static char names[N][16];
    static RtGpuEvent ev[2 * N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "k%d", i);
        ev[2 * i] = (RtGpuEvent){names[i], 0, (double)i, 0};
        ev[2 * i + 1] = (RtGpuEvent){names[i], 0, 1, 0};
    }
    RtGpuStats s = {0};
    RtError e;
    CHECK(rt_gpu_stats_add(&s, ev, 2 * N, &e) == RT_OK, "add: %s", e.msg);
    CHECK(s.n == N, "%lld names, want %d", (long long)s.n, N);
    rt_gpu_stats_sort(&s);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        const RtGpuStat *t = &s.items[i];
        char want[16];
        snprintf(want, sizeof want, "k%d", N - 1 - i);
        ok = ok && strcmp(t->name, want) == 0 && t->calls == 2 && t->total_us == (double)(N - 1 - i) + 1;
    }
    CHECK(ok, "1000 names are not each summed and sorted");
    rt_gpu_stats_free(&s);
}

static void trace_json(void) {
    dir_make();
    /* the compute stream and the optimizer's copy stream: their tracks named first (not the
     * activations', which has no event) */
    RtGpuEvent ev[] = {
        {"k_a", 0, 12.5, RT_GPU_TRACK_COMPUTE},
        {"sgemm NT 128x768x3072 x12", 12.5, 1000.25, RT_GPU_TRACK_COMPUTE},
        {"odd \"name\"\\\n", 2000, 0.001, RT_GPU_TRACK_OPT},
    };
    RtError e;
    CHECK(rt_gpu_trace_write(at("t.json"), ev, 3, &e) == RT_OK, "write: %s", e.msg);
    size_t n = 0;
    char *text = slurp(at("t.json"), &n);
    CHECK_STR(text,
              "{\"traceEvents\":[\n"
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,\"args\":{\"name\":\"optimizer's copies\"}},\n"
              "{\"name\":\"k_a\",\"ph\":\"X\",\"ts\":0.0,\"dur\":12.5,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"sgemm NT 128x768x3072 x12\",\"ph\":\"X\",\"ts\":12.5,\"dur\":1000.25,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"odd \\\"name\\\"\\\\\\n\",\"ph\":\"X\",\"ts\":2000.0,\"dur\":0.001,\"pid\":0,\"tid\":2}\n"
              "]}\n",
              "trace");
    json_t *doc = NULL;
    CHECK(text && rt_json_parse(&doc, text, n, 0, "trace", &e) == RT_OK, "trace does not parse: %s", e.msg);
    if (doc) {
        const json_t *list = rt_json_get(doc, "traceEvents");
        CHECK(json_is_array(list) && json_array_size(list) == 5, "traceEvents is not 2 names and 3 events");
        if (json_array_size(list) == 5) {
            double ts = 0, dur = 0;
            int64_t tid = -1;
            CHECK_STR(rt_json_str(rt_json_get(json_array_get(list, 4), "name")), "odd \"name\"\\\n", "escaped name round trip");
            CHECK(rt_json_f64(rt_json_get(json_array_get(list, 3), "ts"), &ts) && ts == 12.5, "ts %g", ts);
            CHECK(rt_json_f64(rt_json_get(json_array_get(list, 3), "dur"), &dur) && dur == 1000.25, "dur %g", dur);
            CHECK(rt_json_i64(rt_json_get(json_array_get(list, 4), "tid"), &tid) && tid == 2, "tid %lld", (long long)tid);
            CHECK_STR(rt_json_str(rt_json_get(json_array_get(list, 2), "ph")), "X", "ph");
            CHECK_STR(rt_json_str(rt_json_get(json_array_get(list, 1), "ph")), "M", "metadata ph");
            CHECK_STR(rt_json_str(rt_json_get(rt_json_get(json_array_get(list, 1), "args"), "name")), "optimizer's copies",
                      "track name");
        }
        json_decref(doc);
    }
    free(text);
    /* no events: still a valid trace */
    CHECK(rt_gpu_trace_write(at("empty.json"), NULL, 0, &e) == RT_OK, "empty: %s", e.msg);
    text = slurp(at("empty.json"), NULL);
    CHECK_STR(text, "{\"traceEvents\":[\n\n]}\n", "empty trace");
    free(text);
    CHECK(rt_gpu_trace_write(at("no/such/dir/t.json"), ev, 3, &e) == RT_ERR_IO, "writing into a missing directory");
    CHECK(strncmp(e.msg, "cannot create GPU trace '", 25) == 0, "message: %s", e.msg);
    dir_remove();
}

/* ==== the whole path, on the fake ================================================================== */

static void fake_cubin_module(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    const char *d = rt_gpu_describe(g);
    const char *want = "Fake GPU, sm_80, 4 SMs, 16.0 GiB; driver 12.8; module: cubin sm_80; cuBLASLt 13.0.1; ";
    CHECK(strncmp(d, want, strlen(want)) == 0, "describe: %s", d);
    CHECK(strcmp(d + strlen(want), "no NCCL") == 0 || strncmp(d + strlen(want), "NCCL ", 5) == 0, "describe: %s", d);
    CHECK(rt_gpu_arch(g) == 80, "arch %d", rt_gpu_arch(g));
    CHECK(fake->links == 0, "a cubin was JIT-compiled");
    rt_gpu_close(g);
    CHECK(fake->live_allocs == 0, "%d device allocations left after close", fake->live_allocs);
}

static void fake_ptx_and_cache(void) {
    FakeControl *fake = use_fake();
    dir_make();
    setenv("MBT_CACHE_DIR", at("cache/sub"), 1); /* not there yet: created */
    fake->major = 9;
    RtGpu *g = open_fake(&program);
    if (!g) return;
    CHECK_STR(module_of(g), "PTX compute_75, JIT-compiled for sm_90, saved in the cache",
              "first run (sm_90a and compute_100 not taken)");
    rt_gpu_close(g);
    char path[PATH_MAX];
    rt_gpu_cache_file(path, sizeof path, at("cache/sub"), HASH, 90, 12080);
    size_t n = 0;
    char *text = slurp(path, &n);
    CHECK(text && n == sizeof cubin && memcmp(text, cubin, n) == 0, "cache file %s: %zu bytes", path, n);
    free(text);
    CHECK(fake->links == 1, "%d compilations", fake->links);

    g = open_fake(&program);
    CHECK_STR(module_of(g), "PTX compute_75, JIT-compiled for sm_90, from the cache", "second run");
    CHECK(fake->links == 1, "compiled again although cached (%d)", fake->links);
    rt_gpu_close(g);

    spit(path, "damaged cache file");
    g = open_fake(&program);
    char want[3 * PATH_MAX];
    snprintf(want, sizeof want,
             "PTX compute_75, JIT-compiled for sm_90, the cached cubin did not load (cuModuleLoadDataEx (%s): "
             "CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid (log: fake: not a fake cubin second line)), saved in "
             "the cache",
             path);
    CHECK_STR(module_of(g), want, "damaged cache");
    CHECK(fake->links == 2, "%d compilations", fake->links);
    rt_gpu_close(g);
    text = slurp(path, &n);
    CHECK(text && n == sizeof cubin && memcmp(text, cubin, n) == 0, "the damaged file was not replaced");
    free(text);

    unsetenv("MBT_CACHE_DIR");
    g = open_fake(&program);
    CHECK_STR(module_of(g), "PTX compute_75, JIT-compiled for sm_90, not cached: no cache directory (set MBT_CACHE_DIR or HOME)",
              "no cache directory");
    rt_gpu_close(g);
    /* an unwritable cache costs the cache, not the run */
    spit(at("file"), "x");
    setenv("MBT_CACHE_DIR", at("file/cache"), 1);
    g = open_fake(&program);
    snprintf(want, sizeof want,
             "PTX compute_75, JIT-compiled for sm_90, not cached: cannot create the JIT cache directory '%s': Not a directory",
             at("file/cache"));
    CHECK_STR(module_of(g), want, "unwritable cache");
    rt_gpu_close(g);
    dir_remove();
}

static void fake_no_image(void) {
    FakeControl *fake = use_fake();
    fake->major = 7;
    const RtGpuImage two[] = {images[0], images[2]};
    const RtGpuProgram p = {two, 2, kernels, 2, HASH, NULL, NULL, NULL, NULL, NULL, NULL};
    RtGpu *g = NULL;
    const char *why = NULL;
    RtError e;
    CHECK(rt_gpu_open(&g, &p, RT_DEVICE_AUTO, &why, &e) == RT_OK && !g, "auto: %s", e.msg);
    CHECK_STR(why, "the program's CUDA module has no image for this GPU's sm_70 (it has sm_80, compute_75)", "why");
    CHECK(rt_gpu_open(&g, &p, RT_DEVICE_CUDA, &why, &e) == RT_ERR_ARG && !g, "cuda did not fail");
    CHECK_STR(e.msg, "the program's CUDA module has no image for this GPU's sm_70 (it has sm_80, compute_75)", "error");
    /* sm_90a is that GPU's alone: sm_90 takes the PTX */
    fake->major = 9;
    const RtGpuImage arch_specific[] = {images[4], images[1]};
    const RtGpuProgram q = {arch_specific, 2, kernels, 2, HASH, NULL, NULL, NULL, NULL, NULL, NULL};
    g = open_fake(&q);
    if (g) CHECK(strncmp(module_of(g), "PTX compute_70, JIT-compiled for sm_90", 38) == 0, "module: %s", module_of(g));
    rt_gpu_close(g);
}

static void fake_open_errors(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = NULL;
    const char *why = NULL;
    RtError e;
    char want[PATH_MAX + 256];
    fake->init_result = 100;
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_AUTO, &why, &e) == RT_OK && !g, "auto: %s", e.msg);
    snprintf(want, sizeof want,
             "no CUDA device: cuInit (the CUDA driver %s): CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected", fake_path);
    CHECK_STR(why, want, "cuInit's error");
    fake->init_result = 0;
    fake->devices = 0;
    setenv("CUDA_VISIBLE_DEVICES", "7", 1);
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_AUTO, &why, &e) == RT_OK && !g, "auto: %s", e.msg);
    CHECK_STR(why, "no CUDA device (the driver sees none; CUDA_VISIBLE_DEVICES='7')", "no device");
    fake->devices = 1;
    unsetenv("CUDA_VISIBLE_DEVICES");

    /* after the device is found usable, failures are errors even for auto */
    const RtGpuKernel missing[] = {{"fake_fill7", 64, 0, 2, 1}, {"nosuch", 32, 0, 1, 2}};
    RtGpuProgram p = program;
    p.kernels = missing;
    CHECK(rt_gpu_open(&g, &p, RT_DEVICE_AUTO, &why, &e) == RT_ERR_IO && !g, "missing function accepted");
    CHECK_STR(e.msg, "cuModuleGetFunction (the program's kernel 1, nosuch): CUDA_ERROR_NOT_FOUND: named symbol not found",
              "missing function");
    static const char no_scale[] = FAKE_CUBIN "fake_fill7\nfake_fail\nmbt_rt_axpy\nmbt_rt_axpy_table\nmbt_rt_sumsq_blocks\n";
    const RtGpuImage lacking[] = {{"sm_80", 0, (const unsigned char *)no_scale, sizeof no_scale}};
    p = program;
    p.images = lacking;
    p.nimages = 1;
    CHECK(rt_gpu_open(&g, &p, RT_DEVICE_CUDA, &why, &e) == RT_ERR_IO && !g, "missing runtime kernel accepted");
    CHECK_STR(e.msg,
              "cuModuleGetFunction (the runtime's kernel mbt_rt_scale, which mbtc appends to every program's CUDA source): "
              "CUDA_ERROR_NOT_FOUND: named symbol not found",
              "missing runtime kernel");
    const RtGpuKernel huge[] = {{"fake_fill7", 2048, 0, 2, 1}};
    p = program;
    p.kernels = huge;
    p.nkernels = 1;
    CHECK(rt_gpu_open(&g, &p, RT_DEVICE_CUDA, &why, &e) == RT_ERR_ARG && !g, "a 2048-thread block accepted");
    CHECK_STR(e.msg,
              "the program's kernel 0 (fake_fill7) cannot be launched: 2 blocks of 2048 threads, 1 buffers (at most "
              "2147483647 blocks of 1024 threads, 512 buffers)",
              "geometry");
    const RtGpuImage bad[] = {{"compute_80", 1, (const unsigned char *)bad_ptx, sizeof bad_ptx}};
    p = program;
    p.images = bad;
    p.nimages = 1;
    CHECK(rt_gpu_open(&g, &p, RT_DEVICE_CUDA, &why, &e) == RT_ERR_IO && !g, "bad PTX accepted");
    CHECK_STR(e.msg,
              "cuLinkAddData (JIT-compiling the PTX for compute_80 to sm_80): CUDA_ERROR_INVALID_PTX: a PTX JIT "
              "compilation failed (log: fake ptxas: not fake PTX)",
              "bad PTX");
    CHECK(fake->live_allocs == 0, "%d device allocations left after failed opens", fake->live_allocs);
}

static void fake_memory_and_kernels(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    RtError e;
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)(i % 17) - 8.0f;
    void *x = NULL, *y = NULL;
    CHECK(rt_gpu_alloc(g, &x, N * sizeof(float), "x", &e) == RT_OK && x, "alloc x: %s", e.msg);
    CHECK(rt_gpu_alloc(g, &y, 200 * sizeof(float), "y", &e) == RT_OK && y, "alloc y: %s", e.msg);
    if (!x || !y) return;
    CHECK(rt_gpu_upload(g, x, host, sizeof host, &e) == RT_OK, "upload: %s", e.msg);

    void *bufs[] = {y};
    CHECK(rt_gpu_launch(g, 0, bufs, &e) == RT_OK, "launch: %s", e.msg);
    CHECK(strcmp(fake->last_kernel, "fake_fill7") == 0 && fake->last_grid[0] == 2 && fake->last_grid[1] == 1 &&
              fake->last_block == 64,
          "launched %s with %u x %u blocks of %u", fake->last_kernel, fake->last_grid[0], fake->last_grid[1], fake->last_block);
    CHECK(rt_gpu_download(g, back, y, 200 * sizeof(float), &e) == RT_OK, "download: %s", e.msg);
    CHECK(back[0] == 7 && back[127] == 7 && back[128] == 0 && back[199] == 0, "fill7 or zeroing: %g %g %g %g", back[0], back[127],
          back[128], back[199]);

    CHECK(rt_gpu_axpy(g, y, x, 0.5f, 200, &e) == RT_OK, "axpy: %s", e.msg);
    CHECK(rt_gpu_scale(g, y, 2.0f, 200, &e) == RT_OK, "scale: %s", e.msg);
    CHECK(rt_gpu_download(g, back, y, 200 * sizeof(float), &e) == RT_OK, "download: %s", e.msg);
    int ok = 1;
    for (int i = 0; i < 200; i++) ok = ok && back[i] == ((i < 128 ? 7.0f : 0.0f) + 0.5f * host[i]) * 2.0f;
    CHECK(ok, "axpy then scale gave wrong values");

    /* the batched axpy: two entries into y (disjoint), each as rt_gpu_axpy computes it; a length 0
     * entry does nothing; the same table again is not uploaded again */
    CHECK(rt_gpu_zero(g, y, 200 * sizeof(float), &e) == RT_OK, "zero: %s", e.msg);
    int64_t table[9] = {(int64_t)(uintptr_t)y,
                        (int64_t)(uintptr_t)x,
                        150,
                        (int64_t)(uintptr_t)((float *)y + 150),
                        (int64_t)(uintptr_t)((float *)x + 7),
                        50,
                        (int64_t)(uintptr_t)y,
                        (int64_t)(uintptr_t)x,
                        0};
    long long up0 = fake->htod_bytes;
    CHECK(rt_gpu_axpy_table(g, table, 3, 0.25f, &e) == RT_OK, "axpy table: %s", e.msg);
    CHECK(fake->htod_bytes - up0 == (long long)sizeof table, "the table's upload: %lld bytes", fake->htod_bytes - up0);
    CHECK(strcmp(fake->last_kernel, "mbt_rt_axpy_table") == 0 && fake->last_grid[1] == 3, "launched %s, %u rows",
          fake->last_kernel, fake->last_grid[1]);
    CHECK(rt_gpu_axpy_table(g, table, 3, 0.25f, &e) == RT_OK, "axpy table again: %s", e.msg);
    CHECK(fake->htod_bytes - up0 == (long long)sizeof table, "the same table uploaded twice");
    CHECK(rt_gpu_download(g, back, y, 200 * sizeof(float), &e) == RT_OK, "download: %s", e.msg);
    ok = 1;
    for (int i = 0; i < 200; i++) {
        float v = 0.25f * host[i < 150 ? i : i - 150 + 7];
        ok = ok && back[i] == v + v;
    }
    CHECK(ok, "axpy table gave wrong values");
    table[5] = -1;
    CHECK(rt_gpu_axpy_table(g, table, 2, 1.0f, &e) == RT_ERR_ARG && strstr(e.msg, "entry 1 has negative length"), "%s", e.msg);

    double partial[4] = {0}, want[4] = {0};
    for (int i = 0; i < N; i++) want[i / 300] += (double)host[i] * host[i];
    CHECK(rt_gpu_sumsq_blocks(g, x, N, 300, partial, &e) == RT_OK, "sumsq: %s", e.msg);
    CHECK(fake->last_block == 256, "sumsq launched with %u threads", fake->last_block);
    CHECK(memcmp(partial, want, sizeof want) == 0, "partials %g %g %g %g, want %g %g %g %g", partial[0], partial[1], partial[2],
          partial[3], want[0], want[1], want[2], want[3]);

    CHECK(rt_gpu_copy(g, y, x, 200 * sizeof(float), &e) == RT_OK, "copy: %s", e.msg);
    CHECK(rt_gpu_download(g, back, y, 200 * sizeof(float), &e) == RT_OK && memcmp(back, host, 200 * sizeof(float)) == 0,
          "copy: %s", e.msg);
    CHECK(rt_gpu_zero(g, y, 200 * sizeof(float), &e) == RT_OK, "zero: %s", e.msg);
    CHECK(rt_gpu_download(g, back, y, 200 * sizeof(float), &e) == RT_OK && back[0] == 0 && back[199] == 0, "zero");
    CHECK(rt_gpu_sync(g, "the test", &e) == RT_OK, "sync: %s", e.msg);

    /* rt_gpu_loss: NaN until a wait; more than RT_GPU_LOSSES queued: the first ones are handed
     * over by the wait the next one makes */
    double losses[RT_GPU_LOSSES + 6];
    int nan_before = 1, fine = 1;
    for (int i = 0; i < RT_GPU_LOSSES + 6; i++) {
        CHECK(rt_gpu_loss(g, &losses[i], (const float *)x + i, &e) == RT_OK, "loss %d: %s", i, e.msg);
        nan_before &= isnan(losses[i]);
    }
    CHECK(nan_before, "a queued loss was set before a wait");
    for (int i = 0; i < RT_GPU_LOSSES; i++) fine &= losses[i] == host[i];
    CHECK(fine, "the %d losses queued first were not handed over when the %dth waited", RT_GPU_LOSSES, RT_GPU_LOSSES + 1);
    CHECK(isnan(losses[RT_GPU_LOSSES + 5]), "the last loss was set before a wait");
    CHECK(rt_gpu_sync(g, "the losses", &e) == RT_OK, "sync: %s", e.msg);
    for (int i = 0; i < RT_GPU_LOSSES + 6; i++) fine &= losses[i] == host[i];
    CHECK(fine, "rt_gpu_sync did not hand over every loss");

    void *pinned = NULL;
    CHECK(rt_gpu_host_alloc(g, &pinned, 4096, "staging", &e) == RT_OK && pinned && ((char *)pinned)[4095] == 0, "host alloc: %s",
          e.msg);
    rt_gpu_host_free(g, pinned);

    /* errors */
    fake->oom_above = (size_t)1 << 30;
    void *big = NULL;
    CHECK(rt_gpu_alloc(g, &big, 1288490189, "the activation arena", &e) == RT_ERR_NOMEM && !big, "oom accepted");
    CHECK_STR(e.msg, "cuMemAlloc (the activation arena, 1.2 GiB): CUDA_ERROR_OUT_OF_MEMORY: out of memory", "oom message");
    CHECK(rt_gpu_launch(g, 1, NULL, &e) == RT_ERR_IO, "failing launch accepted");
    CHECK_STR(e.msg,
              "cuLaunchKernel (fake_fail, 96 blocks of 128 threads): CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many "
              "resources requested for launch",
              "launch message");
    CHECK(rt_gpu_launch(g, 2, bufs, &e) == RT_ERR_ARG, "kernel 2 of 2 accepted");
    CHECK_STR(e.msg, "rt_gpu_launch: kernel 2 is not in the program's table of 2", "index message");
    CHECK(rt_gpu_alloc(g, &big, 0, "nothing", &e) == RT_OK && !big, "a zero-byte allocation");

    rt_gpu_free(g, x);
    rt_gpu_free(g, y);
    rt_gpu_close(g);
    CHECK(fake->live_allocs == 0, "%d device allocations left after close", fake->live_allocs);
}

/* ---- GEMMs against the CPU -------------------------------------------------------------------- */

typedef struct Gemm {
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
    float alpha, beta;
    int bias; /* 1: RT_GEMM_BIAS; 2: RT_GEMM_BGRAD_B; 3: RT_GEMM_ADD (a matrix D laid out as C) */
} Gemm;

static int64_t extent(int64_t rows, int64_t ld, int64_t stride, int64_t batch) { return (batch - 1) * stride + rows * ld; }

/* Runs q on the CPU and on the fake from the same inputs (C starts as NaN where c_nan, else
 * values, with padding) and compares every element of C, padding included. */
static void gemm_compare(RtGpu *g, const Gemm *q, int c_nan, const char *label) {
    int64_t na = extent(q->ta ? q->k : q->m, q->lda, q->sa, q->batch);
    int64_t nb = extent(q->tb ? q->n : q->k, q->ldb, q->sb, q->batch);
    int64_t nc = extent(q->m, q->ldc, q->sc, q->batch);
    float *a = malloc((size_t)(na + 1) * sizeof *a), *b = malloc((size_t)nb * sizeof *b);
    float *c_cpu = malloc((size_t)nc * sizeof *c_cpu), *c_gpu = malloc((size_t)nc * sizeof *c_gpu);
    float *v = malloc((size_t)q->n * sizeof *v), *v_gpu = malloc((size_t)q->n * sizeof *v);
    for (int64_t i = 0; i < q->n; i++) v[i] = (float)i / 2 - 1;
    int32_t ep = q->bias == 1 ? RT_GEMM_BIAS : q->bias == 2 ? RT_GEMM_BGRAD_B : q->bias == 3 ? RT_GEMM_ADD : RT_GEMM_PLAIN;
    float *dm = malloc((size_t)nc * sizeof *dm); /* RT_GEMM_ADD's matrix */
    for (int64_t i = 0; i < nc; i++) dm[i] = (float)((i * 3) % 7) / 2 - 1.5f;
    for (int64_t i = 0; i < na + 1; i++) a[i] = (float)((i * 7) % 11) / 4 - 1;
    for (int64_t i = 0; i < nb; i++) b[i] = (float)((i * 5) % 13) / 8 - 0.5f;
    for (int64_t i = 0; i < nc; i++) c_cpu[i] = c_nan ? NAN : (float)(i % 3) + 0.25f;
    memcpy(c_gpu, c_cpu, (size_t)nc * sizeof *c_cpu);
    RtError e;
    CHECK(rt_sgemm_batched(NULL, q->ta, q->tb, q->m, q->n, q->k, q->alpha, a, q->lda, q->sa, b, q->ldb, q->sb, q->beta, c_cpu,
                           q->ldc, q->sc, q->batch, ep,
                           q->bias == 3 ? dm
                           : q->bias    ? v
                                        : NULL,
                           &e) == RT_OK,
          "%s: cpu: %s", label, e.msg);
    void *da = NULL, *db = NULL, *dc = NULL, *dv = NULL, *ddm = NULL;
    rt_gpu_alloc(g, &ddm, nc * (int64_t)sizeof *dm, "add", &e);
    rt_gpu_upload(g, ddm, dm, nc * (int64_t)sizeof *dm, &e);
    rt_gpu_alloc(g, &dv, q->n * (int64_t)sizeof *v, "bias", &e);
    rt_gpu_upload(g, dv, v, q->n * (int64_t)sizeof *v, &e);
    rt_gpu_alloc(g, &da, (na + 1) * (int64_t)sizeof *a, "a", &e);
    rt_gpu_alloc(g, &db, nb * (int64_t)sizeof *b, "b", &e);
    rt_gpu_alloc(g, &dc, nc * (int64_t)sizeof *c_gpu, "c", &e);
    rt_gpu_upload(g, da, a, (na + 1) * (int64_t)sizeof *a, &e);
    rt_gpu_upload(g, db, b, nb * (int64_t)sizeof *b, &e);
    rt_gpu_upload(g, dc, c_gpu, nc * (int64_t)sizeof *c_gpu, &e);
    CHECK(rt_gpu_sgemm_batched(g, q->ta, q->tb, q->m, q->n, q->k, q->alpha, da, q->lda, q->sa, db, q->ldb, q->sb, q->beta, dc,
                               q->ldc, q->sc, q->batch, ep,
                               q->bias == 3 ? ddm
                               : q->bias    ? dv
                                            : NULL,
                               &e) == RT_OK,
          "%s: gpu: %s", label, e.msg);
    rt_gpu_download(g, c_gpu, dc, nc * (int64_t)sizeof *c_gpu, &e);
    rt_gpu_download(g, v_gpu, dv, q->n * (int64_t)sizeof *v, &e);
    for (int64_t i = 0; q->bias == 2 && i < q->n; i++) /* the column sums: the same f32 sums over k */
        CHECK(fabsf(v[i] - v_gpu[i]) <= 1e-5f * (fabsf(v[i]) > 1 ? fabsf(v[i]) : 1), "%s: column sum %lld: %g, want %g", label,
              (long long)i, (double)v_gpu[i], (double)v[i]);
    double worst = 0;
    int64_t bad = -1;
    for (int64_t i = 0; i < nc; i++) {
        double x = c_cpu[i], y = c_gpu[i];
        if (isnan(x) || isnan(y)) {
            if (isnan(x) != isnan(y)) bad = i;
            continue;
        }
        double d = fabs(x - y) / (fabs(x) > 1 ? fabs(x) : 1);
        if (d > worst) worst = d;
    }
    CHECK(bad < 0 && worst < 1e-5, "%s: C differs from the CPU's (NaN mismatch at %lld, worst relative difference %g)", label,
          (long long)bad, worst);
    rt_gpu_free(g, da);
    rt_gpu_free(g, db);
    rt_gpu_free(g, dc);
    rt_gpu_free(g, dv);
    rt_gpu_free(g, ddm);
    free(a), free(b), free(c_cpu), free(c_gpu), free(v), free(v_gpu), free(dm);
}

static void fake_gemm_matches_cpu(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    char label[128];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t m = 5, n = 7, k = 3, lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
            Gemm one = {ta, tb, m, n, k, lda, ldb, ldc, 0, 0, 0, 1, 1.5f, 0.5f, 0};
            snprintf(label, sizeof label, "%c%c one", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &one, 0, label);
            int64_t sa = (ta ? k : m) * lda + 4, sb = (tb ? n : k) * ldb + 2, sc = m * ldc + 5;
            Gemm batched = {ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, 3, 1.0f, 0.0f, 0};
            snprintf(label, sizeof label, "%c%c batched, beta 0 over NaN", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &batched, 1, label);
            Gemm broadcast = batched;
            broadcast.sb = 0;
            broadcast.beta = -1.0f;
            snprintf(label, sizeof label, "%c%c batched, B broadcast", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &broadcast, 0, label);
            /* the bias epilogue: cuBLASLt's vector along its D's rows is our per-column bias */
            one.bias = batched.bias = 1;
            snprintf(label, sizeof label, "%c%c one, bias", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &one, 0, label);
            snprintf(label, sizeof label, "%c%c batched, bias, beta 0 over NaN", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &batched, 1, label);
            /* the add epilogue (fused LoRA): cuBLASLt's C input is the matrix, its D our C, beta 1 */
            Gemm add1 = one, addb = batched;
            add1.beta = addb.beta = 0.0f;
            add1.bias = addb.bias = 3;
            snprintf(label, sizeof label, "%c%c one, add", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &add1, 1, label);
            snprintf(label, sizeof label, "%c%c batched, add over NaN", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &addb, 1, label);
            /* the bias gradient: with cuBLASLt's epilogue, and as a second product where it has none */
            one.bias = 2;
            snprintf(label, sizeof label, "%c%c one, bias gradient", ta ? 'T' : 'N', tb ? 'T' : 'N');
            gemm_compare(g, &one, 0, label);
            fake->no_bgrad = 1;
            one.k += 1; /* a new shape: a new plan */
            one.lda += ta ? 0 : 1;
            one.ldb += tb ? 1 : 0;
            snprintf(label, sizeof label, "%c%c one, bias gradient as a second product", ta ? 'T' : 'N', tb ? 'T' : 'N');
            int before = fake->matmuls;
            gemm_compare(g, &one, 0, label);
            CHECK(fake->matmuls == before + 2, "%s: %d matmuls, want 2", label, fake->matmuls - before);
            fake->no_bgrad = 0;
        }
    /* k = 0: C = beta C, padding untouched, contiguous and strided batches */
    Gemm k0 = {0, 0, 3, 4, 0, 1, 4, 6, 0, 0, 18, 2, 1.0f, 0.0f, 0};
    gemm_compare(g, &k0, 1, "k 0, beta 0 over NaN");
    k0.beta = 2.0f;
    gemm_compare(g, &k0, 0, "k 0, beta 2");
    k0.sc = 25;
    gemm_compare(g, &k0, 0, "k 0, beta 2, strided batch");
    k0.beta = 0.0f;
    gemm_compare(g, &k0, 1, "k 0, beta 0, strided batch");
    k0.beta = 1.0f;
    gemm_compare(g, &k0, 0, "k 0, beta 1");
    rt_gpu_close(g);
    CHECK(fake->live_allocs == 0, "%d device allocations left after close", fake->live_allocs);
}

static void fake_gemm_plans(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    RtError e;
    void *a = NULL, *b = NULL, *c = NULL;
    rt_gpu_alloc(g, &a, 4096, "a", &e);
    rt_gpu_alloc(g, &b, 4096, "b", &e);
    rt_gpu_alloc(g, &c, 4096, "c", &e);
    const float *fa = a, *fb = b;
    float *fc = c;
    for (int i = 0; i < 3; i++)
        CHECK(rt_gpu_sgemm_batched(g, 0, 1, 4, 5, 6, 1, fa, 6, 0, fb, 6, 0, 0, fc, 5, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_OK,
              "gemm: %s", e.msg);
    CHECK(fake->heuristics == 1 && fake->matmuls == 3, "3 equal GEMMs: %d heuristic queries, %d matmuls", fake->heuristics,
          fake->matmuls);
    CHECK(fake->last_align[0] == 256 && fake->last_align[1] == 256 && fake->last_align[2] == 256, "aligned: %u %u %u",
          fake->last_align[0], fake->last_align[1], fake->last_align[2]);
    /* A one float in: 4-byte aligned; a batch stride of 6 floats for B: 8 bytes (cuBLASLt's A is our B) */
    CHECK(rt_gpu_sgemm_batched(g, 0, 1, 4, 5, 6, 1, fa + 1, 6, 24, fb, 6, 30, 0, fc, 5, 20, 2, RT_GEMM_PLAIN, NULL, &e) == RT_OK,
          "gemm: %s", e.msg);
    CHECK(fake->heuristics == 2, "a new shape made no new plan");
    CHECK(fake->last_align[0] == 8 && fake->last_align[1] == 4 && fake->last_align[2] == 16 && fake->last_align[3] == 16,
          "alignments %u %u %u %u, want 8 4 16 16", fake->last_align[0], fake->last_align[1], fake->last_align[2],
          fake->last_align[3]);
    /* one matrix: the strides do not matter */
    CHECK(rt_gpu_sgemm_batched(g, 0, 1, 4, 5, 6, 1, fa, 6, 99, fb, 6, 77, 0, fc, 5, 55, 1, RT_GEMM_PLAIN, NULL, &e) == RT_OK,
          "gemm: %s", e.msg);
    CHECK(fake->heuristics == 2, "strides of a batch of one made a new plan");
    /* the bias epilogue is a plan of its own; its vector is set on each call, not kept from the first */
    float ones[5] = {1, 1, 1, 1, 1}, twos[5] = {2, 2, 2, 2, 2}, out1[20], out2[20], zeros[1024] = {0};
    void *v1 = NULL, *v2 = NULL;
    rt_gpu_upload(g, a, zeros, sizeof zeros, &e);
    rt_gpu_upload(g, b, zeros, sizeof zeros, &e);
    rt_gpu_alloc(g, &v1, sizeof ones, "bias 1", &e);
    rt_gpu_alloc(g, &v2, sizeof twos, "bias 2", &e);
    rt_gpu_upload(g, v1, ones, sizeof ones, &e);
    rt_gpu_upload(g, v2, twos, sizeof twos, &e);
    CHECK(rt_gpu_sgemm_batched(g, 0, 1, 4, 5, 6, 1, fa, 6, 0, fb, 6, 0, 0, fc, 5, 0, 1, RT_GEMM_BIAS, v1, &e) == RT_OK,
          "bias gemm: %s", e.msg);
    rt_gpu_download(g, out1, fc, sizeof out1, &e);
    CHECK(rt_gpu_sgemm_batched(g, 0, 1, 4, 5, 6, 1, fa, 6, 0, fb, 6, 0, 0, fc, 5, 0, 1, RT_GEMM_BIAS, v2, &e) == RT_OK,
          "bias gemm: %s", e.msg);
    rt_gpu_download(g, out2, fc, sizeof out2, &e);
    CHECK(fake->heuristics == 3, "the bias epilogue: %d heuristic queries, want 3 (one new plan)", fake->heuristics);
    int moved = 1;
    for (int i = 0; i < 20; i++) moved &= out1[i] == 1.0f && out2[i] == 2.0f;
    CHECK(moved, "the second bias was not the one added");
    rt_gpu_free(g, v1);
    rt_gpu_free(g, v2);
    fake->no_algo = 1;
    CHECK(rt_gpu_sgemm_batched(g, 1, 1, 4, 5, 6, 1, fa, 6, 0, fb, 6, 0, 0, fc, 5, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_ERR_IO,
          "no algorithm accepted");
    CHECK_STR(e.msg, "cublasLtMatmulAlgoGetHeuristic (sgemm TT 4x5x6): no algorithm for this shape and alignment",
              "no algorithm");
    CHECK(rt_gpu_sgemm_batched(g, 0, 0, -1, 5, 6, 1, fa, 6, 0, fb, 6, 0, 0, fc, 5, 0, 1, RT_GEMM_PLAIN, NULL, &e) == RT_ERR_ARG,
          "negative m");
    CHECK_STR(e.msg, "sgemm: negative size (m -1, n 5, k 6, batch 1)", "the CPU's argument checks");
    rt_gpu_free(g, a);
    rt_gpu_free(g, b);
    rt_gpu_free(g, c);
    rt_gpu_close(g);
    CHECK(fake->live_allocs == 0, "%d device allocations left after close", fake->live_allocs);
}

/* The data-parallel buckets' communication stream (gpu_comm.c): between enter and leave the
 * runtime's calls queue on it, after the fork's event; the emulated driver runs that work only
 * when the compute stream waits for it (the join), so a read of the compute stream before the join
 * still sees the old bytes, and after it the new ones. */
/* ZeRO-3's region (gpu_vmm.c) on the emulated driver's pages (4 KiB): mapped pages hold what is
 * written, a release unmaps only at reclaim (the compute stream's event done), an unmapped page's
 * chunk is the next map's (no new chunk), the device bytes counted in the peak and given back. */
static void fake_region(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    RtError e;
    rt_error_clear(&e);
    RtGpuRegion *r = NULL;
    void *base = NULL;
    int64_t page = 0, peak0 = rt_gpu_peak_bytes(g);
    CHECK(rt_gpu_region_open(g, 10 * 4096 - 100, &r, &base, &page, &e) == RT_OK && r && base, "open: %s", e.msg);
    if (!r) {
        rt_gpu_close(g);
        return;
    }
    CHECK(page == 4096, "the emulated granularity is %lld bytes", (long long)page);
    CHECK(rt_gpu_region_map(r, 0, 4, &e) == RT_OK, "map: %s", e.msg);
    CHECK(rt_gpu_region_mapped(r) == 4 && rt_gpu_region_chunks(r) == 4, "%lld mapped, %lld chunks after mapping 4",
          (long long)rt_gpu_region_mapped(r), (long long)rt_gpu_region_chunks(r));
    float *f = base, v[4096];
    for (int i = 0; i < 4096; i++) v[i] = (float)i;
    CHECK(rt_gpu_upload(g, f + 1024, v, 3072 * 4, &e) == RT_OK && rt_gpu_sync(g, "t", &e) == RT_OK, "upload: %s", e.msg);
    CHECK(f[1024] == 0.0f && f[4095] == 3071.0f, "pages 1-3 do not hold what was uploaded");
    CHECK(rt_gpu_region_map(r, 2, 5, &e) == RT_OK && rt_gpu_region_mapped(r) == 5 && rt_gpu_region_chunks(r) == 5,
          "mapping [2, 5) over [0, 4): %lld mapped (%s)", (long long)rt_gpu_region_mapped(r), e.msg);
    CHECK(f[4095] == 3071.0f, "mapping a mapped page again changed it");
    int64_t rel[2] = {1, 2};
    CHECK(rt_gpu_region_release(r, rel, 2, &e) == RT_OK, "release: %s", e.msg);
    CHECK(rt_gpu_region_mapped(r) == 5, "a release unmapped at once (%lld mapped)", (long long)rt_gpu_region_mapped(r));
    CHECK(rt_gpu_region_high(r) == 5, "high-water %lld pages", (long long)rt_gpu_region_high(r));
    CHECK(rt_gpu_region_map(r, 2, 3, &e) == RT_OK, "map again: %s", e.msg); /* page 2 held again: it stays */
    CHECK(rt_gpu_region_reclaim(r, 0, &e) == RT_OK && rt_gpu_region_mapped(r) == 4, "reclaim: %lld mapped (%s)",
          (long long)rt_gpu_region_mapped(r), e.msg);
    CHECK(f[2048] == 1024.0f, "page 2, held again, lost its bytes");
    CHECK(rt_gpu_region_map(r, 6, 7, &e) == RT_OK && rt_gpu_region_chunks(r) == 5, "page 1's chunk not reused: %lld chunks",
          (long long)rt_gpu_region_chunks(r));
    CHECK(rt_gpu_peak_bytes(g) - peak0 == 5 * 4096, "the peak grew by %lld bytes", (long long)(rt_gpu_peak_bytes(g) - peak0));
    int64_t all[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(rt_gpu_region_unmap_now(r, all, 10, &e) == RT_OK && rt_gpu_region_mapped(r) == 0, "unmap: %s", e.msg);
    /* the errors name the call: a page outside the reservation is ignored, a map past the end clipped */
    CHECK(rt_gpu_region_map(r, 9, 12, &e) == RT_OK && rt_gpu_region_mapped(r) == 1, "map past the end: %s", e.msg);
    rt_gpu_region_close(r);
    rt_gpu_close(g);
    CHECK(fake->live_allocs == 0, "%d device allocations left after close", fake->live_allocs);
}

static void fake_comm_stream(void) {
    use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    RtError e;
    enum { N = 300 };
    float host[N], back[N], zero[N] = {0};
    for (int i = 0; i < N; i++) host[i] = (float)(i % 13) - 6.0f;
    void *x = NULL, *y = NULL;
    CHECK(rt_gpu_alloc(g, &x, sizeof host, "x", &e) == RT_OK && x, "alloc x: %s", e.msg);
    CHECK(rt_gpu_alloc(g, &y, sizeof host, "y", &e) == RT_OK && y, "alloc y: %s", e.msg);
    if (!x || !y) return;
    CHECK(rt_gpu_upload(g, x, host, sizeof host, &e) == RT_OK && rt_gpu_upload(g, y, zero, sizeof zero, &e) == RT_OK,
          "upload: %s", e.msg);
    CHECK(rt_gpu_comm_open(g, &e) == RT_OK && rt_gpu_comm_open(g, &e) == RT_OK, "comm_open (twice): %s", e.msg);
    CHECK(rt_gpu_comm_fork(g, &e) == RT_OK, "fork: %s", e.msg);
    rt_gpu_comm_enter(g);
    rt_gpu_comm_enter(g); /* a second enter changes nothing */
    CHECK(rt_gpu_axpy(g, y, x, 2.0f, N, &e) == RT_OK, "axpy on the comm stream: %s", e.msg);
    rt_gpu_comm_leave(g);
    CHECK(rt_gpu_download(g, back, y, sizeof back, &e) == RT_OK, "download before the join: %s", e.msg);
    CHECK(memcmp(back, zero, sizeof back) == 0, "the comm stream's axpy ran before the join (y[1] = %g)", back[1]);
    CHECK(rt_gpu_comm_join(g, &e) == RT_OK, "join: %s", e.msg);
    CHECK(rt_gpu_download(g, back, y, sizeof back, &e) == RT_OK, "download after the join: %s", e.msg);
    int ok = 1;
    for (int i = 0; i < N; i++) ok = ok && back[i] == 2.0f * host[i];
    CHECK(ok, "after the join y is not 2 x: y[1] = %g, want %g", back[1], 2.0f * host[1]);
    rt_gpu_free(g, x);
    rt_gpu_free(g, y);
    rt_gpu_close(g);
}

/* ---- timing -------------------------------------------------------------------------------------- */

/* What rt_gpu_print_timing prints for g (malloc'd). */
static char *timing_text(RtGpu *g) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    rt_gpu_print_timing(f, g);
    fclose(f);
    return text;
}

/* The fake GPU opened with MBT_DEBUG's timing and MBT_TRACE writing the trace to `trace` (in the
 * test's folder); NULL (and a failed check) when it does not open. */
static RtGpu *open_timed(const char *trace) {
    dir_make();
    setenv("MBT_DEBUG", "1", 1);
    setenv("MBT_TRACE", at(trace), 1);
    RtGpu *g = NULL;
    RtError e;
    CHECK(rt_gpu_open(&g, &program, RT_DEVICE_CUDA, NULL, &e) == RT_OK, "open: %s", e.msg);
    return g;
}

static void fake_timing_and_trace(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_timed("trace.json");
    RtError e;
    if (!g) return;
    void *y = NULL, *a = NULL;
    rt_gpu_alloc(g, &y, 4096, "y", &e);
    rt_gpu_alloc(g, &a, 4096, "a", &e);
    void *bufs[] = {y};
    rt_gpu_launch(g, 0, bufs, &e);
    rt_gpu_launch(g, 0, bufs, &e);
    rt_gpu_axpy(g, y, a, 1, 16, &e);
    rt_gpu_sgemm_batched(g, 0, 0, 5, 7, 3, 1, a, 3, 0, a, 7, 0, 0, y, 7, 0, 1, RT_GEMM_PLAIN, NULL, &e);
    CHECK(rt_gpu_launch(g, 1, NULL, &e) == RT_ERR_IO, "fake_fail launched"); /* a failed launch is not timed */
    CHECK(rt_gpu_sync(g, "step", &e) == RT_OK, "sync: %s", e.msg);
    char *text = timing_text(g);
    char want[PATH_MAX + 1024];
    snprintf(want, sizeof want,
             "GPU time: 4 launches and GEMMs, 3500.0 us\n"
             "kernel / GEMM                                      calls        total us       mean us   share\n"
             "sgemm NN 5x7x3                                         1          2000.0       2000.00   57.1%%\n"
             "fake_fill7                                             2          1000.0        500.00   28.6%%\n"
             "mbt_rt_axpy                                            1           500.0        500.00   14.3%%\n"
             "GPU trace: %s (4 events)\n",
             at("trace.json"));
    CHECK_STR(text, want, "timing table");
    free(text);
    /* after the wait: times continue from the new anchor */
    rt_gpu_launch(g, 0, bufs, &e);
    rt_gpu_free(g, y);
    rt_gpu_free(g, a);
    rt_gpu_close(g);
    (void)fake;
    text = slurp(at("trace.json"), NULL);
    CHECK_STR(text,
              "{\"traceEvents\":[\n"
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
              "{\"name\":\"fake_fill7\",\"ph\":\"X\",\"ts\":0.0,\"dur\":500.0,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"fake_fill7\",\"ph\":\"X\",\"ts\":500.0,\"dur\":500.0,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"mbt_rt_axpy\",\"ph\":\"X\",\"ts\":1000.0,\"dur\":500.0,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"sgemm NN 5x7x3\",\"ph\":\"X\",\"ts\":1500.0,\"dur\":2000.0,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"fake_fill7\",\"ph\":\"X\",\"ts\":3500.0,\"dur\":500.0,\"pid\":0,\"tid\":0}\n"
              "]}\n",
              "trace written at close");
    free(text);
    dir_remove();
}

/* The offloads' copy streams timed (gpu_act.c, gpu_opt.c): on the fake's clock a launch takes
 * 0.5 ms and a queued copy of 2.5 MB 0.1 ms (25 GB/s) from when the compute stream reached it; the
 * compute stream's wait for the copies moves its clock to their end. So each copy is on its own
 * track (1: activations, 2: the optimizer's) from its compute-stream point for 100 us, and each
 * wait on the compute track spans the copies it waits for. Last, a copy with no wait after it
 * before the sync (the case the plan never makes, gpu_timing.c): resolution waits for it rather
 * than read an event that is not done (the fake answers CUDA_ERROR_NOT_READY, as CUDA does); and
 * one still pending at close, read before the copy stream goes. */
static void fake_copy_streams_timed(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_timed("copies.json");
    RtError e;
    if (!g) return;
    const int64_t n = 2500000;
    void *y = NULL, *a = NULL;
    float *host = calloc(1, (size_t)n);
    rt_gpu_alloc(g, &y, 4096, "y", &e);
    rt_gpu_alloc(g, &a, n, "a", &e);
    void *bufs[] = {y};
    RtStatus st = rt_gpu_act_open(g, n, &e);
    if (st == RT_OK) st = rt_gpu_opt_open(g, &e);
    if (st == RT_OK) st = rt_gpu_opt_events(g, 1, &e);
    CHECK(st == RT_OK && host, "the copy streams: %s", e.msg);
    rt_gpu_launch(g, 0, bufs, &e);                               /* [0, 500) */
    st = rt_gpu_act_copy(g, 0, 0, a, n, &e);                     /* copy stream [500, 600) */
    if (st == RT_OK) st = rt_gpu_act_copy(g, 2, 0, NULL, 0, &e); /* compute [500, 600) */
    if (st == RT_OK) st = rt_gpu_launch(g, 0, bufs, &e);         /* [600, 1100) */
    if (st == RT_OK) st = rt_gpu_act_copy(g, 1, 0, a, n, &e);    /* copy stream [1100, 1200) */
    if (st == RT_OK) st = rt_gpu_act_copy(g, 2, 0, NULL, 0, &e); /* compute [1100, 1200) */
    if (st == RT_OK) st = rt_gpu_opt_fork(g, &e);
    if (st == RT_OK) st = rt_gpu_opt_down(g, host, a, n, 0, &e); /* optimizer's stream [1200, 1300) */
    if (st == RT_OK) st = rt_gpu_opt_wait_down(g, 0, &e);
    if (st == RT_OK) st = rt_gpu_opt_up(g, a, host, n, 0, &e);                                         /* [1300, 1400) */
    if (st == RT_OK) st = rt_gpu_opt_join(g, "optimizer offload: the step waits for the uploads", &e); /* compute [1200, 1400) */
    if (st == RT_OK) st = rt_gpu_sync(g, "step", &e);
    CHECK(st == RT_OK, "the step with copies: %s", e.msg);
    char *text = timing_text(g);
    char want[PATH_MAX + 2048];
    snprintf(want, sizeof want,
             "GPU time: 5 launches, GEMMs and waits for the copy streams on the compute stream, 1400.0 us\n"
             "GPU time: activations' copies: 2 copies on their own stream, 200.0 us (beside the compute stream's, not in its "
             "total)\n"
             "GPU time: optimizer's copies: 2 copies on their own stream, 200.0 us (beside the compute stream's, not in its "
             "total)\n"
             "kernel / GEMM                                           calls        total us       mean us   share\n"
             "fake_fill7                                                  2          1000.0        500.00   71.4%%\n"
             "activations: the step waits for its copies                  2           200.0        100.00   14.3%%\n"
             "optimizer offload: the step waits for the uploads           1           200.0        200.00   14.3%%\n"
             "activations: copy back                                      1           100.0        100.00   50.0%%\n"
             "activations: copy to host                                   1           100.0        100.00   50.0%%\n"
             "optimizer offload: gradient down                            1           100.0        100.00   50.0%%\n"
             "optimizer offload: parameters up                            1           100.0        100.00   50.0%%\n"
             "GPU trace: %s (9 events)\n",
             at("copies.json"));
    CHECK_STR(text, want, "timing table with the copy streams");
    free(text);
    /* a copy the compute stream never waited for, then a sync: read back after it is done */
    st = rt_gpu_act_copy(g, 0, 0, a, n, &e);
    if (st == RT_OK) st = rt_gpu_sync(g, "a copy not waited for", &e);
    CHECK(st == RT_OK, "a copy without a wait before the sync: %s", e.msg);
    /* and one still pending at close: read back there, its stream still open */
    CHECK(rt_gpu_act_copy(g, 0, 0, a, n, &e) == RT_OK, "a copy before close: %s", e.msg);
    rt_gpu_free(g, y);
    rt_gpu_free(g, a);
    rt_gpu_close(g);
    free(host);
    (void)fake;
    text = slurp(at("copies.json"), NULL);
    CHECK_STR(text,
              "{\"traceEvents\":[\n"
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"activations' copies\"}},\n"
              "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,\"args\":{\"name\":\"optimizer's copies\"}},\n"
              "{\"name\":\"fake_fill7\",\"ph\":\"X\",\"ts\":0.0,\"dur\":500.0,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"activations: copy to host\",\"ph\":\"X\",\"ts\":500.0,\"dur\":100.0,\"pid\":0,\"tid\":1},\n"
              "{\"name\":\"activations: the step waits for its copies\",\"ph\":\"X\",\"ts\":500.0,\"dur\":100.0,\"pid\":0,"
              "\"tid\":0},\n"
              "{\"name\":\"fake_fill7\",\"ph\":\"X\",\"ts\":600.0,\"dur\":500.0,\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"activations: copy back\",\"ph\":\"X\",\"ts\":1100.0,\"dur\":100.0,\"pid\":0,\"tid\":1},\n"
              "{\"name\":\"activations: the step waits for its copies\",\"ph\":\"X\",\"ts\":1100.0,\"dur\":100.0,\"pid\":0,"
              "\"tid\":0},\n"
              "{\"name\":\"optimizer offload: gradient down\",\"ph\":\"X\",\"ts\":1200.0,\"dur\":100.0,\"pid\":0,\"tid\":2},\n"
              "{\"name\":\"optimizer offload: parameters up\",\"ph\":\"X\",\"ts\":1300.0,\"dur\":100.0,\"pid\":0,\"tid\":2},\n"
              "{\"name\":\"optimizer offload: the step waits for the uploads\",\"ph\":\"X\",\"ts\":1200.0,\"dur\":200.0,"
              "\"pid\":0,\"tid\":0},\n"
              "{\"name\":\"activations: copy to host\",\"ph\":\"X\",\"ts\":1400.0,\"dur\":100.0,\"pid\":0,\"tid\":1},\n"
              "{\"name\":\"activations: copy to host\",\"ph\":\"X\",\"ts\":1500.0,\"dur\":100.0,\"pid\":0,\"tid\":1}\n"
              "]}\n",
              "the trace's tracks");
    free(text);
    dir_remove();
}

static void fake_timing_off(void) {
    FakeControl *fake = use_fake();
    RtGpu *g = open_fake(&program);
    if (!g) return;
    RtError e;
    void *y = NULL;
    rt_gpu_alloc(g, &y, 4096, "y", &e);
    void *bufs[] = {y};
    rt_gpu_launch(g, 0, bufs, &e);
    char *text = timing_text(g);
    CHECK(text && !*text, "timing printed without MBT_DEBUG: %s", text ? text : "(none)");
    free(text);
    CHECK(fake->launches == 1, "%d launches", fake->launches);
    rt_gpu_free(g, y);
    rt_gpu_close(g);
}

/* ==== main ========================================================================================== */

/* ==== the collectives on GPU buffers (runtime/comm, rt_comm_set_gpu) ================================ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The tcp world of two ranks (this process rank 0, a forked rank 1), each with its own fake GPU. */
static void fake_world_env(void) {
    char port[16];
    snprintf(port, sizeof port, "%d", 30000 + (int)((getpid() + 7) % 20000));
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    unsetenv("MBT_COMM");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMIX_RANK");
}

/* Two tcp ranks: this process (rank 0, its vectors in the fake GPU's memory) and a forked one
 * (rank 1, host memory). exchange_shards and gather_shards must give rank 0's device buffers
 * exactly what host buffers get; rank 1 checks its own side. Shards are uneven: [0, 3), [3, 10). */
static void fake_comm_staging(void) {
    FakeControl *fake = use_fake();
    setenv("MBT_NCCL", "0", 1); /* the staged path, though the fake NCCL is there */
    enum { N = 10 };
    const int64_t off[3] = {0, 3, N};
    fake_world_env();
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) { /* rank 1, host buffers; exit status 0 when its results are right */
        setenv("RANK", "1", 1);
        RtComm *c = NULL;
        RtError e;
        if (rt_comm_open(&c, 10, &e) != RT_OK) _exit(2);
        float mine[N], got[2 * 7], v[N];
        for (int k = 0; k < N; k++) mine[k] = 100.0f + (float)k, v[k] = k >= 3 ? 200.0f + (float)k : -1.0f;
        int bad = rt_comm_exchange_shards(c, mine, off, got, &e) != RT_OK || rt_comm_gather_shards(c, v, off, &e) != RT_OK;
        for (int k = 0; k < 7 && !bad; k++) bad = got[k] != (float)(3 + k) || got[7 + k] != 100.0f + (float)(3 + k);
        for (int k = 0; k < N && !bad; k++) bad = v[k] != (k < 3 ? 300.0f + (float)k : 200.0f + (float)k);
        rt_comm_close(c);
        _exit(bad ? 3 : 0);
    }
    setenv("RANK", "0", 1);
    RtComm *c = NULL;
    RtError e;
    CHECK(rt_comm_open(&c, 10, &e) == RT_OK, "open rank 0: %s", e.msg);
    RtGpu *g = open_fake(&program);
    if (!c || !g) {
        if (child > 0) waitpid(child, NULL, 0);
        return;
    }
    CHECK(rt_comm_set_gpu(c, g, &e) == RT_OK && !rt_comm_nccl(c), "set_gpu with MBT_NCCL=0: %s", e.msg);
    float host[N], got[2 * 3], v[N];
    for (int k = 0; k < N; k++) host[k] = (float)k;
    void *dmine = NULL, *dgot = NULL, *dv = NULL;
    CHECK(rt_gpu_alloc(g, &dmine, sizeof host, "mine", &e) == RT_OK && rt_gpu_alloc(g, &dgot, sizeof got, "got", &e) == RT_OK &&
              rt_gpu_alloc(g, &dv, sizeof v, "v", &e) == RT_OK,
          "alloc: %s", e.msg);
    CHECK(rt_gpu_upload(g, dmine, host, sizeof host, &e) == RT_OK, "upload: %s", e.msg);
    for (int k = 0; k < N; k++) v[k] = k < 3 ? 300.0f + (float)k : -5.0f; /* rank 1's part to be replaced */
    CHECK(rt_gpu_upload(g, dv, v, sizeof v, &e) == RT_OK, "upload: %s", e.msg);
    /* the fake's device memory is host memory: the copies counted show that the calls staged */
    long long down = fake->dtoh_bytes, up = fake->htod_bytes;
    CHECK(rt_comm_exchange_shards(c, dmine, off, dgot, &e) == RT_OK, "exchange_shards on GPU buffers: %s", e.msg);
    CHECK(fake->dtoh_bytes - down == N * 4 && fake->htod_bytes - up == 6 * 4,
          "exchange_shards copied %lld bytes down, %lld up; expected %d and %d", fake->dtoh_bytes - down, fake->htod_bytes - up,
          N * 4, 6 * 4);
    down = fake->dtoh_bytes, up = fake->htod_bytes;
    CHECK(rt_comm_gather_shards(c, dv, off, &e) == RT_OK, "gather_shards on GPU buffers: %s", e.msg);
    CHECK(fake->dtoh_bytes - down == 3 * 4 && fake->htod_bytes - up == 7 * 4,
          "gather_shards copied %lld bytes down, %lld up; expected %d (its shard) and %d (the others')", fake->dtoh_bytes - down,
          fake->htod_bytes - up, 3 * 4, 7 * 4);
    CHECK(rt_gpu_download(g, got, dgot, sizeof got, &e) == RT_OK && rt_gpu_download(g, v, dv, sizeof v, &e) == RT_OK,
          "download: %s", e.msg);
    for (int k = 0; k < 3; k++)
        CHECK(got[k] == (float)k && got[3 + k] == 100.0f + (float)k, "exchange_shards: got[%d] %g, got[%d] %g", k, got[k], 3 + k,
              got[3 + k]);
    for (int k = 0; k < N; k++)
        CHECK(v[k] == (k < 3 ? 300.0f + (float)k : 200.0f + (float)k), "gather_shards: v[%d] is %g", k, v[k]);
    int st = -1;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 (host buffers) failed: status %d", st);
    rt_gpu_free(g, dmine);
    rt_gpu_free(g, dgot);
    rt_gpu_free(g, dv);
    rt_comm_close(c);
    rt_gpu_close(g);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("MBT_NCCL");
}

/* One rank's side of fake_comm_nccl: rank r's vector is 100 r + k in its GPU's memory; it must
 * receive every rank's copy of its shard and, after the gather, every rank's shard of v.
 * Returns a description of the first wrong value, or NULL. The staging copies must not happen. */
static const char *nccl_rank_side(int rank, FakeControl *fake, char *why, size_t cap) {
    enum { N = 10 };
    const int64_t off[3] = {0, 3, N};
    RtComm *c = NULL;
    RtError e;
    rt_error_clear(&e);
    if (rt_comm_open(&c, 10, &e) != RT_OK) return snprintf(why, cap, "open: %.400s", e.msg), why;
    RtGpu *g = NULL;
    if (rt_gpu_open(&g, &program, RT_DEVICE_CUDA, NULL, &e) != RT_OK) return snprintf(why, cap, "gpu: %.400s", e.msg), why;
    if (rt_comm_set_gpu(c, g, &e) != RT_OK || !rt_comm_nccl(c))
        return snprintf(why, cap, "set_gpu (NCCL expected): %.400s", e.msg), why;
    if (!strstr(rt_comm_backend(c), "GPU buffers over NCCL 2.99.0"))
        return snprintf(why, cap, "the backend does not name NCCL: %s", rt_comm_backend(c)), why;
    int64_t len = off[rank + 1] - off[rank];
    float mine[N], got[2 * 7], v[N];
    for (int k = 0; k < N; k++) mine[k] = 100.0f * (float)rank + (float)k, v[k] = -1.0f;
    for (int k = off[rank]; k < off[rank + 1]; k++) v[k] = 1000.0f * (float)(rank + 1) + (float)k;
    void *dmine = NULL, *dgot = NULL, *dv = NULL;
    if (rt_gpu_alloc(g, &dmine, sizeof mine, "mine", &e) || rt_gpu_alloc(g, &dgot, sizeof got, "got", &e) ||
        rt_gpu_alloc(g, &dv, sizeof v, "v", &e) || rt_gpu_upload(g, dmine, mine, sizeof mine, &e) ||
        rt_gpu_upload(g, dv, v, sizeof v, &e) || rt_gpu_sync(g, "uploads", &e))
        return snprintf(why, cap, "device buffers: %.400s", e.msg), why;
    long long down = fake->dtoh_bytes, up = fake->htod_bytes;
    if (rt_comm_exchange_shards(c, dmine, off, dgot, &e) != RT_OK) return snprintf(why, cap, "exchange: %.400s", e.msg), why;
    if (rt_comm_gather_shards(c, dv, off, &e) != RT_OK) return snprintf(why, cap, "gather: %.400s", e.msg), why;
    if (fake->dtoh_bytes != down || fake->htod_bytes != up)
        return snprintf(why, cap, "the collectives staged %lld bytes down and %lld up", fake->dtoh_bytes - down,
                        fake->htod_bytes - up),
               why;
    if (rt_gpu_download(g, got, dgot, 2 * len * 4, &e) || rt_gpu_download(g, v, dv, sizeof v, &e))
        return snprintf(why, cap, "download: %.400s", e.msg), why;
    for (int i = 0; i < 2; i++)
        for (int64_t k = 0; k < len; k++)
            if (got[i * len + k] != 100.0f * (float)i + (float)(off[rank] + k))
                return snprintf(why, cap, "rank %d: got[%lld] is %g", rank, (long long)(i * len + k), got[i * len + k]), why;
    for (int k = 0; k < N; k++)
        if (v[k] != 1000.0f * (float)(k < 3 ? 1 : 2) + (float)k)
            return snprintf(why, cap, "rank %d: v[%d] is %g", rank, k, v[k]), why;
    rt_gpu_free(g, dmine), rt_gpu_free(g, dgot), rt_gpu_free(g, dv);
    if (rt_comm_set_gpu(c, NULL, &e) != RT_OK) return snprintf(why, cap, "set_gpu NULL: %.400s", e.msg), why;
    rt_comm_close(c);
    rt_gpu_close(g);
    return NULL;
}

/* exchange_shards and gather_shards over (fake) NCCL: device buffers GPU to GPU, no staging, the
 * same values as the host path; uneven shards [0, 3), [3, 10). */
static void fake_comm_nccl(void) {
    FakeControl *fake = use_fake();
    fake_world_env();
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        setenv("RANK", "1", 1);
        char why[1200];
        const char *bad = nccl_rank_side(1, fake, why, sizeof why);
        if (bad) fprintf(stderr, "rank 1: %s\n", bad);
        _exit(bad ? 3 : 0);
    }
    setenv("RANK", "0", 1);
    char why[1200];
    const char *bad = nccl_rank_side(0, fake, why, sizeof why);
    CHECK(!bad, "rank 0: %s", bad);
    int st = -1;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 failed: status %d", st);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
}

/* A rank whose NCCL never finishes (MBT_FAKE_NCCL_HANG) fails after the timeout, naming it, and
 * aborts its communicator; a group that fails (MBT_FAKE_NCCL_FAIL) is NCCL's error, named. */
static void fake_comm_nccl_failures(void) {
    use_fake();
    for (int mode = 0; mode < 2; mode++) {
        fake_world_env();
        setenv(mode == 0 ? "MBT_FAKE_NCCL_HANG" : "MBT_FAKE_NCCL_FAIL", "0", 1);
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) { /* rank 1: runs its side until its peer gives up */
            setenv("RANK", "1", 1);
            RtComm *c = NULL;
            RtGpu *g = NULL;
            RtError e;
            if (rt_comm_open(&c, 2, &e) == RT_OK && rt_gpu_open(&g, &program, RT_DEVICE_CUDA, NULL, &e) == RT_OK &&
                rt_comm_set_gpu(c, g, &e) == RT_OK) {
                float *d = NULL;
                const int64_t off[3] = {0, 3, 10};
                if (rt_gpu_alloc(g, (void **)&d, 40, "v", &e) == RT_OK) rt_comm_gather_shards(c, d, off, &e);
            }
            _exit(0);
        }
        setenv("RANK", "0", 1);
        RtComm *c = NULL;
        RtError e;
        rt_error_clear(&e);
        CHECK(rt_comm_open(&c, 1, &e) == RT_OK, "open: %s", e.msg);
        RtGpu *g = c ? open_fake(&program) : NULL;
        double t0 = now_s();
        RtStatus st = RT_OK;
        if (g) st = rt_comm_set_gpu(c, g, &e);
        if (g && st == RT_OK) {
            float *d = NULL;
            const int64_t off[3] = {0, 3, 10};
            st = rt_gpu_alloc(g, (void **)&d, 40, "v", &e);
            if (st == RT_OK) st = rt_comm_gather_shards(c, d, off, &e);
        }
        double dt = now_s() - t0;
        if (mode == 0) {
            CHECK(st != RT_OK && strstr(e.msg, "no progress in 1 s") && strstr(e.msg, "opening NCCL"),
                  "a hung NCCL: status %d, '%s'", st, e.msg);
            CHECK(dt < 5, "a hung NCCL took %.1f s to fail with a 1 s timeout", dt);
        } else {
            CHECK(st != RT_OK && strstr(e.msg, "ncclGroupEnd") && strstr(e.msg, "NCCL error 2"),
                  "a failing group: status %d, '%s'", st, e.msg);
        }
        rt_comm_close(c);
        rt_gpu_close(g);
        int ws = -1;
        waitpid(child, &ws, 0);
        unsetenv(mode == 0 ? "MBT_FAKE_NCCL_HANG" : "MBT_FAKE_NCCL_FAIL");
        unsetenv("RANK");
        unsetenv("WORLD_SIZE");
    }
}

int main(int argc, char **argv) {
    (void)argc;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    snprintf(fake_path, sizeof fake_path, "%.*s/libmbt_fake_cuda.so", slash ? (int)(slash - self) : 1, slash ? self : ".");
    snprintf(fake_nccl_path, sizeof fake_nccl_path, "%.*s/libmbt_fake_nccl.so", slash ? (int)(slash - self) : 1,
             slash ? self : ".");
    (void)argv;

    RUN(no_driver);
    RUN(cpu_loads_no_library);
    RUN(not_a_driver);
    if (file_exists(STUB_DRIVER)) {
        RUN(stub_driver);
        RUN(real_cublaslt);
    } else {
        printf("note: %s is not installed: stub_driver and real_cublaslt not run\n", STUB_DRIVER);
    }
    RUN(cache_dir_rules);
    RUN(cache_file_names);
    RUN(byte_sizes);
    RUN(stats_sum_and_sort);
    RUN(stats_by_track);
    RUN(stats_many_names);
    RUN(trace_json);
    RUN(fake_cubin_module);
    RUN(fake_ptx_and_cache);
    RUN(fake_no_image);
    RUN(fake_open_errors);
    RUN(fake_memory_and_kernels);
    RUN(fake_comm_stream);
    RUN(fake_region);
    RUN(fake_gemm_matches_cpu);
    RUN(fake_gemm_plans);
    RUN(fake_timing_and_trace);
    RUN(fake_copy_streams_timed);
    RUN(fake_timing_off);
    RUN(fake_comm_staging);
    RUN(fake_comm_nccl);
    RUN(fake_comm_nccl_failures);
    return unit_finish();
}
