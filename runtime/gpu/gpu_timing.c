/* gpu_timing.c - where the GPU's time goes (rt_gpu.h, "timing"): MBT_DEBUG=1 times every kernel
 * launch and GEMM with a pair of events, summed per kernel function and GEMM shape (gpu.c's
 * rt_gpu_print_timing prints the table); MBT_TRACE=FILE.json writes them as a Chrome trace.
 *
 * Pipeline position: above gpu_api.c only (it calls nothing else of the GPU's files); gpu.c and
 * gpu_blas.c call rt_gpu_time_begin/end around each launch when
 * timing is on (off, it costs them one flag test). The per-name table (RtGpuStats) and the trace
 * writer are plain functions over RtGpuEvent records, tested without a GPU.
 *
 * Tracks. Each event carries the stream it was timed on (RtGpuEvent.tid, the trace's thread id):
 * 0 the compute stream, 1 offload { activations }'s copy stream (gpu_act.c times each copy there,
 * after its wait for the compute stream, so the span is the copy itself, and each of the plan's
 * waits as a pair on the compute stream around its cuStreamWaitEvent: how long the step stalled
 * for its copies), 2 offload { optimizer }'s copy stream (gpu_opt.c: the gradient's downloads and
 * the parameters' uploads there, rt_gpu_opt_join's wait on the compute stream). A copy stream's
 * time runs beside the compute stream's, so the table gives each track's total on its own line
 * and each name's share of its own track, never a sum over tracks.
 *
 * Reading the events back. Recording an event does not wait, but reading one does, so the events
 * of the launches since the last wait are read back whenever the stream has been waited for
 * anyway (rt_gpu_sync, rt_gpu_download) and at the end. Each start is measured from an anchor
 * event recorded at the previous read-back, whose own time is the sum of the gaps between
 * anchors: cuEventElapsedTime's float milliseconds then span one step or so, not the whole run,
 * and keep sub-microsecond resolution. The event pairs are created once and reused.
 *
 * Read-back on the copy streams. Resolution runs when the compute stream has been waited for, and
 * reading an event that has not completed fails (CUDA_ERROR_NOT_READY). A copy stream's events are
 * complete by then because the compute stream waited for them: every activation copy (op 0 or 1)
 * is followed by one of the plan's waits (op 2: the compute stream waits for an event recorded on
 * the copy stream after it; compiler/plan/plan_offload.c waits for each write before its slot is
 * reused and for each read before its first backward use, inside the same forward_backward),
 * and every optimizer download is waited for on the host (rt_gpu_opt_wait_down) and every upload
 * by the compute stream (rt_gpu_opt_join) before the next launch. What the structure does not
 * promise is that no synchronisation falls between a copy and its wait (rt_gpu_loss waits once
 * RT_GPU_LOSSES are queued, and forward_backward queues its loss mid-step): so resolution waits on
 * the host for each copy-stream stop event (cuEventSynchronize, at once when it is done) before
 * reading it, rather than read an incomplete event or keep it pending past the anchor it is
 * measured from; rt_gpu_close reads the last events before it closes the copy streams.
 * Only a timed run can wait there, and only in such a case. A copy-stream start is measured from
 * the compute stream's anchor: events of one context compare across streams (the CUDA guide
 * warns such times may come out a little long). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

#define RT_GPU_TRACE_MAX (INT64_C(1) << 22) /* events a trace keeps (~100 MB); later ones are counted, not kept */

/* ---- per-name totals ------------------------------------------------------------------------- */

