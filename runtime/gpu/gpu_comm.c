/* gpu_comm.c - the data-parallel reduction's communication stream (rt_gpu.h, rt_gpu_comm_*;
 * docs/parallel.md, "The GPU's buckets overlapped with the backward").
 *
 * Pipeline position: beside gpu.c and gpu_act.c; the train command's GPU buckets
 * (runtime/cli/train_dp.c) use it during the backward of a step's last micro-batch. When a bucket's
 * gradients are final (the generated forward_backward's rt_grad_ready, right after their adds are
 * queued), the communication stream waits for an event recorded on the compute stream there
 * (fork), and the bucket's work - the local tree's last additions over its range, its NCCL
 * exchange, the tree over the ranks, its NCCL gather - is queued on it (enter .. leave: g's entry
 * points queue on g->stream, which is swapped for the time). Before the update the compute stream
 * waits for an event recorded on the communication stream after the last bucket (join). CUDA's
 * wait takes the event's state when it is queued, so one event each way, recorded again each
 * time, serves (as gpu_act.c's copy stream). The calls run eagerly, never inside a CUDA graph
 * capture: the step's last micro-batch is not captured while the buckets overlap it (exec.c). */
#include "gpu_internal.h"

RtStatus rt_gpu_comm_open(RtGpu *g, RtError *err) {
    if (g->comm.stream) return RT_OK;
    RtStatus st = rt_gpu_side_stream(g, &g->comm.stream, &g->comm.ready, &g->comm.done, "the data-parallel communication stream",
                                     "the data-parallel buckets' events", err);
    if (st != RT_OK) rt_gpu_comm_close(g);
    return st;
}

RtStatus rt_gpu_comm_fork(RtGpu *g, RtError *err) {
    const RtGpuApi *api = &g->api;
    CUstream compute = g->comm.compute ? g->comm.compute : g->stream;
    RtStatus st = rt_cu_check(api, api->cuEventRecord(g->comm.ready, compute), err, "cuEventRecord",
                              "the step before a bucket's reduction");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->comm.stream, g->comm.ready, 0), err, "cuStreamWaitEvent",
                         "the communication stream waiting for the backward");
    return st;
}

void rt_gpu_comm_enter_stream(RtGpu *g, CUstream s) {
    if (g->comm.compute) return;
    g->comm.compute = g->stream;
    g->stream = s;
}

void rt_gpu_comm_enter(RtGpu *g) { rt_gpu_comm_enter_stream(g, g->comm.stream); }

void rt_gpu_comm_leave(RtGpu *g) {
    if (!g->comm.compute) return;
    g->stream = g->comm.compute;
    g->comm.compute = NULL;
}

RtStatus rt_gpu_comm_join(RtGpu *g, RtError *err) {
    const RtGpuApi *api = &g->api;
    RtStatus st =
        rt_cu_check(api, api->cuEventRecord(g->comm.done, g->comm.stream), err, "cuEventRecord", "the buckets' reductions");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(g->stream, g->comm.done, 0), err, "cuStreamWaitEvent",
                         "the step waiting for the buckets' reductions");
    return st;
}

void rt_gpu_comm_close(RtGpu *g) {
    const RtGpuApi *api = &g->api;
    rt_gpu_comm_leave(g);
    if (g->comm.stream) {
        api->cuStreamSynchronize(g->comm.stream);
        api->cuStreamDestroy(g->comm.stream);
    }
    if (g->comm.ready) api->cuEventDestroy(g->comm.ready);
    if (g->comm.done) api->cuEventDestroy(g->comm.done);
    g->comm.stream = NULL, g->comm.ready = g->comm.done = NULL;
}
