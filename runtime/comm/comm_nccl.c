/* comm_nccl.c - the collectives' GPU transport: exchange_shards and gather_shards on device
 * buffers moved GPU to GPU by NCCL (docs/parallel.md, "On GPUs"), instead of through host copies.
 *
 * Pipeline position: under comm.c, which calls it from rt_comm_exchange_shards and
 * rt_comm_gather_shards once rt_comm_set_gpu has opened it. NCCL is the GPU runtime's optional
 * library (runtime/gpu/gpu_api.c opens it with dlopen, $MBT_LIBNCCL or libnccl.so.2); the world's
 * own backend (mpi or tcp) bootstraps it: rank 0's ncclUniqueId is broadcast through it.
 *
 * What moves. Both collectives are point-to-point (ncclSend / ncclRecv in one group), not NCCL's
 * reductions: no collective adds floating-point numbers (comm.h, "Determinism"), so the caller
 * sums the shards in its own fixed tree and the gradient keeps its bits at any number of ranks.
 * Shards may be of unequal length (the last is shorter), which all-gather does not allow; a
 * group of sends and receives moves the same bytes as a ring all-gather.
 *
 * Never a hang. The communicator is non-blocking (ncclConfig_t.blocking = 0): its creation and
 * every group return at once, and this file polls ncclCommGetAsyncError and the stream
 * (cuStreamQuery) until the work is done or the world's timeout passes; then the communicator is
 * aborted (ncclCommAbort) and the error names the collective and the timeout, so that a dead or
 * hung rank stops the others as the host backends do. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "gpu_internal.h"
#include "rt_program.h"

struct RtNccl {
    ncclComm_t comm;
    int version; /* ncclGetVersion: 22809 */
    /* rt_comm_nccl_queue_only: a group returns once NCCL has taken it (the communicator no longer
     * in progress), without waiting for the GPU's stream: the overlapped buckets queue their
     * collectives on the communication stream during the backward (train_dp.c) */
    int queue_only;
    /* a group's sends and receives, entry p peer p's (rt_nccl_group), filled by each collective */
    const float **sbuf;
    float **rbuf;
    int64_t *scount, *rcount;
};

static void rt_nccl_free(struct RtNccl *n) {
    if (!n) return;
    free(n->sbuf), free(n->rbuf), free(n->scount), free(n->rcount);
    free(n);
}

static void rt_nccl_nap(void) {
    struct timespec ts = {0, 50 * 1000}; /* 50 us: far below a collective's time, far above a spin */
    nanosleep(&ts, NULL);
}

static RtStatus rt_nccl_fail(RtComm *c, ncclResult_t rc, const char *call, const char *what, RtError *err) {
    const RtGpuApi *api = &c->gpu->api;
    return rt_fail(err, RT_ERR_IO, "%s (%s): NCCL error %d: %s", call, what, rc, api->ncclGetErrorString(rc));
}

/* Waits until the communicator has no call in progress and, with wait_stream, until the GPU's
 * stream has run what was queued on it, polling both against the world's timeout. */
static RtStatus rt_nccl_wait(RtComm *c, int wait_stream, const char *what, RtError *err) {
    RtGpu *g = c->gpu;
    const RtGpuApi *api = &g->api;
    double deadline = rt_comm_now() + c->timeout;
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t rc = api->ncclCommGetAsyncError(c->nccl->comm, &state);
        if (rc != ncclSuccess) return rt_nccl_fail(c, rc, "ncclCommGetAsyncError", what, err);
        if (state != ncclSuccess && state != ncclInProgress) return rt_nccl_fail(c, state, "NCCL", what, err);
        if (state == ncclSuccess) {
            if (!wait_stream) return RT_OK;
            CUresult q = api->cuStreamQuery(g->stream);
            if (q == CUDA_SUCCESS) return rt_gpu_sync(g, what, err); /* idle: the runtime's own bookkeeping */
            if (q != CUDA_ERROR_NOT_READY) return rt_cu_check(api, q, err, "cuStreamQuery", "%s", what);
        }
        if (rt_comm_now() > deadline) {
            api->ncclCommAbort(c->nccl->comm);
            c->nccl->comm = NULL;
            return rt_fail(err, RT_ERR_IO,
                           "%s: no progress in %g s (MBT_COMM_TIMEOUT): another rank stopped, or cannot reach this one; the "
                           "NCCL communicator is aborted",
                           what, c->timeout);
        }
        rt_nccl_nap();
    }
}