static int64_t rt_stats_slot(const RtGpuStats *s, const char *name) {
    int64_t mask = s->index_cap - 1, i = (int64_t)(rt_hash_name(name) & (uint64_t)mask);
    while (s->index[i] && strcmp(s->items[s->index[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return i;
}

static void rt_stats_reindex(RtGpuStats *s) {
    memset(s->index, 0, (size_t)s->index_cap * sizeof *s->index);
    for (int64_t j = 0; j < s->n; j++) s->index[rt_stats_slot(s, s->items[j].name)] = j + 1;
}

/* Room for one more name: items and an index at most half full. */
static RtStatus rt_stats_reserve(RtGpuStats *s, RtError *err) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        RtGpuStat *items = realloc(s->items, (size_t)cap * sizeof *items);
        if (!items) return rt_fail(err, RT_ERR_NOMEM, "GPU timing: out of memory");
        s->items = items;
        s->cap = cap;
    }
    if (2 * (s->n + 1) > s->index_cap) {
        int64_t cap = s->index_cap ? 2 * s->index_cap : 128;
        int64_t *index = calloc((size_t)cap, sizeof *index);
        if (!index) return rt_fail(err, RT_ERR_NOMEM, "GPU timing: out of memory");
        free(s->index);
        s->index = index;
        s->index_cap = cap;
        rt_stats_reindex(s);
    }
    return RT_OK;
}

RtStatus rt_gpu_stats_add(RtGpuStats *s, const RtGpuEvent *ev, int64_t n, RtError *err) {
    for (int64_t i = 0; i < n; i++) {
        RtStatus st = rt_stats_reserve(s, err);
        if (st != RT_OK) return st;
        int64_t slot = rt_stats_slot(s, ev[i].name);
        if (!s->index[slot]) {
            s->items[s->n] = (RtGpuStat){ev[i].name, 0, 0.0, ev[i].tid};
            s->index[slot] = ++s->n;
        }
        RtGpuStat *t = &s->items[s->index[slot] - 1];
        t->calls++;
        t->total_us += ev[i].dur_us;
    }
    return RT_OK;
}

static int rt_stat_order(const void *x, const void *y) {
    const RtGpuStat *a = x, *b = y;
    if (a->tid != b->tid) return a->tid < b->tid ? -1 : 1;
    if (a->total_us != b->total_us) return a->total_us > b->total_us ? -1 : 1;
    return strcmp(a->name, b->name);
}

void rt_gpu_stats_sort(RtGpuStats *s) {
    if (s->n == 0) return;
    qsort(s->items, (size_t)s->n, sizeof *s->items, rt_stat_order);
    rt_stats_reindex(s);
}

const char *rt_gpu_track_name(int tid) {
    static const char *const names[RT_GPU_TRACKS] = {"compute", "activations' copies", "optimizer's copies", "collectives"};
    return tid >= 0 && tid < RT_GPU_TRACKS ? names[tid] : "?";
}

void rt_gpu_stats_print(FILE *f, RtGpuStats *s) {
    rt_gpu_stats_sort(s);
    int64_t calls[RT_GPU_TRACKS] = {0};
    double total[RT_GPU_TRACKS] = {0};
    int side = 0; /* a copy stream has events */
    for (int64_t i = 0; i < s->n; i++) {
        int tid = s->items[i].tid >= 0 && s->items[i].tid < RT_GPU_TRACKS ? s->items[i].tid : 0;
        calls[tid] += s->items[i].calls;
        total[tid] += s->items[i].total_us;
        side |= tid != RT_GPU_TRACK_COMPUTE;
    }
    /* the copy streams' time runs beside the compute stream's: a total each, never summed */
    if (!side) fprintf(f, "GPU time: %lld launches and GEMMs, %.1f us\n", (long long)calls[0], total[0]);
    else
        fprintf(f, "GPU time: %lld launches, GEMMs and waits for the copy streams on the compute stream, %.1f us\n",
                (long long)calls[0], total[0]);
    for (int tid = 1; tid < RT_GPU_TRACKS; tid++)
        if (calls[tid])
            fprintf(f, "GPU time: %s: %lld copies on their own stream, %.1f us (beside the compute stream's, not in its total)\n",
                    rt_gpu_track_name(tid), (long long)calls[tid], total[tid]);
    if (s->n == 0) return;
    /* the name first, the numbers after it (bench/gpu.py reads the table by its header); rows by
     * stream, the compute stream's first, each share of its own stream's total */
    int width = 44; /* the names' column: 44 or the longest name's */
    for (int64_t i = 0; i < s->n; i++)
        if (strlen(s->items[i].name) > (size_t)width && strlen(s->items[i].name) < 200) width = (int)strlen(s->items[i].name);
    fprintf(f, "%-*s  %10s  %14s  %12s  %6s\n", width, "kernel / GEMM", "calls", "total us", "mean us", "share");
    for (int64_t i = 0; i < s->n; i++) {
        const RtGpuStat *t = &s->items[i];
        double sum = total[t->tid >= 0 && t->tid < RT_GPU_TRACKS ? t->tid : 0];
        fprintf(f, "%-*s  %10lld  %14.1f  %12.2f  %5.1f%%\n", width, t->name, (long long)t->calls, t->total_us,
                t->calls ? t->total_us / (double)t->calls : 0.0, sum > 0 ? 100.0 * t->total_us / sum : 0.0);
    }
}

void rt_gpu_stats_free(RtGpuStats *s) {
    free(s->items);
    free(s->index);
    memset(s, 0, sizeof *s);
}

/* ---- the trace file -------------------------------------------------------------------------- */

/* Buffered writes into an atomic file; the first failure sticks. */
typedef struct RtTraceOut {
    RtAtomicFile file;
    RtError *err;
    RtStatus st;
    size_t len;
    char buf[1 << 16];
} RtTraceOut;

static void rt_trace_flush_buf(RtTraceOut *o) {
    if (o->st == RT_OK && o->len) o->st = rt_atomic_write(&o->file, o->buf, o->len, o->err);
    o->len = 0;
}

static void rt_trace_put(RtTraceOut *o, const char *s, size_t n) {
    if (o->len + n > sizeof o->buf) rt_trace_flush_buf(o);
    if (n > sizeof o->buf) {
        if (o->st == RT_OK) o->st = rt_atomic_write(&o->file, s, n, o->err);
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

/* A time in microseconds to the nanosecond, as the trace viewer reads it. */
static json_t *rt_trace_us(double us) { return rt_json_new_f64(round(us * 1e3) / 1e3); }

/* One event of the trace: its JSON text, compact, on one line (malloc'd; NULL when out of memory). */
static char *rt_trace_event(const RtGpuEvent *ev) {
    json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:i, s:i}", "name", ev->name, "ph", "X", "ts", rt_trace_us(ev->start_us), "dur",
                          rt_trace_us(ev->dur_us), "pid", 0, "tid", ev->tid);
    char *text = rt_json_text(o, JSON_COMPACT | JSON_REAL_PRECISION(15), NULL);
    json_decref(o);
    return text;
}

/* A track's name, as the metadata event the viewers show beside its events' row. */
static char *rt_trace_track(int tid) {
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M", "pid", 0, "tid", tid, "args", "name",
                          rt_gpu_track_name(tid));
    char *text = rt_json_text(o, JSON_COMPACT, NULL);
    json_decref(o);
    return text;
}

RtStatus rt_gpu_trace_write(const char *path, const RtGpuEvent *ev, int64_t n, RtError *err) {
    RtTraceOut *o = malloc(sizeof *o);
    if (!o) return rt_fail(err, RT_ERR_NOMEM, "cannot write GPU trace '%s': out of memory", path);
    o->err = err;
    o->len = 0;
    RtStatus st = rt_atomic_begin(&o->file, path, "GPU trace", err);
    if (st != RT_OK) {
        free(o);
        return st;
    }
    o->st = RT_OK;
    static const char head[] = "{\"traceEvents\":[\n", tail[] = "\n]}\n";
    rt_trace_put(o, head, sizeof head - 1);
    /* the tracks with events named first (the viewers sort the tracks by tid: compute on top) */
    int used[RT_GPU_TRACKS] = {0}, first = 1;
    for (int64_t i = 0; i < n; i++)
        if (ev[i].tid >= 0 && ev[i].tid < RT_GPU_TRACKS) used[ev[i].tid] = 1;
    for (int64_t i = -RT_GPU_TRACKS; i < n && o->st == RT_OK; i++) {
        if (i < 0 && !used[i + RT_GPU_TRACKS]) continue;
        char *text = i < 0 ? rt_trace_track((int)(i + RT_GPU_TRACKS)) : rt_trace_event(&ev[i]);
        if (!text) o->st = rt_fail(err, RT_ERR_NOMEM, "cannot write GPU trace '%s': out of memory", path);
        if (!first) rt_trace_put(o, ",\n", 2);
        first = 0;
        if (text) rt_trace_put(o, text, strlen(text));
        free(text);
    }
    rt_trace_put(o, tail, sizeof tail - 1);
    rt_trace_flush_buf(o);
    st = o->st;
    if (st == RT_OK) st = rt_atomic_commit(&o->file, err);
    else rt_atomic_abort(&o->file);
    free(o);
    return st;
}

/* ---- the events ------------------------------------------------------------------------------ */

RtStatus rt_gpu_timer_open(RtGpu *g, RtError *err) {
    RtGpuTimer *t = &g->timer;
    const char *debug = getenv("MBT_DEBUG"), *trace = getenv("MBT_TRACE");
    if (trace && *trace) {
        t->trace_path = strdup(trace);
        if (!t->trace_path) return rt_fail(err, RT_ERR_NOMEM, "GPU timing: out of memory");
    }
    t->written = -1;
    t->on = (debug && atoi(debug) >= 1) || t->trace_path;
    if (!t->on) return RT_OK;
    RtGpuApi *api = &g->api;
    RtStatus st = RT_OK;
    for (int i = 0; i < 2 && st == RT_OK; i++)
        st = rt_cu_check(api, api->cuEventCreate(&t->anchor[i], CU_EVENT_DEFAULT), err, "cuEventCreate", "GPU timing");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventRecord(t->anchor[0], g->stream), err, "cuEventRecord", "GPU timing's origin");
    return st;
}

