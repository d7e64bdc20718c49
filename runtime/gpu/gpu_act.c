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
 *   - a wait (op 2) makes the compute stream wait for an event recorded on the copy stream, so the
 *     launches after it start only once every copy queued before it is done: the plan puts one
 *     before the launch that reuses a copied-out slot and one before the first use of a read-back.
 * Nothing waits on the host: the host queues the whole step as before. CUDA's wait takes the
 * event's state when it is queued, so one event each way, recorded again each time, serves.
 *
 * CUDA graphs: forward_backward with these copies is captured like any other call (rt_gpu_call):
 * under capture the copy stream's wait for an event of the capturing stream forks it into the
 * capture, its copies become the graph's memcpy nodes (pinned host memory keeps its address), and
 * the compute stream's wait for its event joins it back; every copy is followed by a wait (the
 * plan's), so the capture ends joined. The probe records each copy's arguments like a launch's.
 *
 * nvme (rt_gpu_act_open_nvme): the same points, but the bytes go on to the store file (RtExec's
 * act_store) through a ring of RT_GPU_ACT_SLOTS pinned staging slots, so the pinned memory is
 * bounded (slots x slot bytes, not the plan's store size). A copy is cut into chunks of a slot:
 *   - out (op 0): each chunk is copied device -> slot on the copy stream (after the compute
 *     stream's event, as for host) and an event recorded after it; the slot is STAGED. Its store
 *     write is issued only once that event is done, which the host learns by waiting for it when it
 *     needs the slot again (or before a read): then every staged slot up to it is written to the
 *     store (io_uring or its thread) and waited for, and the slots are free.
 *   - back (op 1): every staged write is written and waited for first (the store's bytes must be
 *     there); then up to a ring's worth of chunks are read from the store into free slots (a slot
 *     still copying to the device is waited for by its event), the reads waited for on the host,
 *     and each slot copied slot -> device on the copy stream (after the compute stream's event).
 *   - a wait (op 2): exactly as for host, an event on the copy stream the compute stream waits for.
 * Why the host and not the graph: the store's I/O is the host's, and its order with the copy
 * stream is kept by host waits for events (outside any graph), so forward_backward with nvme is
 * never captured (the probe marks it, as for any call that waits for the GPU); it runs eagerly.
 * The host blocks only when a slot it needs is still in use (the ring is full: at most
 * nslots x slot_bytes of copies are ahead of the store) and for the store's reads, which the plan
 * issues ahead of their use; the GPU keeps running what was queued before meanwhile. The seconds
 * it blocked are counted (rt_gpu_act_wait_s) and printed at the end of the run. */
#include <string.h>
#include <time.h>

#include "gpu_internal.h"
#include "rt_store.h"

static RtStatus act_nvme_copy(RtGpu *g, int32_t op, int64_t off, unsigned char *dev, int64_t len, RtError *err);

RtStatus rt_gpu_act_open(RtGpu *g, int64_t bytes, RtError *err) {
    if (g->act.stream || bytes <= 0) return RT_OK;
    RtStatus st = rt_gpu_use(g, err);
    if (st == RT_OK) st = rt_gpu_host_alloc(g, (void **)&g->act.host, bytes, "the offloaded activations", err);
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuStreamCreate(&g->act.stream, CU_STREAM_NON_BLOCKING), err, "cuStreamCreate",
                         "the activations' copy stream");
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(&g->act.issued, CU_EVENT_DEFAULT), err, "cuEventCreate",
                         "the activations' copies");
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(&g->act.copied, CU_EVENT_DEFAULT), err, "cuEventCreate",
                         "the activations' copies");
    if (st != RT_OK) {
        rt_gpu_act_close(g);
        return st;
    }
    g->act.bytes = bytes;
    return RT_OK;
}

RtStatus rt_gpu_act_copy(RtGpu *g, int32_t op, int64_t off, void *dev, int64_t len, RtError *err) {
    struct {
        int64_t op, off, len;
        void *dev;
    } rec = {op, off, len, dev};
    /* nvme: the host waits for the staging slots' copies, which no graph can hold */
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
    if (op < 2 && g->act.store) return act_nvme_copy(g, op, off, (unsigned char *)dev, len, err);
    if (op == 2) {
        st = rt_cu_check(api, api->cuEventRecord(g->act.copied, g->act.stream), err, "cuEventRecord", "the activations' copies");
        if (st == RT_OK)
            st = rt_cu_check(api, api->cuStreamWaitEvent(g->stream, g->act.copied, 0), err, "cuStreamWaitEvent",
                             "the step waiting for the activations' copies");
        return st;
    }
    st = rt_cu_check(api, api->cuEventRecord(g->act.issued, g->stream), err, "cuEventRecord", "the step before a copy");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->act.stream, g->act.issued, 0), err, "cuStreamWaitEvent",
                         "the activations' copy stream waiting for the step");
    if (st != RT_OK) return st;
    if (op == 0)
        return rt_cu_check(api, api->cuMemcpyDtoHAsync(g->act.host + off, rt_dptr(dev), (size_t)len, g->act.stream), err,
                           "cuMemcpyDtoHAsync", "an activation to host memory, %lld bytes", (long long)len);
    return rt_cu_check(api, api->cuMemcpyHtoDAsync(rt_dptr(dev), g->act.host + off, (size_t)len, g->act.stream), err,
                       "cuMemcpyHtoDAsync", "an activation back from host memory, %lld bytes", (long long)len);
}

