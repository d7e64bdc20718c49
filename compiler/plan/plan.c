/* plan.c - the step program and the static memory plan of a train block (plan.h).
 *
 * Pipeline position: graph (the step graph after autodiff, the update graph) -> [plan] -> fuse ->
 * kernel IR -> back ends -> host code. Reads the train block's checked settings (TrainConfig,
 * settings.h: the numbers sema settles for the stages after it) and the two graphs, and
 * decides: the step program per distinct accumulation count (a batch-size ramp has several), and
 * where every value lives (regions for parameters, gradients, optimizer state and inputs; an
 * activation arena with offsets assigned by liveness). Printed by `mbtc --emit=plan`, checked by
 * plan_verify. The plan is of the unfused graphs for now (every node a buffer); the fusion stage
 * reuses plan_assign_offsets for the buffers its kernels keep. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "diag.h"
#include "plan.h"

/* ---- sizes ---------------------------------------------------------------------------------- */

static int64_t plan_dtype_bytes(DType dt) {
    int n = dtype_size(dt);
    if (!n) INTERNAL("plan: dtype %d", (int)dt);
    return n;
}

int64_t plan_align_up(int64_t x, int64_t align) { return (x + align - 1) & ~(align - 1); }

/* ---- offsets by liveness -------------------------------------------------------------------- */

typedef struct PlanOrder {
    int64_t size; /* rounded up to the alignment */
    int first, idx;
} PlanOrder;

/* Decreasing size, then earlier first use, then index: a total order, so the result is the same
 * on every machine. */
static int plan_order_cmp(const void *a, const void *b) {
    const PlanOrder *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int plan_live_together(const PlanBuffer *a, const PlanBuffer *b) {
    return !(a->last < b->first || b->last < a->first);
}

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
static int plan_first_cmp(const void *a, const void *b) {
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
                     "past PLAN_MAX_BYTES", i, buf[i].size, buf[i].first, buf[i].last);
        total += plan_align_up(buf[i].size, align);
        if (total > PLAN_MAX_BYTES) INTERNAL("plan_assign_offsets: the sizes sum past PLAN_MAX_BYTES");
    }
    return n <= PLAN_GREEDY_MAX ? plan_assign_greedy(buf, n, align, scratch) : plan_assign_by_time(buf, n, align, scratch);
}

/* ---- building: context and errors ----------------------------------------------------------- */

typedef struct PlanCtx {
    Arena *ar;
    Plan *p;
    const TrainConfig *ts;
    Span at; /* the train block's name: where whole-plan errors point */
} PlanCtx;

/* a x b bytes, or -1 beyond PLAN_MAX_BYTES. */
static int64_t plan_mul_bytes(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || (b != 0 && a > PLAN_MAX_BYTES / b)) return -1;
    return a * b;
}

/* The bytes of a node's value; -1 (reported) beyond PLAN_MAX_BYTES. */
static int64_t plan_node_bytes(const PlanCtx *c, const GNode *n) {
    int64_t bytes = plan_mul_bytes(graph_numel(n), plan_dtype_bytes(n->dt));
    if (bytes >= 0) return bytes;
    diag_error(n->src.file ? n->src : c->at,
               "the memory plan: this %s value needs more than 2^60 bytes, which is not supported",
               graph_op_name(n->op));
    return -1;
}

/* ---- the step programs ----------------------------------------------------------------------- */

static void plan_note(PlanCtx *c, const char *text) {
    Plan *p = c->p;
    const char **nv = arena_alloc(c->ar, sizeof(char *) * (size_t)(p->nnotes + 1));
    if (p->nnotes) memcpy(nv, p->notes, sizeof(char *) * (size_t)p->nnotes);
    nv[p->nnotes++] = text;
    p->notes = nv;
}

