/* fake_cuda.c - a stand-in for the CUDA driver and cuBLASLt that runs on the CPU, so that
 * test_rt_gpu can drive runtime/gpu*.c's whole path (opening, module choice, the JIT cache,
 * memory, launches, GEMMs, timing) on a machine without a GPU. It exports every function of
 * gpu_internal.h's table under the table's symbol names; test_rt_gpu loads it as both libraries
 * (MBT_LIBCUDA, MBT_LIBCUBLASLT). What it checks and what it cannot:
 *
 * - "Device" memory is host memory (cuMemAlloc is aligned_alloc), so copies are memcpy and the
 *   runtime's kernels (mbt_rt_axpy, mbt_rt_scale, mbt_rt_sumsq_blocks) run here in C with the
 *   parameter layout rt_kernels.cu documents: the test sees whether gpu.c passes them right. Two
 *   test kernels: fake_fill7 (its one buffer's first gridDim.x x blockDim.x floats = 7) and
 *   fake_fail (its launch fails).
 * - Modules are text (fake_cuda.h); cuLink* "compiles" fake PTX into a fake cubin and counts it.
 * - cuBLASLt is fake_cublaslt.c (the products with OpenBLAS; MBT_FAKE_CUBLAS_ROWWISE), sharing
 *   fake_cuda_internal.h with this file.
 * - Time is a clock that launches and matmuls advance by fixed amounts.
 *
 * The emulated GPU (MBT_FAKE_CUDA_EMU=FILE.so, a program's CUDA C compiled for the host by
 * tests/cudaemu/build.sh): modules are any image (the executable's real cubin or PTX), their
 * functions are FILE.so's kernels by name, and launches run the kernels' own code on the CPU
 * (tests/cudaemu/cudaemu.h: blocks of fibers, barriers and shuffles), so a whole `--device cuda`
 * run executes here. Device memory starts as 0xff bytes (f32 NaN) so a read of memory nothing
 * wrote shows in the results, as a GPU's unwritten memory would not reliably.
 *
 * Build: the Makefile makes build/tests/libmbt_fake_cuda.so (this file and fake_cublaslt.c) for test_rt_gpu. */
#include <cblas.h>
#include <fcntl.h>
#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda_internal.h"

FakeControl fake = {.major = 8, .minor = 0, .sms = 4, .devices = 1};

/* The emulated GPU's kernels (MBT_FAKE_CUDA_EMU), opened on first use. */
static struct {
    int tried;
    int (*find)(const char *name);
    int (*launch)(int k, const unsigned grid[3], const unsigned block[3], void **params, char *err, size_t errlen);
    int (*params)(int k, const size_t **sizes); /* the kernel's parameter count and sizes (a capture copies them) */
} emu;

static int fake_emu(void) {
    if (!emu.tried) {
        emu.tried = 1;
        const char *path = getenv("MBT_FAKE_CUDA_EMU");
        if (path && *path) {
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                fprintf(stderr, "fake_cuda: MBT_FAKE_CUDA_EMU: %s\n", dlerror());
                exit(2);
            }
            *(void **)&emu.find = dlsym(h, "mbt_emu_find");
            *(void **)&emu.launch = dlsym(h, "mbt_emu_launch");
            *(void **)&emu.params = dlsym(h, "mbt_emu_params");
            if (!emu.find || !emu.launch) {
                fprintf(stderr, "fake_cuda: MBT_FAKE_CUDA_EMU: %s is not built by tests/cudaemu/build.sh\n", path);
                exit(2);
            }
        }
    }
    return emu.launch != NULL;
}

FakeControl *fake_control(void) { return &fake; }

/* ---- errors ---------------------------------------------------------------------------------- */

