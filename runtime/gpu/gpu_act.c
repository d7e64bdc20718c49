/* gpu_act.c - offload { activations = host } on the GPU (rt_gpu.h, rt_gpu_act_*; docs/memory.md,
 * "Activation offload").
 *
 * Pipeline position: beside gpu.c; the generated forward_backward calls rt_act_copy
 * (runtime/offload/act_offload.c) at the compiler's points (compiler/plan/plan_offload.c), which
 * on the GPU comes here. The held activations the plan chose are copied to page-locked host memory
 * after their last forward use and back into their second arena slot before their first backward
 * use, on a second stream, so that the copies overlap the launches around them:
 *   - a copy (op 0 out, op 1 back) first makes the copy stream wait for an event recorded on the
 *     compute stream, so it starts only once every launch queued before it is done (its source
 *     written, or the arena bytes it overwrites no longer read);
 *   - a wait (op 2) for one buffer makes the compute stream wait for the event recorded on the copy
 *     stream right after that buffer's last copy (act_event_record), so the launches after it start
 *     once that copy, and those queued before it, are done, but not the copies queued after it: the
 *     plan puts one before the launch that reuses a copied-out slot and one before the first use of
 *     a read-back.
 * Nothing waits on the host: the host queues the whole step as before. CUDA's wait takes the
 * event's state when it is queued, so one event a buffer, recorded again at each copy, serves.
 *
 * MBT_DEBUG / MBT_TRACE (gpu_timing.c): each copy is timed on the copy stream, after its wait for
 * the compute stream, so the span is the copy itself ("activations: copy to host", "... copy
 * back"; track 1), and each wait as a pair on the compute stream around its cuStreamWaitEvent
 * ("activations: the step waits for its copies"; track 0): its span is how long the launches
 * after it stood still for the copies. Timing turns CUDA graphs off, so none of it is captured.
 * CUDA graphs: forward_backward with these copies is captured like any other call (rt_gpu_call):
 * under capture the copy stream's wait for an event of the capturing stream forks it into the
 * capture, its copies become the graph's memcpy nodes (pinned host memory keeps its address), and
 * the compute stream's wait for its event joins it back; every copy is followed by a wait (the
 * plan's), so the capture ends joined. The probe records each copy's arguments like a launch's.
 *
 * nvme (rt_gpu_act_open_nvme): the same points, but the bytes go on to the store file (RtExec's
 * act_store) through a ring of RT_GPU_ACT_SLOTS pinned staging slots, so the pinned memory is
 * bounded (slots x slot bytes, not the plan's store size). A copy is cut into chunks of a slot, each
 * in the next slot of the ring, and everything goes on the copy stream, in order:
 *   - out (op 0): [wait for the compute stream's event] then a chunk at a time: device -> slot
 *     (cuMemcpyDtoHAsync), then a host function (cuLaunchHostFunc) that writes the slot to the
 *     store and waits for it;
 *   - back (op 1): a chunk at a time: a host function that reads the store into the slot and waits
 *     for it, [before the first chunk's copy, the wait for the compute stream's event], then
 *     slot -> device (cuMemcpyHtoDAsync);
 *   - a wait (op 2): exactly as for host, an event on the copy stream the compute stream waits for.
 * Timed (MBT_DEBUG / MBT_TRACE), a pair on the copy stream spans each copy's whole staging, its
 * host functions' store I/O included ("activations: copy to nvme", "... copy back from nvme"):
 * out from after the wait for the compute stream, back from the first chunk's store read (so a
 * read back's span holds any wait for the compute stream before its first chunk's device copy).
 * The stream runs its work in order, so a slot is reused only after the host function that wrote
 * it out or the copy that read it back has finished, and a read follows every write before it:
 * the staging needs no host wait, and the host (the main thread) queues the whole step as before,
 * never waiting for the store. The store's I/O runs on CUDA's callback thread (io_uring or the
 * store's own thread below it), one chunk at a time, while the compute stream runs the launches;
 * the plan's waits are where the step waits for it. A host function cannot fail the stream: a
 * store error is kept (sticky; the later host functions do nothing) and returned by the next
 * rt_gpu_act_copy and by rt_gpu_act_check, which rt_exec_wait calls after each micro-batch (the
 * compute stream has waited for every copy by then: every copy is followed by a wait), so the
 * micro-batch whose copies failed fails, before the update.
 * CUDA graphs: forward_backward with nvme is not captured (the probe marks it): the host functions
 * could be graph nodes, but the emulated GPU does not capture them, and nothing was measured on a
 * GPU to choose with (docs/memory.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_internal.h"
#include "rt_store.h"

static RtStatus act_nvme_copy(RtGpu *g, int32_t op, int64_t off, unsigned char *dev, int64_t len, RtError *err);

/* The copy stream and its two events (host and nvme alike). */
static RtStatus act_streams(RtGpu *g, RtError *err) {
    return rt_gpu_side_stream(g, &g->act.stream, &g->act.issued, &g->act.copied, "the activations' copy stream",
                              "the activations' copies", err);
}

