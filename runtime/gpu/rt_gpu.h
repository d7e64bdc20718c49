/* rt_gpu.h - the GPU for the runtime's own use: opening a device, its memory, the program's module,
 * the passes over the gradient region, timing. What generated code calls (rt_gpu_launch, the GEMM,
 * copies) is in rt_program.h; this header is for train.c, generate.c and the tests.
 *
 * Pipeline position: beside the thread pool and BLAS (the CPU's equivalents). rt_cmd_train opens
 * an RtGpu when --device asks for one (auto: when a GPU is there and the program has a CUDA side),
 * allocates its regions on it and runs RtGpuProgram's functions instead of the CPU ones.
 *
 * No link-time dependency on CUDA: libcuda.so.1 (the driver API), libcublasLt.so and libnccl.so.2
 * are dlopen'ed when a GPU is asked for, and every function the runtime uses is looked up once into
 * one table of function pointers (gpu.c). An executable runs on a machine without CUDA; only
 * `--device cuda` then fails, saying which library was missing and where it was looked for.
 *
 * Errors name the call that failed, CUDA's name for the error and what the runtime was doing:
 * "cuMemAlloc (the activation arena, 1.2 GiB): CUDA_ERROR_OUT_OF_MEMORY: out of memory". */
#ifndef MBT_RT_GPU_H
#define MBT_RT_GPU_H

#include <stdint.h>
#include <stdio.h>

#include "rt_program.h"

/* What --device asked for. */
typedef enum RtDeviceWant {
    RT_DEVICE_AUTO, /* the GPU when one is there and the program has a CUDA side, else the CPU */
    RT_DEVICE_CPU,
    RT_DEVICE_CUDA, /* the GPU, or an error saying why not */
} RtDeviceWant;

/* Opens device 0 for `prog` (its module loaded: the cubin whose arch is the device's, else the
 * PTX of the highest virtual arch not above it, JIT-compiled once into the cache, below).
 * AUTO without a usable GPU returns RT_OK with *out NULL and *why saying why the CPU is used
 * ("no CUDA driver (libcuda.so.1: cannot open shared object file)", "the program was built
 * without CUDA"); CUDA gives the same reason as an RT_ERR_ARG error. `why` may be NULL; the
 * text it points to stays valid until the calling thread's next rt_gpu_open. */
RtStatus rt_gpu_open(RtGpu **out, const RtGpuProgram *prog, RtDeviceWant want, const char **why, RtError *err);
void rt_gpu_close(RtGpu *g); /* frees everything it allocated (NULL is fine) */
/* A data-parallel rank's GPU: later opens use device local_rank modulo the devices the driver
 * sees (CUDA_VISIBLE_DEVICES applies first); device 0 until this is called. */
void rt_gpu_bind_local_rank(int local_rank);

/* "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.2 GiB; driver 12.8; module: cubin sm_90" (or
 * "PTX compute_90, JIT-compiled" / "... from the cache"). */
const char *rt_gpu_describe(const RtGpu *g);
int rt_gpu_arch(const RtGpu *g); /* 90 for sm_90 */

/* ---- memory ---- */
/* Device memory, 256-byte aligned, zeroed; `what` names it in the error ("the activation arena"). */
RtStatus rt_gpu_alloc(RtGpu *g, void **dev, int64_t bytes, const char *what, RtError *err);
void rt_gpu_free(RtGpu *g, void *dev);
/* The device's free and total memory now (cuMemGetInfo: serve sizes its KV pool from the free). */
RtStatus rt_gpu_mem_info(RtGpu *g, int64_t *free_bytes, int64_t *total_bytes, RtError *err);
/* Page-locked host memory (the micro-batch staging buffers, so uploads overlap compute), zeroed. */
RtStatus rt_gpu_host_alloc(RtGpu *g, void **host, int64_t bytes, const char *what, RtError *err);
void rt_gpu_host_free(RtGpu *g, void *host);
RtStatus rt_gpu_zero(RtGpu *g, void *dev, int64_t bytes, RtError *err); /* queued memset */
RtStatus rt_gpu_sync(RtGpu *g, const char *what, RtError *err);         /* waits for the stream */
#define RT_GPU_LOSSES 64 /* rt_gpu_loss's losses queued at once: one more waits for the stream first */

/* ---- the gradient region (train.c's norm and clipping, as on the CPU) ---- */
/* partial[b] = the sum of squares of g[b x block, (b + 1) x block), in double, for b < ceil(n /
 * block); computed in a fixed order (deterministic) and downloaded. Waits. */
RtStatus rt_gpu_sumsq_blocks(RtGpu *g, const float *dev, int64_t n, int64_t block, double *partial, RtError *err);
RtStatus rt_gpu_scale(RtGpu *g, float *dev, float scale, int64_t n, RtError *err); /* dev[i] *= scale */