int64_t rt_gpu_act_bytes(const RtGpu *g) { return g ? g->act.bytes : 0; }

/* ---- nvme: the store through the staging slots ------------------------------------------------ */

enum { RT_ACT_FREE, RT_ACT_STAGED, RT_ACT_WRITING, RT_ACT_LOADED };

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
    RtStatus st = rt_gpu_use(g, err);
    if (st == RT_OK) st = rt_gpu_host_alloc(g, &g->act.raw, slot * RT_GPU_ACT_SLOTS + page, "the activations' staging", err);
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuStreamCreate(&g->act.stream, CU_STREAM_NON_BLOCKING), err, "cuStreamCreate",
                         "the activations' copy stream");
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(&g->act.issued, CU_EVENT_DEFAULT), err, "cuEventCreate",
                         "the activations' copies");
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(&g->act.copied, CU_EVENT_DEFAULT), err, "cuEventCreate",
                         "the activations' copies");
    for (int i = 0; i < RT_GPU_ACT_SLOTS && st == RT_OK; i++)
        st = rt_cu_check(&g->api, g->api.cuEventCreate(&g->act.ev[i], CU_EVENT_DEFAULT), err, "cuEventCreate",
                         "the activations' staging");
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
    g->act.cursor = 0, g->act.seq = 0, g->act.wait_s = 0;
    memset(g->act.slot, 0, sizeof g->act.slot);
    return RT_OK;
}

double rt_gpu_act_wait_s(const RtGpu *g) { return g ? g->act.wait_s : 0; }
int64_t rt_gpu_act_slot_bytes(const RtGpu *g) { return g && g->act.store ? g->act.slot_bytes : 0; }

static RtStatus act_store_failed(RtGpu *g, RtError *err) {
    return rt_fail(err, RT_ERR_IO, "activations: %s", rt_store_error(g->act.store));
}

/* The store's queued requests waited for (timed); every WRITING slot is free after it. */
static RtStatus act_store_wait(RtGpu *g, RtError *err) {
    double t0 = act_now();
    int rc = rt_store_wait(g->act.store);
    g->act.wait_s += act_now() - t0;
    if (rc != 0) return act_store_failed(g, err);
    for (int i = 0; i < g->act.nslots; i++)
        if (g->act.slot[i].state == RT_ACT_WRITING) g->act.slot[i].state = RT_ACT_FREE;
    return RT_OK;
}

/* Every slot STAGED at or before seq `upto` written to the store, and every write waited for:
 * the copy stream runs in order, so once the latest such slot's event is done so are the others. */
static RtStatus act_writes_out(RtGpu *g, int64_t upto, RtError *err) {
    int last = -1, any = 0;
    for (int i = 0; i < g->act.nslots; i++) {
        if (g->act.slot[i].state == RT_ACT_STAGED && g->act.slot[i].seq <= upto &&
            (last < 0 || g->act.slot[i].seq > g->act.slot[last].seq))
            last = i;
        any |= g->act.slot[i].state == RT_ACT_WRITING;
    }
    if (last >= 0) {
        double t0 = act_now();
        RtStatus st = rt_cu_check(&g->api, g->api.cuEventSynchronize(g->act.ev[last]), err, "cuEventSynchronize",
                                  "an activation's copy to the staging memory");
        g->act.wait_s += act_now() - t0;
        if (st != RT_OK) return st;
        for (int i = 0; i < g->act.nslots; i++) {
            if (g->act.slot[i].state != RT_ACT_STAGED || g->act.slot[i].seq > upto) continue;
            if (rt_store_write(g->act.store, (size_t)g->act.slot[i].off, g->act.host + (int64_t)i * g->act.slot_bytes,
                               (size_t)g->act.slot[i].len) != 0)
                return act_store_failed(g, err);
            g->act.slot[i].state = RT_ACT_WRITING;
            any = 1;
        }
    }
    return any ? act_store_wait(g, err) : RT_OK;
}