RtStatus rt_gpu_act_open(RtGpu *g, int64_t bytes, RtError *err) {
    if (g->act.stream || bytes <= 0) return RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st == RT_OK) st = rt_gpu_host_alloc(g, (void **)&g->act.host, bytes, "the offloaded activations", err);
    if (st == RT_OK) st = act_streams(g, err);
    if (st != RT_OK) {
        rt_gpu_act_close(g);
        return st;
    }
    g->act.bytes = bytes;
    return RT_OK;
}

/* A buffer's copy event: recorded on the copy stream after its last copy out or back, so that the
 * plan's wait for that buffer waits for that copy (and for those queued before it, which the stream
 * runs first) but not for copies queued after it - a write issued just before a wait, or a read
 * issued early for a later use, does not hold up the launches that need only an earlier copy. One
 * event an offset (a buffer's place in the store or the pinned memory: its write and its read
 * back are never in flight together), created at its first copy. */
struct RtActEvent {
    int64_t off;
    CUevent ev;
};

static struct RtActEvent *act_event_find(RtGpu *g, int64_t off) {
    for (int i = 0; i < g->act.nevents; i++)
        if (g->act.events[i].off == off) return &g->act.events[i];
    return NULL;
}

/* The event of offset off recorded on the copy stream now (after the copy just queued). */
static RtStatus act_event_record(RtGpu *g, int64_t off, RtError *err) {
    const RtGpuApi *api = &g->api;
    struct RtActEvent *e = act_event_find(g, off);
    if (!e) {
        if (g->act.nevents == g->act.cap_events) {
            int cap = g->act.cap_events ? 2 * g->act.cap_events : 32;
            struct RtActEvent *n = realloc(g->act.events, (size_t)cap * sizeof *n);
            if (!n) return rt_fail(err, RT_ERR_NOMEM, "activations: out of memory for the copies' events");
            g->act.events = n;
            g->act.cap_events = cap;
        }
        e = &g->act.events[g->act.nevents];
        e->off = off;
        RtStatus st =
            rt_cu_check(api, api->cuEventCreate(&e->ev, CU_EVENT_DEFAULT), err, "cuEventCreate", "the activations' copy events");
        if (st != RT_OK) return st;
        g->act.nevents++;
    }
    return rt_cu_check(api, api->cuEventRecord(e->ev, g->act.stream), err, "cuEventRecord", "an activation's copy");
}

