/* weights.c - a program's parameters to and from safetensors files, by their dotted names (see
 * rt_exec.h).
 *
 * Pipeline position: `train --init-weights F`, `--save-weights F` and `--save-adapter DIR`, `eval --weights F`,
 * `generate --weights F`. Names and shapes come from the program's parameter table, so a model
 * written with Hugging Face's names reads Hugging Face's files as they are; values are converted
 * to f32 from F32, F16, BF16 or F64 (rt_st_read_f32). A file that does not fit the program is one
 * error listing every problem: missing tensors, wrong shapes, dtypes with no f32 conversion. Files are written as F32 with the metadata
 * {"format": "pt"} that transformers' loader expects, atomically (rt_st_write). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* The problems of one load, gathered into one line: "A; B; C; and N more". Entries are added while
 * the line stays within RT_WEIGHTS_MAX_LISTED entries and leaves room in an RtError for the tail
 * and a caller's context. */
#define RT_WEIGHTS_MAX_LISTED 20
#define RT_WEIGHTS_LINE_BUDGET (RT_ERROR_MAX - 160)

typedef struct RtWeightProblems {
    char line[RT_ERROR_MAX];
    size_t len;
    int64_t count, listed, missing;
    int full; /* the line has no room for another entry */
} RtWeightProblems;

