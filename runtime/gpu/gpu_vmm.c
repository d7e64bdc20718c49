/* gpu_vmm.c - a device region at fixed addresses whose pages are mapped to physical memory on
 * demand (rt_gpu.h, RtGpuRegion): ZeRO-3's parameter region on the GPU (runtime/comm/zero3.c;
 * docs/parallel.md, "ZeRO-3 on the GPU").
 *
 * Pipeline position: beside gpu.c, under runtime/comm/zero3.c, which decides which pages are
 * held; this file maps and unmaps them and gathers on its stream.
 *
 * The region is a virtual address reservation (cuMemAddressReserve) of the bytes rounded up to
 * the allocation granularity (cuMemGetAllocationGranularity: 2 MiB on the GPUs we know; the
 * emulated GPU's 4 KiB, MBT_FAKE_CUDA_GRANULARITY), so the kernels' addresses never change. Each
 * page (one granule) is either unmapped or mapped to one physical chunk of a granule (cuMemCreate,
 * cuMemMap, cuMemSetAccess). Chunks are never freed while the region lives: an unmapped page's
 * chunk goes to a free list and the next page to map takes it, so the chunks created are the most
 * pages mapped at once, and that is the device memory the region costs (counted in
 * rt_gpu_peak_bytes like every allocation).
 *
 * Never unmapped under running work. A page given back (rt_gpu_region_release) stays mapped until
 * an event recorded on the compute stream after the launches queued so far has completed - the
 * last kernels that read it; rt_gpu_region_reclaim unmaps those whose event is done (cuEventQuery),
 * and a map that finds no free chunk first waits for the oldest release (cuEventSynchronize) before
 * it creates a new chunk. A released page mapped again before its unmap simply stays mapped. */
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

#define RT_REGION_EVENTS 64 /* releases whose event may be pending at once (the oldest is waited for beyond) */

struct RtGpuRegion {
    RtGpu *g;
    CUdeviceptr base;
    int64_t page, npages, bytes;         /* bytes: the reservation's */
    CUmemGenericAllocationHandle *chunk; /* per page: its chunk (0: unmapped) */
    int *pending;                        /* per page: 1 + the release event it waits for, or 0 */
    CUmemGenericAllocationHandle *free_chunks;
    int64_t nfree, created, mapped, high;
    CUevent ev[RT_REGION_EVENTS];
    int ev_live[RT_REGION_EVENTS]; /* recorded, pages waiting for it */
    uint64_t ev_seq[RT_REGION_EVENTS], seq;
    CUstream stream; /* the gathers' stream, and its event */
    CUevent fork, landed[2];
};

static RtStatus rt_region_prop(RtGpuRegion *r, CUmemAllocationProp *prop) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = r->g->ordinal;
    return RT_OK;
}

RtStatus rt_gpu_region_open(RtGpu *g, int64_t bytes, RtGpuRegion **out, void **base, int64_t *page, RtError *err) {
    *out = NULL;
    const RtGpuApi *api = &g->api;
    RtStatus st = rt_gpu_use(g, err);
    if (st != RT_OK) return st;
    RtGpuRegion *r = calloc(1, sizeof *r);
    if (!r) return rt_fail(err, RT_ERR_NOMEM, "cannot allocate the parameter region's pages");
    r->g = g;
    CUmemAllocationProp prop;
    rt_region_prop(r, &prop);
    size_t gran = 0;
    st = rt_cu_check(api, api->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), err,
                     "cuMemGetAllocationGranularity", "the parameter region's pages");
    if (st == RT_OK && gran == 0) st = rt_fail(err, RT_ERR_IO, "cuMemGetAllocationGranularity gave 0 bytes");
    if (st != RT_OK) {
        free(r);
        return st;
    }
    r->page = (int64_t)gran;
    r->npages = ((bytes > 0 ? bytes : 1) + r->page - 1) / r->page;
    r->bytes = r->npages * r->page;
    r->chunk = calloc((size_t)r->npages, sizeof *r->chunk);
    r->pending = calloc((size_t)r->npages, sizeof *r->pending);
    r->free_chunks = calloc((size_t)r->npages, sizeof *r->free_chunks);
    if (!r->chunk || !r->pending || !r->free_chunks) {
        rt_gpu_region_close(r);
        return rt_fail(err, RT_ERR_NOMEM, "cannot allocate the parameter region's pages");
    }
    st = rt_cu_check(api, api->cuMemAddressReserve(&r->base, (size_t)r->bytes, 0, 0, 0), err, "cuMemAddressReserve",
                     "the parameter region, %lld bytes", (long long)r->bytes);
    for (int i = 0; i < RT_REGION_EVENTS && st == RT_OK; i++)
        st = rt_cu_check(api, api->cuEventCreate(&r->ev[i], CU_EVENT_DEFAULT), err, "cuEventCreate", "the pages' releases");
    if (st == RT_OK)
        st = rt_gpu_side_stream(g, &r->stream, &r->fork, &r->landed[0], "the parameter gathers' stream", "the gathers' events",
                                err);
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventCreate(&r->landed[1], CU_EVENT_DEFAULT), err, "cuEventCreate", "the gathers' events");
    if (st != RT_OK) {
        rt_gpu_region_close(r);
        return st;
    }
    *out = r, *base = (void *)(uintptr_t)r->base, *page = r->page;
    return RT_OK;
}