RtStatus rt_gpu_act_copy(RtGpu *g, int32_t op, int64_t off, void *dev, int64_t len, RtError *err) {
    struct {
        int64_t op, off, len;
        void *dev;
    } rec = {op, off, len, dev};
    /* nvme: host functions on the copy stream, which the emulated GPU does not capture */
    if (rt_gpu_graph_probe(g, 'A', &rec, sizeof rec, g->act.store != NULL)) return RT_OK;
    if (!g->act.stream) return rt_fail(err, RT_ERR_ARG, "activations: forward_backward copies to host memory, but none is open");
    int64_t cap = g->act.store ? (int64_t)rt_store_size(g->act.store) : g->act.bytes;
    if (op < 0 || op > 2 || (op < 2 && (off < 0 || len < 0 || off > cap || len > cap - off || !dev)))
        return rt_fail(err, RT_ERR_ARG,
                       "activations: copy %d of bytes [%lld, +%lld) is outside the %lld bytes %s the program planned", (int)op,
                       (long long)off, (long long)len, (long long)cap, g->act.store ? "of the store" : "of host memory");
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    const RtGpuApi *api = &g->api;
    if (op < 2 && g->act.store) {
        st = act_nvme_copy(g, op, off, (unsigned char *)dev, len, err);
        return st == RT_OK ? act_event_record(g, off, err) : st;
    }
    int64_t slot = -1; /* MBT_DEBUG / MBT_TRACE */
    /* a wait: off >= 0, for the copy of that buffer (act_event_record); < 0, for everything queued */
    if (op == 2) {
        CUevent ev = g->act.copied;
        if (off >= 0) {
            const struct RtActEvent *e = act_event_find(g, off);
            if (!e)
                return rt_fail(err, RT_ERR_ARG, "activations: a wait for the copy at byte %lld, which no copy has been queued to",
                               (long long)off);
            ev = e->ev;
        } else {
            st = rt_cu_check(api, api->cuEventRecord(ev, g->act.stream), err, "cuEventRecord", "the activations' copies");
        }
        if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin(g, &slot, err);
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuStreamWaitEvent(g->stream, ev, 0), err, "cuStreamWaitEvent",
                             "the step waiting for the activations' copies");
        if (slot >= 0) st = rt_gpu_time_end(g, slot, "activations: the step waits for its copies", st, err);
        return st;
    }
    st = rt_cu_check(api, api->cuEventRecord(g->act.issued, g->stream), err, "cuEventRecord", "the step before a copy");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->act.stream, g->act.issued, 0), err, "cuStreamWaitEvent",
                         "the activations' copy stream waiting for the step");
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin_on(g, g->act.stream, RT_GPU_TRACK_ACT, &slot, err);
    if (st != RT_OK) return st;
    if (op == 0)
        st = rt_cu_check(api, api->cuMemcpyDtoHAsync(g->act.host + off, rt_dptr(dev), (size_t)len, g->act.stream), err,
                         "cuMemcpyDtoHAsync", "an activation to host memory, %lld bytes", (long long)len);
    else
        st = rt_cu_check(api, api->cuMemcpyHtoDAsync(rt_dptr(dev), g->act.host + off, (size_t)len, g->act.stream), err,
                         "cuMemcpyHtoDAsync", "an activation back from host memory, %lld bytes", (long long)len);
    if (slot >= 0) st = rt_gpu_time_end(g, slot, op == 0 ? "activations: copy to host" : "activations: copy back", st, err);
    return st == RT_OK ? act_event_record(g, off, err) : st;
}

int64_t rt_gpu_act_bytes(const RtGpu *g) { return g ? g->act.bytes : 0; }

/* ---- nvme: the store through the staging slots ------------------------------------------------ */

static double act_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

