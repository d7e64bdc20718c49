/* opt_offload.c - optimizer-state offload to the NVMe store (rt_offload.h): the state in a store
 * file, streamed through three staging buffers by the chunked update.
 *
 * Pipeline position: called by the train loop (runtime/cli/train.c) in place of one
 * optimizer_update over the whole state; under it the store (store.c) and the program's ranged
 * optimizer_update (the one ZeRO uses: RtStep.lo/hi, elementwise, so that updating a chunk is the
 * same arithmetic on the same elements as updating everything).
 *
 * The file holds nchunks slots of `slot` bytes (4096-aligned); slot c is chunk c's state, the
 * parameters [c x chunk, min((c + 1) x chunk, n)): variable k's values at k x len floats, len the
 * chunk's length, the layout optimizer_update takes with lo/hi. An update is
 *
 *     read chunk 0 into buffer 0; wait
 *     for c in 0 .. nchunks-1:
 *         queue the read of chunk c + 1 into buffer (c + 1) % 3
 *         optimizer_update over chunk c in buffer c % 3 (the store's reads and writes go on meanwhile)
 *         wait (chunk c + 1 read, chunk c - 1 written)
 *         queue the write of chunk c from buffer c % 3
 *     wait
 *
 * so the buffer read into was written back (and waited for) an iteration earlier. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_offload.h"
#include "rt_store.h"

struct RtOptOffload {
    const RtProgram *p;
    RtStore *store;
    int64_t n, nstate, chunk, nchunks; /* n: the state's length, rt_state_part */
    size_t slot;                       /* bytes a chunk's slot (4096-aligned) */
    float *buf[3];
    double wait_s;
    char engine[64];
};

static int64_t chunk_len(const RtOptOffload *o, int64_t c) {
    int64_t lo = c * o->chunk;
    return o->n - lo < o->chunk ? o->n - lo : o->chunk;
}

static RtStatus store_failed(RtOptOffload *o, RtError *err) {
    return rt_fail(err, RT_ERR_IO, "the optimizer state: %s", rt_store_error(o->store));
}

/* The time blocked in rt_store_wait: what the update did not hide. */
static RtStatus offload_wait(RtOptOffload *o, RtError *err) {
    double t0 = rt_now();
    int rc = rt_store_wait(o->store);
    o->wait_s += rt_now() - t0;
    return rc == 0 ? RT_OK : store_failed(o, err);
}

/* chunk c of the whole layout (nstate parts of n) into a slot's layout, and back */
static void pack(const RtOptOffload *o, int64_t c, const float *state, float *slot) {
    int64_t lo = c * o->chunk, len = chunk_len(o, c);
    for (int64_t k = 0; k < o->nstate; k++) memcpy(slot + k * len, state + k * o->n + lo, (size_t)len * sizeof *slot);
}

static void unpack(const RtOptOffload *o, int64_t c, const float *slot, float *state) {
    int64_t lo = c * o->chunk, len = chunk_len(o, c);
    for (int64_t k = 0; k < o->nstate; k++) memcpy(state + k * o->n + lo, slot + k * len, (size_t)len * sizeof *slot);
}

RtStatus rt_opt_offload_open(RtOptOffload **out, const RtProgram *p, const char *dir, const char *name, const float *state,
                             RtError *err) {
    *out = NULL;
    const RtTrainSettings *t = &p->train;
    RtOptOffload *o = calloc(1, sizeof *o);
    if (!o) return rt_fail_errno(err, ENOMEM, "cannot allocate the optimizer-state offload");
    o->p = p;
    o->n = rt_state_part(p);
    o->nstate = p->nstate;
    o->chunk = t->offload_chunk;
    if (o->nstate < 1 || o->n < 1 || o->chunk < 1 || o->chunk % 1024 != 0) {
        RtStatus st = rt_fail(err, RT_ERR_ARG, "offload { optimizer = nvme }: %lld state variables of %lld, chunks of %lld",
                              (long long)o->nstate, (long long)o->n, (long long)o->chunk);
        free(o);
        return st;
    }
    o->nchunks = (o->n + o->chunk - 1) / o->chunk;
    o->slot = rt_store_align((size_t)(o->nstate * o->chunk) * sizeof(float));
    char msg[RT_ERROR_MAX];
    o->store = rt_store_open(dir, name, o->slot * (size_t)o->nchunks, msg, sizeof msg);
    if (!o->store) {
        free(o);
        return rt_fail(err, RT_ERR_IO, "offload { optimizer = nvme }: %s", msg);
    }
    snprintf(o->engine, sizeof o->engine, "%s, %s", rt_store_uring(o->store) ? "io_uring" : "a pread/pwrite thread",
             rt_store_direct(o->store) ? "O_DIRECT" : "buffered");
    for (int i = 0; i < 3; i++)
        if (!(o->buf[i] = rt_store_alloc(o->slot))) {
            size_t slot = o->slot;
            rt_opt_offload_close(o);
            return rt_fail_errno(err, ENOMEM, "cannot allocate the optimizer state's staging buffers (3 x %zu bytes)", slot);
        }
    /* the file reads as zeros: a state that starts at 0 needs no writing */
    if (state) {
        for (int64_t c = 0; c < o->nchunks; c++) {
            float *b = o->buf[c % 2];
            RtStatus st = c >= 2 ? offload_wait(o, err) : RT_OK; /* b's last write is done */
            if (st == RT_OK) {
                pack(o, c, state, b);
                if (rt_store_write(o->store, (size_t)c * o->slot, b, o->slot) != 0) st = store_failed(o, err);
            }
            if (st != RT_OK) {
                rt_opt_offload_close(o);
                return st;
            }
        }
        RtStatus st = offload_wait(o, err);
        if (st != RT_OK) {
            rt_opt_offload_close(o);
            return st;
        }
    }
    o->wait_s = 0;
    *out = o;
    return RT_OK;
}