/* Settings this plan does not carry out yet: said in the plan rather than silently dropped. */
static void plan_notes(PlanCtx *c) {
    const TrainConfig *ts = c->ts;
    static const char *const storage[] = {"none", "host", "nvme"};
    struct { const char *key; int64_t v; } par[] = {
        {"tensor", ts->tensor_par}, {"pipeline", ts->pipeline_par}, {"sequence", ts->sequence_par}, {"expert", ts->expert_par}};
    for (size_t i = 0; i < sizeof par / sizeof *par; i++)
        if (par[i].v > 1)
            plan_note(c, arena_printf(c->ar, "parallel.%s = %" PRId64 " is not planned yet: each rank holds the whole model",
                                      par[i].key, par[i].v));
    if (ts->zero > 0)
        plan_note(c, arena_printf(c->ar, "parallel.zero = %" PRId64 " is not planned yet: every rank holds all of the "
                                         "optimizer state and gradients", ts->zero));
    if (ts->recompute) plan_note(c, "recompute is not planned yet: the arena keeps every activation for the backward");
    if (ts->offload_activations != STORE_NONE && (int)ts->offload_activations < 3)
        plan_note(c, arena_printf(c->ar, "offload.activations = %s is not planned yet", storage[ts->offload_activations]));
    if (ts->offload_optimizer != STORE_NONE && (int)ts->offload_optimizer < 3)
        plan_note(c, arena_printf(c->ar, "offload.optimizer = %s is not planned yet", storage[ts->offload_optimizer]));
    if (ts->steps > ((int64_t)1 << 24))
        plan_note(c, "t is an f32: past step 16777216 it is no longer exact");
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

/* ---- the memory plan ------------------------------------------------------------------------- */

/* For each node of g: the largest id that reads it (-1: none) and how many inputs read it. */
static void plan_uses(Arena *ar, const Graph *g, int **last_use, int **nuse) {
    int *lu = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    int *nu = arena_alloc(ar, sizeof(int) * (size_t)(g->n + 1));
    for (int i = 0; i < g->n; i++) lu[i] = -1;
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        for (int k = 0; k < n->nin; k++) {
            lu[n->in[k]] = id;
            nu[n->in[k]]++;
        }
    }
    *last_use = lu;
    *nuse = nu;
}

static int plan_add_input(PlanCtx *c, const char *name, int update, int node, int64_t bytes) {
    PlanMemory *m = &c->p->mem;
    PlanInput *in = &m->inputs[m->ninputs++];
    in->name = name;
    in->update = update;
    in->node = node;
    in->bytes = bytes;
    in->offset = m->input_bytes;
    m->input_bytes = plan_align_up(m->input_bytes + bytes, PLAN_ALIGN);
    if (m->input_bytes > PLAN_MAX_BYTES) {
        diag_error(c->at, "the memory plan: the inputs need more than 2^60 bytes, which is not supported");
        return 0;
    }
    return 1;
}

/* Offsets for the arena slots of one graph; fills *peak and *naive. 0 after an error. */
static int plan_arena(PlanCtx *c, PlanSlot *slots, int n, int64_t *peak, int64_t *naive) {
    Arena scratch = {0};
    int nb = 0;
    for (int i = 0; i < n; i++) nb += slots[i].home == PH_ARENA;
    PlanBuffer *b = arena_alloc(&scratch, sizeof(PlanBuffer) * (size_t)(nb + 1));
    int *which = arena_alloc(&scratch, sizeof(int) * (size_t)(nb + 1));
    int64_t total = 0;
    nb = 0;
    for (int i = 0; i < n; i++) {
        if (slots[i].home != PH_ARENA) continue;
        b[nb] = (PlanBuffer){slots[i].bytes, slots[i].first, slots[i].last, 0};
        total += plan_align_up(slots[i].bytes, PLAN_ALIGN);
        if (total > PLAN_MAX_BYTES) {
            diag_error(c->at, "the memory plan: the activations need more than 2^60 bytes, which is not supported");
            arena_free(&scratch);
            return 0;
        }
        which[nb++] = i;
    }
    *naive = plan_naive_bytes(b, nb, PLAN_ALIGN);
    *peak = plan_assign_offsets(b, nb, PLAN_ALIGN, &scratch);
    for (int k = 0; k < nb; k++) slots[which[k]].offset = b[k].offset;
    arena_free(&scratch);
    return 1;
}