/* Makes pending slot i usable: the array grown and the slot's event pair created. */
static RtStatus rt_timer_slot(RtGpu *g, int64_t i, RtError *err) {
    RtGpuTimer *t = &g->timer;
    if (i == t->cap_pending) {
        int64_t cap = t->cap_pending ? 2 * t->cap_pending : 256;
        RtGpuPending *p = realloc(t->pending, (size_t)cap * sizeof *p);
        if (!p) return rt_fail(err, RT_ERR_NOMEM, "GPU timing: out of memory");
        t->pending = p;
        t->cap_pending = cap;
    }
    if (i < t->created) return RT_OK;
    RtGpuPending *p = &t->pending[i];
    RtStatus st = rt_cu_check(&g->api, g->api.cuEventCreate(&p->start, CU_EVENT_DEFAULT), err, "cuEventCreate", "GPU timing");
    if (st != RT_OK) return st;
    st = rt_cu_check(&g->api, g->api.cuEventCreate(&p->stop, CU_EVENT_DEFAULT), err, "cuEventCreate", "GPU timing");
    if (st != RT_OK) {
        g->api.cuEventDestroy(p->start);
        return st;
    }
    t->created++;
    return RT_OK;
}

RtStatus rt_gpu_time_begin_on(RtGpu *g, CUstream s, int tid, int64_t *slot, RtError *err) {
    RtGpuTimer *t = &g->timer;
    RtStatus st = rt_timer_slot(g, t->npending, err);
    if (st != RT_OK) return st;
    RtGpuPending *p = &t->pending[t->npending];
    p->name = "?";
    p->stream = s;
    p->tid = tid;
    st = rt_cu_check(&g->api, g->api.cuEventRecord(p->start, s), err, "cuEventRecord", "GPU timing");
    if (st != RT_OK) return st;
    *slot = t->npending++;
    return RT_OK;
}