static void rt_problem(RtWeightProblems *w, const char *fmt, ...) RT_PRINTF(2, 3);
static void rt_problem(RtWeightProblems *w, const char *fmt, ...) {
    w->count++;
    if (w->full || w->listed >= RT_WEIGHTS_MAX_LISTED) return;
    char item[RT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t need = (w->listed ? 2 : 0) + (size_t)n;
    if (w->len + need > RT_WEIGHTS_LINE_BUDGET) {
        w->full = 1; /* the rest are counted, not listed */
        return;
    }
    w->len += (size_t)snprintf(w->line + w->len, sizeof w->line - w->len, "%s%s", w->listed ? "; " : "", item);
    w->listed++;
}

static int rt_readable_as_f32(RtDtype t) { return t == RT_F32 || t == RT_F16 || t == RT_BF16 || t == RT_F64; }

RtStatus rt_weights_load(const RtProgram *p, float *params, const char *path, int64_t *unused, RtError *err) {
    RtStFile *f = NULL;
    RtStatus st = rt_st_open(&f, path, err);
    if (st != RT_OK) return st;
    /* Every parameter is checked before any is read, so that one message lists what does not fit. */
    RtWeightProblems w = {.len = 0};
    int64_t matched = 0;
    for (int64_t i = 0; i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        char want[512], have[512];
        rt_fmt_shape(want, sizeof want, q->rank, q->shape);
        const RtStTensor *t = rt_st_find(f, q->name);
        if (!t) {
            w.missing++;
            rt_problem(&w, "missing '%s' %s", q->name, want);
            continue;
        }
        matched++;
        int same = t->rank == q->rank;
        for (int d = 0; same && d < q->rank; d++) same = t->shape[d] == q->shape[d];
        if (!same) {
            rt_fmt_shape(have, sizeof have, t->rank, t->shape);
            rt_problem(&w, "'%s' is %s but the parameter is %s", q->name, have, want);
        }
        if (!rt_readable_as_f32(t->dtype))
            rt_problem(&w, "'%s' is %s, which cannot be converted to f32", q->name, rt_dtype_name(t->dtype));
    }
    if (w.count > 0) {
        char more[64] = "";
        if (w.count > w.listed) snprintf(more, sizeof more, "; and %lld more", (long long)(w.count - w.listed));
        st = rt_fail(err, w.missing == w.count ? RT_ERR_NOTFOUND : RT_ERR_FORMAT,
                     "weights file '%s' does not fit the program (%lld problem%s): %s%s", path, (long long)w.count,
                     w.count == 1 ? "" : "s", w.line, more);
    }
    for (int64_t i = 0; st == RT_OK && i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        st = rt_st_read_f32(f, rt_st_find(f, q->name), params + q->offset, q->numel, err);
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

/* PEFT's names: a LoraLayer's weights are saved under the PeftModel's path to them
 * ("base_model.model." and the layer's), without the adapter's name ("default"), as
 * peft.get_peft_model_state_dict writes them. */
#define RT_PEFT_PREFIX "base_model.model."

/* One PEFT directory: adapter k (of stacked layers; k = -1 for nn.LoRALinear's unstacked ones). */
static RtStatus rt_adapter_dir(const RtProgram *p, const float *params, const char *dir, int64_t k, int64_t *ntensors,
                               RtError *err) {
    const char *mods = p->train.adapter_modules;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return rt_fail_errno(err, errno, "cannot create the adapter directory '%s'", dir);
    int64_t nmods = 0;
    for (const char *c = mods; *c; c++) nmods += *c == '\n';
    RtStEntry *e = calloc((size_t)(2 * nmods + 1), sizeof *e);
    char **names = calloc((size_t)(2 * nmods + 1), sizeof *names);
    RtStatus st = RT_OK;
    int64_t n = 0;
    if (!e || !names) st = rt_fail_errno(err, ENOMEM, "cannot write the adapter to '%s'", dir);
    for (const char *m = mods; st == RT_OK && *m;) {
        const char *end = strchr(m, '\n'), *blank = memchr(m, ' ', (size_t)(end - m));
        int len = (int)((blank ? blank : end) - m);
        for (int ab = 0; ab < 2 && st == RT_OK; ab++) {
            char want[1024];
            snprintf(want, sizeof want, "%.*s.%s.weight", len, m, ab ? "lora_B" : "lora_A");
            const RtParam *q = NULL;
            for (int64_t i = 0; i < p->nparams && !q; i++)
                if (strcmp(p->params[i].name, want) == 0) q = &p->params[i];
            /* the compiler lists only layers whose parameters it laid out: a stale program */
            if (!q || (k >= 0 && (q->rank != 3 || k >= q->shape[0])))
                st = rt_fail(err, RT_ERR_FORMAT, "--save-adapter: the program has no parameter '%s' of adapter %lld", want,
                             (long long)k);
            else if (!(names[n] = malloc(strlen(RT_PEFT_PREFIX) + strlen(want) + 1)))
                st = rt_fail_errno(err, ENOMEM, "cannot write the adapter to '%s'", dir);
            else {
                sprintf(names[n], "%s%s", RT_PEFT_PREFIX, want);
                /* adapter k of a stacked [adapters, ...] parameter: its slice, one dimension fewer */
                int64_t per = k >= 0 ? q->numel / q->shape[0] : 0;
                e[n] = k >= 0 ? (RtStEntry){names[n], RT_F32, q->rank - 1, q->shape + 1, params + q->offset + k * per, 1}
                              : (RtStEntry){names[n], RT_F32, q->rank, q->shape, params + q->offset, 1};
                n++;
            }
        }
        m = end + 1;
    }
    char path[4096];
    if (st == RT_OK && snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir) >= (int)sizeof path)
        st = rt_fail(err, RT_ERR_ARG, "--save-adapter: the directory name is too long");
    RtStMeta meta = {"format", "pt"};
    if (st == RT_OK) st = rt_st_write(path, e, n, &meta, 1, err);
    if (st == RT_OK) {
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        st = rt_atomic_write_file(path, "adapter config", p->train.adapter_config, strlen(p->train.adapter_config), err);
    }
    for (int64_t i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(e);
    if (st == RT_OK) *ntensors += n;
    return st;
}

RtStatus rt_adapter_refusal(const RtProgram *p, RtError *err) {
    if (!p->train.adapter_modules)
        return rt_fail(err, RT_ERR_ARG,
                       "--save-adapter: the model has no LoRA adapters (no nn.LoRALinear or nn.MultiLoRALinear layer)");
    return rt_fail(err, RT_ERR_ARG,
                   "--save-adapter: the model mixes nn.LoRALinear and nn.MultiLoRALinear layers, or MultiLoRALinear layers of "
                   "different adapter counts, which no PEFT adapter describes");
}

RtStatus rt_adapter_save(const RtProgram *p, const float *params, const char *dir, int64_t *ntensors, RtError *err) {
    const char *mods = p->train.adapter_modules;
    if (!mods || !p->train.adapter_config) return rt_adapter_refusal(p, err);
    const char *blank = strchr(mods, ' ');
    int64_t adapters = blank ? strtoll(blank + 1, NULL, 10) : 0; /* every line has the same count (groups.c) */
    int64_t n = 0;
    if (adapters == 0) {
        RtStatus st = rt_adapter_dir(p, params, dir, -1, &n, err);
        if (st == RT_OK && ntensors) *ntensors = n;
        return st;
    }
    /* several adapters (nn.MultiLoRALinear): DIR/adapter_K, one PEFT directory each */
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return rt_fail_errno(err, errno, "cannot create the adapter directory '%s'", dir);
    for (int64_t k = 0; k < adapters; k++) {
        char sub[4096];
        if (snprintf(sub, sizeof sub, "%s/adapter_%lld", dir, (long long)k) >= (int)sizeof sub)
            return rt_fail(err, RT_ERR_ARG, "--save-adapter: the directory name is too long");
        RtStatus st = rt_adapter_dir(p, params, sub, k, &n, err);
        if (st != RT_OK) return st;
    }
    if (ntensors) *ntensors = n;
    return RT_OK;
}

/* The regions' padding is zero: every element of params, grads and next that no parameter's
 * [offset, offset + numel) holds - the alignment between parameters, and the rows a padded
 * parameter (aligned GEMM shapes, docs/cuda.md) stores past the program's - which the step and the
 * optimizer must keep zero. --dump-step checks it, so that the tests see the padding itself. */
static RtStatus rt_dump_padding_zero(const RtProgram *p, const RtStepDump *d, const char *path, RtError *err) {
    unsigned char *held = calloc((size_t)p->param_floats + 1, 1);
    if (!held) return rt_fail_errno(err, ENOMEM, "cannot write step dump '%s'", path);
    for (int64_t i = 0; i < p->nparams; i++) memset(held + p->params[i].offset, 1, (size_t)p->params[i].numel);
    const float *v[3] = {d->params, d->grads, d->next};
    static const char *const what[3] = {"parameters", "gradients", "updated parameters"};
    for (int k = 0; k < 3; k++)
        for (int64_t j = 0; j < p->param_floats; j++)
            if (!held[j] && v[k][j] != 0.0f) {
                free(held);
                return rt_fail(err, RT_ERR_FORMAT,
                               "step dump '%s': element %lld of the %s region lies in no parameter (padding) and is %g, "
                               "not zero (the step or the optimizer wrote it: a bug)",
                               path, (long long)j, what[k], (double)v[k][j]);
            }
    free(held);
    return RT_OK;
}

RtStatus rt_step_dump(const RtProgram *p, const RtStepDump *d, const char *path, RtError *err) {
    static const char *const prefix[2] = {"grad:", "next:"};
    int64_t n = 3 * p->nparams + 2;
    RtStatus st = rt_dump_padding_zero(p, d, path, err);
    if (st != RT_OK) return st;
    RtStEntry *e = calloc((size_t)n, sizeof *e);
    char **names = calloc(2 * (size_t)p->nparams + 1, sizeof *names);
    if (!e || !names) st = rt_fail_errno(err, ENOMEM, "cannot write step dump '%s'", path);
    for (int64_t i = 0; st == RT_OK && i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        e[3 * i] = (RtStEntry){q->name, RT_F32, q->rank, q->shape, d->params + q->offset, 1};
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(q->name) + 6;
            char *name = names[2 * i + k] = malloc(len);
            if (!name) {
                st = rt_fail_errno(err, ENOMEM, "cannot write step dump '%s'", path);
                break;
            }
            snprintf(name, len, "%s%s", prefix[k], q->name);
            e[3 * i + 1 + k] = (RtStEntry){name, RT_F32, q->rank, q->shape, (k ? d->next : d->grads) + q->offset, 1};
        }
    }
    int64_t bshape[2] = {d->accum * p->train.micro, p->train.seq};
    e[n - 2] = (RtStEntry){"batch:x", RT_I32, 2, bshape, d->x, 0};
    e[n - 1] = (RtStEntry){"batch:y", RT_I32, 2, bshape, d->y, 0};
    char v[7][40];
    snprintf(v[0], sizeof v[0], "%.17g", d->loss);
    snprintf(v[1], sizeof v[1], "%.17g", d->lr);
    snprintf(v[2], sizeof v[2], "%.17g", d->clip);
    snprintf(v[3], sizeof v[3], "%lld", (long long)p->train.micro);
    snprintf(v[4], sizeof v[4], "%lld", (long long)d->accum);
    snprintf(v[5], sizeof v[5], "%lld", (long long)p->train.seq);
    snprintf(v[6], sizeof v[6], "%llu", (unsigned long long)d->seed);
    RtStMeta meta[8] = {{"format", "pt"},    {"mbt.loss", v[0]},  {"mbt.lr", v[1]},  {"mbt.clip", v[2]},
                        {"mbt.micro", v[3]}, {"mbt.accum", v[4]}, {"mbt.seq", v[5]}, {"mbt.seed", v[6]}};
    if (st == RT_OK) st = rt_st_write(path, e, n, meta, 8, err);
    for (int64_t i = 0; names && i < 2 * p->nparams; i++) free(names[i]);
    free(names);
    free(e);
    return st;
}