RtStatus rt_gpu_act_open_nvme(RtGpu *g, struct RtStore *store, int64_t staging, RtError *err) {
    if (g->act.stream) return RT_OK;
    const int64_t page = 4096, total = (int64_t)rt_store_size(store);
    if (staging <= 0) staging = RT_GPU_ACT_STAGING;
    /* each slot whole pages (O_DIRECT), no more in all than the store holds */
    int64_t slot = staging / RT_GPU_ACT_SLOTS / page * page;
    if (slot < page) slot = page;
    int64_t need = (total + RT_GPU_ACT_SLOTS - 1) / RT_GPU_ACT_SLOTS;
    need = (need + page - 1) / page * page;
    if (slot > need) slot = need;
    g->act.tasks = calloc(RT_GPU_ACT_TASKS, sizeof *g->act.tasks);
    RtStatus st =
        g->act.tasks ? rt_gpu_use(g, err)
                     : rt_fail(err, RT_ERR_NOMEM, "activations: cannot allocate the staging's %d task records", RT_GPU_ACT_TASKS);
    if (st == RT_OK) st = rt_gpu_host_alloc(g, &g->act.raw, slot * RT_GPU_ACT_SLOTS + page, "the activations' staging", err);
    if (st == RT_OK) st = act_streams(g, err);
    if (st != RT_OK) {
        rt_gpu_act_close(g);
        return st;
    }
    /* the store's requests want page-aligned buffers (cuMemHostAlloc's are; not every allocator's) */
    g->act.host = (unsigned char *)(((uintptr_t)g->act.raw + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page);
    g->act.store = store;
    g->act.nslots = RT_GPU_ACT_SLOTS;
    g->act.slot_bytes = slot;
    g->act.bytes = slot * RT_GPU_ACT_SLOTS;
    g->act.cursor = 0, g->act.ntasks = 0, g->act.io_s = 0, g->act.wait_s = 0, g->act.failed = 0, g->act.why[0] = 0;
    return RT_OK;
}

double rt_gpu_act_wait_s(const RtGpu *g) { return g ? g->act.wait_s : 0; }
double rt_gpu_act_io_s(const RtGpu *g) { return g ? g->act.io_s : 0; }
int64_t rt_gpu_act_slot_bytes(const RtGpu *g) { return g && g->act.store ? g->act.slot_bytes : 0; }

RtStatus rt_gpu_act_check(RtGpu *g, RtError *err) {
    if (!g || !g->act.store || !__atomic_load_n(&g->act.failed, __ATOMIC_ACQUIRE)) return RT_OK;
    return rt_fail(err, RT_ERR_IO, "activations: %s", g->act.why);
}

/* The host function of a chunk, on CUDA's callback thread once the copy stream reaches it: the
 * store written from the slot (op 0) or read into it (op 1), and waited for. After a failure it
 * does nothing (the bytes are in an unknown state; the run stops at rt_gpu_act_check). */
static void act_task_run(void *arg) {
    RtActTask *t = arg;
    RtGpu *g = t->g;
    if (!__atomic_load_n(&g->act.failed, __ATOMIC_ACQUIRE)) {
        double t0 = act_now();
        unsigned char *h = g->act.host + (int64_t)t->slot * g->act.slot_bytes;
        int rc = t->op == 0 ? rt_store_write(g->act.store, (size_t)t->off, h, (size_t)t->len)
                            : rt_store_read(g->act.store, (size_t)t->off, h, (size_t)t->len);
        if (rc == 0) rc = rt_store_wait(g->act.store);
        g->act.io_s += act_now() - t0; /* read by the main thread after a synchronisation */
        if (rc != 0) {
            snprintf(g->act.why, sizeof g->act.why, "%s", rt_store_error(g->act.store));
            __atomic_store_n(&g->act.failed, 1, __ATOMIC_RELEASE);
        }
    }
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
}

/* Queues chunk [pos, pos + n) of a copy through the next slot: its task record (the ring of
 * RT_GPU_ACT_TASKS; one still queued is waited for, which only a step with more chunks than that
 * in flight meets), the host function and the device copy in the copy's order. */
static RtStatus act_chunk(RtGpu *g, int op, int64_t off, unsigned char *dev, int64_t n, int wait_first, RtError *err) {
    const RtGpuApi *api = &g->api;
    RtActTask *t = &g->act.tasks[g->act.ntasks % RT_GPU_ACT_TASKS];
    RtStatus st = RT_OK;
    if (g->act.ntasks >= RT_GPU_ACT_TASKS && !__atomic_load_n(&t->done, __ATOMIC_ACQUIRE)) {
        double t0 = act_now();
        st = rt_cu_check(api, api->cuStreamSynchronize(g->act.stream), err, "cuStreamSynchronize",
                         "the activations' copy stream (its task records are all in use)");
        g->act.wait_s += act_now() - t0;
        if (st != RT_OK) return st;
    }
    g->act.ntasks++;
    int s = g->act.cursor;
    g->act.cursor = (s + 1) % g->act.nslots;
    unsigned char *h = g->act.host + (int64_t)s * g->act.slot_bytes;
    *t = (RtActTask){.g = g, .op = op, .slot = s, .off = off, .len = n, .done = 0};
    if (op == 0) {
        st = rt_cu_check(api, api->cuMemcpyDtoHAsync(h, rt_dptr(dev), (size_t)n, g->act.stream), err, "cuMemcpyDtoHAsync",
                         "an activation to the staging memory, %lld bytes", (long long)n);
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuLaunchHostFunc(g->act.stream, act_task_run, t), err, "cuLaunchHostFunc",
                             "an activation's write to the store");
        return st;
    }
    st = rt_cu_check(api, api->cuLaunchHostFunc(g->act.stream, act_task_run, t), err, "cuLaunchHostFunc",
                     "an activation's read from the store");
    if (st == RT_OK && wait_first) /* the slot of the arena it goes to is free from the read's point */
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->act.stream, g->act.issued, 0), err, "cuStreamWaitEvent",
                         "the activations' copy stream waiting for the step");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuMemcpyHtoDAsync(rt_dptr(dev), h, (size_t)n, g->act.stream), err, "cuMemcpyHtoDAsync",
                         "an activation back from the staging memory, %lld bytes", (long long)n);
    return st;
}