RtStatus rt_gpu_time_begin(RtGpu *g, int64_t *slot, RtError *err) {
    return rt_gpu_time_begin_on(g, g->stream, RT_GPU_TRACK_COMPUTE, slot, err);
}

RtStatus rt_gpu_time_end(RtGpu *g, int64_t slot, const char *name, RtStatus launched, RtError *err) {
    if (launched != RT_OK) {
        g->timer.npending = slot; /* nothing ran: the slot is free again */
        return launched;
    }
    RtGpuPending *p = &g->timer.pending[slot];
    p->name = name;
    return rt_cu_check(&g->api, g->api.cuEventRecord(p->stop, p->stream), err, "cuEventRecord", "timing %s", name);
}

/* Room for n more events after the kept ones. */
static RtStatus rt_timer_events(RtGpuTimer *t, int64_t n, RtError *err) {
    if (t->nevents + n <= t->cap_events) return RT_OK;
    int64_t cap = t->cap_events ? 2 * t->cap_events : 1024;
    while (cap < t->nevents + n) cap *= 2;
    RtGpuEvent *ev = realloc(t->events, (size_t)cap * sizeof *ev);
    if (!ev) return rt_fail(err, RT_ERR_NOMEM, "GPU timing: out of memory");
    t->events = ev;
    t->cap_events = cap;
    return RT_OK;
}

