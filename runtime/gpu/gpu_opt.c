/* gpu_opt.c - offload { optimizer = host | nvme } on the GPU: the copy stream of the host's update
 * (rt_gpu.h, rt_gpu_opt_*; docs/memory.md, "Optimizer-state offload").
 *
 * Pipeline position: beside gpu_act.c; the train loop's host update (runtime/cli/train.c,
 * rt_train_host_update) brings the clipped gradient down and takes the updated parameters up
 * through here. The host's parameter and gradient regions are page-locked on such a build
 * (rt_exec_open), so the copies run asynchronously on a stream of their own, in chunks:
 *   - fork: the copy stream waits for everything queued on the compute stream so far (the
 *     backward, the reduction, the clipping), an event, so a download reads the final gradient;
 *   - down: a chunk device -> host, then the chunk's download event, which the host waits for
 *     (wait_down) before the CPU updates that chunk - the next chunks' downloads were queued
 *     before that wait, so they run while the CPU updates this one;
 *   - up: a chunk host -> device, queued after the CPU updated it, then the chunk's upload event,
 *     never waited for on the host: it runs while the CPU updates the next chunk;
 *   - need: the compute stream waits for one chunk's upload (the update deferred to the next
 *     step's reads: train_step.c), join: for everything queued on the copy stream (an event), so
 *     that the next step's launches, and the gradient's zeroing, start after the last upload (or,
 *     deferred, the gradient's zeroing after the last download).
 * Each chunk has its own pair of events (rt_gpu_opt_events), recorded again a step later, after
 * the host waited for the download (and the compute stream for the upload) of the step before.
 * A chunk of the host's parameters is written by the CPU only after every upload queued before it
 * has run: the next step's wait_down for it comes after them on the same stream.
 * MBT_DEBUG / MBT_TRACE (gpu_timing.c): each download and upload is timed on the copy stream
 * ("optimizer offload: gradient down", "... parameters up"; track 2), the compute stream's waits
 * as a pair around each (its name given by the caller, track 0). The CPU's update between them is
 * no GPU event: the step's time has it. */
#include <stdlib.h>

#include "gpu_internal.h"

RtStatus rt_gpu_opt_open(RtGpu *g, RtError *err) {
    if (g->opt.stream) return RT_OK;
    RtStatus st = rt_gpu_side_stream(g, &g->opt.stream, &g->opt.issued, &g->opt.copied, "the optimizer offload's copy stream",
                                     "the optimizer offload's copies", err);
    if (st != RT_OK) rt_gpu_opt_close(g);
    return st;
}

RtStatus rt_gpu_opt_events(RtGpu *g, int n, RtError *err) {
    if (n <= g->opt.nevents) return RT_OK;
    CUevent *got = realloc(g->opt.got, (size_t)n * sizeof *got);
    if (got) g->opt.got = got;
    CUevent *put = got ? realloc(g->opt.put, (size_t)n * sizeof *put) : NULL;
    if (put) g->opt.put = put;
    if (!got || !put) return rt_fail(err, RT_ERR_NOMEM, "the optimizer offload's events: out of memory");
    for (; g->opt.nevents < n; g->opt.nevents++) {
        int i = g->opt.nevents;
        RtStatus st = rt_cu_check(&g->api, g->api.cuEventCreate(&got[i], CU_EVENT_DEFAULT), err, "cuEventCreate",
                                  "the optimizer offload's downloads");
        if (st == RT_OK)
            st = rt_cu_check(&g->api, g->api.cuEventCreate(&put[i], CU_EVENT_DEFAULT), err, "cuEventCreate",
                             "the optimizer offload's uploads");
        if (st != RT_OK) {
            if (got[i]) g->api.cuEventDestroy(got[i]);
            return st;
        }
    }
    return RT_OK;
}

static RtStatus opt_slot(const RtGpu *g, int slot, RtError *err) {
    return slot >= 0 && slot < g->opt.nevents
               ? RT_OK
               : rt_fail(err, RT_ERR_ARG, "the optimizer offload's chunk %d has no events (%d made)", slot, g->opt.nevents);
}

RtStatus rt_gpu_opt_fork(RtGpu *g, RtError *err) {
    const RtGpuApi *api = &g->api;
    RtStatus st = rt_gpu_use(g, err);
    if (st == RT_OK && !g->opt.stream) st = rt_fail(err, RT_ERR_ARG, "the optimizer offload's copy stream is not open");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventRecord(g->opt.issued, g->stream), err, "cuEventRecord", "the step before its update");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->opt.stream, g->opt.issued, 0), err, "cuStreamWaitEvent",
                         "the optimizer offload's copy stream waiting for the step");
    return st;
}