/* ---- offload { activations = host } (gpu_act.c, docs/memory.md) ---- */
/* Allocates `bytes` of page-locked host memory for the offloaded activations and a second stream
 * (the copy stream) with its events; once (a second call does nothing). */
RtStatus rt_gpu_act_open(RtGpu *g, int64_t bytes, RtError *err);
/* The plan's copies, queued: op 0 copies dev[0, len) to host byte off on the copy stream, op 1
 * host byte off back into dev[0, len), each after everything queued on the compute stream so far
 * (an event the copy stream waits for); op 2 makes the compute stream wait for every copy queued
 * so far (an event recorded on the copy stream). Nothing waits on the host. */
RtStatus rt_gpu_act_copy(RtGpu *g, int32_t op, int64_t off, void *dev, int64_t len, RtError *err);
int64_t rt_gpu_act_bytes(const RtGpu *g); /* the pinned memory allocated for them (0: none) */
/* offload { activations = nvme }: the copies go on to `store` (the caller's, open, of the plan's
 * size; it outlives the GPU's use of it) through RT_GPU_ACT_SLOTS slots of pinned staging of
 * `staging` bytes in all (0: RT_GPU_ACT_STAGING; each slot whole pages, no larger than a quarter of
 * the store), with the copy stream and its events; once. rt_gpu_act_copy then stages each copy
 * (gpu_act.c says how), and forward_backward is never captured. */
#define RT_GPU_ACT_STAGING ((int64_t)64 << 20)
struct RtStore;
RtStatus rt_gpu_act_open_nvme(RtGpu *g, struct RtStore *store, int64_t staging, RtError *err);
/* The copy stream's queued work finished, then it, its events and the pinned memory freed (again:
 * nothing); rt_exec_close calls it before freeing the arena, rt_gpu_close in any case. */
void rt_gpu_act_close(RtGpu *g);
double rt_gpu_act_wait_s(const RtGpu *g); /* nvme: the seconds the main thread waited for the staging's task records */
double rt_gpu_act_io_s(const RtGpu *g);   /* nvme: the seconds the copy stream's host functions spent in the store's I/O */
/* nvme: a store request of the copy stream's host functions that failed (they cannot fail the
 * stream), as an error naming the file and the bytes; RT_OK when none. Sticky. */
RtStatus rt_gpu_act_check(RtGpu *g, RtError *err);
int64_t rt_gpu_act_slot_bytes(const RtGpu *g); /* nvme: one staging slot's bytes (0: not nvme) */
/* Measures the copy stream's rate: dev[0, bytes) (bytes at most the pinned memory's) to the pinned
 * memory and back, twice, timed by events on the copy stream; the second round's rates in GB/s
 * (1e9 bytes/s). dev's bytes come back unchanged. Waits. */
/* offload { optimizer = host | nvme } (gpu_opt.c; docs/memory.md): the host update's copy stream.
 * _open makes it (once); _events makes at least n chunks' download and upload events. _fork makes
 * it wait for everything queued on the compute stream so far. _down queues dev -> host
 * (page-locked) on it and records chunk `slot`'s download event, which _wait_down waits for on the
 * host; _up queues host -> dev and records chunk `slot`'s upload event, not waited for on the host;
 * _need makes the compute stream wait for chunk `slot`'s upload; _join makes it wait for everything
 * queued on the copy stream (`what`: its name in MBT_DEBUG's table). _bytes: what _down and _up
 * queued, in all. _close waits for its work and frees it (again: nothing); rt_gpu_close calls it. */
RtStatus rt_gpu_opt_open(RtGpu *g, RtError *err);
RtStatus rt_gpu_opt_events(RtGpu *g, int n, RtError *err);
RtStatus rt_gpu_opt_fork(RtGpu *g, RtError *err);
RtStatus rt_gpu_opt_down(RtGpu *g, void *host, const void *dev, int64_t bytes, int slot, RtError *err);
RtStatus rt_gpu_opt_wait_down(RtGpu *g, int slot, RtError *err);
RtStatus rt_gpu_opt_up(RtGpu *g, void *dev, const void *host, int64_t bytes, int slot, RtError *err);
RtStatus rt_gpu_opt_need(RtGpu *g, int slot, RtError *err);
RtStatus rt_gpu_opt_join(RtGpu *g, const char *what, RtError *err);
void rt_gpu_opt_bytes(const RtGpu *g, int64_t *down, int64_t *up);
void rt_gpu_opt_close(RtGpu *g);
/* The data-parallel buckets' communication stream (gpu_comm.c; docs/parallel.md, "The GPU's
 * buckets overlapped with the backward"). rt_gpu_comm_open makes it and its two events (once).
 * rt_gpu_comm_fork makes it wait for everything queued on the compute stream so far (an event);
 * between rt_gpu_comm_enter and _leave every call of g queues on it instead of the compute stream;
 * rt_gpu_comm_join makes the compute stream wait for everything queued on it (an event). Nothing
 * waits on the host. */