/* The next anchor, recorded now (the stream is idle) and measured from the current one. */
static RtStatus rt_timer_move_anchor(RtGpu *g, RtError *err) {
    RtGpuTimer *t = &g->timer;
    RtGpuApi *api = &g->api;
    int next = 1 - t->cur;
    float ms = 0;
    RtStatus st = rt_cu_check(api, api->cuEventRecord(t->anchor[next], g->stream), err, "cuEventRecord", "GPU timing");
    if (st == RT_OK) st = rt_cu_check(api, api->cuEventSynchronize(t->anchor[next]), err, "cuEventSynchronize", "GPU timing");
    if (st == RT_OK)
        st = rt_cu_check(api, api->cuEventElapsedTime(&ms, t->anchor[t->cur], t->anchor[next]), err, "cuEventElapsedTime",
                         "GPU timing");
    if (st != RT_OK) return st;
    t->anchor_us += 1e3 * ms;
    t->cur = next;
    return RT_OK;
}

RtStatus rt_gpu_timer_resolve(RtGpu *g, RtError *err) {
    RtGpuTimer *t = &g->timer;
    if (!t->on || t->npending == 0) return RT_OK;
    RtStatus st = rt_timer_events(t, t->npending, err);
    if (st != RT_OK) return st;
    RtGpuEvent *batch = t->events + t->nevents;
    for (int64_t i = 0; i < t->npending && st == RT_OK; i++) {
        const RtGpuPending *p = &t->pending[i];
        float start = 0, dur = 0;
        if (p->stream != g->stream) /* a copy stream's: done already unless no wait followed it (above) */
            st = rt_cu_check(&g->api, g->api.cuEventSynchronize(p->stop), err, "cuEventSynchronize", "timing %s", p->name);
        if (st == RT_OK)
            st = rt_cu_check(&g->api, g->api.cuEventElapsedTime(&start, t->anchor[t->cur], p->start), err, "cuEventElapsedTime",
                             "timing %s", p->name);
        if (st == RT_OK)
            st = rt_cu_check(&g->api, g->api.cuEventElapsedTime(&dur, p->start, p->stop), err, "cuEventElapsedTime", "timing %s",
                             p->name);
        batch[i] = (RtGpuEvent){p->name, t->anchor_us + 1e3 * start, 1e3 * dur, p->tid};
    }
    if (st == RT_OK) st = rt_gpu_stats_add(&t->stats, batch, t->npending, err);
    if (st == RT_OK && t->trace_path) {
        int64_t keep = t->npending;
        if (t->nevents + keep > RT_GPU_TRACE_MAX) keep = RT_GPU_TRACE_MAX - t->nevents;
        t->nevents += keep;
        t->dropped += t->npending - keep;
    }
    t->npending = 0;
    return st == RT_OK ? rt_timer_move_anchor(g, err) : st;
}

RtStatus rt_gpu_trace_flush(RtGpu *g, RtError *err) {
    RtGpuTimer *t = &g->timer;
    if (!t->trace_path || t->written == t->nevents) return RT_OK;
    RtStatus st = rt_gpu_trace_write(t->trace_path, t->events, t->nevents, err);
    if (st == RT_OK) t->written = t->nevents;
    return st;
}

/* At close (the stream already waited for): the last events, the trace file (a failure there
 * cannot be reported any more: rt_gpu_print_timing is where it is said), the events. */
void rt_gpu_timer_close(RtGpu *g) {
    RtGpuTimer *t = &g->timer;
    RtError e;
    if (t->on && rt_gpu_timer_resolve(g, &e) == RT_OK) rt_gpu_trace_flush(g, &e);
    for (int64_t i = 0; i < t->created; i++) {
        g->api.cuEventDestroy(t->pending[i].start);
        g->api.cuEventDestroy(t->pending[i].stop);
    }
    for (int i = 0; i < 2; i++)
        if (t->anchor[i]) g->api.cuEventDestroy(t->anchor[i]);
    free(t->pending);
    free(t->events);
    free(t->trace_path);
    rt_gpu_stats_free(&t->stats);
    memset(t, 0, sizeof *t);
}