RtStatus rt_opt_offload_update(RtOptOffload *o, RtExec *x, RtStep *s, RtError *err) {
    return rt_opt_offload_update_chunks(o, x, s, NULL, err);
}

RtStatus rt_opt_offload_update_chunks(RtOptOffload *o, RtExec *x, RtStep *s, const RtOptChunkHooks *hooks, RtError *err) {
    RtStatus st = RT_OK;
    if (rt_store_read(o->store, 0, o->buf[0], o->slot) != 0) return store_failed(o, err);
    if ((st = offload_wait(o, err)) != RT_OK) return st;
    for (int64_t c = 0; c < o->nchunks; c++) {
        if (c + 1 < o->nchunks && rt_store_read(o->store, (size_t)(c + 1) * o->slot, o->buf[(c + 1) % 3], o->slot) != 0)
            return store_failed(o, err);
        s->state = o->buf[c % 3];
        s->lo = c * o->chunk;
        s->hi = s->lo + chunk_len(o, c);
        /* on a GPU build the CPU's optimizer_update, over the host's copies s holds (train.c's
         * rt_train_host_update brings the gradient down and takes the parameters up) */
        if (hooks) st = hooks->before(hooks->ctx, c);
        if (st == RT_OK) st = x->gpu ? x->prog->optimizer_update(s) : rt_exec_call(x, RT_EXEC_UPDATE, s);
        if (st == RT_OK && hooks) st = hooks->after(hooks->ctx, c);
        if (st != RT_OK) {
            rt_store_wait(o->store); /* nothing may still write into the buffers */
            return st;
        }
        if ((st = offload_wait(o, err)) != RT_OK) return st;
        if (rt_store_write(o->store, (size_t)c * o->slot, o->buf[c % 3], o->slot) != 0) return store_failed(o, err);
    }
    s->state = NULL;
    s->lo = s->hi = 0;
    return offload_wait(o, err);
}

RtStatus rt_opt_offload_read(RtOptOffload *o, float *state, RtError *err) {
    for (int64_t c = 0; c < o->nchunks; c++) {
        if (rt_store_read(o->store, (size_t)c * o->slot, o->buf[0], o->slot) != 0) return store_failed(o, err);
        RtStatus st = offload_wait(o, err);
        if (st != RT_OK) return st;
        unpack(o, c, o->buf[0], state);
    }
    return RT_OK;
}

const char *rt_opt_offload_note(const RtOptOffload *o) { return o ? rt_store_note(o->store) : ""; }
const char *rt_opt_offload_path(const RtOptOffload *o) { return o ? rt_store_path(o->store) : ""; }
int64_t rt_opt_offload_file_bytes(const RtOptOffload *o) { return o ? (int64_t)rt_store_size(o->store) : 0; }
int64_t rt_opt_offload_staging_bytes(const RtOptOffload *o) { return o ? 3 * (int64_t)o->slot : 0; }
int64_t rt_opt_offload_nchunks(const RtOptOffload *o) { return o ? o->nchunks : 0; }
int64_t rt_opt_offload_chunk(const RtOptOffload *o) { return o ? o->chunk : 0; }
double rt_opt_offload_wait_s(const RtOptOffload *o) { return o ? o->wait_s : 0; }
const char *rt_opt_offload_engine(const RtOptOffload *o) { return o ? o->engine : ""; }

void rt_opt_offload_close(RtOptOffload *o) {
    if (!o) return;
    rt_store_close(o->store);
    for (int i = 0; i < 3; i++) rt_store_free(o->buf[i]);
    free(o);
}
