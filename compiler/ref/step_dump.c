/* step_dump.c - reads a step dump for `mbtc --verify-step` (see step_dump.h): the metadata
 * (mbt.micro, mbt.accum, mbt.seq: positive whole numbers agreeing with the graph's data.x, and
 * their product overflow-checked; mbt.loss, mbt.lr, mbt.clip: numbers; mbt.seed, a whole number
 * below 2^64, where the step has dropout), each parameter's weights,
 * gradient (grad:NAME) and updated value (next:NAME) shaped like the parameter, and the token
 * batches batch:x and batch:y of [micro x accum, seq]. Every tensor is read with the runtime's
 * safetensors reader, which bounds each read by the tensor's own size. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "graph_pad.h"
#include "step_dump.h"

/* The dump's metadata entry `key` as a positive whole number, or -1 after reporting: a missing key
 * and one whose value is not such a number are told apart. */
static int64_t meta_int(const RtStFile *f, const char *path, const char *key) {
    const char *v = rt_st_meta_get(f, key);
    if (!v) {
        diag_error_noloc("'%s' is not a step dump: its metadata have no %s (write one with `PROG train --dump-step`)", path, key);
        return -1;
    }
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end || n < 1 || errno == ERANGE) {
        diag_error_noloc("step dump '%s': its metadata's %s is \"%s\", not a positive whole number", path, key, v);
        return -1;
    }
    return n;
}

/* The dump's metadata entry `key` as a finite number; NaN after reporting a missing key, one that is
 * not a number, or one that is not finite (a step whose loss or learning rate is not finite cannot be
 * verified). */
static double meta_num(const RtStFile *f, const char *path, const char *key) {
    const char *v = rt_st_meta_get(f, key);
    if (!v) {
        diag_error_noloc("step dump '%s' lacks %s in its metadata (write one with `PROG train --dump-step`)", path, key);
        return NAN;
    }
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x)) {
        diag_error_noloc("step dump '%s': its metadata's %s is \"%s\", not a finite number", path, key, v);
        return NAN;
    }
    return x;
}

/* The G_INPUT node named `name` in g, or -1. */
static int find_input(const Graph *g, const char *name) {
    for (int id = 0; id < g->n; id++)
        if (g->node[id]->op == G_INPUT && g->node[id]->name && strcmp(g->node[id]->name, name) == 0) return id;
    return -1;
}

/* A tensor of the dump by name, with the shape of node n (or of [rows, cols] when n is NULL). */
static const RtStTensor *dump_tensor(const RtStFile *f, const char *path, const char *name, const GNode *n, int64_t rows,
                                     int64_t cols) {
    const RtStTensor *t = rt_st_find(f, name);
    if (!t) {
        diag_error_noloc("step dump '%s' has no tensor '%s': was it written by a program compiled from this train block?", path,
                         name);
        return NULL;
    }
    int rank = n ? n->rank : 2;
    int same = t->rank == rank;
    /* a padded parameter (graph_pad.h) is dumped with the program's rows */
    for (int d = 0; same && d < rank; d++)
        same = t->shape[d] == (n ? (d == 0 && n->op == G_PARAM ? graph_param_rows(n) : n->shape[d]) : d == 0 ? rows : cols);
    if (!same) {
        diag_error_noloc("step dump '%s': tensor '%s' does not have the shape this train block gives it", path, name);
        return NULL;
    }
    return t;
}

/* n values of t, then zeros up to len (a padded parameter's rows past the program's: graph_pad.h). */
static double *read_doubles(const RtStFile *f, const RtStTensor *t, int64_t n, int64_t len, const char *path, Arena *ar) {
    float *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    double *out = arena_alloc(ar, (size_t)(len > 0 ? len : 1) * sizeof *out);
    memset(out, 0, (size_t)(len > 0 ? len : 1) * sizeof *out);
    RtError err;
    rt_error_clear(&err);
    if (!tmp || rt_st_read_f32(f, t, tmp, n, &err) != RT_OK) {
        diag_error_noloc("step dump '%s': %s", path, tmp ? err.msg : "out of memory");
        free(tmp);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) out[i] = tmp[i];
    free(tmp);
    return out;
}