RtStatus rt_gpu_opt_down(RtGpu *g, void *host, const void *dev, int64_t bytes, int slot, RtError *err) {
    const RtGpuApi *api = &g->api;
    int64_t timed = -1; /* MBT_DEBUG / MBT_TRACE; before the download's event, which the host waits for */
    RtStatus st = opt_slot(g, slot, err);
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin_on(g, g->opt.stream, RT_GPU_TRACK_OPT, &timed, err);
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuMemcpyDtoHAsync(host, rt_dptr(dev), (size_t)bytes, g->opt.stream), err, "cuMemcpyDtoHAsync",
                         "the gradient to the host's update, %lld bytes", (long long)bytes);
    if (timed >= 0) st = rt_gpu_time_end(g, timed, "optimizer offload: gradient down", st, err);
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventRecord(g->opt.got[slot], g->opt.stream), err, "cuEventRecord",
                         "the gradient's download");
    if (st == RT_OK) g->opt.down_bytes += bytes;
    return st;
}

RtStatus rt_gpu_opt_wait_down(RtGpu *g, int slot, RtError *err) {
    RtStatus st = opt_slot(g, slot, err);
    return st == RT_OK ? rt_cu_check(&g->api, g->api.cuEventSynchronize(g->opt.got[slot]), err, "cuEventSynchronize",
                                     "waiting for the gradient's download")
                       : st;
}

RtStatus rt_gpu_opt_up(RtGpu *g, void *dev, const void *host, int64_t bytes, int slot, RtError *err) {
    const RtGpuApi *api = &g->api;
    int64_t timed = -1; /* MBT_DEBUG / MBT_TRACE */
    RtStatus st = opt_slot(g, slot, err);
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin_on(g, g->opt.stream, RT_GPU_TRACK_OPT, &timed, err);
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuMemcpyHtoDAsync(rt_dptr(dev), host, (size_t)bytes, g->opt.stream), err, "cuMemcpyHtoDAsync",
                         "the updated parameters to the device, %lld bytes", (long long)bytes);
    if (timed >= 0) st = rt_gpu_time_end(g, timed, "optimizer offload: parameters up", st, err);
    if (st == RT_OK)
        st =
            rt_cu_check(api, api->cuEventRecord(g->opt.put[slot], g->opt.stream), err, "cuEventRecord", "the parameters' upload");
    if (st == RT_OK) g->opt.up_bytes += bytes;
    return st;
}

RtStatus rt_gpu_opt_need(RtGpu *g, int slot, RtError *err) {
    int64_t timed = -1; /* MBT_DEBUG / MBT_TRACE: how long the compute stream stands still here */
    RtStatus st = opt_slot(g, slot, err);
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin(g, &timed, err);
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuStreamWaitEvent(g->stream, g->opt.put[slot], 0), err, "cuStreamWaitEvent",
                         "the step waiting for a chunk of the updated parameters");
    if (timed >= 0) st = rt_gpu_time_end(g, timed, "optimizer offload: the step waits for a chunk's upload", st, err);
    return st;
}

RtStatus rt_gpu_opt_join(RtGpu *g, const char *what, RtError *err) {
    const RtGpuApi *api = &g->api;
    RtStatus st = rt_cu_check(api, api->cuEventRecord(g->opt.copied, g->opt.stream), err, "cuEventRecord",
                              "the optimizer offload's copies");
    int64_t timed = -1; /* MBT_DEBUG / MBT_TRACE: how long the compute stream stands still here */
    if (st == RT_OK && g->timer.on) st = rt_gpu_time_begin(g, &timed, err);
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->stream, g->opt.copied, 0), err, "cuStreamWaitEvent",
                         "the step waiting for the updated parameters");
    if (timed >= 0) st = rt_gpu_time_end(g, timed, what, st, err);
    return st;
}

void rt_gpu_opt_bytes(const RtGpu *g, int64_t *down, int64_t *up) {
    *down = g ? g->opt.down_bytes : 0;
    *up = g ? g->opt.up_bytes : 0;
}

void rt_gpu_opt_close(RtGpu *g) {
    const RtGpuApi *api = &g->api;
    if (g->opt.stream) {
        api->cuStreamSynchronize(g->opt.stream);
        api->cuStreamDestroy(g->opt.stream);
    }
    if (g->opt.issued) api->cuEventDestroy(g->opt.issued);
    if (g->opt.copied) api->cuEventDestroy(g->opt.copied);
    for (int i = 0; i < g->opt.nevents; i++) {
        api->cuEventDestroy(g->opt.got[i]);
        api->cuEventDestroy(g->opt.put[i]);
    }
    free(g->opt.got);
    free(g->opt.put);
    g->opt.got = g->opt.put = NULL, g->opt.nevents = 0;
    g->opt.stream = NULL, g->opt.issued = g->opt.copied = NULL;
}