RtStatus rt_gpu_comm_open(RtGpu *g, RtError *err);
RtStatus rt_gpu_comm_fork(RtGpu *g, RtError *err);
void rt_gpu_comm_enter(RtGpu *g);
void rt_gpu_comm_leave(RtGpu *g);
RtStatus rt_gpu_comm_join(RtGpu *g, RtError *err);
RtStatus rt_gpu_act_rate(RtGpu *g, void *dev, int64_t bytes, double *to_host, double *back, RtError *err);

/* ZeRO-3's parameter region on the device (gpu_vmm.c; docs/parallel.md, "ZeRO-3 on the GPU"): a
 * reservation of `bytes` at fixed addresses (*base), in pages of the allocation granularity
 * (*page bytes), each unmapped or mapped to a physical chunk of its own.
 *   _map: pages [p0, p1) mapped and readable (those not mapped yet; a released one not yet
 *     unmapped stays). A chunk comes from the ones unmapped before, after the releases done by now
 *     (or, none done, after waiting for the oldest); else a new one is created.
 *   _release: the pages to be unmapped once the launches queued so far on the compute stream are
 *     done (an event; never under running work); _reclaim unmaps those whose event is done (wait:
 *     all, waiting); _unmap_now waits for the GPU, then unmaps the pages.
 *   _begin: the region's gather stream waits for the compute stream, and g's calls queue on it
 *     until _end, which records gather `slot`'s event (slot 0 or 1: one in use, one prefetched);
 *     _wait makes the compute stream wait for that event.
 *   _mapped, _high (since _reset_high), _chunks: pages mapped now, at most, chunks created. */
typedef struct RtGpuRegion RtGpuRegion;
RtStatus rt_gpu_region_open(RtGpu *g, int64_t bytes, RtGpuRegion **out, void **base, int64_t *page, RtError *err);
RtStatus rt_gpu_region_map(RtGpuRegion *r, int64_t p0, int64_t p1, RtError *err);
RtStatus rt_gpu_region_release(RtGpuRegion *r, const int64_t *pages, int64_t n, RtError *err);
RtStatus rt_gpu_region_reclaim(RtGpuRegion *r, int wait, RtError *err);
RtStatus rt_gpu_region_unmap_now(RtGpuRegion *r, const int64_t *pages, int64_t n, RtError *err);
RtStatus rt_gpu_region_begin(RtGpuRegion *r, RtError *err);
RtStatus rt_gpu_region_end(RtGpuRegion *r, int slot, RtError *err);
RtStatus rt_gpu_region_wait(RtGpuRegion *r, int slot, RtError *err);
int64_t rt_gpu_region_mapped(const RtGpuRegion *r);
int64_t rt_gpu_region_high(const RtGpuRegion *r);
void rt_gpu_region_reset_high(RtGpuRegion *r);
int64_t rt_gpu_region_chunks(const RtGpuRegion *r);
void rt_gpu_region_close(RtGpuRegion *r);

/* The high-water mark of the runtime's device allocations in bytes (regions, arena, scratch,
 * cuBLASLt's workspace, graphs' buffers; not the context's own or cuBLASLt's internal memory). */
int64_t rt_gpu_peak_bytes(const RtGpu *g);

/* ---- the step's functions as CUDA graphs (gpu_graph.c, docs/cuda.md "CUDA graphs") ---- */
/* Runs f(s), a generated function of the step (forward_backward, forward_loss, optimizer_update;
 * fn its RtExecFn, below RT_GPU_GRAPH_FNS), as a CUDA graph when it can: the calls f makes are
 * recorded without running (a probe, host work only); the first time a sequence of calls is seen
 * f runs as it is, the second time it is captured into a graph, and from then on the graph is
 * launched. What changes between calls without changing the calls (the dropout key, lr and t,
 * which f uploads, and the loss it reads back) goes through device buffers the graph reads and
 * writes; anything else that differs (an address, a loss scale) is a different sequence and a
 * different graph. Off (f runs as it is, every time) with MBT_CUDA_GRAPH=0 and while MBT_DEBUG or
 * MBT_TRACE times each launch. The results are the same bit for bit: the same kernels in the same
 * order on the same addresses. */
RtStatus rt_gpu_call(RtGpu *g, int fn, RtStatus (*f)(RtStep *), RtStep *s);
/* f(s) run eagerly where a graph cannot stand for it (a call whose hooks run host code between its
 * launches: the buckets' rt_grad_ready, ZeRO-3's rt_param_need / _done), counted among the calls
 * run uncaptured when graphs are on. */
