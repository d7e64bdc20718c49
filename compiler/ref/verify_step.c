/* verify_step.c - `mbtc prog.mbt --verify-step STEP.safetensors`: holds one optimizer step that a
 * compiled program computed against the reference evaluator.
 *
 * Pipeline position: beside the back ends, like ref.c, whose oracle it applies to a whole
 * compiled executable. `./prog train --steps 1 --dump-step STEP.safetensors` writes the weights a
 * step started from, the step's token batches, its loss, its accumulated gradients and the
 * parameters after the update (runtime/rt_exec.h, rt_step_dump). This file takes the same train
 * block's step graph, differentiated, and its update graph from the stage table (pipeline.h),
 * evaluates the step in double precision micro-batch by micro-batch with ref_run on exactly those weights and tokens, accumulates as the runtime does
 * (each micro-batch weighted 1 / accum); then clips the dumped gradients as the runtime does
 * (rt_program.h, RT_CLIP_EPS) and runs the optimizer's update graph with ref_run from the state's
 * initial values. It compares:
 *
 *   loss       |compiled - reference| / |reference|
 *   gradients  per parameter, max |compiled - reference| / max |reference| (the error relative to
 *              the tensor's scale, so that entries near zero do not dominate)
 *   update     per parameter, max (|compiled - reference| - ulp(reference)) / max |reference
 *              step|: the new values may differ by the one rounding of storing them in f32, and
 *              beyond that the error is measured against the size of the update, not the weight
 *
 * and fails (exit status 1) when the loss differs by more than tol.loss or a gradient or an
 * update by more than tol.grad (VerifyTol, below). The compiled program works in f32 with its own fusion and summation
 * order, the reference in double, op by op, so the two share nothing but the graph: a fusion, code
 * generation, memory-plan or runtime bug shows here; a wrong derivative in autodiff would be in
 * both, and is what the finite-difference tests (tests/unit/test_grad.c) are for. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "pipeline.h"
#include "ref.h"
#include "rt.h"
#include "rt_program.h"
#include "sema.h"
#include "verify_step.h"

/* Tolerances: the loss relative; a gradient or an update relative to the tensor's largest entry.
 * A bf16 step (precision = bf16: the parameters are read through casts to bf16) stores its
 * activations and their gradients in bf16 (8 significand bits), and is held to bf16 tolerances,
 * set from what the CPU back end measured (docs/testing.md, "verify"). */
typedef struct VerifyTol {
    double loss, grad;
} VerifyTol;
static const VerifyTol verify_f32 = {1e-5, 1e-4};
static const VerifyTol verify_bf16 = {1e-4, 5e-2};

/* 1 when the step reads its parameters through casts to bf16 (precision = bf16). */
static int graph_reads_bf16(const Graph *g) {
    for (int i = 0; i < g->n; i++)
        if (g->node[i]->op == G_CAST && g->node[i]->dt == DT_BF16 && g->node[g->node[i]->in[0]]->op == G_PARAM) return 1;
    return 0;
}

/* The dump's metadata entry `key` as a positive whole number, or -1 after reporting. */
static int64_t meta_int(const RtStFile *f, const char *path, const char *key) {
    const char *v = rt_st_meta_get(f, key);
    char *end = NULL;
    long long n = v ? strtoll(v, &end, 10) : -1;
    if (!v || end == v || *end || n < 1) {
        diag_error_noloc("'%s' is not a step dump: its metadata have no %s (write one with `PROG train --dump-step`)", path, key);
        return -1;
    }
    return n;
}

/* The dump's metadata entry `key` as a number (NaN when missing; the caller reports). */
static double meta_num(const RtStFile *f, const char *key) {
    const char *v = rt_st_meta_get(f, key);
    char *end = NULL;
    double x = v ? strtod(v, &end) : NAN;
    return v && end != v && !*end ? x : NAN;
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
    for (int d = 0; same && d < rank; d++) same = t->shape[d] == (n ? n->shape[d] : d == 0 ? rows : cols);
    if (!same) {
        diag_error_noloc("step dump '%s': tensor '%s' does not have the shape this train block gives it", path, name);
        return NULL;
    }
    return t;
}

