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
 * plan's), so the capture ends joined. The probe records each copy's arguments like a launch's. */
#include "gpu_internal.h"

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
    if (rt_gpu_graph_probe(g, 'A', &rec, sizeof rec, 0)) return RT_OK;
    if (!g->act.stream) return rt_fail(err, RT_ERR_ARG, "activations: forward_backward copies to host memory, but none is open");
    if (op < 0 || op > 2 || (op < 2 && (off < 0 || len < 0 || off > g->act.bytes || len > g->act.bytes - off || !dev)))
        return rt_fail(err, RT_ERR_ARG,
                       "activations: copy %d of bytes [%lld, +%lld) is outside the %lld bytes of host memory the program "
                       "planned",
                       (int)op, (long long)off, (long long)len, (long long)g->act.bytes);
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    const RtGpuApi *api = &g->api;
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
    if (g->act.host) rt_gpu_host_free(g, g->act.host);
    g->act.stream = NULL, g->act.issued = g->act.copied = NULL, g->act.host = NULL, g->act.bytes = 0;
}