static const struct {
    CUresult rc;
    const char *name, *text;
} fake_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {FAKE_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {FAKE_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {FAKE_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {FAKE_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {FAKE_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {FAKE_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {FAKE_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {FAKE_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {FAKE_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
     "capture was not joined: a stream forked from the capture had work after its last join"},
};

static CUresult fake_error(CUresult rc, const char **out, int text) {
    for (size_t i = 0; i < sizeof fake_errors / sizeof fake_errors[0]; i++)
        if (fake_errors[i].rc == rc) {
            *out = text ? fake_errors[i].text : fake_errors[i].name;
            return CUDA_SUCCESS;
        }
    return FAKE_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult rc, const char **s) { return fake_error(rc, s, 0); }
CUresult cuGetErrorString(CUresult rc, const char **s) { return fake_error(rc, s, 1); }

/* ---- the device ------------------------------------------------------------------------------ */

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return fake.init_result;
}

CUresult cuDriverGetVersion(int *v) {
    *v = 12080;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
    *n = fake.devices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    *d = ordinal;
    return ordinal < fake.devices ? CUDA_SUCCESS : FAKE_INVALID_VALUE;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d) {
    (void)d;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = fake.major; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = fake.minor; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = fake.sms; return CUDA_SUCCESS;
    }
    return FAKE_INVALID_VALUE;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    strncpy(name, "Fake GPU", (size_t)len);
    return CUDA_SUCCESS;
}

static size_t fake_live_bytes; /* what cuMemAlloc handed out and is not freed (cuMemGetInfo's free memory) */

/* The device's memory: 16 GiB, or MBT_FAKE_CUDA_MEM bytes (tests/gpu/run.sh sizes serve's KV pool,
 * a fraction of the free memory, with it; allocations are not held to it). */
static size_t fake_total_mem(void) {
    const char *m = getenv("MBT_FAKE_CUDA_MEM");
    return m && *m ? (size_t)strtoull(m, NULL, 10) : (size_t)16 << 30;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    (void)d;
    *bytes = fake_total_mem();
    return CUDA_SUCCESS;
}

/* free: the total less what is allocated (the serve pool's kv.memory is a fraction of it) */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    *total = fake_total_mem();
    *free_bytes = fake_live_bytes < *total ? *total - fake_live_bytes : 0;
    return CUDA_SUCCESS;
}

static int fake_context; /* its address is the primary context */

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    (void)d;
    *ctx = (CUcontext)(void *)&fake_context;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    (void)d;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx == (CUcontext)(void *)&fake_context ? CUDA_SUCCESS : FAKE_INVALID_VALUE; }

/* ---- stream capture (CUDA graphs) ------------------------------------------------------------
 * Between cuStreamBeginCapture and cuStreamEndCapture the stream's operations are recorded, not
 * run: kernel launches (their parameters copied by value: the runtime's kernels' sizes are known
 * here, the emulated kernels' come from mbt_emu_params), device-to-device copies, memsets and
 * matmuls (descriptors and layouts copied). cuGraphLaunch runs the record in order, as the stream
 * would have. What a real capture refuses, this one refuses too, as the runtime must never need
 * it: a wait (cuStreamSynchronize) and copies from or to host memory (the runtime's graphs move
 * host bytes outside the graph); the first refusal fails the capture at cuStreamEndCapture. */
typedef struct FakeOp FakeOp;
struct FakeGraph {
    FakeOp *ops;
    int n, cap;
};
FakeGraph *fake_capture;         /* the graph being captured, or NULL */
static CUresult fake_capture_rc; /* the first refused operation's error during the capture */
static struct {
    int captured, launches, ops;
} fake_graphs;

static CUresult fake_rec_copy(CUdeviceptr dst, CUdeviceptr src, size_t n);
static int fake_queue_copy(CUstream s, int kind, void *dst, const void *src, size_t n, CUresult *rc);
typedef struct FakeQueue FakeQueue;
static CUresult fake_rec_queued(FakeQueue *q, int kind, void *dst, const void *src, size_t n);
static CUresult fake_rec_join(FakeQueue *q, long long seq);
static CUresult fake_rec_memset(int kind, CUdeviceptr p, size_t pitch, unsigned v, size_t width, size_t height);

/* MBT_FAKE_CUDA_REPORT=1: the graph counts on stderr at exit (tests/gpu/run.sh's graph test). */
__attribute__((destructor)) static void fake_report(void) {
    const char *r = getenv("MBT_FAKE_CUDA_REPORT");
    if (r && *r == '1')
        fprintf(stderr, "fake_cuda: %d graphs captured (%d operations), %d graph launches, %d kernel launches\n",
                fake_graphs.captured, fake_graphs.ops, fake_graphs.launches, fake.launches);
}

/* ---- memory ---------------------------------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (n == 0) return FAKE_INVALID_VALUE;
    if (fake.oom_above && n > fake.oom_above) return CUDA_ERROR_OUT_OF_MEMORY;
    void *m = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    if (fake_emu()) memset(m, 0xff, n);
    fake.live_allocs++;
    fake_live_bytes += malloc_usable_size(m);
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

static void fake_queues_run_all(void);

/* As CUDA's, a free synchronises: the queues' copies and launches run first (they may use p). */
CUresult cuMemFree_v2(CUdeviceptr p) {
    fake_queues_run_all();
    fake.live_allocs--;
    fake_live_bytes -= malloc_usable_size((void *)(uintptr_t)p);
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
    (void)flags;
    *p = malloc(n);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p) {
    free(p);
    return CUDA_SUCCESS;
}

/* ---- virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, ...) -------------
 * ZeRO-3's parameter region (runtime/gpu/gpu_vmm.c) reserves addresses and maps physical chunks
 * into them. Here a reservation is an anonymous PROT_NONE mapping; a chunk is a piece of one
 * memfd (its bytes 0xff when created: NaN, as cuMemAlloc's under the emulator); cuMemMap puts the
 * chunk's piece of the file at the address (MAP_FIXED, shared) and cuMemSetAccess makes it
 * readable and writable; cuMemUnmap makes the pages PROT_NONE again. So a kernel or a copy that
 * touches a page no chunk is mapped at faults, and the fault handler installed with the first
 * reservation says so and ends the process (status 3): that is how tests/gpu/run.sh sees a
 * schedule that releases a gather before its last use. The granularity is 4096 bytes, or
 * MBT_FAKE_CUDA_GRANULARITY (a multiple of the page size; a real GPU's is 2 MiB), so that a tiny
 * model shows what ZeRO-3 saves. */
#define FAKE_MAX_RESERVED 16
#define FAKE_MAX_MAPS 65536
static struct {
    int fd;       /* the chunks' memfd (-1 before the first) */
    size_t bytes; /* its size: every chunk created, freed ones included */
    struct FakeChunk {
        size_t off, size;
        int live, maps; /* live: not released; maps: how many mappings use it */
    } *chunks;
    long long nchunks, cap;
    struct {
        uintptr_t base;
        size_t size;
    } res[FAKE_MAX_RESERVED];
    struct {
        uintptr_t addr;
        size_t size;
        long long chunk; /* -1: free slot */
    } *maps;
    long long nmaps;
    int handler;
    size_t physical; /* bytes of live chunks */
} fake_vmm = {.fd = -1};

static size_t fake_granularity(void) {
    const char *g = getenv("MBT_FAKE_CUDA_GRANULARITY");
    size_t v = g && *g ? (size_t)strtoull(g, NULL, 10) : 4096;
    long ps = sysconf(_SC_PAGESIZE);
    return v > 0 && ps > 0 && v % (size_t)ps == 0 ? v : (size_t)4096;
}

static void fake_segv(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < FAKE_MAX_RESERVED; i++)
        if (fake_vmm.res[i].size && a >= fake_vmm.res[i].base && a < fake_vmm.res[i].base + fake_vmm.res[i].size) {
            char msg[200];
            int n = snprintf(msg, sizeof msg,
                             "fake_cuda: device address 0x%llx (byte %llu of a cuMemAddressReserve range) was touched where no "
                             "chunk is mapped\n",
                             (unsigned long long)a, (unsigned long long)(a - fake_vmm.res[i].base));
            if (n > 0 && write(2, msg, (size_t)n) < 0) _exit(3);
            _exit(3);
        }
    signal(sig, SIG_DFL); /* anything else: the ordinary crash */
    raise(sig);
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags flags) {
    if (!g || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        flags != CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return FAKE_INVALID_VALUE;
    *g = fake_granularity();
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    size_t g = fake_granularity();
    if (!p || size == 0 || size % g || addr || flags || (align && align % g)) return FAKE_INVALID_VALUE;
    int slot = 0;
    while (slot < FAKE_MAX_RESERVED && fake_vmm.res[slot].size) slot++;
    if (slot == FAKE_MAX_RESERVED) return CUDA_ERROR_OUT_OF_MEMORY;
    /* aligned to the granularity, as CUDA's reservations are (cuMemMap wants aligned addresses): a
     * granularity above the system's page reserves g more and unmaps the ends */
    char *raw = mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    char *m = raw + (g - (uintptr_t)raw % g) % g;
    if (m > raw) munmap(raw, (size_t)(m - raw));
    if (raw + size + g > m + size) munmap(m + size, (size_t)(raw + size + g - (m + size)));
    if (!fake_vmm.handler) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = fake_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        fake_vmm.handler = 1;
    }
    fake_vmm.res[slot].base = (uintptr_t)m, fake_vmm.res[slot].size = size;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    for (int i = 0; i < FAKE_MAX_RESERVED; i++)
        if (fake_vmm.res[i].base == (uintptr_t)p && fake_vmm.res[i].size == size) {
            for (long long k = 0; k < fake_vmm.nmaps; k++) /* CUDA: every mapping in it must be gone */
                if (fake_vmm.maps[k].chunk >= 0 && fake_vmm.maps[k].addr >= (uintptr_t)p &&
                    fake_vmm.maps[k].addr < (uintptr_t)p + size)
                    return FAKE_INVALID_VALUE;
            munmap((void *)(uintptr_t)p, size);
            fake_vmm.res[i].size = 0, fake_vmm.res[i].base = 0;
            return CUDA_SUCCESS;
        }
    return FAKE_INVALID_VALUE;
}

static void fake_chunk_free(long long h) {
    struct FakeChunk *c = &fake_vmm.chunks[h];
    /* the file's pages go back to the system; the piece is not reused (a run makes few) */
    fallocate(fake_vmm.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)c->off, (off_t)c->size);
    fake_vmm.physical -= c->size, fake_live_bytes -= c->size;
    c->size = 0;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    if (!h || !prop || flags || size == 0 || size % fake_granularity() || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return FAKE_INVALID_VALUE;
    if (fake.oom_above && size > fake.oom_above) return CUDA_ERROR_OUT_OF_MEMORY;
    if (fake_vmm.fd < 0 && (fake_vmm.fd = memfd_create("fake_cuda_chunks", MFD_CLOEXEC)) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (fake_vmm.nchunks == fake_vmm.cap) {
        long long c = fake_vmm.cap ? 2 * fake_vmm.cap : 256;
        struct FakeChunk *n = realloc(fake_vmm.chunks, (size_t)c * sizeof *n);
        if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
        fake_vmm.chunks = n, fake_vmm.cap = c;
    }
    size_t off = fake_vmm.bytes;
    if (ftruncate(fake_vmm.fd, (off_t)(off + size))) return CUDA_ERROR_OUT_OF_MEMORY;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fake_vmm.fd, (off_t)off);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(m, 0xff, size); /* NaN: what nothing wrote shows */
    munmap(m, size);
    fake_vmm.bytes += size, fake_vmm.physical += size, fake_live_bytes += size;
    fake_vmm.chunks[fake_vmm.nchunks] = (struct FakeChunk){off, size, 1, 0};
    *h = (CUmemGenericAllocationHandle)(++fake_vmm.nchunks); /* 1-based: 0 is no handle */
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    if (h == 0 || (long long)h > fake_vmm.nchunks || !fake_vmm.chunks[h - 1].live) return FAKE_INVALID_VALUE;
    fake_vmm.chunks[h - 1].live = 0;
    if (fake_vmm.chunks[h - 1].maps == 0) fake_chunk_free((long long)h - 1); /* else when its last mapping goes, as CUDA's */
    return CUDA_SUCCESS;
}

static int fake_reserved(uintptr_t a, size_t size) {
    for (int i = 0; i < FAKE_MAX_RESERVED; i++)
        if (fake_vmm.res[i].size && a >= fake_vmm.res[i].base && a + size <= fake_vmm.res[i].base + fake_vmm.res[i].size)
            return 1;
    return 0;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long flags) {
    size_t g = fake_granularity();
    if (flags || h == 0 || (long long)h > fake_vmm.nchunks || !fake_vmm.chunks[h - 1].live || size % g || off % g ||
        (uintptr_t)p % g || off + size > fake_vmm.chunks[h - 1].size || !fake_reserved((uintptr_t)p, size))
        return FAKE_INVALID_VALUE;
    for (long long k = 0; k < fake_vmm.nmaps; k++) /* CUDA refuses a range already mapped */
        if (fake_vmm.maps[k].chunk >= 0 && fake_vmm.maps[k].addr < (uintptr_t)p + size &&
            (uintptr_t)p < fake_vmm.maps[k].addr + fake_vmm.maps[k].size)
            return FAKE_INVALID_VALUE;
    long long slot = 0;
    while (slot < fake_vmm.nmaps && fake_vmm.maps[slot].chunk >= 0) slot++;
    if (slot == fake_vmm.nmaps) {
        if (!fake_vmm.maps && !(fake_vmm.maps = calloc(FAKE_MAX_MAPS, sizeof *fake_vmm.maps))) return CUDA_ERROR_OUT_OF_MEMORY;
        if (fake_vmm.nmaps == FAKE_MAX_MAPS) return FAKE_OUT_OF_RESOURCES;
        fake_vmm.nmaps++;
    }
    /* PROT_NONE until cuMemSetAccess, as CUDA's mapping is inaccessible until then */
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fake_vmm.fd,
                   (off_t)(fake_vmm.chunks[h - 1].off + off));
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    fake_vmm.maps[slot].addr = (uintptr_t)p, fake_vmm.maps[slot].size = size, fake_vmm.maps[slot].chunk = (long long)h - 1;
    fake_vmm.chunks[h - 1].maps++;
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return FAKE_INVALID_VALUE;
    /* every page of the range must be mapped (CUDA refuses otherwise) */
    size_t covered = 0;
    for (long long k = 0; k < fake_vmm.nmaps; k++)
        if (fake_vmm.maps[k].chunk >= 0 && fake_vmm.maps[k].addr >= (uintptr_t)p &&
            fake_vmm.maps[k].addr + fake_vmm.maps[k].size <= (uintptr_t)p + size)
            covered += fake_vmm.maps[k].size;
    if (covered != size) return FAKE_INVALID_VALUE;
    return mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) ? FAKE_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    size_t covered = 0;
    for (long long k = 0; k < fake_vmm.nmaps; k++)
        if (fake_vmm.maps[k].chunk >= 0 && fake_vmm.maps[k].addr >= (uintptr_t)p &&
            fake_vmm.maps[k].addr + fake_vmm.maps[k].size <= (uintptr_t)p + size)
            covered += fake_vmm.maps[k].size;
    if (size == 0 || covered != size) return FAKE_INVALID_VALUE; /* CUDA unmaps whole mappings alone */
    /* back to an inaccessible reservation */
    if (mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        return FAKE_INVALID_VALUE;
    for (long long k = 0; k < fake_vmm.nmaps; k++)
        if (fake_vmm.maps[k].chunk >= 0 && fake_vmm.maps[k].addr >= (uintptr_t)p &&
            fake_vmm.maps[k].addr + fake_vmm.maps[k].size <= (uintptr_t)p + size) {
            struct FakeChunk *c = &fake_vmm.chunks[fake_vmm.maps[k].chunk];
            if (--c->maps == 0 && !c->live && c->size) fake_chunk_free(fake_vmm.maps[k].chunk);
            fake_vmm.maps[k].chunk = -1;
        }
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    CUresult rc;
    if (fake_queue_copy(s, 1, (void *)(uintptr_t)dst, src, n, &rc)) return rc;
    if (fake_capture) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
    fake.htod_bytes += (long long)n;
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    CUresult rc;
    if (fake_queue_copy(s, 0, dst, (const void *)(uintptr_t)src, n, &rc)) return rc;
    if (fake_capture) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
    fake.dtoh_bytes += (long long)n;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    CUresult rc;
    if (fake_queue_copy(s, 2, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, &rc)) return rc;
    if (fake_capture) return fake_rec_copy(dst, src, n);
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    (void)s;
    if (fake_capture) return fake_rec_memset(8, p, 0, v, n, 1);
    memset((void *)(uintptr_t)p, v, n);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD2D32Async(CUdeviceptr p, size_t pitch, unsigned int v, size_t width, size_t height, CUstream s) {
    (void)s;
    if (pitch % 4 || (height > 1 && pitch < width * 4)) return FAKE_INVALID_VALUE;
    if (fake_capture) return fake_rec_memset(32, p, pitch, v, width, height);
    for (size_t r = 0; r < height; r++) {
        uint32_t *row = (uint32_t *)(uintptr_t)(p + r * pitch);
        for (size_t c = 0; c < width; c++) row[c] = v;
    }
    return CUDA_SUCCESS;
}

/* ---- modules --------------------------------------------------------------------------------- */

typedef struct FakeFunction {
    char name[64];
    int emu; /* the emulated kernel's index (MBT_FAKE_CUDA_EMU), else -1 */
} FakeFunction;

typedef struct FakeModule {
    char *text;
    FakeFunction fns[512];
    int nfns;
} FakeModule;

/* The error log buffer among JIT options, if any. */
static void fake_log(unsigned int n, CUjit_option *opts, void **vals, const char *msg) {
    char *buf = NULL;
    size_t cap = 0;
    for (unsigned int i = 0; i < n; i++) {
        if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) buf = vals[i];
        if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) cap = (size_t)(uintptr_t)vals[i];
    }
    if (buf && cap) {
        strncpy(buf, msg, cap - 1);
        buf[cap - 1] = 0;
    }
}

CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *opts, void **vals) {
    if (fake_emu()) { /* the image is the program's real one; its functions come from the emulator */
        FakeModule *mod = calloc(1, sizeof *mod);
        *m = (CUmodule)(void *)mod;
        return CUDA_SUCCESS;
    }
    if (memcmp(image, FAKE_CUBIN, strlen(FAKE_CUBIN)) != 0) {
        fake_log(n, opts, vals, "fake: not a fake cubin\nsecond line");
        return FAKE_INVALID_IMAGE;
    }
    FakeModule *mod = calloc(1, sizeof *mod);
    mod->text = strdup(image);
    *m = (CUmodule)(void *)mod;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
    FakeModule *mod = (FakeModule *)(void *)m;
    free(mod->text);
    free(mod);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    FakeModule *mod = (FakeModule *)(void *)m;
    if (fake_emu()) {
        int k = emu.find(name);
        if (k < 0 || mod->nfns == 512 || strlen(name) >= 64) return FAKE_NOT_FOUND;
        FakeFunction *fn = &mod->fns[mod->nfns++];
        strcpy(fn->name, name);
        fn->emu = k;
        *f = (CUfunction)(void *)fn;
        return CUDA_SUCCESS;
    }
    for (const char *line = strchr(mod->text, '\n'); line; line = strchr(line + 1, '\n')) {
        size_t len = strcspn(line + 1, "\n");
        if (len == strlen(name) && strncmp(line + 1, name, len) == 0 && mod->nfns < 64 && len < 64) {
            FakeFunction *fn = &mod->fns[mod->nfns++];
            memcpy(fn->name, name, len + 1);
            fn->emu = -1;
            *f = (CUfunction)(void *)fn;
            return CUDA_SUCCESS;
        }
    }
    return FAKE_NOT_FOUND;
}