RtStatus rt_gpu_call_eager(RtGpu *g, RtStatus (*f)(RtStep *), RtStep *s);
/* "CUDA graphs: N captured, M launches, K calls run eagerly" or why they are off; into buf. */
const char *rt_gpu_graph_report(const RtGpu *g, char *buf, size_t cap);

/* ---- timing (MBT_DEBUG) ---- */
/* MBT_DEBUG=1 (or more) in the environment: every launch and GEMM is timed with a pair of events
 * (this serialises nothing but adds two event records a launch), and so are the offloads' copies
 * on their own streams and the compute stream's waits for them (the tracks below);
 * rt_gpu_print_timing prints, per kernel function, GEMM shape or copy, calls, total and mean
 * microseconds and the share of its stream's time, the compute stream's first, longest first, with
 * each stream's total on a line of its own (a copy stream's time overlaps the compute stream's: it
 * is not added to it). MBT_TRACE=FILE.json: the same events written as a Chrome trace (the
 * trace-event JSON format chrome://tracing and Perfetto read), one track (tid) a stream, when the
 * GPU is closed. */
void rt_gpu_print_timing(FILE *f, RtGpu *g);

/* The cache of JIT-compiled PTX: $MBT_CACHE_DIR, else $XDG_CACHE_HOME/mbt, else ~/.cache/mbt;
 * one file `<module_hash>-sm_XX-<driver version>.cubin` per program and GPU arch, written
 * atomically (rt_atomic_write_file). Returns the directory (static storage) or NULL. */
const char *rt_gpu_cache_dir(void);

/* ---- for tests: the pieces above that need no GPU ---- */

/* One timed launch or GEMM: the kernel function's name or the GEMM's shape ("sgemm NT
 * 128x768x3072 x12"), its start in microseconds since the GPU was opened, its duration. */
typedef struct RtGpuEvent {
    const char *name;
    double start_us, dur_us;
    int tid; /* the stream it was timed on: RT_GPU_TRACK_* */
} RtGpuEvent;

/* The trace's tracks, one a stream: the compute stream (its launches, GEMMs and its waits for the
 * copy streams), offload { activations }'s copy stream, offload { optimizer }'s copy stream; and
 * the collectives of runtime/comm's own trace file (comm.c), which writes its events with this
 * writer. */
enum { RT_GPU_TRACK_COMPUTE, RT_GPU_TRACK_ACT, RT_GPU_TRACK_OPT, RT_GPU_TRACK_COMM, RT_GPU_TRACKS };
/* "compute", "activations' copies", "optimizer's copies", "collectives" */
const char *rt_gpu_track_name(int tid);

/* Calls and total time per name (rt_gpu_print_timing's table). Zero-initialised is empty. */
typedef struct RtGpuStat {
    const char *name;
    int64_t calls;
    double total_us;
    int tid; /* the track of the name's first event (each name is timed on one stream) */
} RtGpuStat;
typedef struct RtGpuStats {
    RtGpuStat *items;
    int64_t n, cap;
    int64_t *index; /* hash of the name -> 1 + position in items; 0: empty */
    int64_t index_cap;
} RtGpuStats;

/* Adds each event to its name's entry (names compared by content, not copied: they must outlive s). */
RtStatus rt_gpu_stats_add(RtGpuStats *s, const RtGpuEvent *ev, int64_t n, RtError *err);
void rt_gpu_stats_sort(RtGpuStats *s); /* by track, then longest total first, equal totals by name */
/* Sorts, then the compute track's total, each other track's with events, and one line a name:
 * calls, total, mean, share of its track's total. */
void rt_gpu_stats_print(FILE *f, RtGpuStats *s);
void rt_gpu_stats_free(RtGpuStats *s);
/* The events as a Chrome trace ({"traceEvents":[{"name":..,"ph":"X","ts":..,"dur":..,"pid":0,"tid":T},..]}),
 * written atomically; first, for each track with events, its name as a metadata event
 * ({"name":"thread_name","ph":"M","pid":0,"tid":T,"args":{"name":"compute"}}). */
RtStatus rt_gpu_trace_write(const char *path, const RtGpuEvent *ev, int64_t n, RtError *err);
/* The JIT cache's file for a module: `<dir>/<module_hash>-sm_<arch>-<driver>.cubin`, every character
 * of the hash outside [A-Za-z0-9._-] replaced by '-'. 0 when it does not fit in cap. */
int rt_gpu_cache_file(char *buf, size_t cap, const char *dir, const char *module_hash, int arch, int driver);
const char *rt_gpu_format_bytes(int64_t bytes, char buf[32]); /* "512 B", "1.5 KiB", "1.2 GiB": buf */
/* Opens the libraries rt_gpu_open would and resolves every function, calling none: RT_OK and
 * `found` saying what was loaded, or the reason rt_gpu_open would give. */
RtStatus rt_gpu_libraries(char *found, size_t cap, RtError *err);

#endif