static double *read_doubles(const RtStFile *f, const RtStTensor *t, int64_t n, const char *path, Arena *ar) {
    float *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    double *out = arena_alloc(ar, (size_t)(n > 0 ? n : 1) * sizeof *out);
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

/* The spacing of f32 numbers at x (one unit in the last place). */
static double f32_ulp(double x) {
    float f = (float)fabs(x);
    return (double)nextafterf(f, INFINITY) - (double)f;
}

/* The optimizer's update graph evaluated on the dumped parameters and gradients, clipped as the
 * runtime clips them, with every state variable at its initial value (this is step 1) and t = 1.
 * Returns the new value of each parameter (in the step graph's order), or NULL after reporting. */
static double **reference_update(const Graph *ug, const Graph *g, double *const *leaves, double *const *grad, double lr,
                                 double clip, Arena *ar) {
    const GraphUpdate *u = ug->update;
    double sumsq = 0;
    for (int i = 0; i < g->nparams; i++)
        for (int64_t k = 0; k < graph_numel(g->node[g->params[i]]); k++) sumsq += grad[i][k] * grad[i][k];
    double scale = clip > 0 && clip / (sqrt(sumsq) + RT_CLIP_EPS) < 1 ? clip / (sqrt(sumsq) + RT_CLIP_EPS) : 1;
    double **in = arena_alloc(ar, (size_t)ug->n * sizeof *in);
    in[u->p_in] = arena_alloc(ar, (size_t)u->n * sizeof(double));
    in[u->g_in] = arena_alloc(ar, (size_t)u->n * sizeof(double));
    for (int i = 0; i < u->nsegs; i++) {
        const GNode *p = g->node[g->params[i]];
        if (strcmp(u->seg_name[i], p->name) != 0 || u->seg_len[i] != graph_numel(p))
            INTERNAL("the update graph's segment %d is '%s', the step graph's parameter %d '%s'", i, u->seg_name[i], i, p->name);
        for (int64_t k = 0; k < u->seg_len[i]; k++) {
            in[u->p_in][u->seg_off[i] + k] = leaves[p->id][k];
            in[u->g_in][u->seg_off[i] + k] = (double)(float)(grad[i][k] * scale); /* the runtime scales in f32 */
        }
    }
    if (u->lr_in >= 0) {
        in[u->lr_in] = arena_alloc(ar, sizeof(double));
        in[u->lr_in][0] = (double)(float)lr; /* passed to the update as an f32 scalar */
    }
    in[u->t_in] = arena_alloc(ar, sizeof(double));
    in[u->t_in][0] = 1;
    for (int s = 0; s < u->nstate; s++) {
        in[u->state_in[s]] = arena_alloc(ar, (size_t)u->n * sizeof(double));
        for (int64_t k = 0; k < u->n; k++) in[u->state_in[s]][k] = u->state_init[s];
    }
    double **vals = ref_run(ug, in, ar);
    if (!vals) return NULL;
    double **out = arena_alloc(ar, (size_t)g->nparams * sizeof *out);
    for (int i = 0; i < u->nsegs; i++) out[i] = vals[u->p_out] + u->seg_off[i];
    return out;
}

int verify_step(Pipeline *p, const char *path) {
    if (pipeline_run(p, ST_IR)) return diag_finish();
    const TrainBuild *tb = p->tb;
    const Graph *g = tb->step;
    if (g->loss < 0) {
        diag_error_noloc("the train block has no loss to verify");
        return diag_finish();
    }
    if (pipeline_run(p, ST_GRAD) || pipeline_run(p, ST_UPDATE)) return diag_finish();
    Arena *ar = p->ar;

    RtError err;
    rt_error_clear(&err);
    RtStFile *f = NULL;
    if (rt_st_open(&f, path, &err) != RT_OK) {
        diag_error_noloc("%s", err.msg);
        return diag_finish();
    }
    int xin = find_input(g, "data.x"), yin = find_input(g, "data.y");
    int64_t micro = meta_int(f, path, "mbt.micro"), accum = meta_int(f, path, "mbt.accum");
    int64_t seq = meta_int(f, path, "mbt.seq");
    double loss = meta_num(f, "mbt.loss"), lr = meta_num(f, "mbt.lr"), clip = meta_num(f, "mbt.clip");
    if (xin < 0 || yin < 0) diag_error_noloc("the train block's step reads no data.x and data.y");
    else if (micro > 0 && seq > 0 &&
             (g->node[xin]->rank != 2 || g->node[xin]->shape[0] != micro || g->node[xin]->shape[1] != seq))
        diag_error_noloc("step dump '%s' holds micro-batches of %lld x %lld tokens, but this train block's are %lld x %lld", path,
                         (long long)micro, (long long)seq, (long long)g->node[xin]->shape[0],
                         (long long)(g->node[xin]->rank > 1 ? g->node[xin]->shape[1] : 0));
    int64_t rows = 0, cells = 0, window = micro * seq; /* micro and seq are the graph's here (checked above) */
    if (!diag_error_count() && (__builtin_mul_overflow(micro, accum, &rows) || __builtin_mul_overflow(rows, seq, &cells) ||
                                cells > (int64_t)(SIZE_MAX / 2 / sizeof(int32_t))))
        diag_error_noloc("step dump '%s': mbt.accum = %lld micro-batches of %lld x %lld tokens is more tokens than any dump can "
                         "hold",
                         path, (long long)accum, (long long)micro, (long long)seq);
    if ((isnan(loss) || isnan(lr) || isnan(clip)) && accum > 0)
        diag_error_noloc("step dump '%s' lacks mbt.loss, mbt.lr or mbt.clip in its metadata", path);
    if (diag_error_count()) {
        rt_st_close(f);
        return diag_finish();
    }

    /* the leaves: every parameter, then each micro-batch's rows of x and y */
    double **leaves = arena_alloc(ar, (size_t)g->n * sizeof *leaves);
    double **grad = arena_alloc(ar, (size_t)g->nparams * sizeof *grad);
    double **next = arena_alloc(ar, (size_t)g->nparams * sizeof *next);
    for (int i = 0; i < g->nparams && !diag_error_count(); i++) {
        const GNode *p = g->node[g->params[i]];
        const RtStTensor *t = dump_tensor(f, path, p->name, p, 0, 0);
        if (t) leaves[p->id] = read_doubles(f, t, graph_numel(p), path, ar);
        const char *gname = arena_printf(ar, "grad:%s", p->name);
        t = t ? dump_tensor(f, path, gname, p, 0, 0) : NULL;
        if (t) grad[i] = read_doubles(f, t, graph_numel(p), path, ar);
        t = t ? dump_tensor(f, path, arena_printf(ar, "next:%s", p->name), p, 0, 0) : NULL;
        if (t) next[i] = read_doubles(f, t, graph_numel(p), path, ar);
    }
    int32_t *bx = malloc((size_t)cells * sizeof *bx), *by = malloc((size_t)cells * sizeof *by);
    if (!diag_error_count()) {
        const RtStTensor *tx = dump_tensor(f, path, "batch:x", NULL, rows, seq);
        const RtStTensor *ty = tx ? dump_tensor(f, path, "batch:y", NULL, rows, seq) : NULL;
        if (ty &&
            (!bx || !by || rt_st_read_i32(f, tx, bx, cells, &err) != RT_OK || rt_st_read_i32(f, ty, by, cells, &err) != RT_OK))
            diag_error_noloc("step dump '%s': %s", path, bx && by ? err.msg : "out of memory");
    }
    rt_st_close(f);

    /* the reference step: the mean over the micro-batches, as the runtime's loss_scale makes it */
    double ref_loss = 0;
    double **ref_grad = arena_alloc(ar, (size_t)g->nparams * sizeof *ref_grad);
    for (int i = 0; i < g->nparams; i++)
        ref_grad[i] = arena_alloc(ar, (size_t)graph_numel(g->node[g->params[i]]) * sizeof(double));
    double *lx = arena_alloc(ar, (size_t)window * sizeof *lx), *ly = arena_alloc(ar, (size_t)window * sizeof *ly);
    leaves[xin] = lx;
    leaves[yin] = ly;
    for (int64_t m = 0; m < accum && !diag_error_count(); m++) {
        for (int64_t k = 0; k < window; k++) {
            lx[k] = bx[m * window + k];
            ly[k] = by[m * window + k];
        }
        Arena scratch = {0};
        double **vals = ref_run(g, leaves, &scratch);
        if (vals) {
            ref_loss += vals[g->loss][0] / (double)accum;
            for (int i = 0; i < g->nparams; i++) {
                const double *gv = vals[g->grads[i]];
                for (int64_t k = 0; k < graph_numel(g->node[g->params[i]]); k++) ref_grad[i][k] += gv[k] / (double)accum;
            }
        }
        arena_free(&scratch);
    }
    free(bx);
    free(by);
    if (diag_error_count()) return diag_finish();

    double **ref_next = reference_update(tb->update, g, leaves, grad, lr, clip, ar);
    if (!ref_next) return diag_finish();

    /* the comparison, parameter by parameter */
    const VerifyTol *tol = graph_reads_bf16(g) ? &verify_bf16 : &verify_f32;
    double loss_err = fabs(loss - ref_loss) / (fabs(ref_loss) > 0 ? fabs(ref_loss) : 1);
    printf("verify-step %s: %lld micro-batch%s of %lld x %lld tokens, %d parameters\n", g->name ? g->name : "train",
           (long long)accum, accum == 1 ? "" : "es", (long long)micro, (long long)seq, g->nparams);
    printf("  loss: compiled %.9g, reference %.9g, relative error %.2e (tolerance %.0e)\n", loss, ref_loss, loss_err, tol->loss);
    printf("  %-40s %12s %12s %12s %12s\n", "parameter", "max |grad|", "grad error", "max |step|", "step error");
    double worst = 0, worst_step = 0;
    int bad = loss_err > tol->loss || isnan(loss_err);
    for (int i = 0; i < g->nparams; i++) {
        const GNode *p = g->node[g->params[i]];
        int64_t n = graph_numel(p);
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < n; k++) {
            if (fabs(ref_grad[i][k]) > scale) scale = fabs(ref_grad[i][k]);
            double d = fabs(grad[i][k] - ref_grad[i][k]);
            if (d > diff || isnan(d)) diff = isnan(d) ? INFINITY : d;
        }
        double e = scale > 0 ? diff / scale : diff;
        double step_scale = 0, step_diff = 0, *p0 = leaves[p->id];
        for (int64_t k = 0; k < n; k++) {
            if (fabs(ref_next[i][k] - p0[k]) > step_scale) step_scale = fabs(ref_next[i][k] - p0[k]);
            double d = fabs(next[i][k] - ref_next[i][k]) - f32_ulp(ref_next[i][k]);
            if (d > step_diff || isnan(d)) step_diff = isnan(d) ? INFINITY : d;
        }
        double se = step_scale > 0 ? step_diff / step_scale : step_diff;
        int over = e > tol->grad || se > tol->grad;
        bad |= over;
        if (e > worst) worst = e;
        if (se > worst_step) worst_step = se;
        printf("  %-40s %12.4e %12.2e %12.4e %12.2e%s\n", p->name, scale, e, step_scale, se, over ? "  <- over tolerance" : "");
    }
    printf("verify-step: %s (loss error %.2e, largest gradient error %.2e, largest update error %.2e; tolerances "
           "%.0e and %.0e)\n",
           bad ? "FAILED" : "ok", loss_err, worst, worst_step, tol->loss, tol->grad);
    int rc = diag_finish();
    return rc ? rc : bad;
}