static RtStatus act_nvme_copy(RtGpu *g, int32_t op, int64_t off, unsigned char *dev, int64_t len, RtError *err) {
    const RtGpuApi *api = &g->api;
    RtStatus st = rt_gpu_act_check(g, err); /* a failure of an earlier micro-batch's host functions */
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventRecord(g->act.issued, g->stream), err, "cuEventRecord", "the step before a copy");
    if (st == RT_OK && op == 0) /* the source is written once everything queued on the compute stream is done */
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->act.stream, g->act.issued, 0), err, "cuStreamWaitEvent",
                         "the activations' copy stream waiting for the step");
    int64_t slot = -1; /* MBT_DEBUG / MBT_TRACE: the whole staging of the copy */
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin_on(g, g->act.stream, RT_GPU_TRACK_ACT, &slot, err);
    for (int64_t pos = 0; pos < len && st == RT_OK;) {
        int64_t n = len - pos < g->act.slot_bytes ? len - pos : g->act.slot_bytes;
        st = act_chunk(g, op, off + pos, dev + pos, n, op == 1 && pos == 0, err);
        pos += n;
    }
    if (slot >= 0)
        st = rt_gpu_time_end(g, slot, op == 0 ? "activations: copy to nvme" : "activations: copy back from nvme", st, err);
    return st;
}

RtStatus rt_gpu_act_rate(RtGpu *g, void *dev, int64_t bytes, double *to_host, double *back, RtError *err) {
    *to_host = *back = 0;
    if (!g->act.stream || bytes <= 0 || bytes > g->act.bytes)
        return rt_fail(err, RT_ERR_ARG, "activations: no copy stream, or %lld bytes to time beyond its memory", (long long)bytes);
    const RtGpuApi *api = &g->api;
    CUevent ev[3] = {NULL, NULL, NULL};
    RtStatus st = rt_gpu_use(g, err);
    for (int i = 0; i < 3 && st == RT_OK; i++)
        st = rt_cu_check(api, api->cuEventCreate(&ev[i], CU_EVENT_DEFAULT), err, "cuEventCreate", "timing the copies");
    /* the stream's work before (none at start) first; the first round warms the path up */
    for (int round = 0; round < 2 && st == RT_OK; round++) {
        st = rt_cu_check(api, api->cuEventRecord(ev[0], g->act.stream), err, "cuEventRecord", "timing the copies");
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuMemcpyDtoHAsync(g->act.host, rt_dptr(dev), (size_t)bytes, g->act.stream), err,
                             "cuMemcpyDtoHAsync", "timing the copies to host memory");
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuEventRecord(ev[1], g->act.stream), err, "cuEventRecord", "timing the copies");
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuMemcpyHtoDAsync(rt_dptr(dev), g->act.host, (size_t)bytes, g->act.stream), err,
                             "cuMemcpyHtoDAsync", "timing the copies back");
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuEventRecord(ev[2], g->act.stream), err, "cuEventRecord", "timing the copies");
        if (st == RT_OK) st = rt_cu_check(api, api->cuEventSynchronize(ev[2]), err, "cuEventSynchronize", "timing the copies");
    }
    float out_ms = 0, back_ms = 0;
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventElapsedTime(&out_ms, ev[0], ev[1]), err, "cuEventElapsedTime", "timing the copies");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventElapsedTime(&back_ms, ev[1], ev[2]), err, "cuEventElapsedTime", "timing the copies");
    for (int i = 0; i < 3; i++)
        if (ev[i]) api->cuEventDestroy(ev[i]);
    if (st != RT_OK) return st;
    if (out_ms > 0) *to_host = (double)bytes / (out_ms * 1e-3) / 1e9;
    if (back_ms > 0) *back = (double)bytes / (back_ms * 1e-3) / 1e9;
    return RT_OK;
}

void rt_gpu_act_close(RtGpu *g) {
    const RtGpuApi *api = &g->api;
    if (g->act.stream) {
        api->cuStreamSynchronize(g->act.stream);
        api->cuStreamDestroy(g->act.stream);
    }
    if (g->act.issued) api->cuEventDestroy(g->act.issued);
    if (g->act.copied) api->cuEventDestroy(g->act.copied);
    for (int i = 0; i < g->act.nevents; i++) api->cuEventDestroy(g->act.events[i].ev);
    free(g->act.events);
    g->act.events = NULL, g->act.nevents = g->act.cap_events = 0;
    if (g->act.raw) rt_gpu_host_free(g, g->act.raw);
    else if (g->act.host) rt_gpu_host_free(g, g->act.host);
    g->act.stream = NULL, g->act.issued = g->act.copied = NULL, g->act.host = NULL, g->act.bytes = 0;
    free(g->act.tasks);
    g->act.raw = NULL, g->act.store = NULL, g->act.tasks = NULL, g->act.nslots = 0, g->act.slot_bytes = 0;
}
