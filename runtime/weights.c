/* weights.c - a program's parameters to and from safetensors files, by their dotted names (see
 * rt_exec.h).
 *
 * Pipeline position: `train --init-weights F` and `--save-weights F`, `eval --weights F`,
 * `generate --weights F`. Names and shapes come from the program's parameter table, so a model
 * written with Hugging Face's names reads Hugging Face's files as they are; values are converted
 * to f32 from F32, F16, BF16 or F64 (rt_st_read_f32). Files are written as F32 with the metadata
 * {"format": "pt"} that transformers' loader expects, atomically (rt_st_write). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "rt_exec.h"

/* "[64, 64]" */
static void rt_fmt_shape(char *buf, size_t n, int rank, const int64_t *shape) {
    size_t k = 0;
    int w = snprintf(buf, n, "[");
    k = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < rank && k < n; i++) {
        w = snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w > 0) k += (size_t)w;
    }
    if (k < n) snprintf(buf + k, n - k, "]");
}

RtStatus rt_weights_load(const RtProgram *p, float *params, const char *path, int64_t *unused, RtError *err) {
    RtStFile *f = NULL;
    RtStatus st = rt_st_open(&f, path, err);
    if (st != RT_OK) return st;
    int64_t matched = 0;
    for (int64_t i = 0; st == RT_OK && i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        char want[512], have[512];
        rt_fmt_shape(want, sizeof want, q->rank, q->shape);
        const RtStTensor *t = rt_st_find(f, q->name);
        if (!t) {
            st = rt_fail(err, RT_ERR_NOTFOUND, "weights file '%s' has no tensor '%s' (the parameter %s %s)", path, q->name,
                         q->name, want);
            break;
        }
        int same = t->rank == q->rank;
        for (int d = 0; same && d < q->rank; d++) same = t->shape[d] == q->shape[d];
        if (!same) {
            rt_fmt_shape(have, sizeof have, t->rank, t->shape);
            st = rt_fail(err, RT_ERR_FORMAT, "weights file '%s': tensor '%s' is %s but the parameter is %s", path, q->name,
                         have, want);
            break;
        }
        st = rt_st_read_f32(f, t, params + q->offset, q->numel, err);
        matched++;
    }
    if (st == RT_OK && unused) *unused = rt_st_count(f) - matched;
    rt_st_close(f);
    return st;
}

RtStatus rt_weights_save(const RtProgram *p, const float *params, const char *path, RtError *err) {
    RtStEntry *e = calloc(p->nparams > 0 ? (size_t)p->nparams : 1, sizeof *e);
    if (!e) return rt_fail_errno(err, ENOMEM, "cannot write weights file '%s'", path);
    for (int64_t i = 0; i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        e[i] = (RtStEntry){q->name, RT_F32, q->rank, q->shape, params + q->offset, 1};
    }
    RtStMeta meta = {"format", "pt"};
    RtStatus st = rt_st_write(path, e, p->nparams, &meta, 1, err);
    free(e);
    return st;
}