typedef struct FakeLink {
    char *cubin;
    size_t size;
    unsigned int nopts;
    CUjit_option opts[8];
    void *vals[8];
} FakeLink;

CUresult cuLinkCreate_v2(unsigned int n, CUjit_option *opts, void **vals, CUlinkState *out) {
    FakeLink *l = calloc(1, sizeof *l);
    l->nopts = n < 8 ? n : 8;
    for (unsigned int i = 0; i < l->nopts; i++) {
        l->opts[i] = opts[i];
        l->vals[i] = vals[i];
    }
    *out = (CUlinkState)(void *)l;
    return CUDA_SUCCESS;
}

CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name, unsigned int n,
                          CUjit_option *opts, void **vals) {
    (void)name, (void)n, (void)opts, (void)vals;
    FakeLink *l = (FakeLink *)(void *)state;
    const char *ptx = data;
    if (type != CU_JIT_INPUT_PTX || size != strlen(ptx) + 1 || strncmp(ptx, FAKE_PTX, strlen(FAKE_PTX)) != 0) {
        fake_log(l->nopts, l->opts, l->vals, "fake ptxas: not fake PTX");
        return FAKE_INVALID_PTX;
    }
    const char *names = ptx + strlen(FAKE_PTX);
    l->size = strlen(FAKE_CUBIN) + strlen(names) + 1;
    l->cubin = malloc(l->size);
    strcpy(l->cubin, FAKE_CUBIN);
    strcat(l->cubin, names);
    return CUDA_SUCCESS;
}

CUresult cuLinkComplete(CUlinkState state, void **cubin, size_t *size) {
    FakeLink *l = (FakeLink *)(void *)state;
    if (!l->cubin) return FAKE_INVALID_VALUE;
    fake.links++;
    *cubin = l->cubin;
    *size = l->size;
    return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state) {
    FakeLink *l = (FakeLink *)(void *)state;
    free(l->cubin);
    free(l);
    return CUDA_SUCCESS;
}

/* ---- streams, events ------------------------------------------------------------------------- */
/* The first stream created (the runtime's compute stream) runs every operation at once. Any other
 * stream created while it lives (the copy stream of offload { activations = host }, the
 * data-parallel buckets' communication stream) is a FakeQueue: its copies, kernel launches (their
 * parameters copied by value) and host functions (cuLaunchHostFunc: fake_nccl.c's groups queued
 * on it) are queued and run only when something must see them done - another stream waiting
 * for an event recorded after them (cuStreamWaitEvent), a wait for the stream or the event, or its
 * destruction. That is the latest moment a real GPU could run them, so a wait the runtime leaves
 * out shows: a read back that is not waited for leaves the arena's old bytes where the step reads,
 * and a write that is not waited for copies bytes the step has overwritten since. (The other order
 * - a copy run before the compute stream reached what it waits for - cannot show: the compute
 * stream has always run everything it was given.) MBT_FAKE_CUDA_DROP_WAIT=N ignores the Nth wait of
 * the compute stream for a queue (from 1), so that a test can check a missing wait is caught;
 * MBT_FAKE_CUDA_WAITS=1 prints, for each such wait, the copies it runs (on stderr; and on a line of
 * its own the launches and host functions it runs, when there are any, and how many operations
 * queued after its event it leaves queued, when any); a graph's
 * joins count and print among them ("in a graph"). On the fake's
 * clock a queue's copies take n / 25 GB/s each, one after another, so events on it time them; the
 * compute stream's wait for a queue's event moves its clock on to that event's time (the launches
 * after the wait start when the copies end, as on a GPU), and an event on a queue that has not run
 * up to it is not ready to be timed (cuEventElapsedTime: CUDA_ERROR_NOT_READY, as CUDA's), and a
 * cuMemFree runs every queue first (CUDA's free synchronises; a copy still queued may read the
 * memory).
 * In a capture, a queue that waits for an event of the capturing stream joins it (below). */

static int fake_stream;
static int fake_stream_live;

typedef struct FakeQueued {
    int kind; /* 0 device to host, 1 host to device, 2 device to device, 3 a kernel launch, 4 a host function */
    void *dst;
    const void *src;
    size_t n;
    void *rec;               /* kind 3: the launch (a FakeOp 'K', parameters copied by value) */
    void (*host)(void *arg); /* kind 4: cuLaunchHostFunc's function and its argument (dst) */
} FakeQueued;
static void fake_queued_launch(void *rec); /* runs (and frees) a queued launch */