/* MBT_NCCL: 1 (the default: NCCL when the GPU runtime found it) or 0 (never). */
static RtStatus rt_nccl_env(int *use, RtError *err) {
    const char *s = getenv("MBT_NCCL");
    *use = 1;
    if (!s || !*s) return RT_OK;
    if (strcmp(s, "0") && strcmp(s, "1"))
        return rt_fail(err, RT_ERR_ARG, "MBT_NCCL is '%.40s': it must be 1 (NCCL when it is there, the default) or 0", s);
    *use = s[0] == '1';
    return RT_OK;
}

RtStatus rt_comm_nccl_open(RtComm *c, RtError *err) {
    const RtGpuApi *api = &c->gpu->api;
    const char *what = "collectives: opening NCCL among the ranks";
    int use;
    RtStatus st = rt_nccl_env(&use, err);
    if (st != RT_OK || !use || !api->nccl_lib || c->size < 2) return st;
    struct RtNccl *n = calloc(1, sizeof *n);
    if (n) {
        n->sbuf = calloc((size_t)c->size, sizeof *n->sbuf), n->rbuf = calloc((size_t)c->size, sizeof *n->rbuf);
        n->scount = calloc((size_t)c->size, sizeof *n->scount), n->rcount = calloc((size_t)c->size, sizeof *n->rcount);
    }
    if (!n || !n->sbuf || !n->rbuf || !n->scount || !n->rcount) {
        rt_nccl_free(n);
        return rt_fail(err, RT_ERR_NOMEM, "%s: out of memory", what);
    }
    if (api->ncclGetVersion(&n->version) != ncclSuccess) n->version = 0;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t rc = c->rank == 0 ? api->ncclGetUniqueId(&id) : ncclSuccess;
    st = rc == ncclSuccess ? RT_OK : rt_nccl_fail(c, rc, "ncclGetUniqueId", what, err);
    /* every rank learns whether rank 0 has an id: a flag in the broadcast's last byte */
    unsigned char buf[sizeof id + 1];
    memcpy(buf, &id, sizeof id);
    buf[sizeof id] = st == RT_OK;
    RtError be;
    if (c->ops->broadcast(c, buf, (int64_t)sizeof buf, 0, &be) != RT_OK) {
        if (st == RT_OK) *err = be;
        rt_nccl_free(n);
        return RT_ERR_IO;
    }
    if (st != RT_OK || !buf[sizeof id]) {
        rt_nccl_free(n);
        return st != RT_OK ? st : rt_fail(err, RT_ERR_IO, "%s: rank 0 could not make NCCL's id (its error says why)", what);
    }
    memcpy(&id, buf, sizeof id);
    ncclConfig_t config = {.size = sizeof config,
                           .magic = RT_NCCL_CONFIG_MAGIC,
                           .version = RT_NCCL_CONFIG_VERSION,
                           .blocking = 0,
                           .cgaClusterSize = INT32_MIN, /* NCCL_CONFIG_UNDEF_INT: NCCL's defaults */
                           .minCTAs = INT32_MIN,
                           .maxCTAs = INT32_MIN,
                           .netName = NULL};
    c->nccl = n;
    rc = api->ncclCommInitRankConfig(&n->comm, c->size, id, c->rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) st = rt_nccl_fail(c, rc, "ncclCommInitRankConfig", what, err);
    else if (!n->comm) st = rt_fail(err, RT_ERR_IO, "%s: ncclCommInitRankConfig gave no communicator", what);
    else st = rt_nccl_wait(c, 0, what, err);
    if (st != RT_OK) {
        if (n->comm) api->ncclCommAbort(n->comm);
        rt_nccl_free(n);
        c->nccl = NULL;
        return rt_error_context(err, "%s (MBT_NCCL=0 stages GPU buffers through host memory instead)", what);
    }
    return RT_OK;
}