/* Unmaps page p (its chunk to the free list). */
static RtStatus rt_region_unmap(RtGpuRegion *r, int64_t p, RtError *err) {
    const RtGpuApi *api = &r->g->api;
    RtStatus st = rt_cu_check(api, api->cuMemUnmap(r->base + (CUdeviceptr)(p * r->page), (size_t)r->page), err, "cuMemUnmap",
                              "page %lld of the parameter region", (long long)p);
    if (st != RT_OK) return st;
    r->free_chunks[r->nfree++] = r->chunk[p];
    r->chunk[p] = 0, r->pending[p] = 0, r->mapped--;
    return RT_OK;
}

/* Event slot k's pages unmapped (its event done). */
static RtStatus rt_region_reclaim_slot(RtGpuRegion *r, int k, RtError *err) {
    RtStatus st = RT_OK;
    for (int64_t p = 0; p < r->npages && st == RT_OK; p++)
        if (r->pending[p] == k + 1) st = rt_region_unmap(r, p, err);
    r->ev_live[k] = 0;
    return st;
}

/* The live release slot recorded first, or -1. */
static int rt_region_oldest(const RtGpuRegion *r) {
    int k = -1;
    for (int i = 0; i < RT_REGION_EVENTS; i++)
        if (r->ev_live[i] && (k < 0 || r->ev_seq[i] < r->ev_seq[k])) k = i;
    return k;
}

RtStatus rt_gpu_region_reclaim(RtGpuRegion *r, int wait, RtError *err) {
    const RtGpuApi *api = &r->g->api;
    for (int i = 0; i < RT_REGION_EVENTS; i++) {
        if (!r->ev_live[i]) continue;
        CUresult q = wait ? api->cuEventSynchronize(r->ev[i]) : api->cuEventQuery(r->ev[i]);
        if (q == CUDA_ERROR_NOT_READY) continue;
        RtStatus st = rt_cu_check(api, q, err, wait ? "cuEventSynchronize" : "cuEventQuery", "a release of parameter pages");
        if (st == RT_OK) st = rt_region_reclaim_slot(r, i, err);
        if (st != RT_OK) return st;
    }
    return RT_OK;
}

RtStatus rt_gpu_region_map(RtGpuRegion *r, int64_t p0, int64_t p1, RtError *err) {
    const RtGpuApi *api = &r->g->api;
    RtStatus st = rt_gpu_use(r->g, err);
    if (p0 < 0) p0 = 0;
    if (p1 > r->npages) p1 = r->npages;
    for (int64_t p = p0; p < p1 && st == RT_OK; p++) {
        if (r->chunk[p]) { /* mapped (perhaps released and not yet unmapped: it stays) */
            r->pending[p] = 0;
            continue;
        }
        if (r->nfree == 0) st = rt_gpu_region_reclaim(r, 0, err); /* the releases done by now */
        while (st == RT_OK && r->nfree == 0) {                    /* the oldest release still pending: wait for it */
            int k = rt_region_oldest(r);
            if (k < 0) break;
            st = rt_cu_check(api, api->cuEventSynchronize(r->ev[k]), err, "cuEventSynchronize", "a release of parameter pages");
            if (st == RT_OK) st = rt_region_reclaim_slot(r, k, err);
        }
        CUmemGenericAllocationHandle h = 0;
        if (st == RT_OK && r->nfree > 0) h = r->free_chunks[--r->nfree];
        else if (st == RT_OK) {
            CUmemAllocationProp prop;
            rt_region_prop(r, &prop);
            st = rt_cu_check(api, api->cuMemCreate(&h, (size_t)r->page, &prop, 0), err, "cuMemCreate",
                             "a page of the parameter region, %lld bytes", (long long)r->page);
            if (st == RT_OK) {
                r->created++;
                r->g->mem.now += r->page;
                if (r->g->mem.now > r->g->mem.peak) r->g->mem.peak = r->g->mem.now;
            }
        }
        if (st != RT_OK) break;
        CUdeviceptr a = r->base + (CUdeviceptr)(p * r->page);
        st = rt_cu_check(api, api->cuMemMap(a, (size_t)r->page, 0, h, 0), err, "cuMemMap", "page %lld of the parameter region",
                         (long long)p);
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, r->g->ordinal}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (st == RT_OK) {
            st = rt_cu_check(api, api->cuMemSetAccess(a, (size_t)r->page, &acc, 1), err, "cuMemSetAccess",
                             "page %lld of the parameter region", (long long)p);
            if (st != RT_OK) api->cuMemUnmap(a, (size_t)r->page);
        }
        if (st != RT_OK) {
            r->free_chunks[r->nfree++] = h;
            break;
        }
        r->chunk[p] = h, r->mapped++;
        if (r->mapped > r->high) r->high = r->mapped;
    }
    return st;
}