struct FakeQueue {
    FakeQueued *ops;
    long long n, cap, done; /* ops issued [0, n), of which [0, done) have run */
    /* a capture of the compute stream that this queue joined (it waited for an event recorded in
     * it): its copies are recorded in the graph ('Q'), cap_n of them, the compute stream's waits
     * for it too ('J'), the last covering cap_joined; copies after the last join fail the capture,
     * as CUDA's CUDA_ERROR_STREAM_CAPTURE_UNJOINED */
    int capturing;
    long long cap_n, cap_joined;
    double clock; /* when its last copy would end on the fake's clock: copies take n / 25 GB/s */
};

#define FAKE_MAX_QUEUES 8
static FakeQueue *fake_queues[FAKE_MAX_QUEUES]; /* the live ones, for cuStreamEndCapture */

static long long fake_waits; /* the compute stream's waits for a queue so far (a graph's joins too) */

/* Counts a wait of the compute stream for a queue that would run `out` copies to the host and
 * `back` back (`where`: "" or " in a graph"), prints it (MBT_FAKE_CUDA_WAITS=1), and says whether
 * MBT_FAKE_CUDA_DROP_WAIT drops it. */
static int fake_wait_dropped(long long out, long long back, const char *where) {
    fake_waits++;
    const char *trace = getenv("MBT_FAKE_CUDA_WAITS"), *drop = getenv("MBT_FAKE_CUDA_DROP_WAIT");
    if (trace && *trace == '1')
        fprintf(stderr, "fake_cuda: wait %lld runs %lld copies to the host, %lld back%s\n", fake_waits, out, back, where);
    return drop && *drop && atoll(drop) == fake_waits;
}

/* Runs q's operations up to (not including) the upto-th. */
static void fake_queue_run(FakeQueue *q, long long upto) {
    for (; q->done < upto && q->done < q->n; q->done++) {
        const FakeQueued *o = &q->ops[q->done];
        if (o->kind == 3) {
            fake_queued_launch(o->rec);
            continue;
        }
        if (o->kind == 4) {
            o->host(o->dst);
            continue;
        }
        if (o->kind == 0) fake.dtoh_bytes += (long long)o->n;
        else if (o->kind == 1) fake.htod_bytes += (long long)o->n;
        memmove(o->dst, o->src, o->n);
    }
}

static void fake_queues_run_all(void) {
    if (fake_capture) return; /* (a capture records; nothing of it has run) */
    for (int i = 0; i < FAKE_MAX_QUEUES; i++)
        if (fake_queues[i]) fake_queue_run(fake_queues[i], fake_queues[i]->n);
}

static int fake_is_queue(CUstream s) { return s && s != (CUstream)(void *)&fake_stream; }
/* For fake_nccl.c: whether a group on stream s is to run with s's queue (not at ncclGroupEnd). */
int fake_stream_is_queue(void *s) { return fake_is_queue((CUstream)s); }

/* Queues a copy on a FakeQueue (1), or 0 when s is the compute stream. */
static int fake_queue_copy(CUstream s, int kind, void *dst, const void *src, size_t n, CUresult *rc) {
    if (!fake_is_queue(s)) return 0;
    FakeQueue *q = (FakeQueue *)(void *)s;
    if (fake_capture) {
        *rc = q->capturing ? fake_rec_queued(q, kind, dst, src, n) : (fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED);
        return 1;
    }
    if (q->n == q->cap) {
        long long c = q->cap ? 2 * q->cap : 64;
        FakeQueued *o = realloc(q->ops, (size_t)c * sizeof *o);
        if (!o) {
            *rc = CUDA_ERROR_OUT_OF_MEMORY;
            return 1;
        }
        q->ops = o, q->cap = c;
    }
    q->ops[q->n++] = (FakeQueued){kind, dst, src, n, NULL, NULL};
    q->clock = (q->clock > fake.clock_ms ? q->clock : fake.clock_ms) + (double)n / 25e6;
    *rc = CUDA_SUCCESS;
    return 1;
}

/* A kernel launch (rec, kind 3) or a host function (kind 4) on a queue, outside a capture: run
 * when the queue is run, after the copies and launches before it (the data-parallel buckets'
 * communication stream: its axpys, and fake_nccl.c's groups through cuLaunchHostFunc). */
static CUresult fake_queue_other(FakeQueue *q, int kind, void *rec, void (*host)(void *), void *arg) {
    if (fake_capture) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED; /* (not needed: the buckets run uncaptured) */
    if (q->n == q->cap) {
        long long c = q->cap ? 2 * q->cap : 64;
        FakeQueued *o = realloc(q->ops, (size_t)c * sizeof *o);
        if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
        q->ops = o, q->cap = c;
    }
    q->ops[q->n++] = (FakeQueued){kind, arg, NULL, 0, rec, host};
    q->clock = (q->clock > fake.clock_ms ? q->clock : fake.clock_ms) + 0.5;
    return CUDA_SUCCESS;
}

/* cuLaunchHostFunc: on the compute stream at once; on a queue when the queue runs. */
CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *arg) {
    if (!fn) return FAKE_INVALID_VALUE;
    if (fake_is_queue(s)) return fake_queue_other((FakeQueue *)(void *)s, 4, NULL, fn, arg);
    if (fake_capture) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
    fn(arg);
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    if (flags != CU_STREAM_NON_BLOCKING) return FAKE_INVALID_VALUE;
    if (!fake_stream_live) {
        fake_stream_live = 1;
        *s = (CUstream)(void *)&fake_stream;
        return CUDA_SUCCESS;
    }
    int slot = 0;
    while (slot < FAKE_MAX_QUEUES && fake_queues[slot]) slot++;
    if (slot == FAKE_MAX_QUEUES) return FAKE_OUT_OF_RESOURCES;
    FakeQueue *q = calloc(1, sizeof *q);
    if (!q) return CUDA_ERROR_OUT_OF_MEMORY;
    fake_queues[slot] = q;
    *s = (CUstream)(void *)q;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s) {
    if (!fake_is_queue(s)) {
        fake_stream_live = 0;
        return CUDA_SUCCESS;
    }
    FakeQueue *q = (FakeQueue *)(void *)s;
    fake_queue_run(q, q->n); /* as CUDA does: the work queued completes */
    for (int i = 0; i < FAKE_MAX_QUEUES; i++)
        if (fake_queues[i] == q) fake_queues[i] = NULL;
    free(q->ops);
    free(q);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
    if (fake_capture) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
    if (fake_is_queue(s)) {
        FakeQueue *q = (FakeQueue *)(void *)s;
        fake_queue_run(q, q->n);
        return CUDA_SUCCESS;
    }
    return s == (CUstream)(void *)&fake_stream ? CUDA_SUCCESS : FAKE_INVALID_VALUE;
}

/* Every call ran when it was made: the stream is always idle. */
CUresult cuStreamQuery(CUstream s) {
    if (fake_capture) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
    return s == (CUstream)(void *)&fake_stream ? CUDA_SUCCESS : FAKE_INVALID_VALUE;
}