int rt_comm_nccl_version(const RtComm *c) { return c->nccl ? c->nccl->version : 0; }

void rt_comm_nccl_close(RtComm *c, int abort) {
    if (!c->nccl) return;
    const RtGpuApi *api = &c->gpu->api;
    if (c->nccl->comm) {
        if (abort) api->ncclCommAbort(c->nccl->comm);
        else api->ncclCommDestroy(c->nccl->comm);
    }
    rt_nccl_free(c->nccl);
    c->nccl = NULL;
}

/* One group of the sends and receives of floats c->nccl holds on the GPU's stream, then the wait
 * for it. Entry p is peer p's: its pointer and count (0: nothing with that peer). */
static RtStatus rt_nccl_group(RtComm *c, const char *what, RtError *err) {
    RtGpu *g = c->gpu;
    const RtGpuApi *api = &g->api;
    ncclComm_t comm = c->nccl->comm;
    const float *const *sbuf = c->nccl->sbuf;
    float *const *rbuf = c->nccl->rbuf;
    const int64_t *scount = c->nccl->scount, *rcount = c->nccl->rcount;
    if (!comm) return rt_fail(err, RT_ERR_IO, "%s: the NCCL communicator was aborted after an earlier failure", what);
    ncclResult_t rc = api->ncclGroupStart();
    const char *call = "ncclGroupStart";
    for (int p = 0; p < c->size && rc == ncclSuccess; p++) {
        if (p == c->rank) continue;
        if (scount[p] > 0) rc = api->ncclSend(sbuf[p], (size_t)scount[p], ncclFloat32, p, comm, g->stream), call = "ncclSend";
        if (rc == ncclSuccess && rcount[p] > 0)
            rc = api->ncclRecv(rbuf[p], (size_t)rcount[p], ncclFloat32, p, comm, g->stream), call = "ncclRecv";
    }
    ncclResult_t end = api->ncclGroupEnd(); /* always, so that a failed call leaves no group open */
    if (rc == ncclSuccess || rc == ncclInProgress) rc = end, call = "ncclGroupEnd";
    if (rc != ncclSuccess && rc != ncclInProgress) return rt_nccl_fail(c, rc, call, what, err);
    return rt_nccl_wait(c, !c->nccl->queue_only, what, err);
}

void rt_comm_nccl_queue_only(RtComm *c, int on) {
    if (c->nccl) c->nccl->queue_only = on;
}

RtStatus rt_comm_nccl_settle(RtComm *c, const char *what, RtError *err) {
    if (!c->nccl) return RT_OK;
    if (!c->nccl->comm) return rt_fail(err, RT_ERR_IO, "%s: the NCCL communicator was aborted after an earlier failure", what);
    return rt_nccl_wait(c, 1, what, err);
}

RtStatus rt_comm_nccl_exchange(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err) {
    struct RtNccl *n = c->nccl;
    int r = c->rank;
    int64_t len = off[r + 1] - off[r];
    for (int p = 0; p < c->size; p++) {
        n->sbuf[p] = mine + off[p], n->scount[p] = off[p + 1] - off[p]; /* peer p's shard of this rank's vector */
        n->rbuf[p] = got + (int64_t)p * len, n->rcount[p] = len;        /* this rank's shard of peer p's */
    }
    /* this rank's own copy, queued before the group on the same stream */
    RtStatus st = len > 0 ? rt_gpu_copy(c->gpu, got + (int64_t)r * len, mine + off[r], len * (int64_t)sizeof *got, err) : RT_OK;
    return st == RT_OK ? rt_nccl_group(c, "collectives: exchange_shards over NCCL", err) : st;
}

RtStatus rt_comm_nccl_gather(RtComm *c, float *v, const int64_t *off, RtError *err) {
    struct RtNccl *n = c->nccl;
    int r = c->rank;
    for (int p = 0; p < c->size; p++) {
        n->sbuf[p] = v + off[r], n->scount[p] = off[r + 1] - off[r]; /* this rank's shard to every peer */
        n->rbuf[p] = v + off[p], n->rcount[p] = off[p + 1] - off[p]; /* peer p's shard into its place */
    }
    return rt_nccl_group(c, "collectives: gather_shards over NCCL", err);
}