/* Parameters, gradients and state: the update graph's layout, in bytes. */
static int plan_regions(PlanCtx *c) {
    Plan *p = c->p;
    PlanMemory *m = &p->mem;
    const Graph *g = p->step;
    const GraphUpdate *u = p->update->update;
    if (u->nsegs != g->nparams) INTERNAL("plan: %d segments for %d parameters", u->nsegs, g->nparams);
    m->param_bytes = plan_mul_bytes(u->n, 4);
    m->nstate = u->nstate;
    m->state_bytes = plan_mul_bytes(m->param_bytes, u->nstate);
    if (m->param_bytes < 0 || m->state_bytes < 0) {
        diag_error(c->at, "the memory plan: the parameters or the optimizer state need more than 2^60 bytes, which is "
                          "not supported");
        return 0;
    }
    m->nparams = g->nparams;
    m->params = arena_alloc(c->ar, sizeof(PlanParam) * (size_t)(g->nparams + 1));
    for (int i = 0; i < g->nparams; i++) {
        const GNode *pn = graph_node(g, g->params[i]);
        if (u->seg_len[i] != graph_numel(pn) || pn->dt != DT_F32)
            INTERNAL("plan: segment %d does not hold parameter '%s'", i, pn->name ? pn->name : "?");
        m->params[i] = (PlanParam){pn->name, pn->id, graph_numel(pn), u->seg_off[i] * 4};
    }
    return 1;
}

static int plan_step_memory(PlanCtx *c) {
    Plan *p = c->p;
    PlanMemory *m = &p->mem;
    const Graph *g = p->step;
    int *last_use, *nuse;
    plan_uses(c->ar, g, &last_use, &nuse);
    int *param_of = arena_alloc(c->ar, sizeof(int) * (size_t)(g->n + 1));
    int *grad_of = arena_alloc(c->ar, sizeof(int) * (size_t)(g->n + 1)); /* a parameter whose gradient it is */
    int *ngrad = arena_alloc(c->ar, sizeof(int) * (size_t)(g->n + 1));
    for (int i = 0; i < g->n; i++) param_of[i] = grad_of[i] = -1;
    for (int i = 0; i < g->nparams; i++) {
        param_of[g->params[i]] = i;
        grad_of[g->grads[i]] = i;
        ngrad[g->grads[i]]++;
    }
    m->step = arena_alloc(c->ar, sizeof(PlanSlot) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        PlanSlot *s = &m->step[id];
        s->bytes = plan_node_bytes(c, n);
        if (s->bytes < 0) return 0;
        s->first = s->last = id;
        if (n->op == G_PARAM) {
            s->home = PH_PARAMS;
            s->offset = m->params[param_of[id]].offset;
        } else if (n->op == G_INPUT) {
            s->home = PH_INPUTS;
            s->offset = m->input_bytes;
            if (!plan_add_input(c, n->name ? n->name : "?", 0, id, s->bytes)) return 0;
        } else if (ngrad[id] == 1 && nuse[id] == 0 && n->dt == DT_F32 && id != g->loss) {
            /* a gradient nothing else reads: it is computed straight into the gradient region */
            s->home = PH_GRADS;
            s->offset = m->params[grad_of[id]].offset;
        } else if (n->op == G_CONST && n->rank == 0) {
            s->home = PH_NONE;
        } else {
            s->home = PH_ARENA;
            if (last_use[id] > id) s->last = last_use[id];
            if (id == g->loss) s->last = g->n - 1; /* read after the graph, for the reported loss */
        }
    }
    m->grad_writes = arena_alloc(c->ar, sizeof(PlanWrite) * (size_t)(g->nparams + 1));
    for (int i = 0; i < g->nparams; i++) {
        int d = g->grads[i];
        m->grad_writes[i] = (PlanWrite){arena_printf(c->ar, "grad %s", m->params[i].name), d, PH_GRADS,
                                        m->params[i].offset, m->params[i].numel * 4, 1, m->step[d].home == PH_GRADS, 0};
    }
    return plan_arena(c, m->step, g->n, &m->step_peak, &m->step_naive);
}