typedef struct FakeEvent {
    double ms;
    int recorded;
    int captured; /* recorded during a capture: seq counts the queue's recorded copies (cap_n) */
    FakeQueue *q; /* recorded on a queue: after its first seq operations; NULL: on the compute stream */
    long long seq;
} FakeEvent;

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    *e = (CUevent)(void *)calloc(1, sizeof(FakeEvent));
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e) {
    free((void *)e);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
    FakeEvent *ev = (FakeEvent *)(void *)e;
    FakeQueue *q = fake_is_queue(s) ? (FakeQueue *)(void *)s : NULL;
    if (fake_capture) {
        /* in a capture: an event of the compute stream (a fork point) or of a queue that joined it
         * (a join point); the timing events on a queue that did not join, never */
        if (q && !q->capturing) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
        ev->recorded = ev->captured = 1;
        ev->q = q;
        ev->seq = q ? q->cap_n : 0;
        return CUDA_SUCCESS;
    }
    ev->ms = q && q->clock > fake.clock_ms ? q->clock : fake.clock_ms;
    ev->recorded = 1;
    ev->captured = 0;
    ev->q = q;
    ev->seq = q ? q->n : 0;
    return CUDA_SUCCESS;
}

/* s waits for e: the compute stream waiting for a queue runs the queue up to the event (unless
 * MBT_FAKE_CUDA_DROP_WAIT drops this wait); a queue waiting for the compute stream has nothing to
 * wait for (the compute stream has run everything it was given). */
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    FakeEvent *ev = (FakeEvent *)(void *)e;
    if (flags != 0 || !ev) return FAKE_INVALID_VALUE;
    if (fake_capture) {
        if (!ev->recorded || !ev->captured) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED; /* not of this capture */
        if (fake_is_queue(s)) { /* a queue waiting for the compute stream joins the capture */
            if (ev->q) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
            ((FakeQueue *)(void *)s)->capturing = 1;
            return CUDA_SUCCESS;
        }
        return ev->q ? fake_rec_join(ev->q, ev->seq) : CUDA_SUCCESS;
    }
    if (!ev->recorded || !ev->q || fake_is_queue(s)) return CUDA_SUCCESS;
    long long out = 0, back = 0, launches = 0, hosts = 0;
    for (long long i = ev->q->done; i < ev->seq && i < ev->q->n; i++) {
        out += ev->q->ops[i].kind == 0, back += ev->q->ops[i].kind == 1;
        launches += ev->q->ops[i].kind == 3, hosts += ev->q->ops[i].kind == 4;
    }
    int dropped = fake_wait_dropped(out, back, "");
    const char *trace = getenv("MBT_FAKE_CUDA_WAITS");
    if (trace && *trace == '1' && launches + hosts > 0) /* (a line of its own: the copies' line keeps its fields) */
        fprintf(stderr, "fake_cuda: wait %lld %s %lld launches and %lld host functions queued on a second stream\n", fake_waits,
                dropped ? "left out, with" : "also runs", launches, hosts);
    long long after = ev->q->n - (ev->seq > ev->q->done ? ev->seq : ev->q->done);
    if (trace && *trace == '1' && after > 0) /* (per-buffer waits: copies queued after the one waited for stay queued) */
        fprintf(stderr, "fake_cuda: wait %lld leaves %lld operations queued after its event\n", fake_waits, after);
    if (dropped) return CUDA_SUCCESS;
    fake_queue_run(ev->q, ev->seq);
    if (ev->ms > fake.clock_ms) fake.clock_ms = ev->ms;
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent e) {
    FakeEvent *ev = (FakeEvent *)(void *)e;
    if (!ev->recorded) return FAKE_INVALID_VALUE;
    if (ev->q) fake_queue_run(ev->q, ev->seq);
    return CUDA_SUCCESS;
}

/* an event on the compute stream has run (every call there ran when made); on a queue, once the
 * queue ran up to it */
CUresult cuEventQuery(CUevent e) {
    FakeEvent *ev = (FakeEvent *)(void *)e;
    if (!ev->recorded) return CUDA_SUCCESS;
    return !ev->q || ev->q->done >= ev->seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    const FakeEvent *x = (const FakeEvent *)(void *)a, *y = (const FakeEvent *)(void *)b;
    if (!x->recorded || !y->recorded) return FAKE_INVALID_VALUE;
    if (cuEventQuery(a) != CUDA_SUCCESS || cuEventQuery(b) != CUDA_SUCCESS) return CUDA_ERROR_NOT_READY;
    *ms = (float)(y->ms - x->ms);
    return CUDA_SUCCESS;
}

/* ---- kernels --------------------------------------------------------------------------------- */

static CUresult fake_rec_launch(const FakeFunction *fn, unsigned gx, unsigned gy, unsigned bx, void **params);
static CUresult fake_queue_launch(FakeQueue *q, const FakeFunction *fn, unsigned gx, unsigned gy, unsigned bx, void **params);

static void fake_axpy(void **p) {
    float *dst = *(float **)p[0];
    const float *src = *(const float **)p[1];
    float scale = *(float *)p[2];
    long long n = *(long long *)p[3];
    for (long long i = 0; i < n; i++) dst[i] = dst[i] + scale * src[i];
}

static void fake_axpy_table(void **p) {
    const long long *t = *(const long long **)p[0];
    long long count = *(long long *)p[1];
    float scale = *(float *)p[2];
    for (long long e = 0; e < count; e++) {
        float *dst = (float *)(uintptr_t)t[3 * e];
        const float *src = (const float *)(uintptr_t)t[3 * e + 1];
        for (long long i = 0; i < t[3 * e + 2]; i++) dst[i] = dst[i] + scale * src[i];
    }
}

static void fake_scale(void **p) {
    float *x = *(float **)p[0];
    float scale = *(float *)p[1];
    long long rows = *(long long *)p[2], cols = *(long long *)p[3], pitch = *(long long *)p[4];
    for (long long r = 0; r < rows; r++)
        for (long long c = 0; c < cols; c++) x[r * pitch + c] *= scale;
}

static void fake_sumsq(void **p) {
    const float *x = *(const float **)p[0];
    long long n = *(long long *)p[1], block = *(long long *)p[2];
    double *partial = *(double **)p[3];
    for (long long b = 0; b * block < n; b++) {
        double s = 0;
        for (long long i = b * block; i < n && i < (b + 1) * block; i++) s += (double)x[i] * x[i];
        partial[b] = s;
    }
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                        unsigned int bz, unsigned int shared, CUstream s, void **params, void **extra) {
    const FakeFunction *fn = (const FakeFunction *)(void *)f;
    if (gz != 1 || by != 1 || bz != 1 || shared != 0 || extra) return FAKE_INVALID_VALUE;
    if (fake_is_queue(s)) return fake_queue_launch((FakeQueue *)(void *)s, fn, gx, gy, bx, params);
    if (s != (CUstream)(void *)&fake_stream) return FAKE_INVALID_VALUE;
    if (fake_capture) return fake_rec_launch(fn, gx, gy, bx, params);
    snprintf(fake.last_kernel, sizeof fake.last_kernel, "%s", fn->name);
    fake.last_grid[0] = gx;
    fake.last_grid[1] = gy;
    fake.last_block = bx;
    fake.launches++;
    if (fn->emu >= 0) {
        unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
        char err[600];
        if (emu.launch(fn->emu, grid, block, params, err, sizeof err)) {
            fprintf(stderr, "fake_cuda: %s\n", err);
            return FAKE_LAUNCH_FAILED;
        }
        fake.clock_ms += 0.5;
        return CUDA_SUCCESS;
    }
    if (strcmp(fn->name, "fake_fail") == 0) return FAKE_OUT_OF_RESOURCES;
    if (strcmp(fn->name, "mbt_rt_axpy") == 0) fake_axpy(params);
    else if (strcmp(fn->name, "mbt_rt_axpy_table") == 0) fake_axpy_table(params);
    else if (strcmp(fn->name, "mbt_rt_scale") == 0) fake_scale(params);
    else if (strcmp(fn->name, "mbt_rt_sumsq_blocks") == 0) {
        if (bx != 256) return FAKE_INVALID_VALUE; /* the kernel's reduction tree is for exactly 256 threads */
        fake_sumsq(params);
    } else if (strcmp(fn->name, "fake_fill7") == 0) {
        float *buf = *(float **)params[0];
        for (unsigned long i = 0; i < (unsigned long)gx * bx; i++) buf[i] = 7;
    }
    fake.clock_ms += 0.5;
    return CUDA_SUCCESS;
}