RtStatus rt_gpu_region_release(RtGpuRegion *r, const int64_t *pages, int64_t n, RtError *err) {
    if (n <= 0) return RT_OK;
    const RtGpuApi *api = &r->g->api;
    int k = -1;
    for (int i = 0; i < RT_REGION_EVENTS && k < 0; i++)
        if (!r->ev_live[i]) k = i;
    RtStatus st = RT_OK;
    if (k < 0) { /* every slot waits: the oldest first */
        k = rt_region_oldest(r);
        st = rt_cu_check(api, api->cuEventSynchronize(r->ev[k]), err, "cuEventSynchronize", "a release of parameter pages");
        if (st == RT_OK) st = rt_region_reclaim_slot(r, k, err);
    }
    /* after the launches queued so far on the compute stream: the last that read these pages */
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventRecord(r->ev[k], r->g->stream), err, "cuEventRecord", "a release of parameter pages");
    if (st != RT_OK) return st;
    r->ev_live[k] = 1, r->ev_seq[k] = ++r->seq;
    for (int64_t i = 0; i < n; i++)
        if (pages[i] >= 0 && pages[i] < r->npages && r->chunk[pages[i]]) r->pending[pages[i]] = k + 1;
    return RT_OK;
}

RtStatus rt_gpu_region_unmap_now(RtGpuRegion *r, const int64_t *pages, int64_t n, RtError *err) {
    RtStatus st = rt_gpu_sync(r->g, "releasing the parameter region's pages", err);
    if (st == RT_OK && r->stream)
        st = rt_cu_check(&r->g->api, r->g->api.cuStreamSynchronize(r->stream), err, "cuStreamSynchronize",
                         "the parameter gathers' stream");
    if (st == RT_OK) st = rt_gpu_region_reclaim(r, 1, err);
    for (int64_t i = 0; i < n && st == RT_OK; i++)
        if (pages[i] >= 0 && pages[i] < r->npages && r->chunk[pages[i]]) st = rt_region_unmap(r, pages[i], err);
    return st;
}

RtStatus rt_gpu_region_begin(RtGpuRegion *r, RtError *err) {
    const RtGpuApi *api = &r->g->api;
    /* the gathers' stream waits for what the compute stream has queued so far (the update that
     * wrote this rank's shard; the launches that last read a page it fills again) */
    RtStatus st = rt_cu_check(api, api->cuEventRecord(r->fork, r->g->stream), err, "cuEventRecord", "before a parameter gather");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuStreamWaitEvent(r->stream, r->fork, 0), err, "cuStreamWaitEvent",
                         "a parameter gather waiting for the compute stream");
    if (st == RT_OK) rt_gpu_comm_enter_stream(r->g, r->stream);
    return st;
}

RtStatus rt_gpu_region_end(RtGpuRegion *r, int slot, RtError *err) {
    const RtGpuApi *api = &r->g->api;
    rt_gpu_comm_leave(r->g);
    return rt_cu_check(api, api->cuEventRecord(r->landed[slot & 1], r->stream), err, "cuEventRecord", "a parameter gather");
}

RtStatus rt_gpu_region_wait(RtGpuRegion *r, int slot, RtError *err) {
    const RtGpuApi *api = &r->g->api;
    return rt_cu_check(api, api->cuStreamWaitEvent(r->g->stream, r->landed[slot & 1], 0), err, "cuStreamWaitEvent",
                       "the step waiting for a parameter gather");
}

int64_t rt_gpu_region_mapped(const RtGpuRegion *r) { return r ? r->mapped : 0; }
int64_t rt_gpu_region_high(const RtGpuRegion *r) { return r ? r->high : 0; }
void rt_gpu_region_reset_high(RtGpuRegion *r) { r->high = r->mapped; }
int64_t rt_gpu_region_chunks(const RtGpuRegion *r) { return r ? r->created : 0; }

void rt_gpu_region_close(RtGpuRegion *r) {
    if (!r) return;
    const RtGpuApi *api = &r->g->api;
    api->cuCtxSetCurrent(r->g->ctx);
    if (r->g->stream) api->cuStreamSynchronize(r->g->stream);
    if (r->stream) {
        api->cuStreamSynchronize(r->stream);
        api->cuStreamDestroy(r->stream);
    }
    for (int64_t p = 0; r->chunk && p < r->npages; p++)
        if (r->chunk[p]) {
            api->cuMemUnmap(r->base + (CUdeviceptr)(p * r->page), (size_t)r->page);
            api->cuMemRelease(r->chunk[p]);
        }
    for (int64_t i = 0; i < r->nfree; i++) api->cuMemRelease(r->free_chunks[i]);
    r->g->mem.now -= r->created * r->page;
    if (r->base) api->cuMemAddressFree(r->base, (size_t)r->bytes);
    for (int i = 0; i < RT_REGION_EVENTS; i++)
        if (r->ev[i]) api->cuEventDestroy(r->ev[i]);
    if (r->fork) api->cuEventDestroy(r->fork);
    for (int i = 0; i < 2; i++)
        if (r->landed[i]) api->cuEventDestroy(r->landed[i]);
    free(r->chunk);
    free(r->pending);
    free(r->free_chunks);
    free(r);
}