static int plan_update_memory(PlanCtx *c) {
    Plan *p = c->p;
    PlanMemory *m = &p->mem;
    const Graph *g = p->update;
    const GraphUpdate *u = g->update;
    int *last_use, *nuse;
    plan_uses(c->ar, g, &last_use, &nuse);
    /* The results: p, then each state variable, with the region each is written back to. */
    int nw = 1 + u->nstate;
    m->nupdate_writes = nw;
    m->update_writes = arena_alloc(c->ar, sizeof(PlanWrite) * (size_t)nw);
    int *nout = arena_alloc(c->ar, sizeof(int) * (size_t)(g->n + 1));
    for (int k = 0; k < nw; k++) {
        int out = k == 0 ? u->p_out : u->state_out[k - 1], in = k == 0 ? u->p_in : u->state_in[k - 1];
        PlanWrite *w = &m->update_writes[k];
        w->what = k == 0 ? "p" : arena_printf(c->ar, "state.%s", u->state_name[k - 1]);
        w->node = out;
        w->to = k == 0 ? PH_PARAMS : PH_STATE;
        w->offset = k == 0 ? 0 : (int64_t)(k - 1) * m->param_bytes;
        w->bytes = m->param_bytes;
        w->unchanged = out == in;
        if (!w->unchanged) nout[out]++;
    }
    /* In place when the result is computed, not passed through, is the result of one role only, and
     * nothing reads the role's old value after it (the node itself may, if elementwise). */
    for (int k = 0; k < nw; k++) {
        PlanWrite *w = &m->update_writes[k];
        int in = k == 0 ? u->p_in : u->state_in[k - 1];
        const GNode *n = graph_node(g, w->node);
        w->in_place = !w->unchanged && n->op != G_INPUT && n->op != G_CONST && nout[w->node] == 1 &&
                      (last_use[in] < w->node || (last_use[in] == w->node && n->op != G_SEG_NORM));
    }
    int lr_t_inputs = 0;
    m->update = arena_alloc(c->ar, sizeof(PlanSlot) * (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        PlanSlot *s = &m->update[id];
        s->bytes = plan_node_bytes(c, n);
        if (s->bytes < 0) return 0;
        s->first = s->last = id;
        int placed = 0;
        for (int k = 0; k < nw && !placed; k++) {
            const PlanWrite *w = &m->update_writes[k];
            if (w->node == id && w->in_place) {
                s->home = w->to;
                s->offset = w->offset;
                placed = 1;
            }
        }
        if (placed) continue;
        if (n->op == G_INPUT) {
            if (id == u->p_in) {
                s->home = PH_PARAMS;
            } else if (id == u->g_in) {
                s->home = PH_GRADS;
            } else if (id == u->lr_in || id == u->t_in) {
                s->home = PH_INPUTS;
                s->offset = m->input_bytes;
                lr_t_inputs++;
                if (!plan_add_input(c, n->name, 1, id, s->bytes)) return 0;
            } else {
                int k = 0;
                while (k < u->nstate && u->state_in[k] != id) k++;
                if (k == u->nstate) INTERNAL("plan: update input %%%d '%s' has no role", id, n->name ? n->name : "?");
                s->home = PH_STATE;
                s->offset = (int64_t)k * m->param_bytes;
            }
        } else if (n->op == G_CONST && n->rank == 0) {
            s->home = PH_NONE;
        } else {
            s->home = PH_ARENA;
            if (last_use[id] > id) s->last = last_use[id];
            if (nout[id]) s->last = g->n - 1; /* copied into its region after the graph */
        }
    }
    if (lr_t_inputs != (u->lr_in >= 0) + 1) INTERNAL("plan: the update graph's lr and t inputs");
    return plan_arena(c, m->update, g->n, &m->update_peak, &m->update_naive);
}

/* ---- plan_build ------------------------------------------------------------------------------ */

Plan *plan_build(const TrainBuild *tb, int first_bwd, Arena *ar) {
    if (!tb || !tb->step || !tb->update || !tb->update->update || !tb->config) INTERNAL("plan_build: no train build");
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
    if (p->schedule && !p->has_lr) {
        diag_error(ts->lr_at,
                   "the schedule '%s' scales the optimizer's hyper-parameter 'lr', but optimizer '%s' has none",
                   p->schedule, u->optimizer);
        diag_hint("give the optimizer a hyper-parameter lr, or remove this setting");
        return NULL;
    }

    plan_notes(c);
    plan_programs(c);
    p->mem.inputs = arena_alloc(ar, sizeof(PlanInput) * (size_t)(g->n + tb->update->n + 1));
    if (!plan_regions(c) || !plan_step_memory(c) || !plan_update_memory(c)) return NULL;
    PlanMemory *m = &p->mem;
    m->arena_bytes = m->step_peak > m->update_peak ? m->step_peak : m->update_peak;
    return p;
}

/* ---- plan_verify ----------------------------------------------------------------------------- */

typedef struct PlanVerify {
    FILE *out;
    int problems;
} PlanVerify;

static void plan_v_fail(PlanVerify *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void plan_v_fail(PlanVerify *v, const char *fmt, ...) {
    v->problems++;
    if (!v->out) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(v->out, "plan: ");
    vfprintf(v->out, fmt, ap);
    fprintf(v->out, "\n");
    va_end(ap);
}

static int64_t plan_region_bytes(const Plan *p, PlanHome h) {
    const PlanMemory *m = &p->mem;
    switch (h) {
    case PH_PARAMS: case PH_GRADS: return m->param_bytes;
    case PH_STATE: return m->state_bytes;
    case PH_INPUTS: return m->input_bytes;
    case PH_ARENA: return m->arena_bytes;
    case PH_NONE: return 0;
    }
    return 0;
}

/* Arena slots live together never share a byte: a sweep over time keeping the live slots sorted by
 * offset; each slot that becomes live is checked against its neighbours there (the live ones being
 * disjoint, those are the only candidates). O(n log n + n x live). */
/* The first position in live (slot ids sorted by offset) whose offset is not below off. */
static int plan_v_lower(const PlanSlot *slots, const int *live, int nlive, int64_t off) {
    int lo = 0, hi = nlive;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (slots[live[mid]].offset < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void plan_v_arena(PlanVerify *v, const Graph *g, const PlanSlot *slots, const char *what) {
    Arena scratch = {0};
    int n = 0;
    for (int i = 0; i < g->n; i++) n += slots[i].home == PH_ARENA && slots[i].bytes > 0;
    PlanOrder *starts = arena_alloc(&scratch, sizeof(PlanOrder) * (size_t)(n + 1));
    PlanOrder *ends = arena_alloc(&scratch, sizeof(PlanOrder) * (size_t)(n + 1));
    int *live = arena_alloc(&scratch, sizeof(int) * (size_t)(n + 1)); /* slot ids by offset */
    int k = 0, nlive = 0, released = 0;
    for (int i = 0; i < g->n; i++)
        if (slots[i].home == PH_ARENA && slots[i].bytes > 0) {
            starts[k] = (PlanOrder){0, slots[i].first, i};
            ends[k++] = (PlanOrder){0, slots[i].last, i};
        }
    if (n > 1) {
        qsort(starts, (size_t)n, sizeof *starts, plan_first_cmp);
        qsort(ends, (size_t)n, sizeof *ends, plan_first_cmp);
    }
    for (int s = 0; s < n; s++) {
        int id = starts[s].idx;
        const PlanSlot *a = &slots[id];
        while (released < n && ends[released].first < a->first) { /* no longer live */
            int gone = ends[released++].idx, j = plan_v_lower(slots, live, nlive, slots[gone].offset);
            while (j < nlive && live[j] != gone) j++; /* equal offsets only after a reported problem */
            if (j == nlive) INTERNAL("plan_verify: a live slot went missing");
            memmove(live + j, live + j + 1, sizeof(int) * (size_t)(nlive - j - 1));
            nlive--;
        }
        int lo = plan_v_lower(slots, live, nlive, a->offset);
        if (lo > 0 && slots[live[lo - 1]].offset + slots[live[lo - 1]].bytes > a->offset)
            plan_v_fail(v, "%s %%%d and %%%d are live together and share bytes", what, live[lo - 1], id);
        if (lo < nlive && a->offset + a->bytes > slots[live[lo]].offset)
            plan_v_fail(v, "%s %%%d and %%%d are live together and share bytes", what, id, live[lo]);
        memmove(live + lo + 1, live + lo, sizeof(int) * (size_t)(nlive - lo));
        live[lo] = id;
        nlive++;
    }
    arena_free(&scratch);
}

/* Every slot inside its region and aligned, arena slots below the peak and disjoint while live. */
static void plan_v_slots(PlanVerify *v, const Plan *p, const Graph *g, const PlanSlot *slots, int64_t peak,
                         const char *what) {
    for (int i = 0; i < g->n; i++) {
        const PlanSlot *s = &slots[i];
        if (s->home == PH_NONE) continue;
        if (s->offset < 0 || s->offset % PLAN_ALIGN != 0 || s->offset + s->bytes > plan_region_bytes(p, s->home))
            plan_v_fail(v, "%s %%%d: %" PRId64 " bytes at %" PRId64 " are not aligned or leave their region", what, i,
                        s->bytes, s->offset);
        if (s->home == PH_ARENA && s->offset + s->bytes > peak)
            plan_v_fail(v, "%s %%%d ends past the peak %" PRId64, what, i, peak);
    }
    plan_v_arena(v, g, slots, what);
}

int plan_verify(const Plan *p, FILE *out) {
    PlanVerify v = {out, 0};
    const PlanMemory *m = &p->mem;
    const GraphUpdate *u = p->update->update;
    if (m->param_bytes % PLAN_ALIGN != 0 || m->param_bytes != u->n * 4)
        plan_v_fail(&v, "the parameter region (%" PRId64 " bytes) is not the update graph's %" PRId64 " values",
                    m->param_bytes, u->n);
    int64_t end = 0;
    for (int i = 0; i < m->nparams; i++) {
        const PlanParam *q = &m->params[i];
        if (q->offset % PLAN_ALIGN != 0 || q->offset < end || q->offset - end >= PLAN_ALIGN ||
            q->offset != u->seg_off[i] * 4)
            plan_v_fail(&v, "parameter '%s' at %" PRId64 ": not the next aligned offset after %" PRId64, q->name,
                        q->offset, end);
        end = q->offset + q->numel * 4;
    }
    if (end > m->param_bytes || m->param_bytes - end >= PLAN_ALIGN)
        plan_v_fail(&v, "the parameter region is %" PRId64 " bytes for parameters ending at %" PRId64, m->param_bytes, end);
    if (m->state_bytes != m->param_bytes * m->nstate) plan_v_fail(&v, "the state region is not one part per state variable");
    for (int i = 0; i < m->ninputs; i++)
        if (m->inputs[i].offset % PLAN_ALIGN != 0 || (i && m->inputs[i].offset < m->inputs[i - 1].offset + m->inputs[i - 1].bytes))
            plan_v_fail(&v, "input '%s' overlaps the previous one or is not aligned", m->inputs[i].name);
    plan_v_slots(&v, p, p->step, m->step, m->step_peak, "step");
    plan_v_slots(&v, p, p->update, m->update, m->update_peak, "update");
    for (int i = 0; i < m->nparams; i++) {
        const PlanWrite *w = &m->grad_writes[i];
        const PlanSlot *s = &m->step[w->node];
        if (w->in_place && (s->home != PH_GRADS || s->offset != w->offset))
            plan_v_fail(&v, "the gradient of '%s' is in place but its slot is elsewhere", m->params[i].name);
    }
    if (m->step_peak > m->step_naive || m->update_peak > m->update_naive)
        plan_v_fail(&v, "a peak exceeds its naive total");
    for (int k = 0; k < p->nprograms; k++) {
        const PlanProgram *pr = &p->programs[k];
        if (pr->global != pr->micro * pr->accumulation * pr->data)
            plan_v_fail(&v, "program %d: global %" PRId64 " is not micro x accumulation x data", k, pr->global);
    }
    return v.problems;
}

/* ---- plan_print ------------------------------------------------------------------------------ */

static const char *plan_home_name(PlanHome h) {
    switch (h) {
    case PH_NONE: return "immediate";
    case PH_PARAMS: return "parameters";
    case PH_GRADS: return "gradients";
    case PH_STATE: return "state";
    case PH_INPUTS: return "inputs";
    case PH_ARENA: return "arena";
    }
    return "?";
}

/* "f32[2, 4, 8]" */
static const char *plan_type(Arena *ar, const GNode *n) {
    const char *out = arena_printf(ar, "%s[", dtype_name(n->dt));
    for (int i = 0; i < n->rank; i++) out = arena_printf(ar, "%s%s%" PRId64, out, i ? ", " : "", n->shape[i]);
    return arena_printf(ar, "%s]", out);
}

/* "1/4 = 0.25", or "1" */
static const char *plan_scale_text(Arena *ar, const PlanProgram *pr) {
    int64_t d = pr->accumulation * pr->data;
    if (d == 1) return "1";
    return arena_printf(ar, "1/%" PRId64 " = %s", d, value_float_str(ar, pr->loss_scale));
}

/* "16506014784 bytes (15.4 GiB)" */
static const char *plan_bytes_text(Arena *ar, int64_t b) {
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
    else
        fprintf(out, "steps %" PRId64 "..%" PRId64, pr->first_step, pr->last_step);
    fprintf(out, ", global batch %" PRId64 " = micro %" PRId64 " x accumulation %" PRId64 " x data %" PRId64 "\n",
            pr->global, pr->micro, pr->accumulation, pr->data);
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
            fprintf(out, "%sload      data.x, data.y <- micro-batch k of %s, into the input region\n", ind,
                    pr->data > 1 ? "this rank's share of the global batch" : "the global batch");
            break;
        case PO_RUN:
            fprintf(out, "%srun       %s: forward %%0..%%%d, backward %%%d..%%%d", ind, g->name ? g->name : "step",
                    p->first_bwd - 1, p->first_bwd, g->n - 1);
            if (p->seed >= 0) fprintf(out, ", seed d loss %%%d = %s", p->seed, scale);
            else fprintf(out, " (no parameter reaches the loss: zero gradients)");
            fprintf(out, "\n%s          gradients: k = 0 writes the gradient region, k > 0 adds to it\n", ind);
            break;
        case PO_LOSS:
            fprintf(out, "%sloss      += %s x %%%d  # the reported loss: the mean over the global batch\n", ind, scale,
                    g->loss);
            break;
        case PO_ALLREDUCE:
            fprintf(out, "%sallreduce sum of the gradient region (%" PRId64 " bytes) and the loss over %" PRId64
                         " data ranks\n", ind, p->mem.param_bytes, pr->data);
            break;
        case PO_CLIP:
            fprintf(out, "%sclip      norm = ||gradients||_2; gradients *= min(1, %s / (norm + 1e-6))\n", ind,
                    value_float_str(ar, p->clip));
            break;
        case PO_SCHEDULE:
            if (!p->has_lr) fprintf(out, "%sschedule  t = step + 1  # the optimizer has no lr\n", ind);
            else if (p->schedule)
                fprintf(out, "%sschedule  lr = %s x %s; t = step + 1  # host, into the input region\n", ind,
                        value_float_str(ar, p->lr_base), p->schedule);
            else
                fprintf(out, "%sschedule  lr = %s; t = step + 1  # host, into the input region\n", ind,
                        value_float_str(ar, p->lr_base));
            break;
        case PO_UPDATE:
            fprintf(out, "%supdate    %s: %%0..%%%d over the parameter, gradient and state regions\n", ind,
                    u->name ? u->name : "update", u->n - 1);
            break;
        }
    }
}

static void plan_print_arena(FILE *out, Arena *ar, const Graph *g, const PlanSlot *slots, int64_t peak, int64_t naive,
                             const char *when) {
    int nb = 0, nimm = 0;
    for (int i = 0; i < g->n; i++) {
        nb += slots[i].home == PH_ARENA;
        nimm += slots[i].home == PH_NONE;
    }
    fprintf(out, "\n## arena %s (%s): %d buffer%s, peak %s, without reuse %s", when, g->name ? g->name : "?", nb,
            nb == 1 ? "" : "s", plan_bytes_text(ar, peak), plan_bytes_text(ar, naive));
    if (naive > 0) fprintf(out, " (saves %.1f%%)", 100.0 * (double)(naive - peak) / (double)naive);
    fprintf(out, "; %d rank-0 constant%s immediate\n", nimm, nimm == 1 ? " is an" : "s are");
    if (!nb) return;
    int w = 0;
    const char **label = arena_alloc(ar, sizeof(char *) * (size_t)g->n);
    for (int i = 0; i < g->n; i++) {
        if (slots[i].home != PH_ARENA) continue;
        label[i] = arena_printf(ar, "%%%d %s %s", i, graph_op_name(g->node[i]->op), plan_type(ar, g->node[i]));
        int len = (int)strlen(label[i]);
        if (len > w) w = len;
    }
    fprintf(out, "%-*s  %12s  %12s  live\n", w, "node", "bytes", "offset");
    for (int i = 0; i < g->n; i++) {
        const PlanSlot *s = &slots[i];
        if (s->home != PH_ARENA) continue;
        fprintf(out, "%-*s  %12" PRId64 "  %12" PRId64 "  %%%d..%%%d\n", w, label[i], s->bytes, s->offset, s->first, s->last);
    }
}

void plan_print(FILE *out, const Plan *p) {
    Arena ar = {0};
    const PlanMemory *m = &p->mem;
    const Graph *g = p->step, *u = p->update;
    const GraphUpdate *up = u->update;
    int64_t values = 0;
    for (int i = 0; i < m->nparams; i++) values += m->params[i].numel;
    fprintf(out, "# plan train %s: %d parameter%s (%" PRId64 " values), %d step program%s, arena %s\n", p->name,
            m->nparams, m->nparams == 1 ? "" : "s", values, p->nprograms, p->nprograms == 1 ? "" : "s",
            plan_bytes_text(&ar, m->arena_bytes));
    fprintf(out, "steps %" PRId64 "; micro-batch %" PRId64 " sequence%s of %" PRId64 " tokens; %" PRId64
                 " data-parallel rank%s; clip %s\n",
            p->steps, p->micro, p->micro == 1 ? "" : "s", p->seq, p->data, p->data == 1 ? "" : "s",
            p->clip > 0 ? value_float_str(&ar, p->clip) : "none");
    fprintf(out, "optimizer %s: %d state variable%s", up->optimizer, up->nstate, up->nstate == 1 ? "" : "s");
    for (int i = 0; i < up->nstate; i++)
        fprintf(out, "%s%s = %s", i ? ", " : " (", up->state_name[i], value_float_str(&ar, up->state_init[i]));
    fprintf(out, "%s\n", up->nstate ? " at the start)" : "");
    for (int i = 0; i < p->nnotes; i++) fprintf(out, "note: %s\n", p->notes[i]);
    for (int k = 0; k < p->nprograms; k++) plan_print_program(out, &ar, p, k);

    fprintf(out, "\n## update graph\n");
    graph_print(out, u, 0);

    fprintf(out, "\n## regions (bytes; every offset a multiple of %d)\n", PLAN_ALIGN);
    fprintf(out, "parameters %" PRId64 ", gradients %" PRId64 ", optimizer state %" PRId64 " (%d x %" PRId64
                 "), inputs %" PRId64 ", arena %" PRId64 "\n",
            m->param_bytes, m->param_bytes, m->state_bytes, m->nstate, m->param_bytes, m->input_bytes, m->arena_bytes);
    int w = 9;
    for (int i = 0; i < m->nparams; i++) {
        int len = (int)strlen(m->params[i].name ? m->params[i].name : "?");
        if (len > w) w = len;
    }
    fprintf(out, "%-*s  %-16s  %12s  %12s  gradient\n", w, "parameter", "type", "bytes", "offset");
    for (int i = 0; i < m->nparams; i++) {
        const PlanParam *q = &m->params[i];
        const PlanWrite *gw = &m->grad_writes[i];
        const char *how = gw->in_place ? "written in place"
                          : m->step[gw->node].home == PH_NONE ? "filled (a constant)"
                                                               : arena_printf(&ar, "added from the %s",
                                                                              plan_home_name(m->step[gw->node].home));
        fprintf(out, "%-*s  %-16s  %12" PRId64 "  %12" PRId64 "  %%%d %s\n", w, q->name ? q->name : "?",
                plan_type(&ar, graph_node(g, q->node)), q->numel * 4, q->offset, gw->node, how);
    }
    for (int i = 0; i < m->nstate; i++)
        fprintf(out, "state.%s: the state region from %" PRId64 ", each parameter at its offset above\n",
                up->state_name[i], (int64_t)i * m->param_bytes);
    for (int k = 0; k < m->nupdate_writes; k++) {
        const PlanWrite *uw = &m->update_writes[k];
        const char *from = plan_home_name(m->update[uw->node].home);
        fprintf(out, "new %s = %%%d: %s\n", uw->what, uw->node,
                uw->unchanged ? "unchanged"
                : uw->in_place ? arena_printf(&ar, "written in place into the %s region", plan_home_name(uw->to))
                               : arena_printf(&ar, "copied from the %s into the %s region after the update graph", from,
                                              plan_home_name(uw->to)));
    }
    fprintf(out, "%-*s  %-16s  %12s  %12s\n", w, "input", "type", "bytes", "offset");
    for (int i = 0; i < m->ninputs; i++) {
        const PlanInput *in = &m->inputs[i];
        const GNode *n = graph_node(in->update ? u : g, in->node);
        fprintf(out, "%-*s  %-16s  %12" PRId64 "  %12" PRId64 "\n", w, in->name, plan_type(&ar, n), in->bytes, in->offset);
    }

    plan_print_arena(out, &ar, g, m->step, m->step_peak, m->step_naive, "during a micro-batch");
    plan_print_arena(out, &ar, u, m->update, m->update_peak, m->update_naive, "during the update");
    arena_free(&ar);
}