/* The next slot of the ring, free: its bytes written to the store, or its copy to the device done. */
static RtStatus act_next_slot(RtGpu *g, int *out, RtError *err) {
    int s = g->act.cursor;
    g->act.cursor = (s + 1) % g->act.nslots;
    RtStatus st = RT_OK;
    if (g->act.slot[s].state == RT_ACT_STAGED) st = act_writes_out(g, g->act.slot[s].seq, err);
    else if (g->act.slot[s].state == RT_ACT_WRITING) st = act_store_wait(g, err);
    else if (g->act.slot[s].state == RT_ACT_LOADED) {
        double t0 = act_now();
        st = rt_cu_check(&g->api, g->api.cuEventSynchronize(g->act.ev[s]), err, "cuEventSynchronize",
                         "an activation's copy back from the staging memory");
        g->act.wait_s += act_now() - t0;
        if (st == RT_OK) g->act.slot[s].state = RT_ACT_FREE;
    }
    *out = s;
    return st;
}

static RtStatus act_nvme_copy(RtGpu *g, int32_t op, int64_t off, unsigned char *dev, int64_t len, RtError *err) {
    const RtGpuApi *api = &g->api;
    RtStatus st = RT_OK;
    if (op == 1) st = act_writes_out(g, INT64_MAX, err); /* what the store holds is what the read gets */
    /* the copy stream after everything queued on the compute stream so far */
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventRecord(g->act.issued, g->stream), err, "cuEventRecord", "the step before a copy");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->act.stream, g->act.issued, 0), err, "cuStreamWaitEvent",
                         "the activations' copy stream waiting for the step");
    for (int64_t pos = 0; pos < len && st == RT_OK;) {
        if (op == 0) {
            int s;
            int64_t n = len - pos < g->act.slot_bytes ? len - pos : g->act.slot_bytes;
            st = act_next_slot(g, &s, err);
            unsigned char *h = g->act.host + (int64_t)s * g->act.slot_bytes;
            if (st == RT_OK)
                st = rt_cu_check(api, api->cuMemcpyDtoHAsync(h, rt_dptr(dev + pos), (size_t)n, g->act.stream), err,
                                 "cuMemcpyDtoHAsync", "an activation to the staging memory, %lld bytes", (long long)n);
            if (st == RT_OK)
                st = rt_cu_check(api, api->cuEventRecord(g->act.ev[s], g->act.stream), err, "cuEventRecord",
                                 "the activations' staging");
            if (st == RT_OK)
                g->act.slot[s].state = RT_ACT_STAGED, g->act.slot[s].off = off + pos, g->act.slot[s].len = n,
                g->act.slot[s].seq = ++g->act.seq;
            pos += n;
            continue;
        }
        /* back: a ring's worth of chunks read from the store at once, then copied to the device */
        int sl[RT_GPU_ACT_SLOTS];
        int64_t at[RT_GPU_ACT_SLOTS], nb[RT_GPU_ACT_SLOTS];
        int k = 0;
        while (pos < len && k < g->act.nslots && st == RT_OK) {
            int64_t n = len - pos < g->act.slot_bytes ? len - pos : g->act.slot_bytes;
            st = act_next_slot(g, &sl[k], err);
            if (st == RT_OK && rt_store_read(g->act.store, (size_t)(off + pos), g->act.host + (int64_t)sl[k] * g->act.slot_bytes,
                                             (size_t)n) != 0)
                st = act_store_failed(g, err);
            at[k] = pos, nb[k++] = n;
            pos += n;
        }
        if (st == RT_OK) st = act_store_wait(g, err);
        for (int i = 0; i < k && st == RT_OK; i++) {
            int s = sl[i];
            st =
                rt_cu_check(api,
                            api->cuMemcpyHtoDAsync(rt_dptr(dev + at[i]), g->act.host + (int64_t)s * g->act.slot_bytes,
                                                   (size_t)nb[i], g->act.stream),
                            err, "cuMemcpyHtoDAsync", "an activation back from the staging memory, %lld bytes", (long long)nb[i]);
            if (st == RT_OK)
                st = rt_cu_check(api, api->cuEventRecord(g->act.ev[s], g->act.stream), err, "cuEventRecord",
                                 "the activations' staging");
            if (st == RT_OK) g->act.slot[s].state = RT_ACT_LOADED;
        }
    }
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
    for (int i = 0; i < RT_GPU_ACT_SLOTS; i++)
        if (g->act.ev[i]) api->cuEventDestroy(g->act.ev[i]), g->act.ev[i] = NULL;
    if (g->act.raw) rt_gpu_host_free(g, g->act.raw);
    else if (g->act.host) rt_gpu_host_free(g, g->act.host);
    g->act.stream = NULL, g->act.issued = g->act.copied = NULL, g->act.host = NULL, g->act.bytes = 0;
    g->act.raw = NULL, g->act.store = NULL, g->act.nslots = 0, g->act.slot_bytes = 0;
}