/* The metadata, checked against the graph's data.x: 0, or 1 after reporting. */
static int read_meta(const Graph *g, const RtStFile *f, const char *path, StepDump *d) {
    int before = diag_error_count();
    d->xin = find_input(g, "data.x"), d->yin = find_input(g, "data.y");
    d->micro = meta_int(f, path, "mbt.micro"), d->accum = meta_int(f, path, "mbt.accum");
    d->seq = meta_int(f, path, "mbt.seq");
    d->loss = meta_num(f, path, "mbt.loss"), d->lr = meta_num(f, path, "mbt.lr"), d->clip = meta_num(f, path, "mbt.clip");
    d->rngin = find_input(g, GRAPH_RNG_NAME);
    if (d->rngin >= 0) { /* dropout: its masks are keyed by the run's seed */
        const char *v = rt_st_meta_get(f, "mbt.seed");
        char *end = NULL;
        errno = 0;
        unsigned long long s = v ? strtoull(v, &end, 10) : 0;
        if (!v)
            diag_error_noloc("step dump '%s' lacks mbt.seed in its metadata, which this train block's dropout needs (write one "
                             "with `PROG train --dump-step`)",
                             path);
        else if (end == v || *end || *v == '-' || errno == ERANGE)
            diag_error_noloc("step dump '%s': its metadata's mbt.seed is \"%s\", not a whole number below 2^64", path, v);
        d->seed = s;
    }
    const GNode *x = d->xin >= 0 ? g->node[d->xin] : NULL;
    if (d->xin < 0 || d->yin < 0) diag_error_noloc("the train block's step reads no data.x and data.y");
    else if (d->micro > 0 && d->seq > 0 && (x->rank != 2 || x->shape[0] != d->micro || x->shape[1] != d->seq))
        diag_error_noloc("step dump '%s' holds micro-batches of %lld x %lld tokens, but this train block's are %lld x %lld", path,
                         (long long)d->micro, (long long)d->seq, (long long)x->shape[0],
                         (long long)(x->rank > 1 ? x->shape[1] : 0));
    /* micro and seq are the graph's here (checked above) */
    if (diag_error_count() == before &&
        (__builtin_mul_overflow(d->micro, d->accum, &d->rows) || __builtin_mul_overflow(d->rows, d->seq, &d->cells) ||
         d->cells > (int64_t)(SIZE_MAX / 2 / sizeof(int32_t))))
        diag_error_noloc("step dump '%s': mbt.accum = %lld micro-batches of %lld x %lld tokens is more tokens than any dump can "
                         "hold",
                         path, (long long)d->accum, (long long)d->micro, (long long)d->seq);
    return diag_error_count() != before;
}

int step_dump_read(const Graph *g, const RtStFile *f, const char *path, StepDump *d, Arena *ar) {
    memset(d, 0, sizeof *d);
    if (read_meta(g, f, path, d)) return 1;
    int before = diag_error_count();
    /* the leaves: every parameter, then each micro-batch's rows of x and y */
    d->leaves = arena_alloc(ar, (size_t)g->n * sizeof *d->leaves);
    d->grad = arena_alloc(ar, (size_t)g->nparams * sizeof *d->grad);
    d->next = arena_alloc(ar, (size_t)g->nparams * sizeof *d->next);
    for (int i = 0; i < g->nparams && diag_error_count() == before; i++) {
        const GNode *p = g->node[g->params[i]];
        const RtStTensor *t = dump_tensor(f, path, p->name, p, 0, 0);
        if (t) d->leaves[p->id] = read_doubles(f, t, graph_param_numel(p), graph_numel(p), path, ar);
        const char *gname = arena_printf(ar, "grad:%s", p->name);
        t = t ? dump_tensor(f, path, gname, p, 0, 0) : NULL;
        if (t) d->grad[i] = read_doubles(f, t, graph_param_numel(p), graph_numel(p), path, ar);
        t = t ? dump_tensor(f, path, arena_printf(ar, "next:%s", p->name), p, 0, 0) : NULL;
        if (t) d->next[i] = read_doubles(f, t, graph_param_numel(p), graph_numel(p), path, ar);
    }
    if (diag_error_count() != before) return 1;
    RtError err;
    rt_error_clear(&err);
    /* the batches' tensors first: their shapes, held to [rows, seq], bound the memory by the file's
     * own size (mbt.accum alone could ask for any amount) */
    const RtStTensor *tx = dump_tensor(f, path, "batch:x", NULL, d->rows, d->seq);
    const RtStTensor *ty = tx ? dump_tensor(f, path, "batch:y", NULL, d->rows, d->seq) : NULL;
    if (ty) d->bx = malloc((size_t)d->cells * sizeof *d->bx), d->by = malloc((size_t)d->cells * sizeof *d->by);
    if (ty && (!d->bx || !d->by || rt_st_read_i32(f, tx, d->bx, d->cells, &err) != RT_OK ||
               rt_st_read_i32(f, ty, d->by, d->cells, &err) != RT_OK))
        diag_error_noloc("step dump '%s': %s", path, d->bx && d->by ? err.msg : "out of memory");
    return diag_error_count() != before;
}

void step_dump_free(StepDump *d) {
    free(d->bx);
    free(d->by);
    d->bx = d->by = NULL;
}
