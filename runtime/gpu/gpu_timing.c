/* gpu_timing.c - where the GPU's time goes (rt_gpu.h, "timing"): MBT_DEBUG=1 times every kernel
 * launch and GEMM with a pair of events, summed per kernel function and GEMM shape (gpu.c's
 * rt_gpu_print_timing prints the table); MBT_TRACE=FILE.json writes them as a Chrome trace.
 *
 * Pipeline position: above gpu_api.c only (it calls nothing else of the GPU's files); gpu.c and
 * gpu_blas.c call rt_gpu_time_begin/end around each launch when
 * timing is on (off, it costs them one flag test). The per-name table (RtGpuStats) and the trace
 * writer are plain functions over RtGpuEvent records, tested without a GPU.
 *
 * Reading the events back. Recording an event does not wait, but reading one does, so the events
 * of the launches since the last wait are read back whenever the stream has been waited for
 * anyway (rt_gpu_sync, rt_gpu_download) and at the end. Each start is measured from an anchor
 * event recorded at the previous read-back, whose own time is the sum of the gaps between
 * anchors: cuEventElapsedTime's float milliseconds then span one step or so, not the whole run,
 * and keep sub-microsecond resolution. The event pairs are created once and reused. */
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
            s->items[s->n] = (RtGpuStat){ev[i].name, 0, 0.0};
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
    if (a->total_us != b->total_us) return a->total_us > b->total_us ? -1 : 1;
    return strcmp(a->name, b->name);
}

void rt_gpu_stats_sort(RtGpuStats *s) {
    if (s->n == 0) return;
    qsort(s->items, (size_t)s->n, sizeof *s->items, rt_stat_order);
    rt_stats_reindex(s);
}

void rt_gpu_stats_print(FILE *f, RtGpuStats *s) {
    rt_gpu_stats_sort(s);
    int64_t calls = 0;
    double total = 0;
    for (int64_t i = 0; i < s->n; i++) {
        calls += s->items[i].calls;
        total += s->items[i].total_us;
    }
    fprintf(f, "GPU time: %lld launches and GEMMs, %.1f us\n", (long long)calls, total);
    if (s->n == 0) return;
    /* the name first, the numbers after it (bench/gpu.py reads the table by its header) */
    fprintf(f, "%-44s  %10s  %14s  %12s  %6s\n", "kernel / GEMM", "calls", "total us", "mean us", "share");
    for (int64_t i = 0; i < s->n; i++) {
        const RtGpuStat *t = &s->items[i];
        fprintf(f, "%-44s  %10lld  %14.1f  %12.2f  %5.1f%%\n", t->name, (long long)t->calls, t->total_us,
                t->calls ? t->total_us / (double)t->calls : 0.0, total > 0 ? 100.0 * t->total_us / total : 0.0);
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
                          rt_trace_us(ev->dur_us), "pid", 0, "tid", 0);
    char *text = rt_json_text(o, JSON_COMPACT | JSON_REAL_PRECISION(15), NULL);
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
    for (int64_t i = 0; i < n && o->st == RT_OK; i++) {
        char *text = rt_trace_event(&ev[i]);
        if (!text) o->st = rt_fail(err, RT_ERR_NOMEM, "cannot write GPU trace '%s': out of memory", path);
        if (i) rt_trace_put(o, ",\n", 2);
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

RtStatus rt_gpu_time_begin(RtGpu *g, int64_t *slot, RtError *err) {
    RtGpuTimer *t = &g->timer;
    RtStatus st = rt_timer_slot(g, t->npending, err);
    if (st != RT_OK) return st;
    RtGpuPending *p = &t->pending[t->npending];
    p->name = "?";
    st = rt_cu_check(&g->api, g->api.cuEventRecord(p->start, g->stream), err, "cuEventRecord", "GPU timing");
    if (st != RT_OK) return st;
    *slot = t->npending++;
    return RT_OK;
}

RtStatus rt_gpu_time_end(RtGpu *g, int64_t slot, const char *name, RtStatus launched, RtError *err) {
    if (launched != RT_OK) {
        g->timer.npending = slot; /* nothing ran: the slot is free again */
        return launched;
    }
    RtGpuPending *p = &g->timer.pending[slot];
    p->name = name;
    return rt_cu_check(&g->api, g->api.cuEventRecord(p->stop, g->stream), err, "cuEventRecord", "timing %s", name);
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
        st = rt_cu_check(&g->api, g->api.cuEventElapsedTime(&start, t->anchor[t->cur], p->start), err, "cuEventElapsedTime",
                         "timing %s", p->name);
        if (st == RT_OK)
            st = rt_cu_check(&g->api, g->api.cuEventElapsedTime(&dur, p->start, p->stop), err, "cuEventElapsedTime", "timing %s",
                             p->name);
        batch[i] = (RtGpuEvent){p->name, t->anchor_us + 1e3 * start, 1e3 * dur};
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
