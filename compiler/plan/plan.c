/* plan.c - the step program and the static memory plan of a train block (plan.h).
 *
 * Pipeline position: graph (the step graph after autodiff, the update graph) -> fuse -> [plan] ->
 * back ends -> host code. Reads the train block's checked settings (TrainConfig, settings.h: the
 * numbers sema settles for the stages after it), the two graphs and their
 * fused schedules (schedules.c), and decides: the step program per distinct accumulation count (a
 * batch-size ramp has several), and where every buffer of every schedule lives (plan_memory.c,
 * with offsets by liveness from plan_assign_offsets here). Printed by `mbtc --emit=plan`, checked
 * by plan_verify. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "diag.h"
#include "plan_internal.h"

/* ---- sizes ---------------------------------------------------------------------------------- */

int64_t plan_align_up(int64_t x, int64_t align) { return (x + align - 1) & ~(align - 1); }

/* ---- offsets by liveness -------------------------------------------------------------------- */

/* Decreasing size, then earlier first use, then index: a total order, so the result is the same
 * on every machine. */
static int plan_order_cmp(const void *a, const void *b) {
    const PlanOrder *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int plan_live_together(const PlanBuffer *a, const PlanBuffer *b) { return !(a->last < b->first || b->last < a->first); }

int64_t plan_naive_bytes(const PlanBuffer *buf, int n, int64_t align) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += plan_align_up(buf[i].size, align);
    return total;
}

/* Greedy by size, best fit (plan.h): O(n^2), for up to PLAN_GREEDY_MAX buffers. */
static int64_t plan_assign_greedy(PlanBuffer *buf, int n, int64_t align, Arena *scratch) {
    PlanOrder *order = arena_alloc(scratch, sizeof(PlanOrder) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) order[i] = (PlanOrder){plan_align_up(buf[i].size, align), buf[i].first, i};
    if (n > 1) qsort(order, (size_t)n, sizeof *order, plan_order_cmp);
    int *placed = arena_alloc(scratch, sizeof(int) * (size_t)(n + 1)); /* by increasing offset */
    int nplaced = 0;
    int64_t peak = 0;
    for (int k = 0; k < n; k++) {
        PlanBuffer *b = &buf[order[k].idx];
        int64_t size = order[k].size;
        b->offset = 0;
        if (size == 0) continue;
        /* The gaps between the placed buffers live together with b, lowest offset first. */
        int64_t end = 0, best = -1, best_gap = INT64_MAX;
        for (int j = 0; j < nplaced; j++) {
            const PlanBuffer *c = &buf[placed[j]];
            if (!plan_live_together(b, c)) continue;
            int64_t gap = c->offset - end;
            if (gap >= size && gap < best_gap) {
                best = end;
                best_gap = gap;
            }
            int64_t cend = c->offset + plan_align_up(c->size, align);
            if (cend > end) end = cend;
        }
        b->offset = best >= 0 ? best : end;
        int at = nplaced;
        while (at > 0 && buf[placed[at - 1]].offset > b->offset) at--;
        memmove(placed + at + 1, placed + at, sizeof(int) * (size_t)(nplaced - at));
        placed[at] = order[k].idx;
        nplaced++;
        if (b->offset + size > peak) peak = b->offset + size;
    }
    return peak;
}

