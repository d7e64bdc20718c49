/* act_offload.c - offload { activations = nvme | host } (rt_exec.h, rt_act_copy; docs/memory.md,
 * "Activation offload").
 *
 * host (RtTrainSettings.offload_act 1, a GPU build): on the GPU the copies go to page-locked host
 * memory on a copy stream (runtime/gpu/gpu_act.c); a GPU build run on the CPU (--device cpu, or
 * auto without a GPU) runs the same forward_backward, whose arena reuses the copied-out slots, so
 * there the copies are memcpy to a host buffer and back (the bytes must be kept somewhere; on the
 * CPU they are in host memory either way).
 *
 * Pipeline position: called by the generated forward_backward at the points of the compiler's plan
 * (plan_offload.c): a write right after a held activation's last forward use, a wait some launches
 * later (after which its arena slot is reused), a read some launches before its first backward use
 * into its second slot, and a wait just before that use. The plan places both slots at whole pages
 * of the arena (which starts a page: exec.c) and gives each buffer a slot of whole pages in the
 * store, so every request is aligned as O_DIRECT wants it. The store waits for everything queued,
 * so a wait covers every copy issued before it.
 *
 * nvme on the GPU: the store as on the CPU, and the GPU's copies staged through bounded pinned
 * memory to it (runtime/gpu/gpu_act.c, rt_gpu_act_open_nvme). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt_exec.h"
#include "rt_gpu.h"
#include "rt_store.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

RtStatus rt_exec_act_open(RtExec *e, const char *dir, const char *name, RtError *err) {
    int64_t bytes = e->prog->train.offload_act_bytes;
    if (bytes <= 0 || e->act_store || e->act_host) return RT_OK;
    if (e->prog->train.offload_act == 1) { /* host: pinned memory on the GPU, plain memory on the CPU */
        if (e->gpu) return rt_gpu_act_open(e->gpu, bytes, err);
        e->act_host = calloc(1, (size_t)bytes);
        if (!e->act_host)
            return rt_fail(err, RT_ERR_NOMEM, "activations: cannot allocate %lld bytes of host memory for them",
                           (long long)bytes);
        return RT_OK;
    }
    char msg[512];
    e->act_store = rt_store_open(dir && *dir ? dir : ".", name, (size_t)bytes, msg, sizeof msg);
    if (!e->act_store) return rt_fail(err, RT_ERR_IO, "activations: %s", msg);
    /* on the GPU the copies go through bounded pinned staging to the store (gpu_act.c) */
    if (e->gpu) return rt_gpu_act_open_nvme(e->gpu, e->act_store, e->act_staging, err);
    return RT_OK;
}

int32_t rt_act_copy(RtExec *e, int32_t op, int64_t off, void *buf, int64_t len, RtError *err) {
    if (!e) /* an RtStep not made by rt_exec_step */
        return rt_fail(err, RT_ERR_ARG, "activations: forward_backward copies activations to a store, but RtStep.act is NULL");
    if (e->prog->train.offload_act == 1) { /* host */
        if (e->gpu) {
            if (!rt_gpu_act_bytes(e->gpu)) {
                RtStatus st = rt_exec_act_open(e, NULL, NULL, err);
                if (st != RT_OK) return st;
            }
            return rt_gpu_act_copy(e->gpu, op, off, buf, len, err);
        }
        if (!e->act_host) {
            RtStatus st = rt_exec_act_open(e, NULL, NULL, err);
            if (st != RT_OK) return st;
        }
        int64_t cap = e->prog->train.offload_act_bytes;
        if (op < 2 && (off < 0 || len < 0 || off > cap || len > cap - off))
            return rt_fail(err, RT_ERR_ARG, "activations: copy of bytes [%lld, +%lld) outside the %lld bytes planned",
                           (long long)off, (long long)len, (long long)cap);
        if (op == 0) memcpy(e->act_host + off, buf, (size_t)len);
        else if (op == 1) memcpy(buf, e->act_host + off, (size_t)len);
        return RT_OK;
    }
    if (!e->act_store) { /* a caller other than the train loop (which opens it first): here */
        char name[256];
        snprintf(name, sizeof name, "mbt-%s-%ld.activations", e->prog->train.name ? e->prog->train.name : "step", (long)getpid());
        for (char *c = name; *c; c++)
            if (*c == '/') *c = '_';
        RtStatus st = rt_exec_act_open(e, e->act_dir, name, err);
        if (st != RT_OK) return st;
        if (!e->act_store) return rt_fail(err, RT_ERR_ARG, "activations: the program has no activation store");
    }
    if (e->gpu) {
        RtStatus st = rt_gpu_act_copy(e->gpu, op, off, buf, len, err);
        e->act_wait_s = rt_gpu_act_wait_s(e->gpu);
        return st;
    }
    int rc;
    if (op == 0) rc = rt_store_write(e->act_store, (size_t)off, buf, (size_t)len);
    else if (op == 1) rc = rt_store_read(e->act_store, (size_t)off, buf, (size_t)len);
    else {
        double t0 = now_s();
        rc = rt_store_wait(e->act_store);
        e->act_wait_s += now_s() - t0;
    }
    if (rc != 0) return rt_fail(err, RT_ERR_IO, "activations: %s", rt_store_error(e->act_store));
    return RT_OK;
}