/* NCCL is looked up in its own library, never here (the emulated GPU's is fake_nccl.c). */

/* ---- stream capture: the record and its replay ------------------------------------------------ */

#define FAKE_MAX_PARAMS 512

struct FakeOp {
    char kind; /* 'K' launch, 'C' device copy, 'M' memset (8 or 32 bits), 'G' matmul; a queue's copy 'Q', a join 'J' */
    const FakeFunction *fn;
    unsigned gx, gy, bx;
    int nparams;
    unsigned char *blob; /* the parameters' values, each at a 16-byte-aligned offset */
    size_t off[FAKE_MAX_PARAMS];
    CUdeviceptr dst, src;
    size_t n, pitch, width, height;
    unsigned v;
    int bits;
    FakeDesc desc;
    FakeLayout la, lb, lc, ld;
    const void *a, *b, *c;
    void *d;
    float alpha, beta;
    cublasLtMatmulAlgo_t algo;
};

static FakeOp *fake_op(void) {
    FakeGraph *g = fake_capture;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        FakeOp *ops = realloc(g->ops, (size_t)cap * sizeof *ops);
        if (!ops) return NULL;
        g->ops = ops;
        g->cap = cap;
    }
    FakeOp *op = &g->ops[g->n++];
    memset(op, 0, sizeof *op);
    return op;
}

static CUresult fake_rec_copy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    FakeOp *op = fake_op();
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = 'C', op->dst = dst, op->src = src, op->n = n;
    return CUDA_SUCCESS;
}

static CUresult fake_rec_memset(int bits, CUdeviceptr p, size_t pitch, unsigned v, size_t width, size_t height) {
    FakeOp *op = fake_op();
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = 'M', op->bits = bits, op->dst = p, op->pitch = pitch, op->v = v, op->width = width, op->height = height;
    return CUDA_SUCCESS;
}

/* A queue's copy in a capture ('Q': bits its kind, d and a its ends, b the queue, v its index among
 * the queue's copies in the graph), and the compute stream's wait for the queue's first seq ('J'). */
static CUresult fake_rec_queued(FakeQueue *q, int kind, void *dst, const void *src, size_t n) {
    FakeOp *op = fake_op();
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = 'Q', op->bits = kind, op->d = dst, op->a = src, op->n = n, op->b = q, op->v = (unsigned)q->cap_n++;
    return CUDA_SUCCESS;
}

static CUresult fake_rec_join(FakeQueue *q, long long seq) {
    FakeOp *op = fake_op();
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = 'J', op->b = q, op->n = (size_t)seq;
    if (seq > q->cap_joined) q->cap_joined = seq;
    return CUDA_SUCCESS;
}

/* The parameter sizes of fn: the runtime's own kernels and the test kernels here, the emulated
 * ones from the emulator. -1: unknown (the capture then fails). */
static int fake_param_sizes(const FakeFunction *fn, const size_t **sizes) {
    static const size_t axpy[] = {8, 8, 4, 8}, table[] = {8, 8, 4}, scale[] = {8, 4, 8, 8, 8}, sumsq[] = {8, 8, 8, 8},
                        one[] = {8};
    if (fn->emu >= 0) return emu.params ? emu.params(fn->emu, sizes) : -1;
    if (strcmp(fn->name, "mbt_rt_axpy") == 0) return *sizes = axpy, 4;
    if (strcmp(fn->name, "mbt_rt_axpy_table") == 0) return *sizes = table, 3;
    if (strcmp(fn->name, "mbt_rt_scale") == 0) return *sizes = scale, 5;
    if (strcmp(fn->name, "mbt_rt_sumsq_blocks") == 0) return *sizes = sumsq, 4;
    if (strcmp(fn->name, "fake_fill7") == 0 || strcmp(fn->name, "fake_fail") == 0) return *sizes = one, 1;
    return -1;
}

/* op becomes launch 'K' of fn with the np parameters' values copied (each at a 16-byte-aligned
 * offset of op->blob). */
static CUresult fake_op_launch(FakeOp *op, const FakeFunction *fn, unsigned gx, unsigned gy, unsigned bx, void **params, int np,
                               const size_t *sizes) {
    size_t total = 0;
    for (int i = 0; i < np; i++) {
        op->off[i] = total;
        total += (sizes[i] + 15) / 16 * 16;
    }
    op->blob = malloc(total ? total : 1);
    if (!op->blob) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < np; i++) memcpy(op->blob + op->off[i], params[i], sizes[i]);
    op->kind = 'K', op->fn = fn, op->gx = gx, op->gy = gy, op->bx = bx, op->nparams = np;
    return CUDA_SUCCESS;
}

static CUresult fake_rec_launch(const FakeFunction *fn, unsigned gx, unsigned gy, unsigned bx, void **params) {
    const size_t *sizes = NULL;
    int np = fake_param_sizes(fn, &sizes);
    if (np < 0 || np > FAKE_MAX_PARAMS) return fake_capture_rc = FAKE_CAPTURE_UNSUPPORTED;
    FakeOp *op = fake_op();
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    return fake_op_launch(op, fn, gx, gy, bx, params, np, sizes);
}

/* A launch on a queue: its parameters copied by value as a capture copies them (FakeOp 'K'), run
 * by fake_queued_launch when the queue runs. */
static CUresult fake_queue_launch(FakeQueue *q, const FakeFunction *fn, unsigned gx, unsigned gy, unsigned bx, void **params) {
    const size_t *sizes = NULL;
    int np = fake_param_sizes(fn, &sizes);
    if (np < 0 || np > FAKE_MAX_PARAMS) return FAKE_INVALID_VALUE;
    FakeOp *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = fake_op_launch(op, fn, gx, gy, bx, params, np, sizes);
    if (rc != CUDA_SUCCESS) {
        free(op);
        return rc;
    }
    rc = fake_queue_other(q, 3, op, NULL, NULL);
    if (rc != CUDA_SUCCESS) free(op->blob), free(op);
    return rc;
}