/* Ordering for the time-ordered allocator: by first use, then decreasing size, then index. */
int plan_first_cmp(const void *a, const void *b) {
    const PlanOrder *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

typedef struct PlanFree {
    int64_t off, size;
} PlanFree;

/* A block back into the free list (sorted by offset, neighbours merged). */
static void plan_free_block(PlanFree *fl, int *nfl, int64_t off, int64_t size) {
    int lo = 0, hi = *nfl;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (fl[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    int prev = lo > 0 && fl[lo - 1].off + fl[lo - 1].size == off;
    int next = lo < *nfl && off + size == fl[lo].off;
    if (prev && next) {
        fl[lo - 1].size += size + fl[lo].size;
        memmove(fl + lo, fl + lo + 1, sizeof(PlanFree) * (size_t)(*nfl - lo - 1));
        (*nfl)--;
    } else if (prev) {
        fl[lo - 1].size += size;
    } else if (next) {
        fl[lo].off = off;
        fl[lo].size += size;
    } else {
        memmove(fl + lo + 1, fl + lo, sizeof(PlanFree) * (size_t)(*nfl - lo));
        fl[lo] = (PlanFree){off, size};
        (*nfl)++;
    }
}

/* Time-ordered best fit (plan.h), for more than PLAN_GREEDY_MAX buffers: O(n x free blocks). */
static int64_t plan_assign_by_time(PlanBuffer *buf, int n, int64_t align, Arena *scratch) {
    PlanOrder *order = arena_alloc(scratch, sizeof(PlanOrder) * (size_t)(n + 1));
    PlanOrder *ends = arena_alloc(scratch, sizeof(PlanOrder) * (size_t)(n + 1)); /* by last use */
    PlanFree *fl = arena_alloc(scratch, sizeof(PlanFree) * (size_t)(n + 2));
    int nfl = 0, nend = 0, released = 0;
    for (int i = 0; i < n; i++) order[i] = (PlanOrder){plan_align_up(buf[i].size, align), buf[i].first, i};
    if (n > 1) qsort(order, (size_t)n, sizeof *order, plan_first_cmp);
    for (int i = 0; i < n; i++)
        if (order[i].size > 0) ends[nend++] = (PlanOrder){order[i].size, buf[order[i].idx].last, order[i].idx};
    if (nend > 1) qsort(ends, (size_t)nend, sizeof *ends, plan_first_cmp); /* .first holds last use here */
    int64_t top = 0, peak = 0;
    for (int k = 0; k < n; k++) {
        PlanBuffer *b = &buf[order[k].idx];
        int64_t size = order[k].size;
        b->offset = 0;
        if (size == 0) continue;
        /* release every buffer whose last use is before b's first */
        while (released < nend && ends[released].first < b->first) {
            const PlanOrder *e = &ends[released++];
            plan_free_block(fl, &nfl, buf[e->idx].offset, e->size);
        }
        int best = -1;
        for (int j = 0; j < nfl; j++)
            if (fl[j].size >= size && (best < 0 || fl[j].size < fl[best].size)) best = j;
        if (best >= 0) {
            b->offset = fl[best].off;
            fl[best].off += size;
            fl[best].size -= size;
            if (!fl[best].size) {
                memmove(fl + best, fl + best + 1, sizeof(PlanFree) * (size_t)(nfl - best - 1));
                nfl--;
            }
        } else if (nfl > 0 && fl[nfl - 1].off + fl[nfl - 1].size == top) { /* grow the last free block */
            b->offset = fl[nfl - 1].off;
            top = b->offset + size;
            nfl--;
        } else {
            b->offset = top;
            top += size;
        }
        if (top > peak) peak = top;
    }
    return peak;
}

int64_t plan_assign_offsets(PlanBuffer *buf, int n, int64_t align, Arena *scratch) {
    if (align <= 0 || (align & (align - 1)) != 0) INTERNAL("plan_assign_offsets: alignment %" PRId64, align);
    if (n < 0) INTERNAL("plan_assign_offsets: %d buffers", n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (buf[i].size < 0 || buf[i].size > PLAN_MAX_BYTES - total || buf[i].first > buf[i].last)
            INTERNAL("plan_assign_offsets: buffer %d (size %" PRId64 ", live %d..%d) is invalid or the sizes sum "
                     "past PLAN_MAX_BYTES",
                     i, buf[i].size, buf[i].first, buf[i].last);
        total += plan_align_up(buf[i].size, align);
        if (total > PLAN_MAX_BYTES) INTERNAL("plan_assign_offsets: the sizes sum past PLAN_MAX_BYTES");
    }
    return n <= PLAN_GREEDY_MAX ? plan_assign_greedy(buf, n, align, scratch) : plan_assign_by_time(buf, n, align, scratch);
}

/* ---- building: context and errors ----------------------------------------------------------- */

/* a x b bytes, or -1 beyond PLAN_MAX_BYTES. */
int64_t plan_mul_bytes(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || (b != 0 && a > PLAN_MAX_BYTES / b)) return -1;
    return a * b;
}

/* ---- the step programs ----------------------------------------------------------------------- */

void plan_note(PlanCtx *c, const char *text) {
    Plan *p = c->p;
    const char **nv = arena_alloc(c->ar, sizeof(char *) * (size_t)(p->nnotes + 1));
    if (p->nnotes) memcpy(nv, p->notes, sizeof(char *) * (size_t)p->nnotes);
    nv[p->nnotes++] = text;
    p->notes = nv;
}

/* offload.optimizer = nvme, after the memory plan has chunked the state (plan_memory.c). */
static void plan_note_offload(PlanCtx *c) {
    const PlanMemory *m = &c->p->mem;
    if (c->ts->offload_optimizer == STORE_HOST)
        plan_note(c, m->offload_host ? arena_printf(c->ar,
                                                    "offload.optimizer = host: the optimizer state, %s, stays in host memory "
                                                    "and the CPU updates it; on a GPU the gradients are copied down and the "
                                                    "parameters up each step",
                                                    plan_bytes_text(c->ar, m->state_bytes))
                                     : "offload.optimizer = host: the optimizer keeps no state, so there is nothing to offload");
    if (c->ts->offload_optimizer != STORE_NVME) return;
    if (m->offload_chunk)
        plan_note(c, arena_printf(c->ar,
                                  "offload.optimizer = nvme: the optimizer state lives in a store file of %s; optimizer_update "
                                  "runs over %" PRId64 " chunks of %" PRId64 " parameters, reading chunk i + 1 and writing "
                                  "chunk i - 1 back while chunk i is updated",
                                  plan_bytes_text(c->ar, m->store_bytes), m->offload_nchunks, m->offload_chunk));
    else plan_note(c, "offload.optimizer = nvme: the optimizer keeps no state, so there is nothing to offload");
}

/* Settings this plan does not carry out yet: said in the plan rather than silently dropped. */
static void plan_notes(PlanCtx *c) {
    const TrainConfig *ts = c->ts;
    struct {
        const char *key;
        int64_t v;
    } par[] = {
        {"tensor", ts->tensor_par}, {"pipeline", ts->pipeline_par}, {"sequence", ts->sequence_par}, {"expert", ts->expert_par}};
    for (size_t i = 0; i < sizeof par / sizeof *par; i++)
        if (par[i].v > 1)
            plan_note(c, arena_printf(c->ar, "parallel.%s = %" PRId64 " is not planned yet: each rank holds the whole model",
                                      par[i].key, par[i].v));
    if (ts->zero > 2) /* the schedule is listed after the phases (plan_print_gather) */
        plan_note(c, arena_printf(c->ar,
                                  "parallel.zero = %" PRId64 ": the runtime holds 1/%" PRId64 " of the parameters, the optimizer "
                                  "state and the summed gradient a rank, and gathers the rest of each parameter around its "
                                  "uses (\"ZeRO-3\" below); the regions above are the whole program's",
                                  ts->zero, ts->data_par));
    else if (ts->zero > 0) /* carried out by the runtime (docs/parallel.md, ZeRO) */
        plan_note(c, arena_printf(c->ar,
                                  "parallel.zero = %" PRId64 ": the runtime holds 1/%" PRId64 " of the optimizer state a rank%s; "
                                  "the regions above are the whole program's",
                                  ts->zero, ts->data_par, ts->zero == 2 ? " and keeps that share of the summed gradient" : ""));

    if (ts->steps > ((int64_t)1 << 24)) plan_note(c, "t is an f32: past step 16777216 it is no longer exact");
}

static PlanProgram plan_program(PlanCtx *c, int64_t first, int64_t last, int64_t global, int64_t accumulation) {
    const Plan *p = c->p;
    PlanProgram pr;
    memset(&pr, 0, sizeof pr);
    pr.first_step = first;
    pr.last_step = last;
    pr.global = global;
    pr.micro = p->micro;
    pr.data = p->data;
    pr.accumulation = accumulation;
    pr.loss_scale = 1.0 / ((double)accumulation * (double)p->data);
    pr.ops = arena_alloc(c->ar, sizeof(PlanOp) * 8);
    pr.ops[pr.nops++] = (PlanOp){PO_LOAD, 1};
    pr.ops[pr.nops++] = (PlanOp){PO_RUN, 1};
    pr.ops[pr.nops++] = (PlanOp){PO_LOSS, 1};
    if (p->data > 1) pr.ops[pr.nops++] = (PlanOp){PO_ALLREDUCE, 0};
    if (p->clip > 0) pr.ops[pr.nops++] = (PlanOp){PO_CLIP, 0};
    pr.ops[pr.nops++] = (PlanOp){PO_SCHEDULE, 0};
    pr.ops[pr.nops++] = (PlanOp){PO_UPDATE, 0};
    return pr;
}

/* One program per stage of the batch schedule: the base batch from step 0, then each ramp entry. */
static void plan_programs(PlanCtx *c) {
    const TrainConfig *ts = c->ts;
    Plan *p = c->p;
    int nstage = 1 + ts->nramp;
    p->programs = arena_alloc(c->ar, sizeof(PlanProgram) * (size_t)nstage);
    for (int i = 0; i < nstage; i++) {
        int64_t first = i == 0 ? 0 : ts->ramp[i - 1].step;
        int64_t global = i == 0 ? ts->global : ts->ramp[i - 1].global;
        int64_t acc = i == 0 ? ts->accumulation : ts->ramp[i - 1].accumulation;
        int64_t next = i + 1 < nstage ? ts->ramp[i].step : ts->steps;
        int64_t last = (next < ts->steps ? next : ts->steps) - 1;
        if (last < first && first < ts->steps) continue; /* a ramp entry at this very step replaces it */
        if (acc < 1) INTERNAL("plan: accumulation %" PRId64, acc);
        p->programs[p->nprograms++] = plan_program(c, first, last, global, acc);
    }
}

/* ---- plan_build ------------------------------------------------------------------------------ */

Plan *plan_build(const TrainBuild *tb, int first_bwd, const PlanSchedules *s, Arena *ar) {
    if (!s || s->n < 2 || !tb || !tb->step || !tb->update || !tb->update->update || !tb->config)
        INTERNAL("plan_build: no train build");
    const Graph *g = tb->step;
    if (!g->grads) INTERNAL("plan_build: the step graph is not differentiated");
    if (first_bwd < 0 || first_bwd > g->n) INTERNAL("plan_build: first backward node %d of %d", first_bwd, g->n);
    PlanCtx ctx = {.ar = ar, .ts = tb->config};
    PlanCtx *c = &ctx;
    const TrainConfig *ts = c->ts;
    c->at = ts->at;
    Plan *p = arena_alloc(ar, sizeof(Plan));
    c->p = p;
    p->name = ts->name;
    p->step = g;
    p->update = tb->update;
    p->first_bwd = first_bwd;
    p->steps = ts->steps;
    p->seq = ts->seq;
    p->config = ts;
    p->micro = ts->micro;
    p->data = ts->data_par;
    p->clip = ts->clip;
    if (p->steps < 1 || p->micro < 1 || p->data < 1 || ts->global < 1)
        INTERNAL("plan_build: settings without their numbers (steps %" PRId64 ", micro %" PRId64 ")", p->steps, p->micro);

    /* The backward's seed: autodiff's first node, a G_CONST 1.0 shaped like the loss. */
    p->seed = -1;
    if (first_bwd < g->n) {
        const GNode *s = g->node[first_bwd], *l = graph_node(g, g->loss);
        if (s->op == G_CONST && s->fattr[0] == 1.0 && s->rank == l->rank) p->seed = first_bwd;
    }

    const GraphUpdate *u = tb->update->update;
    p->has_lr = u->lr_in >= 0;
    p->lr_base = u->lr_base;
    p->schedule = ts->schedule_text;
    p->lr_prog = ts->lr_batch ? ts->lr : NULL;
    if (p->schedule && !p->has_lr) {
        diag_error(ts->lr_at, "the schedule '%s' scales the optimizer's hyper-parameter 'lr', but optimizer '%s' has none",
                   p->schedule, u->optimizer);
        diag_hint("give the optimizer a hyper-parameter lr, or remove this setting");
        return NULL;
    }

    plan_notes(c);
    plan_programs(c);
    p->sched = *s;
    if (!plan_memory(c, s)) return NULL;
    plan_gather(c);
    plan_note_offload(c);
    return p;
}

/* ---- plan_verify ----------------------------------------------------------------------------- */

void plan_v_fail(PlanVerify *v, const char *fmt, ...) {
    v->problems++;
    if (!v->out) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(v->out, "plan: ");
    vfprintf(v->out, fmt, ap);
    fprintf(v->out, "\n");
    va_end(ap);
}

int plan_verify(const Plan *p, FILE *out) {
    PlanVerify v = {out, 0};
    plan_verify_memory(&v, p);
    for (int k = 0; k < p->nprograms; k++) {
        const PlanProgram *pr = &p->programs[k];
        if (pr->global != pr->micro * pr->accumulation * pr->data)
            plan_v_fail(&v, "program %d: global %" PRId64 " is not micro x accumulation x data", k, pr->global);
    }
    return v.problems;
}

/* ---- plan_print ------------------------------------------------------------------------------ */

/* "1/4 = 0.25", or "1" */
static const char *plan_scale_text(Arena *ar, const PlanProgram *pr) {
    int64_t d = pr->accumulation * pr->data;
    if (d == 1) return "1";
    return arena_printf(ar, "1/%" PRId64 " = %s", d, value_float_str(ar, pr->loss_scale));
}

/* "16506014784 bytes (15.4 GiB)" */
const char *plan_bytes_text(Arena *ar, int64_t b) {
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (b < 1024) return arena_printf(ar, "%" PRId64 " bytes", b);
    double x = (double)b / 1024.0;
    int u = 0;
    while (x >= 1024.0 && u < 5) {
        x /= 1024.0;
        u++;
    }
    return arena_printf(ar, "%" PRId64 " bytes (%.1f %s)", b, x, unit[u]);
}

static void plan_print_program(FILE *out, Arena *ar, const Plan *p, int k) {
    const PlanProgram *pr = &p->programs[k];
    const Graph *g = p->step, *u = p->update;
    fprintf(out, "\n## step program %d of %d: ", k + 1, p->nprograms);
    if (pr->first_step >= p->steps)
        fprintf(out, "from step %" PRId64 ", never reached (the run has %" PRId64 " steps)", pr->first_step, p->steps);
    else fprintf(out, "steps %" PRId64 "..%" PRId64, pr->first_step, pr->last_step);
    fprintf(out, ", global batch %" PRId64 " = micro %" PRId64 " x accumulation %" PRId64 " x data %" PRId64 "\n", pr->global,
            pr->micro, pr->accumulation, pr->data);
    const char *scale = plan_scale_text(ar, pr);
    int in_loop = 0;
    for (int i = 0; i < pr->nops; i++) {
        const PlanOp *op = &pr->ops[i];
        if (op->per_micro && !in_loop) {
            fprintf(out, "for k in 0..%" PRId64 ":  # each micro-batch\n", pr->accumulation - 1);
            in_loop = 1;
        }
        const char *ind = op->per_micro ? "  " : "";
        switch (op->kind) {
        case PO_LOAD:
            fprintf(out, "%sload      data.x, data.y <- micro-batch k of %s, into the batch buffers\n", ind,
                    pr->data > 1 ? "this rank's share of the global batch" : "the global batch");
            for (int j = 0; j < p->mem.ninputs; j++)
                if (p->mem.inputs[j].home == PH_POS)
                    fprintf(out, "%s          data.pos <- each token's position in its document, from data.x\n", ind);
            break;
        case PO_RUN:
            fprintf(out, "%srun       %s: forward %%0..%%%d, backward %%%d..%%%d", ind, g->name ? g->name : "step",
                    p->first_bwd - 1, p->first_bwd, g->n - 1);
            if (p->seed >= 0) fprintf(out, ", seed d loss %%%d = %s", p->seed, scale);
            else fprintf(out, " (no parameter reaches the loss: zero gradients)");
            fprintf(out, "\n%s          gradients: added into the gradient region (the runtime zeroes it after each update)\n",
                    ind);
            break;
        case PO_LOSS:
            fprintf(out, "%sloss      += %s x %%%d  # the reported loss: the mean over the global batch\n", ind, scale, g->loss);
            break;
        case PO_ALLREDUCE:
            fprintf(out, "%sallreduce sum of the gradient region (%" PRId64 " bytes) and the loss over %" PRId64 " data ranks\n",
                    ind, p->mem.param_bytes, pr->data);
            break;
        case PO_CLIP:
            fprintf(out, "%sclip      norm = ||gradients||_2; gradients *= min(1, %s / (norm + 1e-6))\n", ind,
                    value_float_str(ar, p->clip));
            break;
        case PO_SCHEDULE:
            if (!p->has_lr) fprintf(out, "%sschedule  t = step + 1  # the optimizer has no lr\n", ind);
            else if (p->schedule) {
                fprintf(out, "%sschedule  lr = %s x %s; t = step + 1  # host, into the update's arena slots\n", ind,
                        value_float_str(ar, p->lr_base), p->schedule);
                if (p->lr_prog && pr->first_step < p->steps) /* the rate this stage's batch gives */
                    fprintf(out, "%s          at step %" PRId64 " (global batch %" PRId64 "): lr = %s x %s = %s\n", ind,
                            pr->first_step, pr->global, value_float_str(ar, p->lr_base),
                            value_float_str(ar, scalar_eval(p->lr_prog, pr->first_step)),
                            value_float_str(ar, p->lr_base * scalar_eval(p->lr_prog, pr->first_step)));
            } else
                fprintf(out, "%sschedule  lr = %s; t = step + 1  # host, into the update's arena slots\n", ind,
                        value_float_str(ar, p->lr_base));
            break;
        case PO_UPDATE:
            fprintf(out, "%supdate    %s: %%0..%%%d over the parameter, gradient and state regions\n", ind,
                    u->name ? u->name : "update", u->n - 1);
            break;
        }
    }
}

/* The sequence-length curriculum (batch { buckets, curriculum }): each stage, and step by step
 * one turn of its lengths - the length of step s is that of step s - n (n lengths a turn). */
static void plan_print_curriculum(FILE *out, const Plan *p) {
    const TrainConfig *c = p->config;
    if (!c || !c->ncurriculum) return;
    int64_t tokens = p->micro * p->seq;
    fprintf(out, "sequence lengths: buckets [");
    for (int i = 0; i < c->nbuckets; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", c->buckets[i]);
    fprintf(out, "]; each micro-batch's %" PRId64 " tokens read as windows of the step's length, data.pos restarting at each\n",
            tokens);
    if (c->curriculum[0].step > 0)
        fprintf(out, "  steps 0..%" PRId64 ": %" PRId64 " windows of %" PRId64 " tokens\n", c->curriculum[0].step - 1, p->micro,
                p->seq);
    for (int i = 0; i < c->ncurriculum; i++) {
        const CurriculumStage *st = &c->curriculum[i];
        int64_t last = i + 1 < c->ncurriculum ? c->curriculum[i + 1].step - 1 : p->steps - 1;
        if (st->step >= p->steps) {
            fprintf(out, "  from step %" PRId64 ", never reached (the run has %" PRId64 " steps)\n", st->step, p->steps);
            continue;
        }
        if (last >= p->steps) last = p->steps - 1;
        if (st->n == 1) {
            fprintf(out, "  steps %" PRId64 "..%" PRId64 ": %" PRId64 " windows of %" PRId64 " tokens\n", st->step, last,
                    tokens / st->lens[0], st->lens[0]);
            continue;
        }
        fprintf(out, "  steps %" PRId64 "..%" PRId64 ": the lengths in turn, one a step\n", st->step, last);
        for (int64_t s = st->step; s <= last && s < st->step + st->n; s++) {
            int64_t len = train_seq_at(c, s);
            fprintf(out, "    step%s %" PRId64, s + st->n <= last ? "s" : "", s);
            if (s + st->n <= last) fprintf(out, ", %" PRId64 ", ...", s + st->n);
            fprintf(out, ": %" PRId64 " windows of %" PRId64 " tokens\n", tokens / len, len);
        }
    }
}

void plan_print(FILE *out, const Plan *p) {
    Arena ar = {0};
    const PlanMemory *m = &p->mem;
    const Graph *u = p->update;
    const GraphUpdate *up = u->update;
    int64_t values = 0;
    for (int i = 0; i < m->nparams; i++) values += m->params[i].valid;
    fprintf(out, "# plan train %s: %d parameter%s (%" PRId64 " values), %d step program%s, arena %s\n", p->name, m->nparams,
            m->nparams == 1 ? "" : "s", values, p->nprograms, p->nprograms == 1 ? "" : "s", plan_bytes_text(&ar, m->arena_bytes));
    fprintf(out,
            "steps %" PRId64 "; micro-batch %" PRId64 " sequence%s of %" PRId64 " tokens; %" PRId64
            " data-parallel rank%s; clip %s\n",
            p->steps, p->micro, p->micro == 1 ? "" : "s", p->seq, p->data, p->data == 1 ? "" : "s",
            p->clip > 0 ? value_float_str(&ar, p->clip) : "none");
    fprintf(out, "optimizer %s: %d state variable%s", up->optimizer, up->nstate, up->nstate == 1 ? "" : "s");
    for (int i = 0; i < up->nstate; i++)
        fprintf(out, "%s%s = %s", i ? ", " : " (", up->state_name[i], value_float_str(&ar, up->state_init[i]));
    fprintf(out, "%s\n", up->nstate ? " at the start)" : "");
    for (int i = 0; i < p->nnotes; i++) fprintf(out, "note: %s\n", p->notes[i]);
    plan_print_curriculum(out, p);
    for (int k = 0; k < p->nprograms; k++) plan_print_program(out, &ar, p, k);

    fprintf(out, "\n## update graph\n");
    graph_print(out, u, 0);

    plan_print_memory(out, &ar, p);
    arena_free(&ar);
}
