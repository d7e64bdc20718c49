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
#include "step_dump.h"
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
        for (int64_t k = 0; u->seg_off[i] < u->n && k < u->seg_len[i]; k++) { /* frozen ones lie past n */
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
    for (int i = 0; i < u->nsegs; i++) /* a frozen parameter keeps its value */
        out[i] = u->seg_off[i] < u->n ? vals[u->p_out] + u->seg_off[i] : leaves[g->params[i]];
    return out;
}

/* Micro-batch m of the dump into the step graph's leaves (a RefMicroFn): data.x and data.y; with
 * documents data.pos, recomputed from data.x as the runtime computes it (rt_doc_positions: 0 at a
 * row's start and after each end-of-text token - the dump holds x, and pos is x's function); with
 * dropout its key's micro-batch word. */
typedef struct VerifyBatches {
    const StepDump *d;
    int xin, yin, posin; /* posin -1: no data.pos */
    int64_t docs;        /* the end-of-text id */
    double *key;         /* dropout's key (graph.h), or NULL */
    int64_t row;         /* positions restart every row tokens: step 1's curriculum length (train_seq_at), else seq */
} VerifyBatches;

static void verify_load_micro(void *ctx, int64_t m, double **leaves) {
    const VerifyBatches *vb = ctx;
    int64_t seq = vb->d->seq, window = vb->d->micro * seq;
    const int32_t *bx = vb->d->bx + m * window;
    double *lp = vb->posin >= 0 ? leaves[vb->posin] : NULL;
    if (vb->key) vb->key[3] = (double)(uint32_t)m;
    for (int64_t k = 0; k < window; k++) {
        leaves[vb->xin][k] = bx[k];
        leaves[vb->yin][k] = vb->d->by[m * window + k];
        if (lp) lp[k] = k % vb->row == 0 || bx[k - 1] == vb->docs ? 0 : lp[k - 1] + 1;
    }
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
    StepDump d;
    int bad_dump = step_dump_read(g, f, path, &d, ar);
    rt_st_close(f);
    if (bad_dump) {
        step_dump_free(&d);
        return diag_finish();
    }
    int xin = d.xin, yin = d.yin;
    int64_t micro = d.micro, accum = d.accum, seq = d.seq, window = micro * seq;
    double loss = d.loss, lr = d.lr, clip = d.clip, **leaves = d.leaves, **grad = d.grad, **next = d.next;

    /* the reference step: the mean over the micro-batches, as the runtime's loss_scale makes it */
    double ref_loss = 0;
    double **ref_grad = arena_alloc(ar, (size_t)g->nparams * sizeof *ref_grad);
    for (int i = 0; i < g->nparams; i++)
        ref_grad[i] = arena_alloc(ar, (size_t)graph_numel(g->node[g->params[i]]) * sizeof(double));
    double *lx = arena_alloc(ar, (size_t)window * sizeof *lx), *ly = arena_alloc(ar, (size_t)window * sizeof *ly);
    leaves[xin] = lx;
    leaves[yin] = ly;
    double *key = NULL; /* dropout's (graph.h): the seed, step 0 (the dump's), micro-batch m, on */
    if (d.rngin >= 0) {
        key = arena_alloc(ar, GRAPH_RNG_WORDS * sizeof *key);
        key[0] = (double)(d.seed & 0xffffffffu), key[1] = (double)(d.seed >> 32), key[2] = 0, key[4] = 1;
        leaves[d.rngin] = key;
    }
    int posin = -1;
    for (int id = 0; id < g->n; id++)
        if (g->node[id]->op == G_INPUT && g->node[id]->name && strcmp(g->node[id]->name, "data.pos") == 0) posin = id;
    if (posin >= 0) leaves[posin] = arena_alloc(ar, (size_t)window * sizeof(double));
    /* global_mean: the statistics over all the step's micro-batches first (ref_global_stats), then
     * every micro-batch's forward and backward reads them */
    VerifyBatches vb = {&d, xin, yin, posin, tb->config->docs, key, train_seq_at(tb->config, 0)};
    if (ref_global_stats(g, accum, verify_load_micro, &vb, leaves, ar)) {
        step_dump_free(&d);
        return diag_finish();
    }
    for (int64_t m = 0; m < accum && !diag_error_count(); m++) {
        verify_load_micro(&vb, m, leaves);
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
    step_dump_free(&d);
    if (diag_error_count()) return diag_finish();

    double **ref_next = reference_update(tb->update, g, leaves, grad, lr, clip, ar);
    if (!ref_next) return diag_finish();
    /* running statistics (Graph.run_param): after the update, as the runtime's rt_exec_running,
     * from the statistics ref_global_stats left in their inputs */
    for (int r = 0; r < g->nrunning; r++)
        for (int i = 0; i < g->nparams; i++) {
            if (g->params[i] != g->run_param[r]) continue;
            int64_t n = graph_numel(g->node[g->params[i]]);
            const double *p0 = leaves[g->params[i]], *st = leaves[g->stat_in[g->run_stat[r]]];
            double m = g->run_momentum[r], *nx = arena_alloc(ar, (size_t)(n ? n : 1) * sizeof *nx);
            for (int64_t k = 0; k < n; k++) nx[k] = (1.0 - m) * p0[k] + m * st[k];
            ref_next[i] = nx;
        }

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