static void fake_queued_launch(void *rec) {
    FakeOp *op = rec;
    void *params[FAKE_MAX_PARAMS];
    for (int p = 0; p < op->nparams; p++) params[p] = op->blob + op->off[p];
    CUresult rc = cuLaunchKernel((CUfunction)(void *)op->fn, op->gx, op->gy, 1, op->bx, 1, 1, 0, (CUstream)(void *)&fake_stream,
                                 params, NULL);
    if (rc != CUDA_SUCCESS)
        fprintf(stderr, "fake_cuda: a launch of %s queued on a second stream failed (%d)\n", op->fn->name, (int)rc);
    free(op->blob);
    free(op);
}

cublasStatus_t fake_rec_matmul(cublasLtMatmulDesc_t d, const void *alpha, const void *a, cublasLtMatrixLayout_t al, const void *b,
                               cublasLtMatrixLayout_t bl, const void *beta, const void *c, cublasLtMatrixLayout_t cl, void *dst,
                               cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo) {
    FakeOp *op = fake_op();
    if (!op || !algo) return FAKE_LT_INVALID_VALUE;
    op->kind = 'G';
    op->desc = *(const FakeDesc *)(void *)d;
    op->la = *(const FakeLayout *)(void *)al, op->lb = *(const FakeLayout *)(void *)bl;
    op->lc = *(const FakeLayout *)(void *)cl, op->ld = *(const FakeLayout *)(void *)dl;
    op->alpha = *(const float *)alpha, op->beta = *(const float *)beta;
    op->a = a, op->b = b, op->c = c, op->d = dst, op->algo = *algo;
    return CUBLAS_STATUS_SUCCESS;
}

static void fake_graph_free(FakeGraph *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) free(g->ops[i].blob);
    free(g->ops);
    free(g);
}

CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    if (s != (CUstream)(void *)&fake_stream || fake_capture) return FAKE_INVALID_VALUE;
    if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) return FAKE_INVALID_VALUE; /* the runtime allocates lazily: relaxed */
    const char *no = getenv("MBT_FAKE_CUDA_NO_CAPTURE"); /* a driver that refuses every capture (tests/gpu/run.sh) */
    if (no && *no == '1') return FAKE_CAPTURE_UNSUPPORTED;
    fake_capture = calloc(1, sizeof *fake_capture);
    fake_capture_rc = CUDA_SUCCESS;
    return fake_capture ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
    if (s != (CUstream)(void *)&fake_stream || !fake_capture) return FAKE_INVALID_VALUE;
    FakeGraph *g = fake_capture;
    fake_capture = NULL;
    *graph = NULL;
    for (int i = 0; i < FAKE_MAX_QUEUES; i++) { /* every queue that joined must have been joined back */
        FakeQueue *q = fake_queues[i];
        if (!q || !q->capturing) continue;
        if (q->cap_n > q->cap_joined && fake_capture_rc == CUDA_SUCCESS) fake_capture_rc = FAKE_CAPTURE_UNJOINED;
        q->capturing = 0, q->cap_n = q->cap_joined = 0;
    }
    if (fake_capture_rc == FAKE_CAPTURE_UNJOINED) {
        fake_graph_free(g);
        return FAKE_CAPTURE_UNJOINED;
    }
    if (fake_capture_rc != CUDA_SUCCESS) {
        fake_graph_free(g);
        return FAKE_CAPTURE_INVALIDATED;
    }
    *graph = (CUgraph)(void *)g;
    return CUDA_SUCCESS;
}

/* The executable graph is the record itself (instantiating checks nothing more here). */
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    if (!graph || flags) return FAKE_INVALID_VALUE;
    *exec = (CUgraphExec)(void *)graph;
    FakeGraph *g = (FakeGraph *)(void *)graph;
    fake_graphs.captured++;
    fake_graphs.ops += g->n;
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    if (!exec || s != (CUstream)(void *)&fake_stream || fake_capture) return FAKE_INVALID_VALUE;
    const FakeGraph *g = (const FakeGraph *)(void *)exec;
    /* the queues' copies ('Q') wait until a join ('J') or the graph's end needs them, as on the
     * queue itself: run[i] marks the graph's op i done */
    unsigned char *run = calloc((size_t)g->n + 1, 1);
    if (!run) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < g->n; i++) {
        const FakeOp *op = &g->ops[i];
        CUresult rc = CUDA_SUCCESS;
        switch (op->kind) {
        case 'Q': break; /* run at its join */
        case 'J': {
            long long out = 0, back = 0;
            for (int j = 0; j < i; j++)
                if (!run[j] && g->ops[j].kind == 'Q' && g->ops[j].b == op->b && g->ops[j].v < op->n)
                    out += g->ops[j].bits == 0, back += g->ops[j].bits == 1;
            if (fake_wait_dropped(out, back, " in a graph")) break;
            for (int j = 0; j < i; j++)
                if (!run[j] && g->ops[j].kind == 'Q' && g->ops[j].b == op->b && g->ops[j].v < op->n) {
                    memmove(g->ops[j].d, g->ops[j].a, g->ops[j].n);
                    run[j] = 1;
                }
            break;
        }
        case 'C': rc = cuMemcpyDtoDAsync_v2(op->dst, op->src, op->n, s); break;
        case 'M':
            rc = op->bits == 8 ? cuMemsetD8Async(op->dst, (unsigned char)op->v, op->width, s)
                               : cuMemsetD2D32Async(op->dst, op->pitch, op->v, op->width, op->height, s);
            break;
        case 'K': {
            void *params[FAKE_MAX_PARAMS];
            for (int p = 0; p < op->nparams; p++) params[p] = op->blob + op->off[p];
            rc = cuLaunchKernel((CUfunction)(void *)op->fn, op->gx, op->gy, 1, op->bx, 1, 1, 0, s, params, NULL);
            break;
        }
        case 'G':
            rc = cublasLtMatmul((cublasLtHandle_t)(void *)&fake_handle, (cublasLtMatmulDesc_t)(void *)&op->desc, &op->alpha,
                                op->a, (cublasLtMatrixLayout_t)(void *)&op->la, op->b, (cublasLtMatrixLayout_t)(void *)&op->lb,
                                &op->beta, op->c, (cublasLtMatrixLayout_t)(void *)&op->lc, op->d,
                                (cublasLtMatrixLayout_t)(void *)&op->ld, &op->algo, NULL, 0, s) == CUBLAS_STATUS_SUCCESS
                     ? CUDA_SUCCESS
                     : FAKE_LAUNCH_FAILED;
            break;
        }
        if (rc != CUDA_SUCCESS) {
            free(run);
            return rc;
        }
    }
    for (int j = 0; j < g->n; j++) /* the graph is done when all of it is (a capture joins every queue back) */
        if (!run[j] && g->ops[j].kind == 'Q') memmove(g->ops[j].d, g->ops[j].a, g->ops[j].n);
    free(run);
    fake_graphs.launches++;
    return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
    (void)exec; /* the record is freed with its graph */
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
    fake_graph_free((FakeGraph *)(void *)graph);
    return CUDA_SUCCESS;
}
